//! End to end over real TCP on 127.0.0.1: the loopback demo's disk-protection scenario at
//! small scale, judged by the server's own counters, and the demo's command line.

#[path = "../examples/loopback/demo/mod.rs"]
mod demo;

use demo::scenario::{self, Client, Params, Scenario};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_protection_ours_sends_100x_fewer_rpcs_and_every_write_executes_once() {
    // 500 writes over 4 buckets; the server refuses every write for the first 1.5 s.
    let mut p = Params::new(Scenario::Disk, 0.25, 7);
    p.protect = Duration::from_millis(1_500);
    let naive = scenario::run(&p, Client::Naive).await.expect("naive run");
    let ours = scenario::run(&p, Client::Ours).await.expect("our run");
    println!(
        "{}\n{}\n{}",
        scenario::header(),
        scenario::format_row(&naive),
        scenario::format_row(&ours)
    );

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
