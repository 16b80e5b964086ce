//! Durations as workflows write them (`timeout:`).

/// `30`, `30s`, `2m`, `1h`, `1m30s` -> seconds.
pub fn parse_duration(text: &str) -> Option<u32> {
    let s = text.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(n) = s.parse::<u32>() {
        return Some(n);
    }
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        let unit = match c {
            'h' => 3600,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                total += n.div_ceil(1000);
                continue;
            }
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total += n * unit;
    }
    if !num.is_empty() {
        return None;
    }
    u32::try_from(total).ok()
}
