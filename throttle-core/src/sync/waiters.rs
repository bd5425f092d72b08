//! [`Waiters`]: the one arena of waiter slots in `sync`, and [`wake_all`], the one place a
//! handle wakes the wakers it collected.
//!
//! Each slot holds a state `T` of the handle's own beside the waiter's waker: `()` for a
//! broadcast listener, a deadline for a sleeper, or an enum for a waiter that is handed
//! something, such as the window's `Waiting(Ticket) / Granted(CreditId) / Closed` (the
//! waker is the arena's, so no variant carries one). Freed slots are reused before the arena
//! grows, removal is O(1), and when the last waiter leaves the slots are forgotten (capacity
//! kept). A re-poll from the same task keeps the stored waker ([`Waker::will_wake`]), so it
//! costs no clone. Wakers are only collected under the lock, into the caller's `SmallVec`;
//! the caller drops the guard, then calls [`wake_all`].
//!
//! # Driving contract
//!
//! A [`WaiterKey`] belongs to the one future that got it from `insert`; that future removes
//! it exactly once (when it resolves, or in its `Drop`), and nothing else does. The arena has
//! no generations: a key used after its removal may name another waiter's slot. Every other
//! method only reads or rewrites a slot's state and waker.
//!
//! | step | under the lock | after the lock |
//! |---|---|---|
//! | first poll, must wait | `key = waiters.insert(state, cx.waker())` | — |
//! | re-poll, still waiting | `waiters.register(key, cx.waker())` | — |
//! | an input ends one wait | `waiters.resolve(key, Granted(credit), &mut wakeups)` | `wake_all(wakeups)` |
//! | an input ends many | `waiters.wake_where(&mut wakeups, \|state\| …)` | `wake_all(wakeups)` |
//! | the future resolves or is dropped | `waiters.remove(key)` → the state it last had | — |
//!
//! A waiter that only waits for a condition on the handle's state (a sleeper, a listener) does
//! the first two rows and the last in one call, [`poll_wait`](Waiters::poll_wait).

use alloc::vec::Vec;
use core::task::{Poll, Waker};
use std::panic::{AssertUnwindSafe, catch_unwind};

use smallvec::SmallVec;

/// A waiter's slot in a [`Waiters`] arena; see the module's driving contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaiterKey(usize);

struct Entry<T> {
    state: T,
    /// `None` once an input took it (the waiter was woken and has not polled since).
    waker: Option<Waker>,
}

/// An arena of waiter slots, each a state `T` and the waiter's waker. Lives under the
/// handle's lock; see the module docs.
pub(crate) struct Waiters<T> {
    /// `None` is a free slot, listed in `free`.
    slots: Vec<Option<Entry<T>>>,
    free: Vec<usize>,
}

impl<T> Waiters<T> {
    /// An empty arena (allocates nothing until the first waiter).
    pub(crate) const fn new() -> Self {
        Waiters {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Waiters in the arena (inserted, not yet removed), woken or not.
    pub(crate) fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// A new waiter in state `state`, to be woken through `waker` (cloned, before anything
    /// changes: the clone is the runtime's code and may panic).
    pub(crate) fn insert(&mut self, state: T, waker: &Waker) -> WaiterKey {
        self.insert_owned(state, waker.clone())
    }

    /// The key the next [`insert`](Self::insert) or [`insert_owned`](Self::insert_owned)
    /// returns, so a caller can hand it to a machine before the insert (the window's line
    /// holds waiter keys) and insert only once everything that may panic has run.
    pub(crate) fn next_key(&self) -> WaiterKey {
        WaiterKey(self.free.last().copied().unwrap_or(self.slots.len()))
    }

    /// As [`insert`](Self::insert), with a waker the caller has already cloned: runs no
    /// user code.
    pub(crate) fn insert_owned(&mut self, state: T, waker: Waker) -> WaiterKey {
        let entry = Some(Entry {
            state,
            waker: Some(waker),
        });
        if let Some(idx) = self.free.pop() {
            if let Some(slot) = self.slots.get_mut(idx) {
                *slot = entry;
                return WaiterKey(idx);
            }
        }
        self.slots.push(entry);
        WaiterKey(self.slots.len() - 1)
    }

    /// Frees `key`'s slot and returns the state it held (`None` if it was free). O(1).
    pub(crate) fn remove(&mut self, key: WaiterKey) -> Option<T> {
        let entry = self.slots.get_mut(key.0)?.take()?;
        self.free.push(key.0);
        // With no waiter left, forget the slots (keeping capacity).
        if self.free.len() == self.slots.len() {
            self.slots.clear();
            self.free.clear();
        }
        Some(entry.state)
    }

    /// `key`'s state.
    pub(crate) fn get(&self, key: WaiterKey) -> Option<&T> {
        self.slots.get(key.0)?.as_ref().map(|e| &e.state)
    }

    /// Makes `waker` the one that wakes `key`, keeping the old one if it
    /// [`will_wake`](Waker::will_wake) the same task. `false` if the slot is free.
    pub(crate) fn register(&mut self, key: WaiterKey, waker: &Waker) -> bool {
        let Some(entry) = self.entry_mut(key) else {
            return false;
        };
        if !entry.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            entry.waker = Some(waker.clone());
        }
        true
    }

    /// Ends `key`'s wait: sets its state to `state` (returning the old one) and moves its
    /// waker, if it still has one, into `wakeups`. The waiter reads `state` on its next poll.
    pub(crate) fn resolve(
        &mut self,
        key: WaiterKey,
        state: T,
        wakeups: &mut impl Extend<Waker>,
    ) -> Option<T> {
        let entry = self.entry_mut(key)?;
        wakeups.extend(entry.waker.take());
        Some(core::mem::replace(&mut entry.state, state))
    }

    /// Calls `select` on every waiter's state (in slot order, which is not arrival order) and
    /// moves the waker of each one it returns `true` for into `wakeups`. `select` may rewrite
    /// the state (to `Closed`, say) and must not block: it runs under the lock.
    pub(crate) fn wake_where(
        &mut self,
        wakeups: &mut impl Extend<Waker>,
        mut select: impl FnMut(&mut T) -> bool,
    ) {
        for entry in self.slots.iter_mut().flatten() {
            if select(&mut entry.state) {
                wakeups.extend(entry.waker.take());
            }
        }
    }

    /// Every waiter's state, in slot order.
    pub(crate) fn states(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten().map(|e| &e.state)
    }

    /// One poll of a waiter that waits until `done` (a condition on the handle's state, read
    /// under the same lock): once `done`, it leaves the arena (`*key` becomes `None`) and the
    /// poll is ready; until then it joins on its first poll (in state `state()`) and keeps its
    /// waker registered on later ones.
    pub(crate) fn poll_wait(
        &mut self,
        key: &mut Option<WaiterKey>,
        done: bool,
        waker: &Waker,
        state: impl FnOnce() -> T,
    ) -> Poll<()> {
        if done {
            if let Some(key) = key.take() {
                self.remove(key);
            }
            return Poll::Ready(());
        }
        match *key {
            Some(k) if self.register(k, waker) => {}
            _ => *key = Some(self.insert(state(), waker)),
        }
        Poll::Pending
    }

    fn entry_mut(&mut self, key: WaiterKey) -> Option<&mut Entry<T>> {
        self.slots.get_mut(key.0)?.as_mut()
    }
}

/// Wakes the wakers collected under a lock, after the guard is dropped. Inlined, so the
/// common case (nobody to wake) costs a length check.
///
/// A waker is the runtime's code and may panic. Every waker is woken even so, and `wake_all`
/// itself never panics: each `wake` runs under `catch_unwind`, and a panic is dropped once
/// caught (the panic hook has already reported it). The caller that wakes (a release, a
/// close, a notify) did not supply the waker, so failing it would fail the wrong caller; and
/// since no wake step can unwind, a path that wakes twice (its waiters, then a signal's
/// listeners) never skips the second. A panic that stopped the loop would drop the remaining
/// wakers unwoken, and their tasks, already taken off the waiters' table, would never be
/// polled again. A waiter whose waker panicked keeps what it was handed: it observes it on
/// its next poll, or gives it back when its future is dropped.
#[inline]
pub(crate) fn wake_all<const N: usize>(wakeups: SmallVec<[Waker; N]>) {
    if wakeups.is_empty() && !wakeups.spilled() {
        // Nothing to wake and nothing on the heap, as after most releases: forgetting it skips
        // `SmallVec`'s drop glue (an out-of-line call, a tenth of an uncontended release).
        core::mem::forget(wakeups);
        return;
    }
    wake_each(wakeups);
}

/// Wakes one waker as [`wake_all`] does: a panic in its `wake` is caught and dropped, so the
/// waking call (a one-shot's send, the batch driver's wake of its task) still completes.
#[inline]
pub(crate) fn wake_one(waker: Waker) {
    wake_each([waker]);
}

fn wake_each(wakeups: impl IntoIterator<Item = Waker>) {
    for waker in wakeups {
        // Nothing of ours is borrowed by `wake`, so nothing is left half-updated by a panic.
        let _ = catch_unwind(AssertUnwindSafe(|| waker.wake()));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::CountingWaker;
    use std::sync::Arc as StdArc;
    use std::task::Wake;

    type Wakeups = SmallVec<[Waker; 2]>;

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
    fn a_freed_slot_is_reused_before_the_arena_grows() {
        let (w, _) = CountingWaker::new();
        let mut arena = Waiters::new();
        let a = arena.insert('a', &w);
        let b = arena.insert('b', &w);
        let c = arena.insert('c', &w);
        assert_eq!(arena.remove(b), Some('b'));
        assert_eq!(arena.remove(b), None, "a second removal finds a free slot");
        assert_eq!(arena.insert('d', &w), b, "the freed slot, not a new one");
        assert_eq!(arena.len(), 3);
        assert_eq!(arena.states().copied().collect::<Vec<_>>(), ['a', 'd', 'c']);
        for key in [a, b, c] {
            assert!(arena.remove(key).is_some());
        }
        assert_eq!(arena.len(), 0);
        assert_eq!(
            arena.insert('e', &w),
            a,
            "an emptied arena starts again at slot 0"
        );
    }

    #[test]
    fn register_replaces_the_waker_only_for_another_task() {
        let (first, first_wakes) = CountingWaker::new();
        let (other, other_wakes) = CountingWaker::new();
        let mut arena = Waiters::new();
        let key = arena.insert((), &first);
        assert!(arena.register(key, &first.clone()), "same task: kept");
        assert!(arena.register(key, &other), "another task: replaced");
        let mut wakeups = Wakeups::new();
        assert_eq!(arena.resolve(key, (), &mut wakeups), Some(()));
        assert!(wakeups.len() == 1 && wakeups[0].will_wake(&other));
        wake_all(wakeups);
        assert_eq!((first_wakes.wakes(), other_wakes.wakes()), (0, 1));
        // Woken (its waker taken): the next registration stores one again, the one after
        // keeps it.
        assert!(arena.register(key, &other.clone()));
        assert!(arena.register(key, &other));
        let mut wakeups = Wakeups::new();
        arena.wake_where(&mut wakeups, |()| true);
        assert_eq!(wakeups.len(), 1, "one waker per waiter");
        wake_all(wakeups);
        assert_eq!((first_wakes.wakes(), other_wakes.wakes()), (0, 2));
        assert_eq!(arena.remove(key), Some(()));
        assert!(
            !arena.register(key, &other),
            "a free slot is not registered"
        );
    }

    #[test]
    fn wake_where_takes_only_the_selected_wakers_and_may_rewrite_their_state() {
        let (w, wakes) = CountingWaker::new();
        let mut arena = Waiters::new();
        let keys: Vec<_> = [5_u32, 10, 15]
            .iter()
            .map(|d| arena.insert(*d, &w))
            .collect();
        let mut wakeups = Wakeups::new();
        arena.wake_where(&mut wakeups, |deadline| {
            let due = *deadline <= 10;
            if due {
                *deadline = 0;
            }
            due
        });
        assert_eq!(wakeups.len(), 2);
        wake_all(wakeups);
        assert_eq!(wakes.wakes(), 2);
        let states: Vec<_> = keys.iter().map(|k| arena.get(*k).copied()).collect();
        assert_eq!(states, [Some(0), Some(0), Some(15)]);
        let mut unselected = Wakeups::new();
        assert_eq!(arena.resolve(keys[2], 20, &mut unselected), Some(15));
        assert_eq!(unselected.len(), 1, "the unselected waiter kept its waker");
        assert_eq!(arena.remove(keys[2]), Some(20));
    }

    #[test]
    fn poll_wait_joins_once_and_leaves_when_done() {
        let (w, _) = CountingWaker::new();
        let mut arena = Waiters::new();
        let mut key = None;
        assert!(arena.poll_wait(&mut key, false, &w, || 7).is_pending());
        let joined = key;
        assert!(arena.poll_wait(&mut key, false, &w, || 8).is_pending());
        assert_eq!(
            (key, arena.len()),
            (joined, 1),
            "a re-poll does not join again"
        );
        assert_eq!(arena.states().copied().collect::<Vec<_>>(), [7]);
        assert!(arena.poll_wait(&mut key, true, &w, || 9).is_ready());
        assert_eq!((key, arena.len()), (None, 0));
    }

    #[test]
    fn a_panicking_waker_does_not_stop_the_others_and_wake_all_returns_normally() {
        let (a, a_wakes) = CountingWaker::new();
        let (b, b_wakes) = CountingWaker::new();
        let mut arena = Waiters::new();
        for waker in [panicking("first"), a, panicking("second"), b] {
            arena.insert((), &waker);
        }
        let mut wakeups = SmallVec::<[Waker; 4]>::new();
        arena.wake_where(&mut wakeups, |()| true);
        let outcome = catch_unwind(AssertUnwindSafe(|| wake_all(wakeups)));
        assert_eq!((a_wakes.wakes(), b_wakes.wakes()), (1, 1), "all woken");
        assert!(
            outcome.is_ok(),
            "the waking caller did not supply the waker: it must not fail"
        );
    }

    #[test]
    fn next_key_is_the_key_the_next_insert_returns() {
        let (w, _) = CountingWaker::new();
        let mut arena = Waiters::new();
        let predicted = arena.next_key();
        let a = arena.insert_owned('a', w.clone());
        assert_eq!(a, predicted, "an empty arena");
        let b = arena.insert('b', &w);
        let _c = arena.insert('c', &w);
        assert_eq!(arena.next_key(), WaiterKey(3), "a full arena grows");
        assert_eq!(arena.remove(b), Some('b'));
        let predicted = arena.next_key();
        assert_eq!(predicted, b, "a freed slot is reused");
        assert_eq!(arena.insert_owned('d', w), predicted);
    }
}
