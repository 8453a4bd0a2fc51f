//! Checks a saved run record again (see `retcd_robustness::checks`):
//! `cargo run -p retcd-robustness --example check_dump -- <file.json>...`

use retcd_robustness::checks::{check_run, RunRecord};

fn main() {
    let mut failed = false;
    for path in std::env::args().skip(1) {
        let rec = RunRecord::load(std::path::Path::new(&path))
            .unwrap_or_else(|e| panic!("cannot load {path}: {e}"));
        let out = check_run(&rec);
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
