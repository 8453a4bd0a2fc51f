//! Leases (etcd's `Lessor` as the server exposes it): LeaseGrant,
//! LeaseRevoke, LeaseKeepAlive, LeaseTimeToLive, LeaseLeases — and the
//! leader's expiry loop.
//!
//! * Grant and revoke go through raft; the apply changes the lessor on
//!   every member.
//! * Renew (keepalive) and TimeToLive are answered by the leader's lessor
//!   only: its expiry clock is the one that counts. Another member forwards
//!   them to the leader on the peer service (`RaftPeer/LeaseRenew`,
//!   `RaftPeer/LeaseTimeToLive`; etcd's leasehttp), retrying until the
//!   request timeout; with no leader: "etcdserver: no leader".
//! * Who may call (etcd 3.5.28+): every lease RPC needs a user; a
//!   keepalive and a revoke need WRITE on every key attached to the
//!   lease, a TimeToLive with keys READ on them, LeaseLeases READ on the
//!   keys of every lease (all or nothing). Checked on the member that
//!   takes the request, before any forwarding.
//! * [`run_lessor`]: every 500 ms the primary lessor's expired leases are
//!   revoked through raft (at most `leaseRevokeRate / 2` per round, 16 in
//!   flight, as etcd) and due checkpoints proposed.

use super::{unexpected, EtcdServer};
use crate::apply::quota::LEASE_OVERHEAD;
use crate::apply::ApplyResult;
use crate::auth::{AuthInfo, Credentials};
use crate::error::ServerError;
use crate::raft::transport::with_cluster_id;
use crate::tls::Dialer;
use parking_lot::Mutex;
use retcd_api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseLeasesResponse,
    LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse,
};
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::LeaseCheckpointRequest;
use retcd_lease::{LeaseError, Lessor, LEASE_REVOKE_RATE, MAX_LEASE_CHECKPOINT_BATCH_SIZE};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::Code;

/// etcd's `maxPendingRevokes`.
const MAX_PENDING_REVOKES: usize = 16;
const RETRY: Duration = Duration::from_millis(50);

/// How long a forwarded keepalive's bytes may stay unacknowledged before
/// the connection is aborted and what it still had to send dropped
/// (TCP_USER_TIMEOUT). Behind a cut link TCP retransmits with a growing
/// backoff (0.2, 0.6, 1.4, 3 s, ...): a keepalive whose client gave up
/// long ago reached the leader after the heal and renewed the lease then,
/// seconds past when its client counted on the lease running out (etcd
/// 3.4.23 does the same; `partition_cut_off_keepalive_is_not_renewed_after_the_heal`).
/// With this limit a forward lands within ~0.6 s of being sent, or never.
const FORWARD_UNACKED_LIMIT: Duration = Duration::from_secs(1);

/// Peer connections used to forward lease requests to the leader.
pub(super) struct Forwarder {
    dialer: Dialer,
    /// Protects the channels by peer URL (connected lazily, shared by all
    /// forwarded requests). Held only to look up or insert, never across
    /// `.await`.
    channels: Mutex<HashMap<String, Channel>>,
}

impl Forwarder {
    pub(super) fn new(dialer: Dialer) -> Forwarder {
        Forwarder {
            dialer,
            channels: Mutex::default(),
        }
    }

    fn client(&self, url: &str) -> Option<RaftPeerClient<Channel>> {
        let mut chans = self.channels.lock();
        if let Some(c) = chans.get(url) {
            return Some(RaftPeerClient::new(c.clone()));
        }
        let ch = self
            .dialer
            .peer(url)
            .ok()?
            .configure(|ep| {
                ep.connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
            })
            .with_tcp_user_timeout(FORWARD_UNACKED_LIMIT)
            .connect_lazy();
        chans.insert(url.to_string(), ch.clone());
        Some(RaftPeerClient::new(ch))
    }
}

/// One renew or TimeToLive forwarded to the leader, bounded by what is
/// left of the request's `deadline` (etcd forwards under the request's
/// context): its answer, `NotFound` for an unknown lease, or None to try
/// again (another URL, or once the leader is known anew).
async fn forward<T>(
    deadline: Instant,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<Option<T>, ServerError> {
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, call).await {
        Ok(Ok(r)) => Ok(Some(r.into_inner())),
        Ok(Err(s)) if s.code() == Code::NotFound => Err(LeaseError::NotFound.into()),
        Ok(Err(_)) | Err(_) => Ok(None),
    }
}

/// Who answers a renew or TimeToLive.
enum Target {
    Local,
    Leader(Vec<String>),
}

/// Waits for a leader (until `deadline`): this member, or the leader's
/// peer URLs.
async fn leader_target(server: &EtcdServer, deadline: Instant) -> Result<Target, ServerError> {
    loop {
        let leader = server.leader();
        if leader == server.member_id {
            return Ok(Target::Local);
        }
        if leader != 0 {
            let urls = server.members.get(leader).map(|m| m.peer_urls);
            if let Some(urls) = urls.filter(|u| !u.is_empty()) {
                return Ok(Target::Leader(urls));
            }
        }
        if Instant::now() >= deadline {
            return Err(ServerError::NoLeader);
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Renews on this member's lessor; an expired lease is waited on until
/// its revoke lands (→ not found) or this lessor is demoted (→ not
/// primary), bounded at 5 s, as etcd's `Renew`.
pub async fn renew_on_leader(lessor: &Lessor, id: i64) -> Result<i64, LeaseError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match lessor.renew(id) {
            Ok(r) => {
                crate::metrics::global().lease_renewed.inc();
                return Ok(r.ttl);
            }
            Err(LeaseError::Expired) if Instant::now() < deadline => {
                tokio::time::sleep(RETRY).await
            }
            Err(e) => return Err(e),
        }
    }
}

/// TimeToLive from this member's lessor, which must be primary.
pub fn time_to_live_on_leader(
    lessor: &Lessor,
    req: &LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, LeaseError> {
    if !lessor.is_primary() {
        return Err(LeaseError::NotPrimary);
    }
    let l = lessor.lookup(req.id).ok_or(LeaseError::NotFound)?;
    Ok(LeaseTimeToLiveResponse {
        header: None,
        id: req.id,
        ttl: l.remaining_secs,
        granted_ttl: l.ttl,
        keys: if req.keys { l.keys } else { Vec::new() },
    })
}

/// Whether this member is still the leader once a ReadIndex (a quorum's
/// heartbeat acknowledgement) has come back (etcd's `ensureLeadership`).
async fn ensure_leadership(server: &EtcdServer) -> bool {
    server.linearizable_read_notify().await.is_ok() && server.leader() == server.member_id
}

impl EtcdServer {
    pub async fn lease_grant(
        &self,
        mut req: LeaseGrantRequest,
        creds: &Credentials,
    ) -> Result<LeaseGrantResponse, ServerError> {
        self.check_quota(LEASE_OVERHEAD).await?;
        let who = self.who(creds)?;
        self.require_user(who.as_ref())?;
        // No ID given: the server picks one from its request id generator,
        // positive, as etcd.
        while req.id == 0 {
            req.id = (self.proposer.next_request_id() & ((1 << 63) - 1)) as i64;
        }
        match self.propose_as(Request::LeaseGrant(req), who).await? {
            ApplyResult::LeaseGrant(mut r) => {
                self.fill(&mut r.header);
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn lease_revoke(
        &self,
        req: LeaseRevokeRequest,
        creds: &Credentials,
    ) -> Result<LeaseRevokeResponse, ServerError> {
        let who = self.who(creds)?;
        self.require_user(who.as_ref())?;
        match self.propose_as(Request::LeaseRevoke(req), who).await? {
            ApplyResult::LeaseRevoke(mut r) => {
                self.fill(&mut r.header);
                Ok(r)
            }
            other => Err(unexpected(other)),
        }
    }

    /// One keepalive (etcd's `EtcdServer.LeaseRenew`): the TTL after the
    /// renew; an unknown or revoked lease is `LeaseError::NotFound`.
    /// Locally on the leader (after making sure it still is), else
    /// forwarded.
    pub async fn lease_renew(&self, id: i64, creds: &Credentials) -> Result<i64, ServerError> {
        let who = self.who(creds)?;
        self.require_user(who.as_ref())?;
        crate::apply::lease_keys_writable(&self.auth, &self.lessor, who.as_ref(), id)?;
        let deadline = Instant::now() + self.request_timeout();
        loop {
            match leader_target(self, deadline).await? {
                // etcd's ensureLeadership (3.4.25/3.5.8): a leader that was
                // paused or cut off may not know it was replaced, and
                // renewing on its lessor would answer a keepalive the real
                // leader never saw (the lease then expires "early"; the
                // robustness lease check caught it with the leader paused).
                // A ReadIndex confirms leadership with a quorum first; if it
                // fails, look again.
                Target::Local if ensure_leadership(self).await => {
                    match renew_on_leader(&self.lessor, id).await {
                        Ok(ttl) => return Ok(ttl),
                        Err(LeaseError::NotFound) => return Err(LeaseError::NotFound.into()),
                        Err(_) => {} // not promoted yet, or just demoted: retry
                    }
                }
                Target::Local => {}
                Target::Leader(urls) => {
                    for url in &urls {
                        let Some(mut c) = self.lease_forwarder.client(url) else {
                            continue;
                        };
                        let req = with_cluster_id(LeaseKeepAliveRequest { id }, self.cluster_id);
                        if let Some(r) = forward(deadline, c.lease_renew(req)).await? {
                            return Ok(r.ttl);
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(self.proposer.timed_out());
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// TimeToLive (an unknown lease answers TTL -1, as etcd).
    pub async fn lease_time_to_live(
        &self,
        req: LeaseTimeToLiveRequest,
        creds: &Credentials,
    ) -> Result<LeaseTimeToLiveResponse, ServerError> {
        let who = self.who(creds)?;
        self.require_user(who.as_ref())?;
        if req.keys {
            // etcd's checkLeaseTimeToLive: READ on every attached key (an
            // unknown lease skips it and answers TTL -1)
            if let Some(l) = self.lessor.lookup(req.id) {
                for k in &l.keys {
                    self.auth.check_range(who.as_ref(), k, b"")?;
                }
            }
        }
        let mut resp = match lease_time_to_live(self, &req).await {
            Ok(r) => r,
            Err(ServerError::Lease(LeaseError::NotFound)) => LeaseTimeToLiveResponse {
                id: req.id,
                ttl: -1,
                ..Default::default()
            },
            Err(e) => return Err(e),
        };
        resp.header = self.current_header();
        Ok(resp)
    }

    pub fn lease_leases(&self, creds: &Credentials) -> Result<LeaseLeasesResponse, ServerError> {
        let who = self.who(creds)?;
        self.require_user(who.as_ref())?;
        let ids = self.lessor.leases();
        if self.auth.is_enabled() {
            // etcd's checkLeaseLeases: READ on the keys of every lease
            for id in &ids {
                for k in self.lessor.lookup(*id).map(|l| l.keys).unwrap_or_default() {
                    self.auth.check_range(who.as_ref(), &k, b"")?;
                }
            }
        }
        Ok(LeaseLeasesResponse {
            header: self.current_header(),
            leases: ids.into_iter().map(|id| LeaseStatus { id }).collect(),
        })
    }
}

/// etcd's `EtcdServer.LeaseTimeToLive`: locally on the leader, else forwarded.
async fn lease_time_to_live(
    server: &EtcdServer,
    req: &LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, ServerError> {
    let deadline = Instant::now() + server.request_timeout();
    loop {
        match leader_target(server, deadline).await? {
            Target::Local => match time_to_live_on_leader(&server.lessor, req) {
                Ok(r) => return Ok(r),
                Err(LeaseError::NotFound) => return Err(LeaseError::NotFound.into()),
                Err(_) => {}
            },
            Target::Leader(urls) => {
                for url in &urls {
                    let Some(mut c) = server.lease_forwarder.client(url) else {
                        continue;
                    };
                    let fwd = c.lease_time_to_live(with_cluster_id(*req, server.cluster_id));
                    if let Some(r) = forward(deadline, fwd).await? {
                        return Ok(r);
                    }
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(server.proposer.timed_out());
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// How long past its expiry a lease may be revoked before the revoke is
/// logged as a warning.
const REVOKE_LATE: Duration = Duration::from_secs(1);

/// The leader's lease loop (etcd's lessor `runLoop` + the server's revoke
/// of expired leases): every 500 ms, while this lessor is primary, revoke
/// expired leases through raft and propose due checkpoints. Runs for the
/// life of the process; does nothing on followers.
pub async fn run_lessor(server: Arc<EtcdServer>) {
    let pending = Arc::new(Semaphore::new(MAX_PENDING_REVOKES));
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let lessor = &server.lessor;
        if !lessor.is_primary() {
            continue;
        }
        for (id, overdue) in lessor.find_expired_leases(LEASE_REVOKE_RATE / 2) {
            let Ok(permit) = pending.clone().acquire_owned().await else {
                return;
            };
            let s = server.clone();
            tokio::spawn(async move {
                // As root (etcd revokes with `WithRoot`): the lease's keys
                // may be any user's.
                let root = Some(AuthInfo::server_itself());
                let started = Instant::now();
                match s
                    .propose_as(Request::LeaseRevoke(LeaseRevokeRequest { id }), root)
                    .await
                {
                    Ok(_) => {
                        crate::metrics::global().lease_expired.inc();
                        let took = started.elapsed();
                        let (lease, found, took_s) = (
                            format!("{id:016x}"),
                            crate::log::GoDuration(overdue),
                            crate::log::GoDuration(took),
                        );
                        // A revoke applied over a second past the expiry
                        // keeps the lease's keys that long: say where the
                        // time went (the expiry loop or the commit).
                        if overdue + took > REVOKE_LATE {
                            tracing::warn!(lease, found_after_expiry = %found, revoke_took = %took_s, "revoked an expired lease late")
                        } else {
                            tracing::debug!(lease, found_after_expiry = %found, revoke_took = %took_s, "revoked expired lease")
                        }
                    }
                    Err(e) => {
                        tracing::warn!(lease = %format!("{id:016x}"), error = %e, "failed to revoke expired lease")
                    }
                }
                drop(permit);
            });
        }
        if lessor.checkpoints_enabled() {
            // etcd's leaseCheckpointRate / 2 batches per round at most.
            for _ in 0..(retcd_lease::lessor::LEASE_CHECKPOINT_RATE / 2) {
                let cps = lessor.find_due_checkpoints(MAX_LEASE_CHECKPOINT_BATCH_SIZE);
                let n = cps.len();
                if n > 0 {
                    let s = server.clone();
                    tokio::spawn(async move {
                        let req =
                            Request::LeaseCheckpoint(LeaseCheckpointRequest { checkpoints: cps });
                        if let Err(e) = s.propose(req).await {
                            tracing::warn!(error = %e, "failed to checkpoint leases");
                        }
                    });
                }
                if n < MAX_LEASE_CHECKPOINT_BATCH_SIZE {
                    break;
                }
            }
        }
    }
}
