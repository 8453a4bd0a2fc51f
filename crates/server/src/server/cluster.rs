//! Membership requests (etcd's `AddMember`, `RemoveMember`,
//! `UpdateMember`, `PromoteMember`, `MoveLeader`) and this member's publish.
//! The rules applied to a committed change, on every member, are
//! `apply::membership`'s; here are the checks the member that takes the
//! request makes before proposing, with `--strict-reconfig-check` (would
//! the change leave fewer started voters than a quorum, or break an active
//! quorum — peers connected for at least [`HEALTH_INTERVAL`]? A promote
//! also needs the learner's match index within 90% of the leader's, which
//! only the leader knows, so another member forwards it to the leader).

use super::EtcdServer;
use crate::apply::membership::{is_started, ConfChangeContext};
use crate::auth::Credentials;
use crate::config::split_urls;
use crate::error::ServerError;
use crate::ids::{new_member_id, Hex};
use crate::raft::transport::with_cluster_id;
use prost::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType};
use retcd_api::etcdserverpb::MemberPromoteRequest;
use retcd_api::retcdpb::internal_raft_request::Request;
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::{Member, MemberAttributes};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long peers must have been connected for a reconfiguration to be
/// considered safe (etcd's `HealthInterval`).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// A learner may be promoted when its match index is at least this share of
/// the leader's (etcd's `readyPercent`).
const READY_PERCENT: f64 = 0.9;

/// etcd's `types.NewURLs` checks, as Go's `url.Parse` and
/// `net.SplitHostPort` make them: at least one URL; each (spaces trimmed)
/// with a scheme of http, https, unix or unixs (any case), `host:port`
/// (either may be empty; a port is digits) and no path (a query or a
/// fragment may follow). Sorted, as etcd keeps them, with the scheme in
/// lower case (Go's `url.Parse`).
pub fn validate_peer_urls(urls: &[String]) -> Result<Vec<String>, ServerError> {
    if urls.is_empty() {
        return Err(ServerError::MemberBadUrls);
    }
    let mut out = Vec::with_capacity(urls.len());
    for u in urls {
        let u = u.trim();
        let (scheme, rest) = u.split_once("://").ok_or(ServerError::MemberBadUrls)?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if !go_url_host_ok(host) {
            return Err(ServerError::MemberBadUrls);
        }
        let path = tail.split(['?', '#']).next().unwrap_or("");
        let scheme_ok = matches!(
            scheme.to_ascii_lowercase().as_str(),
            "http" | "https" | "unix" | "unixs"
        );
        if !scheme_ok || !split_host_port(host) || !path.is_empty() {
            return Err(ServerError::MemberBadUrls);
        }
        // as `url.URL.String()` writes it back: the scheme in lower case
        out.push(format!("{}://{rest}", scheme.to_ascii_lowercase()));
    }
    out.sort();
    Ok(out)
}

/// Go's `url.Parse` on a host: an IPv6 literal in brackets, followed by
/// nothing or `:digits`; otherwise what follows the last `:` is digits.
fn go_url_host_ok(host: &str) -> bool {
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if let Some(inner) = host.strip_prefix('[') {
        return match inner.split_once(']') {
            Some((_, "")) => true,
            Some((_, after)) => after.strip_prefix(':').is_some_and(digits),
            None => false,
        };
    }
    host.rsplit_once(':').is_none_or(|(_, p)| digits(p))
}

/// Go's `net.SplitHostPort` succeeds: `host:port` with one colon, or
/// `[host]:port`.
fn split_host_port(hp: &str) -> bool {
    if hp.starts_with('[') {
        return hp
            .split_once("]:")
            .is_some_and(|(h, p)| !h[1..].contains(']') && !p.contains(':'));
    }
    hp.matches(':').count() == 1
}

impl EtcdServer {
    /// Proposes a membership change and waits until it is applied here
    /// (etcd's `configure`); a timeout says why, as a proposal's does.
    async fn configure(&self, cc: ConfChange) -> Result<(), ServerError> {
        let start = std::time::Instant::now();
        match self.proposer.propose_conf_change(cc).await {
            Err(ServerError::Timeout) => Err(self.propose_timed_out(start)),
            r => r,
        }
    }

    /// MemberAdd: a new, unstarted member (no name until it publishes). Its
    /// ID is derived as etcd derives it, from its peer URLs and the current
    /// time. Returns the member and the list after the change.
    pub async fn member_add(
        &self,
        peer_urls: &[String],
        is_learner: bool,
        creds: &Credentials,
    ) -> Result<(Member, Vec<Member>), ServerError> {
        let urls = validate_peer_urls(peer_urls)?;
        self.require_root(self.who(creds)?.as_ref())?;
        let m = Member {
            id: new_member_id(&urls, now_unix_secs()),
            name: String::new(),
            peer_urls: urls,
            client_urls: vec![],
            is_learner,
        };
        self.may_add_member(is_learner)?;
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
        self.configure(conf_change(ty, m.id, Some(ctx))).await?;
        Ok((m, self.members()))
    }

    /// MemberRemove. Removing the leader first hands leadership to another
    /// started voter (best effort), so the cluster does not wait out an
    /// election timeout.
    pub async fn member_remove(
        &self,
        id: u64,
        creds: &Credentials,
    ) -> Result<Vec<Member>, ServerError> {
        self.require_root(self.who(creds)?.as_ref())?;
        self.may_remove_member(id)?;
        if id == self.leader() {
            self.hand_off_leadership(id).await;
        }
        self.configure(conf_change(ConfChangeType::RemoveNode, id, None))
            .await?;
        Ok(self.members())
    }

    /// MemberUpdate: new peer URLs, kept in the order given (etcd does
    /// not normalise them here), but refused when empty or malformed (etcd
    /// 3.5 would store them and every peer sender would fail on them).
    pub async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
        creds: &Credentials,
    ) -> Result<Vec<Member>, ServerError> {
        // As etcd: who may first. A change for an unknown member is
        // proposed as etcd proposes it (its apply answers NotFound, and
        // the raft log grows as etcd's). The URLs of a member that exists
        // are checked before proposing, which etcd does not do at all:
        // retcd refuses what etcd would store and then fail to dial.
        self.require_root(self.who(creds)?.as_ref())?;
        if self.members().iter().any(|m| m.id == id) {
            validate_peer_urls(&peer_urls)?;
        }
        let ctx = ConfChangeContext {
            member: Some(Member {
                id,
                peer_urls,
                ..Default::default()
            }),
            is_promote: false,
            is_update: true,
        };
        self.configure(conf_change(ConfChangeType::AddNode, id, Some(ctx)))
            .await?;
        Ok(self.members())
    }

    /// MemberList: any user (etcd 3.5.29+); after a ReadIndex when asked
    /// to be linearizable (etcd 3.5).
    pub async fn member_list(
        &self,
        linearizable: bool,
        creds: &Credentials,
    ) -> Result<Vec<Member>, ServerError> {
        if linearizable {
            self.linearizable_read_notify().await?;
        }
        self.require_user(self.who(creds)?.as_ref())?;
        Ok(self.members())
    }

    /// MemberPromote, here on the leader or forwarded to it (only the
    /// leader knows whether the learner has caught up), as etcd does.
    /// Returns the member list (the leader's, when forwarded) once this
    /// member has applied the promote too (read-your-writes, bounded by the
    /// request timeout).
    pub async fn member_promote(
        &self,
        id: u64,
        creds: &Credentials,
    ) -> Result<Vec<retcd_api::etcdserverpb::Member>, ServerError> {
        // on the member that took the request, before any forwarding
        self.require_root(self.who(creds)?.as_ref())?;
        match self.promote_here(id).await {
            Ok(ms) => Ok(ms.iter().map(crate::apply::membership::to_pb).collect()),
            Err(ServerError::NotLeader) => {
                let ms = self.promote_on_leader(id).await?;
                let deadline = Instant::now() + self.request_timeout();
                while Instant::now() < deadline && self.members.is_learner(id) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(ms)
            }
            Err(e) => Err(e),
        }
    }

    /// MemberPromote on this member; `NotLeader` when it is not the leader.
    async fn promote_here(&self, id: u64) -> Result<Vec<Member>, ServerError> {
        let r = self.promote_here_uncounted(id).await;
        // etcd counts the promotions the leader handled
        match &r {
            Ok(_) => self.metrics.learner_promote_successes.inc(),
            Err(ServerError::NotLeader) => {}
            Err(e) => self.metrics.learner_promote_failed(&e.to_string()),
        }
        r
    }

    async fn promote_here_uncounted(&self, id: u64) -> Result<Vec<Member>, ServerError> {
        self.may_promote_member(id).await?;
        let ctx = ConfChangeContext {
            member: Some(Member {
                id,
                ..Default::default()
            }),
            is_promote: true,
            is_update: false,
        };
        self.configure(conf_change(ConfChangeType::AddNode, id, Some(ctx)))
            .await?;
        Ok(self.members())
    }

    /// A promote another member forwarded here (it authorized the
    /// caller): `NotLeader` unless this member leads.
    pub async fn member_promote_for_peer(
        &self,
        id: u64,
    ) -> Result<Vec<retcd_api::etcdserverpb::Member>, ServerError> {
        let ms = self.promote_here(id).await?;
        Ok(ms.iter().map(crate::apply::membership::to_pb).collect())
    }

    /// Forwards a promote to the leader's peer URLs until it answers or
    /// the request timeout passes (etcd's peer `/members/promote/<id>`).
    async fn promote_on_leader(
        &self,
        id: u64,
    ) -> Result<Vec<retcd_api::etcdserverpb::Member>, ServerError> {
        let deadline = Instant::now() + self.request_timeout();
        let mut last = ServerError::Timeout;
        // Final answers of the leader; anything else is retried.
        let final_answers = [
            ServerError::LearnerNotReady,
            ServerError::MemberNotFound,
            ServerError::MemberNotLearner,
        ];
        while Instant::now() < deadline {
            let leader = self.leader();
            if leader == self.member_id {
                match self.promote_here(id).await {
                    Ok(ms) => return Ok(ms.iter().map(crate::apply::membership::to_pb).collect()),
                    Err(ServerError::NotLeader) => {}
                    Err(e) => return Err(e),
                }
            } else if leader != 0 {
                let urls = self.member(leader).map(|m| m.peer_urls).unwrap_or_default();
                for url in urls {
                    let Ok(dial) = self.dialer.peer(&url) else {
                        continue;
                    };
                    let timeout = self.request_timeout();
                    let dial = dial.configure(|ep| {
                        ep.connect_timeout(Duration::from_secs(1)).timeout(timeout)
                    });
                    let Ok(ch) = dial.connect().await else {
                        continue;
                    };
                    let req = with_cluster_id(MemberPromoteRequest { id }, self.cluster_id);
                    match RaftPeerClient::new(ch).member_promote(req).await {
                        Ok(r) => return Ok(r.into_inner().members),
                        Err(st) => {
                            if let Some(e) =
                                final_answers.iter().find(|e| e.to_string() == st.message())
                            {
                                return Err(e.clone());
                            }
                            last = ServerError::Remote {
                                code: st.code(),
                                message: st.message().to_string(),
                            };
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last)
    }

    /// etcd's `MoveLeader`: on the leader only, to a voting member; waits
    /// (polling every heartbeat, bounded by the request timeout) until the
    /// transferee leads.
    pub async fn move_leader(&self, target: u64, creds: &Credentials) -> Result<(), ServerError> {
        self.require_root(self.who(creds)?.as_ref())?;
        if self.leader() != self.member_id {
            return Err(ServerError::NotLeader);
        }
        if self.member(target).is_none_or(|m| m.is_learner) {
            return Err(ServerError::BadLeaderTransferee);
        }
        tracing::info!(transferee = %Hex(target), "leadership transfer starting");
        let started = Instant::now();
        let tick = Duration::from_millis(self.cfg.heartbeat_interval.max(1));
        let deadline = started + self.request_timeout();
        self.proposer.transfer_leadership(target)?;
        let mut last_ask = Instant::now();
        while self.leader() != target {
            if Instant::now() >= deadline {
                return Err(ServerError::LeaderTransferTimeout);
            }
            // raft-rs gives up a transfer after an election timeout; ask
            // again while we still lead.
            if last_ask.elapsed() >= Duration::from_millis(self.cfg.election_timeout)
                && self.leader() == self.member_id
            {
                self.proposer.transfer_leadership(target)?;
                last_ask = Instant::now();
            }
            tokio::time::sleep(tick).await;
        }
        tracing::info!(transferee = %Hex(target), took = %crate::log::GoDuration(started.elapsed()), "leadership transfer finished");
        Ok(())
    }

    /// etcd's `Server.Stop`: a leader stopping hands leadership to the most
    /// caught-up started voter first, so clients see a new leader within a
    /// heartbeat or two instead of after an election timeout.
    pub async fn transfer_leadership_on_stop(&self) {
        if self.leader() != self.member_id {
            return;
        }
        let voters = self.members().iter().filter(|m| !m.is_learner).count();
        if voters <= 1 {
            tracing::info!("skipped leadership transfer for single voting member cluster");
            return;
        }
        tracing::info!(local_member_id = %Hex(self.member_id), "leadership transfer starting");
        let started = Instant::now();
        self.hand_off_leadership(self.member_id).await;
        if self.leader() != self.member_id && self.leader() != 0 {
            tracing::info!(
                new_leader_id = %Hex(self.leader()),
                took = %crate::log::GoDuration(started.elapsed()),
                "leadership transfer finished"
            );
        } else {
            tracing::warn!(took = %crate::log::GoDuration(started.elapsed()), "leadership transfer failed");
        }
    }

    /// Moves leadership away from `leader` (about to be removed) to another
    /// started voter: the most caught-up one when this member leads, else
    /// any (raft forwards the transfer request to the leader). Bounded by
    /// two election timeouts; failure is not an error (the removal still
    /// works, with an election after it).
    async fn hand_off_leadership(&self, leader: u64) {
        let candidates: Vec<u64> = self
            .members()
            .iter()
            .filter(|m| m.id != leader && !m.is_learner && is_started(m))
            .map(|m| m.id)
            .collect();
        let progress = self
            .proposer
            .progress()
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
        tracing::info!(from = %Hex(leader), to = %Hex(target), "moving leadership off a member being removed");
        if self.proposer.transfer_leadership(target).is_err() {
            return;
        }
        let deadline = Instant::now() + 2 * Duration::from_millis(self.cfg.election_timeout);
        while self.leader() == leader && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(self.cfg.heartbeat_interval.max(1))).await;
        }
    }

    /// etcd's `numConnectedSince`: this member plus the members whose
    /// stream has been up for at least [`HEALTH_INTERVAL`].
    fn num_connected_since(&self, members: &[Member]) -> usize {
        let Some(since) = Instant::now().checked_sub(HEALTH_INTERVAL) else {
            return 1;
        };
        members
            .iter()
            .filter(|m| {
                m.id == self.member_id
                    || self
                        .transport
                        .active_since(m.id)
                        .is_some_and(|t| t <= since)
            })
            .count()
    }

    /// etcd's `mayAddMember`.
    fn may_add_member(&self, is_learner: bool) -> Result<(), ServerError> {
        if !self.cfg.strict_reconfig_check {
            return Ok(());
        }
        let voters = voters(&self.members());
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
        if self.num_connected_since(&voters) != voters.len() {
            return Err(ServerError::Unhealthy);
        }
        Ok(())
    }

    /// etcd's `mayRemoveMember`.
    fn may_remove_member(&self, id: u64) -> Result<(), ServerError> {
        if !self.cfg.strict_reconfig_check {
            return Ok(());
        }
        let members = self.members();
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
        if id != self.member_id && self.transport.active_since(id).is_none() {
            return Ok(());
        }
        let active = self.num_connected_since(&voters);
        if active < 1 + 1 + voters.len().saturating_sub(1) / 2 {
            return Err(ServerError::Unhealthy);
        }
        Ok(())
    }

    /// etcd's `isLearnerReady` + `IsReadyToPromoteMember`. Only the leader
    /// knows the learner's progress: elsewhere this is `NotLeader`.
    async fn may_promote_member(&self, id: u64) -> Result<(), ServerError> {
        let progress = self
            .proposer
            .progress()
            .await?
            .ok_or(ServerError::NotLeader)?;
        if let Some((_, learner_match)) = progress.iter().find(|(pid, _)| *pid == id) {
            let leader_match = progress
                .iter()
                .find(|(pid, _)| *pid == self.member_id)
                .map(|p| p.1)
                .unwrap_or(0);
            if (*learner_match as f64) < leader_match as f64 * READY_PERCENT {
                return Err(ServerError::LearnerNotReady);
            }
        }
        if !self.cfg.strict_reconfig_check {
            return Ok(());
        }
        let voters = voters(&self.members());
        let nmembers = voters.len() + 1;
        let nstarted = voters.iter().filter(|m| is_started(m)).count() + 1;
        if nstarted < nmembers / 2 + 1 {
            return Err(ServerError::MemberNotEnoughStarted);
        }
        Ok(())
    }
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
            match server
                .propose(Request::MemberAttributes(attrs.clone()))
                .await
            {
                Ok(_) => {
                    let cv = crate::config::version::cluster_version(&server.cfg.etcd_version);
                    let cv = cv.trim_end_matches(".0");
                    tracing::info!(cluster_version = cv, "enabled capabilities for version");
                    tracing::info!(
                        local_member_id = %crate::ids::Hex(server.member_id),
                        local_member_attributes = %format!("{{Name:{} ClientURLs:[{}]}}", attrs.name, attrs.client_urls.join(" ")),
                        cluster_id = %crate::ids::Hex(server.cluster_id),
                        publish_timeout = %crate::log::GoDuration(server.request_timeout()),
                        "published local member to cluster through raft"
                    );
                    server.published.send_replace(true);
                    return;
                }
                Err(ServerError::Stopped) => return,
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

fn conf_change(ty: ConfChangeType, id: u64, ctx: Option<ConfChangeContext>) -> ConfChange {
    let mut cc = ConfChange::default();
    cc.set_change_type(ty);
    cc.node_id = id;
    if let Some(c) = ctx {
        cc.context = c.encode_to_vec().into();
    }
    cc
}

#[cfg(test)]
mod tests {
    use super::validate_peer_urls;

    fn ok(u: &str) -> bool {
        validate_peer_urls(&[u.to_string()]).is_ok()
    }

    /// Each as etcd 3.4.23's MemberAdd answered it (types.NewURLs).
    #[test]
    fn peer_urls_are_checked_as_etcd_checks_them() {
        for u in [
            "http://127.0.0.1:2380",
            " https://h:1 ",
            "http://h:1?q",
            "http://:1",
            "http://h:",
            "https://[::1]:99999",
            "HTTP://h:1",
            "http://h:1#f",
            "unix://h:1",
        ] {
            assert!(ok(u), "{u} must be accepted");
        }
        for u in [
            "",
            "not a url",
            "127.0.0.1:2380",
            "http://",
            "http://h",
            "http://h:1/",
            "http://h:1/path?q",
            "http://h:1:2",
            "http://h:abc",
            "http://[::1",
            "ftp://127.0.0.1:3",
            "unix://h:abc",
            "unix:///tmp/x",
            "unixs://anything/at/all",
        ] {
            assert!(!ok(u), "{u} must be refused");
        }
        assert!(validate_peer_urls(&[]).is_err());
        // Go's url.Parse lower-cases the scheme (and keeps the rest)
        assert_eq!(
            validate_peer_urls(&[" HTTP://A:1?q ".into(), "http://b:2".into()]).unwrap(),
            ["http://A:1?q", "http://b:2"]
        );
    }
}
