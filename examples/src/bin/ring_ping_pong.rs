//! Two rings on two threads play ping-pong with MSG_RING messages and print
//! round-trip percentiles, first with the sleeping wait, then with a
//! busy-poll budget.
//!
//! ```text
//! cargo run --release -p ringmail-examples --bin ring_ping_pong -- [--round-trips N] [--busy-poll-us N]
//! ```

use std::time::{Duration, Instant};

use ringmail::transport::{Event, Ring, RingConfig, SetupError};
use ringmail_examples::{arg, percentile_report};

const STOP: u64 = u64::MAX;

fn run(round_trips: usize, busy_poll: Option<Duration>) -> Result<Vec<u64>, SetupError> {
    let cfg = RingConfig::default().busy_poll(busy_poll);
    let mut me = Ring::<u64>::with_config(cfg.clone())?;
    let my_addr = me.addr();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let echo = std::thread::spawn(move || -> Result<(), SetupError> {
        let mut ring = Ring::<u64>::with_config(cfg)?;
        addr_tx.send(ring.addr()).expect("main thread waits for the address");
        let mut evs = Vec::new();
        loop {
            ring.wait(&mut evs, None).expect("wait");
            for e in evs.drain(..) {
                if let Event::Message(x) = e {
                    if x == STOP {
                        return Ok(());
                    }
                    ring.send(&my_addr, x).expect("main ring is open");
                }
            }
        }
    });
    let Ok(peer) = addr_rx.recv() else {
        return Err(echo.join().expect("echo thread").expect_err("echo failed to start"));
    };
    let mut samples = Vec::with_capacity(round_trips);
    let mut evs = Vec::new();
    for i in 0..(round_trips + round_trips / 10) as u64 {
        let t0 = Instant::now();
        me.send(&peer, i).expect("peer is open");
        evs.clear();
        while evs.is_empty() {
            me.wait(&mut evs, None).expect("wait");
        }
        let rtt = t0.elapsed().as_nanos() as u64;
        assert!(matches!(evs[0], Event::Message(x) if x == i), "reply out of order");
        if i as usize >= round_trips / 10 {
            samples.push(rtt); // the first 10% warm up
        }
    }
    me.send(&peer, STOP).expect("peer is open");
    me.flush().expect("flush");
    echo.join().expect("echo thread")?;
    Ok(samples)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "ping_pong: round trips between two rings on two threads\n\n\
             --round-trips N   round trips per mode (default 20000)\n\
             --busy-poll-us N  busy-poll budget of the second mode in µs (default 50)"
        );
        return;
    }
    let n: usize = arg(&args, "--round-trips", 20_000);
    let bp: u64 = arg(&args, "--busy-poll-us", 50);
    for (name, budget) in [("sleeping wait", None), ("busy-poll", Some(Duration::from_micros(bp)))]
    {
        match run(n, budget) {
            Ok(mut s) => {
                println!("{}", percentile_report(&format!("Round trip, {name}"), &mut s))
            }
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}
