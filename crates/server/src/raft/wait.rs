//! Waiters for proposals, by request id (etcd's `wait.Wait`).

use super::ProposalResult;
use parking_lot::Mutex;
use std::collections::HashMap;
use tokio::sync::oneshot;

#[derive(Default)]
pub struct Wait {
    /// Protects the map of request id → the proposer's reply channel.
    /// Held only to insert or remove; never across I/O or `.await`.
    waiters: Mutex<HashMap<u64, oneshot::Sender<ProposalResult>>>,
}

impl Wait {
    /// Registers `id`; its result arrives on the returned channel.
    pub fn register(&self, id: u64) -> oneshot::Receiver<ProposalResult> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(id, tx);
        rx
    }

    /// Forgets `id` (its proposer gave up).
    pub fn cancel(&self, id: u64) {
        self.waiters.lock().remove(&id);
    }

    /// Answers the proposer of `id`, if it is still waiting (a proposal
    /// made on another member has no waiter here).
    pub fn trigger(&self, id: u64, res: ProposalResult) {
        if let Some(tx) = self.waiters.lock().remove(&id) {
            let _ = tx.send(res);
        }
    }

    /// Proposals waiting for their result (`proposals_pending`).
    pub fn pending(&self) -> usize {
        self.waiters.lock().len()
    }
}
