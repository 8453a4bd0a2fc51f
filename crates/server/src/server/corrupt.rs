//! Corruption checks (etcd's `etcdserver/corrupt.go`): members compare
//! HashKV at the same revision; equal compaction revisions with different
//! hashes mean a member's key space diverged.
//!
//! * `--experimental-initial-corrupt-check`: right after start, the member
//!   asks every peer for HashKV at its own current revision; a mismatch
//!   stops the process ("found data inconsistency with peers"), as etcd
//!   refuses to start. Peers that cannot answer (down, compacted past the
//!   revision, behind it) are skipped with a warning.
//! * `--experimental-corrupt-check-time D` (> 0): every D the leader
//!   compares its HashKV with every member's at the leader's revision and
//!   raises the CORRUPT alarm (through raft) for each member that differs.
//!   Once CORRUPT is raised every member refuses changes
//!   ("etcdserver: corrupt cluster").
//!
//! Peers' hashes come over the peer port (`RaftPeer/HashKV`, etcd's
//! `/members/hashkv`), with this cluster's id: the client port's HashKV
//! needs the root role.

use super::EtcdServer;
use crate::error::fatal;
use crate::ids::Hex;
use crate::raft::transport::with_cluster_id;
use crate::tls::Dialer;
use retcd_api::etcdserverpb::{
    alarm_request::AlarmAction, AlarmRequest, AlarmType, HashKvRequest, HashKvResponse,
};
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use std::sync::Arc;
use std::time::Duration;

/// HashKV of one peer at `rev`, over its peer URLs (first that answers).
async fn peer_hash(
    dialer: &Dialer,
    cluster_id: u64,
    urls: &[String],
    rev: i64,
) -> Result<HashKvResponse, String> {
    let mut last = String::from("no peer URL known");
    for url in urls {
        let dial = match dialer.peer(url) {
            Ok(d) => d.configure(|ep| {
                ep.connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(10))
            }),
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        match dial.connect().await {
            Ok(ch) => {
                let req = with_cluster_id(HashKvRequest { revision: rev }, cluster_id);
                match RaftPeerClient::new(ch).hash_kv(req).await {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s) => last = s.message().to_string(),
                }
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// (member id, its HashKV at `rev` or why not) for every other member.
async fn peer_hashes(server: &EtcdServer, rev: i64) -> Vec<(u64, Result<HashKvResponse, String>)> {
    let peers: Vec<_> = server
        .members()
        .into_iter()
        .filter(|m| m.id != server.member_id)
        .map(|m| (m.id, m.peer_urls))
        .collect();
    let mut out = Vec::new();
    for (id, urls) in peers {
        let hash = peer_hash(&server.dialer, server.cluster_id, &urls, rev).await;
        out.push((id, hash));
    }
    out
}

/// The peers whose HashKV at `rev` differs from ours (`hash`, computed
/// at `rev` with compaction revision `compact_rev`); peers that compacted
/// elsewhere or do not answer are skipped.
async fn differing_peers(server: &EtcdServer, rev: i64, hash: u32, compact_rev: i64) -> Vec<u64> {
    let mut bad = Vec::new();
    for (id, res) in peer_hashes(server, rev).await {
        match res {
            Ok(p) if p.compact_revision == compact_rev && p.hash != hash => {
                tracing::error!(
                    local = %Hex(server.member_id),
                    remote = %Hex(id),
                    revision = rev,
                    local_hash = hash,
                    remote_hash = p.hash,
                    compact_revision = compact_rev,
                    "hash mismatch"
                );
                bad.push(id);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                remote = %Hex(id),
                revision = rev,
                error = %e,
                "cannot fetch hash from peer; skipped"
            ),
        }
    }
    bad
}

/// The members whose hash at our revision differs from ours (same
/// compaction revision), or an error when our own hash is unavailable.
pub async fn mismatches(server: &EtcdServer) -> Result<Vec<u64>, String> {
    let (hash, compact_rev, rev) = server.local_hash_kv(0).await.map_err(|e| e.to_string())?;
    Ok(differing_peers(server, rev, hash, compact_rev).await)
}

/// Proposes a CORRUPT alarm for each of `bad` (the leader's checks).
async fn raise_corrupt(server: &EtcdServer, bad: Vec<u64>) {
    for id in bad {
        let req = Request::Alarm(AlarmRequest {
            action: AlarmAction::Activate as i32,
            member_id: id,
            alarm: AlarmType::Corrupt as i32,
        });
        if let Err(e) = server.propose(req).await {
            tracing::warn!(error = %e, "failed to raise the CORRUPT alarm");
        }
    }
}

/// The initial check; exits the process on a mismatch.
async fn initial_check(server: Arc<EtcdServer>) {
    // Let the member catch up with what its WAL and the leader have first.
    tokio::time::sleep(Duration::from_millis(server.cfg.election_timeout)).await;
    tracing::info!(member = %Hex(server.member_id), "starting initial corruption check");
    match mismatches(&server).await {
        Ok(bad) if bad.is_empty() => {
            tracing::info!("initial corruption checking passed; no corruption")
        }
        Ok(bad) => {
            let ids: Vec<String> = bad.iter().map(|i| Hex(*i).to_string()).collect();
            fatal(&format!(
                "{} found data inconsistency with peers ({})",
                Hex(server.member_id),
                ids.join(",")
            ));
        }
        Err(e) => tracing::warn!(error = %e, "initial corruption check skipped"),
    }
}

/// The periodic check, on the leader.
async fn monitor(server: Arc<EtcdServer>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        if !server.proposer.status().is_leader() {
            continue;
        }
        let bad = match mismatches(&server).await {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "corruption check skipped");
                continue;
            }
        };
        raise_corrupt(&server, bad).await;
    }
}

/// etcd's compaction hash check (`--experimental-compact-hash-check-enabled`,
/// 3.6's `CompactHashCheck` gate): on the leader, every `every`, when a
/// compaction happened since the last look, the hash of the store at the
/// compaction revision is compared with every peer's; a peer that compacted
/// at the same revision and hashes differently gets a CORRUPT alarm.
async fn compact_hash_monitor(server: Arc<EtcdServer>, every: Duration) {
    let mut checked = 0i64;
    loop {
        tokio::time::sleep(every).await;
        if !server.proposer.status().is_leader() {
            continue;
        }
        let compact_rev = server.kv.compact_revision();
        if compact_rev <= 0 || compact_rev == checked {
            continue;
        }
        // The first revision after the compaction: its hash covers what
        // the compaction left (retcd's HashKV refuses the compaction
        // revision itself).
        let current = server.kv.current_revision();
        if current <= compact_rev {
            continue;
        }
        let at = compact_rev + 1;
        let (hash, c, _) = match server.local_hash_kv(at).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "compaction hash check skipped");
                continue;
            }
        };
        let bad = differing_peers(&server, at, hash, c).await;
        checked = compact_rev;
        if bad.is_empty() {
            tracing::info!(
                compact_revision = compact_rev,
                hash,
                "finished compaction hash check"
            );
        }
        raise_corrupt(&server, bad).await;
    }
}

/// Starts the checks the flags ask for.
pub(super) fn start(server: &Arc<EtcdServer>) {
    if server.cfg.experimental_initial_corrupt_check {
        tokio::spawn(initial_check(server.clone()));
    }
    let every = server.cfg.experimental_corrupt_check_time;
    if !every.is_zero() {
        tokio::spawn(monitor(server.clone(), every));
    }
    if server.cfg.experimental_compact_hash_check_enabled {
        let every = server.cfg.experimental_compact_hash_check_time;
        tokio::spawn(compact_hash_monitor(server.clone(), every));
    }
}
