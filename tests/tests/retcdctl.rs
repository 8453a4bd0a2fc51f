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
    bounded, etcdctl35_bin, retcdctl_bin, run_ctl, test_flavor, Cluster, Flavor, Output,
};
use retcd_tests::{limit::NORMAL as LIMIT, FAST};

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
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let ep = format!("--endpoints={}", c.endpoints()[0]);
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
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let ep = format!("--endpoints={}", c.endpoints()[0]);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_match_etcdctl_on_etcd() {
    let n = bounded(LIMIT, compare_script(Flavor::Etcd, &admin_script())).await;
    assert!(n > 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_match_etcdctl_on_target() {
    let n = bounded(LIMIT, compare_script(test_flavor(), &admin_script())).await;
    assert!(n > 50);
}

/// `watch` (simple and json, `--prefix --prev-kv`, and a command run per
/// event with `ETCD_WATCH_*`): both tools watch the same server while
/// keys change, then are stopped by PID; their outputs must be equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_matches_etcdctl() {
    bounded(LIMIT, async {
        let c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let ep = format!("--endpoints={}", c.endpoints()[0]);
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
