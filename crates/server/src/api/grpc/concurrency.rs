//! What etcd's lock and election services build on: a client of this very
//! server (etcd's `v3client`), and the recipes of etcd's `concurrency`
//! package on top of it — a key per session under a prefix, ownership by
//! lowest create revision, and waiting for the deletion of every key
//! created before yours.
//!
//! The client calls the KV, Lease and Watch services in process: tonic
//! clients over the services' own routes, no socket, no TLS. So the lock
//! and election services work whatever the listeners (plain, TLS, client
//! certificates, unix sockets), and the caller's identity is passed on as
//! it arrived (its token, or the common name the client port's guard set).

use crate::auth::cert::CERT_CN_HEADER;
use crate::error::ServerError;
use retcd_api::etcdserverpb::{
    compare, kv_client::KvClient, lease_client::LeaseClient, range_request, request_op,
    response_op, watch_client::WatchClient, watch_request, Compare, DeleteRangeRequest,
    LeaseGrantRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseHeader,
    TxnRequest, TxnResponse, WatchCreateRequest, WatchRequest,
};
use retcd_api::mvccpb::{event::EventType, KeyValue};
use tokio_stream::StreamExt;
use tonic::service::Routes;
use tonic::Status;

/// etcd's default session TTL (seconds) when a lock or campaign names no
/// lease.
pub const DEFAULT_SESSION_TTL: i64 = 60;

/// The services the lock and election services call, in process.
/// Cheap to clone.
#[derive(Clone)]
pub struct InProcess(Routes);

impl InProcess {
    pub fn new(routes: Routes) -> InProcess {
        InProcess(routes)
    }

    /// A client acting for the caller whose request metadata is `md`.
    pub fn client(&self, md: &tonic::metadata::MetadataMap) -> V3Client {
        V3Client::new(self.0.clone(), md)
    }
}

/// The end of the range of keys starting with `prefix` (etcd's
/// `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `pfx` + lease id in lowercase hex, as etcd names session keys (Go's
/// `%x` of an int64: a negative id is `-` and the hex of its magnitude).
pub fn session_key(pfx: &[u8], lease: i64) -> Vec<u8> {
    let mut k = pfx.to_vec();
    let hex = if lease < 0 {
        format!("-{:x}", lease.unsigned_abs())
    } else {
        format!("{lease:x}")
    };
    k.extend_from_slice(hex.as_bytes());
    k
}

pub fn op_put(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

pub fn op_get(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })),
    }
}

/// The key under `pfx` with the lowest (first) or highest (last) create
/// revision, as etcd's `WithFirstCreate` / `WithLastCreate`.
pub fn range_by_create(pfx: &[u8], last: bool, max_create_rev: i64) -> RangeRequest {
    RangeRequest {
        key: pfx.to_vec(),
        range_end: prefix_end(pfx),
        limit: 1,
        sort_target: range_request::SortTarget::Create as i32,
        sort_order: if last {
            range_request::SortOrder::Descend
        } else {
            range_request::SortOrder::Ascend
        } as i32,
        max_create_revision: max_create_rev,
        ..Default::default()
    }
}

pub fn op_range(r: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(r)),
    }
}

pub fn op_delete(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            },
        )),
    }
}

pub fn cmp_create(key: &[u8], rev: i64) -> Compare {
    Compare {
        key: key.to_vec(),
        target: compare::CompareTarget::Create as i32,
        result: compare::CompareResult::Equal as i32,
        target_union: Some(compare::TargetUnion::CreateRevision(rev)),
        range_end: vec![],
    }
}

/// The range response of a txn's `i`-th op.
pub fn txn_range(resp: &TxnResponse, i: usize) -> Option<&RangeResponse> {
    match resp.responses.get(i)?.response.as_ref()? {
        response_op::Response::ResponseRange(r) => Some(r),
        _ => None,
    }
}

/// An error of the internal client as etcd's lock and election services
/// return it: clientv3 turns statuses into plain errors, so the caller sees
/// code Unknown with the original message.
pub fn client_err(s: Status) -> ServerError {
    ServerError::InnerClient(s.message().to_string())
}

/// Passes the caller's identity on (etcd's v3client forwards the incoming
/// context): its auth token, or the common name of its client
/// certificate, so the inner requests run with the caller's permissions.
#[derive(Clone)]
pub struct CallerToken {
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    cert_cn: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl CallerToken {
    pub fn of(md: &tonic::metadata::MetadataMap) -> CallerToken {
        CallerToken {
            token: md.get("token").or_else(|| md.get("authorization")).cloned(),
            cert_cn: md.get(CERT_CN_HEADER).cloned(),
        }
    }
}

impl tonic::service::Interceptor for CallerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(t) = &self.token {
            req.metadata_mut().insert("token", t.clone());
        }
        if let Some(cn) = &self.cert_cn {
            req.metadata_mut().insert(CERT_CN_HEADER, cn.clone());
        }
        Ok(req)
    }
}

/// The in-process services, with the caller's identity.
pub type SelfChannel = tonic::service::interceptor::InterceptedService<Routes, CallerToken>;

pub struct V3Client {
    pub kv: KvClient<SelfChannel>,
    pub lease: LeaseClient<SelfChannel>,
    pub watch: WatchClient<SelfChannel>,
}

impl V3Client {
    /// A client of this server acting for the caller whose request
    /// metadata is `md`.
    fn new(routes: Routes, md: &tonic::metadata::MetadataMap) -> Self {
        let t = CallerToken::of(md);
        V3Client {
            kv: KvClient::with_interceptor(routes.clone(), t.clone())
                .max_decoding_message_size(usize::MAX),
            lease: LeaseClient::with_interceptor(routes.clone(), t.clone()),
            watch: WatchClient::with_interceptor(routes, t).max_decoding_message_size(usize::MAX),
        }
    }

    /// The session lease: the one given, or a new one with etcd's default
    /// session TTL (the session is orphaned at once, as etcd's services do).
    pub async fn session_lease(&mut self, lease: i64) -> Result<i64, ServerError> {
        if lease != 0 {
            return Ok(lease);
        }
        let r = self
            .lease
            .lease_grant(LeaseGrantRequest {
                ttl: DEFAULT_SESSION_TTL,
                id: 0,
            })
            .await
            .map_err(client_err)?
            .into_inner();
        Ok(r.id)
    }

    pub async fn txn(&mut self, t: TxnRequest) -> Result<TxnResponse, ServerError> {
        Ok(self.kv.txn(t).await.map_err(client_err)?.into_inner())
    }

    pub async fn range(&mut self, r: RangeRequest) -> Result<RangeResponse, ServerError> {
        Ok(self.kv.range(r).await.map_err(client_err)?.into_inner())
    }

    /// etcd's `waitDeletes`: waits until no key under `pfx` has a create
    /// revision ≤ `max_create_rev`, always watching the newest such key.
    pub async fn wait_deletes(
        &mut self,
        pfx: &[u8],
        max_create_rev: i64,
    ) -> Result<Option<ResponseHeader>, ServerError> {
        loop {
            let resp = self
                .range(range_by_create(pfx, true, max_create_rev))
                .await?;
            let Some(last) = resp.kvs.first() else {
                return Ok(resp.header);
            };
            let rev = resp.header.as_ref().map_or(0, |h| h.revision);
            self.wait_delete(&last.key, rev).await?;
        }
    }

    /// Waits for a DELETE of `key` at or after revision `rev`.
    pub async fn wait_delete(&mut self, key: &[u8], rev: i64) -> Result<(), ServerError> {
        let mut stream = self.watch_from(key.to_vec(), vec![], rev).await?;
        while let Some(resp) = stream.next().await {
            let resp = resp.map_err(|s| ServerError::InnerClient(s.message().to_string()))?;
            if resp.canceled {
                return Err(ServerError::InnerClient(format!(
                    "lost watcher waiting for delete: {}",
                    resp.cancel_reason
                )));
            }
            if resp
                .events
                .iter()
                .any(|e| e.r#type == EventType::Delete as i32)
            {
                return Ok(());
            }
        }
        Err(ServerError::InnerClient(
            "lost watcher waiting for delete".into(),
        ))
    }

    /// Opens a watch on `[key, end)` from `rev`; the request side stays
    /// open as long as the returned stream lives.
    pub async fn watch_from(
        &mut self,
        key: Vec<u8>,
        range_end: Vec<u8>,
        rev: i64,
    ) -> Result<
        impl tokio_stream::Stream<Item = Result<retcd_api::etcdserverpb::WatchResponse, Status>>,
        ServerError,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key,
                    range_end,
                    start_revision: rev,
                    ..Default::default()
                },
            )),
        };
        tx.send(create)
            .await
            .map_err(|_| ServerError::internal("retcd: watch request channel closed"))?;
        let inbound = self
            .watch
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(client_err)?
            .into_inner();
        // Keep the sender alive with the stream so the watch stays open.
        Ok(inbound.map(move |r| {
            let _keep = &tx;
            r
        }))
    }
}

/// Deletes `key` in the background unless disarmed: a lock or campaign whose
/// caller went away must not leave its key behind (etcd unlocks on a
/// failed wait).
pub struct DeleteOnDrop {
    pub kv: Option<(KvClient<SelfChannel>, Vec<u8>)>,
}

impl DeleteOnDrop {
    pub fn disarm(&mut self) {
        self.kv = None;
    }
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if let Some((mut kv, key)) = self.kv.take() {
            tokio::spawn(async move {
                let _ = kv
                    .delete_range(DeleteRangeRequest {
                        key,
                        ..Default::default()
                    })
                    .await;
            });
        }
    }
}

pub fn first_kv(r: Option<&RangeResponse>) -> Option<&KeyValue> {
    r.and_then(|r| r.kvs.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_prefix_end() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(session_key(b"l/", 0x694d), b"l/694d".to_vec());
        // Go's %x of a negative int64
        assert_eq!(session_key(b"l/", -0x1005), b"l/-1005".to_vec());
        assert_eq!(session_key(b"", i64::MIN), b"-8000000000000000".to_vec());
    }
}
