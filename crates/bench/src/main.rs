//! `retcd-bench`: etcd's `benchmark` tool for retcd (and any etcd v3 server).
//!
//! The same subcommands and flags as etcd's `tools/benchmark`, so an etcd
//! user runs the same command lines; a Kubernetes-like workload (`k8s`);
//! and `compare`, which starts a real etcd and retcd with the same flags and
//! runs the standard suite — or, with `--scale KIND`, the scale workloads
//! (store size, watchers, leases) — on both in one run; `plot` redraws a
//! scale run's charts from its saved JSON.

mod compare;
mod floor;
mod k8s;
mod plot;
mod report;
mod runner;
mod scale;
mod watch;
mod watch_decode;
mod workloads;

use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

use report::Report;
use runner::{connect, connect_channels, ConnOpts, Drive};
use workloads::KeyOpts;

#[derive(Parser, Debug)]
#[command(
    name = "retcd-bench",
    version,
    about = "etcd-compatible benchmark tool for retcd"
)]
struct Cli {
    /// gRPC endpoints (comma separated), `host:port` or `http://host:port`.
    #[arg(
        long,
        global = true,
        default_value = "127.0.0.1:2379",
        value_delimiter = ','
    )]
    endpoints: Vec<String>,
    /// Total number of gRPC connections.
    #[arg(long, global = true, default_value_t = 1)]
    conns: usize,
    /// Total number of concurrent clients (sharing the connections).
    #[arg(long, global = true, default_value_t = 1)]
    clients: usize,
    /// Send every request to the current leader's endpoint.
    #[arg(long, global = true)]
    target_leader: bool,
    /// Dial timeout, seconds.
    #[arg(long, global = true, default_value_t = 30)]
    dial_timeout: u64,
    /// Output format: `simple` (etcd benchmark's text) or `json`.
    #[arg(short = 'w', long = "write-out", global = true, value_enum, default_value_t = Format::Simple)]
    write_out: Format,
    /// Do not draw a progress bar.
    #[arg(long, global = true)]
    no_progress: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Simple,
    Json,
}

#[derive(Args, Debug, Clone)]
struct KeyArgs {
    /// Key size of a request.
    #[arg(long, default_value_t = 8)]
    key_size: usize,
    /// Value size of a request.
    #[arg(long, default_value_t = 8)]
    val_size: usize,
    /// Maximum possible keys.
    #[arg(long, default_value_t = 1)]
    key_space_size: u64,
    /// Use sequential keys (i mod key-space-size) instead of random ones.
    #[arg(long)]
    sequential_keys: bool,
}

impl KeyArgs {
    fn opts(&self) -> KeyOpts {
        KeyOpts {
            key_size: self.key_size,
            val_size: self.val_size,
            key_space_size: self.key_space_size,
            sequential_keys: self.sequential_keys,
        }
    }
}

#[derive(Args, Debug, Clone)]
struct LoadArgs {
    /// Total number of requests.
    #[arg(long, default_value_t = 10000)]
    total: u64,
    /// Maximum requests per second (0 is no limit).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Consistency {
    /// Linearizable.
    L,
    /// Serializable.
    S,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Benchmark put.
    Put {
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        keys: KeyArgs,
    },
    /// Benchmark range: `range key [end-range]`.
    Range {
        key: String,
        end: Option<String>,
        #[command(flatten)]
        load: LoadArgs,
        /// Linearizable (l) or serializable (s).
        #[arg(long, value_enum, default_value_t = Consistency::L)]
        consistency: Consistency,
        /// Maximum number of results (0 is unlimited).
        #[arg(long, default_value_t = 0)]
        limit: i64,
        /// Only return the count.
        #[arg(long)]
        count_only: bool,
    },
    /// Benchmark transactions of puts.
    TxnPut {
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        keys: KeyArgs,
        /// Number of puts per txn.
        #[arg(long, default_value_t = 1)]
        txn_ops: usize,
    },
    /// Benchmark a mix of ranges and puts: `txn-mixed key [end-range]`.
    TxnMixed {
        key: String,
        end: Option<String>,
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        keys: KeyArgs,
        /// Reads per write.
        #[arg(long, default_value_t = 1.0)]
        rw_ratio: f64,
        #[arg(long, value_enum, default_value_t = Consistency::L)]
        consistency: Consistency,
    },
    /// Benchmark watch: events delivered per second and put→event latency.
    Watch {
        #[command(flatten)]
        w: WatchArgs,
        /// Watchers per stream.
        #[arg(long, default_value_t = 100)]
        watch_per_stream: usize,
        /// Total puts.
        #[arg(long, default_value_t = 1000)]
        put_total: u64,
        /// Puts per second (0 is no limit).
        #[arg(long, default_value_t = 0.0)]
        put_rate: f64,
    },
    /// Benchmark watch latency (put → event) at a fixed put rate.
    WatchLatency {
        #[command(flatten)]
        w: WatchArgs,
        /// Watchers per stream.
        #[arg(long, default_value_t = 10)]
        watchers_per_stream: usize,
        #[arg(long, default_value_t = 1000)]
        put_total: u64,
        #[arg(long, default_value_t = 100.0)]
        put_rate: f64,
    },
    /// Benchmark gets of a key with many watchers on it.
    WatchGet {
        #[command(flatten)]
        load: LoadArgs,
        /// Number of watch streams on the key.
        #[arg(long, default_value_t = 100)]
        watchers: usize,
        #[arg(long, default_value = "watchget")]
        key: String,
    },
    /// Benchmark lease keep-alives.
    LeaseKeepalive {
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Benchmark STM (read keys, commit guarded by mod_revision; retry on conflict).
    Stm {
        #[command(flatten)]
        load: LoadArgs,
        /// Total number of keys.
        #[arg(long, default_value_t = 1000)]
        keys: u64,
        /// Keys per transaction.
        #[arg(long, default_value_t = 2)]
        keys_per_txn: usize,
        #[arg(long, default_value_t = 8)]
        val_size: usize,
    },
    /// A Kubernetes-like workload (kube-apiserver's etcd traffic).
    K8s {
        #[command(flatten)]
        load: LoadArgs,
        #[command(flatten)]
        k: K8sArgs,
    },
    /// Start real etcd and retcd with the same flags and compare them.
    // boxed: its flags outweigh every other subcommand's
    Compare(Box<compare::CompareArgs>),
    /// This machine's floor for a lone durable write, with no server: one
    /// request over loopback TCP, appended to a file and fdatasynced, then
    /// answered; prints the answering thread's CPU per request, the
    /// latency, the loopback round trip alone, and the latency with the
    /// write handed to a second thread and back.
    Floor {
        /// Requests.
        #[arg(long, default_value_t = 3000)]
        total: u64,
        /// Bytes per request (etcd's benchmark put of a 256-byte value is
        /// about 300 bytes in the WAL).
        #[arg(long, default_value_t = 300)]
        bytes: usize,
        /// Directory of the file (default: the system temp dir; use the
        /// disk the servers' data dirs are on).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Skip the fdatasync (the cost of the rest alone).
        #[arg(long)]
        no_sync: bool,
    },
    /// Print the tables of a saved scale run (`compare --scale KIND -w json
    /// > FILE`) and, with `--out`, draw its PNG charts.
    Plot {
        /// The JSON a scale run printed.
        #[arg(long)]
        from: std::path::PathBuf,
        /// Directory to write the charts into (created if missing).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
}

#[derive(Args, Debug, Clone)]
struct WatchArgs {
    /// Number of watch streams (gRPC bidi streams).
    #[arg(long, default_value_t = 10)]
    streams: usize,
    /// Number of distinct watched keys.
    #[arg(long, default_value_t = 1)]
    watched_key_total: usize,
    #[arg(long, default_value_t = 32)]
    key_size: usize,
    #[arg(long, default_value_t = 32)]
    val_size: usize,
}

#[derive(Args, Debug, Clone)]
pub struct K8sArgs {
    /// Resource kinds.
    #[arg(
        long,
        default_value = "pods,configmaps,secrets,services,events",
        value_delimiter = ','
    )]
    pub kinds: Vec<String>,
    #[arg(long, default_value_t = 10)]
    pub namespaces: usize,
    /// Objects created before the timed run.
    #[arg(long, default_value_t = 1000)]
    pub objects: usize,
    /// Bytes per object.
    #[arg(long, default_value_t = 1024)]
    pub object_size: usize,
    /// Page size of lists.
    #[arg(long, default_value_t = 500)]
    pub list_limit: i64,
    /// Prefix watchers (informers), spread over the kinds.
    #[arg(long, default_value_t = 10)]
    pub watchers: usize,
    /// Operation weights.
    #[arg(long, default_value = "create=10,update=75,get=8,list=2,delete=5")]
    pub mix: String,
}

impl K8sArgs {
    pub fn opts(&self) -> Result<k8s::K8sOpts> {
        Ok(k8s::K8sOpts {
            kinds: self.kinds.clone(),
            namespaces: self.namespaces,
            objects: self.objects,
            object_size: self.object_size,
            list_limit: self.list_limit,
            watchers: self.watchers,
            mix: k8s::parse_mix(&self.mix)?,
        })
    }
}

fn emit(fmt: Format, reports: &[Report]) {
    match fmt {
        Format::Simple => reports.iter().for_each(Report::print_text),
        Format::Json => {
            let v = if reports.len() == 1 {
                serde_json::to_value(&reports[0])
            } else {
                serde_json::to_value(reports)
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&v.expect("serializable")).expect("json")
            );
        }
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Cmd::Plot { from, out } = &cli.cmd {
        // no server, no runtime: printing and drawing only
        let r = plot::load(from)?;
        scale::print_all_tables(&r.points);
        if let Some(out) = out {
            for p in plot::write_charts(&r, out)? {
                eprintln!("chart: {}", p.display());
            }
        }
        return Ok(());
    }
    if let Cmd::Floor {
        total,
        bytes,
        dir,
        no_sync,
    } = &cli.cmd
    {
        let dir = dir.clone().unwrap_or_else(std::env::temp_dir);
        let f = floor::run(&dir, *total, (*bytes).max(1), !no_sync)?;
        match cli.write_out {
            Format::Simple => f.print_text(),
            Format::Json => println!("{}", serde_json::to_string_pretty(&f)?),
        }
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(real_main(cli))
}

async fn real_main(cli: Cli) -> Result<()> {
    let progress = !cli.no_progress && cli.write_out == Format::Simple;
    if let Cmd::Compare(args) = &cli.cmd {
        // On Ctrl-C or SIGTERM the suite future is dropped, and with it the
        // server processes it started (killed and reaped in `Drop`).
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        return tokio::select! {
            r = compare::compare(args, cli.write_out == Format::Json) => r,
            _ = tokio::signal::ctrl_c() => bail!("interrupted; servers stopped"),
            _ = term.recv() => bail!("terminated; servers stopped"),
        };
    }
    let co = ConnOpts {
        endpoints: cli.endpoints.clone(),
        conns: cli.conns,
        target_leader: cli.target_leader,
        dial_timeout: Duration::from_secs(cli.dial_timeout),
    };
    let clients = connect(&co).await?;
    let drive = |l: &LoadArgs| Drive {
        clients: cli.clients,
        total: l.total,
        rate: l.rate,
        progress,
    };
    let reports = match &cli.cmd {
        Cmd::Put { load, keys } => vec![workloads::put(&clients, &drive(load), &keys.opts()).await],
        Cmd::Range {
            key,
            end,
            load,
            consistency,
            limit,
            count_only,
        } => vec![
            workloads::range(
                &clients,
                &drive(load),
                key.clone().into_bytes(),
                end.clone().map(String::into_bytes),
                *consistency == Consistency::S,
                *limit,
                *count_only,
            )
            .await,
        ],
        Cmd::TxnPut {
            load,
            keys,
            txn_ops,
        } => {
            vec![workloads::txn_put(&clients, &drive(load), &keys.opts(), *txn_ops).await]
        }
        Cmd::TxnMixed {
            key,
            end,
            load,
            keys,
            rw_ratio,
            consistency,
        } => {
            let (r, w) = workloads::txn_mixed(
                &clients,
                &drive(load),
                &keys.opts(),
                key.clone().into_bytes(),
                end.clone().map(String::into_bytes),
                *consistency == Consistency::S,
                *rw_ratio,
            )
            .await;
            vec![r, w]
        }
        Cmd::Watch {
            w,
            watch_per_stream,
            put_total,
            put_rate,
        } => {
            let (ev, puts) = watch::watch(
                &clients,
                &connect_channels(&co).await?,
                &watch_opts(w, *watch_per_stream, *put_total, *put_rate, cli.clients),
                progress,
            )
            .await?;
            vec![puts, ev]
        }
        Cmd::WatchLatency {
            w,
            watchers_per_stream,
            put_total,
            put_rate,
        } => {
            let (ev, puts) = watch::watch(
                &clients,
                &connect_channels(&co).await?,
                &watch_opts(w, *watchers_per_stream, *put_total, *put_rate, cli.clients),
                progress,
            )
            .await?;
            vec![puts, ev]
        }
        Cmd::WatchGet {
            load,
            watchers,
            key,
        } => {
            vec![
                workloads::watch_get(&clients, &drive(load), key.clone().into_bytes(), *watchers)
                    .await?,
            ]
        }
        Cmd::LeaseKeepalive { load } => {
            vec![workloads::lease_keepalive(&clients, &drive(load)).await?]
        }
        Cmd::Stm {
            load,
            keys,
            keys_per_txn,
            val_size,
        } => {
            vec![workloads::stm(&clients, &drive(load), *keys, *keys_per_txn, *val_size).await]
        }
        Cmd::K8s { load, k } => {
            let (all, per_op, ev) = k8s::k8s(&clients, &drive(load), &k.opts()?).await?;
            if cli.write_out == Format::Simple {
                println!("\nPer operation:");
                for r in &per_op {
                    println!(
                        "  {:<12} {:>8} ops  avg {:.3} ms  p99 {:.3} ms",
                        r.name,
                        r.requests,
                        r.average_ms,
                        r.pct(99.0)
                    );
                }
                println!(
                    "  watch events delivered: {} ({:.0}/s)",
                    ev.extra["events_delivered"], ev.ops_per_sec
                );
            }
            let mut v = vec![all];
            if cli.write_out == Format::Json {
                v.extend(per_op);
                v.push(ev);
            }
            v
        }
        Cmd::Compare(_) | Cmd::Plot { .. } | Cmd::Floor { .. } => unreachable!("handled above"),
    };
    emit(cli.write_out, &reports);
    if reports.iter().all(|r| r.requests == 0) {
        bail!("no request succeeded");
    }
    Ok(())
}

fn watch_opts(
    w: &WatchArgs,
    per_stream: usize,
    put_total: u64,
    put_rate: f64,
    clients: usize,
) -> watch::WatchOpts {
    watch::WatchOpts {
        streams: w.streams,
        watch_per_stream: per_stream,
        watched_key_total: w.watched_key_total,
        put_total,
        put_rate,
        put_clients: clients,
        key_size: w.key_size,
        val_size: w.val_size,
        drain_timeout: Duration::from_secs(30),
        watchers_total: None,
    }
}
