//! Dialling peers, and which of two connections to one peer survives.
//!
//! The node keeps one [`Dial`] per address it dials or keeps ready to dial
//! again: its seeds, the listen addresses of members and peers it learnt,
//! and for a while an address that stopped answering. A dial runs on a
//! helper thread ([`spawn`]: a blocking `connect` with a timeout, then
//! `TCP_NODELAY` and `TCP_USER_TIMEOUT`), and its socket comes back to the
//! node's actor as a message. Invariants:
//!
//! * at most one dial or unauthenticated link per address at a time
//!   (`busy`);
//! * the delay between dials of an address doubles after each dial, up to
//!   the configured maximum, and is back at its first value once a dial's
//!   link has stayed up a while (`node::upkeep::SETTLED_AFTER`, 1 s);
//! * a dial that fails, or whose link closes before it stayed up that long
//!   (before the handshake completed, or refused right after it, as a
//!   quarantining peer does), counts as a failure; an address that is neither a seed nor
//!   an active member's is forgotten after [`DIAL_GIVE_UP`] failures in a
//!   row (never while a dial of it is in progress).
//!
//! When two nodes dial each other at once, each ends up with two
//! authenticated links to the other. [`duplicate`] decides, on each side
//! alone and alike on both, which one to keep: the one dialled by the node
//! with the smaller name.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

/// An address that is neither a seed nor an active member's is forgotten
/// after this many failed dials in a row (about 11 s with the default
/// backoff).
pub(crate) const DIAL_GIVE_UP: u32 = 10;

/// How long a dial's `connect` may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The dialling state of one address (see the module docs).
pub(crate) struct Dial {
    next: Instant,
    backoff: Duration,
    busy: bool,
    /// Dials in a row that did not end in an authenticated peer.
    failures: u32,
    /// A configured seed: dialled for as long as the node runs.
    seed: bool,
}

impl Dial {
    /// Due at once; then after `backoff`.
    pub(crate) fn new(backoff: Duration, seed: bool) -> Dial {
        Dial { next: Instant::now(), backoff, busy: false, failures: 0, seed }
    }

    /// No dial of it is in progress and its time has come.
    pub(crate) fn due(&self, now: Instant) -> bool {
        !self.busy && now >= self.next
    }

    /// A dial starts now: busy until it ends; the next one no sooner than
    /// the current backoff, which doubles (up to `max`).
    pub(crate) fn begin(&mut self, now: Instant, max: Duration) {
        self.busy = true;
        self.next = now + self.backoff;
        self.backoff = (self.backoff * 2).min(max);
    }

    /// The dial or its link ended, not as a failure (no thread to dial
    /// on, no room for the link, a retired duplicate).
    pub(crate) fn free(&mut self) {
        self.busy = false;
    }

    /// The dial failed (no connection).
    pub(crate) fn failed(&mut self) {
        self.busy = false;
        self.failures += 1;
    }

    /// Its link closed; a failure unless it had settled (stayed up
    /// `SETTLED_AFTER`).
    pub(crate) fn link_closed(&mut self, settled: bool) {
        self.busy = false;
        self.failures += u32::from(!settled);
    }

    /// Its link stayed up `SETTLED_AFTER`: the backoff starts over at `first`.
    pub(crate) fn succeeded(&mut self, first: Duration) {
        self.backoff = first;
        self.failures = 0;
    }

    /// The peer went down: dial again after the current backoff.
    pub(crate) fn again_after_backoff(&mut self, now: Instant) {
        self.next = now + self.backoff;
    }

    /// Whether to go on dialling it (`member`: an active member listens
    /// there).
    pub(crate) fn keep(&self, member: bool) -> bool {
        self.seed || self.busy || self.failures < DIAL_GIVE_UP || member
    }
}

/// Dials `addr` on a helper thread, and calls `done` there with the socket
/// (non-delaying, with `TCP_USER_TIMEOUT` set to `user_timeout`) or the
/// error. An error here means no thread could be started.
pub(crate) fn spawn(
    addr: SocketAddr,
    user_timeout: Duration,
    done: impl FnOnce(std::io::Result<OwnedFd>) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("ringmail-dial".into())
        .spawn(move || done(connect(addr, user_timeout)))
        .map(drop)
}

/// Connects to `addr` (blocking, up to [`CONNECT_TIMEOUT`]) and sets the
/// socket up for a peer link.
fn connect(addr: SocketAddr, user_timeout: Duration) -> std::io::Result<OwnedFd> {
    TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).and_then(not_to_itself).and_then(|s| {
        s.set_nodelay(true)?;
        socket2::SockRef::from(&s).set_tcp_user_timeout(Some(user_timeout))?;
        Ok(OwnedFd::from(s))
    })
}

/// Refuses a socket connected to itself.
///
/// A dial of a local address nobody listens on can pick that very port as
/// its own source port (TCP's simultaneous open then connects the socket to
/// itself): it happens when the port lies in the ephemeral range, as the
/// port of a peer being restarted often does. Kept, that socket would hold
/// the port the peer is about to bind (its start fails with "address in
/// use") and would greet itself until the handshake timed out. Closed at
/// once, it is an ordinary failed dial.
fn not_to_itself(s: TcpStream) -> std::io::Result<TcpStream> {
    if s.local_addr()? == s.peer_addr()? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "the dial connected the socket to itself (nobody listens on that port)",
        ));
    }
    Ok(s)
}

/// Which link to one peer survives when a second one authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Duplicate {
    /// The same peer process dialled and was dialled: keep the new link,
    /// retire the old one.
    KeepNew,
    /// Likewise, but keep the old link and retire the new one.
    KeepOld,
    /// Not a crossed dial (an old incarnation's link, or a redial of ours):
    /// the newest wins, the old link is closed.
    Replace,
}

/// The decision when a link to peer `peer` authenticates while another is
/// up: both sides keep the link dialled by the node with the smaller name,
/// and each decides alone (`me`: this node's name; `new_dialled_by_me`,
/// `old_dialled_by_me`: which side dialled each link; `same_incarnation`:
/// the old link leads to the same process).
pub(crate) fn duplicate(
    me: &str,
    peer: &str,
    new_dialled_by_me: bool,
    old_dialled_by_me: bool,
    same_incarnation: bool,
) -> Duplicate {
    if !same_incarnation || old_dialled_by_me == new_dialled_by_me {
        return Duplicate::Replace;
    }
    let i_am_smaller = me < peer;
    if new_dialled_by_me == i_am_smaller {
        Duplicate::KeepNew
    } else {
        Duplicate::KeepOld
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On node `me` (its peer: `peer`), the link dialled by `first`
    /// authenticated first and the other one second: the name of the node
    /// that dialled the link `me` keeps.
    fn kept_on<'a>(me: &'a str, peer: &'a str, first: &'a str) -> &'a str {
        let second = if first == me { peer } else { me };
        match duplicate(me, peer, second == me, first == me, true) {
            Duplicate::KeepNew => second,
            Duplicate::KeepOld => first,
            Duplicate::Replace => panic!("a crossed dial is not a replacement"),
        }
    }

    #[test]
    fn a_socket_connected_to_itself_is_a_failed_dial() {
        use socket2::{Domain, Socket, Type};
        // Simultaneous open to itself: bind a port, connect to it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.bind(&port.into()).unwrap();
        s.connect(&port.into()).expect("a socket can connect to itself");
        let s = TcpStream::from(s);
        assert_eq!(s.local_addr().unwrap(), s.peer_addr().unwrap());
        let e = not_to_itself(s).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        // A real connection passes.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert!(not_to_itself(c).is_ok());
    }

    #[test]
    fn both_sides_keep_the_link_dialled_by_the_smaller_name_in_any_order() {
        for (a, b) in [("a", "b"), ("node-2", "node-10"), ("x", "xy")] {
            let smaller = a.min(b);
            for first_on_a in [a, b] {
                for first_on_b in [a, b] {
                    let on_a = kept_on(a, b, first_on_a);
                    let on_b = kept_on(b, a, first_on_b);
                    assert_eq!(on_a, on_b, "both sides keep one link ({a}, {b})");
                    assert_eq!(on_a, smaller, "dialled by the smaller name");
                }
            }
        }
    }

    #[test]
    fn anything_but_a_crossed_dial_of_one_process_replaces_the_old_link() {
        for (new, old) in [(true, true), (false, false)] {
            assert_eq!(duplicate("a", "b", new, old, true), Duplicate::Replace);
            assert_eq!(duplicate("b", "a", new, old, true), Duplicate::Replace);
        }
        for (new, old) in [(true, false), (false, true)] {
            assert_eq!(duplicate("a", "b", new, old, false), Duplicate::Replace);
        }
        assert_eq!(duplicate("a", "b", true, false, true), Duplicate::KeepNew);
        assert_eq!(duplicate("a", "b", false, true, true), Duplicate::KeepOld);
        assert_eq!(duplicate("b", "a", true, false, true), Duplicate::KeepOld);
        assert_eq!(duplicate("b", "a", false, true, true), Duplicate::KeepNew);
    }

    #[test]
    fn backoff_doubles_up_to_the_maximum_and_starts_over_on_success() {
        let first = Duration::from_millis(50);
        let max = Duration::from_millis(300);
        let mut d = Dial::new(first, false);
        let t0 = Instant::now();
        assert!(d.due(t0));
        d.begin(t0, max);
        assert!(!d.due(t0 + Duration::from_secs(60)), "busy until the dial ends");
        d.failed();
        assert!(!d.due(t0 + Duration::from_millis(49)) && d.due(t0 + first));
        let mut t = t0;
        let mut gaps = Vec::new();
        for _ in 0..5 {
            let next = d.next;
            gaps.push(next - t);
            t = next;
            d.begin(t, max);
            d.failed();
        }
        let ms = |n| Duration::from_millis(n);
        assert_eq!(gaps, vec![ms(50), ms(100), ms(200), ms(300), ms(300)]);
        d.succeeded(first);
        d.begin(t, max);
        assert_eq!(d.next - t, first);
        d.again_after_backoff(t);
        assert_eq!(d.next - t, 2 * first, "the backoff doubled when that dial began");
    }

    #[test]
    fn an_address_is_given_up_after_failures_unless_seed_busy_or_member() {
        let mut d = Dial::new(Duration::from_millis(1), false);
        for _ in 0..DIAL_GIVE_UP - 1 {
            d.begin(Instant::now(), Duration::from_secs(1));
            d.failed();
        }
        assert!(d.keep(false));
        // Authenticated links do not count; one closed in handshake does.
        d.begin(Instant::now(), Duration::from_secs(1));
        d.link_closed(true);
        assert!(d.keep(false));
        d.begin(Instant::now(), Duration::from_secs(1));
        assert!(d.keep(false), "never while a dial is in progress");
        d.link_closed(false);
        assert!(!d.keep(false), "{DIAL_GIVE_UP} failures in a row");
        assert!(d.keep(true), "an active member's address is kept");
        let mut seed = Dial::new(Duration::from_millis(1), true);
        for _ in 0..2 * DIAL_GIVE_UP {
            seed.failed();
        }
        assert!(seed.keep(false), "a seed is dialled for as long as the node runs");
        // A success starts the count over.
        d.succeeded(Duration::from_millis(1));
        assert!(d.keep(false));
        // Freeing a dial is not a failure.
        d.begin(Instant::now(), Duration::from_secs(1));
        d.free();
        assert!(d.due(d.next) && d.keep(false));
    }

    #[test]
    fn a_dial_connects_with_nodelay_and_the_user_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        spawn(addr, Duration::from_millis(1234), move |r| tx.send(r).unwrap()).unwrap();
        let fd = rx.recv_timeout(Duration::from_secs(5)).unwrap().unwrap();
        let s = socket2::SockRef::from(&fd);
        assert!(s.tcp_nodelay().unwrap());
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_millis(1234)));
        // Nobody listening: the error comes back the same way.
        drop(listener);
        let (tx, rx) = std::sync::mpsc::channel();
        spawn(addr, Duration::from_secs(1), move |r| tx.send(r).unwrap()).unwrap();
        assert!(rx.recv_timeout(Duration::from_secs(5)).unwrap().is_err());
    }
}
