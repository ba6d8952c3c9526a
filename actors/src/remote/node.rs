//! The node's actor: the one owner of every connection to a peer.
//!
//! [`NodeActor`] runs on the node's gateway shard. It owns the listening
//! socket, the connection table ([`Connections`]) and, per connection, a
//! [`Link`] (the connection's own state machine, sans I/O: handshake,
//! sealing and opening segments, counters; see `remote::link`). Around the
//! links it keeps the node-wide maps, each decided by a room of its own:
//!
//! * `up`: the authenticated peers, name -> the link that carries them
//!   (one per peer; a crossed dial is settled by `remote::dial::duplicate`);
//! * `pending`: the asks and lookups waiting for a peer's answer
//!   (`remote::pending`);
//! * `proxies`: the stand-ins for remote actors (`remote::stand_in`);
//! * `watchers`: which links looked up which exported actor (they are told
//!   when it stops);
//! * `dials`: the addresses dialled or to dial again (`remote::dial`);
//! * `swim`: membership and failure detection (`remote::swim`).
//!
//! This file holds the actor itself, its messages and the handlers of the
//! socket events. The rest is in rooms beside it:
//!
//! * `node/links.rs`: what a link coming up or going down means for the
//!   maps (`established`, `close`, `peer_down`, stopping stand-ins);
//! * `node/inbound.rs`: what arrives on a link (bytes -> handshake or
//!   segments -> frames -> local actors), and delivery to local actors
//!   without waiting (`stalled`, retried);
//! * `node/outbound.rs`: what local actors send out (a stand-in's message
//!   through its target's credit window; exits through references);
//! * `node/upkeep.rs`: the periodic work (acknowledgements, handshake
//!   deadlines, retiring duplicates, dialling) and carrying out
//!   membership's effects;
//! * `node/groups.rs`: groups spread to and from peers.
//!
//! Invariants:
//!
//! * a link is in `up` only once authenticated, and a peer is published
//!   `Up` and `Down` once per link that carried it;
//! * when a link closes, whatever waited on it is answered at once and
//!   what it sent unacknowledged is counted in doubt; if it carried the
//!   peer, the peer's stand-ins stop with `NodeDown` and it is dialled
//!   again with backoff;
//! * everything written in one turn of the shard's loop leaves as one
//!   sealed segment per link (one `Flush` message queued behind the turn's
//!   work), unless it outgrows `max_frame`;
//! * a stand-in's capacity slot is held while its message waits for
//!   credit (`remote::window`) and while its link has more than
//!   [`HIGH_WATER`] bytes unsent, so senders wait for a slow actor or peer;
//! * every message admitted from a peer gives its cost back exactly once
//!   (handled, or dropped as a dead letter), and the node never waits to
//!   deliver: a full mailbox or transport queue makes it keep the message,
//!   in order behind it, and retry (`stalled`) when the mailbox has drained
//!   to half (a waker) or after a pause (the transport queue).

use std::collections::{HashMap, HashSet, VecDeque};

// The tables looked up once or more per message (links, connections,
// peers by name, stalled deliveries) hash with FxHash, not SipHash: their
// keys are this node's own ids and authenticated peers' names.
use rustc_hash::FxHashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ringmail_transport::FixedFd;
use ringmail_wire::frame::{Encoded, Frame};
use ringmail_wire::handshake::Identity;

use super::dial::Dial;
use super::groups::RemoteId;
use super::link::{Link, QueueError};
use super::pending::{Found, Pending};
use super::stand_in::Proxies;
use super::swim::{Member, Swim, Timer};
use super::{Export, LookupError, NodeShared};
use crate::actor::{Actor, Context, FdHandler, Handler, Message};
use crate::error::StopReason;
use crate::io::Accept;
use crate::net::{Connections, Input, NetEvent};
use crate::runtime::dead_letter;
use crate::runtime::envelope::Erased;

mod groups;
mod inbound;
mod links;
mod outbound;
mod upkeep;

/// How often the node sends acknowledgements and checks handshake
/// deadlines and redials.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// Unsent bytes on a link above which stand-ins keep their capacity slots
/// (so senders wait instead of queueing without bound).
const HIGH_WATER: usize = 4 << 20;

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

/// The node spreads a group from now on (`Node::group`).
pub(crate) struct SpreadGroup(pub(crate) super::groups::WireGroup);
impl Message for SpreadGroup {
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

/// Credit is owed to the peer of a link (a target handled messages).
struct Drained(u64);
impl Message for Drained {
    type Reply = ();
}

/// Try again the deliveries a full transport mailbox handed back.
struct RetryStalled;
impl Message for RetryStalled {
    type Reply = ();
}

/// The multishot accept ended (errno).
struct Rearm(i32);
impl Message for Rearm {
    type Reply = ();
}

/// Deliveries to one exported actor that wait for room (in its mailbox, or
/// in the transport queue to its shard), in order, and whether a waker for
/// its mailbox's room is registered (cleared when it runs).
type Stalled = (Arc<Export>, VecDeque<Delivery>, Arc<std::sync::atomic::AtomicBool>);

/// What waits to be handed to a local actor, in arrival order.
enum Delivery {
    /// A message (a full transport queue handed it back).
    Msg(Box<dyn Erased>),
    /// An exit that came behind stalled messages: applied after them.
    Exit(ExitFrom),
}

/// An exit from a peer for a local actor.
pub(super) struct ExitFrom {
    /// The peer's name.
    pub(super) node: String,
    /// The failed linked actor (its id on the peer), or `None`: a stop.
    pub(super) from: Option<u64>,
    pub(super) reason: StopReason,
}

impl ExitFrom {
    /// Stops the actor (a stop asked through a reference), or passes it a
    /// linked actor's failure (trapped, or a stop).
    fn apply(self, export: &Export) {
        match self.from {
            None => export.actor.stop_with(self.reason),
            Some(from) => export.actor.exit(from, self.node, self.reason),
        }
    }
}

/// Why a connection to an old incarnation is closed.
const QUARANTINED: &str = "an old incarnation of the node (quarantined)";

/// The node's actor (one per [`super::Node`], on its own shard).
pub(crate) struct NodeActor {
    shared: Arc<NodeShared>,
    listener: TcpListener,
    conns: Connections,
    links: FxHashMap<u64, Link>,
    by_conn: FxHashMap<crate::net::ConnId, u64>,
    /// Authenticated peers: name -> link.
    up: FxHashMap<String, u64>,
    /// The newest incarnation seen of each peer name (authenticated, or
    /// announced by membership): an older one is quarantined, never taken
    /// back (see `established`).
    newest: HashMap<String, u64>,
    /// Quarantined incarnations already warned about (one log line each).
    warned_quarantine: HashSet<(String, u64)>,
    proxies: Proxies,
    /// Asks and lookups waiting for a peer's answer.
    pending: Pending,
    /// Message types already reported undeliverable (logged once each).
    pub(super) warned_types: HashSet<u64>,
    /// Exported actor id -> links that looked it up.
    watchers: HashMap<u64, HashSet<u64>>,
    /// Remote actors whose `Stopped` came lately, by (peer, incarnation,
    /// id): a lookup answered just before the stop registers its stand-in
    /// after the `Stopped` was handled, and must stop it then (kept for
    /// `STOPPED_MEMORY`, forgotten on the tick).
    recently_stopped: HashMap<(String, u64, u64), (Instant, String)>,
    dials: HashMap<SocketAddr, Dial>,
    next_link: u64,
    flush_queued: bool,
    me: Option<crate::ActorRef<NodeActor>>,
    /// Membership (SWIM).
    swim: Swim,
    /// Messages from peers that a full transport mailbox handed back, per
    /// target actor, in order (bounded by the credit windows).
    stalled: FxHashMap<u64, Stalled>,
    /// A `RetryStalled` is on its way.
    retry_armed: bool,
    /// Groups across nodes: what peers said, what was sent.
    groups: super::groups::Table,
    /// Stopped stand-ins still to forget in the shared map (its lock was
    /// taken when they stopped).
    forget_later: Vec<(u64, RemoteId)>,
}

impl NodeActor {
    pub(crate) fn new(shared: Arc<NodeShared>, listener: TcpListener) -> Self {
        let mut dials = HashMap::new();
        for s in &shared.cfg.seeds {
            if *s != shared.listen && *s != shared.advertised {
                dials.insert(*s, Dial::new(shared.cfg.redial.0, true));
            }
        }
        let me = Member {
            name: shared.cfg.name.clone(),
            listen: shared.advertised,
            incarnation: shared.incarnation,
            started_ms: shared.started_ms,
            bump: 0,
        };
        // A seed for the choice of members; the clock if the OS gives no
        // randomness (the choice only spreads probes).
        let seed = ringmail_wire::handshake::random_u64().unwrap_or(shared.incarnation);
        let swim = Swim::new(me, shared.cfg.swim_timing(), seed);
        let zero_copy_above = shared.cfg.zero_copy_above;
        NodeActor {
            shared,
            listener,
            // Senders are held back at HIGH_WATER (stand-ins keep their
            // capacity slots); the limit only catches a peer that stops
            // reading while replies and control frames pile up.
            conns: Connections::with_output_limit(1 << 30).zero_copy_above(zero_copy_above),
            links: FxHashMap::default(),
            by_conn: FxHashMap::default(),
            up: FxHashMap::default(),
            newest: HashMap::new(),
            warned_quarantine: HashSet::new(),
            proxies: Proxies::default(),
            pending: Pending::new(),
            watchers: HashMap::new(),
            recently_stopped: HashMap::new(),
            warned_types: HashSet::new(),
            dials,
            next_link: 1,
            flush_queued: false,
            me: None,
            swim,
            stalled: FxHashMap::default(),
            retry_armed: false,
            groups: super::groups::Table::default(),
            forget_later: Vec::new(),
        }
    }

    fn me(&self) -> crate::ActorRef<NodeActor> {
        self.me.clone().expect("started")
    }

    fn identity(&self) -> Identity {
        let me = Identity::new(
            self.shared.cfg.name.clone(),
            self.shared.incarnation,
            self.shared.cfg.secret.clone(),
        );
        match &self.shared.keys {
            Some(keys) => me.with_keys(keys.clone()),
            None => me,
        }
    }

    fn arm_accept(&mut self, ctx: &mut Context<Self>) {
        let me = self.me();
        let on = move |ev: Accept| match ev {
            Accept::Conn(fd) => {
                let _ = me.tell_fd(Inbound, fd); // a stopped node closes it
            }
            Accept::Ended(e) => me.deliver_forced(Rearm(crate::net::errno(e.as_ref()))),
        };
        if ctx.accept_multi(self.listener.as_fd(), on).is_err() {
            self.shared.counters.accept_retries.fetch_add(1, Ordering::Relaxed);
            ctx.send_after(Duration::from_millis(5), Rearm(0));
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
        let me = self.me();
        // Called on the target's shard: never waits (a wake-up that cannot
        // be sent now is made up for by the tick, which grants too).
        let wake: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            me.nudge(Drained(id));
        });
        let window = self.shared.cfg.window;
        self.links.insert(id, Link::new(id, conn, dialled, Instant::now(), window, wake));
        self.by_conn.insert(conn, id);
        Some(id)
    }

    /// Inbound links still in the handshake.
    fn pending_inbound(&self) -> usize {
        self.links.values().filter(|l| l.dialled.is_none() && l.in_handshake()).count()
    }

    /// Queues a frame for the link's next sealed segment (sealing the
    /// pending ones first when the segment would outgrow `max_frame`).
    fn queue(&mut self, link: u64, f: &Frame) -> bool {
        self.queue_with(link, |l, max| l.queue(f, max).map(|sealed| [sealed, None]))
    }

    /// Queues a frame encoded beforehand (a message, an exit), as
    /// [`NodeActor::queue`] does; a large one is written without a copy.
    fn queue_encoded(&mut self, link: u64, f: Encoded) -> bool {
        self.queue_with(link, |l, max| l.queue_encoded(f, max))
    }

    /// Queues on `link` with `q`, writes the segments it sealed, in order,
    /// and has the rest flushed this turn; false when nothing was queued.
    fn queue_with(
        &mut self,
        link: u64,
        q: impl FnOnce(&mut Link, usize) -> Result<[Option<Vec<u8>>; 2], QueueError>,
    ) -> bool {
        let max = self.shared.cfg.max_frame;
        let Some(l) = self.links.get_mut(&link) else { return false };
        match q(l, max) {
            Ok(segs) => {
                for seg in segs.into_iter().flatten() {
                    self.conns.write_vec(l.conn, seg);
                }
            }
            Err(QueueError::NotUp) => return false,
            Err(QueueError::Frame(e)) => {
                tracing::warn!(node = %self.shared.cfg.name, error = %e, "frame not sent");
                return false;
            }
        }
        self.flush_soon();
        true
    }

    /// A `Flush` behind everything already queued: one segment of small
    /// frames per loop turn.
    fn flush_soon(&mut self) {
        if !self.flush_queued {
            self.flush_queued = true;
            self.me().deliver_forced(Flush);
        }
    }

    fn flush(&mut self, ctx: &Context<Self>) {
        self.flush_queued = false;
        for l in self.links.values_mut() {
            if let Some(seg) = l.take_segment() {
                self.conns.write_vec(l.conn, seg);
            }
        }
        self.conns.flush(ctx);
        self.release_owed();
    }

    /// Gives stand-ins their capacity back for links whose unsent bytes are
    /// under the high-water mark (or that are closed: what they held is in
    /// doubt or lost with them, and counted as such).
    fn release_owed(&mut self) {
        for l in self.links.values_mut() {
            if !l.holds_slots() {
                continue;
            }
            if l.is_closed() || self.conns.backlog(l.conn) < HIGH_WATER {
                l.release_owed();
            }
        }
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
        let taken = self.proxies.take_all();
        self.stop_stand_ins(taken, StopReason::NodeDown(self.shared.cfg.name.clone()));
        self.pending.drop_asks();
        // Deliveries still waiting for room: the node is going, so are they.
        for (_, (export, q, _)) in self.stalled.drain() {
            for d in q {
                match d {
                    Delivery::Msg(m) => {
                        dead_letter();
                        drop(m);
                    }
                    // A stop or exit still reaches its local actor.
                    Delivery::Exit(e) => e.apply(&export),
                }
            }
        }
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
                    x.failed();
                }
                return;
            }
        };
        let Some(link) = self.add_link(fd, Some(d.addr), ctx) else {
            if let Some(x) = self.dials.get_mut(&d.addr) {
                x.free();
            }
            return;
        };
        let me = self.identity();
        let l = self.links.get_mut(&link).expect("link");
        let conn = l.conn;
        match l.start_dialling(me) {
            Ok(hello) => {
                if let Some(hello) = hello {
                    self.conns.write(conn, &hello);
                }
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
                    self.received(link, bytes, ctx);
                }
            }
            Some(Input::Closed(conn)) => {
                if let Some(link) = self.by_conn.remove(&conn) {
                    let was_open = self.links.get(&link).is_some_and(|l| !l.is_closed());
                    if was_open {
                        if let Some(l) = self.links.get_mut(&link) {
                            if l.in_handshake() {
                                // The peer gave up before authenticating (it
                                // failed its side, or it timed out).
                                let c = &self.shared.counters.handshakes_failed;
                                c.fetch_add(1, Ordering::Relaxed);
                            }
                            l.lost();
                            if let Some(addr) = l.dialled {
                                if let Some(d) = self.dials.get_mut(&addr) {
                                    // Closed before it settled: a failed dial.
                                    d.link_closed(l.peer.is_some() && l.settled);
                                }
                            }
                        }
                        self.peer_down(link, "connection closed by the peer");
                    }
                    if let Some(mut l) = self.links.remove(&link) {
                        l.release_owed();
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

impl Handler<LookupReq> for NodeActor {
    fn handle(&mut self, r: LookupReq, _ctx: &mut Context<Self>) {
        let Some(&link) = self.up.get(&r.peer) else {
            let _ = r.tx.send(Err(LookupError::NotConnected));
            return;
        };
        let req = self.pending.lookup(link, r.tx);
        self.queue(link, &Frame::Lookup { req, name: r.name });
    }
}

impl Handler<SendReply> for NodeActor {
    fn handle(&mut self, r: SendReply, _ctx: &mut Context<Self>) {
        if let Some(l) = self.links.get_mut(&r.link) {
            l.reply_written();
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
            libc::EBADF | libc::EINVAL => {
                ctx.stop_with(StopReason::Failed("the listening socket is unusable".into()))
            }
            0 => self.arm_accept(ctx),
            // Out of slots or fds, SQ full, or anything else: go on after a
            // pause, never in a busy loop.
            _ => {
                self.shared.counters.accept_retries.fetch_add(1, Ordering::Relaxed);
                ctx.send_after(Duration::from_millis(5), Rearm(0));
            }
        }
    }
}
