//! One connection to a peer, as a state machine with no I/O.
//!
//! A [`Link`] is everything the node knows about one TCP connection: where
//! it is in the handshake, the session keys once it is authenticated, the
//! bytes received and not yet parsed, the frames written this turn and not
//! yet sealed, and the counters of the delivery guarantees (messages sent,
//! acknowledged by the peer, received, acknowledged to the peer, replies
//! owed). It never touches a socket, the node's connection table, an
//! actor's context or the node's maps: bytes come in through
//! [`Link::receive`] and are pulled out one unit at a time with
//! [`Link::next_input`]; what is to be written comes back as byte vectors
//! from [`Link::start_dialling`], [`Link::on_handshake`], [`Link::queue`],
//! [`Link::take_segment`] and [`Link::close`], and the node writes each to
//! the connection as it gets it. So every state and every byte sequence
//! can be tested without a socket (see the tests below).
//!
//! # States
//!
//! ```text
//! (input / what is written)
//! inbound:  AwaitHello --Hello / Welcome--> AwaitConfirm --Confirm / nothing--> Up
//! outbound: AwaitHello --start_dialling / Hello--> AwaitWelcome --Welcome / Confirm--> Up
//! any:      --close, lost, or a failed handshake step--> Closed
//! ```
//!
//! Invariants:
//!
//! * Until the link is `Up`, only handshake frames of at most
//!   [`MAX_HANDSHAKE_FRAME`] bytes are parsed; after it, only sealed
//!   segments (checked against the session key and the segment number).
//! * A handshake step that fails leaves the link `Closed` (as the node has
//!   always done: the node then counts and logs the failure, and its
//!   `close` finds the link closed already, so the socket is left for the
//!   peer to close); a handshake frame on a link that is `Up` is an error
//!   and leaves it `Up`.
//! * Frames are queued only on an `Up` link. The pending segment never
//!   outgrows `max_frame`: a frame that would make it do so first seals
//!   what was pending, which is handed back to be written at once.
//! * `Closed` is final: nothing more is parsed or queued.
//! * `peer` is set exactly when the handshake completed.
//! * What is *in doubt* is what was sent and not acknowledged:
//!   `sent - acked` (acknowledgements only ever grow).
//! * The credit windows (`remote::window`) live and die with the link: a
//!   new link starts with full windows on both sides, and what waits for
//!   credit when the link is lost was never sent (a dead letter, see
//!   [`Held`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ringmail_wire::frame::{
    self, Encoded, Frame, Sealer, Unsealer, SEGMENT_HEADER, SEGMENT_OVERHEAD,
};
use ringmail_wire::handshake::{Identity, Initiator, Peer, Responder, Session};
use ringmail_wire::WireError;

use super::window::{RecvWindows, SendWindows};
use crate::net::ConnId;
use crate::runtime::cell::ActorCell;

/// Largest frame read before a connection is authenticated.
pub(crate) const MAX_HANDSHAKE_FRAME: usize = 1024;

/// An encoded frame of at least this many bytes is sealed as a segment of
/// its own, in the buffer it was encoded in, instead of being copied into
/// the pending batch: past a few kilobytes the copy costs more than the
/// segment's 20 bytes and one more seal call.
pub(crate) const ALONE: usize = 16 << 10;

/// Where a link is in its life.
enum State {
    /// Inbound, waiting for `Hello`.
    AwaitHello,
    /// Outbound, `Hello` sent.
    AwaitWelcome(Box<Initiator>),
    /// Inbound, `Welcome` sent.
    AwaitConfirm(Responder),
    /// Authenticated.
    /// (The AES key schedules are a kilobyte each: boxed, so a link in
    /// any other state is small.)
    Up { sealer: Box<Sealer>, unsealer: Box<Unsealer> },
    /// Closing; nothing more is read.
    Closed,
}

/// One unit of input, pulled from the received bytes by
/// [`Link::next_input`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// A handshake frame (the link is not up yet).
    Handshake(Frame),
    /// An opened (authenticated) segment: where its payload (frames,
    /// encoded) lies in the link's input, decrypted in place. Read it with
    /// [`Link::lend_input`].
    Segment(std::ops::Range<usize>),
}

/// What a handshake frame led to (see [`Link::on_handshake`]).
#[derive(Debug)]
pub(crate) enum Step {
    /// Inbound: the `Welcome` to write (and send at once); the peer is not
    /// authenticated yet. `None` if it did not encode (then nothing is
    /// written and the handshake times out).
    Welcome(Option<Vec<u8>>),
    /// The peer is authenticated and the link is up. Outbound: the
    /// `Confirm` to write first.
    Established {
        /// The initiator's `Confirm`, encoded.
        confirm: Option<Vec<u8>>,
        /// Who is at the other end.
        peer: Peer,
    },
}

/// Why a frame was not queued.
#[derive(Debug)]
pub(crate) enum QueueError {
    /// The link is not up (in handshake or closed).
    NotUp,
    /// The frame does not encode within `max_frame`.
    Frame(WireError),
}

/// A handshake frame, encoded (`None` if it does not fit
/// [`MAX_HANDSHAKE_FRAME`]).
fn plain(f: &Frame) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    frame::encode(f, &mut buf, MAX_HANDSHAKE_FRAME).ok().map(|()| buf)
}

/// One connection's state (see the module docs).
pub(crate) struct Link {
    /// The node's number for it.
    pub(crate) id: u64,
    /// Its connection in the node's connection table.
    pub(crate) conn: ConnId,
    state: State,
    /// Closed by the node or lost by the peer (see [`Link::is_finished`]).
    finished: bool,
    /// We dialled it (at this address).
    pub(crate) dialled: Option<SocketAddr>,
    /// Received, not yet parsed (from `inpos` on).
    inbuf: Vec<u8>,
    /// Bytes of `inbuf` already parsed.
    inpos: usize,
    /// `inbuf` is lent out ([`Link::lend_input`]).
    lent: bool,
    /// Encoded frames for the next sealed segment.
    pending: Vec<u8>,
    /// When it was made (the handshake deadline counts from here).
    pub(crate) since: Instant,
    /// When the handshake completed (`None` before, or once closed).
    pub(crate) up_at: Option<Instant>,
    /// It stayed up long enough to count as a successful dial (its dial's
    /// backoff starts over): see `node::upkeep::SETTLED_AFTER`.
    pub(crate) settled: bool,
    /// When bytes last arrived.
    pub(crate) last_rx: Instant,
    /// The authenticated peer: (name, incarnation).
    pub(crate) peer: Option<(String, u64)>,
    /// The peer's listen address (from its `Listening`).
    pub(crate) peer_listen: Option<SocketAddr>,
    /// Actor messages sent on it.
    sent: u64,
    /// The most the peer acknowledged having received.
    acked: u64,
    /// Actor messages received on it.
    received: u64,
    /// The `received` count last acknowledged to the peer.
    acked_out: u64,
    /// Asks that came on this link whose replies are not written yet.
    owed_replies: u64,
    /// Capacity slots of stand-ins whose messages are queued on this link,
    /// released once the link's unsent bytes are under the node's high
    /// water mark.
    owed: rustc_hash::FxHashMap<u64, (Arc<ActorCell>, usize)>, // per message
    /// Messages to the peer's actors, by credit window: what waits for
    /// credit (`remote::window`).
    pub(crate) out: SendWindows<Held>,
    /// Messages from the peer, by credit window: what its actors owe it.
    pub(crate) inw: RecvWindows,
}

/// A framed message for a peer's actor, waiting for credit (or about to
/// leave). It holds its stand-in's capacity slot; dropped unsent (its link
/// was lost), it gives the slot back and counts as a dead letter.
pub(crate) struct Held {
    /// The frame, encoded (empty once queued).
    pub(crate) frame: Encoded,
    /// Its target (on the peer) and its cost against the target's window.
    pub(crate) to: u64,
    pub(crate) cost: u64,
    /// The stand-in it came from.
    pub(crate) proxy: u64,
    /// The ask's request id, if it is one.
    pub(crate) req: Option<u64>,
    stand_in: Option<Arc<ActorCell>>,
    /// An `Exit` frame rather than a message.
    exit: bool,
    /// An exit that left (it has no slot to mark that).
    pub(crate) sent: bool,
}

impl Held {
    pub(crate) fn new(
        frame: Encoded,
        (to, cost): (u64, u64),
        proxy: u64,
        req: Option<u64>,
        stand_in: Arc<ActorCell>,
    ) -> Held {
        Held { frame, to, cost, proxy, req, stand_in: Some(stand_in), exit: false, sent: false }
    }

    /// An exit for target `to` (a stop through a reference, or a linked
    /// actor's failure): no cost and no slot, but in line with the
    /// messages held for the same target, behind them.
    pub(crate) fn exit(frame: Encoded, to: u64, proxy: u64) -> Held {
        Held { frame, to, cost: 0, proxy, req: None, stand_in: None, exit: true, sent: false }
    }

    /// True for an exit ([`Held::exit`]).
    pub(crate) fn is_exit(&self) -> bool {
        self.exit
    }

    /// The stand-in's capacity slot, now the caller's to release.
    pub(crate) fn take_slot(&mut self) -> Arc<ActorCell> {
        self.stand_in.take().expect("a held message leaves once")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(s) = self.stand_in.take() {
            s.unreserve();
            crate::runtime::dead_letter();
        } else if self.is_exit() && !self.sent {
            // Its link closed first: counted as a message would be.
            crate::runtime::dead_letter();
        }
    }
}

impl Link {
    /// A new link, waiting for a `Hello` (inbound, `dialled` is `None`) or
    /// about to send one ([`Link::start_dialling`]).
    /// Its credit windows are `window` bytes per target actor; `wake` is
    /// called from any thread when credit is owed to the peer.
    pub(crate) fn new(
        id: u64,
        conn: ConnId,
        dialled: Option<SocketAddr>,
        now: Instant,
        window: u64,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> Link {
        Link {
            id,
            conn,
            state: State::AwaitHello,
            finished: false,
            dialled,
            inbuf: Vec::new(),
            inpos: 0,
            lent: false,
            pending: Vec::new(),
            since: now,
            up_at: None,
            settled: false,
            last_rx: now,
            peer: None,
            peer_listen: None,
            sent: 0,
            acked: 0,
            received: 0,
            acked_out: 0,
            owed_replies: 0,
            owed: Default::default(),
            out: SendWindows::new(window),
            inw: RecvWindows::new(window, wake),
        }
    }

    /// Closed: nothing more is read or queued.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// The connection was closed ([`Link::close`]) or lost
    /// ([`Link::lost`]). A failed handshake step leaves the link `Closed`
    /// (it reads nothing more) but not finished: the node must still close
    /// the connection.
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Authenticated and open.
    pub(crate) fn is_up(&self) -> bool {
        matches!(self.state, State::Up { .. })
    }

    /// Still in the handshake (neither up nor closed).
    pub(crate) fn in_handshake(&self) -> bool {
        !self.is_up() && !self.is_closed()
    }

    /// Starts the handshake as the dialler: the `Hello` to write. On an
    /// error the link stays as it was.
    pub(crate) fn start_dialling(&mut self, me: Identity) -> Result<Option<Vec<u8>>, WireError> {
        let (i, hello) = Initiator::start(me)?;
        self.state = State::AwaitWelcome(Box::new(i));
        Ok(plain(&hello))
    }

    /// Takes bytes that arrived; false (and nothing taken) once closed.
    pub(crate) fn receive(&mut self, bytes: &[u8], now: Instant) -> bool {
        if self.is_closed() || self.lent {
            debug_assert!(!self.lent, "bytes received while the input is lent out");
            return false;
        }
        self.last_rx = now;
        // What was parsed is dropped when that is free (all of it was), or
        // when the buffer would otherwise grow: not after every segment, so
        // a large segment's remainder is not moved to the front again and
        // again.
        if self.inpos == self.inbuf.len() {
            self.inbuf.clear();
            self.inpos = 0;
        } else if self.inpos > 0 && self.inbuf.capacity() - self.inbuf.len() < bytes.len() {
            self.compact();
        }
        self.inbuf.extend_from_slice(bytes);
        true
    }

    /// Takes bytes that arrived, as [`Link::receive`] does, keeping the
    /// buffer itself as the input when everything before it was parsed
    /// (the common case: a receive that ends on a segment boundary), so
    /// its bytes are decrypted where they arrived instead of copied first.
    pub(crate) fn receive_owned(&mut self, bytes: bytes::Bytes, now: Instant) -> bool {
        if self.inpos == self.inbuf.len() && !self.is_closed() && !self.lent {
            self.last_rx = now;
            // No copy when `bytes` is the only owner of its buffer (a
            // receive's own); a shared one is copied, as `receive` would.
            self.inbuf = Vec::from(bytes);
            self.inpos = 0;
            return true;
        }
        self.receive(&bytes, now)
    }

    /// Lends the input buffer out, so an opened segment
    /// ([`Unit::Segment`]) is read where it was decrypted while the node
    /// acts on its frames; give it back with [`Link::return_input`].
    /// Meanwhile nothing is received or parsed.
    pub(crate) fn lend_input(&mut self) -> Vec<u8> {
        self.lent = true;
        std::mem::take(&mut self.inbuf)
    }

    /// Takes the input buffer back (dropped if the link closed meanwhile).
    pub(crate) fn return_input(&mut self, input: Vec<u8>) {
        self.lent = false;
        if !self.is_closed() {
            self.inbuf = input;
        } else {
            self.inpos = 0;
        }
    }

    /// The next unit of input: a handshake frame while in the handshake,
    /// an opened segment's payload once up; `Ok(None)` when more bytes are
    /// needed or the link is closed. Pull one, act on it, pull the next:
    /// acting may change the state (a handshake completes, the link
    /// closes), and the next unit is parsed in the new state.
    pub(crate) fn next_input(&mut self) -> Result<Option<Unit>, String> {
        if self.lent {
            debug_assert!(false, "input parsed while it is lent out");
            return Ok(None);
        }
        let at = self.inpos;
        let buf = &mut self.inbuf[at..];
        let parsed = match &mut self.state {
            State::Up { unsealer, .. } => match unsealer.open(buf) {
                Ok(Some((payload, n))) => {
                    let start = at + SEGMENT_HEADER;
                    Ok(Some((Unit::Segment(start..start + payload.len()), n)))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            },
            State::Closed => Ok(None),
            _ => match frame::decode(buf, MAX_HANDSHAKE_FRAME) {
                Ok(Some((f, n))) => Ok(Some((Unit::Handshake(f), n))),
                Ok(None) => Ok(None),
                Err(e) => Err(e.to_string()),
            },
        };
        let (unit, n) = match parsed? {
            Some(parsed) => parsed,
            None => return Ok(None),
        };
        self.inpos += n;
        Ok(Some(unit))
    }

    /// Drops the bytes already parsed.
    fn compact(&mut self) {
        self.inbuf.drain(..self.inpos.min(self.inbuf.len()));
        self.inpos = 0;
    }

    /// Takes a handshake frame: `Hello` -> `Welcome`; `Welcome` -> `Confirm`
    /// and up; `Confirm` -> up. An error leaves the link `Closed`; a
    /// handshake frame on a link that is up is an error that leaves it up.
    pub(crate) fn on_handshake(
        &mut self,
        me: Identity,
        f: Frame,
        max_frame: usize,
    ) -> Result<Step, String> {
        let state = std::mem::replace(&mut self.state, State::Closed);
        match state {
            State::AwaitHello => {
                let (r, welcome) = Responder::on_hello(me, f).map_err(|e| e.to_string())?;
                self.state = State::AwaitConfirm(r);
                Ok(Step::Welcome(plain(&welcome)))
            }
            State::AwaitWelcome(i) => {
                let (confirm, peer, session) = i.on_welcome(f).map_err(|e| e.to_string())?;
                self.up(session, max_frame, &peer);
                Ok(Step::Established { confirm: plain(&confirm), peer })
            }
            State::AwaitConfirm(r) => {
                let (peer, session) = r.on_confirm(f).map_err(|e| e.to_string())?;
                self.up(session, max_frame, &peer);
                Ok(Step::Established { confirm: None, peer })
            }
            other => {
                self.state = other;
                Err(WireError::Unexpected("a handshake frame after the handshake").to_string())
            }
        }
    }

    fn up(&mut self, session: Session, max_frame: usize, peer: &Peer) {
        let (sealer, unsealer) = session.split(max_frame);
        self.state = State::Up { sealer: Box::new(sealer), unsealer: Box::new(unsealer) };
        self.up_at = Some(Instant::now());
        self.peer = Some((peer.name.clone(), peer.incarnation));
    }

    /// Queues a frame for the next sealed segment. When the segment would
    /// outgrow `max_frame`, what was pending is sealed first and returned,
    /// to be written now; the frame starts the next segment.
    pub(crate) fn queue(
        &mut self,
        f: &Frame,
        max_frame: usize,
    ) -> Result<Option<Vec<u8>>, QueueError> {
        let State::Up { sealer, .. } = &mut self.state else { return Err(QueueError::NotUp) };
        if self.pending.is_empty() {
            self.pending.extend_from_slice(&[0; SEGMENT_HEADER]);
        }
        let before = self.pending.len();
        frame::encode(f, &mut self.pending, max_frame.saturating_sub(4))
            .map_err(QueueError::Frame)?;
        if self.pending.len() - SEGMENT_HEADER <= max_frame {
            return Ok(None);
        }
        // Full: what was pending leaves as one segment now; the frame
        // starts the next one.
        let mut next = Vec::with_capacity(SEGMENT_OVERHEAD + self.pending.len() - before);
        next.extend_from_slice(&[0; SEGMENT_HEADER]);
        next.extend_from_slice(&self.pending[before..]);
        self.pending.truncate(before);
        let mut seg = std::mem::replace(&mut self.pending, next);
        sealer.seal_in_place(&mut seg);
        Ok(Some(seg))
    }

    /// Queues an encoded frame. A large one is sealed at once, on its own
    /// and where it was encoded (no copy), behind what was pending (sealed
    /// first); a small one joins the pending segment, which is sealed
    /// first if the frame would make it outgrow `max_frame`. Segments to
    /// write now come back in order.
    pub(crate) fn queue_encoded(
        &mut self,
        f: Encoded,
        max_frame: usize,
    ) -> Result<[Option<Vec<u8>>; 2], QueueError> {
        let State::Up { sealer, .. } = &mut self.state else { return Err(QueueError::NotUp) };
        let bytes = f.bytes();
        let pending = self.pending.len().saturating_sub(SEGMENT_HEADER);
        let seal_pending =
            pending > 0 && (bytes.len() >= ALONE || pending + bytes.len() > max_frame);
        let first = seal_pending.then(|| {
            let next = Vec::with_capacity(self.pending.len() + SEGMENT_OVERHEAD);
            let mut seg = std::mem::replace(&mut self.pending, next);
            sealer.seal_in_place(&mut seg);
            seg
        });
        if bytes.len() >= ALONE {
            return Ok([first, Some(sealer.seal_encoded(f))]);
        }
        if self.pending.is_empty() {
            self.pending.extend_from_slice(&[0; SEGMENT_HEADER]);
        }
        self.pending.extend_from_slice(bytes);
        Ok([first, None])
    }

    /// Seals the pending frames into one segment, to be written; `None`
    /// when nothing is pending (or the link is not up: then what was
    /// pending is dropped).
    pub(crate) fn take_segment(&mut self) -> Option<Vec<u8>> {
        if self.pending.len() <= SEGMENT_HEADER {
            self.pending.clear();
            return None;
        }
        let seg = match &mut self.state {
            State::Up { sealer, .. } => {
                // Sealed where the frames were encoded (no copy); the next
                // segment starts in a buffer the size of this one.
                let next = Vec::with_capacity(self.pending.len() + SEGMENT_OVERHEAD);
                let mut seg = std::mem::replace(&mut self.pending, next);
                sealer.seal_in_place(&mut seg);
                Some(seg)
            }
            _ => None,
        };
        self.pending.clear();
        seg
    }

    /// Closes the link. Returns the last segment (what this turn already
    /// framed), to be written ahead of the FIN so the peer reads it before
    /// it sees the connection end.
    pub(crate) fn close(&mut self) -> Option<Vec<u8>> {
        let last = self.take_segment();
        self.finished = true;
        self.state = State::Closed;
        self.up_at = None;
        self.inbuf = Vec::new();
        self.inpos = 0;
        last
    }

    /// The connection is gone (the peer closed it): the link is closed
    /// with nothing more to write.
    pub(crate) fn lost(&mut self) {
        self.finished = true;
        self.state = State::Closed;
        self.up_at = None;
    }

    /// A stand-in's message left on this link: it counts as sent (in doubt
    /// until the peer acknowledges it), and the stand-in's capacity slot is
    /// held until the link's backlog drains ([`Link::release_owed`]).
    pub(crate) fn sent_for(&mut self, proxy: u64, stand_in: Arc<ActorCell>) {
        self.sent += 1;
        self.owed.entry(proxy).or_insert((stand_in, 0)).1 += 1;
    }

    /// Counts an injected duplicate as sent (`crate::fault`).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn sent_copy(&mut self) {
        self.sent += 1;
    }

    /// The peer acknowledged having received `n` messages.
    pub(crate) fn on_ack(&mut self, n: u64) {
        self.acked = self.acked.max(n);
    }

    /// Messages sent that the peer did not acknowledge (yet).
    pub(crate) fn in_doubt(&self) -> u64 {
        self.sent.saturating_sub(self.acked)
    }

    /// An actor message arrived on this link.
    pub(crate) fn count_received(&mut self) {
        self.received += 1;
    }

    /// Messages arrived since the last acknowledgement to the peer.
    pub(crate) fn ack_due(&self) -> bool {
        self.received != self.acked_out
    }

    /// The count to acknowledge to the peer now (then no longer due).
    pub(crate) fn take_ack(&mut self) -> u64 {
        self.acked_out = self.received;
        self.received
    }

    /// An ask arrived on this link: its reply is owed.
    pub(crate) fn owe_reply(&mut self) {
        self.owed_replies += 1;
    }

    /// A reply owed on this link is being written.
    pub(crate) fn reply_written(&mut self) {
        self.owed_replies = self.owed_replies.saturating_sub(1);
    }

    /// Replies are still owed on this link.
    pub(crate) fn owes_replies(&self) -> bool {
        self.owed_replies > 0
    }

    /// Stand-ins' capacity slots are held by this link.
    pub(crate) fn holds_slots(&self) -> bool {
        !self.owed.is_empty()
    }

    /// Gives the stand-ins their capacity slots back.
    pub(crate) fn release_owed(&mut self) {
        for (_, (shared, n)) in self.owed.drain() {
            shared.unreserve_n(n);
        }
    }
}

#[cfg(test)]
mod tests;
