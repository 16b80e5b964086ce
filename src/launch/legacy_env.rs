//! Environment variables renamed with a per-process prefix (`ENVBRIDGE_DAEMON_*`,
//! `ENVBRIDGE_OPERATOR_*`): the old name is still read when the new one is not set, and the
//! process says so in its log.

/// What was read under an old name, to log once tracing is up.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Renamed(pub Vec<String>);

impl Renamed {
    /// `old`'s value when `new` is not set (`value` is what the flags and `new` gave).
    pub fn read(&mut self, value: Option<String>, old: &str, new: &str) -> Option<String> {
        self.read_with(value, old, new, |k| std::env::var(k).ok())
    }

    /// A switch: true when given, or when `old` is set to true/1.
    pub fn flag(&mut self, value: bool, old: &str, new: &str) -> bool {
        value
            || self
                .read(None, old, new)
                .is_some_and(|v| matches!(v.trim(), "1" | "true" | "TRUE" | "True"))
    }

    fn read_with(
        &mut self,
        value: Option<String>,
        old: &str,
        new: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Option<String> {
        if value.is_some() || env(new).is_some() {
            return value;
        }
        let v = env(old)?;
        self.0.push(format!(
            "{old} is read as {new}: rename it (the old name is shared by the daemon and the operator)"
        ));
        Some(v)
    }

    pub fn log(&self) {
        for w in &self.0 {
            tracing::warn!("{w}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_name_counts_only_when_nothing_newer_is_given() {
        let env = |k: &str| (k == "OLD").then(|| "x".to_string());
        let mut r = Renamed::default();
        assert_eq!(
            r.read_with(Some("flag".into()), "OLD", "NEW", env),
            Some("flag".into())
        );
        assert!(r.0.is_empty());
        assert_eq!(r.read_with(None, "OLD", "NEW", env), Some("x".into()));
        assert_eq!(r.0.len(), 1);
        assert!(r.0[0].contains("OLD is read as NEW"));
        let both = |k: &str| Some(k.to_string());
        let mut r = Renamed::default();
        assert_eq!(r.read_with(None, "OLD", "NEW", both), None);
        assert!(
            r.0.is_empty(),
            "the new name set (clap read it): the old one is ignored"
        );
    }
}
