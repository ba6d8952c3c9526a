//! The link state machine without sockets: handshakes between two links,
//! sealed segments, acknowledgements, in-doubt counts, closing.

use super::*;

const MAX: usize = ringmail_wire::frame::DEFAULT_MAX_FRAME;

fn id(name: &str, secret: &[u8]) -> Identity {
    Identity::new(name, 7, secret)
}

fn link(id: u64, dialled: bool) -> Link {
    let addr: Option<SocketAddr> = dialled.then(|| "127.0.0.1:9".parse().unwrap());
    Link::new(id, ConnId(id), addr, Instant::now(), 1 << 20, Arc::new(|| {}))
}

/// Feeds `bytes` to `to` and hands every unit to the handshake (as the
/// node does before the link is up); returns what `to` writes back and
/// whether it got established.
fn feed_handshake(
    to: &mut Link,
    me: &Identity,
    bytes: &[u8],
) -> Result<(Vec<u8>, Option<Peer>), String> {
    assert!(to.receive(bytes, Instant::now()));
    let mut out = Vec::new();
    let mut peer = None;
    while let Some(unit) = to.next_input()? {
        let Unit::Handshake(f) = unit else { panic!("a segment during the handshake") };
        match to.on_handshake(me.clone(), f, MAX)? {
            Step::Welcome(w) => out.extend(w.expect("a Welcome encodes")),
            Step::Established { confirm, peer: p } => {
                out.extend(confirm.unwrap_or_default());
                peer = Some(p);
            }
        }
    }
    Ok((out, peer))
}

/// A dialler `a` and a listener `b`, back to back in memory, with the
/// handshake done.
fn pair() -> (Link, Link) {
    let (ia, ib) = (id("a", b"s3cret"), id("b", b"s3cret"));
    let (mut a, mut b) = (link(1, true), link(2, false));
    let hello = a.start_dialling(ia.clone()).unwrap().expect("a Hello encodes");
    let (welcome, none) = feed_handshake(&mut b, &ib, &hello).unwrap();
    assert!(none.is_none() && b.in_handshake(), "the listener waits for Confirm");
    let (confirm, peer_of_a) = feed_handshake(&mut a, &ia, &welcome).unwrap();
    assert_eq!(peer_of_a, Some(Peer { name: "b".into(), incarnation: 7 }));
    let (nothing, peer_of_b) = feed_handshake(&mut b, &ib, &confirm).unwrap();
    assert!(nothing.is_empty());
    assert_eq!(peer_of_b, Some(Peer { name: "a".into(), incarnation: 7 }));
    (a, b)
}

/// Every frame of every segment that `to` can open from `bytes`.
fn frames_of(to: &mut Link, bytes: &[u8]) -> Result<Vec<Frame>, String> {
    to.receive(bytes, Instant::now());
    let mut frames = Vec::new();
    while let Some(unit) = to.next_input()? {
        let Unit::Segment(range) = unit else { panic!("a handshake frame when up") };
        let input = to.lend_input();
        let payload = input[range].to_vec();
        to.return_input(input);
        let mut at = 0;
        while let Some((f, n)) = frame::decode(&payload[at..], MAX).unwrap() {
            frames.push(f);
            at += n;
        }
        assert_eq!(at, payload.len(), "a segment holds whole frames");
    }
    Ok(frames)
}

fn tell(n: usize) -> Frame {
    Frame::Tell { to: 3, ty: 4, payload: vec![0x5a; n] }
}

#[test]
fn back_to_back_links_handshake_and_exchange_sealed_frames_both_ways() {
    let (mut a, mut b) = pair();
    assert!(a.is_up() && b.is_up());
    assert_eq!(a.peer, Some(("b".to_string(), 7)));
    assert_eq!(b.peer, Some(("a".to_string(), 7)));
    // Dialler -> listener: two frames in one segment.
    assert!(a.queue(&tell(10), MAX).unwrap().is_none());
    assert!(a.queue(&Frame::Ping(3), MAX).unwrap().is_none());
    let seg = a.take_segment().expect("two frames pending");
    assert!(a.take_segment().is_none(), "nothing left pending");
    assert_eq!(frames_of(&mut b, &seg).unwrap(), vec![tell(10), Frame::Ping(3)]);
    // Listener -> dialler, then a second segment each way (numbers
    // count up per direction).
    b.queue(&Frame::Lookup { req: 1, name: "x".into() }, MAX).unwrap();
    let back = b.take_segment().unwrap();
    assert_eq!(frames_of(&mut a, &back).unwrap(), vec![Frame::Lookup { req: 1, name: "x".into() }]);
    a.queue(&Frame::Pong(9), MAX).unwrap();
    let seg2 = a.take_segment().unwrap();
    assert_eq!(frames_of(&mut b, &seg2).unwrap(), vec![Frame::Pong(9)]);
    // Replaying the first segment fails: its number is stale.
    assert_eq!(frames_of(&mut b, &seg).unwrap_err(), WireError::BadMac.to_string());
}

#[test]
fn a_wrong_secret_fails_the_handshake_and_closes_the_link() {
    let (ia, ib) = (id("a", b"right"), id("b", b"wrong"));
    let (mut a, mut b) = (link(1, true), link(2, false));
    let hello = a.start_dialling(ia.clone()).unwrap().unwrap();
    // The listener cannot open the dialler's Hello: it answers nothing.
    let err = feed_handshake(&mut b, &ib, &hello).unwrap_err();
    // The very text the node logs and closes the connection with.
    assert_eq!(err, "authentication failed (another cluster secret, or bytes altered on the way)");
    assert_eq!(err, WireError::BadMac.to_string());
    assert!(b.is_closed() && b.peer.is_none());
    assert!(!b.is_finished(), "the node must still close the connection");
    assert!(!b.receive(b"more", Instant::now()), "a closed link reads nothing");
    assert_eq!(b.next_input(), Ok(None));
    // A listener with the right secret fails alike on a Confirm it
    // cannot open.
    let (mut a2, mut b2) = (link(3, true), link(4, false));
    let hello = a2.start_dialling(id("a", b"right")).unwrap().unwrap();
    let (welcome, _) = feed_handshake(&mut b2, &id("b", b"right"), &hello).unwrap();
    assert!(!welcome.is_empty());
    let mut sealed = Vec::new();
    Sealer::new([1; 32]).seal(b"ringmail confirm", &mut sealed);
    let forged = plain(&Frame::Confirm { sealed }).unwrap();
    let err = feed_handshake(&mut b2, &id("b", b"right"), &forged).unwrap_err();
    assert_eq!(err, WireError::BadMac.to_string());
    assert!(b2.is_closed() && b2.peer.is_none());
}

#[test]
fn input_arriving_one_byte_at_a_time_parses_the_same() {
    let (ia, ib) = (id("a", b"k"), id("b", b"k"));
    let (mut a, mut b) = (link(1, true), link(2, false));
    let hello = a.start_dialling(ia.clone()).unwrap().unwrap();
    // The Hello, a byte at a time: nothing until the last byte.
    let mut welcome = Vec::new();
    for (i, byte) in hello.iter().enumerate() {
        let (out, peer) = feed_handshake(&mut b, &ib, std::slice::from_ref(byte)).unwrap();
        assert!(peer.is_none());
        assert_eq!(out.is_empty(), i + 1 < hello.len(), "answered only when whole");
        welcome.extend(out);
    }
    let (confirm, _) = feed_handshake(&mut a, &ia, &welcome).unwrap();
    let mut established = None;
    for byte in &confirm {
        let (_, peer) = feed_handshake(&mut b, &ib, std::slice::from_ref(byte)).unwrap();
        established = established.or(peer);
    }
    assert_eq!(established, Some(Peer { name: "a".into(), incarnation: 7 }));
    // Two sealed segments, a byte at a time: the same frames in order.
    a.queue(&tell(100), MAX).unwrap();
    let mut wire = a.take_segment().unwrap();
    a.queue(&Frame::Ping(1), MAX).unwrap();
    a.queue(&tell(3), MAX).unwrap();
    wire.extend(a.take_segment().unwrap());
    let mut got = Vec::new();
    for byte in &wire {
        got.extend(frames_of(&mut b, std::slice::from_ref(byte)).unwrap());
    }
    assert_eq!(got, vec![tell(100), Frame::Ping(1), tell(3)]);
}

#[test]
fn queueing_past_max_frame_seals_the_pending_frames_first() {
    let (mut a, mut b) = pair();
    let mut one = Vec::new();
    frame::encode(&tell(100), &mut one, MAX).unwrap();
    let max = 3 * one.len() + 10; // three frames fit, four do not
    let mut wire = Vec::new();
    let mut sealed = Vec::new();
    for _ in 0..7 {
        if let Some(seg) = a.queue(&tell(100), max).unwrap() {
            sealed.push(seg.len());
            wire.extend(seg);
        }
    }
    // Frames 4 and 7 did not fit: twice three frames left, one waits.
    assert_eq!(sealed, vec![3 * one.len() + SEGMENT_OVERHEAD; 2]);
    let last = a.take_segment().unwrap();
    assert_eq!(last.len(), one.len() + SEGMENT_OVERHEAD);
    wire.extend(last);
    assert_eq!(frames_of(&mut b, &wire).unwrap(), vec![tell(100); 7]);
    // A frame over max_frame by itself is refused, and queues nothing.
    assert!(matches!(a.queue(&tell(max), max), Err(QueueError::Frame(_))));
    assert!(a.take_segment().is_none());
}

#[test]
fn a_large_encoded_frame_is_sealed_alone_behind_the_pending_ones() {
    let (mut a, mut b) = pair();
    let enc = |f: &Frame| Encoded::frame(f, MAX).unwrap();
    // Small ones join the pending segment.
    assert_eq!(a.queue_encoded(enc(&tell(10)), MAX).unwrap(), [None, None]);
    assert_eq!(a.queue_encoded(enc(&Frame::Ping(2)), MAX).unwrap(), [None, None]);
    // A large one: what was pending first, then the large one on its own,
    // sealed in the buffer it was encoded in.
    let big = tell(ALONE);
    let [first, second] = a.queue_encoded(enc(&big), MAX).unwrap();
    let (first, second) = (first.expect("the pending frames"), second.expect("the large one"));
    assert_eq!(second.len(), enc(&big).bytes().len() + SEGMENT_OVERHEAD);
    // Nothing pending: a large one alone is one segment.
    let [none, third] = a.queue_encoded(enc(&big), MAX).unwrap();
    assert!(none.is_none());
    // Behind it, small ones batch again, and the peer reads all in order.
    a.queue_encoded(enc(&tell(3)), MAX).unwrap();
    a.queue(&Frame::Pong(4), MAX).unwrap();
    let last = a.take_segment().unwrap();
    let wire = [first, second, third.unwrap(), last].concat();
    assert_eq!(
        frames_of(&mut b, &wire).unwrap(),
        vec![tell(10), Frame::Ping(2), big.clone(), big, tell(3), Frame::Pong(4)]
    );
    // Small ones past max_frame seal what was pending first, as `queue`.
    let one = enc(&tell(100)).bytes().len();
    let max = 2 * one + 1;
    assert_eq!(a.queue_encoded(enc(&tell(100)), max).unwrap(), [None, None]);
    assert_eq!(a.queue_encoded(enc(&tell(100)), max).unwrap(), [None, None]);
    let [full, none] = a.queue_encoded(enc(&tell(100)), max).unwrap();
    assert!(none.is_none());
    let wire = [full.unwrap(), a.take_segment().unwrap()].concat();
    assert_eq!(frames_of(&mut b, &wire).unwrap(), vec![tell(100); 3]);
    // Only on a link that is up.
    let mut fresh = link(9, false);
    assert!(matches!(fresh.queue_encoded(enc(&Frame::Ping(1)), MAX), Err(QueueError::NotUp)));
}

#[test]
fn a_handshake_frame_on_an_established_link_is_an_error() {
    let (mut a, _b) = pair();
    let f = Frame::Confirm { sealed: Vec::new() };
    let err = a.on_handshake(id("a", b"s3cret"), f, MAX).unwrap_err();
    assert_eq!(err, "unexpected frame: a handshake frame after the handshake");
    assert!(a.is_up(), "the link stays as it was (the node closes it)");
    // Frames are queued only on a link that is up.
    let mut fresh = link(9, false);
    assert!(matches!(fresh.queue(&Frame::Ping(1), MAX), Err(QueueError::NotUp)));
}

#[test]
fn a_tampered_segment_is_an_error() {
    let (mut a, mut b) = pair();
    a.queue(&tell(20), MAX).unwrap();
    let mut seg = a.take_segment().unwrap();
    seg[10] ^= 0x01;
    assert_eq!(frames_of(&mut b, &seg).unwrap_err(), WireError::BadMac.to_string());
    // An oversize announced length is refused before the bytes arrive.
    let (_, mut b2) = pair();
    let huge = (u32::MAX).to_be_bytes();
    let err = frames_of(&mut b2, &huge).unwrap_err();
    assert_eq!(err, WireError::TooLarge { len: u32::MAX as usize, max: MAX }.to_string());
    // Before the handshake, frames over 1 KiB are refused.
    let mut fresh = link(9, false);
    fresh.receive(&2000u32.to_be_bytes(), Instant::now());
    assert_eq!(
        fresh.next_input().unwrap_err(),
        WireError::TooLarge { len: 2000, max: MAX_HANDSHAKE_FRAME }.to_string()
    );
}

#[test]
fn in_doubt_is_sent_minus_acknowledged_and_slots_come_back() {
    let (mut a, _b) = pair();
    let cell = Arc::new(ActorCell::new(77, 3));
    for _ in 0..3 {
        assert!(cell.reserve());
        a.sent_for(77, cell.clone());
    }
    assert!(!cell.reserve(), "the stand-in's three slots are held");
    assert_eq!(a.in_doubt(), 3);
    a.on_ack(2);
    assert_eq!(a.in_doubt(), 1);
    a.on_ack(1); // acknowledgements never go back
    assert_eq!(a.in_doubt(), 1);
    a.on_ack(5); // more than was sent: nothing in doubt, no underflow
    assert_eq!(a.in_doubt(), 0);
    assert!(a.holds_slots());
    a.release_owed();
    assert!(!a.holds_slots());
    assert!(cell.reserve() && cell.reserve() && cell.reserve() && !cell.reserve());
    // Acknowledgements owed to the peer.
    assert!(!a.ack_due());
    a.count_received();
    a.count_received();
    assert!(a.ack_due());
    assert_eq!(a.take_ack(), 2);
    assert!(!a.ack_due());
    // Replies owed.
    a.owe_reply();
    assert!(a.owes_replies());
    a.reply_written();
    a.reply_written(); // never below zero
    assert!(!a.owes_replies());
}

#[test]
fn closing_seals_what_was_pending_and_is_final() {
    let (mut a, mut b) = pair();
    a.queue(&Frame::Ping(4), MAX).unwrap();
    let last = a.close().expect("the pending frame leaves ahead of the FIN");
    assert!(a.is_closed());
    assert!(matches!(a.queue(&Frame::Ping(5), MAX), Err(QueueError::NotUp)));
    assert!(a.close().is_none());
    assert_eq!(frames_of(&mut b, &last).unwrap(), vec![Frame::Ping(4)]);
    b.lost();
    assert!(b.is_closed() && !b.receive(b"x", Instant::now()));
}

/// Every frame opened after `bytes` arrive as an owned buffer.
fn frames_of_owned(to: &mut Link, bytes: &[u8]) -> Result<Vec<Frame>, String> {
    assert!(to.receive_owned(bytes::Bytes::copy_from_slice(bytes), Instant::now()));
    frames_of(to, &[])
}

#[test]
fn input_taken_as_owned_buffers_opens_the_same_frames_however_it_is_cut() {
    let (mut a, mut b) = pair();
    let mut stream = Vec::new();
    let mut want = Vec::new();
    for k in 0..6 {
        let f = tell(100 + k * 3000);
        a.queue(&f, MAX).unwrap();
        want.push(f);
        stream.extend(a.take_segment().unwrap());
    }
    // Cut at every kind of place: on segment boundaries (the buffer is
    // kept), inside a length prefix, inside a payload; owned and borrowed
    // buffers in turn.
    let mut got = Vec::new();
    let cuts = [1, 7, 300, 5000, 2, 9000, stream.len()];
    let mut at = 0;
    for (i, &n) in cuts.iter().enumerate() {
        let end = (at + n).min(stream.len());
        let piece = &stream[at..end];
        got.extend(if i % 2 == 0 {
            frames_of_owned(&mut b, piece).unwrap()
        } else {
            frames_of(&mut b, piece).unwrap()
        });
        at = end;
    }
    assert_eq!(at, stream.len());
    assert_eq!(got, want);
    // Whole segments, each as its own owned buffer.
    for k in 0..3 {
        a.queue(&tell(k), MAX).unwrap();
        let seg = a.take_segment().unwrap();
        assert_eq!(frames_of_owned(&mut b, &seg).unwrap(), vec![tell(k)]);
    }
    // A closed link takes nothing.
    let _ = b.close();
    assert!(!b.receive_owned(bytes::Bytes::from_static(b"x"), Instant::now()));
}
