//! `retcd-bench floor`: what a lone durable write costs this machine at
//! the least, whatever the server: one request over loopback TCP, one
//! append of its bytes to a file, one `fdatasync`, one answer. No gRPC, no
//! raft, no store: the CPU per request of this loop is the floor under any
//! server's lone-put CPU (etcd's or retcd's) on the same machine and disk.

use anyhow::{Context, Result};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
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
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs `total` requests of `bytes` bytes against a thread that appends
/// each to a file in `dir` (with an `fdatasync` when `sync`).
pub fn run(dir: &Path, total: u64, bytes: usize, sync: bool) -> Result<Floor> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind loopback")?;
    let addr = listener.local_addr()?;
    let file =
        tempfile::tempfile_in(dir).with_context(|| format!("a file in {}", dir.display()))?;
    let server = std::thread::spawn(move || -> Result<(Duration, Vec<Duration>)> {
        let (mut conn, _) = listener.accept()?;
        conn.set_nodelay(true)?;
        let mut buf = vec![0u8; bytes];
        let mut syncs = Vec::with_capacity(total as usize);
        let started = thread_cpu();
        let mut offset = 0u64;
        for _ in 0..total {
            conn.read_exact(&mut buf)?;
            file.write_all_at(&buf, offset)?;
            offset += bytes as u64;
            if sync {
                let t = Instant::now();
                file.sync_data()?;
                syncs.push(t.elapsed());
            }
            conn.write_all(&buf[..bytes.min(40)])?;
        }
        Ok((thread_cpu() - started, syncs))
    });
    let mut conn = TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let req = vec![b'x'; bytes];
    let mut answer = vec![0u8; bytes.min(40)];
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    for _ in 0..total {
        conn.write_all(&req)?;
        conn.read_exact(&mut answer)?;
    }
    let wall = t0.elapsed();
    let client_cpu = thread_cpu() - cpu0;
    let (server_cpu, mut syncs) = server
        .join()
        .map_err(|_| anyhow::anyhow!("the answering thread panicked"))??;
    syncs.sort();
    let pct = |p: f64| {
        syncs
            .get(((syncs.len() as f64 * p) as usize).min(syncs.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    let per = |d: Duration| d.as_secs_f64() * 1e6 / total.max(1) as f64;
    Ok(Floor {
        requests: total,
        request_bytes: bytes,
        synced: sync,
        requests_per_sec: total as f64 / wall.as_secs_f64(),
        server_cpu_us_per_request: per(server_cpu),
        client_cpu_us_per_request: per(client_cpu),
        fdatasync_p50_us: pct(0.5),
        fdatasync_p99_us: pct(0.99),
    })
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
    }
}
