//! Tutorial, chapter "Requests between actors": a three-stage request
//! chain (gateway -> pricer -> rates) where nothing waits on a thread: the
//! middle stages ask from inside their handlers and answer their own
//! askers later, with deferred replies.

use std::time::Duration;

use ringmail::{Actor, ActorRef, Context, Handler, Message, System};

// ANCHOR: rates
/// The last stage: an exchange rate per currency, in basis points.
struct Rates;
impl Actor for Rates {}

struct Rate(&'static str);
impl Message for Rate {
    type Reply = Option<u64>;
}
impl Handler<Rate> for Rates {
    fn handle(&mut self, Rate(currency): Rate, _: &mut Context<Self>) -> Option<u64> {
        match currency {
            "EUR" => Some(10_800),
            "GBP" => Some(12_700),
            _ => None,
        }
    }
}
// ANCHOR_END: rates

// ANCHOR: pricer
/// The middle stage: prices an amount in a currency. It asks `Rates` from
/// inside its handler and answers its own asker when the rate comes back.
struct Pricer {
    rates: ActorRef<Rates>,
}
impl Actor for Pricer {}

struct Price {
    cents: u64,
    currency: &'static str,
}
impl Message for Price {
    type Reply = Result<u64, String>;
}
impl Handler<Price> for Pricer {
    fn handle(&mut self, p: Price, ctx: &mut Context<Self>) -> Result<u64, String> {
        // The reply is ours to give later; what this handler returns is dropped.
        let reply = ctx.reply_later::<Price>();
        let rates = self.rates.clone();
        let asked = ctx.ask(&rates, Rate(p.currency), Duration::from_secs(5), move |_, rate, _| {
            // Runs later, on this actor's shard, with `&mut Pricer`.
            reply.send(match rate {
                Ok(Some(bp)) => Ok(p.cents * bp / 10_000),
                Ok(None) => Err(format!("no rate for {}", p.currency)),
                Err(e) => Err(format!("rates did not answer: {e}")),
            });
        });
        if let Err(e) = asked {
            // Refused at once (its mailbox full, or stopped): the callback,
            // and the handle in it, were dropped, which answered the asker
            // `AskError::NoReply`.
            eprintln!("pricer: the rates refused a request: {e}");
        }
        Ok(0) // dropped: the deferred reply answers
    }
}
// ANCHOR_END: pricer

// ANCHOR: gateway
/// The first stage: totals a basket, one `Price` request per line, all in
/// flight at once; answers when the last one is back.
struct Gateway {
    pricer: ActorRef<Pricer>,
}
impl Actor for Gateway {}

struct Basket(Vec<(u64, &'static str)>);
impl Message for Basket {
    type Reply = Result<u64, String>;
}

/// A basket being totalled.
struct Totalling {
    left: usize,
    total: u64,
    reply: Option<ringmail::ReplyHandle<Result<u64, String>>>,
}

impl Totalling {
    /// Answers the basket's asker, once: the first failure, or the total.
    fn answer(&mut self, r: Result<u64, String>) {
        if let Some(reply) = self.reply.take() {
            reply.send(r);
        }
    }
}

impl Handler<Basket> for Gateway {
    fn handle(&mut self, Basket(lines): Basket, ctx: &mut Context<Self>) -> Result<u64, String> {
        let reply = ctx.reply_later::<Basket>();
        let state = std::sync::Arc::new(std::sync::Mutex::new(Totalling {
            left: lines.len(),
            total: 0,
            reply: Some(reply),
        }));
        let pricer = self.pricer.clone();
        for (cents, currency) in lines {
            let line = state.clone();
            let sent = ctx.ask(&pricer, Price { cents, currency }, Duration::from_secs(5), {
                move |_, price, _| {
                    let mut s = line.lock().unwrap();
                    match price {
                        Ok(Ok(p)) => {
                            s.total += p;
                            s.left -= 1;
                            if s.left == 0 {
                                let total = s.total;
                                s.answer(Ok(total));
                            }
                        }
                        Ok(Err(e)) => s.answer(Err(e)),
                        Err(e) => s.answer(Err(e.to_string())),
                    }
                }
            });
            if let Err(e) = sent {
                state.lock().unwrap().answer(Err(format!("pricer refused: {e}")));
            }
        }
        Ok(0)
    }
}
// ANCHOR_END: gateway

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let system = System::new();
    // Pricer and rates share a shard: the pricer's ask to the rates is a
    // same-shard hop, which nothing blocks on.
    let back = system.shard()?;
    let rates = system.spawn_on(&back, Rates);
    let pricer = system.spawn_on(&back, Pricer { rates });
    let gateway = system.spawn(Gateway { pricer })?;

    let basket = Basket(vec![(1_000, "EUR"), (2_000, "GBP"), (500, "EUR")]);
    let total = gateway.ask(basket, Duration::from_secs(5))??;
    println!("basket total: {total} cents");
    let bad = gateway.ask(Basket(vec![(100, "EUR"), (100, "XXX")]), Duration::from_secs(5))?;
    println!("second basket: {bad:?}");
    system.shutdown();
    Ok(())
}
// ANCHOR_END: main
