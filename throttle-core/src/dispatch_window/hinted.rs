//! The entry points of the `sync` window handle, which hashes a key before it takes its lock
//! and passes that hash in as a hint.
//!
//! The hint is only a hint: an entry found by it is named by the entry's own hash (after the
//! table grows, only the hash an entry was placed by is sure to find it again), and a miss
//! hashes the key again with the window's own hasher, so a hasher whose clones hash
//! differently costs a second lookup, never a second entry for the same shard. Each lookup
//! (user `Eq`) runs before anything changes.

use core::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

use super::{DispatchWindow, Entered, Exhausted, Place, ShardEntry, SubmitError, Take};

/// Where a hinted lookup of a shard ended.
pub(super) enum Found<'a, Shard, B> {
    /// The shard's entry, and its place.
    Entry(&'a mut ShardEntry<Shard, B>, Place),
    /// No entry: the shard is new, and this is the window's own hash of its key.
    New(u64),
}

/// `shard`'s entry, looked up first with `hint` (one probe in the common case), then, on a
/// miss, with the window's own hash of the key.
#[inline]
pub(super) fn find_hinted<'a, Shard: Hash + Eq, B, S: BuildHasher>(
    shards: &'a mut HashTable<ShardEntry<Shard, B>>,
    hasher: &S,
    shard: &Shard,
    hint: u64,
) -> Found<'a, Shard, B> {
    let shards = match shards.find_entry(hint, |e| e.key == *shard) {
        Ok(found) => return Found::entry(found.into_mut()),
        Err(absent) => absent.into_table(),
    };
    let own = hasher.hash_one(shard);
    if own == hint {
        return Found::New(own);
    }
    match shards.find_mut(own, |e| e.key == *shard) {
        Some(e) => Found::entry(e),
        None => Found::New(own),
    }
}

impl<'a, Shard, B> Found<'a, Shard, B> {
    #[inline]
    fn entry(e: &'a mut ShardEntry<Shard, B>) -> Self {
        let place = Place {
            hash: e.hash,
            entry: e.id,
        };
        Found::Entry(e, place)
    }
}

impl<Shard, B, S> DispatchWindow<Shard, B, S>
where
    Shard: Hash + Eq + Clone,
    S: BuildHasher,
{
    /// For the `sync` handle: a credit of `shard` if it has one free and nothing waits in its
    /// line (no barging).
    #[inline]
    pub(crate) fn try_take(&mut self, shard: &Shard, hint: u64) -> Take {
        if self.books.refuses() {
            return Take::Closed;
        }
        let default = self.cfg.cap();
        match find_hinted(&mut self.shards, &self.hasher, shard, hint) {
            Found::Entry(e, place) => {
                let cap = e.w.cap(default);
                self.books.admit(&mut e.w, place, cap)
            }
            Found::New(hash) => match self.open_entry(shard.clone(), hash) {
                Ok(credit) => Take::Credit(credit),
                Err(Exhausted) => Take::Exhausted,
            },
        }
    }

    /// Credits in flight for the shard `credit` (live) belongs to, found through the credit's
    /// place, so it runs no user code (the `sync` handle's test statistics read it right
    /// after issuing `credit`). 0 for a credit that is not live.
    #[cfg(test)]
    pub(crate) fn in_flight_of(&self, credit: super::CreditId) -> u32 {
        let Some(place) = self.books.credits.get(credit.0) else {
            return 0;
        };
        self.shards
            .find(place.hash, |e| e.id == place.entry)
            .map_or(0, |e| e.w.in_flight)
    }

    /// For the `sync` handle: `waiter` joins the back of `shard`'s line (or takes a credit at
    /// once if the shard has one and nobody waits).
    pub(crate) fn enqueue_hinted(
        &mut self,
        shard: &Shard,
        hint: u64,
        waiter: B,
    ) -> Result<Entered<B>, SubmitError<B>> {
        if self.books.refuses() {
            return Err(SubmitError::Closed(waiter));
        }
        let default = self.cfg.cap();
        match find_hinted(&mut self.shards, &self.hasher, shard, hint) {
            Found::Entry(e, place) => {
                let cap = e.w.cap(default);
                self.books.enter(&mut e.w, place, waiter, cap)
            }
            Found::New(hash) => match self.open_entry(shard.clone(), hash) {
                Ok(credit) => Ok(Entered::Credit(credit, waiter)),
                Err(Exhausted) => Err(SubmitError::Exhausted(waiter)),
            },
        }
    }
}
