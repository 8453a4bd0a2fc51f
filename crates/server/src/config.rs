//! retcd's configuration: etcd's flag names, defaults and `ETCD_*` variables.
//!
//! Every flag can also be given as the environment variable etcd reads for it
//! (`--data-dir` ↔ `ETCD_DATA_DIR`); a flag on the command line wins.

use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// The etcd API version retcd implements; reported by Maintenance.Status and
/// `/version` (`etcdserver`), because clients gate features on it.
pub const ETCD_API_VERSION: &str = "3.5.0";
/// The cluster version reported by `/version` (`etcdcluster`).
pub const ETCD_CLUSTER_VERSION: &str = "3.5.0";
/// gRPC adds this much on top of `--max-request-bytes` before a message is
/// refused at the transport (etcd's `grpcOverheadBytes`).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "retcd",
    version = concat!(env!("CARGO_PKG_VERSION"), " (etcd API 3.5)"),
    about = "retcd: a distributed, reliable key-value store speaking etcd's v3 API"
)]
pub struct Config {
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory (default: ${name}.etcd).
    #[arg(long, env = "ETCD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Path to the dedicated WAL directory (default: ${data-dir}/member/wal).
    #[arg(long, env = "ETCD_WAL_DIR")]
    pub wal_dir: Option<PathBuf>,
    /// Comma-separated URLs to listen on for client traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub listen_client_urls: String,
    /// Comma-separated client URLs advertised to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub advertise_client_urls: String,
    /// Comma-separated URLs to listen on for peer traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub listen_peer_urls: String,
    /// This member's peer URLs, advertised to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping: name=peerURL,...
    /// (default: ${name}=${initial-advertise-peer-urls}).
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Initial cluster token, mixed into member and cluster IDs.
    #[arg(
        long,
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    pub initial_cluster_token: String,
    /// Initial cluster state ('new' or 'existing').
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new")]
    pub initial_cluster_state: String,
    /// Number of committed transactions to trigger a snapshot to disk.
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Raft entries kept in memory after a snapshot, for slow followers.
    #[arg(
        long,
        env = "ETCD_EXPERIMENTAL_SNAPSHOT_CATCHUP_ENTRIES",
        default_value_t = 5000
    )]
    pub experimental_snapshot_catchup_entries: u64,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to timeout.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// Raise alarms when backend size exceeds the given quota (0 = 2 GiB).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    pub quota_backend_bytes: i64,
    /// Maximum client request size in bytes the server will accept.
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1_572_864)]
    pub max_request_bytes: u64,
    /// Maximum number of operations permitted in a transaction.
    #[arg(long, env = "ETCD_MAX_TXN_OPS", default_value_t = 128)]
    pub max_txn_ops: u64,
    /// Backend batch commit interval (e.g. 100ms).
    #[arg(long, env = "ETCD_BACKEND_BATCH_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub backend_batch_interval: Duration,
    /// Maximum operations before a backend batch is committed durably.
    #[arg(long, env = "ETCD_BACKEND_BATCH_LIMIT", default_value_t = 10_000)]
    pub backend_batch_limit: u64,
    /// Log level: debug, info, warn, error.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Logger: only 'zap' style structured output is offered ('zap' = JSON lines).
    #[arg(long, env = "ETCD_LOGGER", default_value = "zap")]
    pub logger: String,
    /// Reject reconfiguration requests that would cause quorum loss.
    #[arg(long, env = "ETCD_STRICT_RECONFIG_CHECK", default_value_t = true,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub strict_reconfig_check: bool,
    /// The maximum number of learner members in the cluster
    /// (etcd 3.5's `--experimental-max-learners`, 3.6's `--max-learners`).
    #[arg(
        long,
        env = "ETCD_MAX_LEARNERS",
        default_value_t = 1,
        alias = "experimental-max-learners"
    )]
    pub max_learners: usize,
    /// Enable the PreVote phase of Raft elections.
    #[arg(long, env = "ETCD_PRE_VOTE", default_value_t = true, action = clap::ArgAction::Set)]
    pub pre_vote: bool,
    /// Enable the leader to send regular checkpoints to other members to
    /// prevent reset of remaining TTL on leader change.
    #[arg(long, env = "ETCD_EXPERIMENTAL_ENABLE_LEASE_CHECKPOINT", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub experimental_enable_lease_checkpoint: bool,
    /// How often the leader checkpoints lease remaining TTLs (etcd's
    /// `LeaseCheckpointInterval`, 5m; not a flag in etcd 3.4 — retcd
    /// exposes it, hidden, for tests).
    #[arg(long, env = "ETCD_EXPERIMENTAL_LEASE_CHECKPOINT_INTERVAL", default_value = "5m",
          value_parser = parse_duration, hide = true)]
    pub experimental_lease_checkpoint_interval: Duration,
    /// Duration of periodic watch progress notifications.
    #[arg(long, env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL", default_value = "10m",
          value_parser = parse_duration)]
    pub experimental_watch_progress_notify_interval: Duration,
    /// Interpret 'auto-compaction-retention' one of: periodic|revision.
    /// 'periodic' for duration based retention, defaulting to hours if no
    /// time unit is provided (e.g. '5m'). 'revision' for revision number
    /// based retention.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// Auto compaction retention for mvcc key value store. 0 means disable
    /// auto compaction.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// How often revision-mode auto-compaction looks at the revision
    /// (etcd: a fixed 5 minutes; retcd exposes it, hidden, for tests).
    #[arg(long, env = "ETCD_EXPERIMENTAL_AUTO_COMPACTION_REVISION_INTERVAL", default_value = "5m",
          value_parser = parse_duration, hide = true)]
    pub experimental_auto_compaction_revision_interval: Duration,
    /// Sets the maximum revisions deleted in each compaction batch.
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACTION_BATCH_LIMIT", default_value_t = retcd_mvcc::DEFAULT_COMPACTION_BATCH_LIMIT)]
    pub experimental_compaction_batch_limit: usize,
    /// Sets the sleep interval between each compaction batch (etcd 3.6's
    /// flag; etcd 3.4/3.5 sleep a fixed 10ms).
    #[arg(long, env = "ETCD_EXPERIMENTAL_COMPACTION_SLEEP_INTERVAL", default_value = "10ms",
          value_parser = parse_duration)]
    pub experimental_compaction_sleep_interval: Duration,
    /// Enable to check data corruption before serving any client/peer
    /// traffic.
    #[arg(long, env = "ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub experimental_initial_corrupt_check: bool,
    /// Duration of time between cluster corruption check passes (0s:
    /// disabled).
    #[arg(long, env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME", default_value = "0s",
          value_parser = parse_duration)]
    pub experimental_corrupt_check_time: Duration,

    /// Auth token type: `simple`, or `jwt,pub-key=<pem>,priv-key=<pem>,
    /// sign-method=<RS256|ES256|HS256|...>[,ttl=5m]` (etcd's option).
    #[arg(long, env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,

    /// bcrypt cost for hashing passwords (4..=31).
    #[arg(long, env = "ETCD_BCRYPT_COST", default_value_t = 10)]
    pub bcrypt_cost: u32,

    /// How long a simple token lives after its last use, seconds.
    #[arg(long, env = "ETCD_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,

    /// Certificate (PEM) for https client URLs.
    #[arg(long, env = "ETCD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,

    /// Private key (PEM) for https client URLs.
    #[arg(long, env = "ETCD_KEY_FILE")]
    pub key_file: Option<PathBuf>,

    /// Require client certificates signed by --trusted-ca-file.
    #[arg(long, env = "ETCD_CLIENT_CERT_AUTH", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub client_cert_auth: bool,

    /// CA (PEM) for client certificates.
    #[arg(long, env = "ETCD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,

    /// Certificate (PEM) for https peer URLs (served and presented when
    /// dialing peers).
    #[arg(long, env = "ETCD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,

    /// Private key (PEM) for https peer URLs.
    #[arg(long, env = "ETCD_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,

    /// Require peer certificates signed by --peer-trusted-ca-file.
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_AUTH", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub peer_client_cert_auth: bool,

    /// CA (PEM) for peer certificates.
    #[arg(long, env = "ETCD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,

    /// Client TLS using generated (self-signed) certificates.
    #[arg(long, env = "ETCD_AUTO_TLS", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub auto_tls: bool,

    /// Peer TLS using generated (self-signed) certificates.
    #[arg(long, env = "ETCD_PEER_AUTO_TLS", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub peer_auto_tls: bool,

    /// The validity period of the self-signed certificates, in years.
    #[arg(long, env = "ETCD_SELF_SIGNED_CERT_VALIDITY", default_value_t = 1)]
    pub self_signed_cert_validity: u32,

    /// Path to the client certificate revocation list (PEM or DER).
    #[arg(long, env = "ETCD_CLIENT_CRL_FILE")]
    pub client_crl_file: Option<PathBuf>,

    /// Path to the peer certificate revocation list (PEM or DER).
    #[arg(long, env = "ETCD_PEER_CRL_FILE")]
    pub peer_crl_file: Option<PathBuf>,

    /// Certificate this member presents when it dials client URLs
    /// (default: --cert-file).
    #[arg(long, env = "ETCD_CLIENT_CERT_FILE")]
    pub client_cert_file: Option<PathBuf>,

    /// Key of --client-cert-file (default: --key-file).
    #[arg(long, env = "ETCD_CLIENT_KEY_FILE")]
    pub client_key_file: Option<PathBuf>,

    /// Certificate this member presents when it dials peers (default:
    /// --peer-cert-file).
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_FILE")]
    pub peer_client_cert_file: Option<PathBuf>,

    /// Key of --peer-client-cert-file (default: --peer-key-file).
    #[arg(long, env = "ETCD_PEER_CLIENT_KEY_FILE")]
    pub peer_client_key_file: Option<PathBuf>,

    /// Allowed common names of peer certificates, comma-separated
    /// (exclusive with --peer-cert-allowed-hostname).
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_CN", default_value = "")]
    pub peer_cert_allowed_cn: String,

    /// Allowed host names (SAN) of peer certificates, comma-separated.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME", default_value = "")]
    pub peer_cert_allowed_hostname: String,

    /// Allowed host names (SAN) of client certificates, comma-separated.
    #[arg(long, env = "ETCD_CLIENT_CERT_ALLOWED_HOSTNAME", default_value = "")]
    pub client_cert_allowed_hostname: String,

    /// Comma-separated TLS 1.2 cipher suites (Go's names) for client and
    /// peer connections; empty: the defaults.
    #[arg(long, env = "ETCD_CIPHER_SUITES", default_value = "")]
    pub cipher_suites: String,

    /// Minimum TLS version: TLS1.2 or TLS1.3.
    #[arg(long, env = "ETCD_TLS_MIN_VERSION", default_value = "TLS1.2")]
    pub tls_min_version: String,

    /// Maximum TLS version: TLS1.2, TLS1.3, or empty (the newest).
    #[arg(long, env = "ETCD_TLS_MAX_VERSION", default_value = "")]
    pub tls_max_version: String,

    /// Skip the check that a peer certificate's SANs match the address the
    /// peer connects from.
    #[arg(long, env = "ETCD_EXPERIMENTAL_PEER_SKIP_CLIENT_SAN_VERIFICATION",
          alias = "peer-skip-client-san-verification", default_value_t = false,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub experimental_peer_skip_client_san_verification: bool,

    /// Maximum concurrent HTTP/2 streams per client connection.
    #[arg(long, env = "ETCD_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
}

/// Parses etcd/Go style durations: "100ms", "1s", "2m", "1h", or bare
/// nanoseconds as Go's flag package would print them.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
    let secs = match unit {
        "ns" | "" => n / 1e9,
        "us" | "µs" => n / 1e6,
        "ms" => n / 1e3,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("invalid duration unit in {s:?}")),
    };
    Ok(Duration::from_secs_f64(secs))
}

/// A member named in `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    pub name: String,
    pub peer_urls: Vec<String>,
}

impl Config {
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.etcd", self.name)))
    }
    pub fn member_dir(&self) -> PathBuf {
        self.data_dir().join("member")
    }
    pub fn wal_dir(&self) -> PathBuf {
        self.wal_dir
            .clone()
            .unwrap_or_else(|| self.member_dir().join("wal"))
    }
    pub fn snap_dir(&self) -> PathBuf {
        self.member_dir().join("snap")
    }
    pub fn backend_path(&self) -> PathBuf {
        self.snap_dir().join("db")
    }

    /// The quota in bytes (etcd: 0 means the 2 GiB default).
    pub fn quota_bytes(&self) -> u64 {
        if self.quota_backend_bytes <= 0 {
            2 * 1024 * 1024 * 1024
        } else {
            self.quota_backend_bytes as u64
        }
    }

    /// Election timeout in heartbeat ticks, as raft counts it.
    pub fn election_ticks(&self) -> usize {
        (self.election_timeout / self.heartbeat_interval.max(1)).max(2) as usize
    }

    /// Parses `--initial-cluster` into members grouped by name, in the order
    /// given (a name may appear several times, one per peer URL).
    pub fn initial_members(&self) -> Result<Vec<InitialMember>, String> {
        let spec = match &self.initial_cluster {
            Some(s) => s.clone(),
            None => format!("{}={}", self.name, self.initial_advertise_peer_urls),
        };
        let mut members: Vec<InitialMember> = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, url) = part
                .split_once('=')
                .ok_or_else(|| format!("invalid --initial-cluster entry {part:?}"))?;
            validate_url(url)?;
            match members.iter_mut().find(|m| m.name == name) {
                Some(m) => m.peer_urls.push(url.to_string()),
                None => members.push(InitialMember {
                    name: name.to_string(),
                    peer_urls: vec![url.to_string()],
                }),
            }
        }
        if !members.iter().any(|m| m.name == self.name) {
            return Err(format!(
                "couldn't find local name {:?} in the initial cluster configuration",
                self.name
            ));
        }
        Ok(members)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_interval == 0 {
            return Err("--heartbeat-interval must be > 0".into());
        }
        if self.election_timeout < 5 * self.heartbeat_interval {
            return Err(format!(
                "--election-timeout[{}ms] should be at least as 5 times as --heartbeat-interval[{}ms]",
                self.election_timeout, self.heartbeat_interval
            ));
        }
        if self.initial_cluster_state != "new" && self.initial_cluster_state != "existing" {
            return Err(format!(
                "invalid value {:?} for --initial-cluster-state (valid: new, existing)",
                self.initial_cluster_state
            ));
        }
        for u in split_urls(&self.listen_client_urls)
            .iter()
            .chain(split_urls(&self.listen_peer_urls).iter())
        {
            validate_url(u)?;
        }
        self.initial_members()?;
        Ok(())
    }
}

pub fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

fn validate_url(u: &str) -> Result<(), String> {
    if !(u.starts_with("http://") || u.starts_with("https://") || u.starts_with("unix://")) {
        return Err(format!("URL scheme must be http, https, unix: {u}"));
    }
    Ok(())
}

/// `http://host:port[/]` → `host:port`, resolving `localhost` to 127.0.0.1
/// for listening (etcd listens on what the name resolves to).
pub fn url_host_port(u: &str) -> Result<String, String> {
    let rest = u
        .split_once("://")
        .map(|(_, r)| r)
        .ok_or_else(|| format!("invalid URL {u:?}"))?;
    let hp = rest.trim_end_matches('/');
    if !hp.contains(':') {
        return Err(format!("URL {u:?} has no port"));
    }
    Ok(hp.replacen("localhost:", "127.0.0.1:", 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_defaults_match_etcd() {
        let c = Config::parse_from(["retcd"]);
        assert_eq!(c.name, "default");
        assert_eq!(c.data_dir(), PathBuf::from("default.etcd"));
        assert_eq!(c.snapshot_count, 100_000);
        assert_eq!(c.heartbeat_interval, 100);
        assert_eq!(c.election_timeout, 1000);
        assert_eq!(c.max_request_bytes, 1_572_864);
        assert_eq!(c.max_txn_ops, 128);
        assert_eq!(c.quota_bytes(), 2 << 30);
        assert_eq!(c.election_ticks(), 10);
        let m = c.initial_members().unwrap();
        assert_eq!(m[0].peer_urls, vec!["http://localhost:2380".to_string()]);
    }

    #[test]
    fn test_parse_duration() {
        assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn test_initial_cluster_requires_local_name() {
        let c = Config::parse_from([
            "retcd",
            "--name",
            "a",
            "--initial-cluster",
            "b=http://127.0.0.1:1",
        ]);
        assert!(c.initial_members().is_err());
        let c = Config::parse_from([
            "retcd",
            "--name",
            "a",
            "--initial-cluster",
            "a=http://127.0.0.1:1,b=http://127.0.0.1:2,a=http://127.0.0.1:3",
        ]);
        let m = c.initial_members().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].peer_urls.len(), 2);
    }
}
