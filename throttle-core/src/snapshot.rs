//! Paged snapshots of a machine's tracked keys: [`Page`] and the [`Cursor`] a walk resumes
//! from. One page per call, so a handle holds its lock for one page only. Keys added during
//! a walk may be missed, and a key's state is as of the page that lists it. What a walk over a
//! machine that changes between pages guarantees depends on its storage:
//!
//! - **The write gate** keeps its buckets in dense storage, walked from its end toward its
//!   start. It evicts with `swap_remove` (the last entry moves into the freed place), so
//!   every bucket tracked for the whole walk is listed **at least once**: an eviction behind
//!   the cursor moves an entry already listed to a place not yet visited (it may then be
//!   listed twice), and one ahead of it moves an entry already listed within the listed part.
//! - **The connection table** keeps its endpoints in slots that never move (a connection id
//!   names its slot), walked from the last toward the first: every endpoint tracked for the
//!   whole walk is listed **exactly once**.
//! - **The dispatch window** keeps its shards in a hash table that may rehash between pages,
//!   so a walk goes by each entry's stored hash instead (ties by entry number): a page lists
//!   the `max` entries that follow the cursor in that order, found by one pass over the table
//!   (O(entries · log max) per page). Every shard tracked for the whole walk is listed
//!   **exactly once**.

use alloc::vec::Vec;
use core::ops::Range;

/// Where a paged walk resumes: pass a page's [`Page::next`] to the next call, on the same
/// machine (a cursor of another walk or machine resumes somewhere, never out of bounds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cursor(u64, u64, u64);

impl Cursor {
    /// A position in dense storage or slots.
    pub(crate) fn position(at: usize) -> Self {
        Cursor(at as u64, 0, 0)
    }

    /// The position this cursor names (saturating).
    pub(crate) fn at(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }

    /// A place in an order by `(hash, id)`: the walk resumes after it.
    pub(crate) fn after(hash: u64, id: u64) -> Self {
        Cursor(hash, id, 0)
    }

    /// This cursor, tagged with the part of a composite walk it belongs to (a striped
    /// handle's stripe); the machine that made it ignores the tag.
    #[cfg(feature = "std")]
    pub(crate) fn in_part(self, part: u64) -> Self {
        Cursor(self.0, self.1, part)
    }

    /// The part tag given with [`Self::in_part`] (0 for a cursor without one).
    #[cfg(feature = "std")]
    pub(crate) fn part(self) -> u64 {
        self.2
    }

    /// The `(hash, id)` a walk in that order resumes after.
    pub(crate) fn order(self) -> (u64, u64) {
        (self.0, self.1)
    }
}

/// One page of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page<T> {
    /// The entries of this page (at most the page size asked for).
    pub items: Vec<T>,
    /// Where the next page starts; `None` once the walk is complete.
    pub next: Option<Cursor>,
}

impl<T> Page<T> {
    /// The positions of the page of at most `max` entries that starts at `from` (`None`: a new
    /// walk) over storage of `len` entries, walked from the end, and the cursor after it. A
    /// page size of 0 is read as 1, so every walk ends.
    pub(crate) fn walk(
        len: usize,
        from: Option<Cursor>,
        max: usize,
    ) -> (Range<usize>, Option<Cursor>) {
        let end = from.map_or(len, Cursor::at).min(len);
        let start = end.saturating_sub(max.max(1));
        (start..end, (start > 0).then_some(Cursor::position(start)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_covers_every_place_once_from_the_end_and_ends() {
        let mut seen = Vec::new();
        let mut from = None;
        loop {
            let (range, next) = Page::<()>::walk(7, from, 3);
            seen.extend(range.rev());
            match next {
                Some(c) => from = Some(c),
                None => break,
            }
        }
        assert_eq!(seen, [6, 5, 4, 3, 2, 1, 0]);
        // Storage that shrank below the cursor resumes at its end; size 0 still moves.
        assert_eq!(
            Page::<()>::walk(2, Some(Cursor::position(5)), 1),
            (1..2, Some(Cursor::position(1)))
        );
        assert_eq!(
            Page::<()>::walk(3, None, 0),
            (2..3, Some(Cursor::position(2)))
        );
        assert_eq!(Page::<()>::walk(0, None, 4), (0..0, None));
    }
}
