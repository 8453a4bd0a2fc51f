//! Waiters for proposals, by request id (etcd's `wait.Wait`).
//!
//! The raft thread answers a whole Ready's proposals at once
//! ([`Wait::trigger_batch`]): it hands the batch to one task on the
//! runtime ([`Wait::start_dispatcher`]), which completes every waiter from
//! a worker thread. One cross-thread wake-up per Ready instead of one per
//! request, and the requests' tasks then run on that worker one after the
//! other, so their responses leave together (`api::defer_writes`). A batch
//! of one is answered directly.

use super::ProposalResult;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;
use tokio::sync::{mpsc, oneshot};

type Reply = (oneshot::Sender<ProposalResult>, ProposalResult);

#[derive(Default)]
pub struct Wait {
    /// Protects the map of request id → the proposer's reply channel.
    /// Held only to insert or remove; never across I/O or `.await`.
    waiters: Mutex<HashMap<u64, oneshot::Sender<ProposalResult>>>,
    /// The dispatcher task's queue (unset before it starts, e.g. in unit
    /// tests: batches are then answered directly).
    dispatch: OnceLock<mpsc::UnboundedSender<Vec<Reply>>>,
}

impl Wait {
    /// Starts the task that answers batches (call from inside the runtime).
    pub fn start_dispatcher(&self) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Reply>>();
        if self.dispatch.set(tx).is_ok() {
            tokio::spawn(async move {
                while let Some(batch) = rx.recv().await {
                    answer(batch);
                }
            });
        }
    }

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

    /// Answers the proposers of a batch (ids without a waiter here are
    /// skipped), through the dispatcher task when it runs.
    pub fn trigger_batch(&self, results: impl IntoIterator<Item = (u64, ProposalResult)>) {
        let batch: Vec<Reply> = {
            let mut w = self.waiters.lock();
            (results.into_iter())
                .filter_map(|(id, res)| w.remove(&id).map(|tx| (tx, res)))
                .collect()
        };
        if batch.is_empty() {
            return;
        }
        match self.dispatch.get() {
            // a lone answer wakes its task directly: the dispatcher would
            // be one more hop for nothing to batch
            Some(d) if batch.len() > 1 => {
                if let Err(mpsc::error::SendError(batch)) = d.send(batch) {
                    answer(batch)
                }
            }
            _ => answer(batch),
        }
    }

    /// Proposals waiting for their result (`proposals_pending`).
    pub fn pending(&self) -> usize {
        self.waiters.lock().len()
    }
}

fn answer(batch: Vec<Reply>) {
    for (tx, res) in batch {
        let _ = tx.send(res);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::ApplyResult;

    #[tokio::test]
    async fn test_trigger_batch_answers_waiters_through_the_dispatcher() {
        let w = Wait::default();
        w.start_dispatcher();
        let a = w.register(1);
        let b = w.register(2);
        w.trigger_batch([(1, Ok(ApplyResult::Empty)), (3, Ok(ApplyResult::Empty))]);
        assert!(matches!(a.await, Ok(Ok(ApplyResult::Empty))));
        assert_eq!(w.pending(), 1, "2 is still waiting, 3 had no waiter");
        w.trigger_batch([(2, Ok(ApplyResult::Empty))]);
        assert!(matches!(b.await, Ok(Ok(ApplyResult::Empty))));
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn test_trigger_batch_without_dispatcher_answers_directly() {
        let w = Wait::default();
        let mut a = w.register(7);
        w.trigger_batch([(7, Ok(ApplyResult::Empty))]);
        assert!(matches!(a.try_recv(), Ok(Ok(ApplyResult::Empty))));
    }
}
