//! [`LeaseQueue`]: leases ordered by a deadline (etcd's
//! `LeaseExpiredNotifier`): at most one live deadline per lease, the
//! earliest first.
//!
//! A binary heap cannot move an entry, so an update pushes a new entry and
//! remembers the lease's current deadline in `current`; a heap entry whose
//! deadline differs from `current` is stale and skipped when it reaches the
//! top. Example:
//!
//! ```text
//! register(7, t=10)   heap [(10,7)]          current {7: 10}
//! register(7, t=15)   heap [(10,7),(15,7)]   current {7: 15}   (renewed)
//! poll()  -> (15, 7)  the stale (10,7) is dropped on the way
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

use crate::LeaseId;

#[derive(Debug, Default)]
pub struct LeaseQueue {
    heap: BinaryHeap<Reverse<(Instant, LeaseId)>>,
    current: HashMap<LeaseId, Instant>,
}

impl LeaseQueue {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or moves) the deadline of `id`.
    pub fn register_or_update(&mut self, id: LeaseId, at: Instant) {
        self.current.insert(id, at);
        self.heap.push(Reverse((at, id)));
        // Keep stale entries from piling up under heavy renewals.
        if self.heap.len() > 2 * self.current.len() + 64 {
            self.rebuild();
        }
    }

    /// Forgets `id`.
    pub fn unregister(&mut self, id: LeaseId) {
        self.current.remove(&id);
    }

    /// The earliest live (deadline, id), without removing it.
    pub fn poll(&mut self) -> Option<(Instant, LeaseId)> {
        while let Some(Reverse((at, id))) = self.heap.peek().copied() {
            if self.current.get(&id) == Some(&at) {
                return Some((at, id));
            }
            self.heap.pop();
        }
        None
    }

    /// Number of leases queued.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty()
    }

    pub fn clear(&mut self) {
        self.heap.clear();
        self.current.clear();
    }

    fn rebuild(&mut self) {
        self.heap = self
            .current
            .iter()
            .map(|(id, at)| Reverse((*at, *id)))
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn test_lease_queue() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut q = LeaseQueue::new();
        assert_eq!(q.poll(), None);
        for (id, d) in [(1, 5u32), (2, 3), (3, 9), (4, 1)] {
            q.register_or_update(id, t0 + s * d);
        }
        assert_eq!(q.poll(), Some((t0 + s, 4)));
        // moving the head behind everyone
        q.register_or_update(4, t0 + s * 20);
        assert_eq!(q.poll(), Some((t0 + s * 3, 2)));
        q.unregister(2);
        assert_eq!(q.poll(), Some((t0 + s * 5, 1)));
        assert_eq!(q.len(), 3);
        let mut order = Vec::new();
        while let Some((_, id)) = q.poll() {
            order.push(id);
            q.unregister(id);
        }
        assert_eq!(order, vec![1, 3, 4]);
        assert!(q.is_empty());
    }

    #[test]
    fn test_lease_queue_many_updates_stay_bounded() {
        let t0 = Instant::now();
        let mut q = LeaseQueue::new();
        for i in 0..10_000u32 {
            q.register_or_update(1, t0 + Duration::from_millis(i.into()));
        }
        assert!(q.heap.len() <= 2 * q.current.len() + 64);
        assert_eq!(q.poll(), Some((t0 + Duration::from_millis(9999), 1)));
    }
}
