//! retcdutl: offline tools for retcd data, like etcdutl.
//!
//! * `retcdutl snapshot save FILE --endpoints URL`: what `etcdctl snapshot
//!   save` does (Maintenance.Snapshot to a file), with progress.
//! * `retcdutl snapshot status FILE [-w simple|table|json]`.
//! * `retcdutl snapshot restore FILE --name --initial-cluster
//!   --initial-cluster-token --initial-advertise-peer-urls --data-dir`:
//!   a new member's data dir holding the snapshot's keys, revisions and
//!   leases, a fresh WAL and the new cluster's members (IDs derived from
//!   the peer URLs and the token, as etcd does).
//!
//! A snapshot file is the Maintenance.Snapshot stream: a `KvStore::dump`
//! (magic `RETCDMVCC1`, records, CRC-32C) followed by the SHA-256 of it.
//! Both are checked before anything is written.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::ConfState;
use redb::ReadableTableMetadata;
use retcd_api::etcdserverpb::maintenance_client::MaintenanceClient;
use retcd_api::etcdserverpb::SnapshotRequest;
use retcd_api::retcdpb::WalMetadata;
use retcd_mvcc::kvstore::{parse_dump, CONSISTENT_INDEX_KEY, TERM_KEY};
use retcd_mvcc::{KvStore, Revision};
use retcd_server::config::Config;
use retcd_storage::backend::{commit_with, Backend, CommitPolicy, ALARM, MEMBERS, META};
use retcd_storage::wal::{Wal, WalSnapshot};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "retcdutl",
    version,
    about = "retcd offline utility (etcdutl-compatible)"
)]
struct Cli {
    /// Output format: simple, table or json.
    #[arg(
        short = 'w',
        long = "write-out",
        global = true,
        default_value = "simple"
    )]
    write_out: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Manages retcd node snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
}

#[derive(Subcommand, Debug)]
enum SnapshotCmd {
    /// Stores a snapshot of a member's keyspace in FILE.
    Save {
        file: PathBuf,
        /// The member to fetch the snapshot from.
        #[arg(long, default_value = "127.0.0.1:2379")]
        endpoints: String,
    },
    /// Gets the hash, revision, total keys and size of a snapshot file.
    Status { file: PathBuf },
    /// Restores a snapshot into a new member's data directory.
    Restore {
        file: PathBuf,
        #[arg(long, default_value = "default")]
        name: String,
        #[arg(long, default_value = "default=http://localhost:2380")]
        initial_cluster: String,
        #[arg(long, default_value = "etcd-cluster")]
        initial_cluster_token: String,
        #[arg(long, default_value = "http://localhost:2380")]
        initial_advertise_peer_urls: String,
        /// Path to the data directory (default: ${name}.etcd).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Path to the WAL directory (default: ${data-dir}/member/wal).
        #[arg(long)]
        wal_dir: Option<PathBuf>,
        /// Ignore a missing or wrong SHA-256 trailer.
        #[arg(long)]
        skip_hash_check: bool,
    },
}

/// Prints `what: n / total (p%)` to stderr at most every 10% for inputs
/// over 8 MiB.
struct Progress {
    what: &'static str,
    total: u64,
    next: u64,
    started: Instant,
}

impl Progress {
    fn new(what: &'static str, total: u64) -> Progress {
        Progress {
            what,
            total,
            next: 0,
            started: Instant::now(),
        }
    }
    fn at(&mut self, done: u64) {
        if self.total < 8 << 20 || done < self.next {
            return;
        }
        let pct = done * 100 / self.total.max(1);
        eprintln!(
            "{}: {} / {} ({pct}%, {:.1}s)",
            self.what,
            human_bytes(done),
            human_bytes(self.total),
            self.started.elapsed().as_secs_f64()
        );
        self.next = done + self.total / 10;
    }
}

/// go-humanize's `Bytes` (SI units), as etcdctl prints sizes.
fn human_bytes(n: u64) -> String {
    if n < 10 {
        return format!("{n} B");
    }
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let e = ((n as f64).ln() / 1000f64.ln()).floor() as usize;
    let v = n as f64 / 1000f64.powi(e as i32);
    if v < 10.0 {
        format!("{v:.1} {}", units[e])
    } else {
        format!("{v:.0} {}", units[e])
    }
}

/// Reads FILE and returns the dump (without the SHA-256 trailer), checked.
fn read_snapshot(file: &Path, skip_hash_check: bool) -> anyhow::Result<Vec<u8>> {
    let mut f = std::fs::File::open(file)
        .with_context(|| format!("cannot open snapshot file {}", file.display()))?;
    let size = f.metadata()?.len();
    let mut data = Vec::with_capacity(size as usize);
    let mut buf = vec![0u8; 1 << 20];
    let mut progress = Progress::new("reading snapshot", size);
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        data.extend_from_slice(&buf[..n]);
        progress.at(data.len() as u64);
    }
    let corrupted = |why: String| {
        anyhow::anyhow!(
            "snapshot file {} is corrupted or not a retcd snapshot: {why}",
            file.display()
        )
    };
    // dump ++ zero padding ++ sha256(dump ++ padding)
    let (body, hashed) = if data.len() >= 32 {
        let (body, sha) = data.split_at(data.len() - 32);
        if Sha256::digest(body).as_slice() == sha {
            (body, true)
        } else if skip_hash_check {
            (&data[..], false)
        } else {
            return Err(corrupted("sha256 checksum mismatch".into()));
        }
    } else {
        return Err(corrupted("file too short".into()));
    };
    let len = match retcd_mvcc::dump_len(body) {
        Some(n) => n,
        // with --skip-hash-check: maybe a hash that does not match
        None if !hashed && data.len() >= 32 => retcd_mvcc::dump_len(&data[..data.len() - 32])
            .ok_or_else(|| corrupted("truncated or damaged records".into()))?,
        None => return Err(corrupted("truncated or damaged records".into())),
    };
    parse_dump(&data[..len]).map_err(|e| corrupted(e.to_string()))?;
    data.truncate(len);
    Ok(data)
}

struct DumpStats {
    hash: u32,
    revision: i64,
    total_keys: u64,
}

fn dump_stats(dump: &[u8]) -> anyhow::Result<DumpStats> {
    let records = parse_dump(dump)?;
    let mut revision = 0;
    for (table, k, _) in &records {
        if *table == 1 {
            if let Some((r, _)) = Revision::parse(k) {
                revision = revision.max(r.main);
            }
        }
    }
    let crc = u32::from_be_bytes(dump[dump.len() - 4..].try_into().expect("4 bytes"));
    Ok(DumpStats {
        hash: crc,
        revision,
        total_keys: records.len() as u64,
    })
}

fn status(file: &Path, format: &str) -> anyhow::Result<()> {
    let dump = read_snapshot(file, true)?;
    let s = dump_stats(&dump)?;
    let size = std::fs::metadata(file)?.len();
    match format {
        "json" => println!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}",
            s.hash, s.revision, s.total_keys, size
        ),
        "table" => {
            let cells = [
                format!("{:x}", s.hash),
                s.revision.to_string(),
                s.total_keys.to_string(),
                human_bytes(size),
            ];
            let heads = ["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"];
            let w: Vec<usize> = heads
                .iter()
                .zip(&cells)
                .map(|(h, c)| h.len().max(c.len()) + 2)
                .collect();
            let line = || {
                let mut l = String::from("+");
                for x in &w {
                    l.push_str(&"-".repeat(*x));
                    l.push('+');
                }
                l
            };
            let center = |s: &str, w: usize| {
                let pad = w - s.len();
                format!(
                    "{}{}{}",
                    " ".repeat(pad / 2 + pad % 2),
                    s,
                    " ".repeat(pad / 2)
                )
            };
            println!("{}", line());
            let h: Vec<String> = heads.iter().zip(&w).map(|(h, w)| center(h, *w)).collect();
            println!("|{}|", h.join("|"));
            println!("{}", line());
            let c: Vec<String> = cells
                .iter()
                .zip(&w)
                .enumerate()
                .map(|(i, (c, w))| {
                    if i == 1 || i == 2 {
                        format!("{c:>width$} ", width = w - 1)
                    } else {
                        format!(" {c:<width$}", width = w - 1)
                    }
                })
                .collect();
            println!("|{}|", c.join("|"));
            println!("{}", line());
        }
        _ => println!(
            "{:x}, {}, {}, {}",
            s.hash,
            s.revision,
            s.total_keys,
            human_bytes(size)
        ),
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn restore(
    file: &Path,
    name: String,
    initial_cluster: String,
    token: String,
    peer_urls: String,
    data_dir: Option<PathBuf>,
    wal_dir: Option<PathBuf>,
    skip_hash_check: bool,
) -> anyhow::Result<()> {
    // Reuse the server's own flag parsing and validation.
    let mut args = vec![
        format!("--name={name}"),
        format!("--initial-cluster={initial_cluster}"),
        format!("--initial-cluster-token={token}"),
        format!("--initial-advertise-peer-urls={peer_urls}"),
    ];
    if let Some(d) = &data_dir {
        args.push(format!("--data-dir={}", d.display()));
    }
    if let Some(d) = &wal_dir {
        args.push(format!("--wal-dir={}", d.display()));
    }
    let cfg = Config::from_args(&args).map_err(|e| anyhow::anyhow!("{e}"))?;
    cfg.validate().map_err(anyhow::Error::msg)?;
    let (members, member_id, cluster_id) = retcd_server::apply::membership::initial_cluster(&cfg)?;

    let data_dir = cfg.data_dir();
    if data_dir.exists() {
        bail!("data-dir {:?} exists", data_dir.display().to_string());
    }
    let dump = read_snapshot(file, skip_hash_check)?;
    let stats = dump_stats(&dump)?;
    eprintln!(
        "restoring snapshot {} (revision {}, {} records) into {}",
        file.display(),
        stats.revision,
        stats.total_keys,
        data_dir.display()
    );
    let started = Instant::now();
    std::fs::create_dir_all(cfg.snap_dir())
        .with_context(|| format!("cannot create {}", cfg.snap_dir().display()))?;
    let backend = Arc::new(Backend::open(&cfg.backend_path()).map_err(|e| anyhow::anyhow!("{e}"))?);
    let kv = KvStore::open(backend.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    kv.restore_from(&dump)
        .map_err(|e| anyhow::anyhow!("cannot restore the snapshot: {e}"))?;
    eprintln!(
        "restored {} records in {:.1}s",
        stats.total_keys,
        started.elapsed().as_secs_f64()
    );
    drop(kv);
    // The new cluster: its members, no alarms, and a log that starts after
    // a snapshot at index 1, term 1 (as a new cluster's does).
    const INDEX: u64 = 1;
    const TERM: u64 = 1;
    {
        let txn = backend.db().begin_write()?;
        txn.delete_table(MEMBERS)?;
        txn.delete_table(ALARM)?;
        {
            let mut t = txn.open_table(MEMBERS)?;
            for m in &members {
                t.insert(m.id, m.encode_to_vec().as_slice())?;
            }
            txn.open_table(ALARM)?;
            let mut meta = txn.open_table(META)?;
            meta.insert(CONSISTENT_INDEX_KEY, INDEX.to_be_bytes().as_slice())?;
            meta.insert(TERM_KEY, TERM.to_be_bytes().as_slice())?;
        }
        commit_with(txn, CommitPolicy::Durable).map_err(|e| anyhow::anyhow!("{e}"))?;
        let r = backend.begin_read().map_err(|e| anyhow::anyhow!("{e}"))?;
        let n = r.open_table(retcd_storage::backend::KEY)?.len()?;
        eprintln!(
            "backend {} holds {n} revisions",
            cfg.backend_path().display()
        );
    }
    drop(backend);
    let meta = WalMetadata {
        member_id,
        cluster_id,
        members: members.clone(),
    };
    let mut wal = Wal::create(&cfg.wal_dir(), &meta.encode_to_vec())
        .map_err(|e| anyhow::anyhow!("cannot create WAL in {}: {e}", cfg.wal_dir().display()))?;
    let cs = ConfState {
        voters: members.iter().map(|m| m.id).collect(),
        ..Default::default()
    };
    wal.save_snapshot(&WalSnapshot {
        index: INDEX,
        term: TERM,
        payload: cs.write_to_bytes()?,
    })
    .map_err(|e| anyhow::anyhow!("cannot write the WAL snapshot record: {e}"))?;
    println!(
        "restored snapshot to {} (member {:x}, cluster {:x})",
        data_dir.display(),
        member_id,
        cluster_id
    );
    Ok(())
}

async fn save(file: &Path, endpoint: &str) -> anyhow::Result<()> {
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    let ch = tonic::transport::Endpoint::from_shared(url.clone())?
        .connect()
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    let mut client = MaintenanceClient::new(ch).max_decoding_message_size(64 << 20);
    let mut stream = client.snapshot(SnapshotRequest {}).await?.into_inner();
    let mut part = file.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let mut f = std::fs::File::create(&part)
        .with_context(|| format!("cannot create {}", part.display()))?;
    let mut progress: Option<Progress> = None;
    let mut written = 0u64;
    // The last message is the SHA-256 trailer; hash everything before it.
    let mut pending: Option<Vec<u8>> = None;
    let mut sha = Sha256::new();
    eprintln!("fetching snapshot from {url}");
    while let Some(msg) = stream.message().await? {
        let p = progress.get_or_insert_with(|| {
            Progress::new(
                "saving snapshot",
                msg.remaining_bytes + msg.blob.len() as u64,
            )
        });
        f.write_all(&msg.blob)?;
        written += msg.blob.len() as u64;
        if let Some(prev) = pending.replace(msg.blob) {
            sha.update(&prev);
        }
        p.at(written);
    }
    let trailer = pending.unwrap_or_default();
    if trailer.len() != 32 || sha.finalize().as_slice() != trailer.as_slice() {
        let _ = std::fs::remove_file(&part);
        bail!("snapshot stream from {url} failed its sha256 check");
    }
    f.sync_all()?;
    std::fs::rename(&part, file)?;
    println!("Snapshot saved at {}", file.display());
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Snapshot(SnapshotCmd::Status { file }) => status(&file, &cli.write_out),
        Cmd::Snapshot(SnapshotCmd::Restore {
            file,
            name,
            initial_cluster,
            initial_cluster_token,
            initial_advertise_peer_urls,
            data_dir,
            wal_dir,
            skip_hash_check,
        }) => restore(
            &file,
            name,
            initial_cluster,
            initial_cluster_token,
            initial_advertise_peer_urls,
            data_dir,
            wal_dir,
            skip_hash_check,
        ),
        Cmd::Snapshot(SnapshotCmd::Save { file, endpoints }) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            let endpoint = endpoints.split(',').next().unwrap_or_default().to_string();
            rt.block_on(save(&file, &endpoint))
        }
    };
    if let Err(e) = res {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}
