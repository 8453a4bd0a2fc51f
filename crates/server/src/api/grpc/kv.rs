//! etcdserverpb.KV: Range, Put, DeleteRange, Txn, Compact.

use crate::api::credentials;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::kv_server::Kv;
use retcd_api::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, TxnRequest, TxnResponse,
};
use std::sync::Arc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

pub struct KvService {
    pub server: Arc<EtcdServer>,
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self.server.range(request.into_inner(), &creds).await?;
        Ok(Response::new(resp))
    }

    async fn range_stream(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<BoxStream<RangeStreamResponse>>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let rx = self
            .server
            .range_stream(request.into_inner(), &creds)
            .await?;
        let chunks = ReceiverStream::new(rx).map(|r| {
            r.map(|range_response| RangeStreamResponse {
                range_response: Some(range_response),
            })
            .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self.server.put(request.into_inner(), &creds).await?;
        Ok(Response::new(resp))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self
            .server
            .delete_range(request.into_inner(), &creds)
            .await?;
        Ok(Response::new(resp))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self.server.txn(request.into_inner(), &creds).await?;
        Ok(Response::new(resp))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self.server.compact(request.into_inner(), &creds).await?;
        Ok(Response::new(resp))
    }
}
