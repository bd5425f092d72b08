//! The simulator's command line: `sim <scenario> [--seed N] [--scale X]`.
fn main() {
    let seed = 1;
    let r =
        throttle_tests::sim::disk::compare(&throttle_tests::sim::disk::DiskParams::single(), seed);
    println!("{}", r.table());
    let r = throttle_tests::sim::disk::compare(
        &throttle_tests::sim::disk::DiskParams::fleet(1.0),
        seed,
    );
    println!("{}", r.table());
}
