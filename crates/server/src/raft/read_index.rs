//! Linearizable reads, batched as etcd's `linearizableReadLoop`: one
//! ReadIndex in flight at a time; reads arriving meanwhile share the next
//! one (on several members each ReadIndex is a heartbeat round and
//! messages on every member; a sole voter answers at once). When the read
//! state returns index *i*, its reads are released once applied ≥ *i*.
//! An unanswered ReadIndex is sent again every [`READ_INDEX_RETRY`] (raft
//! drops it while there is no leader, or before the leader has committed
//! an entry of its term) and given up after [`READ_INDEX_GIVE_UP`].

use super::storage::RaftStorage;
use crate::error::ServerError;
use raft::{RawNode, ReadState};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How often an unanswered ReadIndex is sent again (etcd: 500 ms).
const READ_INDEX_RETRY: Duration = Duration::from_millis(500);
/// An unanswered ReadIndex is given up after this long (its callers have
/// timed out by then).
const READ_INDEX_GIVE_UP: Duration = Duration::from_secs(30);

type Reader = oneshot::Sender<Result<(), ServerError>>;

struct InflightRead {
    first_sent: Instant,
    last_sent: Instant,
    waiters: Vec<Reader>,
}

/// The raft thread's reads; see the module documentation.
#[derive(Default)]
pub(super) struct Reads {
    /// Reads waiting for the next ReadIndex to be issued.
    pending: Vec<Reader>,
    /// ReadIndex requests in flight, by context.
    inflight: HashMap<u64, InflightRead>,
    /// Reads whose index is known, waiting for applied ≥ index.
    waiting: Vec<(u64, Vec<Reader>)>,
    next_ctx: u64,
}

impl Reads {
    pub(super) fn push(&mut self, reader: Reader) {
        self.pending.push(reader);
    }

    /// Issues one ReadIndex for every pending read, unless one is in flight.
    pub(super) fn issue(&mut self, raw: &mut RawNode<RaftStorage>) {
        if self.pending.is_empty() || !self.inflight.is_empty() {
            return;
        }
        self.next_ctx += 1;
        let ctx = self.next_ctx;
        raw.read_index(ctx.to_be_bytes().to_vec());
        let now = Instant::now();
        self.inflight.insert(
            ctx,
            InflightRead {
                first_sent: now,
                last_sent: now,
                waiters: std::mem::take(&mut self.pending),
            },
        );
    }

    /// Sends unanswered ReadIndex requests again; fails very old ones.
    /// Returns how many were given up and how many were sent again (etcd's
    /// slow read indexes).
    pub(super) fn retry(&mut self, raw: &mut RawNode<RaftStorage>) -> (u64, u64) {
        let now = Instant::now();
        let mut give_up = Vec::new();
        let mut again = 0;
        for (ctx, r) in self.inflight.iter_mut() {
            if now.duration_since(r.first_sent) >= READ_INDEX_GIVE_UP {
                give_up.push(*ctx);
            } else if now.duration_since(r.last_sent) >= READ_INDEX_RETRY {
                r.last_sent = now;
                again += 1;
                raw.read_index(ctx.to_be_bytes().to_vec());
            }
        }
        for ctx in &give_up {
            if let Some(r) = self.inflight.remove(ctx) {
                for w in r.waiters {
                    let _ = w.send(Err(ServerError::Timeout));
                }
            }
        }
        (give_up.len() as u64, again)
    }

    /// The read states of a Ready: their reads now wait for the index.
    pub(super) fn on_read_states(&mut self, states: Vec<ReadState>) {
        for rs in states {
            let Ok(ctx) = <[u8; 8]>::try_from(rs.request_ctx.as_slice()) else {
                continue;
            };
            if let Some(r) = self.inflight.remove(&u64::from_be_bytes(ctx)) {
                self.waiting.push((rs.index, r.waiters));
            }
        }
    }

    /// Releases the reads whose index is applied.
    pub(super) fn answer(&mut self, applied: u64) {
        self.waiting.retain_mut(|(index, ws)| {
            if *index <= applied {
                for w in ws.drain(..) {
                    let _ = w.send(Ok(()));
                }
                false
            } else {
                true
            }
        });
    }
}
