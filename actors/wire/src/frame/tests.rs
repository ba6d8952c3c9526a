//! Frame encoding and decoding: every frame both ways, byte-exact
//! re-encoding, limits and malformed input.

use super::*;
use proptest::prelude::*;

fn msg(n: usize) -> Frame {
    Frame::Tell { to: 1, ty: 7, payload: vec![0xab; n] }
}

/// The payloads' encoding as serde's default for `Vec<u8>` (a sequence
/// of `u8`), as protocol 3 was first written: `serde_bytes` changes how
/// fast payloads are written and read, never the bytes on the wire.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum AsSequences {
    Hello,
    Welcome,
    Confirm,
    Tell { to: u64, ty: u64, payload: Vec<u8> },
    Ask { to: u64, ty: u64, req: u64, payload: Vec<u8> },
    Reply { req: u64, payload: Option<Vec<u8>> },
    Lookup,
    Found,
    Stopped,
    Listening,
    Ping(u64),
    Pong(u64),
    Swim(Vec<u8>),
}

#[test]
fn payloads_are_the_same_bytes_on_the_wire_as_a_sequence_of_u8() {
    for n in [0, 1, 127, 128, 300, 70_000] {
        let p: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
        let pairs = [
            (
                Frame::Tell { to: 9, ty: 8, payload: p.clone() },
                AsSequences::Tell { to: 9, ty: 8, payload: p.clone() },
            ),
            (
                Frame::Ask { to: 9, ty: 8, req: 7, payload: p.clone() },
                AsSequences::Ask { to: 9, ty: 8, req: 7, payload: p.clone() },
            ),
            (
                Frame::Reply { req: 7, payload: Some(p.clone()) },
                AsSequences::Reply { req: 7, payload: Some(p.clone()) },
            ),
            (Frame::Reply { req: 7, payload: None }, AsSequences::Reply { req: 7, payload: None }),
            (Frame::Swim(p.clone()), AsSequences::Swim(p.clone())),
        ];
        for (frame, old) in pairs {
            let bytes = postcard::to_allocvec(&frame).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&old).unwrap(), "{n} bytes: {frame:?}");
            assert_eq!(postcard::from_bytes::<AsSequences>(&bytes).unwrap(), old);
            assert_eq!(postcard::from_bytes::<Frame>(&bytes).unwrap(), frame);
        }
    }
}

#[test]
fn sealed_segments_open_in_order_and_refuse_tampering() {
    let mut s = Sealer::new([3; 32]);
    let mut wire = Vec::new();
    let mut frames = Vec::new();
    encode(&msg(5), &mut frames, DEFAULT_MAX_FRAME).unwrap();
    s.seal(&frames, &mut wire);
    s.seal(b"", &mut wire);
    // Encrypted: the payload is not on the wire.
    assert!(!wire.windows(5).any(|w| w == [0xab; 5]), "plaintext on the wire");
    let mut u = Unsealer::new([3; 32], 1 << 20);
    for cut in 0..SEGMENT_OVERHEAD + frames.len() {
        let mut part = wire[..cut].to_vec();
        assert_eq!(u.open(&mut part).unwrap(), None, "needs more bytes at {cut}");
    }
    let mut buf = wire.clone();
    let (p, used) = u.open(&mut buf).unwrap().unwrap();
    assert_eq!(p, &frames[..]);
    assert_eq!(u.open(&mut buf[used..]).unwrap().unwrap().0, b"");
    // Replaying the first segment: its number is stale.
    assert_eq!(u.open(&mut wire.clone()).unwrap_err(), WireError::BadMac);
    // A flipped bit anywhere (length, ciphertext, tag), a wrong key.
    for at in [1, 6, SEGMENT_HEADER + frames.len() + 3] {
        let mut bad = wire.clone();
        bad[at] ^= 1;
        let got = Unsealer::new([3; 32], 1 << 20).open(&mut bad);
        assert!(!matches!(got, Ok(Some(_))), "byte {at} altered and opened: {got:?}");
    }
    let mut copy = wire.clone();
    let got = Unsealer::new([4; 32], 1 << 20).open(&mut copy);
    assert_eq!(got.unwrap_err(), WireError::BadMac);
    // Oversize before anything is read.
    let mut copy = wire.clone();
    let got = Unsealer::new([3; 32], 4).open(&mut copy);
    assert!(matches!(got, Err(WireError::TooLarge { .. })));
}

#[test]
fn messages_decode_in_place_as_decode_reads_them() {
    let frames = [
        Frame::Tell { to: 1, ty: 2, payload: vec![9; 300] },
        Frame::Ask { to: 300, ty: u64::MAX, req: 7, payload: vec![] },
        Frame::Ping(5),
        Frame::Reply { req: 1, payload: Some(vec![1, 2]) },
    ];
    let mut buf = Vec::new();
    for f in &frames {
        encode(f, &mut buf, DEFAULT_MAX_FRAME).unwrap();
    }
    let mut at = 0;
    for f in &frames {
        let (d, n) = decode_in_place(&buf[at..], DEFAULT_MAX_FRAME).unwrap().unwrap();
        assert_eq!(Some((f.clone(), n)), decode(&buf[at..], DEFAULT_MAX_FRAME).unwrap());
        match (d, f) {
            (Decoded::Message(m), Frame::Tell { to, ty, payload }) => {
                assert_eq!(m, MessageRef { to: *to, ty: *ty, req: None, payload })
            }
            (Decoded::Message(m), Frame::Ask { to, ty, req, payload }) => {
                assert_eq!(m, MessageRef { to: *to, ty: *ty, req: Some(*req), payload })
            }
            (Decoded::Other(o), f) => assert_eq!(&o, f),
            (d, f) => panic!("{f:?} decoded in place as {d:?}"),
        }
        at += n;
    }
    // The tags are the enum's: the first body byte of a Tell and an Ask.
    assert_eq!(buf[4], TELL_TAG);
    let mut ask = Vec::new();
    encode(&frames[1], &mut ask, DEFAULT_MAX_FRAME).unwrap();
    assert_eq!(ask[4], ASK_TAG);
}

#[test]
fn a_message_serialized_into_its_frame_is_the_frame_of_its_encoding() {
    // Payload lengths on both sides of every varint width, and fields
    // that take one byte and ten.
    let lens = [0, 1, 126, 127, 128, 16_382, 16_383, 16_384, 70_000, 2_097_152];
    for (i, &n) in lens.iter().enumerate() {
        let msg: (u32, Vec<u8>) = (i as u32, vec![i as u8; n]);
        let payload = postcard::to_allocvec(&msg).unwrap();
        let ids = [(1, 7, 0), (u64::MAX, 300, u64::MAX), (128, u64::MAX, 127)];
        for (to, ty, req) in ids {
            for (head, frame) in [
                (Head::Tell { to, ty }, Frame::Tell { to, ty, payload: payload.clone() }),
                (Head::Ask { to, ty, req }, Frame::Ask { to, ty, req, payload: payload.clone() }),
            ] {
                let e = Encoded::message(head, &msg, DEFAULT_MAX_FRAME).unwrap();
                assert_eq!(e, Encoded::frame(&frame, DEFAULT_MAX_FRAME).unwrap(), "{head:?} {n}");
                let mut want = Vec::new();
                encode(&frame, &mut want, DEFAULT_MAX_FRAME).unwrap();
                assert_eq!(e.bytes(), &want[..]);
                assert_eq!(e.payload_len(), payload.len());
            }
        }
    }
    // The same limit as `encode`, on the body.
    let big = vec![0u8; 1000];
    let body = {
        let mut b = Vec::new();
        encode(
            &Frame::Tell { to: 1, ty: 2, payload: postcard::to_allocvec(&big).unwrap() },
            &mut b,
            1 << 20,
        )
        .unwrap();
        b.len() - 4
    };
    let head = Head::Tell { to: 1, ty: 2 };
    assert!(Encoded::message(head, &big, body).is_ok());
    assert_eq!(
        Encoded::message(head, &big, body - 1),
        Err(WireError::TooLarge { len: body, max: body - 1 })
    );
}

#[test]
fn an_encoded_frame_sealed_alone_is_the_segment_of_that_one_frame() {
    let key = [9u8; 32];
    let frames = [msg(0), msg(20), msg(70_000), Frame::Ping(3)];
    let (mut alone, mut batched) = (Sealer::new(key), Sealer::new(key));
    let mut opener = Unsealer::new(key, DEFAULT_MAX_FRAME);
    for f in &frames {
        let e = Encoded::frame(f, DEFAULT_MAX_FRAME).unwrap();
        let mut seg = vec![0; SEGMENT_HEADER];
        encode(f, &mut seg, DEFAULT_MAX_FRAME).unwrap();
        batched.seal_in_place(&mut seg);
        let mut sealed = alone.seal_encoded(e);
        assert_eq!(sealed, seg);
        let (payload, used) = opener.open(&mut sealed).unwrap().unwrap();
        assert_eq!(used, seg.len());
        assert_eq!(decode(payload, DEFAULT_MAX_FRAME).unwrap().unwrap().0, *f);
    }
}

#[test]
fn payloads_encode_as_postcard_does_into_a_vector_of_their_size() {
    let values: [(u64, String, Vec<u8>); 3] = [
        (0, String::new(), vec![]),
        (300, "x".repeat(200), vec![7; 70_000]),
        (u64::MAX, "é".into(), vec![1]),
    ];
    for v in &values {
        let got = encode_payload(v).unwrap();
        assert_eq!(got, postcard::to_allocvec(v).unwrap());
        assert_eq!(got.capacity(), got.len(), "sized once, never grown");
    }
}

#[test]
fn sealing_in_place_is_sealing_a_copy() {
    let mut frames = vec![0; SEGMENT_HEADER];
    encode(&msg(300), &mut frames, DEFAULT_MAX_FRAME).unwrap();
    encode(&Frame::Ping(1), &mut frames, DEFAULT_MAX_FRAME).unwrap();
    let mut copy = Vec::new();
    Sealer::new([9; 32]).seal(&frames[SEGMENT_HEADER..], &mut copy);
    let mut in_place = frames.clone();
    Sealer::new([9; 32]).seal_in_place(&mut in_place);
    assert_eq!(in_place, copy);
    let (p, used) = Unsealer::new([9; 32], 1 << 20).open(&mut in_place).unwrap().unwrap();
    assert_eq!((p, used), (&frames[SEGMENT_HEADER..], copy.len()));
}

#[test]
fn encoding_appends_and_leaves_the_buffer_as_it_was_on_error() {
    let mut out = b"before".to_vec();
    encode(&msg(10), &mut out, DEFAULT_MAX_FRAME).unwrap();
    let (f, used) = decode(&out[6..], DEFAULT_MAX_FRAME).unwrap().unwrap();
    assert_eq!((f, used), (msg(10), out.len() - 6));
    let len = out.len();
    assert!(matches!(encode(&msg(100), &mut out, 50), Err(WireError::TooLarge { .. })));
    assert_eq!(out.len(), len, "a refused frame leaves nothing behind");
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
    assert_eq!(decode(&huge, 1024), Err(WireError::TooLarge { len: u32::MAX as usize, max: 1024 }));
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
fn a_zero_length_frame_is_malformed_never_a_frame_of_no_bytes() {
    // A decode that used no bytes would make every caller loop forever.
    let buf = 0u32.to_be_bytes();
    assert!(matches!(decode(&buf, 1024), Err(WireError::Malformed(_))));
    // Even with more bytes after it.
    let mut more = buf.to_vec();
    encode(&Frame::Ping(1), &mut more, 1024).unwrap();
    assert!(matches!(decode(&more, 1024), Err(WireError::Malformed(_))));
}

#[test]
fn non_canonical_varints_are_malformed() {
    // Ping(1) is [tag, 1]; written with a two-byte varint for the tag
    // or the value, postcard alone would decode it to the same frame.
    let canonical = postcard::to_allocvec(&Frame::Ping(1)).unwrap();
    let tag = canonical[0];
    assert!(tag < 0x80 && canonical[1] == 1 && canonical.len() == 2);
    for body in [vec![tag | 0x80, 0x00, 0x01], vec![tag, 0x81, 0x00], vec![tag, 0x81, 0x80, 0x00]] {
        assert_eq!(postcard::from_bytes::<Frame>(&body).unwrap(), Frame::Ping(1));
        let mut buf = (body.len() as u32).to_be_bytes().to_vec();
        buf.extend_from_slice(&body);
        assert!(
            matches!(decode(&buf, 1024), Err(WireError::Malformed(ref m)) if m.contains("non-canonical")),
            "{body:?}: {:?}",
            decode(&buf, 1024)
        );
    }
    // A non-canonical length of a byte string, inside a larger frame.
    let f = Frame::Swim(vec![9; 3]);
    let good = postcard::to_allocvec(&f).unwrap();
    assert_eq!(good[1], 3);
    let mut bad = vec![good[0], 0x83, 0x00];
    bad.extend_from_slice(&good[2..]);
    assert_eq!(postcard::from_bytes::<Frame>(&bad).unwrap(), f);
    let mut buf = (bad.len() as u32).to_be_bytes().to_vec();
    buf.extend_from_slice(&bad);
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
        if let Ok(Some((frame, used))) = decode(&bytes, 4096) {
            prop_assert!(used > 0 && used <= bytes.len());
            // Byte-exact: the frame re-encodes to the bytes it came from.
            let mut again = Vec::new();
            encode(&frame, &mut again, 4096).unwrap();
            prop_assert_eq!(&again[..], &bytes[..used]);
        }
    }

    /// Every message frame round-trips.
    #[test]
    fn message_frames_round_trip(name in ".{0,20}", to: u64, ty: u64, req: u64, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
        for f in [
            Frame::Tell { to, ty, payload: payload.clone() },
            Frame::Ask { to, ty, req, payload: payload.clone() },
            Frame::Reply { req, payload: Some(payload.clone()) },
            Frame::Reply { req, payload: None },
            Frame::Lookup { req, name: name.clone() },
            Frame::Found { req, actor: Some((to, name.clone())) },
            Frame::Stopped { id: to, reason: name.clone() },
            Frame::Credit { to, bytes: ty },
            Frame::Blocked { to },
            Frame::Group { name: name.clone(), ty, members: vec![to, req, ty] },
            Frame::Group { name: name.clone(), ty, members: vec![] },
            Frame::Exit { to, from: Some(req), reason: name.clone() },
            Frame::Exit { to, from: None, reason: name.clone() },
        ] {
            let mut buf = Vec::new();
            encode(&f, &mut buf, DEFAULT_MAX_FRAME).unwrap();
            prop_assert_eq!(decode(&buf, DEFAULT_MAX_FRAME).unwrap(), Some((f, buf.len())));
        }
    }

    /// `decode_in_place` gives the same answer as `decode`.
    #[test]
    fn decoding_in_place_agrees_with_decode(bytes in proptest::collection::vec(any::<u8>(), 0..64), tag in 0u8..18) {
        // Bodies that start with a real variant tag, so Tell and Ask
        // bodies of every shape (short, trailing, non-canonical) are met.
        let mut buf = ((bytes.len() + 1) as u32).to_be_bytes().to_vec();
        buf.push(tag);
        buf.extend_from_slice(&bytes);
        let full = decode(&buf, 4096);
        let in_place = decode_in_place(&buf, 4096);
        match (&full, &in_place) {
            (Ok(Some((f, n))), Ok(Some((d, m)))) => {
                prop_assert_eq!(n, m);
                let same = match (d, f) {
                    (Decoded::Message(m), Frame::Tell { to, ty, payload }) => m == &MessageRef { to: *to, ty: *ty, req: None, payload },
                    (Decoded::Message(m), Frame::Ask { to, ty, req, payload }) => m == &MessageRef { to: *to, ty: *ty, req: Some(*req), payload },
                    (Decoded::Other(o), f) => o == f,
                    _ => false,
                };
                prop_assert!(same, "{:?} vs {:?}", d, f);
            }
            (Ok(None), Ok(None)) | (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "decode {:?}, in place {:?}", full, in_place),
        }
    }

    /// Arbitrary bytes never panic the segment opener.
    #[test]
    fn arbitrary_segments_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Unsealer::new([0; 32], 4096).open(&mut bytes.clone());
    }
}
