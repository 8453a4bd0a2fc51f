//! Store tests, named after etcd's kv_test.go and kvstore_test.go.

use std::sync::Arc;

use retcd_api::etcdserverpb::range_request::{SortOrder, SortTarget};
use retcd_api::etcdserverpb::{
    compare, request_op, response_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest,
    RequestOp, TxnRequest,
};
use retcd_api::mvccpb::{event::EventType, KeyValue};
use retcd_storage::backend::Backend;

use crate::{KvStore, MvccError, NoLeases};

pub(crate) struct TestStore {
    pub dir: tempfile::TempDir,
    pub store: Arc<KvStore>,
}

pub(crate) fn new_store() -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
    TestStore {
        store: Arc::new(KvStore::open(backend).unwrap()),
        dir,
    }
}

pub(crate) fn reopen(t: TestStore) -> TestStore {
    let TestStore { dir, store } = t;
    drop(store);
    let backend = Arc::new(Backend::open(&dir.path().join("db")).unwrap());
    TestStore {
        store: Arc::new(KvStore::open(backend).unwrap()),
        dir,
    }
}

pub(crate) fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    }
}

pub(crate) fn put(s: &KvStore, k: &str, v: &str) -> i64 {
    let mut b = s.begin_batch().unwrap();
    let r = b.put(&put_req(k, v), &NoLeases).unwrap();
    b.commit(false).unwrap();
    r.header.unwrap().revision
}

pub(crate) fn del(s: &KvStore, k: &str, end: &str) -> (i64, i64) {
    let mut b = s.begin_batch().unwrap();
    let r = b
        .delete_range(&DeleteRangeRequest {
            key: k.into(),
            range_end: end.into(),
            prev_kv: false,
        })
        .unwrap();
    b.commit(false).unwrap();
    (r.deleted, r.header.unwrap().revision)
}

/// Compacts at `rev` and waits until its rows are deleted (physical).
pub(crate) fn compact(s: &KvStore, rev: i64) -> Result<(), MvccError> {
    let mut b = s.begin_batch()?;
    b.compact(rev, true)?;
    b.commit(false)?;
    assert!(
        s.wait_compacted_blocking(rev, std::time::Duration::from_secs(30)),
        "compaction at {rev} did not finish"
    );
    Ok(())
}

pub(crate) fn rng(k: &str, end: &str) -> RangeRequest {
    RangeRequest {
        key: k.into(),
        range_end: end.into(),
        ..Default::default()
    }
}

fn kv(k: &str, v: &str, create: i64, modr: i64, ver: i64) -> KeyValue {
    KeyValue {
        key: k.as_bytes().to_vec().into(),
        value: v.as_bytes().to_vec().into(),
        create_revision: create,
        mod_revision: modr,
        version: ver,
        lease: 0,
    }
}

/// foo=bar at 2, foo1=bar1 at 3, foo2=bar2 at 4 (etcd's put3TestKVs).
fn put3(s: &KvStore) -> Vec<KeyValue> {
    put(s, "foo", "bar");
    put(s, "foo1", "bar1");
    put(s, "foo2", "bar2");
    vec![
        kv("foo", "bar", 2, 2, 1),
        kv("foo1", "bar1", 3, 3, 1),
        kv("foo2", "bar2", 4, 4, 1),
    ]
}

fn keys(r: &retcd_api::etcdserverpb::RangeResponse) -> Vec<String> {
    r.kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.to_vec()).unwrap())
        .collect()
}

#[test]
fn test_store_rev() {
    let t = new_store();
    assert_eq!(
        t.store.current_revision(),
        1,
        "an empty store is at revision 1"
    );
    for i in 1..=3 {
        assert_eq!(put(&t.store, "foo", "bar"), i + 1);
        assert_eq!(t.store.current_revision(), i + 1);
    }
}

#[test]
fn test_kv_range() {
    let t = new_store();
    let kvs = put3(&t.store);
    let cases: Vec<(&str, &str, Vec<KeyValue>)> = vec![
        ("foo", "", kvs[..1].to_vec()),
        ("foo", "foo1", kvs[..1].to_vec()),
        ("foo", "foo3", kvs.clone()),
        ("foo", "\0", kvs.clone()),
        ("foo1", "\0", kvs[1..].to_vec()),
        ("\0", "\0", kvs.clone()),
        ("foo3", "foo8", vec![]),
        ("foo3", "foo", vec![]),
    ];
    for (k, end, want) in cases {
        let r = t.store.range(&rng(k, end)).unwrap();
        assert_eq!(r.kvs, want, "range {k:?}..{end:?}");
        assert_eq!(r.count, want.len() as i64);
        assert_eq!(r.header.unwrap().revision, 4);
        assert!(!r.more);
    }
}

#[test]
fn test_kv_range_rev() {
    let t = new_store();
    let kvs = put3(&t.store);
    let cases = [
        (-1, 4, kvs.clone()),
        (0, 4, kvs.clone()),
        (2, 4, kvs[..1].to_vec()),
        (3, 4, kvs[..2].to_vec()),
        (4, 4, kvs.clone()),
    ];
    for (rev, wrev, want) in cases {
        let r = t
            .store
            .range(&RangeRequest {
                revision: rev,
                ..rng("foo", "foo3")
            })
            .unwrap();
        assert_eq!(r.kvs, want, "rev {rev}");
        assert_eq!(r.header.unwrap().revision, wrev);
    }
}

#[test]
fn test_kv_range_bad_rev() {
    let t = new_store();
    put3(&t.store);
    compact(&t.store, 4).unwrap();
    let cases = [
        (-1, Ok(())),
        (0, Ok(())),
        (1, Err(MvccError::Compacted)),
        (2, Err(MvccError::Compacted)),
        (4, Ok(())),
        (5, Err(MvccError::FutureRev)),
        (100, Err(MvccError::FutureRev)),
    ];
    for (rev, want) in cases {
        let got = t
            .store
            .range(&RangeRequest {
                revision: rev,
                ..rng("foo", "foo3")
            })
            .map(|_| ());
        assert_eq!(got, want, "rev {rev}");
    }
}

#[test]
fn test_kv_range_limit() {
    let t = new_store();
    let kvs = put3(&t.store);
    let cases = [
        (-1, kvs.clone(), false),
        (0, kvs.clone(), false),
        (1, kvs[..1].to_vec(), true),
        (2, kvs[..2].to_vec(), true),
        (3, kvs.clone(), false),
        (100, kvs.clone(), false),
    ];
    for (limit, want, more) in cases {
        let r = t
            .store
            .range(&RangeRequest {
                limit,
                ..rng("foo", "foo3")
            })
            .unwrap();
        assert_eq!(r.kvs, want, "limit {limit}");
        assert_eq!(r.count, 3, "count is the total before the limit");
        assert_eq!(r.more, more, "limit {limit}");
    }
}

#[test]
fn test_kv_range_options() {
    let t = new_store();
    put3(&t.store);
    put(&t.store, "foo1", "a"); // 5: foo1 version 2, smallest value
    let all = rng("foo", "foo3");
    // keys_only / count_only
    let r = t
        .store
        .range(&RangeRequest {
            keys_only: true,
            ..all.clone()
        })
        .unwrap();
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));
    assert_eq!(keys(&r), ["foo", "foo1", "foo2"]);
    let r = t
        .store
        .range(&RangeRequest {
            count_only: true,
            ..all.clone()
        })
        .unwrap();
    assert!(r.kvs.is_empty());
    assert_eq!(r.count, 3);
    // sorting
    let sorted = |order: SortOrder, target: SortTarget, limit: i64| {
        let r = t
            .store
            .range(&RangeRequest {
                sort_order: order as i32,
                sort_target: target as i32,
                limit,
                ..all.clone()
            })
            .unwrap();
        (keys(&r), r.more)
    };
    assert_eq!(
        sorted(SortOrder::Descend, SortTarget::Key, 0).0,
        ["foo2", "foo1", "foo"]
    );
    assert_eq!(
        sorted(SortOrder::Descend, SortTarget::Key, 2),
        (vec!["foo2".to_string(), "foo1".into()], true)
    );
    assert_eq!(
        sorted(SortOrder::Ascend, SortTarget::Mod, 0).0,
        ["foo", "foo2", "foo1"]
    );
    assert_eq!(
        sorted(SortOrder::Descend, SortTarget::Mod, 1),
        (vec!["foo1".to_string()], true)
    );
    assert_eq!(
        sorted(SortOrder::Descend, SortTarget::Version, 1).0,
        ["foo1"]
    );
    assert_eq!(
        sorted(SortOrder::Ascend, SortTarget::Value, 0).0,
        ["foo1", "foo", "foo2"]
    );
    assert_eq!(
        sorted(SortOrder::Descend, SortTarget::Create, 0).0,
        ["foo2", "foo1", "foo"]
    );
    // NONE with a non-KEY target sorts ascending, but fetches only limit+1 first
    assert_eq!(
        sorted(SortOrder::None, SortTarget::Mod, 0).0,
        ["foo", "foo2", "foo1"]
    );
    assert_eq!(
        sorted(SortOrder::None, SortTarget::Mod, 1),
        (vec!["foo".to_string()], true)
    );
    // revision filters apply after the fetch; count is not filtered
    let r = t
        .store
        .range(&RangeRequest {
            min_mod_revision: 4,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(
        (keys(&r), r.count),
        (vec!["foo1".to_string(), "foo2".into()], 3)
    );
    let r = t
        .store
        .range(&RangeRequest {
            max_mod_revision: 3,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(keys(&r), ["foo"]);
    let r = t
        .store
        .range(&RangeRequest {
            min_create_revision: 3,
            max_create_revision: 3,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(keys(&r), ["foo1"]);
    let r = t
        .store
        .range(&RangeRequest {
            min_mod_revision: 3,
            limit: 1,
            ..all.clone()
        })
        .unwrap();
    assert_eq!(
        (keys(&r), r.more, r.count),
        (vec!["foo1".to_string()], true, 3)
    );
}

#[test]
fn test_kv_put_multiple_times() {
    let t = new_store();
    for i in 0..10 {
        let base = i + 1;
        let rev = put(&t.store, "foo", &format!("bar{i}"));
        assert_eq!(rev, base + 1);
        let r = t.store.range(&rng("foo", "")).unwrap();
        assert_eq!(
            r.kvs,
            vec![kv("foo", &format!("bar{i}"), 2, base + 1, base)]
        );
    }
}

#[test]
fn test_kv_delete_range() {
    let cases: [(&str, &str, i64, i64); 6] = [
        ("foo", "", 5, 1),
        ("foo", "foo1", 5, 1),
        ("foo", "foo2", 5, 2),
        ("foo", "foo3", 5, 3),
        ("foo3", "foo8", 4, 0),
        ("foo3", "", 4, 0),
    ];
    for (k, end, wrev, wn) in cases {
        let t = new_store();
        put3(&t.store);
        assert_eq!(del(&t.store, k, end), (wn, wrev), "delete {k:?}..{end:?}");
        assert_eq!(t.store.current_revision(), wrev);
    }
}

#[test]
fn test_kv_delete_multiple_times() {
    let t = new_store();
    put(&t.store, "foo", "bar");
    assert_eq!(del(&t.store, "foo", ""), (1, 3));
    for _ in 0..10 {
        assert_eq!(del(&t.store, "foo", ""), (0, 3));
    }
}

#[test]
fn test_kv_put_with_options() {
    let t = new_store();
    let leases = |id: i64| id == 7;
    let mut b = t.store.begin_batch().unwrap();
    assert_eq!(
        b.put(
            &PutRequest {
                lease: 8,
                ..put_req("foo", "bar")
            },
            &leases
        )
        .unwrap_err(),
        MvccError::LeaseNotFound
    );
    assert_eq!(
        b.put(
            &PutRequest {
                ignore_value: true,
                ..put_req("foo", "")
            },
            &leases
        )
        .unwrap_err(),
        MvccError::KeyNotFound
    );
    assert_eq!(
        b.put(
            &PutRequest {
                ignore_value: true,
                ..put_req("foo", "x")
            },
            &leases
        )
        .unwrap_err(),
        MvccError::ValueProvided
    );
    assert_eq!(
        b.put(
            &PutRequest {
                ignore_lease: true,
                lease: 7,
                ..put_req("foo", "x")
            },
            &leases
        )
        .unwrap_err(),
        MvccError::LeaseProvided
    );
    assert_eq!(b.revision(), 1, "failed puts do not bump the revision");
    let r = b
        .put(
            &PutRequest {
                lease: 7,
                prev_kv: true,
                ..put_req("foo", "bar")
            },
            &leases,
        )
        .unwrap();
    assert_eq!((r.header.unwrap().revision, r.prev_kv), (2, None));
    let r = b
        .put(
            &PutRequest {
                ignore_value: true,
                prev_kv: true,
                lease: 7,
                ..put_req("foo", "")
            },
            &leases,
        )
        .unwrap();
    assert_eq!(
        r.prev_kv,
        Some(KeyValue {
            lease: 7,
            ..kv("foo", "bar", 2, 2, 1)
        })
    );
    assert_eq!(
        b.range(&rng("foo", "")).unwrap().kvs[0].value,
        &b"bar"[..],
        "ignore_value keeps the value"
    );
    let r = b
        .put(
            &PutRequest {
                ignore_lease: true,
                ..put_req("foo", "baz")
            },
            &leases,
        )
        .unwrap();
    assert_eq!(r.header.unwrap().revision, 4);
    b.commit(false).unwrap();
    let r = t.store.range(&rng("foo", "")).unwrap();
    assert_eq!(
        r.kvs,
        vec![KeyValue {
            lease: 7,
            ..kv("foo", "baz", 2, 4, 3)
        }]
    );
}

#[test]
fn test_kv_operation_in_sequence() {
    let t = new_store();
    for i in 0..10i64 {
        let base = i * 2 + 1;
        assert_eq!(put(&t.store, "foo", "bar"), base + 1);
        let r = t
            .store
            .range(&RangeRequest {
                revision: base + 1,
                ..rng("foo", "")
            })
            .unwrap();
        assert_eq!(r.kvs, vec![kv("foo", "bar", base + 1, base + 1, 1)]);
        assert_eq!(del(&t.store, "foo", ""), (1, base + 2));
        let r = t
            .store
            .range(&RangeRequest {
                revision: base + 2,
                ..rng("foo", "")
            })
            .unwrap();
        assert!(r.kvs.is_empty());
    }
}

#[test]
fn test_kv_reads_see_only_committed_data() {
    let t = new_store();
    put(&t.store, "foo", "bar");
    let mut b = t.store.begin_batch().unwrap();
    b.put(&put_req("foo", "baz"), &NoLeases).unwrap();
    b.put(&put_req("zoo", "x"), &NoLeases).unwrap();
    b.delete_range(&DeleteRangeRequest {
        key: "foo".into(),
        ..Default::default()
    })
    .unwrap();
    // a concurrent reader sees rev 2 only
    let store = t.store.clone();
    let seen = std::thread::spawn(move || store.range(&rng("\0", "\0")).unwrap())
        .join()
        .unwrap();
    assert_eq!(seen.kvs, vec![kv("foo", "bar", 2, 2, 1)]);
    assert_eq!(seen.header.unwrap().revision, 2);
    // the batch sees its own writes
    assert_eq!(keys(&b.range(&rng("\0", "\0")).unwrap()), ["zoo"]);
    b.commit(false).unwrap();
    assert_eq!(t.store.current_revision(), 5);
    assert_eq!(keys(&t.store.range(&rng("\0", "\0")).unwrap()), ["zoo"]);
}

#[test]
fn test_kv_batch_dropped_without_commit_leaves_no_trace() {
    let t = new_store();
    put(&t.store, "foo", "bar");
    {
        let mut b = t.store.begin_batch().unwrap();
        b.put(&put_req("foo", "baz"), &NoLeases).unwrap();
        b.delete_range(&DeleteRangeRequest {
            key: "foo".into(),
            ..Default::default()
        })
        .unwrap();
        b.compact(2, true).unwrap();
    }
    assert_eq!(t.store.current_revision(), 2);
    assert_eq!(t.store.compact_revision(), 0);
    assert_eq!(put(&t.store, "foo", "qux"), 3);
    let r = t.store.range(&rng("foo", "")).unwrap();
    assert_eq!(r.kvs, vec![kv("foo", "qux", 2, 3, 2)]);
}

fn cmp(
    key: &str,
    target: compare::CompareTarget,
    result: compare::CompareResult,
    tu: compare::TargetUnion,
) -> Compare {
    Compare {
        key: key.into(),
        range_end: vec![],
        target: target as i32,
        result: result as i32,
        target_union: Some(tu),
    }
}

fn op_put(k: &str, v: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(put_req(k, v))),
    }
}
fn op_range(k: &str, end: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(rng(k, end))),
    }
}
fn op_del(k: &str, end: &str) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: k.into(),
                range_end: end.into(),
                prev_kv: true,
            },
        )),
    }
}

#[test]
fn test_kv_txn_operation_in_sequence() {
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let t = new_store();
    put(&t.store, "foo", "bar"); // 2
    let mut b = t.store.begin_batch().unwrap();
    let txn = TxnRequest {
        compare: vec![cmp("foo", T::Version, R::Equal, U::Version(1))],
        success: vec![
            op_put("a", "1"),
            op_put("a", "2"),
            op_del("foo", ""),
            op_range("\0", "\0"),
        ],
        failure: vec![],
    };
    let r = b.txn(&txn, &NoLeases).unwrap();
    assert!(r.succeeded);
    assert_eq!(r.header.unwrap().revision, 3);
    let Some(response_op::Response::ResponsePut(p)) = &r.responses[1].response else {
        panic!()
    };
    assert_eq!(p.header.unwrap().revision, 3);
    let Some(response_op::Response::ResponseDeleteRange(d)) = &r.responses[2].response else {
        panic!()
    };
    assert_eq!(
        (d.deleted, d.prev_kvs.clone()),
        (1, vec![kv("foo", "bar", 2, 2, 1)])
    );
    let Some(response_op::Response::ResponseRange(rr)) = &r.responses[3].response else {
        panic!()
    };
    assert_eq!(
        rr.kvs,
        vec![kv("a", "2", 3, 3, 2)],
        "a range in the txn sees its earlier ops"
    );
    assert_eq!(rr.header.unwrap().revision, 3);
    let ev = b.take_events();
    assert_eq!(ev.len(), 3);
    assert!(ev.iter().all(|(rev, _)| *rev == 3));
    assert_eq!(ev[2].1.r#type, EventType::Delete as i32);
    assert_eq!(
        ev[2].1.kv,
        Some(KeyValue {
            key: "foo".into(),
            mod_revision: 3,
            ..Default::default()
        })
    );
    assert_eq!(ev[2].1.prev_kv, Some(kv("foo", "bar", 2, 2, 1)));
    // an overwrite reads the value it replaces only when the request or a
    // prev_kv watcher wants it (see watchable_store_test)
    assert_eq!(ev[1].1.prev_kv, None);
    // compare fails -> failure branch; read-only -> no revision bump
    let r = b
        .txn(
            &TxnRequest {
                compare: vec![cmp("foo", T::Version, R::Equal, U::Version(1))],
                success: vec![op_put("x", "")],
                failure: vec![op_range("a", "")],
            },
            &NoLeases,
        )
        .unwrap();
    assert!(!r.succeeded);
    assert_eq!(r.header.unwrap().revision, 3);
    b.commit(true).unwrap();
    assert_eq!(t.store.current_revision(), 3);
}

#[test]
fn test_kv_txn_compares() {
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let t = new_store();
    put3(&t.store);
    let mut b = t.store.begin_batch().unwrap();
    let mut check = |c: Compare, want: bool| {
        let r = b
            .txn(
                &TxnRequest {
                    compare: vec![c.clone()],
                    success: vec![],
                    failure: vec![],
                },
                &NoLeases,
            )
            .unwrap();
        assert_eq!(r.succeeded, want, "{c:?}");
    };
    check(cmp("foo", T::Value, R::Equal, U::Value("bar".into())), true);
    check(
        cmp("foo", T::Value, R::Greater, U::Value("baa".into())),
        true,
    );
    check(cmp("foo", T::Value, R::Less, U::Value("baa".into())), false);
    check(
        cmp("nokey", T::Value, R::NotEqual, U::Value("x".into())),
        false,
    );
    check(cmp("nokey", T::Version, R::Equal, U::Version(0)), true);
    check(
        cmp("nokey", T::Create, R::Equal, U::CreateRevision(0)),
        true,
    );
    check(cmp("foo1", T::Create, R::Equal, U::CreateRevision(3)), true);
    check(cmp("foo1", T::Mod, R::Greater, U::ModRevision(2)), true);
    check(cmp("foo1", T::Lease, R::Equal, U::Lease(0)), true);
    check(cmp("foo1", T::Lease, R::NotEqual, U::Lease(0)), false);
    let mut ranged = cmp("foo", T::Create, R::Greater, U::CreateRevision(1));
    ranged.range_end = "foo3".into();
    check(ranged.clone(), true);
    ranged.target_union = Some(U::CreateRevision(2));
    check(ranged, false);
}

#[test]
fn test_kv_txn_compares_from_the_index_see_the_batch_and_deletes() {
    // version, create and mod compares of one key are answered from the
    // index: they must see what a range would, the batch's own writes and
    // deletes included
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    fn assert_holds(b: &mut crate::kvstore_txn::WriteBatch<'_>, cases: &[(Compare, bool)]) {
        for (c, want) in cases {
            let req = TxnRequest {
                compare: vec![c.clone()],
                ..Default::default()
            };
            let got = b.txn(&req, &NoLeases).unwrap().succeeded;
            assert_eq!(got, *want, "{c:?}");
        }
    }
    let t = new_store();
    put3(&t.store); // foo1 created at 3
    let mut b = t.store.begin_batch().unwrap();
    let again = b.put(&put_req("foo1", "again"), &NoLeases).unwrap();
    let rev = again.header.unwrap().revision;
    assert_holds(
        &mut b,
        &[
            (cmp("foo1", T::Version, R::Equal, U::Version(2)), true),
            (cmp("foo1", T::Mod, R::Equal, U::ModRevision(rev)), true),
            (cmp("foo1", T::Create, R::Equal, U::CreateRevision(3)), true),
            (cmp("foo1", T::Mod, R::Less, U::ModRevision(rev)), false),
        ],
    );
    b.delete_range(&DeleteRangeRequest {
        key: "foo2".into(),
        ..Default::default()
    })
    .unwrap();
    assert_holds(
        &mut b,
        &[
            (cmp("foo2", T::Version, R::Equal, U::Version(0)), true),
            (cmp("foo2", T::Mod, R::Equal, U::ModRevision(0)), true),
            (cmp("foo2", T::Create, R::Equal, U::CreateRevision(0)), true),
        ],
    );
    // put again: a new generation
    let back = b.put(&put_req("foo2", "back"), &NoLeases).unwrap();
    let rev = back.header.unwrap().revision;
    // the same answers as the range path gives (a range_end makes it read
    // rows)
    let mut ranged = cmp("foo2", T::Version, R::Equal, U::Version(1));
    ranged.range_end = "foo3".into();
    assert_holds(
        &mut b,
        &[
            (cmp("foo2", T::Version, R::Equal, U::Version(1)), true),
            (
                cmp("foo2", T::Create, R::Equal, U::CreateRevision(rev)),
                true,
            ),
            (cmp("foo2", T::Mod, R::Equal, U::ModRevision(rev)), true),
            (ranged, true),
        ],
    );
}

#[test]
fn test_kv_txn_failing_check_leaves_no_trace() {
    let t = new_store();
    put3(&t.store);
    let mut b = t.store.begin_batch().unwrap();
    let leased = RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            lease: 9,
            ..put_req("x", "")
        })),
    };
    let future = RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            revision: 9,
            ..rng("foo", "")
        })),
    };
    let ignore = RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            ignore_value: true,
            ..put_req("foo", "")
        })),
    };
    let cases = vec![
        (
            vec![op_put("x", ""), leased.clone()],
            MvccError::LeaseNotFound,
        ),
        (vec![op_put("x", ""), future.clone()], MvccError::FutureRev),
        (vec![future, leased], MvccError::LeaseNotFound),
        (
            vec![op_del("foo", ""), ignore.clone()],
            MvccError::KeyNotFound,
        ),
        (
            vec![
                op_put("x", ""),
                RequestOp {
                    request: Some(request_op::Request::RequestTxn(TxnRequest {
                        compare: vec![],
                        success: vec![op_put("y", "")],
                        failure: vec![ignore.clone()],
                    })),
                },
            ],
            MvccError::ValueProvided,
        ),
    ];
    for (success, want) in cases {
        let mut txn = TxnRequest {
            compare: vec![],
            success,
            failure: vec![],
        };
        if want == MvccError::ValueProvided {
            if let Some(request_op::Request::RequestTxn(n)) = &mut txn.success[1].request {
                if let Some(request_op::Request::RequestPut(p)) = &mut n.failure[0].request {
                    p.value = b"v".to_vec();
                }
            }
        }
        assert_eq!(b.txn(&txn, &NoLeases).unwrap_err(), want);
        assert_eq!(b.revision(), 4);
        assert!(b.take_events().is_empty());
    }
    b.commit(false).unwrap();
    assert_eq!(
        keys(&t.store.range(&rng("\0", "\0")).unwrap()),
        ["foo", "foo1", "foo2"]
    );
}

#[test]
fn test_kv_txn_nested() {
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let t = new_store();
    put(&t.store, "foo", "bar"); // 2
    let inner = TxnRequest {
        // evaluated before the outer txn's ops: foo still has version 1
        compare: vec![cmp("foo", T::Version, R::Equal, U::Version(1))],
        success: vec![op_put("in", "yes")],
        failure: vec![op_put("in", "no")],
    };
    let outer = TxnRequest {
        compare: vec![],
        success: vec![
            op_put("foo", "bar2"),
            RequestOp {
                request: Some(request_op::Request::RequestTxn(inner)),
            },
        ],
        failure: vec![],
    };
    let mut b = t.store.begin_batch().unwrap();
    let r = b.txn(&outer, &NoLeases).unwrap();
    assert_eq!(r.header.unwrap().revision, 3);
    let Some(response_op::Response::ResponseTxn(n)) = &r.responses[1].response else {
        panic!()
    };
    assert!(n.succeeded);
    assert_eq!(
        n.header.unwrap().revision,
        0,
        "nested txn headers are empty in etcd"
    );
    b.commit(false).unwrap();
    let r = t.store.range(&rng("in", "")).unwrap();
    assert_eq!(
        r.kvs,
        vec![KeyValue {
            key: "in".into(),
            value: "yes".into(),
            create_revision: 3,
            mod_revision: 3,
            version: 1,
            lease: 0
        }]
    );
    let r = t.store.range(&rng("foo", "")).unwrap();
    assert_eq!(r.kvs[0].mod_revision, 3);
}

#[test]
fn test_kv_compact_reserve_last_value() {
    let t = new_store();
    put(&t.store, "foo", "bar0"); // 2
    put(&t.store, "foo", "bar1"); // 3
    del(&t.store, "foo", ""); // 4
    put(&t.store, "foo", "bar2"); // 5
    let cases: [(i64, Vec<KeyValue>); 4] = [
        (1, vec![kv("foo", "bar0", 2, 2, 1)]),
        (2, vec![kv("foo", "bar1", 2, 3, 2)]),
        (3, vec![]),
        (4, vec![kv("foo", "bar2", 5, 5, 1)]),
    ];
    for (rev, want) in cases {
        compact(&t.store, rev).unwrap();
        let r = t
            .store
            .range(&RangeRequest {
                revision: rev + 1,
                ..rng("foo", "")
            })
            .unwrap();
        assert_eq!(r.kvs, want, "compact {rev}");
    }
}

#[test]
fn test_kv_compact_bad() {
    let t = new_store();
    put(&t.store, "foo", "bar0");
    put(&t.store, "foo", "bar1");
    put(&t.store, "foo", "bar2");
    let cases = [
        (0, Ok(())),
        (1, Ok(())),
        (1, Err(MvccError::Compacted)),
        (4, Ok(())),
        (5, Err(MvccError::FutureRev)),
        (100, Err(MvccError::FutureRev)),
    ];
    for (rev, want) in cases {
        assert_eq!(compact(&t.store, rev), want, "compact {rev}");
    }
    assert_eq!(
        MvccError::Compacted.to_string(),
        "mvcc: required revision has been compacted"
    );
    assert_eq!(
        MvccError::FutureRev.to_string(),
        "mvcc: required revision is a future revision"
    );
}

#[test]
fn test_store_compact_removes_revisions() {
    let t = new_store();
    put(&t.store, "a", "1"); // 2
    put(&t.store, "b", "1"); // 3
    put(&t.store, "a", "2"); // 4
    del(&t.store, "a", ""); // 5
    assert_eq!(t.store.revision_count().unwrap(), 4);
    compact(&t.store, 4).unwrap();
    assert_eq!(
        t.store.revision_count().unwrap(),
        3,
        "2 is gone; 3, 4 and the tombstone at 5 stay"
    );
    compact(&t.store, 5).unwrap();
    assert_eq!(
        t.store.revision_count().unwrap(),
        2,
        "b@3 and the tombstone at the compaction revision are left (etcd 3.5.16+)"
    );
    assert_eq!(t.store.compact_revision(), 5);
    assert_eq!(
        t.store
            .range(&RangeRequest {
                revision: 4,
                ..rng("a", "")
            })
            .unwrap_err(),
        MvccError::Compacted
    );
}

#[test]
fn test_kv_hash() {
    let mut hashes = Vec::new();
    for _ in 0..3 {
        let t = new_store();
        put(&t.store, "foo0", "bar0");
        put(&t.store, "foo1", "bar0");
        hashes.push(t.store.hash().unwrap());
    }
    assert!(hashes.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn test_hash_kv_zero_revision() {
    let t = new_store();
    for i in 2..=10 {
        put(&t.store, "foo", &format!("bar{i}"));
    }
    compact(&t.store, 5).unwrap();
    let (h0, c0, r0) = t.store.hash_kv(0).unwrap();
    let (h1, c1, r1) = t.store.hash_kv(10).unwrap();
    assert_eq!((h0, c0, r0), (h1, c1, r1));
    assert_eq!((c0, r0), (5, 10));
    assert_eq!(t.store.hash_kv(5).unwrap_err(), MvccError::Compacted);
    assert_eq!(t.store.hash_kv(11).unwrap_err(), MvccError::FutureRev);
}

#[test]
fn test_hash_kv_when_compacting() {
    // The hash at a revision depends on the compaction revision only, not on
    // the compactions that led there nor on whether old revisions are gone.
    let write = |s: &KvStore| {
        for i in 0..20 {
            put(s, &format!("foo{}", i % 4), &format!("bar{i}"));
        }
    };
    let (a, b) = (new_store(), new_store());
    write(&a.store);
    write(&b.store);
    for c in [5, 10, 15, 20] {
        compact(&a.store, c).unwrap();
    }
    compact(&b.store, 20).unwrap();
    let (h, cr, hr) = a.store.hash_kv(21).unwrap();
    assert_eq!((cr, hr), (20, 21));
    assert_eq!(b.store.hash_kv(21).unwrap(), (h, cr, hr));
    assert_eq!(a.store.hash().unwrap(), b.store.hash().unwrap());
}

#[test]
fn test_kv_restore() {
    let t = new_store();
    put3(&t.store);
    del(&t.store, "foo1", ""); // 5
    put(&t.store, "foo", "again"); // 6
    compact(&t.store, 5).unwrap();
    let mut b = t.store.begin_batch().unwrap();
    b.put(&put_req("foo2", "x"), &NoLeases).unwrap(); // 7
    b.set_consistent_index(42, 3);
    b.commit(true).unwrap();
    let before: Vec<_> = (5..=7)
        .map(|rev| {
            t.store
                .range(&RangeRequest {
                    revision: rev,
                    ..rng("\0", "\0")
                })
                .unwrap()
        })
        .collect();
    let (hash, hkv) = (t.store.hash().unwrap(), t.store.hash_kv(0).unwrap());
    let t = reopen(t);
    assert_eq!(t.store.current_revision(), 7);
    assert_eq!(t.store.compact_revision(), 5);
    assert_eq!(t.store.consistent_index(), 42);
    assert_eq!(t.store.term(), 3);
    let after: Vec<_> = (5..=7)
        .map(|rev| {
            t.store
                .range(&RangeRequest {
                    revision: rev,
                    ..rng("\0", "\0")
                })
                .unwrap()
        })
        .collect();
    assert_eq!(before, after);
    assert_eq!(
        (t.store.hash().unwrap(), t.store.hash_kv(0).unwrap()),
        (hash, hkv)
    );
    // the restored index continues versions and create revisions
    assert_eq!(put(&t.store, "foo2", "y"), 8);
    assert_eq!(
        t.store.range(&rng("foo2", "")).unwrap().kvs,
        vec![kv("foo2", "y", 4, 8, 3)]
    );
}

#[test]
fn test_restore_delete_and_compacted_to_empty() {
    let t = new_store();
    put(&t.store, "a", "1"); // 2
    del(&t.store, "a", ""); // 3
    compact(&t.store, 3).unwrap();
    let t = reopen(t);
    assert_eq!(
        t.store.current_revision(),
        3,
        "the revision never goes below the compaction"
    );
    assert_eq!(t.store.compact_revision(), 3);
    assert_eq!(put(&t.store, "a", "2"), 4);
    assert_eq!(
        t.store.range(&rng("a", "")).unwrap().kvs,
        vec![kv("a", "2", 4, 4, 1)]
    );
}

#[test]
fn test_kv_snapshot() {
    let t = new_store();
    put3(&t.store);
    del(&t.store, "foo", "");
    compact(&t.store, 3).unwrap();
    let mut b = t.store.begin_batch().unwrap();
    b.set_consistent_index(10, 2);
    b.commit(true).unwrap();
    let dump = t.store.dump().unwrap();
    let other = new_store();
    put(&other.store, "zzz", "gone after restore");
    other.store.restore_from(&dump).unwrap();
    assert_eq!(other.store.current_revision(), 5);
    assert_eq!(other.store.compact_revision(), 3);
    assert_eq!(other.store.consistent_index(), 10);
    assert_eq!(other.store.hash().unwrap(), t.store.hash().unwrap());
    assert_eq!(
        other.store.range(&rng("\0", "\0")).unwrap(),
        t.store.range(&rng("\0", "\0")).unwrap()
    );
    let mut bad = dump.clone();
    bad[12] ^= 1;
    assert!(matches!(
        other.store.restore_from(&bad),
        Err(MvccError::Backend(_))
    ));
    assert!(other.store.restore_from(b"junk").is_err());
}

#[test]
fn test_kv_store_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<KvStore>();
}

#[test]
fn test_concurrent_read_not_blocking_write_and_compaction() {
    // Readers run while batches put, delete and compact; a reader must never
    // miss a value its index view points to, and must only ever see
    // Compacted for revisions below the compaction.
    let t = new_store();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // both readers are running before the writes start (on a busy machine
    // they could otherwise not be scheduled before the writes are over)
    let started = Arc::new(std::sync::Barrier::new(3));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|n| {
            let (store, stop, started) = (t.store.clone(), stop.clone(), started.clone());
            let done = done.clone();
            std::thread::spawn(move || {
                let mut reads = 0;
                let mut first = true;
                while first || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let cur = store.current_revision();
                    let rev = if n == 0 { 0 } else { (cur - 3).max(1) };
                    match store.range(&RangeRequest {
                        revision: rev,
                        ..rng("\0", "\0")
                    }) {
                        Ok(r) => {
                            assert!(r.kvs.len() <= 5);
                            assert!(r
                                .kvs
                                .iter()
                                .all(|kv| kv.mod_revision <= r.header.unwrap().revision));
                            reads += 1;
                            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(MvccError::Compacted) => assert!(rev != 0),
                        Err(e) => panic!("reader: {e}"),
                    }
                    // the first pass read the empty store; now the writes start
                    if std::mem::take(&mut first) {
                        started.wait();
                    }
                }
                reads
            })
        })
        .collect();
    started.wait();
    for i in 0..300 {
        if i == 150 {
            // halfway, the readers have read while these writes ran
            let at = done.load(std::sync::atomic::Ordering::Relaxed);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while done.load(std::sync::atomic::Ordering::Relaxed) < at + 4 {
                assert!(std::time::Instant::now() < deadline, "the readers stalled");
                std::thread::yield_now();
            }
        }
        let mut b = t.store.begin_batch().unwrap();
        b.put(&put_req(&format!("k{}", i % 5), &i.to_string()), &NoLeases)
            .unwrap();
        if i % 7 == 0 {
            b.delete_range(&DeleteRangeRequest {
                key: format!("k{}", i % 5).into(),
                ..Default::default()
            })
            .unwrap();
        }
        if i % 10 == 9 {
            let rev = b.revision() - 1;
            b.compact(rev, true).unwrap();
        }
        b.commit(false).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

/// A read-only txn served from the committed state answers exactly what
/// the same txn answers inside a write batch.
#[test]
fn test_read_txn_matches_batch_txn() {
    use compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let t = new_store();
    put3(&t.store);
    let nested = TxnRequest {
        compare: vec![cmp("foo1", T::Version, R::Equal, U::Version(1))],
        success: vec![op_range("foo", "foo3")],
        failure: vec![op_range("foo1", "")],
    };
    let txns = vec![
        TxnRequest {
            compare: vec![cmp("foo", T::Value, R::Equal, U::Value("bar".into()))],
            success: vec![op_range("foo", ""), op_range("foo", "\0")],
            failure: vec![op_range("foo1", "")],
        },
        TxnRequest {
            compare: vec![cmp("nokey", T::Value, R::NotEqual, U::Value("x".into()))],
            success: vec![op_range("foo", "")],
            failure: vec![
                op_range("foo2", ""),
                RequestOp {
                    request: Some(request_op::Request::RequestTxn(nested)),
                },
            ],
        },
    ];
    assert!(!crate::is_txn_read_only(&TxnRequest {
        success: vec![op_put("a", "b")],
        ..Default::default()
    }));
    for txn in txns {
        assert!(crate::is_txn_read_only(&txn));
        let read = t.store.read_txn(&txn).unwrap();
        let mut b = t.store.begin_batch().unwrap();
        let applied = b.txn(&txn, &NoLeases).unwrap();
        drop(b);
        assert_eq!(read, applied, "{txn:?}");
    }
    // A range at a future revision fails the whole txn, as in a batch.
    let mut future = rng("foo", "");
    future.revision = 100;
    let txn = TxnRequest {
        success: vec![RequestOp {
            request: Some(request_op::Request::RequestRange(future)),
        }],
        ..Default::default()
    };
    assert_eq!(t.store.read_txn(&txn), Err(MvccError::FutureRev));
}

/// A Range in a Txn's chosen branch is checked before the txn runs, as
/// etcd's `checkRequestRange`: unlike a unary Range, a negative revision
/// is compacted once below the compaction (-1 reads the current revision
/// only while nothing was compacted). The read-only path and a write batch
/// answer alike, nested txns included.
#[test]
fn test_txn_range_revision_checked_as_etcd() {
    let t = new_store();
    let txn_at = |rev: i64, nested: bool| {
        let mut r = rng("foo", "");
        r.revision = rev;
        let mut op = RequestOp {
            request: Some(request_op::Request::RequestRange(r)),
        };
        if nested {
            op = RequestOp {
                request: Some(request_op::Request::RequestTxn(TxnRequest {
                    success: vec![op],
                    ..Default::default()
                })),
            };
        }
        TxnRequest {
            success: vec![op_range("foo", ""), op],
            ..Default::default()
        }
    };
    let check = |cases: &[(i64, Result<(), MvccError>)]| {
        for nested in [false, true] {
            for (rev, want) in cases {
                let txn = txn_at(*rev, nested);
                let read = t.store.read_txn(&txn).map(|_| ());
                assert_eq!(&read, want, "read-only, revision {rev}, nested {nested}");
                let mut b = t.store.begin_batch().unwrap();
                let applied = b.txn(&txn, &NoLeases).map(|_| ());
                drop(b);
                assert_eq!(
                    &applied, want,
                    "in a batch, revision {rev}, nested {nested}"
                );
            }
        }
    };
    put3(&t.store);
    // never compacted: the compaction revision is -1
    check(&[
        (-2, Err(MvccError::Compacted)),
        (-1, Ok(())),
        (0, Ok(())),
        (1, Ok(())),
        (4, Ok(())),
        (5, Err(MvccError::FutureRev)),
    ]);
    compact(&t.store, 3).unwrap();
    check(&[
        (i64::MIN, Err(MvccError::Compacted)),
        (-1, Err(MvccError::Compacted)),
        (0, Ok(())),
        (2, Err(MvccError::Compacted)),
        (3, Ok(())),
        (4, Ok(())),
        (5, Err(MvccError::FutureRev)),
    ]);
    // a unary Range still reads the current revision at -1
    let mut r = rng("foo", "");
    r.revision = -1;
    assert_eq!(t.store.range(&r).unwrap().header.unwrap().revision, 4);
}

/// With no sort order, a target other than KEY sorts ascending by it, as
/// etcd does: such a Range is not a plain one (the stored rows' order).
#[test]
fn test_unordered_range_by_another_target_is_sorted() {
    let t = new_store();
    put(&t.store, "k2", "a");
    put(&t.store, "k1", "b");
    for target in [
        SortTarget::Create,
        SortTarget::Mod,
        SortTarget::Version,
        SortTarget::Value,
    ] {
        let req = RangeRequest {
            sort_target: target as i32,
            sort_order: SortOrder::None as i32,
            ..rng("k", "l")
        };
        assert!(!crate::is_plain_range(&req), "{target:?}");
        let keys: Vec<_> = t
            .store
            .range(&req)
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        let want: Vec<Vec<u8>> = match target {
            // equal versions: stable, key order
            SortTarget::Version => vec![b"k1".to_vec(), b"k2".to_vec()],
            _ => vec![b"k2".to_vec(), b"k1".to_vec()],
        };
        assert_eq!(keys, want, "{target:?}");
    }
    for order in [SortOrder::None, SortOrder::Ascend] {
        assert!(crate::is_plain_range(&RangeRequest {
            sort_target: SortTarget::Key as i32,
            sort_order: order as i32,
            ..rng("k", "l")
        }));
    }
}

/// A plain Range written from its stored rows (`range_encoded`) is the
/// same message as the one `range` builds: same kvs bytes, more, count and
/// header revision, whatever the limit, revision or piece size; and it
/// keeps reading its own snapshot while later writes and a compaction run.
#[test]
fn test_range_encoded_is_ranges_answer() {
    use prost::Message;
    let t = new_store();
    for i in 0..40 {
        put(&t.store, &format!("k{i:02}"), &"v".repeat(i * 7));
    }
    put(&t.store, "k05", "again");
    del(&t.store, "k1", "k2");
    let at = t.store.current_revision();
    let reqs = [
        rng("k", "l"),
        rng("k05", ""),
        rng("nope", ""),
        rng("\0", ""),
        RangeRequest {
            limit: 7,
            ..rng("k", "l")
        },
        RangeRequest {
            limit: 100,
            ..rng("k", "l")
        },
        RangeRequest {
            revision: 30,
            ..rng("k", "l")
        },
        RangeRequest {
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Key as i32,
            ..rng("k2", "k3")
        },
    ];
    for req in reqs {
        assert!(crate::is_plain_range(&req));
        let want = t.store.range(&req).unwrap();
        // pieces of any size; rows all read again, some kept from the
        // sizing pass (the first ones within 100 bytes), all kept
        for (piece, read_once) in [1, 64, 1 << 20]
            .into_iter()
            .flat_map(|p| [0, 100, usize::MAX].map(|r| (p, r)))
        {
            let mut e = t.store.range_encoded(&req, read_once).unwrap();
            assert_eq!(e.len(), want.kvs.len());
            let mut kvs = Vec::new();
            loop {
                let target = kvs.len() + piece;
                if !e.write_kvs(&mut kvs, target).unwrap() {
                    break;
                }
            }
            assert_eq!(kvs.len(), e.kvs_len(), "{req:?}");
            let got = retcd_api::etcdserverpb::RangeResponse::decode(kvs.as_slice()).unwrap();
            assert_eq!(
                got.kvs, want.kvs,
                "{req:?} in pieces of {piece}, {read_once} bytes read once"
            );
            assert_eq!((e.more, e.count), (want.more, want.count), "{req:?}");
            assert_eq!(e.header_rev, want.header.as_ref().unwrap().revision);
        }
    }
    // sizes come from the index for keys read at their newest revision
    // (none read twice), and from the rows for older ones: at revision 30,
    // k05 (written again at 42) and k10..k19 (deleted at 43)
    let sized_by_reading = |store: &KvStore, revision| {
        let req = RangeRequest {
            revision,
            ..rng("k", "l")
        };
        store
            .range_encoded(&req, 0)
            .unwrap()
            .rows_sized_by_reading()
    };
    assert_eq!(sized_by_reading(&t.store, 0), 0);
    assert_eq!(sized_by_reading(&t.store, 30), 11);
    // the same after a restart: the index rebuilt from the rows knows them
    let t = reopen(t);
    assert_eq!(sized_by_reading(&t.store, 0), 0);
    assert_eq!(sized_by_reading(&t.store, 30), 11);
    for revision in [0, 30] {
        let req = RangeRequest {
            revision,
            ..rng("k", "l")
        };
        let want = t.store.range(&req).unwrap();
        let mut e = t.store.range_encoded(&req, 0).unwrap();
        let mut kvs = Vec::new();
        loop {
            let target = kvs.len() + 10;
            if !e.write_kvs(&mut kvs, target).unwrap() {
                break;
            }
        }
        let got = retcd_api::etcdserverpb::RangeResponse::decode(kvs.as_slice()).unwrap();
        assert_eq!(got.kvs, want.kvs, "after a restart, at {revision}");
    }
    // the snapshot is pinned: later writes and a compaction do not change
    // what a range already planned writes (read again after them, or some
    // kept from before them)
    for read_once in [0, 100] {
        let mut e = t.store.range_encoded(&rng("k", "l"), read_once).unwrap();
        let want = t.store.range(&rng("k", "l")).unwrap();
        put(&t.store, "k00", "changed");
        del(&t.store, "k3", "k4");
        compact(&t.store, t.store.current_revision()).unwrap();
        let mut kvs = Vec::new();
        while e.write_kvs(&mut kvs, usize::MAX).unwrap() {}
        let got = retcd_api::etcdserverpb::RangeResponse::decode(kvs.as_slice()).unwrap();
        assert_eq!(got.kvs, want.kvs);
        assert_eq!(e.header_rev, want.header.as_ref().unwrap().revision);
    }
    // the response bound applies before anything is read for the answer
    t.store.set_max_response_bytes(100);
    assert!(matches!(
        t.store.range_encoded(&rng("k", "l"), usize::MAX),
        Err(MvccError::ResponseTooLarge { max: 100, .. })
    ));
    assert!(t.store.range_encoded(&rng("k00", ""), 0).is_ok());
    // a compacted or future revision fails as Range does
    assert!(matches!(
        t.store.range_encoded(
            &RangeRequest {
                revision: 3,
                ..rng("k", "l")
            },
            0
        ),
        Err(MvccError::Compacted)
    ));
    assert!(matches!(
        t.store.range_encoded(
            &RangeRequest {
                revision: at + 100,
                ..rng("k", "l")
            },
            0
        ),
        Err(MvccError::FutureRev)
    ));
}

/// A key deleted and put again within one revision (a Txn whose from-key
/// delete covers the key it puts, as etcd allows), then compacted at that
/// revision: the key still reads, at the head and at the compaction
/// revision, and can be deleted (the compaction kept its row).
#[test]
fn test_compaction_at_a_revision_that_deleted_and_put_a_key_again() {
    let t = new_store();
    put(&t.store, "c", "x");
    let txn = TxnRequest {
        success: vec![
            RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(
                    DeleteRangeRequest {
                        key: b"a".to_vec(),
                        range_end: vec![0],
                        prev_kv: false,
                    },
                )),
            },
            op_put("c", "y"),
        ],
        ..Default::default()
    };
    let mut b = t.store.begin_batch().unwrap();
    let r = b.txn(&txn, &NoLeases).unwrap();
    b.commit(false).unwrap();
    assert_eq!(r.header.unwrap().revision, 3);
    compact(&t.store, 3).unwrap();
    let reads = |t: &TestStore| {
        for rev in [0, 3] {
            let got = t
                .store
                .range(&RangeRequest {
                    revision: rev,
                    ..rng("c", "")
                })
                .unwrap();
            assert_eq!(got.kvs, vec![kv("c", "y", 3, 3, 1)], "at {rev}");
        }
    };
    reads(&t);
    // and after a restart, from the rows the compaction left
    let t = reopen(t);
    reads(&t);
    assert_eq!(del(&t.store, "c", ""), (1, 4));
}
