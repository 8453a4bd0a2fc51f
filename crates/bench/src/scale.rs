//! `retcd-bench compare --scale KIND`: how a server's cost grows with the
//! size of its store (`keys`), the number of watchers (`watchers`) and the
//! number of leases (`leases`) — issue 16, "performance at scale".
//!
//! Every point of `--sizes` runs on a fresh 1-node server of each flavour
//! (etcd first in odd runs, retcd first in even ones, as the suite does),
//! `--runs` times, and is stopped before the next: a point never sees
//! another point's data or memory. The tables show medians with the ratio
//! retcd/etcd, `-w json` prints every raw result ([`ScaleResults`]), and
//! `--plot DIR` draws them (see [`crate::plot`]).
//!
//! * `keys`: N keys shaped like kube-apiserver's (`/registry/pods/…`, ~40
//!   bytes, `--value-size` values), `--revisions` puts each, then one
//!   client lists them all three ways — one unary Range, pages of 500 at
//!   the first page's revision (as kube-apiserver pages), and retcd's
//!   `KV.RangeStream` — measuring time, keys received, the server's peak
//!   memory growth and CPU; then the server is restarted on its data dir
//!   and timed until it serves a linearizable Range.
//! * `watchers`: N watchers on one key over S streams, then `--puts` puts
//!   to it: every watcher must see every put; put→event latency, memory
//!   per watcher, server CPU.
//! * `leases`: N leases kept alive (every TTL/3, many per keep-alive
//!   stream) for `--duration` seconds: server CPU, keep-alives answered per
//!   second, and no lease may expire while it is kept alive.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use retcd_api::etcdserverpb::kv_client::KvClient;
use retcd_api::etcdserverpb::lease_client::LeaseClient;
use retcd_api::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, RangeRequest,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::compare::{
    median, ratio, settle_disk, start_with_port_retry, CompareArgs, Flavor, Servers,
};
use crate::report::Report;
use crate::report::{process_cpu_secs, rss_bytes};
use crate::runner::{self, connect, connect_channels, ConnOpts, Drive};
use crate::watch::{self, WatchOpts};

/// What a scale point grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleKind {
    Keys,
    Watchers,
    Leases,
    Compaction,
    Soak,
}

impl ScaleKind {
    pub const ALL: [ScaleKind; 5] = [
        ScaleKind::Keys,
        ScaleKind::Watchers,
        ScaleKind::Leases,
        ScaleKind::Compaction,
        ScaleKind::Soak,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScaleKind::Keys => "keys",
            ScaleKind::Watchers => "watchers",
            ScaleKind::Leases => "leases",
            ScaleKind::Compaction => "compaction",
            ScaleKind::Soak => "soak",
        }
    }

    pub fn parse(s: &str) -> Result<ScaleKind, String> {
        ScaleKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!("{s:?} is neither a scale factor nor a scale kind (keys, watchers, leases, compaction, soak)")
            })
    }

    /// The sizes a full run measures when `--sizes` names none for this kind.
    fn default_sizes(self) -> Vec<u64> {
        match self {
            ScaleKind::Keys => vec![10_000, 100_000, 1_000_000],
            ScaleKind::Watchers | ScaleKind::Leases => vec![1_000, 10_000, 100_000],
            ScaleKind::Compaction => vec![100_000],
            ScaleKind::Soak => vec![3600],
        }
    }
}

/// The scale workloads' flags (used with `--scale KIND` only).
#[derive(Args, Debug, Clone)]
pub struct ScaleOpts {
    /// Sizes of the scale points: `--sizes 1000,10000` for every kind, or
    /// per kind, `--sizes keys=10000,100000,watchers=1000` (repeatable);
    /// `k` and `m` suffixes (10k, 1m). Default: keys 10k,100k,1m; watchers
    /// and leases 1k,10k,100k.
    #[arg(long = "sizes")]
    pub sizes: Vec<String>,
    /// keys: puts per key (the fill writes every key this many times).
    #[arg(long, default_value_t = 1)]
    pub revisions: u64,
    /// keys: value size, bytes.
    #[arg(long, default_value_t = 1024)]
    pub value_size: usize,
    /// watchers: watch streams (default N/10, at most 10000, at least 1).
    #[arg(long)]
    pub streams: Option<usize>,
    /// watchers: puts to the watched key once the watchers are created
    /// (64-byte values: what grows is the number of events, not their size).
    #[arg(long, default_value_t = 1000)]
    pub puts: u64,
    /// watchers: puts per second.
    #[arg(long, default_value_t = 1000.0)]
    pub put_rate: f64,
    /// leases: TTL of each lease, seconds (a keep-alive every TTL/3).
    #[arg(long, default_value_t = 10)]
    pub lease_ttl: i64,
    /// leases: leases kept alive over one LeaseKeepAlive stream.
    #[arg(long, default_value_t = 1000)]
    pub leases_per_stream: usize,
    /// leases: seconds the leases are kept alive (and measured) once granted.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Also draw PNG charts of the scale results into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Give up on one scale point (one server, one size) after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub point_timeout: u64,
    /// keys: the lists to run, of `paginated`, `stream`, `unary` (comma
    /// list or repeated), or `none` (the fill, memory and restart only).
    #[arg(long, value_delimiter = ',', default_value = "paginated,stream,unary")]
    pub lists: Vec<String>,
    /// compaction: puts per key of the fill; the compaction then removes
    /// all but the last (N × (this − 1) revisions).
    #[arg(long, default_value_t = 10)]
    pub compact_revisions: u64,
    /// compaction: seconds of the same puts on the filled store before the
    /// compaction is asked (the baseline its stalls are compared with).
    #[arg(long, default_value_t = 30.0)]
    pub compaction_baseline: f64,
    /// soak (sizes are seconds): k8s operations per second.
    #[arg(long, default_value_t = 2000.0)]
    pub soak_rate: f64,
    /// soak: seconds per sample.
    #[arg(long, default_value_t = 60.0)]
    pub soak_interval: f64,
    /// soak: a Defragment every this many seconds (0: none).
    #[arg(long, default_value_t = 600.0)]
    pub defrag_every: f64,
    /// soak: the members' `--auto-compaction-retention` (periodic mode).
    #[arg(long, default_value = "5m")]
    pub soak_compaction_retention: String,
}

/// How long one scale point may take, seconds: `--point-timeout`, and for
/// a soak at least its duration (its size) plus 10 minutes of set-up.
fn point_limit(kind: ScaleKind, size: u64, point_timeout: u64) -> u64 {
    if kind == ScaleKind::Soak {
        point_timeout.max(size + 600)
    } else {
        point_timeout
    }
}

/// `10000`, `10k`, `1m` → a number.
fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1_000),
        Some((i, 'm' | 'M')) => (&s[..i], 1_000_000),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("size {s:?}: expected a number such as 1000, 10k or 1m"))?;
    if n == 0 {
        bail!("size {s:?} must be positive");
    }
    Ok(n * mul)
}

impl ScaleOpts {
    /// The sizes to run for `kind`, ascending: the `KIND=` list if given,
    /// else the unprefixed one, else the kind's default.
    pub fn sizes_for(&self, kind: ScaleKind) -> Result<Vec<u64>> {
        let (mut own, mut any) = (Vec::new(), Vec::new());
        for arg in &self.sizes {
            // an unprefixed item belongs to the kind named last in this
            // argument (`keys=1,2,watchers=3` → keys 1 and 2, watchers 3)
            let mut current: Option<ScaleKind> = None;
            for item in arg.split(',').filter(|i| !i.trim().is_empty()) {
                let value = match item.split_once('=') {
                    Some((k, v)) => {
                        current =
                            Some(ScaleKind::parse(k.trim()).map_err(|e| anyhow!("--sizes: {e}"))?);
                        v
                    }
                    None => item,
                };
                let n = parse_size(value)?;
                match current {
                    Some(k) if k == kind => own.push(n),
                    Some(_) => {}
                    None => any.push(n),
                }
            }
        }
        let mut v = if !own.is_empty() {
            own
        } else if !any.is_empty() {
            any
        } else {
            kind.default_sizes()
        };
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }

    /// Watch streams for `n` watchers.
    fn streams_for(&self, n: u64) -> usize {
        let n = n as usize;
        self.streams
            .unwrap_or(n / 10)
            .clamp(1, 10_000)
            .min(n.max(1))
    }
}

/// Everything a scale run measured: what `-w json` prints and what
/// `retcd-bench plot --from` reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScaleResults {
    /// `etcd --version`'s first line (empty if etcd did not run).
    pub etcd_version: String,
    pub retcd_version: String,
    pub points: Vec<ScalePoint>,
}

/// One size of one kind on one server in one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScalePoint {
    pub kind: ScaleKind,
    pub size: u64,
    pub run: usize,
    pub flavor: Flavor,
    /// Why the point could not be measured (server did not start, a
    /// request failed, the point timed out). Measures that are wrong but
    /// measured (keys missing from a list) are errors of their own measure.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub keys: Option<KeysResult>,
    #[serde(default)]
    pub watchers: Option<WatchersResult>,
    #[serde(default)]
    pub leases: Option<LeasesResult>,
    #[serde(default)]
    pub compaction: Option<CompactionResult>,
    #[serde(default)]
    pub soak: Option<SoakResult>,
}

/// The `keys` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeysResult {
    pub keys: u64,
    pub revisions: u64,
    pub value_size: usize,
    /// Puts of the fill (keys × revisions), those that failed, and the first failure.
    pub fill_puts: u64,
    pub fill_errors: u64,
    #[serde(default)]
    pub fill_first_error: Option<String>,
    pub fill_secs: f64,
    pub fill_puts_per_sec: f64,
    pub fill_p50_ms: f64,
    pub fill_p99_ms: f64,
    /// Server VmRSS once filled, bytes.
    pub rss_filled_bytes: u64,
    /// Pages of 500 at the first page's revision (run first).
    pub list_paginated: ListResult,
    /// `KV.RangeStream` (run second).
    pub list_stream: ListResult,
    /// One unary Range of the whole prefix (run last: its response is the
    /// largest thing either server builds, and memory a server keeps after
    /// it would hide the other lists' growth).
    pub list_unary: ListResult,
    pub restart: RestartResult,
}

/// Whether a list could be measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListStatus {
    /// Every key came back.
    Ok,
    /// The server does not have the RPC (etcd before 3.7 and RangeStream).
    Unsupported,
    /// It failed, or returned another number of keys than were written.
    Error,
    /// Not run (`--lists`).
    Skipped,
}

/// One way of listing every key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListResult {
    pub status: ListStatus,
    #[serde(default)]
    pub error: Option<String>,
    /// Wall time from the request to the last key, seconds.
    #[serde(default)]
    pub wall_secs: Option<f64>,
    #[serde(default)]
    pub keys_received: Option<u64>,
    /// Responses (pages or stream chunks) it took.
    #[serde(default)]
    pub responses: Option<u64>,
    /// Server VmRSS just before the list, and its peak during it (sampled
    /// every 20 ms), bytes; growth = peak − before.
    #[serde(default)]
    pub rss_before_bytes: Option<u64>,
    #[serde(default)]
    pub rss_peak_bytes: Option<u64>,
    #[serde(default)]
    pub rss_growth_bytes: Option<u64>,
    /// Server CPU seconds spent during the list (10 ms resolution).
    #[serde(default)]
    pub server_cpu_secs: Option<f64>,
    /// This client's CPU seconds during the list (receiving and decoding).
    #[serde(default)]
    pub client_cpu_secs: Option<f64>,
}

impl ListResult {
    fn skipped() -> ListResult {
        ListResult {
            status: ListStatus::Skipped,
            error: None,
            wall_secs: None,
            keys_received: None,
            responses: None,
            rss_before_bytes: None,
            rss_peak_bytes: None,
            rss_growth_bytes: None,
            server_cpu_secs: None,
            client_cpu_secs: None,
        }
    }
}

/// A restart on the same data dir and ports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestartResult {
    /// SIGTERM → exit, seconds.
    pub stop_secs: f64,
    /// Start → first successful linearizable Range, seconds.
    pub ready_secs: f64,
    /// Server VmRSS right after that Range, bytes.
    pub rss_after_bytes: u64,
}

/// The `watchers` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchersResult {
    pub watchers: u64,
    pub streams: usize,
    pub puts: u64,
    pub put_rate: f64,
    pub put_errors: u64,
    pub events_expected: u64,
    pub events_delivered: u64,
    /// expected − delivered (must be 0).
    pub events_missing: u64,
    /// Put send → event receive, ms.
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    /// Events delivered per second, first put to last event.
    pub events_per_sec: f64,
    /// Seconds to create every watcher.
    pub create_secs: f64,
    /// Server VmRSS before the watchers, and with them (before the puts), bytes.
    pub rss_before_bytes: u64,
    pub rss_with_watchers_bytes: u64,
    /// (with − before) / watchers.
    pub rss_per_watcher_bytes: f64,
    /// Server CPU seconds from the first put to the last event.
    pub server_cpu_secs: f64,
}

/// The `leases` measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeasesResult {
    pub leases: u64,
    pub ttl_secs: i64,
    pub streams: usize,
    pub grant_secs: f64,
    pub grant_errors: u64,
    /// Seconds measured once every lease was granted.
    pub duration_secs: f64,
    /// Server CPU seconds over that time, and as a share of one core.
    pub server_cpu_secs: f64,
    pub server_cpu_cores: f64,
    /// Keep-alive responses over that time, per second.
    pub keepalives_per_sec: f64,
    /// Over the whole run: keep-alives sent, answered, answered with TTL
    /// ≤ 0 (the lease was gone), stream failures.
    pub keepalives_sent: u64,
    pub keepalive_responses: u64,
    pub keepalive_expired: u64,
    pub keepalive_errors: u64,
    /// Leases whose TimeToLive was asked at the end, and those of them
    /// already expired (TTL -1; must be 0), and that could not be asked.
    pub sampled: u64,
    pub expired_early: u64,
    pub sample_errors: u64,
    /// Server VmRSS at the end of the duration, bytes.
    pub rss_bytes: u64,
}

/// The `compaction` measures: a store of N keys × `--compact-revisions`
/// puts each is compacted at its head (all but each key's last revision
/// removed) while puts go on at `--put-rate`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompactionResult {
    pub keys: u64,
    pub revisions: u64,
    pub value_size: usize,
    pub fill_puts: u64,
    pub fill_errors: u64,
    pub fill_secs: f64,
    pub fill_puts_per_sec: f64,
    /// Server VmRSS once filled, bytes.
    pub rss_filled_bytes: u64,
    /// The revision compacted at (the head when the compaction was asked).
    pub compact_revision: i64,
    /// Revisions the compaction removes: N × (revisions − 1).
    pub revisions_removed: u64,
    /// `Compact` with `physical` asked → answered (the deletion finished),
    /// seconds.
    pub compact_secs: f64,
    pub put_rate: f64,
    /// Puts sent while the compaction ran, those that failed, and their
    /// latency (send → answer): p50, p99, max, and how many took over 50 ms.
    pub puts: u64,
    pub put_errors: u64,
    pub put_p50_ms: f64,
    pub put_p99_ms: f64,
    pub put_max_ms: f64,
    pub puts_over_50ms: u64,
    /// Server CPU seconds while the compaction ran.
    pub server_cpu_secs: f64,
    /// Server VmRSS peak while the compaction ran, and after it, bytes.
    pub rss_peak_bytes: u64,
    pub rss_after_bytes: u64,
    /// The same puts on the filled store for `--compaction-baseline`
    /// seconds before the compaction: how many, p99, max, over 50 ms.
    #[serde(default)]
    pub baseline_secs: f64,
    #[serde(default)]
    pub baseline_puts: u64,
    #[serde(default)]
    pub baseline_p99_ms: f64,
    #[serde(default)]
    pub baseline_max_ms: f64,
    #[serde(default)]
    pub baseline_over_50ms: u64,
    /// What the members' `/metrics` histograms saw in the baseline window
    /// and while the compaction ran.
    #[serde(default)]
    pub stalls_baseline: Stalls,
    #[serde(default)]
    pub stalls_during: Stalls,
}

/// Slow observations of the histograms a put can wait behind, summed over
/// the members, from their `/metrics` (the same names in etcd and retcd):
/// per histogram, how many took over 32 ms (a bucket bound in both
/// servers' layouts) and the upper bound of the slowest bucket used, ms
/// (0: none; `f64::MAX`: above the last finite bound).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Stalls {
    /// `etcd_disk_wal_fsync_duration_seconds`.
    pub wal_fsync: Slow,
    /// `etcd_disk_backend_commit_duration_seconds`.
    pub backend_commit: Slow,
    /// `etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds`:
    /// one deletion batch (a put's backend write waits behind it).
    pub db_compaction_pause: Slow,
    /// `etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds`.
    pub index_compaction_pause: Slow,
}

/// See [`Stalls`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Slow {
    pub count: u64,
    pub over_32ms: u64,
    pub max_le_ms: f64,
}

/// The four histograms of [`Stalls`]: name and the factor of their unit
/// to milliseconds.
const STALL_HISTOGRAMS: [(&str, f64); 4] = [
    ("etcd_disk_wal_fsync_duration_seconds", 1000.0),
    ("etcd_disk_backend_commit_duration_seconds", 1000.0),
    (
        "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
        1.0,
    ),
    (
        "etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
        1.0,
    ),
];

/// One member's `/metrics` text (HTTP/1.0: no chunked body to undo).
async fn scrape_metrics(endpoint: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let get = async {
        let mut c = tokio::net::TcpStream::connect(&addr).await?;
        c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await?;
        let mut out = String::new();
        c.read_to_string(&mut out).await?;
        anyhow::Ok(out)
    };
    tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .with_context(|| format!("GET {addr}/metrics timed out"))?
        .with_context(|| format!("GET {addr}/metrics"))
}

/// Cumulative bucket counts of histogram `name`: (bound in ms, count),
/// `+Inf` last, summed over the texts given.
fn histogram_ms(texts: &[String], name: &str, to_ms: f64) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out: Vec<(f64, u64)> = Vec::new();
    for t in texts {
        for l in t.lines() {
            let Some(rest) = l.strip_prefix(&prefix) else {
                continue;
            };
            let Some((le, count)) = rest.split_once("\"}") else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                match le.parse::<f64>() {
                    Ok(v) => v * to_ms,
                    Err(_) => continue,
                }
            };
            let count = count.trim().parse::<f64>().unwrap_or(0.0) as u64;
            let same = |b: f64| b == le || (le.is_finite() && (b - le).abs() <= 1e-9 * le);
            match out.iter_mut().find(|(b, _)| same(*b)) {
                Some(x) => x.1 += count,
                None => out.push((le, count)),
            }
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// [`Slow`] of the observations between two scrapes of every member.
fn slow_between(before: &[String], after: &[String], name: &str, to_ms: f64) -> Slow {
    let b = histogram_ms(before, name, to_ms);
    let a = histogram_ms(after, name, to_ms);
    let at = |h: &[(f64, u64)], le: f64| -> u64 {
        h.iter()
            .filter(|(x, _)| *x <= le * (1.0 + 1e-9))
            .map(|x| x.1)
            .max()
            .unwrap_or(0)
    };
    let diff: Vec<(f64, u64)> = a
        .iter()
        .map(|&(le, n)| (le, n.saturating_sub(at(&b, le))))
        .collect();
    let total = diff.last().map(|x| x.1).unwrap_or(0);
    Slow {
        count: total,
        over_32ms: total.saturating_sub(at(&diff, 32.0)),
        // (+Inf, which JSON cannot hold, as f64::MAX)
        max_le_ms: diff
            .iter()
            .find(|x| total > 0 && x.1 == total)
            .map(|x| x.0.min(f64::MAX))
            .unwrap_or(0.0),
    }
}

fn stalls_between(before: &[String], after: &[String]) -> Stalls {
    let [w, c, d, i] =
        STALL_HISTOGRAMS.map(|(name, to_ms)| slow_between(before, after, name, to_ms));
    Stalls {
        wal_fsync: w,
        backend_commit: c,
        db_compaction_pause: d,
        index_compaction_pause: i,
    }
}

async fn scrape_all(s: &Servers) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for ep in &s.endpoints {
        out.push(scrape_metrics(ep).await?);
    }
    Ok(out)
}

/// Latency (ms) of the successful puts among `lat` sent in `[from, to]`,
/// sorted, and how many of those sent then failed.
fn puts_between(lat: &[(Instant, f64, bool)], from: Instant, to: Instant) -> (Vec<f64>, u64) {
    let during: Vec<&(Instant, f64, bool)> = lat
        .iter()
        .filter(|(sent, _, _)| *sent >= from && *sent <= to)
        .collect();
    let mut ok: Vec<f64> = during.iter().filter(|d| d.2).map(|d| d.1).collect();
    ok.sort_by(f64::total_cmp);
    let failed = during.iter().filter(|d| !d.2).count() as u64;
    (ok, failed)
}

/// The `q`th percentile of sorted `v` (0 when empty).
fn pct_sorted(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((q / 100.0) * (v.len() - 1) as f64).round() as usize]
}

/// The `soak` measures: the k8s workload for N seconds at `--soak-rate`
/// operations per second on a member with periodic auto-compaction, a
/// Defragment every `--defrag-every` seconds, one sample per
/// `--soak-interval`. Flat means: RSS and p99 do not grow after the
/// warm-up (the first tenth of the samples).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakResult {
    pub duration_secs: f64,
    pub rate: f64,
    pub interval_secs: f64,
    pub defrag_every_secs: f64,
    pub samples: Vec<SoakSample>,
    pub ops: u64,
    pub errors: u64,
    pub defrags: u64,
    pub defrag_errors: u64,
    /// Watch events the informers received.
    pub watch_events: u64,
    /// RSS of the first sample after the warm-up and of the last; the largest.
    pub rss_start_bytes: u64,
    pub rss_end_bytes: u64,
    pub rss_max_bytes: u64,
    /// p99 of the first sample after the warm-up and of the last.
    pub p99_start_ms: f64,
    pub p99_end_ms: f64,
    /// Least-squares slopes over the samples after the warm-up.
    pub rss_slope_mib_per_hour: f64,
    pub p99_slope_ms_per_hour: f64,
}

/// One interval of a soak.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakSample {
    /// End of the interval, seconds from the start of the timed run.
    pub t_secs: f64,
    pub ops_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    pub rss_bytes: u64,
    pub db_size_bytes: i64,
    /// Server CPU seconds over the interval.
    pub server_cpu_secs: f64,
}

/// The binaries of the run and their `--version` lines.
pub struct Bins {
    pub etcd: Option<(String, PathBuf)>,
    pub retcd: Option<(String, PathBuf)>,
}

/// Runs every size of every kind on each server, prints the tables (or the
/// JSON), draws the charts if asked; fails at the end if any point failed.
pub async fn run(
    a: &CompareArgs,
    kinds: &[ScaleKind],
    bins: &Bins,
    flavors: &[Flavor],
    root: &Path,
    json: bool,
) -> Result<()> {
    let o = &a.scale_opts;
    let plan: Vec<(ScaleKind, Vec<u64>)> = kinds
        .iter()
        .map(|&k| Ok((k, o.sizes_for(k)?)))
        .collect::<Result<_>>()?;
    for (k, sizes) in &plan {
        eprintln!("scale: {:<8} sizes {sizes:?}", k.name());
    }
    let mut points = Vec::new();
    for (kind, sizes) in &plan {
        for &size in sizes {
            for run in 1..=a.runs.max(1) {
                let mut order = flavors.to_vec();
                if run % 2 == 0 {
                    order.reverse();
                }
                for f in order {
                    let bin = match f {
                        Flavor::Etcd => &bins.etcd,
                        Flavor::Retcd => &bins.retcd,
                    }
                    .as_ref()
                    .map(|b| b.1.clone())
                    .expect("binary found for every flavour run");
                    let p = run_point(*kind, size, run, f, &bin, a, root).await;
                    print_point(&p);
                    points.push(p);
                }
            }
        }
        if !json {
            print_tables(*kind, sizes, &points);
        }
    }
    let results = ScaleResults {
        etcd_version: bins.etcd.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
        retcd_version: bins.retcd.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
        points,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    if let Some(dir) = &o.plot {
        // drawing is CPU work: off the runtime's threads
        let dir = dir.clone();
        let (results, written) = tokio::task::spawn_blocking(move || {
            let w = crate::plot::write_charts(&results, &dir);
            (results, w)
        })
        .await?;
        for p in written? {
            eprintln!("chart: {}", p.display());
        }
        return finish(&results);
    }
    finish(&results)
}

/// Fails if any point could not be measured (after everything is printed).
fn finish(r: &ScaleResults) -> Result<()> {
    let failed = r.points.iter().filter(|p| p.error.is_some()).count();
    if failed > 0 {
        bail!("{failed} scale point(s) failed (see above)");
    }
    Ok(())
}

/// Starts a fresh 1-node server, measures one point on it, stops it.
async fn run_point(
    kind: ScaleKind,
    size: u64,
    run: usize,
    flavor: Flavor,
    bin: &Path,
    a: &CompareArgs,
    root: &Path,
) -> ScalePoint {
    let dir = root.join(format!("{}-{}-{size}-run{run}", flavor.name(), kind.name()));
    let mut p = ScalePoint {
        kind,
        size,
        run,
        flavor,
        error: None,
        keys: None,
        watchers: None,
        leases: None,
        compaction: None,
        soak: None,
    };
    let o = &a.scale_opts;
    let measure = async {
        let with_flags;
        let a = if kind == ScaleKind::Soak {
            let mut c = a.clone();
            c.server_flags.extend([
                "--auto-compaction-mode=periodic".to_string(),
                format!(
                    "--auto-compaction-retention={}",
                    o.soak_compaction_retention
                ),
            ]);
            with_flags = c;
            &with_flags
        } else {
            a
        };
        let mut servers = start_with_port_retry(bin, 1, &dir, a).await?;
        match kind {
            ScaleKind::Keys => p.keys = Some(keys_point(&mut servers, size, o).await?),
            ScaleKind::Watchers => p.watchers = Some(watchers_point(&servers, size, o).await?),
            ScaleKind::Leases => p.leases = Some(leases_point(&servers, size, o).await?),
            ScaleKind::Compaction => {
                p.compaction = Some(compaction_point(&servers, size, o).await?)
            }
            ScaleKind::Soak => p.soak = Some(soak_point(&servers, size, o).await?),
        }
        anyhow::Ok(())
    };
    // Dropping the future (timeout) drops the servers: killed and reaped.
    // A soak's size is its duration: its limit is that plus the set-up
    // (a 3600 s soak under the default 3600 s limit was killed at its end).
    let limit = point_limit(kind, size, o.point_timeout);
    match tokio::time::timeout(Duration::from_secs(limit), measure).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => p.error = Some(format!("{e:#}")),
        Err(_) => p.error = Some(format!("did not finish in {limit} s")),
    }
    settle_disk(&dir, 1).await;
    p
}

fn conn_opts(servers: &Servers, conns: usize) -> ConnOpts {
    ConnOpts {
        endpoints: servers.endpoints.clone(),
        conns,
        target_leader: false,
        dial_timeout: Duration::from_secs(10),
    }
}

/// Key `i` of the `keys` workload: `/registry/pods/namespace-NNN/pod-NNNNNNNN`
/// (41 bytes, 100 namespaces), as kube-apiserver names a pod.
fn key_name(i: u64) -> Vec<u8> {
    format!("/registry/pods/namespace-{:03}/pod-{i:08}", i % 100).into_bytes()
}

const KEY_PREFIX: &[u8] = b"/registry/pods/";
/// The prefix's range end (its last byte plus one).
const KEY_PREFIX_END: &[u8] = b"/registry/pods0";

/// The `keys` point: fill, memory, three lists, restart.
async fn keys_point(s: &mut Servers, n: u64, o: &ScaleOpts) -> Result<KeysResult> {
    let revisions = o.revisions.max(1);
    let fill = fill(s, n, revisions, o.value_size).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_filled_bytes = s.max_rss();

    let ch = connect_channels(&conn_opts(s, 1)).await?.remove(0);
    let kv = KvClient::new(ch)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    let wanted = |name: &str| o.lists.iter().any(|l| l.trim() == name);
    let list_paginated = if wanted("paginated") {
        measure_list(s, n, list_paginated(kv.clone())).await
    } else {
        ListResult::skipped()
    };
    let list_stream = if wanted("stream") {
        measure_list(s, n, list_stream(kv.clone())).await
    } else {
        ListResult::skipped()
    };
    let list_unary = if wanted("unary") {
        measure_list(s, n, list_unary(kv.clone())).await
    } else {
        ListResult::skipped()
    };
    drop(kv);

    let restart = restart(s).await?;
    Ok(KeysResult {
        keys: n,
        revisions,
        value_size: o.value_size,
        fill_puts: fill.requests,
        fill_errors: fill.errors,
        fill_first_error: fill.first_error.clone(),
        fill_secs: fill.total_secs,
        fill_puts_per_sec: fill.ops_per_sec,
        fill_p50_ms: fill.pct(50.0),
        fill_p99_ms: fill.pct(99.0),
        rss_filled_bytes,
        list_paginated,
        list_stream,
        list_unary,
        restart,
    })
}

/// Writes `n` keys `revisions` times each (put i writes key i mod n: every
/// key once per pass), 100 clients on 10 connections.
async fn fill(s: &Servers, n: u64, revisions: u64, value_size: usize) -> Result<Report> {
    let clients = connect(&conn_opts(s, 10)).await?;
    let val = Arc::new(vec![b'v'; value_size]);
    let d = Drive {
        clients: 100,
        total: n * revisions,
        rate: 0.0,
        progress: false,
    };
    let fill = runner::run("fill", &d, |c| {
        let kv = clients[c % clients.len()].kv_client();
        let val = val.clone();
        move |i| {
            let mut kv = kv.clone();
            let key = key_name(i % n);
            let val = (*val).clone();
            async move {
                kv.put(key, val, None).await?;
                Ok(())
            }
        }
    })
    .await;
    if fill.requests == 0 {
        bail!(
            "every fill put failed: {}",
            fill.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(fill)
}

/// The `compaction` point: fill N keys × `--compact-revisions`, then compact
/// at the head (`physical`: answered once the deletion is done) while 10
/// clients put at `--put-rate` to the same keys; every put's latency.
async fn compaction_point(s: &Servers, n: u64, o: &ScaleOpts) -> Result<CompactionResult> {
    let revisions = o.compact_revisions.max(2);
    let fill = fill(s, n, revisions, o.value_size).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_filled_bytes = s.max_rss();

    let ch = connect_channels(&conn_opts(s, 1)).await?.remove(0);
    let mut kv = KvClient::new(ch);
    // The puts run before, during and after the compaction; only those
    // sent while it ran count.
    let load = PutLoad::start(s, n, o.put_rate, o.value_size).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base_metrics = scrape_all(s).await?;
    let base_from = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(o.compaction_baseline.max(0.0))).await;
    let base_to = Instant::now();
    let head = kv
        .range(RangeRequest {
            key: KEY_PREFIX.to_vec(),
            limit: 1,
            ..Default::default()
        })
        .await?
        .into_inner()
        .header
        .map(|h| h.revision)
        .unwrap_or(0);
    let pid = s.pids()[0];
    let sampler = RssSampler::start(pid, Duration::from_millis(20));
    let before = scrape_all(s).await?;
    let cpu0 = s.cpu_secs();
    let started = Instant::now();
    let compacted = kv
        .compact(retcd_api::etcdserverpb::CompactionRequest {
            revision: head,
            physical: true,
        })
        .await;
    let done = Instant::now();
    let server_cpu_secs = s.cpu_secs() - cpu0;
    let after = scrape_all(s).await?;
    let rss_peak_bytes = sampler.stop().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lat = load.stop().await;
    compacted.context("compact")?;
    let (ok, put_errors) = puts_between(&lat, started, done);
    let (base, _) = puts_between(&lat, base_from, base_to);
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(CompactionResult {
        keys: n,
        revisions,
        value_size: o.value_size,
        fill_puts: fill.requests,
        fill_errors: fill.errors,
        fill_secs: fill.total_secs,
        fill_puts_per_sec: fill.ops_per_sec,
        rss_filled_bytes,
        compact_revision: head,
        revisions_removed: n * (revisions - 1),
        compact_secs: (done - started).as_secs_f64(),
        put_rate: o.put_rate,
        puts: ok.len() as u64 + put_errors,
        put_errors,
        put_p50_ms: pct_sorted(&ok, 50.0),
        put_p99_ms: pct_sorted(&ok, 99.0),
        put_max_ms: ok.last().copied().unwrap_or(0.0),
        puts_over_50ms: ok.iter().filter(|&&ms| ms > 50.0).count() as u64,
        server_cpu_secs,
        rss_peak_bytes,
        rss_after_bytes: s.max_rss(),
        baseline_secs: (base_to - base_from).as_secs_f64(),
        baseline_puts: base.len() as u64,
        baseline_p99_ms: pct_sorted(&base, 99.0),
        baseline_max_ms: base.last().copied().unwrap_or(0.0),
        baseline_over_50ms: base.iter().filter(|&&ms| ms > 50.0).count() as u64,
        stalls_baseline: stalls_between(&base_metrics, &before),
        stalls_during: stalls_between(&before, &after),
    })
}

/// Puts at a steady rate from 10 clients (put i is sent at start + i/rate,
/// to key i mod n), recording when each was sent, its latency in ms and
/// whether it succeeded, until stopped.
struct PutLoad {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<(Instant, f64, bool)>>>,
}

impl PutLoad {
    async fn start(s: &Servers, n: u64, rate: f64, value_size: usize) -> Result<PutLoad> {
        let clients = connect(&conn_opts(s, 10)).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let rate = rate.max(1.0);
        let val = vec![b'c'; value_size];
        let tasks = clients
            .into_iter()
            .map(|c| {
                let (stop, next, val) = (stop.clone(), next.clone(), val.clone());
                let mut kv = c.kv_client();
                tokio::spawn(async move {
                    let mut out = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / rate))
                            .await;
                        let sent = Instant::now();
                        let ok = kv.put(key_name(i % n), val.clone(), None).await.is_ok();
                        out.push((sent, sent.elapsed().as_secs_f64() * 1e3, ok));
                    }
                    out
                })
            })
            .collect();
        Ok(PutLoad { stop, tasks })
    }

    async fn stop(self) -> Vec<(Instant, f64, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await.unwrap_or_default());
        }
        all
    }
}

/// The `soak` point; see [`SoakResult`].
async fn soak_point(s: &Servers, secs: u64, o: &ScaleOpts) -> Result<SoakResult> {
    let clients = connect(&conn_opts(s, 10)).await?;
    let kopts = crate::k8s::K8sOpts {
        kinds: ["pods", "configmaps", "secrets", "services", "events"]
            .map(String::from)
            .to_vec(),
        namespaces: 10,
        objects: 2000,
        object_size: o.value_size,
        list_limit: 500,
        watchers: 10,
        mix: crate::k8s::parse_mix("create=10,update=75,get=8,list=2,delete=5")?,
    };
    let drive = |total: u64| Drive {
        clients: 100,
        total,
        rate: o.soak_rate,
        progress: false,
    };
    let load = crate::k8s::K8sLoad::setup(&clients, &drive(0), &kopts).await?;
    let mut maint = clients[0].maintenance_client();
    let per = ((o.soak_rate * o.soak_interval).round() as u64).max(1);
    let started = Instant::now();
    let mut last_defrag = Instant::now();
    let (mut samples, mut ops, mut errors, mut defrags, mut defrag_errors) =
        (Vec::new(), 0u64, 0u64, 0u64, 0u64);
    while started.elapsed().as_secs_f64() < secs as f64 {
        let cpu0 = s.cpu_secs();
        let r = load.run(&clients, &drive(per)).await;
        ops += r.requests;
        errors += r.errors;
        let db_size_bytes = match maint.status().await {
            Ok(st) => st.db_size(),
            Err(_) => -1,
        };
        samples.push(SoakSample {
            t_secs: started.elapsed().as_secs_f64(),
            ops_per_sec: r.ops_per_sec,
            p50_ms: r.pct(50.0),
            p99_ms: r.pct(99.0),
            errors: r.errors,
            rss_bytes: s.max_rss(),
            db_size_bytes,
            server_cpu_secs: s.cpu_secs() - cpu0,
        });
        // Each sample as it is taken: a soak killed before its end (or a
        // session that stops) still leaves its samples on stderr.
        if let Some(x) = samples.last() {
            eprintln!(
                "  soak t={:.0}s {:.0} ops/s p50 {:.2} ms p99 {:.2} ms errors {} rss {:.1} MiB db {:.1} MiB cpu {:.1} s",
                x.t_secs,
                x.ops_per_sec,
                x.p50_ms,
                x.p99_ms,
                x.errors,
                x.rss_bytes as f64 / MIB,
                x.db_size_bytes as f64 / MIB,
                x.server_cpu_secs
            );
        }
        if o.defrag_every > 0.0 && last_defrag.elapsed().as_secs_f64() >= o.defrag_every {
            match maint.defragment().await {
                Ok(_) => defrags += 1,
                Err(_) => defrag_errors += 1,
            }
            last_defrag = Instant::now();
        }
    }
    let watch_events = load.events();
    drop(load);
    if samples.is_empty() {
        bail!("no soak sample");
    }
    let warm = samples.len() / 10;
    let after = &samples[warm..];
    let slope = |f: &dyn Fn(&SoakSample) -> f64| -> f64 {
        let n = after.len() as f64;
        if n < 2.0 {
            return 0.0;
        }
        let mx = after.iter().map(|x| x.t_secs).sum::<f64>() / n;
        let my = after.iter().map(f).sum::<f64>() / n;
        let (mut num, mut den) = (0.0, 0.0);
        for x in after {
            num += (x.t_secs - mx) * (f(x) - my);
            den += (x.t_secs - mx) * (x.t_secs - mx);
        }
        if den == 0.0 {
            0.0
        } else {
            num / den * 3600.0
        }
    };
    Ok(SoakResult {
        duration_secs: started.elapsed().as_secs_f64(),
        rate: o.soak_rate,
        interval_secs: o.soak_interval,
        defrag_every_secs: o.defrag_every,
        ops,
        errors,
        defrags,
        defrag_errors,
        watch_events,
        rss_start_bytes: after[0].rss_bytes,
        rss_end_bytes: after[after.len() - 1].rss_bytes,
        rss_max_bytes: samples.iter().map(|x| x.rss_bytes).max().unwrap_or(0),
        p99_start_ms: after[0].p99_ms,
        p99_end_ms: after[after.len() - 1].p99_ms,
        rss_slope_mib_per_hour: slope(&|x| x.rss_bytes as f64 / MIB),
        p99_slope_ms_per_hour: slope(&|x| x.p99_ms),
        samples,
    })
}

/// What a list got back.
enum Listed {
    Keys { keys: u64, responses: u64 },
    Unsupported(String),
}

fn whole_prefix() -> RangeRequest {
    RangeRequest {
        key: KEY_PREFIX.to_vec(),
        range_end: KEY_PREFIX_END.to_vec(),
        ..Default::default()
    }
}

async fn list_unary(mut kv: KvClient<Channel>) -> Result<Listed> {
    let r = kv.range(whole_prefix()).await?.into_inner();
    Ok(Listed::Keys {
        keys: r.kvs.len() as u64,
        responses: 1,
    })
}

/// Pages of 500 as kube-apiserver lists: the next page from the last key
/// plus `\0`, every page at the first page's revision.
async fn list_paginated(mut kv: KvClient<Channel>) -> Result<Listed> {
    let (mut keys, mut responses, mut revision) = (0u64, 0u64, 0i64);
    let mut next = KEY_PREFIX.to_vec();
    loop {
        let r = kv
            .range(RangeRequest {
                key: next.clone(),
                range_end: KEY_PREFIX_END.to_vec(),
                limit: 500,
                revision,
                ..Default::default()
            })
            .await?
            .into_inner();
        responses += 1;
        if revision == 0 {
            revision = r.header.as_ref().map(|h| h.revision).unwrap_or(0);
        }
        keys += r.kvs.len() as u64;
        match r.kvs.last() {
            Some(last) if r.more => {
                next = last.key.to_vec();
                next.push(0);
            }
            _ => break,
        }
    }
    Ok(Listed::Keys { keys, responses })
}

/// `KV.RangeStream`: chunks of keys, the last one with the header; a
/// server without the RPC answers UNIMPLEMENTED.
async fn list_stream(mut kv: KvClient<Channel>) -> Result<Listed> {
    let mut stream = match kv.range_stream(whole_prefix()).await {
        Ok(s) => s.into_inner(),
        Err(st) if st.code() == tonic::Code::Unimplemented => {
            return Ok(Listed::Unsupported(st.message().to_string()))
        }
        Err(st) => return Err(st.into()),
    };
    let (mut keys, mut responses) = (0u64, 0u64);
    loop {
        match stream.message().await {
            Ok(Some(chunk)) => {
                responses += 1;
                keys += chunk
                    .range_response
                    .map(|r| r.kvs.len() as u64)
                    .unwrap_or(0);
            }
            Ok(None) => break,
            // grpc-go may send the status only with the first read
            Err(st) if st.code() == tonic::Code::Unimplemented && responses == 0 => {
                return Ok(Listed::Unsupported(st.message().to_string()))
            }
            Err(st) => return Err(st.into()),
        }
    }
    Ok(Listed::Keys { keys, responses })
}

/// Samples a process's VmRSS on a thread of its own (so a busy runtime,
/// e.g. one decoding a 1 GB response, does not delay the samples) and
/// keeps the peak.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pid: u32, every: Duration) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            loop {
                if let Some((rss, _)) = rss_bytes(pid) {
                    peak = peak.max(rss);
                }
                if flag.load(Ordering::Relaxed) {
                    return peak;
                }
                std::thread::sleep(every);
            }
        });
        RssSampler { stop, thread }
    }

    /// Stops sampling (one last sample first); the peak, bytes.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.thread;
        tokio::task::spawn_blocking(move || t.join().unwrap_or(0))
            .await
            .unwrap_or(0)
    }
}

/// Runs one list while sampling the server's memory and CPU.
async fn measure_list(
    s: &Servers,
    expected: u64,
    list: impl std::future::Future<Output = Result<Listed>>,
) -> ListResult {
    let pid = s.pids()[0];
    let before = rss_bytes(pid).map(|r| r.0).unwrap_or(0);
    let sampler = RssSampler::start(pid, Duration::from_millis(20));
    let (cpu0, ccpu0) = (s.cpu_secs(), process_cpu_secs());
    let t = Instant::now();
    let out = list.await;
    let wall = t.elapsed().as_secs_f64();
    let (cpu, ccpu) = (s.cpu_secs() - cpu0, process_cpu_secs() - ccpu0);
    let peak = sampler.stop().await.max(before);
    let mut r = ListResult {
        status: ListStatus::Ok,
        error: None,
        wall_secs: Some(wall),
        keys_received: None,
        responses: None,
        rss_before_bytes: Some(before),
        rss_peak_bytes: Some(peak),
        rss_growth_bytes: Some(peak - before),
        server_cpu_secs: Some(cpu),
        client_cpu_secs: Some(ccpu),
    };
    match out {
        Ok(Listed::Keys { keys, responses }) => {
            r.keys_received = Some(keys);
            r.responses = Some(responses);
            if keys != expected {
                r.status = ListStatus::Error;
                r.error = Some(format!("received {keys} keys, expected {expected}"));
            }
        }
        Ok(Listed::Unsupported(why)) => {
            return ListResult {
                status: ListStatus::Unsupported,
                error: Some(why),
                wall_secs: None,
                keys_received: None,
                responses: None,
                rss_before_bytes: None,
                rss_peak_bytes: None,
                rss_growth_bytes: None,
                server_cpu_secs: None,
                client_cpu_secs: None,
            }
        }
        Err(e) => {
            r.status = ListStatus::Error;
            r.error = Some(format!("{e:#}"));
        }
    }
    r
}

/// Whether the server at `ep` answers a linearizable Range now.
async fn serves_linearizable(ep: &str) -> bool {
    let Ok(e) = tonic::transport::Endpoint::from_shared(ep.to_string()) else {
        return false;
    };
    let Ok(Ok(ch)) = tokio::time::timeout(
        Duration::from_secs(1),
        e.connect_timeout(Duration::from_secs(1)).connect(),
    )
    .await
    else {
        return false;
    };
    let req = RangeRequest {
        key: b"retcd-bench-ready".to_vec(),
        ..Default::default()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), KvClient::new(ch).range(req)).await,
        Ok(Ok(_))
    )
}

/// SIGTERM, wait for the exit, start again on the same data dir and
/// ports, time until it serves a linearizable Range.
async fn restart(s: &mut Servers) -> Result<RestartResult> {
    let stop_secs = s.stop_member(0, Duration::from_secs(120)).await;
    let t = Instant::now();
    s.respawn_member(0)?;
    let ep = s.endpoints[0].clone();
    loop {
        s.check_running(0).context("restart")?;
        if serves_linearizable(&ep).await {
            break;
        }
        if t.elapsed() > Duration::from_secs(600) {
            bail!(
                "not serving 600 s after the restart; log tail:\n{}",
                s.log_tail(0, 3000)
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ready_secs = t.elapsed().as_secs_f64();
    Ok(RestartResult {
        stop_secs,
        ready_secs,
        rss_after_bytes: s.max_rss(),
    })
}

/// The `watchers` point. Values are 64 bytes (the 8-byte send time and
/// padding): what grows is the number of events, not their size.
async fn watchers_point(s: &Servers, n: u64, o: &ScaleOpts) -> Result<WatchersResult> {
    let streams = o.streams_for(n);
    // at most 100 watch streams per connection
    let channels = connect_channels(&conn_opts(s, streams.div_ceil(100).clamp(1, 100))).await?;
    let clients = connect(&conn_opts(s, 10)).await?;
    let wo = WatchOpts {
        streams,
        watch_per_stream: 1,
        watched_key_total: 1,
        put_total: o.puts,
        put_rate: o.put_rate,
        put_clients: 10,
        key_size: 32,
        val_size: 64,
        drain_timeout: Duration::from_secs(30),
        watchers_total: Some(n as usize),
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss_before = s.max_rss();
    let w = watch::create_watchers(&channels, &wo, false).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_with = s.max_rss();
    let cpu0 = s.cpu_secs();
    let (ev, puts) = w.put_and_drain(&clients, &wo).await?;
    let server_cpu_secs = s.cpu_secs() - cpu0;
    let num = |k: &str| ev.extra.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let (expected, delivered) = (num("events_expected"), num("events_delivered"));
    Ok(WatchersResult {
        watchers: n,
        streams,
        puts: o.puts,
        put_rate: o.put_rate,
        put_errors: puts.errors,
        events_expected: expected,
        events_delivered: delivered,
        events_missing: expected.saturating_sub(delivered),
        latency_p50_ms: ev.pct(50.0),
        latency_p99_ms: ev.pct(99.0),
        events_per_sec: ev.ops_per_sec,
        create_secs: ev
            .extra
            .get("watcher_creation_secs")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0),
        rss_before_bytes: rss_before,
        rss_with_watchers_bytes: rss_with,
        rss_per_watcher_bytes: (rss_with as f64 - rss_before as f64) / n as f64,
        server_cpu_secs,
    })
}

/// Counters shared by the keep-alive streams.
#[derive(Default)]
struct KeepAliveStats {
    sent: AtomicU64,
    responses: AtomicU64,
    expired: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl KeepAliveStats {
    fn error(&self, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut f = self.first_error.lock().expect("not poisoned");
        f.get_or_insert_with(|| e.to_string());
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One LeaseKeepAlive stream: every lease that arrives on `ids` gets a
/// keep-alive every `period`, the first one `period` after its grant (as
/// etcd's client renews at TTL/3). Ends when `ids` closes and nothing is
/// due, or when dropped.
async fn keepalive_stream(
    mut lc: LeaseClient<Channel>,
    mut ids: tokio::sync::mpsc::UnboundedReceiver<i64>,
    period: Duration,
    st: Arc<KeepAliveStats>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<LeaseKeepAliveRequest>(1024);
    let st2 = st.clone();
    // Opened in a task of its own: grpc-go (etcd) sends the response
    // headers with the first response, i.e. after the first keep-alive,
    // so awaiting the open before sending would wait forever.
    let _reader = AbortOnDrop(tokio::spawn(async move {
        let mut resp = match lc
            .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        {
            Ok(r) => r.into_inner(),
            Err(e) => return st2.error(format!("open keep-alive stream: {e}")),
        };
        loop {
            match resp.message().await {
                Ok(Some(r)) => {
                    st2.responses.fetch_add(1, Ordering::Relaxed);
                    if r.ttl <= 0 {
                        st2.expired.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    st2.error(format!("keep-alive stream: {e}"));
                    break;
                }
            }
        }
    }));
    // due times only ever grow by `period`, so the queue stays in order
    let mut due: VecDeque<(Instant, i64)> = VecDeque::new();
    let mut open = true;
    loop {
        let next = due.front().map(|d| d.0);
        tokio::select! {
            id = ids.recv(), if open => match id {
                Some(id) => due.push_back((Instant::now() + period, id)),
                None => open = false,
            },
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                let now = Instant::now();
                while let Some(&(t, id)) = due.front() {
                    if t > now {
                        break;
                    }
                    due.pop_front();
                    if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                        return;
                    }
                    st.sent.fetch_add(1, Ordering::Relaxed);
                    due.push_back((t + period, id));
                }
            }
            else => break,
        }
    }
}

/// The `leases` point: grant, keep alive for the duration, check.
async fn leases_point(s: &Servers, n: u64, o: &ScaleOpts) -> Result<LeasesResult> {
    let ttl = o.lease_ttl.max(1);
    let period = Duration::from_secs_f64(ttl as f64 / 3.0);
    let nstreams = (n as usize).div_ceil(o.leases_per_stream.max(1)).max(1);
    let channels = connect_channels(&conn_opts(s, nstreams.clamp(1, 10))).await?;
    let stats = Arc::new(KeepAliveStats::default());
    let mut feeds = Vec::with_capacity(nstreams);
    let mut streams = Vec::with_capacity(nstreams);
    for k in 0..nstreams {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let lc = LeaseClient::new(channels[k % channels.len()].clone());
        streams.push(AbortOnDrop(tokio::spawn(keepalive_stream(
            lc,
            rx,
            period,
            stats.clone(),
        ))));
        feeds.push(tx);
    }
    let feeds = Arc::new(feeds);
    let granted = Arc::new(Mutex::new(Vec::with_capacity(n as usize)));
    let d = Drive {
        clients: 100,
        total: n,
        rate: 0.0,
        progress: false,
    };
    // each lease goes to its stream as soon as it is granted
    let grants = runner::run("lease grant", &d, |c| {
        let lc = LeaseClient::new(channels[c % channels.len()].clone());
        let (feeds, granted) = (feeds.clone(), granted.clone());
        move |i| {
            let mut lc = lc.clone();
            let (feeds, granted) = (feeds.clone(), granted.clone());
            async move {
                let r = lc
                    .lease_grant(LeaseGrantRequest { ttl, id: 0 })
                    .await?
                    .into_inner();
                if !r.error.is_empty() {
                    bail!("grant: {}", r.error);
                }
                granted.lock().expect("not poisoned").push(r.id);
                feeds[i as usize % feeds.len()]
                    .send(r.id)
                    .map_err(|_| anyhow!("keep-alive stream gone"))?;
                Ok(())
            }
        }
    })
    .await;
    if grants.requests == 0 {
        bail!(
            "every lease grant failed: {}",
            grants.first_error.as_deref().unwrap_or("?")
        );
    }

    let (cpu0, r0, t0) = (
        s.cpu_secs(),
        stats.responses.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(Duration::from_secs_f64(o.duration.max(0.1))).await;
    let duration = t0.elapsed().as_secs_f64();
    let server_cpu_secs = s.cpu_secs() - cpu0;
    let responses = stats.responses.load(Ordering::Relaxed) - r0;
    let rss_bytes = s.max_rss();

    // While they are still kept alive: has any expired?
    let ids = granted.lock().expect("not poisoned").clone();
    let take = ids.len().min(1000);
    let sample: Vec<i64> = (0..take).map(|j| ids[j * ids.len() / take]).collect();
    let lc = LeaseClient::new(channels[0].clone());
    let answers: Vec<Result<i64, tonic::Status>> = futures::stream::iter(sample)
        .map(|id| {
            let mut lc = lc.clone();
            async move {
                lc.lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
                    .await
                    .map(|r| r.into_inner().ttl)
            }
        })
        .buffer_unordered(20)
        .collect()
        .await;
    let expired_early = answers
        .iter()
        .filter(|a| match a {
            Ok(ttl) => *ttl == -1,
            Err(st) => st.code() == tonic::Code::NotFound,
        })
        .count() as u64;
    let sample_errors = answers
        .iter()
        .filter(|a| matches!(a, Err(st) if st.code() != tonic::Code::NotFound))
        .count() as u64;
    drop(streams);
    drop(feeds);
    if let Some(e) = stats.first_error.lock().expect("not poisoned").as_ref() {
        eprintln!("      keep-alive: {e}");
    }
    Ok(LeasesResult {
        leases: n,
        ttl_secs: ttl,
        streams: nstreams,
        grant_secs: grants.total_secs,
        grant_errors: grants.errors,
        duration_secs: duration,
        server_cpu_secs,
        server_cpu_cores: server_cpu_secs / duration,
        keepalives_per_sec: responses as f64 / duration,
        keepalives_sent: stats.sent.load(Ordering::Relaxed),
        keepalive_responses: stats.responses.load(Ordering::Relaxed),
        keepalive_expired: stats.expired.load(Ordering::Relaxed),
        keepalive_errors: stats.errors.load(Ordering::Relaxed),
        sampled: take as u64,
        expired_early,
        sample_errors,
        rss_bytes,
    })
}

const MIB: f64 = 1024.0 * 1024.0;

/// One line on stderr per point, as the suite prints one per row.
fn print_point(p: &ScalePoint) {
    let tag = format!(
        "  [{:<5} {:<8} {:>8} run {}]",
        p.flavor.name(),
        p.kind.name(),
        p.size,
        p.run
    );
    if let Some(e) = &p.error {
        eprintln!("{tag} FAILED: {e}");
        return;
    }
    if let Some(k) = &p.keys {
        let l = |r: &ListResult| match r.status {
            ListStatus::Unsupported => "unsupported".to_string(),
            ListStatus::Skipped => "skipped".to_string(),
            _ => format!(
                "{:.3} s{}",
                r.wall_secs.unwrap_or(f64::NAN),
                r.error
                    .as_ref()
                    .map(|e| format!(" ERROR {e}"))
                    .unwrap_or_default()
            ),
        };
        eprintln!(
            "{tag} fill {:.0} puts/s p99 {:.2} ms  RSS {:.1} MiB  list: unary {}  paginated {}  stream {}  restart ready {:.2} s RSS {:.1} MiB",
            k.fill_puts_per_sec,
            k.fill_p99_ms,
            k.rss_filled_bytes as f64 / MIB,
            l(&k.list_unary),
            l(&k.list_paginated),
            l(&k.list_stream),
            k.restart.ready_secs,
            k.restart.rss_after_bytes as f64 / MIB
        );
    }
    if let Some(x) = &p.soak {
        eprintln!(
            "{tag} {:.0} s, {} ops, {} errors, {} defrags: p99 {:.2} -> {:.2} ms ({:+.2} ms/h), RSS {:.1} -> {:.1} MiB ({:+.1} MiB/h, max {:.1})",
            x.duration_secs,
            x.ops,
            x.errors,
            x.defrags,
            x.p99_start_ms,
            x.p99_end_ms,
            x.p99_slope_ms_per_hour,
            x.rss_start_bytes as f64 / MIB,
            x.rss_end_bytes as f64 / MIB,
            x.rss_slope_mib_per_hour,
            x.rss_max_bytes as f64 / MIB
        );
    }
    if let Some(c) = &p.compaction {
        eprintln!(
            "{tag} {} revisions: fill {:.0} puts/s, RSS {:.1} MiB; compaction of {} revisions at {} took {:.2} s; {} puts meanwhile: p99 {:.2} ms max {:.1} ms, {} over 50 ms, {} failed",
            c.keys * c.revisions,
            c.fill_puts_per_sec,
            c.rss_filled_bytes as f64 / MIB,
            c.revisions_removed,
            c.compact_revision,
            c.compact_secs,
            c.puts,
            c.put_p99_ms,
            c.put_max_ms,
            c.puts_over_50ms,
            c.put_errors
        );
        let st = |x: &Stalls| {
            let f = |n: &str, s: &Slow| {
                let max = if s.max_le_ms == f64::MAX {
                    "above the last bound".to_string()
                } else {
                    format!("<= {} ms", s.max_le_ms)
                };
                format!("{n} {}/{} over 32 ms (max {max})", s.over_32ms, s.count)
            };
            [
                f("wal fsync", &x.wal_fsync),
                f("backend commit", &x.backend_commit),
                f("db compaction pause", &x.db_compaction_pause),
                f("index compaction pause", &x.index_compaction_pause),
            ]
            .join(", ")
        };
        eprintln!(
            "{tag}   before it, {:.0} s of the same puts: {} puts, p99 {:.2} ms max {:.1} ms, {} over 50 ms; {}",
            c.baseline_secs,
            c.baseline_puts,
            c.baseline_p99_ms,
            c.baseline_max_ms,
            c.baseline_over_50ms,
            st(&c.stalls_baseline)
        );
        eprintln!("{tag}   while it ran: {}", st(&c.stalls_during));
    }
    if let Some(w) = &p.watchers {
        eprintln!(
            "{tag} {} streams  events {}/{}  p50 {:.2} ms p99 {:.2} ms  RSS {:.1} MiB ({:.0} B/watcher)  server CPU {:.2} s",
            w.streams,
            w.events_delivered,
            w.events_expected,
            w.latency_p50_ms,
            w.latency_p99_ms,
            w.rss_with_watchers_bytes as f64 / MIB,
            w.rss_per_watcher_bytes,
            w.server_cpu_secs
        );
    }
    if let Some(l) = &p.leases {
        eprintln!(
            "{tag} granted in {:.2} s  server CPU {:.2} s ({:.1} % of a core)  {:.0} keep-alives/s  expired early {}/{}",
            l.grant_secs,
            l.server_cpu_secs,
            l.server_cpu_cores * 100.0,
            l.keepalives_per_sec,
            l.expired_early,
            l.sampled
        );
    }
}

/// A measure's value in one point: a number, a list the server does not
/// have, or nothing (the point or the measure failed).
pub(crate) enum V {
    N(f64),
    Unsupported,
    Missing,
}

/// Reads one measure from a point.
pub(crate) type Measure = fn(&ScalePoint) -> V;

fn num(x: Option<f64>) -> V {
    x.map(V::N).unwrap_or(V::Missing)
}

fn list_measure(r: Option<&ListResult>, f: fn(&ListResult) -> Option<f64>) -> V {
    match r {
        None => V::Missing,
        Some(r) if r.status == ListStatus::Unsupported => V::Unsupported,
        Some(r) => num(f(r)),
    }
}

/// The median over runs of `m` for one kind, size and server; `Err(true)`
/// if every run found the measure unsupported, `Err(false)` if none has it.
pub(crate) fn median_of(
    points: &[ScalePoint],
    kind: ScaleKind,
    size: u64,
    flavor: Flavor,
    m: Measure,
) -> Result<f64, bool> {
    let (mut v, mut unsupported, mut any) = (Vec::new(), 0, 0);
    for p in points
        .iter()
        .filter(|p| p.kind == kind && p.size == size && p.flavor == flavor)
    {
        any += 1;
        match m(p) {
            V::N(x) if x.is_finite() => v.push(x),
            V::Unsupported => unsupported += 1,
            _ => {}
        }
    }
    if v.is_empty() {
        return Err(any > 0 && unsupported == any);
    }
    Ok(median(v))
}

/// The sizes of `kind` present in `points`, ascending.
pub(crate) fn sizes_in(points: &[ScalePoint], kind: ScaleKind) -> Vec<u64> {
    let mut v: Vec<u64> = points
        .iter()
        .filter(|p| p.kind == kind)
        .map(|p| p.size)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Measures of the `keys` tables: (column, precision, reader).
const KEYS_FILL: [(&str, usize, Measure); 5] = [
    ("fill puts/s", 0, |p| {
        num(p.keys.as_ref().map(|k| k.fill_puts_per_sec))
    }),
    ("fill p99 ms", 2, |p| {
        num(p.keys.as_ref().map(|k| k.fill_p99_ms))
    }),
    ("RSS filled MiB", 1, |p| {
        num(p.keys.as_ref().map(|k| k.rss_filled_bytes as f64 / MIB))
    }),
    ("restart ready s", 2, |p| {
        num(p.keys.as_ref().map(|k| k.restart.ready_secs))
    }),
    ("RSS after restart MiB", 1, |p| {
        num(p
            .keys
            .as_ref()
            .map(|k| k.restart.rss_after_bytes as f64 / MIB))
    }),
];

pub(crate) fn unary(p: &ScalePoint) -> Option<&ListResult> {
    p.keys.as_ref().map(|k| &k.list_unary)
}
pub(crate) fn paginated(p: &ScalePoint) -> Option<&ListResult> {
    p.keys.as_ref().map(|k| &k.list_paginated)
}
pub(crate) fn stream(p: &ScalePoint) -> Option<&ListResult> {
    p.keys.as_ref().map(|k| &k.list_stream)
}

/// The columns of one list table, for the list that `pick` chooses.
macro_rules! list_columns {
    ($pick:path) => {
        [
            (
                "time s",
                3usize,
                (|p| list_measure($pick(p), |r| r.wall_secs)) as Measure,
            ),
            ("RSS growth MiB", 1, |p| {
                list_measure($pick(p), |r| r.rss_growth_bytes.map(|b| b as f64 / MIB))
            }),
            ("server CPU s", 2, |p| {
                list_measure($pick(p), |r| r.server_cpu_secs)
            }),
        ]
    };
}

const WATCHERS: [(&str, usize, Measure); 6] = [
    ("event p50 ms", 2, |p| {
        num(p.watchers.as_ref().map(|w| w.latency_p50_ms))
    }),
    ("event p99 ms", 2, |p| {
        num(p.watchers.as_ref().map(|w| w.latency_p99_ms))
    }),
    ("events missing", 0, |p| {
        num(p.watchers.as_ref().map(|w| w.events_missing as f64))
    }),
    ("RSS with watchers MiB", 1, |p| {
        num(p
            .watchers
            .as_ref()
            .map(|w| w.rss_with_watchers_bytes as f64 / MIB))
    }),
    ("RSS per watcher B", 0, |p| {
        num(p.watchers.as_ref().map(|w| w.rss_per_watcher_bytes))
    }),
    ("server CPU s (puts)", 2, |p| {
        num(p.watchers.as_ref().map(|w| w.server_cpu_secs))
    }),
];

const LEASES: [(&str, usize, Measure); 5] = [
    ("server CPU s", 2, |p| {
        num(p.leases.as_ref().map(|l| l.server_cpu_secs))
    }),
    ("CPU % of a core", 1, |p| {
        num(p.leases.as_ref().map(|l| l.server_cpu_cores * 100.0))
    }),
    ("keep-alives/s", 0, |p| {
        num(p.leases.as_ref().map(|l| l.keepalives_per_sec))
    }),
    ("expired early", 0, |p| {
        num(p.leases.as_ref().map(|l| l.expired_early as f64))
    }),
    ("grant s", 2, |p| {
        num(p.leases.as_ref().map(|l| l.grant_secs))
    }),
];

const COMPACTION: [(&str, usize, Measure); 8] = [
    ("fill puts/s", 0, |p| {
        num(p.compaction.as_ref().map(|c| c.fill_puts_per_sec))
    }),
    ("RSS filled MiB", 1, |p| {
        num(p
            .compaction
            .as_ref()
            .map(|c| c.rss_filled_bytes as f64 / MIB))
    }),
    ("compaction s", 2, |p| {
        num(p.compaction.as_ref().map(|c| c.compact_secs))
    }),
    ("put p99 ms", 2, |p| {
        num(p.compaction.as_ref().map(|c| c.put_p99_ms))
    }),
    ("put max ms", 1, |p| {
        num(p.compaction.as_ref().map(|c| c.put_max_ms))
    }),
    ("puts > 50 ms", 0, |p| {
        num(p.compaction.as_ref().map(|c| c.puts_over_50ms as f64))
    }),
    ("server CPU s", 2, |p| {
        num(p.compaction.as_ref().map(|c| c.server_cpu_secs))
    }),
    ("RSS peak MiB", 1, |p| {
        num(p.compaction.as_ref().map(|c| c.rss_peak_bytes as f64 / MIB))
    }),
];

const SOAK: [(&str, usize, Measure); 8] = [
    ("ops/s", 0, |p| {
        num(p.soak.as_ref().map(|x| x.ops as f64 / x.duration_secs))
    }),
    ("p99 start ms", 2, |p| {
        num(p.soak.as_ref().map(|x| x.p99_start_ms))
    }),
    ("p99 end ms", 2, |p| {
        num(p.soak.as_ref().map(|x| x.p99_end_ms))
    }),
    ("p99 slope ms/h", 2, |p| {
        num(p.soak.as_ref().map(|x| x.p99_slope_ms_per_hour))
    }),
    ("RSS start MiB", 1, |p| {
        num(p.soak.as_ref().map(|x| x.rss_start_bytes as f64 / MIB))
    }),
    ("RSS end MiB", 1, |p| {
        num(p.soak.as_ref().map(|x| x.rss_end_bytes as f64 / MIB))
    }),
    ("RSS slope MiB/h", 1, |p| {
        num(p.soak.as_ref().map(|x| x.rss_slope_mib_per_hour))
    }),
    ("errors", 0, |p| {
        num(p.soak.as_ref().map(|x| x.errors as f64))
    }),
];

/// A markdown table: a row per size, for each measure etcd, retcd and the
/// ratio retcd/etcd (medians over runs).
fn print_table(
    title: &str,
    kind: ScaleKind,
    sizes: &[u64],
    points: &[ScalePoint],
    cols: &[(&str, usize, Measure)],
) {
    let runs = points
        .iter()
        .filter(|p| p.kind == kind)
        .map(|p| p.run)
        .max()
        .unwrap_or(0);
    println!("\n### {title} — medians of {runs} run(s)\n");
    let mut head = format!("| {} |", kind.name());
    let mut rule = String::from("|---:|");
    for (name, _, _) in cols {
        head += &format!(" etcd {name} | retcd {name} | ratio |");
        rule += "---:|---:|---:|";
    }
    println!("{head}\n{rule}");
    for &size in sizes {
        let mut line = format!("| {size} |");
        for (_, prec, m) in cols {
            let cell = |f: Flavor| match median_of(points, kind, size, f, *m) {
                Ok(x) => (format!("{x:.prec$}"), x),
                Err(true) => ("unsupported".into(), f64::NAN),
                Err(false) => ("—".into(), f64::NAN),
            };
            let (e, ex) = cell(Flavor::Etcd);
            let (r, rx) = cell(Flavor::Retcd);
            line += &format!(" {e} | {r} | {} |", ratio(rx, ex));
        }
        println!("{line}");
    }
}

/// The tables of every kind in `points` (`retcd-bench plot` on saved results).
pub fn print_all_tables(points: &[ScalePoint]) {
    for kind in ScaleKind::ALL {
        let sizes = sizes_in(points, kind);
        if !sizes.is_empty() {
            print_tables(kind, &sizes, points);
        }
    }
}

/// The tables of one kind, then every error of its points.
fn print_tables(kind: ScaleKind, sizes: &[u64], points: &[ScalePoint]) {
    match kind {
        ScaleKind::Keys => {
            print_table(
                "keys: fill, memory, restart",
                kind,
                sizes,
                points,
                &KEYS_FILL,
            );
            print_table(
                "keys: one unary Range of every key",
                kind,
                sizes,
                points,
                &list_columns!(unary),
            );
            print_table(
                "keys: paginated Range (limit 500, one revision)",
                kind,
                sizes,
                points,
                &list_columns!(paginated),
            );
            print_table(
                "keys: KV.RangeStream",
                kind,
                sizes,
                points,
                &list_columns!(stream),
            );
        }
        ScaleKind::Watchers => print_table("watchers", kind, sizes, points, &WATCHERS),
        ScaleKind::Leases => print_table("leases", kind, sizes, points, &LEASES),
        ScaleKind::Compaction => print_table(
            "compaction of all but each key's last revision, under puts",
            kind,
            sizes,
            points,
            &COMPACTION,
        ),
        ScaleKind::Soak => {
            print_table(
                "soak: k8s workload with auto-compaction and defrag (size = seconds)",
                kind,
                sizes,
                points,
                &SOAK,
            );
            print_soak_samples(points);
        }
    }
    let mut errors = Vec::new();
    for p in points.iter().filter(|p| p.kind == kind) {
        let tag = format!(
            "{} {} {} run {}",
            p.flavor.name(),
            kind.name(),
            p.size,
            p.run
        );
        if let Some(e) = &p.error {
            errors.push(format!("{tag}: {e}"));
        }
        if let Some(k) = &p.keys {
            if k.fill_errors > 0 {
                errors.push(format!(
                    "{tag}: {} fill puts failed: {}",
                    k.fill_errors,
                    k.fill_first_error.as_deref().unwrap_or("?")
                ));
            }
            for (name, l) in [
                ("unary", &k.list_unary),
                ("paginated", &k.list_paginated),
                ("stream", &k.list_stream),
            ] {
                if l.status == ListStatus::Error {
                    errors.push(format!(
                        "{tag}: {name} list: {}",
                        l.error.as_deref().unwrap_or("?")
                    ));
                }
            }
        }
        if let Some(x) = &p.soak {
            if x.errors > 0 || x.defrag_errors > 0 {
                errors.push(format!(
                    "{tag}: {} operations and {} defrags failed",
                    x.errors, x.defrag_errors
                ));
            }
        }
        if let Some(c) = &p.compaction {
            if c.fill_errors > 0 || c.put_errors > 0 {
                errors.push(format!(
                    "{tag}: {} fill puts and {} puts during the compaction failed",
                    c.fill_errors, c.put_errors
                ));
            }
        }
        if let Some(w) = &p.watchers {
            if w.events_missing > 0 || w.put_errors > 0 {
                errors.push(format!(
                    "{tag}: {} of {} events missing, {} puts failed",
                    w.events_missing, w.events_expected, w.put_errors
                ));
            }
        }
        if let Some(l) = &p.leases {
            if l.expired_early > 0 || l.keepalive_expired > 0 || l.grant_errors > 0 {
                errors.push(format!(
                    "{tag}: {} of {} sampled leases expired early, {} keep-alives answered TTL 0, {} grants failed",
                    l.expired_early, l.sampled, l.keepalive_expired, l.grant_errors
                ));
            }
        }
    }
    if !errors.is_empty() {
        println!("\nErrors:\n");
        for e in errors {
            println!("- {e}");
        }
    }
}

/// Each soak's samples: a markdown table per server and run.
fn print_soak_samples(points: &[ScalePoint]) {
    for p in points {
        let Some(x) = &p.soak else { continue };
        println!(
            "\n#### soak samples: {} run {} ({:.0} ops/s asked, a defrag every {:.0} s)\n",
            p.flavor.name(),
            p.run,
            x.rate,
            x.defrag_every_secs
        );
        println!("| t s | ops/s | p50 ms | p99 ms | errors | RSS MiB | db MiB | server CPU s |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        for s in &x.samples {
            println!(
                "| {:.0} | {:.0} | {:.2} | {:.2} | {} | {:.1} | {:.1} | {:.2} |",
                s.t_secs,
                s.ops_per_sec,
                s.p50_ms,
                s.p99_ms,
                s.errors,
                s.rss_bytes as f64 / MIB,
                s.db_size_bytes as f64 / MIB,
                s.server_cpu_secs
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_soak_point_outlasts_its_duration() {
        assert_eq!(point_limit(ScaleKind::Soak, 3600, 3600), 4200);
        assert_eq!(point_limit(ScaleKind::Soak, 60, 3600), 3600);
        assert_eq!(point_limit(ScaleKind::Keys, 1_000_000, 3600), 3600);
    }

    #[test]
    fn test_stalls_are_the_slow_observations_between_two_scrapes() {
        let text = |fsync: [u64; 4], pause: [u64; 3]| {
            format!(
                "# HELP x\n\
                 etcd_disk_wal_fsync_duration_seconds_bucket{{le=\"0.016\"}} {}\n\
                 etcd_disk_wal_fsync_duration_seconds_bucket{{le=\"0.032\"}} {}\n\
                 etcd_disk_wal_fsync_duration_seconds_bucket{{le=\"0.064\"}} {}\n\
                 etcd_disk_wal_fsync_duration_seconds_bucket{{le=\"+Inf\"}} {}\n\
                 etcd_disk_wal_fsync_duration_seconds_sum 1.5\n\
                 etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_bucket{{le=\"32\"}} {}\n\
                 etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_bucket{{le=\"64\"}} {}\n\
                 etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_bucket{{le=\"+Inf\"}} {}\n",
                fsync[0], fsync[1], fsync[2], fsync[3], pause[0], pause[1], pause[2]
            )
        };
        let before = vec![text([10, 12, 13, 13], [0, 0, 0])];
        // 5 more fsyncs: 2 under 16 ms, 1 in (16, 32], 2 in (32, 64]; 3
        // pauses, one in (32, 64]
        let after = vec![text([12, 15, 18, 18], [2, 3, 3])];
        let st = stalls_between(&before, &after);
        assert_eq!(st.wal_fsync.count, 5);
        assert_eq!(st.wal_fsync.over_32ms, 2);
        assert_eq!(st.wal_fsync.max_le_ms, 64.0);
        assert_eq!(st.db_compaction_pause.count, 3);
        assert_eq!(st.db_compaction_pause.over_32ms, 1);
        assert_eq!(st.db_compaction_pause.max_le_ms, 64.0);
        // absent from the text: nothing seen
        assert_eq!(st.backend_commit.count, 0);
        assert_eq!(st.backend_commit.max_le_ms, 0.0);
        // two members' texts add up
        let two = stalls_between(
            &[before[0].clone(), before[0].clone()],
            &[after[0].clone(), after[0].clone()],
        );
        assert_eq!(two.wal_fsync.count, 10);
        assert_eq!(two.wal_fsync.over_32ms, 4);
        // one fsync above the last bound
        let slowest = stalls_between(&before, &[text([12, 15, 18, 19], [0, 0, 0])]);
        assert_eq!(slowest.wal_fsync.max_le_ms, f64::MAX);
        assert_eq!(slowest.wal_fsync.over_32ms, 3);
    }

    fn opts(sizes: &[&str]) -> ScaleOpts {
        ScaleOpts {
            sizes: sizes.iter().map(|s| s.to_string()).collect(),
            revisions: 1,
            value_size: 1024,
            streams: None,
            puts: 1000,
            put_rate: 1000.0,
            lease_ttl: 10,
            leases_per_stream: 1000,
            duration: 30.0,
            plot: None,
            point_timeout: 3600,
            lists: vec!["paginated".into(), "stream".into(), "unary".into()],
            compact_revisions: 10,
            compaction_baseline: 30.0,
            soak_rate: 2000.0,
            soak_interval: 60.0,
            defrag_every: 600.0,
            soak_compaction_retention: "5m".into(),
        }
    }

    #[test]
    fn sizes_per_kind_and_for_all() {
        let o = opts(&["keys=300,10k,watchers=50", "leases=1m"]);
        assert_eq!(o.sizes_for(ScaleKind::Keys).unwrap(), vec![300, 10_000]);
        assert_eq!(o.sizes_for(ScaleKind::Watchers).unwrap(), vec![50]);
        assert_eq!(o.sizes_for(ScaleKind::Leases).unwrap(), vec![1_000_000]);
        let o = opts(&["100,10"]);
        assert_eq!(o.sizes_for(ScaleKind::Leases).unwrap(), vec![10, 100]);
        let o = opts(&[]);
        assert_eq!(
            o.sizes_for(ScaleKind::Keys).unwrap(),
            vec![10_000, 100_000, 1_000_000]
        );
        assert!(opts(&["pods=3"]).sizes_for(ScaleKind::Keys).is_err());
        assert!(opts(&["0"]).sizes_for(ScaleKind::Keys).is_err());
        assert!(opts(&["x"]).sizes_for(ScaleKind::Keys).is_err());
    }

    #[test]
    fn streams_default_to_a_tenth_within_bounds() {
        let o = opts(&[]);
        assert_eq!(o.streams_for(5), 1);
        assert_eq!(o.streams_for(50), 5);
        assert_eq!(o.streams_for(1_000_000), 10_000);
        let o = ScaleOpts {
            streams: Some(40),
            ..opts(&[])
        };
        assert_eq!(o.streams_for(10), 10);
        assert_eq!(o.streams_for(100), 40);
    }

    #[test]
    fn keys_look_like_kube_apiservers() {
        let k = key_name(123);
        assert_eq!(k, b"/registry/pods/namespace-023/pod-00000123");
        assert!(k.starts_with(KEY_PREFIX) && k.as_slice() < KEY_PREFIX_END);
        assert!(key_name(99_999_999).as_slice() < KEY_PREFIX_END);
    }
}
