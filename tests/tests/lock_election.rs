//! Lock and election: the `v3lockpb.Lock` and `v3electionpb.Election`
//! services through the `etcd-client` crate, and `etcdctl lock` / `etcdctl
//! elect` (which run etcd's concurrency recipes client-side over KV, lease
//! and watch), each etcdctl step also run with `retcdctl`. Each test runs
//! against real etcd and retcd in the same run and compares what a client
//! can observe.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, LockOptions, ProclaimOptions, ResignOptions};
use retcd_tests::limit::QUICK as LIMIT;
use retcd_tests::{
    bounded, etcdctl_bin, grpc_error, retcdctl, retcdctl_bin, retry_until, Cluster, Flavor,
};

/// An `etcdctl` (or `retcdctl`) left running in the background (lock
/// holder, candidate, observer); its stdout is collected line by line.
/// Killed by PID on drop.
struct Bg {
    child: Child,
    out: Arc<Mutex<String>>,
}

impl Bg {
    fn spawn(bin: &Path, endpoint: &str, args: &[&str]) -> Bg {
        let mut child = Command::new(bin)
            .env("ETCDCTL_API", "3")
            .env_remove("ETCDCTL_ENDPOINTS")
            .arg(format!("--endpoints={endpoint}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcdctl");
        let out = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("piped stdout");
        let sink = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Bg { child, out }
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until stdout contains `needle`; false on timeout.
    async fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        retry_until(timeout, Duration::from_millis(50), async || {
            self.output().contains(needle).then_some(()).ok_or(())
        })
        .await
        .is_ok()
    }

    /// SIGTERM: etcdctl unlocks / resigns on it. Then waits for the exit.
    fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name/<hex lease>` → `name/<LEASE>`.
fn mask_lease(s: &str) -> String {
    s.lines()
        .map(|l| match l.rsplit_once('/') {
            Some((pfx, id)) if !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit()) => {
                format!("{pfx}/<LEASE>")
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The command line a scenario drives: etcdctl, or retcdctl in its place.
fn tool(retcd_ctl: bool) -> PathBuf {
    if retcd_ctl {
        retcdctl_bin()
    } else {
        etcdctl_bin()
    }
}

/// What one flavour shows for the etcdctl (or retcdctl) lock scenario.
async fn etcdctl_lock_scenario(flavor: Flavor, retcd_ctl: bool) -> Vec<String> {
    let c = Cluster::start(flavor, 1, &[]).await.expect("start");
    let ep = c.endpoints()[0].clone();
    let bin = tool(retcd_ctl);
    let mut seen = Vec::new();

    let args = ["lock", "job", "--", "echo", "ran-under-lock"];
    let out = if retcd_ctl {
        retcdctl(&c.endpoints(), &args)
    } else {
        c.etcdctl(&args)
    };
    push(
        &mut seen,
        format!("exec: code={} out={}", out.code, out.stdout.trim()),
    );

    let mut holder = Bg::spawn(&bin, &ep, &["lock", "L1"]);
    assert!(
        holder.wait_for("L1/", Duration::from_secs(10)).await,
        "{}: holder did not get the lock: {:?}",
        flavor.name(),
        holder.output()
    );
    push(
        &mut seen,
        format!("holder: {}", mask_lease(holder.output().trim())),
    );
    let waiter = Bg::spawn(&bin, &ep, &["lock", "L1", "--", "echo", "second-got-it"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    push(
        &mut seen,
        format!(
            "waiter while held: {:?}",
            waiter.output().contains("second-got-it")
        ),
    );
    holder.terminate();
    push(
        &mut seen,
        format!(
            "waiter after release: {:?}",
            waiter
                .wait_for("second-got-it", Duration::from_secs(15))
                .await
        ),
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_mutual_exclusion_same_as_etcd() {
    bounded(LIMIT, async {
        let want = etcdctl_lock_scenario(Flavor::Etcd, false).await;
        let got = etcdctl_lock_scenario(Flavor::Retcd, false).await;
        assert_eq!(
            want,
            lock_expected(),
            "the scenario itself changed on real etcd"
        );
        assert_eq!(got, want);
    })
    .await;
}

fn lock_expected() -> Vec<String> {
    vec![
        "exec: code=0 out=ran-under-lock".to_string(),
        "holder: L1/<LEASE>".to_string(),
        "waiter while held: false".to_string(),
        "waiter after release: true".to_string(),
    ]
}

/// The same scenario with retcdctl in place of etcdctl, on both servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retcdctl_lock_mutual_exclusion_same_as_etcdctl() {
    bounded(LIMIT, async {
        let on_etcd = etcdctl_lock_scenario(Flavor::Etcd, true).await;
        let on_retcd = etcdctl_lock_scenario(Flavor::Retcd, true).await;
        assert_eq!(on_etcd, lock_expected(), "retcdctl on real etcd");
        assert_eq!(on_retcd, lock_expected(), "retcdctl on retcd");
    })
    .await;
}

async fn etcdctl_elect_scenario(flavor: Flavor, retcd_ctl: bool) -> Vec<String> {
    let c = Cluster::start(flavor, 1, &[]).await.expect("start");
    let ep = c.endpoints()[0].clone();
    let bin = tool(retcd_ctl);
    let mut seen = Vec::new();
    let observer = Bg::spawn(&bin, &ep, &["elect", "-l", "E1"]);
    let mut first = Bg::spawn(&bin, &ep, &["elect", "E1", "v1"]);
    assert!(
        first.wait_for("v1", Duration::from_secs(10)).await,
        "first not leader"
    );
    push(
        &mut seen,
        format!("first: {}", mask_lease(first.output().trim())),
    );
    let second = Bg::spawn(&bin, &ep, &["elect", "E1", "v2"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    push(
        &mut seen,
        format!("second while first leads: {:?}", second.output()),
    );
    first.terminate();
    assert!(
        second.wait_for("v2", Duration::from_secs(15)).await,
        "{}: second never became leader",
        flavor.name()
    );
    push(
        &mut seen,
        format!("second: {}", mask_lease(second.output().trim())),
    );
    assert!(
        observer.wait_for("v2", Duration::from_secs(10)).await,
        "observer missed v2"
    );
    push(
        &mut seen,
        format!("observer: {}", mask_lease(observer.output().trim())),
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_same_as_etcd() {
    bounded(LIMIT, async {
        let want = etcdctl_elect_scenario(Flavor::Etcd, false).await;
        let got = etcdctl_elect_scenario(Flavor::Retcd, false).await;
        assert_eq!(got, want);
    })
    .await;
}

/// The same scenario with retcdctl in place of etcdctl, on both servers,
/// against etcdctl's on real etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retcdctl_elect_same_as_etcdctl() {
    bounded(LIMIT, async {
        let want = etcdctl_elect_scenario(Flavor::Etcd, false).await;
        let on_etcd = etcdctl_elect_scenario(Flavor::Etcd, true).await;
        let on_retcd = etcdctl_elect_scenario(Flavor::Retcd, true).await;
        assert_eq!(on_etcd, want, "retcdctl on real etcd");
        assert_eq!(on_retcd, want, "retcdctl on retcd");
    })
    .await;
}

/// What a client sees of the Lock and Election services, errors included.
/// Records what was seen; `RETCD_TEST_TRACE=1` prints it as it happens.
fn push(seen: &mut Vec<String>, s: String) {
    if std::env::var_os("RETCD_TEST_TRACE").is_some() {
        eprintln!("trace: {s}");
    }
    seen.push(s);
}

async fn service_scenario(flavor: Flavor) -> Vec<String> {
    let c = Cluster::start(flavor, 1, &[]).await.expect("start");
    let mut cl: Client = c.client(0).await.expect("client");
    let mut seen = Vec::new();
    let err = |e: &etcd_client::Error| format!("{:?}", grpc_error(e));

    // Lock: the holder's key is name/<lease hex>; a second locker waits.
    let l1 = cl.lease_grant(30, None).await.expect("grant").id();
    let l2 = cl.lease_grant(30, None).await.expect("grant").id();
    let held = cl
        .lock("svc-lock", Some(LockOptions::new().with_lease(l1)))
        .await
        .expect("lock");
    push(
        &mut seen,
        format!(
            "lock key is name/lease: {}",
            held.key() == format!("svc-lock/{l1:x}").as_bytes()
        ),
    );
    let mut cl2 = cl.clone();
    let waiter = tokio::spawn(async move {
        cl2.lock("svc-lock", Some(LockOptions::new().with_lease(l2)))
            .await
            .map(|r| r.key().to_vec())
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    push(
        &mut seen,
        format!("second lock waits: {}", !waiter.is_finished()),
    );
    cl.unlock(held.key()).await.expect("unlock");
    let k2 = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("second lock acquired in time")
        .expect("join")
        .expect("lock");
    push(
        &mut seen,
        format!(
            "second lock key: {}",
            k2 == format!("svc-lock/{l2:x}").as_bytes()
        ),
    );
    // A lock with an unknown lease fails as the put under it fails.
    match cl
        .lock("svc-lock2", Some(LockOptions::new().with_lease(0x7777)))
        .await
    {
        Ok(_) => push(&mut seen, "lock with unknown lease: ok".into()),
        Err(e) => push(&mut seen, format!("lock with unknown lease: {}", err(&e))),
    }

    // Election.
    match cl.leader("svc-elect").await {
        Ok(_) => push(&mut seen, "leader of empty election: ok".into()),
        Err(e) => push(&mut seen, format!("leader of empty election: {}", err(&e))),
    }
    let a = cl.campaign("svc-elect", "a", l1).await.expect("campaign");
    let leader_key = a.leader().expect("leader key").clone();
    push(
        &mut seen,
        format!(
            "campaign key: {} rev>0: {}",
            leader_key.key() == format!("svc-elect/{l1:x}").as_bytes(),
            leader_key.rev() > 0
        ),
    );
    let v = cl.leader("svc-elect").await.expect("leader");
    push(
        &mut seen,
        format!(
            "leader value: {}",
            String::from_utf8_lossy(v.kv().expect("kv").value())
        ),
    );
    // Observe is a long-lived stream: a client without a request timeout.
    // It starts once the election has a leader: an observer reports the
    // current leader, then watches from the revision after it. Started
    // before the campaign, it could reach the server after the proclaim and
    // see only the proclaimed value (on etcd as on retcd).
    let mut streaming = Client::connect(c.endpoints(), None).await.expect("connect");
    // etcd sends the stream's headers with its first message, so the
    // observer runs in its own task and reports leader values on a channel.
    let (otx, mut orx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let observer = tokio::spawn(async move {
        let mut observe = streaming.observe("svc-elect").await.expect("observe");
        while let Ok(Some(m)) = observe.message().await {
            let v = String::from_utf8_lossy(m.kv().expect("kv").value()).to_string();
            if otx.send(v).is_err() {
                break;
            }
        }
    });
    let mut observed = vec![next_observed(&mut orx).await];
    cl.proclaim(
        "a2",
        Some(ProclaimOptions::new().with_leader(leader_key.clone())),
    )
    .await
    .expect("proclaim");
    observed.push(next_observed(&mut orx).await);
    observer.abort();
    push(&mut seen, format!("observed: {observed:?}"));
    let mut cl3 = cl.clone();
    let b = tokio::spawn(async move { cl3.campaign("svc-elect", "b", l2).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(800)).await;
    push(
        &mut seen,
        format!("second candidate waits: {}", !b.is_finished()),
    );
    cl.resign(Some(ResignOptions::new().with_leader(leader_key.clone())))
        .await
        .expect("resign");
    tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .expect("second elected in time")
        .expect("join")
        .expect("campaign");
    let v = cl.leader("svc-elect").await.expect("leader");
    push(
        &mut seen,
        format!(
            "new leader value: {}",
            String::from_utf8_lossy(v.kv().expect("kv").value())
        ),
    );
    // The resigned leader can no longer proclaim.
    match cl
        .proclaim(
            "stale",
            Some(ProclaimOptions::new().with_leader(leader_key)),
        )
        .await
    {
        Ok(_) => push(&mut seen, "stale proclaim: ok".into()),
        Err(e) => push(&mut seen, format!("stale proclaim: {}", err(&e))),
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_services_same_as_etcd() {
    bounded(LIMIT, async {
        let want = service_scenario(Flavor::Etcd).await;
        let got = service_scenario(Flavor::Retcd).await;
        for line in &want {
            eprintln!("etcd: {line}");
        }
        assert_eq!(got, want);
    })
    .await;
}

/// The next leader value an observer task reported, within 10 s.
async fn next_observed(orx: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(10), orx.recv())
        .await
        .expect("observe in time")
        .expect("observe stream open")
}

/// An Observe of an election with no leader yet. etcd (grpc-go) sends a
/// stream's response headers with its first message, so a client waiting
/// for them (as tonic's does) waits until a leader is elected; the first
/// message then names it.
async fn observe_before_a_leader(flavor: Flavor) -> Vec<String> {
    use retcd_api::etcdserverpb::{lease_client::LeaseClient, LeaseGrantRequest};
    use retcd_api::v3electionpb::{
        election_client::ElectionClient, CampaignRequest, LeaderRequest,
    };
    let c = Cluster::start(flavor, 1, &[]).await.expect("start");
    let ch = c.channel(0).await.expect("connect");
    let name = b"no-leader-yet".to_vec();
    let mut obs = ElectionClient::new(ch.clone());
    let req = LeaderRequest { name: name.clone() };
    let call = tokio::spawn(async move { obs.observe(req).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut seen = vec![format!(
        "response headers before a leader: {}",
        call.is_finished()
    )];
    let lease = LeaseClient::new(ch.clone())
        .lease_grant(LeaseGrantRequest { ttl: 30, id: 0 })
        .await
        .expect("grant")
        .into_inner()
        .id;
    ElectionClient::new(ch)
        .campaign(CampaignRequest {
            name,
            lease,
            value: b"v1".to_vec(),
        })
        .await
        .expect("campaign");
    let mut stream = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("headers once there is a leader")
        .expect("observe task")
        .expect("observe")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("a first message")
        .expect("observe stream")
        .expect("a message");
    let value = first.kv.map(|kv| kv.value).unwrap_or_default();
    seen.push(format!(
        "first message: {}",
        String::from_utf8_lossy(&value)
    ));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_waits_for_a_leader_as_etcd() {
    bounded(LIMIT, async {
        let want = observe_before_a_leader(Flavor::Etcd).await;
        assert_eq!(
            want,
            [
                "response headers before a leader: false",
                "first message: v1"
            ],
            "etcd"
        );
        let got = observe_before_a_leader(Flavor::Retcd).await;
        assert_eq!(got, want);
    })
    .await;
}
