//! A token scan of an expression before it is parsed: which variables it names, which
//! functions it calls, and the source rewritten so that the anchor's namespaced functions
//! (`strings.IsFalsy(x)`) reach the engine as plain function names (`strings__IsFalsy(x)`).
//!
//! The scan knows string literals, comments and member access, so nothing inside a string or
//! after a `.` is taken for a name; an unknown function is an error here, when the expression
//! is parsed, not when a branch happens to run it.

/// Separator between namespace and function in the rewritten source.
pub const NS_SEP: &str = "__";

/// What an expression names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scan {
    /// The source with `ns.Fn(` rewritten as `ns__Fn(`.
    pub rewritten: String,
    /// Free variables, sorted, deduplicated.
    pub vars: Vec<String>,
    /// Functions called, as written (`strings.IsFalsy`, `len`), sorted, deduplicated.
    pub funcs: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tok<'s> {
    Ident(&'s str),
    Str,
    Num,
    Punct(&'s str),
}

/// Words of the language that are not variables.
const KEYWORDS: &[&str] = &[
    "true",
    "false",
    "nil",
    "not",
    "in",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "and",
    "or",
    "let",
    "if",
    "else",
];

/// Multi-character operators, longest first.
const PUNCTS: &[&str] = &[
    "?.", "??", "..", "==", "!=", "<=", ">=", "&&", "||", "**", "(", ")", "[", "]", "{", "}", ",",
    ".", ":", "?", "!", "+", "-", "*", "/", "%", "^", "<", ">", "|", ";", "=",
];

fn lex(src: &str) -> Result<Vec<(usize, usize, Tok<'_>)>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if src[i..].starts_with("//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if src[i..].starts_with("/*") {
            match src[i + 2..].find("*/") {
                Some(e) => i += 2 + e + 2,
                None => return Err("unterminated comment".to_string()),
            }
            continue;
        }
        let start = i;
        if c == b'\'' || c == b'"' || c == b'`' {
            i += 1;
            loop {
                match b.get(i) {
                    None => return Err("unterminated string".to_string()),
                    Some(b'\\') if c != b'`' => i += 2,
                    Some(x) if *x == c => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            out.push((start, i, Tok::Str));
            continue;
        }
        if c.is_ascii_digit() {
            while i < b.len()
                && (b[i].is_ascii_alphanumeric()
                    || b[i] == b'_'
                    || (b[i] == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)))
            {
                // An exponent's sign belongs to the number (`1e+06`).
                if (b[i] == b'e' || b[i] == b'E')
                    && matches!(b.get(i + 1), Some(b'+' | b'-'))
                    && !src[start..i].starts_with("0x")
                {
                    i += 1;
                }
                i += 1;
            }
            out.push((start, i, Tok::Num));
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' || c == b'$' || c == b'#' {
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((start, i, Tok::Ident(&src[start..i])));
            continue;
        }
        match PUNCTS.iter().find(|p| src[i..].starts_with(*p)) {
            Some(p) => {
                i += p.len();
                out.push((start, i, Tok::Punct(p)));
            }
            None => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(format!("unexpected character `{ch}`"));
            }
        }
    }
    Ok(out)
}

/// Scans `src`. `known(name)` says whether a function (`len`, `strings.IsFalsy`) exists; an
/// unknown one is an error naming it.
pub fn scan(src: &str, known: &dyn Fn(&str) -> bool) -> Result<Scan, String> {
    let toks = lex(src)?;
    let mut vars: Vec<String> = Vec::new();
    let mut funcs: Vec<String> = Vec::new();
    let mut bound: Vec<&str> = Vec::new();
    // (byte range to replace, replacement)
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    // Open brackets: `{` of a map literal is where `key:` is not a variable.
    let mut brackets: Vec<&str> = Vec::new();
    let punct = |i: usize| match toks.get(i) {
        Some((_, _, Tok::Punct(p))) => Some(*p),
        _ => None,
    };
    let mut i = 0;
    while i < toks.len() {
        let (start, end, tok) = toks[i];
        match tok {
            // `a..b` builds the whole list: `1..1000000000` would take all memory.
            Tok::Punct("..") => {
                return Err("ranges (`a..b`) are not supported in workflow expressions".to_string());
            }
            Tok::Punct(p @ ("(" | "[" | "{")) => brackets.push(p),
            Tok::Punct(")" | "]" | "}") => {
                brackets.pop();
            }
            Tok::Ident(name) => {
                let after_dot = i > 0 && matches!(punct(i - 1), Some("." | "?."));
                if after_dot || KEYWORDS.contains(&name) || name.starts_with('#') {
                    i += 1;
                    continue;
                }
                if name == "$env" {
                    return Err("`$env` is not supported in workflow expressions".to_string());
                }
                // `let x = ...;`
                if i > 0 && matches!(toks[i - 1].2, Tok::Ident("let")) {
                    bound.push(name);
                    i += 1;
                    continue;
                }
                // `ns.Fn(`
                if punct(i + 1) == Some(".")
                    && let Some((_, fend, Tok::Ident(f))) = toks.get(i + 2)
                    && punct(i + 3) == Some("(")
                {
                    let full = format!("{name}.{f}");
                    if !known(&full) {
                        return Err(format!("unknown function `{full}`"));
                    }
                    edits.push((start, *fend, format!("{name}{NS_SEP}{f}")));
                    funcs.push(full);
                    i += 3;
                    continue;
                }
                if punct(i + 1) == Some("(") {
                    if !known(name) {
                        return Err(format!("unknown function `{name}`"));
                    }
                    funcs.push(name.to_string());
                    i += 1;
                    continue;
                }
                // A map literal's key: `{key: ...}` / `, key: ...` inside `{`.
                let is_key = punct(i + 1) == Some(":")
                    && brackets.last() == Some(&"{")
                    && i > 0
                    && matches!(punct(i - 1), Some("{" | ","));
                if !is_key && !bound.contains(&name) {
                    vars.push(name.to_string());
                }
                let _ = end;
            }
            _ => {}
        }
        i += 1;
    }
    let mut rewritten = String::with_capacity(src.len() + 8);
    let mut at = 0;
    for (s, e, text) in &edits {
        rewritten.push_str(&src[at..*s]);
        rewritten.push_str(text);
        at = *e;
    }
    rewritten.push_str(&src[at..]);
    vars.sort();
    vars.dedup();
    funcs.sort();
    funcs.dedup();
    Ok(Scan {
        rewritten,
        vars,
        funcs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(n: &str) -> bool {
        matches!(
            n,
            "len" | "strings.IsFalsy" | "json.Unmarshal" | "Parent" | "inventory.DetectorForHost"
        )
    }

    #[test]
    fn names_and_rewrites() {
        let s = scan(
            "len(modulepath)>0 ? _module_cmdline : _plain_cmdline",
            &known,
        )
        .unwrap();
        assert_eq!(s.vars, ["_module_cmdline", "_plain_cmdline", "modulepath"]);
        assert_eq!(s.funcs, ["len"]);
        let s = scan(
            "'MCH' in json.Unmarshal(detectors) && !strings.IsFalsy( x ) && d contains 'ITS'",
            &known,
        )
        .unwrap();
        assert_eq!(
            s.rewritten,
            "'MCH' in json__Unmarshal(detectors) && !strings__IsFalsy( x ) && d contains 'ITS'"
        );
        assert_eq!(s.vars, ["d", "detectors", "x"]);
        assert_eq!(s.funcs, ["json.Unmarshal", "strings.IsFalsy"]);
        let s = scan("Parent().Path + 'a.b(c)' // x.y(z)\n", &known).unwrap();
        assert!(s.vars.is_empty(), "{s:?}");
        let s = scan("{a: b, 'c': d}.a ?? e", &known).unwrap();
        assert_eq!(s.vars, ["b", "d", "e"]);
        let s = scan("let v = w; v + 1e+06", &known).unwrap();
        assert_eq!(s.vars, ["w"]);
        let s = scan("c ? x : y", &known).unwrap();
        assert_eq!(s.vars, ["c", "x", "y"]);
    }

    #[test]
    fn unknown_functions_are_errors_when_parsed() {
        assert!(
            scan("a ? foo.Bar(x) : ''", &known)
                .unwrap_err()
                .contains("foo.Bar")
        );
        assert!(scan("nope(1)", &known).unwrap_err().contains("nope"));
        assert!(scan("'a", &known).unwrap_err().contains("unterminated"));
        assert!(scan("$env", &known).is_err());
        assert!(
            scan("len(1..1000000000)", &known)
                .unwrap_err()
                .contains("ranges")
        );
        assert_eq!(scan("'a..b' + x", &known).unwrap().vars, ["x"]);
        assert!(scan("1.5 + .5", &known).is_ok());
    }
}
