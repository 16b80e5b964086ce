//! Following a container's log across dropped connections, each line exactly once.
//!
//! The log API can only resume from `sinceTime`, which has one-second resolution: after a
//! drop, re-requesting from the last line's second repeats every line of that second that was
//! already shown. [`Resume`] (pure) removes exactly that overlap: it remembers the timestamp
//! of the last emitted line and how many lines carried exactly that timestamp, and after a
//! re-open skips lines older than it and that many lines equal to it. [`follow`] drives any
//! [`LineSource`] (the Kubernetes log stream in the CLI, a scripted fake in the tests) with it.
//!
//! Lines are expected as the API writes them with `timestamps=true`:
//! `2026-11-30T11:03:04.123456789Z text`. A line without a timestamp cannot be placed and is
//! passed through as is.

use std::future::Future;
use std::time::Duration;

use futures::stream::{BoxStream, Stream, StreamExt};
use jiff::Timestamp;

/// One log line, split from its timestamp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub timestamp: Option<Timestamp>,
    pub text: String,
}

/// Splits `<RFC 3339 timestamp> <text>`; None when the line does not start with one.
pub fn split_timestamp(raw: &str) -> Option<(Timestamp, &str)> {
    let (ts, rest) = raw.split_once(' ').unwrap_or((raw, ""));
    ts.parse::<Timestamp>().ok().map(|t| (t, rest))
}

/// The pure de-duplicator.
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// Timestamp of the last emitted line, and how many emitted lines had exactly it.
    last: Option<(Timestamp, usize)>,
    /// After a re-open: lines equal to `last` still to skip (None: not skipping).
    skip: Option<usize>,
}

impl Resume {
    pub fn new() -> Self {
        Self::default()
    }

    /// The `sinceTime` to re-request from: the second of the last emitted line (None: nothing
    /// emitted yet, use the caller's own starting point).
    pub fn since(&self) -> Option<Timestamp> {
        self.last
            .map(|(t, _)| Timestamp::from_second(t.as_second()).unwrap_or(t))
    }

    /// The stream was opened again from [`Resume::since`]: expect the overlap.
    pub fn reopened(&mut self) {
        self.skip = self.last.map(|(_, n)| n);
    }

    /// One raw line of the current stream: the line to show, or None for a repeat.
    pub fn accept(&mut self, raw: &str) -> Option<LogLine> {
        let Some((ts, text)) = split_timestamp(raw) else {
            return Some(LogLine {
                timestamp: None,
                text: raw.to_string(),
            });
        };
        if let (Some(skip), Some((last, _))) = (self.skip.as_mut(), self.last) {
            if ts < last {
                return None;
            }
            if ts == last && *skip > 0 {
                *skip -= 1;
                return None;
            }
            // The first line not seen before: the overlap is over.
            self.skip = None;
        }
        self.last = match self.last {
            Some((last, n)) if last == ts => Some((ts, n + 1)),
            _ => Some((ts, 1)),
        };
        Some(LogLine {
            timestamp: Some(ts),
            text: text.to_string(),
        })
    }
}

/// An error of the line source (the log API), as text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// Where the lines come from: something that can (re)open a log stream from a time.
pub trait LineSource: Send {
    /// Opens the log from `since` (inclusive, second resolution; None: from the beginning).
    fn open(
        &mut self,
        since: Option<Timestamp>,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<String, SourceError>>, SourceError>> + Send;

    /// Asked after a stream ended without an error: true when the container has ended (stop
    /// following), false when the connection was merely closed (open again).
    fn finished(&mut self) -> impl Future<Output = Result<bool, SourceError>> + Send;
}

#[derive(Clone, Debug)]
pub struct FollowOptions {
    /// Where the first open starts (the user's `--since`).
    pub since: Option<Timestamp>,
    /// Give up after this many re-opens in a row that brought no new line.
    pub max_attempts: u32,
    /// Pause before the first re-open after a line was shown; doubled for each further
    /// re-open in a row without a new line, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for FollowOptions {
    fn default() -> Self {
        FollowOptions {
            since: None,
            max_attempts: 10,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("log stream lost {attempts} times in a row without progress; last error: {last}")]
pub struct FollowError {
    pub attempts: u32,
    pub last: String,
}

struct Follow<S> {
    source: S,
    resume: Resume,
    opts: FollowOptions,
    current: Option<BoxStream<'static, Result<String, SourceError>>>,
    opened_once: bool,
    failures: u32,
    done: bool,
}

/// Every line of the log exactly once, in order, across drops; ends when the source says the
/// container has finished, or with an error after `max_attempts` fruitless re-opens.
pub fn follow<S: LineSource + 'static>(
    source: S,
    opts: FollowOptions,
) -> impl Stream<Item = Result<LogLine, FollowError>> + Send {
    let st = Follow {
        source,
        resume: Resume::new(),
        opts,
        current: None,
        opened_once: false,
        failures: 0,
        done: false,
    };
    futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            let Some(stream) = st.current.as_mut() else {
                if st.opened_once {
                    tokio::time::sleep(st.opts.delay(st.failures)).await;
                }
                let since = st.resume.since().or(st.opts.since);
                match st.source.open(since).await {
                    Ok(s) => {
                        if st.opened_once {
                            st.resume.reopened();
                        }
                        st.opened_once = true;
                        st.current = Some(s);
                    }
                    Err(e) => {
                        st.opened_once = true;
                        if let Some(err) = st.fail(e.0) {
                            return Some((Err(err), st));
                        }
                    }
                }
                continue;
            };
            match stream.next().await {
                Some(Ok(raw)) => {
                    if let Some(line) = st.resume.accept(&raw) {
                        st.failures = 0;
                        return Some((Ok(line), st));
                    }
                }
                Some(Err(e)) => {
                    st.current = None;
                    if let Some(err) = st.fail(e.0) {
                        return Some((Err(err), st));
                    }
                }
                None => {
                    st.current = None;
                    match st.source.finished().await {
                        Ok(true) => return None,
                        Ok(false) => {
                            if let Some(err) = st.fail("stream closed".into()) {
                                return Some((Err(err), st));
                            }
                        }
                        Err(e) => {
                            if let Some(err) = st.fail(e.0) {
                                return Some((Err(err), st));
                            }
                        }
                    }
                }
            }
        }
    })
}

impl FollowOptions {
    /// The pause before a re-open that follows `failures` fruitless ones (at least one).
    pub fn delay(&self, failures: u32) -> Duration {
        let doubled = self
            .backoff
            .saturating_mul(1u32 << failures.saturating_sub(1).min(16));
        doubled.min(self.max_backoff.max(self.backoff))
    }
}

impl<S> Follow<S> {
    /// Counts a drop; the error to end with once there were too many in a row.
    fn fail(&mut self, last: String) -> Option<FollowError> {
        self.failures += 1;
        if self.failures > self.opts.max_attempts {
            self.done = true;
            return Some(FollowError {
                attempts: self.failures,
                last,
            });
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container log, and a fake log API over it that drops the connection on cue.
    struct Scripted {
        log: Vec<String>,
        /// For each open, after how many delivered lines the connection drops (None: never).
        drops: Vec<Option<usize>>,
        opens: std::sync::Arc<std::sync::Mutex<Vec<Option<Timestamp>>>>,
        /// Whether the last stream reached the end of the log.
        served_all: std::sync::Arc<std::sync::atomic::AtomicBool>,
        clean_close: bool,
    }

    impl Scripted {
        fn new(log: Vec<String>, drops: Vec<Option<usize>>) -> Self {
            Scripted {
                log,
                drops,
                opens: Default::default(),
                served_all: Default::default(),
                clean_close: false,
            }
        }
    }

    impl LineSource for Scripted {
        fn open(
            &mut self,
            since: Option<Timestamp>,
        ) -> impl Future<
            Output = Result<BoxStream<'static, Result<String, SourceError>>, SourceError>,
        > + Send {
            // The API truncates sinceTime to the second and returns lines at or after it.
            let since = since.map(|t| Timestamp::from_second(t.as_second()).unwrap());
            let mut opens = self.opens.lock().unwrap();
            let drop_after = self.drops.get(opens.len()).copied().flatten();
            opens.push(since);
            drop(opens);
            let lines: Vec<String> = self
                .log
                .iter()
                .filter(|l| since.is_none_or(|s| split_timestamp(l).unwrap().0 >= s))
                .cloned()
                .collect();
            let served_all = self.served_all.clone();
            let clean = self.clean_close;
            async move {
                let n = lines.len();
                let take = drop_after.unwrap_or(n).min(n);
                served_all.store(take == n, std::sync::atomic::Ordering::SeqCst);
                let mut items: Vec<Result<String, SourceError>> =
                    lines.into_iter().take(take).map(Ok).collect();
                if take < n && !clean {
                    items.push(Err(SourceError("connection reset".into())));
                }
                Ok(futures::stream::iter(items).boxed())
            }
        }

        fn finished(&mut self) -> impl Future<Output = Result<bool, SourceError>> + Send {
            let all = self.served_all.load(std::sync::atomic::Ordering::SeqCst);
            async move { Ok(all) }
        }
    }

    /// Lines with many sharing a second, and some sharing an exact timestamp.
    fn dense_log() -> Vec<String> {
        let stamps = [
            "2026-11-30T11:00:00.100Z",
            "2026-11-30T11:00:00.200Z",
            "2026-11-30T11:00:00.200Z",
            "2026-11-30T11:00:00.900Z",
            "2026-11-30T11:00:01.000Z",
            "2026-11-30T11:00:01.000Z",
            "2026-11-30T11:00:01.000Z",
            "2026-11-30T11:00:01.500Z",
            "2026-11-30T11:00:03.250Z",
            "2026-11-30T11:00:03.250Z",
            "2026-11-30T11:00:03.999999999Z",
            "2026-11-30T11:00:04Z",
        ];
        stamps
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{t} line {i}"))
            .collect()
    }

    fn texts(lines: &[LogLine]) -> Vec<String> {
        lines.iter().map(|l| l.text.clone()).collect()
    }

    fn want(log: &[String]) -> Vec<String> {
        log.iter()
            .map(|l| split_timestamp(l).unwrap().1.to_string())
            .collect()
    }

    fn fast() -> FollowOptions {
        FollowOptions {
            backoff: Duration::ZERO,
            ..FollowOptions::default()
        }
    }

    async fn run(src: Scripted, opts: FollowOptions) -> (Vec<LogLine>, Option<FollowError>) {
        let mut out = Vec::new();
        let mut err = None;
        let mut s = Box::pin(follow(src, opts));
        while let Some(item) = s.next().await {
            match item {
                Ok(l) => out.push(l),
                Err(e) => err = Some(e),
            }
        }
        (out, err)
    }

    #[tokio::test]
    async fn without_drops_every_line_once() {
        let log = dense_log();
        let (out, err) = run(Scripted::new(log.clone(), vec![]), fast()).await;
        assert_eq!(err, None);
        assert_eq!(texts(&out), want(&log));
    }

    #[tokio::test]
    async fn a_drop_at_every_position_loses_and_repeats_nothing() {
        let log = dense_log();
        for at in 0..=log.len() {
            let (out, err) = run(Scripted::new(log.clone(), vec![Some(at)]), fast()).await;
            assert_eq!(err, None, "drop after {at}");
            assert_eq!(texts(&out), want(&log), "drop after {at}");
        }
    }

    #[tokio::test]
    async fn repeated_drops_and_clean_closes_still_give_each_line_once() {
        let log = dense_log();
        // Every open brings five lines (one more than the busiest second holds, so each
        // re-open makes progress); most re-opens start mid-second.
        let drops = vec![Some(5); 40];
        let src = Scripted::new(log.clone(), drops.clone());
        let (out, err) = run(src, fast()).await;
        assert_eq!(err, None);
        assert_eq!(texts(&out), want(&log));

        // The same with connections closed cleanly before the container ended.
        let mut src = Scripted::new(log.clone(), drops);
        src.clean_close = true;
        let (out, err) = run(src, fast()).await;
        assert_eq!(err, None);
        assert_eq!(texts(&out), want(&log));
    }

    #[tokio::test]
    async fn reopens_request_the_last_lines_second() {
        let log = dense_log();
        let src = Scripted::new(log.clone(), vec![Some(6)]);
        let opens = src.opens.clone();
        let (out, err) = run(src, fast()).await;
        assert_eq!(err, None);
        assert_eq!(texts(&out), want(&log));
        let opens = opens.lock().unwrap().clone();
        assert_eq!(opens.len(), 2);
        assert_eq!(opens[0], None);
        assert_eq!(opens[1], Some("2026-11-30T11:00:01Z".parse().unwrap()));
    }

    #[tokio::test]
    async fn a_source_that_never_progresses_ends_with_an_error() {
        let log = dense_log();
        let src = Scripted::new(log, vec![Some(0); 100]);
        let (out, err) = run(
            src,
            FollowOptions {
                max_attempts: 3,
                ..fast()
            },
        )
        .await;
        assert!(out.is_empty());
        let err = err.expect("an error after 3 fruitless re-opens");
        assert_eq!(err.attempts, 4);
        assert!(err.to_string().contains("connection reset"), "{err}");
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let o = FollowOptions::default();
        let ms = |n| o.delay(n).as_millis();
        assert_eq!(
            [ms(1), ms(2), ms(3), ms(4), ms(5)],
            [500, 1000, 2000, 4000, 5000]
        );
        assert_eq!(ms(u32::MAX), 5000);
    }

    #[test]
    fn resume_core_skips_only_the_overlap() {
        let mut r = Resume::new();
        assert_eq!(r.since(), None);
        let a = "2026-11-30T11:00:05.100Z a";
        let b = "2026-11-30T11:00:05.300Z b";
        let b2 = "2026-11-30T11:00:05.300Z b2";
        let c = "2026-11-30T11:00:05.300Z c";
        for l in [a, b, b2] {
            assert!(r.accept(l).is_some());
        }
        assert_eq!(r.since(), Some("2026-11-30T11:00:05Z".parse().unwrap()));
        r.reopened();
        assert_eq!(r.accept(a), None);
        assert_eq!(r.accept(b), None);
        assert_eq!(r.accept(b2), None);
        // A third line with the very same timestamp is new.
        assert_eq!(r.accept(c).unwrap().text, "c");
        assert_eq!(r.accept("not stamped").unwrap().timestamp, None);
    }
}
