//! I/O errors at random: every member runs under libfiu's POSIX preload
//! (Debian's fiu-utils), which makes real system calls fail — `pwrite`,
//! `fdatasync`, `fsync`, `ftruncate` with a random errno (EIO, ENOSPC,
//! EFBIG…), `pread` short or failing — on the WAL, the backend and the
//! snapshot paths alike, while the robustness traffic and watchers run.
//! A member hit by a write error must fail-stop with a clear message
//! (never a panic, never an acknowledgement of what it did not persist);
//! one restarted under read errors either opens or stops saying why;
//! a snapshot it streams is either an error or a file that restores. Then
//! every robustness check (linearizable history, no acknowledged write
//! lost, valid watch streams, equal HashKV). See `docs/robustness.md`.
//!
//! retcd only: etcd's Go binary makes its system calls without libc, out
//! of the preload's reach. Needs `fiu-run`/`fiu-ctrl` (scripts/test.sh
//! installs fiu-utils).

use std::time::Duration;

use retcd_robustness::traffic;
use retcd_tests::binaries::retcdutl_bin;
use retcd_tests::robustness::{phase, repeat, wait_exit, Options, Report, Run};
use retcd_tests::{test_flavor, Flavor};

/// Write-side calls: an error here must stop the member.
const WRITE_POINTS: &[&str] = &[
    "posix/io/rw/pwrite",
    "posix/io/sync/fdatasync",
    "posix/io/sync/fsync",
    "posix/io/rw/ftruncate",
];

/// Read-side calls, failing or short (`/reduce` asks the kernel for fewer
/// bytes than the caller did).
const READ_POINTS: &[&str] = &["posix/io/rw/pread", "posix/io/rw/pread/reduce"];

/// The length of member `i`'s log (it grows across restarts): where what
/// the next fault window causes starts.
fn log_mark(run: &Run, i: usize) -> usize {
    run.rc.cluster.members[i].log().len()
}

/// How member `i` ended after a fault window whose log starts at `mark`:
/// `None` while it still runs. A member that exited must have said why
/// (the I/O error) and must not have panicked.
fn judge_exit(run: &mut Run, i: usize, mark: usize, what: &str) -> Option<bool> {
    let st = wait_exit(&mut run.rc, i, Duration::from_millis(1500)).ok()?;
    let full = run.rc.cluster.members[i].log();
    let log = full.get(mark..).unwrap_or(&full);
    // `retcd: fatal: …` while serving, `retcd: cannot open backend: …` at
    // start: either way the I/O error it met (the OS's, or redb's
    // "Previous I/O error" when the first one was met by a read or inside
    // redb's repair), and no panic.
    let clean = !st.success()
        && log.contains("\nretcd: ")
        && (log.contains("(os error ") || log.contains("I/O error"))
        && !log.contains("panicked at");
    if clean {
        eprintln!("robustness: m{i} fail-stopped on an I/O error ({what}, {st})");
    } else {
        run.notes.push(format!(
            "m{i} exited ({st}) after {what} without a clean fail-stop on the I/O error; log tail:\n{}",
            log.lines().filter(|l| l.contains("\"error\"") || l.contains("\"warn\"") || l.starts_with("retcd")).collect::<Vec<_>>().join("\n")
        ));
    }
    Some(clean)
}

/// Streams a snapshot from member `i` while its reads fail at random: an
/// error is fine, a file must restore (etcd's format with its SHA-256
/// trailer, checked by `retcdutl snapshot restore`).
async fn snapshot_under_read_errors(run: &mut Run, i: usize) -> Option<bool> {
    let eps = run.rc.cluster.endpoints();
    let mut cl = traffic::connect(&eps[i..=i], Duration::from_secs(2))
        .await
        .ok()?;
    let got = traffic::bounded(Duration::from_secs(10), async {
        let mut s = cl.snapshot().await?;
        let mut data = Vec::new();
        while let Some(r) = s.message().await? {
            data.extend_from_slice(r.blob());
        }
        Ok::<_, etcd_client::Error>(data)
    })
    .await;
    let data = match got {
        Ok(d) => d,
        Err(e) => {
            eprintln!("robustness: m{i}'s snapshot under read errors failed: {e}");
            return Some(false);
        }
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("snap.db");
    std::fs::write(&file, &data).expect("write the snapshot");
    let out = std::process::Command::new(retcdutl_bin())
        .args(["snapshot", "restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("restored"))
        .output()
        .expect("run retcdutl");
    if out.status.success() {
        eprintln!(
            "robustness: m{i} streamed a {} byte snapshot under read errors; it restores",
            data.len()
        );
    } else {
        run.notes.push(format!(
            "m{i} streamed a snapshot under read errors that does not restore: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Some(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn io_errors_at_random() {
    if test_flavor() == Flavor::Etcd {
        eprintln!("skipped: libfiu cannot reach etcd's Go binary (no libc calls)");
        return;
    }
    repeat("io_errors", 301, |seed| async move {
        let o = Options::new(Flavor::Retcd, 3).with_fiu().flags(&[
            "--snapshot-count",
            "200",
        ]);
        let mut run = Run::start_seeded("io_errors", o, seed).await;
        let (mut stops, mut snapshots) = (0, 0);
        let mut round = 0;
        while run.running(phase()) || stops == 0 && round < 12 {
            round += 1;
            run.sleep_ms(300, 800).await;
            let i = run.pick(3);
            let p = [0.05, 0.1, 0.3, 1.0][run.pick(4)];
            match run.pick(3) {
                0 | 1 => {
                    // Writes fail on a running member (leader or not).
                    let n = 1 + run.pick(WRITE_POINTS.len());
                    let pts = &WRITE_POINTS[..n];
                    eprintln!("robustness: fault: m{i} write errors {pts:?} p={p}");
                    let mark = log_mark(&run, i);
                    if let Err(e) = run.rc.io_faults(i, pts, p) {
                        eprintln!("robustness: m{i}: {e:#}");
                        continue;
                    }
                    run.sleep_ms(500, 1500).await;
                    match judge_exit(&mut run, i, mark, "write errors") {
                        Some(true) => stops += 1,
                        Some(false) => {}
                        None => {
                            let _ = run.rc.io_faults(i, pts, 0.0);
                        }
                    }
                    run.rc.restart(i);
                }
                _ => {
                    // Reads fail: a snapshot streamed now, then a restart
                    // with the same faults from its first call.
                    eprintln!("robustness: fault: m{i} read errors p={p}");
                    if run.rc.io_faults(i, READ_POINTS, p).is_ok() {
                        if let Some(true) = snapshot_under_read_errors(&mut run, i).await {
                            snapshots += 1;
                        }
                        let _ = run.rc.io_faults(i, READ_POINTS, 0.0);
                    }
                    let cmd = READ_POINTS
                        .iter()
                        .map(|pt| format!("enable_random name={pt},probability={}", p / 5.0))
                        .collect::<Vec<_>>()
                        .join("\n");
                    run.rc.set_start_io_faults(i, &cmd);
                    run.rc.kill(i);
                    let mark = log_mark(&run, i);
                    run.rc.restart(i);
                    run.sleep_ms(1500, 2500).await;
                    if let Some(true) = judge_exit(&mut run, i, mark, "a start under read errors") {
                        stops += 1;
                    }
                    run.rc.set_start_io_faults(i, "");
                    run.rc.kill(i);
                    run.rc.restart(i);
                }
            }
        }
        eprintln!(
            "robustness: io_errors: {round} fault rounds, {stops} fail-stops, {snapshots} snapshots streamed under read errors"
        );
        let mut rep: Report = run.finish().await;
        if stops == 0 {
            rep.violations.push(format!(
                "{round} rounds of I/O errors stopped no member: the faults were not applied"
            ));
        }
        rep
    })
    .await;
}
