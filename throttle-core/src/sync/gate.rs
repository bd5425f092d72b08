//! [`GateHandle`]: the write gate shared by a writer's tasks, with `wait_until_open` that
//! wakes early when an input moves a bucket's opening earlier.
//!
//! Inputs go through [`GateHandle::update`] (or the named helpers), which runs them on the
//! gate under the lock and drains the gate's actions; a [`GateAction::Wake`] becomes a
//! [`WakeSignal::notify`] after the lock is dropped. Sleepers in
//! [`wait_until_open`](GateHandle::wait_until_open) read the signal's epoch before the gate
//! (see [`wait_until`]), so they re-arm their timer at the new opening and never sleep on a
//! stale one.
//!
//! A handle comes in two forms, told apart by its third type parameter: [`Unbound`] (the
//! default), whose inputs take `now` and, where they draw, an RNG from the caller (for a
//! custom runtime or a simulation), and bound to a [`Runtime`] `R`
//! ([`GateHandle::with_runtime`], [`GateHandle::bind`]), whose inputs read `now` from `R` and
//! draw from the handle's own per-client generator ([`client_rng`]). One macro declares
//! every input once and generates both forms from it.

use alloc::vec::Vec;
use core::fmt;
use core::hash::{BuildHasher, Hash};
use core::time::Duration;

use super::drive::{Timed, drive, drive_timeouts};
use super::events::{EventSink, EventTap, Observed};
use super::loom::{Arc, Mutex, lock};
use super::seed::{client_rng, next_client_id};
use super::{Runtime, WakeSignal, wait_until};
use crate::backpressure::Signal;
use crate::error::ConfigError;
use crate::paced_writer::WriteOutcome;
use crate::rng::{Rng, SplitMix64};
use crate::snapshot::{Cursor, Page};
use crate::time::Instant;
use crate::write_gate::{
    BucketSnapshot, GateAction, GateError, GateEvent, GateState, OutcomeFeed, Reason, WriteGate,
    WriteGateConfig,
};

/// The runtime slot of a handle that is not bound to a runtime: its inputs take `now` (and,
/// where they draw, an RNG) from the caller, and its waits take the runtime as an argument.
/// The default of [`GateHandle`]'s third type parameter; [`GateHandle::bind`] replaces it
/// with a [`Runtime`].
///
/// ```
/// use throttle_sansio::sync::{GateHandle, Unbound};
/// use throttle_sansio::WriteGateConfig;
///
/// let raw: GateHandle<u32, std::hash::RandomState, Unbound> =
///     GateHandle::new(WriteGateConfig::default()).unwrap();
/// let same: GateHandle<u32> = raw; // `Unbound` is the default
/// # drop(same);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Unbound;

/// A cloneable handle to a [`WriteGate`] shared by a writer's tasks. `Clone + Send + Sync`
/// (for `Send` bucket keys and hasher); clones share one gate, one wake signal and, when
/// bound, one runtime and one random stream.
///
/// # Whose generator
///
/// A bound handle's generator belongs to the handle that [`bind`](Self::bind) (or
/// [`bind_with_rng`](Self::bind_with_rng), [`with_runtime`](GateHandle::with_runtime))
/// returned, and to its clones: they are one client, and continue one stream. Binding another
/// clone of the same gate makes another client over the same gate, with a generator of its own;
/// neither bind touches the other's stream, so a handle bound with
/// `bind_with_rng(rt, SplitMix64::new(seed))` replays its jitter whatever else binds the gate.
/// Draws happen under the gate's lock.
///
/// # Two forms
///
/// - **Bound to a runtime** (`R: Runtime`, built by [`with_runtime`](Self::with_runtime) or
///   [`bind`](Self::bind)): inputs read `now` from the runtime's clock and draw jitter from
///   the handle's generator, seeded by [`client_rng`] with a fresh
///   [`next_client_id`](super::next_client_id), so two handles in one process (and two
///   processes) spread their retries differently. `handle_kv_signal(&bucket, signal)`,
///   `handle_disk_write_locked(&bucket, attempts)`, `wait_until_open(&bucket)`,
///   `check(&bucket)`. The adapters name it `throttle_tokio::GateHandle<K>` and
///   `throttle_async_std::GateHandle<K>`.
/// - **Unbound** (`R = `[`Unbound`], the default; [`new`](GateHandle::new),
///   [`with_hasher`](Self::with_hasher), [`from_gate`](Self::from_gate)): the raw form for a
///   custom runtime or a simulation. Inputs take `now` first and, where they draw,
///   `rng: &mut impl Rng` last, as the machine's do; the waits take the runtime:
///   `wait_until_open(&rt, &bucket)`.
///
/// Both forms run the same input through the same [`update`](Self::update); only where `now`
/// and the RNG come from differs.
///
/// # Contract
///
/// - Inputs: the `handle_*` helpers, or [`update`](Self::update) for any other gate input.
///   Each runs under the lock, then every `GateAction::Wake` the gate emitted notifies
///   [`signal`](Self::signal) after the lock is dropped. A bound input reads the runtime's
///   clock before it takes the lock (the gate clamps a `now` that runs behind the latest it
///   saw, so two racing inputs keep the gate monotonic).
/// - Waiting: [`wait_until_open`](Self::wait_until_open) resolves with the bucket's first state
///   that is not a timed closure: `Open`, `Probing` (wait for a success) or `UnknownLeader`
///   (refresh metadata, then wait again). It sleeps until the opening on the runtime's clock
///   and re-arms whenever a Wake moves an opening earlier.
/// - Eviction: [`drive_timeouts`](Self::drive_timeouts) is the gate's timer loop
///   (`poll_timeout` → sleep → `handle_timeout`); spawn it once per gate. Reads treat expired
///   gates as open without it; it only frees memory.
/// - Queries: [`check`](Self::check), [`remaining`](Self::remaining),
///   [`remaining_ms`](Self::remaining_ms), [`explain`](Self::explain): every gate query that
///   takes `now`, in both forms.
///
/// The hasher `S` defaults to std's [`RandomState`](std::hash::RandomState), which
/// [`new`](GateHandle::new) and [`with_runtime`](GateHandle::with_runtime) use;
/// [`with_hasher`](Self::with_hasher) takes any other.
///
/// Unbound, with the caller's clock and generator:
///
/// ```
/// use throttle_sansio::{GateState, Instant, Signal, WriteGateConfig};
/// use throttle_sansio::rng::SplitMix64;
/// use throttle_sansio::sync::GateHandle;
///
/// // No annotation: `new` builds a `GateHandle<u32, RandomState, Unbound>`.
/// let gate = GateHandle::new(WriteGateConfig::default()).expect("the default config is valid");
/// let wait = gate.handle_kv_signal(Instant::ZERO, &7u32, Signal::Full);
/// assert!(matches!(gate.check(Instant::ZERO, &7), GateState::Closed { .. }));
/// assert_eq!(gate.check(Instant::ZERO + wait, &7), GateState::Open);
/// let mut rng = SplitMix64::new(1);
/// let backoff = gate.handle_disk_write_locked(Instant::ZERO, &8, 0, &mut rng);
/// assert!(backoff > core::time::Duration::ZERO);
/// ```
///
/// Bound to a runtime (here a [`ManualClock`](super::ManualClock) one; with tokio,
/// `throttle_tokio::GateHandle::with_runtime(TokioRuntime::new(), cfg)`):
///
/// ```
/// # use core::future::Future;
/// use core::time::Duration;
/// use throttle_sansio::{GateState, Instant, Reason, Signal, WriteGateConfig};
/// use throttle_sansio::sync::{GateHandle, ManualClock, Runtime};
/// # #[derive(Clone)]
/// # struct Manual(ManualClock);
/// # impl Runtime for Manual {
/// #     fn now(&self) -> Instant { self.0.now() }
/// #     fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
/// #         self.0.sleep_until(at)
/// #     }
/// #     fn spawn<F: Future<Output = ()> + Send + 'static>(&self, f: F) { drop(f) }
/// # }
///
/// let clock = ManualClock::new();
/// let gate = GateHandle::with_runtime(Manual(clock.clone()), WriteGateConfig::default())
///     .expect("the default config is valid");
/// clock.advance(Duration::from_millis(100));
/// // No `now`, no RNG: the runtime's clock says it is 100 ms.
/// let wait = gate.handle_kv_signal(&7u32, Signal::Full);
/// assert_eq!(
///     gate.check(&7),
///     GateState::Closed { until: Instant::from_millis(100) + wait, reason: Reason::KV_BACKPRESSURE }
/// );
/// let _jittered = gate.handle_disk_write_locked(&8, 0); // the handle's own generator
/// clock.advance(wait);
/// assert_eq!(gate.check(&7), GateState::Open);
/// ```
pub struct GateHandle<K, S = std::hash::RandomState, R = Unbound> {
    gate: Arc<Mutex<WriteGate<K, S>>>,
    /// The generator a bound handle's drawing inputs use: this handle's and its clones', not
    /// the gate's (another `bind` of the gate makes another). Locked only while the gate's lock
    /// is held, so it is never contended and the lock order is always gate, then generator.
    /// An unbound handle never draws from it (its inputs take the caller's); `bind` replaces it.
    rng: Arc<Mutex<SplitMix64>>,
    /// Notified on every `GateAction::Wake`: sleepers re-check their bucket.
    signal: WakeSignal,
    /// Notified when an input moves `poll_timeout` earlier: the timeout driver re-arms.
    timer: WakeSignal,
    /// The gate's event sink, shared by every clone and bind of the gate.
    tap: Arc<EventTap<GateEvent<K>>>,
    /// The runtime a bound handle reads `now` from and sleeps on ([`Unbound`]: none).
    rt: R,
}

impl<K, S, R: Clone> Clone for GateHandle<K, S, R> {
    fn clone(&self) -> Self {
        GateHandle {
            gate: Arc::clone(&self.gate),
            rng: Arc::clone(&self.rng),
            signal: self.signal.clone(),
            timer: self.timer.clone(),
            tap: Arc::clone(&self.tap),
            rt: self.rt.clone(),
        }
    }
}

impl<K, S, R> fmt::Debug for GateHandle<K, S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GateHandle").finish_non_exhaustive()
    }
}

/// Declares the handle's inputs and queries once and generates both forms of each: the
/// unbound one (the caller passes `now` first and, for a drawing input, `rng` last) and the
/// bound one (`now` from the runtime, `rng` from the handle's generator). Every form runs the
/// gate's method of the same name: inputs through [`GateHandle::update`] (one lock, then the
/// `Wake` actions turned into a notify), queries under the lock alone.
///
/// Kinds: `draws` (an input that takes `now` and `rng`), `input` (takes `now`), `query` (takes
/// `now`, changes nothing).
macro_rules! gate_methods {
    ($(
        $(#[$doc:meta])*
        $kind:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
    )*) => {
        impl<K: Hash + Eq + Clone, S: BuildHasher> GateHandle<K, S, Unbound> {
            $( gate_methods!(@unbound $kind $(#[$doc])* $name($($arg: $ty),*) $(-> $ret)?); )*
        }

        impl<K: Hash + Eq + Clone, S: BuildHasher, R: Runtime> GateHandle<K, S, R> {
            $( gate_methods!(@bound $kind $(#[$doc])* $name($($arg: $ty),*) $(-> $ret)?); )*
        }
    };

    (@unbound draws $(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        #[doc = concat!("[`WriteGate::", stringify!($name), "`] at the caller's `now`, drawing \
            from the caller's `rng`, through [`update`](Self::update).")]
        ///
        $(#[$doc])*
        ///
        /// # Panics
        ///
        /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, the hasher, or
        /// `rng`. The panic reaches the caller and the input did not happen (the gate runs all
        /// of them before it changes anything, see the gate method's `# Panics`): the gate is
        /// as it was, and the handle serves every later call.
        pub fn $name<G: Rng + ?Sized>(&self, now: Instant, $($arg: $ty,)* rng: &mut G) $(-> $ret)? {
            self.update(|g| g.$name(now, $($arg,)* rng))
        }
    };
    (@unbound input $(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        #[doc = concat!("[`WriteGate::", stringify!($name), "`] at the caller's `now`, through \
            [`update`](Self::update).")]
        ///
        $(#[$doc])*
        ///
        /// # Panics
        ///
        /// Only if user code panics: the bucket's `Hash`, `Eq` or `Clone`, or the hasher. The
        /// panic reaches the caller and the input did not happen (the gate runs them before it
        /// changes anything, see the gate method's `# Panics`): the gate is as it was, and the
        /// handle serves every later call.
        pub fn $name(&self, now: Instant, $($arg: $ty),*) $(-> $ret)? {
            self.update(|g| g.$name(now, $($arg),*))
        }
    };
    (@unbound query $(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        #[doc = concat!("[`WriteGate::", stringify!($name), "`] at the caller's `now`.")]
        ///
        $(#[$doc])*
        ///
        /// # Panics
        ///
        /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
        pub fn $name(&self, now: Instant, $($arg: $ty),*) $(-> $ret)? {
            lock(&self.gate).$name(now, $($arg),*)
        }
    };

    (@bound draws $(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        #[doc = concat!("[`WriteGate::", stringify!($name), "`] at the runtime's `now`, drawing \
            from the handle's generator, through [`update`](Self::update).")]
        ///
        $(#[$doc])*
        ///
        /// # Panics
        ///
        /// Only if user code panics: the runtime's `now` (read first, before the gate is
        /// touched), the bucket's `Hash`, `Eq` or `Clone`, or the hasher (the handle's own
        /// generator never panics). The panic reaches the caller and the input did not happen:
        /// the gate is as it was, and the handle serves every later call.
        pub fn $name(&self, $($arg: $ty),*) $(-> $ret)? {
            let now = self.rt.now();
            self.update_drawing(|g, rng| g.$name(now, $($arg,)* rng))
        }
    };
    (@bound input $(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        #[doc = concat!("[`WriteGate::", stringify!($name), "`] at the runtime's `now`, through \
            [`update`](Self::update).")]
        ///
        $(#[$doc])*
        ///
        /// # Panics
        ///
        /// Only if user code panics: the runtime's `now` (read first, before the gate is
        /// touched), the bucket's `Hash`, `Eq` or `Clone`, or the hasher. The panic reaches the
        /// caller and the input did not happen: the gate is as it was, and the handle serves
        /// every later call.
        pub fn $name(&self, $($arg: $ty),*) $(-> $ret)? {
            let now = self.rt.now();
            self.update(|g| g.$name(now, $($arg),*))
        }
    };
    (@bound query $(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {
        #[doc = concat!("[`WriteGate::", stringify!($name), "`] at the runtime's `now`.")]
        ///
        $(#[$doc])*
        ///
        /// # Panics
        ///
        /// Only if the runtime's `now`, the bucket's `Hash` or `Eq`, or the hasher panics; the
        /// gate is unchanged.
        pub fn $name(&self, $($arg: $ty),*) $(-> $ret)? {
            let now = self.rt.now();
            lock(&self.gate).$name(now, $($arg),*)
        }
    };
}

impl<K: Hash + Eq + Clone> GateHandle<K, std::hash::RandomState, Unbound> {
    /// An unbound handle over a new gate, hashing bucket keys with a fresh std
    /// [`RandomState`](std::hash::RandomState) (as `HashMap::new` does); refuses an invalid
    /// `cfg`. For another hasher, [`with_hasher`](Self::with_hasher); for a handle bound to a
    /// runtime, [`with_runtime`](GateHandle::with_runtime).
    pub fn new(cfg: WriteGateConfig) -> Result<Self, ConfigError> {
        WriteGate::new(cfg).map(Self::from_gate)
    }
}

impl<K: Hash + Eq + Clone, R: Runtime> GateHandle<K, std::hash::RandomState, R> {
    /// A handle bound to `rt` over a new gate, hashing bucket keys with a fresh std
    /// [`RandomState`](std::hash::RandomState), drawing jitter from
    /// [`client_rng`]`(`[`next_client_id`](super::next_client_id)`())`; refuses an invalid
    /// `cfg`. Its inputs need no `now` and no RNG. For another hasher or a chosen seed,
    /// `GateHandle::with_hasher(cfg, hasher)?.bind(rt)` or [`bind_with_rng`](Self::bind_with_rng).
    pub fn with_runtime(rt: R, cfg: WriteGateConfig) -> Result<Self, ConfigError> {
        GateHandle::new(cfg).map(|gate| gate.bind(rt))
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> GateHandle<K, S, Unbound> {
    /// An unbound handle over a new gate, hashing bucket keys with `hasher`; refuses an
    /// invalid `cfg`.
    pub fn with_hasher(cfg: WriteGateConfig, hasher: S) -> Result<Self, ConfigError> {
        WriteGate::with_hasher(cfg, hasher).map(Self::from_gate)
    }

    /// An unbound handle over an existing gate. The handle owns the gate's events from here
    /// on: they are turned off (drained events are discarded, not counted) until
    /// [`set_event_sink`](Self::set_event_sink).
    pub fn from_gate(mut gate: WriteGate<K, S>) -> Self {
        while gate.poll_event().is_some() {}
        gate.set_event_capacity(0);
        GateHandle {
            gate: Arc::new(Mutex::new(gate)),
            // Never drawn from while unbound; `bind` replaces it with the bound handle's own.
            rng: Arc::new(Mutex::new(SplitMix64::new(0))),
            signal: WakeSignal::new(),
            timer: WakeSignal::new(),
            tap: Arc::new(EventTap::default()),
            rt: Unbound,
        }
    }

    /// This handle bound to `rt`, drawing from a generator of its own,
    /// [`client_rng`]`(`[`next_client_id`](super::next_client_id)`())`: the same gate (other
    /// clones of it stay unbound and share it), with inputs that read `now` from `rt`. Every
    /// `now` the gate sees must then be on `rt`'s timeline, including those passed to
    /// [`update`](Self::update). The generator is the returned handle's and its clones' (see
    /// "Whose generator" on [`GateHandle`]): binding another clone of the gate gives that one
    /// another generator and leaves this one's stream alone.
    pub fn bind<R: Runtime>(self, rt: R) -> GateHandle<K, S, R> {
        self.bind_with_rng(rt, client_rng(next_client_id()))
    }

    /// [`bind`](Self::bind) with a generator the caller seeded, e.g. `client_rng(id)` for a
    /// client id of its own, or a fixed seed in a replayable simulation. The returned handle
    /// and its clones draw from `rng` alone: a later bind of another clone of the same gate
    /// does not reset or advance it, so the same seed replays the same jitter.
    ///
    /// ```
    /// use throttle_sansio::rng::SplitMix64;
    /// use throttle_sansio::sync::{GateHandle, ManualClock, Runtime};
    /// use throttle_sansio::{Instant, WriteGateConfig};
    /// # use core::future::Future;
    /// # #[derive(Clone)]
    /// # struct Manual(ManualClock);
    /// # impl Runtime for Manual {
    /// #     fn now(&self) -> Instant { self.0.now() }
    /// #     fn sleep_until(&self, at: Instant) -> impl Future<Output = ()> + Send + 'static {
    /// #         self.0.sleep_until(at)
    /// #     }
    /// #     fn spawn<F: Future<Output = ()> + Send + 'static>(&self, f: F) { drop(f) }
    /// # }
    ///
    /// let rt = Manual(ManualClock::new());
    /// let gate = GateHandle::new(WriteGateConfig::default()).unwrap();
    /// let a = gate.clone().bind_with_rng(rt.clone(), SplitMix64::new(7));
    /// let first = a.handle_disk_write_locked(&1u32, 0);
    /// // Another client over the same gate, with the same seed: a stream of its own.
    /// let b = gate.bind_with_rng(rt, SplitMix64::new(7));
    /// assert_eq!(b.handle_disk_write_locked(&2, 0), first, "b starts its own stream");
    /// let _second = a.handle_disk_write_locked(&3, 0); // a continues where it was
    /// ```
    pub fn bind_with_rng<R: Runtime>(self, rt: R, rng: SplitMix64) -> GateHandle<K, S, R> {
        GateHandle {
            gate: self.gate,
            rng: Arc::new(Mutex::new(rng)),
            signal: self.signal,
            timer: self.timer,
            tap: self.tap,
            rt,
        }
    }

    /// Waits while `bucket` is closed with a deadline, on `rt`'s clock; resolves with the
    /// first other state (`Open`, `Probing` or `UnknownLeader`). Wakes early, and re-arms its
    /// timer, when an input moves the bucket's opening earlier. Cancel-safe.
    ///
    /// # Panics
    ///
    /// A poll panics if the bucket's `Hash` or `Eq` (or the hasher) panics as the wait reads
    /// the gate, if the waker's `clone` panics as the wait registers with the handle's signal
    /// or the runtime's sleep, or if the runtime's `now` or sleep panics (a
    /// `throttle_tokio::TokioRuntime::new` made and polled outside a tokio runtime). The wait
    /// only reads the gate, so the gate is unchanged; dropping the future removes its timer
    /// and its listener.
    pub async fn wait_until_open<Rt: Runtime>(&self, rt: &Rt, bucket: &K) -> GateState {
        self.wait_open_on(rt, bucket).await
    }

    /// The gate's timer loop on `rt`: sleeps until `poll_timeout`, calls `handle_timeout`,
    /// forever. An input that moves `poll_timeout` earlier re-arms it. Spawn it once per gate
    /// (drop the task to stop it); without it, reads still treat expired gates as open, and
    /// memory is freed at the next input's own eviction.
    pub async fn drive_timeouts<Rt: Runtime>(&self, rt: &Rt) {
        self.drive_timeouts_on(rt).await;
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher, R: Runtime> GateHandle<K, S, R> {
    /// The runtime the handle reads `now` from and sleeps on.
    pub fn runtime(&self) -> &R {
        &self.rt
    }

    /// Waits while `bucket` is closed with a deadline, on the handle's runtime; resolves with
    /// the first other state (`Open`, `Probing` or `UnknownLeader`). Wakes early, and re-arms
    /// its timer, when an input moves the bucket's opening earlier. Cancel-safe.
    ///
    /// # Panics
    ///
    /// A poll panics if the bucket's `Hash` or `Eq` (or the hasher) panics as the wait reads
    /// the gate, if the waker's `clone` panics as the wait registers with the handle's signal
    /// or the runtime's sleep, or if the runtime's `now` or sleep panics (a
    /// `throttle_tokio::TokioRuntime::new` made and polled outside a tokio runtime). The wait
    /// only reads the gate, so the gate is unchanged; dropping the future removes its timer
    /// and its listener.
    pub async fn wait_until_open(&self, bucket: &K) -> GateState {
        self.wait_open_on(&self.rt, bucket).await
    }

    /// The gate's timer loop on the handle's runtime: sleeps until `poll_timeout`, calls
    /// `handle_timeout`, forever. An input that moves `poll_timeout` earlier re-arms it. Spawn
    /// it once per gate (drop the task to stop it); without it, reads still treat expired
    /// gates as open, and memory is freed at the next input's own eviction.
    pub async fn drive_timeouts(&self) {
        self.drive_timeouts_on(&self.rt).await;
    }

    /// Runs `input` on the gate and the handle's generator under the lock, like
    /// [`update`](Self::update): for a drawing gate input the named helpers do not cover.
    ///
    /// # Panics
    ///
    /// If `input` panics, as [`update`](Self::update): the panic reaches this caller after
    /// the `Wake`s `input` made the gate emit notify the signal and a deadline it moved
    /// earlier re-arms the timer loop; what it did (to the gate and the generator) stays
    /// done, and the handle serves every later call.
    pub fn update_drawing<T>(
        &self,
        input: impl FnOnce(&mut WriteGate<K, S>, &mut SplitMix64) -> T,
    ) -> T {
        // The generator's lock is taken only here, inside the gate's: never contended, and
        // always in the order gate, then generator.
        self.drive_gate(|gate| input(gate, &mut lock(&self.rng)))
    }
}

gate_methods! {
    /// The write was rejected with `DISK_WRITE_LOCKED`; `attempts` counts the rejections
    /// before this one. Returns the bucket's remaining time.
    draws fn handle_disk_write_locked(bucket: &K, attempts: u32) -> Duration;
    /// The write failed with another retriable error. Returns the bucket's remaining time.
    draws fn handle_retriable_write(bucket: &K, attempts: u32) -> Duration;
    /// The leader piggybacked KV backpressure `signal` (latest-wins). Returns the bucket's
    /// remaining time.
    input fn handle_kv_signal(bucket: &K, signal: Signal) -> Duration;
    /// The leader piggybacked KV backpressure `signal`, with the configured KV jitter drawn
    /// ([`WriteGateConfig::with_kv_jitter`]). Returns the bucket's remaining time.
    draws fn handle_kv_signal_jittered(bucket: &K, signal: Signal) -> Duration;
    /// Installs `delay` for a registered `reason`, exactly as given.
    input fn handle_throttle(bucket: &K, reason: Reason, delay: Duration)
        -> Result<Duration, GateError>;
    /// The bucket's leader became unknown (`known == false`) or known again.
    input fn handle_leader(bucket: &K, known: bool);
    /// A batch was sent to the bucket (counted while probing).
    input fn handle_send(bucket: &K);
    /// A write to the bucket succeeded: probe mode ends for it.
    input fn handle_success(bucket: &K);
    /// A write to the bucket was answered with `outcome`: the one mapping from answers to
    /// gate inputs (the paced writer's and the tower layer's).
    draws fn handle_write_outcome(bucket: &K, outcome: WriteOutcome, attempts: u32, feed: OutcomeFeed);
    /// The bucket's state: `Open`, `Closed { until, reason }`, `Probing` or `UnknownLeader`.
    query fn check(bucket: &K) -> GateState;
    /// The time until the bucket opens (zero if open).
    query fn remaining(bucket: &K) -> Duration;
    /// The time until the bucket opens in whole milliseconds, rounded up (a closed bucket never
    /// reports 0).
    query fn remaining_ms(bucket: &K) -> u64;
    /// The dominant pending reason and its deadline, or `None` when no deadline is pending
    /// (ignores the leader and probe state).
    query fn explain(bucket: &K) -> Option<(Reason, Instant)>;
    /// One page of the tracked buckets, in plain terms, under one lock: pass each page's
    /// `next` to the next call (see [`WriteGate::snapshot`]).
    query fn snapshot(from: Option<Cursor>, max: usize) -> Page<BucketSnapshot<K>>;
}

impl<K: Hash + Eq + Clone, S: BuildHasher> GateHandle<K, S, Unbound> {
    /// [`WriteGate::reasons`] at the caller's `now`, collected under the lock: every pending
    /// reason of `bucket` with its own deadline, in reason index order.
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged.
    pub fn reasons(&self, now: Instant, bucket: &K) -> Vec<(Reason, Instant)> {
        lock(&self.gate).reasons(now, bucket).collect()
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher, R: Runtime> GateHandle<K, S, R> {
    /// [`WriteGate::reasons`] at the runtime's `now`, collected under the lock: every pending
    /// reason of `bucket` with its own deadline, in reason index order.
    ///
    /// # Panics
    ///
    /// Only if the runtime's `now`, the bucket's `Hash` or `Eq`, or the hasher panics; the
    /// gate is unchanged.
    pub fn reasons(&self, bucket: &K) -> Vec<(Reason, Instant)> {
        let now = self.rt.now();
        lock(&self.gate).reasons(now, bucket).collect()
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher, R> GateHandle<K, S, R> {
    /// The signal notified on every `GateAction::Wake`.
    pub fn signal(&self) -> &WakeSignal {
        &self.signal
    }

    /// Runs `input` on the gate under the lock, then turns the gate's `Wake` actions into a
    /// notify of [`signal`](Self::signal) (after the lock is dropped). Do not block in `input`.
    /// The `now` passed to the gate's inputs in `input` must be on the timeline of the rest
    /// (the bound runtime's, for a bound handle). Leave the gate's event capacity to
    /// [`set_event_sink`](Self::set_event_sink): changed here, the events would run with no
    /// sink (each one counted in [`events_dropped`](Self::events_dropped)) or stop reaching
    /// the one set.
    ///
    /// # Panics
    ///
    /// If `input` panics (itself, or user code it calls: a key's `Hash`, `Eq` or `Clone`, an
    /// `Rng`), the panic propagates to this caller, after what `input` did to the
    /// gate before the panic is followed through: the `Wake`s it made the gate emit notify the
    /// signal, and a deadline it moved earlier re-arms
    /// [`drive_timeouts`](Self::drive_timeouts). What it did stays done (the handle rolls
    /// nothing back), and the handle serves every later call.
    pub fn update<T>(&self, input: impl FnOnce(&mut WriteGate<K, S>) -> T) -> T {
        self.drive_gate(input)
    }

    /// Sends the gate's observation events ([`GateEvent`]: every install, with its reason,
    /// delay, attempt and the reason's own opening, and every early wake) to `sink`, for
    /// every clone and bind of this gate, replacing any sink set before, and turns the gate's
    /// events on (they are off until then, and cost nothing).
    ///
    /// Each input drains its events under the lock and calls `sink` once per event after the
    /// lock is dropped, in order, on the caller's thread (the timer loop's, for its passes).
    /// A sink that panics loses that event ([`event_sink_panics`](Self::event_sink_panics));
    /// the input returns normally. The gate keeps at most 4096 undrained events per input,
    /// far more than one input records; past that the oldest are lost and counted in
    /// [`events_dropped`](Self::events_dropped).
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use throttle_sansio::sync::GateHandle;
    /// use throttle_sansio::{GateEvent, Instant, Reason, Signal, WriteGateConfig};
    ///
    /// let gate: GateHandle<u32> = GateHandle::new(WriteGateConfig::default()).unwrap();
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = Arc::clone(&seen);
    /// gate.set_event_sink(move |e: &GateEvent<u32>| log.lock().unwrap().push(e.clone()));
    /// let wait = gate.handle_kv_signal(Instant::ZERO, &7, Signal::Full);
    /// let seen = seen.lock().unwrap();
    /// assert!(matches!(
    ///     seen[..],
    ///     [GateEvent::Installed { bucket: 7, reason: Reason::KV_BACKPRESSURE, delay, .. }]
    ///         if delay == wait
    /// ));
    /// ```
    pub fn set_event_sink(&self, sink: impl EventSink<GateEvent<K>> + 'static) {
        self.install_sink(Some(std::sync::Arc::new(sink)));
    }

    /// Removes the event sink and turns the gate's events off again.
    pub fn clear_event_sink(&self) {
        self.install_sink(None);
    }

    fn install_sink(&self, sink: Option<std::sync::Arc<dyn EventSink<GateEvent<K>>>>) {
        self.tap.install([&*self.gate], sink, |g, capacity| {
            g.set_event_capacity(capacity)
        });
    }

    /// Events the sink panicked on (each one lost; nothing else changed).
    pub fn event_sink_panics(&self) -> u64 {
        self.tap.panics()
    }

    /// Events lost before a sink saw them: to the gate's bound before the handle drained
    /// them, or delivered just after a [`clear_event_sink`](Self::clear_event_sink).
    pub fn events_dropped(&self) -> u64 {
        let dropped = lock(&self.gate).events_dropped();
        dropped.saturating_add(self.tap.unseen())
    }

    /// The one drive step behind every input of both forms.
    fn drive_gate<T>(&self, input: impl FnOnce(&mut WriteGate<K, S>) -> T) -> T {
        let mut wake = NotifyOnDrop {
            signal: &self.signal,
            due: false,
        };
        drive(
            &self.gate,
            &self.tap,
            &self.timer,
            input,
            |_, action| match action {
                GateAction::Wake { .. } => wake.due = true,
            },
        )
        // `wake` notifies here, after `drive` dropped the lock and the sink saw the events,
        // or while a panic in `input` unwinds out of `drive`.
    }

    /// The wait of both forms' `wait_until_open`, on `rt`'s clock.
    async fn wait_open_on<Rt: Runtime>(&self, rt: &Rt, bucket: &K) -> GateState {
        let mut state = GateState::Open;
        wait_until(rt, &self.signal, |now| {
            state = lock(&self.gate).check(now, bucket);
            match state {
                GateState::Closed { until, .. } => Some(until),
                _ => None,
            }
        })
        .await;
        state
    }

    /// [`WriteGate::forget`] under the lock: drop everything the gate holds for `bucket`
    /// (a bucket gone from the metadata snapshot). Returns whether it had state. Tasks in
    /// `wait_until_open` are notified when it had, so one parked on the bucket re-checks and
    /// finds it open instead of sleeping until the forgotten deadline.
    ///
    /// ```
    /// use throttle_sansio::sync::GateHandle;
    /// use throttle_sansio::{GateState, Instant, Signal, WriteGateConfig};
    ///
    /// let gate: GateHandle<u32> = GateHandle::new(WriteGateConfig::default()).unwrap();
    /// gate.handle_kv_signal(Instant::ZERO, &7, Signal::Full);
    /// assert!(gate.forget(&7));
    /// assert_eq!(gate.check(Instant::ZERO, &7), GateState::Open);
    /// ```
    ///
    /// # Panics
    ///
    /// Only if the bucket's `Hash` or `Eq`, or the hasher, panics; the gate is unchanged and
    /// the handle serves every later call.
    pub fn forget(&self, bucket: &K) -> bool {
        let had = self.update(|g| g.forget(bucket));
        self.signal.notify_if(had);
        had
    }

    /// [`WriteGate::retain`] under the lock: keep only the buckets `keep` keeps (the buckets
    /// of a new metadata snapshot), with no key callback run. Do not block in `keep` or call
    /// the handle from it (the gate's lock is held). Waiting tasks are notified when any
    /// bucket was dropped, as by [`forget`](Self::forget).
    ///
    /// # Panics
    ///
    /// Only if `keep` panics: the panic reaches the caller, the gate is exactly as it was (the
    /// gate collects every verdict before it drops anything), and the handle serves every
    /// later call.
    pub fn retain(&self, keep: impl FnMut(&K) -> bool) {
        let dropped = self.update(|g| {
            let before = g.len();
            g.retain(keep);
            g.len() < before
        });
        self.signal.notify_if(dropped);
    }

    /// The timer loop of both forms' `drive_timeouts`, on `rt`'s clock.
    async fn drive_timeouts_on<Rt: Runtime>(&self, rt: &Rt) {
        drive_timeouts(rt, &self.gate, &self.timer, || {
            let now = rt.now();
            self.update(|g| g.handle_timeout(now));
        })
        .await;
    }
}

/// Notifies `signal` when dropped, if `due`: on return and on unwind alike.
struct NotifyOnDrop<'a> {
    signal: &'a WakeSignal,
    due: bool,
}

impl Drop for NotifyOnDrop<'_> {
    fn drop(&mut self) {
        // Never unwinds: the signal's lock is its own, and `wake_all` catches a waker's panic.
        self.signal.notify_if(self.due);
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> Observed for WriteGate<K, S> {
    type Event = GateEvent<K>;

    fn poll_event(&mut self) -> Option<GateEvent<K>> {
        WriteGate::poll_event(self)
    }

    #[inline]
    fn has_events(&self) -> bool {
        WriteGate::has_events(self)
    }
}

impl<K, S> Timed for WriteGate<K, S>
where
    K: Hash + Eq + Clone,
    S: BuildHasher,
{
    type Action = GateAction;

    fn poll_timeout(&self) -> Option<Instant> {
        WriteGate::poll_timeout(self)
    }

    fn poll_action(&mut self) -> Option<GateAction> {
        WriteGate::poll_action(self)
    }
}

#[cfg(all(test, not(loom)))]
mod panics;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{Executor, TestRuntime};
    use crate::test_hasher::TestHasher;
    use std::sync::Mutex as StdMutex;

    type Gate = GateHandle<u32, TestHasher>;

    fn is_send<T: Send>(_: &T) {}

    /// Where a [`waiter`]'s future records how its wait ended: the state and the time.
    type Ended = std::sync::Arc<StdMutex<Option<(GateState, Instant)>>>;

    /// A task waiting (on `rt`'s clock) until `bucket` opens, which records how its wait ended;
    /// the caller spawns it.
    fn waiter(
        gate: &Gate,
        rt: &TestRuntime,
        bucket: u32,
    ) -> (impl Future<Output = ()> + Send + use<>, Ended) {
        let ended = Ended::default();
        let (gate, rt, out) = (gate.clone(), rt.clone(), std::sync::Arc::clone(&ended));
        let fut = async move {
            let state = gate.wait_until_open(&rt, &bucket).await;
            if let Ok(mut r) = out.lock() {
                *r = Some((state, rt.now()));
            }
        };
        (fut, ended)
    }

    fn default_gate() -> Gate {
        Gate::with_hasher(WriteGateConfig::default(), TestHasher::default())
            .expect("the default config is valid")
    }

    #[test]
    fn lower_pressure_wakes_the_sleeper_early_and_it_opens_at_the_new_deadline() {
        let mut ex = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(ex.spawner());
        let gate = Gate::with_hasher(WriteGateConfig::fluss_issue_3454(), TestHasher::default())
            .expect("the preset is valid");
        let t0 = Instant::ZERO;
        // Full pressure: the ceiling of the issue-3454 curve this test pins, 5000 ms.
        assert_eq!(
            gate.handle_kv_signal(t0, &7, Signal::Full),
            Duration::from_millis(5000)
        );
        let (fut, result) = waiter(&gate, &rt, 7);
        is_send(&fut);
        rt.spawn(fut);
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(5000)));
        // Half pressure: 5000 ms x 0.5^3 = 625 ms; latest-wins shortens it and emits a Wake.
        let epoch = gate.signal().epoch();
        gate.handle_kv_signal(t0, &7, Signal::Pressure(500_000));
        assert!(
            gate.signal().has_changed(epoch),
            "the Wake notified the signal"
        );
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(
            rt.clock.next_deadline(),
            Some(Instant::from_millis(625)),
            "re-armed at the earlier opening"
        );
        rt.clock.advance_to(Instant::from_millis(624));
        assert_eq!(ex.run_until_stalled(), 1);
        rt.clock.advance_to(Instant::from_millis(625));
        assert_eq!(ex.run_until_stalled(), 0);
        let got = result.lock().ok().and_then(|r| *r);
        assert_eq!(got, Some((GateState::Open, Instant::from_millis(625))));
    }

    #[test]
    fn forget_and_retain_reach_the_gate_and_release_a_waiter_on_a_dropped_bucket() {
        let mut ex = Executor::default();
        let rt = TestRuntime::new();
        let gate = default_gate();
        gate.handle_kv_signal(Instant::ZERO, &3, Signal::Full);
        gate.handle_kv_signal(Instant::ZERO, &4, Signal::Full);
        gate.handle_kv_signal(Instant::ZERO, &5, Signal::Full);
        let (fut, result) = waiter(&gate, &rt, 3);
        ex.spawn(fut);
        assert_eq!(ex.run_until_stalled(), 1);
        // The table of bucket 3 was dropped: the waiter wakes now, not at 3 s.
        assert!(gate.forget(&3));
        assert_eq!(ex.run_until_stalled(), 0);
        assert_eq!(
            result.lock().ok().and_then(|r| *r),
            Some((GateState::Open, Instant::ZERO))
        );
        assert!(!gate.forget(&3));
        let epoch = gate.signal().epoch();
        gate.retain(|&b| b == 4);
        assert!(
            gate.signal().has_changed(epoch),
            "a dropped bucket notifies"
        );
        assert_eq!(gate.check(Instant::ZERO, &5), GateState::Open);
        assert!(matches!(
            gate.check(Instant::ZERO, &4),
            GateState::Closed { .. }
        ));
        let epoch = gate.signal().epoch();
        gate.retain(|_| true);
        assert!(
            !gate.signal().has_changed(epoch),
            "nothing dropped, nothing notified"
        );
        // A panicking verdict leaves the gate as it was and the handle serving.
        let out = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            gate.retain(|_| panic!("the snapshot lookup panics"))
        }));
        assert!(out.is_err());
        assert!(matches!(
            gate.check(Instant::ZERO, &4),
            GateState::Closed { .. }
        ));
        gate.retain(|_| false);
        assert_eq!(gate.check(Instant::ZERO, &4), GateState::Open);
    }

    #[test]
    fn reasons_reads_every_pending_reason_at_the_callers_or_the_runtimes_now() {
        let gate = default_gate();
        gate.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
        gate.handle_disk_write_locked(Instant::ZERO, &1, 1, &mut crate::rng::SplitMix64::new(7));
        let listed = gate.reasons(Instant::ZERO, &1);
        assert_eq!(
            listed.iter().map(|&(r, _)| r).collect::<Vec<_>>(),
            [Reason::DISK_WRITE_LOCKED, Reason::KV_BACKPRESSURE]
        );
        assert_eq!(
            listed.iter().map(|&(_, at)| at).max(),
            gate.explain(Instant::ZERO, &1).map(|(_, at)| at)
        );
        assert!(gate.reasons(Instant::ZERO, &2).is_empty());
        let rt = TestRuntime::new();
        let bound = gate.clone().bind(rt.clone());
        assert_eq!(bound.reasons(&1), listed, "the runtime's clock reads 0 too");
        rt.clock.advance_to(Instant::from_millis(3_600_000));
        assert!(
            bound.reasons(&1).is_empty(),
            "an hour later nothing is pending"
        );
    }

    #[test]
    fn a_longer_install_does_not_wake_sleepers() {
        let gate = default_gate();
        let epoch = gate.signal().epoch();
        gate.handle_kv_signal(Instant::ZERO, &1, Signal::Pressure(500_000));
        gate.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
        assert!(
            !gate.signal().has_changed(epoch),
            "longer throttles never wake"
        );
    }

    #[test]
    fn unknown_leader_ends_the_wait_so_the_caller_refreshes() {
        let mut ex = Executor::default();
        let rt = TestRuntime::new();
        let gate = default_gate();
        gate.handle_kv_signal(Instant::ZERO, &3, Signal::Full);
        let (fut, result) = waiter(&gate, &rt, 3);
        ex.spawn(fut);
        assert_eq!(ex.run_until_stalled(), 1);
        gate.handle_leader(Instant::ZERO, &3, false); // drops the KV throttle: a Wake
        assert_eq!(ex.run_until_stalled(), 0);
        assert_eq!(
            result.lock().ok().and_then(|r| *r),
            Some((GateState::UnknownLeader, Instant::ZERO))
        );
    }

    #[test]
    fn timeout_driver_evicts_expired_gates_and_rearms_for_earlier_ones() {
        let mut ex = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(ex.spawner());
        let gate = Gate::with_hasher(WriteGateConfig::fluss_issue_3454(), TestHasher::default())
            .expect("the preset is valid");
        {
            let (gate, rt2) = (gate.clone(), rt.clone());
            rt.spawn(async move { gate.drive_timeouts(&rt2).await });
        }
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(
            rt.clock.next_deadline(),
            Some(Instant::MAX),
            "idle: asleep until an input gates something"
        );
        gate.handle_kv_signal(Instant::ZERO, &1, Signal::Full);
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(5000)));
        gate.handle_kv_signal(Instant::ZERO, &2, Signal::Pressure(500_000));
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(625)));
        rt.clock.advance_to(Instant::from_millis(5000));
        assert_eq!(ex.run_until_stalled(), 1);
        assert!(gate.update(|g| g.is_empty()), "every expired gate evicted");
    }
}

/// The bound form: inputs, queries and waits on the runtime's clock, jitter from the handle's
/// own generator.
#[cfg(all(test, not(loom)))]
mod bound_tests {
    use super::*;
    use crate::backoff::BackoffConfig;
    use crate::sync::test_support::{Executor, TestRuntime};
    use crate::test_hasher::TestHasher;
    use alloc::vec::Vec;
    use std::sync::Mutex as StdMutex;

    type Bound = GateHandle<u32, TestHasher, TestRuntime>;

    /// The disk backoff is jittered (±20 %), so draws tell generators apart.
    fn cfg() -> WriteGateConfig {
        WriteGateConfig::fluss_issue_3454()
            .with_disk_write_locked(BackoffConfig::fluss_disk_write_locked())
    }

    fn bound(rt: &TestRuntime) -> Bound {
        match GateHandle::with_hasher(cfg(), TestHasher::default()) {
            Ok(g) => g.bind(rt.clone()),
            Err(e) => panic!("the config is valid: {e}"),
        }
    }

    /// Eight disk-locked rejections on fresh buckets: eight draws of the handle's generator.
    fn draws(gate: &Bound, first_bucket: u32) -> Vec<Duration> {
        (first_bucket..first_bucket + 8)
            .map(|b| gate.handle_disk_write_locked(&b, 0))
            .collect()
    }

    #[test]
    fn a_bound_input_and_query_read_the_runtimes_clock() {
        let rt = TestRuntime::new();
        let gate = bound(&rt);
        rt.clock.advance_to(Instant::from_millis(1_000));
        let wait = gate.handle_kv_signal(&7, Signal::Full);
        assert_eq!(wait, Duration::from_millis(5_000));
        assert_eq!(
            gate.check(&7),
            GateState::Closed {
                until: Instant::from_millis(6_000),
                reason: Reason::KV_BACKPRESSURE
            },
            "installed at the runtime's 1000 ms, not at the epoch"
        );
        rt.clock.advance_to(Instant::from_millis(5_999));
        assert_eq!(gate.remaining(&7), Duration::from_millis(1));
        assert!(matches!(gate.check(&7), GateState::Closed { .. }));
        rt.clock.advance_to(Instant::from_millis(6_000));
        assert_eq!(
            gate.check(&7),
            GateState::Open,
            "opens on the runtime's clock"
        );
        assert_eq!(gate.remaining(&7), Duration::ZERO);
    }

    #[test]
    fn a_bound_wait_sleeps_on_the_runtime_and_wakes_early_on_a_lower_pressure() {
        let mut ex = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(ex.spawner());
        let gate = bound(&rt);
        rt.clock.advance_to(Instant::from_millis(100));
        gate.handle_kv_signal(&7, Signal::Full); // until 5100 ms
        let result = std::sync::Arc::new(StdMutex::new(None));
        {
            let (gate, result) = (gate.clone(), std::sync::Arc::clone(&result));
            let clock = rt.clock.clone();
            rt.spawn(async move {
                let state = gate.wait_until_open(&7).await;
                if let Ok(mut r) = result.lock() {
                    *r = Some((state, clock.now()));
                }
            });
        }
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(5_100)));
        rt.clock.advance_to(Instant::from_millis(200));
        // Half pressure at 200 ms: 625 ms from the runtime's now, a Wake.
        gate.handle_kv_signal(&7, Signal::Pressure(500_000));
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(825)));
        rt.clock.advance_to(Instant::from_millis(825));
        assert_eq!(ex.run_until_stalled(), 0);
        let got = result.lock().ok().and_then(|r| *r);
        assert_eq!(got, Some((GateState::Open, Instant::from_millis(825))));
    }

    #[test]
    fn a_bound_timer_loop_evicts_on_the_runtimes_clock() {
        let mut ex = Executor::default();
        let mut rt = TestRuntime::new();
        rt.spawner = Some(ex.spawner());
        let gate = bound(&rt);
        {
            let gate = gate.clone();
            rt.spawn(async move { gate.drive_timeouts().await });
        }
        assert_eq!(ex.run_until_stalled(), 1);
        rt.clock.advance_to(Instant::from_millis(10));
        gate.handle_kv_signal(&1, Signal::Full);
        assert_eq!(ex.run_until_stalled(), 1);
        assert_eq!(rt.clock.next_deadline(), Some(Instant::from_millis(5_010)));
        rt.clock.advance_to(Instant::from_millis(5_010));
        assert_eq!(ex.run_until_stalled(), 1);
        assert!(
            gate.update(|g| g.is_empty()),
            "the expired gate was evicted"
        );
    }

    #[test]
    fn two_handles_bound_to_one_runtime_draw_different_jitter() {
        let rt = TestRuntime::new();
        let (a, b) = (bound(&rt), bound(&rt));
        let (da, db) = (draws(&a, 0), draws(&b, 0));
        assert!(
            da.iter()
                .all(|d| (800..=1_200).contains(&(d.as_millis() as u64))),
            "1 s ± 20 %: {da:?}"
        );
        assert_ne!(da, db, "two clients drew the same jitter");
        // A clone is the same client: it continues the stream instead of restarting it.
        let a2 = a.clone();
        let more = draws(&a2, 100);
        assert_ne!(more, da, "a clone restarted the stream");
    }

    #[test]
    fn bound_explain_and_remaining_ms_read_the_runtimes_clock() {
        let rt = TestRuntime::new();
        let gate = bound(&rt);
        assert_eq!(gate.explain(&7), None, "nothing pending");
        assert_eq!(gate.remaining_ms(&7), 0);
        rt.clock.advance_to(Instant::from_millis(1_000));
        gate.handle_kv_signal(&7, Signal::Full); // 5000 ms from the runtime's 1000 ms
        assert_eq!(
            gate.explain(&7),
            Some((Reason::KV_BACKPRESSURE, Instant::from_millis(6_000)))
        );
        rt.clock.advance_to(Instant::from_millis(5_999));
        assert_eq!(gate.remaining_ms(&7), 1);
        // Rounded up: 0.4 ms left still reads 1 ms.
        rt.clock.advance_to(Instant::from_nanos(5_999_600_000));
        assert_eq!(gate.remaining_ms(&7), 1);
        rt.clock.advance_to(Instant::from_millis(6_000));
        assert_eq!(gate.remaining_ms(&7), 0, "open on the runtime's clock");
        assert_eq!(gate.explain(&7), None, "the deadline has passed");
        // The unbound form is the same query at the caller's `now`.
        let raw: GateHandle<u32, TestHasher> =
            GateHandle::with_hasher(cfg(), TestHasher::default()).expect("the preset is valid");
        raw.handle_kv_signal(Instant::from_millis(1_000), &7, Signal::Full);
        assert_eq!(raw.remaining_ms(Instant::from_millis(5_999), &7), 1);
        assert_eq!(
            raw.explain(Instant::from_millis(5_999), &7),
            Some((Reason::KV_BACKPRESSURE, Instant::from_millis(6_000)))
        );
    }

    /// The generator belongs to the bound handle (and its clones), not to the gate: binding
    /// another clone of the same gate, even with the same seed, neither resets nor advances
    /// the first handle's stream, so its jitter replays.
    #[test]
    fn binding_another_clone_leaves_the_first_handles_stream_alone() {
        let rt = TestRuntime::new();
        let seeded =
            |g: GateHandle<u32, TestHasher>| g.bind_with_rng(rt.clone(), SplitMix64::new(9));
        let fresh =
            || GateHandle::with_hasher(cfg(), TestHasher::default()).expect("the preset is valid");
        // The reference: one client alone on its gate, sixteen draws.
        let reference = seeded(fresh());
        let mut want = draws(&reference, 0);
        want.extend(draws(&reference, 8));

        let gate = fresh();
        let first = seeded(gate.clone());
        let mut got = draws(&first, 0);
        // A second client binds the same gate with the same seed, and draws.
        let second = seeded(gate.clone());
        let theirs = draws(&second, 1_000);
        assert_eq!(
            theirs,
            want[..8],
            "the second client has a stream of its own"
        );
        // A third binds (own generator from `client_rng`) and draws too.
        let third = gate.bind(rt.clone());
        let _ = draws(&third, 2_000);
        got.extend(draws(&first, 8));
        assert_eq!(
            got, want,
            "another bind disturbed the first handle's stream"
        );
        // A clone of the first is the same client: it continues the same stream.
        let clone = first.clone();
        assert_eq!(
            draws(&clone, 16),
            draws(&reference, 16),
            "a clone restarted the stream"
        );
    }

    #[test]
    fn a_handle_bound_with_a_chosen_generator_replays_and_the_raw_form_takes_the_callers() {
        let rt = TestRuntime::new();
        let seeded = |seed| match GateHandle::with_hasher(cfg(), TestHasher::default()) {
            Ok(g) => g.bind_with_rng(rt.clone(), SplitMix64::new(seed)),
            Err(e) => panic!("the config is valid: {e}"),
        };
        let (x, y) = (seeded(9), seeded(9));
        assert_eq!(draws(&x, 0), draws(&y, 0), "same seed, same jitter");
        // The raw form draws from the caller's generator, not the handle's.
        let raw: GateHandle<u32, TestHasher> =
            match GateHandle::with_hasher(cfg(), TestHasher::default()) {
                Ok(g) => g,
                Err(e) => panic!("the config is valid: {e}"),
            };
        let mut rng = SplitMix64::new(9);
        let raw_draws: Vec<Duration> = (0..8)
            .map(|b| raw.handle_disk_write_locked(Instant::ZERO, &b, 0, &mut rng))
            .collect();
        assert_eq!(raw_draws, draws(&seeded(9), 0));
    }
}

/// The gate's race, in the style of `sync::loom_models` (run with the same command).
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::sync::test_support::{CountingWaker, TestRuntime, repoll_while_woken};
    use crate::test_hasher::TestHasher;
    use alloc::boxed::Box;
    use core::task::{Context, Poll};
    use loom::thread;

    /// The gate's wake signal races a sleeper in `GateHandle::wait_until_open` that is reading the
    /// gate and arming its timer: a lower KV pressure (latest-wins, a `Wake`) on another thread
    /// must leave the sleeper asleep with its only timer at the new, earlier opening.
    #[test]
    fn gate_wake_racing_a_sleeper_rearms_its_timer_at_the_earlier_opening() {
        loom::model(|| {
            let rt = TestRuntime::new();
            let gate: GateHandle<u32, TestHasher> =
                GateHandle::with_hasher(WriteGateConfig::fluss_issue_3454(), TestHasher::default())
                    .expect("the preset is valid");
            let _ = gate.handle_kv_signal(Instant::ZERO, &7, Signal::Full); // 5000 ms

            let gate2 = gate.clone();
            let t1 = thread::spawn(move || {
                // 5000 ms x 0.5^3 = 625 ms: latest-wins shortens it and emits a Wake.
                let _ = gate2.handle_kv_signal(Instant::ZERO, &7, Signal::Pressure(500_000));
            });

            let (waker, wakes) = CountingWaker::new();
            let mut cx = Context::from_waker(&waker);
            let mut sleeper = Box::pin(gate.wait_until_open(&rt, &7));
            assert!(sleeper.as_mut().poll(&mut cx).is_pending());
            let _ = t1.join();
            repoll_while_woken(sleeper.as_mut(), &wakes, &mut cx);
            assert_eq!(
                rt.clock.next_deadline(),
                Some(Instant::from_millis(625)),
                "asleep on the old opening: the Wake was lost"
            );
            assert_eq!(rt.clock.sleepers(), 1, "the old timer was dropped");
            rt.clock.advance_to(Instant::from_millis(625));
            assert_eq!(sleeper.as_mut().poll(&mut cx), Poll::Ready(GateState::Open));
        });
    }
}
