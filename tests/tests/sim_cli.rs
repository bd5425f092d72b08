//! The `sim` binary: runs a scenario, and refuses bad flags with a message and a non-zero exit.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sim"))
        .args(args)
        .output()
        .expect("run sim")
}

#[test]
fn bad_flags_exit_non_zero_with_a_clear_message() {
    for (args, needle) in [
        (&["kv", "--bogus"][..], "unknown flag `--bogus`"),
        (&["kv", "--seed", "x"][..], "--seed: `x`"),
        (&["kv", "--scale", "0"][..], "outside (0, 1]"),
        (&["nope"][..], "unknown scenario `nope`"),
        (&[][..], "missing scenario"),
    ] {
        let out = sim(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.contains("usage: sim"), "{err}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn failover_scenario_prints_its_table() {
    let out = sim(&["failover", "--seed", "2", "--scale", "0.5"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("coordinator failover"), "{text}");
    assert!(
        text.contains("ours (ConnTable + Call + coalescer)"),
        "{text}"
    );
}
