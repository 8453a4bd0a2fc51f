//! Prometheus metrics under etcd 3.5's names, labels, buckets and help
//! texts, served at `/metrics`.
//!
//! One process-wide set ([`global`]), as etcd registers its metrics in the
//! Go client's default registry. Counters and histograms are bumped where
//! the thing happens (raft thread: WAL, backend commits, proposals, apply;
//! peer transport; the gRPC layer in `api::grpc_metrics`; lease and
//! maintenance calls); gauges that mirror state (leader, sizes, key count,
//! process figures) are refreshed when `/metrics` is scraped.
//!
//! Labelled families used on hot paths hand out their children once (the
//! gRPC method table, per-peer children held by the peer's sender task),
//! so no request looks labels up.

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Counter, Encoder, Gauge, Histogram, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use retcd_api::etcdserverpb::{request_op, TxnRequest};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{LazyLock, OnceLock};

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static M: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &M
}

static EXTENSIVE: AtomicBool = AtomicBool::new(false);

/// `--metrics extensive`: also export `grpc_server_handling_seconds` (etcd
/// calls `grpc_prometheus.EnableHandlingTimeHistogram()`). Call before the
/// client port serves; `basic` (false) is the default.
pub fn set_extensive(on: bool) {
    EXTENSIVE.store(on, Ordering::Relaxed);
    if on {
        let m = global();
        // registered at most once (a second call finds it registered)
        let _ = m
            .registry
            .register(Box::new(m.grpc.handling_seconds.clone()));
    }
}

/// Whether `--metrics extensive` is on.
pub fn extensive() -> bool {
    EXTENSIVE.load(Ordering::Relaxed)
}

/// The version etcd reports in `etcd_server_go_version`: retcd puts the
/// Rust compiler it was built with there (`rust1.89.0`).
pub const SERVER_GO_VERSION: &str = concat!("rust", env!("RETCD_RUSTC_VERSION"));

pub struct Metrics {
    registry: Registry,
    /// Serializes scrapes (the process figures are set, not added).
    render_lock: parking_lot::Mutex<()>,
    // ---- etcd_disk
    /// `etcd_disk_wal_fsync_duration_seconds`: time of one WAL save (write
    /// + its single fdatasync), observed once per Ready that writes.
    pub wal_fsync: Histogram,
    /// `etcd_disk_wal_write_bytes_total` (a gauge in etcd 3.5).
    pub wal_write_bytes: IntGauge,
    /// `etcd_disk_backend_commit_duration_seconds`: backend commits.
    pub backend_commit: Histogram,
    pub backend_defrag: Histogram,
    pub backend_snapshot: Histogram,
    pub defrag_inflight: IntGauge,
    // ---- etcd_snap, etcd_debugging_snap
    /// `etcd_snap_db_save_total_duration_seconds`: a follower restoring the
    /// leader's store.
    pub snap_db_save_total: Histogram,
    pub snap_db_fsync: Histogram,
    /// `etcd_snap_fsync_duration_seconds`: the snapshot record's WAL save
    /// (retcd keeps raft snapshots in the WAL, there is no .snap file).
    pub snap_fsync: Histogram,
    pub snap_save_total: Histogram,
    pub snap_save_marshalling: Histogram,
    // ---- etcd_server
    pub proposals_committed: IntGauge,
    pub proposals_applied: IntGauge,
    pub proposals_pending: IntGauge,
    pub proposals_failed: IntCounter,
    pub leader_changes: IntCounter,
    pub has_leader: IntGauge,
    pub is_leader: IntGauge,
    pub is_learner: IntGauge,
    pub quota_backend_bytes: IntGauge,
    pub slow_apply: IntCounter,
    pub slow_read_indexes: IntCounter,
    pub read_indexes_failed: IntCounter,
    pub heartbeat_send_failures: IntCounter,
    pub health_success: IntCounter,
    pub health_failures: IntCounter,
    pub learner_promote_successes: IntCounter,
    learner_promote_failures: IntCounterVec,
    pub snapshot_apply_in_progress: IntGauge,
    pub lease_expired: IntCounter,
    server_id: IntGaugeVec,
    healthcheck: IntGaugeVec,
    healthchecks_total: IntCounterVec,
    /// `etcd_server_client_requests_total{type,client_api_version}`.
    pub client_requests: ClientRequests,
    // ---- etcd_mvcc, etcd_debugging_mvcc
    pub db_total_size: IntGauge,
    pub db_total_size_in_use: IntGauge,
    pub db_open_read_transactions: IntGauge,
    pub put_total: IntCounter,
    pub delete_total: IntCounter,
    pub range_total: IntCounter,
    pub range_total_debug: IntCounter,
    pub txn_total: IntCounter,
    pub total_put_size: IntGauge,
    pub hash_duration: Histogram,
    pub hash_rev_duration: Histogram,
    pub current_revision: IntGauge,
    pub compact_revision: IntGauge,
    pub keys_total: IntGauge,
    pub watch_streams: IntGauge,
    pub watchers: IntGauge,
    pub slow_watchers: IntGauge,
    pub events_total: IntCounter,
    pub pending_events: IntGauge,
    /// `etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds`:
    /// one observation per background deletion batch (how long it held
    /// the backend's writer).
    pub db_compaction_pause_ms: Histogram,
    /// `etcd_debugging_mvcc_db_compaction_total_duration_milliseconds`.
    pub db_compaction_total_ms: Histogram,
    /// `etcd_debugging_mvcc_db_compaction_keys_total`: rows deleted by
    /// compactions (added per batch; etcd adds once per compaction).
    pub db_compaction_keys: IntCounter,
    /// `etcd_debugging_mvcc_db_compaction_last`: unix time of the last
    /// finished compaction.
    pub db_compaction_last: Gauge,
    /// `etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds`.
    pub index_compaction_pause_ms: Histogram,
    // ---- etcd_debugging_lease
    pub lease_granted: IntCounter,
    pub lease_revoked: IntCounter,
    pub lease_renewed: IntCounter,
    pub lease_ttl: Histogram,
    // ---- etcd_network
    pub client_grpc_sent_bytes: IntCounter,
    pub client_grpc_received_bytes: IntCounter,
    peer_sent_bytes: IntCounterVec,
    peer_received_bytes: IntCounterVec,
    peer_sent_failures: IntCounterVec,
    peer_received_failures: IntCounterVec,
    peer_rtt: HistogramVec,
    active_peers: IntGaugeVec,
    disconnected_peers: IntCounterVec,
    // ---- grpc_server
    pub grpc: GrpcFamilies,
    process: Process,
}

/// go-grpc-prometheus's server families.
pub struct GrpcFamilies {
    pub started: IntCounterVec,
    pub handled: IntCounterVec,
    pub msg_received: IntCounterVec,
    pub msg_sent: IntCounterVec,
    /// Registered by [`set_extensive`] only.
    pub handling_seconds: HistogramVec,
}

/// `etcd_server_client_requests_total` children for the versions clients
/// send (`client-api-version` metadata; "unknown" without it), created on
/// first use: etcd's vector has a child only for what clients sent.
pub struct ClientRequests {
    vec: IntCounterVec,
    common: [(&'static str, OnceLock<IntCounter>, OnceLock<IntCounter>); 5],
}

impl ClientRequests {
    fn new(vec: IntCounterVec) -> ClientRequests {
        let c = |v| (v, OnceLock::new(), OnceLock::new());
        ClientRequests {
            vec,
            common: [c("3.5"), c("3.4"), c("3.6"), c("3.3"), c("unknown")],
        }
    }

    /// One request of `stream` (else unary) type from a client saying
    /// `version`.
    pub fn inc(&self, stream: bool, version: &str) {
        let ty = if stream { "stream" } else { "unary" };
        for (v, unary, streams) in &self.common {
            if *v == version {
                let cell = if stream { streams } else { unary };
                return cell
                    .get_or_init(|| self.vec.with_label_values(&[ty, v]))
                    .inc();
            }
        }
        // a version not seen before: the rare slow path
        self.vec.with_label_values(&[ty, version]).inc();
    }
}

/// The children of one peer's families (held by whoever bumps them).
#[derive(Clone)]
pub struct PeerMetrics {
    pub sent_bytes: IntCounter,
    pub sent_failures: IntCounterVec,
    pub rtt: Histogram,
    active: IntGauge,
    disconnected: IntCounterVec,
    to: String,
    local: String,
}

impl PeerMetrics {
    /// A message to this peer could not be sent (etcd creates the child on
    /// the first failure only).
    pub fn send_failed(&self, n: u64) {
        self.sent_failures.with_label_values(&[&self.to]).inc_by(n);
    }
    /// The stream to the peer came up.
    pub fn activated(&self) {
        self.active.inc();
    }
    /// The stream to the peer went down.
    pub fn deactivated(&self) {
        self.active.dec();
        self.disconnected
            .with_label_values(&[&self.local, &self.to])
            .inc();
    }
}

/// The receiving side's children for one sending peer.
pub struct PeerRecvMetrics {
    pub received_bytes: IntCounter,
    failures: IntCounterVec,
    from: String,
}

impl PeerRecvMetrics {
    pub fn failed(&self) {
        self.failures.with_label_values(&[&self.from]).inc();
    }
}

fn opts(ns: &str, subsystem: &str, name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(ns).subsystem(subsystem)
}

fn exp(start: f64, count: usize) -> Vec<f64> {
    exponential_buckets(start, 2.0, count).expect("valid buckets")
}

struct Reg<'a>(&'a Registry);

impl Reg<'_> {
    fn add<C: Collector + Clone + 'static>(&self, c: C) -> C {
        self.0.register(Box::new(c.clone())).expect("unique metric");
        c
    }
    fn hist(&self, ns: &str, sub: &str, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
        self.add(
            Histogram::with_opts(
                HistogramOpts::new(name, help)
                    .namespace(ns)
                    .subsystem(sub)
                    .buckets(buckets),
            )
            .expect("valid histogram"),
        )
    }
    fn gauge(&self, ns: &str, sub: &str, name: &str, help: &str) -> IntGauge {
        self.add(IntGauge::with_opts(opts(ns, sub, name, help)).expect("valid gauge"))
    }
    fn counter(&self, ns: &str, sub: &str, name: &str, help: &str) -> IntCounter {
        self.add(IntCounter::with_opts(opts(ns, sub, name, help)).expect("valid counter"))
    }
    fn counter_vec(
        &self,
        ns: &str,
        sub: &str,
        name: &str,
        help: &str,
        l: &[&str],
    ) -> IntCounterVec {
        self.add(IntCounterVec::new(opts(ns, sub, name, help), l).expect("valid counter vec"))
    }
    fn gauge_vec(&self, ns: &str, sub: &str, name: &str, help: &str, l: &[&str]) -> IntGaugeVec {
        self.add(IntGaugeVec::new(opts(ns, sub, name, help), l).expect("valid gauge vec"))
    }
}

/// etcd's `api.Version` style "major.minor" of a version string.
fn major_minor(v: &str) -> &str {
    match v.match_indices('.').nth(1) {
        Some((i, _)) => &v[..i],
        None => v,
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = Reg(&registry);
        let (e, d) = ("etcd", "etcd_debugging");
        let info = |ns: &str, sub: &str, name: &str, help: &str, label: &str, value: &str| {
            r.gauge_vec(ns, sub, name, help, &[label])
                .with_label_values(&[value])
                .set(1);
        };
        info(
            e,
            "server",
            "version",
            "Which version is running. 1 for 'server_version' label with current version.",
            "server_version",
            crate::config::ETCD_API_VERSION,
        );
        info(
            e,
            "server",
            "go_version",
            "Which Go version server is running with. 1 for 'server_go_version' label with current version.",
            "server_go_version",
            SERVER_GO_VERSION,
        );
        info(
            e,
            "cluster",
            "version",
            "Which version is running. 1 for 'cluster_version' label with current cluster version",
            "cluster_version",
            major_minor(crate::config::ETCD_API_VERSION),
        );
        let client_requests = r.counter_vec(
            e,
            "server",
            "client_requests_total",
            "The total number of client requests per client version.",
            &["type", "client_api_version"],
        );
        let client_requests = ClientRequests::new(client_requests);
        let grpc_labels = &["grpc_type", "grpc_service", "grpc_method"];
        let grpc = GrpcFamilies {
            started: r.counter_vec(
                "grpc",
                "server",
                "started_total",
                "Total number of RPCs started on the server.",
                grpc_labels,
            ),
            handled: r.counter_vec(
                "grpc",
                "server",
                "handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            ),
            msg_received: r.counter_vec(
                "grpc",
                "server",
                "msg_received_total",
                "Total number of RPC stream messages received on the server.",
                grpc_labels,
            ),
            msg_sent: r.counter_vec(
                "grpc",
                "server",
                "msg_sent_total",
                "Total number of gRPC stream messages sent by the server.",
                grpc_labels,
            ),
            handling_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "handling_seconds",
                    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
                )
                .namespace("grpc")
                .subsystem("server")
                .buckets(prometheus::DEFAULT_BUCKETS.to_vec()),
                grpc_labels,
            )
            .expect("valid histogram vec"),
        };
        Metrics {
            wal_fsync: r.hist(
                e,
                "disk",
                "wal_fsync_duration_seconds",
                "The latency distributions of fsync called by WAL.",
                exp(0.001, 14),
            ),
            wal_write_bytes: r.gauge(
                e,
                "disk",
                "wal_write_bytes_total",
                "Total number of bytes written in WAL.",
            ),
            backend_commit: r.hist(
                e,
                "disk",
                "backend_commit_duration_seconds",
                "The latency distributions of commit called by backend.",
                exp(0.001, 14),
            ),
            backend_defrag: r.hist(
                e,
                "disk",
                "backend_defrag_duration_seconds",
                "The latency distribution of backend defragmentation.",
                exp(0.1, 13),
            ),
            backend_snapshot: r.hist(
                e,
                "disk",
                "backend_snapshot_duration_seconds",
                "The latency distribution of backend snapshots.",
                exp(0.01, 17),
            ),
            defrag_inflight: r.gauge(
                e,
                "disk",
                "defrag_inflight",
                "Whether or not defrag is active on the member. 1 means active, 0 means not.",
            ),
            snap_db_save_total: r.hist(
                e,
                "snap",
                "db_save_total_duration_seconds",
                "The total latency distributions of v3 snapshot save",
                exp(0.1, 10),
            ),
            snap_db_fsync: r.hist(
                e,
                "snap",
                "db_fsync_duration_seconds",
                "The latency distributions of fsyncing .snap.db file",
                exp(0.001, 14),
            ),
            snap_fsync: r.hist(
                e,
                "snap",
                "fsync_duration_seconds",
                "The latency distributions of fsync called by snap.",
                exp(0.001, 14),
            ),
            snap_save_total: r.hist(
                d,
                "snap",
                "save_total_duration_seconds",
                "The total latency distributions of save called by snapshot.",
                exp(0.001, 14),
            ),
            snap_save_marshalling: r.hist(
                d,
                "snap",
                "save_marshalling_duration_seconds",
                "The marshalling cost distributions of save called by snapshot.",
                exp(0.001, 14),
            ),
            proposals_committed: r.gauge(
                e,
                "server",
                "proposals_committed_total",
                "The total number of consensus proposals committed.",
            ),
            proposals_applied: r.gauge(
                e,
                "server",
                "proposals_applied_total",
                "The total number of consensus proposals applied.",
            ),
            proposals_pending: r.gauge(
                e,
                "server",
                "proposals_pending",
                "The current number of pending proposals to commit.",
            ),
            proposals_failed: r.counter(
                e,
                "server",
                "proposals_failed_total",
                "The total number of failed proposals seen.",
            ),
            leader_changes: r.counter(
                e,
                "server",
                "leader_changes_seen_total",
                "The number of leader changes seen.",
            ),
            has_leader: r.gauge(
                e,
                "server",
                "has_leader",
                "Whether or not a leader exists. 1 is existence, 0 is not.",
            ),
            is_leader: r.gauge(
                e,
                "server",
                "is_leader",
                "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            ),
            is_learner: r.gauge(
                e,
                "server",
                "is_learner",
                "Whether or not this member is a learner. 1 if is, 0 otherwise.",
            ),
            quota_backend_bytes: r.gauge(
                e,
                "server",
                "quota_backend_bytes",
                "Current backend storage quota size in bytes.",
            ),
            slow_apply: r.counter(
                e,
                "server",
                "slow_apply_total",
                "The total number of slow apply requests (likely overloaded from slow disk).",
            ),
            slow_read_indexes: r.counter(
                e,
                "server",
                "slow_read_indexes_total",
                "The total number of pending read indexes not in sync with leader's or timed out read index requests.",
            ),
            read_indexes_failed: r.counter(
                e,
                "server",
                "read_indexes_failed_total",
                "The total number of failed read indexes seen.",
            ),
            heartbeat_send_failures: r.counter(
                e,
                "server",
                "heartbeat_send_failures_total",
                "The total number of leader heartbeat send failures (likely overloaded from slow disk).",
            ),
            health_success: r.counter(
                e,
                "server",
                "health_success",
                "The total number of successful health checks",
            ),
            health_failures: r.counter(
                e,
                "server",
                "health_failures",
                "The total number of failed health checks",
            ),
            learner_promote_successes: r.counter(
                e,
                "server",
                "learner_promote_successes",
                "The total number of successful learner promotions while this member is leader.",
            ),
            learner_promote_failures: r.counter_vec(
                e,
                "server",
                "learner_promote_failures",
                "The total number of failed learner promotions (likely learner not ready) while this member is leader.",
                &["Reason"],
            ),
            snapshot_apply_in_progress: r.gauge(
                e,
                "server",
                "snapshot_apply_in_progress_total",
                "1 if the server is applying the incoming snapshot. 0 if none.",
            ),
            lease_expired: r.counter(
                d,
                "server",
                "lease_expired_total",
                "The total number of expired leases.",
            ),
            server_id: r.gauge_vec(
                e,
                "server",
                "id",
                "Server or member ID in hexadecimal format. 1 for 'server_id' label with current ID.",
                &["server_id"],
            ),
            healthcheck: r.gauge_vec(
                e,
                "server",
                "healthcheck",
                "The result of each kind of healthcheck.",
                &["type", "name"],
            ),
            healthchecks_total: r.counter_vec(
                e,
                "server",
                "healthchecks_total",
                "The total number of each kind of healthcheck.",
                &["type", "name", "status"],
            ),
            client_requests,
            db_total_size: r.gauge(
                e,
                "mvcc",
                "db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            ),
            db_total_size_in_use: r.gauge(
                e,
                "mvcc",
                "db_total_size_in_use_in_bytes",
                "Total size of the underlying database logically in use in bytes.",
            ),
            db_open_read_transactions: r.gauge(
                e,
                "mvcc",
                "db_open_read_transactions",
                "The number of currently open read transactions",
            ),
            put_total: r.counter(
                e,
                "mvcc",
                "put_total",
                "Total number of puts seen by this member.",
            ),
            delete_total: r.counter(
                e,
                "mvcc",
                "delete_total",
                "Total number of deletes seen by this member.",
            ),
            range_total: r.counter(
                e,
                "mvcc",
                "range_total",
                "Total number of ranges seen by this member.",
            ),
            range_total_debug: r.counter(
                d,
                "mvcc",
                "range_total",
                "Total number of ranges seen by this member.",
            ),
            txn_total: r.counter(
                e,
                "mvcc",
                "txn_total",
                "Total number of txns seen by this member.",
            ),
            total_put_size: r.gauge(
                d,
                "mvcc",
                "total_put_size_in_bytes",
                "The total size of put kv pairs seen by this member.",
            ),
            hash_duration: r.hist(
                e,
                "mvcc",
                "hash_duration_seconds",
                "The latency distribution of storage hash operation.",
                exp(0.01, 15),
            ),
            hash_rev_duration: r.hist(
                e,
                "mvcc",
                "hash_rev_duration_seconds",
                "The latency distribution of storage hash by revision operation.",
                exp(0.01, 15),
            ),
            current_revision: r.gauge(d, "mvcc", "current_revision", "The current revision of store."),
            compact_revision: r.gauge(
                d,
                "mvcc",
                "compact_revision",
                "The revision of the last compaction in store.",
            ),
            keys_total: r.gauge(d, "mvcc", "keys_total", "Total number of keys."),
            watch_streams: r.gauge(d, "mvcc", "watch_stream_total", "Total number of watch streams."),
            watchers: r.gauge(d, "mvcc", "watcher_total", "Total number of watchers."),
            slow_watchers: r.gauge(
                d,
                "mvcc",
                "slow_watcher_total",
                "Total number of unsynced slow watchers.",
            ),
            events_total: r.counter(
                d,
                "mvcc",
                "events_total",
                "Total number of events sent by this member.",
            ),
            pending_events: r.gauge(
                d,
                "mvcc",
                "pending_events_total",
                "Total number of pending events to be sent.",
            ),
            // etcd's buckets (mvcc/metrics.go)
            db_compaction_pause_ms: r.hist(
                d,
                "mvcc",
                "db_compaction_pause_duration_milliseconds",
                "Bucketed histogram of db compaction pause duration.",
                exp(1.0, 13),
            ),
            db_compaction_total_ms: r.hist(
                d,
                "mvcc",
                "db_compaction_total_duration_milliseconds",
                "Bucketed histogram of db compaction total duration.",
                exp(100.0, 14),
            ),
            db_compaction_keys: r.counter(
                d,
                "mvcc",
                "db_compaction_keys_total",
                "Total number of db keys compacted.",
            ),
            db_compaction_last: r.add(
                Gauge::with_opts(opts(
                    d,
                    "mvcc",
                    "db_compaction_last",
                    "The unix time of the last db compaction. Resets to 0 on start.",
                ))
                .expect("valid gauge"),
            ),
            index_compaction_pause_ms: r.hist(
                d,
                "mvcc",
                "index_compaction_pause_duration_milliseconds",
                "Bucketed histogram of index compaction pause duration.",
                exp(0.5, 14),
            ),
            lease_granted: r.counter(
                d,
                "lease",
                "granted_total",
                "The total number of granted leases.",
            ),
            lease_revoked: r.counter(
                d,
                "lease",
                "revoked_total",
                "The total number of revoked leases.",
            ),
            lease_renewed: r.counter(
                d,
                "lease",
                "renewed_total",
                "The number of renewed leases seen by the leader.",
            ),
            lease_ttl: r.hist(
                d,
                "lease",
                "ttl_total",
                "Bucketed histogram of lease TTLs.",
                exp(1.0, 24),
            ),
            client_grpc_sent_bytes: r.counter(
                e,
                "network",
                "client_grpc_sent_bytes_total",
                "The total number of bytes sent to grpc clients.",
            ),
            client_grpc_received_bytes: r.counter(
                e,
                "network",
                "client_grpc_received_bytes_total",
                "The total number of bytes received from grpc clients.",
            ),
            peer_sent_bytes: r.counter_vec(
                e,
                "network",
                "peer_sent_bytes_total",
                "The total number of bytes sent to peers.",
                &["To"],
            ),
            peer_received_bytes: r.counter_vec(
                e,
                "network",
                "peer_received_bytes_total",
                "The total number of bytes received from peers.",
                &["From"],
            ),
            peer_sent_failures: r.counter_vec(
                e,
                "network",
                "peer_sent_failures_total",
                "The total number of send failures from peers.",
                &["To"],
            ),
            peer_received_failures: r.counter_vec(
                e,
                "network",
                "peer_received_failures_total",
                "The total number of receive failures from peers.",
                &["From"],
            ),
            peer_rtt: r.add(
                HistogramVec::new(
                    HistogramOpts::new(
                        "peer_round_trip_time_seconds",
                        "Round-Trip-Time histogram between peers",
                    )
                    .namespace(e)
                    .subsystem("network")
                    .buckets(exp(0.0001, 16)),
                    &["To"],
                )
                .expect("valid histogram vec"),
            ),
            active_peers: r.gauge_vec(
                e,
                "network",
                "active_peers",
                "The current number of active peer connections.",
                &["Local", "Remote"],
            ),
            disconnected_peers: r.counter_vec(
                e,
                "network",
                "disconnected_peers_total",
                "The total number of disconnected peers.",
                &["Local", "Remote"],
            ),
            grpc,
            process: Process::new(&r),
            render_lock: parking_lot::Mutex::new(()),
            registry,
        }
    }

    /// The member's id (`etcd_server_id{server_id}`, hex as etcd's
    /// `types.ID`).
    pub fn set_server_id(&self, id: u64) {
        self.server_id.reset();
        self.server_id
            .with_label_values(&[&format!("{id:x}")])
            .set(1);
    }

    /// The children of peer `to`'s sending-side families, for member `local`.
    pub fn peer(&self, local: u64, to: u64) -> PeerMetrics {
        let (to, local) = (format!("{to:x}"), format!("{local:x}"));
        PeerMetrics {
            sent_bytes: self.peer_sent_bytes.with_label_values(&[&to]),
            sent_failures: self.peer_sent_failures.clone(),
            rtt: self.peer_rtt.with_label_values(&[&to]),
            active: self.active_peers.with_label_values(&[&local, &to]),
            disconnected: self.disconnected_peers.clone(),
            to,
            local,
        }
    }

    /// The children of peer `from`'s receiving-side families.
    pub fn peer_recv(&self, from: u64) -> PeerRecvMetrics {
        let from = format!("{from:x}");
        PeerRecvMetrics {
            received_bytes: self.peer_received_bytes.with_label_values(&[&from]),
            failures: self.peer_received_failures.clone(),
            from,
        }
    }

    /// A message to `to` was dropped before any sender task had it.
    pub fn peer_send_failed(&self, to: u64) {
        self.peer_sent_failures
            .with_label_values(&[&format!("{to:x}")])
            .inc();
    }

    /// A learner promotion this member (as leader) refused.
    pub fn learner_promote_failed(&self, reason: &str) {
        self.learner_promote_failures
            .with_label_values(&[reason])
            .inc();
    }

    /// etcd 3.5.11+'s `/livez`, `/readyz` check results:
    /// `etcd_server_healthcheck{type,name}` (1 ok, 0 failed) and
    /// `etcd_server_healthchecks_total{type,name,status}`.
    pub fn healthcheck(&self, ty: &str, name: &str, ok: bool) {
        self.healthcheck
            .with_label_values(&[ty, name])
            .set(ok as i64);
        let status = if ok { "success" } else { "error" };
        self.healthchecks_total
            .with_label_values(&[ty, name, status])
            .inc();
    }

    /// The mvcc counters of one applied write request: etcd counts, per
    /// write txn, its ranges, puts and deletes, and a txn when it did more
    /// than one of them (`metricsTxnWrite.End`).
    pub fn count_put(&self, key_len: usize, value_len: usize) {
        self.put_total.inc();
        self.total_put_size.add((key_len + value_len) as i64);
    }

    pub fn count_delete(&self) {
        self.delete_total.inc();
    }

    /// A range served (alone or in a read-only txn).
    pub fn count_ranges(&self, n: u64) {
        self.range_total.inc_by(n);
        self.range_total_debug.inc_by(n);
    }

    /// A txn's operations, `succeeded` choosing the branch that ran (its
    /// compares are not counted: etcd 3.5.1 reads them outside the
    /// counting txn).
    pub fn count_txn(&self, req: &TxnRequest, succeeded: bool) {
        let mut c = (0u64, 0u64, 0u64);
        count_ops(self, req, succeeded, &mut c);
        let (ranges, puts, deletes) = c;
        if ranges + puts + deletes > 1 {
            self.txn_total.inc();
        }
        self.count_ranges(ranges);
        self.put_total.inc_by(puts);
        self.delete_total.inc_by(deletes);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let _one = self.render_lock.lock();
        self.process.refresh();
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Adds up a txn branch's (and its nested txns' executed branches') ops.
/// Nested txns' branches are not known here (their responses are), so
/// a nested txn counts its success branch.
fn count_ops(m: &Metrics, req: &TxnRequest, succeeded: bool, c: &mut (u64, u64, u64)) {
    let ops = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    for op in ops {
        match &op.request {
            Some(request_op::Request::RequestRange(_)) => c.0 += 1,
            Some(request_op::Request::RequestPut(p)) => {
                c.1 += 1;
                m.total_put_size.add((p.key.len() + p.value.len()) as i64);
            }
            Some(request_op::Request::RequestDeleteRange(_)) => c.2 += 1,
            Some(request_op::Request::RequestTxn(t)) => count_ops(m, t, true, c),
            None => {}
        }
    }
}

/// The Go client's process collector (`process_*`) and etcd's `os_fd_*`,
/// read from /proc when scraped (Linux; elsewhere they stay 0).
struct Process {
    cpu: Counter,
    open_fds: Gauge,
    max_fds: Gauge,
    vmem: Gauge,
    vmem_max: Gauge,
    rss: Gauge,
    start: Gauge,
    fd_used: Gauge,
    fd_limit: Gauge,
}

/// Linux's USER_HZ (what /proc/<pid>/stat counts ticks in) on every
/// architecture retcd is built for.
const CLOCK_TICKS: f64 = 100.0;

impl Process {
    fn new(r: &Reg<'_>) -> Process {
        let g = |ns: &str, name: &str, help: &str| {
            r.add(Gauge::with_opts(Opts::new(name, help).namespace(ns)).expect("valid gauge"))
        };
        let p = "process";
        let proc = Process {
            cpu: r.add(
                Counter::with_opts(Opts::new(
                    "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                ))
                .expect("valid counter"),
            ),
            open_fds: g(p, "open_fds", "Number of open file descriptors."),
            max_fds: g(p, "max_fds", "Maximum number of open file descriptors."),
            vmem: g(p, "virtual_memory_bytes", "Virtual memory size in bytes."),
            vmem_max: g(
                p,
                "virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
            ),
            rss: g(p, "resident_memory_bytes", "Resident memory size in bytes."),
            start: g(
                p,
                "start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
            ),
            fd_used: g("os", "fd_used", "The number of used file descriptors."),
            fd_limit: g("os", "fd_limit", "The file descriptor limit."),
        };
        proc.refresh();
        proc
    }

    fn refresh(&self) {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let stat = read("/proc/self/stat");
        // the fields after the command name, which is in parentheses
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        // field n of stat(5) is fields[n - 3]
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            self.cpu.reset();
            self.cpu.inc_by((utime + stime) / CLOCK_TICKS);
        }
        if let Some(v) = field(23) {
            self.vmem.set(v);
        }
        let status = read("/proc/self/status");
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
                .map(|v| v * 1024.0)
        };
        if let Some(v) = kb("VmRSS:") {
            self.rss.set(v);
        }
        if let (Some(start), Some(btime)) = (
            field(22),
            read("/proc/stat")
                .lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok()),
        ) {
            self.start.set(btime + start / CLOCK_TICKS);
        }
        let limits = read("/proc/self/limits");
        let soft = |name: &str| {
            limits
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| match v.split_whitespace().next()? {
                    "unlimited" => Some(u64::MAX as f64),
                    n => n.parse::<f64>().ok(),
                })
        };
        if let Some(v) = soft("Max open files") {
            self.max_fds.set(v);
            self.fd_limit.set(v);
        }
        if let Some(v) = soft("Max address space") {
            self.vmem_max.set(v);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // (the directory handle itself is one of the entries)
            let n = dir.count().saturating_sub(1) as f64;
            self.open_fds.set(n);
            self.fd_used.set(n);
        }
    }
}

/// Feeds the MVCC compactor's measurements into the metrics above.
pub struct CompactionMetrics {
    pub pause_ms: Histogram,
    pub total_ms: Histogram,
    pub keys: IntCounter,
    pub index_pause_ms: Histogram,
    pub last: Gauge,
}

impl CompactionMetrics {
    pub fn of(m: &Metrics) -> CompactionMetrics {
        CompactionMetrics {
            pause_ms: m.db_compaction_pause_ms.clone(),
            total_ms: m.db_compaction_total_ms.clone(),
            keys: m.db_compaction_keys.clone(),
            index_pause_ms: m.index_compaction_pause_ms.clone(),
            last: m.db_compaction_last.clone(),
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
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.last.set(now.as_secs_f64());
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Client gRPC calls in progress (from the request to the end of the
/// response body). `api::defer_writes` delays a connection's writes, and
/// `raft::Proposer::read_index` a batch's first read, only while other
/// calls are in progress, which may join them.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Client gRPC calls in progress on this member.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Relaxed)
}

/// Counts one call in [`in_flight`] while it lives.
pub(crate) struct InFlight;

impl InFlight {
    pub(crate) fn new() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_process_and_info_families() {
        let m = Metrics::new();
        m.set_server_id(0x2e1259d415f2a040);
        let t = m.render();
        for want in [
            "etcd_server_id{server_id=\"2e1259d415f2a040\"} 1",
            "etcd_cluster_version{cluster_version=\"3.5\"} 1",
            "# TYPE process_cpu_seconds_total counter",
            "# TYPE os_fd_used gauge",
        ] {
            assert!(t.contains(want), "{want} not in\n{t}");
        }
        assert!(!t.contains("grpc_server_handling_seconds"));
    }

    #[test]
    fn test_txn_counts() {
        use retcd_api::etcdserverpb::{Compare, PutRequest, RequestOp};
        let m = Metrics::new();
        let put = RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: b"k".to_vec(),
                value: b"vv".to_vec(),
                ..Default::default()
            })),
        };
        let req = TxnRequest {
            compare: vec![Compare::default()],
            success: vec![put.clone(), put],
            failure: vec![],
        };
        m.count_txn(&req, true);
        assert_eq!(
            (m.txn_total.get(), m.put_total.get(), m.range_total.get()),
            (1, 2, 0)
        );
        assert_eq!(m.total_put_size.get(), 6);
        m.count_txn(&req, false); // compares alone are not a txn
        assert_eq!(m.txn_total.get(), 1);
    }
}
