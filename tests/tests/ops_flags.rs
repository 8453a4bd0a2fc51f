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
        // Puts until the profile is taken (a fixed count may end before
        // the 1 s sample starts on a loaded machine).
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let load = std::thread::spawn({
            let done = done.clone();
            move || {
                let mut i = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) && i < 2000 {
                    etcdctl(&ep, &["put", &format!("p{i}"), "v"]);
                    i += 1;
                }
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
        done.store(true, std::sync::atomic::Ordering::SeqCst);
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

/// The unit's `Environment=` settings and its `ExecStart` command (with
/// `/usr/bin/retcd` replaced by the binary under test).
fn unit_command() -> (Vec<(String, String)>, Vec<String>) {
    let unit = std::fs::read_to_string(
        retcd_tests::workspace_root().join("contrib/systemd/retcd.service"),
    )
    .unwrap();
    let mut env = Vec::new();
    let mut exec = Vec::new();
    for line in unit.lines() {
        if let Some(kv) = line.strip_prefix("Environment=") {
            let (k, v) = kv.split_once('=').unwrap();
            env.push((k.to_string(), v.replace("%H", "unit-host")));
        } else if let Some(cmd) = line.strip_prefix("ExecStart=") {
            exec = cmd.split_whitespace().map(str::to_string).collect();
        }
    }
    assert_eq!(
        exec.first().map(String::as_str),
        Some("/usr/bin/retcd"),
        "{unit}"
    );
    assert!(unit.contains("Type=notify"), "{unit}");
    (env, exec)
}

/// Starts the unit's command as systemd would (its environment, then the
/// environment file `env_file`), with a notify socket; returns the child
/// and whether READY=1 arrived within the bound.
fn start_as_systemd(
    dir: &std::path::Path,
    env_file: &str,
    bin: &std::path::Path,
) -> (std::process::Child, bool) {
    use std::os::unix::net::UnixDatagram;
    let (mut env, exec) = unit_command();
    for line in env_file.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').unwrap();
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v.to_string()));
    }
    let daemon_args = env
        .iter()
        .find(|(k, _)| k == "DAEMON_ARGS")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let mut args: Vec<String> = Vec::new();
    for a in &exec[1..] {
        if a == "$DAEMON_ARGS" {
            args.extend(daemon_args.split_whitespace().map(str::to_string));
        } else {
            args.push(a.clone());
        }
    }
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let log = std::fs::File::create(dir.join("unit.log")).unwrap();
    let child = Command::new(bin)
        .args(&args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().filter(|(k, _)| k != "DAEMON_ARGS").cloned())
        .env("NOTIFY_SOCKET", &sock_path)
        .current_dir(dir)
        .stderr(log)
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let ready = match sock.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).contains("READY=1"),
        Err(_) => false,
    };
    (child, ready)
}

fn stop_child(mut c: std::process::Child) {
    let _ = Command::new("kill").arg(c.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

/// contrib/systemd/retcd.service with an operator's /etc/default/retcd
/// (ETCD_* lines) starts a member that notifies systemd and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_systemd_unit_starts_a_member() {
    if test_flavor() != Flavor::Retcd {
        return; // the unit runs retcd
    }
    bounded(LIMIT, async {
        let dir = tempfile::tempdir().unwrap();
        let (cp, pp) = (free_port(), free_port());
        let template =
            std::fs::read_to_string(retcd_tests::workspace_root().join("contrib/default/retcd"))
                .unwrap();
        // Uncomment the shipped lines and point them at test ports.
        let env_file = template
            .replace(
                "#ETCD_LISTEN_CLIENT_URLS=http://localhost:2379",
                &format!("ETCD_LISTEN_CLIENT_URLS={}", loopback_url(cp)),
            )
            .replace(
                "#ETCD_ADVERTISE_CLIENT_URLS=http://localhost:2379",
                &format!("ETCD_ADVERTISE_CLIENT_URLS={}", loopback_url(cp)),
            )
            .replace(
                "#ETCD_LISTEN_PEER_URLS=http://localhost:2380",
                &format!("ETCD_LISTEN_PEER_URLS={}", loopback_url(pp)),
            )
            .replace(
                "#ETCD_INITIAL_ADVERTISE_PEER_URLS=http://localhost:2380",
                &format!("ETCD_INITIAL_ADVERTISE_PEER_URLS={}", loopback_url(pp)),
            )
            .replace(
                "#ETCD_INITIAL_CLUSTER=default=http://localhost:2380",
                &format!("ETCD_INITIAL_CLUSTER=unit-host={}", loopback_url(pp)),
            )
            + &format!("ETCD_DATA_DIR={}\n", dir.path().join("data").display());
        let (child, ready) = start_as_systemd(dir.path(), &env_file, &retcd_bin());
        let ep = vec![loopback_url(cp)];
        let put = etcdctl(&ep, &["put", "unit", "ok"]);
        let members = etcdctl(&ep, &["member", "list"]);
        stop_child(child);
        let log = std::fs::read_to_string(dir.path().join("unit.log")).unwrap_or_default();
        assert!(ready, "no READY=1 on the notify socket; log:\n{log}");
        assert!(log.contains("successfully notified init daemon"), "{log}");
        assert!(put.success(), "{put:?}");
        assert!(
            members.stdout.contains("unit-host"),
            "ETCD_NAME=%H: {members:?}"
        );
    })
    .await;
}

/// contrib/retcd.conf.yml (ports and data dir adapted) starts real etcd
/// 3.5.1 and retcd alike, the retcd one through the unit with
/// ETCD_CONFIG_FILE as /etc/default/retcd suggests; both serve clients
/// and /readyz or /health on the metrics URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_example_config_file() {
    if test_flavor() != Flavor::Retcd {
        return;
    }
    bounded(LIMIT, async {
        let example =
            std::fs::read_to_string(retcd_tests::workspace_root().join("contrib/retcd.conf.yml"))
                .unwrap();
        for server in ["etcd-3.5.1", "retcd"] {
            let dir = tempfile::tempdir().unwrap();
            let (cp, pp, mp) = (free_port(), free_port(), free_port());
            let cfg = example
                .replace("localhost:2379", &format!("127.0.0.1:{cp}"))
                .replace("localhost:2380", &format!("127.0.0.1:{pp}"))
                .replace("localhost:2381", &format!("127.0.0.1:{mp}"))
                .replace(
                    "/var/lib/etcd/default",
                    &dir.path().join("data").display().to_string(),
                );
            let path = dir.path().join("retcd.conf.yml");
            std::fs::write(&path, cfg).unwrap();
            let ep = vec![loopback_url(cp)];
            let child = if server == "retcd" {
                let env_file = format!("ETCD_CONFIG_FILE={}\nDAEMON_ARGS=\n", path.display());
                let (child, ready) = start_as_systemd(dir.path(), &env_file, &retcd_bin());
                assert!(ready, "retcd with the example config did not notify");
                child
            } else {
                let child = Command::new(etcd351_bin())
                    .arg("--config-file")
                    .arg(&path)
                    .current_dir(dir.path())
                    .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
                    .spawn()
                    .unwrap();
                child
            };
            let ok = retcd_tests::retry_until(
                Duration::from_secs(30),
                Duration::from_millis(200),
                async || {
                    let o = etcdctl(&ep, &["put", "cfg", "1"]);
                    if o.success() {
                        Ok(())
                    } else {
                        anyhow::bail!("{o:?}")
                    }
                },
            )
            .await;
            let health = http_get(mp, "/health", Duration::from_secs(5));
            let members = etcdctl(&ep, &["member", "list"]);
            stop_child(child);
            ok.unwrap_or_else(|e| panic!("{server} with the example config: {e}"));
            let health = health.unwrap();
            assert_eq!(health.status, 200, "{server}: {health:?}");
            assert!(
                members.stdout.contains(", default,"),
                "{server}: {members:?}"
            );
        }
    })
    .await;
}

/// `--experimental-compact-hash-check-enabled` (3.6: the CompactHashCheck
/// gate): with equal stores the leader checks each compaction's hash and
/// raises nothing; once one follower hashes differently (failpoint
/// `mvcc_hash_kv_corrupt`), the next compaction raises CORRUPT for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_compact_hash_check_raises_corrupt() {
    use etcd_client::{AlarmAction, AlarmType};
    use retcd_tests::robustness::{Options, RbCluster};
    if test_flavor() != Flavor::Retcd {
        return; // needs the failpoints build
    }
    bounded(LIMIT, async {
        let opts = Options::new(Flavor::Retcd, 3).with_failpoints().flags(&[
            "--feature-gates=CompactHashCheck=true",
            "--compact-hash-check-time=500ms",
        ]);
        let mut rb = RbCluster::start(&opts, 1).await.unwrap();
        let mut cl = rb.cluster.client_all().await.unwrap();
        for i in 0..20 {
            cl.put(format!("k/{i}"), format!("v{i}"), None)
                .await
                .unwrap();
        }
        let rev = cl
            .get("k/0", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        cl.compact(rev, None).await.unwrap();
        cl.put("after-compaction", "1", None).await.unwrap();
        let leader = rb.leader().await.unwrap();
        retcd_tests::retry_until(
            Duration::from_secs(20),
            Duration::from_millis(200),
            async || {
                if rb.cluster.members[leader]
                    .log()
                    .contains("finished compaction hash check")
                {
                    Ok(())
                } else {
                    Err(())
                }
            },
        )
        .await
        .unwrap_or_else(|()| panic!("no compaction hash check\n{}", rb.cluster.log_tails(3000)));
        let alarms = cl
            .alarm(AlarmAction::Get, AlarmType::None, None)
            .await
            .unwrap();
        assert!(alarms.alarms().is_empty(), "alarm with equal stores");

        let bad = (leader + 1) % 3;
        rb.set_failpoints(bad, "mvcc_hash_kv_corrupt=return");
        rb.kill(bad);
        rb.restart(bad);
        rb.cluster
            .wait_member_ready(bad, Duration::from_secs(30))
            .await
            .unwrap();
        for i in 20..30 {
            cl.put(format!("k/{i}"), format!("v{i}"), None)
                .await
                .unwrap();
        }
        let rev = cl
            .get("k/0", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        cl.compact(rev, None).await.unwrap();
        cl.put("after-compaction", "2", None).await.unwrap();
        let (bad_id, _) = rb.cluster.status_of(bad).await.unwrap();
        let raised = retcd_tests::retry_until(
            Duration::from_secs(20),
            Duration::from_millis(200),
            async || {
                let r = cl
                    .alarm(AlarmAction::Get, AlarmType::None, None)
                    .await
                    .map_err(|_| ())?;
                let v: Vec<_> = r
                    .alarms()
                    .iter()
                    .map(|a| (a.member_id(), a.alarm()))
                    .collect();
                if v.is_empty() {
                    Err(())
                } else {
                    Ok(v)
                }
            },
        )
        .await
        .unwrap_or_else(|()| panic!("CORRUPT never raised\n{}", rb.cluster.log_tails(3000)));
        assert_eq!(raised, vec![(bad_id, AlarmType::Corrupt)]);
    })
    .await;
}

/// `--host-whitelist` and `--cors` on an insecure client URL, on etcd
/// 3.5.1 and the server under test: a Host not listed gets 421 and etcd's
/// DNS-rebinding text, a listed one is served; only a listed Origin is
/// echoed in `Access-Control-Allow-Origin`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_host_whitelist_and_cors_as_etcd() {
    let flavor = test_flavor();
    bounded(LIMIT, async {
        let flags = ["--host-whitelist=example.com", "--cors=http://a.example:80"];
        let under_test = if flavor == Flavor::Retcd {
            retcd_bin()
        } else {
            etcd351_bin()
        };
        let mut answers = Vec::new();
        for bin in [etcd351_bin(), under_test] {
            let mut c = Cluster::start_with_binary(flavor, bin.clone(), 1, &flags)
                .await
                .unwrap();
            let port = c.members[0].client_port;
            let mut seen = Vec::new();
            for (host, origin) in [
                (format!("127.0.0.1:{port}"), "http://a.example:80"),
                (format!("example.com:{port}"), "http://a.example:80"),
                (format!("example.com:{port}"), "http://evil.example:80"),
            ] {
                let out = Command::new("curl")
                    .args(["-s", "-i", "--max-time", "10", "-H"])
                    .arg(format!("Host: {host}"))
                    .arg("-H")
                    .arg(format!("Origin: {origin}"))
                    .arg(format!("http://127.0.0.1:{port}/health"))
                    .output()
                    .unwrap();
                let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
                let status = text.lines().next().unwrap_or("").to_string();
                let allow = text
                    .lines()
                    .find(|l| {
                        l.to_ascii_lowercase()
                            .starts_with("access-control-allow-origin:")
                    })
                    .map(|l| l.split_once(':').unwrap().1.trim().to_string());
                let body = text
                    .split_once("\n\n")
                    .map(|(_, b)| b.to_string())
                    .unwrap_or_default();
                seen.push((status, allow, body));
            }
            c.members[0].stop();
            answers.push((bin.display().to_string(), seen));
        }
        let (etcd, ours) = (&answers[0], &answers[1]);
        assert!(
            etcd.1[0].0.contains("421"),
            "etcd refuses the Host: {etcd:?}"
        );
        assert!(etcd.1[0].2.contains("CVE-2018-5702"), "{etcd:?}");
        assert!(etcd.1[1].0.contains("200"), "{etcd:?}");
        assert_eq!(
            etcd.1, ours.1,
            "\n{}: {:?}\n{}: {:?}",
            etcd.0, etcd.1, ours.0, ours.1
        );
    })
    .await;
}

/// A `unix://` client URL: etcd listens on the socket file named by the
/// URL's host (relative to its working directory); etcdctl reaches it as
/// `unix://name:port`. Same on etcd 3.5.1 and the server under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_unix_socket_client_url() {
    let flavor = test_flavor();
    bounded(LIMIT, async {
        let under_test = if flavor == Flavor::Retcd {
            retcd_bin()
        } else {
            etcd351_bin()
        };
        for bin in [etcd351_bin(), under_test] {
            let dir = tempfile::tempdir().unwrap();
            let (cp, pp, up) = (free_port(), free_port(), free_port());
            let sock = format!("localhost:{up}");
            let child = Command::new(&bin)
                .args(["--data-dir", "d", "--listen-client-urls"])
                .arg(format!("{},unix://{sock}", loopback_url(cp)))
                .args(["--advertise-client-urls", &loopback_url(cp)])
                .args(["--listen-peer-urls", &loopback_url(pp)])
                .args(["--initial-advertise-peer-urls", &loopback_url(pp)])
                .arg(format!("--initial-cluster=default={}", loopback_url(pp)))
                .current_dir(dir.path())
                .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
                .spawn()
                .unwrap();
            // etcdctl resolves the socket name in its own working directory
            let ctl = |args: &[&str]| {
                Command::new(retcd_tests::etcdctl35_bin())
                    .arg(format!("--endpoints=unix://{sock}"))
                    .args(["--dial-timeout=2s", "--command-timeout=5s"])
                    .args(args)
                    .env("ETCDCTL_API", "3")
                    .current_dir(dir.path())
                    .output()
                    .unwrap()
            };
            let put = retcd_tests::retry_until(
                Duration::from_secs(30),
                Duration::from_millis(200),
                async || {
                    let o = ctl(&["put", "u", "1"]);
                    if o.status.success() {
                        Ok(o)
                    } else {
                        Err(o)
                    }
                },
            )
            .await;
            let get = ctl(&["get", "u", "--print-value-only"]);
            let is_socket = {
                use std::os::unix::fs::FileTypeExt;
                std::fs::metadata(dir.path().join(&sock)).map(|m| m.file_type().is_socket())
            };
            stop_child(child);
            let put = put.unwrap_or_else(|o| panic!("{}: put over {sock}: {o:?}", bin.display()));
            assert!(put.status.success());
            assert_eq!(
                String::from_utf8_lossy(&get.stdout).trim(),
                "1",
                "{}: {get:?}",
                bin.display()
            );
            assert!(
                matches!(is_socket, Ok(true)),
                "{}: no socket file {sock}: {is_socket:?}",
                bin.display()
            );
        }
    })
    .await;
}
