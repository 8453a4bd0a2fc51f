//! The flags and durations every test file shares: one definition each.
//!
//! A test file picks its whole-test bound from [`limit`] by name, e.g.
//! `use retcd_tests::limit::LONG as LIMIT;`, and passes it to
//! [`crate::bounded`] or [`crate::same_as_etcd`].

use std::time::Duration;

/// etcd's timing flags for fast tests: `--heartbeat-interval 50
/// --election-timeout 500` (ms), ten times faster than etcd's defaults, so
/// elections and failovers finish well within a test's bounds.
pub const FAST: &[&str] = &["--heartbeat-interval", "50", "--election-timeout", "500"];

/// How long a member may take to serve (answer `Status` with a leader)
/// after a start or restart, or to finish a comparable wait (a new leader,
/// a member list that settled).
pub const READY: Duration = Duration::from_secs(60);

/// Bounds for a whole test body, by how much a test file's tests do. Each
/// file names one of these as its `LIMIT`.
pub mod limit {
    use std::time::Duration;

    /// 2 min: one member and a few clients (lock/election, metrics).
    pub const QUICK: Duration = Duration::from_secs(120);
    /// 3 min: one or three members, one scenario (gateway, server API, WAL
    /// damage).
    pub const SHORT: Duration = Duration::from_secs(180);
    /// 4 min: the usual test (auth, cluster, crash, differential, lease,
    /// watch).
    pub const NORMAL: Duration = Duration::from_secs(240);
    /// 5 min: several restarts or membership changes (auth on a cluster,
    /// the benchmark smoke run, maintenance, membership).
    pub const LONG: Duration = Duration::from_secs(300);
    /// 10 min: many clusters or fault seeds (compaction, robustness).
    pub const SLOW: Duration = Duration::from_secs(600);
}
