//! One server process (a cluster member) and the signals a test sends it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A member of a test cluster: its flags, data dir, log file and, while it
/// runs, its process. Dropping a `Member` SIGKILLs and reaps its process.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    bin: PathBuf,
    args: Vec<String>,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// Sends `sig` (a name such as `TERM`, `STOP`) to one PID with `kill(1)`.
/// (The workspace forbids `unsafe`, so no direct `libc::kill`.)
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args(["-s", sig, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Member {
    pub(crate) fn new(
        name: String,
        client_port: u16,
        peer_port: u16,
        bin: PathBuf,
        args: Vec<String>,
        data_dir: PathBuf,
        log_path: PathBuf,
    ) -> Member {
        Member {
            name,
            client_port,
            peer_port,
            bin,
            args,
            data_dir,
            log_path,
            child: None,
        }
    }

    /// `http://127.0.0.1:<client port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// `http://127.0.0.1:<peer port>`.
    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// The member's `--data-dir`.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The file that receives the process's stdout and stderr (appended to
    /// across restarts).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The command line flags the member is (re)started with.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Adds flags for the next start (e.g. one member with its own
    /// `--quota-backend-bytes`). Flags must not repeat one already given:
    /// retcd (clap) refuses a repeated flag.
    pub fn add_args(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(|s| s.to_string()));
    }

    /// The PID of the running process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Starts the process with the member's flags and data dir. Panics if it
    /// is already running. Does not wait for it to serve; see
    /// [`crate::Cluster::wait_member_ready`].
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open member log");
        let _ = writeln!(
            log,
            "===== harness: starting {} {}",
            self.bin.display(),
            self.args.join(" ")
        );
        let err = log.try_clone().expect("clone log fd");
        let child = Command::new(&self.bin)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
    }

    /// Restarts a stopped or killed member with the same flags and data dir
    /// (`--initial-cluster-state new` is accepted by etcd on an existing
    /// data dir). Panics if it is still running.
    pub fn restart(&mut self) {
        self.start();
    }

    /// Whether the process is running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(c) => match c.try_wait() {
                Ok(None) => true,
                _ => {
                    self.child = None;
                    false
                }
            },
        }
    }

    /// SIGKILL by PID, then reap. A no-op when not running.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        let _ = c.kill();
        c.wait().ok()
    }

    /// SIGTERM by PID, wait up to 10 s for it to exit, then SIGKILL.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.stop_within(Duration::from_secs(10))
    }

    /// SIGTERM (SIGCONT first, in case it is paused), wait up to `grace`,
    /// then SIGKILL. Returns the exit status.
    pub fn stop_within(&mut self, grace: Duration) -> Option<ExitStatus> {
        let pid = self.pid()?;
        signal(pid, "CONT");
        signal(pid, "TERM");
        if let Some(st) = self.wait_exit(grace) {
            return Some(st);
        }
        self.kill()
    }

    /// SIGSTOP by PID.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "STOP");
        }
    }

    /// SIGCONT by PID.
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "CONT");
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; returns its
    /// status (and forgets the process) if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The whole log (stdout + stderr of every run).
    pub fn log(&self) -> String {
        let mut s = Vec::new();
        if let Ok(mut f) = File::open(&self.log_path) {
            let _ = f.read_to_end(&mut s);
        }
        String::from_utf8_lossy(&s).into_owned()
    }

    /// The last `max_bytes` of the log.
    pub fn log_tail(&self, max_bytes: u64) -> String {
        let mut f = match File::open(&self.log_path) {
            Ok(f) => f,
            Err(e) => return format!("(no log: {e})"),
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(max_bytes)));
        let mut s = Vec::new();
        let _ = f.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}
