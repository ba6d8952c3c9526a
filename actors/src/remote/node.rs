//! The node's actor: owns the listening socket and every connection to a
//! peer, runs the handshake, seals and opens segments, and moves messages
//! between the wire and local actors (see the module docs of `remote`).

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringmail_transport::FixedFd;
use ringmail_wire::frame::{self, Frame, Sealer, Unsealer};
use ringmail_wire::handshake::{Identity, Initiator, Responder};
use ringmail_wire::WireError;

use super::codec::MsgCodec;
use super::swim::{Effect, Member, OwnedNotification, Swim, Timer};
use super::{LookupError, NodeEvent, NodeShared};
use crate::actor::{Actor, Context, FdHandler, Handler, Message};
use crate::error::StopReason;
use crate::io::Accept;
use crate::net::{ConnId, Connections, Input, NetEvent};
use crate::runtime::cell::ActorCell;
use crate::runtime::dead_letter;
use crate::runtime::envelope::{Body, Envelope, Erased, ReplyTo};
use crate::runtime::route::send_control;

/// How often the node sends acknowledgements and checks handshake
/// deadlines and redials.
pub(crate) const TICK: Duration = Duration::from_millis(50);
/// A retired duplicate connection closes after this long without input.
const RETIRE_AFTER: Duration = Duration::from_secs(1);
/// Largest frame read before a connection is authenticated.
const MAX_HANDSHAKE_FRAME: usize = 1024;

/// A message for a remote actor, from its stand-in.
pub(crate) struct Outbound {
    pub(crate) proxy: u64,
    /// The stand-in's shared state: its capacity slot is released by the
    /// handler, or by `Drop` if the node's actor never handles this.
    pub(crate) stand_in: Option<Arc<ActorCell>>,
    pub(crate) msg: Option<Box<dyn Erased>>,
}

impl Drop for Outbound {
    fn drop(&mut self) {
        if let Some(s) = self.stand_in.take() {
            s.unreserve(); // never handled (the node's actor is gone)
        }
    }
}
impl Message for Outbound {
    type Reply = ();
}

/// A stand-in was made: bind it to its peer and remote actor.
pub(crate) struct RegisterProxy {
    pub(crate) proxy: u64,
    pub(crate) peer: String,
    pub(crate) incarnation: u64,
    pub(crate) remote_id: u64,
}
impl Message for RegisterProxy {
    type Reply = ();
}

/// What a lookup found.
pub(crate) struct Found {
    /// The node it lives on.
    pub(crate) peer: String,
    pub(crate) id: u64,
    pub(crate) type_name: String,
    pub(crate) incarnation: u64,
}

/// Looks an actor up on a peer; the answer goes to `tx`.
pub(crate) struct LookupReq {
    pub(crate) peer: String,
    pub(crate) name: String,
    pub(crate) tx: mpsc::Sender<Result<Found, LookupError>>,
}
impl Message for LookupReq {
    type Reply = ();
}

/// The reply of a local actor to an ask from a peer.
struct SendReply {
    link: u64,
    req: u64,
    payload: Option<Vec<u8>>,
}
impl Message for SendReply {
    type Reply = ();
}

/// An exported actor that peers looked up stopped.
struct ExportStopped {
    id: u64,
    reason: String,
}
impl Message for ExportStopped {
    type Reply = ();
}

/// A dial finished (on a helper thread).
struct Dialed {
    addr: SocketAddr,
    result: std::io::Result<OwnedFd>,
}
impl Message for Dialed {
    type Reply = ();
}

/// An accepted connection (with its fd).
struct Inbound;

/// Drop the connection to a peer.
pub(crate) struct Disconnect(pub(crate) String);
impl Message for Disconnect {
    type Reply = ();
}

/// A membership (SWIM) timer came due.
struct SwimTimer(Timer<Member>);
impl Message for SwimTimer {
    type Reply = ();
}

/// The node's timer.
struct Tick;
impl Message for Tick {
    type Reply = ();
}

/// Seal and send what this turn of the loop wrote.
struct Flush;
impl Message for Flush {
    type Reply = ();
}

/// The multishot accept ended (errno).
struct Rearm(i32);
impl Message for Rearm {
    type Reply = ();
}

enum State {
    /// Inbound, waiting for `Hello`.
    AwaitHello,
    /// Outbound, `Hello` sent.
    AwaitWelcome(Initiator),
    /// Inbound, `Welcome` sent.
    AwaitConfirm(Responder),
    /// Authenticated.
    Up { sealer: Sealer, unsealer: Unsealer },
    /// Closing; nothing more is read.
    Closed,
}

struct Link {
    id: u64,
    conn: ConnId,
    state: State,
    /// We dialled it (at this address).
    dialled: Option<SocketAddr>,
    /// Received, not yet parsed.
    inbuf: Vec<u8>,
    /// Encoded frames for the next sealed segment.
    pending: Vec<u8>,
    since: Instant,
    /// When bytes last arrived.
    last_rx: Instant,
    peer: Option<(String, u64)>,
    /// The peer's listen address (from its `Listening`).
    peer_listen: Option<SocketAddr>,
    sent: u64,
    acked: u64,
    received: u64,
    /// The `received` count last acknowledged to the peer.
    acked_out: u64,
    /// Asks that came on this link whose replies are not written yet.
    owed_replies: u64,
    /// Capacity slots of stand-ins whose messages are queued on this link,
    /// released once the link's unsent bytes are under `HIGH_WATER`.
    owed: HashMap<u64, (Arc<ActorCell>, usize)>,
}

/// Unsent bytes on a link above which stand-ins keep their capacity slots
/// (so senders wait instead of queueing without bound).
const HIGH_WATER: usize = 4 << 20;

struct ProxyEntry {
    peer: String,
    incarnation: u64,
    remote_id: u64,
}

struct Dial {
    next: Instant,
    backoff: Duration,
    busy: bool,
    /// Dials in a row that did not end in an authenticated peer.
    failures: u32,
    /// A configured seed: dialled for as long as the node runs.
    seed: bool,
}

impl Dial {
    fn new(backoff: Duration, seed: bool) -> Dial {
        Dial { next: Instant::now(), backoff, busy: false, failures: 0, seed }
    }
}

/// An address that is neither a seed nor an active member's is forgotten
/// after this many failed dials in a row (about 11 s with the default
/// backoff).
const DIAL_GIVE_UP: u32 = 10;

/// The node's actor (one per [`super::Node`], on its own shard).
pub struct NodeActor {
    shared: Arc<NodeShared>,
    listener: TcpListener,
    conns: Connections,
    links: HashMap<u64, Link>,
    by_conn: HashMap<ConnId, u64>,
    /// Authenticated peers: name -> link.
    up: HashMap<String, u64>,
    proxies: HashMap<u64, ProxyEntry>,
    asks: HashMap<u64, (u64, ReplyTo, MsgCodec)>,
    lookups: HashMap<u64, (u64, mpsc::Sender<Result<Found, LookupError>>)>,
    /// Exported actor id -> links that looked it up.
    watchers: HashMap<u64, HashSet<u64>>,
    dials: HashMap<SocketAddr, Dial>,
    next_link: u64,
    next_req: u64,
    flush_queued: bool,
    me: Option<crate::ActorRef<NodeActor>>,
    /// Membership (SWIM).
    swim: Swim,
}

impl NodeActor {
    pub(crate) fn new(shared: Arc<NodeShared>, listener: TcpListener) -> Self {
        let mut dials = HashMap::new();
        for s in &shared.cfg.seeds {
            if *s != shared.listen {
                dials.insert(*s, Dial::new(shared.cfg.redial.0, true));
            }
        }
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let me = Member {
            name: shared.cfg.name.clone(),
            listen: shared.listen,
            incarnation: shared.incarnation,
            started_ms,
            bump: 0,
        };
        // The incarnation is random: a fine seed for the choice of members.
        let swim = Swim::new(me, shared.cfg.swim_timing(), shared.incarnation);
        let zero_copy_above = shared.cfg.zero_copy_above;
        NodeActor {
            shared,
            listener,
            // Senders are held back at HIGH_WATER (stand-ins keep their
            // capacity slots); the limit only catches a peer that stops
            // reading while replies and control frames pile up.
            conns: Connections::with_output_limit(1 << 30).zero_copy_above(zero_copy_above),
            links: HashMap::new(),
            by_conn: HashMap::new(),
            up: HashMap::new(),
            proxies: HashMap::new(),
            asks: HashMap::new(),
            lookups: HashMap::new(),
            watchers: HashMap::new(),
            dials,
            next_link: 1,
            next_req: 1,
            flush_queued: false,
            me: None,
            swim,
        }
    }

    fn me(&self) -> crate::ActorRef<NodeActor> {
        self.me.clone().expect("started")
    }

    fn identity(&self) -> Identity {
        Identity {
            name: self.shared.cfg.name.clone(),
            incarnation: self.shared.incarnation,
            secret: self.shared.cfg.secret.clone(),
        }
    }

    fn arm_accept(&mut self, ctx: &mut Context<Self>) {
        let me = self.me();
        let on = move |ev: Accept| match ev {
            Accept::Conn(fd) => {
                let _ = me.tell_fd(Inbound, fd); // a stopped node closes it
            }
            Accept::Ended(e) => me.deliver_forced(Rearm(e)),
        };
        if ctx.accept_multi(self.listener.as_raw_fd(), on).is_err() {
            ctx.send_after(Duration::from_millis(5), Rearm(16));
        }
    }

    fn add_link(
        &mut self,
        fd: FixedFd,
        dialled: Option<SocketAddr>,
        ctx: &Context<Self>,
    ) -> Option<u64> {
        let conn = self.conns.add(fd, ctx).ok()?;
        let id = self.next_link;
        self.next_link += 1;
        let now = Instant::now();
        self.links.insert(
            id,
            Link {
                id,
                conn,
                state: State::AwaitHello,
                dialled,
                inbuf: Vec::new(),
                pending: Vec::new(),
                since: now,
                last_rx: now,
                peer: None,
                peer_listen: None,
                sent: 0,
                acked: 0,
                received: 0,
                acked_out: 0,
                owed_replies: 0,
                owed: HashMap::new(),
            },
        );
        self.by_conn.insert(conn, id);
        Some(id)
    }

    /// Writes a plain (handshake) frame.
    fn write_plain(&mut self, link: u64, f: &Frame) {
        let Some(l) = self.links.get(&link) else { return };
        let mut buf = Vec::new();
        if frame::encode(f, &mut buf, MAX_HANDSHAKE_FRAME).is_ok() {
            self.conns.write(l.conn, &buf);
        }
    }

    /// Queues a frame for the link's next sealed segment (sealing the
    /// pending ones first when the segment would outgrow `max_frame`).
    fn queue(&mut self, link: u64, f: &Frame) -> bool {
        let max = self.shared.cfg.max_frame;
        let NodeActor { links, conns, .. } = self;
        let Some(l) = links.get_mut(&link) else { return false };
        let State::Up { sealer, .. } = &mut l.state else { return false };
        let before = l.pending.len();
        if let Err(e) = frame::encode(f, &mut l.pending, max.saturating_sub(4)) {
            eprintln!("ringmail node {}: frame not sent: {e}", self.shared.cfg.name);
            return false;
        }
        if l.pending.len() > max {
            // Full: what was pending leaves as one segment now.
            let tail = l.pending.split_off(before);
            let mut seg = Vec::with_capacity(l.pending.len() + frame::SEGMENT_OVERHEAD);
            sealer.seal(&l.pending, &mut seg);
            conns.write(l.conn, &seg);
            l.pending = tail;
        }
        if !self.flush_queued {
            self.flush_queued = true;
            // Behind everything already queued: one segment per loop turn.
            self.me().deliver_forced(Flush);
        }
        true
    }

    fn flush(&mut self, ctx: &Context<Self>) {
        self.flush_queued = false;
        for l in self.links.values_mut() {
            if l.pending.is_empty() {
                continue;
            }
            if let State::Up { sealer, .. } = &mut l.state {
                let mut seg = Vec::with_capacity(l.pending.len() + frame::SEGMENT_OVERHEAD);
                sealer.seal(&l.pending, &mut seg);
                self.conns.write(l.conn, &seg);
            }
            l.pending.clear();
        }
        self.conns.flush(ctx);
        self.release_owed();
    }

    /// Gives stand-ins their capacity back for links whose unsent bytes are
    /// under the high-water mark (or that are closed: what they held is in
    /// doubt or lost with them, and counted as such).
    fn release_owed(&mut self) {
        for l in self.links.values_mut() {
            if l.owed.is_empty() {
                continue;
            }
            let closed = matches!(l.state, State::Closed);
            if closed || self.conns.backlog(l.conn) < HIGH_WATER {
                for (_, (shared, n)) in l.owed.drain() {
                    shared.unreserve_n(n);
                }
            }
        }
    }

    /// Closes a link, with the reason (logged); a peer it carried goes down.
    fn close(&mut self, link: u64, reason: &str, ctx: &Context<Self>) {
        let Some(l) = self.links.get_mut(&link) else { return };
        if matches!(l.state, State::Closed) {
            return;
        }
        // What this turn already framed still leaves, ahead of the FIN:
        // the peer reads it before it sees the connection end.
        if let State::Up { sealer, .. } = &mut l.state {
            if !l.pending.is_empty() {
                let mut seg = Vec::with_capacity(l.pending.len() + frame::SEGMENT_OVERHEAD);
                sealer.seal(&l.pending, &mut seg);
                l.pending.clear();
                self.conns.write(l.conn, &seg);
            }
        }
        l.state = State::Closed;
        let conn = l.conn;
        if let Some(addr) = l.dialled {
            if let Some(d) = self.dials.get_mut(&addr) {
                d.busy = false;
                d.failures += u32::from(l.peer.is_none());
            }
        }
        let quiet = ["", "node shut down", "duplicate connection retired"];
        if l.peer.is_some() && !quiet.contains(&reason) {
            eprintln!("ringmail node {}: connection closed: {reason}", self.shared.cfg.name);
        }
        self.conns.close(conn, ctx);
        self.peer_down(link, reason);
    }

    /// The link is gone: what waited on it is answered, what it carried
    /// unacknowledged is in doubt, and if it was a peer's link, the peer is
    /// down.
    fn peer_down(&mut self, link: u64, reason: &str) {
        let Some(l) = self.links.get(&link) else { return };
        let in_doubt = l.sent.saturating_sub(l.acked);
        self.shared.counters.in_doubt.fetch_add(in_doubt, Ordering::Relaxed);
        let asks: Vec<u64> =
            self.asks.iter().filter(|(_, a)| a.0 == link).map(|(r, _)| *r).collect();
        for r in asks {
            self.asks.remove(&r); // dropping the ReplyTo answers "no reply"
        }
        self.lookups.retain(|_, (l, tx)| {
            if *l == link {
                let _ = tx.send(Err(LookupError::Timeout));
                false
            } else {
                true
            }
        });
        // Lookups that came on a retired duplicate are the peer's all the
        // same: its current link carries their `Stopped` from now on.
        let successor = l.peer.as_ref().and_then(|p| self.up.get(&p.0).copied()).filter(|&cur| {
            cur != link && self.links.get(&cur).and_then(|c| c.peer.as_ref()) == l.peer.as_ref()
        });
        for w in self.watchers.values_mut() {
            if w.remove(&link) {
                if let Some(cur) = successor {
                    w.insert(cur);
                }
            }
        }
        let Some((name, inc)) = l.peer.clone() else { return };
        let redial = l.peer_listen.or(l.dialled);
        if self.up.get(&name) != Some(&link) {
            return; // a retired duplicate: the peer is up on another link
        }
        self.up.remove(&name);
        crate::runtime::lock(&self.shared.peers).remove(&name);
        // Redial where it listened (a restart comes back there).
        if let Some(addr) = redial {
            let min = self.shared.cfg.redial.0;
            let d = self.dials.entry(addr).or_insert(Dial::new(min, false));
            d.next = Instant::now() + d.backoff;
        }
        let gone: Vec<u64> = self
            .proxies
            .iter()
            .filter(|(_, p)| p.peer == name && p.incarnation == inc)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.proxies.remove(&id);
            self.stop_proxy(id, StopReason::NodeDown(name.clone()));
        }
        self.shared.publish(NodeEvent::Down {
            name,
            incarnation: inc,
            reason: reason.to_string(),
            in_doubt,
        });
    }

    fn stop_proxy(&self, id: u64, reason: StopReason) {
        let me = self.me();
        let env = Envelope { to: id, body: Body::Stop(reason) };
        send_control(me.shard.id, &me.shard.addr, env, true);
    }

    /// Handles received bytes of a link.
    fn received(&mut self, link: u64, bytes: &[u8], ctx: &Context<Self>) {
        let Some(l) = self.links.get_mut(&link) else { return };
        if matches!(l.state, State::Closed) {
            return;
        }
        l.last_rx = Instant::now();
        l.inbuf.extend_from_slice(bytes);
        let mut used = 0;
        let result = loop {
            let l = self.links.get_mut(&link).expect("link");
            let buf = &l.inbuf[used..];
            match &mut l.state {
                State::Up { unsealer, .. } => match unsealer.open(buf) {
                    Ok(Some((payload, n))) => {
                        let payload = payload.to_vec();
                        used += n;
                        if let Err(e) = self.segment(link, &payload, ctx) {
                            break Err(e);
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e.to_string()),
                },
                State::Closed => break Ok(()),
                _ => match frame::decode(buf, MAX_HANDSHAKE_FRAME) {
                    Ok(Some((f, n))) => {
                        used += n;
                        if let Err(e) = self.handshake(link, f, ctx) {
                            break Err(e);
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e.to_string()),
                },
            }
        };
        if let Some(l) = self.links.get_mut(&link) {
            l.inbuf.drain(..used.min(l.inbuf.len()));
        }
        if let Err(e) = result {
            let authenticated = self.links.get(&link).is_some_and(|l| l.peer.is_some());
            if authenticated {
                self.shared.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                self.shared.counters.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            }
            eprintln!("ringmail node {}: closing a connection: {e}", self.shared.cfg.name);
            self.close(link, &e, ctx);
        }
    }

    fn handshake(&mut self, link: u64, f: Frame, ctx: &Context<Self>) -> Result<(), String> {
        let me = self.identity();
        let l = self.links.get_mut(&link).expect("link");
        let state = std::mem::replace(&mut l.state, State::Closed);
        match state {
            State::AwaitHello => {
                let (r, welcome) = Responder::on_hello(me, f).map_err(|e| e.to_string())?;
                l.state = State::AwaitConfirm(r);
                self.write_plain(link, &welcome);
                self.conns.flush(ctx);
                Ok(())
            }
            State::AwaitWelcome(i) => {
                let (confirm, peer, keys) = i.on_welcome(f).map_err(|e| e.to_string())?;
                self.write_plain(link, &confirm);
                let max = self.shared.cfg.max_frame;
                let l = self.links.get_mut(&link).expect("link");
                l.state = State::Up {
                    sealer: Sealer::new(keys.send),
                    unsealer: Unsealer::new(keys.recv, max),
                };
                self.established(link, peer.name, peer.incarnation, ctx);
                Ok(())
            }
            State::AwaitConfirm(r) => {
                let (peer, keys) = r.on_confirm(f).map_err(|e| e.to_string())?;
                let max = self.shared.cfg.max_frame;
                let l = self.links.get_mut(&link).expect("link");
                l.state = State::Up {
                    sealer: Sealer::new(keys.send),
                    unsealer: Unsealer::new(keys.recv, max),
                };
                self.established(link, peer.name, peer.incarnation, ctx);
                Ok(())
            }
            other => {
                l.state = other;
                Err(WireError::Unexpected("a handshake frame after the handshake").to_string())
            }
        }
    }

    /// A link authenticated its peer.
    fn established(&mut self, link: u64, name: String, inc: u64, ctx: &Context<Self>) {
        let l = self.links.get_mut(&link).expect("link");
        l.peer = Some((name.clone(), inc));
        let dialled_by_me = l.dialled.is_some();
        if let Some(addr) = l.dialled {
            if let Some(d) = self.dials.get_mut(&addr) {
                d.backoff = self.shared.cfg.redial.0;
                d.failures = 0;
            }
        }
        if let Some(&other) = self.up.get(&name) {
            // Two connections to one peer: keep the one dialled by the node
            // with the smaller name (both sides decide alike).
            let other_dialled_by_me = self.links.get(&other).is_some_and(|o| o.dialled.is_some());
            let same_incarnation =
                self.links.get(&other).and_then(|o| o.peer.as_ref()).map(|p| p.1) == Some(inc);
            if same_incarnation && other_dialled_by_me != dialled_by_me {
                let i_am_smaller = self.shared.cfg.name < name;
                let keep_new = dialled_by_me == i_am_smaller;
                let drop_link = if keep_new { other } else { link };
                if keep_new {
                    self.up.insert(name.clone(), link);
                }
                // The dropped one is no longer the peer's link: closing it
                // does not take the peer down.
                self.close_duplicate(drop_link, ctx);
                if !keep_new {
                    return;
                }
                self.send_members(link);
                self.swim.announce(&name);
                self.apply_swim(ctx);
                return;
            }
            // An old incarnation's link (or a redial of ours): the newest wins.
            self.close(other, "replaced by a newer connection", ctx);
        }
        self.up.insert(name.clone(), link);
        crate::runtime::lock(&self.shared.peers).insert(name.clone(), inc);
        self.shared.publish(NodeEvent::Up { name: name.clone(), incarnation: inc });
        self.send_members(link);
        self.swim.announce(&name);
        self.apply_swim(ctx);
    }

    /// Retires a duplicate link: nothing new is sent on it (replies to asks
    /// that came on it still are), it is still read, and the tick closes it
    /// once nothing has arrived on it for [`RETIRE_AFTER`].
    fn close_duplicate(&mut self, link: u64, _ctx: &Context<Self>) {
        if let Some(l) = self.links.get_mut(&link) {
            if let Some(addr) = l.dialled {
                if let Some(d) = self.dials.get_mut(&addr) {
                    d.busy = false;
                }
            }
        }
    }

    fn send_members(&mut self, link: u64) {
        let f = Frame::Listening { addr: self.shared.listen.to_string() };
        self.queue(link, &f);
    }

    /// Dials `addr` (with backoff) unless it is ours or already known.
    fn want_dial(&mut self, addr: SocketAddr) {
        if addr == self.shared.listen {
            return;
        }
        let min = self.shared.cfg.redial.0;
        self.dials.entry(addr).or_insert(Dial::new(min, false));
    }

    /// Carries out what membership asked for: packets to members (over
    /// their connections), timers, and reactions to members coming up and
    /// going down.
    fn apply_swim(&mut self, ctx: &Context<Self>) {
        loop {
            let effects = self.swim.effects();
            if effects.is_empty() {
                return;
            }
            for e in effects {
                match e {
                    Effect::Send(to, data) => {
                        // By name: a packet names its destination identity,
                        // and a newer incarnation's foca ignores one meant
                        // for an older one.
                        match self.up.get(&to.name).copied() {
                            Some(link) => {
                                self.queue(link, &Frame::Swim(data));
                            }
                            None => {
                                // Lost, to SWIM; the member gets dialled.
                                self.swim.unroutable += 1;
                                self.want_dial(to.listen);
                            }
                        }
                    }
                    Effect::Schedule(after, t) => {
                        ctx.send_after(after, SwimTimer(t));
                    }
                    Effect::Notify(OwnedNotification::MemberUp(m)) => {
                        if !self.up.contains_key(&m.name) {
                            self.want_dial(m.listen);
                        }
                    }
                    Effect::Notify(OwnedNotification::MemberDown(m)) => {
                        if self.swim.is_active(&m.name) {
                            continue; // an older identity of a live member
                        }
                        let link = self.up.get(&m.name).copied();
                        let same = link
                            .and_then(|l| self.links.get(&l))
                            .and_then(|l| l.peer.as_ref())
                            .is_some_and(|p| p.1 == m.incarnation);
                        if let (Some(link), true) = (link, same) {
                            self.close(
                                link,
                                "node down: it stopped answering membership probes",
                                ctx,
                            );
                        }
                    }
                    Effect::Notify(OwnedNotification::Rejoin(_)) => {
                        // Declared down while alive (a partition that
                        // healed): tell everyone connected about the new
                        // identity.
                        let names: Vec<String> = self.up.keys().cloned().collect();
                        for n in names {
                            self.swim.announce(&n);
                        }
                    }
                    Effect::Notify(_) => {}
                }
            }
        }
    }

    /// Handles the frames of one authenticated segment.
    fn segment(&mut self, link: u64, payload: &[u8], ctx: &Context<Self>) -> Result<(), String> {
        let max = self.shared.cfg.max_frame;
        let mut at = 0;
        while at < payload.len() {
            let Some((f, n)) = frame::decode(&payload[at..], max).map_err(|e| e.to_string())?
            else {
                return Err("a segment ends inside a frame".into());
            };
            at += n;
            self.frame(link, f, ctx)?;
        }
        Ok(())
    }

    fn frame(&mut self, link: u64, f: Frame, ctx: &Context<Self>) -> Result<(), String> {
        match f {
            Frame::Tell { to, ty, payload } => self.deliver(link, to, ty, &payload, None),
            Frame::Ask { to, ty, req, payload } => self.deliver(link, to, ty, &payload, Some(req)),
            Frame::Reply { req, payload } => {
                // Only the peer that was asked may answer.
                if self.asks.get(&req).is_some_and(|a| a.0 != link) {
                    return Err("a reply to a request of another connection".into());
                }
                if let Some((_, reply, codec)) = self.asks.remove(&req) {
                    let value = match payload {
                        Some(b) => {
                            Some((codec.decode_reply)(&b).map_err(|e| format!("reply: {e}"))?)
                        }
                        None => None,
                    };
                    reply.send(value);
                }
                Ok(())
            }
            Frame::Lookup { req, name } => {
                let found = self.shared.exports.get(&name).map(|e| e.clone());
                let actor = found.as_ref().map(|e| (e.id, e.type_name.to_string()));
                if let Some(e) = found {
                    self.watchers.entry(e.id).or_default().insert(link);
                    if !e.watched.swap(true, Ordering::AcqRel) {
                        let me = self.me();
                        let id = e.id;
                        (e.watch)(Box::new(move |r| {
                            me.deliver_forced(ExportStopped { id, reason: reason_text(r) })
                        }));
                    }
                }
                self.queue(link, &Frame::Found { req, actor });
                Ok(())
            }
            Frame::Found { req, actor } => {
                if self.lookups.get(&req).is_some_and(|l| l.0 != link) {
                    return Err("an answer to a lookup of another connection".into());
                }
                if let Some((_, tx)) = self.lookups.remove(&req) {
                    let (peer, inc) = self
                        .links
                        .get(&link)
                        .and_then(|l| l.peer.clone())
                        .unwrap_or_else(|| (String::new(), 0));
                    let _ = tx.send(match actor {
                        Some((id, type_name)) => {
                            Ok(Found { peer, id, type_name, incarnation: inc })
                        }
                        None => Err(LookupError::NotFound),
                    });
                }
                Ok(())
            }
            Frame::Stopped { id, reason } => {
                let Some((peer, inc)) = self.links.get(&link).and_then(|l| l.peer.clone()) else {
                    return Ok(());
                };
                let gone: Vec<u64> = self
                    .proxies
                    .iter()
                    .filter(|(_, p)| p.peer == peer && p.incarnation == inc && p.remote_id == id)
                    .map(|(pid, _)| *pid)
                    .collect();
                for pid in gone {
                    self.proxies.remove(&pid);
                    self.stop_proxy(pid, reason_from_text(&reason));
                }
                Ok(())
            }
            Frame::Listening { addr } => {
                let listen: SocketAddr = addr.parse().map_err(|_| "bad listen address")?;
                if let Some(l) = self.links.get_mut(&link) {
                    l.peer_listen = Some(listen);
                }
                self.want_dial(listen);
                Ok(())
            }
            Frame::Ping(n) | Frame::Pong(n) => {
                if let Some(l) = self.links.get_mut(&link) {
                    l.acked = l.acked.max(n);
                }
                Ok(())
            }
            Frame::Swim(data) => {
                self.swim.handle_data(&data);
                self.apply_swim(ctx);
                Ok(())
            }
            _ => Err(WireError::Unexpected(
                "a handshake or unknown frame on an established connection",
            )
            .to_string()),
        }
    }

    /// A message from a peer for local actor `to`.
    fn deliver(
        &mut self,
        link: u64,
        to: u64,
        ty: u64,
        payload: &[u8],
        req: Option<u64>,
    ) -> Result<(), String> {
        if let Some(l) = self.links.get_mut(&link) {
            l.received += 1;
        }
        self.shared.counters.received.fetch_add(1, Ordering::Relaxed);
        let Some(export) = self.shared.exports_by_id.get(&to).map(|e| e.clone()) else {
            // Not (or no longer) here: a dead letter; an ask is told at once.
            self.shared.counters.unknown_target.fetch_add(1, Ordering::Relaxed);
            dead_letter();
            if let Some(req) = req {
                self.queue(link, &Frame::Reply { req, payload: None });
            }
            return Ok(());
        };
        let Some((decode, encode_reply)) = self.shared.codecs.decoder(export.actor_type, ty) else {
            return Err(format!("message type {ty:#x} is not registered for {}", export.type_name));
        };
        if req.is_some() {
            if let Some(l) = self.links.get_mut(&link) {
                l.owed_replies += 1;
            }
        }
        let reply = req.map(|req| {
            let me = self.me();
            ReplyTo::remote(Box::new(move |v| {
                let payload = v.and_then(encode_reply);
                me.deliver_forced(SendReply { link, req, payload });
            }))
        });
        let m = decode(payload, reply).map_err(|e| format!("message does not decode: {e}"))?;
        (export.deliver)(m);
        Ok(())
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let cfg = self.shared.cfg.clone();
        let mut to_close = Vec::new();
        let mut to_ack = Vec::new();
        let mut pending_in = 0u64;
        // Links that answers to our asks or lookups are still to come on
        // (gathered only when a retired duplicate needs it).
        let mut awaited: Option<HashSet<u64>> = None;
        for l in self.links.values() {
            match l.state {
                State::Closed => {}
                State::Up { .. } => {
                    // Liveness is membership's business (and the kernel's,
                    // TCP_USER_TIMEOUT); a tick only acknowledges what
                    // arrived, so the peer knows what is no longer in doubt.
                    let current = l.peer.as_ref().is_some_and(|p| self.up.get(&p.0) == Some(&l.id));
                    // A retired duplicate still carries the answers to what
                    // was asked on it (both ways): it closes once those are
                    // in and it has been quiet; meanwhile an acknowledgement
                    // every tick keeps the peer from closing it first.
                    let waiting = !current
                        && awaited
                            .get_or_insert_with(|| {
                                let asks = self.asks.values().map(|a| a.0);
                                asks.chain(self.lookups.values().map(|x| x.0)).collect()
                            })
                            .contains(&l.id);
                    let busy = waiting || l.owed_replies > 0;
                    if !current && !busy && now.duration_since(l.last_rx) > RETIRE_AFTER {
                        to_close.push((l.id, "duplicate connection retired".to_string()));
                    } else if l.received != l.acked_out || (!current && waiting) {
                        to_ack.push(l.id);
                    }
                }
                _ => {
                    if l.dialled.is_none() {
                        pending_in += 1;
                    }
                    if now.duration_since(l.since) > cfg.handshake_timeout {
                        to_close.push((l.id, "handshake timed out".to_string()));
                    }
                }
            }
        }
        self.shared.counters.pending_handshakes.store(pending_in, Ordering::Relaxed);
        for (id, why) in to_close {
            let authenticated = self.links.get(&id).is_some_and(|l| l.peer.is_some());
            if !authenticated {
                self.shared.counters.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            }
            self.close(id, &why, ctx);
        }
        for id in to_ack {
            if let Some(l) = self.links.get_mut(&id) {
                l.acked_out = l.received;
                let r = l.received;
                self.queue(id, &Frame::Ping(r));
            }
        }
        // Dial addresses with nobody up or connecting there.
        let listening: HashSet<SocketAddr> = self
            .up
            .values()
            .filter_map(|l| self.links.get(l))
            .flat_map(|l| [l.peer_listen, l.dialled])
            .flatten()
            .collect();
        // Forget addresses nobody answers at that are neither seeds nor
        // active members (a node that left for good).
        let members = self.swim.active_listens();
        let name = &self.shared.cfg.name;
        self.dials.retain(|addr, d| {
            let keep = d.seed || d.busy || d.failures < DIAL_GIVE_UP || members.contains(addr);
            if !keep {
                eprintln!("ringmail node {name}: {addr} stopped answering; no longer dialled");
            }
            keep
        });
        self.shared.counters.dialling.store(self.dials.len() as u64, Ordering::Relaxed);
        let max = cfg.redial.1;
        let me = self.me();
        for (addr, d) in self.dials.iter_mut() {
            if d.busy || now < d.next || listening.contains(addr) {
                continue;
            }
            d.busy = true;
            d.next = now + d.backoff;
            d.backoff = (d.backoff * 2).min(max);
            let addr = *addr;
            let me = me.clone();
            let user_timeout = cfg.link_timeout();
            let spawned =
                std::thread::Builder::new().name("ringmail-dial".into()).spawn(move || {
                    let result = TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                        .and_then(|s| {
                            s.set_nodelay(true)?;
                            socket2::SockRef::from(&s).set_tcp_user_timeout(Some(user_timeout))?;
                            Ok(OwnedFd::from(s))
                        });
                    me.deliver_forced(Dialed { addr, result });
                });
            if spawned.is_err() {
                d.busy = false; // no thread now: try again at the next tick
            }
        }
        ctx.send_after(TICK, Tick);
        self.flush(ctx);
    }

    fn pending_inbound(&self) -> usize {
        self.links
            .values()
            .filter(|l| l.dialled.is_none() && !matches!(l.state, State::Up { .. } | State::Closed))
            .count()
    }
}

fn reason_text(r: &StopReason) -> String {
    match r {
        StopReason::Normal => "normal".into(),
        StopReason::Shutdown => "shutdown".into(),
        other => format!("{other:?}"),
    }
}

fn reason_from_text(s: &str) -> StopReason {
    match s {
        "normal" => StopReason::Normal,
        "shutdown" => StopReason::Shutdown,
        other => StopReason::Failed(format!("remote: {other}")),
    }
}

impl Actor for NodeActor {
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.me = Some(ctx.myself().clone());
        self.arm_accept(ctx);
        self.tick(ctx);
    }

    fn stopped(&mut self, ctx: &mut Context<Self>) {
        // Members learn at once that this node left (queued ahead of the
        // FIN of each connection), instead of suspecting it.
        self.swim.leave();
        self.apply_swim(ctx);
        let ids: Vec<u64> = self.links.keys().copied().collect();
        for id in ids {
            self.close(id, "node shut down", ctx);
        }
        let proxies: Vec<u64> = self.proxies.keys().copied().collect();
        for id in proxies {
            self.stop_proxy(id, StopReason::NodeDown(self.shared.cfg.name.clone()));
        }
        self.proxies.clear();
        self.asks.clear();
    }
}

impl FdHandler<Inbound> for NodeActor {
    fn handle_fd(&mut self, _: Inbound, fd: FixedFd, ctx: &mut Context<Self>) {
        if self.pending_inbound() >= self.shared.cfg.max_pending_handshakes {
            self.shared.counters.handshakes_refused.fetch_add(1, Ordering::Relaxed);
            return; // dropping it closes the connection
        }
        self.add_link(fd, None, ctx);
        let n = self.pending_inbound() as u64;
        self.shared.counters.pending_handshakes.store(n, Ordering::Relaxed);
    }
}

impl Handler<Dialed> for NodeActor {
    fn handle(&mut self, d: Dialed, ctx: &mut Context<Self>) {
        let fd = match d.result.and_then(|fd| ctx.register_fd(fd)) {
            Ok(fd) => fd,
            Err(_) => {
                if let Some(x) = self.dials.get_mut(&d.addr) {
                    x.busy = false;
                    x.failures += 1;
                }
                return;
            }
        };
        let Some(link) = self.add_link(fd, Some(d.addr), ctx) else {
            if let Some(x) = self.dials.get_mut(&d.addr) {
                x.busy = false;
            }
            return;
        };
        match Initiator::start(self.identity()) {
            Ok((i, hello)) => {
                self.links.get_mut(&link).expect("link").state = State::AwaitWelcome(i);
                self.write_plain(link, &hello);
                self.conns.flush(ctx);
            }
            Err(e) => self.close(link, &e.to_string(), ctx),
        }
    }
}

impl Handler<NetEvent> for NodeActor {
    fn handle(&mut self, ev: NetEvent, ctx: &mut Context<Self>) {
        let sent = matches!(ev, NetEvent::Sent(..));
        match self.conns.handle(ev, ctx) {
            Some(Input::Data(conn, bytes)) => {
                if let Some(&link) = self.by_conn.get(&conn) {
                    self.received(link, &bytes, ctx);
                }
            }
            Some(Input::Closed(conn)) => {
                if let Some(link) = self.by_conn.remove(&conn) {
                    let was_open =
                        self.links.get(&link).is_some_and(|l| !matches!(l.state, State::Closed));
                    if was_open {
                        if let Some(l) = self.links.get_mut(&link) {
                            l.state = State::Closed;
                            if let Some(addr) = l.dialled {
                                if let Some(d) = self.dials.get_mut(&addr) {
                                    d.busy = false;
                                    // Closed before it authenticated: a failed dial.
                                    d.failures += u32::from(l.peer.is_none());
                                }
                            }
                        }
                        self.peer_down(link, "connection closed by the peer");
                    }
                    if let Some(mut l) = self.links.remove(&link) {
                        for (_, (shared, n)) in l.owed.drain() {
                            shared.unreserve_n(n);
                        }
                    }
                }
            }
            None => {}
        }
        self.conns.flush(ctx);
        if sent {
            self.release_owed();
        }
    }
}

impl Handler<Outbound> for NodeActor {
    fn handle(&mut self, mut o: Outbound, ctx: &mut Context<Self>) {
        let shared = o.stand_in.take().expect("an Outbound is handled once");
        let msg = o.msg.take().expect("an Outbound is handled once");
        let Some(p) = self.proxies.get(&o.proxy) else {
            // Its node went down (an ask gets NoReply).
            shared.unreserve();
            dead_letter();
            return;
        };
        let Some(&link) = self.up.get(&p.peer) else {
            shared.unreserve();
            dead_letter();
            return;
        };
        let current = self.links.get(&link).and_then(|l| l.peer.as_ref()).map(|x| x.1);
        if current != Some(p.incarnation) {
            shared.unreserve();
            dead_letter(); // never to a newer incarnation
            return;
        }
        let remote_id = p.remote_id;
        let Some(codec) = self.shared.codecs.for_msg(msg.msg_type()) else {
            shared.unreserve();
            eprintln!(
                "ringmail node {}: a message type is not registered (Node::register): dead letter",
                self.shared.cfg.name
            );
            dead_letter();
            return;
        };
        let (msg, reply) = msg.split();
        let payload = match (codec.encode)(&*msg) {
            Ok(p) => p,
            Err(e) => {
                shared.unreserve();
                eprintln!("ringmail node {}: a message does not encode: {e}", self.shared.cfg.name);
                dead_letter();
                return;
            }
        };
        let f = match reply {
            Some(r) => {
                let req = self.next_req;
                self.next_req += 1;
                self.asks.insert(req, (link, r, codec));
                Frame::Ask { to: remote_id, ty: codec.ty, req, payload }
            }
            None => Frame::Tell { to: remote_id, ty: codec.ty, payload },
        };
        let req = match &f {
            Frame::Ask { req, .. } => Some(*req),
            _ => None,
        };
        if self.queue(link, &f) {
            if let Some(l) = self.links.get_mut(&link) {
                l.sent += 1;
                l.owed.entry(o.proxy).or_insert((shared, 0)).1 += 1;
            }
            self.shared.counters.sent.fetch_add(1, Ordering::Relaxed);
        } else {
            // Not sent (too large to frame): a dead letter; an ask's
            // ReplyTo drops here and answers "no reply" at once.
            if let Some(req) = req {
                self.asks.remove(&req);
            }
            shared.unreserve();
            dead_letter();
        }
        let _ = ctx;
    }
}

impl Handler<RegisterProxy> for NodeActor {
    fn handle(&mut self, r: RegisterProxy, _ctx: &mut Context<Self>) {
        let live = self
            .up
            .get(&r.peer)
            .and_then(|l| self.links.get(l))
            .and_then(|l| l.peer.as_ref())
            .is_some_and(|p| p.1 == r.incarnation);
        if !live {
            // Whatever it already forwarded was a dead letter and released.
            self.stop_proxy(r.proxy, StopReason::NodeDown(r.peer));
            return;
        }
        self.proxies.insert(
            r.proxy,
            ProxyEntry { peer: r.peer, incarnation: r.incarnation, remote_id: r.remote_id },
        );
    }
}

impl Handler<LookupReq> for NodeActor {
    fn handle(&mut self, r: LookupReq, _ctx: &mut Context<Self>) {
        let Some(&link) = self.up.get(&r.peer) else {
            let _ = r.tx.send(Err(LookupError::NotConnected));
            return;
        };
        let req = self.next_req;
        self.next_req += 1;
        self.lookups.insert(req, (link, r.tx));
        self.queue(link, &Frame::Lookup { req, name: r.name });
    }
}

impl Handler<SendReply> for NodeActor {
    fn handle(&mut self, r: SendReply, _ctx: &mut Context<Self>) {
        if let Some(l) = self.links.get_mut(&r.link) {
            l.owed_replies = l.owed_replies.saturating_sub(1);
        }
        // The asker's connection may be gone: then so is its wait (it got
        // "no reply" when the connection dropped); the reply is a dead letter.
        if !self.queue(r.link, &Frame::Reply { req: r.req, payload: r.payload }) {
            dead_letter();
        }
    }
}

impl Handler<ExportStopped> for NodeActor {
    fn handle(&mut self, s: ExportStopped, _ctx: &mut Context<Self>) {
        for link in self.watchers.remove(&s.id).unwrap_or_default() {
            self.queue(link, &Frame::Stopped { id: s.id, reason: s.reason.clone() });
        }
    }
}

impl Handler<Disconnect> for NodeActor {
    fn handle(&mut self, Disconnect(peer): Disconnect, ctx: &mut Context<Self>) {
        if let Some(&link) = self.up.get(&peer) {
            self.close(link, "disconnected on request", ctx);
        }
    }
}

impl Handler<SwimTimer> for NodeActor {
    fn handle(&mut self, SwimTimer(t): SwimTimer, ctx: &mut Context<Self>) {
        self.swim.handle_timer(t);
        self.apply_swim(ctx);
    }
}

impl Handler<Tick> for NodeActor {
    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        self.tick(ctx);
    }
}

impl Handler<Flush> for NodeActor {
    fn handle(&mut self, _: Flush, ctx: &mut Context<Self>) {
        self.flush(ctx);
    }
}

impl Handler<Rearm> for NodeActor {
    fn handle(&mut self, Rearm(errno): Rearm, ctx: &mut Context<Self>) {
        match errno {
            9 | 22 => ctx.stop_with(StopReason::Failed("the listening socket is unusable".into())),
            0 => self.arm_accept(ctx),
            // Out of slots or fds, SQ full, or anything else: go on after a
            // pause, never in a busy loop.
            _ => {
                ctx.send_after(Duration::from_millis(5), Rearm(0));
            }
        }
    }
}
