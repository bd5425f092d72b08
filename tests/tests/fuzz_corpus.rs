//! Replays the checked-in cargo-fuzz corpus on stable: every input under
//! `fuzz/corpus/<target>/` goes through the same model checker the fuzz target drives, so a
//! crash found once by the fuzzer stays a regression test without nightly or libFuzzer.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

use throttle_sansio::model::Divergence;

type Checker = fn(&[u8]) -> Result<(), Divergence>;

/// Runs `check` on every file of `fuzz/corpus/<target>/` and reports each failing file by name.
/// An empty or missing corpus fails too, so the test can never pass vacuously.
fn replay(target: &str, check: Checker) {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "fuzz", "corpus", target]
        .iter()
        .collect();
    let entries =
        fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus {} is missing: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("readable corpus entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "corpus {} holds no inputs: the replay would prove nothing",
        dir.display()
    );

    let mut failures = Vec::new();
    for path in &files {
        let data = fs::read(path).expect("readable corpus file");
        let name = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match panic::catch_unwind(AssertUnwindSafe(|| check(&data))) {
            Ok(Ok(())) => {}
            Ok(Err(divergence)) => failures.push(format!("{name}: {divergence}")),
            Err(_) => failures.push(format!("{name}: the checker panicked")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} inputs of {target} diverge:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

macro_rules! corpus_replays {
    ($($test:ident => $target:literal, $check:path;)*) => {
        /// Every target this file replays, to compare with `fuzz/fuzz_targets/`.
        const REPLAYED: &[&str] = &[$($target),*];

        $(
            #[test]
            fn $test() {
                replay($target, $check);
            }
        )*
    };
}

/// A fuzz target added without a replay here would keep its crashes out of stable CI.
#[test]
fn every_fuzz_target_has_a_corpus_replay() {
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "..", "fuzz", "fuzz_targets"]
        .iter()
        .collect();
    let mut targets: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{} is missing: {e}", dir.display()))
        .map(|entry| entry.expect("readable fuzz target entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .filter_map(|path| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    targets.sort();
    let mut replayed: Vec<String> = REPLAYED.iter().map(|t| (*t).to_owned()).collect();
    replayed.sort();
    assert_eq!(targets, replayed);
}

corpus_replays! {
    grpc_config_corpus_matches_reference => "grpc_config", throttle_sansio::model::grpc_config::check;
    backoff_corpus_matches_reference => "backoff", throttle_sansio::model::backoff::check;
    limiter_corpus_matches_reference => "limiter", throttle_sansio::model::limiter::check;
    backpressure_corpus_matches_reference => "backpressure", throttle_sansio::model::backpressure::check;
    write_gate_corpus_matches_reference => "write_gate", throttle_sansio::model::write_gate::check;
    dispatch_window_corpus_matches_reference => "dispatch_window", throttle_sansio::model::dispatch_window::check_all;
    batcher_corpus_matches_reference => "batcher", throttle_sansio::model::batcher::check;
    pending_bytes_corpus_matches_reference => "pending_bytes", throttle_sansio::model::pending_bytes::check;
    conn_key_corpus_matches_reference => "conn_key", throttle_sansio::model::conn_key::check;
    failover_call_corpus_matches_reference => "failover_call", throttle_sansio::model::failover::check_call;
    refresh_coalescer_corpus_matches_reference => "refresh_coalescer", throttle_sansio::model::failover::check_coalescer;
    retry_budget_corpus_matches_reference => "retry_budget", throttle_sansio::model::failover::check_budget;
    paced_writer_corpus_matches_reference => "paced_writer", throttle_sansio::model::paced_writer::check;
}
