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
//!
//! Writes are gathered, too: HTTP/2 (h2) hands the connection one write per
//! DATA frame larger than 256 bytes (the frame, with whatever small frames
//! it had buffered before it), and a frame is at most 16 KiB (the client's
//! `SETTINGS_MAX_FRAME_SIZE`; etcd's and Go's clients keep the default).
//! A watch stream sending 1 000 watchers' events made one `writev` per
//! 14 KiB, twice as many as etcd (whose writes go through a 32 KiB buffer).
//! The connection copies what h2 writes into a buffer of up to
//! [`GATHER_LIMIT`] and writes it at h2's first flush once the round's
//! turn has come, or when the buffer would overflow; a write at least that
//! large goes straight through. h2 flushes after each such DATA frame: a
//! flush before the turn returns at once without writing, so h2 goes on
//! with the round (a flush that waited stopped it after a frame or two:
//! unary answers of 256 bytes or more left in one send each).
//!
//! On plain TCP a large write ([`MORE_THRESHOLD`] or more: h2's full DATA
//! frames) is not copied: it goes to the socket at once with `MSG_MORE`
//! (after what was gathered before it), so the kernel appends it to the
//! segment it is building instead of sending it, and the round's write
//! pushes the segment out (the last gathered bytes sent without the flag,
//! or, if none, `TCP_NODELAY` set again, which pushes what is held). The
//! copy cost a watch stream's fan-out a sixth of its CPU; one `sendmsg`
//! per 16 KiB frame into a held segment costs less than copying the frame
//! (and below 8 KiB, more). TLS and Unix connections gather as before.

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The longest a write waits for its worker to run out of other work,
/// checked whenever the connection is polled.
const MAX_DEFER: Duration = Duration::from_millis(1);

/// Most bytes a connection gathers before writing them: the largest
/// segment TCP hands the loopback device or a NIC's segmentation offload.
const GATHER_LIMIT: usize = 64 * 1024;

/// Writes from this size on go to a [`SendMore`] socket uncopied.
const MORE_THRESHOLD: usize = 8 * 1024;

/// A connection that can take writes with more to follow (`MSG_MORE`: the
/// kernel holds a partial segment) and push out what it holds.
pub trait SendMore {
    /// Whether it can (plain TCP).
    fn can_send_more(&self) -> bool {
        false
    }
    /// Writes `bufs` (some of them) with more to follow.
    fn poll_send_more(
        &mut self,
        _cx: &mut Context<'_>,
        _bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(io::ErrorKind::Unsupported.into()))
    }
    /// Sends what earlier writes with more to follow left held.
    fn push(&self) -> io::Result<()> {
        Ok(())
    }
}

impl SendMore for tokio::net::TcpStream {
    fn can_send_more(&self) -> bool {
        true
    }
    fn poll_send_more(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        use rustix::net::{sendmsg, SendAncillaryBuffer, SendFlags};
        loop {
            ready!(self.poll_write_ready(cx))?;
            let sent = self.try_io(tokio::io::Interest::WRITABLE, || {
                let flags = SendFlags::MORE | SendFlags::NOSIGNAL;
                sendmsg(&*self, bufs, &mut SendAncillaryBuffer::default(), flags)
                    .map_err(io::Error::from)
            });
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
    fn push(&self) -> io::Result<()> {
        // setting TCP_NODELAY (already set) pushes the pending segments
        self.set_nodelay(true)
    }
}

impl<S: tokio::io::AsyncRead + AsyncWrite + Unpin> SendMore for tokio_rustls::server::TlsStream<S> {}
impl SendMore for tokio::net::UnixStream {}
impl SendMore for tokio::io::DuplexStream {}

/// A connection whose writes wait for the end of the worker's batch.
pub struct DeferWrites<S> {
    inner: S,
    /// Set while a write waits: when it started, and whether the worker
    /// has since woken it.
    waiting: Option<(Instant, Arc<Fired>)>,
    /// Bytes taken from h2 and not yet written: `gathered[sent..]`. Freed
    /// once written, so an idle connection holds no buffer.
    gathered: Vec<u8>,
    sent: usize,
    /// Bytes went out with more to follow since the last push.
    held: bool,
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
            gathered: Vec::new(),
            sent: 0,
            held: false,
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

impl<S: AsyncWrite + SendMore + Unpin> DeferWrites<S> {
    /// Writes out everything gathered (which pushes out what was held).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // a write without more to follow sends what is held before it
        let pushes = self.sent < self.gathered.len();
        while self.sent < self.gathered.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.gathered[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.gathered = Vec::new();
        self.sent = 0;
        if pushes {
            self.held = false;
        }
        Poll::Ready(Ok(()))
    }

    /// Pushes out what writes with more to follow left held.
    fn push_held(&mut self) -> io::Result<()> {
        if self.held {
            self.inner.push()?;
            self.held = false;
        }
        Ok(())
    }

    /// Writes what was gathered, then `bufs` (some of them), with more to
    /// follow; returns how much of `bufs` went.
    fn poll_send_more(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            let pending = self.gathered.len() - self.sent;
            let mut all: smallvec::SmallVec<[io::IoSlice<'_>; 8]> = smallvec::SmallVec::new();
            if pending > 0 {
                all.push(io::IoSlice::new(&self.gathered[self.sent..]));
            }
            all.extend(bufs.iter().map(|b| io::IoSlice::new(b)));
            let n = ready!(self.inner.poll_send_more(cx, &all))?;
            drop(all);
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held = true;
            if n < pending {
                self.sent += n;
                continue;
            }
            if pending > 0 {
                self.gathered = Vec::new();
                self.sent = 0;
            }
            if n > pending {
                return Poll::Ready(Ok(n - pending));
            }
        }
    }

    /// Takes `bufs` into the gathering buffer, writing out what it holds
    /// first if they would not fit; a write of [`GATHER_LIMIT`] or more
    /// goes straight to the connection once its turn comes.
    fn poll_gather(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        if total >= MORE_THRESHOLD && self.inner.can_send_more() {
            // no wait: the kernel holds it until the round's push
            return self.poll_send_more(cx, bufs);
        }
        if self.gathered.len() + total > GATHER_LIMIT {
            // full: nothing more can join what it holds
            ready!(self.poll_drain(cx))?;
        }
        if total >= GATHER_LIMIT {
            ready!(self.poll_turn(cx));
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        if self.gathered.capacity() == 0 {
            // room for the whole round at once: grown by doubling, the
            // buffer was copied on the way (as much CPU as the saved sends)
            self.gathered.reserve_exact(GATHER_LIMIT);
        }
        for b in bufs {
            self.gathered.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }
}

impl<S: AsyncWrite + SendMore + Unpin> AsyncWrite for DeferWrites<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_gather(cx, &[io::IoSlice::new(buf)])
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_gather(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    /// The end of a round of writes: what was gathered is written once the
    /// round's turn comes, and the next write waits again.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.sent < self.gathered.len() || self.held {
            // h2 flushes after every DATA frame it writes on its own
            // (over 256 bytes): what was gathered or is held leaves once
            // the worker has run its other tasks. Until then h2 goes on
            // writing the round; the turn's wake-up polls the connection
            // again, and it flushes again.
            if self.poll_turn(cx).is_pending() {
                return Poll::Ready(Ok(()));
            }
            if self.sent < self.gathered.len() {
                // sent without more to follow: pushes what is held too
                ready!(self.poll_drain(cx))?;
            } else {
                self.push_held()?;
            }
        }
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if r.is_ready() {
            self.waiting = None;
        }
        r
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        self.push_held()?;
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

    /// Two tasks on one worker: a round's write reaches the connection
    /// only after the other task (ready when the write started) has run.
    /// h2's flush returns meanwhile (h2 flushes after each large frame and
    /// would stop writing the round); the turn's wake-up polls the
    /// connection again, and that flush writes.
    #[tokio::test(flavor = "current_thread")]
    async fn test_write_waits_for_the_other_ready_tasks() {
        // two calls in progress: this connection's and another one
        let _calls = [InFlight::new(), InFlight::new()];
        let (a, mut b) = tokio::io::duplex(1024);
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let other = tokio::spawn(async move { r.store(true, Ordering::SeqCst) });
        let mut w = DeferWrites::new(a);
        let readable = |b: &mut tokio::io::DuplexStream| {
            let mut buf = [0u8; 16];
            let mut rb = ReadBuf::new(&mut buf);
            let waker = Waker::noop();
            let ready = Pin::new(b).poll_read(&mut Context::from_waker(waker), &mut rb);
            ready.is_ready().then(|| rb.filled().to_vec())
        };
        w.write_all(b"hello").await.unwrap();
        w.flush().await.unwrap();
        assert!(!ran.load(Ordering::SeqCst));
        assert_eq!(readable(&mut b), None, "written before its turn");
        // the worker runs the other task, then the turn's wake-up comes
        tokio::task::yield_now().await;
        assert!(ran.load(Ordering::SeqCst));
        w.flush().await.unwrap();
        assert_eq!(readable(&mut b).as_deref(), Some(&b"hello"[..]));
        other.await.unwrap();
        // the next round waits again, and still completes
        w.write_all(b"again").await.unwrap();
        w.flush().await.unwrap();
        assert_eq!(readable(&mut b), None, "written before its turn");
        tokio::task::yield_now().await;
        w.flush().await.unwrap();
        assert_eq!(readable(&mut b).as_deref(), Some(&b"again"[..]));
    }

    /// Flushes as h2 does until the round is out: again after each
    /// wake-up (other tests' calls in flight make a round wait its turn).
    async fn flush_round<S: AsyncWrite + SendMore + Unpin>(w: &mut DeferWrites<S>) {
        loop {
            w.flush().await.unwrap();
            if w.sent == w.gathered.len() && !w.held {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    /// Records the size of every write that reaches it.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<usize>,
        data: Vec<u8>,
    }

    impl SendMore for Recorder {}

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes.push(buf.len());
            self.data.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Writes reach the connection as one when h2 flushes; a write that
    /// would overflow the buffer first sends what it holds; a write of the
    /// limit or more goes straight through. Nothing is reordered.
    #[tokio::test(flavor = "current_thread")]
    async fn test_writes_are_gathered_until_the_flush() {
        let mut w = DeferWrites::new(Recorder::default());
        let chunk = |n: usize, b: u8| vec![b; n];
        for b in 0..3 {
            w.write_all(&chunk(10_000, b)).await.unwrap();
        }
        assert!(
            w.inner.writes.is_empty(),
            "nothing written before the flush"
        );
        flush_round(&mut w).await;
        assert_eq!(w.inner.writes, [30_000]);
        // 50k then 20k: the 50k leaves before the 20k is taken
        w.write_all(&chunk(50_000, 3)).await.unwrap();
        w.write_all(&chunk(20_000, 4)).await.unwrap();
        assert_eq!(w.inner.writes, [30_000, 50_000]);
        // a large write: what was gathered first, then it, unbuffered
        w.write_all(&chunk(GATHER_LIMIT, 5)).await.unwrap();
        assert_eq!(w.inner.writes, [30_000, 50_000, 20_000, GATHER_LIMIT]);
        w.write_all(b"tail").await.unwrap();
        w.shutdown().await.unwrap();
        assert_eq!(w.inner.writes.last(), Some(&4));
        assert!(w.gathered.is_empty() && w.gathered.capacity() == 0);
        let mut want = Vec::new();
        for (n, b) in [
            (10_000, 0),
            (10_000, 1),
            (10_000, 2),
            (50_000, 3),
            (20_000, 4),
        ] {
            want.extend(chunk(n, b));
        }
        want.extend(chunk(GATHER_LIMIT, 5));
        want.extend(b"tail");
        assert_eq!(w.inner.data, want);
    }

    /// On TCP a large write goes out uncopied with more to follow: the
    /// kernel holds it (a 20 KiB segment is below the loopback's segment
    /// size, and a held segment would wait 200 ms) while other calls are
    /// in progress and the round's turn has not come; the flush once the
    /// worker has run its other tasks pushes it all out. Small writes
    /// before and after it keep their order.
    #[tokio::test(flavor = "current_thread")]
    async fn test_large_tcp_writes_are_held_until_the_round_ends() {
        let _calls = [InFlight::new(), InFlight::new()];
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = l.accept().await.unwrap();
        server.set_nodelay(true).unwrap();
        // room for every write (a full send buffer pushes what is held)
        rustix::net::sockopt::set_socket_send_buffer_size(&server, 1 << 20).unwrap();
        let mut w = DeferWrites::new(server);
        let big: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
        // as h2 writes: a small frame, a large one, a flush after each
        w.write_all(b"head").await.unwrap();
        w.write_all(&big).await.unwrap();
        w.flush().await.unwrap();
        assert!(w.held, "the large write went out with more to follow");
        assert_eq!(w.gathered.capacity(), 0, "nothing left gathered (copied)");
        let queued = |c: &tokio::net::TcpStream| rustix::io::ioctl_fionread(c).unwrap();
        assert!(
            queued(&client) < 20_004,
            "held by the kernel until the push: {} bytes readable",
            queued(&client)
        );
        // the worker runs out of tasks: the turn's wake-up comes, and h2's
        // next poll of the connection flushes again
        tokio::task::yield_now().await;
        w.flush().await.unwrap();
        assert!(!w.held);
        // the push is synchronous on loopback: everything is readable now
        assert_eq!(queued(&client), 20_004);
        w.write_all(&big).await.unwrap();
        w.flush().await.unwrap();
        w.write_all(b"tail").await.unwrap();
        w.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let mut want = b"head".to_vec();
        want.extend(&big);
        want.extend(&big);
        want.extend(b"tail");
        assert!(got == want, "bytes reordered or changed");
    }

    /// Through a pipe that takes little at a time (partial writes,
    /// Pending), every byte arrives in order.
    #[tokio::test(flavor = "current_thread")]
    async fn test_gathered_writes_survive_partial_writes() {
        let (a, mut b) = tokio::io::duplex(1000);
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            let mut w = DeferWrites::new(a);
            let mut at = 0;
            for (k, n) in [1, 300, 17_000, 70_000, 5, 40_000, 100_000]
                .iter()
                .cycle()
                .enumerate()
            {
                if at == sent.len() {
                    break;
                }
                let end = (at + n).min(sent.len());
                w.write_all(&sent[at..end]).await.unwrap();
                at = end;
                if k % 3 == 2 {
                    w.flush().await.unwrap();
                }
            }
            w.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes reordered or changed");
    }
}
