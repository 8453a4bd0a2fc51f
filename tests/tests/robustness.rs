//! Robustness scenarios: traffic and watchers run while a fault is
//! injected; then the history must be linearizable, the watch streams
//! valid, no acknowledged write lost and HashKV equal on every member.
//! See `docs/robustness.md`.
//!
//! Each scenario prints its seed; `RETCD_ROBUSTNESS_SEED=<n>` replays it.
//! `RETCD_ROBUSTNESS_LONG=<runs>` runs every scenario for that many fresh
//! seeds (and longer). `RETCD_TEST_FLAVOR=etcd` runs the same scenarios
//! against real etcd (failpoint scenarios are retcd-only).
//! Scenarios run one at a time (they share two cores).

use std::time::Duration;

use retcd_robustness::traffic;
use retcd_tests::robustness::{phase, repeat, serial, wait_exit, Options, Run};
use retcd_tests::{member_add_when_healthy, retry_until, test_flavor, Flavor};

fn opts(n: usize) -> Options {
    Options::new(test_flavor(), n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_kill_random_member_repeatedly() {
    repeat("kill_random_member", 101, |seed| async move {
        let mut run =
            Run::start_seeded("kill_random_member", opts(3).with_lease_check(), seed).await;
        while run.running(phase()) {
            run.sleep_ms(700, 1500).await;
            let i = run.pick(3);
            run.rc.kill(i);
            run.sleep_ms(300, 1000).await;
            run.rc.restart(i);
        }
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_kill_leader() {
    repeat("kill_leader", 102, |seed| async move {
        let mut run = Run::start_seeded("kill_leader", opts(3).with_lease_check(), seed).await;
        while run.running(phase()) {
            run.sleep_ms(800, 1500).await;
            let Ok(l) = run.rc.leader().await else {
                continue;
            };
            run.rc.kill(l);
            run.sleep_ms(500, 1200).await;
            run.rc.restart(l);
        }
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_kill_all_at_once() {
    repeat("kill_all", 103, |seed| async move {
        let mut run = Run::start_seeded("kill_all", opts(3), seed).await;
        while run.running(phase()) {
            run.sleep_ms(1000, 2000).await;
            for i in 0..3 {
                run.rc.kill(i);
            }
            run.sleep_ms(100, 500).await;
            for i in 0..3 {
                run.rc.restart(i);
            }
        }
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_pause_leader() {
    repeat("pause_leader", 104, |seed| async move {
        let mut run = Run::start_seeded("pause_leader", opts(3).with_lease_check(), seed).await;
        while run.running(phase()) {
            run.sleep_ms(500, 1000).await;
            let Ok(l) = run.rc.leader().await else {
                continue;
            };
            run.rc.pause(l);
            // Election timeout is 500 ms: stay paused well beyond it.
            run.sleep_ms(1200, 2000).await;
            run.rc.resume(l);
        }
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_partition_leader() {
    repeat("partition_leader", 105, |seed| async move {
        let mut run = Run::start_seeded(
            "partition_leader",
            opts(3).with_proxies().with_lease_check(),
            seed,
        )
        .await;
        while run.running(phase()) {
            run.sleep_ms(500, 1000).await;
            let Ok(l) = run.rc.leader().await else {
                continue;
            };
            eprintln!("robustness: fault: blackhole m{l} (leader)");
            run.rc.proxies[l].blackhole_all(true);
            run.sleep_ms(1500, 2500).await;
            run.rc.proxies[l].blackhole_all(false);
        }
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_blackhole_follower_until_snapshot() {
    repeat("blackhole_until_snapshot", 106, |seed| async move {
        let o = opts(3).with_proxies().flags(&[
            "--snapshot-count",
            "100",
            "--experimental-snapshot-catchup-entries",
            "50",
        ]);
        let mut o = o;
        // Clients talk to m0 and m1 only (m2 is cut off); watchers and
        // serializable reads still use m2.
        o.traffic_members = Some(vec![0, 1]);
        let mut run = Run::start_seeded("blackhole_until_snapshot", o, seed).await;
        let f = 2;
        eprintln!("robustness: fault: blackhole m{f} until it needs a snapshot");
        run.rc.proxies[f].blackhole_all(true);
        // Wait until the others have moved >= 300 entries on (3 snapshots).
        let eps = run.rc.cluster.endpoints();
        let mut cl = retcd_robustness::traffic::connect(&eps[0..2], Duration::from_secs(3))
            .await
            .expect("connect");
        let (start, idx) = raft_index_moved(&mut cl, 300).await;
        eprintln!("robustness: raft index moved from {start} to {idx}; lifting the blackhole");
        run.rc.proxies[f].blackhole_all(false);
        let resumed = std::time::Instant::now();
        while resumed.elapsed() < Duration::from_secs(3) {
            run.sleep_ms(200, 400).await;
        }
        let flavor = run.rc.cluster.flavor;
        let log_has_snapshot = run.rc.cluster.members[f]
            .log()
            .contains("applying snapshot from leader");
        let mut rep = run.finish().await;
        if flavor == Flavor::Retcd && !log_has_snapshot {
            rep.violations.push(format!(
                "m{f} caught up without a snapshot: the scenario did not test what it should"
            ));
        }
        rep
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_drop_half_of_peer_traffic() {
    repeat("drop_peer_traffic", 107, |seed| async move {
        let mut run = Run::start_seeded("drop_peer_traffic", opts(3).with_proxies(), seed).await;
        eprintln!("robustness: fault: drop 50% of peer connections (re-rolled every ~second) on every member");
        for p in &run.rc.proxies {
            p.drop_connections(0.5);
            p.reset();
        }
        while run.running(phase()) {
            run.sleep_ms(600, 1400).await;
            for p in &run.rc.proxies {
                p.reset();
            }
        }
        // A burst of chunk drops too: connections break mid-stream.
        for p in &run.rc.proxies {
            p.drop_rate(retcd_robustness::proxy::Direction::Rx, 0.05);
        }
        run.sleep_ms(1000, 1500).await;
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_delay_peer_traffic_and_kill() {
    repeat("delay_peer_traffic", 108, |seed| async move {
        let mut run = Run::start_seeded("delay_peer_traffic", opts(3).with_proxies(), seed).await;
        eprintln!("robustness: fault: delay peer traffic 60ms ± 40ms on every member");
        for p in &run.rc.proxies {
            for d in [
                retcd_robustness::proxy::Direction::Rx,
                retcd_robustness::proxy::Direction::Tx,
            ] {
                p.delay(d, Duration::from_millis(60), Duration::from_millis(40));
            }
        }
        while run.running(phase()) {
            run.sleep_ms(1500, 2500).await;
            let i = run.pick(3);
            run.rc.kill(i);
            run.sleep_ms(300, 800).await;
            run.rc.restart(i);
        }
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_kubernetes_traffic_compaction_while_watchers_replay() {
    repeat("kubernetes_compaction", 109, |seed| async move {
        let mut o = opts(3);
        o.traffic.kubernetes = true;
        o.traffic.compaction = true;
        let mut run = Run::start_seeded("kubernetes_compaction", o, seed).await;
        // Kill the members the watchers sit on so they resume (replaying
        // history) while compactions run.
        while run.running(phase()) {
            run.sleep_ms(1000, 1800).await;
            let i = run.pick(3);
            run.rc.kill(i);
            run.sleep_ms(600, 1200).await;
            run.rc.restart(i);
        }
        run.finish().await
    })
    .await;
}

/// One member's data dir is a small tmpfs; it is filled up while traffic
/// runs. The member must stop (fail-stop, exit non-zero, on ENOSPC) or
/// refuse writes with an error, never acknowledge what it did not persist;
/// with space freed it restarts and every check passes. Needs root (tmpfs):
/// fails, never passes silently, without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_disk_full() {
    repeat("disk_full", 114, |seed| async move {
        let f = 2;
        // etcd preallocates 64 MB WAL segments: the disk must hold one.
        // retcd preallocates its segments too (64 MiB, best effort): with
        // room for one, a member keeps persisting into that reserved space
        // (correctly) until the segment is full, so this scenario would
        // wait for tens of MiB of traffic. A 40 MiB disk cannot hold the
        // preallocation: the WAL grows as written and the fill reaches it.
        let disk = if test_flavor() == Flavor::Etcd {
            96 << 20
        } else {
            40 << 20
        };
        let o = opts(3).with_small_disk(f, disk);
        let mut run = Run::start_seeded("disk_full", o, seed).await;
        run.sleep_ms(800, 1500).await;
        // The leader's disk for even seeds, a follower's for odd ones.
        let target = if seed % 2 == 0 { f } else { 0 };
        let moved = run.rc.move_leader_to(target).await;
        eprintln!(
            "robustness: m{f} (the small disk) is {}",
            if moved == (target == f) {
                "the leader"
            } else {
                "a follower"
            }
        );
        // 64-512 KiB left: the member's WAL writes or backend growth fail soon.
        let leave = (64 + run.pick(448) as u64) << 10;
        if let Err(e) = run.rc.fill_small_disk(leave) {
            run.notes.push(format!("could not fill m{f}'s disk: {e:#}"));
        }
        let flavor = run.rc.cluster.flavor;
        // Slow traffic may not use up what was left in the first 30 s
        // (seed 10761838939381693264: ~35 revisions/s, 432 KiB left, still
        // running after 60 s): then the disk is filled to the last byte,
        // and the member has 30 s more to fail-stop.
        let mut waited = wait_exit(&mut run.rc, f, Duration::from_secs(30));
        if waited.is_err() {
            match run.rc.fill_small_disk(0) {
                Ok(_) => waited = wait_exit(&mut run.rc, f, Duration::from_secs(30)),
                Err(e) => run
                    .notes
                    .push(format!("could not top up m{f}'s disk: {e:#}")),
            }
        }
        match waited {
            Ok(st) => {
                let log = run.rc.cluster.members[f].log();
                // Rust's "No space left on device (os error 28)", Go's
                // "no space left on device"
                let is_enospc =
                    |l: &str| l.contains("o space left on device") || l.contains("os error 28");
                let enospc = is_enospc(&log);
                let line = log.lines().find(|l| is_enospc(l)).unwrap_or("");
                eprintln!("robustness: m{f} exited with {st} on the full disk: {line}");
                if st.success() || !enospc {
                    run.notes.push(format!(
                        "m{f} exited ({st}) but not by fail-stop on ENOSPC; log tail:\n{}",
                        &log[log.len().saturating_sub(1500)..]
                    ));
                }
            }
            Err(e) => {
                // Still running with a full disk: allowed only if it refuses
                // writes (the checks below then still hold); retcd fail-stops.
                let note = format!("m{f} still running with a full disk: {e}");
                eprintln!("robustness: {note}");
                if flavor == Flavor::Retcd {
                    run.notes.push(note);
                }
            }
        }
        if let Err(e) = run.rc.free_small_disk() {
            run.notes.push(format!("could not free m{f}'s disk: {e:#}"));
        }
        run.rc.restart(f);
        // The member catches up while traffic goes on.
        while run.running(phase()) {
            run.sleep_ms(300, 600).await;
        }
        run.finish().await
    })
    .await;
}

// ---------------------------------------------------------------------------
// Failpoints (retcd only: the failpoints build).

const CRASH_POINTS: &[&str] = &[
    "raft_before_save_wal",
    "raft_after_save_wal",
    "raft_before_commit_backend",
    "raft_after_commit_backend",
    "raft_before_save_snapshot",
    "raft_after_save_snapshot",
    "mvcc_compact",
    // the background write-out of the memtable, before it writes
    "mvcc_write_out",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_crash_at_each_failpoint() {
    if test_flavor() == Flavor::Etcd {
        eprintln!("skipped: failpoints are retcd-only");
        return;
    }
    repeat("crash_at_failpoints", 110, |seed| async move {
        let o = opts(3)
            .with_failpoints()
            .flags(&["--snapshot-count", "100"]);
        let mut run = Run::start_seeded("crash_at_failpoints", o, seed).await;
        let long = retcd_robustness::seed::long_runs() > 0;
        let per_point = if long {
            Duration::from_secs(4)
        } else {
            Duration::from_millis(1500)
        };
        for (k, fp) in CRASH_POINTS.iter().enumerate() {
            // The leader for half of them, a follower for the others.
            let l = run.rc.leader().await.unwrap_or(0);
            let i = if k % 2 == 0 { l } else { (l + 1) % 3 };
            // Snapshot and compaction points are evaluated rarely: fire at once.
            let after = if fp.contains("snapshot") || *fp == "mvcc_compact" {
                0
            } else if *fp == "mvcc_write_out" {
                // every 100 ms under load
                run.pick(5)
            } else {
                20 + run.pick(200)
            };
            let spec = format!("{fp}={after}*off->return");
            eprintln!("robustness: fault: m{i} restarted with FAILPOINTS={spec}");
            run.rc.set_failpoints(i, &spec);
            run.rc.kill(i);
            run.rc.restart(i);
            let member = &mut run.rc.cluster.members[i];
            let crashed = retry_until(per_point * 3, Duration::from_millis(50), async || {
                (!member.is_running()).then_some(()).ok_or(())
            })
            .await
            .is_ok();
            eprintln!(
                "robustness: m{i} {} at {fp}",
                if crashed { "crashed" } else { "did not reach" }
            );
            run.rc.set_failpoints(i, "");
            run.rc.restart(i);
            tokio::time::sleep(per_point).await;
        }
        run.finish().await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_fsync_error_stops_the_node() {
    fail_stop(FailStop {
        name: "fsync_error",
        base_seed: 111,
        fp: "raft_wal_fsync_error",
        after: (30, 100),
        what: "the fsync error",
        logged: &[],
        stopped_by: &["failed to save to the WAL"],
    })
    .await;
}

/// A background write-out of the memtable that fails (as a disk error
/// would) stops the member, which then restarts with everything it
/// acknowledged (the WAL replays what redb lacks).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_backend_write_error_stops_the_node() {
    fail_stop(FailStop {
        name: "backend_write_error",
        base_seed: 117,
        fp: "mvcc_write_out_error",
        after: (2, 10),
        what: "the write-out error",
        logged: &["failpoint mvcc_write_out_error: failing"],
        // a lease, auth or alarm batch may reach the error first
        stopped_by: &[
            "failed to commit to the backend durably",
            "failed to begin a backend transaction",
        ],
    })
    .await;
}

/// A fault that must stop the member it is injected in; see [`fail_stop`].
#[derive(Clone, Copy)]
struct FailStop {
    name: &'static str,
    base_seed: u64,
    /// The failpoint, armed after `after.0 + pick(after.1)` evaluations.
    fp: &'static str,
    after: (usize, usize),
    /// The fault, in messages.
    what: &'static str,
    /// Lines the member's log must all have.
    logged: &'static [&'static str],
    /// Lines of which the member's log must have one: why it stopped.
    stopped_by: &'static [&'static str],
}

/// retcd only: `f.fp` armed on the leader, then on a follower; each must
/// exit non-zero with its log saying so (`f.logged`, `f.stopped_by`), then
/// restarts without it; the rest of the cluster goes on and every check
/// passes.
async fn fail_stop(f: FailStop) {
    if test_flavor() == Flavor::Etcd {
        eprintln!("skipped: failpoints are retcd-only");
        return;
    }
    repeat(f.name, f.base_seed, |seed| async move {
        let o = opts(3).with_failpoints();
        let mut run = Run::start_seeded(f.name, o, seed).await;
        let what = f.what;
        for round in 0..2 {
            let l = run.rc.leader().await.unwrap_or(0);
            let i = if round == 0 { l } else { (l + 1) % 3 };
            let spec = format!("{}={}*off->return", f.fp, f.after.0 + run.pick(f.after.1));
            eprintln!("robustness: fault: m{i} restarted with FAILPOINTS={spec}");
            run.rc.set_failpoints(i, &spec);
            run.rc.kill(i);
            run.rc.restart(i);
            match wait_exit(&mut run.rc, i, Duration::from_secs(20)) {
                Ok(st) => {
                    let log = run.rc.cluster.members[i].log();
                    if st.success()
                        || !f.logged.iter().all(|l| log.contains(l))
                        || !f.stopped_by.iter().any(|l| log.contains(l))
                    {
                        run.notes
                            .push(format!("m{i} exited ({st}) but not by fail-stop on {what}"));
                    } else {
                        eprintln!("robustness: m{i} stopped on {what} ({st})");
                    }
                }
                Err(e) => run.notes.push(format!("{what} did not stop m{i}: {e}")),
            }
            run.rc.set_failpoints(i, "");
            run.rc.restart(i);
            run.sleep_ms(1000, 1500).await;
        }
        run.finish().await
    })
    .await;
}

/// How often member `i`'s log says failpoint `fp` fired.
fn fired(run: &Run, i: usize, fp: &str) -> usize {
    run.rc.cluster.members[i]
        .log()
        .matches(&format!("failpoint {fp}: crashing"))
        .count()
}

/// Member `i` must stop at failpoint `fp` (armed before; `before` = how
/// often it had fired): a non-zero exit and one more firing in its log, so
/// the scenario cannot pass without the crash. Then it restarts without
/// failpoints.
async fn expect_crash_and_restart(run: &mut Run, i: usize, fp: &str, before: usize) {
    match wait_exit(&mut run.rc, i, Duration::from_secs(30)) {
        Ok(st) if !st.success() && fired(run, i, fp) > before => {
            eprintln!("robustness: m{i} crashed at {fp} ({st})")
        }
        Ok(st) => run.notes.push(format!(
            "m{i} exited ({st}) but failpoint {fp} did not fire: the scenario did not test what it should"
        )),
        Err(e) => run.notes.push(format!(
            "failpoint {fp} never fired on m{i} ({e}): the scenario did not test what it should"
        )),
    }
    run.rc.set_failpoints(i, "");
    run.rc.restart(i);
    if let Err(e) = run
        .rc
        .cluster
        .wait_member_ready(i, Duration::from_secs(40))
        .await
    {
        run.notes.push(format!(
            "m{i} did not recover after the crash at {fp}: {e:#}"
        ));
    }
}

/// Restarts member `i` with failpoint `fp` armed (`return`: crash there).
fn arm(run: &mut Run, i: usize, fp: &str) -> usize {
    let before = fired(run, i, fp);
    let spec = format!("{fp}=return");
    eprintln!("robustness: fault: m{i} restarted with FAILPOINTS={spec}");
    run.rc.set_failpoints(i, &spec);
    run.rc.kill(i);
    run.rc.restart(i);
    before
}

/// Waits until the raft index seen through `members` moved `by` on.
async fn wait_raft_index_moved(run: &Run, members: &[usize], by: u64) {
    let eps = run.rc.cluster.endpoints();
    let eps: Vec<String> = members.iter().map(|&i| eps[i].clone()).collect();
    let Ok(mut cl) = traffic::connect(&eps, Duration::from_secs(3)).await else {
        return;
    };
    let (start, idx) = raft_index_moved(&mut cl, by).await;
    eprintln!("robustness: raft index moved from {start} to {idx}");
}

/// Waits (at most 40 s, then goes on) until the raft index `cl` sees moved
/// `by` on; returns the index at the start and the last one seen.
async fn raft_index_moved(cl: &mut etcd_client::Client, by: u64) -> (u64, u64) {
    let start = cl.status().await.map(|s| s.raft_index()).unwrap_or(0);
    let idx = retry_until(
        Duration::from_secs(40),
        Duration::from_millis(200),
        async || {
            let idx = cl.status().await.map(|s| s.raft_index()).unwrap_or(0);
            if idx >= start + by {
                Ok(idx)
            } else {
                Err(idx)
            }
        },
    )
    .await
    .unwrap_or_else(|idx| idx);
    (start, idx)
}

/// A follower cut off until the leader compacted its log gets a snapshot
/// when the cut is lifted, and crashes while applying it (before the
/// restore, then after it and the WAL snapshot record); restarted without
/// the failpoint it recovers, and every check passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_crash_at_snapshot_apply() {
    if test_flavor() == Flavor::Etcd {
        eprintln!("skipped: failpoints are retcd-only");
        return;
    }
    repeat("crash_at_snapshot_apply", 115, |seed| async move {
        let mut o = opts(3).with_proxies().with_failpoints().flags(&[
            "--snapshot-count",
            "100",
            "--experimental-snapshot-catchup-entries",
            "50",
        ]);
        o.traffic_members = Some(vec![0, 1]);
        let mut run = Run::start_seeded("crash_at_snapshot_apply", o, seed).await;
        let f = 2;
        for fp in ["raft_before_apply_snapshot", "raft_after_apply_snapshot"] {
            if run.rc.leader().await.is_ok_and(|l| l == f) {
                run.rc.move_leader_to(0).await;
            }
            eprintln!("robustness: fault: blackhole m{f} until it needs a snapshot");
            run.rc.proxies[f].blackhole_all(true);
            let before = arm(&mut run, f, fp);
            wait_raft_index_moved(&run, &[0, 1], 300).await;
            eprintln!("robustness: lifting the blackhole of m{f}");
            run.rc.proxies[f].blackhole_all(false);
            expect_crash_and_restart(&mut run, f, fp, before).await;
            run.sleep_ms(500, 1000).await;
        }
        run.finish().await
    })
    .await;
}

/// Membership changes during traffic with crashes at their apply: a
/// learner is added while a follower is armed to crash *before* applying
/// the conf change, then removed while the leader is armed to crash right
/// *after* applying it. Restarted, the members replay the change; every
/// member then lists the same members (the learner gone) and every check
/// passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_crash_at_conf_change() {
    if test_flavor() == Flavor::Etcd {
        eprintln!("skipped: failpoints are retcd-only");
        return;
    }
    repeat("crash_at_conf_change", 116, |seed| async move {
        let o = opts(3).with_failpoints();
        let mut run = Run::start_seeded("crash_at_conf_change", o, seed).await;
        run.sleep_ms(500, 1000).await;
        let eps = run.rc.cluster.endpoints();
        let members_of = |i: usize| {
            let ep = eps[i].clone();
            async move {
                let mut cl = traffic::connect(&[ep], Duration::from_secs(3)).await?;
                let l = traffic::bounded(Duration::from_secs(3), cl.member_list()).await?;
                let mut ids: Vec<(u64, bool)> = l
                    .members()
                    .iter()
                    .map(|m| (m.id(), m.is_learner()))
                    .collect();
                ids.sort_unstable();
                Ok::<_, etcd_client::Error>(ids)
            }
        };
        // Every member lists the same members, `n` of them.
        let agree = |n: usize| async move {
            retry_until(
                Duration::from_secs(20),
                Duration::from_millis(300),
                || async {
                    let mut lists = Vec::new();
                    for i in 0..3 {
                        lists.push(members_of(i).await.map_err(|e| e.to_string())?);
                    }
                    if lists.windows(2).all(|w| w[0] == w[1]) && lists[0].len() == n {
                        Ok(lists[0].clone())
                    } else {
                        Err(format!("member lists differ: {lists:?}"))
                    }
                },
            )
            .await
        };
        // 1. Add a learner; a follower crashes before applying the change.
        let l = run.rc.leader().await.unwrap_or(0);
        let a = (l + 1) % 3;
        let before = arm(&mut run, a, "raft_before_apply_conf_change");
        let _ = run
            .rc
            .cluster
            .wait_member_ready(a, Duration::from_secs(20))
            .await;
        let url = format!("http://127.0.0.1:{}", retcd_tests::free_port());
        let l = run.rc.leader().await.unwrap_or(l);
        let added = async {
            let mut cl = traffic::connect(&eps[l..=l], Duration::from_secs(3)).await?;
            member_add_when_healthy(&mut cl, &url, true, Duration::from_secs(20)).await
        }
        .await;
        let learner = match added {
            Ok(r) => r.member().map(|m| m.id()),
            Err(e) => {
                run.notes.push(format!("adding a learner failed: {e}"));
                None
            }
        };
        eprintln!("robustness: learner {learner:x?} added at {url}");
        expect_crash_and_restart(&mut run, a, "raft_before_apply_conf_change", before).await;
        if let Err(e) = agree(4).await {
            run.notes.push(format!("after the add: {e}"));
        }
        // 2. Remove it; the leader crashes right after applying the change.
        let b = run.rc.leader().await.unwrap_or(0);
        let before = arm(&mut run, b, "raft_after_apply_conf_change");
        let _ = run
            .rc
            .cluster
            .wait_member_ready(b, Duration::from_secs(20))
            .await;
        if !run.rc.move_leader_to(b).await {
            eprintln!(
                "robustness: m{b} did not become leader again; removing through the leader anyway"
            );
        }
        if let Some(id) = learner {
            let l = run.rc.leader().await.unwrap_or(b);
            let removed = async {
                let mut cl = traffic::connect(&eps[l..=l], Duration::from_secs(3)).await?;
                traffic::bounded(Duration::from_secs(5), cl.member_remove(id)).await
            }
            .await;
            eprintln!(
                "robustness: remove learner {id:x} through m{l}: {:?}",
                removed.map(|_| ())
            );
        }
        expect_crash_and_restart(&mut run, b, "raft_after_apply_conf_change", before).await;
        match agree(3).await {
            Ok(ms) if ms.iter().all(|(_, learner)| !learner) => {}
            Ok(ms) => run
                .notes
                .push(format!("the learner is still listed: {ms:?}")),
            Err(e) => run.notes.push(format!("after the remove: {e}")),
        }
        run.finish().await
    })
    .await;
}

/// A deliberately broken build must be caught: the WAL write is skipped
/// (entries acknowledged without being durable), then the member is
/// killed and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_catches_ack_without_wal() {
    if test_flavor() == Flavor::Etcd {
        return;
    }
    let _serial = serial().await;
    let seed = retcd_robustness::seed::seed_for("broken_skip_wal", 112);
    let o = opts(1).with_failpoints();
    let mut run = Run::start_seeded("broken_skip_wal", o, seed).await;
    for _ in 0..3 {
        run.rc.set_failpoints(0, "raft_skip_wal_save=return");
        run.rc.kill(0);
        run.rc.restart(0);
        let _ = run
            .rc
            .cluster
            .wait_member_ready(0, Duration::from_secs(20))
            .await;
        run.sleep_ms(800, 1200).await;
        run.rc.kill(0);
        run.rc.set_failpoints(0, "");
        run.rc.restart(0);
        let _ = run
            .rc
            .cluster
            .wait_member_ready(0, Duration::from_secs(20))
            .await;
        run.sleep_ms(300, 500).await;
    }
    let rep = run.finish().await;
    assert!(
        !rep.ok(),
        "the harness did not notice writes acknowledged without a WAL write (seed {seed})"
    );
    eprintln!(
        "robustness: broken build caught as expected: {}",
        rep.violations[0].lines().next().unwrap_or("")
    );
}

/// A deliberately broken build must be caught: 10% of applied batches lose
/// their first watch event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn robustness_catches_dropped_watch_event() {
    if test_flavor() == Flavor::Etcd {
        return;
    }
    let _serial = serial().await;
    let seed = retcd_robustness::seed::seed_for("broken_watch", 113);
    let o = opts(3).with_failpoints();
    let mut run = Run::start_seeded("broken_watch", o, seed).await;
    for i in 0..3 {
        run.rc.set_failpoints(i, "watch_drop_event=10%return");
        run.rc.kill(i);
        run.rc.restart(i);
        let _ = run
            .rc
            .cluster
            .wait_member_ready(i, Duration::from_secs(20))
            .await;
    }
    // Traffic until the fault has really happened a few times on every
    // member (each watcher watches one member; a drop of a key outside the
    // traffic's prefix, or of a delete the NoDelete watcher filters out, is
    // invisible to the checks, so a few per member), at most 45 s.
    let drops = |run: &Run, i: usize| -> usize {
        run.rc.cluster.members[i]
            .log()
            .lines()
            .filter(|l| {
                l.contains("failpoint watch_drop_event: event not sent") && l.contains("/rb/")
            })
            .count()
    };
    let fewest = |run: &Run| (0..3).map(|i| drops(run, i)).min().unwrap_or(0);
    let started = std::time::Instant::now();
    while run.running(Duration::from_secs(6))
        || (fewest(&run) < 3 && started.elapsed() < Duration::from_secs(45))
    {
        run.sleep_ms(200, 300).await;
    }
    let per_member: Vec<usize> = (0..3).map(|i| drops(&run, i)).collect();
    assert!(
        per_member.iter().all(|&d| d >= 3),
        "watch_drop_event fired on traffic keys only {per_member:?} times per member: the scenario did not test what it should"
    );
    // Keep the broken binary running through the checks.
    let rep = run.finish().await;
    assert!(
        rep.violations
            .iter()
            .any(|v| v.contains("watch") || v.contains("watcher")),
        "the harness did not notice dropped watch events (seed {seed}): {:?}",
        rep.violations
    );
    eprintln!(
        "robustness: broken build caught as expected: {}",
        rep.violations[0]
    );
}
