//! A key for the machines' panic-safety unit tests: its `Hash`, `Eq` or `Clone` panics on
//! demand, as a hostile or buggy user key might.

use core::cell::Cell;
use core::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// A user callback of [`PanicKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Hash,
    Eq,
    Clone,
}

std::thread_local! {
    /// The armed call: (key id, callback, matching calls to let pass first).
    static ARMED: Cell<Option<(u32, Call, u32)>> = const { Cell::new(None) };
}

/// A key hashed and compared by its id, whose callbacks panic when armed (see [`panics`]).
#[derive(Debug)]
pub(crate) struct PanicKey(pub(crate) u32);

fn hit(id: u32, call: Call) {
    let fire = ARMED.with(|armed| match armed.get() {
        Some((k, c, skip)) if k == id && c == call => {
            if skip == 0 {
                armed.set(None);
                true
            } else {
                armed.set(Some((k, c, skip - 1)));
                false
            }
        }
        _ => false,
    });
    if fire {
        panic!("armed {call:?} of key {id}");
    }
}

impl Hash for PanicKey {
    fn hash<S: Hasher>(&self, state: &mut S) {
        hit(self.0, Call::Hash);
        self.0.hash(state);
    }
}

impl PartialEq for PanicKey {
    fn eq(&self, other: &Self) -> bool {
        hit(self.0, Call::Eq);
        self.0 == other.0
    }
}

impl Eq for PanicKey {}

std::thread_local! {
    /// Clones of any [`PanicKey`] made on this thread.
    static CLONES: Cell<u64> = const { Cell::new(0) };
}

impl Clone for PanicKey {
    fn clone(&self) -> Self {
        hit(self.0, Call::Clone);
        CLONES.with(|n| n.set(n.get() + 1));
        PanicKey(self.0)
    }
}

/// How many [`PanicKey`]s this thread has cloned so far.
pub(crate) fn clones() -> u64 {
    CLONES.with(Cell::get)
}

/// Arms the `skip + 1`-th `call` on key `id`, runs `f`, and disarms. Returns whether `f`
/// panicked (the armed call, or anything else).
pub(crate) fn panics(id: u32, call: Call, skip: u32, f: impl FnOnce()) -> bool {
    ARMED.with(|armed| armed.set(Some((id, call, skip))));
    let out = catch_unwind(AssertUnwindSafe(f));
    ARMED.with(|armed| armed.set(None));
    out.is_err()
}

std::thread_local! {
    /// Calls of a [`Touchy`] key's `Hash`, `Eq` and `Clone` left before they panic (`None`:
    /// never).
    static BUDGET: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Lets `budget` calls of a touchy key's `Hash`, `Eq` and `Clone` pass, then panics at the
/// next one (`None`: never panics).
pub(crate) fn arm_budget(budget: Option<usize>) {
    BUDGET.with(|b| b.set(budget));
}

fn spend() {
    BUDGET.with(|b| match b.get() {
        Some(0) => panic!("a key's Hash, Eq or Clone panics"),
        Some(n) => b.set(Some(n - 1)),
        None => {}
    });
}

/// A key whose `Hash` and `Clone` (if `touchy`) and `Eq` (if also `eq_touchy`) panic once the
/// budget set by [`arm_budget`] is spent: for sweeps that panic at the n-th key call.
#[derive(Debug)]
pub(crate) struct Touchy {
    pub(crate) id: u32,
    pub(crate) touchy: bool,
    pub(crate) eq_touchy: bool,
}

impl Hash for Touchy {
    fn hash<Hs: Hasher>(&self, h: &mut Hs) {
        if self.touchy {
            spend();
        }
        self.id.hash(h);
    }
}

impl PartialEq for Touchy {
    fn eq(&self, other: &Self) -> bool {
        if (self.touchy && self.eq_touchy) || (other.touchy && other.eq_touchy) {
            spend();
        }
        self.id == other.id
    }
}

impl Eq for Touchy {}

impl Clone for Touchy {
    fn clone(&self) -> Self {
        if self.touchy {
            spend();
        }
        Touchy { ..*self }
    }
}
