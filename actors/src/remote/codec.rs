//! Which message types may cross nodes, and how they are encoded: a
//! registry filled by [`super::Node::register`] and
//! [`super::Node::register_as`].
//!
//! On the wire a message type is a 64-bit number, the FNV-1a hash of its
//! *wire name*: by default the Rust type's name (`std::any::type_name`),
//! which changes when the type moves to another module or crate, and may
//! change with the compiler; with `register_as` a name the user picks and
//! keeps (`"chat.Post"`), which survives both, so nodes of different
//! builds (a rolling upgrade) still understand each other. A message whose
//! number the receiver does not know for its target, or whose bytes do not
//! decode, is a dead letter there (and an ask gets no reply at once); the
//! link stays up.
//!
//! Actor types have wire names too, for lookups only: a node answers a
//! lookup with the wire name of the exported actor's type, and the asking
//! node takes the answer only if it is the wire name of the type it asked
//! for. By default that is the Rust type's name, with the same weakness;
//! [`super::Node::register_actor_as`] gives it a kept one.

use std::any::{Any, TypeId};

use dashmap::DashMap;
use rustc_hash::FxBuildHasher;
use serde::de::DeserializeOwned;
use serde::Serialize;

use ringmail_wire::frame::{Encoded, Head};
use ringmail_wire::WireError;

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

/// Encodes a message as its `Tell` or `Ask` frame, whose body may have at
/// most the given number of bytes.
pub(crate) type Encoder = fn(&dyn Any, Head, usize) -> Result<Encoded, WireError>;

/// How the sending side encodes one message type and decodes its reply.
#[derive(Clone, Copy)]
pub(crate) struct MsgCodec {
    pub(crate) ty: u64,
    pub(crate) encode: Encoder,
    pub(crate) decode_reply: ReplyDecoder,
}

/// Builds the typed message for a local actor from wire bytes; the reply
/// (if asked) goes to the given `ReplyTo`.
pub(crate) type Decoder = fn(&[u8], Option<ReplyTo>) -> Result<Box<dyn Erased>, postcard::Error>;

/// Encodes a reply of the type a registered message expects.
pub(crate) type ReplyEncoder = fn(Box<dyn Any + Send>) -> Option<Vec<u8>>;

#[derive(Default)]
pub(crate) struct Codecs {
    /// Looked up per message sent (FxHash: the keys are types of this
    /// program).
    by_msg: DashMap<TypeId, MsgCodec, FxBuildHasher>,
    /// Wire number -> the message type registered under it, and its name.
    by_number: DashMap<u64, (TypeId, String)>,
    /// (actor type, wire number) -> decoder and reply encoder; looked up
    /// per message received.
    decoders: DashMap<(TypeId, u64), (Decoder, ReplyEncoder), FxBuildHasher>,
    /// Actor type -> the wire name it was given (types without one go by
    /// their Rust name).
    actor_names: DashMap<TypeId, String, FxBuildHasher>,
    /// Wire name -> the actor type it was given to.
    actors_by_name: DashMap<String, TypeId>,
}

fn encode<M: Serialize + 'static>(
    m: &dyn Any,
    head: Head,
    max: usize,
) -> Result<Encoded, WireError> {
    let m = m.downcast_ref::<M>().expect("the codec of this very type");
    // Serialized once, straight into its frame.
    Encoded::message(head, m, max)
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
    Ok(Box::new(Typed::<A, M>::new(msg, reply)))
}

fn encode_reply<R: Serialize + 'static>(v: Box<dyn Any + Send>) -> Option<Vec<u8>> {
    let r = v.downcast::<R>().ok()?;
    ringmail_wire::frame::encode_payload(&*r).ok()
}

impl Codecs {
    /// Registers `M` for `A` under the wire name `name`; refused when the
    /// name (or its number) is another message type's already.
    pub(crate) fn register<A, M>(&self, name: &str) -> Result<(), RegisterError>
    where
        A: Handler<M>,
        M: Message + Serialize + DeserializeOwned,
        M::Reply: Serialize + DeserializeOwned,
    {
        let ty = type_number(name);
        if let Some(old) = self.by_msg.get(&TypeId::of::<M>()).map(|c| c.ty) {
            if old != ty {
                return Err(RegisterError::Renamed { type_name: std::any::type_name::<M>() });
            }
        }
        match self.by_number.entry(ty) {
            dashmap::Entry::Occupied(e) if e.get().0 != TypeId::of::<M>() => {
                return Err(RegisterError::NameTaken { name: e.get().1.clone() });
            }
            dashmap::Entry::Occupied(_) => {}
            dashmap::Entry::Vacant(e) => {
                e.insert((TypeId::of::<M>(), name.to_string()));
            }
        }
        self.by_msg.insert(
            TypeId::of::<M>(),
            MsgCodec { ty, encode: encode::<M>, decode_reply: decode_reply::<M::Reply> },
        );
        self.decoders.insert((TypeId::of::<A>(), ty), (decode::<A, M>, encode_reply::<M::Reply>));
        Ok(())
    }

    /// Gives actor type `t` (Rust name `type_name`) the wire name `name`;
    /// refused when the name is another actor type's, or `t` has another.
    pub(crate) fn name_actor(
        &self,
        t: TypeId,
        type_name: &'static str,
        name: &str,
    ) -> Result<(), RegisterError> {
        // The type's entry is held throughout, so two namings of one type
        // at once cannot both succeed (only this takes both maps, in this
        // order).
        let mine = match self.actor_names.entry(t) {
            dashmap::Entry::Occupied(e) if *e.get() != name => {
                return Err(RegisterError::Renamed { type_name });
            }
            dashmap::Entry::Occupied(_) => return Ok(()),
            dashmap::Entry::Vacant(e) => e,
        };
        match self.actors_by_name.entry(name.to_string()) {
            dashmap::Entry::Occupied(e) if *e.get() != t => {
                return Err(RegisterError::ActorNameTaken { name: name.to_string() });
            }
            dashmap::Entry::Occupied(_) => {}
            dashmap::Entry::Vacant(e) => {
                e.insert(t);
            }
        }
        mine.insert(name.to_string());
        Ok(())
    }

    /// The wire name of actor type `t` (Rust name `type_name`).
    pub(crate) fn actor_name(&self, t: TypeId, type_name: &'static str) -> String {
        self.actor_names.get(&t).map_or_else(|| type_name.to_string(), |n| n.clone())
    }

    pub(crate) fn for_msg(&self, t: TypeId) -> Option<MsgCodec> {
        self.by_msg.get(&t).map(|c| *c)
    }

    pub(crate) fn decoder(&self, actor: TypeId, ty: u64) -> Option<(Decoder, ReplyEncoder)> {
        self.decoders.get(&(actor, ty)).map(|d| *d)
    }
}

/// A message type could not be registered for crossing nodes, or an actor
/// type could not be given a wire name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RegisterError {
    /// Another message type is registered under this wire name (or one
    /// whose number is the same).
    NameTaken {
        /// The wire name registered first.
        name: String,
    },
    /// Another actor type has this wire name
    /// ([`super::Node::register_actor_as`]).
    ActorNameTaken {
        /// The wire name given first.
        name: String,
    },
    /// This type is registered under another wire name already: a type
    /// has one wire name on a node.
    Renamed {
        /// The type.
        type_name: &'static str,
    },
    /// The message type is not registered on this node (see
    /// [`super::Node::register`]), and must be for what was asked.
    NotRegistered {
        /// The message type.
        type_name: &'static str,
    },
}

impl std::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegisterError::NameTaken { name } => {
                write!(f, "the wire name {name:?} is another message type's")
            }
            RegisterError::ActorNameTaken { name } => {
                write!(f, "the wire name {name:?} is another actor type's")
            }
            RegisterError::Renamed { type_name } => {
                write!(f, "{type_name} is registered under another wire name already")
            }
            RegisterError::NotRegistered { type_name } => {
                write!(f, "{type_name} is not registered to cross nodes (Node::register)")
            }
        }
    }
}

impl std::error::Error for RegisterError {}
