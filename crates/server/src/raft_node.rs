//! The raft thread: owns `raft::RawNode`, the WAL and the apply path.
//!
//! One dedicated OS thread (never a tokio worker: it fsyncs). Each loop turn:
//! 1. wait for inputs (proposals, peer messages, read requests) or the next
//!    tick, then drain every input already queued — proposals that arrive
//!    while the previous fsync ran ride in this turn's Ready (group commit);
//! 2. issue ONE ReadIndex for all linearizable reads that arrived since the
//!    last one;
//! 3. handle the Ready: send messages, apply a snapshot, append entries and
//!    the hard state to the WAL with ONE fdatasync, send persisted messages,
//!    apply committed entries in one MVCC batch (one backend commit), answer
//!    the waiting proposers and reads, `advance`.
//!
//! Applying happens on this thread too: the MVCC write batch is committed
//! non-durably after each Ready (readers see it at once) and durably every
//! `--backend-batch-interval` or `--backend-batch-limit` applied entries.
//! The consistent index rides in the same commit, so a restart skips entries
//! already applied and re-applies the rest from the WAL.

use crate::apply::{apply_with_alarms, ApplyResult};
use crate::error::ServerError;
use crate::raft_storage::RaftStorage;
use crate::server::{Shared, Wait};
use crate::transport::Transport;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, Entry, EntryType, Message, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use retcd_api::etcdserverpb::AlarmType;
use retcd_api::mvccpb::Event;
use retcd_api::retcdpb::InternalRaftRequest;
use retcd_mvcc::KvStore;
use retcd_storage::wal::{Wal, WalEntry, WalSnapshot};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What the rest of the server asks of the raft thread.
pub enum RaftInput {
    /// Propose an encoded `InternalRaftRequest`; its id is already registered
    /// in `Wait`.
    Propose {
        id: u64,
        data: Vec<u8>,
    },
    /// A message from a peer.
    Step(Message),
    /// A linearizable read wants the read index; answered once applied ≥ it.
    ReadIndex(oneshot::Sender<Result<(), ServerError>>),
    Unreachable(u64),
    SnapshotReport(u64, bool),
    /// Ask the thread to leave its loop (after a durable backend commit).
    Stop(oneshot::Sender<()>),
    /// Propose a membership change; `cc.id` is registered in `Wait`.
    ProposeConfChange {
        id: u64,
        cc: ConfChange,
    },
    /// The leader's (member id, match index) for every member; `None` when
    /// not the leader.
    Progress(oneshot::Sender<Option<Vec<(u64, u64)>>>),
    /// Hand leadership to this member (raft-rs `transfer_leader`).
    TransferLeader(u64),
    /// A peer refused our stream: this member was removed from the cluster.
    Removed,
}

pub struct RaftNodeConfig {
    pub tick: Duration,
    pub snapshot_count: u64,
    pub catchup_entries: u64,
    pub batch_interval: Duration,
    pub batch_limit: u64,
    /// `--quota-backend-bytes` in bytes, None when disabled; checked at
    /// apply as well (see `quota`).
    pub quota_bytes: Option<u64>,
}

pub struct RaftNode {
    pub raw: RawNode<RaftStorage>,
    pub storage: RaftStorage,
    pub wal: Wal,
    pub kv: Arc<KvStore>,
    pub shared: Arc<Shared>,
    pub transport: Transport,
    pub rx: Receiver<RaftInput>,
    pub cfg: RaftNodeConfig,
    /// Index of the last snapshot record saved in the WAL.
    pub snapshot_index: u64,
    /// Membership: deferred conf changes, removal (see `membership`).
    pub conf: crate::membership::ConfChangeState,
    /// An entry applied over this member's quota: NOSPACE is to be raised
    /// for this member (proposed after the Ready), and when it last was.
    pub nospace_due: bool,
    pub nospace_proposed: Option<Instant>,
}

/// A removed member exits this long after it learnt of its removal (etcd
/// waits so the change reaches the other members first).
const REMOVED_EXIT_DELAY: Duration = Duration::from_secs(1);

/// Applied entries kept in memory beyond `catchup_entries` before the log is
/// trimmed between snapshots (trimming in steps, not on every apply).
const MEMORY_LOG_SLACK: u64 = 5_000;

/// How often an unanswered ReadIndex is sent again (etcd: 500 ms).
const READ_INDEX_RETRY: Duration = Duration::from_millis(500);
/// An unanswered ReadIndex is given up after this long (its callers have
/// timed out by then).
const READ_INDEX_GIVE_UP: Duration = Duration::from_secs(30);

struct InflightRead {
    first_sent: Instant,
    last_sent: Instant,
    waiters: Vec<oneshot::Sender<Result<(), ServerError>>>,
}

struct Reads {
    /// Reads waiting for the next ReadIndex to be issued.
    pending: Vec<oneshot::Sender<Result<(), ServerError>>>,
    /// ReadIndex requests in flight, by context: (first sent, last sent,
    /// waiters). Re-sent every `READ_INDEX_RETRY` until answered (raft drops
    /// them while there is no leader, or before the leader has committed
    /// an entry of its term), as etcd does.
    inflight: HashMap<u64, InflightRead>,
    /// Reads whose index is known, waiting for applied ≥ index.
    waiting: Vec<(u64, Vec<oneshot::Sender<Result<(), ServerError>>>)>,
    next_ctx: u64,
}

impl RaftNode {
    pub fn run(mut self) {
        let mut reads = Reads {
            pending: Vec::new(),
            inflight: HashMap::new(),
            waiting: Vec::new(),
            next_ctx: 1,
        };
        let mut next_tick = Instant::now() + self.cfg.tick;
        let mut last_durable = Instant::now();
        let mut undurable_ops: u64 = 0;
        let mut stop: Option<oneshot::Sender<()>> = None;
        let mut leader = 0u64;
        // Whether the lessor is primary (see the promote below).
        let mut lessor_primary = false;
        // Whether the last turn had input: then the next one is likely
        // close behind, and `recv_input` spins for it first.
        let mut busy = false;
        loop {
            let timeout = next_tick.saturating_duration_since(Instant::now());
            match self.recv_input(timeout, busy) {
                Ok(input) => {
                    busy = true;
                    self.handle_input(input, &mut reads, &mut stop);
                    while let Ok(input) = self.rx.try_recv() {
                        self.handle_input(input, &mut reads, &mut stop);
                    }
                }
                Err(RecvTimeoutError::Timeout) => busy = false,
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if Instant::now() >= next_tick {
                self.raw.tick();
                next_tick = Instant::now() + self.cfg.tick;
                if undurable_ops > 0 && last_durable.elapsed() >= self.cfg.batch_interval {
                    self.commit_durable();
                    undurable_ops = 0;
                    last_durable = Instant::now();
                }
            }
            // One ReadIndex in flight at a time, as etcd's
            // linearizableReadLoop: reads arriving meanwhile share the next
            // one (on several members each ReadIndex is a heartbeat round
            // and messages on every member; one member answers at once).
            if !reads.pending.is_empty() && reads.inflight.is_empty() {
                let ctx = reads.next_ctx;
                reads.next_ctx += 1;
                self.raw.read_index(ctx.to_be_bytes().to_vec());
                let now = Instant::now();
                reads.inflight.insert(
                    ctx,
                    InflightRead {
                        first_sent: now,
                        last_sent: now,
                        waiters: std::mem::take(&mut reads.pending),
                    },
                );
            }
            self.retry_reads(&mut reads);
            self.maybe_raise_nospace();
            if self.raw.has_ready() {
                let applied = self.on_ready(&mut reads);
                undurable_ops += applied;
                if undurable_ops >= self.cfg.batch_limit
                    || (undurable_ops > 0 && last_durable.elapsed() >= self.cfg.batch_interval)
                {
                    self.commit_durable();
                    undurable_ops = 0;
                    last_durable = Instant::now();
                }
            }
            let st = &self.raw.raft;
            if st.leader_id != leader {
                if st.leader_id != 0 {
                    self.shared.metrics.leader_changes.inc();
                }
                leader = st.leader_id;
            }
            // The lessor is primary once this member leads and has applied
            // an entry of its own term (etcd promotes on applying the new
            // leader's empty entry), so revokes of the old term come first;
            // it extends every lease by an election timeout before any
            // expires. Losing leadership stops expiry at once.
            let st = &self.raw.raft;
            let primary = st.state == StateRole::Leader && self.storage.applied().1 == st.term;
            if primary != lessor_primary {
                lessor_primary = primary;
                if primary {
                    let extend = self.cfg.tick * st.election_timeout() as u32;
                    self.shared.lessor.promote(extend);
                } else {
                    self.shared.lessor.demote();
                }
            }
            self.publish_status();
            self.retry_deferred_conf_changes();
            if self
                .conf
                .removed_at
                .is_some_and(|t| t.elapsed() >= REMOVED_EXIT_DELAY)
            {
                self.commit_durable();
                tracing::warn!("{}; exiting", crate::transport::REMOVED_MEMBER);
                eprintln!("retcd: {}", crate::transport::REMOVED_MEMBER);
                std::process::exit(0);
            }
            if let Some(done) = stop.take() {
                self.commit_durable();
                let _ = done.send(());
                break;
            }
        }
    }

    /// The next input, waiting at most `timeout`. After a busy turn, on a
    /// quiet member, it first spins for up to [`crate::spin::RAFT_SPIN`]:
    /// the next request usually arrives within a client round trip, and
    /// waking a sleeping thread is most of a lone client's latency besides
    /// the fsync (see `crate::spin`).
    fn recv_input(&self, timeout: Duration, busy: bool) -> Result<RaftInput, RecvTimeoutError> {
        let deadline = Instant::now() + timeout;
        if busy && self.shared.contention.quiet() {
            let until = Instant::now() + crate::spin::RAFT_SPIN.min(timeout);
            loop {
                match self.rx.try_recv() {
                    Ok(input) => return Ok(input),
                    Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                    Err(TryRecvError::Empty) if Instant::now() >= until => break,
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
        }
        self.rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
    }

    fn handle_input(
        &mut self,
        input: RaftInput,
        reads: &mut Reads,
        stop: &mut Option<oneshot::Sender<()>>,
    ) {
        match input {
            RaftInput::Propose { id, data } => {
                if let Err(e) = self.raw.propose(vec![], data) {
                    self.proposal_failed(id, e);
                }
            }
            RaftInput::Step(m) => {
                if let Err(e) = self.raw.step(m) {
                    tracing::debug!(error = %e, "raft step");
                }
            }
            RaftInput::ReadIndex(tx) => reads.pending.push(tx),
            RaftInput::Unreachable(id) => self.raw.report_unreachable(id),
            RaftInput::SnapshotReport(id, ok) => self.raw.report_snapshot(
                id,
                if ok {
                    SnapshotStatus::Finish
                } else {
                    SnapshotStatus::Failure
                },
            ),
            RaftInput::Stop(tx) => *stop = Some(tx),
            RaftInput::ProposeConfChange { id, cc } => self.propose_conf_change(id, cc),
            RaftInput::Progress(tx) => {
                let r = &self.raw.raft;
                let p = (r.state == StateRole::Leader)
                    .then(|| r.prs().iter().map(|(id, pr)| (*id, pr.matched)).collect());
                let _ = tx.send(p);
            }
            RaftInput::TransferLeader(id) => self.raw.transfer_leader(id),
            RaftInput::Removed => {
                self.conf.removed_at.get_or_insert_with(Instant::now);
            }
        }
    }

    /// Proposes a conf change, holding it back while this leader still has
    /// one unapplied (raft-rs would replace it with an empty entry and the
    /// proposer would only time out).
    fn propose_conf_change(&mut self, id: u64, cc: ConfChange) {
        if self.raw.raft.state == StateRole::Leader && self.raw.raft.has_pending_conf() {
            self.conf.deferred.push((id, cc, Instant::now()));
            return;
        }
        if let Err(e) = self.raw.propose_conf_change(vec![], cc) {
            self.proposal_failed(id, e);
        }
    }

    /// Answers the proposer of `id` whose proposal raft refused.
    fn proposal_failed(&self, id: u64, e: raft::Error) {
        self.shared.metrics.proposals_failed.inc();
        let err = match e {
            raft::Error::ProposalDropped => ServerError::NoLeader,
            other => ServerError::Internal(other.to_string()),
        };
        self.shared.wait.trigger(id, Err(err));
    }

    fn retry_deferred_conf_changes(&mut self) {
        if self.conf.deferred.is_empty()
            || (self.raw.raft.state == StateRole::Leader && self.raw.raft.has_pending_conf())
        {
            return;
        }
        let deferred = std::mem::take(&mut self.conf.deferred);
        for (id, cc, since) in deferred {
            // Its proposer has given up by then.
            if since.elapsed() < Duration::from_secs(60) {
                self.propose_conf_change(id, cc);
            }
        }
    }

    /// Applies a committed membership change: checks it (as etcd's
    /// `ValidateConfigurationChange`), updates the member list (memory and
    /// the batch's `members` table), raft's configuration and the
    /// transport. A rejected change leaves raft's configuration alone.
    /// (Takes the node's parts, not `self`: the batch borrows `self.kv`.)
    fn apply_member_change(
        raw: &mut RawNode<RaftStorage>,
        shared: &Shared,
        transport: &Transport,
        conf: &mut crate::membership::ConfChangeState,
        batch: &mut retcd_mvcc::WriteBatch<'_>,
        cc: &ConfChange,
    ) -> ApplyResult {
        let change = match crate::membership::apply_conf_change(
            shared,
            batch,
            cc,
            conf.max_learners,
        ) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::warn!(node = %format!("{:x}", cc.node_id), error = %e, "conf change rejected");
                return ApplyResult::Err(e);
            }
            Err(e) => fatal(&format!("failed to save members to the backend: {e}")),
        };
        use crate::membership::Change;
        // An update changes only peer URLs: raft's configuration stays.
        if !matches!(change, Change::Updated(_)) {
            match raw.apply_conf_change(cc) {
                Ok(cs) => raw.store().set_conf_state(cs),
                Err(err) => tracing::warn!(error = %err, "raft refused conf change"),
            }
        }
        let self_id = raw.raft.id;
        transport.set_members(&shared.members.read());
        tracing::info!(change = ?change, "applied a configuration change through raft");
        match change {
            Change::Added(m) => transport.add_peer(m.id, &m.peer_urls),
            Change::Removed(id) if id == self_id => {
                // raft-rs assumes a leader is in its own progress set (its
                // commit path unwraps it): a removed leader steps down at
                // once; the others elect a new one (which has the entry).
                if raw.raft.state == StateRole::Leader {
                    let term = raw.raft.term;
                    raw.raft.become_follower(term, raft::INVALID_ID);
                }
                conf.removed_at.get_or_insert_with(Instant::now);
            }
            Change::Removed(id) => transport.remove_peer(id),
            Change::Updated(m) if m.id != self_id => transport.update_peer(m.id, &m.peer_urls),
            Change::Updated(_) | Change::Promoted(_) => {}
        }
        ApplyResult::Empty
    }

    /// Handles one Ready (and the LightReady after it). Returns the number of
    /// entries applied.
    fn on_ready(&mut self, reads: &mut Reads) -> u64 {
        let mut rd = self.raw.ready();
        if !rd.messages().is_empty() {
            self.transport.send(rd.take_messages());
        }
        if !rd.snapshot().is_empty() {
            self.apply_snapshot(rd.snapshot().clone());
        }
        let entries = rd.take_entries();
        let hs = rd.hs().cloned();
        if !entries.is_empty() || hs.is_some() {
            let wal_entries: Vec<WalEntry> = entries
                .iter()
                .map(|e| WalEntry {
                    index: e.index,
                    term: e.term,
                    data: e.write_to_bytes().expect("encode raft entry"),
                })
                .collect();
            let hs_bytes = hs
                .as_ref()
                .map(|h| h.write_to_bytes().expect("encode hard state"));
            // etcd's MustSync (raft-rs computes it): entries, a snapshot,
            // or a new term or vote must be durable before anything
            // depends on them; a hard state that only moved the commit
            // index is written without an fsync (commit is volatile in
            // raft; restart copes with a stale one)
            let must_sync = rd.must_sync();
            let started = Instant::now();
            crate::fp::point("raft_before_save_wal");
            if let Err(e) =
                crate::fp::wal_save(&mut self.wal, hs_bytes.as_deref(), &wal_entries, must_sync)
            {
                fatal(&format!("failed to save to the WAL: {e}"));
            }
            crate::fp::point("raft_after_save_wal");
            if must_sync {
                self.shared
                    .metrics
                    .wal_fsync
                    .observe(started.elapsed().as_secs_f64());
            }
            self.storage.append(&entries);
            if let Some(h) = hs {
                self.storage.set_hard_state(h);
            }
        }
        if !rd.persisted_messages().is_empty() {
            self.transport.send(rd.take_persisted_messages());
        }
        for rs in rd.take_read_states() {
            let mut ctx = [0u8; 8];
            if rs.request_ctx.len() == 8 {
                ctx.copy_from_slice(&rs.request_ctx);
            }
            if let Some(r) = reads.inflight.remove(&u64::from_be_bytes(ctx)) {
                reads.waiting.push((rs.index, r.waiters));
            }
        }
        let mut applied = self.apply_entries(rd.take_committed_entries());
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.storage.set_commit(commit);
        }
        if !light.messages().is_empty() {
            self.transport.send(light.take_messages());
        }
        applied += self.apply_entries(light.take_committed_entries());
        self.raw.advance_apply();
        self.answer_reads(reads);
        self.maybe_snapshot();
        applied
    }

    /// Sends unanswered ReadIndex requests again; gives up on very old ones.
    fn retry_reads(&mut self, reads: &mut Reads) {
        let now = Instant::now();
        let mut give_up = Vec::new();
        for (ctx, r) in reads.inflight.iter_mut() {
            if now.duration_since(r.first_sent) >= READ_INDEX_GIVE_UP {
                give_up.push(*ctx);
            } else if now.duration_since(r.last_sent) >= READ_INDEX_RETRY {
                r.last_sent = now;
                self.raw.read_index(ctx.to_be_bytes().to_vec());
            }
        }
        for ctx in give_up {
            if let Some(r) = reads.inflight.remove(&ctx) {
                self.shared.metrics.read_indexes_failed.inc();
                for w in r.waiters {
                    let _ = w.send(Err(ServerError::Timeout));
                }
            }
        }
    }

    /// Proposes NOSPACE for this member after an entry was applied over its
    /// quota (etcd's apply loop does the same), unless a NOSPACE alarm is
    /// raised already; again at most once a second until it is.
    fn maybe_raise_nospace(&mut self) {
        if !self.nospace_due {
            return;
        }
        if self.shared.alarms.has(AlarmType::Nospace) {
            self.nospace_due = false;
            self.nospace_proposed = None;
            return;
        }
        if self
            .nospace_proposed
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        let id = self.raw.raft.id;
        tracing::warn!(
            member = %format!("{id:x}"),
            "message exceeded backend quota; raising alarm"
        );
        // (dropped while there is no leader: tried again a second later)
        let req = crate::quota::nospace_alarm(id);
        let _ = self.raw.propose(vec![], req.encode_to_vec());
        self.nospace_proposed = Some(Instant::now());
    }

    fn answer_reads(&mut self, reads: &mut Reads) {
        if reads.waiting.is_empty() {
            return;
        }
        let applied = self.storage.applied().0;
        reads.waiting.retain_mut(|(index, ws)| {
            if *index <= applied {
                for w in ws.drain(..) {
                    let _ = w.send(Ok(()));
                }
                false
            } else {
                true
            }
        });
    }

    /// Applies committed entries in one MVCC batch and answers the
    /// proposers after the batch is committed (visible to readers).
    fn apply_entries(&mut self, entries: Vec<Entry>) -> u64 {
        if entries.is_empty() {
            return 0;
        }
        let applied_before = self.storage.applied().0;
        let mut batch = match self.kv.begin_batch() {
            Ok(b) => b,
            Err(e) => fatal(&format!("failed to begin a backend batch: {e}")),
        };
        // The file does not grow before this batch commits.
        let size = match self.cfg.quota_bytes {
            Some(_) => self.kv.backend().size_cached(),
            None => 0,
        };
        let mut results: Vec<(u64, ApplyResult)> = Vec::new();
        let mut last = (0, 0);
        let mut n = 0;
        for e in entries {
            if e.index <= applied_before {
                continue;
            }
            n += 1;
            let is_cc = e.get_entry_type() != EntryType::EntryNormal;
            if is_cc {
                crate::fp::point("raft_before_apply_conf_change");
            }
            match e.get_entry_type() {
                EntryType::EntryNormal => {
                    if !e.data.is_empty() {
                        match InternalRaftRequest::decode(&e.data[..]) {
                            Ok(mut req) => {
                                let id = req.id;
                                let over =
                                    crate::quota::over_at_apply(self.cfg.quota_bytes, size, &req);
                                let mut res = match req.member_attributes.take() {
                                    Some(a) => crate::membership::apply_attributes(
                                        &self.shared,
                                        &mut batch,
                                        a,
                                    )
                                    .unwrap_or_else(|e| ApplyResult::Err(e.into())),
                                    None => {
                                        apply_with_alarms(&mut batch, &self.shared, req, e.index)
                                    }
                                };
                                // etcd's quotaApplierV3: applied all the
                                // same (members stay identical), answered
                                // NOSPACE, and the alarm is raised.
                                if over && !matches!(res, ApplyResult::Err(_)) {
                                    res = ApplyResult::Err(ServerError::NoSpace);
                                    self.nospace_due = true;
                                }
                                results.push((id, res));
                            }
                            Err(err) => {
                                tracing::error!(index = e.index, error = %err, "undecodable raft entry skipped")
                            }
                        }
                    }
                }
                EntryType::EntryConfChange => {
                    let mut cc = ConfChange::default();
                    if cc.merge_from_bytes(&e.data).is_ok() {
                        let res = Self::apply_member_change(
                            &mut self.raw,
                            &self.shared,
                            &self.transport,
                            &mut self.conf,
                            &mut batch,
                            &cc,
                        );
                        results.push((cc.id, res));
                    }
                }
                EntryType::EntryConfChangeV2 => {
                    let mut cc = ConfChangeV2::default();
                    if cc.merge_from_bytes(&e.data).is_ok() {
                        match self.raw.apply_conf_change(&cc) {
                            Ok(cs) => self.storage.set_conf_state(cs),
                            Err(err) => tracing::warn!(error = %err, "conf change rejected"),
                        }
                    }
                }
            }
            if is_cc {
                crate::fp::point("raft_after_apply_conf_change");
            }
            batch.set_consistent_index(e.index, e.term);
            last = (e.index, e.term);
        }
        if n == 0 {
            drop(batch);
            return 0;
        }
        let events = batch.take_events();
        let started = Instant::now();
        crate::fp::point("raft_before_commit_backend");
        if let Err(e) = batch.commit(false) {
            fatal(&format!("failed to commit to the backend: {e}"));
        }
        crate::fp::point("raft_after_commit_backend");
        self.shared
            .metrics
            .backend_commit
            .observe(started.elapsed().as_secs_f64());
        self.storage.set_applied(last.0, last.1);
        self.shared.applied_index.store(last.0, Ordering::Release);
        self.after_commit(events);
        for (id, res) in results {
            self.shared.wait.trigger(id, Ok(res));
        }
        n
    }

    /// Hands the events of a committed batch (in revision order) to the
    /// parts that follow the key space: lease attachments and watchers.
    /// Must not block.
    fn after_commit(&self, events: Vec<(i64, Event)>) {
        self.shared
            .lessor
            .apply_events(events.iter().map(|(_, e)| e));
        self.shared
            .watch
            .notify(self.kv.current_revision(), crate::fp::watch_events(events));
    }

    /// Called after the store was replaced by a snapshot from the leader.
    fn after_restore(&self) {
        if let Err(e) = self.shared.alarms.reload(self.kv.backend()) {
            fatal(&format!("failed to load alarms from the snapshot: {e}"));
        }
        if let Err(e) = self.shared.auth.reload(self.kv.backend()) {
            fatal(&format!(
                "failed to load the auth store from the snapshot: {e}"
            ));
        }
        if let Err(e) = self.shared.lessor.recover(&self.kv) {
            fatal(&format!("failed to recover leases from the snapshot: {e}"));
        }
        self.shared.watch.restore();
    }

    fn commit_durable(&mut self) {
        match self.kv.begin_batch() {
            Ok(b) => {
                let started = Instant::now();
                if let Err(e) = b.commit(true) {
                    fatal(&format!("failed to commit to the backend durably: {e}"));
                }
                self.shared
                    .metrics
                    .backend_commit
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(e) => fatal(&format!("failed to begin a backend batch: {e}")),
        }
    }

    /// A follower far behind receives the leader's MVCC store.
    fn apply_snapshot(&mut self, snap: Snapshot) {
        let meta = snap.get_metadata().clone();
        tracing::info!(
            index = meta.index,
            term = meta.term,
            "applying snapshot from leader"
        );
        crate::fp::point("raft_before_apply_snapshot");
        if let Err(e) = self.kv.restore_from(&snap.data) {
            fatal(&format!("failed to restore snapshot: {e}"));
        }
        match crate::membership::load(self.kv.backend()) {
            Ok(m) if !m.is_empty() => {
                // A member that joined learns its peers here.
                for p in &m {
                    self.transport.add_peer(p.id, &p.peer_urls);
                }
                self.transport.set_members(&m);
                *self.shared.members.write() = m;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot load members from the snapshot"),
        }
        // restore_from commits durably; only then may the WAL forget
        // the entries before the snapshot.
        let payload = meta
            .get_conf_state()
            .write_to_bytes()
            .expect("encode conf state");
        if let Err(e) = self.wal.save_snapshot(&WalSnapshot {
            index: meta.index,
            term: meta.term,
            payload,
        }) {
            fatal(&format!("failed to save snapshot record to the WAL: {e}"));
        }
        self.snapshot_index = meta.index;
        self.shared
            .applied_index
            .store(meta.index, Ordering::Release);
        self.storage.apply_snapshot_meta(meta);
        self.after_restore();
        crate::fp::point("raft_after_apply_snapshot");
    }

    /// Every `--snapshot-count` applied entries: make the backend durable,
    /// record a snapshot in the WAL, drop old WAL segments and compact the
    /// in-memory log, keeping `catchup_entries` for slow followers.
    fn maybe_snapshot(&mut self) {
        let (applied, term) = self.storage.applied();
        if applied < self.snapshot_index + self.cfg.snapshot_count.max(1) {
            self.trim_memory_log(applied);
            return;
        }
        self.commit_durable();
        crate::fp::point("raft_before_save_snapshot");
        let payload = self
            .storage
            .conf_state()
            .write_to_bytes()
            .expect("encode conf state");
        if let Err(e) = self.wal.save_snapshot(&WalSnapshot {
            index: applied,
            term,
            payload,
        }) {
            fatal(&format!("failed to save snapshot record to the WAL: {e}"));
        }
        self.snapshot_index = applied;
        crate::fp::point("raft_after_save_snapshot");
        if let Err(e) = self.wal.release_to(applied) {
            tracing::warn!(error = %e, "failed to release old WAL segments");
        }
        let compact_to = applied.saturating_sub(self.cfg.catchup_entries);
        if compact_to > self.storage.first_index_now() {
            self.storage.compact(compact_to);
        }
        tracing::info!(
            index = applied,
            compact_to,
            "snapshot saved, raft log compacted"
        );
    }

    /// Between snapshots, keeps the in-memory log to at most
    /// `catchup_entries + MEMORY_LOG_SLACK` applied entries (etcd keeps up
    /// to `--snapshot-count` of them: 100 000 entries, tens of MiB). Safe at
    /// any time: the WAL still holds every entry for a restart, and a
    /// follower further behind than the kept tail gets a snapshot, which is
    /// a dump of the store at the applied index (never behind the trimmed
    /// point).
    fn trim_memory_log(&self, applied: u64) {
        let first = self.storage.first_index_now();
        let keep = self.cfg.catchup_entries.max(1);
        if applied > first + keep + MEMORY_LOG_SLACK {
            self.storage.compact(applied - keep);
        }
    }

    fn publish_status(&self) {
        let r = &self.raw.raft;
        let s = &self.shared;
        s.term.store(r.term, Ordering::Release);
        s.leader.store(r.leader_id, Ordering::Release);
        s.is_leader
            .store(r.state == StateRole::Leader, Ordering::Release);
        s.commit_index
            .store(r.raft_log.committed, Ordering::Release);
        s.raft_index
            .store(r.raft_log.last_index(), Ordering::Release);
        s.contention.set_sole_voter(
            r.prs().conf().voters().is_singleton() && r.prs().conf().voters().contains(r.id),
        );
    }
}

/// An I/O failure on the durable path stops the node (fail-stop): it must
/// never acknowledge what it could not persist.
pub fn fatal(msg: &str) -> ! {
    tracing::error!("{msg}");
    eprintln!("retcd: fatal: {msg}");
    std::process::exit(1);
}

impl Wait {
    pub fn trigger(&self, id: u64, res: Result<ApplyResult, ServerError>) {
        if let Some(tx) = self.waiters.lock().remove(&id) {
            let _ = tx.send(res);
        }
    }
}
