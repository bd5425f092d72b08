//! The README's producer snippet is the producer example's code, line for line, so the README
//! cannot drift from what CI runs.

const README: &str = include_str!("../../README.md");
const PRODUCER: &str = include_str!("../../runtime-tokio/examples/producer.rs");

/// The first `rust,ignore` code block after the producer heading.
fn snippet() -> Vec<&'static str> {
    let section = README
        .split("## Example: a producer on tokio")
        .nth(1)
        .expect("the README has the producer section");
    let code = section
        .split("```rust,ignore\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("the section has a rust block");
    code.lines().collect()
}

#[test]
fn the_readme_producer_is_the_examples_main_in_order() {
    let lines = snippet();
    assert!(
        lines.len() >= 10,
        "the snippet shrank to {} lines",
        lines.len()
    );
    let example: Vec<&str> = PRODUCER.lines().map(str::trim).collect();
    let mut at = 0;
    for line in lines {
        let line = line.trim();
        let found = example[at..].iter().position(|l| *l == line);
        let Some(offset) = found else {
            panic!("README line not in producer.rs (in order): {line:?}");
        };
        at += offset + 1;
    }
}
