//! Auto-compaction (etcd's `etcdserver/api/v3compactor`), on the leader
//! only (a follower's compactor is paused, as etcd pauses it).
//!
//! * `--auto-compaction-mode periodic --auto-compaction-retention P`
//!   (a duration, or a bare number of hours): every `min(P, 1h) / 10` the
//!   current revision is recorded, keeping the last `P / that + 1`; once P
//!   has passed since the start (then every `min(P, 1h)`) the leader
//!   compacts at the oldest recorded revision — the revision of about P ago.
//!   Example: P = 10m: revisions are sampled every minute; at 10m the store
//!   is compacted at the revision of minute 0, at 20m at that of minute 10.
//! * `--auto-compaction-mode revision --auto-compaction-retention N`: every
//!   5 minutes, compact at `current revision - N` if positive and new.
//!
//! A compaction that fails with "required revision has been compacted"
//! counts as done (someone compacted further already).

use super::EtcdServer;
use crate::error::ServerError;
use retcd_api::etcdserverpb::CompactionRequest;
use retcd_mvcc::MvccError;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

/// A parsed `--auto-compaction-*` pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoCompaction {
    Periodic(Duration),
    Revision(i64),
}

/// Parses the mode and retention as etcd 3.5 does
/// (`parseCompactionRetention`, then `v3compactor.New`): a whole number
/// ≥ 0 is hours (periodic) or revisions (revision), anything else a Go
/// duration (in revision mode too: its nanoseconds count as revisions);
/// an empty retention is "0". Ok(None) when disabled (retention 0).
pub fn parse(mode: &str, retention: &str) -> Result<Option<AutoCompaction>, String> {
    let retention = if retention.is_empty() { "0" } else { retention };
    let ret: i128 = match retcd_gostd::strconv::atoi(retention) {
        Ok(h) if h >= 0 => match mode {
            "revision" => h as i128,
            _ => h as i128 * HOUR.as_nanos() as i128,
        },
        _ => retcd_gostd::time::parse_duration(retention)
            .map_err(|e| format!("error parsing CompactionRetention: {e}"))? as i128,
    };
    if ret == 0 {
        return Ok(None);
    }
    match mode {
        "periodic" => {
            Ok((ret > 0).then(|| AutoCompaction::Periodic(Duration::from_nanos(ret as u64))))
        }
        "revision" => {
            Ok((ret > 0).then_some(AutoCompaction::Revision(ret.min(i64::MAX as i128) as i64)))
        }
        other => Err(format!("unsupported compaction mode {other}")),
    }
}

async fn compact(server: &EtcdServer, rev: i64) -> Result<(), ServerError> {
    let req = CompactionRequest {
        revision: rev,
        physical: false,
    };
    // the server itself, as root (etcd's compactor runs WithRoot)
    let root = crate::auth::Credentials::server_itself();
    match server.compact(req, &root).await {
        Err(ServerError::Mvcc(MvccError::Compacted)) => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

fn is_leader(server: &EtcdServer) -> bool {
    server.proposer.status().is_leader()
}

/// Starts the compactor configured by the flags (nothing when disabled).
pub(super) fn start(server: &Arc<EtcdServer>) -> anyhow::Result<()> {
    let cfg = &server.cfg;
    let Some(mode) = parse(&cfg.auto_compaction_mode, &cfg.auto_compaction_retention)
        .map_err(anyhow::Error::msg)?
    else {
        return Ok(());
    };
    tracing::info!(?mode, "auto-compaction enabled");
    let server = server.clone();
    match mode {
        AutoCompaction::Periodic(p) => tokio::spawn(run_periodic(server, p)),
        AutoCompaction::Revision(n) => {
            let every = server.cfg.experimental_auto_compaction_revision_interval;
            tokio::spawn(run_revision(server, n, every))
        }
    };
    Ok(())
}

async fn run_periodic(server: Arc<EtcdServer>, period: Duration) {
    let compact_interval = period.min(HOUR);
    let retry = compact_interval / 10;
    let retentions = (period.as_nanos() / retry.as_nanos().max(1)) as usize + 1;
    let mut revs: VecDeque<i64> = VecDeque::new();
    let mut last_success = Instant::now();
    let mut base = period;
    loop {
        revs.push_back(server.current_revision());
        if revs.len() > retentions {
            // revs[0] is always the revision of `period` ago
            revs.pop_front();
        }
        tokio::time::sleep(retry).await;
        if !is_leader(&server) || last_success.elapsed() < base {
            continue;
        }
        if base == period {
            base = compact_interval;
        }
        let rev = revs[0];
        tracing::info!(revision = rev, retention = ?period, "starting auto periodic compaction");
        match compact(&server, rev).await {
            Ok(()) => {
                tracing::info!(revision = rev, "completed auto periodic compaction");
                last_success = Instant::now();
            }
            Err(e) => tracing::warn!(revision = rev, error = %e, "failed auto periodic compaction"),
        }
    }
}

async fn run_revision(server: Arc<EtcdServer>, retention: i64, every: Duration) {
    let mut prev = 0;
    loop {
        tokio::time::sleep(every).await;
        if !is_leader(&server) {
            continue;
        }
        let rev = server.current_revision() - retention;
        if rev <= 0 || rev == prev {
            continue;
        }
        tracing::info!(
            revision = rev,
            retention,
            "starting auto revision compaction"
        );
        match compact(&server, rev).await {
            Ok(()) => {
                prev = rev;
                tracing::info!(revision = rev, "completed auto revision compaction");
            }
            Err(e) => tracing::warn!(revision = rev, error = %e, "failed auto revision compaction"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_retention_as_etcd() {
        assert_eq!(
            parse("periodic", "1").unwrap(),
            Some(AutoCompaction::Periodic(HOUR))
        );
        assert_eq!(
            parse("periodic", "30m").unwrap(),
            Some(AutoCompaction::Periodic(Duration::from_secs(1800)))
        );
        assert_eq!(parse("periodic", "0").unwrap(), None);
        assert_eq!(
            parse("revision", "1000").unwrap(),
            Some(AutoCompaction::Revision(1000))
        );
        // etcd 3.5: a duration in revision mode counts its nanoseconds.
        assert_eq!(
            parse("revision", "1h").unwrap(),
            Some(AutoCompaction::Revision(3_600_000_000_000))
        );
        assert_eq!(
            parse("revision", "1.5").unwrap_err(),
            "error parsing CompactionRetention: time: missing unit in duration \"1.5\""
        );
        assert_eq!(
            parse("periodic", "abc").unwrap_err(),
            "error parsing CompactionRetention: time: invalid duration \"abc\""
        );
        assert_eq!(parse("periodic", "").unwrap(), None);
        assert!(parse("weekly", "1").is_err());
    }
}
