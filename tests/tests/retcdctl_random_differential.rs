//! A seeded random *content* differential test of the command line: the
//! same random sequence of `etcdctl` command lines is run with etcdctl
//! 3.5.1 (the reference) and with retcdctl (the tool under test), and
//! every run's exit code, stdout and stderr are compared whole, after the
//! masking below.
//!
//! Three fresh 1-node servers, all empty and started with the same flags:
//! `A` (etcd 3.5.1, driven by etcdctl 3.5.1), `B` (etcd 3.5.1, driven by
//! retcdctl) and `C` (the target flavour, retcd by default, driven by
//! retcdctl). Every step runs on all three at once and is compared twice:
//!
//! * mode `tool`: A against B, the same server, so only the tools differ;
//! * mode `tool+server`: A against C, so server differences show as well.
//!
//! A difference seen in `tool+server` only is the server's; a tool
//! difference the target shows alike is listed once, as `tool; alike on
//! <target>`. With
//! `RETCD_TEST_FLAVOR=etcd` the second tool is etcdctl 3.5.1 too and C is
//! another etcd 3.5.1 (the check of the masking: both modes must show no
//! difference); `RETCD_CTL_DIFF_SELF=1` makes the second tool etcdctl
//! with C still the target flavour.
//!
//! The commands: `put` (`--prev-kv`, `--lease`, `--ignore-value`,
//! `--ignore-lease`, values from the arguments, after `--`, empty, or from
//! stdin), `get` (range end, `--prefix`, `--from-key`, `--limit`, `--order`,
//! `--sort-by`, `--keys-only`, `--count-only`, `--print-value-only`,
//! `--rev` incl. compacted and future ones, `--consistency`, and 3.6's
//! `--min-mod-revision`, unknown to 3.5), `del`, `txn` (scripts on stdin:
//! compares of every target, success and failure ops, `-i`, malformed
//! lines and sections), `compaction [--physical]`, `lease
//! grant/revoke/timetolive [--keys]/list/keep-alive --once`, `endpoint
//! status/health/hashkv [--cluster]`, `member list` and failing `member
//! remove/update/promote`, `alarm list/disarm`, `auth status` and `user`
//! / `role` commands, each with random global flags (`-w
//! simple|json|fields|protobuf|table` or a bad format, `--hex`) before or
//! after it, and with invalid combinations, missing and extra arguments,
//! unknown flags and commands. Keys and values come from a small space
//! with spaces, newlines, unicode, a leading `-` and bytes that are not
//! UTF-8, so every output encoder is exercised. Every run starts with a
//! fixed [`prelude`]: each difference the random steps found once, in its
//! fewest steps.
//!
//! Masking (each for what differs between two etcd processes, or between
//! two servers, by nature):
//! * loopback ports (`127.0.0.1:PORT`) and Go pointers (`0xc…`, which
//!   etcdctl prints in some errors);
//! * the cluster and member ID (`<cluster>`, `<member>`) and every lease
//!   ID the server chose (`<lease#i>`, by grant order, learned over gRPC
//!   after each grant), in hex and decimal, wherever they occur; the
//!   command lines name a lease by its grant order too, and each tool gets
//!   its own server's ID;
//! * raft terms (`raft_term`, `RaftTerm`, `raftTerm`) and, in `endpoint
//!   status`, the DB size, raft index and applied index; in mode
//!   `tool+server` also the server version there (3.5.1 against what the
//!   target reports);
//! * `took` in `endpoint health`; the hash of `endpoint hashkv` once a
//!   lease was granted (it covers the keys' lease IDs);
//! * a lease's remaining TTL (`lease timetolive`) within 2 s of the other
//!   side's, and the order of its attached keys (etcd lists them in Go map
//!   order);
//! * `-w table`: cells are compared trimmed (column widths follow the
//!   masked values), plus whether each table is aligned;
//! * `-w protobuf`: stdout is decoded as the command's response (with the
//!   raft terms cleared) and compared as such, plus whether re-encoding
//!   gives the same bytes;
//! * etcdctl's client log lines (JSON on stderr) reduced to level, message
//!   and error (the harness's `normalize_stderr`), and a panic's message
//!   line kept without what follows (Go's goroutine trace; the tools run
//!   without `RUST_BACKTRACE`).
//!
//! The newest etcd (3.5.8+, 3.6), which retcd follows, refuses a
//! permission range whose end is not above its key before it looks the
//! role up ("invalid auth management"; etcd 3.5.1 says "role name not
//! found", or grants it to a role that exists). Such grants name a role
//! that never exists, and in mode `tool+server` retcd is held to the
//! newest etcd's answer ([`newest_etcd`]).
//!
//! Not generated: `lease grant` with a TTL below a minute (a lease that
//! expires during a run makes the servers differ by timing),
//! `keep-alive` without `--once` (it runs until the lease ends), adding
//! members (only `member add` without peer URLs, which fails: a second
//! member's random ID would order the member lists at random),
//! `auth enable`, `user add` prompting for a password on a terminal
//! (etcdctl then runs `stty`, whose messages depend on the environment),
//! and the `check` commands (slow; `retcdctl.rs` covers them).
//!
//! `RETCD_CTL_DIFF_SEED` (default 1) and `RETCD_CTL_DIFF_STEPS` (default
//! 300) replay and size a run; `RETCD_CTL_DIFF_TRACE=1` prints every step
//! and the three outputs; `RETCD_CTL_DIFF_AVOID` leaves inputs out, to
//! look past a known difference (see [`Avoid`]).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use prost::Message;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use retcd_api::etcdserverpb::{
    response_op, AlarmResponse, AuthRoleAddResponse, AuthRoleDeleteResponse, AuthRoleGetResponse,
    AuthRoleGrantPermissionResponse, AuthRoleListResponse, AuthRoleRevokePermissionResponse,
    AuthStatusResponse, AuthUserAddResponse, AuthUserChangePasswordResponse,
    AuthUserDeleteResponse, AuthUserGetResponse, AuthUserGrantRoleResponse, AuthUserListResponse,
    AuthUserRevokeRoleResponse, DeleteRangeResponse, MemberListResponse, MemberPromoteResponse,
    MemberRemoveResponse, MemberUpdateResponse, PutResponse, RangeResponse, ResponseHeader,
    TxnResponse,
};
use retcd_tests::normalize::{normalize_stderr, normalize_text};
use retcd_tests::random_diff::{bytes_as_strings, env_u64, prefix_end, Dice};
use retcd_tests::{
    bounded, etcd351_bin, etcdctl35_bin, limit::NORMAL as LIMIT, retcdctl_bin, test_flavor,
    Cluster, Flavor, FAST,
};

/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 20;

/// One tool run's hard bound (the command timeout is 5 s); the process is
/// SIGKILLed by its PID after it.
const RUN_DEADLINE: Duration = Duration::from_secs(10);

/// Keys: plain, a prefix family, a space, unicode, a newline, bytes that
/// are not UTF-8, a leading `-` (a flag unless after `--`).
const KEYS: [&[u8]; 10] = [
    b"a",
    b"a/b",
    b"ab",
    b"b",
    b"k 1",
    "ключ".as_bytes(),
    b"x\ny",
    b"\xff\xfe",
    b"-k",
    b"z",
];

/// Values for the command line.
const VALUES: [&[u8]; 10] = [
    b"",
    b"v",
    b"v 2",
    b"-v",
    "é☃".as_bytes(),
    b"l1\nl2",
    b"\xff",
    b"  pad  ",
    b"\"q\"",
    b"0",
];

/// Values given on stdin (`put <key>` reads the whole of it): NUL bytes
/// and a trailing newline are kept.
const STDIN_VALUES: [&[u8]; 4] = [b"from stdin", b"a\x00b", b"trailing\n", b"\xff\xfe\x00"];

/// User and role names.
const NAMES: [&str; 7] = ["alice", "bob", "root", "r1", "r2", "имя", "a b"];

/// Permission types (the last two are refused).
const PERMS: [&str; 6] = ["read", "write", "readwrite", "READ", "Write", "bogus"];

/// TTLs: long enough that no lease expires during a run.
const TTLS: [&str; 3] = ["600", "1200", "3600"];

/// Output formats; `yaml` is refused.
const FORMATS: [&str; 6] = ["simple", "json", "fields", "protobuf", "table", "yaml"];

/// Marks a lease placeholder inside an argument or stdin: `\x01L<i>\x01`
/// is the hex ID of the `i`-th lease the server granted.
const MARK: u8 = 0x01;

/// A command line to run (after the connection flags), its stdin, and
/// what the generator knows about it.
#[derive(Debug, Clone)]
struct Step {
    /// The command's words (`"lease grant"`), for the masks and the
    /// protobuf decoding.
    path: &'static str,
    args: Vec<Vec<u8>>,
    stdin: Option<Vec<u8>>,
    /// `-w protobuf` was given.
    protobuf: bool,
    /// `-w table` was given.
    table: bool,
    /// The revision a `compaction` asks for.
    compact_to: Option<i64>,
    /// A lease was granted before: keys may hold one, and the hash of
    /// `endpoint hashkv` covers their lease IDs, which differ by nature.
    leases_granted: bool,
}

/// What a tool run printed and how it exited.
struct Raw {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    code: i32,
}

/// A run after masking: what is compared.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `bin` with `args` (and `stdin`), `ETCDCTL_API=3` and no other
/// `ETCDCTL_*` variable, bounded by [`RUN_DEADLINE`]. Unlike the harness's
/// `run_ctl` it keeps stdout's bytes (`-w protobuf`, keys that are not
/// UTF-8) and takes arguments that are not UTF-8.
fn run_tool(bin: &Path, args: &[Vec<u8>], stdin: Option<&[u8]>) -> Raw {
    let mut cmd = Command::new(bin);
    // No Rust backtrace in a panic's message (the message is compared).
    cmd.env("ETCDCTL_API", "3").env_remove("RUST_BACKTRACE");
    for (k, _) in std::env::vars_os() {
        if k.as_bytes().starts_with(b"ETCDCTL_") && k != "ETCDCTL_API" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args.iter().map(|a| OsStr::from_bytes(a)))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the tool");
    let pid = child.id();
    if let Some(input) = stdin {
        let mut si = child.stdin.take().expect("stdin piped");
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = si.write_all(&input);
        });
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let (out, killed) = match rx.recv_timeout(RUN_DEADLINE) {
        Ok(r) => (r.expect("wait for the tool"), false),
        Err(_) => {
            // Our own child, by its PID (not yet reaped: the waiter
            // thread reaps it after this).
            let _ = Command::new("kill")
                .args(["-s", "KILL", &pid.to_string()])
                .status();
            let r = rx.recv().expect("waiter").expect("wait for the tool");
            (r, true)
        }
    };
    let mut stderr = out.stderr;
    if killed {
        stderr.extend_from_slice(b"\n(test: killed after the deadline)");
    }
    Raw {
        stdout: out.stdout,
        stderr,
        code: out.status.code().unwrap_or(-1),
    }
}

/// Bytes as text: UTF-8 as it is, every other byte as `⟨xx⟩`.
fn text(b: &[u8]) -> String {
    let mut out = String::new();
    for chunk in b.utf8_chunks() {
        out.push_str(chunk.valid());
        for x in chunk.invalid() {
            out.push_str(&format!("⟨{x:02x}⟩"));
        }
    }
    out
}

/// One server and the tool that drives it, with the IDs it chose.
struct Server {
    /// `etcdctl 3.5.1 on etcd 3.5.1`, …
    label: String,
    tool: PathBuf,
    endpoint: String,
    client: etcd_client::Client,
    cluster_id: u64,
    member_id: u64,
    /// Every lease it granted, in grant order.
    leases: Vec<i64>,
    _cluster: Cluster,
}

impl Server {
    async fn new(cluster: Cluster, tool: PathBuf, label: String) -> Server {
        let mut client = cluster.client(0).await.expect("connect");
        let st = client.status().await.expect("status");
        let h = st.header().expect("header");
        Server {
            label,
            tool,
            endpoint: cluster.endpoints()[0].clone(),
            cluster_id: h.cluster_id(),
            member_id: h.member_id(),
            client,
            leases: Vec::new(),
            _cluster: cluster,
        }
    }

    /// `s` with every lease placeholder replaced by this server's ID of
    /// that grant (in hex, as etcdctl takes it); a grant this server does
    /// not have becomes an ID no server granted.
    fn materialise(&self, s: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(s.len());
        let mut rest = s;
        while let Some(at) = rest.iter().position(|&b| b == MARK) {
            out.extend_from_slice(&rest[..at]);
            let after = &rest[at + 1..];
            let end = after.iter().position(|&b| b == MARK).expect("closed mark");
            let i: usize = std::str::from_utf8(&after[1..end])
                .expect("mark")
                .parse()
                .expect("mark index");
            let id = self.leases.get(i).copied().unwrap_or(0x0dead0 + i as i64);
            out.extend_from_slice(format!("{id:x}").as_bytes());
            rest = &after[end + 1..];
        }
        out.extend_from_slice(rest);
        out
    }

    /// Runs `step` with this server's tool against it.
    fn run(&self, step: &Step) -> Raw {
        let mut args = vec![
            format!("--endpoints={}", self.endpoint).into_bytes(),
            b"--dial-timeout=2s".to_vec(),
            b"--command-timeout=5s".to_vec(),
        ];
        args.extend(step.args.iter().map(|a| self.materialise(a)));
        let stdin = step.stdin.as_ref().map(|s| self.materialise(s));
        run_tool(&self.tool, &args, stdin.as_deref())
    }

    /// After a step: records the leases it granted (asked over gRPC, as
    /// `-w protobuf` and `-w table` do not print the ID).
    async fn learn(&mut self, step: &Step) {
        if step.path != "lease grant" {
            return;
        }
        let r = self.client.leases().await.expect("lease list");
        for l in r.leases() {
            if !self.leases.contains(&l.id()) {
                self.leases.push(l.id());
            }
        }
    }

    /// The IDs this server chose, with their placeholders.
    fn ids(&self) -> Vec<(u64, String)> {
        let mut ids = vec![
            (self.cluster_id, "<cluster>".to_string()),
            (self.member_id, "<member>".to_string()),
        ];
        for (i, l) in self.leases.iter().enumerate() {
            ids.push((*l as u64, format!("<lease#{i}>")));
        }
        ids
    }

    /// `raw` masked as the module doc says; `loose` (mode `tool+server`)
    /// also masks the server version.
    fn mask(&self, raw: &Raw, step: &Step, loose: bool) -> Seen {
        let stdout = match step.protobuf {
            true if !raw.stdout.is_empty() => {
                // `txn -i` prompts before the message.
                let prompts = raw.stdout.strip_prefix(TXN_PROMPTS.as_bytes());
                let (pre, msg) = match prompts {
                    Some(rest) if step.path == "txn" => (TXN_PROMPTS, rest),
                    _ => ("", &raw.stdout[..]),
                };
                match decode_pb(step.path, msg) {
                    Some(m) => format!("{pre}{m}"),
                    None => text(&raw.stdout),
                }
            }
            _ => text(&raw.stdout),
        };
        let stdout = if step.table { tables(&stdout) } else { stdout };
        let mut stderr = normalize_stderr(&text(&raw.stderr));
        // A Go panic: its message line, then a goroutine trace full of
        // addresses (which only Go prints).
        if let Some(at) = stderr.find("panic: ") {
            let end = stderr[at..].find('\n').map_or(stderr.len(), |e| at + e);
            stderr.truncate(end);
            stderr.push_str("\n<trace>");
        }
        let ids = self.ids();
        let m = |s: &str| mask_text(s, step, &ids, loose);
        Seen {
            code: raw.code,
            stdout: m(&stdout),
            stderr: m(&stderr),
        }
    }
}

/// What `txn -i` prints before the response.
const TXN_PROMPTS: &str =
    "compares:\nsuccess requests (get, put, del):\nfailure requests (get, put, del):\n";

/// The masks that apply to any text (see the module doc).
fn mask_text(s: &str, step: &Step, ids: &[(u64, String)], loose: bool) -> String {
    let mut s = normalize_text(s);
    s = go_pointers(&s);
    for pat in [
        "\"raft_term\":",
        "raft_term:",
        "\"RaftTerm\" : ",
        "\"raftTerm\":",
    ] {
        s = mask_after(&s, pat, "<term>");
    }
    if step.path == "endpoint status" {
        s = status_columns(&s, loose);
        for pat in [
            "\"dbSize\":",
            "\"dbSizeInUse\":",
            "\"raftIndex\":",
            "\"raftAppliedIndex\":",
            "\"DBSize\" : ",
            "\"RaftIndex\" : ",
            "\"RaftAppliedIndex\" : ",
        ] {
            s = mask_after(&s, pat, "<n>");
        }
        if loose {
            s = mask_after(&s, "\"version\":", "<version>");
            s = mask_after(&s, "\"Version\" : ", "<version>");
        }
    }
    if step.path == "endpoint hashkv" && step.leases_granted {
        s = hash_column(&s);
        s = mask_after(&s, "\"hash\":", "<hash>");
        s = mask_after(&s, "\"Hash\" : ", "<hash>");
    }
    if step.path == "endpoint health" {
        s = durations(&s);
    }
    if step.path == "lease timetolive" {
        s = sort_attached_keys(&s);
    }
    for (id, name) in ids {
        for form in [format!("{id:016x}"), format!("{id:x}"), id.to_string()] {
            s = replace_token(&s, &form, name);
        }
    }
    // `%16x` pads a shorter ID with spaces.
    while s.contains("  <member>") {
        s = s.replace("  <member>", " <member>");
    }
    s
}

/// `s` with every whole-token occurrence of `from` (not next to a letter
/// or digit) replaced by `to`.
fn replace_token(s: &str, from: &str, to: &str) -> String {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let mut out = String::with_capacity(s.len());
    let mut done = 0;
    for (at, _) in s.match_indices(from) {
        if at < done {
            continue;
        }
        let before = s[..at].chars().last();
        let after = s[at + from.len()..].chars().next();
        if !word(before) && !word(after) {
            out.push_str(&s[done..at]);
            out.push_str(to);
            done = at + from.len();
        }
    }
    out.push_str(&s[done..]);
    out
}

/// `s` with the value after every `pat` (a number, or a string in
/// quotes) replaced by `to`.
fn mask_after(s: &str, pat: &str, to: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(pat) {
        out.push_str(&rest[..at + pat.len()]);
        let tail = &rest[at + pat.len()..];
        let n = if let Some(q) = tail.strip_prefix('"') {
            q.find('"').map_or(0, |e| e + 2)
        } else {
            tail.find(|c: char| !(c.is_ascii_digit() || c == '-'))
                .unwrap_or(tail.len())
        };
        if n > 0 {
            out.push_str(to);
        }
        rest = &tail[n..];
    }
    out.push_str(rest);
    out
}

/// Go pointers (`0xc000123456`) become `0xPTR`.
fn go_pointers(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("0xc") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 2..];
        let n = tail
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(tail.len());
        if n >= 7 {
            out.push_str("0xPTR");
            rest = &tail[n..];
        } else {
            out.push_str("0x");
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// Go durations with a unit below the second or a fraction (`1.2ms`,
/// `870µs`, `1.5s`: `took` in `endpoint health`) become `<took>`.
fn durations(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let cs: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let start_ok = i == 0 || !cs[i - 1].is_ascii_alphanumeric();
        if cs[i].is_ascii_digit() && start_ok {
            let mut j = i;
            while j < cs.len() && (cs[j].is_ascii_digit() || cs[j] == '.') {
                j += 1;
            }
            let num: String = cs[i..j].iter().collect();
            let unit: String = cs[j..(j + 2).min(cs.len())].iter().collect();
            let one: String = cs[j..(j + 1).min(cs.len())].iter().collect();
            let ulen = if ["ms", "µs", "us", "ns"].contains(&unit.as_str()) {
                2
            } else if one == "s" && num.contains('.') {
                1
            } else {
                0
            };
            if ulen > 0 {
                out.push_str("<took>");
                i = j + ulen;
                continue;
            }
            out.push_str(&num);
            i = j;
            continue;
        }
        out.push(cs[i]);
        i += 1;
    }
    out
}

/// `endpoint status` in the simple and the table format: the DB size,
/// raft term, raft index and applied index columns (and, `loose`, the
/// version) become `<n>`.
fn status_columns(s: &str, loose: bool) -> String {
    let mask = |cells: &mut [String], off: usize| {
        let mut cols = vec![3, 6, 7, 8];
        if loose {
            cols.push(2);
        }
        for c in cols {
            if let Some(x) = cells.get_mut(c + off) {
                *x = if off == 1 { " <n> " } else { "<n>" }.to_string();
            }
        }
    };
    s.split('\n')
        .map(|l| {
            if l.starts_with('|') && !l.contains("ENDPOINT") {
                let mut cells: Vec<String> = l.split('|').map(|c| c.to_string()).collect();
                mask(&mut cells, 1);
                cells.join("|")
            } else if l.split(", ").count() >= 10 {
                let mut cells: Vec<String> = l.split(", ").map(|c| c.to_string()).collect();
                mask(&mut cells, 0);
                cells.join(", ")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `endpoint hashkv` in the simple and the table format: the hash
/// column becomes `<hash>`.
fn hash_column(s: &str) -> String {
    s.split('\n')
        .map(|l| {
            let cells: Vec<&str> = l.split(", ").collect();
            if cells.len() == 2 {
                format!("{}, <hash>", cells[0])
            } else if l.starts_with('|') && !l.contains("ENDPOINT") {
                let cells: Vec<&str> = l.split('|').collect();
                if cells.len() == 4 {
                    format!("|{}| <hash> |", cells[1])
                } else {
                    l.to_string()
                }
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `attached keys([…])` (simple) and the `"Key" : …` lines (fields) of
/// `lease timetolive --keys` sorted: etcd lists a lease's keys in Go map
/// order. (Keys with spaces sort as their words.) In JSON the `keys`
/// array is sorted.
fn sort_attached_keys(s: &str) -> String {
    let mut out = s.to_string();
    if let Some(at) = out.find("attached keys([") {
        let from = at + "attached keys([".len();
        if let Some(len) = out[from..].rfind("])") {
            let mut words: Vec<&str> = out[from..from + len].split(' ').collect();
            words.sort();
            out = format!("{}{}{}", &out[..from], words.join(" "), &out[from + len..]);
        }
    }
    if let Some(at) = out.find("\"keys\":[") {
        let from = at + "\"keys\":[".len();
        if let Some(len) = out[from..].find(']') {
            let mut items: Vec<&str> = out[from..from + len].split(',').collect();
            items.sort();
            out = format!("{}{}{}", &out[..from], items.join(","), &out[from + len..]);
        }
    }
    let mut lines: Vec<&str> = out.split('\n').collect();
    let keyed: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].starts_with("\"Key\" : "))
        .collect();
    let mut keys: Vec<&str> = keyed.iter().map(|&i| lines[i]).collect();
    keys.sort();
    for (i, k) in keyed.into_iter().zip(keys) {
        lines[i] = k;
    }
    lines.join("\n")
}

/// `-w table` output with every table's cells trimmed and its borders
/// shortened (widths follow the values the masks replace), plus a line
/// saying whether the table was aligned (all its lines of one width).
fn tables(s: &str) -> String {
    let lines: Vec<&str> = s.split('\n').collect();
    let is_table = |l: &str| l.starts_with('+') || l.starts_with('|');
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !is_table(lines[i]) {
            out.push(lines[i].to_string());
            i += 1;
            continue;
        }
        let start = i;
        while i < lines.len() && is_table(lines[i]) {
            i += 1;
        }
        let block = &lines[start..i];
        let width = block[0].chars().count();
        let aligned = block.iter().all(|l| l.chars().count() == width);
        for l in block {
            if l.starts_with('+') {
                let mut b = String::new();
                for c in l.chars() {
                    if c != '-' || !b.ends_with('-') {
                        b.push(c);
                    }
                }
                out.push(b);
            } else {
                let cells: Vec<&str> = l.split('|').map(|c| c.trim()).collect();
                out.push(cells.join(" | ").trim().to_string());
            }
        }
        out.push(format!("(table aligned: {aligned})"));
    }
    out.join("\n")
}

/// `-w protobuf` stdout decoded as `path`'s response (etcdctl prints the
/// response message; for the lease commands, whose clientv3 responses
/// embed the header, just the header), with raft terms cleared, as an
/// escaped `Debug` string, and whether encoding it again gives the same
/// bytes. None when the command has no such output or it does not
/// decode.
fn decode_pb(path: &str, b: &[u8]) -> Option<String> {
    fn hdr(h: &mut Option<ResponseHeader>) {
        if let Some(h) = h {
            h.raft_term = 0;
        }
    }
    fn txn(t: &mut TxnResponse) {
        hdr(&mut t.header);
        for r in &mut t.responses {
            match &mut r.response {
                Some(response_op::Response::ResponseRange(r)) => hdr(&mut r.header),
                Some(response_op::Response::ResponsePut(r)) => hdr(&mut r.header),
                Some(response_op::Response::ResponseDeleteRange(r)) => hdr(&mut r.header),
                Some(response_op::Response::ResponseTxn(t)) => txn(t),
                None => {}
            }
        }
    }
    macro_rules! dec {
        ($t:ty) => {
            dec!($t, |m: &mut $t| hdr(&mut m.header))
        };
        ($t:ty, $fix:expr) => {{
            let mut m = <$t>::decode(b).ok()?;
            let canonical = m.encode_to_vec() == b;
            #[allow(clippy::redundant_closure_call)]
            ($fix)(&mut m);
            format!("protobuf {m:?} (re-encodes the same: {canonical})")
        }};
    }
    let s = match path {
        "get" => dec!(RangeResponse),
        "put" => dec!(PutResponse),
        "del" => dec!(DeleteRangeResponse),
        "txn" => dec!(TxnResponse, txn),
        "lease grant" | "lease keep-alive" | "lease timetolive" | "lease list" => {
            dec!(ResponseHeader, |m: &mut ResponseHeader| m.raft_term = 0)
        }
        "member list" => dec!(MemberListResponse),
        "member remove" => dec!(MemberRemoveResponse),
        "member update" => dec!(MemberUpdateResponse),
        "member promote" => dec!(MemberPromoteResponse),
        "alarm list" | "alarm disarm" => dec!(AlarmResponse),
        "auth status" => dec!(AuthStatusResponse),
        "role add" => dec!(AuthRoleAddResponse),
        "role get" => dec!(AuthRoleGetResponse),
        "role list" => dec!(AuthRoleListResponse),
        "role delete" => dec!(AuthRoleDeleteResponse),
        "role grant-permission" => dec!(AuthRoleGrantPermissionResponse),
        "role revoke-permission" => dec!(AuthRoleRevokePermissionResponse),
        "user add" => dec!(AuthUserAddResponse),
        "user get" => dec!(AuthUserGetResponse),
        "user list" => dec!(AuthUserListResponse),
        "user delete" => dec!(AuthUserDeleteResponse),
        "user grant-role" => dec!(AuthUserGrantRoleResponse),
        "user revoke-role" => dec!(AuthUserRevokeRoleResponse),
        "user passwd" => dec!(AuthUserChangePasswordResponse),
        _ => return None,
    };
    Some(bytes_as_strings(&s))
}

/// Whether the permission `role grant-permission <role> <type> key [end]`
/// asks for (without `--prefix` or `--from-key`) is one the newest etcd
/// refuses (`isValidPermissionRange`, etcd 3.5.8+ and 3.6): an end that is
/// neither empty nor `\0` and not above the key (an empty key is `\0`
/// with no end, which is valid).
fn invalid_perm_range(key: &[u8], end: Option<&[u8]>) -> bool {
    match end {
        Some(end) => !key.is_empty() && !end.is_empty() && end != b"\0" && key >= end,
        None => false,
    }
}

/// What the newest etcd answers where etcd 3.5.1 (the reference) answers
/// otherwise, given the reference's answer: a permission range it
/// refuses is refused before the role is looked up (etcd 3.5.1 says
/// "role name not found" first). retcd follows the newest etcd.
fn newest_etcd(step: &Step, reference: &Seen) -> Seen {
    // the arguments, without the flags (`-w` takes the next word)
    let mut pos: Vec<&[u8]> = Vec::new();
    let mut words = step.args.iter();
    while let Some(w) = words.next() {
        if w == b"-w" {
            words.next();
        } else if !w.starts_with(b"-") {
            pos.push(w);
        }
    }
    let flags = step
        .args
        .iter()
        .any(|a| a.starts_with(b"--prefix") || a.starts_with(b"--from-key"));
    if step.path == "role grant-permission"
        && !flags
        && pos.len() == 6
        && invalid_perm_range(pos[4], Some(pos[5]))
        && reference.stderr.contains("role name not found")
    {
        let msg = "etcdserver: invalid auth management";
        return Seen {
            code: reference.code,
            stdout: reference.stdout.clone(),
            stderr: format!(
                "[client log] level=warn msg=retrying of unary invoker failed error=rpc error: \
                 code = InvalidArgument desc = {msg}\nError: {msg}"
            ),
        };
    }
    reference.clone()
}

/// Equal, or equal but for the remaining TTLs of `lease timetolive`
/// within 2 s of each other.
fn same(step: &Step, a: &Seen, b: &Seen) -> bool {
    if a == b {
        return true;
    }
    if step.path != "lease timetolive" || a.code != b.code || a.stderr != b.stderr {
        return false;
    }
    let (sa, ta) = ttls(&a.stdout);
    let (sb, tb) = ttls(&b.stdout);
    sa == sb && ta.len() == tb.len() && ta.iter().zip(&tb).all(|(x, y)| (x - y).abs() <= 2)
}

/// `s` with each remaining TTL (`remaining(Ns)`, `"ttl":N`, `"TTL" : N`)
/// replaced by `<ttl>`, and the TTLs.
fn ttls(s: &str) -> (String, Vec<i64>) {
    let mut ttls = Vec::new();
    let mut s = s.to_string();
    for pat in ["remaining(", "\"ttl\":", "\"TTL\" : "] {
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(at) = rest.find(pat) {
            out.push_str(&rest[..at + pat.len()]);
            let tail = &rest[at + pat.len()..];
            let n = tail
                .find(|c: char| !(c.is_ascii_digit() || c == '-'))
                .unwrap_or(tail.len());
            if let Ok(v) = tail[..n].parse() {
                ttls.push(v);
                out.push_str("<ttl>");
            } else {
                out.push_str(&tail[..n]);
            }
            rest = &tail[n..];
        }
        out.push_str(rest);
        s = out;
    }
    (s, ttls)
}

// ---------------------------------------------------------------------------
// The generator.

/// Inputs the generator leaves out (`RETCD_CTL_DIFF_AVOID`, a comma
/// separated list), to look past a known difference: `non-utf8-args`
/// (arguments that are not UTF-8), `non-utf8-stdin` (stdin that is not
/// UTF-8), `txn-dash-args` (txn op arguments starting with `-`, which
/// etcdctl's parser takes for flags), `txn-put-no-value` (a txn `put`
/// without a value, which reads the rest of stdin).
#[derive(Debug, Default, Clone, Copy)]
struct Avoid {
    non_utf8_args: bool,
    non_utf8_stdin: bool,
    txn_dash_args: bool,
    txn_put_no_value: bool,
}

impl Avoid {
    fn from_env() -> Avoid {
        let v = std::env::var("RETCD_CTL_DIFF_AVOID").unwrap_or_default();
        let mut a = Avoid::default();
        for w in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "non-utf8-args" => a.non_utf8_args = true,
                "non-utf8-stdin" => a.non_utf8_stdin = true,
                "txn-dash-args" => a.txn_dash_args = true,
                "txn-put-no-value" => a.txn_put_no_value = true,
                other => panic!("RETCD_CTL_DIFF_AVOID: unknown {other:?}"),
            }
        }
        a
    }

    /// Whether `step` has none of the inputs avoided.
    fn allows(&self, step: &Step) -> bool {
        let utf8 = |b: &[u8]| std::str::from_utf8(b).is_ok();
        let dash = |b: &[u8]| b.windows(2).any(|w| w == b"-k" || w == b"-v");
        let put_no_value = |b: &[u8]| b.split(|&c| c == b'\n').any(|l| l.trim_ascii() == b"put a");
        !(self.non_utf8_args && !step.args.iter().all(|a| utf8(a))
            || self.non_utf8_stdin && !step.stdin.as_deref().is_none_or(utf8)
            || self.txn_dash_args && step.path == "txn" && step.stdin.as_deref().is_some_and(dash)
            || self.txn_put_no_value
                && step.path == "txn"
                && step.stdin.as_deref().is_some_and(put_no_value))
    }
}

/// The generator, and what it learns from server A (the head and
/// compacted revisions, the leases granted).
struct Gen {
    rng: StdRng,
    avoid: Avoid,
    head: i64,
    compacted: i64,
    grants: usize,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// The placeholder of the `i`-th granted lease.
fn lease_mark(i: usize) -> Vec<u8> {
    let mut v = vec![MARK];
    v.extend_from_slice(format!("L{i}").as_bytes());
    v.push(MARK);
    v
}

/// `bytes` quoted as Go's `%q` parses it back (txn scripts).
fn go_quote(bytes: &[u8]) -> Vec<u8> {
    let mut out = b"\"".to_vec();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\t' => out.extend_from_slice(b"\\t"),
                c if (c as u32) < 0x20 || c == '\x7f' => {
                    out.extend_from_slice(format!("\\x{:02x}", c as u32).as_bytes())
                }
                c => out.extend_from_slice(c.to_string().as_bytes()),
            }
        }
        for x in chunk.invalid() {
            out.extend_from_slice(format!("\\x{x:02x}").as_bytes());
        }
    }
    out.push(b'"');
    out
}

impl Gen {
    fn key(&mut self) -> Vec<u8> {
        if self.p(0.02) {
            Vec::new()
        } else {
            self.pick(&KEYS).to_vec()
        }
    }

    fn value(&mut self) -> Vec<u8> {
        self.pick(&VALUES).to_vec()
    }

    /// A range end: another key (maybe below), or the key's prefix end.
    fn range_end(&mut self, key: &[u8]) -> Vec<u8> {
        if self.p(0.5) && !key.is_empty() {
            prefix_end(key)
        } else {
            self.pick(&KEYS).to_vec()
        }
    }

    /// A revision: the head, behind it, compacted, the compact revision,
    /// in the future, 0 or negative.
    fn rev(&mut self) -> i64 {
        match self.rng.random_range(0..20) {
            0..6 => self.head,
            6..12 => self.rng.random_range(1..=self.head.max(1)),
            12 | 13 if self.compacted > 1 => self.rng.random_range(1..self.compacted),
            12..15 if self.compacted > 0 => self.compacted,
            12..17 => self.head + self.rng.random_range(1..4),
            17 | 18 => 0,
            _ => -1,
        }
    }

    /// A lease ID argument: a granted one (maybe revoked since), 0, one
    /// never granted, or not hex.
    fn lease(&mut self) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0..6 if self.grants > 0 => lease_mark(self.rng.random_range(0..self.grants)),
            0..7 => b("0"),
            7 => b("1234"),
            8 => b("xyz"),
            _ => b("-1"),
        }
    }

    fn name(&mut self) -> Vec<u8> {
        if self.p(0.03) {
            Vec::new()
        } else {
            b(self.pick(&NAMES))
        }
    }

    /// `put`: flags, then the key and value in one of the ways a value
    /// can be given (or not).
    fn put(&mut self) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
        let mut a = vec![b("put")];
        if self.p(0.3) {
            a.push(b("--prev-kv"));
        }
        let ignore_value = self.p(0.1);
        if ignore_value {
            a.push(b("--ignore-value"));
        }
        if self.p(0.1) {
            a.push(b("--ignore-lease"));
        }
        if self.p(0.3) {
            let mut l = b("--lease=");
            l.extend(self.lease());
            a.push(l);
        }
        let key = self.key();
        let value = self.value();
        let mut stdin = None;
        match self.rng.random_range(0..20) {
            // after `--`
            0..3 => a.extend([b("--"), key, value]),
            3 => a.extend([key, b("--"), value]),
            // from stdin
            4 | 5 => {
                a.push(key);
                stdin = Some(self.pick(&STDIN_VALUES).to_vec());
            }
            // none at all: refused, unless --ignore-value
            6 => a.push(key),
            7 => a.extend([key, value, b("extra")]),
            8 if ignore_value => a.push(key),
            _ => a.extend([key, value]),
        }
        (a, stdin)
    }

    fn get(&mut self) -> Vec<Vec<u8>> {
        let mut a = vec![b("get")];
        let key = self.key();
        let mut flags = Vec::new();
        if self.p(0.2) {
            flags.push(b("--prefix"));
        }
        if self.p(0.1) {
            flags.push(b("--from-key"));
        }
        if self.p(0.2) {
            let l = self.pick(&["1", "2", "3", "0", "-1", "x"]);
            flags.push(b(&format!("--limit={l}")));
        }
        if self.p(0.15) {
            let o = self.pick(&["ASCEND", "DESCEND", "descend", "bogus"]);
            flags.extend([b("--order"), b(o)]);
        }
        if self.p(0.2) {
            let t = self.pick(&[
                "CREATE", "KEY", "MODIFY", "VALUE", "VERSION", "version", "bogus",
            ]);
            flags.push(b(&format!("--sort-by={t}")));
        }
        if self.p(0.15) {
            flags.push(b("--keys-only"));
        }
        if self.p(0.1) {
            flags.push(b("--count-only"));
        }
        if self.p(0.1) {
            flags.push(b("--print-value-only"));
        }
        if self.p(0.25) {
            let r = self.rev();
            flags.push(b(&format!("--rev={r}")));
        }
        if self.p(0.1) {
            let c = self.pick(&["s", "l", "x"]);
            flags.push(b(&format!("--consistency={c}")));
        }
        if self.p(0.02) {
            flags.push(b("--min-mod-revision=1"));
        }
        let end = self.p(0.15).then(|| self.range_end(&key));
        let dash = key.first() == Some(&b'-');
        // Flags before or after the positional arguments (pflag takes
        // both); a key starting with `-` mostly after `--`.
        if self.p(0.5) {
            a.extend(flags);
            if dash && self.p(0.8) {
                a.push(b("--"));
            }
            a.push(key);
            a.extend(end);
        } else {
            a.push(key);
            a.extend(end);
            a.extend(flags);
        }
        if self.p(0.02) {
            a.push(b("extra"));
        }
        a
    }

    fn del(&mut self) -> Vec<Vec<u8>> {
        let mut a = vec![b("del")];
        if self.p(0.25) {
            a.push(b("--prefix"));
        }
        if self.p(0.1) {
            a.push(b("--from-key"));
        }
        if self.p(0.4) {
            a.push(b("--prev-kv"));
        }
        let key = self.key();
        if key.first() == Some(&b'-') && self.p(0.8) {
            a.push(b("--"));
        }
        if !self.p(0.02) {
            a.push(key.clone());
        }
        if self.p(0.15) {
            let e = self.range_end(&key);
            a.push(e);
        }
        if self.p(0.02) {
            a.push(b("extra"));
        }
        a
    }

    /// A txn compare line: mostly valid, sometimes malformed (and a LEASE
    /// compare, which etcdctl 3.5.1 panics on).
    fn compare_line(&mut self) -> Vec<u8> {
        let key = go_quote(&self.key());
        let op = if self.p(0.03) {
            "~"
        } else {
            self.pick(&["=", "!=", "<", ">"])
        };
        let num = |g: &mut Gen| go_quote(g.rev().to_string().as_bytes());
        let (target, val) = match self.rng.random_range(0..100) {
            0..15 => (self.pick(&["ver", "version"]), go_quote(b"1")),
            15..22 => (
                "version",
                go_quote(self.rng.random_range(0..3).to_string().as_bytes()),
            ),
            22..40 => (self.pick(&["c", "create"]), num(self)),
            40..60 => (self.pick(&["m", "mod"]), num(self)),
            60..94 => (self.pick(&["val", "value"]), go_quote(&self.value())),
            94 => ("lease", go_quote(b"0")),
            95 => ("bogus", go_quote(b"1")),
            96 => ("mod", go_quote(b"x")),
            97 => {
                // the key not quoted
                let mut v = b("ver(a) = ");
                v.extend(go_quote(b"1"));
                return v;
            }
            98 => return b("value(\"a\")"),
            99 if self.p(0.5) => return b("no parenthesis"),
            _ => ("value", b("unquoted")),
        };
        let mut l = b(target);
        l.push(b'(');
        l.extend(key);
        l.extend(format!(") {op} ").as_bytes());
        l.extend(val);
        l
    }

    /// An argument inside a txn op line: quoted like Go's `%q` (any key),
    /// bare (when it has no space or quote), or in single quotes (which
    /// etcdctl's `argify` cuts by the number of arguments).
    fn txn_arg(&mut self, v: &[u8]) -> Vec<u8> {
        let bare_ok = !v.is_empty()
            && !v
                .iter()
                .any(|c| c.is_ascii_whitespace() || *c == b'"' || *c == b'\'');
        match self.rng.random_range(0..40) {
            0 if !v.contains(&b'\'') && !v.contains(&b'\n') => {
                let mut q = vec![b'\''];
                q.extend_from_slice(v);
                q.push(b'\'');
                q
            }
            1..20 if bare_ok => v.to_vec(),
            _ => go_quote(v),
        }
    }

    /// A txn op line (`put`, `get`, `del` with their flags), or a bad one.
    fn op_line(&mut self) -> Vec<u8> {
        let key = self.key();
        let mut words: Vec<Vec<u8>> = match self.rng.random_range(0..50) {
            0..20 => {
                let v = self.value();
                let mut w = vec![b("put"), self.txn_arg(&key), self.txn_arg(&v)];
                if self.p(0.3) {
                    w.push(b("--prev-kv"));
                }
                if self.p(0.2) {
                    let mut l = b("--lease=");
                    l.extend(self.lease());
                    w.push(l);
                }
                w
            }
            20..35 => {
                let mut w = vec![b("get"), self.txn_arg(&key)];
                match self.rng.random_range(0..8) {
                    0 => w.push(b("--prefix")),
                    1 => w.push(b("--from-key")),
                    2 => w.push(b("--limit=1")),
                    3 => w.push(b("--keys-only")),
                    4 => w.push(b("--count-only")),
                    5 => {
                        let r = self.rev();
                        w.push(b(&format!("--rev={r}")));
                    }
                    6 => {
                        let e = self.range_end(&key);
                        w.push(self.txn_arg(&e));
                    }
                    _ => {}
                }
                w
            }
            35..48 => {
                let mut w = vec![b("del"), self.txn_arg(&key)];
                if self.p(0.3) {
                    w.push(b("--prefix"));
                }
                if self.p(0.3) {
                    w.push(b("--prev-kv"));
                }
                w
            }
            48 => vec![b("bogus"), b("a")],
            _ => vec![b(self.pick(&["get", "put a", "del a b c"]))],
        };
        if self.p(0.1) {
            // leading and trailing space are trimmed
            words[0].splice(0..0, b"  ".iter().copied());
        }
        words.join(&b' ')
    }

    /// `txn` with a script on stdin: compares, success ops, failure ops,
    /// each section ended by an empty line; sometimes `-i` (prompts),
    /// sometimes cut short (EOF) or with an argument.
    fn txn(&mut self) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
        let mut a = vec![b("txn")];
        if self.p(0.25) {
            a.push(b(self.pick(&["-i", "--interactive"])));
        }
        if self.p(0.02) {
            a.push(b("extra"));
        }
        let mut s = Vec::new();
        for _ in 0..self.rng.random_range(0..4) {
            s.extend(self.compare_line());
            s.push(b'\n');
        }
        s.push(b'\n');
        for _ in 0..2 {
            for _ in 0..self.rng.random_range(0..4) {
                s.extend(self.op_line());
                s.push(b'\n');
            }
            s.push(b'\n');
        }
        if self.p(0.05) {
            // cut: the last section never ends
            let cut = self.rng.random_range(0..s.len());
            s.truncate(cut);
        }
        (a, Some(s))
    }

    fn compaction(&mut self) -> (Vec<Vec<u8>>, Option<i64>) {
        let mut a = vec![b("compaction")];
        if self.p(0.5) {
            a.push(b("--physical"));
        }
        let behind = (self.head - self.rng.random_range(0..6)).max(self.compacted + 1);
        let rev = match self.rng.random_range(0..12) {
            0..7 => behind,
            7 => self.head,
            8 => self.compacted,
            9 => self.head + 1,
            10 => {
                a.push(b("x"));
                return (a, None);
            }
            _ => {
                a.push(b("-1"));
                return (a, None);
            }
        };
        a.push(b(&rev.to_string()));
        (a, Some(rev))
    }

    fn lease_cmd(&mut self) -> (&'static str, Vec<Vec<u8>>) {
        match self.rng.random_range(0..16) {
            0..4 => {
                let ttl = match self.rng.random_range(0..12) {
                    0 => b("9000000001"),
                    1 => b("x"),
                    _ => b(self.pick(&TTLS)),
                };
                let mut a = vec![b("lease"), b("grant"), ttl];
                if self.p(0.03) {
                    a.pop();
                }
                ("lease grant", a)
            }
            4..6 => ("lease revoke", vec![b("lease"), b("revoke"), self.lease()]),
            6..10 => {
                let mut a = vec![b("lease"), b("timetolive"), self.lease()];
                if self.p(0.5) {
                    a.push(b("--keys"));
                }
                ("lease timetolive", a)
            }
            10..12 => ("lease list", vec![b("lease"), b("list")]),
            _ => (
                "lease keep-alive",
                vec![b("lease"), b("keep-alive"), b("--once"), self.lease()],
            ),
        }
    }

    fn endpoint(&mut self) -> (&'static str, Vec<Vec<u8>>) {
        let (path, sub) = match self.rng.random_range(0..3) {
            0 => ("endpoint status", "status"),
            1 => ("endpoint health", "health"),
            _ => ("endpoint hashkv", "hashkv"),
        };
        let mut a = vec![b("endpoint"), b(sub)];
        if self.p(0.3) {
            a.push(b("--cluster"));
        }
        if sub == "hashkv" && self.p(0.5) {
            let r = self.rev();
            a.push(b(&format!("--rev={r}")));
        }
        (path, a)
    }

    fn member(&mut self) -> (&'static str, Vec<Vec<u8>>) {
        let id = b(self.pick(&["1234", "zz", "ffffffffffffffff"]));
        match self.rng.random_range(0..8) {
            0..4 => ("member list", vec![b("member"), b("list")]),
            4 => ("member remove", vec![b("member"), b("remove"), id]),
            5 => ("member promote", vec![b("member"), b("promote"), id]),
            6 => (
                "member update",
                vec![
                    b("member"),
                    b("update"),
                    id,
                    b("--peer-urls=http://127.0.0.1:1"),
                ],
            ),
            _ => ("member add", vec![b("member"), b("add"), b("m9")]),
        }
    }

    fn user(&mut self) -> (&'static str, Vec<Vec<u8>>, Option<Vec<u8>>) {
        let u = |g: &mut Gen| g.name();
        let mut stdin = None;
        let (path, a) = match self.rng.random_range(0..16) {
            0..4 => {
                let mut a = vec![b("user"), b("add")];
                match self.rng.random_range(0..5) {
                    0 => {
                        let mut n = u(self);
                        n.extend_from_slice(b":pw");
                        a.push(n);
                    }
                    1 => a.extend([u(self), b("--no-password")]),
                    2 => a.extend([u(self), b("--new-user-password=pw")]),
                    3 => {
                        a.extend([u(self), b("--interactive=false")]);
                        if self.p(0.8) {
                            stdin = Some(b("pw\n"));
                        }
                    }
                    _ => a.extend([b(":pw"), b("--no-password")]),
                }
                ("user add", a)
            }
            4..6 => {
                let mut a = vec![b("user"), b("get"), u(self)];
                if self.p(0.4) {
                    a.push(b("--detail"));
                }
                ("user get", a)
            }
            6..8 => ("user list", vec![b("user"), b("list")]),
            8..10 => ("user delete", vec![b("user"), b("delete"), u(self)]),
            10..12 => {
                let (n, r) = (u(self), u(self));
                ("user grant-role", vec![b("user"), b("grant-role"), n, r])
            }
            12..14 => {
                let (n, r) = (u(self), u(self));
                ("user revoke-role", vec![b("user"), b("revoke-role"), n, r])
            }
            _ => {
                stdin = Some(b("newpw\n"));
                (
                    "user passwd",
                    vec![b("user"), b("passwd"), u(self), b("--interactive=false")],
                )
            }
        };
        (path, a, stdin)
    }

    fn role(&mut self) -> (&'static str, Vec<Vec<u8>>) {
        let r = |g: &mut Gen| g.name();
        match self.rng.random_range(0..16) {
            0..3 => ("role add", vec![b("role"), b("add"), r(self)]),
            3..5 => ("role get", vec![b("role"), b("get"), r(self)]),
            5..7 => ("role list", vec![b("role"), b("list")]),
            7..9 => ("role delete", vec![b("role"), b("delete"), r(self)]),
            9..13 => {
                let mut a = vec![b("role"), b("grant-permission")];
                self.perm_flags(&mut a);
                let key = self.key();
                let end = self.p(0.25).then(|| self.range_end(&key));
                // A range the newest etcd refuses goes to a role that never
                // exists: etcd 3.5.1 would grant it to one that does, and
                // the stores would part (see `newest_etcd`).
                let role = if invalid_perm_range(&key, end.as_deref()) {
                    b("nosuch")
                } else {
                    r(self)
                };
                a.extend([role, b(self.pick(&PERMS))]);
                a.push(key);
                a.extend(end);
                ("role grant-permission", a)
            }
            _ => {
                let mut a = vec![b("role"), b("revoke-permission")];
                self.perm_flags(&mut a);
                a.push(r(self));
                let key = self.key();
                let end = self.p(0.25).then(|| self.range_end(&key));
                a.push(key);
                a.extend(end);
                ("role revoke-permission", a)
            }
        }
    }

    fn perm_flags(&mut self, a: &mut Vec<Vec<u8>>) {
        if self.p(0.3) {
            a.push(b("--prefix"));
        }
        if self.p(0.15) {
            a.push(b("--from-key"));
        }
    }

    /// The next step that has none of the inputs avoided.
    fn next(&mut self) -> Step {
        loop {
            let step = self.any_step();
            if self.avoid.allows(&step) {
                return step;
            }
        }
    }

    /// The next step: a command with random global flags around it.
    fn any_step(&mut self) -> Step {
        let mut stdin = None;
        let mut compact_to = None;
        let (path, cmd): (&'static str, Vec<Vec<u8>>) = match self.rng.random_range(0..100) {
            0..18 => {
                let (a, s) = self.put();
                stdin = s;
                ("put", a)
            }
            18..40 => ("get", self.get()),
            40..48 => ("del", self.del()),
            48..60 => {
                let (a, s) = self.txn();
                stdin = s;
                ("txn", a)
            }
            60..63 => {
                let (a, c) = self.compaction();
                compact_to = c;
                ("compaction", a)
            }
            63..75 => self.lease_cmd(),
            75..79 => self.endpoint(),
            79..82 => self.member(),
            82..84 => {
                let sub = self.pick(&["list", "disarm"]);
                let path = if sub == "list" {
                    "alarm list"
                } else {
                    "alarm disarm"
                };
                (path, vec![b("alarm"), b(sub)])
            }
            84 => ("auth status", vec![b("auth"), b("status")]),
            85..92 => {
                let (p, a, s) = self.user();
                stdin = s;
                (p, a)
            }
            92..98 => self.role(),
            _ => {
                let junk = self.pick(&[
                    &["bogus"][..],
                    &["gte", "a"],
                    &["get", "a", "--bogus"],
                    &["get", "a", "-x"],
                    &["lease"],
                    &["put", "a", "v", "--lease"],
                ]);
                ("other", junk.iter().map(|s| b(s)).collect())
            }
        };
        let mut global = Vec::new();
        let mut format = "simple";
        if self.p(0.55) {
            // Mostly the formats every command has.
            format = FORMATS[match self.rng.random_range(0..100) {
                0..30 => 0,
                30..55 => 1,
                55..75 => 2,
                75..90 => 3,
                90..98 => 4,
                _ => 5,
            }];
            if self.p(0.5) {
                global.extend([b("-w"), b(format)]);
            } else {
                global.push(b(&format!("--write-out={format}")));
            }
        }
        if self.p(0.15) {
            global.push(b(if self.p(0.9) { "--hex" } else { "--hex=false" }));
        }
        // Global flags before the command, or after it (not after a `--`,
        // where they would be arguments).
        let args = if cmd.iter().any(|a| a == b"--") || self.p(0.5) {
            global.into_iter().chain(cmd).collect()
        } else {
            cmd.into_iter().chain(global).collect()
        };
        Step {
            path,
            args,
            stdin,
            protobuf: format == "protobuf",
            table: format == "table",
            compact_to,
            leases_granted: self.grants > 0,
        }
    }
}

/// A step as a shell-like line: plain arguments as they are, others
/// quoted and escaped, lease placeholders as `<lease#i>`; then stdin.
fn show_step(step: &Step) -> String {
    let show = |a: &[u8]| -> String {
        let s = text(a);
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(at) = rest.find('\u{1}') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let end = after.find('\u{1}').unwrap_or(after.len());
            out.push_str(&format!("<lease#{}>", &after[1..end]));
            rest = &after[(end + 1).min(after.len())..];
        }
        out.push_str(rest);
        out
    };
    let words: Vec<String> = step
        .args
        .iter()
        .map(|a| {
            let s = show(a);
            if !s.is_empty() && s.chars().all(|c| c.is_ascii_graphic() && c != '"') {
                s
            } else {
                format!("{s:?}")
            }
        })
        .collect();
    let mut line = format!("etcdctl {}", words.join(" "));
    if let Some(i) = &step.stdin {
        line.push_str(&format!("\n    stdin: {:?}", show(i)));
    }
    line
}

fn show_seen(s: &Seen) -> String {
    format!(
        "exit {}, stdout {:?}, stderr {:?}",
        s.code, s.stdout, s.stderr
    )
}

/// A fixed step: `args` as they are, `stdin`; the output format is read
/// from a `--write-out=` argument.
fn fixed(path: &'static str, args: &[&[u8]], stdin: Option<&[u8]>) -> Step {
    let has = |a: &[u8]| args.contains(&a);
    Step {
        path,
        args: args.iter().map(|a| a.to_vec()).collect(),
        stdin: stdin.map(|s| s.to_vec()),
        protobuf: has(b"--write-out=protobuf"),
        table: has(b"--write-out=table"),
        compact_to: None,
        leases_granted: true,
    }
}

/// Steps every run starts with (before the seeded ones): the differences
/// the random steps found once, each in its fewest steps, as regression
/// tests against etcdctl 3.5.1's answer. Each leaves the stores alike
/// (it fails on both sides, reads, or writes the same revisions), so the
/// seeded steps after them start from equal states.
fn prelude() -> Vec<Step> {
    let pb = b"--write-out=protobuf".as_slice();
    let lease0 = lease_mark(0);
    let l0 = lease0.as_slice();
    vec![
        // an argument that is not UTF-8 (etcdctl takes any bytes)
        fixed("get", &[b"get", b"p/\xff"], None),
        // keys and values that are not UTF-8 (stored by a txn, which
        // takes Go escapes), printed by `simple` as raw bytes and by
        // `fields` with Go's %q escapes
        fixed("txn", &[b"txn"], Some(b"\nput \"p/\\xff\" \"\\xfe\"\n\n\n")),
        fixed("get", &[b"get", b"p/", b"--prefix"], None),
        fixed(
            "get",
            &[b"get", b"p/", b"--prefix", b"--write-out=fields"],
            None,
        ),
        // a value from stdin that is not UTF-8 is stored as it is
        fixed("put", &[b"put", b"p/2"], Some(b"\xfe\x00")),
        fixed("get", &[b"get", b"p/2", b"--write-out=json"], None),
        fixed("del", &[b"del", b"p/", b"--prefix"], None),
        // a txn script that is not UTF-8
        fixed("txn", &[b"txn"], Some(b"\nget p/\xff\n\n\n")),
        // a txn op the op's own flag parser refuses: etcdctl prints the
        // op's usage before the error
        fixed("txn", &[b"txn"], Some(b"\nget -k\n\n\n")),
        // a txn `put` with no value reads the (consumed) stdin: etcdctl
        // exits at once
        fixed("txn", &[b"txn"], Some(b"\nput a\n\n\n")),
        // a compare with both an unknown operator and a number that is
        // not one: the number is checked first
        fixed("txn", &[b"txn"], Some(b"mod(\"a\") ~ \"x\"\n\n\n\n")),
        // a LEASE compare: etcdctl 3.5.1 panics, with "bad value"
        fixed("txn", &[b"txn"], Some(b"lease(\"a\") = \"0\"\n\n\n\n")),
        // an end key with --prefix or --from-key: each flag its message
        fixed(
            "role grant-permission",
            &[
                b"role",
                b"grant-permission",
                b"--prefix",
                b"r",
                b"read",
                b"a",
                b"b",
            ],
            None,
        ),
        fixed(
            "role revoke-permission",
            &[
                b"role",
                b"revoke-permission",
                b"--from-key",
                b"r",
                b"a",
                b"b",
            ],
            None,
        ),
        // -w protobuf of the lease commands: clientv3's grant, keep-alive,
        // time-to-live and list responses embed the header, whose Marshal
        // prints it alone; the revoke response has none
        fixed("lease grant", &[b"lease", b"grant", b"600", pb], None),
        fixed(
            "lease keep-alive",
            &[b"lease", b"keep-alive", b"--once", l0, pb],
            None,
        ),
        fixed("lease timetolive", &[b"lease", b"timetolive", l0, pb], None),
        fixed("lease list", &[b"lease", b"list", pb], None),
        fixed("lease revoke", &[b"lease", b"revoke", l0, pb], None),
        // -w protobuf of `auth status`: the message's bytes as they are
        fixed("auth status", &[b"auth", b"status", pb], None),
        // an unknown output format is refused before a bad lease ID
        // (etcdctl makes its client, which checks the format, first)
        fixed(
            "lease timetolive",
            &[b"-w", b"yaml", b"lease", b"timetolive", b"xyz"],
            None,
        ),
        // a range end below the key for a role that does not exist:
        // etcd 3.5.1 looks the role up first (newer etcd checks the range
        // first: "invalid auth management")
        fixed(
            "role grant-permission",
            &[b"role", b"grant-permission", b"nosuch", b"read", b"b", b"a"],
            None,
        ),
        // cobra 1.1.3's Find: `--help` is no flag yet, so it takes `get`
        // as its value and the root's help is printed
        fixed("help", &[b"--help", b"get"], None),
        // `help` with a word past a group: the group's page; an unknown
        // topic: the root's page without its -h line
        fixed("help", &[b"help", b"lease", b"bogus"], None),
        fixed("help", &[b"help", b"bogus"], None),
        // pflag's own syntax errors and values
        fixed("get", &[b"get", b"a", b"---x"], None),
        fixed("get", &[b"get", b"a", b"-w="], None),
        fixed("get", &[b"get", b"a", b"-hw"], None),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retcdctl_random_differential() {
    let seed = env_u64("RETCD_CTL_DIFF_SEED", 1);
    let steps = env_u64("RETCD_CTL_DIFF_STEPS", 300);
    let trace = std::env::var_os("RETCD_CTL_DIFF_TRACE").is_some();
    let flavor = test_flavor();
    let self_check = flavor == Flavor::Etcd || env_u64("RETCD_CTL_DIFF_SELF", 0) == 1;
    // A long run gets more time than the default one.
    let limit = LIMIT.max(Duration::from_millis(steps * 400));
    bounded(limit, async {
        let mut flags = FAST.to_vec();
        flags.extend(["--bcrypt-cost", "4", "--unsafe-no-fsync"]);
        let (a, bb, c) = tokio::join!(
            Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, &flags),
            Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, &flags),
            async {
                match flavor {
                    Flavor::Etcd => {
                        Cluster::start_with_binary(Flavor::Etcd, etcd351_bin(), 1, &flags).await
                    }
                    Flavor::Retcd => Cluster::start(Flavor::Retcd, 1, &flags).await,
                }
            }
        );
        let (tool, tname) = if self_check {
            (etcdctl35_bin(), "etcdctl 3.5.1")
        } else {
            (retcdctl_bin(), "retcdctl")
        };
        let target = match flavor {
            Flavor::Etcd => "etcd 3.5.1",
            Flavor::Retcd => "retcd",
        };
        let mut servers = [
            Server::new(
                a.expect("start etcd 3.5.1 (A)"),
                etcdctl35_bin(),
                "etcdctl 3.5.1 on etcd 3.5.1".into(),
            )
            .await,
            Server::new(
                bb.expect("start etcd 3.5.1 (B)"),
                tool.clone(),
                format!("{tname} on etcd 3.5.1"),
            )
            .await,
            Server::new(
                c.expect("start the target (C)"),
                tool,
                format!("{tname} on {target}"),
            )
            .await,
        ];
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seed),
            avoid: Avoid::from_env(),
            head: 1,
            compacted: 0,
            grants: 0,
        };
        let started = Instant::now();
        // Differing steps by part (the prelude, the seeded steps) and mode.
        let mut diffs: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        // What is shown: every prelude difference, the first seeded ones.
        let (mut shown_prelude, mut shown) = (Vec::new(), Vec::new());
        let mut codes: BTreeMap<i32, usize> = BTreeMap::new();
        let fixed = prelude();
        let total = fixed.len() as u64 + steps;
        for n in 0..total {
            let step = match fixed.get(n as usize) {
                Some(s) => s.clone(),
                None => g.next(),
            };
            let raws: Vec<Raw> = tokio::task::block_in_place(|| {
                std::thread::scope(|s| {
                    let hs: Vec<_> = servers
                        .iter()
                        .map(|srv| {
                            let step = &step;
                            s.spawn(move || srv.run(step))
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().expect("run")).collect()
                })
            });
            // The leases granted are masked in the step's own output.
            for srv in servers.iter_mut() {
                srv.learn(&step).await;
            }
            let ra = servers[0].mask(&raws[0], &step, false);
            let rb = servers[1].mask(&raws[1], &step, false);
            let ra_loose = servers[0].mask(&raws[0], &step, true);
            let rc = servers[2].mask(&raws[2], &step, true);
            *codes.entry(ra.code).or_default() += 1;
            if trace {
                eprintln!(
                    "step {n}: {}\n  A {}: {}\n  B {}: {}\n  C {}: {}",
                    show_step(&step),
                    servers[0].label,
                    show_seen(&ra),
                    servers[1].label,
                    show_seen(&rb),
                    servers[2].label,
                    show_seen(&rc)
                );
            }
            let tool_diff = !same(&step, &ra, &rb);
            // etcd 3.5.1 as the target answers as the reference does
            let want = match flavor {
                Flavor::Etcd => ra_loose.clone(),
                Flavor::Retcd => newest_etcd(&step, &ra_loose),
            };
            let server_diff = !same(&step, &want, &rc);
            let part = if (n as usize) < fixed.len() {
                "prelude"
            } else {
                "seeded"
            };
            if tool_diff {
                *diffs.entry((part, "tool")).or_default() += 1;
            }
            if server_diff {
                *diffs.entry((part, "tool+server")).or_default() += 1;
            }
            // A tool difference that the target shows alike is shown once.
            let rb_loose = servers[1].mask(&raws[1], &step, true);
            let alike = tool_diff && server_diff && same(&step, &rb_loose, &rc);
            let list = if part == "prelude" {
                &mut shown_prelude
            } else {
                &mut shown
            };
            let mut show = |mode: &str, reference: &Seen, other: &Seen, srv: &Server| {
                if part == "prelude" || list.len() < MAX_SHOWN {
                    list.push(format!(
                        "seed {seed} step {n} [mode {mode}]: {}\n  {}: {}\n  {}: {}",
                        show_step(&step),
                        servers[0].label,
                        show_seen(reference),
                        srv.label,
                        show_seen(other)
                    ));
                }
            };
            if alike {
                let mode = format!("tool; alike on {target}");
                show(&mode, &ra, &rb, &servers[1]);
            } else {
                if tool_diff {
                    show("tool", &ra, &rb, &servers[1]);
                }
                if server_diff {
                    show("tool+server", &ra_loose, &rc, &servers[2]);
                }
            }
            // What the generator learns, from A.
            g.grants = servers[0].leases.len();
            if let (Some(rev), 0) = (step.compact_to, raws[0].code) {
                g.compacted = g.compacted.max(rev);
            }
            let head = servers[0]
                .client
                .get("a", None)
                .await
                .expect("get the head revision from A");
            g.head = head.header().map_or(g.head, |h| h.revision());
        }
        let total_diffs: usize = diffs.values().sum();
        eprintln!(
            "retcdctl_random_differential: etcdctl 3.5.1 on etcd 3.5.1 vs {tname} on etcd 3.5.1 \
             (mode tool) and on {target} (mode tool+server), seed {seed}: {total} steps in \
             {:.1?}; etcdctl's exit codes {codes:?}; head revision {}, compacted {}, {} leases \
             granted; differing steps by mode: {diffs:?}",
            started.elapsed(),
            g.head,
            g.compacted,
            g.grants,
        );
        assert!(
            total_diffs == 0,
            "{total_diffs} step comparisons differ ({diffs:?}; seed {seed}; mode tool: \
             etcdctl 3.5.1 vs {tname}, both on etcd 3.5.1; mode tool+server: etcdctl 3.5.1 on \
             etcd 3.5.1 vs {tname} on {target}); once a server's state differs, later steps \
             may differ only because of it.\n\nThe prelude's differences (each a difference \
             found once):\n\n{}\n\nThe first {} of the seeded steps' differences:\n\n{}",
            shown_prelude.join("\n\n"),
            shown.len(),
            shown.join("\n\n")
        );
    })
    .await;
}

#[test]
fn masks() {
    assert_eq!(
        replace_token("id 1234 x12345 1234", "1234", "<l>"),
        "id <l> x12345 <l>"
    );
    assert_eq!(
        mask_after(
            "{\"raft_term\":2,\"x\":\"raft_term\"}",
            "\"raft_term\":",
            "<t>"
        ),
        "{\"raft_term\":<t>,\"x\":\"raft_term\"}"
    );
    assert_eq!(go_pointers("({0xc000123abc 5} 0x12)"), "({0xPTR 5} 0x12)");
    assert_eq!(
        durations("x:1 is healthy: took = 1.234ms, 870µs 1.5s TTL(600s)"),
        "x:1 is healthy: took = <took>, <took> <took> TTL(600s)"
    );
    assert_eq!(
        sort_attached_keys("lease 1 granted, attached keys([b a k 1])"),
        "lease 1 granted, attached keys([1 a b k])"
    );
    let (s, t) = ttls("granted with TTL(600s), remaining(599s)");
    assert_eq!(
        (s.as_str(), t),
        ("granted with TTL(600s), remaining(<ttl>s)", vec![599])
    );
    assert_eq!(
        tables("+---+-----+\n| a |  bb |\n+---+-----+\n"),
        "+-+-+\n| a | bb |\n+-+-+\n(table aligned: true)\n"
    );
    assert_eq!(go_quote(b"a\"\n\xff"), b"\"a\\\"\\n\\xff\"".to_vec());
    assert_eq!(text(b"a\xffb"), "a⟨ff⟩b");
}
