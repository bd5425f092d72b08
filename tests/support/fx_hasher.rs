//! FxHash's word hasher, shared by the benchmark and the instruction-count harness
//! (`tests/instructions/count.sh` copies this file beside the harness).

use std::hash::Hasher;

/// FxHash's multiply-rotate word hasher (written here; the core ships no hasher). Used only to
/// show what the keyed machines cost with a cheap hasher next to std's SipHash `RandomState`,
/// which is what the adapters pass and what the target rows use.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}
