//! The Watch service through the wire, with real clients: `etcdctl watch`
//! compared with real etcd, the `etcd-client` crate (many watchers on one
//! stream, bad requests, progress, compaction, `prev_kv` for watchers that
//! start while a key is being overwritten), an informer that survives a
//! restart, a 3-member history property and a slow consumer. Every test but
//! the differential one runs against the selected flavour
//! (`RETCD_TEST_FLAVOR=etcd` validates the test against real etcd).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchFilterType,
    WatchOptions, WatchResponse, WatchStream,
};
use retcd_tests::normalize::{normalize_json, normalize_text};
use retcd_tests::{bounded, etcdctl_bin, retry_until, test_flavor, Cluster, Flavor};
use retcd_tests::{limit::NORMAL as LIMIT, FAST, READY};

/// (mod revision, key, PUT/DELETE, value) of one event.
type Ev = (i64, String, &'static str, String);

fn ev_of(e: &etcd_client::Event) -> Ev {
    let kv = e.kv().expect("event kv");
    (
        kv.mod_revision(),
        String::from_utf8_lossy(kv.key()).into_owned(),
        match e.event_type() {
            EventType::Put => "PUT",
            EventType::Delete => "DELETE",
        },
        String::from_utf8_lossy(kv.value()).into_owned(),
    )
}

/// The next response, bounded.
async fn next(s: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("a watch response within 10s")
        .expect("watch stream error")
        .expect("watch stream ended")
}

// ---------------------------------------------------------------- etcdctl

/// `etcdctl watch ARGS` in the background; its output is collected as it
/// comes. Killed by PID when finished or dropped.
struct BgWatch {
    child: Child,
    out: Arc<Mutex<(String, String)>>,
}

impl BgWatch {
    fn start(endpoint: &str, args: &[&str]) -> BgWatch {
        let mut child = Command::new(etcdctl_bin())
            .env("ETCDCTL_API", "3")
            .env_remove("ETCDCTL_ENDPOINTS")
            .arg(format!("--endpoints={endpoint}"))
            .arg("watch")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn etcdctl watch");
        let out = Arc::new(Mutex::new((String::new(), String::new())));
        let so = child.stdout.take().expect("stdout");
        let se = child.stderr.take().expect("stderr");
        let (o1, o2) = (out.clone(), out.clone());
        std::thread::spawn(move || {
            for l in BufReader::new(so).lines().map_while(Result::ok) {
                let mut g = o1.lock().unwrap();
                g.0.push_str(&l);
                g.0.push('\n');
            }
        });
        std::thread::spawn(move || {
            for l in BufReader::new(se).lines().map_while(Result::ok) {
                let mut g = o2.lock().unwrap();
                g.1.push_str(&l);
                g.1.push('\n');
            }
        });
        BgWatch { child, out }
    }

    /// Waits (at most 15 s) until the watcher printed something.
    async fn wait_output(&self) {
        let printed = async || {
            (!self.out.lock().unwrap().0.is_empty())
                .then_some(())
                .ok_or(())
        };
        let _ = retry_until(Duration::from_secs(15), Duration::from_millis(50), printed).await;
    }

    /// Waits until the output has been quiet for a second (at most 15 s),
    /// stops the process and returns its normalised stdout and stderr.
    /// Quiescence rather than a fixed sleep keeps this right on a loaded
    /// machine.
    async fn finish(mut self) -> (String, String) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut last = self.out.lock().unwrap().clone();
        let mut quiet_since = Instant::now();
        while Instant::now() < deadline && quiet_since.elapsed() < Duration::from_secs(1) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let now = self.out.lock().unwrap().clone();
            if now != last {
                last = now;
                quiet_since = Instant::now();
            }
        }
        let _ = Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        // Let the reader threads drain the pipes.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (so, se) = self.out.lock().unwrap().clone();
        let norm = |s: &str| {
            s.lines()
                .map(|l| match serde_json::from_str::<serde_json::Value>(l) {
                    Ok(mut v) if v.is_object() => {
                        normalize_json(&mut v);
                        v.to_string()
                    }
                    _ => normalize_text(l),
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        (norm(&so), norm(&se))
    }
}

impl Drop for BgWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the same script on `c` and returns every watcher's output, named.
async fn watch_script(c: &Cluster) -> Vec<(String, (String, String))> {
    let ep = c.members[0].endpoint();
    let ctl = |args: &[&str]| {
        let o = c.etcdctl(args);
        assert!(o.success(), "etcdctl {args:?}: {o:?}");
    };
    ctl(&["put", "k/a", "1"]);
    ctl(&["put", "k/b", "2"]);
    ctl(&["put", "other", "x"]);
    // live watchers from revision 5 (deterministic even if they connect late)
    let live: Vec<(&str, Vec<&str>)> = vec![
        (
            "live prefix prev-kv",
            vec!["--rev=5", "--prefix", "k/", "--prev-kv"],
        ),
        ("live key", vec!["--rev=5", "k/a"]),
        ("live range", vec!["--rev=5", "k/b", "k/d"]),
    ];
    let mut bg: Vec<(String, BgWatch)> = live
        .iter()
        .map(|(n, a)| (n.to_string(), BgWatch::start(&ep, a)))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    ctl(&["put", "k/a", "3"]);
    let o = c.etcdctl_stdin(
        &["txn"],
        "value(\"k/a\") = \"3\"\n\nput k/c 4\ndel k/b\n\n\n",
    );
    assert!(o.success(), "txn: {o:?}");
    ctl(&["put", "k/d", "5"]);
    ctl(&["del", "k/", "--prefix"]);
    ctl(&["put", "k/a", "6"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // history watchers: the whole history arrives in one response
    let hist: Vec<(&str, Vec<&str>)> = vec![
        ("hist json", vec!["--rev=1", "--prefix", "k/", "-w", "json"]),
        ("hist prev-kv", vec!["--rev=2", "k/a", "--prev-kv"]),
        (
            "hist prev-kv json",
            vec!["--rev=3", "--prefix", "k", "--prev-kv", "-w", "json"],
        ),
    ];
    for (n, a) in &hist {
        bg.push((n.to_string(), BgWatch::start(&ep, a)));
    }
    // Every watcher has its history before the compaction below.
    for (_, w) in &bg {
        w.wait_output().await;
    }
    ctl(&["compact", "6"]);
    let after: Vec<(&str, Vec<&str>)> = vec![
        ("compacted json", vec!["--rev=3", "k/a", "-w", "json"]),
        ("compacted", vec!["--rev=5", "--prefix", "k/"]),
        // From just after the compaction revision. (From exactly the
        // compaction revision is racy on etcd: a tombstone at that revision
        // is there or not depending on its background compaction.)
        (
            "after compaction",
            vec!["--rev=7", "--prefix", "k/", "-w", "json"],
        ),
    ];
    for (n, a) in &after {
        bg.push((n.to_string(), BgWatch::start(&ep, a)));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut out = Vec::new();
    for (n, w) in bg {
        out.push((n, w.finish().await));
    }
    out
}

/// `etcdctl watch` (live, history, --prev-kv, --prefix, from-key, -w json,
/// compacted) prints the same against real etcd and the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_etcdctl_differential() {
    bounded(LIMIT, async {
        let reference = Cluster::start(Flavor::Etcd, 1, FAST).await.expect("etcd");
        let target = Cluster::start(test_flavor(), 1, FAST).await.expect("target");
        let (r, t) = tokio::join!(watch_script(&reference), watch_script(&target));
        let mut failures = Vec::new();
        for ((name, ro), (_, to)) in r.iter().zip(&t) {
            assert!(
                !ro.0.is_empty() || !ro.1.is_empty(),
                "script bug: etcd printed nothing for {name}"
            );
            if ro != to {
                failures.push(format!(
                    "{name}:\n reference stdout:\n{}\n stderr: {}\n target stdout:\n{}\n stderr: {}",
                    ro.0, ro.1, to.0, to.1
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    })
    .await;
}

// ------------------------------------------------------------ etcd-client

/// Several watchers on one stream: ids, prev_kv, filters, client-chosen
/// ids, refused creates, cancel, progress, compacted start revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_client_many_watchers_one_stream() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("connect");
        cl.put("a", "0", None).await.unwrap(); // rev 2
        let mut s = cl.watch("a", None).await.expect("watch");
        let r = next(&mut s).await;
        assert!(r.created() && !r.canceled());
        assert_eq!((r.watch_id(), r.header().unwrap().revision()), (0, 2));

        s.watch("b", Some(WatchOptions::new().with_prefix().with_prev_key()))
            .await
            .unwrap();
        let r = next(&mut s).await;
        assert_eq!((r.created(), r.watch_id()), (true, 1));
        s.watch(
            "c",
            Some(
                WatchOptions::new()
                    .with_filters([WatchFilterType::NoPut])
                    .with_watch_id(100),
            ),
        )
        .await
        .unwrap();
        let r = next(&mut s).await;
        assert_eq!((r.created(), r.watch_id()), (true, 100));
        // refused: duplicate id, inverted range
        s.watch("x", Some(WatchOptions::new().with_watch_id(100)))
            .await
            .unwrap();
        let r = next(&mut s).await;
        assert!(r.created() && r.canceled());
        assert_eq!(r.watch_id(), -1);
        assert_eq!(
            r.cancel_reason(),
            "mvcc: duplicate watch ID provided on the WatchStream"
        );
        s.watch("z", Some(WatchOptions::new().with_range("a")))
            .await
            .unwrap();
        let r = next(&mut s).await;
        assert!(r.created() && r.canceled());
        assert_eq!(
            (r.watch_id(), r.cancel_reason()),
            (-1, "mvcc: watcher range is empty")
        );
        // unknown cancel: ignored (the next response is the progress one)
        s.cancel(777).await.unwrap();
        s.request_progress().await.unwrap();
        let r = next(&mut s).await;
        assert_eq!(r.watch_id(), -1);
        assert!(!r.created() && !r.canceled() && r.events().is_empty());
        assert_eq!(r.header().unwrap().revision(), 2);

        cl.put("b1", "1", None).await.unwrap(); // 3
        cl.put("b1", "2", None).await.unwrap(); // 4
        cl.put("c", "1", None).await.unwrap(); // 5, filtered for 100
        cl.delete("c", None).await.unwrap(); // 6
        cl.put("a", "1", None).await.unwrap(); // 7
        let mut got: Vec<(i64, Ev, Option<String>)> = Vec::new();
        while got.len() < 4 {
            let r = next(&mut s).await;
            for e in r.events() {
                let prev = e
                    .prev_kv()
                    .map(|p| String::from_utf8_lossy(p.value()).into_owned());
                got.push((r.watch_id(), ev_of(e), prev));
            }
        }
        let ev = |r: i64, k: &str, t: &'static str, v: &str| (r, k.to_string(), t, v.to_string());
        assert_eq!(
            got,
            vec![
                (1, ev(3, "b1", "PUT", "1"), None),
                (1, ev(4, "b1", "PUT", "2"), Some("1".into())),
                (100, ev(6, "c", "DELETE", ""), None),
                (0, ev(7, "a", "PUT", "1"), None),
            ]
        );
        // cancel watcher 1: canceled response, then nothing more for it
        s.cancel(1).await.unwrap();
        let r = next(&mut s).await;
        assert_eq!((r.watch_id(), r.canceled()), (1, true));
        cl.put("b2", "x", None).await.unwrap(); // 8
        cl.put("a", "2", None).await.unwrap(); // 9
        let r = next(&mut s).await;
        assert_eq!(r.watch_id(), 0);
        assert_eq!(ev_of(&r.events()[0]).0, 9);

        // compacted start revision
        cl.compact(7, None).await.unwrap();
        s.watch("a", Some(WatchOptions::new().with_start_revision(3)))
            .await
            .unwrap();
        let r = next(&mut s).await;
        assert!(r.created());
        let id = r.watch_id();
        let r = next(&mut s).await;
        assert_eq!(r.watch_id(), id);
        assert!(r.canceled());
        assert_eq!(r.compact_revision(), 7);
        // the stream still serves the others
        cl.put("a", "3", None).await.unwrap(); // 10
        let r = next(&mut s).await;
        assert_eq!((r.watch_id(), ev_of(&r.events()[0]).0), (0, 10));
    })
    .await;
}

/// One committed event fanned out to watchers that asked for different
/// things, on two streams: each gets it exactly as it asked (with or
/// without prev_kv, filtered or not), and a txn's events reach a watcher in
/// one response. retcd encodes each event once per batch for all watchers;
/// this checks what they decode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_one_event_many_watchers_each_as_asked() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("connect");
        let base = cl
            .put("other", "-", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let prev = || WatchOptions::new().with_prev_key();
        // (stream, watch id): what it asked
        let mut s1 = cl.watch("k", None).await.unwrap(); // id 0 plain
        s1.watch("k", Some(prev())).await.unwrap(); // 1 prev_kv
        s1.watch(
            "k",
            Some(
                prev()
                    .with_prefix()
                    .with_filters([WatchFilterType::NoDelete]),
            ),
        )
        .await
        .unwrap(); // 2 prefix, prev_kv, no deletes
        let mut s2 = cl.watch("k", Some(prev())).await.unwrap(); // id 0 prev_kv
        s2.watch(
            "",
            Some(
                WatchOptions::new()
                    .with_all_keys()
                    .with_filters([WatchFilterType::NoPut]),
            ),
        )
        .await
        .unwrap(); // 1 every key, no puts
        for _ in 0..3 {
            assert!(next(&mut s1).await.created());
        }
        for _ in 0..2 {
            assert!(next(&mut s2).await.created());
        }
        cl.put("k", "1", None).await.unwrap(); // base+1
        cl.put("k", "2", None).await.unwrap(); // +2
        cl.txn(Txn::new().and_then(vec![
            TxnOp::put("k", "3", None),
            TxnOp::put("k2", "x", None),
        ]))
        .await
        .unwrap(); // +3
        cl.delete("k", None).await.unwrap(); // +4

        // (watch id, event, prev value, index of the response it came in)
        type Got = Vec<(i64, Ev, Option<String>, usize)>;
        async fn collect(s: &mut WatchStream, n: usize) -> Got {
            let mut got = Vec::new();
            let mut resp = 0;
            while got.len() < n {
                let r = next(s).await;
                resp += 1;
                for e in r.events() {
                    let prev = e
                        .prev_kv()
                        .map(|p| String::from_utf8_lossy(p.value()).into_owned());
                    got.push((r.watch_id(), ev_of(e), prev, resp));
                }
            }
            got
        }
        let mut g1 = collect(&mut s1, 12).await;
        let mut g2 = collect(&mut s2, 5).await;
        // a txn's events reach each watcher in one response
        let txn_resps: Vec<usize> = g1
            .iter()
            .filter(|g| g.0 == 2 && g.1 .0 == base + 3)
            .map(|g| g.3)
            .collect();
        assert_eq!(txn_resps.len(), 2, "{g1:?}");
        assert_eq!(txn_resps[0], txn_resps[1], "{g1:?}");
        let strip = |g: &mut Got| {
            g.sort_by_key(|x| x.0); // stable: per watcher in arrival order
            g.iter()
                .map(|(id, e, p, _)| (*id, e.clone(), p.clone()))
                .collect::<Vec<_>>()
        };
        let ev =
            |r: i64, k: &str, t: &'static str, v: &str| (base + r, k.to_string(), t, v.to_string());
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            strip(&mut g1),
            vec![
                (0, ev(1, "k", "PUT", "1"), None),
                (0, ev(2, "k", "PUT", "2"), None),
                (0, ev(3, "k", "PUT", "3"), None),
                (0, ev(4, "k", "DELETE", ""), None),
                (1, ev(1, "k", "PUT", "1"), None),
                (1, ev(2, "k", "PUT", "2"), s("1")),
                (1, ev(3, "k", "PUT", "3"), s("2")),
                (1, ev(4, "k", "DELETE", ""), s("3")),
                (2, ev(1, "k", "PUT", "1"), None),
                (2, ev(2, "k", "PUT", "2"), s("1")),
                (2, ev(3, "k", "PUT", "3"), s("2")),
                (2, ev(3, "k2", "PUT", "x"), None),
            ]
        );
        assert_eq!(
            strip(&mut g2),
            vec![
                (0, ev(1, "k", "PUT", "1"), None),
                (0, ev(2, "k", "PUT", "2"), s("1")),
                (0, ev(3, "k", "PUT", "3"), s("2")),
                (0, ev(4, "k", "DELETE", ""), s("3")),
                (1, ev(4, "k", "DELETE", ""), None),
            ]
        );
    })
    .await;
}

/// Watchers asking for `prev_kv` start and stop while one key is
/// overwritten again and again: every event any of them gets carries the
/// value it replaced. (retcd reads that value at apply only while such a
/// watcher exists; one that starts between a put's apply and its
/// notification gets it read then — this drives that window through the
/// wire.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prev_kv_for_watchers_started_during_writes() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("connect");
        cl.put("pk", "0", None).await.unwrap();
        const PUTS: u64 = 600;
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let mut w = c.client(0).await.expect("connect");
            let done = done.clone();
            tokio::spawn(async move {
                for i in 1..=PUTS {
                    w.put("pk", i.to_string(), None).await.unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        };
        let (mut watchers, mut checked) = (0u32, 0u32);
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let mut s = cl
                .watch("pk", Some(WatchOptions::new().with_prev_key()))
                .await
                .unwrap();
            assert!(next(&mut s).await.created());
            watchers += 1;
            // up to two events, then the stream (and its watcher) goes
            let mut got = 0;
            while got < 2 {
                let r = match tokio::time::timeout(Duration::from_millis(300), s.message()).await {
                    Ok(m) => m.expect("watch stream error").expect("stream ended"),
                    Err(_) => break, // the writer finished meanwhile
                };
                for e in r.events() {
                    let kv = e.kv().expect("kv");
                    let v: u64 = String::from_utf8_lossy(kv.value()).parse().unwrap();
                    let prev = e
                        .prev_kv()
                        .map(|p| String::from_utf8_lossy(p.value()).into_owned());
                    assert_eq!(
                        prev,
                        Some((v - 1).to_string()),
                        "event at {} (value {v}) for watcher {watchers}",
                        kv.mod_revision()
                    );
                    got += 1;
                    checked += 1;
                }
            }
        }
        writer.await.unwrap();
        assert!(watchers >= 20, "only {watchers} watchers started");
        assert!(checked >= 20, "only {checked} events checked");
    })
    .await;
}

// --------------------------------------------------------------- informer

/// Applies the events of `r` to `cache`; `last` is the last revision seen
/// (events of one revision, e.g. a txn, share it).
fn apply_to(cache: &mut BTreeMap<String, String>, r: &WatchResponse, last: &mut i64) {
    let before = *last;
    for e in r.events() {
        let (rev, k, t, v) = ev_of(e);
        assert!(
            rev > before && rev >= *last,
            "event at {rev} after {last}: duplicate or out of order"
        );
        *last = rev;
        if t == "PUT" {
            cache.insert(k, v);
        } else {
            cache.remove(&k);
        }
    }
}

async fn list(cl: &mut Client, prefix: &str) -> (i64, BTreeMap<String, String>) {
    let r = cl
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .expect("list");
    let m = r
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect();
    (r.header().unwrap().revision(), m)
}

/// Opens a watch on `prefix` from `rev` (retrying while the member is down).
async fn open_watch(c: &Cluster, i: usize, prefix: &str, rev: i64) -> WatchStream {
    retry_until(READY, Duration::from_millis(200), async || {
        let mut cl = c.client(i).await?;
        let mut s = cl
            .watch(
                prefix,
                Some(WatchOptions::new().with_prefix().with_start_revision(rev)),
            )
            .await?;
        let r = tokio::time::timeout(Duration::from_secs(5), s.message())
            .await
            .map_err(|_| anyhow::anyhow!("no created response"))??
            .ok_or_else(|| anyhow::anyhow!("stream ended"))?;
        anyhow::ensure!(r.created(), "first response is not `created`");
        anyhow::Ok(s)
    })
    .await
    .unwrap_or_else(|e| panic!("cannot open a watch: {e:#}"))
}

/// A writer of puts/deletes under `prefix` through member `i`; ops that
/// fail (member restarting) are retried with a new client.
async fn writer(eps: Vec<String>, prefix: String, n: usize, seed: u64) {
    let mut cl: Option<Client> = None;
    let mut done = 0;
    while done < n {
        if cl.is_none() {
            cl = retcd_tests::cluster::connect(&eps).await.ok();
            if cl.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let c = cl.as_mut().expect("client");
        let k = format!("{prefix}{}", (seed as usize * 7 + done * 13) % 17);
        let res = match done % 5 {
            3 => c.delete(k, None).await.map(|_| ()),
            4 => {
                let other = format!("{prefix}t{}", done % 3);
                c.txn(
                    Txn::new()
                        .when([Compare::version(k.clone(), CompareOp::Greater, 0)])
                        .and_then([
                            TxnOp::delete(k.clone(), None),
                            TxnOp::put(other.clone(), format!("t{seed}.{done}"), None),
                        ])
                        .or_else([
                            TxnOp::put(k.clone(), format!("txn{seed}.{done}"), None),
                            TxnOp::put(other, format!("e{seed}.{done}"), None),
                        ]),
                )
                .await
                .map(|_| ())
            }
            _ => c
                .put(k, format!("v{seed}.{done}"), Some(PutOptions::new()))
                .await
                .map(|_| ()),
        };
        match res {
            Ok(()) => done += 1,
            Err(_) => {
                cl = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// List + watch from rev+1, writes meanwhile, the member restarts mid-way,
/// the watch resumes from the last seen revision + 1; the cache ends equal
/// to a fresh list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_informer_survives_restart() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("connect");
        for i in 0..5 {
            cl.put(format!("inf/{i}"), "init", None).await.unwrap();
        }
        let (rev, mut cache) = list(&mut cl, "inf/").await;
        let mut last = rev;
        let mut s = open_watch(&c, 0, "inf/", last + 1).await;
        let w = tokio::spawn(writer(c.endpoints(), "inf/".into(), 300, 1));
        // consume a while, restart, resume
        let until = Instant::now() + Duration::from_millis(800);
        while Instant::now() < until {
            if let Ok(Ok(Some(r))) =
                tokio::time::timeout(Duration::from_millis(200), s.message()).await
            {
                apply_to(&mut cache, &r, &mut last);
            }
        }
        drop(s);
        c.members[0].kill();
        c.restart_member(0, READY).await.expect("restart");
        let mut s = open_watch(&c, 0, "inf/", last + 1).await;
        w.await.expect("writer");
        let mut cl = c.client(0).await.expect("connect");
        let (final_rev, fresh) = list(&mut cl, "inf/").await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while last < final_rev {
            assert!(
                Instant::now() < deadline,
                "watch stuck at {last}, want {final_rev}"
            );
            let r = next(&mut s).await;
            apply_to(&mut cache, &r, &mut last);
        }
        assert_eq!(cache, fresh);
    })
    .await;
}

// ------------------------------------------------ 3 members, history check

/// Collects events from a watch on `prefix` (starting at `from`) on member
/// `i` until revision `until`, reopening the stream from last seen + 1
/// whenever it breaks.
async fn follow(c: &Cluster, i: usize, prefix: &str, from: i64, until: i64) -> Vec<Ev> {
    let mut out: Vec<Ev> = Vec::new();
    let mut next_rev = from;
    while next_rev <= until {
        let mut s = open_watch(c, i, prefix, next_rev).await;
        // a broken stream ends the inner loop: resume from next_rev
        while let Ok(Ok(Some(r))) = tokio::time::timeout(Duration::from_secs(10), s.message()).await
        {
            assert!(!r.canceled(), "watch canceled: {}", r.cancel_reason());
            for e in r.events() {
                let e = ev_of(e);
                assert!(e.0 >= next_rev, "duplicate or reordered event {e:?}");
                next_rev = e.0; // events of one revision share it
                out.push(e);
            }
            if let Some(last) = out.last() {
                next_rev = last.0 + 1;
            }
            if next_rev > until {
                return out;
            }
        }
    }
    out
}

/// Panics with the first difference (the histories are long).
fn assert_same(got: &[Ev], want: &[Ev], what: &str) {
    if got == want {
        return;
    }
    let i = got.iter().zip(want).take_while(|(a, b)| a == b).count();
    panic!(
        "{what}: {} events, want {}; first difference at {i}: got {:?}, want {:?}",
        got.len(),
        want.len(),
        got.get(i),
        want.get(i)
    );
}

/// Writers on every member (puts, deletes, txns), watchers on every member
/// from revision 1 and from "now", one member restarted mid-stream: each
/// watcher's events equal the history, in order, no duplicates, no gaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_three_members_history() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("connect");
        cl.put("h/seed", "0", None).await.unwrap();
        let start = cl
            .get("h/seed", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let eps = c.endpoints();
        let writers: Vec<_> = (0..3)
            .map(|i| tokio::spawn(writer(vec![eps[i].clone()], "h/".into(), 120, i as u64)))
            .collect();
        tokio::time::sleep(Duration::from_millis(700)).await;
        c.members[1].kill();
        c.restart_member(1, READY).await.expect("restart member 1");
        for w in writers {
            w.await.expect("writer");
        }
        let mut cl = c.client(0).await.expect("connect");
        let end = cl
            .get("h/", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let reference = follow(&c, 0, "h/", 1, end).await;
        assert!(
            reference.len() > 300,
            "history too short: {}",
            reference.len()
        );
        let revs: Vec<i64> = reference.iter().map(|e| e.0).collect();
        assert!(revs.windows(2).all(|w| w[0] <= w[1]));
        for i in 0..3 {
            let from1 = follow(&c, i, "h/", 1, end).await;
            assert_same(&from1, &reference, &format!("member {i}, from revision 1"));
            let later = follow(&c, i, "h/", start + 1, end).await;
            let want: Vec<Ev> = reference.iter().filter(|e| e.0 > start).cloned().collect();
            assert_same(&later, &want, &format!("member {i}, from {}", start + 1));
        }
    })
    .await;
}

/// Watchers that were open during the writes and the restart (not opened
/// afterwards) see exactly the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_three_members_live_watchers_across_restart() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("connect");
        let start = cl
            .put("l/seed", "0", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        // live watchers on every member, consumed in tasks that resume on error
        let eps = c.endpoints();
        let mut live = Vec::new();
        for ep in eps.clone() {
            live.push(tokio::spawn(async move {
                let mut out: Vec<Ev> = Vec::new();
                let mut next_rev = start + 1;
                let stop = Instant::now() + Duration::from_secs(60);
                'outer: while Instant::now() < stop {
                    let Ok(mut cl) = retcd_tests::cluster::connect(std::slice::from_ref(&ep)).await
                    else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    let Ok(mut s) = cl
                        .watch(
                            "l/",
                            Some(
                                WatchOptions::new()
                                    .with_prefix()
                                    .with_start_revision(next_rev),
                            ),
                        )
                        .await
                    else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    loop {
                        match tokio::time::timeout(Duration::from_secs(3), s.message()).await {
                            Ok(Ok(Some(r))) => {
                                for e in r.events() {
                                    let e = ev_of(e);
                                    if e.1 == "l/stop" {
                                        break 'outer;
                                    }
                                    out.push(e.clone());
                                    next_rev = e.0 + 1;
                                }
                            }
                            Ok(_) => continue 'outer,
                            Err(_) => {} // idle
                        }
                    }
                }
                out
            }));
        }
        let writers: Vec<_> = (0..3)
            .map(|i| tokio::spawn(writer(vec![eps[i].clone()], "l/".into(), 100, i as u64)))
            .collect();
        tokio::time::sleep(Duration::from_millis(600)).await;
        c.members[2].stop();
        c.restart_member(2, READY).await.expect("restart member 2");
        for w in writers {
            w.await.expect("writer");
        }
        let mut cl = c.client(0).await.expect("connect");
        let end = cl
            .put("l/stop", "", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let mut reference = follow(&c, 0, "l/", start + 1, end - 1).await;
        reference.retain(|e| e.0 < end);
        for (i, h) in live.into_iter().enumerate() {
            let got = h.await.expect("live watcher");
            assert_same(&got, &reference, &format!("live watcher on member {i}"));
        }
    })
    .await;
}

// ---------------------------------------------------------- slow consumer

/// A watcher that does not read while writers run: puts stay fast, and the
/// watcher later receives every event in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_slow_consumer() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("connect");
        let value = "x".repeat(2048);
        let n = 1500;
        // 4 concurrent writers put n values under `prefix`; their latencies.
        let write = |prefix: &'static str| {
            let ep = c.endpoints();
            let value = value.clone();
            async move {
                let mut tasks = Vec::new();
                for w in 0..4 {
                    let (ep, value) = (ep.clone(), value.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut cl = retcd_tests::cluster::connect(&ep).await.unwrap();
                        let mut lat = Vec::new();
                        for i in 0..n / 4 {
                            let t = Instant::now();
                            cl.put(format!("{prefix}{w}/{i}"), value.clone(), None)
                                .await
                                .unwrap();
                            lat.push(t.elapsed());
                        }
                        lat
                    }));
                }
                let mut lat: Vec<Duration> = Vec::new();
                for t in tasks {
                    lat.extend(t.await.unwrap());
                }
                lat.sort();
                lat
            }
        };
        let mean = |l: &[Duration]| l.iter().sum::<Duration>() / l.len() as u32;
        // Baseline: the same writes with no watcher.
        let base = write("base/").await;
        let start = cl
            .put("slow/seed", "0", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let mut s = cl
            .watch("slow/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        assert!(next(&mut s).await.created());
        // The watcher reads nothing while the writers run.
        let slow = write("slow/").await;
        let (mb, ms) = (mean(&base), mean(&slow));
        eprintln!(
            "put mean {mb:?} (p99 {:?}) without a watcher, {ms:?} (p99 {:?}) with a stalled one",
            base[base.len() * 99 / 100],
            slow[slow.len() * 99 / 100]
        );
        // Issue 3: put latency stays within 2x of the run without that
        // consumer (plus 2 ms of slack for a shared, noisy machine).
        assert!(
            ms <= mb * 2 + Duration::from_millis(2),
            "put mean {ms:?} with a stalled watcher vs {mb:?} without"
        );
        let mut revs = Vec::new();
        while revs.len() < n {
            let r = next(&mut s).await;
            assert!(!r.canceled(), "canceled: {}", r.cancel_reason());
            revs.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        }
        assert_eq!(revs, ((start + 1)..=(start + n as i64)).collect::<Vec<_>>());
    })
    .await;
}

// ------------------------------------------- progress notify and fragments

/// `--experimental-watch-progress-notify-interval`: an idle watcher with
/// `progress_notify` gets empty responses; `fragment` splits a history
/// response larger than `--max-request-bytes` into pieces (all but the last
/// marked `fragment`) that together hold every event. The limit is etcd's:
/// `--max-request-bytes` plus gRPC's 512 KiB overhead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_progress_notify_and_fragment() {
    bounded(LIMIT, async {
        let mut flags = FAST.to_vec();
        flags.extend([
            "--experimental-watch-progress-notify-interval",
            "500ms",
            "--max-request-bytes",
            "1500",
        ]);
        let c = Cluster::start(test_flavor(), 1, &flags)
            .await
            .expect("start");
        let mut cl = c.client(0).await.expect("connect");
        const N: i64 = 400; // 400 x 1.4 KB > 1500 + 512 KiB
        let first = cl.put("f/0", "x".repeat(1400), None).await.unwrap();
        let first = first.header().unwrap().revision();
        for i in 1..N {
            cl.put(format!("f/{i}"), "x".repeat(1400), None)
                .await
                .unwrap();
        }
        let mut s = cl
            .watch("p", Some(WatchOptions::new().with_progress_notify()))
            .await
            .unwrap();
        let r = next(&mut s).await;
        assert!(r.created());
        let id = r.watch_id();
        let r = next(&mut s).await;
        assert_eq!((r.watch_id(), r.events().len()), (id, 0));
        assert_eq!(r.header().unwrap().revision(), first + N - 1);

        s.watch(
            "f/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(first)
                    .with_fragment(),
            ),
        )
        .await
        .unwrap();
        // etcd-client does not expose `fragment`: count the pieces instead
        let mut pieces = 0;
        let mut revs = Vec::new();
        while (revs.len() as i64) < N {
            let r = next(&mut s).await;
            if r.watch_id() == id || r.created() {
                continue;
            }
            pieces += 1;
            revs.extend(r.events().iter().map(|e| e.kv().unwrap().mod_revision()));
        }
        assert!(pieces >= 2, "not fragmented: {pieces} piece(s)");
        assert_eq!(revs, (first..first + N).collect::<Vec<_>>());
    })
    .await;
}
