//! The hot paths behind the benchmark's stable rows, one per mode, run `N` times: built by
//! `count.sh` against two checkouts of the core and counted with callgrind. Not part of the
//! workspace (it must build against an older core too), so it uses only API both have.
//!
//! Modes: `permit_idle` / `permit_busy` (the sync handle's `try_acquire_owned` + complete, one
//! idle shard / one shard with another permit held: "permit through sync"), `permit_fx` (the
//! same with the benchmark's FxHash-style hasher), `permit_borrowed` (`try_acquire` of a
//! borrowed permit + complete), `window_idle` /
//! `window_busy` (the core window's submit + complete: "window credit, uncontended"),
//! `backoff` (a jittered Fluss sequence of 10 delays, restarted: "backoff with jitter").

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::hint::black_box;
use throttle_sansio::rng::SplitMix64;
use throttle_sansio::sync::WindowHandle;
use throttle_sansio::{Backoff, BackoffConfig, DispatchWindow, WindowConfig};
mod fx_hasher;
use fx_hasher::FxHasher;

/// `try_acquire_owned` (or, `borrowed`, `try_acquire`) + complete of shard 7, `n` times.
fn permits<S: BuildHasher + Clone + Sync + Send + 'static>(hasher: S, n: u64, busy: bool, borrowed: bool) {
    let handle: WindowHandle<u32, S> =
        WindowHandle::with_hasher(WindowConfig::default(), hasher).expect("valid");
    let _held = if busy {
        Some(handle.try_acquire(7).expect("credit"))
    } else {
        None
    };
    for _ in 0..n {
        if borrowed {
            let p = black_box(&handle).try_acquire(black_box(7)).expect("credit");
            let _ = black_box(p.complete());
        } else {
            let p = black_box(&handle)
                .try_acquire_owned(black_box(7))
                .expect("credit");
            let _ = black_box(p.complete());
        }
    }
}

fn main() {
    let n: u64 = std::env::args().nth(1).unwrap().parse().unwrap();
    let mode = std::env::args().nth(2).unwrap_or_default();
    match mode.as_str() {
        "permit_idle" | "permit_busy" => {
            permits(RandomState::new(), n, mode == "permit_busy", false)
        }
        "permit_fx" => permits(BuildHasherDefault::<FxHasher>::default(), n, false, false),
        "permit_borrowed" => permits(RandomState::new(), n, false, true),
        "window_idle" | "window_busy" => {
            let mut w: DispatchWindow<u32, u64, RandomState> =
                DispatchWindow::new(WindowConfig::default()).expect("valid");
            let held = if mode == "window_busy" {
                Some(w.submit(7, 0).expect("open").expect("credit"))
            } else {
                None
            };
            for _ in 0..n {
                let d = w.submit(black_box(7), 1).expect("open").expect("credit");
                black_box(w.complete(d.credit).expect("live"));
            }
            drop(held);
        }
        "backoff" => {
            let cfg = BackoffConfig::fluss_disk_write_locked();
            let mut seq = Backoff::new();
            let mut rng = SplitMix64::new(0x5eed);
            for _ in 0..n {
                if seq.attempt() == 10 {
                    seq.reset();
                }
                black_box(seq.next_delay(black_box(&cfg), &mut rng));
            }
        }
        _ => panic!("unknown mode {mode:?}"),
    }
}
