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
//!
//! A notice to a replicating follower is an append with no entries at the
//! follower's next index: its answer would tell the leader nothing the
//! answers to the appends that carried the entries do not. The leader marks
//! it ([`MARK`] in the message's context, which raft-rs leaves unused on an
//! append) and the follower drops its accepting answer to it
//! ([`step`]); a rejection still goes back. A dropped answer is a
//! lost message to raft, which it survives by design; a member that does
//! not know the mark answers as before, so mixed versions still agree.

use raft::eraftpb::{Message, MessageType};
use raft::{ProgressState, Raft, RawNode, StateRole, Storage};
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
    pub fn check<S: Storage>(&mut self, raft: &mut Raft<S>, now: Instant) {
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
            send_notice(raft, *id);
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
                    send_notice(raft, id);
                }
                None
            }
            Some(due) => Some(due),
            None => Some(now + DELAY),
        };
    }
}

/// The context of a commit notice whose accepting answer is not needed.
pub const MARK: &[u8] = b"retcd:notice";

/// Queues the append that tells `to` the commit index, marked as a notice
/// when it carries no entries to a replicating follower (a probe's answer
/// is needed, and so is one for entries: it frees raft's in-flight slot).
fn send_notice<S: Storage>(raft: &mut Raft<S>, to: u64) {
    let replicating = raft
        .prs()
        .get(to)
        .is_some_and(|pr| pr.state == ProgressState::Replicate);
    let queued = raft.msgs.len();
    raft.send_append(to);
    if !replicating || raft.msgs.len() != queued + 1 {
        // (with batch_append an append already queued for `to` took it)
        return;
    }
    if let Some(m) = raft.msgs.last_mut() {
        if m.get_msg_type() == MessageType::MsgAppend && m.to == to && m.entries.is_empty() {
            m.context = MARK.to_vec().into();
        }
    }
}

/// Steps `m` into `raw`; when it is a marked notice (an append with no
/// entries: raft-rs may have batched entries into it after it was marked,
/// and then it is an append like any other), drops the accepting answer
/// the step queued.
pub fn step<S: Storage>(raw: &mut RawNode<S>, m: Message) -> raft::Result<()> {
    let notice = (m.get_msg_type() == MessageType::MsgAppend
        && m.entries.is_empty()
        && m.context[..] == *MARK)
        .then_some(m.from);
    let queued = raw.raft.msgs.len();
    raw.step(m)?;
    if let Some(leader) = notice {
        let msgs = &mut raw.raft.msgs;
        let mut i = queued;
        while i < msgs.len() {
            let a = &msgs[i];
            if a.get_msg_type() == MessageType::MsgAppendResponse && a.to == leader && !a.reject {
                msgs.remove(i);
            } else {
                i += 1;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::test_cluster::{self, cluster, pump};
    use raft::eraftpb::Entry;
    use raft::storage::MemStorage;

    fn ready(n: &mut RawNode<MemStorage>) -> Vec<Message> {
        test_cluster::ready(n, |_, _| {})
    }

    /// The one message the leader's next Ready sends member 2.
    fn sent_to_2(leader: &mut RawNode<MemStorage>) -> Message {
        let out = ready(leader);
        let to_2: Vec<_> = out.iter().filter(|m| m.to == 2).collect();
        assert_eq!(to_2.len(), 1, "{out:?}");
        to_2[0].clone()
    }

    /// A fresh cluster whose leader committed a write member 2 forwarded,
    /// the notice not yet checked.
    fn committed_forwarded_write() -> (Vec<RawNode<MemStorage>>, CommitNotice) {
        let mut nodes = cluster();
        let mut notice = CommitNotice::default();
        commit_a_forwarded_write(&mut nodes, &mut notice);
        (nodes, notice)
    }

    fn answers_to_leader(msgs: &[Message]) -> Vec<&Message> {
        msgs.iter()
            .filter(|m| m.get_msg_type() == MessageType::MsgAppendResponse && m.to == 1)
            .collect()
    }

    /// Member 1 commits a write member 2 forwarded: the leader's appends
    /// go out and are answered, and the commit is left for the notice.
    fn commit_a_forwarded_write(nodes: &mut [RawNode<MemStorage>], notice: &mut CommitNotice) {
        let mut prop = Message::default();
        prop.set_msg_type(MessageType::MsgPropose);
        prop.from = 2;
        prop.to = 1;
        prop.set_entries(
            vec![Entry {
                data: b"w".to_vec().into(),
                ..Default::default()
            }]
            .into(),
        );
        nodes[0].step(prop).expect("propose");
        notice.on_forwarded(2, nodes[0].raft.raft_log.last_index());
        let appends = ready(&mut nodes[0]);
        let mut acks = Vec::new();
        for m in appends {
            let to = m.to as usize - 1;
            step(&mut nodes[to], m).expect("step");
            acks.extend(ready(&mut nodes[to]));
        }
        for m in acks {
            nodes[0].step(m).expect("step the answer");
        }
        let last = nodes[0].raft.raft_log.last_index();
        assert_eq!(nodes[0].raft.raft_log.committed, last);
        assert!(nodes[1].raft.raft_log.committed < last, "not told yet");
    }

    #[test]
    fn test_a_follower_applies_a_notice_and_does_not_answer_it() {
        let (mut nodes, mut notice) = committed_forwarded_write();
        notice.check(&mut nodes[0].raft, Instant::now());
        let sent = sent_to_2(&mut nodes[0]);
        assert_eq!(sent.get_msg_type(), MessageType::MsgAppend);
        assert!(sent.entries.is_empty());
        assert_eq!(&sent.context[..], MARK);
        let last = nodes[0].raft.raft_log.last_index();
        step(&mut nodes[1], sent.clone()).expect("step");
        let answers = ready(&mut nodes[1]);
        assert_eq!(nodes[1].raft.raft_log.committed, last);
        assert_eq!(nodes[1].raft.raft_log.applied, last);
        assert!(answers_to_leader(&answers).is_empty(), "{answers:?}");
        // the same message, unmarked, is answered (what a member that does
        // not know the mark does)
        let mut plain = sent;
        plain.context = Vec::new().into();
        step(&mut nodes[1], plain).expect("step");
        assert_eq!(answers_to_leader(&ready(&mut nodes[1])).len(), 1);
    }

    #[test]
    fn test_a_rejected_notice_is_still_answered() {
        let (mut nodes, mut notice) = committed_forwarded_write();
        notice.check(&mut nodes[0].raft, Instant::now());
        let mut m = sent_to_2(&mut nodes[0]);
        // an index the follower does not hold: it must say so
        m.index += 5;
        m.log_term = nodes[0].raft.term;
        step(&mut nodes[1], m).expect("step");
        let answers = ready(&mut nodes[1]);
        let to_leader = answers_to_leader(&answers);
        assert_eq!(to_leader.len(), 1, "{answers:?}");
        assert!(to_leader[0].reject);
    }

    #[test]
    fn test_entries_batched_into_a_notice_are_answered() {
        let (mut nodes, mut notice) = committed_forwarded_write();
        notice.check(&mut nodes[0].raft, Instant::now());
        // a proposal before the Ready goes out joins the queued notice
        // (batch_append)
        nodes[0].propose(vec![], b"next".to_vec()).expect("propose");
        let sent = sent_to_2(&mut nodes[0]);
        assert_eq!(sent.entries.len(), 1, "batched into the notice");
        step(&mut nodes[1], sent).expect("step");
        let answers = ready(&mut nodes[1]);
        assert_eq!(answers_to_leader(&answers).len(), 1, "{answers:?}");
    }

    #[test]
    fn test_a_probe_is_not_marked() {
        let (mut nodes, mut notice) = committed_forwarded_write();
        nodes[0].raft.mut_prs().get_mut(2).unwrap().become_probe();
        notice.check(&mut nodes[0].raft, Instant::now());
        assert!(sent_to_2(&mut nodes[0]).context.is_empty());
    }

    #[test]
    fn test_a_cluster_with_notices_keeps_committing() {
        // many forwarded writes, every message through `step`: the leader
        // still learns each follower's progress from the appends' answers
        let mut nodes = cluster();
        let mut notice = CommitNotice::default();
        for i in 0..20u8 {
            commit_a_forwarded_write(&mut nodes, &mut notice);
            notice.check(&mut nodes[0].raft, Instant::now());
            let seen = pump(&mut nodes, Vec::new());
            assert!(
                seen.iter().any(|m| &m.context[..] == MARK),
                "write {i}: a notice went out"
            );
        }
        // member 3 forwarded nothing: its notice is due DELAY later
        let last = nodes[0].raft.raft_log.last_index();
        assert!(nodes[2].raft.raft_log.committed < last);
        notice.check(&mut nodes[0].raft, Instant::now());
        notice.check(&mut nodes[0].raft, Instant::now() + DELAY);
        pump(&mut nodes, Vec::new());
        for n in &nodes {
            assert_eq!(n.raft.raft_log.applied, last);
        }
        for id in [2u64, 3] {
            let pr = nodes[0].raft.prs().get(id).unwrap();
            assert_eq!((pr.matched, pr.state), (last, ProgressState::Replicate));
        }
    }
}
