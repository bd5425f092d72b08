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
//! - [`RetryBudget`]: a client-wide cap on retries ([`GrpcThrottle`], [`FinagleBudget`],
//!   [`AwsRetryQuota`]).
//!
//! Driving them together: eight admin writes hit the old coordinator during one failover.
//! They share one refresh, and every call retries once on the new leader. The budget must
//! allow eight retries at once: Finagle's default keeps 100 in reserve, while gRPC's
//! throttle at gRFC A6's example (`GrpcThrottle::default()`: 10 tokens, retries only above 5)
//! is down to 2 tokens after eight failures and refuses all eight (see `docs/failover.md`,
//! "Budgets").
//!
//! ```
//! use throttle_sansio::failover::*;
//! use throttle_sansio::rng::SplitMix64;
//! use throttle_sansio::Instant;
//!
//! let (mut budget, mut rng) = (FinagleBudget::default(), SplitMix64::new(1));
//! let mut refresher: RefreshCoalescer<usize> = RefreshCoalescer::default();
//! let mut calls: Vec<Call> = (0..8).map(|_| Call::new(&CallConfig::default())).collect();
//! let now = Instant::ZERO;
//! let mut generation = None;
//! for (id, call) in calls.iter_mut().enumerate() {
//!     assert!(matches!(call.start(now, &mut budget), CallAction::Send { .. }));
//!     // The old coordinator answers "not the leader".
//!     let class = AdminWriteGateway.classify(&ErrorKind::NotLeader);
//!     assert_eq!(call.handle_error(now, class, &mut budget, &mut rng), CallAction::Refresh);
//!     match refresher.handle_refresh_needed(id) {
//!         CoalesceAction::Start(g) => generation = Some(g), // the first runs the refresh
//!         CoalesceAction::Join(_) => {}                      // the others wait for it
//!         _ => unreachable!(),
//!     }
//! }
//! // ... the one refresh finds the new leader ...
//! refresher.handle_refreshed(generation.unwrap(), true).unwrap();
//! while let Some(r) = refresher.poll_action() {
//!     let call = &mut calls[r.waiter];
//!     let next = call.handle_refreshed(now, r.ok, &mut budget, &mut rng);
//!     assert!(matches!(next, CallAction::Retry { .. }));
//!     assert_eq!(call.handle_success(now, &mut budget), CallAction::Complete);
//! }
//! assert!(calls.iter().all(|c| c.sends() == 2));
//! ```
//!
//! See `docs/failover.md` for the state diagrams, invariants and departures from upstream.

mod budget;
mod call;
mod classify;
mod coalescer;

pub use budget::{
    AwsRetryQuota, AwsRetryQuotaConfig, FinagleBudget, FinagleBudgetConfig, GrpcThrottle,
    GrpcThrottleConfig, RetryBudget, Unlimited,
};
pub use call::{Call, CallAction, CallConfig, CallEvent, CallState, SurfaceReason};
pub use classify::{
    AdminWriteGateway, ErrorCause, ErrorClass, ErrorClassifier, ErrorKind, HasErrorKind,
    ReadOnlyGateway, RetrySafety,
};
pub use coalescer::{
    CoalesceAction, CoalescerConfig, Generation, GenerationError, RefreshCoalescer, RefreshEvent,
    Release,
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

    /// The module's scenario under each budget: how many of eight concurrent not-leader
    /// failures retry once the shared refresh ends.
    fn eight_at_once(budget: &mut dyn RetryBudget) -> usize {
        let (now, mut rng) = (Instant::from_millis(5), SplitMix64::new(3));
        let mut calls: Vec<Call> = (0..8).map(|_| Call::new(&CallConfig::default())).collect();
        for call in &mut calls {
            assert!(matches!(call.start(now, budget), CallAction::Send { .. }));
            let class = AdminWriteGateway.classify(&ErrorKind::NotLeader);
            assert_eq!(
                call.handle_error(now, class, budget, &mut rng),
                CallAction::Refresh
            );
        }
        let mut retried = 0;
        for call in &mut calls {
            if let CallAction::Retry { .. } = call.handle_refreshed(now, true, budget, &mut rng) {
                retried += 1;
            }
        }
        retried
    }

    #[test]
    fn every_default_is_one_named_upstream_configuration() {
        assert_eq!(CallConfig::default(), CallConfig::fluss_admin());
        assert_eq!(CallConfig::default().max_auto_retries(), 1);
        assert_eq!(
            CoalescerConfig::default(),
            CoalescerConfig::fluss_unbounded()
        );
        assert_eq!(CoalescerConfig::default().max_waiters(), 1 << 20);
        assert_eq!(CoalescerConfig::default().validate(), Ok(()));
        let a6 = GrpcThrottleConfig::grpc_a6_example();
        assert_eq!(GrpcThrottleConfig::default(), a6);
        assert_eq!((a6.max_tokens(), a6.milli_token_ratio()), (10, 100));
        let finagle = FinagleBudgetConfig::finagle_default();
        assert_eq!(FinagleBudgetConfig::default(), finagle);
        assert_eq!(finagle.ttl(), core::time::Duration::from_secs(10));
        assert_eq!(
            (
                finagle.min_retries_per_sec(),
                finagle.percent_can_retry_ppm()
            ),
            (10, 200_000)
        );
    }

    #[test]
    fn the_documented_scenario_retries_all_eight_under_finagle_default_and_none_under_a6() {
        // Finagle's default: 100 retries in reserve, so all eight retry.
        assert_eq!(eight_at_once(&mut FinagleBudget::default()), 8);
        // gRFC A6's example: 10 tokens − 8 failures = 2, not above 10/2: all refused.
        let mut a6 = GrpcThrottle::default();
        assert_eq!(eight_at_once(&mut a6), 0);
        assert_eq!(a6.milli_tokens(), 2_000);
        // A throttle sized for it: 8 failures must leave more than max/2, so max ≥ 17.
        let sized = GrpcThrottleConfig::default().with_max_tokens(17);
        assert_eq!(eight_at_once(&mut GrpcThrottle::new(sized).unwrap()), 8);
        let short = GrpcThrottleConfig::default().with_max_tokens(16);
        assert_eq!(eight_at_once(&mut GrpcThrottle::new(short).unwrap()), 0);
    }
}
