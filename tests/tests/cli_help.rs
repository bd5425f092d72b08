//! Every binary of the workspace answers `--help` and `-h` with its usage on stdout and exit
//! status 0 (the loopback example's own check is in `runtime-tokio/tests/e2e_loopback.rs`).

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .output()
        .expect("run sim")
}

#[test]
fn sim_help_exits_zero_with_the_usage_on_stdout() {
    for args in [
        &["--help"][..],
        &["-h"][..],
        // Help wins wherever it stands, even next to a bad flag.
        &["kv", "--help"][..],
        &["--bogus", "-h"][..],
    ] {
        let out = sim(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("usage: sim"), "{args:?}: {text}");
        assert!(text.contains("-h, --help"), "{args:?}: {text}");
        assert!(text.contains("--seed N"), "{args:?}: {text}");
        assert!(out.stderr.is_empty(), "{args:?}");
    }
}
