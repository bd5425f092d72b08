//! Workloads shared by the allocation test and the benches (included with `#[path]`), so the
//! allocation counts and the timings describe the same work.

use std::collections::VecDeque;
use std::hash::BuildHasher;

use throttle_sansio::batcher::{BatchAction, Batcher};
use throttle_sansio::dispatch_window::CreditId;
use throttle_sansio::time::Instant;

/// `ops` operations of 100 bytes spread round-robin over `shards` shards, flushed, and every
/// batch answered for all its positions until nothing is in flight. Returns the operations
/// delivered (every one of them, or the batcher lost some).
pub fn batcher_round<S: BuildHasher + Clone>(
    b: &mut Batcher<u32, u64, S>,
    in_flight: &mut VecDeque<CreditId>,
    shards: u32,
    ops: u64,
) -> u64 {
    let now = Instant::from_millis(1);
    let mut delivered = 0;
    for op in 0..ops {
        let shard = (op % u64::from(shards.max(1))) as u32;
        b.handle_op(now, shard, op, 100).expect("batcher open");
    }
    b.flush(now);
    loop {
        while let Some(action) = b.poll_action() {
            match action {
                BatchAction::Send { credit, .. } => in_flight.push_back(credit),
                BatchAction::Deliver { .. } => delivered += 1,
                other => panic!("unexpected batcher action {other:?}"),
            }
        }
        let Some(credit) = in_flight.pop_front() else {
            break;
        };
        let len = b.batch(credit).map_or(0, |batch| batch.len());
        b.handle_response(now, credit, 0..len).expect("live credit");
    }
    delivered
}
