//! A `WatchResponse` decoded only as far as the watch benchmark needs: the
//! flags, the cancel reason and, per event, the send time the put wrote in
//! the first 8 bytes of its value. Events are scanned in place in the
//! receive buffer — no per-event allocation, no reference counting — so
//! the client's cost per event stays far below either server's (a full
//! decode was ~0.35 µs per event, more than retcd's server spends on it).
//! The same decoder reads both servers' streams.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    decode_key, decode_varint, encode_key, encode_varint, skip_field, DecodeContext, WireType,
};
use prost::{DecodeError, Message};

/// Field numbers used from `etcdserverpb.WatchResponse`, `mvccpb.Event`
/// and `mvccpb.KeyValue`.
const CREATED: u32 = 3;
const CANCELED: u32 = 4;
const CANCEL_REASON: u32 = 6;
const EVENTS: u32 = 11;
const EVENT_KV: u32 = 2;
const KV_VALUE: u32 = 5;

/// See the module documentation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiteWatchResponse {
    pub created: bool,
    pub canceled: bool,
    pub cancel_reason: String,
    /// One entry per event: the send time in its value (`None` if the value
    /// is shorter than 8 bytes).
    pub sent: Vec<Option<u64>>,
}

/// The error for a length running past the end of the buffer (prost's own
/// error constructor is not public API; a varint cut short gives one).
fn truncated() -> DecodeError {
    decode_varint(&mut &[0x80u8][..]).expect_err("a varint cut short")
}

/// The first length-delimited field `tag` of the message encoded in `msg`.
fn field(mut msg: &[u8], tag: u32) -> Result<Option<&[u8]>, DecodeError> {
    while msg.has_remaining() {
        let (t, wt) = decode_key(&mut msg)?;
        if t != tag || wt != WireType::LengthDelimited {
            skip_field(wt, t, &mut msg, DecodeContext::default())?;
            continue;
        }
        let len = decode_varint(&mut msg)? as usize;
        return msg.get(..len).map(Some).ok_or_else(truncated);
    }
    Ok(None)
}

/// The first 8 bytes of the value of the event encoded in `ev`.
fn scan_event(ev: &[u8]) -> Result<Option<u64>, DecodeError> {
    let Some(kv) = field(ev, EVENT_KV)? else {
        return Ok(None);
    };
    let value = field(kv, KV_VALUE)?;
    Ok(value
        .and_then(|v| v.first_chunk::<8>())
        .map(|b| u64::from_le_bytes(*b)))
}

impl Message for LiteWatchResponse {
    /// Writes the fields it keeps (used by tests only; the client never
    /// sends a response).
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.created {
            prost::encoding::bool::encode(CREATED, &self.created, buf);
        }
        if self.canceled {
            prost::encoding::bool::encode(CANCELED, &self.canceled, buf);
        }
        if !self.cancel_reason.is_empty() {
            prost::encoding::string::encode(CANCEL_REASON, &self.cancel_reason, buf);
        }
        for s in &self.sent {
            // an Event whose kv holds only the 8-byte value
            let value_len = if s.is_some() { 10 } else { 0 };
            encode_key(EVENTS, WireType::LengthDelimited, buf);
            encode_varint(value_len + 2, buf);
            encode_key(EVENT_KV, WireType::LengthDelimited, buf);
            encode_varint(value_len, buf);
            if let Some(t) = s {
                encode_key(KV_VALUE, WireType::LengthDelimited, buf);
                encode_varint(8, buf);
                buf.put_u64_le(*t);
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
        match tag {
            CREATED => prost::encoding::bool::merge(wire_type, &mut self.created, buf, ctx),
            CANCELED => prost::encoding::bool::merge(wire_type, &mut self.canceled, buf, ctx),
            CANCEL_REASON => {
                prost::encoding::string::merge(wire_type, &mut self.cancel_reason, buf, ctx)
            }
            EVENTS if wire_type == WireType::LengthDelimited => {
                let len = decode_varint(buf)? as usize;
                if len > buf.remaining() {
                    return Err(truncated());
                }
                // tonic's receive buffer is contiguous; copy only if not
                let sent = if buf.chunk().len() >= len {
                    let sent = scan_event(&buf.chunk()[..len])?;
                    buf.advance(len);
                    sent
                } else {
                    scan_event(&buf.copy_to_bytes(len))?
                };
                self.sent.push(sent);
                Ok(())
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut v = Vec::new();
        self.encode_raw(&mut v);
        v.len()
    }

    fn clear(&mut self) {
        *self = LiteWatchResponse::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retcd_api::etcdserverpb::{ResponseHeader, WatchResponse};
    use retcd_api::mvccpb::{Event, KeyValue};

    /// Decodes what a server sends: flags, reason, one send time per event
    /// (with prev_kv, every other KeyValue field and the header skipped).
    #[test]
    fn test_lite_decode_of_a_full_response() {
        let ev = |v: Vec<u8>, prev: bool| Event {
            r#type: 0,
            kv: Some(KeyValue {
                key: b"key".to_vec().into(),
                create_revision: 3,
                mod_revision: 9,
                version: 2,
                value: v.into(),
                lease: 7,
            }),
            prev_kv: prev.then(|| KeyValue {
                key: b"key".to_vec().into(),
                value: 99u64.to_le_bytes().to_vec().into(),
                ..Default::default()
            }),
        };
        let mut v1 = 1234u64.to_le_bytes().to_vec();
        v1.extend_from_slice(&[b'x'; 248]);
        let full = WatchResponse {
            header: Some(ResponseHeader {
                cluster_id: 1,
                member_id: 2,
                revision: 9,
                raft_term: 3,
            }),
            watch_id: 5,
            canceled: true,
            cancel_reason: "why".into(),
            events: vec![ev(v1, true), ev(b"short".to_vec(), false)],
            ..Default::default()
        };
        let lite = LiteWatchResponse::decode(&full.encode_to_vec()[..]).unwrap();
        assert_eq!(
            lite,
            LiteWatchResponse {
                created: false,
                canceled: true,
                cancel_reason: "why".into(),
                sent: vec![Some(1234), None],
            }
        );
        // what it encodes decodes the same, also as a full response
        let again = LiteWatchResponse::decode(&lite.encode_to_vec()[..]).unwrap();
        assert_eq!(again, lite);
        assert_eq!(lite.encoded_len(), lite.encode_to_vec().len());
        let as_full = WatchResponse::decode(&lite.encode_to_vec()[..]).unwrap();
        assert_eq!(as_full.events.len(), 2);
        assert!(as_full.canceled);
        // truncated input is an error, not a panic
        let bytes = full.encode_to_vec();
        assert!(LiteWatchResponse::decode(&bytes[..bytes.len() - 3]).is_err());
    }
}
