//! Attacks on the peer port of a 3-member cluster with peer TLS
//! (`--peer-cert-file/--peer-key-file/--peer-trusted-ca-file/
//! --peer-client-cert-auth`, one certificate per member, made with
//! openssl). Each attacker must fail to step raft or to read hashes, and
//! the cluster must keep serving: writes before and after succeed, the
//! leader and its term do not change, no member ever sees a forged term,
//! every member holds every key and HashKV is equal on all of them.
//!
//! The attackers:
//! * (a) a TLS client without a client certificate;
//! * (b) a client with a certificate of another CA (same names as a member);
//! * (c) a client with a valid member certificate and wrong raft stream
//!   metadata: another cluster ID, no cluster ID, no or a non-hex sender,
//!   no or a wrong receiver, a sender that is no member (or the receiver
//!   itself); and other peer RPCs naming another cluster;
//! * (d) a removed member (MemberRemove of a follower), with its own
//!   certificate and ID;
//! * (e) a valid member identity on a valid stream sending forged raft
//!   messages: a heartbeat, an append and a snapshot claiming a much
//!   higher term from *another* member (the heartbeat also in fragments),
//!   a message for another member, a batch claiming another sender, a
//!   proposal or ReadIndex request with a term (raft sends none; a
//!   follower would stop on passing it on), a proposal from no member —
//!   to a follower and to the leader. A proposal another member made,
//!   passed on by the stream's sender (as raft forwards proposals, also
//!   through a deposed leader), is accepted and committed: the follower
//!   passes it on to the leader in turn; so is a ReadIndex request.
//!
//! Every refusal is asserted to have really happened: the call fails with
//! the specific error text, and the attacked member's log gains the line
//! of that refusal ("refused a raft stream" with the error, "rejected
//! connection" for a TLS refusal, the step check's warning for a forged
//! message). A stream with correct metadata and an HashKV call with a
//! member certificate succeed (the positive controls), so each refusal is
//! due to the one thing that was changed.
//!
//! On retcd the peer port is gRPC (`retcdpb.RaftPeer`), attacked with
//! tonic over rustls. `RETCD_TEST_FLAVOR=etcd` runs the same cluster and
//! attackers on etcd 3.5.1 (the test's reference), whose peer port is
//! rafthttp over HTTP: the stream checks are `GET
//! /raft/stream/message/<from>` with etcd's headers (curl), answered with
//! etcd's statuses and texts (`notes/authz.md` §8: 412 `cluster ID
//! mismatch` / `to field mismatch`, 404 `invalid from` / `error sender not
//! found`, 410 `removed member`). Not run on etcd, by etcd's documented
//! rules: a stream that passes the checks (etcd would then *write* the
//! member's messages to the attacker, taking over that peer's stream), the
//! forged messages of (e) (etcd 3.5.1's pipeline steps any message of a
//! client that passed TLS: no sender binding, and a `To` mismatch is
//! accepted with 204 before 3.5.14, §8), and HashKV naming another cluster
//! (3.5.1 ignores the cluster ID on `/members/hashkv`, §9).
//!
//! Not asserted, printed: whether the removed member's certificate (still
//! valid under the CA) can read HashKV. Neither etcd nor retcd checks
//! membership on the peer port's HashKV (§9); TLS is its only gate (§8).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use protobuf::Message as _;
use raft::eraftpb::{Entry, Message, MessageType};
use retcd_api::etcdserverpb::{
    HashKvRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, MemberPromoteRequest, PutRequest,
};
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::{internal_raft_request, InternalRaftRequest, MembersRequest, RaftBatch};
use retcd_tests::cluster::connect;
use retcd_tests::limit::LONG as LIMIT;
use retcd_tests::tls::{curl, curl_tls, log_count, log_line, Eku, Pki, TlsNodes};
use retcd_tests::{bounded, retry_until, test_flavor, Flavor};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Heartbeat 100 ms, election timeout 3 s: no spontaneous election on a
/// loaded 2-core machine, so a changed leader or term means an attack
/// had an effect.
const TIMING: &[&str] = &["--heartbeat-interval", "100", "--election-timeout", "3000"];

/// How much higher than the cluster's term the forged messages claim.
const FORGED_TERM_JUMP: u64 = 1000;

/// The certificates: CA `ca` with one certificate per member (`m0`..`m2`,
/// CN and name `mI`, SAN 127.0.0.1, server and client auth), and CA `ca2`
/// with `outsider` (CN `m1`, the same SAN: a look-alike of another CA).
fn pki() -> Pki {
    let pki = Pki::new();
    pki.ca("ca");
    pki.ca("ca2");
    for i in 0..3 {
        let m = format!("m{i}");
        pki.leaf(&m, "ca", &m, "IP:127.0.0.1", Eku::Both);
    }
    pki.leaf("outsider", "ca2", "m1", "IP:127.0.0.1", Eku::Both);
    pki
}

fn hex(id: u64) -> String {
    format!("{id:x}")
}

/// What the cluster looked like before the attacks.
struct Baseline {
    leader: u64,
    term: u64,
}

/// The cluster under attack.
struct Fixture {
    flavor: Flavor,
    pki: Arc<Pki>,
    nodes: TlsNodes,
    cluster_id: u64,
    /// Member ID by index (`m0`..`m2`).
    ids: Vec<u64>,
    /// Indices of the members that still belong to the cluster.
    live: Vec<usize>,
    written: BTreeMap<String, String>,
}

impl Fixture {
    async fn start(flavor: Flavor) -> Fixture {
        let pki = pki();
        let mut nodes = TlsNodes::spawn(flavor, 3, "http", "https", |i| {
            let mut f: Vec<String> = [
                "--peer-cert-file",
                &pki.p(&format!("m{i}.crt")),
                "--peer-key-file",
                &pki.p(&format!("m{i}.key")),
                "--peer-trusted-ca-file",
                &pki.p("ca.crt"),
                "--peer-client-cert-auth",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            f.extend(TIMING.iter().map(|s| s.to_string()));
            f
        });
        nodes.wait_all_healthy(&[], Duration::from_secs(60));
        let mut c = connect(&nodes.client_urls()).await.expect("connect");
        let list = c.member_list().await.expect("member list");
        let cluster_id = list.header().expect("header").cluster_id();
        let by_name: BTreeMap<String, u64> = list
            .members()
            .iter()
            .map(|m| (m.name().to_string(), m.id()))
            .collect();
        let ids = (0..3).map(|i| by_name[&format!("m{i}")]).collect();
        Fixture {
            flavor,
            pki: Arc::new(pki),
            nodes,
            cluster_id,
            ids,
            live: vec![0, 1, 2],
            written: BTreeMap::new(),
        }
    }

    fn log(&self, i: usize) -> String {
        self.nodes.nodes[i].log_text()
    }

    /// `(member_id, leader, raft_term)` from member `i`'s Status.
    async fn status(&self, i: usize) -> (u64, u64, u64) {
        let mut c = connect(&[self.nodes.nodes[i].client_url.clone()])
            .await
            .expect("connect");
        let st = c.status().await.expect("status");
        let id = st.header().map(|h| h.member_id()).unwrap_or(0);
        (id, st.leader(), st.raft_term())
    }

    /// The leader and term every live member agrees on.
    async fn agreed(&self) -> Baseline {
        let mut seen = Vec::new();
        for &i in &self.live {
            seen.push(self.status(i).await);
        }
        let (_, leader, term) = seen[0];
        assert!(
            leader != 0 && seen.iter().all(|s| s.1 == leader && s.2 == term),
            "members disagree on leader/term: {seen:?}"
        );
        Baseline { leader, term }
    }

    fn index_of(&self, id: u64) -> usize {
        self.ids.iter().position(|&x| x == id).expect("a member id")
    }

    /// MemberRemove through member `via` (not the removed one: it may stop
    /// before it answers), retried while the cluster answers "unhealthy
    /// cluster" (the strict reconfiguration check wants every peer
    /// connected for 5 s).
    async fn remove_member(&self, via: usize, id: u64) {
        let url = self.nodes.nodes[via].client_url.clone();
        let mut c = connect(&[url]).await.expect("connect");
        let r = retry_until(
            Duration::from_secs(30),
            Duration::from_millis(300),
            async || match c.member_remove(id).await {
                Err(e) if e.to_string().contains("unhealthy cluster") => Err(e),
                r => Ok(r),
            },
        )
        .await;
        r.and_then(|r| r).expect("MemberRemove");
    }

    /// The client URLs of the members that still belong to the cluster.
    fn live_urls(&self) -> Vec<String> {
        let urls = self
            .live
            .iter()
            .map(|&i| self.nodes.nodes[i].client_url.clone());
        urls.collect()
    }

    async fn write(&mut self, prefix: &str, n: usize) {
        let mut c = connect(&self.live_urls()).await.expect("connect");
        for k in 0..n {
            let (key, val) = (format!("{prefix}/{k}"), format!("v-{prefix}-{k}"));
            c.put(key.clone(), val.clone(), None)
                .await
                .unwrap_or_else(|e| panic!("put {key}: {e}"));
            self.written.insert(key, val);
        }
    }

    /// Every live member holds every written key (serializable reads,
    /// retried until replicated), and HashKV at the newest revision is
    /// the same on all of them.
    async fn check_data(&self) {
        let mut c = connect(&self.live_urls()).await.expect("connect");
        let rev = c
            .get("probe", None)
            .await
            .expect("get")
            .header()
            .unwrap()
            .revision();
        let mut hashes = Vec::new();
        for &i in &self.live {
            let url = self.nodes.nodes[i].client_url.clone();
            let mut ci = connect(&[url]).await.expect("connect");
            let got = retry_until(
                Duration::from_secs(10),
                Duration::from_millis(100),
                async || {
                    let opts = etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_serializable();
                    let r = ci.get("", Some(opts)).await.map_err(|e| e.to_string())?;
                    let kvs: BTreeMap<String, String> = r
                        .kvs()
                        .iter()
                        .map(|kv| {
                            let k = kv.key_str().unwrap_or_default().to_string();
                            (k, kv.value_str().unwrap_or_default().to_string())
                        })
                        .collect();
                    if kvs == self.written {
                        Ok(kvs)
                    } else {
                        Err(format!("m{i} holds {kvs:?}"))
                    }
                },
            )
            .await;
            got.unwrap_or_else(|e| panic!("data not intact: {e}"));
            let h = retry_until(
                Duration::from_secs(10),
                Duration::from_millis(100),
                async || ci.hash_kv(rev).await.map_err(|e| e.to_string()),
            )
            .await
            .unwrap_or_else(|e| panic!("HashKV({rev}) on m{i}: {e}"));
            hashes.push((i, h.hash()));
        }
        assert!(
            hashes.iter().all(|h| h.1 == hashes[0].1),
            "HashKV at revision {rev} differs: {hashes:?}"
        );
        eprintln!(
            "data intact on {:?}; HashKV({rev}) = {:?}",
            self.live, hashes
        );
    }

    /// The leader and term did not move, and no member ever took a forged
    /// term.
    async fn check_leadership(&self, before: &Baseline) {
        let now = self.agreed().await;
        assert_eq!(
            (now.leader, now.term),
            (before.leader, before.term),
            "leader/term changed during the attacks (leader {:x} term {} → leader {:x} term {})",
            before.leader,
            before.term,
            now.leader,
            now.term
        );
        for &i in &self.live {
            let (_, _, term) = self.status(i).await;
            assert!(
                term < before.term + FORGED_TERM_JUMP,
                "m{i} took a forged term {term}"
            );
        }
    }
}

/// What a refusal must look like: the error the attacker sees and the
/// words of the log line the attacked member writes.
struct Refusal<'a> {
    answer: &'a str,
    log: Vec<&'a str>,
}

/// Runs one attack against member `target`, expecting `want`: asserts the
/// attacker's answer holds `want.answer` and that the target's log gained
/// one more line with `want.log`.
async fn expect_refusal<F>(fx: &Fixture, target: usize, what: &str, want: &Refusal<'_>, attack: F)
where
    F: AsyncFnOnce() -> Result<String, String>,
{
    let before = log_count(&fx.log(target), &want.log);
    let got = attack().await;
    let answer = match got {
        Ok(ok) => panic!(
            "{what} against m{target}: expected a refusal with {:?}, but it succeeded: {ok}",
            want.answer
        ),
        Err(e) => e,
    };
    assert!(
        answer.contains(want.answer),
        "{what} against m{target}: expected {:?}, got {answer:?}",
        want.answer
    );
    // The log line may follow the answer by a moment.
    let logged = retry_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || {
            let n = log_count(&fx.log(target), &want.log);
            if n > before {
                Ok(n)
            } else {
                Err(n)
            }
        },
    )
    .await;
    assert!(
        logged.is_ok(),
        "{what} against m{target}: refused ({answer:?}) but m{target}'s log has no new line with {:?}",
        want.log
    );
    let log = fx.log(target);
    let line = log_line(&log, &want.log).unwrap_or_default();
    let line: String = line.chars().take(300).collect();
    eprintln!("{what} → m{target}: refused: {answer}\n    m{target} logged: {line}");
}

// ---------------------------------------------------------------- retcd

/// A gRPC channel to a peer URL over TLS trusting `ca` and presenting the
/// certificate `id` (none: no client certificate).
async fn channel(pki: &Pki, addr: &str, id: Option<&str>) -> Result<Channel, String> {
    let read = |f: &str| std::fs::read(pki.path(f)).expect("read a certificate file");
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("ca.crt")));
    if let Some(id) = id {
        tls = tls.identity(Identity::from_pem(
            read(&format!("{id}.crt")),
            read(&format!("{id}.key")),
        ));
    }
    let ep = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5));
    ep.connect().await.map_err(|e| format!("connect: {e:?}"))
}

fn status_text(s: tonic::Status) -> String {
    format!(
        "{:?}: {} {:?}",
        s.code(),
        s.message(),
        std::error::Error::source(&s)
    )
}

/// Stream metadata: `(header, value)`; a missing header is left out.
type Meta = Vec<(&'static str, String)>;

fn meta(cluster: Option<String>, from: Option<String>, to: Option<String>) -> Meta {
    let mut m = Vec::new();
    for (k, v) in [
        ("x-etcd-cluster-id", cluster),
        ("x-server-from", from),
        ("x-raft-to", to),
    ] {
        if let Some(v) = v {
            m.push((k, v));
        }
    }
    m
}

/// `RaftPeer/Stream` with `md` and `batches`; `Ok` when the server
/// answered `RaftAck`.
async fn raft_stream(
    pki: &Pki,
    addr: &str,
    id: Option<&str>,
    md: &Meta,
    batches: Vec<RaftBatch>,
) -> Result<String, String> {
    let ch = channel(pki, addr, id).await?;
    let mut req = tonic::Request::new(tokio_stream::iter(batches));
    for (k, v) in md {
        req.metadata_mut()
            .insert(*k, v.parse().expect("ascii metadata"));
    }
    match RaftPeerClient::new(ch).stream(req).await {
        Ok(_) => Ok("RaftAck".into()),
        Err(s) => Err(status_text(s)),
    }
}

/// `RaftPeer/HashKV`, naming `cluster` (none: no header).
async fn peer_hash_kv(
    pki: &Pki,
    addr: &str,
    id: Option<&str>,
    cluster: Option<String>,
) -> Result<String, String> {
    let ch = channel(pki, addr, id).await?;
    let mut req = tonic::Request::new(HashKvRequest { revision: 0 });
    if let Some(c) = cluster {
        req.metadata_mut()
            .insert("x-etcd-cluster-id", c.parse().unwrap());
    }
    match RaftPeerClient::new(ch).hash_kv(req).await {
        Ok(r) => Ok(format!("hash {}", r.into_inner().hash)),
        Err(s) => Err(status_text(s)),
    }
}

/// `RaftPeer/Members` (it checks nothing but TLS).
async fn peer_members(pki: &Pki, addr: &str, id: Option<&str>) -> Result<String, String> {
    let ch = channel(pki, addr, id).await?;
    match RaftPeerClient::new(ch).members(MembersRequest {}).await {
        Ok(r) => Ok(format!("{} members", r.into_inner().members.len())),
        Err(s) => Err(status_text(s)),
    }
}

fn heartbeat(from: u64, to: u64, term: u64) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgHeartbeat);
    (m.from, m.to, m.term) = (from, to, term);
    m.write_to_bytes().expect("encode")
}

/// An append of one entry after index `index`, claiming `term`, with a
/// commit index that would apply it at once.
fn append(from: u64, to: u64, term: u64, index: u64) -> Vec<u8> {
    let mut e = Entry::default();
    (e.term, e.index) = (term, index + 1);
    e.data = b"forged".to_vec().into();
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgAppend);
    (m.from, m.to, m.term, m.log_term, m.index) = (from, to, term, term, index);
    m.commit = index + 1;
    m.entries.push(e);
    m.write_to_bytes().expect("encode")
}

/// A snapshot message claiming `term` and an index past `index`, with a
/// configuration of the receiver alone and no data.
fn snapshot(from: u64, to: u64, term: u64, index: u64) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgSnapshot);
    (m.from, m.to, m.term) = (from, to, term);
    let snap = m.mut_snapshot();
    let meta = snap.mut_metadata();
    (meta.term, meta.index) = (term, index + 1000);
    meta.mut_conf_state().voters = vec![to];
    m.write_to_bytes().expect("encode")
}

/// A proposal (as raft forwards one to the leader: no term) of a put of
/// `key`, made by member `from`.
fn proposal(from: u64, to: u64, term: u64, key: &str, value: &str) -> Vec<u8> {
    let req = InternalRaftRequest {
        // no member waits for it
        id: 0xfeed_0000 ^ key.len() as u64,
        request: Some(internal_raft_request::Request::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let data = prost::Message::encode_to_vec(&req);
    with_entry(MessageType::MsgPropose, (from, to, term), data)
}

/// A ReadIndex request (as raft forwards one: no term) of member `from`,
/// with a context no read waits for.
fn read_index(from: u64, to: u64, term: u64) -> Vec<u8> {
    let data = b"forwarded-read".to_vec();
    with_entry(MessageType::MsgReadIndex, (from, to, term), data)
}

/// A message of type `t` (from, to, term) carrying one entry of `data`.
fn with_entry(t: MessageType, (from, to, term): (u64, u64, u64), data: Vec<u8>) -> Vec<u8> {
    let mut m = Message::default();
    m.set_msg_type(t);
    (m.from, m.to, m.term) = (from, to, term);
    m.entries.push(Entry {
        data: data.into(),
        ..Default::default()
    });
    m.write_to_bytes().expect("encode")
}

/// `data` as a fragmented message: two batches, the last one marked.
fn fragments(from: u64, data: &[u8]) -> Vec<RaftBatch> {
    let (a, b) = data.split_at(data.len() / 2);
    [(a, false), (b, true)]
        .map(|(part, last)| RaftBatch {
            from,
            msgs: vec![],
            fragment: part.to_vec(),
            last_fragment: last,
        })
        .to_vec()
}

fn batch(from: u64, msgs: Vec<Vec<u8>>) -> Vec<RaftBatch> {
    vec![RaftBatch {
        from,
        msgs,
        ..Default::default()
    }]
}

const STEP_REFUSED: &[&str] = &["raft message not from its stream's sender"];

async fn retcd_attacks(fx: &mut Fixture) {
    let base = fx.agreed().await;
    let leader = fx.index_of(base.leader);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (target, other) = (followers[0], followers[1]);
    let (tid, oid, lid) = (fx.ids[target], fx.ids[other], fx.ids[leader]);
    // The attacker's valid member certificate is the leader's: it claims
    // to be the leader (a member the target knows).
    let me = format!("m{leader}");
    let addr = fx.nodes.nodes[target].peer_addr();
    let cid = hex(fx.cluster_id);
    let forged = base.term + FORGED_TERM_JUMP;
    let good = meta(Some(cid.clone()), Some(hex(lid)), Some(hex(tid)));
    let pki = &*fx.pki.clone();

    // Positive controls: a member certificate reaches every RPC; a stream
    // with correct metadata (and no message) is accepted.
    let ok = peer_members(pki, &addr, Some(&me)).await;
    assert!(ok.is_ok(), "Members with a member certificate: {ok:?}");
    let ok = peer_hash_kv(pki, &addr, Some(&me), Some(cid.clone())).await;
    assert!(ok.is_ok(), "HashKV with a member certificate: {ok:?}");
    let ok = raft_stream(pki, &addr, Some(&me), &good, batch(lid, vec![])).await;
    assert!(ok.is_ok(), "a stream with correct metadata: {ok:?}");

    // (a) no client certificate, (b) a certificate of another CA: refused
    // at TLS, for every RPC.
    for (what, id, reason) in [
        ("(a) no client certificate", None, "no certificates"),
        (
            "(b) certificate of another CA",
            Some("outsider"),
            "UnknownIssuer",
        ),
    ] {
        let want = Refusal {
            answer: "",
            log: vec!["rejected connection", reason],
        };
        let hb = batch(lid, vec![heartbeat(lid, tid, forged)]);
        expect_refusal(fx, target, &format!("{what}: Stream"), &want, async || {
            raft_stream(pki, &addr, id, &good, hb).await
        })
        .await;
        expect_refusal(fx, target, &format!("{what}: HashKV"), &want, async || {
            peer_hash_kv(pki, &addr, id, Some(cid.clone())).await
        })
        .await;
        expect_refusal(fx, target, &format!("{what}: Members"), &want, async || {
            peer_members(pki, &addr, id).await
        })
        .await;
    }

    // (c) a member certificate, wrong stream metadata. Each stream carries
    // a heartbeat with a forged term from the sender it claims.
    let other_cluster = hex(fx.cluster_id ^ 0x5a5a);
    let stranger = 0x1234_5678_9abc_def0_u64;
    let cases: Vec<(&str, Meta, u64, &'static str)> = vec![
        (
            "another cluster ID",
            meta(Some(other_cluster.clone()), Some(hex(lid)), Some(hex(tid))),
            lid,
            "cluster ID mismatch",
        ),
        (
            "no cluster ID",
            meta(None, Some(hex(lid)), Some(hex(tid))),
            lid,
            "cluster ID mismatch",
        ),
        (
            "no sender",
            meta(Some(cid.clone()), None, Some(hex(tid))),
            lid,
            "invalid from",
        ),
        (
            "a sender that is not hex",
            meta(Some(cid.clone()), Some("not-hex".into()), Some(hex(tid))),
            lid,
            "invalid from",
        ),
        (
            "no receiver",
            meta(Some(cid.clone()), Some(hex(lid)), None),
            lid,
            "to field mismatch",
        ),
        (
            "another receiver",
            meta(Some(cid.clone()), Some(hex(lid)), Some(hex(oid))),
            lid,
            "to field mismatch",
        ),
        (
            "a sender that is no member",
            meta(Some(cid.clone()), Some(hex(stranger)), Some(hex(tid))),
            stranger,
            "error sender not found",
        ),
        (
            "the receiver as sender",
            meta(Some(cid.clone()), Some(hex(tid)), Some(hex(tid))),
            tid,
            "error sender not found",
        ),
    ];
    for (what, md, from, answer) in cases {
        let want = Refusal {
            answer,
            log: vec!["refused a raft stream", answer],
        };
        let b = batch(from, vec![heartbeat(from, tid, forged)]);
        expect_refusal(fx, target, &format!("(c) {what}"), &want, async || {
            raft_stream(pki, &addr, Some(&me), &md, b).await
        })
        .await;
    }
    // The other peer RPCs refuse another cluster too (logged by nobody:
    // the answer is the proof).
    let want = "cluster ID mismatch";
    let r = peer_hash_kv(pki, &addr, Some(&me), Some(other_cluster.clone())).await;
    assert!(
        r.as_ref().is_err_and(|e| e.contains(want)),
        "(c) HashKV naming another cluster: {r:?}"
    );
    let ch = channel(pki, &addr, Some(&me)).await.expect("channel");
    let mut pc = RaftPeerClient::new(ch);
    let with_cluster = |body| {
        let mut r = tonic::Request::new(body);
        r.metadata_mut()
            .insert("x-etcd-cluster-id", other_cluster.parse().unwrap());
        r
    };
    let r1 = pc
        .lease_renew(with_cluster(LeaseKeepAliveRequest { id: 1 }))
        .await
        .map(|_| ());
    let mut r = tonic::Request::new(LeaseTimeToLiveRequest { id: 1, keys: false });
    r.metadata_mut()
        .insert("x-etcd-cluster-id", other_cluster.parse().unwrap());
    let r2 = pc.lease_time_to_live(r).await.map(|_| ());
    let mut r = tonic::Request::new(MemberPromoteRequest { id: oid });
    r.metadata_mut()
        .insert("x-etcd-cluster-id", other_cluster.parse().unwrap());
    let r3 = pc.member_promote(r).await.map(|_| ());
    for (what, r) in [
        ("LeaseRenew", r1),
        ("LeaseTimeToLive", r2),
        ("MemberPromote", r3),
    ] {
        let r = r.map_err(status_text);
        assert!(
            r.as_ref().is_err_and(|e| e.contains(want)),
            "(c) {what} naming another cluster: {r:?}"
        );
    }
    eprintln!(
        "(c) HashKV, LeaseRenew, LeaseTimeToLive, MemberPromote naming another cluster: refused"
    );

    // (e) forged messages on a stream whose metadata is right, to a
    // follower and to the leader.
    let index = {
        let mut c = connect(&[fx.nodes.nodes[leader].client_url.clone()])
            .await
            .expect("connect");
        let st = c.status().await.expect("status");
        st.raft_index()
    };
    for t in [target, leader] {
        let tid = fx.ids[t];
        // the sender the stream claims: a member other than the target
        let s = if t == leader { target } else { leader };
        let (sid, third) = (fx.ids[s], fx.ids[3 - t - s]);
        let id = format!("m{s}");
        let addr = fx.nodes.nodes[t].peer_addr();
        let md = meta(Some(cid.clone()), Some(hex(sid)), Some(hex(tid)));
        let step = Refusal {
            answer: "to field mismatch",
            log: STEP_REFUSED.to_vec(),
        };
        let cases = [
            (
                "heartbeat from another member",
                batch(sid, vec![heartbeat(third, tid, forged)]),
            ),
            (
                "append from another member",
                batch(sid, vec![append(third, tid, forged, index)]),
            ),
            (
                "heartbeat for another member",
                batch(sid, vec![heartbeat(sid, third, forged)]),
            ),
            (
                "snapshot from another member",
                batch(sid, vec![snapshot(third, tid, forged, index)]),
            ),
            (
                "heartbeat from another member, in fragments",
                fragments(sid, &heartbeat(third, tid, forged)),
            ),
            // proposals travel without a term (a follower passing one on
            // with a term would stop its raft), and only from members
            (
                "proposal with the current term",
                batch(sid, vec![proposal(sid, tid, base.term, "refused/a", "x")]),
            ),
            (
                "proposal from another member with a term",
                batch(sid, vec![proposal(third, tid, forged, "refused/b", "x")]),
            ),
            (
                "proposal from no member",
                batch(sid, vec![proposal(stranger, tid, 0, "refused/c", "x")]),
            ),
            (
                "ReadIndex request with the current term",
                batch(sid, vec![read_index(third, tid, base.term)]),
            ),
        ];
        for (what, b) in cases {
            expect_refusal(fx, t, &format!("(e) {what}"), &step, async || {
                raft_stream(pki, &addr, Some(&id), &md, b).await
            })
            .await;
        }
        // A proposal another member made, passed on by the stream's
        // sender (raft forwards proposals to the leader under the member
        // that made them, also through a leader deposed with some
        // queued): accepted, and committed (`check_data` finds the key on
        // every member). The follower passes it on once more, to the
        // leader, over its own stream.
        let key = format!("passed-on/to-m{t}");
        let value = format!("made by {third:x}, passed on by {sid:x}");
        let r = raft_stream(
            pki,
            &addr,
            Some(&id),
            &md,
            batch(sid, vec![proposal(third, tid, 0, &key, &value)]),
        )
        .await;
        assert_eq!(
            r.as_deref(),
            Ok("RaftAck"),
            "(e) a proposal of another member passed on → m{t}"
        );
        eprintln!("(e) a proposal of another member passed on → m{t}: accepted ({key})");
        fx.written.insert(key, value);
        // so is its ReadIndex request (the leader answers that member)
        let r = raft_stream(
            pki,
            &addr,
            Some(&id),
            &md,
            batch(sid, vec![read_index(third, tid, 0)]),
        )
        .await;
        assert_eq!(
            r.as_deref(),
            Ok("RaftAck"),
            "(e) a ReadIndex request of another member passed on → m{t}"
        );
        // a batch that names another sender than the stream's (refused
        // with no log line: the answer is the proof)
        let r = raft_stream(
            pki,
            &addr,
            Some(&id),
            &md,
            batch(third, vec![heartbeat(third, tid, forged)]),
        )
        .await;
        assert!(
            r.as_ref().is_err_and(|e| e.contains("invalid from")),
            "(e) a batch from another sender → m{t}: {r:?}"
        );
        eprintln!(
            "(e) a batch from another sender → m{t}: refused: {}",
            r.unwrap_err()
        );
    }
    fx.check_leadership(&base).await;

    // (d) a removed member: remove the other follower, then attack with
    // its certificate and ID.
    fx.remove_member(leader, oid).await;
    fx.live.retain(|&i| i != other);
    let exited = fx.nodes.exit_within(other, Duration::from_secs(30));
    eprintln!(
        "(d) removed m{other} ({:x}); its process exited: {exited:?}",
        oid
    );
    let removed = "the member has been permanently removed from the cluster";
    let rid = format!("m{other}");
    for t in [target, leader] {
        let addr = fx.nodes.nodes[t].peer_addr();
        let md = meta(Some(cid.clone()), Some(hex(oid)), Some(hex(fx.ids[t])));
        let want = Refusal {
            answer: removed,
            log: vec!["refused a raft stream", removed],
        };
        let b = batch(oid, vec![heartbeat(oid, fx.ids[t], forged)]);
        expect_refusal(fx, t, "(d) a removed member's stream", &want, async || {
            raft_stream(pki, &addr, Some(&rid), &md, b).await
        })
        .await;
        let h = peer_hash_kv(pki, &addr, Some(&rid), Some(cid.clone())).await;
        eprintln!(
            "(d) observation: HashKV with the removed member's certificate → m{t}: {h:?} \
             (not asserted: the peer port's HashKV checks TLS and the cluster ID only, as etcd's)"
        );
    }
    let after_removal = fx.agreed().await;
    assert_eq!(
        after_removal.leader, base.leader,
        "removing a follower moved the leader"
    );
}

// ---------------------------------------------------------------- etcd

/// etcd's rafthttp stream request (HTTP/1.1, as etcd's own: HTTP/2 on
/// etcd's peer port goes to its gRPC server), `GET /raft/stream/message/<from>`
/// with etcd's headers (`cluster`, `to`: none leaves the header out),
/// through curl with the certificate `id` (2 s at most: an accepted
/// stream stays open): `Ok` on 200, else what curl saw.
fn etcd_stream(
    pki: &Pki,
    addr: &str,
    id: Option<&str>,
    from: &str,
    cluster: Option<&str>,
    to: Option<&str>,
) -> Result<String, String> {
    let mut args = curl_tls(pki, Some("ca"), id);
    let mut h = vec![
        "X-Server-Version: 3.5.1".to_string(),
        "X-Min-Cluster-Version: 3.5.0".to_string(),
        format!("X-Server-From: {from}"),
    ];
    if let Some(c) = cluster {
        h.push(format!("X-Etcd-Cluster-ID: {c}"));
    }
    if let Some(t) = to {
        h.push(format!("X-Raft-To: {t}"));
    }
    for x in h {
        args.extend(["-H".to_string(), x]);
    }
    args.extend([
        "--http1.1".into(),
        "--max-time".into(),
        "2".into(),
        format!("https://{addr}/raft/stream/message/{from}"),
    ]);
    let r = curl(&args);
    if r.status == "200" {
        Ok(r.to_string())
    } else {
        Err(r.to_string())
    }
}

/// `GET <path>` on the peer port through curl with the certificate `id`
/// (`/members/hashkv` with etcd's JSON body `{}`, notes §9).
fn etcd_get(pki: &Pki, addr: &str, id: Option<&str>, path: &str) -> Result<String, String> {
    let mut args = curl_tls(pki, Some("ca"), id);
    args.push("--http1.1".into());
    if path == "/members/hashkv" {
        for a in [
            "-X",
            "GET",
            "-H",
            "Content-Type: application/json",
            "-d",
            "{}",
        ] {
            args.push(a.into());
        }
    }
    args.push(format!("https://{addr}{path}"));
    let r = curl(&args);
    if r.ok() {
        Ok(r.to_string())
    } else {
        Err(r.to_string())
    }
}

async fn etcd_attacks(fx: &mut Fixture) {
    let base = fx.agreed().await;
    let leader = fx.index_of(base.leader);
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let (target, other) = (followers[0], followers[1]);
    let (tid, oid, lid) = (fx.ids[target], fx.ids[other], fx.ids[leader]);
    let me = format!("m{leader}");
    let addr = fx.nodes.nodes[target].peer_addr();
    let cid = hex(fx.cluster_id);
    let pki = &*fx.pki.clone();

    // Positive control: a member certificate reads /members.
    let ok = etcd_get(pki, &addr, Some(&me), "/members");
    assert!(ok.is_ok(), "/members with a member certificate: {ok:?}");

    // (a), (b): refused at TLS.
    for (what, id, reason) in [
        (
            "(a) no client certificate",
            None,
            "didn't provide a certificate",
        ),
        (
            "(b) certificate of another CA",
            Some("outsider"),
            "unknown authority",
        ),
    ] {
        let want = Refusal {
            answer: "",
            log: vec!["rejected connection", reason],
        };
        for path in ["/members", "/members/hashkv"] {
            expect_refusal(fx, target, &format!("{what}: {path}"), &want, async || {
                etcd_get(pki, &addr, id, path)
            })
            .await;
        }
        expect_refusal(fx, target, &format!("{what}: stream"), &want, async || {
            etcd_stream(pki, &addr, id, &hex(lid), Some(&cid), Some(&hex(tid)))
        })
        .await;
    }

    // (c): etcd answers with a status and text; its log has no line for
    // these, so the answer (written by the server) is the proof.
    let other_cluster = hex(fx.cluster_id ^ 0x5a5a);
    let stranger = hex(0x1234_5678_9abc_def0_u64);
    let (l, t, o) = (hex(lid), hex(tid), hex(oid));
    let (oc, c) = (Some(other_cluster.as_str()), Some(cid.as_str()));
    let cases: Vec<(&str, &str, Option<&str>, Option<&str>, &str)> = vec![
        (
            "another cluster ID",
            &l,
            oc,
            Some(&t),
            "HTTP 412: cluster ID mismatch",
        ),
        (
            "no cluster ID",
            &l,
            None,
            Some(&t),
            "HTTP 412: cluster ID mismatch",
        ),
        (
            "a sender that is not hex",
            "not-hex",
            c,
            Some(&t),
            "HTTP 404: invalid from",
        ),
        ("no receiver", &l, c, None, "HTTP 412: to field mismatch"),
        (
            "another receiver",
            &l,
            c,
            Some(&o),
            "HTTP 412: to field mismatch",
        ),
        (
            "a sender that is no member",
            &stranger,
            c,
            Some(&t),
            "HTTP 404: error sender not found",
        ),
        (
            "the receiver as sender",
            &t,
            c,
            Some(&t),
            "HTTP 404: error sender not found",
        ),
    ];
    for (what, from, cluster, to, want) in cases {
        let r = etcd_stream(pki, &addr, Some(&me), from, cluster, to);
        assert!(
            r.as_ref().is_err_and(|e| e.contains(want)),
            "(c) {what} against m{target}: expected {want:?}, got {r:?}"
        );
        eprintln!("(c) {what} → m{target}: refused: {}", r.unwrap_err());
    }
    fx.check_leadership(&base).await;

    // (d)
    fx.remove_member(leader, oid).await;
    fx.live.retain(|&i| i != other);
    let exited = fx.nodes.exit_within(other, Duration::from_secs(30));
    eprintln!("(d) removed m{other} ({o}); its process exited: {exited:?}");
    let rid = format!("m{other}");
    for t in [target, leader] {
        let addr = fx.nodes.nodes[t].peer_addr();
        let to = hex(fx.ids[t]);
        // etcd learns of the removal when it applies it: retry briefly
        let r = retry_until(
            Duration::from_secs(5),
            Duration::from_millis(100),
            async || match etcd_stream(pki, &addr, Some(&rid), &o, Some(&cid), Some(&to)) {
                Err(e) if e.contains("HTTP 410") => Ok(e),
                other => Err(other),
            },
        )
        .await;
        let r = r.unwrap_or_else(|e| panic!("(d) removed member's stream → m{t}: {e:?}"));
        assert!(r.contains("removed member"), "(d) → m{t}: {r}");
        eprintln!("(d) a removed member's stream → m{t}: refused: {r}");
        let h = etcd_get(pki, &addr, Some(&rid), "/members/hashkv");
        eprintln!(
            "(d) observation: /members/hashkv with the removed member's certificate → m{t}: {h:?}"
        );
    }
    let after_removal = fx.agreed().await;
    assert_eq!(
        after_removal.leader, base.leader,
        "removing a follower moved the leader"
    );
}

/// A keepalive sent to a follower reaches the leader over the TLS peer
/// link (the forwarding connection's own TCP + TLS connector).
async fn forwarded_keepalive(fx: &Fixture, leader: u64) {
    let l = fx.ids.iter().position(|&id| id == leader).expect("leader");
    let f = (l + 1) % 3;
    let url = |i: usize| fx.nodes.nodes[i].client_url.clone();
    let mut lc = connect(&[url(l)]).await.expect("connect to the leader");
    let lease = lc.lease_grant(30, None).await.expect("grant").id();
    let mut fc = connect(&[url(f)]).await.expect("connect to a follower");
    let (mut k, mut s) = fc.lease_keep_alive(lease).await.expect("keepalive stream");
    k.keep_alive().await.expect("keepalive");
    let a = s.message().await.expect("keepalive answer");
    assert_eq!(
        a.map(|a| a.ttl()),
        Some(30),
        "a keepalive through follower m{f}, forwarded to the leader m{l}"
    );
    lc.lease_revoke(lease).await.expect("revoke");
    eprintln!("keepalive through m{f} forwarded to the leader m{l} over TLS: renewed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_port_attackers_are_refused_and_the_cluster_keeps_serving() {
    bounded(LIMIT, async {
        let flavor = test_flavor();
        let mut fx = Fixture::start(flavor).await;
        fx.write("before", 5).await;
        let base = fx.agreed().await;
        eprintln!(
            "{}: cluster {:x}, members {:x?}, leader {:x}, term {}",
            flavor.name(),
            fx.cluster_id,
            fx.ids,
            base.leader,
            base.term
        );
        forwarded_keepalive(&fx, base.leader).await;
        match fx.flavor {
            Flavor::Retcd => retcd_attacks(&mut fx).await,
            Flavor::Etcd => etcd_attacks(&mut fx).await,
        }
        fx.write("after", 5).await;
        let now = fx.agreed().await;
        assert_eq!(now.leader, base.leader, "the leader changed");
        fx.check_data().await;
    })
    .await
}
