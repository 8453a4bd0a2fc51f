//! `retcd-bench floor`: what a lone durable write costs this machine at
//! the least, whatever the server: one request over loopback TCP, one
//! append of its bytes to a file, one `fdatasync`, one answer. No gRPC, no
//! raft, no store: the CPU per request of this loop is the floor under any
//! server's lone-put CPU (etcd's or retcd's) on the same machine and disk.
//!
//! Two more loops measure latency floors: the loopback round trip alone
//! (no file), and the durable write with the append and `fdatasync` done
//! by a second thread the answering thread hands each request to and
//! waits for — the shape of a server whose async workers may not block on
//! the disk (retcd's raft thread). The difference between that loop's
//! latency and the plain one's is what the two hand-offs cost here.

use anyhow::{Context, Result};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct Floor {
    pub requests: u64,
    pub request_bytes: usize,
    pub synced: bool,
    pub requests_per_sec: f64,
    /// CPU (user + system) of the answering thread per request.
    pub server_cpu_us_per_request: f64,
    /// CPU of the requesting thread per request.
    pub client_cpu_us_per_request: f64,
    pub fdatasync_p50_us: f64,
    pub fdatasync_p99_us: f64,
    /// Each request's latency as the client saw it.
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    /// The loopback round trip alone (the same requests, no file).
    pub rtt_p50_us: f64,
    pub rtt_p99_us: f64,
    /// The write's latency with the append (and fdatasync) done by a
    /// second thread: two cross-thread hand-offs per request.
    pub handoff_latency_p50_us: f64,
    /// `handoff_latency_p50_us - latency_p50_us`.
    pub handoff_cost_us: f64,
}

/// How the answering thread handles a request.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Answers at once (the loopback round trip).
    Echo,
    /// Appends (and syncs) itself, then answers.
    Write,
    /// Hands the append (and sync) to a second thread, waits, answers.
    HandOff,
}

/// One loop's measurements.
struct Loop {
    wall: Duration,
    client_cpu: Duration,
    server_cpu: Duration,
    syncs: Vec<Duration>,
    latencies: Vec<Duration>,
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs `total` requests of `bytes` bytes against a thread that appends
/// each to a file in `dir` (with an `fdatasync` when `sync`); then the
/// round-trip and hand-off loops (see the module's doc).
pub fn run(dir: &Path, total: u64, bytes: usize, sync: bool) -> Result<Floor> {
    let w = one_loop(dir, total, bytes, sync, Mode::Write)?;
    let echo = one_loop(dir, total, bytes, sync, Mode::Echo)?;
    let handoff = one_loop(dir, total, bytes, sync, Mode::HandOff)?;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / total.max(1) as f64;
    let (latency_p50_us, handoff_latency_p50_us) =
        (pct(&w.latencies, 0.5), pct(&handoff.latencies, 0.5));
    Ok(Floor {
        requests: total,
        request_bytes: bytes,
        synced: sync,
        requests_per_sec: total as f64 / w.wall.as_secs_f64(),
        server_cpu_us_per_request: per(w.server_cpu),
        client_cpu_us_per_request: per(w.client_cpu),
        fdatasync_p50_us: pct(&w.syncs, 0.5),
        fdatasync_p99_us: pct(&w.syncs, 0.99),
        latency_p50_us,
        latency_p99_us: pct(&w.latencies, 0.99),
        rtt_p50_us: pct(&echo.latencies, 0.5),
        rtt_p99_us: pct(&echo.latencies, 0.99),
        handoff_latency_p50_us,
        handoff_cost_us: handoff_latency_p50_us - latency_p50_us,
    })
}

/// The `p` quantile of `v` in microseconds (0 for none).
fn pct(v: &[Duration], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort();
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

fn one_loop(dir: &Path, total: u64, bytes: usize, sync: bool, mode: Mode) -> Result<Loop> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind loopback")?;
    let addr = listener.local_addr()?;
    let file =
        tempfile::tempfile_in(dir).with_context(|| format!("a file in {}", dir.display()))?;
    let server = std::thread::spawn(move || -> Result<(Duration, Vec<Duration>)> {
        let (mut conn, _) = listener.accept()?;
        conn.set_nodelay(true)?;
        let mut buf = vec![0u8; bytes];
        let mut syncs = Vec::with_capacity(total as usize);
        // the disk thread of the hand-off loop: appends what it is sent,
        // answers with the sync time
        let disk = match mode {
            Mode::HandOff => {
                let (tx, rx) = mpsc::channel::<(Vec<u8>, u64)>();
                let (done_tx, done_rx) = mpsc::channel::<std::io::Result<Duration>>();
                let file = file.try_clone()?;
                std::thread::spawn(move || {
                    for (b, offset) in rx {
                        let r = append(&file, &b, offset, sync);
                        if done_tx.send(r).is_err() {
                            return;
                        }
                    }
                });
                Some((tx, done_rx))
            }
            _ => None,
        };
        let started = thread_cpu();
        let mut offset = 0u64;
        for _ in 0..total {
            conn.read_exact(&mut buf)?;
            let took = match (mode, &disk) {
                (Mode::Echo, _) => None,
                (_, Some((tx, rx))) => {
                    tx.send((buf.clone(), offset))?;
                    Some(rx.recv()??)
                }
                (_, None) => Some(append(&file, &buf, offset, sync)?),
            };
            offset += bytes as u64;
            if sync {
                syncs.extend(took);
            }
            conn.write_all(&buf[..bytes.min(40)])?;
        }
        Ok((thread_cpu() - started, syncs))
    });
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let req = vec![b'x'; bytes];
    let mut answer = vec![0u8; bytes.min(40)];
    let mut latencies = Vec::with_capacity(total as usize);
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    for _ in 0..total {
        let t = Instant::now();
        conn.write_all(&req)?;
        conn.read_exact(&mut answer)?;
        latencies.push(t.elapsed());
    }
    let wall = t0.elapsed();
    let client_cpu = thread_cpu() - cpu0;
    let (server_cpu, syncs) = server
        .join()
        .map_err(|_| anyhow::anyhow!("the answering thread panicked"))??;
    Ok(Loop {
        wall,
        client_cpu,
        server_cpu,
        syncs,
        latencies,
    })
}

/// Appends `b` at `offset`, then (when `sync`) fdatasyncs: the sync's time.
fn append(file: &std::fs::File, b: &[u8], offset: u64, sync: bool) -> std::io::Result<Duration> {
    file.write_all_at(b, offset)?;
    let t = Instant::now();
    if sync {
        file.sync_data()?;
    }
    Ok(t.elapsed())
}

impl Floor {
    pub fn print_text(&self) {
        println!(
            "Floor of a lone {}write ({} requests of {} bytes over loopback TCP, each appended to a file{}):",
            if self.synced { "durable " } else { "" },
            self.requests,
            self.request_bytes,
            if self.synced { " and fdatasynced" } else { "" }
        );
        println!("  Requests/sec:\t{:.1}", self.requests_per_sec);
        println!(
            "  Server CPU per request:\t{:.1} us",
            self.server_cpu_us_per_request
        );
        println!(
            "  Client CPU per request:\t{:.1} us",
            self.client_cpu_us_per_request
        );
        if self.synced {
            println!(
                "  fdatasync p50 / p99:\t{:.1} / {:.1} us",
                self.fdatasync_p50_us, self.fdatasync_p99_us
            );
        }
        println!(
            "  Latency p50 / p99:\t{:.1} / {:.1} us",
            self.latency_p50_us, self.latency_p99_us
        );
        println!(
            "  Loopback round trip p50 / p99 (no file):\t{:.1} / {:.1} us",
            self.rtt_p50_us, self.rtt_p99_us
        );
        println!(
            "  Latency p50 with the write on a second thread:\t{:.1} us (the two hand-offs: {:.1} us)",
            self.handoff_latency_p50_us, self.handoff_cost_us
        );
    }
}
