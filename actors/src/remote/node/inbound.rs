//! What arrives on a link, from bytes to local actors.
//!
//! The node's actor hands a link's bytes to the link and pulls units back
//! one at a time ([`crate::remote::link::Link::next_input`]): before the
//! link is up, handshake frames, which advance the handshake; after it,
//! opened segments, whose frames are handled in order (messages delivered
//! to exported actors, replies and lookup answers matched to what waits
//! for them, acknowledgements, membership packets). Acting on a unit may
//! close the link; then the bytes after it are ignored. The first error
//! (a bad tag, a malformed or unexpected frame, an unregistered message
//! type) closes the link with that error as the reason, counted as a
//! failed handshake or a protocol error.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ringmail_wire::frame::{self, Decoded, Frame};
use ringmail_wire::WireError;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::{Delivery, Drained, ExitFrom, NodeActor, RetryStalled, SendReply};
use crate::actor::Context;
use crate::actor::Handler;
use crate::error::StopReason;
use crate::remote::link::{Step, Unit};
use crate::remote::pending::Found;
use crate::remote::window::{self, Tracked};
use crate::remote::Export;
use crate::remote::LookupError;
use crate::runtime::dead_letter;
use crate::runtime::envelope::Erased;
use crate::runtime::envelope::ReplyTo;

impl NodeActor {
    /// Handles received bytes of a link.
    pub(super) fn received(&mut self, link: u64, bytes: bytes::Bytes, ctx: &Context<Self>) {
        let Some(l) = self.links.get_mut(&link) else { return };
        if !l.receive_owned(bytes, Instant::now()) {
            return;
        }
        let result = loop {
            let l = self.links.get_mut(&link).expect("link");
            match l.next_input() {
                Ok(Some(Unit::Segment(range))) => {
                    // Read in place, where it was decrypted: the input is
                    // lent out while the frames are acted on.
                    let input = l.lend_input();
                    let done = self.segment(link, &input[range], ctx);
                    if let Some(l) = self.links.get_mut(&link) {
                        l.return_input(input);
                    }
                    if let Err(e) = done {
                        break Err(e);
                    }
                }
                Ok(Some(Unit::Handshake(f))) => {
                    if let Err(e) = self.handshake(link, f, ctx) {
                        break Err(e);
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = result {
            let authenticated = self.links.get(&link).is_some_and(|l| l.peer.is_some());
            if authenticated {
                self.shared.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                self.shared.counters.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            }
            tracing::warn!(node = %self.shared.cfg.name, error = %e, "closing a connection");
            self.close(link, &e, ctx);
        }
    }

    fn handshake(&mut self, link: u64, f: Frame, ctx: &Context<Self>) -> Result<(), String> {
        let me = self.identity();
        let max = self.shared.cfg.max_frame;
        let l = self.links.get_mut(&link).expect("link");
        let conn = l.conn;
        match l.on_handshake(me, f, max)? {
            Step::Welcome(welcome) => {
                if let Some(welcome) = welcome {
                    self.conns.write(conn, &welcome);
                }
                self.conns.flush(ctx);
            }
            Step::Established { confirm, peer } => {
                if let Some(confirm) = confirm {
                    self.conns.write(conn, &confirm);
                }
                self.established(link, peer.name, peer.incarnation, ctx);
            }
        }
        Ok(())
    }

    /// Handles the frames of one authenticated segment.
    fn segment(&mut self, link: u64, payload: &[u8], ctx: &Context<Self>) -> Result<(), String> {
        let max = self.shared.cfg.max_frame;
        let mut at = 0;
        while at < payload.len() {
            let decoded = frame::decode_in_place(&payload[at..], max).map_err(|e| e.to_string())?;
            let Some((d, n)) = decoded else {
                return Err("a segment ends inside a frame".into());
            };
            at += n;
            match d {
                // Actor messages, the payload read where it lies.
                Decoded::Message(m) => self.deliver(link, m.to, m.ty, m.payload, m.req, ctx)?,
                Decoded::Other(f) => self.frame(link, f, ctx)?,
            }
        }
        Ok(())
    }

    fn frame(&mut self, link: u64, f: Frame, ctx: &Context<Self>) -> Result<(), String> {
        match f {
            // (`segment` delivers these from where they lie.)
            Frame::Tell { to, ty, payload } => self.deliver(link, to, ty, &payload, None, ctx),
            Frame::Ask { to, ty, req, payload } => {
                self.deliver(link, to, ty, &payload, Some(req), ctx)
            }
            Frame::Credit { to, bytes } => {
                let Some(l) = self.links.get_mut(&link) else { return Ok(()) };
                let (admitted, ask) = l.out.credit(to, bytes)?;
                for h in admitted {
                    self.send_now(link, h);
                }
                if ask {
                    self.queue(link, &Frame::Blocked { to });
                }
                Ok(())
            }
            Frame::Blocked { to } => {
                let Some(l) = self.links.get_mut(&link) else { return Ok(()) };
                if l.inw.blocked(to) {
                    self.grant(link);
                }
                Ok(())
            }
            Frame::Reply { req, payload } => {
                // Only the peer that was asked may answer.
                if let Some((reply, codec)) = self.pending.reply(link, req)? {
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
                // Named as the asker compares it: the type's wire name.
                let codecs = &self.shared.codecs;
                let actor =
                    found.as_ref().map(|e| (e.id, codecs.actor_name(e.actor_type, e.type_name)));
                if let Some(e) = found {
                    self.watch_export(&e, link);
                }
                self.queue(link, &Frame::Found { req, actor });
                Ok(())
            }
            Frame::Found { req, actor } => {
                if let Some(tx) = self.pending.found(link, req)? {
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
                let taken = self.proxies.take_of_actor(&peer, inc, id);
                self.stop_stand_ins(taken, reason_from_text(&reason));
                // A stand-in made from a lookup answered just before the
                // stop is registered later: it finds this.
                self.recently_stopped.insert((peer, inc, id), (Instant::now(), reason));
                Ok(())
            }
            Frame::Exit { to, from, reason } => {
                let Some(node) = self.links.get(&link).and_then(|l| l.peer.clone()) else {
                    return Ok(());
                };
                // (An actor not here stopped already, its `Stopped` on its
                // way, or never was: nothing to stop.)
                if let Some(export) = self.shared.exports_by_id.get(&to).map(|e| e.clone()) {
                    let reason = reason_from_text(&reason);
                    self.exit_to(export, super::ExitFrom { node: node.0, from, reason });
                }
                Ok(())
            }
            Frame::Group { name, ty, members } => {
                self.group_state(link, (name, ty), members);
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
                    l.on_ack(n);
                }
                Ok(())
            }
            Frame::Swim(data) => {
                // Membership is tied to the authenticated connection: a
                // packet is taken only from the node it says it comes from.
                let peer = self.links.get(&link).and_then(|l| l.peer.clone());
                match crate::remote::swim::check_source(peer.as_ref(), &data) {
                    Ok(()) => {
                        self.swim.handle_data(&data);
                        self.apply_swim(ctx);
                    }
                    Err(claimed) => {
                        let who = peer.as_ref().map_or("", |p| p.0.as_str());
                        self.swim.refuse_misattributed(who, claimed.as_ref().map(|c| c.0.as_str()));
                    }
                }
                Ok(())
            }
            _ => Err(WireError::Unexpected(
                "a handshake or unknown frame on an established connection",
            )
            .to_string()),
        }
    }

    /// A message from a peer for local actor `to`, admitted against its
    /// credit window (one beyond it closes the link). Whatever becomes of
    /// it gives its cost back: at once when it cannot be delivered, else
    /// once its target has handled it (`Tracked`).
    fn deliver(
        &mut self,
        link: u64,
        to: u64,
        ty: u64,
        payload: &[u8],
        req: Option<u64>,
        ctx: &Context<Self>,
    ) -> Result<(), String> {
        let cost = window::cost(payload.len());
        let Some(l) = self.links.get_mut(&link) else { return Ok(()) };
        l.count_received();
        self.shared.counters.received.fetch_add(1, Ordering::Relaxed);
        let Some(export) = self.shared.exports_by_id.get(&to).map(|e| e.clone()) else {
            // Not (or no longer) here: a dead letter; an ask is told at
            // once. Its cost goes straight back, and no window is kept for
            // an actor that is not here (a peer cannot grow them by naming
            // actors at random).
            self.shared.counters.unknown_target.fetch_add(1, Ordering::Relaxed);
            dead_letter();
            if let Some(req) = req {
                self.queue(link, &Frame::Reply { req, payload: None });
            }
            self.queue(link, &Frame::Credit { to, bytes: cost });
            return Ok(());
        };
        let drain = self.links.get_mut(&link).expect("link").inw.admit(to, cost)?;
        let Some((decode, encode_reply)) = self.shared.codecs.decoder(export.actor_type, ty) else {
            drain.consumed(cost);
            let why = format!("message type {ty:#x} is not registered for {}", export.type_name);
            self.undeliverable(link, ty, req, &why);
            return Ok(());
        };
        if req.is_some() {
            if let Some(l) = self.links.get_mut(&link) {
                l.owe_reply();
            }
        }
        let reply = req.map(|req| {
            let me = self.me();
            ReplyTo::callback(Box::new(move |v| {
                let payload = v.and_then(encode_reply);
                me.deliver_forced(SendReply { link, req, payload });
            }))
        });
        let m = match decode(payload, reply) {
            Ok(m) => m,
            Err(e) => {
                // The reply slot was dropped with the failed decode, which
                // answers the asker (no reply) as a stopped actor would.
                drain.consumed(cost);
                let why =
                    format!("message type {ty:#x} for {} does not decode: {e}", export.type_name);
                self.undeliverable(link, ty, None, &why);
                return Ok(());
            }
        };
        self.deliver_to(export, Tracked::wrap(m, drain, cost), ctx);
        Ok(())
    }

    /// A message this node cannot hand to its target: a dead letter,
    /// counted; an ask is answered with no reply at once. Logged once per
    /// message type, so a flood of them does not flood the log. The link
    /// stays up: the rest of its stream is fine.
    fn undeliverable(&mut self, link: u64, ty: u64, req: Option<u64>, why: &str) {
        self.shared.counters.undeliverable.fetch_add(1, Ordering::Relaxed);
        dead_letter();
        if let Some(req) = req {
            self.queue(link, &Frame::Reply { req, payload: None });
        }
        // At most 1 024 types remembered: a peer sending random numbers
        // cannot grow this set without bound (past it, each is logged).
        if self.warned_types.len() >= 1024 {
            self.warned_types.clear();
        }
        if self.warned_types.insert(ty) {
            tracing::warn!(node = %self.shared.cfg.name, "{why}: a dead letter (logged once per type)");
        }
    }
}

pub(super) fn reason_text(r: &StopReason) -> String {
    match r {
        StopReason::Normal => "normal".into(),
        StopReason::Shutdown => "shutdown".into(),
        other => format!("{other:?}"),
    }
}

pub(super) fn reason_from_text(s: &str) -> StopReason {
    match s {
        "normal" => StopReason::Normal,
        "shutdown" => StopReason::Shutdown,
        other => StopReason::Failed(format!("remote: {other}")),
    }
}

impl NodeActor {
    /// Hands a message from a peer to its target without waiting: behind
    /// the target's stalled ones, if any; a full mailbox or transport queue
    /// hands it back, and it waits for `RetryStalled` (see `wait_for_room`).
    pub(super) fn deliver_to(
        &mut self,
        export: Arc<Export>,
        m: Box<dyn Erased>,
        ctx: &Context<Self>,
    ) {
        if let Some((_, q, _)) = self.stalled.get_mut(&export.id) {
            self.shared.counters.delivery_retries.fetch_add(1, Ordering::Relaxed);
            q.push_back(Delivery::Msg(m));
            return;
        }
        if let Err(m) = export.actor.try_deliver(m) {
            self.shared.counters.delivery_retries.fetch_add(1, Ordering::Relaxed);
            let id = export.id;
            let armed = Arc::new(AtomicBool::new(false));
            self.wait_for_room(&export, &armed, ctx);
            self.stalled.insert(id, (export, VecDeque::from([Delivery::Msg(m)]), armed));
        }
    }

    /// A delivery to `export` was handed back: retry when its mailbox has
    /// drained to half (a waker registered on it, once per stall: `armed`),
    /// or, when it has room now (the transport queue to its shard was what
    /// was full), after a short pause. Nothing polls an actor whose mailbox
    /// stays full.
    fn wait_for_room(&mut self, export: &Export, armed: &Arc<AtomicBool>, ctx: &Context<Self>) {
        if armed.swap(true, Ordering::AcqRel) {
            return; // a waker is registered already
        }
        let (node, flag) = (self.me(), armed.clone());
        let w = Box::new(move || {
            flag.store(false, Ordering::Release);
            // (A waker can outlive its stall: the node may be gone by then,
            // and a wake-up for nobody is no dead letter.)
            if node.is_alive() {
                node.deliver_forced(RetryStalled);
            }
        });
        if export.actor.wake_on_room(w) {
            armed.store(false, Ordering::Release);
            self.arm_retry(ctx);
        }
    }

    /// An exit from a peer for a local actor: after its stalled messages,
    /// if any (they came first). It costs the actor nothing to wait: its
    /// stop (or its `Exited`, trapping) would come behind them in its
    /// mailbox anyway.
    pub(super) fn exit_to(&mut self, export: Arc<Export>, exit: ExitFrom) {
        match self.stalled.get_mut(&export.id) {
            Some((_, q, _)) => q.push_back(Delivery::Exit(exit)),
            None => exit.apply(&export),
        }
    }

    pub(super) fn arm_retry(&mut self, ctx: &Context<Self>) {
        if self.retry_armed {
            return;
        }
        self.retry_armed = true;
        // A short pause lets the target's shard take in its ring (a timer
        // is never refused: see `Context::send_after`).
        ctx.send_after(Duration::from_micros(200), RetryStalled);
    }

    /// Sends the credit a link's targets owe its peer.
    pub(super) fn grant(&mut self, link: u64) {
        let Some(l) = self.links.get_mut(&link) else { return };
        if !l.is_up() {
            return;
        }
        for (to, bytes) in l.inw.grants() {
            self.queue(link, &Frame::Credit { to, bytes });
        }
    }
}

impl Handler<Drained> for NodeActor {
    fn handle(&mut self, Drained(link): Drained, _ctx: &mut Context<Self>) {
        self.grant(link);
    }
}

impl Handler<RetryStalled> for NodeActor {
    fn handle(&mut self, _: RetryStalled, ctx: &mut Context<Self>) {
        self.retry_armed = false;
        let mut still = Vec::new();
        self.stalled.retain(|_, (export, q, armed)| {
            while let Some(d) = q.pop_front() {
                match d {
                    Delivery::Msg(m) => {
                        if let Err(m) = export.actor.try_deliver(m) {
                            q.push_front(Delivery::Msg(m));
                            still.push((export.clone(), armed.clone()));
                            return true;
                        }
                    }
                    Delivery::Exit(e) => e.apply(export),
                }
            }
            false
        });
        for (export, armed) in still {
            self.wait_for_room(&export, &armed, ctx);
        }
    }
}
