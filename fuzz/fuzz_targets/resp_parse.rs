//! Arbitrary bytes through the KV server's RESP parser, fed as a
//! connection of the server is (`KvWorker::received`: append what arrived
//! to the buffer, parse requests from its start until `Incomplete` or an
//! error, keep the unparsed rest for the next read).
//!
//! The first byte of the input chooses how many cut points follow (0 to 3,
//! two bytes each, taken modulo the length of the rest); the rest is the
//! byte stream. It is fed once whole, once in the pieces the cut points
//! make, and, if it is at most 256 bytes, once byte by byte. Checked: never
//! a panic; every request used at least one byte and no more than were
//! buffered; and every feeding gives the same requests in the same order,
//! the same outcome (a protocol error, or none) and, without an error, the
//! same unparsed rest. With an error, the requests before it are the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use ringmail_examples::kv::resp::{parse, Limits, Parsed};

/// What one connection made of the bytes it was given.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    requests: Vec<Vec<Vec<u8>>>,
    /// A protocol error ended the connection (after `requests`).
    error: bool,
    /// Bytes still buffered, waiting for the rest of a request.
    rest: Vec<u8>,
}

/// Feeds `pieces` in order, parsing after each as the server does.
fn feed<'a>(pieces: impl IntoIterator<Item = &'a [u8]>, limits: &Limits) -> Outcome {
    let mut inbuf = Vec::new();
    let mut requests = Vec::new();
    for piece in pieces {
        inbuf.extend_from_slice(piece);
        let mut used = 0;
        loop {
            match parse(&inbuf[used..], limits) {
                Ok(Parsed::Request(args, n)) => {
                    assert!(n > 0, "a request of zero bytes (the server would loop)");
                    assert!(n <= inbuf.len() - used, "claimed {n} of {} bytes", inbuf.len() - used);
                    requests.push(args);
                    used += n;
                }
                Ok(Parsed::Incomplete) => break,
                // The server answers the error and reads nothing more.
                Err(_) => return Outcome { requests, error: true, rest: Vec::new() },
            }
        }
        inbuf.drain(..used);
    }
    Outcome { requests, error: false, rest: inbuf }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_args: 64, max_bulk: 4096, max_inline: 4096, ..Limits::default() };
    let Some((&n, data)) = data.split_first() else { return };
    let n = usize::from(n % 4);
    let Some((cuts, stream)) = data.split_at_checked(2 * n) else { return };
    let mut at: Vec<usize> = cuts
        .chunks(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (stream.len() + 1))
        .collect();
    at.sort_unstable();
    let mut pieces = Vec::new();
    let mut from = 0;
    for &to in &at {
        pieces.push(&stream[from..to]);
        from = to;
    }
    pieces.push(&stream[from..]);

    let whole = feed([stream], &limits);
    let split = feed(pieces.iter().copied(), &limits);
    assert_eq!(whole, split, "whole vs. cut at {at:?}");
    if stream.len() <= 256 {
        let bytewise = feed(stream.chunks(1), &limits);
        assert_eq!(whole, bytewise, "whole vs. byte by byte");
    }
});
