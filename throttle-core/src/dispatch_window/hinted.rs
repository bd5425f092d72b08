//! The entry points of the `sync` window handle, which hashes a key before it takes its lock
//! and passes that hash in as a hint.

use core::hash::{BuildHasher, Hash};

use super::{CreditId, DispatchWindow, Entered, Exhausted, Place, SubmitError, Take, entry_at};

impl<Shard, B, S> DispatchWindow<Shard, B, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// The hash this window placed `shard` by and its entry id, if it has an entry, looked up
    /// first with `hint` (the `sync` handle hashes keys with a clone of the hasher before it
    /// takes its lock, so the lock is not held while hashing). The hint is only a hint: the
    /// entry's own hash is returned, and a miss hashes the key again with the window's own
    /// hasher, so a clone that hashes differently costs a second lookup, never a second entry
    /// for the same shard.
    #[inline]
    fn locate(&self, shard: &Shard, hint: u64) -> (u64, Option<u64>) {
        if let Some(e) = self.shards.find(hint, |e| e.key == *shard) {
            // The entry's own hash, not the hint that found it: after the table grows, only
            // the hash the entry was placed by is sure to find it again.
            return (e.hash, Some(e.id));
        }
        let own = self.hasher.hash_one(shard);
        if own == hint {
            return (own, None);
        }
        (
            own,
            self.shards.find(own, |e| e.key == *shard).map(|e| e.id),
        )
    }

    /// For the `sync` handle: a credit of `shard` if it has one free and nothing waits in its
    /// line (no barging); `hint` as for [`locate`](Self::locate).
    #[inline]
    pub(crate) fn try_take(&mut self, shard: &Shard, hint: u64) -> Take {
        if self.closed {
            return Take::Closed;
        }
        let (hash, found) = self.locate(shard, hint);
        let Some(id) = found else {
            return match self.open_entry(shard.clone(), hash) {
                Ok(credit) => Take::Credit(credit),
                Err(Exhausted) => Take::Exhausted,
            };
        };
        let cap = self.cfg.max_in_flight;
        let place = Place { hash, entry: id };
        let Some(e) = entry_at(&mut self.shards, place) else {
            return Take::NoCredit; // unreachable: just found
        };
        if e.w.must_wait(cap) {
            return Take::NoCredit;
        }
        let Ok(key) = self.credits.insert(place) else {
            return Take::Exhausted;
        };
        Self::took_credit(&mut e.w, &mut self.active);
        self.maintenance.touch();
        Take::Credit(CreditId(key))
    }

    /// For the `sync` handle: `waiter` joins the back of `shard`'s line (or takes a credit at
    /// once if the shard has one and nobody waits); `hint` as for [`locate`](Self::locate).
    pub(crate) fn enqueue_hinted(
        &mut self,
        shard: &Shard,
        hint: u64,
        waiter: B,
    ) -> Result<Entered<B>, SubmitError<B>> {
        if self.closed {
            return Err(SubmitError::Closed(waiter));
        }
        let (hash, found) = self.locate(shard, hint);
        match found {
            Some(id) => self.enter(Place { hash, entry: id }, waiter),
            None => match self.open_entry(shard.clone(), hash) {
                Ok(credit) => Ok(Entered::Credit(credit, waiter)),
                Err(Exhausted) => Err(SubmitError::Exhausted(waiter)),
            },
        }
    }
}
