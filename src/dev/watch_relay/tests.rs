use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::*;

const SENT: usize = 32 << 20;

fn byte(i: usize) -> u8 {
    (i % 251) as u8
}

/// An upstream that reads `hello`, then writes SENT patterned bytes and says when its last
/// write returned; and a relay in front of it holding at most `hold_max`.
async fn upstream_and_relay(hold_max: usize) -> (SocketAddr, oneshot::Receiver<()>) {
    let up = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let up_addr = up.local_addr().expect("upstream addr");
    let (done_tx, done_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = up.accept().await.expect("accept");
        let mut hello = [0u8; 5];
        s.read_exact(&mut hello).await.expect("the request");
        assert_eq!(&hello, b"hello");
        let data: Vec<u8> = (0..SENT).map(byte).collect();
        s.write_all(&data).await.expect("write");
        let _ = done_tx.send(());
        // Held open until the client has read it all.
        let _ = s.read(&mut hello).await;
    });
    let args = WatchRelayArgs {
        listen: "127.0.0.1:0".parse().expect("addr"),
        upstream: up_addr,
    };
    let listener = bind(&args).await.expect("bind relay");
    let addr = listener.local_addr().expect("relay addr");
    tokio::spawn(serve(listener, up_addr, hold_max));
    (addr, done_rx)
}

async fn read_all_checked(client: &mut TcpStream) {
    let mut got = vec![0u8; SENT];
    client.read_exact(&mut got).await.expect("read");
    let bad = got.iter().enumerate().position(|(i, b)| *b != byte(i));
    assert_eq!(bad, None, "bytes relayed out of order or changed");
}

#[tokio::test]
async fn a_reader_that_does_not_read_never_holds_the_upstream_back() {
    let (addr, done) = upstream_and_relay(HOLD_MAX).await;
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client.write_all(b"hello").await.expect("request");
    // 32 MiB is far more than the sockets between them hold: without the relay's hold the
    // upstream's write would wait for the client.
    tokio::time::timeout(Duration::from_secs(20), done)
        .await
        .expect("the upstream wrote everything while the client read nothing")
        .expect("upstream task");
    read_all_checked(&mut client).await;
}

#[tokio::test]
async fn the_hold_is_bounded_and_the_upstream_waits_beyond_it() {
    let (addr, mut done) = upstream_and_relay(1 << 20).await;
    let mut client = TcpStream::connect(addr).await.expect("connect");
    client.write_all(b"hello").await.expect("request");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        done.try_recv().is_err(),
        "the upstream finished writing 32 MiB through a 1 MiB hold that nobody read"
    );
    read_all_checked(&mut client).await;
    tokio::time::timeout(Duration::from_secs(20), done)
        .await
        .expect("the upstream finished once the client read")
        .expect("upstream task");
}

#[tokio::test]
async fn only_loopback_addresses_are_relayed() {
    let args = WatchRelayArgs {
        listen: "127.0.0.1:0".parse().expect("addr"),
        upstream: "192.0.2.1:443".parse().expect("addr"),
    };
    let err = bind(&args).await.expect_err("a non-loopback upstream");
    assert!(
        err.to_string().contains("--upstream 192.0.2.1:443"),
        "{err}"
    );
}
