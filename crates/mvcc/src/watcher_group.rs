//! Watchers and the [`WatcherGroup`] that finds them by key, as etcd's
//! `watcher.go` / `watcher_group.go`.
//!
//! A watcher follows a [`WatchRange`] from a revision on (`min_rev`: the
//! next revision it still needs). It is in exactly one of three states
//! (see [`crate::watchable_store`] for the transitions):
//!
//! ```text
//! synced    has seen every revision <= the store's notified revision; fed by notify
//! unsynced  min_rev <= notified revision; caught up from the backend history
//! victim    its stream's channel was full; holds the responses it could not send
//! ```

use foldhash::HashMap;
use std::collections::BTreeSet;

use crate::watch_reply::ReplyBatch;
use retcd_api::mvccpb::{event::EventType, Event};

/// A watch id, unique inside one watch stream (etcd's `WatchID`).
pub type WatchId = i64;

/// Identifies a watcher in the store: (stream id, watch id).
pub(crate) type WatcherKey = (u64, WatchId);

/// Errors of watch creation; the texts are etcd's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// `range_end` is set and not after `key`.
    #[error("mvcc: watcher range is empty")]
    EmptyRange,
    /// The client chose a watch id already used on this stream.
    #[error("mvcc: duplicate watch ID provided on the WatchStream")]
    DuplicateId,
    /// The stream was closed.
    #[error("mvcc: watcher does not exist")]
    NotExist,
}

/// The keys a watcher follows, from a request's `key` and `range_end`
/// (etcd's conventions, as in the v3rpc layer):
///
/// ```text
/// key "a", range_end ""      -> Single("a")
/// key "a", range_end "\0"    -> From("a")            every key >= "a"
/// key "a", range_end "b"     -> Between("a", "b")     [a, b)
/// key "",  range_end "\0"    -> From("\0")           every key (empty key means "\0")
/// key "b", range_end "a"     -> EmptyRange error
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchRange {
    /// Exactly this key.
    Single(Vec<u8>),
    /// Every key `>= from`.
    From(Vec<u8>),
    /// Every key in `[from, to)`.
    Between(Vec<u8>, Vec<u8>),
}

impl WatchRange {
    /// Interprets a watch create request's `key` / `range_end`.
    pub fn new(key: &[u8], range_end: &[u8]) -> Result<WatchRange, WatchError> {
        let key = if key.is_empty() {
            vec![0]
        } else {
            key.to_vec()
        };
        Ok(match range_end {
            [] => WatchRange::Single(key),
            [0] => WatchRange::From(key),
            end if key.as_slice() >= end => return Err(WatchError::EmptyRange),
            end => WatchRange::Between(key, end.to_vec()),
        })
    }

    /// Whether `k` lies in the range.
    pub fn contains(&self, k: &[u8]) -> bool {
        match self {
            WatchRange::Single(key) => k == key.as_slice(),
            WatchRange::From(from) => k >= from.as_slice(),
            WatchRange::Between(from, to) => k >= from.as_slice() && k < to.as_slice(),
        }
    }
}

/// What a watcher asks for besides its range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// First revision wanted; 0 = the next revision.
    pub start_rev: i64,
    /// Send the previous key-value with each event.
    pub prev_kv: bool,
    /// Drop PUT events (etcd's `FilterType::NOPUT`).
    pub no_put: bool,
    /// Drop DELETE events (`NODELETE`).
    pub no_delete: bool,
    /// Send an empty response every progress interval without events.
    pub progress_notify: bool,
    /// The start revision the client asked for (0: none; `start_rev` may
    /// be filled in for it). While the store is below it, the watcher's
    /// stream gets no progress response, requested or periodic (etcd
    /// 3.5.22+, #20290: a progress revision must not be below a watch's
    /// start).
    pub requested_rev: i64,
}

/// Where a watcher is; see the module documentation.
#[derive(Debug)]
pub(crate) enum WatcherState {
    Synced,
    Unsynced,
    /// Responses not yet accepted by the stream, oldest first. `compacted`:
    /// the last one cancels the watcher, which is removed once it is sent.
    Victim {
        pending: ReplyBatch,
        compacted: bool,
    },
}

/// One watcher; owned by the store's `Inner`.
#[derive(Debug)]
pub(crate) struct Watcher {
    pub(crate) range: WatchRange,
    /// The next revision this watcher needs. Exact for unsynced watchers and
    /// victims; for a synced watcher it is a lower bound (notify does not
    /// advance it: a synced watcher has seen everything the store notified).
    pub(crate) min_rev: i64,
    pub(crate) opts: WatchOptions,
    /// Whether events were queued since the last progress tick.
    pub(crate) sent_since_tick: bool,
    /// `notify`'s scratch: (call number, index of this watcher's entry in
    /// that call's plan); stale when the number is not the current call's.
    pub(crate) notify_slot: (u64, usize),
    pub(crate) state: WatcherState,
}

impl Watcher {
    /// Whether this watcher wants `ev`: `None` if filtered out, otherwise
    /// whether it gets the event's `prev_kv` (asked for and present).
    pub(crate) fn wants(&self, ev: &Event) -> Option<bool> {
        let put = ev.r#type == EventType::Put as i32;
        if (put && self.opts.no_put) || (!put && self.opts.no_delete) {
            return None;
        }
        Some(self.opts.prev_kv && ev.prev_kv.is_some())
    }
}

/// Synced watchers indexed for notify: one map for single-key watchers
/// (etcd's `keyWatchers`) and a list of range watchers (etcd uses an
/// interval tree; a linear scan is enough until range watchers number in
/// the thousands). A key's watchers are ordered by stream, so `notify`
/// meets each stream's watchers one after another.
#[derive(Debug, Default)]
pub(crate) struct WatcherGroup {
    single: HashMap<Vec<u8>, BTreeSet<WatcherKey>>,
    ranges: BTreeSet<WatcherKey>,
}

impl WatcherGroup {
    pub(crate) fn add(&mut self, wk: WatcherKey, range: &WatchRange) {
        match range {
            WatchRange::Single(k) => {
                self.single.entry(k.clone()).or_default().insert(wk);
            }
            _ => {
                self.ranges.insert(wk);
            }
        }
    }

    pub(crate) fn remove(&mut self, wk: WatcherKey, range: &WatchRange) -> bool {
        match range {
            WatchRange::Single(k) => match self.single.get_mut(k) {
                Some(set) => {
                    let removed = set.remove(&wk);
                    if set.is_empty() {
                        self.single.remove(k);
                    }
                    removed
                }
                None => false,
            },
            _ => self.ranges.remove(&wk),
        }
    }

    /// Watchers whose range may contain `key`, each with whether it is
    /// known to: the exact-key watchers (true: their range is `key`) and
    /// every range watcher (false: the caller checks the range).
    pub(crate) fn candidates<'a>(
        &'a self,
        key: &[u8],
    ) -> impl Iterator<Item = (WatcherKey, bool)> + 'a {
        (self.single.get(key).into_iter().flatten())
            .map(|&wk| (wk, true))
            .chain(self.ranges.iter().map(|&wk| (wk, false)))
    }

    pub(crate) fn clear(&mut self) {
        self.single.clear();
        self.ranges.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_watch_range_new() {
        assert_eq!(
            WatchRange::new(b"a", b""),
            Ok(WatchRange::Single(b"a".to_vec()))
        );
        assert_eq!(WatchRange::new(b"", b"\0"), Ok(WatchRange::From(vec![0])));
        assert_eq!(
            WatchRange::new(b"a", b"b"),
            Ok(WatchRange::Between(b"a".to_vec(), b"b".to_vec()))
        );
        assert_eq!(WatchRange::new(b"b", b"a"), Err(WatchError::EmptyRange));
        assert_eq!(WatchRange::new(b"a", b"a"), Err(WatchError::EmptyRange));
        let r = WatchRange::new(b"a", b"c").unwrap();
        assert!(r.contains(b"a") && r.contains(b"bzz") && !r.contains(b"c"));
        assert!(WatchRange::new(b"", b"\0").unwrap().contains(b"\0"));
    }

    #[test]
    fn test_watcher_group_candidates() {
        let mut g = WatcherGroup::default();
        g.add((1, 0), &WatchRange::Single(b"a".to_vec()));
        g.add((1, 1), &WatchRange::From(b"a".to_vec()));
        g.add((2, 0), &WatchRange::Single(b"b".to_vec()));
        let mut c: Vec<_> = g.candidates(b"a").collect();
        c.sort();
        assert_eq!(c, vec![((1, 0), true), ((1, 1), false)]);
        assert!(g.remove((1, 0), &WatchRange::Single(b"a".to_vec())));
        assert!(!g.remove((1, 0), &WatchRange::Single(b"a".to_vec())));
        assert_eq!(
            g.candidates(b"a").collect::<Vec<_>>(),
            vec![((1, 1), false)]
        );
    }
}
