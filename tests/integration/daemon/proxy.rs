//! A TCP proxy on 127.0.0.1 in front of the apiserver: the daemon under test reaches the
//! apiserver only through it, so a test can take "the apiserver" away from the daemon and
//! bring it back without stopping the shared control plane other tests are using.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let (u, c) = (up.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !u.load(Ordering::Acquire) {
                    drop(inbound); // down: refuse by closing at once
                    continue;
                }
                let h = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c.lock().expect("conns").push(h.abort_handle());
            }
        })
        .abort_handle();
        Proxy {
            addr,
            up,
            conns,
            accept,
        }
    }

    /// The apiserver goes away: open connections are cut, new ones are closed at once.
    pub fn down(&self) {
        self.up.store(false, Ordering::Release);
        for h in self.conns.lock().expect("conns").drain(..) {
            h.abort();
        }
    }

    pub fn up(&self) {
        self.up.store(true, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for h in self.conns.lock().expect("conns").drain(..) {
            h.abort();
        }
    }
}
