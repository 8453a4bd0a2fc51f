//! Consensus: the raft thread that owns `raft::RawNode` and the WAL, the
//! raft log as raft-rs sees it, the peer transport, and the narrow handle
//! ([`Proposer`]) the rest of the server uses to reach raft.
//!
//! | file | role |
//! |---|---|
//! | `node.rs` | the raft thread: the Ready loop (WAL, snapshots, applying through `apply::Applier`, conf changes) |
//! | `read_index.rs` | ReadIndex batching for linearizable reads |
//! | `storage.rs` | raft-rs `Storage`: the in-memory log tail, hard and conf state |
//! | `transport.rs` | sending raft messages to peers (one stream and task per peer) |
//! | `proposer.rs`, `wait.rs`, `status.rs` | proposing and waiting, published raft status |
//! | `lone_wait.rs` | the lone-request wait policy (bounded spins while one client is alone) |

pub mod lone_wait;
pub mod node;
mod proposer;
mod read_index;
mod status;
pub mod storage;
pub mod transport;
mod wait;

pub use proposer::Proposer;
pub use status::RaftStatus;
pub use wait::Wait;

use crate::apply::ApplyResult;
use crate::error::ServerError;
use raft::eraftpb::{ConfChange, Message};
use std::sync::mpsc;
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

/// The raft thread's input queue, sending side (cheap to clone; the
/// transport, the peer service and the [`Proposer`] each hold one).
#[derive(Clone)]
pub struct RaftSender(mpsc::Sender<RaftInput>);

/// The receiving side, owned by the raft thread.
pub struct RaftReceiver(mpsc::Receiver<RaftInput>);

/// A new input queue.
pub fn channel() -> (RaftSender, RaftReceiver) {
    let (tx, rx) = mpsc::channel();
    (RaftSender(tx), RaftReceiver(rx))
}

impl RaftSender {
    /// Queues `input`; fails only once the raft thread has stopped.
    pub fn send(&self, input: RaftInput) -> Result<(), ServerError> {
        self.0.send(input).map_err(|_| ServerError::Stopped)
    }
}

/// The result a proposer waits for: what the apply produced.
pub type ProposalResult = Result<ApplyResult, ServerError>;
