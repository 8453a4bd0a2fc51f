//! Lessor tests, named after etcd's `lessor_test.go`.

use std::sync::Arc;
use std::time::Duration;

use redb::ReadableDatabase;
use retcd_api::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest};
use retcd_mvcc::{KvStore, LeaseLookup};
use retcd_storage::backend::{Backend, LEASES};

use crate::lessor::LessorConfig;
use crate::{LeaseError, LeaseId, Lessor, ManualClock, MAX_LEASE_TTL};

struct Env {
    _dir: tempfile::TempDir,
    kv: Arc<KvStore>,
    clock: Arc<ManualClock>,
    le: Lessor,
}

fn env_with(cfg: LessorConfig) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
    let kv = Arc::new(KvStore::open(backend).unwrap());
    let clock = Arc::new(ManualClock::default());
    let le = Lessor::new(cfg, clock.clone());
    Env {
        _dir: dir,
        kv,
        clock,
        le,
    }
}

fn env() -> Env {
    env_with(LessorConfig {
        min_lease_ttl: 2,
        ..Default::default()
    })
}

const S: Duration = Duration::from_secs(1);

impl Env {
    fn grant(&self, id: i64, ttl: i64) -> Result<i64, LeaseError> {
        let b = self.kv.begin_batch().unwrap();
        let r = self.le.grant(b.backend_txn().unwrap(), id, ttl);
        b.commit(false).unwrap();
        r
    }
    fn revoke(&self, id: i64) -> Result<(), LeaseError> {
        let mut b = self.kv.begin_batch().unwrap();
        let r = self.le.revoke(&mut b, id);
        let events = b.take_events();
        b.commit(false).unwrap();
        self.le.apply_events(events.iter().map(|(_, e)| e));
        r
    }
    fn put(&self, key: &str, lease: i64) {
        let mut b = self.kv.begin_batch().unwrap();
        let req = PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        };
        b.put(&req, &self.le).unwrap();
        let events = b.take_events();
        b.commit(false).unwrap();
        self.le.apply_events(events.iter().map(|(_, e)| e));
    }
    fn delete(&self, key: &str) {
        let mut b = self.kv.begin_batch().unwrap();
        b.delete_range(&DeleteRangeRequest {
            key: key.into(),
            ..Default::default()
        })
        .unwrap();
        let events = b.take_events();
        b.commit(false).unwrap();
        self.le.apply_events(events.iter().map(|(_, e)| e));
    }
    fn keys(&self) -> Vec<Vec<u8>> {
        self.kv
            .range(&RangeRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            })
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| kv.key.to_vec())
            .collect()
    }
    fn stored_leases(&self) -> Vec<i64> {
        let txn = self.kv.backend().db().begin_read().unwrap();
        let t = txn.open_table(LEASES).unwrap();
        redb::ReadableTable::iter(&t)
            .unwrap()
            .map(|e| e.unwrap().0.value())
            .collect()
    }
}

#[test]
fn test_lessor_grant() {
    let e = env();
    e.le.promote(Duration::ZERO);
    assert_eq!(e.grant(1, 1), Ok(2), "raised to the minimum TTL");
    assert_eq!(e.grant(2, 100), Ok(100));
    assert_eq!(e.grant(3, 0), Ok(2));
    assert_eq!(e.grant(4, -5), Ok(2));
    assert_eq!(e.grant(1, 10), Err(LeaseError::Exists));
    assert_eq!(e.grant(0, 10), Err(LeaseError::NotFound));
    let l = e.le.lookup(2).unwrap();
    assert_eq!((l.ttl, l.remaining_secs), (100, 100));
    assert!(e.le.lease_exists(1) && !e.le.lease_exists(9));
    assert_eq!(e.stored_leases(), vec![1, 2, 3, 4]);
    assert_eq!(e.le.leases(), vec![1, 3, 4, 2], "soonest expiry first");
}

#[test]
fn test_lessor_max_ttl() {
    let e = env();
    assert_eq!(e.grant(1, MAX_LEASE_TTL + 1), Err(LeaseError::TtlTooLarge));
    assert_eq!(e.grant(1, MAX_LEASE_TTL), Ok(MAX_LEASE_TTL));
}

#[test]
fn test_lessor_revoke() {
    let e = env();
    e.grant(5, 10).unwrap();
    e.put("a", 5);
    e.put("b", 5);
    e.put("c", 0);
    let rev = e.kv.current_revision();
    assert_eq!(
        e.le.lookup(5).unwrap().keys,
        vec![b"a".to_vec(), b"b".to_vec()]
    );
    e.revoke(5).unwrap();
    assert_eq!(
        e.kv.current_revision(),
        rev + 1,
        "one revision for all keys"
    );
    assert_eq!(e.keys(), vec![b"c".to_vec()]);
    assert!(e.le.lookup(5).is_none());
    assert!(e.stored_leases().is_empty());
    assert_eq!(e.revoke(5), Err(LeaseError::NotFound));
    // a lease with no keys: no revision
    e.grant(6, 10).unwrap();
    e.revoke(6).unwrap();
    assert_eq!(e.kv.current_revision(), rev + 1);
}

#[test]
fn test_lessor_detach() {
    let e = env();
    e.grant(1, 10).unwrap();
    e.grant(2, 10).unwrap();
    e.put("a", 1);
    e.put("b", 1);
    e.put("c", 1);
    e.put("a", 2); // moved
    e.put("b", 0); // detached by a put without lease
    e.delete("c"); // detached by a delete
    assert!(e.le.lookup(1).unwrap().keys.is_empty());
    assert_eq!(e.le.lookup(2).unwrap().keys, vec![b"a".to_vec()]);
    e.revoke(1).unwrap();
    assert_eq!(e.keys(), vec![b"a".to_vec(), b"b".to_vec()]);
}

#[test]
fn test_lessor_renew() {
    let e = env();
    e.grant(1, 10).unwrap();
    assert_eq!(e.le.renew(1), Err(LeaseError::NotPrimary));
    e.le.promote(Duration::ZERO);
    e.clock.advance(5 * S);
    assert_eq!(e.le.lookup(1).unwrap().remaining_secs, 5);
    assert_eq!(e.le.renew(1).unwrap().ttl, 10);
    assert_eq!(e.le.lookup(1).unwrap().remaining_secs, 10);
    assert_eq!(e.le.renew(2), Err(LeaseError::NotFound));
    e.clock.advance(10 * S);
    assert_eq!(e.le.renew(1), Err(LeaseError::Expired));
}

/// The IDs [`Lessor::find_expired_leases`] hands out.
fn expired_ids(le: &Lessor, limit: usize) -> Vec<LeaseId> {
    le.find_expired_leases(limit)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

#[test]
fn test_lessor_expire() {
    let e = env();
    e.le.promote(Duration::ZERO);
    e.grant(1, 3).unwrap();
    e.grant(2, 5).unwrap();
    e.grant(3, 4).unwrap();
    e.clock.advance(2 * S);
    assert!(expired_ids(&e.le, 10).is_empty());
    e.le.renew(1).unwrap(); // now expires at 5
    e.clock.advance(2 * S + Duration::from_millis(500)); // t = 4.5
    assert_eq!(
        e.le.find_expired_leases(10),
        vec![(3, Duration::from_millis(500))],
        "found 0.5 s past its expiry at 4"
    );
    assert!(
        expired_ids(&e.le, 10).is_empty(),
        "handed out once per retry interval"
    );
    e.clock.advance(S); // t = 5.5
    assert_eq!(expired_ids(&e.le, 1), vec![1], "limit, in expiry order");
    assert_eq!(expired_ids(&e.le, 10), vec![2]);
    e.clock.advance(3 * S); // retry interval passed, nothing revoked yet
    let mut again = expired_ids(&e.le, 10);
    again.sort();
    assert_eq!(again, vec![1, 2, 3]);
    e.revoke(3).unwrap();
    e.clock.advance(3 * S);
    let mut again = expired_ids(&e.le, 10);
    again.sort();
    assert_eq!(again, vec![1, 2]);
}

#[test]
fn test_lessor_promote() {
    let e = env();
    e.grant(1, 10).unwrap();
    assert_eq!(
        e.le.lookup(1).unwrap().remaining_secs,
        i64::MAX / 1_000_000_000,
        "forever"
    );
    e.clock.advance(100 * S);
    assert!(
        expired_ids(&e.le, 10).is_empty(),
        "a follower never expires"
    );
    e.le.promote(S);
    assert_eq!(e.le.lookup(1).unwrap().remaining_secs, 11, "TTL + extend");
    e.clock.advance(10 * S);
    assert!(expired_ids(&e.le, 10).is_empty());
    e.clock.advance(S);
    assert_eq!(expired_ids(&e.le, 10), vec![1]);
}

#[test]
fn test_lessor_demote() {
    let e = env();
    e.le.promote(Duration::ZERO);
    e.grant(1, 5).unwrap();
    e.le.demote();
    assert!(!e.le.is_primary());
    e.clock.advance(10 * S);
    assert!(expired_ids(&e.le, 10).is_empty());
    assert_eq!(e.le.renew(1), Err(LeaseError::NotPrimary));
    e.le.promote(Duration::ZERO);
    assert_eq!(e.le.lookup(1).unwrap().remaining_secs, 5);
}

#[test]
fn test_lessor_promote_spreads_pile_up() {
    let e = env();
    for id in 1..=2000 {
        e.grant(id, 10).unwrap();
    }
    e.le.promote(Duration::ZERO);
    // Over the first 20 seconds no second sees more than 1000 expiries.
    let mut per_second = Vec::new();
    for _ in 0..20 {
        e.clock.advance(S);
        let ids = expired_ids(&e.le, usize::MAX);
        per_second.push(ids.len());
        for id in ids {
            e.revoke(id).unwrap();
        }
    }
    assert!(per_second.iter().all(|n| *n <= 1000), "{per_second:?}");
    assert_eq!(per_second.iter().sum::<usize>(), 2000, "{per_second:?}");
    assert!(per_second[..9].iter().all(|n| *n == 0), "{per_second:?}");
}

#[test]
fn test_lessor_recover() {
    let e = env();
    e.grant(1, 10).unwrap();
    e.grant(2, 20).unwrap();
    e.put("a", 1);
    e.put("b", 2);
    e.put("c", 0);
    let le2 = Lessor::new(
        LessorConfig {
            min_lease_ttl: 2,
            ..Default::default()
        },
        e.clock.clone(),
    );
    le2.recover(&e.kv).unwrap();
    assert_eq!(le2.lookup(1).unwrap().keys, vec![b"a".to_vec()]);
    assert_eq!(le2.lookup(2).unwrap().keys, vec![b"b".to_vec()]);
    assert_eq!(le2.lookup(2).unwrap().ttl, 20);
    le2.promote(Duration::ZERO);
    assert_eq!(le2.lookup(1).unwrap().remaining_secs, 10);
}

#[test]
fn test_lessor_checkpoint() {
    let e = env_with(LessorConfig {
        min_lease_ttl: 2,
        checkpoint_interval: Some(10 * S),
        ..Default::default()
    });
    e.le.promote(Duration::ZERO);
    e.grant(1, 100).unwrap();
    e.grant(2, 5).unwrap(); // shorter than the interval: never checkpointed
    e.clock.advance(9 * S);
    assert!(e.le.find_due_checkpoints(10).is_empty());
    e.clock.advance(S);
    let cps = e.le.find_due_checkpoints(10);
    assert_eq!(cps.len(), 1);
    assert_eq!((cps[0].id, cps[0].remaining_ttl), (1, 90));
    let b = e.kv.begin_batch().unwrap();
    e.le.checkpoint(b.backend_txn().unwrap(), 1, 90).unwrap();
    b.commit(false).unwrap();
    // a restarted (or newly elected) lessor resumes from the checkpoint
    let le2 = Lessor::new(LessorConfig::default(), e.clock.clone());
    le2.recover(&e.kv).unwrap();
    le2.promote(Duration::ZERO);
    let l = le2.lookup(1).unwrap();
    assert_eq!((l.ttl, l.remaining_ttl, l.remaining_secs), (100, 90, 90));
    // a renew clears the checkpoint
    let r = le2.renew(1).unwrap();
    assert_eq!(r.ttl, 100);
    assert!(!r.clear_checkpoint, "le2 has checkpoints disabled");
    assert!(e.le.renew(1).unwrap().clear_checkpoint);
    let cps = e.le.find_due_checkpoints(10);
    assert_eq!(
        (cps[0].id, cps[0].remaining_ttl),
        (1, 0),
        "proposed to every member"
    );
}
