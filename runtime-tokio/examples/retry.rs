//! A generic retry against a flaky in-process loopback service.
//!
//! The server (a TCP listener on 127.0.0.1) answers `busy` to its first two requests and
//! `ok <n>` afterwards. The client retries with `throttle_tokio::sync::retry`: only `busy` is
//! retried, every retry is reported, no attempt starts after a 2 s deadline, and each attempt
//! bounds its own I/O with the time it has left. Exits non-zero unless the third attempt wins.
//!
//! `cargo run -p throttle-tokio --example retry`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use throttle_tokio::TokioRuntime;
use throttle_tokio::backoff::{BackoffConfig, Jitter};
use throttle_tokio::failover::FinagleBudget;
use throttle_tokio::sync::{Attempt, SharedBudget, retry};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Why one request failed.
#[derive(Debug)]
enum Failure {
    /// The server is busy: worth a retry.
    Busy,
    /// Anything else (I/O, a timeout, a garbled answer): not retried.
    Broken(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Busy => f.write_str("server busy"),
            Failure::Broken(why) => write!(f, "request broken: {why}"),
        }
    }
}

impl std::error::Error for Failure {}

/// The flaky service: one line in, one line out; busy for the first `busy_for` requests.
async fn serve(listener: TcpListener, busy_for: usize) {
    let served = Arc::new(AtomicUsize::new(0));
    while let Ok((stream, _)) = listener.accept().await {
        let served = Arc::clone(&served);
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(read).read_line(&mut line).await.is_ok() {
                let n = served.fetch_add(1, Ordering::SeqCst) + 1;
                let answer = if n <= busy_for {
                    "busy\n".to_string()
                } else {
                    format!("ok {n}\n")
                };
                let _ = write.write_all(answer.as_bytes()).await;
            }
        });
    }
}

/// One request, bounded by the time its attempt has left.
async fn get(addr: std::net::SocketAddr, attempt: Attempt) -> Result<String, Failure> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"get\n").await?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).await?;
        Ok::<_, std::io::Error>(line.trim().to_string())
    };
    let limit = attempt.time_left.unwrap_or(Duration::from_secs(5));
    match tokio::time::timeout(limit, exchange).await {
        Ok(Ok(line)) if line == "busy" => Err(Failure::Busy),
        Ok(Ok(line)) if line.starts_with("ok") => Ok(line),
        Ok(Ok(line)) => Err(Failure::Broken(format!("unexpected answer {line:?}"))),
        Ok(Err(e)) => Err(Failure::Broken(e.to_string())),
        Err(_) => Err(Failure::Broken("timed out".into())),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("usage: retry\n\nRetries a request to an in-process service that is busy twice.");
        return std::process::ExitCode::SUCCESS;
    }
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("a local address");
    tokio::spawn(serve(listener, 2));

    let rt = TokioRuntime::new();
    let backoff = BackoffConfig::builder()
        .initial(Duration::from_millis(20))
        .max(Duration::from_millis(200))
        .jitter(Jitter::Proportional { ppm: 200_000 })
        .build()
        .expect("a valid backoff");
    let budget = SharedBudget::new(FinagleBudget::default());
    let deadline = rt.now() + Duration::from_secs(2);
    let attempts = AtomicUsize::new(0);
    let result = retry(rt.clone(), |attempt| {
        attempts.fetch_add(1, Ordering::SeqCst);
        get(addr, attempt)
    })
    .backoff(backoff)
    .when(|e: &Failure| matches!(e, Failure::Busy))
    .notify(|e: &Failure, after| println!("attempt failed ({e}); retrying in {after:?}"))
    .deadline(deadline)
    .budget(&budget)
    .await;

    let attempts = attempts.load(Ordering::SeqCst);
    match result {
        Ok(answer) if answer == "ok 3" && attempts == 3 => {
            println!("got {answer:?} after {attempts} attempts");
            std::process::ExitCode::SUCCESS
        }
        Ok(answer) => {
            eprintln!("unexpected answer {answer:?} after {attempts} attempts");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("retry failed after {attempts} attempts: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
