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
///
/// Every clause after the ratios states a measurement of these two rows and is printed only
/// when the rows show it (the tests in `tests/e2e_loopback.rs` check each condition); a
/// clause about how the client works says so ("by design").
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
    let when = if n_t == o_t {
        "Ours finished in the same time".to_string()
    } else {
        let diff = if later { o_t - n_t } else { n_t - o_t };
        format!(
            "Ours finished {} {}",
            secs(diff, 2),
            if later { "later" } else { "sooner" }
        )
    };
    let why = match (sc, later) {
        (Scenario::Disk, true) => disk_later(&when, naive, ours),
        (Scenario::L0, true) => l0_later(&when, naive, ours),
        (Scenario::Reads, false) if ops_per_rpc(ours) > ops_per_rpc(naive) => format!(
            "{when}: the server's cost is per RPC, and ours carries {:.1} reads in each \
             (naive: {:.1}).",
            ops_per_rpc(ours),
            ops_per_rpc(naive)
        ),
        _ => format!("{when}."),
    };
    out.push(' ');
    out += &why;
    if sc == Scenario::Failover {
        if let Some(note) = failover_note(naive, ours) {
            out.push(' ');
            out += &note;
        }
    }
    if let Some(peak) = peak_note(naive, ours) {
        out.push(' ');
        out += &peak;
    }
    Some(out)
}

/// Why ours finished the disk scenario later, from the tablet server's records: only the
/// clauses the two rows bear out.
fn disk_later(when: &str, naive: &Row, ours: &Row) -> String {
    let (Some(n), Some(o)) = (naive.tablet, ours.tablet) else {
        return format!("{when}.");
    };
    let lock = o.disk_lock;
    // Ours got nothing through before the lock lifted: it waited the outage out.
    let waited = n.disk_lock == lock && o.first_accept.is_some_and(|d| d >= lock);
    if !waited {
        return format!("{when}.");
    }
    let mut out = format!(
        "{when} because it waits out the outage: the server is write-locked for its first {} \
         whatever the client does",
        secs(lock, 2)
    );
    if n.overloaded == lock && o.overloaded == lock {
        out += " (hence the same overloaded time)";
    }
    out.push('.');
    let at = |d: Duration| secs(d, 2);
    if naive.refused > ours.refused {
        let _ = write!(
            out,
            " The naive client re-sends into the lock ({} refused RPCs against {})",
            naive.refused, ours.refused
        );
        match n.first_accept {
            Some(first) if first >= lock => {
                let _ = write!(
                    out,
                    " and got its first write through at {}, {} after the lock lifted.",
                    at(first),
                    millis(first - lock)
                );
            }
            _ => out.push('.'),
        }
    }
    let _ = write!(
        out,
        " Ours (by design) holds each bucket's writes on that bucket's jittered disk backoff and \
         sends again only when the gate reopens, not knowing when the lock ends"
    );
    match (o.first_accept, o.last_bucket_first_accept) {
        (Some(first), Some(last)) => {
            let _ = write!(
                out,
                ": its buckets got their first write through between {} and {}.",
                at(first),
                at(last)
            );
        }
        _ => out.push('.'),
    }
    out
}

/// Why ours finished the l0 scenario later: the pressure it slowed down on, if the server
/// reported any, and the rejections it did not re-send, if it had fewer.
fn l0_later(when: &str, naive: &Row, ours: &Row) -> String {
    let mut reasons = Vec::new();
    if let Some(o) = ours.tablet {
        if o.peak_l0 >= u64::from(o.pressure_from) {
            reasons.push(format!(
                "it slowed down on the pressure the server piggybacks on accepted writes from L0 \
                 {} on (ours reached {})",
                o.pressure_from, o.peak_l0
            ));
        }
    }
    if naive.refused > ours.refused {
        reasons.push(format!(
            "it did not re-send every rejection ({} refused RPCs against {})",
            naive.refused, ours.refused
        ));
    }
    if reasons.is_empty() {
        format!("{when}.")
    } else {
        format!("{when}: {}.", reasons.join("; "))
    }
}

/// What the coordinators counted of the writes each client got executed twice, and what
/// ours handed back to the user; `None` without execution counts.
fn failover_note(naive: &Row, ours: &Row) -> Option<String> {
    let (n2, o1, o2) = (naive.twice?, ours.once?, ours.twice?);
    let mut out = String::new();
    if n2 > 0 {
        let _ = write!(
            out,
            "The naive client re-sent writes that had already run: {n2} ran twice. "
        );
    }
    let o_never = ours.ops.saturating_sub(o1 + o2);
    let _ = write!(
        out,
        "Ours ran {o1} writes exactly once and {o2} twice ({o_never} never)"
    );
    if ours.failed > 0 {
        let _ = write!(
            out,
            "; it handed {} writes back to the user as errors (by design: a write whose \
             response was lost may have run, so it is not re-sent)",
            ours.failed
        );
    }
    if ours.abandoned > 0 {
        let _ = write!(out, "; {} were unfinished at the deadline", ours.abandoned);
    }
    out.push('.');
    Some(out)
}

/// What ours' peak L0 says, for a tablet scenario (`None` otherwise): the two peaks, and when
/// ours' is above naive's or reaches the slowdown trigger, why, from the server's records.
/// Each clause is printed only when the records show it.
pub fn peak_note(naive: &Row, ours: &Row) -> Option<String> {
    let (n, o) = (naive.tablet?, ours.tablet?);
    let (np, op, trigger) = (n.peak_l0, o.peak_l0, u64::from(o.slowdown_trigger));
    let mut out = format!("Peak L0 {np} → {op} (slowdown trigger {trigger}).");
    let rpc = o.peak_rpc;
    if op >= trigger {
        let _ = write!(
            out,
            " Ours reached {op}{}: the server admitted an RPC of {} writes ({} bytes) at L0 \
             {}{}, and its bytes flushed {} L0 file(s) at once (memtable: {} bytes).",
            if op > trigger {
                ", above the trigger"
            } else {
                ", the trigger"
            },
            rpc.ops,
            rpc.bytes,
            rpc.l0_before,
            if rpc.l0_before < trigger {
                ", below the trigger"
            } else {
                ""
            },
            rpc.files_added,
            o.flush_bytes,
        );
        if rpc.files_added >= 2
            && rpc.l0_before < trigger
            && rpc.l0_before + rpc.files_added > trigger
        {
            out += " Admission is per RPC, so an RPC that flushes several files at once steps \
                    over the trigger, which an RPC flushing one file cannot.";
        }
        let _ = write!(
            out,
            " {} of ours' accepted RPCs flushed two or more files.",
            o.multi_file_rpcs
        );
    } else if op > np {
        out += " Ours peaked higher, below the trigger";
        if ours.elapsed < naive.elapsed {
            let _ = write!(
                out,
                ": it delivered its writes in {} against naive's {}, faster than compaction \
                 drained them",
                secs(ours.elapsed, 2),
                secs(naive.elapsed, 2),
            );
        }
        if op < u64::from(o.pressure_from) {
            let _ = write!(
                out,
                "{} the server reports no pressure below L0 {}, so no pressure signal slowed it",
                if ours.elapsed < naive.elapsed {
                    ", and"
                } else {
                    ";"
                },
                o.pressure_from
            );
        }
        out.push('.');
    }
    Some(out)
}
