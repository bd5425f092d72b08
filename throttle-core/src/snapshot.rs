//! Paged snapshots of a machine's tracked keys: [`Page`] and the [`Cursor`] a walk resumes
//! from.
//!
//! A walk visits the machine's dense storage from its end toward its start, one page per call,
//! so a handle can hold its lock for one page only. The machines evict with `swap_remove`
//! (the last entry moves into the freed place), so every key tracked for the whole walk is
//! listed at least once: an eviction behind the cursor moves an entry already listed to a
//! place not yet visited (it may then be listed twice), and one ahead of it moves an entry
//! already listed within the listed part. Keys added during the walk may be missed, and a
//! key's state is as of the page that lists it.

use alloc::vec::Vec;
use core::ops::Range;

/// Where a paged walk resumes: pass a page's [`Page::next`] to the next call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cursor(usize);

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
        let end = from.map_or(len, |c| c.0).min(len);
        let start = end.saturating_sub(max.max(1));
        (start..end, (start > 0).then_some(Cursor(start)))
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
            Page::<()>::walk(2, Some(Cursor(5)), 1),
            (1..2, Some(Cursor(1)))
        );
        assert_eq!(Page::<()>::walk(3, None, 0), (2..3, Some(Cursor(2))));
        assert_eq!(Page::<()>::walk(0, None, 4), (0..0, None));
    }
}
