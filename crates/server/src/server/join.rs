//! Joining a running cluster (`--initial-cluster-state existing`): this
//! member asks the others for the cluster id and members and finds itself
//! in them (etcd's `GetClusterFromRemotePeers` +
//! `ValidateClusterAndAssignIDs`). Runs during bootstrap, on a blocking
//! thread.

use crate::config::{split_urls, Config};
use crate::ids::Hex;
use crate::tls::Dialer;
use retcd_api::retcdpb::raft_peer_client::RaftPeerClient;
use retcd_api::retcdpb::{Member, MembersRequest};
use std::time::Duration;

/// `--initial-cluster-state existing`: asks the other members named in
/// `--initial-cluster` for the cluster (`RaftPeer/Members`) and finds this
/// member in it by its peer URLs (etcd's `GetClusterFromRemotePeers` +
/// `ValidateClusterAndAssignIDs`). Returns (cluster id, member id, members).
///
/// The peer asked may not have applied the `MemberAdd` (or a removal) yet:
/// a mismatch is retried for a few seconds before giving up.
pub fn join_existing(cfg: &Config, dialer: &Dialer) -> anyhow::Result<(u64, u64, Vec<Member>)> {
    let mut attempt = 0;
    loop {
        match join_existing_once(cfg, dialer) {
            Ok(r) => return Ok(r),
            Err(e) if attempt < 10 => {
                tracing::warn!(error = %e, "cannot join the cluster yet; retrying");
                attempt += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e),
        }
    }
}

fn join_existing_once(cfg: &Config, dialer: &Dialer) -> anyhow::Result<(u64, u64, Vec<Member>)> {
    let initial = cfg.initial_members().map_err(anyhow::Error::msg)?;
    let mut own_urls = split_urls(&cfg.initial_advertise_peer_urls);
    own_urls.sort();
    let peer_urls: Vec<String> = initial
        .iter()
        .filter(|m| m.name != cfg.name)
        .flat_map(|m| m.peer_urls.clone())
        .collect();
    let fetch = async move {
        for url in &peer_urls {
            let dial = match dialer.peer(url) {
                Ok(d) => d.configure(|ep| {
                    ep.connect_timeout(Duration::from_secs(1))
                        .timeout(Duration::from_secs(2))
                }),
                Err(_) => continue,
            };
            let Ok(ch) = dial.connect().await else {
                continue;
            };
            if let Ok(r) = RaftPeerClient::new(ch).members(MembersRequest {}).await {
                return Some(r.into_inner());
            }
        }
        None
    };
    // Bootstrap runs on a blocking thread of the runtime.
    let resp = tokio::runtime::Handle::current()
        .block_on(fetch)
        .ok_or_else(|| {
        anyhow::anyhow!(
            "cannot fetch cluster info from peer urls: could not retrieve cluster information from the given URLs"
        )
    })?;
    if resp.members.len() != initial.len() {
        anyhow::bail!(
            "error validating peerURLs {{ClusterID:{} Members:[{}]}}: member count is unequal",
            Hex(resp.cluster_id),
            resp.members
                .iter()
                .map(|m| format!("{}={:?}", Hex(m.id), m.peer_urls))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let own = resp
        .members
        .iter()
        .find(|m| {
            let mut u = m.peer_urls.clone();
            u.sort();
            u == own_urls
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "error validating peerURLs: unmatched member while checking PeerURLs ({own_urls:?} is not a member of cluster {})",
                Hex(resp.cluster_id)
            )
        })?;
    if !own.client_urls.is_empty() {
        anyhow::bail!("member {} has already been bootstrapped", Hex(own.id));
    }
    let mut members = resp.members.clone();
    members.sort_by_key(|m| m.id);
    Ok((resp.cluster_id, own.id, members))
}
