//! The member list as the state machine keeps it: persisted in the
//! backend's `members` table, changed only by applied entries (conf
//! changes and each member's publish of its name and client URLs). The
//! request side (MemberAdd and friends, the strict reconfiguration checks,
//! publish, joining) is `server::cluster`.
//!
//! Membership changes (etcd's `AddMember`, `RemoveMember`, `UpdateMember`,
//! `PromoteMember`) are raft `ConfChange`s (v1) whose context is a
//! [`ConfChangeContext`]. They are checked twice, as etcd does:
//! * before proposing, on the member that got the request, with
//!   `--strict-reconfig-check`: would the change leave fewer started voters
//!   than a quorum, or break an active quorum (peers connected for at least
//!   `server::cluster::HEALTH_INTERVAL`, 5 s)? A promote also needs the learner's match index
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

use super::ApplyResult;
use crate::error::ServerError;
use parking_lot::RwLock;
use prost::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeType};
use redb::{ReadableDatabase, ReadableTable};
use retcd_api::retcdpb::{Member, MemberAttributes};
use retcd_mvcc::{MvccError, WriteBatch};
use retcd_storage::backend::{Backend, MEMBERS};

/// The applied member list, sorted by id.
#[derive(Debug, Default)]
pub struct Members {
    /// Protects the list. Written by the raft thread's apply (conf
    /// changes, publishes, a snapshot restore); read by the services, the
    /// peer service and the strict reconfiguration checks. Never held
    /// across I/O or `.await`.
    inner: RwLock<Vec<Member>>,
}

impl Members {
    pub fn new(mut list: Vec<Member>) -> Members {
        list.sort_by_key(|m| m.id);
        Members {
            inner: RwLock::new(list),
        }
    }

    /// A copy of the list (etcd's `Members()`).
    pub fn list(&self) -> Vec<Member> {
        self.inner.read().clone()
    }

    pub fn get(&self, id: u64) -> Option<Member> {
        self.inner.read().iter().find(|m| m.id == id).cloned()
    }

    /// Whether `id` is a learner (false while it is not a member at all,
    /// as etcd's `IsMemberExist && IsLearner`).
    pub fn is_learner(&self, id: u64) -> bool {
        self.inner.read().iter().any(|m| m.id == id && m.is_learner)
    }

    /// Replaces the list (a snapshot from the leader).
    pub fn replace(&self, mut list: Vec<Member>) {
        list.sort_by_key(|m| m.id);
        *self.inner.write() = list;
    }
}

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

/// What an applied membership change did; the raft thread updates raft-rs
/// and the transport from it.
#[derive(Debug, Clone)]
pub enum Change {
    Added(Member),
    Promoted(u64),
    Removed(u64),
    Updated(Member),
}

/// The members a new cluster starts with, from `--initial-cluster` and
/// `--initial-cluster-token` (IDs as etcd derives them), sorted by id, with
/// this member's id (`--name`) and the cluster id.
pub fn initial_cluster(cfg: &crate::config::Config) -> anyhow::Result<(Vec<Member>, u64, u64)> {
    let initial = cfg.initial_members().map_err(anyhow::Error::msg)?;
    let mut members: Vec<Member> = initial
        .iter()
        .map(|m| Member {
            id: crate::ids::member_id(&m.peer_urls, &cfg.initial_cluster_token),
            name: m.name.clone(),
            peer_urls: m.peer_urls.clone(),
            client_urls: vec![],
            is_learner: false,
        })
        .collect();
    members.sort_by_key(|m| m.id);
    let member_id = members
        .iter()
        .find(|m| m.name == cfg.name)
        .map(|m| m.id)
        .ok_or_else(|| anyhow::anyhow!("member {:?} is not in --initial-cluster", cfg.name))?;
    let cluster_id = crate::ids::cluster_id(&members.iter().map(|m| m.id).collect::<Vec<_>>());
    Ok((members, member_id, cluster_id))
}

/// A member as the Cluster service answers it.
pub fn to_pb(m: &Member) -> retcd_api::etcdserverpb::Member {
    retcd_api::etcdserverpb::Member {
        id: m.id,
        name: m.name.clone(),
        peer_ur_ls: m.peer_urls.clone(),
        client_ur_ls: m.client_urls.clone(),
        is_learner: m.is_learner,
    }
}

/// A started member has published its name (etcd's `IsStarted`).
pub fn is_started(m: &Member) -> bool {
    !m.name.is_empty()
}

/// Checks a committed membership `ConfChange` against the current member
/// list and applies it to `members` and the batch's `members` table.
/// The outer error is a backend failure (fatal); the inner one a rejected
/// change (the same on every member).
pub fn apply_conf_change(
    members: &Members,
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
                return Ok(Err(ServerError::internal(
                    "retcd: undecodable conf change context",
                )))
            }
        }
    };
    let id = cc.node_id;
    let mut members = members.inner.write();
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
                return Ok(Err(ServerError::internal(
                    "retcd: conf change without its member",
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
    let mut table = super::backend_txn(batch).open_table(MEMBERS)?;
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

/// `--force-new-cluster`: the stored member list becomes this member
/// alone, as a voter (etcd's `restartAsStandaloneNode` removes the
/// others).
pub fn force_single(
    backend: &Backend,
    members: &[Member],
    member_id: u64,
) -> anyhow::Result<Vec<Member>> {
    let mut me = members
        .iter()
        .find(|m| m.id == member_id)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("{}", ServerError::RemovedMember))?;
    me.is_learner = false;
    let txn = backend.db().begin_write()?;
    {
        let mut table = txn.open_table(MEMBERS)?;
        let ids: Vec<u64> = table
            .iter()?
            .filter_map(|e| e.ok().map(|(k, _)| k.value()))
            .collect();
        for id in ids {
            if id != member_id {
                table.remove(id)?;
            }
        }
        table.insert(member_id, me.encode_to_vec().as_slice())?;
    }
    txn.commit()?;
    Ok(vec![me])
}

/// Applies a publish: updates the member in memory and in the batch's
/// backend transaction. Unknown members are ignored (removed meanwhile).
pub fn apply_attributes(
    members: &Members,
    batch: &mut WriteBatch<'_>,
    attrs: MemberAttributes,
) -> Result<ApplyResult, MvccError> {
    let mut members = members.inner.write();
    if let Some(m) = members.iter_mut().find(|m| m.id == attrs.member_id) {
        m.name = attrs.name;
        m.client_urls = attrs.client_urls;
    }
    let mut table = super::backend_txn(batch).open_table(MEMBERS)?;
    for m in members.iter() {
        table.insert(m.id, m.encode_to_vec().as_slice())?;
    }
    Ok(ApplyResult::Empty)
}

#[cfg(test)]
mod tests {
    //! The rules a committed membership change is checked against, on
    //! every member (etcd's `ValidateConfigurationChange`).
    use super::*;
    use retcd_mvcc::KvStore;
    use retcd_storage::backend::Backend;
    use std::sync::Arc;

    fn member(id: u64, url: &str, learner: bool) -> Member {
        Member {
            id,
            name: format!("m{id}"),
            peer_urls: vec![url.to_string()],
            client_urls: vec![],
            is_learner: learner,
        }
    }

    fn cc(ty: ConfChangeType, id: u64, ctx: Option<ConfChangeContext>) -> ConfChange {
        let mut c = ConfChange::default();
        c.set_change_type(ty);
        c.node_id = id;
        if let Some(ctx) = ctx {
            c.context = ctx.encode_to_vec().into();
        }
        c
    }

    fn add(m: Member) -> ConfChange {
        let ty = if m.is_learner {
            ConfChangeType::AddLearnerNode
        } else {
            ConfChangeType::AddNode
        };
        let id = m.id;
        cc(
            ty,
            id,
            Some(ConfChangeContext {
                member: Some(m),
                ..Default::default()
            }),
        )
    }

    struct Env {
        _dir: tempfile::TempDir,
        kv: Arc<KvStore>,
        members: Members,
    }

    fn env() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
        Env {
            _dir: dir,
            kv: Arc::new(KvStore::open(backend).unwrap()),
            members: Members::new(vec![member(1, "http://a:1", false)]),
        }
    }

    impl Env {
        fn apply(&self, c: &ConfChange) -> Result<Change, ServerError> {
            let mut batch = self.kv.begin_batch().unwrap();
            let res = apply_conf_change(&self.members, &mut batch, c, 1).unwrap();
            batch.commit(false).unwrap();
            res
        }
    }

    #[test]
    fn test_add_checks_id_urls_and_learners() {
        let e = env();
        assert!(matches!(
            e.apply(&add(member(1, "http://x:1", false))),
            Err(ServerError::MemberExist)
        ));
        assert!(matches!(
            e.apply(&add(member(2, "http://a:1", false))),
            Err(ServerError::PeerUrlExist)
        ));
        assert!(matches!(
            e.apply(&add(member(2, "http://b:1", true))),
            Ok(Change::Added(m)) if m.is_learner
        ));
        // --max-learners 1
        assert!(matches!(
            e.apply(&add(member(3, "http://c:1", true))),
            Err(ServerError::TooManyLearners)
        ));
        // an add whose context does not carry the member is refused
        assert!(matches!(
            e.apply(&cc(ConfChangeType::AddNode, 4, None)),
            Err(ServerError::Internal { .. })
        ));
        let ids: Vec<u64> = e.members.list().iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![1, 2]);
        // the whole list is in the backend
        let stored: Vec<u64> = load(e.kv.backend()).unwrap().iter().map(|m| m.id).collect();
        assert_eq!(stored, vec![1, 2]);
    }

    #[test]
    fn test_promote_remove_update_rules() {
        let e = env();
        e.apply(&add(member(2, "http://b:1", true))).unwrap();
        let promote = |id| {
            cc(
                ConfChangeType::AddNode,
                id,
                Some(ConfChangeContext {
                    member: Some(Member {
                        id,
                        ..Default::default()
                    }),
                    is_promote: true,
                    is_update: false,
                }),
            )
        };
        assert!(matches!(
            e.apply(&promote(1)),
            Err(ServerError::MemberNotLearner)
        ));
        assert!(matches!(
            e.apply(&promote(9)),
            Err(ServerError::MemberNotFound)
        ));
        assert!(matches!(e.apply(&promote(2)), Ok(Change::Promoted(2))));
        assert!(!e.members.is_learner(2));
        let update = |id, url: &str| {
            cc(
                ConfChangeType::AddNode,
                id,
                Some(ConfChangeContext {
                    member: Some(Member {
                        id,
                        peer_urls: vec![url.to_string()],
                        ..Default::default()
                    }),
                    is_promote: false,
                    is_update: true,
                }),
            )
        };
        assert!(matches!(
            e.apply(&update(2, "http://a:1")),
            Err(ServerError::PeerUrlExist)
        ));
        assert!(matches!(
            e.apply(&update(9, "http://z:1")),
            Err(ServerError::MemberNotFound)
        ));
        assert!(matches!(
            e.apply(&update(2, "http://b:2")),
            Ok(Change::Updated(_))
        ));
        assert_eq!(e.members.get(2).unwrap().peer_urls, vec!["http://b:2"]);
        assert!(matches!(
            e.apply(&cc(ConfChangeType::RemoveNode, 9, None)),
            Err(ServerError::MemberNotFound)
        ));
        assert!(matches!(
            e.apply(&cc(ConfChangeType::RemoveNode, 2, None)),
            Ok(Change::Removed(2))
        ));
        assert!(e.members.get(2).is_none());
        let stored: Vec<u64> = load(e.kv.backend()).unwrap().iter().map(|m| m.id).collect();
        assert_eq!(stored, vec![1], "the removed member left the table");
    }

    #[test]
    fn test_undecodable_context_is_refused() {
        let e = env();
        let mut c = cc(ConfChangeType::AddNode, 5, None);
        c.context = vec![0xff, 0xff, 0xff].into();
        assert!(matches!(e.apply(&c), Err(ServerError::Internal { .. })));
    }
}
