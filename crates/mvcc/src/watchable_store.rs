//! [`WatchableStore`]: watchers over the [`KvStore`], as etcd's
//! `watchable_store.go`.
//!
//! # How events reach a watcher
//!
//! Every watch stream has one bounded channel (a [`WatchSink`]) of
//! messages, each a [`ReplyBatch`] (a list of [`WatchReply`]s and the
//! buffers of encoded events they share) taken or refused whole; all its
//! watchers send into it with `try_send`, which never blocks. A watcher is
//! in one of three states ([`crate::watcher_group`]):
//!
//! * **synced**: the apply thread calls [`WatchableStore::notify`] after each
//!   committed batch; it sends each synced watcher one response holding its
//!   matching events of every revision in the batch (all events of a txn
//!   together; cut at revision boundaries above [`MERGE_LIMIT_BYTES`]).
//!   Each event is encoded once for all watchers ([`crate::watch_reply`]),
//!   and a stream gets one message with the replies of all its watchers.
//! * **unsynced**: its start revision is in the past (or it fell behind).
//!   The `watch-sync` thread reads the history from the backend by
//!   revision, outside the lock, in chunks of [`MAX_REVS_PER_SYNC`]
//!   revisions, sends one response per chunk, and moves the watcher to
//!   synced once it has everything up to the notified revision.
//! * **victim**: a `try_send` found the channel full. Each watcher of the
//!   refused message keeps its own replies and leaves the synced/unsynced
//!   sets; the sync thread retries every [`VICTIM_RETRY`]. When the channel
//!   takes them, the
//!   watcher goes back to unsynced (and catches up from history) or synced.
//!   A slow client therefore never blocks apply or other streams, and no
//!   event is dropped.
//!
//! Worked example (channel capacity 1, watcher on `a` from revision 0,
//! store at revision 5):
//!
//! ```text
//! watch                 -> synced, min_rev 6
//! notify rev 6 (put a)  -> sent: channel [6]
//! notify rev 7 (put a)  -> channel full: victim with [7], min_rev 8
//! notify rev 8 (put a)  -> not synced: nothing sent (history keeps it)
//! client reads 6        -> sync thread sends 7; min_rev 8 <= notified 8 -> unsynced
//! sync thread           -> reads revisions 8..=8 from the backend, sends them, -> synced
//! ```
//!
//! Compaction: an unsynced watcher whose `min_rev` is below the compaction
//! revision gets one response with `compact_revision` set and
//! `canceled = true`, and is removed (etcd's rule: `min_rev < compact_rev`).
//!
//! # Locks
//!
//! `inner` (parking_lot Mutex) protects every watcher, the synced index,
//! the unsynced and victim sets, the streams and the notified revision.
//! It is held only for in-memory work and non-blocking `try_send`s, never
//! across backend reads (the sync thread reads the history unlocked and
//! re-checks each watcher afterwards) and never across `.await`. Lock
//! order: `inner`, then the [`KvStore`] locks; the KvStore never calls in.
//!
//! # Threads
//!
//! `notify` and `restore` run on the apply (raft) thread; stream calls on
//! tokio tasks (all short and non-blocking); one `watch-sync` OS thread
//! does catch-up reads, victim retries and deferred progress responses. It
//! ends when the store is dropped.

use foldhash::HashMap;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use retcd_api::etcdserverpb::{RangeRequest, ResponseHeader, WatchResponse};
use retcd_api::mvccpb::{event::EventType, Event};

use crate::kvstore::KvStore;
use crate::watch_history::read_events;
use crate::watch_reply::{EncodedEvents, Picks, ReplyBatch, SharedEvents, WatchReply};
use crate::watcher_group::{
    WatchError, WatchId, WatchOptions, WatchRange, Watcher, WatcherGroup, WatcherKey, WatcherState,
};

/// Most revisions one catch-up response covers (etcd's `watchBatchMaxRevs`).
pub const MAX_REVS_PER_SYNC: i64 = 1000;
/// Most unsynced watchers handled per sync round (etcd's `maxWatchersPerSync`).
pub const MAX_WATCHERS_PER_SYNC: usize = 512;
/// Period of the sync thread when nothing wakes it.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(100);
/// Period of victim retries while there are victims.
pub const VICTIM_RETRY: Duration = Duration::from_millis(10);
/// [`WatchableStore::notify`] merges a committed batch's revisions into one
/// response per watcher up to this many (estimated) bytes of events: well
/// under gRPC's default 4 MiB receive limit and the fragmenting threshold.
pub const MERGE_LIMIT_BYTES: usize = 64 * 1024;
/// Watch id of a stream-wide progress response.
pub const PROGRESS_ALL_ID: WatchId = -1;

/// Why a [`WatchSink`] refused a message.
#[derive(Debug)]
pub enum SinkError {
    /// The channel is full; the replies are handed back.
    Full(ReplyBatch),
    /// The receiving side is gone.
    Closed,
}

/// The sending side of one watch stream's bounded channel. A message is a
/// non-empty list of replies, taken or refused whole: `notify` sends one
/// per stream per committed batch, holding the replies of all the stream's
/// watchers. `try_send` must not block: it is called with the store lock
/// held, on the apply thread.
pub trait WatchSink: Send + Sync + 'static {
    /// Queues `replies` or says why not.
    fn try_send(&self, replies: ReplyBatch) -> Result<(), SinkError>;
}

/// For in-process readers (tests): responses arrive with their events
/// decoded.
impl WatchSink for SyncSender<Vec<WatchResponse>> {
    fn try_send(&self, replies: ReplyBatch) -> Result<(), SinkError> {
        SyncSender::try_send(self, replies.into_responses()).map_err(|e| match e {
            TrySendError::Full(b) => SinkError::Full(ReplyBatch::from_parts(
                Default::default(),
                b.into_iter().map(Into::into).collect(),
            )),
            TrySendError::Disconnected(_) => SinkError::Closed,
        })
    }
}

fn response(watch_id: WatchId, revision: i64, events: Vec<Event>) -> WatchResponse {
    WatchResponse {
        header: Some(ResponseHeader {
            revision,
            ..Default::default()
        }),
        watch_id,
        events,
        ..Default::default()
    }
}

/// The replies `notify` sends one stream in one message.
struct StreamReplies {
    stream: u64,
    batch: ReplyBatch,
    /// Per watcher: its key, how many of `replies` are its, its next revision.
    members: Vec<(WatcherKey, usize, i64)>,
}

impl StreamReplies {
    /// The index in `groups` of stream `stream`'s group (`group_of` maps
    /// streams to indices), added if it has none yet: no replies, and
    /// `bufs` for the replies to point into.
    fn index_of(
        groups: &mut Vec<StreamReplies>,
        group_of: &mut HashMap<u64, usize>,
        stream: u64,
        bufs: &[Arc<EncodedEvents>],
    ) -> usize {
        *group_of.entry(stream).or_insert_with(|| {
            groups.push(StreamReplies {
                stream,
                batch: ReplyBatch::from_parts(bufs.iter().cloned().collect(), Vec::new()),
                members: Vec::new(),
            });
            groups.len() - 1
        })
    }
}

/// A reply of watcher `watch_id` at `revision` with the shared events
/// `picks` of `enc`, the only buffer of the message that will carry it.
fn shared(watch_id: WatchId, revision: i64, enc: &EncodedEvents, picks: &[u32]) -> WatchReply {
    WatchReply::with_shared(watch_id, revision, SharedEvents::new(0, enc, picks))
}

/// Whether `ev` could have a `prev_kv` but has none: anything but a
/// creation (history events never carry one; a committed put carries it
/// only if it was read).
fn lacks_prev_kv(ev: &Event) -> bool {
    let Some(kv) = &ev.kv else { return false };
    let create = ev.r#type == EventType::Put as i32 && kv.create_revision == kv.mod_revision;
    ev.prev_kv.is_none() && !create
}

/// Encodes `ev` without its `prev_kv`.
fn push_without_prev(enc: &mut EncodedEvents, ev: &Event) -> u32 {
    if ev.prev_kv.is_none() {
        return enc.push(ev);
    }
    enc.push(&Event {
        r#type: ev.r#type,
        kv: ev.kv.clone(),
        prev_kv: None,
    })
}

struct StreamState {
    sink: Arc<dyn WatchSink>,
    /// Ids in use: reserved or watching.
    ids: BTreeSet<WatchId>,
    next_id: WatchId,
    /// A progress request waits for every watcher of the stream to be synced.
    progress_pending: bool,
}

#[derive(Default)]
struct Inner {
    /// The last revision handed to notify (or restored): synced watchers
    /// have seen every event up to it.
    rev: i64,
    /// Bumped by `restore`; a sync round started before it is discarded.
    generation: u64,
    watchers: HashMap<WatcherKey, Watcher>,
    synced: WatcherGroup,
    unsynced: BTreeSet<WatcherKey>,
    victims: BTreeSet<WatcherKey>,
    streams: HashMap<u64, StreamState>,
    next_stream: u64,
    /// Number of the last `notify` call (see `Watcher::notify_slot`).
    notify_gen: u64,
    /// How many of `watchers` asked for `prev_kv`; shared with the store,
    /// whose puts read the value they replace only while it is not zero.
    /// Changed only under this lock, so `notify` sees it exact.
    prev_kv_watchers: Arc<AtomicUsize>,
    /// `notify`'s working lists, kept between calls with their capacity: a
    /// put fanned out to N watchers would otherwise grow them from empty,
    /// copying them at every doubling, on each notify.
    wanted_buf: Vec<(WatcherKey, Picks)>,
}

impl Inner {
    /// Parks watcher `wk` as a victim holding `pending`; it needs
    /// `next_rev` next. Removes it from the synced/unsynced sets.
    /// `pending` holds only its own events (see [`ReplyBatch::detached_from`]):
    /// a victim may wait long.
    fn park(&mut self, wk: WatcherKey, pending: ReplyBatch, next_rev: i64, events: bool) {
        if let Some(w) = self.watchers.get_mut(&wk) {
            self.synced.remove(wk, &w.range);
            self.unsynced.remove(&wk);
            w.min_rev = next_rev;
            w.sent_since_tick |= events;
            w.state = WatcherState::Victim {
                pending,
                compacted: false,
            };
            self.victims.insert(wk);
        }
    }

    /// Sends each stream its group's replies in one message; `sent` runs
    /// for every watcher of a group its stream took. When a stream's
    /// channel is full, each watcher of its group is parked with its own
    /// replies. Returns whether any was parked.
    fn send_groups(
        &mut self,
        groups: Vec<StreamReplies>,
        mut sent: impl FnMut(&mut Inner, WatcherKey),
    ) -> bool {
        let mut parked = false;
        for StreamReplies {
            stream,
            batch,
            members,
        } in groups
        {
            let Some(st) = self.streams.get(&stream) else {
                continue;
            };
            match st.sink.try_send(batch) {
                Ok(()) => members.iter().for_each(|m| sent(self, m.0)),
                Err(SinkError::Full(back)) => {
                    parked = true;
                    let (bufs, replies) = back.into_parts();
                    let mut back = replies.into_iter();
                    for (wk, n, next_rev) in members {
                        let own = ReplyBatch::detached_from(&bufs, back.by_ref().take(n).collect());
                        self.park(wk, own, next_rev, true);
                    }
                }
                // the stream is going away; its handle's Drop removes it
                Err(SinkError::Closed) => {}
            }
        }
        parked
    }

    fn set_synced(&mut self, wk: WatcherKey) {
        if let Some(w) = self.watchers.get_mut(&wk) {
            self.unsynced.remove(&wk);
            self.victims.remove(&wk);
            w.state = WatcherState::Synced;
            self.synced.add(wk, &w.range);
        }
    }

    fn set_unsynced(&mut self, wk: WatcherKey) {
        if let Some(w) = self.watchers.get_mut(&wk) {
            if matches!(w.state, WatcherState::Synced) {
                self.synced.remove(wk, &w.range);
            }
            self.victims.remove(&wk);
            w.state = WatcherState::Unsynced;
            self.unsynced.insert(wk);
        }
    }

    /// Stops watcher `wk` and frees its id; false if neither existed (an
    /// id reserved, or kept after a compaction cancelled its watcher,
    /// counts).
    fn remove_watcher(&mut self, wk: WatcherKey) -> bool {
        let removed = self.drop_watcher(wk);
        let freed = self
            .streams
            .get_mut(&wk.0)
            .is_some_and(|s| s.ids.remove(&wk.1));
        removed || freed
    }

    /// A watcher the compaction cancelled: it stops, but its id stays
    /// taken on its stream until the client cancels it, as etcd's watch
    /// stream keeps it (the cancel is then answered; a create may not
    /// reuse the id, and an automatic id skips it).
    fn compacted_away(&mut self, wk: WatcherKey) {
        self.drop_watcher(wk);
    }

    /// Stops watcher `wk`; its id is left to the caller.
    fn drop_watcher(&mut self, wk: WatcherKey) -> bool {
        let Some(w) = self.watchers.remove(&wk) else {
            return false;
        };
        if w.opts.prev_kv {
            self.prev_kv_watchers.fetch_sub(1, Ordering::Relaxed);
        }
        self.synced.remove(wk, &w.range);
        self.unsynced.remove(&wk);
        self.victims.remove(&wk);
        true
    }

    /// Whether a progress response may go to `stream` now (etcd's
    /// `progressIfSync`): every watcher is synced and none started at a
    /// revision the store has not reached.
    fn stream_synced(&self, stream: u64) -> bool {
        self.streams.get(&stream).is_some_and(|s| {
            s.ids.iter().all(|id| {
                self.watchers
                    .get(&(stream, *id))
                    .is_none_or(|w| self.may_progress(w))
            })
        })
    }

    /// Whether watcher `w` may get a progress response now.
    fn may_progress(&self, w: &Watcher) -> bool {
        matches!(w.state, WatcherState::Synced) && self.rev >= w.opts.requested_rev
    }

    /// Whether `stream` has a watcher (reserved ids do not count).
    fn has_watchers(&self, stream: u64) -> bool {
        self.streams.get(&stream).is_some_and(|s| {
            s.ids
                .iter()
                .any(|id| self.watchers.contains_key(&(stream, *id)))
        })
    }

    /// Sends the stream's deferred progress response if it can now.
    fn flush_progress(&mut self, stream: u64) {
        if !self.stream_synced(stream) {
            return;
        }
        let rev = self.rev;
        if let Some(s) = self.streams.get_mut(&stream) {
            if s.progress_pending
                && s.sink
                    .try_send(response(PROGRESS_ALL_ID, rev, vec![]).into())
                    .is_ok()
            {
                s.progress_pending = false;
            }
        }
    }
}

/// The watchable store; see the module documentation.
pub struct WatchableStore {
    kv: Arc<KvStore>,
    inner: Mutex<Inner>,
    /// Wakes the sync thread (capacity 1; a full queue already wakes it).
    kick: SyncSender<()>,
}

impl std::fmt::Debug for WatchableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.inner.lock();
        f.debug_struct("WatchableStore")
            .field("rev", &i.rev)
            .field("watchers", &i.watchers.len())
            .field("unsynced", &i.unsynced.len())
            .field("victims", &i.victims.len())
            .finish()
    }
}

impl WatchableStore {
    /// Watches `kv` (at its current revision) and starts the `watch-sync`
    /// thread.
    pub fn new(kv: Arc<KvStore>) -> Arc<WatchableStore> {
        let (kick, rx) = sync_channel(1);
        let store = Arc::new(WatchableStore {
            inner: Mutex::new(Inner {
                rev: kv.current_revision(),
                prev_kv_watchers: kv.prev_kv_watchers.clone(),
                ..Default::default()
            }),
            kv,
            kick,
        });
        let weak = Arc::downgrade(&store);
        std::thread::Builder::new()
            .name("watch-sync".into())
            .spawn(move || sync_loop(weak, rx))
            .expect("spawn the watch-sync thread");
        store
    }

    /// The last revision notified: what a new watcher from "now" has seen.
    pub fn rev(&self) -> i64 {
        self.inner.lock().rev
    }

    /// How many watchers are parked as victims (tests).
    #[cfg(test)]
    pub(crate) fn victim_count(&self) -> usize {
        self.inner.lock().victims.len()
    }

    fn wake(&self) {
        let _ = self.kick.try_send(());
    }

    /// Hands the events of a committed batch to the synced watchers; `rev`
    /// is the store revision after the batch. Called on the apply thread,
    /// in commit order; never blocks.
    ///
    /// A watcher gets one response for the batch holding its events of
    /// every revision in it, in order (as etcd's catch-up path sends
    /// several revisions in one response), cut at revision boundaries so
    /// that no response grows past [`MERGE_LIMIT_BYTES`] unless one
    /// revision alone does. A revision's events are never split.
    pub fn notify(&self, rev: i64, mut events: Vec<(i64, Event)>) {
        let mut guard = self.inner.lock();
        // A put reads the value it replaces only while some watcher wants
        // prev_kv; one that started since gets it read here (the count
        // only changes under this lock, so after this check no watcher
        // that wants it can appear before the plan below).
        if guard.prev_kv_watchers.load(Ordering::Relaxed) > 0
            && events.iter().any(|(_, ev)| lacks_prev_kv(ev))
        {
            drop(guard);
            self.fill_prev_kv(&mut events, |_| true);
            guard = self.inner.lock();
        }
        let inner = &mut *guard;
        // Who wants what: per watcher (in order of its first event in the
        // batch) the events it gets, each as `2 * index + with_prev_kv`;
        // per event, which of its two encodings someone needs.
        let mut wanted = std::mem::take(&mut inner.wanted_buf);
        // a watcher's entry in `wanted` is remembered in the watcher itself,
        // stamped with this call's number
        inner.notify_gen += 1;
        let gen = inner.notify_gen;
        let mut need = vec![[false; 2]; events.len()];
        let Inner {
            synced, watchers, ..
        } = &mut *inner;
        for (i, (r, ev)) in events.iter().enumerate() {
            let key = ev.kv.as_ref().map(|kv| kv.key.as_ref()).unwrap_or_default();
            for (wk, exact) in synced.candidates(key) {
                let Some(w) = watchers.get_mut(&wk) else {
                    continue;
                };
                // an exact-key candidate's range is this key: no compare
                debug_assert!(!exact || w.range.contains(key));
                if w.min_rev > *r || (!exact && !w.range.contains(key)) {
                    continue;
                }
                let Some(prev) = w.wants(ev) else { continue };
                if w.notify_slot.0 != gen {
                    w.notify_slot = (gen, wanted.len());
                    // sent or parked below, either way it got events
                    w.sent_since_tick = true;
                    wanted.push((wk, Picks::new()));
                }
                wanted[w.notify_slot.1]
                    .1
                    .push(2 * i as u32 + u32::from(prev));
                need[i][usize::from(prev)] = true;
            }
        }
        let mut parked = false;
        if !wanted.is_empty() {
            // each needed encoding of each event, once
            let mut enc = EncodedEvents::default();
            let at: Vec<[u32; 2]> = events
                .iter()
                .zip(&need)
                .map(|((_, ev), need)| {
                    [
                        if need[0] {
                            push_without_prev(&mut enc, ev)
                        } else {
                            0
                        },
                        if need[1] { enc.push(ev) } else { 0 },
                    ]
                })
                .collect();
            // the message to each stream holds the buffer once: its replies
            // point into it (no reference count per watcher)
            let bufs = [Arc::new(enc)];
            let enc = &*bufs[0];
            // each watcher's stream group, and each group's lists sized to
            // its watchers up front (mostly one reply per watcher)
            let mut groups: Vec<StreamReplies> = Vec::new();
            let mut group_of: HashMap<u64, usize> = HashMap::default();
            // watchers per group
            let mut sizes: Vec<usize> = Vec::new();
            // a key's watchers come in stream order: the group is mostly
            // the last one's
            let mut last: Option<(u64, usize)> = None;
            let group_at: Vec<usize> = wanted
                .iter()
                .map(|(wk, _)| {
                    let g = match last {
                        Some((stream, g)) if stream == wk.0 => g,
                        _ => StreamReplies::index_of(&mut groups, &mut group_of, wk.0, &bufs),
                    };
                    last = Some((wk.0, g));
                    if g == sizes.len() {
                        sizes.push(0);
                    }
                    sizes[g] += 1;
                    g
                })
                .collect();
            for (group, n) in groups.iter_mut().zip(sizes) {
                group.batch.replies.reserve_exact(n);
                group.members.reserve_exact(n);
            }
            // The last watcher's picks (as gathered) and its one reply's
            // revision and events: the next watcher with the same picks
            // (watchers of one key with the same options get the same
            // events) takes a copy of them instead of planning again.
            let mut last_plan: Option<(Picks, i64, SharedEvents)> = None;
            for ((wk, mut picks), g) in wanted.drain(..).zip(group_at) {
                let group = &mut groups[g];
                let plan = match last_plan.take() {
                    Some(plan) if plan.0 == picks => plan,
                    _ => {
                        let gathered = picks.clone();
                        // one response per watcher, cut at a revision boundary
                        // when it would pass MERGE_LIMIT_BYTES (never inside
                        // one): `cuts` holds (end, last revision) of each
                        let mut cuts: smallvec::SmallVec<[(usize, i64); 2]> =
                            smallvec::SmallVec::new();
                        let (mut size, mut last) = (0, 0);
                        for (k, pick) in picks.iter_mut().enumerate() {
                            let (i, prev) = ((*pick / 2) as usize, (*pick % 2) as usize);
                            let (r, e) = (events[i].0, at[i][prev]);
                            let len = enc.len_of(e);
                            let start = cuts.last().map_or(0, |c| c.0);
                            if r != last && k > start && size + len > MERGE_LIMIT_BYTES {
                                cuts.push((k, last));
                                size = 0;
                            }
                            *pick = e;
                            size += len;
                            last = r;
                        }
                        cuts.push((picks.len(), last));
                        if cuts.len() > 1 {
                            group.members.push((wk, cuts.len(), last + 1));
                            let mut start = 0;
                            for (end, rev) in cuts {
                                let chunk = &picks[start..end];
                                start = end;
                                group.batch.replies.push(shared(wk.1, rev, enc, chunk));
                            }
                            continue;
                        }
                        (gathered, last, SharedEvents::new(0, enc, &picks))
                    }
                };
                group.members.push((wk, 1, plan.1 + 1));
                (group.batch.replies).push(WatchReply::with_shared(wk.1, plan.1, plan.2.clone()));
                last_plan = Some(plan);
            }
            parked = inner.send_groups(groups, |_, _| {});
        }
        debug_assert!(wanted.is_empty());
        inner.wanted_buf = wanted;
        inner.rev = inner.rev.max(rev);
        drop(guard);
        if parked {
            self.wake();
        }
    }

    /// After the store was replaced by a snapshot: every synced watcher goes
    /// back to unsynced from the revision after the last one notified.
    pub fn restore(&self) {
        let mut inner = self.inner.lock();
        let old = inner.rev;
        inner.rev = self.kv.current_revision();
        inner.generation += 1;
        inner.synced.clear();
        let inner = &mut *inner;
        for (wk, w) in inner.watchers.iter_mut() {
            if matches!(w.state, WatcherState::Synced) {
                w.min_rev = w.min_rev.max(old + 1);
                w.state = WatcherState::Unsynced;
                inner.unsynced.insert(*wk);
            }
        }
        self.wake();
    }

    /// Opens a watch stream whose watchers send into `sink`.
    pub fn new_stream(self: &Arc<Self>, sink: Arc<dyn WatchSink>) -> WatchStream {
        let mut inner = self.inner.lock();
        let id = inner.next_stream;
        inner.next_stream += 1;
        inner.streams.insert(
            id,
            StreamState {
                sink,
                ids: BTreeSet::new(),
                next_id: 0,
                progress_pending: false,
            },
        );
        WatchStream {
            store: self.clone(),
            id,
        }
    }

    /// For etcd's gauges: (watch streams, watchers in any state, slow
    /// watchers — those catching up from history or parked as victims).
    pub fn gauges(&self) -> (usize, usize, usize) {
        let inner = self.inner.lock();
        (
            inner.streams.len(),
            inner.watchers.len(),
            inner.unsynced.len() + inner.victims.len(),
        )
    }

    /// Retries victims, one message per stream with the pending replies of
    /// all its victims (a message per watcher filled the stream's channel,
    /// which counts messages, with 100 watchers' replies one at a time);
    /// returns whether some are left.
    fn sync_victims(&self) -> bool {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let victims: Vec<WatcherKey> = inner.victims.iter().copied().collect();
        // per stream: the replies, and per victim with some, its count
        let mut groups: Vec<StreamReplies> = Vec::new();
        let mut group_of: HashMap<u64, usize> = HashMap::default();
        let mut ready: Vec<WatcherKey> = Vec::new();
        for wk in victims {
            if !inner.streams.contains_key(&wk.0) {
                continue;
            }
            let Some(w) = inner.watchers.get_mut(&wk) else {
                inner.victims.remove(&wk);
                continue;
            };
            let WatcherState::Victim { pending, .. } = &mut w.state else {
                inner.victims.remove(&wk);
                continue;
            };
            if pending.is_empty() {
                ready.push(wk);
                continue;
            }
            let g = StreamReplies::index_of(&mut groups, &mut group_of, wk.0, &[]);
            groups[g].members.push((wk, pending.len(), w.min_rev));
            groups[g].batch.append(std::mem::take(pending));
        }
        for StreamReplies {
            stream,
            batch,
            members,
        } in groups
        {
            let Some(sink) = inner.streams.get(&stream).map(|s| s.sink.clone()) else {
                continue;
            };
            match sink.try_send(batch) {
                Ok(()) => ready.extend(members.iter().map(|m| m.0)),
                Err(SinkError::Full(back)) => {
                    // each victim gets its replies back, in order
                    let (bufs, replies) = back.into_parts();
                    let mut back = replies.into_iter();
                    for (wk, n, _) in members {
                        let own = back.by_ref().take(n).collect();
                        if let Some(WatcherState::Victim { pending, .. }) =
                            inner.watchers.get_mut(&wk).map(|w| &mut w.state)
                        {
                            pending.append(ReplyBatch::detached_from(&bufs, own));
                        }
                    }
                }
                // the stream is going away; its handle's Drop removes it
                Err(SinkError::Closed) => {}
            }
        }
        for wk in ready {
            let Some(w) = inner.watchers.get(&wk) else {
                continue;
            };
            let WatcherState::Victim { compacted, .. } = w.state else {
                continue;
            };
            if compacted {
                inner.compacted_away(wk);
            } else if w.min_rev <= inner.rev {
                inner.set_unsynced(wk);
            } else {
                inner.set_synced(wk);
            }
        }
        let streams: Vec<u64> = inner.streams.keys().copied().collect();
        for s in streams {
            inner.flush_progress(s);
        }
        !inner.victims.is_empty()
    }

    /// One catch-up round for up to [`MAX_WATCHERS_PER_SYNC`] unsynced
    /// watchers. Returns whether another round should run at once.
    fn sync_watchers(&self) -> bool {
        struct Chosen {
            wk: WatcherKey,
            range: WatchRange,
            min_rev: i64,
            prev_kv: bool,
        }
        let (chosen, cur_rev, generation) = {
            let mut inner = self.inner.lock();
            let ready: Vec<WatcherKey> = inner
                .unsynced
                .iter()
                .filter(|wk| {
                    inner
                        .watchers
                        .get(wk)
                        .is_some_and(|w| w.min_rev > inner.rev)
                })
                .copied()
                .collect();
            for wk in ready {
                inner.set_synced(wk);
            }
            let chosen: Vec<Chosen> = inner
                .unsynced
                .iter()
                .take(MAX_WATCHERS_PER_SYNC)
                .filter_map(|wk| {
                    inner.watchers.get(wk).map(|w| Chosen {
                        wk: *wk,
                        range: w.range.clone(),
                        min_rev: w.min_rev,
                        prev_kv: w.opts.prev_kv,
                    })
                })
                .collect();
            (chosen, inner.rev, inner.generation)
        };
        if chosen.is_empty() {
            return false;
        }
        let published = self.kv.published.read().clone();
        let compact_rev = published.compact_rev;
        let min = chosen
            .iter()
            .filter(|c| c.min_rev >= compact_rev)
            .map(|c| c.min_rev)
            .min();
        let (events, end) = match min {
            Some(min) => {
                let end = cur_rev.min(min.saturating_add(MAX_REVS_PER_SYNC - 1));
                let mut events = match read_events(&published.rows_at(), min, end, compact_rev) {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "watch: cannot read the history; will retry");
                        return false;
                    }
                };
                let prev_ranges: Vec<&WatchRange> = chosen
                    .iter()
                    .filter(|c| c.prev_kv)
                    .map(|c| &c.range)
                    .collect();
                if !prev_ranges.is_empty() {
                    self.fill_prev_kv(&mut events, |key| {
                        prev_ranges.iter().any(|rg| rg.contains(key))
                    });
                }
                (events, end)
            }
            None => (Vec::new(), cur_rev),
        };

        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if inner.generation != generation {
            return true;
        }
        // each needed encoding of each event (without / with prev_kv), and
        // per watcher that gets events, the ones it gets
        let mut enc = EncodedEvents::default();
        let mut at: Vec<[Option<u32>; 2]> = vec![[None; 2]; events.len()];
        let mut answers: Vec<(WatcherKey, Picks)> = Vec::new();
        for c in chosen {
            let Some(w) = inner.watchers.get_mut(&c.wk) else {
                continue;
            };
            if !matches!(w.state, WatcherState::Unsynced) || w.min_rev != c.min_rev {
                continue;
            }
            if compact_rev > 0 && w.min_rev < compact_rev {
                let resp = WatchResponse {
                    watch_id: c.wk.1,
                    compact_revision: compact_rev,
                    canceled: true,
                    header: Some(ResponseHeader::default()),
                    ..Default::default()
                };
                let sent = inner
                    .streams
                    .get(&c.wk.0)
                    .map(|s| s.sink.try_send(resp.into()));
                match sent {
                    Some(Err(SinkError::Full(resp))) => {
                        inner.unsynced.remove(&c.wk);
                        w.state = WatcherState::Victim {
                            pending: resp,
                            compacted: true,
                        };
                        inner.victims.insert(c.wk);
                    }
                    _ => {
                        inner.compacted_away(c.wk);
                    }
                }
                continue;
            }
            if w.min_rev > end {
                continue;
            }
            // the events it gets, each encoded once for every watcher of
            // the round (as notify does): 1 000 watchers catching up on the
            // same revisions cost one encoding of them, not 1 000
            let mut picks = Picks::new();
            for (i, (r, ev)) in events.iter().enumerate() {
                let key = ev.kv.as_ref().map(|k| k.key.as_ref()).unwrap_or_default();
                if *r < c.min_rev || !c.range.contains(key) {
                    continue;
                }
                let Some(prev) = w.wants(ev) else { continue };
                let e = *at[i][usize::from(prev)].get_or_insert_with(|| {
                    if prev {
                        enc.push(ev)
                    } else {
                        push_without_prev(&mut enc, ev)
                    }
                });
                picks.push(e);
            }
            // a watcher of a future revision (unsynced by a restore) is
            // not lowered (etcd 3.5.22+)
            w.min_rev = w.min_rev.max(end + 1);
            if picks.is_empty() {
                if end >= inner.rev {
                    inner.set_synced(c.wk);
                }
                continue;
            }
            w.sent_since_tick = true;
            answers.push((c.wk, picks));
        }
        // one message per stream with the replies of all its watchers
        let bufs = [Arc::new(enc)];
        let mut groups: Vec<StreamReplies> = Vec::new();
        let mut group_of: HashMap<u64, usize> = HashMap::default();
        for (wk, picks) in answers {
            let g = StreamReplies::index_of(&mut groups, &mut group_of, wk.0, &bufs);
            groups[g]
                .batch
                .replies
                .push(shared(wk.1, end, &bufs[0], &picks));
            groups[g].members.push((wk, 1, end + 1));
        }
        inner.send_groups(groups, |inner, wk| {
            if end >= inner.rev {
                inner.set_synced(wk);
            }
        });
        let streams: Vec<u64> = inner.streams.keys().copied().collect();
        for s in streams {
            inner.flush_progress(s);
        }
        // every round moves each chosen watcher forward, so another round
        // at once cannot spin without progress
        !inner.unsynced.is_empty()
    }

    /// Sets `prev_kv` on the events without one whose key passes `wanted`,
    /// but creations: the key as of the revision before the event (none if
    /// compacted).
    fn fill_prev_kv(&self, events: &mut [(i64, Event)], wanted: impl Fn(&[u8]) -> bool) {
        for (r, ev) in events.iter_mut() {
            if !lacks_prev_kv(ev) {
                continue;
            }
            let Some(kv) = &ev.kv else { continue };
            if !wanted(&kv.key) {
                continue;
            }
            let req = RangeRequest {
                key: kv.key.to_vec(),
                revision: *r - 1,
                ..Default::default()
            };
            if let Ok(resp) = self.kv.range(&req) {
                ev.prev_kv = resp.kvs.into_iter().next();
            }
        }
    }
}

fn sync_loop(store: Weak<WatchableStore>, kick: Receiver<()>) {
    let mut wait = SYNC_INTERVAL;
    loop {
        match kick.recv_timeout(wait) {
            Ok(()) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(s) = store.upgrade() else { return };
        let victims = s.sync_victims();
        let again = s.sync_watchers();
        wait = if again {
            Duration::ZERO
        } else if victims {
            VICTIM_RETRY
        } else {
            SYNC_INTERVAL
        };
    }
}

/// One client watch stream: its watch ids and its sink. Dropping it
/// removes every watcher of the stream.
pub struct WatchStream {
    store: Arc<WatchableStore>,
    id: u64,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream").field("id", &self.id).finish()
    }
}

impl WatchStream {
    /// The last revision notified (the header of a `created` response).
    pub fn rev(&self) -> i64 {
        self.store.rev()
    }

    /// Reserves a watch id: `requested` if non-zero (error if in use), else
    /// the next free one from 0 up (etcd's `AutoWatchID`). The caller sends
    /// the `created` response, then calls [`WatchStream::watch`], so that
    /// the response precedes every event of the watcher.
    pub fn reserve(&self, requested: WatchId) -> Result<WatchId, WatchError> {
        let mut inner = self.store.inner.lock();
        let s = inner
            .streams
            .get_mut(&self.id)
            .ok_or(WatchError::NotExist)?;
        let id = if requested == 0 {
            while s.ids.contains(&s.next_id) {
                s.next_id += 1;
            }
            s.next_id += 1;
            s.next_id - 1
        } else if s.ids.contains(&requested) {
            return Err(WatchError::DuplicateId);
        } else {
            requested
        };
        s.ids.insert(id);
        Ok(id)
    }

    /// Starts reserved watcher `id` on `range` from `opts.start_rev` (0: the
    /// revision after [`WatchStream::rev`]; a past one replays history; a
    /// future one waits for it).
    pub fn watch(&self, id: WatchId, range: WatchRange, opts: WatchOptions) {
        let mut guard = self.store.inner.lock();
        let inner = &mut *guard;
        let cur = inner.rev;
        let synced = opts.start_rev == 0 || opts.start_rev > cur;
        let w = Watcher {
            range,
            min_rev: if synced {
                opts.start_rev.max(cur + 1)
            } else {
                opts.start_rev
            },
            opts,
            sent_since_tick: false,
            notify_slot: (0, 0),
            state: WatcherState::Unsynced,
        };
        let wk = (self.id, id);
        if w.opts.prev_kv {
            inner.prev_kv_watchers.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(old) = inner.watchers.insert(wk, w) {
            if old.opts.prev_kv {
                inner.prev_kv_watchers.fetch_sub(1, Ordering::Relaxed);
            }
        }
        if synced {
            inner.set_synced(wk);
        } else {
            inner.set_unsynced(wk);
            drop(guard);
            self.store.wake();
        }
    }

    /// Cancels watcher `id` (or frees a reserved id). After it returns, no
    /// further response of the watcher is queued. False if unknown.
    pub fn cancel(&self, id: WatchId) -> bool {
        self.store.inner.lock().remove_watcher((self.id, id))
    }

    /// Whether watcher `id` exists (not cancelled, not compacted away).
    pub fn contains(&self, id: WatchId) -> bool {
        self.store
            .inner
            .lock()
            .watchers
            .contains_key(&(self.id, id))
    }

    /// A progress request: an empty response with watch id -1 at the
    /// notified revision, queued in order with the events, once every
    /// watcher of the stream is synced and the store has reached every
    /// watcher's requested start revision (deferred until then). A stream
    /// with no watcher gets nothing (etcd 3.5.8+).
    pub fn request_progress_all(&self) {
        let mut inner = self.store.inner.lock();
        // etcd 3.5.8+ (`progressIfSync` over no watchers): a stream with no
        // watcher is not answered.
        if !inner.has_watchers(self.id) {
            return;
        }
        if let Some(s) = inner.streams.get_mut(&self.id) {
            s.progress_pending = true;
        }
        inner.flush_progress(self.id);
        let pending = inner
            .streams
            .get(&self.id)
            .is_some_and(|s| s.progress_pending);
        drop(inner);
        if pending {
            self.store.wake();
        }
    }

    /// The progress ticker: each synced watcher with `progress_notify` that
    /// got no events since the last tick is sent an empty response at the
    /// notified revision (etcd's `RequestProgress`).
    pub fn progress_tick(&self) {
        let mut guard = self.store.inner.lock();
        let inner = &mut *guard;
        let Some(s) = inner.streams.get(&self.id) else {
            return;
        };
        let rev = inner.rev;
        for id in &s.ids {
            if let Some(w) = inner.watchers.get_mut(&(self.id, *id)) {
                if w.opts.progress_notify
                    && !w.sent_since_tick
                    && matches!(w.state, WatcherState::Synced)
                    && rev >= w.opts.requested_rev
                {
                    let _ = s.sink.try_send(response(*id, rev, vec![]).into());
                }
                w.sent_since_tick = false;
            }
        }
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        let mut inner = self.store.inner.lock();
        let ids: Vec<WatchId> = inner
            .streams
            .get(&self.id)
            .map(|s| s.ids.iter().copied().collect())
            .unwrap_or_default();
        for id in ids {
            inner.remove_watcher((self.id, id));
        }
        inner.streams.remove(&self.id);
    }
}
