//! The one place `sync` names its synchronisation primitives.
//!
//! Under `cfg(all(test, loom))` these are loom's model-checked types, so the loom models drive
//! the production code unchanged; otherwise they are `std::sync`. Nothing in `sync` may import
//! `std::sync` directly, or loom would not see that access.

#[cfg(all(test, loom))]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// A slot filled once, on first use, then only read: `std::sync::OnceLock` (its read is one
/// load, so readers on different cores share its line), under loom a locked `Option`.
pub(crate) struct OnceSlot<T> {
    #[cfg(not(all(test, loom)))]
    cell: std::sync::OnceLock<T>,
    #[cfg(all(test, loom))]
    cell: Mutex<Option<T>>,
}

impl<T: Clone> OnceSlot<T> {
    /// An empty slot.
    pub(crate) fn new() -> Self {
        OnceSlot {
            cell: Default::default(),
        }
    }

    /// A clone of the slot's value, filling it with `init()` first if it is empty.
    #[inline]
    pub(crate) fn get_or_init(&self, init: impl FnOnce() -> T) -> T {
        #[cfg(not(all(test, loom)))]
        {
            self.cell.get_or_init(init).clone()
        }
        #[cfg(all(test, loom))]
        {
            lock(&self.cell).get_or_insert_with(init).clone()
        }
    }
}

/// Locks `mutex`, recovering the state if a previous holder panicked.
///
/// Under the locks of the window, pending-bytes and gate handles, the signals and the manual
/// clock, only these user calls run: a key's `Hash`, `Eq` and `Clone` (in the machines'
/// lookups and inserts), `Waker::clone`, and the closure of `GateHandle::update`. The window,
/// bytes, signal and clock paths call them before they change anything (or, for the bytes
/// waiter's waker, after its ticket is recorded where the future's drop finds it), so a panic
/// leaves the state as it was before the call; `drive` catches a panic of its input and
/// finishes the step before resuming it, so the update closure does not poison the gate's
/// lock at all. A key that panics inside a `WriteGate` input is the core gate's own case.
/// Refusing the recovered state would fail every later caller for one caller's bug.
/// `docs/sync.md` ("User code that panics") lists the tests that panic at each of these calls.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Atomics, for the test wakers and the manual executor (production code uses only the lock).
#[cfg(test)]
pub(crate) mod atomic {
    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicUsize, Ordering};
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicUsize, Ordering};
}
