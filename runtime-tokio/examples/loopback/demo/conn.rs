//! A client connection: requests pipelined over one TCP stream, responses matched by id.

use super::proto::{self, Request, Status};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// The connection broke (or was closed) before a response arrived: the request may or may
/// not have executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disconnected;

/// A response: its status and payload.
pub type Answer = (Status, Vec<u8>);
type Pending = Mutex<HashMap<u64, oneshot::Sender<Answer>>>;

#[derive(Debug)]
struct Shared {
    pending: Pending,
    next_id: AtomicU64,
    closed: AtomicBool,
}

/// One pipelined connection; cheap to clone. Dropping the last clone closes it.
#[derive(Clone, Debug)]
pub struct Conn {
    shared: Arc<Shared>,
    out: mpsc::UnboundedSender<Vec<u8>>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn::from_stream(stream))
    }

    /// Runs the pipelined client over an open stream (its reader and writer tasks are spawned
    /// on the current tokio runtime).
    pub fn from_stream(stream: TcpStream) -> Conn {
        let (mut rd, mut wr) = stream.into_split();
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
        });
        let (out, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        // Writer: ends when every `Conn` clone is dropped (or the socket fails).
        tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if proto::write_frame(&mut wr, &frame).await.is_err() {
                    break;
                }
            }
        });
        let reader_shared = shared.clone();
        // Reader: ends at end of stream or on error, failing every pending request.
        tokio::spawn(async move {
            while let Ok(Some(body)) = proto::read_frame(&mut rd).await {
                let Some((id, status, payload)) = proto::parse_response(&body) else {
                    break;
                };
                let waiter = lock(&reader_shared.pending).remove(&id);
                if let Some(tx) = waiter {
                    let _ = tx.send((status, payload.to_vec()));
                }
            }
            reader_shared.closed.store(true, Ordering::SeqCst);
            lock(&reader_shared.pending).clear();
        });
        Conn { shared, out }
    }

    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst) || self.out.is_closed()
    }

    /// Sends `req`; the receiver gets its response.
    fn start(&self, req: Request) -> Result<(u64, oneshot::Receiver<Answer>), Disconnected> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, tx);
        // Checked after registering, so a reader that closes concurrently clears our entry.
        if self.is_closed() || self.out.send(req.finish(id)).is_err() {
            lock(&self.shared.pending).remove(&id);
            return Err(Disconnected);
        }
        Ok((id, rx))
    }

    /// Sends `req` and waits for its response.
    pub async fn call(&self, req: Request) -> Result<Answer, Disconnected> {
        let (_, rx) = self.start(req)?;
        rx.await.map_err(|_| Disconnected)
    }

    /// [`Conn::call`] that gives up after `timeout` (the response counts as lost; the
    /// request may have executed).
    pub async fn call_timeout(
        &self,
        req: Request,
        timeout: std::time::Duration,
    ) -> Result<Answer, Disconnected> {
        let (id, rx) = self.start(req)?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(res) => res.map_err(|_| Disconnected),
            Err(_) => {
                lock(&self.shared.pending).remove(&id);
                Err(Disconnected)
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
