//! One server process (a cluster member) and the signals a test sends it.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use retcd_launch::Process;

/// A member of a test cluster: its flags, data dir, log file and, while it
/// runs, its process (a [`retcd_launch::Process`]). Dropping a `Member`
/// SIGKILLs and reaps its process.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    /// The address it listens on (127.0.0.1, or its namespaced host's).
    pub host: String,
    bin: PathBuf,
    args: Vec<String>,
    data_dir: PathBuf,
    log_path: PathBuf,
    process: Option<Process>,
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
            host: "127.0.0.1".into(),
            bin,
            args,
            data_dir,
            log_path,
            process: None,
        }
    }

    /// The same member listening on `host` (a namespaced host's address).
    pub(crate) fn with_host(mut self, host: String) -> Member {
        self.host = host;
        self
    }

    /// The server binary it runs.
    pub fn binary(&self) -> &Path {
        &self.bin
    }

    /// `http://<host>:<client port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.client_port)
    }

    /// `http://<host>:<peer port>`.
    pub fn peer_url(&self) -> String {
        format!("http://{}:{}", self.host, self.peer_port)
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
    /// `--quota-backend-bytes`). A repeated flag: the last one wins, as in
    /// Go's flag package.
    pub fn add_args(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(|s| s.to_string()));
    }

    /// Replaces the flags for the next start.
    pub fn set_args(&mut self, args: &[&str]) {
        self.args = args.iter().map(|s| s.to_string()).collect();
    }

    /// The PID of the running process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Process::pid)
    }

    /// The process while it is known to run (it may have exited since).
    pub(crate) fn process_mut(&mut self) -> Option<&mut Process> {
        self.process.as_mut()
    }

    /// Starts the process with the member's flags and data dir. Panics if it
    /// is already running. Does not wait for it to serve; see
    /// [`crate::Cluster::wait_member_ready`].
    pub fn start(&mut self) {
        assert!(self.process.is_none(), "{} is already running", self.name);
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
        let p = Process::spawn(Command::new(&self.bin).args(&self.args), &self.log_path)
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.process = Some(p);
    }

    /// Restarts a stopped or killed member with the same flags and data dir
    /// (`--initial-cluster-state new` is accepted by etcd on an existing
    /// data dir). Panics if it is still running.
    pub fn restart(&mut self) {
        self.start();
    }

    /// Whether the process is running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        let running = self.process.as_mut().is_some_and(Process::is_running);
        if !running {
            self.process = None;
        }
        running
    }

    /// SIGKILL by PID, then reap. A no-op when not running.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.process.take()?.kill()
    }

    /// SIGTERM by PID, wait up to 10 s for it to exit, then SIGKILL.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.stop_within(Duration::from_secs(10))
    }

    /// SIGTERM (SIGCONT first, in case it is paused), wait up to `grace`,
    /// then SIGKILL. Returns the exit status.
    pub fn stop_within(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.process.take()?.stop_within(grace)
    }

    /// SIGSTOP by PID.
    pub fn pause(&self) {
        if let Some(p) = &self.process {
            p.pause();
        }
    }

    /// SIGCONT by PID.
    pub fn resume(&self) {
        if let Some(p) = &self.process {
            p.resume();
        }
    }

    /// Waits up to `timeout` for the process to exit by itself; returns its
    /// status (and forgets the process) if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let st = self.process.as_mut()?.wait_exit(timeout)?;
        self.process = None;
        Some(st)
    }

    /// The whole log (stdout + stderr of every run).
    pub fn log(&self) -> String {
        retcd_launch::read_log(&self.log_path)
    }

    /// The last `max_bytes` of the log.
    pub fn log_tail(&self, max_bytes: u64) -> String {
        retcd_launch::log_tail(&self.log_path, max_bytes)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}
