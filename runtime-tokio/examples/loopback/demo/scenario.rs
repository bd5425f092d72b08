//! Scenarios, their parameters, the command line and the printed table.

use super::clients::{self, ClientStats, Op};
use super::server::{
    Coordinators, Counters, Server, Service, Shard, Tablet, TabletConfig, TabletReport, lock,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant as StdInstant};
use throttle_tokio::PressureConfig;
use tokio::sync::mpsc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Tablet server refuses every write (DISK_WRITE_LOCKED) during a protection window.
    Disk,
    /// Tablet server whose L0 file count grows faster than compaction drains it.
    L0,
    /// Shard server with a fixed cost per read RPC, under a burst of reads.
    Reads,
    /// Two coordinators swapping leadership under a stream of admin writes.
    Failover,
}

impl Scenario {
    pub const ALL: [Scenario; 4] = [
        Scenario::Disk,
        Scenario::L0,
        Scenario::Reads,
        Scenario::Failover,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Disk => "disk",
            Scenario::L0 => "l0",
            Scenario::Reads => "reads",
            Scenario::Failover => "failover",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    Naive,
    Ours,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Client::Naive => "naive",
            Client::Ours => "ours",
        }
    }
}

/// Everything a run needs; [`Params::new`] gives the defaults for a scenario and scale.
#[derive(Clone, Debug)]
pub struct Params {
    pub scenario: Scenario,
    /// Operations submitted.
    pub ops: usize,
    /// Operations submitted per millisecond (open loop).
    pub per_ms: usize,
    /// Buckets or shards the operations spread over.
    pub shards: u32,
    /// Value bytes per write.
    pub value_len: u32,
    /// Disk-protection window (disk scenario).
    pub protect: Duration,
    /// Bytes per L0 file and the compaction rate (tablet scenarios).
    pub flush_bytes: u64,
    pub compact_every: Duration,
    /// Cost of one read RPC (reads) or one admin write (failover).
    pub rpc_cost: Duration,
    /// Leadership swap period and concurrent callers (failover).
    pub swap_every: Duration,
    pub tasks: usize,
    /// Hard stop of one run.
    pub deadline: Duration,
    pub seed: u64,
}

impl Params {
    pub fn new(scenario: Scenario, scale: f64, seed: u64) -> Params {
        let n = |base: f64| ((base * scale).round() as usize).max(1);
        let base = Params {
            scenario,
            ops: 0,
            per_ms: 1,
            shards: 4,
            value_len: 100,
            protect: Duration::ZERO,
            flush_bytes: 64 << 10,
            compact_every: Duration::from_millis(10),
            rpc_cost: Duration::ZERO,
            swap_every: Duration::from_millis(200),
            tasks: 8,
            deadline: Duration::from_secs(20),
            seed,
        };
        match scenario {
            Scenario::Disk => Params {
                ops: n(2_000.0),
                per_ms: 20,
                protect: Duration::from_secs(2),
                ..base
            },
            Scenario::L0 => Params {
                ops: n(40_000.0),
                per_ms: 40,
                shards: 2,
                flush_bytes: 64 << 10,
                compact_every: Duration::from_millis(40),
                ..base
            },
            Scenario::Reads => Params {
                ops: n(2_000.0),
                per_ms: 2,
                rpc_cost: Duration::from_millis(1),
                ..base
            },
            Scenario::Failover => Params {
                ops: n(1_000.0),
                per_ms: 1,
                rpc_cost: Duration::from_millis(2),
                ..base
            },
        }
    }
}

/// One line of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub scenario: Scenario,
    pub client: Client,
    pub ops: usize,
    /// RPCs, bytes and operations the server(s) received.
    pub rpcs: u64,
    pub bytes: u64,
    pub ops_received: u64,
    /// RPCs the server(s) answered with a refusal (disk locked, backpressure, not leader).
    pub refused: u64,
    /// Time the server(s) spent serving requests.
    pub busy: Duration,
    /// What the tablet server measured (tablet scenarios): overloaded time, peak L0, …
    pub tablet: Option<TabletReport>,
    pub elapsed: Duration,
    pub completed: usize,
    /// Errors surfaced to the user (for a write: outcome unknown).
    pub failed: usize,
    /// Unfinished at the deadline.
    pub abandoned: usize,
    pub p99: Duration,
    /// Writes executed exactly once / more than once (`None` for reads).
    pub once: Option<usize>,
    pub twice: Option<usize>,
}

/// Feeds `p.ops` operations at `p.per_ms` per millisecond.
fn feed(p: &Params) -> mpsc::UnboundedReceiver<Op> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (total, per_ms, shards, len) = (p.ops, p.per_ms.max(1), p.shards.max(1), p.value_len);
    let len = if p.scenario == Scenario::Reads {
        0
    } else {
        len
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut id = 0u64;
        while (id as usize) < total {
            tick.tick().await;
            for _ in 0..per_ms {
                if id as usize >= total {
                    break;
                }
                let op = Op {
                    id,
                    shard: (id % u64::from(shards)) as u32,
                    len,
                    submitted: StdInstant::now(),
                };
                if tx.send(op).is_err() {
                    return;
                }
                id += 1;
            }
        }
    });
    rx
}

/// The tablet server's pressure in both tablet scenarios (disk and l0): Fluss's server as
/// landed by PR #3463 (`Tf = 8`, `Tr = 20`). It pairs with our client's gate,
/// [`clients::gate_config`] (the landed `max_throttle · p²` curve, 3000 ms): one upstream
/// pairing, client and server.
pub const TABLET_PRESSURE: PressureConfig = PressureConfig::fluss_landed();

/// Runs one scenario with one client against fresh servers on 127.0.0.1.
pub async fn run(p: &Params, client: Client) -> std::io::Result<Row> {
    let start = StdInstant::now();
    let deadline = start + p.deadline;
    let mut tablet_report = None;
    let (stats, counters): (ClientStats, Arc<Counters>) = match p.scenario {
        Scenario::Disk | Scenario::L0 => {
            let pressure = TABLET_PRESSURE;
            let tablet = Tablet::new(
                TabletConfig {
                    protect: p.protect,
                    flush_bytes: p.flush_bytes,
                    compact_every: p.compact_every,
                    pressure,
                },
                p.ops,
            );
            let server = Server::start(Service::Tablet(tablet.clone())).await?;
            let ops = feed(p);
            let stats = match client {
                Client::Naive => clients::naive_data(server.addr, true, ops, deadline).await,
                Client::Ours => clients::ours_data(server.addr, true, ops, deadline, p.seed).await,
            };
            server.stop();
            tablet_report = Some(tablet.report(StdInstant::now()));
            (stats, tablet.counters.clone())
        }
        Scenario::Reads => {
            let shard = Arc::new(Shard {
                rpc_cost: p.rpc_cost,
                counters: Counters::new(0),
            });
            let server = Server::start(Service::Shard(shard.clone())).await?;
            let ops = feed(p);
            let stats = match client {
                Client::Naive => clients::naive_data(server.addr, false, ops, deadline).await,
                Client::Ours => clients::ours_data(server.addr, false, ops, deadline, p.seed).await,
            };
            server.stop();
            (stats, shard.counters.clone())
        }
        Scenario::Failover => {
            let coords = Arc::new(Coordinators {
                leader: AtomicUsize::new(0),
                epoch: AtomicU64::new(0),
                ports: Default::default(),
                write_cost: p.rpc_cost,
                counters: Counters::new(p.ops),
            });
            let a = Server::start(Service::Coordinator(coords.clone(), 0)).await?;
            let b = Server::start(Service::Coordinator(coords.clone(), 1)).await?;
            *lock(&coords.ports) = [a.addr.port(), b.addr.port()];
            let swapper = {
                let (coords, every) = (coords.clone(), p.swap_every.max(Duration::from_millis(1)));
                let swaps = p.deadline.as_millis() / every.as_millis();
                tokio::spawn(async move {
                    for _ in 0..swaps {
                        tokio::time::sleep(every).await;
                        coords.swap();
                    }
                })
            };
            let ops = feed(p);
            let stats = match client {
                Client::Naive => clients::naive_admin(a.addr, p.tasks, ops, deadline).await,
                Client::Ours => {
                    clients::ours_admin([a.addr, b.addr], a.addr, p.tasks, ops, deadline, p.seed)
                        .await
                }
            };
            swapper.abort();
            a.stop();
            b.stop();
            (stats, coords.counters.clone())
        }
    };
    let elapsed = start.elapsed();
    let mut lat = stats.latencies;
    lat.sort_unstable();
    let p99 = if lat.is_empty() {
        Duration::ZERO
    } else {
        lat[(lat.len() * 99).div_ceil(100).saturating_sub(1)]
    };
    let writes = p.scenario != Scenario::Reads;
    let (once, twice, _) = counters.execution();
    Ok(Row {
        scenario: p.scenario,
        client,
        ops: p.ops,
        rpcs: counters.rpcs.load(Ordering::Relaxed),
        bytes: counters.bytes.load(Ordering::Relaxed),
        ops_received: counters.ops.load(Ordering::Relaxed),
        refused: counters.refused.load(Ordering::Relaxed),
        busy: counters.busy(),
        tablet: tablet_report,
        elapsed,
        completed: lat.len(),
        failed: stats.failed,
        abandoned: stats.abandoned,
        p99,
        once: writes.then_some(once),
        twice: writes.then_some(twice),
    })
}

pub const USAGE: &str = "\
usage: loopback [--scenario all|disk|l0|reads|failover] [--scale X] [--seed N]

  --scenario S   which scenario to run (default: all)
  --scale X      multiply every scenario's operation count by X, 0 < X <= 100 (default: 1)
  --seed N       seed of our client's jitter (default: 1)
  -h, --help     print this help

Runs each scenario against fresh servers on 127.0.0.1, once with a naive client and once with
ours, then prints a Markdown table of what the servers counted, its legend, and one verdict
line per scenario (naive -> ours). See docs/demo.md.";

/// The command that reproduces a run with `opts` (every option spelled out), with `--release`
/// if `release` (the binary's own profile: `main` passes `!cfg!(debug_assertions)`).
pub fn command_line(opts: &Options, release: bool) -> String {
    let scenario = if opts.scenarios == Scenario::ALL {
        "all"
    } else {
        opts.scenarios.first().map_or("all", |s| s.name())
    };
    format!(
        "cargo run{} -p throttle-tokio --example loopback -- --scenario {scenario} \
         --scale {} --seed {}",
        if release { " --release" } else { "" },
        opts.scale,
        opts.seed
    )
}

/// The first lines of the output, as two Markdown paragraphs (each followed by a blank
/// line): the run's settings, then the [`command_line`] that reproduces it.
pub fn header(opts: &Options, release: bool) -> String {
    format!(
        "loopback demo: scale {}, seed {}; servers on 127.0.0.1, one fresh server per run\n\n\
         command: {}\n",
        opts.scale,
        opts.seed,
        command_line(opts, release)
    )
}

/// Parsed command line; `Ok(None)` means help was asked for (`-h` or `--help` anywhere).
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    pub scenarios: Vec<Scenario>,
    pub scale: f64,
    pub seed: u64,
}

pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Option<Options>, String> {
    let mut opts = Options {
        scenarios: Scenario::ALL.to_vec(),
        scale: 1.0,
        seed: 1,
    };
    let args: Vec<String> = args.into_iter().collect();
    // Help wins wherever it stands, as in the `sim` binary.
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(None);
    }
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (flag.clone(), None),
        };
        match name.as_str() {
            "--scenario" | "--scale" | "--seed" => {
                let Some(value) = inline.or_else(|| it.next()) else {
                    return Err(format!("{name} needs a value"));
                };
                match name.as_str() {
                    "--scenario" => {
                        opts.scenarios = match value.as_str() {
                            "all" => Scenario::ALL.to_vec(),
                            v => match Scenario::ALL.iter().find(|s| s.name() == v) {
                                Some(s) => vec![*s],
                                None => {
                                    return Err(format!(
                                        "unknown scenario '{v}' (expected all, disk, l0, reads or failover)"
                                    ));
                                }
                            },
                        }
                    }
                    "--scale" => {
                        opts.scale = match value.parse::<f64>() {
                            Ok(x) if x > 0.0 && x <= 100.0 => x,
                            _ => {
                                return Err(format!(
                                    "--scale must be a number in (0, 100], got '{value}'"
                                ));
                            }
                        }
                    }
                    _ => {
                        opts.seed = value.parse::<u64>().map_err(|_| {
                            format!("--seed must be an unsigned integer, got '{value}'")
                        })?
                    }
                }
            }
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    Ok(Some(opts))
}
