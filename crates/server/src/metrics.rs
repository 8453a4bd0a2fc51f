//! Prometheus metrics under etcd's names, served at `/metrics`.
//!
//! The raft thread records WAL and backend commit latencies and proposal
//! counts as they happen; gauges that mirror state (leader, sizes) are
//! refreshed when `/metrics` is scraped.

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    /// `etcd_disk_wal_fsync_duration_seconds`: time of one WAL save (write
    /// + its single fdatasync), observed once per Ready that writes.
    pub wal_fsync: Histogram,
    /// `etcd_disk_backend_commit_duration_seconds`: backend commits.
    pub backend_commit: Histogram,
    pub proposals_committed: IntGauge,
    pub proposals_applied: IntGauge,
    pub proposals_pending: IntGauge,
    pub proposals_failed: IntCounter,
    pub leader_changes: IntCounter,
    pub has_leader: IntGauge,
    pub is_leader: IntGauge,
    pub db_total_size: IntGauge,
    pub db_total_size_in_use: IntGauge,
    pub current_revision: IntGauge,
    pub compact_revision: IntGauge,
    pub read_indexes_failed: IntCounter,
}

fn opts(subsystem: &str, name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace("etcd").subsystem(subsystem)
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let hist = |sub: &str, name: &str, help: &str| {
            let h = Histogram::with_opts(
                HistogramOpts::new(name, help)
                    .namespace("etcd")
                    .subsystem(sub)
                    .buckets(exponential_buckets(0.001, 2.0, 14).expect("valid buckets")),
            )
            .expect("valid histogram");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        let gauge = |sub: &str, name: &str, help: &str| {
            let g = IntGauge::with_opts(opts(sub, name, help)).expect("valid gauge");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let counter = |sub: &str, name: &str, help: &str| {
            let c = IntCounter::with_opts(opts(sub, name, help)).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let info = IntGaugeVec::new(
            opts(
                "server",
                "version",
                "Which version is running. 1 for 'server_version' label with current version.",
            ),
            &["server_version"],
        )
        .expect("valid gauge vec");
        registry
            .register(Box::new(info.clone()))
            .expect("unique metric");
        // Registered once; the registry keeps it.
        info.with_label_values(&[crate::config::ETCD_API_VERSION])
            .set(1);
        Metrics {
            wal_fsync: hist(
                "disk",
                "wal_fsync_duration_seconds",
                "The latency distributions of fsync called by WAL.",
            ),
            backend_commit: hist(
                "disk",
                "backend_commit_duration_seconds",
                "The latency distributions of commit called by backend.",
            ),
            proposals_committed: gauge(
                "server",
                "proposals_committed_total",
                "The total number of consensus proposals committed.",
            ),
            proposals_applied: gauge(
                "server",
                "proposals_applied_total",
                "The total number of consensus proposals applied.",
            ),
            proposals_pending: gauge(
                "server",
                "proposals_pending",
                "The current number of pending proposals to commit.",
            ),
            proposals_failed: counter(
                "server",
                "proposals_failed_total",
                "The total number of failed proposals seen.",
            ),
            leader_changes: counter(
                "server",
                "leader_changes_seen_total",
                "The number of leader changes seen.",
            ),
            has_leader: gauge(
                "server",
                "has_leader",
                "Whether or not a leader exists. 1 is existence, 0 is not.",
            ),
            is_leader: gauge(
                "server",
                "is_leader",
                "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            ),
            db_total_size: gauge(
                "mvcc",
                "db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            ),
            db_total_size_in_use: gauge(
                "mvcc",
                "db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
            ),
            current_revision: gauge(
                "debugging_mvcc",
                "current_revision",
                "The current revision of store.",
            ),
            compact_revision: gauge(
                "debugging_mvcc",
                "compact_revision",
                "The revision of the last compaction in store.",
            ),
            read_indexes_failed: counter(
                "server",
                "read_indexes_failed_total",
                "The total number of failed read indexes seen.",
            ),
            registry,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
