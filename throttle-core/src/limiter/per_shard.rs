//! [`PerShard`]: a limiter per shard, fed by the batches a dispatch window sends and ends, whose
//! limits drive the window (issue 18 item 3; `docs/limiter.md`, "Driving a window").

use alloc::vec::Vec;
use core::time::Duration;

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
    /// The shard's batches in flight when it left, counting it.
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
    /// The batch's operations timed out after `timeout` (the operation timeout, which counts
    /// from submission): a drop ([`Outcome::Dropped`], as Netflix counts a timeout) if the
    /// batch spent at least half of `timeout` in flight; otherwise its deadline went mostly
    /// on waiting for a credit, which says nothing about the server, and it is ignored
    /// ([`Outcome::Rejected`]). Without that rule a client-side backlog would time batches
    /// out soon after they leave, and each timeout would shrink the window further.
    TimedOut {
        /// The operation timeout.
        timeout: Duration,
    },
    /// It ended for a reason that says nothing about the server's load (a torn stream, a
    /// panicking transport, a send abandoned at shutdown): [`Outcome::Rejected`], which the
    /// limiter ignores.
    Other,
}

impl BatchEnd {
    /// The limiter's outcome for a batch that ended so after `flight` in flight.
    pub fn outcome(self, flight: Duration) -> Outcome {
        match self {
            BatchEnd::Answered => Outcome::Ok,
            BatchEnd::Failed => Outcome::Dropped,
            BatchEnd::TimedOut { timeout } if flight >= timeout / 2 => Outcome::Dropped,
            BatchEnd::TimedOut { .. } | BatchEnd::Other => Outcome::Rejected,
        }
    }
}

/// One [`Limiter`] per shard of a dispatch window, fed one [`Sample`] per batch (its round
/// trip, its shard's batches in flight when it left, and how it ended), whose limit is the
/// shard's window limit ([`DispatchWindow::set_max_in_flight`]).
///
/// Shards are named by a dense index the caller keeps (the batch driver's shard id), so no
/// user code runs here. A shard's limiter is made by [`open`](Self::open) (before its first
/// batch is handed to the window, so that the first burst already obeys the initial limit),
/// or else by its first [`on_sent`](Self::on_sent); either returns the initial limit, for the
/// window. From then on [`on_end`](Self::on_end) returns each new limit. The in-flight count
/// of a sample is this type's own count of the shard's batches between `on_sent` and
/// `on_end` (Netflix's limiter counts its own in-flight requests too), so every batch that
/// `on_sent` saw must reach `on_end` once, however it ended ([`BatchEnd::Other`] for an end
/// that says nothing about load). Memory: one limiter (a few hundred bytes)
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
/// let first = limits.on_sent(0, d.credit, t0);
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
    /// By shard index: its batches between `on_sent` and `on_end`.
    flying: Vec<u32>,
}

impl PerShard {
    /// Limiters of `config` (checked now: [`LimiterConfig::validate`]).
    pub fn new(config: LimiterConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(PerShard {
            config,
            limiters: Vec::new(),
            started: Vec::new(),
            flying: Vec::new(),
        })
    }

    /// The configuration every shard's limiter has.
    pub fn config(&self) -> &LimiterConfig {
        &self.config
    }

    /// Makes `shard`'s limiter if it has none, and returns its initial limit then (give it
    /// to the window before the shard's first batch); `None` if it has one already.
    pub fn open(&mut self, shard: usize) -> Option<u32> {
        if self.limiters.len() <= shard {
            self.limiters.resize_with(shard.saturating_add(1), || None);
            self.flying.resize(shard.saturating_add(1), 0);
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

    /// A batch of `shard` left at `now` under `credit`. Returns the shard's initial limit if
    /// its limiter was made now (no [`open`](Self::open) before): give it to the window.
    pub fn on_sent(&mut self, shard: usize, credit: CreditId, now: Instant) -> Option<u32> {
        let first = self.open(shard);
        let slot = credit.slot();
        if self.started.len() <= slot {
            self.started.resize(slot.saturating_add(1), None);
        }
        // A record still in the slot is a batch whose end never came (a caller that skipped
        // `on_end`): it is no longer in flight.
        if let Some(stale) = self.started.get_mut(slot).and_then(Option::take) {
            self.land(stale.shard);
        }
        let flying = self.flying.get_mut(shard).map_or(1, |n| {
            *n = n.saturating_add(1);
            *n
        });
        if let Some(s) = self.started.get_mut(slot) {
            *s = Some(Started {
                credit,
                shard,
                at: now,
                in_flight: flying,
            });
        }
        first
    }

    /// One batch of `shard` no longer in flight.
    fn land(&mut self, shard: usize) {
        if let Some(n) = self.flying.get_mut(shard) {
            *n = n.saturating_sub(1);
        }
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
        self.land(s.shard);
        let limiter = self.limiters.get_mut(s.shard)?.as_mut()?;
        let sample = Sample {
            start: s.at,
            end: now,
            in_flight: s.in_flight,
            outcome: end.outcome(now.saturating_duration_since(s.at)),
        };
        limiter.on_sample(now, sample).map(|limit| (s.shard, limit))
    }

    /// `shard`'s limit now, once its limiter was made.
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
        assert_eq!(l.on_sent(3, a, ms(0)), Some(10));
        assert_eq!(l.on_sent(3, b, ms(0)), None);
        assert_eq!((l.limit(3), l.limit(0), l.limit(9)), (Some(10), None, None));
        assert_eq!(l.open(3), None, "made already");
        assert_eq!(l.open(4), Some(10), "made before its first batch");
        assert_eq!(l.on_sent(4, CreditId::forge(0, 2, 3), ms(0)), None);
    }

    #[test]
    fn each_end_is_one_sample_of_its_shard_with_the_outcome_of_its_end() {
        let mut l = limits();
        // Six batches of each shard, interleaved: the sixth of each leaves with 6 in flight.
        let credits: Vec<CreditId> = (0..12)
            .map(|i| CreditId::forge(0, i, u64::from(i)))
            .collect();
        for (i, &c) in credits.iter().enumerate() {
            let _ = l.on_sent(i % 2, c, ms(0));
        }
        // Shard 0's sixth: in use (2 · 6 ≥ 10) and answered: + 1.
        assert_eq!(
            l.on_end(credits[10], ms(5), BatchEnd::Answered),
            Some((0, 11))
        );
        // Shard 1: a timeout after 5 ms in flight of a 4 ms operation timeout is a drop: × 0.9.
        let timeout = |ms| BatchEnd::TimedOut {
            timeout: Duration::from_millis(ms),
        };
        assert_eq!(l.on_end(credits[1], ms(5), timeout(4)), Some((1, 9)));
        // Of a 20 ms one, the deadline went mostly on waiting for a credit: ignored.
        assert_eq!(l.on_end(credits[3], ms(5), timeout(20)), None);
        // A torn stream says nothing about load.
        assert_eq!(l.on_end(credits[5], ms(5), BatchEnd::Other), None);
        assert_eq!(l.on_end(credits[7], ms(5), BatchEnd::Failed), Some((1, 8)));
        assert_eq!((l.limit(0), l.limit(1)), (Some(11), Some(8)));
    }

    #[test]
    fn the_in_flight_count_is_the_shards_batches_between_sent_and_end() {
        // Limits 1, 2, 20: a batch is "in use" when 2 · in_flight ≥ the limit.
        let cfg = LimiterConfig::aimd(AimdConfig::default().with_limits(1, 2, 20));
        let mut l = PerShard::new(cfg).expect("valid");
        let (a, b) = (CreditId::forge(0, 0, 1), CreditId::forge(0, 1, 2));
        let _ = l.on_sent(0, a, ms(0));
        let _ = l.on_sent(0, b, ms(0));
        // a left with 1 in flight (2 · 1 ≥ 2): in use, + 1.
        assert_eq!(l.on_end(a, ms(1), BatchEnd::Answered), Some((0, 3)));
        // b left with 2 in flight (2 · 2 ≥ 3): + 1. A batch leaving now counts only itself.
        assert_eq!(l.on_end(b, ms(1), BatchEnd::Answered), Some((0, 4)));
        let c = CreditId::forge(0, 0, 3);
        let _ = l.on_sent(0, c, ms(2));
        assert_eq!(
            l.on_end(c, ms(3), BatchEnd::Answered),
            None,
            "1 of 4: not in use"
        );
    }

    #[test]
    fn an_end_seen_twice_or_of_a_stale_credit_changes_nothing() {
        let cfg = LimiterConfig::aimd(AimdConfig::default().with_limits(1, 2, 20));
        let mut l = PerShard::new(cfg).expect("valid");
        let old = CreditId::forge(0, 0, 1);
        let _ = l.on_sent(0, old, ms(0));
        assert_eq!(l.on_end(old, ms(1), BatchEnd::Answered), Some((0, 3)));
        assert_eq!(
            l.on_end(old, ms(1), BatchEnd::Answered),
            None,
            "ended already"
        );
        let new = CreditId::forge(0, 0, 2);
        let _ = l.on_sent(0, new, ms(2));
        assert_eq!(
            l.on_end(old, ms(3), BatchEnd::Failed),
            None,
            "the slot's new credit"
        );
        assert_eq!(
            l.on_end(CreditId::forge(0, 7, 9), ms(3), BatchEnd::Failed),
            None
        );
        assert_eq!(l.limit(0), Some(3));
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
    }

    fn op() -> impl Strategy<Value = Op> {
        (
            0..3usize,
            0..5u32,
            proptest::option::of(0..4u8),
            any::<usize>(),
            0..5_000u64,
        )
            .prop_map(|(shard, slot, end, pick, step_us)| Op {
                shard,
                slot,
                end,
                pick,
                step_us,
            })
    }

    fn end_of(n: u8) -> BatchEnd {
        [
            BatchEnd::Answered,
            BatchEnd::Failed,
            BatchEnd::TimedOut {
                timeout: Duration::from_millis(3),
            },
            BatchEnd::Other,
        ][usize::from(n % 4)]
    }

    proptest! {
        #![proptest_config(crate::proptest_config(256))]

        /// Against a naive reference: every batch in flight is a record in a plain list
        /// (the latest departure under a slot replaces the record of that slot, as the window
        /// reuses a released credit's slot); an end of a recorded credit is one sample of its
        /// shard, with the round trip since its departure, its shard's records when it left
        /// (itself included) and the outcome of its end (a 3 ms timeout is a drop after
        /// 1.5 ms in flight), fed to that shard's own limiter; any other end changes nothing.
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
                        let in_flight = 1 + records.iter().filter(|r| r.1 == o.shard).count() as u32;
                        records.push((credit, o.shard, now, in_flight));
                        let first = shards[o.shard].is_none().then(|| {
                            let l = Limiter::new(cfg).unwrap();
                            let n = l.limit();
                            shards[o.shard] = Some(l);
                            n
                        });
                        prop_assert_eq!(got.on_sent(o.shard, credit, now), first);
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
                                let flight = now.saturating_duration_since(start);
                                let sample = Sample { start, end: now, in_flight, outcome: end.outcome(flight) };
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
