//! `msg-lat`: the seeds' latency test (shared/seeds/000, 002). One sender,
//! one receiver, each on its own thread, messages posted at a fixed rate.
//! "Sender" latency is post until the sender's own completion (for Ringmail:
//! `send` + `flush`, which submits; bare MSG_RING: its own CQE; channels: the
//! `send` call); "Receiver" latency is post until the receiving code runs.
//! The receiver sleeps in its wait (no busy-poll) in every system but
//! `ringmail-poll50us`, whose receiver spins up to 50 µs before it sleeps:
//! the case of a receiver that is awake when a message is sent (a loaded
//! one), where a Ringmail sender queues without a doorbell or a system call.
//!
//! `ringmail` is ring to ring (the transport); `ringmail-actors` and the
//! actor frameworks (actix, ractor, kameo) are a plain sender thread telling
//! one actor, whose handler records the receiver latency; their sender
//! latency is the `tell` call.

use std::sync::{mpsc, Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use ringmail::transport::{Event, Ring, RingConfig};

use crate::frameworks::{Framework, Handle};
use crate::harness::{from_figures, Better, Comparison};
use crate::raw::RawRing;

const STOP: u64 = u64::MAX;
const PCTS: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Waits until `deadline` (sleeps while far, spins when close).
fn pace(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > Duration::from_micros(200) {
            thread::sleep(left - Duration::from_micros(100));
        } else {
            std::hint::spin_loop();
        }
    }
}

struct Lat {
    sender: Histogram<u64>,
    receiver: Histogram<u64>,
}

fn paced_sender(rate: u64, dur: Duration, mut post: impl FnMut(u64)) -> Histogram<u64> {
    let mut h = hist();
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let n = (dur.as_secs_f64() * rate as f64) as u64;
    let start = Instant::now();
    for i in 0..n {
        pace(start + period * i as u32);
        let t = now_ns();
        post(t);
        h.record((now_ns() - t).max(1)).ok();
    }
    h
}

fn ringmail(rate: u64, dur: Duration) -> Lat {
    ringmail_with(rate, dur, None)
}

/// As [`ringmail()`], with the receiver busy-polling for up to `busy` before
/// it sleeps (`RingConfig::busy_poll`): a receiver that is awake when a
/// message is sent, as a loaded one is, so the sender needs no doorbell.
fn ringmail_with(rate: u64, dur: Duration, busy: Option<Duration>) -> Lat {
    let (tx, rx) = mpsc::channel();
    let recv = thread::spawn(move || {
        let cfg = RingConfig::default().busy_poll(busy);
        let mut ring = Ring::<u64>::with_config(cfg).expect("ring");
        tx.send(ring.addr()).unwrap();
        let mut h = hist();
        let mut evs = Vec::new();
        loop {
            evs.clear();
            ring.wait(&mut evs, None).unwrap();
            let now = now_ns();
            for e in &evs {
                if let Event::Message(ts) = e {
                    if *ts == STOP {
                        return h;
                    }
                    h.record((now - ts).max(1)).ok();
                }
            }
        }
    });
    let addr = rx.recv().unwrap();
    let mut ring = Ring::<u64>::new().expect("ring");
    let sender = paced_sender(rate, dur, |t| {
        ring.send(&addr, t).unwrap();
        ring.flush().unwrap();
    });
    ring.send(&addr, STOP).unwrap();
    ring.flush().unwrap();
    Lat { sender, receiver: recv.join().unwrap() }
}

fn raw(rate: u64, dur: Duration) -> Lat {
    let (tx, rx) = mpsc::channel();
    let done = Arc::new(Barrier::new(2));
    let done2 = done.clone();
    let recv = thread::spawn(move || {
        let mut ring = RawRing::new(1024);
        tx.send(ring.fd()).unwrap();
        let mut h = hist();
        let mut cqes = Vec::new();
        loop {
            ring.submit_and_wait(1);
            let now = now_ns();
            cqes.clear();
            ring.reap(&mut cqes);
            for &(ts, _) in &cqes {
                if ts == STOP {
                    done2.wait();
                    return h;
                }
                h.record((now - ts).max(1)).ok();
            }
        }
    });
    let fd = rx.recv().unwrap();
    let mut ring = RawRing::new(64);
    let mut cqes = Vec::new();
    let sender = paced_sender(rate, dur, |t| {
        ring.push_msg(fd, 0, t, false);
        cqes.clear();
        while cqes.is_empty() {
            ring.submit_and_wait(1);
            ring.reap(&mut cqes);
        }
    });
    ring.push_msg(fd, 0, STOP, true);
    ring.ring.submit().unwrap();
    done.wait();
    Lat { sender, receiver: recv.join().unwrap() }
}

fn crossbeam(rate: u64, dur: Duration) -> Lat {
    let (s, r) = crossbeam_channel::bounded::<u64>(1024);
    let recv = thread::spawn(move || {
        let mut h = hist();
        while let Ok(ts) = r.recv() {
            if ts == STOP {
                break;
            }
            h.record((now_ns() - ts).max(1)).ok();
        }
        h
    });
    let sender = paced_sender(rate, dur, |t| s.send(t).unwrap());
    s.send(STOP).unwrap();
    Lat { sender, receiver: recv.join().unwrap() }
}

fn tokio_mpsc(rate: u64, dur: Duration) -> Lat {
    let (s, mut r) = tokio::sync::mpsc::channel::<u64>(1024);
    let recv = thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async move {
            let mut h = hist();
            while let Some(ts) = r.recv().await {
                if ts == STOP {
                    break;
                }
                h.record((now_ns() - ts).max(1)).ok();
            }
            h
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let sender = paced_sender(rate, dur, |t| rt.block_on(s.send(t)).unwrap());
    rt.block_on(s.send(STOP)).unwrap();
    Lat { sender, receiver: recv.join().unwrap() }
}

/// An actor framework: a plain sender thread tells the receiving actor,
/// whose handler records the latency.
fn framework(fw: Framework, rate: u64, dur: Duration) -> Lat {
    let (tx, rx) = mpsc::channel();
    let mut h = Some(hist());
    let handler: Handle = Box::new(move |ts| {
        if ts == STOP {
            if let Some(h) = h.take() {
                let _ = tx.send(h);
            }
        } else if let Some(h) = h.as_mut() {
            h.record((now_ns() - ts).max(1)).ok();
        }
    });
    let actors = fw.start(vec![handler]);
    let tell = actors.tells[0].clone();
    let sender = paced_sender(rate, dur, |t| tell(t));
    tell(STOP);
    let receiver = rx.recv().expect("the receiver reports");
    actors.stop();
    Lat { sender, receiver }
}

fn print_percentiles(system: &str, lat: &Lat) {
    for (title, h) in [("Sender", &lat.sender), ("Receiver", &lat.receiver)] {
        println!("  {system} {title} percentiles (nsec), {} messages:", h.len());
        let line: Vec<String> =
            PCTS.iter().map(|p| format!("p{p}={}", h.value_at_quantile(p / 100.0))).collect();
        println!("    {}", line.join(" "));
    }
}

/// Runs the case.
pub fn run(quick: bool, rounds: usize) -> Vec<Comparison> {
    let dur = if quick { Duration::from_millis(300) } else { Duration::from_secs(3) };
    type Sys = (&'static str, Box<dyn Fn(u64, Duration) -> Lat>);
    let mut systems: Vec<Sys> = vec![
        ("ringmail", Box::new(ringmail)),
        (
            "ringmail-poll50us",
            Box::new(|rate, dur| ringmail_with(rate, dur, Some(Duration::from_micros(50)))),
        ),
        ("raw-msg-ring", Box::new(raw)),
        ("crossbeam", Box::new(crossbeam)),
        ("tokio-mpsc", Box::new(tokio_mpsc)),
    ];
    for fw in Framework::ALL {
        systems.push((fw.name(), Box::new(move |rate, dur| framework(fw, rate, dur))));
    }
    let names: Vec<&'static str> = systems.iter().map(|s| s.0).collect();
    let mut out = Vec::new();
    for rate in [13_000u64, 33_000, 100_000] {
        println!("\nmsg-lat at {rate} msg/s, {:?} per run, {rounds} rounds", dur);
        let mut merged: Vec<Lat> =
            systems.iter().map(|_| Lat { sender: hist(), receiver: hist() }).collect();
        let mut s50 = vec![Vec::new(); systems.len()];
        let mut r50 = vec![Vec::new(); systems.len()];
        for round in 0..rounds {
            for (i, (name, f)) in systems.iter().enumerate() {
                let lat = f(rate, dur);
                let (s, r) =
                    (lat.sender.value_at_quantile(0.5), lat.receiver.value_at_quantile(0.5));
                eprintln!("  [msg-lat {rate}] round {}/{rounds} {name:<14} sender p50 {s} ns, receiver p50 {r} ns", round + 1);
                s50[i].push(s as f64);
                r50[i].push(r as f64);
                merged[i].sender.add(&lat.sender).unwrap();
                merged[i].receiver.add(&lat.receiver).unwrap();
            }
        }
        for (i, name) in names.iter().enumerate() {
            print_percentiles(name, &merged[i]);
            // Every percentile of the merged histograms, for the charts.
            for (what, h) in [("sender", &merged[i].sender), ("receiver", &merged[i].receiver)] {
                for p in PCTS {
                    crate::harness::record(crate::harness::Record {
                        case: "msg-lat".into(),
                        system: name.to_string(),
                        metric: format!("{what}_ns_at_percentile"),
                        value: h.value_at_quantile(p / 100.0) as f64,
                        unit: "ns".into(),
                        params: serde_json::json!({"rate": rate, "percentile": p}),
                    });
                }
            }
        }
        for (what, fig) in [("sender", s50), ("receiver", r50)] {
            let c = from_figures(
                format!("msg-lat {rate} msg/s, {what} p50"),
                "ns",
                Better::Lower,
                &names,
                fig,
            )
            .tagged(&format!("{what}_p50_ns"), serde_json::json!({"rate": rate}));
            c.print();
            out.push(c);
        }
    }
    out
}
