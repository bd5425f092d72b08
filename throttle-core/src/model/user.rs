//! Stand-ins for user code: a key whose `Hash`, `Eq` or `Clone` can be armed to panic, and the
//! checkers' panicking-callback operation built on it.
//!
//! The operation arms one call ([`Arm`]: which callback, on which key, after how many calls
//! that pass), runs one ordinary machine input under `catch_unwind` ([`run`]), and disarms.
//! It takes three operation values in each model, one per callback ([`Arm::OPS`]), so that
//! random bytes reach it as often as any weighted operation.
//! If the armed call panicked inside the machine, the checker asserts that the input did not
//! happen at all: the machine's `Debug` form is exactly what it was before ([`unchanged`]),
//! its own invariants hold, and the reference model is rolled back to its state before the
//! input. Every later operation then checks that the machine keeps serving.
//!
//! Arming needs `std` (a thread-local and `catch_unwind`). Without it, the operation decodes
//! the same bytes and runs its input unarmed, so a corpus input means the same run either way
//! except for the panic.
//!
//! Model code never compares, hashes or clones a [`Key`] itself (it reads [`Key::id`]), so an
//! armed call can only fire inside the machine.

use alloc::format;
use alloc::string::String;
use core::fmt::Debug;
use core::hash::{Hash, Hasher};

use super::{Cursor, Divergence};

/// A user key: an id, hashed and compared by it, whose `Hash`, `Eq` and `Clone` panic when
/// armed.
#[derive(Debug)]
pub struct Key(u8);

impl Key {
    /// The key with id `id`.
    pub const fn new(id: u8) -> Self {
        Key(id)
    }

    /// Its id (read by model code instead of `==`, which could fire an armed `Eq`).
    pub const fn id(&self) -> u8 {
        self.0
    }
}

impl Hash for Key {
    fn hash<S: Hasher>(&self, state: &mut S) {
        hit(self.0, Callback::Hash);
        // As `u8` hashes: the machines see the same hashes as with plain `u8` keys.
        self.0.hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        hit(self.0, Callback::Eq);
        self.0 == other.0
    }
}

impl Eq for Key {}

impl Clone for Key {
    fn clone(&self) -> Self {
        hit(self.0, Callback::Clone);
        Key(self.0)
    }
}

/// The user callback an [`Arm`] makes panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Callback {
    /// `Hash::hash`.
    Hash,
    /// `PartialEq::eq` (on either side of the comparison: the left operand's id is matched).
    Eq,
    /// `Clone::clone`.
    Clone,
}

/// Which call panics: the `skip + 1`-th call of `callback` on a key with id `key` (on any key
/// when `None`) while [`run`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arm {
    /// The callback that panics.
    pub callback: Callback,
    /// The key whose callback panics; `None`: any key's.
    pub key: Option<u8>,
    /// Matching calls that pass before the one that panics.
    pub skip: u8,
}

impl Arm {
    /// Operation values one panicking-callback operation takes, one per [`Callback`]: a
    /// model's values `n..n + Arm::OPS` are `Hash`, `Eq` and `Clone`, in that order.
    pub const OPS: u8 = 3;

    /// Decodes the arm of panicking-callback operation `which` (`0..Arm::OPS`: `Hash`, `Eq`,
    /// `Clone`) over keys `0..keys`: the key (`below(keys + 1)`, where `keys` means any key),
    /// then the calls that pass first (`below(4)`). `None` for a `which` not assigned (reads
    /// nothing).
    pub fn decode(c: &mut Cursor<'_>, which: u8, keys: u8) -> Option<Arm> {
        let callback = match which {
            0 => Callback::Hash,
            1 => Callback::Eq,
            2 => Callback::Clone,
            _ => return None,
        };
        let k = c.below(keys.saturating_add(1));
        Some(Arm {
            callback,
            key: (k < keys).then_some(k),
            skip: c.below(4),
        })
    }
}

/// The armed call panicked inside the input [`run`] ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Panicked;

/// The payload of an armed panic, told apart from every other panic (which propagates).
#[cfg(feature = "std")]
struct ArmedPanic;

#[cfg(feature = "std")]
std::thread_local! {
    static ARMED: core::cell::Cell<Option<Arm>> = const { core::cell::Cell::new(None) };
}

/// Called by every [`Key`] callback: panics if this is the armed call.
fn hit(id: u8, callback: Callback) {
    #[cfg(feature = "std")]
    {
        let fire = ARMED.with(|armed| {
            let Some(arm) = armed.get() else {
                return false;
            };
            if arm.callback != callback || arm.key.is_some_and(|k| k != id) {
                return false;
            }
            match arm.skip.checked_sub(1) {
                Some(skip) => {
                    armed.set(Some(Arm { skip, ..arm }));
                    false
                }
                None => {
                    armed.set(None);
                    true
                }
            }
        });
        if fire {
            std::panic::panic_any(ArmedPanic);
        }
    }
    #[cfg(not(feature = "std"))]
    let _ = (id, callback);
}

/// Runs `f` with `arm` armed and disarms afterwards. `Err(Panicked)` if the armed call
/// panicked inside `f`; any other panic propagates. Without `std`, runs `f` unarmed.
///
/// The first call installs a panic hook that stays silent for armed panics and hands every
/// other panic to the hook installed before it (libFuzzer's, which aborts, under cargo-fuzz).
pub fn run<R>(arm: Arm, f: impl FnOnce() -> R) -> Result<R, Panicked> {
    #[cfg(feature = "std")]
    {
        use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
        install_hook();
        ARMED.with(|armed| armed.set(Some(arm)));
        let out = catch_unwind(AssertUnwindSafe(f));
        ARMED.with(|armed| armed.set(None));
        match out {
            Ok(r) => Ok(r),
            Err(payload) if payload.is::<ArmedPanic>() => Err(Panicked),
            Err(payload) => resume_unwind(payload),
        }
    }
    #[cfg(not(feature = "std"))]
    {
        let _ = arm;
        Ok(f())
    }
}

#[cfg(feature = "std")]
fn install_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(std::boxed::Box::new(move |info| {
            if !info.payload().is::<ArmedPanic>() {
                previous(info);
            }
        }));
    });
}

/// The `Debug` form of a machine, taken before an armed input to compare with [`unchanged`].
pub fn snapshot<M: Debug>(machine: &M) -> String {
    format!("{machine:?}")
}

/// After an input whose armed callback panicked: the machine must be exactly as `before`.
pub fn unchanged<M: Debug>(before: &str, machine: &M, arm: Arm) -> Result<(), Divergence> {
    let after = snapshot(machine);
    if after == before {
        return Ok(());
    }
    Err(format!(
        "a panicking {arm:?} left the machine changed:\nbefore {before}\nafter  {after}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_reads_the_key_then_the_skips() {
        let mut c = Cursor::new(&[2, 3]);
        assert_eq!(
            Arm::decode(&mut c, 1, 4),
            Some(Arm {
                callback: Callback::Eq,
                key: Some(2),
                skip: 3
            })
        );
        let mut c = Cursor::new(&[4, 0]);
        assert_eq!(
            Arm::decode(&mut c, 2, 4).map(|a| (a.callback, a.key)),
            Some((Callback::Clone, None))
        );
        let mut c = Cursor::new(&[7]);
        assert_eq!(Arm::decode(&mut c, 3, 4), None);
        assert_eq!(c.u8(), 7, "an unassigned operation reads nothing more");
    }

    #[cfg(feature = "std")]
    #[test]
    fn an_armed_call_panics_once_after_its_skips_and_other_panics_propagate() {
        use core::hash::BuildHasher;
        let hasher = crate::test_hasher::TestHasher::default();
        let arm = Arm {
            callback: Callback::Hash,
            key: Some(1),
            skip: 1,
        };
        let calls = core::cell::Cell::new(0);
        let got = run(arm, || {
            let _ = hasher.hash_one(Key::new(0));
            calls.set(calls.get() + 1);
            let _ = hasher.hash_one(Key::new(1));
            calls.set(calls.get() + 1);
            let _ = hasher.hash_one(Key::new(1));
            calls.set(calls.get() + 1);
        });
        assert_eq!((got, calls.get()), (Err(Panicked), 2));
        // Disarmed afterwards.
        let _ = hasher.hash_one(Key::new(1));
        assert_eq!(run(arm, || Key::new(1) == Key::new(1)), Ok(true));
        let other = std::panic::catch_unwind(|| run(arm, || panic!("not armed")));
        assert!(
            other.is_err(),
            "a panic that is not the armed one propagates"
        );
    }
}
