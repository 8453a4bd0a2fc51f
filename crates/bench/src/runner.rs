//! Connections and the closed-loop request driver shared by every workload.
//!
//! Like etcd's benchmark: `--conns` gRPC connections are opened and
//! `--clients` concurrent clients share them round-robin (client *c* uses
//! connection *c mod conns*). Each client is a tokio task that takes the
//! next request number from a shared counter until `--total` are taken, so
//! the total is exact however fast each client is. With `--rate R` request
//! *i* is not sent before `start + i/R` (an open-loop schedule shared by all
//! clients).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::{Client, ConnectOptions};
use indicatif::{ProgressBar, ProgressStyle};

use crate::report::{new_histogram, process_cpu_secs, Report};

/// Connection-level options (etcd benchmark's global flags).
#[derive(Debug, Clone)]
pub struct ConnOpts {
    pub endpoints: Vec<String>,
    pub conns: usize,
    pub target_leader: bool,
    pub dial_timeout: Duration,
}

/// `host:port` → `http://host:port`.
pub fn normalize_endpoint(e: &str) -> String {
    if e.starts_with("http://") || e.starts_with("https://") {
        e.to_string()
    } else {
        format!("http://{e}")
    }
}

/// One plain HTTP/2 connection to `ep`.
async fn dial(ep: &str, dial_timeout: Duration) -> Result<tonic::transport::Channel> {
    // One plain HTTP/2 connection per client, as etcd's benchmark dials one
    // grpc.ClientConn per client: not etcd-client's balanced channel (a
    // load balancer with endpoint discovery over a single endpoint, extra
    // work per request). No HTTP/2 keep-alive (etcd's benchmark sets
    // none): on an overloaded machine a late PING ack would otherwise fail
    // every in-flight request.
    let url = if ep.contains("://") {
        ep.to_string()
    } else {
        format!("http://{ep}")
    };
    tonic::transport::Endpoint::from_shared(url)
        .with_context(|| format!("endpoint {ep}"))?
        .connect_timeout(dial_timeout)
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connect to {ep}"))
}

async fn connect_one(ep: &str, dial_timeout: Duration) -> Result<Client> {
    let channel = dial(ep, dial_timeout).await?;
    Client::from_channel(
        etcd_client::Channel::Tonic(channel),
        Some(ConnectOptions::new()),
    )
    .await
    .with_context(|| format!("connect to {ep}"))
}

/// The endpoint of the current leader (asks each endpoint's `Status`).
pub async fn leader_endpoint(endpoints: &[String], dial_timeout: Duration) -> Result<String> {
    for ep in endpoints {
        let Ok(mut c) = connect_one(ep, dial_timeout).await else {
            continue;
        };
        let Ok(st) = c.status().await else { continue };
        let me = st.header().map(|h| h.member_id()).unwrap_or(0);
        if me != 0 && me == st.leader() {
            return Ok(ep.clone());
        }
    }
    bail!("no leader found among {endpoints:?}")
}

/// The endpoint of each of the `conns` connections: round-robin over the
/// endpoints (or all the leader with `target_leader`).
async fn conn_endpoints(o: &ConnOpts) -> Result<Vec<String>> {
    let eps: Vec<String> = o.endpoints.iter().map(|e| normalize_endpoint(e)).collect();
    if eps.is_empty() {
        bail!("no endpoints");
    }
    let eps = if o.target_leader {
        vec![leader_endpoint(&eps, o.dial_timeout).await?]
    } else {
        eps
    };
    Ok((0..o.conns.max(1))
        .map(|i| eps[i % eps.len()].clone())
        .collect())
}

/// Opens `conns` clients, spread round-robin over the endpoints (or all to
/// the leader with `target_leader`).
pub async fn connect(o: &ConnOpts) -> Result<Vec<Client>> {
    let mut out = Vec::with_capacity(o.conns.max(1));
    for ep in conn_endpoints(o).await? {
        out.push(connect_one(&ep, o.dial_timeout).await?);
    }
    Ok(out)
}

/// Opens `conns` raw gRPC channels like [`connect`]'s, for workloads that
/// use the generated etcd API directly (the watch benchmark decodes events
/// without copying keys and values).
pub async fn connect_channels(o: &ConnOpts) -> Result<Vec<tonic::transport::Channel>> {
    let mut out = Vec::with_capacity(o.conns.max(1));
    for ep in conn_endpoints(o).await? {
        out.push(dial(&ep, o.dial_timeout).await?);
    }
    Ok(out)
}

/// A progress bar on stderr (hidden when not a terminal or when `show` is false).
pub fn progress(total: u64, show: bool, what: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} {bar:40.cyan/blue} {pos}/{len} [{elapsed_precise}] {per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    pb.set_message(what.to_string());
    pb
}

/// How a closed-loop run is driven.
#[derive(Debug, Clone)]
pub struct Drive {
    pub clients: usize,
    pub total: u64,
    /// Requests per second over all clients; 0 = as fast as possible.
    pub rate: f64,
    pub progress: bool,
}

/// Runs `total` requests over `clients` concurrent tasks. `make_op(c)` gives
/// client *c* its operation; `op(i)` performs request number *i*. Returns
/// the merged report (latency of successful requests only, as etcd does).
pub async fn run<F, Fut>(name: &str, d: &Drive, mut make_op: impl FnMut(usize) -> F) -> Report
where
    F: FnMut(u64) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let pb = progress(d.total, d.progress, name);
    let cpu0 = process_cpu_secs();
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(d.clients);
    for c in 0..d.clients.max(1) {
        let mut op = make_op(c);
        let next = next.clone();
        let pb = pb.clone();
        let total = d.total;
        let rate = d.rate;
        tasks.push(tokio::spawn(async move {
            let mut h = new_histogram();
            let mut errors = 0u64;
            let mut first_error = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                if rate > 0.0 {
                    tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate))
                        .await;
                }
                let t = Instant::now();
                match op(i).await {
                    Ok(()) => h.saturating_record(t.elapsed().as_nanos().max(1) as u64),
                    Err(e) => {
                        errors += 1;
                        if first_error.is_none() {
                            first_error = Some(format!("{e:#}"));
                        }
                    }
                }
                pb.inc(1);
            }
            (h, errors, first_error)
        }));
    }
    let mut h = new_histogram();
    let mut errors = 0;
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok((ch, e, fe)) => {
                h.add(&ch).expect("same histogram bounds");
                errors += e;
                if first_error.is_none() {
                    first_error = fe;
                }
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("client task failed: {e}"));
            }
        }
    }
    let elapsed = start.elapsed();
    pb.finish_and_clear();
    Report::from_histogram(
        name,
        &h,
        elapsed,
        errors,
        first_error,
        process_cpu_secs() - cpu0,
    )
}
