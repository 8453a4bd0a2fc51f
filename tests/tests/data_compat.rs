//! Data moves between etcd and retcd both ways (issue 15), with etcd's own
//! tools on the other side:
//!
//! * retcd → `etcdctl snapshot save` (3.4.23 and 3.5.1) → `etcdctl snapshot
//!   status` / `etcdutl snapshot status` (same figures as `retcdutl`) →
//!   `etcdctl snapshot restore` (3.4) / `etcdutl snapshot restore` (3.5) →
//!   real etcd on the restored data dir serves every key with its
//!   revisions, the compaction point, the lease with its key, auth (users,
//!   roles, permissions, enabled);
//! * real etcd 3.4.23 / 3.5.1 → `etcdctl snapshot save` → `retcdutl
//!   snapshot status` (etcdutl's figures) and `restore` → retcd serves the
//!   same;
//! * `retcdutl migrate` on the data dir of a real etcd SIGKILLed under
//!   writes (its backend committed rarely, so the WAL holds most of them):
//!   every acknowledged put is in retcd at the revision etcd gave it, and a
//!   running etcd is refused.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, PutOptions};
use retcd_tests::binaries::retcdutl_bin;
use retcd_tests::{
    bounded, etcd351_bin, etcd_bin, etcdctl, etcdctl35, grpc_error, Cluster, Flavor,
};
use retcd_tests::{kv_rows as rows_of, KvRow as Row};
use retcd_tests::{limit::LONG as LIMIT, FAST, READY};

fn etcdutl_bin() -> PathBuf {
    retcd_tests::etcdctl35_bin().with_file_name("etcdutl")
}

/// Runs `bin args` and returns (success, stdout, stderr).
fn run(bin: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin)
        .args(args)
        .env_remove("ETCDCTL_ENDPOINTS")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `cmd` (e.g. `snapshot restore FILE`) followed by the flags that make
/// member `m` of a new cluster `initial`/`token` (the same for etcdctl,
/// etcdutl and retcdutl's restore and migrate).
fn new_member_args(
    cmd: &[&str],
    m: &retcd_tests::Member,
    initial: &str,
    token: &str,
) -> Vec<String> {
    let mut args: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    args.extend(
        [
            "--name",
            &m.name,
            "--initial-cluster",
            initial,
            "--initial-cluster-token",
            token,
            "--initial-advertise-peer-urls",
            &m.peer_url(),
            "--data-dir",
            &m.data_dir().display().to_string(),
        ]
        .map(String::from),
    );
    args
}

fn restore_args(file: &str, m: &retcd_tests::Member, initial: &str, token: &str) -> Vec<String> {
    new_member_args(&["snapshot", "restore", file], m, initial, token)
}

/// `retcdutl snapshot restore FILE` for member `m` of a cluster
/// `initial`/`token`.
fn retcdutl_restore(file: &str, m: &retcd_tests::Member, initial: &str, token: &str) {
    let args = restore_args(file, m, initial, token);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, _, err) = run(&retcdutl_bin(), &args);
    assert!(ok, "{err}");
}

/// Which etcd is on the other side.
#[derive(Clone, Copy, Debug)]
enum Etcd {
    V3_4,
    V3_5,
}

impl Etcd {
    fn server(self) -> PathBuf {
        match self {
            Etcd::V3_4 => etcd_bin(),
            Etcd::V3_5 => etcd351_bin(),
        }
    }
    fn ctl(self, endpoints: &[String], args: &[&str]) -> retcd_tests::Output {
        match self {
            Etcd::V3_4 => etcdctl(endpoints, args),
            Etcd::V3_5 => etcdctl35(endpoints, args),
        }
    }
    /// `snapshot status FILE -w json` with the tool of this version.
    fn status_json(self, file: &str) -> serde_json::Value {
        let out = match self {
            Etcd::V3_4 => {
                let o = etcdctl(&[], &["snapshot", "status", file, "-w", "json"]);
                assert!(o.success(), "{o:?}");
                o.stdout
            }
            Etcd::V3_5 => {
                let (ok, stdout, stderr) =
                    run(&etcdutl_bin(), &["snapshot", "status", file, "-w", "json"]);
                assert!(ok, "{stderr}");
                stdout
            }
        };
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }
    /// `snapshot restore FILE` for member `m` of a cluster `initial`/`token`.
    fn restore(self, file: &str, m: &retcd_tests::Member, initial: &str, token: &str) {
        let args = restore_args(file, m, initial, token);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match self {
            Etcd::V3_4 => {
                let o = etcdctl(&[], &args);
                assert!(o.success(), "{o:?}");
            }
            Etcd::V3_5 => {
                let (ok, _, stderr) = run(&etcdutl_bin(), &args);
                assert!(ok, "{stderr}");
            }
        }
    }
}

async fn root_client(endpoints: &[String]) -> Client {
    Client::connect(
        endpoints,
        Some(
            ConnectOptions::new()
                .with_user("root", "rootpw")
                .with_timeout(Duration::from_secs(5)),
        ),
    )
    .await
    .unwrap()
}

/// What a restore must carry over: revisions, compaction, lease, auth.
struct Fill {
    lease: i64,
    compacted: i64,
}

/// Writes keys over several revisions, deletes some, compacts, attaches a
/// key to a lease, and sets up auth (root, a role with a read permission,
/// a user with it) and enables it.
async fn fill(cl: &mut Client) -> Fill {
    for i in 0..120 {
        cl.put(format!("k/{:03}", i % 50), format!("v{i}"), None)
            .await
            .unwrap();
    }
    cl.delete("k/007", None).await.unwrap();
    cl.delete(
        "k/01",
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    )
    .await
    .unwrap();
    let r = cl.put("mid", "x", None).await.unwrap();
    let compacted = r.header().unwrap().revision();
    for i in 0..20 {
        cl.put(format!("k/{:03}", i), format!("after{i}"), None)
            .await
            .unwrap();
    }
    cl.compact(compacted, None).await.unwrap();
    let lease = cl.lease_grant(900, None).await.unwrap().id();
    cl.put("leased", "l", Some(PutOptions::new().with_lease(lease)))
        .await
        .unwrap();
    cl.user_add("root", "rootpw", None).await.unwrap();
    cl.user_grant_role("root", "root").await.unwrap();
    cl.role_add("reader").await.unwrap();
    cl.role_grant_permission("reader", etcd_client::Permission::read("k/").with_prefix())
        .await
        .unwrap();
    cl.user_add("alice", "alicepw", None).await.unwrap();
    cl.user_grant_role("alice", "reader").await.unwrap();
    cl.auth_enable().await.unwrap();
    Fill { lease, compacted }
}

/// Everything a member serves of the filled data, read as root.
#[derive(Debug, PartialEq)]
struct Served {
    revision: i64,
    rows: Vec<Row>,
    lease_keys: Vec<Vec<u8>>,
    users: Vec<String>,
    reader_perms: Vec<(i32, Vec<u8>, Vec<u8>)>,
}

async fn served(endpoints: &[String], f: &Fill) -> Served {
    let mut cl = root_client(endpoints).await;
    let all = cl
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .unwrap();
    let rows = rows_of(&all);
    // Below the compaction point: compacted; at it: served.
    let e = cl
        .get(
            "k/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_revision(f.compacted - 1),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(
        grpc_error(&e).map(|(_, m)| m),
        Some("etcdserver: mvcc: required revision has been compacted".to_string())
    );
    cl.get(
        "k/",
        Some(GetOptions::new().with_prefix().with_revision(f.compacted)),
    )
    .await
    .unwrap();
    let ttl = cl
        .lease_time_to_live(
            f.lease,
            Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
        )
        .await
        .unwrap();
    assert!(ttl.ttl() > 0 && ttl.granted_ttl() == 900, "{ttl:?}");
    let mut users = cl.user_list().await.unwrap().users().to_vec();
    users.sort();
    let role = cl.role_get("reader").await.unwrap();
    let reader_perms = role
        .permissions()
        .iter()
        .map(|p| (p.get_type(), p.key().to_vec(), p.range_end().to_vec()))
        .collect();
    // Auth is on: alice reads k/ and may not write; no token, no read.
    let mut alice = Client::connect(
        endpoints,
        Some(ConnectOptions::new().with_user("alice", "alicepw")),
    )
    .await
    .unwrap();
    alice.get("k/000", None).await.unwrap();
    let e = alice.put("k/000", "no", None).await.unwrap_err();
    assert_eq!(
        grpc_error(&e).map(|(_, m)| m),
        Some("etcdserver: permission denied".to_string())
    );
    let mut anon = Client::connect(endpoints, None).await.unwrap();
    assert!(anon.get("k/000", None).await.is_err());
    Served {
        revision: all.header().unwrap().revision(),
        rows,
        lease_keys: ttl.keys().to_vec(),
        users,
        reader_perms,
    }
}

/// A cluster of `flavor` (server `bin`) whose one member's data dir is made
/// by `restore(member, initial_cluster, token)` before it starts.
async fn restored_cluster(
    flavor: Flavor,
    bin: PathBuf,
    restore: impl Fn(&retcd_tests::Member, &str, &str),
) -> Cluster {
    let mut c = Cluster::create_with_binary(flavor, bin, 1, FAST).unwrap();
    let initial = format!("{}={}", c.members[0].name, c.members[0].peer_url());
    let token = c.token();
    restore(&c.members[0], &initial, &token);
    c.start_all().await.unwrap();
    c.wait_all_ready(READY).await.unwrap();
    c
}

fn status_figures(v: &serde_json::Value) -> (i64, i64, i64, i64) {
    let n = |k: &str| v[k].as_i64().unwrap_or_else(|| panic!("{k} in {v}"));
    (n("hash"), n("revision"), n("totalKey"), n("totalSize"))
}

/// Fills a 1-member cluster of `from`, saves a snapshot with `etcd`'s
/// etcdctl, checks that `etcd`'s status tool and `retcdutl` read the same
/// figures from it, restores it into a member of `to` (with that side's
/// tool) and compares what both serve; the restored member takes the next
/// write at the next revision.
async fn round_trip(etcd: Etcd, from: Flavor, to: Flavor) {
    let bin = |f: Flavor| match f {
        Flavor::Etcd => etcd.server(),
        _ => Flavor::Retcd.binary(),
    };
    let src = Cluster::start_with_binary(from, bin(from), 1, FAST)
        .await
        .unwrap();
    let mut cl = src.client(0).await.unwrap();
    let f = fill(&mut cl).await;
    let want = served(&src.endpoints(), &f).await;
    assert!(want.rows.len() > 40, "{want:?}");

    let file_s = src.dir().join("backup.db").display().to_string();
    let out = etcd.ctl(
        &src.endpoints(),
        &["--user", "root:rootpw", "snapshot", "save", &file_s],
    );
    assert!(out.success(), "{out:?}");
    let theirs = status_figures(&etcd.status_json(&file_s));
    let (ok, ours, err) = run(
        &retcdutl_bin(),
        &["snapshot", "status", &file_s, "-w", "json"],
    );
    assert!(ok, "{err}");
    let ours = status_figures(&serde_json::from_str(ours.trim()).unwrap());
    assert_eq!(ours, theirs);
    assert_eq!(theirs.1, want.revision);

    let dst = restored_cluster(to, bin(to), |m, initial, token| match to {
        Flavor::Etcd => etcd.restore(&file_s, m, initial, token),
        _ => retcdutl_restore(&file_s, m, initial, token),
    })
    .await;
    let got = served(&dst.endpoints(), &f).await;
    assert_eq!(got, want, "{from:?} -> {to:?} with etcd {etcd:?}'s tools");
    let mut c = root_client(&dst.endpoints()).await;
    let r = c.put("new", "1", None).await.unwrap();
    assert_eq!(r.header().unwrap().revision(), want.revision + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_retcd_snapshot_restored_and_served_by_etcd_3_4() {
    bounded(LIMIT, round_trip(Etcd::V3_4, Flavor::Retcd, Flavor::Etcd)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_retcd_snapshot_restored_and_served_by_etcd_3_5() {
    bounded(LIMIT, round_trip(Etcd::V3_5, Flavor::Retcd, Flavor::Etcd)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_etcd_3_4_snapshot_restored_and_served_by_retcd() {
    bounded(LIMIT, round_trip(Etcd::V3_4, Flavor::Etcd, Flavor::Retcd)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_etcd_3_5_snapshot_restored_and_served_by_retcd() {
    bounded(LIMIT, round_trip(Etcd::V3_5, Flavor::Etcd, Flavor::Retcd)).await;
}

/// A real etcd member takes concurrent puts, deletes and a user add; it
/// is SIGKILLed while they run. `retcdutl migrate` takes its backend and
/// replays its WAL tail: every acknowledged put is in retcd with the
/// revision etcd acknowledged, every acknowledged delete is gone, the user
/// exists. With `slow_backend` etcd commits its backend only every 60 s,
/// so nearly everything is in the WAL alone (the replay must carry it);
/// else it commits every 100 ms as by default (the backend must carry most
/// of it: its consistent index is past the start).
async fn migrate_after_sigkill(etcd: Etcd, slow_backend: bool) {
    let mut flags: Vec<&str> = FAST.to_vec();
    if slow_backend {
        flags.extend([
            "--backend-batch-interval",
            "60s",
            "--backend-batch-limit",
            "10000000",
        ]);
    }
    let mut src = Cluster::start_with_binary(Flavor::Etcd, etcd.server(), 1, &flags)
        .await
        .unwrap();
    let mut cl = src.client(0).await.unwrap();
    cl.user_add("carol", "carolpw", None).await.unwrap();
    // Acknowledged puts: key -> (value, revision); acknowledged deletes.
    let acked: Arc<Mutex<Vec<(String, String, i64)>>> = Arc::default();
    // Deletes sent (acknowledged or not: one in flight at the kill may
    // have been applied) and deletes acknowledged.
    let deleting: Arc<Mutex<Vec<String>>> = Arc::default();
    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..4 {
        let mut c = src.client(0).await.unwrap();
        let (acked, deleting, deleted) = (acked.clone(), deleting.clone(), deleted.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let key = format!("w{w}/{i:06}");
                let val = format!("value-{w}-{i}");
                match c.put(key.as_str(), val.as_str(), None).await {
                    Ok(r) => {
                        let rev = r.header().unwrap().revision();
                        acked.lock().unwrap().push((key.clone(), val, rev));
                    }
                    Err(_) => return,
                }
                if i % 10 == 9 {
                    let victim = format!("w{w}/{:06}", i - 5);
                    deleting.lock().unwrap().push(victim.clone());
                    match c.delete(victim.as_str(), None).await {
                        Ok(_) => deleted.lock().unwrap().push(victim),
                        Err(_) => return,
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dd = src.members[0].data_dir().to_path_buf();
    let dd_s = dd.display().to_string();

    // While etcd runs, its db is locked: refused.
    let target = tempfile::tempdir().unwrap();
    let early = target.path().join("early.etcd").display().to_string();
    let (ok, _, err) = run(
        &retcdutl_bin(),
        &["migrate", "--etcd-data-dir", &dd_s, "--data-dir", &early],
    );
    assert!(!ok && err.contains("still running"), "{err}");
    assert!(!Path::new(&early).exists());

    src.members[0].kill();
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let deleting = deleting.lock().unwrap().clone();
    let deleted = deleted.lock().unwrap().clone();
    assert!(acked.len() > 100, "only {} puts acknowledged", acked.len());

    let mut dst = Cluster::create(Flavor::Retcd, 1, FAST).unwrap();
    let m = &dst.members[0];
    let initial = format!("{}={}", m.name, m.peer_url());
    let token = dst.token();
    let args = new_member_args(&["migrate", "--etcd-data-dir", &dd_s], m, &initial, &token);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = run(&retcdutl_bin(), &args);
    assert!(ok, "{stderr}");
    eprintln!("{stderr}{stdout}");
    let replayed: usize = stdout
        .split(" plus ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no replay count in {stdout:?}"));
    let applied: u64 = stderr
        .split("applied through raft index ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no consistent index in {stderr:?}"));
    if slow_backend {
        // The fault mattered: most of the writes were only in the WAL.
        assert!(
            replayed > acked.len() / 2,
            "{replayed} entries replayed for {} acknowledged puts",
            acked.len()
        );
    } else {
        assert!(applied > 100, "the backend holds only index {applied}");
    }
    dst.start_all().await.unwrap();
    let mut rc = dst.client(0).await.unwrap();
    let all = rc
        .get("w", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    // The reference: etcd itself restarted on the same (untouched) data dir
    // recovers exactly what retcd serves, key by key with revisions.
    src.members[0].start();
    src.wait_member_ready(0, READY).await.unwrap();
    let mut ec = src.client(0).await.unwrap();
    let recovered = ec
        .get("w", Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(
        rows_of(&all),
        rows_of(&recovered),
        "retcd after migrate differs from etcd restarted on its data dir"
    );
    assert_eq!(
        all.header().unwrap().revision(),
        recovered.header().unwrap().revision()
    );
    let have: std::collections::HashMap<Vec<u8>, (Vec<u8>, i64)> = all
        .kvs()
        .iter()
        .map(|k| (k.key().to_vec(), (k.value().to_vec(), k.mod_revision())))
        .collect();
    let mut missing = Vec::new();
    for (k, v, rev) in &acked {
        match have.get(k.as_bytes()) {
            Some((val, r)) => {
                assert_eq!(val, v.as_bytes(), "{k}");
                assert_eq!(*r, *rev, "{k}: mod revision");
            }
            None if deleting.contains(k) => {}
            None => missing.push(k.clone()),
        }
    }
    // A single etcd member may answer a put before its WAL write is issued
    // (it applies committed entries while it persists them): the last put
    // a writer had acknowledged can be gone from etcd's own data dir after
    // a SIGKILL. Those are lost by etcd itself (checked above: etcd
    // restarted on the data dir lacks them too); at most one per writer.
    eprintln!(
        "{} acknowledged puts; lost by etcd's data dir itself: {missing:?}",
        acked.len()
    );
    assert!(missing.len() <= 4, "acknowledged puts lost: {missing:?}");
    for w in 0..4 {
        let last = acked
            .iter()
            .filter(|a| a.0.starts_with(&format!("w{w}/")))
            .map(|a| &a.0)
            .max();
        for m in missing.iter().filter(|m| m.starts_with(&format!("w{w}/"))) {
            assert_eq!(
                Some(m),
                last,
                "lost {m} is not writer {w}'s last acknowledged put"
            );
        }
    }
    for k in &deleted {
        assert!(!have.contains_key(k.as_bytes()), "deleted {k} is back");
    }
    let max_acked = acked.iter().map(|a| a.2).max().unwrap();
    assert!(all.header().unwrap().revision() >= max_acked);
    let users = rc.user_list().await.unwrap();
    assert_eq!(users.users(), ["carol"]);
    // and carol's password still works (etcd 3.5 puts the hash in the
    // entry in base64: replayed as it was, no password matched it)
    rc.user_add("root", "rootpw", None).await.unwrap();
    rc.role_add("root").await.unwrap();
    rc.user_grant_role("root", "root").await.unwrap();
    rc.auth_enable().await.unwrap();
    let carol = etcd_client::Client::connect(
        dst.endpoints(),
        Some(etcd_client::ConnectOptions::new().with_user("carol", "carolpw")),
    )
    .await;
    assert!(carol.is_ok(), "carol cannot log in: {:?}", carol.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_migrate_etcd_3_5_data_dir_after_sigkill() {
    bounded(LIMIT, migrate_after_sigkill(Etcd::V3_5, true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_migrate_etcd_3_5_data_dir_committed_backend_after_sigkill() {
    bounded(LIMIT, migrate_after_sigkill(Etcd::V3_5, false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_migrate_etcd_3_4_data_dir_after_sigkill() {
    bounded(LIMIT, migrate_after_sigkill(Etcd::V3_4, true)).await;
}

/// python-etcd3's own `test_snapshot`: `client.snapshot(file)`, then
/// `etcdctl snapshot status` on the file must succeed (it answered
/// "Error: invalid database" on retcd's former format).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_python_etcd3_snapshot_is_read_by_etcdctl() {
    bounded(LIMIT, async {
        let c = Cluster::start(Flavor::Retcd, 1, FAST).await.unwrap();
        let mut cl = c.client(0).await.unwrap();
        for i in 0..30 {
            cl.put(format!("py/{i}"), "v", None).await.unwrap();
        }
        let file = c.dir().join("py.db");
        let port = c.members[0].endpoint().rsplit(':').next().unwrap().to_string();
        let script = format!(
            "import etcd3\nc = etcd3.client(host='127.0.0.1', port={port})\nwith open('{}', 'wb') as f:\n    c.snapshot(f)\n",
            file.display()
        );
        // Debian's python3 has python3-etcd3 (scripts/test.sh installs it).
        let (ok, _, err) = run(Path::new("/usr/bin/python3"), &["-c", &script]);
        assert!(ok, "{err}");
        let f = file.display().to_string();
        let o = etcdctl(&[], &["snapshot", "status", &f, "-w", "json"]);
        assert!(o.success(), "{o:?}");
        let v: serde_json::Value = serde_json::from_str(o.stdout.trim()).unwrap();
        assert_eq!(v["revision"].as_i64(), Some(31), "{v}");
        // The server's temporary backend file is gone once sent.
        let snap = c.members[0].data_dir().join("member/snap");
        let left: Vec<String> = std::fs::read_dir(&snap)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["db"], "{}", snap.display());
    })
    .await;
}

/// A snapshot's temporary file left by a crash is removed at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_partial_snapshot_file_removed_at_start() {
    bounded(LIMIT, async {
        let mut c = Cluster::create(Flavor::Retcd, 1, FAST).unwrap();
        let snap = c.members[0].data_dir().join("member/snap");
        std::fs::create_dir_all(&snap).unwrap();
        let part = snap.join("retcd-snapshot-abc123.db.part");
        std::fs::write(&part, b"partial").unwrap();
        let other = snap.join("keep.me");
        std::fs::write(&other, b"x").unwrap();
        c.start_all().await.unwrap();
        assert!(!part.exists(), "{} still there", part.display());
        assert!(other.exists());
    })
    .await;
}

/// Fills `cl` with 100 kB values until NOSPACE is raised.
async fn fill_until_nospace(cl: &mut Client) {
    let big = vec![b'x'; 100_000];
    for i in 0..200 {
        if cl.put(format!("big/{i}"), big.clone(), None).await.is_err() {
            return;
        }
    }
    panic!("no NOSPACE after 200 puts of 100 kB");
}

async fn alarms_and_put(endpoints: &[String]) -> (Vec<(u64, i32)>, Option<String>) {
    let mut cl = Client::connect(endpoints, None).await.unwrap();
    let a = cl
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await
        .unwrap();
    let alarms = a
        .alarms()
        .iter()
        .map(|m| (m.member_id(), m.alarm() as i32))
        .collect();
    let put = cl
        .put("after", "restore", None)
        .await
        .err()
        .and_then(|e| grpc_error(&e).map(|(_, m)| m));
    (alarms, put)
}

/// A NOSPACE raised before the snapshot is there after a restore, both
/// ways, as etcdutl's restore keeps it (checked against etcd 3.5.1): the
/// old member's alarm is listed and writes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_nospace_alarm_kept_by_restore_both_ways() {
    bounded(LIMIT, async {
        let quota = ["--quota-backend-bytes", "2000000"];
        let mut flags: Vec<&str> = FAST.to_vec();
        flags.extend(quota);
        for (src_flavor, bin) in [
            (Flavor::Etcd, etcd351_bin()),
            (Flavor::Retcd, Flavor::Retcd.binary()),
        ] {
            let src = Cluster::start_with_binary(src_flavor, bin, 1, &flags)
                .await
                .unwrap();
            let mut cl = src.client(0).await.unwrap();
            fill_until_nospace(&mut cl).await;
            // The alarm is raised through raft right after the refusal.
            let mut want = Vec::new();
            for _ in 0..100 {
                want = alarms_and_put(&src.endpoints()).await.0;
                if !want.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(want.len(), 1, "{src_flavor:?}: {want:?}");
            let file = src.dir().join("full.db").display().to_string();
            let out = etcdctl35(&src.endpoints(), &["snapshot", "save", &file]);
            assert!(out.success(), "{out:?}");
            // Restore with the other side's tool, into the other server.
            let (dst_flavor, dst_bin) = match src_flavor {
                Flavor::Etcd => (Flavor::Retcd, Flavor::Retcd.binary()),
                _ => (Flavor::Etcd, etcd351_bin()),
            };
            let dst = restored_cluster(dst_flavor, dst_bin, |m, initial, token| {
                if dst_flavor == Flavor::Etcd {
                    Etcd::V3_5.restore(&file, m, initial, token);
                } else {
                    retcdutl_restore(&file, m, initial, token);
                }
            })
            .await;
            let (got, put) = alarms_and_put(&dst.endpoints()).await;
            assert_eq!(got, want, "{src_flavor:?} -> {dst_flavor:?}");
            assert_eq!(
                put.as_deref(),
                Some("etcdserver: mvcc: database space exceeded"),
                "{src_flavor:?} -> {dst_flavor:?}"
            );
        }
    })
    .await;
}

/// A snapshot taken while writers run is the store at exactly one
/// revision: restored, it serves exactly what the source serves at that
/// revision (`get --rev R`), and the writes went on during the save.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_snapshot_under_writes_is_one_revision() {
    bounded(LIMIT, async {
        let src = Cluster::start(Flavor::Retcd, 1, FAST).await.unwrap();
        let mut cl = src.client(0).await.unwrap();
        let big = vec![b'v'; 2000];
        for i in 0..3000 {
            cl.put(format!("k/{:05}", i % 1500), big.clone(), None)
                .await
                .unwrap();
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..3 {
            let mut c = src.client(0).await.unwrap();
            let stop = stop.clone();
            writers.push(tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    c.put(
                        format!("k/{:05}", (n * 7 + w) % 1500),
                        format!("w{w}-{n}"),
                        None,
                    )
                    .await
                    .unwrap();
                    n += 1;
                }
                n
            }));
        }
        let before = cl
            .get("x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let file = src.dir().join("live.db").display().to_string();
        let eps = src.endpoints();
        let out =
            tokio::task::spawn_blocking(move || etcdctl35(&eps, &["snapshot", "save", &file]))
                .await
                .unwrap();
        assert!(out.success(), "{out:?}");
        let after = cl
            .get("x", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut written = 0;
        for w in writers {
            written += w.await.unwrap();
        }
        assert!(
            after > before,
            "no write during the save ({before} → {after})"
        );
        assert!(written > 0);

        let file = src.dir().join("live.db").display().to_string();
        let dst = restored_cluster(
            Flavor::Retcd,
            Flavor::Retcd.binary(),
            |m, initial, token| retcdutl_restore(&file, m, initial, token),
        )
        .await;
        let mut dc = dst.client(0).await.unwrap();
        let got = dc
            .get("", Some(GetOptions::new().with_all_keys()))
            .await
            .unwrap();
        let rev = got.header().unwrap().revision();
        assert!(
            rev > before && rev < after,
            "snapshot at {rev}, writes {before}..{after}"
        );
        let want = cl
            .get(
                "",
                Some(GetOptions::new().with_all_keys().with_revision(rev)),
            )
            .await
            .unwrap();
        assert_eq!(
            rows_of(&got),
            rows_of(&want),
            "restored state differs from the source at {rev}"
        );
    })
    .await;
}
