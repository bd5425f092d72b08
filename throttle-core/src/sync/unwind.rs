//! Running user code so that its panic becomes a value: [`call`] for a closure, [`catch`] for
//! a future. The drivers use them around the transport, the connector, key lookups, the
//! classifier and the refresh, so that a panic there fails the one operation it belonged to
//! with [`Panicked`] instead of unwinding through a task that holds other callers' credit.
//!
//! The panic payload is dropped: the panic hook has already reported the panic when it was
//! raised. A future that panicked is never polled again.

use core::future::Future;
use core::task::Poll;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::Panicked;

/// Calls `f`; a panic in it is `Err(Panicked)`.
///
/// `AssertUnwindSafe`: after a panic the caller gives the value `f` touched no further use
/// except dropping it (the operation failed), and the machines it guards change nothing before
/// their user code has run (see each call site).
pub(crate) fn call<T>(f: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_payload| Panicked)
}

/// Awaits `future`; a panic in one of its polls is `Err(Panicked)` (and it is not polled
/// again). No allocation: the future is pinned inside this one.
pub(crate) async fn catch<F: Future>(future: F) -> Result<F::Output, Panicked> {
    let mut future = core::pin::pin!(future);
    core::future::poll_fn(|cx| match call(|| future.as_mut().poll(cx)) {
        Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
        Ok(Poll::Pending) => Poll::Pending,
        Err(panicked) => Poll::Ready(Err(panicked)),
    })
    .await
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{CountingWaker, poll_once};

    #[test]
    fn a_panicking_closure_is_an_error_and_a_returning_one_its_value() {
        assert_eq!(call(|| 7), Ok(7));
        assert_eq!(call(|| -> u8 { panic!("user code") }), Err(Panicked));
    }

    #[test]
    fn a_future_that_panics_on_its_second_poll_resolves_to_panicked() {
        let mut polls = 0;
        let inner = core::future::poll_fn(move |cx| {
            polls += 1;
            if polls == 2 {
                panic!("user future");
            }
            cx.waker().wake_by_ref();
            Poll::<u8>::Pending
        });
        let mut fut = alloc::boxed::Box::pin(catch(inner));
        let (waker, _) = CountingWaker::new();
        assert!(poll_once(&mut fut, &waker).is_pending());
        assert_eq!(poll_once(&mut fut, &waker), Poll::Ready(Err(Panicked)));
    }
}
