//! etcdserverpb.Lease: LeaseGrant, LeaseRevoke, LeaseKeepAlive,
//! LeaseTimeToLive, LeaseLeases — and the server side of leases: renew and
//! TimeToLive forwarding to the leader, and the leader's expiry loop.
//!
//! * Grant and revoke go through raft; apply (`apply.rs`) changes the
//!   lessor on every member.
//! * Renew (keepalive) and TimeToLive are answered by the leader's lessor
//!   only: its expiry clock is the one that counts. Another member forwards
//!   them to the leader on the peer service (`RaftPeer/LeaseRenew`,
//!   `RaftPeer/LeaseTimeToLive`; etcd's leasehttp), retrying until the
//!   request timeout; with no leader: "etcdserver: no leader".
//! * [`run_lessor`]: every 500 ms the primary lessor's expired leases are
//!   revoked through raft (at most `leaseRevokeRate / 2` per round, 16 in
//!   flight, as etcd) and due checkpoints proposed.

use crate::apply::ApplyResult;
use crate::error::ServerError;
use crate::server::EtcdServer;
use parking_lot::Mutex;
use retcd_api::etcdserverpb::lease_server::Lease;
use retcd_api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::{InternalRaftRequest, LeaseCheckpointRequest};
use retcd_lease::{LeaseError, Lessor, LEASE_REVOKE_RATE, MAX_LEASE_CHECKPOINT_BATCH_SIZE};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status, Streaming};

/// etcd's `maxPendingRevokes`.
const MAX_PENDING_REVOKES: usize = 16;
const RETRY: Duration = Duration::from_millis(50);

pub struct LeaseService {
    pub server: Arc<EtcdServer>,
    fwd: Arc<Forwarder>,
}

impl LeaseService {
    pub fn new(server: Arc<EtcdServer>) -> Self {
        LeaseService {
            server,
            fwd: Arc::new(Forwarder::default()),
        }
    }
}

/// Peer connections used to forward lease requests to the leader.
#[derive(Default)]
struct Forwarder {
    /// Protects the channels by peer URL (connected lazily, shared by all
    /// forwarded requests). Held only to look up or insert, never across
    /// `.await`.
    channels: Mutex<HashMap<String, Channel>>,
}

impl Forwarder {
    fn client(&self, url: &str) -> Option<RaftPeerClient<Channel>> {
        let mut chans = self.channels.lock();
        if let Some(c) = chans.get(url) {
            return Some(RaftPeerClient::new(c.clone()));
        }
        let ch = crate::tls::peer_endpoint(url)
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy();
        chans.insert(url.to_string(), ch.clone());
        Some(RaftPeerClient::new(ch))
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
            let urls = server
                .shared
                .members
                .read()
                .iter()
                .find(|m| m.id == leader)
                .map(|m| m.peer_urls.clone());
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

/// The leader's lessor status for a forwarding peer.
pub fn peer_status(e: LeaseError) -> Status {
    match e {
        LeaseError::NotFound => Status::not_found(e.to_string()),
        LeaseError::NotPrimary => Status::failed_precondition(e.to_string()),
        LeaseError::Expired => Status::unavailable(e.to_string()),
        other => Status::unknown(other.to_string()),
    }
}

/// Renews on this member's lessor; an expired lease is waited on until
/// its revoke lands (→ not found) or this lessor is demoted (→ not
/// primary), bounded at 5 s, as etcd's `Renew`.
pub async fn renew_on_leader(lessor: &Lessor, id: i64) -> Result<i64, LeaseError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match lessor.renew(id) {
            Ok(r) => return Ok(r.ttl),
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

/// etcd's `EtcdServer.LeaseRenew`: locally on the leader (after making sure
/// it still is), else forwarded.
async fn lease_renew(server: &EtcdServer, fwd: &Forwarder, id: i64) -> Result<i64, ServerError> {
    let lessor = &server.shared.lessor;
    let deadline = Instant::now() + server.request_timeout();
    loop {
        match leader_target(server, deadline).await? {
            // etcd's ensureLeadership (3.4.25/3.5.8): a leader that was
            // paused or cut off may not know it was replaced, and renewing
            // on its lessor would answer a keepalive the real leader never
            // saw (the lease then expires "early"; the robustness lease
            // check caught it with the leader paused). A ReadIndex confirms
            // leadership with a quorum first; if it fails, look again.
            Target::Local if ensure_leadership(server).await => {
                match renew_on_leader(lessor, id).await {
                    Ok(ttl) => return Ok(ttl),
                    Err(LeaseError::NotFound) => return Err(LeaseError::NotFound.into()),
                    Err(_) => {} // not promoted yet, or just demoted: retry
                }
            }
            Target::Local => {}
            Target::Leader(urls) => {
                for url in &urls {
                    let Some(mut c) = fwd.client(url) else {
                        continue;
                    };
                    match c.lease_renew(LeaseKeepAliveRequest { id }).await {
                        Ok(r) => return Ok(r.into_inner().ttl),
                        Err(s) if s.code() == Code::NotFound => {
                            return Err(LeaseError::NotFound.into())
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(server.timed_out());
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// etcd's `EtcdServer.LeaseTimeToLive`: locally on the leader, else forwarded.
async fn lease_time_to_live(
    server: &EtcdServer,
    fwd: &Forwarder,
    req: &LeaseTimeToLiveRequest,
) -> Result<LeaseTimeToLiveResponse, ServerError> {
    let deadline = Instant::now() + server.request_timeout();
    loop {
        match leader_target(server, deadline).await? {
            Target::Local => match time_to_live_on_leader(&server.shared.lessor, req) {
                Ok(r) => return Ok(r),
                Err(LeaseError::NotFound) => return Err(LeaseError::NotFound.into()),
                Err(_) => {}
            },
            Target::Leader(urls) => {
                for url in &urls {
                    let Some(mut c) = fwd.client(url) else {
                        continue;
                    };
                    match c.lease_time_to_live(*req).await {
                        Ok(r) => return Ok(r.into_inner()),
                        Err(s) if s.code() == Code::NotFound => {
                            return Err(LeaseError::NotFound.into())
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(server.timed_out());
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Proposes on behalf of the caller whose request metadata is `md` (the
/// apply checks a revoke's permissions).
async fn propose(
    server: &EtcdServer,
    req: InternalRaftRequest,
    md: &tonic::metadata::MetadataMap,
) -> Result<ApplyResult, Status> {
    let who = server.auth_info(md)?;
    match server.propose_as(req, who).await? {
        ApplyResult::Err(e) => Err(e.into()),
        ok => Ok(ok),
    }
}

fn unexpected(r: ApplyResult) -> Status {
    Status::internal(format!("retcd: unexpected apply result {r:?}"))
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        crate::quota::check(&self.server, crate::quota::LEASE_OVERHEAD).await?;
        let (md, _, mut req) = request.into_parts();
        // No ID given: the server picks one from its request id generator,
        // positive, as etcd.
        while req.id == 0 {
            req.id = (self.server.next_request_id() & ((1 << 63) - 1)) as i64;
        }
        let r = propose(
            &self.server,
            InternalRaftRequest {
                lease_grant: Some(req),
                ..Default::default()
            },
            &md,
        )
        .await?;
        match r {
            ApplyResult::LeaseGrant(mut r) => {
                let rev = r.header.map_or(0, |h| h.revision);
                r.header = Some(self.server.header(rev));
                Ok(Response::new(r))
            }
            other => Err(unexpected(other)),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let (md, _, req) = request.into_parts();
        let r = propose(
            &self.server,
            InternalRaftRequest {
                lease_revoke: Some(req),
                ..Default::default()
            },
            &md,
        )
        .await?;
        match r {
            ApplyResult::LeaseRevoke(mut r) => {
                let rev = r.header.map_or(0, |h| h.revision);
                r.header = Some(self.server.header(rev));
                Ok(Response::new(r))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Many leases on one stream, answered in order: {ID, TTL} with the
    /// granted TTL after the renew; an unknown (or revoked) lease answers
    /// TTL 0 and the stream goes on; any other error ends the stream.
    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<tonic::codegen::BoxStream<LeaseKeepAliveResponse>>, Status> {
        let mut input = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let server = self.server.clone();
        let fwd = self.fwd.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = input.next().await {
                // Header taken before the renew, as etcd: its revision is at
                // most the one at which the keepalive happened.
                let header = server.header(server.kv.current_revision());
                let ttl = match lease_renew(&server, &fwd, req.id).await {
                    Ok(ttl) => ttl,
                    Err(ServerError::Lease(LeaseError::NotFound)) => 0,
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                };
                let resp = LeaseKeepAliveResponse {
                    header: Some(header),
                    id: req.id,
                    ttl,
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        let mut resp = match lease_time_to_live(&self.server, &self.fwd, &req).await {
            Ok(r) => r,
            // etcd answers an unknown lease with TTL -1, not an error.
            Err(ServerError::Lease(LeaseError::NotFound)) => LeaseTimeToLiveResponse {
                id: req.id,
                ttl: -1,
                ..Default::default()
            },
            Err(e) => return Err(e.into()),
        };
        resp.header = Some(self.server.header(self.server.kv.current_revision()));
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        _request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let leases = self
            .server
            .shared
            .lessor
            .leases()
            .into_iter()
            .map(|id| LeaseStatus { id })
            .collect();
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.server.header(self.server.kv.current_revision())),
            leases,
        }))
    }
}

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
        let lessor = &server.shared.lessor;
        if !lessor.is_primary() {
            continue;
        }
        for id in lessor.find_expired_leases(LEASE_REVOKE_RATE / 2) {
            let Ok(permit) = pending.clone().acquire_owned().await else {
                return;
            };
            let s = server.clone();
            tokio::spawn(async move {
                let req = InternalRaftRequest {
                    lease_revoke: Some(LeaseRevokeRequest { id }),
                    ..Default::default()
                };
                // As root (etcd revokes with `WithRoot`): the lease's keys
                // may be any user's.
                let root = Some(crate::auth::AuthInfo::server_itself());
                match s.propose_as(req, root).await {
                    Ok(ApplyResult::Err(e)) => {
                        tracing::warn!(lease = %format!("{id:016x}"), error = %e, "failed to revoke expired lease")
                    }
                    Ok(_) => {
                        tracing::debug!(lease = %format!("{id:016x}"), "revoked expired lease")
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
                        let req = InternalRaftRequest {
                            lease_checkpoint: Some(LeaseCheckpointRequest { checkpoints: cps }),
                            ..Default::default()
                        };
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
