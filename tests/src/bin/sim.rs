//! tmp
fn main() {
    let a: Vec<f64> = std::env::args()
        .skip(1)
        .map(|s| s.parse().unwrap())
        .collect();
    let p = throttle_tests::sim::reads::ReadParams::full(a[0]);
    let r = throttle_tests::sim::reads::compare(&p, 1);
    println!("{}", r.table());
}
