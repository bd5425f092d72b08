//! KV backpressure: the server's L0-driven write decision, the pressure signal on the wire, and
//! the client's throttle curve.
//!
//! Two halves cooperate so a slow RocksDB column family slows its producers down before its own
//! write stall can block an RPC handler:
//!
//! - **Server half** ([`ServerPressure`], configured by [`PressureConfig`]): the column family's
//!   L0 file count becomes a [`Decision`]. Below the trigger `Tf` a write is accepted with no
//!   pressure; from `Tf` up to RocksDB's `level0_slowdown_writes_trigger` `Tr` it is accepted
//!   and carries the pressure `(L0 − Tf)/(Tr − Tf)`; at `L0 ≥ Tr` it is rejected with a
//!   retriable storage-backpressure error, so the handler never blocks.
//! - **Wire** ([`Signal`]): the pressure as parts per million, decoded from the protocol's
//!   `f32` by [`Signal::from_f32`]; a storage-backpressure rejection is [`Signal::Full`].
//! - **Client half** ([`ThrottleCurve`]): a signal becomes a throttle delay
//!   `⌊max_throttle_ms · ppm^k / 10^(6k)⌋` ms; `Full` gives `max_throttle`, so the ramp runs
//!   continuously into rejection.
//!
//! Every decision is integer arithmetic; floats appear only in [`Signal::from_f32`] and
//! [`Signal::to_f32`], at the wire.
//!
//! ```
//! use core::time::Duration;
//! use throttle_sansio::backpressure::{PressureConfig, ServerPressure, Signal, ThrottleCurve};
//!
//! // Server: Fluss's landed trigger (Tf = 8) below RocksDB's slowdown trigger (Tr = 20).
//! let mut server = ServerPressure::new(PressureConfig::fluss_landed());
//! server.handle_l0(14);
//! let signal = server.decide().signal();
//! assert_eq!(signal, Signal::Pressure(500_000)); // (14 − 8) / (20 − 8) = 0.5
//!
//! // Client: the landed quadratic curve, 3000 ms ceiling.
//! let curve = ThrottleCurve::fluss_landed();
//! assert_eq!(curve.delay(signal), Duration::from_millis(750));
//! server.handle_l0(20);
//! assert_eq!(curve.delay(server.decide().signal()), Duration::from_millis(3000));
//! ```

use core::time::Duration;

use crate::error::ConfigError;
use crate::options::{ConfigOption, curve as curve_opt, pressure as opt};

/// One whole in parts per million: the pressure of a full (rejecting) server.
const PPM_ONE: u32 = 1_000_000;

/// Pressure a latched server reports at least (0.8), whatever its L0 count.
const LATCH_FLOOR_PPM: u32 = 800_000;

// ---------------------------------------------------------------------------------------------
// Wire signal
// ---------------------------------------------------------------------------------------------

/// The backpressure a server reports for one bucket, in parts per million (ppm).
///
/// The variants are listed by severity. `Pressure(ppm)` is meant to hold
/// `0 < ppm < 1_000_000`; constructors here always normalise (see [`Signal::from_ppm`]), and
/// every consumer treats an out-of-range payload as its neighbour: `Pressure(0)` as `Clear`,
/// `Pressure(≥ 1_000_000)` as `Full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// No pressure: the client does not throttle.
    Clear,
    /// Pressure `ppm / 1_000_000`, strictly between 0 and 1.
    Pressure(u32),
    /// Full pressure, including a storage-backpressure rejection: the client throttles for
    /// the curve's whole ceiling.
    Full,
}

impl Signal {
    /// Decodes the protocol's `f32` pressure.
    ///
    /// - NaN, `-inf`, `-0.0`, `0.0` and anything negative → [`Signal::Clear`];
    /// - `1.0`, anything larger and `+inf` → [`Signal::Full`];
    /// - `0 < x < 1` → `x · 10⁶` rounded to the nearest ppm, ties upward, computed exactly from
    ///   the float's bits (no float arithmetic, so every target rounds alike). A value that
    ///   rounds to 0 ppm (`x < 5·10⁻⁷`, subnormals included) is `Clear`, and one that rounds to
    ///   1 000 000 ppm (`x ≥ 0.9999995`) is `Full`: the mapping is monotone in `x`, and agrees
    ///   with [`ThrottleCurve::delay`], which gives 0 at 0 ppm and the ceiling at 10⁶ ppm.
    ///
    /// ```
    /// use throttle_sansio::backpressure::Signal;
    ///
    /// assert_eq!(Signal::from_f32(0.9), Signal::Pressure(900_000));
    /// assert_eq!(Signal::from_f32(f32::NAN), Signal::Clear);
    /// assert_eq!(Signal::from_f32(1e-7), Signal::Clear); // 0.1 ppm rounds to 0
    /// assert_eq!(Signal::from_f32(0.9999999), Signal::Full); // 999 999.88 ppm rounds to 10⁶
    /// ```
    pub fn from_f32(x: f32) -> Signal {
        if x.is_nan() || x <= 0.0 {
            return Signal::Clear;
        }
        if x >= 1.0 {
            return Signal::Full;
        }
        // Here 0 < x < 1 and finite: x = mantissa · 2^-shift exactly, with shift ≥ 24.
        let bits = x.to_bits();
        let biased_exponent = (bits >> 23) & 0xff;
        let fraction = bits & 0x007f_ffff;
        let (mantissa, shift) = if biased_exponent == 0 {
            (fraction, 149) // subnormal
        } else {
            (
                fraction | 0x0080_0000,
                150u32.saturating_sub(biased_exponent),
            )
        };
        // mantissa < 2^24, so the product stays below 2^44.
        let scaled = u64::from(mantissa) * u64::from(PPM_ONE);
        let ppm = if shift >= 64 {
            0 // below 2^-40: far under half a ppm
        } else {
            // Round half up: add half the divisor before shifting (< 2^62 + 2^44, no overflow).
            scaled.saturating_add(1u64 << shift.saturating_sub(1)) >> shift
        };
        Signal::from_ppm(u32::try_from(ppm).unwrap_or(PPM_ONE))
    }

    /// The signal for `ppm` parts per million: 0 → `Clear`, 10⁶ or more → `Full`.
    pub const fn from_ppm(ppm: u32) -> Signal {
        if ppm == 0 {
            Signal::Clear
        } else if ppm >= PPM_ONE {
            Signal::Full
        } else {
            Signal::Pressure(ppm)
        }
    }

    /// The pressure in ppm, in `0..=1_000_000`: `Clear` is 0, `Full` is 10⁶, and an
    /// out-of-range `Pressure` payload is clamped.
    pub const fn ppm(self) -> u32 {
        match self {
            Signal::Clear => 0,
            Signal::Pressure(ppm) if ppm >= PPM_ONE => PPM_ONE,
            Signal::Pressure(ppm) => ppm,
            Signal::Full => PPM_ONE,
        }
    }

    /// The `f32` to put on the wire (`Clear` 0.0, `Full` 1.0).
    ///
    /// [`Signal::from_f32`] decodes it back to the same signal for every ppm value: `ppm` is
    /// exact in an `f32` and the division is off by far less than half a ppm.
    pub fn to_f32(self) -> f32 {
        // `ppm()` ≤ 10⁶ < 2^24, so the conversion is exact.
        self.ppm() as f32 / PPM_ONE as f32
    }
}

// ---------------------------------------------------------------------------------------------
// Server half
// ---------------------------------------------------------------------------------------------

/// What the server does with one write to a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// Apply the write and piggyback `pressure_ppm` on its response (0: no pressure; always
    /// below 1 000 000).
    Accept {
        /// The pressure to report, in ppm.
        pressure_ppm: u32,
    },
    /// Refuse the write with a retriable storage-backpressure error without touching RocksDB,
    /// so the handler never blocks in RocksDB's own write stall. The client sees
    /// [`Signal::Full`].
    Reject {
        /// Which rule refused it.
        reason: RejectReason,
    },
}

impl Decision {
    /// The signal the client receives for this decision: the accepted pressure, or `Full` for a
    /// rejection.
    pub const fn signal(self) -> Signal {
        match self {
            Decision::Accept { pressure_ppm } => Signal::from_ppm(pressure_ppm),
            Decision::Reject { .. } => Signal::Full,
        }
    }

    /// Whether the write is refused.
    pub const fn is_reject(self) -> bool {
        matches!(self, Decision::Reject { .. })
    }
}

impl From<Decision> for Signal {
    fn from(decision: Decision) -> Signal {
        decision.signal()
    }
}

/// Why [`ServerPressure::decide`] refused a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectReason {
    /// L0 reached RocksDB's `level0_slowdown_writes_trigger`.
    SlowdownTrigger,
    /// L0 plus the files the pending memtables will flush into, plus the write-buffer
    /// headroom, reached the slowdown trigger (opt-in, [`PressureConfigBuilder::flush_budget`]).
    FlushBudget,
    /// RocksDB refused a `no_slowdown` write and no flush has completed since.
    Latched,
}

/// The opt-in flush budget: reject once
/// `L0 + ⌈pending_bytes / write_buffer_size⌉ + max_write_buffers ≥ Tr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct FlushBudget {
    /// Bytes per memtable (RocksDB `write_buffer_size`; at least 1).
    pub write_buffer_size: u64,
    /// Memtables counted as headroom (RocksDB `max_write_buffer_number`; below `Tr`).
    pub max_write_buffers: u32,
}

/// The largest L0 trigger accepted: RocksDB's triggers are C `int`s.
const MAX_TRIGGER: u32 = i32::MAX as u32;

/// Configuration of the server half: the two L0 triggers and the optional flush budget.
///
/// `Default` is Fluss's server as landed by PR #3463: `Tf = 8` (`kv.backpressure.l0-slowdown-trigger`),
/// `Tr = 20` (RocksDB's default `level0_slowdown_writes_trigger`), no flush budget; the same as
/// [`PressureConfig::fluss_landed`]. Its client half is [`ThrottleCurve::default`]. The
/// proposal of Fluss issue #3454 (`Tf = 12`) is the preset [`PressureConfig::fluss_issue_3454`].
///
/// ```
/// use throttle_sansio::backpressure::PressureConfig;
///
/// let landed = PressureConfig::default();
/// assert_eq!((landed.l0_trigger(), landed.l0_slowdown_writes_trigger()), (8, 20));
/// assert_eq!(PressureConfig::fluss_issue_3454().l0_trigger(), 12);
/// // With the flush budget: 64 MiB memtables, 2 of them counted as headroom.
/// let budgeted = PressureConfig::builder().flush_budget(64 << 20, 2).build()?;
/// assert_eq!(budgeted.flush_budget().map(|b| b.max_write_buffers), Some(2));
/// // Tf must stay below Tr; the error names the builder method and Fluss's key.
/// let err = PressureConfig::builder().l0_trigger(20).build().unwrap_err();
/// assert!(err.to_string().contains("`PressureConfigBuilder::l0_trigger`"));
/// assert!(err.to_string().contains("Fluss `kv.backpressure.l0-slowdown-trigger`"));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PressureConfig {
    l0_trigger: u32,
    slowdown_trigger: u32,
    flush_budget: Option<FlushBudget>,
}

impl Default for PressureConfig {
    /// Fluss as landed (PR #3463): [`PressureConfig::fluss_landed`].
    fn default() -> Self {
        Self::fluss_landed()
    }
}

impl PressureConfig {
    /// The trigger Fluss landed (PR #3463), `Tf = 8` (with `Tr = 20`, no flush budget): the
    /// default. Pair it with [`ThrottleCurve::fluss_landed`] on the client. The landed flush
    /// budget stays opt-in: add it with [`PressureConfigBuilder::flush_budget`].
    pub const fn fluss_landed() -> Self {
        PressureConfig {
            l0_trigger: 8,
            slowdown_trigger: 20,
            flush_budget: None,
        }
    }

    /// The proposal of Fluss issue #3454: `Tf = 12`, `Tr = 20`, no flush budget. Pair it with
    /// [`ThrottleCurve::fluss_issue_3454`] on the client.
    pub const fn fluss_issue_3454() -> Self {
        PressureConfig {
            l0_trigger: 12,
            slowdown_trigger: 20,
            flush_budget: None,
        }
    }

    /// A builder starting from the default configuration.
    pub fn builder() -> PressureConfigBuilder {
        PressureConfigBuilder {
            cfg: PressureConfig::default(),
            flush_budget: None,
        }
    }

    /// A builder starting from this configuration.
    pub fn to_builder(&self) -> PressureConfigBuilder {
        PressureConfigBuilder {
            cfg: *self,
            flush_budget: self
                .flush_budget
                .map(|b| (b.write_buffer_size, b.max_write_buffers)),
        }
    }

    /// `Tf`: the L0 file count at which pressure starts.
    pub const fn l0_trigger(&self) -> u32 {
        self.l0_trigger
    }

    /// `Tr`: RocksDB's `level0_slowdown_writes_trigger`, at which writes are rejected.
    pub const fn l0_slowdown_writes_trigger(&self) -> u32 {
        self.slowdown_trigger
    }

    /// The flush budget, if enabled.
    pub const fn flush_budget(&self) -> Option<FlushBudget> {
        self.flush_budget
    }
}

/// Builds a validated [`PressureConfig`].
#[derive(Debug, Clone)]
#[must_use]
pub struct PressureConfigBuilder {
    cfg: PressureConfig,
    flush_budget: Option<(u64, u32)>,
}

impl PressureConfigBuilder {
    /// `Tf`, in `1..=i32::MAX` and below `Tr`.
    pub fn l0_trigger(mut self, files: u32) -> Self {
        self.cfg.l0_trigger = files;
        self
    }

    /// `Tr`, RocksDB's `level0_slowdown_writes_trigger`, in `1..=i32::MAX` and above `Tf`.
    pub fn l0_slowdown_writes_trigger(mut self, files: u32) -> Self {
        self.cfg.slowdown_trigger = files;
        self
    }

    /// Enables the flush budget with RocksDB's `write_buffer_size` (bytes, at least 1) and
    /// `max_write_buffer_number` (`1..=i32::MAX`, below `Tr`).
    pub fn flush_budget(mut self, write_buffer_size: u64, max_write_buffers: u32) -> Self {
        self.flush_budget = Some((write_buffer_size, max_write_buffers));
        self
    }

    /// Disables the flush budget (the default).
    pub fn without_flush_budget(mut self) -> Self {
        self.flush_budget = None;
        self
    }

    /// The configuration, or the first option out of range.
    pub fn build(self) -> Result<PressureConfig, ConfigError> {
        let mut cfg = self.cfg;
        trigger_in_range(&opt::L0_TRIGGER, cfg.l0_trigger)?;
        trigger_in_range(&opt::SLOWDOWN_TRIGGER, cfg.slowdown_trigger)?;
        // Upstream only logs a warning for Tr ≤ Tf and then reports pressure 0; we refuse it.
        if cfg.l0_trigger >= cfg.slowdown_trigger {
            return Err(ConfigError::Invalid {
                option: &opt::L0_TRIGGER,
                reason: "must be below `l0_slowdown_writes_trigger`",
            });
        }
        cfg.flush_budget = match self.flush_budget {
            None => None,
            Some((write_buffer_size, max_write_buffers)) => {
                if write_buffer_size == 0 {
                    return Err(ConfigError::OutOfRange {
                        option: &opt::WRITE_BUFFER_SIZE,
                        got: 0,
                        min: 1,
                        max: u64::MAX,
                        unit: "bytes",
                    });
                }
                trigger_in_range(&opt::MAX_WRITE_BUFFERS, max_write_buffers)?;
                // With the headroom alone at Tr, every write would be refused forever.
                if max_write_buffers >= cfg.slowdown_trigger {
                    return Err(ConfigError::Invalid {
                        option: &opt::MAX_WRITE_BUFFERS,
                        reason: "must be below `l0_slowdown_writes_trigger`",
                    });
                }
                Some(FlushBudget {
                    write_buffer_size,
                    max_write_buffers,
                })
            }
        };
        Ok(cfg)
    }
}

fn trigger_in_range(option: &'static ConfigOption, got: u32) -> Result<(), ConfigError> {
    if (1..=MAX_TRIGGER).contains(&got) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            option,
            got: u64::from(got),
            min: 1,
            max: u64::from(MAX_TRIGGER),
            unit: "files",
        })
    }
}

/// The server half of KV backpressure for one column family (one bucket's RocksDB).
///
/// It holds the latest storage readings and the rejection latch, and answers what to do with a
/// write. It takes no time: nothing in it expires, every change is driven by an event.
///
/// # Driving contract
///
/// - **Inputs** (`&mut self`), in any order, as often as wanted; each replaces what it
///   reports:
///   - [`handle_l0`](Self::handle_l0): the column family's current L0 file count (upstream
///     reads it once per write request);
///   - [`handle_pending_bytes`](Self::handle_pending_bytes): bytes in memtables not yet
///     flushed (only the flush budget reads it);
///   - [`handle_write_rejected`](Self::handle_write_rejected): RocksDB refused a write issued
///     with `no_slowdown` (it would have stalled). Sets the latch;
///   - [`handle_flush_completed`](Self::handle_flush_completed): a memtable flush succeeded.
///     Clears the latch.
/// - **Queries** (`&self`): [`decide`](Self::decide) for each write, after feeding that
///   request's readings; [`pressure`](Self::pressure) for the gauge; `is_latched`,
///   `l0_files`, `pending_bytes`.
///
/// A typical write handler: `handle_l0(l0)`, `handle_pending_bytes(b)` (with a flush budget),
/// then `decide()`: on `Reject` answer the retriable error, on `Accept` write with
/// `no_slowdown` and call `handle_write_rejected()` if RocksDB refuses it. The storage's flush
/// listener calls `handle_flush_completed()`.
///
/// # Rules, in the order `decide` applies them
///
/// 1. `L0 ≥ Tr` → `Reject(SlowdownTrigger)`;
/// 2. with a flush budget, `L0 + ⌈pending / write_buffer_size⌉ + max_write_buffers ≥ Tr` →
///    `Reject(FlushBudget)` (saturating: any reading is safe);
/// 3. latched → `Reject(Latched)`;
/// 4. otherwise `Accept` with `0` below `Tf` and `(L0 − Tf)/(Tr − Tf)` in ppm from `Tf` on,
///    rounded to the nearest ppm (ties upward) and kept below 10⁶.
///
/// Rounding to nearest makes the direct path (`decide().signal()`) agree with upstream's wire
/// path (the same ratio as an `f32`, decoded by [`Signal::from_f32`]) for both presets; for
/// spans of hundreds of files the `f32` itself is rounded and may differ by 1 ppm.
///
/// ```
/// use throttle_sansio::backpressure::{Decision, PressureConfig, RejectReason, ServerPressure};
///
/// // The landed default: Tf = 8, Tr = 20.
/// let mut server = ServerPressure::new(PressureConfig::default());
/// server.handle_l0(7);
/// assert_eq!(server.decide(), Decision::Accept { pressure_ppm: 0 });
/// server.handle_l0(11); // (11 − 8) / 12 = 0.25
/// assert_eq!(server.decide(), Decision::Accept { pressure_ppm: 250_000 });
/// // RocksDB refused a `no_slowdown` write: rejected until a flush completes.
/// server.handle_write_rejected();
/// assert_eq!(server.decide(), Decision::Reject { reason: RejectReason::Latched });
/// assert_eq!(server.pressure().ppm(), 800_000);
/// server.handle_flush_completed();
/// assert!(!server.decide().is_reject());
/// server.handle_l0(20); // Tr: rejected without entering RocksDB's own stall
/// assert_eq!(server.decide(), Decision::Reject { reason: RejectReason::SlowdownTrigger });
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerPressure {
    cfg: PressureConfig,
    l0_files: u64,
    pending_bytes: u64,
    latched: bool,
}

impl ServerPressure {
    /// A server with no L0 files, nothing pending and the latch clear.
    pub const fn new(cfg: PressureConfig) -> Self {
        ServerPressure {
            cfg,
            l0_files: 0,
            pending_bytes: 0,
            latched: false,
        }
    }

    /// Its configuration.
    pub const fn config(&self) -> &PressureConfig {
        &self.cfg
    }

    /// Input: the current L0 file count.
    pub fn handle_l0(&mut self, l0_files: u64) {
        self.l0_files = l0_files;
    }

    /// Input: bytes written to memtables and not yet flushed.
    pub fn handle_pending_bytes(&mut self, bytes: u64) {
        self.pending_bytes = bytes;
    }

    /// Input: RocksDB refused a `no_slowdown` write. Until the next completed flush, writes
    /// are rejected and the pressure is at least 0.8.
    pub fn handle_write_rejected(&mut self) {
        self.latched = true;
    }

    /// Input: a memtable flush completed successfully; clears the latch.
    pub fn handle_flush_completed(&mut self) {
        self.latched = false;
    }

    /// The latest L0 file count.
    pub const fn l0_files(&self) -> u64 {
        self.l0_files
    }

    /// The latest pending (unflushed) byte count.
    pub const fn pending_bytes(&self) -> u64 {
        self.pending_bytes
    }

    /// Whether the rejection latch is set.
    pub const fn is_latched(&self) -> bool {
        self.latched
    }

    /// What to do with a write now.
    pub fn decide(&self) -> Decision {
        let slowdown = u64::from(self.cfg.slowdown_trigger);
        if self.l0_files >= slowdown {
            return Decision::Reject {
                reason: RejectReason::SlowdownTrigger,
            };
        }
        if let Some(budget) = self.cfg.flush_budget {
            let files_after_flush = self
                .l0_files
                .saturating_add(ceil_div(self.pending_bytes, budget.write_buffer_size))
                .saturating_add(u64::from(budget.max_write_buffers));
            if files_after_flush >= slowdown {
                return Decision::Reject {
                    reason: RejectReason::FlushBudget,
                };
            }
        }
        if self.latched {
            return Decision::Reject {
                reason: RejectReason::Latched,
            };
        }
        Decision::Accept {
            pressure_ppm: self.l0_pressure_ppm(),
        }
    }

    /// The pressure gauge: the L0 ramp (`Full` from `Tr` on), raised to at least 0.8 while
    /// latched. The flush budget refuses writes but does not raise the gauge.
    pub fn pressure(&self) -> Signal {
        let ppm = self.l0_pressure_ppm();
        if self.latched {
            Signal::from_ppm(ppm.max(LATCH_FLOOR_PPM))
        } else {
            Signal::from_ppm(ppm)
        }
    }

    /// `(L0 − Tf)/(Tr − Tf)` in ppm: 0 below `Tf`, 10⁶ from `Tr` on, otherwise rounded to
    /// nearest (ties up) and at most 999 999.
    fn l0_pressure_ppm(&self) -> u32 {
        let trigger = u64::from(self.cfg.l0_trigger);
        let slowdown = u64::from(self.cfg.slowdown_trigger);
        if self.l0_files < trigger {
            return 0;
        }
        if self.l0_files >= slowdown {
            return PPM_ONE;
        }
        // Both below 2^31 (validated triggers), so 2·above·10⁶ + span < 2^53.
        let above = self.l0_files - trigger;
        let span = slowdown - trigger;
        let doubled = above
            .saturating_mul(2 * u64::from(PPM_ONE))
            .saturating_add(span);
        let ppm = doubled / span.saturating_mul(2).max(1);
        // With a span over 2·10⁶ files, L0 = Tr − 1 would round up to a whole; an accepted
        // write never reports full pressure.
        u32::try_from(ppm).map_or(PPM_ONE - 1, |p| p.min(PPM_ONE - 1))
    }
}

/// `⌈n / d⌉`, saturating; `u64::MAX` for `d = 0` (validation never lets that through).
fn ceil_div(n: u64, d: u64) -> u64 {
    match (n.checked_div(d), n.checked_rem(d)) {
        (Some(q), Some(r)) => q.saturating_add(u64::from(r != 0)),
        _ => u64::MAX,
    }
}

// ---------------------------------------------------------------------------------------------
// Client half
// ---------------------------------------------------------------------------------------------

/// The client's throttle curve: how long to hold a bucket back for a server [`Signal`].
///
/// `delay = ⌊max_throttle_ms · ppm^k / 10^(6k)⌋` ms, computed exactly in `u128`
/// (`u32::MAX · (10⁶)⁴ < 2^112`). `Clear` and 0 ppm give zero; `Full` and 10⁶ ppm or more give
/// `max_throttle`, so a rejection continues the ramp. The delay is monotone in the pressure and
/// never above `max_throttle`.
///
/// `Default` is the Fluss client as landed by PR #3463: `k = 2`, `max_throttle = 3000 ms`
/// (`client.writer.kv-backpressure.max-throttle · p²`), the same as
/// [`ThrottleCurve::fluss_landed`]; its server half is [`PressureConfig::default`]. The cubic
/// 5000 ms ramp proposed in Fluss issue #3454 is the preset [`ThrottleCurve::fluss_issue_3454`].
///
/// ```
/// use core::time::Duration;
/// use throttle_sansio::backpressure::{Signal, ThrottleCurve};
///
/// // Upstream's own example: 1000 ms ceiling, p = 0.9, quadratic → 810 ms.
/// let curve = ThrottleCurve::builder()
///     .exponent(2)
///     .max_throttle(Duration::from_millis(1000))
///     .build()?;
/// assert_eq!(curve.delay(Signal::from_f32(0.9)), Duration::from_millis(810));
/// assert_eq!(curve.delay(Signal::Full), Duration::from_millis(1000));
/// # Ok::<(), throttle_sansio::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThrottleCurve {
    exponent: u32,
    max_throttle_ms: u32,
}

impl Default for ThrottleCurve {
    /// Fluss as landed (PR #3463): [`ThrottleCurve::fluss_landed`].
    fn default() -> Self {
        Self::fluss_landed()
    }
}

impl ThrottleCurve {
    /// The smallest exponent `k` accepted.
    pub const MIN_EXPONENT: u32 = 1;
    /// The largest exponent `k` accepted (keeps the exact product within `u128`).
    pub const MAX_EXPONENT: u32 = 4;

    /// The curve Fluss landed (PR #3463): quadratic (`k = 2`), 3000 ms ceiling; the default.
    /// Pair it with [`PressureConfig::fluss_landed`] on the server.
    pub const fn fluss_landed() -> Self {
        ThrottleCurve {
            exponent: 2,
            max_throttle_ms: 3_000,
        }
    }

    /// The curve proposed in Fluss issue #3454: cubic (`k = 3`), 5000 ms ceiling. Pair it with
    /// [`PressureConfig::fluss_issue_3454`] on the server.
    pub const fn fluss_issue_3454() -> Self {
        ThrottleCurve {
            exponent: 3,
            max_throttle_ms: 5_000,
        }
    }

    /// A builder starting from the default curve.
    pub fn builder() -> ThrottleCurveBuilder {
        ThrottleCurveBuilder {
            curve: ThrottleCurve::default(),
            max_throttle: None,
        }
    }

    /// A builder starting from this curve.
    pub fn to_builder(&self) -> ThrottleCurveBuilder {
        ThrottleCurveBuilder {
            curve: *self,
            max_throttle: None,
        }
    }

    /// The exponent `k`.
    pub const fn exponent(&self) -> u32 {
        self.exponent
    }

    /// The ceiling: the delay for [`Signal::Full`].
    pub const fn max_throttle(&self) -> Duration {
        Duration::from_millis(self.max_throttle_ms as u64)
    }

    /// How long to throttle a bucket that reported `signal`.
    pub fn delay(&self, signal: Signal) -> Duration {
        Duration::from_millis(self.delay_ms(signal.ppm()))
    }

    /// The delay in whole milliseconds for `ppm` (already clamped to `0..=10⁶`).
    fn delay_ms(&self, ppm: u32) -> u64 {
        let max = u64::from(self.max_throttle_ms);
        if ppm == 0 {
            return 0;
        }
        if ppm >= PPM_ONE {
            return max;
        }
        // Validation keeps k ≤ 4, so neither power nor product can overflow; the fallbacks
        // only make that visible without a panic path.
        let Some(numerator) = u128::from(ppm)
            .checked_pow(self.exponent)
            .and_then(|p| p.checked_mul(u128::from(max)))
        else {
            return max;
        };
        let Some(denominator) = u128::from(PPM_ONE).checked_pow(self.exponent) else {
            return max;
        };
        u64::try_from(numerator / denominator).map_or(max, |d| d.min(max))
    }
}

/// Builds a validated [`ThrottleCurve`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ThrottleCurveBuilder {
    curve: ThrottleCurve,
    // Kept as given so `build` can refuse it with its real value.
    max_throttle: Option<Duration>,
}

impl ThrottleCurveBuilder {
    /// The exponent `k` of the curve, in `1..=4`.
    pub fn exponent(mut self, k: u32) -> Self {
        self.curve.exponent = k;
        self
    }

    /// The ceiling, a whole number of milliseconds up to `u32::MAX` ms (0 turns throttling
    /// off).
    pub fn max_throttle(mut self, max: Duration) -> Self {
        self.max_throttle = Some(max);
        self
    }

    /// The curve, or the first option out of range.
    pub fn build(self) -> Result<ThrottleCurve, ConfigError> {
        let mut curve = self.curve;
        if !(ThrottleCurve::MIN_EXPONENT..=ThrottleCurve::MAX_EXPONENT).contains(&curve.exponent) {
            return Err(ConfigError::OutOfRange {
                option: &curve_opt::EXPONENT,
                got: u64::from(curve.exponent),
                min: u64::from(ThrottleCurve::MIN_EXPONENT),
                max: u64::from(ThrottleCurve::MAX_EXPONENT),
                unit: "",
            });
        }
        if let Some(max) = self.max_throttle {
            let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
            let Ok(ms32) = u32::try_from(ms) else {
                return Err(ConfigError::OutOfRange {
                    option: &curve_opt::MAX_THROTTLE,
                    got: ms,
                    min: 0,
                    max: u64::from(u32::MAX),
                    unit: "ms",
                });
            };
            // The curve works in whole milliseconds, as upstream does; refuse rather than
            // silently truncate a finer ceiling.
            if max.subsec_nanos() % 1_000_000 != 0 {
                return Err(ConfigError::Invalid {
                    option: &curve_opt::MAX_THROTTLE,
                    reason: "must be a whole number of milliseconds",
                });
            }
            curve.max_throttle_ms = ms32;
        }
        Ok(curve)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn curve(k: u32, max_ms: u64) -> ThrottleCurve {
        match ThrottleCurve::builder()
            .exponent(k)
            .max_throttle(ms(max_ms))
            .build()
        {
            Ok(c) => c,
            Err(e) => panic!("test curve refused: {e}"),
        }
    }

    fn config(tf: u32, tr: u32) -> PressureConfig {
        match PressureConfig::builder()
            .l0_trigger(tf)
            .l0_slowdown_writes_trigger(tr)
            .build()
        {
            Ok(c) => c,
            Err(e) => panic!("test config refused: {e}"),
        }
    }

    fn budget(tr: u32, write_buffer_size: u64, max_write_buffers: u32) -> PressureConfig {
        match PressureConfig::fluss_issue_3454()
            .to_builder()
            .l0_slowdown_writes_trigger(tr)
            .flush_budget(write_buffer_size, max_write_buffers)
            .build()
        {
            Ok(c) => c,
            Err(e) => panic!("test budget refused: {e}"),
        }
    }

    fn decide_at(cfg: PressureConfig, l0: u64) -> Decision {
        let mut server = ServerPressure::new(cfg);
        server.handle_l0(l0);
        server.decide()
    }

    const ACCEPT_CLEAR: Decision = Decision::Accept { pressure_ppm: 0 };
    const REJECT_TR: Decision = Decision::Reject {
        reason: RejectReason::SlowdownTrigger,
    };

    fn accept(pressure_ppm: u32) -> Decision {
        Decision::Accept { pressure_ppm }
    }

    // ---- wire signal --------------------------------------------------------------------

    #[test]
    fn from_f32_maps_nan_and_non_positive_to_clear() {
        for x in [
            f32::NAN,
            -f32::NAN,
            f32::NEG_INFINITY,
            f32::MIN,
            -1.0,
            -f32::MIN_POSITIVE,
            -f32::from_bits(1), // the negative subnormal closest to zero
            -0.0,
            0.0,
        ] {
            assert_eq!(Signal::from_f32(x), Signal::Clear, "{x:e}");
        }
    }

    #[test]
    fn from_f32_maps_one_and_above_to_full() {
        for x in [1.0, 1.000_000_1, 2.0, 1e30, f32::MAX, f32::INFINITY] {
            assert_eq!(Signal::from_f32(x), Signal::Full, "{x:e}");
        }
    }

    #[test]
    fn from_f32_rounds_to_the_nearest_ppm_ties_upward() {
        assert_eq!(Signal::from_f32(0.9), Signal::Pressure(900_000)); // 899 999.976 ppm
        assert_eq!(Signal::from_f32(0.5), Signal::Pressure(500_000));
        assert_eq!(Signal::from_f32(0.25), Signal::Pressure(250_000));
        assert_eq!(Signal::from_f32(0.999_999), Signal::Pressure(999_999)); // 999 998.987
        assert_eq!(Signal::from_f32(6e-7), Signal::Pressure(1)); // 0.600 ppm
        // 2^-7 is exactly 7812.5 ppm: the tie goes up.
        assert_eq!(Signal::from_f32(0.007_812_5), Signal::Pressure(7_813));
    }

    #[test]
    fn from_f32_maps_what_rounds_to_zero_ppm_to_clear() {
        for x in [
            1e-7,                      // 0.1 ppm
            5e-7,                      // the f32 nearest 5e-7 is 0.49999999874 ppm
            f32::from_bits(1),         // smallest subnormal
            f32::from_bits(0x7f_ffff), // largest subnormal
            f32::MIN_POSITIVE,
            f32::from_bits(0x3506_37bd), // the last f32 below half a ppm
        ] {
            assert_eq!(Signal::from_f32(x), Signal::Clear, "{x:e}");
        }
        // The next f32 is just over half a ppm.
        assert_eq!(
            Signal::from_f32(f32::from_bits(0x3506_37be)),
            Signal::Pressure(1)
        );
    }

    #[test]
    fn from_f32_maps_what_rounds_to_a_whole_to_full() {
        // 0.9999999 is 999 999.88 ppm; the largest f32 below 1 is 999 999.94 ppm.
        assert_eq!(Signal::from_f32(0.999_999_9), Signal::Full);
        assert_eq!(Signal::from_f32(f32::from_bits(0x3f7f_ffff)), Signal::Full);
        // 999 999.52 ppm rounds up to a whole; 999 999.46 ppm stays just below.
        assert_eq!(Signal::from_f32(f32::from_bits(0x3f7f_fff8)), Signal::Full);
        assert_eq!(
            Signal::from_f32(f32::from_bits(0x3f7f_fff7)),
            Signal::Pressure(999_999)
        );
    }

    /// The reference rounding: `x · 10⁶` is exact in `f64` (24 + 20 bits), and so is adding a
    /// half for every value that can round to a non-zero ppm.
    fn reference_ppm(x: f32) -> u64 {
        (f64::from(x) * 1e6 + 0.5) as u64
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn from_f32_is_exact_and_monotone_over_every_float_between_zero_and_one() {
        let mut previous = 0;
        // Every 997th bit pattern of (0, 1), in order, plus every pattern near both ends.
        const ONE: u32 = 0x3f80_0000;
        let bits = (1..5_000)
            .chain((5_000..ONE - 5_000).step_by(997))
            .chain(ONE - 5_000..ONE);
        for b in bits {
            let x = f32::from_bits(b);
            let got = Signal::from_f32(x);
            let want = Signal::from_ppm(u32::try_from(reference_ppm(x)).unwrap_or(u32::MAX));
            assert_eq!(got, want, "bits {b:#x} ({x:e})");
            assert!(got.ppm() >= previous, "not monotone at {b:#x}");
            previous = got.ppm();
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn to_f32_round_trips_every_ppm() {
        for ppm in 0..=PPM_ONE {
            let signal = Signal::from_ppm(ppm);
            assert_eq!(Signal::from_f32(signal.to_f32()), signal, "ppm {ppm}");
        }
        assert_eq!(Signal::Clear.to_f32(), 0.0);
        assert_eq!(Signal::Full.to_f32(), 1.0);
    }

    #[test]
    fn from_ppm_and_ppm_normalise_the_edges() {
        assert_eq!(Signal::from_ppm(0), Signal::Clear);
        assert_eq!(Signal::from_ppm(1), Signal::Pressure(1));
        assert_eq!(Signal::from_ppm(999_999), Signal::Pressure(999_999));
        assert_eq!(Signal::from_ppm(1_000_000), Signal::Full);
        assert_eq!(Signal::from_ppm(u32::MAX), Signal::Full);
        assert_eq!(Signal::Clear.ppm(), 0);
        assert_eq!(Signal::Full.ppm(), 1_000_000);
        assert_eq!(Signal::Pressure(0).ppm(), 0);
        assert_eq!(Signal::Pressure(u32::MAX).ppm(), 1_000_000);
    }

    // ---- client curve -------------------------------------------------------------------

    #[test]
    fn exact_product_fits_u128() {
        // The largest numerator the curve forms: u32::MAX ms · (10⁶)⁴.
        let biggest = u128::from(u32::MAX).checked_mul(10u128.pow(24));
        assert!(biggest.is_some_and(|b| b < u128::MAX / 2));
    }

    #[test]
    fn upstream_example_quadratic_1000ms_at_p_0_9_is_810ms() {
        let c = curve(2, 1_000);
        assert_eq!(c.delay(Signal::from_f32(0.9)), ms(810));
        assert_eq!(c.delay(Signal::Pressure(500_000)), ms(250));
    }

    #[test]
    fn presets_match_the_proposal_and_the_landed_curve() {
        let proposal = ThrottleCurve::fluss_issue_3454();
        assert_eq!(
            (proposal.exponent(), proposal.max_throttle()),
            (3, ms(5_000))
        );
        assert_eq!(proposal.delay(Signal::Pressure(500_000)), ms(625)); // 5000 · 0.5³
        // The default is the landed curve, not the proposal.
        assert_eq!(ThrottleCurve::default(), ThrottleCurve::fluss_landed());
        let landed = ThrottleCurve::fluss_landed();
        assert_eq!((landed.exponent(), landed.max_throttle()), (2, ms(3_000)));
        assert_eq!(landed.delay(Signal::Pressure(500_000)), ms(750)); // 3000 · 0.5²
        assert_eq!(landed.delay(Signal::Pressure(900_000)), ms(2_430));
    }

    #[test]
    fn clear_and_zero_ppm_give_no_delay_full_and_whole_give_the_ceiling() {
        for k in 1..=4 {
            let c = curve(k, 5_000);
            assert_eq!(c.delay(Signal::Clear), Duration::ZERO);
            assert_eq!(c.delay(Signal::Pressure(0)), Duration::ZERO);
            assert_eq!(c.delay(Signal::Pressure(1)), Duration::ZERO);
            assert_eq!(c.delay(Signal::Full), ms(5_000));
            assert_eq!(c.delay(Signal::Pressure(1_000_000)), ms(5_000));
            assert_eq!(c.delay(Signal::Pressure(u32::MAX)), ms(5_000));
        }
    }

    #[test]
    fn delay_floors_to_whole_milliseconds_at_the_extremes() {
        // Values from exact rational arithmetic: ⌊max · ppm^k / 10^(6k)⌋.
        let huge = curve(4, u64::from(u32::MAX));
        assert_eq!(huge.delay(Signal::Pressure(999_999)), ms(4_294_950_115));
        assert_eq!(huge.delay(Signal::Full), ms(u64::from(u32::MAX)));
        assert_eq!(
            curve(1, u64::from(u32::MAX)).delay(Signal::Pressure(1)),
            ms(4_294)
        );
        assert_eq!(
            ThrottleCurve::fluss_issue_3454().delay(Signal::Pressure(999_999)),
            ms(4_999)
        );
        assert_eq!(curve(1, 5_000).delay(Signal::Pressure(999_999)), ms(4_999));
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn curve_is_monotone_zero_at_clear_and_never_above_the_ceiling() {
        for k in 1..=4 {
            for max in [0, 1, 3_000, 5_000, u64::from(u32::MAX)] {
                let c = curve(k, max);
                let mut previous = Duration::ZERO;
                for ppm in (0..999_990).step_by(7).chain(999_990..=1_000_001) {
                    let d = c.delay(Signal::Pressure(ppm));
                    assert!(d >= previous, "k {k} max {max} ppm {ppm}");
                    assert!(d <= ms(max), "k {k} max {max} ppm {ppm}");
                    previous = d;
                }
                assert_eq!(previous, ms(max));
            }
        }
    }

    #[test]
    fn curve_validation_bounds_on_both_sides() {
        let exponent = |got| ConfigError::OutOfRange {
            option: &curve_opt::EXPONENT,
            got,
            min: 1,
            max: 4,
            unit: "",
        };
        assert_eq!(
            ThrottleCurve::builder().exponent(0).build(),
            Err(exponent(0))
        );
        assert_eq!(
            ThrottleCurve::builder().exponent(5).build(),
            Err(exponent(5))
        );
        assert_eq!(
            ThrottleCurve::builder().exponent(u32::MAX).build(),
            Err(exponent(u64::from(u32::MAX)))
        );
        assert_eq!(curve(1, 5_000).exponent(), 1);
        assert_eq!(curve(4, 5_000).exponent(), 4);

        let max = |got| ConfigError::OutOfRange {
            option: &curve_opt::MAX_THROTTLE,
            got,
            min: 0,
            max: u64::from(u32::MAX),
            unit: "ms",
        };
        // 0 ms is accepted: throttling off, a rejection throttles for nothing.
        assert_eq!(curve(3, 0).delay(Signal::Full), Duration::ZERO);
        assert_eq!(
            curve(3, u64::from(u32::MAX)).max_throttle(),
            ms(u64::from(u32::MAX))
        );
        let over = ms(u64::from(u32::MAX) + 1);
        assert_eq!(
            ThrottleCurve::builder().max_throttle(over).build(),
            Err(max(u64::from(u32::MAX) + 1))
        );
        assert_eq!(
            ThrottleCurve::builder().max_throttle(Duration::MAX).build(),
            Err(max(u64::MAX))
        );
        let fractional = ConfigError::Invalid {
            option: &curve_opt::MAX_THROTTLE,
            reason: "must be a whole number of milliseconds",
        };
        for d in [Duration::from_nanos(999_999), Duration::from_micros(1_500)] {
            assert_eq!(
                ThrottleCurve::builder().max_throttle(d).build(),
                Err(fractional)
            );
        }
    }

    #[test]
    fn to_builder_keeps_the_curve_and_changes_one_option() {
        let landed = ThrottleCurve::fluss_landed();
        assert_eq!(landed.to_builder().build(), Ok(landed));
        let changed = landed.to_builder().max_throttle(ms(1_000)).build();
        assert_eq!(changed, Ok(curve(2, 1_000)));
    }

    // ---- server half --------------------------------------------------------------------

    #[test]
    fn issue_3454_preset_ramp_at_every_l0_through_tr_plus_2() {
        // Tf = 12, Tr = 20: p = (L0 − 12)/8; client 5000 ms · p³ (Fluss issue #3454's cubic ramp).
        let table: [(u64, Decision, u64); 23] = [
            (0, ACCEPT_CLEAR, 0),
            (1, ACCEPT_CLEAR, 0),
            (2, ACCEPT_CLEAR, 0),
            (3, ACCEPT_CLEAR, 0),
            (4, ACCEPT_CLEAR, 0),
            (5, ACCEPT_CLEAR, 0),
            (6, ACCEPT_CLEAR, 0),
            (7, ACCEPT_CLEAR, 0),
            (8, ACCEPT_CLEAR, 0),
            (9, ACCEPT_CLEAR, 0),
            (10, ACCEPT_CLEAR, 0),
            (11, ACCEPT_CLEAR, 0),
            (12, ACCEPT_CLEAR, 0), // at Tf the ramp starts from zero
            (13, accept(125_000), 9),
            (14, accept(250_000), 78),
            (15, accept(375_000), 263),
            (16, accept(500_000), 625),
            (17, accept(625_000), 1_220),
            (18, accept(750_000), 2_109),
            (19, accept(875_000), 3_349), // (Tr − Tf − 1)/(Tr − Tf) = 7/8
            (20, REJECT_TR, 5_000),
            (21, REJECT_TR, 5_000),
            (22, REJECT_TR, 5_000),
        ];
        let client = ThrottleCurve::fluss_issue_3454();
        for (l0, decision, delay_ms) in table {
            let got = decide_at(PressureConfig::fluss_issue_3454(), l0);
            assert_eq!(got, decision, "L0 {l0}");
            assert_eq!(client.delay(got.signal()), ms(delay_ms), "L0 {l0}");
        }
    }

    #[test]
    fn landed_preset_ramp_at_every_l0_through_tr_plus_2() {
        // Tf = 8, Tr = 20: p = (L0 − 8)/12 to the nearest ppm; client k = 2 at 3000 ms (the
        // landed curve) and at 1000 ms (upstream's example ceiling).
        let table: [(u64, Decision, u64, u64); 23] = [
            (0, ACCEPT_CLEAR, 0, 0),
            (1, ACCEPT_CLEAR, 0, 0),
            (2, ACCEPT_CLEAR, 0, 0),
            (3, ACCEPT_CLEAR, 0, 0),
            (4, ACCEPT_CLEAR, 0, 0),
            (5, ACCEPT_CLEAR, 0, 0),
            (6, ACCEPT_CLEAR, 0, 0),
            (7, ACCEPT_CLEAR, 0, 0),
            (8, ACCEPT_CLEAR, 0, 0),
            (9, accept(83_333), 20, 6),
            (10, accept(166_667), 83, 27),
            (11, accept(250_000), 187, 62),
            (12, accept(333_333), 333, 111),
            (13, accept(416_667), 520, 173),
            (14, accept(500_000), 750, 250), // p 0.5 → 250 ms at 1000 ms
            (15, accept(583_333), 1_020, 340),
            (16, accept(666_667), 1_333, 444),
            (17, accept(750_000), 1_687, 562),
            (18, accept(833_333), 2_083, 694),
            (19, accept(916_667), 2_520, 840),
            (20, REJECT_TR, 3_000, 1_000),
            (21, REJECT_TR, 3_000, 1_000),
            (22, REJECT_TR, 3_000, 1_000),
        ];
        let landed = ThrottleCurve::fluss_landed();
        let at_1000 = curve(2, 1_000);
        for (l0, decision, landed_ms, ms_1000) in table {
            let got = decide_at(PressureConfig::fluss_landed(), l0);
            assert_eq!(got, decision, "L0 {l0}");
            assert_eq!(landed.delay(got.signal()), ms(landed_ms), "L0 {l0}");
            assert_eq!(at_1000.delay(got.signal()), ms(ms_1000), "L0 {l0}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore)]
    fn ramp_agrees_with_upstreams_float_wire_path() {
        // Upstream sends (L0 − Tf)/(Tr − Tf) as an f32; decoding it gives our ppm for the
        // presets and small spans, and is at most 1 ppm off for any span (the f32 ratio is
        // itself rounded: 277/997 is 277 833.5005 ppm, its f32 277 833.4998).
        for (tf, tr) in [(12, 20), (8, 20), (1, 2), (1, 3), (7, 10), (1, 50)] {
            for l0 in tf..tr {
                let wire = (l0 - tf) as f32 / (tr - tf) as f32;
                let direct = decide_at(config(tf, tr), u64::from(l0)).signal();
                assert_eq!(Signal::from_f32(wire), direct, "Tf {tf} Tr {tr} L0 {l0}");
            }
        }
        for (tf, tr) in [(3, 1_000), (1, 100_000)] {
            for l0 in tf..tr {
                let wire = Signal::from_f32((l0 - tf) as f32 / (tr - tf) as f32).ppm();
                let direct = decide_at(config(tf, tr), u64::from(l0)).signal().ppm();
                assert!(wire.abs_diff(direct) <= 1, "Tf {tf} Tr {tr} L0 {l0}");
            }
        }
        assert_eq!(decide_at(config(3, 1_000), 280), accept(277_834));
    }

    #[test]
    fn accepted_pressure_stays_below_a_whole_for_the_widest_span() {
        let widest = config(1, MAX_TRIGGER);
        let last = u64::from(MAX_TRIGGER) - 1;
        // (Tr − Tf − 1)/(Tr − Tf) is 0.9999999995 here, which would round to a whole.
        assert_eq!(decide_at(widest, last), accept(999_999));
        // One file over Tf is 0.0005 ppm: accepted without pressure.
        assert_eq!(decide_at(widest, 2), ACCEPT_CLEAR);
        assert_eq!(decide_at(widest, u64::from(MAX_TRIGGER)), REJECT_TR);
    }

    #[test]
    fn huge_l0_counts_are_rejected_without_overflow() {
        for l0 in [u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
            assert_eq!(decide_at(PressureConfig::fluss_issue_3454(), l0), REJECT_TR);
            let mut server = ServerPressure::new(budget(20, 1, 2));
            server.handle_l0(l0);
            server.handle_pending_bytes(u64::MAX);
            assert_eq!(server.decide(), REJECT_TR);
            assert_eq!(server.pressure(), Signal::Full);
        }
    }

    #[test]
    fn server_validation_bounds_on_both_sides() {
        let out = |option, got| ConfigError::OutOfRange {
            option,
            got,
            min: 1,
            max: u64::from(MAX_TRIGGER),
            unit: "files",
        };
        let build = |tf: u32, tr: u32| {
            PressureConfig::builder()
                .l0_trigger(tf)
                .l0_slowdown_writes_trigger(tr)
                .build()
        };
        let not_below = ConfigError::Invalid {
            option: &opt::L0_TRIGGER,
            reason: "must be below `l0_slowdown_writes_trigger`",
        };
        let tf = &opt::L0_TRIGGER;
        let tr = &opt::SLOWDOWN_TRIGGER;
        assert_eq!(build(0, 20), Err(out(tf, 0)));
        assert_eq!(build(1, 20).map(|c| c.l0_trigger()), Ok(1));
        assert_eq!(build(19, 20).map(|c| c.l0_trigger()), Ok(19));
        assert_eq!(build(MAX_TRIGGER + 1, 20), Err(out(tf, 1 << 31)));
        assert_eq!(build(1, 0), Err(out(tr, 0)));
        assert_eq!(
            build(1, MAX_TRIGGER).map(|c| c.l0_slowdown_writes_trigger()),
            Ok(MAX_TRIGGER)
        );
        assert_eq!(build(1, MAX_TRIGGER + 1), Err(out(tr, 1 << 31)));
        assert_eq!(build(20, 20), Err(not_below)); // upstream: a warning and pressure 0
        assert_eq!(build(21, 20), Err(not_below));
        assert_eq!(build(1, 1), Err(not_below));
        assert_eq!(build(MAX_TRIGGER, MAX_TRIGGER), Err(not_below));
    }

    #[test]
    fn flush_budget_validation_bounds_on_both_sides() {
        let with = |size: u64, count: u32| {
            PressureConfig::builder()
                .flush_budget(size, count)
                .build()
                .map(|c| c.flush_budget())
        };
        assert_eq!(
            with(0, 2),
            Err(ConfigError::OutOfRange {
                option: &opt::WRITE_BUFFER_SIZE,
                got: 0,
                min: 1,
                max: u64::MAX,
                unit: "bytes",
            })
        );
        let ok = |size, count| {
            Ok(Some(FlushBudget {
                write_buffer_size: size,
                max_write_buffers: count,
            }))
        };
        assert_eq!(with(1, 2), ok(1, 2));
        assert_eq!(with(u64::MAX, 2), ok(u64::MAX, 2));
        let count = |got| ConfigError::OutOfRange {
            option: &opt::MAX_WRITE_BUFFERS,
            got,
            min: 1,
            max: u64::from(MAX_TRIGGER),
            unit: "files",
        };
        assert_eq!(with(64 << 20, 0), Err(count(0)));
        assert_eq!(with(64 << 20, 1), ok(64 << 20, 1));
        assert_eq!(with(64 << 20, 19), ok(64 << 20, 19)); // Tr − 1
        let not_below = Err(ConfigError::Invalid {
            option: &opt::MAX_WRITE_BUFFERS,
            reason: "must be below `l0_slowdown_writes_trigger`",
        });
        assert_eq!(with(64 << 20, 20), not_below); // Tr: every write would be refused
        assert_eq!(with(64 << 20, MAX_TRIGGER + 1), Err(count(1 << 31)));
        // The builder can drop it again; the default and landed presets have none.
        let dropped = PressureConfig::builder()
            .flush_budget(0, 0)
            .without_flush_budget()
            .build();
        assert_eq!(dropped, Ok(PressureConfig::default()));
        assert_eq!(PressureConfig::fluss_landed().flush_budget(), None);
        let landed = PressureConfig::fluss_landed().to_builder().build();
        assert_eq!(landed, Ok(PressureConfig::fluss_landed()));
    }

    #[test]
    fn flush_budget_rejects_exactly_when_l0_plus_pending_files_plus_headroom_reach_tr() {
        const MIB64: u64 = 64 << 20;
        let cfg = budget(20, MIB64, 2);
        // (L0, pending bytes, decision): reject iff L0 + ⌈pending / 64 MiB⌉ + 2 ≥ 20.
        let flush_budget = Decision::Reject {
            reason: RejectReason::FlushBudget,
        };
        let cases = [
            (17, 0, accept(625_000)),          // 17 + 0 + 2 = 19
            (17, 1, flush_budget),             // 17 + 1 + 2 = 20
            (16, MIB64, accept(500_000)),      // 16 + 1 + 2 = 19
            (16, MIB64 + 1, flush_budget),     // 16 + 2 + 2 = 20
            (18, 0, flush_budget),             // the headroom alone: 18 + 0 + 2
            (0, 17 * MIB64, ACCEPT_CLEAR),     // 0 + 17 + 2 = 19
            (0, 17 * MIB64 + 1, flush_budget), // before Tf, nothing soft came first
            (0, u64::MAX, flush_budget),
            (19, u64::MAX, flush_budget),
            (20, 0, REJECT_TR), // the slowdown trigger is named first
        ];
        for (l0, pending, decision) in cases {
            let mut server = ServerPressure::new(cfg);
            server.handle_l0(l0);
            server.handle_pending_bytes(pending);
            assert_eq!(server.decide(), decision, "L0 {l0} pending {pending}");
            assert_eq!(server.pending_bytes(), pending);
        }
        // The largest memtable size counts any pending amount as one file.
        let mut server = ServerPressure::new(budget(20, u64::MAX, 2));
        server.handle_l0(17);
        server.handle_pending_bytes(u64::MAX);
        assert_eq!(server.decide(), flush_budget);
        server.handle_l0(16);
        assert_eq!(server.decide(), accept(500_000));
    }

    #[test]
    fn flush_budget_is_off_by_default_and_never_raises_the_gauge() {
        let mut server = ServerPressure::new(PressureConfig::fluss_issue_3454());
        server.handle_l0(19);
        server.handle_pending_bytes(u64::MAX);
        assert_eq!(server.decide(), accept(875_000));

        let mut server = ServerPressure::new(budget(20, 1, 2));
        server.handle_l0(13);
        server.handle_pending_bytes(u64::MAX);
        assert!(server.decide().is_reject());
        assert_eq!(server.decide().signal(), Signal::Full);
        assert_eq!(server.pressure(), Signal::Pressure(125_000));
    }

    #[test]
    fn rejection_latch_rejects_with_at_least_0_8_until_a_flush_completes() {
        let latched = Decision::Reject {
            reason: RejectReason::Latched,
        };
        let mut server = ServerPressure::new(PressureConfig::fluss_issue_3454());
        server.handle_l0(3);
        assert_eq!(server.decide(), ACCEPT_CLEAR);
        assert_eq!(server.pressure(), Signal::Clear);

        server.handle_write_rejected();
        assert!(server.is_latched());
        assert_eq!(server.decide(), latched);
        assert_eq!(server.pressure(), Signal::Pressure(800_000));
        // L0 falling (compaction) does not clear it: only a flush does.
        server.handle_l0(0);
        assert_eq!(server.decide(), latched);
        // A ramp above 0.8 shows through; at Tr the gauge is full and Tr is named.
        server.handle_l0(19);
        assert_eq!(server.pressure(), Signal::Pressure(875_000));
        server.handle_l0(20);
        assert_eq!(server.pressure(), Signal::Full);
        assert_eq!(server.decide(), REJECT_TR);
        // Repeated rejections keep one latch; one flush clears it.
        server.handle_l0(14);
        server.handle_write_rejected();
        server.handle_write_rejected();
        assert_eq!(server.pressure(), Signal::Pressure(800_000));
        server.handle_flush_completed();
        assert!(!server.is_latched());
        assert_eq!(server.decide(), accept(250_000));
        assert_eq!(server.pressure(), Signal::Pressure(250_000));
        // A flush with no latch changes nothing.
        server.handle_flush_completed();
        assert_eq!(server.decide(), accept(250_000));
    }

    #[test]
    fn latched_decision_feeds_the_client_the_full_ceiling() {
        let mut server = ServerPressure::new(PressureConfig::fluss_landed());
        server.handle_l0(9);
        server.handle_write_rejected();
        let signal: Signal = server.decide().into();
        assert_eq!(signal, Signal::Full);
        assert_eq!(ThrottleCurve::fluss_landed().delay(signal), ms(3_000));
    }

    #[test]
    fn new_server_is_clear_and_keeps_its_config() {
        let server = ServerPressure::new(PressureConfig::fluss_landed());
        assert_eq!(server.config(), &PressureConfig::fluss_landed());
        assert_eq!((server.l0_files(), server.pending_bytes()), (0, 0));
        assert!(!server.is_latched());
        assert_eq!(server.decide(), ACCEPT_CLEAR);
        assert!(!server.decide().is_reject());
        // The default is Fluss as landed (Tf = 8); issue #3454 proposed Tf = 12.
        let defaults = PressureConfig::default();
        assert_eq!(defaults, PressureConfig::fluss_landed());
        assert_eq!(
            (defaults.l0_trigger(), defaults.l0_slowdown_writes_trigger()),
            (8, 20)
        );
        let proposal = PressureConfig::fluss_issue_3454();
        assert_eq!(
            (proposal.l0_trigger(), proposal.l0_slowdown_writes_trigger()),
            (12, 20)
        );
        assert_eq!(proposal.flush_budget(), None);
    }
}
