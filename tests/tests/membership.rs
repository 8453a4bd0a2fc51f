//! Membership (Cluster service) and leader transfer: add a learner, let it
//! join with `--initial-cluster-state existing` and catch up, promote it,
//! update peer URLs, remove a member (which then exits), etcd's errors and
//! `--strict-reconfig-check` rules, move-leader, and replacing every member
//! of a 3-member cluster under write load. Runs against the selected
//! flavour (`RETCD_TEST_FLAVOR=etcd` for the real-etcd control).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use retcd_tests::cluster::connect;
use retcd_tests::{
    bounded, etcdctl35, grpc_error, http_post, initial_cluster_for, member_add_when_healthy,
    normalize_text, retry_until, test_flavor, Cluster,
};
use retcd_tests::{limit::LONG as LIMIT, FAST, READY};

const HEALTHY: Duration = Duration::from_secs(20);

fn err_of<T: std::fmt::Debug>(r: Result<T, etcd_client::Error>) -> (tonic::Code, String) {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => grpc_error(&e).unwrap_or_else(|| panic!("not a gRPC status: {e}")),
    }
}

/// Polls a serializable read of `key` on `endpoint` until it has `value`.
async fn wait_key(endpoint: &str, key: &str, value: &str, timeout: Duration) {
    retry_until(timeout, Duration::from_millis(100), async || {
        let mut c = connect(&[endpoint.to_string()]).await.map_err(|_| ())?;
        let opts = GetOptions::new().with_serializable();
        let r = c.get(key, Some(opts)).await.map_err(|_| ())?;
        let got = r.kvs().first().map(|kv| kv.value());
        (got == Some(value.as_bytes())).then_some(()).ok_or(())
    })
    .await
    .unwrap_or_else(|()| panic!("{endpoint} did not get {key}={value} within {timeout:?}"));
}

/// Promotes `id`, retrying while the learner is not yet in sync.
async fn promote_when_ready(c: &mut Client, id: u64, timeout: Duration) {
    retry_until(timeout, Duration::from_millis(300), async || {
        let e = match c.member_promote(id).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        // Retried only while the learner is catching up.
        let msg = e.to_string();
        assert!(
            msg.contains("in sync with leader")
                || msg.contains("unhealthy")
                || msg.contains("leader")
                || msg.contains("timed out"),
            "unexpected promote error: {msg}"
        );
        Err(e)
    })
    .await
    .unwrap_or_else(|e| panic!("promote of {id:x} did not succeed within {timeout:?}: {e}"));
}

/// Member ids by name (the unnamed, unstarted member under "").
async fn ids_by_name(c: &mut Client) -> BTreeMap<String, (u64, bool)> {
    c.member_list()
        .await
        .expect("member list")
        .members()
        .iter()
        .map(|m| (m.name().to_string(), (m.id(), m.is_learner())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_learner_join_promote_update_remove() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("client");
        for i in 0..20 {
            cl.put(format!("k{i}"), format!("v{i}"), None)
                .await
                .expect("put");
        }

        // Add a learner: unstarted (no name, no client URLs).
        let (cport, pport) = Cluster::new_ports();
        let purl = format!("http://127.0.0.1:{pport}");
        let r = member_add_when_healthy(&mut cl, &purl, true, HEALTHY)
            .await
            .expect("member add --learner");
        let added_at = tokio::time::Instant::now();
        let m = r.member().expect("added member");
        let new_id = m.id();
        assert_ne!(new_id, 0);
        assert!(m.is_learner());
        assert_eq!(m.peer_urls(), std::slice::from_ref(&purl));
        assert_eq!(m.name(), "");
        assert_eq!(r.member_list().len(), 4);
        let h = r.header().expect("header");
        assert_eq!(h.revision(), 0, "etcd's Cluster headers carry no revision");

        // Errors checked before it starts.
        let (code, msg) = err_of(cl.member_promote(new_id).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: can only promote a learner member which is in sync with leader"
            )
        );
        let (_, p2p) = Cluster::new_ports();
        let (code, msg) = err_of(
            member_add_when_healthy(&mut cl, &format!("http://127.0.0.1:{p2p}"), true, HEALTHY)
                .await,
        );
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: too many learner members in cluster"
            )
        );
        let (code, msg) =
            err_of(member_add_when_healthy(&mut cl, "http://127.0.0.1", false, HEALTHY).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::InvalidArgument,
                "etcdserver: given member URLs are invalid"
            )
        );
        let (code, msg) = err_of(cl.member_remove(0x1234).await);
        assert_eq!(
            (code, msg.as_str()),
            (tonic::Code::NotFound, "etcdserver: member not found")
        );
        let (code, msg) = err_of(cl.member_promote(0x1234).await);
        assert_eq!(
            (code, msg.as_str()),
            (tonic::Code::NotFound, "etcdserver: member not found")
        );
        let (code, msg) = err_of(cl.member_update(0x1234, vec![purl.clone()]).await);
        assert_eq!(
            (code, msg.as_str()),
            (tonic::Code::NotFound, "etcdserver: member not found")
        );
        let m0_id = ids_by_name(&mut cl).await["m0"].0;
        let (code, msg) = err_of(cl.member_promote(m0_id).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: can only promote a learner member"
            )
        );

        // Start it: it joins with --initial-cluster-state existing and
        // catches up.
        let ic = initial_cluster_for(&mut cl, "m3")
            .await
            .expect("initial cluster");
        let i = c.add_joining_member("m3", cport, pport, &ic, FAST);
        c.members[i].start();
        wait_key(&c.members[i].endpoint(), "k19", "v19", READY).await;
        retry_until(READY, Duration::from_millis(100), async || {
            let ids = ids_by_name(&mut cl).await;
            (ids.get("m3") == Some(&(new_id, true)))
                .then_some(())
                .ok_or(ids)
        })
        .await
        .unwrap_or_else(|ids| panic!("started learner publishes its name: {ids:?}"));
        // Its ID came from its URL and the time in seconds: a second
        // later the same URL gives another ID, so this is the URL check.
        tokio::time::sleep_until(added_at + Duration::from_millis(1100)).await;
        let (code, msg) = err_of(member_add_when_healthy(&mut cl, &purl, false, HEALTHY).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists"
            )
        );

        promote_when_ready(&mut cl, new_id, READY).await;
        let ids = ids_by_name(&mut cl).await;
        assert_eq!(ids.get("m3"), Some(&(new_id, false)), "{ids:?}");
        let (code, msg) = err_of(cl.member_promote(new_id).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: can only promote a learner member"
            )
        );
        cl.put("after-promote", "1", None).await.expect("put");
        wait_key(&c.members[i].endpoint(), "after-promote", "1", READY).await;

        // Update: a URL of another member is refused; a fresh one is taken
        // (and then put back, so the member keeps working).
        let m1_url = c.members[1].peer_url();
        let (code, msg) = err_of(cl.member_update(new_id, vec![m1_url]).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists"
            )
        );
        let extra = format!("http://127.0.0.1:{}", Cluster::new_ports().1);
        let r = cl
            .member_update(new_id, vec![purl.clone(), extra.clone()])
            .await
            .expect("member update");
        let updated = r
            .members()
            .iter()
            .find(|m| m.id() == new_id)
            .expect("in list");
        assert_eq!(updated.peer_urls(), [purl.clone(), extra.clone()]);
        cl.member_update(new_id, vec![purl.clone()])
            .await
            .expect("member update back");

        // Remove m3: it stops; the list no longer has it.
        let r = cl.member_remove(new_id).await.expect("member remove");
        assert_eq!(r.members().len(), 3);
        assert!(
            c.members[i].wait_exit(Duration::from_secs(20)).is_some(),
            "a removed member exits"
        );
        let ids = ids_by_name(&mut cl).await;
        assert!(!ids.contains_key("m3"), "{ids:?}");
        cl.put("after-remove", "1", None)
            .await
            .expect("put after remove");
    })
    .await;
}

/// etcd's learner rule (`isRPCSupportedForLearner` and the stream
/// interceptor): a learner serves `Status` and serializable `Range` only;
/// everything else — linearizable reads, writes, txns (even read-only),
/// watch and lease keep-alive streams, member list, HashKV, alarms, the
/// gRPC health check — fails with Unavailable "etcdserver: rpc not
/// supported for learner". Once promoted, it serves everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_learner_rejects_all_but_status_and_serializable_range() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("client");
        cl.put("foo", "bar", None).await.expect("put");
        let lease = cl.lease_grant(60, None).await.expect("lease").id();
        let (cport, pport) = Cluster::new_ports();
        let purl = format!("http://127.0.0.1:{pport}");
        let id = member_add_when_healthy(&mut cl, &purl, true, HEALTHY)
            .await
            .expect("member add --learner")
            .member()
            .expect("added")
            .id();
        let ic = initial_cluster_for(&mut cl, "m1")
            .await
            .expect("initial cluster");
        let i = c.add_joining_member("m1", cport, pport, &ic, FAST);
        c.members[i].start();
        let ep = c.members[i].endpoint();
        wait_key(&ep, "foo", "bar", READY).await;
        let mut l = connect(std::slice::from_ref(&ep))
            .await
            .expect("learner client");

        // served
        let r = l
            .get("foo", Some(GetOptions::new().with_serializable()))
            .await
            .expect("serializable get on a learner");
        assert_eq!(r.kvs()[0].value(), b"bar");
        let st = l.status().await.expect("status on a learner");
        assert!(st.is_learner());

        // refused
        const NOT: (tonic::Code, &str) = (
            tonic::Code::Unavailable,
            "etcdserver: rpc not supported for learner",
        );
        let check = |what: &str, got: (tonic::Code, String)| {
            assert_eq!((got.0, got.1.as_str()), NOT, "{what}");
        };
        check("linearizable get", err_of(l.get("foo", None).await));
        check("put", err_of(l.put("x", "y", None).await));
        check("delete", err_of(l.delete("foo", None).await));
        check(
            "read-only txn",
            err_of(
                l.txn(etcd_client::Txn::new().and_then([etcd_client::TxnOp::get(
                    "foo",
                    Some(GetOptions::new().with_serializable()),
                )]))
                .await,
            ),
        );
        check("compact", err_of(l.compact(1, None).await));
        check("lease grant", err_of(l.lease_grant(10, None).await));
        check("lease keep-alive", {
            match l.lease_keep_alive(lease).await {
                Err(e) => grpc_error(&e).expect("a status"),
                Ok((mut keeper, mut stream)) => {
                    let _ = keeper.keep_alive().await;
                    err_of(stream.message().await)
                }
            }
        });
        check("watch", {
            match l.watch("foo", None).await {
                Err(e) => grpc_error(&e).expect("a status"),
                Ok(mut stream) => err_of(stream.message().await),
            }
        });
        check("member list", err_of(l.member_list().await));
        check("hash kv", err_of(l.hash_kv(0).await));
        check(
            "alarm list",
            err_of(
                l.alarm(
                    etcd_client::AlarmAction::Get,
                    etcd_client::AlarmType::None,
                    None,
                )
                .await,
            ),
        );
        let ch = tonic::transport::Endpoint::from_shared(ep.clone())
            .expect("endpoint")
            .connect()
            .await
            .expect("channel");
        let h = HealthClient::new(ch)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        let e = h.expect_err("grpc health check on a learner");
        assert_eq!((e.code(), e.message()), NOT, "grpc health check");
        // The JSON gateway follows the same rule (503, grpc-gateway's
        // status for Unavailable).
        let port = c.members[i].client_port;
        let gw = |path: &str, body: &str| {
            let r = http_post(port, path, body, Duration::from_secs(10)).expect("gateway");
            let v: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
            (
                r.status,
                v["error"].as_str().unwrap_or_default().to_string(),
            )
        };
        let refused = (503, NOT.1.to_string());
        assert_eq!(
            gw("/v3/kv/put", r#"{"key":"eA==","value":"eQ=="}"#),
            refused,
            "gateway put"
        );
        assert_eq!(
            gw("/v3/cluster/member/list", "{}"),
            refused,
            "gateway member list"
        );
        assert_eq!(gw("/v3/maintenance/status", "{}").0, 200, "gateway status");
        let serializable = r#"{"key":"Zm9v","serializable":true}"#;
        assert_eq!(
            gw("/v3/kv/range", serializable).0,
            200,
            "gateway serializable range"
        );
        assert_eq!(
            gw("/v3/kv/range", r#"{"key":"Zm9v"}"#),
            refused,
            "gateway range"
        );

        // the voter is not affected
        cl.get("foo", None)
            .await
            .expect("linearizable get on the voter");

        // promoted: everything is served
        promote_when_ready(&mut cl, id, READY).await;
        retry_until(READY, Duration::from_millis(100), async || {
            l.put("x", "y", None).await
        })
        .await
        .unwrap_or_else(|e| panic!("put after promote: {e}"));
        l.get("foo", None)
            .await
            .expect("linearizable get after promote");
        l.member_list().await.expect("member list after promote");
    })
    .await;
}

/// `--strict-reconfig-check`: adding a voter that would leave fewer started
/// voters than a quorum is refused; a down member makes the cluster
/// "unhealthy" for adds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_strict_reconfig_check() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 2, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("client");
        // {m0, m1} + unstarted m2: 2 of 3 started, quorum 2: allowed.
        let p2 = format!("http://127.0.0.1:{}", Cluster::new_ports().1);
        let r = member_add_when_healthy(&mut cl, &p2, false, HEALTHY)
            .await
            .expect("add first unstarted voter");
        let m2 = r.member().expect("member").id();
        // + another unstarted voter: 2 of 4 started < quorum 3.
        let p3 = format!("http://127.0.0.1:{}", Cluster::new_ports().1);
        let (code, msg) = err_of(member_add_when_healthy(&mut cl, &p3, false, HEALTHY).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                // etcd maps this error to a client-side type, not a status.
                tonic::Code::Unknown,
                "etcdserver: re-configuration failed due to not enough started members"
            )
        );
        // The unstarted member is not connected: removing it is allowed.
        cl.member_remove(m2)
            .await
            .expect("remove the unstarted member");
        // A down member: adds are refused as unhealthy.
        c.members[1].kill();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (code, msg) = err_of(cl.member_add([p3.clone()], None).await);
        assert_eq!(
            (code, msg.as_str()),
            (tonic::Code::Unavailable, "etcdserver: unhealthy cluster")
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_move_leader() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let leader = c.leader(READY).await.expect("leader");
        let follower = (leader + 1) % 3;
        let (fid, _) = c.status_of(follower).await.expect("status");
        let (lid, _) = c.status_of(leader).await.expect("status");

        // On a follower: not leader.
        let mut fc = c.client(follower).await.expect("client");
        let (code, msg) = err_of(fc.move_leader(lid).await);
        assert_eq!(
            (code, msg.as_str()),
            (tonic::Code::FailedPrecondition, "etcdserver: not leader")
        );
        // An unknown transferee.
        let mut lc = c.client(leader).await.expect("client");
        let (code, msg) = err_of(lc.move_leader(0x1234).await);
        assert_eq!(
            (code, msg.as_str()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: bad leader transferee"
            )
        );
        // To a follower.
        lc.move_leader(fid).await.expect("move leader");
        for i in 0..3 {
            let (_, l) = c.status_of(i).await.expect("status");
            if i == follower || i == leader {
                assert_eq!(l, fid, "member {i} sees the transferee as leader");
            }
        }
        assert_eq!(c.leader(READY).await.expect("leader"), follower);

        // etcdctl 3.5 move-leader, back to the old leader.
        let out = etcdctl35(&c.endpoints(), &["move-leader", &format!("{lid:x}")]);
        assert!(out.success(), "{out:?}");
        let text = normalize_text(&out.stdout)
            .replace(&format!("{lid:x}"), "<old>")
            .replace(&format!("{fid:x}"), "<new>");
        assert_eq!(text.trim(), "Leadership transferred from <new> to <old>");
        assert_eq!(c.leader(READY).await.expect("leader"), leader);
    })
    .await;
}

fn retryable(e: &etcd_client::Error) -> bool {
    match grpc_error(e) {
        Some((code, _)) => matches!(
            code,
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        // Transport errors: the member we talked to went away.
        None => true,
    }
}

/// Replaces m0, m1, m2 one by one (add learner, join, promote, remove the
/// old one) while a writer puts unique values through the live members;
/// the only failures allowed are retried leader changes and closed
/// connections; every acknowledged write is there at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_replace_every_member_under_load() {
    bounded(Duration::from_secs(420), async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let live: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(c.endpoints()));
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let retried = Arc::new(AtomicU64::new(0));
        // Bumped when `live` changes; the writer reconnects to the new list
        // before its next request and acknowledges in `seen`.
        let generation = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(AtomicU64::new(0));
        let writer = {
            let (live, stop, acked, retried, generation, seen) = (
                live.clone(),
                stop.clone(),
                acked.clone(),
                retried.clone(),
                generation.clone(),
                seen.clone(),
            );
            tokio::spawn(async move {
                let mut failures = Vec::new();
                let mut client: Option<Client> = None;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let g = generation.load(Ordering::Acquire);
                    if seen.load(Ordering::Acquire) != g {
                        client = None;
                        seen.store(g, Ordering::Release);
                    }
                    let (k, v) = (format!("load/{i:06}"), format!("v{i}"));
                    let mut attempts = 0;
                    loop {
                        attempts += 1;
                        if client.is_none() {
                            let eps = live.lock().unwrap().clone();
                            client = connect(&eps).await.ok();
                        }
                        let Some(cl) = client.as_mut() else {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        };
                        match cl.put(k.clone(), v.clone(), None).await {
                            Ok(_) => break,
                            Err(e) if retryable(&e) && attempts < 100 => {
                                retried.fetch_add(1, Ordering::Relaxed);
                                client = None;
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(e) => {
                                failures.push(format!("{k}: {e}"));
                                break;
                            }
                        }
                    }
                    acked.store(i + 1, Ordering::Relaxed);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                failures
            })
        };

        for old in 0..3usize {
            let name = format!("n{old}");
            let mut cl = connect(&snapshot_of(&live)).await.expect("client");
            let (cport, pport) = Cluster::new_ports();
            let purl = format!("http://127.0.0.1:{pport}");
            let r = member_add_when_healthy(&mut cl, &purl, true, Duration::from_secs(30))
                .await
                .expect("add learner");
            let new_id = r.member().expect("member").id();
            let ic = initial_cluster_for(&mut cl, &name)
                .await
                .expect("initial cluster");
            let i = c.add_joining_member(&name, cport, pport, &ic, FAST);
            c.members[i].start();
            promote_when_ready(&mut cl, new_id, READY).await;
            live.lock().unwrap().push(c.members[i].endpoint());

            // Move the writer off the old member, then remove it (through a
            // client of the others).
            let old_ep = c.members[old].endpoint();
            live.lock().unwrap().retain(|e| *e != old_ep);
            let g = generation.fetch_add(1, Ordering::AcqRel) + 1;
            while seen.load(Ordering::Acquire) != g {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut cl = connect(&snapshot_of(&live)).await.expect("client");
            let old_id = ids_by_name(&mut cl).await[&format!("m{old}")].0;
            // Retried (through a new client) while the error is one a
            // retry can cure; "member not found" is a removal already done.
            retry_until(
                Duration::from_secs(30),
                Duration::from_millis(300),
                async || match cl.member_remove(old_id).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.to_string().contains("member not found") => Ok(()),
                    Err(e) if retryable(&e) => {
                        cl = connect(&snapshot_of(&live)).await.expect("client");
                        Err(e)
                    }
                    Err(e) => panic!("remove m{old}: {e}"),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("remove m{old}: {e}"));
            assert!(
                c.members[old].wait_exit(Duration::from_secs(30)).is_some(),
                "removed m{old} exits"
            );
            // Every live member has applied the removal before the next
            // member is added (its --initial-cluster is built from a list).
            for ep in snapshot_of(&live) {
                retry_until(READY, Duration::from_millis(100), async || {
                    let mut one = connect(std::slice::from_ref(&ep)).await.expect("client");
                    let l = one.member_list().await.map_err(|_| ())?;
                    let gone = l.members().iter().all(|m| m.id() != old_id);
                    gone.then_some(()).ok_or(())
                })
                .await
                .unwrap_or_else(|()| panic!("{ep} still lists m{old}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        let failures = writer.await.expect("writer");
        assert!(failures.is_empty(), "failed client requests: {failures:?}");
        let n = acked.load(Ordering::Relaxed);
        assert!(n > 50, "too few writes went through: {n}");

        let mut cl = connect(&snapshot_of(&live)).await.expect("client");
        let list = cl.member_list().await.expect("member list");
        let mut names: Vec<String> = list
            .members()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        names.sort();
        assert_eq!(names, ["n0", "n1", "n2"]);
        assert!(list.members().iter().all(|m| !m.is_learner()));
        let r = cl
            .get("load/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("get");
        let got: BTreeMap<String, String> = r
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    String::from_utf8_lossy(kv.value()).into_owned(),
                )
            })
            .collect();
        for i in 0..n {
            assert_eq!(
                got.get(&format!("load/{i:06}")).map(String::as_str),
                Some(format!("v{i}").as_str()),
                "acknowledged write {i} is missing"
            );
        }
        eprintln!(
            "replaced 3 members; {n} writes acknowledged, {} retries",
            retried.load(Ordering::Relaxed)
        );
    })
    .await;
}

/// Replaces every run of 16 hex digits (etcdctl's `%16x` ids, possibly
/// space-padded) with `<id>`, and loopback ports with PORT.
fn normalize_ids(s: &str) -> String {
    let s = normalize_text(s);
    let mut out = String::new();
    let words: Vec<&str> = s
        .split_inclusive(|c: char| !c.is_ascii_hexdigit())
        .collect();
    for w in words {
        let hex: String = w.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
        if hex.len() >= 12 {
            out.push_str("<id>");
            out.push_str(&w[hex.len()..]);
        } else {
            out.push_str(w);
        }
    }
    // `%16x` pads short ids with spaces.
    while out.contains("  <id>") {
        out = out.replace("  <id>", " <id>");
    }
    out
}

/// `etcdctl member list/add/update/promote/remove` print what etcd's do
/// (ids, ports and the order of members, which follows the ids, normalised).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn test_etcdctl_member_commands() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let mut cl = c.client(0).await.expect("client");
        // Every member has published its client URLs (etcd serves only
        // after its publish is applied; retcd may answer Status earlier).
        retry_until(READY, Duration::from_millis(100), async || {
            let l = cl.member_list().await.map_err(|_| ())?;
            let published = l.members().iter().all(|m| !m.client_urls().is_empty());
            published.then_some(()).ok_or(())
        })
        .await
        .expect("members never published");
        let mut transcript = String::new();
        let mut run = |c: &Cluster, args: &[&str]| {
            // One endpoint: lists are local, so read-your-writes needs
            // the member that made the change.
            let o = retcd_tests::etcdctl(&[c.members[0].endpoint()], args);
            let stdout = match serde_json::from_str::<serde_json::Value>(&o.stdout) {
                Ok(mut v) => {
                    // Members come in id order; ids differ between runs.
                    if let Some(ms) = v.get_mut("members").and_then(|m| m.as_array_mut()) {
                        ms.sort_by_key(|m| {
                            m.get("name").map(|n| n.to_string()).unwrap_or_default()
                        });
                    }
                    retcd_tests::normalize_json(&mut v);
                    format!("{v}\n")
                }
                Err(_) => o.stdout.clone(),
            };
            let mut lines: Vec<String> = normalize_ids(&stdout).lines().map(String::from).collect();
            if args.contains(&"list") {
                lines.sort();
            }
            for l in lines.iter_mut() {
                if l.starts_with("\"RaftTerm\"") {
                    *l = "\"RaftTerm\" : <term>".into();
                }
                if let Some(v) = l.strip_prefix("ETCD_INITIAL_CLUSTER=") {
                    let mut parts: Vec<&str> = v.trim_matches('"').split(',').collect();
                    parts.sort();
                    *l = format!("ETCD_INITIAL_CLUSTER=\"{}\"", parts.join(","));
                }
            }
            transcript.push_str(&format!(
                "$ etcdctl {}\n{}\n[stderr] {}[code {}]\n",
                normalize_ids(&args.join(" ")),
                lines.join("\n"),
                normalize_ids(&retcd_tests::normalize_stderr(&o.stderr)),
                o.code
            ));
            o
        };
        run(&c, &["member", "list"]);
        run(&c, &["member", "list", "-w", "fields"]);
        let (_, p1) = Cluster::new_ports();
        // Wait until the cluster accepts adds (peers connected 5 s).
        let probe = format!("http://127.0.0.1:{p1}");
        let r = member_add_when_healthy(&mut cl, &probe, true, HEALTHY)
            .await
            .expect("add");
        let probe_id = r.member().expect("member").id();
        cl.member_remove(probe_id).await.expect("remove probe");
        let (_, p2) = Cluster::new_ports();
        let url = format!("--peer-urls=http://127.0.0.1:{p2}");
        run(&c, &["member", "add", "newm", &url, "--learner"]);
        run(&c, &["member", "list"]);
        let id = ids_by_name(&mut cl).await[""].0;
        let hex = format!("{id:x}");
        run(&c, &["member", "promote", &hex]);
        run(&c, &["member", "remove", &hex]);
        // An unstarted voter (3 of 4 started: allowed); update its URLs.
        let (_, p4) = Cluster::new_ports();
        run(
            &c,
            &[
                "member",
                "add",
                "newv",
                &format!("--peer-urls=http://127.0.0.1:{p4}"),
            ],
        );
        let id = ids_by_name(&mut cl).await[""].0;
        let hex = format!("{id:x}");
        let (_, p3) = Cluster::new_ports();
        run(
            &c,
            &[
                "member",
                "update",
                &hex,
                &format!("--peer-urls=http://127.0.0.1:{p3}"),
            ],
        );
        run(&c, &["member", "list", "-w", "json"]);
        run(&c, &["member", "remove", &hex]);
        run(&c, &["member", "remove", &hex]);
        run(&c, &["member", "list"]);
        eprintln!("{transcript}");
        let want = include_str!("membership_etcdctl.golden");
        if let Some((n, (got, exp))) = transcript
            .lines()
            .zip(want.lines())
            .enumerate()
            .find(|(_, (g, w))| g != w)
        {
            panic!("line {}: got {got:?}, want {exp:?}\n{transcript}", n + 1);
        }
        assert_eq!(transcript, want);
    })
    .await;
}

/// A copy of the shared endpoint list, taken without holding its lock
/// across an `.await`.
fn snapshot_of(live: &std::sync::Mutex<Vec<String>>) -> Vec<String> {
    live.lock().unwrap().clone()
}

/// `n` members of etcd 3.5.1 (the etcd whose texts retcd's bootstrap
/// follows) or of retcd.
async fn start_against_351(flavor: retcd_tests::Flavor, n: usize) -> Cluster {
    match flavor {
        retcd_tests::Flavor::Etcd => {
            Cluster::start_with_binary(flavor, retcd_tests::etcd351_bin(), n, FAST).await
        }
        retcd_tests::Flavor::Retcd => Cluster::start(flavor, n, FAST).await,
    }
    .expect("start")
}

/// What a member joining with `--initial-cluster-state existing` says of
/// the cluster it fetched: first with `--initial-cluster` naming the first
/// member by a URL that is not its own, `localhost` for its IP (refused: etcd's
/// ValidateClusterAndAssignIDs text, IDs and ports masked), then naming
/// it by the host name `vm` (this machine's /etc/hosts: 127.0.0.1), which
/// etcd resolves and accepts.
async fn join_by_peer_urls(flavor: retcd_tests::Flavor) -> Vec<String> {
    let mut c = start_against_351(flavor, 1).await;
    let mut cl = c.client(0).await.expect("client");
    let (cport, pport) = Cluster::new_ports();
    let purl = format!("http://127.0.0.1:{pport}");
    let added = member_add_when_healthy(&mut cl, &purl, true, HEALTHY)
        .await
        .expect("add a learner");
    let new_id = added.member().map(|m| m.id()).expect("the added member");
    let ic = initial_cluster_for(&mut cl, "m1")
        .await
        .expect("initial cluster");
    let first = c.members[0].peer_url();
    let p0 = first.rsplit(':').next().expect("a port").to_string();
    // The last resolver error is the last local member's: the order of
    // their IDs (from the URLs and the token) differs between runs.
    let mask = |s: &str| {
        s.replace(&format!("{new_id:x}"), "<NEW>")
            .replace(&p0, "<P0>")
            .replace(&pport.to_string(), "<P1>")
            .replace("http://localhost:<P0>", "<LOCAL>")
            .replace("http://127.0.0.1:<P1>", "<LOCAL>")
    };
    let mut seen = Vec::new();
    // Not its own URL (but one the cluster can be fetched from): refused.
    let bad = ic.replace(&first, &first.replace("127.0.0.1", "localhost"));
    let i = c.add_joining_member("m1", cport, pport, &bad, FAST);
    c.members[i].start();
    let status = c.members[i].wait_exit(Duration::from_secs(20));
    let log = c.members[i].log();
    let line = log
        .lines()
        .find_map(|l| {
            l.split_once("error validating peerURLs ")
                .map(|x| x.1.to_string())
        })
        .unwrap_or_else(|| format!("no validation error in the log: {log}"));
    // after the fetched cluster's text, what did not match
    let why = line
        .split_once("}: ")
        .map(|x| x.1)
        .unwrap_or(&line)
        .trim_end_matches(['"', '}'])
        .split("\",\"")
        .next()
        .unwrap_or_default()
        .to_string();
    // the member's ID is in it: the first member's, whatever it is
    let id0 = why
        .split_once("member (")
        .and_then(|x| x.1.split_once(','))
        .map(|x| x.0.to_string())
        .unwrap_or_default();
    seen.push(format!(
        "refused: {} {}",
        status.is_some_and(|s| !s.success()),
        mask(&why.replacen(&id0, "<ID0>", 1))
    ));
    // By a name that resolves to its URL: it joins.
    let _ = std::fs::remove_dir_all(c.members[i].data_dir());
    c.members.pop();
    let by_name = ic.replace(&first, &first.replace("127.0.0.1", "vm"));
    let i = c.add_joining_member("m1", cport, pport, &by_name, FAST);
    c.members[i].start();
    cl.put("joined", "yes", None).await.expect("put");
    let served = tokio::time::timeout(
        READY,
        wait_key(&c.members[i].endpoint(), "joined", "yes", READY),
    )
    .await
    .is_ok();
    seen.push(format!("joins by a resolved name: {served}"));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_matches_peer_urls_resolved_as_etcd() {
    bounded(LIMIT, async {
        // etcd 3.5.1 (its texts are 3.4's, its log zap's)
        let want = join_by_peer_urls(retcd_tests::Flavor::Etcd).await;
        let got = join_by_peer_urls(retcd_tests::Flavor::Retcd).await;
        assert_eq!(want.len(), 2, "{want:?}");
        assert!(
            want[0].starts_with("refused: true PeerURLs: no match found"),
            "{want:?}"
        );
        assert_eq!(want[1], "joins by a resolved name: true", "{want:?}");
        assert_eq!(got, want);
    })
    .await;
}

/// A member of a running 3-member cluster loses its data dir and is
/// started again with the same command line (`--initial-cluster-state
/// new`): the others know its ID and its client URLs, so it refuses to
/// bootstrap a fresh log (etcd's isMemberBootstrapped), rather than join
/// with a log that forgot its votes.
async fn wiped_member_restart(flavor: retcd_tests::Flavor) -> String {
    let mut c = start_against_351(flavor, 3).await;
    let mut cl = c.client(0).await.expect("client");
    let id = cl
        .member_list()
        .await
        .expect("member list")
        .members()
        .iter()
        .find(|m| m.name() == c.members[2].name)
        .map(|m| m.id())
        .expect("member 2 listed");
    c.members[2].kill();
    std::fs::remove_dir_all(c.members[2].data_dir()).expect("wipe its data dir");
    c.members[2].start();
    let status = c.members[2].wait_exit(Duration::from_secs(20));
    let log = c.members[2].log();
    let why = log
        .lines()
        .rev()
        .find_map(|l| {
            l.find("member ")
                .filter(|_| l.contains("has already been bootstrapped"))
                .map(|i| {
                    l[i..]
                        .split("bootstrapped")
                        .next()
                        .unwrap_or_default()
                        .to_string()
                })
        })
        .unwrap_or_else(|| format!("no refusal in the log: {log}"));
    // the others still serve (after electing a leader if it was the one)
    retry_until(READY, Duration::from_millis(200), async || {
        cl.put("after", "1", None).await.map(|_| ())
    })
    .await
    .expect("a put on the other two");
    format!(
        "exits: {}; {}",
        status.is_some_and(|s| !s.success()),
        why.replace(&format!("{id:x}"), "<ID>")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_member_refuses_to_bootstrap_again_as_etcd() {
    bounded(LIMIT, async {
        let want = wiped_member_restart(retcd_tests::Flavor::Etcd).await;
        assert_eq!(want, "exits: true; member <ID> has already been ", "etcd");
        let got = wiped_member_restart(retcd_tests::Flavor::Retcd).await;
        assert_eq!(got, want);
    })
    .await;
}
