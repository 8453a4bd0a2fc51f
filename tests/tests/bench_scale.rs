//! `retcd-bench compare --scale` works end to end at tiny sizes against a
//! real etcd and retcd that it starts itself: every scale kind (keys,
//! watchers, leases, compaction, soak) on both servers, one run. Its JSON
//! has every measure,
//! every key comes back from every list the server has (retcd has
//! `KV.RangeStream`; etcd before 3.7 answers UNIMPLEMENTED, recorded as
//! unsupported), every watcher sees every put, no lease kept alive
//! expires, the restart is timed; `--plot` and `plot --from` write PNG
//! charts, and the text output has the markdown tables. Like
//! `bench_smoke`, this checks that the tool measures, not the numbers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use retcd_tests::limit::SHORT as LIMIT;
use retcd_tests::{bench_bin, bounded, etcd_bin, retcd_bin};
use serde_json::Value;

/// The tool running as a child; dropped while it runs (the test timed
/// out or failed), it gets SIGTERM — on which it stops the servers it
/// started — and SIGKILL if it is still there 10 s later.
struct Bench {
    child: Child,
    done: bool,
}

impl Drop for Bench {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        retcd_launch::signal(self.child.id(), "TERM");
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `retcd-bench args` with stdout and stderr in files under `dir`,
/// waiting without blocking the runtime; its stdout. Panics with both
/// unless it exits 0.
async fn bench(dir: &Path, name: &str, args: &[&str]) -> String {
    let (out, err) = (
        dir.join(format!("{name}.stdout")),
        dir.join(format!("{name}.stderr")),
    );
    let child = Command::new(bench_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("run retcd-bench");
    let mut b = Bench { child, done: false };
    let status = loop {
        if let Some(st) = b.child.try_wait().expect("wait for retcd-bench") {
            b.done = true;
            break st;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        status.success(),
        "retcd-bench {args:?} failed ({status}):\nstdout:\n{stdout}\nstderr:\n{}",
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    stdout
}

fn f64_of(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

/// `v[key]` is a number > 0.
fn positive(v: &Value, key: &str) {
    let x = f64_of(&v[key], key);
    assert!(x > 0.0, "{key} = {x} in {v:#}");
}

/// `v[key]` is a number ≥ 0.
fn non_negative(v: &Value, key: &str) {
    let x = f64_of(&v[key], key);
    assert!(x >= 0.0, "{key} = {x} in {v:#}");
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000,
        "{} is not a PNG ({} bytes)",
        path.display(),
        bytes.len()
    );
}

const CHARTS: [&str; 5] = [
    "keys-list-time.png",
    "keys-rss.png",
    "keys-fill.png",
    "watchers.png",
    "leases-cpu.png",
];

/// Whether this etcd predates `KV.RangeStream` (etcd 3.7).
fn etcd_without_range_stream(version: &str) -> bool {
    ["3.4.", "3.5.", "3.6."]
        .iter()
        .any(|v| version.contains(&format!("Version: {v}")))
}

fn check_keys(p: &Value, etcd_version: &str) {
    let k = &p["keys"];
    assert_eq!(k["keys"], 300, "{k:#}");
    assert_eq!(k["revisions"], 2, "{k:#}");
    assert_eq!(k["fill_puts"], 600, "{k:#}");
    assert_eq!(k["fill_errors"], 0, "{k:#}");
    for m in [
        "fill_secs",
        "fill_puts_per_sec",
        "fill_p50_ms",
        "fill_p99_ms",
    ] {
        positive(k, m);
    }
    positive(k, "rss_filled_bytes");
    let unsupported = p["flavor"] == "etcd" && etcd_without_range_stream(etcd_version);
    for mode in ["list_unary", "list_paginated", "list_stream"] {
        let l = &k[mode];
        if mode == "list_stream" && unsupported {
            assert_eq!(l["status"], "unsupported", "{mode}: {l:#}");
            assert!(l["wall_secs"].is_null(), "{mode}: {l:#}");
            assert!(l["keys_received"].is_null(), "{mode}: {l:#}");
            continue;
        }
        assert_eq!(l["status"], "ok", "{} {mode}: {l:#}", p["flavor"]);
        assert_eq!(l["keys_received"], 300, "{mode}: {l:#}");
        assert!(l["error"].is_null(), "{mode}: {l:#}");
        for m in [
            "wall_secs",
            "responses",
            "rss_before_bytes",
            "rss_peak_bytes",
        ] {
            positive(l, m);
        }
        for m in ["rss_growth_bytes", "server_cpu_secs", "client_cpu_secs"] {
            non_negative(l, m);
        }
    }
    // 300 keys fit in one page of 500
    assert_eq!(k["list_paginated"]["responses"], 1, "{k:#}");
    let r = &k["restart"];
    non_negative(r, "stop_secs");
    positive(r, "ready_secs");
    positive(r, "rss_after_bytes");
}

fn check_watchers(p: &Value) {
    let w = &p["watchers"];
    assert_eq!(w["watchers"], 50, "{w:#}");
    assert_eq!(w["streams"], 5, "{w:#}");
    assert_eq!(w["puts"], 20, "{w:#}");
    assert_eq!(w["put_errors"], 0, "{w:#}");
    // every watcher sees every put
    assert_eq!(w["events_expected"], 50 * 20, "{w:#}");
    assert_eq!(w["events_delivered"], 50 * 20, "{w:#}");
    assert_eq!(w["events_missing"], 0, "{w:#}");
    for m in [
        "latency_p50_ms",
        "latency_p99_ms",
        "events_per_sec",
        "create_secs",
        "rss_before_bytes",
        "rss_with_watchers_bytes",
    ] {
        positive(w, m);
    }
    assert!(f64_of(&w["latency_p99_ms"], "p99") >= f64_of(&w["latency_p50_ms"], "p50"));
    assert!(f64_of(&w["rss_per_watcher_bytes"], "rss/watcher").is_finite());
    non_negative(w, "server_cpu_secs");
}

fn check_leases(p: &Value) {
    let l = &p["leases"];
    assert_eq!(l["leases"], 50, "{l:#}");
    assert_eq!(l["ttl_secs"], 3, "{l:#}");
    assert_eq!(l["grant_errors"], 0, "{l:#}");
    assert!(f64_of(&l["duration_secs"], "duration") >= 3.0, "{l:#}");
    // TTL 3 s: a keep-alive per lease every second, so ~3 per lease
    positive(l, "keepalives_per_sec");
    positive(l, "keepalives_sent");
    positive(l, "keepalive_responses");
    positive(l, "grant_secs");
    positive(l, "rss_bytes");
    non_negative(l, "server_cpu_secs");
    non_negative(l, "server_cpu_cores");
    assert_eq!(l["keepalive_errors"], 0, "{l:#}");
    assert_eq!(l["keepalive_expired"], 0, "{l:#}");
    assert_eq!(l["sampled"], 50, "{l:#}");
    assert_eq!(l["sample_errors"], 0, "{l:#}");
    assert_eq!(l["expired_early"], 0, "{l:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_scale_measures_every_kind_on_both_servers() {
    bounded(LIMIT, async {
        let tmp = tempfile::tempdir().expect("temp dir");
        let (etcd, retcd) = (etcd_bin(), retcd_bin());
        let charts: PathBuf = tmp.path().join("charts");
        let out = bench(
            tmp.path(),
            "scale",
            &[
                "-w",
                "json",
                "compare",
                "--runs",
                "1",
                "--scale",
                "keys,watchers",
                "--scale",
                "leases",
                "--sizes",
                "keys=300,watchers=50",
                "--sizes",
                "leases=50",
                "--revisions",
                "2",
                "--streams",
                "5",
                "--puts",
                "20",
                "--lease-ttl",
                "3",
                "--duration",
                "3",
                "--etcd-bin",
                etcd.to_str().unwrap(),
                "--retcd-bin",
                retcd.to_str().unwrap(),
                "--data-root",
                tmp.path().to_str().unwrap(),
                "--plot",
                charts.to_str().unwrap(),
            ],
        )
        .await;
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let etcd_version = v["etcd_version"].as_str().unwrap_or("").to_string();
        assert!(etcd_version.contains("etcd Version"), "{etcd_version}");
        assert!(v["retcd_version"].as_str().unwrap_or("").contains("retcd"));
        let points = v["points"].as_array().expect("points");
        assert_eq!(points.len(), 6, "3 kinds × 2 servers: {v:#}");
        for (kind, size) in [("keys", 300), ("watchers", 50), ("leases", 50)] {
            for flavor in ["etcd", "retcd"] {
                let p = points
                    .iter()
                    .find(|p| p["kind"] == kind && p["flavor"] == flavor)
                    .unwrap_or_else(|| panic!("no {flavor} {kind} point: {v:#}"));
                assert_eq!(p["size"], size, "{p:#}");
                assert_eq!(p["run"], 1, "{p:#}");
                assert!(p["error"].is_null(), "{flavor} {kind}: {}", p["error"]);
                match kind {
                    "keys" => check_keys(p, &etcd_version),
                    "watchers" => check_watchers(p),
                    _ => check_leases(p),
                }
            }
        }
        for c in CHARTS {
            assert_png(&charts.join(c));
        }

        // The same charts again from the saved JSON, and its tables.
        let saved = tmp.path().join("results.json");
        std::fs::write(&saved, &out).expect("save results");
        let again = tmp.path().join("again");
        let tables = bench(
            tmp.path(),
            "plot",
            &[
                "plot",
                "--from",
                saved.to_str().unwrap(),
                "--out",
                again.to_str().unwrap(),
            ],
        )
        .await;
        for c in CHARTS {
            assert_png(&again.join(c));
        }
        for s in [
            "### keys: fill, memory, restart — medians of 1 run(s)",
            "| keys | etcd fill puts/s | retcd fill puts/s | ratio |",
            "| 300 |",
            "### keys: KV.RangeStream",
            "### watchers — medians of 1 run(s)",
            "| 50 |",
            "### leases — medians of 1 run(s)",
        ] {
            assert!(tables.contains(s), "missing {s:?} in:\n{tables}");
        }
        assert!(!tables.contains("Errors:"), "{tables}");

        // The text output: a markdown table per kind, both servers and the ratio.
        let text = bench(
            tmp.path(),
            "text",
            &[
                "compare",
                "--runs",
                "1",
                "--scale",
                "leases",
                "--sizes",
                "20",
                "--lease-ttl",
                "3",
                "--duration",
                "1",
                "--etcd-bin",
                etcd.to_str().unwrap(),
                "--retcd-bin",
                retcd.to_str().unwrap(),
                "--data-root",
                tmp.path().to_str().unwrap(),
            ],
        )
        .await;
        for s in [
            "### leases — medians of 1 run(s)",
            "| leases | etcd server CPU s | retcd server CPU s | ratio |",
            "| 20 |",
        ] {
            assert!(text.contains(s), "missing {s:?} in:\n{text}");
        }
        assert!(!text.contains("Errors:"), "{text}");
    })
    .await;
}

/// The `compaction` kind (a store of N keys × R revisions compacted at its
/// head while puts go on) on both servers, and `--lists none` (keys: the
/// fill, memory and restart only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_scale_compaction_and_keys_without_lists() {
    bounded(LIMIT, async {
        let tmp = tempfile::tempdir().expect("temp dir");
        let (etcd, retcd) = (etcd_bin(), retcd_bin());
        let out = bench(
            tmp.path(),
            "compaction",
            &[
                "-w",
                "json",
                "compare",
                "--runs",
                "1",
                "--scale",
                "compaction,keys",
                "--sizes",
                "compaction=300,keys=100",
                "--compact-revisions",
                "3",
                "--put-rate",
                "200",
                "--compaction-baseline",
                "1",
                "--lists",
                "none",
                "--etcd-bin",
                etcd.to_str().unwrap(),
                "--retcd-bin",
                retcd.to_str().unwrap(),
                "--data-root",
                tmp.path().to_str().unwrap(),
            ],
        )
        .await;
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let points = v["points"].as_array().expect("points");
        assert_eq!(points.len(), 4, "2 kinds × 2 servers: {v:#}");
        for flavor in ["etcd", "retcd"] {
            let p = points
                .iter()
                .find(|p| p["kind"] == "compaction" && p["flavor"] == flavor)
                .unwrap_or_else(|| panic!("no {flavor} compaction point: {v:#}"));
            assert!(p["error"].is_null(), "{flavor}: {}", p["error"]);
            let c = &p["compaction"];
            assert_eq!(c["keys"], 300, "{c:#}");
            assert_eq!(c["revisions"], 3, "{c:#}");
            assert_eq!(c["fill_puts"], 900, "{c:#}");
            assert_eq!(c["fill_errors"], 0, "{c:#}");
            assert_eq!(c["revisions_removed"], 600, "{c:#}");
            // the head: the fill's 900 puts after revision 1, and the puts
            // that ran before the compaction was asked
            assert!(c["compact_revision"].as_i64().unwrap_or(0) > 901, "{c:#}");
            assert_eq!(c["put_errors"], 0, "{c:#}");
            for m in ["fill_puts_per_sec", "rss_filled_bytes", "compact_secs"] {
                positive(c, m);
            }
            for m in ["put_p99_ms", "put_max_ms", "server_cpu_secs", "puts"] {
                non_negative(c, m);
            }
            assert!(f64_of(&c["put_max_ms"], "max") >= f64_of(&c["put_p99_ms"], "p99"));
            // the baseline second of puts, and the stalls read off the
            // member's /metrics: fsyncs in both windows, one index
            // compaction and at least one deletion batch while it ran
            assert!(c["baseline_puts"].as_u64().unwrap_or(0) > 50, "{c:#}");
            assert!(f64_of(&c["baseline_secs"], "baseline") >= 1.0, "{c:#}");
            for w in ["stalls_baseline", "stalls_during"] {
                assert!(
                    c[w]["wal_fsync"]["count"].as_u64().unwrap_or(0) > 0,
                    "{w}: {c:#}"
                );
                assert!(
                    f64_of(&c[w]["wal_fsync"]["max_le_ms"], "max") > 0.0,
                    "{w}: {c:#}"
                );
            }
            let d = &c["stalls_during"];
            assert!(
                d["index_compaction_pause"]["count"].as_u64().unwrap_or(0) >= 1,
                "{c:#}"
            );
            assert!(
                d["db_compaction_pause"]["count"].as_u64().unwrap_or(0) >= 1,
                "{c:#}"
            );
            assert_eq!(
                c["stalls_baseline"]["db_compaction_pause"]["count"], 0,
                "{c:#}"
            );

            let k = points
                .iter()
                .find(|p| p["kind"] == "keys" && p["flavor"] == flavor)
                .unwrap_or_else(|| panic!("no {flavor} keys point: {v:#}"));
            assert!(k["error"].is_null(), "{flavor}: {}", k["error"]);
            let k = &k["keys"];
            assert_eq!(k["fill_puts"], 100, "{k:#}");
            for mode in ["list_unary", "list_paginated", "list_stream"] {
                assert_eq!(k[mode]["status"], "skipped", "{mode}: {k:#}");
            }
            positive(&k["restart"], "ready_secs");
        }
    })
    .await;
}

/// The `soak` kind (the k8s workload with periodic auto-compaction and a
/// defrag now and then, sampled per interval) on both servers, briefly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_scale_soak_samples_both_servers() {
    bounded(LIMIT, async {
        let tmp = tempfile::tempdir().expect("temp dir");
        let (etcd, retcd) = (etcd_bin(), retcd_bin());
        let out = bench(
            tmp.path(),
            "soak",
            &[
                "-w",
                "json",
                "compare",
                "--runs",
                "1",
                "--scale",
                "soak",
                "--sizes",
                "6",
                "--soak-rate",
                "200",
                "--soak-interval",
                "2",
                "--defrag-every",
                "3",
                "--soak-compaction-retention",
                "2s",
                "--etcd-bin",
                etcd.to_str().unwrap(),
                "--retcd-bin",
                retcd.to_str().unwrap(),
                "--data-root",
                tmp.path().to_str().unwrap(),
            ],
        )
        .await;
        let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let points = v["points"].as_array().expect("points");
        assert_eq!(points.len(), 2, "1 kind × 2 servers: {v:#}");
        for p in points {
            assert!(p["error"].is_null(), "{}: {}", p["flavor"], p["error"]);
            let x = &p["soak"];
            let samples = x["samples"].as_array().expect("samples");
            assert!(samples.len() >= 3, "{x:#}");
            assert_eq!(x["errors"], 0, "{x:#}");
            assert_eq!(x["defrag_errors"], 0, "{x:#}");
            assert!(x["defrags"].as_u64().unwrap_or(0) >= 1, "{x:#}");
            positive(x, "ops");
            positive(x, "watch_events");
            positive(x, "rss_max_bytes");
            for s in samples {
                positive(s, "ops_per_sec");
                positive(s, "p99_ms");
                positive(s, "rss_bytes");
                positive(s, "db_size_bytes");
            }
            for m in ["rss_slope_mib_per_hour", "p99_slope_ms_per_hour"] {
                assert!(f64_of(&x[m], m).is_finite(), "{x:#}");
            }
        }
    })
    .await;
}
