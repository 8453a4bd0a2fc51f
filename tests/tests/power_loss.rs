//! Power loss: every member's data dir on its own ext4 image, switched off
//! without flushing (`retcd_tests::power`: the shutdown ioctl drops every
//! write not yet fsynced) while the robustness traffic and watchers run;
//! the member is killed at the same instant and restarted on the remounted
//! disk. Then every robustness check: no acknowledged write lost, a
//! linearizable history, valid watch streams, equal HashKV, every restart
//! opens. See `docs/robustness.md`.
//!
//! Each power-off proves itself: an unsynced canary file written just
//! before it must be gone after the remount. The broken configuration
//! `--unsafe-no-fsync` must be caught.
//!
//! Needs root (loop mounts). `RETCD_TEST_FLAVOR=etcd` runs the same
//! scenarios against etcd 3.4.23 (the no-fsync check is retcd-only: etcd
//! 3.4 has no such flag).

use retcd_tests::robustness::{phase, repeat, serial, Options, Run};
use retcd_tests::{test_flavor, Flavor};

fn opts(n: usize) -> Options {
    Options::new(test_flavor(), n).with_power_disks()
}

/// All three lose power at one instant, are off `off_ms` (a range), and
/// come back; waits (bounded) until they serve.
async fn power_cycle_all(run: &mut Run, off_ms: (u64, u64)) {
    run.rc.power_loss(&[0, 1, 2]).expect("power loss");
    run.sleep_ms(off_ms.0, off_ms.1).await;
    for i in 0..3 {
        run.rc.restart(i);
    }
    let _ = run.rc.cluster.wait_all_ready(retcd_tests::READY).await;
}

/// One member at a time (a random one, or the leader on even rounds)
/// loses power and comes back 0.3–1 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn power_loss_one_member() {
    repeat("power_loss_one", 301, |seed| async move {
        let mut run = Run::start_seeded("power_loss_one", opts(3).with_lease_check(), seed).await;
        let mut round = 0;
        while run.running(phase()) {
            run.sleep_ms(700, 1500).await;
            let i = match (round % 2, run.rc.leader().await) {
                (0, Ok(l)) => l,
                _ => run.pick(3),
            };
            round += 1;
            run.rc.power_loss(&[i]).expect("power loss");
            run.sleep_ms(300, 1000).await;
            run.rc.restart(i);
        }
        let mut rep = run.finish().await;
        if round == 0 {
            rep.violations.push("no power loss happened".into());
        }
        rep
    })
    .await;
}

/// Every member loses power at the same instant; all come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn power_loss_all_members() {
    repeat("power_loss_all", 302, |seed| async move {
        let mut run = Run::start_seeded("power_loss_all", opts(3), seed).await;
        let mut rounds = 0;
        while run.running(phase()) {
            run.sleep_ms(1000, 2000).await;
            power_cycle_all(&mut run, (100, 500)).await;
            rounds += 1;
        }
        let mut rep = run.finish().await;
        if rounds == 0 {
            rep.violations.push("no power loss happened".into());
        }
        rep
    })
    .await;
}

/// A configuration that does not fsync its WAL must be caught: with
/// `--unsafe-no-fsync` on every member, powering all of them off loses
/// acknowledged writes, and the checks must say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn power_loss_catches_no_fsync() {
    if test_flavor() == Flavor::Etcd {
        eprintln!("skipped: etcd 3.4 has no --unsafe-no-fsync");
        return;
    }
    let _serial = serial().await;
    let seed = retcd_robustness::seed::seed_for("power_loss_no_fsync", 303);
    let o = opts(3).flags(&["--unsafe-no-fsync"]);
    let mut run = Run::start_seeded("power_loss_no_fsync", o, seed).await;
    for _ in 0..3 {
        run.sleep_ms(1000, 1500).await;
        power_cycle_all(&mut run, (0, 0)).await;
    }
    let rep = run.finish().await;
    assert!(
        !rep.ok(),
        "the harness did not notice writes lost by --unsafe-no-fsync (seed {seed})"
    );
    eprintln!(
        "robustness: unsafe configuration caught as expected: {}",
        rep.violations[0].lines().next().unwrap_or("")
    );
}
