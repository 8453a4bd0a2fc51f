//! v3lockpb.Lock, served as etcd serves it: etcd's `concurrency.Mutex` over
//! a client of this server. The lock for `name` is held by the key under
//! `name/` with the lowest create revision; a waiter watches the key created
//! just before its own until every earlier key is deleted.

use super::concurrency::{
    client_err, cmp_create, op_get, op_put, op_range, range_by_create, session_key, txn_range,
    DeleteOnDrop, InProcess,
};
use retcd_api::etcdserverpb::{DeleteRangeRequest, TxnRequest};
use retcd_api::v3lockpb::lock_server::Lock;
use retcd_api::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::{Request, Response, Status};

#[derive(Clone)]
pub struct LockService {
    pub v3: InProcess,
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let (md, _, req) = request.into_parts();
        let mut c = self.v3.client(&md);
        let lease = c.session_lease(req.lease).await?;
        let mut pfx = req.name.clone();
        pfx.push(b'/');
        let my_key = session_key(&pfx, lease);
        let resp = c
            .txn(TxnRequest {
                compare: vec![cmp_create(&my_key, 0)],
                success: vec![
                    op_put(&my_key, b"", lease),
                    op_range(range_by_create(&pfx, false, 0)),
                ],
                failure: vec![op_get(&my_key), op_range(range_by_create(&pfx, false, 0))],
            })
            .await?;
        let mut my_rev = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            my_rev = txn_range(&resp, 0)
                .and_then(|r| r.kvs.first())
                .map_or(my_rev, |kv| kv.create_revision);
        }
        let owner = txn_range(&resp, 1).and_then(|r| r.kvs.first());
        if owner.is_none_or(|o| o.create_revision == my_rev) {
            return Ok(Response::new(LockResponse {
                header: resp.header,
                key: my_key,
            }));
        }
        // Until the wait ends, dropping this call (client gone) unlocks.
        let mut guard = DeleteOnDrop {
            kv: Some((c.kv.clone(), my_key.clone())),
        };
        let header = c.wait_deletes(&pfx, my_rev - 1).await?;
        guard.disarm();
        Ok(Response::new(LockResponse {
            header,
            key: my_key,
        }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let (md, _, req) = request.into_parts();
        let mut c = self.v3.client(&md);
        let resp =
            c.kv.delete_range(DeleteRangeRequest {
                key: req.key,
                ..Default::default()
            })
            .await
            .map_err(client_err)?
            .into_inner();
        Ok(Response::new(UnlockResponse {
            header: resp.header,
        }))
    }
}
