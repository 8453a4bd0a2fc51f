//! Joining a running cluster (`--initial-cluster-state existing`): this
//! member asks the others for the cluster id and members and finds itself
//! in them (etcd's `GetClusterFromRemotePeers` +
//! `ValidateClusterAndAssignIDs`). Runs during bootstrap, on a blocking
//! thread.

use crate::config::Config;
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
    // one bound for resolving peer URLs' names over every attempt
    let resolve_until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match join_existing_once(cfg, dialer, resolve_until) {
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

fn join_existing_once(
    cfg: &Config,
    dialer: &Dialer,
    resolve_until: std::time::Instant,
) -> anyhow::Result<(u64, u64, Vec<Member>)> {
    // etcd's NewClusterFromURLsMap: the members --initial-cluster names,
    // in ID order (IDs from their URLs and the token)
    let (local, _, _) = crate::apply::membership::initial_cluster(cfg)?;
    let mut existing = fetch_cluster(&cfg.name, &local, dialer, Duration::from_secs(2))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "cannot fetch cluster info from peer urls: could not retrieve cluster information from the given URLs"
            )
        })?;
    // etcd's RaftCluster.Members(): in ID order
    existing.members.sort_by_key(|m| m.id);
    // etcd's ValidateClusterAndAssignIDs: as many members, and each of the
    // cluster's matched by its peer URLs (names resolved) to one named in
    // --initial-cluster, whose ID it gives.
    let invalid = |why: String| {
        anyhow::anyhow!(
            "error validating peerURLs {}: {why}",
            cluster_string(&existing)
        )
    };
    if existing.members.len() != local.len() {
        return Err(invalid("member count is unequal".into()));
    }
    let mut own = None;
    for em in &existing.members {
        let mut last = "<nil>".to_string();
        let found = local.iter().find(|lm| {
            match crate::config::urls_equal_until(&em.peer_urls, &lm.peer_urls, resolve_until) {
                Ok(()) => true,
                Err(e) => {
                    last = e;
                    false
                }
            }
        });
        match found {
            Some(lm) if lm.name == cfg.name => own = Some(em),
            Some(_) => {}
            None => {
                return Err(invalid(format!(
                    "PeerURLs: no match found for existing member ({}, [{}]), last resolver error ({last})",
                    Hex(em.id),
                    em.peer_urls.join(" ")
                )))
            }
        }
    }
    let own = own.ok_or_else(|| {
        invalid(format!(
            "PeerURLs: no existing member matches {}'s",
            retcd_gostd::strconv::quote(&cfg.name)
        ))
    })?;
    if !own.client_urls.is_empty() {
        anyhow::bail!("member {} has already been bootstrapped", Hex(own.id));
    }
    let own_id = own.id;
    Ok((existing.cluster_id, own_id, existing.members))
}

/// etcd's `RaftCluster.String()` of a fetched cluster (its members as Go's
/// `%+v`, in the order given: etcd's map gives any).
fn cluster_string(c: &retcd_api::retcdpb::MembersResponse) -> String {
    let ms: Vec<String> = c
        .members
        .iter()
        .map(|m| {
            format!(
                "&{{ID:{} RaftAttributes:{{PeerURLs:[{}] IsLearner:{}}} Attributes:{{Name:{} ClientURLs:[{}]}}}}",
                Hex(m.id),
                m.peer_urls.join(" "),
                m.is_learner,
                m.name,
                m.client_urls.join(" ")
            )
        })
        .collect();
    format!(
        "{{ClusterID:{} Members:[{}] RemovedMemberIDs:[]}}",
        Hex(c.cluster_id),
        ms.join(" ")
    )
}

/// etcd's `getClusterFromRemotePeers`: the cluster as the first of the
/// members of `local` other than `own_name` (their peer URLs in
/// lexicographic order) that answers `RaftPeer/Members` within `timeout`
/// tells it. Runs on a blocking thread of the runtime.
fn fetch_cluster(
    own_name: &str,
    local: &[Member],
    dialer: &Dialer,
    timeout: Duration,
) -> Option<retcd_api::retcdpb::MembersResponse> {
    let mut peer_urls: Vec<String> = local
        .iter()
        .filter(|m| m.name != own_name)
        .flat_map(|m| m.peer_urls.clone())
        .collect();
    peer_urls.sort();
    let dialer = dialer.clone();
    let fetch = async move {
        for url in &peer_urls {
            let dial = match dialer.peer(url) {
                Ok(d) => {
                    d.configure(|ep| ep.connect_timeout(Duration::from_secs(1)).timeout(timeout))
                }
                Err(_) => continue,
            };
            let Ok(ch) = dial.connect().await else {
                continue;
            };
            if let Ok(r) = RaftPeerClient::new(ch).members(MembersRequest {}).await {
                let r = r.into_inner();
                // an empty list is no cluster (etcd: "failed to get raft
                // cluster member(s)")
                return (!r.members.is_empty()).then_some(r);
            }
        }
        None
    };
    tokio::runtime::Handle::current().block_on(fetch)
}

/// etcd's `isMemberBootstrapped`: whether a member of the cluster (`local`:
/// the members --initial-cluster names) already
/// has this member's ID and has published client URLs, i.e. this member
/// ran before and has lost its data dir. Bootstrapping it again would
/// forget its log and its votes; etcd refuses, and so does retcd. Each
/// peer asked gets 1 s (etcd's default bootstrap timeout).
pub fn is_member_bootstrapped(
    cfg: &Config,
    local: &[Member],
    dialer: &Dialer,
    member_id: u64,
) -> bool {
    fetch_cluster(&cfg.name, local, dialer, Duration::from_secs(1)).is_some_and(|c| {
        c.members
            .iter()
            .any(|m| m.id == member_id && !m.client_urls.is_empty())
    })
}
