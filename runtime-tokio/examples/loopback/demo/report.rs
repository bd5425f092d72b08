//! The printed report: the table (GitHub-flavoured Markdown), the legend of its columns, and
//! one verdict line per scenario comparing the naive client with ours.

use super::scenario::{Client, Row, Scenario};
use std::fmt::Write as _;
use std::time::Duration;

/// One column of the table: its header, whether it is right-aligned, and its legend.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub numeric: bool,
    pub legend: &'static str,
}

/// Number of columns of the table.
pub const NCOLS: usize = 14;

/// The table's columns, in order, each with the legend printed under the table.
pub const COLUMNS: [Column; NCOLS] = [
    Column {
        name: "scenario",
        numeric: false,
        legend: "the scenario (disk, l0, reads, failover; see docs/demo.md)",
    },
    Column {
        name: "client",
        numeric: false,
        legend: "`naive` (re-sends at once, one RPC per operation) or `ours` (throttle's drivers)",
    },
    Column {
        name: "RPCs",
        numeric: true,
        legend: "requests the server(s) received, counted by the server",
    },
    Column {
        name: "refused",
        numeric: true,
        legend: "of those, answered with a refusal before executing: disk write locked, \
                 storage backpressure (L0 at the slowdown trigger) or not leader",
    },
    Column {
        name: "bytes",
        numeric: true,
        legend: "bytes the server(s) received, frames with their length prefix",
    },
    Column {
        name: "ops/RPC",
        numeric: true,
        legend: "operations received per RPC (server count); 1.0 = no batching",
    },
    Column {
        name: "busy",
        numeric: true,
        legend: "time the server(s) spent serving requests, summed over connections (from a \
                 request read to its response flushed): the load the client caused",
    },
    Column {
        name: "overloaded",
        numeric: true,
        legend: "tablet server: time it refused writes to protect itself, i.e. disk write \
                 locked, or L0 at or above the slowdown trigger until compaction brought it \
                 back below; `-` for the other servers",
    },
    Column {
        name: "peak L0",
        numeric: true,
        legend: "tablet server: highest L0 file count reached (slowdown trigger: 20); `-` \
                 for the other servers",
    },
    Column {
        name: "time",
        numeric: true,
        legend: "wall time of the run, from the servers' start to the last operation \
                 finished (client harness)",
    },
    Column {
        name: "p99",
        numeric: true,
        legend: "99th percentile latency of the completed operations, from submission to \
                 success (client harness)",
    },
    Column {
        name: "done/ops",
        numeric: true,
        legend: "operations that succeeded / operations submitted",
    },
    Column {
        name: "failed",
        numeric: true,
        legend: "errors handed to the user (an admin write that timed out: outcome unknown) \
                 plus operations unfinished at the 20 s deadline",
    },
    Column {
        name: "exec 2x",
        numeric: true,
        legend: "writes the server executed more than once (a re-send of a write that had \
                 already run); `-` for reads",
    },
];

fn secs(d: Duration, places: usize) -> String {
    format!("{:.*}s", places, d.as_secs_f64())
}

fn millis(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1e3)
}

/// Operations received per RPC (0 when nothing was received).
pub fn ops_per_rpc(r: &Row) -> f64 {
    if r.rpcs == 0 {
        0.0
    } else {
        r.ops_received as f64 / r.rpcs as f64
    }
}

/// The table cells of one row, in [`COLUMNS`] order.
pub fn cells(r: &Row) -> [String; NCOLS] {
    let dash = || "-".to_string();
    [
        r.scenario.name().to_string(),
        r.client.name().to_string(),
        r.rpcs.to_string(),
        r.refused.to_string(),
        r.bytes.to_string(),
        format!("{:.1}", ops_per_rpc(r)),
        millis(r.busy),
        r.tablet.map_or_else(dash, |t| secs(t.overloaded, 2)),
        r.tablet.map_or_else(dash, |t| t.peak_l0.to_string()),
        secs(r.elapsed, 2),
        millis(r.p99),
        format!("{}/{}", r.completed, r.ops),
        (r.failed + r.abandoned).to_string(),
        r.twice.map_or_else(dash, |t| t.to_string()),
    ]
}

/// A cell as Markdown: `|` escaped, line breaks flattened.
fn escape(cell: &str) -> String {
    cell.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// A GitHub-flavoured Markdown table: a header row, a `|---|` separator (`---:` for numeric
/// columns) and one line per row, every line with the same number of cells (the array type
/// fixes it), padded so that the columns also line up as plain text.
pub fn markdown_table<const N: usize>(columns: &[Column; N], rows: &[[String; N]]) -> String {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|r| r.each_ref().map(|c| escape(c)))
        .collect();
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].chars().count())
            .chain([columns[i].name.chars().count(), 3])
            .max()
            .unwrap_or(3)
    };
    let widths: Vec<usize> = (0..N).map(width).collect();
    let line = |cells: &mut dyn Iterator<Item = String>| {
        let mut s = String::from("|");
        for c in cells {
            let _ = write!(s, " {c} |");
        }
        s
    };
    let pad = |i: usize, c: &str| {
        if columns[i].numeric {
            format!("{c:>w$}", w = widths[i])
        } else {
            format!("{c:<w$}", w = widths[i])
        }
    };
    let mut out = line(&mut (0..N).map(|i| pad(i, columns[i].name)));
    out.push('\n');
    out += &line(&mut (0..N).map(|i| {
        let dashes = "-".repeat(widths[i] - usize::from(columns[i].numeric));
        if columns[i].numeric {
            format!("{dashes}:")
        } else {
            dashes
        }
    }));
    for r in &rows {
        out.push('\n');
        out += &line(&mut (0..N).map(|i| pad(i, &r[i])));
    }
    out
}

/// The table of `rows`.
pub fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; NCOLS]> = rows.iter().map(cells).collect();
    markdown_table(&COLUMNS, &cells)
}

/// The legend: one Markdown list item per column.
pub fn legend() -> String {
    let mut out = String::from("Columns:\n");
    for c in &COLUMNS {
        let _ = writeln!(out, "- `{}`: {}", c.name, c.legend);
    }
    out
}

/// How `ours` compares with `naive` for a quantity where less is better: `"1995× fewer"`,
/// `"1.3× more"`, `"same"`, `"none"` (ours is zero, naive is not). `fewer` is the word for
/// "less of it" (`"fewer"` for counts, `"less"` for time).
pub fn compare(naive: f64, ours: f64, fewer: &str) -> String {
    let valid = |x: f64| x.is_finite() && x >= 0.0;
    if !valid(naive) || !valid(ours) {
        return "n/a".to_string();
    }
    let factor = |f: f64| {
        if f >= 10.0 {
            format!("{f:.0}×")
        } else {
            format!("{f:.1}×")
        }
    };
    if naive == ours {
        "same".to_string()
    } else if ours == 0.0 {
        "none".to_string()
    } else if naive == 0.0 {
        "more".to_string()
    } else if ours < naive {
        format!("{} {fewer}", factor(naive / ours))
    } else {
        format!("{} more", factor(ours / naive))
    }
}

fn counted(what: &str, naive: u64, ours: u64) -> String {
    format!(
        "{what} {} ({naive} → {ours})",
        compare(naive as f64, ours as f64, "fewer")
    )
}

fn timed(what: &str, naive: Duration, ours: Duration, show: fn(Duration) -> String) -> String {
    format!(
        "{what} {} ({} → {})",
        compare(naive.as_secs_f64(), ours.as_secs_f64(), "less"),
        show(naive),
        show(ours)
    )
}

/// The verdict on one scenario: what the server saw from the naive client and from ours
/// (ratios first), then why ours finished later or sooner, and what its peak L0 means.
/// `None` unless `naive` and `ours` are the two clients of one scenario.
pub fn verdict(naive: &Row, ours: &Row) -> Option<String> {
    if naive.client != Client::Naive || ours.client != Client::Ours {
        return None;
    }
    if naive.scenario != ours.scenario {
        return None;
    }
    let sc = ours.scenario;
    let mut parts = vec![
        counted("RPCs", naive.rpcs, ours.rpcs),
        counted("bytes", naive.bytes, ours.bytes),
        timed("server busy", naive.busy, ours.busy, millis),
    ];
    if let (Some(n), Some(o)) = (naive.tablet, ours.tablet) {
        parts.push(timed("overloaded", n.overloaded, o.overloaded, |d| {
            secs(d, 2)
        }));
    }
    if let (Some(n), Some(o)) = (naive.twice, ours.twice) {
        parts.push(format!("writes executed twice {n} → {o}"));
    }
    let mut out = format!("- **{}** (naive → ours): {}.", sc.name(), parts.join(", "));

    let (n_t, o_t) = (naive.elapsed, ours.elapsed);
    let later = o_t > n_t;
    let diff = if later { o_t - n_t } else { n_t - o_t };
    let when = format!(
        "Ours finished {} {}",
        secs(diff, 2),
        if later { "later" } else { "sooner" }
    );
    let why = match (sc, later) {
        (Scenario::Disk, true) => {
            let at = |d: Option<Duration>| d.map_or_else(|| "never".into(), |d| secs(d, 2));
            let first = |r: &Row| r.tablet.and_then(|t| t.first_accept);
            let last = |r: &Row| r.tablet.and_then(|t| t.last_bucket_first_accept);
            format!(
                "{when} because it waits out the outage: the server is write-locked for its \
                 first {} whatever the client does (hence the same overloaded time). The naive \
                 client re-sends into the lock ({} refused RPCs against {}) and got its first \
                 write through at {}, the moment the lock lifted; ours holds each bucket's \
                 writes on that bucket's jittered disk backoff and sends again only when the \
                 gate reopens, not knowing when the lock ends: its buckets got their first \
                 write through between {} and {}.",
                naive
                    .tablet
                    .map_or_else(|| "seconds".into(), |t| secs(t.disk_lock, 2)),
                naive.refused,
                ours.refused,
                at(first(naive)),
                at(first(ours)),
                at(last(ours)),
            )
        }
        (Scenario::L0, true) => format!(
            "{when}: it slows down on the pressure the server piggybacks on each accepted \
             write instead of re-sending every rejection ({} refused RPCs against {}); the \
             landed curve is tuned for RocksDB compactions, slower than this model's steady \
             drain.",
            naive.refused, ours.refused
        ),
        (Scenario::Reads, false) => format!(
            "{when}: the server's cost is per RPC, and ours carries {:.1} reads in each.",
            ops_per_rpc(ours)
        ),
        _ => format!("{when}."),
    };
    out.push(' ');
    out += &why;
    if sc == Scenario::Failover
        && let (Some(n2), Some(o1), Some(o2)) = (naive.twice, ours.once, ours.twice)
    {
        let o_never = ours.ops.saturating_sub(o1 + o2);
        let _ = write!(
            out,
            " The naive client re-sent writes whose response was lost: {n2} ran twice. Ours \
             ran {o1} writes exactly once and {o2} twice ({o_never} never); it handed {} \
             writes back to the user as errors (a lost response: outcome unknown) instead of \
             guessing.",
            ours.failed + ours.abandoned
        );
    }
    if let Some(peak) = peak_note(naive, ours) {
        out.push(' ');
        out += &peak;
    }
    Some(out)
}

/// What ours' peak L0 says, for a tablet scenario (`None` otherwise): the two peaks, and when
/// ours' is above naive's or reaches the slowdown trigger, why, from the server's records.
pub fn peak_note(naive: &Row, ours: &Row) -> Option<String> {
    let (n, o) = (naive.tablet?, ours.tablet?);
    let (np, op, trigger) = (n.peak_l0, o.peak_l0, u64::from(o.slowdown_trigger));
    let mut out = format!("Peak L0 {np} → {op} (slowdown trigger {trigger}).");
    let rpc = o.peak_rpc;
    if op >= trigger {
        let _ = write!(
            out,
            " Ours reached {op}{}: the server admitted an RPC of {} writes ({} bytes) at L0 \
             {}, below the trigger, and its bytes flushed {} L0 file(s) at once (memtable: {} \
             bytes). Admission is per RPC, so a batch bigger than a memtable can step over the \
             trigger, which a one-write RPC cannot; {} of ours' accepted RPCs flushed two or \
             more files.",
            if op > trigger {
                ", above the trigger"
            } else {
                ", the trigger"
            },
            rpc.ops,
            rpc.bytes,
            rpc.l0_before,
            rpc.files_added,
            o.flush_bytes,
            o.multi_file_rpcs
        );
    } else if op > np {
        let _ = write!(
            out,
            " Ours peaked higher, below the trigger: it delivered its writes in {} against \
             naive's {}, faster than compaction drained them{}.",
            secs(ours.elapsed, 2),
            secs(naive.elapsed, 2),
            if op < u64::from(o.pressure_from) {
                format!(
                    ", and the server reports no pressure below L0 {}, so nothing slowed it",
                    o.pressure_from
                )
            } else {
                String::new()
            }
        );
    }
    Some(out)
}
