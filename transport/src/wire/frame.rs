//! Length-prefixed postcard frames.

use serde::{Deserialize, Serialize};

use super::WireError;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// Default largest frame (16 MiB).
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// Every message on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Frame {
    /// Handshake, initiator -> responder.
    Hello {
        /// The initiator's protocol version.
        version: u16,
        /// The initiator's node name.
        name: String,
        /// The initiator's incarnation (random per process start).
        incarnation: u64,
        /// A fresh random nonce.
        nonce: [u8; 16],
    },
    /// Handshake, responder -> initiator.
    Welcome {
        /// The responder's node name.
        name: String,
        /// The responder's incarnation.
        incarnation: u64,
        /// A fresh random nonce.
        nonce: [u8; 16],
        /// HMAC-SHA256 over the transcript, by the responder.
        mac: [u8; 32],
    },
    /// Handshake, initiator -> responder.
    Confirm {
        /// HMAC-SHA256 over the transcript, by the initiator.
        mac: [u8; 32],
    },
    /// An actor message.
    Msg {
        /// The target actor's name or id on the receiving node.
        to: String,
        /// The registered message type.
        type_id: u64,
        /// Per-connection sequence number (FIFO, gap detection).
        seq: u64,
        /// The postcard-encoded message.
        payload: Vec<u8>,
    },
    /// Liveness probe and its answer.
    Ping(u64),
    /// Answer to a `Ping`.
    Pong(u64),
}

/// Appends one length-prefixed frame to `out`.
pub fn encode(frame: &Frame, out: &mut Vec<u8>, max: usize) -> Result<(), WireError> {
    let max = max.min(u32::MAX as usize); // the length prefix is 32 bits
    let body = postcard::to_allocvec(frame).map_err(|e| WireError::Malformed(e.to_string()))?;
    if body.len() > max {
        return Err(WireError::TooLarge { len: body.len(), max });
    }
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// Decodes the frame at the start of `buf`: `Ok(None)` when more bytes are
/// needed, else the frame and the bytes it used. The announced length is
/// checked against `max` before anything is allocated.
pub fn decode(buf: &[u8], max: usize) -> Result<Option<(Frame, usize)>, WireError> {
    let Some(head) = buf.get(..4) else { return Ok(None) };
    let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    let Some(body) = buf.get(4..4 + len) else { return Ok(None) };
    let (frame, rest): (Frame, &[u8]) =
        postcard::take_from_bytes(body).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!("{} trailing bytes in a frame", rest.len())));
    }
    Ok(Some((frame, 4 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn msg(n: usize) -> Frame {
        Frame::Msg { to: "shard-1".into(), type_id: 7, seq: 3, payload: vec![0xab; n] }
    }

    #[test]
    fn round_trip_partial_and_pipelined() {
        let mut buf = Vec::new();
        encode(&msg(10), &mut buf, DEFAULT_MAX_FRAME).unwrap();
        encode(&Frame::Ping(9), &mut buf, DEFAULT_MAX_FRAME).unwrap();
        let (f, used) = decode(&buf, DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(f, msg(10));
        for cut in 0..used {
            assert_eq!(decode(&buf[..cut], DEFAULT_MAX_FRAME).unwrap(), None);
        }
        assert_eq!(
            decode(&buf[used..], DEFAULT_MAX_FRAME).unwrap(),
            Some((Frame::Ping(9), buf.len() - used))
        );
    }

    #[test]
    fn oversize_is_refused_before_allocating() {
        let huge = (u32::MAX).to_be_bytes();
        assert_eq!(
            decode(&huge, 1024),
            Err(WireError::TooLarge { len: u32::MAX as usize, max: 1024 })
        );
        let mut buf = Vec::new();
        assert!(matches!(encode(&msg(2000), &mut buf, 1024), Err(WireError::TooLarge { .. })));
        assert!(buf.is_empty(), "a refused frame leaves nothing behind");
    }

    #[test]
    fn trailing_bytes_inside_a_frame_are_malformed() {
        let mut body = postcard::to_allocvec(&Frame::Ping(1)).unwrap();
        body.push(0);
        let mut buf = (body.len() as u32).to_be_bytes().to_vec();
        buf.extend_from_slice(&body);
        assert!(matches!(decode(&buf, 1024), Err(WireError::Malformed(_))));
    }

    #[test]
    fn garbage_is_malformed() {
        let mut buf = 3u32.to_be_bytes().to_vec();
        buf.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(matches!(decode(&buf, 1024), Err(WireError::Malformed(_))));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder, and never make it claim
        /// more bytes than it got.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(Some((_, used))) = decode(&bytes, 4096) {
                prop_assert!(used <= bytes.len());
            }
        }

        /// Every message frame round-trips.
        #[test]
        fn message_frames_round_trip(to in ".{0,20}", type_id: u64, seq: u64, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let f = Frame::Msg { to, type_id, seq, payload };
            let mut buf = Vec::new();
            encode(&f, &mut buf, DEFAULT_MAX_FRAME).unwrap();
            prop_assert_eq!(decode(&buf, DEFAULT_MAX_FRAME).unwrap(), Some((f, buf.len())));
        }
    }
}
