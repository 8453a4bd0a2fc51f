//! Failpoints on the durable path, for the robustness suite
//! (`docs/robustness.md`). They exist only in a build with the cargo
//! feature `failpoints`; without it `fail::fail_point!` expands to nothing
//! and every helper here is the plain operation.
//!
//! Configured at start with `FAILPOINTS="name=action;name=action"` (the
//! `fail` crate's syntax: `return`, `panic`, `sleep(ms)`, `pause`,
//! `50%return`, `1*return`…). Points named by [`point`] crash the process
//! with SIGABRT on `return` (a crash at that instant); `panic` also aborts
//! (main installs an aborting panic hook in a failpoints build).
//!
//! | name | where |
//! |---|---|
//! | `raft_before_save_wal`, `raft_after_save_wal` | around the WAL append + fdatasync of a Ready |
//! | `raft_before_commit_backend`, `raft_after_commit_backend` | around the MVCC batch commit of applied entries (before the proposers are answered) |
//! | `raft_before_save_snapshot`, `raft_after_save_snapshot` | around the snapshot record written every `--snapshot-count` entries |
//! | `raft_before_apply_snapshot`, `raft_after_apply_snapshot` | around restoring a snapshot received from the leader |
//! | `raft_before_apply_conf_change`, `raft_after_apply_conf_change` | around applying a conf change entry |
//! | `mvcc_compact` | on the background compactor thread, before each deletion batch (the first right after the compaction was applied, the others between batches) |
//! | `raft_wal_fsync_error` | `return`: the WAL save reports an fsync error (the node must stop) |
//! | `raft_skip_wal_save` | `return`: **deliberately broken** — the WAL write is skipped, entries are acknowledged without being durable |
//! | `watch_drop_event` | `return`: **deliberately broken** — the first event of an applied batch is not sent to watchers |
//! | `mvcc_hash_kv_corrupt` | `return`: **deliberately broken** — this member's HashKV (the RPC and the corruption checker's own hash) is `hash ^ 1`, as if its key space diverged |

use retcd_api::mvccpb::Event;
use retcd_storage::wal::{Wal, WalEntry, WalError};

/// A crash point: `return` aborts the process, `sleep`/`pause`/`panic` act as usual.
pub fn point(name: &str) {
    if enabled(name) {
        eprintln!("retcd: failpoint {name}: crashing (abort)");
        std::process::abort();
    }
}

/// Whether failpoint `name` is set to `return` (always false without the
/// `failpoints` feature).
fn enabled(name: &str) -> bool {
    let _ = name;
    fail::fail_point!(name, |_| true);
    false
}

/// `Wal::save`, subject to `raft_skip_wal_save` and `raft_wal_fsync_error`.
pub fn wal_save(
    wal: &mut Wal,
    hs: Option<&[u8]>,
    entries: &[WalEntry],
    sync: bool,
) -> Result<(), WalError> {
    if enabled("raft_skip_wal_save") {
        return Ok(());
    }
    wal.save_opt(hs, entries, sync)?;
    if sync && enabled("raft_wal_fsync_error") {
        return Err(WalError::Io {
            context: "fdatasync (failpoint raft_wal_fsync_error)".into(),
            source: std::io::Error::other("injected fsync error"),
        });
    }
    Ok(())
}

/// The events handed to watchers, subject to `watch_drop_event`.
pub fn watch_events(mut events: Vec<(i64, Event)>) -> Vec<(i64, Event)> {
    if !events.is_empty() && enabled("watch_drop_event") {
        let (rev, ev) = events.remove(0);
        let key = ev
            .kv
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned());
        tracing::warn!(
            rev,
            ?key,
            "failpoint watch_drop_event: event not sent to watchers"
        );
    }
    events
}

/// A HashKV result, subject to `mvcc_hash_kv_corrupt` (`hash ^ 1`).
pub fn hash_kv(hash: u32) -> u32 {
    if enabled("mvcc_hash_kv_corrupt") {
        tracing::warn!(hash, "failpoint mvcc_hash_kv_corrupt: reporting hash ^ 1");
        return hash ^ 1;
    }
    hash
}
