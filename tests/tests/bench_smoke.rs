//! `retcd-bench` works end to end on a tiny run: every workload against a
//! server started by the harness (retcd, or etcd with
//! `RETCD_TEST_FLAVOR=etcd`), its JSON output parses and counts exactly
//! `--total` requests with no error, the text output has etcd benchmark's
//! sections, and `compare` runs a tiny suite on both servers. These are
//! not timed benchmarks: numbers are not checked, only that the tool works.

use std::process::Command;

use retcd_tests::limit::LONG as LIMIT;
use retcd_tests::{bench_bin, bounded, retcd_bin, test_flavor, Cluster};

/// Runs the tool; panics with its output unless it exits 0.
fn bench(args: &[&str]) -> String {
    let out = Command::new(bench_bin())
        .args(args)
        .output()
        .expect("run retcd-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "retcd-bench {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs one workload with `-w json` and returns its report(s) as a list.
fn bench_json(ep: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["--endpoints", ep, "--no-progress", "-w", "json"];
    all.extend_from_slice(args);
    let out = bench(&all);
    match serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}")) {
        serde_json::Value::Array(v) => v,
        v => vec![v],
    }
}

fn assert_clean(r: &serde_json::Value, requests: u64) {
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["requests"].as_u64(), Some(requests), "{r:#}");
    assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0, "{r:#}");
    assert_eq!(r["percentiles_ms"].as_array().unwrap().len(), 8, "{r:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_workloads_run_end_to_end() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, &[]).await.expect("start");
        let ep = c.endpoints()[0].clone();
        let ep = ep.as_str();
        fn with<'a>(rest: &[&'a str]) -> Vec<&'a str> {
            [&["--conns", "2", "--clients", "4"][..], rest].concat()
        }

        let r = bench_json(
            ep,
            &with(&[
                "put",
                "--total",
                "60",
                "--val-size",
                "32",
                "--key-space-size",
                "20",
                "--sequential-keys",
            ]),
        );
        assert_clean(&r[0], 60);
        let r = bench_json(
            ep,
            &with(&[
                "txn-put",
                "--total",
                "30",
                "--txn-ops",
                "3",
                "--key-space-size",
                "100",
            ]),
        );
        assert_clean(&r[0], 30);
        for cons in ["l", "s"] {
            let r = bench_json(
                ep,
                &with(&["range", "foo", "--total", "40", "--consistency", cons]),
            );
            assert_clean(&r[0], 40);
        }
        let r = bench_json(
            ep,
            &with(&["txn-mixed", "a", "--total", "40", "--rw-ratio", "1"]),
        );
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0]["requests"].as_u64().unwrap() + r[1]["requests"].as_u64().unwrap(),
            40
        );
        let r = bench_json(ep, &with(&["lease-keepalive", "--total", "20"]));
        assert_clean(&r[0], 20);
        let r = bench_json(ep, &with(&["stm", "--total", "20", "--keys", "50"]));
        assert_clean(&r[0], 20);
        let r = bench_json(
            ep,
            &with(&["watch-get", "--total", "20", "--watchers", "3"]),
        );
        assert_clean(&r[0], 20);

        // 2 streams × 5 watchers on 2 keys, 10 puts → 50 events.
        let r = bench_json(
            ep,
            &with(&[
                "watch",
                "--streams",
                "2",
                "--watch-per-stream",
                "5",
                "--watched-key-total",
                "2",
                "--put-total",
                "10",
            ]),
        );
        assert_clean(&r[0], 10);
        assert_eq!(r[1]["extra"]["events_delivered"], 50, "{:#}", r[1]);
        assert_clean(&r[1], 50);

        let r = bench_json(
            ep,
            &with(&[
                "k8s",
                "--total",
                "60",
                "--objects",
                "30",
                "--namespaces",
                "2",
                "--list-limit",
                "4",
                "--watchers",
                "2",
            ]),
        );
        assert_clean(&r[0], 60);

        // etcd benchmark's text report.
        let text = bench(&["--endpoints", ep, "--no-progress", "put", "--total", "10"]);
        for s in [
            "Summary",
            "Total:",
            "Slowest:",
            "Fastest:",
            "Average:",
            "Stddev:",
            "Requests/sec:",
            "Response time histogram:",
            "Latency distribution:",
            "99.9% in",
        ] {
            assert!(text.contains(s), "missing {s:?} in:\n{text}");
        }
    })
    .await;
}

/// `compare` starts both servers itself: a tiny suite, one node, one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_compare_runs_both_servers() {
    bounded(LIMIT, async {
        let retcd = retcd_bin();
        let etcd = retcd_tests::etcd_bin();
        let out = bench(&[
            "compare",
            "--nodes",
            "1",
            "--runs",
            "1",
            "--scale",
            "0.002",
            "--rows",
            "put-1,put-100,range-s-100,watch-1000",
            "--etcd-bin",
            etcd.to_str().unwrap(),
            "--retcd-bin",
            retcd.to_str().unwrap(),
            // Pinning (taskset): servers and client on CPU 0.
            "--server-cpus",
            "0",
            "--client-cpus",
            "0",
        ]);
        for s in [
            "| workload | etcd ops/s | retcd ops/s |",
            "| put-100 |",
            // 100 000 × 0.002
            "| after put-100 (200 puts) |",
        ] {
            assert!(out.contains(s), "missing {s:?} in:\n{out}");
        }
        // server CPU, user and kernel apart: each row's line gives both
        // servers' "user / kernel" and the three ratios
        let split = out
            .split("| server CPU ms per 1000 requests, user / kernel |")
            .nth(1)
            .unwrap_or_else(|| panic!("no user/kernel table in:\n{out}"));
        let put = (split.lines())
            .find(|l| l.starts_with("| put-100 |"))
            .unwrap_or_else(|| panic!("no put-100 row in:\n{split}"));
        let cells: Vec<&str> = put.split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 8, "{put}");
        for c in &cells[2..4] {
            let parts: Vec<f64> = (c.split(" / "))
                .map(|v| v.parse().unwrap_or_else(|e| panic!("{e}: {put}")))
                .collect();
            assert_eq!(parts.len(), 2, "{put}");
            assert!(parts[0] + parts[1] > 0.0, "no CPU counted: {put}");
        }
    })
    .await;
}

/// `floor` (no server): a few durable writes over loopback; every request
/// is counted, each was fdatasynced (a sync time was measured), the
/// answering thread's CPU was read, and the latency loops (round trip
/// alone, write on a second thread) ran. Without the sync no sync time is.
#[test]
fn bench_floor_measures_lone_durable_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().to_str().expect("utf-8 path");
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["-w", "json", "floor", "--total", "40", "--dir", d];
        args.extend_from_slice(extra);
        let out = bench(&args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let synced = run(&[]);
    assert_eq!(synced["requests"], 40, "{synced:#}");
    assert_eq!(synced["synced"], true, "{synced:#}");
    assert!(
        synced["requests_per_sec"].as_f64().unwrap() > 0.0,
        "{synced:#}"
    );
    assert!(
        synced["fdatasync_p50_us"].as_f64().unwrap() > 0.0,
        "{synced:#}"
    );
    assert!(
        synced["server_cpu_us_per_request"].as_f64().unwrap() > 0.0,
        "{synced:#}"
    );
    // the three latency loops ran: the write, the round trip alone, the
    // write on a second thread
    for k in ["latency_p50_us", "rtt_p50_us", "handoff_latency_p50_us"] {
        assert!(synced[k].as_f64().unwrap() > 0.0, "{k}: {synced:#}");
    }
    let unsynced = run(&["--no-sync", "--bytes", "100"]);
    assert_eq!(unsynced["synced"], false, "{unsynced:#}");
    assert_eq!(unsynced["request_bytes"], 100, "{unsynced:#}");
    assert_eq!(
        unsynced["fdatasync_p50_us"].as_f64(),
        Some(0.0),
        "{unsynced:#}"
    );
}
