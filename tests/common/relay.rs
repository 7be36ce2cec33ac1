//! A TCP relay a test can cut and heal (tests/cluster.rs: a node's link to etcd; tests/tasks.rs:
//! the gateway's link to an HTTP upstream).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

/// A TCP relay to a local port that a test can cut (every connection closed, new ones
/// refused) and heal, or mute (answers dropped): a link cut without root.
pub struct Relay {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// While set, what the member sends back is read and dropped (requests still arrive):
    /// answers lost on the way.
    mute: Arc<AtomicBool>,
    epoch: tokio::sync::watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    pub async fn to(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let mute = Arc::new(AtomicBool::new(false));
        let (epoch, _) = tokio::sync::watch::channel(0u64);
        let (c, e, mu) = (cut.clone(), epoch.clone(), mute.clone());
        let task = tokio::spawn(async move {
            let conns = tokio_util::task::TaskTracker::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if c.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let mut changed = e.subscribe();
                let mute = mu.clone();
                conns.spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let (mut ir, mut iw) = inbound.into_split();
                    let (mut or, mut ow) = outbound.into_split();
                    let down = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match or.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if mute.load(Ordering::SeqCst) {
                                continue;
                            }
                            if iw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        _ = tokio::io::copy(&mut ir, &mut ow) => {}
                        _ = down => {}
                        _ = changed.changed() => {}
                    }
                });
            }
        });
        Relay {
            addr,
            cut,
            mute,
            epoch,
            task,
        }
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// Answers lost from now on (requests still reach the member), until `unmute`.
    pub fn mute(&self) {
        self.mute.store(true, Ordering::SeqCst);
    }

    pub fn unmute(&self) {
        self.mute.store(false, Ordering::SeqCst);
    }
}
