//! Model-based property test: random batches of put / delete / txn /
//! compact / range against a BTreeMap model of the whole history.

use std::collections::BTreeMap;

use proptest::prelude::*;
use retcd_api::etcdserverpb::{
    compare, request_op, Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp,
    TxnRequest,
};
use retcd_api::mvccpb::KeyValue;

use crate::index::KeyRange;
use crate::kvstore_test::{new_store, reopen};
use crate::{MvccError, NoLeases, WriteBatch};

type State = BTreeMap<Vec<u8>, KeyValue>;

#[derive(Clone, Debug)]
enum ModelOp {
    Put(u8, u8),
    Delete(u8, u8),
    /// if version(key) == v { put a; delete b..c } else { put d }
    Txn {
        key: u8,
        version: i64,
        put: (u8, u8),
        del: (u8, u8),
        other: (u8, u8),
    },
    Compact(i64),
    Range {
        key: u8,
        end: u8,
        rev: i64,
        limit: i64,
    },
}

fn key(k: u8) -> Vec<u8> {
    vec![b'a' + k]
}

/// `end` 0 = single key, 1 = "\0" (from key), else key + end.
fn range_end(k: u8, end: u8) -> Vec<u8> {
    match end {
        0 => vec![],
        1 => vec![0],
        e => vec![b'a' + k + e - 1],
    }
}

struct Model {
    states: BTreeMap<i64, State>,
    rev: i64,
    compact: i64,
}

impl Model {
    fn new() -> Model {
        Model {
            states: BTreeMap::from([(1, State::new())]),
            rev: 1,
            compact: -1,
        }
    }
    fn cur(&self) -> &State {
        &self.states[&self.rev]
    }
    fn put(st: &mut State, k: Vec<u8>, v: Vec<u8>, rev: i64) {
        let (create, version) = st
            .get(&k)
            .map_or((rev, 1), |p| (p.create_revision, p.version + 1));
        st.insert(
            k.clone(),
            KeyValue {
                key: k.into(),
                value: v.into(),
                create_revision: create,
                mod_revision: rev,
                version,
                lease: 0,
            },
        );
    }
    fn delete(st: &mut State, k: &[u8], end: &[u8]) -> usize {
        let range = KeyRange::new(k, end);
        let before = st.len();
        st.retain(|key, _| !range.contains(key));
        before - st.len()
    }
    fn commit_state(&mut self, st: State, changed: bool) {
        if changed {
            self.rev += 1;
            self.states.insert(self.rev, st);
        }
    }
    fn range(
        &self,
        k: &[u8],
        end: &[u8],
        rev: i64,
        limit: i64,
    ) -> Result<(Vec<KeyValue>, i64, bool), MvccError> {
        if rev > self.rev {
            return Err(MvccError::FutureRev);
        }
        let at = if rev <= 0 { self.rev } else { rev };
        if at < self.compact {
            return Err(MvccError::Compacted);
        }
        let r = KeyRange::new(k, end);
        let all: Vec<KeyValue> = self.states[&at]
            .values()
            .filter(|kv| r.contains(&kv.key))
            .cloned()
            .collect();
        let count = all.len() as i64;
        let more = limit > 0 && all.len() as i64 > limit;
        let kvs = if limit > 0 {
            all.into_iter().take(limit as usize).collect()
        } else {
            all
        };
        Ok((kvs, count, more))
    }
}

fn op_strategy() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        4 => (0u8..5, 0u8..3).prop_map(|(k, v)| ModelOp::Put(k, v)),
        2 => (0u8..5, 0u8..4).prop_map(|(k, e)| ModelOp::Delete(k, e)),
        2 => (0u8..5, 0i64..3, (0u8..5, 0u8..3), (0u8..5, 0u8..3), (0u8..5, 0u8..3))
            .prop_map(|(key, version, put, del, other)| ModelOp::Txn { key, version, put, del, other }),
        1 => (0i64..40).prop_map(ModelOp::Compact),
        3 => (0u8..5, 0u8..4, -1i64..40, 0i64..4).prop_map(|(key, end, rev, limit)| ModelOp::Range { key, end, rev, limit }),
    ]
}

fn apply(b: &mut WriteBatch<'_>, m: &mut Model, op: &ModelOp) {
    match *op {
        ModelOp::Put(k, v) => {
            let r = b
                .put(
                    &PutRequest {
                        key: key(k),
                        value: vec![v],
                        ..Default::default()
                    },
                    &NoLeases,
                )
                .unwrap();
            let mut st = m.cur().clone();
            Model::put(&mut st, key(k), vec![v], m.rev + 1);
            m.commit_state(st, true);
            assert_eq!(r.header.unwrap().revision, m.rev);
        }
        ModelOp::Delete(k, e) => {
            let r = b
                .delete_range(&DeleteRangeRequest {
                    key: key(k),
                    range_end: range_end(k, e),
                    prev_kv: true,
                })
                .unwrap();
            let mut st = m.cur().clone();
            let n = Model::delete(&mut st, &key(k), &range_end(k, e));
            m.commit_state(st, n > 0);
            assert_eq!((r.deleted, r.header.unwrap().revision), (n as i64, m.rev));
        }
        ModelOp::Txn {
            key: ck,
            version,
            put,
            del,
            other,
        } => {
            let cmp = Compare {
                key: key(ck),
                target: compare::CompareTarget::Version as i32,
                result: compare::CompareResult::Equal as i32,
                target_union: Some(compare::TargetUnion::Version(version)),
                ..Default::default()
            };
            let put_op = |(k, v): (u8, u8)| RequestOp {
                request: Some(request_op::Request::RequestPut(PutRequest {
                    key: key(k),
                    value: vec![v],
                    ..Default::default()
                })),
            };
            let txn = TxnRequest {
                compare: vec![cmp],
                success: vec![
                    put_op(put),
                    RequestOp {
                        request: Some(request_op::Request::RequestDeleteRange(
                            DeleteRangeRequest {
                                key: key(del.0),
                                range_end: range_end(del.0, del.1),
                                prev_kv: false,
                            },
                        )),
                    },
                ],
                failure: vec![put_op(other)],
            };
            let r = b.txn(&txn, &NoLeases).unwrap();
            let succeeded = m.cur().get(&key(ck)).map_or(0, |kv| kv.version) == version;
            assert_eq!(r.succeeded, succeeded);
            let mut st = m.cur().clone();
            let rev = m.rev + 1;
            if succeeded {
                Model::put(&mut st, key(put.0), vec![put.1], rev);
                Model::delete(&mut st, &key(del.0), &range_end(del.0, del.1));
            } else {
                Model::put(&mut st, key(other.0), vec![other.1], rev);
            }
            m.commit_state(st, true);
            assert_eq!(r.header.unwrap().revision, m.rev);
        }
        ModelOp::Compact(rev) => {
            let got = b.compact(rev, true).map(|_| ());
            let want = if rev <= m.compact {
                Err(MvccError::Compacted)
            } else if rev > m.rev {
                Err(MvccError::FutureRev)
            } else {
                m.compact = rev;
                Ok(())
            };
            assert_eq!(got, want, "compact {rev}");
        }
        ModelOp::Range {
            key: k,
            end,
            rev,
            limit,
        } => {
            let req = RangeRequest {
                key: key(k),
                range_end: range_end(k, end),
                revision: rev,
                limit,
                ..Default::default()
            };
            let got = b.range(&req).map(|r| (r.kvs, r.count, r.more));
            assert_eq!(
                got,
                m.range(&req.key, &req.range_end, rev, limit),
                "{req:?}"
            );
        }
    }
}

fn check_all_ranges(store: &crate::KvStore, m: &Model) {
    assert_eq!(store.current_revision(), m.rev);
    assert_eq!(store.compact_revision(), m.compact.max(0));
    for rev in m.compact.max(1)..=m.rev {
        let r = store
            .range(&RangeRequest {
                key: vec![0],
                range_end: vec![0],
                revision: rev,
                ..Default::default()
            })
            .unwrap();
        let want: Vec<KeyValue> = m.states[&rev].values().cloned().collect();
        assert_eq!(r.kvs, want, "all keys at rev {rev}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn proptest_kvstore_matches_model(batches in prop::collection::vec(prop::collection::vec(op_strategy(), 1..6), 1..12)) {
        let t = new_store();
        let mut m = Model::new();
        for ops in &batches {
            let mut b = t.store.begin_batch().unwrap();
            for op in ops {
                apply(&mut b, &mut m, op);
            }
            b.commit(ops.len() % 2 == 0).unwrap();
            check_all_ranges(&t.store, &m);
        }
        // hash() covers every row: wait for the background deletions
        // (hash_kv does not depend on them).
        let hash_kv = t.store.hash_kv(0).unwrap();
        prop_assert!(t.store.wait_compacted_blocking(m.compact, std::time::Duration::from_secs(30)));
        prop_assert_eq!(t.store.hash_kv(0).unwrap(), hash_kv);
        let hash = t.store.hash().unwrap();
        let t = reopen(t);
        check_all_ranges(&t.store, &m);
        prop_assert_eq!(t.store.hash().unwrap(), hash);
        prop_assert_eq!(t.store.hash_kv(0).unwrap(), hash_kv);
    }
}
