//! 3-member cluster behaviour: agreement of reads on every member, leader
//! failover, catch-up of a restarted member (by log and by snapshot).
//! Runs against the selected flavour (`RETCD_TEST_FLAVOR=etcd` for the
//! real-etcd control).

use std::time::Duration;

use etcd_client::{Client, GetOptions};
use retcd_tests::{bounded, retry_until, test_flavor, Cluster, Flavor};
use retcd_tests::{limit::NORMAL as LIMIT, FAST, READY};

/// (key, value, create_revision, mod_revision, version) of every key under `prefix`.
type Kvs = Vec<(String, String, i64, i64, i64)>;

async fn read_prefix(
    c: &mut Client,
    prefix: &str,
    serializable: bool,
) -> anyhow::Result<(i64, Kvs)> {
    let mut opts = GetOptions::new().with_prefix();
    if serializable {
        opts = opts.with_serializable();
    }
    let r = c.get(prefix, Some(opts)).await?;
    let kvs = r
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
            )
        })
        .collect();
    Ok((r.header().map(|h| h.revision()).unwrap_or(-1), kvs))
}

/// Polls a serializable read of `prefix` on member `i` until it equals
/// `want` (header revision and kvs), bounded by `timeout`.
async fn wait_caught_up(c: &Cluster, i: usize, prefix: &str, want: &(i64, Kvs), timeout: Duration) {
    let mut last = None;
    let caught_up = retry_until(timeout, Duration::from_millis(100), async || {
        let mut cl = c.client(i).await.map_err(|_| ())?;
        match read_prefix(&mut cl, prefix, true).await {
            Ok(got) if &got == want => Ok(()),
            Ok(got) => {
                last = Some(format!("revision {} with {} keys", got.0, got.1.len()));
                Err(())
            }
            Err(e) => {
                last = Some(format!("error {e}"));
                Err(())
            }
        }
    })
    .await;
    if caught_up.is_err() {
        panic!(
            "member {i} did not catch up within {timeout:?}: want revision {} with {} keys, last saw {last:?}",
            want.0,
            want.1.len()
        );
    }
}

/// Writes through each member; linearizable and serializable reads through
/// every member give the same keys, values and revisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_reads_agree_on_every_member() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 3, FAST)
            .await
            .expect("start cluster");
        for i in 0..3 {
            let mut cl = c.client(i).await.expect("connect");
            for j in 0..5 {
                cl.put(format!("agree/m{i}/{j}"), format!("v{i}.{j}"), None)
                    .await
                    .expect("put");
            }
            cl.put("agree/shared", format!("from m{i}"), None)
                .await
                .expect("put");
        }
        let mut answers = Vec::new();
        for i in 0..3 {
            let mut cl = c.client(i).await.expect("connect");
            // Linearizable first: afterwards the member has applied at least
            // every write above, so its serializable read must agree too.
            let lin = read_prefix(&mut cl, "agree/", false)
                .await
                .expect("linearizable read");
            let ser = read_prefix(&mut cl, "agree/", true)
                .await
                .expect("serializable read");
            assert_eq!(lin.1.len(), 16, "member {i}: {lin:?}");
            assert_eq!(
                lin, ser,
                "member {i}: linearizable and serializable reads differ"
            );
            answers.push(lin);
        }
        assert_eq!(answers[0], answers[1], "members 0 and 1 differ");
        assert_eq!(answers[0], answers[2], "members 0 and 2 differ");
        let shared = answers[0]
            .1
            .iter()
            .find(|kv| kv.0 == "agree/shared")
            .expect("shared key");
        assert_eq!(shared.1, "from m2");
        assert_eq!(shared.4, 3, "version of a key written three times");
        // 18 writes after the initial revision 1.
        assert_eq!(answers[0].0, 19, "header revision after 18 puts");
    })
    .await;
}

/// SIGKILL the leader: a new leader appears within a few election timeouts,
/// writes continue, and the old leader restarts and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_new_leader_elected_old_leader_catches_up() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST)
            .await
            .expect("start cluster");
        let mut cl = c.client_all().await.expect("connect");
        for j in 0..10 {
            cl.put(format!("fo/{j}"), "before", None)
                .await
                .expect("put");
        }
        let old = c.leader(Duration::from_secs(10)).await.expect("leader");
        c.members[old].kill();
        // Election timeout is 500 ms: a new leader well within 10 s.
        let new = c
            .leader(Duration::from_secs(10))
            .await
            .expect("new leader after SIGKILL");
        assert_ne!(new, old);
        let survivors: Vec<usize> = (0..3).filter(|&i| i != old).collect();
        let mut cl = c.client_of(&survivors).await.expect("connect to survivors");
        for j in 0..20 {
            let key = format!("fo/after/{j}");
            // A write may race the election; retry a few times, bounded.
            retry_until(Duration::from_secs(10), Duration::from_millis(100), || {
                let mut cl = cl.clone();
                let key = key.clone();
                async move { cl.put(key, "after", None).await }
            })
            .await
            .expect("write after failover");
        }
        let want = read_prefix(&mut cl, "fo/", false).await.expect("read");
        assert_eq!(want.1.len(), 30);
        c.restart_member(old, READY)
            .await
            .expect("restart old leader");
        wait_caught_up(&c, old, "fo/", &want, Duration::from_secs(30)).await;
        for &i in &survivors {
            wait_caught_up(&c, i, "fo/", &want, Duration::from_secs(10)).await;
        }
    })
    .await;
}

/// Keys written while the follower is down: more than --snapshot-count (100)
/// and more than etcd's 5000 catch-up entries kept after a snapshot, so the
/// leader can no longer send the follower the log and must send a snapshot.
const SNAP_KEYS: usize = 5600;

/// A follower stopped while more than --snapshot-count entries are written
/// restarts and catches up (through a snapshot: see [`SNAP_KEYS`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_follower_catches_up_after_snapshot() {
    follower_catches_up_by_snapshot(0).await;
}

/// The same with 2 KiB values: the snapshot (about 12 MiB) is larger than
/// one peer message fragment (8 MiB), so it is encoded and cut into
/// fragments on a blocking thread, sent in pieces, reassembled and decoded
/// off the peer thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_follower_catches_up_through_a_fragmented_snapshot() {
    follower_catches_up_by_snapshot(2048).await;
}

/// The size of the snapshot the restarted follower applied, from its log.
fn applied_snapshot_bytes(log: &str) -> Option<u64> {
    log.lines()
        .filter(|l| l.contains("applying snapshot from leader"))
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["snapshot-bytes"].as_u64())
}

async fn follower_catches_up_by_snapshot(value_size: usize) {
    bounded(LIMIT, async {
        let flags = [FAST, &["--snapshot-count", "100"]].concat();
        let mut c = Cluster::start(test_flavor(), 3, &flags)
            .await
            .expect("start cluster");
        let leader = c.leader(Duration::from_secs(10)).await.expect("leader");
        let follower = (leader + 1) % 3;
        c.members[follower].stop();
        let live: Vec<usize> = (0..3).filter(|&i| i != follower).collect();
        let mut cl = c.client_of(&live).await.expect("connect");
        let pad = "x".repeat(value_size);
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let (mut cl, pad) = (cl.clone(), pad.clone());
                tokio::spawn(async move {
                    for j in (w..SNAP_KEYS).step_by(8) {
                        cl.put(format!("snap/{j:05}"), format!("v{j}{pad}"), None)
                            .await
                            .expect("put");
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.expect("writer");
        }
        c.restart_member(follower, READY)
            .await
            .expect("restart follower");
        if value_size == 0 {
            let want = read_prefix(&mut cl, "snap/", false).await.expect("read");
            assert_eq!(want.1.len(), SNAP_KEYS);
            wait_caught_up(&c, follower, "snap/", &want, Duration::from_secs(30)).await;
        } else {
            // (the values are too large for one response: the follower's
            // count at the same revision, then the store's hash there)
            let count_at = async |cl: &mut Client, serializable: bool| {
                let mut o = GetOptions::new().with_prefix().with_count_only();
                if serializable {
                    o = o.with_serializable();
                }
                let r = cl.get("snap/", Some(o)).await.expect("count");
                (r.header().map(|h| h.revision()).unwrap_or(-1), r.count())
            };
            let want = count_at(&mut cl, false).await;
            assert_eq!(want.1, SNAP_KEYS as i64);
            let mut fcl = c.client(follower).await.expect("connect follower");
            let caught_up = retry_until(
                Duration::from_secs(60),
                Duration::from_millis(100),
                async || {
                    if count_at(&mut fcl, true).await == want {
                        Ok(())
                    } else {
                        Err(())
                    }
                },
            )
            .await;
            assert!(caught_up.is_ok(), "follower did not reach {want:?}");
            let hash = async |cl: &mut Client| cl.hash_kv(want.0).await.expect("hash_kv").hash();
            assert_eq!(
                hash(&mut fcl).await,
                hash(&mut cl).await,
                "the follower's store differs"
            );
        }
        if c.flavor == Flavor::Retcd {
            // Prove the catch-up went through the snapshot path, not the log.
            let log = c.members[follower].log();
            let bytes = applied_snapshot_bytes(&log);
            assert!(
                bytes.is_some(),
                "follower caught up without a snapshot; log tail:\n{}",
                c.members[follower].log_tail(4000)
            );
            // (with large values: more than one 8 MiB fragment)
            let fragmented = bytes.is_some_and(|b| b > 8 * 1024 * 1024);
            assert_eq!(fragmented, value_size > 0, "snapshot of {bytes:?} bytes");
        }
        // And it keeps up with new writes.
        cl.put("snapz/last", "last", None).await.expect("put");
        let want = read_prefix(&mut cl, "snapz/", false).await.expect("read");
        wait_caught_up(&c, follower, "snapz/", &want, Duration::from_secs(10)).await;
    })
    .await;
}

/// Three members with heartbeats every 500 ms (an election timeout of
/// 5 s), and its leader: whatever waits for a heartbeat shows.
async fn slow_heartbeat_cluster() -> (Cluster, usize) {
    let mut c = Cluster::start(
        test_flavor(),
        3,
        &["--heartbeat-interval", "500", "--election-timeout", "5000"],
    )
    .await
    .expect("start cluster");
    let leader = c.leader(READY).await.expect("leader");
    (c, leader)
}

/// A lone write reaches the followers well before the next heartbeat.
/// retcd's leader does not send an append for each commit alone (the next
/// append usually carries it); with no next write it sends the commit a
/// moment later, and at once to a follower whose forwarded proposal
/// committed. Heartbeats every 500 ms: a follower that learnt commits only
/// from heartbeats would see each of the 8 writes within 150 ms about
/// once in three, so all 8 in time by chance about once in 15 000 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_apply_a_lone_write_before_the_next_heartbeat() {
    bounded(LIMIT, async {
        let (c, leader) = slow_heartbeat_cluster().await;
        let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
        let mut writer = c.client(leader).await.expect("connect leader");
        let mut readers = Vec::new();
        for f in &followers {
            readers.push(c.client(*f).await.expect("connect follower"));
        }
        let seen_within = async |cl: &mut Client, key: &str, value: &str| {
            let started = std::time::Instant::now();
            loop {
                let r = cl
                    .get(key, Some(GetOptions::new().with_serializable()))
                    .await
                    .expect("serializable get");
                if r.kvs()
                    .first()
                    .is_some_and(|kv| kv.value() == value.as_bytes())
                {
                    return started.elapsed();
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "{key}={value} never reached a follower"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        let mut slow = Vec::new();
        for round in 0..8 {
            // Spread the writes over the heartbeat period.
            tokio::time::sleep(Duration::from_millis(70 * round)).await;
            let (key, value) = (format!("lone/{round}"), format!("v{round}"));
            writer
                .put(key.as_str(), value.as_str(), None)
                .await
                .expect("put");
            for (f, cl) in followers.iter().zip(readers.iter_mut()) {
                let took = seen_within(cl, &key, &value).await;
                if took > Duration::from_millis(150) {
                    slow.push((round, *f, took));
                }
            }
        }
        assert!(
            slow.is_empty(),
            "followers saw writes late (round, member, after): {slow:?}"
        );
        // A write through a follower: answered, and the other follower has
        // it promptly too.
        for round in 0..4 {
            let (key, value) = (format!("forwarded/{round}"), format!("f{round}"));
            let started = std::time::Instant::now();
            readers[0]
                .put(key.as_str(), value.as_str(), None)
                .await
                .expect("put via follower");
            let answered = started.elapsed();
            let took = seen_within(&mut readers[1], &key, &value).await;
            assert!(
                took < Duration::from_millis(150),
                "the other follower saw {key} after {took:?} (answered after {answered:?})"
            );
        }
    })
    .await;
}

/// Linearizable reads that reach a follower while its ReadIndex is in
/// flight go out as soon as it is answered. Until the forty-fourth session
/// they waited for the raft thread's next input: when no other request
/// came, the leader's next heartbeat, up to a heartbeat interval (here
/// 500 ms) later. Measured before the fix with 100 ms heartbeats: 15 of 20
/// bursts of four reads took 58–96 ms, the others about 1 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reads_on_a_follower_does_not_wait_for_a_heartbeat() {
    bounded(LIMIT, async {
        let (c, leader) = slow_heartbeat_cluster().await;
        let follower = (leader + 1) % 3;
        c.client(leader)
            .await
            .expect("connect leader")
            .put("burst", "v", None)
            .await
            .expect("put");
        let reader = c.client(follower).await.expect("connect follower");
        let mut slow = Vec::new();
        for burst in 0..20 {
            let started = std::time::Instant::now();
            let reads: Vec<_> = (0..4)
                .map(|_| {
                    let mut cl = reader.clone();
                    tokio::spawn(async move { cl.get("burst", None).await })
                })
                .collect();
            for r in reads {
                let got = r.await.expect("join").expect("linearizable get");
                assert_eq!(got.kvs().first().map(|kv| kv.value()), Some(&b"v"[..]));
            }
            let took = started.elapsed();
            if took > Duration::from_millis(250) {
                slow.push((burst, took));
            }
            // a quiet moment: nothing else wakes the follower's raft thread
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            slow.is_empty(),
            "bursts that waited (burst, took): {slow:?}"
        );
    })
    .await;
}

/// Waits (bounded) until member `i`, cut off from its peers, reports no
/// leader.
async fn wait_leaderless(c: &Cluster, i: usize) {
    retry_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || match c.status_of(i).await {
            Ok((_, 0)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await
    .expect("the lone member has no leader");
}

/// A write sent while its member has no leader waits for one, as in etcd
/// (etcd's raft node takes no proposal without a leader, so it waits
/// until the request times out), instead of failing at once with "no
/// leader": a follower whose two peers are down is left without a leader;
/// a put is sent to it, then one peer comes back and the put succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_without_a_leader_waits_for_one() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST)
            .await
            .expect("start cluster");
        let leader = c.leader(Duration::from_secs(10)).await.expect("leader");
        let (keep, back) = match leader {
            0 => (1, 2),
            1 => (0, 2),
            _ => (0, 1),
        };
        let mut cl = c.client(keep).await.expect("connect");
        cl.put("nl/before", "v", None).await.expect("put");
        c.members[leader].stop();
        c.members[back].stop();
        // the follower left alone loses its leader (no heartbeats)
        wait_leaderless(&c, keep).await;
        let sent = std::time::Instant::now();
        let put = tokio::spawn({
            let mut cl = cl.clone();
            async move { cl.put("nl/after", "v", None).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.members[back].start();
        let r = put.await.expect("the put's task");
        let waited = sent.elapsed();
        r.unwrap_or_else(|e| panic!("the put sent without a leader failed after {waited:?}: {e}"));
        assert!(
            waited >= Duration::from_millis(100),
            "answered in {waited:?}"
        );
        let got = cl.get("nl/after", None).await.expect("get");
        assert_eq!(got.kvs().len(), 1);
        eprintln!("a put without a leader waited {waited:?} for one");
    })
    .await;
}

/// What a member without a leader does with the calls etcd makes raft
/// proposals of, and with proposals whose callers have gone (etcd's raft
/// node takes no proposal without a leader: the call waits out its
/// context and the entry is never proposed):
/// * a UserList with no deadline of its own (etcd proposes auth reads)
///   fails after the request timeout with Unknown "context deadline
///   exceeded" (retcd answered "request timed out", which clients retry);
/// * a MemberRemove and a put with a 2 s deadline are answered Unknown
///   "context deadline exceeded" at that deadline (or the client's timer
///   goes off first), not before (retcd answered the member removal "raft
///   proposal dropped" at once);
/// * once a leader is back, neither was proposed: the member is still
///   there and the key absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_leader_wait_out_their_deadline_as_etcd() {
    use retcd_api::etcdserverpb::{
        auth_client::AuthClient, cluster_client::ClusterClient, kv_client::KvClient,
        AuthUserListRequest, MemberListRequest, MemberRemoveRequest, PutRequest, RangeRequest,
    };
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST)
            .await
            .expect("start cluster");
        let leader = c.leader(Duration::from_secs(10)).await.expect("leader");
        let keep = (leader + 1) % 3;
        let others: Vec<usize> = (0..3).filter(|&i| i != keep).collect();
        let channel = c.channel(keep).await.expect("connect");
        let mut cluster = ClusterClient::new(channel.clone());
        let members = || MemberListRequest {
            linearizable: false,
        };
        let self_id = c.status_of(keep).await.expect("status").0;
        let victim = cluster
            .member_list(members())
            .await
            .expect("member list")
            .into_inner()
            .members
            .iter()
            .map(|m| m.id)
            .find(|&id| id != self_id)
            .expect("another member");
        for &i in &others {
            c.members[i].pause();
        }
        wait_leaderless(&c, keep).await;

        // FAST: the request timeout is 5 s + two election timeouts of 500 ms
        let sent = std::time::Instant::now();
        let r = AuthClient::new(channel.clone())
            .user_list(AuthUserListRequest {})
            .await;
        let waited = sent.elapsed();
        let status = r.expect_err("a user list without a leader");
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::Unknown, "context deadline exceeded"),
            "user list after {waited:?}"
        );
        assert!(waited >= Duration::from_secs(5), "answered in {waited:?}");

        let deadline = Duration::from_secs(2);
        let mut remove = tonic::Request::new(MemberRemoveRequest { id: victim });
        remove.set_timeout(deadline);
        let mut put = tonic::Request::new(PutRequest {
            key: b"nl/gone".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        });
        put.set_timeout(deadline);
        let sent = std::time::Instant::now();
        let mut kv = KvClient::new(channel.clone());
        let (removed, wrote) = tokio::join!(cluster.member_remove(remove), kv.put(put));
        let waited = sent.elapsed();
        for (what, status) in [
            ("member remove", removed.expect_err("member remove")),
            ("put", wrote.expect_err("put")),
        ] {
            // the server's answer at the deadline, or the client's own
            // timer (tonic's) that went off first
            let got = (status.code(), status.message());
            assert!(
                got == (tonic::Code::Unknown, "context deadline exceeded")
                    || got == (tonic::Code::Cancelled, "Timeout expired"),
                "{what} after {waited:?}: {got:?}"
            );
        }
        assert!(
            waited >= deadline - Duration::from_millis(50),
            "answered in {waited:?}"
        );

        // a leader again well within the request timeout of both calls
        for &i in &others {
            c.members[i].resume();
        }
        c.leader(Duration::from_secs(10))
            .await
            .expect("a leader again");
        let listed = cluster
            .member_list(MemberListRequest { linearizable: true })
            .await
            .expect("member list")
            .into_inner();
        assert!(
            listed.members.iter().any(|m| m.id == victim),
            "the member whose removal timed out was removed: {:?}",
            listed.members
        );
        let got = kv
            .range(RangeRequest {
                key: b"nl/gone".to_vec(),
                ..Default::default()
            })
            .await
            .expect("get")
            .into_inner();
        assert!(got.kvs.is_empty(), "the put that timed out was applied");
    })
    .await;
}

/// A write whose leader stops answering times out with one of etcd's
/// timeout texts (`parseProposeCtxErr`): a put sent to a follower just as
/// its leader is paused is lost with the leader's messages; after the
/// request timeout it fails Unavailable "etcdserver: request timed out",
/// "…, possibly due to previous leader failure" (a new leader was elected
/// within two election timeouts after it was sent) or "…, possibly due to
/// connection lost", never "no leader" (what retcd answered before). The
/// same put alone without a leader until its deadline is Unknown "context
/// deadline exceeded" (`cluster_maint_random_differential`'s coda).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_leader_stops_times_out_as_etcd() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST)
            .await
            .expect("start cluster");
        let leader = c.leader(Duration::from_secs(10)).await.expect("leader");
        let follower = (leader + 1) % 3;
        // a raw client: no timeout of its own
        use retcd_api::etcdserverpb::{kv_client::KvClient, PutRequest};
        let mut kv = KvClient::new(c.channel(follower).await.expect("connect"));
        let put = |key: &str| PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        };
        kv.put(put("lt/before")).await.expect("put");
        c.members[leader].pause();
        let sent = std::time::Instant::now();
        let r = kv.put(put("lt/after")).await;
        let waited = sent.elapsed();
        c.members[leader].resume();
        let Err(status) = r else {
            // a new leader took the forwarded put in time: nothing to see
            eprintln!("the put went through in {waited:?}");
            return;
        };
        let (code, msg) = (status.code(), status.message().to_string());
        assert_eq!(code, tonic::Code::Unavailable, "{msg} after {waited:?}");
        assert!(
            [
                "etcdserver: request timed out",
                "etcdserver: request timed out, possibly due to previous leader failure",
                "etcdserver: request timed out, possibly due to connection lost",
            ]
            .contains(&msg.as_str()),
            "{msg:?} after {waited:?}"
        );
        // FAST: 5 s + two election timeouts of 500 ms
        assert!(waited >= Duration::from_secs(5), "answered in {waited:?}");
        eprintln!("a put whose leader stopped: {msg:?} after {waited:?}");
    })
    .await;
}
