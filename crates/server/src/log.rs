//! Logging: tracing for retcd, and a slog drain that forwards raft-rs's
//! logs into tracing.

use slog::{Drain, Level, OwnedKVList, Record};

pub fn init(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .try_init();
}

struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, r: &Record<'_>, _values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut kv = KvFmt(String::new());
        let _ = slog::KV::serialize(&r.kv(), r, &mut kv);
        match r.level() {
            Level::Critical | Level::Error => {
                tracing::error!(target: "raft", "{}{}", r.msg(), kv.0)
            }
            Level::Warning => tracing::warn!(target: "raft", "{}{}", r.msg(), kv.0),
            Level::Info => tracing::info!(target: "raft", "{}{}", r.msg(), kv.0),
            Level::Debug => tracing::debug!(target: "raft", "{}{}", r.msg(), kv.0),
            Level::Trace => tracing::trace!(target: "raft", "{}{}", r.msg(), kv.0),
        }
        Ok(())
    }
}

struct KvFmt(String);

impl slog::Serializer for KvFmt {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        use std::fmt::Write;
        let _ = write!(self.0, ", {key}: {val}");
        Ok(())
    }
}

pub fn raft_logger() -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!())
}
