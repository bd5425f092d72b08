//! The simulator's command line: `sim <scenario> [--seed N] [--scale X] [--svg PATH]`.
//!
//! Prints one table per scenario (naive client against ours); see `docs/simulation.md`.
//! `-h`/`--help` anywhere on the line prints the usage on stdout and exits 0; a bad flag
//! prints `sim: …` and the usage on stderr and exits 2.

use std::process::ExitCode;

use throttle_tests::sim::cli;

/// Whether the command line asks for help: `-h` or `--help` in any position.
fn wants_help(args: &[String]) -> bool {
    args.iter().any(|a| a == "-h" || a == "--help")
}

/// The help text: what the binary does, then the usage.
fn help() -> String {
    format!(
        "sim: the deterministic simulator of throttle's scenarios; each prints a table of the \
         naive client against ours (docs/simulation.md).\n\n{}\n  -h, --help   print this help",
        cli::USAGE
    )
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if wants_help(&args) {
        println!("{}", help());
        return ExitCode::SUCCESS;
    }
    let opts = match cli::parse(args) {
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
