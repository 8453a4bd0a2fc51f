//! Crash safety: no acknowledged write is lost when a process is SIGKILLed
//! mid-stream and restarted. Runs against the selected flavour
//! (`RETCD_TEST_FLAVOR=etcd` for the real-etcd control).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use retcd_tests::{bounded, retry_until, test_flavor, Cluster};
use retcd_tests::{limit::NORMAL as LIMIT, FAST, READY};

const WRITERS: usize = 4;

/// Concurrent writers putting unique keys `crash/w{w}/{seq:06}` = `val-{w}-{seq}`,
/// recording every put that was acknowledged.
struct Writers {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    tasks: Vec<tokio::task::JoinHandle<usize>>,
}

impl Writers {
    fn start(client: &Client) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let tasks = (0..WRITERS)
            .map(|w| {
                let (stop, acked, mut cl) = (stop.clone(), acked.clone(), client.clone());
                tokio::spawn(async move {
                    let mut failures = 0;
                    // Bounded: at most 100k puts per writer, and the test stops it.
                    for seq in 0..100_000u32 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let (k, v) = (format!("crash/w{w}/{seq:06}"), format!("val-{w}-{seq}"));
                        match cl.put(k.clone(), v.clone(), None).await {
                            Ok(_) => {
                                acked.lock().unwrap().insert(k, v);
                            }
                            Err(_) => {
                                failures += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        Writers { stop, acked, tasks }
    }

    fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    async fn wait_acked(&self, n: usize, timeout: Duration) {
        retry_until(timeout, Duration::from_millis(10), async || {
            let acked = self.acked_count();
            if acked >= n {
                Ok(())
            } else {
                Err(acked)
            }
        })
        .await
        .unwrap_or_else(|acked| panic!("only {acked} of {n} puts acknowledged within {timeout:?}"));
    }

    /// Stops the writers (each finishes its in-flight put, bounded by the
    /// client's request timeout) and returns the acknowledged puts.
    async fn finish(self) -> BTreeMap<String, String> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("writer stops")
                .expect("writer task");
        }
        Arc::try_unwrap(self.acked)
            .expect("no other owner")
            .into_inner()
            .unwrap()
    }
}

/// Asserts every acknowledged put is present with its value, reading
/// through member `i` (linearizable, or serializable).
async fn assert_all_present(
    c: &Cluster,
    i: usize,
    acked: &BTreeMap<String, String>,
    serializable: bool,
) {
    let mut cl = c.client(i).await.expect("connect");
    let mut opts = GetOptions::new().with_prefix();
    if serializable {
        opts = opts.with_serializable();
    }
    let r = cl.get("crash/", Some(opts)).await.expect("read back");
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
    let missing: Vec<&String> = acked
        .keys()
        .filter(|k| got.get(*k) != acked.get(*k))
        .collect();
    assert!(
        missing.is_empty(),
        "member {i}: {} of {} acknowledged puts lost or wrong (first: {:?})",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
    // Nothing appears that no one wrote: every key is some writer's.
    assert!(got.len() >= acked.len());
}

/// Single node: SIGKILL while 4 writers put continuously; after restart
/// every acknowledged put is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_sigkill_loses_no_acknowledged_write() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
        let cl = c.client(0).await.expect("connect");
        let w = Writers::start(&cl);
        w.wait_acked(300, Duration::from_secs(30)).await;
        c.members[0].kill();
        let acked = w.finish().await;
        assert!(acked.len() >= 300);
        c.restart_member(0, READY)
            .await
            .expect("restart after SIGKILL");
        assert_all_present(&c, 0, &acked, false).await;
        assert_all_present(&c, 0, &acked, true).await;
        // And the restarted node takes writes.
        let mut cl = c.client(0).await.expect("connect");
        cl.put("crash/after", "ok", None)
            .await
            .expect("put after restart");
    })
    .await;
}

/// 3 nodes: SIGKILL the leader while writers put through every member;
/// writes continue on the survivors; after the restart every acknowledged
/// put is on every member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sigkill_leader_loses_no_acknowledged_write() {
    bounded(LIMIT, async {
        let mut c = Cluster::start(test_flavor(), 3, FAST).await.expect("start");
        let leader = c.leader(Duration::from_secs(10)).await.expect("leader");
        let survivors: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        // Writers talk to the survivors only, so the run keeps acknowledging
        // writes after the kill (through the new leader).
        let cl = c.client_of(&survivors).await.expect("connect");
        let w = Writers::start(&cl);
        w.wait_acked(300, Duration::from_secs(30)).await;
        c.members[leader].kill();
        let before = w.acked_count();
        w.wait_acked(before + 200, Duration::from_secs(30)).await;
        let acked = w.finish().await;
        c.restart_member(leader, READY)
            .await
            .expect("restart old leader");
        for &i in &survivors {
            assert_all_present(&c, i, &acked, false).await;
        }
        // The restarted member: linearizable (waits for it to catch up),
        // then serializable from its own store.
        assert_all_present(&c, leader, &acked, false).await;
        assert_all_present(&c, leader, &acked, true).await;
    })
    .await;
}
