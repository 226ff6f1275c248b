//! The codec of the report stream: prost, with small buffers. A report is a few hundred bytes and
//! an ack a few; tonic's default buffers (8 KiB to encode and 8 KiB to decode, per stream) would
//! cost a controller with one stream per node 80 MiB at 5,000 nodes for nothing. A buffer grows
//! to the largest message it has carried (up to the server's message size limit) and stays so:
//! a report's once, an ack's never.

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// Initial buffer of each direction of a stream.
pub const BUFFER_BYTES: usize = 256;
/// Encoded bytes after which a stream yields to flush (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_BYTES`] buffers (the generated client and server use it).
#[derive(Debug, Clone, Copy)]
pub struct SmallCodec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for SmallCodec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T, U> Codec for SmallCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }
}
