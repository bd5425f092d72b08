//! One retry sequence: [`Backoff`].

use core::time::Duration;

use super::BackoffConfig;
use crate::rng::Rng;

/// One backoff sequence: attempt count, previous delay, drawn additive offset, spent budget.
///
/// # Driving contract
///
/// - **Input**: [`Backoff::next_delay`] once per failure, before retrying; wait the returned
///   span (the caller turns it into a deadline on its own clock), then retry. `None` means the
///   hard total budget refuses the retry: give up. The refusal sticks until `reset`.
/// - **Input**: [`Backoff::reset`] after a success (or to start over): attempt 0, a fresh
///   additive offset on the next delay, the whole budget again.
/// - **Queries** (`&self`): [`Backoff::attempt`], [`Backoff::delay_for`] (what an attempt would
///   get in this sequence, without advancing it), [`Backoff::offset`], [`Backoff::spent`],
///   [`Backoff::remaining_budget`], [`Backoff::is_exhausted`].
///
/// Use one config per `Backoff`: a different config continues from the stored base, capped
/// by the new `max`. The RNG is passed in and never stored, so a `Backoff` is `Clone`,
/// comparable and replayable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backoff {
    /// Delays handed out in this sequence, saturating; the next delay is for this attempt.
    pub(super) attempt: u32,
    /// Base of the last attempt handed out (for additive jitter, grown from the jittered start).
    pub(super) base: u64,
    /// The last delay handed out (the `prev` of decorrelated jitter).
    pub(super) prev: u64,
    /// The additive offset of this sequence, once drawn.
    pub(super) offset: Option<u64>,
    /// Sum of the delays handed out, saturating.
    pub(super) spent: u64,
    /// The budget refused a delay; every later call refuses until `reset`.
    pub(super) exhausted: bool,
}

impl Backoff {
    /// A fresh sequence at attempt 0.
    pub const fn new() -> Self {
        Backoff {
            attempt: 0,
            base: 0,
            prev: 0,
            offset: None,
            spent: 0,
            exhausted: false,
        }
    }

    /// Next delay of the sequence; `None` when the hard total budget refuses it.
    ///
    /// O(1): the base grows from the previous one. A refusal changes nothing but marks the
    /// sequence exhausted.
    #[inline]
    pub fn next_delay<R: Rng + ?Sized>(
        &mut self,
        cfg: &BackoffConfig,
        rng: &mut R,
    ) -> Option<Duration> {
        // The common call, small enough to inline: proportional jitter whose growth fits in
        // `u64`. It is the general path below specialised (same helpers, same draws); anything
        // else goes there before drawing. Proportional jitter has no additive offset, so the
        // first base is `initial`.
        if let Some(spread) = &cfg.spread
            && !self.exhausted
            && let Some(base) = match self.attempt {
                0 => Some(cfg.initial),
                _ => cfg.next_base_narrow(self.base),
            }
        {
            let delay = cfg.draw_spread(spread, base, rng);
            return self.hand_out(cfg, base, delay);
        }
        self.next_delay_general(cfg, rng)
    }

    /// [`Backoff::next_delay`] for every state and config.
    #[inline(never)]
    pub(super) fn next_delay_general<R: Rng + ?Sized>(
        &mut self,
        cfg: &BackoffConfig,
        rng: &mut R,
    ) -> Option<Duration> {
        if self.exhausted {
            return None;
        }
        let mut offset = self.offset;
        let (base, prev) = if self.attempt == 0 {
            // The additive offset, if any, is drawn here: once per sequence.
            (cfg.base_for(0, &mut offset, rng), cfg.initial)
        } else {
            (cfg.next_base(self.base), self.prev)
        };
        let delay = cfg.draw(base, prev, rng);
        let out = self.hand_out(cfg, base, delay);
        if out.is_some() {
            self.offset = offset;
        }
        out
    }

    /// The budget check and the bookkeeping of a drawn delay.
    #[inline]
    pub(super) fn hand_out(
        &mut self,
        cfg: &BackoffConfig,
        base: u64,
        delay: u64,
    ) -> Option<Duration> {
        if let Some(budget) = cfg.budget
            && delay > budget.saturating_sub(self.spent)
        {
            self.exhausted = true;
            return None;
        }
        self.attempt = self.attempt.saturating_add(1);
        self.base = base;
        self.prev = delay;
        self.spent = self.spent.saturating_add(delay);
        Some(Duration::from_nanos(delay))
    }

    /// The delay `attempt` would get in this sequence, without advancing it.
    ///
    /// It uses this sequence's additive offset (a throwaway one is drawn if none is yet) and,
    /// for decorrelated jitter, this sequence's previous delay when `attempt` is the next one
    /// (otherwise the stand-in of [`BackoffConfig::delay_for`]). With the same RNG state,
    /// `delay_for(cfg, self.attempt(), rng)` is what `next_delay` returns, budget aside.
    pub fn delay_for<R: Rng + ?Sized>(
        &self,
        cfg: &BackoffConfig,
        attempt: u32,
        rng: &mut R,
    ) -> Duration {
        let base = cfg.base_for(attempt, &mut self.offset.clone(), rng);
        let prev = if attempt == self.attempt && attempt > 0 {
            self.prev
        } else {
            cfg.stand_in_prev(attempt)
        };
        Duration::from_nanos(cfg.draw(base, prev, rng))
    }

    /// Delays handed out since the last reset (saturating at `u32::MAX`).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Starts a new sequence: attempt 0, no offset, nothing spent, not exhausted.
    pub fn reset(&mut self) {
        *self = Backoff::new();
    }

    /// The additive offset drawn for this sequence, if one has been.
    pub fn offset(&self) -> Option<Duration> {
        self.offset.map(Duration::from_nanos)
    }

    /// The sum of the delays handed out since the last reset (saturating).
    pub fn spent(&self) -> Duration {
        Duration::from_nanos(self.spent)
    }

    /// What is left of `cfg`'s total budget, or `None` if it has none.
    pub fn remaining_budget(&self, cfg: &BackoffConfig) -> Option<Duration> {
        cfg.budget
            .map(|b| Duration::from_nanos(b.saturating_sub(self.spent)))
    }

    /// Whether the budget has refused a delay (every later `next_delay` is `None` until reset).
    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }
}
