//! `/metrics` with etcd's metric names, and what they prove about the write
//! path: concurrent puts share WAL fsyncs (one fdatasync per raft Ready,
//! never one per request). Runs against both flavours: etcd batches too.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use retcd_tests::limit::QUICK as LIMIT;
use retcd_tests::{bounded, retry_until, test_flavor, Cluster};

/// GET `path` on the member's client port over plain HTTP/1.1.
fn http_get(endpoint: &str, path: &str) -> String {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read response");
    out
}

/// The value of an unlabelled sample, e.g. `etcd_server_has_leader`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok())?
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_etcd_names_and_wal_fsyncs_are_shared() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ep = c.endpoints()[0].clone();
        let before = http_get(&ep, "/metrics");
        assert!(before.starts_with("HTTP/1.1 200"), "{before}");
        for name in [
            "etcd_server_has_leader",
            "etcd_server_is_leader",
            "etcd_server_proposals_committed_total",
            "etcd_server_proposals_applied_total",
            "etcd_server_proposals_pending",
            "etcd_server_proposals_failed_total",
            "etcd_server_leader_changes_seen_total",
            "etcd_mvcc_db_total_size_in_bytes",
            "etcd_disk_wal_fsync_duration_seconds_count",
            "etcd_disk_backend_commit_duration_seconds_count",
            "etcd_debugging_mvcc_current_revision",
        ] {
            assert!(sample(&before, name).is_some(), "metric {name} missing");
        }
        assert_eq!(sample(&before, "etcd_server_has_leader"), Some(1.0));
        assert_eq!(sample(&before, "etcd_server_is_leader"), Some(1.0));

        let fsyncs_before = sample(&before, "etcd_disk_wal_fsync_duration_seconds_count").unwrap();
        let applied_before = sample(&before, "etcd_server_proposals_applied_total").unwrap();
        const CLIENTS: usize = 64;
        const PER_CLIENT: usize = 10;
        let client = c.client(0).await.expect("client");
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let mut cl = client.clone();
                tokio::spawn(async move {
                    for j in 0..PER_CLIENT {
                        cl.put(format!("gc/{i}/{j}"), "v", None).await.expect("put");
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("writer");
        }
        let after = http_get(&ep, "/metrics");
        let fsyncs =
            sample(&after, "etcd_disk_wal_fsync_duration_seconds_count").unwrap() - fsyncs_before;
        let applied =
            sample(&after, "etcd_server_proposals_applied_total").unwrap() - applied_before;
        let puts = (CLIENTS * PER_CLIENT) as f64;
        assert!(applied >= puts, "applied {applied} < puts {puts}");
        eprintln!("{puts} concurrent puts took {fsyncs} WAL fsyncs");
        // Group commit: 64 writers in flight share fsyncs. One fsync per put
        // would give fsyncs == puts.
        assert!(
            fsyncs < puts * 0.75,
            "{fsyncs} WAL fsyncs for {puts} concurrent puts: no group commit"
        );
        let rev = sample(&after, "etcd_debugging_mvcc_current_revision").unwrap();
        assert!(rev >= puts + 1.0, "current revision {rev}");
    })
    .await;
}

/// A hard state that only moves the commit index is written without an
/// fsync (etcd's `MustSync`): on a 3-member cluster a follower pays one
/// fsync per replicated put, not one for the entry and one more for the
/// commit index the leader sends after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_fsync_once_per_sequential_put() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, &[]).await.expect("start");
        c.wait_all_ready(Duration::from_secs(30)).await.expect("ready");
        let mut leader = None;
        for i in 0..3 {
            let (id, lead) = c.status_of(i).await.expect("status");
            if id == lead {
                leader = Some(i);
            }
        }
        let leader = leader.expect("a leader");
        let eps = c.endpoints();
        let fsyncs = |i: usize| {
            sample(
                &http_get(&eps[i], "/metrics"),
                "etcd_disk_wal_fsync_duration_seconds_count",
            )
            .expect("fsync count")
        };
        // let the cluster's own start-up writes settle
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before: Vec<f64> = (0..3).map(fsyncs).collect();
        let mut client = c.client(leader).await.expect("client");
        const PUTS: usize = 100;
        for j in 0..PUTS {
            client.put(format!("seq/{j}"), "v", None).await.expect("put");
        }
        // the last commit index reaches the followers with the next heartbeat
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (i, b) in before.iter().enumerate() {
            let n = fsyncs(i) - b;
            eprintln!("member {i} (leader {leader}): {n} WAL fsyncs for {PUTS} sequential puts");
            assert!(n >= PUTS as f64 * 0.9, "member {i}: {n} fsyncs for {PUTS} puts");
            assert!(
                n <= PUTS as f64 * 1.2,
                "member {i}: {n} WAL fsyncs for {PUTS} sequential puts: commit-only hard states are synced"
            );
        }
    })
    .await;
}

/// etcd's watch gauges: streams and watchers come and go with the clients'
/// streams (both flavours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_watch_streams_and_watchers() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ep = c.endpoints()[0].clone();
        let gauges = || {
            let m = http_get(&ep, "/metrics");
            (
                sample(&m, "etcd_debugging_mvcc_watch_stream_total"),
                sample(&m, "etcd_debugging_mvcc_watcher_total"),
                sample(&m, "etcd_debugging_mvcc_slow_watcher_total"),
            )
        };
        assert_eq!(gauges(), (Some(0.0), Some(0.0), Some(0.0)));
        let mut cl = c.client(0).await.expect("client");
        cl.put("wm", "v", None).await.unwrap();
        let mut s1 = cl.watch("wm", None).await.unwrap();
        s1.watch("wm2", None).await.unwrap();
        let mut s2 = cl.watch("wm", None).await.unwrap();
        async fn created(s: &mut etcd_client::WatchStream) {
            let r = tokio::time::timeout(Duration::from_secs(10), s.message())
                .await
                .expect("created in time")
                .unwrap()
                .unwrap();
            assert!(r.created());
        }
        created(&mut s1).await;
        created(&mut s1).await;
        created(&mut s2).await;
        assert_eq!(gauges(), (Some(2.0), Some(3.0), Some(0.0)));
        drop(s1);
        // the server notices the closed stream shortly
        retry_until(
            Duration::from_secs(10),
            Duration::from_millis(100),
            async || {
                let g = gauges();
                (g == (Some(1.0), Some(1.0), Some(0.0)))
                    .then_some(())
                    .ok_or(g)
            },
        )
        .await
        .unwrap_or_else(|g| panic!("gauges stuck at {g:?}"));
        drop(s2);
    })
    .await;
}

/// An election's Observe streams the client closed leave no watch behind
/// (etcd ties the observer's watches to the stream; retcd's observer
/// noticed a closed stream only at its next send, so each watch stayed
/// until the leader changed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_observe_streams_leave_no_watchers() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ep = c.endpoints()[0].clone();
        let gauges = || {
            let m = http_get(&ep, "/metrics");
            (
                sample(&m, "etcd_debugging_mvcc_watch_stream_total"),
                sample(&m, "etcd_debugging_mvcc_watcher_total"),
            )
        };
        let mut cl = c.client(0).await.expect("client");
        let lease = cl.lease_grant(60, None).await.unwrap().id();
        cl.campaign("obs", "leader", lease).await.unwrap();
        for i in 0..20 {
            let mut s = cl.observe("obs").await.unwrap();
            let r = tokio::time::timeout(Duration::from_secs(10), s.message())
                .await
                .expect("the leader in time")
                .unwrap()
                .unwrap_or_else(|| panic!("observe {i} ended"));
            assert_eq!(r.kv().map(|kv| kv.value()), Some(&b"leader"[..]));
            drop(s);
        }
        retry_until(
            Duration::from_secs(10),
            Duration::from_millis(100),
            async || {
                let g = gauges();
                (g == (Some(0.0), Some(0.0))).then_some(()).ok_or(g)
            },
        )
        .await
        .unwrap_or_else(|g| panic!("(watch streams, watchers) stuck at {g:?}"));
    })
    .await;
}

// ---------------------------------------------------------------------------
// Differential: the families etcd 3.5.1 exports (those etcd's mixin
// dashboards and alerts query, and the rest of the list below) exist on
// retcd with the same type, label names, help text and buckets, and they
// count what the workload did.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{AlarmAction, AlarmType, Compare, CompareOp, GetOptions, Txn, TxnOp};
use retcd_tests::{etcd351_bin, Flavor};

/// One metric family of a scrape.
#[derive(Debug, Default, Clone, PartialEq)]
struct Family {
    kind: String,
    help: String,
    /// Label names of its samples (without `le`, `quantile`).
    labels: BTreeSet<String>,
    /// A histogram's bucket bounds (`le`), as written.
    buckets: BTreeSet<String>,
    /// (labels as written, value) of every sample, `_bucket` etc. included
    /// under their own names.
    samples: Vec<(String, String, f64)>,
}

/// Splits `a="x",b="y"` into pairs (values have no `",` in these scrapes).
fn label_pairs(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((k, r)) = rest.split_once("=\"") {
        let Some(end) = r.find('"') else { break };
        out.push((k.trim_start_matches(',').to_string(), r[..end].to_string()));
        rest = &r[end + 1..];
    }
    out
}

fn parse_families(text: &str) -> BTreeMap<String, Family> {
    let mut fams: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            fams.entry(name.to_string()).or_default().help = help.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            fams.entry(name.to_string()).or_default().kind = kind.to_string();
        } else if !line.is_empty() && !line.starts_with('#') {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, l)) => (n, l.trim_end_matches('}')),
                None => (series, ""),
            };
            let family = [
                name,
                name.strip_suffix("_bucket").unwrap_or(""),
                name.strip_suffix("_sum").unwrap_or(""),
                name.strip_suffix("_count").unwrap_or(""),
            ]
            .into_iter()
            .find(|n| !n.is_empty() && fams.contains_key(*n))
            .unwrap_or(name)
            .to_string();
            let f = fams.entry(family).or_default();
            for (k, v) in label_pairs(labels) {
                if k == "le" {
                    f.buckets.insert(v);
                } else if k != "quantile" {
                    f.labels.insert(k);
                }
            }
            f.samples.push((
                name.to_string(),
                labels.to_string(),
                value.parse().unwrap_or(f64::NAN),
            ));
        }
    }
    fams
}

impl Family {
    /// The sum of the samples named `name` whose labels include every
    /// `want` pair.
    fn value(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                let pairs = label_pairs(l);
                n == name
                    && want
                        .iter()
                        .all(|(k, v)| pairs.iter().any(|(pk, pv)| pk == k && pv == v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }
}

/// The families both must export after the single-member workload.
const FAMILIES: &[&str] = &[
    // the mixin's (alerts and dashboards)
    "grpc_server_started_total",
    "grpc_server_handled_total",
    "grpc_server_msg_received_total",
    "grpc_server_msg_sent_total",
    "etcd_server_has_leader",
    "etcd_server_leader_changes_seen_total",
    "etcd_server_proposals_failed_total",
    "etcd_server_proposals_committed_total",
    "etcd_server_proposals_applied_total",
    "etcd_server_proposals_pending",
    "etcd_disk_wal_fsync_duration_seconds",
    "etcd_disk_backend_commit_duration_seconds",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_server_quota_backend_bytes",
    "etcd_network_client_grpc_received_bytes_total",
    "etcd_network_client_grpc_sent_bytes_total",
    "process_resident_memory_bytes",
    // the server's
    "etcd_server_slow_apply_total",
    "etcd_server_slow_read_indexes_total",
    "etcd_server_read_indexes_failed_total",
    "etcd_server_heartbeat_send_failures_total",
    "etcd_server_health_success",
    "etcd_server_health_failures",
    "etcd_server_is_leader",
    "etcd_server_is_learner",
    "etcd_server_id",
    "etcd_server_version",
    "etcd_server_go_version",
    "etcd_server_learner_promote_successes",
    "etcd_server_client_requests_total",
    "etcd_server_snapshot_apply_in_progress_total",
    "etcd_cluster_version",
    // mvcc
    "etcd_mvcc_put_total",
    "etcd_mvcc_delete_total",
    "etcd_mvcc_range_total",
    "etcd_mvcc_txn_total",
    "etcd_mvcc_db_open_read_transactions",
    "etcd_mvcc_hash_duration_seconds",
    "etcd_mvcc_hash_rev_duration_seconds",
    "etcd_debugging_mvcc_keys_total",
    "etcd_debugging_mvcc_watcher_total",
    "etcd_debugging_mvcc_watch_stream_total",
    "etcd_debugging_mvcc_events_total",
    "etcd_debugging_mvcc_pending_events_total",
    "etcd_debugging_mvcc_slow_watcher_total",
    "etcd_debugging_mvcc_compact_revision",
    "etcd_debugging_mvcc_current_revision",
    "etcd_debugging_mvcc_range_total",
    "etcd_debugging_mvcc_total_put_size_in_bytes",
    "etcd_debugging_mvcc_db_compaction_keys_total",
    "etcd_debugging_mvcc_db_compaction_last",
    "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
    "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
    "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
    // lease
    "etcd_debugging_lease_granted_total",
    "etcd_debugging_lease_revoked_total",
    "etcd_debugging_lease_renewed_total",
    "etcd_debugging_lease_ttl_total",
    "etcd_debugging_server_lease_expired_total",
    // snapshots and disk
    "etcd_debugging_snap_save_total_duration_seconds",
    "etcd_debugging_snap_save_marshalling_duration_seconds",
    "etcd_snap_db_save_total_duration_seconds",
    "etcd_snap_db_fsync_duration_seconds",
    "etcd_snap_fsync_duration_seconds",
    "etcd_disk_backend_defrag_duration_seconds",
    "etcd_disk_backend_snapshot_duration_seconds",
    "etcd_disk_wal_write_bytes_total",
    "etcd_disk_defrag_inflight",
    // process
    "process_cpu_seconds_total",
    "process_virtual_memory_bytes",
    "process_virtual_memory_max_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
    "os_fd_used",
    "os_fd_limit",
];

/// The peer families both must export on a member of three, one of them
/// stopped.
const PEER_FAMILIES: &[&str] = &[
    "etcd_network_peer_sent_bytes_total",
    "etcd_network_peer_received_bytes_total",
    "etcd_network_peer_round_trip_time_seconds",
    "etcd_network_peer_sent_failures_total",
    "etcd_network_active_peers",
    "etcd_network_disconnected_peers_total",
];

/// Which servers the differential runs on: `RETCD_METRICS_TARGETS=etcd`
/// runs it on etcd 3.5.1 alone (to check the test itself).
fn targets() -> Vec<Flavor> {
    match std::env::var("RETCD_METRICS_TARGETS").as_deref() {
        Ok("etcd") => vec![Flavor::Etcd],
        Ok("retcd") => vec![Flavor::Retcd],
        _ => vec![Flavor::Etcd, Flavor::Retcd],
    }
}

async fn start(flavor: Flavor, n: usize) -> retcd_tests::Cluster {
    let bin = match flavor {
        Flavor::Etcd => etcd351_bin(),
        Flavor::Retcd => retcd_tests::retcd_bin(),
    };
    retcd_tests::Cluster::start_with_binary(flavor, bin, n, &[])
        .await
        .expect("start")
}

const PUTS: usize = 20;

/// Puts, gets, a txn, a delete, a watch, a lease granted, kept alive and
/// revoked, a compaction, a defrag, alarm list, HashKV and /health; then
/// the scrape.
async fn workload(c: &retcd_tests::Cluster) -> BTreeMap<String, Family> {
    let ep = c.endpoints()[0].clone();
    let mut cl = c.client(0).await.expect("client");
    let mut w = cl.watch("dm/0", None).await.expect("watch");
    let created = tokio::time::timeout(Duration::from_secs(10), w.message())
        .await
        .expect("watch created")
        .unwrap()
        .unwrap();
    assert!(created.created());
    for i in 0..PUTS {
        cl.put(format!("dm/{i}"), "v", None).await.expect("put");
    }
    let ev = tokio::time::timeout(Duration::from_secs(10), w.message())
        .await
        .expect("watch event")
        .unwrap()
        .unwrap();
    assert_eq!(ev.events().len(), 1);
    for _ in 0..3 {
        cl.get("dm/1", None).await.expect("get");
    }
    cl.get("dm/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("prefix get");
    let txn = Txn::new()
        .when([Compare::value("dm/1", CompareOp::Equal, "v")])
        .and_then([
            TxnOp::put("dm/txn", "t", None),
            TxnOp::put("dm/txn2", "t", None),
        ]);
    assert!(cl.txn(txn).await.expect("txn").succeeded());
    cl.delete("dm/2", None).await.expect("delete");
    let lease = cl.lease_grant(60, None).await.expect("grant").id();
    let (mut keeper, mut ka) = cl.lease_keep_alive(lease).await.expect("keepalive");
    keeper.keep_alive().await.expect("keepalive send");
    ka.message().await.expect("keepalive reply");
    drop((keeper, ka));
    cl.lease_revoke(lease).await.expect("revoke");
    let rev = cl
        .status()
        .await
        .expect("status")
        .header()
        .unwrap()
        .revision();
    cl.compact(rev - 5, None).await.expect("compact");
    cl.defragment().await.expect("defrag");
    cl.alarm(AlarmAction::Get, AlarmType::None, None)
        .await
        .expect("alarm list");
    cl.hash_kv(0).await.expect("hash kv");
    drop(w);
    let health = http_get(&ep, "/health");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // the closed watch stream is handled (Canceled) shortly
    retry_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            let f = scrape(&ep);
            let v = f["grpc_server_handled_total"].value(
                "grpc_server_handled_total",
                &[
                    ("grpc_method", "Watch"),
                    ("grpc_service", "etcdserverpb.Watch"),
                ],
            );
            (v == 1.0).then_some(f).ok_or(v)
        },
    )
    .await
    .unwrap_or_else(|v| panic!("watch stream handled {v} times, not 1"))
}

fn scrape(ep: &str) -> BTreeMap<String, Family> {
    // HTTP/1.0: a plain body, never chunked
    let addr = ep.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read response");
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    parse_families(body)
}

/// Compares `names` of `etcd` and `ours`: type, help, label names, buckets.
fn compare(
    names: &[&str],
    etcd: &BTreeMap<String, Family>,
    ours: &BTreeMap<String, Family>,
) -> Vec<String> {
    let mut diffs = Vec::new();
    for name in names {
        let (Some(e), Some(o)) = (etcd.get(*name), ours.get(*name)) else {
            diffs.push(format!(
                "{name}: etcd has it: {}, retcd has it: {}",
                etcd.contains_key(*name),
                ours.contains_key(*name)
            ));
            continue;
        };
        for (what, a, b) in [("type", &e.kind, &o.kind), ("help", &e.help, &o.help)] {
            if a != b {
                diffs.push(format!("{name}: {what} {a:?} (etcd) vs {b:?} (retcd)"));
            }
        }
        if e.labels != o.labels {
            diffs.push(format!("{name}: labels {:?} vs {:?}", e.labels, o.labels));
        }
        let num = |s: &BTreeSet<String>| -> Vec<f64> {
            let mut v: Vec<f64> = s.iter().map(|b| b.parse().unwrap()).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        if num(&e.buckets) != num(&o.buckets) {
            diffs.push(format!(
                "{name}: buckets {:?} vs {:?}",
                e.buckets, o.buckets
            ));
        }
    }
    diffs
}

/// What the workload must have moved, on either server.
fn check_counts(who: &str, f: &BTreeMap<String, Family>) {
    let v = |fam: &str, sample: &str, want: &[(&str, &str)]| -> f64 {
        f.get(fam)
            .unwrap_or_else(|| panic!("{who}: {fam} missing"))
            .value(sample, want)
    };
    let put = [("grpc_method", "Put"), ("grpc_service", "etcdserverpb.KV")];
    let puts = PUTS as f64;
    for fam in [
        "grpc_server_started_total",
        "grpc_server_msg_received_total",
        "grpc_server_msg_sent_total",
    ] {
        assert_eq!(v(fam, fam, &put), puts, "{who}: {fam} of Put");
    }
    let ok_puts = [put[0], put[1], ("grpc_code", "OK"), ("grpc_type", "unary")];
    assert_eq!(
        v(
            "grpc_server_handled_total",
            "grpc_server_handled_total",
            &ok_puts
        ),
        puts,
        "{who}: Put handled OK"
    );
    // every code of every method is there from the start
    let put_codes = f["grpc_server_handled_total"]
        .samples
        .iter()
        .filter(|(_, l, _)| l.contains("grpc_method=\"Put\""))
        .count();
    assert_eq!(put_codes, 17, "{who}: Put's handled codes");
    let watch = [
        ("grpc_method", "Watch"),
        ("grpc_service", "etcdserverpb.Watch"),
        ("grpc_type", "bidi_stream"),
    ];
    assert_eq!(
        v(
            "grpc_server_started_total",
            "grpc_server_started_total",
            &watch
        ),
        1.0,
        "{who}"
    );
    assert!(
        v(
            "grpc_server_msg_sent_total",
            "grpc_server_msg_sent_total",
            &watch
        ) >= 2.0,
        "{who}"
    );
    let ka = [
        ("grpc_method", "LeaseKeepAlive"),
        ("grpc_type", "bidi_stream"),
    ];
    assert_eq!(
        v(
            "grpc_server_started_total",
            "grpc_server_started_total",
            &ka
        ),
        1.0,
        "{who}"
    );
    let one = |fam: &str| v(fam, fam, &[]);
    assert!(one("etcd_mvcc_put_total") >= puts + 1.0, "{who}: mvcc puts");
    assert!(one("etcd_mvcc_delete_total") >= 1.0, "{who}: mvcc deletes");
    assert!(one("etcd_mvcc_range_total") >= 4.0, "{who}: mvcc ranges");
    assert!(one("etcd_mvcc_txn_total") >= 1.0, "{who}: mvcc txns");
    assert!(
        one("etcd_debugging_mvcc_events_total") >= 1.0,
        "{who}: events"
    );
    assert_eq!(one("etcd_debugging_lease_granted_total"), 1.0, "{who}");
    assert_eq!(one("etcd_debugging_lease_revoked_total"), 1.0, "{who}");
    assert!(one("etcd_debugging_lease_renewed_total") >= 1.0, "{who}");
    assert_eq!(
        v(
            "etcd_debugging_lease_ttl_total",
            "etcd_debugging_lease_ttl_total_sum",
            &[]
        ),
        60.0,
        "{who}"
    );
    assert!(one("etcd_server_health_success") >= 1.0, "{who}");
    assert_eq!(
        v(
            "etcd_disk_backend_defrag_duration_seconds",
            "etcd_disk_backend_defrag_duration_seconds_count",
            &[]
        ),
        1.0,
        "{who}"
    );
    assert!(
        v(
            "etcd_mvcc_hash_rev_duration_seconds",
            "etcd_mvcc_hash_rev_duration_seconds_count",
            &[]
        ) >= 1.0,
        "{who}"
    );
    assert!(
        one("etcd_network_client_grpc_received_bytes_total") > puts * 5.0,
        "{who}"
    );
    assert!(
        one("etcd_network_client_grpc_sent_bytes_total") > puts * 10.0,
        "{who}"
    );
    assert!(one("etcd_disk_wal_write_bytes_total") > 0.0, "{who}");
    assert_eq!(
        one("etcd_server_quota_backend_bytes"),
        2147483648.0,
        "{who}"
    );
    assert_eq!(one("etcd_server_is_learner"), 0.0, "{who}");
    assert!(one("process_resident_memory_bytes") > 1e6, "{who}");
    assert!(one("process_open_fds") > 3.0, "{who}");
    assert!(one("os_fd_limit") >= one("os_fd_used"), "{who}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_families_match_etcd_351() {
    bounded(LIMIT * 2, async {
        let mut scrapes = BTreeMap::new();
        for flavor in targets() {
            let c = start(flavor, 1).await;
            let f = workload(&c).await;
            check_counts(flavor.name(), &f);
            scrapes.insert(flavor.name(), f);
        }
        let etcd = scrapes.get("etcd");
        let ours = scrapes.get("retcd");
        if let (Some(etcd), Some(ours)) = (etcd, ours) {
            let diffs = compare(FAMILIES, etcd, ours);
            assert!(diffs.is_empty(), "families differ:\n{}", diffs.join("\n"));
        } else {
            // one server only: every family on the list is there
            let f = etcd.or(ours).unwrap();
            let missing: Vec<_> = FAMILIES.iter().filter(|n| !f.contains_key(**n)).collect();
            assert!(missing.is_empty(), "missing {missing:?}");
        }
    })
    .await;
}

/// A member of three: its peer families, after one peer stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_metric_families_match_etcd_351() {
    bounded(LIMIT * 2, async {
        let mut scrapes = BTreeMap::new();
        for flavor in targets() {
            let mut c = start(flavor, 3).await;
            let mut cl = c.client(0).await.expect("client");
            for i in 0..10 {
                cl.put(format!("p/{i}"), "v", None).await.expect("put");
            }
            // etcd measures the round trip 5 s after a stream comes up
            tokio::time::sleep(Duration::from_secs(7)).await;
            // the leader keeps sending to a stopped follower (heartbeats)
            let leader = c.leader(Duration::from_secs(10)).await.expect("leader");
            c.members[(leader + 1) % 3].kill();
            tokio::time::sleep(Duration::from_secs(4)).await;
            let f = scrape(&c.endpoints()[leader]);
            let who = flavor.name();
            let one = |fam: &str, sample: &str| {
                f.get(fam)
                    .unwrap_or_else(|| panic!("{who}: {fam} missing"))
                    .value(sample, &[])
            };
            assert!(
                one(
                    "etcd_network_peer_sent_bytes_total",
                    "etcd_network_peer_sent_bytes_total"
                ) > 0.0,
                "{who}"
            );
            assert!(
                one(
                    "etcd_network_peer_received_bytes_total",
                    "etcd_network_peer_received_bytes_total"
                ) > 0.0,
                "{who}"
            );
            assert!(
                one(
                    "etcd_network_peer_sent_failures_total",
                    "etcd_network_peer_sent_failures_total"
                ) > 0.0,
                "{who}"
            );
            assert!(
                one(
                    "etcd_network_disconnected_peers_total",
                    "etcd_network_disconnected_peers_total"
                ) >= 1.0,
                "{who}"
            );
            assert_eq!(
                one("etcd_network_active_peers", "etcd_network_active_peers"),
                1.0,
                "{who}: one peer left up"
            );
            assert!(
                one(
                    "etcd_network_peer_round_trip_time_seconds",
                    "etcd_network_peer_round_trip_time_seconds_count"
                ) >= 1.0,
                "{who}: no round trip measured"
            );
            scrapes.insert(who, f);
        }
        if let (Some(etcd), Some(ours)) = (scrapes.get("etcd"), scrapes.get("retcd")) {
            let diffs = compare(PEER_FAMILIES, etcd, ours);
            assert!(
                diffs.is_empty(),
                "peer families differ:\n{}",
                diffs.join("\n")
            );
        }
    })
    .await;
}

/// KV's unary calls count their messages' exact bytes, their messages
/// and their codes as etcd counts them (its codec counts each message's
/// length; go-grpc-prometheus counts the call, the message it received,
/// the one it sent on success and the code it ended with). retcd counts
/// these calls in the KV route itself, not through a counting body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_unary_calls_count_exact_bytes_and_codes() {
    use prost::Message as _;
    use retcd_api::etcdserverpb::{kv_client::KvClient, PutRequest, RangeRequest};
    bounded(LIMIT * 2, async {
        for flavor in targets() {
            let who = flavor.name();
            let c = start(flavor, 1).await;
            let ep = c.endpoints()[0].clone();
            let mut kv = KvClient::connect(ep.clone()).await.expect("connect");
            let before = scrape(&ep);
            let put = PutRequest {
                key: b"mx/key".to_vec(),
                value: vec![b'v'; 300],
                ..Default::default()
            };
            let put_resp = kv.put(put.clone()).await.expect("put").into_inner();
            let ok = RangeRequest {
                key: b"mx/key".to_vec(),
                ..Default::default()
            };
            let ok_resp = kv.range(ok.clone()).await.expect("range").into_inner();
            assert_eq!(ok_resp.kvs.len(), 1, "{who}");
            let future = RangeRequest {
                key: b"mx/key".to_vec(),
                revision: 1_000_000,
                ..Default::default()
            };
            let err = kv.range(future.clone()).await.expect_err("future revision");
            assert_eq!(err.code(), tonic::Code::OutOfRange, "{who}: {err:?}");
            let after = scrape(&ep);
            let delta = |fam: &str, want: &[(&str, &str)]| {
                after[fam].value(fam, want) - before[fam].value(fam, want)
            };
            let received = (put.encoded_len() + ok.encoded_len() + future.encoded_len()) as f64;
            let sent = (put_resp.encoded_len() + ok_resp.encoded_len()) as f64;
            assert_eq!(
                delta("etcd_network_client_grpc_received_bytes_total", &[]),
                received,
                "{who}: received bytes"
            );
            assert_eq!(
                delta("etcd_network_client_grpc_sent_bytes_total", &[]),
                sent,
                "{who}: sent bytes"
            );
            let range = [
                ("grpc_method", "Range"),
                ("grpc_service", "etcdserverpb.KV"),
            ];
            let put_m = [("grpc_method", "Put"), ("grpc_service", "etcdserverpb.KV")];
            for (fam, m, want) in [
                ("grpc_server_started_total", &range, 2.0),
                ("grpc_server_msg_received_total", &range, 2.0),
                ("grpc_server_msg_sent_total", &range, 1.0),
                ("grpc_server_started_total", &put_m, 1.0),
                ("grpc_server_msg_received_total", &put_m, 1.0),
                ("grpc_server_msg_sent_total", &put_m, 1.0),
            ] {
                assert_eq!(delta(fam, m), want, "{who}: {fam} {m:?}");
            }
            let handled = "grpc_server_handled_total";
            for (m, code, want) in [
                (&range, "OK", 1.0),
                (&range, "OutOfRange", 1.0),
                (&put_m, "OK", 1.0),
            ] {
                let labels = [m[0], m[1], ("grpc_code", code)];
                assert_eq!(delta(handled, &labels), want, "{who}: {m:?} {code}");
            }
        }
    })
    .await;
}
