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
//! Both sides share a cluster secret. The handshake is the Noise protocol's
//! `NNpsk0` pattern (X25519, AES-256-GCM, SHA-256), run by `snow`, with a
//! pre-shared key derived from the secret: `Hello` and `Welcome` carry the
//! two Noise messages (each with its side's name and incarnation,
//! encrypted), and `Confirm` is the initiator's first sealed segment,
//! proving it holds the session key. Until `Confirm` opens, no actor
//! message is accepted. A handshake whose peer claims our own name and
//! incarnation (a reflected Hello) is refused. Clusters that want node
//! identity add static node keys (`IXpsk0`, see
//! [Node keys](handshake#node-keys)). See [`handshake`].
//!
//! # After the handshake
//!
//! The handshake yields one session key per direction, from the ephemeral
//! Diffie-Hellman and the secret together ([`handshake::Session`]): fresh
//! per connection, and recorded segments stay unreadable even to someone
//! who learns the secret later. (The dialling side's name and incarnation
//! in `Hello` are protected by the secret alone.) Every later byte travels
//! in sealed segments ([`frame::Sealer`], [`frame::Unsealer`]): a batch of
//! frames encrypted with AES-256-GCM, its number the nonce and its length
//! authenticated, so frames cannot be read, injected, altered, replayed,
//! reordered or dropped by anyone without the session key, except that a
//! connection's last segments can be cut off with the connection itself
//! (no authenticated end of stream; the sender counts what was not
//! acknowledged as in doubt, as for any lost connection).

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
    /// A handshake message or a segment did not authenticate: another
    /// secret, or bytes altered, replayed or reordered on the way.
    BadMac,
    /// The Noise handshake failed for another reason than authentication.
    Noise(String),
    /// A frame that is not valid in the current state.
    Unexpected(&'static str),
    /// The OS could not provide randomness (for an incarnation, a request
    /// id or an ephemeral key).
    Random(String),
    /// With node keys: the peer introduced itself as `name` and presented
    /// a static key that is not the one trusted for that name (`known`: a
    /// key is trusted for it, just another one).
    UntrustedPeer {
        /// The name the peer gave.
        name: String,
        /// Whether any key is trusted for that name.
        known: bool,
    },
    /// One side uses node keys and the other does not (`ours`: whether
    /// this node does).
    KeysMismatch {
        /// Whether this node uses node keys.
        ours: bool,
    },
    /// A key that does not parse.
    BadKey(String),
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
            WireError::BadMac => f.write_str(
                "authentication failed (another cluster secret, or bytes altered on the way)",
            ),
            WireError::Noise(e) => write!(f, "handshake failed: {e}"),
            WireError::Unexpected(what) => write!(f, "unexpected frame: {what}"),
            WireError::Random(e) => write!(f, "no randomness from the OS: {e}"),
            WireError::UntrustedPeer { name, known: true } => {
                write!(f, "node {name:?} presented a static key other than the one trusted for it")
            }
            WireError::UntrustedPeer { name, known: false } => {
                write!(f, "node {name:?} is not among the trusted node keys")
            }
            WireError::KeysMismatch { ours: true } => f.write_str(
                "the peer uses no node key, and this node requires one (configure the same \
                 node-key mode on every node)",
            ),
            WireError::KeysMismatch { ours: false } => f.write_str(
                "the peer uses node keys, and this node has none (configure the same \
                 node-key mode on every node)",
            ),
            WireError::BadKey(e) => write!(f, "bad key: {e}"),
        }
    }
}

impl std::error::Error for WireError {}
