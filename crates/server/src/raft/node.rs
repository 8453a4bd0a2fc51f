//! The raft thread: owns `raft::RawNode`, the WAL and the apply path.
//!
//! One dedicated OS thread (never a tokio worker: it fsyncs). Each loop turn:
//! 1. wait for inputs (proposals, peer messages, read requests) or the next
//!    tick, then drain every input already queued — proposals that arrive
//!    while the previous fsync ran ride in this turn's Ready (group commit),
//!    stepped into raft as one proposal (one append per follower);
//! 2. issue ONE ReadIndex for all linearizable reads that arrived since the
//!    last one (`read_index`), unless one is in flight (then again right
//!    after the Ready that answers it);
//! 3. handle the Ready: send messages, apply a snapshot, append entries and
//!    the hard state to the WAL with ONE fdatasync, send persisted messages,
//!    apply committed entries in one MVCC batch (one backend commit), answer
//!    the waiting proposers and reads, `advance`.
//!
//! Applying happens on this thread too (through `apply::Applier`): the
//! MVCC write batch is committed non-durably after each Ready (readers see
//! it at once) and durably every `--backend-batch-interval` or
//! `--backend-batch-limit` applied entries. The consistent index rides in
//! the same commit, so a restart skips entries already applied and
//! re-applies the rest from the WAL.

use super::commit_notice::{self, CommitNotice};
use super::read_index::Reads;
use super::storage::RaftStorage;
use super::transport::Transport;
use super::{RaftInput, RaftReceiver, RaftStatus, ReadQueue, Wait};
use crate::apply::membership::{self, Change};
use crate::apply::{Applier, ApplyResult};
use crate::error::{fatal, ServerError};
use crate::failpoints as fp;
use crate::ids::Hex;
use crate::metrics::Metrics;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, Entry, EntryType, MessageType, Snapshot};
use raft::{RawNode, SnapshotStatus, StateRole};
use retcd_api::etcdserverpb::AlarmType;
use retcd_api::retcdpb::InternalRaftRequest;
use retcd_storage::wal::{Wal, WalEntry, WalSnapshot};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The raft thread's settings (from the flags).
pub struct RaftNodeConfig {
    pub tick: Duration,
    pub snapshot_count: u64,
    pub catchup_entries: u64,
    pub batch_interval: Duration,
    pub batch_limit: u64,
    /// `--max-learners`, checked when a learner is added.
    pub max_learners: usize,
    /// `--max-wals`: WAL segment files kept after a snapshot (0: all).
    pub max_wals: usize,
    /// `--experimental-warning-apply-duration`: slower applies are logged.
    pub warn_apply: Duration,
}

/// etcd's `warnSyncDuration`: a WAL fdatasync slower than this is logged.
const WARN_SYNC: Duration = Duration::from_secs(1);

/// What the raft thread works with; moved onto its thread by [`RaftNode::run`].
pub struct RaftNode {
    pub raw: RawNode<RaftStorage>,
    pub storage: RaftStorage,
    pub wal: Wal,
    /// The state machine committed entries are applied to.
    pub applier: Arc<Applier>,
    pub wait: Arc<Wait>,
    /// Published after every turn.
    pub status: Arc<RaftStatus>,
    pub metrics: &'static Metrics,
    pub transport: Transport,
    pub rx: RaftReceiver,
    /// Linearizable reads waiting to be taken (shared with the [`Proposer`](super::Proposer)).
    pub(crate) read_queue: Arc<ReadQueue>,
    pub cfg: RaftNodeConfig,
    /// Index of the last snapshot record saved in the WAL.
    pub snapshot_index: u64,
}

/// The loop's own state, beside the node's parts.
struct Turn {
    reads: Reads,
    /// Proposals drained this turn, proposed together ([`RaftNode::propose_drained`]):
    /// their request ids and entries, in arrival order.
    proposed_ids: Vec<u64>,
    proposed: Vec<Entry>,
    /// Proposals drained while there was no leader, held (in order) until
    /// one is known or their callers' deadlines come near: (request id,
    /// entry).
    held: Vec<(u64, Entry)>,
    /// Conf changes held back while there is no leader (etcd's raft node
    /// takes no proposal then: its `configure` waits out the caller's
    /// context) or while the leader still has one pending (raft-rs would
    /// silently turn them into empty entries): (request id, change).
    deferred: Vec<(u64, ConfChange)>,
    /// Set when this member learnt it was removed; it exits a little later
    /// (etcd waits so the commit reaches the other members).
    removed_at: Option<Instant>,
    /// An entry was applied over this member's quota: NOSPACE is to be
    /// raised for this member (proposed after the Ready), and when it last
    /// was.
    nospace_due: bool,
    nospace_proposed: Option<Instant>,
    stop: Option<oneshot::Sender<()>>,
    /// When followers learn of commits (leader only).
    notice: CommitNotice,
}

impl Turn {
    fn new(member: u64) -> Turn {
        Turn {
            reads: Reads::new(member),
            proposed_ids: Vec::new(),
            proposed: Vec::new(),
            held: Vec::new(),
            deferred: Vec::new(),
            removed_at: None,
            nospace_due: false,
            nospace_proposed: None,
            stop: None,
            notice: CommitNotice::default(),
        }
    }
}

/// Proposes `entries` to `raft` as one proposal, as `RawNode::propose`
/// does for one entry: a leader appends them together (with
/// `batch_append`, one append per follower carries them all), a follower
/// forwards them to its leader in one message.
pub(crate) fn propose_batch<S: raft::Storage>(
    raft: &mut raft::Raft<S>,
    entries: Vec<Entry>,
) -> raft::Result<()> {
    let mut m = raft::eraftpb::Message::default();
    m.set_msg_type(MessageType::MsgPropose);
    m.from = raft.id;
    m.set_entries(entries.into());
    raft.step(m)
}

/// A removed member exits this long after it learnt of its removal (etcd
/// waits so the change reaches the other members first).
const REMOVED_EXIT_DELAY: Duration = Duration::from_secs(1);

/// Applied entries kept in memory beyond `catchup_entries` before the log is
/// trimmed between snapshots (trimming in steps, not on every apply).
const MEMORY_LOG_SLACK: u64 = 5_000;

impl Drop for RaftNode {
    /// Reads still queued, and any later one, fail: no one will take them.
    fn drop(&mut self) {
        self.read_queue.close();
    }
}

impl RaftNode {
    pub fn run(mut self) {
        // etcd's adjustTicks for a one-member cluster (fresh or restarted):
        // there is no one to hear from, so it does not wait out an election
        // timeout (1–2 s); retcd campaigns at once (etcd advances all but
        // one tick). Multi-member starts wait as etcd does.
        let cs = self.storage.conf_state();
        if cs.voters == [self.raw.raft.id] && cs.voters_outgoing.is_empty() {
            if let Err(e) = self.raw.campaign() {
                tracing::warn!(error = %e, "raft: campaign at start failed");
            }
        }
        let metrics = self.metrics;
        self.applier
            .kv
            .set_write_out_observer(Arc::new(move |took: Duration| {
                metrics.backend_commit.observe(took.as_secs_f64())
            }));
        let mut turn = Turn::new(self.raw.raft.id);
        let mut next_tick = Instant::now() + self.cfg.tick;
        let mut last_durable = Instant::now();
        let mut undurable_ops: u64 = 0;
        let mut leader = 0u64;
        // Whether the lessor is primary (see the promote below).
        let mut lessor_primary = false;
        loop {
            let wake = turn.notice.due().map_or(next_tick, |d| d.min(next_tick));
            let timeout = if self.raw.has_ready() {
                Duration::ZERO
            } else {
                wake.saturating_duration_since(Instant::now())
            };
            match self.rx.0.recv_timeout(timeout) {
                Ok(input) => {
                    self.handle_input(input, &mut turn);
                    while let Ok(input) = self.rx.0.try_recv() {
                        self.handle_input(input, &mut turn);
                    }
                    self.propose_drained(&mut turn);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if Instant::now() >= next_tick {
                self.raw.tick();
                next_tick = Instant::now() + self.cfg.tick;
                if undurable_ops > 0
                    && last_durable.elapsed() >= self.cfg.batch_interval
                    && self.make_durable(undurable_ops)
                {
                    undurable_ops = 0;
                    last_durable = Instant::now();
                }
            }
            turn.reads.issue(&mut self.raw);
            let (failed, again) = turn.reads.retry(&mut self.raw);
            self.metrics.read_indexes_failed.inc_by(failed);
            self.metrics.slow_read_indexes.inc_by(failed + again);
            self.maybe_raise_nospace(&mut turn);
            // Up to two Readies: applying may move the commit index a
            // follower is waiting for (see CommitNotice).
            for readies in 0.. {
                turn.notice.check(&mut self.raw.raft, Instant::now());
                if readies == 2 || !self.raw.has_ready() {
                    break;
                }
                let applied = self.on_ready(&mut turn);
                // Reads that came while a ReadIndex was in flight go now.
                // Left to the next turn, they waited for the next input:
                // on a quiet follower the leader's heartbeat, up to a
                // heartbeat interval later.
                turn.reads.issue(&mut self.raw);
                undurable_ops += applied;
                if (undurable_ops >= self.cfg.batch_limit
                    || (undurable_ops > 0 && last_durable.elapsed() >= self.cfg.batch_interval))
                    && self.make_durable(undurable_ops)
                {
                    undurable_ops = 0;
                    last_durable = Instant::now();
                }
            }
            let st = &self.raw.raft;
            if st.leader_id != leader {
                // etcd's raft.node lines, which tools grep for.
                if st.leader_id != 0 {
                    self.metrics.leader_changes.inc();
                    self.status.set_lead_elected(Instant::now());
                    if leader != 0 {
                        tracing::info!(target: "raft", "raft.node: {:x} changed leader from {:x} to {:x} at term {}", st.id, leader, st.leader_id, st.term);
                    } else {
                        tracing::info!(target: "raft", "raft.node: {:x} elected leader {:x} at term {}", st.id, st.leader_id, st.term);
                    }
                } else {
                    tracing::info!(target: "raft", "raft.node: {:x} lost leader {:x} at term {}", st.id, leader, st.term);
                }
                leader = st.leader_id;
            }
            // The lessor is primary once this member leads and has applied
            // an entry of its own term (etcd promotes on applying the new
            // leader's empty entry), so revokes of the old term come first;
            // it extends every lease by an election timeout before any
            // expires. Losing leadership stops expiry at once.
            let primary = st.state == StateRole::Leader && self.storage.applied().1 == st.term;
            if primary != lessor_primary {
                lessor_primary = primary;
                if primary {
                    let extend = self.cfg.tick * st.election_timeout() as u32;
                    self.applier.lessor.promote(extend);
                } else {
                    self.applier.lessor.demote();
                }
            }
            self.publish_status();
            self.release_held(&mut turn);
            self.retry_deferred_conf_changes(&mut turn);
            if turn
                .removed_at
                .is_some_and(|t| t.elapsed() >= REMOVED_EXIT_DELAY)
            {
                self.commit_durable();
                let msg = ServerError::RemovedMember.to_string();
                tracing::warn!("{msg}; exiting");
                eprintln!("retcd: {msg}");
                std::process::exit(0);
            }
            if let Some(done) = turn.stop.take() {
                self.commit_durable();
                self.close_backend();
                let _ = done.send(());
                break;
            }
        }
    }

    fn handle_input(&mut self, input: RaftInput, turn: &mut Turn) {
        match input {
            RaftInput::Propose { id, data } => {
                turn.proposed_ids.push(id);
                turn.proposed.push(Entry {
                    data: data.into(),
                    ..Default::default()
                });
            }
            RaftInput::Step(m) => {
                // (a proposal this leader made while a follower can come
                // back through a deposed leader: no one to notify)
                let forwarded = (m.get_msg_type() == MessageType::MsgPropose
                    && self.raw.raft.state == StateRole::Leader
                    && m.from != self.raw.raft.id)
                    .then_some(m.from);
                if let Err(e) = commit_notice::step(&mut self.raw, m) {
                    tracing::debug!(error = %e, "raft step");
                } else if let Some(from) = forwarded {
                    turn.notice
                        .on_forwarded(from, self.raw.raft.raft_log.last_index());
                }
            }
            RaftInput::Reads => turn.reads.extend(self.read_queue.take()),
            RaftInput::Unreachable(id) => self.raw.report_unreachable(id),
            RaftInput::SnapshotReport(id, ok) => self.raw.report_snapshot(
                id,
                if ok {
                    SnapshotStatus::Finish
                } else {
                    SnapshotStatus::Failure
                },
            ),
            RaftInput::Stop(tx) => turn.stop = Some(tx),
            RaftInput::ProposeConfChange { id, cc } => {
                // after the proposals that came before it
                self.propose_drained(turn);
                self.propose_conf_change(id, cc, turn)
            }
            RaftInput::Progress(tx) => {
                let r = &self.raw.raft;
                let p = (r.state == StateRole::Leader)
                    .then(|| r.prs().iter().map(|(id, pr)| (*id, pr.matched)).collect());
                let _ = tx.send(p);
            }
            RaftInput::StatusJson(tx) => {
                let _ = tx.send(self.status_json());
            }
            RaftInput::TransferLeader(id) => {
                // the proposals queued before it go in first, as they
                // would have one by one (a transfer drops later ones)
                self.propose_drained(turn);
                self.raw.transfer_leader(id)
            }
            RaftInput::Removed => {
                turn.removed_at.get_or_insert_with(Instant::now);
            }
        }
    }

    /// Proposes a conf change, holding it back while this leader still has
    /// one unapplied (raft-rs would replace it with an empty entry and the
    /// proposer would only time out).
    fn propose_conf_change(&mut self, id: u64, cc: ConfChange, turn: &mut Turn) {
        if self.conf_change_waits() {
            turn.deferred.push((id, cc));
            return;
        }
        if let Err(e) = self.raw.propose_conf_change(vec![], cc) {
            self.proposal_failed(id, &e);
        }
    }

    /// Proposes the entries drained since the last call as ONE raft
    /// proposal (what `RawNode::propose` does for one entry): the leader
    /// appends them together and sends each follower one append for all
    /// of them, and a follower forwards them in one message; proposed one
    /// by one, each was its own append to every follower, its own answer
    /// back and its own step on both sides.
    ///
    /// Without a leader raft would drop them (raft-rs answers at once;
    /// etcd's raft node does not take proposals then, so they wait for a
    /// leader until their request's context ends). They are held, in
    /// order, and proposed once a leader is known, or given up near their
    /// callers' deadlines ([`Self::release_held`]).
    fn propose_drained(&mut self, turn: &mut Turn) {
        let leaderless = self.raw.raft.leader_id == raft::INVALID_ID;
        if !leaderless && !turn.held.is_empty() {
            self.release_held(turn);
        }
        if turn.proposed.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut turn.proposed_ids);
        let entries = std::mem::take(&mut turn.proposed);
        if leaderless {
            turn.held.extend(ids.into_iter().zip(entries));
        } else {
            self.propose_now(&ids, entries);
        }
    }

    fn propose_now(&mut self, ids: &[u64], entries: Vec<Entry>) {
        if let Err(e) = propose_batch(&mut self.raw.raft, entries) {
            for &id in ids {
                self.proposal_failed(id, &e);
            }
        }
    }

    /// Gives up the held proposals whose callers' deadlines are near (or
    /// already answered): their callers get etcd's answer to a `Propose`
    /// that waited out its context, Unknown "context deadline exceeded",
    /// and the entries are never proposed ([`Self::still_held`]). Once
    /// there is a leader, the rest are proposed, in order.
    fn release_held(&mut self, turn: &mut Turn) {
        if turn.held.is_empty() {
            return;
        }
        let give_up_at = self.give_up_at();
        let leaderless = self.raw.raft.leader_id == raft::INVALID_ID;
        // Held in arrival order, so their deadlines (one timeout after
        // each call) grow: without a leader only the front is looked at,
        // not every held proposal at every turn.
        let mut kept = Vec::with_capacity(turn.held.len());
        let mut held = std::mem::take(&mut turn.held).into_iter();
        for (id, entry) in held.by_ref() {
            if self.still_held(id, give_up_at) {
                kept.push((id, entry));
                if leaderless {
                    break;
                }
            }
        }
        if leaderless {
            kept.extend(held);
            turn.held = kept;
            return;
        }
        let (ids, entries): (Vec<u64>, Vec<Entry>) = kept.into_iter().unzip();
        if !ids.is_empty() {
            self.propose_now(&ids, entries);
        }
    }

    /// Held requests whose callers' deadlines come before this are given
    /// up: two raft turns and a sweep of the waiters away, so this thread
    /// answers before the sweeper and never proposes an entry whose caller
    /// was answered.
    fn give_up_at(&self) -> Instant {
        Instant::now() + 2 * self.cfg.tick + super::wait::SWEEP_EVERY
    }

    /// Whether held request `id` is still to be proposed: not once its
    /// caller was answered or has gone, nor once its deadline is before
    /// `give_up_at` (its caller then gets etcd's Unknown "context deadline
    /// exceeded").
    fn still_held(&self, id: u64, give_up_at: Instant) -> bool {
        match self.wait.deadline(id) {
            Some(d) if d > give_up_at => true,
            Some(_) => {
                self.metrics.proposals_failed.inc();
                self.wait.trigger(id, Err(ServerError::ProposeDeadline));
                false
            }
            None => false,
        }
    }

    /// Answers the proposer of `id` whose proposal raft refused.
    fn proposal_failed(&self, id: u64, e: &raft::Error) {
        self.metrics.proposals_failed.inc();
        let err = match e {
            raft::Error::ProposalDropped => ServerError::ProposalDropped,
            other => ServerError::internal(format!("retcd: raft refused the proposal: {other}")),
        };
        self.wait.trigger(id, Err(err));
    }

    /// Whether a conf change proposed now is held back: no leader, or the
    /// leader's previous change not yet applied.
    fn conf_change_waits(&self) -> bool {
        let r = &self.raw.raft;
        r.leader_id == raft::INVALID_ID || (r.state == StateRole::Leader && r.has_pending_conf())
    }

    /// Proposes the held conf changes once nothing holds them back; those
    /// whose callers' deadlines are near are given up as held proposals
    /// are ([`Self::release_held`]), those already answered are dropped.
    fn retry_deferred_conf_changes(&mut self, turn: &mut Turn) {
        if turn.deferred.is_empty() {
            return;
        }
        let give_up_at = self.give_up_at();
        let waits = self.conf_change_waits();
        for (id, cc) in std::mem::take(&mut turn.deferred) {
            if !self.still_held(id, give_up_at) {
                continue;
            }
            if waits {
                turn.deferred.push((id, cc));
            } else {
                self.propose_conf_change(id, cc, turn);
            }
        }
    }

    /// Applies a committed membership change: checks it (as etcd's
    /// `ValidateConfigurationChange`), updates the member list (memory and
    /// the batch's `members` table), raft's configuration and the
    /// transport. A rejected change leaves raft's configuration alone.
    /// (Takes the node's parts, not `self`: the batch borrows the store.)
    fn apply_member_change(
        raw: &mut RawNode<RaftStorage>,
        applier: &Applier,
        transport: &Transport,
        max_learners: usize,
        removed_at: &mut Option<Instant>,
        batch: &mut retcd_mvcc::WriteBatch<'_>,
        cc: &ConfChange,
    ) -> ApplyResult {
        let members = &applier.members;
        let change = match membership::apply_conf_change(members, batch, cc, max_learners) {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::warn!(node = %Hex(cc.node_id), error = %e, "conf change rejected");
                return ApplyResult::Err(e);
            }
            Err(e) => fatal(&format!("failed to save members to the backend: {e}")),
        };
        // An update changes only peer URLs: raft's configuration stays.
        if !matches!(change, Change::Updated(_)) {
            match raw.apply_conf_change(cc) {
                Ok(cs) => raw.store().set_conf_state(cs),
                Err(err) => tracing::warn!(error = %err, "raft refused conf change"),
            }
        }
        let self_id = raw.raft.id;
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
                removed_at.get_or_insert_with(Instant::now);
            }
            Change::Removed(id) => transport.remove_peer(id),
            Change::Updated(m) if m.id != self_id => transport.update_peer(m.id, &m.peer_urls),
            Change::Updated(_) | Change::Promoted(_) => {}
        }
        ApplyResult::Empty
    }

    fn send(&self, msgs: Vec<raft::eraftpb::Message>, turn: &mut Turn) {
        turn.notice.on_send(&msgs);
        self.transport.send(msgs);
    }

    /// Handles one Ready (and the LightReady after it). Returns the number of
    /// entries applied.
    fn on_ready(&mut self, turn: &mut Turn) -> u64 {
        let mut rd = self.raw.ready();
        if !rd.messages().is_empty() {
            self.send(rd.take_messages(), turn);
        }
        if !rd.snapshot().is_empty() {
            self.apply_snapshot(rd.snapshot().clone());
        }
        let entries = rd.take_entries();
        let hs = rd.hs().cloned();
        // A hard state that only moved the commit index is not written: raft
        // needs no commit index on disk (a restart takes the highest of the
        // logged one and the backend's applied index, and the leader tells
        // the rest again), and writing it put a device write (`O_DIRECT`)
        // between a quorum's answers and the apply, on the leader for every
        // write and on a follower for every commit it learnt. The next save
        // with entries or a new term or vote writes the hard state of then.
        // etcd writes it, into the page cache.
        let commit_only = entries.is_empty() && !rd.must_sync();
        if !commit_only {
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
            // depends on them (with --unsafe-no-fsync the WAL itself never
            // syncs)
            let must_sync = rd.must_sync();
            let written: usize = wal_entries.iter().map(|e| e.data.len()).sum::<usize>()
                + hs_bytes.as_ref().map_or(0, |h| h.len());
            self.metrics.wal_write_bytes.add(written as i64);
            let started = Instant::now();
            let syncs = self.wal.sync_count();
            fp::point("raft_before_save_wal");
            if let Err(e) =
                fp::wal_save(&mut self.wal, hs_bytes.as_deref(), &wal_entries, must_sync)
            {
                fatal(&format!("failed to save to the WAL: {e}"));
            }
            fp::point("raft_after_save_wal");
            // only saves that really fdatasynced (also an earlier unsynced
            // save's catch-up sync; none under --unsafe-no-fsync)
            if self.wal.sync_count() > syncs {
                let took = started.elapsed();
                self.metrics.wal_fsync.observe(took.as_secs_f64());
                if took > WARN_SYNC {
                    tracing::warn!(
                        took = %crate::log::GoDuration(took),
                        expected_duration = %crate::log::GoDuration(WARN_SYNC),
                        "slow fdatasync"
                    );
                }
            }
            self.storage.append(&entries);
        }
        if let Some(h) = hs {
            self.storage.set_hard_state(h);
        }
        if !rd.persisted_messages().is_empty() {
            self.send(rd.take_persisted_messages(), turn);
        }
        turn.reads.on_read_states(rd.take_read_states());
        let mut applied = self.apply_entries(rd.take_committed_entries(), turn);
        let mut light = self.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.storage.set_commit(commit);
        }
        if !light.messages().is_empty() {
            self.send(light.take_messages(), turn);
        }
        applied += self.apply_entries(light.take_committed_entries(), turn);
        self.raw.advance_apply();
        turn.reads.answer(self.storage.applied().0);
        self.maybe_snapshot();
        applied
    }

    /// Proposes NOSPACE for this member after an entry was applied over its
    /// quota (etcd's apply loop does the same), unless a NOSPACE alarm is
    /// raised already; again at most once a second until it is.
    fn maybe_raise_nospace(&mut self, turn: &mut Turn) {
        if !turn.nospace_due {
            return;
        }
        if self.applier.alarms.has(AlarmType::Nospace) {
            turn.nospace_due = false;
            turn.nospace_proposed = None;
            return;
        }
        if turn
            .nospace_proposed
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        let id = self.raw.raft.id;
        tracing::warn!(member = %Hex(id), "message exceeded backend quota; raising alarm");
        // (dropped while there is no leader: tried again a second later)
        let req = crate::apply::quota::nospace_alarm(id);
        let _ = self.raw.propose(vec![], req.encode_to_vec());
        turn.nospace_proposed = Some(Instant::now());
    }

    /// Applies committed entries in one MVCC batch and answers the
    /// proposers after the batch is committed (visible to readers).
    fn apply_entries(&mut self, entries: Vec<Entry>, turn: &mut Turn) -> u64 {
        if entries.is_empty() {
            return 0;
        }
        let applied_before = self.storage.applied().0;
        let applier = self.applier.clone();
        let mut batch = match applier.kv.begin_batch() {
            Ok(b) => b,
            Err(e) => fatal(&format!("failed to begin a backend batch: {e}")),
        };
        // The file does not grow before this batch commits.
        let size = match applier.quota_bytes {
            Some(_) => applier.kv.backend().size_cached(),
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
            match e.get_entry_type() {
                EntryType::EntryNormal if e.data.is_empty() => {}
                EntryType::EntryNormal => match InternalRaftRequest::decode(&e.data[..]) {
                    Ok(req) => {
                        let id = req.id;
                        let t0 = Instant::now();
                        let summary = Self::slow_summary(&req);
                        let done = applier.apply(&mut batch, req, e.index, size);
                        let took = t0.elapsed();
                        if took > self.cfg.warn_apply {
                            self.metrics.slow_apply.inc();
                            tracing::warn!(
                                took = %crate::log::GoDuration(took),
                                expected_duration = %crate::log::GoDuration(self.cfg.warn_apply),
                                prefix = "",
                                request = %format!("header:<ID:{} > {}", summary.0, summary.1),
                                "apply request took too long"
                            );
                        }
                        turn.nospace_due |= done.over_quota;
                        results.push((id, done.result));
                    }
                    Err(err) => {
                        tracing::error!(index = e.index, error = %err, "undecodable raft entry skipped")
                    }
                },
                EntryType::EntryConfChange => {
                    fp::point("raft_before_apply_conf_change");
                    let mut cc = ConfChange::default();
                    if cc.merge_from_bytes(&e.data).is_ok() {
                        let res = Self::apply_member_change(
                            &mut self.raw,
                            &applier,
                            &self.transport,
                            self.cfg.max_learners,
                            &mut turn.removed_at,
                            &mut batch,
                            &cc,
                        );
                        results.push((cc.id, res));
                    }
                    fp::point("raft_after_apply_conf_change");
                }
                EntryType::EntryConfChangeV2 => {
                    fp::point("raft_before_apply_conf_change");
                    let mut cc = ConfChangeV2::default();
                    if cc.merge_from_bytes(&e.data).is_ok() {
                        match self.raw.apply_conf_change(&cc) {
                            Ok(cs) => self.storage.set_conf_state(cs),
                            Err(err) => tracing::warn!(error = %err, "conf change rejected"),
                        }
                    }
                    fp::point("raft_after_apply_conf_change");
                }
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
        fp::point("raft_before_commit_backend");
        match batch.commit(false) {
            // the rows went to the memtable: not a backend commit
            Ok(false) => {}
            Ok(true) => self
                .metrics
                .backend_commit
                .observe(started.elapsed().as_secs_f64()),
            Err(e) => fatal(&format!("failed to commit to the backend: {e}")),
        }
        fp::point("raft_after_commit_backend");
        self.storage.set_applied(last.0, last.1);
        self.status.set_applied(last.0);
        applier.after_commit(events);
        self.wait
            .trigger_batch(results.into_iter().map(|(id, r)| (id, Ok(r))));
        n
    }

    /// At shutdown, after the last durable commit: the backend file is
    /// closed cleanly, so the next start skips redb's repair pass.
    fn close_backend(&mut self) {
        match self.applier.kv.close(Duration::from_secs(2)) {
            Ok(true) => tracing::info!("backend: closed"),
            Ok(false) => {
                tracing::warn!("backend: still in use at shutdown; the next start repairs it")
            }
            Err(e) => tracing::warn!(error = %e, "backend: close failed"),
        }
    }

    /// The periodic durable commit: started in the background (the
    /// memtable is frozen and written on the store's writer thread while
    /// applies go on). False while the previous one still runs, unless
    /// `undurable_ops` has grown to four times `--backend-batch-limit`:
    /// then it waits for it and commits here, bounding the memory.
    fn make_durable(&mut self, undurable_ops: u64) -> bool {
        match self.applier.kv.write_out_background() {
            Ok(true) => true,
            Ok(false) if undurable_ops >= self.cfg.batch_limit.saturating_mul(4) => {
                self.commit_durable();
                true
            }
            Ok(false) => false,
            Err(e) => fatal(&format!("failed to commit to the backend durably: {e}")),
        }
    }

    /// A durable commit of everything applied, before returning.
    fn commit_durable(&mut self) {
        match self.applier.kv.begin_batch() {
            Ok(b) => {
                let started = Instant::now();
                if let Err(e) = b.commit(true) {
                    fatal(&format!("failed to commit to the backend durably: {e}"));
                }
                self.metrics
                    .backend_commit
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(e) => fatal(&format!("failed to begin a backend batch: {e}")),
        }
    }

    /// What a slow-apply warning names: the request's id and kind (no keys
    /// or values; cheap, as it runs for every entry).
    fn slow_summary(req: &InternalRaftRequest) -> (u64, &'static str) {
        use retcd_api::retcdpb::internal_raft_request::Request as R;
        let kind = match &req.request {
            Some(R::Range(_)) => "range",
            Some(R::Put(_)) => "put",
            Some(R::DeleteRange(_)) => "delete_range",
            Some(R::Txn(_)) => "txn",
            Some(R::Compaction(_)) => "compaction",
            Some(R::LeaseGrant(_)) => "lease_grant",
            Some(R::LeaseRevoke(_)) => "lease_revoke",
            Some(R::Alarm(_)) => "alarm",
            Some(R::LeaseCheckpoint(_)) => "lease_checkpoint",
            Some(R::MemberAttributes(_)) => "cluster_member_attr_set",
            Some(_) => "auth",
            None => "none",
        };
        (req.id, kind)
    }

    /// A follower far behind receives the leader's MVCC store.
    fn apply_snapshot(&mut self, snap: Snapshot) {
        let meta = snap.get_metadata().clone();
        tracing::info!(
            index = meta.index,
            term = meta.term,
            snapshot_bytes = snap.data.len(),
            "applying snapshot from leader"
        );
        fp::point("raft_before_apply_snapshot");
        self.metrics.snapshot_apply_in_progress.set(1);
        let kv = &self.applier.kv;
        let started = Instant::now();
        if let Err(e) = kv.restore_from(&snap.data) {
            fatal(&format!("failed to restore snapshot: {e}"));
        }
        self.metrics
            .snap_db_save_total
            .observe(started.elapsed().as_secs_f64());
        match membership::load(kv.backend()) {
            Ok(m) if !m.is_empty() => {
                // A member that joined learns its peers here.
                for p in &m {
                    self.transport.add_peer(p.id, &p.peer_urls);
                }
                self.applier.members.replace(m);
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
        let started = Instant::now();
        if let Err(e) = self.wal.save_snapshot(&WalSnapshot {
            index: meta.index,
            term: meta.term,
            payload,
        }) {
            fatal(&format!("failed to save snapshot record to the WAL: {e}"));
        }
        self.metrics
            .snap_fsync
            .observe(started.elapsed().as_secs_f64());
        self.snapshot_index = meta.index;
        self.status.set_applied(meta.index);
        self.storage.apply_snapshot_meta(meta);
        if let Err(e) = self.applier.after_restore() {
            fatal(&format!("{e:#}"));
        }
        self.metrics.snapshot_apply_in_progress.set(0);
        fp::point("raft_after_apply_snapshot");
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
        let save_started = Instant::now();
        self.commit_durable();
        fp::point("raft_before_save_snapshot");
        let started = Instant::now();
        let payload = self
            .storage
            .conf_state()
            .write_to_bytes()
            .expect("encode conf state");
        self.metrics
            .snap_save_marshalling
            .observe(started.elapsed().as_secs_f64());
        let started = Instant::now();
        if let Err(e) = self.wal.save_snapshot(&WalSnapshot {
            index: applied,
            term,
            payload,
        }) {
            fatal(&format!("failed to save snapshot record to the WAL: {e}"));
        }
        let m = self.metrics;
        m.snap_fsync.observe(started.elapsed().as_secs_f64());
        m.snap_save_total
            .observe(save_started.elapsed().as_secs_f64());
        self.snapshot_index = applied;
        fp::point("raft_after_save_snapshot");
        if let Err(e) = self.wal.release_keeping(applied, self.cfg.max_wals) {
            tracing::warn!(error = %e, "failed to release old WAL segments");
        }
        let compact_to = applied.saturating_sub(self.cfg.catchup_entries);
        self.storage.compact(compact_to); // a no-op when not past the first index
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

    /// etcd raft's `Status.MarshalJSON` (IDs in hex, Go's state names;
    /// the progress of every member on the leader only).
    fn status_json(&self) -> String {
        let r = &self.raw.raft;
        let role = match r.state {
            StateRole::Follower => "StateFollower",
            StateRole::Candidate => "StateCandidate",
            StateRole::Leader => "StateLeader",
            StateRole::PreCandidate => "StatePreCandidate",
        };
        let mut progress = Vec::new();
        if r.state == StateRole::Leader {
            for (id, pr) in r.prs().iter() {
                let state = match pr.state {
                    raft::ProgressState::Probe => "StateProbe",
                    raft::ProgressState::Replicate => "StateReplicate",
                    raft::ProgressState::Snapshot => "StateSnapshot",
                };
                progress.push(format!(
                    r#""{id:x}":{{"match":{},"next":{},"state":"{state}"}}"#,
                    pr.matched, pr.next_idx
                ));
            }
        }
        format!(
            r#"{{"id":"{:x}","term":{},"vote":"{:x}","commit":{},"lead":"{:x}","raftState":"{role}","applied":{},"progress":{{{}}},"leadtransferee":"{:x}"}}"#,
            r.id,
            r.term,
            r.vote,
            r.raft_log.committed,
            r.leader_id,
            r.raft_log.applied,
            progress.join(","),
            r.lead_transferee.unwrap_or(0)
        )
    }

    fn publish_status(&self) {
        let r = &self.raw.raft;
        self.status.publish(
            r.term,
            r.leader_id,
            r.state == StateRole::Leader,
            r.raft_log.committed,
            r.raft_log.last_index(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::test_cluster::{self, cluster, node, pump};
    use raft::eraftpb::Message;
    use raft::storage::MemStorage;

    fn ready(n: &mut RawNode<MemStorage>) -> Vec<Message> {
        test_cluster::ready(n, |_, _| {})
    }

    fn entry(data: &[u8]) -> Entry {
        Entry {
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    fn appends_to(msgs: &[Message], to: u64) -> Vec<usize> {
        msgs.iter()
            .filter(|m| m.get_msg_type() == MessageType::MsgAppend && m.to == to)
            .map(|m| m.entries.len())
            .collect()
    }

    #[test]
    fn test_a_batch_goes_to_each_follower_in_one_append() {
        let mut nodes = cluster();
        let batch: Vec<Entry> = (0..5u8).map(|i| entry(&[b'p', i])).collect();
        propose_batch(&mut nodes[0].raft, batch).expect("proposed");
        let out = ready(&mut nodes[0]);
        assert_eq!(appends_to(&out, 2), vec![5]);
        assert_eq!(appends_to(&out, 3), vec![5]);
        // each follower answers its one append once
        for to in [2u64, 3] {
            let m = out.iter().find(|m| m.to == to).unwrap().clone();
            nodes[to as usize - 1].step(m).expect("step");
            let answers = ready(&mut nodes[to as usize - 1]);
            let acks: Vec<_> = answers
                .iter()
                .filter(|m| m.get_msg_type() == MessageType::MsgAppendResponse)
                .collect();
            assert_eq!(acks.len(), 1);
            nodes[0].step(acks[0].clone()).expect("step the answer");
        }
        let last = nodes[0].raft.raft_log.last_index();
        assert_eq!(nodes[0].raft.raft_log.committed, last);
    }

    #[test]
    fn test_entries_appended_one_by_one_in_a_turn_share_one_append() {
        // (what batch_append does for a follower's forwarded proposals,
        // each its own message)
        let mut nodes = cluster();
        for i in 0..4u8 {
            propose_batch(&mut nodes[0].raft, vec![entry(&[b'q', i])]).expect("proposed");
        }
        let out = ready(&mut nodes[0]);
        assert_eq!(appends_to(&out, 2), vec![4]);
        assert_eq!(appends_to(&out, 3), vec![4]);
    }

    #[test]
    fn test_a_follower_forwards_a_batch_in_one_message() {
        let mut nodes = cluster();
        let batch: Vec<Entry> = (0..3u8).map(|i| entry(&[b'f', i])).collect();
        propose_batch(&mut nodes[1].raft, batch).expect("forwarded");
        let out = ready(&mut nodes[1]);
        let props: Vec<_> = out
            .iter()
            .filter(|m| m.get_msg_type() == MessageType::MsgPropose)
            .collect();
        assert_eq!(props.len(), 1);
        assert_eq!((props[0].to, props[0].entries.len()), (1, 3));
        let before = nodes[0].raft.raft_log.last_index();
        pump(&mut nodes, out);
        let data: Vec<Vec<u8>> = nodes[2]
            .raft
            .raft_log
            .entries(before + 1, None, raft::GetEntriesContext::empty(false))
            .unwrap()
            .iter()
            .map(|e| e.data.to_vec())
            .collect();
        assert_eq!(
            data,
            vec![b"f\0".to_vec(), b"f\x01".to_vec(), b"f\x02".to_vec()]
        );
    }

    #[test]
    fn test_a_batch_without_a_leader_is_refused_whole() {
        let mut n = node(1);
        let err = propose_batch(&mut n.raft, vec![entry(b"a"), entry(b"b")]).unwrap_err();
        assert!(matches!(err, raft::Error::ProposalDropped), "{err:?}");
        assert!(ready(&mut n).is_empty());
    }
}
