//! The flag table (every flag of etcd 3.5 and 3.6, and retcd's own hidden
//! ones) and a parser with the semantics of Go's `flag` package, which is
//! what etcd uses: `-x` or `--x`, `--x=v` or `--x v` (booleans only take
//! `=`), the last occurrence wins, parsing stops at the first positional
//! argument or after `--`.

use std::collections::BTreeMap;

use retcd_gostd::strconv;
use retcd_gostd::time::parse_duration;

/// How a flag's value is parsed (Go's kinds, as etcd registers them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    Bool,
    /// Go `uint` (64-bit here), `strconv.ParseUint(s, 0, 64)`.
    Uint,
    Uint64,
    Uint32,
    /// Go `int`.
    Int,
    Int64,
    /// Go `time.Duration`, `time.ParseDuration`.
    Duration,
    /// `flags.UniqueURLs`: comma-separated URLs, each checked.
    Urls,
    /// `flags.StringsValue` / `UniqueStringsValue`: comma-separated.
    List,
    /// `flags.SelectiveStringValue`: one of the listed values.
    Enum(&'static [&'static str]),
    /// `--feature-gates`: `Name=bool,...`.
    Gates,
    /// `flags.IgnoredFlag`: a legacy name, accepted (bare or with a
    /// value) and discarded.
    Ignored,
}

impl Kind {
    /// Go's bool flags take no separate value argument.
    pub fn is_bool(self) -> bool {
        matches!(self, Kind::Bool | Kind::Ignored)
    }

    /// The Go type name, for config-file type errors.
    pub fn go_type(self) -> &'static str {
        match self {
            Kind::Str | Kind::Enum(_) | Kind::Urls | Kind::Gates | Kind::Ignored => "string",
            Kind::Bool => "bool",
            Kind::Uint => "uint",
            Kind::Uint64 => "uint64",
            Kind::Uint32 => "uint32",
            Kind::Int => "int",
            Kind::Int64 => "int64",
            Kind::Duration => "time.Duration",
            Kind::List => "[]string",
        }
    }
}

/// What retcd does with a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Works as in etcd.
    Works,
    /// Accepted; when set, one warning line says why it changes nothing.
    NoEffect(&'static str),
    /// etcd 3.5 deprecated it (v2, proxy); accepted with etcd's warning.
    Deprecated35,
    /// Needs something retcd does not offer; a non-empty value is refused.
    Refused(&'static str),
    /// etcd's `IgnoredFlag`: silently discarded.
    Legacy,
}

#[derive(Clone, Copy, Debug)]
pub struct Flag {
    pub name: &'static str,
    pub kind: Kind,
    /// The default as the flag would parse it ("" = empty / unset).
    pub default: &'static str,
    pub usage: &'static str,
    /// Section of `--help` ("" = not shown).
    pub group: &'static str,
    pub effect: Effect,
}

const fn f(
    group: &'static str,
    name: &'static str,
    kind: Kind,
    default: &'static str,
    usage: &'static str,
) -> Flag {
    Flag {
        name,
        kind,
        default,
        usage,
        group,
        effect: Effect::Works,
    }
}

const fn no(mut fl: Flag, why: &'static str) -> Flag {
    fl.effect = Effect::NoEffect(why);
    fl
}

const fn dep(mut fl: Flag) -> Flag {
    fl.effect = Effect::Deprecated35;
    fl
}

const fn refuse(mut fl: Flag, why: &'static str) -> Flag {
    fl.effect = Effect::Refused(why);
    fl
}

const fn legacy(name: &'static str) -> Flag {
    Flag {
        name,
        kind: Kind::Ignored,
        default: "",
        usage: "",
        group: "",
        effect: Effect::Legacy,
    }
}

const M: &str = "Member";
const C: &str = "Clustering";
const S: &str = "Security";
const A: &str = "Auth";
const L: &str = "Logging";
const P: &str = "Profiling and monitoring";
const X: &str = "Experimental (etcd 3.5 names; etcd 3.6 names without experimental- work too)";
const N: &str = "etcd 3.6 names";
const U: &str = "Unsafe";
const V2: &str = "v2 and v2 proxy (deprecated in etcd 3.5, removed in 3.6)";
const H: &str = ""; // hidden

pub const NO_V2: &str = "retcd serves only the v3 API";
const NO_BBOLT: &str = "retcd's backend is redb, not bbolt";
const NO_TRACE: &str = "retcd does not export OpenTelemetry traces";
const NO_ROTATE: &str = "retcd writes logs to the outputs given, rotation is left to the system";
const NO_DISCOVERY: &str =
    "retcd does not bootstrap through a discovery service; use --initial-cluster";
const NO_DOWNGRADE: &str = "retcd implements one etcd version, so there is no downgrade to watch";
const NO_MLOCK: &str = "retcd does not lock its memory";

const CLUSTER_STATES: &[&str] = &["new", "existing"];
const FALLBACKS: &[&str] = &["exit", "proxy"];
const PROXY_MODES: &[&str] = &["off", "readonly", "on"];
const V2_DEPRECATION: &[&str] = &["not-yet", "write-only", "write-only-drop-data", "gone"];

use Kind::*;

/// Every flag retcd accepts.
pub static FLAGS: &[Flag] = &[
    // Member
    f(M, "name", Str, "default", "Human-readable name for this member."),
    f(M, "data-dir", Str, "", "Path to the data directory (default: ${name}.etcd)."),
    f(M, "wal-dir", Str, "", "Path to a dedicated WAL directory (default: ${data-dir}/member/wal)."),
    f(M, "snapshot-count", Uint64, "100000", "Number of committed transactions that trigger a snapshot to disk."),
    f(M, "heartbeat-interval", Uint, "100", "Time (in milliseconds) of a heartbeat interval."),
    f(M, "election-timeout", Uint, "1000", "Time (in milliseconds) for an election to time out."),
    f(M, "initial-election-tick-advance", Bool, "true", "Fast-forward the initial election ticks on boot for a faster first election."),
    f(M, "listen-peer-urls", Urls, "http://localhost:2380", "URLs to listen on for peer traffic."),
    f(M, "listen-client-urls", Urls, "http://localhost:2379", "URLs to listen on for client traffic (gRPC and HTTP)."),
    f(M, "listen-client-http-urls", Urls, "", "URLs to listen on for HTTP-only client traffic (gateway, health, metrics); --listen-client-urls then serve gRPC only."),
    no(f(M, "max-snapshots", Uint, "5", "Maximum number of snapshot files to retain (0 is unlimited)."), "retcd's snapshots are its backend file; it writes no .snap files"),
    f(M, "max-wals", Uint, "5", "Maximum number of WAL files to retain (0 is unlimited)."),
    f(M, "quota-backend-bytes", Int64, "0", "Raise an alarm when the backend exceeds this size (0: 2 GiB)."),
    no(f(M, "backend-bbolt-freelist-type", Str, "map", "The bbolt freelist type (array or map)."), NO_BBOLT),
    f(M, "backend-batch-interval", Duration, "0", "Longest time before the backend commits a batch (0: 100ms)."),
    f(M, "backend-batch-limit", Int, "0", "Most operations before the backend commits a batch (0: 10000)."),
    f(M, "max-txn-ops", Uint, "128", "Maximum number of operations in one transaction."),
    f(M, "max-request-bytes", Uint, "1572864", "Maximum client request size in bytes."),
    f(M, "max-range-response-bytes", Uint64, "2147483647", "Largest response a Range or read-only Txn may build; a larger one fails with ResourceExhausted before it is built (retcd; etcd's bound is gRPC's 2 GiB send limit). RangeStream and paginated lists are not bounded by it."),
    f(M, "max-concurrent-streams", Uint32, "4294967295", "Maximum concurrent HTTP/2 streams per client connection."),
    f(M, "grpc-keepalive-min-time", Duration, "5s", "Shortest interval a client may wait between pings."),
    f(M, "grpc-keepalive-interval", Duration, "2h", "How often the server pings an idle client connection (0 disables)."),
    f(M, "grpc-keepalive-timeout", Duration, "20s", "How long to wait for a ping answer before closing the connection (0 disables)."),
    no(f(M, "socket-reuse-port", Bool, "false", "Set SO_REUSEPORT on listeners."), "retcd's listeners do not set SO_REUSEPORT"),
    no(f(M, "socket-reuse-address", Bool, "false", "Set SO_REUSEADDR on listeners."), "retcd's listeners set SO_REUSEADDR always"),
    f(M, "raft-read-timeout", Duration, "5s", "Read timeout on raft peer connections (at least 5s)."),
    f(M, "raft-write-timeout", Duration, "5s", "Write timeout on raft peer connections (at least 5s)."),
    // Clustering
    f(C, "initial-advertise-peer-urls", Urls, "http://localhost:2380", "This member's peer URLs, advertised to the rest of the cluster."),
    f(C, "initial-cluster", Str, "", "Initial cluster for bootstrapping: name=peerURL,... (default: ${name}=${initial-advertise-peer-urls})."),
    f(C, "initial-cluster-state", Enum(CLUSTER_STATES), "new", "Initial cluster state: 'new' or 'existing'."),
    f(C, "initial-cluster-token", Str, "etcd-cluster", "Token mixed into the member and cluster IDs when bootstrapping."),
    f(C, "advertise-client-urls", Urls, "http://localhost:2379", "This member's client URLs, advertised to the rest of the cluster."),
    refuse(f(C, "discovery", Str, "", "Discovery URL used to bootstrap the cluster."), NO_DISCOVERY),
    refuse(f(C, "discovery-srv", Str, "", "DNS SRV domain used to bootstrap the cluster."), NO_DISCOVERY),
    refuse(f(C, "discovery-srv-name", Str, "", "Suffix of the DNS SRV name queried for discovery."), NO_DISCOVERY),
    refuse(f(C, "discovery-proxy", Str, "", "HTTP proxy for the discovery service."), NO_DISCOVERY),
    no(f(C, "discovery-fallback", Enum(FALLBACKS), "proxy", "What to do when discovery fails: 'exit' or 'proxy'."), NO_DISCOVERY),
    refuse(f(C, "discovery-endpoints", List, "", "v3 discovery: endpoints of the discovery cluster."), NO_DISCOVERY),
    refuse(f(C, "discovery-token", Str, "", "v3 discovery: token of the cluster being bootstrapped."), NO_DISCOVERY),
    no(f(C, "discovery-dial-timeout", Duration, "2s", "v3 discovery: dial timeout."), NO_DISCOVERY),
    no(f(C, "discovery-request-timeout", Duration, "5s", "v3 discovery: request timeout."), NO_DISCOVERY),
    no(f(C, "discovery-keepalive-time", Duration, "2s", "v3 discovery: keepalive time."), NO_DISCOVERY),
    no(f(C, "discovery-keepalive-timeout", Duration, "6s", "v3 discovery: keepalive timeout."), NO_DISCOVERY),
    no(f(C, "discovery-insecure-transport", Bool, "true", "v3 discovery: plain-text transport."), NO_DISCOVERY),
    no(f(C, "discovery-insecure-skip-tls-verify", Bool, "false", "v3 discovery: skip certificate checks."), NO_DISCOVERY),
    no(f(C, "discovery-cert", Str, "", "v3 discovery: client certificate."), NO_DISCOVERY),
    no(f(C, "discovery-key", Str, "", "v3 discovery: client key."), NO_DISCOVERY),
    no(f(C, "discovery-cacert", Str, "", "v3 discovery: CA bundle."), NO_DISCOVERY),
    no(f(C, "discovery-user", Str, "", "v3 discovery: user name."), NO_DISCOVERY),
    no(f(C, "discovery-password", Str, "", "v3 discovery: password."), NO_DISCOVERY),
    f(C, "strict-reconfig-check", Bool, "true", "Refuse membership changes that would lose quorum."),
    f(C, "pre-vote", Bool, "true", "Run raft's PreVote phase before an election."),
    f(C, "auto-compaction-retention", Str, "0", "Auto compaction retention: hours or a duration (periodic), or a revision count (revision); 0 disables."),
    f(C, "auto-compaction-mode", Str, "periodic", "How to read --auto-compaction-retention: 'periodic' or 'revision'."),
    f(C, "max-learners", Int, "1", "Maximum number of learner members in the cluster."),
    // Security
    f(S, "cert-file", Str, "", "Certificate (PEM) served on https client URLs."),
    f(S, "key-file", Str, "", "Private key (PEM) of --cert-file."),
    f(S, "client-cert-auth", Bool, "false", "Require client certificates signed by --trusted-ca-file."),
    f(S, "client-crl-file", Str, "", "Revoked client certificates (CRL, PEM or DER)."),
    f(S, "client-cert-allowed-hostname", List, "", "Allowed host names (SAN) of client certificates."),
    f(S, "trusted-ca-file", Str, "", "CA bundle (PEM) for client certificates."),
    f(S, "auto-tls", Bool, "false", "Client TLS with a generated self-signed certificate."),
    f(S, "peer-cert-file", Str, "", "Certificate (PEM) for https peer URLs, served and presented when dialing."),
    f(S, "peer-key-file", Str, "", "Private key (PEM) of --peer-cert-file."),
    f(S, "peer-client-cert-auth", Bool, "false", "Require peer certificates signed by --peer-trusted-ca-file."),
    f(S, "peer-trusted-ca-file", Str, "", "CA bundle (PEM) for peer certificates."),
    f(S, "peer-cert-allowed-cn", List, "", "Allowed common names of peer certificates."),
    f(S, "peer-cert-allowed-hostname", List, "", "Allowed host names (SAN) of peer certificates."),
    f(S, "peer-auto-tls", Bool, "false", "Peer TLS with a generated self-signed certificate."),
    f(S, "self-signed-cert-validity", Uint, "1", "Validity of generated certificates, in years."),
    f(S, "peer-crl-file", Str, "", "Revoked peer certificates (CRL, PEM or DER)."),
    f(S, "client-cert-file", Str, "", "Certificate presented when this member dials client URLs (default: --cert-file)."),
    f(S, "client-key-file", Str, "", "Key of --client-cert-file (default: --key-file)."),
    f(S, "peer-client-cert-file", Str, "", "Certificate presented when dialing peers (default: --peer-cert-file)."),
    f(S, "peer-client-key-file", Str, "", "Key of --peer-client-cert-file (default: --peer-key-file)."),
    f(S, "cipher-suites", List, "", "TLS 1.2 cipher suites (Go's names) for client and peer connections."),
    f(S, "cors", Urls, "*", "Origins allowed for CORS on the client HTTP endpoints ('*': any)."),
    f(S, "host-whitelist", List, "*", "Host names accepted in HTTP requests on insecure client URLs ('*': any)."),
    f(S, "tls-min-version", Str, "TLS1.2", "Minimum TLS version: TLS1.2 or TLS1.3."),
    f(S, "tls-max-version", Str, "", "Maximum TLS version: TLS1.2, TLS1.3, or empty for the newest."),
    // Auth
    f(A, "auth-token", Str, "simple", "Token type: 'simple' or 'jwt,pub-key=...,priv-key=...,sign-method=...[,ttl=5m]'."),
    f(A, "bcrypt-cost", Uint, "10", "bcrypt cost for hashing passwords (4..31)."),
    f(A, "auth-token-ttl", Uint, "300", "Lifetime in seconds of a simple token after its last use."),
    // Profiling and monitoring
    f(P, "enable-pprof", Bool, "false", "Serve a CPU profile at /debug/pprof/profile on the client URLs."),
    f(P, "metrics", Str, "basic", "'basic' or 'extensive' (adds gRPC latency histograms)."),
    f(P, "listen-metrics-urls", Urls, "", "Extra URLs serving /metrics, /health, /livez and /readyz (served from start-up)."),
    // Logging
    f(L, "logger", Str, "zap", "Logger: 'zap' (structured JSON, the only one)."),
    f(L, "log-outputs", List, "default", "Log outputs: 'default' (stderr), 'stderr', 'stdout', or file paths."),
    f(L, "log-level", Str, "info", "Log level: debug, info, warn, error, panic or fatal."),
    f(L, "log-format", Str, "json", "Log format: 'json' or 'console'."),
    no(f(L, "enable-log-rotation", Bool, "false", "Rotate the log file outputs."), NO_ROTATE),
    no(f(L, "log-rotation-config-json", Str, "{\"maxsize\": 100, \"maxage\": 0, \"maxbackups\": 0, \"localtime\": false, \"compress\": false}", "Log rotation settings."), NO_ROTATE),
    // v2
    dep(f(V2, "enable-v2", Bool, "false", "Serve the v2 API.")),
    no(f(V2, "v2-deprecation", Enum(V2_DEPRECATION), "not-yet", "Phase of the v2 store deprecation."), NO_V2),
    dep(f(V2, "experimental-enable-v2v3", Str, "", "Serve v2 requests through the v3 backend.")),
    dep(f(V2, "proxy", Enum(PROXY_MODES), "off", "v2 proxy mode.")),
    dep(f(V2, "proxy-failure-wait", Uint, "5000", "v2 proxy: failure wait (ms).")),
    dep(f(V2, "proxy-refresh-interval", Uint, "30000", "v2 proxy: endpoint refresh interval (ms).")),
    dep(f(V2, "proxy-dial-timeout", Uint, "1000", "v2 proxy: dial timeout (ms).")),
    dep(f(V2, "proxy-write-timeout", Uint, "5000", "v2 proxy: write timeout (ms).")),
    dep(f(V2, "proxy-read-timeout", Uint, "0", "v2 proxy: read timeout (ms).")),
    // Experimental (etcd 3.5 names)
    f(X, "experimental-initial-corrupt-check", Bool, "false", "Check for data corruption before serving clients and peers."),
    f(X, "experimental-corrupt-check-time", Duration, "0s", "Time between cluster corruption checks (0: off)."),
    f(X, "experimental-compact-hash-check-enabled", Bool, "false", "The leader compares the hash of each compaction with the followers'."),
    f(X, "experimental-compact-hash-check-time", Duration, "1m", "Time between compaction hash checks."),
    f(X, "experimental-enable-lease-checkpoint", Bool, "false", "The leader checkpoints remaining lease TTLs to the members."),
    f(X, "experimental-enable-lease-checkpoint-persist", Bool, "false", "Persist lease checkpoints, so a TTL survives a restart of every member."),
    f(X, "experimental-compaction-batch-limit", Int, "0", "Most revisions deleted per compaction batch (0: 1000)."),
    f(X, "experimental-compaction-sleep-interval", Duration, "0", "Pause between compaction batches (0: 10ms)."),
    f(X, "experimental-peer-skip-client-san-verification", Bool, "false", "Skip the check that a peer's certificate names the address it connects from."),
    f(X, "experimental-watch-progress-notify-interval", Duration, "0", "Interval of watch progress notifications (0: 10m)."),
    f(X, "experimental-warning-apply-duration", Duration, "100ms", "Applies slower than this are logged as 'apply request took too long'."),
    f(X, "experimental-warning-unary-request-duration", Duration, "0", "Unary requests slower than this are logged (0: 300ms)."),
    f(X, "experimental-snapshot-catchup-entries", Uint64, "5000", "Raft entries kept after a snapshot for slow followers."),
    f(X, "experimental-bootstrap-defrag-threshold-megabytes", Uint, "0", "Defragment at start-up when this many MB would be freed (0: never)."),
    f(X, "experimental-stop-grpc-service-on-defrag", Bool, "false", "Report NOT_SERVING on the gRPC health service during a defragmentation."),
    no(f(X, "experimental-txn-mode-write-with-shared-buffer", Bool, "true", "Read-write transactions read through the shared buffer."), "retcd's transactions always read their own snapshot"),
    no(f(X, "experimental-memory-mlock", Bool, "false", "Lock the backend's memory."), NO_MLOCK),
    no(f(X, "experimental-downgrade-check-time", Duration, "5s", "Time between downgrade status checks."), NO_DOWNGRADE),
    no(f(X, "experimental-enable-distributed-tracing", Bool, "false", "Export OpenTelemetry traces."), NO_TRACE),
    no(f(X, "experimental-distributed-tracing-address", Str, "localhost:4317", "OpenTelemetry collector address."), NO_TRACE),
    no(f(X, "experimental-distributed-tracing-service-name", Str, "etcd", "OpenTelemetry service name."), NO_TRACE),
    no(f(X, "experimental-distributed-tracing-instance-id", Str, "", "OpenTelemetry instance id."), NO_TRACE),
    no(f(X, "experimental-distributed-tracing-sampling-rate", Int, "0", "OpenTelemetry samples per million."), NO_TRACE),
    // etcd 3.6 names
    f(N, "feature-gates", Gates, "", "Feature gates: Name=true|false,... (InitialCorruptCheck, CompactHashCheck, LeaseCheckpoint, LeaseCheckpointPersist, StopGRPCServiceOnDefrag, TxnModeWriteWithSharedBuffer, SetMemberLocalAddr, AllAlpha, AllBeta)."),
    f(N, "corrupt-check-time", Duration, "0s", "--experimental-corrupt-check-time."),
    f(N, "compact-hash-check-time", Duration, "1m", "--experimental-compact-hash-check-time."),
    f(N, "compaction-batch-limit", Int, "0", "--experimental-compaction-batch-limit."),
    f(N, "compaction-sleep-interval", Duration, "0", "--experimental-compaction-sleep-interval."),
    f(N, "watch-progress-notify-interval", Duration, "0", "--experimental-watch-progress-notify-interval."),
    f(N, "warning-apply-duration", Duration, "100ms", "--experimental-warning-apply-duration."),
    f(N, "warning-unary-request-duration", Duration, "0", "--experimental-warning-unary-request-duration."),
    f(N, "bootstrap-defrag-threshold-megabytes", Uint, "0", "--experimental-bootstrap-defrag-threshold-megabytes."),
    f(N, "snapshot-catchup-entries", Uint64, "5000", "--experimental-snapshot-catchup-entries."),
    f(N, "peer-skip-client-san-verification", Bool, "false", "--experimental-peer-skip-client-san-verification."),
    no(f(N, "memory-mlock", Bool, "false", "--experimental-memory-mlock."), NO_MLOCK),
    no(f(N, "downgrade-check-time", Duration, "5s", "--experimental-downgrade-check-time."), NO_DOWNGRADE),
    no(f(N, "enable-distributed-tracing", Bool, "false", "--experimental-enable-distributed-tracing."), NO_TRACE),
    no(f(N, "distributed-tracing-address", Str, "localhost:4317", "--experimental-distributed-tracing-address."), NO_TRACE),
    no(f(N, "distributed-tracing-service-name", Str, "etcd", "--experimental-distributed-tracing-service-name."), NO_TRACE),
    no(f(N, "distributed-tracing-instance-id", Str, "", "--experimental-distributed-tracing-instance-id."), NO_TRACE),
    no(f(N, "distributed-tracing-sampling-rate", Int, "0", "--experimental-distributed-tracing-sampling-rate."), NO_TRACE),
    // Unsafe
    f(U, "force-new-cluster", Bool, "false", "Restart this member as the only voter of a new cluster, keeping its data."),
    f(U, "unsafe-no-fsync", Bool, "false", "Do not fsync the WAL (data can be lost on a crash)."),
    // Not in --help, as in etcd
    f(H, "config-file", Str, "", "Path to the server configuration file."),
    f(H, "enable-grpc-gateway", Bool, "true", "Serve the JSON gateway (/v3/...) on the client URLs."),
    f(H, "version", Bool, "false", "Print the version and exit."),
    f(H, "emulated-etcd-version", Str, "", "The etcd version to report in Status and /version (default: the one retcd implements)."),
    // retcd's own knobs for tests (etcd has them as fixed intervals)
    f(H, "experimental-lease-checkpoint-interval", Duration, "5m", "How often the leader checkpoints lease TTLs."),
    f(H, "experimental-auto-compaction-revision-interval", Duration, "5m", "How often revision-mode auto-compaction looks at the revision."),
    // etcd's IgnoredFlag legacy names
    legacy("cluster-active-size"),
    legacy("cluster-remove-delay"),
    legacy("cluster-sync-interval"),
    legacy("config"),
    legacy("force"),
    legacy("max-result-buffer"),
    legacy("max-retry-attempts"),
    legacy("peer-heartbeat-interval"),
    legacy("peer-election-timeout"),
    legacy("retry-interval"),
    legacy("snapshot"),
    legacy("v"),
    legacy("vv"),
    legacy("test.coverprofile"),
    legacy("test.outputdir"),
];

/// etcd 3.6's renames: (3.5 experimental name, 3.6 name). Both are
/// accepted; setting both is an error, as in etcd 3.6.
pub static RENAMES: &[(&str, &str)] = &[
    (
        "experimental-compact-hash-check-time",
        "compact-hash-check-time",
    ),
    ("experimental-corrupt-check-time", "corrupt-check-time"),
    (
        "experimental-compaction-batch-limit",
        "compaction-batch-limit",
    ),
    (
        "experimental-watch-progress-notify-interval",
        "watch-progress-notify-interval",
    ),
    (
        "experimental-warning-apply-duration",
        "warning-apply-duration",
    ),
    (
        "experimental-bootstrap-defrag-threshold-megabytes",
        "bootstrap-defrag-threshold-megabytes",
    ),
    ("experimental-memory-mlock", "memory-mlock"),
    (
        "experimental-snapshot-catchup-entries",
        "snapshot-catchup-entries",
    ),
    (
        "experimental-compaction-sleep-interval",
        "compaction-sleep-interval",
    ),
    ("experimental-downgrade-check-time", "downgrade-check-time"),
    (
        "experimental-peer-skip-client-san-verification",
        "peer-skip-client-san-verification",
    ),
    (
        "experimental-enable-distributed-tracing",
        "enable-distributed-tracing",
    ),
    (
        "experimental-distributed-tracing-address",
        "distributed-tracing-address",
    ),
    (
        "experimental-distributed-tracing-service-name",
        "distributed-tracing-service-name",
    ),
    (
        "experimental-distributed-tracing-instance-id",
        "distributed-tracing-instance-id",
    ),
    (
        "experimental-distributed-tracing-sampling-rate",
        "distributed-tracing-sampling-rate",
    ),
];

pub fn lookup(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.name == name)
}

/// The environment variable etcd reads for a flag.
pub fn env_name(flag: &str) -> String {
    format!("ETCD_{}", flag.to_ascii_uppercase().replace('-', "_"))
}

/// Where a value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File,
}

/// The values given explicitly (already checked against their kind); the
/// table's defaults fill the rest.
#[derive(Clone, Debug, Default)]
pub struct Values {
    pub set: BTreeMap<&'static str, (String, Source)>,
}

impl Values {
    pub fn is_set(&self, name: &str) -> bool {
        self.set.contains_key(name)
    }

    pub fn raw(&self, name: &str) -> &str {
        match self.set.get(name) {
            Some((v, _)) => v,
            None => lookup(name).map(|f| f.default).unwrap_or(""),
        }
    }

    pub fn str(&self, name: &str) -> String {
        self.raw(name).to_string()
    }

    pub fn bool(&self, name: &str) -> bool {
        strconv::parse_bool(self.raw(name)).unwrap_or(false)
    }

    pub fn u64(&self, name: &str) -> u64 {
        strconv::parse_uint(self.raw(name), 0, 64).unwrap_or(0)
    }

    pub fn i64(&self, name: &str) -> i64 {
        strconv::parse_int(self.raw(name), 0, 64).unwrap_or(0)
    }

    /// Negative durations (which Go accepts) count as zero.
    pub fn duration(&self, name: &str) -> std::time::Duration {
        let ns = parse_duration(self.raw(name)).unwrap_or(0);
        std::time::Duration::from_nanos(ns.max(0) as u64)
    }

    pub fn list(&self, name: &str) -> Vec<String> {
        let raw = self.raw(name);
        if raw.is_empty() {
            return Vec::new();
        }
        raw.split(',').map(|s| s.to_string()).collect()
    }

    /// A renamed flag: the 3.6 name if given, else the 3.5 name's value.
    pub fn renamed(&self, old: &'static str) -> &'static str {
        match RENAMES.iter().find(|(o, _)| *o == old) {
            Some((_, new)) if self.is_set(new) => new,
            _ => old,
        }
    }
}

/// Checks `value` against `flag`'s kind, as the flag's `Set` would; the
/// error text is the part after `for flag -x: `.
pub fn check(flag: &Flag, value: &str) -> Result<String, String> {
    const PARSE: &str = "parse error";
    match flag.kind {
        Str | Ignored => Ok(value.to_string()),
        Bool => strconv::parse_bool(value)
            .map(|b| b.to_string())
            .map_err(|_| PARSE.to_string()),
        Uint | Uint64 => strconv::parse_uint(value, 0, 64)
            .map(|v| v.to_string())
            .map_err(num_error),
        Uint32 => strconv::parse_uint(value, 0, 32)
            .map(|v| v.to_string())
            .map_err(num_error),
        Int | Int64 => strconv::parse_int(value, 0, 64)
            .map(|v| v.to_string())
            .map_err(num_error),
        Duration => parse_duration(value)
            .map(|_| value.to_string())
            .map_err(|_| PARSE.to_string()),
        Urls => {
            // flags.UniqueURLs: only the whole value may be the exception.
            if flag.name == "cors" && value == "*" {
                return Ok("*".to_string());
            }
            let mut out = Vec::new();
            for u in value.split(',') {
                let u = u.trim();
                check_url(u)?;
                if !out.iter().any(|o: &String| o == u) {
                    out.push(u.to_string());
                }
            }
            Ok(out.join(","))
        }
        List => Ok(value.to_string()),
        Enum(allowed) => {
            if allowed.contains(&value) {
                Ok(value.to_string())
            } else if flag.name == "v2-deprecation" {
                // flags.SelectiveStringsValue names the value.
                Err(format!("invalid value {value:?}"))
            } else {
                Err("invalid value".to_string())
            }
        }
        Gates => {
            super::gates::parse(value)?;
            Ok(value.to_string())
        }
    }
}

/// Go's `flag` package's text for a number it cannot take.
fn num_error(e: strconv::NumError) -> String {
    match e.kind {
        strconv::NumErrorKind::Range => "value out of range".to_string(),
        strconv::NumErrorKind::Syntax => "parse error".to_string(),
    }
}

/// etcd's `types.NewURLs` check of one URL, with Go's `url.Parse` errors
/// for the common mistakes.
pub fn check_url(u: &str) -> Result<(), String> {
    let (scheme, rest) = match scheme_of(u) {
        Some(x) => x,
        None => {
            if u.split('/').next().unwrap_or("").contains(':') {
                return Err(format!(
                    "parse {u:?}: first path segment in URL cannot contain colon"
                ));
            }
            ("", u)
        }
    };
    if !matches!(scheme, "http" | "https" | "unix" | "unixs") {
        return Err(format!(
            "URL scheme must be http, https, unix, or unixs: {u}"
        ));
    }
    let (host, path) = match rest.strip_prefix("//") {
        Some(r) => match r.find(['/', '?', '#']) {
            Some(i) => (&r[..i], &r[i..]),
            None => (r, ""),
        },
        None => ("", rest),
    };
    let bare = host.rsplit('@').next().unwrap_or("");
    if bare.starts_with('[') && !bare.contains(']') {
        return Err(format!("parse {u:?}: missing ']' in host"));
    }
    let host = host.rsplit('@').next().unwrap_or("");
    if split_host_port(host).is_none() {
        return Err(format!(
            "URL address does not have the form \"host:port\": {u}"
        ));
    }
    if !path.is_empty() {
        return Err(format!("URL must not contain a path: {u}"));
    }
    Ok(())
}

/// Go's URL scheme rule: a letter, then letters, digits, `+`, `-`, `.`,
/// then `:`.
fn scheme_of(u: &str) -> Option<(&str, &str)> {
    let i = u.find(':')?;
    let s = &u[..i];
    let mut chars = s.chars();
    let first = chars.next()?;
    if !first.is_ascii_alphabetic()
        || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return None;
    }
    Some((s, &u[i + 1..]))
}

/// Go's `net.SplitHostPort`: `host:port` or `[v6]:port` (the port may be
/// empty or a name; the host may be empty).
pub fn split_host_port(hp: &str) -> Option<(&str, &str)> {
    if let Some(r) = hp.strip_prefix('[') {
        let (h, p) = r.split_once("]:")?;
        if p.contains(':') {
            return None;
        }
        return Some((h, p));
    }
    let (h, p) = hp.rsplit_once(':')?;
    if h.contains(':') {
        return None;
    }
    Some((h, p))
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    Run(Values),
    Help,
    /// Go's flag errors: printed with the usage block, exit 2.
    Error(String),
}

/// Parses the command line (without the program name) like Go's
/// `flag.FlagSet.Parse`; a positional argument stops parsing and is
/// returned (etcd then refuses it).
pub fn parse_args(args: &[String]) -> (Parsed, Vec<String>) {
    let mut values = Values::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a.len() < 2 || !a.starts_with('-') {
            break;
        }
        let mut name = &a[1..];
        if let Some(r) = name.strip_prefix('-') {
            if r.is_empty() {
                i += 1; // "--" ends the flags
                break;
            }
            name = r;
        }
        if name.is_empty() || name.starts_with('-') || name.starts_with('=') {
            return (Parsed::Error(format!("bad flag syntax: {a}")), Vec::new());
        }
        i += 1;
        let (name, inline) = match name.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (name, None),
        };
        let Some(flag) = lookup(name) else {
            if name == "help" || name == "h" {
                return (Parsed::Help, Vec::new());
            }
            return (
                Parsed::Error(format!("flag provided but not defined: -{name}")),
                Vec::new(),
            );
        };
        let value = if flag.kind.is_bool() {
            match inline {
                Some(v) => {
                    if flag.kind == Bool && strconv::parse_bool(&v).is_err() {
                        return (
                            Parsed::Error(format!(
                                "invalid boolean value {v:?} for -{name}: parse error"
                            )),
                            Vec::new(),
                        );
                    }
                    v
                }
                None => "true".to_string(),
            }
        } else {
            match inline {
                Some(v) => v,
                None if i < args.len() => {
                    i += 1;
                    args[i - 1].clone()
                }
                None => {
                    return (
                        Parsed::Error(format!("flag needs an argument: -{name}")),
                        Vec::new(),
                    )
                }
            }
        };
        // etcd's URL flags take "" as an exception that keeps the value
        // they had (`NewUniqueURLsWithExceptions(default, "")`).
        if flag.kind == Urls && flag.name != "cors" && value.is_empty() {
            let kept = values.raw(flag.name).to_string();
            values.set.insert(flag.name, (kept, Source::Flag));
            continue;
        }
        match check(flag, &value) {
            Ok(v) => {
                values.set.insert(flag.name, (v, Source::Flag));
            }
            Err(e) => {
                return (
                    Parsed::Error(format!("invalid value {value:?} for flag -{name}: {e}")),
                    Vec::new(),
                )
            }
        }
    }
    (Parsed::Run(values), args[i..].to_vec())
}

/// The `--help` flag text, generated from the table.
pub fn help_text() -> String {
    let mut out = String::new();
    let mut groups: Vec<&str> = Vec::new();
    for fl in FLAGS {
        if !fl.group.is_empty() && !groups.contains(&fl.group) {
            groups.push(fl.group);
        }
    }
    for g in groups {
        out.push_str(&format!("\n{g}:\n"));
        for fl in FLAGS.iter().filter(|fl| fl.group == g) {
            out.push_str(&format!(
                "  --{} '{}'\n    {}",
                fl.name, fl.default, fl.usage
            ));
            if let Effect::NoEffect(why) | Effect::Refused(why) = fl.effect {
                out.push_str(&format!(" [retcd: {why}]"));
            }
            out.push('\n');
        }
    }
    out
}

/// The usage block printed before errors and `--help`.
pub const USAGE: &str = "Usage:

  retcd [flags]
    Start a retcd server (etcd's v3 API; every flag is also read from ETCD_<FLAG_NAME>).

  retcd --version
    Show the version of retcd and of the etcd release it implements.

  retcd -h | --help
    Show this help.

  retcd --config-file
    Path to the server configuration file (etcd's YAML keys). When a configuration file is given, other command line flags and environment variables are ignored.
";

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn test_go_flag_forms() {
        let (p, rest) = parse_args(&args(&[
            "-name=a",
            "--data-dir",
            "/d",
            "--enable-pprof",
            "--pre-vote=false",
            "--snapshot-count=0x10",
            "--name",
            "b",
            "extra",
            "--x",
        ]));
        let Parsed::Run(v) = p else { panic!("{p:?}") };
        assert_eq!(v.str("name"), "b", "the last occurrence wins");
        assert_eq!(v.str("data-dir"), "/d");
        assert!(v.bool("enable-pprof"));
        assert!(!v.bool("pre-vote"));
        assert_eq!(v.u64("snapshot-count"), 16);
        assert_eq!(rest, args(&["extra", "--x"]));
        let (_, rest) = parse_args(&args(&["--", "--name"]));
        assert_eq!(rest, args(&["--name"]));
    }

    #[test]
    fn test_go_flag_errors() {
        let err = |a: &[&str]| match parse_args(&args(a)).0 {
            Parsed::Error(e) => e,
            p => panic!("{p:?}"),
        };
        assert_eq!(err(&["--foo=1"]), "flag provided but not defined: -foo");
        assert_eq!(err(&["--name"]), "flag needs an argument: -name");
        assert_eq!(
            err(&["--snapshot-count", "abc"]),
            "invalid value \"abc\" for flag -snapshot-count: parse error"
        );
        assert_eq!(
            err(&["--strict-reconfig-check=yes"]),
            "invalid boolean value \"yes\" for -strict-reconfig-check: parse error"
        );
        assert_eq!(
            err(&["--initial-cluster-state=bogus"]),
            "invalid value \"bogus\" for flag -initial-cluster-state: invalid value"
        );
        assert_eq!(
            err(&["--listen-client-urls=127.0.0.1:2379"]),
            "invalid value \"127.0.0.1:2379\" for flag -listen-client-urls: parse \"127.0.0.1:2379\": first path segment in URL cannot contain colon"
        );
        assert_eq!(
            err(&["--grpc-keepalive-min-time=5"]),
            "invalid value \"5\" for flag -grpc-keepalive-min-time: parse error"
        );
        assert!(matches!(
            parse_args(&args(&["--help=false"])).0,
            Parsed::Help
        ));
        assert!(matches!(parse_args(&args(&["-h"])).0, Parsed::Help));
        // Legacy names are accepted bare or with a value.
        assert!(matches!(
            parse_args(&args(&["--force", "-v=3"])).0,
            Parsed::Run(_)
        ));
    }

    #[test]
    fn test_urls() {
        assert!(check_url("http://127.0.0.1:2379").is_ok());
        assert!(check_url("https://[::1]:2379").is_ok());
        assert!(check_url("unix://localhost:2379").is_ok());
        assert_eq!(
            check_url("http://127.0.0.1:2379/").unwrap_err(),
            "URL must not contain a path: http://127.0.0.1:2379/"
        );
        assert_eq!(
            check_url("http://127.0.0.1").unwrap_err(),
            "URL address does not have the form \"host:port\": http://127.0.0.1"
        );
        assert_eq!(
            check_url("ftp://a:1").unwrap_err(),
            "URL scheme must be http, https, unix, or unixs: ftp://a:1"
        );
    }

    #[test]
    fn test_every_flag_default_parses() {
        for fl in FLAGS {
            if fl.default.is_empty() && !matches!(fl.kind, Str | List | Ignored | Gates) {
                continue;
            }
            if fl.kind == Urls && fl.default.is_empty() {
                continue;
            }
            check(fl, fl.default).unwrap_or_else(|e| panic!("{}: {e}", fl.name));
        }
        let mut names: Vec<_> = FLAGS.iter().map(|f| f.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FLAGS.len(), "a flag is listed twice");
        for (old, new) in RENAMES {
            assert!(
                lookup(old).is_some() && lookup(new).is_some(),
                "{old} {new}"
            );
        }
    }
}
