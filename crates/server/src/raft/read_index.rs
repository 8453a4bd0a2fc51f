//! Linearizable reads, batched as etcd's `linearizableReadLoop`: one
//! ReadIndex in flight at a time; reads arriving meanwhile share the next
//! one (on several members each ReadIndex is a heartbeat round and
//! messages on every member; a sole voter answers at once). When the read
//! state returns index *i*, its reads are released once applied ≥ *i*.
//! An unanswered ReadIndex is sent again every [`READ_INDEX_RETRY`] (raft
//! drops it while there is no leader, or before the leader has committed
//! an entry of its term) and given up after [`READ_INDEX_GIVE_UP`].
//!
//! A ReadIndex's context must never have been used before by any member,
//! and a ReadIndex sent again gets a new one:
//! raft's leader keys pending reads by their context alone, counts every
//! heartbeat response echoing it as an acknowledgement, and a leader
//! sends the context of its newest pending read (its own or one a
//! follower forwarded) on every heartbeat. With a context used earlier, a
//! leader that was paused and has since been deposed confirms a new read
//! with responses its followers sent before the pause, and answers from
//! its stale state. So the context is this member's id followed by a
//! counter seeded from the clock (etcd uses its request id generator).
//! raft's leader also releases, with a confirmed read, every read queued
//! before it: a retry re-sending an answered context would be queued
//! behind newer reads, and a late response to the context's first
//! heartbeat would confirm them (robustness `pause_leader`, seed 104).

use crate::error::ServerError;
use raft::{RawNode, ReadState, Storage};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

/// How often an unanswered ReadIndex is sent again (etcd: 500 ms).
const READ_INDEX_RETRY: Duration = Duration::from_millis(500);
/// An unanswered ReadIndex is given up after this long (its callers have
/// timed out by then).
const READ_INDEX_GIVE_UP: Duration = Duration::from_secs(30);

pub(crate) type Reader = oneshot::Sender<Result<(), ServerError>>;

/// The callers' half of the batching: reads wait here until the raft
/// thread takes them all at once, and only the first read since it last
/// took them sends it an input (a wake-up). One input per read woke the
/// raft thread for nearly every other read at 100 clients (0.43 sleeps
/// per read, 2.75 µs of its CPU each). A read queued before the take is
/// covered by a ReadIndex issued after it arrived, as before.
#[derive(Default)]
pub(crate) struct ReadQueue {
    /// Guards the reads not yet taken and the two flags; held only to
    /// push or take, never across a wait.
    state: parking_lot::Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    readers: Vec<Reader>,
    /// An input for the readers is on its way to the raft thread.
    told: bool,
    /// The raft thread has gone: reads fail at once.
    closed: bool,
}

impl ReadQueue {
    /// Queues a read: `Ok(true)` if the raft thread is to be told (the
    /// first read since it last took them); `Stopped` once it has gone.
    pub(crate) fn push(&self, reader: Reader) -> Result<bool, ServerError> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(ServerError::Stopped);
        }
        s.readers.push(reader);
        Ok(!std::mem::replace(&mut s.told, true))
    }

    /// Every queued read (the raft thread's take, or a caller's whose
    /// input could not be sent).
    pub(crate) fn take(&self) -> Vec<Reader> {
        let mut s = self.state.lock();
        s.told = false;
        std::mem::take(&mut s.readers)
    }

    /// The raft thread is gone: queued reads fail (`Stopped`: their
    /// senders are dropped), and so does every later one.
    pub(crate) fn close(&self) {
        let readers = {
            let mut s = self.state.lock();
            s.closed = true;
            std::mem::take(&mut s.readers)
        };
        drop(readers);
    }
}

struct InflightRead {
    first_sent: Instant,
    last_sent: Instant,
    waiters: Vec<Reader>,
}

/// The raft thread's reads; see the module documentation.
pub(super) struct Reads {
    /// This member's id: the first half of every context it sends.
    member: u64,
    /// Reads waiting for the next ReadIndex to be issued.
    pending: Vec<Reader>,
    /// ReadIndex requests in flight, by the counter in their context.
    inflight: HashMap<u64, InflightRead>,
    /// Reads whose index is known, waiting for applied ≥ index.
    waiting: Vec<(u64, Vec<Reader>)>,
    /// The next context's counter: the start time in nanoseconds, so a
    /// restarted member does not repeat the contexts it sent before.
    next_ctx: u64,
}

impl Reads {
    /// The reads of member `member`.
    pub(super) fn new(member: u64) -> Reads {
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Reads {
            member,
            pending: Vec::new(),
            inflight: HashMap::new(),
            waiting: Vec::new(),
            next_ctx: now_ns,
        }
    }

    /// The context of `member`'s ReadIndex `n`: the id, then `n`.
    fn context(member: u64, n: u64) -> Vec<u8> {
        let mut ctx = Vec::with_capacity(16);
        ctx.extend_from_slice(&member.to_be_bytes());
        ctx.extend_from_slice(&n.to_be_bytes());
        ctx
    }

    /// The counter of one of this member's contexts; None for anything
    /// else.
    fn counter(&self, ctx: &[u8]) -> Option<u64> {
        let (member, n) = ctx.split_at_checked(8)?;
        if member != self.member.to_be_bytes() {
            return None;
        }
        Some(u64::from_be_bytes(n.try_into().ok()?))
    }

    pub(super) fn extend(&mut self, readers: Vec<Reader>) {
        self.pending.extend(readers);
    }

    /// Sends a ReadIndex under a context never used before; its counter.
    fn send_new<S: Storage>(&mut self, raw: &mut RawNode<S>) -> u64 {
        self.next_ctx += 1;
        raw.read_index(Self::context(self.member, self.next_ctx));
        self.next_ctx
    }

    /// Issues one ReadIndex for every pending read, unless one is in flight.
    pub(super) fn issue<S: Storage>(&mut self, raw: &mut RawNode<S>) {
        if self.pending.is_empty() || !self.inflight.is_empty() {
            return;
        }
        let ctx = self.send_new(raw);
        let now = Instant::now();
        self.inflight.insert(
            ctx,
            InflightRead {
                first_sent: now,
                last_sent: now,
                waiters: std::mem::take(&mut self.pending),
            },
        );
    }

    /// Sends unanswered ReadIndex requests again; fails very old ones.
    /// Returns how many were given up and how many were sent again (etcd's
    /// slow read indexes).
    pub(super) fn retry<S: Storage>(&mut self, raw: &mut RawNode<S>) -> (u64, u64) {
        let now = Instant::now();
        let mut give_up = Vec::new();
        let mut resend = Vec::new();
        for (ctx, r) in self.inflight.iter() {
            if now.duration_since(r.first_sent) >= READ_INDEX_GIVE_UP {
                give_up.push(*ctx);
            } else if now.duration_since(r.last_sent) >= READ_INDEX_RETRY {
                resend.push(*ctx);
            }
        }
        // Sent again under a new context: the leader may have answered the
        // old one already (the answer lost), and heartbeat responses that
        // echo it may still be on their way; with the old context re-added
        // behind newer reads, one such response would confirm them too.
        let again = resend.len() as u64;
        for old in resend {
            if let Some(mut r) = self.inflight.remove(&old) {
                r.last_sent = now;
                let ctx = self.send_new(raw);
                self.inflight.insert(ctx, r);
            }
        }
        for ctx in &give_up {
            if let Some(r) = self.inflight.remove(ctx) {
                for w in r.waiters {
                    let _ = w.send(Err(ServerError::Timeout));
                }
            }
        }
        (give_up.len() as u64, again)
    }

    /// The read states of a Ready: their reads now wait for the index.
    pub(super) fn on_read_states(&mut self, states: Vec<ReadState>) {
        for rs in states {
            let Some(ctx) = self.counter(&rs.request_ctx) else {
                continue;
            };
            if let Some(r) = self.inflight.remove(&ctx) {
                self.waiting.push((rs.index, r.waiters));
            }
        }
    }

    /// Releases the reads whose index is applied.
    pub(super) fn answer(&mut self, applied: u64) {
        self.waiting.retain_mut(|(index, ws)| {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::test_cluster::{self, node};
    use raft::eraftpb::{Message, MessageType};
    use raft::storage::MemStorage;
    use tokio::sync::oneshot::error::TryRecvError;

    /// One Ready of `n`: persisted, applied, its read states given to
    /// `reads` (then answered up to the applied index); the messages out.
    fn ready(n: &mut RawNode<MemStorage>, reads: &mut Reads) -> Vec<Message> {
        test_cluster::ready(n, |states, applied| {
            reads.on_read_states(states);
            reads.answer(applied);
        })
    }

    /// Delivers `msgs` and everything they cause until the cluster is
    /// quiet; messages `hold` picks are kept back and returned instead.
    fn pump(
        nodes: &mut [RawNode<MemStorage>],
        reads: &mut [Reads],
        mut msgs: Vec<Message>,
        hold: impl Fn(&Message) -> bool,
    ) -> Vec<Message> {
        let mut held = Vec::new();
        for _ in 0..100 {
            for (i, n) in nodes.iter_mut().enumerate() {
                msgs.extend(ready(n, &mut reads[i]));
            }
            if msgs.is_empty() {
                return held;
            }
            for m in std::mem::take(&mut msgs) {
                if hold(&m) {
                    held.push(m);
                } else {
                    let _ = nodes[(m.to - 1) as usize].step(m);
                }
            }
        }
        panic!("the cluster did not settle");
    }

    /// Members 1–3 in memory with their reads, member 1 elected leader.
    fn led_by_1() -> (Vec<RawNode<MemStorage>>, Vec<Reads>) {
        let mut nodes = vec![node(1), node(2), node(3)];
        let mut reads = vec![Reads::new(1), Reads::new(2), Reads::new(3)];
        nodes[0].campaign().expect("campaign");
        pump(&mut nodes, &mut reads, Vec::new(), |_| false);
        assert_eq!(nodes[0].raft.state, raft::StateRole::Leader);
        (nodes, reads)
    }

    fn reader(reads: &mut Reads) -> oneshot::Receiver<Result<(), ServerError>> {
        let (tx, rx) = oneshot::channel();
        reads.extend(vec![tx]);
        rx
    }

    fn is(t: MessageType) -> impl Fn(&Message) -> bool {
        move |m| m.get_msg_type() == t
    }

    #[test]
    fn test_contexts_differ_between_members() {
        let a = Reads::new(1);
        assert_ne!(Reads::context(1, 5), Reads::context(2, 5));
        assert_eq!(a.counter(&Reads::context(1, 5)), Some(5));
        assert_eq!(a.counter(&Reads::context(2, 5)), None);
        assert_eq!(a.counter(&5u64.to_be_bytes()), None);
    }

    /// The pause_leader robustness failure (seed 104), in memory. Member
    /// 2's read is confirmed by the leader with member 3's heartbeat
    /// response; member 2's own response is late and the answer to member 2
    /// is lost. The leader is cut off and reads; member 2 sends its ReadIndex
    /// again. The late response must not confirm the leader's read (with
    /// the context re-sent, raft queued it behind the leader's read, and
    /// the late response released both: a deposed leader answered from
    /// its stale state).
    #[test]
    fn test_a_late_response_to_a_retried_read_confirms_no_newer_read() {
        let (mut nodes, mut reads) = led_by_1();

        let mut follower_read = reader(&mut reads[1]);
        reads[1].issue(&mut nodes[1]);
        let mut responses = pump(
            &mut nodes,
            &mut reads,
            Vec::new(),
            is(MessageType::MsgHeartbeatResponse),
        );
        assert_eq!(responses.len(), 2);
        let late = responses.remove(responses.iter().position(|m| m.from == 2).unwrap());
        // Member 3's response confirms it; the answer to member 2 is lost.
        let lost = pump(
            &mut nodes,
            &mut reads,
            responses,
            is(MessageType::MsgReadIndexResp),
        );
        assert_eq!(lost.len(), 1);
        assert!(matches!(follower_read.try_recv(), Err(TryRecvError::Empty)));

        // Cut off, the leader reads; member 2 sends its ReadIndex again.
        let mut leader_read = reader(&mut reads[0]);
        reads[0].issue(&mut nodes[0]);
        pump(
            &mut nodes,
            &mut reads,
            Vec::new(),
            is(MessageType::MsgHeartbeat),
        );
        for r in reads[1].inflight.values_mut() {
            r.last_sent -= READ_INDEX_RETRY;
        }
        assert_eq!(reads[1].retry(&mut nodes[1]), (0, 1));
        pump(
            &mut nodes,
            &mut reads,
            Vec::new(),
            is(MessageType::MsgHeartbeat),
        );

        // Member 2's late response arrives: it confirms nothing new.
        pump(
            &mut nodes,
            &mut reads,
            vec![late],
            is(MessageType::MsgHeartbeat),
        );
        assert!(matches!(leader_read.try_recv(), Err(TryRecvError::Empty)));
        assert!(matches!(follower_read.try_recv(), Err(TryRecvError::Empty)));
    }

    /// The pause_leader robustness failure (seed 2016), in memory: a
    /// follower's read is confirmed by heartbeat responses that echo its
    /// context; the leader then issues a read of its own, is cut off, and
    /// the followers' old responses arrive again. They must not confirm
    /// the new read (with a context every member counts from 1 they did,
    /// and a deposed leader answered a linearizable read from its stale
    /// state).
    #[test]
    fn test_old_heartbeat_responses_do_not_confirm_a_new_read() {
        let (mut nodes, mut reads) = led_by_1();
        assert!(nodes[0].raft.commit_to_current_term());

        // Member 2 reads: its ReadIndex goes to the leader, whose
        // heartbeats carry its context; their responses are kept.
        let mut follower_read = reader(&mut reads[1]);
        reads[1].issue(&mut nodes[1]);
        let responses = pump(
            &mut nodes,
            &mut reads,
            Vec::new(),
            is(MessageType::MsgHeartbeatResponse),
        );
        assert_eq!(responses.len(), 2, "both followers answered the heartbeat");
        assert!(responses.iter().all(|m| !m.context.is_empty()));
        pump(&mut nodes, &mut reads, responses.clone(), |_| false);
        assert!(matches!(follower_read.try_recv(), Ok(Ok(()))));

        // The leader reads; its heartbeats do not reach anyone.
        let mut leader_read = reader(&mut reads[0]);
        reads[0].issue(&mut nodes[0]);
        let cut_off = pump(
            &mut nodes,
            &mut reads,
            Vec::new(),
            is(MessageType::MsgHeartbeat),
        );
        assert_eq!(cut_off.len(), 2);
        // The old responses arrive again: the new read stays unanswered.
        let quiet = pump(&mut nodes, &mut reads, responses, |_| false);
        assert!(quiet.is_empty());
        assert!(matches!(leader_read.try_recv(), Err(TryRecvError::Empty)));
        // Its own heartbeats' responses confirm it.
        pump(&mut nodes, &mut reads, cut_off, |_| false);
        assert!(matches!(leader_read.try_recv(), Ok(Ok(()))));
    }

    /// The first read since the raft thread last took them is the one to
    /// tell it; a take starts a new batch; once closed, queued reads fail
    /// and later ones are refused.
    #[test]
    fn test_the_queue_tells_once_per_batch_and_fails_reads_once_closed() {
        let q = ReadQueue::default();
        let (a, mut a_rx) = oneshot::channel();
        let (b, _b_rx) = oneshot::channel();
        assert!(q.push(a).unwrap(), "the first read tells");
        assert!(!q.push(b).unwrap(), "a read joining it does not");
        assert_eq!(q.take().len(), 2);
        let (c, mut c_rx) = oneshot::channel();
        assert!(q.push(c).unwrap(), "after a take, a new batch");
        q.close();
        assert!(matches!(c_rx.try_recv(), Err(TryRecvError::Closed)));
        let (d, _d_rx) = oneshot::channel();
        assert!(matches!(q.push(d), Err(ServerError::Stopped)));
        // the taken ones were the caller's to answer
        assert!(matches!(a_rx.try_recv(), Err(TryRecvError::Closed)));
    }
}
