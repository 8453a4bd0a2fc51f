//! Growing a running cluster: a member process that joins with
//! `--initial-cluster-state existing` after a `MemberAdd`.

use std::time::Duration;

use anyhow::{bail, Result};
use etcd_client::Client;

use crate::cluster::{loopback_url, Cluster};
use crate::process::Member;
use crate::retry_until;
use retcd_launch::{free_port, MemberFlags};

impl Cluster {
    /// The `--initial-cluster-token` the cluster was started with.
    pub fn token(&self) -> String {
        let args = self.members[0].args();
        args.iter()
            .position(|a| a == "--initial-cluster-token")
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_default()
    }

    /// Two free loopback ports for a new member: (client, peer).
    pub fn new_ports() -> (u16, u16) {
        (free_port(), free_port())
    }

    /// Adds (without starting it) member `name` that joins the running
    /// cluster: `--initial-cluster initial_cluster` (every member of the
    /// cluster as it is now, this one included, `name=peerURL,…`) and
    /// `--initial-cluster-state existing`, plus `extra_flags`, running the
    /// first member's binary (e.g. etcd 3.5.1 in a cluster started with
    /// [`Cluster::start_with_binary`]). Returns its index in `self.members`.
    pub fn add_joining_member(
        &mut self,
        name: &str,
        client_port: u16,
        peer_port: u16,
        initial_cluster: &str,
        extra_flags: &[&str],
    ) -> usize {
        let dir = self.dir();
        let data_dir = dir.join(format!("{name}.etcd"));
        let (curl, purl) = (loopback_url(client_port), loopback_url(peer_port));
        let mut args = MemberFlags {
            name,
            data_dir: &data_dir,
            client_url: &curl,
            peer_url: &purl,
            advertise_peer_url: &purl,
            initial_cluster,
            token: &self.token(),
            state: "existing",
        }
        .args();
        args.extend(extra_flags.iter().map(|s| s.to_string()));
        let log = dir.join(format!("{name}.log"));
        let bin = match self.members.first() {
            Some(m) => m.binary().to_path_buf(),
            None => self.flavor.binary(),
        };
        self.members.push(Member::new(
            name.into(),
            client_port,
            peer_port,
            bin,
            args,
            data_dir,
            log,
        ));
        self.members.len() - 1
    }

    /// Index of the member process whose peer URL is `url`.
    pub fn index_of_peer_url(&self, url: &str) -> Option<usize> {
        self.members.iter().position(|m| m.peer_url() == url)
    }
}

/// `--initial-cluster` for a member joining now, from `MemberList`: every
/// member's `name=peerURL`, the unnamed (not yet started) member with
/// `new_name` — what `etcdctl member add` prints as ETCD_INITIAL_CLUSTER.
/// Waits (up to 10 s) for a list with the unnamed member: the member that
/// answers may not have applied the add yet.
pub async fn initial_cluster_for(client: &mut Client, new_name: &str) -> Result<String> {
    // Ok(an error) ends the wait at once; Err(a list without it) retries.
    let every = Duration::from_millis(100);
    let listed = retry_until(Duration::from_secs(10), every, async || {
        match client.member_list().await {
            Ok(list) if !list.members().iter().any(|m| m.name().is_empty()) => Err(list),
            r => Ok(r),
        }
    })
    .await;
    let list = match listed {
        Ok(r) => r?,
        Err(last) => last,
    };
    let mut parts = Vec::new();
    for m in list.members() {
        let name = if m.name().is_empty() {
            new_name
        } else {
            m.name()
        };
        for u in m.peer_urls() {
            parts.push(format!("{name}={u}"));
        }
    }
    if parts.is_empty() {
        bail!("empty member list");
    }
    Ok(parts.join(","))
}

/// Retries `MemberAdd` while the cluster answers "unhealthy cluster" (peers
/// must have been connected for 5 s) — at most `timeout`.
pub async fn member_add_when_healthy(
    client: &mut Client,
    peer_url: &str,
    learner: bool,
    timeout: Duration,
) -> std::result::Result<etcd_client::MemberAddResponse, etcd_client::Error> {
    // Err(unhealthy) retries; Ok(any other answer) ends the wait.
    let added = retry_until(timeout, Duration::from_millis(300), async || {
        let opts = learner.then(|| etcd_client::MemberAddOptions::new().with_is_learner());
        match client.member_add([peer_url.to_string()], opts).await {
            Err(e) if e.to_string().contains("unhealthy cluster") => Err(e),
            r => Ok(r),
        }
    })
    .await;
    added.unwrap_or_else(Err)
}
