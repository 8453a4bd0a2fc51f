//! v3electionpb.Election, served as etcd serves it: etcd's
//! `concurrency.Election` over a client of this server. The leader of
//! `name` is the key under `name/` with the lowest create revision; its
//! value is the proclaimed value.

use super::concurrency::{
    cmp_create, op_delete, op_get, op_put, prefix_end, range_by_create, session_key, txn_range,
    DeleteOnDrop, InProcess, V3Client,
};
use crate::error::ServerError;
use retcd_api::etcdserverpb::{ResponseHeader, TxnRequest};
use retcd_api::mvccpb::event::EventType;
use retcd_api::v3electionpb::election_server::Election;
use retcd_api::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use std::pin::Pin;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

#[derive(Clone)]
pub struct ElectionService {
    pub v3: InProcess,
}

fn prefix(name: &[u8]) -> Vec<u8> {
    let mut p = name.to_vec();
    p.push(b'/');
    p
}

/// etcd's Proclaim: replace the value if `leader` still holds the key,
/// putting it with `lease` (the session's).
async fn proclaim(
    c: &mut V3Client,
    leader: &LeaderKey,
    lease: i64,
    value: &[u8],
) -> Result<Option<ResponseHeader>, ServerError> {
    let resp = c
        .txn(TxnRequest {
            compare: vec![cmp_create(&leader.key, leader.rev)],
            success: vec![op_put(&leader.key, value, lease)],
            failure: vec![],
        })
        .await?;
    if !resp.succeeded {
        return Err(ServerError::ElectionNotLeader);
    }
    Ok(resp.header)
}

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let (md, _, req) = request.into_parts();
        let mut c = self.v3.client(&md);
        let lease = c.session_lease(req.lease).await?;
        let pfx = prefix(&req.name);
        let key = session_key(&pfx, lease);
        let resp = c
            .txn(TxnRequest {
                compare: vec![cmp_create(&key, 0)],
                success: vec![op_put(&key, &req.value, lease)],
                failure: vec![op_get(&key)],
            })
            .await?;
        let mut leader = LeaderKey {
            name: req.name.clone(),
            key: key.clone(),
            rev: resp.header.as_ref().map_or(0, |h| h.revision),
            lease,
        };
        let mut guard = DeleteOnDrop {
            kv: Some((c.kv.clone(), key.clone())),
        };
        if !resp.succeeded {
            if let Some(kv) = txn_range(&resp, 0).and_then(|r| r.kvs.first()) {
                leader.rev = kv.create_revision;
                if kv.value != req.value {
                    proclaim(&mut c, &leader, lease, &req.value).await?;
                }
            }
        }
        c.wait_deletes(&pfx, leader.rev - 1).await?;
        guard.disarm();
        Ok(Response::new(CampaignResponse {
            header: resp.header,
            leader: Some(leader),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let (md, _, req) = request.into_parts();
        let leader = req.leader.ok_or(ServerError::ElectionMissingLeaderKey)?;
        let mut c = self.v3.client(&md);
        // etcd resumes the election in a session on the leader key's
        // lease: lease 0 grants a new one, which the value is put with
        let lease = c.session_lease(leader.lease).await?;
        let header = proclaim(&mut c, &leader, lease, &req.value).await?;
        Ok(Response::new(ProclaimResponse { header }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let (md, _, req) = request.into_parts();
        let mut c = self.v3.client(&md);
        let resp = c
            .range(range_by_create(&prefix(&req.name), false, 0))
            .await?;
        let kv = resp
            .kvs
            .into_iter()
            .next()
            .ok_or(ServerError::ElectionNoLeader)?;
        Ok(Response::new(LeaderResponse {
            header: resp.header,
            kv: Some(kv),
        }))
    }

    /// etcd's observe loop: the current leader, then its value changes,
    /// then (once its key is deleted) the next leader, and so on. An error
    /// of the inner client (a caller without READ on the election's
    /// prefix) ends the stream without an error, as etcd's channel closes.
    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let (md, _, req) = request.into_parts();
        let v3 = self.v3.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<LeaderResponse, Status>>(16);
        // The loop ends when the client goes (its stream dropped), not at
        // its next send: a watch it waits on would stay until the leader
        // changed (etcd ties them to the stream's context).
        let gone = tx.clone();
        let observe = async move {
            let pfx = prefix(&req.name);
            let mut c = v3.client(&md);
            loop {
                let resp = match c.range(range_by_create(&pfx, false, 0)).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!(error = %e, "observe ended");
                        return;
                    }
                };
                let (mut header, kv) = match resp.kvs.first() {
                    Some(kv) => (resp.header.unwrap_or_default(), kv.clone()),
                    None => {
                        // No leader yet: wait for the first put under the prefix.
                        let rev = resp.header.as_ref().map_or(0, |h| h.revision);
                        let mut w = match c.watch_from(pfx.clone(), prefix_end(&pfx), rev).await {
                            Ok(w) => w,
                            Err(e) => {
                                tracing::debug!(error = %e, "observe ended");
                                return;
                            }
                        };
                        let mut found = None;
                        while found.is_none() {
                            match w.next().await {
                                Some(Ok(wr)) => {
                                    if wr.canceled {
                                        return;
                                    }
                                    if let Some(ev) =
                                        wr.events.iter().find(|e| e.r#type == EventType::Put as i32)
                                    {
                                        let kv = ev.kv.clone().unwrap_or_default();
                                        let mut h = wr.header.unwrap_or_default();
                                        h.revision = kv.mod_revision;
                                        found = Some((h, kv));
                                    }
                                }
                                _ => return,
                            }
                        }
                        found.expect("loop ends with a leader")
                    }
                };
                if tx
                    .send(Ok(LeaderResponse {
                        header: Some(header),
                        kv: Some(kv.clone()),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
                let mut w = match c
                    .watch_from(kv.key.to_vec(), vec![], header.revision + 1)
                    .await
                {
                    Ok(w) => w,
                    Err(e) => {
                        tracing::debug!(error = %e, "observe ended");
                        return;
                    }
                };
                'leader: loop {
                    match w.next().await {
                        Some(Ok(wr)) => {
                            if wr.canceled {
                                return;
                            }
                            for ev in &wr.events {
                                if ev.r#type == EventType::Delete as i32 {
                                    break 'leader;
                                }
                                header = wr.header.unwrap_or_default();
                                if tx
                                    .send(Ok(LeaderResponse {
                                        header: Some(header),
                                        kv: ev.kv.clone(),
                                    }))
                                    .await
                                    .is_err()
                                {
                                    return;
                                }
                            }
                        }
                        _ => return,
                    }
                }
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                () = gone.closed() => {}
                () = observe => {}
            }
        });
        // An Observe of an election with no leader sends no headers until
        // one is elected (a client that waits for them waits as on etcd). A
        // client that goes meanwhile drops this future, and `gone` ends
        // the loop.
        super::headers_with_first(rx).await
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let (md, _, req) = request.into_parts();
        let leader = req.leader.ok_or(ServerError::ElectionMissingLeaderKey)?;
        let mut c = self.v3.client(&md);
        // a session as etcd opens one (lease 0 grants a lease, left to
        // expire), then the delete
        c.session_lease(leader.lease).await?;
        let resp = c
            .txn(TxnRequest {
                compare: vec![cmp_create(&leader.key, leader.rev)],
                success: vec![op_delete(&leader.key)],
                failure: vec![],
            })
            .await?;
        Ok(Response::new(ResignResponse {
            header: resp.header,
        }))
    }
}
