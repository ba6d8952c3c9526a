//! One shape for every actor framework in the comparisons: start a set of
//! actors, each running a given handler for `u64` messages on a thread of
//! its own where the framework allows it, and get back a `tell` for each
//! (callable from plain threads and from inside the other actors'
//! handlers) and a way to stop them all.
//!
//! Each framework is used the way its documentation shows: Ringmail actors
//! on shards of their own (`System::spawn`), actix actors each in an
//! `Arbiter`, ractor and kameo actors on a two-worker tokio runtime. The
//! "one thread" rows put every actor on one thread: Ringmail's on one shard
//! (`System::shard` + `spawn_on`), ractor's and kameo's on a one-worker
//! tokio runtime. The
//! handlers are the same boxed closures in all of them, so the dynamic call
//! costs every framework alike.

use std::sync::{mpsc, Arc};
use std::thread;

/// A handler: what an actor does with each message.
pub type Handle = Box<dyn FnMut(u64) + Send>;
/// Sends a message to one actor.
pub type Tell = Arc<dyn Fn(u64) + Send + Sync>;

/// Running actors.
pub struct Actors {
    /// One per handler, in order.
    pub tells: Vec<Tell>,
    stop: Box<dyn FnOnce() + Send>,
}

impl Actors {
    /// Stops the actors and whatever runs them.
    pub fn stop(self) {
        (self.stop)()
    }
}

/// A framework under test.
#[derive(Clone, Copy, Debug)]
pub enum Framework {
    /// Ringmail actors.
    Ringmail,
    /// Ringmail actors whose shards busy-poll 50 µs before sleeping.
    RingmailPoll,
    /// Ringmail actors all on one shard (co-located).
    RingmailOneShard,
    /// Ringmail actors with async handlers, all on one shard.
    RingmailOneShardAsync,
    /// actix 0.13.
    Actix,
    /// ractor 0.15.
    Ractor,
    /// kameo 0.22.
    Kameo,
    /// ractor on a one-worker tokio runtime.
    RactorOneWorker,
    /// kameo on a one-worker tokio runtime.
    KameoOneWorker,
}

impl Framework {
    /// Every framework, Ringmail first.
    pub const ALL: [Framework; 4] =
        [Framework::Ringmail, Framework::Actix, Framework::Ractor, Framework::Kameo];

    /// The system name in the records.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Ringmail => "ringmail-actors",
            Framework::RingmailPoll => "ringmail-actors-poll50us",
            Framework::Actix => "actix",
            Framework::Ractor => "ractor",
            Framework::Kameo => "kameo",
            Framework::RingmailOneShard => "ringmail-actors-one-shard",
            Framework::RingmailOneShardAsync => "ringmail-actors-one-shard-async",
            Framework::RactorOneWorker => "ractor-one-worker",
            Framework::KameoOneWorker => "kameo-one-worker",
        }
    }

    /// Starts one actor per handler.
    pub fn start(self, handlers: Vec<Handle>) -> Actors {
        match self {
            Framework::Ringmail => ringmail(handlers, None, false, false),
            Framework::RingmailPoll => {
                ringmail(handlers, Some(std::time::Duration::from_micros(50)), false, false)
            }
            Framework::RingmailOneShard => ringmail(handlers, None, true, false),
            Framework::RingmailOneShardAsync => ringmail(handlers, None, true, true),
            Framework::Actix => actix(handlers),
            Framework::Ractor => ractor(handlers, 2),
            Framework::Kameo => kameo(handlers, 2),
            Framework::RactorOneWorker => ractor(handlers, 1),
            Framework::KameoOneWorker => kameo(handlers, 1),
        }
    }
}

fn ringmail(
    handlers: Vec<Handle>,
    busy_poll: Option<std::time::Duration>,
    one_shard: bool,
    async_handlers: bool,
) -> Actors {
    use ringmail::{Actor, AsyncHandler, Context, Handler, Message};
    struct A(Handle);
    impl Actor for A {}
    /// The same handler, as an async handler that never awaits: what the
    /// async machinery itself costs.
    struct Async(Handle);
    impl Actor for Async {}
    struct N(u64);
    impl Message for N {
        type Reply = ();
    }
    impl Handler<N> for A {
        fn handle(&mut self, N(x): N, _: &mut Context<Self>) {
            (self.0)(x)
        }
    }
    impl AsyncHandler<N> for Async {
        async fn handle(&mut self, N(x): N, _: &mut Context<Self>) {
            (self.0)(x)
        }
    }
    let ring = ringmail::transport::RingConfig::default().busy_poll(busy_poll);
    let system = ringmail::System::with_config(ringmail::SystemConfig::default().ring(ring));
    let shard = one_shard.then(|| system.shard().expect("shard"));
    let tells = handlers
        .into_iter()
        .map(|h| {
            if async_handlers {
                let r = match &shard {
                    Some(s) => system.spawn_on(s, Async(h)),
                    None => system.spawn(Async(h)).expect("spawn"),
                };
                Arc::new(move |x| r.tell(N(x)).expect("tell")) as Tell
            } else {
                let r = match &shard {
                    Some(s) => system.spawn_on(s, A(h)),
                    None => system.spawn(A(h)).expect("spawn"),
                };
                Arc::new(move |x| r.tell(N(x)).expect("tell")) as Tell
            }
        })
        .collect();
    Actors { tells, stop: Box::new(move || system.shutdown()) }
}

fn actix(handlers: Vec<Handle>) -> Actors {
    use actix::prelude::*;
    struct A(Handle);
    impl Actor for A {
        type Context = Context<Self>;
    }
    #[derive(actix::Message)]
    #[rtype(result = "()")]
    struct N(u64);
    impl Handler<N> for A {
        type Result = ();
        fn handle(&mut self, N(x): N, _: &mut Context<Self>) {
            (self.0)(x)
        }
    }
    let (tx, rx) = mpsc::channel();
    let sys_thread = thread::spawn(move || {
        let sys = actix::System::new();
        sys.block_on(async move {
            let mut arbiters = Vec::new();
            let addrs: Vec<Addr<A>> = handlers
                .into_iter()
                .map(|h| {
                    let arb = Arbiter::new();
                    let addr = A::start_in_arbiter(&arb.handle(), move |_| A(h));
                    arbiters.push(arb);
                    addr
                })
                .collect();
            tx.send((addrs, arbiters, actix::System::current())).unwrap();
        });
        sys.run().unwrap();
    });
    let (addrs, arbiters, sys) = rx.recv().unwrap();
    let tells = addrs.into_iter().map(|a| Arc::new(move |x| a.do_send(N(x))) as Tell).collect();
    Actors {
        tells,
        stop: Box::new(move || {
            for a in arbiters {
                a.stop();
            }
            sys.stop();
            sys_thread.join().unwrap();
        }),
    }
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn ractor(handlers: Vec<Handle>, workers: usize) -> Actors {
    use ractor::{Actor, ActorProcessingErr, ActorRef};
    struct A;
    impl Actor for A {
        type Msg = u64;
        type State = Handle;
        type Arguments = Handle;
        async fn pre_start(
            &self,
            _: ActorRef<u64>,
            h: Handle,
        ) -> Result<Handle, ActorProcessingErr> {
            Ok(h)
        }
        async fn handle(
            &self,
            _: ActorRef<u64>,
            x: u64,
            h: &mut Handle,
        ) -> Result<(), ActorProcessingErr> {
            h(x);
            Ok(())
        }
    }
    let rt = runtime(workers);
    let mut refs = Vec::new();
    let mut joins = Vec::new();
    for h in handlers {
        let (r, j) = rt.block_on(Actor::spawn(None, A, h)).expect("spawn");
        refs.push(r);
        joins.push(j);
    }
    let tells =
        refs.iter().cloned().map(|r| Arc::new(move |x| r.cast(x).expect("cast")) as Tell).collect();
    Actors {
        tells,
        stop: Box::new(move || {
            for r in &refs {
                r.stop(None);
            }
            for j in joins {
                let _ = rt.block_on(j);
            }
        }),
    }
}

fn kameo(handlers: Vec<Handle>, workers: usize) -> Actors {
    use kameo::actor::{ActorRef, Spawn};
    use kameo::error::Infallible;
    use kameo::message::{Context, Message};
    struct A(Handle);
    impl kameo::Actor for A {
        type Args = Self;
        type Error = Infallible;
        async fn on_start(me: Self, _: ActorRef<Self>) -> Result<Self, Infallible> {
            Ok(me)
        }
    }
    struct N(u64);
    impl Message<N> for A {
        type Reply = ();
        async fn handle(&mut self, N(x): N, _: &mut Context<Self, ()>) {
            (self.0)(x)
        }
    }
    let rt = runtime(workers);
    let refs: Vec<ActorRef<A>> = {
        let _in = rt.enter();
        // Unbounded, like the other peers' default mailboxes: `try_send`
        // never meets a full mailbox, so it works from plain threads and
        // from inside handlers alike.
        handlers
            .into_iter()
            .map(|h| A::spawn_with_mailbox(A(h), kameo::mailbox::unbounded()))
            .collect()
    };
    let tells = refs
        .iter()
        .cloned()
        .map(|r| Arc::new(move |x| r.tell(N(x)).try_send().expect("tell")) as Tell)
        .collect();
    Actors {
        tells,
        stop: Box::new(move || {
            rt.block_on(async {
                for r in &refs {
                    r.kill();
                    r.wait_for_shutdown().await;
                }
            });
        }),
    }
}
