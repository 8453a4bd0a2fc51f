//! [`WriteBatch`]: the one write transaction of the store, as etcd's
//! `storeTxnWrite` plus the put/delete/txn logic of `applierV3backend`.
//!
//! A batch spans many operations (raft entries) and one redb write
//! transaction. Each operation that changes something gets the next main
//! revision; the changes inside it are numbered by `sub`:
//!
//! ```text
//! store at rev 5
//! put a          -> 6.0                 response revision 6
//! delete x..y    -> deletes nothing     response revision 6 (no bump)
//! txn {put b; delete a; range a} -> 7.0 (b), 7.1 (a tombstone); the range
//!                   sees rev 7 and finds no `a`; response revision 7
//! txn {range b}  -> read-only           response revision 7
//! commit         -> readers now see rev 7
//! ```
//!
//! The batch's rows go to the memtable at commit (see `memtable`); a redb
//! write transaction is opened only for the other tables (leases, members,
//! auth, alarms, the compaction mark), and a batch that opened one writes
//! the memtable to redb with it.

use redb::WriteTransaction;
use retcd_api::etcdserverpb::{
    compare, request_op, response_op, Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest,
    TxnResponse,
};
use retcd_api::mvccpb::{event::EventType, Event, KeyValue};
use std::cell::{OnceCell, Ref, RefCell};
use std::sync::atomic::Ordering;

use crate::index::{KeyRange, TreeIndex};
use crate::kvstore::KvStore;
use crate::memtable::{self, MemRow, Row, RowSource, Rows, RowsAt};
use crate::range;
use crate::revision::Revision;
use crate::{LeaseLookup, MvccError};
use parking_lot::RwLock;

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        revision,
        ..Default::default()
    })
}

/// One operation (put, delete range or txn) inside the batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    /// Store revision before the operation.
    begin_rev: i64,
    /// Changes made so far; the next change's `sub`.
    changes: i64,
}

impl Op {
    fn write_rev(&self) -> i64 {
        self.begin_rev + 1
    }
    /// The revision the operation's reads see: its own changes included.
    fn read_rev(&self) -> i64 {
        if self.changes > 0 {
            self.begin_rev + 1
        } else {
            self.begin_rev
        }
    }
}

/// The outcome of a txn's compares: which branch runs, and the same for
/// every nested txn of that branch, in order.
#[derive(Debug)]
pub(crate) struct TxnPath {
    pub(crate) succeeded: bool,
    pub(crate) nested: Vec<TxnPath>,
}

impl TxnPath {
    /// etcd's `compareToPath`: the branch of `req` whose compares `holds`
    /// (all of them) or not, and the same for each nested txn on it.
    pub(crate) fn of(
        req: &TxnRequest,
        holds: &dyn Fn(&Compare) -> Result<bool, MvccError>,
    ) -> Result<TxnPath, MvccError> {
        let mut succeeded = true;
        for c in &req.compare {
            if !holds(c)? {
                succeeded = false;
                break;
            }
        }
        let mut path = TxnPath {
            succeeded,
            nested: Vec::new(),
        };
        for o in path.ops(req) {
            if let Some(request_op::Request::RequestTxn(t)) = &o.request {
                path.nested.push(TxnPath::of(t, holds)?);
            }
        }
        Ok(path)
    }

    /// The ops of the branch of `req` this path takes.
    pub(crate) fn ops<'r>(&self, req: &'r TxnRequest) -> &'r [RequestOp] {
        if self.succeeded {
            &req.success
        } else {
            &req.failure
        }
    }

    /// Calls `f` on every op this path runs, in order: a nested txn's ops
    /// in its place (not the nested txn itself).
    pub(crate) fn walk<'r>(
        &self,
        req: &'r TxnRequest,
        f: &mut dyn FnMut(&'r RequestOp) -> Result<(), MvccError>,
    ) -> Result<(), MvccError> {
        let mut nested = self.nested.iter();
        for o in self.ops(req) {
            match &o.request {
                Some(request_op::Request::RequestTxn(t)) => {
                    nested.next().expect("a path per nested txn").walk(t, f)?
                }
                _ => f(o)?,
            }
        }
        Ok(())
    }
}

/// The open write transaction; see the module documentation. Dropping it
/// without [`WriteBatch::commit`] discards every change.
pub struct WriteBatch<'a> {
    pub(crate) store: &'a KvStore,
    _guard: parking_lot::MutexGuard<'a, ()>,
    /// A redb write transaction, opened by the first write to a table
    /// other than `key` (see the module documentation).
    txn: OnceCell<WriteTransaction>,
    /// The committed state the batch builds on (stable: the batch lock
    /// keeps every other writer out).
    at: RowsAt,
    /// `at` opened, on the first read.
    rows: OnceCell<Rows>,
    /// Store revision including this batch's operations.
    pub(crate) rev: i64,
    /// Compaction revision including this batch's compactions (-1: none).
    pub(crate) compact_rev: i64,
    /// Index compactions to apply when the batch commits.
    pub(crate) pending_compactions: Vec<i64>,
    consistent: Option<(u64, u64)>,
    events: Vec<(i64, Event)>,
    /// The index holds revisions of this batch (undo on drop).
    pub(crate) index_dirty: bool,
    committed: bool,
    /// This batch's rows for the `key` table, in revision order: read
    /// from here by the batch itself, appended to the memtable at commit.
    pending_rows: RefCell<Vec<MemRow>>,
}

/// What a batch reads rows from: its own rows, then the committed ones.
struct BatchRows<'b> {
    pending: Ref<'b, Vec<MemRow>>,
    rows: &'b Rows,
}

impl RowSource for BatchRows<'_> {
    fn find_row(&self, rev: Revision) -> Result<Option<Row<'_>>, MvccError> {
        if let Some(r) = memtable::find(&self.pending, rev) {
            return Ok(Some(Row::Mem(r.row.clone())));
        }
        self.rows.find_row(rev)
    }
}

impl<'a> WriteBatch<'a> {
    pub(crate) fn begin(store: &'a KvStore) -> Result<WriteBatch<'a>, MvccError> {
        let guard = store.batch_lock.lock();
        let (rev, compact_rev, at) = {
            let p = store.published.read();
            (p.rev, p.compact_rev, p.rows_at())
        };
        Ok(WriteBatch {
            store,
            _guard: guard,
            txn: OnceCell::new(),
            at,
            rows: OnceCell::new(),
            rev,
            compact_rev,
            pending_compactions: Vec::new(),
            consistent: None,
            events: Vec::new(),
            index_dirty: false,
            committed: false,
            pending_rows: RefCell::default(),
        })
    }

    /// The batch's redb write transaction, begun on first use.
    pub(crate) fn wtxn(&self) -> Result<&WriteTransaction, MvccError> {
        if self.txn.get().is_none() {
            self.store.writer.wait_idle()?;
            let txn = self.store.backend.db().begin_write()?;
            let _ = self.txn.set(txn);
        }
        Ok(self.txn.get().expect("set above"))
    }

    /// The rows this batch reads: its own, then the committed ones.
    fn rows(&self) -> Result<BatchRows<'_>, MvccError> {
        if self.rows.get().is_none() {
            let _ = self.rows.set(self.at.open()?);
        }
        Ok(BatchRows {
            pending: self.pending_rows.borrow(),
            rows: self.rows.get().expect("set above"),
        })
    }

    /// Queues `kv`'s row at `rev` for the `key` table (see
    /// `pending_rows`); returns the row's size.
    fn insert_row(&self, rev: Revision, tombstone: bool, kv: &KeyValue) -> usize {
        let row = retcd_api::codec::encode_key_value(kv);
        let len = row.len();
        self.pending_rows.borrow_mut().push(MemRow {
            rev,
            tombstone,
            row: row.into(),
        });
        len
    }

    /// The batch's redb write transaction, for tables the server owns
    /// (`members`, `leases`, `auth`, `alarm`): their changes commit
    /// atomically with the batch's key-value changes and consistent index.
    pub fn backend_txn(&self) -> Result<&WriteTransaction, MvccError> {
        self.wtxn()
    }

    /// The store revision as this batch sees it.
    pub fn revision(&self) -> i64 {
        self.rev
    }

    fn finish(&mut self, op: Op) {
        if op.changes > 0 {
            self.rev += 1;
        }
    }

    /// A Range that sees this batch's writes.
    pub fn range(&mut self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        let op = Op {
            begin_rev: self.rev,
            changes: 0,
        };
        self.range_in(&op, req)
    }

    fn range_in(&self, op: &Op, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        let plan = {
            let index = self.store.index.read();
            range::plan(&index, req, op.read_rev(), self.compact_rev, true, false)?
        };
        range::fetch(&self.rows()?, req, plan, usize::MAX)
    }

    /// The live value of `key` as `op` sees it.
    fn get_kv(&self, op: &Op, key: &[u8]) -> Result<Option<KeyValue>, MvccError> {
        let found = self.store.index.read().get(key, op.read_rev());
        match found {
            Ok((modified, _, _)) => Ok(Some(range::read_kv(&self.rows()?, modified)?)),
            Err(_) => Ok(None),
        }
    }

    /// Request checks etcd's gRPC layer makes (`checkPutRequest`).
    fn check_put_request(req: &PutRequest) -> Result<(), MvccError> {
        if req.ignore_value && !req.value.is_empty() {
            return Err(MvccError::ValueProvided);
        }
        if req.ignore_lease && req.lease != 0 {
            return Err(MvccError::LeaseProvided);
        }
        Ok(())
    }

    /// Put; see etcd's `applierV3backend.Put`.
    pub fn put(
        &mut self,
        req: &PutRequest,
        leases: &dyn LeaseLookup,
    ) -> Result<PutResponse, MvccError> {
        Self::check_put_request(req)?;
        if req.lease != 0 && !leases.lease_exists(req.lease) {
            return Err(MvccError::LeaseNotFound);
        }
        let mut op = Op {
            begin_rev: self.rev,
            changes: 0,
        };
        if (req.ignore_value || req.ignore_lease) && self.get_kv(&op, &req.key)?.is_none() {
            return Err(MvccError::KeyNotFound);
        }
        let resp = self.put_in(&mut op, req)?;
        self.finish(op);
        Ok(resp)
    }

    fn put_in(&mut self, op: &mut Op, req: &PutRequest) -> Result<PutResponse, MvccError> {
        let rev = op.write_rev();
        // The previous value is read only when something needs it: the
        // request, or a watcher asking for prev_kv (a watcher that starts
        // after this check gets it filled at notify, as etcd reads it when
        // sending). Reading it for every overwrite was a random page read
        // per put on the apply path.
        let need_prev = req.prev_kv
            || req.ignore_value
            || req.ignore_lease
            || self.store.prev_kv_watchers.load(Ordering::Relaxed) > 0;
        if !need_prev {
            return Ok(self.put_plain(op, req));
        }
        let found = self.store.index.read().get(&req.key, rev).ok();
        let prev_kv = match found {
            Some((modified, _, _)) => Some(range::read_kv(&self.rows()?, modified)?),
            None => None,
        };
        let kv = match &prev_kv {
            None if req.ignore_value || req.ignore_lease => return Err(MvccError::KeyNotFound),
            Some(p) => put_kv(
                req,
                rev,
                found,
                if req.ignore_value {
                    p.value.clone()
                } else {
                    req.value.clone().into()
                },
                if req.ignore_lease { p.lease } else { req.lease },
            ),
            None => put_kv(req, rev, found, req.value.clone().into(), req.lease),
        };
        let idx_rev = Revision::new(rev, op.changes);
        let row_len = self.insert_row(idx_rev, false, &kv);
        self.store
            .index
            .write()
            .put_sized(&req.key, idx_rev, row_len);
        self.put_recorded(op, kv, prev_kv.clone());
        Ok(PutResponse {
            header: header(rev),
            prev_kv: if req.prev_kv { prev_kv } else { None },
        })
    }

    /// A put that needs nothing of the value it replaces: the key's index
    /// entry is looked up once, under the index's write lock, to read its
    /// create revision and version and to record the put (a read, then a
    /// write, searched the index two or three times per put).
    fn put_plain(&mut self, op: &mut Op, req: &PutRequest) -> PutResponse {
        let rev = op.write_rev();
        let idx_rev = Revision::new(rev, op.changes);
        let kv_of = |found| put_kv(req, rev, found, req.value.clone().into(), req.lease);
        let mut index = self.store.index.write();
        let kv = match index.key_index_mut(&req.key) {
            Some(ki) => {
                let kv = kv_of(ki.get(rev).ok());
                ki.put_sized(
                    idx_rev.main,
                    idx_rev.sub,
                    self.insert_row(idx_rev, false, &kv),
                );
                kv
            }
            None => {
                let kv = kv_of(None);
                let row_len = self.insert_row(idx_rev, false, &kv);
                index.put_new_sized(&req.key, idx_rev, row_len);
                kv
            }
        };
        drop(index);
        self.put_recorded(op, kv, None);
        PutResponse {
            header: header(rev),
            prev_kv: None,
        }
    }

    /// A put of `kv` is in the rows and the index: counts it in the op and
    /// queues its event.
    fn put_recorded(&mut self, op: &mut Op, kv: KeyValue, prev_kv: Option<KeyValue>) {
        self.index_dirty = true;
        op.changes += 1;
        self.events.push((
            kv.mod_revision,
            Event {
                r#type: EventType::Put as i32,
                kv: Some(kv),
                prev_kv,
            },
        ));
    }

    /// DeleteRange; deleting nothing does not bump the revision.
    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, MvccError> {
        let mut op = Op {
            begin_rev: self.rev,
            changes: 0,
        };
        let resp = self.delete_in(&mut op, req);
        let resp = applied_whole(&op, resp)?;
        self.finish(op);
        Ok(resp)
    }

    fn delete_in(
        &mut self,
        op: &mut Op,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, MvccError> {
        let keys = self
            .store
            .index
            .read()
            .range(KeyRange::new(&req.key, &req.range_end), op.read_rev());
        let rev = op.write_rev();
        let mut prev_kvs = Vec::with_capacity(keys.len());
        for (key, modified) in &keys {
            let prev = range::read_kv(&self.rows()?, *modified)?;
            let idx_rev = Revision::new(rev, op.changes);
            let tomb = KeyValue {
                key: key.clone().into(),
                ..Default::default()
            };
            self.insert_row(idx_rev, true, &tomb);
            self.index_dirty = true;
            self.store
                .index
                .write()
                .tombstone(key, idx_rev)
                .unwrap_or_else(|_| {
                    panic!("mvcc: cannot tombstone an existing key {key:?} at {idx_rev}")
                });
            op.changes += 1;
            let kv = KeyValue {
                key: key.clone().into(),
                mod_revision: rev,
                ..Default::default()
            };
            // A watcher's prev_kv is the key before the revision, as etcd
            // reads it (at mod_revision - 1): not a value this same Txn put
            // earlier (the response's prev_kvs are the Txn's own view).
            let event_prev = if modified.main == rev {
                let before = self.store.index.read().get(key, rev - 1).ok();
                match before {
                    Some((m, _, _)) => Some(range::read_kv(&self.rows()?, m)?),
                    None => None,
                }
            } else {
                Some(prev.clone())
            };
            self.events.push((
                rev,
                Event {
                    r#type: EventType::Delete as i32,
                    kv: Some(kv),
                    prev_kv: event_prev,
                },
            ));
            prev_kvs.push(prev);
        }
        Ok(DeleteRangeResponse {
            header: header(op.read_rev()),
            deleted: keys.len() as i64,
            prev_kvs: if req.prev_kv { prev_kvs } else { Vec::new() },
        })
    }

    /// Txn: compares (all evaluated first, on the state before the txn),
    /// checks of the chosen branch, then its operations under one revision.
    /// A failing check leaves no trace.
    pub fn txn(
        &mut self,
        req: &TxnRequest,
        leases: &dyn LeaseLookup,
    ) -> Result<TxnResponse, MvccError> {
        let mut op = Op {
            begin_rev: self.rev,
            changes: 0,
        };
        check_txn_requests(req)?;
        let path = TxnPath::of(req, &|c| self.apply_compare(&op, c))?;
        // as etcd: first the puts of the whole chosen path, then the ranges
        self.check_txn(&op, req, &path, leases, true)?;
        self.check_txn(&op, req, &path, leases, false)?;
        let resp = self.apply_txn(&mut op, req, &path);
        let resp = applied_whole(&op, resp)?;
        self.finish(op);
        Ok(TxnResponse {
            header: header(op.read_rev()),
            ..resp
        })
    }

    /// etcd's `applyCompare`: every key in the compare's range must satisfy
    /// it; no key compares as an empty KeyValue, except for VALUE which fails.
    fn apply_compare(&self, op: &Op, c: &Compare) -> Result<bool, MvccError> {
        if let Some(holds) = compare_from_index(&self.store.index, c, op.read_rev()) {
            return Ok(holds);
        }
        let rr = self.range_in(op, &compare_range(c))?;
        Ok(compare_holds(c, &rr.kvs))
    }

    /// etcd's checkRequestPut and checkRequestRange over the chosen branch,
    /// plus: an ignore_value/ignore_lease put must find its key at the point
    /// it runs (etcd would panic there), tracked through the puts and
    /// deletes before it.
    fn check_txn(
        &self,
        op: &Op,
        req: &TxnRequest,
        path: &TxnPath,
        leases: &dyn LeaseLookup,
        puts: bool,
    ) -> Result<(), MvccError> {
        let mut overlay: Vec<(bool, KeyRange<'_>)> = Vec::new();
        path.walk(req, &mut |o| {
            match &o.request {
                Some(request_op::Request::RequestPut(p)) if puts => {
                    if p.ignore_value || p.ignore_lease {
                        let before = self.get_kv(op, &p.key)?.is_some();
                        let now = overlay
                            .iter()
                            .rev()
                            .find(|(_, r)| r.contains(&p.key))
                            .map_or(before, |(put, _)| *put);
                        if !before || !now {
                            return Err(MvccError::KeyNotFound);
                        }
                    }
                    if p.lease != 0 && !leases.lease_exists(p.lease) {
                        return Err(MvccError::LeaseNotFound);
                    }
                    overlay.push((true, KeyRange::Single(&p.key)));
                }
                Some(request_op::Request::RequestDeleteRange(d)) => {
                    overlay.push((false, KeyRange::new(&d.key, &d.range_end)))
                }
                Some(request_op::Request::RequestRange(r)) if !puts => {
                    range::check_txn_range(r, op.begin_rev, self.compact_rev)?
                }
                _ => {}
            }
            Ok(())
        })
    }

    fn apply_txn(
        &mut self,
        op: &mut Op,
        req: &TxnRequest,
        path: &TxnPath,
    ) -> Result<TxnResponse, MvccError> {
        let ops = path.ops(req);
        let mut nested = path.nested.iter();
        let mut responses = Vec::with_capacity(ops.len());
        for o in ops {
            let response = match &o.request {
                Some(request_op::Request::RequestRange(r)) => {
                    Some(response_op::Response::ResponseRange(self.range_in(op, r)?))
                }
                Some(request_op::Request::RequestPut(p)) => {
                    Some(response_op::Response::ResponsePut(self.put_in(op, p)?))
                }
                Some(request_op::Request::RequestDeleteRange(d)) => Some(
                    response_op::Response::ResponseDeleteRange(self.delete_in(op, d)?),
                ),
                Some(request_op::Request::RequestTxn(t)) => {
                    let p = nested.next().expect("path per nested txn");
                    // nested txn responses carry an empty header, as in etcd
                    let r = self.apply_txn(op, t, p)?;
                    Some(response_op::Response::ResponseTxn(TxnResponse {
                        header: Some(ResponseHeader::default()),
                        ..r
                    }))
                }
                None => None,
            };
            responses.push(ResponseOp { response });
        }
        Ok(TxnResponse {
            header: None,
            succeeded: path.succeeded,
            responses,
        })
    }

    /// Records the raft index and term applied by this batch; written to
    /// `meta` in the same commit as the data.
    pub fn set_consistent_index(&mut self, index: u64, term: u64) {
        self.consistent = Some((index, term));
    }

    /// Events produced so far, with the main revision of each: PUT with the
    /// new kv, DELETE with a kv holding the key and the delete's revision;
    /// `prev_kv` always filled.
    pub fn take_events(&mut self) -> Vec<(i64, Event)> {
        std::mem::take(&mut self.events)
    }

    /// Commits (durably if `durable`, else visible only; see
    /// `retcd_storage::backend::CommitPolicy`) and publishes the new state.
    ///
    /// The rows go to the memtable; they are written to redb here only if
    /// the commit is durable or the batch wrote another table. Returns
    /// whether it wrote redb.
    pub fn commit(mut self, durable: bool) -> Result<bool, MvccError> {
        let mut rows = self.pending_rows.take();
        let (rev, compact_rev, consistent) = (self.rev, self.compact_rev, self.consistent);
        let txn = self.txn.take();
        let flushed = if durable || txn.is_some() {
            // idle: no frozen memtable, `at.mem` holds every committed row
            // not in redb
            self.store.writer.wait_idle()?;
            let ci = consistent.unwrap_or_else(|| {
                let p = self.store.published.read();
                (p.consistent_index, p.term)
            });
            Some(memtable::write_out(
                &self.store.backend,
                txn,
                &self.at.mem,
                &rows,
                ci,
                durable,
            )?)
        } else {
            self.at.mem.append(&mut rows);
            None
        };
        let compactions = std::mem::take(&mut self.pending_compactions);
        self.committed = true;
        let wrote = flushed.is_some();
        self.store.publish(&compactions, |p| {
            p.rev = rev;
            p.compact_rev = compact_rev;
            if let Some((index, term)) = consistent {
                p.consistent_index = index;
                p.term = term;
            }
            if let Some(snapshot) = flushed {
                p.snapshot = snapshot;
                p.mem = Default::default();
                p.flushed_rev = rev;
            }
        })?;
        Ok(wrote)
    }
}

impl Drop for WriteBatch<'_> {
    fn drop(&mut self) {
        // abort the redb transaction first: undoing the index may write
        drop(self.txn.take());
        if !self.committed && self.index_dirty {
            // undo this batch's index changes
            self.store.reload_index();
        }
    }
}

/// An operation's result once it ran: an error before it changed
/// anything is the client's answer; one after it changed some keys
/// (a row that cannot be read: the checks before it found nothing
/// wrong) would leave half of it in the store and its revision to be
/// used again, so the member stops there, as etcd does ("unexpected
/// error during txn").
fn applied_whole<T>(op: &Op, r: Result<T, MvccError>) -> Result<T, MvccError> {
    match r {
        Err(e) if op.changes > 0 => {
            panic!(
                "mvcc: unexpected error after {} changes at revision {}: {e}",
                op.changes,
                op.write_rev()
            )
        }
        r => r,
    }
}

/// The Range a compare reads: the keys it covers, at the txn's revision.
pub(crate) fn compare_range(c: &Compare) -> RangeRequest {
    RangeRequest {
        key: c.key.clone(),
        range_end: c.range_end.clone(),
        ..Default::default()
    }
}

/// A compare of one key's version, create or mod revision, answered from
/// the index (which holds all three) as of `at_rev`; `None` for any other
/// compare (a value or lease, or a range of keys), which reads the rows.
/// Reading the row (a B-tree lookup and a decode, its value copied) was
/// half of a guarded update's apply, and kube-apiserver's every write
/// compares the mod revision.
pub(crate) fn compare_from_index(
    index: &RwLock<TreeIndex>,
    c: &Compare,
    at_rev: i64,
) -> Option<bool> {
    use compare::CompareTarget;
    let from_index = matches!(
        CompareTarget::try_from(c.target),
        Ok(CompareTarget::Version | CompareTarget::Create | CompareTarget::Mod)
    );
    if !from_index || !c.range_end.is_empty() {
        return None;
    }
    let kv = (index.read().get(&c.key, at_rev).ok()).map(|(modified, created, version)| KeyValue {
        create_revision: created.main,
        mod_revision: modified.main,
        version,
        ..Default::default()
    });
    Some(compare_holds(c, kv.as_slice()))
}

/// etcd's `applyCompare` on the keys the compare's range holds: every key
/// must satisfy it; no key compares as an empty KeyValue, except for VALUE
/// which fails.
pub(crate) fn compare_holds(c: &Compare, kvs: &[KeyValue]) -> bool {
    let target = compare::CompareTarget::try_from(c.target).ok();
    if kvs.is_empty() {
        return target != Some(compare::CompareTarget::Value)
            && compare_kv(c, target, &KeyValue::default());
    }
    kvs.iter().all(|kv| compare_kv(c, target, kv))
}

/// etcd's `compareKV`.
fn compare_kv(
    c: &retcd_api::etcdserverpb::Compare,
    target: Option<compare::CompareTarget>,
    kv: &KeyValue,
) -> bool {
    use compare::{CompareResult, CompareTarget, TargetUnion};
    let int = |v: i64, want: Option<i64>| v.cmp(&want.unwrap_or(0));
    let tu = c.target_union.as_ref();
    let result = match target {
        Some(CompareTarget::Value) => {
            let empty = Vec::new();
            let v = match tu {
                Some(TargetUnion::Value(v)) => v,
                _ => &empty,
            };
            kv.value.as_ref().cmp(v.as_slice())
        }
        Some(CompareTarget::Create) => int(
            kv.create_revision,
            if let Some(TargetUnion::CreateRevision(r)) = tu {
                Some(*r)
            } else {
                None
            },
        ),
        Some(CompareTarget::Mod) => int(
            kv.mod_revision,
            if let Some(TargetUnion::ModRevision(r)) = tu {
                Some(*r)
            } else {
                None
            },
        ),
        Some(CompareTarget::Version) => int(
            kv.version,
            if let Some(TargetUnion::Version(r)) = tu {
                Some(*r)
            } else {
                None
            },
        ),
        Some(CompareTarget::Lease) => int(
            kv.lease,
            if let Some(TargetUnion::Lease(r)) = tu {
                Some(*r)
            } else {
                None
            },
        ),
        None => std::cmp::Ordering::Equal,
    };
    match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => result.is_eq(),
        Ok(CompareResult::NotEqual) => result.is_ne(),
        Ok(CompareResult::Greater) => result.is_gt(),
        Ok(CompareResult::Less) => result.is_lt(),
        Err(_) => true,
    }
}

/// etcd's gRPC-layer put checks, over both branches of every (nested) txn.
fn check_txn_requests(req: &TxnRequest) -> Result<(), MvccError> {
    for o in req.success.iter().chain(&req.failure) {
        match &o.request {
            Some(request_op::Request::RequestPut(p)) => WriteBatch::check_put_request(p)?,
            Some(request_op::Request::RequestTxn(t)) => check_txn_requests(t)?,
            _ => {}
        }
    }
    Ok(())
}

/// The key-value a put of `req` at revision `rev` writes, with `value` and
/// `lease`; `found` is what the index has for the key at `rev`
/// (modified, created, version), None for a new key.
fn put_kv(
    req: &PutRequest,
    rev: i64,
    found: Option<(Revision, Revision, i64)>,
    value: prost::bytes::Bytes,
    lease: i64,
) -> KeyValue {
    KeyValue {
        key: req.key.clone().into(),
        create_revision: found.map_or(rev, |(_, created, _)| created.main),
        mod_revision: rev,
        version: found.map_or(0, |(_, _, ver)| ver) + 1,
        value,
        lease,
    }
}
