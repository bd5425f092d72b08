//! Observation events: what a machine saw or decided, drained with its `poll_event()`.
//!
//! An event is an observation for metrics and logs (a gate installed, a credit released, a
//! retry decided). Unlike an action it carries no obligation: dropping one changes nothing in
//! the machine. Every machine that has events keeps them in an [`EventQueue`], which is **off
//! by default**: then an input builds nothing, clones no key and allocates nothing; each
//! place that could record an event only tests an integer (counted in
//! `tests/instructions/counts.md`: 16 instructions per submit and complete of the dispatch
//! window, about 5 %; `BENCHMARKS.md` times events off against on).
//!
//! Turn events on with the machine's `set_event_capacity(n)`. The queue then holds at most
//! `n` undrained events: a new event past that evicts the oldest one and counts it in
//! `events_dropped()`, so memory stays bounded when the driver drains late. Drain after
//! actions, in the drive order of `docs/architecture.md`: `poll_action` until `None`, then
//! `poll_event` until `None`, then re-arm the timer from `poll_timeout`.
//!
//! ```
//! use throttle_sansio::event::EventQueue;
//!
//! let mut q: EventQueue<u32> = EventQueue::new();
//! q.emit(|| 1); // off: the closure never runs
//! assert_eq!(q.pop(), None);
//! q.set_capacity(2);
//! for e in 1..=3 {
//!     q.emit(|| e);
//! }
//! assert_eq!((q.pop(), q.pop(), q.pop()), (Some(2), Some(3), None));
//! assert_eq!(q.dropped(), 1);
//! ```

use alloc::collections::VecDeque;

/// A bounded queue of undrained events, off (capacity 0) until
/// [`set_capacity`](Self::set_capacity). See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventQueue<E> {
    queue: VecDeque<E>,
    capacity: usize,
    dropped: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue::new()
    }
}

impl<E> EventQueue<E> {
    /// An empty queue that is off: it allocates nothing and records nothing.
    pub const fn new() -> Self {
        EventQueue {
            queue: VecDeque::new(),
            capacity: 0,
            dropped: 0,
        }
    }

    /// Keep at most `capacity` undrained events; 0 turns events off and discards the queued
    /// ones (counted as dropped). Lowering the capacity drops the oldest events over it.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
        while self.queue.len() > capacity {
            self.queue.pop_front();
            self.dropped = self.dropped.saturating_add(1);
        }
        if capacity == 0 {
            self.queue = VecDeque::new();
        }
    }

    /// The capacity set (0: off).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts an event the machine could not record (its user code panicked while it was
    /// being built), as if a full queue had dropped it.
    pub fn note_dropped(&mut self) {
        self.dropped = self.dropped.saturating_add(1);
    }

    /// Whether events are recorded.
    #[inline]
    pub fn is_on(&self) -> bool {
        self.capacity != 0
    }

    /// Record the event `make` builds, if events are on; `make` runs only then, so an event
    /// that clones a key costs nothing while off. When the queue is full, the oldest event is
    /// dropped and counted.
    #[inline]
    pub fn emit(&mut self, make: impl FnOnce() -> E) {
        if self.capacity != 0 {
            self.push(make());
        }
    }

    #[cold]
    fn push(&mut self, event: E) {
        if self.queue.len() >= self.capacity {
            self.queue.pop_front();
            self.dropped = self.dropped.saturating_add(1);
        }
        self.queue.push_back(event);
    }

    /// The oldest undrained event.
    #[inline]
    pub fn pop(&mut self) -> Option<E> {
        self.queue.pop_front()
    }

    /// Undrained events.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Events lost so far: evicted by a full queue or discarded by
    /// [`set_capacity`](Self::set_capacity).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::EventQueue;

    #[test]
    fn off_by_default_and_never_builds_an_event() {
        let mut q: EventQueue<u8> = EventQueue::new();
        let mut built = false;
        q.emit(|| {
            built = true;
            1
        });
        assert!(!built);
        assert!(!q.is_on());
        assert_eq!((q.pop(), q.dropped()), (None, 0));
    }

    #[test]
    fn a_full_queue_evicts_the_oldest_and_counts_it() {
        let mut q = EventQueue::new();
        q.set_capacity(3);
        for e in 0..10u8 {
            q.emit(|| e);
        }
        assert_eq!(q.len(), 3);
        assert_eq!(q.dropped(), 7);
        assert_eq!(
            [q.pop(), q.pop(), q.pop(), q.pop()],
            [Some(7), Some(8), Some(9), None]
        );
    }

    #[test]
    fn lowering_or_zeroing_the_capacity_drops_the_oldest() {
        let mut q = EventQueue::new();
        q.set_capacity(4);
        (0..4u8).for_each(|e| q.emit(|| e));
        q.set_capacity(2);
        assert_eq!((q.len(), q.dropped()), (2, 2));
        assert_eq!(q.pop(), Some(2));
        q.set_capacity(0);
        assert_eq!((q.len(), q.dropped()), (0, 3));
        q.emit(|| 9);
        assert_eq!(q.pop(), None);
    }
}
