use super::*;
use crate::backoff::Backoff;
use crate::rng::{SplitMix64, below};
use crate::time::duration_to_nanos;
use alloc::format;
use alloc::string::{String, ToString};

fn policy_json(max_attempts: &str, initial: &str, max: &str, mult: &str, codes: &str) -> String {
    format!(
        r#"{{"maxAttempts": {max_attempts}, "initialBackoff": {initial}, "maxBackoff": {max},
            "backoffMultiplier": {mult}, "retryableStatusCodes": {codes}}}"#
    )
}

fn a6_example() -> String {
    // gRFC A6, "Retry Policy Capabilities": maxAttempts 4, ".1s", "1s", 2, ["UNAVAILABLE"].
    policy_json("4", r#"".1s""#, r#""1s""#, "2", r#"["UNAVAILABLE"]"#)
}

#[test]
fn a6_example_policy_maps_to_backoff_call_config_and_classifier() {
    let p = GrpcRetryPolicy::from_json(&a6_example()).unwrap();
    assert_eq!(p.max_attempts(), 4);
    let b = p.backoff();
    assert_eq!(b.initial(), Duration::from_millis(100));
    assert_eq!(b.max(), Duration::from_secs(1));
    assert_eq!(b.multiplier(), (2, 1));
    assert_eq!(b.jitter(), Jitter::Proportional { ppm: 200_000 });
    assert_eq!(b.jitter_order(), JitterOrder::CapThenJitter);
    assert_eq!(b.resolution(), Duration::from_nanos(1));
    let call = p.call_config();
    assert_eq!(
        call.max_auto_retries(),
        3,
        "maxAttempts counts the original"
    );
    assert_eq!(call.backoff(), Some(b));
    let codes = p.retryable_codes();
    assert_eq!(codes.len(), 1);
    assert_eq!(codes.classify(&GrpcCode::Unavailable), ErrorClass::RETRY);
    assert_eq!(codes.classify(&14u32), ErrorClass::RETRY);
    for code in GrpcCode::ALL
        .into_iter()
        .filter(|c| *c != GrpcCode::Unavailable)
    {
        assert_eq!(codes.classify(&code), ErrorClass::SURFACE, "{code:?}");
    }
    // A6's delays: min(0.1 s·2^(n−1), 1 s)·U(0.8, 1.2), exact on the 1 ns grid.
    let mut rng = SplitMix64::new(7);
    let mut seq = Backoff::new();
    for n in 1..=8u32 {
        let base: u64 = (100_000_000u64 << (n - 1).min(4)).min(1_000_000_000);
        let factor = 800_000 + below(&mut rng.clone(), 400_000);
        let d = seq.next_delay(b, &mut rng).unwrap();
        let want = u64::try_from(u128::from(base) * u128::from(factor) / 1_000_000).unwrap();
        assert_eq!(duration_to_nanos(d), want, "n = {n}");
    }
}

#[test]
fn grpc_go_parse_retry_policy_valid_case() {
    // grpc/grpc-go service_config_test.go TestParseRetryPolicy "valid": maxAttempts 2, "2s",
    // "10s", 2, ["UNAVAILABLE"] → 2 attempts, 2 s, 10 s, ×2, {Unavailable}.
    let mc = r#"{"name": [{"service": "foo"}], "retryPolicy": {
        "maxAttempts": 2, "initialBackoff": "2s", "maxBackoff": "10s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}"#;
    let p = GrpcRetryPolicy::from_method_config_json(mc)
        .unwrap()
        .unwrap();
    assert_eq!(p.max_attempts(), 2);
    assert_eq!(p.backoff().initial(), Duration::from_secs(2));
    assert_eq!(p.backoff().max(), Duration::from_secs(10));
    assert_eq!(p.backoff().multiplier(), (2, 1));
    assert_eq!(
        p.retryable_codes(),
        GrpcStatusCodes::EMPTY.with(GrpcCode::Unavailable)
    );
    assert_eq!(p.call_config().max_auto_retries(), 1);
    // A method config without a retry policy: no retries.
    let none = r#"{"name": [{"service": "foo"}], "waitForReady": true, "timeout": "1s"}"#;
    assert_eq!(GrpcRetryPolicy::from_method_config_json(none), Ok(None));
}

#[test]
fn grpc_go_parse_retry_policy_error_cases_name_their_key() {
    // grpc/grpc-go service_config_test.go TestParseRetryPolicy: "negative maxAttempts",
    // "missing maxAttempts", "zero initialBackoff", "zero maxBackoff", "zero
    // backoffMultiplier", "no retryable codes" all fail.
    let ok = (r#""2s""#, r#""10s""#, "2", r#"["UNAVAILABLE"]"#);
    let cases: [(String, &str); 6] = [
        (policy_json("-1", ok.0, ok.1, ok.2, ok.3), "maxAttempts"),
        (
            r#"{"initialBackoff": "2s", "maxBackoff": "10s", "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"]}"#
                .to_string(),
            "maxAttempts",
        ),
        (
            policy_json("2", r#""0s""#, ok.1, ok.2, ok.3),
            "initialBackoff",
        ),
        (policy_json("2", ok.0, r#""0s""#, ok.2, ok.3), "maxBackoff"),
        (policy_json("2", ok.0, ok.1, "0", ok.3), "backoffMultiplier"),
        (
            policy_json("2", ok.0, ok.1, ok.2, "[]"),
            "retryableStatusCodes",
        ),
    ];
    for (json, key) in cases {
        let e = GrpcRetryPolicy::from_json(&json).unwrap_err();
        assert_eq!(e.option().name(), key, "{json}");
        assert!(e.to_string().contains(key));
    }
}

#[test]
fn max_attempts_counts_the_original_is_capped_at_5_and_at_least_2() {
    // gRFC A6 "Maximum Number of Retries" (including the original) and "Limits on Retries
    // and Hedges" (client-side maximum 5; higher values are treated as 5).
    let ok = (r#""1s""#, r#""2s""#, "2", r#"["UNAVAILABLE"]"#);
    let attempts = |n: &str| {
        GrpcRetryPolicy::from_json(&policy_json(n, ok.0, ok.1, ok.2, ok.3))
            .map(|p| p.max_attempts())
    };
    assert_eq!(attempts("2"), Ok(2));
    assert_eq!(attempts("5"), Ok(5));
    assert_eq!(attempts("6"), Ok(5));
    assert_eq!(attempts("99999999999999999999999"), Ok(5));
    let e = attempts("1").unwrap_err();
    assert_eq!(
        e,
        ConfigError::OutOfRange {
            option: &opt::MAX_ATTEMPTS,
            got: 1,
            min: 2,
            max: 5,
            unit: "attempts"
        }
    );
    assert_eq!(
        e.to_string(),
        "`maxAttempts` = 1 attempts is outside 2..=5 attempts (`GrpcRetryPolicy::from_json`; \
         gRPC `retryPolicy.maxAttempts`)"
    );
    assert!(attempts("0").is_err());
    assert!(attempts("2.5").is_err());
    assert!(attempts("2e0").is_err());
    assert!(attempts(r#""4""#).is_err());
}

#[test]
fn durations_are_proto_json_strings_parsed_exactly() {
    let ok = ("2", "2", r#"["UNAVAILABLE"]"#);
    let initial = |d: &str| {
        GrpcRetryPolicy::from_json(&policy_json(ok.0, d, r#""1000s""#, ok.1, ok.2))
            .map(|p| p.backoff().initial())
    };
    assert_eq!(initial(r#""0.1s""#), Ok(Duration::from_millis(100)));
    assert_eq!(initial(r#"".01s""#), Ok(Duration::from_millis(10)));
    assert_eq!(
        initial(r#""1.000000001s""#),
        Ok(Duration::from_nanos(1_000_000_001))
    );
    assert_eq!(initial(r#""0.000000001s""#), Ok(Duration::from_nanos(1)));
    assert_eq!(initial(r#""3s""#), Ok(Duration::from_secs(3)));
    for bad in [
        r#""1""#,
        r#""1ms""#,
        r#""-1s""#,
        r#""0.0000000001s""#,
        r#""1e3s""#,
        r#""s""#,
        r#"".s""#,
        "1",
        r#""1.s""#,
    ] {
        let e = initial(bad).unwrap_err();
        assert_eq!(e.option().name(), "initialBackoff", "{bad}");
    }
    // Past u64::MAX ns (584 years) is refused, not wrapped.
    let huge = GrpcRetryPolicy::from_json(&policy_json(
        "2",
        r#""1s""#,
        r#""18446744074s""#,
        "2",
        r#"["UNAVAILABLE"]"#,
    ))
    .unwrap_err();
    assert!(
        matches!(huge, ConfigError::Invalid { option, reason } if option.name() == "maxBackoff" && reason.contains("u64::MAX ns")),
        "{huge}"
    );
    // initialBackoff above maxBackoff: our backoff's rule, named by the JSON keys.
    let inverted =
        GrpcRetryPolicy::from_json(&policy_json("2", r#""3s""#, r#""2s""#, "2", ok.2)).unwrap_err();
    assert_eq!(
        inverted,
        ConfigError::Inverted {
            option: &opt::INITIAL_BACKOFF,
            limit: &opt::MAX_BACKOFF
        }
    );
}

#[test]
fn multiplier_is_an_exact_ratio_and_below_1_is_refused_on_purpose() {
    let mult = |m: &str| {
        GrpcRetryPolicy::from_json(&policy_json("2", r#""1s""#, r#""100s""#, m, r#"[14]"#))
            .map(|p| p.backoff().multiplier())
    };
    assert_eq!(mult("2"), Ok((2, 1)));
    assert_eq!(mult("1.6"), Ok((16, 10)));
    assert_eq!(mult("1.60"), Ok((16, 10)));
    assert_eq!(mult("1.0"), Ok((1, 1)));
    assert_eq!(mult("16e-1"), Ok((16, 10)));
    assert_eq!(mult("0.2e1"), Ok((2, 1)));
    assert_eq!(mult("1.25"), Ok((125, 100)));
    // gRFC A6 allows (0, 1); we refuse, saying why.
    let e = mult("0.5").unwrap_err();
    assert_eq!(e.option().name(), "backoffMultiplier");
    assert!(
        e.to_string().contains("deliberate departure from gRFC A6"),
        "{e}"
    );
    for bad in ["0", "-2", "1.0000000001", "5000000000", r#""2""#] {
        assert_eq!(
            mult(bad).unwrap_err().option().name(),
            "backoffMultiplier",
            "{bad}"
        );
    }
}

#[test]
fn status_codes_are_names_or_numbers_and_must_not_be_empty() {
    let codes = |c: &str| {
        GrpcRetryPolicy::from_json(&policy_json("2", r#""1s""#, r#""2s""#, "2", c))
            .map(|p| p.retryable_codes())
    };
    let all: String = format!(
        "[{}]",
        GrpcCode::ALL
            .iter()
            .map(|c| format!("\"{}\"", c.name()))
            .collect::<alloc::vec::Vec<_>>()
            .join(",")
    );
    assert_eq!(codes(&all).unwrap().len(), 17);
    let mixed = codes(r#"["UNAVAILABLE", 10, "UNAVAILABLE", 4]"#).unwrap();
    assert_eq!(
        mixed.iter().collect::<alloc::vec::Vec<_>>(),
        [
            GrpcCode::DeadlineExceeded,
            GrpcCode::Aborted,
            GrpcCode::Unavailable
        ]
    );
    for bad in [
        r#"["unavailable"]"#,
        r#"["NOPE"]"#,
        "[17]",
        "[-1]",
        "[]",
        r#""UNAVAILABLE""#,
    ] {
        assert_eq!(
            codes(bad).unwrap_err().option().name(),
            "retryableStatusCodes",
            "{bad}"
        );
    }
}

#[test]
fn retry_throttling_truncates_token_ratio_to_three_decimals_exactly() {
    // gRFC A6 "Throttling Configuration" example (maxTokens 10, tokenRatio 0.1), and the
    // issue's 0.5466 → 546 milli-tokens (gRPC keeps three decimals, truncating).
    let t = |json: &str| {
        GrpcRetryThrottling::from_json(json).map(|t| {
            let c = t.throttle_config();
            (c.max_tokens(), c.milli_token_ratio())
        })
    };
    assert_eq!(t(r#"{"maxTokens": 10, "tokenRatio": 0.1}"#), Ok((10, 100)));
    assert_eq!(
        t(r#"{"maxTokens": 10, "tokenRatio": 0.5466}"#),
        Ok((10, 546))
    );
    assert_eq!(
        t(r#"{"maxTokens": 1000, "tokenRatio": 1}"#),
        Ok((1000, 1000))
    );
    assert_eq!(
        t(r#"{"tokenRatio": 0.9999999999999999999999, "maxTokens": 1}"#),
        Ok((1, 999))
    );
    assert_eq!(
        t(r#"{"maxTokens": 3, "tokenRatio": 5466e-4}"#),
        Ok((3, 546))
    );
    let key = |json: &str| {
        GrpcRetryThrottling::from_json(json)
            .unwrap_err()
            .option()
            .name()
    };
    assert_eq!(key(r#"{"maxTokens": 0, "tokenRatio": 0.1}"#), "maxTokens");
    assert_eq!(
        key(r#"{"maxTokens": 1001, "tokenRatio": 0.1}"#),
        "maxTokens"
    );
    assert_eq!(
        key(r#"{"maxTokens": 10.5, "tokenRatio": 0.1}"#),
        "maxTokens"
    );
    assert_eq!(key(r#"{"tokenRatio": 0.1}"#), "maxTokens");
    assert_eq!(key(r#"{"maxTokens": 10, "tokenRatio": 0}"#), "tokenRatio");
    assert_eq!(
        key(r#"{"maxTokens": 10, "tokenRatio": -0.5}"#),
        "tokenRatio"
    );
    assert_eq!(
        key(r#"{"maxTokens": 10, "tokenRatio": 0.0009}"#),
        "tokenRatio"
    );
    assert_eq!(
        key(r#"{"maxTokens": 10, "tokenRatio": 1e10}"#),
        "tokenRatio"
    );
    assert_eq!(key(r#"{"maxTokens": 10}"#), "tokenRatio");
}

#[test]
fn malformed_json_is_refused_as_json_without_panicking() {
    let deep = "[".repeat(10_000);
    let nested_unknown = format!(r#"{{"x": {}1{}}}"#, "[".repeat(100), "]".repeat(100));
    for bad in [
        "",
        "{",
        "{\"maxAttempts\" 2}",
        "{\"maxAttempts\": 2,}",
        "[1]",
        "{\"a\": tru}",
        "{\"a\": \"\\q\"}",
        "{\"a\": \"\u{1}\"}",
        "{} x",
        "{\"a\": 01}",
        "{\"a\": 1.}",
        deep.as_str(),
        nested_unknown.as_str(),
    ] {
        let e = GrpcRetryPolicy::from_json(bad).unwrap_err();
        assert_eq!(e.option().name(), "json", "{bad:.40}");
        assert_eq!(
            GrpcRetryThrottling::from_json(bad).unwrap_err().option(),
            &opt::THROTTLING_JSON,
            "{bad:.40}"
        );
        assert!(GrpcRetryPolicy::from_method_config_json(bad).is_err());
    }
    // Unknown keys of every JSON kind are skipped; keys match in any case and in snake case.
    let lenient = r#"{"X": [1, {"y": null}, true, false, "s\"\u00e9"], "MaxAttempts": 3,
        "initial_backoff": "1s", "MAXBACKOFF": "2s", "backoff_multiplier": 2,
        "RetryableStatusCodes": ["ABORTED"]}"#;
    assert_eq!(
        GrpcRetryPolicy::from_json(lenient).map(|p| p.max_attempts()),
        Ok(3)
    );
    // Truncated inputs of a valid policy: every prefix is an error, never a panic.
    let full = a6_example();
    for end in 0..full.len() {
        if full.is_char_boundary(end) {
            assert!(GrpcRetryPolicy::from_json(&full[..end]).is_err(), "{end}");
        }
    }
}

#[test]
fn status_code_set_is_a_17_bit_no_alloc_set() {
    let mut set = GrpcStatusCodes::EMPTY;
    assert!(set.is_empty());
    for c in GrpcCode::ALL {
        assert!(!set.contains(c));
        set = set.with(c);
        assert!(set.contains(c));
        assert_eq!(GrpcCode::from_u32(c as u32), Some(c));
        assert_eq!(GrpcCode::from_name(c.name()), Some(c));
    }
    assert_eq!(set.len(), 17);
    assert_eq!(set.classify(&17u32), ErrorClass::SURFACE);
    assert_eq!(core::mem::size_of::<GrpcStatusCodes>(), 4);
}
