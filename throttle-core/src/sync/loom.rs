//! The one place `sync` names its synchronisation primitives.
//!
//! Under `cfg(all(test, loom))` these are loom's model-checked types, so the loom models drive
//! the production code unchanged; otherwise they are `std::sync`. Nothing in `sync` may import
//! `std::sync` directly, or loom would not see that access.

#[cfg(all(test, loom))]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// Locks `mutex`, recovering the state if a previous holder panicked.
///
/// Nothing in `sync` runs caller code under the lock except `Hash`/`Eq`/`Clone` of the keys and
/// `Waker::clone`; wakers are woken only after the lock is dropped. If one of those panics the
/// machines' own guards still hold (a credit or a grant is released at most once), and the
/// worst left behind is a waiter that waits for the next release, so the state stays usable
/// rather than poisoning every later caller.
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
