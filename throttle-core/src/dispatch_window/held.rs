//! Holding batches back and letting them go: pausing a shard, requeueing a torn batch, and
//! the two closes.

use super::*;

impl<Shard, B, S> DispatchWindow<Shard, B, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// Pauses `shard`: until [`resume`](Self::resume) it is granted no credit and a release
    /// of one of its credits hands nothing on. Batches in flight are untouched (complete them
    /// as usual); new batches are accepted and wait in arrival order, full ones queued and the
    /// open one parked, exactly as when the shard has no credit; [`cancel`](Self::cancel) and
    /// [`reclaim`](Self::reclaim) still work. For a shard whose stream is down (a reconnect
    /// backoff): nothing is sent into it, and nothing is reordered.
    ///
    /// Idempotent. Other shards are not affected. Does nothing after [`close`](Self::close)
    /// (a closed window sends nothing anyway). [`drain`](Self::drain) does not lift a pause:
    /// a draining window with held-back batches on a paused shard is drained only after
    /// `resume` sends them (or `close` fails them), so nothing is stranded and nothing goes
    /// into a stream the caller said is down.
    ///
    /// Memory: a shard the window has no entry for gets one (holding the key, no buffer), so
    /// that its first batches wait too. A paused entry is never evicted; it becomes evictable
    /// like any other once resumed. The map therefore holds at most the recently active
    /// shards (see the type's invariants) plus the shards paused and not resumed, a set the
    /// caller names one key at a time; pausing a shard again costs nothing.
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    ///
    /// ```
    /// use throttle_sansio::dispatch_window::{DispatchWindow, WindowConfig};
    /// use throttle_sansio::Instant;
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let cfg = WindowConfig::default().with_max_in_flight(2);
    /// let mut w: DispatchWindow<u32, &str, BuildHasherDefault<H>> = DispatchWindow::new(cfg).unwrap();
    /// w.pause(7);
    /// assert_eq!(w.submit(7, "a").unwrap(), None, "paused: queued although credit is free");
    /// assert_eq!(w.submit(7, "b").unwrap(), None);
    /// assert!(w.submit(8, "x").unwrap().is_some(), "other shards go on");
    /// let sent: Vec<_> = w.resume(Instant::ZERO, &7).into_iter().map(|d| d.batch).collect();
    /// assert_eq!(sent, ["a", "b"], "resume hands the free credits out in arrival order");
    /// ```
    pub fn pause(&mut self, shard: Shard) {
        if self.books.mode == Mode::Closed {
            return;
        }
        let hash = self.hasher.hash_one(&shard);
        // The lookup (user `Eq`) is the only user code, and it runs before anything changes.
        if let Some(e) = self.shards.find_mut(hash, |e| e.key == shard) {
            self.books.pause(&mut e.w);
            return;
        }
        let id = self.next_entry;
        self.next_entry = self.next_entry.wrapping_add(1);
        self.make_room();
        let mut w = ShardWindow::with_in_flight(0);
        self.books.pause(&mut w);
        self.shards.insert_unique(
            hash,
            ShardEntry {
                key: shard,
                hash,
                id,
                pinned: false,
                w,
            },
            |e| e.hash,
        );
        self.peak_shards.see(self.shards.len());
    }

    /// Ends a pause of `shard` ([`pause`](Self::pause)) and returns the batches to send now:
    /// its held-back batches, oldest first (queued in line order, then the parked one), as
    /// many as it has free credits, each under a fresh credit. That is the order they would
    /// have left in had there been no pause; the rest keep waiting for releases as usual.
    /// Returns nothing for a shard that is not paused, after [`close`](Self::close), or once
    /// the window can issue no new id (the batches stay held: `close` collects them). `now`
    /// is the time of the call (only observed: credits never expire).
    ///
    /// # Panics
    ///
    /// Only if user code panics: the shard's `Hash`, `Eq` or `Clone` (one copy per batch
    /// returned, made before anything changes), or the hasher. The window is then unchanged.
    pub fn resume(&mut self, now: Instant, shard: &Shard) -> Vec<Dispatch<Shard, B>> {
        let mut out = Vec::new();
        let hash = self.hasher.hash_one(shard);
        let default = self.cfg.cap();
        let Some(e) = self.shards.find_mut(hash, |e| e.key == *shard) else {
            return out;
        };
        let cap = e.w.cap(default);
        let place = Place { hash, entry: e.id };
        // Every key copy first (user `Clone`), so a panic leaves the window paused as it was.
        let n = self.books.resumable(&e.w, cap);
        let mut keys: Vec<Shard> = (0..n).map(|_| e.key.clone()).collect();
        keys.reverse();
        let mut notes: Vec<Shard> = if self.events.is_on() {
            (0..n).map(|_| e.key.clone()).collect()
        } else {
            Vec::new()
        };
        notes.reverse();
        out.reserve(n);
        self.books.observe(now);
        let events = &mut self.events;
        self.books.resume(&mut e.w, place, cap, n, |credit, batch| {
            super::note_sent(events, notes.pop(), credit);
            if let Some(shard) = keys.pop() {
                out.push(Dispatch {
                    shard,
                    credit,
                    batch,
                });
            }
        });
        out
    }

    /// Whether `shard` is paused ([`pause`](Self::pause) and no [`resume`](Self::resume)
    /// since; a [`close`](Self::close) ends every pause).
    ///
    /// # Panics
    ///
    /// Only if the shard's `Hash` or `Eq`, or the hasher, panics; the window is unchanged.
    pub fn is_paused(&self, shard: &Shard) -> bool {
        self.window(shard).is_some_and(|w| w.paused)
    }

    /// A copy of the key of `credit`'s shard (user `Clone`; changes nothing), or why the
    /// credit is not live.
    pub(crate) fn credit_key(&self, credit: CreditId) -> Result<Shard, ReleaseError> {
        let place = *self
            .books
            .credits
            .get(credit.0)
            .ok_or_else(|| self.books.credits.refusal(credit.0))?;
        self.shards
            .find(place.hash, |e| e.id == place.entry)
            .map(|e| e.key.clone())
            .ok_or(ReleaseError::Unknown)
    }

    /// Releases `credit` and puts `batch` (the batch that left under it, whose RPC was torn)
    /// back at the head of its shard's line: after batches requeued before it that left before
    /// it (credit generations grow in dispatch order), before every batch of the shard that
    /// never left. Then the freed credit is handed on as by [`complete`](Self::complete)
    /// (returned, naming `shard`, a copy of the credit's key from [`Self::credit_key`]),
    /// unless the shard is paused or still at or above its capacity (after a shrink: the
    /// credit retires). The first value is the requeued batch's ticket, or the
    /// batch handed back when the window is closed or can issue no ticket (the credit is
    /// released all the same). `Err` for an unknown or released credit: nothing changes, and
    /// the batch is dropped (the batcher reads its batch under a live credit only). Runs no
    /// user code: `noted` is the event's copy of the key, from [`Self::note_key`].
    #[allow(clippy::type_complexity)]
    pub(crate) fn requeue(
        &mut self,
        credit: CreditId,
        shard: Shard,
        noted: Option<Shard>,
        batch: B,
    ) -> Result<(Result<Ticket, SubmitError<B>>, Option<Dispatch<Shard, B>>), ReleaseError> {
        let place = self.books.credits.remove(credit.0)?;
        let Some(e) = entry_at(&mut self.shards, place) else {
            debug_assert!(false, "a live credit's shard has no window");
            return Ok((Err(SubmitError::Closed(batch)), None));
        };
        let cap = e.w.cap(self.cfg.cap());
        let (back, next) = self
            .books
            .requeue(&mut e.w, place, cap, batch, credit.0.generation);
        let in_flight = e.w.in_flight;
        self.events
            .emit(|| WindowEvent::Released { credit, in_flight });
        let next = next.map(|(credit, batch)| {
            super::note_sent(&mut self.events, noted, credit);
            Dispatch {
                shard,
                credit,
                batch,
            }
        });
        Ok((back, next))
    }

    /// Closes the window for sending: new batches are refused with [`SubmitError::Closed`]
    /// (which hands the batch back), but every batch already held back still leaves, as
    /// before: each [`complete`](Self::complete) hands its shard's oldest queued batch, then
    /// its parked one, a fresh credit, so batches leave whole and in arrival order, at most
    /// `capacity_of(shard)` per shard. [`is_drained`](Self::is_drained) turns true once the last credit
    /// is completed with nothing left held back.
    ///
    /// This is the graceful close (Oxia's `close()`, which sends what it holds); [`close`]
    /// is the one that fails held-back work. `close` after `drain` returns what is still held
    /// back and stops the hand-on; `drain` after `close` changes nothing. Idempotent. Runs no
    /// user code. [`cancel`](Self::cancel) and [`reclaim`](Self::reclaim) still work while
    /// draining (the batch is then the caller's to fail). A window that can issue no new
    /// credit id keeps its held batches (see [`complete`](Self::complete)): `close` collects
    /// them.
    ///
    /// [`close`]: Self::close
    ///
    /// ```
    /// use throttle_sansio::dispatch_window::{DispatchWindow, SubmitError, WindowConfig};
    /// # use core::hash::BuildHasherDefault;
    /// # #[derive(Default)] struct H(u64);
    /// # impl core::hash::Hasher for H {
    /// #     fn finish(&self) -> u64 { self.0 }
    /// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
    /// # }
    /// let cfg = WindowConfig::default().with_max_in_flight(1);
    /// let mut w: DispatchWindow<u32, &str, BuildHasherDefault<H>> = DispatchWindow::new(cfg).unwrap();
    /// let a = w.submit(7, "a").unwrap().expect("sent at once");
    /// assert_eq!(w.submit(7, "b").unwrap(), None); // held back
    /// w.drain();
    /// assert_eq!(w.submit(7, "c"), Err(SubmitError::Closed("c")));
    /// let b = w.complete(a.credit).unwrap().expect("the held batch still leaves");
    /// assert_eq!(b.batch, "b");
    /// assert!(!w.is_drained());
    /// assert_eq!(w.complete(b.credit), Ok(None));
    /// assert!(w.is_drained());
    /// ```
    pub fn drain(&mut self) {
        self.books.drain();
    }

    /// Closes the window and returns every held-back batch (queued in line order, then parked,
    /// per shard; shards in no particular order). None of them was ever dispatched. Batches in
    /// flight are untouched: complete their credits as usual (`Ok(None)`). Later submits are
    /// refused with [`SubmitError::Closed`], which hands the batch back. Idempotent: a second
    /// `close` returns nothing. This is the `close` of `docs/architecture.md` ("Closing"), the
    /// held-back batches returned rather than failed.
    pub fn close(&mut self) -> Vec<(Shard, B)> {
        // Every key copy is made first (user `Clone`), in the order `close_with` hands the
        // batches out, so a panicking clone leaves the window open and unchanged.
        let mut keys = Vec::new();
        for e in self.shards.iter() {
            for _ in 0..e.w.held_count() {
                keys.push(e.key.clone());
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut keys = keys.into_iter();
        self.close_with(|shard, batch| {
            // One copy per held-back batch was made above; `or_else` is never reached.
            let key = keys.next().unwrap_or_else(|| shard.clone());
            out.push((key, batch));
        });
        out
    }

    /// Closes the window and hands every held-back batch to `f` (in `close`'s order).
    pub(crate) fn close_with(&mut self, mut f: impl FnMut(&Shard, B)) {
        self.books.close();
        for e in self.shards.iter_mut() {
            let key = &e.key;
            self.books.close_shard(&mut e.w, |batch| f(key, batch));
        }
        self.shards.retain(|e| !e.evictable());
        self.books.closed();
    }
}
