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

use std::sync::Arc;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};
use prost::{DecodeError, Message};
use retcd_api::etcdserverpb::{ResponseHeader, WatchResponse};
use retcd_api::mvccpb::Event;
use smallvec::SmallVec;

/// Field number of `WatchResponse.events`.
const EVENTS_FIELD: u32 = 11;

/// Events encoded once, each as a complete `WatchResponse.events` field.
#[derive(Debug, Default)]
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
}

/// Indices of events in an [`EncodedEvents`] batch. Inline up to four:
/// a watcher usually gets one or two events of a batch, and fanning a
/// batch out to 1 000 watchers then allocates nothing per watcher.
pub type Picks = SmallVec<[u32; 4]>;

/// Some of a batch's shared events, in order.
#[derive(Clone, Debug)]
pub struct SharedEvents {
    batch: Arc<EncodedEvents>,
    picks: Picks,
    /// Total encoded size of the picked events.
    len: usize,
}

impl SharedEvents {
    pub(crate) fn new(batch: Arc<EncodedEvents>, picks: Picks) -> SharedEvents {
        let len = picks.iter().map(|&i| batch.len_of(i)).sum();
        SharedEvents { batch, picks, len }
    }

    /// The same events in a buffer of their own (when the batch's buffer
    /// holds much more than them).
    fn detached(&self) -> SharedEvents {
        let mut own = EncodedEvents {
            buf: Vec::with_capacity(self.len),
            spans: Vec::with_capacity(self.picks.len()),
        };
        for &i in &self.picks {
            let start = own.buf.len();
            own.buf.extend_from_slice(self.batch.span(i));
            own.spans.push((start, own.buf.len()));
        }
        SharedEvents {
            batch: Arc::new(own),
            picks: (0..self.picks.len() as u32).collect(),
            len: self.len,
        }
    }
}

/// A response queued on a watch stream: a `WatchResponse` plus, for
/// replies built by `notify`, events shared with other watchers' replies.
/// Encodes (as a [`prost::Message`]) to exactly the `WatchResponse` holding
/// all of its events.
#[derive(Clone, Debug, Default)]
pub struct WatchReply {
    /// Every field but the shared events.
    pub resp: WatchResponse,
    /// Shared events, after `resp`'s own (several after [`WatchReply::merge`];
    /// one, inline, as `notify` builds it).
    shared: SmallVec<[SharedEvents; 1]>,
}

impl From<WatchResponse> for WatchReply {
    fn from(resp: WatchResponse) -> WatchReply {
        WatchReply {
            resp,
            shared: SmallVec::new(),
        }
    }
}

impl WatchReply {
    /// A reply whose events are `shared` (`resp` has none of its own).
    pub(crate) fn with_shared(resp: WatchResponse, shared: SharedEvents) -> WatchReply {
        debug_assert!(resp.events.is_empty(), "events either decoded or shared");
        WatchReply {
            resp,
            shared: smallvec::smallvec![shared],
        }
    }

    /// For a reply that will wait long (its watcher parked as a victim):
    /// its shared events copied out of the batch's buffer when that buffer
    /// is much larger, so a slow client holds only its own events.
    pub(crate) fn detach(&mut self) {
        for s in &mut self.shared {
            if s.batch.buf.len() > 2 * s.len {
                *s = s.detached();
            }
        }
    }

    /// Whether this reply only carries events of its watcher (no creation,
    /// cancellation, compaction, fragment or progress): such replies of
    /// one watcher may be merged.
    pub fn is_events_only(&self) -> bool {
        let r = &self.resp;
        !r.created
            && !r.canceled
            && !r.fragment
            && r.compact_revision == 0
            && r.cancel_reason.is_empty()
            && self.event_count() > 0
    }

    /// Appends `later`'s events (the same watcher's next reply) to this
    /// one, whose header then says `later`'s revision: one response
    /// instead of two, as etcd sends a catching-up watcher several events
    /// at once. Refused (`later` given back, `Some`) unless both carry events only
    /// and the order of events can be kept (decoded events are written
    /// before shared ones, so a reply with shared events takes no decoded
    /// ones after them).
    pub fn merge(&mut self, later: WatchReply) -> Option<WatchReply> {
        if !self.is_events_only()
            || !later.is_events_only()
            || self.resp.watch_id != later.resp.watch_id
            || (!self.shared.is_empty() && !later.resp.events.is_empty())
        {
            return Some(later);
        }
        let WatchReply { resp, shared } = later;
        self.resp.events.extend(resp.events);
        self.shared.extend(shared);
        if resp.header.is_some() {
            self.resp.header = resp.header;
        }
        None
    }

    /// At least [`Message::encoded_len`], computed without walking the
    /// fields: the largest head plus the events' sizes (shared ones are
    /// known; decoded ones, rare, are measured).
    pub fn encoded_len_bound(&self) -> usize {
        let reason = self.resp.cancel_reason.len();
        let own: usize = if self.resp.events.is_empty() {
            0
        } else {
            (self.resp.events.iter())
                .map(|ev| prost::encoding::message::encoded_len(EVENTS_FIELD, ev))
                .sum()
        };
        MAX_HEAD + 2 + 11 + reason + own + self.shared.iter().map(|s| s.len).sum::<usize>()
    }

    /// Number of events, decoded and shared.
    pub fn event_count(&self) -> usize {
        self.resp.events.len() + self.shared.iter().map(|s| s.picks.len()).sum::<usize>()
    }

    /// The `WatchResponse` with every event decoded (for in-process readers,
    /// tests and fragmenting).
    pub fn into_response(self) -> WatchResponse {
        let mut resp = self.resp;
        for s in self.shared {
            for &i in &s.picks {
                let mut field = s.batch.span(i);
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
}

impl Message for WatchReply {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_head(&self.resp, buf);
        for ev in &self.resp.events {
            prost::encoding::message::encode(EVENTS_FIELD, ev, buf);
        }
        for s in &self.shared {
            for &i in &s.picks {
                buf.put_slice(s.batch.span(i));
            }
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        self.resp.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        let own: usize = (self.resp.events.iter())
            .map(|ev| prost::encoding::message::encoded_len(EVENTS_FIELD, ev))
            .sum();
        head_len(&self.resp) + own + self.shared.iter().map(|s| s.len).sum::<usize>()
    }

    fn clear(&mut self) {
        self.resp.clear();
        self.shared.clear();
    }
}

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

/// Writes every field of `r` before its events as prost writes them,
/// from a buffer on the stack. prost writes varints one `put_u8` at a time
/// into the gRPC buffer and sizes the header twice: fanning events out to
/// 1 000 watchers, that was a fifth of the server's instructions, for a
/// header that is the same for every watcher.
fn encode_head(r: &WatchResponse, buf: &mut impl BufMut) {
    let mut out = [0u8; MAX_HEAD];
    let mut at = match &r.header {
        Some(h) => header_field(h, &mut out),
        None => 0,
    };
    put_field(&mut out, &mut at, 2, r.watch_id as u64);
    put_field(&mut out, &mut at, 3, u64::from(r.created));
    put_field(&mut out, &mut at, 4, u64::from(r.canceled));
    put_field(&mut out, &mut at, 5, r.compact_revision as u64);
    buf.put_slice(&out[..at]);
    if !r.cancel_reason.is_empty() {
        prost::encoding::string::encode(6, &r.cancel_reason, buf);
    }
    if r.fragment {
        buf.put_slice(&[7 << 3, 1]);
    }
}

/// Encoded length of `r`'s fields other than its events.
fn head_len(r: &WatchResponse) -> usize {
    let v = |x: u64| {
        if x == 0 {
            0
        } else {
            1 + prost::encoding::encoded_len_varint(x)
        }
    };
    let header = r.header.as_ref().map_or(0, |h| {
        2 + v(h.cluster_id) + v(h.member_id) + v(h.revision as u64) + v(h.raft_term)
    });
    let reason = match r.cancel_reason.len() {
        0 => 0,
        n => 1 + prost::encoding::encoded_len_varint(n as u64) + n,
    };
    header
        + v(r.watch_id as u64)
        + v(u64::from(r.created))
        + v(u64::from(r.canceled))
        + v(r.compact_revision as u64)
        + reason
        + v(u64::from(r.fragment))
}

#[cfg(test)]
mod tests {
    use super::*;
    use retcd_api::mvccpb::KeyValue;

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

    /// A reply with shared events encodes to the bytes prost writes for the
    /// same `WatchResponse`, decodes back to it, and reports its length.
    #[test]
    fn test_shared_reply_encodes_as_the_plain_response() {
        let big = "v".repeat(1000);
        let events = [
            ev("a", "1", None),
            ev("b", "2", Some("0")),
            ev("c", "3", None),
            ev("d", &big, None),
        ];
        let mut batch = EncodedEvents::default();
        let idx: Vec<u32> = events.iter().map(|e| batch.push(e)).collect();
        let batch = Arc::new(batch);
        let head = WatchResponse {
            header: Some(ResponseHeader {
                revision: 9,
                ..Default::default()
            }),
            watch_id: 4,
            ..Default::default()
        };
        let reply = WatchReply::with_shared(
            head.clone(),
            SharedEvents::new(batch.clone(), smallvec::smallvec![idx[0], idx[2]]),
        );
        let plain = WatchResponse {
            events: vec![events[0].clone(), events[2].clone()],
            ..head.clone()
        };
        assert_eq!(reply.encode_to_vec(), plain.encode_to_vec());
        assert_eq!(reply.encoded_len(), plain.encoded_len());
        assert_eq!(reply.event_count(), 2);
        assert_eq!(
            WatchResponse::decode(&reply.encode_to_vec()[..]).unwrap(),
            plain
        );
        assert_eq!(reply.clone().into_response(), plain);
        // a reply decodes as a WatchReply too (its events decoded)
        let back = WatchReply::decode(&reply.encode_to_vec()[..]).unwrap();
        assert_eq!(back.resp, plain);
        // detached, it encodes the same from a buffer of its own
        let mut d = reply.clone();
        d.detach();
        let own = &d.shared[0];
        assert!(!Arc::ptr_eq(&own.batch, &batch));
        assert_eq!(own.batch.buf.len(), own.len);
        assert_eq!(d.encode_to_vec(), plain.encode_to_vec());
        // plain replies are plain responses
        let r = WatchReply::from(plain.clone());
        assert_eq!(r.encode_to_vec(), plain.encode_to_vec());
        assert_eq!(r.into_response(), plain);
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
        let (b1, b2) = (Arc::new(b1), Arc::new(b2));
        let head = |rev: i64| WatchResponse {
            header: Some(ResponseHeader {
                revision: rev,
                ..Default::default()
            }),
            watch_id: 4,
            ..Default::default()
        };
        let mut a =
            WatchReply::with_shared(head(5), SharedEvents::new(b1, smallvec::smallvec![i0]));
        let b = WatchReply::with_shared(head(6), SharedEvents::new(b2, smallvec::smallvec![i1]));
        assert!(a.merge(b).is_none());
        let want = WatchResponse {
            events: vec![events[0].clone(), events[1].clone()],
            ..head(6)
        };
        assert_eq!(a.encode_to_vec(), want.encode_to_vec());
        assert_eq!(a.encoded_len(), want.encoded_len());
        assert_eq!(a.event_count(), 2);
        // decoded events may not follow shared ones
        let decoded = WatchReply::from(WatchResponse {
            events: vec![events[2].clone()],
            ..head(7)
        });
        let decoded = a.merge(decoded).expect("refused");
        // but shared ones may follow decoded ones
        let mut d = decoded;
        let mut b3 = EncodedEvents::default();
        let i2 = b3.push(&events[0]);
        assert!(d
            .merge(WatchReply::with_shared(
                head(8),
                SharedEvents::new(Arc::new(b3), smallvec::smallvec![i2]),
            ))
            .is_none());
        assert_eq!(
            d.into_response().events,
            vec![events[2].clone(), events[0].clone()]
        );
        // another watcher, a creation, a progress response: no
        let other = WatchReply::from(WatchResponse {
            watch_id: 5,
            events: vec![events[2].clone()],
            ..head(9)
        });
        assert!(a.clone().merge(other).is_some());
        let created = WatchReply::from(WatchResponse {
            created: true,
            ..head(9)
        });
        assert!(a.clone().merge(created).is_some());
        let progress = WatchReply::from(head(9));
        assert!(a.merge(progress).is_some());
    }

    /// The hand-written head encodes every combination of fields as prost
    /// does: defaults left out, negative numbers as ten-byte varints, a
    /// header present but empty, a cancel reason, decoded
    /// events before shared ones.
    #[test]
    fn test_head_encodes_as_prost() {
        let mut batch = EncodedEvents::default();
        let i0 = batch.push(&ev("k", "v", Some("p")));
        let batch = Arc::new(batch);
        let nums = [0i64, 1, 127, 128, 16_383, 16_384, i64::MAX, -1, i64::MIN];
        let mut seen = 0;
        for (n, &a) in nums.iter().enumerate() {
            let b = nums[(n * 5 + 3) % nums.len()];
            let c = nums[(n * 7 + 1) % nums.len()];
            for variant in 0..8u32 {
                let resp = WatchResponse {
                    header: (variant % 4 != 3).then_some(ResponseHeader {
                        cluster_id: a as u64,
                        member_id: b as u64,
                        revision: c,
                        raft_term: if variant % 2 == 0 { 0 } else { u64::MAX },
                    }),
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
                let shared = variant % 3 == 0;
                let reply = if shared {
                    WatchReply {
                        resp: resp.clone(),
                        shared: smallvec::smallvec![SharedEvents::new(
                            batch.clone(),
                            smallvec::smallvec![i0]
                        )],
                    }
                } else {
                    WatchReply::from(resp.clone())
                };
                let mut plain = resp;
                if shared {
                    plain.events.push(ev("k", "v", Some("p")));
                }
                let bytes = reply.encode_to_vec();
                assert_eq!(bytes, plain.encode_to_vec(), "{plain:?}");
                assert_eq!(reply.encoded_len(), bytes.len(), "{plain:?}");
                assert!(reply.encoded_len_bound() >= bytes.len(), "{plain:?}");
                assert_eq!(WatchResponse::decode(&bytes[..]).unwrap(), plain);
                seen += 1;
            }
        }
        assert_eq!(seen, nums.len() * 8);
    }
}
