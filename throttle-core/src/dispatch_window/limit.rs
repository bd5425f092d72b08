//! Limits that change at run time, per shard: [`DispatchWindow::set_max_in_flight`].
//!
//! The rule is the books' ([`Books::set_limit`](super::shard::Books::set_limit)), shared with
//! [`SingleWindow`](super::SingleWindow) and the `sync` handle: a shard's capacity is its own
//! limit if it has one, else the configured one; a grown limit hands its free credits to the
//! held-back batches in line order; a shrunk one revokes nothing, and releases retire credits
//! until the shard is back under it.

use super::*;

use smallvec::SmallVec;

/// A limit as the books keep it: 0 for "none" (the window's configured limit), else clamped
/// to `u32::MAX` (no window holds more credits than that).
#[inline]
pub(super) fn limit_of(limit: Option<NonZeroUsize>) -> u32 {
    limit.map_or(0, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

impl<Shard, B, S> DispatchWindow<Shard, B, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Gives `shard` its own limit at run time: `Some(n)` allows `n` batches of it in flight
    /// from now on (clamped to `u32::MAX`), `None` gives it the configured limit again. For
    /// a concurrency limiter ([`crate::limiter`]) driving each shard's window.
    ///
    /// Returns the batches a larger capacity sends now: the shard's held-back batches oldest
    /// first (queued in line order, then the parked one), as many as it has free credits,
    /// each under a fresh credit, exactly as that many releases would have sent them (none
    /// while the shard is paused: [`resume`](Self::resume) sends them under the new limit). A
    /// smaller capacity revokes nothing: every credit in flight stays valid, `available` is 0,
    /// and each release retires its credit (hands nothing on) until fewer than the new
    /// capacity are in flight. Does nothing after [`close`](Self::close), which also ends
    /// every limit set here; a draining window still takes it.
    ///
    /// Memory: a shard with its own limit keeps its map entry while idle (the limit is
    /// remembered there), as a paused one does; `None` makes it evictable again. A shard the
    /// window has no entry for gets one (a copy of the key, no buffer).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the shard's `Hash`, `Eq` or `Clone` (one copy for a new
    /// entry, one per batch returned and, with events on, one more per batch for its event,
    /// all made before anything changes), or the hasher. The window is then unchanged.
    ///
    /// ```
    /// use core::num::NonZeroUsize;
    /// use throttle_sansio::dispatch_window::{DispatchWindow, WindowConfig};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let cfg = WindowConfig::default().with_max_in_flight(1);
    /// let mut w: DispatchWindow<u32, &str, BuildHasherDefault<H>> = DispatchWindow::new(cfg).unwrap();
    /// let a = w.submit(7, "a").unwrap().expect("sent");
    /// assert_eq!(w.submit(7, "b").unwrap(), None);
    /// assert_eq!(w.submit(7, "c").unwrap(), None);
    /// let sent: Vec<_> = w
    ///     .set_max_in_flight(&7, NonZeroUsize::new(3))
    ///     .into_iter()
    ///     .map(|d| d.batch)
    ///     .collect();
    /// assert_eq!(sent, ["b", "c"], "the grown window sends the held batches in order");
    /// assert_eq!((w.capacity_of(&7), w.in_flight(&7), w.capacity_of(&8)), (3, 3, 1));
    /// assert!(w.set_max_in_flight(&7, None).is_empty(), "back to 1: nothing revoked");
    /// assert_eq!((w.in_flight(&7), w.available(&7)), (3, 0));
    /// # let _ = a;
    /// ```
    pub fn set_max_in_flight(
        &mut self,
        shard: &Shard,
        limit: Option<NonZeroUsize>,
    ) -> Vec<Dispatch<Shard, B>> {
        let mut out = Vec::new();
        self.set_max_in_flight_into(shard, limit, &mut out);
        out
    }

    /// [`Self::set_max_in_flight`], the batches sent pushed onto `out` (a buffer the caller
    /// keeps): a change that sends at most four batches allocates nothing once `out` has
    /// room.
    ///
    /// # Panics
    ///
    /// As [`Self::set_max_in_flight`]; the window and `out` are then unchanged.
    pub fn set_max_in_flight_into(
        &mut self,
        shard: &Shard,
        limit: Option<NonZeroUsize>,
        out: &mut Vec<Dispatch<Shard, B>>,
    ) {
        if self.books.mode == Mode::Closed {
            return;
        }
        let limit = limit_of(limit);
        let hash = self.hasher.hash_one(shard);
        let default = self.cfg.cap();
        // The lookup (user `Eq`) runs before anything changes.
        let Some(e) = self.shards.find_mut(hash, |e| e.key == *shard) else {
            if limit != 0 {
                // A new entry holds nothing back, so there is nothing to send.
                let key = shard.clone();
                self.insert_limited(key, hash, limit);
            }
            return;
        };
        let place = Place { hash, entry: e.id };
        let cap = e.w.cap_for(limit, default);
        // Every key copy first (user `Clone`), so a panic leaves the window as it was.
        let n = self.books.grantable(&e.w, cap);
        let mut keys: SmallVec<[Shard; 4]> = (0..n).map(|_| e.key.clone()).collect();
        keys.reverse();
        let mut notes: SmallVec<[Shard; 4]> = if self.events.is_on() && self.dispatch_events {
            (0..n).map(|_| e.key.clone()).collect()
        } else {
            SmallVec::new()
        };
        notes.reverse();
        out.reserve(n);
        let events = &mut self.events;
        self.books
            .set_limit(&mut e.w, place, limit, cap, n, |credit, batch| {
                note_sent(events, notes.pop(), credit);
                if let Some(shard) = keys.pop() {
                    out.push(Dispatch {
                        shard,
                        credit,
                        batch,
                    });
                }
            });
    }

    /// For the `sync` handle (`hint`: its hash of the key, see `hinted.rs`): as
    /// [`Self::set_max_in_flight`], each credit handed out passed to `f` with the held-back
    /// "batch" (a waiter) it went to. Clones the key only for a new entry, before anything
    /// changes.
    #[cfg(feature = "std")]
    pub(crate) fn set_limit_hinted(
        &mut self,
        shard: &Shard,
        hint: u64,
        limit: Option<NonZeroUsize>,
        f: impl FnMut(CreditId, B),
    ) {
        if self.books.mode == Mode::Closed {
            return;
        }
        let limit = limit_of(limit);
        let default = self.cfg.cap();
        match hinted::find_hinted(&mut self.shards, &self.hasher, shard, hint) {
            hinted::Found::Entry(e, place) => {
                let cap = e.w.cap_for(limit, default);
                let n = self.books.grantable(&e.w, cap);
                self.books.set_limit(&mut e.w, place, limit, cap, n, f);
            }
            hinted::Found::New(hash) if limit != 0 => {
                let key = shard.clone();
                self.insert_limited(key, hash, limit);
            }
            hinted::Found::New(_) => {}
        }
    }

    /// Adds an idle entry for a shard the map does not hold (`key`, the map's copy; `hash`,
    /// the window's own hash of it) with its own limit `limit` (not 0).
    fn insert_limited(&mut self, key: Shard, hash: u64, limit: u32) {
        let id = self.next_entry;
        self.next_entry = self.next_entry.wrapping_add(1);
        self.make_room();
        let mut w = ShardWindow::with_in_flight(0);
        w.limit = limit;
        self.shards.insert_unique(
            hash,
            ShardEntry {
                key,
                hash,
                id,
                pinned: false,
                w,
            },
            |e| e.hash,
        );
        self.peak_shards.see(self.shards.len());
        self.books.maintenance.touch();
    }
}
