//! `System::shutdown` stops every actor (each `stopped` hook runs), closes
//! every ring and joins every shard thread, all before it returns. Alone in
//! its binary: it counts this process's threads and open fds, which other
//! tests running beside it would move.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringmail::{Actor, Context, Handler, Message, StopReason, System};
use ringmail_integration_tests::open_fds;

const T: Duration = Duration::from_secs(10);

/// Threads of this process (entries of `/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap_or_else(|e| panic!("threads: cannot read /proc/self/task: {e}"))
        .count()
}

/// Counts its `stopped` hook.
struct Counted(Arc<AtomicU64>);
impl Actor for Counted {
    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}
struct Ping;
impl Message for Ping {
    type Reply = u8;
}
impl Handler<Ping> for Counted {
    fn handle(&mut self, _: Ping, _ctx: &mut Context<Self>) -> u8 {
        1
    }
}

/// Six co-located shards of 500 actors and four actors on shards of their
/// own: one thread each while they run; the moment `shutdown` returns,
/// every thread is gone (no sleep, no polling: it joined them), every
/// actor's `stopped` hook has run and its reason is `Shutdown`; once the
/// references are dropped too, every ring's fds are closed.
#[test]
fn shutdown_stops_every_actor_closes_every_ring_and_joins_every_thread() {
    const SHARDS: usize = 6;
    const PER_SHARD: usize = 500;
    const DEDICATED: usize = 4;
    // This thread's own client ring lives as long as the thread: make it
    // now, so that it is part of the baseline.
    let warm_up = Arc::new(AtomicU64::new(0));
    {
        let system = System::new();
        let a = system.spawn(Counted(warm_up.clone())).unwrap();
        assert_eq!(a.ask(Ping, T).unwrap(), 1);
        system.shutdown();
    }
    assert_eq!(warm_up.load(Ordering::SeqCst), 1, "shutdown returned before the stopped hook ran");
    let (threads0, fds0) = (threads(), open_fds());

    let stopped = Arc::new(AtomicU64::new(0));
    let system = System::new();
    let shards: Vec<_> = (0..SHARDS).map(|_| system.shard().unwrap()).collect();
    let mut refs = Vec::new();
    for shard in &shards {
        for _ in 0..PER_SHARD {
            refs.push(system.spawn_on(shard, Counted(stopped.clone())));
        }
    }
    for _ in 0..DEDICATED {
        refs.push(system.spawn(Counted(stopped.clone())).unwrap());
    }
    // Every actor has started and answers.
    for r in &refs {
        assert_eq!(r.ask(Ping, T).unwrap(), 1);
    }
    let total = (SHARDS * PER_SHARD + DEDICATED) as u64;
    assert_eq!(threads(), threads0 + SHARDS + DEDICATED, "one thread per shard");
    assert!(open_fds() > fds0, "the shards' rings are open");
    assert_eq!(stopped.load(Ordering::SeqCst), 0);

    system.shutdown();
    assert_eq!(threads(), threads0, "shutdown returned before joining every shard thread");
    assert_eq!(stopped.load(Ordering::SeqCst), total, "not every actor's stopped hook ran");
    assert!(refs.iter().all(|r| !r.is_alive() && r.stop_reason() == Some(StopReason::Shutdown)));
    // References keep their ring's file open (an address holds a duplicate
    // fd, so the number is never reused under a sender): drop them too.
    drop(refs);
    drop(shards);
    drop(system);
    assert_eq!(open_fds(), fds0, "a shard's ring is still open");
}
