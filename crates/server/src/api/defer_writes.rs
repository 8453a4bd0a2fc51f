//! Client connections write late: the first write of a round waits until
//! the worker thread has run every other task it had ready, so the
//! responses of a whole raft Ready leave in one `writev` per connection.
//!
//! Why: the raft thread answers a Ready's proposals at once; each request
//! task then hands its response to h2 and wakes its connection's task,
//! which tokio runs next (the task a task wakes goes first, tokio's LIFO
//! slot) and which wrote at once: one `writev` per response (0.91 per put
//! at 100 clients), each a trip through the kernel's TCP stack. Turning
//! the LIFO slot off batched them but cost a lone client 20 % more CPU
//! (every wake-up then woke the other worker too). Here the connection's
//! first write registers its task with tokio's *deferred* list
//! (`tokio::task::yield_now`'s mechanism), woken when the worker has
//! nothing else to run; the write then carries everything the other tasks
//! added meanwhile. Reads are never delayed.
//!
//! Only while other client calls are in progress (more than one in
//! flight, `grpc_metrics::in_flight`): a lone client's response, which
//! nothing can join, is written at once (waiting cost it 10 % more CPU per
//! put).
//!
//! Bounded: a connection polled again (new frames, another response) more
//! than [`MAX_DEFER`] after it started waiting writes at once, and the
//! deferred list is drained whenever its worker runs out of work.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The longest a write waits for its worker to run out of other work,
/// checked whenever the connection is polled.
const MAX_DEFER: Duration = Duration::from_millis(1);

/// A connection whose writes wait for the end of the worker's batch.
pub struct DeferWrites<S> {
    inner: S,
    /// Set while a write waits: when it started, and whether the worker
    /// has since woken it.
    waiting: Option<(Instant, Arc<Fired>)>,
}

/// The waker registered in the deferred list: notes that it fired, then
/// wakes the connection's task.
struct Fired {
    fired: AtomicBool,
    task: Waker,
}

impl Wake for Fired {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake_by_ref();
    }
}

impl<S> DeferWrites<S> {
    pub fn new(inner: S) -> Self {
        DeferWrites {
            inner,
            waiting: None,
        }
    }

    /// Ready when this round may write; Pending (the task registered in
    /// the worker's deferred list) the first time.
    fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &self.waiting {
            // a lone call: nothing else will join its response
            None if crate::api::grpc_metrics::in_flight() <= 1 => Poll::Ready(()),
            Some((since, f)) => {
                if f.fired.load(Ordering::Acquire) || since.elapsed() >= MAX_DEFER {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }
            None => {
                let f = Arc::new(Fired {
                    fired: AtomicBool::new(false),
                    task: cx.waker().clone(),
                });
                let waker = Waker::from(f.clone());
                let mut defer_cx = Context::from_waker(&waker);
                // A yield's first poll puts its waker in the worker's
                // deferred list (outside a runtime: wakes at once).
                if pin!(tokio::task::yield_now())
                    .poll(&mut defer_cx)
                    .is_ready()
                {
                    return Poll::Ready(());
                }
                self.waiting = Some((Instant::now(), f));
                Poll::Pending
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for DeferWrites<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for DeferWrites<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn(cx));
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_turn(cx));
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    /// The end of a round of writes: the next write waits again.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if r.is_ready() {
            self.waiting = None;
        }
        r
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for DeferWrites<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::grpc_metrics::InFlight;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Two tasks on one worker: the second's work (ready when the write
    /// starts) runs before the write reaches the socket.
    #[tokio::test(flavor = "current_thread")]
    async fn test_write_waits_for_the_other_ready_tasks() {
        // two calls in progress: this connection's and another one
        let _calls = [InFlight::new(), InFlight::new()];
        let (a, mut b) = tokio::io::duplex(1024);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let o = order.clone();
        let other = tokio::spawn(async move { o.lock().unwrap().push("other task") });
        let mut w = DeferWrites::new(a);
        w.write_all(b"hello").await.unwrap();
        w.flush().await.unwrap();
        order.lock().unwrap().push("written");
        other.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["other task", "written"]);
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        // the next round waits again, and still completes
        w.write_all(b"again").await.unwrap();
        w.flush().await.unwrap();
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"again");
    }
}
