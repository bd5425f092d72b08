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

impl Clone for PanicKey {
    fn clone(&self) -> Self {
        hit(self.0, Call::Clone);
        PanicKey(self.0)
    }
}

/// Arms the `skip + 1`-th `call` on key `id`, runs `f`, and disarms. Returns whether `f`
/// panicked (the armed call, or anything else).
pub(crate) fn panics(id: u32, call: Call, skip: u32, f: impl FnOnce()) -> bool {
    ARMED.with(|armed| armed.set(Some((id, call, skip))));
    let out = catch_unwind(AssertUnwindSafe(f));
    ARMED.with(|armed| armed.set(None));
    out.is_err()
}
