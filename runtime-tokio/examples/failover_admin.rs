//! Admin calls across a coordinator failover, against an in-process pair of fake coordinators.
//!
//! Two coordinators listen on 127.0.0.1. Each answers `create <name>` with `ok` when it is the
//! leader and `not_leader` otherwise, and `leader` with the leader's index. The client caches
//! the leader; then the leadership moves and eight admin writes go to the old one at once.
//! `FailoverExecutor` classifies `not_leader` as refresh + retry (the write was refused before
//! it ran), runs one coalesced refresh for all eight, and retries each once on the new leader.
//! Exits non-zero unless all eight succeed with one refresh and sixteen sends.
//!
//! `cargo run -p throttle-tokio --example failover_admin`

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use throttle_tokio::TokioRuntime;
use throttle_tokio::failover::{
    AdminWriteGateway, CallConfig, ErrorKind, FinagleBudget, HasErrorKind,
};
use throttle_tokio::sync::FailoverExecutor;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// One fake coordinator: answers one line per connection, knowing who leads. A refusal waits
/// until eight have been asked for, so the eight writes fail at once, as in a real failover.
async fn coordinator(me: usize, listener: TcpListener, leader: Arc<AtomicUsize>) {
    let at_once = Arc::new(tokio::sync::Barrier::new(8));
    while let Ok((stream, _)) = listener.accept().await {
        let (leader, at_once) = (Arc::clone(&leader), Arc::clone(&at_once));
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let _ = BufReader::new(read).read_line(&mut line).await;
            let leads = leader.load(Ordering::SeqCst);
            let answer = match line.trim() {
                "leader" => format!("{leads}\n"),
                _ if leads == me => "ok\n".to_string(),
                _ => {
                    at_once.wait().await;
                    "not_leader\n".to_string()
                }
            };
            let _ = write.write_all(answer.as_bytes()).await;
        });
    }
}

/// An admin call's failure, mapped onto the failover presets through its kind.
#[derive(Debug, Clone, PartialEq)]
enum AdminError {
    NotLeader,
    Network(String),
}

impl HasErrorKind for AdminError {
    fn error_kind(&self) -> ErrorKind {
        match self {
            AdminError::NotLeader => ErrorKind::NotLeader,
            AdminError::Network(_) => ErrorKind::Retriable,
        }
    }
}

async fn ask(addr: SocketAddr, request: &str) -> Result<String, AdminError> {
    let net = |e: std::io::Error| AdminError::Network(e.to_string());
    let mut stream = TcpStream::connect(addr).await.map_err(net)?;
    stream
        .write_all(format!("{request}\n").as_bytes())
        .await
        .map_err(net)?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .await
        .map_err(net)?;
    Ok(line.trim().to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("usage: failover_admin\n\nEight admin writes across a coordinator failover.");
        return std::process::ExitCode::SUCCESS;
    }
    let leader = Arc::new(AtomicUsize::new(0));
    let mut addrs = Vec::new();
    for me in 0..2 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        addrs.push(listener.local_addr().expect("a local address"));
        tokio::spawn(coordinator(me, listener, Arc::clone(&leader)));
    }
    let cached = Arc::new(Mutex::new(0usize)); // the client believes coordinator 0 leads
    let budget = FinagleBudget::default(); // 100 retries in reserve: room for all eight
    let fx = FailoverExecutor::new(
        TokioRuntime::new(),
        AdminWriteGateway,
        budget,
        CallConfig::default(),
    )
    .expect("a valid config");

    leader.store(1, Ordering::SeqCst); // the failover
    let sends = Arc::new(AtomicUsize::new(0));
    let mut writes = Vec::new();
    for table in 0..8 {
        let (fx, addrs, cached, sends) = (
            fx.clone(),
            addrs.clone(),
            Arc::clone(&cached),
            Arc::clone(&sends),
        );
        writes.push(tokio::spawn(async move {
            let send = || {
                sends.fetch_add(1, Ordering::SeqCst);
                let addr = addrs[*cached.lock().unwrap()];
                async move {
                    match ask(addr, &format!("create t{table}")).await?.as_str() {
                        "ok" => Ok(()),
                        _ => Err(AdminError::NotLeader),
                    }
                }
            };
            let refresh = || {
                let (addr, cached) = (addrs[0], Arc::clone(&cached));
                async move {
                    let Ok(Ok(leads)) = ask(addr, "leader").await.map(|l| l.parse::<usize>())
                    else {
                        return false;
                    };
                    *cached.lock().unwrap() = leads.min(1);
                    true
                }
            };
            fx.call(send, refresh).await
        }));
    }
    let mut ok = 0;
    for w in writes {
        match w.await.expect("the write task ran") {
            Ok(()) => ok += 1,
            Err(e) => eprintln!("admin write failed: {e}"),
        }
    }
    fx.close();
    fx.closed().await;
    let (sends, refreshes) = (sends.load(Ordering::SeqCst), fx.refreshes_started());
    println!("{ok}/8 admin writes succeeded: {sends} sends, {refreshes} refresh(es)");
    if ok == 8 && sends == 16 && refreshes == 1 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
