//! End to end over real TCP on 127.0.0.1: the loopback demo's disk-protection scenario at
//! small scale, judged by the server's own counters; the tablet server's own measurements;
//! the report (Markdown table, legend, verdict); and the demo's command line.

#[path = "../examples/loopback/demo/mod.rs"]
mod demo;

use demo::clients;
use demo::proto::{Request, Status};
use demo::report::{self, COLUMNS};
use demo::scenario::{self, Client, Params, Row, Scenario};
use demo::server::{Tablet, TabletConfig, TabletReport};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use throttle_tokio::{PressureConfig, ThrottleCurve};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_protection_ours_sends_100x_fewer_rpcs_and_every_write_executes_once() {
    // 500 writes over 4 buckets; the server refuses every write for the first 1.5 s.
    let mut p = Params::new(Scenario::Disk, 0.25, 7);
    p.protect = Duration::from_millis(1_500);
    let naive = scenario::run(&p, Client::Naive).await.expect("naive run");
    let ours = scenario::run(&p, Client::Ours).await.expect("our run");
    println!("{}", report::table(&[naive.clone(), ours.clone()]));
    println!("{}", report::verdict(&naive, &ours).expect("a verdict"));

    assert!(ours.rpcs > 0, "ours sent nothing");
    assert!(
        ours.rpcs.saturating_mul(100) <= naive.rpcs,
        "server received {} RPCs from ours and {} from the naive client: less than 100x apart",
        ours.rpcs,
        naive.rpcs
    );
    for row in [&naive, &ours] {
        let who = row.client.name();
        assert_eq!(row.completed, p.ops, "{who}: every write completes");
        assert_eq!(
            row.failed + row.abandoned,
            0,
            "{who}: nothing failed or left over"
        );
        assert_eq!(
            row.once,
            Some(p.ops),
            "{who}: the server executed every write once"
        );
        assert_eq!(row.twice, Some(0), "{who}: no write executed twice");
    }
    // Ours waits out the window instead of hammering it: it cannot finish before it ends.
    assert!(ours.elapsed >= p.protect);
    // The server measured the same overload for both (the lock is its own window; 500
    // writes never make an L0 file), less work serving ours, and no write before the lock
    // lifted.
    for row in [&naive, &ours] {
        let t = row.tablet.expect("tablet scenario");
        assert_eq!(t.overloaded, p.protect, "{}", row.client.name());
        assert!(t.first_accept.is_some_and(|d| d >= p.protect));
        // One pairing in both tablet scenarios: the landed server with the landed client
        // curve (the server reports pressure from Tf = 8, not the proposal's 12).
        assert_eq!(t.pressure_from, PressureConfig::fluss_landed().l0_trigger());
    }
    assert_eq!(
        clients::gate_config().kv_curve(),
        &ThrottleCurve::fluss_landed()
    );
    assert!(
        ours.busy < naive.busy,
        "{:?} vs {:?}",
        ours.busy,
        naive.busy
    );
    assert!(ours.refused < naive.refused);
}

fn write_payload(bucket: u32, first_id: u64, n: u64, len: u32) -> Vec<u8> {
    let writes: Vec<(u64, u32)> = (first_id..first_id + n).map(|id| (id, len)).collect();
    Request::write(bucket, &writes).payload().to_vec()
}

fn tablet(protect: Duration) -> std::sync::Arc<Tablet> {
    Tablet::new(
        TabletConfig {
            protect,
            flush_bytes: 64 << 10,
            // No compaction within the test.
            compact_every: Duration::from_secs(3_600),
            pressure: PressureConfig::fluss_landed(),
        },
        10_000,
    )
}

#[test]
fn one_admitted_rpc_bigger_than_a_memtable_steps_l0_over_the_trigger() {
    let start = Instant::now();
    let t = tablet(Duration::ZERO);
    // 19 RPCs of 65 writes of 1000 bytes (65 × 1012 = 65 780 B): one L0 file each.
    for i in 0..19 {
        let (status, _) = t.serve_write(&write_payload(0, i * 65, 65, 1_000));
        assert_eq!(status, Status::Ok, "RPC {i}");
    }
    assert_eq!(t.report(Instant::now()).peak_l0, 19);
    // Admitted at 19, below the trigger (20); its 131 560 bytes flush two files at once.
    let (status, _) = t.serve_write(&write_payload(1, 5_000, 130, 1_000));
    assert_eq!(status, Status::Ok);
    let (status, _) = t.serve_write(&write_payload(1, 6_000, 1, 1_000));
    assert_eq!(
        status,
        Status::StorageBackpressure,
        "at 21 the server refuses"
    );
    let after = Instant::now();
    let r: TabletReport = t.report(after + Duration::from_secs(60));
    assert_eq!(r.peak_l0, 21);
    assert_eq!(r.slowdown_trigger, 20);
    assert_eq!(r.multi_file_rpcs, 1);
    assert_eq!(
        (r.peak_rpc.l0_before, r.peak_rpc.files_added, r.peak_rpc.ops),
        (19, 2, 130)
    );
    assert_eq!(r.peak_rpc.bytes, 130 * 1_012);
    // Overloaded from the RPC that reached 21 until `until` (compaction is an hour away).
    let upper = after + Duration::from_secs(60) - start;
    assert!(r.overloaded >= Duration::from_secs(60) && r.overloaded <= upper);
    // The episode ends when compaction brings L0 to 19, which the core admits: two
    // intervals after the start (compaction's clock), whatever `until` says after that.
    let late = t.report(after + Duration::from_secs(5 * 3_600));
    assert!(late.overloaded <= Duration::from_secs(2 * 3_600));
    assert!(late.overloaded >= Duration::from_secs(2 * 3_600) - (after - start));
    // A one-write RPC cannot step over: the peak the naive client reaches is the trigger.
    let naive = tablet(Duration::ZERO);
    for i in 0..2_000 {
        if naive.serve_write(&write_payload(0, i, 1, 1_000)).0 != Status::Ok {
            break;
        }
    }
    assert_eq!(naive.report(Instant::now()).peak_l0, 20);
}

#[test]
fn the_disk_lock_counts_as_overloaded_and_refuses_before_executing() {
    let t = tablet(Duration::from_secs(3_600));
    let (status, _) = t.serve_write(&write_payload(0, 0, 10, 100));
    assert_eq!(status, Status::DiskWriteLocked);
    let r = t.report(Instant::now() + Duration::from_secs(7_200));
    assert_eq!(r.overloaded, Duration::from_secs(3_600));
    assert_eq!((r.first_accept, r.peak_l0), (None, 0));
    assert_eq!(t.counters.execution(), (0, 0, 10_000));
}

/// A row as the scenario run would give it, for the report's tests.
fn row(scenario: Scenario, client: Client) -> Row {
    Row {
        scenario,
        client,
        ops: 2_000,
        rpcs: 0,
        bytes: 0,
        ops_received: 0,
        refused: 0,
        busy: Duration::ZERO,
        tablet: None,
        elapsed: Duration::from_secs(2),
        completed: 2_000,
        failed: 0,
        abandoned: 0,
        p99: Duration::from_millis(100),
        once: Some(2_000),
        twice: Some(0),
    }
}

/// Splits a Markdown table line into its cells (an escaped `\|` is not a separator).
fn md_cells(line: &str) -> Option<Vec<String>> {
    let inner = line.strip_prefix('|')?.strip_suffix('|')?;
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cells.last_mut()?.push('|');
                chars.next();
            }
            '|' => cells.push(String::new()),
            c => cells.last_mut()?.push(c),
        }
    }
    Some(cells.into_iter().map(|c| c.trim().to_string()).collect())
}

/// A GitHub-flavoured table: header, separator of `---` cells (optionally `:`-aligned), then
/// rows, every line with the header's cell count. Returns the rows' cells.
fn parse_gfm_table(text: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 2, "a header and a separator: {text}");
    let header = md_cells(lines[0]).expect("header row between pipes");
    let sep = md_cells(lines[1]).expect("separator row between pipes");
    assert_eq!(sep.len(), header.len(), "separator cell count: {text}");
    for c in &sep {
        let dashes = c.trim_start_matches(':').trim_end_matches(':');
        assert!(
            dashes.len() >= 3 && dashes.chars().all(|ch| ch == '-'),
            "separator cell `{c}`"
        );
    }
    lines[2..]
        .iter()
        .map(|l| {
            let cells = md_cells(l).unwrap_or_else(|| panic!("row between pipes: {l}"));
            assert_eq!(cells.len(), header.len(), "cell count of `{l}`");
            cells
        })
        .collect()
}

#[test]
fn the_table_is_valid_markdown_with_one_cell_per_column() {
    let mut ours = row(Scenario::Failover, Client::Ours);
    (ours.rpcs, ours.ops_received, ours.twice) = (10, 25, None);
    let mut naive = row(Scenario::Disk, Client::Naive);
    naive.tablet = Some(TabletReport {
        overloaded: Duration::from_millis(1_500),
        peak_l0: 21,
        ..TabletReport::default()
    });
    let text = report::table(&[naive, ours]);
    let rows = parse_gfm_table(&text);
    assert_eq!(rows.len(), 2);
    let header = md_cells(text.lines().next().unwrap()).unwrap();
    let names: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
    assert_eq!(header, names);
    let col = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert_eq!(rows[0][col("overloaded")], "1.50s");
    assert_eq!(rows[0][col("peak L0")], "21");
    assert_eq!(rows[1][col("peak L0")], "-");
    assert_eq!(rows[1][col("ops/RPC")], "2.5");
    assert_eq!(rows[1][col("exec 2x")], "-");
    // A cell holding a pipe is escaped, so it stays one cell.
    let cols = [COLUMNS[0], COLUMNS[1]];
    let odd = report::markdown_table(&cols, &[["a|b".to_string(), "c".to_string()]]);
    assert_eq!(
        parse_gfm_table(&odd),
        vec![vec!["a|b".to_string(), "c".into()]]
    );
}

#[test]
fn every_column_has_a_legend_and_docs_demo_md_carries_it_verbatim() {
    let legend = report::legend();
    for c in &COLUMNS {
        assert!(!c.legend.trim().is_empty(), "{}", c.name);
        assert!(legend.contains(&format!("- `{}`: {}", c.name, c.legend)));
    }
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/demo.md"))
            .expect("docs/demo.md");
    assert!(
        doc.contains(legend.trim_end()),
        "docs/demo.md lacks the legend as printed:\n{legend}"
    );
    // Every table in the page (the real run's and the reproducibility one) is valid GFM.
    let mut tables = 0;
    for block in doc.split("\n\n") {
        let block = block.trim();
        if block.starts_with('|') {
            parse_gfm_table(block);
            tables += 1;
        }
    }
    assert!(tables >= 2, "{tables} tables in docs/demo.md");
}

#[test]
fn ratios_name_the_factor_and_its_direction() {
    assert_eq!(report::compare(197_518.0, 99.0, "fewer"), "1995× fewer");
    assert_eq!(report::compare(4.0, 1.0, "less"), "4.0× less");
    assert_eq!(report::compare(2.0, 2.6, "less"), "1.3× more");
    assert_eq!(report::compare(2.0, 2.0, "less"), "same");
    assert_eq!(report::compare(16.0, 0.0, "fewer"), "none");
    assert_eq!(report::compare(0.0, 3.0, "fewer"), "more");
    assert_eq!(report::compare(f64::NAN, 3.0, "fewer"), "n/a");
}

#[test]
fn the_verdict_gives_the_ratios_and_says_why_ours_finished_later() {
    let tablet = |overloaded_ms, first_ms, last_ms, peak| TabletReport {
        overloaded: Duration::from_millis(overloaded_ms),
        disk_lock: Duration::from_secs(2),
        first_accept: Some(Duration::from_millis(first_ms)),
        last_bucket_first_accept: Some(Duration::from_millis(last_ms)),
        pressure_from: 8,
        slowdown_trigger: 20,
        flush_bytes: 64 << 10,
        peak_l0: peak,
        ..TabletReport::default()
    };
    let mut naive = row(Scenario::Disk, Client::Naive);
    (naive.rpcs, naive.bytes, naive.refused) = (200_000, 2_600_000, 198_000);
    naive.busy = Duration::from_millis(400);
    naive.tablet = Some(tablet(2_000, 2_000, 2_001, 3));
    let mut ours = row(Scenario::Disk, Client::Ours);
    (ours.rpcs, ours.bytes, ours.refused) = (100, 26_000, 20);
    ours.busy = Duration::from_millis(4);
    ours.elapsed = Duration::from_millis(3_450);
    ours.tablet = Some(tablet(2_000, 2_130, 3_440, 1));
    let v = report::verdict(&naive, &ours).expect("a verdict");
    for needle in [
        "**disk**",
        "RPCs 2000× fewer (200000 → 100)",
        "bytes 100× fewer (2600000 → 26000)",
        "server busy 100× less (400.0ms → 4.0ms)",
        "overloaded same (2.00s → 2.00s)",
        "writes executed twice 0 → 0",
        "Ours finished 1.45s later because it waits out the outage",
        "between 2.13s and 3.44s",
        "Peak L0 3 → 1 (slowdown trigger 20).",
    ] {
        assert!(v.contains(needle), "`{needle}` missing from: {v}");
    }
    assert!(
        !v.contains("Ours reached"),
        "no peak explanation below naive: {v}"
    );
    // A peak above naive's is explained from the server's record of the RPC that set it.
    let mut over = ours.clone();
    let mut t = tablet(2_010, 2_130, 3_440, 21);
    t.peak_rpc = demo::server::PeakRpc {
        l0_before: 19,
        files_added: 2,
        ops: 1_000,
        bytes: 112_000,
    };
    t.multi_file_rpcs = 14;
    over.tablet = Some(t);
    naive.tablet = Some(tablet(1_200, 0, 1, 20));
    let v = report::verdict(&naive, &over).expect("a verdict");
    assert!(
        v.contains("Ours reached 21, above the trigger: the server admitted an RPC of 1000 writes (112000 bytes) at L0 19"),
        "{v}"
    );
    assert!(v.contains("flushed 2 L0 file(s) at once"), "{v}");
    assert!(v.contains("14 of ours' accepted RPCs"), "{v}");
    // Higher than naive's but below the trigger: ours was faster than compaction.
    let mut quick = ours.clone();
    quick.elapsed = Duration::from_millis(160);
    quick.tablet = Some(tablet(0, 0, 1, 4));
    naive.elapsed = Duration::from_millis(320);
    naive.tablet = Some(tablet(0, 0, 1, 1));
    let v = report::peak_note(&naive, &quick).expect("a tablet scenario");
    assert!(v.contains("Peak L0 1 → 4"), "{v}");
    assert!(v.contains("in 0.16s against naive's 0.32s"), "{v}");
    assert!(v.contains("no pressure below L0 8"), "{v}");
    assert!(!v.contains("Ours reached"), "{v}");
    // The pair must be naive then ours, of one scenario.
    assert!(report::verdict(&ours, &naive).is_none());
    let other = row(Scenario::L0, Client::Ours);
    assert!(report::verdict(&naive, &other).is_none());
    // Failover: writes run twice against errors handed back.
    let mut fn_ = row(Scenario::Failover, Client::Naive);
    fn_.twice = Some(16);
    fn_.elapsed = Duration::from_secs(6);
    let mut fo = row(Scenario::Failover, Client::Ours);
    (fo.once, fo.failed) = (Some(2_000), 16);
    let v = report::verdict(&fn_, &fo).expect("a verdict");
    assert!(v.contains("writes executed twice 16 → 0"), "{v}");
    assert!(v.contains("Ours finished 4.00s sooner"), "{v}");
    assert!(
        v.contains("handed 16 writes back to the user as errors"),
        "{v}"
    );
}

/// The disk verdict's clauses, each printed only when the rows show what it states.
#[test]
fn the_disk_verdict_states_only_what_the_rows_show() {
    let tablet = |overloaded_ms, first_ms| TabletReport {
        overloaded: Duration::from_millis(overloaded_ms),
        disk_lock: Duration::from_secs(2),
        first_accept: Some(Duration::from_millis(first_ms)),
        last_bucket_first_accept: Some(Duration::from_millis(first_ms + 1_000)),
        pressure_from: 8,
        slowdown_trigger: 20,
        peak_l0: 1,
        ..TabletReport::default()
    };
    let mut naive = row(Scenario::Disk, Client::Naive);
    naive.refused = 1_000;
    naive.tablet = Some(tablet(2_000, 2_010));
    let mut ours = row(Scenario::Disk, Client::Ours);
    ours.refused = 20;
    ours.elapsed = Duration::from_secs(3);
    ours.tablet = Some(tablet(2_000, 2_200));
    let v = report::verdict(&naive, &ours).expect("a verdict");
    assert!(v.contains("(hence the same overloaded time)"), "{v}");
    assert!(
        v.contains("got its first write through at 2.01s, 10.0ms after the lock lifted"),
        "the gap is measured: {v}"
    );
    assert!(v.contains("(1000 refused RPCs against 20)"), "{v}");
    // Ours overloaded the server longer than the lock (an L0 episode): no "hence".
    let mut longer = ours.clone();
    longer.tablet = Some(tablet(2_300, 2_200));
    let v = report::verdict(&naive, &longer).expect("a verdict");
    assert!(v.contains("waits out the outage"), "{v}");
    assert!(!v.contains("hence the same overloaded time"), "{v}");
    // Ours refused as often as naive: nothing about naive re-sending into the lock.
    let mut stubborn = ours.clone();
    stubborn.refused = 1_000;
    let v = report::verdict(&naive, &stubborn).expect("a verdict");
    assert!(!v.contains("re-sends into the lock"), "{v}");
    // Ours got a write through before the lock's end (no outage waited out): no "because".
    let mut early = ours.clone();
    let mut t = tablet(2_000, 1_000);
    t.disk_lock = Duration::from_millis(500);
    early.tablet = Some(t);
    let v = report::verdict(&naive, &early).expect("a verdict");
    assert!(v.contains("Ours finished 1.00s later."), "{v}");
    assert!(!v.contains("waits out the outage"), "{v}");
}

/// The l0 verdict names the pressure only if the server reported some to ours, the refusals
/// only if ours had fewer, and never a tuning it did not measure.
#[test]
fn the_l0_verdict_states_only_what_the_rows_show() {
    let tablet = |peak| TabletReport {
        pressure_from: 8,
        slowdown_trigger: 20,
        peak_l0: peak,
        ..TabletReport::default()
    };
    let mut naive = row(Scenario::L0, Client::Naive);
    naive.refused = 86_025;
    naive.tablet = Some(tablet(20));
    let mut ours = row(Scenario::L0, Client::Ours);
    ours.elapsed = Duration::from_millis(2_400);
    ours.tablet = Some(tablet(14));
    let v = report::verdict(&naive, &ours).expect("a verdict");
    assert!(
        v.contains("it slowed down on the pressure the server piggybacks on accepted writes from L0 8 on (ours reached 14)"),
        "{v}"
    );
    assert!(
        v.contains("it did not re-send every rejection (86025 refused RPCs against 0)"),
        "{v}"
    );
    assert!(!v.contains("tuned"), "an unmeasured claim: {v}");
    // Below Tf the server piggybacked no pressure: no pressure clause.
    let mut calm = ours.clone();
    calm.tablet = Some(tablet(5));
    naive.refused = 0;
    let v = report::verdict(&naive, &calm).expect("a verdict");
    assert!(v.contains("Ours finished 0.40s later."), "{v}");
    assert!(!v.contains("slowed down"), "{v}");
    assert!(!v.contains("re-send"), "{v}");
}

/// "Faster than compaction drained them" only when ours delivered sooner than naive.
#[test]
fn a_higher_peak_is_blamed_on_speed_only_when_ours_was_faster() {
    let tablet = |peak| TabletReport {
        pressure_from: 8,
        slowdown_trigger: 20,
        peak_l0: peak,
        ..TabletReport::default()
    };
    let mut naive = row(Scenario::Disk, Client::Naive);
    naive.tablet = Some(tablet(1));
    naive.elapsed = Duration::from_millis(2_000);
    let mut ours = row(Scenario::Disk, Client::Ours);
    ours.tablet = Some(tablet(3));
    ours.elapsed = Duration::from_millis(3_300);
    let v = report::peak_note(&naive, &ours).expect("a tablet scenario");
    assert!(v.contains("Ours peaked higher, below the trigger"), "{v}");
    assert!(
        !v.contains("faster than compaction"),
        "ours finished later: {v}"
    );
    assert!(!v.contains("delivered its writes"), "{v}");
    assert!(
        v.contains("; the server reports no pressure below L0 8, so no pressure signal slowed it."),
        "{v}"
    );
    // A peak at or above Tf: no "no pressure" clause.
    ours.tablet = Some(tablet(9));
    let v = report::peak_note(&naive, &ours).expect("a tablet scenario");
    assert!(!v.contains("no pressure"), "{v}");
    // At the trigger from a one-file RPC: no "steps over the trigger".
    let mut t = tablet(20);
    t.peak_rpc = demo::server::PeakRpc {
        l0_before: 19,
        files_added: 1,
        ops: 518,
        bytes: 58_016,
    };
    ours.tablet = Some(t);
    let v = report::peak_note(&naive, &ours).expect("a tablet scenario");
    assert!(v.contains("Ours reached 20, the trigger"), "{v}");
    assert!(!v.contains("steps over"), "{v}");
}

/// Reads: the per-RPC cost is named only when ours carried more reads per RPC; failover:
/// each count is named only when it is not zero.
#[test]
fn the_reads_and_failover_verdicts_state_only_what_the_rows_show() {
    let mut naive = row(Scenario::Reads, Client::Naive);
    (naive.rpcs, naive.ops_received, naive.elapsed) = (2_000, 2_000, Duration::from_secs(4));
    let mut ours = row(Scenario::Reads, Client::Ours);
    (ours.rpcs, ours.ops_received, ours.elapsed) = (500, 2_000, Duration::from_secs(1));
    let v = report::verdict(&naive, &ours).expect("a verdict");
    assert!(
        v.contains("ours carries 4.0 reads in each (naive: 1.0)"),
        "{v}"
    );
    ours.rpcs = 2_000;
    let v = report::verdict(&naive, &ours).expect("a verdict");
    assert!(v.contains("Ours finished 3.00s sooner."), "{v}");
    assert!(!v.contains("carries"), "no batching, no claim: {v}");

    let naive = row(Scenario::Failover, Client::Naive);
    let mut ours = row(Scenario::Failover, Client::Ours);
    (ours.once, ours.abandoned) = (Some(1_990), 10);
    let v = report::verdict(&naive, &ours).expect("a verdict");
    assert!(
        !v.contains("The naive client re-sent"),
        "none ran twice: {v}"
    );
    assert!(!v.contains("handed"), "nothing handed back: {v}");
    assert!(
        v.contains("Ours ran 1990 writes exactly once and 0 twice (10 never); 10 were unfinished at the deadline."),
        "{v}"
    );
}

/// The output starts with two Markdown paragraphs, and its command carries `--release` only
/// for a release build.
#[test]
fn the_header_is_two_paragraphs_and_names_the_binarys_profile() {
    let opts = scenario::parse_args(["--scenario", "disk", "--seed", "3"].map(String::from))
        .expect("valid flags")
        .expect("not help");
    let release = scenario::header(&opts, true);
    assert_eq!(
        release,
        "loopback demo: scale 1, seed 3; servers on 127.0.0.1, one fresh server per run\n\n\
         command: cargo run --release -p throttle-tokio --example loopback -- --scenario disk \
         --scale 1 --seed 3\n"
    );
    let debug = scenario::header(&opts, false);
    assert!(
        debug.contains("command: cargo run -p throttle-tokio --example loopback --"),
        "{debug}"
    );
    assert!(!debug.contains("--release"), "{debug}");
}

#[test]
fn bad_flags_are_refused_with_a_message_naming_them() {
    let parse = |a: &[&str]| scenario::parse_args(a.iter().map(|s| s.to_string()));
    assert!(parse(&["--scenario", "nope"]).unwrap_err().contains("nope"));
    assert!(parse(&["--scale", "0"]).unwrap_err().contains("--scale"));
    assert!(parse(&["--scale"]).unwrap_err().contains("needs a value"));
    assert!(parse(&["--seed", "-1"]).unwrap_err().contains("--seed"));
    assert!(
        parse(&["--frobnicate"])
            .unwrap_err()
            .contains("--frobnicate")
    );
    assert_eq!(parse(&["--help"]), Ok(None));
    assert_eq!(parse(&["-h"]), Ok(None));
    assert_eq!(parse(&["--scenario", "nope", "-h"]), Ok(None), "help wins");
    let ok = parse(&["--scenario=disk", "--scale", "0.5"])
        .unwrap()
        .unwrap();
    assert_eq!((ok.scenarios, ok.scale), (vec![Scenario::Disk], 0.5));
}

/// The example binary `cargo test` builds next to this test's `deps` directory.
fn example_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    profile_dir
        .join("examples")
        .join(format!("loopback{}", std::env::consts::EXE_SUFFIX))
}

#[test]
fn bad_flags_exit_non_zero_with_usage_on_stderr() {
    let bin = example_binary();
    assert!(
        bin.exists(),
        "{} not built (cargo test builds examples)",
        bin.display()
    );
    for args in [
        &["--scale", "-3"][..],
        &["--scenario", "everything"][..],
        &["--bogus"][..],
    ] {
        let out = Command::new(&bin).args(args).output().expect("run example");
        assert_eq!(out.status.code(), Some(2), "{args:?} exits with status 2");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
        assert!(stderr.contains("usage: loopback"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing runs");
    }
}

#[test]
fn help_exits_zero_with_usage_on_stdout() {
    let bin = example_binary();
    assert!(bin.exists(), "{} not built", bin.display());
    for args in [
        &["--help"][..],
        &["-h"][..],
        &["--scale", "2", "--help"][..],
    ] {
        let out = Command::new(&bin).args(args).output().expect("run example");
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with("usage: loopback"), "{args:?}: {stdout}");
        assert!(stdout.contains("-h, --help"), "{args:?}: {stdout}");
        assert!(out.stderr.is_empty(), "{args:?}: nothing runs");
    }
}
