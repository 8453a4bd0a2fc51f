//! `EtcdServer`: the member as the services see it — a typed API in the
//! shape of etcd's `RaftKV`, `Lessor`, cluster, maintenance and auth
//! interfaces, over the raft handle ([`Proposer`]) and read-only views of
//! the state machine's parts. The gRPC services and the JSON gateway are
//! thin layers over this; they never see raft or apply results.
//!
//! | file | what |
//! |---|---|
//! | `bootstrap.rs` | opening the data dir (WAL replay, new cluster, joining one), starting the raft thread and the background jobs |
//! | `kv.rs` | Range, Put, DeleteRange, Txn, Compact (quota, validation, permissions of reads, read-only txns) |
//! | `validate.rs` | etcd's request checks (v3rpc/key.go) |
//! | `lease.rs` | leases: grant/revoke through raft, renew/TimeToLive on the leader (forwarded), the expiry loop |
//! | `cluster.rs` | member add/remove/update/promote/list, move-leader, publish, strict reconfiguration checks |
//! | `join.rs` | `--initial-cluster-state existing`: asking a peer for the cluster |
//! | `maintenance.rs` | alarms, status, hashes, defragment, snapshot, downgrade |
//! | `auth.rs` | the Auth service's flows (changes through raft, authenticate, reads) |
//! | `compactor.rs`, `corrupt.rs` | auto-compaction and the corruption checks (leader-side background jobs) |

mod auth;
mod bootstrap;
mod cluster;
pub mod compactor;
mod corrupt;
mod join;
mod kv;
mod lease;
mod maintenance;
pub mod validate;

pub use kv::RangeReply;
pub use lease::{renew_on_leader, run_lessor, time_to_live_on_leader};
pub use maintenance::{SnapshotDump, StatusInfo};

use crate::apply::alarm::AlarmStore;
use crate::apply::membership::Members;
use crate::apply::ApplyResult;
use crate::auth::{AuthInfo, AuthStore, Credentials};
use crate::config::Config;
use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::raft::transport::Transport;
use crate::raft::{Proposer, RaftSender};
use crate::tls::Dialer;
use retcd_api::etcdserverpb::ResponseHeader;
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::{InternalRaftRequest, Member};
use retcd_lease::Lessor;
use retcd_mvcc::{KvStore, WatchableStore};
use retcd_storage::backend::Backend;
use std::sync::Arc;
use std::time::Duration;

pub struct EtcdServer {
    pub cfg: Config,
    pub member_id: u64,
    pub cluster_id: u64,
    kv: Arc<KvStore>,
    backend: Arc<Backend>,
    proposer: Proposer,
    /// The raft thread's input, for the peer service's incoming messages.
    raft: RaftSender,
    lessor: Arc<Lessor>,
    watch: Arc<WatchableStore>,
    alarms: Arc<AlarmStore>,
    auth: Arc<AuthStore>,
    members: Arc<Members>,
    metrics: &'static Metrics,
    /// The peer transport (membership checks read its peers' activity).
    transport: Transport,
    dialer: Dialer,
    /// Peer connections for forwarding lease renewals to the leader.
    lease_forwarder: lease::Forwarder,
    /// Becomes true once this member's publish (name + client URLs) is
    /// applied; clients are served only from then on, as etcd does.
    published: tokio::sync::watch::Sender<bool>,
    /// Bumped by `monitor_leader` at each election timeout once the
    /// member has gone three without a leader: the client streams that
    /// asked for one (`api::require_leader`) end at the next bump.
    leader_lost: tokio::sync::watch::Sender<u64>,
}

impl EtcdServer {
    /// A response header at `revision`, with this member's ids and term.
    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.proposer.status().term(),
        }
    }

    /// A header at the current revision.
    pub fn current_header(&self) -> Option<ResponseHeader> {
        Some(self.header(self.kv.current_revision()))
    }

    /// Completes a header whose revision the apply (or the read) filled
    /// in; a missing one gets the current revision.
    fn fill(&self, h: &mut Option<ResponseHeader>) {
        let rev = h
            .as_ref()
            .map(|h| h.revision)
            .filter(|r| *r != 0)
            .unwrap_or_else(|| self.kv.current_revision());
        *h = Some(self.header(rev));
    }

    pub fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    /// The raft thread's input (peer messages go in here).
    pub fn raft_sender(&self) -> &RaftSender {
        &self.raft
    }

    pub fn auth(&self) -> &AuthStore {
        &self.auth
    }

    pub fn watchable(&self) -> &Arc<WatchableStore> {
        &self.watch
    }

    pub fn lessor(&self) -> &Lessor {
        &self.lessor
    }

    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    pub fn metrics(&self) -> &Metrics {
        self.metrics
    }

    pub fn current_revision(&self) -> i64 {
        self.kv.current_revision()
    }

    /// The applied member list.
    pub fn members(&self) -> Vec<Member> {
        self.members.list()
    }

    pub fn member(&self, id: u64) -> Option<Member> {
        self.members.get(id)
    }

    pub fn leader(&self) -> u64 {
        self.proposer.leader()
    }

    /// etcd raft's `Status` as JSON (`/debug/vars`' `raft.status`);
    /// `null` once the raft thread is gone.
    pub async fn raft_status_json(&self) -> String {
        self.proposer
            .status_json()
            .await
            .unwrap_or_else(|_| "null".to_string())
    }

    pub fn request_timeout(&self) -> Duration {
        self.proposer.request_timeout()
    }

    /// Whether this member is a learner in the applied member list.
    pub fn is_learner(&self) -> bool {
        self.members.is_learner(self.member_id)
    }

    /// A receiver of the leader-lost signal (`monitor_leader`); what was
    /// signalled before the call is seen.
    pub fn leader_lost(&self) -> tokio::sync::watch::Receiver<u64> {
        self.leader_lost.subscribe()
    }

    /// A receiver that turns true once this member's publish is applied.
    pub fn published(&self) -> tokio::sync::watch::Receiver<bool> {
        self.published.subscribe()
    }

    /// Waits until everything committed before the call is applied here.
    pub async fn linearizable_read_notify(&self) -> Result<(), ServerError> {
        self.proposer.read_index().await
    }

    /// Proposes `request` on behalf of `who` (the apply checks its
    /// permissions while auth is enabled); a deterministic refusal at
    /// apply is the error.
    async fn propose_as(
        &self,
        request: Request,
        who: Option<AuthInfo>,
    ) -> Result<ApplyResult, ServerError> {
        let mut req = InternalRaftRequest {
            request: Some(request),
            ..Default::default()
        };
        if let Some(w) = who {
            req.username = w.username;
            req.auth_revision = w.revision;
        }
        let start = std::time::Instant::now();
        match self.proposer.propose(req).await {
            Ok(ApplyResult::Err(e)) => Err(e),
            Ok(ok) => Ok(ok),
            Err(ServerError::Timeout) => Err(self.propose_timed_out(start)),
            Err(e) => Err(e),
        }
    }

    /// Why a proposal made at `start` timed out, in etcd's words
    /// (`parseProposeCtxErr`): it began in the two election timeouts
    /// before the latest leader was elected, "possibly due to previous
    /// leader failure"; this leader has not heard from a quorum, or this
    /// follower from its leader, since it began, "possibly due to
    /// connection lost"; otherwise (with no leader too) "request timed
    /// out".
    pub(crate) fn propose_timed_out(&self, start: std::time::Instant) -> ServerError {
        let election = self.cfg.election_ticks() as u64 * self.cfg.heartbeat_interval;
        let election = Duration::from_millis(election);
        if let Some(elected) = self.proposer.status().lead_elected() {
            if start + 2 * election > elected && start < elected {
                return ServerError::TimeoutDueToLeaderFail;
            }
        }
        let connected = |id: u64| {
            self.transport
                .active_since(id)
                .is_some_and(|since| since < start)
        };
        let lead = self.leader();
        let lost = if lead == 0 {
            false
        } else if lead == self.member_id {
            let members = self.members.list();
            let up = members
                .iter()
                .filter(|m| m.id == self.member_id || connected(m.id))
                .count();
            up < members.len() / 2 + 1
        } else {
            !connected(lead)
        };
        if lost {
            ServerError::TimeoutDueToConnectionLost
        } else {
            ServerError::Timeout
        }
    }

    /// [`EtcdServer::propose_as`] for the server itself (no user).
    async fn propose(&self, request: Request) -> Result<ApplyResult, ServerError> {
        self.propose_as(request, None).await
    }

    /// Who sent a request (etcd's `AuthInfoFromCtx`): the user its token
    /// names; with `--client-cert-auth` and no token, its certificate's
    /// common name; None with neither. A token that does not check out is
    /// "invalid auth token" (also while auth is disabled, as etcd 3.5.1).
    pub fn who(&self, c: &Credentials) -> Result<Option<AuthInfo>, ServerError> {
        if c.server_itself {
            return Ok(Some(AuthInfo::server_itself()));
        }
        if c.token.is_none() && self.cfg.client_cert_auth {
            if let Some(cn) = &c.cert_cn {
                return Ok(Some(AuthInfo {
                    username: cn.clone(),
                    revision: self.auth.revision(),
                }));
            }
        }
        Ok(self.auth.info_from_token(c.token.as_deref())?)
    }

    /// etcd's `requireAuthInfo`: while auth is enabled, some user (any
    /// roles).
    fn require_user(&self, who: Option<&AuthInfo>) -> Result<(), ServerError> {
        if !self.auth.is_enabled() || who.is_some_and(|w| !w.username.is_empty()) {
            return Ok(());
        }
        Err(crate::auth::AuthError::UserEmpty.into())
    }

    /// etcd's `IsAdminPermitted`: while auth is enabled, a user with the
    /// root role.
    fn require_root(&self, who: Option<&AuthInfo>) -> Result<(), ServerError> {
        Ok(self.auth.check_admin(who)?)
    }

    /// Stops the raft thread after a durable backend commit.
    pub async fn stop(&self) {
        self.proposer.stop().await
    }
}

/// The error for an apply result of the wrong kind (a broken invariant).
fn unexpected(r: ApplyResult) -> ServerError {
    ServerError::internal(format!("retcd: unexpected apply result {r:?}"))
}

/// etcd's `monitorLeader` (`v3rpc/interceptor.go`): every election timeout
/// (ticks × heartbeat, as etcd computes it) the member looks for a leader;
/// once it has found none three times in a row, it signals the streams
/// that asked for one, and again at each timeout until a leader is back.
/// Cancelling a stream costs its client a reconnect, so this waits longer
/// than the refusal of a new call, which needs no leader at that instant.
async fn monitor_leader(server: std::sync::Weak<EtcdServer>, every: Duration) {
    const MAX_NO_LEADER: u32 = 3;
    let mut no_leader = 0;
    loop {
        tokio::time::sleep(every).await;
        let Some(server) = server.upgrade() else {
            return;
        };
        if server.leader() == 0 {
            no_leader += 1;
        } else {
            no_leader = 0;
        }
        if no_leader >= MAX_NO_LEADER {
            server.leader_lost.send_modify(|n| *n += 1);
        }
    }
}
