//! retcd's robustness harness, the library half (the scenarios are
//! `tests/tests/robustness*.rs`, the runner `tests/harness/robustness.rs`;
//! see `docs/robustness.md`):
//!
//! * [`proxy`]: a userspace TCP proxy in front of peer ports — blackhole,
//!   delay, drop, per direction;
//! * [`traffic`]: seeded concurrent clients with unique values recording a
//!   [`history::History`] (call/return times, unknown outcomes) and
//!   watchers recording their streams;
//! * [`linearizability`]: a WGL/porcupine-style search over [`model`] (etcd's
//!   key space with revisions and leases) with the watch history as oracle,
//!   after a direct revision-order check, reporting a minimal failing prefix;
//! * [`patch`]: unknown outcomes decided or bounded with the watch history
//!   (etcd's `patchedOperationHistory` and more);
//! * [`checks`]: every check of a finished run on its [`checks::RunRecord`]
//!   (saved as JSON, re-checked offline with the `check_dump` example);
//! * [`watch`]: ordered, unique, atomic, reliable, resumable, bookmarkable,
//!   prev_kv and filter checks, against each other and the KV history;
//! * [`lease`]: a lease client keeping a lease alive through the faults,
//!   and the check that its key never expires early nor late;
//! * [`seed`]: the run's seed (printed; `RETCD_ROBUSTNESS_SEED` replays it).

pub mod checks;
pub mod history;
pub mod lease;
pub mod linearizability;
pub mod model;
pub mod patch;
pub mod proxy;
mod search;
pub mod seed;
pub mod traffic;
pub mod watch;

#[cfg(test)]
mod checker_tests;
#[cfg(test)]
mod long_history_tests;
