//! Compaction through the wire: the deletion of compacted revisions runs in
//! the background (as etcd's), so it never stalls the raft thread.
//!
//! * puts keep completing while ~100k revisions are being deleted, none
//!   fails, and afterwards compacted revisions answer etcd's error while the
//!   latest values are intact (flavour-generic);
//! * 3 members: HashKV at a fixed revision is the same on every member at
//!   every moment, mid-deletion and after; `physical` waits for the
//!   deletion; a `Maintenance.Snapshot` taken mid-deletion restores
//!   (`retcdutl snapshot restore`) into a member that finishes it;
//! * SIGKILL mid-deletion: the member resumes the deletion at restart and
//!   ends with exactly the others' key table.
//!
//! Progress is read from `etcd_debugging_mvcc_db_compaction_keys_total`
//! (rows deleted; retcd adds per batch) and, for retcd, from the
//! `scheduledCompactRev` / `finishedCompactRev` in a member's snapshot.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use etcd_client::{Client, CompactionOptions, GetOptions, Txn, TxnOp};
use retcd_tests::binaries::retcdutl_bin;
use retcd_tests::{bounded, grpc_error, retry_until, test_flavor, Cluster, Flavor};
use retcd_tests::{limit::SLOW as LIMIT, FAST, READY};
use tokio::time::{sleep, Instant};

const KEYS_TOTAL: &str = "etcd_debugging_mvcc_db_compaction_keys_total";
const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";

fn flags<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut v: Vec<&str> = FAST.to_vec();
    v.extend_from_slice(extra);
    v
}

/// An unlabelled sample of the member's `/metrics` (0 when absent).
fn metric(endpoint: &str, name: &str) -> f64 {
    let addr = endpoint.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read /metrics");
    out.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (n, v) = l.split_once(' ')?;
            (n == name).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0.0)
}

async fn keys_deleted(endpoint: String) -> u64 {
    tokio::task::spawn_blocking(move || metric(&endpoint, KEYS_TOTAL) as u64)
        .await
        .unwrap()
}

/// `txns` txns, each putting every key `k/000..k/{width}` (`width` rows
/// under one revision), from `clients` concurrent clients. Returns the
/// revision of the last one.
async fn history(c: &Cluster, width: usize, txns: usize, clients: usize) -> i64 {
    let mut tasks = Vec::new();
    for w in 0..clients {
        let mut cl = c.client_all().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            for t in (w..txns).step_by(clients) {
                let ops: Vec<TxnOp> = (0..width)
                    .map(|k| TxnOp::put(format!("k/{k:03}"), format!("v{t}"), None))
                    .collect();
                let r = cl.txn(Txn::new().and_then(ops)).await.unwrap();
                last = last.max(r.header().unwrap().revision());
            }
            last
        }));
    }
    let mut last = 0;
    for t in tasks {
        last = last.max(t.await.unwrap());
    }
    last
}

/// One member's snapshot (Maintenance.Snapshot: an etcd backend file).
async fn snapshot_bytes(c: &Cluster, i: usize) -> Vec<u8> {
    let mut cl = c.client(i).await.unwrap();
    let mut s = cl.snapshot().await.unwrap();
    let mut out = Vec::new();
    while let Some(m) = s.message().await.unwrap() {
        out.extend_from_slice(m.blob());
    }
    out
}

struct KeyTable {
    rows: BTreeMap<Vec<u8>, Vec<u8>>,
    scheduled: i64,
    finished: i64,
}

fn parse_snapshot(data: &[u8]) -> KeyTable {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snapshot.db");
    std::fs::write(&path, data).unwrap();
    let r = retcd_etcdfmt::BoltReader::open(&path).expect("an etcd snapshot");
    let mut t = KeyTable {
        rows: BTreeMap::new(),
        scheduled: -1,
        finished: -1,
    };
    let rev = |v: &[u8]| retcd_mvcc::Revision::parse(v).unwrap().0.main;
    retcd_etcdfmt::read_backend(&r, &mut |table, k, v| {
        match (table, k) {
            (1, _) => {
                t.rows.insert(k.to_vec(), v.to_vec());
            }
            (2, b"scheduledCompactRev") => t.scheduled = rev(v),
            (2, b"finishedCompactRev") => t.finished = rev(v),
            _ => {}
        }
        Ok(())
    })
    .unwrap();
    t
}

async fn key_table(c: &Cluster, i: usize) -> KeyTable {
    parse_snapshot(&snapshot_bytes(c, i).await)
}

async fn hash_at(c: &Cluster, i: usize, rev: i64) -> (u32, i64) {
    let mut cl = c.client(i).await.unwrap();
    let h = cl.hash_kv(rev).await.unwrap();
    (h.hash(), h.compact_version())
}

/// Every `k/` key with value, create and mod revision, version.
async fn all_keys(cl: &mut Client, rev: i64) -> Vec<(Vec<u8>, Vec<u8>, i64, i64, i64)> {
    let r = cl
        .get(
            "k/",
            Some(GetOptions::new().with_prefix().with_revision(rev)),
        )
        .await
        .unwrap();
    r.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key().to_vec(),
                kv.value().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect()
}

async fn assert_compacted(cl: &mut Client, rev: i64) {
    let e = cl
        .get("k/000", Some(GetOptions::new().with_revision(rev)))
        .await
        .unwrap_err();
    assert_eq!(
        grpc_error(&e),
        Some((tonic::Code::OutOfRange, COMPACTED.to_string())),
        "{e:?}"
    );
}

/// ~100k revisions on 128 keys, then a compaction while one client keeps
/// putting. The compaction request answers at once (the deletion is in the
/// background); puts complete between the deletion batches — shown by the
/// rows-deleted metric still below the total after they returned; none
/// fails. Reports the slowest put (the stall) for docs/design.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_compaction_of_a_large_history_does_not_stall_puts() {
    bounded(LIMIT, async {
        let flavor = test_flavor();
        let c = Cluster::start(flavor, 1, FAST).await.unwrap();
        let ep = c.endpoints()[0].clone();
        let (width, txns) = (128, 800);
        let t = Instant::now();
        let rev = history(&c, width, txns, 8).await;
        eprintln!("history: {} rows in {:?}", width * txns, t.elapsed());
        let doomed = (width * (txns - 1)) as u64;
        let mut cl = c.client(0).await.unwrap();
        let latest = all_keys(&mut cl, rev).await;
        assert_eq!(latest.len(), width);
        let base = keys_deleted(ep.clone()).await;

        // The writer: puts one after another; after each, samples how many
        // rows the compaction has deleted so far. It starts before the
        // compaction is sent and stops once every row is deleted.
        let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let mut cl = c.client(0).await.unwrap();
            let ep = ep.clone();
            let sent = sent.clone();
            tokio::spawn(async move {
                let mut go = Some(go_tx);
                // (latency, rows deleted after it, ok, compaction answered before it started)
                let mut samples: Vec<(Duration, u64, bool, bool)> = Vec::new();
                let started = Instant::now();
                for i in 0..1_000_000u64 {
                    let after = sent.load(std::sync::atomic::Ordering::SeqCst);
                    let t = Instant::now();
                    let ok = cl.put(format!("w/{}", i % 16), "v", None).await.is_ok();
                    let lat = t.elapsed();
                    let deleted = keys_deleted(ep.clone()).await - base;
                    samples.push((lat, deleted, ok, after));
                    if i == 20 {
                        if let Some(g) = go.take() {
                            let _ = g.send(());
                        }
                    }
                    if deleted >= doomed || started.elapsed() > Duration::from_secs(300) {
                        break;
                    }
                }
                samples
            })
        };
        go_rx.await.unwrap();
        let t = Instant::now();
        cl.compact(rev, None).await.unwrap();
        let compact_took = t.elapsed();
        sent.store(true, std::sync::atomic::Ordering::SeqCst);
        let samples = writer.await.unwrap();
        let failed = samples.iter().filter(|s| !s.2).count();
        // started after the compaction was answered, finished before the
        // deletion was complete
        let during: Vec<_> = samples.iter().filter(|s| s.2 && s.3 && s.1 < doomed).collect();
        let mid: Vec<_> = during.iter().filter(|s| s.1 > 0).collect();
        let slowest = samples.iter().map(|s| s.0).max().unwrap_or_default();
        eprintln!(
            "COMPACTION[{}]: {} revisions deleted; compact request {:?}; {} puts in all, {} completed mid-deletion (rows deleted strictly between 0 and {}), slowest put {:?}, failed {}",
            flavor.name(),
            doomed,
            compact_took,
            samples.len(),
            mid.len(),
            doomed,
            slowest,
            failed
        );
        assert_eq!(failed, 0, "a put failed during the compaction");
        assert_eq!(
            keys_deleted(ep.clone()).await - base,
            doomed,
            "every superseded revision deleted"
        );
        assert!(
            during.len() >= 10,
            "only {} puts completed while the deletion was running",
            during.len()
        );
        if flavor == Flavor::Retcd {
            // retcd counts per batch: puts completed between batches.
            assert!(
                mid.len() >= 10,
                "only {} puts completed with the deletion part-way",
                mid.len()
            );
        }
        assert_compacted(&mut cl, rev - 1).await;
        assert_compacted(&mut cl, 2).await;
        assert_eq!(all_keys(&mut cl, rev).await, latest);
        assert_eq!(all_keys(&mut cl, 0).await, latest);
    })
    .await;
}

/// Slow deletion (100 rows per batch, 20 ms apart) of ~19k revisions on
/// 3 members: at every sample every member's HashKV at a fixed revision is
/// the same — while deletions are part-way (at different points on each
/// member) and after. Then: their key tables are identical; `physical`
/// answers only after the deletion; a snapshot taken mid-deletion restores
/// into a member that finishes the deletion and hashes the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_hash_kv_equal_on_every_member_during_and_after_deletion() {
    if test_flavor() != Flavor::Retcd {
        return; // snapshot format and per-batch progress are retcd's
    }
    bounded(LIMIT, async {
        let slow = flags(&[
            "--experimental-compaction-batch-limit",
            "100",
            "--experimental-compaction-sleep-interval",
            "20ms",
        ]);
        let c = Cluster::start(Flavor::Retcd, 3, &slow).await.unwrap();
        let eps = c.endpoints();
        let (width, txns) = (64, 300);
        let rev = history(&c, width, txns, 4).await;
        let doomed = (width * (txns - 1)) as u64;
        let mut cl = c.client_all().await.unwrap();
        let hr = cl.put("marker", "x", None).await.unwrap().header().unwrap().revision();
        // every member has applied hr
        for i in 0..3 {
            let mut ci = c.client(i).await.unwrap();
            ci.get("marker", None).await.unwrap();
        }
        let h0 = hash_at(&c, 0, hr).await.0;
        cl.compact(rev, None).await.unwrap();
        // The compaction is applied on the member that answered; wait until
        // every member has applied it before comparing them.
        for i in 0..3 {
            let every = Duration::from_millis(10);
            retry_until(Duration::from_secs(20), every, async || {
                (hash_at(&c, i, hr).await.1 >= rev).then_some(()).ok_or(())
            })
            .await
            .unwrap_or_else(|()| panic!("member {i} did not apply the compaction at {rev}"));
        }

        let mut samples = 0;
        let mut mid = 0;
        let mut mid_snapshot: Option<Vec<u8>> = None;
        loop {
            let mut done = true;
            let mut hashes = Vec::new();
            for (i, ep) in eps.iter().enumerate() {
                let d = keys_deleted(ep.clone()).await;
                let (h, crev) = hash_at(&c, i, hr).await;
                assert_eq!(crev, rev, "member {i}: HashKV compact revision");
                hashes.push(h);
                if d > 0 && d < doomed {
                    mid += 1;
                    if mid_snapshot.is_none() {
                        let snap = snapshot_bytes(&c, i).await;
                        let t = parse_snapshot(&snap);
                        if t.finished < t.scheduled {
                            mid_snapshot = Some(snap);
                        }
                    }
                }
                done &= d >= doomed;
            }
            samples += 1;
            assert!(
                hashes.iter().all(|h| *h == hashes[0]),
                "HashKV({hr}) differs between members: {hashes:?} (sample {samples})"
            );
            if done {
                break;
            }
        }
        let (h, _) = hash_at(&c, 0, hr).await;
        eprintln!("HASHKV: {samples} samples, {mid} with a member part-way; hash before compaction {h0:x}, during and after {h:x}");
        assert!(mid > 0, "never saw a member part-way through the deletion");
        let mid_snapshot = mid_snapshot.expect("a snapshot taken mid-deletion");

        // after: identical key tables, finished == scheduled, errors
        let tables: Vec<KeyTable> = {
            let mut v = Vec::new();
            for i in 0..3 {
                // the metric reaches the total one (empty) batch before
                // finishedCompactRev is written
                v.push(wait_finished(&c, i, rev).await);
            }
            v
        };
        for (i, t) in tables.iter().enumerate() {
            assert_eq!((t.scheduled, t.finished), (rev, rev), "member {i}");
            assert_eq!(t.rows, tables[0].rows, "member {i}'s key table");
            let mut ci = c.client(i).await.unwrap();
            assert_compacted(&mut ci, rev - 1).await;
        }
        assert_eq!(tables[0].rows.len(), width + 1, "latest of each key + marker");

        // physical: answered only once this member's deletion is done
        let rev2 = history(&c, width, 20, 2).await;
        let mut c2 = c.client(2).await.unwrap();
        c2.compact(rev2, Some(CompactionOptions::new().with_physical()))
            .await
            .unwrap();
        let t = key_table(&c, 2).await;
        assert_eq!((t.scheduled, t.finished), (rev2, rev2));

        // a snapshot taken mid-deletion restores into a member that
        // resumes and finishes the deletion
        let file = c.dir().join("mid.db");
        std::fs::write(&file, &mid_snapshot).unwrap();
        let restored = restore_single(&file, &slow).await;
        let (rh, rcrev) = hash_at(&restored, 0, hr).await;
        assert_eq!((rh, rcrev), (h, rev), "restored member's HashKV({hr})");
        let rt = wait_finished(&restored, 0, rev).await;
        let want: BTreeMap<_, _> = tables[0].rows.clone();
        assert_eq!(rt.rows, want, "restored key table");
    })
    .await;
}

/// A new one-member cluster from `file` (`retcdutl snapshot restore`).
async fn restore_single(file: &std::path::Path, flags: &[&str]) -> Cluster {
    let mut dst = Cluster::start(Flavor::Retcd, 1, flags).await.unwrap();
    let token = dst.token();
    let m = &mut dst.members[0];
    let initial = format!("{}={}", m.name, m.peer_url());
    m.kill();
    std::fs::remove_dir_all(m.data_dir()).unwrap();
    let out = std::process::Command::new(retcdutl_bin())
        .args([
            "snapshot",
            "restore",
            &file.display().to_string(),
            "--name",
            &m.name,
            "--initial-cluster",
            &initial,
            "--initial-cluster-token",
            &token,
            "--initial-advertise-peer-urls",
            &m.peer_url(),
            "--data-dir",
            &m.data_dir().display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    m.start();
    dst.wait_all_ready(READY).await.unwrap();
    dst
}

/// Polls member `i`'s snapshot until its deletion of `rev` is finished.
async fn wait_finished(c: &Cluster, i: usize, rev: i64) -> KeyTable {
    loop {
        let t = key_table(c, i).await;
        assert!(t.scheduled >= rev, "scheduled {} < {rev}", t.scheduled);
        if t.finished >= rev {
            return t;
        }
        sleep(Duration::from_millis(200)).await;
    }
}

/// SIGTERM a member while it deletes: it stops promptly and cleanly. Then
/// SIGKILL another while it deletes: at restart it is compacted at the
/// same revision at once (HashKV equal to the others' while it resumes),
/// resumes the deletion, and ends with exactly the others' key table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_kill_mid_deletion_resumes_at_restart() {
    if test_flavor() != Flavor::Retcd {
        return;
    }
    bounded(LIMIT, async {
        let mut c = Cluster::start(
            Flavor::Retcd,
            3,
            &flags(&[
                "--experimental-compaction-batch-limit",
                "100",
                "--experimental-compaction-sleep-interval",
                "100ms",
            ]),
        )
        .await
        .unwrap();
        let (width, txns) = (64, 300);
        let rev = history(&c, width, txns, 4).await;
        let doomed = (width * (txns - 1)) as u64;
        let mut cl = c.client_all().await.unwrap();
        let hr = cl
            .put("marker", "x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        for i in 0..3 {
            c.client(i)
                .await
                .unwrap()
                .get("marker", None)
                .await
                .unwrap();
        }
        let victim = (c.leader(Duration::from_secs(10)).await.unwrap() + 1) % 3;
        let vep = c.endpoints()[victim].clone();
        cl.compact(rev, None).await.unwrap();
        // SIGTERM the third member part-way: no hang on the running
        // compaction, a clean exit, and the deletion resumes at restart
        let other = (victim + 1) % 3;
        let oep = c.endpoints()[other].clone();
        while keys_deleted(oep.clone()).await < 300 {
            sleep(Duration::from_millis(20)).await;
        }
        let st = c.members[other]
            .stop_within(Duration::from_secs(20))
            .expect("stopped");
        {
            use std::os::unix::process::ExitStatusExt;
            // a clean shutdown ends by re-raising SIGTERM, as etcd's does
            assert!(
                st.success() || st.signal() == Some(libc::SIGTERM),
                "SIGTERM mid-deletion: {st:?}"
            );
        }
        c.restart_member(other, READY).await.unwrap();
        assert!(c.members[other]
            .log()
            .contains("resume scheduled compaction"));
        // kill the victim part-way
        loop {
            let d = keys_deleted(vep.clone()).await;
            assert!(d < doomed, "deletion finished before the kill");
            if d >= 500 {
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
        c.members[victim].kill();
        let killed_at = keys_deleted(c.endpoints()[(victim + 2) % 3].clone()).await;
        eprintln!(
            "KILL: m{victim} killed part-way (another member had deleted {killed_at} of {doomed})"
        );
        c.restart_member(victim, READY).await.unwrap();
        let log = c.members[victim].log();
        assert!(
            log.contains("resume scheduled compaction"),
            "no resume in the log"
        );
        // compacted at once, same hash as the others while it resumes
        let mut resumed_mid = 0;
        loop {
            let d = keys_deleted(vep.clone()).await;
            let mut hashes = Vec::new();
            for i in 0..3 {
                hashes.push(hash_at(&c, i, hr).await);
            }
            assert!(
                hashes.iter().all(|h| *h == hashes[0]),
                "HashKV({hr}) differs: {hashes:?}"
            );
            assert_eq!(hashes[0].1, rev);
            let t = key_table(&c, victim).await;
            if t.finished >= rev {
                break;
            }
            if d > 0 {
                resumed_mid += 1;
            }
            sleep(Duration::from_millis(100)).await;
        }
        eprintln!("KILL: resumed deletion observed part-way {resumed_mid} times");
        assert!(
            keys_deleted(vep.clone()).await > 0,
            "nothing deleted after the restart"
        );
        let mut ci = c.client(victim).await.unwrap();
        assert_compacted(&mut ci, rev - 1).await;
        let mine = key_table(&c, victim).await;
        for i in 0..3 {
            if i != victim {
                let other = wait_finished(&c, i, rev).await;
                assert_eq!(mine.rows, other.rows, "m{victim} vs m{i}");
            }
        }
        assert_eq!(mine.rows.len(), width + 1);
    })
    .await;
}

/// Measurement, not a check (run by hand, release build):
/// `RETCD_BIN=target/release/retcd cargo test -p retcd-tests --test
/// compaction measure_compaction_stall -- --ignored --nocapture`
/// (`COMPACTION_MEASURE_TXNS`, default 7100 txns of 128 puts ≈ 909k
/// revisions). One client puts without pause from before the compaction
/// until its rows are deleted; prints the compaction request's latency,
/// the slowest put and the p99 while the deletion ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn measure_compaction_stall() {
    let flavor = test_flavor();
    let txns: usize = std::env::var("COMPACTION_MEASURE_TXNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7100);
    let c = Cluster::start(flavor, 1, FAST).await.unwrap();
    let ep = c.endpoints()[0].clone();
    let width = 128;
    let t = Instant::now();
    let rev = history(&c, width, txns, 8).await;
    eprintln!("history: {} revisions in {:?}", width * txns, t.elapsed());
    let doomed = (width * (txns - 1)) as u64;
    let base = keys_deleted(ep.clone()).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    let writer = {
        let mut cl = c.client(0).await.unwrap();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t = Instant::now();
                cl.put(format!("w/{}", i % 16), "v", None).await.unwrap();
                lat.push((t - started, t.elapsed()));
                i += 1;
            }
            lat
        })
    };
    sleep(Duration::from_secs(1)).await;
    let mut cl = c.client(0).await.unwrap();
    let c0 = started.elapsed();
    let t = Instant::now();
    cl.compact(rev, None).await.unwrap();
    let compact_took = t.elapsed();
    // until the rows are gone: the metric (retcd per batch, etcd at the
    // end); a build without it deleted everything before answering
    let mut quiet = 0;
    loop {
        let d = keys_deleted(ep.clone()).await - base;
        if d >= doomed {
            break;
        }
        if d == 0 {
            quiet += 1;
            if quiet > 40 && compact_took > Duration::from_secs(1) {
                break;
            }
        }
        sleep(Duration::from_millis(50)).await;
    }
    let c1 = started.elapsed();
    sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    if std::env::var_os("COMPACTION_MEASURE_METRICS").is_some() {
        let ep = ep.clone();
        let text = tokio::task::spawn_blocking(move || {
            let addr = ep.trim_start_matches("http://").to_string();
            let mut s = TcpStream::connect(&addr).unwrap();
            write!(
                s,
                "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
        .await
        .unwrap();
        for l in text.lines().filter(|l| {
            l.contains("compaction") || l.contains("backend_commit") || l.contains("wal_fsync")
        }) {
            eprintln!("  {l}");
        }
    }
    let lat = writer.await.unwrap();
    let mut during: Vec<Duration> = lat
        .iter()
        .filter(|(at, l)| *at + *l >= c0 && *at <= c1)
        .map(|(_, l)| *l)
        .collect();
    let mut before: Vec<Duration> = lat
        .iter()
        .filter(|(at, _)| *at < c0)
        .map(|(_, l)| *l)
        .collect();
    during.sort();
    before.sort();
    let p = |v: &[Duration], q: f64| {
        v.get(((v.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    eprintln!(
        "MEASURE[{}]: {} revisions compacted; compact request {:?}; deletion window {:?}; puts before: {} (p99 {:?}, max {:?}); during: {} (p50 {:?}, p99 {:?}, max {:?})",
        flavor.name(),
        doomed,
        compact_took,
        c1 - c0,
        before.len(),
        p(&before, 0.99),
        before.last().copied().unwrap_or_default(),
        during.len(),
        p(&during, 0.5),
        p(&during, 0.99),
        during.last().copied().unwrap_or_default(),
    );
}
