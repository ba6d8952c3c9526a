//! What this node waits for from its peers: the replies to asks its
//! stand-ins sent, and the answers to its lookups.
//!
//! Each wait is filed under a request id (one counter for both kinds, so
//! an id names one wait only) and the link the request left on. The rules
//! it keeps:
//!
//! * only the link a request left on may answer it: an answer from another
//!   link is a protocol error of that link ("a reply to a request of
//!   another connection", "an answer to a lookup of another connection"),
//!   and the wait stays for the right link to answer;
//! * an answer is taken once: a second one finds nothing;
//! * when a link goes down, everything that waits on it is answered at
//!   once: an ask gets "no reply" (its [`ReplyTo`] is dropped, which tells
//!   the asker), a lookup gets [`LookupError::Timeout`] (the peer might
//!   have had the actor);
//! * [`Pending::awaited_links`] tells which links answers are still to
//!   come on (a retired duplicate link stays open until it has none).

use std::collections::{HashMap, HashSet};
use std::sync::mpsc;

use super::codec::MsgCodec;
use super::LookupError;
use crate::runtime::envelope::ReplyTo;

/// What a lookup found.
pub(crate) struct Found {
    /// The node it lives on.
    pub(crate) peer: String,
    pub(crate) id: u64,
    pub(crate) type_name: String,
    pub(crate) incarnation: u64,
}

/// Where a lookup's answer goes.
pub(crate) type LookupTx = mpsc::Sender<Result<Found, LookupError>>;

/// The asks and lookups waiting for a peer's answer (see the module docs).
pub(crate) struct Pending {
    /// Request id -> (link, where the reply goes, how it decodes).
    asks: rustc_hash::FxHashMap<u64, (u64, ReplyTo, MsgCodec)>, // per ask and reply
    /// Request id -> (link, where the answer goes).
    lookups: HashMap<u64, (u64, LookupTx)>,
    next_req: u64,
}

impl Pending {
    pub(crate) fn new() -> Pending {
        Pending { asks: Default::default(), lookups: HashMap::new(), next_req: 1 }
    }

    fn next_req(&mut self) -> u64 {
        let req = self.next_req;
        self.next_req += 1;
        req
    }

    /// Files an ask sent on `link`: its request id.
    pub(crate) fn ask(&mut self, link: u64, reply: ReplyTo, codec: MsgCodec) -> u64 {
        let req = self.next_req();
        self.asks.insert(req, (link, reply, codec));
        req
    }

    /// Files a lookup sent on `link`: its request id.
    pub(crate) fn lookup(&mut self, link: u64, tx: LookupTx) -> u64 {
        let req = self.next_req();
        self.lookups.insert(req, (link, tx));
        req
    }

    /// An ask that was not sent after all: the asker gets "no reply" now.
    pub(crate) fn forget_ask(&mut self, req: u64) {
        self.asks.remove(&req);
    }

    /// Takes the ask `req` answered on `link`: where its reply goes and how
    /// it decodes (`None` if nothing waits for it any more).
    pub(crate) fn reply(
        &mut self,
        link: u64,
        req: u64,
    ) -> Result<Option<(ReplyTo, MsgCodec)>, String> {
        // Only the peer that was asked may answer.
        if self.asks.get(&req).is_some_and(|a| a.0 != link) {
            return Err("a reply to a request of another connection".into());
        }
        Ok(self.asks.remove(&req).map(|(_, reply, codec)| (reply, codec)))
    }

    /// Takes the lookup `req` answered on `link`: where its answer goes
    /// (`None` if nothing waits for it any more).
    pub(crate) fn found(&mut self, link: u64, req: u64) -> Result<Option<LookupTx>, String> {
        if self.lookups.get(&req).is_some_and(|l| l.0 != link) {
            return Err("an answer to a lookup of another connection".into());
        }
        Ok(self.lookups.remove(&req).map(|(_, tx)| tx))
    }

    /// `link` went down: its asks get "no reply", its lookups a timeout.
    pub(crate) fn link_down(&mut self, link: u64) {
        // Dropping the ReplyTo answers "no reply".
        self.asks.retain(|_, a| a.0 != link);
        self.lookups.retain(|_, (l, tx)| {
            if *l == link {
                let _ = tx.send(Err(LookupError::Timeout));
                false
            } else {
                true
            }
        });
    }

    /// The links that answers are still to come on.
    pub(crate) fn awaited_links(&self) -> HashSet<u64> {
        let asks = self.asks.values().map(|a| a.0);
        asks.chain(self.lookups.values().map(|x| x.0)).collect()
    }

    /// The node stops: every ask gets "no reply".
    pub(crate) fn drop_asks(&mut self) {
        self.asks.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;

    use super::*;

    type Replies = mpsc::Receiver<Option<Box<dyn Any + Send>>>;

    fn codec() -> MsgCodec {
        MsgCodec {
            ty: 1,
            encode: |_, _, _| Ok(Default::default()),
            decode_reply: |b| Ok(Box::new(b.to_vec()) as Box<dyn Any + Send>),
        }
    }

    /// A `ReplyTo` whose reply (or "no reply", `None`) shows up on the
    /// returned receiver.
    fn reply_to() -> (ReplyTo, Replies) {
        let (tx, rx) = mpsc::channel();
        // The receiver may be gone when a test is done with it.
        let reply = ReplyTo::callback(Box::new(move |v| {
            let _ = tx.send(v);
        }));
        (reply, rx)
    }

    #[test]
    fn request_ids_are_unique_across_asks_and_lookups() {
        let mut p = Pending::new();
        let (tx, _rx) = mpsc::channel();
        let a = p.ask(1, reply_to().0, codec());
        let l = p.lookup(1, tx);
        let b = p.ask(2, reply_to().0, codec());
        assert_eq!((a, l, b), (1, 2, 3));
    }

    #[test]
    fn only_the_link_asked_may_reply_and_only_once() {
        let mut p = Pending::new();
        let (r, replies) = reply_to();
        let req = p.ask(1, r, codec());
        let err = p.reply(2, req).err().expect("another link answered");
        assert_eq!(err, "a reply to a request of another connection");
        assert!(replies.try_recv().is_err(), "the asker still waits");
        let (reply, codec) = p.reply(1, req).unwrap().expect("the ask is still filed");
        assert_eq!(codec.ty, 1);
        reply.send(Some(Box::new(5u8)));
        let got = replies.try_recv().unwrap().expect("a value");
        assert_eq!(got.downcast_ref::<u8>(), Some(&5));
        assert!(p.reply(1, req).unwrap().is_none(), "answered once");
        assert!(p.reply(2, req).unwrap().is_none(), "nothing left to misroute");
    }

    #[test]
    fn only_the_link_asked_may_answer_a_lookup_and_only_once() {
        let mut p = Pending::new();
        let (tx, rx) = mpsc::channel();
        let req = p.lookup(3, tx);
        assert_eq!(p.found(4, req).err().unwrap(), "an answer to a lookup of another connection");
        let tx = p.found(3, req).unwrap().expect("still filed");
        tx.send(Err(LookupError::NotFound)).unwrap();
        assert!(matches!(rx.try_recv(), Ok(Err(LookupError::NotFound))));
        assert!(p.found(3, req).unwrap().is_none());
    }

    #[test]
    fn a_link_going_down_answers_what_waits_on_it_and_nothing_else() {
        let mut p = Pending::new();
        let (r1, replies1) = reply_to();
        let (r2, replies2) = reply_to();
        let (tx1, rx1) = mpsc::channel();
        let (tx2, rx2) = mpsc::channel();
        p.ask(1, r1, codec());
        let ask2 = p.ask(2, r2, codec());
        p.lookup(1, tx1);
        let look2 = p.lookup(2, tx2);
        assert_eq!(p.awaited_links(), HashSet::from([1, 2]));
        p.link_down(1);
        assert!(replies1.try_recv().unwrap().is_none(), "the ask got no reply");
        assert!(matches!(rx1.try_recv(), Ok(Err(LookupError::Timeout))));
        assert!(replies2.try_recv().is_err() && rx2.try_recv().is_err(), "link 2 untouched");
        assert_eq!(p.awaited_links(), HashSet::from([2]));
        assert!(p.reply(2, ask2).unwrap().is_some() && p.found(2, look2).unwrap().is_some());
        assert!(p.awaited_links().is_empty());
    }

    #[test]
    fn a_forgotten_or_dropped_ask_gets_no_reply() {
        let mut p = Pending::new();
        let (r1, replies1) = reply_to();
        let (r2, replies2) = reply_to();
        let req = p.ask(1, r1, codec());
        p.ask(1, r2, codec());
        p.forget_ask(req);
        assert!(replies1.try_recv().unwrap().is_none());
        assert!(replies2.try_recv().is_err());
        p.drop_asks();
        assert!(replies2.try_recv().unwrap().is_none());
        assert!(p.awaited_links().is_empty());
    }
}
