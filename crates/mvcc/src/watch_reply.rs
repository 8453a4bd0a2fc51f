//! [`WatchReply`]: what a watch stream queues for its client, with the
//! events of a committed batch encoded once for every watcher.
//!
//! `notify` fans a batch's events out to many watchers (1 000 watchers on
//! one key get the same event 1 000 times). Instead of cloning each event
//! into every watcher's `WatchResponse` and encoding it again per watcher,
//! it encodes each event once into an [`EncodedEvents`] buffer — as the
//! bytes of one `WatchResponse.events` field (tag 11, length,
//! `mvccpb.Event`) — and each watcher's reply holds the shared buffer and
//! the indices of its events. Encoding a reply copies those bytes after the
//! reply's own fields:
//!
//! ```text
//! batch buffer:  [ev0 plain][ev0 with prev_kv][ev1 plain] ...
//! reply A (no prev_kv):   header, watch_id=3  + spans [0, 2]
//! reply B (prev_kv):      header, watch_id=7  + spans [1, 2]   (ev1 had no prev)
//! ```
//!
//! `events` is the last field of `WatchResponse` (11), so the bytes are what
//! prost itself would write for a response holding the same events. A
//! reply never holds both decoded `resp.events` and shared ones.
//!
//! The buffers are held by the message a stream's channel carries, a
//! [`ReplyBatch`] (a stream's replies of one batch and the buffers they
//! point into, usually one), not by each reply: a reply names its buffer
//! by its index in the message. Fanning a batch out to 1 000 watchers
//! then takes one reference count per stream, not one per watcher (each
//! an atomic increment on the apply thread and a decrement on the worker
//! that sent the reply: a fifth of `notify`'s own cycles went to the
//! increment).

use std::collections::hash_map::Entry;
use std::sync::Arc;

use prost::bytes::BufMut;
use prost::Message;
use retcd_api::etcdserverpb::{ResponseHeader, WatchResponse};
use retcd_api::mvccpb::Event;
use smallvec::SmallVec;

/// Field number of `WatchResponse.events`.
const EVENTS_FIELD: u32 = 11;

/// Events encoded once, each as a complete `WatchResponse.events` field.
#[derive(Clone, Debug, Default)]
pub struct EncodedEvents {
    buf: Vec<u8>,
    /// `[start, end)` of each encoded event in `buf`.
    spans: Vec<(usize, usize)>,
}

impl EncodedEvents {
    /// Appends `ev`; returns its index.
    pub(crate) fn push(&mut self, ev: &Event) -> u32 {
        let start = self.buf.len();
        prost::encoding::message::encode(EVENTS_FIELD, ev, &mut self.buf);
        self.spans.push((start, self.buf.len()));
        (self.spans.len() - 1) as u32
    }

    /// Encoded size of event `i` (field tag and length included).
    pub(crate) fn len_of(&self, i: u32) -> usize {
        let (s, e) = self.spans[i as usize];
        e - s
    }

    fn span(&self, i: u32) -> &[u8] {
        let (s, e) = self.spans[i as usize];
        &self.buf[s..e]
    }

    /// Events `[first, end)`, whose encodings lie one after the other in
    /// `buf` (each is appended after the one before it).
    fn spans_of(&self, first: u32, end: u32) -> &[u8] {
        let (s, _) = self.spans[first as usize];
        let (_, e) = self.spans[end as usize - 1];
        debug_assert!(
            (first as usize + 1..end as usize).all(|i| self.spans[i].0 == self.spans[i - 1].1)
        );
        &self.buf[s..e]
    }
}

/// Indices of events in an [`EncodedEvents`] batch, as `notify` gathers
/// them per watcher (a reply keeps them as an [`EventList`]). Inline up
/// to twelve: a committed batch of 10 clients' puts to one key gives each
/// of its watchers up to ten events, and fanning it out to 1 000
/// watchers then allocates nothing per watcher.
pub type Picks = SmallVec<[u32; 12]>;

/// Marks a slot of an [`EventList`] that starts a run.
const RUN: u32 = 1 << 31;

/// The events a reply takes from one buffer: indices, in order, in slots
/// inline up to four, where a run of consecutive indices takes two (its
/// first index marked with [`RUN`], then its length). A watcher that
/// gets every event of several joined batches (a merged reply, when its
/// client is behind) then holds one run, not a list that outgrew its
/// slots into an allocation freed with every reply (2 % of a fan-out).
/// Unambiguous: only a run's first slot carries the mark, so a slot
/// after a marked one is its length; a list of plain indices (as
/// `notify` builds them) is one already.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventList(SmallVec<[u32; 4]>);

impl EventList {
    /// `picks` (ascending indices below 2³¹): a few as they are (a list of
    /// plain indices is an event list), more as runs (a batch of many
    /// events for one watcher: one run, inline, instead of a list that
    /// outgrew its slots, an allocation freed on the worker that sends
    /// the reply).
    pub(crate) fn from_indices(picks: &[u32]) -> EventList {
        debug_assert!(picks.iter().all(|&i| i < RUN));
        if picks.len() <= 4 {
            return EventList(SmallVec::from_slice(picks));
        }
        let mut l = EventList::default();
        let mut k = 0;
        while k < picks.len() {
            let first = picks[k];
            let mut n = 1;
            while k + n < picks.len() && picks[k + n] == first + n as u32 {
                n += 1;
            }
            l.push_run(first, n as u32);
            k += n;
        }
        l
    }

    /// Appends index `i` (below 2³¹: a buffer holds far fewer events).
    fn push(&mut self, i: u32) {
        self.push_run(i, 1);
    }

    /// Appends indices `[first, first + n)`, joining a run (or a single
    /// index) they continue.
    fn push_run(&mut self, first: u32, n: u32) {
        debug_assert!(first.saturating_add(n) < RUN);
        if n == 0 {
            return;
        }
        let s = &mut self.0;
        let len = s.len();
        if len >= 2 && s[len - 2] & RUN != 0 {
            if (s[len - 2] & !RUN) + s[len - 1] == first {
                s[len - 1] += n;
                return;
            }
        } else if len >= 1 && s[len - 1] + 1 == first {
            s[len - 1] |= RUN;
            s.push(n + 1);
            return;
        }
        if n == 1 {
            s.push(first);
        } else {
            s.push(first | RUN);
            s.push(n);
        }
    }

    /// The indices, in order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut k = 0;
        let mut run = 0..0;
        std::iter::from_fn(move || loop {
            if let Some(i) = run.next() {
                return Some(i);
            }
            let v = *self.0.get(k)?;
            if v & RUN == 0 {
                k += 1;
                return Some(v);
            }
            let start = v & !RUN;
            run = start..start + self.0[k + 1];
            k += 2;
        })
    }

    /// The indices as ranges `[first, end)`, in order (a single index is a
    /// range of one).
    fn ranges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let mut k = 0;
        std::iter::from_fn(move || {
            let v = *self.0.get(k)?;
            if v & RUN == 0 {
                k += 1;
                Some((v, v + 1))
            } else {
                let start = v & !RUN;
                k += 2;
                Some((start, start + self.0[k - 1]))
            }
        })
    }

    /// Number of indices.
    pub fn len(&self) -> usize {
        self.ranges().map(|(a, b)| (b - a) as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Appends `later`'s indices. An inline list is first rewritten with
    /// its runs joined (`notify` builds plain indices: consecutive ones
    /// then take a slot each), so that merged replies stay inline.
    fn extend(&mut self, later: &EventList) {
        if !self.0.spilled() {
            let plain = std::mem::take(self);
            plain.ranges().for_each(|(a, b)| self.push_run(a, b - a));
        }
        later.ranges().for_each(|(a, b)| self.push_run(a, b - a));
    }

    /// Adds `by` to every index (the buffer's events placed after `by`
    /// others).
    fn shift(&mut self, by: u32) {
        let mut k = 0;
        while k < self.0.len() {
            self.0[k] += by;
            k += if self.0[k] & RUN == 0 { 1 } else { 2 };
        }
    }

    /// Whether its slots outgrew the reply (tests).
    #[cfg(test)]
    fn spilled(&self) -> bool {
        self.0.spilled()
    }
}

impl FromIterator<u32> for EventList {
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        let mut l = EventList::default();
        iter.into_iter().for_each(|i| l.push(i));
        l
    }
}

/// Some of a batch's shared events, in order: indices into one of the
/// buffers of the [`ReplyBatch`] that carries the reply.
#[derive(Clone, Debug)]
pub struct SharedEvents {
    /// Index of the buffer in the carrying batch's `bufs`.
    buf: u32,
    /// Total encoded size of the picked events (`u32::MAX` for 4 GiB or
    /// more: sizes are only estimates for buffer room and merging).
    len: u32,
    picks: EventList,
}

impl SharedEvents {
    /// Events `picks` of `batch`, which the carrying message will hold
    /// as its buffer number `buf`.
    pub(crate) fn new(buf: u32, batch: &EncodedEvents, picks: &[u32]) -> SharedEvents {
        let len: usize = picks.iter().map(|&i| batch.len_of(i)).sum();
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        SharedEvents {
            buf,
            len,
            picks: EventList::from_indices(picks),
        }
    }

    /// The same events copied into `own` (a buffer of their own, number
    /// `buf` in the new message).
    fn copied(&self, from: &EncodedEvents, own: &mut EncodedEvents, buf: u32) -> SharedEvents {
        let picks = (self.picks.iter())
            .map(|i| {
                let start = own.buf.len();
                own.buf.extend_from_slice(from.span(i));
                own.spans.push((start, own.buf.len()));
                (own.spans.len() - 1) as u32
            })
            .collect();
        SharedEvents {
            buf,
            picks,
            len: self.len,
        }
    }
}

/// A response queued on a watch stream, as small as the common case
/// allows: the watch id, the header's revision and, for replies built by
/// `notify`, events shared with other watchers' replies (in the buffers of
/// the [`ReplyBatch`] carrying it); every other field is boxed, present
/// only for the rare replies that have one. `notify` writes one reply per
/// watcher and a worker thread reads it back on another core: 64 bytes
/// instead of a whole `WatchResponse` (160), one cache line each way.
///
/// Encodes ([`WatchReply::encode`], with those buffers and the sender's
/// header) to exactly the `WatchResponse` holding all of its events.
#[derive(Clone, Debug, Default)]
pub struct WatchReply {
    /// `WatchResponse.watch_id`.
    watch_id: i64,
    /// The header's revision; the rest of the header is the sender's,
    /// given when the reply is encoded.
    revision: i64,
    /// Shared events, after `rest`'s decoded ones (several after
    /// [`WatchReply::merge`]; one, inline, as `notify` builds it).
    shared: SmallVec<[SharedEvents; 1]>,
    /// Every other field (creation, cancellation, compaction, fragment
    /// flag, decoded events), without header and watch id; `None` when
    /// all are defaults.
    rest: Option<Box<WatchResponse>>,
}

impl From<WatchResponse> for WatchReply {
    /// The response's header keeps only its revision (every reply is sent
    /// with the sender's header at that revision).
    fn from(mut resp: WatchResponse) -> WatchReply {
        let revision = resp.header.take().map_or(0, |h| h.revision);
        let watch_id = std::mem::take(&mut resp.watch_id);
        let rest = (resp != WatchResponse::default()).then(|| Box::new(resp));
        WatchReply {
            watch_id,
            revision,
            shared: SmallVec::new(),
            rest,
        }
    }
}

impl WatchReply {
    /// A reply of watcher `watch_id` at `revision` whose events are `shared`.
    pub(crate) fn with_shared(watch_id: i64, revision: i64, shared: SharedEvents) -> WatchReply {
        WatchReply {
            watch_id,
            revision,
            shared: smallvec::smallvec![shared],
            rest: None,
        }
    }

    /// `WatchResponse.watch_id`.
    pub fn watch_id(&self) -> i64 {
        self.watch_id
    }

    /// The header's revision.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Points this reply's shared events `by` buffers further on (its
    /// batch's buffers placed after `by` others).
    fn rebase(&mut self, by: u32) {
        self.shared.iter_mut().for_each(|s| s.buf += by);
    }

    /// Decoded events (rare: replies built outside `notify` and the sync
    /// thread).
    fn own_events(&self) -> &[Event] {
        self.rest.as_ref().map_or(&[], |r| &r.events)
    }

    /// Whether this reply only carries events of its watcher (no creation,
    /// cancellation, compaction, fragment or progress): such replies of
    /// one watcher may be merged.
    pub fn is_events_only(&self) -> bool {
        let plain = self.rest.as_ref().is_none_or(|r| {
            !r.created
                && !r.canceled
                && !r.fragment
                && r.compact_revision == 0
                && r.cancel_reason.is_empty()
        });
        plain && self.has_events()
    }

    /// Whether it carries any event (`event_count() > 0` without counting:
    /// an event list is empty or holds at least one index).
    fn has_events(&self) -> bool {
        self.shared.iter().any(|s| !s.picks.is_empty()) || !self.own_events().is_empty()
    }

    /// Appends `later`'s events (the same watcher's next reply, carried by
    /// the same message) to this one, whose header then says `later`'s
    /// revision: one response instead of two, as etcd sends a catching-up
    /// watcher several events at once. Refused (`later` given back,
    /// `Some`) unless both carry events only and the order of events can
    /// be kept (decoded events are written before shared ones, so a reply
    /// with shared events takes no decoded ones after them).
    pub fn merge(&mut self, later: WatchReply) -> Option<WatchReply> {
        if !self.is_events_only()
            || !later.is_events_only()
            || self.watch_id != later.watch_id
            || (!self.shared.is_empty() && !later.own_events().is_empty())
        {
            return Some(later);
        }
        let WatchReply {
            revision,
            shared,
            rest,
            ..
        } = later;
        if let Some(rest) = rest {
            (self.rest.get_or_insert_with(Default::default).events).extend(rest.events);
        }
        for s in shared {
            match self.shared.last_mut() {
                // events of the same buffer join the last list (no second
                // list, which would move the lists out of the reply)
                Some(last) if last.buf == s.buf => {
                    last.picks.extend(&s.picks);
                    last.len = last.len.saturating_add(s.len);
                }
                _ => self.shared.push(s),
            }
        }
        self.revision = revision;
        None
    }

    /// At least [`WatchReply::encoded_len`], computed without walking the
    /// fields: the largest head plus the events' sizes (shared ones are
    /// known; decoded ones, rare, are measured).
    pub fn encoded_len_bound(&self) -> usize {
        let (reason, own) = match &self.rest {
            None => (0, 0),
            Some(r) => (
                r.cancel_reason.len(),
                (r.events.iter())
                    .map(|ev| prost::encoding::message::encoded_len(EVENTS_FIELD, ev))
                    .sum::<usize>(),
            ),
        };
        MAX_HEAD + 2 + 11 + reason + own + self.shared.iter().map(|s| s.len as usize).sum::<usize>()
    }

    /// Number of events, decoded and shared.
    pub fn event_count(&self) -> usize {
        self.own_events().len() + self.shared.iter().map(|s| s.picks.len()).sum::<usize>()
    }

    /// The header this reply is sent with: `base`'s (the sender's) at the
    /// reply's revision.
    fn header(&self, base: &ResponseHeader) -> ResponseHeader {
        ResponseHeader {
            revision: self.revision,
            ..*base
        }
    }

    /// The `WatchResponse` with every event decoded (for in-process readers,
    /// tests and fragmenting); `bufs` are those of the carrying batch. Its
    /// header holds the revision alone.
    pub fn into_response(self, bufs: &[Arc<EncodedEvents>]) -> WatchResponse {
        let mut resp = self.rest.map_or_else(WatchResponse::default, |r| *r);
        resp.header = Some(ResponseHeader {
            revision: self.revision,
            ..Default::default()
        });
        resp.watch_id = self.watch_id;
        for s in self.shared {
            for i in s.picks.iter() {
                let mut field = bufs[s.buf as usize].span(i);
                // skip the field's tag and length: the rest is the Event
                let decoded = prost::encoding::decode_key(&mut field)
                    .and_then(|_| prost::encoding::decode_varint(&mut field))
                    .and_then(|_| Event::decode(field));
                resp.events
                    .push(decoded.expect("an event encoded by this process decodes"));
            }
        }
        resp
    }

    /// Writes the `WatchResponse` (prost's bytes, no length prefix) with
    /// the header `base` (the sender's: cluster, member, term) at the
    /// reply's revision; `bufs` are those of the carrying batch.
    pub fn encode(
        &self,
        bufs: &[Arc<EncodedEvents>],
        base: &ResponseHeader,
        buf: &mut impl BufMut,
    ) {
        encode_head(self, &self.header(base), buf);
        for ev in self.own_events() {
            prost::encoding::message::encode(EVENTS_FIELD, ev, buf);
        }
        for s in &self.shared {
            let batch = &bufs[s.buf as usize];
            for (first, end) in s.picks.ranges() {
                buf.put_slice(batch.spans_of(first, end));
            }
        }
    }

    /// The encoded length of the `WatchResponse` sent with header `base`
    /// (less only for shared events of 4 GiB or more).
    pub fn encoded_len(&self, base: &ResponseHeader) -> usize {
        let own: usize = (self.own_events().iter())
            .map(|ev| prost::encoding::message::encoded_len(EVENTS_FIELD, ev))
            .sum();
        head_len(self, &self.header(base))
            + own
            + self.shared.iter().map(|s| s.len as usize).sum::<usize>()
    }
}

/// The buffers of encoded events a [`ReplyBatch`] holds (one for a
/// `notify` batch).
pub type EventBufs = SmallVec<[Arc<EncodedEvents>; 1]>;

/// What a watch stream's channel carries: replies, in order, and the
/// buffers of encoded events their shared events point into (one for a
/// `notify` batch; several once messages are appended or coalesced). A
/// reply with shared events is only meaningful with the buffers of the
/// batch that carries it.
#[derive(Debug, Default)]
pub struct ReplyBatch {
    pub(crate) bufs: EventBufs,
    pub(crate) replies: Vec<WatchReply>,
}

impl From<WatchReply> for ReplyBatch {
    /// A batch of one reply without shared events.
    fn from(reply: WatchReply) -> ReplyBatch {
        assert!(reply.shared.is_empty(), "a shared reply needs its buffers");
        ReplyBatch {
            bufs: SmallVec::new(),
            replies: vec![reply],
        }
    }
}

impl From<WatchResponse> for ReplyBatch {
    fn from(resp: WatchResponse) -> ReplyBatch {
        WatchReply::from(resp).into()
    }
}

impl ReplyBatch {
    /// Replies whose shared events point into `bufs`.
    pub fn from_parts(bufs: EventBufs, replies: Vec<WatchReply>) -> ReplyBatch {
        debug_assert!(replies
            .iter()
            .flat_map(|r| &r.shared)
            .all(|s| (s.buf as usize) < bufs.len()));
        ReplyBatch { bufs, replies }
    }

    /// The replies, in order.
    pub fn replies(&self) -> &[WatchReply] {
        &self.replies
    }

    /// Number of replies.
    pub fn len(&self) -> usize {
        self.replies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.replies.is_empty()
    }

    /// The buffers and the replies.
    pub fn into_parts(self) -> (EventBufs, Vec<WatchReply>) {
        (self.bufs, self.replies)
    }

    /// Appends `later`'s replies after this batch's (with its buffers; one
    /// this batch's last few already hold is not added twice: victims of
    /// one stream, gathered into one message, mostly share theirs).
    pub fn append(&mut self, later: ReplyBatch) {
        if self.bufs.is_empty() && self.replies.is_empty() {
            *self = later;
            return;
        }
        let at: SmallVec<[u32; 4]> = (later.bufs.into_iter())
            .map(|b| {
                let recent = self.bufs.len().saturating_sub(4);
                match (self.bufs[recent..].iter()).position(|h| Arc::ptr_eq(h, &b)) {
                    Some(i) => (recent + i) as u32,
                    None => {
                        self.bufs.push(b);
                        (self.bufs.len() - 1) as u32
                    }
                }
            })
            .collect();
        self.replies.extend(later.replies.into_iter().map(|mut r| {
            r.shared.iter_mut().for_each(|s| s.buf = at[s.buf as usize]);
            r
        }));
    }

    /// Every reply as a `WatchResponse` with its events decoded.
    pub fn into_responses(self) -> Vec<WatchResponse> {
        let ReplyBatch { bufs, replies } = self;
        replies
            .into_iter()
            .map(|r| r.into_response(&bufs))
            .collect()
    }

    /// For `replies` (some of a batch's, pointing into its `bufs`) that
    /// will wait long, their watcher parked as a victim: a batch of them
    /// holding only the buffers they use, their shared events copied out
    /// of a buffer much larger than them (a slow client then holds only
    /// its own events).
    pub(crate) fn detached_from(
        bufs: &[Arc<EncodedEvents>],
        mut replies: Vec<WatchReply>,
    ) -> ReplyBatch {
        let mut kept: EventBufs = SmallVec::new();
        // old buffer index -> its index in `kept`
        let mut new_at: SmallVec<[Option<u32>; 4]> = smallvec::smallvec![None; bufs.len()];
        for r in &mut replies {
            for s in &mut r.shared {
                let from = &bufs[s.buf as usize];
                if from.buf.len() > 2 * s.len as usize {
                    let mut own = EncodedEvents {
                        buf: Vec::with_capacity(s.len as usize),
                        spans: Vec::with_capacity(s.picks.len()),
                    };
                    *s = s.copied(from, &mut own, kept.len() as u32);
                    kept.push(Arc::new(own));
                } else {
                    let at = *new_at[s.buf as usize].get_or_insert_with(|| {
                        kept.push(from.clone());
                        (kept.len() - 1) as u32
                    });
                    s.buf = at;
                }
            }
        }
        ReplyBatch {
            bufs: kept,
            replies,
        }
    }

    /// The replies of `batches`, in order, with each watcher's event-only
    /// replies merged into one (up to about `max_bytes` encoded). A
    /// watcher's events keep their order; replies of different watchers
    /// may pass each other, which nothing orders. Any other reply
    /// (created, canceled, progress, a fragment) is a barrier: nothing
    /// after it merges into a reply before it.
    ///
    /// The batches' buffers are copied into one when they are small
    /// (together at most [`JOIN_BYTES`]): a merged reply then holds one
    /// list of events (inline up to four) instead of one per batch (a list
    /// of lists moved out of the reply into an allocation, freed with it:
    /// per merged reply, when a client is behind).
    pub fn coalesce(batches: Vec<ReplyBatch>, max_bytes: usize) -> ReplyBatch {
        let total = batches.iter().map(ReplyBatch::len).sum();
        let mut out = ReplyBatch {
            bufs: SmallVec::new(),
            replies: Vec::with_capacity(total),
        };
        let bytes: usize = (batches.iter())
            .flat_map(|b| &b.bufs)
            .map(|b| b.buf.len())
            .sum();
        let join = bytes <= JOIN_BYTES;
        let mut joined = EncodedEvents::default();
        if join {
            // grown by copies, this was 1.7 % of a k8s run's instructions
            joined.buf.reserve_exact(bytes);
            let spans = (batches.iter())
                .flat_map(|b| &b.bufs)
                .map(|b| b.spans.len())
                .sum();
            joined.spans.reserve_exact(spans);
        }
        // watch id -> index in `out` of its reply still open for merging,
        // and that reply's size (bound)
        let mut open: foldhash::HashMap<i64, (usize, usize)> = Default::default();
        for b in batches {
            // joined: where each of the batch's buffers starts in `joined`
            // (its first event's index); else its buffers' first index in
            // `out.bufs` is `by`
            let mut first_event: SmallVec<[u32; 4]> = SmallVec::new();
            let by = out.bufs.len() as u32;
            if join {
                for buf in &b.bufs {
                    first_event.push(joined.spans.len() as u32);
                    let base = joined.buf.len();
                    joined.buf.extend_from_slice(&buf.buf);
                    (joined.spans).extend(buf.spans.iter().map(|&(s, e)| (base + s, base + e)));
                }
            } else {
                out.bufs.extend(b.bufs);
            }
            for mut r in b.replies {
                if join {
                    for s in &mut r.shared {
                        let first = first_event[s.buf as usize];
                        s.picks.shift(first);
                        s.buf = 0;
                    }
                } else {
                    r.rebase(by);
                }
                if !r.is_events_only() {
                    open.clear();
                    out.replies.push(r);
                    continue;
                }
                let len = r.encoded_len_bound();
                // one lookup per reply: merged into the watcher's open
                // reply, or itself the open one from now on
                let at = out.replies.len();
                match open.entry(r.watch_id) {
                    Entry::Occupied(mut o) => {
                        let (i, open_len) = *o.get();
                        if open_len + len <= max_bytes {
                            match out.replies[i].merge(r) {
                                None => {
                                    o.get_mut().1 += len;
                                    continue;
                                }
                                Some(back) => r = back,
                            }
                        }
                        o.insert((at, len));
                    }
                    Entry::Vacant(v) => {
                        v.insert((at, len));
                    }
                }
                out.replies.push(r);
            }
        }
        if join && !joined.spans.is_empty() {
            out.bufs.push(Arc::new(joined));
        }
        out
    }
}

/// [`ReplyBatch::coalesce`] copies the waiting batches' buffers into one
/// when together they hold at most this many bytes.
pub const JOIN_BYTES: usize = 256 * 1024;

/// The largest `WatchResponse.header` field: tag, length and four varints
/// of ≤ 10 bytes with their tags.
const MAX_HEADER: usize = 2 + 4 * 11;

/// The largest part of [`encode_head`]'s output written at once: the
/// header, watch id and compact revision (≤ 11 bytes each), two booleans.
const MAX_HEAD: usize = MAX_HEADER + 2 * 11 + 2 * 2;

thread_local! {
    /// The last header this thread encoded, and its bytes: the replies of
    /// a batch carry the same one (one per watcher).
    static LAST_HEADER: std::cell::RefCell<(ResponseHeader, [u8; MAX_HEADER], usize)> =
        const {
            std::cell::RefCell::new((
                ResponseHeader {
                    cluster_id: 0,
                    member_id: 0,
                    revision: 0,
                    raft_term: 0,
                },
                [0; MAX_HEADER],
                0,
            ))
        };
}

/// Appends `v` as a varint at `out[*at..]`.
#[inline]
fn put_varint(out: &mut [u8], at: &mut usize, mut v: u64) {
    while v >= 0x80 {
        out[*at] = (v as u8) | 0x80;
        v >>= 7;
        *at += 1;
    }
    out[*at] = v as u8;
    *at += 1;
}

/// Appends field `tag`'s varint `v` unless it is 0 (proto3 leaves
/// defaults out, as prost does).
#[inline]
fn put_field(out: &mut [u8], at: &mut usize, tag: u8, v: u64) {
    if v != 0 {
        out[*at] = tag << 3;
        *at += 1;
        put_varint(out, at, v);
    }
}

/// Writes `h` as `WatchResponse.header` into `out` (≥ [`MAX_HEADER`]
/// bytes); returns the length.
fn header_field(h: &ResponseHeader, out: &mut [u8]) -> usize {
    LAST_HEADER.with_borrow_mut(|(last, bytes, n)| {
        if *n == 0 || last != h {
            *last = *h;
            bytes[0] = 1 << 3 | 2;
            *n = 2;
            put_field(bytes, n, 1, h.cluster_id);
            put_field(bytes, n, 2, h.member_id);
            put_field(bytes, n, 3, h.revision as u64);
            put_field(bytes, n, 4, h.raft_term);
            // at most 44 bytes: the length is one byte
            bytes[1] = (*n - 2) as u8;
        }
        out[..*n].copy_from_slice(&bytes[..*n]);
        *n
    })
}

/// Writes every field of `r` before its events as prost writes them, with
/// header `h`, from a buffer on the stack. prost writes varints one
/// `put_u8` at a time into the gRPC buffer and sizes the header twice:
/// fanning events out to 1 000 watchers, that was a fifth of the server's
/// instructions, for a header that is the same for every watcher.
fn encode_head(r: &WatchReply, h: &ResponseHeader, buf: &mut impl BufMut) {
    let mut out = [0u8; MAX_HEAD];
    let mut at = header_field(h, &mut out);
    put_field(&mut out, &mut at, 2, r.watch_id as u64);
    let Some(rest) = &r.rest else {
        buf.put_slice(&out[..at]);
        return;
    };
    put_field(&mut out, &mut at, 3, u64::from(rest.created));
    put_field(&mut out, &mut at, 4, u64::from(rest.canceled));
    put_field(&mut out, &mut at, 5, rest.compact_revision as u64);
    buf.put_slice(&out[..at]);
    if !rest.cancel_reason.is_empty() {
        prost::encoding::string::encode(6, &rest.cancel_reason, buf);
    }
    if rest.fragment {
        buf.put_slice(&[7 << 3, 1]);
    }
}

/// Encoded length of `r`'s fields other than its events, with header `h`.
fn head_len(r: &WatchReply, h: &ResponseHeader) -> usize {
    let v = |x: u64| {
        if x == 0 {
            0
        } else {
            1 + prost::encoding::encoded_len_varint(x)
        }
    };
    let header = 2 + v(h.cluster_id) + v(h.member_id) + v(h.revision as u64) + v(h.raft_term);
    let rest = r.rest.as_ref().map_or(0, |r| {
        let reason = match r.cancel_reason.len() {
            0 => 0,
            n => 1 + prost::encoding::encoded_len_varint(n as u64) + n,
        };
        v(u64::from(r.created))
            + v(u64::from(r.canceled))
            + v(r.compact_revision as u64)
            + reason
            + v(u64::from(r.fragment))
    });
    header + v(r.watch_id as u64) + rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use retcd_api::mvccpb::KeyValue;

    /// The sender's header parts used by these tests.
    const BASE: ResponseHeader = ResponseHeader {
        cluster_id: 7,
        member_id: 300,
        revision: 0,
        raft_term: 2,
    };

    /// The reply's bytes with the buffers of its batch and header `base`.
    fn bytes(r: &WatchReply, bufs: &[Arc<EncodedEvents>], base: &ResponseHeader) -> Vec<u8> {
        let mut out = Vec::new();
        r.encode(bufs, base, &mut out);
        out
    }

    fn ev(k: &str, v: &str, prev: Option<&str>) -> Event {
        let kv = |v: &str| KeyValue {
            key: k.as_bytes().to_vec().into(),
            value: v.as_bytes().to_vec().into(),
            mod_revision: 5,
            ..Default::default()
        };
        Event {
            r#type: 0,
            kv: Some(kv(v)),
            prev_kv: prev.map(kv),
        }
    }

    /// A response of watcher 4 at `rev` with `events`, as sent by BASE.
    fn sent(rev: i64, events: Vec<Event>) -> WatchResponse {
        WatchResponse {
            header: Some(ResponseHeader {
                revision: rev,
                ..BASE
            }),
            watch_id: 4,
            events,
            ..Default::default()
        }
    }

    /// A reply with shared events encodes to the bytes prost writes for the
    /// same `WatchResponse` (with the sender's header), decodes back to
    /// it, and reports its length; it fits a cache line.
    #[test]
    fn test_shared_reply_encodes_as_the_plain_response() {
        assert!(std::mem::size_of::<WatchReply>() <= 64);
        let big = "v".repeat(1000);
        let events = [
            ev("a", "1", None),
            ev("b", "2", Some("0")),
            ev("c", "3", None),
            ev("d", &big, None),
        ];
        let mut batch = EncodedEvents::default();
        let idx: Vec<u32> = events.iter().map(|e| batch.push(e)).collect();
        let reply = WatchReply::with_shared(4, 9, SharedEvents::new(0, &batch, &[idx[0], idx[2]]));
        let plain = sent(9, vec![events[0].clone(), events[2].clone()]);
        let bufs = [Arc::new(batch)];
        assert_eq!(bytes(&reply, &bufs, &BASE), plain.encode_to_vec());
        assert_eq!(reply.encoded_len(&BASE), plain.encoded_len());
        assert_eq!(reply.event_count(), 2);
        assert_eq!(
            WatchResponse::decode(&bytes(&reply, &bufs, &BASE)[..]).unwrap(),
            plain
        );
        // decoded in process, the header holds the revision alone
        let alone = WatchResponse {
            header: Some(ResponseHeader {
                revision: 9,
                ..Default::default()
            }),
            ..plain.clone()
        };
        assert_eq!(reply.clone().into_response(&bufs), alone);
        // detached, it encodes the same from a buffer of its own; a reply
        // using most of its buffer keeps sharing it
        let small = WatchReply::with_shared(4, 9, SharedEvents::new(0, &bufs[0], &[idx[3]]));
        let batch = ReplyBatch::from_parts(bufs.clone().into(), vec![reply.clone(), small]);
        let (bufs_of, replies) = batch.into_parts();
        let d = ReplyBatch::detached_from(&bufs_of, replies);
        assert_eq!(d.bufs.len(), 2);
        assert_eq!(
            d.bufs[0].buf.len(),
            reply.shared[0].len as usize,
            "a buffer of its own"
        );
        assert!(
            Arc::ptr_eq(&d.bufs[1], &bufs[0]),
            "the large event's buffer, shared"
        );
        assert_eq!(bytes(&d.replies[0], &d.bufs, &BASE), plain.encode_to_vec());
        let responses = d.into_responses();
        assert_eq!(responses[0], alone);
        assert_eq!(responses[1].events, vec![events[3].clone()]);
        // plain replies are plain responses
        let r = WatchReply::from(plain.clone());
        assert!(
            WatchReply::from(sent(9, vec![])).rest.is_none(),
            "nothing boxed without other fields"
        );
        assert_eq!(bytes(&r, &[], &BASE), plain.encode_to_vec());
        assert_eq!(r.into_response(&[]), alone);
    }

    /// Merged replies of one watcher encode as one response holding all
    /// their events, in order, with the later header; other replies are
    /// not merged.
    #[test]
    fn test_merge_replies_of_one_watcher() {
        let events = [ev("a", "1", None), ev("b", "2", None), ev("c", "3", None)];
        let mut b1 = EncodedEvents::default();
        let i0 = b1.push(&events[0]);
        let mut b2 = EncodedEvents::default();
        let i1 = b2.push(&events[1]);
        let bufs = [Arc::new(b1), Arc::new(b2)];
        let mut a = WatchReply::with_shared(4, 5, SharedEvents::new(0, &bufs[0], &[i0]));
        let b = WatchReply::with_shared(4, 6, SharedEvents::new(1, &bufs[1], &[i1]));
        assert!(a.merge(b).is_none());
        let want = sent(6, vec![events[0].clone(), events[1].clone()]);
        assert_eq!(bytes(&a, &bufs, &BASE), want.encode_to_vec());
        assert_eq!(a.encoded_len(&BASE), want.encoded_len());
        assert_eq!(a.event_count(), 2);
        // decoded events may not follow shared ones
        let decoded = WatchReply::from(sent(7, vec![events[2].clone()]));
        let decoded = a.merge(decoded).expect("refused");
        // but shared ones may follow decoded ones
        let mut d = decoded;
        let mut b3 = EncodedEvents::default();
        let i2 = b3.push(&events[0]);
        let later = WatchReply::with_shared(4, 8, SharedEvents::new(0, &b3, &[i2]));
        assert!(d.merge(later).is_none());
        assert_eq!(d.revision(), 8);
        assert_eq!(
            d.into_response(&[Arc::new(b3)]).events,
            vec![events[2].clone(), events[0].clone()]
        );
        // another watcher, a creation, a progress response: no
        let other = WatchReply::from(WatchResponse {
            watch_id: 5,
            ..sent(9, vec![events[2].clone()])
        });
        assert!(a.clone().merge(other).is_some());
        let created = WatchReply::from(WatchResponse {
            created: true,
            ..sent(9, vec![])
        });
        assert!(a.clone().merge(created).is_some());
        let progress = WatchReply::from(sent(9, vec![]));
        assert!(a.merge(progress).is_some());
    }

    /// Coalescing waiting batches re-points each batch's shared events at
    /// its events in the joined batch: merged replies of a watcher hold
    /// events of every batch, in order; small buffers are joined into one
    /// (a merged reply then holds one list of events), large ones kept.
    #[test]
    fn test_coalesce_keeps_each_batch_events() {
        for value_len in [1, JOIN_BYTES / 2] {
            let v = "v".repeat(value_len);
            let events = [ev("a", &v, None), ev("a", &v, Some("p")), ev("a", &v, None)];
            let batch = |w: &[i64], e: &Event, rev: i64| {
                let mut enc = EncodedEvents::default();
                // an event no reply picks: indices must be re-pointed
                enc.push(&ev("unused", "", None));
                let i = enc.push(e);
                let replies = (w.iter())
                    .map(|&w| WatchReply::with_shared(w, rev, SharedEvents::new(0, &enc, &[i])))
                    .collect();
                ReplyBatch::from_parts(smallvec::smallvec![Arc::new(enc)], replies)
            };
            let out = ReplyBatch::coalesce(
                vec![
                    batch(&[1, 2], &events[0], 5),
                    batch(&[2], &events[1], 6),
                    batch(&[1, 2], &events[2], 7),
                ],
                usize::MAX,
            );
            let joined = value_len == 1;
            assert_eq!(out.bufs.len(), if joined { 1 } else { 3 });
            if joined {
                assert!(
                    out.replies.iter().all(|r| r.shared.len() == 1),
                    "one list each"
                );
            }
            let got: Vec<(i64, i64, Vec<Event>)> = (out.into_responses().into_iter())
                .map(|r| (r.watch_id, r.header.unwrap().revision, r.events))
                .collect();
            assert_eq!(
                got,
                vec![
                    (1, 7, vec![events[0].clone(), events[2].clone()]),
                    (2, 7, events.to_vec()),
                ]
            );
        }
        // merging stops at the size given
        let mut enc = EncodedEvents::default();
        let i = enc.push(&ev("a", "1", None));
        let one = |rev| {
            let r = WatchReply::with_shared(1, rev, SharedEvents::new(0, &enc, &[i]));
            ReplyBatch::from_parts(smallvec::smallvec![Arc::new(enc.clone())], vec![r])
        };
        assert_eq!(ReplyBatch::coalesce(vec![one(5), one(6)], 10).len(), 2);
        assert_eq!(ReplyBatch::coalesce(vec![one(5), one(6)], 1000).len(), 1);
    }

    /// An event list holds the indices pushed, in order, whatever their
    /// runs and gaps; shifting and extending keep them; its ranges cover
    /// them.
    #[test]
    fn test_event_list_holds_what_was_pushed() {
        let mut seed = 0x2545_f491_u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for _ in 0..500 {
            let (mut want, mut at) = (Vec::new(), next() % 5);
            for _ in 0..next() % 12 {
                want.push(at);
                // mostly the next index (runs), sometimes a gap
                at += if next() % 3 == 0 { 2 + next() % 4 } else { 1 };
            }
            let list: EventList = want.iter().copied().collect();
            assert_eq!(list.iter().collect::<Vec<_>>(), want);
            let from = EventList::from_indices(&want);
            assert_eq!(from.iter().collect::<Vec<_>>(), want);
            assert!(!from.spilled() || list.spilled());
            assert_eq!(list.len(), want.len());
            assert_eq!(list.is_empty(), want.is_empty());
            let covered: Vec<u32> = list.ranges().flat_map(|(a, b)| a..b).collect();
            assert_eq!(covered, want);
            let mut shifted = list.clone();
            shifted.shift(7);
            let plus: Vec<u32> = want.iter().map(|i| i + 7).collect();
            assert_eq!(shifted.iter().collect::<Vec<_>>(), plus);
            let mut joined = list.clone();
            joined.extend(&shifted);
            let both: Vec<u32> = want.iter().chain(&plus).copied().collect();
            assert_eq!(joined.iter().collect::<Vec<_>>(), both);
            // the same indices as `notify` leaves them (one slot each)
            let mut plain = EventList(want.iter().copied().collect());
            assert_eq!(plain.iter().collect::<Vec<_>>(), want);
            plain.extend(&EventList(plus.iter().copied().collect()));
            assert_eq!(plain.iter().collect::<Vec<_>>(), both);
        }
        // plain indices, as `notify` builds them, are a list as they are
        let mut plain = EventList(smallvec::smallvec![3, 4, 5, 9]);
        assert_eq!(plain.iter().collect::<Vec<_>>(), [3, 4, 5, 9]);
        assert_eq!((plain.len(), plain.ranges().count()), (4, 4));
        plain.shift(1);
        plain.extend(&EventList(smallvec::smallvec![11, 12]));
        assert_eq!(plain.iter().collect::<Vec<_>>(), [4, 5, 6, 10, 11, 12]);
        // merging plain lists of consecutive indices (batches of several
        // events each) joins them into one run
        let mut merged = EventList(smallvec::smallvec![0, 1, 2, 3]);
        for k in 1..10 {
            merged.extend(&EventList(smallvec::smallvec![
                4 * k,
                4 * k + 1,
                4 * k + 2,
                4 * k + 3
            ]));
        }
        assert_eq!(merged.ranges().collect::<Vec<_>>(), [(0, 40)]);
        assert!(!merged.spilled());
        // a batch of many events for one watcher becomes a run
        let mut enc = EncodedEvents::default();
        let many: Vec<u32> = (0..20)
            .map(|n| enc.push(&ev("k", &n.to_string(), None)))
            .collect();
        let shared = SharedEvents::new(0, &enc, &many);
        assert!(!shared.picks.spilled());
        assert_eq!(shared.picks.iter().collect::<Vec<_>>(), many);
        // a run of any length takes two slots
        let run: EventList = (3..1000).collect();
        assert!(!run.spilled());
        assert_eq!(run.ranges().collect::<Vec<_>>(), [(3, 1000)]);
    }

    /// A watcher that gets every event of many small batches, merged when
    /// its client is behind: one reply, its events one run of the joined
    /// buffer (held inline, no allocation), encoded as prost encodes the
    /// response with all of them.
    #[test]
    fn test_merged_reply_of_every_event_stays_inline() {
        let events: Vec<Event> = (0..12)
            .map(|n| ev("k", &format!("v{n}"), (n % 2 == 1).then_some("p")))
            .collect();
        let batches = (events.iter().zip(5..))
            .map(|(e, rev)| {
                let mut enc = EncodedEvents::default();
                let i = enc.push(e);
                let r = WatchReply::with_shared(4, rev, SharedEvents::new(0, &enc, &[i]));
                ReplyBatch::from_parts(smallvec::smallvec![Arc::new(enc)], vec![r])
            })
            .collect();
        let out = ReplyBatch::coalesce(batches, usize::MAX);
        assert_eq!((out.bufs.len(), out.replies.len()), (1, 1));
        let r = &out.replies[0];
        assert_eq!(r.shared.len(), 1);
        assert!(!r.shared[0].picks.spilled(), "{:?}", r.shared[0].picks);
        assert_eq!(r.event_count(), 12);
        let want = sent(16, events);
        assert_eq!(bytes(r, &out.bufs, &BASE), want.encode_to_vec());
        assert_eq!(r.encoded_len(&BASE), want.encoded_len());
    }

    /// Appending batches that point into the same buffer keeps one copy
    /// of it; replies keep their events.
    #[test]
    fn test_append_shares_buffers() {
        let events = [ev("a", "1", None), ev("b", "2", None)];
        let mut enc = EncodedEvents::default();
        let idx: Vec<u32> = events.iter().map(|e| enc.push(e)).collect();
        let shared = Arc::new(enc);
        let other = Arc::new(EncodedEvents::default());
        let part = |w: i64, i: usize| {
            let r = WatchReply::with_shared(w, 5, SharedEvents::new(0, &shared, &[idx[i]]));
            ReplyBatch::from_parts(smallvec::smallvec![shared.clone()], vec![r])
        };
        let mut all = ReplyBatch::from(WatchResponse::default());
        all.append(part(1, 0));
        all.append(ReplyBatch::from_parts(
            smallvec::smallvec![other.clone()],
            Vec::new(),
        ));
        all.append(part(2, 1));
        all.append(part(3, 0));
        assert_eq!(all.bufs.len(), 2, "{:?}", all.bufs);
        let got: Vec<(i64, Vec<Event>)> = (all.into_responses().into_iter().skip(1))
            .map(|r| (r.watch_id, r.events))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, vec![events[0].clone()]),
                (2, vec![events[1].clone()]),
                (3, vec![events[0].clone()]),
            ]
        );
    }

    /// The hand-written head encodes every combination of fields as prost
    /// does: defaults left out, negative numbers as ten-byte varints, an
    /// empty header, a cancel reason, decoded events before shared ones.
    #[test]
    fn test_head_encodes_as_prost() {
        let mut batch = EncodedEvents::default();
        let i0 = batch.push(&ev("k", "v", Some("p")));
        let bufs = [Arc::new(batch)];
        let nums = [0i64, 1, 127, 128, 16_383, 16_384, i64::MAX, -1, i64::MIN];
        let mut seen = 0;
        for (n, &a) in nums.iter().enumerate() {
            let b = nums[(n * 5 + 3) % nums.len()];
            let c = nums[(n * 7 + 1) % nums.len()];
            for variant in 0..8u32 {
                let header = if variant % 4 == 3 {
                    ResponseHeader::default()
                } else {
                    ResponseHeader {
                        cluster_id: a as u64,
                        member_id: b as u64,
                        revision: c,
                        raft_term: if variant % 2 == 0 { 0 } else { u64::MAX },
                    }
                };
                let resp = WatchResponse {
                    header: Some(header),
                    watch_id: b,
                    created: variant & 1 != 0,
                    canceled: variant & 2 != 0,
                    compact_revision: if variant & 4 != 0 { a } else { 0 },
                    cancel_reason: if variant == 6 {
                        "reason ü".into()
                    } else {
                        String::new()
                    },
                    fragment: variant & 4 != 0,
                    events: if variant == 5 {
                        vec![ev("d", "1", None)]
                    } else {
                        Vec::new()
                    },
                };
                let mut reply = WatchReply::from(resp.clone());
                let shared = variant % 3 == 0;
                let mut plain = resp;
                if shared {
                    reply.shared.push(SharedEvents::new(0, &bufs[0], &[i0]));
                    plain.events.push(ev("k", "v", Some("p")));
                }
                let encoded = bytes(&reply, &bufs, &header);
                assert_eq!(encoded, plain.encode_to_vec(), "{plain:?}");
                assert_eq!(reply.encoded_len(&header), encoded.len(), "{plain:?}");
                assert!(reply.encoded_len_bound() >= encoded.len(), "{plain:?}");
                assert_eq!(WatchResponse::decode(&encoded[..]).unwrap(), plain);
                seen += 1;
            }
        }
        assert_eq!(seen, nums.len() * 8);
    }
}
