//! retcdctl against etcdctl 3.5 (the version retcdctl follows): bad input
//! (unknown command or flag, bad values, unreachable endpoint, bad TLS
//! files, a wrong password on an auth-enabled server) gives etcdctl's
//! message and exit code; and scripts of lease, member, endpoint, alarm,
//! defrag, snapshot, user, role and auth commands print what etcdctl
//! prints, against real etcd and against the selected target (retcd by
//! default).
//!
//! Each tool runs its script on its own fresh server (the steps mutate the
//! store); outputs are normalised as the differential tests do, plus what
//! differs between two servers by nature: lease and member IDs (captured
//! from the output and masked), `took` times and snapshot paths.

use retcd_tests::normalize::normalize_output;
use retcd_tests::{
    bounded, etcdctl35_bin, retcdctl_bin, run_ctl, run_ctl_within, test_flavor, Cluster, Flavor,
    Output,
};
use retcd_tests::{limit::NORMAL as LIMIT, FAST};

/// The two tests of one comparison: `compare(flavor)` within the limit on
/// real etcd and on the target.
macro_rules! on_etcd_and_target {
    ($on_etcd:ident, $on_target:ident, $compare:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_etcd() {
            bounded(LIMIT, $compare(Flavor::Etcd)).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $on_target() {
            bounded(LIMIT, $compare(test_flavor())).await;
        }
    };
}

/// A one-member cluster and its endpoint.
async fn fresh_server(flavor: Flavor) -> (Cluster, String) {
    let c = Cluster::start(flavor, 1, FAST).await.expect("start");
    let ep = c.endpoints()[0].clone();
    (c, ep)
}

/// A one-member cluster and the `--endpoints` flag that names it.
async fn one_member(flavor: Flavor) -> (Cluster, String) {
    let (c, ep) = fresh_server(flavor).await;
    (c, format!("--endpoints={ep}"))
}

/// etcdctl 3.5 and retcdctl, each way round (for mixed runs: one tool
/// holds, the other waits or observes).
fn both_orders() -> [(std::path::PathBuf, std::path::PathBuf); 2] {
    [
        (etcdctl35_bin(), retcdctl_bin()),
        (retcdctl_bin(), etcdctl35_bin()),
    ]
}

fn show(o: &Output) -> String {
    format!(
        "  exit code: {}\n  stdout: {:?}\n  stderr: {:?}",
        o.code, o.stdout, o.stderr
    )
}

/// Runs `args` (exactly, no default flags) with etcdctl 3.5 and retcdctl.
fn both(args: &[&str], stdin: Option<&str>) -> (Output, Output) {
    (
        normalize_output(&run_ctl(&etcdctl35_bin(), args, stdin, &[])),
        normalize_output(&run_ctl(&retcdctl_bin(), args, stdin, &[])),
    )
}

/// Asserts that each case gives the same output with both tools and the
/// expected exit code; lists every difference.
fn assert_cases(cases: &[(Vec<String>, i32)]) {
    let mut failures = Vec::new();
    for (args, code) in cases {
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let (e, r) = both(&a, None);
        assert_eq!(
            e.code,
            *code,
            "case bug: etcdctl 3.5 exit code for {args:?}:\n{}",
            show(&e)
        );
        if e != r {
            failures.push(format!(
                "{args:?}\n etcdctl 3.5:\n{}\n retcdctl:\n{}",
                show(&e),
                show(&r)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

fn v(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Command-line mistakes and unreachable or misconfigured connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_etcdctls_message_and_exit_code() {
    bounded(LIMIT, async {
        let (_c, ep) = one_member(test_flavor()).await;
        let ep = ep.as_str();
        let dir = tempfile::tempdir().expect("tempdir");
        let bad_pem = dir.path().join("bad.pem");
        std::fs::write(&bad_pem, "not a certificate\n").expect("write");
        let bad_pem = bad_pem.to_str().expect("utf-8").to_string();
        let missing = format!("--cacert={}/missing.pem", dir.path().display());
        let cases: Vec<(Vec<String>, i32)> = vec![
            // Unknown command (with and without a suggestion), unknown flags.
            (v(&[ep, "bogus"]), 1),
            (v(&[ep, "gte", "k"]), 1),
            (v(&[ep, "get", "k", "--bogus"]), 1),
            (v(&[ep, "get", "k", "-x"]), 1),
            (v(&[ep, "--bogus-global", "get", "k"]), 1),
            // Flag values and arguments.
            (v(&[ep, "get", "k", "--rev", "x"]), 1),
            (v(&[ep, "get", "k", "--limit"]), 1),
            (v(&[ep, "--dial-timeout=zz", "get", "k"]), 1),
            (v(&[ep, "get", "k", "--prefix=maybe"]), 1),
            (v(&[ep, "get"]), 128),
            (v(&[ep, "get", "a", "b", "--prefix"]), 128),
            (v(&[ep, "put", "k", "v", "--lease=xyz"]), 128),
            (v(&[ep, "get", "k", "--consistency=x"]), 4),
            (v(&[ep, "get", "k", "-w", "yaml"]), 4),
            (v(&[ep, "get", "k", "-w", "table"]), 4),
            (
                v(&[ep, "get", "k", "-w", "json", "--print-value-only"]),
                128,
            ),
            (v(&[ep, "lease", "grant", "x"]), 128),
            (v(&[ep, "lease", "revoke", "zz"]), 128),
            (v(&[ep, "member", "remove", "zz"]), 128),
            (v(&[ep, "member", "add", "m", "http://127.0.0.1:1"]), 128),
            (v(&[ep, "compaction"]), 128),
            (v(&[ep, "snapshot", "save"]), 128),
            (v(&[ep, "txn", "extra"]), 128),
            // Help pages and command groups print usage and exit 0.
            (v(&[ep, "get", "--help"]), 0),
            (v(&[ep, "lease"]), 0),
            (v(&[ep, "help", "member", "add"]), 0),
            (v(&[ep, "version"]), 0),
            // Unreachable endpoint: the dial is retried until the command
            // deadline, then clientv3's log line and "context deadline exceeded".
            (
                v(&[
                    "--endpoints=127.0.0.1:1",
                    "--command-timeout=1s",
                    "get",
                    "k",
                ]),
                1,
            ),
            (
                v(&[
                    "--endpoints=127.0.0.1:1",
                    "--command-timeout=1s",
                    "put",
                    "k",
                    "v",
                ]),
                1,
            ),
            // TLS files.
            (v(&[ep, missing.as_str(), "get", "k"]), 128),
            (v(&[ep, "--cacert=", "get", "k"]), 128),
            (v(&[ep, "--cert=/nonexistent/c.pem", "get", "k"]), 128),
            (
                v(&[
                    ep,
                    "--cert=/nonexistent/c.pem",
                    "--key=/nonexistent/k.pem",
                    "get",
                    "k",
                ]),
                128,
            ),
            (
                v(&[
                    ep,
                    &format!("--cert={bad_pem}"),
                    &format!("--key={bad_pem}"),
                    "get",
                    "k",
                ]),
                128,
            ),
        ];
        tokio::task::block_in_place(|| assert_cases(&cases));
    })
    .await;
}

/// `--user` with a wrong password (and without a user) on an
/// auth-enabled server, and `ETCDCTL_*` variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failures_and_environment_match_etcdctl() {
    bounded(LIMIT, async {
        let (_c, ep) = one_member(test_flavor()).await;
        let ep = ep.as_str();
        let setup = tokio::task::block_in_place(|| {
            [
                run_ctl(
                    &etcdctl35_bin(),
                    &[ep, "user", "add", "root:rootpw"],
                    None,
                    &[],
                ),
                run_ctl(&etcdctl35_bin(), &[ep, "auth", "enable"], None, &[]),
                run_ctl(
                    &etcdctl35_bin(),
                    &[ep, "--user=root:rootpw", "put", "k", "v"],
                    None,
                    &[],
                ),
            ]
        });
        for o in &setup {
            assert!(o.success(), "setup failed:\n{}", show(o));
        }
        let cases: Vec<(Vec<String>, i32)> = vec![
            (v(&[ep, "--user=root:wrong", "get", "k"]), 2),
            (v(&[ep, "--user=nobody:x", "get", "k"]), 2),
            (v(&[ep, "--user=root", "--password=wrong", "get", "k"]), 2),
            (v(&[ep, "get", "k"]), 1),
            (v(&[ep, "put", "k", "v2"]), 1),
            (v(&[ep, "--user=root:rootpw", "get", "k"]), 0),
            (v(&[ep, "--user=root:rootpw", "get", "k", "-w", "json"]), 0),
            (
                v(&[ep, "--user=root", "--password=rootpw", "user", "list"]),
                0,
            ),
            (v(&[ep, "--user=root:rootpw", "role", "get", "root"]), 0),
        ];
        tokio::task::block_in_place(|| assert_cases(&cases));
        // ETCDCTL_* variables: used, unrecognised (warned) and shadowed (fatal).
        let env_cases: Vec<(Vec<(&str, &str)>, Vec<&str>, i32)> = vec![
            (
                vec![("ETCDCTL_USER", "root:rootpw")],
                vec![ep, "get", "k"],
                0,
            ),
            (
                vec![("ETCDCTL_WRITE_OUT", "json")],
                vec![ep, "--user=root:rootpw", "get", "k"],
                0,
            ),
            (
                vec![("ETCDCTL_BOGUS", "1")],
                vec![ep, "--user=root:rootpw", "get", "k"],
                0,
            ),
            (
                vec![("ETCDCTL_HEX", "true")],
                vec![ep, "--hex=false", "--user=root:rootpw", "get", "k"],
                1,
            ),
        ];
        let mut failures = Vec::new();
        for (env, args, code) in &env_cases {
            let (e, r) = tokio::task::block_in_place(|| {
                (
                    normalize_output(&run_ctl(&etcdctl35_bin(), args, None, env)),
                    normalize_output(&run_ctl(&retcdctl_bin(), args, None, env)),
                )
            });
            assert_eq!(e.code, *code, "case bug: {env:?} {args:?}:\n{}", show(&e));
            if e != r {
                failures.push(format!(
                    "{env:?} {args:?}\n etcdctl 3.5:\n{}\n retcdctl:\n{}",
                    show(&e),
                    show(&r)
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    })
    .await;
}

/// One step of a script; `{lease}`, `{member}`, `{dir}` are replaced with
/// the values captured on (or chosen for) each server.
struct Step {
    args: Vec<String>,
    stdin: Option<String>,
}

fn step(a: &[&str]) -> Step {
    Step {
        args: v(a),
        stdin: None,
    }
}

/// What the script has learned on one server.
#[derive(Default)]
struct Vars {
    lease: Option<String>,
    member: Option<String>,
    dir: String,
    /// The server's cluster and member ID.
    ids: Vec<u64>,
}

impl Vars {
    fn subst(&self, s: &str) -> String {
        let mut s = s.replace("{dir}", &self.dir);
        if let Some(l) = &self.lease {
            s = s.replace("{lease}", l);
        }
        if let Some(m) = &self.member {
            s = s.replace("{member}", m);
        }
        s
    }

    /// Learns IDs from an output ("lease 694d… granted", "Member … added").
    fn learn(&mut self, out: &str) {
        for line in out.lines() {
            if let Some(r) = line.strip_prefix("lease ") {
                if r.contains(" granted with TTL") {
                    self.lease = r.split(' ').next().map(|s| s.to_string());
                }
            }
            if let Some(r) = line.strip_prefix("Member ") {
                if r.contains(" added to cluster ") {
                    self.member = r.split_whitespace().next().map(|s| s.to_string());
                }
            }
        }
    }

    /// Masks what differs between two servers by nature.
    fn mask(&self, o: &Output) -> Output {
        let m = |s: &str| -> String {
            let mut s = s.replace(&self.dir, "<dir>");
            if let Some(l) = &self.lease {
                s = s.replace(l.as_str(), "<lease>");
                if let Ok(n) = i64::from_str_radix(l, 16) {
                    s = s.replace(&n.to_string(), "<lease>");
                }
            }
            if let Some(mb) = &self.member {
                s = s.replace(mb.as_str(), "<member>");
                if let Ok(n) = u64::from_str_radix(mb, 16) {
                    s = s.replace(&n.to_string(), "<member>");
                }
            }
            for (i, id) in self.ids.iter().enumerate() {
                s = s.replace(&id.to_string(), &format!("<id{i}>"));
                s = s.replace(&format!("{id:x}"), &format!("<id{i}>"));
            }
            // `%16x` pads a shorter ID with spaces.
            while s.contains("  <") {
                s = s.replace("  <", " <");
            }
            let s = retcd_tests::normalize_text(&mask_took(&s));
            // The member list's order follows the (random) member IDs.
            s.lines()
                .map(|l| match l.strip_prefix("ETCD_INITIAL_CLUSTER=") {
                    Some(r) => {
                        let mut parts: Vec<&str> = r.trim_matches('"').split(',').collect();
                        parts.sort();
                        format!("ETCD_INITIAL_CLUSTER=\"{}\"", parts.join(","))
                    }
                    None => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        Output {
            stdout: m(&o.stdout),
            stderr: m(&o.stderr),
            code: o.code,
        }
    }
}

/// `took = 1.2ms`, `"took":"1.2ms"`, `"Took" : 1.2ms`: timings.
fn mask_took(s: &str) -> String {
    let mut out = String::new();
    for (i, line) in s.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let mut l = line.to_string();
        for (pre, end) in [
            ("took = ", None),
            ("\"took\":\"", Some('"')),
            ("\"Took\" : ", None),
        ] {
            if let Some(p) = l.find(pre) {
                let tail = &l[p + pre.len()..];
                let e = match end {
                    Some(c) => tail.find(c).unwrap_or(tail.len()),
                    None => tail.find(' ').unwrap_or(tail.len()),
                };
                l = format!("{}<took>{}", &l[..p + pre.len()], &tail[e..]);
            }
        }
        out.push_str(&l);
    }
    out
}

/// Runs `steps` with etcdctl 3.5 and with retcdctl, each on its own fresh
/// 1-node server of `flavor`, and lists every step whose masked,
/// normalised output differs. Returns the number of steps compared.
async fn compare_script(flavor: Flavor, steps: &[Step]) -> usize {
    let flags = [FAST, &["--max-learners", "1"][..]].concat();
    let flags: Vec<&str> = if flavor == Flavor::Etcd {
        // etcd 3.4 has no --max-learners (it allows one learner).
        FAST.to_vec()
    } else {
        flags
    };
    let (a, b) = tokio::join!(
        Cluster::start(flavor, 1, &flags),
        Cluster::start(flavor, 1, &flags)
    );
    let (a, b) = (a.expect("start"), b.expect("start"));
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut va = Vars {
        dir: da.path().display().to_string(),
        ..Vars::default()
    };
    let mut vb = Vars {
        dir: db.path().display().to_string(),
        ..Vars::default()
    };
    for (c, vars) in [(&a, &mut va), (&b, &mut vb)] {
        let mut cl = c.client(0).await.expect("connect");
        let st = cl.status().await.expect("status");
        let h = st.header().expect("header");
        vars.ids = vec![h.cluster_id(), h.member_id()];
    }
    let mut failures = Vec::new();
    for (n, s) in steps.iter().enumerate() {
        let run = |bin: &std::path::Path, c: &Cluster, vars: &Vars| -> Output {
            let mut args = vec![
                format!("--endpoints={}", c.endpoints().join(",")),
                "--command-timeout=5s".to_string(),
            ];
            args.extend(s.args.iter().map(|x| vars.subst(x)));
            let args: Vec<&str> = args.iter().map(|x| x.as_str()).collect();
            run_ctl(bin, &args, s.stdin.as_deref(), &[])
        };
        let (e, r) = tokio::task::block_in_place(|| {
            (
                run(&etcdctl35_bin(), &a, &va),
                run(&retcdctl_bin(), &b, &vb),
            )
        });
        va.learn(&e.stdout);
        vb.learn(&r.stdout);
        let (en, rn) = (
            va.mask(&normalize_output(&e)),
            vb.mask(&normalize_output(&r)),
        );
        if en != rn {
            failures.push(format!(
                "step {n}: {:?}\n etcdctl 3.5 on {}:\n{}\n retcdctl on {}:\n{}",
                s.args,
                flavor.name(),
                show(&en),
                flavor.name(),
                show(&rn)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} steps differ on {}:\n\n{}",
        failures.len(),
        steps.len(),
        flavor.name(),
        failures.join("\n\n")
    );
    steps.len()
}

fn admin_script() -> Vec<Step> {
    vec![
        // Leases.
        step(&["lease", "grant", "600"]),
        step(&["put", "lk", "v", "--lease={lease}"]),
        step(&["lease", "list"]),
        step(&["lease", "list", "-w", "json"]),
        step(&["lease", "keep-alive", "--once", "{lease}"]),
        step(&["lease", "keep-alive", "--once", "{lease}", "-w", "json"]),
        step(&["lease", "keep-alive", "--once", "1234"]),
        step(&["lease", "revoke", "{lease}"]),
        step(&["lease", "revoke", "{lease}"]),
        step(&["lease", "timetolive", "{lease}"]),
        step(&["lease", "list", "-w", "fields"]),
        step(&["get", "lk"]),
        // Members: a learner (it needs no quorum), listed, removed.
        step(&["member", "list", "-w", "fields"]),
        step(&[
            "member",
            "add",
            "l1",
            "--learner",
            "--peer-urls=http://127.0.0.1:1",
        ]),
        step(&["member", "promote", "{member}"]),
        step(&[
            "member",
            "update",
            "{member}",
            "--peer-urls=http://127.0.0.1:2",
        ]),
        step(&["member", "remove", "{member}"]),
        step(&["member", "remove", "{member}"]),
        step(&["member", "promote", "1234"]),
        // Endpoints, alarms, defrag, hash, snapshot.
        step(&["endpoint", "health"]),
        step(&["endpoint", "health", "--cluster", "-w", "json"]),
        step(&["endpoint", "health", "-w", "fields"]),
        step(&["endpoint", "hashkv", "--rev", "1", "-w", "fields"]),
        step(&["endpoint", "hashkv", "--rev", "1", "-w", "table"]),
        step(&["alarm", "list"]),
        step(&["alarm", "disarm", "-w", "json"]),
        step(&["defrag"]),
        step(&["defrag", "--cluster"]),
        step(&["snapshot", "save", "{dir}/snap.db"]),
        step(&["snapshot", "save", "{dir}/missing/snap.db"]),
        // Users, roles, auth.
        step(&["user", "add", "root:rootpw"]),
        step(&["user", "add", "root:again"]),
        step(&["user", "add", "alice", "--new-user-password=apw"]),
        step(&["user", "add", "nopw", "--no-password"]),
        step(&["user", "list"]),
        step(&["user", "list", "-w", "json"]),
        step(&["role", "add", "r1"]),
        step(&["role", "add", "r1"]),
        step(&["role", "grant-permission", "r1", "read", "foo"]),
        step(&[
            "role",
            "grant-permission",
            "r1",
            "readwrite",
            "dir/",
            "--prefix",
        ]),
        step(&["role", "grant-permission", "r1", "write", "a", "c"]),
        step(&["role", "grant-permission", "r1", "write", "z", "--from-key"]),
        step(&["role", "grant-permission", "r1", "bogus", "x"]),
        step(&["role", "get", "r1"]),
        step(&["role", "get", "r1", "-w", "json"]),
        step(&["role", "get", "r1", "-w", "fields"]),
        step(&["role", "list"]),
        step(&["role", "list", "-w", "fields"]),
        step(&["role", "revoke-permission", "r1", "foo"]),
        step(&["role", "revoke-permission", "r1", "a", "c"]),
        step(&["role", "revoke-permission", "r1", "nothing"]),
        step(&["user", "grant-role", "alice", "r1"]),
        step(&["user", "grant-role", "alice", "nosuch"]),
        step(&["user", "get", "alice"]),
        step(&["user", "get", "alice", "-w", "json"]),
        step(&["user", "get", "alice", "--detail"]),
        step(&["user", "revoke-role", "alice", "r1"]),
        step(&["user", "delete", "nopw"]),
        step(&["user", "delete", "nopw"]),
        step(&["role", "delete", "r1"]),
        step(&["auth", "enable"]),
        step(&["--user=root:rootpw", "user", "get", "root"]),
        step(&["--user=root:rootpw", "auth", "disable"]),
        step(&["auth", "disable"]),
    ]
}

async fn compare_admin(flavor: Flavor) {
    let n = compare_script(flavor, &admin_script()).await;
    assert!(n > 50);
}

on_etcd_and_target!(
    admin_commands_match_etcdctl_on_etcd,
    admin_commands_match_etcdctl_on_target,
    compare_admin
);

/// `watch` (simple and json, `--prefix --prev-kv`, and a command run per
/// event with `ETCD_WATCH_*`): both tools watch the same server while
/// keys change, then are stopped by PID; their outputs must be equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_matches_etcdctl() {
    bounded(LIMIT, async {
        let (_c, ep) = one_member(test_flavor()).await;
        let forms: Vec<Vec<&str>> = vec![
            vec!["watch", "w", "--prefix", "--prev-kv"],
            vec!["watch", "w1", "-w", "json"],
            vec![
                "watch",
                "w1",
                "--",
                "sh",
                "-c",
                "echo \"$ETCD_WATCH_EVENT_TYPE $ETCD_WATCH_KEY $ETCD_WATCH_VALUE\"",
            ],
        ];
        let mut children = Vec::new();
        for bin in [etcdctl35_bin(), retcdctl_bin()] {
            for f in &forms {
                let child = std::process::Command::new(&bin)
                    .arg(&ep)
                    .args(f)
                    .env("ETCDCTL_API", "3")
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn watch");
                children.push((bin.clone(), f.clone(), child));
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        tokio::task::block_in_place(|| {
            for args in [
                vec!["put", "w1", "a"],
                vec!["put", "w2", "b"],
                vec!["put", "w1", "c"],
                vec!["del", "w1"],
            ] {
                let mut a = vec![ep.as_str()];
                a.extend(args);
                let o = run_ctl(&etcdctl35_bin(), &a, None, &[]);
                assert!(o.success(), "{}", show(&o));
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let mut outs = Vec::new();
        for (bin, f, mut child) in children {
            let _ = std::process::Command::new("kill")
                .args(["-s", "KILL", &child.id().to_string()])
                .status();
            let mut o = String::new();
            use std::io::Read as _;
            child
                .stdout
                .take()
                .expect("stdout")
                .read_to_string(&mut o)
                .expect("read");
            let _ = child.wait();
            outs.push((bin, f, retcd_tests::normalize::normalize_stdout(&o)));
        }
        let n = forms.len();
        for i in 0..n {
            let (e, r) = (&outs[i], &outs[i + n]);
            // "dzE=" is w1 in base64 (-w json).
            assert!(
                e.2.contains("w1") || e.2.contains("dzE="),
                "etcdctl saw no events for {:?}: {:?}",
                e.1,
                e.2
            );
            assert_eq!(e.2, r.2, "watch {:?}: etcdctl 3.5 vs retcdctl", e.1);
        }
    })
    .await;
}

// ---------------------------------------------------------------------------
// lock, elect, make-mirror, check perf / datascale.

/// A command left running in the background (lock holder, candidate,
/// observer, mirror); stdout and stderr are collected as they come.
/// Killed by PID on drop.
struct Bg {
    child: std::process::Child,
    out: std::sync::Arc<std::sync::Mutex<String>>,
    err: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Bg {
    fn spawn(bin: &std::path::Path, ep: &str, args: &[&str]) -> Bg {
        use std::io::Read as _;
        use std::process::{Command, Stdio};
        let mut child = Command::new(bin)
            .env("ETCDCTL_API", "3")
            .env_remove("ETCDCTL_ENDPOINTS")
            .arg(format!("--endpoints={ep}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let collect = |mut r: Box<dyn std::io::Read + Send>| {
            let sink = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
            let s = sink.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = r.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    s.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
            sink
        };
        let out = collect(Box::new(child.stdout.take().expect("stdout")));
        let err = collect(Box::new(child.stderr.take().expect("stderr")));
        Bg { child, out, err }
    }

    fn stdout(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    async fn wait_for(&self, needle: &str, timeout: std::time::Duration) -> bool {
        let end = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < end {
            if self.stdout().contains(needle) {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        false
    }

    fn signal(&self, sig: &str) {
        let _ = std::process::Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status();
    }

    /// Sends `sig` and waits (10 s) for the exit, as [`Bg::finish`].
    async fn stop(self, sig: &str) -> Output {
        self.signal(sig);
        self.finish(secs(10)).await
    }

    /// Waits for the exit (SIGKILL after `timeout`); what it printed and
    /// its code (-1 when a signal ended it).
    async fn finish(mut self, timeout: std::time::Duration) -> Output {
        let end = std::time::Instant::now() + timeout;
        let code = loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                break st.code().unwrap_or(-1);
            }
            if std::time::Instant::now() >= end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break -2;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        // Let the reader threads drain the pipes.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        Output {
            stdout: self.stdout(),
            stderr: self.err.lock().unwrap().clone(),
            code,
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name/<hex lease>` → `name/<LEASE>`; `"key":"<base64>"` and `"lease":N`
/// in JSON are masked too.
fn mask_lease(s: &str) -> String {
    let s: String = s
        .split('\n')
        .map(|l| match l.rsplit_once('/') {
            Some((pfx, id))
                if !id.is_empty()
                    && !pfx.contains(' ')
                    && id.chars().all(|c| c.is_ascii_hexdigit()) =>
            {
                format!("{pfx}/<LEASE>")
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = s.as_str();
    while let Some(i) = rest.find("\"lease\":") {
        out.push_str(&rest[..i + 8]);
        rest = &rest[i + 8..];
        let n = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        out.push_str("<LEASE>");
        rest = &rest[n..];
    }
    out.push_str(rest);
    retcd_tests::normalize_text(&out)
}

fn secs(n: u64) -> std::time::Duration {
    std::time::Duration::from_secs(n)
}

/// The lock script with one tool on one server: a holder and a waiter,
/// the exec form's exit code and environment, bad exec commands.
async fn lock_script(bin: &std::path::Path, ep: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let o = |o: &Output| {
        format!(
            "code={} out={:?} err={:?}",
            o.code,
            mask_lease(&o.stdout),
            mask_lease(&o.stderr)
        )
    };
    let run = |args: &[&str]| {
        let mut a = vec![format!("--endpoints={ep}")];
        a.extend(args.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        run_ctl(bin, &a, None, &[])
    };
    // `lock L0 -- sh -c <script>`.
    let sh = |script: &str| run(&["lock", "L0", "--", "sh", "-c", script]);
    let exec = tokio::task::block_in_place(|| {
        [
            sh("echo $ETCD_LOCK_KEY; exit 7"),
            run(&["lock", "L0", "sh", "-c", "true"]),
            sh("test -n \"$ETCD_LOCK_REV\" && echo rev-set"),
            sh("kill -9 $$"),
            run(&["lock", "L0", "no-such-command-xyz"]),
            run(&["lock", "L0", "/nonexistent/cmd"]),
            run(&["lock", "--ttl=5", "L0", "--", "echo", "ttl5"]),
        ]
    });
    for e in &exec {
        seen.push(format!("exec: {}", o(e)));
    }
    let holder = Bg::spawn(bin, ep, &["lock", "L1"]);
    assert!(
        holder.wait_for("L1/", secs(10)).await,
        "holder did not get the lock: {:?}",
        holder.stdout()
    );
    seen.push(format!("holder: {:?}", mask_lease(&holder.stdout())));
    let mut waiter = Bg::spawn(bin, ep, &["lock", "L1", "--", "echo", "second-got-it"]);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    seen.push(format!(
        "waiter while held: running={} out={:?}",
        waiter.running(),
        waiter.stdout()
    ));
    let h = holder.stop("TERM").await;
    seen.push(format!("holder after SIGTERM: {}", o(&h)));
    let w = waiter.finish(secs(15)).await;
    seen.push(format!("waiter after release: {}", o(&w)));
    // A waiter interrupted before it gets the lock.
    let holder = Bg::spawn(bin, ep, &["lock", "L2"]);
    assert!(holder.wait_for("L2/", secs(10)).await);
    let waiter = Bg::spawn(bin, ep, &["lock", "L2"]);
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    seen.push(format!(
        "interrupted waiter: {}",
        o(&waiter.stop("INT").await)
    ));
    seen.push(format!(
        "holder after SIGINT: {}",
        o(&holder.stop("INT").await)
    ));
    seen
}

/// Runs the lock script with etcdctl 3.5 and retcdctl on one fresh
/// server of `flavor`, then has an etcdctl holder exclude a retcdctl
/// waiter (and the other way round).
async fn compare_lock(flavor: Flavor) {
    let (_c, ep) = fresh_server(flavor).await;
    let want = lock_script(&etcdctl35_bin(), &ep).await;
    let got = lock_script(&retcdctl_bin(), &ep).await;
    assert_eq!(
        want[0], "exec: code=7 out=\"L0/<LEASE>\\n\" err=\"Error: exit status 7\\n\"",
        "the script changed on etcdctl"
    );
    assert_eq!(
        got,
        want,
        "retcdctl's lock differs from etcdctl's on {}",
        flavor.name()
    );
    for (a, b) in both_orders() {
        let holder = Bg::spawn(&a, &ep, &["lock", "X"]);
        assert!(holder.wait_for("X/", secs(10)).await);
        let mut waiter = Bg::spawn(&b, &ep, &["lock", "X", "--", "echo", "got-x"]);
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        assert!(
            waiter.running(),
            "{} took a lock {} holds",
            b.display(),
            a.display()
        );
        holder.signal("TERM");
        let w = waiter.finish(secs(15)).await;
        assert_eq!((w.code, w.stdout.as_str()), (0, "got-x\n"), "{}", show(&w));
    }
}

on_etcd_and_target!(
    lock_matches_etcdctl_on_etcd,
    lock_matches_etcdctl_on_target,
    compare_lock
);

/// Stops a campaigner with `sig`: `<who> after SIG<sig>: code=… err=…`.
async fn stopped(who: &str, sig: &str, b: Bg) -> String {
    let o = b.stop(sig).await;
    format!("{who} after SIG{sig}: code={} err={:?}", o.code, o.stderr)
}

/// The election script with one tool: an observer (simple and JSON), two
/// campaigners, the first resigning on SIGTERM.
async fn elect_script(bin: &std::path::Path, ep: &str, name: &str) -> Vec<String> {
    let mut seen = Vec::new();
    let observer = Bg::spawn(bin, ep, &["elect", "-l", name]);
    let json_observer = Bg::spawn(bin, ep, &["elect", "-l", name, "-w", "json"]);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let first = Bg::spawn(bin, ep, &["elect", name, "v1"]);
    assert!(first.wait_for("v1", secs(10)).await, "first not leader");
    seen.push(format!("first: {:?}", mask_lease(&first.stdout())));
    let mut second = Bg::spawn(bin, ep, &["elect", name, "v2"]);
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    seen.push(format!(
        "second while first leads: running={} out={:?}",
        second.running(),
        second.stdout()
    ));
    assert!(
        observer.wait_for("v1", secs(10)).await,
        "observer missed v1"
    );
    seen.push(stopped("first", "TERM", first).await);
    assert!(second.wait_for("v2", secs(15)).await, "second never leader");
    seen.push(format!("second: {:?}", mask_lease(&second.stdout())));
    assert!(
        observer.wait_for("v2", secs(10)).await,
        "observer missed v2"
    );
    assert!(
        json_observer.wait_for("djI=", secs(10)).await,
        "json observer missed v2"
    );
    seen.push(stopped("second", "INT", second).await);
    for (what, ob) in [("observer", observer), ("json observer", json_observer)] {
        let o = ob.stop("TERM").await;
        // JSON: the revisions differ between the two runs; keep the shape.
        let out = mask_lease(&o.stdout)
            .split('\n')
            .map(|l| {
                if l.starts_with('{') {
                    l.split(',')
                        .filter(|f| {
                            ![
                                "revision",
                                "\"key\"",
                                "cluster_id",
                                "member_id",
                                "raft_term",
                            ]
                            .iter()
                            .any(|x| f.contains(x))
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        seen.push(format!(
            "{what}: code={} out={out:?} err={:?}",
            o.code, o.stderr
        ));
    }
    seen
}

async fn compare_elect(flavor: Flavor) {
    let (_c, ep) = fresh_server(flavor).await;
    let want = elect_script(&etcdctl35_bin(), &ep, "E1").await;
    let got = elect_script(&retcdctl_bin(), &ep, "E2").await;
    let got: Vec<String> = got.iter().map(|s| s.replace("E2/", "E1/")).collect();
    assert_eq!(
        got,
        want,
        "retcdctl's elect differs from etcdctl's on {}",
        flavor.name()
    );
    // Mixed: a retcdctl observer sees an etcdctl leader and vice versa.
    for (a, b) in both_orders() {
        let leader = Bg::spawn(&a, &ep, &["elect", "M", "from-a"]);
        assert!(leader.wait_for("from-a", secs(10)).await);
        let ob = Bg::spawn(&b, &ep, &["elect", "-l", "M"]);
        assert!(
            ob.wait_for("from-a", secs(10)).await,
            "{} missed it",
            b.display()
        );
        let _ = leader.stop("TERM").await;
    }
}

on_etcd_and_target!(
    elect_matches_etcdctl_on_etcd,
    elect_matches_etcdctl_on_target,
    compare_elect
);

/// make-mirror from one server to a second: both tools mirror the same
/// prefix at once (to `e/` and `r/`), then the source changes; after the
/// 30 s tick both printed the same count, and the destination holds the
/// same keys under each prefix.
async fn compare_mirror(flavor: Flavor) {
    let (src, dst) = tokio::join!(
        Cluster::start(flavor, 1, FAST),
        Cluster::start(flavor, 1, FAST)
    );
    let (src, dst) = (src.expect("start"), dst.expect("start"));
    let (s, d) = (src.endpoints()[0].clone(), dst.endpoints()[0].clone());
    let ctl = |ep: &str, args: &[&str]| {
        let mut a = vec![format!("--endpoints={ep}")];
        a.extend(args.iter().map(|x| x.to_string()));
        let a: Vec<&str> = a.iter().map(|x| x.as_str()).collect();
        let o = run_ctl(&etcdctl35_bin(), &a, None, &[]);
        assert!(o.success(), "{args:?}: {}", show(&o));
        o
    };
    tokio::task::block_in_place(|| {
        for i in 0..5 {
            ctl(&s, &["put", &format!("src/k{i}"), &format!("v{i}")]);
        }
        ctl(&s, &["put", "outside", "x"]);
    });
    let e = Bg::spawn(
        &etcdctl35_bin(),
        &s,
        &["make-mirror", "--prefix=src/", "--dest-prefix=e/", &d],
    );
    let r = Bg::spawn(
        &retcdctl_bin(),
        &s,
        &["make-mirror", "--prefix=src/", "--dest-prefix=r/", &d],
    );
    tokio::time::sleep(secs(3)).await;
    tokio::task::block_in_place(|| {
        ctl(&s, &["put", "src/k5", "v5"]);
        ctl(&s, &["del", "src/k0"]);
        ctl(&s, &["put", "src/k1", "v1b"]);
        let t = "\nput src/t1 a\nput src/t2 b\ndel src/k2\n\n\n";
        let mut a = vec![format!("--endpoints={s}"), "txn".to_string()];
        a.push("--interactive=false".into());
        let a: Vec<&str> = a.iter().map(|x| x.as_str()).collect();
        let o = run_ctl(&etcdctl35_bin(), &a, Some(t), &[]);
        assert!(o.success(), "txn: {}", show(&o));
    });
    assert!(e.wait_for("\n", secs(40)).await, "etcdctl printed no count");
    assert!(
        r.wait_for("\n", secs(10)).await,
        "retcdctl printed no count"
    );
    e.signal("TERM");
    r.signal("TERM");
    let (eo, ro) = (e.finish(secs(5)).await, r.finish(secs(5)).await);
    assert_eq!(
        eo.stdout,
        "11\n",
        "etcdctl's count (5 keys copied + 6 events): {}",
        show(&eo)
    );
    assert_eq!(ro.stdout, eo.stdout, "retcdctl's count: {}", show(&ro));
    assert_eq!(ro.stderr, eo.stderr);
    let dump = |p: &str| {
        tokio::task::block_in_place(|| ctl(&d, &["get", "--prefix", p]))
            .stdout
            .replace(p, "<p>")
    };
    let (de, dr) = (dump("e/"), dump("r/"));
    assert!(de.contains("<p>k1\nv1b\n") && !de.contains("<p>k0"), "{de}");
    assert_eq!(dr, de, "the destination differs under r/ and e/");
    // The same mistakes give the same answers.
    let bad: Vec<(Vec<String>, i32)> = vec![
        (
            v(&[
                &format!("--endpoints={s}"),
                "make-mirror",
                "--dest-prefix=a/",
                "--no-dest-prefix",
                &d,
            ]),
            128,
        ),
        (
            v(&[&format!("--endpoints={s}"), "make-mirror", &d, &s]),
            128,
        ),
    ];
    tokio::task::block_in_place(|| assert_cases(&bad));
}

on_etcd_and_target!(
    make_mirror_matches_etcdctl_on_etcd,
    make_mirror_matches_etcdctl_on_target,
    compare_mirror
);

/// A `check` output's shape: progress-bar redraws (`\r…`) dropped (but
/// the first one kept: it has no timings), digits masked.
fn check_shape(out: &str) -> (String, Vec<String>) {
    let first_bar = out
        .split('\r')
        .nth(1)
        .map(|s| s.split('\n').next().unwrap_or("").to_string())
        .unwrap_or_default();
    let mut lines = Vec::new();
    for seg in out.split('\r') {
        for (i, l) in seg.split('\n').enumerate() {
            let bar = i == 0
                && l.trim_start().starts_with(|c: char| c.is_ascii_digit())
                && l.contains(" / ");
            let l = if bar {
                // "59 / 60   98.33%PASS: …": etcdctl's results may follow
                // an unfinished bar on the same line.
                match l.find("%") {
                    Some(p) => l[p + 1..]
                        .trim_start_matches(|c: char| c.is_ascii_digit() || "ms ".contains(c)),
                    None => "",
                }
            } else {
                l
            };
            if !l.trim().is_empty() {
                let masked: String = l
                    .chars()
                    .map(|c| if c.is_ascii_digit() { '#' } else { c })
                    .collect();
                let mut m = masked;
                while m.contains("##") {
                    m = m.replace("##", "#");
                }
                lines.push(m.replace("-#", "#").replace("NaN", "#"));
            }
        }
    }
    (first_bar, lines)
}

/// `check datascale --load s`: the same lines (digits masked) and exit
/// code from both tools, on etcd and the target.
async fn compare_datascale(flavor: Flavor) {
    let (_c, ep) = one_member(flavor).await;
    let args = [
        ep.as_str(),
        "check",
        "datascale",
        "--load",
        "s",
        "--auto-compact",
        "--auto-defrag",
    ];
    // 10k puts of 1 KiB, then compaction and defrag: ~14 s here, 30+ s
    // on a slow CI machine (it was killed there at 30 s while compacting).
    let within = std::time::Duration::from_secs(100);
    let (e, r) = tokio::task::block_in_place(|| {
        (
            run_ctl_within(&etcdctl35_bin(), &args, None, &[], within),
            run_ctl_within(&retcdctl_bin(), &args, None, &[], within),
        )
    });
    assert_eq!(e.code, 0, "etcdctl: {}", show(&e));
    let (es, rs) = (check_shape(&e.stdout), check_shape(&r.stdout));
    assert_eq!(
        es.1,
        vec![
            "Start data scale check for work load [# key-value pairs, # bytes per key-value, # concurrent clients].",
            "Compacting with revision #",
            "Compacted with revision #",
            "Defragmenting \"http://#.#.#.#:#\"",
            "Defragmented \"http://#.#.#.#:#\"",
            "PASS: Approximate system memory used : #.# MB.",
        ],
        "etcdctl's datascale output changed: {}",
        show(&e)
    );
    assert_eq!(
        (r.code, &rs),
        (e.code, &es),
        "retcdctl:\n{}\netcdctl:\n{}",
        show(&r),
        show(&e)
    );
    // A prefix that already has keys: exit 3 with etcdctl's hint.
    let put = run_ctl(
        &etcdctl35_bin(),
        &[ep.as_str(), "put", "/etcdctl-check-datascale/x", "1"],
        None,
        &[],
    );
    assert!(put.success());
    let cases = vec![
        (v(&[ep.as_str(), "check", "datascale"]), 3),
        (
            v(&[
                ep.as_str(),
                "check",
                "perf",
                "--prefix=/etcdctl-check-datascale/",
            ]),
            3,
        ),
        (v(&[ep.as_str(), "check", "datascale", "--load", "huge"]), 4),
        (v(&[ep.as_str(), "check", "perf", "--load", "xxl"]), 4),
    ];
    tokio::task::block_in_place(|| assert_cases(&cases));
}

on_etcd_and_target!(
    check_datascale_matches_etcdctl_on_etcd,
    check_datascale_matches_etcdctl_on_target,
    compare_datascale
);

/// `check perf --load s` runs 60 s by design, so it runs once per tool,
/// both at once (on their own prefixes), against the target only (the
/// datascale and bad-input cases above cover real etcd). Whether each
/// check passes depends on the machine's load, so the test asserts the
/// shape: the first bar line as etcdctl draws it, each result line one of
/// etcdctl's (digits masked), in etcdctl's order, and the exit code
/// following the verdict line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_perf_has_etcdctls_shape_on_target() {
    bounded(LIMIT, async {
        let (_c, ep) = one_member(test_flavor()).await;
        let run = |bin: std::path::PathBuf, pfx: &'static str| {
            let ep = ep.clone();
            std::thread::spawn(move || {
                let pf = format!("--prefix={pfx}");
                let mut cmd = std::process::Command::new(bin);
                cmd.env("ETCDCTL_API", "3")
                    .env_remove("ETCDCTL_ENDPOINTS")
                    .args([
                        ep.as_str(),
                        "check",
                        "perf",
                        "--load",
                        "s",
                        &pf,
                        "--auto-compact",
                    ])
                    .stdin(std::process::Stdio::null());
                let o = cmd.output().expect("run check perf");
                Output {
                    stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
                    code: o.status.code().unwrap_or(-1),
                }
            })
        };
        let (e, r) = (
            run(etcdctl35_bin(), "/perf-e/"),
            run(retcdctl_bin(), "/perf-r/"),
        );
        let (e, r) = tokio::task::block_in_place(|| {
            (e.join().expect("etcdctl"), r.join().expect("retcdctl"))
        });
        let allowed: [&[&str]; 4] = [
            &[
                "PASS: Throughput is # writes/s",
                "FAIL: Throughput too low: # writes/s",
            ],
            &[
                "PASS: Slowest request took #.#s",
                "Slowest request took too long: #.#s",
            ],
            &[
                "PASS: Stddev is #.#s",
                "Stddev too high: #.#s",
                "PASS: Stddev is #s",
            ],
            &["PASS", "FAIL"],
        ];
        for (name, o) in [("etcdctl", &e), ("retcdctl", &r)] {
            let (bar, lines) = check_shape(&o.stdout);
            assert_eq!(bar, " 0 / 60    0.00%", "{name}: first bar: {}", show(o));
            let results: Vec<&String> = lines
                .iter()
                .filter(|l| {
                    !l.starts_with("Compact")
                        && !l.starts_with("FAIL: ERROR")
                        && *l != "FAIL: too many errors"
                })
                .collect();
            assert_eq!(results.len(), 4, "{name}: {lines:?}\n{}", show(o));
            for (l, ok) in results.iter().zip(allowed) {
                assert!(
                    ok.contains(&l.as_str()),
                    "{name}: unexpected line {l:?}\n{}",
                    show(o)
                );
            }
            assert!(
                lines.contains(&"Compacting with revision #".to_string()),
                "{name}: {lines:?}"
            );
            let want = if results[3] == "PASS" { 0 } else { 1 };
            assert_eq!(o.code, want, "{name}: exit code vs verdict: {}", show(o));
            assert_eq!(o.stderr, "", "{name}: {}", show(o));
        }
    })
    .await;
}
