//! The README's example snippets are the examples' code, line for line and in order, so the
//! README cannot drift from what CI runs.

const README: &str = include_str!("../../README.md");
const PRODUCER: &str = include_str!("../../runtime-tokio/examples/producer.rs");
const READER: &str = include_str!("../../runtime-tokio/examples/reader.rs");
const FLUSS_SENDER: &str = include_str!("../../runtime-tokio/examples/fluss_sender.rs");
const OXIA_SHARD: &str = include_str!("../../runtime-tokio/examples/oxia_shard.rs");
const TOWER_TCP: &str = include_str!("tower_tcp.rs");
const TRACING_EVENTS: &str = include_str!("tracing_events.rs");
const SERDE_CONFIGS: &str = include_str!("serde_configs.rs");

/// The first `rust,ignore` code block after `heading`.
fn snippet(heading: &str) -> Vec<&'static str> {
    let section = README
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("the README has the section {heading:?}"));
    let code = section
        .split("```rust,ignore\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the section has a rust block");
    code.lines().collect()
}

/// Every non-blank line of the snippet (trailing `//` notes of the README removed) is a line
/// of the example, in the same order.
fn assert_excerpt(heading: &str, example: &str) {
    let lines = snippet(heading);
    assert!(
        lines.len() >= 8,
        "the snippet shrank to {} lines",
        lines.len()
    );
    let example: Vec<&str> = example.lines().map(str::trim).collect();
    let mut at = 0;
    for line in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        let found = example[at..].iter().position(|l| {
            *l == line
                || line
                    .split(" // ")
                    .next()
                    .is_some_and(|code| *l == code.trim_end())
        });
        let Some(offset) = found else {
            panic!("README line not in the example (in order): {line:?}");
        };
        at += offset + 1;
    }
}

#[test]
fn the_readme_producer_is_the_producer_examples_code_in_order() {
    assert_excerpt("## Example: a producer on tokio", PRODUCER);
}

#[test]
fn the_readme_reader_is_the_reader_examples_code_in_order() {
    assert_excerpt("## Example: a sharded reader", READER);
}

#[test]
fn the_readme_sender_task_is_the_fluss_sender_examples_code_in_order() {
    assert_excerpt("### A sender task that owns a `WriteGate`", FLUSS_SENDER);
}

#[test]
fn the_readme_shard_object_is_the_oxia_shard_examples_code_in_order() {
    assert_excerpt(
        "### A per-shard object that owns a `SingleWindow`",
        OXIA_SHARD,
    );
}

#[test]
fn the_readme_tower_stack_is_the_tcp_tests_code_in_order() {
    assert_excerpt("### Example: the tower layers, stacked", TOWER_TCP);
}

#[test]
fn the_readme_tracing_example_is_the_tracing_tests_code_in_order() {
    assert_excerpt(
        "### Example: `tracing` events from a handle",
        TRACING_EVENTS,
    );
}

#[test]
fn the_readme_serde_example_is_the_serde_tests_code_in_order() {
    assert_excerpt("### Example: a config file through `serde`", SERDE_CONFIGS);
}
