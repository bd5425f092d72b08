//! The refresh coalescer: one metadata refresh at a time, shared by every call that needs it.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::error::ConfigError;
use crate::event::EventQueue;

/// The number of one refresh, handed out in increasing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(u64);

impl Generation {
    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// A generation from a raw number (e.g. one carried through the caller's refresh task).
    pub fn from_raw(n: u64) -> Self {
        Generation(n)
    }
}

/// Settings of a [`RefreshCoalescer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CoalescerConfig {
    max_waiters: usize,
}

impl Default for CoalescerConfig {
    /// [`CoalescerConfig::fluss_unbounded`]: upstream's behaviour, as close as a bound gets.
    fn default() -> Self {
        Self::fluss_unbounded()
    }
}

/// The largest `max_waiters` accepted.
const MAX_WAITERS: usize = 1 << 20;

impl CoalescerConfig {
    /// Upstream (the Fluss client's metadata updater) holds every call that waits for a
    /// refresh, with no bound and no option; this is the largest bound accepted,
    /// 1 048 576 calls, so no call upstream would let wait is handed back. Nothing is
    /// allocated up front: the held calls take memory only while they wait.
    pub fn fluss_unbounded() -> Self {
        CoalescerConfig {
            max_waiters: MAX_WAITERS,
        }
    }

    /// At most `max_waiters` calls held at once (waiting or released but not yet polled), in
    /// `1..=1_048_576` (checked by [`validate`](Self::validate)).
    #[must_use]
    pub fn with_max_waiters(mut self, max_waiters: usize) -> Self {
        self.max_waiters = max_waiters;
        self
    }

    /// Refuses a bound outside `1..=1_048_576`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MAX: usize = MAX_WAITERS;
        if !(1..=MAX).contains(&self.max_waiters) {
            return Err(ConfigError::OutOfRange {
                option: &crate::options::failover::MAX_WAITERS,
                got: u64::try_from(self.max_waiters).unwrap_or(u64::MAX),
                min: 1,
                max: MAX as u64,
                unit: "calls",
            });
        }
        Ok(())
    }

    /// The bound on held calls.
    pub fn max_waiters(&self) -> usize {
        self.max_waiters
    }
}

/// What to do after asking the coalescer for a refresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a started refresh must be run and completed, and a handed-back waiter resumed"]
pub enum CoalesceAction<W> {
    /// No refresh was running: start one, and report its end with this generation. The
    /// waiter is held and released when it ends.
    Start(Generation),
    /// A refresh is running: the waiter is held and released when that generation ends.
    Join(Generation),
    /// The coalescer holds `max_waiters` calls: the waiter is handed back, not held. Treat it
    /// as a failed refresh (`Call::handle_refreshed(now, false, …)`), which still retries.
    Full(W),
}

/// One waiter released by the end of a refresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Release<W> {
    /// The waiter given when it joined.
    pub waiter: W,
    /// The refresh it waited for.
    pub generation: Generation,
    /// Whether that refresh succeeded.
    pub ok: bool,
}

/// An observation of a [`RefreshCoalescer`], drained with [`RefreshCoalescer::poll_event`]
/// once turned on with [`RefreshCoalescer::set_event_capacity`] (off by default: see
/// [`crate::event`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefreshEvent {
    /// A call started a refresh ([`CoalesceAction::Start`]).
    Started {
        /// The refresh.
        generation: Generation,
    },
    /// A call joined the running refresh ([`CoalesceAction::Join`]).
    Joined {
        /// The refresh.
        generation: Generation,
        /// The calls now waiting for it, this one included.
        waiters: usize,
    },
    /// A refresh ended ([`RefreshCoalescer::handle_refreshed`]) and released its waiters.
    Completed {
        /// The refresh.
        generation: Generation,
        /// Whether it succeeded.
        ok: bool,
        /// The calls it released.
        released: usize,
    },
    /// A call was handed back ([`CoalesceAction::Full`]): `max_waiters` calls were held.
    Refused {
        /// The calls held then.
        held: usize,
    },
}

/// Misuse of [`RefreshCoalescer::handle_refreshed`]; nothing changes when it is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GenerationError {
    /// The generation was never handed out.
    #[error("unknown refresh generation")]
    Unknown,
    /// The generation has already ended.
    #[error("refresh generation already completed")]
    AlreadyCompleted,
}

/// Coalesces concurrent refresh requests: the first starts a refresh, the others join it, and
/// its end (success or failure) releases them all.
///
/// ```text
///            refresh_needed: Start(g)            refresh_needed: Join(g)
///   Idle ---------------------------> Refreshing(g) <-----------------+
///    ^                                   |   \________________________/
///    +----- handled_refreshed(g, ok) ----+   (waiters released: poll_action)
/// ```
///
/// # Driving contract
///
/// - Input [`RefreshCoalescer::handle_refresh_needed`] for a call whose action is `Refresh`,
///   with any value that identifies it (`W`, e.g. a slab key). On `Start(g)`, run the refresh.
/// - Input [`RefreshCoalescer::handle_refreshed`] with `g` when that refresh ends, success or
///   not; then drain [`RefreshCoalescer::poll_action`] until `None` and pass each release's
///   `ok` to its call's `handle_refreshed`. A failure after that starts a new generation.
/// - A bogus or repeated generation is an `Err` and changes nothing.
/// - Queries ([`RefreshCoalescer::in_flight`], [`RefreshCoalescer::held`]) take `&self`.
///
/// Memory is bounded by `max_waiters`; the buffers are reused, so after warm-up nothing is
/// allocated. The coalescer makes no decision from time, so its inputs take no `now`.
///
/// ```
/// use throttle_sansio::failover::{CoalesceAction, CoalescerConfig, RefreshCoalescer};
///
/// let mut refresh = RefreshCoalescer::new(CoalescerConfig::default().with_max_waiters(2))?;
/// // Three calls hit a stale leader at once: one refresh runs, the second call joins it,
/// // and the third, past `max_waiters`, is handed back.
/// let CoalesceAction::Start(generation) = refresh.handle_refresh_needed("call-a") else {
///     panic!("the first need starts a refresh");
/// };
/// assert_eq!(refresh.handle_refresh_needed("call-b"), CoalesceAction::Join(generation));
/// assert_eq!(refresh.handle_refresh_needed("call-c"), CoalesceAction::Full("call-c"));
/// assert_eq!(refresh.in_flight(), Some(generation));
///
/// // The refresh succeeds: both held calls are released, oldest first, with its outcome.
/// assert_eq!(refresh.handle_refreshed(generation, true), Ok(2));
/// let released: Vec<_> = core::iter::from_fn(|| refresh.poll_action())
///     .map(|r| (r.waiter, r.ok))
///     .collect();
/// assert_eq!(released, [("call-a", true), ("call-b", true)]);
/// // Ending it twice is misuse and changes nothing.
/// assert!(refresh.handle_refreshed(generation, true).is_err());
/// assert_eq!((refresh.in_flight(), refresh.held()), (None, 0));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefreshCoalescer<W> {
    max_waiters: usize,
    next: u64,
    in_flight: Option<Generation>,
    waiting: Vec<W>,
    released: VecDeque<Release<W>>,
    /// Observations, off until [`Self::set_event_capacity`].
    events: EventQueue<RefreshEvent>,
}

impl<W> RefreshCoalescer<W> {
    /// An idle coalescer; refuses an invalid `config`.
    pub fn new(config: CoalescerConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::unchecked(config))
    }

    fn unchecked(config: CoalescerConfig) -> Self {
        RefreshCoalescer {
            max_waiters: config.max_waiters,
            next: 0,
            in_flight: None,
            waiting: Vec::new(),
            released: VecDeque::new(),
            events: EventQueue::new(),
        }
    }

    /// Input: a call needs a refresh. Returns whether to start one or wait for the running one.
    pub fn handle_refresh_needed(&mut self, waiter: W) -> CoalesceAction<W> {
        let held = self.held();
        if held >= self.max_waiters {
            self.events.emit(|| RefreshEvent::Refused { held });
            return CoalesceAction::Full(waiter);
        }
        self.waiting.push(waiter);
        match self.in_flight {
            Some(generation) => {
                let waiters = self.waiting.len();
                self.events.emit(|| RefreshEvent::Joined {
                    generation,
                    waiters,
                });
                CoalesceAction::Join(generation)
            }
            None => {
                let generation = Generation(self.next);
                // 2^64 refreshes never happen; wrapping keeps the arithmetic defined anyway.
                self.next = self.next.wrapping_add(1);
                self.in_flight = Some(generation);
                self.events.emit(|| RefreshEvent::Started { generation });
                CoalesceAction::Start(generation)
            }
        }
    }

    /// Input: refresh `generation` ended (`ok`: it succeeded). Releases every waiter that
    /// joined it (drain them with [`RefreshCoalescer::poll_action`]) and returns how many.
    pub fn handle_refreshed(
        &mut self,
        generation: Generation,
        ok: bool,
    ) -> Result<usize, GenerationError> {
        if self.in_flight != Some(generation) {
            return Err(if generation.0 >= self.next {
                GenerationError::Unknown
            } else {
                GenerationError::AlreadyCompleted
            });
        }
        self.in_flight = None;
        let n = self.waiting.len();
        self.released
            .extend(self.waiting.drain(..).map(|waiter| Release {
                waiter,
                generation,
                ok,
            }));
        self.events.emit(|| RefreshEvent::Completed {
            generation,
            ok,
            released: n,
        });
        Ok(n)
    }

    /// Poller: the next released waiter, oldest first; `None` when all are drained.
    pub fn poll_action(&mut self) -> Option<Release<W>> {
        self.released.pop_front()
    }

    /// The oldest undrained observation, if events are on ([`Self::set_event_capacity`]).
    /// Drain after [`Self::poll_action`].
    pub fn poll_event(&mut self) -> Option<RefreshEvent> {
        self.events.pop()
    }

    /// For the `sync` handles' lock guard: whether an event is waiting (one length check).
    #[cfg(feature = "std")]
    #[inline]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Record up to `capacity` undrained events (0, the default, turns them off: no input
    /// then builds one). Past the capacity the oldest is dropped and counted.
    pub fn set_event_capacity(&mut self, capacity: usize) {
        self.events.set_capacity(capacity);
    }

    /// Events lost to a full queue (or discarded by turning events off) so far.
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
    }

    /// The refresh running now, if any.
    pub fn in_flight(&self) -> Option<Generation> {
        self.in_flight
    }

    /// Waiters held: joined to the running refresh or released but not yet polled.
    pub fn held(&self) -> usize {
        self.waiting.len().saturating_add(self.released.len())
    }
}

impl<W> Default for RefreshCoalescer<W> {
    fn default() -> Self {
        RefreshCoalescer::unchecked(CoalescerConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_off_by_default_then_record_each_step_within_the_bound() {
        let mut c =
            RefreshCoalescer::new(CoalescerConfig::default().with_max_waiters(2)).expect("valid");
        let _ = c.handle_refresh_needed(1u32);
        assert_eq!((c.poll_event(), c.events_dropped()), (None, 0));
        let _ = c.handle_refreshed(Generation(0), true);
        while c.poll_action().is_some() {}

        c.set_event_capacity(8);
        let g = Generation(1);
        assert_eq!(c.handle_refresh_needed(1), CoalesceAction::Start(g));
        assert_eq!(c.handle_refresh_needed(2), CoalesceAction::Join(g));
        assert_eq!(c.handle_refresh_needed(3), CoalesceAction::Full(3));
        assert_eq!(c.handle_refreshed(g, false), Ok(2));
        // Misuse records nothing.
        assert!(c.handle_refreshed(g, false).is_err());
        let got: Vec<_> = core::iter::from_fn(|| c.poll_event()).collect();
        assert_eq!(
            got,
            [
                RefreshEvent::Started { generation: g },
                RefreshEvent::Joined {
                    generation: g,
                    waiters: 2
                },
                RefreshEvent::Refused { held: 2 },
                RefreshEvent::Completed {
                    generation: g,
                    ok: false,
                    released: 2
                },
            ]
        );
        // Released but unpolled waiters still count as held.
        assert_eq!(c.handle_refresh_needed(4), CoalesceAction::Full(4));
        assert_eq!(c.poll_event(), Some(RefreshEvent::Refused { held: 2 }));

        // The bound: the oldest event goes first, and is counted.
        while c.poll_action().is_some() {}
        c.set_event_capacity(1);
        let _ = c.handle_refresh_needed(5);
        let _ = c.handle_refresh_needed(6);
        assert_eq!(
            (c.poll_event(), c.poll_event(), c.events_dropped()),
            (
                Some(RefreshEvent::Joined {
                    generation: Generation(2),
                    waiters: 2
                }),
                None,
                1
            )
        );
    }

    #[test]
    fn first_need_starts_and_later_ones_join_the_same_generation() {
        let mut c = RefreshCoalescer::default();
        assert_eq!(
            c.handle_refresh_needed(1u32),
            CoalesceAction::Start(Generation(0))
        );
        assert_eq!(
            c.handle_refresh_needed(2),
            CoalesceAction::Join(Generation(0))
        );
        assert_eq!(
            c.handle_refresh_needed(3),
            CoalesceAction::Join(Generation(0))
        );
        assert_eq!(c.in_flight(), Some(Generation(0)));
        assert_eq!(c.handle_refreshed(Generation(0), false), Ok(3));
        let got: Vec<_> = core::iter::from_fn(|| c.poll_action()).collect();
        assert_eq!(got.iter().map(|r| r.waiter).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(got.iter().all(|r| !r.ok && r.generation == Generation(0)));
        assert_eq!(c.held(), 0);
        // A failure after completion starts a new generation.
        assert_eq!(
            c.handle_refresh_needed(4),
            CoalesceAction::Start(Generation(1))
        );
    }

    #[test]
    fn bogus_and_repeated_generations_change_nothing() {
        let mut c = RefreshCoalescer::default();
        assert_eq!(
            c.handle_refreshed(Generation(0), true),
            Err(GenerationError::Unknown)
        );
        assert_eq!(
            c.handle_refresh_needed('a'),
            CoalesceAction::Start(Generation(0))
        );
        assert_eq!(
            c.handle_refreshed(Generation(u64::MAX), true),
            Err(GenerationError::Unknown)
        );
        assert_eq!(c.handle_refreshed(Generation(0), true), Ok(1));
        assert_eq!(
            c.handle_refresh_needed('b'),
            CoalesceAction::Start(Generation(1))
        );
        let before = c.clone();
        assert_eq!(
            c.handle_refreshed(Generation(0), true),
            Err(GenerationError::AlreadyCompleted)
        );
        assert_eq!(c, before);
        assert_eq!(
            c.poll_action().map(|r| r.waiter),
            Some('a'),
            "only the first generation's waiter"
        );
        assert_eq!(c.poll_action(), None);
        assert_eq!(c.handle_refreshed(Generation(1), true), Ok(1));
        assert_eq!(
            c.poll_action().map(|r| (r.waiter, r.generation)),
            Some(('b', Generation(1)))
        );
    }

    #[test]
    fn a_full_coalescer_hands_the_waiter_back() {
        let mut c = RefreshCoalescer::new(CoalescerConfig::default().with_max_waiters(2)).unwrap();
        assert_eq!(
            c.handle_refresh_needed(1u8),
            CoalesceAction::Start(Generation(0))
        );
        assert_eq!(
            c.handle_refresh_needed(2),
            CoalesceAction::Join(Generation(0))
        );
        assert_eq!(c.handle_refresh_needed(3), CoalesceAction::Full(3));
        c.handle_refreshed(Generation(0), true).unwrap();
        // Released but unpolled waiters still count against the bound.
        assert_eq!(c.handle_refresh_needed(4), CoalesceAction::Full(4));
        c.poll_action();
        assert_eq!(
            c.handle_refresh_needed(5),
            CoalesceAction::Start(Generation(1))
        );
        let cfg = CoalescerConfig::default();
        assert!(cfg.with_max_waiters(0).validate().is_err());
        assert!(cfg.with_max_waiters(usize::MAX).validate().is_err());
        assert!(RefreshCoalescer::<u8>::new(cfg.with_max_waiters(0)).is_err());
    }
}
