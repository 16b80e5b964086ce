//! Operator shards: an Environment's `envbridge.dev/shard` label names the operator that
//! reconciles it, and its TaskSets, Tasks, Pods and Services carry the same label, so each
//! shard operator watches only its own objects (server-side label selectors). Objects without
//! the label belong to the operator started without `--shard`. See docs/operator.md.

use std::collections::BTreeMap;

use super::labels::SHARD;

/// A shard name as a label value allows it: 1-63 characters of `[A-Za-z0-9._-]`, starting
/// and ending alphanumeric (the flag parser of `--shard`).
pub fn parse(s: &str) -> Result<String, String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if s.is_empty() || s.len() > 63 {
        return Err(format!("shard {s:?}: 1 to 63 characters"));
    }
    if !s.chars().all(ok_char) || !edge(s.chars().next()) || !edge(s.chars().last()) {
        return Err(format!(
            "shard {s:?}: letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        ));
    }
    Ok(s.to_string())
}

/// The label selector of one shard's objects: the label's value, or (no shard) its absence.
pub fn selector(shard: Option<&str>) -> String {
    match shard {
        Some(s) => format!("{SHARD}={s}"),
        None => format!("!{SHARD}"),
    }
}

/// The shard an object's labels name.
pub fn of(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels.get(SHARD).map(String::as_str)
}

/// Adds the shard label when there is a shard.
pub fn stamp(labels: &mut BTreeMap<String, String>, shard: Option<&str>) {
    if let Some(s) = shard {
        labels.insert(SHARD.to_string(), s.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_label_values() {
        assert_eq!(parse("its-1").unwrap(), "its-1");
        assert_eq!(parse("A.b_c").unwrap(), "A.b_c");
        for bad in ["", "-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains("shard"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn selectors_split_the_objects_between_shards() {
        assert_eq!(selector(Some("its")), "envbridge.dev/shard=its");
        assert_eq!(selector(None), "!envbridge.dev/shard");
        let mut l = BTreeMap::new();
        stamp(&mut l, None);
        assert_eq!(of(&l), None);
        stamp(&mut l, Some("tpc"));
        assert_eq!(of(&l), Some("tpc"));
    }
}
