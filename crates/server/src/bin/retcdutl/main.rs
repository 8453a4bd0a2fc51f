//! retcdutl: offline tools for retcd data, with etcdutl 3.5.1's command
//! line (its commands, flags, usage pages, error texts and exit codes:
//! `tests/tests/etcdutl_random_differential.rs` holds it to etcdutl's).
//!
//! * `retcdutl snapshot status FILE [-w simple|json|table|fields]`:
//!   etcdutl's figures of an etcd snapshot file.
//! * `retcdutl snapshot restore FILE --data-dir DIR [--name
//!   --initial-cluster --initial-cluster-token --initial-advertise-peer-urls
//!   --wal-dir --skip-hash-check]`: a new member's data dir holding the
//!   snapshot's keys, revisions, leases, users and roles, a fresh WAL and
//!   the new cluster's members (IDs derived from the peer URLs and the
//!   token, as etcd does), checked as etcdutl checks them.
//! * `retcdutl defrag --data-dir DIR`: defragments a stopped retcd
//!   member's backend.
//! * `retcdutl version`.
//! * `retcdutl snapshot save FILE --endpoints URL` (hidden, as etcdutl's
//!   is; etcdutl's refuses, retcdutl's does what etcdctl 3.4's `snapshot
//!   save` does, with its texts and exit codes).
//! * `retcdutl migrate --etcd-data-dir DIR` and the restore flags
//!   (hidden; retcd's own): the same from a stopped etcd member's data
//!   dir, with the entries its WAL holds past its backend replayed through
//!   retcd's apply (migrate.rs).
//! * `backup` is listed, as etcdutl lists it, but refuses to run: it works
//!   on etcd's v2 data dirs, which retcd has none of.
//!
//! A snapshot file is etcd's: a bbolt backend (what `Maintenance.Snapshot`
//! streams, from etcd or retcd) followed by the SHA-256 of it. Files of
//! retcd's older format (`RETCDMVCC1` records, CRC-32C, padding, SHA-256)
//! are still read.

// The command line and every text that may hold a piece of it carry its
// raw bytes (`retcd_gostd::raw`): paths open as the bytes given, and
// output prints them as they are, as Go prints a string.
macro_rules! outw { ($($t:tt)*) => { retcd_gostd::raw::print(&format!($($t)*)) } }
macro_rules! outln {
    () => { outw!("\n") };
    ($($t:tt)*) => { outw!("{}\n", format_args!($($t)*)) };
}
macro_rules! errw { ($($t:tt)*) => { retcd_gostd::raw::eprint(&format!($($t)*)) } }
macro_rules! errln {
    () => { errw!("\n") };
    ($($t:tt)*) => { errw!("{}\n", format_args!($($t)*)) };
}

mod migrate;

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::ConfState;
use redb::ReadableTableMetadata;
use retcd_api::etcdserverpb::maintenance_client::MaintenanceClient;
use retcd_api::etcdserverpb::SnapshotRequest;
use retcd_api::retcdpb::WalMetadata;
use retcd_cobra::{self as cobra, flag, go_quote, required, Cmd, Flag, Kind, Outcome, Parsed};
use retcd_etcdfmt::human_bytes;
use retcd_etcdfmt::BoltReader;
use retcd_gostd::raw;
use retcd_mvcc::kvstore::{parse_dump, CONSISTENT_INDEX_KEY, DUMP_MAGIC, TERM_KEY};
use retcd_mvcc::{KvStore, Revision};
use retcd_server::config::{advertise_matches_cluster, urls_map_string};
use retcd_storage::backend::{commit_with, Backend, CommitPolicy, ALARM, MEMBERS, META};
use retcd_storage::wal::{Wal, WalEntry, WalSnapshot};
use sha2::{Digest, Sha256};

/// What `version` prints: the etcdutl this command line follows.
const VERSION: &str = "3.5.1";
const API_VERSION: &str = "3.5";

/// cobrautl's exit codes.
const EXIT_ERROR: i32 = 1;
const EXIT_BAD_FEATURE: i32 = 4;
const EXIT_INTERRUPTED: i32 = 5;
const EXIT_BAD_ARGS: i32 = 128;

/// A command's failure: cobrautl's `ExitWithError` (`Error: msg`, then
/// the exit code).
#[derive(Debug)]
struct Exit {
    code: i32,
    /// The message as bytes (Go prints a `[]byte` with `%s` as it is).
    msg: Vec<u8>,
}

fn exit(code: i32, msg: impl std::fmt::Display) -> Exit {
    Exit {
        code,
        msg: raw::vec(&msg.to_string()),
    }
}

impl From<anyhow::Error> for Exit {
    fn from(e: anyhow::Error) -> Exit {
        exit(EXIT_ERROR, format!("{e:#}"))
    }
}

/// The new member's flags (etcdutl's restore flags).
fn member_flags() -> Vec<Flag> {
    vec![
        flag(
            "wal-dir",
            Kind::Str,
            "",
            "Path to the WAL directory (use --data-dir if none given)",
        ),
        flag(
            "initial-cluster",
            Kind::Str,
            "default=http://localhost:2380",
            "Initial cluster configuration for restore bootstrap",
        ),
        flag(
            "initial-cluster-token",
            Kind::Str,
            "etcd-cluster",
            "Initial cluster token for the etcd cluster during restore bootstrap",
        ),
        flag(
            "initial-advertise-peer-urls",
            Kind::Str,
            "http://localhost:2380",
            "List of this member's peer URLs to advertise to the rest of the cluster",
        ),
        flag(
            "name",
            Kind::Str,
            "default",
            "Human-readable name for this member",
        ),
    ]
}

/// etcdutl 3.5.1's command tree (plus retcdutl's hidden commands).
fn tree() -> Cmd {
    let mut restore = member_flags();
    restore.push(required(flag(
        "data-dir",
        Kind::Str,
        "",
        "Path to the output data directory",
    )));
    restore.push(flag(
        "skip-hash-check",
        Kind::Bool,
        "false",
        "Ignore snapshot integrity hash value (required if copied from data directory)",
    ));
    let mut migrate = member_flags();
    migrate.push(flag(
        "data-dir",
        Kind::Str,
        "",
        "Path to the output data directory",
    ));
    migrate.push(required(flag(
        "etcd-data-dir",
        Kind::Str,
        "",
        "The etcd member's data dir (holding member/snap/db, member/wal)",
    )));
    migrate.push(flag(
        "etcd-wal-dir",
        Kind::Str,
        "",
        "The etcd member's WAL dir, if not in its data dir",
    ));
    let mut save = Cmd::new(
        "save <filename>",
        "Stores an etcd node backend snapshot to a given file",
    )
    .flags(vec![flag(
        "endpoints",
        Kind::Strings,
        "[127.0.0.1:2379]",
        "gRPC endpoints",
    )])
    .hidden();
    save.exact = false; // etcdutl has it (hidden) too
    save.disable_flags_in_use_line = true;
    let mut root = Cmd::group(
        "etcdutl",
        "An administrative command line tool for etcd3.",
        vec![
            Cmd::new("backup", "[legacy] offline backup of etcd directory")
                .long("Prefer: `etcdctl snapshot save` instead.")
                .flags(vec![
                    required(flag("data-dir", Kind::Str, "", "Path to the etcd data dir")),
                    flag("wal-dir", Kind::Str, "", "Path to the etcd wal dir"),
                    required(flag("backup-dir", Kind::Str, "", "Path to the backup dir")),
                    flag("backup-wal-dir", Kind::Str, "", "Path to the backup wal dir"),
                    flag("with-v3", Kind::Bool, "true", "Backup v3 backend data"),
                ]),
            Cmd::new("defrag", "Defragments the storage of the etcd").flags(vec![required(
                flag(
                    "data-dir",
                    Kind::Str,
                    "",
                    "Required. Defragments a data directory not in use by etcd.",
                ),
            )]),
            Cmd::group(
                "snapshot <subcommand>",
                "Manages etcd node snapshots",
                vec![
                    save,
                    Cmd::new(
                        "restore <filename> --data-dir {output dir} [options]",
                        "Restores an etcd member snapshot to an etcd directory",
                    )
                    .flags(restore),
                    Cmd::new("status <filename>", "Gets backend snapshot status of a given file")
                        .long("When --write-out is set to simple, this command prints out comma-separated status lists for each endpoint.\nThe items in the lists are hash, revision, total keys, total size.\n"),
                ],
            ),
            Cmd::new("version", "Prints the version of etcdutl"),
            Cmd::new(
                "migrate",
                "Takes over a stopped etcd member's data dir into a new retcd member's",
            )
            .flags(migrate)
            .hidden(),
        ],
    );
    root.persistent = vec![Flag {
        short: Some('w'),
        ..flag(
            "write-out",
            Kind::Str,
            "simple",
            "set the output format (fields, json, protobuf, simple, table)",
        )
    }];
    cobra::with_help_command(root)
}

// ------------------------------------------------------------- logging

/// Now as RFC 3339 in UTC (zap's `RFC3339TimeEncoder`).
fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // civil_from_days (H. Hinnant)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// An informational line on stderr, in the shape of etcdutl's (zap's
/// console encoder): time, level, message, fields as JSON.
pub(crate) fn log_info(msg: &str, fields: &[(&str, String)]) {
    let f: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}: {}", serde_json::Value::from(*k), zap_json_string(v)))
        .collect();
    errln!("{}\tINFO\t{msg}\t{{{}}}", rfc3339_now(), f.join(", "));
}

/// zap's JSON string of the bytes `s` carries: each byte that is not part
/// of valid UTF-8 is the six characters `\ufffd`.
fn zap_json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for chunk in raw::bytes(s).utf8_chunks() {
        let valid = serde_json::Value::from(chunk.valid()).to_string();
        out.push_str(&valid[1..valid.len() - 1]);
        out.push_str(&"\\ufffd".repeat(chunk.invalid().len()));
    }
    out.push('"');
    out
}

// ------------------------------------------------------- Go's error texts

/// Go's text of an OS error (`syscall.Errno.Error()`: the C library's
/// message, lower-cased).
fn go_errno(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let s = std::io::Error::from_raw_os_error(n).to_string();
            let s = s.split(" (os error").next().unwrap_or(&s).to_string();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().collect::<String>() + c.as_str(),
                None => s,
            }
        }
        None => e.to_string(),
    }
}

/// Go's `*os.PathError` text: `op path: errno`.
fn go_path_err(op: &str, path: &str, e: &std::io::Error) -> String {
    format!("{op} {path}: {}", go_errno(e))
}

/// Go's `%v` of a byte slice: `[1 2 3]`.
fn go_bytes(b: &[u8]) -> String {
    let v: Vec<String> = b.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(" "))
}

/// Go's `filepath.Join` (which cleans the result).
fn go_join(parts: &[&str]) -> String {
    let joined = parts
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/");
    go_clean(&joined)
}

/// Go's `filepath.Clean`.
fn go_clean(p: &str) -> String {
    if p.is_empty() {
        return ".".into();
    }
    let rooted = p.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if out.last().is_some_and(|l| *l != "..") {
                    out.pop();
                } else if !rooted {
                    out.push("..");
                }
            }
            x => out.push(x),
        }
    }
    let s = out.join("/");
    match (rooted, s.is_empty()) {
        (true, _) => format!("/{s}"),
        (false, true) => ".".into(),
        (false, false) => s,
    }
}

// ------------------------------------------------------------- progress

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
            errw!(
                "\r{}: [{}{}] {line}",
                self.what,
                "=".repeat(bar),
                " ".repeat(20 - bar)
            );
            if done >= self.total {
                errln!();
            }
            self.next = done + self.total / 100;
        } else {
            errln!("{}: {line}", self.what);
            self.next = done + self.total / 10;
        }
    }
}

// ------------------------------------------------------------ snapshots

/// Reads a snapshot file of retcd's older format and returns the dump
/// (without padding and the SHA-256 trailer), checked.
fn read_retcd_snapshot(file: &Path, skip_hash_check: bool) -> anyhow::Result<Vec<u8>> {
    let mut f = File::open(file)
        .with_context(|| format!("cannot open snapshot file {}", raw::path_text(file)))?;
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
            raw::path_text(file)
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

/// Whether the file starts as retcd's older snapshot format does.
fn is_retcd_format(f: &File) -> bool {
    let mut head = [0u8; 16];
    let n = f.read_at(&mut head, 0).unwrap_or(0);
    n >= DUMP_MAGIC.len() && head[..n].starts_with(DUMP_MAGIC)
}

/// bbolt 1.3.6's meta page check (`meta.validate`).
fn bolt_meta_error(m: &[u8]) -> Option<&'static str> {
    let u32_at = |at: usize| u32::from_le_bytes(m[at..at + 4].try_into().expect("4 bytes"));
    let checksum = u64::from_le_bytes(m[56..64].try_into().expect("8 bytes"));
    if u32_at(0) != 0xED0C_DAED {
        Some("invalid database")
    } else if u32_at(4) != 2 {
        Some("version mismatch")
    } else if checksum != 0 && checksum != retcd_etcdfmt::bolt::fnv1a64(&m[..56]) {
        Some("checksum error")
    } else {
        None
    }
}

/// bbolt 1.3.6's `Open(path, 0400, ReadOnly)`'s `open(2)`: with
/// `O_CREATE`, so a directory is refused.
fn open_read_only(file: &str) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CREAT)
        .mode(0o400)
        .open(raw::path(file))
        .map_err(|e| go_path_err("open", file, &e))
}

/// What bbolt 1.3.6's `Open(path, 0400, ReadOnly)` refuses of the open
/// file, with its texts: `etcdutl snapshot status` opens the file so.
fn bolt_check_read_only(f: &File, file: &str) -> Result<(), String> {
    let size = f
        .metadata()
        .map_err(|e| go_path_err("stat", file, &e))?
        .len();
    if size == 0 {
        // bbolt initialises an empty file, through a read-only handle
        return Err(format!("write {file}: bad file descriptor"));
    }
    let mut page0 = [0u8; 4096];
    if f.read_exact_at(&mut page0, 0).is_err() {
        return Err("invalid database".into());
    }
    let err0 = bolt_meta_error(&page0[16..80]);
    let page_size = match err0 {
        None => u64::from(u32::from_le_bytes(
            page0[24..28].try_into().expect("4 bytes"),
        )),
        Some(_) => 4096,
    };
    if size < 2 * page_size {
        return Err("file size too small".into());
    }
    let mut meta1 = [0u8; 80];
    let err1 = match f.read_exact_at(&mut meta1, page_size) {
        Ok(()) => bolt_meta_error(&meta1[16..80]),
        Err(_) => Some("invalid database"),
    };
    if let (Some(e), Some(_)) = (err0, err1) {
        return Err(e.into());
    }
    Ok(())
}

/// `snapshot status FILE`: what etcdutl's `Status` reads.
fn status_of(file: &str) -> Result<retcd_etcdfmt::Status, Vec<u8>> {
    status_read(file).map_err(|e| match e {
        StatusError::NotABucket(name) => [b"cannot get hash of bucket ".as_slice(), &name].concat(),
        StatusError::Other(s) => raw::vec(&s),
    })
}

enum StatusError {
    NotABucket(Vec<u8>),
    Other(String),
}

impl From<String> for StatusError {
    fn from(s: String) -> StatusError {
        StatusError::Other(s)
    }
}

fn status_read(file: &str) -> Result<retcd_etcdfmt::Status, StatusError> {
    let path = raw::path(file);
    std::fs::metadata(&path).map_err(|e| go_path_err("stat", file, &e))?;
    let f = open_read_only(file)?;
    if !is_retcd_format(&f) {
        bolt_check_read_only(&f, file)?;
    } else {
        let dump = read_retcd_snapshot(&path, true).map_err(|e| format!("{e:#}"))?;
        return retcd_stats(&dump, &path).map_err(|e| StatusError::Other(format!("{e:#}")));
    }
    let r = BoltReader::from_file(f)
        .map_err(|e| format!("snapshot file integrity check failed: {e}"))?;
    retcd_etcdfmt::status(&r).map_err(|e| match e {
        retcd_etcdfmt::FormatError::NotABucket(name) => StatusError::NotABucket(name),
        e => StatusError::Other(format!("snapshot file integrity check failed: {e}")),
    })
}

/// `snapshot status`'s figures of retcd's former format: its CRC and the
/// file's size.
fn retcd_stats(dump: &[u8], file: &Path) -> anyhow::Result<retcd_etcdfmt::Status> {
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

fn status_cmd(p: &Parsed) -> Result<(), Exit> {
    if p.args.len() != 1 {
        return Err(exit(
            EXIT_BAD_ARGS,
            "snapshot status requires exactly one argument",
        ));
    }
    let format = p.get("write-out");
    if !matches!(format, "simple" | "json" | "table" | "fields" | "protobuf") {
        return Err(exit(EXIT_BAD_FEATURE, "unsupported output format"));
    }
    let s = status_of(&p.args[0]).map_err(|msg| Exit {
        code: EXIT_ERROR,
        msg,
    })?;
    let size = s.total_size;
    match format {
        "protobuf" => {
            return Err(exit(
                EXIT_BAD_FEATURE,
                "protobuf not supported as output format",
            ))
        }
        "json" => outln!(
            "{{\"hash\":{},\"revision\":{},\"totalKey\":{},\"totalSize\":{}}}",
            s.hash,
            s.revision,
            s.total_keys,
            size
        ),
        "fields" => {
            outln!("\"Hash\" : {}", s.hash);
            outln!("\"Revision\" : {}", s.revision);
            outln!("\"Keys\" : {}", s.total_keys);
            outln!("\"Size\" : {size}");
        }
        "table" => outw!("{}", status_table(&s)),
        _ => outln!(
            "{:x}, {}, {}, {}",
            s.hash,
            s.revision,
            s.total_keys,
            human_bytes(size)
        ),
    }
    Ok(())
}

/// tablewriter's table of the figures (every cell right-aligned).
fn status_table(s: &retcd_etcdfmt::Status) -> String {
    let cells = [
        format!("{:x}", s.hash),
        s.revision.to_string(),
        s.total_keys.to_string(),
        human_bytes(s.total_size),
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
    // tablewriter's Pad inside one blank either side: an odd gap puts the
    // extra blank on the right
    let center = |s: &str, w: usize| {
        let gap = w - 2 - s.len();
        format!(
            " {}{}{} ",
            " ".repeat(gap / 2),
            s,
            " ".repeat(gap - gap / 2)
        )
    };
    let h: Vec<String> = heads.iter().zip(&w).map(|(h, w)| center(h, *w)).collect();
    let c: Vec<String> = cells
        .iter()
        .zip(&w)
        .map(|(c, w)| format!("{c:>width$} ", width = w - 1))
        .collect();
    format!(
        "{}\n|{}|\n{}\n|{}|\n{}\n",
        line(),
        h.join("|"),
        line(),
        c.join("|"),
        line()
    )
}

// -------------------------------------------------------- the new member

/// The new member a restore or a migration makes (etcdutl's flags).
#[derive(Debug)]
pub(crate) struct NewMember {
    name: String,
    initial_cluster: String,
    initial_cluster_token: String,
    initial_advertise_peer_urls: String,
    /// etcdutl's: `--data-dir`, or `${name}.etcd`.
    data_dir: String,
    /// etcdutl's: `--wal-dir`, or `${data-dir}/member/wal`.
    wal_dir: String,
}

impl NewMember {
    fn from_flags(p: &Parsed) -> NewMember {
        let name = p.get("name").to_string();
        let data_dir = match p.get("data-dir") {
            "" => format!("{name}.etcd"),
            d => d.to_string(),
        };
        let wal_dir = match p.get("wal-dir") {
            "" => go_join(&[&data_dir, "member", "wal"]),
            w => w.to_string(),
        };
        NewMember {
            name,
            initial_cluster: p.get("initial-cluster").to_string(),
            initial_cluster_token: p.get("initial-cluster-token").to_string(),
            initial_advertise_peer_urls: p.get("initial-advertise-peer-urls").to_string(),
            data_dir,
            wal_dir,
        }
    }
}

/// Where the new member's files go.
pub(crate) struct Paths {
    data_dir: PathBuf,
    wal_dir: PathBuf,
}

impl Paths {
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.data_dir.clone()
    }
    fn snap_dir(&self) -> PathBuf {
        self.data_dir.join("member").join("snap")
    }
    fn backend_path(&self) -> PathBuf {
        self.snap_dir().join("db")
    }
}

/// The new member's paths and the new cluster: its members, this member's
/// id and the cluster id (derived as etcd derives them).
pub(crate) struct NewCluster {
    paths: Paths,
    members: Vec<retcd_api::retcdpb::Member>,
    member_id: u64,
    cluster_id: u64,
}

/// etcd's `types.NewURLs`: each URL checked (after trimming blanks), the
/// list sorted.
fn new_urls(strs: &[&str]) -> Result<Vec<String>, String> {
    if strs.is_empty() {
        return Err("no valid URLs given".into());
    }
    let mut out = Vec::new();
    for s in strs {
        let s = s.trim();
        retcd_server::config::flags::check_url(s)?;
        // url.Parse lower-cases the scheme
        let u = match s.split_once("://") {
            Some((scheme, rest)) => format!("{}://{rest}", scheme.to_lowercase()),
            None => s.to_string(),
        };
        out.push(u);
    }
    out.sort();
    Ok(out)
}

/// etcd's `types.NewURLsMap`: `name=url,...` (a name may repeat).
fn new_urls_map(s: &str) -> Result<std::collections::BTreeMap<String, Vec<String>>, String> {
    let mut raw: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for part in s.split(',') {
        if part.is_empty() {
            continue;
        }
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        raw.entry(k.to_string()).or_default().push(v);
    }
    let mut m = std::collections::BTreeMap::new();
    for (name, urls) in raw {
        m.insert(name, new_urls(&urls)?);
    }
    Ok(m)
}

/// The new cluster of `m`, checked as etcdutl's restore checks it (the
/// URLs, `VerifyBootstrap`, then the output directories).
fn new_cluster(m: &NewMember) -> anyhow::Result<NewCluster> {
    let peers: Vec<&str> = m.initial_advertise_peer_urls.split(',').collect();
    let peers = new_urls(&peers).map_err(anyhow::Error::msg)?;
    let cluster = new_urls_map(&m.initial_cluster).map_err(anyhow::Error::msg)?;
    let Some(mine) = cluster.get(&m.name) else {
        anyhow::bail!(
            "couldn't find local name {} in the initial cluster configuration",
            go_quote(&m.name)
        );
    };
    advertise_matches_cluster(&m.name, mine, &peers).map_err(anyhow::Error::msg)?;
    let mut seen = std::collections::HashSet::new();
    if cluster.values().flatten().any(|u| !seen.insert(u)) {
        anyhow::bail!(
            "initial cluster {} has duplicate url",
            urls_map_string(&cluster)
        );
    }
    let mut members: Vec<retcd_api::retcdpb::Member> = cluster
        .iter()
        .map(|(name, urls)| retcd_api::retcdpb::Member {
            id: retcd_server::ids::member_id(urls, &m.initial_cluster_token),
            name: name.clone(),
            peer_urls: urls.clone(),
            client_urls: vec![],
            is_learner: false,
        })
        .collect();
    members.sort_by_key(|x| x.id);
    let member_id = members
        .iter()
        .find(|x| x.name == m.name)
        .map(|x| x.id)
        .expect("the local member is in the cluster");
    let cluster_id =
        retcd_server::ids::cluster_id(&members.iter().map(|x| x.id).collect::<Vec<_>>());
    // fileutil.Exist && !fileutil.DirEmpty
    let (data_dir, wal_dir) = (raw::path(&m.data_dir), raw::path(&m.wal_dir));
    if std::fs::metadata(&data_dir).is_ok() {
        let empty = std::fs::read_dir(&data_dir).is_ok_and(|mut d| d.next().is_none());
        if !empty {
            anyhow::bail!(
                "data-dir {} not empty or could not be read",
                go_quote(&m.data_dir)
            );
        }
    }
    if std::fs::metadata(&wal_dir).is_ok() {
        anyhow::bail!("wal-dir {} exists", go_quote(&m.wal_dir));
    }
    Ok(NewCluster {
        paths: Paths { data_dir, wal_dir },
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
    let snap_dir = nc.paths.snap_dir();
    std::fs::create_dir_all(&snap_dir)
        .with_context(|| format!("cannot create {}", raw::path_text(&snap_dir)))?;
    let backend =
        Arc::new(Backend::open(&nc.paths.backend_path()).map_err(|e| anyhow::anyhow!("{e}"))?);
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
        log_info(
            "restored backend",
            &[
                ("path", raw::path_text(&nc.paths.backend_path())),
                ("revisions", n.to_string()),
            ],
        );
    }
    drop(backend);
    let meta = WalMetadata {
        member_id: nc.member_id,
        cluster_id: nc.cluster_id,
        members: nc.members.clone(),
    };
    let wal_dir = &nc.paths.wal_dir;
    let mut wal = Wal::create(wal_dir, &meta.encode_to_vec())
        .map_err(|e| anyhow::anyhow!("cannot create WAL in {}: {e}", raw::path_text(wal_dir)))?;
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

/// Opens the snapshot to restore as etcdutl's `copyAndVerifyDB` does: the
/// trailer read first (a file shorter than it cannot be seeked to it),
/// then checked unless `skip_hash_check`.
fn open_for_restore(file: &str, skip_hash_check: bool) -> Result<Snapshot, String> {
    let f = File::open(raw::path(file)).map_err(|e| go_path_err("open", file, &e))?;
    let len = f
        .metadata()
        .map_err(|e| go_path_err("stat", file, &e))?
        .len();
    if len < 32 {
        return Err(format!("seek {file}: invalid argument"));
    }
    let mut want = [0u8; 32];
    f.read_exact_at(&mut want, len - 32)
        .map_err(|e| go_path_err("read", file, &e))?;
    if is_retcd_format(&f) {
        return read_retcd_snapshot(&raw::path(file), skip_hash_check)
            .map(Snapshot::Retcd)
            .map_err(|e| format!("{e:#}"));
    }
    let has_hash = retcd_etcdfmt::has_sha256_trailer(len);
    if !has_hash && !skip_hash_check {
        return Err("snapshot missing hash but --skip-hash-check=false".into());
    }
    if has_hash && !skip_hash_check {
        let mut sha = Sha256::new();
        let mut progress = Progress::new("checking snapshot hash", len - 32);
        let mut at = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        while at < len - 32 {
            let want = (len - 32 - at).min(buf.len() as u64) as usize;
            f.read_exact_at(&mut buf[..want], at)
                .map_err(|e| go_path_err("read", file, &e))?;
            sha.update(&buf[..want]);
            at += want as u64;
            progress.at(at);
        }
        let got = sha.finalize();
        if got.as_slice() != want {
            return Err(format!(
                "expected sha256 {}, got {}",
                go_bytes(&want),
                go_bytes(&got)
            ));
        }
    }
    BoltReader::from_file(f)
        .map(Snapshot::Etcd)
        .map_err(|e| format!("snapshot file {file} is not an etcd or retcd snapshot: {e}"))
}

/// Removes what a failed restore made: the data dir (its contents only,
/// when it existed empty before) and a separate WAL dir.
fn clean_up(nc: &NewCluster, data_dir_existed: bool) {
    if data_dir_existed {
        let _ = std::fs::remove_dir_all(nc.paths.data_dir.join("member"));
    } else {
        let _ = std::fs::remove_dir_all(&nc.paths.data_dir);
    }
    let _ = std::fs::remove_dir_all(&nc.paths.wal_dir);
}

fn restore(file: &str, member: &NewMember, skip_hash_check: bool) -> anyhow::Result<()> {
    let nc = new_cluster(member)?;
    let data_dir_existed = nc.paths.data_dir.exists();
    let snap = open_for_restore(file, skip_hash_check).map_err(anyhow::Error::msg)?;
    log_info(
        "restoring snapshot",
        &[
            ("path", file.to_string()),
            ("wal-dir", member.wal_dir.clone()),
            ("data-dir", member.data_dir.clone()),
            ("snap-dir", raw::path_text(&nc.paths.snap_dir())),
        ],
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
    .and_then(|backend| finish_member(&nc, backend, &[]))
    .inspect_err(|_| clean_up(&nc, data_dir_existed))?;
    log_info(
        "restored snapshot",
        &[
            ("path", file.to_string()),
            ("wal-dir", member.wal_dir.clone()),
            ("data-dir", member.data_dir.clone()),
            ("records", rows.to_string()),
            ("took", format!("{:?}", started.elapsed())),
            ("member-id", format!("{:x}", nc.member_id)),
            ("cluster-id", format!("{:x}", nc.cluster_id)),
        ],
    );
    Ok(())
}

fn restore_cmd(p: &Parsed) -> Result<(), Exit> {
    if p.args.len() != 1 {
        return Err(exit(
            EXIT_BAD_ARGS,
            "snapshot restore requires exactly one argument",
        ));
    }
    let member = NewMember::from_flags(p);
    restore(&p.args[0], &member, p.bool("skip-hash-check"))?;
    Ok(())
}

// --------------------------------------------------------------- others

/// `defrag --data-dir DIR`: defragments the retcd backend of a stopped
/// member (`DIR/member/snap/db`).
fn defrag_cmd(p: &Parsed) -> Result<(), Exit> {
    let dir = p.get("data-dir");
    let db = raw::path(dir).join("member").join("snap").join("db");
    let run = || -> anyhow::Result<()> {
        let backend = Arc::new(Backend::open(&db).map_err(|e| anyhow::anyhow!("{e}"))?);
        let kv = KvStore::open(backend).map_err(|e| anyhow::anyhow!("{e}"))?;
        kv.defrag().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    };
    run().map_err(|e| {
        exit(
            EXIT_ERROR,
            format!("Failed to defragment etcd data[{dir}] ({e:#})"),
        )
    })
}

async fn save(file: &str, endpoint: &str) -> Result<(), String> {
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("http://{endpoint}")
    };
    let part = format!("{file}.part");
    let (part_path, file_path) = (raw::path(&part), raw::path(file));
    let _ = std::fs::remove_file(&part_path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&part_path)
        .map_err(|e| format!("could not open {part} ({})", go_path_err("open", &part, &e)))?;
    let result = async {
        log_info("created temporary db file", &[("path", part.clone())]);
        let ch = tonic::transport::Endpoint::from_shared(url.clone())
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        let mut client = MaintenanceClient::new(ch).max_decoding_message_size(64 << 20);
        let mut stream = client
            .snapshot(SnapshotRequest {})
            .await
            .map_err(|s| s.message().to_string())?
            .into_inner();
        log_info("fetching snapshot", &[("endpoint", endpoint.to_string())]);
        let mut progress: Option<Progress> = None;
        let mut written = 0u64;
        while let Some(msg) = stream
            .message()
            .await
            .map_err(|s| s.message().to_string())?
        {
            let p = progress.get_or_insert_with(|| {
                Progress::new(
                    "saving snapshot",
                    msg.remaining_bytes + msg.blob.len() as u64,
                )
            });
            f.write_all(&msg.blob).map_err(|e| e.to_string())?;
            written += msg.blob.len() as u64;
            p.at(written);
        }
        if !retcd_etcdfmt::has_sha256_trailer(written) {
            return Err(format!("sha256 checksum not found [bytes: {written}]"));
        }
        f.sync_all().map_err(|e| e.to_string())?;
        log_info(
            "fetched snapshot",
            &[
                ("endpoint", endpoint.to_string()),
                ("size", human_bytes(written)),
            ],
        );
        std::fs::rename(&part_path, &file_path)
            .map_err(|e| format!("could not rename {part} to {file} ({e})"))?;
        log_info("saved", &[("path", file.to_string())]);
        Ok(())
    }
    .await;
    let _ = std::fs::remove_file(&part_path);
    result
}

/// `snapshot save FILE`: etcdctl 3.4's (one endpoint, a `.part` file
/// renamed when whole).
fn save_cmd(p: &Parsed) -> Result<(), Exit> {
    if p.args.len() != 1 {
        return Err(exit(EXIT_BAD_ARGS, "snapshot save expects one argument"));
    }
    let endpoints = p.strings("endpoints");
    if endpoints.len() != 1 {
        return Err(exit(
            EXIT_INTERRUPTED,
            format!(
                "snapshot must be requested to one selected node, not multiple [{}]",
                endpoints.join(" ")
            ),
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let file = &p.args[0];
    rt.block_on(save(file, &endpoints[0]))
        .map_err(|e| exit(EXIT_INTERRUPTED, e))?;
    outln!("Snapshot saved at {file}");
    Ok(())
}

fn migrate_cmd(p: &Parsed) -> Result<(), Exit> {
    let member = NewMember::from_flags(p);
    let wal = p.get("etcd-wal-dir");
    let wal = (!wal.is_empty()).then(|| raw::path(wal));
    migrate::migrate(&raw::path(p.get("etcd-data-dir")), wal.as_deref(), &member)?;
    Ok(())
}

/// cobra's `help [command]`.
fn help_cmd(root: &Cmd, p: &Parsed) {
    let (path, _, err) = cobra::find(root, &p.args);
    if err.is_some() {
        errln!("Unknown help topic {}", cobra::go_backquote_list(&p.args));
        errw!("{}", cobra::usage_with(root, &[], false));
    } else {
        outw!("{}", cobra::usage(root, &path));
    }
}

fn run(root: &Cmd, p: &Parsed) -> Result<(), Exit> {
    match p.path.as_slice() {
        ["snapshot", "status"] => status_cmd(p),
        ["snapshot", "restore"] => restore_cmd(p),
        ["snapshot", "save"] => save_cmd(p),
        ["defrag"] => defrag_cmd(p),
        ["version"] => {
            outln!("etcdutl version: {VERSION}");
            outln!("API version: {API_VERSION}");
            Ok(())
        }
        ["backup"] => Err(exit(
            EXIT_ERROR,
            "backup is not supported by retcdutl (it copies an etcd v2 data dir): save a snapshot with `etcdctl snapshot save` and restore it with `retcdutl snapshot restore`",
        )),
        ["migrate"] => migrate_cmd(p),
        ["help"] => {
            help_cmd(root, p);
            Ok(())
        }
        other => Err(exit(EXIT_ERROR, format!("no command {other:?}"))),
    }
}

fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| retcd_gostd::raw::text(std::os::unix::ffi::OsStrExt::as_bytes(a.as_os_str())))
        .collect();
    let root = tree();
    let code = match cobra::execute(&root, &args) {
        Outcome::Help(path) => {
            outw!("{}", cobra::usage(&root, &path));
            0
        }
        Outcome::FindError { path, msg } => {
            let mut cmd_path = root.name.to_string();
            for p in &path {
                cmd_path.push(' ');
                cmd_path.push_str(p);
            }
            errln!("Error: {msg}");
            errln!("Run '{cmd_path} --help' for usage.");
            errln!("Error: {msg}");
            EXIT_ERROR
        }
        Outcome::FlagError { path, msg } => {
            errln!("Error: {msg}");
            errln!("{}", cobra::usage(&root, &path));
            errln!("Error: {msg}");
            EXIT_ERROR
        }
        Outcome::Run(p) => match run(&root, &p) {
            Ok(()) => 0,
            Err(e) => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&[b"Error: ".as_slice(), &e.msg, b"\n"].concat());
                e.code
            }
        },
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_texts() {
        assert_eq!(go_clean("out/"), "out");
        assert_eq!(go_join(&["out/", "member", "wal"]), "out/member/wal");
        assert_eq!(go_join(&["./a//b", "member"]), "a/b/member");
        assert_eq!(go_bytes(&[1, 22, 255]), "[1 22 255]");
        assert_eq!(
            go_errno(&std::io::Error::from_raw_os_error(libc::ENOENT)),
            "no such file or directory"
        );
        assert_eq!(rfc3339_now().len(), 20);
        assert_eq!(
            zap_json_string(&raw::text(b"out\xfd/\"x\"\xf0\x9f\x98")),
            r#""out\ufffd/\"x\"\ufffd\ufffd\ufffd""#
        );
    }

    #[test]
    fn status_table_centres_as_tablewriter() {
        let s = retcd_etcdfmt::Status {
            hash: 0x32ffa83,
            revision: 52,
            total_keys: 28,
            total_size: 24576,
        };
        assert_eq!(
            status_table(&s),
            "+---------+----------+------------+------------+\n\
             |  HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |\n\
             +---------+----------+------------+------------+\n\
             | 32ffa83 |       52 |         28 |      25 kB |\n\
             +---------+----------+------------+------------+\n"
        );
    }

    #[test]
    fn advertise_mismatch_texts() {
        let c = vec!["http://localhost:2380".to_string()];
        let p = vec!["http://127.0.0.1:9".to_string()];
        assert_eq!(
            advertise_matches_cluster("default", &c, &p).unwrap_err(),
            "--initial-cluster has default=http://localhost:2380 but missing from --initial-advertise-peer-urls=http://127.0.0.1:9 (\"http://127.0.0.1:9\"(resolved from \"http://127.0.0.1:9\") != \"http://localhost:2380\"(resolved from \"http://localhost:2380\"))"
        );
        assert!(advertise_matches_cluster("default", &c, &c).is_ok());
    }
}
