//! A client's pub-sub commands on the worker: `SUBSCRIBE` and the rest
//! (a connection in RESP2 subscribed mode takes only these), and `PUBLISH`
//! (the sum of every worker's deliveries).

// The worker's own room: its types, imports and helpers.
use super::*;

impl KvWorker {
    /// The pub-sub commands, and RESP2's subscribed mode (where only they,
    /// `PING`, `QUIT` and `RESET` may run). `None`: not for this.
    pub(super) fn pubsub_command(
        &mut self,
        c: &mut Client,
        conn: ConnId,
        args: &[Vec<u8>],
    ) -> Option<Reply> {
        let cmd = Lower::of(&args[0]);
        let kind = match cmd.as_bytes() {
            b"subscribe" | b"unsubscribe" => Some(pubsub::Kind::Channel),
            b"psubscribe" | b"punsubscribe" => Some(pubsub::Kind::Pattern),
            _ => None,
        };
        if cmd.as_bytes() == b"reset" {
            self.subs.drop_conn(conn); // and on to the connection's own reset
            self.info.clients.set_subscriptions(c.id, 0);
            return None;
        }
        if c.multi.is_some() {
            return None; // refused by the transaction step, as not queueable
        }
        if let Some(kind) = kind {
            let names = &args[1..];
            let replies = match cmd.as_bytes() {
                b"subscribe" | b"psubscribe" if names.is_empty() => {
                    return Some(wrong_arity(cmd.as_str()))
                }
                b"subscribe" | b"psubscribe" => self.subs.subscribe(conn, kind, names),
                _ => self.subs.unsubscribe(conn, kind, names),
            };
            self.info.clients.set_subscriptions(c.id, self.subs.count(conn));
            return Some(Reply::Seq(replies));
        }
        if c.resp3 || self.subs.count(conn) == 0 {
            return None;
        }
        match cmd.as_bytes() {
            b"ping" => {
                let msg = args.get(1).cloned().unwrap_or_default();
                Some(Reply::Array(vec![Reply::Bulk(b"pong".to_vec()), Reply::Bulk(msg)]))
            }
            b"quit" | b"reset" => None,
            _ => Some(Reply::Error(format!(
                "ERR Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / \
                 RESET are allowed in this context",
                cmd.as_str()
            ))),
        }
    }

    /// `PUBLISH channel message`: to every worker of the server; the reply
    /// is how many subscribers got it, summed. While no connection of any
    /// worker listens to anything, 0 at once, with no message.
    pub(super) fn publish(&mut self, conn: ConnId, seq: u64, args: Vec<Vec<u8>>) -> Pending {
        if !self.subs.anyone_listening() {
            return Pending::ready(Reply::Int(0));
        }
        let members = self.group.as_ref().map_or_else(Vec::new, |g| g.members());
        let me = self.me.clone().expect("started");
        let n = members.len();
        let mut p = Pending::awaiting(n, Combine::Sum);
        let [_, channel, message] = <[Vec<u8>; 3]>::try_from(args).expect("3 arguments");
        for (i, m) in members.into_iter().enumerate() {
            let publish = Publish {
                channel: channel.clone(),
                message: message.clone(),
                origin: me.clone(),
                conn,
                seq,
                part: i as u32,
            };
            if m.tell(publish).is_err() {
                p.parts[i] = Some(Reply::Int(0)); // a worker that stopped: nobody there
                p.left -= 1;
            }
        }
        if p.left == 0 {
            p.finish();
        }
        p
    }
}
