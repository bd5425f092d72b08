//! A small deterministic hasher for unit tests and model checkers (the crate has no default
//! hasher: core machines stay generic over `S`).

/// A small deterministic hasher for tests and model checkers (the crate has no default one).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FnvHasher(u64);

impl core::hash::Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        if self.0 == 0 {
            self.0 = 0xcbf2_9ce4_8422_2325;
        }
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The hasher builder tests and model checkers pass as `S`.
pub(crate) type TestHasher = core::hash::BuildHasherDefault<FnvHasher>;
