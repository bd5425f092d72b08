//! async-std 1.13 adapter for [`throttle_core`].
//!
//! async-std is deprecated upstream (RUSTSEC-2025-0052); this crate stays a thin mirror of
//! `runtime-tokio` for clients that still run on it. Today it holds the clock (a
//! `std::time::Instant` epoch) and sleeping until a core instant. Everything in the core is
//! re-exported.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use throttle_core::*;

/// The core timeline on the system's monotonic clock: nanoseconds since the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct AsyncStdClock {
    epoch: std::time::Instant,
}

impl AsyncStdClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        AsyncStdClock {
            epoch: std::time::Instant::now(),
        }
    }

    /// The current instant on the core timeline.
    pub fn now(&self) -> Instant {
        let since = self.epoch.elapsed();
        Instant::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Sleeps until `at` on the core timeline (returns at once if it has passed).
    pub async fn sleep_until(&self, at: Instant) {
        let left = at.saturating_duration_since(self.now());
        if !left.is_zero() {
            async_std::task::sleep(left).await;
        }
    }
}

impl Default for AsyncStdClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleep_until_does_not_return_early() {
        let clock = AsyncStdClock::new();
        let target = clock.now() + core::time::Duration::from_millis(5);
        async_std::task::block_on(clock.sleep_until(target));
        assert!(clock.now() >= target);
        // A past instant returns at once.
        async_std::task::block_on(clock.sleep_until(Instant::ZERO));
    }
}
