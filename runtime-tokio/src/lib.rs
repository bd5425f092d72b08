//! Tokio adapter for [`throttle_core`].
//!
//! This crate holds only what is specific to tokio: today the clock that maps
//! `tokio::time::Instant` onto the core's [`Instant`] timeline (so tokio's paused time drives
//! the machines) and sleeping until a core instant. The handles, permits and drivers arrive
//! with the concurrent layer. Everything in the core is re-exported.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use throttle_core::*;

/// The core timeline on tokio's clock: nanoseconds since the moment the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        TokioClock {
            epoch: tokio::time::Instant::now(),
        }
    }

    /// The current instant on the core timeline.
    pub fn now(&self) -> Instant {
        let since = tokio::time::Instant::now().saturating_duration_since(self.epoch);
        Instant::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Sleeps until `at` on the core timeline (returns at once if it has passed).
    pub async fn sleep_until(&self, at: Instant) {
        let target = self
            .epoch
            .checked_add(core::time::Duration::from_nanos(at.as_nanos()));
        match target {
            Some(t) => tokio::time::sleep_until(t).await,
            // Beyond what tokio can represent: never arrives.
            None => core::future::pending().await,
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn paused_time_drives_the_core_clock() {
        let clock = TokioClock::new();
        assert_eq!(clock.now(), Instant::ZERO);
        clock.sleep_until(Instant::from_millis(250)).await;
        assert_eq!(clock.now(), Instant::from_millis(250));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(clock.now(), Instant::from_millis(1_250));
    }
}
