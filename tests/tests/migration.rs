//! Live migration with the real `etcdctl make-mirror` (issue 15): from a
//! real etcd into the flavour under test and back, while clients keep
//! writing to the source (puts, overwrites, deletes, range deletes, txns,
//! a nested txn, leases and their revocation, binary keys and values).
//!
//! Each of the first five tests below fills the source (1 500 keys,
//! so make-mirror's first copy reads two pages; overwritten and deleted
//! keys; a compaction), starts make-mirror as a child process, writes from
//! concurrent clients for a few seconds, stops, writes one last key (the
//! sentinel) and waits for it at the destination: make-mirror applies the
//! source's revisions in order, so once the sentinel is there everything
//! before it is. Then the key sets and values must be equal (revisions
//! cannot be: the destination numbers its own), keys written while
//! make-mirror ran must be among them, make-mirror must still be running
//! (it is then stopped by PID) and must have printed no error.
//!
//! * `mirror_etcd_to_sut_whole_keyspace`, `mirror_sut_to_etcd_whole_keyspace`
//! * `mirror_etcd_to_sut_prefixes`, `mirror_sut_to_etcd_prefixes`:
//!   `--prefix`, `--dest-prefix`, `--no-dest-prefix`, three mirrors at once
//! * `mirror_etcd_to_three_member_sut_through_a_follower` (smaller: 400 keys)
//! * `mirror_stops_on_a_revision_above_dest_max_txn_ops`
//! * `doc_cutover_commands_etcd_to_sut_and_back` runs the shell blocks of
//!   `docs/migration.md` as written (the doc names this test).
//!
//! The flavour under test is `RETCD_TEST_FLAVOR` (retcd by default); the
//! other side is always the real etcd, so `RETCD_TEST_FLAVOR=etcd` runs
//! every test etcd → etcd, which is how the tests themselves are checked.
//! etcdctl 3.4.23 (`/usr/bin/etcdctl`) and 3.5.1 (`etcdctl35_bin`) are
//! both used: their make-mirror is the same code (3.5 adds `--dest-user`
//! and `--dest-password`; neither has 3.6's `--rev` or `--max-txn-ops`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn,
    TxnOp,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_launch::signal;
use retcd_tests::{bounded, etcdctl35_bin, etcdctl_bin, retry_until, test_flavor};
use retcd_tests::{limit::LONG as LIMIT, workspace_root, Cluster, Flavor, FAST};
use tempfile::TempDir;

/// Keys and values of a whole keyspace.
type Keyspace = BTreeMap<Vec<u8>, Vec<u8>>;

/// How long the clients write while make-mirror runs.
const WRITE_FOR: Duration = Duration::from_secs(4);
/// How long the destination may take to catch up after the writes stop.
/// make-mirror writes one key or one source revision at a time and waits
/// for each answer: a debug build of retcd takes ~7 ms a put on one member
/// and ~20 ms on three (etcd: ~2 and ~5 ms), more when the machine is busy.
const CATCH_UP: Duration = Duration::from_secs(120);

/// How much a scenario writes.
#[derive(Clone, Copy)]
struct Size {
    /// Keys `app/base/NNNN` filled before make-mirror starts (a multiple
    /// of 100; above make-mirror's page of 1 000, its first copy reads
    /// two pages at one revision).
    base_app: usize,
    /// Keys `other/base/NNN` (a multiple of 100, at least 100).
    base_other: usize,
    /// Concurrent writing clients while make-mirror runs.
    writers: u64,
}

const FULL: Size = Size {
    base_app: 1200,
    base_other: 300,
    writers: 2,
};
/// The last key written to the source, under the mirrored prefix.
const SENTINEL: &[u8] = b"app/zz-sentinel";

fn flags() -> Vec<&'static str> {
    FAST.to_vec()
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ------------------------------------------------------------ keyspaces

/// The whole keyspace of one member (serializable: what that member has
/// applied; linearizable otherwise).
async fn dump(c: &mut Client, serializable: bool) -> anyhow::Result<Keyspace> {
    let mut opts = GetOptions::new().with_all_keys();
    if serializable {
        opts = opts.with_serializable();
    }
    let r = c.get("", Some(opts)).await?;
    Ok(r.kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
        .collect())
}

/// What make-mirror `--prefix P [--dest-prefix D | --no-dest-prefix]`
/// makes of `src`: the keys under `P`, with the first `P` replaced by `D`.
fn mapped(src: &Keyspace, v: &Variant) -> Keyspace {
    src.iter()
        .filter(|(k, _)| k.starts_with(v.prefix))
        .map(|(k, val)| {
            let mut nk = v.dest_prefix.to_vec();
            nk.extend_from_slice(&k[v.prefix.len()..]);
            (nk, val.clone())
        })
        .collect()
}

/// Panics, listing (at most 10 of) the differences, unless `got == want`.
fn assert_same(what: &str, want: &Keyspace, got: &Keyspace) {
    if want == got {
        return;
    }
    let mut diffs = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => diffs.push(format!("missing {:?} (= {:?})", show(k), show(v))),
            Some(g) if g != v => diffs.push(format!(
                "{:?}: want {:?}, got {:?}",
                show(k),
                show(v),
                show(g)
            )),
            _ => {}
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            diffs.push(format!("extra {:?} (= {:?})", show(k), show(v)));
        }
    }
    let n = diffs.len();
    diffs.truncate(10);
    panic!(
        "{what}: {} keys wanted, {} found, {n} differences:\n  {}",
        want.len(),
        got.len(),
        diffs.join("\n  ")
    );
}

// ------------------------------------------------------------ the source

/// Fills the source before make-mirror starts: `app/base/NNNN` and
/// `other/base/NNN` in txns of 100 puts, ten keys overwritten five times,
/// a deleted range, a deleted prefix, a key on a long lease, a binary key
/// and value; then compacts, so only the current revision is left.
async fn fill_source(c: &mut Client, size: Size) {
    for chunk in 0..size.base_app / 100 {
        let ops: Vec<TxnOp> = (chunk * 100..chunk * 100 + 100)
            .map(|i| TxnOp::put(format!("app/base/{i:04}"), format!("base-{i}"), None))
            .collect();
        c.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    for chunk in 0..size.base_other / 100 {
        let ops: Vec<TxnOp> = (chunk * 100..chunk * 100 + 100)
            .map(|i| TxnOp::put(format!("other/base/{i:03}"), format!("base-{i}"), None))
            .collect();
        c.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    for round in 0..5 {
        for i in 0..10 {
            c.put(
                format!("app/base/{i:04}"),
                format!("base-{i}-v{round}"),
                None,
            )
            .await
            .unwrap();
        }
    }
    // app/base/0010 .. app/base/0019
    let range = DeleteOptions::new().with_range("app/base/0020");
    let r = c.delete("app/base/0010", Some(range)).await.unwrap();
    assert_eq!(r.deleted(), 10);
    // other/base/000 .. other/base/009
    let r = c
        .delete("other/base/00", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(r.deleted(), 10);
    let lease = c.lease_grant(600, None).await.unwrap().id();
    c.put(
        "app/leased",
        "on a lease",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    c.put(
        b"app/bin/\x00\xff".to_vec(),
        vec![0u8, 1, 2, 0xfe, 0xff],
        None,
    )
    .await
    .unwrap();
    c.put("app/empty", "", None).await.unwrap();
    let rev = c.get("x", None).await.unwrap().header().unwrap().revision();
    c.compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .unwrap();
}

/// One random write to the source. Values written here start with
/// `live-`, so the destination shows which keys came over while the
/// mirror ran. No two operations of one txn touch the same key (etcd
/// refuses that).
async fn one_write(c: &mut Client, rng: &mut StdRng, tag: &str, base: u32) -> anyhow::Result<()> {
    let i: u32 = rng.random_range(0..100);
    let j = (i + 1 + rng.random_range(0..98)) % 100;
    let app = |n: u32| format!("app/live/{n:03}");
    let other = |n: u32| format!("other/live/{n:03}");
    match rng.random_range(0..100) {
        0..35 => {
            c.put(app(i), tag, None).await?;
        }
        35..48 => {
            c.put(other(i), tag, None).await?;
        }
        48..58 => {
            c.delete(app(i), None).await?;
        }
        58..62 => {
            c.delete(other(i), None).await?;
        }
        62..72 => {
            let txn = Txn::new()
                .when(vec![Compare::version(app(i), CompareOp::Greater, 0)])
                .and_then(vec![
                    TxnOp::put(app(i), format!("{tag}-then"), None),
                    TxnOp::delete(app(j), None),
                    TxnOp::put(other(i), format!("{tag}-then"), None),
                ])
                .or_else(vec![
                    TxnOp::put(app(i), format!("{tag}-else"), None),
                    TxnOp::put(app(j), format!("{tag}-else"), None),
                ]);
            c.txn(txn).await?;
        }
        72..75 => {
            let inner = Txn::new().and_then(vec![
                TxnOp::put(app(i), format!("{tag}-nested"), None),
                TxnOp::put(app(j), format!("{tag}-nested"), None),
            ]);
            let txn = Txn::new().and_then(vec![TxnOp::txn(inner), TxnOp::delete(other(i), None)]);
            c.txn(txn).await?;
        }
        75..80 => {
            // up to ten keys in one revision
            let p = format!("app/live/0{}", i % 10);
            c.delete(p, Some(DeleteOptions::new().with_prefix()))
                .await?;
        }
        80..86 => {
            let b: u32 = rng.random_range(0..base);
            c.put(format!("app/base/{b:04}"), tag, None).await?;
        }
        86..88 => {
            let b: u32 = rng.random_range(0..base);
            c.delete(format!("app/base/{b:04}"), None).await?;
        }
        88..93 => {
            let lease = c.lease_grant(600, None).await?.id();
            let opts = || Some(PutOptions::new().with_lease(lease));
            c.put(format!("app/lease/{i:03}"), tag, opts()).await?;
            c.put(format!("other/lease/{i:03}"), tag, opts()).await?;
            if rng.random_bool(0.5) {
                // both keys are deleted in one revision
                c.lease_revoke(lease).await?;
            }
        }
        _ => {
            let mut key = b"app/bin/".to_vec();
            key.extend_from_slice(&[i as u8, 0, 0xff]);
            let len = rng.random_range(0..64);
            let mut value = b"live-".to_vec();
            value.extend((0..len).map(|_| rng.random::<u8>()));
            c.put(key, value, None).await?;
        }
    }
    Ok(())
}

/// Clients writing to one cluster until [`Load::stop`].
struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl Load {
    /// `writers` concurrent clients of `endpoints`, each with its own
    /// random sequence from `seed`.
    async fn start(endpoints: &[String], size: Size, seed: u64, phase: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        let base = size.base_app as u32;
        for w in 0..size.writers {
            let mut c = retcd_tests::cluster::connect(endpoints).await.unwrap();
            let stop = stop.clone();
            let phase = phase.to_string();
            tasks.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(w));
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let tag = format!("live-{phase}-{w}-{n}");
                    if let Err(e) = one_write(&mut c, &mut rng, &tag, base).await {
                        panic!("writer {w}, write {n}: {e}");
                    }
                    n += 1;
                }
                n
            }));
        }
        Load { stop, tasks }
    }

    /// Stops the writers; returns how many writes they made.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut n = 0;
        for t in self.tasks {
            n += t.await.expect("writer task");
        }
        n
    }
}

/// A seed for this run (printed, so a failure can be replayed with
/// `RETCD_TEST_SEED`).
fn seed() -> u64 {
    let s = std::env::var("RETCD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("seed {s} (RETCD_TEST_SEED={s} replays it)");
    s
}

// ------------------------------------------------------------ make-mirror

/// `etcdctl --endpoints=SRC make-mirror FLAGS DST`, a child process with
/// its stdout and stderr in files. Killed by PID when dropped.
struct MakeMirror {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    what: String,
}

impl MakeMirror {
    fn start(etcdctl: &Path, src: &[String], dst: &str, flags: &[&str], dir: &Path) -> MakeMirror {
        let name = format!("make-mirror-{}", flags.join("_").replace(['-', '/'], ""));
        let (out, err) = (
            dir.join(format!("{name}.out")),
            dir.join(format!("{name}.err")),
        );
        let what = format!(
            "{} --endpoints={} make-mirror {} {dst}",
            etcdctl.display(),
            src.join(","),
            flags.join(" ")
        );
        let child = Command::new(etcdctl)
            .env("ETCDCTL_API", "3")
            .env_remove("ETCDCTL_ENDPOINTS")
            .arg(format!("--endpoints={}", src.join(",")))
            .arg("make-mirror")
            .args(flags)
            .arg(dst)
            .stdin(Stdio::null())
            .stdout(File::create(&out).unwrap())
            .stderr(File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        eprintln!("started (pid {}): {what}", child.id());
        MakeMirror {
            child,
            out,
            err,
            what,
        }
    }

    fn output(&self) -> (String, String) {
        let read = |p: &Path| {
            let mut s = String::new();
            if let Ok(mut f) = File::open(p) {
                let _ = f.read_to_string(&mut s);
            }
            s
        };
        (read(&self.out), read(&self.err))
    }

    /// Panics (with its output) if make-mirror has exited.
    fn assert_running(&mut self) {
        if let Some(st) = self.child.try_wait().unwrap() {
            let (out, err) = self.output();
            panic!(
                "{} exited ({st}) while it should mirror\nstdout: {out}\nstderr: {err}",
                self.what
            );
        }
    }

    /// Waits (at most `timeout`) for make-mirror to exit by itself.
    async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGTERM by PID, wait up to 5 s, then SIGKILL; returns its output.
    async fn stop(mut self) -> (String, String) {
        self.assert_running();
        signal(self.child.id(), "TERM");
        if self.wait_exit(Duration::from_secs(5)).await.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.output()
    }
}

impl Drop for MakeMirror {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            let (out, err) = self.output();
            eprintln!("----- {}\nstdout: {out}\nstderr: {err}", self.what);
        }
    }
}

/// One way of running make-mirror: its flags and what it does to keys.
struct Variant {
    flags: &'static [&'static str],
    prefix: &'static [u8],
    dest_prefix: &'static [u8],
}

const WHOLE: Variant = Variant {
    flags: &[],
    prefix: b"",
    dest_prefix: b"",
};
/// The destination prefix defaults to the source prefix.
const SAME_PREFIX: Variant = Variant {
    flags: &["--prefix", "app/"],
    prefix: b"app/",
    dest_prefix: b"app/",
};
const MOVED_PREFIX: Variant = Variant {
    flags: &["--prefix", "app/", "--dest-prefix", "moved/"],
    prefix: b"app/",
    dest_prefix: b"moved/",
};
const NO_PREFIX: Variant = Variant {
    flags: &["--prefix", "app/", "--no-dest-prefix"],
    prefix: b"app/",
    dest_prefix: b"",
};

/// The scenario of the module doc: fill `src`, run one make-mirror per
/// variant (all into `dst`'s member `dst_member`; their destination key
/// ranges are disjoint), write for [`WRITE_FOR`], stop, write the
/// sentinel, wait until every member of `dst` has it (as every variant
/// maps it), compare every member of `dst` with what the variants make of
/// the source.
async fn mirror_under_writes(
    src: &Cluster,
    dst: &Cluster,
    dst_member: usize,
    etcdctl: &Path,
    variants: &[Variant],
    size: Size,
) {
    let seed = seed();
    let started = Instant::now();
    let mut sc = src.client_all().await.unwrap();
    fill_source(&mut sc, size).await;
    for i in 0..dst.members.len() {
        let mut dc = dst.client(i).await.unwrap();
        assert!(dump(&mut dc, false).await.unwrap().is_empty());
    }
    let logs = tempfile::tempdir().unwrap();
    let dst_ep = dst.members[dst_member].endpoint();
    let mut mirrors: Vec<MakeMirror> = variants
        .iter()
        .map(|v| MakeMirror::start(etcdctl, &src.endpoints(), &dst_ep, v.flags, logs.path()))
        .collect();

    // The writes start at once: some race make-mirror's first copy.
    let load = Load::start(&src.endpoints(), size, seed, "mirror").await;
    tokio::time::sleep(WRITE_FOR).await;
    for m in mirrors.iter_mut() {
        m.assert_running();
    }
    let writes = load.stop().await;
    assert!(writes > 10, "only {writes} writes in {WRITE_FOR:?}");
    let sentinel = format!("done-{seed}");
    sc.put(SENTINEL, sentinel.as_str(), None).await.unwrap();
    let want_src = dump(&mut sc, false).await.unwrap();
    let mut want = Keyspace::new();
    for v in variants {
        want.extend(mapped(&want_src, v));
    }
    let sentinels: Vec<Vec<u8>> = variants
        .iter()
        .map(|v| mapped(&Keyspace::from([(SENTINEL.to_vec(), vec![])]), v))
        .flat_map(|m| m.into_keys())
        .collect();

    for i in 0..dst.members.len() {
        let mut dc = dst.client(i).await.unwrap();
        let caught_up = retry_until(CATCH_UP, Duration::from_millis(200), async || {
            let got = dump(&mut dc, true).await.map_err(|e| e.to_string())?;
            let missing: Vec<String> = (sentinels.iter())
                .filter(|k| got.get(*k).map(Vec::as_slice) != Some(sentinel.as_bytes()))
                .map(|k| show(k))
                .collect();
            if missing.is_empty() {
                Ok(got)
            } else {
                Err(format!(
                    "sentinels {missing:?} not there yet ({} of {} keys)",
                    got.len(),
                    want.len()
                ))
            }
        })
        .await;
        let got = match caught_up {
            Ok(got) => got,
            Err(e) => {
                for m in mirrors.iter_mut() {
                    m.assert_running();
                }
                panic!("member {i} of the destination did not catch up in {CATCH_UP:?}: {e}")
            }
        };
        assert_same(&format!("destination member {i}"), &want, &got);
        // Keys written while the mirror ran arrived (not only the first copy).
        let live = got.values().filter(|v| v.starts_with(b"live-")).count();
        assert!(live > 10, "only {live} keys written during the mirror");
    }
    // The source still has what it had (nothing written back).
    assert_same("source", &want_src, &dump(&mut sc, false).await.unwrap());

    // make-mirror writes plain puts: the leased key has no lease there.
    let mut dc = dst.client(dst_member).await.unwrap();
    let src_lease = sc.get("app/leased", None).await.unwrap().kvs()[0].lease();
    assert_ne!(src_lease, 0);
    for v in variants {
        let k = mapped(&Keyspace::from([(b"app/leased".to_vec(), vec![])]), v);
        let k = k.keys().next().unwrap().clone();
        let r = dc.get(k.clone(), None).await.unwrap();
        assert_eq!(r.kvs().len(), 1, "{}", show(&k));
        assert_eq!(r.kvs()[0].lease(), 0, "{} has a lease", show(&k));
    }

    for m in mirrors {
        let (out, err) = m.stop().await;
        // Only its counter (every 30 s) on stdout; nothing on stderr.
        assert!(
            out.lines().all(|l| l.trim().parse::<u64>().is_ok()),
            "{out:?}"
        );
        assert!(err.trim().is_empty(), "{err:?}");
    }
    eprintln!(
        "{} → {}: {writes} writes while mirroring, {} keys at the source, took {:?}",
        src.flavor.name(),
        dst.flavor.name(),
        want_src.len(),
        started.elapsed()
    );
}

/// Real etcd → the flavour under test, the whole keyspace, etcdctl 3.4.23.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_etcd_to_sut_whole_keyspace() {
    bounded(LIMIT, async {
        let src = Cluster::start(Flavor::Etcd, 1, &flags()).await.unwrap();
        let dst = Cluster::start(test_flavor(), 1, &flags()).await.unwrap();
        mirror_under_writes(&src, &dst, 0, &etcdctl_bin(), &[WHOLE], FULL).await;
    })
    .await
}

/// The flavour under test → real etcd, the whole keyspace, etcdctl 3.5.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_sut_to_etcd_whole_keyspace() {
    bounded(LIMIT, async {
        let src = Cluster::start(test_flavor(), 1, &flags()).await.unwrap();
        let dst = Cluster::start(Flavor::Etcd, 1, &flags()).await.unwrap();
        mirror_under_writes(&src, &dst, 0, &etcdctl35_bin(), &[WHOLE], FULL).await;
    })
    .await
}

/// Real etcd → the flavour under test, `--prefix app/` three ways at once
/// (same prefix, `--dest-prefix moved/`, `--no-dest-prefix`), etcdctl 3.5.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_etcd_to_sut_prefixes() {
    bounded(LIMIT, async {
        let src = Cluster::start(Flavor::Etcd, 1, &flags()).await.unwrap();
        let dst = Cluster::start(test_flavor(), 1, &flags()).await.unwrap();
        let variants = [SAME_PREFIX, MOVED_PREFIX, NO_PREFIX];
        mirror_under_writes(&src, &dst, 0, &etcdctl35_bin(), &variants, FULL).await;
    })
    .await
}

/// The flavour under test → real etcd, the same three prefix variants,
/// etcdctl 3.4.23.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_sut_to_etcd_prefixes() {
    bounded(LIMIT, async {
        let src = Cluster::start(test_flavor(), 1, &flags()).await.unwrap();
        let dst = Cluster::start(Flavor::Etcd, 1, &flags()).await.unwrap();
        let variants = [SAME_PREFIX, MOVED_PREFIX, NO_PREFIX];
        mirror_under_writes(&src, &dst, 0, &etcdctl_bin(), &variants, FULL).await;
    })
    .await
}

/// Real etcd → three members of the flavour under test, make-mirror
/// writing through a follower; every member (read serializably) ends with
/// the source's keyspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_etcd_to_three_member_sut_through_a_follower() {
    bounded(LIMIT, async {
        let src = Cluster::start(Flavor::Etcd, 1, &flags()).await.unwrap();
        let mut dst = Cluster::start(test_flavor(), 3, &flags()).await.unwrap();
        let leader = dst.leader(Duration::from_secs(20)).await.unwrap();
        let follower = (leader + 1) % 3;
        // smaller: every put goes through raft on three members
        let size = Size {
            base_app: 300,
            base_other: 100,
            writers: 1,
        };
        mirror_under_writes(&src, &dst, follower, &etcdctl_bin(), &[WHOLE], size).await;
    })
    .await
}

/// One revision of the source that changes more keys than the
/// destination's `--max-txn-ops` (here a range delete of 200 keys)
/// becomes one txn that the destination refuses, and make-mirror exits
/// with the destination's error; with `--max-txn-ops 1000` the same
/// delete goes through. (docs/migration.md tells to raise it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirror_stops_on_a_revision_above_dest_max_txn_ops() {
    bounded(LIMIT, async {
        let src = Cluster::start(Flavor::Etcd, 1, &flags()).await.unwrap();
        let mut sc = src.client(0).await.unwrap();
        let logs = tempfile::tempdir().unwrap();
        for (max_txn_ops, refused) in [(None, true), (Some("1000"), false)] {
            for chunk in 0..2 {
                let ops: Vec<TxnOp> = (chunk * 100..chunk * 100 + 100)
                    .map(|i| TxnOp::put(format!("big/{i:03}"), "v", None))
                    .collect();
                sc.txn(Txn::new().and_then(ops)).await.unwrap();
            }
            let mut f = flags();
            if let Some(n) = max_txn_ops {
                f.extend(["--max-txn-ops", n]);
            }
            let dst = Cluster::start(test_flavor(), 1, &f).await.unwrap();
            let mut dc = dst.client(0).await.unwrap();
            let mut mm = MakeMirror::start(
                &etcdctl_bin(),
                &src.endpoints(),
                &dst.endpoints()[0],
                &[],
                logs.path(),
            );
            retry_until(CATCH_UP, Duration::from_millis(200), async || {
                match dump(&mut dc, false).await {
                    Ok(k) if k.len() == 200 => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await
            .expect("first copy");
            let r = sc
                .delete("big/", Some(DeleteOptions::new().with_prefix()))
                .await
                .unwrap();
            assert_eq!(r.deleted(), 200);
            sc.put("after", "x", None).await.unwrap();
            if refused {
                let st = mm.wait_exit(CATCH_UP).await;
                let (out, err) = mm.output();
                assert!(
                    st.is_some_and(|s| !s.success()),
                    "make-mirror did not fail: {st:?} {out} {err}"
                );
                assert!(
                    err.contains("too many operations in txn request"),
                    "stderr: {err}"
                );
                // nothing of that revision or after it arrived
                let got = dump(&mut dc, false).await.unwrap();
                assert_eq!(got.len(), 200, "{:?}", got.keys().map(|k| show(k)));
            } else {
                retry_until(CATCH_UP, Duration::from_millis(200), async || {
                    let got = dump(&mut dc, false).await.map_err(|e| e.to_string())?;
                    let want = Keyspace::from([(b"after".to_vec(), b"x".to_vec())]);
                    if got == want {
                        Ok(())
                    } else {
                        Err(format!("{} keys", got.len()))
                    }
                })
                .await
                .expect("destination caught up");
                mm.stop().await;
            }
            sc.delete("after", None).await.unwrap();
        }
    })
    .await
}

// ------------------------------------------------------------ docs/migration.md

/// The shell block of `docs/migration.md` that follows the line
/// `<!-- migration.rs: NAME -->`.
fn doc_block(doc: &str, name: &str) -> String {
    let marker = format!("<!-- migration.rs: {name} -->");
    let at = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/migration.md has no {marker}"));
    let rest = &doc[at + marker.len()..];
    let rest = rest.trim_start();
    let rest = rest
        .strip_prefix("```sh\n")
        .unwrap_or_else(|| panic!("{marker} is not followed by a ```sh block"));
    let end = rest.find("\n```").expect("end of the block");
    rest[..end + 1].to_string()
}

/// Where the doc's commands run: a directory (their working directory,
/// which gets `mirror.log` and `mirror.pid`) with `bin/etcdctl`, the
/// etcdctl they call, first on `PATH`.
struct Shell {
    dir: TempDir,
}

impl Shell {
    fn new() -> Shell {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        Shell { dir }
    }

    fn use_etcdctl(&self, bin: &Path) {
        let link = self.dir.path().join("bin/etcdctl");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(bin, &link).unwrap();
    }

    /// Runs `block` with `bash -euo pipefail` (stricter than a terminal:
    /// any failing command fails the test), `SRC` and `DST` set; at most
    /// 120 s, then it is killed by PID. Returns its stdout; panics unless
    /// it exits 0.
    async fn run(&self, name: &str, block: &str, src: &str, dst: &str) -> String {
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail", "-c", block])
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env("SRC", src)
            .env("DST", dst)
            .env_remove("ETCDCTL_ENDPOINTS")
            .env_remove("ETCDCTL_API")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let block_text = block.to_string();
        let name = name.to_string();
        let (src, dst) = (src.to_string(), dst.to_string());
        tokio::task::spawn_blocking(move || {
            let child = cmd.spawn().expect("spawn bash");
            let pid = child.id();
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(child.wait_with_output());
            });
            let out = match rx.recv_timeout(Duration::from_secs(120)) {
                Ok(r) => r.expect("wait for bash"),
                Err(_) => {
                    signal(pid, "KILL");
                    let r = rx.recv().unwrap().unwrap();
                    panic!(
                        "doc block {name} did not finish in 120 s\n{block_text}\nstdout: {}\nstderr: {}",
                        String::from_utf8_lossy(&r.stdout),
                        String::from_utf8_lossy(&r.stderr)
                    );
                }
            };
            let (so, se) = (
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
            assert!(
                out.status.success(),
                "doc block {name} failed ({})\n{block_text}\nstdout: {so}\nstderr: {se}",
                out.status
            );
            eprintln!("doc block {name} (SRC={src} DST={dst}): ok\n{so}");
            so
        })
        .await
        .unwrap()
    }

    /// The make-mirror the doc's `start-mirror` block started, by the PID
    /// it wrote to `mirror.pid` (waiting up to 5 s: that PID is bash's
    /// fork until it has exec'd etcdctl).
    async fn mirror_pid(&self) -> ForeignPid {
        let s = std::fs::read_to_string(self.dir.path().join("mirror.pid")).unwrap();
        let p = ForeignPid(s.trim().parse().unwrap());
        let started = async || p.is_make_mirror().then_some(()).ok_or(());
        let ok = retry_until(Duration::from_secs(5), Duration::from_millis(20), started).await;
        assert!(
            ok.is_ok(),
            "pid {} is not make-mirror; mirror.log: {}",
            p.0,
            self.mirror_log()
        );
        p
    }

    fn mirror_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mirror.log")).unwrap_or_default()
    }
}

/// A make-mirror started by a doc block (so not our child: bash exited
/// and left it running). Dropping it SIGKILLs it by PID if that PID is
/// still a make-mirror.
struct ForeignPid(u32);

impl ForeignPid {
    /// Running (not a zombie) and its command line says make-mirror.
    fn is_make_mirror(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0)).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        if stat.is_empty() || state.starts_with('Z') {
            return false;
        }
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", self.0)).unwrap_or_default();
        cmdline.split(|b| *b == 0).any(|a| a == b"make-mirror")
    }
}

impl Drop for ForeignPid {
    fn drop(&mut self) {
        if self.is_make_mirror() {
            signal(self.0, "KILL");
        }
    }
}

/// The `"count":N` lines the doc's `compare` block prints, as numbers.
fn counts(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("\"count\":"))
        .map(|n| n.parse().unwrap())
        .collect()
}

/// The cut-over of `docs/migration.md`, its blocks run as written: real
/// etcd → the flavour under test with etcdctl 3.4.23 (empty destination,
/// mirror started, clients write, stop writing, settle, compare,
/// clients switch and write to the new cluster, mirror stopped), then the
/// way back into the old etcd with etcdctl 3.5.1 (cleared first).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doc_cutover_commands_etcd_to_sut_and_back() {
    bounded(LIMIT, async {
        let doc = std::fs::read_to_string(workspace_root().join("docs/migration.md")).unwrap();
        let block = |name: &str| doc_block(&doc, name);
        let seed = seed();
        let old = Cluster::start(Flavor::Etcd, 1, &flags()).await.unwrap();
        let new = Cluster::start(test_flavor(), 1, &flags()).await.unwrap();
        let (old_ep, new_ep) = (old.endpoints()[0].clone(), new.endpoints()[0].clone());
        let sh = Shell::new();
        let mut oc = old.client(0).await.unwrap();
        let mut nc = new.client(0).await.unwrap();
        fill_source(&mut oc, FULL).await;

        // ---- etcd → the new cluster, etcdctl 3.4.23
        sh.use_etcdctl(&etcdctl_bin());
        let load = Load::start(&old.endpoints(), FULL, seed, "old").await;
        let out = sh
            .run("check-empty", &block("check-empty"), &old_ep, &new_ep)
            .await;
        assert_eq!(out, "", "the new cluster is empty");
        sh.run("start-mirror", &block("start-mirror"), &old_ep, &new_ep)
            .await;
        let mirror_started = Instant::now();
        let mirror = sh.mirror_pid().await;
        tokio::time::sleep(WRITE_FOR).await;
        assert!(mirror.is_make_mirror(), "log: {}", sh.mirror_log());
        let writes = load.stop().await;
        assert!(writes > 20, "{writes} writes");
        let out = sh.run("settle", &block("settle"), &old_ep, &new_ep).await;
        assert!(out.contains("caught up"), "{out}");
        let out = sh.run("compare", &block("compare"), &old_ep, &new_ep).await;
        let n = counts(&out);
        assert!(n.len() == 2 && n[0] == n[1] && n[0] > 1000, "{out}");
        assert!(out.contains("same keys and values"), "{out}");
        assert!(!out.contains("DIFFERENT"), "{out}");
        // the same, key by key
        let old_keys = dump(&mut oc, false).await.unwrap();
        assert_same("after settle", &old_keys, &dump(&mut nc, false).await.unwrap());
        let live = old_keys.values().filter(|v| v.starts_with(b"live-")).count();
        assert!(live > 10, "{live} keys written while mirroring");

        // Clients switch to the new cluster and write there.
        let load = Load::start(&new.endpoints(), FULL, seed ^ 1, "new").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let writes_new = load.stop().await;
        assert!(writes_new > 10);
        // The counter make-mirror prints every 30 s: puts and deletes
        // copied, at least one per key at the destination.
        // (on a slow machine the first print may come before the copy is
        // done: wait for a later one, up to three)
        let counter = retry_until(
            Duration::from_secs(100).saturating_sub(mirror_started.elapsed()),
            Duration::from_millis(500),
            async || match sh.mirror_log().lines().last() {
                Some(l) => match l.trim().parse::<u64>() {
                    Ok(n) if n as usize >= old_keys.len() => Ok(n),
                    Ok(n) => Err(format!("counter {n} so far")),
                    Err(e) => Err(format!("{l:?}: {e}")),
                },
                None => Err("nothing printed".to_string()),
            },
        )
        .await
        .unwrap();
        assert!(counter as usize >= old_keys.len(), "counter {counter}");
        assert!(mirror.is_make_mirror(), "log: {}", sh.mirror_log());
        sh.run("stop-mirror", &block("stop-mirror"), &old_ep, &new_ep)
            .await;
        let gone = async || match mirror.is_make_mirror() {
            false => Ok(()),
            true => Err(()),
        };
        retry_until(Duration::from_secs(5), Duration::from_millis(100), gone)
            .await
            .expect("make-mirror stopped");
        // What the new cluster got after the switch stays there alone.
        let new_keys = dump(&mut nc, false).await.unwrap();
        assert_ne!(new_keys, old_keys);
        assert_same("old after the switch", &old_keys, &dump(&mut oc, false).await.unwrap());

        // ---- and back: the new cluster → the old etcd, etcdctl 3.5.1
        sh.use_etcdctl(&etcdctl35_bin());
        let out = sh.run("clear", &block("clear"), &new_ep, &old_ep).await;
        assert_eq!(out.trim(), old_keys.len().to_string(), "deleted count");
        let out = sh
            .run("check-empty", &block("check-empty"), &new_ep, &old_ep)
            .await;
        assert_eq!(out, "");
        sh.run("start-mirror", &block("start-mirror"), &new_ep, &old_ep)
            .await;
        let mirror = sh.mirror_pid().await;
        let load = Load::start(&new.endpoints(), FULL, seed ^ 2, "back").await;
        tokio::time::sleep(WRITE_FOR).await;
        let writes_back = load.stop().await;
        assert!(writes_back > 20);
        assert!(mirror.is_make_mirror(), "log: {}", sh.mirror_log());
        let out = sh.run("settle", &block("settle"), &new_ep, &old_ep).await;
        assert!(out.contains("caught up"), "{out}");
        let out = sh.run("compare", &block("compare"), &new_ep, &old_ep).await;
        let n = counts(&out);
        assert!(n.len() == 2 && n[0] == n[1] && n[0] > 1000, "{out}");
        assert!(out.contains("same keys and values"), "{out}");
        let new_keys = dump(&mut nc, false).await.unwrap();
        assert_same("back in etcd", &new_keys, &dump(&mut oc, false).await.unwrap());
        sh.run("stop-mirror", &block("stop-mirror"), &new_ep, &old_ep)
            .await;
        let gone = async || match mirror.is_make_mirror() {
            false => Ok(()),
            true => Err(()),
        };
        retry_until(Duration::from_secs(5), Duration::from_millis(100), gone)
            .await
            .expect("make-mirror stopped");
        eprintln!(
            "doc cut-over: {writes} writes to etcd while mirroring, {writes_new} to the new cluster, \
             {writes_back} while mirroring back; {} keys; counter {counter}",
            new_keys.len()
        );
    })
    .await
}
