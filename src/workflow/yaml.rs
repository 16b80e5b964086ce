//! YAML to a small located tree: every scalar, sequence and mapping keeps its line and column.
//!
//! Built on granit-parser's event stream (the parser under serde-saphyr) so that tags such as
//! `!public` and positions survive. Bounded: nesting depth and node count (alias expansion)
//! are limited so that hostile input cannot exhaust the stack or memory.

use std::collections::HashMap;
use std::sync::Arc;

use granit_parser::{Event, Parser, ScalarStyle};

use super::error::{Error, Loc, Result};

/// Deepest nesting accepted (the corpus needs about 12).
const MAX_DEPTH: usize = 128;
/// Most nodes one file may expand to (aliases included).
const MAX_NODES: usize = 2_000_000;

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// `~`, `null` or nothing.
    Null,
    /// Any scalar, as written (after YAML escapes); `plain` when unquoted.
    Scalar {
        value: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub loc: Loc,
    /// A local tag such as `public` for `!public`.
    pub tag: Option<String>,
    /// True when the scalar fits one source line (columns inside it are exact).
    pub single_line: bool,
    pub quoted: bool,
    pub kind: Kind,
}

impl Node {
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Null => "nothing",
            Kind::Scalar { .. } => "a scalar",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Kind::Scalar { value, .. } => Some(value),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.kind {
            Kind::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }
}

enum Open {
    Seq(Node, Vec<Node>),
    Map(Node, Vec<(Node, Node)>, Option<Node>),
}

/// Parses one YAML document. An empty file or several documents are errors.
pub fn parse(file: &Arc<str>, text: &str) -> Result<Node> {
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Open> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut root: Option<Node> = None;
    let mut nodes = 0usize;
    let mut docs = 0usize;
    let mut pending_anchor: Vec<usize> = Vec::new();
    loop {
        let (event, span) = match parser.next_event() {
            None => break,
            Some(Ok(ev)) => ev,
            Some(Err(e)) => {
                let m = e.marker();
                return Err(Error::new(
                    &Loc::new(file, m.line(), m.col() + 1),
                    format!("invalid YAML: {}", e.info()),
                ));
            }
        };
        let loc = Loc::new(file, span.start.line(), span.start.col() + 1);
        let complete: Option<(Node, usize)> = match event {
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => None,
            Event::DocumentStart(..) => {
                docs += 1;
                if docs > 1 {
                    return Err(Error::new(
                        &loc,
                        "expected one YAML document, found several",
                    ));
                }
                None
            }
            Event::Scalar(value, style, anchor, tag) => {
                let plain = style == ScalarStyle::Plain;
                let kind = if plain && matches!(value.as_ref(), "" | "~" | "null" | "Null" | "NULL")
                {
                    Kind::Null
                } else {
                    Kind::Scalar {
                        value: value.into_owned(),
                        plain,
                    }
                };
                let single_line = span.start.line() == span.end.line();
                let quoted = matches!(style, ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted);
                let node = Node {
                    loc,
                    tag: tag.map(|t| t.suffix().to_string()),
                    single_line,
                    quoted,
                    kind,
                };
                Some((node, anchor))
            }
            Event::SequenceStart(_, anchor, tag) => {
                let node = new_node(loc, tag.map(|t| t.suffix().to_string()));
                stack.push(Open::Seq(node, Vec::new()));
                pending_anchor.push(anchor);
                if stack.len() > MAX_DEPTH {
                    return Err(Error::new(&stack_loc(&stack), "YAML nested too deeply"));
                }
                None
            }
            Event::MappingStart(_, anchor, tag) => {
                let node = new_node(loc, tag.map(|t| t.suffix().to_string()));
                stack.push(Open::Map(node, Vec::new(), None));
                pending_anchor.push(anchor);
                if stack.len() > MAX_DEPTH {
                    return Err(Error::new(&stack_loc(&stack), "YAML nested too deeply"));
                }
                None
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Open::Seq(mut node, items)) => {
                    node.kind = Kind::Seq(items);
                    Some((node, pending_anchor.pop().unwrap_or(0)))
                }
                _ => return Err(Error::new(&loc, "invalid YAML: unbalanced sequence")),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Open::Map(mut node, items, None)) => {
                    node.kind = Kind::Map(items);
                    Some((node, pending_anchor.pop().unwrap_or(0)))
                }
                _ => return Err(Error::new(&loc, "invalid YAML: unbalanced mapping")),
            },
            Event::Alias(id) => match anchors.get(&id) {
                Some(n) => {
                    nodes = nodes.saturating_add(count(n));
                    Some((n.clone(), 0))
                }
                None => return Err(Error::new(&loc, "YAML alias to an unknown anchor")),
            },
            _ => None,
        };
        let Some((node, anchor)) = complete else {
            continue;
        };
        nodes += 1;
        if nodes > MAX_NODES {
            return Err(Error::new(
                &node.loc,
                "YAML document too large (aliases expand too far?)",
            ));
        }
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None => root = Some(node),
            Some(Open::Seq(_, items)) => items.push(node),
            Some(Open::Map(_, items, key)) => match key.take() {
                None => *key = Some(node),
                Some(k) => items.push((k, node)),
            },
        }
    }
    match root {
        Some(Node {
            kind: Kind::Null,
            loc,
            ..
        })
        | Some(Node {
            loc,
            kind: Kind::Scalar { .. },
            ..
        }) if docs <= 1 && text.trim().is_empty() => Err(Error::new(&loc, "empty file")),
        Some(n) => Ok(n),
        None => Err(Error::new(&Loc::file_start(file), "empty file")),
    }
}

fn new_node(loc: Loc, tag: Option<String>) -> Node {
    Node {
        loc,
        tag,
        single_line: false,
        quoted: false,
        kind: Kind::Null,
    }
}

fn stack_loc(stack: &[Open]) -> Loc {
    match stack.last() {
        Some(Open::Seq(n, _)) | Some(Open::Map(n, _, _)) => n.loc.clone(),
        None => Loc {
            file: Arc::from(""),
            line: 1,
            col: 1,
        },
    }
}

fn count(n: &Node) -> usize {
    match &n.kind {
        Kind::Seq(items) => 1 + items.iter().map(count).sum::<usize>(),
        Kind::Map(items) => {
            1 + items
                .iter()
                .map(|(k, v)| count(k) + count(v))
                .sum::<usize>()
        }
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f() -> Arc<str> {
        Arc::from("t.yaml")
    }

    #[test]
    fn positions_and_tags() {
        let n = parse(&f(), "a: 1\nb:\n  - x\n  - !public\n    value: v\n").unwrap();
        let b = n.get("b").unwrap();
        let Kind::Seq(items) = &b.kind else {
            panic!("not a seq")
        };
        assert_eq!((items[0].loc.line, items[0].loc.col), (3, 5));
        assert_eq!(items[1].tag.as_deref(), Some("public"));
        assert_eq!(items[1].get("value").and_then(Node::as_str), Some("v"));
    }

    #[test]
    fn errors_have_locations() {
        let e = parse(&f(), "a: [1, 2\nb: c\n").unwrap_err();
        assert!(e.to_string().starts_with("t.yaml:"), "{e}");
        let e = parse(&f(), "").unwrap_err();
        assert_eq!(e.to_string(), "t.yaml:1:1: empty file");
        let e = parse(&f(), "a: 1\n---\nb: 2\n").unwrap_err();
        assert!(e.message.contains("several"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        let text = "[".repeat(10_000);
        assert!(parse(&f(), &text).is_err());
    }
}
