//! Read-only txns served from the committed state, as etcd serves them:
//! no raft round, no write batch. Every compare and range of the txn reads
//! the same committed revision.

use retcd_api::etcdserverpb::{
    request_op, response_op, RangeRequest, RangeResponse, ResponseHeader, ResponseOp, TxnRequest,
    TxnResponse,
};

use crate::kvstore::KvStore;
use crate::kvstore_txn::{compare_from_index, compare_holds, compare_range, TxnPath};
use crate::range;
use crate::MvccError;

/// Whether no branch of `req` (or of a nested txn) writes.
pub fn is_txn_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .all(|o| match &o.request {
            Some(request_op::Request::RequestPut(_))
            | Some(request_op::Request::RequestDeleteRange(_)) => false,
            Some(request_op::Request::RequestTxn(t)) => is_txn_read_only(t),
            _ => true,
        })
}

impl KvStore {
    /// Evaluates a read-only txn (see [`is_txn_read_only`]) at the last
    /// committed revision. A txn with a put or delete gets an error.
    pub fn read_txn(&self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        if !is_txn_read_only(req) {
            return Err(MvccError::Backend("read_txn: txn writes".into()));
        }
        let p = self.published.read().clone();
        let rows = p.rows_at().open()?;
        // the bound applies to each range in it
        let max = self.max_response_bytes();
        let range = |r: &RangeRequest| -> Result<RangeResponse, MvccError> {
            let plan = {
                let index = self.index.read();
                range::plan(&index, r, p.rev, p.compact_rev, true, false)?
            };
            range::fetch(&rows, r, plan, max)
        };
        // as etcd: the branches are chosen, then the ranges on that path
        // checked, before any of it is read
        let path = TxnPath::of(req, &|c| {
            if let Some(holds) = compare_from_index(&self.index, c, p.rev) {
                return Ok(holds);
            }
            Ok(compare_holds(c, &range(&compare_range(c))?.kvs))
        })?;
        path.walk(req, &mut |o| match &o.request {
            Some(request_op::Request::RequestRange(r)) => {
                range::check_txn_range(r, p.rev, p.compact_rev)
            }
            _ => Ok(()),
        })?;
        let resp = eval(req, &path, &range)?;
        Ok(TxnResponse {
            header: Some(ResponseHeader {
                revision: p.rev,
                ..Default::default()
            }),
            ..resp
        })
    }
}

/// Runs the ops on `path`.
fn eval(
    req: &TxnRequest,
    path: &TxnPath,
    range: &dyn Fn(&RangeRequest) -> Result<RangeResponse, MvccError>,
) -> Result<TxnResponse, MvccError> {
    let mut nested = path.nested.iter();
    let mut responses = Vec::with_capacity(path.ops(req).len());
    for o in path.ops(req) {
        let response = match &o.request {
            Some(request_op::Request::RequestRange(r)) => {
                Some(response_op::Response::ResponseRange(range(r)?))
            }
            Some(request_op::Request::RequestTxn(t)) => {
                let r = eval(t, nested.next().expect("a path per nested txn"), range)?;
                Some(response_op::Response::ResponseTxn(TxnResponse {
                    header: Some(ResponseHeader::default()),
                    ..r
                }))
            }
            Some(_) => return Err(MvccError::Backend("read_txn: txn writes".into())),
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
