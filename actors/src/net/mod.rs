//! Network services as actor graphs: an [`Acceptor`] that owns a listening
//! socket and hands every connection to a worker actor on another ring, and
//! [`Connections`], the part of a worker that serves many connections on
//! its own ring.
//!
//! # The pattern
//!
//! ```text
//!  clients ──► Acceptor (own shard)            ┌──► worker 1 (shard 1): Connections
//!              multishot accept into its   ───┤
//!              fixed-file table, then          └──► worker 2 (shard 2): Connections
//!              IORING_MSG_SEND_FD                        │ multishot recv, batched sends
//! ```
//!
//! * **Accept.** One multishot accept puts every new connection straight
//!   into the acceptor ring's fixed-file table: no fd number is ever
//!   created in the process's fd table.
//! * **Hand-off.** Each connection goes to the next worker, round-robin,
//!   with [`ActorRef::tell_fd`] (`IORING_MSG_SEND_FD`, linked to a `CLOSE`
//!   of the acceptor's slot). A worker whose mailbox is full or that has
//!   stopped is skipped. When no worker can take it now (every mailbox is
//!   full: a burst of connections against busy workers), the acceptor
//!   keeps it, in order, and tries again every millisecond
//!   ([`AcceptorStats::waiting`]); only past [`MAX_WAITING`] kept
//!   connections, or when every worker has stopped, is one closed and
//!   counted ([`AcceptorStats::rejected`]). A hand-off the kernel refuses
//!   later comes back to the acceptor's ring, which closes it.
//! * **Serve.** The worker adds the connection to its [`Connections`]:
//!   one multishot receive per connection over the shard's provided
//!   buffers, and at most one send in flight per connection, carrying all
//!   the output written since the last one (so a pipelining client gets
//!   many replies per `send`, and all sends of one loop turn go to the
//!   kernel in one `io_uring_enter`). A large buffer handed over whole
//!   ([`Connections::write_vec`]) is sent from where it lies, on its own,
//!   instead of being copied behind the rest.
//!
//! # Ownership of a connection
//!
//! At every moment exactly one ring's table holds the socket: the
//! acceptor's until the hand-off completes, then the worker's (or the
//! acceptor's again if it was refused), until [`Connections`] drops it
//! after its receive ended and its last send completed. Dropping the
//! [`FixedFd`] closes the socket.
//!
//! # Capacity
//!
//! Each connection holds one multishot receive, and at times a send and a
//! shutdown, against the shard's I/O limit (`RingConfig::io_reserve / 2`
//! operations). With the default ring settings a worker serves about 120
//! connections; [`Connections::add`] refuses more (`EBUSY`, the connection
//! is closed). Servers raise `io_reserve`, `cq_entries` and `fixed_files`:
//! [`SystemConfig::server`](crate::SystemConfig::server) does (thousands
//! per worker). Each receive completion takes one of the shard's provided
//! buffers however few bytes it brings; when more connections send at
//! once than there are buffers, receives end (`Recv::NoBuffers`) and are
//! armed again at once, which works but costs about twice the CPU per
//! request: size `RingConfig::recv_buffers` by connections, not bytes.
//!
//! # Messages, not bytes
//!
//! [`Input::Data`] carries bytes as TCP delivered them: a message may come
//! in pieces, or several at once. [`frame::Framer`] cuts them back into
//! lines or length-prefixed frames, one framer per connection.
//!
//! # Slow and vanishing clients
//!
//! Output waits in the connection's buffer while a send is in flight; past
//! [`Connections::with_output_limit`] (default 64 MiB) the client is too
//! slow and is disconnected (like Redis' client output buffer limit).
//! Partial sends continue where they stopped. A client that disconnects
//! mid-message ends the receive (`Closed` or an error): the worker gets
//! [`Input::Closed`] once, and the socket is closed when its last send is
//! done.

pub mod frame;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ringmail_transport::FixedFd;

pub use crate::actor::ShardFd;
use crate::actor::{Actor, ActorRef, Context, FdHandler, Handler, Message};
use crate::io::{Accept, IoDone, IoOp, Recv};

/// The message an [`Acceptor`] sends with each connection.
#[derive(Debug)]
pub struct NewConnection {
    /// Process-unique number of the connection (for logs).
    pub id: u64,
}

/// Counters of an [`Acceptor`].
#[derive(Debug, Default)]
pub struct AcceptorStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections handed to a worker (the hand-off was accepted; a
    /// hand-off the kernel refuses later is closed by the acceptor's ring
    /// and counted as a dead letter).
    pub handed_off: AtomicU64,
    /// Connections closed because no worker could take them: every worker
    /// stopped, or [`MAX_WAITING`] connections were waiting already.
    pub rejected: AtomicU64,
    /// Connections the acceptor keeps until a worker has room (now).
    pub waiting: AtomicU64,
    /// Times the multishot accept ended and was armed again.
    pub rearmed: AtomicU64,
}

/// An actor that owns a listening socket and hands each accepted
/// connection to one of `workers` (see the module docs). Spawn it on a
/// shard of its own ([`crate::System::spawn`]): accepted connections use
/// the same fixed-file range as fds handed *to* its ring.
pub struct Acceptor<W: Actor> {
    listener: TcpListener,
    workers: Vec<ActorRef<W>>,
    stats: Arc<AcceptorStats>,
    /// Connections no worker could take yet, oldest first.
    waiting: std::collections::VecDeque<(u64, ShardFd)>,
    /// A `RetryHandOff` is on its way.
    retry_armed: bool,
    /// The worker a retried hand-off tries first (round-robin).
    next: usize,
}

/// The most connections an [`Acceptor`] keeps while every worker is full;
/// past it, new ones are closed (and counted as rejected).
pub const MAX_WAITING: u64 = 1024;

impl<W: Actor> std::fmt::Debug for Acceptor<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("listener", &self.listener)
            .field("workers", &self.workers)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<W: FdHandler<NewConnection>> Acceptor<W> {
    /// An acceptor for `listener` handing connections to `workers`
    /// (round-robin). Panics if `workers` is empty.
    ///
    /// It turns Nagle's algorithm off on the listener, so every connection
    /// it accepts inherits `TCP_NODELAY` (as Redis does for its clients): a
    /// reply written after an earlier one of the same request batch goes
    /// out at once instead of waiting for the client's delayed ACK (40 ms).
    pub fn new(listener: TcpListener, workers: Vec<ActorRef<W>>) -> Self {
        assert!(!workers.is_empty(), "an acceptor needs at least one worker");
        // Best effort: a listener that refuses it still serves.
        let _ = socket2::SockRef::from(&listener).set_tcp_nodelay(true);
        Acceptor {
            listener,
            workers,
            stats: Arc::new(AcceptorStats::default()),
            waiting: std::collections::VecDeque::new(),
            retry_armed: false,
            next: 0,
        }
    }

    /// The acceptor's counters (shared: read them while it runs).
    pub fn stats(&self) -> Arc<AcceptorStats> {
        self.stats.clone()
    }

    fn arm(&mut self, ctx: &mut Context<Self>) {
        let workers = self.workers.clone();
        let stats = self.stats.clone();
        let me = ctx.myself().clone();
        let mut next = 0usize;
        let on = move |ev: Accept| match ev {
            Accept::Conn(fd) => {
                stats.accepted.fetch_add(1, Ordering::Relaxed);
                let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
                // Behind those already waiting, in order.
                let r = if stats.waiting.load(Ordering::Relaxed) > 0 {
                    Err(fd)
                } else {
                    hand_off(&workers, &mut next, id, fd, &stats)
                };
                if let Err(fd) = r {
                    keep_waiting(&me, id, fd, &stats);
                }
            }
            Accept::Ended(e) => me.deliver_forced(Rearm(errno(e.as_ref()))),
        };
        if ctx.accept_multi(self.listener.as_fd(), on).is_err() {
            // SQ full or the shard's I/O limit reached: try again shortly.
            ctx.send_after(Duration::from_millis(5), Rearm(libc::EBUSY));
        }
    }
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// Hands connection `id` to the next worker that takes it; the fd comes
/// back when none can now (and is closed, counted, when every worker has
/// stopped: then none ever will).
fn hand_off<W: FdHandler<NewConnection>>(
    workers: &[ActorRef<W>],
    next: &mut usize,
    id: u64,
    mut fd: FixedFd,
    stats: &AcceptorStats,
) -> Result<(), FixedFd> {
    let n = workers.len();
    for i in 0..n {
        let w = &workers[(*next + i) % n];
        match w.try_tell_fd(NewConnection { id }, fd) {
            Ok(()) => {
                *next = (*next + i + 1) % n;
                stats.handed_off.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) => fd = e.into_inner().1,
        }
    }
    if workers.iter().all(|w| !w.is_alive()) {
        stats.rejected.fetch_add(1, Ordering::Relaxed);
        drop(fd); // closes the connection: no worker will ever take it
        return Ok(());
    }
    Err(fd)
}

/// Gives a connection no worker could take now to the acceptor itself
/// (past its mailbox bound: it is the acceptor's own ring), to wait for
/// room; past [`MAX_WAITING`] waiting, it is closed and counted.
fn keep_waiting<W: FdHandler<NewConnection>>(
    me: &ActorRef<Acceptor<W>>,
    id: u64,
    fd: FixedFd,
    stats: &Arc<AcceptorStats>,
) {
    if stats.waiting.load(Ordering::Relaxed) >= MAX_WAITING {
        stats.rejected.fetch_add(1, Ordering::Relaxed);
        return; // dropping `fd` closes the connection
    }
    stats.waiting.fetch_add(1, Ordering::Relaxed);
    // If it never reaches the acceptor (stopping), its drop counts it.
    let _ = me.tell_fd_forced(Waiting(id, Some(stats.clone())), fd);
}

/// A connection no worker could take yet, on its way to the acceptor's
/// list. Dropped on the way (the acceptor stopped), it counts itself out
/// of `waiting` and into `rejected` (its fd is closed with it).
struct Waiting(u64, Option<Arc<AcceptorStats>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(stats) = self.1.take() {
            stats.waiting.fetch_sub(1, Ordering::Relaxed);
            stats.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Try the waiting connections again.
#[derive(Debug)]
struct RetryHandOff;
impl Message for RetryHandOff {
    type Reply = ();
}

impl<W: FdHandler<NewConnection>> FdHandler<Waiting> for Acceptor<W> {
    fn handle_fd(&mut self, mut w: Waiting, fd: FixedFd, ctx: &mut Context<Self>) {
        w.1 = None; // counted in `waiting` from here on by the list
        self.waiting.push_back((w.0, ctx.keep_fd(fd)));
        self.arm_retry(ctx);
    }
}

impl<W: FdHandler<NewConnection>> Handler<RetryHandOff> for Acceptor<W> {
    fn handle(&mut self, _: RetryHandOff, ctx: &mut Context<Self>) {
        self.retry_armed = false;
        while let Some((id, kept)) = self.waiting.pop_front() {
            let Ok(fd) = kept.into_fixed() else {
                // Kept on this shard and taken back on it: cannot fail; if
                // it ever did, the connection is closed and counted.
                self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            match hand_off(&self.workers, &mut self.next, id, fd, &self.stats) {
                Ok(()) => {
                    self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                }
                Err(fd) => {
                    // Still no room: it stays first in line.
                    self.waiting.push_front((id, ctx.keep_fd(fd)));
                    break;
                }
            }
        }
        self.arm_retry(ctx);
    }
}

impl<W: FdHandler<NewConnection>> Acceptor<W> {
    fn arm_retry(&mut self, ctx: &mut Context<Self>) {
        if self.waiting.is_empty() || self.retry_armed {
            return;
        }
        self.retry_armed = true;
        // Never refused (see `Context::send_after`).
        ctx.send_after(Duration::from_millis(1), RetryHandOff);
    }
}

/// The errno of an error (0 for none or one without an errno).
pub(crate) fn errno(e: Option<&io::Error>) -> i32 {
    e.and_then(io::Error::raw_os_error).unwrap_or(0)
}

/// The acceptor's multishot accept ended (with this errno): arm it again.
#[derive(Debug)]
struct Rearm(i32);
impl Message for Rearm {
    type Reply = ();
}

impl<W: FdHandler<NewConnection>> Actor for Acceptor<W> {
    fn started(&mut self, ctx: &mut Context<Self>) {
        self.arm(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // Connections still waiting close with the acceptor: counted.
        let n = self.waiting.len() as u64;
        self.waiting.clear();
        self.stats.waiting.fetch_sub(n, Ordering::Relaxed);
        self.stats.rejected.fetch_add(n, Ordering::Relaxed);
    }
}

impl<W: FdHandler<NewConnection>> Handler<Rearm> for Acceptor<W> {
    fn handle(&mut self, Rearm(errno): Rearm, ctx: &mut Context<Self>) {
        self.stats.rearmed.fetch_add(1, Ordering::Relaxed);
        match errno {
            // The table is full of connections not yet handed off (or the
            // process is out of fds), or the SQ was: wait, then go on.
            libc::ENFILE | libc::EMFILE | libc::EBUSY => {
                ctx.send_after(Duration::from_millis(5), Rearm(0));
            }
            libc::EBADF | libc::EINVAL => ctx.stop_with(crate::StopReason::Failed(format!(
                "the listening socket is unusable (errno {errno})"
            ))),
            0 => self.arm(ctx),
            // Anything else (ECONNABORTED, ENOMEM, ...): go on after a pause,
            // never in a busy loop.
            _ => {
                ctx.send_after(Duration::from_millis(5), Rearm(0));
            }
        }
    }
}

/// A connection of a [`Connections`] set.
///
/// Unique within its set (one worker), for the life of the set: ids are
/// never reused. Two workers hand out the same ids, so a key that must be
/// unique across workers pairs it with the worker's actor id
/// ([`ActorRef::id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u64);

/// I/O completions of a worker's connections: the worker actor implements
/// `Handler<NetEvent>` and passes each one to [`Connections::handle`].
#[derive(Debug)]
pub enum NetEvent {
    /// A receive completion.
    Recv(ConnId, Recv),
    /// A send completion.
    Sent(ConnId, IoDone),
    /// A shutdown completion, with its result.
    Shut(ConnId, io::Result<()>),
}

impl Message for NetEvent {
    type Reply = ();
}

/// What a connection did, for the worker.
#[derive(Debug)]
pub enum Input {
    /// Bytes received, in order. A `Bytes` to hand on as it is: to
    /// another actor, to a [`frame::Framer`], or back out with
    /// [`Connections::write_bytes`], without a copy.
    Data(ConnId, Bytes),
    /// The connection is gone (peer closed, error, or closed by us, once
    /// its output was sent); reported once, when its slot in the ring's
    /// file table is emptied. The kernel releases the socket itself once
    /// the last request that used it is freed (at the ring's next pass
    /// over completions), so a peer may see the close a moment later.
    Closed(ConnId),
}

/// Writes of at most this many bytes are copied into the connection's
/// open output buffer, so that one send carries many of them; larger
/// buffers given whole are queued as they are.
const COALESCE: usize = 16 << 10;

/// A connection's output that no send has taken yet: buffers in order.
/// Small writes are appended to the last buffer while it is open (made by
/// appends); a buffer given whole is queued closed, as it is, and sent on
/// its own without a copy.
#[derive(Default)]
struct Output {
    bufs: VecDeque<Vec<u8>>,
    /// Bytes in `bufs`.
    len: usize,
    /// The last buffer takes appends.
    open: bool,
}

impl Output {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn clear(&mut self) {
        self.bufs.clear();
        self.len = 0;
        self.open = false;
    }

    /// Appends a copy of `bytes` (a new open buffer from `spare` when the
    /// last one is closed).
    fn append(&mut self, bytes: &[u8], spare: &mut Vec<u8>) {
        if bytes.is_empty() {
            return; // (never a buffer to send with nothing in it)
        }
        match self.bufs.back_mut() {
            Some(last) if self.open => last.extend_from_slice(bytes),
            _ => {
                let mut b = std::mem::take(spare);
                b.clear();
                b.extend_from_slice(bytes);
                self.bufs.push_back(b);
                self.open = true;
            }
        }
        self.len += bytes.len();
    }

    /// Queues `buf` as it is, closed.
    fn push_whole(&mut self, buf: Vec<u8>) {
        self.len += buf.len();
        self.bufs.push_back(buf);
        self.open = false;
    }

    /// Puts what a send did not take back in front.
    fn push_front(&mut self, buf: Vec<u8>) {
        if self.bufs.is_empty() {
            self.open = false;
        }
        self.len += buf.len();
        self.bufs.push_front(buf);
    }

    /// The next buffer to send.
    fn pop_front(&mut self) -> Option<Vec<u8>> {
        let b = self.bufs.pop_front()?;
        self.len -= b.len();
        if self.bufs.is_empty() {
            self.open = false;
        }
        Some(b)
    }
}

struct Conn {
    fd: ShardFd,
    /// Written, not yet sent.
    out: Output,
    /// The in-flight send's buffer comes back here for reuse.
    spare: Vec<u8>,
    sending: bool,
    /// The send in flight is a zero-copy one.
    sending_zc: bool,
    /// Bytes of the send in flight.
    in_flight: usize,
    receiving: bool,
    /// Closed by us (after `out` is sent) or by the peer.
    closing: bool,
    /// Closing at once, output dropped (output limit, send error): the
    /// socket is shut down even while a send is stuck.
    abort: bool,
    /// A shutdown was issued / its completion has not come yet. The
    /// connection (and its slot) is kept until it has: an op that names a
    /// slot must never meet a reused slot.
    shut: bool,
    shut_pending: bool,
}

/// The connections a worker actor serves on its shard's ring. See the
/// module docs.
pub struct Connections {
    conns: HashMap<u64, Conn>,
    dirty: Vec<u64>,
    next: u64,
    limit: usize,
    /// Sends of at least this many bytes use `SEND_ZC` (`None`: never, or
    /// no longer: the kernel refused it once).
    zero_copy_above: Option<usize>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("open", &self.conns.len())
            .field("output_limit", &self.limit)
            .field("zero_copy_above", &self.zero_copy_above)
            .finish_non_exhaustive()
    }
}

impl Default for Connections {
    fn default() -> Self {
        Self::new()
    }
}

impl Connections {
    /// An empty set with the default output limit (64 MiB per connection).
    pub fn new() -> Self {
        Self::with_output_limit(64 << 20)
    }

    /// An empty set whose connections are disconnected when more than
    /// `limit` bytes of output wait for a slow client.
    pub fn with_output_limit(limit: usize) -> Self {
        Connections {
            conns: HashMap::new(),
            dirty: Vec::new(),
            next: 1,
            limit,
            zero_copy_above: None,
        }
    }

    /// Sends of at least `bytes` go out with `IORING_OP_SEND_ZC`: the
    /// kernel transmits from the buffer itself instead of copying it into
    /// the socket, and the buffer stays the framework's until the kernel's
    /// notification. It pays off for large sends over a real network card;
    /// on loopback the kernel copies anyway. `None` turns it off. A kernel
    /// or socket that refuses it turns it off for this set, and the send
    /// goes again as a plain one.
    pub fn zero_copy_above(mut self, bytes: Option<usize>) -> Self {
        self.zero_copy_above = bytes;
        self
    }

    /// Bytes written to `conn` that the kernel has not taken yet (queued
    /// plus the send in flight); 0 for an unknown connection.
    pub fn backlog(&self, conn: ConnId) -> usize {
        self.conns.get(&conn.0).map_or(0, |c| c.out.len() + c.in_flight)
    }

    /// Open connections.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True when no connection is open.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The connections that take writes now (open, not closing), in no
    /// particular order: to broadcast, or to close them all.
    pub fn ids(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.conns.iter().filter(|(_, c)| !c.closing).map(|(id, _)| ConnId(*id))
    }

    /// Starts serving `fd`: arms its multishot receive. On error the
    /// connection is closed and the error returned.
    pub fn add<A: Handler<NetEvent>>(
        &mut self,
        fd: FixedFd,
        ctx: &Context<A>,
    ) -> io::Result<ConnId> {
        // Room for its receive, a send and a shutdown, or it is refused now
        // rather than starved later.
        if crate::runtime::thread::io_free() < 3 {
            return Err(io::Error::from_raw_os_error(libc::EBUSY)); // fd closed
        }
        let id = self.next;
        self.next += 1;
        let fd = ctx.keep_fd(fd);
        ctx.recv_multi(&fd, move |r| NetEvent::Recv(ConnId(id), r))?;
        self.conns.insert(
            id,
            Conn {
                fd,
                out: Output::default(),
                spare: Vec::new(),
                sending: false,
                sending_zc: false,
                in_flight: 0,
                receiving: true,
                closing: false,
                abort: false,
                shut: false,
                shut_pending: false,
            },
        );
        Ok(ConnId(id))
    }

    /// Handles one completion; returns what the connection did, if anything
    /// the worker must know.
    pub fn handle<A: Handler<NetEvent>>(
        &mut self,
        ev: NetEvent,
        ctx: &Context<A>,
    ) -> Option<Input> {
        let id = match &ev {
            NetEvent::Recv(id, _) | NetEvent::Sent(id, _) | NetEvent::Shut(id, _) => *id,
        };
        match ev {
            NetEvent::Recv(id, r) => {
                let c = self.conns.get_mut(&id.0)?;
                match r {
                    Recv::Data(d) if !c.closing => return Some(Input::Data(id, Bytes::from(d))),
                    Recv::Data(_) => return None, // closing: input is no longer read
                    Recv::NoBuffers => {
                        // Buffers are recycled as soon as data is copied out:
                        // arming again at once finds them free.
                        if ctx.recv_multi(&c.fd, move |r| NetEvent::Recv(id, r)).is_err() {
                            c.receiving = false;
                            c.closing = true;
                        }
                    }
                    _ => {
                        c.receiving = false;
                        c.closing = true;
                    }
                }
            }
            NetEvent::Sent(id, done) => {
                let c = self.conns.get_mut(&id.0)?;
                c.sending = false;
                c.in_flight = 0;
                let was_zc = std::mem::take(&mut c.sending_zc);
                let mut buf = done.buf.unwrap_or_default();
                let failed = errno(done.result.as_ref().err());
                let no_zc = was_zc && (failed == libc::EOPNOTSUPP || failed == libc::EINVAL);
                if no_zc {
                    // This kernel or socket has no zero-copy send: nothing
                    // was sent; plain sends from now on.
                    self.zero_copy_above = None;
                }
                if (failed == libc::EBUSY || no_zc) && !c.abort {
                    // Not submitted (the shard's I/O limit): nothing was
                    // sent; it goes first at the next flush.
                    c.out.push_front(buf);
                    self.dirty.push(id.0);
                    return self.settle(id, ctx, true);
                }
                let sent = done.result.as_ref().map_or(0, |n| *n as usize);
                if done.result.is_err() || c.abort {
                    // The peer is gone (EPIPE, ECONNRESET), or we gave up on it.
                    c.closing = true;
                    c.abort = true;
                    c.out.clear();
                } else if was_zc {
                    // A zero-copy send hands back only what it did not send
                    // (its buffer is the kernel's until the notification).
                    if !buf.is_empty() {
                        c.out.push_front(std::mem::take(&mut buf));
                    }
                } else if sent < buf.len() {
                    // A partial send: the rest goes first next time.
                    buf.drain(..sent);
                    c.out.push_front(std::mem::take(&mut buf));
                }
                if buf.capacity() > 0 {
                    buf.clear();
                    c.spare = buf;
                }
                if !c.out.is_empty() {
                    self.dirty.push(id.0);
                    self.flush(ctx);
                }
            }
            NetEvent::Shut(id, result) => {
                let c = self.conns.get_mut(&id.0)?;
                c.shut_pending = false;
                if result.is_err_and(|e| e.raw_os_error() != Some(libc::ENOTCONN)) {
                    c.shut = false; // not submitted (I/O limit): try again
                }
            }
        }
        self.settle(id, ctx, true)
    }

    /// Queues `bytes` for `conn` (sent by the next [`flush`](Self::flush)).
    /// False if the connection is closed or closing.
    pub fn write(&mut self, conn: ConnId, bytes: &[u8]) -> bool {
        let Some(c) = self.conns.get_mut(&conn.0) else { return false };
        if c.closing {
            return false;
        }
        if c.out.len() + c.in_flight + bytes.len() > self.limit {
            // Too slow a reader: disconnect it now, even mid-send.
            c.closing = true;
            c.abort = true;
            c.out.clear();
            self.dirty.push(conn.0);
            return false;
        }
        if c.out.is_empty() {
            self.dirty.push(conn.0);
        }
        c.out.append(bytes, &mut c.spare);
        true
    }

    /// Queues `buf` for `conn`, as [`write`](Self::write) does; a buffer
    /// larger than a few kilobytes is sent as it is (not copied behind
    /// the output queued before it, which goes first).
    pub fn write_vec(&mut self, conn: ConnId, buf: Vec<u8>) -> bool {
        if buf.len() <= COALESCE {
            return self.write(conn, &buf);
        }
        let Some(c) = self.conns.get_mut(&conn.0) else { return false };
        if c.closing {
            return false;
        }
        if c.out.len() + c.in_flight + buf.len() > self.limit {
            return self.write(conn, &buf); // the limit's path
        }
        if c.out.is_empty() {
            self.dirty.push(conn.0);
        }
        c.out.push_whole(buf);
        true
    }

    /// Queues `bytes` for `conn`, as [`write`](Self::write) does; when
    /// nothing else is queued for it and `bytes` is the only reference to
    /// its buffer (say, the [`Input::Data`] of an echo), the buffer itself
    /// is sent, without a copy.
    pub fn write_bytes(&mut self, conn: ConnId, bytes: Bytes) -> bool {
        let Some(c) = self.conns.get_mut(&conn.0) else { return false };
        if !c.out.is_empty() || c.closing || bytes.is_empty() || !bytes.is_unique() {
            return self.write(conn, &bytes);
        }
        if c.in_flight + bytes.len() > self.limit {
            return self.write(conn, &bytes); // the limit's path
        }
        c.out.push_whole(Vec::from(bytes));
        self.dirty.push(conn.0);
        true
    }

    /// Starts a send for every connection with output and no send in
    /// flight, and finishes connections that are done.
    pub fn flush<A: Handler<NetEvent>>(&mut self, ctx: &Context<A>) {
        for id in std::mem::take(&mut self.dirty) {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            if let Some(buf) = (!c.sending).then(|| c.out.pop_front()).flatten() {
                c.sending = true;
                c.in_flight = buf.len();
                let fd = c.fd.as_fixed();
                c.sending_zc = self.zero_copy_above.is_some_and(|n| buf.len() >= n);
                let op = if c.sending_zc {
                    IoOp::SendZcFixed { fd, buf }
                } else {
                    IoOp::SendFixed { fd, buf }
                };
                ctx.io(op, move |d| NetEvent::Sent(ConnId(id), d));
            }
            let _ = self.settle(ConnId(id), ctx, false);
        }
    }

    /// Closes `conn` once the output written so far is sent.
    pub fn close<A: Handler<NetEvent>>(&mut self, conn: ConnId, ctx: &Context<A>) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.closing = true;
            self.dirty.push(conn.0);
        }
        self.flush(ctx);
    }

    /// Closes `conn` at once: the output not yet sent is dropped and the
    /// socket is shut down even while a send is stuck on a peer that does
    /// not read (as the output limit does). [`Input::Closed`] follows, as
    /// for [`close`](Self::close).
    pub fn abort<A: Handler<NetEvent>>(&mut self, conn: ConnId, ctx: &Context<A>) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.closing = true;
            c.abort = true;
            c.out.clear();
            self.dirty.push(conn.0);
        }
        self.flush(ctx);
    }

    /// Moves a closing connection towards the end: shuts its socket down
    /// once its output is sent (at once when aborting), which ends the
    /// receive; drops it once the receive ended, no send is in flight and
    /// no shutdown is pending. Only `handle` drops (and reports): every
    /// path to the end passes through a completion, so `Input::Closed` is
    /// reported exactly once, from `handle`.
    fn settle<A: Handler<NetEvent>>(
        &mut self,
        id: ConnId,
        ctx: &Context<A>,
        may_drop: bool,
    ) -> Option<Input> {
        let c = self.conns.get_mut(&id.0)?;
        if !c.closing {
            return None;
        }
        let drained = !c.sending && c.out.is_empty();
        if c.receiving && !c.shut && (drained || c.abort) {
            c.shut = true;
            c.shut_pending = true;
            ctx.io(IoOp::ShutdownFixed { fd: c.fd.as_fixed() }, move |d| {
                NetEvent::Shut(id, d.result.map(drop))
            });
        }
        if may_drop && !c.receiving && !c.sending && !c.shut_pending {
            self.conns.remove(&id.0); // drops the FixedFd: the socket closes
            return Some(Input::Closed(id));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything `out` would send, buffer by buffer.
    fn drain(out: &mut Output) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| out.pop_front()).collect()
    }

    #[test]
    fn output_batches_small_writes_and_keeps_whole_buffers_as_they_are() {
        let mut out = Output::default();
        let mut spare = Vec::with_capacity(64);
        out.append(b"ab", &mut spare);
        out.append(b"cd", &mut spare);
        assert_eq!(spare.capacity(), 0, "the spare became the open buffer");
        let big = vec![7u8; 100];
        let at = big.as_ptr();
        out.push_whole(big);
        out.append(b"ef", &mut spare); // behind a whole buffer: a new one
        out.append(b"g", &mut spare);
        assert_eq!(out.len(), 4 + 100 + 3);
        let first = out.pop_front().unwrap();
        assert_eq!(first, b"abcd");
        let whole = out.pop_front().unwrap();
        assert_eq!(whole.as_ptr(), at, "sent from where it was made");
        assert_eq!(out.len(), 3);
        // What a send left is put back in front, closed: writes go behind.
        out.push_front(b"xy".to_vec());
        out.append(b"h", &mut spare);
        assert_eq!(drain(&mut out), vec![b"xy".to_vec(), b"efgh".to_vec()]);
        assert!(out.is_empty() && out.bufs.is_empty());
        // Alone in the queue, a buffer put back takes no appends.
        out.push_front(b"z".to_vec());
        out.append(b"1", &mut spare);
        assert_eq!(drain(&mut out), vec![b"z".to_vec(), b"1".to_vec()]);
        out.append(b"2", &mut spare);
        out.clear();
        out.append(b"", &mut spare); // nothing to send: no buffer
        assert!(out.is_empty() && out.pop_front().is_none());
        assert!(out.is_empty() && out.pop_front().is_none());
    }
}
