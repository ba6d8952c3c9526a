//! Length-prefixed postcard frames.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use serde::{Deserialize, Serialize};

use super::WireError;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 6;

/// Default largest frame (16 MiB).
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// Every message on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Frame {
    /// Handshake, initiator -> responder: the first Noise message (see
    /// [`crate::handshake`]).
    Hello {
        /// The initiator's protocol version (in the clear, so a mismatch is
        /// reported as one; bound into the handshake all the same).
        version: u16,
        /// One byte of mode, in the clear (0: the cluster secret only, 1:
        /// node keys; bound into the handshake too), then `psk, e` (with
        /// node keys: `psk, e, s`) and the initiator's encrypted
        /// introduction. The mode travels inside `noise`, not as a field of
        /// its own, so that `Hello` keeps the layout of every version and a
        /// node of another version reads its `version` and reports a
        /// version mismatch.
        #[serde(with = "serde_bytes")]
        noise: Vec<u8>,
    },
    /// Handshake, responder -> initiator: the second Noise message.
    Welcome {
        /// `e, ee` (with node keys: `e, ee, se, s, es`) and the responder's
        /// encrypted introduction.
        #[serde(with = "serde_bytes")]
        noise: Vec<u8>,
    },
    /// Handshake, initiator -> responder: proof that the initiator holds
    /// the session key.
    Confirm {
        /// The initiator's segment 0, sealed with its session key.
        #[serde(with = "serde_bytes")]
        sealed: Vec<u8>,
    },
    /// A message for actor `to` of the receiving node (no reply wanted).
    Tell {
        /// The target actor's id on the receiving node.
        to: u64,
        /// The registered message type.
        ty: u64,
        /// The postcard-encoded message.
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    /// A message whose reply goes back as `Reply { req }`.
    Ask {
        /// The target actor's id on the receiving node.
        to: u64,
        /// The registered message type.
        ty: u64,
        /// The request id, chosen by the asking node.
        req: u64,
        /// The postcard-encoded message.
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    /// The reply to `Ask { req }`; `None`: the actor stopped without replying.
    Reply {
        /// The request id.
        req: u64,
        /// The postcard-encoded reply.
        #[serde(with = "serde_bytes")]
        payload: Option<Vec<u8>>,
    },
    /// Looks up an actor by name on the receiving node.
    Lookup {
        /// The request id.
        req: u64,
        /// The name it was exported under.
        name: String,
    },
    /// The answer to `Lookup { req }`: the actor's id and type name.
    Found {
        /// The request id.
        req: u64,
        /// `(id, actor type name)`, or `None` when nothing has that name.
        actor: Option<(u64, String)>,
    },
    /// An actor that was looked up from this connection stopped.
    Stopped {
        /// Its id.
        id: u64,
        /// Why, in words.
        reason: String,
    },
    /// Where the sender listens (dialled again if the connection drops;
    /// the rest of the cluster is found through membership, `Swim`).
    Listening {
        /// The sender's listen address.
        addr: String,
    },
    /// Acknowledgement: how many actor messages the sender has received on
    /// this connection (the peer learns what is no longer in doubt).
    Ping(u64),
    /// The same acknowledgement (accepted like `Ping`; this version sends
    /// only `Ping`).
    Pong(u64),
    /// A membership (SWIM) packet, opaque to the wire layer.
    Swim(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Flow control: actor `to` of the sending node has handled (or
    /// dropped) messages from this connection worth `bytes` of its credit
    /// window, so the receiver may send that much more to it.
    Credit {
        /// The target actor's id on the node that sends this frame.
        to: u64,
        /// The credit given back, in window bytes.
        bytes: u64,
    },
    /// Flow control: the sender holds messages for actor `to` of the
    /// receiving node that need the credit it owes, with too little in
    /// flight for the half-window rule to free: give back everything owed
    /// as soon as `to` has caught up.
    Blocked {
        /// The target actor's id on the node that receives this frame.
        to: u64,
    },
    /// Group membership: the sender's own members of the group `name` of
    /// message type `ty`, all of them (the state, not a change: it replaces
    /// whatever the sender said of that group before). Sent when they change
    /// and when a connection comes up.
    Group {
        /// The group's name.
        name: String,
        /// The registered type of the messages its members handle.
        ty: u64,
        /// The members' actor ids on the sending node, in join order.
        members: Vec<u64>,
    },
    /// An exit signal for actor `to` of the receiving node, after every
    /// message the sender sent it before: a stop asked through a reference
    /// (`from` is `None`), or the failure of actor `from` of the sending
    /// node, linked to it.
    Exit {
        /// The target actor's id on the receiving node.
        to: u64,
        /// The linked actor that failed (its id on the sending node).
        from: Option<u64>,
        /// The stop reason, in words (`"normal"`, `"shutdown"` or a text).
        reason: String,
    },
}

/// Seals batches of frames after the handshake: each *segment* is a 4-byte
/// big-endian payload length, the payload (length-prefixed frames)
/// encrypted with AES-256-GCM (by `ring`) under this direction's session
/// key, and the
/// 16-byte GCM tag. The nonce is the segment's number (counting up from 0
/// per direction, never sent), and the length is the associated data, so a
/// segment cannot be read, forged, altered, replayed, dropped or reordered
/// without the receiver noticing, except that the last segments of a
/// connection can be cut off with it (there is no authenticated end of
/// stream: what the peer did not acknowledge is in doubt, as on any lost
/// connection). Lengths are visible. One tag covers every frame of a batch.
///
/// Keys come from a Noise handshake ([`crate::handshake`]): fresh per
/// connection and per direction, so a (key, nonce) pair never repeats; a
/// direction would have to seal 2^64 segments to wrap its counter, and
/// sealing refuses to (it panics rather than reuse a nonce).
pub struct Sealer {
    aead: LessSafeKey,
    seq: u64,
}

/// Opens the segments a [`Sealer`] made (see there).
pub struct Unsealer {
    aead: LessSafeKey,
    seq: u64,
    max: usize,
}

// The session keys never appear in debug output.
impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Unsealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unsealer")
            .field("seq", &self.seq)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

/// Bytes a segment adds to its payload: the length and the tag.
pub const SEGMENT_OVERHEAD: usize = SEGMENT_HEADER + TAG;

/// The length that starts a segment (see [`Sealer::seal_in_place`]).
pub const SEGMENT_HEADER: usize = 4;

const TAG: usize = 16;

/// The nonce of segment `seq`: unique per key, as each direction's key is
/// used for one sequence of segments only.
fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn key(key: [u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).expect("a 32-byte AES-256 key"))
}

impl Sealer {
    /// A sealer with this direction's session key, at segment 0.
    pub fn new(key: [u8; 32]) -> Self {
        Sealer::at(key, 0)
    }

    pub(crate) fn at(k: [u8; 32], seq: u64) -> Self {
        Sealer { aead: key(k), seq }
    }

    /// Appends `payload` (encoded frames) as one sealed segment to `out`.
    pub fn seal(&mut self, payload: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        out.reserve(SEGMENT_OVERHEAD + payload.len());
        out.extend_from_slice(&[0; SEGMENT_HEADER]);
        out.extend_from_slice(payload);
        self.seal_at(out, start);
    }

    /// Seals `seg` where it is: `seg` is [`SEGMENT_HEADER`] bytes of room
    /// for the length followed by the payload; the payload is encrypted in
    /// place and the tag appended (no copy, unless `seg` has no room left
    /// for the tag's 16 bytes and must grow). The link keeps its pending
    /// frames this way.
    ///
    /// # Panics
    /// If `seg` is shorter than [`SEGMENT_HEADER`], or its payload is 4 GiB
    /// or more.
    pub fn seal_in_place(&mut self, seg: &mut Vec<u8>) {
        assert!(seg.len() >= SEGMENT_HEADER, "a segment starts with room for its length");
        self.seal_at(seg, 0);
    }

    /// Seals `e` as a segment of its one frame, in its own buffer: the
    /// same segment [`Sealer::seal_in_place`] makes of a buffer holding
    /// only that frame.
    pub fn seal_encoded(&mut self, e: Encoded) -> Vec<u8> {
        let mut seg = e.buf;
        self.seal_in_place(&mut seg);
        seg
    }

    fn seal_at(&mut self, out: &mut Vec<u8>, start: usize) {
        let len = out.len() - start - SEGMENT_HEADER;
        let len = u32::try_from(len).expect("a segment's payload is under 4 GiB");
        let (head, body) = out[start..].split_at_mut(SEGMENT_HEADER);
        head.copy_from_slice(&len.to_be_bytes());
        let seq = self.seq;
        self.seq = seq.checked_add(1).expect("2^64 segments on one key: never reuse a nonce");
        let tag = self
            .aead
            .seal_in_place_separate_tag(nonce(seq), Aad::from(&*head), body)
            .expect("AES-GCM seals any payload under 64 GiB");
        out.extend_from_slice(tag.as_ref());
    }
}

impl Unsealer {
    /// An unsealer with this direction's session key, at segment 0;
    /// payloads over `max` bytes are refused before anything is read.
    pub fn new(key: [u8; 32], max: usize) -> Self {
        Unsealer::at(key, 0, max)
    }

    pub(crate) fn at(k: [u8; 32], seq: u64, max: usize) -> Self {
        Unsealer { aead: key(k), seq, max }
    }

    /// Opens the segment at the start of `buf`, decrypting it in place:
    /// its payload and the bytes the segment used; `Ok(None)` when more
    /// bytes are needed. A segment that does not authenticate (wrong key,
    /// altered, replayed, out of order) is [`WireError::BadMac`], and
    /// `buf` may then hold garbage where its payload was.
    pub fn open<'a>(&mut self, buf: &'a mut [u8]) -> Result<Option<(&'a [u8], usize)>, WireError> {
        let Some(head) = buf.get(..SEGMENT_HEADER) else { return Ok(None) };
        let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
        if len > self.max {
            return Err(WireError::TooLarge { len, max: self.max });
        }
        // (Checked: on a 32-bit target `max` may be near `usize::MAX`.)
        let Some(used) = len.checked_add(SEGMENT_OVERHEAD) else {
            return Err(WireError::TooLarge { len, max: self.max });
        };
        let Some(seg) = buf.get_mut(..used) else { return Ok(None) };
        let (head, sealed) = seg.split_at_mut(SEGMENT_HEADER);
        let payload = self
            .aead
            .open_in_place(nonce(self.seq), Aad::from(&*head), sealed)
            .map_err(|_| WireError::BadMac)?;
        self.seq += 1;
        Ok(Some((&*payload, used)))
    }
}

/// Appends one length-prefixed frame to `out`, encoding it in place (no
/// intermediate buffer). On an error `out` is as it was.
pub fn encode(frame: &Frame, out: &mut Vec<u8>, max: usize) -> Result<(), WireError> {
    let max = max.min(u32::MAX as usize); // the length prefix is 32 bits
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let encoded = postcard::serialize_with_flavor(frame, Append(out));
    let len = out.len() - start - 4;
    let err = match encoded {
        Err(e) => WireError::Malformed(e.to_string()),
        Ok(()) if len > max => WireError::TooLarge { len, max },
        Ok(()) => {
            out[start..start + 4].copy_from_slice(&(len as u32).to_be_bytes());
            return Ok(());
        }
    };
    out.truncate(start);
    Err(err)
}

/// `v` postcard-encoded (a message or a reply, the payload of a frame)
/// into a vector of exactly its size: one pass counts (no copies), the
/// second writes. postcard's own `to_allocvec` grows its vector from empty,
/// copying a 64 KiB payload several times over on the way.
pub fn encode_payload<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, postcard::Error> {
    let n = postcard::serialize_with_flavor(v, postcard::ser_flavors::Size::default())?;
    let mut out = Vec::with_capacity(n);
    postcard::serialize_with_flavor(v, Append(&mut out))?;
    Ok(out)
}

/// A postcard output that appends to a vector it borrows.
struct Append<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();

    fn try_push(&mut self, b: u8) -> postcard::Result<()> {
        self.0.push(b);
        Ok(())
    }

    fn try_extend(&mut self, b: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(b);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// What an actor message frame is, ahead of its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// A [`Frame::Tell`].
    Tell {
        /// The target actor's id on the receiving node.
        to: u64,
        /// The registered message type.
        ty: u64,
    },
    /// A [`Frame::Ask`].
    Ask {
        /// The target actor's id on the receiving node.
        to: u64,
        /// The registered message type.
        ty: u64,
        /// The request id.
        req: u64,
    },
}

/// One frame encoded on its own, in a buffer laid out as a segment of that
/// one frame: room for the segment's length, the length-prefixed frame,
/// and capacity for the tag. Batched with others into a segment it is
/// copied ([`Encoded::bytes`]); sent alone ([`Sealer::seal_encoded`]) it
/// is sealed where it lies, so a large message is written once, by its
/// serializer, and never copied again on its way to the socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Encoded {
    buf: Vec<u8>,
    payload: usize,
}

impl Encoded {
    /// `f`, encoded; its body may have at most `max` bytes.
    pub fn frame(f: &Frame, max: usize) -> Result<Encoded, WireError> {
        let mut buf = vec![0; SEGMENT_HEADER];
        encode(f, &mut buf, max)?;
        buf.reserve_exact(TAG);
        let payload = match f {
            Frame::Tell { payload, .. } | Frame::Ask { payload, .. } => payload.len(),
            _ => 0,
        };
        Ok(Encoded { buf, payload })
    }

    /// The `Tell` or `Ask` of `head` with `msg` as its payload, serialized
    /// straight into the frame (the same bytes as [`Encoded::frame`] of
    /// the frame with `msg`'s postcard encoding as its payload, without
    /// that intermediate vector). The body may have at most `max` bytes.
    pub fn message<T: Serialize + ?Sized>(
        head: Head,
        msg: &T,
        max: usize,
    ) -> Result<Encoded, WireError> {
        let malformed = |e: postcard::Error| WireError::Malformed(e.to_string());
        let n = postcard::serialize_with_flavor(msg, postcard::ser_flavors::Size::default())
            .map_err(malformed)?;
        let empty = match head {
            Head::Tell { to, ty } => Frame::Tell { to, ty, payload: Vec::new() },
            Head::Ask { to, ty, req } => Frame::Ask { to, ty, req, payload: Vec::new() },
        };
        // The frame with an empty payload, whose encoding ends in the
        // payload's length (a one-byte 0): the fields before it, as the
        // enum encodes them. The length is replaced, the payload follows.
        let mut buf = Vec::with_capacity(SEGMENT_HEADER + 4 + 3 * 10 + 10 + n + TAG);
        buf.extend_from_slice(&[0; SEGMENT_HEADER]);
        encode(&empty, &mut buf, usize::MAX)?;
        let zero = buf.pop();
        debug_assert_eq!(zero, Some(0), "the payload is the last field");
        push_varint(&mut buf, n as u64);
        let before = buf.len();
        postcard::serialize_with_flavor(msg, Append(&mut buf)).map_err(malformed)?;
        if buf.len() - before != n {
            return Err(WireError::Malformed(
                "the message encoded to a different length twice".into(),
            ));
        }
        let len = buf.len() - SEGMENT_HEADER - 4;
        let max = max.min(u32::MAX as usize);
        if len > max {
            return Err(WireError::TooLarge { len, max });
        }
        buf[SEGMENT_HEADER..SEGMENT_HEADER + 4].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(Encoded { buf, payload: n })
    }

    /// The length-prefixed frame, as [`encode`] appends it.
    pub fn bytes(&self) -> &[u8] {
        self.buf.get(SEGMENT_HEADER..).unwrap_or_default()
    }

    /// The length of the message payload (0 for a frame that is not a
    /// `Tell` or an `Ask`).
    pub fn payload_len(&self) -> usize {
        self.payload
    }
}

/// `v` as postcard writes a `u64`/`usize` (LEB128: 7 bits a byte, low first).
fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Decodes the frame at the start of `buf`: `Ok(None)` when more bytes are
/// needed, else the frame and the bytes it used (always at least 5: the
/// length prefix and a body of at least one byte). The announced length is
/// checked against `max` before anything is allocated.
///
/// Only the one encoding [`encode`] produces is accepted, so a decoded frame
/// re-encodes to exactly the bytes it came from. postcard itself would also
/// accept non-canonical varints (`0x80 0x00` for 0, say); those, an empty
/// body and trailing bytes are [`WireError::Malformed`].
pub fn decode(buf: &[u8], max: usize) -> Result<Option<(Frame, usize)>, WireError> {
    let Some(body) = body(buf, max)? else { return Ok(None) };
    Ok(Some((decode_body(body)?, 4 + body.len())))
}

/// An actor message (`Tell` or `Ask`) read in place: its payload borrows
/// the bytes it was decoded from, so a received message is not copied
/// before the target's type decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageRef<'a> {
    /// The target actor's id on the receiving node.
    pub to: u64,
    /// The registered message type.
    pub ty: u64,
    /// The request id of an `Ask`; `None` for a `Tell`.
    pub req: Option<u64>,
    /// The postcard-encoded message.
    pub payload: &'a [u8],
}

/// A frame as [`decode_in_place`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A `Tell` or an `Ask`, its payload borrowed.
    Message(MessageRef<'a>),
    /// Any other frame.
    Other(Frame),
}

/// As [`decode`], with the same checks and the same errors, but a `Tell`
/// or an `Ask` comes back as a [`MessageRef`] whose payload borrows `buf`
/// (the hot path of a receiving node: no copy of the payload).
pub fn decode_in_place(buf: &[u8], max: usize) -> Result<Option<(Decoded<'_>, usize)>, WireError> {
    let Some(body) = body(buf, max)? else { return Ok(None) };
    let used = 4 + body.len();
    let decoded = match body[0] {
        TELL_TAG => {
            let t: TellRef<'_> = exactly(&body[1..])?;
            let m = MessageRef { to: t.to, ty: t.ty, req: None, payload: t.payload };
            canonical(&t, body.len() - 1)?;
            Decoded::Message(m)
        }
        ASK_TAG => {
            let a: AskRef<'_> = exactly(&body[1..])?;
            let m = MessageRef { to: a.to, ty: a.ty, req: Some(a.req), payload: a.payload };
            canonical(&a, body.len() - 1)?;
            Decoded::Message(m)
        }
        _ => Decoded::Other(decode_body(body)?),
    };
    Ok(Some((decoded, used)))
}

/// `Frame::Tell`'s and `Frame::Ask`'s variant numbers: their first body
/// byte (a one-byte varint; a test holds these to the enum's order).
const TELL_TAG: u8 = 3;
const ASK_TAG: u8 = 4;

/// `Frame::Tell`'s fields, borrowed.
#[derive(Serialize, Deserialize)]
struct TellRef<'a> {
    to: u64,
    ty: u64,
    #[serde(borrow, with = "serde_bytes")]
    payload: &'a [u8],
}

/// `Frame::Ask`'s fields, borrowed.
#[derive(Serialize, Deserialize)]
struct AskRef<'a> {
    to: u64,
    ty: u64,
    req: u64,
    #[serde(borrow, with = "serde_bytes")]
    payload: &'a [u8],
}

/// The body of the frame at the start of `buf`, its length checked
/// against `max` before anything else is read; `None`: more bytes needed.
fn body(buf: &[u8], max: usize) -> Result<Option<&[u8]>, WireError> {
    let Some(head) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    if len == 0 {
        // Every frame has a variant tag: an empty body is never a frame.
        return Err(WireError::Malformed("a frame of zero bytes".into()));
    }
    let Some(end) = len.checked_add(4) else { return Err(WireError::TooLarge { len, max }) };
    Ok(buf.get(4..end))
}

/// `body` as one `T`, with nothing left over.
fn exactly<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, WireError> {
    let (v, rest): (T, &[u8]) =
        postcard::take_from_bytes(body).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!("{} trailing bytes in a frame", rest.len())));
    }
    Ok(v)
}

/// Checks that `len` bytes were `v`'s canonical encoding.
///
/// The only freedom postcard's decoder leaves is a varint written longer
/// than needed (bools, options and tags are checked, strings and byte
/// arrays are copied as they are), and every such varint makes the body
/// longer than the canonical encoding. So a body exactly as long as the
/// value's canonical encoding is that encoding; this counts bytes without
/// allocating or copying payloads.
fn canonical<T: Serialize>(v: &T, len: usize) -> Result<(), WireError> {
    let canonical = postcard::serialize_with_flavor(v, postcard::ser_flavors::Size::default())
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    if canonical != len {
        return Err(WireError::Malformed(format!(
            "non-canonical encoding ({len} bytes, canonically {canonical})"
        )));
    }
    Ok(())
}

fn decode_body(body: &[u8]) -> Result<Frame, WireError> {
    let frame: Frame = exactly(body)?;
    canonical(&frame, body.len())?;
    Ok(frame)
}

#[cfg(test)]
mod tests;
