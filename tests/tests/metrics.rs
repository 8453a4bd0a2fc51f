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
