//! etcdserverpb.Lease: LeaseGrant, LeaseRevoke, LeaseKeepAlive,
//! LeaseTimeToLive, LeaseLeases (the lease logic is `server::lease`).

use crate::api::credentials;
use crate::error::ServerError;
use crate::server::EtcdServer;
use retcd_api::etcdserverpb::lease_server::Lease;
use retcd_api::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use retcd_lease::LeaseError;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

pub struct LeaseService {
    pub server: Arc<EtcdServer>,
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self
            .server
            .lease_grant(request.into_inner(), &creds)
            .await?;
        Ok(Response::new(resp))
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self
            .server
            .lease_revoke(request.into_inner(), &creds)
            .await?;
        Ok(Response::new(resp))
    }

    /// Many leases on one stream, answered in order: {ID, TTL} with the
    /// granted TTL after the renew; an unknown (or revoked) lease answers
    /// TTL 0 and the stream goes on; any other error ends the stream.
    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<tonic::codegen::BoxStream<LeaseKeepAliveResponse>>, Status> {
        let (md, _, mut input) = request.into_parts();
        let creds = credentials(&self.server, &md);
        let (tx, rx) = mpsc::channel(16);
        let server = self.server.clone();
        tokio::spawn(async move {
            while let Some(Ok(req)) = input.next().await {
                // Header taken before the renew, as etcd: its revision is at
                // most the one at which the keepalive happened.
                let header = server.current_header();
                // who asks is looked at on every keepalive (etcd 3.5.28+).
                // A client gone away (its response stream dropped) cancels
                // the renew, as etcd's stream context does: a renew still
                // waiting for a leader (or on a forward held up by a cut
                // link) must not land after the client gave up on it.
                let renewed = tokio::select! {
                    r = server.lease_renew(req.id, &creds) => r,
                    _ = tx.closed() => return,
                };
                let ttl = match renewed {
                    Ok(ttl) => ttl,
                    Err(ServerError::Lease(LeaseError::NotFound)) => 0,
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                };
                let resp = LeaseKeepAliveResponse {
                    header,
                    id: req.id,
                    ttl,
                };
                if tx.send(Ok(resp)).await.is_err() {
                    return;
                }
            }
        });
        // A stream whose client sends nothing gets no headers, as etcd's.
        super::headers_with_first(rx).await
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        let resp = self
            .server
            .lease_time_to_live(request.into_inner(), &creds)
            .await?;
        Ok(Response::new(resp))
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let creds = credentials(&self.server, request.metadata());
        Ok(Response::new(self.server.lease_leases(&creds)?))
    }
}
