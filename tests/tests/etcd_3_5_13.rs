//! What the etcd version retcd reports (3.5.24) promises (docs/design.md, "Which
//! etcd"): the client-visible behaviour of etcd 3.5 releases up to the one
//! in `Status.version` and `/version`, each checked over the wire.
//!
//! Each test runs against the selected flavour. With
//! `RETCD_TEST_FLAVOR=etcd` a behaviour etcd 3.5.1 already has is checked
//! against etcd 3.5.1 ([`etcd351_bin`]); a behaviour of a later release
//! (3.5.8, 3.5.22, 3.5.24, …) has no reference binary here, and its test
//! (or that part of it) runs against retcd only, as said at each.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::GetOptions;
use retcd_api::authpb::{permission::Type as PermType, Permission};
use retcd_api::etcdserverpb as pb;
use retcd_api::etcdserverpb::auth_client::AuthClient;
use retcd_api::etcdserverpb::watch_client::WatchClient;
use retcd_api::etcdserverpb::watch_request::RequestUnion;
use retcd_tests::cluster::connect;
use retcd_tests::{
    bounded, etcd351_bin, etcdctl35, http_get, http_post, initial_cluster_for,
    member_add_when_healthy, retry_until, test_flavor, Cluster, Flavor,
};
use retcd_tests::{limit::NORMAL as LIMIT, FAST, READY};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// The etcd version retcd reports (`ETCD_VERSION`): every item below up
/// to it passes.
const REPORTED: &str = "3.5.24";

/// The release a behaviour appeared in, for the real-etcd control.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Since {
    /// etcd 3.5.1 has it: the control runs against etcd 3.5.1.
    V3_5_1,
    /// A later release: no reference binary, retcd only.
    Later,
}

/// The server binary to run for a behaviour of release `since`, or None
/// when the flavour is etcd and no etcd here has it.
fn server(since: Since) -> Option<(Flavor, PathBuf)> {
    match (test_flavor(), since) {
        (Flavor::Retcd, _) => Some((Flavor::Retcd, Flavor::Retcd.binary())),
        (Flavor::Etcd, Since::V3_5_1) => Some((Flavor::Etcd, etcd351_bin())),
        (Flavor::Etcd, Since::Later) => None,
    }
}

/// Whether the run is against retcd (for the parts no etcd here has).
fn retcd() -> bool {
    test_flavor() == Flavor::Retcd
}

async fn start(since: Since, flags: &[&str]) -> Option<Cluster> {
    let (flavor, bin) = server(since)?;
    let mut all = FAST.to_vec();
    all.extend_from_slice(flags);
    Some(
        Cluster::start_with_binary(flavor, bin, 1, &all)
            .await
            .expect("start"),
    )
}

/// Adds a learner to the 1-member cluster `c`, starts it and waits until
/// it has `foo` (put before); returns its index.
async fn add_learner(c: &mut Cluster) -> usize {
    let mut cl = c.client(0).await.expect("client");
    cl.put("foo", "bar", None).await.expect("put");
    let (cport, pport) = Cluster::new_ports();
    let purl = format!("http://127.0.0.1:{pport}");
    member_add_when_healthy(&mut cl, &purl, true, Duration::from_secs(20))
        .await
        .expect("member add --learner");
    let ic = initial_cluster_for(&mut cl, "m1")
        .await
        .expect("initial cluster");
    let i = c.add_joining_member("m1", cport, pport, &ic, FAST);
    c.members[i].start();
    let ep = c.members[i].endpoint();
    retry_until(READY, Duration::from_millis(100), async || {
        let mut l = connect(std::slice::from_ref(&ep)).await.map_err(|_| ())?;
        let r = l
            .get("foo", Some(GetOptions::new().with_serializable()))
            .await
            .map_err(|_| ())?;
        (r.kvs().first().map(|kv| kv.value()) == Some(b"bar".as_slice()))
            .then_some(())
            .ok_or(())
    })
    .await
    .unwrap_or_else(|()| panic!("the learner did not catch up within {READY:?}"));
    i
}

/// etcd 3.5.0 (#12890): a learner serves the Snapshot stream (its
/// allowlist: unary Status, serializable Range, stream Snapshot), so
/// `etcdctl snapshot save` works against it; every other RPC is still
/// refused. etcd 3.5.19 (#19280): its `/readyz` fails the `non_learner`
/// check (retcd only: etcd 3.5.1 has no `/readyz`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_learner_serves_snapshot() {
    bounded(LIMIT, async {
        let Some(mut c) = start(Since::V3_5_1, &[]).await else {
            return;
        };
        let i = add_learner(&mut c).await;
        let ep = c.members[i].endpoint();
        let file = c.dir().join("learner.db");
        let file_s = file.to_string_lossy().into_owned();
        let o = etcdctl35(std::slice::from_ref(&ep), &["snapshot", "save", &file_s]);
        assert!(o.success(), "snapshot save on a learner: {o:?}");
        assert!(o.stdout.contains("Snapshot saved at"), "{o:?}");
        let len = std::fs::metadata(&file).expect("snapshot file").len();
        // the database (a multiple of 512 bytes) and its sha256
        assert!(len > 32 && (len - 32) % 512 == 0, "snapshot size {len}");

        // still refused
        for args in [
            &["put", "x", "y"][..],
            &["get", "foo"],
            &["member", "list"],
            &["endpoint", "hashkv"],
        ] {
            let o = etcdctl35(std::slice::from_ref(&ep), args);
            assert!(!o.success(), "{args:?} on a learner: {o:?}");
            assert!(
                o.stderr.contains("rpc not supported for learner"),
                "{args:?} on a learner: {o:?}"
            );
        }
        let mut l = connect(std::slice::from_ref(&ep)).await.expect("client");
        match l.watch("foo", None).await {
            Err(e) => assert!(
                e.to_string().contains("rpc not supported for learner"),
                "{e}"
            ),
            Ok(mut s) => {
                let e = s.message().await.expect_err("watch on a learner");
                assert!(
                    e.to_string().contains("rpc not supported for learner"),
                    "{e}"
                );
            }
        }
        // still served
        let o = etcdctl35(
            std::slice::from_ref(&ep),
            &["get", "foo", "--consistency=s", "--print-value-only"],
        );
        assert_eq!((o.code, o.stdout.trim()), (0, "bar"), "{o:?}");

        if retcd() {
            let port = c.members[i].client_port;
            let r = http_get(port, "/readyz", Duration::from_secs(5)).expect("readyz");
            assert_eq!(r.status, 503, "{r:?}");
            assert!(
                r.body
                    .contains("[-]non_learner failed: not supported for learner"),
                "{r:?}"
            );
            let r = http_get(port, "/readyz?exclude=non_learner", Duration::from_secs(5))
                .expect("readyz");
            assert_eq!(r.status, 200, "{r:?}");
            // etcd's health checks read past the gRPC learner rule: a
            // learner's linearizable read goes through the leader
            let r = http_get(port, "/health", Duration::from_secs(5)).expect("health");
            assert_eq!(
                (r.status, r.json().expect("json")["health"].clone()),
                (200, "true".into()),
                "{r:?}"
            );
            let voter = c.members[0].client_port;
            let r = http_get(voter, "/readyz", Duration::from_secs(5)).expect("readyz");
            assert_eq!(r.status, 200, "voter: {r:?}");
        }
    })
    .await;
}

async fn auth_client(c: &Cluster) -> AuthClient<tonic::transport::Channel> {
    AuthClient::connect(c.members[0].endpoint())
        .await
        .expect("auth client")
}

fn perm(key: &[u8], range_end: &[u8]) -> Option<Permission> {
    Some(Permission {
        perm_type: PermType::Read as i32,
        key: key.to_vec(),
        range_end: range_end.to_vec(),
    })
}

/// The role's permissions as (key, range end).
async fn perms_of(
    a: &mut AuthClient<tonic::transport::Channel>,
    role: &str,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let r = a
        .role_get(pb::AuthRoleGetRequest { role: role.into() })
        .await
        .expect("role get");
    r.into_inner()
        .perm
        .into_iter()
        .map(|p| (p.key, p.range_end))
        .collect()
}

/// etcd 3.5.0 (#13086): RoleGrantPermission without `perm` fails with
/// InvalidArgument "etcdserver: permission not given" (checked before the
/// role exists), over gRPC and the JSON gateway (400, code 3); nothing is
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_grant_without_permission() {
    bounded(LIMIT, async {
        let Some(c) = start(Since::V3_5_1, &[]).await else {
            return;
        };
        let mut a = auth_client(&c).await;
        a.role_add(pb::AuthRoleAddRequest { name: "r1".into() })
            .await
            .expect("role add");
        for role in ["r1", "nosuch"] {
            let e = a
                .role_grant_permission(pb::AuthRoleGrantPermissionRequest {
                    name: role.into(),
                    perm: None,
                })
                .await
                .expect_err("grant without perm");
            assert_eq!(
                (e.code(), e.message()),
                (
                    tonic::Code::InvalidArgument,
                    "etcdserver: permission not given"
                ),
                "role {role}"
            );
        }
        let port = c.members[0].client_port;
        let r = http_post(
            port,
            "/v3/auth/role/grant",
            r#"{"name":"r1"}"#,
            Duration::from_secs(5),
        )
        .expect("gateway");
        let v = r.json().expect("json");
        assert_eq!(r.status, 400, "{r:?}");
        assert_eq!(v["error"], "etcdserver: permission not given", "{r:?}");
        assert_eq!(v["code"], 3, "{r:?}");
        assert_eq!(perms_of(&mut a, "r1").await, vec![]);
    })
    .await;
}

/// etcd 3.5.8 (#15619, `isValidPermissionRange`): a permission with no key
/// or an empty range (end not above the key; `\0` means "from the key
/// on") fails with InvalidArgument "etcdserver: invalid auth management".
/// The refusals are retcd only (etcd 3.5.1 accepts them); the accepted
/// ranges are checked against etcd 3.5.1 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_grant_empty_permission_range() {
    bounded(LIMIT, async {
        let Some(c) = start(Since::V3_5_1, &[]).await else {
            return;
        };
        let mut a = auth_client(&c).await;
        a.role_add(pb::AuthRoleAddRequest { name: "r1".into() })
            .await
            .expect("role add");
        let grant = |perm| pb::AuthRoleGrantPermissionRequest {
            name: "r1".into(),
            perm,
        };
        if retcd() {
            for (key, end) in [
                (&b""[..], &b""[..]),
                (b"", b"\0"),
                (b"", b"b"),
                (b"b", b"a"),
                (b"a", b"a"),
            ] {
                let e = a
                    .role_grant_permission(grant(perm(key, end)))
                    .await
                    .expect_err("an empty range");
                assert_eq!(
                    (e.code(), e.message()),
                    (
                        tonic::Code::InvalidArgument,
                        "etcdserver: invalid auth management"
                    ),
                    "{key:?}..{end:?}"
                );
            }
            // the gateway: 400, code 3
            let r = http_post(
                c.members[0].client_port,
                "/v3/auth/role/grant",
                r#"{"name":"r1","perm":{"permType":"READ","key":"Yg==","range_end":"YQ=="}}"#,
                Duration::from_secs(5),
            )
            .expect("gateway");
            let v = r.json().expect("json");
            assert_eq!(
                (r.status, &v["error"], &v["code"]),
                (
                    400,
                    &"etcdserver: invalid auth management".into(),
                    &3.into()
                ),
                "{r:?}"
            );
            assert_eq!(perms_of(&mut a, "r1").await, vec![]);
        }
        for (key, end) in [(&b"a"[..], &b""[..]), (b"a", b"b"), (b"c", b"\0")] {
            a.role_grant_permission(grant(perm(key, end)))
                .await
                .unwrap_or_else(|e| panic!("{key:?}..{end:?}: {e}"));
        }
        // (sorted here: etcd sorts by key alone, and not stably)
        let mut got = perms_of(&mut a, "r1").await;
        got.sort();
        assert_eq!(
            got,
            vec![
                (b"a".to_vec(), vec![]),
                (b"a".to_vec(), b"b".to_vec()),
                (b"c".to_vec(), vec![0])
            ]
        );
    })
    .await;
}

/// A raw watch stream: requests go in through `tx`.
struct RawWatch {
    tx: mpsc::Sender<pb::WatchRequest>,
    rx: Streaming<pb::WatchResponse>,
}

fn create_req(key: &[u8], start_revision: i64, progress_notify: bool) -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(pb::WatchCreateRequest {
            key: key.to_vec(),
            start_revision,
            progress_notify,
            ..Default::default()
        })),
    }
}

fn progress_req() -> pb::WatchRequest {
    pb::WatchRequest {
        request_union: Some(RequestUnion::ProgressRequest(pb::WatchProgressRequest {})),
    }
}

/// Opens a watch stream on `ep` whose first requests are `first` (the
/// last of them must get an answer: a Go server sends the response
/// headers with the first message). `pause` waits between them.
async fn raw_watch(ep: &str, first: Vec<pb::WatchRequest>, pause: Duration) -> RawWatch {
    let mut w = WatchClient::connect(ep.to_string())
        .await
        .expect("watch client");
    let (tx, reqs) = mpsc::channel(16);
    let call = tokio::spawn(async move { w.watch(ReceiverStream::new(reqs)).await });
    for r in first {
        tx.send(r).await.expect("send");
        tokio::time::sleep(pause).await;
    }
    let rx = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("watch call answered")
        .expect("join")
        .expect("watch call")
        .into_inner();
    RawWatch { tx, rx }
}

impl RawWatch {
    async fn send(&self, r: pb::WatchRequest) {
        self.tx.send(r).await.expect("send");
    }

    /// The next response within `d`, or None.
    async fn next_within(&mut self, d: Duration) -> Option<pb::WatchResponse> {
        match tokio::time::timeout(d, self.rx.message()).await {
            Err(_) => None,
            Ok(r) => Some(r.expect("watch stream").expect("stream open")),
        }
    }

    async fn next(&mut self) -> pb::WatchResponse {
        self.next_within(Duration::from_secs(10))
            .await
            .expect("a watch response within 10s")
    }
}

fn rev_of(r: &pb::WatchResponse) -> i64 {
    r.header.as_ref().map(|h| h.revision).unwrap_or_default()
}

/// etcd 3.5.8 (#15695): RequestProgress on a stream with no watcher gets
/// no answer (retcd only; etcd 3.5.1 answers it). With a synced watcher
/// the answer is unchanged: watch id -1 at the current revision (checked
/// against etcd 3.5.1 too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_progress_request_without_watchers() {
    bounded(LIMIT, async {
        let Some(c) = start(Since::V3_5_1, &[]).await else {
            return;
        };
        let mut cl = c.client(0).await.expect("client");
        cl.put("a", "1", None).await.expect("put"); // 2
        let ep = c.members[0].endpoint();
        let mut w = raw_watch(
            &ep,
            vec![progress_req(), create_req(b"a", 0, false)],
            Duration::from_millis(500),
        )
        .await;
        let mut r = w.next().await;
        if !retcd() {
            // etcd 3.5.1 (before 3.5.8) answers the request
            assert_eq!((r.watch_id, r.created), (-1, false), "{r:?}");
            r = w.next().await;
        }
        assert!(r.created, "the first answer is the create's: {r:?}");
        assert_eq!((r.watch_id, rev_of(&r)), (0, 2), "{r:?}");
        w.send(progress_req()).await;
        let r = w.next().await;
        assert_eq!(
            (
                r.watch_id,
                r.created,
                r.canceled,
                r.events.len(),
                rev_of(&r)
            ),
            (-1, false, false, 0, 2),
            "{r:?}"
        );
        // a cancelled last watcher leaves a stream with no watcher
        w.send(pb::WatchRequest {
            request_union: Some(RequestUnion::CancelRequest(pb::WatchCancelRequest {
                watch_id: 0,
            })),
        })
        .await;
        let r = w.next().await;
        assert!(r.canceled && r.watch_id == 0, "{r:?}");
        if retcd() {
            w.send(progress_req()).await;
            let r = w.next_within(Duration::from_secs(1)).await;
            assert!(r.is_none(), "no answer on a stream with no watcher: {r:?}");
        }
    })
    .await;
}

/// etcd 3.5.24 (#20709): a watch with a negative start revision gets one
/// response, created and canceled, watch id -1, "etcdserver: mvcc:
/// required revision has been compacted"; the stream goes on (retcd only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_watch_negative_start_revision() {
    bounded(LIMIT, async {
        let Some(c) = start(Since::Later, &[]).await else {
            return;
        };
        let mut cl = c.client(0).await.expect("client");
        cl.put("a", "1", None).await.expect("put"); // 2
        let ep = c.members[0].endpoint();
        let mut w = raw_watch(&ep, vec![create_req(b"a", -1, false)], Duration::ZERO).await;
        let r = w.next().await;
        assert_eq!(
            (
                r.created,
                r.canceled,
                r.watch_id,
                r.cancel_reason.as_str(),
                rev_of(&r)
            ),
            (
                true,
                true,
                -1,
                "etcdserver: mvcc: required revision has been compacted",
                2
            ),
            "{r:?}"
        );
        assert!(r.events.is_empty());
        // the stream still serves
        w.send(create_req(b"a", 1, false)).await;
        let r = w.next().await;
        assert!(r.created && !r.canceled && r.watch_id == 0, "{r:?}");
        let r = w.next().await;
        assert_eq!(r.events.len(), 1, "{r:?}");
    })
    .await;
}

/// etcd 3.5.22 (#20290): a watch that starts at a revision the store has
/// not reached gets no progress notification, periodic or requested, while
/// the store is below it; once the store reaches it, its events come and
/// progress notifications (at or above the start) resume (retcd only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_future_watch_gets_no_progress() {
    bounded(LIMIT, async {
        let flags = ["--experimental-watch-progress-notify-interval", "200ms"];
        let Some(c) = start(Since::Later, &flags).await else {
            return;
        };
        let mut cl = c.client(0).await.expect("client");
        cl.put("a", "1", None).await.expect("put"); // 2
        let ep = c.members[0].endpoint();
        let mut w = raw_watch(&ep, vec![create_req(b"a", 5, true)], Duration::ZERO).await;
        let r = w.next().await;
        assert!(r.created && r.watch_id == 0, "{r:?}");
        w.send(progress_req()).await;
        let r = w.next_within(Duration::from_millis(1200)).await;
        assert!(r.is_none(), "progress below the start revision: {r:?}");
        cl.put("b", "1", None).await.expect("put"); // 3
        cl.put("b", "2", None).await.expect("put"); // 4
        let r = w.next_within(Duration::from_millis(800)).await;
        assert!(r.is_none(), "progress below the start revision: {r:?}");
        cl.put("a", "2", None).await.expect("put"); // 5
        let mut saw_event = false;
        let r = loop {
            let r = w.next().await;
            assert!(
                rev_of(&r) >= 5,
                "a response below the start revision: {r:?}"
            );
            if r.events.is_empty() {
                break r;
            }
            assert_eq!(r.events[0].kv.as_ref().unwrap().mod_revision, 5);
            saw_event = true;
        };
        assert!(saw_event, "the event at the start revision comes first");
        assert_eq!(rev_of(&r), 5, "{r:?}");
    })
    .await;
}

/// `Status.version` and `/version` report the etcd release retcd
/// implements ([`REPORTED`]), the cluster version is its `major.minor.0`,
/// and `--emulated-etcd-version` changes both (retcd only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_reported_version() {
    bounded(LIMIT, async {
        for (flags, want) in [
            (&[][..], REPORTED),
            (&["--emulated-etcd-version=3.5.9"][..], "3.5.9"),
        ] {
            let Some(c) = start(Since::Later, flags).await else {
                return;
            };
            let mut cl = c.client(0).await.expect("client");
            let st = cl.status().await.expect("status");
            assert_eq!(st.version(), want);
            let r = http_get(c.members[0].client_port, "/version", Duration::from_secs(5))
                .expect("/version");
            let v = r.json().expect("json");
            assert_eq!(v["etcdserver"], want, "{r:?}");
            assert_eq!(v["etcdcluster"], "3.5.0", "{r:?}");
            let o = etcdctl35(&c.endpoints(), &["endpoint", "status", "-w", "json"]);
            assert!(o.success(), "{o:?}");
            assert!(
                o.stdout.contains(&format!("\"version\":\"{want}\"")),
                "{o:?}"
            );
        }
    })
    .await;
}

/// `put t`, `put x`, `del t`, `compact` at the delete (physical); returns
/// the delete's revision and HashKV at the current revision.
async fn delete_then_compact(c: &Cluster) -> (i64, u32) {
    let mut cl = c.client(0).await.expect("client");
    cl.put("t", "v", None).await.expect("put"); // 2
    cl.put("x", "1", None).await.expect("put"); // 3
    let d = cl.delete("t", None).await.expect("delete");
    let rev = d.header().expect("header").revision();
    cl.compact(
        rev,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .expect("compact");
    let h = cl.hash_kv(0).await.expect("hash kv");
    (rev, h.hash())
}

/// A watch of `t` from `rev` on member 0: its first events.
async fn first_events(c: &Cluster, rev: i64) -> Vec<(i32, i64)> {
    let ep = c.members[0].endpoint();
    let mut w = raw_watch(&ep, vec![create_req(b"t", rev, false)], Duration::ZERO).await;
    let r = w.next().await;
    assert!(r.created && !r.canceled, "{r:?}");
    match w.next_within(Duration::from_secs(2)).await {
        None => vec![],
        Some(r) => r
            .events
            .iter()
            .map(|e| {
                (
                    e.r#type,
                    e.kv.as_ref().map(|kv| kv.mod_revision).unwrap_or(0),
                )
            })
            .collect(),
    }
}

/// etcd 3.5.16 (#18474): a tombstone at exactly the compaction revision is
/// kept, so a watch from the compaction revision gets the DELETE; and
/// 3.5.18 (#19249): after a restart, where the tombstone is the key's only
/// revision left, still. HashKV leaves that tombstone out, so it equals
/// etcd 3.5.1's, which deleted it (the same history run on both). The
/// watch part is retcd only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_watch_from_compaction_gets_tombstone() {
    bounded(LIMIT, async {
        let reference = Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, FAST)
            .await
            .expect("start etcd 3.5.1");
        let (_, etcd_hash) = delete_then_compact(&reference).await;
        drop(reference);
        let Some(mut c) = start(Since::Later, &[]).await else {
            return;
        };
        let (rev, hash) = delete_then_compact(&c).await;
        assert_eq!(rev, 4);
        assert_eq!(hash, etcd_hash, "HashKV after compacting at a tombstone");
        const DELETE: i32 = retcd_api::mvccpb::event::EventType::Delete as i32;
        assert_eq!(first_events(&c, rev).await, vec![(DELETE, rev)]);
        // the range at the compaction revision still has no `t`
        let mut cl = c.client(0).await.expect("client");
        let r = cl
            .get("t", Some(GetOptions::new().with_revision(rev)))
            .await
            .expect("get at the compaction revision");
        assert!(r.kvs().is_empty());
        drop(cl);
        c.members[0].stop();
        c.restart_member(0, READY).await.expect("restart");
        assert_eq!(
            first_events(&c, rev).await,
            vec![(DELETE, rev)],
            "after a restart"
        );
        let mut cl = c.client(0).await.expect("client");
        assert_eq!(cl.hash_kv(0).await.expect("hash kv").hash(), etcd_hash);
        // a compaction above it removes the tombstone
        cl.put("x", "2", None).await.expect("put"); // 5
        cl.compact(5, None).await.expect("compact");
        assert_eq!(first_events(&c, 5).await, vec![], "no event of t at 5");
        let r = cl.get("t", None).await.expect("get");
        assert!(r.kvs().is_empty());
        // etcd 3.5.10 (#16490): the gateway serves HashKV on `/hashkv`
        let h = cl.hash_kv(0).await.expect("hash kv");
        let r = http_post(
            c.members[0].client_port,
            "/v3/maintenance/hashkv",
            "{}",
            Duration::from_secs(5),
        )
        .expect("gateway hashkv");
        let v = r.json().expect("json");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(v["hash"], h.hash(), "{r:?}");
        assert_eq!(v["compact_revision"], "5", "{r:?}");
    })
    .await;
}

/// etcd 3.5.13 (#17566, etcd#17507, etcd's
/// `TestV3WatchProgressWaitsForSyncNoEvents`): a watch from a past
/// revision that matches no event still gets a progress notification once
/// it is synced, when the client asks for one (again) (retcd only: etcd
/// 3.5.1 answers at once, before the bug this checks for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_progress_for_watch_without_events() {
    bounded(LIMIT, async {
        let Some(c) = start(Since::Later, &[]).await else {
            return;
        };
        let mut cl = c.client(0).await.expect("client");
        let rev = cl
            .put("bar", "1", None)
            .await
            .expect("put")
            .header()
            .unwrap()
            .revision();
        let ep = c.members[0].endpoint();
        let mut w = raw_watch(&ep, vec![create_req(b"foo", rev, false)], Duration::ZERO).await;
        let r = w.next().await;
        assert!(r.created, "{r:?}");
        let mut got = None;
        for _ in 0..50 {
            w.send(progress_req()).await;
            if let Some(r) = w.next_within(Duration::from_millis(100)).await {
                got = Some(r);
                break;
            }
        }
        let r = got.expect("a progress notification within 5s");
        assert_eq!(
            (r.watch_id, r.events.len(), rev_of(&r)),
            (-1, 0, rev),
            "{r:?}"
        );
    })
    .await;
}

/// etcd 3.5.23 (#20616): LeaseKeepAlive on a revoked lease fails with
/// "requested lease not found" (retcd only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_keepalive_of_revoked_lease() {
    bounded(LIMIT, async {
        let Some(c) = start(Since::Later, &[]).await else {
            return;
        };
        let mut cl = c.client(0).await.expect("client");
        let id = cl.lease_grant(60, None).await.expect("grant").id();
        cl.lease_revoke(id).await.expect("revoke");
        let o = etcdctl35(
            &c.endpoints(),
            &["lease", "keep-alive", "--once", &format!("{id:x}")],
        );
        assert!(!o.success(), "{o:?}");
        assert!(o.stderr.contains("requested lease not found"), "{o:?}");
    })
    .await;
}
