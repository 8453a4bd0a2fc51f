//! [`Lessor`]: every lease of the cluster, the keys attached to each, and —
//! on the leader only — their expiry (etcd's `lease.lessor`).
//!
//! Every member applies the same grants, revokes and checkpoints (they come
//! through raft), so every member knows every lease and its keys. Only the
//! *primary* lessor (the leader's, after [`Lessor::promote`]) has an expiry
//! clock: a follower's leases never expire ("forever") and renewals are
//! forwarded to the leader. A lease's life on a 3-member cluster, TTL 10 s:
//!
//! ```text
//! t=0   grant(L, 10) applied everywhere; leader: expiry 10, followers: forever
//! t=4   keepalive at a follower -> forwarded -> leader renew: expiry 14
//! t=6   leader dies; t=7 a new leader applies its first entry and promotes
//!       with extend = election timeout (1 s): expiry = 7 + 1 + 10 = 18
//! t=18  nobody renewed: find_expired_leases() returns L; the server proposes
//!       LeaseRevoke(L); its apply deletes L's keys in one revision everywhere
//! ```
//!
//! Time is a monotonic [`Clock`] (`Instant`), never the wall clock.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prost::Message;
use redb::{ReadableDatabase, WriteTransaction};
use retcd_api::etcdserverpb::{request_op, DeleteRangeRequest, RequestOp, TxnRequest};
use retcd_api::mvccpb::{event::EventType, Event};
use retcd_api::retcdpb::{Lease as LeasePb, LeaseCheckpoint};
use retcd_mvcc::{KvStore, LeaseLookup, NoLeases, WriteBatch};
use retcd_storage::backend::LEASES;

use crate::lease_queue::LeaseQueue;
use crate::{LeaseError, LeaseId, MAX_LEASE_TTL, NO_LEASE};

/// etcd's `leaseRevokeRate`: expired leases revoked per second at most.
pub const LEASE_REVOKE_RATE: usize = 1000;
/// etcd's `leaseCheckpointRate` and `maxLeaseCheckpointBatchSize`.
pub const LEASE_CHECKPOINT_RATE: usize = 1000;
pub const MAX_LEASE_CHECKPOINT_BATCH_SIZE: usize = 1000;
/// etcd's `defaultLeaseCheckpointInterval`.
pub const DEFAULT_LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);

/// The lessor's time source (a seam for tests).
pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
}

/// The monotonic system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    /// Protects the offset from `base`.
    offset: Mutex<Duration>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock {
            base: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        }
    }
}

impl ManualClock {
    pub fn advance(&self, d: Duration) {
        *self.offset.lock() += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock()
    }
}

#[derive(Clone, Debug)]
pub struct LessorConfig {
    /// etcd's `MinLeaseTTL`: ⌈1.5 × election timeout⌉ in seconds; shorter
    /// grants are raised to it.
    pub min_lease_ttl: i64,
    /// `Some(interval)` with `--experimental-enable-lease-checkpoint`.
    pub checkpoint_interval: Option<Duration>,
    /// How long an expired lease handed out for revoking waits before it is
    /// handed out again (etcd: the request timeout).
    pub expired_leases_retry_interval: Duration,
}

impl Default for LessorConfig {
    fn default() -> Self {
        LessorConfig {
            min_lease_ttl: 2,
            checkpoint_interval: None,
            expired_leases_retry_interval: Duration::from_secs(3),
        }
    }
}

/// A snapshot of one lease, for TimeToLive and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    pub id: LeaseId,
    /// Granted TTL in seconds (after raising to the minimum).
    pub ttl: i64,
    /// Last checkpointed remaining TTL (0: none).
    pub remaining_ttl: i64,
    /// Seconds until expiry, truncated as etcd's `int64(Remaining().Seconds())`;
    /// for a lease that never expires (not primary) etcd's MaxInt64 ns.
    pub remaining_secs: i64,
    /// Attached keys, sorted.
    pub keys: Vec<Vec<u8>>,
}

/// Outcome of a successful [`Lessor::renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Renewed {
    /// The granted TTL (what a keepalive answers).
    pub ttl: i64,
    /// The lease had a checkpointed remaining TTL: propose a checkpoint
    /// with remaining 0 so every member forgets it (etcd does the same).
    pub clear_checkpoint: bool,
}

#[derive(Debug)]
struct Lease {
    ttl: i64,
    remaining_ttl: i64,
    /// `None`: never expires (this lessor is not primary).
    expiry: Option<Instant>,
    keys: BTreeSet<Vec<u8>>,
}

impl Lease {
    /// etcd's `RemainingTTL`: the checkpointed remaining TTL if any, else TTL.
    fn effective_ttl(&self) -> i64 {
        if self.remaining_ttl > 0 {
            self.remaining_ttl
        } else {
            self.ttl
        }
    }
    fn refresh(&mut self, now: Instant, extend: Duration) {
        self.expiry = Some(now + extend + Duration::from_secs(self.effective_ttl().max(0) as u64));
    }
    fn expired(&self, now: Instant) -> bool {
        self.expiry.is_some_and(|e| now >= e)
    }
    /// Signed nanoseconds until expiry (etcd's `Remaining()`).
    fn remaining_nanos(&self, now: Instant) -> i128 {
        match self.expiry {
            None => i64::MAX as i128,
            Some(e) if e >= now => (e - now).as_nanos() as i128,
            Some(e) => -((now - e).as_nanos() as i128),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    primary: bool,
    leases: HashMap<LeaseId, Lease>,
    /// Which lease each attached key belongs to (etcd's `itemMap`).
    items: HashMap<Vec<u8>, LeaseId>,
    /// Expiry deadlines; only filled while primary.
    expiries: LeaseQueue,
    /// Next checkpoint time per lease (duplicates allowed, as etcd's heap);
    /// only filled while primary with checkpoints enabled.
    checkpoints: BinaryHeap<Reverse<(Instant, LeaseId)>>,
    /// Leases renewed while they had a checkpointed remaining TTL: the next
    /// checkpoint round proposes remaining 0 for them.
    cleared: Vec<LeaseId>,
}

/// All leases; share as `Arc<Lessor>`.
///
/// Callers: the raft thread (grant/revoke/checkpoint apply inside its MVCC
/// batch, attachments after each commit, promote/demote), gRPC tasks
/// (renew, lookups), the leader's expiry task.
pub struct Lessor {
    cfg: LessorConfig,
    clock: Arc<dyn Clock>,
    /// Protects every lease, the key attachments, the expiry queue, the
    /// checkpoint heap and the primary flag. Held for in-memory work only —
    /// never across `.await`; redb writes made under it go to the caller's
    /// open write transaction (memory until that batch commits). Lock order:
    /// the MVCC batch lock (held by the raft thread during apply) before
    /// this one; [`Lessor::revoke`] releases it before touching the store.
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Lessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.lock();
        f.debug_struct("Lessor")
            .field("primary", &i.primary)
            .field("leases", &i.leases.len())
            .finish()
    }
}

impl LeaseLookup for Lessor {
    fn lease_exists(&self, id: i64) -> bool {
        self.inner.lock().leases.contains_key(&id)
    }
}

fn persist(txn: &WriteTransaction, id: LeaseId, l: &Lease) -> Result<(), LeaseError> {
    let v = LeasePb {
        id,
        ttl: l.ttl,
        remaining_ttl: l.remaining_ttl,
    }
    .encode_to_vec();
    txn.open_table(LEASES)?.insert(id, v.as_slice())?;
    Ok(())
}

impl Lessor {
    pub fn new(cfg: LessorConfig, clock: Arc<dyn Clock>) -> Lessor {
        Lessor {
            cfg,
            clock,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn min_lease_ttl(&self) -> i64 {
        self.cfg.min_lease_ttl
    }

    pub fn checkpoints_enabled(&self) -> bool {
        self.cfg.checkpoint_interval.is_some()
    }

    pub fn is_primary(&self) -> bool {
        self.inner.lock().primary
    }

    /// Grants lease `id` (apply of LeaseGrant); persisted in `txn`.
    /// Returns the granted TTL (raised to the minimum).
    pub fn grant(&self, txn: &WriteTransaction, id: LeaseId, ttl: i64) -> Result<i64, LeaseError> {
        if id == NO_LEASE {
            return Err(LeaseError::NotFound);
        }
        if ttl > MAX_LEASE_TTL {
            return Err(LeaseError::TtlTooLarge);
        }
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        if inner.leases.contains_key(&id) {
            return Err(LeaseError::Exists);
        }
        let mut l = Lease {
            ttl: ttl.max(self.cfg.min_lease_ttl),
            remaining_ttl: 0,
            expiry: None,
            keys: BTreeSet::new(),
        };
        if inner.primary {
            l.refresh(now, Duration::ZERO);
            inner
                .expiries
                .register_or_update(id, l.expiry.expect("refreshed"));
        }
        persist(txn, id, &l)?;
        let granted = l.ttl;
        inner.leases.insert(id, l);
        if inner.primary {
            self.schedule_checkpoint(&mut inner, id, now);
        }
        Ok(granted)
    }

    /// Revokes lease `id` (apply of LeaseRevoke): deletes its keys in one
    /// txn of `batch` (one revision, as etcd), then forgets the lease.
    pub fn revoke(&self, batch: &mut WriteBatch<'_>, id: LeaseId) -> Result<(), LeaseError> {
        let keys: Vec<Vec<u8>> = {
            let inner = self.inner.lock();
            let l = inner.leases.get(&id).ok_or(LeaseError::NotFound)?;
            l.keys.iter().cloned().collect()
        };
        if !keys.is_empty() {
            let req = TxnRequest {
                success: keys
                    .iter()
                    .map(|k| RequestOp {
                        request: Some(request_op::Request::RequestDeleteRange(
                            DeleteRangeRequest {
                                key: k.clone(),
                                ..Default::default()
                            },
                        )),
                    })
                    .collect(),
                ..Default::default()
            };
            batch
                .txn(&req, &NoLeases)
                .map_err(|e| LeaseError::Backend(e.to_string()))?;
        }
        let mut inner = self.inner.lock();
        if let Some(l) = inner.leases.remove(&id) {
            for k in &l.keys {
                inner.items.remove(k);
            }
        }
        inner.expiries.unregister(id);
        batch
            .backend_txn()
            .map_err(|e| LeaseError::Backend(e.to_string()))?
            .open_table(LEASES)?
            .remove(id)?;
        Ok(())
    }

    /// Applies a checkpoint: the lease's remaining TTL (0 clears it).
    pub fn checkpoint(
        &self,
        txn: &WriteTransaction,
        id: LeaseId,
        remaining_ttl: i64,
    ) -> Result<(), LeaseError> {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let primary = inner.primary;
        if let Some(l) = inner.leases.get_mut(&id) {
            l.remaining_ttl = remaining_ttl;
            persist(txn, id, l)?;
            if primary {
                self.schedule_checkpoint(&mut inner, id, now);
            }
        }
        Ok(())
    }

    /// Renews lease `id` (primary only). `Expired`: the lease ran out and
    /// its revoke is on its way; the caller waits and asks again.
    pub fn renew(&self, id: LeaseId) -> Result<Renewed, LeaseError> {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        if !inner.primary {
            return Err(LeaseError::NotPrimary);
        }
        let checkpoints = self.checkpoints_enabled();
        let l = inner.leases.get_mut(&id).ok_or(LeaseError::NotFound)?;
        if l.expired(now) {
            return Err(LeaseError::Expired);
        }
        let clear_checkpoint = checkpoints && l.remaining_ttl > 0;
        l.remaining_ttl = 0;
        l.refresh(now, Duration::ZERO);
        let (ttl, expiry) = (l.ttl, l.expiry.expect("refreshed"));
        inner.expiries.register_or_update(id, expiry);
        if clear_checkpoint {
            inner.cleared.push(id);
        }
        Ok(Renewed {
            ttl,
            clear_checkpoint,
        })
    }

    pub fn lookup(&self, id: LeaseId) -> Option<LeaseInfo> {
        let now = self.clock.now();
        let inner = self.inner.lock();
        let l = inner.leases.get(&id)?;
        Some(LeaseInfo {
            id,
            ttl: l.ttl,
            remaining_ttl: l.remaining_ttl,
            remaining_secs: (l.remaining_nanos(now) / 1_000_000_000) as i64,
            keys: l.keys.iter().cloned().collect(),
        })
    }

    /// Every lease ID, soonest expiry first (etcd's `Leases()`), then by ID.
    pub fn leases(&self) -> Vec<LeaseId> {
        let now = self.clock.now();
        let inner = self.inner.lock();
        let mut v: Vec<(i128, LeaseId)> = inner
            .leases
            .iter()
            .map(|(id, l)| (l.remaining_nanos(now), *id))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, id)| id).collect()
    }

    /// Becomes primary: every lease expires `extend` + its (remaining) TTL
    /// from now; piles of leases expiring in the same second are spread
    /// out so revoking them stays under the revoke rate (etcd's Promote).
    pub fn promote(&self, extend: Duration) {
        let now = self.clock.now();
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        inner.primary = true;
        inner.expiries.clear();
        inner.checkpoints.clear();
        let ids: Vec<LeaseId> = inner.leases.keys().copied().collect();
        for id in &ids {
            let l = inner.leases.get_mut(id).expect("listed");
            l.refresh(now, extend);
            inner
                .expiries
                .register_or_update(*id, l.expiry.expect("refreshed"));
            self.schedule_checkpoint(inner, *id, now);
        }
        if inner.leases.len() < LEASE_REVOKE_RATE {
            return;
        }
        let mut by_expiry: Vec<(i128, LeaseId)> = inner
            .leases
            .iter()
            .map(|(id, l)| (l.remaining_nanos(now), *id))
            .collect();
        by_expiry.sort_unstable();
        let second = 1_000_000_000i128;
        let mut base = by_expiry[0].0;
        let mut next = base + second;
        let mut expires = 0i128;
        let target = (3 * LEASE_REVOKE_RATE / 4) as i128;
        for (remaining, id) in by_expiry {
            if remaining > next {
                base = remaining;
                next = base + second;
                expires = 1;
                continue;
            }
            expires += 1;
            if expires <= target {
                continue;
            }
            let delay = second * expires / target - (remaining - base);
            next = base + delay;
            let l = inner.leases.get_mut(&id).expect("listed");
            l.refresh(now, extend + Duration::from_nanos(delay.max(0) as u64));
            inner
                .expiries
                .register_or_update(id, l.expiry.expect("refreshed"));
            self.schedule_checkpoint(inner, id, now);
        }
    }

    /// Stops being primary: leases no longer expire here.
    pub fn demote(&self) {
        let mut inner = self.inner.lock();
        inner.primary = false;
        for l in inner.leases.values_mut() {
            l.expiry = None;
        }
        inner.expiries.clear();
        inner.checkpoints.clear();
        inner.cleared.clear();
    }

    /// Up to `limit` expired leases to revoke (primary only). A lease handed
    /// out is handed out again after the retry interval if still there
    /// (its revoke may have been lost), as etcd's `findExpiredLeases`.
    /// Each with how long past its expiry it was found (the expiry loop's
    /// lateness, for the revoke's log).
    pub fn find_expired_leases(&self, limit: usize) -> Vec<(LeaseId, Duration)> {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        if !inner.primary {
            return out;
        }
        while out.len() < limit {
            let Some((at, id)) = inner.expiries.poll() else {
                break;
            };
            let Some(l) = inner.leases.get(&id) else {
                inner.expiries.unregister(id);
                continue;
            };
            if now < at {
                break;
            }
            let overdue = l.expiry.and_then(|e| now.checked_duration_since(e));
            inner
                .expiries
                .register_or_update(id, now + self.cfg.expired_leases_retry_interval);
            if let Some(overdue) = overdue {
                out.push((id, overdue));
            }
        }
        out
    }

    /// Checkpoints due now, up to `limit` (primary with checkpoints only):
    /// the remaining TTL, rounded up, of leases with less than their TTL left.
    pub fn find_due_checkpoints(&self, limit: usize) -> Vec<LeaseCheckpoint> {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let mut out = Vec::new();
        if !inner.primary || !self.checkpoints_enabled() {
            return out;
        }
        while out.len() < limit {
            let Some(id) = inner.cleared.pop() else { break };
            out.push(LeaseCheckpoint {
                id,
                remaining_ttl: 0,
            });
        }
        while out.len() < limit {
            let Some(Reverse((at, id))) = inner.checkpoints.peek().copied() else {
                break;
            };
            if at > now {
                break;
            }
            inner.checkpoints.pop();
            let Some(l) = inner.leases.get(&id) else {
                continue;
            };
            let Some(expiry) = l.expiry.filter(|e| now < *e) else {
                continue;
            };
            let left = expiry - now;
            let remaining = left.as_secs() as i64 + i64::from(left.subsec_nanos() > 0);
            if remaining >= l.ttl {
                continue;
            }
            out.push(LeaseCheckpoint {
                id,
                remaining_ttl: remaining,
            });
        }
        out
    }

    fn schedule_checkpoint(&self, inner: &mut Inner, id: LeaseId, now: Instant) {
        let Some(interval) = self.cfg.checkpoint_interval else {
            return;
        };
        if let Some(l) = inner.leases.get(&id) {
            if l.effective_ttl() > interval.as_secs() as i64 {
                inner.checkpoints.push(Reverse((now + interval, id)));
            }
        }
    }

    /// Points `key` at `lease` (0 or an unknown lease: detaches it).
    pub fn set_key_lease(&self, key: &[u8], lease: LeaseId) {
        let mut inner = self.inner.lock();
        Self::set_key_lease_locked(&mut inner, key, lease);
    }

    fn set_key_lease_locked(inner: &mut Inner, key: &[u8], lease: LeaseId) {
        // no key has a lease: nothing to detach (a put without a lease
        // then hashes nothing)
        if lease == NO_LEASE && inner.items.is_empty() {
            return;
        }
        let old = inner.items.get(key).copied();
        if old == Some(lease) {
            return;
        }
        if let Some(old) = old {
            inner.items.remove(key);
            if let Some(l) = inner.leases.get_mut(&old) {
                l.keys.remove(key);
            }
        }
        if lease != NO_LEASE {
            if let Some(l) = inner.leases.get_mut(&lease) {
                l.keys.insert(key.to_vec());
                inner.items.insert(key.to_vec(), lease);
            }
        }
    }

    /// Follows committed events: a put attaches its key to `kv.lease` (or
    /// detaches it), a delete detaches it.
    pub fn apply_events<'a>(&self, events: impl IntoIterator<Item = &'a Event>) {
        let mut inner = self.inner.lock();
        for ev in events {
            let Some(kv) = &ev.kv else { continue };
            let lease = if ev.r#type == EventType::Put as i32 {
                kv.lease
            } else {
                NO_LEASE
            };
            Self::set_key_lease_locked(&mut inner, &kv.key, lease);
        }
    }

    /// Reloads every lease from the backend's `lease` table and reattaches
    /// keys by scanning the store (start, and after a snapshot restore).
    /// Expiry restarts from the full TTL or the checkpointed remaining TTL.
    pub fn recover(&self, kv: &KvStore) -> Result<(), LeaseError> {
        let mut loaded = HashMap::new();
        {
            let txn = kv.backend().db().begin_read()?;
            let table = txn.open_table(LEASES)?;
            for entry in redb::ReadableTable::iter(&table)? {
                let (k, v) = entry?;
                let pb = LeasePb::decode(v.value()).map_err(|e| {
                    LeaseError::Backend(format!("cannot decode lease {}: {e}", k.value()))
                })?;
                loaded.insert(
                    k.value(),
                    Lease {
                        ttl: pb.ttl,
                        remaining_ttl: pb.remaining_ttl,
                        expiry: None,
                        keys: BTreeSet::new(),
                    },
                );
            }
        }
        // Without leases no key can hold one: skip the scan.
        let leased = if loaded.is_empty() {
            Vec::new()
        } else {
            kv.leased_keys()
                .map_err(|e| LeaseError::Backend(e.to_string()))?
        };
        let now = self.clock.now();
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        inner.leases = loaded;
        inner.items.clear();
        inner.expiries.clear();
        inner.checkpoints.clear();
        for (key, lease) in leased {
            Self::set_key_lease_locked(inner, &key, lease);
        }
        if inner.primary {
            let ids: Vec<LeaseId> = inner.leases.keys().copied().collect();
            for id in ids {
                let l = inner.leases.get_mut(&id).expect("listed");
                l.refresh(now, Duration::ZERO);
                inner
                    .expiries
                    .register_or_update(id, l.expiry.expect("refreshed"));
                self.schedule_checkpoint(inner, id, now);
            }
        }
        tracing::info!(
            leases = inner.leases.len(),
            keys = inner.items.len(),
            "lease: recovered lessor"
        );
        Ok(())
    }
}
