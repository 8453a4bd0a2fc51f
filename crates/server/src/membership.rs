//! The member list: bootstrap from `--initial-cluster`, persisted in the
//! backend's `members` table, and each member's name and client URLs
//! published through raft when it starts (etcd's publish), so every member
//! lists every other member's client URLs.

use crate::apply::ApplyResult;
use crate::config::split_urls;
use crate::server::{EtcdServer, Shared};
use prost::Message as _;
use redb::{ReadableDatabase, ReadableTable};
use retcd_api::retcdpb::{InternalRaftRequest, Member, MemberAttributes};
use retcd_mvcc::{MvccError, WriteBatch};
use retcd_storage::backend::{Backend, MEMBERS};
use std::sync::Arc;
use std::time::Duration;

/// Members stored in the backend (empty on a new member).
pub fn load(backend: &Backend) -> anyhow::Result<Vec<Member>> {
    let txn = backend.db().begin_read()?;
    let table = txn.open_table(MEMBERS)?;
    let mut out = Vec::new();
    for entry in table.iter()? {
        let (_, v) = entry?;
        out.push(Member::decode(v.value())?);
    }
    Ok(out)
}

/// Applies a publish: updates the member in memory and in the batch's
/// backend transaction. Unknown members are ignored (removed meanwhile).
pub fn apply_attributes(
    shared: &Shared,
    batch: &mut WriteBatch<'_>,
    attrs: MemberAttributes,
) -> Result<ApplyResult, MvccError> {
    let mut members = shared.members.write();
    if let Some(m) = members.iter_mut().find(|m| m.id == attrs.member_id) {
        m.name = attrs.name;
        m.client_urls = attrs.client_urls;
    }
    let mut table = batch.backend_txn().open_table(MEMBERS)?;
    for m in members.iter() {
        table.insert(m.id, m.encode_to_vec().as_slice())?;
    }
    Ok(ApplyResult::Empty)
}

/// Publishes this member's attributes once a leader exists; retries until
/// the publish is applied (or the server stops).
pub async fn publish(server: Arc<EtcdServer>) {
    let attrs = MemberAttributes {
        member_id: server.member_id,
        name: server.cfg.name.clone(),
        client_urls: split_urls(&server.cfg.advertise_client_urls),
    };
    loop {
        if server.leader() != 0 {
            let req = InternalRaftRequest {
                member_attributes: Some(attrs.clone()),
                ..Default::default()
            };
            match server.propose(req).await {
                Ok(_) => {
                    tracing::info!(name = %attrs.name, client_urls = ?attrs.client_urls, "published local member to cluster");
                    return;
                }
                Err(crate::error::ServerError::Stopped) => return,
                Err(e) => tracing::debug!(error = %e, "publish failed; retrying"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
