//! One retry sequence: [`Backoff`].

use core::time::Duration;

use super::BackoffConfig;
use crate::rng::Rng;

/// Why a [`Backoff`] refused a delay ([`Backoff::exhausted`]).
///
/// The limits are checked in this order: attempts and the soft max-wait before drawing
/// (nothing is drawn from the RNG for a refusal), the hard budget after (it needs the delay).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Exhausted {
    /// The sequence has handed out `max_attempts` delays (Gobblin's `maxRetries`).
    Attempts,
    /// The delays handed out already sum to more than `max_wait` (Gobblin's `maxWait`).
    MaxWait,
    /// The next delay is larger than what is left of the hard total budget.
    Budget,
}

/// One backoff sequence: attempt count, previous delay, drawn additive offset, spent budget.
///
/// # Driving contract
///
/// - **Input**: [`Backoff::next_delay`] once per failure, before retrying; wait the returned
///   span (the caller turns it into a deadline on its own clock), then retry. `None` means a
///   limit of the config refuses the retry (`max_attempts`, the soft `max_wait`, or the hard
///   total budget; [`Backoff::exhausted`] says which): give up. The refusal sticks until
///   `reset`.
/// - **Input**: [`Backoff::reset`] after a success (or to start over): attempt 0, a fresh
///   additive offset on the next delay, the whole budget again.
/// - **Queries** (`&self`): [`Backoff::attempt`], [`Backoff::delay_for`] (what an attempt would
///   get in this sequence, without advancing it), [`Backoff::offset`], [`Backoff::spent`],
///   [`Backoff::remaining_budget`], [`Backoff::is_exhausted`], [`Backoff::exhausted`].
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
    /// Why a delay was refused; every later call refuses until `reset`.
    pub(super) exhausted: Option<Exhausted>,
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
            exhausted: None,
        }
    }

    /// Next delay of the sequence; `None` when a limit refuses it ([`Backoff::exhausted`]).
    ///
    /// O(1): the base grows from the previous one. A refusal changes nothing but marks the
    /// sequence exhausted; the attempt and max-wait limits refuse before anything is drawn.
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
        if let Some(spread) = &cfg.spread {
            if self.exhausted.is_none() && !self.at_limit(cfg) {
                let base = match self.attempt {
                    // An unjittered first delay draws nothing: the general path.
                    0 if cfg.first_unjittered => None,
                    0 => Some(cfg.initial),
                    _ => cfg.next_base_narrow(self.base),
                };
                if let Some(base) = base {
                    let delay = cfg.draw_spread(spread, base, rng);
                    return self.hand_out(cfg, base, delay);
                }
            }
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
        if self.exhausted.is_some() {
            return None;
        }
        if let Some(why) = self.limit(cfg) {
            self.exhausted = Some(why);
            return None;
        }
        let mut offset = self.offset;
        let (base, prev) = if self.attempt == 0 {
            // The additive offset, if any, is drawn here: once per sequence.
            (cfg.base_for(0, &mut offset, rng), cfg.initial)
        } else {
            (cfg.next_base(self.base), self.prev)
        };
        let delay = cfg.draw_at(self.attempt, base, prev, rng);
        let out = self.hand_out(cfg, base, delay);
        if out.is_some() {
            self.offset = offset;
        }
        out
    }

    /// Whether `max_attempts` or the soft `max_wait` refuses the next delay.
    #[inline]
    fn at_limit(&self, cfg: &BackoffConfig) -> bool {
        self.limit(cfg).is_some()
    }

    /// The limit checked before drawing that refuses the next delay, if any: Gobblin's
    /// `retryNumber > maxRetries`, then its `totalWait > maxWait` (strictly more: a sequence
    /// that has waited exactly `max_wait` still gets one more delay).
    #[inline]
    fn limit(&self, cfg: &BackoffConfig) -> Option<Exhausted> {
        if cfg.max_attempts.is_some_and(|n| self.attempt >= n) {
            Some(Exhausted::Attempts)
        } else if cfg.max_wait.is_some_and(|w| self.spent > w) {
            Some(Exhausted::MaxWait)
        } else {
            None
        }
    }

    /// The budget check and the bookkeeping of a drawn delay.
    #[inline]
    pub(super) fn hand_out(
        &mut self,
        cfg: &BackoffConfig,
        base: u64,
        delay: u64,
    ) -> Option<Duration> {
        if let Some(budget) = cfg.budget {
            if delay > budget.saturating_sub(self.spent) {
                self.exhausted = Some(Exhausted::Budget);
                return None;
            }
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
        Duration::from_nanos(cfg.draw_at(attempt, base, prev, rng))
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

    /// Whether a limit has refused a delay (every later `next_delay` is `None` until reset).
    pub fn is_exhausted(&self) -> bool {
        self.exhausted.is_some()
    }

    /// Which limit refused a delay, if one has since the last reset.
    pub fn exhausted(&self) -> Option<Exhausted> {
        self.exhausted
    }
}
