//! The wire protocol between nodes, sans I/O: framing ([`frame`]) and the
//! authenticated handshake ([`handshake`]). The connection actors that drive
//! them over TCP sockets on a ring build on these; nothing here touches a
//! socket, so every state and every byte sequence can be tested directly.
//!
//! # Frames
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of a
//! postcard-encoded [`frame::Frame`]. The length is checked against the
//! configured maximum **before** anything is allocated; a frame that is too
//! large, does not decode, or is of an unexpected kind closes that
//! connection only, with a typed [`WireError`].
//!
//! # Handshake
//!
//! Both sides share a cluster secret. The initiator sends `Hello` (protocol
//! version, node name, incarnation, a fresh 128-bit nonce); the responder
//! answers `Welcome` (its name, incarnation, its own fresh nonce, and an
//! HMAC-SHA256 over the whole transcript); the initiator checks it and
//! answers `Confirm` with its own MAC over the same transcript, which the
//! responder checks. MACs are compared in constant time. Until both checks
//! pass, no actor message is accepted. A handshake whose peer claims our own
//! name and incarnation (a reflected Hello) is refused.
//!
//! # After the handshake
//!
//! The handshake derives one session key per direction from the secret and
//! the transcript ([`handshake::SessionKeys`]). Every later byte travels in
//! sealed segments ([`frame::Sealer`], [`frame::Unsealer`]): a batch of
//! frames with an HMAC-SHA256 tag over its number, length and contents, so
//! frames cannot be injected, altered, replayed, dropped or reordered by
//! anyone without the secret. (They are not encrypted: confidentiality is
//! for the network underneath, e.g. a VPN.)

#![warn(missing_debug_implementations, unreachable_pub)]

pub mod frame;
pub mod handshake;

use std::fmt;

/// What went wrong on a connection; it closes that connection only.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// A frame announced `len` bytes, over the configured maximum.
    TooLarge {
        /// The announced length.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// The bytes of a frame did not decode.
    Malformed(String),
    /// The peer speaks another protocol version.
    VersionMismatch {
        /// Ours.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// A handshake MAC did not verify: wrong secret or a tampered transcript.
    BadMac,
    /// A frame that is not valid in the current state.
    Unexpected(&'static str),
    /// The OS could not provide randomness for a nonce.
    Random(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::TooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the maximum of {max}")
            }
            WireError::Malformed(e) => write!(f, "malformed frame: {e}"),
            WireError::VersionMismatch { ours, theirs } => {
                write!(f, "protocol version mismatch: ours {ours}, theirs {theirs}")
            }
            WireError::BadMac => {
                f.write_str("handshake authentication failed (wrong secret or tampered transcript)")
            }
            WireError::Unexpected(what) => write!(f, "unexpected frame: {what}"),
            WireError::Random(e) => write!(f, "no randomness for a nonce: {e}"),
        }
    }
}

impl std::error::Error for WireError {}
