//! retcdutl: offline tools for retcd data, like etcdutl.
//!
//! * `retcdutl snapshot save FILE --endpoints URL`: what `etcdctl snapshot
//!   save` does (Maintenance.Snapshot to a file), with progress.
//! * `retcdutl snapshot status FILE [-w simple|table|json]`.
//! * `retcdutl snapshot restore FILE --name --initial-cluster
//!   --initial-cluster-token --initial-advertise-peer-urls --data-dir`:
//!   a new member's data dir holding the snapshot's keys, revisions,
//!   leases, users and roles, a fresh WAL and the new cluster's members
//!   (IDs derived from the peer URLs and the token, as etcd does).
//! * `retcdutl migrate --etcd-data-dir DIR` and the restore flags: the same
//!   from a stopped etcd member's data dir, with the entries its WAL holds
//!   past its backend replayed through retcd's apply (migrate.rs).
//!
//! A snapshot file is etcd's: a bbolt backend (what `Maintenance.Snapshot`
//! streams, from etcd or retcd) followed by the SHA-256 of it. Files of
//! retcd's older format (`RETCDMVCC1` records, CRC-32C, padding, SHA-256)
//! are still read.

mod migrate;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::ConfState;
use redb::ReadableTableMetadata;
use retcd_api::etcdserverpb::maintenance_client::MaintenanceClient;
use retcd_api::etcdserverpb::SnapshotRequest;
use retcd_api::retcdpb::WalMetadata;
use retcd_etcdfmt::human_bytes;
use retcd_etcdfmt::BoltReader;
use retcd_mvcc::kvstore::{parse_dump, CONSISTENT_INDEX_KEY, DUMP_MAGIC, TERM_KEY};
use retcd_mvcc::{KvStore, Revision};
use retcd_server::config::Config;
use retcd_storage::backend::{commit_with, Backend, CommitPolicy, ALARM, MEMBERS, META};
use retcd_storage::wal::{Wal, WalEntry, WalSnapshot};
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
    /// Takes over a stopped etcd member's data dir: its backend and the
    /// entries its WAL holds past it, into a new retcd member's data dir.
    Migrate {
        /// The etcd member's data dir (holding member/snap/db, member/wal).
        #[arg(long)]
        etcd_data_dir: PathBuf,
        /// The etcd member's WAL dir, if not in its data dir.
        #[arg(long)]
        etcd_wal_dir: Option<PathBuf>,
        #[command(flatten)]
        member: NewMember,
    },
}

/// The new member a restore or a migration makes (etcdutl's flags).
#[derive(clap::Args, Debug)]
struct NewMember {
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
        #[command(flatten)]
        member: NewMember,
        /// Ignore a missing or wrong SHA-256 trailer.
        #[arg(long)]
        skip_hash_check: bool,
    },
}

/// Progress of a long step on stderr: a bar redrawn in place on a
/// terminal, else a line at every 10% (for inputs over 8 MiB).
pub(crate) struct Progress {
    what: &'static str,
    total: u64,
    next: u64,
    started: Instant,
    tty: bool,
}

impl Progress {
    pub(crate) fn new(what: &'static str, total: u64) -> Progress {
        use std::io::IsTerminal;
        Progress {
            what,
            total,
            next: 0,
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
        }
    }
    pub(crate) fn at(&mut self, done: u64) {
        if self.total < 8 << 20 || done < self.next {
            return;
        }
        let pct = (done * 100 / self.total.max(1)).min(100);
        let line = format!(
            "{} / {} ({pct}%, {:.1}s)",
            human_bytes(done),
            human_bytes(self.total),
            self.started.elapsed().as_secs_f64()
        );
        if self.tty {
            let bar = (pct / 5) as usize;
            eprint!(
                "\r{}: [{}{}] {line}",
                self.what,
                "=".repeat(bar),
                " ".repeat(20 - bar)
            );
            if done >= self.total {
                eprintln!();
            }
            self.next = done + self.total / 100;
        } else {
            eprintln!("{}: {line}", self.what);
            self.next = done + self.total / 10;
        }
    }
}

/// Reads a snapshot file of retcd's older format and returns the dump
/// (without padding and the SHA-256 trailer), checked.
fn read_retcd_snapshot(file: &Path, skip_hash_check: bool) -> anyhow::Result<Vec<u8>> {
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

/// An opened snapshot file.
enum Snapshot {
    /// etcd's format: a bbolt backend (any trailer lies past its pages).
    Etcd(BoltReader),
    /// retcd's older format: the checked dump.
    Retcd(Vec<u8>),
}

/// Opens FILE, of either format, checking its SHA-256 trailer as etcdutl
/// does (a file of etcd's format without one needs `--skip-hash-check`).
fn open_snapshot(file: &Path, skip_hash_check: bool) -> anyhow::Result<Snapshot> {
    let mut f = std::fs::File::open(file)
        .with_context(|| format!("cannot open snapshot file {}", file.display()))?;
    let mut head = [0u8; 16];
    let n = f.read(&mut head)?;
    if head[..n].starts_with(DUMP_MAGIC) {
        return Ok(Snapshot::Retcd(read_retcd_snapshot(file, skip_hash_check)?));
    }
    let len = f.metadata()?.len();
    let has_hash = retcd_etcdfmt::has_sha256_trailer(len);
    if has_hash && !skip_hash_check {
        let mut sha = Sha256::new();
        let mut progress = Progress::new("checking snapshot hash", len - 32);
        let mut left = len - 32;
        let mut buf = vec![0u8; 1 << 20];
        let mut r = std::io::BufReader::new(&f);
        std::io::Seek::seek(&mut r, std::io::SeekFrom::Start(0))?;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            r.read_exact(&mut buf[..want])?;
            sha.update(&buf[..want]);
            left -= want as u64;
            progress.at(len - 32 - left);
        }
        let mut want = [0u8; 32];
        r.read_exact(&mut want)?;
        let got = sha.finalize();
        if got.as_slice() != want {
            bail!(
                "expected sha256 {}, got {} (snapshot file {} is corrupted)",
                hex(&want),
                hex(&got),
                file.display()
            );
        }
    } else if !has_hash && !skip_hash_check {
        bail!("snapshot missing hash but --skip-hash-check=false");
    }
    let r = BoltReader::from_file(f).with_context(|| {
        format!(
            "snapshot file {} is not an etcd or retcd snapshot",
            file.display()
        )
    })?;
    Ok(Snapshot::Etcd(r))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What `snapshot status` prints (etcdutl's figures; for retcd's former
/// format, its CRC and the file's size).
fn snapshot_stats(snap: &Snapshot, file: &Path) -> anyhow::Result<retcd_etcdfmt::Status> {
    match snap {
        Snapshot::Etcd(r) => retcd_etcdfmt::status(r)
            .with_context(|| format!("snapshot file {} is damaged", file.display())),
        Snapshot::Retcd(dump) => {
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
            Ok(retcd_etcdfmt::Status {
                hash: crc,
                revision,
                total_keys: records.len() as u64,
                total_size: std::fs::metadata(file)?.len(),
            })
        }
    }
}

fn status(file: &Path, format: &str) -> anyhow::Result<()> {
    let snap = open_snapshot(file, true)?;
    let s = snapshot_stats(&snap, file)?;
    let size = s.total_size;
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
                // etcdutl's table aligns every cell right
                .map(|(c, w)| format!("{c:>width$} ", width = w - 1))
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

/// The new member's configuration, checked by the server's own flag
/// parsing, and the new cluster: its members, this member's id and the
/// cluster id (derived as etcd derives them). Refuses an existing data dir.
pub(crate) struct NewCluster {
    cfg: Config,
    members: Vec<retcd_api::retcdpb::Member>,
    member_id: u64,
    cluster_id: u64,
}

fn new_cluster(m: &NewMember) -> anyhow::Result<NewCluster> {
    let mut args = vec![
        format!("--name={}", m.name),
        format!("--initial-cluster={}", m.initial_cluster),
        format!("--initial-cluster-token={}", m.initial_cluster_token),
        format!(
            "--initial-advertise-peer-urls={}",
            m.initial_advertise_peer_urls
        ),
    ];
    if let Some(d) = &m.data_dir {
        args.push(format!("--data-dir={}", d.display()));
    }
    if let Some(d) = &m.wal_dir {
        args.push(format!("--wal-dir={}", d.display()));
    }
    let cfg = Config::from_args(&args).map_err(|e| anyhow::anyhow!("{e}"))?;
    cfg.validate().map_err(anyhow::Error::msg)?;
    let (members, member_id, cluster_id) = retcd_server::apply::membership::initial_cluster(&cfg)?;
    let data_dir = cfg.data_dir();
    if data_dir.exists() {
        bail!("data-dir {:?} exists", data_dir.display().to_string());
    }
    Ok(NewCluster {
        cfg,
        members,
        member_id,
        cluster_id,
    })
}

/// Fills a new backend at `nc`'s path: `fill` restores the key space into
/// it (see [`KvStore::restore_with`]).
fn restore_backend(
    nc: &NewCluster,
    fill: &mut dyn FnMut(&KvStore) -> anyhow::Result<()>,
) -> anyhow::Result<Arc<Backend>> {
    let cfg = &nc.cfg;
    std::fs::create_dir_all(cfg.snap_dir())
        .with_context(|| format!("cannot create {}", cfg.snap_dir().display()))?;
    let backend = Arc::new(Backend::open(&cfg.backend_path()).map_err(|e| anyhow::anyhow!("{e}"))?);
    let kv = KvStore::open(backend.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    fill(&kv)?;
    drop(kv);
    Ok(backend)
}

/// Restores the rows of the etcd backend `r` into `kv`, with progress.
fn restore_etcd_rows(kv: &KvStore, r: &BoltReader) -> anyhow::Result<u64> {
    let mut progress = Progress::new("restoring", r.size());
    let mut done = 0u64;
    let mut rows = 0u64;
    kv.restore_with(&mut |put| {
        retcd_etcdfmt::read_backend(r, &mut |t, k, v| {
            done += (k.len() + v.len() + 16) as u64;
            rows += 1;
            progress.at(done.min(r.size()));
            put(t, k, v).map_err(|e| retcd_etcdfmt::FormatError::Write(e.to_string()))
        })
        .map_err(|e| retcd_mvcc::MvccError::Backend(e.to_string()))
    })
    .map_err(|e| anyhow::anyhow!("cannot restore the snapshot: {e}"))?;
    Ok(rows)
}

/// Makes the new cluster's member out of a filled backend: its members
/// (the snapshot's alarms kept), and a log that starts after a snapshot at index 1, term 1 (as a
/// new cluster's does), followed by `entries` (encoded retcd requests),
/// committed, for the member to apply when it starts.
fn finish_member(
    nc: &NewCluster,
    backend: Arc<Backend>,
    entries: &[Vec<u8>],
) -> anyhow::Result<()> {
    const INDEX: u64 = 1;
    const TERM: u64 = 1;
    let cfg = &nc.cfg;
    {
        let txn = backend.db().begin_write()?;
        txn.delete_table(MEMBERS)?;
        {
            let mut t = txn.open_table(MEMBERS)?;
            for m in &nc.members {
                t.insert(m.id, m.encode_to_vec().as_slice())?;
            }
            // Alarms stay, as etcdutl's restore keeps etcd's alarm bucket
            // (a NOSPACE raised before the snapshot still refuses writes
            // until `alarm disarm`).
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
        member_id: nc.member_id,
        cluster_id: nc.cluster_id,
        members: nc.members.clone(),
    };
    let mut wal = Wal::create(&cfg.wal_dir(), &meta.encode_to_vec())
        .map_err(|e| anyhow::anyhow!("cannot create WAL in {}: {e}", cfg.wal_dir().display()))?;
    let cs = ConfState {
        voters: nc.members.iter().map(|m| m.id).collect(),
        ..Default::default()
    };
    wal.save_snapshot(&WalSnapshot {
        index: INDEX,
        term: TERM,
        payload: cs.write_to_bytes()?,
    })
    .map_err(|e| anyhow::anyhow!("cannot write the WAL snapshot record: {e}"))?;
    if !entries.is_empty() {
        let mut batch = Vec::new();
        let mut index = INDEX;
        for data in entries {
            index += 1;
            let e = raft::eraftpb::Entry {
                index,
                term: TERM,
                data: data.clone().into(),
                ..Default::default()
            };
            batch.push(WalEntry {
                index,
                term: TERM,
                data: e.write_to_bytes()?,
            });
            if batch.len() == 1024 {
                wal.save(None, &batch)
                    .map_err(|e| anyhow::anyhow!("cannot write the WAL: {e}"))?;
                batch.clear();
            }
        }
        let hs = raft::eraftpb::HardState {
            term: TERM,
            commit: index,
            ..Default::default()
        };
        wal.save(Some(&hs.write_to_bytes()?), &batch)
            .map_err(|e| anyhow::anyhow!("cannot write the WAL: {e}"))?;
    }
    Ok(())
}

fn restore(file: &Path, member: &NewMember, skip_hash_check: bool) -> anyhow::Result<()> {
    let nc = new_cluster(member)?;
    let snap = open_snapshot(file, skip_hash_check)?;
    let data_dir = nc.cfg.data_dir();
    eprintln!(
        "restoring snapshot {} into {}",
        file.display(),
        data_dir.display()
    );
    let started = Instant::now();
    let mut rows = 0;
    restore_backend(&nc, &mut |kv| {
        rows = match &snap {
            Snapshot::Retcd(dump) => {
                kv.restore_from(dump)
                    .map_err(|e| anyhow::anyhow!("cannot restore the snapshot: {e}"))?;
                parse_dump(dump)?.len() as u64
            }
            Snapshot::Etcd(r) => restore_etcd_rows(kv, r)?,
        };
        Ok(())
    })
    .and_then(|backend| {
        eprintln!(
            "restored {rows} records in {:.1}s",
            started.elapsed().as_secs_f64()
        );
        finish_member(&nc, backend, &[])
    })
    .inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&data_dir);
    })?;
    println!(
        "restored snapshot to {} (member {:x}, cluster {:x})",
        data_dir.display(),
        nc.member_id,
        nc.cluster_id
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
            member,
            skip_hash_check,
        }) => restore(&file, &member, skip_hash_check),
        Cmd::Migrate {
            etcd_data_dir,
            etcd_wal_dir,
            member,
        } => migrate::migrate(&etcd_data_dir, etcd_wal_dir.as_deref(), &member),
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
