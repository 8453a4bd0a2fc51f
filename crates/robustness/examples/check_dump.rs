//! Checks a saved run record again (see `retcd_robustness::checks`):
//! `cargo run -p retcd-robustness --example check_dump -- [--budget STEPS] <file.json>...`
//!
//! `--budget` sets the linearizability search's step budget (default
//! `linearizability::DEFAULT_BUDGET`): a record whose check gave up
//! (inconclusive) can be decided with a larger one.

use retcd_robustness::checks::{check_run_with_budget, RunRecord};
use retcd_robustness::linearizability::DEFAULT_BUDGET;

fn main() {
    let mut failed = false;
    let mut budget = DEFAULT_BUDGET;
    let mut args = std::env::args().skip(1);
    let mut paths = Vec::new();
    while let Some(a) = args.next() {
        if a == "--budget" {
            let v = args.next().expect("--budget needs a number of steps");
            budget = v.parse().unwrap_or_else(|e| panic!("--budget {v}: {e}"));
        } else {
            paths.push(a);
        }
    }
    for path in paths {
        let rec = RunRecord::load(std::path::Path::new(&path))
            .unwrap_or_else(|e| panic!("cannot load {path}: {e}"));
        let out = check_run_with_budget(&rec, budget);
        println!(
            "{path}: {} seed {}: {} ops, {} unknown, {} left after patching; linearizability in {:?} ({:?}): {}",
            rec.name,
            rec.seed,
            out.ops,
            out.unknown_before,
            out.unknown_after,
            out.lin_time,
            out.lin_stats,
            if out.violations.is_empty() { "OK".to_string() } else { format!("{} problem(s)", out.violations.len()) }
        );
        for v in &out.violations {
            println!("  {v}");
        }
        failed |= !out.violations.is_empty();
    }
    std::process::exit(i32::from(failed));
}
