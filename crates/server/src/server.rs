//! `EtcdServer`: bootstrap (WAL + backend + raft), propose-and-wait, and
//! linearizable reads. The gRPC services are thin layers over this.

use crate::apply::ApplyResult;
use crate::config::Config;
use crate::error::ServerError;
use crate::ids;
use crate::raft_node::{RaftInput, RaftNode, RaftNodeConfig};
use crate::raft_storage::RaftStorage;
use crate::transport::Transport;
use anyhow::Context;
use parking_lot::{Mutex, RwLock};
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfState, Entry, HardState, SnapshotMetadata};
use retcd_api::etcdserverpb::ResponseHeader;
use retcd_api::retcdpb::{InternalRaftRequest, Member, WalMetadata};
use retcd_mvcc::KvStore;
use retcd_storage::backend::Backend;
use retcd_storage::wal::Wal;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

/// Waiters for proposals, by request id.
#[derive(Default)]
pub struct Wait {
    /// Protects the map of request id → the proposer's reply channel.
    /// Held only to insert or remove; never across I/O or `.await`.
    pub waiters: Mutex<HashMap<u64, oneshot::Sender<Result<ApplyResult, ServerError>>>>,
}

/// State the raft thread publishes for everyone else (lock-free reads).
pub struct Shared {
    pub wait: Wait,
    pub metrics: crate::metrics::Metrics,
    /// Protects the member list. Written by the apply path (publish, and
    /// later membership changes); read by MemberList and the transport.
    pub members: RwLock<Vec<Member>>,
    pub term: AtomicU64,
    pub leader: AtomicU64,
    pub is_leader: AtomicBool,
    pub commit_index: AtomicU64,
    pub applied_index: AtomicU64,
    pub raft_index: AtomicU64,
    /// Every lease and its keys; primary (expiring) on the leader only.
    pub lessor: Arc<retcd_lease::Lessor>,
    /// The watchers; fed by the raft thread after each commit.
    pub watch: Arc<retcd_mvcc::WatchableStore>,
    /// Raised alarms (NOSPACE, CORRUPT); changed only by applied entries.
    pub alarms: crate::alarm::AlarmStore,
    /// Users, roles and tokens; changed only by applied entries.
    pub auth: crate::auth::AuthStore,
    /// Requests waiting for the raft thread: whether spinning pays.
    pub contention: crate::spin::Contention,
}

pub struct EtcdServer {
    pub cfg: Config,
    pub member_id: u64,
    pub cluster_id: u64,
    pub kv: Arc<KvStore>,
    pub backend: Arc<Backend>,
    pub shared: Arc<Shared>,
    /// The peer transport (membership checks read its peers' activity).
    pub transport: Transport,
    /// Protects the sending side of the raft thread's input queue.
    raft_tx: Mutex<mpsc::Sender<RaftInput>>,
    next_id: AtomicU64,
    request_timeout: Duration,
    /// Becomes true once this member's publish (name + client URLs) is
    /// applied; clients are served only from then on, as etcd does.
    pub published: tokio::sync::watch::Sender<bool>,
}

impl EtcdServer {
    /// Opens (or creates) the data dir, replays the WAL, starts the raft
    /// thread. `transport` must already be bound to the peer listener.
    pub fn start(cfg: Config, transport: Transport) -> anyhow::Result<Arc<EtcdServer>> {
        let token_provider = crate::auth::TokenProvider::from_flag(
            &cfg.auth_token,
            Duration::from_secs(cfg.auth_token_ttl),
        )
        .map_err(|e| anyhow::anyhow!("failed to create the token provider: {e}"))?;
        let wal_dir = cfg.wal_dir();
        std::fs::create_dir_all(cfg.snap_dir())
            .with_context(|| format!("cannot create data dir {}", cfg.snap_dir().display()))?;
        let backend = Arc::new(
            Backend::open(&cfg.backend_path())
                .map_err(|e| anyhow::anyhow!("cannot open backend: {e}"))?,
        );
        let metrics = crate::metrics::Metrics::new();
        let kv = Arc::new(
            KvStore::open_with(
                backend.clone(),
                retcd_mvcc::CompactionConfig {
                    batch_limit: cfg.experimental_compaction_batch_limit,
                    sleep_interval: cfg.experimental_compaction_sleep_interval,
                    observer: Some(Arc::new(crate::metrics::CompactionMetrics::of(&metrics))),
                },
            )
            .map_err(|e| anyhow::anyhow!("cannot open mvcc store: {e}"))?,
        );
        let storage = RaftStorage::new(kv.clone());

        let (wal, meta, mut snapshot_index) = if Wal::exists(&wal_dir) {
            let (wal, contents) = Wal::open(&wal_dir)
                .map_err(|e| anyhow::anyhow!("cannot open WAL in {}: {e}", wal_dir.display()))?;
            let meta = WalMetadata::decode(&contents.metadata[..])
                .context("WAL metadata record is not valid")?;
            let mut snapshot_index = 0;
            if let Some(s) = &contents.snapshot {
                let mut cs = ConfState::default();
                cs.merge_from_bytes(&s.payload)
                    .context("WAL snapshot record is not valid")?;
                storage.apply_snapshot_meta(snapshot_meta(s.index, s.term, cs));
                snapshot_index = s.index;
            } else if cfg.initial_cluster_state != "existing" {
                storage.set_conf_state(conf_state_of(&meta.members));
            }
            // else: a member joining an existing cluster that has not got
            // its first snapshot yet: empty configuration until it does.
            if let Some(h) = &contents.hard_state {
                let mut hs = HardState::default();
                hs.merge_from_bytes(h)
                    .context("WAL hard state is not valid")?;
                let mut cur = storage.hard_state();
                cur.term = cur.term.max(hs.term);
                cur.vote = hs.vote;
                cur.commit = cur.commit.max(hs.commit);
                storage.set_hard_state(cur);
            }
            let mut entries = Vec::with_capacity(contents.entries.len());
            for we in &contents.entries {
                let mut e = Entry::default();
                e.merge_from_bytes(&we.data)
                    .with_context(|| format!("WAL entry {} is not valid", we.index))?;
                entries.push(e);
            }
            storage.append(&entries);
            tracing::info!(
                member = %format!("{:x}", meta.member_id),
                entries = entries.len(),
                snapshot_index,
                "restarting from WAL"
            );
            (wal, meta, snapshot_index)
        } else {
            if kv.consistent_index() > 0 {
                anyhow::bail!(
                    "backend at {} has data but there is no WAL in {}",
                    cfg.backend_path().display(),
                    wal_dir.display()
                );
            }
            if cfg.initial_cluster_state == "existing" {
                // Joining: IDs and members come from the cluster; the log
                // starts empty and the leader sends a snapshot.
                let (cluster_id, member_id, members) = crate::membership::join_existing(&cfg)?;
                let meta = WalMetadata {
                    member_id,
                    cluster_id,
                    members,
                };
                let wal = Wal::create(&wal_dir, &meta.encode_to_vec()).map_err(|e| {
                    anyhow::anyhow!("cannot create WAL in {}: {e}", wal_dir.display())
                })?;
                tracing::info!(member = %format!("{:x}", member_id), cluster = %format!("{:x}", cluster_id), "joining existing cluster");
                (wal, meta, 0)
            } else {
                let initial = cfg.initial_members().map_err(anyhow::Error::msg)?;
                let mut members: Vec<Member> = initial
                    .iter()
                    .map(|m| Member {
                        id: ids::member_id(&m.peer_urls, &cfg.initial_cluster_token),
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
                    .expect("validated: local name is in the initial cluster");
                let cluster_id = ids::cluster_id(&members.iter().map(|m| m.id).collect::<Vec<_>>());
                let meta = WalMetadata {
                    member_id,
                    cluster_id,
                    members,
                };
                let mut wal = Wal::create(&wal_dir, &meta.encode_to_vec()).map_err(|e| {
                    anyhow::anyhow!("cannot create WAL in {}: {e}", wal_dir.display())
                })?;
                // A new cluster's log starts after a snapshot at index 1 (term
                // 1) holding the initial configuration, so a member added later
                // (empty log) can only catch up by snapshot, as in etcd, where
                // it would otherwise replay entries without the bootstrap
                // configuration.
                let cs = conf_state_of(&meta.members);
                wal.save_snapshot(&retcd_storage::wal::WalSnapshot {
                    index: 1,
                    term: 1,
                    payload: cs.write_to_bytes()?,
                })
                .map_err(|e| anyhow::anyhow!("cannot write snapshot record to the WAL: {e}"))?;
                storage.apply_snapshot_meta(snapshot_meta(1, 1, cs));
                tracing::info!(member = %format!("{:x}", member_id), cluster = %format!("{:x}", cluster_id), "bootstrapping new member");
                (wal, meta, 1)
            }
        };

        // The backend may be ahead of the hard state's commit (commit is
        // persisted lazily). It is ahead of the log's last index only when
        // the WAL lost fsynced records at its tail (a torn tail cut at a
        // record that was already applied): everything up to the consistent
        // index was committed, so the backend serves as a snapshot at that
        // index and the log restarts after it.
        let ci = kv.consistent_index();
        let last = storage.last_index_now();
        let mut wal = wal;
        if ci > last {
            tracing::warn!(
                consistent_index = ci,
                wal_last_index = last,
                "backend is ahead of the WAL; treating the backend as a snapshot at its consistent index"
            );
            let m = snapshot_meta(ci, kv.term(), storage.conf_state());
            let payload = m.get_conf_state().write_to_bytes()?;
            wal.save_snapshot(&retcd_storage::wal::WalSnapshot {
                index: ci,
                term: m.term,
                payload,
            })
            .map_err(|e| anyhow::anyhow!("cannot write snapshot record to the WAL: {e}"))?;
            storage.apply_snapshot_meta(m);
            snapshot_index = ci;
        }
        let applied = ci.max(storage.first_index_now() - 1);
        {
            let mut hs = storage.hard_state();
            if hs.commit < applied {
                hs.commit = applied;
                storage.set_hard_state(hs);
            }
        }
        let applied_term = if applied == 0 {
            0
        } else {
            raft::Storage::term(&storage, applied).unwrap_or(0)
        };
        storage.set_applied(applied, applied_term);

        // The backend's member list (kept current by applied publishes)
        // wins over the bootstrap list in the WAL metadata.
        let mut members = crate::membership::load(&backend)?;
        if members.is_empty() {
            members = meta.members.clone();
        } else {
            if !members.iter().any(|m| m.id == meta.member_id) {
                anyhow::bail!("the member has been permanently removed from the cluster");
            }
            // raft is restarted at the applied index, so conf changes
            // applied after the WAL's snapshot record are not replayed to
            // it: the configuration at the applied index is the member list
            // committed with it (kept in lockstep with raft's by apply).
            storage.set_conf_state(conf_state_of(&members));
        }

        let raft_cfg = raft::Config {
            id: meta.member_id,
            election_tick: cfg.election_ticks(),
            heartbeat_tick: 1,
            applied,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 512,
            check_quorum: true,
            pre_vote: cfg.pre_vote,
            read_only_option: raft::ReadOnlyOption::Safe,
            ..Default::default()
        };
        raft_cfg
            .validate()
            .map_err(|e| anyhow::anyhow!("raft config: {e}"))?;
        let logger = crate::log::raft_logger();
        let raw = raft::RawNode::new(&raft_cfg, storage.clone(), &logger)
            .map_err(|e| anyhow::anyhow!("cannot start raft: {e}"))?;

        // etcd's minTTL: ⌈(3 × election ticks / 2) × heartbeat⌉ in seconds.
        let min_ttl_ms = (3 * cfg.election_ticks() as u64 / 2) * cfg.heartbeat_interval;
        let request_timeout =
            Duration::from_secs(5) + 2 * Duration::from_millis(cfg.election_timeout);
        let lessor = Arc::new(retcd_lease::Lessor::new(
            retcd_lease::LessorConfig {
                min_lease_ttl: min_ttl_ms.div_ceil(1000) as i64,
                checkpoint_interval: cfg
                    .experimental_enable_lease_checkpoint
                    .then_some(cfg.experimental_lease_checkpoint_interval),
                expired_leases_retry_interval: request_timeout,
            },
            Arc::new(retcd_lease::SystemClock),
        ));
        lessor
            .recover(&kv)
            .map_err(|e| anyhow::anyhow!("cannot recover leases: {e}"))?;
        transport.set_lessor(lessor.clone());
        let shared = Arc::new(Shared {
            wait: Wait::default(),
            metrics,
            members: RwLock::new(members.clone()),
            term: AtomicU64::new(0),
            leader: AtomicU64::new(0),
            is_leader: AtomicBool::new(false),
            commit_index: AtomicU64::new(0),
            applied_index: AtomicU64::new(applied),
            raft_index: AtomicU64::new(0),
            lessor,
            watch: retcd_mvcc::WatchableStore::new(kv.clone()),
            alarms: crate::alarm::AlarmStore::load(&backend)
                .map_err(|e| anyhow::anyhow!("cannot load alarms: {e}"))?,
            auth: crate::auth::AuthStore::load(&backend, token_provider)
                .map_err(|e| anyhow::anyhow!("cannot load the auth store: {e}"))?,
            contention: Default::default(),
        });
        let (tx, rx) = mpsc::channel();
        transport.set_peers(meta.member_id, &members, tx.clone());

        let node = RaftNode {
            conf: crate::membership::ConfChangeState::new(cfg.max_learners),
            raw,
            storage,
            wal,
            kv: kv.clone(),
            shared: shared.clone(),
            transport: transport.clone(),
            rx,
            cfg: RaftNodeConfig {
                tick: Duration::from_millis(cfg.heartbeat_interval),
                snapshot_count: cfg.snapshot_count,
                catchup_entries: cfg.experimental_snapshot_catchup_entries,
                batch_interval: cfg.backend_batch_interval,
                batch_limit: cfg.backend_batch_limit,
                quota_bytes: (cfg.quota_backend_bytes >= 0).then(|| cfg.quota_bytes()),
            },
            snapshot_index,
            nospace_due: false,
            nospace_proposed: None,
        };
        std::thread::Builder::new()
            .name("raft".into())
            .spawn(move || node.run())
            .context("cannot spawn the raft thread")?;

        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let server = Arc::new(EtcdServer {
            published: tokio::sync::watch::Sender::new(false),
            member_id: meta.member_id,
            cluster_id: meta.cluster_id,
            kv,
            backend,
            shared,
            transport,
            raft_tx: Mutex::new(tx),
            // etcd's idutil: 16 bits of member id, then a time-seeded counter.
            next_id: AtomicU64::new(
                ((meta.member_id & 0xffff) << 48) | ((now_ms & 0xff_ffff_ffff) << 8),
            ),
            request_timeout,
            cfg,
        });
        tokio::spawn(crate::membership::publish(server.clone()));
        tokio::spawn(crate::grpc::lease::run_lessor(server.clone()));
        crate::compactor::start(&server)?;
        crate::corrupt::start(&server);
        Ok(server)
    }

    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.shared.term.load(Ordering::Acquire),
        }
    }

    fn send(&self, input: RaftInput) -> Result<(), ServerError> {
        self.raft_tx
            .lock()
            .send(input)
            .map_err(|_| ServerError::Stopped)
    }

    /// A fresh id from etcd's request id generator (also used for
    /// server-assigned lease IDs).
    pub fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) & ((1 << 48) - 1)
            | ((self.member_id & 0xffff) << 48)
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Who sent a gRPC request (etcd's `AuthInfoFromCtx`): the user its
    /// `token` (or `authorization`) metadata names, None without one.
    pub fn auth_info(
        &self,
        md: &tonic::metadata::MetadataMap,
    ) -> Result<Option<crate::auth::AuthInfo>, ServerError> {
        let token = md
            .get("token")
            .or_else(|| md.get("authorization"))
            .map(|v| v.to_str().unwrap_or_default());
        if token.is_none() && self.cfg.client_cert_auth {
            // etcd's AuthInfoFromTLS: without a token, the verified client
            // certificate's common name is the user.
            if let Some(cn) = md.get(crate::tls::CERT_CN_HEADER) {
                return Ok(Some(crate::auth::AuthInfo {
                    username: cn.to_str().unwrap_or_default().to_string(),
                    revision: self.shared.auth.revision(),
                }));
            }
        }
        Ok(self.shared.auth.info_from_token(token)?)
    }

    /// [`EtcdServer::propose`] on behalf of `who`: the apply checks its
    /// permissions while auth is enabled.
    pub async fn propose_as(
        &self,
        mut req: InternalRaftRequest,
        who: Option<crate::auth::AuthInfo>,
    ) -> Result<ApplyResult, ServerError> {
        if let Some(w) = who {
            req.username = w.username;
            req.auth_revision = w.revision;
        }
        self.propose(req).await
    }

    /// Proposes `req` through raft and waits until it is committed and
    /// applied on this member; the result is what the apply produced.
    pub async fn propose(&self, mut req: InternalRaftRequest) -> Result<ApplyResult, ServerError> {
        let id = self.next_request_id();
        req.id = id;
        let data = req.encode_to_vec();
        if data.len() as u64 > self.cfg.max_request_bytes {
            return Err(ServerError::RequestTooLarge);
        }
        let (tx, rx) = oneshot::channel();
        self.shared.wait.waiters.lock().insert(id, tx);
        let lone = self.shared.contention.enter();
        if let Err(e) = self.send(RaftInput::Propose { id, data }) {
            self.shared.wait.waiters.lock().remove(&id);
            return Err(e);
        }
        self.await_raft(rx, &lone, Some(id)).await
    }

    /// Waits until this member has applied everything committed before the
    /// call (ReadIndex). Concurrent callers share one ReadIndex.
    pub async fn linearizable_read_notify(&self) -> Result<(), ServerError> {
        let (tx, rx) = oneshot::channel();
        let lone = self.shared.contention.enter();
        self.send(RaftInput::ReadIndex(tx))?;
        self.await_raft(rx, &lone, None).await
    }

    /// Proposes a membership `ConfChange` and waits until it is applied
    /// here; a change rejected at apply (unknown member, URL in use, ...)
    /// returns its error.
    pub async fn propose_conf_change(&self, mut cc: ConfChange) -> Result<(), ServerError> {
        let id = self.next_request_id();
        cc.id = id;
        let (tx, rx) = oneshot::channel();
        self.shared.wait.waiters.lock().insert(id, tx);
        let lone = self.shared.contention.enter();
        if let Err(e) = self.send(RaftInput::ProposeConfChange { id, cc }) {
            self.shared.wait.waiters.lock().remove(&id);
            return Err(e);
        }
        match self.await_raft(rx, &lone, Some(id)).await? {
            ApplyResult::Err(e) => Err(e),
            _ => Ok(()),
        }
    }

    /// The raft thread's answer on `rx`: spun for while this is a lone
    /// request (see `crate::spin`), else awaited up to the request timeout.
    /// On timeout the waiter registered under `waiter` is dropped.
    async fn await_raft<T>(
        &self,
        mut rx: oneshot::Receiver<Result<T, ServerError>>,
        lone: &crate::spin::Waiting<'_>,
        waiter: Option<u64>,
    ) -> Result<T, ServerError> {
        if let Some(res) = lone.spin(&mut rx) {
            return res.unwrap_or(Err(ServerError::Stopped));
        }
        match tokio::time::timeout(self.request_timeout, rx).await {
            Ok(Ok(res)) => res,
            Ok(Err(_)) => Err(ServerError::Stopped),
            Err(_) => {
                if let Some(id) = waiter {
                    self.shared.wait.waiters.lock().remove(&id);
                }
                Err(self.timed_out())
            }
        }
    }

    /// What a request that timed out answers: no leader, or a timeout.
    pub fn timed_out(&self) -> ServerError {
        if self.shared.leader.load(Ordering::Acquire) == 0 {
            ServerError::NoLeader
        } else {
            ServerError::Timeout
        }
    }

    /// The leader's view of every member's match index, or `None` when this
    /// member is not the leader.
    pub async fn raft_progress(&self) -> Result<Option<Vec<(u64, u64)>>, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.send(RaftInput::Progress(tx))?;
        rx.await.map_err(|_| ServerError::Stopped)
    }

    /// Asks raft to hand leadership to `transferee` (raft-rs
    /// `transfer_leader`); the caller watches `leader()` for the outcome.
    pub fn transfer_leadership(&self, transferee: u64) -> Result<(), ServerError> {
        self.send(RaftInput::TransferLeader(transferee))
    }

    /// Stops the raft thread after a durable backend commit.
    pub async fn stop(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(RaftInput::Stop(tx)).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(5), rx).await;
        }
    }

    pub fn leader(&self) -> u64 {
        self.shared.leader.load(Ordering::Acquire)
    }

    /// Whether this member is a learner in the applied member list (false
    /// while it is not in the list at all, as etcd's `IsMemberExist &&
    /// IsLearner`).
    pub fn is_learner(&self) -> bool {
        self.shared
            .members
            .read()
            .iter()
            .any(|m| m.id == self.member_id && m.is_learner)
    }
}

fn conf_state_of(members: &[Member]) -> ConfState {
    let mut cs = ConfState::default();
    for m in members {
        if m.is_learner {
            cs.learners.push(m.id);
        } else {
            cs.voters.push(m.id);
        }
    }
    cs
}

fn snapshot_meta(index: u64, term: u64, conf_state: ConfState) -> SnapshotMetadata {
    let mut m = SnapshotMetadata {
        index,
        term,
        ..Default::default()
    };
    m.set_conf_state(conf_state);
    m
}
