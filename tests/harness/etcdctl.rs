//! Running the real `etcdctl` (v3 API), bounded in time.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::binaries::{etcdctl_bin, retcdctl_bin};

/// Hard bound on one etcdctl run; it is SIGKILLed (by PID) after this.
pub const ETCDCTL_DEADLINE: Duration = Duration::from_secs(30);

/// What an etcdctl run printed and how it exited (`code` is -1 when it was
/// killed by a signal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == 0
    }
}

/// `ETCDCTL_API=3 etcdctl --endpoints=E --dial-timeout=2s --command-timeout=5s ARGS…`
pub fn etcdctl(endpoints: &[String], args: &[&str]) -> Output {
    etcdctl_with_stdin(endpoints, args, None)
}

/// Like [`etcdctl`], feeding `stdin` (e.g. the interactive `txn` form).
pub fn etcdctl_with_stdin(endpoints: &[String], args: &[&str], stdin: Option<&str>) -> Output {
    run_etcdctl(&etcdctl_bin(), endpoints, args, stdin)
}

/// Like [`etcdctl`] with etcdctl 3.5 ([`crate::binaries::etcdctl35_bin`]).
pub fn etcdctl35(endpoints: &[String], args: &[&str]) -> Output {
    run_etcdctl(&crate::binaries::etcdctl35_bin(), endpoints, args, None)
}

/// Like [`etcdctl_with_stdin`] with etcdctl 3.5.
pub fn etcdctl35_with_stdin(endpoints: &[String], args: &[&str], stdin: Option<&str>) -> Output {
    run_etcdctl(&crate::binaries::etcdctl35_bin(), endpoints, args, stdin)
}

/// `retcdctl --endpoints=E --dial-timeout=2s --command-timeout=5s ARGS…`
/// (retcd's etcdctl-compatible command line, [`retcdctl_bin`]), with the
/// same environment, time bound and kill-by-PID as [`etcdctl`].
pub fn retcdctl(endpoints: &[String], args: &[&str]) -> Output {
    retcdctl_with_stdin(endpoints, args, None)
}

/// Like [`retcdctl`], feeding `stdin`.
pub fn retcdctl_with_stdin(endpoints: &[String], args: &[&str], stdin: Option<&str>) -> Output {
    run_etcdctl(&retcdctl_bin(), endpoints, args, stdin)
}

fn run_etcdctl(
    bin: &std::path::Path,
    endpoints: &[String],
    args: &[&str],
    stdin: Option<&str>,
) -> Output {
    let mut full = vec![
        format!("--endpoints={}", endpoints.join(",")),
        "--dial-timeout=2s".to_string(),
        "--command-timeout=5s".to_string(),
    ];
    full.extend(args.iter().map(|s| s.to_string()));
    let full: Vec<&str> = full.iter().map(|s| s.as_str()).collect();
    run_ctl(bin, &full, stdin, &[])
}

/// Runs an etcdctl-like binary with exactly `args` (no default flags),
/// `ETCDCTL_API=3`, no inherited `ETCDCTL_ENDPOINTS`, plus `env`; bounded
/// by [`ETCDCTL_DEADLINE`] (then SIGKILLed by PID).
pub fn run_ctl(
    bin: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
) -> Output {
    run_ctl_within(bin, args, stdin, env, ETCDCTL_DEADLINE)
}

/// [`run_ctl`] with its own deadline, for commands whose own work takes
/// long on a slow machine (`check datascale` writes 10k keys).
pub fn run_ctl_within(
    bin: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
    deadline: Duration,
) -> Output {
    let mut cmd = Command::new(bin);
    cmd.env("ETCDCTL_API", "3").env_remove("ETCDCTL_ENDPOINTS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn etcdctl");
    let pid = child.id();
    if let Some(input) = stdin {
        let mut si = child.stdin.take().expect("stdin piped");
        let input = input.to_string();
        std::thread::spawn(move || {
            let _ = si.write_all(input.as_bytes());
        });
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(deadline) {
        Ok(r) => r.expect("wait for etcdctl"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-s", "KILL", &pid.to_string()])
                .status();
            let r = rx
                .recv()
                .expect("etcdctl waiter")
                .expect("wait for etcdctl");
            return Output {
                stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
                stderr: format!(
                    "{}\n(harness: {} {args:?} killed after {deadline:?})",
                    String::from_utf8_lossy(&r.stderr),
                    bin.display()
                ),
                code: -1,
            };
        }
    };
    Output {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        code: out.status.code().unwrap_or(-1),
    }
}
