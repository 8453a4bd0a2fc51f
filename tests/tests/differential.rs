//! Differential tests: the same etcdctl commands (and the same bad gRPC
//! requests) against a fresh 1-node real etcd (the reference) and a fresh
//! 1-node server of the selected flavour (retcd by default; with
//! `RETCD_TEST_FLAVOR=etcd` the target is a second etcd, which checks that
//! the normalisation hides nothing but IDs, terms and ports).
//!
//! Each command is compared on its own (normalised stdout, stderr, exit
//! code); a failure lists every differing command with both outputs.
//! Revisions are compared exactly: both stores start empty.
//!
//! Every script also runs a second time with `retcdctl` (retcd's
//! etcdctl-compatible command line) in place of `etcdctl`, on a second
//! fresh pair of servers (the steps mutate the store, so they cannot run
//! twice on one): retcdctl's normalised output on each server must equal
//! etcdctl's on the same kind of server.

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use retcd_tests::normalize::normalize_output;
use retcd_tests::{bounded, grpc_error, retcdctl_with_stdin, test_flavor, Cluster, Flavor, Output};
use retcd_tests::{limit::NORMAL as LIMIT, FAST};

/// Limits both servers start with besides [`FAST`] (the scripts exercise
/// them).
const LIMITS: &[&str] = &["--max-request-bytes", "1024", "--max-txn-ops", "4"];

/// Flags both servers start with.
fn flags() -> Vec<&'static str> {
    [FAST, LIMITS].concat()
}

/// One etcdctl invocation of a script.
struct Step {
    args: Vec<String>,
    stdin: Option<String>,
    /// Whether the reference (etcd) must exit 0 — a guard against a script
    /// that "agrees" only because both sides failed for a silly reason.
    ok: bool,
}

fn ok(args: &[&str]) -> Step {
    Step {
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: None,
        ok: true,
    }
}

fn err(args: &[&str]) -> Step {
    Step {
        ok: false,
        ..ok(args)
    }
}

fn txn(args: &[&str], stdin: &str, must_succeed: bool) -> Step {
    Step {
        stdin: Some(stdin.to_string()),
        ok: must_succeed,
        ..ok(args)
    }
}

impl Step {
    fn name(&self) -> String {
        let mut s = format!("etcdctl {}", self.args.join(" "));
        if let Some(i) = &self.stdin {
            s.push_str(&format!(" <<< {i:?}"));
        }
        s
    }

    fn run(&self, c: &Cluster) -> Output {
        let args: Vec<&str> = self.args.iter().map(|s| s.as_str()).collect();
        match &self.stdin {
            Some(i) => c.etcdctl_stdin(&args, i),
            None => c.etcdctl(&args),
        }
    }

    /// The same step with `retcdctl`.
    fn run_retcdctl(&self, c: &Cluster) -> Output {
        let args: Vec<&str> = self.args.iter().map(|s| s.as_str()).collect();
        retcdctl_with_stdin(&c.endpoints(), &args, self.stdin.as_deref())
    }
}

/// The one known difference between etcdctl 3.4.23 (the harness's
/// `etcdctl`) and etcdctl 3.5 in these scripts, which retcdctl follows:
/// `txn -w json` names the response of each op `"response_put"` (the
/// protobuf JSON tag) in 3.5 and `"ResponsePut"` (the Go field) in 3.4.
/// Applied only to etcdctl 3.4's output when comparing retcdctl with it.
fn as_etcdctl35(o: &Output) -> Output {
    let mut stdout = o.stdout.clone();
    for (v34, v35) in [
        ("\"ResponseRange\":", "\"response_range\":"),
        ("\"ResponsePut\":", "\"response_put\":"),
        ("\"ResponseDeleteRange\":", "\"response_delete_range\":"),
        ("\"ResponseTxn\":", "\"response_txn\":"),
    ] {
        stdout = stdout.replace(v34, v35);
    }
    Output {
        stdout,
        ..o.clone()
    }
}

fn show(o: &Output) -> String {
    format!(
        "  exit code: {}\n  stdout: {:?}\n  stderr: {:?}",
        o.code, o.stdout, o.stderr
    )
}

/// Starts the reference and the target, runs `steps` in order on both, and
/// panics listing every command whose normalised output differs. A second
/// reference and target run the same steps with `retcdctl`, whose output
/// must equal etcdctl's on the same kind of server.
async fn differential(steps: Vec<Step>) {
    let f = flags();
    let (reference, target, reference2, target2) = tokio::join!(
        Cluster::start(Flavor::Etcd, 1, &f),
        Cluster::start(test_flavor(), 1, &f),
        Cluster::start(Flavor::Etcd, 1, &f),
        Cluster::start(test_flavor(), 1, &f),
    );
    let reference = reference.expect("start reference etcd");
    let target = target.expect("start target");
    let reference2 = reference2.expect("start second reference etcd (retcdctl pass)");
    let target2 = target2.expect("start second target (retcdctl pass)");
    let tname = target.flavor.name();
    let mut failures = Vec::new();
    for (n, step) in steps.iter().enumerate() {
        let (r, t, r2, t2) = tokio::task::block_in_place(|| {
            (
                step.run(&reference),
                step.run(&target),
                step.run_retcdctl(&reference2),
                step.run_retcdctl(&target2),
            )
        });
        assert_eq!(
            r.success(),
            step.ok,
            "script bug: reference etcd gave an unexpected exit code for step {n} `{}`:\n{}",
            step.name(),
            show(&r)
        );
        let (rn, tn) = (normalize_output(&r), normalize_output(&t));
        let (rn2, tn2) = (normalize_output(&r2), normalize_output(&t2));
        let (rn35, tn35) = (as_etcdctl35(&rn), as_etcdctl35(&tn));
        if rn != tn {
            failures.push(format!(
                "step {n}: `{}`\n reference (etcd, normalised):\n{}\n target ({tname}, normalised):\n{}",
                step.name(),
                show(&rn),
                show(&tn)
            ));
        }
        if rn2 != rn35 {
            failures.push(format!(
                "step {n}: `{}` with retcdctl on etcd\n etcdctl on etcd (normalised):\n{}\n retcdctl on etcd (normalised):\n{}",
                step.name(),
                show(&rn35),
                show(&rn2)
            ));
        }
        if tn2 != tn35 {
            failures.push(format!(
                "step {n}: `{}` with retcdctl on {tname}\n etcdctl on {tname} (normalised):\n{}\n retcdctl on {tname} (normalised):\n{}",
                step.name(),
                show(&tn35),
                show(&tn2)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences in {} commands:\n\n{}",
        failures.len(),
        steps.len(),
        failures.join("\n\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_put_get_del() {
    let steps = vec![
        ok(&["put", "foo", "bar"]),
        ok(&["put", "foo1", "bar1"]),
        ok(&["put", "foo2", "bar2"]),
        ok(&["put", "zoo", "z"]),
        ok(&["put", "a/1", "x"]),
        ok(&["put", "a/2", "y"]),
        ok(&["put", "b", "1"]),
        ok(&["put", "foo", "bar-new", "--prev-kv"]),
        ok(&["put", "foo", "bar-new2", "--prev-kv", "-w", "json"]),
        ok(&["put", "fresh", "v", "--prev-kv"]),
        ok(&["put", "fresh2", "v", "-w", "json"]),
        ok(&["get", "foo"]),
        ok(&["get", "foo", "-w", "json"]),
        ok(&["get", "foo", "--prefix"]),
        ok(&["get", "foo", "--prefix", "-w", "json"]),
        ok(&["get", "foo", "--prefix", "--limit", "2"]),
        ok(&["get", "foo", "--prefix", "--limit", "1", "-w", "json"]),
        ok(&["get", "foo", "--prefix", "--keys-only"]),
        ok(&["get", "foo", "--prefix", "--keys-only", "-w", "json"]),
        ok(&["get", "foo", "--prefix", "--print-value-only"]),
        ok(&["get", "a", "--from-key"]),
        ok(&["get", "", "--from-key", "--keys-only"]),
        ok(&["get", "foo", "foo2"]),
        ok(&["get", "foo", "--rev", "2"]),
        ok(&["get", "foo", "--rev", "9", "-w", "json"]),
        ok(&["get", "foo", "--prefix", "--rev", "3"]),
        ok(&[
            "get",
            "",
            "--from-key",
            "--sort-by=MODIFY",
            "--order=DESCEND",
        ]),
        ok(&[
            "get",
            "",
            "--from-key",
            "--sort-by=CREATE",
            "--order=ASCEND",
        ]),
        ok(&["get", "", "--from-key", "--sort-by=VALUE", "--order=ASCEND"]),
        ok(&["get", "", "--from-key", "--sort-by=KEY", "--order=DESCEND"]),
        ok(&[
            "get",
            "",
            "--from-key",
            "--sort-by=VERSION",
            "--order=DESCEND",
            "--limit",
            "3",
        ]),
        ok(&["get", "foo", "--prefix", "--order=DESCEND", "-w", "json"]),
        ok(&["get", "nothing"]),
        ok(&["get", "nothing", "-w", "json"]),
        ok(&["del", "foo2", "--prev-kv"]),
        ok(&["del", "nothing"]),
        ok(&["del", "a", "--prefix"]),
        ok(&["del", "zoo", "-w", "json"]),
        ok(&["del", "fresh", "--from-key", "--prev-kv", "-w", "json"]),
        ok(&["get", "", "--from-key"]),
        ok(&["put", "foo", "again", "-w", "json"]),
        ok(&["get", "foo", "-w", "json"]),
        ok(&["get", "", "--from-key", "-w", "json"]),
    ];
    bounded(LIMIT, differential(steps)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_txn() {
    let steps = vec![
        ok(&["put", "k1", "v1"]),
        ok(&["put", "k2", "v2"]),
        ok(&["put", "k1", "v1b"]),
        txn(
            &["txn"],
            "value(\"k1\") = \"v1b\"\n\nput k3 v3\nget k1\n\nput k4 v4\n\n",
            true,
        ),
        txn(
            &["txn"],
            "value(\"k1\") = \"nope\"\n\nput k3 v3\n\nput k4 v4\nget k2\n\n",
            true,
        ),
        txn(
            &["txn", "-w", "json"],
            "version(\"k1\") = \"2\"\n\nput k5 v5\ndel k4\n\nput k6 v6\n\n",
            true,
        ),
        txn(
            &["txn", "-w", "json"],
            "create(\"k2\") = \"3\"\n\nget k --prefix\n\ndel k1\n\n",
            true,
        ),
        txn(
            &["txn", "-w", "json"],
            "mod(\"k1\") > \"100\"\n\nput x 1\n\nget k1\nget k2\n\n",
            true,
        ),
        txn(
            &["txn"],
            "mod(\"k1\") < \"100\"\nvalue(\"k2\") != \"v2\"\n\nput x 1\n\nput y 2\n\n",
            true,
        ),
        txn(
            &["txn", "-w", "json"],
            "version(\"missing\") = \"0\"\ncreate(\"missing\") = \"0\"\n\nput m 1\n\n\n",
            true,
        ),
        txn(&["txn"], "\nput z1 1\ndel k5\n\n\n", true),
        txn(
            &["txn", "-w", "json"],
            "value(\"k1\") > \"v1\"\n\n\n\n",
            true,
        ),
        // Read-only txns (served without a raft round).
        txn(
            &["txn", "-w", "json"],
            "value(\"k2\") = \"v2\"\n\nget k1\nget k --prefix --limit 2\n\nget k2\n\n",
            true,
        ),
        txn(
            &["txn"],
            "value(\"k2\") = \"zz\"\n\nget k1\n\nget k2 --rev 3\nget k --prefix --keys-only\n\n",
            true,
        ),
        ok(&["get", "", "--from-key", "-w", "json"]),
        // Errors: duplicate key, too many operations (--max-txn-ops 4).
        txn(
            &["txn"],
            "value(\"k1\") = \"v1b\"\n\nput d 1\nput d 2\n\n\n",
            false,
        ),
        txn(
            &["txn"],
            "\n\nput o1 1\nput o2 1\nput o3 1\nput o4 1\nput o5 1\n\n",
            false,
        ),
        txn(
            &["txn", "-w", "json"],
            "\n\nput o1 1\nput o2 1\nput o3 1\nput o4 1\nput o5 1\n\n",
            false,
        ),
        ok(&["get", "o", "--prefix", "--keys-only"]),
        ok(&["get", "", "--from-key", "--keys-only"]),
    ];
    bounded(LIMIT, differential(steps)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_compaction_and_errors() {
    let big = "a".repeat(2000);
    let steps = vec![
        ok(&["put", "k", "v1"]),
        ok(&["put", "k", "v2"]),
        ok(&["put", "k", "v3"]),
        ok(&["put", "k", "v4"]),
        ok(&["put", "k", "v5"]),
        ok(&["get", "k", "--rev", "3"]),
        ok(&["compact", "4"]),
        err(&["get", "k", "--rev", "3"]),
        err(&["get", "k", "--rev", "3", "-w", "json"]),
        ok(&["get", "k", "--rev", "4"]),
        ok(&["get", "k", "--rev", "6", "-w", "json"]),
        err(&["get", "k", "--rev", "100"]),
        err(&["compact", "3"]),
        err(&["compact", "100"]),
        ok(&["compact", "5"]),
        err(&["put", "", "v"]),
        err(&["put", "big", &big]),
        err(&["put", "k", "v", "--lease=1234"]),
        err(&["get", ""]),
        err(&["del", ""]),
        ok(&["get", "", "--from-key", "-w", "json"]),
    ];
    bounded(LIMIT, differential(steps)).await;
}

/// `Ok(summary)` (header revision and, for ranges, count/more/kvs) or
/// `Err((code, message))`.
type GrpcResult = Result<String, (String, String)>;

fn grpc<T>(r: Result<T, etcd_client::Error>, rev: impl Fn(&T) -> String) -> GrpcResult {
    match r {
        Ok(v) => Ok(rev(&v)),
        Err(e) => match grpc_error(&e) {
            Some((code, msg)) => Err((format!("{code:?}"), msg)),
            None => Err(("not a gRPC status".into(), e.to_string())),
        },
    }
}

/// A fixed sequence of requests, good and bad; each result is
/// `(description, expected error?, result)`.
async fn grpc_script(c: &mut Client) -> Vec<(String, bool, GrpcResult)> {
    let mut out = Vec::new();
    macro_rules! step {
        ($name:expr, $bad:expr, $call:expr, $rev:expr) => {
            out.push(($name.to_string(), $bad, grpc($call.await, $rev)))
        };
    }
    fn rev(h: Option<&etcd_client::ResponseHeader>) -> String {
        format!("rev={}", h.map(|h| h.revision()).unwrap_or(-1))
    }
    let put_rev = |r: &etcd_client::PutResponse| rev(r.header());
    let get_rev = |r: &etcd_client::GetResponse| {
        let kvs: Vec<_> = r
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
        format!(
            "{} count={} more={} kvs={kvs:?}",
            rev(r.header()),
            r.count(),
            r.more()
        )
    };
    let del_rev =
        |r: &etcd_client::DeleteResponse| format!("{} deleted={}", rev(r.header()), r.deleted());
    let txn_rev =
        |r: &etcd_client::TxnResponse| format!("{} succeeded={}", rev(r.header()), r.succeeded());
    let cmp_rev = |r: &etcd_client::CompactionResponse| rev(r.header());
    for i in 0..5 {
        step!(
            format!("put k v{i}"),
            false,
            c.put("k", format!("v{i}"), None),
            put_rev
        );
    }
    step!("compact 4", false, c.compact(4, None), cmp_rev);
    step!(
        "range k at compacted rev 3",
        true,
        c.get("k", Some(GetOptions::new().with_revision(3))),
        get_rev
    );
    step!(
        "range k at future rev 100",
        true,
        c.get("k", Some(GetOptions::new().with_revision(100))),
        get_rev
    );
    step!(
        "range k at rev 4",
        false,
        c.get("k", Some(GetOptions::new().with_revision(4))),
        get_rev
    );
    step!(
        "range k count_only",
        false,
        c.get("k", Some(GetOptions::new().with_count_only())),
        get_rev
    );
    step!(
        "range all keys_only limit 1",
        false,
        c.get(
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_keys_only()
                    .with_limit(1)
            )
        ),
        get_rev
    );
    step!(
        "compact 3 (already compacted)",
        true,
        c.compact(3, None),
        cmp_rev
    );
    step!("compact 100 (future)", true, c.compact(100, None), cmp_rev);
    step!("put empty key", true, c.put("", "v", None), put_rev);
    step!("range empty key", true, c.get("", None), get_rev);
    step!("delete empty key", true, c.delete("", None), del_rev);
    step!(
        "put 2000-byte value (--max-request-bytes 1024)",
        true,
        c.put("big", vec![b'a'; 2000], None),
        put_rev
    );
    step!(
        "put with unknown lease",
        true,
        c.put("k", "v", Some(PutOptions::new().with_lease(1234))),
        put_rev
    );
    step!(
        "txn with 5 ops (--max-txn-ops 4)",
        true,
        c.txn(
            Txn::new().and_then(
                (0..5)
                    .map(|i| TxnOp::put(format!("o{i}"), "v", None))
                    .collect::<Vec<_>>()
            )
        ),
        txn_rev
    );
    step!(
        "txn with duplicate put key",
        true,
        c.txn(Txn::new().and_then(vec![TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)])),
        txn_rev
    );
    step!(
        "txn with put and delete of the same key",
        true,
        c.txn(Txn::new().and_then(vec![TxnOp::put("d", "1", None), TxnOp::delete("d", None)])),
        txn_rev
    );
    step!(
        "txn with compare + put (ok)",
        false,
        c.txn(
            Txn::new()
                .when(vec![Compare::value("k", CompareOp::Equal, "v4")])
                .and_then(vec![TxnOp::put("t", "1", None)])
        ),
        txn_rev
    );
    step!(
        "txn range at compacted rev",
        true,
        c.txn(Txn::new().and_then(vec![TxnOp::get(
            "k",
            Some(GetOptions::new().with_revision(2))
        )])),
        txn_rev
    );
    step!(
        "delete prefix k",
        false,
        c.delete("k", Some(DeleteOptions::new().with_prefix())),
        del_rev
    );
    out
}

/// The same bad requests through etcd-client give the same gRPC code and
/// message on both servers (and the good ones the same revision).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_grpc_errors() {
    bounded(LIMIT, async {
        let reference = Cluster::start(Flavor::Etcd, 1, &flags())
            .await
            .expect("start reference etcd");
        let target = Cluster::start(test_flavor(), 1, &flags())
            .await
            .expect("start target");
        let r = grpc_script(&mut reference.client(0).await.expect("connect")).await;
        let t = grpc_script(&mut target.client(0).await.expect("connect")).await;
        let mut failures = Vec::new();
        for ((name, bad, rr), (_, _, tr)) in r.iter().zip(t.iter()) {
            assert_eq!(
                rr.is_err(),
                *bad,
                "script bug: reference gave {rr:?} for `{name}`"
            );
            if rr != tr {
                failures.push(format!(
                    "`{name}`: etcd {rr:?} vs {} {tr:?}",
                    target.flavor.name()
                ));
            }
        }
        // The canonical example, spelled out.
        let compacted = r
            .iter()
            .find(|s| s.0 == "range k at compacted rev 3")
            .expect("step exists");
        assert_eq!(
            compacted.2,
            Err((
                "OutOfRange".into(),
                "etcdserver: mvcc: required revision has been compacted".into()
            ))
        );
        assert!(
            failures.is_empty(),
            "{} requests differ:\n{}",
            failures.len(),
            failures.join("\n")
        );
    })
    .await;
}
