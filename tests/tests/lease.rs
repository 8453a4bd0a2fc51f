//! Leases through the wire: etcdctl `lease …` and `put --lease`
//! differentially against a real etcd, bad input compared code for code,
//! expiry timing with and without keepalives (1 and 3 members, through a
//! follower, across a leader kill), revoke, and leases across a restart.
//! Runs against the selected flavour (`RETCD_TEST_FLAVOR=etcd` for the
//! real-etcd control).

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Client, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions};
use retcd_tests::normalize::normalize_output;
use retcd_tests::{bounded, grpc_error, retry_until, test_flavor, Cluster, Flavor, Output};
use retcd_tests::{limit::NORMAL as LIMIT, FAST, READY};
use tokio::time::{sleep, Instant};

/// Lease IDs the scripts choose (hex as etcdctl prints them: 1000, 2000).
const L1: i64 = 0x1000;
const L2: i64 = 0x2000;

/// Server-assigned lease IDs differ between servers; remaining TTLs may
/// differ by a second. Replaces each 16-hex-digit token with `<IDn>` (in
/// order of appearance) and the number in `remaining(Ns)` / a
/// TimeToLive JSON's `"TTL":N` with `R`.
fn normalize_lease(s: &str) -> String {
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let hex = b[i..].iter().take_while(|c| c.is_ascii_hexdigit()).count();
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if hex == 16 && boundary {
            let tok = &s[i..i + 16];
            let n = ids.len();
            let n = *ids.entry(tok.to_string()).or_insert(n);
            out.push_str(&format!("<ID{n}>"));
            i += 16;
            continue;
        }
        let rest = &s[i..];
        let prefix = ["remaining(", "\"TTL\":"]
            .into_iter()
            .find(|p| rest.starts_with(p) && (p.starts_with('r') || s.contains("grantedTTL")));
        if let Some(p) = prefix {
            out.push_str(p);
            let digits = rest[p.len()..]
                .bytes()
                .take_while(|c| c.is_ascii_digit() || *c == b'-')
                .count();
            out.push('R');
            i += p.len() + digits;
            continue;
        }
        let ch = rest.chars().next().expect("in bounds");
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// etcd lists a lease's keys in Go map order: sort them (text and JSON).
fn sort_keys(s: &str) -> String {
    let mut out = s.to_string();
    for (open, close, sep) in [("attached keys([", "])", " "), ("\"keys\":[", "]", ",")] {
        if let Some(a) = out.find(open) {
            let from = a + open.len();
            if let Some(len) = out[from..].find(close) {
                let mut items: Vec<&str> = out[from..from + len].split(sep).collect();
                items.sort();
                let joined = items.join(sep);
                out = format!("{}{}{}", &out[..from], joined, &out[from + len..]);
            }
        }
    }
    out
}

fn show(o: &Output) -> String {
    format!(
        "  exit code: {}\n  stdout: {:?}\n  stderr: {:?}",
        o.code, o.stdout, o.stderr
    )
}

/// Grants L1 and L2 (TTL 1000) with client-chosen IDs, so both servers
/// use the same IDs.
async fn setup(c: &Cluster) {
    let mut cl = c.client(0).await.expect("connect");
    for id in [L1, L2] {
        cl.lease_grant(1000, Some(LeaseGrantOptions::new().with_id(id)))
            .await
            .expect("grant");
    }
}

/// etcdctl's lease commands and `put --lease`, normalised, equal on a real
/// etcd and on the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_etcdctl_differential() {
    bounded(LIMIT, async {
        let reference = Cluster::start(Flavor::Etcd, 1, FAST)
            .await
            .expect("start etcd");
        let target = Cluster::start(test_flavor(), 1, FAST)
            .await
            .expect("start target");
        setup(&reference).await;
        setup(&target).await;
        // (args, must succeed on etcd)
        let steps: Vec<(Vec<&str>, bool)> = vec![
            (vec!["lease", "grant", "100"], true),
            (vec!["lease", "grant", "9000000001"], false),
            (vec!["put", "k1", "v1", "--lease=1000"], true),
            (vec!["put", "k2", "v2", "--lease=1000"], true),
            (vec!["put", "k3", "v3", "--lease=2000"], true),
            (vec!["put", "k4", "v4"], true),
            (vec!["put", "k5", "v5", "--lease=9999"], false),
            (vec!["lease", "timetolive", "1000"], true),
            (vec!["lease", "timetolive", "1000", "--keys"], true),
            (
                vec!["lease", "timetolive", "1000", "--keys", "-w", "json"],
                true,
            ),
            (vec!["lease", "timetolive", "abcd"], true),
            (vec!["lease", "timetolive", "abcd", "-w", "json"], true),
            (vec!["lease", "list"], true),
            // after the list: this lease lives the minimum TTL (1 s with
            // FAST), and a list after a slow step would race its expiry
            (vec!["lease", "grant", "0"], true),
            (vec!["lease", "keep-alive", "--once", "1000"], true),
            (vec!["lease", "keep-alive", "--once", "abcd"], false),
            (vec!["lease", "revoke", "1000", "-w", "json"], true),
            (vec!["get", "k", "--prefix", "-w", "json"], true),
            (vec!["lease", "revoke", "1000"], false),
            (vec!["lease", "timetolive", "1000"], true),
            (vec!["put", "k3", "v3b", "--ignore-lease"], true),
            (vec!["lease", "timetolive", "2000", "--keys"], true),
            (vec!["put", "k3", "v3c"], true),
            (vec!["lease", "timetolive", "2000", "--keys"], true),
            (vec!["put", "k6", "v6", "--lease=2000"], true),
            (vec!["del", "k6"], true),
            (vec!["lease", "timetolive", "2000", "--keys"], true),
            (vec!["put", "k7", "v7", "--lease=2000"], true),
            (vec!["lease", "revoke", "2000"], true),
            (vec!["get", "k", "--prefix", "-w", "json"], true),
        ];
        let mut failures = Vec::new();
        for (n, (args, must)) in steps.iter().enumerate() {
            let (r, t) =
                tokio::task::block_in_place(|| (reference.etcdctl(args), target.etcdctl(args)));
            assert_eq!(
                r.success(),
                *must,
                "script bug at step {n} {args:?}:\n{}",
                show(&r)
            );
            let norm = |o: &Output| {
                let o = normalize_output(o);
                Output {
                    stdout: sort_keys(&normalize_lease(&o.stdout)),
                    stderr: normalize_lease(&o.stderr),
                    code: o.code,
                }
            };
            let (rn, tn) = (norm(&r), norm(&t));
            if rn != tn {
                failures.push(format!(
                    "step {n}: etcdctl {}\n reference:\n{}\n target:\n{}",
                    args.join(" "),
                    show(&rn),
                    show(&tn)
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} steps differ:\n\n{}",
            failures.len(),
            failures.join("\n\n")
        );
    })
    .await;
}

type R = Result<String, (String, String)>;

fn res<T>(r: Result<T, etcd_client::Error>, f: impl Fn(&T) -> String) -> R {
    match r {
        Ok(v) => Ok(f(&v)),
        Err(e) => Err(grpc_error(&e)
            .map(|(c, m)| (format!("{c:?}"), m))
            .unwrap_or_else(|| ("not a gRPC status".into(), e.to_string()))),
    }
}

/// Bad input and edge cases through etcd-client: codes, messages, TTLs.
async fn bad_input_script(c: &mut Client) -> Vec<(&'static str, R)> {
    let grant = |r: &etcd_client::LeaseGrantResponse| format!("ttl={}", r.ttl());
    let mut out = vec![
        (
            "grant id in use",
            res(
                c.lease_grant(50, Some(LeaseGrantOptions::new().with_id(L1)))
                    .await,
                grant,
            ),
        ),
        (
            "grant ttl too large",
            res(c.lease_grant(9_000_000_001, None).await, grant),
        ),
        (
            "grant max ttl",
            res(
                c.lease_grant(9_000_000_000, Some(LeaseGrantOptions::new().with_id(0x77)))
                    .await,
                grant,
            ),
        ),
        (
            "grant ttl 0",
            res(
                c.lease_grant(0, Some(LeaseGrantOptions::new().with_id(0x78)))
                    .await,
                grant,
            ),
        ),
        (
            "grant ttl -5",
            res(
                c.lease_grant(-5, Some(LeaseGrantOptions::new().with_id(0x79)))
                    .await,
                grant,
            ),
        ),
        (
            "revoke unknown",
            res(c.lease_revoke(0x5555).await, |_| "ok".into()),
        ),
        ("revoke 0", res(c.lease_revoke(0).await, |_| "ok".into())),
        (
            "put unknown lease",
            res(
                c.put("bad", "v", Some(PutOptions::new().with_lease(0x5555)))
                    .await,
                |_| "ok".into(),
            ),
        ),
        (
            "ttl unknown",
            res(c.lease_time_to_live(0x5555, None).await, |r| {
                format!(
                    "id={:x} ttl={} granted={}",
                    r.id(),
                    r.ttl(),
                    r.granted_ttl()
                )
            }),
        ),
    ];
    // Keepalive of an unknown lease answers TTL 0 (etcd-client turns that
    // into "lease not found"); other leases' keepalives go on.
    let bad = c.lease_keep_alive(0x5555).await.map(|_| ());
    out.push((
        "keepalive unknown",
        Err(("client".into(), format!("{:?}", bad.err()))),
    ));
    let (mut good_k, mut good_s) = c.lease_keep_alive(L1).await.expect("keepalive stream");
    for _ in 0..2 {
        good_k.keep_alive().await.expect("send");
        let r = good_s.message().await;
        out.push((
            "keepalive good",
            res(r, |m| {
                format!("{:?}", m.as_ref().map(|m| (m.id(), m.ttl())))
            }),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_bad_input_differential() {
    bounded(LIMIT, async {
        let reference = Cluster::start(Flavor::Etcd, 1, FAST)
            .await
            .expect("start etcd");
        let target = Cluster::start(test_flavor(), 1, FAST)
            .await
            .expect("start target");
        setup(&reference).await;
        setup(&target).await;
        let want = bad_input_script(&mut reference.client(0).await.unwrap()).await;
        let got = bad_input_script(&mut target.client(0).await.unwrap()).await;
        assert_eq!(
            want[0].1,
            Err((
                "FailedPrecondition".into(),
                "etcdserver: lease already exists".into()
            ))
        );
        assert_eq!(
            want[1].1,
            Err((
                "OutOfRange".into(),
                "etcdserver: too large lease TTL".into()
            ))
        );
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w, g, "etcd vs {}", target.flavor.name());
        }
    })
    .await;
}

async fn key_exists(c: &mut Client, key: &str) -> bool {
    c.get(key, None).await.expect("get").count() == 1
}

/// Keeps `id` alive through `c` every `every` for `dur`, checking that
/// `key` (attached to `id`) is there every time. Returns the time of the
/// last acknowledged keepalive.
async fn keep_alive_for(
    c: &mut Client,
    id: i64,
    key: &str,
    every: Duration,
    dur: Duration,
) -> Instant {
    let (mut k, mut s) = c.lease_keep_alive(id).await.expect("keepalive stream");
    let end = Instant::now() + dur;
    let mut last = Instant::now();
    while Instant::now() < end {
        k.keep_alive().await.expect("send keepalive");
        let m = s
            .message()
            .await
            .expect("keepalive answer")
            .expect("stream open");
        assert!(
            m.ttl() > 0,
            "lease {id:x} lost while keepalives flowed (TTL {})",
            m.ttl()
        );
        last = Instant::now();
        assert!(
            key_exists(c, key).await,
            "{key} vanished while keepalives flowed"
        );
        sleep(every).await;
    }
    last
}

/// After the last keepalive at `last`, `key` is still there just before
/// `ttl` and gone by `ttl` + `slack`.
async fn expect_expiry(c: &mut Client, key: &str, last: Instant, ttl: Duration, slack: Duration) {
    let early = last + ttl - Duration::from_millis(300);
    sleep(early.saturating_duration_since(Instant::now())).await;
    assert!(key_exists(c, key).await, "{key} vanished before its TTL");
    let until_deadline = (last + ttl + slack).saturating_duration_since(Instant::now());
    retry_until(until_deadline, Duration::from_millis(100), async || {
        (!key_exists(c, key).await).then_some(()).ok_or(())
    })
    .await
    .unwrap_or_else(|()| panic!("{key} still there {slack:?} after its TTL"));
}

/// 1 member: keepalives hold a 3 s lease for 6 s; once they stop, the key
/// vanishes within TTL + 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_with_keepalive() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.unwrap();
        let id = cl.lease_grant(3, None).await.unwrap().id();
        cl.put("ka/k", "v", Some(PutOptions::new().with_lease(id)))
            .await
            .unwrap();
        let last = keep_alive_for(
            &mut cl,
            id,
            "ka/k",
            Duration::from_millis(1000),
            Duration::from_secs(6),
        )
        .await;
        expect_expiry(
            &mut cl,
            "ka/k",
            last,
            Duration::from_secs(3),
            Duration::from_secs(1),
        )
        .await;
        let r = cl.lease_time_to_live(id, None).await.unwrap();
        assert_eq!(r.ttl(), -1, "an expired lease is gone");
    })
    .await;
}

/// 3 members: keepalives through a follower hold the lease across a
/// leader kill; after they stop, the key vanishes within TTL + 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keepalive_through_follower_across_leader_kill() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let leader = c.leader(READY).await.unwrap();
        let follower = (leader + 1) % 3;
        let mut cl = c.client(follower).await.unwrap();
        let id = cl.lease_grant(4, None).await.unwrap().id();
        cl.put("fk/k", "v", Some(PutOptions::new().with_lease(id)))
            .await
            .unwrap();
        let ttl = cl
            .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await
            .unwrap();
        assert_eq!(
            (ttl.granted_ttl(), ttl.keys()),
            (4, &[b"fk/k".to_vec()][..])
        );
        assert!(
            (3..=4).contains(&ttl.ttl()),
            "remaining {} (forwarded to the leader)",
            ttl.ttl()
        );
        keep_alive_for(
            &mut cl,
            id,
            "fk/k",
            Duration::from_millis(700),
            Duration::from_secs(3),
        )
        .await;
        c.members[leader].kill();
        // Keepalives go on through the same follower during the election.
        keep_alive_for(
            &mut cl,
            id,
            "fk/k",
            Duration::from_millis(700),
            Duration::from_secs(6),
        )
        .await;
        let new_leader = c.leader(READY).await.unwrap();
        assert_ne!(new_leader, leader);
        let last = keep_alive_for(
            &mut cl,
            id,
            "fk/k",
            Duration::from_millis(700),
            Duration::from_secs(2),
        )
        .await;
        expect_expiry(
            &mut cl,
            "fk/k",
            last,
            Duration::from_secs(4),
            Duration::from_secs(1),
        )
        .await;
    })
    .await;
}

/// Revoke deletes every attached key in one revision and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoke_deletes_attached_keys() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let mut cl = c.client(1).await.unwrap();
        let id = cl.lease_grant(100, None).await.unwrap().id();
        for k in ["rv/a", "rv/b", "rv/c"] {
            cl.put(k, "v", Some(PutOptions::new().with_lease(id)))
                .await
                .unwrap();
        }
        cl.put("rv/other", "v", None).await.unwrap();
        let before = cl
            .get("rv/other", None)
            .await
            .unwrap()
            .header()
            .unwrap()
            .revision();
        let r = cl.lease_revoke(id).await.unwrap();
        assert_eq!(
            r.header().unwrap().revision(),
            before + 1,
            "one revision for all keys"
        );
        for i in 0..3 {
            let mut m = c.client(i).await.unwrap();
            let got = m
                .get("rv/", Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .unwrap();
            let keys: Vec<_> = got.kvs().iter().map(|kv| kv.key().to_vec()).collect();
            assert_eq!(keys, vec![b"rv/other".to_vec()], "member {i}");
        }
        let ls = cl.leases().await.unwrap();
        assert!(ls.leases().iter().all(|l| l.id() != id));
    })
    .await;
}

/// Leases and their keys survive a restart of every member; a lease
/// nobody renews still expires afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_survives_restart() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let mut cl = c.client(0).await.unwrap();
        let long = cl.lease_grant(600, None).await.unwrap().id();
        let short = cl.lease_grant(5, None).await.unwrap().id();
        cl.put("rs/long", "v", Some(PutOptions::new().with_lease(long)))
            .await
            .unwrap();
        cl.put("rs/short", "v", Some(PutOptions::new().with_lease(short)))
            .await
            .unwrap();
        drop(cl);
        c.members[0].kill();
        c.restart_member(0, READY).await.unwrap();
        let mut cl = c.client(0).await.unwrap();
        let r = cl
            .lease_time_to_live(long, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await
            .unwrap();
        assert_eq!(
            (r.granted_ttl(), r.keys()),
            (600, &[b"rs/long".to_vec()][..])
        );
        let mut ids: Vec<i64> = cl
            .leases()
            .await
            .unwrap()
            .leases()
            .iter()
            .map(|l| l.id())
            .collect();
        ids.sort();
        let mut want = vec![long, short];
        want.sort();
        assert_eq!(ids, want);
        let (mut k, mut s) = cl.lease_keep_alive(long).await.unwrap();
        k.keep_alive().await.unwrap();
        assert_eq!(s.message().await.unwrap().unwrap().ttl(), 600);
        // The short lease restarted from its full TTL and expires.
        retry_until(
            Duration::from_secs(15),
            Duration::from_millis(200),
            async || {
                (!key_exists(&mut cl, "rs/short").await)
                    .then_some(())
                    .ok_or(())
            },
        )
        .await
        .expect("rs/short never expired after the restart");
        assert!(key_exists(&mut cl, "rs/long").await);
    })
    .await;
}

/// `--experimental-enable-lease-checkpoint`: the leader checkpoints
/// remaining TTLs, so a new leader resumes from them instead of the full
/// TTL. retcd only: the checkpoint interval (5 min in etcd) is not a flag
/// of etcd 3.4; retcd's hidden `--experimental-lease-checkpoint-interval`
/// makes the test fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_checkpoint_survives_leader_change() {
    if test_flavor() == Flavor::Etcd {
        return;
    }
    bounded(LIMIT, async {
        let mut flags = FAST.to_vec();
        flags.extend([
            "--experimental-enable-lease-checkpoint",
            "--experimental-lease-checkpoint-interval=1s",
        ]);
        let mut c = Cluster::start(test_flavor(), 3, &flags)
            .await
            .expect("start");
        let leader = c.leader(READY).await.unwrap();
        let follower = (leader + 1) % 3;
        let mut cl = c.client(follower).await.unwrap();
        let id = cl.lease_grant(30, None).await.unwrap().id();
        sleep(Duration::from_secs(5)).await;
        c.members[leader].kill();
        let new_leader = c.leader(READY).await.unwrap();
        assert_ne!(new_leader, leader);
        let r = retry_until(Duration::from_secs(10), Duration::from_millis(100), || {
            let mut cl = cl.clone();
            async move { cl.lease_time_to_live(id, None).await }
        })
        .await
        .expect("timetolive after failover");
        assert_eq!(r.granted_ttl(), 30);
        assert!(
            r.ttl() <= 28,
            "remaining {} after a leader change: the checkpoint was not used",
            r.ttl()
        );
    })
    .await;
}

/// A leader that was paused and replaced must not answer a keepalive that
/// the new leader never sees (etcd's `ensureLeadership`, added in 3.4.25 /
/// 3.5.8; the robustness lease check caught retcd answering one). Right
/// after SIGCONT the old leader may still believe it leads: a keepalive
/// sent to it must either fail or renew the lease on the new leader.
/// (Debian's etcd 3.4.23 predates the fix.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keepalive_on_a_replaced_leader_reaches_the_new_one() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let old = c.leader(READY).await.unwrap();
        let other = (old + 1) % 3;
        let (old_id, _) = c.status_of(old).await.unwrap();
        let mut old_client = c.client(old).await.unwrap();
        let mut cl = c.client(other).await.unwrap();
        let id = cl.lease_grant(8, None).await.unwrap().id();
        // connect the keepalive stream to the old leader before it stops
        let (mut keeper, mut stream) = old_client.lease_keep_alive(id).await.unwrap();
        keeper.keep_alive().await.unwrap();
        assert!(stream.message().await.unwrap().unwrap().ttl() > 0);
        c.members[old].pause();
        retry_until(Duration::from_secs(30), Duration::from_millis(50), async || {
            let (_, leader) = c.status_of(other).await.unwrap_or((0, 0));
            (leader != 0 && leader != old_id).then_some(()).ok_or(())
        })
        .await
        .expect("no new leader while the old one is paused");
        // let the lease run down on the new leader (8 s + its promotion
        // extension of one election timeout)
        tokio::time::sleep(Duration::from_secs(4)).await;
        c.members[old].resume();
        keeper.keep_alive().await.unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(15), stream.message()).await;
        let renewed = matches!(&answered, Ok(Ok(Some(r))) if r.ttl() > 0);
        let remaining = cl
            .lease_time_to_live(id, None)
            .await
            .expect("time to live on the new leader")
            .ttl();
        eprintln!("keepalive on the resumed old leader: {answered:?}; remaining on the new leader {remaining} s");
        if renewed {
            assert!(
                remaining >= 7,
                "the old leader acknowledged a keepalive but the new leader's lease has {remaining} s left: renewed on a stale lessor"
            );
        }
    })
    .await;
}

/// `etcd_debugging_lease_renewed_total` summed over the members (the
/// leader counts each renew it makes).
fn renewed_total(c: &Cluster) -> f64 {
    c.members
        .iter()
        .map(|m| {
            let r = retcd_tests::http_get(m.client_port, "/metrics", Duration::from_secs(5))
                .expect("GET /metrics");
            r.body
                .lines()
                .find_map(|l| l.strip_prefix("etcd_debugging_lease_renewed_total "))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum()
}

/// Waits (30 s at most) until member `i` names a leader (`named`) or none.
async fn names_leader(c: &Cluster, i: usize, named: bool) -> Result<(), ()> {
    retry_until(
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            let (_, leader) = c.status_of(i).await.map_err(|_| ())?;
            ((leader != 0) == named).then_some(()).ok_or(())
        },
    )
    .await
}

/// A keepalive whose client went away while its member had no leader
/// must not renew the lease later, once a leader is back: etcd cancels
/// the renew with the stream's context. (retcd's stream task kept
/// retrying it for the request timeout and renewed on the next leader, so
/// a lease lived seconds past its last keepalive the client knew of: the
/// five-member partition scenario's late expiry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keepalive_abandoned_without_a_leader_renews_nothing() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let l = c.leader(READY).await.unwrap();
        let (f, other) = ((l + 1) % 3, (l + 2) % 3);
        let mut cl = c.client(f).await.unwrap();
        let id = cl.lease_grant(60, None).await.unwrap().id();
        // a renew through f works and is counted: the metric is there
        let before = renewed_total(&c);
        let (mut keeper, mut stream) = cl.lease_keep_alive(id).await.unwrap();
        keeper.keep_alive().await.unwrap();
        assert!(stream.message().await.unwrap().unwrap().ttl() > 0);
        drop((keeper, stream));
        let counted = renewed_total(&c);
        assert!(
            counted >= before + 1.0,
            "a renew was not counted: {before} -> {counted}"
        );
        // the stream is opened while there is a leader (clients ask
        // for one to open it), then f loses its leader: the other two stop
        let mut kc = c.client(f).await.unwrap();
        let (mut keeper, mut stream) = kc.lease_keep_alive(id).await.unwrap();
        // (it renews now too, as in the first block: counted before the pause)
        keeper.keep_alive().await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), stream.message()).await;
        assert!(
            matches!(&first, Ok(Ok(Some(m))) if m.ttl() > 0),
            "the stream's first keepalive: {first:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let counted = renewed_total(&c);
        c.members[l].pause();
        c.members[other].pause();
        names_leader(&c, f, false)
            .await
            .expect("f still names a leader with the other two paused");
        // a keepalive f cannot answer yet: the client gives up on it
        let sent = keeper.keep_alive().await;
        let r = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
        assert!(
            !matches!(&r, Ok(Ok(Some(m))) if m.ttl() > 0),
            "a keepalive renewed with no leader: {sent:?} {r:?}"
        );
        eprintln!("keepalive without a leader: sent {sent:?}, answer {r:?}");
        drop((keeper, stream, kc));
        tokio::time::sleep(Duration::from_millis(300)).await;
        c.members[l].resume();
        c.members[other].resume();
        names_leader(&c, f, true)
            .await
            .expect("no leader after the two resumed");
        // a forwarded renew would land as soon as f knows the leader
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = renewed_total(&c);
        assert_eq!(
            after, counted,
            "the abandoned keepalive renewed the lease once a leader was back"
        );
    })
    .await;
}

/// What a client of a keepalive stream sees of its response headers: none
/// while it has sent nothing; its first request brings them with the
/// answer; a stream closed before any request ends with no message and
/// status OK.
async fn keepalive_headers(flavor: Flavor) -> Vec<String> {
    use retcd_api::etcdserverpb::{
        lease_client::LeaseClient, LeaseGrantRequest, LeaseKeepAliveRequest,
    };
    use tokio_stream::wrappers::ReceiverStream;
    let c = Cluster::start(flavor, 1, &[]).await.expect("start");
    let ch = c.channel(0).await.expect("connect");
    let id = LeaseClient::new(ch.clone())
        .lease_grant(LeaseGrantRequest { ttl: 30, id: 0 })
        .await
        .expect("grant")
        .into_inner()
        .id;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut lc = LeaseClient::new(ch.clone());
    let call = tokio::spawn(async move { lc.lease_keep_alive(ReceiverStream::new(rx)).await });
    sleep(Duration::from_millis(700)).await;
    let mut seen = vec![format!(
        "response headers before a request: {}",
        call.is_finished()
    )];
    tx.send(LeaseKeepAliveRequest { id }).await.expect("send");
    let mut stream = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("headers once a request is answered")
        .expect("keepalive task")
        .expect("keepalive")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a first answer")
        .expect("keepalive stream")
        .expect("an answer");
    seen.push(format!(
        "first answer: id ok {}, ttl {}",
        first.id == id,
        first.ttl
    ));
    let (tx, rx) = tokio::sync::mpsc::channel::<LeaseKeepAliveRequest>(1);
    drop(tx);
    let closed = tokio::time::timeout(
        Duration::from_secs(10),
        LeaseClient::new(ch).lease_keep_alive(ReceiverStream::new(rx)),
    )
    .await
    .expect("an answer to a closed stream");
    let end = match closed {
        Ok(s) => {
            let mut s = s.into_inner();
            match tokio::time::timeout(Duration::from_secs(10), s.message()).await {
                Ok(Ok(m)) => format!("a message: {}", m.is_some()),
                Ok(Err(st)) => format!("status {:?}", st.code()),
                Err(_) => "no end".to_string(),
            }
        }
        Err(st) => format!("call refused: {:?}", st.code()),
    };
    seen.push(format!("closed before a request: {end}"));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_headers_wait_for_a_first_answer_as_etcd() {
    bounded(LIMIT, async {
        let want = keepalive_headers(Flavor::Etcd).await;
        assert_eq!(
            want,
            [
                "response headers before a request: false",
                "first answer: id ok true, ttl 30",
                "closed before a request: a message: false",
            ],
            "etcd"
        );
        let got = keepalive_headers(Flavor::Retcd).await;
        assert_eq!(got, want);
    })
    .await;
}
