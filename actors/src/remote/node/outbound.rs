//! What local actors send to other nodes: a stand-in's message encoded and
//! offered to its target's credit window (sent, or held with the
//! stand-in's slot), the stand-ins bound to their remote actors, and exits
//! through references.

use std::sync::atomic::Ordering;

use ringmail_wire::frame::{Encoded, Frame, Head};

use super::{inbound, NodeActor};
use crate::actor::{Context, Handler};
use crate::error::StopReason;
use crate::remote::link::Held;
use crate::remote::stand_in::{Outbound, ProxyEntry, RegisterProxy, RemoteExit};
use crate::remote::window::{self, Offer};
use crate::runtime::dead_letter;

impl Handler<Outbound> for NodeActor {
    fn handle(&mut self, mut o: Outbound, ctx: &mut Context<Self>) {
        let shared = o.stand_in.take().expect("an Outbound is handled once");
        let msg = o.msg.take().expect("an Outbound is handled once");
        let Some(p) = self.proxies.get(o.proxy) else {
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
            tracing::warn!(
                node = %self.shared.cfg.name,
                "a message type is not registered (Node::register): dead letter"
            );
            dead_letter();
            return;
        };
        let (msg, reply) = msg.split();
        let (to, ty) = (remote_id, codec.ty);
        let (head, req) = match reply {
            Some(r) => {
                let req = self.pending.ask(link, r, codec);
                (Head::Ask { to, ty, req }, Some(req))
            }
            None => (Head::Tell { to, ty }, None),
        };
        // Encoded once, into the frame it travels in (too large a frame is
        // refused here, before it costs credit).
        let max = self.shared.cfg.max_frame.saturating_sub(4);
        let frame = match (codec.encode)(&*msg, head, max) {
            Ok(f) => f,
            Err(e) => {
                if let Some(req) = req {
                    self.pending.forget_ask(req); // its ReplyTo answers "no reply"
                }
                shared.unreserve();
                tracing::warn!(node = %self.shared.cfg.name, error = %e, "a message does not encode: dead letter");
                dead_letter();
                return;
            }
        };
        let cost = window::cost(frame.payload_len());
        let held = Held::new(frame, (remote_id, cost), o.proxy, req, shared);
        let l = self.links.get_mut(&link).expect("the peer's link");
        // Within the target's credit window it leaves now; else it waits
        // for credit, holding its stand-in's slot (so senders wait too).
        match l.out.offer(remote_id, cost, held) {
            Offer::Send(h) => self.send_now(link, h),
            Offer::Held(ask) => {
                self.shared.counters.credit_waits.fetch_add(1, Ordering::Relaxed);
                if ask {
                    self.queue(link, &Frame::Blocked { to: remote_id });
                }
            }
        }
        let _ = ctx;
    }
}

impl NodeActor {
    /// Queues a message its credit window admitted; its stand-in's slot is
    /// held until the link's backlog drains. One that is not sent after all
    /// gives its cost back to the window (the peer never sees it), which
    /// may let the messages behind it go, in order.
    pub(super) fn send_now(&mut self, link: u64, h: Held) {
        // The common case sent it: nothing allocated on this path.
        let Some(first) = self.send_one(link, h) else { return };
        let mut refunds = vec![first];
        while let Some((to, cost)) = refunds.pop() {
            let Some(l) = self.links.get_mut(&link) else { return };
            let (admitted, ask) = l.out.refund(to, cost);
            if ask {
                self.queue(link, &Frame::Blocked { to });
            }
            for h in admitted {
                refunds.extend(self.send_one(link, h));
            }
        }
    }

    /// Queues one admitted message; `Some((to, cost))` when it was not
    /// sent (its cost goes back to the window).
    pub(super) fn send_one(&mut self, link: u64, mut h: Held) -> Option<(u64, u64)> {
        #[cfg(feature = "fault-injection")]
        if h.req.is_none() && !h.is_exit() {
            match crate::fault::next() {
                crate::fault::Fault::Lose => {
                    h.take_slot().unreserve(); // silently: no count anywhere
                    return Some((h.to, h.cost));
                }
                crate::fault::Fault::Duplicate => {
                    // Only a copy its window has room for (the receiver
                    // admits it like any message).
                    let room =
                        self.links.get_mut(&link).is_some_and(|l| l.out.charge(h.to, h.cost));
                    if room {
                        if self.queue_encoded(link, h.frame.clone()) {
                            if let Some(l) = self.links.get_mut(&link) {
                                l.sent_copy(); // the copy is acknowledged like any frame
                            }
                        } else if let Some(l) = self.links.get_mut(&link) {
                            l.out.uncharge(h.to, h.cost); // not sent after all
                        }
                    }
                }
                crate::fault::Fault::None => {}
            }
        }
        if h.is_exit() {
            // An exit: no slot, no count of messages; dropped unsent (too
            // large: cannot be), it counts as a dead letter.
            h.sent = self.queue_encoded(link, std::mem::take(&mut h.frame));
            return None;
        }
        if self.queue_encoded(link, std::mem::take(&mut h.frame)) {
            let slot = h.take_slot();
            if let Some(l) = self.links.get_mut(&link) {
                l.sent_for(h.proxy, slot);
            }
            self.shared.counters.sent.fetch_add(1, Ordering::Relaxed);
            None
        } else {
            // Not sent (too large to frame): a dead letter when `h` drops;
            // an ask's ReplyTo drops here and answers "no reply" at once.
            if let Some(req) = h.req {
                self.pending.forget_ask(req);
            }
            Some((h.to, h.cost))
        }
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
            self.stop_proxy(&r.proxy, StopReason::NodeDown(r.peer));
            return;
        }
        // The remote actor stopped between its lookup's answer and now: the
        // `Stopped` found no stand-in to stop; this one stops at once.
        let key = (r.peer, r.incarnation, r.remote_id);
        if let Some((_, reason)) = self.recently_stopped.get(&key) {
            let reason = inbound::reason_from_text(reason);
            self.stop_proxy(&r.proxy, reason);
            return;
        }
        let (peer, incarnation, remote_id) = key;
        let cell = r.proxy;
        self.proxies.insert(cell.id, ProxyEntry { peer, incarnation, remote_id, cell });
    }
}

impl Handler<RemoteExit> for NodeActor {
    fn handle(&mut self, e: RemoteExit, _ctx: &mut Context<Self>) {
        let (peer, inc, to) = e.remote.clone();
        let link = self.up.get(&peer).copied().filter(|l| {
            self.links.get(l).and_then(|l| l.peer.as_ref()).is_some_and(|p| p.1 == inc)
        });
        let Some(link) = link else {
            // Its node is down (or a newer incarnation replaced it): the
            // reference stops as the node's own stop would stop it.
            self.stop_proxy(&e.cell, StopReason::NodeDown(peer));
            return;
        };
        let f = Frame::Exit { to, from: e.from, reason: inbound::reason_text(&e.reason) };
        let f = match Encoded::frame(&f, self.shared.cfg.max_frame.saturating_sub(4)) {
            Ok(f) => f,
            Err(e) => {
                // (A stop reason is a short text: cannot be.)
                tracing::warn!(node = %self.shared.cfg.name, error = %e, "an exit does not encode: dead letter");
                dead_letter();
                return;
            }
        };
        // In line with the messages to it that wait for credit: behind
        // them, as it is behind them in the stand-in's order.
        let held = Held::exit(f, to, e.cell.id);
        let l = self.links.get_mut(&link).expect("the peer's link");
        if let Offer::Send(h) = l.out.offer(to, 0, held) {
            self.send_now(link, h);
        }
    }
}
