//! Unit tests of the batcher.

use super::*;
use crate::test_hasher::TestHasher;
use alloc::format;
use alloc::vec;

extern crate std;

/// A batch limit in operations.
fn nz(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

/// A batch limit in bytes.
fn nzb(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
}

type B = Batcher<u32, u32, TestHasher>;
type Action = BatchAction<u32, u32>;

const T0: Instant = Instant::ZERO;

fn batcher(cfg: BatcherConfig) -> B {
    B::new(cfg)
}

fn reads(max_in_flight: u32) -> B {
    batcher(
        BatcherConfig::reads()
            .with_window(WindowConfig::default().with_max_in_flight(max_in_flight as usize))
            .unwrap(),
    )
}

fn drain(b: &mut B) -> Vec<Action> {
    core::iter::from_fn(|| b.poll_action()).collect()
}

/// The `(shard, credit, ops)` of every `Send` in `actions`.
fn sends(b: &B, actions: &[Action]) -> Vec<(u32, CreditId, Vec<u32>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            BatchAction::Send { shard, credit, .. } => Some((
                *shard,
                *credit,
                b.batch(*credit)
                    .map(|x| x.ops().to_vec())
                    .unwrap_or_default(),
            )),
            _ => None,
        })
        .collect()
}

/// Drains the actions and returns the sends among them.
fn take_sends(b: &mut B) -> Vec<(u32, CreditId, Vec<u32>)> {
    let a = drain(b);
    sends(b, &a)
}

fn op(b: &mut B, shard: u32, handle: u32, bytes: u64) {
    assert!(b.handle_op(T0, shard, handle, bytes).is_ok());
}

/// Adds an operation and returns its id.
fn op_id(b: &mut B, shard: u32, handle: u32, bytes: u64) -> OpId {
    match b.handle_op(T0, shard, handle, bytes) {
        Ok(id) => id,
        Err(e) => panic!("refused: {e:?}"),
    }
}

#[test]
fn cancel_withdraws_from_open_parked_and_queued_batches_keeping_the_order() {
    // Shard 1: [1] in flight, [2, 3, 4] queued (full at 3), [5] parked; shard 2: [6, 7]
    // open.
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(3))
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap(),
    );
    op(&mut b, 1, 1, 0);
    b.flush(T0);
    let first = take_sends(&mut b);
    let ids: Vec<OpId> = [2, 3, 4, 5].map(|h| op_id(&mut b, 1, h, 0)).to_vec();
    b.flush(T0);
    assert_eq!((b.window().queued(&1), b.open_ops(&1)), (1, 1));
    let six = op_id(&mut b, 2, 6, 0);
    let _seven = op_id(&mut b, 2, 7, 0);
    assert!(b.actions.is_empty(), "nothing left yet");
    assert_eq!(b.cancel(ids[0]), Ok(Withdrawal::Withdrawn(2)), "queued");
    assert_eq!(b.cancel(ids[3]), Ok(Withdrawal::Withdrawn(5)), "parked");
    assert_eq!(b.cancel(six), Ok(Withdrawal::Withdrawn(6)), "open");
    assert_eq!(
        b.cancel(ids[0]),
        Ok(Withdrawal::TooLate),
        "withdrawn already"
    );
    assert_eq!((b.open_ops(&1), b.open_ops(&2)), (0, 1));
    assert!(
        !b.window().is_parked(&1),
        "the emptied parked batch is gone"
    );
    assert!(b.actions.is_empty(), "a withdrawal emits nothing");
    b.flush(T0);
    assert_eq!(
        take_sends(&mut b)
            .into_iter()
            .map(|s| (s.0, s.2))
            .collect::<Vec<_>>(),
        [(2, vec![7])]
    );
    assert_eq!(b.handle_response(T0, first[0].1, [0]), Ok(()));
    let a = drain(&mut b);
    assert_eq!(
        sends(&b, &a)[0].2,
        [3, 4],
        "the queued batch goes out without 2"
    );
    // 3 has left: too late for it now.
    assert_eq!(b.cancel(ids[1]), Ok(Withdrawal::TooLate));
    assert_eq!(b.check_invariants(), Ok(()));
}

#[test]
fn an_emptied_batch_is_never_sent_and_its_turn_goes_to_the_next() {
    // A window of 1: [1] in flight, [2, 3] queued, [4] parked.
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(2))
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap(),
    );
    op(&mut b, 1, 1, 0);
    b.flush(T0);
    let first = take_sends(&mut b)[0].1;
    let queued = [op_id(&mut b, 1, 2, 0), op_id(&mut b, 1, 3, 0)];
    let parked = op_id(&mut b, 1, 4, 0);
    b.flush(T0);
    for id in queued {
        assert!(matches!(b.cancel(id), Ok(Withdrawal::Withdrawn(_))));
    }
    assert_eq!(b.window().queued(&1), 0, "the emptied batch left the line");
    assert_eq!(b.handle_response(T0, first, [0]), Ok(()));
    let a = drain(&mut b);
    assert_eq!(sends(&b, &a)[0].2, [4], "the parked batch takes the credit");
    let second = sends(&b, &a)[0].1;
    // Empty the next parked batch: the release sends nothing and frees the credit.
    let five = op_id(&mut b, 1, 5, 0);
    b.flush(T0);
    assert!(b.window().is_parked(&1));
    assert_eq!(b.cancel(five), Ok(Withdrawal::Withdrawn(5)));
    assert!(!b.window().is_parked(&1));
    assert_eq!(b.cancel(parked), Ok(Withdrawal::TooLate), "4 left");
    assert_eq!(b.handle_response(T0, second, [0]), Ok(()));
    assert!(take_sends(&mut b).is_empty(), "no empty batch goes out");
    assert_eq!(
        (b.window().live_credits(), b.window().shard_count()),
        (0, 0)
    );
    op(&mut b, 1, 6, 0);
    b.flush(T0);
    assert_eq!(
        take_sends(&mut b).len(),
        1,
        "the freed credit serves at once"
    );
    assert_eq!(b.check_invariants(), Ok(()));
}

#[test]
fn a_batch_that_got_a_withdrawal_keeps_growing_and_numbers_stay_right() {
    let mut b = reads(1);
    op(&mut b, 1, 0, 0);
    b.flush(T0);
    let first = take_sends(&mut b)[0].1;
    let ids: Vec<OpId> = (1..6).map(|h| op_id(&mut b, 1, h, 0)).collect();
    b.flush(T0); // parked: [1..=5]
    assert_eq!(b.cancel(ids[1]), Ok(Withdrawal::Withdrawn(2)));
    let more = op_id(&mut b, 1, 6, 0); // reclaimed: joins [1, 3, 4, 5]
    assert_eq!(b.cancel(ids[3]), Ok(Withdrawal::Withdrawn(4)));
    assert_eq!(b.cancel(more), Ok(Withdrawal::Withdrawn(6)));
    assert_eq!(b.cancel(ids[1]), Ok(Withdrawal::TooLate));
    b.flush(T0);
    assert_eq!(b.handle_response(T0, first, [0]), Ok(()));
    let a = drain(&mut b);
    let (_, credit, ops) = sends(&b, &a).remove(0);
    assert_eq!(ops, [1, 3, 5]);
    assert_eq!(b.handle_response(T0, credit, [0, 1, 2]), Ok(()));
    assert_eq!(
        drain(&mut b),
        [1, 3, 5]
            .iter()
            .enumerate()
            .map(|(position, &handle)| BatchAction::Deliver { handle, position })
            .collect::<Vec<_>>(),
        "positions index the batch as sent"
    );
}

#[test]
fn cancel_refuses_forged_and_foreign_ids_and_changes_nothing() {
    let mut one = reads(1);
    let mut two = reads(1);
    let mine = op_id(&mut one, 1, 1, 0);
    let theirs = op_id(&mut two, 1, 9, 0);
    assert_eq!(one.cancel(theirs), Err(ReleaseError::Unknown));
    let beyond = OpId { ordinal: 7, ..mine };
    assert_eq!(one.cancel(beyond), Err(ReleaseError::Unknown));
    let never = OpId {
        batch: Key::new(u64::MAX - 1, 0, mine.batch.tag()),
        ..mine
    };
    assert_eq!(one.cancel(never), Err(ReleaseError::Unknown));
    assert_eq!(one.open_ops(&1), 1);
    one.flush(T0);
    assert_eq!(take_sends(&mut one).len(), 1);
    assert_eq!(one.cancel(mine), Ok(Withdrawal::TooLate), "sent");
}

#[test]
fn cancel_after_close_is_too_late_and_every_operation_ends_once() {
    let mut b = reads(1);
    let id = op_id(&mut b, 1, 1, 0);
    b.close();
    assert_eq!(
        drain(&mut b),
        [BatchAction::Fail {
            handle: 1,
            reason: FailReason::Closed
        }]
    );
    assert_eq!(b.cancel(id), Ok(Withdrawal::TooLate));
}

#[test]
fn defaults_match_the_seed_and_only_an_invalid_window_is_refused() {
    let c = BatcherConfig::default();
    assert_eq!(c.kind(), BatchKind::Write);
    assert_eq!(c.max_requests_per_batch(), 1000);
    assert_eq!(c.max_batch_bytes(), 128 * 1024);
    assert_eq!(c.window().max_in_flight(), 4);
    assert_eq!(BatcherConfig::reads().kind(), BatchKind::Read);
    // Zero limits cannot be written (`NonZero*`); the window is the one fallible part.
    assert!(matches!(
        c.with_window(WindowConfig::default().with_max_in_flight(0)),
        Err(ConfigError::OutOfRange { got: 0, .. })
    ));
    let one = c.with_max_requests_per_batch(NonZeroUsize::MIN);
    assert_eq!(one.max_requests_per_batch(), 1);
    let b: B = Batcher::new(one); // infallible
    assert_eq!(b.window().capacity(), 4);
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn seed_1500_reads_behind_four_in_flight_go_out_as_two_rpcs() {
    // Oxia PR #362: "at most maxReadBatchesInFlight (default 4) read batches may be
    // outstanding per (client, shard)"; while exhausted "the open read batch keeps accumulating
    // toward maxRequestsPerBatch" (1000). So 1500 reads become 1000 + 500, not 1500 tiny RPCs.
    for flush_between in [false, true] {
        let mut b = reads(4);
        let mut first = vec![];
        for h in 0..4 {
            op(&mut b, 1, h, 10);
            b.flush(T0);
            let a = drain(&mut b);
            first.extend(sends(&b, &a));
        }
        assert_eq!(first.len(), 4);
        for h in 4..1504 {
            op(&mut b, 1, h, 10);
            if flush_between {
                b.flush(T0);
            }
            assert!(b.window().in_flight(&1) <= 4);
        }
        b.flush(T0);
        assert!(
            take_sends(&mut b).is_empty(),
            "nothing more while exhausted"
        );
        assert_eq!((b.window().queued(&1), b.open_ops(&1)), (1, 500));
        let mut more = vec![];
        for (_, credit, ops) in first {
            assert_eq!(b.handle_response(T0, credit, 0..ops.len()), Ok(()));
            more.extend(take_sends(&mut b));
            assert!(b.window().in_flight(&1) <= 4);
        }
        let sizes: Vec<usize> = more.iter().map(|s| s.2.len()).collect();
        assert_eq!(sizes, [1000, 500], "flush_between = {flush_between}");
        assert_eq!(more[0].2.first(), Some(&4), "oldest operations first");
        assert_eq!(more[1].2.last(), Some(&1503));
    }
}

#[test]
fn flush_sends_open_batch_at_once_when_shard_has_credit() {
    let mut b = reads(4);
    op(&mut b, 1, 7, 0);
    assert_eq!(
        b.open_batches(),
        1,
        "an open batch waits for flush (or a drain)"
    );
    b.flush(T0);
    let a = drain(&mut b);
    assert_eq!(
        sends(&b, &a),
        [(1, CreditId::forge(b.window.instance_tag(), 0, 1), vec![7])]
    );
    assert_eq!(b.open_batches(), 0);
}

#[test]
fn open_batches_counts_only_shards_holding_operations() {
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(2))
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap(),
    );
    op(&mut b, 7, 1, 0);
    op(&mut b, 7, 2, 0); // full at once: sent, nothing left open for shard 7
    assert_eq!((b.open_ops(&7), b.open_batches()), (0, 0));
    op(&mut b, 8, 3, 0);
    op(&mut b, 7, 4, 0);
    assert_eq!(b.open_batches(), 2);
    b.flush(T0); // shard 7 exhausted: parked; shard 8 sent
    assert_eq!((b.open_batches(), b.open_ops(&7)), (0, 1));
    op(&mut b, 7, 5, 0); // reclaims the parked batch, which is then full and queued
    assert_eq!((b.open_batches(), b.window().queued(&7)), (0, 1));
    op(&mut b, 7, 6, 0);
    assert_eq!(b.open_batches(), 1);
    b.close();
    assert_eq!(b.open_batches(), 0);
}

#[test]
fn parked_batch_keeps_growing_ahead_of_newer_operations() {
    let mut b = reads(1);
    op(&mut b, 1, 1, 0);
    b.flush(T0);
    let first = take_sends(&mut b);
    op(&mut b, 1, 2, 0);
    b.flush(T0);
    assert!(b.window().is_parked(&1));
    op(&mut b, 1, 3, 0); // reclaims the parked batch instead of starting a new one
    assert!(!b.window().is_parked(&1));
    b.flush(T0);
    assert_eq!(b.open_ops(&1), 2);
    assert_eq!(b.handle_response(T0, first[0].1, [0]), Ok(()));
    let a = drain(&mut b);
    assert_eq!(
        a[0],
        BatchAction::Deliver {
            handle: 1,
            position: 0
        }
    );
    assert_eq!(sends(&b, &a).first().map(|s| s.2.clone()), Some(vec![2, 3]));
}

#[test]
fn full_batches_queue_fifo_behind_the_window() {
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(2))
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap(),
    );
    for h in 0..7 {
        op(&mut b, 1, h, 0);
    }
    b.flush(T0);
    let mut got = take_sends(&mut b);
    assert_eq!(got.len(), 1);
    assert_eq!(b.window().queued(&1), 2);
    let mut order = vec![];
    while let Some((_, credit, ops)) = got.pop() {
        order.push(ops);
        assert_eq!(b.handle_failure(T0, credit, ()), Ok(()));
        got = take_sends(&mut b);
    }
    assert_eq!(order, [vec![0, 1], vec![2, 3], vec![4, 5], vec![6]]);
    assert_eq!((b.window().shard_count(), b.open_batches()), (0, 0));
}

#[test]
fn oversized_write_operation_travels_alone() {
    let cfg = BatcherConfig::writes().with_max_batch_bytes(nzb(100));
    let mut b = batcher(cfg);
    op(&mut b, 1, 1, 30);
    op(&mut b, 1, 2, 500); // closes [1] and goes out alone
    op(&mut b, 1, 3, 60);
    op(&mut b, 1, 4, 40); // exactly 100: full
    op(&mut b, 1, 5, u64::MAX); // closes nothing (empty batch), goes alone
    op(&mut b, 1, 6, 1);
    b.flush(T0);
    let got: Vec<Vec<u32>> = take_sends(&mut b).into_iter().map(|s| s.2).collect();
    assert_eq!(got, [vec![1], vec![2], vec![3, 4], vec![5]]);
    assert!(b.window().is_parked(&1), "four in flight: [6] waits");
    assert_eq!(b.open_ops(&1), 1, "[6] parked");
}

#[test]
fn reads_are_bounded_by_count_only() {
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_batch_bytes(nzb(1))
            .with_max_requests_per_batch(nz(3)),
    );
    for h in 0..4 {
        op(&mut b, 1, h, u64::MAX);
    }
    let got = take_sends(&mut b);
    assert_eq!(got.len(), 2, "the full batch, then the open one (drained)");
    assert_eq!((&got[0].2[..], &got[1].2[..]), (&[0, 1, 2][..], &[3][..]));
    assert_eq!(
        b.batch(got[0].1).map(Batch::bytes),
        Some(u64::MAX),
        "sizes saturate"
    );
}

#[test]
fn response_delivers_answered_positions_and_fails_the_rest() {
    let mut b = reads(4);
    for h in [10, 11, 12] {
        op(&mut b, 1, h, 0);
    }
    b.flush(T0);
    let credit = take_sends(&mut b)[0].1;
    assert_eq!(
        b.handle_response(T0, credit, [2, 0, 0, 99, usize::MAX]),
        Ok(())
    );
    assert_eq!(
        drain(&mut b),
        [
            BatchAction::Deliver {
                handle: 10,
                position: 0
            },
            BatchAction::Fail {
                handle: 11,
                reason: FailReason::NoResponse
            },
            BatchAction::Deliver {
                handle: 12,
                position: 2
            },
        ]
    );
    assert_eq!(b.batch(credit), None);
}

#[test]
fn failed_batch_fails_exactly_its_operations() {
    let mut b = batcher(BatcherConfig::reads().with_max_requests_per_batch(nz(2)));
    for h in 0..4 {
        op(&mut b, 1, h, 0);
    }
    let got = take_sends(&mut b);
    assert_eq!(got.len(), 2);
    assert_eq!(b.handle_failure(T0, got[1].1, ()), Ok(()));
    assert_eq!(
        drain(&mut b),
        [
            BatchAction::Fail {
                handle: 2,
                reason: FailReason::BatchFailed(())
            },
            BatchAction::Fail {
                handle: 3,
                reason: FailReason::BatchFailed(())
            },
        ]
    );
    assert_eq!(
        b.batch(got[0].1).map(|x| x.ops().to_vec()),
        Some(vec![0, 1])
    );
}

#[test]
fn close_fails_held_back_operations_and_leaves_in_flight_ones() {
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(2))
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap(),
    );
    for h in 0..5 {
        op(&mut b, 1, h, 0); // [0,1] sent, [2,3] queued, [4] parked after flush
    }
    b.flush(T0);
    let sent = take_sends(&mut b);
    op(&mut b, 2, 9, 0); // open, never flushed (nor drained)
    b.close();
    let failed: Vec<u32> = drain(&mut b)
        .into_iter()
        .map(|a| match a {
            BatchAction::Fail {
                handle,
                reason: FailReason::Closed,
            } => handle,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(failed, [2, 3, 4, 9], "held back: queued, parked, then open");
    assert!(b.is_closed());
    assert_eq!(
        b.handle_op(T0, 1, 42, 0),
        Err(Refused::new(42, RefuseReason::Closed))
    );
    assert_eq!(b.handle_response(T0, sent[0].1, [0, 1]), Ok(()));
    assert_eq!(
        drain(&mut b),
        [
            BatchAction::Deliver {
                handle: 0,
                position: 0
            },
            BatchAction::Deliver {
                handle: 1,
                position: 1
            }
        ]
    );
    assert_eq!((b.window().shard_count(), b.open_batches()), (0, 0));
}

#[test]
fn double_bogus_and_after_close_completions_end_nothing() {
    let mut b = reads(2);
    op(&mut b, 1, 1, 0);
    b.flush(T0);
    op(&mut b, 1, 2, 0);
    b.flush(T0);
    let got = take_sends(&mut b);
    assert_eq!(b.handle_failure(T0, got[0].1, ()), Ok(()));
    drain(&mut b);
    assert_eq!(
        b.handle_failure(T0, got[0].1, ()),
        Err(ReleaseError::AlreadyReleased)
    );
    assert_eq!(
        b.handle_response(T0, got[0].1, [0]),
        Err(ReleaseError::AlreadyReleased)
    );
    assert_eq!(
        b.handle_response(T0, CreditId::forge(b.window.instance_tag(), 5, 77), [0]),
        Err(ReleaseError::Unknown)
    );
    assert!(drain(&mut b).is_empty());
    assert_eq!(b.window().in_flight(&1), 1);
    b.close();
    assert_eq!(b.handle_response(T0, got[1].1, [0]), Ok(()));
    assert_eq!(
        drain(&mut b),
        [BatchAction::Deliver {
            handle: 2,
            position: 0
        }]
    );
    assert_eq!(
        b.handle_response(T0, got[1].1, [0]),
        Err(ReleaseError::AlreadyReleased)
    );
    assert!(drain(&mut b).is_empty());
}

#[test]
fn exhausted_shard_never_delays_another() {
    let mut b = reads(1);
    op(&mut b, 1, 1, 0);
    b.flush(T0);
    op(&mut b, 1, 2, 0);
    op(&mut b, 2, 3, 0);
    b.flush(T0);
    let got = take_sends(&mut b);
    assert_eq!(got.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(b.handle_response(T0, got[1].1, [0]), Ok(()));
    assert!(
        take_sends(&mut b).is_empty(),
        "shard 2's release does not send shard 1's batch"
    );
    assert!(b.window().is_parked(&1));
}

#[test]
#[cfg_attr(miri, ignore)]
fn idle_shards_leave_no_state() {
    let mut b = reads(4);
    for shard in 0..10_000u32 {
        op(&mut b, shard, shard, 0);
        b.flush(T0);
        let credit = take_sends(&mut b)[0].1;
        assert_eq!(b.handle_response(T0, credit, [0]), Ok(()));
        drain(&mut b);
    }
    assert_eq!(
        (
            b.window().shard_count(),
            b.open_batches(),
            b.window().live_credits()
        ),
        (0, 0, 0)
    );
    assert!(b.sent.len() <= 1 && b.open.capacity() <= 32);
}

/// One operation for each of `shards` shards, a flush, and a response to every batch.
fn round(b: &mut B, shards: u32) {
    for s in 0..shards {
        op(b, s, s, 10);
    }
    b.flush(T0);
    for (_, credit, _) in take_sends(b) {
        assert_eq!(b.handle_response(T0, credit, [0]), Ok(()));
        assert!(take_sends(b).is_empty());
    }
    assert_eq!((b.window().live_credits(), b.open_batches()), (0, 0));
}

fn secs(n: u64) -> Instant {
    Instant::from_millis(n * 1000)
}

#[test]
fn spare_buffers_follow_the_peak_number_of_batches_in_use() {
    let mut b = reads(4);
    round(&mut b, 32);
    assert_eq!(
        (b.spare_ops.len(), b.ops_out),
        (32, 0),
        "every buffer comes back: a round of 32 batches reuses all 32 next time"
    );
    round(&mut b, 12);
    assert_eq!(b.spare_ops.len(), 32, "only maintenance drops spares");
    b.handle_timeout(secs(1));
    assert_eq!(b.spare_ops.len(), 32, "the period that ended had 32 in use");
    round(&mut b, 12);
    b.handle_timeout(secs(2));
    assert_eq!(b.spare_ops.len(), 12, "now the recent peak is 12");
    b.handle_timeout(secs(3));
    assert!(b.spare_ops.is_empty(), "a quiet period gives them all back");
    assert_eq!(b.poll_timeout(), None);
}

#[test]
#[cfg_attr(miri, ignore)] // slow under miri; runs in the ordinary test pass
fn flush_keeps_open_map_capacity_until_maintenance_after_a_quiet_period() {
    let mut b = reads(4);
    round(&mut b, 300);
    let cap = b.open.capacity();
    assert!(cap >= 300, "flush no longer shrinks the open map");
    round(&mut b, 300);
    assert_eq!(b.open.capacity(), cap, "the next round reuses it");
    assert_eq!(b.poll_timeout(), Some(secs(1)));
    b.handle_timeout(secs(1));
    assert_eq!(b.open.capacity(), cap);
    b.handle_timeout(secs(2));
    assert!(b.open.capacity() <= 32 && b.open_list.capacity() <= 32);
    assert!(b.spare_ops.is_empty() && b.sent.is_empty());
    assert!(b.actions.capacity() <= 32);
    assert_eq!(b.window().shard_count(), 0);
    assert_eq!(b.poll_timeout(), None, "window and batcher both quiet");
}

#[test]
fn maintenance_leaves_open_parked_and_in_flight_operations_alone() {
    let mut b = reads(1);
    op(&mut b, 1, 1, 0);
    b.flush(T0);
    let first = take_sends(&mut b);
    op(&mut b, 1, 2, 0);
    b.flush(T0); // parked
    op(&mut b, 2, 3, 0); // open, not flushed
    for t in 1..5 {
        b.handle_timeout(secs(t));
    }
    assert_eq!(
        (b.open_ops(&1), b.open_ops(&2), b.open_batches()),
        (1, 1, 1)
    );
    assert!(b.window().is_parked(&1));
    assert_eq!(
        b.poll_timeout(),
        None,
        "no input since: nothing more to give back"
    );
    assert_eq!(b.handle_response(secs(5), first[0].1, [0]), Ok(()));
    assert_eq!(
        b.poll_timeout(),
        Some(secs(5)),
        "an input schedules maintenance again"
    );
    let a = drain(&mut b);
    assert_eq!(
        a[0],
        BatchAction::Deliver {
            handle: 1,
            position: 0
        }
    );
    assert_eq!(sends(&b, &a).first().map(|s| s.2.clone()), Some(vec![2]));
}

#[test]
fn backwards_time_and_extreme_limits_are_defined() {
    let mut b = batcher(
        BatcherConfig::writes()
            .with_max_requests_per_batch(NonZeroUsize::MAX)
            .with_max_batch_bytes(NonZeroU64::MAX),
    );
    assert!(b.handle_op(Instant::MAX, 1, 1, u64::MAX).is_ok()); // exactly the limit: full
    assert!(b.handle_op(Instant::from_nanos(5), 1, 2, u64::MAX).is_ok());
    b.flush(Instant::ZERO);
    let got = take_sends(&mut b);
    assert_eq!(got.len(), 2);
    let stamps: Vec<Instant> = got
        .iter()
        .filter_map(|s| b.batch(s.1))
        .map(Batch::opened_at)
        .collect();
    assert_eq!(
        stamps,
        [Instant::MAX, Instant::MAX],
        "time running backwards is clamped"
    );
}

/// A payload type with no `Clone`: only a move can hand it over.
#[derive(Debug, PartialEq, Eq)]
struct Request(u32);

type PB = Batcher<u32, u32, TestHasher, Request, Shared>;

/// An error that counts its copies.
#[derive(Debug, PartialEq, Eq)]
struct Shared {
    id: u32,
    clones: alloc::rc::Rc<core::cell::Cell<u32>>,
}

impl Clone for Shared {
    fn clone(&self) -> Self {
        assert_ne!(self.id, 666, "this error's clone panics");
        self.clones.set(self.clones.get() + 1);
        Shared {
            id: self.id,
            clones: alloc::rc::Rc::clone(&self.clones),
        }
    }
}

fn payload_batcher(max_ops: usize, in_flight: u32) -> PB {
    PB::new(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(max_ops))
            .with_window(WindowConfig::default().with_max_in_flight(in_flight as usize))
            .unwrap(),
    )
}

fn payload_op(b: &mut PB, shard: u32, h: u32) -> OpId {
    match b.handle_op_with_payload(T0, shard, h, Request(100 + h), 0) {
        Ok(id) => id,
        Err(e) => panic!("refused: {e:?}"),
    }
}

#[test]
fn a_sent_batch_hands_its_payloads_over_by_value_and_keeps_the_handles() {
    let mut b = payload_batcher(3, 1);
    for h in 1..=4 {
        payload_op(&mut b, 1, h);
    }
    let withdrawn = payload_op(&mut b, 1, 5);
    assert_eq!(
        b.cancel_with_payload(withdrawn),
        Ok(Withdrawal::Withdrawn((5, Request(105)))),
        "a withdrawal hands both back"
    );
    let Some(BatchAction::Send {
        shard: 1,
        credit,
        payloads,
    }) = b.poll_action()
    else {
        panic!("the full batch is sent");
    };
    assert_eq!(payloads, [Request(101), Request(102), Request(103)]);
    assert_eq!(
        b.batch(credit).map(|x| x.ops().to_vec()),
        Some(vec![1, 2, 3]),
        "the handles stay, by position"
    );
    assert_eq!(b.poll_action(), None, "[4] parked: no credit");
    assert_eq!(b.handle_response(T0, credit, [0, 2]), Ok(()));
    let a: Vec<_> = core::iter::from_fn(|| b.poll_action()).collect();
    assert!(matches!(
        &a[..],
        [
            BatchAction::Deliver {
                handle: 1,
                position: 0
            },
            BatchAction::Fail {
                handle: 2,
                reason: FailReason::NoResponse
            },
            BatchAction::Deliver {
                handle: 3,
                position: 2
            },
            BatchAction::Send { payloads, .. },
        ] if payloads[..] == [Request(104)]
    ));
    assert_eq!(
        b.handle_op_with_payload(T0, 1, 9, Request(9), 0).map(drop),
        Ok(())
    );
    b.close();
    assert_eq!(
        b.handle_op_with_payload(T0, 1, 10, Request(10), 0),
        Err(Refused::new((10, Request(10)), RefuseReason::Closed)),
        "a refusal hands both back"
    );
}

#[test]
fn a_failed_batch_hands_each_operation_its_own_copy_of_the_error() {
    let mut b = payload_batcher(10, 4);
    for h in 1..=3 {
        payload_op(&mut b, 1, h);
    }
    let Some(BatchAction::Send { credit, .. }) = b.poll_action() else {
        panic!("sent");
    };
    let clones = alloc::rc::Rc::new(core::cell::Cell::new(0));
    let error = |id| Shared {
        id,
        clones: alloc::rc::Rc::clone(&clones),
    };
    // A clone that panics: the failure did not happen, and can be reported again.
    let before = format!("{b:?}");
    let caught = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
        b.handle_failure(T0, credit, error(666))
    }));
    assert!(caught.is_err());
    assert_eq!(format!("{b:?}"), before, "unchanged by the panicking clone");
    assert_eq!(b.handle_failure(T0, credit, error(7)), Ok(()));
    assert_eq!(clones.get(), 2, "n - 1 copies for n operations");
    let got: Vec<(u32, Option<u32>)> = core::iter::from_fn(|| b.poll_action())
        .map(|a| match a {
            BatchAction::Fail { handle, reason } => (handle, reason.into_error().map(|e| e.id)),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(got, [(1, Some(7)), (2, Some(7)), (3, Some(7))]);
    assert_eq!(
        b.handle_failure(T0, credit, error(8)),
        Err(ReleaseError::AlreadyReleased)
    );
    assert_eq!(clones.get(), 2, "a refused failure copies nothing");
    assert_eq!(b.poll_action(), None);
}

/// The seed of item 3: an operation for an exhausted shard, then its credit returns, and
/// the caller never calls `flush`. Draining the actions (which it does anyway) parks the
/// open batch where the returning credit sends it.
#[test]
fn an_open_batch_is_not_stranded_by_a_forgotten_flush() {
    let mut b = reads(1);
    op(&mut b, 1, 1, 0);
    let first = take_sends(&mut b);
    assert_eq!(first.len(), 1, "a shard with credit: drained, so sent");
    op(&mut b, 1, 2, 0); // exhausted: open here, invisible to the window
    assert_eq!(b.open_batches(), 1);
    assert!(take_sends(&mut b).is_empty());
    assert!(b.window().is_parked(&1), "draining parked it");
    assert_eq!(b.handle_response(T0, first[0].1, [0]), Ok(()));
    let a = drain(&mut b);
    assert_eq!(
        sends(&b, &a).into_iter().map(|s| s.2).collect::<Vec<_>>(),
        [vec![2]],
        "the returning credit sends it, with no flush"
    );
}

#[test]
fn drain_refuses_new_operations_and_sends_everything_accepted_in_order() {
    // Shard 1: [0, 1] in flight, [2, 3] queued, [4] open; shard 2: [9] open.
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(2))
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap(),
    );
    for h in 0..5 {
        op(&mut b, 1, h, 0);
    }
    op(&mut b, 2, 9, 0);
    b.drain(T0);
    assert!(b.is_draining() && !b.is_closed() && !b.is_drained());
    assert_eq!(
        b.handle_op(T0, 1, 42, 0),
        Err(Refused::new(42, RefuseReason::Draining))
    );
    let mut sent: Vec<(u32, CreditId, Vec<u32>)> = take_sends(&mut b);
    let mut batches = Vec::new();
    while let Some((shard, credit, ops)) = sent.pop() {
        let n = ops.len();
        batches.push((shard, ops));
        assert_eq!(b.handle_response(T0, credit, 0..n), Ok(()));
        let a = drain(&mut b);
        assert!(
            a.iter().all(|x| !matches!(x, BatchAction::Fail { .. })),
            "nothing fails: {a:?}"
        );
        sent.extend(sends(&b, &a));
    }
    batches.sort_by_key(|(shard, _)| *shard);
    assert_eq!(
        batches,
        [(1, vec![0, 1]), (1, vec![2, 3]), (1, vec![4]), (2, vec![9])]
    );
    assert!(b.is_drained());
    b.close();
    assert!(
        b.is_drained() && b.poll_action().is_none(),
        "nothing left to fail"
    );
}

#[test]
fn close_fails_each_shards_held_operations_in_arrival_order() {
    // [0, 1] in flight, [2, 3] queued, [4] open and never drained: Oxia's `fail_all` would
    // fail 4 first; this close fails in arrival order.
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(2))
            .with_window(WindowConfig::default().with_max_in_flight(1))
            .unwrap(),
    );
    for h in 0..5 {
        op(&mut b, 1, h, 0);
    }
    assert_eq!(b.open_batches(), 1);
    b.close();
    let failed: Vec<u32> = drain(&mut b)
        .into_iter()
        .filter_map(|a| match a {
            BatchAction::Fail {
                handle,
                reason: FailReason::Closed,
            } => Some(handle),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [2, 3, 4]);
}

#[test]
fn running_out_of_credit_ids_fails_held_operations_and_closes() {
    let mut b = reads(1);
    b.window.skip_generations_to(u64::MAX - 1);
    op(&mut b, 1, 1, 0);
    b.flush(T0);
    let last = take_sends(&mut b)[0].1;
    op(&mut b, 1, 2, 0);
    b.flush(T0); // parked
    assert_eq!(b.handle_response(T0, last, [0]), Ok(()));
    assert_eq!(
        drain(&mut b),
        [
            BatchAction::Deliver {
                handle: 1,
                position: 0
            },
            BatchAction::Fail {
                handle: 2,
                reason: FailReason::Closed
            },
        ]
    );
    assert!(b.is_closed());
    assert_eq!(
        b.handle_op(T0, 1, 3, 0),
        Err(Refused::new(3, RefuseReason::Closed))
    );
    assert_eq!((b.window().shard_count(), b.open_batches()), (0, 0));
}

#[test]
fn another_batchers_credit_is_unknown_and_ends_nothing() {
    let mut one = reads(1);
    let mut two = reads(1);
    op(&mut one, 1, 1, 0);
    one.flush(T0);
    let mine = take_sends(&mut one)[0].1;
    op(&mut two, 1, 9, 0);
    two.flush(T0);
    let theirs = take_sends(&mut two)[0].1;
    assert_eq!(
        (theirs.slot(), theirs.generation()),
        (mine.slot(), mine.generation())
    );
    assert_eq!(
        one.handle_response(T0, theirs, [0]),
        Err(ReleaseError::Unknown)
    );
    assert_eq!(
        one.handle_failure(T0, theirs, ()),
        Err(ReleaseError::Unknown)
    );
    assert_eq!(drain(&mut one), [], "nothing delivered or failed");
    assert_eq!(one.window().live_credits(), 1);
    assert_eq!(one.handle_response(T0, mine, [0]), Ok(()));
}

/// A write batcher cutting batches at `max_ops` operations, `in_flight` per shard.
fn writes(max_ops: usize, in_flight: usize) -> B {
    batcher(
        BatcherConfig::writes()
            .with_max_requests_per_batch(nz(max_ops))
            .with_max_in_flight(nz(in_flight)),
    )
}

/// The handles of each batch sent, in send order.
fn sent_ops(b: &mut B) -> Vec<Vec<u32>> {
    take_sends(b).into_iter().map(|(_, _, ops)| ops).collect()
}

#[test]
fn torn_batches_are_requeued_at_the_head_and_resent_in_order_after_resume() {
    // The Rust Oxia client's torn-stream case (oxia-db/oxia-client-rust: a write stream that
    // breaks puts its unacknowledged requests back in front of the shard's pending ones and
    // sends them again once reconnected): writes of keys 1, 1, 1 and then 2, 2, 2 on one
    // shard must reach the server in that order after the stream tears and reconnects.
    // Handles 11, 12, 13 are the writes of key 1, 21, 22, 23 those of key 2. Four batches in
    // flight per shard, so both batches are on the wire when the stream tears.
    let mut b = writes(3, 4);
    let ids: Vec<OpId> = [11, 12, 13, 21, 22, 23]
        .into_iter()
        .map(|h| op_id(&mut b, 5, h, 1))
        .collect();
    let sent = take_sends(&mut b);
    assert_eq!(sent.len(), 2, "both batches in flight");
    let (c1, c2) = (sent[0].1, sent[1].1);
    assert_eq!(sent[0].2, [11, 12, 13]);
    assert_eq!(sent[1].2, [21, 22, 23]);
    // The stream tears: pause the shard (reconnect backoff) and requeue both torn batches,
    // the later one first, to show the order does not depend on the calls'.
    b.pause(5);
    assert_eq!(b.requeue(T0, c2), Ok(()));
    assert_eq!(b.requeue(T0, c1), Ok(()));
    // Each credit is released exactly once: by the requeue.
    assert_eq!(b.window().live_credits(), 0);
    assert_eq!(b.requeue(T0, c1), Err(ReleaseError::AlreadyReleased));
    assert_eq!(
        b.handle_response(T0, c2, [0, 1, 2]),
        Err(ReleaseError::AlreadyReleased)
    );
    // New writes while paused queue behind them; nothing leaves.
    for h in [31, 32, 33] {
        op(&mut b, 5, h, 1);
    }
    assert!(drain(&mut b).is_empty(), "paused: nothing is sent");
    assert_eq!(b.window().queued(&5), 3);
    // Reconnected: the torn batches go first, in their first order, then the new one.
    b.resume(T0, 5);
    assert_eq!(
        sent_ops(&mut b),
        [vec![11, 12, 13], vec![21, 22, 23], vec![31, 32, 33]]
    );
    // The operations kept their ids: the batch has left again, so cancel is too late.
    assert_eq!(b.cancel(ids[0]), Ok(Withdrawal::TooLate));
}

#[test]
fn a_requeued_batch_keeps_its_op_ids_and_waits_at_the_head_until_resume() {
    let mut b = writes(2, 2);
    let a = op_id(&mut b, 1, 1, 1);
    let a2 = op_id(&mut b, 1, 2, 1);
    let sent = take_sends(&mut b);
    let c = sent[0].1;
    b.pause(1);
    op(&mut b, 1, 3, 1);
    op(&mut b, 1, 4, 1); // a full batch [3, 4] queued
    op(&mut b, 1, 5, 1); // open, then parked
    assert!(drain(&mut b).is_empty());
    b.requeue(T0, c).unwrap();
    // Withdrawing by the old id works while it waits.
    assert_eq!(b.cancel(a), Ok(Withdrawal::Withdrawn(1)));
    b.resume(T0, 1);
    assert_eq!(sent_ops(&mut b), [vec![2], vec![3, 4]]);
    assert_eq!(b.cancel(a2), Ok(Withdrawal::TooLate));
    assert_eq!(b.open_ops(&1), 1, "the parked batch waits for a credit");
}

#[test]
fn requeue_without_a_pause_resends_at_once_and_after_close_fails_the_operations() {
    let mut b = writes(1, 1);
    op(&mut b, 1, 1, 1);
    op(&mut b, 1, 2, 1);
    let sent = take_sends(&mut b);
    assert_eq!(sent.len(), 1);
    b.requeue(T0, sent[0].1).unwrap();
    // The freed credit goes to the head of the line: the requeued batch, before [2].
    let again = take_sends(&mut b);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].2, [1]);
    // Draining still resends a torn batch.
    b.drain(T0);
    b.requeue(T0, again[0].1).unwrap();
    let third = take_sends(&mut b);
    assert_eq!(third[0].2, [1]);
    // After close a torn batch fails instead.
    b.close();
    let _ = drain(&mut b); // [2] fails as Closed
    b.requeue(T0, third[0].1).unwrap();
    assert_eq!(
        drain(&mut b),
        [BatchAction::Fail {
            handle: 1,
            reason: FailReason::Closed
        }]
    );
    assert!(b.is_drained());
}

#[test]
fn a_paused_shard_batches_on_and_other_shards_are_not_held() {
    let mut b = reads(1);
    b.pause(1);
    op(&mut b, 1, 1, 0);
    op(&mut b, 2, 2, 0);
    assert_eq!(sent_ops(&mut b), [vec![2]], "only shard 2 leaves");
    op(&mut b, 1, 3, 0);
    assert!(drain(&mut b).is_empty());
    assert_eq!(b.open_ops(&1), 2, "the parked batch kept growing");
    assert!(b.is_paused(&1));
    b.resume(T0, 1);
    assert_eq!(sent_ops(&mut b), [vec![1, 3]]);
    // Close after a pause fails what is held, in order.
    b.pause(1);
    op(&mut b, 1, 4, 0);
    let _ = drain(&mut b);
    b.close();
    assert_eq!(
        drain(&mut b),
        [BatchAction::Fail {
            handle: 4,
            reason: FailReason::Closed
        }]
    );
}

#[test]
fn reject_refuses_an_operation_larger_than_the_batch_limit_at_once() {
    // oxia-db/oxia-client-rust, oxia-client/src/batcher.rs test
    // `oversized_write_is_rejected_before_batching`: max_batch_size 16, a 64-byte put fails
    // with RequestTooLarge and nothing is queued or dispatched. Oxia's check is
    // `size > max_batch_size`, so an operation of exactly the limit is taken.
    let cfg = BatcherConfig::writes()
        .with_max_batch_bytes(nzb(16))
        .with_oversized(Oversized::Reject);
    let mut b = batcher(cfg);
    assert_eq!(
        b.handle_op(T0, 1, 1, 64),
        Err(Refused::new(
            1,
            RefuseReason::TooLarge {
                bytes: 64,
                limit: 16
            }
        ))
    );
    assert!(drain(&mut b).is_empty(), "nothing queued or sent");
    assert_eq!((b.open_batches(), b.window().shard_count()), (0, 0));
    op(&mut b, 1, 2, 16); // exactly the limit: taken, a full batch
    assert_eq!(sent_ops(&mut b), [vec![2]]);
    // Reads have no byte limit: the option does not apply.
    let mut r = batcher(
        BatcherConfig::reads()
            .with_max_batch_bytes(nzb(16))
            .with_oversized(Oversized::Reject),
    );
    assert!(r.handle_op(T0, 1, 3, 64).is_ok());
}

#[test]
fn torn_batches_requeued_in_send_order_keep_it_too() {
    // As the Oxia case above, the torn batches requeued in the order they were sent.
    let mut b = writes(3, 4);
    for h in [11, 12, 13, 21, 22, 23] {
        op(&mut b, 5, h, 1);
    }
    let sent = take_sends(&mut b);
    b.pause(5);
    b.requeue(T0, sent[0].1).unwrap();
    b.requeue(T0, sent[1].1).unwrap();
    b.resume(T0, 5);
    assert_eq!(sent_ops(&mut b), [vec![11, 12, 13], vec![21, 22, 23]]);
}

/// Operation timeouts (issue 15 item 6). The Oxia Java client gives every read and write a
/// request timeout, 30 s by default (streamnative/oxia-java, `OxiaClientBuilder`
/// `DefaultRequestTimeout`), and fails a timed-out operation with a timeout error.
mod op_timeout {
    use super::*;

    const OXIA: Duration = Duration::from_secs(30);

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    fn timed(max_in_flight: u32, max_ops: usize, timeout: Duration) -> B {
        batcher(
            BatcherConfig::reads()
                .with_max_requests_per_batch(nz(max_ops))
                .with_window(WindowConfig::default().with_max_in_flight(max_in_flight as usize))
                .unwrap()
                .with_op_timeout(timeout),
        )
    }

    fn add(b: &mut B, at: u64, shard: u32, handle: u32) -> OpId {
        match b.handle_op(ms(at), shard, handle, 0) {
            Ok(id) => id,
            Err(e) => panic!("refused: {e:?}"),
        }
    }

    fn timed_out(actions: &[Action]) -> Vec<u32> {
        actions
            .iter()
            .filter_map(|a| match a {
                BatchAction::Fail {
                    handle,
                    reason: FailReason::TimedOut,
                } => Some(*handle),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn held_operations_fail_at_their_own_deadlines_and_a_sent_batch_carries_its_oldest() {
        // One batch in flight on shard 1 (window 1); 2 and 3 held behind it, accepted 10 s
        // apart, so they time out 10 s apart, each at acceptance + 30 s.
        let mut b = timed(1, 1000, OXIA);
        add(&mut b, 0, 1, 1);
        let [(_, first, _)] = take_sends(&mut b)[..] else {
            panic!("one send")
        };
        assert_eq!(b.batch(first).and_then(Batch::deadline), Some(ms(30_000)));
        add(&mut b, 5_000, 1, 2);
        add(&mut b, 15_000, 1, 3);
        assert!(take_sends(&mut b).is_empty(), "no credit: parked");
        assert!(b.poll_timeout().is_some_and(|t| t <= ms(30_000)));
        // The in-flight batch's deadline is the caller's to enforce: nothing ends at 30 s but
        // the queue entry.
        b.handle_timeout(ms(30_000));
        assert_eq!(drain(&mut b), []);
        b.handle_timeout(ms(34_999));
        assert_eq!(drain(&mut b), [], "2 is due at 35 s, not before");
        b.handle_timeout(ms(35_000));
        assert_eq!(timed_out(&drain(&mut b)), [2]);
        assert_eq!(b.open_ops(&1), 1, "3 stays, parked");
        b.handle_timeout(ms(45_000));
        assert_eq!(timed_out(&drain(&mut b)), [3]);
        assert_eq!(b.open_ops(&1), 0);
        assert!(!b.window().is_parked(&1), "the emptied batch is dropped");
        // The late answer for 1 releases the credit; nothing is left to send.
        b.handle_response(ms(50_000), first, [0]).unwrap();
        let after = drain(&mut b);
        assert!(
            matches!(after[..], [BatchAction::Deliver { handle: 1, .. }]),
            "{after:?}"
        );
        assert_eq!(b.window().shard_count(), 0);
    }

    #[test]
    fn a_queued_batch_loses_only_its_expired_operations_and_keeps_its_turn() {
        // Batches of 2: [1] in flight, [2, 3] queued (3 accepted 20 s after 2), [4] parked.
        let mut b = timed(1, 2, OXIA);
        add(&mut b, 0, 7, 1);
        b.flush(ms(0));
        let [(_, c1, _)] = take_sends(&mut b)[..] else {
            panic!("one send")
        };
        add(&mut b, 1_000, 7, 2);
        add(&mut b, 21_000, 7, 3);
        add(&mut b, 22_000, 7, 4);
        assert!(take_sends(&mut b).is_empty());
        assert_eq!(b.window().queued(&7), 1);
        b.handle_timeout(ms(31_000));
        assert_eq!(timed_out(&drain(&mut b)), [2]);
        b.handle_response(ms(31_000), c1, [0]).unwrap();
        let next = take_sends(&mut b);
        assert_eq!(
            next.iter().map(|s| s.2.clone()).collect::<Vec<_>>(),
            [vec![3]]
        );
        assert_eq!(
            b.batch(next[0].1).and_then(Batch::deadline),
            Some(ms(51_000))
        );
    }

    #[test]
    fn every_operation_ends_once_whether_it_times_out_is_cancelled_or_answered() {
        let mut b = timed(1, 1000, Duration::from_millis(10));
        add(&mut b, 0, 1, 1);
        let [(_, c, _)] = take_sends(&mut b)[..] else {
            panic!("one send")
        };
        let two = add(&mut b, 1, 1, 2);
        add(&mut b, 2, 1, 3);
        assert_eq!(b.cancel(two), Ok(Withdrawal::Withdrawn(2)));
        b.handle_timeout(ms(100));
        assert_eq!(
            timed_out(&drain(&mut b)),
            [3],
            "2 was withdrawn: it does not end again"
        );
        b.handle_response(ms(100), c, [0]).unwrap();
        assert_eq!(drain(&mut b).len(), 1);
        b.handle_timeout(ms(200));
        assert_eq!(drain(&mut b), []);
    }

    #[test]
    fn a_requeued_batch_past_its_deadline_times_out_instead_of_going_out_again() {
        let mut b = timed(4, 1, OXIA);
        add(&mut b, 0, 1, 1);
        add(&mut b, 20_000, 1, 2);
        let sent = take_sends(&mut b);
        let [(_, c1, _), (_, c2, _)] = sent[..] else {
            panic!("two sends: {sent:?}")
        };
        // Both deadlines pass while in flight (the queue drops their entries), then the
        // stream tears.
        b.handle_timeout(ms(31_000));
        assert_eq!(drain(&mut b), []);
        b.pause(1);
        b.requeue(ms(40_000), c1).unwrap();
        b.requeue(ms(40_000), c2).unwrap();
        assert_eq!(
            b.poll_timeout().map(|t| t <= ms(40_000)),
            Some(true),
            "1 is due"
        );
        b.handle_timeout(ms(40_000));
        assert_eq!(timed_out(&drain(&mut b)), [1], "2 is due at 50 s");
        b.resume(ms(41_000), 1);
        let again = take_sends(&mut b);
        assert_eq!(
            again.iter().map(|s| s.2.clone()).collect::<Vec<_>>(),
            [vec![2]]
        );
    }

    #[test]
    fn the_deadline_queue_stays_near_the_operations_held() {
        // 10,000 operations, each answered at once: the queue keeps about twice what is held
        // (here one), not one entry per operation ever accepted.
        let mut b = timed(4, 1000, OXIA);
        // Under miri, 150 (past a sweep of the 64-entry minimum): each step is slow there.
        let n = if cfg!(miri) { 150 } else { 10_000u32 };
        for h in 0..n {
            add(&mut b, u64::from(h), 1, h);
            for (_, c, _) in take_sends(&mut b) {
                b.handle_response(ms(u64::from(h)), c, [0]).unwrap();
            }
            assert!(
                b.timers.len() <= 2 * TIMERS_MIN,
                "{} entries",
                b.timers.len()
            );
        }
        // Stale entries never hold back the timer: after a run nothing due remains.
        b.handle_timeout(ms(u64::from(n)));
        assert!(b.timers.is_empty());
    }

    #[test]
    fn withdrawals_from_a_batch_still_held_do_not_grow_the_deadline_queue() {
        // One operation parked for ever (no timeout passes), and 10,000 more that join its
        // batch and are withdrawn at once: the queue keeps the live ones, not every one
        // ever accepted (a sweep judges each operation, not its batch).
        let mut b = timed(1, 1_000_000, Duration::MAX);
        add(&mut b, 0, 1, 0);
        let _ = take_sends(&mut b);
        add(&mut b, 0, 1, 1);
        b.flush(ms(0));
        let n = if cfg!(miri) { 150 } else { 10_000u32 };
        for h in 2..n + 2 {
            let id = add(&mut b, u64::from(h), 1, h);
            assert_eq!(b.cancel(id), Ok(Withdrawal::Withdrawn(h)));
            assert!(
                b.timers.len() <= 2 * TIMERS_MIN,
                "{} entries",
                b.timers.len()
            );
        }
        assert_eq!(b.open_ops(&1), 1);
    }

    #[test]
    fn an_answer_after_a_deadline_passed_does_not_send_the_overdue_operation() {
        // Window 1: A in flight, B and C held (C 20 s younger). A's answer comes at 35 s,
        // past B's deadline (31 s): with `handle_timeout` run first, as the contract says
        // when `poll_timeout` has passed, B times out and only C leaves, with its own
        // deadline.
        let mut b = timed(1, 1000, OXIA);
        add(&mut b, 0, 1, 1);
        let [(_, a, _)] = take_sends(&mut b)[..] else {
            panic!("one send")
        };
        add(&mut b, 1_000, 1, 2);
        add(&mut b, 21_000, 1, 3);
        b.flush(ms(21_000));
        assert!(b.poll_timeout().is_some_and(|t| t <= ms(35_000)));
        b.handle_timeout(ms(35_000));
        b.handle_response(ms(35_000), a, [0]).unwrap();
        let actions = drain(&mut b);
        assert_eq!(timed_out(&actions), [2]);
        let sent = sends(&b, &actions);
        assert_eq!(
            sent.iter().map(|s| s.2.clone()).collect::<Vec<_>>(),
            [vec![3]]
        );
        assert_eq!(
            b.batch(sent[0].1).and_then(Batch::deadline),
            Some(ms(51_000))
        );
        // A flush past a deadline times out instead of sending, without `handle_timeout`.
        add(&mut b, 52_000, 2, 4);
        b.flush(ms(82_000));
        assert_eq!(timed_out(&drain(&mut b)), [4]);
    }

    #[test]
    fn without_a_timeout_nothing_times_out_or_allocates_deadlines() {
        let mut b = reads(1);
        op(&mut b, 1, 1, 0);
        let _ = take_sends(&mut b);
        op(&mut b, 1, 2, 0);
        b.flush(T0);
        b.handle_timeout(Instant::MAX);
        assert_eq!(timed_out(&drain(&mut b)), []);
        assert!(b.timers.is_empty() && b.spare_deadlines.is_empty());
        assert_eq!(
            b.open_ops(&1),
            1,
            "2 waits, parked, for as long as it takes"
        );
    }

    #[test]
    fn close_fails_held_operations_as_closed_not_timed_out() {
        let mut b = timed(1, 1000, Duration::from_millis(5));
        add(&mut b, 0, 1, 1);
        let _ = take_sends(&mut b);
        add(&mut b, 1, 1, 2);
        b.close();
        b.handle_timeout(ms(100));
        let ends = drain(&mut b);
        assert!(
            matches!(
                ends[..],
                [BatchAction::Fail {
                    handle: 2,
                    reason: FailReason::Closed
                }]
            ),
            "{ends:?}"
        );
    }
}

#[test]
fn batch_events_name_each_sent_batch_with_its_size_and_each_release() {
    let mut b = reads(1);
    op(&mut b, 1, 1, 10);
    b.flush(T0);
    let first = take_sends(&mut b);
    assert_eq!(b.poll_event(), None, "off by default");
    b.set_event_capacity(8);
    op(&mut b, 1, 2, 20);
    op(&mut b, 1, 3, 5);
    b.flush(T0);
    assert!(
        take_sends(&mut b).is_empty(),
        "parked behind the one in flight"
    );
    assert_eq!(b.handle_response(T0, first[0].1, [0]), Ok(()));
    let second = take_sends(&mut b);
    assert_eq!(second.len(), 1);
    assert_eq!(b.requeue(T0, second[0].1), Ok(()));
    let third = take_sends(&mut b);
    assert_eq!(third[0].2, [2, 3], "resent at once: not paused");
    let events: Vec<_> = core::iter::from_fn(|| b.poll_event()).collect();
    assert_eq!(
        events,
        [
            BatchEvent::Released {
                credit: first[0].1,
                in_flight: 1
            },
            BatchEvent::Dispatched {
                shard: 1,
                credit: second[0].1,
                ops: 2,
                bytes: 25
            },
            BatchEvent::Released {
                credit: second[0].1,
                in_flight: 1
            },
            BatchEvent::Dispatched {
                shard: 1,
                credit: third[0].1,
                ops: 2,
                bytes: 25
            },
        ]
    );
    b.set_event_capacity(0);
    assert_eq!(b.handle_response(T0, third[0].1, [0, 1]), Ok(()));
    assert_eq!(b.poll_event(), None, "off again");
}

#[test]
fn a_resume_reports_every_batch_it_sends_in_send_order() {
    let mut b = batcher(
        BatcherConfig::reads()
            .with_max_requests_per_batch(nz(1))
            .with_window(WindowConfig::default().with_max_in_flight(3))
            .unwrap(),
    );
    b.set_event_capacity(8);
    b.pause(7);
    for h in 1..=3 {
        op(&mut b, 7, h, u64::from(h));
    }
    b.flush(T0);
    assert!(take_sends(&mut b).is_empty(), "paused");
    b.resume(T0, 7);
    let sent = take_sends(&mut b);
    assert_eq!(sent.len(), 3);
    let events: Vec<_> = core::iter::from_fn(|| b.poll_event()).collect();
    let want: Vec<_> = sent
        .iter()
        .map(|(shard, credit, ops)| BatchEvent::Dispatched {
            shard: *shard,
            credit: *credit,
            ops: 1,
            bytes: u64::from(ops[0]),
        })
        .collect();
    assert_eq!(events, want);
}

#[test]
fn with_events_on_a_hand_on_copies_the_key_only_for_the_batcher_s_own_event() {
    use crate::test_key::{PanicKey, clones};
    // Clones made by the release that hands the credit to a queued batch, and by draining
    // that batch's `Send`.
    let hand_on = |events: bool| {
        let mut b: Batcher<PanicKey, u32, TestHasher> = Batcher::new(
            BatcherConfig::reads()
                .with_max_requests_per_batch(nz(1))
                .with_window(WindowConfig::default().with_max_in_flight(1))
                .unwrap(),
        );
        if events {
            b.set_event_capacity(8);
        }
        assert!(b.handle_op(T0, PanicKey(5), 1, 3).is_ok());
        assert!(b.handle_op(T0, PanicKey(5), 2, 3).is_ok());
        b.flush(T0);
        let first = loop {
            match b.poll_action() {
                Some(BatchAction::Send { credit, .. }) => break credit,
                Some(_) => {}
                None => panic!("the first batch is sent"),
            }
        };
        assert_eq!(b.poll_action(), None, "the second waits for the credit");
        let before = clones();
        assert_eq!(b.handle_response(T0, first, [0]), Ok(()));
        let sent = core::iter::from_fn(|| b.poll_action())
            .filter(|a| matches!(a, BatchAction::Send { .. }))
            .count();
        assert_eq!(sent, 1, "handed on");
        let dispatched = core::iter::from_fn(|| b.poll_event())
            .filter(|e| matches!(e, BatchEvent::Dispatched { .. }))
            .count();
        (clones() - before, dispatched)
    };
    let (off, recorded_off) = hand_on(false);
    let (on, recorded_on) = hand_on(true);
    assert_eq!(
        (recorded_off, recorded_on),
        (0, 2),
        "both dispatches recorded with events on"
    );
    // Only the batcher's own event copies the key; the window records no dispatch of its own.
    assert_eq!(on, off + 1, "off {off}, on {on}");
}

#[cfg(feature = "std")]
#[test]
fn a_panicking_clone_of_a_send_s_key_for_its_event_loses_only_the_event() {
    use crate::test_key::{Call, PanicKey, panics};
    let mut b: Batcher<PanicKey, u32, TestHasher> = Batcher::new(BatcherConfig::reads());
    b.set_event_capacity(4);
    assert!(b.handle_op(T0, PanicKey(5), 1, 3).is_ok());
    b.flush(T0);
    // The copy for the event is the only clone `poll_action` makes.
    assert!(panics(5, Call::Clone, 0, || {
        let _ = b.poll_action();
    }));
    let Some(BatchAction::Send { shard, credit, .. }) = b.poll_action() else {
        panic!("the Send is still queued after the panic");
    };
    assert_eq!(shard.0, 5);
    assert_eq!(b.poll_event(), None, "its event was lost");
    assert_eq!(b.events_dropped(), 1);
    assert_eq!(b.handle_response(T0, credit, [0]), Ok(()));
    assert!(matches!(
        b.poll_action(),
        Some(BatchAction::Deliver { handle: 1, .. })
    ));
    assert!(matches!(
        b.poll_event(),
        Some(BatchEvent::Released { credit: c, in_flight: 0 }) if c == credit
    ));
}
