//! retcd's configuration: etcd's flag names, defaults and `ETCD_*` variables.
//!
//! Every flag can also be given as the environment variable etcd reads for it
//! (`--data-dir` ↔ `ETCD_DATA_DIR`; setting both is an error, as in etcd), or
//! as a key of the `--config-file` YAML, which then replaces flags and
//! variables. `flags` holds the table and Go's parsing rules, `file` the
//! YAML reader, `gates` etcd 3.6's feature gates.

pub mod file;
pub mod flags;
pub mod gates;
pub mod version;

use flags::Values;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use version::ETCD_VERSION as ETCD_API_VERSION;
/// gRPC adds this much on top of `--max-request-bytes` before a message is
/// refused at the transport (etcd's `grpcOverheadBytes`).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// The server's configuration, resolved from the flag table (defaults
/// applied, etcd 3.6 names folded into the 3.5 fields, feature gates
/// applied). Built by [`Config::load`] or [`Config::from_args`].
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub data_dir: Option<PathBuf>,
    pub wal_dir: Option<PathBuf>,
    /// Comma-separated URLs (checked).
    pub listen_client_urls: String,
    pub listen_client_http_urls: String,
    pub advertise_client_urls: String,
    pub listen_peer_urls: String,
    pub listen_metrics_urls: String,
    pub initial_advertise_peer_urls: String,
    pub initial_cluster: Option<String>,
    pub initial_cluster_token: String,
    pub initial_cluster_state: String,
    pub snapshot_count: u64,
    pub experimental_snapshot_catchup_entries: u64,
    /// Milliseconds.
    pub heartbeat_interval: u64,
    /// Milliseconds.
    pub election_timeout: u64,
    pub initial_election_tick_advance: bool,
    pub quota_backend_bytes: i64,
    pub max_request_bytes: u64,
    /// `--max-range-response-bytes`.
    pub max_range_response_bytes: u64,
    pub max_txn_ops: u64,
    pub max_snapshots: u64,
    pub max_wals: u64,
    pub backend_batch_interval: Duration,
    pub backend_batch_limit: u64,
    pub grpc_keepalive_min_time: Duration,
    pub grpc_keepalive_interval: Duration,
    pub grpc_keepalive_timeout: Duration,
    pub log_level: String,
    pub logger: String,
    pub log_outputs: Vec<String>,
    pub log_format: String,
    pub strict_reconfig_check: bool,
    pub max_learners: usize,
    pub pre_vote: bool,
    pub experimental_enable_lease_checkpoint: bool,
    pub experimental_enable_lease_checkpoint_persist: bool,
    pub experimental_lease_checkpoint_interval: Duration,
    pub experimental_watch_progress_notify_interval: Duration,
    pub auto_compaction_mode: String,
    pub auto_compaction_retention: String,
    pub experimental_auto_compaction_revision_interval: Duration,
    pub experimental_compaction_batch_limit: usize,
    pub experimental_compaction_sleep_interval: Duration,
    pub experimental_initial_corrupt_check: bool,
    pub experimental_corrupt_check_time: Duration,
    pub experimental_compact_hash_check_enabled: bool,
    pub experimental_compact_hash_check_time: Duration,
    pub experimental_warning_apply_duration: Duration,
    pub warning_unary_request_duration: Duration,
    pub experimental_bootstrap_defrag_threshold_megabytes: u64,
    pub experimental_stop_grpc_service_on_defrag: bool,
    pub force_new_cluster: bool,
    pub unsafe_no_fsync: bool,
    pub enable_pprof: bool,
    /// `basic` or `extensive`.
    pub metrics: String,
    pub enable_grpc_gateway: bool,
    /// CORS origins for the client HTTP endpoints (`*`: any).
    pub cors: Vec<String>,
    /// Host names accepted on insecure client URLs (`*`: any).
    pub host_whitelist: Vec<String>,
    /// The etcd version reported (Status, /version).
    pub etcd_version: String,
    pub raft_read_timeout: Duration,
    pub raft_write_timeout: Duration,
    pub auth_token: String,
    pub bcrypt_cost: u32,
    pub auth_token_ttl: u64,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub client_cert_auth: bool,
    pub trusted_ca_file: Option<PathBuf>,
    pub peer_cert_file: Option<PathBuf>,
    pub peer_key_file: Option<PathBuf>,
    pub peer_client_cert_auth: bool,
    pub peer_trusted_ca_file: Option<PathBuf>,
    pub auto_tls: bool,
    pub peer_auto_tls: bool,
    pub self_signed_cert_validity: u32,
    pub client_crl_file: Option<PathBuf>,
    pub peer_crl_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    pub peer_client_cert_file: Option<PathBuf>,
    pub peer_client_key_file: Option<PathBuf>,
    /// Comma-separated.
    pub peer_cert_allowed_cn: String,
    pub peer_cert_allowed_hostname: String,
    pub client_cert_allowed_hostname: String,
    pub cipher_suites: String,
    pub tls_min_version: String,
    pub tls_max_version: String,
    pub experimental_peer_skip_client_san_verification: bool,
    pub max_concurrent_streams: u32,
    /// The effective feature gates (etcd 3.6).
    pub feature_gates: BTreeMap<&'static str, bool>,
    /// The config file used, if any.
    pub config_file: Option<PathBuf>,
    /// Lines to log once the logger exists (flag warnings, variables used).
    pub notices: Vec<Notice>,
}

/// A log line produced while reading the configuration.
#[derive(Debug, Clone)]
pub struct Notice {
    pub warn: bool,
    pub msg: String,
    pub fields: Vec<(&'static str, String)>,
}

/// Why the configuration could not be loaded: the text and the exit code
/// etcd uses (2 for the flag package's errors, 1 for the rest).
#[derive(Debug)]
pub enum Exit {
    /// `--help`: usage on stderr, flags on stdout, exit 0.
    Help,
    /// `--version`, exit 0.
    Version,
    /// A flag error: the message and the usage block on stderr, exit 2.
    Usage(String),
    /// Logged as etcd's `failed to verify flags` warning, exit 1.
    Verify(String),
    /// Logged at fatal level with fields, exit 1.
    Fatal(String, Vec<(&'static str, String)>),
    /// Printed as it is on stderr, exit 1.
    Plain(String),
    /// What a Go panic prints first (`panic: <text>`), exit 2: etcd
    /// panics on an unknown `--log-level`.
    Panic(String),
    /// A `failed to verify flags` that etcd's own logger does not write
    /// (its level is above warn): exit 1, nothing printed.
    Quiet(String),
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Help => write!(f, "help requested"),
            Exit::Version => write!(f, "version requested"),
            Exit::Usage(m)
            | Exit::Verify(m)
            | Exit::Fatal(m, _)
            | Exit::Plain(m)
            | Exit::Panic(m)
            | Exit::Quiet(m) => f.write_str(m),
        }
    }
}

fn opt_path(v: &Values, name: &str) -> Option<PathBuf> {
    let s = v.raw(name);
    (!s.is_empty()).then(|| PathBuf::from(s))
}

impl Config {
    /// The configuration of `retcd` run with `args` (no program name) and
    /// no environment: for tools and tests.
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Config, Exit> {
        let args: Vec<String> = args.iter().map(|a| a.as_ref().to_string()).collect();
        Config::load(&args, &[])
    }

    /// etcd's ranking: the command line is parsed first (its errors win);
    /// then a config file (`--config-file`, else `ETCD_CONFIG_FILE`)
    /// replaces every flag and variable; otherwise each flag not on the
    /// command line is read from its `ETCD_*` variable.
    pub fn load(args: &[String], env: &[(String, String)]) -> Result<Config, Exit> {
        let (parsed, rest) = flags::parse_args(args);
        let mut values = match parsed {
            flags::Parsed::Help => return Err(Exit::Help),
            flags::Parsed::Error(e) => return Err(Exit::Usage(e)),
            flags::Parsed::Run(v) => v,
        };
        // etcd (`etcdmain/config.go` parse): a positional argument is
        // refused before --version and before any config file is read.
        if let Some(first) = rest.first() {
            return Err(Exit::Verify(format!("'{first}' is not a valid flag")));
        }
        if values.bool("version") {
            return Err(Exit::Version);
        }
        let mut notices = Vec::new();
        let getenv = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let mut file = values.str("config-file");
        if file.is_empty() {
            file = getenv("ETCD_CONFIG_FILE").unwrap_or_default();
        }
        let mut late = None;
        let config_file = if !file.is_empty() {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Exit::Verify(format!("open {file}: {}", io_text(&e))))?;
            let parsed = file::parse(&text).map_err(|e| match e {
                file::FileError::Verify(m) => Exit::Verify(m),
                file::FileError::Plain(m) => Exit::Plain(m),
            })?;
            values = parsed.values;
            late = parsed.late;
            notices.push(Notice {
                warn: false,
                msg: "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided".into(),
                fields: vec![("path", file.clone())],
            });
            Some(PathBuf::from(file))
        } else {
            Self::read_env(&mut values, env, &mut notices)?;
            None
        };
        let mut cfg = Config::from_values(&values)?;
        cfg.config_file = config_file.clone();
        cfg.etcd_validate(&values, config_file.is_some())?;
        // After etcd's checks, the config file's `proxy` and
        // `discovery-fallback` (etcdmain's second pass over the file).
        if let Some(e) = late {
            return Err(match e {
                file::FileError::Verify(m) => Exit::Verify(m),
                file::FileError::Plain(m) => Exit::Plain(m),
            });
        }
        notices.extend(Self::flag_notices(&values, &cfg.feature_gates)?);
        cfg.notices = notices;
        Ok(cfg)
    }

    /// etcd 3.5's `embed.Config.Validate` (and `setupLogging`), in its
    /// order, with its texts; `explicit`: the flags and variables given
    /// (the config file has no "set explicitly").
    fn etcd_validate(&self, values: &Values, from_file: bool) -> Result<(), Exit> {
        let verify = |m: String| Err(Exit::Verify(m));
        // setupLogging
        match self.logger.as_str() {
            "capnslog" => return verify("--logger=capnslog is removed in v3.5".into()),
            "zap" => {}
            l => return verify(format!("unknown logger option {l:?}")),
        }
        // Given (even as ""): each comma-separated name, "" included
        // (flags.UniqueStringsValue, sorted).
        let outputs: Vec<String> = if values.is_set("log-outputs") {
            let mut o: Vec<String> = values
                .raw("log-outputs")
                .split(',')
                .map(str::to_string)
                .collect();
            o.sort();
            o.dedup();
            o
        } else if self.log_outputs.is_empty() {
            vec!["default".to_string()]
        } else {
            self.log_outputs.clone()
        };
        if outputs.len() > 1 && outputs.iter().any(|o| o == "default") {
            return verify("multi logoutput for \"default\" is not supported yet".into());
        }
        if values.bool("enable-log-rotation") {
            let files = outputs
                .iter()
                .filter(|o| !matches!(o.as_str(), "default" | "stderr" | "stdout"))
                .count();
            if (outputs.len() == 1 && files == 0) || files > 1 {
                return verify("--log-outputs requires a single file path when --log-rotate-config-json is defined".into());
            }
            if let Some(e) = rotation_config_error(&values.str("log-rotation-config-json")) {
                return verify(e);
            }
        }
        if log_level(&self.log_level).is_none() {
            // etcd's logutil.ConvertToZapLevel panics (exit 2).
            return Err(Exit::Panic(format!(
                "unrecognized level: {:?}",
                self.log_level
            )));
        }
        for o in &outputs {
            if matches!(o.as_str(), "default" | "stderr" | "stdout") {
                continue;
            }
            let opened = if o.is_empty() {
                Err(std::io::Error::from(std::io::ErrorKind::NotFound))
            } else {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(o)
            };
            if let Err(e) = opened {
                return verify(format!(
                    "couldn't open sink {o:?}: open {o}: {}",
                    io_text(&e)
                ));
            }
        }
        // From here on etcd logs the failure with the logger it just
        // built: at a level above warn, its warning is not written.
        let quiet = matches!(
            log_level(&self.log_level),
            Some("error" | "dpanic" | "panic" | "fatal")
        );
        let verify = |m: String| {
            if quiet {
                Err(Exit::Quiet(m))
            } else {
                Err(Exit::Verify(m))
            }
        };
        // checkBindURLs, checkHostURLs
        for list in [
            &self.listen_peer_urls,
            &self.listen_client_urls,
            &self.listen_client_http_urls,
            &self.listen_metrics_urls,
        ] {
            for u in split_urls(list) {
                check_bind_url(&u).or_else(verify)?;
            }
        }
        for (flag, list) in [
            (
                "--initial-advertise-peer-urls",
                &self.initial_advertise_peer_urls,
            ),
            ("--advertise-client-urls", &self.advertise_client_urls),
        ] {
            let urls = split_urls(list);
            for u in &urls {
                if url_host(u).is_empty() {
                    return verify(format!(
                        "{flag} {:?} must be \"host:port\" (unexpected empty host ({u}))",
                        urls.join(",")
                    ));
                }
            }
        }
        if self.initial_cluster_state != "new" && self.initial_cluster_state != "existing" {
            return verify(format!(
                "unexpected clusterState {:?}",
                self.initial_cluster_state
            ));
        }
        if self.heartbeat_interval == 0 {
            return verify("--heartbeat-interval must be >0 (set to 0ms)".into());
        }
        if self.election_timeout == 0 {
            return verify("--election-timeout must be >0 (set to 0ms)".into());
        }
        if 5 * self.heartbeat_interval > self.election_timeout {
            return verify(format!(
                "--election-timeout[{}ms] should be at least as 5 times as --heartbeat-interval[{}ms]",
                self.election_timeout, self.heartbeat_interval
            ));
        }
        if self.election_timeout > 50_000 {
            return verify(format!(
                "--election-timeout[{}ms] is too long, and should be set less than 50000ms",
                self.election_timeout
            ));
        }
        // etcdmain: an explicit --listen-client-urls needs an explicit
        // --advertise-client-urls (flags and variables only).
        if !from_file
            && values.is_set("listen-client-urls")
            && !values.is_set("advertise-client-urls")
        {
            return verify(ERR_UNSET_ADVERTISE.into());
        }
        match self.auto_compaction_mode.as_str() {
            "" | "periodic" | "revision" => {}
            m => return verify(format!("unknown auto-compaction-mode {m:?}")),
        }
        // StartEtcd's first step (updateCipherSuites): an empty name is
        // refused (logged at fatal level, so never quiet).
        if values.is_set("cipher-suites") {
            if let Some(bad) = values
                .raw("cipher-suites")
                .split(',')
                .find(|s| s.trim().is_empty())
            {
                return Err(Exit::Verify(format!("unexpected TLS cipher suite {bad:?}")));
            }
        }
        Ok(())
    }

    /// `ETCD_*` variables for the flags not given on the command line
    /// (etcd's `SetFlagsFromEnv`, then `verifyEnv`): every flag is read
    /// from its variable in flag-name order and the last bad value is the
    /// error; then the variables are checked in their order: one that
    /// shadows a flag given on the command line is fatal (even when a bad
    /// value was found), an unknown `ETCD_*` one is logged.
    fn read_env(
        values: &mut Values,
        env: &[(String, String)],
        notices: &mut Vec<Notice>,
    ) -> Result<(), Exit> {
        let mut names: Vec<&flags::Flag> = flags::FLAGS.iter().collect();
        names.sort_by_key(|f| f.name);
        let on_cmdline = |values: &Values, name: &str| {
            matches!(values.set.get(name), Some((_, flags::Source::Flag)))
        };
        let mut used = Vec::new();
        let mut error = None;
        for fl in names {
            let key = flags::env_name(fl.name);
            if key == "ETCD_VERSION" || on_cmdline(values, fl.name) {
                continue;
            }
            let Some((_, v)) = env.iter().find(|(k, _)| *k == key) else {
                continue;
            };
            if v.is_empty() {
                continue;
            }
            used.push(key.clone());
            match flags::check(fl, v) {
                Ok(checked) => {
                    notices.push(Notice {
                        warn: false,
                        msg: "recognized and used environment variable".into(),
                        fields: vec![
                            ("variable-name", key.clone()),
                            ("variable-value", v.clone()),
                        ],
                    });
                    values.set.insert(fl.name, (checked, flags::Source::Env));
                }
                Err(e) => error = Some(Exit::Verify(format!("invalid value {v:?} for {key}: {e}"))),
            }
        }
        for (k, v) in env {
            if k == "ETCD_VERSION" {
                notices.push(Notice {
                    warn: true,
                    msg: "cannot set special environment variable".into(),
                    fields: vec![("key", k.clone()), ("value", v.clone())],
                });
                continue;
            }
            if used.contains(k) {
                continue;
            }
            let shadowed = k.strip_prefix("ETCD_").and_then(|rest| {
                flags::lookup(&rest.to_ascii_lowercase().replace('_', "-"))
                    .filter(|fl| flags::env_name(fl.name) == *k && on_cmdline(values, fl.name))
            });
            if shadowed.is_some() {
                return Err(Exit::Fatal(
                    "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag))".into(),
                    vec![("environment-variable", k.clone())],
                ));
            }
            if k.starts_with("ETCD_") {
                let known = k.strip_prefix("ETCD_").is_some_and(|rest| {
                    flags::lookup(&rest.to_ascii_lowercase().replace('_', "-")).is_some()
                });
                if !known {
                    notices.push(Notice {
                        warn: true,
                        msg: "unrecognized environment variable".into(),
                        fields: vec![("environment-variable", format!("{k}={v}"))],
                    });
                }
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One warning per flag that was set and has no effect in retcd (or
    /// was deprecated by etcd 3.5); refusals for what retcd cannot do; the
    /// 3.6 rename conflicts.
    fn flag_notices(
        values: &Values,
        gates: &BTreeMap<&'static str, bool>,
    ) -> Result<Vec<Notice>, Exit> {
        let mut out = Vec::new();
        for (old, new) in flags::RENAMES {
            if values.is_set(old) && values.is_set(new) {
                return Err(Exit::Verify(format!(
                    "cannot set --{old} and --{new} at the same time, please use --{new} only"
                )));
            }
        }
        if values.duration("experimental-warning-unary-request-duration") > Duration::ZERO
            && values.duration("warning-unary-request-duration") > Duration::ZERO
        {
            return Err(Exit::Verify("both --experimental-warning-unary-request-duration and --warning-unary-request-duration flags are set. Use only --warning-unary-request-duration".into()));
        }
        for (name, (value, _)) in &values.set {
            let Some(fl) = flags::lookup(name) else {
                continue;
            };
            match fl.effect {
                flags::Effect::Works | flags::Effect::Legacy => {}
                flags::Effect::Refused(why) => {
                    if !value.is_empty() {
                        return Err(Exit::Verify(format!("--{name} is not supported: {why}")));
                    }
                }
                flags::Effect::NoEffect(why) => {
                    if value != fl.default {
                        out.push(Notice {
                            warn: true,
                            msg: format!("--{name} has no effect in retcd: {why}"),
                            fields: vec![("value", value.clone())],
                        });
                    }
                }
                flags::Effect::Deprecated35 => {
                    out.push(Notice {
                        warn: true,
                        msg: format!(
                            "--{name} is deprecated in 3.5 and will be decommissioned in 3.6. ({})",
                            flags::NO_V2
                        ),
                        fields: vec![],
                    });
                }
            }
        }
        if values.is_set("feature-gates") {
            out.push(Notice {
                warn: false,
                msg: "feature gates".into(),
                fields: vec![(
                    "feature-gates",
                    gates
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                )],
            });
        }
        Ok(out)
    }

    /// The configuration the values describe (defaults for the rest).
    pub fn from_values(v: &Values) -> Result<Config, Exit> {
        let gates = resolve_gates(v).map_err(Exit::Verify)?;
        let or = |d: Duration, dflt: Duration| if d.is_zero() { dflt } else { d };
        let renamed_dur = |old: &'static str| v.duration(v.renamed(old));
        // etcd checks no value: "extensive" adds the gRPC histograms,
        // anything else is basic (v3rpc/grpc.go `Metrics == "extensive"`).
        let metrics = match v.str("metrics").as_str() {
            "extensive" => "extensive".to_string(),
            _ => "basic".to_string(),
        };
        let emulated = v.str("emulated-etcd-version");
        let etcd_version = if emulated.is_empty() {
            ETCD_API_VERSION.to_string()
        } else {
            check_version(&emulated).map_err(Exit::Verify)?;
            emulated
        };
        Ok(Config {
            name: v.str("name"),
            data_dir: opt_path(v, "data-dir"),
            wal_dir: opt_path(v, "wal-dir"),
            listen_client_urls: v.str("listen-client-urls"),
            listen_client_http_urls: v.str("listen-client-http-urls"),
            advertise_client_urls: v.str("advertise-client-urls"),
            listen_peer_urls: v.str("listen-peer-urls"),
            listen_metrics_urls: v.str("listen-metrics-urls"),
            initial_advertise_peer_urls: v.str("initial-advertise-peer-urls"),
            // Given (even empty) or not: etcd's default derives from the
            // name only when it was not given.
            initial_cluster: v
                .is_set("initial-cluster")
                .then(|| v.str("initial-cluster")),
            initial_cluster_token: v.str("initial-cluster-token"),
            initial_cluster_state: v.str("initial-cluster-state"),
            snapshot_count: v.u64("snapshot-count"),
            experimental_snapshot_catchup_entries: v
                .u64(v.renamed("experimental-snapshot-catchup-entries")),
            heartbeat_interval: v.u64("heartbeat-interval"),
            election_timeout: v.u64("election-timeout"),
            initial_election_tick_advance: v.bool("initial-election-tick-advance"),
            quota_backend_bytes: v.i64("quota-backend-bytes"),
            max_request_bytes: v.u64("max-request-bytes"),
            max_range_response_bytes: v.u64("max-range-response-bytes"),
            max_txn_ops: v.u64("max-txn-ops"),
            max_snapshots: v.u64("max-snapshots"),
            max_wals: v.u64("max-wals"),
            backend_batch_interval: or(
                v.duration("backend-batch-interval"),
                Duration::from_millis(100),
            ),
            backend_batch_limit: match v.i64("backend-batch-limit") {
                n if n <= 0 => 10_000,
                n => n as u64,
            },
            grpc_keepalive_min_time: v.duration("grpc-keepalive-min-time"),
            grpc_keepalive_interval: v.duration("grpc-keepalive-interval"),
            grpc_keepalive_timeout: v.duration("grpc-keepalive-timeout"),
            log_level: v.str("log-level"),
            logger: v.str("logger"),
            log_outputs: v.list("log-outputs"),
            log_format: v.str("log-format"),
            strict_reconfig_check: v.bool("strict-reconfig-check"),
            max_learners: v.i64("max-learners").max(0) as usize,
            pre_vote: v.bool("pre-vote"),
            experimental_enable_lease_checkpoint: gates["LeaseCheckpoint"],
            experimental_enable_lease_checkpoint_persist: gates["LeaseCheckpointPersist"],
            experimental_lease_checkpoint_interval: or(
                v.duration("experimental-lease-checkpoint-interval"),
                Duration::from_secs(300),
            ),
            experimental_watch_progress_notify_interval: or(
                renamed_dur("experimental-watch-progress-notify-interval"),
                Duration::from_secs(600),
            ),
            auto_compaction_mode: v.str("auto-compaction-mode"),
            auto_compaction_retention: v.str("auto-compaction-retention"),
            experimental_auto_compaction_revision_interval: or(
                v.duration("experimental-auto-compaction-revision-interval"),
                Duration::from_secs(300),
            ),
            experimental_compaction_batch_limit: match v
                .i64(v.renamed("experimental-compaction-batch-limit"))
            {
                n if n <= 0 => retcd_mvcc::DEFAULT_COMPACTION_BATCH_LIMIT,
                n => n as usize,
            },
            experimental_compaction_sleep_interval: or(
                renamed_dur("experimental-compaction-sleep-interval"),
                Duration::from_millis(10),
            ),
            experimental_initial_corrupt_check: gates["InitialCorruptCheck"],
            experimental_corrupt_check_time: renamed_dur("experimental-corrupt-check-time"),
            experimental_compact_hash_check_enabled: gates["CompactHashCheck"],
            experimental_compact_hash_check_time: renamed_dur(
                "experimental-compact-hash-check-time",
            ),
            experimental_warning_apply_duration: renamed_dur("experimental-warning-apply-duration"),
            warning_unary_request_duration: or(
                or(
                    v.duration("warning-unary-request-duration"),
                    v.duration("experimental-warning-unary-request-duration"),
                ),
                Duration::from_millis(300),
            ),
            experimental_bootstrap_defrag_threshold_megabytes: v
                .u64(v.renamed("experimental-bootstrap-defrag-threshold-megabytes")),
            experimental_stop_grpc_service_on_defrag: gates["StopGRPCServiceOnDefrag"],
            force_new_cluster: v.bool("force-new-cluster"),
            unsafe_no_fsync: v.bool("unsafe-no-fsync"),
            enable_pprof: v.bool("enable-pprof"),
            metrics,
            enable_grpc_gateway: v.bool("enable-grpc-gateway"),
            cors: v.list("cors"),
            host_whitelist: v.list("host-whitelist"),
            etcd_version,
            raft_read_timeout: v.duration("raft-read-timeout").max(Duration::from_secs(5)),
            raft_write_timeout: v.duration("raft-write-timeout").max(Duration::from_secs(5)),
            auth_token: v.str("auth-token"),
            bcrypt_cost: v.u64("bcrypt-cost").min(u32::MAX as u64) as u32,
            auth_token_ttl: v.u64("auth-token-ttl"),
            cert_file: opt_path(v, "cert-file"),
            key_file: opt_path(v, "key-file"),
            client_cert_auth: v.bool("client-cert-auth"),
            trusted_ca_file: opt_path(v, "trusted-ca-file"),
            peer_cert_file: opt_path(v, "peer-cert-file"),
            peer_key_file: opt_path(v, "peer-key-file"),
            peer_client_cert_auth: v.bool("peer-client-cert-auth"),
            peer_trusted_ca_file: opt_path(v, "peer-trusted-ca-file"),
            auto_tls: v.bool("auto-tls"),
            peer_auto_tls: v.bool("peer-auto-tls"),
            self_signed_cert_validity: v.u64("self-signed-cert-validity").min(u32::MAX as u64)
                as u32,
            client_crl_file: opt_path(v, "client-crl-file"),
            peer_crl_file: opt_path(v, "peer-crl-file"),
            client_cert_file: opt_path(v, "client-cert-file"),
            client_key_file: opt_path(v, "client-key-file"),
            peer_client_cert_file: opt_path(v, "peer-client-cert-file"),
            peer_client_key_file: opt_path(v, "peer-client-key-file"),
            peer_cert_allowed_cn: v.str("peer-cert-allowed-cn"),
            peer_cert_allowed_hostname: v.str("peer-cert-allowed-hostname"),
            client_cert_allowed_hostname: v.str("client-cert-allowed-hostname"),
            cipher_suites: v.str("cipher-suites"),
            tls_min_version: v.str("tls-min-version"),
            tls_max_version: v.str("tls-max-version"),
            experimental_peer_skip_client_san_verification: v
                .bool(v.renamed("experimental-peer-skip-client-san-verification")),
            max_concurrent_streams: v.u64("max-concurrent-streams").min(u32::MAX as u64) as u32,
            feature_gates: gates,
            config_file: None,
            notices: Vec::new(),
        })
    }
}

/// The effective gates: defaults, then the 3.5 experimental flags that
/// were set, then `--feature-gates`. A flag set explicitly together with a
/// gate string naming its gate is etcd 3.6's error.
fn resolve_gates(values: &Values) -> Result<BTreeMap<&'static str, bool>, String> {
    let spec = values.raw("feature-gates").to_string();
    let given = gates::parse(&spec)?;
    let mut out: BTreeMap<&'static str, bool> =
        gates::GATES.iter().map(|(n, d, ..)| (*n, *d)).collect();
    for (name, _, _, flag) in gates::GATES {
        if flag.is_empty() || !values.is_set(flag) {
            continue;
        }
        let v = values.bool(flag);
        if spec.contains(name) {
            return Err(format!(
                "cannot specify both flags: --{flag}={v} and --feature-gates={name}={} at the same time, please just use --feature-gates={name}={}",
                given.get(name).copied().unwrap_or(v),
                given.get(name).copied().unwrap_or(v)
            ));
        }
        out.insert(name, v);
    }
    out.extend(given);
    if out["LeaseCheckpointPersist"] && !out["LeaseCheckpoint"] {
        return Err(
            "enabling feature gate LeaseCheckpointPersist requires enabling feature gate LeaseCheckpoint"
                .to_string(),
        );
    }
    Ok(out)
}

/// `--emulated-etcd-version`: a 3.x.y release number.
fn check_version(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() == 3 && parts[0] == "3" && parts.iter().all(|p| p.parse::<u32>().is_ok()) {
        Ok(())
    } else {
        Err(format!(
            "invalid --emulated-etcd-version {s:?}: want an etcd 3 release like 3.5.13"
        ))
    }
}

/// etcd's `setupLogRotation` check of `--log-rotation-config-json`'s
/// types (lumberjack's fields; a JSON syntax error is not checked here).
fn rotation_config_error(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let obj = v.as_object()?;
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    for k in keys {
        let (field, ty) = match k.to_ascii_lowercase().as_str() {
            "filename" => ("filename", "string"),
            "maxsize" => ("maxsize", "int"),
            "maxage" => ("maxage", "int"),
            "maxbackups" => ("maxbackups", "int"),
            "localtime" => ("localtime", "bool"),
            "compress" => ("compress", "bool"),
            _ => continue,
        };
        let val = &obj[k.as_str()];
        let what = match (val, ty) {
            (serde_json::Value::Null, _) => continue,
            (serde_json::Value::String(_), "string") => continue,
            (serde_json::Value::Bool(_), "bool") => continue,
            (serde_json::Value::Number(n), "int") if n.as_i64().is_some() => continue,
            (serde_json::Value::Number(n), "int") => format!("number {n}"),
            (serde_json::Value::String(_), _) => "string".into(),
            (serde_json::Value::Number(_), _) => "number".into(),
            (serde_json::Value::Bool(_), _) => "bool".into(),
            (serde_json::Value::Array(_), _) => "array".into(),
            (serde_json::Value::Object(_), _) => "object".into(),
        };
        return Some(format!(
            "invalid log rotation config: json: cannot unmarshal {what} into Go struct field logRotationConfig.{field} of type {ty}"
        ));
    }
    None
}

/// etcd's `ErrUnsetAdvertiseClientURLsFlag`.
pub const ERR_UNSET_ADVERTISE: &str =
    "--advertise-client-urls is required when --listen-client-urls is set explicitly";

/// zap's `Level.Set`: the level names in any case; "" is info.
pub fn log_level(s: &str) -> Option<&'static str> {
    // zap 1.17's UnmarshalText tries the text, then it lower-cased.
    Some(match s.to_ascii_lowercase().as_str() {
        "debug" => "debug",
        "info" | "" => "info",
        "warn" => "warn",
        "error" => "error",
        "dpanic" => "dpanic",
        "panic" => "panic",
        "fatal" => "fatal",
        _ => return None,
    })
}

/// The host of a URL checked by `flags::check_url` (`[v6]` without its
/// brackets).
fn url_host(u: &str) -> String {
    let rest = u.split_once("://").map_or(u, |(_, r)| r);
    let hp = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hp = hp.rsplit('@').next().unwrap_or("");
    flags::split_host_port(hp)
        .map(|(h, _)| h.to_string())
        .unwrap_or_default()
}

/// etcd's `checkBindURLs` for one URL: an IP address or `localhost`
/// (unix sockets pass).
fn check_bind_url(u: &str) -> Result<(), String> {
    if u.starts_with("unix://") || u.starts_with("unixs://") {
        return Ok(());
    }
    let host = url_host(u);
    if host == "localhost" || host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    Err(format!("expected IP in URL for binding ({u})"))
}

/// Go's text for the common open errors.
fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Go's `time.ParseDuration` ("1h30m", "100ms", "0"); negative values
/// count as zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    retcd_gostd::time::parse_duration(s.trim()).map(|ns| Duration::from_nanos(ns.max(0) as u64))
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
            flags::check_url(url)?;
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
                "couldn't find local name {} in the initial cluster configuration",
                retcd_gostd::strconv::quote(&self.name)
            ));
        }
        Ok(members)
    }

    /// The checks a run makes before it binds anything: etcd's
    /// `Validate` (see [`Config::load`]; repeated here for configurations
    /// built another way) and retcd's own flags. The bootstrap checks
    /// ([`Config::verify_bootstrap`]) come after the listeners are bound,
    /// as in etcd.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat_interval == 0 {
            return Err(format!(
                "--heartbeat-interval must be >0 (set to {}ms)",
                self.heartbeat_interval
            ));
        }
        if self.election_timeout == 0 {
            return Err("--election-timeout must be >0 (set to 0ms)".into());
        }
        if self.election_timeout < 5 * self.heartbeat_interval {
            return Err(format!(
                "--election-timeout[{}ms] should be at least as 5 times as --heartbeat-interval[{}ms]",
                self.election_timeout, self.heartbeat_interval
            ));
        }
        if self.election_timeout > 50_000 {
            return Err(format!(
                "--election-timeout[{}ms] is too long, and should be set less than 50000ms",
                self.election_timeout
            ));
        }
        match self.auto_compaction_mode.as_str() {
            // "": etcd fails later, and only with a retention (compactor).
            "" | "periodic" | "revision" => {}
            m => return Err(format!("unknown auto-compaction-mode {m:?}")),
        }
        if self.experimental_compact_hash_check_enabled
            && self.experimental_compact_hash_check_time.is_zero()
        {
            return Err(format!(
                "--experimental-compact-hash-check-time must be >0 (set to {:?})",
                self.experimental_compact_hash_check_time
            ));
        }
        if self.logger != "zap" {
            return Err(format!("unknown logger option {:?}", self.logger));
        }
        if log_level(&self.log_level).is_none() {
            return Err(format!("unrecognized level: {:?}", self.log_level));
        }
        if !matches!(self.log_format.as_str(), "json" | "console") {
            return Err(format!(
                "unknown log format: {}, supported values json, console",
                self.log_format
            ));
        }
        Ok(())
    }

    /// etcd's checks of `--initial-cluster` when a member starts on an
    /// empty data dir (`PeerURLsMapAndToken`, then `VerifyBootstrap` or
    /// `VerifyJoinExisting`), with their texts.
    pub fn verify_bootstrap(&self) -> Result<(), String> {
        // etcd's default is "default=http://localhost:2380", made
        // `<name>=<advertised peer URLs>` for a member not named default
        // (UpdateDefaultClusterFromName).
        const DEFAULT: &str = "default=http://localhost:2380";
        let from_name = || {
            split_urls(&self.initial_advertise_peer_urls)
                .iter()
                .map(|u| format!("{}={u}", self.name))
                .collect::<Vec<_>>()
                .join(",")
        };
        let spec = match self.initial_cluster.as_deref() {
            None | Some(DEFAULT) if self.name != "default" => from_name(),
            None => DEFAULT.to_string(),
            Some(s) => s.to_string(),
        };
        // types.NewURLsMap: name=url pairs (a pair without '=' is a name
        // with an empty URL), each URL checked, each name's URLs sorted.
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for part in spec.split(',').filter(|p| !p.is_empty()) {
            let (name, url) = part.split_once('=').unwrap_or((part, ""));
            map.entry(name.to_string())
                .or_default()
                .push(url.trim().to_string());
        }
        for urls in map.values_mut() {
            for u in urls.iter() {
                if u.is_empty() {
                    return Err("error setting up initial cluster: URL scheme must be http, https, unix, or unixs: ".into());
                }
                flags::check_url(u)
                    .map_err(|e| format!("error setting up initial cluster: {e}"))?;
            }
            urls.sort();
        }
        let Some(urls) = map.get(&self.name) else {
            return Err(format!(
                "couldn't find local name {} in the initial cluster configuration",
                retcd_gostd::strconv::quote(&self.name)
            ));
        };
        if self.initial_cluster_state == "new" {
            // advertiseMatchesCluster (netutil.URLStringsEqual; IPs and
            // localhost are not resolved)
            let mut ap = split_urls(&self.initial_advertise_peer_urls);
            ap.sort();
            ap.dedup();
            advertise_matches_cluster(&self.name, urls, &ap)?;
        }
        let mut all: Vec<&String> = map.values().flatten().collect();
        let n = all.len();
        all.sort();
        all.dedup();
        if all.len() != n {
            return Err(format!(
                "initial cluster {} has duplicate url",
                urls_map_string(&map)
            ));
        }
        Ok(())
    }
}

/// `types.URLsMap.String()`: sorted `name=url` pairs.
pub fn urls_map_string(m: &BTreeMap<String, Vec<String>>) -> String {
    let mut pairs: Vec<String> = m
        .iter()
        .flat_map(|(n, us)| us.iter().map(move |u| format!("{n}={u}")))
        .collect();
    pairs.sort();
    pairs.join(",")
}

/// etcd's `ServerConfig.advertiseMatchesCluster`, its texts included, for
/// the member `name` whose `--initial-cluster` URLs are `cluster` (sorted)
/// and whose `--initial-advertise-peer-urls` are `peers` (sorted, each
/// once): they match when [`urls_equal`] (hosts resolved), and the texts
/// of a mismatch compare them as written. The server's start and
/// retcdutl's restore both check it. May wait on name resolution (up to
/// 30 s): not on a runtime worker.
pub fn advertise_matches_cluster(
    name: &str,
    cluster: &[String],
    peers: &[String],
) -> Result<(), String> {
    let why = match urls_equal(peers, cluster) {
        Ok(()) => return Ok(()),
        Err(why) => why,
    };
    let ap = peers.join(",");
    // etcd collects the URLs in maps: each is named once
    let mut missing: Vec<String> = cluster
        .iter()
        .filter(|u| !peers.contains(u))
        .map(|u| format!("{name}={u}"))
        .collect();
    missing.dedup();
    if !missing.is_empty() {
        return Err(format!(
            "--initial-cluster has {} but missing from --initial-advertise-peer-urls={ap} ({why})",
            missing.join(",")
        ));
    }
    let own = urls_map_string(&BTreeMap::from([(name.to_string(), peers.to_vec())]));
    let mut extra: Vec<&str> = peers
        .iter()
        .filter(|u| !cluster.contains(u))
        .map(String::as_str)
        .collect();
    extra.dedup();
    if !extra.is_empty() {
        return Err(format!(
            "--initial-advertise-peer-urls has {} but missing from --initial-cluster={own}",
            extra.join(",")
        ));
    }
    Err(format!(
        "failed to resolve {ap} to match --initial-cluster={own} ({why})"
    ))
}

fn quoted_list(v: &[String]) -> String {
    let q: Vec<String> = v.iter().map(|u| retcd_gostd::strconv::quote(u)).collect();
    format!("[{}]", q.join(" "))
}

/// etcd's `netutil.URLStringsEqual` of two URL lists: equal once every
/// host that is neither an IP nor `localhost` is resolved (its first
/// address, as Go's resolver gives it) and each list is sorted. A name
/// that does not resolve is tried again every second, for 30 s in all, as
/// etcd does (a peer's DNS name may not exist yet while its cluster comes
/// up). `Err` says why not, in etcd's words.
pub fn urls_equal(a: &[String], b: &[String]) -> Result<(), String> {
    urls_equal_until(a, b, std::time::Instant::now() + Duration::from_secs(30))
}

/// [`urls_equal`], resolving names until `deadline` (etcd gives a whole
/// check one 30 s context).
pub fn urls_equal_until(
    a: &[String],
    b: &[String],
    deadline: std::time::Instant,
) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!(
            "len({}) != len({})",
            quoted_list(a),
            quoted_list(b)
        ));
    }
    let resolve_all = |v: &[String]| -> Result<Vec<String>, String> {
        v.iter().map(|u| resolve_url(u, deadline)).collect()
    };
    let (mut ra, mut rb) = (resolve_all(a)?, resolve_all(b)?);
    ra.sort();
    rb.sort();
    // As etcd: the i-th of each list resolved and sorted, beside the i-th
    // as given.
    match ra.iter().zip(&rb).position(|(x, y)| x != y) {
        None => Ok(()),
        Some(i) => {
            use retcd_gostd::strconv::quote;
            Err(format!(
                "{}(resolved from {}) != {}(resolved from {})",
                quote(&ra[i]),
                quote(&a[i]),
                quote(&rb[i]),
                quote(&b[i])
            ))
        }
    }
}

/// etcd's `netutil.resolveURL`: `u` with its host resolved to `ip:port`,
/// or as it is for a unix socket, an IP or `localhost`.
fn resolve_url(u: &str, deadline: std::time::Instant) -> Result<String, String> {
    let failed = |e: String| format!("failed to resolve {} ({e})", retcd_gostd::strconv::quote(u));
    let Some((scheme, rest)) = u.split_once("://") else {
        return Ok(u.to_string());
    };
    if scheme == "unix" || scheme == "unixs" {
        return Ok(u.to_string());
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (user, host_port) = match rest[..end].rsplit_once('@') {
        Some((user, hp)) => (&rest[..=user.len()], hp),
        None => ("", &rest[..end]),
    };
    let (host, port) = flags::split_host_port(host_port).ok_or_else(|| {
        let why = match host_port.contains(':') {
            true => "too many colons in address",
            false => "missing port in address",
        };
        failed(format!("address {host_port}: {why}"))
    })?;
    if host == "localhost" || host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(u.to_string());
    }
    loop {
        match lookup_host(host, port) {
            Ok(addr) => {
                tracing::info!(url = u, host = host_port, resolved_addr = %addr, "resolved URL Host");
                return Ok(format!("{scheme}://{user}{addr}{}", &rest[end..]));
            }
            Err(e) if std::time::Instant::now() + Duration::from_secs(1) < deadline => {
                tracing::warn!(url = u, host = host_port, retry_interval = "1s", error = %e, "failed to resolve URL Host");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(failed(e)),
        }
    }
}

/// The first address `host` resolves to (the system's resolver: files,
/// then DNS), as Go's `TCPAddr.String()`.
fn lookup_host(host: &str, port: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("lookup tcp/{port}: unknown port"))?;
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("lookup {host}: no such host")),
        Err(e)
            if e.to_string().contains("Name or service not known")
                || e.to_string().contains("No address associated") =>
        {
            Err(format!("lookup {host}: no such host"))
        }
        Err(e) => Err(format!("lookup {host}: {e}")),
    }
}

pub fn split_urls(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

/// `http://host:port[/]` → `host:port`, resolving `localhost` to 127.0.0.1
/// for listening (etcd listens on what the name resolves to).
pub fn url_host_port(u: &str) -> Result<String, String> {
    if u.starts_with("unix://") || u.starts_with("unixs://") {
        return Err(format!(
            "{u}: unix sockets are supported for client URLs (unix://) only"
        ));
    }
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
    fn urls_equal_as_etcd_netutil() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(urls_equal(&v(&["http://127.0.0.1:1"]), &v(&["http://127.0.0.1:1"])).is_ok());
        assert_eq!(
            urls_equal(&v(&["http://127.0.0.1:1"]), &v(&[])).unwrap_err(),
            r#"len(["http://127.0.0.1:1"]) != len([])"#
        );
        assert_eq!(
            urls_equal(&v(&["http://localhost:1"]), &v(&["http://127.0.0.1:1"])).unwrap_err(),
            r#""http://localhost:1"(resolved from "http://localhost:1") != "http://127.0.0.1:1"(resolved from "http://127.0.0.1:1")"#
        );
        let far = std::time::Instant::now();
        for same in ["unix://x", "http://u@localhost:1/p", "https://[::1]:2"] {
            assert_eq!(resolve_url(same, far).as_deref(), Ok(same));
        }
        assert_eq!(
            resolve_url("http://a:b:c", far).unwrap_err(),
            r#"failed to resolve "http://a:b:c" (address a:b:c: too many colons in address)"#
        );
        assert_eq!(
            resolve_url("http://vm", far).unwrap_err(),
            r#"failed to resolve "http://vm" (address vm: missing port in address)"#
        );
    }

    #[test]
    fn test_defaults_match_etcd() {
        let c = Config::from_args::<&str>(&[]).unwrap();
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
        let c = Config::from_args(&["--name", "a", "--initial-cluster", "b=http://127.0.0.1:1"])
            .unwrap();
        assert!(c.initial_members().is_err());
        let c = Config::from_args(&[
            "--name",
            "a",
            "--initial-cluster",
            "a=http://127.0.0.1:1,b=http://127.0.0.1:2,a=http://127.0.0.1:3",
        ])
        .unwrap();
        let m = c.initial_members().unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].peer_urls.len(), 2);
    }
}
