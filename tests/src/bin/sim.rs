//! The simulator's command line: `sim <scenario> [--seed N] [--scale X] [--svg PATH]`.
//!
//! Prints one table per scenario (naive client against ours); see `docs/simulation.md`.

use std::process::ExitCode;

use throttle_tests::sim::cli;

fn main() -> ExitCode {
    let opts = match cli::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sim: {e}\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    let (text, svg) = cli::run(&opts);
    print!("{text}");
    if let (Some(path), Some(svg)) = (&opts.svg, svg) {
        if let Err(e) = std::fs::write(path, svg) {
            eprintln!("sim: cannot write {path}: {e}");
            return ExitCode::FAILURE;
        }
        println!("wrote {path}");
    }
    ExitCode::SUCCESS
}
