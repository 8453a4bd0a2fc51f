//! When a leader tells its followers that entries committed.
//!
//! raft-rs, like etcd's raft, sends every follower an append as soon as the
//! leader's commit index moves, even with no entry in it: one more message
//! each way per follower per commit, and on the follower a raft turn, a WAL
//! write of the hard state and an answer. Under a steady stream of writes
//! the next append carries the new commit index anyway. So the leader runs
//! with raft-rs's `skip_bcast_commit` and this sends the commit itself:
//!
//! * at once to a follower that forwarded a proposal now committed (its
//!   client waits for the follower to apply it);
//! * to everyone else [`DELAY`] after the commit, unless a message that
//!   carried it (an append or a heartbeat) went out meanwhile.
//!
//! Followers' linearizable reads are not delayed: the leader's ReadIndex
//! heartbeats carry the commit index. A membership change still makes
//! raft-rs broadcast at once.

use super::storage::RaftStorage;
use raft::eraftpb::{Message, MessageType};
use raft::{ProgressState, Raft, StateRole};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a commit index may wait to ride on the next append before it
/// is sent on its own. A single client's next put reaches the leader well
/// within it; a follower's watchers and serializable reads see a write at
/// most this much later than they would otherwise.
pub const DELAY: Duration = Duration::from_millis(2);

#[derive(Default)]
pub struct CommitNotice {
    /// Per follower, the highest commit index a message sent to it carried
    /// (this term; cleared when this member is not the leader).
    sent: HashMap<u64, u64>,
    /// Followers that forwarded proposals, with the last log index at the
    /// time: they need the commit as soon as it reaches that index.
    forwarded: Vec<(u64, u64)>,
    /// When the commit index is sent to every follower still behind it.
    due: Option<Instant>,
}

impl CommitNotice {
    /// Records the commit index carried by messages about to be sent.
    pub fn on_send(&mut self, msgs: &[Message]) {
        for m in msgs {
            if matches!(
                m.get_msg_type(),
                MessageType::MsgAppend | MessageType::MsgHeartbeat
            ) {
                let c = self.sent.entry(m.to).or_default();
                *c = (*c).max(m.commit);
            }
        }
    }

    /// A follower's forwarded proposal was appended up to `last_index`.
    pub fn on_forwarded(&mut self, from: u64, last_index: u64) {
        self.forwarded.push((from, last_index));
    }

    /// When the commit index is next sent on its own, if it is pending.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Queues the appends that are due in `raft` (sent with its next
    /// Ready) and sets when the next one falls due.
    pub fn check(&mut self, raft: &mut Raft<RaftStorage>, now: Instant) {
        if raft.state != StateRole::Leader {
            self.sent.clear();
            self.forwarded.clear();
            self.due = None;
            return;
        }
        // Messages raft queued go out with the next Ready.
        self.on_send(&raft.msgs);
        let committed = raft.raft_log.committed;
        // A forwarded proposal's follower is told as soon as the entry is
        // committed and sent to it (appends to a replicating follower
        // arrive in order, so it need not have acknowledged it yet).
        let mut told = Vec::new();
        self.forwarded.retain(|(id, last)| {
            let Some(pr) = raft.prs().get(*id) else {
                return false;
            };
            let sent_up_to = if pr.state == ProgressState::Replicate {
                pr.next_idx - 1
            } else {
                pr.matched
            };
            let can_commit = committed.min(sent_up_to);
            if *last > can_commit {
                return true;
            }
            if can_commit > self.sent.get(id).copied().unwrap_or(0) && !told.contains(id) {
                told.push(*id);
            }
            false
        });
        for id in &told {
            raft.send_append(*id);
        }
        // The others: a follower can use a newer commit index up to what
        // it holds.
        let me = raft.id;
        let lagging: Vec<u64> = raft
            .prs()
            .iter()
            .filter(|(id, pr)| {
                **id != me
                    && !told.contains(id)
                    && committed.min(pr.matched) > self.sent.get(id).copied().unwrap_or(0)
            })
            .map(|(id, _)| *id)
            .collect();
        self.due = match self.due {
            _ if lagging.is_empty() => None,
            Some(due) if now >= due => {
                for id in lagging {
                    raft.send_append(id);
                }
                None
            }
            Some(due) => Some(due),
            None => Some(now + DELAY),
        };
    }
}
