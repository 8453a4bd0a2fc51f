//! Compatibility with data written by an older build: the fixture
//! `tests/fixtures/compat-a23d9d6` (see its README) is the data dir of one
//! member written by retcd at commit a23d9d6 and SIGKILLed right after its
//! last acknowledged writes. The binary under test (`RETCD_BIN`, as
//! everywhere) must open a copy of it and serve, through the wire, every
//! key with its revisions and version, every revision the compaction kept
//! (and etcd's error below it), both leases with their keys, and the user
//! and role.
//!
//! The last writes were never durably committed to the backend: they exist
//! only in the WAL. `old_wal_tail_is_replayed` shows that from the fixture
//! itself — its backend file, read with redb directly (an independent
//! witness, not the code under test), stops at revision 10 — and then that
//! the server serves revisions 11 to 15.
//!
//! retcd only: the fixture is retcd's on-disk format.
//! `make_compat_fixture` (ignored) is how the fixture was made.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, ConnectOptions, EventType, GetOptions,
    GetResponse, LeaseGrantOptions, LeaseTimeToLiveOptions, Permission, PermissionType, PutOptions,
    Txn, TxnOp, WatchOptions,
};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use retcd_tests::{bounded, grpc_error, test_flavor, workspace_root, Cluster, Flavor};
use retcd_tests::{limit::SHORT as LIMIT, FAST};
use tonic::Code;

/// The fixture's directory, relative to the workspace root.
const FIXTURE: &str = "tests/fixtures/compat-a23d9d6";
/// The data dir (its `member/` tree) as a gzipped tar, in [`FIXTURE`].
const TARBALL: &str = "data-dir.tar.gz";

/// Every key of the fixture is under this prefix.
const PREFIX: &str = "compat/";
/// Every change, in revision order: (revision, key, value or `None` for a
/// delete, lease). Revisions 7 and 14 are transactions of two puts.
const HISTORY: &[(i64, &str, Option<&str>, i64)] = &[
    (2, "compat/a", Some("a1"), 0),
    (3, "compat/b", Some("b1"), 0),
    (4, "compat/a", Some("a2"), 0),
    (5, "compat/c", Some("c1"), 0),
    (6, "compat/c", None, 0),
    (7, "compat/a", Some("a3"), 0),
    (7, "compat/d", Some("d1"), 0),
    (8, "compat/leased", Some("l1"), LEASE_BACKEND),
    (9, "compat/e", Some("e1"), 0),
    (10, "compat/flush", Some("f"), 0),
    (11, "compat/wal/1", Some("w1"), 0),
    (12, "compat/a", Some("a4"), 0),
    (13, "compat/b", None, 0),
    (14, "compat/wal/2", Some("w2"), 0),
    (14, "compat/d", Some("d2"), 0),
    (15, "compat/wal/leased", Some("l2"), LEASE_WAL),
];
/// The last revision (the store's current one).
const LAST_REVISION: i64 = 15;
/// The compaction: reads below it fail.
const COMPACTED_AT: i64 = 5;
/// The backend file holds revisions up to this one; the rest is in the WAL.
const LAST_DURABLE_REVISION: i64 = 10;
/// Granted before revision 8, in the backend.
const LEASE_BACKEND: i64 = 0x7e57_0001;
/// Granted before revision 15, only in the WAL.
const LEASE_WAL: i64 = 0x7e57_0002;
/// Both leases' TTL, in seconds (long: they never expire).
const LEASE_TTL: i64 = 100_000;
/// The user, its password, and its role: read on [`PREFIX`].
const USER: (&str, &str) = ("alice", "alicepw");
const ROLE: &str = "reader";

/// IDs and raft positions of the fixture (printed by `make_compat_fixture`).
const MEMBER_ID: u64 = 0xfb9b_baf0_6139_b553;
const CLUSTER_ID: u64 = 0x49aa_6819_26df_ca19;
/// The backend's consistent index: the raft index of revision 10's entry.
const BACKEND_CONSISTENT_INDEX: u64 = 18;
/// The raft index of the last entry in the WAL (revision 15's).
const WAL_LAST_INDEX: u64 = 24;

/// One key as served: (key, value, create revision, mod revision, version,
/// lease).
type Kv = (String, String, i64, i64, i64, i64);

/// The keys under [`PREFIX`] at revision `rev`, from [`HISTORY`].
fn state_at(rev: i64) -> Vec<Kv> {
    let mut m: BTreeMap<&str, Kv> = BTreeMap::new();
    for &(r, key, value, lease) in HISTORY.iter().filter(|h| h.0 <= rev) {
        match value {
            None => {
                m.remove(key);
            }
            Some(v) => {
                let kv = m.entry(key).or_insert((key.into(), v.into(), r, r, 0, 0));
                kv.1 = v.into();
                kv.3 = r;
                kv.4 += 1;
                kv.5 = lease;
            }
        }
    }
    m.into_values().collect()
}

fn kvs_of(r: &GetResponse) -> Vec<Kv> {
    r.kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.lease(),
            )
        })
        .collect()
}

/// Unpacks the fixture into `data_dir` (created if missing).
fn unpack_fixture(data_dir: &Path) {
    let tarball = workspace_root().join(FIXTURE).join(TARBALL);
    std::fs::create_dir_all(data_dir).expect("create data dir");
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(data_dir)
        .status()
        .expect("run tar");
    assert!(st.success(), "tar -xzf {}: {st}", tarball.display());
}

/// A one-member cluster of retcd started on a copy of the fixture.
async fn started_on_fixture() -> Cluster {
    let mut c = Cluster::create(Flavor::Retcd, 1, FAST).expect("create");
    unpack_fixture(c.members[0].data_dir());
    c.start_all().await.expect("start on the fixture");
    c
}

/// What a backend file alone holds, read with redb (not with retcd's
/// code): its consistent index and the main revision of every row of the
/// `key` table (design.md, "MVCC on redb": `meta.consistent_index` is
/// 8 bytes big-endian; a `key` row's key starts with the 8-byte
/// big-endian main revision). Opens `db` read-write (redb may repair a
/// file that was not closed): pass a copy.
fn backend_witness(db: &Path) -> (u64, Vec<i64>) {
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
    const KEY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("key");
    let db = redb::Database::open(db).expect("open the backend with redb");
    let tx = db.begin_read().expect("read transaction");
    let meta = tx.open_table(META).expect("table meta");
    let ci = meta
        .get("consistent_index")
        .expect("read consistent_index")
        .map(|v| u64::from_be_bytes(v.value().try_into().expect("8 bytes")))
        .expect("consistent_index is set");
    let keys = tx.open_table(KEY).expect("table key");
    let mut revs: Vec<i64> = keys
        .iter()
        .expect("iterate key")
        .map(|row| {
            let (k, _) = row.expect("row");
            i64::from_be_bytes(k.value()[..8].try_into().expect("revision bytes"))
        })
        .collect();
    revs.dedup();
    (ci, revs)
}

/// The current keys, and the keys at each revision of `revs`, are
/// [`HISTORY`]'s (and the current revision is [`LAST_REVISION`]).
async fn assert_history(cl: &mut Client, revs: impl IntoIterator<Item = i64>) {
    let r = cl
        .get(PREFIX, Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(r.header().expect("header").revision(), LAST_REVISION);
    assert_eq!(kvs_of(&r), state_at(LAST_REVISION), "current keys");
    for rev in revs {
        let opts = GetOptions::new().with_prefix().with_revision(rev);
        let r = cl.get(PREFIX, Some(opts)).await.expect("get at a revision");
        assert_eq!(kvs_of(&r), state_at(rev), "keys at revision {rev}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_data_dir_serves_everything() {
    if test_flavor() == Flavor::Etcd {
        return;
    }
    bounded(LIMIT, async {
        let c = started_on_fixture().await;
        let mut cl = c.client(0).await.expect("connect");

        // The same member of the same cluster, not a new one.
        let st = cl.status().await.expect("status");
        let h = st.header().expect("header");
        assert_eq!((h.member_id(), h.cluster_id()), (MEMBER_ID, CLUSTER_ID));
        assert!(
            st.raft_index() >= WAL_LAST_INDEX,
            "raft index {} < the WAL's last {WAL_LAST_INDEX}",
            st.raft_index()
        );

        // Keys, revisions, versions, leases of keys, at every kept revision.
        assert_history(&mut cl, COMPACTED_AT..=LAST_REVISION).await;
        for rev in [1, COMPACTED_AT - 1] {
            let opts = GetOptions::new().with_prefix().with_revision(rev);
            let e = cl.get(PREFIX, Some(opts)).await.expect_err("compacted");
            assert_eq!(
                grpc_error(&e),
                Some((
                    Code::OutOfRange,
                    "etcdserver: mvcc: required revision has been compacted".into()
                )),
                "get at revision {rev}"
            );
        }

        // A watch from the compaction revision replays every later change.
        let want: Vec<(EventType, String, i64)> = HISTORY
            .iter()
            .filter(|h| h.0 >= COMPACTED_AT)
            .map(|&(r, k, v, _)| {
                let t = if v.is_some() {
                    EventType::Put
                } else {
                    EventType::Delete
                };
                (t, k.to_string(), r)
            })
            .collect();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(COMPACTED_AT);
        let mut s = cl.watch(PREFIX, Some(opts)).await.expect("watch");
        let mut got = Vec::new();
        while got.len() < want.len() {
            let m = tokio::time::timeout(Duration::from_secs(10), s.message())
                .await
                .unwrap_or_else(|_| panic!("watch stalled after {got:?}"))
                .expect("watch message")
                .expect("watch open");
            for e in m.events() {
                let kv = e.kv().expect("event kv");
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                got.push((e.event_type(), key, kv.mod_revision()));
            }
        }
        assert_eq!(got, want, "watch events from revision {COMPACTED_AT}");

        // Both leases, their TTL and their keys.
        let mut ids: Vec<i64> = cl
            .leases()
            .await
            .expect("leases")
            .leases()
            .iter()
            .map(|l| l.id())
            .collect();
        ids.sort();
        assert_eq!(ids, [LEASE_BACKEND, LEASE_WAL]);
        for (id, key) in [
            (LEASE_BACKEND, "compat/leased"),
            (LEASE_WAL, "compat/wal/leased"),
        ] {
            let opts = LeaseTimeToLiveOptions::new().with_keys();
            let t = cl.lease_time_to_live(id, Some(opts)).await.expect("ttl");
            assert_eq!((t.id(), t.granted_ttl()), (id, LEASE_TTL));
            assert!(
                t.ttl() > LEASE_TTL - 600 && t.ttl() <= LEASE_TTL,
                "lease {id:x}: remaining {} s of {LEASE_TTL}",
                t.ttl()
            );
            assert_eq!(t.keys(), [key.as_bytes()], "keys of lease {id:x}");
        }

        // The user and the role.
        let users = cl.user_list().await.expect("user list");
        assert_eq!(users.users(), [USER.0]);
        let u = cl.user_get(USER.0).await.expect("user get");
        assert_eq!(u.roles(), [ROLE]);
        let roles = cl.role_list().await.expect("role list");
        assert_eq!(roles.roles(), [ROLE]);
        let perms: Vec<(i32, Vec<u8>, Vec<u8>)> = cl
            .role_get(ROLE)
            .await
            .expect("role get")
            .permissions()
            .iter()
            .map(|p| (p.get_type(), p.key().to_vec(), p.range_end().to_vec()))
            .collect();
        let read = PermissionType::Read as i32;
        assert_eq!(perms, [(read, b"compat/".to_vec(), b"compat0".to_vec())]);

        // It takes new writes after the old revisions.
        let r = cl.put("compat/new", "n", None).await.expect("put");
        assert_eq!(r.header().expect("header").revision(), LAST_REVISION + 1);

        // The stored password hash still checks, and the role still
        // applies: with auth enabled (on this copy) the user logs in,
        // reads under the prefix and may not write.
        cl.user_add("root", "rootpw", None).await.expect("add root");
        cl.user_grant_role("root", "root")
            .await
            .expect("grant root");
        cl.auth_enable().await.expect("auth enable");
        let login = |pw: &str| {
            let opts = ConnectOptions::new()
                .with_user(USER.0, pw)
                .with_connect_timeout(Duration::from_secs(2))
                .with_timeout(Duration::from_secs(5));
            Client::connect([c.members[0].endpoint()], Some(opts))
        };
        let e = login("wrong").await.err().expect("a wrong password fails");
        assert_eq!(
            grpc_error(&e),
            Some((
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password".into()
            ))
        );
        let mut alice = login(USER.1).await.expect("log in with the old password");
        let r = alice.get("compat/a", None).await.expect("read as the user");
        assert_eq!(r.kvs()[0].value(), b"a4");
        let e = alice
            .put("compat/a", "x", None)
            .await
            .expect_err("no write");
        assert_eq!(
            grpc_error(&e),
            Some((
                Code::PermissionDenied,
                "etcdserver: permission denied".into()
            ))
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_wal_tail_is_replayed() {
    if test_flavor() == Flavor::Etcd {
        return;
    }
    bounded(LIMIT, async {
        // The fixture's backend alone: applied up to revision 10's entry.
        let witness = tempfile::tempdir().expect("temp dir");
        unpack_fixture(witness.path());
        let member = witness.path().join("member");
        let (ci, revs) = backend_witness(&member.join("snap").join("db"));
        assert_eq!(ci, BACKEND_CONSISTENT_INDEX, "backend consistent index");
        // Rows of revision 2 went with the compaction (compat/a's first
        // value was overwritten at 4); none is newer than revision 10.
        let durable: Vec<i64> = (3..=LAST_DURABLE_REVISION).collect();
        assert_eq!(revs, durable, "revisions of the backend's key rows");
        let wal: Vec<PathBuf> = std::fs::read_dir(member.join("wal"))
            .expect("wal dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "wal"))
            .collect();
        assert!(!wal.is_empty(), "no WAL segment in the fixture");

        // Served: revisions 11..=15 and the second lease, which only the
        // WAL holds, so they were replayed from it.
        let c = started_on_fixture().await;
        let mut cl = c.client(0).await.expect("connect");
        assert_history(&mut cl, LAST_DURABLE_REVISION + 1..=LAST_REVISION).await;
        let opts = LeaseTimeToLiveOptions::new().with_keys();
        let t = cl
            .lease_time_to_live(LEASE_WAL, Some(opts))
            .await
            .expect("ttl");
        assert_eq!(t.granted_ttl(), LEASE_TTL);
        assert_eq!(t.keys(), [b"compat/wal/leased".as_slice()]);
    })
    .await;
}

/// `r`'s value, or a panic naming `what`.
fn ok<T>(r: Result<T, etcd_client::Error>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Makes the fixture: run with the retcd binary of the commit named in
/// the fixture's README as `RETCD_BIN` and the tarball to write as
/// `RETCD_COMPAT_OUT` (see the README). Writes [`HISTORY`] — the last
/// writes in a burst right after a durable backend commit — SIGKILLs the
/// member at once, checks with [`backend_witness`] that the burst is only
/// in the WAL, and packs the data dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture; see tests/fixtures/compat-a23d9d6/README.md"]
async fn make_compat_fixture() {
    let out = PathBuf::from(std::env::var_os("RETCD_COMPAT_OUT").expect("set RETCD_COMPAT_OUT"));
    let mut c = Cluster::start(Flavor::Retcd, 1, FAST).await.expect("start");
    let mut cl = c.client(0).await.expect("connect");
    let lease = |id| PutOptions::new().with_lease(id);
    let grant = LeaseGrantOptions::new;

    // Revisions 2..=9, the compaction, the leased key, the user and role.
    ok(cl.put("compat/a", "a1", None).await, "put");
    ok(cl.put("compat/b", "b1", None).await, "put");
    ok(cl.put("compat/a", "a2", None).await, "put");
    ok(cl.put("compat/c", "c1", None).await, "put");
    ok(cl.delete("compat/c", None).await, "delete");
    let txn = Txn::new()
        .when([Compare::version("compat/a", CompareOp::Equal, 2)])
        .and_then([
            TxnOp::put("compat/a", "a3", None),
            TxnOp::put("compat/d", "d1", None),
        ]);
    assert!(ok(cl.txn(txn).await, "txn").succeeded());
    ok(
        cl.lease_grant(LEASE_TTL, Some(grant().with_id(LEASE_BACKEND)))
            .await,
        "grant",
    );
    ok(
        cl.put("compat/leased", "l1", Some(lease(LEASE_BACKEND)))
            .await,
        "put",
    );
    let physical = CompactionOptions::new().with_physical();
    ok(cl.compact(COMPACTED_AT, Some(physical)).await, "compact");
    ok(cl.user_add(USER.0, USER.1, None).await, "user add");
    ok(cl.role_add(ROLE).await, "role add");
    let perm = Permission::read(PREFIX).with_prefix();
    ok(
        cl.role_grant_permission(ROLE, perm).await,
        "grant permission",
    );
    ok(cl.user_grant_role(USER.0, ROLE).await, "grant role");
    ok(cl.put("compat/e", "e1", None).await, "put");
    // A pause: the raft thread commits all of that durably (a durable
    // commit is due once 100 ms passed since the last one).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = ok(cl.status().await, "status");
    let h = st.header().expect("header");
    let (member_id, cluster_id, index0) = (h.member_id(), h.cluster_id(), st.raft_index());

    // Revision 10: the first write after the pause is committed durably
    // at once (100 ms have passed); the next durable commit is due 100 ms
    // later. Revisions 11..=15 and the second lease come before that, and
    // the member is SIGKILLed right after the last acknowledgement.
    let t0 = Instant::now();
    ok(cl.put("compat/flush", "f", None).await, "put");
    ok(cl.put("compat/wal/1", "w1", None).await, "put");
    ok(cl.put("compat/a", "a4", None).await, "put");
    ok(cl.delete("compat/b", None).await, "delete");
    let txn = Txn::new()
        .when([Compare::mod_revision("compat/d", CompareOp::Equal, 7)])
        .and_then([
            TxnOp::put("compat/wal/2", "w2", None),
            TxnOp::put("compat/d", "d2", None),
        ]);
    assert!(ok(cl.txn(txn).await, "txn").succeeded());
    ok(
        cl.lease_grant(LEASE_TTL, Some(grant().with_id(LEASE_WAL)))
            .await,
        "grant",
    );
    let last = ok(
        cl.put("compat/wal/leased", "l2", Some(lease(LEASE_WAL)))
            .await,
        "put",
    );
    let acked = t0.elapsed();
    c.members[0].kill();
    let killed = t0.elapsed();
    assert_eq!(last.header().expect("header").revision(), LAST_REVISION);
    eprintln!("burst acknowledged {acked:?} and SIGKILL sent {killed:?} after its first write");
    assert!(
        killed < Duration::from_millis(70),
        "the burst took too long ({killed:?}): a durable commit may have run; try again"
    );

    // The witness: the backend alone stops at revision 10.
    let data_dir = c.members[0].data_dir().to_path_buf();
    let copy = tempfile::tempdir().expect("temp dir");
    let st = Command::new("cp")
        .arg("-a")
        .arg(data_dir.join("member"))
        .arg(copy.path())
        .status()
        .expect("cp");
    assert!(st.success());
    let (ci, revs) = backend_witness(&copy.path().join("member/snap/db"));
    eprintln!("backend: consistent index {ci}, row revisions {revs:?}");
    assert_eq!(revs.last().copied(), Some(LAST_DURABLE_REVISION));

    // Packed from a copy whose runs of zeros are holes (the same bytes):
    // the WAL segment is preallocated to 64 MiB, so it unpacks sparse.
    let sparse = tempfile::tempdir().expect("temp dir");
    let st = Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(data_dir.join("member"))
        .arg(sparse.path())
        .status()
        .expect("cp");
    assert!(st.success());
    let st = Command::new("tar")
        .args([
            "--sparse",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-czf",
        ])
        .arg(&out)
        .arg("-C")
        .arg(sparse.path())
        .arg("member")
        .status()
        .expect("tar");
    assert!(st.success());
    let same = Command::new("diff")
        .arg("-r")
        .arg(data_dir.join("member"))
        .arg(sparse.path().join("member"))
        .status()
        .expect("diff");
    assert!(same.success(), "the packed copy differs from the data dir");
    let listing = Command::new("tar")
        .arg("-tvzf")
        .arg(&out)
        .output()
        .expect("tar -t");
    eprintln!("{}", String::from_utf8_lossy(&listing.stdout));
    eprintln!(
        "MEMBER_ID = {member_id:#x}\nCLUSTER_ID = {cluster_id:#x}\n\
         raft index before the burst = {index0} (the burst is 7 entries: last index {})\n\
         BACKEND_CONSISTENT_INDEX = {ci}\nwrote {}",
        index0 + 7,
        out.display()
    );
}
