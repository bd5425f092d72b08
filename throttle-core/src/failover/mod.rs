//! Failover retry: refresh metadata and retry a request after a leader moves, without ever
//! executing a write twice.
//!
//! Upstream (the Fluss admin client's coordinator-failover fix) keeps two predicates per
//! gateway: one decides whether to refresh metadata after an error, the other whether to retry
//! the request once. This module splits that proxy into three small machines:
//!
//! - [`Call`]: one request: send, classify the failure ([`ErrorClass`]), refresh, retry at most
//!   `max_auto_retries` times, finish exactly once.
//! - [`RefreshCoalescer`]: one metadata refresh at a time for all calls; concurrent failures
//!   join the running refresh and are all released when it ends.
//! - [`RetryBudget`]: a client-wide cap on retries ([`GrpcThrottle`], [`FinagleBudget`]).
//!
//! Driving them together (one call, one failover):
//!
//! ```
//! use throttle_sansio::failover::*;
//! use throttle_sansio::rng::SplitMix64;
//! use throttle_sansio::Instant;
//!
//! let (mut budget, mut rng) = (GrpcThrottle::default(), SplitMix64::new(1));
//! let mut refresher: RefreshCoalescer<usize> = RefreshCoalescer::default();
//! let mut call = Call::new(&CallConfig::default());
//! let now = Instant::ZERO;
//!
//! assert_eq!(call.start(now, &mut budget), CallAction::Send { time_left: None });
//! // The old coordinator answers "not the leader".
//! let class = AdminWriteGateway.classify(&ErrorKind::NotLeader);
//! assert_eq!(call.handle_error(now, class, &mut budget, &mut rng), CallAction::Refresh);
//! let CoalesceAction::Start(g) = refresher.handle_refresh_needed(0) else { unreachable!() };
//! // ... the refresh finds the new leader ...
//! refresher.handle_refreshed(g, true).unwrap();
//! while let Some(r) = refresher.poll_action() {
//!     let next = call.handle_refreshed(now, r.ok, &mut budget, &mut rng);
//!     assert!(matches!(next, CallAction::Retry { .. }));
//! }
//! assert_eq!(call.handle_success(now, &mut budget), CallAction::Complete);
//! ```
//!
//! See `docs/failover.md` for the state diagrams, invariants and departures from upstream.

mod budget;
mod call;
mod classify;
mod coalescer;

pub use budget::{
    FinagleBudget, FinagleBudgetConfig, GrpcThrottle, GrpcThrottleConfig, RetryBudget, Unlimited,
};
pub use call::{Call, CallAction, CallConfig, CallState, SurfaceReason};
pub use classify::{
    AdminWriteGateway, ErrorClass, ErrorClassifier, ErrorKind, HasErrorKind, ReadOnlyGateway,
    RetrySafety,
};
pub use coalescer::{
    CoalesceAction, CoalescerConfig, Generation, GenerationError, RefreshCoalescer, Release,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::time::Instant;
    use alloc::vec::Vec;

    #[test]
    fn eight_concurrent_failures_share_one_refresh_and_send_sixteen_times() {
        // Eight admin writes hit the old coordinator during one failover: one refresh, then
        // every call retries once on the new leader.
        let now = Instant::from_millis(5);
        let (mut budget, mut rng) = (Unlimited, SplitMix64::new(3));
        let mut coalescer: RefreshCoalescer<usize> = RefreshCoalescer::default();
        let mut calls: Vec<Call> = (0..8).map(|_| Call::new(&CallConfig::default())).collect();
        let (mut sends, mut refreshes, mut done) = (0, 0, 0);
        let mut generation = None;

        for call in &mut calls {
            assert_eq!(
                call.start(now, &mut budget),
                CallAction::Send { time_left: None }
            );
            sends += 1;
        }
        for (id, call) in calls.iter_mut().enumerate() {
            let class = AdminWriteGateway.classify(&ErrorKind::NotLeader);
            assert_eq!(
                call.handle_error(now, class, &mut budget, &mut rng),
                CallAction::Refresh
            );
            match coalescer.handle_refresh_needed(id) {
                CoalesceAction::Start(g) => {
                    refreshes += 1;
                    generation = Some(g);
                }
                CoalesceAction::Join(g) => assert_eq!(Some(g), generation),
                other => panic!("{other:?}"),
            }
        }
        let g = generation.expect("one refresh started");
        assert_eq!(coalescer.handle_refreshed(g, true), Ok(8));
        while let Some(r) = coalescer.poll_action() {
            let call = &mut calls[r.waiter];
            assert!(matches!(
                call.handle_refreshed(now, r.ok, &mut budget, &mut rng),
                CallAction::Retry { .. }
            ));
            sends += 1;
            assert_eq!(call.handle_success(now, &mut budget), CallAction::Complete);
            done += 1;
        }
        assert_eq!((refreshes, sends, done), (1, 16, 8));
        assert!(calls.iter().all(|c| c.is_terminal() && c.sends() == 2));
    }
}
