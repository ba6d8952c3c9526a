//! Which message types may cross nodes, and how they are encoded: a
//! registry filled by [`super::Node::register`].

use std::any::{Any, TypeId};

use dashmap::DashMap;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::actor::bridge::Typed;
use crate::actor::{Handler, Message};
use crate::runtime::envelope::{Erased, ReplyTo};

/// A registered message type's wire number: FNV-1a of its type name.
pub(crate) fn type_number(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Decodes a reply from wire bytes.
pub(crate) type ReplyDecoder = fn(&[u8]) -> Result<Box<dyn Any + Send>, postcard::Error>;

/// How the sending side encodes one message type and decodes its reply.
#[derive(Clone, Copy)]
pub(crate) struct MsgCodec {
    pub(crate) ty: u64,
    pub(crate) encode: fn(&dyn Any) -> Result<Vec<u8>, postcard::Error>,
    pub(crate) decode_reply: ReplyDecoder,
}

/// Builds the typed message for a local actor from wire bytes; the reply
/// (if asked) goes to the given `ReplyTo`.
pub(crate) type Decoder = fn(&[u8], Option<ReplyTo>) -> Result<Box<dyn Erased>, postcard::Error>;

/// Encodes a reply of the type a registered message expects.
pub(crate) type ReplyEncoder = fn(Box<dyn Any + Send>) -> Option<Vec<u8>>;

#[derive(Default)]
pub(crate) struct Codecs {
    by_msg: DashMap<TypeId, MsgCodec>,
    /// (actor type, wire number) -> decoder and reply encoder.
    decoders: DashMap<(TypeId, u64), (Decoder, ReplyEncoder)>,
}

fn encode<M: Serialize + 'static>(m: &dyn Any) -> Result<Vec<u8>, postcard::Error> {
    let m = m.downcast_ref::<M>().expect("the codec of this very type");
    postcard::to_allocvec(m)
}

fn decode_reply<R: DeserializeOwned + Send + 'static>(
    b: &[u8],
) -> Result<Box<dyn Any + Send>, postcard::Error> {
    Ok(Box::new(postcard::from_bytes::<R>(b)?))
}

fn decode<A, M>(b: &[u8], reply: Option<ReplyTo>) -> Result<Box<dyn Erased>, postcard::Error>
where
    A: Handler<M>,
    M: Message + DeserializeOwned,
{
    let msg: M = postcard::from_bytes(b)?;
    Ok(Box::new(Typed::<A, M> { msg, reply, _a: std::marker::PhantomData }))
}

fn encode_reply<R: Serialize + 'static>(v: Box<dyn Any + Send>) -> Option<Vec<u8>> {
    let r = v.downcast::<R>().ok()?;
    postcard::to_allocvec(&*r).ok()
}

impl Codecs {
    pub(crate) fn register<A, M>(&self)
    where
        A: Handler<M>,
        M: Message + Serialize + DeserializeOwned,
        M::Reply: Serialize + DeserializeOwned,
    {
        let ty = type_number(std::any::type_name::<M>());
        self.by_msg.insert(
            TypeId::of::<M>(),
            MsgCodec { ty, encode: encode::<M>, decode_reply: decode_reply::<M::Reply> },
        );
        self.decoders.insert((TypeId::of::<A>(), ty), (decode::<A, M>, encode_reply::<M::Reply>));
    }

    pub(crate) fn for_msg(&self, t: TypeId) -> Option<MsgCodec> {
        self.by_msg.get(&t).map(|c| *c)
    }

    pub(crate) fn decoder(&self, actor: TypeId, ty: u64) -> Option<(Decoder, ReplyEncoder)> {
        self.decoders.get(&(actor, ty)).map(|d| *d)
    }
}
