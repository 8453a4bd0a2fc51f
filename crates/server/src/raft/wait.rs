//! Waiters for proposals, by request id (etcd's `wait.Wait`).
//!
//! The raft thread answers a whole Ready's proposals at once
//! ([`Wait::trigger_batch`]): it hands the batch to one task on the
//! runtime ([`Wait::start_dispatcher`]), which completes every waiter from
//! a worker thread. One cross-thread wake-up per Ready instead of one per
//! request, and the requests' tasks then run on that worker one after the
//! other, so their responses leave together (`api::defer_writes`). A batch
//! of one is answered directly.
//!
//! A proposer gives up after the request timeout: its waiter carries a
//! deadline, and a sweeper task (every [`SWEEP_EVERY`]) answers the
//! expired ones `ServerError::Timeout`. A timer per request (tokio's
//! `timeout` around each wait) cost ~600 instructions per put, registered
//! in and removed from the runtime's timer wheel every time.

use super::ProposalResult;
use crate::error::ServerError;
use foldhash::HashMap;
use parking_lot::Mutex;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

type Reply = (oneshot::Sender<ProposalResult>, ProposalResult);

/// How often expired waiters are answered: a request gives up at most this
/// long after its timeout.
pub const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A proposer's reply channel and when it gives up.
struct Waiter {
    tx: oneshot::Sender<ProposalResult>,
    deadline: Instant,
}

#[derive(Default)]
pub struct Wait {
    /// Protects the map of request id → the proposer's waiter. Held only
    /// to insert, remove or sweep; never across I/O or `.await`.
    waiters: Mutex<HashMap<u64, Waiter>>,
    /// The dispatcher task's queue (unset before it starts, e.g. in unit
    /// tests: batches are then answered directly).
    dispatch: OnceLock<mpsc::UnboundedSender<Vec<Reply>>>,
}

impl Wait {
    /// Starts the task that answers batches and the one that answers
    /// expired waiters (call from inside the runtime).
    pub fn start_dispatcher(self: &Arc<Self>) {
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<Reply>>();
        if self.dispatch.set(tx).is_ok() {
            tokio::spawn(async move {
                while let Some(batch) = rx.recv().await {
                    answer(batch);
                }
            });
            let wait = Arc::downgrade(self);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(w) = wait.upgrade() else { return };
                    w.expire(Instant::now());
                }
            });
        }
    }

    /// Registers `id`, giving up at `deadline`; its result arrives on the
    /// returned channel (`ServerError::Timeout` once the deadline passed).
    pub fn register(&self, id: u64, deadline: Instant) -> oneshot::Receiver<ProposalResult> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(id, Waiter { tx, deadline });
        rx
    }

    /// Answers every waiter whose deadline is not after `now` with
    /// `ServerError::Timeout`.
    pub fn expire(&self, now: Instant) {
        // (collected first: the proposers are answered after the lock)
        let expired: Vec<Waiter> = self
            .waiters
            .lock()
            .extract_if(|_, x| x.deadline <= now)
            .map(|(_, x)| x)
            .collect();
        for x in expired {
            let _ = x.tx.send(Err(ServerError::Timeout));
        }
    }

    /// When the proposer of `id` gives up; `None` once it was answered or
    /// has gone (its call cut at its `grpc-timeout`, or its client left:
    /// the waiter is then forgotten).
    pub fn deadline(&self, id: u64) -> Option<Instant> {
        let mut waiters = self.waiters.lock();
        let w = waiters.get(&id)?;
        if w.tx.is_closed() {
            waiters.remove(&id);
            return None;
        }
        Some(w.deadline)
    }

    /// Forgets `id` (its proposer gave up).
    pub fn cancel(&self, id: u64) {
        self.waiters.lock().remove(&id);
    }

    /// Answers the proposer of `id`, if it is still waiting (a proposal
    /// made on another member has no waiter here).
    pub fn trigger(&self, id: u64, res: ProposalResult) {
        if let Some(x) = self.waiters.lock().remove(&id) {
            let _ = x.tx.send(res);
        }
    }

    /// Answers the proposers of a batch (ids without a waiter here are
    /// skipped), through the dispatcher task when it runs.
    pub fn trigger_batch(&self, results: impl IntoIterator<Item = (u64, ProposalResult)>) {
        let batch: Vec<Reply> = {
            let mut w = self.waiters.lock();
            (results.into_iter())
                .filter_map(|(id, res)| w.remove(&id).map(|x| (x.tx, res)))
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
        let w = Arc::new(Wait::default());
        w.start_dispatcher();
        let later = Instant::now() + Duration::from_secs(60);
        let a = w.register(1, later);
        let b = w.register(2, later);
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
        let mut a = w.register(7, Instant::now() + Duration::from_secs(60));
        w.trigger_batch([(7, Ok(ApplyResult::Empty))]);
        assert!(matches!(a.try_recv(), Ok(Ok(ApplyResult::Empty))));
    }

    #[tokio::test]
    async fn test_expired_waiters_are_answered_timeout_by_the_sweeper() {
        let w = Arc::new(Wait::default());
        w.start_dispatcher();
        let now = Instant::now();
        let soon = w.register(1, now + Duration::from_millis(50));
        let later = w.register(2, now + Duration::from_secs(60));
        let started = Instant::now();
        assert!(matches!(soon.await, Ok(Err(ServerError::Timeout))));
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(w.pending(), 1, "the other still waits");
        w.trigger(2, Ok(ApplyResult::Empty));
        assert!(matches!(later.await, Ok(Ok(ApplyResult::Empty))));
    }

    #[test]
    fn test_a_gone_caller_has_no_deadline() {
        let w = Wait::default();
        let at = Instant::now() + Duration::from_secs(60);
        let kept = w.register(1, at);
        let gone = w.register(2, at);
        drop(gone);
        assert_eq!(w.deadline(1), Some(at));
        assert_eq!(w.deadline(2), None, "its caller dropped the answer");
        assert_eq!(w.pending(), 1, "and its waiter is forgotten");
        w.trigger(1, Ok(ApplyResult::Empty));
        assert_eq!(w.deadline(1), None, "answered");
        drop(kept);
    }
}
