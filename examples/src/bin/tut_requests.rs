//! Tutorial, chapter "Requests between actors": a three-stage request
//! chain (gateway -> pricer -> rates) where nothing waits on a thread,
//! written twice: with callbacks and deferred replies, and with async
//! handlers that `.await`. Then a producer that outruns its consumer, paused
//! (as an actor) by the consumer's full mailbox.

// ANCHOR: uses
use std::time::Duration;

use ringmail::{Actor, ActorRef, AsyncHandler, Context, Handler, Message, System, SystemConfig};
// ANCHOR_END: uses

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

// ANCHOR: async_pricer
/// The middle stage again, as an async handler: the ask is awaited, and
/// `&mut self` stays usable across the await. While it awaits, this actor
/// takes no other message; its shard runs everyone else.
struct AsyncPricer {
    rates: ActorRef<Rates>,
    priced: u64,
}
impl Actor for AsyncPricer {}

impl AsyncHandler<Price> for AsyncPricer {
    async fn handle(&mut self, p: Price, ctx: &mut Context<Self>) -> Result<u64, String> {
        let rate = ctx.ask_async(&self.rates, Rate(p.currency), Duration::from_secs(5)).await;
        self.priced += 1;
        match rate {
            Ok(Some(bp)) => Ok(p.cents * bp / 10_000),
            Ok(None) => Err(format!("no rate for {}", p.currency)),
            Err(e) => Err(format!("rates did not answer: {e}")),
        }
    }
}
// ANCHOR_END: async_pricer

// ANCHOR: async_gateway
/// The first stage again: one line after another, each awaited. Simpler
/// than the callbacks above, at a price: the lines of one basket are priced
/// one at a time, and the gateway takes the next basket only when this one
/// is done.
struct AsyncGateway {
    pricer: ActorRef<AsyncPricer>,
}
impl Actor for AsyncGateway {}

impl AsyncHandler<Basket> for AsyncGateway {
    async fn handle(
        &mut self,
        Basket(lines): Basket,
        ctx: &mut Context<Self>,
    ) -> Result<u64, String> {
        let mut total = 0;
        for (cents, currency) in lines {
            let price =
                ctx.ask_async(&self.pricer, Price { cents, currency }, Duration::from_secs(5));
            total += price.await.map_err(|e| e.to_string())??;
        }
        Ok(total)
    }
}
// ANCHOR_END: async_gateway

// ANCHOR: backpressure
/// Counts what it gets, slowly.
struct Consumer {
    got: u64,
}
impl Actor for Consumer {}
struct Item(u64);
impl Message for Item {
    type Reply = ();
}
impl Handler<Item> for Consumer {
    fn handle(&mut self, Item(n): Item, _: &mut Context<Self>) {
        assert_eq!(n, self.got, "in order");
        self.got += 1;
        std::thread::sleep(Duration::from_micros(50)); // a slow consumer, on its own shard
    }
}
struct Got;
impl Message for Got {
    type Reply = u64;
}
impl Handler<Got> for Consumer {
    fn handle(&mut self, _: Got, _: &mut Context<Self>) -> u64 {
        self.got
    }
}

/// Sends 1 000 items in one handler run, far more than the consumer's
/// 16-slot mailbox holds. `tell` never blocks the shard: what does not fit
/// is parked, in order, and the producer *actor* is paused until the
/// consumer has made room; its `Flushed` marker runs only after all of it.
struct Producer {
    to: ActorRef<Consumer>,
}
impl Actor for Producer {}
struct Produce(u64);
impl Message for Produce {
    type Reply = ();
}
impl Handler<Produce> for Producer {
    fn handle(&mut self, Produce(n): Produce, _: &mut Context<Self>) {
        for i in 0..n {
            self.to.tell(Item(i)).expect("the consumer runs");
        }
    }
}
struct Flushed;
impl Message for Flushed {
    type Reply = ();
}
impl Handler<Flushed> for Producer {
    fn handle(&mut self, _: Flushed, _: &mut Context<Self>) {}
}
// ANCHOR_END: backpressure

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(16));
    // Pricer and rates share a shard: the pricer's ask to the rates is a
    // same-shard hop, which nothing blocks on.
    let back = system.shard()?;
    let rates = system.spawn_on(&back, Rates);
    let pricer = system.spawn_on(&back, Pricer { rates: rates.clone() });
    let gateway = system.spawn(Gateway { pricer })?;

    let basket = || Basket(vec![(1_000, "EUR"), (2_000, "GBP"), (500, "EUR")]);
    let total = gateway.ask(basket(), Duration::from_secs(5))??;
    println!("basket total: {total} cents");
    let bad = gateway.ask(Basket(vec![(100, "EUR"), (100, "XXX")]), Duration::from_secs(5))?;
    println!("second basket: {bad:?}");

    // The same chain with async handlers.
    let pricer = system.spawn_on(&back, AsyncPricer { rates, priced: 0 });
    let gateway = system.spawn(AsyncGateway { pricer })?;
    let total = gateway.ask(basket(), Duration::from_secs(5))??;
    println!("async basket total: {total} cents");

    // A producer that outruns its consumer.
    let consumer = system.spawn(Consumer { got: 0 })?;
    let producer = system.spawn(Producer { to: consumer.clone() })?;
    producer.tell(Produce(1_000))?;
    // Answered only once the producer ran again: after its outbox emptied.
    producer.ask(Flushed, Duration::from_secs(30))?;
    let got = consumer.ask(Got, Duration::from_secs(5))?;
    // Everything left the outbox, so at most a mailbox's worth is unconsumed.
    assert!(got >= 1_000 - 16, "the producer ran again early: consumer at {got}");
    println!("the producer ran again with at most 16 of its 1000 items unconsumed");
    system.shutdown();
    Ok(())
}
// ANCHOR_END: main
