//! The dashboard tests' web client: plain HTTP/1.1 requests (hyper) for the page's contract,
//! and a small W3C WebDriver client driving a real headless Chromium through chromedriver.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

/// An HTTP answer.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
}

/// Sends one request and reads the whole answer (bounded in time).
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let res = send(addr, method, path, headers, body).await;
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(60), res.into_body().collect())
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no whole answer within 60 s"))
        .expect("body")
        .to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// Sends one request; the answer's body is left to read (a stream).
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> hyper::Response<hyper::body::Incoming> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    tokio::time::timeout(Duration::from_secs(300), tx.send_request(req))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Reads a server-sent event stream until an event of `kind`; returns its data.
pub async fn sse_event(res: hyper::Response<hyper::body::Incoming>, kind: &str) -> String {
    let mut body = res.into_body();
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, body.frame())
            .await
            .unwrap_or_else(|_| panic!("no {kind} event within 20 s; got:\n{text}"))
            .expect("stream open")
            .expect("frame");
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
        for block in text.split("\n\n") {
            let mut lines = block.lines();
            if lines.next() == Some(&format!("event: {kind}")[..])
                && let Some(d) = lines.next().and_then(|l| l.strip_prefix("data: "))
            {
                return d.to_string();
            }
        }
    }
}

/// The session cookie (`name=value`) of a login's answer.
pub fn session_cookie(a: &Answer) -> String {
    a.header("set-cookie")
        .split(';')
        .next()
        .unwrap_or("")
        .to_string()
}

/// Logs in with `token`; returns the `Cookie` header value.
pub async fn login(addr: SocketAddr, token: &str) -> String {
    let a = request(
        addr,
        "POST",
        "/ui/login",
        &[("content-type", "application/x-www-form-urlencoded")],
        &format!("token={token}"),
    )
    .await;
    assert_eq!(a.status, 303, "login: {}", a.body);
    session_cookie(&a)
}

// ---- WebDriver ----

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver and one browser session (both ended on drop).
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
    pub shots: PathBuf,
}

/// Chromium and chromedriver as Debian installs them; the test fails without them.
pub fn require_chromium() -> (PathBuf, PathBuf) {
    let chromium = PathBuf::from("/usr/bin/chromium");
    let driver = PathBuf::from("/usr/bin/chromedriver");
    assert!(
        chromium.exists() && driver.exists(),
        "the dashboard's browser test needs Debian's chromium and chromium-driver \
         ({} and {}): apt-get install -y chromium chromium-driver (.ci/run installs them)",
        chromium.display(),
        driver.display()
    );
    (chromium, driver)
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile. Screenshots go to
    /// `ENVBRIDGE_SCREENSHOTS`, else `<target dir>/dashboard-screenshots`.
    pub async fn start() -> Browser {
        let (chromium, driver_bin) = require_chromium();
        let port = driver_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", driver_bin.display()));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let profile = tempfile::tempdir().expect("profile dir");
        let shots = std::env::var_os("ENVBRIDGE_SCREENSHOTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| target_dir().join("dashboard-screenshots"));
        std::fs::create_dir_all(&shots).expect("screenshot dir");
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
            shots,
        };
        let started = Instant::now();
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not listen on {addr} within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1400,900",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain(std::iter::once(format!(
            "--user-data-dir={}",
            b._profile.path().display()
        )))
        .collect::<Vec<_>>();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let v = b.wd("POST", "/session", caps).await;
        b.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_string();
        b
    }

    /// One WebDriver command; its `value`. A WebDriver error fails the test with its message.
    async fn wd(&self, method: &str, path: &str, body: Value) -> Value {
        let body = if method == "GET" || method == "DELETE" {
            String::new()
        } else {
            body.to_string()
        };
        let a = request(
            self.addr,
            method,
            path,
            &[("content-type", "application/json")],
            &body,
        )
        .await;
        let v: Value = serde_json::from_str(&a.body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}: {}", a.body));
        if a.status != 200 {
            panic!("WebDriver {method} {path}: {} {}", a.status, v["value"]);
        }
        v["value"].clone()
    }

    /// Like `wd`, but a WebDriver error is an answer (None).
    async fn try_wd(&self, method: &str, path: &str, body: Value) -> Option<Value> {
        let a = request(
            self.addr,
            method,
            path,
            &[("content-type", "application/json")],
            &body.to_string(),
        )
        .await;
        let v: Value = serde_json::from_str(&a.body).ok()?;
        (a.status == 200).then(|| v["value"].clone())
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub async fn goto(&self, url: &str) {
        self.wd("POST", &self.s("/url"), json!({ "url": url }))
            .await;
    }

    pub async fn url(&self) -> String {
        self.wd("GET", &self.s("/url"), Value::Null)
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Runs `script` in the page (`return ...` gives its value).
    pub async fn js(&self, script: &str, args: Value) -> Value {
        self.wd(
            "POST",
            &self.s("/execute/sync"),
            json!({ "script": script, "args": args }),
        )
        .await
    }

    /// The element `css` selects, waiting up to `within` for it.
    pub async fn find(&self, css: &str, within: Duration) -> String {
        self.until(css, within, async || {
            let v = self
                .try_wd(
                    "POST",
                    &self.s("/element"),
                    json!({ "using": "css selector", "value": css }),
                )
                .await?;
            v[ELEMENT].as_str().map(str::to_string)
        })
        .await
    }

    /// `attempt`'s answer, asked again every 100 ms for up to `within`; then the test fails
    /// naming `css` and showing what the page says.
    async fn until<T>(
        &self,
        css: &str,
        within: Duration,
        mut attempt: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        let started = Instant::now();
        loop {
            if let Some(v) = attempt().await {
                return v;
            }
            if started.elapsed() > within {
                let body = self
                    .js("return document.body.innerText.slice(0, 3000)", json!([]))
                    .await;
                panic!("no element {css} within {within:?}; the page says:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the element `css` selects (found again if the page replaced it meanwhile).
    pub async fn click(&self, css: &str) {
        for _ in 0..5 {
            let e = self.find(css, Duration::from_secs(20)).await;
            let path = self.s(&format!("/element/{e}/click"));
            if self.try_wd("POST", &path, json!({})).await.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("could not click {css}");
    }

    /// Clears the input `css` selects and types `text`.
    pub async fn type_in(&self, css: &str, text: &str) {
        let e = self.find(css, Duration::from_secs(20)).await;
        self.wd("POST", &self.s(&format!("/element/{e}/clear")), json!({}))
            .await;
        self.wd(
            "POST",
            &self.s(&format!("/element/{e}/value")),
            json!({ "text": text }),
        )
        .await;
    }

    /// The visible text of the element `css` selects, waiting up to 20 s for it. Read in one
    /// script, so a page that replaces the element meanwhile cannot leave a stale reference.
    pub async fn text(&self, css: &str) -> String {
        self.until(css, Duration::from_secs(20), async || {
            let v = self
                .js(
                    "const e = document.querySelector(arguments[0]); return e ? e.innerText : null",
                    json!([css]),
                )
                .await;
            v.as_str().map(str::to_string)
        })
        .await
    }

    /// Writes a screenshot of the window to `<shots>/<name>.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let v = self.wd("GET", &self.s("/screenshot"), Value::Null).await;
        let png = base64(v.as_str().expect("screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends the browser (chromedriver quits it with the session), then chromedriver.
        if !self.session.is_empty() {
            let addr = self.addr;
            let path = format!("/session/{}", self.session);
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(10),
                        request(addr, "DELETE", &path, &[], ""),
                    )
                    .await;
                });
            })
            .join();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A free port for one chromedriver: each browser test of this process gets its own
/// (30000-32767, below the ephemeral range and the fixture's 20000-29999).
fn driver_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 30000 + (std::process::id() % 2000) as u16;
    (0..700)
        .map(|_| base + NEXT.fetch_add(1, Ordering::Relaxed) % 700)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port for chromedriver")
}

/// Cargo's target directory (tests run from `<target>/debug/deps`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.ancestors().nth(3).map(Path::to_path_buf))
        })
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// Standard base64 (a WebDriver screenshot).
fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64("aGVsbG8gd29ybGQ="), b"hello world");
    assert_eq!(base64("iVBORw=="), b"\x89PNG");
}

/// A TCP proxy in front of the daemon that the test can cut: every open connection is
/// dropped and new ones are closed at once until it is restored (a lost network).
pub struct CutProxy {
    pub addr: SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    pub async fn start(to: SocketAddr) -> CutProxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, k) = (cut.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.load(Ordering::Acquire) {
                    continue; // dropped: closed at once
                }
                let t = tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                k.lock().expect("conns").push(t.abort_handle());
            }
        });
        CutProxy {
            addr,
            cut,
            conns,
            accept,
        }
    }

    /// Cuts (true: drops every connection, refuses new ones) or restores (false).
    pub fn cut(&self, on: bool) {
        self.cut.store(on, std::sync::atomic::Ordering::Release);
        if on {
            for h in self.conns.lock().expect("conns").drain(..) {
                h.abort();
            }
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.cut(true);
        self.accept.abort();
    }
}
