//! Operator flags that change what a member does, checked over the wire
//! on real etcd and on retcd with the same steps:
//! `--force-new-cluster`, `--unsafe-no-fsync`, `--enable-pprof`,
//! `--listen-client-http-urls`, and a stopping leader handing leadership
//! over (etcd's `Server.Stop`).
//!
//! Flavour-generic (`RETCD_TEST_FLAVOR=etcd` runs them on etcd 3.4.23);
//! the flags etcd 3.4 lacks run on etcd 3.5.1 next to retcd.

use std::process::Command;
use std::time::{Duration, Instant};

use retcd_tests::cluster::loopback_url;
use retcd_tests::{
    bounded, etcd351_bin, etcdctl, free_port, http_get, limit::SHORT as LIMIT, retcd_bin,
    test_flavor, Cluster, Flavor, FAST, READY,
};

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `--force-new-cluster`: after all three members stop, one restarted
/// with the flag is the only member and leader, serves the data it had,
/// accepts writes, and stays a one-member cluster on a plain restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_force_new_cluster() {
    let flavor = test_flavor();
    bounded(LIMIT, async {
        let mut c = Cluster::start(flavor, 3, FAST).await.unwrap();
        let o = c.etcdctl(&["put", "k", "before"]);
        assert!(o.success(), "{o:?}");
        for m in c.members.iter_mut() {
            m.stop();
        }
        c.members[0].add_args(&["--force-new-cluster"]);
        c.members[0].start();
        c.wait_member_ready(0, READY).await.unwrap();
        let ep = vec![c.members[0].endpoint()];
        let o = etcdctl(&ep, &["get", "k", "--print-value-only"]);
        assert_eq!(o.stdout.trim(), "before", "{o:?}");
        let o = etcdctl(&ep, &["member", "list"]);
        assert_eq!(o.stdout.trim().lines().count(), 1, "one member: {o:?}");
        assert!(o.stdout.contains("m0"), "{o:?}");
        let o = etcdctl(&ep, &["put", "k2", "after"]);
        assert!(o.success(), "a lone voter commits: {o:?}");
        // A plain restart keeps the new one-member cluster.
        c.members[0].stop();
        let args: Vec<String> = c.members[0]
            .args()
            .iter()
            .filter(|a| *a != "--force-new-cluster")
            .cloned()
            .collect();
        let m = &mut c.members[0];
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        m.set_args(&argv);
        m.start();
        c.wait_member_ready(0, READY).await.unwrap();
        let o = etcdctl(&ep, &["get", "k", "--prefix", "--print-value-only"]);
        assert_eq!(o.stdout.trim(), "before\nafter", "{o:?}");
        let o = etcdctl(&ep, &["member", "list"]);
        assert_eq!(o.stdout.trim().lines().count(), 1, "{o:?}");
    })
    .await;
}

/// WAL fsyncs counted in `/metrics` after 20 puts on one member.
async fn fsyncs_after_puts(bin: std::path::PathBuf, flavor: Flavor, flags: &[&str]) -> f64 {
    let mut c = Cluster::start_with_binary(flavor, bin, 1, flags)
        .await
        .unwrap();
    for i in 0..20 {
        let o = c.etcdctl(&["put", &format!("k{i}"), "v"]);
        assert!(o.success(), "{o:?}");
    }
    let r = http_get(c.members[0].client_port, "/metrics", Duration::from_secs(5)).unwrap();
    let n = metric(&r.body, "etcd_disk_wal_fsync_duration_seconds_count")
        .unwrap_or_else(|| panic!("no fsync histogram in /metrics"));
    for m in c.members.iter_mut() {
        m.stop();
    }
    n
}

/// `--unsafe-no-fsync`: puts still succeed but the WAL is never fsynced
/// (etcd skips the fsync and its histogram; 3.5.1 counts two at bootstrap);
/// without the flag every put fsyncs. Same on etcd 3.5.1 and the flavour under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_unsafe_no_fsync() {
    let flavor = test_flavor();
    bounded(LIMIT, async {
        let bins = [
            (Flavor::Etcd, etcd351_bin()),
            (
                flavor,
                if flavor == Flavor::Retcd {
                    retcd_bin()
                } else {
                    etcd351_bin()
                },
            ),
        ];
        for (f, bin) in bins {
            let with = fsyncs_after_puts(bin.clone(), f, &["--unsafe-no-fsync"]).await;
            let without = fsyncs_after_puts(bin.clone(), f, &[]).await;
            // etcd 3.5.1 still counts its two bootstrap syncs.
            assert!(
                with <= 2.0,
                "{}: {with} fsyncs with --unsafe-no-fsync",
                bin.display()
            );
            assert!(
                without >= 20.0,
                "{}: {without} fsyncs for 20 puts",
                bin.display()
            );
        }
    })
    .await;
}

/// `--enable-pprof`: `/debug/pprof/profile?seconds=1` is a gzipped pprof
/// profile of CPU time, taken while puts run; without the flag there is
/// no such route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_pprof_cpu_profile() {
    let flavor = test_flavor();
    bounded(LIMIT, async {
        let mut c = Cluster::start(flavor, 1, &["--enable-pprof"])
            .await
            .unwrap();
        let port = c.members[0].client_port;
        let ep = c.endpoints();
        let load = std::thread::spawn(move || {
            for i in 0..60 {
                etcdctl(&ep, &["put", &format!("p{i}"), "v"]);
            }
        });
        let out = c.dir().join("profile.pb.gz");
        let st = Command::new("curl")
            .args(["-s", "-f", "--max-time", "30", "-o"])
            .arg(&out)
            .arg(format!(
                "http://127.0.0.1:{port}/debug/pprof/profile?seconds=1"
            ))
            .status()
            .unwrap();
        load.join().unwrap();
        assert!(st.success(), "curl /debug/pprof/profile: {st}");
        let gz = std::fs::read(&out).unwrap();
        assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip");
        let mut raw = Vec::new();
        use std::io::Read;
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut raw)
            .unwrap();
        let text = String::from_utf8_lossy(&raw);
        for s in ["samples", "cpu", "nanoseconds"] {
            assert!(text.contains(s), "profile has no {s:?} string");
        }
        if flavor == Flavor::Retcd {
            assert!(text.contains("retcd"), "no retcd function in the profile");
        }
        c.members[0].stop();

        let mut plain = Cluster::start(flavor, 1, &[]).await.unwrap();
        let r = http_get(
            plain.members[0].client_port,
            "/debug/pprof/profile?seconds=1",
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(r.status, 404, "no profile without --enable-pprof: {r:?}");
        plain.members[0].stop();
    })
    .await;
}

/// A leader stopped with SIGTERM hands leadership to a follower before it
/// exits: another member leads sooner than an election could start (an
/// election needs a full election timeout without heartbeats).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_stopping_leader_transfers_leadership() {
    let flavor = test_flavor();
    bounded(LIMIT, async {
        // heartbeat 100ms, election timeout 2s
        let flags = ["--heartbeat-interval", "100", "--election-timeout", "2000"];
        let mut c = Cluster::start(flavor, 3, &flags).await.unwrap();
        let old = c.leader(READY).await.unwrap();
        let started = Instant::now();
        let status = c.members[old].stop();
        assert!(status.is_some(), "leader stopped");
        let new = c.leader(Duration::from_secs(20)).await.unwrap();
        let took = started.elapsed();
        assert_ne!(new, old);
        let log = c.members[old].log();
        assert!(
            log.contains("leadership transfer finished")
                || log.contains("leadership transfer") && log.contains("finished"),
            "no leadership transfer in the old leader's log:\n{}",
            c.members[old].log_tail(3000)
        );
        // Without a hand-over no follower could campaign before 2s (the
        // election timeout) after the last heartbeat.
        assert!(
            took < Duration::from_millis(1900),
            "new leader after {took:?}: no hand-over"
        );
    })
    .await;
}

/// `--listen-client-http-urls` (etcd 3.5.8+): the HTTP endpoints and the
/// JSON gateway move there; the client URL keeps gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_listen_client_http_urls() {
    if test_flavor() != Flavor::Retcd {
        return; // etcd 3.4.23 and 3.5.1 have no such flag
    }
    bounded(LIMIT, async {
        let hp = free_port();
        let http_url = loopback_url(hp);
        let mut c = Cluster::start(Flavor::Retcd, 1, &["--listen-client-http-urls", &http_url])
            .await
            .unwrap();
        let o = c.etcdctl(&["put", "h", "1"]);
        assert!(o.success(), "gRPC on the client URL: {o:?}");
        let r = http_get(hp, "/health", Duration::from_secs(5)).unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        let r = retcd_tests::http_post(
            hp,
            "/v3/kv/range",
            r#"{"key":"aA=="}"#,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(r.status, 200, "gateway on the HTTP URL: {r:?}");
        assert!(r.body.contains("\"count\":\"1\""), "{r:?}");
        let r = http_get(c.members[0].client_port, "/health", Duration::from_secs(5)).unwrap();
        assert_ne!(r.status, 200, "HTTP stays off the gRPC URL: {r:?}");
        c.members[0].stop();
    })
    .await;
}
