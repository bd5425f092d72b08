//! A sharded reader: 2000 gets over 4 shards through a `BatchDriver` (the rate-adaptive
//! batcher with batches of at most 100 gets, and a dispatch window of 4 batches in flight per
//! shard, so each shard's fifth batch waits for credit). The callers of the 400 gets in those
//! waiting batches give up after 30 ms (`tokio::time::timeout` drops their `Submit`): the gets
//! are withdrawn before their batch leaves, and a batch left empty is never sent, so the
//! in-process server on 127.0.0.1, which answers after 300 ms, never sees them. Exits non-zero
//! (a failed assertion) if an answer is wrong or the server saw a get whose caller gave up.
//!
//! ```text
//! cargo run -p throttle-tokio --example reader
//! ```

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use throttle_tokio::sync::{BatchDriver, BatchOutcome};
use throttle_tokio::{BatcherConfig, TokioRuntime};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// The server: one request per connection, a line `shard key key …`, answered after 300 ms
/// with a line of `2 × key` each. It records every key it receives, with its answer.
async fn server() -> io::Result<(SocketAddr, Arc<Mutex<BTreeMap<u32, u64>>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let (addr, seen) = (
        listener.local_addr()?,
        Arc::new(Mutex::new(BTreeMap::new())),
    );
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                let mut line = String::new();
                conn.read_line(&mut line).await?;
                let keys: Vec<u32> = line
                    .split(' ')
                    .skip(1)
                    .filter_map(|k| k.trim().parse().ok())
                    .collect();
                let answers: Vec<u64> = keys.iter().map(|k| 2 * u64::from(*k)).collect();
                log.lock()
                    .unwrap()
                    .extend(keys.into_iter().zip(answers.iter().copied()));
                tokio::time::sleep(Duration::from_millis(300)).await;
                let answer: Vec<String> = answers.iter().map(u64::to_string).collect();
                conn.write_all(format!("{}\n", answer.join(" ")).as_bytes())
                    .await
            });
        }
    });
    Ok((addr, seen))
}

/// The wire encoding: one batch of gets on a fresh connection.
async fn exchange(addr: SocketAddr, shard: u8, keys: Vec<u32>) -> BatchOutcome<u64, io::Error> {
    let mut conn = BufReader::new(TcpStream::connect(addr).await?);
    let keys: Vec<String> = keys.iter().map(u32::to_string).collect();
    conn.write_all(format!("{shard} {}\n", keys.join(" ")).as_bytes())
        .await?;
    let mut line = String::new();
    conn.read_line(&mut line).await?;
    Ok(line
        .split_whitespace()
        .map(|v| v.parse().map_err(io::Error::other))
        .collect())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::args().len() > 1 {
        return println!("usage: reader (no options)");
    }
    let (addr, seen) = server().await.expect("a loopback server");
    let per_batch = NonZeroUsize::new(100).expect("not zero");
    let cfg = BatcherConfig::reads().with_max_requests_per_batch(per_batch);
    let send = move |shard: &u8, keys| exchange(addr, *shard, keys);
    let driver = BatchDriver::new(TokioRuntime::new(), send, cfg);
    // Keys 1600 and up wait behind 4 full batches per shard; their callers give up at 30 ms.
    let patience = |k: u32| Duration::from_millis(if k < 1600 { 9_000 } else { 30 });
    let get = |k: u32| timeout(patience(k), driver.submit(k as u8 % 4, k));
    let calls: Vec<_> = (0..2000).map(|k| (k, tokio::spawn(get(k)))).collect();
    let mut answered = BTreeMap::new(); // key -> answer; a caller that gave up has none
    for (k, c) in calls {
        answered.extend(c.await.unwrap().ok().and_then(Result::ok).map(|v| (k, v)));
    }
    println!("{} of 2000 gets answered", answered.len());
    let ok = answered.len() == 1600 && *seen.lock().unwrap() == answered;
    assert!(ok, "wrong answers, or the server saw a get given up");
}
