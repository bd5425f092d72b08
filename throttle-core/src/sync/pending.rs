//! Async admission through a shared [`PendingBytesLimiter`]: [`PendingBytes`], its
//! [`AcquireBytes`] future and the [`BytesPermit`] guard.
//!
//! The limiter already keeps the FIFO line (its tickets) and defines cancellation: `cancel`
//! withdraws a waiting ticket or releases an admitted one. The handle only adds, beside it
//! under the same lock, a table of waiters (ticket, waker, and the grant once the limiter has
//! announced it), sorted by ticket id. After every release or cancel it drains the limiter's
//! `Proceed` actions into that table and wakes those waiters after the lock is dropped.

use alloc::collections::VecDeque;
use core::fmt;
use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll, Waker};

use smallvec::SmallVec;

use super::loom::{Arc, Mutex, lock};
use super::signal::{WakeSignal, wait_for};
use super::{Closed, wake_all};
use crate::pending_bytes::{
    Enqueued, Grant, PendingBytesAction, PendingBytesConfig, PendingBytesLimiter, Ticket,
};

type Wakeups = SmallVec<[Waker; 4]>;

enum Entry {
    Waiting(Option<Waker>),
    /// Admitted; its future has not observed the grant yet.
    Granted(Grant),
    /// Failed by `close` (its ticket is already cancelled).
    Closed,
}

struct BytesState {
    limiter: PendingBytesLimiter,
    /// Waiters whose futures are still alive, in ticket order.
    waiters: VecDeque<(Ticket, Entry)>,
    closed: bool,
    /// Notified (after unlock) once closed with nothing granted: [`PendingBytes::closed`].
    drained: WakeSignal,
    #[cfg(test)]
    refused_releases: usize,
}

impl BytesState {
    /// The signal to notify after unlocking, if the handle is closed and nothing is granted.
    fn drained_signal(&self) -> Option<WakeSignal> {
        (self.closed && self.limiter.granted() == 0).then(|| self.drained.clone())
    }

    fn position(&self, ticket: Ticket) -> Option<usize> {
        self.waiters
            .binary_search_by_key(&ticket.id(), |(t, _)| t.id())
            .ok()
    }

    /// Hands every grant the limiter announced to its waiter; a grant whose waiter is gone
    /// (cannot happen: a waiter leaves only after cancelling) is released, never leaked.
    fn drain(&mut self, wakeups: &mut Wakeups) {
        while let Some(PendingBytesAction::Proceed(grant)) = self.limiter.poll_action() {
            let entry = self
                .position(grant.ticket())
                .and_then(|i| self.waiters.get_mut(i));
            match entry {
                Some((_, entry @ Entry::Waiting(_))) => {
                    if let Entry::Waiting(Some(waker)) =
                        core::mem::replace(entry, Entry::Granted(grant))
                    {
                        wakeups.push(waker);
                    }
                }
                _ => {
                    let _ = self.limiter.release(grant);
                }
            }
        }
    }

    fn release(&mut self, grant: Grant, wakeups: &mut Wakeups) {
        if self.limiter.release(grant).is_err() {
            #[cfg(test)]
            {
                self.refused_releases += 1;
            }
        }
        self.drain(wakeups);
    }

    /// Removes a waiter whose future is finished or dropped; returns its entry.
    fn remove(&mut self, ticket: Ticket) -> Option<Entry> {
        let i = self.position(ticket)?;
        let entry = self.waiters.remove(i).map(|(_, e)| e);
        if self.waiters.is_empty() && self.waiters.capacity() > 64 {
            self.waiters.shrink_to(64);
        }
        entry
    }

    fn close(&mut self, wakeups: &mut Wakeups) {
        self.closed = true;
        // Back to front: withdrawing a ticket that is not the head admits nobody.
        for (ticket, entry) in self.waiters.iter_mut().rev() {
            match core::mem::replace(entry, Entry::Closed) {
                Entry::Waiting(waker) => {
                    let _ = self.limiter.cancel(*ticket);
                    wakeups.extend(waker);
                }
                Entry::Granted(_) => {
                    let _ = self.limiter.cancel(*ticket);
                }
                Entry::Closed => {}
            }
        }
        self.drain(wakeups);
    }
}

/// A cloneable handle to a pending-bytes limiter shared by concurrent producers: await
/// admission of `n` bytes ([`acquire`](Self::acquire)) in FIFO order, hold them as a
/// [`BytesPermit`] that gives them back when dropped.
///
/// `Clone + Send + Sync`; clones share one limiter.
///
/// # Contract
///
/// - [`acquire`](Self::acquire) takes its ticket on its first poll; tickets are admitted in
///   order, with no barging (the limiter's rule). Dropping the future cancels the ticket:
///   withdrawn if still waiting, released if it had been admitted meanwhile, so the bytes are
///   returned exactly once either way and the tickets behind it move up.
/// - A `BytesPermit` releases its bytes once, on [`release`](BytesPermit::release) or drop.
/// - [`close`](Self::close) fails every waiter and later acquire with [`Closed`]; permits
///   already held stay valid.
///
/// ```
/// use throttle_sansio::pending_bytes::PendingBytesConfig;
/// use throttle_sansio::sync::PendingBytes;
///
/// let limiter = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(100));
/// let held = limiter.try_acquire(80).unwrap();
/// assert!(limiter.try_acquire(30).is_none()); // does not fit beside 80
/// drop(held); // released on drop
/// assert_eq!(limiter.used(), 0);
/// ```
#[derive(Clone)]
pub struct PendingBytes {
    shared: Arc<Mutex<BytesState>>,
}

impl fmt::Debug for PendingBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingBytes").finish_non_exhaustive()
    }
}

impl PendingBytes {
    /// A handle over a new limiter.
    pub fn new(config: PendingBytesConfig) -> Self {
        PendingBytes {
            shared: Arc::new(Mutex::new(BytesState {
                limiter: PendingBytesLimiter::new(config),
                waiters: VecDeque::new(),
                closed: false,
                drained: WakeSignal::new(),
                #[cfg(test)]
                refused_releases: 0,
            })),
        }
    }

    /// Waits until `bytes` are admitted (clamped to the limit; see the limiter).
    ///
    /// Making the future runs no user code; its poll may panic in the waker's `clone` (see
    /// [`AcquireBytes`]).
    pub fn acquire(&self, bytes: u64) -> AcquireBytes {
        AcquireBytes {
            shared: Arc::clone(&self.shared),
            state: BytesAcquireState::Start(bytes),
        }
    }

    /// Admits `bytes` now if that needs no waiting (nobody in line and the charge fits).
    pub fn try_acquire(&self, bytes: u64) -> Option<BytesPermit> {
        let mut st = lock(&self.shared);
        if st.closed {
            return None;
        }
        let grant = st.limiter.try_acquire(bytes)?;
        drop(st);
        Some(BytesPermit::new(Arc::clone(&self.shared), grant))
    }

    /// Fails every waiter with [`Closed`] and refuses later acquires. Permits already held
    /// stay valid. Idempotent. Never panics: a waiter's waker that panics in `wake` is caught, and the
    /// others (and the [`closed`](Self::closed) listeners) are still woken.
    pub fn close(&self) {
        let mut wakeups = Wakeups::new();
        let drained = {
            let mut st = lock(&self.shared);
            st.close(&mut wakeups);
            st.drained_signal()
        };
        wake_all(wakeups);
        if let Some(signal) = drained {
            signal.notify();
        }
    }

    /// Resolves once the handle is closed and nothing is granted: every [`BytesPermit`]
    /// released (grants not yet observed by a waiter are given back by the close). With
    /// [`close`](Self::close), a graceful shutdown: `bytes.close(); bytes.closed().await`.
    /// Cancel-safe.
    pub async fn closed(&self) {
        let signal = lock(&self.shared).drained.clone();
        wait_for(&signal, || {
            let st = lock(&self.shared);
            st.closed && st.limiter.granted() == 0
        })
        .await;
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        lock(&self.shared).closed
    }

    /// Bytes held by admitted tickets (permits, and grants not yet observed by their waiter).
    pub fn used(&self) -> u64 {
        lock(&self.shared).limiter.used()
    }

    /// Tickets waiting in line.
    pub fn waiting(&self) -> usize {
        lock(&self.shared).limiter.waiting()
    }

    /// The bound in bytes (`0`: disabled).
    pub fn limit(&self) -> u64 {
        lock(&self.shared).limiter.limit()
    }

    #[cfg(test)]
    pub(crate) fn refused_releases(&self) -> usize {
        lock(&self.shared).refused_releases
    }
}

/// Admitted bytes, given back exactly once: by [`release`](Self::release) or on drop.
#[must_use = "dropping the permit releases its bytes at once"]
pub struct BytesPermit {
    shared: Arc<Mutex<BytesState>>,
    grant: Grant,
    live: bool,
}

impl fmt::Debug for BytesPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BytesPermit")
            .field("grant", &self.grant)
            .finish()
    }
}

impl BytesPermit {
    fn new(shared: Arc<Mutex<BytesState>>, grant: Grant) -> Self {
        BytesPermit {
            shared,
            grant,
            live: true,
        }
    }

    /// The bytes held (the request clamped to the limit; 0 when the limiter is disabled).
    pub fn charged(&self) -> u64 {
        self.grant.charged()
    }

    /// The limiter's ticket for these bytes.
    pub fn ticket(&self) -> Ticket {
        self.grant.ticket()
    }

    /// Gives the bytes back now; waiters that now fit are admitted.
    /// Never panics, as dropping the permit: the wake of an admitted waiter (or of a
    /// [`closed`](PendingBytes::closed) listener) that panics is caught, and the others are
    /// still woken.
    pub fn release(mut self) {
        self.release_once();
    }

    fn release_once(&mut self) {
        if !core::mem::replace(&mut self.live, false) {
            return;
        }
        let mut wakeups = Wakeups::new();
        let drained = {
            let mut st = lock(&self.shared);
            st.release(self.grant, &mut wakeups);
            st.drained_signal()
        };
        wake_all(wakeups);
        if let Some(signal) = drained {
            signal.notify();
        }
    }
}

impl Drop for BytesPermit {
    fn drop(&mut self) {
        self.release_once();
    }
}

#[derive(Clone, Copy)]
enum BytesAcquireState {
    Start(u64),
    Waiting(Ticket),
    Done,
}

/// The future of [`PendingBytes::acquire`]: resolves to a [`BytesPermit`] or [`Closed`].
///
/// Takes its ticket when first polled; dropping it cancels the ticket (see the handle).
///
/// # Panics
///
/// A poll panics only if the waker's `clone` panics, as it registers the waker (no other user
/// code runs). On a first poll the ticket is then already in line and recorded in the future:
/// dropping the future, as the unwinding task does, cancels it, and a future kept and polled
/// again registers its waker and is admitted in its turn. The bytes are conserved either way.
#[must_use = "futures do nothing unless polled"]
pub struct AcquireBytes {
    shared: Arc<Mutex<BytesState>>,
    state: BytesAcquireState,
}

impl fmt::Debug for AcquireBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcquireBytes").finish_non_exhaustive()
    }
}

impl Future for AcquireBytes {
    type Output = Result<BytesPermit, Closed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut st = lock(&this.shared);
        let outcome = match this.state {
            BytesAcquireState::Start(_) if st.closed => Err(Closed),
            BytesAcquireState::Start(bytes) => match st.limiter.enqueue(bytes) {
                Ok(Enqueued::Granted(grant)) => Ok(grant),
                // The limiter can issue no new ticket (after 2^64 of them): this acquire
                // fails; tickets already issued are still served.
                Err(_) => Err(Closed),
                Ok(Enqueued::Waiting(ticket)) => {
                    // Ticket ids grow with every enqueue made under this lock, so pushing at
                    // the back keeps the table sorted. The ticket is recorded, in the table
                    // and in the future, before the waker is cloned (the runtime's code): a
                    // clone that panics leaves a waiter without a waker, whose ticket the
                    // future's drop cancels, not a ticket nobody owns at the head of the line.
                    st.waiters.push_back((ticket, Entry::Waiting(None)));
                    this.state = BytesAcquireState::Waiting(ticket);
                    if let Some((_, Entry::Waiting(waker))) = st.waiters.back_mut() {
                        *waker = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
            },
            BytesAcquireState::Waiting(ticket) => {
                match st.position(ticket).and_then(|i| st.waiters.get_mut(i)) {
                    Some((_, Entry::Waiting(waker))) => {
                        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                            *waker = Some(cx.waker().clone());
                        }
                        return Poll::Pending;
                    }
                    _ => match st.remove(ticket) {
                        Some(Entry::Granted(grant)) => Ok(grant),
                        _ => Err(Closed),
                    },
                }
            }
            BytesAcquireState::Done => return Poll::Pending,
        };
        drop(st);
        this.state = BytesAcquireState::Done;
        Poll::Ready(outcome.map(|grant| BytesPermit::new(Arc::clone(&this.shared), grant)))
    }
}

impl Drop for AcquireBytes {
    fn drop(&mut self) {
        let BytesAcquireState::Waiting(ticket) = self.state else {
            return;
        };
        self.state = BytesAcquireState::Done;
        let mut wakeups = Wakeups::new();
        let drained = {
            let mut st = lock(&self.shared);
            match st.remove(ticket) {
                // `close` already cancelled it.
                Some(Entry::Closed) | None => None,
                // Waiting: withdraw. Granted but not observed: release. `cancel` does either.
                Some(_) => {
                    let _ = st.limiter.cancel(ticket);
                    st.drain(&mut wakeups);
                    st.drained_signal()
                }
            }
        };
        wake_all(wakeups);
        if let Some(signal) = drained {
            signal.notify();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod panics;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::test_support::{CountingWaker, WakeCount, poll_once};
    use alloc::vec::Vec;

    struct Polled {
        fut: AcquireBytes,
        waker: Waker,
        count: WakeCount,
    }

    impl Polled {
        fn new(h: &PendingBytes, n: u64) -> Self {
            let (waker, count) = CountingWaker::new();
            Polled {
                fut: h.acquire(n),
                waker,
                count,
            }
        }
        fn poll(&mut self) -> Poll<Result<BytesPermit, Closed>> {
            poll_once(&mut self.fut, &self.waker)
        }
        fn permit(&mut self) -> BytesPermit {
            match self.poll() {
                Poll::Ready(Ok(p)) => p,
                other => panic!("expected a permit, got {:?}", other.map(|r| r.is_ok())),
            }
        }
    }

    #[test]
    fn bytes_waiters_are_admitted_in_order_and_a_small_one_never_barges() {
        let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(100));
        let big = Polled::new(&h, 80).permit();
        let mut a = Polled::new(&h, 30);
        let mut b = Polled::new(&h, 10);
        let mut c = Polled::new(&h, 61); // 30 + 10 + 61 > 100
        assert!(a.poll().is_pending());
        assert!(b.poll().is_pending(), "10 B would fit, but 30 B is ahead");
        assert!(c.poll().is_pending());
        assert!(
            h.try_acquire(1).is_none(),
            "no barging for try_acquire either"
        );
        big.release();
        assert_eq!(
            (a.count.wakes(), b.count.wakes(), c.count.wakes()),
            (1, 1, 0)
        );
        let (pa, pb) = (a.permit(), b.permit());
        assert_eq!((pa.charged(), pb.charged(), h.used()), (30, 10, 40));
        assert!(c.poll().is_pending());
        drop(pa);
        assert_eq!(c.count.wakes(), 1);
        let pc = c.permit();
        assert_eq!(h.used(), 71);
        drop((pb, pc));
        assert_eq!((h.used(), h.waiting(), h.refused_releases()), (0, 0, 0));
    }

    #[test]
    fn bytes_waiter_cancelled_after_admission_returns_its_bytes_once() {
        let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
        let held = Polled::new(&h, 10).permit();
        let mut a = Polled::new(&h, 10);
        let mut b = Polled::new(&h, 10);
        assert!(a.poll().is_pending() && b.poll().is_pending());
        drop(held); // admits `a`, which never looks
        assert_eq!((a.count.wakes(), h.used()), (1, 10));
        drop(a); // cancel releases its grant, which admits `b`
        assert_eq!(b.count.wakes(), 1);
        let pb = b.permit();
        assert_eq!(h.used(), 10, "the bytes moved on: not lost, not doubled");
        drop(pb);
        assert_eq!((h.used(), h.refused_releases()), (0, 0));
    }

    #[test]
    fn cancelled_head_lets_the_line_move() {
        let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
        let held = Polled::new(&h, 5).permit();
        let mut big = Polled::new(&h, 10);
        let mut small = Polled::new(&h, 5);
        assert!(big.poll().is_pending() && small.poll().is_pending());
        drop(big);
        assert_eq!(
            small.count.wakes(),
            1,
            "withdrawing the head admits the next"
        );
        let ps = small.permit();
        assert_eq!(h.used(), 10);
        drop((held, ps));
        assert_eq!(h.used(), 0);
    }

    #[test]
    fn close_fails_bytes_waiters_and_held_permits_still_release() {
        let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
        let held = Polled::new(&h, 10).permit();
        let mut waiters: Vec<Polled> = (0..3).map(|_| Polled::new(&h, 4)).collect();
        for w in &mut waiters {
            assert!(w.poll().is_pending());
        }
        h.close();
        assert!(h.is_closed());
        for w in &mut waiters {
            assert_eq!(w.count.wakes(), 1);
            assert!(matches!(w.poll(), Poll::Ready(Err(Closed))));
        }
        assert!(matches!(
            Polled::new(&h, 1).poll(),
            Poll::Ready(Err(Closed))
        ));
        assert!(h.try_acquire(0).is_none());
        assert_eq!((h.used(), h.waiting()), (10, 0));
        drop(held);
        assert_eq!((h.used(), h.refused_releases()), (0, 0));
    }

    #[test]
    fn closed_resolves_only_once_closed_and_every_grant_is_released() {
        let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
        let a = Polled::new(&h, 6).permit();
        let b = h.try_acquire(4).expect("fits beside 6");
        // Granted while the close comes, never observed: the close gives it back.
        let mut late = Polled::new(&h, 6);
        assert!(late.poll().is_pending());
        let (w, wakes) = CountingWaker::new();
        let mut closed = alloc::boxed::Box::pin(h.closed());
        assert!(poll_once(&mut closed, &w).is_pending(), "not closed yet");
        drop(a); // admits `late` (6 fits beside 4)
        h.close();
        assert!(
            poll_once(&mut closed, &w).is_pending(),
            "`b` is still granted"
        );
        assert!(matches!(late.poll(), Poll::Ready(Err(Closed))));
        assert_eq!(wakes.wakes(), 0);
        b.release();
        assert_eq!(
            wakes.wakes(),
            1,
            "the last release wakes the closed() waiter"
        );
        assert!(poll_once(&mut closed, &w).is_ready());
        assert!(poll_once(&mut alloc::boxed::Box::pin(h.closed()), &w).is_ready());
    }

    #[test]
    fn oversized_request_waits_for_everything_then_proceeds_alone() {
        let h = PendingBytes::new(PendingBytesConfig::default().with_max_pending_bytes(10));
        let p = Polled::new(&h, 1).permit();
        let mut huge = Polled::new(&h, u64::MAX);
        assert!(huge.poll().is_pending());
        drop(p);
        let ph = huge.permit();
        assert_eq!((ph.charged(), h.used()), (10, 10));
    }

    #[test]
    fn disabled_limiter_admits_everything_at_once() {
        let h = PendingBytes::new(PendingBytesConfig::disabled());
        let permits: Vec<BytesPermit> =
            (0..5).map(|_| Polled::new(&h, u64::MAX).permit()).collect();
        assert_eq!((h.used(), h.limit()), (0, 0));
        drop(permits);
        assert_eq!(h.refused_releases(), 0);
    }
}
