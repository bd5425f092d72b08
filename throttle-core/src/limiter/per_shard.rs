//! [`PerShard`]: a limiter per shard, fed by the batches a dispatch window sends and ends, whose
//! limits drive the window (issue 18 item 3; `docs/limiter.md`, "Driving a window").

use alloc::vec::Vec;

use super::{Limiter, LimiterConfig, Outcome, Sample};
use crate::dispatch_window::CreditId;
use crate::error::ConfigError;
use crate::time::Instant;

/// What [`PerShard`] remembers of a batch in flight.
#[derive(Clone, Copy, Debug)]
struct Started {
    credit: CreditId,
    shard: usize,
    at: Instant,
    in_flight: u32,
}

/// How a batch ended, for its shard's limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BatchEnd {
    /// The server answered the batch (whatever each operation's result): [`Outcome::Ok`].
    Answered,
    /// The batch failed as a whole (the server refused or dropped it): [`Outcome::Dropped`].
    Failed,
    /// The batch timed out: [`Outcome::Dropped`] (Netflix counts a timeout as a drop).
    TimedOut,
    /// It ended for a reason that says nothing about the server's load (a torn stream, a
    /// panicking transport, a send abandoned at shutdown): [`Outcome::Rejected`], which the
    /// limiter ignores.
    Other,
}

impl BatchEnd {
    /// The limiter's outcome for a batch that ended so.
    pub const fn outcome(self) -> Outcome {
        match self {
            BatchEnd::Answered => Outcome::Ok,
            BatchEnd::Failed | BatchEnd::TimedOut => Outcome::Dropped,
            BatchEnd::Other => Outcome::Rejected,
        }
    }
}

/// One [`Limiter`] per shard of a dispatch window, fed one [`Sample`] per batch (its round
/// trip, its shard's batches in flight when it left, and how it ended), whose limit is the
/// shard's window limit ([`DispatchWindow::set_max_in_flight`]).
///
/// Shards are named by a dense index the caller keeps (the batch driver's shard id), so no
/// user code runs here. A shard's limiter is made when its first batch leaves
/// ([`on_sent`](Self::on_sent) returns its initial limit then, for the window); from then on
/// [`on_end`](Self::on_end) returns each new limit. Memory: one limiter (a few hundred bytes)
/// per shard index used, and one small record per credit slot of the window; nothing is
/// allocated after the indices and slots in use have been seen.
///
/// [`DispatchWindow::set_max_in_flight`]: crate::DispatchWindow::set_max_in_flight
///
/// ```
/// use throttle_sansio::Instant;
/// use throttle_sansio::dispatch_window::{DispatchWindow, WindowConfig};
/// use throttle_sansio::limiter::{AimdConfig, BatchEnd, LimiterConfig, PerShard};
/// # use core::hash::BuildHasherDefault;
/// # #[derive(Default)] struct H(u64);
/// # impl core::hash::Hasher for H {
/// #     fn finish(&self) -> u64 { self.0 }
/// #     fn write(&mut self, b: &[u8]) { for x in b { self.0 = self.0.wrapping_mul(31) ^ u64::from(*x); } }
/// # }
/// let cfg = LimiterConfig::aimd(AimdConfig::default().with_limits(1, 2, 8));
/// let mut limits = PerShard::new(cfg).unwrap();
/// let mut w: DispatchWindow<usize, &str, BuildHasherDefault<H>> =
///     DispatchWindow::new(WindowConfig::default()).unwrap();
/// let t0 = Instant::from_millis(0);
/// let d = w.submit(0, "a").unwrap().expect("sent");
/// // The shard's first batch: its limiter starts at its initial limit, which the window takes.
/// let first = limits.on_sent(0, d.credit, t0, w.in_flight(&0));
/// assert_eq!(first, Some(2));
/// let _ = w.set_max_in_flight(&0, first.and_then(|n| core::num::NonZeroUsize::new(n as usize)));
/// // It failed as a whole: AIMD backs off (2 × 0.9 = 1.8, rounded down).
/// let end = Instant::from_millis(3);
/// let _ = w.complete(d.credit);
/// assert_eq!(limits.on_end(d.credit, end, BatchEnd::Failed), Some((0, 1)));
/// ```
#[derive(Clone, Debug)]
pub struct PerShard {
    config: LimiterConfig,
    /// By shard index: its limiter, once its first batch left.
    limiters: Vec<Option<Limiter>>,
    /// By credit slot: the batch in flight under that slot's credit.
    started: Vec<Option<Started>>,
}

impl PerShard {
    /// Limiters of `config` (checked now: [`LimiterConfig::validate`]).
    pub fn new(config: LimiterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(PerShard {
            config,
            limiters: Vec::new(),
            started: Vec::new(),
        })
    }

    /// The configuration every shard's limiter has.
    pub fn config(&self) -> &LimiterConfig {
        &self.config
    }

    /// A batch of `shard` left at `now` under `credit`, with `in_flight` batches of the shard
    /// in flight counting it. Returns the shard's initial limit if this is its first batch
    /// (its limiter is made now): give it to the window.
    pub fn on_sent(
        &mut self,
        shard: usize,
        credit: CreditId,
        now: Instant,
        in_flight: u32,
    ) -> Option<u32> {
        let slot = credit.slot();
        if self.started.len() <= slot {
            self.started.resize(slot.saturating_add(1), None);
        }
        if let Some(s) = self.started.get_mut(slot) {
            *s = Some(Started {
                credit,
                shard,
                at: now,
                in_flight,
            });
        }
        if self.limiters.len() <= shard {
            self.limiters.resize_with(shard.saturating_add(1), || None);
        }
        let entry = self.limiters.get_mut(shard)?;
        if entry.is_some() {
            return None;
        }
        // `config` was validated by `new`, so this cannot fail.
        let limiter = Limiter::new(self.config).ok()?;
        let limit = limiter.limit();
        *entry = Some(limiter);
        Some(limit)
    }

    /// The batch under `credit` ended at `now` as `end`: its sample goes to its shard's
    /// limiter. Returns the shard and its new limit when the limit changed. A credit
    /// [`on_sent`](Self::on_sent) never saw (or saw end already) changes nothing.
    ///
    /// Call it before the `on_sent` of any credit the window issued after releasing this
    /// one: batches are remembered by credit slot, and a new credit may take the released
    /// one's slot (its `on_sent` then replaces this batch's record, and this end is ignored).
    /// The batch driver releases, calls `on_end`, and only then sends what the release
    /// handed on.
    pub fn on_end(
        &mut self,
        credit: CreditId,
        now: Instant,
        end: BatchEnd,
    ) -> Option<(usize, u32)> {
        let slot = self.started.get_mut(credit.slot())?;
        if !slot.is_some_and(|s| s.credit == credit) {
            return None;
        }
        let s = slot.take()?;
        let limiter = self.limiters.get_mut(s.shard)?.as_mut()?;
        let sample = Sample {
            start: s.at,
            end: now,
            in_flight: s.in_flight,
            outcome: end.outcome(),
        };
        limiter.on_sample(now, sample).map(|limit| (s.shard, limit))
    }

    /// `shard`'s limit now, if its first batch left.
    pub fn limit(&self, shard: usize) -> Option<u32> {
        self.limiters.get(shard)?.as_ref().map(Limiter::limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::AimdConfig;

    fn limits() -> PerShard {
        let cfg = LimiterConfig::aimd(AimdConfig::default().with_limits(1, 10, 20));
        PerShard::new(cfg).expect("valid")
    }

    fn ms(n: u64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn a_shards_first_batch_makes_its_limiter_and_later_ones_do_not() {
        let mut l = limits();
        let (a, b) = (CreditId::forge(0, 0, 1), CreditId::forge(0, 1, 2));
        assert_eq!(l.on_sent(3, a, ms(0), 1), Some(10));
        assert_eq!(l.on_sent(3, b, ms(0), 2), None);
        assert_eq!((l.limit(3), l.limit(0), l.limit(9)), (Some(10), None, None));
    }

    #[test]
    fn each_end_is_one_sample_of_its_shard_with_the_outcome_of_its_end() {
        let mut l = limits();
        let credits: Vec<CreditId> = (0..4)
            .map(|i| CreditId::forge(0, i, u64::from(i)))
            .collect();
        for (i, &c) in credits.iter().enumerate() {
            let _ = l.on_sent(i % 2, c, ms(0), 6);
        }
        // Shard 0: in use (2 · 6 ≥ 10) and answered: + 1.
        assert_eq!(
            l.on_end(credits[0], ms(5), BatchEnd::Answered),
            Some((0, 11))
        );
        // Shard 1: a timeout is a drop: × 0.9.
        assert_eq!(
            l.on_end(credits[1], ms(5), BatchEnd::TimedOut),
            Some((1, 9))
        );
        // A torn stream says nothing about load.
        assert_eq!(l.on_end(credits[2], ms(5), BatchEnd::Other), None);
        assert_eq!(l.on_end(credits[3], ms(5), BatchEnd::Failed), Some((1, 8)));
        assert_eq!((l.limit(0), l.limit(1)), (Some(11), Some(8)));
    }

    #[test]
    fn an_end_seen_twice_or_of_a_stale_credit_changes_nothing() {
        let mut l = limits();
        let old = CreditId::forge(0, 0, 1);
        let _ = l.on_sent(0, old, ms(0), 6);
        assert_eq!(l.on_end(old, ms(1), BatchEnd::Answered), Some((0, 11)));
        assert_eq!(
            l.on_end(old, ms(1), BatchEnd::Answered),
            None,
            "ended already"
        );
        let new = CreditId::forge(0, 0, 2);
        let _ = l.on_sent(0, new, ms(2), 6);
        assert_eq!(
            l.on_end(old, ms(3), BatchEnd::Failed),
            None,
            "the slot's new credit"
        );
        assert_eq!(
            l.on_end(CreditId::forge(0, 7, 9), ms(3), BatchEnd::Failed),
            None
        );
        assert_eq!(l.limit(0), Some(11));
    }

    use proptest::prelude::*;

    /// One input: a batch of `shard` leaving under a fresh credit in `slot` (`end` is
    /// `None`), or the end of the `pick`-th credit issued so far, as `end`.
    #[derive(Clone, Debug)]
    struct Op {
        shard: usize,
        slot: u32,
        end: Option<u8>,
        pick: usize,
        step_us: u64,
        in_flight: u32,
    }

    fn op() -> impl Strategy<Value = Op> {
        (
            0..3usize,
            0..5u32,
            proptest::option::of(0..4u8),
            any::<usize>(),
            0..5_000u64,
            0..40u32,
        )
            .prop_map(|(shard, slot, end, pick, step_us, in_flight)| Op {
                shard,
                slot,
                end,
                pick,
                step_us,
                in_flight,
            })
    }

    fn end_of(n: u8) -> BatchEnd {
        [
            BatchEnd::Answered,
            BatchEnd::Failed,
            BatchEnd::TimedOut,
            BatchEnd::Other,
        ][usize::from(n % 4)]
    }

    proptest! {
        #![proptest_config(crate::proptest_config(256))]

        /// Against a naive reference: every batch in flight is a record in a plain list
        /// (the latest departure under a slot replaces the record of that slot, as the window
        /// reuses a released credit's slot); an end of a recorded credit is one sample of its
        /// shard, with the round trip since its departure, its in-flight count and the
        /// outcome of its end, fed to that shard's own limiter; any other end changes nothing.
        #[test]
        #[cfg_attr(miri, ignore)] // u128 division is slow under miri
        fn each_batch_is_one_sample_of_its_own_shard(ops in proptest::collection::vec(op(), 0..120)) {
            let cfg = LimiterConfig::aimd(AimdConfig::default().with_limits(1, 4, 32));
            let mut got = PerShard::new(cfg).unwrap();
            let mut records: Vec<(CreditId, usize, Instant, u32)> = Vec::new();
            let mut shards: Vec<Option<Limiter>> = alloc::vec![None, None, None];
            let mut issued: Vec<CreditId> = Vec::new();
            let mut now = Instant::ZERO;
            for (i, o) in ops.iter().enumerate() {
                now += core::time::Duration::from_micros(o.step_us);
                match o.end {
                    None => {
                        let credit = CreditId::forge(0, o.slot, i as u64);
                        issued.push(credit);
                        records.retain(|r| r.0.slot() != credit.slot());
                        records.push((credit, o.shard, now, o.in_flight));
                        let first = shards[o.shard].is_none().then(|| {
                            let l = Limiter::new(cfg).unwrap();
                            let n = l.limit();
                            shards[o.shard] = Some(l);
                            n
                        });
                        prop_assert_eq!(got.on_sent(o.shard, credit, now, o.in_flight), first);
                    }
                    Some(e) => {
                        let Some(&credit) = issued.get(o.pick % issued.len().max(1)) else {
                            continue;
                        };
                        let end = end_of(e);
                        let want = match records.iter().position(|r| r.0 == credit) {
                            Some(at) => {
                                let (_, shard, start, in_flight) = records.remove(at);
                                let l = shards[shard].as_mut().unwrap();
                                let sample = Sample { start, end: now, in_flight, outcome: end.outcome() };
                                l.on_sample(now, sample).map(|n| (shard, n))
                            }
                            None => None,
                        };
                        prop_assert_eq!(got.on_end(credit, now, end), want);
                    }
                }
                for (s, l) in shards.iter().enumerate() {
                    prop_assert_eq!(got.limit(s), l.as_ref().map(Limiter::limit));
                }
            }
        }
    }

    #[test]
    fn an_invalid_config_is_refused() {
        let cfg = LimiterConfig::aimd(AimdConfig::default().with_limits(5, 1, 2));
        assert!(PerShard::new(cfg).is_err());
    }
}
