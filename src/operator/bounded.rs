//! Text cut to a size at a character boundary: what status fields and Events may hold. Pure.

/// The start of `s`, at most `max` bytes.
pub fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The end of `s`, at most `max` bytes.
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_never_split_a_character() {
        let wide = "é".repeat(10);
        assert_eq!(head(&wide, 5), "éé");
        assert_eq!(tail(&wide, 5), "éé");
        assert_eq!(head("short", 10), "short");
        assert_eq!(tail("short", 10), "short");
    }
}
