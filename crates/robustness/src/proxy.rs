//! A userspace TCP proxy for peer traffic: blackhole, delay and drop, per
//! direction, switchable at any time. No root needed.
//!
//! One proxy stands in front of a member's peer port and the cluster
//! advertises the proxy's port, so every connection *to* that member goes
//! through it. `Rx` is the traffic into the member (requests on those
//! connections), `Tx` what the member answers on them.
//!
//! * **blackhole**: bytes are read and thrown away (the sender is not
//!   slowed down, nothing arrives); when the blackhole is lifted every
//!   connection is reset, as after a partition long enough for TCP to give up.
//! * **delay**: each chunk is forwarded `delay ± jitter` after it was read,
//!   in order.
//! * **drop**: each chunk is dropped with probability p; a stream with a
//!   hole cannot continue, so the connection is then closed (the member
//!   reconnects).
//! * **drop connections**: each new connection is, with probability p, a
//!   dud whose bytes all vanish (both directions) until it is reset; with
//!   periodic [`Proxy::reset`]s this loses about p of the peer traffic
//!   while the rest flows intact.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Into the member.
    Rx,
    /// Out of the member (on connections others opened to it).
    Tx,
}

#[derive(Default)]
struct DirCtl {
    blackhole: AtomicBool,
    delay_ms: AtomicU64,
    jitter_ms: AtomicU64,
    /// Drop probability in parts per million.
    drop_ppm: AtomicU32,
}

#[derive(Default)]
struct Ctl {
    rx: DirCtl,
    tx: DirCtl,
    /// Probability (ppm) that a new connection is a dud (everything on it is lost).
    conn_drop_ppm: AtomicU32,
    conns: Mutex<Vec<JoinHandle<()>>>,
    forwarded: AtomicU64,
    discarded: AtomicU64,
}

impl Ctl {
    fn dir(&self, d: Direction) -> &DirCtl {
        match d {
            Direction::Rx => &self.rx,
            Direction::Tx => &self.tx,
        }
    }
}

/// A running proxy `listen → target`. Dropping it stops it and closes
/// every connection.
pub struct Proxy {
    pub listen_port: u16,
    pub target: SocketAddr,
    ctl: Arc<Ctl>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy listening on `127.0.0.1:listen_port` forwarding to
    /// `target`. `seed` drives the drop and jitter choices.
    pub async fn start(listen_port: u16, target: SocketAddr, seed: u64) -> std::io::Result<Proxy> {
        let l = TcpListener::bind(("127.0.0.1", listen_port)).await?;
        let ctl = Arc::new(Ctl::default());
        let c2 = ctl.clone();
        let accept = tokio::spawn(async move {
            let mut n = 0u64;
            while let Ok((down, _)) = l.accept().await {
                n += 1;
                let c3 = c2.clone();
                let h = tokio::spawn(serve(down, target, c3, seed.wrapping_add(n)));
                let mut conns = c2.conns.lock().unwrap();
                conns.retain(|h| !h.is_finished());
                conns.push(h);
            }
        });
        Ok(Proxy {
            listen_port,
            target,
            ctl,
            accept,
        })
    }

    pub fn blackhole(&self, d: Direction, on: bool) {
        let was = self.ctl.dir(d).blackhole.swap(on, Ordering::SeqCst);
        if was && !on {
            self.reset();
        }
    }

    /// Blackholes both directions (`on`), or lifts both.
    pub fn blackhole_all(&self, on: bool) {
        self.blackhole(Direction::Rx, on);
        self.blackhole(Direction::Tx, on);
    }

    pub fn delay(&self, d: Direction, delay: Duration, jitter: Duration) {
        let c = self.ctl.dir(d);
        c.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
        c.jitter_ms
            .store(jitter.as_millis() as u64, Ordering::SeqCst);
    }

    /// Drop probability `p` (0.0..=1.0) for direction `d`.
    pub fn drop_rate(&self, d: Direction, p: f64) {
        self.ctl
            .dir(d)
            .drop_ppm
            .store((p.clamp(0.0, 1.0) * 1e6) as u32, Ordering::SeqCst);
    }

    /// Probability `p` that a new connection is a dud (see the module doc).
    pub fn drop_connections(&self, p: f64) {
        self.ctl
            .conn_drop_ppm
            .store((p.clamp(0.0, 1.0) * 1e6) as u32, Ordering::SeqCst);
    }

    /// Back to a transparent proxy (resets connections if anything was on).
    pub fn heal(&self) {
        let mut any = false;
        for d in [Direction::Rx, Direction::Tx] {
            let c = self.ctl.dir(d);
            any |= c.blackhole.swap(false, Ordering::SeqCst);
            any |= c.drop_ppm.swap(0, Ordering::SeqCst) != 0;
            any |= self.ctl.conn_drop_ppm.swap(0, Ordering::SeqCst) != 0;
            c.delay_ms.store(0, Ordering::SeqCst);
            c.jitter_ms.store(0, Ordering::SeqCst);
        }
        if any {
            self.reset();
        }
    }

    /// Closes every open connection.
    pub fn reset(&self) {
        for h in self.ctl.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    /// (chunks forwarded, chunks discarded) so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.ctl.forwarded.load(Ordering::Relaxed),
            self.ctl.discarded.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.reset();
    }
}

async fn serve(mut down: TcpStream, target: SocketAddr, ctl: Arc<Ctl>, seed: u64) {
    let ppm = ctl.conn_drop_ppm.load(Ordering::SeqCst);
    if ppm > 0 && rand::rngs::StdRng::seed_from_u64(seed).random_range(0..1_000_000) < ppm {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = down.read(&mut buf).await {
            if n == 0 {
                return;
            }
            ctl.discarded.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    let Ok(up) = TcpStream::connect(target).await else {
        return;
    };
    let _ = down.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (dr, dw) = down.into_split();
    let (ur, uw) = up.into_split();
    let a = pump(dr, uw, ctl.clone(), Direction::Rx, seed);
    let b = pump(ur, dw, ctl, Direction::Tx, seed ^ 0x9e37_79b9_7f4a_7c15);
    // Either direction ending closes the connection.
    tokio::select! {
        _ = a => {}
        _ = b => {}
    }
}

async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    ctl: Arc<Ctl>,
    d: Direction,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, buf)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if w.write_all(&buf).await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let c = ctl.dir(d);
        if c.blackhole.load(Ordering::SeqCst) {
            ctl.discarded.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let ppm = c.drop_ppm.load(Ordering::SeqCst);
        if ppm > 0 && rng.random_range(0..1_000_000) < ppm {
            ctl.discarded.fetch_add(1, Ordering::Relaxed);
            writer.abort(); // a stream with a hole cannot go on: close it
            return;
        }
        let delay = c.delay_ms.load(Ordering::SeqCst);
        let jitter = c.jitter_ms.load(Ordering::SeqCst);
        let ms = (delay + rng.random_range(0..=2 * jitter)).saturating_sub(jitter);
        ctl.forwarded.fetch_add(1, Ordering::Relaxed);
        let at = tokio::time::Instant::now() + Duration::from_millis(ms);
        if tx.send((at, buf[..n].to_vec())).is_err() {
            return;
        }
    }
    drop(tx);
    // Bounded by the queued delays; aborted with the connection on reset.
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server and a proxy in front of it.
    async fn echo_behind_proxy() -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Proxy::start(port, target, 7).await.unwrap()
    }

    async fn roundtrip(port: u16, msg: &[u8], wait: Duration) -> Option<Vec<u8>> {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        s.write_all(msg).await.ok()?;
        let mut buf = vec![0u8; msg.len()];
        match tokio::time::timeout(wait, s.read_exact(&mut buf)).await {
            Ok(Ok(_)) => Some(buf),
            _ => None,
        }
    }

    #[tokio::test]
    async fn test_proxy_forwards_blackholes_delays_and_drops() {
        let p = echo_behind_proxy().await;
        let w = Duration::from_millis(500);
        assert_eq!(
            roundtrip(p.listen_port, b"hello", w).await.as_deref(),
            Some(&b"hello"[..])
        );
        p.blackhole(Direction::Rx, true);
        assert_eq!(roundtrip(p.listen_port, b"lost", w).await, None);
        p.blackhole(Direction::Rx, false);
        p.blackhole(Direction::Tx, true);
        assert_eq!(roundtrip(p.listen_port, b"lost", w).await, None);
        p.heal();
        assert!(roundtrip(p.listen_port, b"back", w).await.is_some());
        p.delay(Direction::Rx, Duration::from_millis(300), Duration::ZERO);
        let t = std::time::Instant::now();
        assert!(roundtrip(p.listen_port, b"slow", Duration::from_secs(2))
            .await
            .is_some());
        assert!(t.elapsed() >= Duration::from_millis(300));
        p.heal();
        p.drop_rate(Direction::Rx, 1.0);
        assert_eq!(roundtrip(p.listen_port, b"dropped", w).await, None);
        p.heal();
        assert!(roundtrip(p.listen_port, b"ok", w).await.is_some());
        let (fwd, disc) = p.stats();
        assert!(fwd > 0 && disc >= 3, "{fwd} {disc}");
    }
}
