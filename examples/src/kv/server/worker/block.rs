//! `BLPOP`/`BRPOP` whose keys live on several shards. With all its keys on
//! one shard, a blocking pop is one request there, which keeps it as
//! shard state until a push serves it (`shard.rs`, [`Waiter`]). Across
//! shards no one shard can serve it alone without risking a second pop
//! elsewhere, so the worker drives it, in rounds:
//!
//! 1. **Try**: `LPOP`/`RPOP` of each key in the order given, one after the
//!    other, each on its own shard; the first element found is the reply
//!    (a `WRONGTYPE` too). At most one pop ever takes an element, and a
//!    key is looked at only after every key before it was seen empty.
//! 2. **Wait**: every shard of its keys gets a `wait-push` for its own
//!    keys: answered `:1` at once if one of them exists now (so a push
//!    between the try and the wait is not missed), else when a push or a
//!    move gives one elements, or a null array at the deadline. Nothing is
//!    popped there.
//! 3. The first `:1` ends the round: the other shards' waits are dropped
//!    (`unwait`) and the next round tries again from the first key. A null
//!    array (the deadline) or the deadline passing before a round waits is
//!    the client's null reply.
//!
//! Replies carry their round (`part`), so a late one from an earlier round
//! is ignored. The connection's next requests wait until it is answered,
//! as Redis runs nothing of a blocked client (they are parsed then). Costs and limits: a round is one round trip per key tried
//! plus one per shard waited on; a client woken when another took the
//! element waits again behind clients that blocked later (Redis serves
//! blocked clients strictly first come, first served; across shards this
//! server does not). Inside `MULTI` blocking commands run without
//! blocking, as in Redis (`commands::non_blocking`); one whose keys span
//! shards is then a move across them in its own stage of the transaction
//! (`worker/moves.rs`): the first key holding a list is popped.
//!
//! `BRPOPLPUSH`/`BLMOVE` with their two keys on two shards go the same way
//! with one key, the source: a round's try is the `LMOVE` across both
//! shards (atomic, `worker/moves.rs`: its shards held, read, written), its
//! wait a `wait-push` on the source's shard.

// The worker's own room: its types, imports and helpers.
use super::*;
use crate::kv::server::shard::block_timeout;
use crate::kv::types::side;

/// A blocking pop across shards, in the request's [`Pending`].
#[derive(Clone)]
pub(in crate::kv::server) struct Across {
    keys: Vec<Vec<u8>>,
    /// The shard of each key.
    at: Vec<usize>,
    /// `BLPOP` (else `BRPOP`).
    left: bool,
    /// None: for ever.
    deadline: Option<Instant>,
    round: u32,
    /// The key whose pop is under way; `keys.len()` while waiting.
    next: usize,
    /// The shards waited on in this round (each holds a `wait-push`).
    waiting: Vec<usize>,
    /// `BRPOPLPUSH`/`BLMOVE` (its one key is the source): the `LMOVE` a
    /// round tries, across shards as `worker/moves.rs` runs it.
    mv: Option<Vec<Vec<u8>>>,
}

/// A reply's `part`: its round, and whether it answers a wait (else a pop).
fn part(round: u32, wait: bool) -> u32 {
    (round << 1) | u32::from(wait)
}

/// What a reply to an [`Across`] asks of the worker: requests to send
/// (shard, part, arguments), and the client's reply when it is over.
#[derive(Default)]
pub(super) struct Next {
    pub(super) send: Vec<(usize, u32, Vec<Vec<u8>>)>,
    /// An `LMOVE` across shards to start (its reply fills part 0).
    pub(super) start_move: Option<Vec<Vec<u8>>>,
    pub(super) done: Option<Reply>,
}

impl Across {
    fn pop(&self, i: usize, round: u32) -> (usize, u32, Vec<Vec<u8>>) {
        let cmd = if self.left { b"LPOP".to_vec() } else { b"RPOP".to_vec() };
        (self.at[i], part(round, false), vec![cmd, self.keys[i].clone()])
    }

    /// The shards of its keys, each once, ascending.
    fn shards(&self) -> Vec<usize> {
        let mut s = self.at.clone();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// Drops this round's waits (their replies would be ignored anyway).
    fn unwait(&mut self, next: &mut Next) {
        for s in std::mem::take(&mut self.waiting) {
            next.send.push((s, u32::MAX, vec![b"unwait".to_vec()]));
        }
    }

    /// The null reply: a null bulk for a move, a null array for a pop.
    fn null(&self) -> Reply {
        if self.mv.is_some() {
            Reply::Nil
        } else {
            Reply::NullArray
        }
    }

    /// A round's first try: the move, or the first key's pop.
    fn try_first(&self, next: &mut Next) {
        match &self.mv {
            Some(mv) => next.start_move = Some(mv.clone()),
            None => next.send.push(self.pop(0, self.round)),
        }
    }

    /// Every key was seen empty: wait on each shard for its keys, or give
    /// the null reply when the deadline has passed.
    fn wait(&mut self, now: Instant, next: &mut Next) {
        let ms = match self.deadline {
            None => 0,
            Some(d) if d <= now => {
                next.done = Some(self.null());
                return;
            }
            Some(d) => (d - now).as_millis().max(1) as u64,
        };
        self.next = self.keys.len();
        self.waiting = self.shards();
        for &s in &self.waiting {
            let mut args = vec![b"wait-push".to_vec(), ms.to_string().into_bytes()];
            args.extend(
                self.keys.iter().zip(&self.at).filter(|(_, &a)| a == s).map(|(k, _)| k.clone()),
            );
            next.send.push((s, part(self.round, true), args));
        }
    }

    /// Takes in the reply to `part`.
    pub(super) fn step(&mut self, part: u32, reply: Reply, now: Instant) -> Next {
        let mut next = Next::default();
        let waiting = self.next == self.keys.len();
        if part == u32::MAX {
            return next; // an `unwait`'s answer
        }
        if part & 1 == 1 {
            // A wait's answer (this round's only).
            if part >> 1 != self.round || !waiting {
                return next;
            }
            self.unwait(&mut next);
            match reply {
                Reply::Int(_) => {
                    // One of the keys has elements now: try again from the
                    // first. (Parts stay below the moves' range: a round
                    // from a billion rounds ago has no reply left in flight.)
                    self.round = (self.round + 1) % (super::moves::MOVE_PARTS.start >> 1);
                    self.next = 0;
                    self.try_first(&mut next);
                }
                // A wait reached the deadline (or failed): the null reply.
                _ => next.done = Some(self.null()),
            }
            return next;
        }
        // A try's answer: a pop's (this round's), or the move's (part 0).
        if waiting || (self.mv.is_none() && part >> 1 != self.round) {
            return next;
        }
        match reply {
            Reply::Bulk(v) if self.mv.is_some() => next.done = Some(Reply::Bulk(v)),
            Reply::Bulk(v) => {
                let key = self.keys[self.next].clone();
                next.done = Some(Reply::Array(vec![Reply::Bulk(key), Reply::Bulk(v)]));
            }
            e @ Reply::Error(_) => next.done = Some(e),
            _ if self.mv.is_some() => {
                self.next = self.keys.len();
                self.wait(now, &mut next);
            }
            _ => {
                self.next += 1;
                if self.next < self.keys.len() {
                    next.send.push(self.pop(self.next, self.round));
                } else {
                    self.wait(now, &mut next);
                }
            }
        }
        next
    }
}

impl KvWorker {
    /// Starts `BLPOP`/`BRPOP key... timeout` whose keys are on several
    /// shards: the first key's pop goes out; the rest follows from the
    /// replies ([`Across::step`], driven by `fill`).
    pub(super) fn block_across(&mut self, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        let n = self.shards.len();
        let left = args[0].eq_ignore_ascii_case(b"blpop");
        let (keys, t) = args[1..].split_at(args.len() - 2);
        let timeout = match block_timeout(&t[0]) {
            Ok(t) => t,
            Err(e) => return Pending::ready(e),
        };
        let deadline = (!timeout.is_zero()).then(|| Instant::now() + timeout);
        let at: Vec<usize> = keys.iter().map(|k| shard_of(k, n)).collect();
        let keys = keys.to_vec();
        let a =
            Across { keys, at, left, deadline, round: 0, next: 0, waiting: Vec::new(), mv: None };
        // A close drops its waits on every shard it may wait on.
        let blocking = self.blocking.entry(conn).or_default();
        for s in a.shards() {
            if !blocking.contains(&s) {
                blocking.push(s);
            }
        }
        let (s, part, args) = a.pop(0, 0);
        self.outgoing[s].push(Req { conn, seq, part, args });
        // The connection's next requests wait for it (see `fill`).
        self.moving = true;
        Pending::awaiting(1, Combine::Across(Box::new(a)))
    }
}

impl KvWorker {
    /// Starts `BRPOPLPUSH src dst timeout` / `BLMOVE src dst from to
    /// timeout` with `src` and `dst` on two shards: rounds of an `LMOVE`
    /// across them (atomic, `worker/moves.rs`), each after the first when a
    /// `wait-push` on `src`'s shard says it has elements.
    pub(super) fn block_move_across(
        &mut self,
        conn: ConnId,
        seq: u64,
        args: Vec<Vec<u8>>,
    ) -> Pending {
        let (from, to, t) = match args.len() {
            4 => (b"RIGHT".to_vec(), b"LEFT".to_vec(), &args[3]),
            _ => (args[3].clone(), args[4].clone(), &args[5]),
        };
        if side(&from).is_none() || side(&to).is_none() {
            return Pending::ready(Reply::Error("ERR syntax error".into()));
        }
        let timeout = match block_timeout(t) {
            Ok(t) => t,
            Err(e) => return Pending::ready(e),
        };
        let deadline = (!timeout.is_zero()).then(|| Instant::now() + timeout);
        let (src, dst) = (args[1].clone(), args[2].clone());
        let at = vec![shard_of(&src, self.shards.len())];
        let mv = vec![b"LMOVE".to_vec(), src.clone(), dst, from, to];
        let blocking = self.blocking.entry(conn).or_default();
        if !blocking.contains(&at[0]) {
            blocking.push(at[0]);
        }
        // Its reply fills part 0 of this request; `moving` makes the
        // connection's next requests wait (see `fill`).
        let _ = self.move_across(conn, seq, mv.clone());
        let (left, waiting, keys) = (false, Vec::new(), vec![src]);
        let a = Across { keys, at, left, deadline, round: 0, next: 0, waiting, mv: Some(mv) };
        Pending::awaiting(1, Combine::Across(Box::new(a)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn across(keys: &[&str], at: &[usize], deadline: Option<Instant>) -> Across {
        let keys = keys.iter().map(|k| k.as_bytes().to_vec()).collect();
        let waiting = vec![];
        Across { keys, at: at.to_vec(), left: true, deadline, round: 0, next: 0, waiting, mv: None }
    }

    fn args(v: &[Vec<u8>]) -> Vec<String> {
        v.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect()
    }

    #[test]
    fn keys_are_tried_in_order_then_waited_on_then_tried_again() {
        let now = Instant::now();
        let mut a = across(&["a", "b", "c"], &[1, 0, 1], Some(now + Duration::from_secs(5)));
        // a is empty: b is tried next, on its shard.
        let n = a.step(part(0, false), Reply::Nil, now);
        assert_eq!(n.send.len(), 1);
        assert_eq!((n.send[0].0, args(&n.send[0].2)), (0, vec!["LPOP".into(), "b".into()]));
        let n = a.step(part(0, false), Reply::Nil, now);
        assert_eq!(args(&n.send[0].2), ["LPOP", "c"]);
        // All empty: one wait per shard with its own keys, the time left.
        let n = a.step(part(0, false), Reply::Nil, now);
        let waits: Vec<_> = n.send.iter().map(|(s, p, v)| (*s, *p, args(v))).collect();
        assert_eq!(
            waits,
            [
                (0, part(0, true), vec!["wait-push".into(), "5000".into(), "b".into()]),
                (1, part(0, true), vec!["wait-push".into(), "5000".into(), "a".into(), "c".into()])
            ]
        );
        // A pop's late reply while waiting is ignored; shard 1 wakes the round.
        assert!(a.step(part(0, false), Reply::Nil, now).send.is_empty());
        let n = a.step(part(0, true), Reply::Int(1), now);
        let sent: Vec<_> = n.send.iter().map(|(s, p, v)| (*s, *p, args(v))).collect();
        assert_eq!(
            sent,
            [
                (0, u32::MAX, vec!["unwait".into()]),
                (1, u32::MAX, vec!["unwait".into()]),
                (1, part(1, false), vec!["LPOP".into(), "a".into()])
            ]
        );
        // The other shard's wake from round 0 comes late: ignored.
        let late = a.step(part(0, true), Reply::Int(1), now);
        assert!(late.send.is_empty() && late.done.is_none());
        let n = a.step(part(1, false), Reply::Bulk(b"x".to_vec()), now);
        let want = Reply::Array(vec![Reply::Bulk(b"a".to_vec()), Reply::Bulk(b"x".to_vec())]);
        assert_eq!(n.done, Some(want));
    }

    #[test]
    fn a_blocking_move_waits_on_its_source_and_moves_again_when_woken() {
        let now = Instant::now();
        let lmove: Vec<Vec<u8>> =
            ["LMOVE", "s", "d", "RIGHT", "LEFT"].iter().map(|a| a.as_bytes().to_vec()).collect();
        let mut a = across(&["s"], &[2], Some(now + Duration::from_secs(1)));
        a.mv = Some(lmove.clone());
        // The move found nothing: a wait on the source's shard.
        let n = a.step(0, Reply::Nil, now);
        let waits: Vec<_> = n.send.iter().map(|(s, p, v)| (*s, *p, args(v))).collect();
        assert_eq!(
            waits,
            [(2, part(0, true), vec!["wait-push".into(), "1000".into(), "s".into()])]
        );
        // Woken: the wait is dropped and the move starts again.
        let n = a.step(part(0, true), Reply::Int(1), now);
        assert_eq!(n.start_move, Some(lmove));
        assert_eq!(args(&n.send[0].2), ["unwait"]);
        // Its element is the reply; a timeout is a null bulk.
        assert_eq!(
            a.step(0, Reply::Bulk(b"e".to_vec()), now).done,
            Some(Reply::Bulk(b"e".to_vec()))
        );
        let mut b = across(&["s"], &[2], Some(now));
        b.mv = a.mv.clone();
        assert_eq!(b.step(0, Reply::Nil, now).done, Some(Reply::Nil));
    }

    #[test]
    fn a_wrong_type_answers_and_the_deadline_gives_the_null_reply() {
        let now = Instant::now();
        let mut a = across(&["a", "b"], &[0, 1], Some(now + Duration::from_millis(10)));
        let e = Reply::Error("WRONGTYPE".into());
        assert_eq!(a.step(part(0, false), e.clone(), now).done, Some(e));

        let mut a = across(&["a", "b"], &[0, 1], Some(now + Duration::from_millis(10)));
        a.step(part(0, false), Reply::Nil, now);
        // Every key empty after the deadline: no wait, the null reply.
        let n = a.step(part(0, false), Reply::Nil, now + Duration::from_millis(11));
        assert!(n.send.is_empty());
        assert_eq!(n.done, Some(Reply::NullArray));

        // A shard's wait reaching the deadline: the others' waits are dropped.
        let mut a = across(&["a", "b"], &[0, 1], None);
        a.step(part(0, false), Reply::Nil, now);
        let n = a.step(part(0, false), Reply::Nil, now);
        assert!(n.send.iter().all(|(_, _, v)| args(v)[1] == "0"), "for ever: 0 ms");
        let n = a.step(part(0, true), Reply::NullArray, now);
        assert_eq!(n.done, Some(Reply::NullArray));
        assert_eq!(n.send.len(), 2, "both waits dropped");
    }
}
