//! Pub-sub for the KV: `SUBSCRIBE`, `PSUBSCRIBE`, `UNSUBSCRIBE`,
//! `PUNSUBSCRIBE` and `PUBLISH`, across workers, on the framework's groups.
//!
//! Every worker keeps the subscriptions of its own connections
//! ([`Subscriptions`]) and is a member of the server's group of workers
//! (`kv-pubsub-<port>`, a [`ringmail::Group`]). `PUBLISH` on any worker
//! sends a [`Publish`] to every member (itself included): each delivers the
//! message to its subscribers and answers the count, and the publisher's
//! reply is the sum, as Redis' is. While no connection of the server
//! listens to anything, `PUBLISH` answers 0 on the spot (see
//! [`Subscriptions`]). A subscriber gets each publication once,
//! in the order one publisher published (the per-sender order of `tell`);
//! a worker whose mailbox is full holds the publishing worker back as any
//! send does (the actor pauses, never its shard).
//!
//! A message reaches a connection as Redis' `message` (or `pmessage`)
//! array, a RESP3 push (`>`) after `HELLO 3`. It queues behind the
//! replies the connection is still owed, so replies stay in order; a
//! subscriber that does not read is cut off by the connection's output
//! limit, as any slow reader is.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ringmail::net::ConnId;
use ringmail::{ActorRef, Message};

use super::engine::glob;
use super::resp::Reply;
use super::server::KvWorker;

/// One publication, from the worker that got the `PUBLISH` to every worker.
#[derive(Debug)]
pub struct Publish {
    /// The channel.
    pub channel: Vec<u8>,
    /// The message.
    pub message: Vec<u8>,
    /// The publishing worker, which gathers the counts.
    pub origin: ActorRef<KvWorker>,
    /// The `PUBLISH` request: its connection, sequence number and this
    /// worker's part of its reply.
    pub conn: ConnId,
    /// See `conn`.
    pub seq: u64,
    /// See `conn`.
    pub part: u32,
}

impl Message for Publish {
    type Reply = ();
}

/// One worker's subscriptions, both ways: what each connection is
/// subscribed to (for its replies' counts and its close), and who listens
/// on each channel and pattern (for delivery).
///
/// It also keeps a count shared by every worker of the server: the
/// connections subscribed to anything, server-wide.
/// While it is zero a `PUBLISH` reaches nobody, so it answers 0 at once,
/// with no message to any worker (Redis' answer when no one listens). The
/// count rises before a `SUBSCRIBE` is confirmed, so a publication that
/// follows a confirmation the client has seen is never skipped.
#[derive(Default, Debug)]
pub struct Subscriptions {
    channels: HashMap<Vec<u8>, HashSet<ConnId>>,
    patterns: HashMap<Vec<u8>, HashSet<ConnId>>,
    /// Per connection: its channels, its patterns.
    of_conn: HashMap<ConnId, (Names, Names)>,
    /// Subscribed connections of every worker sharing it.
    listening: Arc<AtomicUsize>,
    /// This worker's part of `listening` (`of_conn.len()` when last synced).
    reported: usize,
}

/// Channel or pattern names.
type Names = HashSet<Vec<u8>>;

/// Which list a command works on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Channels (`SUBSCRIBE`).
    Channel,
    /// Patterns (`PSUBSCRIBE`).
    Pattern,
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(b.to_vec())
}

impl Subscriptions {
    /// A worker's subscriptions, counted in `listening` with those of the
    /// other workers given the same count.
    pub fn shared(listening: Arc<AtomicUsize>) -> Subscriptions {
        Subscriptions { listening, ..Subscriptions::default() }
    }

    /// Whether any connection of any worker sharing the count listens to
    /// anything (false: a publication reaches nobody).
    pub fn anyone_listening(&self) -> bool {
        self.listening.load(Ordering::Acquire) > 0
    }

    /// Brings the shared count in step with this worker's subscribed
    /// connections; called at the end of every change, before its replies
    /// are sent.
    fn sync(&mut self) {
        let now = self.of_conn.len();
        if now > self.reported {
            self.listening.fetch_add(now - self.reported, Ordering::Release);
        } else if now < self.reported {
            self.listening.fetch_sub(self.reported - now, Ordering::Release);
        }
        self.reported = now;
    }

    /// How many channels and patterns `conn` listens to.
    pub fn count(&self, conn: ConnId) -> usize {
        self.of_conn.get(&conn).map_or(0, |(c, p)| c.len() + p.len())
    }

    /// `SUBSCRIBE` / `PSUBSCRIBE`: one confirmation per name, each with
    /// the connection's count after it.
    pub fn subscribe(&mut self, conn: ConnId, kind: Kind, names: &[Vec<u8>]) -> Vec<Reply> {
        let word: &[u8] = if kind == Kind::Channel { b"subscribe" } else { b"psubscribe" };
        let mut out = Vec::new();
        for name in names {
            let (chans, pats) = self.of_conn.entry(conn).or_default();
            let (mine, index) = match kind {
                Kind::Channel => (chans, &mut self.channels),
                Kind::Pattern => (pats, &mut self.patterns),
            };
            if mine.insert(name.clone()) {
                index.entry(name.clone()).or_default().insert(conn);
            }
            out.push(Reply::Push(vec![
                bulk(word),
                bulk(name),
                Reply::Int(self.count(conn) as i64),
            ]));
        }
        self.sync();
        out
    }

    /// `UNSUBSCRIBE` / `PUNSUBSCRIBE` (`names` empty: all of that kind).
    pub fn unsubscribe(&mut self, conn: ConnId, kind: Kind, names: &[Vec<u8>]) -> Vec<Reply> {
        let word: &[u8] = if kind == Kind::Channel { b"unsubscribe" } else { b"punsubscribe" };
        let names: Vec<Vec<u8>> = match names {
            // All of them, in name order (Redis' is its table's order).
            [] => self.of_conn.get(&conn).map_or_else(Vec::new, |(c, p)| {
                let mine = if kind == Kind::Channel { c } else { p };
                let mut all: Vec<Vec<u8>> = mine.iter().cloned().collect();
                all.sort();
                all
            }),
            some => some.to_vec(),
        };
        if names.is_empty() {
            // Redis answers an unsubscribe from nothing with a nil name.
            return vec![Reply::Push(vec![
                bulk(word),
                Reply::Nil,
                Reply::Int(self.count(conn) as i64),
            ])];
        }
        let mut out = Vec::new();
        for name in names {
            if let Some((chans, pats)) = self.of_conn.get_mut(&conn) {
                let (mine, index) = match kind {
                    Kind::Channel => (chans, &mut self.channels),
                    Kind::Pattern => (pats, &mut self.patterns),
                };
                if mine.remove(&name) {
                    if let Some(set) = index.get_mut(&name) {
                        set.remove(&conn);
                        if set.is_empty() {
                            index.remove(&name);
                        }
                    }
                }
            }
            out.push(Reply::Push(vec![
                bulk(word),
                bulk(&name),
                Reply::Int(self.count(conn) as i64),
            ]));
        }
        if self.count(conn) == 0 {
            self.of_conn.remove(&conn);
        }
        self.sync();
        out
    }

    /// Forgets a connection that closed (or was `RESET`).
    pub fn drop_conn(&mut self, conn: ConnId) {
        let Some((chans, pats)) = self.of_conn.remove(&conn) else { return };
        self.sync();
        for (names, index) in [(chans, &mut self.channels), (pats, &mut self.patterns)] {
            for name in names {
                if let Some(set) = index.get_mut(&name) {
                    set.remove(&conn);
                    if set.is_empty() {
                        index.remove(&name);
                    }
                }
            }
        }
    }

    /// What a publication on `channel` sends, to whom: a `message` to each
    /// subscriber of the channel, a `pmessage` to each of every matching
    /// pattern (a connection on both gets both, as in Redis).
    pub fn deliveries(&self, channel: &[u8], message: &[u8]) -> Vec<(ConnId, Reply)> {
        let mut out = Vec::new();
        if let Some(conns) = self.channels.get(channel) {
            for &c in conns {
                out.push((c, Reply::Push(vec![bulk(b"message"), bulk(channel), bulk(message)])));
            }
        }
        for (pattern, conns) in &self.patterns {
            if glob(pattern, channel) {
                for &c in conns {
                    let push = vec![bulk(b"pmessage"), bulk(pattern), bulk(channel), bulk(message)];
                    out.push((c, Reply::Push(push)));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn subscribe_unsubscribe_and_deliveries_keep_both_indexes_in_step() {
        let mut s = Subscriptions::default();
        let (c1, c2) = (ConnId(1), ConnId(2));
        let r = s.subscribe(c1, Kind::Channel, &[b("news"), b("sport")]);
        assert_eq!(r.len(), 2);
        assert_eq!(r[1], Reply::Push(vec![bulk(b"subscribe"), bulk(b"sport"), Reply::Int(2)]));
        s.subscribe(c1, Kind::Channel, &[b("news")]); // again: no change
        assert_eq!(s.count(c1), 2);
        s.subscribe(c2, Kind::Pattern, &[b("n*")]);
        let d = s.deliveries(b"news", b"hi");
        assert_eq!(d.len(), 2);
        assert!(d.contains(&(
            c2,
            Reply::Push(vec![bulk(b"pmessage"), bulk(b"n*"), bulk(b"news"), bulk(b"hi")])
        )));
        assert!(s.deliveries(b"weather", b"x").is_empty());
        let r = s.unsubscribe(c1, Kind::Channel, &[]);
        assert_eq!(r.len(), 2, "all of them, one reply each");
        assert_eq!(s.count(c1), 0);
        assert_eq!(s.deliveries(b"news", b"hi").len(), 1);
        let r = s.unsubscribe(c1, Kind::Channel, &[]);
        assert_eq!(r, vec![Reply::Push(vec![bulk(b"unsubscribe"), Reply::Nil, Reply::Int(0)])]);
        s.drop_conn(c2);
        assert!(s.deliveries(b"news", b"hi").is_empty());
        assert!(s.channels.is_empty() && s.patterns.is_empty() && s.of_conn.is_empty());
    }

    #[test]
    fn the_shared_count_follows_subscribed_connections_of_every_worker() {
        let listening = Arc::new(AtomicUsize::new(0));
        let (mut one, mut two) =
            (Subscriptions::shared(listening.clone()), Subscriptions::shared(listening.clone()));
        let (c1, c2, c3) = (ConnId(1), ConnId(2), ConnId(3));
        assert!(!one.anyone_listening());
        one.subscribe(c1, Kind::Channel, &[b("news"), b("sport")]);
        assert!(two.anyone_listening(), "a subscription on one worker is seen by the others");
        assert_eq!(listening.load(Ordering::Relaxed), 1, "connections, not channels");
        two.subscribe(c2, Kind::Pattern, &[b("n*")]);
        two.subscribe(c3, Kind::Channel, &[b("x")]);
        assert_eq!(listening.load(Ordering::Relaxed), 3);
        one.unsubscribe(c1, Kind::Channel, &[b("news")]);
        assert_eq!(listening.load(Ordering::Relaxed), 3, "c1 still listens to sport");
        one.unsubscribe(c1, Kind::Channel, &[]);
        two.unsubscribe(c2, Kind::Pattern, &[b("elsewhere")]);
        assert_eq!(listening.load(Ordering::Relaxed), 2);
        two.drop_conn(c2);
        two.drop_conn(c3);
        two.drop_conn(c3);
        assert_eq!(listening.load(Ordering::Relaxed), 0);
        assert!(!one.anyone_listening());
    }
}
