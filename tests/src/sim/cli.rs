//! Command-line parsing and dispatch for the `sim` binary.

use std::time::Duration;

/// The scenarios, as named on the command line.
pub const SCENARIOS: [&str; 7] = [
    "disk", "kv", "reads", "lockstep", "failover", "capacity", "all",
];

/// Usage text.
pub const USAGE: &str =
    "usage: sim <disk|kv|reads|lockstep|failover|capacity|all> [--seed N] [--scale X] [--svg PATH]
  --seed N     u64 seed for every generator (default 1)
  --scale X    size factor in (0, 1] applied to the fleet/load (default 1 = full scale)
  --svg PATH   lockstep (and all): write the arrival histogram as SVG to PATH; capacity: the
               window limits and latencies over time";

/// Parsed options.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Scenario name (one of [`SCENARIOS`]).
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Scale factor.
    pub scale: f64,
    /// Where to write the lockstep (or capacity) SVG.
    pub svg: Option<String>,
}

/// Parse the arguments after the program name.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Options, String> {
    let mut it = args.into_iter();
    let mut scenario = None;
    let mut seed = 1u64;
    let mut scale = 1.0f64;
    let mut svg = None;
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--seed" => {
                let v = value("--seed")?;
                seed = v
                    .parse()
                    .map_err(|_| format!("--seed: `{v}` is not an unsigned 64-bit integer"))?;
            }
            "--scale" => {
                let v = value("--scale")?;
                scale = v
                    .parse()
                    .map_err(|_| format!("--scale: `{v}` is not a number"))?;
                if !(scale > 0.0 && scale <= 1.0) {
                    return Err(format!("--scale: {v} is outside (0, 1]"));
                }
            }
            "--svg" => svg = Some(value("--svg")?),
            flag if flag.starts_with('-') => return Err(format!("unknown flag `{flag}`")),
            name => {
                if scenario.is_some() {
                    return Err(format!(
                        "unexpected argument `{name}` (one scenario at a time)"
                    ));
                }
                if !SCENARIOS.contains(&name) {
                    return Err(format!("unknown scenario `{name}`"));
                }
                scenario = Some(name.to_string());
            }
        }
    }
    let scenario = scenario.ok_or_else(|| "missing scenario".to_string())?;
    if svg.is_some() && !matches!(scenario.as_str(), "lockstep" | "capacity" | "all") {
        return Err("--svg applies to the lockstep and capacity scenarios only".into());
    }
    Ok(Options {
        scenario,
        seed,
        scale,
        svg,
    })
}

/// Run the chosen scenario(s) and return the printed text (and the SVG, for lockstep or
/// capacity).
pub fn run(o: &Options) -> (String, Option<String>) {
    let mut out = String::new();
    let mut svg = None;
    let all = o.scenario == "all";
    let header = |name: &str| format!("$ sim {name} --seed {} --scale {}\n", o.seed, o.scale);
    if all || o.scenario == "disk" {
        out += &header("disk");
        out += &super::disk::compare(&super::disk::DiskParams::single(), o.seed)
            .table()
            .to_string();
        out += "\n";
        out += &super::disk::compare(&super::disk::DiskParams::fleet(o.scale), o.seed)
            .table()
            .to_string();
        out += "\n";
    }
    if all || o.scenario == "kv" {
        out += &header("kv");
        out += &super::kv::compare(&super::kv::KvParams::full(o.scale), o.seed)
            .table()
            .to_string();
        out += "\n";
    }
    if all || o.scenario == "reads" {
        out += &header("reads");
        out += &super::reads::compare(&super::reads::ReadParams::full(o.scale), o.seed)
            .table()
            .to_string();
        out += "\n";
    }
    if all || o.scenario == "lockstep" {
        out += &header("lockstep");
        let r = super::lockstep::compare(&super::lockstep::LockstepParams::full(o.scale), o.seed);
        out += &r.table().to_string();
        out += "\n";
        svg = Some(r.svg(Duration::from_secs(40)));
    }
    if all || o.scenario == "capacity" {
        out += &header("capacity");
        // `--scale` below 1 shortens the phases (the CI-sized run is `CapacityParams::ci`).
        let mut p = super::capacity::CapacityParams::full();
        if o.scale < 1.0 {
            p.phase = p.phase.mul_f64(o.scale.max(0.05));
            p.settle = p.settle.mul_f64(o.scale.max(0.05));
        }
        let r = super::capacity::compare(&p, o.seed);
        out += &r.table().to_string();
        out += "\n";
        out += &r.candidates_table().to_string();
        out += "\n";
        if o.scenario == "capacity" {
            svg = Some(r.svg());
        }
    }
    if all || o.scenario == "failover" {
        out += &header("failover");
        out += &super::failover::compare(&super::failover::FailoverParams::full(o.scale), o.seed)
            .table()
            .to_string();
        out += "\n";
    }
    (out, svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_scenario_seed_and_scale() {
        let o = parse(args("kv --seed 7 --scale 0.5")).unwrap();
        assert_eq!((o.scenario.as_str(), o.seed, o.scale), ("kv", 7, 0.5));
    }

    #[test]
    fn rejects_bad_flags_with_a_message_naming_them() {
        assert!(parse(args("kv --sed 7")).unwrap_err().contains("--sed"));
        assert!(
            parse(args("kv --seed"))
                .unwrap_err()
                .contains("needs a value")
        );
        assert!(parse(args("kv --seed -1")).unwrap_err().contains("-1"));
        assert!(parse(args("kv --scale 0")).unwrap_err().contains("outside"));
        assert!(parse(args("kv --scale 2")).unwrap_err().contains("outside"));
        assert!(
            parse(args("kv --scale x"))
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            parse(args("disks"))
                .unwrap_err()
                .contains("unknown scenario")
        );
        assert!(parse(args("")).unwrap_err().contains("missing scenario"));
        assert!(
            parse(args("kv reads"))
                .unwrap_err()
                .contains("one scenario")
        );
        assert!(
            parse(args("kv --svg x.svg"))
                .unwrap_err()
                .contains("lockstep")
        );
    }
}
