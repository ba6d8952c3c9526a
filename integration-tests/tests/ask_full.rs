//! An ask to a full mailbox waits for room within its timeout and gets its
//! own reply (a refused attempt must not leave a stale "no reply" behind).

use std::time::Duration;

use ringmail::{Actor, AskError, Context, Handler, Message, System, SystemConfig};

struct Slow(u64);
impl Actor for Slow {}
struct Nap;
impl Message for Nap {
    type Reply = ();
}
impl Handler<Nap> for Slow {
    fn handle(&mut self, _: Nap, _: &mut Context<Self>) {
        self.0 += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
}
struct Count;
impl Message for Count {
    type Reply = u64;
}
impl Handler<Count> for Slow {
    fn handle(&mut self, _: Count, _: &mut Context<Self>) -> u64 {
        self.0
    }
}

#[test]
fn an_ask_waits_out_a_full_mailbox_and_gets_its_own_reply() {
    let system = System::with_config(SystemConfig::default().mailbox_capacity(4));
    let a = system.spawn(Slow(0)).unwrap();
    for _ in 0..20 {
        let mut sent = false;
        while !sent {
            sent = a.try_tell(Nap).is_ok();
        }
        // The mailbox is full now (or nearly): the ask waits for room.
        let n = a.ask(Count, Duration::from_secs(10)).expect("a reply, not NoReply");
        assert!(n >= 1);
    }
    // Full for longer than the timeout: the message comes back.
    while a.try_tell(Nap).is_ok() {}
    match a.ask(Count, Duration::from_micros(1)) {
        Err(AskError::Full(Count)) | Ok(_) | Err(AskError::Timeout) => {}
        Err(e) => panic!("unexpected {e:?}"),
    }
    system.shutdown();
}
