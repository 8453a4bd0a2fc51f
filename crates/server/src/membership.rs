//! The member list: bootstrap from `--initial-cluster`, persisted in the
//! backend's `members` table, and each member's name and client URLs
//! published through raft when it starts (etcd's publish), so every member
//! lists every other member's client URLs.
//!
//! Membership changes (etcd's `AddMember`, `RemoveMember`, `UpdateMember`,
//! `PromoteMember`) are raft `ConfChange`s (v1) whose context is a
//! [`ConfChangeContext`]. They are checked twice, as etcd does:
//! * before proposing, on the member that got the request, with
//!   `--strict-reconfig-check`: would the change leave fewer started voters
//!   than a quorum, or break an active quorum (peers connected for at least
//!   [`HEALTH_INTERVAL`])? A promote also needs the learner's match index
//!   within 90% of the leader's, which only the leader knows.
//! * when applied, on every member in log order ([`apply_conf_change`]):
//!   unknown ids, peer URLs already used, too many learners. A rejected
//!   change is not handed to raft-rs at all, so every member keeps the same
//!   configuration; the proposer gets the error.
//!
//! Worked example (replace m1 of {m1, m2, m3}): `MemberAdd m4 --learner`
//! (applied: m4 is a learner, unstarted, all peers start sending to it);
//! m4 starts with `--initial-cluster-state existing`, asks a peer for the
//! cluster id and members (`RaftPeer/Members`), starts with an empty log
//! and gets a snapshot (new clusters start their log at index 2, so the
//! leader never has the entries a fresh member would need); m4 publishes
//! its name (now "started"); `MemberPromote m4` once its match index is
//! ≥ 90% of the leader's; `MemberRemove m1`: m1 applies its own removal and
//! exits about a second later (peers also refuse its streams).

use crate::apply::ApplyResult;
use crate::config::{split_urls, Config};
use crate::error::ServerError;
use crate::server::{EtcdServer, Shared};
use prost::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType};
use redb::{ReadableDatabase, ReadableTable};
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::{InternalRaftRequest, Member, MemberAttributes, MembersRequest};
use retcd_mvcc::{MvccError, WriteBatch};
use retcd_storage::backend::{Backend, MEMBERS};
use sha1::{Digest, Sha1};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long peers must have been connected for a reconfiguration to be
/// considered safe (etcd's `HealthInterval`).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// A learner may be promoted when its match index is at least this share of
/// the leader's (etcd's `readyPercent`).
const READY_PERCENT: f64 = 0.9;

/// The context of a membership `ConfChange` (etcd's `ConfigChangeContext`):
/// the member added or updated (only its id for a promote).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConfChangeContext {
    #[prost(message, optional, tag = "1")]
    pub member: Option<Member>,
    #[prost(bool, tag = "2")]
    pub is_promote: bool,
    /// raft-rs has no `UpdateNode`: an update is an `AddNode` with this set,
    /// never handed to raft-rs.
    #[prost(bool, tag = "3")]
    pub is_update: bool,
}

/// What an applied membership change did; the raft thread updates the
/// transport from it.
#[derive(Debug, Clone)]
pub enum Change {
    Added(Member),
    Promoted(u64),
    Removed(u64),
    Updated(Member),
}

/// The raft thread's bookkeeping for conf changes.
pub struct ConfChangeState {
    pub max_learners: usize,
    /// Conf changes held back while the leader still has one pending
    /// (raft-rs would silently turn them into empty entries): (request id,
    /// change, first tried).
    pub deferred: Vec<(u64, ConfChange, Instant)>,
    /// Set when this member learnt it was removed; it exits a little later
    /// (etcd waits so the commit reaches the other members).
    pub removed_at: Option<Instant>,
}

impl ConfChangeState {
    pub fn new(max_learners: usize) -> Self {
        ConfChangeState {
            max_learners,
            deferred: Vec::new(),
            removed_at: None,
        }
    }
}

/// etcd's `NewMember(name, peerURLs, "", &now)` as MemberAdd calls it:
/// SHA-1 of the sorted peer URLs, the (empty) cluster name and the Unix time
/// in seconds; the first 8 bytes, big-endian.
pub fn new_member_id(peer_urls: &[String], now_unix_secs: u64) -> u64 {
    let mut urls = peer_urls.to_vec();
    urls.sort();
    let mut h = Sha1::new();
    h.update(urls.concat().as_bytes());
    h.update(now_unix_secs.to_string().as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_be_bytes(b)
}

/// etcd's `types.NewURLs` checks: scheme http(s)/unix(s), host:port, no path.
pub fn validate_peer_urls(urls: &[String]) -> Result<Vec<String>, ServerError> {
    let mut out = Vec::with_capacity(urls.len());
    for u in urls {
        let (scheme, rest) = u.split_once("://").ok_or(ServerError::MemberBadUrls)?;
        if !matches!(scheme, "http" | "https" | "unix" | "unixs") {
            return Err(ServerError::MemberBadUrls);
        }
        let host = rest.strip_suffix('/').unwrap_or(rest);
        let Some((h, port)) = host.rsplit_once(':') else {
            return Err(ServerError::MemberBadUrls);
        };
        if h.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
            return Err(ServerError::MemberBadUrls);
        }
        out.push(u.clone());
    }
    out.sort();
    Ok(out)
}

/// A started member has published its name (etcd's `IsStarted`).
fn is_started(m: &Member) -> bool {
    !m.name.is_empty()
}

/// Checks a committed membership `ConfChange` against the current member
/// list and applies it to `shared.members` and the batch's `members` table.
/// The outer error is a backend failure (fatal); the inner one a rejected
/// change (the same on every member).
pub fn apply_conf_change(
    shared: &Shared,
    batch: &mut WriteBatch<'_>,
    cc: &ConfChange,
    max_learners: usize,
) -> Result<Result<Change, ServerError>, MvccError> {
    let ctx = if cc.context.is_empty() {
        ConfChangeContext::default()
    } else {
        match ConfChangeContext::decode(&cc.context[..]) {
            Ok(c) => c,
            Err(_) => {
                return Ok(Err(ServerError::Internal(
                    "retcd: undecodable conf change context".into(),
                )))
            }
        }
    };
    let id = cc.node_id;
    let mut members = shared.members.write();
    let pos = members.iter().position(|m| m.id == id);
    let change = match cc.get_change_type() {
        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode if ctx.is_update => {
            let Some(p) = pos else {
                return Ok(Err(ServerError::MemberNotFound));
            };
            let urls = ctx.member.map(|m| m.peer_urls).unwrap_or_default();
            if members
                .iter()
                .filter(|o| o.id != id)
                .any(|o| o.peer_urls.iter().any(|u| urls.contains(u)))
            {
                return Ok(Err(ServerError::PeerUrlExist));
            }
            members[p].peer_urls = urls;
            Change::Updated(members[p].clone())
        }
        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode if ctx.is_promote => {
            let Some(p) = pos else {
                return Ok(Err(ServerError::MemberNotFound));
            };
            if !members[p].is_learner {
                return Ok(Err(ServerError::MemberNotLearner));
            }
            members[p].is_learner = false;
            Change::Promoted(id)
        }
        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
            if pos.is_some() {
                return Ok(Err(ServerError::MemberExist));
            }
            let Some(mut m) = ctx.member.filter(|m| m.id == id) else {
                return Ok(Err(ServerError::Internal(
                    "retcd: conf change without its member".into(),
                )));
            };
            if members
                .iter()
                .any(|o| o.peer_urls.iter().any(|u| m.peer_urls.contains(u)))
            {
                return Ok(Err(ServerError::PeerUrlExist));
            }
            m.is_learner = cc.get_change_type() == ConfChangeType::AddLearnerNode;
            if m.is_learner && members.iter().filter(|o| o.is_learner).count() + 1 > max_learners {
                return Ok(Err(ServerError::TooManyLearners));
            }
            members.push(m.clone());
            members.sort_by_key(|m| m.id);
            Change::Added(m)
        }
        ConfChangeType::RemoveNode => {
            let Some(p) = pos else {
                return Ok(Err(ServerError::MemberNotFound));
            };
            members.remove(p);
            Change::Removed(id)
        }
    };
    // The whole list is written: the table may still be empty (nothing
    // published yet) and must never hold a partial list.
    let mut table = batch.backend_txn().open_table(MEMBERS)?;
    if let Change::Removed(id) = &change {
        table.remove(*id)?;
    }
    for m in members.iter() {
        table.insert(m.id, m.encode_to_vec().as_slice())?;
    }
    Ok(Ok(change))
}

/// Members stored in the backend (empty on a new member).
pub fn load(backend: &Backend) -> anyhow::Result<Vec<Member>> {
    let txn = backend.db().begin_read()?;
    let table = txn.open_table(MEMBERS)?;
    let mut out = Vec::new();
    for entry in table.iter()? {
        let (_, v) = entry?;
        out.push(Member::decode(v.value())?);
    }
    Ok(out)
}

/// Applies a publish: updates the member in memory and in the batch's
/// backend transaction. Unknown members are ignored (removed meanwhile).
pub fn apply_attributes(
    shared: &Shared,
    batch: &mut WriteBatch<'_>,
    attrs: MemberAttributes,
) -> Result<ApplyResult, MvccError> {
    let mut members = shared.members.write();
    if let Some(m) = members.iter_mut().find(|m| m.id == attrs.member_id) {
        m.name = attrs.name;
        m.client_urls = attrs.client_urls;
    }
    let mut table = batch.backend_txn().open_table(MEMBERS)?;
    for m in members.iter() {
        table.insert(m.id, m.encode_to_vec().as_slice())?;
    }
    Ok(ApplyResult::Empty)
}

/// Publishes this member's attributes once a leader exists; retries until
/// the publish is applied (or the server stops).
pub async fn publish(server: Arc<EtcdServer>) {
    let attrs = MemberAttributes {
        member_id: server.member_id,
        name: server.cfg.name.clone(),
        client_urls: split_urls(&server.cfg.advertise_client_urls),
    };
    loop {
        if server.leader() != 0 {
            let req = InternalRaftRequest {
                member_attributes: Some(attrs.clone()),
                ..Default::default()
            };
            match server.propose(req).await {
                Ok(_) => {
                    tracing::info!(name = %attrs.name, client_urls = ?attrs.client_urls, "published local member to cluster");
                    server.published.send_replace(true);
                    return;
                }
                Err(crate::error::ServerError::Stopped) => return,
                Err(e) => tracing::debug!(error = %e, "publish failed; retrying"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn now_unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn voters(members: &[Member]) -> Vec<Member> {
    members.iter().filter(|m| !m.is_learner).cloned().collect()
}

/// etcd's `numConnectedSince`: this member plus the members whose stream
/// has been up for at least [`HEALTH_INTERVAL`].
fn num_connected_since(server: &EtcdServer, members: &[Member]) -> usize {
    let Some(since) = Instant::now().checked_sub(HEALTH_INTERVAL) else {
        return 1;
    };
    members
        .iter()
        .filter(|m| {
            m.id == server.member_id
                || server
                    .transport
                    .active_since(m.id)
                    .is_some_and(|t| t <= since)
        })
        .count()
}

/// etcd's `mayAddMember`.
fn may_add_member(server: &EtcdServer, is_learner: bool) -> Result<(), ServerError> {
    if !server.cfg.strict_reconfig_check {
        return Ok(());
    }
    let voters = voters(&server.shared.members.read());
    if !is_learner {
        // IsReadyToAddVotingMember: the new member counts, unstarted.
        let nmembers = voters.len() + 1;
        let nstarted = voters.iter().filter(|m| is_started(m)).count();
        // Adding a second member to a one-member cluster is allowed
        // (restoring a cluster from a backup).
        if !(nstarted == 1 && nmembers == 2) && nstarted < nmembers / 2 + 1 {
            return Err(ServerError::MemberNotEnoughStarted);
        }
    }
    if num_connected_since(server, &voters) != voters.len() {
        return Err(ServerError::Unhealthy);
    }
    Ok(())
}

/// etcd's `mayRemoveMember`.
fn may_remove_member(server: &EtcdServer, id: u64) -> Result<(), ServerError> {
    if !server.cfg.strict_reconfig_check {
        return Ok(());
    }
    let members = server.shared.members.read().clone();
    if members.iter().any(|m| m.id == id && m.is_learner) {
        return Ok(());
    }
    let voters = voters(&members);
    // IsReadyToRemoveVotingMember.
    let rest: Vec<&Member> = voters.iter().filter(|m| m.id != id).collect();
    let nstarted = rest.iter().filter(|m| is_started(m)).count();
    if nstarted < rest.len() / 2 + 1 {
        return Err(ServerError::MemberNotEnoughStarted);
    }
    // A member that is down is not part of the active quorum.
    if id != server.member_id && server.transport.active_since(id).is_none() {
        return Ok(());
    }
    let active = num_connected_since(server, &voters);
    if active < 1 + 1 + voters.len().saturating_sub(1) / 2 {
        return Err(ServerError::Unhealthy);
    }
    Ok(())
}

/// etcd's `isLearnerReady` + `IsReadyToPromoteMember`. Only the leader
/// knows the learner's progress: elsewhere this is `NotLeader` and the
/// caller forwards the request to the leader.
async fn may_promote_member(server: &EtcdServer, id: u64) -> Result<(), ServerError> {
    let progress = server
        .raft_progress()
        .await?
        .ok_or(ServerError::NotLeader)?;
    if let Some((_, learner_match)) = progress.iter().find(|(pid, _)| *pid == id) {
        let leader_match = progress
            .iter()
            .find(|(pid, _)| *pid == server.member_id)
            .map(|p| p.1)
            .unwrap_or(0);
        if (*learner_match as f64) < leader_match as f64 * READY_PERCENT {
            return Err(ServerError::LearnerNotReady);
        }
    }
    if !server.cfg.strict_reconfig_check {
        return Ok(());
    }
    let voters = voters(&server.shared.members.read());
    let nmembers = voters.len() + 1;
    let nstarted = voters.iter().filter(|m| is_started(m)).count() + 1;
    if nstarted < nmembers / 2 + 1 {
        return Err(ServerError::MemberNotEnoughStarted);
    }
    Ok(())
}

fn conf_change(ty: ConfChangeType, id: u64, ctx: Option<ConfChangeContext>) -> ConfChange {
    let mut cc = ConfChange::default();
    cc.set_change_type(ty);
    cc.node_id = id;
    if let Some(c) = ctx {
        cc.context = c.encode_to_vec().into();
    }
    cc
}

/// The member list after a change, sorted by id (etcd's `Members()`).
fn members_now(server: &EtcdServer) -> Vec<Member> {
    let mut m = server.shared.members.read().clone();
    m.sort_by_key(|m| m.id);
    m
}

/// MemberAdd: a new, unstarted member (no name until it publishes). Its ID
/// is derived as etcd derives it, from its peer URLs and the current time.
pub async fn add_member(
    server: &EtcdServer,
    peer_urls: &[String],
    is_learner: bool,
) -> Result<(Member, Vec<Member>), ServerError> {
    let urls = validate_peer_urls(peer_urls)?;
    let m = Member {
        id: new_member_id(&urls, now_unix_secs()),
        name: String::new(),
        peer_urls: urls,
        client_urls: vec![],
        is_learner,
    };
    may_add_member(server, is_learner)?;
    let ty = if is_learner {
        ConfChangeType::AddLearnerNode
    } else {
        ConfChangeType::AddNode
    };
    let ctx = ConfChangeContext {
        member: Some(m.clone()),
        is_promote: false,
        is_update: false,
    };
    server
        .propose_conf_change(conf_change(ty, m.id, Some(ctx)))
        .await?;
    Ok((m, members_now(server)))
}

/// MemberRemove. Removing the leader first hands leadership to another
/// started voter (best effort), so the cluster does not wait out an
/// election timeout.
pub async fn remove_member(server: &EtcdServer, id: u64) -> Result<Vec<Member>, ServerError> {
    may_remove_member(server, id)?;
    if id == server.leader() {
        hand_off_leadership(server, id).await;
    }
    server
        .propose_conf_change(conf_change(ConfChangeType::RemoveNode, id, None))
        .await?;
    Ok(members_now(server))
}

/// MemberUpdate: new peer URLs (etcd does not validate them here).
pub async fn update_member(
    server: &EtcdServer,
    id: u64,
    peer_urls: Vec<String>,
) -> Result<Vec<Member>, ServerError> {
    let ctx = ConfChangeContext {
        member: Some(Member {
            id,
            peer_urls,
            ..Default::default()
        }),
        is_promote: false,
        is_update: true,
    };
    server
        .propose_conf_change(conf_change(ConfChangeType::AddNode, id, Some(ctx)))
        .await?;
    Ok(members_now(server))
}

/// MemberPromote on this member; `NotLeader` when it is not the leader
/// (the gRPC layer then forwards to the leader, as etcd does).
pub async fn promote_member(server: &EtcdServer, id: u64) -> Result<Vec<Member>, ServerError> {
    may_promote_member(server, id).await?;
    let ctx = ConfChangeContext {
        member: Some(Member {
            id,
            ..Default::default()
        }),
        is_promote: true,
        is_update: false,
    };
    server
        .propose_conf_change(conf_change(ConfChangeType::AddNode, id, Some(ctx)))
        .await?;
    Ok(members_now(server))
}

/// `--initial-cluster-state existing`: asks the other members named in
/// `--initial-cluster` for the cluster (`RaftPeer/Members`) and finds this
/// member in it by its peer URLs (etcd's `GetClusterFromRemotePeers` +
/// `ValidateClusterAndAssignIDs`). Returns (cluster id, member id, members).
///
/// The peer asked may not have applied the `MemberAdd` (or a removal) yet:
/// a mismatch is retried for a few seconds before giving up.
pub fn join_existing(cfg: &Config) -> anyhow::Result<(u64, u64, Vec<Member>)> {
    let mut attempt = 0;
    loop {
        match join_existing_once(cfg) {
            Ok(r) => return Ok(r),
            Err(e) if attempt < 10 => {
                tracing::warn!(error = %e, "cannot join the cluster yet; retrying");
                attempt += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

fn join_existing_once(cfg: &Config) -> anyhow::Result<(u64, u64, Vec<Member>)> {
    let initial = cfg.initial_members().map_err(anyhow::Error::msg)?;
    let mut own_urls = split_urls(&cfg.initial_advertise_peer_urls);
    own_urls.sort();
    let peer_urls: Vec<String> = initial
        .iter()
        .filter(|m| m.name != cfg.name)
        .flat_map(|m| m.peer_urls.clone())
        .collect();
    let fetch = async move {
        for url in &peer_urls {
            let ep = match crate::tls::peer_endpoint(url) {
                Ok(ep) => ep
                    .connect_timeout(Duration::from_secs(1))
                    .timeout(Duration::from_secs(2)),
                Err(_) => continue,
            };
            let Ok(ch) = ep.connect().await else { continue };
            if let Ok(r) = RaftPeerClient::new(ch).members(MembersRequest {}).await {
                return Some(r.into_inner());
            }
        }
        None
    };
    // Called from inside the runtime, before any service runs: a small
    // runtime of its own on a helper thread.
    let resp = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
            .and_then(|rt| rt.block_on(fetch))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("cannot fetch cluster info from peer urls"))?
    .ok_or_else(|| {
        anyhow::anyhow!(
            "cannot fetch cluster info from peer urls: could not retrieve cluster information from the given URLs"
        )
    })?;
    if resp.members.len() != initial.len() {
        anyhow::bail!(
            "error validating peerURLs {{ClusterID:{:x} Members:[{}]}}: member count is unequal",
            resp.cluster_id,
            resp.members
                .iter()
                .map(|m| format!("{:x}={:?}", m.id, m.peer_urls))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let own = resp
        .members
        .iter()
        .find(|m| {
            let mut u = m.peer_urls.clone();
            u.sort();
            u == own_urls
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "error validating peerURLs: unmatched member while checking PeerURLs ({own_urls:?} is not a member of cluster {:x})",
                resp.cluster_id
            )
        })?;
    if !own.client_urls.is_empty() {
        anyhow::bail!("member {:x} has already been bootstrapped", own.id);
    }
    let mut members = resp.members.clone();
    members.sort_by_key(|m| m.id);
    Ok((resp.cluster_id, own.id, members))
}

/// etcd's `MoveLeader`: on the leader only, to a voting member; waits
/// (polling every heartbeat, bounded by the request timeout) until the
/// transferee leads.
pub async fn move_leader(server: &EtcdServer, target: u64) -> Result<(), ServerError> {
    if server.leader() != server.member_id {
        return Err(ServerError::NotLeader);
    }
    let ok = server
        .shared
        .members
        .read()
        .iter()
        .any(|m| m.id == target && !m.is_learner);
    if !ok {
        return Err(ServerError::BadLeaderTransferee);
    }
    tracing::info!(transferee = %format!("{target:x}"), "leadership transfer starting");
    let started = Instant::now();
    let tick = Duration::from_millis(server.cfg.heartbeat_interval.max(1));
    let deadline = started + server.request_timeout();
    server.transfer_leadership(target)?;
    let mut last_ask = Instant::now();
    while server.leader() != target {
        if Instant::now() >= deadline {
            return Err(ServerError::LeaderTransferTimeout);
        }
        // raft-rs gives up a transfer after an election timeout; ask again
        // while we still lead.
        if last_ask.elapsed() >= Duration::from_millis(server.cfg.election_timeout)
            && server.leader() == server.member_id
        {
            server.transfer_leadership(target)?;
            last_ask = Instant::now();
        }
        tokio::time::sleep(tick).await;
    }
    tracing::info!(transferee = %format!("{target:x}"), took = ?started.elapsed(), "leadership transfer finished");
    Ok(())
}

/// Moves leadership away from `leader` (about to be removed) to another
/// started voter: the most caught-up one when this member leads, else any
/// (raft forwards the transfer request to the leader). Bounded by two
/// election timeouts; failure is not an error (the removal still works,
/// with an election after it).
async fn hand_off_leadership(server: &EtcdServer, leader: u64) {
    let candidates: Vec<u64> = server
        .shared
        .members
        .read()
        .iter()
        .filter(|m| m.id != leader && !m.is_learner && is_started(m))
        .map(|m| m.id)
        .collect();
    let progress = server
        .raft_progress()
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let Some(target) = candidates.iter().copied().max_by_key(|c| {
        progress
            .iter()
            .find(|(id, _)| id == c)
            .map(|p| p.1)
            .unwrap_or(0)
    }) else {
        return;
    };
    tracing::info!(from = %format!("{leader:x}"), to = %format!("{target:x}"), "moving leadership off a member being removed");
    if server.transfer_leadership(target).is_err() {
        return;
    }
    let deadline = Instant::now() + 2 * Duration::from_millis(server.cfg.election_timeout);
    while server.leader() == leader && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(server.cfg.heartbeat_interval.max(1))).await;
    }
}
