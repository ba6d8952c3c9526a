//! Framing: cuts the byte stream of a connection ([`super::Input::Data`])
//! back into messages, as lines or as length-prefixed frames, with a bound
//! on a message's size so that a peer cannot make a worker buffer without
//! limit.
//!
//! A [`Framer`] per connection; feed it what arrives, take what is whole.
//! A message comes out as [`Bytes`]: a reference-counted slice of the
//! framer's buffer, not a copy, to hand on to another actor as it is; the
//! framer reuses its buffer once every message cut from it is dropped. A
//! message kept alive keeps the whole buffer it was cut from alive (a
//! receive's worth, at most the limit plus what arrived with it): copy a
//! small message that is kept for long (`Bytes::copy_from_slice`).
//!
//! ```
//! use ringmail::net::frame::Framer;
//!
//! let mut lines = Framer::lines(1024);
//! lines.push(b"hel");
//! assert_eq!(lines.next_frame(), Ok(None)); // not whole yet
//! lines.push(b"lo\nwor");
//! assert_eq!(lines.next_frame(), Ok(Some("hello".into())));
//! lines.push(b"ld\r\n");
//! assert_eq!(lines.next_frame(), Ok(Some("world".into())));
//!
//! let mut frames = Framer::length_prefixed(1024);
//! let mut wire = Vec::new();
//! Framer::encode_length_prefixed(b"ping", &mut wire);
//! frames.push(&wire);
//! assert_eq!(frames.next_frame(), Ok(Some("ping".into())));
//! ```

use std::fmt;

use bytes::{Buf, Bytes, BytesMut};

/// How a connection's bytes are cut into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Framing {
    /// Lines ended by `\n`; a `\r` before it is dropped too.
    Lines,
    /// A 4-byte big-endian length, then that many bytes.
    LengthPrefixed,
}

/// A message longer than the framer's limit: the stream cannot be trusted
/// further (close the connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// A frame (or a line without its end) longer than `limit` bytes.
    TooLong {
        /// The framer's limit.
        limit: usize,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooLong { limit } => {
                write!(f, "a message longer than the limit of {limit} bytes")
            }
        }
    }
}

impl std::error::Error for FrameError {}

/// Cuts one connection's bytes into messages (see the module docs).
#[derive(Debug)]
pub struct Framer {
    framing: Framing,
    limit: usize,
    /// From the start of the next message (messages taken are split off).
    buf: BytesMut,
    /// Lines: how far `buf` has been searched for `\n` already.
    scanned: usize,
}

impl Framer {
    /// Lines of at most `limit` bytes (without their end).
    pub fn lines(limit: usize) -> Framer {
        Framer::new(Framing::Lines, limit)
    }

    /// Length-prefixed frames of at most `limit` bytes.
    pub fn length_prefixed(limit: usize) -> Framer {
        Framer::new(Framing::LengthPrefixed, limit)
    }

    /// A framer for `framing`, with messages of at most `limit` bytes.
    pub fn new(framing: Framing, limit: usize) -> Framer {
        Framer { framing, limit, buf: BytesMut::new(), scanned: 0 }
    }

    /// Appends bytes that arrived.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// Bytes held that are not a whole message yet.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next whole message, `Ok(None)` when none is whole yet, or an
    /// error when the one in progress is over the limit.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        let too_long = FrameError::TooLong { limit: self.limit };
        match self.framing {
            Framing::Lines => {
                let from = self.scanned;
                match self.buf[from..].iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        let end = from + i;
                        let cr = usize::from(end > 0 && self.buf[end - 1] == b'\r');
                        if end - cr > self.limit {
                            return Err(too_long);
                        }
                        let mut line = self.buf.split_to(end + 1);
                        line.truncate(end - cr);
                        self.scanned = 0;
                        Ok(Some(line.freeze()))
                    }
                    None => {
                        // "\r" may still come before the "\n": one byte over.
                        if self.buf.len() > self.limit + 1 {
                            return Err(too_long);
                        }
                        self.scanned = self.buf.len();
                        Ok(None)
                    }
                }
            }
            Framing::LengthPrefixed => {
                let Some(head) = self.buf.get(..4) else { return Ok(None) };
                let len = u32::from_be_bytes(head.try_into().expect("4 bytes")) as usize;
                if len > self.limit {
                    return Err(too_long);
                }
                if self.buf.len() < 4 + len {
                    return Ok(None);
                }
                self.buf.advance(4);
                Ok(Some(self.buf.split_to(len).freeze()))
            }
        }
    }

    /// Appends `frame` to `out` as a length-prefixed frame.
    ///
    /// # Panics
    ///
    /// If `frame` is longer than `u32::MAX` bytes.
    pub fn encode_length_prefixed(frame: &[u8], out: &mut Vec<u8>) {
        let len = u32::try_from(frame.len()).expect("a frame of at most 4 GiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(f: &mut Framer) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| f.next_frame().unwrap()).map(|b| b.to_vec()).collect()
    }

    #[test]
    fn lines_come_whole_whatever_the_pieces() {
        let text = b"one\ntwo\r\n\nthree\n";
        for cut in 1..text.len() {
            let mut f = Framer::lines(16);
            let mut got = Vec::new();
            for piece in text.chunks(cut) {
                f.push(piece);
                got.extend(all(&mut f));
            }
            assert_eq!(got, [&b"one"[..], b"two", b"", b"three"], "pieces of {cut}");
            assert_eq!(f.buffered(), 0);
        }
    }

    #[test]
    fn frames_come_whole_whatever_the_pieces() {
        let mut wire = Vec::new();
        for m in [&b"a"[..], b"", b"hello world"] {
            Framer::encode_length_prefixed(m, &mut wire);
        }
        for cut in 1..wire.len() {
            let mut f = Framer::length_prefixed(64);
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                f.push(piece);
                got.extend(all(&mut f));
            }
            assert_eq!(got, [&b"a"[..], b"", b"hello world"], "pieces of {cut}");
        }
    }

    #[test]
    fn a_message_over_the_limit_is_an_error_before_it_is_buffered_whole() {
        let mut f = Framer::lines(4);
        f.push(b"12345"); // limit + 1 bytes: could be 4 bytes and a "\r"
        assert_eq!(f.next_frame(), Ok(None));
        f.push(b"6");
        assert_eq!(f.next_frame(), Err(FrameError::TooLong { limit: 4 }));
        let mut f = Framer::lines(4);
        f.push(b"1234\r\n");
        assert_eq!(f.next_frame(), Ok(Some("1234".into())), "the limit itself is fine");
        let mut f = Framer::length_prefixed(8);
        f.push(&9u32.to_be_bytes()); // refused from the header alone
        assert_eq!(f.next_frame(), Err(FrameError::TooLong { limit: 8 }));
        assert_eq!(
            FrameError::TooLong { limit: 8 }.to_string(),
            "a message longer than the limit of 8 bytes"
        );
    }

    #[test]
    fn memory_stays_bounded_over_a_long_stream() {
        let mut f = Framer::lines(64);
        let (mut low, mut high) = (usize::MAX, 0);
        for i in 0..100_000 {
            f.push(format!("line {i}\n").as_bytes());
            assert_eq!(f.next_frame().unwrap().unwrap(), format!("line {i}").as_bytes());
            assert!(f.buf.capacity() < 4096, "consumed bytes are dropped: {}", f.buf.capacity());
            if i >= 1000 {
                // Past the first growth, one allocation is reused: the
                // buffer stays within a few KiB of addresses.
                let at = f.buf.as_ptr() as usize;
                (low, high) = (low.min(at), high.max(at));
            }
        }
        assert!(high - low < 8192, "the buffer moved over {} bytes", high - low);
    }

    #[test]
    fn a_frame_is_a_slice_of_the_buffer_and_the_buffer_is_reused_once_frames_are_dropped() {
        let mut f = Framer::length_prefixed(64);
        let mut wire = Vec::new();
        Framer::encode_length_prefixed(b"first", &mut wire);
        Framer::encode_length_prefixed(b"second", &mut wire);
        f.push(&wire);
        let base = f.buf.as_ptr() as usize;
        let one = f.next_frame().unwrap().unwrap();
        let two = f.next_frame().unwrap().unwrap();
        assert_eq!((&one[..], &two[..]), (&b"first"[..], &b"second"[..]));
        // Not copies: both point into the bytes pushed.
        assert_eq!(one.as_ptr() as usize, base + 4);
        assert_eq!(two.as_ptr() as usize, base + 4 + 5 + 4);
        drop((one, two));
        f.push(&wire); // the frames are gone: the same allocation takes it
        assert_eq!(f.buf.as_ptr() as usize, base, "the buffer is reused");
    }
}
