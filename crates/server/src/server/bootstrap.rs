//! Starting a member: open (or create) the data dir, replay the WAL, start
//! the raft thread and the background jobs. Blocking (file I/O, WAL replay,
//! joining asks a peer): call it on a blocking thread of the runtime.
//!
//! 1. Open the backend; its `consistent_index` says what is applied.
//! 2. Open the WAL (repairing a torn tail), load the last snapshot record
//!    (index, term, conf state) into `RaftStorage`, then the hard state and
//!    the entries after the snapshot. A new member instead writes the WAL's
//!    metadata (its id, the cluster id, the bootstrap members) and, for a
//!    new cluster, a snapshot record at index 1 with the initial
//!    configuration; a member joining a running cluster asks a peer first.
//! 3. `applied = max(consistent_index, snapshot index)`; raft-rs is started
//!    with it, so the first Ready hands back exactly the committed entries
//!    not yet in the backend.

use super::{cluster, compactor, corrupt, lease, EtcdServer};
use crate::apply::alarm::AlarmStore;
use crate::apply::membership::{self, Members};
use crate::apply::Applier;
use crate::config::Config;
use crate::ids::Hex;
use crate::metrics::Metrics;
use crate::raft::node::{RaftNode, RaftNodeConfig};
use crate::raft::storage::RaftStorage;
use crate::raft::transport::Transport;
use crate::raft::{Proposer, RaftStatus, Wait};
use crate::tls::Dialer;
use anyhow::Context;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, SnapshotMetadata};
use retcd_api::retcdpb::{Member, WalMetadata};
use retcd_mvcc::KvStore;
use retcd_storage::backend::Backend;
use retcd_storage::wal::{Wal, WalSnapshot};
use std::sync::Arc;
use std::time::Duration;

/// What the WAL says about this member.
struct Opened {
    wal: Wal,
    meta: WalMetadata,
    snapshot_index: u64,
}

impl EtcdServer {
    /// Opens (or creates) the data dir, replays the WAL, starts the raft
    /// thread and the background jobs (publish, lease expiry,
    /// auto-compaction, corruption checks). Must run inside the runtime, on
    /// a blocking thread.
    pub fn start(cfg: Config, dialer: Dialer) -> anyhow::Result<Arc<EtcdServer>> {
        std::fs::create_dir_all(cfg.snap_dir())
            .with_context(|| format!("cannot create data dir {}", cfg.snap_dir().display()))?;
        remove_partial_snapshots(&cfg.snap_dir());
        // etcd's --unsafe-no-fsync skips the backend's fsyncs too
        retcd_storage::backend::set_unsafe_no_fsync(cfg.unsafe_no_fsync);
        let backend = Arc::new(
            Backend::open(&cfg.backend_path())
                .map_err(|e| anyhow::anyhow!("cannot open backend: {e}"))?,
        );
        let metrics: &'static Metrics = crate::metrics::global();
        let kv = Arc::new(
            KvStore::open_with(
                backend.clone(),
                retcd_mvcc::CompactionConfig {
                    batch_limit: cfg.experimental_compaction_batch_limit,
                    sleep_interval: cfg.experimental_compaction_sleep_interval,
                    observer: Some(Arc::new(crate::metrics::CompactionMetrics::of(metrics))),
                },
            )
            .map_err(|e| anyhow::anyhow!("cannot open mvcc store: {e}"))?,
        );
        kv.set_max_response_bytes(
            usize::try_from(cfg.max_range_response_bytes).unwrap_or(usize::MAX),
        );
        let storage = RaftStorage::new(kv.clone());
        let restarting = Wal::exists(&cfg.wal_dir());
        let Opened {
            mut wal,
            meta,
            mut snapshot_index,
        } = if restarting {
            replay_wal(&cfg, &kv, &storage)?
        } else {
            create_wal(&cfg, &dialer, &kv, &storage)?
        };
        wal.set_unsafe_no_fsync(cfg.unsafe_no_fsync);

        // The backend may be ahead of the hard state's commit (commit is
        // persisted lazily). It is ahead of the log's last index only when
        // the WAL lost fsynced records at its tail (a torn tail cut at a
        // record that was already applied): everything up to the consistent
        // index was committed, so the backend serves as a snapshot at that
        // index and the log restarts after it.
        let ci = kv.consistent_index();
        let last = storage.last_index_now();
        if ci > last {
            tracing::warn!(
                consistent_index = ci,
                wal_last_index = last,
                "backend is ahead of the WAL; treating the backend as a snapshot at its consistent index"
            );
            let m = snapshot_meta(ci, kv.term(), storage.conf_state());
            save_snapshot_record(&mut wal, &m)?;
            storage.apply_snapshot_meta(m);
            snapshot_index = ci;
        }
        let applied = ci.max(storage.first_index_now() - 1);
        {
            let mut hs = storage.hard_state();
            if hs.commit < applied {
                hs.commit = applied;
                storage.set_hard_state(hs);
            }
        }
        let applied_term = if applied == 0 {
            0
        } else {
            raft::Storage::term(&storage, applied).unwrap_or(0)
        };
        storage.set_applied(applied, applied_term);

        // The backend's member list (kept current by applied publishes)
        // wins over the bootstrap list in the WAL metadata.
        let mut members = membership::load(&backend)?;
        if members.is_empty() {
            members = meta.members.clone();
        } else {
            if !members.iter().any(|m| m.id == meta.member_id) {
                anyhow::bail!("{}", crate::error::ServerError::RemovedMember);
            }
            // raft is restarted at the applied index, so conf changes
            // applied after the WAL's snapshot record are not replayed to
            // it: the configuration at the applied index is the member list
            // committed with it (kept in lockstep with raft's by apply).
            storage.set_conf_state(conf_state_of(&members));
        }
        if cfg.force_new_cluster && restarting {
            // etcd's restartAsStandaloneNode: this member alone, as a
            // voter, with its data; committed entries not yet applied are
            // kept, uncommitted ones dropped.
            members = membership::force_single(&backend, &members, meta.member_id)?;
            let commit = storage.hard_state().commit;
            let keep: Vec<Entry> = (applied + 1..=commit.min(storage.last_index_now()))
                .filter_map(|i| {
                    raft::Storage::entries(
                        &storage,
                        i,
                        i + 1,
                        None,
                        raft::GetEntriesContext::empty(false),
                    )
                    .ok()
                    .and_then(|mut v| v.pop())
                })
                .collect();
            let m = snapshot_meta(applied, applied_term, conf_state_of(&members));
            save_snapshot_record(&mut wal, &m)?;
            storage.apply_snapshot_meta(m);
            storage.append(&keep);
            storage.set_applied(applied, applied_term);
            snapshot_index = applied;
            tracing::warn!(
                local_member_id = %Hex(meta.member_id),
                commit_index = commit,
                kept_entries = keep.len(),
                "forcing restart member as the only voter of a new cluster (--force-new-cluster)"
            );
        }

        let raft_cfg = raft::Config {
            election_tick: cfg.election_ticks(),
            applied,
            pre_vote: cfg.pre_vote,
            ..crate::raft::base_config(meta.member_id)
        };
        raft_cfg
            .validate()
            .map_err(|e| anyhow::anyhow!("raft config: {e}"))?;
        let logger = crate::log::raft_logger();
        let raw = raft::RawNode::new(&raft_cfg, storage.clone(), &logger)
            .map_err(|e| anyhow::anyhow!("cannot start raft: {e}"))?;

        // As etcd's NewServer: the token provider is made once the data
        // dir, the WAL and the cluster (a joining member's fetch included)
        // are settled, so their errors come first.
        let token_provider = crate::auth::TokenProvider::from_flag(
            &cfg.auth_token,
            Duration::from_secs(cfg.auth_token_ttl),
        )
        .map_err(|e| {
            // etcd logs why; options it cannot parse fail as
            // ErrInvalidAuthOpts alone, keys with their own text.
            let e = e.to_string();
            tracing::warn!(detail = %e, "failed to create token provider");
            match e.split_once(" (") {
                Some((head, _)) if head == "auth: invalid auth options" => {
                    anyhow::anyhow!("{head}")
                }
                _ => anyhow::anyhow!("{e}"),
            }
        })?;
        // etcd's minTTL: ⌈(3 × election ticks / 2) × heartbeat⌉ in seconds.
        let min_ttl_ms = (3 * cfg.election_ticks() as u64 / 2) * cfg.heartbeat_interval;
        let request_timeout =
            Duration::from_secs(5) + 2 * Duration::from_millis(cfg.election_timeout);
        let lessor = Arc::new(retcd_lease::Lessor::new(
            retcd_lease::LessorConfig {
                min_lease_ttl: min_ttl_ms.div_ceil(1000) as i64,
                checkpoint_interval: cfg
                    .experimental_enable_lease_checkpoint
                    .then_some(cfg.experimental_lease_checkpoint_interval),
                expired_leases_retry_interval: request_timeout,
            },
            Arc::new(retcd_lease::SystemClock),
        ));
        lessor
            .recover(&kv)
            .map_err(|e| anyhow::anyhow!("cannot recover leases: {e}"))?;
        let applier = Arc::new(Applier {
            kv: kv.clone(),
            lessor,
            watch: retcd_mvcc::WatchableStore::new(kv.clone()),
            alarms: Arc::new(
                AlarmStore::load(&backend)
                    .map_err(|e| anyhow::anyhow!("cannot load alarms: {e}"))?,
            ),
            auth: Arc::new(
                crate::auth::AuthStore::load(&backend, token_provider)
                    .map_err(|e| anyhow::anyhow!("cannot load the auth store: {e}"))?,
            ),
            members: Arc::new(Members::new(members.clone())),
            quota_bytes: (cfg.quota_backend_bytes >= 0).then(|| cfg.quota_bytes()),
        });

        let (raft_tx, raft_rx) = crate::raft::channel();
        let transport = Transport::new(
            meta.member_id,
            meta.cluster_id,
            raft_tx.clone(),
            dialer.clone(),
        );
        transport.add_peers(&members);
        let wait = Arc::new(Wait::default());
        wait.start_dispatcher();
        let status = Arc::new(RaftStatus::starting_at(applied));
        let read_queue = Arc::new(crate::raft::ReadQueue::default());
        let node = RaftNode {
            raw,
            storage,
            wal,
            applier: applier.clone(),
            wait: wait.clone(),
            status: status.clone(),
            metrics,
            transport: transport.clone(),
            rx: raft_rx,
            read_queue: read_queue.clone(),
            cfg: RaftNodeConfig {
                tick: Duration::from_millis(cfg.heartbeat_interval),
                snapshot_count: cfg.snapshot_count,
                catchup_entries: cfg.experimental_snapshot_catchup_entries,
                batch_interval: cfg.backend_batch_interval,
                batch_limit: cfg.backend_batch_limit,
                max_learners: cfg.max_learners,
                max_wals: cfg.max_wals as usize,
                warn_apply: cfg.experimental_warning_apply_duration,
            },
            snapshot_index,
        };
        std::thread::Builder::new()
            .name("raft".into())
            .spawn(move || node.run())
            .context("cannot spawn the raft thread")?;

        let proposer = Proposer::new(
            meta.member_id,
            raft_tx.clone(),
            wait,
            read_queue,
            status,
            request_timeout,
            cfg.max_request_bytes,
        );
        let server = Arc::new(EtcdServer {
            member_id: meta.member_id,
            cluster_id: meta.cluster_id,
            kv,
            backend,
            proposer,
            raft: raft_tx,
            lessor: applier.lessor.clone(),
            watch: applier.watch.clone(),
            alarms: applier.alarms.clone(),
            auth: applier.auth.clone(),
            members: applier.members.clone(),
            metrics,
            transport,
            lease_forwarder: lease::Forwarder::new(dialer.clone()),
            dialer,
            published: tokio::sync::watch::Sender::new(false),
            leader_lost: tokio::sync::watch::Sender::new(0),
            cfg,
        });
        metrics.set_server_id(server.member_id);
        metrics
            .quota_backend_bytes
            .set(server.cfg.quota_bytes() as i64);
        tokio::spawn(cluster::publish(server.clone()));
        tokio::spawn(lease::run_lessor(server.clone()));
        compactor::start(&server)?;
        corrupt::start(&server);
        let every = server.cfg.election_ticks() as u64 * server.cfg.heartbeat_interval;
        tokio::spawn(super::monitor_leader(
            Arc::downgrade(&server),
            Duration::from_millis(every),
        ));
        Ok(server)
    }
}

/// Restarting: the WAL's metadata, snapshot record, hard state and entries
/// go into `storage`.
/// Removes what a `Maintenance.Snapshot` interrupted by a crash left in the
/// snap dir (its temporary etcd-format backend, `retcd-snapshot-*.db.part`).
fn remove_partial_snapshots(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("retcd-snapshot-") && name.ends_with(".db.part") {
            match std::fs::remove_file(e.path()) {
                Ok(()) => {
                    tracing::info!(path = %e.path().display(), "removed a partial snapshot file")
                }
                Err(err) => {
                    tracing::warn!(path = %e.path().display(), error = %err, "cannot remove a partial snapshot file")
                }
            }
        }
    }
}

fn replay_wal(cfg: &Config, kv: &KvStore, storage: &RaftStorage) -> anyhow::Result<Opened> {
    let wal_dir = cfg.wal_dir();
    let (wal, contents) = Wal::open(&wal_dir)
        .map_err(|e| anyhow::anyhow!("cannot open WAL in {}: {e}", wal_dir.display()))?;
    let meta =
        WalMetadata::decode(&contents.metadata[..]).context("WAL metadata record is not valid")?;
    let mut snapshot_index = 0;
    if let Some(s) = &contents.snapshot {
        let mut cs = ConfState::default();
        cs.merge_from_bytes(&s.payload)
            .context("WAL snapshot record is not valid")?;
        storage.apply_snapshot_meta(snapshot_meta(s.index, s.term, cs));
        snapshot_index = s.index;
    } else if cfg.initial_cluster_state != "existing" {
        storage.set_conf_state(conf_state_of(&meta.members));
    }
    // else: a member joining an existing cluster that has not got its
    // first snapshot yet: empty configuration until it does.
    if let Some(h) = &contents.hard_state {
        let mut hs = HardState::default();
        hs.merge_from_bytes(h)
            .context("WAL hard state is not valid")?;
        let mut cur = storage.hard_state();
        cur.term = cur.term.max(hs.term);
        cur.vote = hs.vote;
        cur.commit = cur.commit.max(hs.commit);
        storage.set_hard_state(cur);
    }
    let mut entries = Vec::with_capacity(contents.entries.len());
    for we in &contents.entries {
        let mut e = Entry::default();
        e.merge_from_bytes(&we.data)
            .with_context(|| format!("WAL entry {} is not valid", we.index))?;
        entries.push(e);
    }
    drop(contents);
    storage.append(&entries);
    let loaded = entries.len();
    drop(entries);
    // Entries the backend already holds are kept in memory only for
    // followers' catch-up, as after a snapshot (`trim_memory_log`): a
    // restart no longer holds up to --snapshot-count entries of values.
    let applied = kv.consistent_index().max(snapshot_index);
    // (a no-op when nothing lies below the tail)
    storage.compact(applied.saturating_sub(cfg.experimental_snapshot_catchup_entries.max(1)));
    tracing::info!(
        member = %Hex(meta.member_id),
        entries = loaded,
        snapshot_index,
        "restarting from WAL"
    );
    Ok(Opened {
        wal,
        meta,
        snapshot_index,
    })
}

/// A member without a WAL: a new cluster's member, or one joining a
/// running cluster.
fn create_wal(
    cfg: &Config,
    dialer: &Dialer,
    kv: &KvStore,
    storage: &RaftStorage,
) -> anyhow::Result<Opened> {
    let wal_dir = cfg.wal_dir();
    if kv.consistent_index() > 0 {
        anyhow::bail!(
            "backend at {} has data but there is no WAL in {}",
            cfg.backend_path().display(),
            wal_dir.display()
        );
    }
    let create = |meta: &WalMetadata| {
        Wal::create(&wal_dir, &meta.encode_to_vec())
            .map_err(|e| anyhow::anyhow!("cannot create WAL in {}: {e}", wal_dir.display()))
    };
    if cfg.initial_cluster_state == "existing" {
        // Joining: IDs and members come from the cluster; the log starts
        // empty and the leader sends a snapshot.
        let (cluster_id, member_id, members) = super::join::join_existing(cfg, dialer)?;
        let meta = WalMetadata {
            member_id,
            cluster_id,
            members,
        };
        let wal = create(&meta)?;
        tracing::info!(member = %Hex(member_id), cluster = %Hex(cluster_id), "joining existing cluster");
        return Ok(Opened {
            wal,
            meta,
            snapshot_index: 0,
        });
    }
    let (members, member_id, cluster_id) = membership::initial_cluster(cfg)?;
    if super::join::is_member_bootstrapped(cfg, &members, dialer, member_id) {
        anyhow::bail!("member {} has already been bootstrapped", Hex(member_id));
    }
    let meta = WalMetadata {
        member_id,
        cluster_id,
        members,
    };
    let mut wal = create(&meta)?;
    // A new cluster's log starts after a snapshot at index 1 (term 1)
    // holding the initial configuration, so a member added later (empty
    // log) can only catch up by snapshot, as in etcd, where it would
    // otherwise replay entries without the bootstrap configuration.
    let m = snapshot_meta(1, 1, conf_state_of(&meta.members));
    save_snapshot_record(&mut wal, &m)?;
    storage.apply_snapshot_meta(m);
    tracing::info!(member = %Hex(member_id), cluster = %Hex(cluster_id), "bootstrapping new member");
    Ok(Opened {
        wal,
        meta,
        snapshot_index: 1,
    })
}

fn save_snapshot_record(wal: &mut Wal, m: &SnapshotMetadata) -> anyhow::Result<()> {
    wal.save_snapshot(&WalSnapshot {
        index: m.index,
        term: m.term,
        payload: m.get_conf_state().write_to_bytes()?,
    })
    .map_err(|e| anyhow::anyhow!("cannot write snapshot record to the WAL: {e}"))
}

fn conf_state_of(members: &[Member]) -> ConfState {
    let mut cs = ConfState::default();
    for m in members {
        if m.is_learner {
            cs.learners.push(m.id);
        } else {
            cs.voters.push(m.id);
        }
    }
    cs
}

fn snapshot_meta(index: u64, term: u64, conf_state: ConfState) -> SnapshotMetadata {
    let mut m = SnapshotMetadata {
        index,
        term,
        ..Default::default()
    };
    m.set_conf_state(conf_state);
    m
}
