//! What tools need from the server beyond the KV API: `etcdctl endpoint
//! status/health`, `etcdctl member list`, the HTTP `/health` and `/version`
//! endpoints on the client port, the gRPC health service, `ETCD_*`
//! environment configuration, `--version`, member/cluster ID derivation and
//! graceful shutdown on SIGTERM.
//!
//! Flavour-generic (`RETCD_TEST_FLAVOR=etcd` runs the same assertions
//! against real etcd 3.4); where the answer legitimately depends on the
//! flavour (the reported version) the expectation is chosen per flavour.
//! The differential tests start real etcd and the selected flavour in the
//! same test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use etcd_client::GetOptions;
use retcd_launch::{initial_cluster, MemberFlags, Process};
use retcd_tests::cluster::{connect, loopback_url as url};
use retcd_tests::free_port;
use retcd_tests::{
    bounded, etcdctl, etcdctl35, http_get, retry_until, test_flavor, Cluster, Flavor, Output,
};
use retcd_tests::{limit::SHORT as LIMIT, FAST, READY};
use serde_json::Value;

fn show(o: &Output) -> String {
    format!(
        "exit code {}\n  stdout: {:?}\n  stderr: {:?}",
        o.code, o.stdout, o.stderr
    )
}

/// The version prefix each flavour reports (`Status.version`, `/version`).
fn version_prefix(f: Flavor) -> &'static str {
    match f {
        Flavor::Etcd => "3.4",
        Flavor::Retcd => "3.5",
    }
}

fn json_of(o: &Output, what: &str) -> Value {
    assert!(o.success(), "{what} failed: {}", show(o));
    serde_json::from_str(o.stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: stdout is not JSON ({e}): {}", show(o)))
}

fn u64_field(v: &Value, key: &str) -> u64 {
    v.get(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no unsigned integer field {key:?} in {v}"))
}

/// Every key path of a JSON document (`a.b`, arrays as `a[]`).
fn field_paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, val) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                field_paths(val, &p, out);
            }
        }
        Value::Array(a) => {
            for val in a {
                field_paths(val, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

fn paths(v: &Value) -> BTreeSet<String> {
    let mut s = BTreeSet::new();
    field_paths(v, "", &mut s);
    s
}

/// `etcdctl member list -w json` on `endpoints`: `(cluster_id, members)`.
fn member_list_json(endpoints: &[String]) -> (u64, Vec<Value>, Value) {
    let o = etcdctl(endpoints, &["member", "list", "-w", "json"]);
    let v = json_of(&o, "member list -w json");
    let cid = u64_field(&v["header"], "cluster_id");
    let members = v["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members array: {v}"))
        .clone();
    (cid, members, v)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// 1. etcdctl endpoint status -w json
// ---------------------------------------------------------------------------

/// Checks `endpoint status -w json` over every member of `c`.
fn check_endpoint_status(c: &Cluster) {
    let n = c.members.len();
    // etcdctl 3.4 dials `endpoint status` with an `:authority` of
    // `http://host:port`; retcd repairs it (crates/server/src/authority_fix.rs).
    let o = c.etcdctl(&["endpoint", "status", "-w", "json"]);
    let v = json_of(&o, "endpoint status -w json");
    let arr = v
        .as_array()
        .unwrap_or_else(|| panic!("endpoint status -w json is not an array: {v}"));
    assert_eq!(arr.len(), n, "one entry per endpoint: {v}");

    let (_, members, ml) = member_list_json(&c.endpoints());
    // client URL -> member ID, from member list.
    let by_url: BTreeMap<String, u64> = members
        .iter()
        .flat_map(|m| {
            let id = u64_field(m, "ID");
            strings(&m["clientURLs"]).into_iter().map(move |u| (u, id))
        })
        .collect();
    let ids: BTreeSet<u64> = members.iter().map(|m| u64_field(m, "ID")).collect();
    assert_eq!(ids.len(), n, "member list: {ml}");

    let mut leaders = BTreeSet::new();
    let mut self_leaders = 0;
    let mut seen_ids = BTreeSet::new();
    for e in arr {
        let ep = e["Endpoint"]
            .as_str()
            .unwrap_or_else(|| panic!("no Endpoint in {e}"));
        let st = &e["Status"];
        let header_id = u64_field(&st["header"], "member_id");
        let leader = u64_field(st, "leader");
        let version = st["version"].as_str().unwrap_or_default();
        assert!(
            version.starts_with(version_prefix(c.flavor)),
            "{ep}: version {version:?} should start with {:?}: {e}",
            version_prefix(c.flavor)
        );
        let raft_index = u64_field(st, "raftIndex");
        assert!(raft_index > 0, "{ep}: raftIndex: {e}");
        assert!(u64_field(st, "raftTerm") > 0, "{ep}: raftTerm: {e}");
        assert!(
            u64_field(&st["header"], "raft_term") > 0,
            "{ep}: header.raft_term: {e}"
        );
        assert!(u64_field(st, "dbSize") > 0, "{ep}: dbSize: {e}");
        assert!(
            u64_field(&st["header"], "cluster_id") > 0,
            "{ep}: cluster_id: {e}"
        );
        let applied = u64_field(st, "raftAppliedIndex");
        assert!(
            applied > 0 && applied <= raft_index,
            "{ep}: raftAppliedIndex {applied} should be in 1..=raftIndex {raft_index}: {e}"
        );
        if let Some(l) = st.get("isLearner") {
            assert_eq!(l, &Value::Bool(false), "{ep}: isLearner: {e}");
        }
        assert_eq!(
            by_url.get(ep),
            Some(&header_id),
            "{ep}: header.member_id {header_id} is not the ID member list gives that client URL\n status: {e}\n member list: {ml}"
        );
        assert!(seen_ids.insert(header_id), "duplicate member_id: {v}");
        leaders.insert(leader);
        if leader == header_id {
            self_leaders += 1;
        }
    }
    assert_eq!(leaders.len(), 1, "members disagree on the leader: {v}");
    assert_eq!(self_leaders, 1, "exactly one member must be leader: {v}");
    let leader = *leaders.iter().next().expect("one leader");
    assert!(
        ids.contains(&leader),
        "leader {leader} is not a member: {ml}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_status_json_one_node() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        // One write so raftIndex/dbSize are clearly beyond bootstrap.
        assert!(c.etcdctl(&["put", "k", "v"]).success());
        tokio::task::block_in_place(|| check_endpoint_status(&c));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_status_json_three_nodes() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        assert!(c.etcdctl(&["put", "k", "v"]).success());
        tokio::task::block_in_place(|| check_endpoint_status(&c));
    })
    .await
}

/// The same facts as [`check_endpoint_status`], from the `Maintenance/Status`
/// RPC through etcd-client (independent of how etcdctl dials).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_rpc_three_nodes() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let mut cl = c.client_all().await.expect("client");
        cl.put("k", "v", None).await.expect("put");
        let ml = cl.member_list().await.expect("member list");
        let by_url: BTreeMap<String, u64> = ml
            .members()
            .iter()
            .flat_map(|m| m.client_urls().iter().map(move |u| (u.clone(), m.id())))
            .collect();
        let mut leaders = BTreeSet::new();
        let mut self_leaders = 0;
        for (i, m) in c.members.iter().enumerate() {
            let mut one = c.client(i).await.expect("client");
            let st = one.status().await.expect("status");
            let h = st.header().expect("header");
            let ctx = format!("m{i}: {st:?}");
            assert_eq!(by_url.get(&m.endpoint()), Some(&h.member_id()), "{ctx}");
            assert!(st.version().starts_with(version_prefix(c.flavor)), "{ctx}");
            assert!(
                st.raft_index() > 0 && st.raft_term() > 0 && st.db_size() > 0,
                "{ctx}"
            );
            assert!(h.raft_term() > 0 && h.cluster_id() > 0, "{ctx}");
            assert!(
                st.raft_applied_index() > 0 && st.raft_applied_index() <= st.raft_index(),
                "{ctx}"
            );
            assert!(!st.is_learner(), "{ctx}");
            leaders.insert(st.leader());
            if st.leader() == h.member_id() {
                self_leaders += 1;
            }
        }
        assert_eq!(
            leaders.len(),
            1,
            "members disagree on the leader: {leaders:?}"
        );
        assert_eq!(self_leaders, 1, "exactly one member must be leader");
    })
    .await
}

/// The set of JSON field names etcdctl prints for `endpoint status`,
/// `member list` and `endpoint health` is the same for etcd (the reference)
/// and the selected flavour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_field_sets_match_etcd() {
    bounded(LIMIT, async {
        let reference = Cluster::start(Flavor::Etcd, 1, FAST)
            .await
            .expect("start reference etcd");
        let target = Cluster::start(test_flavor(), 1, FAST)
            .await
            .expect("start target");
        let mut diffs = Vec::new();
        for args in [
            &["endpoint", "status", "-w", "json"][..],
            &["member", "list", "-w", "json"][..],
            &["endpoint", "health", "-w", "json"][..],
            &["get", "nokey", "-w", "json"][..],
        ] {
            // etcdctl 3.5 here (3.4 in check_endpoint_status): both dial well.
            let (r, t) = tokio::task::block_in_place(|| {
                (
                    etcdctl35(&reference.endpoints(), args),
                    etcdctl35(&target.endpoints(), args),
                )
            });
            let rv = json_of(&r, "reference");
            let tv = match serde_json::from_str::<Value>(t.stdout.trim()) {
                Ok(v) if t.success() => v,
                _ => {
                    diffs.push(format!(
                        "etcdctl {}: etcd succeeds, {} does not:\n  etcd: {}\n  {}: {}",
                        args.join(" "),
                        target.flavor.name(),
                        show(&r),
                        target.flavor.name(),
                        show(&t)
                    ));
                    continue;
                }
            };
            let (rp, tp) = (paths(&rv), paths(&tv));
            if rp != tp {
                diffs.push(format!(
                    "etcdctl {}:\n  only in etcd: {:?}\n  only in {}: {:?}\n  etcd: {}\n  {}: {}",
                    args.join(" "),
                    rp.difference(&tp).collect::<Vec<_>>(),
                    target.flavor.name(),
                    tp.difference(&rp).collect::<Vec<_>>(),
                    r.stdout.trim(),
                    target.flavor.name(),
                    t.stdout.trim()
                ));
            }
        }
        assert!(
            diffs.is_empty(),
            "JSON field sets differ:\n{}",
            diffs.join("\n")
        );
    })
    .await
}

// ---------------------------------------------------------------------------
// 2. endpoint health, member list
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_health_all_members() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let o = tokio::task::block_in_place(|| c.etcdctl(&["endpoint", "health"]));
        assert!(o.success(), "endpoint health: {}", show(&o));
        // etcdctl prints health lines on stderr in 3.4, stdout in later versions.
        let all = format!("{}{}", o.stdout, o.stderr);
        for ep in c.endpoints() {
            assert!(
                all.lines()
                    .any(|l| l.starts_with(&format!("{ep} is healthy"))),
                "{ep} not reported healthy: {}",
                show(&o)
            );
        }
        let o = tokio::task::block_in_place(|| c.etcdctl(&["endpoint", "health", "-w", "json"]));
        let v = json_of(&o, "endpoint health -w json");
        let arr = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
        assert_eq!(arr.len(), 3, "{v}");
        for e in arr {
            assert_eq!(e["health"], Value::Bool(true), "{v}");
        }
    })
    .await
}

/// `member list` (simple and JSON), from every member: names, peer URLs and
/// client URLs are the ones the harness passed; nobody is a learner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_reports_flags() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let want: BTreeSet<(String, String, String)> = c
            .members
            .iter()
            .map(|m| (m.name.clone(), m.peer_url(), m.endpoint()))
            .collect();
        for (i, m) in c.members.iter().enumerate() {
            let ep = vec![m.endpoint()];
            // Client URLs of other members are learnt via the cluster; poll.
            let every = Duration::from_millis(200);
            let listed = retry_until(Duration::from_secs(10), every, async || {
                let (cid, members, raw) = tokio::task::block_in_place(|| member_list_json(&ep));
                let got: BTreeSet<(String, String, String)> = members
                    .iter()
                    .map(|m| {
                        (
                            m["name"].as_str().unwrap_or_default().to_string(),
                            strings(&m["peerURLs"]).join(","),
                            strings(&m["clientURLs"]).join(","),
                        )
                    })
                    .collect();
                if got != want {
                    return Err((got, raw));
                }
                for mm in &members {
                    let learner = mm.get("isLearner").cloned().unwrap_or(Value::Bool(false));
                    assert_eq!(learner, Value::Bool(false), "member {i}: {raw}");
                    assert!(u64_field(mm, "ID") > 0, "{raw}");
                }
                Ok((cid, members))
            })
            .await;
            let (cid, got_json) = listed.unwrap_or_else(|(got, raw)| {
                panic!(
                    "member list from m{i} after 10 s:\n got  {got:?}\n want {want:?}\n raw {raw}"
                )
            });
            assert!(cid > 0);
            // Simple format: "ID, started, name, peerURLs, clientURLs, isLearner".
            let o = tokio::task::block_in_place(|| etcdctl(&ep, &["member", "list"]));
            assert!(o.success(), "member list: {}", show(&o));
            let mut lines: Vec<Vec<String>> = o
                .stdout
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.split(", ").map(str::to_string).collect())
                .collect();
            lines.sort();
            let mut expect: Vec<Vec<String>> = got_json
                .iter()
                .map(|mm| {
                    vec![
                        format!("{:x}", u64_field(mm, "ID")),
                        "started".to_string(),
                        mm["name"].as_str().unwrap_or_default().to_string(),
                        strings(&mm["peerURLs"]).join(","),
                        strings(&mm["clientURLs"]).join(","),
                        "false".to_string(),
                    ]
                })
                .collect();
            expect.sort();
            assert_eq!(
                lines,
                expect,
                "member list (simple) from m{i}: {}",
                show(&o)
            );
        }
    })
    .await
}

// ---------------------------------------------------------------------------
// Self-spawned server processes (fixed ports / environment configuration).
// ---------------------------------------------------------------------------

/// A server process this test spawned itself (a
/// [`retcd_launch::Process`]: `Drop` SIGKILLs it by PID and reaps it),
/// started with no `ETCD_*` variable of the test runner's environment.
struct Proc(Process);

impl Proc {
    fn spawn(mut cmd: Command, log: &Path) -> Proc {
        // Whatever the test runner's environment holds, only what the test
        // sets is seen by the server.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(&k);
            }
        }
        Proc(Process::spawn(&mut cmd, log).unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}")))
    }

    fn log_tail(&self) -> String {
        self.0.log_tail(4000)
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.0.try_exit()
    }

    fn kill(&mut self) {
        self.0.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- log tail of {}:\n{}",
                self.0.log_path().display(),
                self.log_tail()
            );
        }
    }
}

/// Polls `member list -w json` on `ep` until it answers with `n` members
/// whose client URLs are all known (bounded by 60 s).
async fn wait_member_list(ep: &str, n: usize, procs: &mut [Proc]) -> (u64, Vec<Value>) {
    let listed = retry_until(READY, Duration::from_millis(200), async || {
        for p in procs.iter_mut() {
            if let Some(st) = p.exited() {
                panic!("server exited early ({st}):\n{}", p.log_tail());
            }
        }
        let eps = vec![ep.to_string()];
        let o = tokio::task::block_in_place(|| etcdctl(&eps, &["member", "list", "-w", "json"]));
        // Readiness via etcd-client's Status (independent of etcdctl's
        // `endpoint status`, which other tests check).
        let leader = match connect(&eps).await {
            Ok(mut cl) => cl.status().await.map(|s| s.leader()).unwrap_or(0),
            Err(_) => 0,
        };
        if o.success() {
            let v: Value = serde_json::from_str(o.stdout.trim()).expect("json");
            let ms = v["members"].as_array().cloned().unwrap_or_default();
            if ms.len() == n
                && leader != 0
                && ms.iter().all(|m| !strings(&m["clientURLs"]).is_empty())
            {
                return Ok((u64_field(&v["header"], "cluster_id"), ms));
            }
        }
        Err((leader, o))
    })
    .await;
    listed.unwrap_or_else(|(leader, o)| {
        panic!(
            "no {n}-member list with a leader (Status.leader = {leader}) from {ep} within 60 s; last member list: {}",
            show(&o)
        )
    })
}

/// Starts a 3-member cluster of `flavor` on the given ports with the given
/// token (fresh data dirs under `dir`); returns `(cluster_id, name -> ID)`
/// and stops it.
async fn ids_of(
    flavor: Flavor,
    ports: &[(u16, u16)],
    token: &str,
    dir: &Path,
) -> (u64, BTreeMap<String, u64>) {
    let initial =
        initial_cluster((ports.iter().enumerate()).map(|(i, (_, p))| (format!("n{i}"), url(*p))));
    let mut procs = Vec::new();
    for (i, (cp, pp)) in ports.iter().enumerate() {
        let (name, data_dir) = (
            format!("n{i}"),
            dir.join(format!("{}-n{i}.etcd", flavor.name())),
        );
        let (curl, purl) = (url(*cp), url(*pp));
        let mut cmd = Command::new(flavor.binary());
        cmd.args(
            MemberFlags {
                name: &name,
                data_dir: &data_dir,
                client_url: &curl,
                peer_url: &purl,
                advertise_peer_url: &purl,
                initial_cluster: &initial,
                token,
                state: "new",
            }
            .args(),
        );
        cmd.args(FAST);
        procs.push(Proc::spawn(
            cmd,
            &dir.join(format!("{}-n{i}.log", flavor.name())),
        ));
    }
    let ep = format!("http://127.0.0.1:{}", ports[0].0);
    let (cid, ms) = wait_member_list(&ep, ports.len(), &mut procs).await;
    let ids = ms
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap_or_default().to_string(),
                u64_field(m, "ID"),
            )
        })
        .collect();
    // Also the member's own header must carry the same cluster ID.
    for p in procs.iter_mut() {
        p.kill();
    }
    (cid, ids)
}

/// etcd derives member IDs from peer URLs + cluster token and the cluster ID
/// from the member IDs; the same `--initial-cluster` and token must give
/// the same IDs on the selected flavour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_and_cluster_ids_match_etcd() {
    bounded(LIMIT, async {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let token = "id-derivation-token";
        let (e_cid, e_ids) = ids_of(Flavor::Etcd, &ports, token, dir.path()).await;
        let (t_cid, t_ids) = ids_of(test_flavor(), &ports, token, dir.path()).await;
        let hex = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, v)| format!("{k}={v:x}"))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            (format!("{e_cid:x}"), hex(&e_ids)),
            (format!("{t_cid:x}"), hex(&t_ids)),
            "cluster ID and member IDs (hex): etcd (left) vs {} (right)",
            test_flavor().name()
        );
    })
    .await
}

// ---------------------------------------------------------------------------
// 3. HTTP /health and /version
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_health_and_version() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let port = c.members[0].client_port;
        let t = Duration::from_secs(5);

        let every = Duration::from_millis(200);
        let h = retry_until(Duration::from_secs(10), every, async || {
            let h =
                tokio::task::block_in_place(|| http_get(port, "/health", t)).expect("GET /health");
            if h.status == 200 {
                Ok(h)
            } else {
                Err(h)
            }
        })
        .await
        .unwrap_or_else(|last| last);
        assert_eq!(h.status, 200, "GET /health: {h:?}");
        let v = h.json().expect("/health JSON");
        assert_eq!(
            v["health"],
            Value::String("true".into()),
            "GET /health body: {v}"
        );

        // etcdcluster may be "not_decided" for a moment after start.
        let v = retry_until(Duration::from_secs(10), every, async || {
            let r = tokio::task::block_in_place(|| http_get(port, "/version", t))
                .expect("GET /version");
            assert_eq!(r.status, 200, "GET /version: {r:?}");
            let v = r.json().expect("/version JSON");
            let cl = v["etcdcluster"].as_str().unwrap_or_default().to_string();
            if cl.starts_with(version_prefix(c.flavor)) {
                Ok(v)
            } else {
                Err(v)
            }
        })
        .await
        .unwrap_or_else(|last| last);
        for k in ["etcdserver", "etcdcluster"] {
            assert!(
                v[k].is_string(),
                "GET /version body lacks string {k:?}: {v}"
            );
        }
        let server = v["etcdserver"].as_str().unwrap_or_default();
        assert!(
            server.starts_with(version_prefix(c.flavor)),
            "etcdserver {server:?} should start with {}: {v}",
            version_prefix(c.flavor)
        );
        let cluster = v["etcdcluster"].as_str().unwrap_or_default();
        assert!(
            cluster.starts_with(version_prefix(c.flavor)),
            "etcdcluster {cluster:?} should start with {}: {v}",
            version_prefix(c.flavor)
        );
    })
    .await
}

// ---------------------------------------------------------------------------
// 4. gRPC health service
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_check_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let ch = tonic::transport::Endpoint::from_shared(c.members[0].endpoint())
            .expect("endpoint")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect");
        let mut h = HealthClient::new(ch.clone());
        let r = h
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("grpc.health.v1.Health/Check")
            .into_inner();
        assert_eq!(
            r.status,
            ServingStatus::Serving as i32,
            "Health/Check(\"\") status: {r:?}"
        );
        // An unknown service is NOT_FOUND (grpc-go's health server, used by etcd).
        let e = h
            .check(HealthCheckRequest {
                service: "no.such.Service".into(),
            })
            .await
            .expect_err("unknown service must fail");
        assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
        // A call to a gRPC service the server does not have is grpc-go's
        // Unimplemented "unknown service <name>" (not an HTTP 404).
        let mut raw = tonic::client::Grpc::new(ch);
        raw.ready().await.expect("ready");
        let e =
            raw
                .unary(
                    tonic::Request::new(HealthCheckRequest::default()),
                    tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.Nope/Put"),
                    tonic_prost::ProstCodec::<
                        HealthCheckRequest,
                        tonic_health::pb::HealthCheckResponse,
                    >::default(),
                )
                .await
                .expect_err("an unknown service must fail");
        assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
        assert_eq!(e.message(), "unknown service etcdserverpb.Nope", "{e:?}");
    })
    .await
}

// ---------------------------------------------------------------------------
// 5. ETCD_* environment variables, --version
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_env_vars_configure_server() {
    bounded(LIMIT, async {
        let flavor = test_flavor();
        let dir = tempfile::tempdir().expect("tempdir");
        let (cp, pp) = (free_port(), free_port());
        let curl = format!("http://127.0.0.1:{cp}");
        let purl = format!("http://127.0.0.1:{pp}");
        let data_dir = dir.path().join("env.etcd");
        let mut cmd = Command::new(flavor.binary());
        cmd.env("ETCD_DATA_DIR", &data_dir)
            .env("ETCD_NAME", "envnode")
            .env("ETCD_LISTEN_CLIENT_URLS", &curl)
            .env("ETCD_ADVERTISE_CLIENT_URLS", &curl)
            .env("ETCD_LISTEN_PEER_URLS", &purl)
            .env("ETCD_INITIAL_ADVERTISE_PEER_URLS", &purl)
            .env("ETCD_INITIAL_CLUSTER", format!("envnode={purl}"));
        let mut p = [Proc::spawn(cmd, &dir.path().join("env.log"))];
        let (_, ms) = wait_member_list(&curl, 1, &mut p).await;
        assert_eq!(ms[0]["name"], Value::String("envnode".into()), "{ms:?}");
        assert_eq!(strings(&ms[0]["peerURLs"]), vec![purl.clone()], "{ms:?}");
        assert_eq!(strings(&ms[0]["clientURLs"]), vec![curl.clone()], "{ms:?}");
        let eps = vec![curl.clone()];
        let o = tokio::task::block_in_place(|| etcdctl(&eps, &["put", "envkey", "envval"]));
        assert!(o.success(), "put: {}", show(&o));
        let o =
            tokio::task::block_in_place(|| etcdctl(&eps, &["get", "envkey", "--print-value-only"]));
        assert_eq!(o.stdout.trim(), "envval", "get: {}", show(&o));
        assert!(
            data_dir.join("member").is_dir(),
            "ETCD_DATA_DIR {} not used",
            data_dir.display()
        );
        p[0].kill();
    })
    .await
}

#[test]
fn version_flag_prints_version() {
    let flavor = test_flavor();
    let out = Command::new(flavor.binary())
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .expect("run --version");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "--version exit {}: {text:?}",
        out.status
    );
    assert!(
        text.contains(flavor.name()) || text.contains(version_prefix(flavor)),
        "--version output {text:?}"
    );
    if flavor == Flavor::Retcd {
        assert!(text.contains("retcd"), "--version output {text:?}");
    }
}

// ---------------------------------------------------------------------------
// 6. Graceful shutdown
// ---------------------------------------------------------------------------

/// Whether a SIGTERMed process ended "gracefully": etcd and retcd both
/// re-raise the signal after their shutdown, so they die of SIGTERM (a
/// shell sees 143); a crash or SIGKILL is something else.
fn graceful(_flavor: Flavor, st: &ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    st.code() == Some(0) || st.signal() == Some(libc::SIGTERM)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_cleanly_and_keeps_data() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let mut cl = c.client_all().await.expect("client");
        for i in 0..100 {
            cl.put(format!("gs/{i:03}"), format!("v{i}"), None)
                .await
                .expect("put");
        }
        drop(cl);
        // Leader first (leadership transfer on shutdown), then the others.
        let leader = c.leader(Duration::from_secs(10)).await.expect("leader");
        let mut order = vec![leader];
        order.extend((0..3).filter(|&i| i != leader));
        for i in order {
            let t0 = Instant::now();
            let st =
                tokio::task::block_in_place(|| c.members[i].stop_within(Duration::from_secs(10)))
                    .expect("member was running");
            let took = t0.elapsed();
            assert!(
                took < Duration::from_secs(10),
                "m{i} did not exit within 10 s of SIGTERM (was SIGKILLed: {st})\n{}",
                c.members[i].log_tail(3000)
            );
            assert!(
                graceful(c.flavor, &st),
                "m{i} exit status after SIGTERM: {st} (took {took:?})\n{}",
                c.members[i].log_tail(3000)
            );
        }
        for m in c.members.iter_mut() {
            m.restart();
        }
        c.wait_all_ready(READY).await.expect("restart");
        let want: Vec<(String, String)> = (0..100)
            .map(|i| (format!("gs/{i:03}"), format!("v{i}")))
            .collect();
        for i in 0..3 {
            let cl = c.client(i).await.expect("client");
            // Serializable: what this member itself holds after restart (a
            // follower stopped right after the leader may still catch up).
            let got = retry_until(Duration::from_secs(10), Duration::from_millis(200), || {
                let mut cl = cl.clone();
                let want = want.clone();
                async move {
                    let r = cl
                        .get(
                            "gs/",
                            Some(GetOptions::new().with_prefix().with_serializable()),
                        )
                        .await
                        .map_err(|e| format!("{e}"))?;
                    let got: Vec<(String, String)> = r
                        .kvs()
                        .iter()
                        .map(|kv| {
                            (
                                kv.key_str().unwrap_or_default().to_string(),
                                kv.value_str().unwrap_or_default().to_string(),
                            )
                        })
                        .collect();
                    if got == want {
                        Ok(got)
                    } else {
                        Err(format!("{} keys: {got:?}", got.len()))
                    }
                }
            })
            .await;
            assert!(got.is_ok(), "keys on m{i} after restart: {got:?}");
        }
        let mut cl = c.client_all().await.expect("client");
        cl.put("after", "restart", None)
            .await
            .expect("write after restart");
    })
    .await
}
