//! A one-value hand-off between a sender and one waiting future, used by the drivers to give a
//! submitted operation its result and a coalesced refresh its outcome.
//!
//! Dropping the [`Sender`] without sending resolves the [`Receiver`] to [`Closed`]; dropping
//! the receiver makes a later send a no-op (the value is dropped with the sender). The waker is
//! woken after the lock is dropped, like everywhere in `sync`.

use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use super::Closed;
use super::loom::{Arc, Mutex, lock};
use super::waiters::wake_one;

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The sender sent or was dropped: no value will come after `value`.
    done: bool,
}

/// The sending half: [`send`](Self::send) once, or drop (the receiver gets [`Closed`]).
pub(crate) struct Sender<T> {
    shared: Arc<Mutex<Slot<T>>>,
}

/// The receiving half: a future of `Result<T, Closed>`. Cancel-safe.
pub(crate) struct Receiver<T> {
    shared: Arc<Mutex<Slot<T>>>,
}

pub(crate) fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
        done: false,
    }));
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

impl<T> Sender<T> {
    /// Hands `value` to the receiver and wakes it.
    pub(crate) fn send(self, value: T) {
        let waker = {
            let mut slot = lock(&self.shared);
            slot.value = Some(value);
            slot.done = true;
            slot.waker.take()
        };
        if let Some(w) = waker {
            wake_one(w);
        }
        // `Drop` sees `done` and does nothing more.
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = lock(&self.shared);
            if slot.done {
                return;
            }
            slot.done = true;
            slot.waker.take()
        };
        if let Some(w) = waker {
            wake_one(w);
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, Closed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = lock(&self.shared);
        if let Some(value) = slot.value.take() {
            return Poll::Ready(Ok(value));
        }
        if slot.done {
            return Poll::Ready(Err(Closed));
        }
        if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            slot.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{CountingWaker, poll_once};

    #[test]
    fn send_wakes_the_waiting_receiver_with_the_value() {
        let (tx, mut rx) = channel::<u32>();
        let (waker, count) = CountingWaker::new();
        assert!(poll_once(&mut rx, &waker).is_pending());
        tx.send(7);
        assert_eq!(count.wakes(), 1);
        assert_eq!(poll_once(&mut rx, &waker), Poll::Ready(Ok(7)));
    }

    #[test]
    fn dropped_sender_resolves_the_receiver_to_closed() {
        let (tx, mut rx) = channel::<u32>();
        let (waker, count) = CountingWaker::new();
        assert!(poll_once(&mut rx, &waker).is_pending());
        drop(tx);
        assert_eq!(count.wakes(), 1);
        assert_eq!(poll_once(&mut rx, &waker), Poll::Ready(Err(Closed)));
    }
}
