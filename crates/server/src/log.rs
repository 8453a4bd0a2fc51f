//! Logging in etcd's zap shape, so tools that read etcd's logs read
//! retcd's: one JSON object per line with `level`, `ts` (ISO 8601, µs),
//! `logger` (raft lines), `caller`, `msg`, then the event's fields; or
//! zap's console format with `--log-format console`. Outputs follow
//! `--log-outputs` (`default`/`stderr`, `stdout`, file paths). raft-rs's
//! slog records are forwarded here as `"logger":"raft"` lines.

use crate::config::{Config, Notice};
use slog::{Drain, Level, OwnedKVList, Record};
use std::fmt::Write as _;
use std::io::Write;
use std::sync::Mutex;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// A field carrying ready-made JSON members (`"k":"v",...`), used to log
/// fields whose names are only known at run time.
const RAW_FIELDS: &str = "zap_fields";

enum Output {
    Stderr,
    Stdout,
    File(std::fs::File),
}

struct ZapLayer {
    console: bool,
    /// The outputs; the lock keeps one line whole across them.
    outputs: Mutex<Vec<Output>>,
}

/// Sets up the process logger from `--log-level`, `--log-outputs` and
/// `--log-format` (`RUST_LOG` overrides the level filter).
pub fn init(cfg: &Config) -> Result<(), String> {
    let mut outputs = Vec::new();
    for o in &cfg.log_outputs {
        match o.as_str() {
            "default" | "stderr" => outputs.push(Output::Stderr),
            "stdout" => outputs.push(Output::Stdout),
            path => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("cannot open log output {path:?}: {e}"))?;
                outputs.push(Output::File(f));
            }
        }
    }
    if outputs.is_empty() {
        outputs.push(Output::Stderr);
    }
    let level = match crate::config::log_level(&cfg.log_level).unwrap_or("info") {
        "dpanic" | "panic" | "fatal" => "error",
        l => l,
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let layer = ZapLayer {
        console: cfg.log_format == "console",
        outputs: Mutex::new(outputs),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
    Ok(())
}

/// Logs a line gathered while reading the configuration.
pub fn notice(n: &Notice) {
    let mut raw = String::new();
    for (k, v) in &n.fields {
        push_member(&mut raw, k, &serde_json::Value::String(v.clone()));
    }
    if n.warn {
        tracing::warn!(zap_fields = raw.as_str(), "{}", n.msg);
    } else {
        tracing::info!(zap_fields = raw.as_str(), "{}", n.msg);
    }
}

/// A line written before the logger exists (configuration errors).
pub fn early(level: &str, msg: &str, fields: &[(&'static str, String)]) {
    let mut line = format!(
        "{{\"level\":\"{level}\",\"ts\":\"{}\",\"caller\":\"retcd/main.rs\",\"msg\":{}",
        timestamp(),
        serde_json::Value::String(msg.to_string())
    );
    for (k, v) in fields {
        line.push(',');
        push_member(&mut line, k, &serde_json::Value::String(v.clone()));
    }
    line.push_str("}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

fn push_member(out: &mut String, k: &str, v: &serde_json::Value) {
    if !out.is_empty() && !out.ends_with(',') && !out.ends_with('{') {
        out.push(',');
    }
    let _ = write!(out, "{}:{}", serde_json::Value::String(k.to_string()), v);
}

/// A duration as Go's `time.Duration.String` prints it (`1h30m0s`,
/// `1m0s`, `100ms`, `190.678µs`, `0s`): log fields use it where etcd logs
/// a duration.
pub struct GoDuration(pub std::time::Duration);

impl std::fmt::Display for GoDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = i64::try_from(self.0.as_nanos()).unwrap_or(i64::MAX);
        f.write_str(&retcd_gostd::time::format_duration(ns))
    }
}

/// zap's ISO 8601 time with microseconds, UTC.
fn timestamp() -> String {
    let now = time::OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.microsecond()
    )
}

#[derive(Default)]
struct Fields {
    msg: String,
    members: String,
    console: Vec<(String, serde_json::Value)>,
}

impl Fields {
    fn add(&mut self, name: &str, v: serde_json::Value) {
        if name == "message" {
            self.msg = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
        } else if name == RAW_FIELDS {
            if let serde_json::Value::String(s) = v {
                if !s.is_empty() {
                    if !self.members.is_empty() {
                        self.members.push(',');
                    }
                    self.members.push_str(&s);
                    if let Ok(serde_json::Value::Object(m)) =
                        serde_json::from_str::<serde_json::Value>(&format!("{{{s}}}"))
                    {
                        self.console.extend(m);
                    }
                }
            }
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name).replace('_', "-");
            push_member(&mut self.members, &name, &v);
            self.console.push((name, v));
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.add(
            field.name(),
            serde_json::Value::String(format!("{value:?}")),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.add(field.name(), serde_json::Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.add(field.name(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.add(field.name(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.add(field.name(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.add(field.name(), value.into());
    }
}

/// `crates/server/src/api/http.rs` → `api/http.rs`.
fn caller(file: Option<&str>, line: Option<u32>) -> String {
    let f = file.unwrap_or("?");
    let short = f.rsplit_once("/src/").map(|(_, r)| r).unwrap_or(f);
    format!("{short}:{}", line.unwrap_or(0))
}

impl<S: Subscriber> Layer<S> for ZapLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let level = match *meta.level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warn",
            tracing::Level::INFO => "info",
            _ => "debug",
        };
        let mut fields = Fields::default();
        event.record(&mut fields);
        let raft = meta.target() == "raft";
        let caller = caller(meta.file(), meta.line());
        let line = if self.console {
            let mut l = format!("{}\t{level}\t", timestamp());
            if raft {
                l.push_str("raft\t");
            }
            let _ = write!(l, "{caller}\t{}", fields.msg);
            if !fields.console.is_empty() {
                let m: serde_json::Map<String, serde_json::Value> =
                    fields.console.into_iter().collect();
                let _ = write!(l, "\t{}", serde_json::Value::Object(m));
            }
            l.push('\n');
            l
        } else {
            let mut l = format!("{{\"level\":\"{level}\",\"ts\":\"{}\"", timestamp());
            if raft {
                l.push_str(",\"logger\":\"raft\"");
            }
            let _ = write!(
                l,
                ",\"caller\":{},\"msg\":{}",
                serde_json::Value::String(caller),
                serde_json::Value::String(fields.msg)
            );
            if !fields.members.is_empty() {
                l.push(',');
                l.push_str(&fields.members);
            }
            l.push_str("}\n");
            l
        };
        let mut outs = self.outputs.lock().unwrap_or_else(|p| p.into_inner());
        for o in outs.iter_mut() {
            let _ = match o {
                Output::Stderr => std::io::stderr().write_all(line.as_bytes()),
                Output::Stdout => std::io::stdout().write_all(line.as_bytes()),
                Output::File(f) => f.write_all(line.as_bytes()),
            };
        }
    }
}

struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, r: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut kv = KvJson::default();
        let _ = slog::KV::serialize(&r.kv(), r, &mut kv);
        let _ = slog::KV::serialize(values, r, &mut kv);
        // etcd's raft lines start with the member id in hex.
        let msg = match kv.raft_id {
            Some(id) => format!("{id:x} {}", r.msg()),
            None => r.msg().to_string(),
        };
        let raw = kv.members.as_str();
        match r.level() {
            Level::Critical | Level::Error => {
                tracing::error!(target: "raft", zap_fields = raw, "{msg}")
            }
            Level::Warning => tracing::warn!(target: "raft", zap_fields = raw, "{msg}"),
            Level::Info => tracing::info!(target: "raft", zap_fields = raw, "{msg}"),
            Level::Debug => tracing::debug!(target: "raft", zap_fields = raw, "{msg}"),
            Level::Trace => tracing::trace!(target: "raft", zap_fields = raw, "{msg}"),
        }
        Ok(())
    }
}

#[derive(Default)]
struct KvJson {
    members: String,
    raft_id: Option<u64>,
}

impl slog::Serializer for KvJson {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        let v = val.to_string();
        if key == "raft_id" {
            if self.raft_id.is_none() {
                self.raft_id = v.parse().ok();
            }
            return Ok(());
        }
        if !self.members.contains(&format!("\"{key}\":")) {
            push_member(&mut self.members, key, &serde_json::Value::String(v));
        }
        Ok(())
    }
}

pub fn raft_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_timestamp_shape() {
        let ts = timestamp();
        assert_eq!(ts.len(), "2026-12-01T09:49:40.631234Z".len(), "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T');
    }

    #[test]
    fn test_go_duration() {
        use std::time::Duration as D;
        let g = |d| GoDuration(d).to_string();
        assert_eq!(g(D::ZERO), "0s");
        assert_eq!(g(D::from_secs(5400)), "1h30m0s");
        assert_eq!(g(D::from_secs(60)), "1m0s");
        assert_eq!(g(D::from_millis(100)), "100ms");
        assert_eq!(g(D::from_millis(1500)), "1.5s");
        assert_eq!(g(D::from_nanos(190_678)), "190.678\u{b5}s");
        assert_eq!(g(D::from_nanos(42)), "42ns");
    }

    #[test]
    fn test_caller_is_short() {
        assert_eq!(
            caller(Some("crates/server/src/api/http.rs"), Some(7)),
            "api/http.rs:7"
        );
    }
}
