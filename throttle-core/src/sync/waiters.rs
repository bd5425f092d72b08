//! [`wake_all`], the one place a handle wakes the wakers it collected under its lock.

use core::task::Waker;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use smallvec::SmallVec;

/// Wakes the wakers collected under a lock, after the guard is dropped. Inlined, so the
/// common case (nobody to wake) costs a length check.
///
/// A waker is the runtime's code and may panic. Every waker is woken even so: a panic is
/// caught, the rest are woken, and the first panic is resumed at the end (later ones are
/// dropped). A panic that stopped the loop would drop the remaining wakers unwoken, and their
/// tasks, already taken off the waiters' table, would never be polled again.
#[inline]
pub(crate) fn wake_all<const N: usize>(wakeups: SmallVec<[Waker; N]>) {
    if wakeups.is_empty() {
        return;
    }
    wake_each(wakeups);
}

fn wake_each(wakeups: impl IntoIterator<Item = Waker>) {
    let mut first_panic = None;
    for waker in wakeups {
        // Nothing of ours is borrowed by `wake`, so nothing is left half-updated by a panic.
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| waker.wake())) {
            first_panic.get_or_insert(payload);
        }
    }
    if let Some(payload) = first_panic {
        resume_unwind(payload);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::CountingWaker;
    use alloc::string::String;
    use std::sync::Arc as StdArc;
    use std::task::Wake;

    /// A waker whose `wake` panics with its message.
    struct PanickingWaker(&'static str);

    impl Wake for PanickingWaker {
        fn wake(self: StdArc<Self>) {
            panic!("{}", self.0);
        }
    }

    fn panicking(msg: &'static str) -> Waker {
        Waker::from(StdArc::new(PanickingWaker(msg)))
    }

    #[test]
    fn a_panicking_waker_does_not_stop_the_others_and_the_first_panic_is_resumed() {
        let (a, a_wakes) = CountingWaker::new();
        let (b, b_wakes) = CountingWaker::new();
        let wakeups: SmallVec<[Waker; 4]> =
            SmallVec::from_iter([panicking("first"), a, panicking("second"), b]);
        let outcome = catch_unwind(AssertUnwindSafe(|| wake_all(wakeups)));
        assert_eq!((a_wakes.wakes(), b_wakes.wakes()), (1, 1), "all woken");
        let payload = outcome.expect_err("the panic is resumed after the wakes");
        assert_eq!(
            payload.downcast_ref::<String>().map(String::as_str),
            Some("first")
        );
    }
}
