//! The anchor's glob patterns (its repository and revision patterns, GetRoles' `pathSpec`):
//! `?` is one character, `*` any run of characters and `**` any run that may cross the
//! separator. With a separator (role paths: '.') `*` and `?` stay within one segment; without
//! one they match anything. Other characters match themselves.
//!
//! Matched as an NFA over the pattern's positions (a set of positions per input byte), so the
//! cost is bounded by pattern length times input length whatever a caller sends: a pattern of
//! many stars cannot make it backtrack.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tok {
    Byte(u8),
    /// `?`
    One,
    /// `*`
    Star,
    /// `**`
    DoubleStar,
}

/// A compiled pattern.
#[derive(Clone, Debug)]
pub struct Glob {
    toks: Vec<Tok>,
    sep: Option<u8>,
}

impl Glob {
    pub fn new(pattern: &str, sep: Option<u8>) -> Glob {
        let p = pattern.as_bytes();
        let mut toks = Vec::with_capacity(p.len());
        let mut i = 0;
        while i < p.len() {
            let t = match p[i] {
                b'*' if p.get(i + 1) == Some(&b'*') => {
                    i += 1;
                    Tok::DoubleStar
                }
                b'*' => Tok::Star,
                b'?' => Tok::One,
                b => Tok::Byte(b),
            };
            // Consecutive stars are one star: the NFA stays small for hostile patterns.
            let same_as_last = matches!(
                (toks.last(), t),
                (Some(Tok::DoubleStar), Tok::Star | Tok::DoubleStar) | (Some(Tok::Star), Tok::Star)
            );
            if !same_as_last {
                if t == Tok::DoubleStar && toks.last() == Some(&Tok::Star) {
                    toks.pop();
                }
                toks.push(t);
            }
            i += 1;
        }
        Glob { toks, sep }
    }

    /// Whether the whole of `s` matches.
    pub fn matches(&self, s: &str) -> bool {
        let n = self.toks.len();
        // live[k]: the pattern's first k tokens match the input read so far.
        let mut live = vec![false; n + 1];
        let mut next = vec![false; n + 1];
        live[0] = true;
        self.close(&mut live);
        for &c in s.as_bytes() {
            next.iter_mut().for_each(|x| *x = false);
            let in_segment = self.sep != Some(c);
            for k in 0..n {
                if !live[k] {
                    continue;
                }
                match self.toks[k] {
                    Tok::Byte(b) if b == c => next[k + 1] = true,
                    Tok::Byte(_) => {}
                    Tok::One if in_segment => next[k + 1] = true,
                    Tok::One => {}
                    // A star consumes the byte and stays where it is.
                    Tok::Star if in_segment => next[k] = true,
                    Tok::Star => {}
                    Tok::DoubleStar => next[k] = true,
                }
            }
            self.close(&mut next);
            std::mem::swap(&mut live, &mut next);
            if !live.iter().any(|x| *x) {
                return false;
            }
        }
        live[n]
    }

    /// Stars match the empty run too: a live star makes the position after it live.
    fn close(&self, live: &mut [bool]) {
        for k in 0..self.toks.len() {
            if live[k] && matches!(self.toks[k], Tok::Star | Tok::DoubleStar) {
                live[k + 1] = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stars_stay_in_their_segment_unless_doubled() {
        let m = |p: &str, s: &str| Glob::new(p, Some(b'.')).matches(s);
        assert!(m("readout-dataflow.*", "readout-dataflow.host-flp001"));
        assert!(!m(
            "readout-dataflow.*",
            "readout-dataflow.host-flp001.readout"
        ));
        assert!(m(
            "readout-dataflow.**",
            "readout-dataflow.host-flp001.readout"
        ));
        assert!(m("*.host-flp00?.*", "readout-dataflow.host-flp002.stfb"));
        assert!(!m("*.host-flp00?", "readout-dataflow.host-flp0012"));
        assert!(!m("readout?dataflow", "readout.dataflow"));
        assert!(m("**readout", "a.b.readout"));
        assert!(m("a.**.c", "a.b.x.c"));
        assert!(m("", ""));
        assert!(!m("", "a"));
    }

    #[test]
    fn without_a_separator_a_star_matches_anything() {
        let m = |p: &str, s: &str| Glob::new(p, None).matches(s);
        for (p, yes) in [
            ("*", true),
            ("envbridge", true),
            ("env*", true),
            ("*bridge", true),
            ("e?v*g?", true),
            ("*e*e*", true),
            ("envbridge?", false),
            ("github.com/*", false),
            ("*x*", false),
        ] {
            assert_eq!(m(p, "envbridge"), yes, "{p}");
        }
        assert!(m("a*", "a.b/c"));
    }

    #[test]
    fn a_hostile_pattern_is_cheap() {
        let t = std::time::Instant::now();
        for p in [
            format!("{}x", "*".repeat(100_000)),
            format!("{}x", "*?".repeat(50_000)),
            format!("{}x", "**.".repeat(30_000)),
        ] {
            assert!(!Glob::new(&p, Some(b'.')).matches(&"a.".repeat(200)));
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }
}
