//! 100 000 co-located actors spawned, messaged and stopped; every shard
//! thread joined and every ring closed. Alone in its binary for the fd count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringmail::{Actor, Context, Handler, Message, StopReason, System};
use ringmail_integration_tests::open_fds;

struct Tiny(Arc<AtomicU64>);
impl Actor for Tiny {
    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.0.fetch_add(1 << 32, Ordering::Relaxed);
    }
}
struct Hello;
impl Message for Hello {
    type Reply = ();
}
impl Handler<Hello> for Tiny {
    fn handle(&mut self, _: Hello, ctx: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
        ctx.stop();
    }
}

#[test]
fn a_hundred_thousand_co_located_actors() {
    const N: u64 = 100_000;
    let baseline = open_fds();
    let counter = Arc::new(AtomicU64::new(0));
    {
        let system = System::new();
        let shards = [system.shard().unwrap(), system.shard().unwrap()];
        let refs: Vec<_> = (0..N)
            .map(|i| system.spawn_on(&shards[(i % 2) as usize], Tiny(counter.clone())))
            .collect();
        for r in &refs {
            r.tell(Hello).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while counter.load(Ordering::Relaxed) != N | (N << 32) {
            assert!(
                std::time::Instant::now() < deadline,
                "handled/stopped: {:x}",
                counter.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(refs.iter().all(|r| r.stop_reason() == Some(StopReason::Normal)));
        system.shutdown(); // joins both shard threads, closes both rings
    }
    // What remains is this thread's own client ring (its fd and the
    // duplicate its address keeps), which lives as long as the thread.
    assert_eq!(open_fds(), baseline + 2, "every shard ring is closed");
}
