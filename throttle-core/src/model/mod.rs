//! Operation decoders and naive reference models (feature `model`).
//!
//! One checker per machine turns arbitrary bytes into a sequence of operations (time steps
//! forward and back, huge values, bogus ids), drives the real machine and a naive reference
//! that shares no code with it (plain `Vec` scans), and compares every answer. proptest feeds
//! it random bytes and cargo-fuzz feeds it coverage-guided bytes: one checker, two drivers.
//!
//! Each `check(bytes)` returns `Err(Divergence)` describing the first disagreement.
//!
//! The checkers of the machines that call user code (`Hash`, `Eq`, `Clone` of keys) drive
//! them with [`user::Key`] and have a panicking-callback operation (see [`user`]).

use alloc::string::String;
use core::time::Duration;

use crate::time::Instant;

pub mod backoff;
pub mod backpressure;
pub mod batcher;
pub mod conn_key;
pub mod dispatch_window;
pub mod failover;
pub mod grpc_config;
pub mod limiter;
pub mod paced_writer;
pub mod pending_bytes;
pub mod user;
pub mod write_gate;

/// A disagreement between a machine and its reference model, described for a human.
pub type Divergence = String;

/// Reads operations out of fuzzer bytes; once the bytes run out every read yields zero.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Cursor { data, pos: 0 }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte (0 once exhausted).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    /// The next eight bytes, little-endian.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    /// A bool from one byte.
    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// An operation (or variant) selector: `Some(v)` for a value `v < n`, `None` for a value
    /// not assigned yet. Reads exactly one byte either way.
    ///
    /// Selector values keep their meaning forever, so a stored corpus input means the same
    /// run after an operation is added: the new operation takes the next unassigned value,
    /// and every input that used that value as a no-op is the only one whose meaning changes.
    /// On `None` the caller skips the operation and reads nothing else for it. A modulo here
    /// would renumber every operation whenever `n` grows (see "Stable decoders" in
    /// `docs/verification.md`).
    pub fn select(&mut self, n: u8) -> Option<u8> {
        let v = self.u8();
        (v < n).then_some(v)
    }

    /// A parameter value in `0..n` (0 when `n == 0`). For ranges of a parameter only: an
    /// operation or a variant is picked with [`Cursor::select`].
    pub fn below(&mut self, n: u8) -> u8 {
        if n == 0 { 0 } else { self.u8() % n }
    }

    /// A value that is usually small but sometimes extreme (`0`, `u32::MAX`).
    pub fn small_or_extreme_u32(&mut self) -> u32 {
        match self.u8() % 8 {
            0 => 0,
            1 => u32::MAX,
            2 => self.u32(),
            _ => u32::from(self.u8() % 16),
        }
    }

    /// A span: usually up to a few seconds, sometimes zero, 1 ns, or enormous.
    pub fn duration(&mut self) -> Duration {
        match self.u8() % 8 {
            0 => Duration::ZERO,
            1 => Duration::from_nanos(1),
            2 => Duration::from_nanos(u64::MAX),
            3 => Duration::from_nanos(self.u64()),
            4 | 5 => Duration::from_millis(u64::from(self.u16())),
            _ => Duration::from_micros(u64::from(self.u32() % 5_000_000)),
        }
    }

    /// The next `now` for a driver: mostly forward, sometimes backwards, sometimes a leap to
    /// the end of time.
    pub fn time_step(&mut self, now: Instant) -> Instant {
        match self.u8() % 16 {
            0 => now.saturating_sub(Duration::from_millis(u64::from(self.u16()))),
            1 => Instant::MAX.saturating_sub(Duration::from_nanos(u64::from(self.u8()))),
            2 => now,
            3 => now + Duration::from_nanos(1),
            4 => Instant::from_nanos(self.u64()),
            _ => now + self.duration_short(),
        }
    }

    fn duration_short(&mut self) -> Duration {
        Duration::from_micros(u64::from(self.u32() % 3_000_000))
    }
}

/// Runs `check` on `rounds` inputs of `len` bytes drawn from SplitMix64 seeded with `seed`
/// (two rounds under miri), panicking with the first divergence.
#[cfg(test)]
pub(crate) fn random_inputs_pass(
    check: fn(&[u8]) -> Result<(), Divergence>,
    seed: u64,
    rounds: usize,
    len: usize,
) {
    use crate::rng::{Rng, SplitMix64};
    let mut rng = SplitMix64::new(seed);
    let rounds = if cfg!(miri) { 2 } else { rounds };
    let mut data = alloc::vec![0u8; len];
    for round in 0..rounds {
        for b in data.iter_mut() {
            *b = rng.next_u64() as u8;
        }
        if let Err(d) = check(&data) {
            panic!("round {round}: {d}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_reads_little_endian_then_zeroes() {
        let mut c = Cursor::new(&[1, 2, 3]);
        assert_eq!(c.u16(), 0x0201);
        assert!(!c.is_empty());
        assert_eq!(c.u16(), 0x0003);
        assert!(c.is_empty());
        assert_eq!(c.u64(), 0);
        assert_eq!(c.below(0), 0);
    }

    #[test]
    fn select_keeps_assigned_values_and_skips_the_rest_reading_one_byte() {
        let mut c = Cursor::new(&[0, 5, 6, 255, 7]);
        assert_eq!(c.select(6), Some(0));
        assert_eq!(c.select(6), Some(5));
        assert_eq!(c.select(6), None);
        assert_eq!(c.select(6), None);
        assert_eq!(c.u8(), 7);
        assert!(c.is_empty());
        // Exhausted bytes read as zero, the first operation.
        assert_eq!(c.select(6), Some(0));
        assert_eq!(Cursor::new(&[0]).select(0), None);
    }

    #[test]
    fn time_step_can_go_backwards_and_to_the_end() {
        let now = Instant::from_millis(10);
        assert!(Cursor::new(&[0, 5, 0]).time_step(now) < now);
        assert!(Cursor::new(&[1, 0]).time_step(now) >= Instant::MAX - Duration::from_nanos(255));
    }
}
