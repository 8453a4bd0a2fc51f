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
    pub watch_streams: IntGauge,
    pub watchers: IntGauge,
    pub slow_watchers: IntGauge,
    pub read_indexes_failed: IntCounter,
    /// `etcd_server_slow_apply_total`.
    pub slow_apply: IntCounter,
    /// `etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds`:
    /// one observation per background deletion batch (how long it held
    /// the backend's writer).
    pub db_compaction_pause_ms: Histogram,
    /// `etcd_debugging_mvcc_db_compaction_total_duration_milliseconds`.
    pub db_compaction_total_ms: Histogram,
    /// `etcd_debugging_mvcc_db_compaction_keys_total`: rows deleted by
    /// compactions (added per batch; etcd adds once per compaction).
    pub db_compaction_keys: IntCounter,
    /// `etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds`.
    pub index_compaction_pause_ms: Histogram,
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
        let hist_ms = |name: &str, help: &str, start: f64, count: usize| {
            let h = Histogram::with_opts(
                HistogramOpts::new(name, help)
                    .namespace("etcd_debugging")
                    .subsystem("mvcc")
                    .buckets(exponential_buckets(start, 2.0, count).expect("valid buckets")),
            )
            .expect("valid histogram");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
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
            watch_streams: gauge(
                "debugging_mvcc",
                "watch_stream_total",
                "Total number of watch streams.",
            ),
            watchers: gauge(
                "debugging_mvcc",
                "watcher_total",
                "Total number of watchers.",
            ),
            slow_watchers: gauge(
                "debugging_mvcc",
                "slow_watcher_total",
                "Total number of unsynced slow watchers.",
            ),
            slow_apply: counter(
                "server",
                "slow_apply_total",
                "The total number of slow apply requests (likely overloaded from slow disk).",
            ),
            read_indexes_failed: counter(
                "server",
                "read_indexes_failed_total",
                "The total number of failed read indexes seen.",
            ),
            // etcd's buckets (mvcc/metrics.go)
            db_compaction_pause_ms: hist_ms(
                "db_compaction_pause_duration_milliseconds",
                "Bucketed histogram of db compaction pause duration.",
                1.0,
                13,
            ),
            db_compaction_total_ms: hist_ms(
                "db_compaction_total_duration_milliseconds",
                "Bucketed histogram of db compaction total duration.",
                100.0,
                14,
            ),
            db_compaction_keys: {
                let c = IntCounter::with_opts(
                    Opts::new(
                        "db_compaction_keys_total",
                        "Total number of db keys compacted.",
                    )
                    .namespace("etcd_debugging")
                    .subsystem("mvcc"),
                )
                .expect("valid counter");
                registry
                    .register(Box::new(c.clone()))
                    .expect("unique metric");
                c
            },
            index_compaction_pause_ms: hist_ms(
                "index_compaction_pause_duration_milliseconds",
                "Bucketed histogram of index compaction pause duration.",
                0.5,
                12,
            ),
            registry,
        }
    }

    /// The text exposition format.
    /// Adds a collector defined elsewhere (e.g. the health endpoints').
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) {
        let _ = self.registry.register(c);
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Feeds the MVCC compactor's measurements into the metrics above.
pub struct CompactionMetrics {
    pub pause_ms: Histogram,
    pub total_ms: Histogram,
    pub keys: IntCounter,
    pub index_pause_ms: Histogram,
}

impl CompactionMetrics {
    pub fn of(m: &Metrics) -> CompactionMetrics {
        CompactionMetrics {
            pause_ms: m.db_compaction_pause_ms.clone(),
            total_ms: m.db_compaction_total_ms.clone(),
            keys: m.db_compaction_keys.clone(),
            index_pause_ms: m.index_compaction_pause_ms.clone(),
        }
    }
}

impl retcd_mvcc::CompactionObserver for CompactionMetrics {
    fn index_compacted(&self, pause: std::time::Duration) {
        self.index_pause_ms.observe(pause.as_secs_f64() * 1000.0);
    }
    fn batch(&self, pause: std::time::Duration, deleted: u64) {
        self.pause_ms.observe(pause.as_secs_f64() * 1000.0);
        self.keys.inc_by(deleted);
    }
    fn finished(&self, _rev: i64, total: std::time::Duration) {
        self.total_ms.observe(total.as_secs_f64() * 1000.0);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
