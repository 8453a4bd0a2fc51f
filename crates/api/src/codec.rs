//! The gRPC codec every generated service and client uses: prost's, except
//! that the encoder reserves a message's whole encoded length before it
//! writes it.
//!
//! tonic hands the encoder one growing buffer; prost writes into it field
//! by field, so a large message (a Range of 200k values) would grow it by
//! doubling, copying everything written so far at each step and holding up
//! to twice the message's size in capacity. Reserving once makes the
//! buffer exactly one message long.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::OnceLock;

use prost::encoding;
use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

use crate::etcdserverpb::RangeResponse;
use crate::mvccpb::KeyValue;

/// [`tonic_prost::ProstCodec`] with an exact-size encode buffer.
#[derive(Debug, Clone)]
pub struct ExactCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for ExactCodec<T, U> {
    fn default() -> Self {
        ExactCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for ExactCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ExactEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ExactEncoder { _pd: PhantomData }
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

/// Encodes `T` into a buffer reserved to its encoded length.
#[derive(Debug, Clone)]
pub struct ExactEncoder<T> {
    _pd: PhantomData<T>,
}

impl<T: Message + 'static> Encoder for ExactEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, mut item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        if let Some(range) = (&mut item as &mut dyn Any).downcast_mut::<RangeResponse>() {
            encode_range_draining(range, buf);
            return Ok(());
        }
        item.encode(buf)
            .map_err(|e| Status::internal(format!("retcd: encode: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Hands freed memory back to the system (the server's allocator keeps it
/// otherwise: a large response's freed values would stay resident while
/// its encoding grows). Set once by the server.
pub static RELEASE_MEMORY: OnceLock<fn()> = OnceLock::new();

/// Values dropped between two calls of [`RELEASE_MEMORY`].
const RELEASE_EVERY: usize = 16 << 20;

/// Encodes a `RangeResponse` as prost would (fields in number order: the
/// same bytes), dropping each key-value once written: a large unary Range
/// is in memory about once (the kvs shrink as the encoding grows) rather
/// than twice (all its kvs, then all its encoding).
pub fn encode_range_draining(r: &mut RangeResponse, buf: &mut impl bytes::BufMut) {
    if let Some(h) = &r.header {
        encoding::message::encode(1, h, buf);
    }
    let mut dropped = 0;
    for kv in r.kvs.drain(..) {
        encoding::message::encode(2, &kv, buf);
        dropped += kv.value.len();
        drop(kv);
        if dropped >= RELEASE_EVERY {
            dropped = 0;
            if let Some(release) = RELEASE_MEMORY.get() {
                release();
            }
        }
    }
    if r.more {
        encoding::bool::encode(3, &r.more, buf);
    }
    if r.count != 0 {
        encoding::int64::encode(4, &r.count, buf);
    }
}

/// Encodes a `KeyValue` as prost does (the same bytes), writing its key
/// and value as slices. prost writes a `Bytes` field by cloning it into
/// the buffer, and the first clone of a `Bytes` made from a `Vec`
/// allocates (it becomes shared): a put's row was two allocations more.
pub fn encode_key_value(kv: &KeyValue) -> Vec<u8> {
    use encoding::{encode_key, encode_varint, int64, WireType};
    fn bytes(tag: u32, b: &[u8], buf: &mut Vec<u8>) {
        if !b.is_empty() {
            encode_key(tag, WireType::LengthDelimited, buf);
            encode_varint(b.len() as u64, buf);
            buf.extend_from_slice(b);
        }
    }
    fn int(tag: u32, v: i64, buf: &mut Vec<u8>) {
        if v != 0 {
            int64::encode(tag, &v, buf);
        }
    }
    let mut buf = Vec::with_capacity(kv.encoded_len());
    bytes(1, &kv.key, &mut buf);
    int(2, kv.create_revision, &mut buf);
    int(3, kv.mod_revision, &mut buf);
    int(4, kv.version, &mut buf);
    bytes(5, &kv.value, &mut buf);
    int(6, kv.lease, &mut buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdserverpb::ResponseHeader;

    #[test]
    fn test_draining_range_encoding_is_prosts() {
        let kv = |i: u8| KeyValue {
            key: vec![b'k', i].into(),
            value: vec![i; 300].into(),
            create_revision: i as i64,
            mod_revision: 7,
            version: 1,
            lease: if i % 2 == 0 { 5 } else { 0 },
        };
        let cases = [
            RangeResponse::default(),
            RangeResponse {
                header: Some(ResponseHeader {
                    cluster_id: 1,
                    member_id: 2,
                    revision: 9,
                    raft_term: 3,
                }),
                kvs: (0..20).map(kv).collect(),
                more: true,
                count: 40,
            },
            RangeResponse {
                kvs: vec![kv(1)],
                count: 1,
                ..Default::default()
            },
        ];
        for r in cases {
            let want = r.encode_to_vec();
            let mut got = Vec::new();
            let mut drained = r.clone();
            encode_range_draining(&mut drained, &mut got);
            assert_eq!(got, want);
            assert!(drained.kvs.is_empty(), "every kv dropped once written");
        }
    }

    #[test]
    fn test_key_value_rows_are_prost_bytes() {
        let full = KeyValue {
            key: b"k/1".to_vec().into(),
            create_revision: 7,
            mod_revision: 300,
            version: 2,
            value: vec![b'v'; 200].into(),
            lease: -5,
        };
        let tombstone = KeyValue {
            key: b"gone".to_vec().into(),
            mod_revision: 9,
            ..Default::default()
        };
        let large = KeyValue {
            value: vec![0u8; 70_000].into(),
            mod_revision: i64::MAX,
            ..full.clone()
        };
        for kv in [full, tombstone, large, KeyValue::default()] {
            assert_eq!(encode_key_value(&kv), kv.encode_to_vec(), "{kv:?}");
        }
    }
}
