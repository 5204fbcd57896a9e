//! The gRPC codec of the replay service: prost's, except that the encoder reserves a
//! message's whole length before writing it, so a large sample is written into one
//! buffer in one pass (rows copied once, never moved by a growing buffer).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

#[derive(Debug, Clone)]
pub struct ReplayCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ReplayCodec<T, U> {
    fn default() -> Self {
        ReplayCodec(PhantomData)
    }
}

impl<T, U> Codec for ReplayCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ReplayEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ReplayEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::default())
    }
}

#[derive(Debug, Clone)]
pub struct ReplayEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for ReplayEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf).map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}
