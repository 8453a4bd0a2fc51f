//! WAL damage on disk: a torn last record is repaired on restart without
//! losing acknowledged writes; a corrupt record in the middle stops the
//! server with a non-zero exit and an error naming the WAL and the CRC.
//!
//! Written for retcd, which keeps etcd's on-disk layout
//! (`<data-dir>/member/wal/*.wal`, backend `<data-dir>/member/snap/db`).
//! They pass against real etcd too (`RETCD_TEST_FLAVOR=etcd`), which is how
//! the damage patterns were checked to be the ones etcd survives/rejects.

use std::time::Duration;

use etcd_client::GetOptions;
use retcd_tests::wal::{
    flip_middle_byte, last_segment, tear_tail, truncate_last_record, wal_segments,
};
use retcd_tests::{bounded, test_flavor, Cluster};
use retcd_tests::{limit::SHORT as LIMIT, FAST, READY};

const KEYS: usize = 100;

/// Starts a 1-node cluster, writes `KEYS` acknowledged keys and stops the
/// node with SIGTERM.
async fn written_and_stopped() -> Cluster {
    let mut c = Cluster::start(test_flavor(), 1, FAST).await.expect("start");
    let mut cl = c.client(0).await.expect("connect");
    for i in 0..KEYS {
        cl.put(format!("wal/{i:04}"), format!("v{i}"), None)
            .await
            .expect("put");
    }
    let st = c.members[0].stop().expect("was running");
    assert!(!c.members[0].is_running());
    eprintln!("stopped with {st}");
    assert!(!wal_segments(c.members[0].data_dir())
        .expect("wal segments")
        .is_empty());
    c
}

async fn assert_keys_present_and_writable(c: &Cluster) {
    let mut cl = c.client(0).await.expect("connect");
    let r = cl
        .get("wal/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert_eq!(r.kvs().len(), KEYS, "acknowledged keys after restart");
    for (i, kv) in r.kvs().iter().enumerate() {
        assert_eq!(kv.key(), format!("wal/{i:04}").as_bytes());
        assert_eq!(kv.value(), format!("v{i}").as_bytes());
    }
    let rev = r.header().map(|h| h.revision()).unwrap_or(0);
    let p = cl
        .put("wal/zz-after", "ok", None)
        .await
        .expect("put after restart");
    assert_eq!(
        p.header().map(|h| h.revision()),
        Some(rev + 1),
        "the next write gets the next revision"
    );
    let g = cl.get("wal/zz-after", None).await.expect("get");
    assert_eq!(g.kvs().first().map(|kv| kv.value()), Some(&b"ok"[..]));
}

/// The log of the latest run of member 0.
fn last_run_log(c: &Cluster) -> String {
    let log = c.members[0].log();
    match log.rfind("===== harness: starting") {
        Some(p) => log[p..].to_string(),
        None => log,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_torn_tail_record_is_repaired() {
    bounded(LIMIT, async {
        let mut c = written_and_stopped().await;
        let seg = last_segment(c.members[0].data_dir()).expect("segment");
        let at = tear_tail(&seg).expect("tear tail");
        eprintln!("tore {} at offset {at}", seg.display());
        c.restart_member(0, READY)
            .await
            .expect("restart with a torn WAL tail");
        assert_keys_present_and_writable(&c).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_truncated_last_record_is_repaired() {
    bounded(LIMIT, async {
        let mut c = written_and_stopped().await;
        let seg = last_segment(c.members[0].data_dir()).expect("segment");
        let len = truncate_last_record(&seg).expect("truncate");
        eprintln!("truncated {} to {len}", seg.display());
        c.restart_member(0, READY)
            .await
            .expect("restart with a truncated WAL");
        assert_keys_present_and_writable(&c).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_corrupt_middle_record_is_fatal() {
    bounded(LIMIT, async {
        let mut c = written_and_stopped().await;
        let seg = last_segment(c.members[0].data_dir()).expect("segment");
        let at = flip_middle_byte(&seg).expect("flip");
        eprintln!("flipped a byte of {} at offset {at}", seg.display());
        c.members[0].restart();
        let status =
            tokio::task::block_in_place(|| c.members[0].wait_exit(Duration::from_secs(30)));
        let log = last_run_log(&c);
        let status = status
            .unwrap_or_else(|| panic!("still running 30 s after start on a corrupt WAL:\n{log}"));
        assert!(
            !status.success(),
            "exited successfully on a corrupt WAL:\n{log}"
        );
        let lower = log.to_lowercase();
        assert!(
            lower.contains("wal") && lower.contains("crc"),
            "log does not mention the WAL and crc:\n{log}"
        );
    })
    .await;
}
