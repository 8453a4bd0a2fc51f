//! The robustness runner: a cluster whose peer traffic goes through
//! [`retcd_robustness::proxy::Proxy`]s (optionally running the failpoints
//! build of retcd), seeded traffic and watchers recording a history while a
//! scenario injects faults, then the checks. See `docs/robustness.md`.
//!
//! A scenario is written as
//! ```text
//! let mut run = Run::start("kill_leader", opts, 1).await;
//! while run.running(Duration::from_secs(8)) { /* faults, using run.rng */ }
//! run.finish().await.assert_ok();
//! ```

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use etcd_client::GetOptions;
use rand::rngs::StdRng;
use retcd_robustness::checks::{self, RunRecord};
use retcd_robustness::history::{History, Operation, Request};
use retcd_robustness::lease::{self, LeaseConfig, LeaseKeeper};
use retcd_robustness::linearizability;
use retcd_robustness::proxy::Proxy;
use retcd_robustness::seed;
use retcd_robustness::traffic::{self, Clock, TrafficConfig, TrafficStats, WatcherConfig};
use retcd_robustness::watch::{self, Filter, WatchRecord};
use tokio::task::JoinHandle;

use crate::binaries::{workspace_root, Flavor};
use crate::cluster::Cluster;
use crate::netns::NetLab;
use crate::power::PowerDisk;
use crate::process::Member;
use retcd_launch::{free_port, initial_cluster, MemberFlags};

use crate::timing::FAST;

/// The `retcd-failpoints` binary (the server with `--features failpoints`):
/// `$RETCD_FAILPOINTS_BIN`, which scripts/test.sh builds before the tests,
/// or else built once per test process into `target/failpoints` (a second
/// target dir: the running `cargo test` holds the first one's lock).
pub fn failpoints_retcd_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("RETCD_FAILPOINTS_BIN") {
            return Ok(PathBuf::from(p));
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let root = workspace_root();
        let status = Command::new(cargo)
            .args([
                "build",
                "-p",
                "retcd-server",
                "--bin",
                "retcd-failpoints",
                "--features",
                "failpoints",
                "--target-dir",
                "target/failpoints",
            ])
            .current_dir(&root)
            .status()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        if !status.success() {
            return Err(format!("building the failpoints retcd failed: {status}"));
        }
        Ok(root.join("target/failpoints/debug/retcd-failpoints"))
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// How the cluster of a run is started.
#[derive(Clone, Debug)]
pub struct Options {
    pub flavor: Flavor,
    pub members: usize,
    pub flags: Vec<String>,
    /// Put a [`Proxy`] in front of every peer port.
    pub proxies: bool,
    /// Every member's data dir on its own ext4 image of this many bytes,
    /// which [`RbCluster::power_loss`] switches off ([`PowerDisk`]).
    pub power_disks: Option<u64>,
    /// Each member on its own namespaced host ([`NetLab`]; needs root);
    /// faults through [`RbCluster::net`].
    pub netns: bool,
    /// Run the failpoints build (retcd only); failpoints are set per member
    /// with [`RbCluster::set_failpoints`] and apply from the next start.
    pub failpoints: bool,
    /// Run each member under libfiu's POSIX preload (`fiu-run -x`, Debian's
    /// fiu-utils): I/O errors at random through [`RbCluster::io_faults`]
    /// on the running member, or from its next start with
    /// [`RbCluster::set_start_io_faults`]. retcd only: etcd's Go binary
    /// makes its system calls without libc, where the preload cannot reach.
    pub fiu: bool,
    pub traffic: TrafficConfig,
    /// Watchers: (filter, prev_kv); each watches the traffic prefix.
    pub watchers: Vec<(Filter, bool)>,
    /// The members the traffic clients talk to (default: all).
    pub traffic_members: Option<Vec<usize>>,
    /// Run the lease client (keepalives through the faults, expiry after)
    /// and the lease check ([`retcd_robustness::lease`]).
    pub lease_check: bool,
    /// (member, bytes): that member's data dir is a tmpfs of this size
    /// (mounted before it starts, unmounted when the cluster is dropped).
    pub small_disk: Option<(usize, u64)>,
}

impl Options {
    pub fn new(flavor: Flavor, members: usize) -> Options {
        Options {
            flavor,
            members,
            flags: FAST.iter().map(|s| s.to_string()).collect(),
            proxies: false,
            netns: false,
            power_disks: None,
            failpoints: false,
            fiu: false,
            traffic: TrafficConfig::default(),
            watchers: vec![
                (Filter::None, true),
                (Filter::None, false),
                (Filter::NoDelete, true),
            ],
            traffic_members: None,
            lease_check: false,
            small_disk: None,
        }
    }

    /// Member `i`'s data dir on its own tmpfs of `bytes` (needs root; the
    /// run fails if it cannot be mounted).
    pub fn with_small_disk(mut self, i: usize, bytes: u64) -> Options {
        self.small_disk = Some((i, bytes));
        self
    }

    /// Adds the lease client and the lease check.
    pub fn with_lease_check(mut self) -> Options {
        self.lease_check = true;
        self
    }

    /// The `--election-timeout` of the flags (etcd's default 1 s otherwise).
    pub fn election_timeout(&self) -> Duration {
        let ms = self
            .flags
            .iter()
            .position(|f| f == "--election-timeout")
            .and_then(|i| self.flags.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        Duration::from_millis(ms)
    }

    pub fn with_proxies(mut self) -> Options {
        self.proxies = true;
        self
    }

    /// Every member in its own network namespace ([`NetLab`]).
    pub fn with_netns(mut self) -> Options {
        assert!(!self.proxies, "netns and proxies do not mix");
        self.netns = true;
        self
    }

    /// Every member's data dir on a [`PowerDisk`] (1 GiB, sparse).
    pub fn with_power_disks(mut self) -> Options {
        self.power_disks = Some(1 << 30);
        self
    }

    /// Every member under libfiu ([`Options::fiu`]).
    pub fn with_fiu(mut self) -> Options {
        assert_eq!(
            self.flavor,
            Flavor::Retcd,
            "libfiu cannot reach etcd's Go binary"
        );
        self.fiu = true;
        self
    }

    pub fn with_failpoints(mut self) -> Options {
        self.failpoints = true;
        self
    }

    /// Adds flags; retcd-only flags are dropped for real etcd 3.4.
    pub fn flags(mut self, flags: &[&str]) -> Options {
        let mut it = flags.iter();
        while let Some(f) = it.next() {
            if self.flavor == Flavor::Etcd && *f == "--experimental-snapshot-catchup-entries" {
                it.next();
                continue;
            }
            self.flags.push(f.to_string());
        }
        self
    }
}

/// The cluster of a run: members, their proxies (when asked for), and the
/// failpoint files the failpoints build reads at start.
pub struct RbCluster {
    pub cluster: Cluster,
    pub proxies: Vec<Proxy>,
    /// The namespaced hosts of [`Options::with_netns`] (dropped after the
    /// members are killed).
    pub net: Option<NetLab>,
    fp_files: Vec<PathBuf>,
    /// Per member: libfiu's control FIFO prefix and the file of commands
    /// its next start runs ([`Options::fiu`]; empty without it).
    fiu: Vec<(PathBuf, PathBuf)>,
    pub paused: Vec<bool>,
    mounts: Vec<TmpfsMount>,
    /// The members' power disks (empty without [`Options::with_power_disks`]).
    pub disks: Vec<PowerDisk>,
}

/// A tmpfs mounted for a test; unmounted (lazily) when dropped, also when
/// the test fails.
pub struct TmpfsMount {
    pub path: PathBuf,
}

impl TmpfsMount {
    /// Mounts a tmpfs of `bytes` on `path` (created if missing).
    pub fn mount(path: &std::path::Path, bytes: u64) -> Result<TmpfsMount> {
        std::fs::create_dir_all(path).with_context(|| format!("create {}", path.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(path)
            .output()
            .context("run mount")?;
        if !out.status.success() {
            bail!(
                "mount -t tmpfs on {} failed ({}): {} (the disk-full scenario needs root)",
                path.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        eprintln!(
            "robustness: tmpfs of {bytes} bytes mounted on {}",
            path.display()
        );
        Ok(TmpfsMount {
            path: path.to_path_buf(),
        })
    }

    /// Bytes available to unprivileged writers.
    pub fn available(&self) -> Result<u64> {
        let out = Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&self.path)
            .output()
            .context("run df")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .with_context(|| format!("df output: {text}"))
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        match Command::new("umount").arg("-l").arg(&self.path).status() {
            Ok(st) if st.success() => {
                eprintln!("robustness: tmpfs on {} unmounted", self.path.display())
            }
            other => eprintln!(
                "robustness: umount {} failed: {other:?}",
                self.path.display()
            ),
        }
    }
}

impl Drop for RbCluster {
    fn drop(&mut self) {
        // Members first, so nothing writes to a tmpfs being unmounted; the
        // mounts go before the temp dir is removed.
        for m in self.cluster.members.iter_mut() {
            m.kill();
        }
        self.mounts.clear();
        self.disks.clear();
        self.net = None;
    }
}

impl RbCluster {
    pub async fn start(opts: &Options, seed: u64) -> Result<RbCluster> {
        let n = opts.members;
        let dir = tempfile::Builder::new()
            .prefix(&format!("retcd-robustness-{}-", opts.flavor.name()))
            .tempdir()
            .context("create temp dir")?;
        let net = if opts.netns {
            Some(NetLab::new(n)?)
        } else {
            None
        };
        // A member's address: its own host's, or loopback.
        let host = |i: usize| match &net {
            Some(lab) => lab.hosts[i].ip.to_string(),
            None => "127.0.0.1".to_string(),
        };
        let url = |i: usize, port: u16| format!("http://{}:{port}", host(i));
        // (client, listen peer, advertised peer); a namespaced host has its
        // own ports, etcd's defaults
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| {
                if opts.netns {
                    return (2379, 2380, 2380);
                }
                let (c, p) = (free_port(), free_port());
                (c, p, if opts.proxies { free_port() } else { p })
            })
            .collect();
        let mut proxies = Vec::new();
        if opts.proxies {
            for (i, (_, p, a)) in ports.iter().enumerate() {
                let target = format!("127.0.0.1:{p}").parse().expect("addr");
                proxies.push(Proxy::start(*a, target, seed.wrapping_add(i as u64)).await?);
            }
        }
        let initial_cluster = initial_cluster(
            (ports.iter().enumerate()).map(|(i, (_, _, a))| (format!("m{i}"), url(i, *a))),
        );
        let token = format!("rb-{}-{}", std::process::id(), seed);
        let server = if opts.failpoints {
            assert_eq!(opts.flavor, Flavor::Retcd, "failpoints need retcd");
            failpoints_retcd_bin()
        } else {
            opts.flavor.binary()
        };
        let mut members = Vec::new();
        let mut fp_files = Vec::new();
        let mut fiu = Vec::new();
        let mut mounts = Vec::new();
        let mut disks = Vec::new();
        for (i, (c, p, a)) in ports.iter().copied().enumerate() {
            let data_dir = dir.path().join(format!("m{i}.etcd"));
            if let Some(bytes) = opts.power_disks {
                disks.push(PowerDisk::new(&data_dir, bytes)?);
            }
            if let Some((m, bytes)) = opts.small_disk {
                if m == i {
                    mounts.push(TmpfsMount::mount(&data_dir, bytes)?);
                }
            }
            let (curl, purl, apurl) = (url(i, c), url(i, p), url(i, a));
            let mut flags = MemberFlags {
                name: &format!("m{i}"),
                data_dir: &data_dir,
                client_url: &curl,
                peer_url: &purl,
                advertise_peer_url: &apurl,
                initial_cluster: &initial_cluster,
                token: &token,
                state: "new",
            }
            .args();
            flags.extend(opts.flags.iter().cloned());
            let fp = dir.path().join(format!("m{i}.failpoints"));
            let (bin, args) = if opts.failpoints {
                // sh reads the member's failpoint file at every start and
                // execs retcd (same PID, so kill-by-PID still works).
                let script = format!(
                    "f=$(cat '{}' 2>/dev/null); if [ -n \"$f\" ]; then export FAILPOINTS=\"$f\"; echo \"failpoints: $f\"; fi; exec '{}' \"$@\"",
                    fp.display(),
                    server.display()
                );
                let mut args = vec!["-c".to_string(), script, "retcd".to_string()];
                args.extend(flags);
                (PathBuf::from("/bin/sh"), args)
            } else {
                (server.clone(), flags)
            };
            fp_files.push(fp);
            let (bin, args) = if opts.fiu {
                // fiu-run execs retcd with the preload (same PID); sh adds
                // the start commands of the member's file, if any.
                let ctl = dir.path().join(format!("m{i}.fiu-ctl"));
                let cmds = dir.path().join(format!("m{i}.fiu-start"));
                let script = format!(
                    "c=$(cat '{}' 2>/dev/null); [ -n \"$c\" ] && echo \"libfiu at start: $c\"; exec fiu-run -x -f '{}' ${{c:+-c \"$c\"}} \"$@\"",
                    cmds.display(),
                    ctl.display()
                );
                let mut a = vec!["-c".to_string(), script, "fiu".to_string()];
                a.push(bin.display().to_string());
                a.extend(args);
                fiu.push((ctl, cmds));
                (PathBuf::from("/bin/sh"), a)
            } else {
                (bin, args)
            };
            let (bin, args) = match &net {
                Some(lab) => lab.wrap(i, &bin, args),
                None => (bin, args),
            };
            members.push(
                Member::new(
                    format!("m{i}"),
                    c,
                    p,
                    bin,
                    args,
                    data_dir,
                    dir.path().join(format!("m{i}.log")),
                )
                .with_host(host(i)),
            );
        }
        let mut cluster = Cluster::from_parts(opts.flavor, members, dir);
        for m in cluster.members.iter_mut() {
            m.start();
        }
        cluster
            .wait_all_ready(crate::cluster::START_TIMEOUT)
            .await?;
        Ok(RbCluster {
            cluster,
            proxies,
            net,
            fp_files,
            fiu,
            paused: vec![false; n],
            mounts,
            disks,
        })
    }

    pub fn len(&self) -> usize {
        self.cluster.members.len()
    }

    /// The small disk of [`Options::with_small_disk`].
    pub fn small_disk(&self) -> &TmpfsMount {
        self.mounts.first().expect("no small disk in this cluster")
    }

    /// Fills the small disk with a filler file until `leave` bytes are
    /// left (a later call adds to the same file; a disk found full before
    /// that is full enough); the bytes it meant to write.
    pub fn fill_small_disk(&self, leave: u64) -> Result<u64> {
        use std::io::Write;
        let m = self.small_disk();
        let avail = m.available()?;
        let n = avail.saturating_sub(leave);
        // appended to: a second call tops the filler up
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.path.join("rb-filler"))?;
        let chunk = vec![0xa5u8; 1 << 20];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len() as u64) as usize;
            match f.write_all(&chunk[..k]) {
                // the member took the last bytes first: full is the aim
                Err(e) if e.raw_os_error() == Some(28) => break,
                r => r?,
            }
            left -= k as u64;
        }
        f.sync_all()?;
        eprintln!(
            "robustness: fault: small disk filled: {n} of {avail} available bytes taken, {} left",
            m.available()?
        );
        Ok(n)
    }

    /// Removes the filler file again.
    pub fn free_small_disk(&self) -> Result<()> {
        let m = self.small_disk();
        std::fs::remove_file(m.path.join("rb-filler"))?;
        eprintln!(
            "robustness: small disk freed: {} bytes available",
            m.available()?
        );
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Failpoints (`fail` syntax, e.g. `raft_after_save_wal=40*off->return`)
    /// member `i` gets from its next start; `""` clears them.
    pub fn set_failpoints(&self, i: usize, spec: &str) {
        std::fs::write(&self.fp_files[i], spec).expect("write failpoint file");
    }

    /// Tells member `i`'s libfiu (now) to fail each of `points` (e.g.
    /// `posix/io/sync/fdatasync`) with probability `p`; `p == 0.0`
    /// disables them. Bounded: a member that died does not hang the test.
    pub fn io_faults(&self, i: usize, points: &[&str], p: f64) -> Result<()> {
        let (ctl, _) = self.fiu.get(i).context("not a libfiu cluster")?;
        let pid = self.cluster.members[i]
            .pid()
            .context("member not running")?;
        let mut cmd = Command::new("timeout");
        cmd.args(["5", "fiu-ctrl", "-f"]).arg(ctl);
        for pt in points {
            let c = if p > 0.0 {
                format!("enable_random name={pt},probability={p}")
            } else {
                format!("disable name={pt}")
            };
            cmd.args(["-c", &c]);
        }
        let out = cmd.arg(pid.to_string()).output().context("run fiu-ctrl")?;
        // fiu-ctrl exits 0 even when a command fails; it says so
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || said.to_ascii_lowercase().contains("error") {
            bail!("fiu-ctrl for m{i} failed ({}): {said}", out.status);
        }
        Ok(())
    }

    /// libfiu commands (`fiu-run -c` syntax, e.g. `enable_random
    /// name=posix/io/rw/pread,probability=0.05`) member `i` runs from its
    /// next start; `""` clears them.
    pub fn set_start_io_faults(&self, i: usize, cmd: &str) {
        let (_, f) = self.fiu.get(i).expect("not a libfiu cluster");
        std::fs::write(f, cmd).expect("write the libfiu start file");
    }

    pub async fn leader(&mut self) -> Result<usize> {
        self.cluster.leader(Duration::from_secs(15)).await
    }

    /// Moves leadership to member `i` (MoveLeader sent to the leader),
    /// retrying for a few seconds; whether `i` leads afterwards.
    pub async fn move_leader_to(&mut self, i: usize) -> bool {
        let eps = self.cluster.endpoints();
        for _ in 0..10 {
            let Ok(l) = self.leader().await else {
                continue;
            };
            if l == i {
                return true;
            }
            let moved = async {
                let mut target = traffic::connect(&eps[i..=i], Duration::from_secs(3)).await?;
                let id = traffic::bounded(Duration::from_secs(3), target.status())
                    .await?
                    .header()
                    .map(|h| h.member_id())
                    .unwrap_or(0);
                let mut cl = traffic::connect(&eps[l..=l], Duration::from_secs(3)).await?;
                traffic::bounded(Duration::from_secs(5), cl.move_leader(id)).await
            }
            .await;
            if let Err(e) = moved {
                eprintln!("robustness: move leader m{l} -> m{i}: {e}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        matches!(self.leader().await, Ok(l) if l == i)
    }

    /// Power loss on the members `ms` at one instant: every disk is shut
    /// down without flushing, then the processes are killed (a power cut
    /// does both at once), then the disks are mounted again; restart the
    /// members with [`RbCluster::restart`].
    pub fn power_loss(&mut self, ms: &[usize]) -> Result<()> {
        eprintln!("robustness: fault: power loss on {ms:?}");
        for &i in ms {
            self.disks[i].power_off()?;
        }
        for &i in ms {
            self.paused[i] = false;
            self.cluster.members[i].kill();
        }
        for &i in ms {
            self.disks[i].power_on()?;
        }
        Ok(())
    }

    pub fn kill(&mut self, i: usize) {
        eprintln!("robustness: fault: SIGKILL m{i}");
        self.paused[i] = false;
        self.cluster.members[i].kill();
    }

    pub fn pause(&mut self, i: usize) {
        eprintln!("robustness: fault: SIGSTOP m{i}");
        self.paused[i] = true;
        self.cluster.members[i].pause();
    }

    pub fn resume(&mut self, i: usize) {
        eprintln!("robustness: fault: SIGCONT m{i}");
        self.paused[i] = false;
        self.cluster.members[i].resume();
    }

    /// Starts member `i` again (without waiting for it to serve).
    pub fn restart(&mut self, i: usize) {
        if !self.cluster.members[i].is_running() {
            eprintln!("robustness: restart m{i}");
            self.cluster.members[i].start();
        }
    }

    /// Lifts every proxy fault, resumes paused members, clears failpoints
    /// and restarts members that are down; waits until all serve.
    pub async fn heal(&mut self) -> Result<()> {
        for p in &self.proxies {
            p.heal();
        }
        if let Some(net) = self.net.as_mut() {
            if net.faulty() {
                eprintln!("robustness: network healed");
            }
            net.heal()?;
        }
        for i in 0..self.len() {
            if self.paused[i] {
                self.resume(i);
            }
            if !self.cluster.members[i].is_running() {
                if !self.fp_files.is_empty() {
                    self.set_failpoints(i, "");
                }
                if !self.fiu.is_empty() {
                    self.set_start_io_faults(i, "");
                }
                self.restart(i);
            }
        }
        self.cluster.wait_all_ready(crate::timing::READY).await
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub name: String,
    pub seed: u64,
    pub violations: Vec<String>,
    pub stats: TrafficStats,
    pub ops: usize,
    pub final_rev: i64,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }

    pub fn assert_ok(&self) {
        assert!(
            self.ok(),
            "robustness scenario {} (seed {}, replay with RETCD_ROBUSTNESS_SEED={}) found {} problem(s):\n{}",
            self.name,
            self.seed,
            self.seed,
            self.violations.len(),
            self.violations.join("\n")
        );
    }
}

/// One robustness run: cluster, traffic, watchers, the seeded fault RNG.
pub struct Run {
    pub name: String,
    pub seed: u64,
    pub rng: StdRng,
    pub rc: RbCluster,
    pub opts: Options,
    clock: Clock,
    stop: Arc<AtomicBool>,
    traffic: Option<JoinHandle<(History, TrafficStats)>>,
    watchers: Vec<JoinHandle<WatchRecord>>,
    target: Arc<AtomicI64>,
    abort: Arc<AtomicBool>,
    init_rev: i64,
    started: Instant,
    lease: Option<LeaseKeeper>,
    /// Problems noticed during the run (e.g. a member that should have stopped).
    pub notes: Vec<String>,
}

impl Run {
    /// Starts the cluster, the watchers and the traffic. `base_seed` is the
    /// default seed (`RETCD_ROBUSTNESS_SEED` overrides it).
    pub async fn start(name: &str, opts: Options, base_seed: u64) -> Run {
        let seed = seed::seed_for(name, base_seed);
        Self::start_seeded(name, opts, seed).await
    }

    pub async fn start_seeded(name: &str, opts: Options, seed: u64) -> Run {
        let rc = RbCluster::start(&opts, seed).await.expect("start cluster");
        let eps = rc.cluster.endpoints();
        let clock = Clock::new();
        // The lease client first: its put is below the traffic's first revision.
        let lease = if opts.lease_check {
            let cfg = LeaseConfig::new(opts.election_timeout());
            Some(
                lease::start(eps.clone(), cfg, clock)
                    .await
                    .expect("lease client"),
            )
        } else {
            None
        };
        let mut cl = traffic::connect(&eps, Duration::from_secs(5))
            .await
            .expect("connect");
        let get = cl.get(
            opts.traffic.prefix.clone(),
            Some(GetOptions::new().with_prefix()),
        );
        let r = traffic::bounded(Duration::from_secs(10), get)
            .await
            .expect("initial get");
        assert!(r.kvs().is_empty(), "the traffic prefix must start empty");
        let init_rev = r.header().map(|h| h.revision()).unwrap_or(1);
        let stop = Arc::new(AtomicBool::new(false));
        let target = Arc::new(AtomicI64::new(0));
        let abort = Arc::new(AtomicBool::new(false));
        let mut watchers = Vec::new();
        for (id, (filter, prev_kv)) in opts.watchers.iter().enumerate() {
            let cfg = WatcherConfig {
                id,
                member: id % eps.len(),
                filter: *filter,
                prev_kv: *prev_kv,
                prefix: opts.traffic.prefix.clone(),
                start_rev: init_rev + 1,
                progress_every: Duration::from_millis(700),
                clock,
            };
            watchers.push(tokio::spawn(traffic::run_watcher(
                cfg,
                eps.clone(),
                target.clone(),
                Duration::from_secs(20),
                abort.clone(),
            )));
        }
        let traffic_eps: Vec<String> = match &opts.traffic_members {
            Some(ms) => ms.iter().map(|&i| eps[i].clone()).collect(),
            None => eps.clone(),
        };
        let t = tokio::spawn(traffic::run_traffic(
            traffic_eps,
            eps.clone(),
            opts.traffic.clone(),
            seed,
            clock,
            stop.clone(),
        ));
        Run {
            name: name.to_string(),
            seed,
            rng: seed::rng(seed ^ 0xfa17),
            rc,
            opts,
            clock,
            stop,
            traffic: Some(t),
            watchers,
            target,
            abort,
            init_rev,
            started: Instant::now(),
            lease,
            notes: Vec::new(),
        }
    }

    /// Whether the fault phase should go on (runs for `d` after start).
    pub fn running(&self, d: Duration) -> bool {
        self.started.elapsed() < d
    }

    pub async fn sleep_ms(&mut self, lo: u64, hi: u64) {
        use rand::Rng;
        let ms = self.rng.random_range(lo..=hi);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    pub fn pick(&mut self, n: usize) -> usize {
        use rand::Rng;
        self.rng.random_range(0..n)
    }

    /// Stops traffic, heals the cluster, reads the final state from every
    /// member, lets the watchers catch up, and runs every check.
    pub async fn finish(mut self) -> Report {
        let mut rep = Report {
            name: self.name.clone(),
            seed: self.seed,
            violations: std::mem::take(&mut self.notes),
            ..Default::default()
        };
        self.stop.store(true, Ordering::SeqCst);
        eprintln!("robustness: {}: stopping traffic", self.name);
        let t = self.traffic.take().expect("traffic");
        let (mut history, stats) = match tokio::time::timeout(Duration::from_secs(30), t).await {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => panic!("traffic task failed: {e}"),
            Err(_) => panic!("traffic clients did not stop within 30 s"),
        };
        eprintln!("robustness: {}: healing the cluster", self.name);
        rep.stats = stats;
        if let Err(e) = self.rc.heal().await {
            rep.violations
                .push(format!("cluster did not recover after the faults: {e:#}"));
            self.abort.store(true, Ordering::SeqCst);
            return rep;
        }
        let n = self.rc.len();
        let eps = self.rc.cluster.endpoints();
        let prefix = self.opts.traffic.prefix.clone();
        eprintln!(
            "robustness: {}: final reads, convergence, HashKV",
            self.name
        );
        // Final linearizable read through every member, part of the history.
        let mut final_rev = 0;
        for (i, ep) in eps.iter().enumerate() {
            let res = crate::retry_until(
                Duration::from_secs(20),
                Duration::from_millis(200),
                || async {
                    let mut cl = traffic::connect(&eps[i..=i], Duration::from_secs(3)).await?;
                    let call = self.clock.now();
                    let req = Request::Range {
                        prefix: prefix.clone(),
                    };
                    let r =
                        traffic::bounded(Duration::from_secs(4), traffic::execute(&mut cl, &req))
                            .await?;
                    Ok::<_, etcd_client::Error>((call, self.clock.now(), r))
                },
            )
            .await;
            match res {
                Ok((call, ret, resp)) => {
                    if let Some(r) = linearizability::response_rev(&resp) {
                        final_rev = final_rev.max(r);
                    }
                    history.ops.push(Operation {
                        client: 1000 + i,
                        req: Request::Range {
                            prefix: prefix.clone(),
                        },
                        call,
                        ret: Some(ret),
                        resp: Some(resp),
                    });
                }
                Err(e) => rep
                    .violations
                    .push(format!("final read from {ep} failed: {e}")),
            }
        }
        rep.final_rev = final_rev;
        // Every member converges on the same state and the same HashKV.
        let converged = crate::retry_until(
            Duration::from_secs(20),
            Duration::from_millis(200),
            || async {
                let mut states = Vec::new();
                for i in 0..n {
                    let mut cl = traffic::connect(&eps[i..=i], Duration::from_secs(3))
                        .await
                        .map_err(|e| e.to_string())?;
                    let get = cl.get(
                        prefix.clone(),
                        Some(GetOptions::new().with_prefix().with_serializable()),
                    );
                    let r = traffic::bounded(Duration::from_secs(4), get)
                        .await
                        .map_err(|e| e.to_string())?;
                    let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                    if rev < final_rev {
                        return Err(format!("m{i} at revision {rev} < {final_rev}"));
                    }
                    let kvs: Vec<_> = r.kvs().iter().map(traffic::kv_of).collect();
                    states.push((rev, kvs));
                }
                if states.windows(2).all(|w| w[0] == w[1]) {
                    Ok(states[0].0)
                } else {
                    Err(format!(
                        "members differ: {:?}",
                        states.iter().map(|s| (s.0, s.1.len())).collect::<Vec<_>>()
                    ))
                }
            },
        )
        .await;
        match converged {
            Err(e) => rep
                .violations
                .push(format!("members did not converge: {e}")),
            Ok(rev) => {
                let mut hashes = Vec::new();
                for i in 0..n {
                    let h = async {
                        let mut cl = traffic::connect(&eps[i..=i], Duration::from_secs(5)).await?;
                        let r = traffic::bounded(Duration::from_secs(5), cl.hash_kv(rev)).await?;
                        Ok::<_, etcd_client::Error>((r.hash(), r.compact_version()))
                    }
                    .await;
                    hashes.push(h.map_err(|e| e.to_string()));
                }
                if !hashes.windows(2).all(|w| w[0] == w[1]) || hashes.iter().any(|h| h.is_err()) {
                    rep.violations.push(format!(
                        "HashKV at revision {rev} differs between members: {hashes:?}"
                    ));
                }
            }
        }
        eprintln!(
            "robustness: {}: waiting for watchers to reach revision {final_rev}",
            self.name
        );
        // Watchers catch up to the final revision.
        self.target
            .store(final_rev.max(self.init_rev), Ordering::SeqCst);
        let mut records = Vec::new();
        for w in self.watchers.drain(..) {
            match tokio::time::timeout(Duration::from_secs(40), w).await {
                Ok(Ok(r)) => records.push(r),
                _ => rep.violations.push("a watcher did not finish".into()),
            }
        }
        // The lease: keepalives flowed through the faults and the healing;
        // now (past the final revision the watchers waited for) they stop
        // and the key must expire within TTL + 2 election timeouts.
        if let Some(l) = self.lease.take() {
            eprintln!(
                "robustness: {}: stopping keepalives, waiting for the lease to expire",
                self.name
            );
            let lr = l.finish().await;
            let lv = lease::check(&lr);
            let ok_ka = lr.keepalives.iter().filter(|k| k.ok).count();
            let last = lr.last_keepalive_end().unwrap_or(lr.put_ret);
            let gone = lr
                .observed_deleted()
                .map(|t| format!("{:.2} s", (t as f64 - last as f64) / 1e9));
            eprintln!(
                "robustness: {}: lease: {} keepalives ({} ok), {} reads, {} DELETE events; key seen gone {} after the last keepalive (TTL {} s + grace {:?}): {}",
                self.name,
                lr.keepalives.len(),
                ok_ka,
                lr.reads.len(),
                lr.delete_events.len(),
                gone.unwrap_or_else(|| "never".into()),
                lr.ttl / 1_000_000_000,
                Duration::from_nanos(lr.grace),
                if lv.is_empty() { "OK" } else { "PROBLEM" }
            );
            rep.violations.extend(lv);
        }
        // The checks: watch, patching unknown outcomes with the watch
        // history, linearizability (`retcd_robustness::checks`).
        let record = RunRecord {
            name: self.name.clone(),
            seed: self.seed,
            etcd: self.rc.cluster.flavor == Flavor::Etcd,
            init_rev: self.init_rev,
            final_rev,
            history,
            watches: records,
        };
        let record = tokio::task::spawn_blocking(move || {
            let out = checks::check_run(&record);
            (record, out)
        })
        .await
        .expect("checker");
        let (record, out) = record;
        for k in &out.known {
            eprintln!("robustness: known etcd 3.4.23 issue (etcd-io/etcd#15220): {k}");
        }
        eprintln!(
            "robustness: {}: {} unknown outcomes, {} left after patching with the watch history; linearizability: {} ops, {:?}",
            rep.name, out.unknown_before, out.unknown_after, out.ops, out.lin_stats
        );
        rep.violations.extend(out.violations);
        rep.ops = out.ops;
        let lin_time = out.lin_time;
        let dump_dir = std::env::var_os("RETCD_ROBUSTNESS_DUMP").map(PathBuf::from);
        let dump = dump_dir.is_some() || !rep.violations.is_empty();
        let dir = dump_dir.unwrap_or_else(|| workspace_root().join("target/robustness-records"));
        if dump {
            let path = dir.join(format!("{}-{}.json", rep.name, rep.seed));
            match record.save(&path) {
                Ok(()) => eprintln!(
                    "robustness: {}: run record saved to {} (check again with `cargo run -p retcd-robustness --example check_dump -- {}`)",
                    rep.name,
                    path.display(),
                    path.display()
                ),
                Err(e) => eprintln!("robustness: cannot save the run record: {e}"),
            }
        }
        let (history, records) = (record.history, record.watches);
        let events: usize = records.iter().map(|r| r.events().count()).sum();
        let restarts: usize = records
            .iter()
            .map(|r| {
                r.items
                    .iter()
                    .filter(|i| matches!(i, watch::WatchItem::Restart { .. }))
                    .count()
            })
            .sum();
        eprintln!(
            "robustness: {} seed {}: {} ops ({} ok, {} unknown, {} failed reads, {} stale reads, {} compactions), revisions {}..{}, {} watch events ({} watch restarts), checked in {:?}: {}",
            rep.name,
            rep.seed,
            rep.ops,
            rep.stats.ok,
            rep.stats.unknown,
            rep.stats.failed_reads,
            history.stale_reads.len(),
            rep.stats.compactions,
            self.init_rev,
            final_rev,
            events,
            restarts,
            lin_time,
            if rep.violations.is_empty() { "OK".to_string() } else { format!("{} PROBLEM(S)", rep.violations.len()) }
        );
        // The problems again, each on its own line, before the long log
        // tails: CI keeps only the head and the tail of a failure's output.
        for v in &rep.violations {
            eprintln!("robustness: {} seed {}: PROBLEM: {}", rep.name, rep.seed, v);
        }
        if !rep.ok() {
            eprintln!("{}", self.rc.cluster.log_tails(3000));
            // The members' whole logs beside the record: the cluster's temp
            // dir goes with the run, and a long-mode failure is often seen
            // only once.
            let _ = std::fs::create_dir_all(&dir);
            for m in &self.rc.cluster.members {
                let to = dir.join(format!("{}-{}-{}.log", rep.name, rep.seed, m.name));
                match std::fs::copy(m.log_path(), &to) {
                    Ok(_) => eprintln!("robustness: {} log kept in {}", m.name, to.display()),
                    Err(e) => eprintln!("robustness: cannot keep {}'s log: {e}", m.name),
                }
            }
        }
        rep
    }
}

/// Waits (bounded) until member `i` has exited by itself; its exit status.
pub fn wait_exit(
    rc: &mut RbCluster,
    i: usize,
    timeout: Duration,
) -> Result<std::process::ExitStatus> {
    match rc.cluster.members[i].wait_exit(timeout) {
        Some(st) => Ok(st),
        None => bail!("m{i} still running after {timeout:?}"),
    }
}

/// Scenarios run one at a time (they share two cores): each holds this
/// lock (see [`serial`]).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lock every scenario of a test binary holds while it runs.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// The fault phase length: short by default, longer in long mode.
pub fn phase() -> Duration {
    if retcd_robustness::seed::long_runs() > 0 {
        Duration::from_secs(20)
    } else {
        Duration::from_secs(7)
    }
}

/// Busy processes competing with the cluster for the CPUs while a
/// scenario runs (`RETCD_ROBUSTNESS_LOAD=N`: N shell loops at nice 5),
/// killed by their PIDs when dropped. Delayed threads reorder and queue
/// the members' messages in ways an idle machine rarely shows: the
/// ReadIndex context collision (docs/design.md, read path) failed about
/// one pause_leader run in 30 with two, and no run of 22 long rounds
/// without them.
struct CpuLoad(Vec<std::process::Child>);

impl CpuLoad {
    fn from_env() -> CpuLoad {
        let n: usize = std::env::var("RETCD_ROBUSTNESS_LOAD")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let children = (0..n)
            .filter_map(|_| {
                Command::new("nice")
                    .args(["-n", "5", "sh", "-c", "while :; do :; done"])
                    .spawn()
                    .map_err(|e| eprintln!("robustness: cannot start a CPU load: {e}"))
                    .ok()
            })
            .collect::<Vec<_>>();
        if !children.is_empty() {
            eprintln!(
                "robustness: {} busy loop(s) at nice 5 run beside the cluster",
                children.len()
            );
        }
        CpuLoad(children)
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `scenario` once with `base_seed` (or `RETCD_ROBUSTNESS_SEED`), or in
/// long mode once per fresh seed (with `RETCD_ROBUSTNESS_SEED` set too: that
/// seed once, with the long phase, to replay a long-mode failure); every
/// report must be clean. In long mode every seed runs even after a failure.
pub async fn repeat<F, Fut>(name: &str, base_seed: u64, scenario: F)
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Report>,
{
    let _serial = serial().await;
    let _load = CpuLoad::from_env();
    let runs = retcd_robustness::seed::long_runs();
    let replay = std::env::var("RETCD_ROBUSTNESS_SEED").is_ok();
    let seeds: Vec<u64> = if runs == 0 || replay {
        vec![retcd_robustness::seed::seed_for(name, base_seed)]
    } else {
        (0..runs)
            .map(|_| retcd_robustness::seed::random_seed())
            .collect()
    };
    let mut failed = Vec::new();
    for s in seeds {
        eprintln!("robustness: scenario {name}: seed {s}");
        let rep = crate::bounded(crate::limit::SLOW, scenario(s)).await;
        if !rep.ok() {
            eprintln!(
                "robustness: scenario {name}: seed {s} FAILED: {}",
                rep.violations.join("; ")
            );
            failed.push(rep);
        }
    }
    if let Some(rep) = failed.first() {
        eprintln!(
            "robustness: scenario {name}: {} failing seed(s): {:?}",
            failed.len(),
            failed.iter().map(|r| r.seed).collect::<Vec<_>>()
        );
        rep.assert_ok();
    }
}
