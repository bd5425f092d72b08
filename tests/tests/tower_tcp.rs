//! The three tower pieces stacked as the README shows, end to end over loopback TCP with a
//! hand-written line protocol (no HTTP stack: hyper would cost more build time than it tells
//! us). The server rejects the first write to bucket 1 with "disk write locked"; the retry
//! layer retries it, the write-gate layer holds the retry until the gate it installed opens,
//! and the keyed concurrency layer keeps one request per shard on the wire.

use core::time::Duration;
use std::sync::{Arc, Mutex};

use throttle_sansio::failover::{CallConfig, ErrorClass, Unlimited};
use throttle_sansio::paced_writer::WriteOutcome;
use throttle_sansio::sync::tower::{FailoverPolicy, KeyedConcurrencyLayer, WriteGateLayer};
use throttle_sansio::sync::{FailoverExecutor, GateHandle, WindowHandle};
use throttle_sansio::{Signal, WindowConfig, WriteGateConfig};
use throttle_tokio::{Instant, TokioRuntime};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// One write: its bucket (also its shard) and an id.
#[derive(Clone, Debug)]
struct Write {
    bucket: u32,
    id: u32,
}

/// The server's answer: 0 written, 1 disk write locked.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Answer(u8);

/// A client that sends each write on a connection of its own: `"<bucket> <id>\n"`, answered
/// with `"<code>\n"`.
#[derive(Clone)]
struct LineClient {
    addr: std::net::SocketAddr,
}

impl tower::Service<Write> for LineClient {
    type Response = Answer;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = std::io::Result<Answer>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, w: Write) -> Self::Future {
        let addr = self.addr;
        Box::pin(async move {
            let mut stream = TcpStream::connect(addr).await?;
            stream
                .write_all(format!("{} {}\n", w.bucket, w.id).as_bytes())
                .await?;
            let mut line = String::new();
            BufReader::new(stream).read_line(&mut line).await?;
            let code = line.trim().parse().map_err(std::io::Error::other)?;
            Ok(Answer(code))
        })
    }
}

/// Serves writes; the first one to bucket 1 is rejected. Logs (bucket, id, ms) per write.
async fn serve(listener: TcpListener, rt: TokioRuntime, log: Arc<Mutex<Vec<(u32, u32, u64)>>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (rt, log) = (rt.clone(), Arc::clone(&log));
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(read).read_line(&mut line).await.is_err() {
                return;
            }
            let mut parts = line.split_whitespace().map(|p| p.parse::<u32>().unwrap());
            let (bucket, id) = (parts.next().unwrap(), parts.next().unwrap());
            let code = {
                let mut log = log.lock().unwrap();
                let first = !log.iter().any(|(b, _, _)| *b == bucket);
                log.push((bucket, id, rt.now().as_nanos() / 1_000_000));
                u8::from(bucket == 1 && first)
            };
            let _ = write.write_all(format!("{code}\n").as_bytes()).await;
        });
    }
}

/// A rejection, surfaced as an error so that the retry layer sees it.
#[derive(Debug)]
struct DiskWriteLocked;

impl std::fmt::Display for DiskWriteLocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("disk write locked")
    }
}

impl std::error::Error for DiskWriteLocked {}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_rejected_write_is_retried_after_its_gate_over_tcp() {
    let rt = TokioRuntime::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(serve(listener, rt.clone(), Arc::clone(&log)));

    // The stack, outermost first: retry, gate, per-shard concurrency, transport.
    let gate = GateHandle::with_runtime(rt.clone(), WriteGateConfig::fluss_landed()).unwrap();
    let window = WindowHandle::new(WindowConfig::default().with_max_in_flight(1)).unwrap();
    let fx = FailoverExecutor::new(
        rt.clone(),
        |_: &BoxError| ErrorClass::RETRY, // a rejection was not executed
        Unlimited,
        CallConfig::default().with_max_auto_retries(3),
    )
    .unwrap();
    let classify = |a: &Answer| match a.0 {
        0 => WriteOutcome::Ok {
            pressure: Signal::Clear,
        },
        _ => WriteOutcome::DiskWriteLocked,
    };
    let bucket_of = |w: &Write| w.bucket; // the gate's bucket is the window's shard
    let svc = ServiceBuilder::new()
        .retry(FailoverPolicy::new(fx))
        .map_result(|r: Result<Answer, BoxError>| match r? {
            Answer(0) => Ok(Answer(0)),
            _ => Err(BoxError::from(DiskWriteLocked)),
        })
        .map_err(BoxError::from)
        .layer(WriteGateLayer::new(gate.clone(), bucket_of, classify))
        .layer(KeyedConcurrencyLayer::new(window.clone(), bucket_of))
        .service(LineClient { addr });

    let calls: Vec<_> = [(1, 0), (2, 0), (2, 1)]
        .into_iter()
        .map(|(bucket, id)| tokio::spawn(svc.clone().oneshot(Write { bucket, id })))
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap(), Answer(0));
    }
    let log = log.lock().unwrap().clone();
    let sends_of = |b: u32| log.iter().filter(|(bucket, _, _)| *bucket == b).count();
    assert_eq!(
        (sends_of(1), sends_of(2)),
        (2, 2),
        "bucket 1 was retried once"
    );
    let (first, retry) = {
        let mut ms = log.iter().filter(|(b, _, _)| *b == 1).map(|(_, _, ms)| *ms);
        (ms.next().unwrap(), ms.next().unwrap())
    };
    // Fluss's disk backoff: 1 s ±20 % for the first rejection.
    let waited = Duration::from_millis(retry - first);
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_millis(1200),
        "the retry waited {waited:?} for the gate"
    );
    assert!(rt.now() >= Instant::from_millis(800));
    assert_eq!((window.in_flight(&1), window.in_flight(&2)), (0, 0));
}
