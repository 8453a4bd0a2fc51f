//! Seeds: every run prints its seed; `RETCD_ROBUSTNESS_SEED=<n>` replays
//! it (the same operations per client and the same fault schedule;
//! timing-dependent interleavings can still differ).

use rand::rngs::StdRng;
use rand::SeedableRng;

/// The seed for a run of `scenario`: `RETCD_ROBUSTNESS_SEED` if set, else
/// `base` (so the short suite is reproducible by default), printed.
pub fn seed_for(scenario: &str, base: u64) -> u64 {
    let seed = std::env::var("RETCD_ROBUSTNESS_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(base);
    eprintln!(
        "robustness: scenario {scenario}: seed {seed} (replay with RETCD_ROBUSTNESS_SEED={seed})"
    );
    seed
}

/// Fresh seeds for long mode (`RETCD_ROBUSTNESS_LONG=<runs>`).
pub fn long_runs() -> usize {
    match std::env::var("RETCD_ROBUSTNESS_LONG") {
        Ok(v) => v.trim().parse().unwrap_or(20),
        Err(_) => 0,
    }
}

/// A random seed from the OS.
pub fn random_seed() -> u64 {
    rand::random()
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}
