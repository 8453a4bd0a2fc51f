//! The gRPC codec every generated service and client uses: prost's, except
//! that the encoder reserves a message's whole encoded length before it
//! writes it.
//!
//! tonic hands the encoder one growing buffer; prost writes into it field
//! by field, so a large message (a Range of 200k values) would grow it by
//! doubling, copying everything written so far at each step and holding up
//! to twice the message's size in capacity. Reserving once makes the
//! buffer exactly one message long.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

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

impl<T: Message> Encoder for ExactEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("retcd: encode: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
