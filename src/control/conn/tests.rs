//! The connection against a peer written frame by frame: what a gRPC server may send that
//! the simulator (tonic) never does.

use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::control::h2frame::*;

const WAIT: Duration = Duration::from_secs(5);

/// The test's side of the connection: reads whole frames, writes raw ones.
struct Peer {
    io: TcpStream,
    input: Vec<u8>,
}

impl Peer {
    async fn accept(l: &TcpListener) -> Peer {
        let (io, _) = l.accept().await.unwrap();
        let mut p = Peer {
            io,
            input: Vec::new(),
        };
        while p.input.len() < PREFACE.len() {
            p.fill().await;
        }
        assert_eq!(&p.input[..PREFACE.len()], PREFACE);
        p.input.drain(..PREFACE.len());
        p
    }

    async fn fill(&mut self) {
        let mut b = [0u8; 4096];
        let n = tokio::time::timeout(WAIT, self.io.read(&mut b))
            .await
            .expect("the client wrote in time")
            .unwrap();
        assert!(n > 0, "the client closed");
        self.input.extend_from_slice(&b[..n]);
    }

    /// The next frame the client sent: (type, flags, stream, payload).
    async fn frame(&mut self) -> (u8, u8, u32, Vec<u8>) {
        loop {
            if let Some((len, kind, flags, stream)) = frame_header(&self.input)
                && self.input.len() >= FRAME_HEADER_LEN + len
            {
                let payload = self.input[FRAME_HEADER_LEN..FRAME_HEADER_LEN + len].to_vec();
                self.input.drain(..FRAME_HEADER_LEN + len);
                return (kind, flags, stream, payload);
            }
            self.fill().await;
        }
    }

    /// Frames until one of `kind` (with `flags` set) arrives; returns it.
    async fn until(&mut self, kind: u8, flags: u8) -> (u8, u8, u32, Vec<u8>) {
        loop {
            let f = self.frame().await;
            if f.0 == kind && f.1 & flags == flags {
                return f;
            }
        }
    }

    async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut out = Vec::new();
        write_frame(&mut out, kind, flags, stream, payload);
        self.io.write_all(&out).await.unwrap();
    }

    async fn headers(&mut self, stream: u32, pairs: &[(&str, &str)], end_stream: bool) {
        let mut block = Vec::new();
        for (n, v) in pairs {
            encode_literal(n.as_bytes(), v.as_bytes(), &mut block);
        }
        let mut out = Vec::new();
        write_header_block(&mut out, stream, &block, end_stream);
        self.io.write_all(&out).await.unwrap();
    }
}

async fn pair() -> (Conn, Peer) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (conn, peer) = tokio::join!(Conn::connect(addr, WAIT), Peer::accept(&l));
    (conn.unwrap(), peer)
}

#[tokio::test]
async fn a_reply_comes_through_settings_pings_and_a_split_message() {
    let (conn, mut peer) = pair().await;
    let call = tokio::spawn(
        conn.call("GetState", "application/grpc+json", Some(WAIT), b"{}")
            .single(),
    );
    let (_, _, id, _) = peer.until(HEADERS, END_HEADERS).await;
    let (_, _, _, body) = peer.until(DATA, END_STREAM).await;
    assert_eq!(body, grpc::frame_message(b"{}"));
    // The server's settings and a ping: both acknowledged.
    peer.send(SETTINGS, 0, 0, &[0, 4, 0, 0, 0x10, 0]).await;
    peer.until(SETTINGS, ACK).await;
    peer.send(PING, 0, 0, b"12345678").await;
    let (_, _, _, ping) = peer.until(PING, ACK).await;
    assert_eq!(ping, b"12345678");
    // Headers, the message in two DATA frames (one padded), trailers.
    peer.headers(id, &[(":status", "200")], false).await;
    let msg = grpc::frame_message(br#"{"state":"READY"}"#);
    peer.send(DATA, 0, id, &msg[..3]).await;
    let mut padded = vec![2];
    padded.extend_from_slice(&msg[3..]);
    padded.extend_from_slice(&[0, 0]);
    peer.send(DATA, PADDED, id, &padded).await;
    peer.headers(id, &[("grpc-status", "0")], true).await;
    let got = tokio::time::timeout(WAIT, call).await.unwrap().unwrap();
    assert_eq!(got.unwrap(), br#"{"state":"READY"}"#);
    // The window taken by the data is given back to the connection.
    let (_, _, s, inc) = peer.until(WINDOW_UPDATE, 0).await;
    assert_eq!((s, word(&inc, 0)), (0, Some(3)));
}

#[tokio::test]
async fn resets_statuses_and_goaway_end_calls_with_their_codes() {
    let (conn, mut peer) = pair().await;
    let reset = tokio::spawn(
        conn.call("/occ_pb.Occ/GetState", "application/grpc", None, b"")
            .single(),
    );
    let (_, _, first, _) = peer.until(HEADERS, END_HEADERS).await;
    peer.send(RST_STREAM, 0, first, &CANCEL.to_be_bytes()).await;
    let e = tokio::time::timeout(WAIT, reset)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code, tonic::Code::Cancelled, "{e:?}");

    let refused = tokio::spawn(
        conn.call("Transition", "application/grpc+json", None, b"{}")
            .single(),
    );
    let (_, _, second, _) = peer.until(HEADERS, END_HEADERS).await;
    assert!(second > first);
    peer.headers(
        second,
        &[
            (":status", "200"),
            ("grpc-status", "12"),
            ("grpc-message", "no%20such"),
        ],
        true,
    )
    .await;
    let e = tokio::time::timeout(WAIT, refused)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(e, Failure::new(tonic::Code::Unimplemented, "no such"));

    // GOAWAY naming the second stream as the last: a stream opened after it fails
    // Unavailable, and the connection takes no more calls.
    let mut streaming = conn.call("EventStream", "application/grpc+json", None, b"{}");
    let (_, _, third, _) = peer.until(HEADERS, END_HEADERS).await;
    let mut goaway = second.to_be_bytes().to_vec();
    goaway.extend_from_slice(&NO_ERROR.to_be_bytes());
    peer.send(GOAWAY, 0, 0, &goaway).await;
    let end = tokio::time::timeout(WAIT, streaming.next()).await.unwrap();
    match end {
        Some(Reply::End(Err(f))) => assert_eq!(f.code, tonic::Code::Unavailable, "{f:?}"),
        other => panic!("stream {third}: {other:?}"),
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    while !conn.is_closed() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still open after GOAWAY"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let late = conn
        .call("GetState", "application/grpc+json", None, b"{}")
        .single()
        .await;
    assert_eq!(late.unwrap_err().code, tonic::Code::Unavailable);
}

#[tokio::test]
async fn a_request_larger_than_the_window_waits_for_window_updates() {
    let (conn, mut peer) = pair().await;
    let big = vec![b'x'; 100_000];
    let _call = conn.call("Transition", "application/grpc+json", None, &big);
    peer.until(HEADERS, END_HEADERS).await;
    // The default window: 65,535 bytes of DATA, then nothing until it grows.
    let mut got = 0;
    while got < DEFAULT_WINDOW as usize {
        let (kind, flags, _, p) = peer.frame().await;
        if kind == DATA {
            assert_eq!(flags & END_STREAM, 0);
            got += p.len();
        }
    }
    assert_eq!(got, DEFAULT_WINDOW as usize);
    let more = tokio::time::timeout(Duration::from_millis(200), peer.until(DATA, 0)).await;
    assert!(more.is_err(), "data beyond the window");
    let inc = 100_000u32.to_be_bytes();
    peer.send(WINDOW_UPDATE, 0, 0, &inc).await;
    peer.send(WINDOW_UPDATE, 0, 1, &inc).await;
    let mut rest = 0;
    loop {
        let (kind, flags, _, p) = peer.frame().await;
        if kind == DATA {
            rest += p.len();
            if flags & END_STREAM != 0 {
                break;
            }
        }
    }
    assert_eq!(got + rest, big.len() + 5);
}

#[tokio::test]
async fn a_dropped_call_is_reset_and_an_oversized_frame_ends_the_connection() {
    let (conn, mut peer) = pair().await;
    let call = conn.call("EventStream", "application/grpc+json", None, b"{}");
    let (_, _, id, _) = peer.until(HEADERS, END_HEADERS).await;
    drop(call);
    let (_, _, reset, code) = peer.until(RST_STREAM, 0).await;
    assert_eq!((reset, word(&code, 0)), (id, Some(CANCEL)));
    let mut pending = conn.call("EventStream", "application/grpc+json", None, b"{}");
    peer.until(HEADERS, END_HEADERS).await;
    let mut huge = Vec::new();
    write_frame_header(&mut huge, 1 << 20, DATA, 0, 3);
    peer.io.write_all(&huge).await.unwrap();
    match tokio::time::timeout(WAIT, pending.next()).await.unwrap() {
        Some(Reply::End(Err(f))) => {
            assert_eq!(f.code, tonic::Code::Unavailable);
            assert!(f.message.contains("protocol error"), "{}", f.message);
        }
        other => panic!("{other:?}"),
    }
}

// The control client's paths on the wire (FairMQ devices match bare method names).
mod paths {
    use std::time::Duration;

    use loona_hpack::Decoder;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    use crate::control::client::TaskEndpoint;
    use crate::control::policy::ControlClient;
    use crate::plan::ControlMode;

    /// What the first request of a connection carries as `:path`, read off the raw bytes.
    async fn first_path_sent(mode: ControlMode) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let capture = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.expect("accept");
            let mut bytes = Vec::new();
            let mut dec = Decoder::new();
            loop {
                let mut chunk = [0u8; 4096];
                let n = sock.read(&mut chunk).await.expect("read");
                assert!(n > 0, "connection closed before a request");
                bytes.extend_from_slice(&chunk[..n]);
                let mut at = 24; // the preface
                while bytes.len() >= at + 9 {
                    let len = u32::from_be_bytes([0, bytes[at], bytes[at + 1], bytes[at + 2]]);
                    let end = at + 9 + len as usize;
                    if bytes.len() < end {
                        break;
                    }
                    if bytes[at + 3] == 0x1 {
                        let headers = dec.decode(&bytes[at + 9..end]).expect("hpack");
                        let (_, path) = headers
                            .into_iter()
                            .find(|(n, _)| n == b":path")
                            .expect(":path");
                        return String::from_utf8(path).expect("utf8");
                    }
                    at = end;
                }
            }
        });
        // Nobody answers: the call ends at its deadline, after the request went out.
        let ep = TaskEndpoint::new(addr, mode);
        let _ = ControlClient::default()
            .get_state(&ep, Duration::from_secs(2))
            .await;
        tokio::time::timeout(Duration::from_secs(5), capture)
            .await
            .expect("request seen")
            .expect("capture task")
    }

    #[tokio::test]
    async fn a_fairmq_call_sends_the_bare_method_name_and_a_direct_call_the_full_path() {
        assert_eq!(first_path_sent(ControlMode::Fairmq).await, "GetState");
        assert_eq!(
            first_path_sent(ControlMode::Direct).await,
            "/occ_pb.Occ/GetState"
        );
    }
}

/// One connection a task, each with its driver for as long as it is open: the driver's
/// future is what an idle connection costs.
#[tokio::test]
async fn a_drivers_future_is_small() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let io = tokio::net::TcpStream::connect(l.local_addr().expect("addr"))
        .await
        .expect("connect");
    let (_commands, rx) = futures::channel::mpsc::unbounded();
    let driver = super::driver::Driver::new(io, rx);
    let own = std::mem::size_of_val(&driver);
    let run = std::mem::size_of_val(&driver.run());
    // 992 bytes with a `select!` of the socket's readiness futures, 672 polled in place
    // (debug build; the driver itself 328).
    assert!(
        run < own + 400,
        "the driver's future is {run} bytes ({own} its own)"
    );
}
