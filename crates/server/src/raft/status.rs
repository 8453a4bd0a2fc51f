//! What the raft thread publishes after every loop turn, for everyone
//! else to read without a lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

#[derive(Debug, Default)]
pub struct RaftStatus {
    term: AtomicU64,
    leader: AtomicU64,
    is_leader: AtomicBool,
    commit_index: AtomicU64,
    applied_index: AtomicU64,
    raft_index: AtomicU64,
    /// When this member last learned of a new leader (etcd's
    /// `leadElectedTime`: a leader known after none or after another).
    /// Protects only the instant; read when a proposal times out.
    lead_elected: parking_lot::Mutex<Option<Instant>>,
}

impl RaftStatus {
    /// A status whose applied index is `applied` (the rest comes with the
    /// raft thread's first turn).
    pub fn starting_at(applied: u64) -> RaftStatus {
        let s = RaftStatus::default();
        s.applied_index.store(applied, Ordering::Release);
        s
    }

    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }
    /// The leader's id, 0 when none is known.
    pub fn leader(&self) -> u64 {
        self.leader.load(Ordering::Acquire)
    }
    pub fn is_leader(&self) -> bool {
        self.is_leader.load(Ordering::Acquire)
    }
    pub fn commit_index(&self) -> u64 {
        self.commit_index.load(Ordering::Acquire)
    }
    pub fn applied_index(&self) -> u64 {
        self.applied_index.load(Ordering::Acquire)
    }
    /// The raft log's last index.
    pub fn raft_index(&self) -> u64 {
        self.raft_index.load(Ordering::Acquire)
    }

    /// When this member last learned of a new leader, if ever.
    pub fn lead_elected(&self) -> Option<Instant> {
        *self.lead_elected.lock()
    }

    // Written by the raft thread only.
    pub(super) fn set_lead_elected(&self, at: Instant) {
        *self.lead_elected.lock() = Some(at);
    }
    pub(super) fn publish(&self, term: u64, leader: u64, is_leader: bool, commit: u64, last: u64) {
        self.term.store(term, Ordering::Release);
        self.leader.store(leader, Ordering::Release);
        self.is_leader.store(is_leader, Ordering::Release);
        self.commit_index.store(commit, Ordering::Release);
        self.raft_index.store(last, Ordering::Release);
    }
    pub(super) fn set_applied(&self, index: u64) {
        self.applied_index.store(index, Ordering::Release);
    }
}
