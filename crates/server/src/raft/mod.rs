//! Consensus: the raft thread that owns `raft::RawNode` and the WAL, the
//! raft log as raft-rs sees it, the peer transport, and the narrow handle
//! ([`Proposer`]) the rest of the server uses to reach raft.
//!
//! | file | role |
//! |---|---|
//! | `node.rs` | the raft thread: the Ready loop (WAL, snapshots, applying through `apply::Applier`, conf changes) |
//! | `commit_notice.rs` | when a leader sends followers the commit index on its own |
//! | `read_index.rs` | ReadIndex batching for linearizable reads |
//! | `storage.rs` | raft-rs `Storage`: the in-memory log tail, hard and conf state |
//! | `transport.rs` | sending raft messages to peers (one stream and task per peer, on the peer runtime) |
//! | `proposer.rs`, `wait.rs`, `status.rs` | proposing and waiting, published raft status |

mod commit_notice;
pub mod node;
mod proposer;
mod read_index;
mod status;
pub mod storage;
#[cfg(test)]
mod test_cluster;
pub mod transport;
mod wait;

pub use proposer::Proposer;
pub(crate) use read_index::ReadQueue;
pub use status::RaftStatus;
pub use wait::Wait;

use crate::apply::ApplyResult;
use crate::error::ServerError;
use raft::eraftpb::{ConfChange, Message};
use std::sync::mpsc;
use tokio::sync::oneshot;

/// raft-rs's settings for member `id`, but for those that come from the
/// flags (election ticks, pre-vote) and the applied index.
pub fn base_config(id: u64) -> raft::Config {
    raft::Config {
        id,
        heartbeat_tick: 1,
        max_size_per_msg: 1024 * 1024,
        max_inflight_msgs: 512,
        check_quorum: true,
        read_only_option: raft::ReadOnlyOption::Safe,
        // the raft thread's CommitNotice sends commits instead
        skip_bcast_commit: true,
        // entries appended in one turn go to a follower in one append
        // (see `node::propose_batch`)
        batch_append: true,
        ..Default::default()
    }
}

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
    /// Linearizable reads wait in the [`ReadQueue`]: take them; each is
    /// answered once applied ≥ the read index.
    Reads,
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
    /// etcd raft's `Status` as its `MarshalJSON` writes it (`/debug/vars`'
    /// `raft.status`).
    StatusJson(oneshot::Sender<String>),
    /// A peer refused our stream: this member was removed from the cluster.
    Removed,
}

/// How many inputs the raft thread's queue holds. The thread drains the
/// whole queue every loop turn; a full queue means it cannot keep up, and
/// senders are pushed back instead of the queue growing without bound.
pub const RAFT_QUEUE: usize = 16 * 1024;

/// The raft thread's input queue, sending side (cheap to clone; the
/// transport, the peer service and the [`Proposer`] each hold one).
/// Never blocks: a full queue is `TooManyRequests` (a peer's message is
/// then dropped, and raft sends it again).
#[derive(Clone)]
pub struct RaftSender(mpsc::SyncSender<RaftInput>);

/// The receiving side, owned by the raft thread.
pub struct RaftReceiver(mpsc::Receiver<RaftInput>);

/// A new input queue of [`RAFT_QUEUE`] inputs.
pub fn channel() -> (RaftSender, RaftReceiver) {
    channel_of(RAFT_QUEUE)
}

fn channel_of(capacity: usize) -> (RaftSender, RaftReceiver) {
    let (tx, rx) = mpsc::sync_channel(capacity);
    (RaftSender(tx), RaftReceiver(rx))
}

impl RaftSender {
    /// Queues `input`: `TooManyRequests` while the queue is full,
    /// `Stopped` once the raft thread has stopped.
    pub fn send(&self, input: RaftInput) -> Result<(), ServerError> {
        self.0.try_send(input).map_err(|e| match e {
            mpsc::TrySendError::Full(_) => ServerError::TooManyRequests,
            mpsc::TrySendError::Disconnected(_) => ServerError::Stopped,
        })
    }
}

/// The result a proposer waits for: what the apply produced.
pub type ProposalResult = Result<ApplyResult, ServerError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_full_queue_pushes_back() {
        let (tx, rx) = channel_of(2);
        tx.send(RaftInput::Removed).unwrap();
        tx.send(RaftInput::Removed).unwrap();
        assert!(matches!(
            tx.send(RaftInput::Removed),
            Err(ServerError::TooManyRequests)
        ));
        rx.0.recv().unwrap();
        tx.send(RaftInput::Removed).unwrap();
        drop(rx);
        assert!(matches!(
            tx.send(RaftInput::Removed),
            Err(ServerError::Stopped)
        ));
    }
}
