//! The Kubernetes edge of `envbridge logs`: a task container's log as bytes from the log API
//! (`timestamps=true`), cut into whole lines for the resume core ([`super::log_resume`]), and
//! the pod status that says when following stops. Several tasks are followed at once, their
//! lines interleaved as they come.
//!
//! The byte source is a trait ([`ByteSource`]) so that the consumption loop is tested on
//! in-memory streams that drop mid-line; [`PodLog`] is the one backed by `Api<Pod>::log_stream`.

use std::collections::VecDeque;
use std::future::Future;

use futures::io::{AsyncBufRead, AsyncReadExt};
use futures::stream::{BoxStream, Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};

use super::log_resume::{FollowError, FollowOptions, LineSource, LogLine, SourceError, follow};

/// Raw bytes of one opened log, in whatever chunks the connection delivers them.
pub type ByteStream = BoxStream<'static, Result<Vec<u8>, SourceError>>;

/// A container log that can be (re)opened from a time, and asked whether it has ended.
pub trait ByteSource: Clone + Send + Sync + 'static {
    /// The log from `since` (inclusive, second resolution; None: from the beginning).
    fn open(
        &self,
        since: Option<Timestamp>,
    ) -> impl Future<Output = Result<ByteStream, SourceError>> + Send;

    /// Asked after a stream ended cleanly: has the container ended (nothing more will come)?
    fn ended(&self) -> impl Future<Output = Result<bool, SourceError>> + Send;
}

/// A [`ByteSource`] seen as the resume core's [`LineSource`].
pub struct Lines<B>(pub B);

impl<B: ByteSource> LineSource for Lines<B> {
    fn open(
        &mut self,
        since: Option<Timestamp>,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<String, SourceError>>, SourceError>> + Send
    {
        let src = self.0.clone();
        async move {
            let bytes = src.open(since).await?;
            Ok(whole_lines(bytes, src))
        }
    }

    fn finished(&mut self) -> impl Future<Output = Result<bool, SourceError>> + Send {
        let src = self.0.clone();
        async move { src.ended().await }
    }
}

struct Cutter<B> {
    bytes: Option<ByteStream>,
    buf: Vec<u8>,
    ready: VecDeque<String>,
    src: B,
}

/// Cuts a byte stream into lines. A line is complete only with its newline: the fragment a
/// dropped connection leaves is discarded, since the re-open from the last shown line's second
/// brings the whole line again (showing the fragment would also make the resume core count a
/// line that was never whole). At a clean end the fragment is shown only when the container
/// has ended (its last line had no newline); otherwise the re-open brings it whole.
fn whole_lines<B: ByteSource>(
    bytes: ByteStream,
    src: B,
) -> BoxStream<'static, Result<String, SourceError>> {
    let st = Cutter {
        bytes: Some(bytes),
        buf: Vec::new(),
        ready: VecDeque::new(),
        src,
    };
    futures::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(line) = st.ready.pop_front() {
                return Some((Ok(line), st));
            }
            let bytes = st.bytes.as_mut()?;
            match bytes.next().await {
                Some(Ok(chunk)) => {
                    st.buf.extend_from_slice(&chunk);
                    let mut start = 0;
                    while let Some(i) = st.buf[start..].iter().position(|&b| b == b'\n') {
                        st.ready.push_back(decode(&st.buf[start..start + i]));
                        start += i + 1;
                    }
                    st.buf.drain(..start);
                }
                Some(Err(e)) => {
                    st.bytes = None;
                    st.buf.clear();
                    return Some((Err(e), st));
                }
                None => {
                    st.bytes = None;
                    if st.buf.is_empty() {
                        return None;
                    }
                    let tail = std::mem::take(&mut st.buf);
                    return match st.src.ended().await {
                        Ok(true) => Some((Ok(decode(&tail)), st)),
                        _ => None,
                    };
                }
            }
        }
    })
    .boxed()
}

fn decode(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line).into_owned()
}

/// What following several tasks yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskLog {
    Line {
        task: String,
        line: LogLine,
    },
    /// This task's log could not be followed any more (the others go on).
    Lost {
        task: String,
        error: FollowError,
    },
}

/// Every line of every task's log exactly once, interleaved as they arrive; ends when every
/// task's container has ended (or, without `follow`, when each log was read once).
pub fn follow_tasks<B: ByteSource>(
    sources: Vec<(String, B)>,
    opts: FollowOptions,
) -> impl Stream<Item = TaskLog> + Send {
    let streams = sources.into_iter().map(|(task, src)| {
        follow(Lines(src), opts.clone())
            .map(move |item| match item {
                Ok(line) => TaskLog::Line {
                    task: task.clone(),
                    line,
                },
                Err(error) => TaskLog::Lost {
                    task: task.clone(),
                    error,
                },
            })
            .boxed()
    });
    futures::stream::select_all(streams)
}

/// One output line: `[task] <timestamp> <text>` (the prefix only when several tasks are
/// shown, as `kubectl logs --prefix`), the timestamp as the API gave it (RFC 3339, UTC).
pub fn format_line(prefix: Option<&str>, line: &LogLine) -> String {
    let body = match line.timestamp {
        Some(ts) => format!("{ts:.9} {}", line.text),
        None => line.text.clone(),
    };
    match prefix {
        Some(p) => format!("[{p}] {body}"),
        None => body,
    }
}

/// One task container's log through the apiserver (`pods/log`).
#[derive(Clone)]
pub struct PodLog {
    pub pods: Api<Pod>,
    pub pod: String,
    pub container: String,
    /// Keep the connection open for new lines (`follow=true`); otherwise one read.
    pub follow: bool,
}

impl ByteSource for PodLog {
    fn open(
        &self,
        since: Option<Timestamp>,
    ) -> impl Future<Output = Result<ByteStream, SourceError>> + Send {
        let this = self.clone();
        async move {
            let lp = LogParams {
                container: Some(this.container.clone()),
                follow: this.follow,
                timestamps: true,
                since_time: since,
                ..LogParams::default()
            };
            let reader = this.pods.log_stream(&this.pod, &lp).await.map_err(|e| {
                SourceError(format!(
                    "log of pod {} container {}: {e}",
                    this.pod, this.container
                ))
            })?;
            Ok(read_chunks(reader))
        }
    }

    fn ended(&self) -> impl Future<Output = Result<bool, SourceError>> + Send {
        let this = self.clone();
        async move {
            if !this.follow {
                return Ok(true);
            }
            let pod = this
                .pods
                .get_opt(&this.pod)
                .await
                .map_err(|e| SourceError(format!("status of pod {}: {e}", this.pod)))?;
            Ok(pod.is_none_or(|p| container_ended(&p, &this.container)))
        }
    }
}

/// An `AsyncBufRead` (the log API's body) as a stream of chunks; ends after an error.
fn read_chunks<R: AsyncBufRead + Send + 'static>(reader: R) -> ByteStream {
    let reader: std::pin::Pin<Box<dyn AsyncBufRead + Send>> = Box::pin(reader);
    futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buf = vec![0u8; 16 * 1024];
        match reader.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(buf), Some(reader)))
            }
            Err(e) => Some((Err(SourceError(format!("log stream: {e}"))), None)),
        }
    })
    .boxed()
}

/// Whether `container` of `pod` has ended: its last state is terminated, or the pod itself
/// finished (Succeeded/Failed). A container restarted by its policy is not followed further.
pub fn container_ended(pod: &Pod, container: &str) -> bool {
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return true;
    }
    status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.terminated.is_some())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::control::log_resume::split_timestamp;

    /// A container log served as bytes, re-opened from `sinceTime` as the API does, with each
    /// open's connection dropping after a given number of BYTES (so mid-line, mid-timestamp).
    #[derive(Clone)]
    struct Bytes {
        log: Arc<Vec<String>>,
        /// For each open: (bytes delivered before the drop, chunk size); None: no drop.
        drops: Arc<Vec<Option<usize>>>,
        chunk: usize,
        opens: Arc<Mutex<Vec<Option<Timestamp>>>>,
        /// Set once an open delivered the log to its end: the container has ended.
        done: Arc<AtomicBool>,
        /// Whether the log's last line ends without a newline.
        unterminated_tail: bool,
    }

    impl Bytes {
        fn new(log: Vec<String>, drops: Vec<Option<usize>>, chunk: usize) -> Self {
            Bytes {
                log: Arc::new(log),
                drops: Arc::new(drops),
                chunk,
                opens: Default::default(),
                done: Default::default(),
                unterminated_tail: false,
            }
        }
    }

    impl ByteSource for Bytes {
        fn open(
            &self,
            since: Option<Timestamp>,
        ) -> impl Future<Output = Result<ByteStream, SourceError>> + Send {
            let since = since.map(|t| Timestamp::from_second(t.as_second()).unwrap());
            let mut opens = self.opens.lock().unwrap();
            let drop_after = self.drops.get(opens.len()).copied().flatten();
            opens.push(since);
            drop(opens);
            let mut text = self
                .log
                .iter()
                .filter(|l| since.is_none_or(|s| split_timestamp(l).unwrap().0 >= s))
                .map(|l| format!("{l}\n"))
                .collect::<String>()
                .into_bytes();
            if self.unterminated_tail {
                text.pop();
            }
            let n = drop_after.unwrap_or(text.len()).min(text.len());
            let complete = n == text.len();
            if complete {
                self.done.store(true, Ordering::SeqCst);
            }
            let mut items: Vec<Result<Vec<u8>, SourceError>> = text[..n]
                .chunks(self.chunk)
                .map(|c| Ok(c.to_vec()))
                .collect();
            if !complete {
                items.push(Err(SourceError("connection reset by peer".into())));
            }
            async move { Ok(futures::stream::iter(items).boxed()) }
        }

        fn ended(&self) -> impl Future<Output = Result<bool, SourceError>> + Send {
            let done = self.done.load(Ordering::SeqCst);
            async move { Ok(done) }
        }
    }

    fn log(task: &str) -> Vec<String> {
        [
            "2026-11-30T11:00:00.100000000Z",
            "2026-11-30T11:00:00.200000000Z",
            "2026-11-30T11:00:00.200000000Z",
            "2026-11-30T11:00:01.000000000Z",
            "2026-11-30T11:00:01.000000000Z",
            "2026-11-30T11:00:01.700000000Z",
            "2026-11-30T11:00:02.500000000Z",
        ]
        .iter()
        .enumerate()
        .map(|(i, t)| format!("{t} {task} line {i} ünïcode"))
        .collect()
    }

    fn fast() -> FollowOptions {
        FollowOptions {
            backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            ..FollowOptions::default()
        }
    }

    async fn collect(sources: Vec<(String, Bytes)>, prefix: bool) -> (Vec<String>, Vec<String>) {
        let mut out = Vec::new();
        let mut lost = Vec::new();
        let mut s = Box::pin(follow_tasks(sources, fast()));
        while let Some(ev) = s.next().await {
            match ev {
                TaskLog::Line { task, line } => {
                    out.push(format_line(prefix.then_some(task.as_str()), &line))
                }
                TaskLog::Lost { task, error } => lost.push(format!("{task}: {error}")),
            }
        }
        (out, lost)
    }

    #[tokio::test]
    async fn a_drop_at_every_byte_shows_each_line_once_and_whole() {
        let log = log("readout");
        let total: usize = log.iter().map(|l| l.len() + 1).sum();
        for at in 0..=total {
            for chunk in [1, 7, 4096] {
                let src = Bytes::new(log.clone(), vec![Some(at)], chunk);
                let (out, lost) = collect(vec![("readout".into(), src)], false).await;
                assert!(lost.is_empty(), "drop at byte {at}: {lost:?}");
                assert_eq!(out, log, "drop at byte {at}, chunks of {chunk}");
            }
        }
    }

    /// `n` lines, three per second, the last two of each second with the same timestamp.
    fn long_log(task: &str, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                let frac = [100, 600, 600][i % 3];
                format!(
                    "2026-11-30T11:00:{:02}.{frac}000000Z {task} line {i} ünïcode",
                    i / 3
                )
            })
            .collect()
    }

    #[tokio::test]
    async fn many_drops_mid_line_then_the_end() {
        let log = long_log("stfb", 30);
        // Every connection carries 250 bytes (lines are ~53): each drop falls inside a line,
        // each re-open starts inside a second already partly shown, and still brings one
        // new line (the busiest seconds hold 3 lines).
        let src = Bytes::new(log.clone(), vec![Some(250); 200], 3);
        let opens = src.opens.clone();
        let (out, lost) = collect(vec![("stfb".into(), src)], false).await;
        assert!(lost.is_empty(), "{lost:?}");
        assert_eq!(out, log);
        let opens = opens.lock().unwrap();
        assert!(opens.len() > 3, "re-opened {} times", opens.len());
        // Each re-open asks from the second of the last whole line shown, never later.
        assert_eq!(opens[0], None);
        assert!(opens.windows(2).all(|w| w[0] <= w[1]), "{opens:?}");
    }

    #[tokio::test]
    async fn a_last_line_without_newline_is_shown_once_the_container_ended() {
        let log = log("sender");
        let mut src = Bytes::new(log.clone(), vec![], 5);
        src.unterminated_tail = true;
        let (out, _) = collect(vec![("sender".into(), src)], false).await;
        assert_eq!(out, log);
    }

    #[tokio::test]
    async fn several_tasks_are_prefixed_and_each_complete() {
        let a = log("readout");
        let b = log("stfb");
        let sources = vec![
            (
                "readout".to_string(),
                Bytes::new(a.clone(), vec![Some(90)], 11),
            ),
            (
                "stfb".to_string(),
                Bytes::new(b.clone(), vec![Some(13), Some(140)], 2),
            ),
        ];
        let (out, lost) = collect(sources, true).await;
        assert!(lost.is_empty(), "{lost:?}");
        for (task, want) in [("readout", &a), ("stfb", &b)] {
            let got: Vec<String> = out
                .iter()
                .filter_map(|l| l.strip_prefix(&format!("[{task}] ")))
                .map(String::from)
                .collect();
            assert_eq!(&got, want, "{task}");
        }
        assert_eq!(out.len(), a.len() + b.len());
    }

    #[tokio::test]
    async fn a_log_that_never_comes_back_is_reported_lost_for_its_task_only() {
        let ok = log("readout");
        let sources = vec![
            ("readout".to_string(), Bytes::new(ok.clone(), vec![], 64)),
            (
                "broken".to_string(),
                Bytes::new(log("broken"), vec![Some(0); 100], 64),
            ),
        ];
        let (out, lost) = collect(sources, false).await;
        assert_eq!(out, ok);
        assert_eq!(lost.len(), 1);
        assert!(lost[0].starts_with("broken: "), "{lost:?}");
        assert!(lost[0].contains("connection reset by peer"), "{lost:?}");
    }

    /// A connection body that delivers `data` in small reads, then fails (or ends).
    struct Body {
        data: Vec<u8>,
        at: usize,
        fail: bool,
    }

    impl futures::io::AsyncRead for Body {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut [u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = (self.data.len() - self.at).min(buf.len()).min(5);
            if n == 0 && self.fail {
                let e = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                return std::task::Poll::Ready(Err(e));
            }
            buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            std::task::Poll::Ready(Ok(n))
        }
    }

    #[tokio::test]
    async fn the_api_body_reader_yields_its_bytes_then_the_error_then_ends() {
        for fail in [true, false] {
            let body = Body {
                data: b"2026-11-30T11:00:00Z a\n2026-11-30T11:00:01Z b".to_vec(),
                at: 0,
                fail,
            };
            let items: Vec<_> = read_chunks(futures::io::BufReader::new(body))
                .collect()
                .await;
            let bytes: Vec<u8> = items
                .iter()
                .flat_map(|i| i.clone().unwrap_or_default())
                .collect();
            assert_eq!(bytes, b"2026-11-30T11:00:00Z a\n2026-11-30T11:00:01Z b");
            let errors: Vec<_> = items.iter().filter_map(|i| i.as_ref().err()).collect();
            if fail {
                assert_eq!(errors.len(), 1);
                assert!(items.last().unwrap().is_err(), "the error ends the stream");
                assert!(errors[0].0.starts_with("log stream: "), "{}", errors[0]);
            } else {
                assert!(errors.is_empty());
            }
        }
    }

    fn pod(phase: &str, terminated: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {
                "phase": phase,
                "containerStatuses": [{
                    "name": "task", "image": "x", "imageID": "", "ready": !terminated,
                    "restartCount": 0,
                    "state": if terminated {
                        serde_json::json!({"terminated": {"exitCode": 0}})
                    } else {
                        serde_json::json!({"running": {}})
                    },
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_container_has_ended_when_terminated_or_its_pod_finished() {
        assert!(!container_ended(&pod("Running", false), "task"));
        assert!(container_ended(&pod("Running", true), "task"));
        assert!(container_ended(&pod("Succeeded", false), "task"));
        assert!(container_ended(&pod("Failed", false), "task"));
        // Another container's end says nothing about this one.
        assert!(!container_ended(&pod("Running", true), "sidecar"));
    }

    #[test]
    fn lines_keep_the_api_timestamp_and_get_the_task_prefix() {
        let raw = "2026-11-30T11:03:04.123456789Z readout started";
        let (ts, text) = split_timestamp(raw).unwrap();
        let line = LogLine {
            timestamp: Some(ts),
            text: text.into(),
        };
        assert_eq!(format_line(None, &line), raw);
        assert_eq!(
            format_line(Some("readout-flp001"), &line),
            format!("[readout-flp001] {raw}")
        );
    }
}
