//! A cluster of N member processes on loopback.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use etcd_client::{Client, ConnectOptions};
use tempfile::TempDir;

use crate::binaries::Flavor;
use crate::etcdctl::{etcdctl, etcdctl_with_stdin, Output};
use crate::process::Member;
use retcd_launch::{free_port, initial_cluster, MemberFlags, NotReady};

/// How long [`Cluster::start`] waits for every member to serve.
pub const START_TIMEOUT: Duration = crate::timing::READY;

/// N members started with etcd's flags, data dirs and logs in one temp dir.
/// Dropping the cluster SIGKILLs every process it started; when the thread
/// is panicking it first prints every member's log tail (and keeps the temp
/// dir when `RETCD_TEST_KEEP=1`).
pub struct Cluster {
    pub flavor: Flavor,
    pub members: Vec<Member>,
    dir: Option<TempDir>,
}

impl Cluster {
    /// Starts `n` members of `flavor` with
    /// `--name m{i} --data-dir D --listen-client-urls … --advertise-client-urls …
    /// --listen-peer-urls … --initial-advertise-peer-urls … --initial-cluster …
    /// --initial-cluster-token T --initial-cluster-state new` plus `extra_flags`,
    /// and waits (bounded by [`START_TIMEOUT`]) until every member answers
    /// `Status` and knows a leader.
    pub async fn start(flavor: Flavor, n: usize, extra_flags: &[&str]) -> Result<Cluster> {
        let mut c = Cluster::create(flavor, n, extra_flags)?;
        c.start_all().await?;
        Ok(c)
    }

    /// The cluster [`Cluster::start`] starts, with no member started yet:
    /// a test can put data into a member's (empty) `data_dir` first, e.g.
    /// a data dir written by an older build. Start it with
    /// [`Cluster::start_all`].
    pub fn create(flavor: Flavor, n: usize, extra_flags: &[&str]) -> Result<Cluster> {
        Cluster::create_with_binary(flavor, flavor.binary(), n, extra_flags)
    }

    /// [`Cluster::start`] with another server binary of `flavor` (e.g.
    /// [`crate::etcd351_bin`], etcd 3.5.1 instead of the Debian 3.4.23 one).
    pub async fn start_with_binary(
        flavor: Flavor,
        bin: PathBuf,
        n: usize,
        extra_flags: &[&str],
    ) -> Result<Cluster> {
        let mut c = Cluster::create_with_binary(flavor, bin, n, extra_flags)?;
        c.start_all().await?;
        Ok(c)
    }

    /// [`Cluster::create`] with the server binary `bin`.
    pub fn create_with_binary(
        flavor: Flavor,
        bin: PathBuf,
        n: usize,
        extra_flags: &[&str],
    ) -> Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("retcd-test-{}-", flavor.name()))
            .tempdir()
            .context("create temp dir")?;
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial_cluster = initial_cluster(
            (ports.iter().enumerate()).map(|(i, (_, p))| (format!("m{i}"), loopback_url(*p))),
        );
        let token = format!(
            "tok-{}-{}",
            std::process::id(),
            dir.path().file_name().unwrap_or_default().to_string_lossy()
        );
        let mut members = Vec::with_capacity(n);
        for (i, (cport, pport)) in ports.iter().copied().enumerate() {
            let name = format!("m{i}");
            let data_dir = dir.path().join(format!("{name}.etcd"));
            let (curl, purl) = (loopback_url(cport), loopback_url(pport));
            let mut args = MemberFlags {
                name: &name,
                data_dir: &data_dir,
                client_url: &curl,
                peer_url: &purl,
                advertise_peer_url: &purl,
                initial_cluster: &initial_cluster,
                token: &token,
                state: "new",
            }
            .args();
            args.extend(extra_flags.iter().map(|s| s.to_string()));
            let log = dir.path().join(format!("{name}.log"));
            members.push(Member::new(
                name,
                cport,
                pport,
                bin.clone(),
                args,
                data_dir,
                log,
            ));
        }
        Ok(Cluster {
            flavor,
            members,
            dir: Some(dir),
        })
    }

    /// Starts every member and waits (bounded by [`START_TIMEOUT`]) until
    /// each answers `Status` and knows a leader.
    pub async fn start_all(&mut self) -> Result<()> {
        for m in self.members.iter_mut() {
            m.start();
        }
        self.wait_all_ready(START_TIMEOUT).await
    }

    /// A cluster of members built elsewhere in the harness (e.g. behind
    /// peer proxies, see `crate::robustness`), owning `dir`.
    pub(crate) fn from_parts(flavor: Flavor, members: Vec<Member>, dir: TempDir) -> Cluster {
        Cluster {
            flavor,
            members,
            dir: Some(dir),
        }
    }

    /// The temp dir holding data dirs and logs.
    pub fn dir(&self) -> PathBuf {
        self.dir
            .as_ref()
            .map(|d| d.path().to_path_buf())
            .unwrap_or_default()
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint()).collect()
    }

    /// A client of member `i` alone (1 s connect, 5 s request timeout).
    pub async fn client(&self, i: usize) -> Result<Client> {
        connect(&[self.members[i].endpoint()]).await
    }

    /// A plain gRPC channel to member `i` (for the generated clients,
    /// where a test looks at what etcd-client hides: headers, raw
    /// requests).
    pub async fn channel(&self, i: usize) -> Result<tonic::transport::Channel> {
        Ok(
            tonic::transport::Channel::from_shared(self.members[i].endpoint())?
                .connect()
                .await?,
        )
    }

    /// A client balanced over the given members.
    pub async fn client_of(&self, idx: &[usize]) -> Result<Client> {
        let eps: Vec<String> = idx.iter().map(|&i| self.members[i].endpoint()).collect();
        connect(&eps).await
    }

    /// A client balanced over every member.
    pub async fn client_all(&self) -> Result<Client> {
        connect(&self.endpoints()).await
    }

    /// `(member_id, leader_id)` from member `i`'s `Status`.
    pub async fn status_of(&self, i: usize) -> Result<(u64, u64)> {
        let mut c = self.client(i).await?;
        let st = c.status().await?;
        let id = st.header().map(|h| h.member_id()).unwrap_or(0);
        Ok((id, st.leader()))
    }

    /// Waits until member `i` answers `Status` with a non-zero leader
    /// (see [`retcd_launch::Process::wait_ready`]); fails at once if it is
    /// not running or exits meanwhile.
    pub async fn wait_member_ready(&mut self, i: usize, timeout: Duration) -> Result<()> {
        let m = &mut self.members[i];
        let endpoint = m.endpoint();
        let res = match m.process_mut() {
            None => Err(format!("{} is not running", m.name)),
            Some(p) => match p.wait_ready(&endpoint, timeout, REQUEST_TIMEOUT).await {
                Ok(()) => Ok(()),
                Err(NotReady::Exited(st)) => Err(format!("{} exited ({st})", m.name)),
                Err(e) => Err(e.to_string()),
            },
        };
        res.map_err(|e| {
            // Forgets an exited process (so it can be started again).
            m.is_running();
            anyhow!(
                "{} not ready (waited at most {timeout:?}): {e}\n--- log tail of {}:\n{}",
                m.name,
                m.name,
                m.log_tail(4000)
            )
        })
    }

    /// Waits until every running member is ready (see [`Self::wait_member_ready`]).
    pub async fn wait_all_ready(&mut self, timeout: Duration) -> Result<()> {
        for i in 0..self.members.len() {
            self.wait_member_ready(i, timeout).await?;
        }
        Ok(())
    }

    /// Restarts member `i` (same flags and data dir) and waits until it is ready.
    pub async fn restart_member(&mut self, i: usize, timeout: Duration) -> Result<()> {
        self.members[i].restart();
        self.wait_member_ready(i, timeout).await
    }

    /// Index of the member that a running member (and the leader itself)
    /// reports as leader: `Status.leader == header.member_id`.
    pub async fn leader_once(&mut self) -> Result<usize> {
        let mut ids = Vec::new();
        for i in 0..self.members.len() {
            if !self.members[i].is_running() {
                ids.push(None);
                continue;
            }
            ids.push(self.status_of(i).await.ok());
        }
        for (i, st) in ids.iter().enumerate() {
            if let Some((id, leader)) = st {
                if *leader != 0 && id == leader {
                    return Ok(i);
                }
            }
        }
        bail!("no running member is leader; statuses (member_id, leader): {ids:?}")
    }

    /// Waits (bounded) until some running member is leader; returns its index.
    pub async fn leader(&mut self, timeout: Duration) -> Result<usize> {
        let every = Duration::from_millis(50);
        match crate::retry_until(timeout, every, async || self.leader_once().await).await {
            Ok(i) => Ok(i),
            Err(e) => Err(e.context(format!(
                "no leader within {timeout:?}\n{}",
                self.log_tails(3000)
            ))),
        }
    }

    /// `etcdctl` against every member's endpoint.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        etcdctl(&self.endpoints(), args)
    }

    /// `etcdctl` with `stdin` (e.g. the interactive `txn` form).
    pub fn etcdctl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        etcdctl_with_stdin(&self.endpoints(), args, Some(stdin))
    }

    /// The last `max_bytes` of every member's log, labelled.
    pub fn log_tails(&self, max_bytes: u64) -> String {
        let mut s = String::new();
        for m in &self.members {
            s.push_str(&format!(
                "----- {} log tail ({}):\n{}\n",
                m.name,
                m.log_path().display(),
                m.log_tail(max_bytes)
            ));
        }
        s
    }
}

/// How long a harness client waits for an answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `http://127.0.0.1:<port>`.
pub fn loopback_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// Connects an etcd-client to `endpoints` (1 s connect, 5 s per request).
pub async fn connect(endpoints: &[String]) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(REQUEST_TIMEOUT);
    Ok(Client::connect(endpoints, Some(opts)).await?)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        if panicking {
            eprintln!(
                "===== test failed; {} cluster in {}",
                self.flavor.name(),
                self.dir().display()
            );
            eprintln!("{}", self.log_tails(6000));
        }
        for m in self.members.iter_mut() {
            m.kill();
        }
        if panicking && std::env::var("RETCD_TEST_KEEP").is_ok_and(|v| v == "1") {
            if let Some(d) = self.dir.take() {
                let p = d.keep();
                eprintln!("kept {}", p.display());
            }
        }
    }
}
