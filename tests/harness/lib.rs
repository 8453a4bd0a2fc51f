//! Integration-test harness for retcd.
//!
//! Starts real server processes — retcd or, as a control, the real etcd —
//! on loopback ports, drives them with real clients (`etcdctl` and the
//! `etcd-client` crate) and injects process-level faults (SIGKILL, SIGTERM,
//! SIGSTOP/SIGCONT, WAL file damage).
//!
//! Every test is generic over [`Flavor`]: `RETCD_TEST_FLAVOR=etcd cargo test
//! -p retcd-tests` runs the same assertions against real etcd, which is how
//! the tests themselves are validated.
//!
//! Process hygiene: servers are started with `retcd-launch` (shared with
//! `retcd-bench compare`); every process is signalled by its own PID (never
//! by name), and [`Member`]'s `Drop` SIGKILLs and reaps it, so a failing or
//! panicking test leaves no orphan. When a test panics, [`Cluster`]'s `Drop`
//! prints the tail of every member's log.
//!
//! Shared timings live in [`timing`]: [`FAST`] election flags, [`READY`]
//! and each test file's [`limit`]. Waits for a condition use
//! [`retry_until`].

pub mod binaries;
pub mod cluster;
pub mod etcdctl;
pub mod http;
pub mod membership;
pub mod netns;
pub mod normalize;
pub mod power;
pub mod process;
pub mod random_diff;
pub mod robustness;
pub mod timing;
pub mod tls;
pub mod transcript;
pub mod wal;

pub use binaries::{
    bench_bin, etcd351_bin, etcd_bin, etcdctl35_bin, etcdctl_bin, retcd_bin, retcdctl_bin,
    workspace_root, Flavor,
};
pub use cluster::Cluster;
pub use etcdctl::{etcdctl, etcdctl35, etcdctl_with_stdin, Output};
pub use etcdctl::{etcdctl35_with_stdin, retcdctl, retcdctl_with_stdin, run_ctl, run_ctl_within};
pub use http::{http_get, http_post, http_post_with, HttpResponse};
pub use membership::{initial_cluster_for, member_add_when_healthy};
pub use normalize::{normalize_json, normalize_output, normalize_stderr, normalize_text};
pub use process::Member;
pub use retcd_launch::free_port;
pub use timing::{limit, FAST, READY};
pub use transcript::{assert_same_lines, same_as_etcd};

use std::future::Future;
use std::time::{Duration, Instant};

/// The flavour the flavour-generic tests run against:
/// `RETCD_TEST_FLAVOR=etcd` selects real etcd, anything else (or unset) retcd.
pub fn test_flavor() -> Flavor {
    Flavor::from_env()
}

/// Runs `f` until it returns `Ok`, at most until `timeout` has passed,
/// sleeping `every` between tries. Returns the last error on timeout.
///
/// `f` is tried at least once; the last try is the first one that ends
/// at or after the deadline. It may borrow from its surroundings,
/// mutably too (`async || { n += 1; cl.get(k, None).await }`), and may
/// itself panic on an error no retry can cure. A plain condition is
/// `async || if ok() { Ok(()) } else { Err(what_was_seen) }`.
pub async fn retry_until<T, E>(
    timeout: Duration,
    every: Duration,
    mut f: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(e);
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Bounds a whole test body: panics (so `Drop` cleans up and logs are
/// printed) if `fut` does not finish within `limit`.
pub async fn bounded<T>(limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("test did not finish within {limit:?}"),
    }
}

/// The gRPC status code and message of an etcd-client error, if it is a
/// gRPC status (e.g. `("OutOfRange", "etcdserver: mvcc: required revision has been compacted")`).
pub fn grpc_error(e: &etcd_client::Error) -> Option<(tonic::Code, String)> {
    match e {
        etcd_client::Error::GRpcStatus(s) => Some((s.code(), s.message().to_string())),
        _ => None,
    }
}

/// One key as a Range returns it: key, value, create and mod revision,
/// version, lease.
pub type KvRow = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

/// Every key of a Range response with everything it carries, for comparing
/// what two members (or two servers) serve.
pub fn kv_rows(r: &etcd_client::GetResponse) -> Vec<KvRow> {
    r.kvs()
        .iter()
        .map(|k| {
            (
                k.key().to_vec(),
                k.value().to_vec(),
                k.create_revision(),
                k.mod_revision(),
                k.version(),
                k.lease(),
            )
        })
        .collect()
}
