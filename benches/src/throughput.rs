//! `throughput`: one-way messages, 1 sender -> 1 receiver and 4 senders ->
//! 1 receiver, each on its own thread. Figure: messages per second from the
//! start barrier until the receiver has them all; rings and channels are new
//! every round, and each system has one uncounted warm-up run. The first
//! rows are the transport (`Ring::send`) and channels; `ringmail-actors`,
//! `actix` and `ractor` are actor to actor (tells to one sink actor), the
//! comparison the actor frameworks belong in.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring, RingConfig, SendError};

use crate::chan::{Chan, Crossbeam, StdMpsc};
use crate::harness::{compare, Better, Comparison, System};
use crate::raw::RawRing;

fn rate(total: u64, t: Instant) -> f64 {
    total as f64 / t.elapsed().as_secs_f64()
}

/// Ringmail: each sender thread owns a ring and `send`s in a loop.
pub fn ringmail(senders: usize, per: u64) -> f64 {
    let cfg = RingConfig::default().mailbox_capacity(1 << 16);
    let mut rx = Ring::<u64>::with_config(cfg).expect("ring");
    let addr = rx.addr();
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let addr = addr.clone();
            let go = go.clone();
            thread::spawn(move || {
                let mut tx = Ring::<u64>::new().expect("ring");
                let mut evs = Vec::new();
                go.wait();
                for i in 0..per {
                    let mut m = i;
                    loop {
                        match tx.send(&addr, m) {
                            Ok(()) => break,
                            Err(SendError::Full(back)) => {
                                m = back;
                                tx.wait(&mut evs, Some(Duration::from_micros(50))).unwrap();
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                tx.flush().unwrap();
                go.wait(); // keep the ring until the receiver is done
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    let mut got = 0u64;
    let mut evs = Vec::with_capacity(4096);
    while got < total {
        evs.clear();
        rx.wait(&mut evs, Some(Duration::from_secs(10))).unwrap();
        got += evs.iter().filter(|e| matches!(e, Event::Message(_))).count() as u64;
    }
    let r = rate(total, t);
    go.wait();
    hs.into_iter().for_each(|h| h.join().unwrap());
    r
}

/// Bare MSG_RING: one ring operation per message, 64 SQEs per submit,
/// success CQEs skipped. No flow control: the receiver's CQ overflows into
/// the kernel's list, which is exactly what the mailbox exists to avoid.
pub fn raw(senders: usize, per: u64) -> f64 {
    let mut rx = RawRing::new(4096);
    let fd = rx.fd();
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let go = go.clone();
            thread::spawn(move || {
                let mut tx = RawRing::new(64);
                go.wait();
                for i in 0..per {
                    tx.push_msg(fd, 0, i, true);
                    if i % 64 == 63 {
                        tx.ring.submit().unwrap();
                    }
                }
                tx.ring.submit().unwrap();
                go.wait();
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    let mut got = 0u64;
    let mut cqes = Vec::with_capacity(4096);
    while got < total {
        rx.submit_and_wait(1);
        cqes.clear();
        rx.reap(&mut cqes);
        got += cqes.len() as u64;
    }
    let r = rate(total, t);
    go.wait();
    hs.into_iter().for_each(|h| h.join().unwrap());
    r
}

/// A userspace channel (crossbeam, std mpsc), bounded(1024), MPSC.
pub fn channel<C: Chan>(senders: usize, per: u64) -> f64 {
    let (s, r) = C::pair(1024);
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let s = s.clone();
            let go = go.clone();
            thread::spawn(move || {
                go.wait();
                for i in 0..per {
                    C::send(&s, i);
                }
            })
        })
        .collect();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    for _ in 0..total {
        C::recv(&r).expect("senders live");
    }
    let rt = rate(total, t);
    hs.into_iter().for_each(|h| h.join().unwrap());
    rt
}

/// tokio mpsc(1024), every side in its own current-thread runtime.
pub fn tokio_mpsc(senders: usize, per: u64) -> f64 {
    let (s, mut r) = tokio::sync::mpsc::channel::<u64>(1024);
    let go = Arc::new(Barrier::new(senders + 1));
    let hs: Vec<_> = (0..senders)
        .map(|_| {
            let s = s.clone();
            let go = go.clone();
            thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                go.wait();
                rt.block_on(async move {
                    for i in 0..per {
                        s.send(i).await.unwrap();
                    }
                })
            })
        })
        .collect();
    drop(s);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    go.wait();
    let t = Instant::now();
    let total = senders as u64 * per;
    rt.block_on(async {
        for _ in 0..total {
            r.recv().await.unwrap();
        }
    });
    let r = rate(total, t);
    hs.into_iter().for_each(|h| h.join().unwrap());
    r
}

/// The actor-level systems: a sink actor counts messages and reports when
/// it has them all; `senders` threads tell it `per` messages each.
mod actors {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::mpsc;

    /// Starts `senders` threads that each send `per` messages to `target`
    /// with `send_all`, all released together; returns the rate from the
    /// release until `done` says everything arrived.
    fn drive<T: Clone + Send + 'static>(
        senders: usize,
        per: u64,
        target: &T,
        send_all: fn(&T, u64),
        done: &mpsc::Receiver<()>,
    ) -> f64 {
        let go = Arc::new(Barrier::new(senders + 1));
        let hs: Vec<_> = (0..senders)
            .map(|_| {
                let (target, go) = (target.clone(), go.clone());
                thread::spawn(move || {
                    go.wait();
                    send_all(&target, per);
                })
            })
            .collect();
        go.wait();
        let t = Instant::now();
        done.recv().expect("all arrived");
        let r = rate(senders as u64 * per, t);
        hs.into_iter().for_each(|h| h.join().unwrap());
        r
    }

    /// Ringmail actors: the sink on its own shard, tells from sender
    /// threads (batched, as a client thread should).
    pub fn ringmail(senders: usize, per: u64) -> f64 {
        sink_rate(senders, per, false)
    }

    /// As [`ringmail()`], with the sink's handler an `AsyncHandler` that never
    /// awaits: what the async machinery costs per message.
    pub fn ringmail_async(senders: usize, per: u64) -> f64 {
        sink_rate(senders, per, true)
    }

    fn sink_rate(senders: usize, per: u64, async_handler: bool) -> f64 {
        use ringmail::{Actor, AsyncHandler, Context, Handler, Message};
        struct Sink(u64, u64, Option<mpsc::Sender<()>>);
        impl Actor for Sink {}
        struct AsyncSink(Sink);
        impl Actor for AsyncSink {}
        struct N;
        impl Message for N {
            type Reply = ();
        }
        impl Sink {
            fn count(&mut self) {
                self.0 += 1;
                if self.0 == self.1 {
                    let _ = self.2.take().map(|t| t.send(()));
                }
            }
        }
        impl Handler<N> for Sink {
            fn handle(&mut self, _: N, _: &mut Context<Self>) {
                self.count();
            }
        }
        impl AsyncHandler<N> for AsyncSink {
            async fn handle(&mut self, _: N, _: &mut Context<Self>) {
                self.0.count();
            }
        }
        let cfg = ringmail::SystemConfig::default().mailbox_capacity(1 << 16);
        let system = ringmail::System::with_config(cfg);
        let (tx, rx) = mpsc::channel();
        let sink = Sink(0, senders as u64 * per, Some(tx));
        let tell: Arc<dyn Fn() + Send + Sync> = if async_handler {
            let r = system.spawn(AsyncSink(sink)).expect("spawn");
            Arc::new(move || r.tell(N).expect("tell"))
        } else {
            let r = system.spawn(sink).expect("spawn");
            Arc::new(move || r.tell(N).expect("tell"))
        };
        let send_all = |tell: &Arc<dyn Fn() + Send + Sync>, per| {
            ringmail::batched(|| {
                for _ in 0..per {
                    tell();
                }
            })
        };
        let r = drive(senders, per, &tell, send_all, &rx);
        system.shutdown();
        r
    }

    /// actix: the sink on its own actix system thread; `do_send` from the
    /// sender threads.
    pub fn actix(senders: usize, per: u64) -> f64 {
        use actix::prelude::*;
        struct Sink(Arc<AtomicU64>, u64, Option<mpsc::Sender<()>>);
        impl Actor for Sink {
            type Context = Context<Self>;
        }
        #[derive(actix::Message)]
        #[rtype(result = "()")]
        struct N;
        impl Handler<N> for Sink {
            type Result = ();
            fn handle(&mut self, _: N, _: &mut Context<Self>) {
                if self.0.fetch_add(1, Relaxed) + 1 == self.1 {
                    let _ = self.2.take().map(|t| t.send(()));
                }
            }
        }
        let (atx, arx) = mpsc::channel();
        let (tx, rx) = mpsc::channel();
        let total = senders as u64 * per;
        let sys_thread = thread::spawn(move || {
            let sys = actix::System::new();
            sys.block_on(async move {
                let addr = Sink(Arc::new(AtomicU64::new(0)), total, Some(tx)).start();
                atx.send((addr, actix::System::current())).unwrap();
            });
            sys.run().unwrap();
        });
        let (addr, sys) = arx.recv().unwrap();
        let send_all = |addr: &Addr<Sink>, per| (0..per).for_each(|_| addr.do_send(N));
        let r = drive(senders, per, &addr, send_all, &rx);
        sys.stop();
        sys_thread.join().unwrap();
        r
    }

    /// ractor: the sink on a 2-worker tokio runtime; `cast` from the sender
    /// threads.
    pub fn ractor(senders: usize, per: u64) -> f64 {
        use ractor::{Actor, ActorProcessingErr, ActorRef};
        struct Sink;
        impl Actor for Sink {
            type Msg = ();
            type State = (u64, u64, Option<mpsc::Sender<()>>);
            type Arguments = (u64, mpsc::Sender<()>);
            async fn pre_start(
                &self,
                _me: ActorRef<()>,
                (total, tx): (u64, mpsc::Sender<()>),
            ) -> Result<Self::State, ActorProcessingErr> {
                Ok((0, total, Some(tx)))
            }
            async fn handle(
                &self,
                _me: ActorRef<()>,
                _m: (),
                st: &mut Self::State,
            ) -> Result<(), ActorProcessingErr> {
                st.0 += 1;
                if st.0 == st.1 {
                    let _ = st.2.take().map(|t| t.send(()));
                }
                Ok(())
            }
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let total = senders as u64 * per;
        let (tx, rx) = mpsc::channel();
        let (sink, handle) = rt.block_on(Actor::spawn(None, Sink, (total, tx))).expect("spawn");
        let send_all =
            |sink: &ActorRef<()>, per| (0..per).for_each(|_| sink.cast(()).expect("cast"));
        let r = drive(senders, per, &sink, send_all, &rx);
        sink.stop(None);
        let _ = rt.block_on(handle);
        r
    }

    /// Any framework of [`crate::frameworks`]: the sink counts in its
    /// handler; sender threads tell.
    pub fn framework(fw: crate::frameworks::Framework, senders: usize, per: u64) -> f64 {
        let total = senders as u64 * per;
        let (tx, rx) = mpsc::channel();
        let mut seen = 0u64;
        let sink: crate::frameworks::Handle = Box::new(move |_| {
            seen += 1;
            if seen == total {
                let _ = tx.send(());
            }
        });
        let actors = fw.start(vec![sink]);
        let send_all = |tell: &crate::frameworks::Tell, per| (0..per).for_each(|_| tell(1));
        let r = drive(senders, per, &actors.tells[0], send_all, &rx);
        actors.stop();
        r
    }
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let total: u64 = if quick { 400_000 } else { 4_000_000 };
    let mut out = Vec::new();
    for senders in [1usize, 4] {
        let per = total / senders as u64;
        println!("throughput {senders}->1: {total} messages per round, {rounds} rounds");
        let c = compare(
            format!("throughput {senders}->1"),
            "msg/s",
            Better::Higher,
            rounds,
            vec![
                System { name: "ringmail", run: Box::new(move || ringmail(senders, per)) },
                System { name: "raw-msg-ring", run: Box::new(move || raw(senders, per)) },
                System {
                    name: "crossbeam",
                    run: Box::new(move || channel::<Crossbeam>(senders, per)),
                },
                System {
                    name: "std-mpsc",
                    run: Box::new(move || channel::<StdMpsc>(senders, per)),
                },
                System { name: "tokio-mpsc", run: Box::new(move || tokio_mpsc(senders, per)) },
                System {
                    name: "ringmail-actors",
                    run: Box::new(move || actors::ringmail(senders, per)),
                },
                System {
                    name: "ringmail-actors-async",
                    run: Box::new(move || actors::ringmail_async(senders, per)),
                },
                System { name: "actix", run: Box::new(move || actors::actix(senders, per)) },
                System { name: "ractor", run: Box::new(move || actors::ractor(senders, per)) },
                System {
                    name: "kameo",
                    run: Box::new(move || {
                        actors::framework(crate::frameworks::Framework::Kameo, senders, per)
                    }),
                },
            ],
        )
        .tagged("msgs_per_s", serde_json::json!({"senders": senders, "messages": total}));
        c.print();
        out.push(c);
    }
    out
}
