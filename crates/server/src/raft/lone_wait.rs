//! Bounded spinning for a lone client's latency.
//!
//! Waking a sleeping thread costs tens of microseconds here (a futex wake,
//! an IPI to a halted vCPU), and a lone client's put paid two such wake-ups
//! on the server besides its fsync: tokio → raft thread and raft thread →
//! tokio. While requests arrive one at a time, two bounded spins replace
//! them:
//!
//! * the raft thread, after a turn that had input, spins up to
//!   [`RAFT_SPIN`] for the next input before it sleeps (`RaftNode::recv_input`);
//! * a request waiting for the raft thread (a proposal or a ReadIndex)
//!   spins up to [`LONE_WAIT_SPIN`] for its answer instead of parking its
//!   task ([`Waiting::spin`]).
//!
//! Spinning pays only when the answer is close and the spinner takes no
//! CPU another thread needs, so both spin only when
//!
//! * this member is the cluster's **sole voter**: the wait is one local
//!   fsync. In a multi-member cluster the wait spans network round trips
//!   and other members' fsyncs, and members sharing cores (3 members on 2
//!   cores in the benchmarks) would spin against each other: a first
//!   version, spinning on every member, made 3-member puts from one client
//!   2.6× slower at 2.9× etcd's CPU;
//! * and the member is *quiet*: no two requests have waited for the raft
//!   thread at the same time in the last [`QUIET_WINDOW`]. Under
//!   concurrency spinning only takes CPU from the work that matters (an
//!   unconditional spin cost 14 % of the server's CPU at 100 clients).
//!
//! An idle member never spins (its raft turns are ticks only), and a
//! process allowed only one CPU (`taskset`, a container's CPU set) never
//! spins at all: there the spinner holds the very CPU the thread it waits
//! for needs (measured with the server pinned to one core: lone puts went
//! from ~0.3 ms to 1.16 ms with the spins on).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long the raft thread spins for its next input after a busy turn.
pub const RAFT_SPIN: Duration = Duration::from_micros(200);
/// How long a lone request spins for the raft thread's answer: about one
/// WAL fdatasync on the benchmark machine. Measured there (1 node, one
/// client, 3 × 1 500 puts on fresh servers, twice): 150 µs avg 0.47–0.53
/// ms; 250 µs avg 0.30–0.37 ms, p99 1.0–1.2 ms; 400 µs p99 1.05–1.53 ms;
/// 1 ms avg 0.37–0.47 ms but p99 1.9–2.1 ms; no spin avg 0.54–0.76 ms,
/// p99 0.84–1.1 ms. A spin much longer than the usual wait only adds a
/// tail.
pub const LONE_WAIT_SPIN: Duration = Duration::from_micros(250);
/// Spinning stops for this long after two requests waited at once.
pub const QUIET_WINDOW: Duration = Duration::from_millis(50);

/// Counts requests waiting for the raft thread and remembers when two did
/// at once. Lock-free; shared by tokio tasks and the raft thread.
#[derive(Debug)]
pub struct Contention {
    start: Instant,
    waiting: AtomicUsize,
    /// Microseconds after `start` when two requests last waited at once
    /// (0: never).
    last_concurrent_us: AtomicU64,
    /// Whether this member is the only voter (set by the raft thread).
    sole_voter: AtomicBool,
    /// CPUs this process may run on (`available_parallelism`, which
    /// follows the affinity mask and cgroup quotas); no spinning below 2.
    cpus: usize,
}

impl Default for Contention {
    fn default() -> Self {
        Contention::with_cpus(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl Contention {
    /// A tracker for a process that may use `cpus` CPUs.
    pub fn with_cpus(cpus: usize) -> Contention {
        Contention {
            start: Instant::now(),
            waiting: AtomicUsize::new(0),
            last_concurrent_us: AtomicU64::new(0),
            sole_voter: AtomicBool::new(false),
            cpus,
        }
    }

    fn now_us(&self) -> u64 {
        // +1 so that "never" (0) stays distinct from the first microsecond
        self.start.elapsed().as_micros() as u64 + 1
    }

    /// Called by the raft thread whenever it publishes its status.
    pub fn set_sole_voter(&self, sole: bool) {
        if self.sole_voter.load(Ordering::Relaxed) != sole {
            self.sole_voter.store(sole, Ordering::Relaxed);
        }
    }

    /// Whether spinning may pay: the process has two CPUs or more, this
    /// member is the sole voter and no two requests waited at once in the
    /// last [`QUIET_WINDOW`].
    pub fn quiet(&self) -> bool {
        if self.cpus < 2 || !self.sole_voter.load(Ordering::Relaxed) {
            return false;
        }
        let last = self.last_concurrent_us.load(Ordering::Relaxed);
        last == 0 || self.now_us().saturating_sub(last) >= QUIET_WINDOW.as_micros() as u64
    }

    /// Registers a request waiting for the raft thread until the returned
    /// guard is dropped.
    pub fn enter(&self) -> Waiting<'_> {
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= 1 {
            self.last_concurrent_us
                .store(self.now_us(), Ordering::Relaxed);
        }
        Waiting(self)
    }
}

/// A request waiting for the raft thread (see [`Contention::enter`]).
pub struct Waiting<'a>(&'a Contention);

impl Waiting<'_> {
    /// Spins for `rx`'s value while this request is the only one waiting
    /// and the member is quiet, for up to [`LONE_WAIT_SPIN`]. `None` if it
    /// did not come (then `.await` it); `Some(None)` if the sender was
    /// dropped.
    pub fn spin<T>(&self, rx: &mut oneshot::Receiver<T>) -> Option<Option<T>> {
        self.spin_for(rx, LONE_WAIT_SPIN)
    }

    /// [`Waiting::spin`] with a given budget.
    fn spin_for<T>(&self, rx: &mut oneshot::Receiver<T>, budget: Duration) -> Option<Option<T>> {
        if !self.0.quiet() {
            return None;
        }
        let until = Instant::now() + budget;
        let mut n = 0u32;
        while self.0.waiting.load(Ordering::Acquire) == 1 {
            match rx.try_recv() {
                Ok(v) => return Some(Some(v)),
                Err(oneshot::error::TryRecvError::Closed) => return Some(None),
                Err(oneshot::error::TryRecvError::Empty) => std::hint::spin_loop(),
            }
            n = n.wrapping_add(1);
            if n.is_multiple_of(32) && Instant::now() >= until {
                break;
            }
        }
        None
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sole() -> Contention {
        let c = Contention::with_cpus(2);
        c.set_sole_voter(true);
        c
    }

    #[test]
    fn test_never_quiet_on_one_cpu() {
        let c = Contention::with_cpus(1);
        c.set_sole_voter(true);
        assert!(!c.quiet());
        let w = c.enter();
        let (tx, mut rx) = oneshot::channel::<u8>();
        tx.send(1).unwrap();
        assert!(w.spin(&mut rx).is_none(), "no spin, even for a ready value");
    }

    #[test]
    fn test_never_quiet_with_other_voters() {
        let c = Contention::with_cpus(2);
        assert!(!c.quiet());
        let w = c.enter();
        let (_tx, mut rx) = oneshot::channel::<u8>();
        assert!(w.spin(&mut rx).is_none());
        drop(w);
        c.set_sole_voter(true);
        assert!(c.quiet());
        c.set_sole_voter(false);
        assert!(!c.quiet());
    }

    #[test]
    fn test_quiet_until_two_wait_at_once() {
        let c = sole();
        assert!(c.quiet());
        {
            let _a = c.enter();
            assert!(c.quiet(), "one waiter alone keeps the member quiet");
        }
        let _a = c.enter();
        let _b = c.enter();
        assert!(!c.quiet(), "two waiters at once end the quiet");
    }

    #[test]
    fn test_spin_returns_a_value_sent_meanwhile() {
        let c = sole();
        let w = c.enter();
        let (tx, mut rx) = oneshot::channel();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(100));
            let _ = tx.send(7);
        });
        // the value comes within the spin (or, on a slow machine, after it)
        match w.spin(&mut rx) {
            Some(v) => assert_eq!(v, Some(7)),
            None => {
                t.join().unwrap();
                assert_eq!(rx.try_recv().unwrap(), 7);
                return;
            }
        }
        t.join().unwrap();
    }

    #[test]
    fn test_no_spin_while_another_waits() {
        let c = sole();
        let _other = c.enter();
        let w = c.enter();
        let (_tx, mut rx) = oneshot::channel::<u8>();
        let started = Instant::now();
        // a budget no scheduling delay explains: it must not spin at all
        assert!(w.spin_for(&mut rx, Duration::from_secs(10)).is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn test_spin_reports_a_dropped_sender() {
        let c = sole();
        let w = c.enter();
        let (tx, mut rx) = oneshot::channel::<u8>();
        drop(tx);
        assert_eq!(w.spin(&mut rx), Some(None));
    }
}
