//! The loopback demo: every scenario run twice over real TCP on 127.0.0.1, once with a naive
//! client and once with ours, and a table of what the servers received.
//!
//! ```text
//! cargo run --release -p throttle-tokio --example loopback -- [--scenario S] [--scale X] [--seed N]
//! ```

mod demo;

use demo::report;
use demo::scenario::{self, Client, Params};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = match scenario::parse_args(std::env::args().skip(1)) {
        Ok(Some(opts)) => opts,
        Ok(None) => {
            println!("{}", scenario::USAGE);
            return;
        }
        Err(msg) => {
            eprintln!("error: {msg}\n\n{}", scenario::USAGE);
            std::process::exit(2);
        }
    };
    // The command names the profile this binary was built with.
    println!("{}", scenario::header(&opts, !cfg!(debug_assertions)));
    let mut rows = Vec::new();
    for sc in &opts.scenarios {
        let params = Params::new(*sc, opts.scale, opts.seed);
        for client in [Client::Naive, Client::Ours] {
            eprintln!("running {} / {} …", sc.name(), client.name());
            match scenario::run(&params, client).await {
                Ok(row) => rows.push(row),
                Err(e) => {
                    eprintln!("error: {} / {}: {e}", sc.name(), client.name());
                    std::process::exit(1);
                }
            }
        }
    }
    println!("{}\n", report::table(&rows));
    println!("{}", report::legend());
    println!("Verdict, per scenario (what the servers saw, naive → ours):");
    for pair in rows.chunks(2) {
        if let [naive, ours] = pair {
            if let Some(v) = report::verdict(naive, ours) {
                println!("{v}");
            }
        }
    }
}
