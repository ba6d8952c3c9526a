//! I/O as messages, weak references and recipients, through the public API.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use ringmail::io::{IoDone, IoOp};
use ringmail::{Actor, ActorRef, Context, Handler, Message, Recipient, System, WeakActorRef};

/// What completed, its result (an error as its errno), and its buffer.
type Report = (String, Result<u32, Option<i32>>, Vec<u8>);

struct FileIo {
    file: File,
    out: mpsc::Sender<Report>,
}

struct Wrote(IoDone);
impl Message for Wrote {
    type Reply = ();
}
struct ReadBack(IoDone);
impl Message for ReadBack {
    type Reply = ();
}
struct Slept(IoDone);
impl Message for Slept {
    type Reply = ();
}

impl Actor for FileIo {
    fn started(&mut self, ctx: &mut Context<Self>) {
        let fd = self.file.as_raw_fd();
        ctx.io(IoOp::Timeout { after: Duration::from_millis(5) }, Slept);
        ctx.io(IoOp::Write { fd, buf: b"hello ringmail".to_vec(), offset: 0 }, Wrote);
    }
}

impl Handler<Wrote> for FileIo {
    fn handle(&mut self, Wrote(done): Wrote, ctx: &mut Context<Self>) {
        self.out
            .send((
                "wrote".into(),
                done.result.map_err(|e| e.raw_os_error()),
                done.buf.unwrap_or_default(),
            ))
            .unwrap();
        let fd = self.file.as_raw_fd();
        ctx.io(IoOp::Read { fd, buf: vec![0; 64], offset: 0 }, ReadBack);
    }
}
impl Handler<ReadBack> for FileIo {
    fn handle(&mut self, ReadBack(done): ReadBack, _ctx: &mut Context<Self>) {
        self.out
            .send((
                "read".into(),
                done.result.map_err(|e| e.raw_os_error()),
                done.buf.unwrap_or_default(),
            ))
            .unwrap();
    }
}
impl Handler<Slept> for FileIo {
    fn handle(&mut self, Slept(done): Slept, _ctx: &mut Context<Self>) {
        self.out
            .send(("slept".into(), done.result.map_err(|e| e.raw_os_error()), Vec::new()))
            .unwrap();
    }
}

#[test]
fn io_completions_arrive_as_messages_with_their_buffers() {
    let path = std::env::temp_dir().join(format!("ringmail-io-{}", std::process::id()));
    let file =
        File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    let system = System::new();
    let (s, r) = mpsc::channel();
    let _a = system.spawn(FileIo { file, out: s }).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(r.recv_timeout(Duration::from_secs(10)).expect("completion"));
    }
    std::fs::remove_file(&path).ok();
    let find = |k: &str| got.iter().find(|(n, _, _)| n == k).cloned().expect(k);
    let (_, res, buf) = find("wrote");
    assert_eq!((res, buf.as_slice()), (Ok(14), &b"hello ringmail"[..]), "the buffer comes back");
    let (_, res, buf) = find("read");
    assert_eq!(
        (res, buf.as_slice()),
        (Ok(14), &b"hello ringmail"[..]),
        "read, truncated to its length"
    );
    let (_, res, _) = find("slept");
    assert_eq!(res, Ok(0), "a timeout that expired is a success");
}

// ---- weak references and recipients ----

struct Doubler;
impl Actor for Doubler {}
struct Tripler;
impl Actor for Tripler {}
struct Num(u32);
impl Message for Num {
    type Reply = u32;
}
impl Handler<Num> for Doubler {
    fn handle(&mut self, Num(n): Num, _ctx: &mut Context<Self>) -> u32 {
        n * 2
    }
}
impl Handler<Num> for Tripler {
    fn handle(&mut self, Num(n): Num, _ctx: &mut Context<Self>) -> u32 {
        n * 3
    }
}

#[test]
fn recipients_mix_actor_types_and_weak_refs_do_not_outlive_the_actor() {
    let system = System::new();
    let d: ActorRef<Doubler> = system.spawn(Doubler).unwrap();
    let t = system.spawn(Tripler).unwrap();
    let all: Vec<Recipient<Num>> = vec![d.recipient(), t.recipient()];
    let answers: Vec<u32> =
        all.iter().map(|r| r.ask(Num(5), Duration::from_secs(10)).unwrap()).collect();
    assert_eq!(answers, vec![10, 15]);
    let weak: WeakActorRef<Doubler> = d.downgrade();
    assert!(weak.upgrade().is_some());
    d.stop();
    d.wait_stopped(Duration::from_secs(10)).expect("stops");
    assert!(weak.upgrade().is_none(), "a weak ref does not revive a stopped actor");
}

#[test]
fn more_public_handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<WeakActorRef<Doubler>>();
    send_sync::<Recipient<Num>>();
    send_sync::<ringmail::Down>();
    send_sync::<ringmail::StopReason>();
}

/// Holds its shard's whole I/O budget with receives that never complete,
/// then arms timers: they cannot go to the kernel, and must still fire.
struct BudgetHog {
    _peers: Vec<std::os::unix::net::UnixStream>,
    mine: Vec<std::os::unix::net::UnixStream>,
    out: mpsc::Sender<&'static str>,
    ticks: u32,
    interval: Option<ringmail::TimerId>,
}
struct Held(IoDone);
impl Message for Held {
    type Reply = ();
}
struct Once;
impl Message for Once {
    type Reply = ();
}
struct Tick;
impl Message for Tick {
    type Reply = ();
}
impl Actor for BudgetHog {
    fn started(&mut self, ctx: &mut Context<Self>) {
        use std::os::fd::AsRawFd;
        for s in &self.mine {
            ctx.io(IoOp::Recv { fd: s.as_raw_fd(), buf: vec![0; 16] }, Held);
        }
        assert!(ctx.send_after(Duration::from_millis(20), Once).is_some(), "never refused");
        self.interval = ctx.send_interval(Duration::from_millis(5), || Tick);
    }
}
impl Handler<Held> for BudgetHog {
    fn handle(&mut self, Held(done): Held, _: &mut Context<Self>) {
        let _ = done;
        let _ = self.out.send("a receive completed (it should not have)");
    }
}
impl Handler<Once> for BudgetHog {
    fn handle(&mut self, _: Once, _: &mut Context<Self>) {
        let _ = self.out.send("once");
    }
}
impl Handler<Tick> for BudgetHog {
    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        self.ticks += 1;
        if self.ticks == 5 {
            ctx.cancel_timer(self.interval.take().expect("armed"));
            let _ = self.out.send("five ticks");
        }
    }
}

#[test]
fn timers_fire_when_the_rings_io_budget_is_full() {
    use ringmail::{RingConfig, SystemConfig};
    // io_reserve 4: at most 2 operations outstanding, both taken by receives.
    let ring = RingConfig::default().io_reserve(4);
    let system = System::with_config(SystemConfig::default().ring(ring));
    let (mut peers, mut mine) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        peers.push(a);
        mine.push(b);
    }
    let (tx, rx) = mpsc::channel();
    let hog = BudgetHog { _peers: peers, mine, out: tx, ticks: 0, interval: None };
    let _a = system.spawn(hog).unwrap();
    let mut got = vec![rx.recv_timeout(Duration::from_secs(10)).unwrap()];
    got.push(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    got.sort_unstable();
    assert_eq!(got, ["five ticks", "once"]);
    assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "nothing more: cancelled");
}
