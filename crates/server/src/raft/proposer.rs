//! The one handle the rest of the server has on raft: propose and wait,
//! linearizable read barriers, membership changes, leadership, and the
//! published raft status. Cheap to clone.

use super::{ProposalResult, RaftInput, RaftSender, RaftStatus, ReadQueue, Wait};
use crate::apply::ApplyResult;
use crate::error::ServerError;
use prost::Message as _;
use raft::eraftpb::ConfChange;
use retcd_api::retcdpb::InternalRaftRequest;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::oneshot;

/// Proposals are refused while more entries than this are committed but
/// not applied (etcd's `maxGapBetweenApplyAndCommitIndex`).
pub const MAX_APPLY_GAP: u64 = 5000;

#[derive(Clone)]
pub struct Proposer {
    inner: Arc<Inner>,
}

struct Inner {
    member_id: u64,
    raft: RaftSender,
    wait: Arc<Wait>,
    /// Linearizable reads waiting for the raft thread to take them.
    reads: Arc<ReadQueue>,
    status: Arc<RaftStatus>,
    next_id: AtomicU64,
    request_timeout: Duration,
    max_request_bytes: u64,
}

/// Tells the raft thread, when dropped, that reads are queued for it; if
/// it cannot be told, every queued read fails as the telling would have.
struct TellRaft<'a>(&'a Inner);

impl Drop for TellRaft<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.raft.send(RaftInput::Reads) {
            for reader in self.0.reads.take() {
                let _ = reader.send(Err(e.clone()));
            }
        }
    }
}

impl Proposer {
    /// A handle on the raft thread fed by `raft`; `wait`, `reads` and
    /// `status` are shared with that thread.
    pub(crate) fn new(
        member_id: u64,
        raft: RaftSender,
        wait: Arc<Wait>,
        reads: Arc<ReadQueue>,
        status: Arc<RaftStatus>,
        request_timeout: Duration,
        max_request_bytes: u64,
    ) -> Proposer {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Proposer {
            inner: Arc::new(Inner {
                member_id,
                raft,
                wait,
                reads,
                status,
                // etcd's idutil: 16 bits of member id, then a time-seeded
                // counter.
                next_id: AtomicU64::new(
                    ((member_id & 0xffff) << 48) | ((now_ms & 0xff_ffff_ffff) << 8),
                ),
                request_timeout,
                max_request_bytes,
            }),
        }
    }

    pub fn member_id(&self) -> u64 {
        self.inner.member_id
    }

    pub fn status(&self) -> &RaftStatus {
        &self.inner.status
    }

    /// The leader's id (0: none known).
    pub fn leader(&self) -> u64 {
        self.inner.status.leader()
    }

    pub fn request_timeout(&self) -> Duration {
        self.inner.request_timeout
    }

    /// Proposals waiting for their result.
    pub fn pending(&self) -> usize {
        self.inner.wait.pending()
    }

    /// A fresh id from etcd's request id generator (also used for
    /// server-assigned lease IDs).
    pub fn next_request_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed) & ((1 << 48) - 1)
            | ((self.inner.member_id & 0xffff) << 48)
    }

    /// Proposes `req` through raft and waits until it is committed and
    /// applied on this member; the result is what the apply produced.
    pub async fn propose(&self, mut req: InternalRaftRequest) -> ProposalResult {
        // etcd's maxGapBetweenApplyAndCommitIndex: push back before
        // anything else while applying lags far behind committing.
        let st = &self.inner.status;
        if st.commit_index() > st.applied_index() + MAX_APPLY_GAP {
            return Err(ServerError::TooManyRequests);
        }
        let id = self.next_request_id();
        req.id = id;
        let data = req.encode_to_vec();
        if data.len() as u64 > self.inner.max_request_bytes {
            return Err(ServerError::RequestTooLarge);
        }
        let rx = self.register(id);
        if let Err(e) = self.inner.raft.send(RaftInput::Propose { id, data }) {
            self.inner.wait.cancel(id);
            return Err(e);
        }
        self.await_proposal(rx).await
    }

    /// Registers proposal `id`'s waiter, giving up after the request
    /// timeout.
    fn register(&self, id: u64) -> oneshot::Receiver<ProposalResult> {
        let deadline = std::time::Instant::now() + self.inner.request_timeout;
        self.inner.wait.register(id, deadline)
    }

    /// A proposal's result on `rx`; its waiter's deadline (`Wait`'s
    /// sweeper) bounds the wait, so no timer is armed per request. A
    /// proposal that timed out is `ServerError::Timeout`; the server
    /// tells why, as etcd does (`EtcdServer::propose_timed_out`).
    async fn await_proposal(&self, rx: oneshot::Receiver<ProposalResult>) -> ProposalResult {
        match rx.await {
            Ok(res) => res,
            Err(_) => Err(ServerError::Stopped),
        }
    }

    /// Waits until this member has applied everything committed before the
    /// call (ReadIndex). Concurrent callers share one ReadIndex.
    pub async fn read_index(&self) -> Result<(), ServerError> {
        let (tx, rx) = oneshot::channel();
        if self.inner.reads.push(tx)? {
            // The first read of a batch tells the raft thread, once this
            // worker has run its other ready tasks (tokio's deferred list,
            // as `api::defer_writes`): calls decoded with this one read
            // too, and join the batch. Told on drop, so a caller that goes
            // away meanwhile does not strand the batch.
            let tell = TellRaft(&self.inner);
            if crate::metrics::in_flight() > 1 {
                tokio::task::yield_now().await;
            }
            drop(tell);
        }
        self.await_raft(rx).await
    }

    /// Proposes a membership `ConfChange` and waits until it is applied
    /// here; a change rejected at apply (unknown member, URL in use, ...)
    /// returns its error.
    pub async fn propose_conf_change(&self, mut cc: ConfChange) -> Result<(), ServerError> {
        let id = self.next_request_id();
        cc.id = id;
        let rx = self.register(id);
        if let Err(e) = self
            .inner
            .raft
            .send(RaftInput::ProposeConfChange { id, cc })
        {
            self.inner.wait.cancel(id);
            return Err(e);
        }
        match self.await_proposal(rx).await? {
            ApplyResult::Err(e) => Err(e),
            _ => Ok(()),
        }
    }

    /// The raft thread's answer on `rx`, awaited (the task parks) up to
    /// the request timeout; then "request timed out", with or without a
    /// leader, as etcd's read index loop answers.
    async fn await_raft<T>(
        &self,
        rx: oneshot::Receiver<Result<T, ServerError>>,
    ) -> Result<T, ServerError> {
        match tokio::time::timeout(self.inner.request_timeout, rx).await {
            Ok(Ok(res)) => res,
            Ok(Err(_)) => Err(ServerError::Stopped),
            Err(_) => Err(ServerError::Timeout),
        }
    }

    /// What a forwarded lease call that timed out answers: no leader when
    /// there is none (etcd's `waitLeader`), else a timeout.
    pub fn timed_out(&self) -> ServerError {
        if self.leader() == 0 {
            ServerError::NoLeader
        } else {
            ServerError::Timeout
        }
    }

    /// The leader's view of every member's match index, or `None` when this
    /// member is not the leader.
    pub async fn progress(&self) -> Result<Option<Vec<(u64, u64)>>, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.inner.raft.send(RaftInput::Progress(tx))?;
        rx.await.map_err(|_| ServerError::Stopped)
    }

    /// etcd raft's `Status` as JSON (see `RaftInput::StatusJson`).
    pub async fn status_json(&self) -> Result<String, ServerError> {
        let (tx, rx) = oneshot::channel();
        self.inner.raft.send(RaftInput::StatusJson(tx))?;
        rx.await.map_err(|_| ServerError::Stopped)
    }

    /// Asks raft to hand leadership to `transferee` (raft-rs
    /// `transfer_leader`); the caller watches `leader()` for the outcome.
    pub fn transfer_leadership(&self, transferee: u64) -> Result<(), ServerError> {
        self.inner.raft.send(RaftInput::TransferLeader(transferee))
    }

    /// Stops the raft thread after a durable backend commit (waiting for
    /// room in its queue if need be; at most about 5 s in all).
    pub async fn stop(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let (tx, rx) = oneshot::channel();
            match self.inner.raft.send(RaftInput::Stop(tx)) {
                Ok(()) => {
                    let _ = tokio::time::timeout_at(deadline, rx).await;
                    return;
                }
                Err(ServerError::TooManyRequests) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::InFlight;
    use std::future::Future;
    use std::task::{Context, Waker};

    /// Reads queued together tell the raft thread once, after the worker
    /// has run its other ready tasks, or when the first caller goes away
    /// before that; the raft thread's take answers every one of them.
    #[tokio::test(flavor = "current_thread")]
    async fn test_a_batch_of_reads_tells_the_raft_thread_once() {
        // other calls in flight: the first read waits for the worker
        let _calls = [InFlight::new(), InFlight::new()];
        let (tx, rx) = super::super::channel_of(16);
        let reads = Arc::new(ReadQueue::default());
        let p = Proposer::new(
            1,
            tx,
            Arc::new(Wait::default()),
            reads.clone(),
            Arc::new(RaftStatus::starting_at(0)),
            Duration::from_secs(5),
            1 << 20,
        );
        let mut cx = Context::from_waker(Waker::noop());
        let mut first = Box::pin(p.read_index());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        let mut second = Box::pin(p.read_index());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        assert!(
            rx.0.try_recv().is_err(),
            "told before the worker's other tasks ran"
        );
        // the first caller goes away before its turn: the batch is told
        drop(first);
        assert!(matches!(rx.0.try_recv(), Ok(RaftInput::Reads)));
        assert!(rx.0.try_recv().is_err(), "told once");
        let taken = reads.take();
        assert_eq!(taken.len(), 2);
        for reader in taken {
            let _ = reader.send(Ok(()));
        }
        second.await.unwrap();
        // a new batch, whose first read tells once its turn comes
        let third = tokio::spawn({
            let p = p.clone();
            async move { p.read_index().await }
        });
        tokio::task::yield_now().await;
        let mut told = false;
        for _ in 0..10 {
            if let Ok(RaftInput::Reads) = rx.0.try_recv() {
                told = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(told, "the first read of the next batch tells");
        for reader in reads.take() {
            let _ = reader.send(Ok(()));
        }
        third.await.unwrap().unwrap();
    }

    /// A raft thread that cannot be told (its queue full) fails the batch
    /// with the queue's error instead of leaving it to time out.
    #[tokio::test(flavor = "current_thread")]
    async fn test_reads_fail_at_once_when_the_raft_thread_cannot_be_told() {
        let (tx, _rx) = super::super::channel_of(1);
        tx.send(RaftInput::Removed).unwrap();
        let p = Proposer::new(
            1,
            tx,
            Arc::new(Wait::default()),
            Arc::new(ReadQueue::default()),
            Arc::new(RaftStatus::starting_at(0)),
            Duration::from_secs(5),
            1 << 20,
        );
        let r = tokio::time::timeout(Duration::from_secs(2), p.read_index()).await;
        assert!(matches!(r, Ok(Err(ServerError::TooManyRequests))), "{r:?}");
    }
}
