//! The write driver: the end of a batch in flight (its send task answering, or dropped
//! unfinished), or the sender task's next drain, racing `close()` while a producer appends and
//! `closed()` is polled. The sender
//! task and the send tasks are taken from the [`TestRuntime`]'s queue and polled on the thread
//! the model gives them.

use alloc::vec::Vec;
use core::task::Poll;

use loom::thread;

use super::support::{
    delivered_once_closed, ends_at_once, ready_at_once, resolved, settle_all, spawned_one,
    woken_and_ready,
};
use super::{Hand, boxed, join};
use crate::Signal;
use crate::paced_writer::{FailCause, PacedWriterConfig, WriteOutcome};
use crate::sync::test_support::{Task, TestRuntime};
use crate::sync::{Append, SendBatch, WriteDriver, WriteError};
use crate::test_hasher::TestHasher;

type Driver = WriteDriver<TestRuntime, u32, u16, u32, u8, TestHasher>;

/// A driver whose server acks every batch at once (status 0).
fn acking_driver(rt: &TestRuntime) -> Driver {
    let send = |_node: u16, batches: Vec<SendBatch<u32, u32>>| {
        core::future::ready(alloc::vec![0u8; batches.len()])
    };
    let classify = |status: &u8| match status {
        0 => WriteOutcome::Ok {
            pressure: Signal::Clear,
        },
        _ => WriteOutcome::Fatal,
    };
    match Driver::with_hasher(
        rt.clone(),
        PacedWriterConfig::default(),
        send,
        classify,
        TestHasher::default(),
    ) {
        Ok(d) => d,
        Err(e) => panic!("valid config refused: {e}"),
    }
}

/// The writer models' start: an [`acking_driver`] whose sender task, polled, waits for input,
/// node 9 leading bucket 1, and a first record (10) appended there, not yet polled.
fn started() -> (TestRuntime, Driver, Hand<Task>, Hand<Append>) {
    let rt = TestRuntime::new();
    let driver = acking_driver(&rt);
    let mut sender = Hand::new(spawned_one(&rt));
    assert!(
        sender.poll().is_pending(),
        "the sender task waits for input"
    );
    driver.set_leader(1, Some(9));
    let first = Hand::new(driver.append(1, 10, 4));
    (rt, driver, sender, first)
}

/// The answer of the batch in flight (its send task polled on one thread) races `close` (on
/// another) while a second record is appended and `closed()` is polled on the main thread.
/// Every record's future resolves exactly once: the sent one `Ok`, the racing one `Ok` (never:
/// nothing sends it before the close), or `Failed(Closed)`; a `closed()` that was waiting, and
/// one first polled in the race, resolve only once the in-flight send has ended and delivered
/// its result, and the waiting one is woken; the sender task ends; no batch is left.
#[test]
fn writer_answer_racing_close_resolves_every_record_once_and_drains() {
    writer_end_racing_close(false);
}

/// As above, with the send task dropped unfinished (the runtime shutting down) instead of
/// answering: its guard ends the batch, the sent record fails with `NoResponse`, and
/// `closed()` still waits for that end.
#[test]
fn writer_send_task_dropped_racing_close_strands_no_record() {
    writer_end_racing_close(true);
}

/// The write driver model; `abandon`: drop the send task instead of polling it.
fn writer_end_racing_close(abandon: bool) {
    super::model(move || {
        let (rt, driver, mut sender, mut first) = started();
        assert!(first.poll().is_pending());
        assert!(
            sender.poll().is_pending(),
            "the sender sent and waits again"
        );
        let send = spawned_one(&rt); // the batch [10], in flight
        assert_eq!(driver.in_flight(), 1);
        let mut closed = Hand::new(boxed(driver.closed()));
        assert!(closed.poll().is_pending());

        let t1 = thread::spawn(move || {
            if abandon {
                drop(send);
            } else {
                ends_at_once(send, "the send task ends at once");
            }
        });
        let d2 = driver.clone();
        let t2 = thread::spawn(move || d2.close());
        let mut second = Hand::new(driver.append(1, 20, 4));
        let second_early = second.poll();
        let early = closed.poll();
        let fresh_ready = ready_at_once(driver.closed());
        let delivered = delivered_once_closed(
            early.is_ready() || fresh_ready,
            || driver.is_closed() && driver.in_flight() == 0,
            "closed() resolved with a batch in flight",
            &mut first,
            "closed() resolved before the in-flight batch delivered",
        );
        join(t1);
        join(t2);

        // The sender task, woken by the close and by the answer, ends; nothing else is spawned
        // (the racing record is never sent after the close).
        let mut tasks = alloc::vec![sender];
        settle_all(
            &rt,
            &mut tasks,
            "the sender task or a send task was left pending",
        );

        assert!(
            first.wakes() >= 1,
            "the sent record's producer was left unwoken"
        );
        let result = delivered.unwrap_or_else(|| first.poll());
        let expected = if abandon {
            Err(WriteError::NoResponse)
        } else {
            Ok(())
        };
        assert_eq!(
            result,
            Poll::Ready(expected),
            "the sent record's result lost"
        );
        let second_result = resolved(
            second_early,
            &mut second,
            "the racing record was left unwoken",
            "the racing record was stranded",
        );
        assert_eq!(
            second_result,
            Err(WriteError::Failed(FailCause::Closed)),
            "the racing record was sent after the close, or lost"
        );
        if early.is_pending() {
            woken_and_ready(&mut closed, "closed() pending after the last batch");
        }
        assert_eq!((driver.pending_batches(), driver.in_flight()), (0, 0));
        let mut late = Hand::new(driver.append(1, 30, 4));
        assert!(matches!(
            late.poll(),
            Poll::Ready(Err(WriteError::Failed(FailCause::Closed)))
        ));
    });
}

/// The sender task's turn (woken by the first batch's ack, it drains and sends what is queued,
/// on one thread) races `close` (on another) while a second record is appended and `closed()`
/// is polled on the main thread. The record is sent by that turn and acked, or fails with
/// `Closed`, exactly once; a `closed()` polled during the race does not resolve while a send
/// the turn decided has not ended (its send task runs only after the race); the sender task
/// ends.
#[test]
fn writer_drain_racing_close_and_an_append_sends_or_fails_the_record_once() {
    super::model(|| {
        let (rt, driver, mut sender, mut first) = started();
        assert!(sender.poll().is_pending());
        let mut send = Hand::new(spawned_one(&rt));
        assert!(send.poll().is_ready(), "the first send ends at once");
        assert_eq!(first.poll(), Poll::Ready(Ok(())));
        assert!(sender.woken(), "the ack wakes the sender task");
        let mut closed = Hand::new(boxed(driver.closed()));
        assert!(closed.poll().is_pending());

        let t1 = thread::spawn(move || {
            // A turn: drain, send, and stop if the close came first.
            sender.poll().is_pending().then_some(sender)
        });
        let d2 = driver.clone();
        let t2 = thread::spawn(move || d2.close());
        let mut second = Hand::new(driver.append(1, 20, 4));
        let mut second_result = match second.poll() {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        };
        let early = closed.poll().is_ready();
        let fresh = ready_at_once(driver.closed());
        if (early || fresh) && second_result.is_none() {
            match second.poll() {
                Poll::Ready(r) => second_result = Some(r),
                Poll::Pending => panic!("closed() resolved with the racing record unanswered"),
            }
        }
        let sender = join(t1);
        join(t2);

        let mut tasks: Vec<_> = sender.into_iter().collect();
        settle_all(
            &rt,
            &mut tasks,
            "the sender task or a send task was left pending",
        );
        let result = resolved(
            second_result.map_or(Poll::Pending, Poll::Ready),
            &mut second,
            "the racing record was left unwoken",
            "the racing record was stranded",
        );
        assert!(
            matches!(result, Ok(()) | Err(WriteError::Failed(FailCause::Closed))),
            "the racing record: {result:?}"
        );
        if !early {
            woken_and_ready(&mut closed, "closed() pending after the last batch");
        }
        assert_eq!((driver.pending_batches(), driver.in_flight()), (0, 0));
    });
}
