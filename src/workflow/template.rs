//! Strings with `{{ expression }}` parts, split once at load time.

use std::sync::Arc;

use super::error::{Error, Loc, Result};
use super::yaml::{Kind, Node};

/// Longest expression accepted between `{{` and `}}` (bytes).
pub const MAX_EXPR_LEN: usize = 4096;

#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Text(Arc<str>),
    /// `{{ name }}`: a bare variable, looked up without the expression engine.
    Var {
        name: Arc<str>,
        loc: Loc,
    },
    Expr {
        src: Arc<str>,
        loc: Loc,
    },
}

/// A value as written in a file, with its location; evaluated where it is used.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub loc: Loc,
    /// Shared: a template is cloned into every task instance of its role, never copied.
    pub parts: Arc<[Part]>,
}

impl Template {
    /// A constant (e.g. an iterator's element), no expressions.
    pub fn literal(loc: &Loc, text: &str) -> Self {
        Template {
            loc: loc.clone(),
            parts: Arc::new([Part::Text(Arc::from(text))]),
        }
    }

    /// The text when it holds no expression.
    pub fn as_literal(&self) -> Option<&str> {
        match &*self.parts {
            [] => Some(""),
            [Part::Text(t)] => Some(t),
            _ => None,
        }
    }

    /// The shared text when it is one literal part (no copy).
    pub fn as_shared_literal(&self) -> Option<&Arc<str>> {
        match &*self.parts {
            [Part::Text(t)] => Some(t),
            _ => None,
        }
    }

    /// Splits a scalar node's text. `{{` without `}}` and an empty `{{ }}` are errors.
    pub fn from_node(node: &Node) -> Result<Self> {
        let text = match &node.kind {
            Kind::Scalar { value, .. } => value.as_str(),
            Kind::Null => "",
            _ => {
                return Err(Error::new(
                    &node.loc,
                    format!("expected a string, found {}", node.kind_name()),
                ));
            }
        };
        // Columns inside a one-line scalar are exact; a quoted one starts one column later.
        let inner_loc = |offset: usize| -> Loc {
            if node.single_line {
                node.loc.shifted(offset + usize::from(node.quoted))
            } else {
                node.loc.clone()
            }
        };
        parse(text, &node.loc, &inner_loc)
    }
}

pub fn parse(text: &str, loc: &Loc, inner_loc: &dyn Fn(usize) -> Loc) -> Result<Template> {
    let mut parts = Vec::new();
    let mut rest = text;
    let mut offset = 0usize;
    while let Some(start) = rest.find("{{") {
        if start > 0 {
            parts.push(Part::Text(Arc::from(&rest[..start])));
        }
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(Error::new(
                &inner_loc(offset + start),
                "`{{` without a closing `}}`",
            ));
        };
        let src = after[..end].trim();
        let here = inner_loc(offset + start);
        if src.is_empty() {
            return Err(Error::new(&here, "empty expression `{{ }}`"));
        }
        if src.len() > MAX_EXPR_LEN {
            return Err(Error::new(
                &here,
                format!("expression longer than {MAX_EXPR_LEN} bytes"),
            ));
        }
        if is_identifier(src) {
            parts.push(Part::Var {
                name: Arc::from(src),
                loc: here,
            });
        } else {
            parts.push(Part::Expr {
                src: Arc::from(src),
                loc: here,
            });
        }
        let consumed = start + 2 + end + 2;
        offset += consumed;
        rest = &rest[consumed..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(Arc::from(rest)));
    }
    Ok(Template {
        loc: loc.clone(),
        parts: parts.into(),
    })
}

/// A plain variable name (not a literal keyword).
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !matches!(s, "true" | "false" | "null" | "in")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_text_vars_and_expressions() {
        let f: Arc<str> = Arc::from("f.yaml");
        let loc = Loc::new(&f, 3, 10);
        let t = parse("a-{{ x }}-{{ len(y) > 0 ? 'p' : 'q' }}", &loc, &|o| {
            loc.shifted(o)
        })
        .unwrap();
        assert_eq!(t.parts.len(), 4);
        assert!(matches!(&t.parts[1], Part::Var { name, .. } if &**name == "x"));
        match &t.parts[3] {
            Part::Expr { src, loc } => {
                assert_eq!(&**src, "len(y) > 0 ? 'p' : 'q'");
                assert_eq!(loc.col, 20);
            }
            other => panic!("unexpected {other:?}"),
        }
        let e = parse("a {{ b", &loc, &|o| loc.shifted(o)).unwrap_err();
        assert_eq!(e.to_string(), "f.yaml:3:12: `{{` without a closing `}}`");
    }
}
