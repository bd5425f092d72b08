//! Model checkers for the failover machines: calls sharing a coalescer, the coalescer alone,
//! and the two retry budgets.
//!
//! Each checker decodes bytes into operations (time steps back and forth, huge values, bogus
//! generations, late and out-of-order inputs), drives the real machine and a naive reference
//! written here from the specification (history logs re-scanned on every question, budgets
//! recounted from their whole event list), and returns the first disagreement or broken
//! invariant. None of them may panic on any bytes.

use alloc::format;
use alloc::vec::Vec;
use core::time::Duration;

use super::{Cursor, Divergence};
use crate::backoff::{BackoffConfig, Jitter};
use crate::failover::{
    AwsRetryQuota, AwsRetryQuotaConfig, Call, CallAction, CallConfig, CallEvent, CoalesceAction,
    CoalescerConfig, ErrorCause, ErrorClass, FinagleBudget, FinagleBudgetConfig, Generation,
    GenerationError, GrpcThrottle, GrpcThrottleConfig, RefreshCoalescer, RefreshEvent, RetryBudget,
    RetrySafety, SurfaceReason,
};
use crate::rng::SplitMix64;
use crate::time::Instant;

/// Runs all three checkers on the same bytes.
pub fn check(data: &[u8]) -> Result<(), Divergence> {
    check_call(data)?;
    check_coalescer(data)?;
    check_budget(data)
}

// ---------------------------------------------------------------------------------------------
// Coalescer reference.
// ---------------------------------------------------------------------------------------------

/// What the naive coalescer expects from `handle_refresh_needed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NeedAnswer {
    Start(u64),
    Join(u64),
    Full,
}

/// The naive coalescer: lists of what started, joined, completed and was handed out, scanned
/// for every answer.
#[derive(Debug, Default)]
struct RefCoalescer {
    max_waiters: usize,
    /// Generations in the order they started.
    started: Vec<u64>,
    /// Completions in order, with their result.
    completed: Vec<(u64, bool)>,
    /// Every accepted waiter and the generation it waits for.
    joins: Vec<(u64, u64)>,
    /// Every release, in the order it must be handed out.
    releases: Vec<(u64, u64, bool)>,
    polled: usize,
}

impl RefCoalescer {
    fn new(max_waiters: usize) -> Self {
        RefCoalescer {
            max_waiters,
            ..RefCoalescer::default()
        }
    }

    fn starts(&self) -> u64 {
        self.started.len() as u64
    }

    fn running(&self) -> Option<u64> {
        let last = *self.started.last()?;
        if self.completed.iter().any(|(g, _)| *g == last) {
            None
        } else {
            Some(last)
        }
    }

    fn held(&self) -> usize {
        let running = self.running();
        let waiting = self
            .joins
            .iter()
            .filter(|(_, g)| Some(*g) == running)
            .count();
        waiting + (self.releases.len() - self.polled)
    }

    fn need(&mut self, serial: u64) -> NeedAnswer {
        if self.held() >= self.max_waiters {
            return NeedAnswer::Full;
        }
        let (answer, generation) = match self.running() {
            Some(g) => (NeedAnswer::Join(g), g),
            None => {
                let g = self.starts();
                self.started.push(g);
                (NeedAnswer::Start(g), g)
            }
        };
        self.joins.push((serial, generation));
        answer
    }

    fn complete(&mut self, g: u64, ok: bool) -> Result<usize, GenerationError> {
        if self.running() == Some(g) {
            self.completed.push((g, ok));
            let before = self.releases.len();
            for &(serial, jg) in &self.joins {
                if jg == g {
                    self.releases.push((serial, g, ok));
                }
            }
            Ok(self.releases.len() - before)
        } else if !self.started.contains(&g) {
            Err(GenerationError::Unknown)
        } else {
            Err(GenerationError::AlreadyCompleted)
        }
    }

    /// Waiters accepted for generation `g`.
    fn waiters_of(&self, g: u64) -> usize {
        self.joins.iter().filter(|(_, jg)| *jg == g).count()
    }

    fn poll(&mut self) -> Option<(u64, u64, bool)> {
        let next = self.releases.get(self.polled).copied()?;
        self.polled += 1;
        Some(next)
    }
}

/// Drains the coalescer's events after one operation: with events on, exactly `want` (an
/// operation records at most one); with them off, none.
fn check_refresh_events<W>(
    real: &mut RefreshCoalescer<W>,
    want: Option<RefreshEvent>,
    on: bool,
    step: usize,
) -> Result<(), Divergence> {
    let want = if on { want } else { None };
    let got = real.poll_event();
    if got != want {
        return Err(format!("step {step}: event {got:?}, expected {want:?}"));
    }
    match real.poll_event() {
        Some(extra) => Err(format!("step {step}: extra event {extra:?}")),
        None if real.events_dropped() != 0 => Err(format!(
            "step {step}: {} events dropped with an unbounded queue",
            real.events_dropped()
        )),
        None => Ok(()),
    }
}

fn need_matches<W>(got: &CoalesceAction<W>, want: NeedAnswer) -> bool {
    match (got, want) {
        (CoalesceAction::Start(g), NeedAnswer::Start(w)) => g.get() == w,
        (CoalesceAction::Join(g), NeedAnswer::Join(w)) => g.get() == w,
        (CoalesceAction::Full(_), NeedAnswer::Full) => true,
        _ => false,
    }
}

/// A generation to complete: usually the running one, sometimes a bogus or stale one.
fn pick_generation(c: &mut Cursor<'_>, running: Option<u64>, starts: u64) -> u64 {
    match c.below(8) {
        0 => c.u64(),
        1 => starts.saturating_sub(1 + u64::from(c.below(3))),
        2 => starts.saturating_add(u64::from(c.below(3))),
        3 => u64::MAX,
        _ => running.unwrap_or(starts),
    }
}

/// Every waiter released exactly once (the run is finished first).
fn check_released_once(released: &[u32], joined: &[bool]) -> Result<(), Divergence> {
    for (serial, (&n, &j)) in released.iter().zip(joined).enumerate() {
        let want = u32::from(j);
        if n != want {
            return Err(format!(
                "waiter {serial} (joined: {j}) released {n} times, expected {want}"
            ));
        }
    }
    Ok(())
}

/// Coalescer alone: needs, completions (good, stale, bogus), polls; one refresh per
/// generation, every joined waiter released exactly once, bounded holding.
pub fn check_coalescer(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let max_waiters = match c.below(4) {
        0 => 1024,
        _ => 1 + usize::from(c.below(8)),
    };
    let cfg = CoalescerConfig::default().with_max_waiters(max_waiters);
    let Ok(mut real) = RefreshCoalescer::<u64>::new(cfg) else {
        return Err(format!("max_waiters {max_waiters} refused"));
    };
    let mut model = RefCoalescer::new(max_waiters);
    let events = data.last().is_some_and(|b| b & 1 == 1);
    if events {
        real.set_event_capacity(usize::MAX);
    }
    let mut released: Vec<u32> = Vec::new();
    let mut joined: Vec<bool> = Vec::new();
    let mut step = 0usize;

    let poll = |real: &mut RefreshCoalescer<u64>,
                model: &mut RefCoalescer,
                released: &mut Vec<u32>,
                step: usize|
     -> Result<bool, Divergence> {
        let got = real
            .poll_action()
            .map(|r| (r.waiter, r.generation.get(), r.ok));
        let want = model.poll();
        if got != want {
            return Err(format!(
                "step {step}: poll_action {got:?}, expected {want:?}"
            ));
        }
        if let Some((serial, _, _)) = got {
            match released.get_mut(serial as usize) {
                Some(n) => *n = n.saturating_add(1),
                None => return Err(format!("step {step}: released unknown waiter {serial}")),
            }
        }
        Ok(got.is_some())
    };

    while !c.is_empty() {
        step += 1;
        let Some(op) = c.select(4) else {
            continue;
        };
        match op {
            0 => {
                let serial = joined.len() as u64;
                let held = model.held();
                let got = real.handle_refresh_needed(serial);
                let want = model.need(serial);
                if !need_matches(&got, want) {
                    return Err(format!("step {step}: need {got:?}, expected {want:?}"));
                }
                let event = match want {
                    NeedAnswer::Start(g) => RefreshEvent::Started {
                        generation: Generation::from_raw(g),
                    },
                    NeedAnswer::Join(g) => RefreshEvent::Joined {
                        generation: Generation::from_raw(g),
                        waiters: model.waiters_of(g),
                    },
                    NeedAnswer::Full => RefreshEvent::Refused { held },
                };
                check_refresh_events(&mut real, Some(event), events, step)?;
                if let CoalesceAction::Full(w) = got {
                    if w != serial {
                        return Err(format!("step {step}: Full handed back {w}, not {serial}"));
                    }
                }
                joined.push(!matches!(want, NeedAnswer::Full));
                released.push(0);
            }
            1 => {
                let g = pick_generation(&mut c, model.running(), model.starts());
                let ok = c.bool();
                let before = real.clone();
                let got = real.handle_refreshed(Generation::from_raw(g), ok);
                let want = model.complete(g, ok);
                if got != want {
                    return Err(format!(
                        "step {step}: complete({g}, {ok}) {got:?}, expected {want:?}"
                    ));
                }
                if got.is_err() && real != before {
                    return Err(format!(
                        "step {step}: a refused completion changed the coalescer"
                    ));
                }
                let event = want.ok().map(|released| RefreshEvent::Completed {
                    generation: Generation::from_raw(g),
                    ok,
                    released,
                });
                check_refresh_events(&mut real, event, events, step)?;
            }
            _ => {
                poll(&mut real, &mut model, &mut released, step)?;
                check_refresh_events(&mut real, None, events, step)?;
            }
        }
        if real.held() != model.held() {
            return Err(format!(
                "step {step}: held {}, expected {}",
                real.held(),
                model.held()
            ));
        }
        if real.held() > max_waiters {
            return Err(format!(
                "step {step}: holds {} > max {max_waiters}",
                real.held()
            ));
        }
        if real.in_flight().map(Generation::get) != model.running() {
            return Err(format!(
                "step {step}: in flight {:?}, expected {:?}",
                real.in_flight(),
                model.running()
            ));
        }
    }
    // Finish the running refresh and drain: every joined waiter comes out exactly once.
    if let Some(g) = model.running() {
        let got = real.handle_refreshed(Generation::from_raw(g), true);
        let want = model.complete(g, true);
        if got != want {
            return Err(format!("final complete({g}) {got:?}, expected {want:?}"));
        }
        let event = want.ok().map(|released| RefreshEvent::Completed {
            generation: Generation::from_raw(g),
            ok: true,
            released,
        });
        check_refresh_events(&mut real, event, events, step)?;
    }
    while poll(&mut real, &mut model, &mut released, step)? {}
    check_released_once(&released, &joined)
}

// ---------------------------------------------------------------------------------------------
// Calls sharing one coalescer and one scripted budget.
// ---------------------------------------------------------------------------------------------

/// What a call told the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BudgetEvent {
    Request,
    Failure,
    /// A success at the first attempt.
    Success,
    /// A success on a retry withdrawn for this cause.
    RetrySuccess(ErrorCause),
    /// A withdrawal for a retry after an error of this cause.
    Withdraw(ErrorCause),
}

/// A budget that answers withdrawals from a script and logs every event, so the reference can
/// check exactly what the call reported.
#[derive(Debug, Default)]
struct ScriptedBudget {
    answers: Vec<bool>,
    asked: usize,
    log: Vec<BudgetEvent>,
}

impl ScriptedBudget {
    fn answer(&self, n: usize) -> bool {
        self.answers.get(n).copied().unwrap_or(true)
    }
}

impl RetryBudget for ScriptedBudget {
    fn handle_request(&mut self, _now: Instant) {
        self.log.push(BudgetEvent::Request);
    }
    fn handle_failure(&mut self, _now: Instant) {
        self.log.push(BudgetEvent::Failure);
    }
    fn handle_success(&mut self, _now: Instant) {
        self.log.push(BudgetEvent::Success);
    }
    fn try_withdraw(&mut self, now: Instant) -> bool {
        self.try_withdraw_for(now, ErrorCause::Transient)
    }
    fn can_retry(&self, _now: Instant) -> bool {
        self.answer(self.asked)
    }
    fn try_withdraw_for(&mut self, _now: Instant, cause: ErrorCause) -> bool {
        self.log.push(BudgetEvent::Withdraw(cause));
        let a = self.answer(self.asked);
        self.asked = self.asked.saturating_add(1);
        a
    }
    fn handle_retry_success(&mut self, _now: Instant, cause: ErrorCause) {
        self.log.push(BudgetEvent::RetrySuccess(cause));
    }
}

/// What the reference expects a call to answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Send,
    Refresh,
    Retry,
    Surface(SurfaceReason),
    Complete,
    Nothing,
    /// Not an answer: the retry's jittered delay may or may not reach the deadline, so
    /// `settle` takes `DeadlineExceeded` from the machine, or else asks the budget.
    RetryOrLate,
}

fn want_of(a: &CallAction) -> Want {
    match a {
        CallAction::Send { .. } => Want::Send,
        CallAction::Refresh => Want::Refresh,
        CallAction::Retry { .. } => Want::Retry,
        CallAction::Surface { reason } => Want::Surface(*reason),
        CallAction::Complete => Want::Complete,
        _ => Want::Nothing,
    }
}

/// The naive call: the list of everything it emitted, re-read for every question.
#[derive(Debug, Default)]
struct RefCall {
    emitted: Vec<Want>,
    /// Whether the last accepted error was safe to retry.
    last_error_not_executed: bool,
    /// The cause of the last accepted error.
    last_error_cause: ErrorCause,
    /// The cause of every retry handed out, in order.
    retry_causes: Vec<ErrorCause>,
}

impl RefCall {
    fn last(&self) -> Option<Want> {
        self.emitted.last().copied()
    }
    fn awaiting_result(&self) -> bool {
        matches!(self.last(), Some(Want::Send | Want::Retry))
    }
    fn awaiting_refresh(&self) -> bool {
        self.last() == Some(Want::Refresh)
    }
    fn retries(&self) -> u64 {
        self.emitted.iter().filter(|w| **w == Want::Retry).count() as u64
    }
    fn sends(&self) -> u64 {
        self.emitted
            .iter()
            .filter(|w| matches!(w, Want::Send | Want::Retry))
            .count() as u64
    }
    fn finished(&self) -> usize {
        self.emitted
            .iter()
            .filter(|w| matches!(w, Want::Surface(_) | Want::Complete))
            .count()
    }
}

/// The backoff a decoded call configuration uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BackoffMode {
    None,
    /// Fluss retriable write: 100 ms ± 20 % growing to 1 s, no total budget.
    Fluss,
    /// `FIXED_DELAY` every time under a hard total of `total`: the `k`-th delay is granted
    /// only while `k × FIXED_DELAY ≤ total`.
    Fixed {
        total: Duration,
    },
    /// The AWS 2026 pair, unjittered: `PER_CLASS_BASE` ×2 up to `PER_CLASS_MAX` for
    /// transient errors and timeouts, `PER_CLASS_THROTTLING_BASE` ×2 up to the same for
    /// throttling; each class counts its own retries.
    PerClass,
}

const FIXED_DELAY: Duration = Duration::from_millis(100);
const PER_CLASS_BASE: Duration = Duration::from_millis(50);
const PER_CLASS_THROTTLING_BASE: Duration = Duration::from_secs(1);
const PER_CLASS_MAX: Duration = Duration::from_secs(20);

/// The `k`-th delay (0-based) of an unjittered `base` ×2 sequence capped at `PER_CLASS_MAX`.
fn doubling(base: Duration, k: usize) -> Duration {
    let factor = 1u32 << k.min(20);
    base.saturating_mul(factor).min(PER_CLASS_MAX)
}

/// An unjittered ×2 backoff from `base` up to `PER_CLASS_MAX`.
fn doubling_config(base: Duration) -> Result<BackoffConfig, Divergence> {
    BackoffConfig::builder()
        .initial(base)
        .max(PER_CLASS_MAX)
        .multiplier(2, 1)
        .jitter(Jitter::None)
        .build()
        .map_err(|e| format!("per-class backoff refused: {e}"))
}

struct Calls {
    /// Per call: the deadline the reference holds (set by the deadline operation).
    deadlines: Vec<Option<Instant>>,
    /// Per call: a retry was handed out and its due time not yet reported.
    due: Vec<bool>,
    max_retries: u32,
    backoff: BackoffMode,
    now: Instant,
    calls: Vec<Call>,
    refs: Vec<RefCall>,
    budget: ScriptedBudget,
    budget_want: Vec<BudgetEvent>,
    withdrawals_wanted: usize,
    coal: RefreshCoalescer<(usize, u64)>,
    coal_ref: RefCoalescer,
    rng: SplitMix64,
    serial: u64,
    /// Whether the calls record events (the input's last byte is odd).
    events: bool,
    joined: Vec<bool>,
    released: Vec<u32>,
    /// Per call: whether the error behind its current refresh was classified `Never`.
    machine_last_never: Vec<bool>,
    /// The cause of the error being decided (set before every decision).
    cause: ErrorCause,
    step: usize,
}

impl Calls {
    /// The delay `PerClass` gives the next retry of call `i` after an error of `self.cause`.
    fn per_class_delay(&self, i: usize) -> Duration {
        let throttling = self.cause == ErrorCause::Throttling;
        let (base, earlier) = match self.refs.get(i) {
            Some(r) => (
                if throttling {
                    PER_CLASS_THROTTLING_BASE
                } else {
                    PER_CLASS_BASE
                },
                r.retry_causes
                    .iter()
                    .filter(|c| (**c == ErrorCause::Throttling) == throttling)
                    .count(),
            ),
            None => (PER_CLASS_BASE, 0),
        };
        doubling(base, earlier)
    }

    /// The reference's retry decision after an error of the given safety.
    fn decide(&mut self, i: usize, not_executed: bool) -> Want {
        let Some(r) = self.refs.get(i) else {
            return Want::Nothing;
        };
        if !not_executed {
            return Want::Surface(SurfaceReason::ClassifiedNever);
        }
        if r.retries() >= u64::from(self.max_retries) {
            return Want::Surface(SurfaceReason::RetriesExhausted);
        }
        // The backoff is asked first: every earlier delay of this call led to a retry (a
        // refused withdrawal ends the call), so this is delay number `retries + 1`. A refused
        // delay surfaces without touching the shared budget.
        if let BackoffMode::Fixed { total } = self.backoff {
            let k = u32::try_from(r.retries().saturating_add(1)).unwrap_or(u32::MAX);
            if FIXED_DELAY.saturating_mul(k) > total {
                return Want::Surface(SurfaceReason::BackoffExhausted);
            }
        }
        // Then the deadline: the retry starts at `now + after`, which must be before it.
        if let Some(deadline) = self.deadlines.get(i).copied().flatten() {
            let (lo, hi) = self.delay_range(i, r.retries());
            if self.now.saturating_add(lo) >= deadline {
                return Want::Surface(SurfaceReason::DeadlineExceeded);
            }
            if self.now.saturating_add(hi) >= deadline {
                return Want::RetryOrLate;
            }
        }
        self.withdraw()
    }

    /// The delays the backoff can give call `i`'s retry after `retries` earlier ones.
    fn delay_range(&self, i: usize, retries: u64) -> (Duration, Duration) {
        match self.backoff {
            BackoffMode::None => (Duration::ZERO, Duration::ZERO),
            BackoffMode::Fixed { .. } => (FIXED_DELAY, FIXED_DELAY),
            BackoffMode::PerClass => {
                let d = self.per_class_delay(i);
                (d, d)
            }
            // 100 ms · 2ᵏ capped at 1 s, ±20 %, never above 1 s.
            BackoffMode::Fluss => {
                let base = 100u64.saturating_mul(1u64 << retries.min(20)).min(1_000);
                let lo = Duration::from_millis(base * 8 / 10);
                let hi = Duration::from_millis((base * 12 / 10).min(1_000));
                (lo, hi)
            }
        }
    }

    /// The last step of the decision: one withdrawal, answered from the script.
    fn withdraw(&mut self) -> Want {
        self.budget_want.push(BudgetEvent::Withdraw(self.cause));
        let yes = self.budget.answer(self.withdrawals_wanted);
        self.withdrawals_wanted += 1;
        if yes {
            Want::Retry
        } else {
            Want::Surface(SurfaceReason::BudgetEmpty)
        }
    }

    /// Compares the machine's answer with the reference's, checks the invariants, and acts on
    /// it (a `Refresh` goes to the coalescer at once).
    fn settle(
        &mut self,
        i: usize,
        got: CallAction,
        want: Want,
        what: &str,
    ) -> Result<(), Divergence> {
        let step = self.step;
        let want = match want {
            Want::RetryOrLate
                if got
                    == (CallAction::Surface {
                        reason: SurfaceReason::DeadlineExceeded,
                    }) =>
            {
                Want::Surface(SurfaceReason::DeadlineExceeded)
            }
            Want::RetryOrLate => self.withdraw(),
            w => w,
        };
        if want_of(&got) != want {
            return Err(format!(
                "step {step}: call {i} {what}: {got:?}, expected {want:?}"
            ));
        }
        let deadline = self.deadlines.get(i).copied().flatten();
        // Every attempt starts before the deadline and is told exactly the time left.
        let start = match got {
            CallAction::Send { time_left } => Some((self.now, time_left)),
            CallAction::Retry { after, time_left } => {
                Some((self.now.saturating_add(after), time_left))
            }
            _ => None,
        };
        if let Some((at, time_left)) = start {
            let want_left = deadline.map(|d| d.saturating_duration_since(at));
            if deadline.is_some_and(|d| at >= d) || time_left != want_left {
                return Err(format!(
                    "step {step}: call {i} attempt at {at:?} told {time_left:?} left, \
                     deadline {deadline:?}"
                ));
            }
        }
        if let CallAction::Retry { after, .. } = got {
            let ok = match self.backoff {
                // Fluss retriable-write backoff: 100 ms ± 20 % growing to 1 s, jitter included.
                BackoffMode::Fluss => {
                    after >= Duration::from_millis(80) && after <= Duration::from_secs(1)
                }
                BackoffMode::Fixed { .. } => after == FIXED_DELAY,
                BackoffMode::None => after == Duration::ZERO,
                // Each class's own sequence, from its own base.
                BackoffMode::PerClass => after == self.per_class_delay(i),
            };
            if !ok {
                return Err(format!("step {step}: call {i} retry after {after:?}"));
            }
            if self.machine_last_never.get(i).copied().unwrap_or(false) {
                return Err(format!(
                    "step {step}: call {i} retried an error classified Never"
                ));
            }
        }
        if self.budget.log != self.budget_want {
            return Err(format!(
                "step {step}: call {i} {what}: budget saw {:?}, expected {:?}",
                self.budget.log, self.budget_want
            ));
        }
        let (Some(call), Some(r)) = (self.calls.get(i), self.refs.get_mut(i)) else {
            return Ok(());
        };
        if want != Want::Nothing {
            r.emitted.push(want);
        }
        if want == Want::Retry {
            r.retry_causes.push(self.cause);
        }
        if let Some(d) = self.due.get_mut(i) {
            if want != Want::Nothing {
                // A retry awaits its due report; any other answer ends the wait for one.
                *d = want == Want::Retry;
            }
        }
        if r.finished() > 1 {
            return Err(format!("step {step}: call {i} completed twice"));
        }
        if r.sends() > 1 + u64::from(self.max_retries) {
            return Err(format!("step {step}: call {i} sent {} times", r.sends()));
        }
        if call.sends() != r.sends() || u64::from(call.retries()) != r.retries() {
            return Err(format!(
                "step {step}: call {i} reports {} sends / {} retries, expected {} / {}",
                call.sends(),
                call.retries(),
                r.sends(),
                r.retries()
            ));
        }
        if call.is_terminal() != (r.finished() == 1) {
            return Err(format!(
                "step {step}: call {i} terminal {}",
                call.is_terminal()
            ));
        }
        // One event per Refresh, Retry and Surface: the reference's cause and retry count.
        let event = match (want, got) {
            _ if !self.events => None,
            (Want::Refresh, _) => Some(CallEvent::RefreshRequested { cause: self.cause }),
            (Want::Retry, CallAction::Retry { after, .. }) => Some(CallEvent::RetryDecided {
                attempt: u32::try_from(r.retries()).unwrap_or(u32::MAX),
                delay: after,
                cause: self.cause,
            }),
            (Want::Surface(reason), _) => Some(CallEvent::ErrorSurfaced { reason }),
            _ => None,
        };
        self.check_call_events(i, event)?;
        if got == CallAction::Refresh {
            self.join_coalescer(i)?;
        }
        Ok(())
    }

    /// Drains call `i`'s events after one input: exactly `want` (an input records at most
    /// one), and none while events are off.
    fn check_call_events(&mut self, i: usize, want: Option<CallEvent>) -> Result<(), Divergence> {
        let Some(call) = self.calls.get_mut(i) else {
            return Ok(());
        };
        let got = call.poll_event();
        let extra = call.poll_event();
        if got != want || extra.is_some() || call.events_dropped() != 0 {
            return Err(format!(
                "step {}: call {i} events {got:?} then {extra:?} ({} dropped), expected {want:?}",
                self.step,
                call.events_dropped()
            ));
        }
        Ok(())
    }

    fn join_coalescer(&mut self, i: usize) -> Result<(), Divergence> {
        let serial = self.serial;
        self.serial += 1;
        let got = self.coal.handle_refresh_needed((i, serial));
        let want = self.coal_ref.need(serial);
        if !need_matches(&got, want) {
            return Err(format!(
                "step {}: need {got:?}, expected {want:?}",
                self.step
            ));
        }
        self.joined.push(want != NeedAnswer::Full);
        self.released.push(0);
        if let CoalesceAction::Full(_) = got {
            // A full coalescer counts as a failed refresh for that call.
            self.refreshed(i, false, "refreshed (coalescer full)")?;
        }
        Ok(())
    }

    fn refreshed(&mut self, i: usize, ok: bool, what: &str) -> Result<(), Divergence> {
        let want = match self.refs.get(i) {
            Some(r) if r.awaiting_refresh() => {
                let ne = r.last_error_not_executed;
                self.cause = r.last_error_cause;
                self.decide(i, ne)
            }
            _ => Want::Nothing,
        };
        let Some(call) = self.calls.get_mut(i) else {
            return Ok(());
        };
        let got = call.handle_refreshed(self.now, ok, &mut self.budget, &mut self.rng);
        self.settle(i, got, want, what)
    }

    fn poll(&mut self) -> Result<bool, Divergence> {
        let got = self.coal.poll_action();
        let want = self.coal_ref.poll();
        let got_flat = got.map(|r| (r.waiter.1, r.generation.get(), r.ok));
        if got_flat != want {
            return Err(format!(
                "step {}: poll_action {got_flat:?}, expected {want:?}",
                self.step
            ));
        }
        let Some(r) = got else { return Ok(false) };
        match self.released.get_mut(r.waiter.1 as usize) {
            Some(n) => *n = n.saturating_add(1),
            None => return Err(format!("step {}: unknown waiter released", self.step)),
        }
        self.refreshed(r.waiter.0, r.ok, "released")?;
        Ok(true)
    }
}

/// Several calls sharing one coalescer and one budget, with random classifications, refresh
/// results, late and out-of-order inputs: never two completions, never more than
/// `1 + max_auto_retries` sends, never an automatic retry of an error classified `Never`,
/// exactly the budget events the specification asks for, one refresh per generation, and
/// every joined call released exactly once.
pub fn check_call(data: &[u8]) -> Result<(), Divergence> {
    let mut c = Cursor::new(data);
    let n = 1 + usize::from(c.below(8));
    let max_retries = match c.below(4) {
        0 => 0,
        1 => 1,
        2 => c.small_or_extreme_u32(),
        _ => u32::from(c.below(4)),
    };
    // An unassigned mode skips the override: no backoff, the call's default. Values 0–2 are
    // the original modes (2 is no backoff); 3, per-class backoffs, was appended.
    let backoff = match c.select(4) {
        Some(0) => BackoffMode::Fluss,
        // Room for 0 to 3 delays, and 50 ms spare that never fits a fourth.
        Some(1) => BackoffMode::Fixed {
            total: FIXED_DELAY * u32::from(c.below(4)) + Duration::from_millis(50),
        },
        Some(3) => BackoffMode::PerClass,
        _ => BackoffMode::None,
    };
    let max_waiters = 1 + usize::from(c.below(10));
    let mut cfg = CallConfig::default().with_max_auto_retries(max_retries);
    match backoff {
        BackoffMode::None => {}
        BackoffMode::Fluss => cfg = cfg.with_backoff(BackoffConfig::fluss_retriable_write()),
        BackoffMode::PerClass => {
            cfg = cfg
                .with_backoff(doubling_config(PER_CLASS_BASE)?)
                .with_throttling_backoff(doubling_config(PER_CLASS_THROTTLING_BASE)?);
        }
        BackoffMode::Fixed { total } => {
            let fixed = BackoffConfig::builder()
                .initial(FIXED_DELAY)
                .max(FIXED_DELAY)
                .jitter(Jitter::None)
                .total_budget(Some(total))
                .build();
            match fixed {
                Ok(b) => cfg = cfg.with_backoff(b),
                Err(e) => return Err(format!("fixed backoff refused: {e}")),
            }
        }
    }
    let coal_cfg = CoalescerConfig::default().with_max_waiters(max_waiters);
    let Ok(coal) = RefreshCoalescer::new(coal_cfg) else {
        return Err(format!("max_waiters {max_waiters} refused"));
    };
    let events = data.last().is_some_and(|b| b & 1 == 1);
    let calls = (0..n)
        .map(|_| {
            let mut call = Call::new(&cfg);
            if events {
                call.set_event_capacity(usize::MAX);
            }
            call
        })
        .collect();
    let mut s = Calls {
        deadlines: (0..n).map(|_| None).collect(),
        due: (0..n).map(|_| false).collect(),
        max_retries,
        backoff,
        now: Instant::ZERO,
        calls,
        refs: (0..n).map(|_| RefCall::default()).collect(),
        budget: ScriptedBudget::default(),
        budget_want: Vec::new(),
        withdrawals_wanted: 0,
        coal,
        coal_ref: RefCoalescer::new(max_waiters),
        rng: SplitMix64::new(c.u64()),
        serial: 0,
        events,
        joined: Vec::new(),
        released: Vec::new(),
        machine_last_never: (0..n).map(|_| false).collect(),
        cause: ErrorCause::Transient,
        step: 0,
    };

    while !c.is_empty() {
        s.step += 1;
        // Values 0–9 are the original operations; 10 (the deadline) and 11 (a retry's due
        // time) were appended.
        let Some(op) = c.select(12) else {
            continue;
        };
        // Most inputs go to a live call; one index in nine is past the end (ignored).
        let i = usize::from(c.below(9)) % (n + 1);
        match op {
            0 => s.now = c.time_step(s.now),
            1 => {
                let late = s
                    .deadlines
                    .get(i)
                    .copied()
                    .flatten()
                    .is_some_and(|d| s.now >= d);
                let want = match s.refs.get(i) {
                    Some(r) if r.emitted.is_empty() && late => {
                        Want::Surface(SurfaceReason::DeadlineExceeded)
                    }
                    Some(r) if r.emitted.is_empty() => {
                        s.budget_want.push(BudgetEvent::Request);
                        Want::Send
                    }
                    _ => Want::Nothing,
                };
                let Some(call) = s.calls.get_mut(i) else {
                    continue;
                };
                let got = call.start(s.now, &mut s.budget);
                s.settle(i, got, want, "start")?;
            }
            2 | 3 => {
                let refresh = c.bool();
                // The error class is a variant: an unassigned one skips the error. Values 0 and
                // 1 are the original classes; 2 (a timeout) and 3 (throttling) were appended.
                let (retry, cause) = match c.select(4) {
                    Some(0) => (RetrySafety::Never, ErrorCause::Transient),
                    Some(1) => (RetrySafety::NotExecuted, ErrorCause::Transient),
                    Some(2) => (RetrySafety::NotExecuted, ErrorCause::Timeout),
                    Some(_) => (RetrySafety::NotExecuted, ErrorCause::Throttling),
                    None => continue,
                };
                let class = ErrorClass::new(refresh, retry).with_cause(cause);
                s.cause = cause;
                let ne = retry == RetrySafety::NotExecuted;
                // Past its deadline a call asks for no refresh.
                let late = s
                    .deadlines
                    .get(i)
                    .copied()
                    .flatten()
                    .is_some_and(|d| s.now >= d);
                let want = match s.refs.get_mut(i) {
                    Some(r) if r.awaiting_result() => {
                        r.last_error_not_executed = ne;
                        r.last_error_cause = cause;
                        if ne {
                            s.budget_want.push(BudgetEvent::Failure);
                        }
                        if refresh && !late {
                            Want::Refresh
                        } else {
                            s.decide(i, ne)
                        }
                    }
                    _ => Want::Nothing,
                };
                let Some(call) = s.calls.get_mut(i) else {
                    continue;
                };
                let got = call.handle_error(s.now, class, &mut s.budget, &mut s.rng);
                if got != CallAction::None {
                    if let Some(m) = s.machine_last_never.get_mut(i) {
                        *m = !ne;
                    }
                }
                s.settle(i, got, want, "error")?;
            }
            4 => {
                let want = match s.refs.get(i) {
                    Some(r) if r.awaiting_result() => {
                        // A success on a retry names the cause that retry was withdrawn for.
                        s.budget_want.push(match r.retry_causes.last() {
                            None => BudgetEvent::Success,
                            Some(cause) => BudgetEvent::RetrySuccess(*cause),
                        });
                        Want::Complete
                    }
                    _ => Want::Nothing,
                };
                let Some(call) = s.calls.get_mut(i) else {
                    continue;
                };
                let got = call.handle_success(s.now, &mut s.budget);
                s.settle(i, got, want, "success")?;
            }
            5 => {
                // A refresh result delivered straight to a call, bypassing the coalescer:
                // late or out of order unless the call awaits one.
                let ok = c.bool();
                s.refreshed(i, ok, "refreshed (direct)")?;
            }
            6 => {
                let g = pick_generation(&mut c, s.coal_ref.running(), s.coal_ref.starts());
                let ok = c.bool();
                let got = s.coal.handle_refreshed(Generation::from_raw(g), ok);
                let want = s.coal_ref.complete(g, ok);
                if got != want {
                    return Err(format!(
                        "step {}: complete({g}) {got:?}, expected {want:?}",
                        s.step
                    ));
                }
            }
            7 => {
                let a = c.bool();
                s.budget.answers.push(a);
            }
            8 | 9 => {
                s.poll()?;
            }
            11 => {
                // The retry's delay has passed: it goes ahead before the deadline, and at or
                // after it the call surfaces without sending.
                let late = s
                    .deadlines
                    .get(i)
                    .copied()
                    .flatten()
                    .is_some_and(|d| s.now >= d);
                let pending = s.due.get(i).copied().unwrap_or(false);
                let Some(call) = s.calls.get_mut(i) else {
                    continue;
                };
                let got = call.handle_retry_due(s.now);
                if pending && !late {
                    let time_left = s.deadlines[i].map(|d| d.saturating_duration_since(s.now));
                    if got != (CallAction::Send { time_left }) {
                        return Err(format!(
                            "step {}: call {i} retry due: {got:?}, expected Send {{ {time_left:?} }}",
                            s.step
                        ));
                    }
                    s.due[i] = false;
                    s.check_call_events(i, None)?;
                } else {
                    let want = if pending {
                        Want::Surface(SurfaceReason::DeadlineExceeded)
                    } else {
                        Want::Nothing
                    };
                    s.settle(i, got, want, "retry due")?;
                }
            }
            _ => {
                // Set or clear a call's deadline: cleared, a span ahead (often within the
                // next backoff), or any instant (often already past).
                let deadline = match c.u8() % 4 {
                    0 => None,
                    1 => Some(s.now + Duration::from_millis(u64::from(c.u16() % 1_500))),
                    2 => Some(s.now + c.duration()),
                    _ => Some(Instant::from_nanos(c.u64())),
                };
                if let (Some(call), Some(d)) = (s.calls.get_mut(i), s.deadlines.get_mut(i)) {
                    call.set_deadline(deadline);
                    *d = deadline;
                }
            }
        }
    }
    if let Some(g) = s.coal_ref.running() {
        let got = s.coal.handle_refreshed(Generation::from_raw(g), true);
        let want = s.coal_ref.complete(g, true);
        if got != want {
            return Err(format!("final complete({g}) {got:?}, expected {want:?}"));
        }
    }
    while s.poll()? {}
    check_released_once(&s.released, &s.joined)
}

// ---------------------------------------------------------------------------------------------
// Budgets against a recount of their whole history.
// ---------------------------------------------------------------------------------------------

/// What the gRPC throttle was told, for the recount.
#[derive(Clone, Copy, Debug)]
enum GrpcEvent {
    Failure,
    Success,
    /// An accepted `set_config`: the new ceiling and ratio, in milli-tokens.
    Replace {
        max_milli: i64,
        ratio_milli: i64,
    },
}

mod budgets;
pub use budgets::check_budget;

#[cfg(test)]
mod tests;
