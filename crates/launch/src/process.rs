//! One spawned server process, its log file, and the signals sent to it.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

/// Sends `sig` (a name such as `TERM`, `STOP`) to one PID with `kill(1)`.
/// (The workspace forbids `unsafe`, so no direct `libc::kill`.)
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The whole of the log file at `path` (empty if there is none).
pub fn read_log(path: &Path) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut s);
    }
    String::from_utf8_lossy(&s).into_owned()
}

/// The last `max_bytes` of the log file at `path`.
pub fn log_tail(path: &Path, max_bytes: u64) -> String {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("(no log: {e})"),
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(max_bytes)));
    let mut s = Vec::new();
    let _ = f.read_to_end(&mut s);
    String::from_utf8_lossy(&s).into_owned()
}

/// A spawned server: its child process and the log file that receives its
/// stdout and stderr. Signals go to its own PID, and only while it has not
/// been reaped (so never to a PID the system reused). Dropping it SIGKILLs
/// and reaps it.
#[derive(Debug)]
pub struct Process {
    child: Child,
    exited: Option<ExitStatus>,
    log: PathBuf,
}

/// Why [`Process::wait_ready`] gave up.
#[derive(Debug)]
pub enum NotReady {
    /// The process exited first, with this status.
    Exited(ExitStatus),
    /// It did not serve in time; the last check's failure.
    Timeout(String),
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::Exited(st) => write!(f, "exited ({st})"),
            NotReady::Timeout(last) => write!(f, "did not serve in time: {last}"),
        }
    }
}

impl std::error::Error for NotReady {}

impl Process {
    /// Spawns `cmd` (program, arguments and environment as the caller set
    /// them; a wrapper such as `taskset` or `sh -c 'exec …'` that execs the
    /// server keeps the PID) with stdin from `/dev/null` and stdout and
    /// stderr appended to `log` (created if missing).
    pub fn spawn(cmd: &mut Command, log: &Path) -> io::Result<Process> {
        let out = OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()?;
        Ok(Process {
            child,
            exited: None,
            log: log.to_path_buf(),
        })
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The whole log (see [`read_log`]).
    pub fn log(&self) -> String {
        read_log(&self.log)
    }

    /// The last `max_bytes` of the log (see [`log_tail`]).
    pub fn log_tail(&self, max_bytes: u64) -> String {
        log_tail(&self.log, max_bytes)
    }

    /// Its exit status if it has exited (reaping it), `None` while it runs.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exited = Some(st);
            }
        }
        self.exited
    }

    /// Whether it is still running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        self.try_exit().is_none()
    }

    /// Sends `sig` to its PID unless it has been reaped.
    pub fn signal(&self, sig: &str) {
        if self.exited.is_none() {
            signal(self.pid(), sig);
        }
    }

    /// SIGSTOP.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// SIGKILL, then reap. Returns the exit status (the earlier one if it
    /// had already exited).
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
        self.exited
    }

    /// Waits up to `timeout` for it to exit by itself; its status if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_exit() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (SIGCONT first, in case it is paused), wait up to `grace`
    /// for it to exit, then SIGKILL. Returns the exit status.
    pub fn stop_within(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.resume();
        self.signal("TERM");
        if let Some(st) = self.wait_exit(grace) {
            return Some(st);
        }
        self.kill()
    }

    /// Waits until the server at `endpoint` (its client URL) answers
    /// `Status` with a leader, trying every 100 ms (each try connects
    /// within 1 s and waits at most `request_timeout` for the answer).
    /// Gives up at once if the process exits, else after `timeout`.
    pub async fn wait_ready(
        &mut self,
        endpoint: &str,
        timeout: Duration,
        request_timeout: Duration,
    ) -> Result<(), NotReady> {
        let deadline = Instant::now() + timeout;
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(request_timeout);
        loop {
            if let Some(st) = self.try_exit() {
                return Err(NotReady::Exited(st));
            }
            let last = match Client::connect([endpoint], Some(opts.clone())).await {
                Err(e) => format!("connect to {endpoint}: {e}"),
                Ok(mut c) => match c.status().await {
                    // With auth enabled Status needs a user (etcd 3.5.32+):
                    // the member serves; /health says whether it has a
                    // leader (https endpoints: serving is enough).
                    Err(e) if is_auth_error(&e) => match health(endpoint).await {
                        Some(true) => return Ok(()),
                        None if endpoint.starts_with("https://") => return Ok(()),
                        _ => format!("{endpoint} has no leader yet (auth on: /health)"),
                    },
                    Err(e) => format!("status of {endpoint}: {e}"),
                    Ok(st) if st.leader() == 0 => format!("{endpoint} has no leader yet"),
                    Ok(_) => return Ok(()),
                },
            };
            if let Some(st) = self.try_exit() {
                return Err(NotReady::Exited(st));
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Timeout(last));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Whether a Status error is the server refusing a request without a user.
fn is_auth_error(e: &etcd_client::Error) -> bool {
    let s = e.to_string();
    s.contains("user name is empty") || s.contains("invalid auth token")
}

/// `GET /health` on a plain `http://host:port` endpoint: whether it says
/// healthy (None: not plain HTTP, or no answer).
async fn health(endpoint: &str) -> Option<bool> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hp = endpoint.strip_prefix("http://")?.trim_end_matches('/');
    let mut s = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(hp))
        .await
        .ok()?
        .ok()?;
    let req = format!("GET /health HTTP/1.1\r\nHost: {hp}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&body).contains("\"health\":\"true\""))
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, log: &Path) -> Process {
        Process::spawn(Command::new("sh").args(["-c", script]), log).expect("spawn sh")
    }

    #[test]
    fn log_is_appended_across_spawns_and_the_status_is_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("p.log");
        let mut p = sh("echo one; echo two >&2; exit 3", &log);
        let st = p.wait_exit(Duration::from_secs(10)).expect("exits");
        assert_eq!(st.code(), Some(3));
        assert!(!p.is_running());
        // Killing an exited process reports its status, signals nothing.
        assert_eq!(p.kill().and_then(|s| s.code()), Some(3));
        let mut q = sh("echo three", &log);
        q.wait_exit(Duration::from_secs(10)).expect("exits");
        assert_eq!(read_log(&log), "one\ntwo\nthree\n");
        assert_eq!(log_tail(&log, 6), "three\n");
        assert!(log_tail(&dir.path().join("none"), 10).starts_with("(no log:"));
    }

    #[test]
    fn stop_within_terms_and_kill_kills() {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("p.log");
        // Exits on SIGTERM by itself.
        let mut p = sh("exec sleep 60", &log);
        assert!(p.is_running());
        let st = p.stop_within(Duration::from_secs(10)).expect("status");
        assert!(!st.success());
        // Ignores SIGTERM: SIGKILLed after the grace period.
        let mut q = sh("trap '' TERM; while :; do sleep 0.05; done", &log);
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let st = q.stop_within(Duration::from_millis(300)).expect("status");
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert!(!st.success());
        assert!(!q.is_running());
    }

    #[tokio::test]
    async fn wait_ready_gives_up_when_the_process_exits() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut p = sh("exit 7", &dir.path().join("p.log"));
        let port = crate::free_port();
        let r = p
            .wait_ready(
                &format!("http://127.0.0.1:{port}"),
                Duration::from_secs(30),
                Duration::from_secs(1),
            )
            .await;
        match r {
            Err(NotReady::Exited(st)) => assert_eq!(st.code(), Some(7)),
            other => panic!("{other:?}"),
        }
    }
}
