//! fds handed between actors with `tell_fd` (IORING_MSG_SEND_FD between
//! shards, the table itself when co-located): in order with the sender's
//! other messages, owned by exactly one side, and closed when refused or
//! when their owner stops. (Own binary: it counts the process's fds.)

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use ringmail::net::ShardFd;
use ringmail::transport::FixedFd;
use ringmail::{Actor, ActorRef, Context, FdHandler, Handler, Message, System, TellError};
use ringmail_integration_tests::{pipe, read_byte};

/// Registers pipe write ends in its shard's table and hands them on.
struct Opener;
impl Actor for Opener {}

struct Open {
    /// Tag of the first fd.
    first: u64,
    writers: Vec<OwnedFd>,
    to: ActorRef<Keeper>,
}
impl Message for Open {
    /// How many `tell_fd`s were refused (their fds came back and were dropped).
    type Reply = usize;
}
impl Handler<Open> for Opener {
    fn handle(&mut self, m: Open, ctx: &mut Context<Self>) -> usize {
        let mut refused = 0;
        for (i, w) in m.writers.into_iter().enumerate() {
            let fd = ctx.register_fd(w).expect("a free slot");
            let i = m.first + i as u64;
            if let Err(e) = m.to.tell_fd(Tag(i), fd) {
                assert!(matches!(e, TellError::Stopped(_)), "{e:?}");
                let (_tag, fd): (Tag, FixedFd) = e.into_inner();
                drop(fd); // ours again: dropping it closes the file
                refused += 1;
            }
            // A plain message after every fd: order across both kinds.
            let _ = m.to.try_tell(Plain(i));
        }
        refused
    }
}

struct Tag(u64);
struct Plain(u64);
impl Message for Plain {
    type Reply = ();
}

#[derive(Default)]
struct Keeper {
    seen: Vec<String>,
    kept: Vec<ShardFd>,
}
impl Actor for Keeper {}
impl FdHandler<Tag> for Keeper {
    fn handle_fd(&mut self, t: Tag, fd: FixedFd, ctx: &mut Context<Self>) {
        self.seen.push(format!("fd{}", t.0));
        self.kept.push(ctx.keep_fd(fd));
    }
}
impl Handler<Plain> for Keeper {
    fn handle(&mut self, p: Plain, _ctx: &mut Context<Self>) {
        self.seen.push(format!("m{}", p.0));
    }
}
struct Seen;
impl Message for Seen {
    type Reply = Vec<String>;
}
impl Handler<Seen> for Keeper {
    fn handle(&mut self, _: Seen, _ctx: &mut Context<Self>) -> Vec<String> {
        self.seen.clone()
    }
}
struct DropAll;
impl Message for DropAll {
    type Reply = usize;
}
impl Handler<DropAll> for Keeper {
    fn handle(&mut self, _: DropAll, _ctx: &mut Context<Self>) -> usize {
        let n = self.kept.len();
        self.kept.clear(); // closes them
        n
    }
}

/// Pipe ends open in this process (rings come and go with their shards;
/// pipes are what this test hands around).
fn open_pipes() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().starts_with("pipe:"))
        .count()
}

const T: Duration = Duration::from_secs(20);

fn pipes(n: usize) -> (Vec<OwnedFd>, Vec<OwnedFd>) {
    (0..n).map(|_| pipe()).unzip()
}

fn wait_all_eof(readers: &[OwnedFd]) {
    let deadline = Instant::now() + T;
    while readers.iter().any(|r| read_byte(r) != 0) {
        assert!(Instant::now() < deadline, "some write end is still open");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn expected(n: usize) -> Vec<String> {
    (0..n).flat_map(|i| [format!("fd{i}"), format!("m{i}")]).collect()
}

fn handoff(system: &System, opener: &ActorRef<Opener>, keeper: ActorRef<Keeper>, n: usize) {
    let (readers, mut writers) = pipes(n);
    // At most 256 per handler run: a sender's own table slots come back
    // only as its ring reaps the hand-offs' CLOSEs, between handler runs.
    let mut first = 0;
    while !writers.is_empty() {
        let rest = writers.split_off(writers.len().min(256));
        let chunk = std::mem::replace(&mut writers, rest);
        let len = chunk.len() as u64;
        let refused = opener.ask(Open { first, writers: chunk, to: keeper.clone() }, T).unwrap();
        assert_eq!(refused, 0);
        first += len;
    }
    let deadline = Instant::now() + T;
    while keeper.ask(Seen, T).unwrap().len() < 2 * n {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(2));
    }
    let seen = keeper.ask(Seen, T).unwrap();
    let first_diff = seen.iter().zip(expected(n)).position(|(a, b)| *a != b);
    assert_eq!(first_diff, None, "fds and messages in send order");
    // The keeper owns every write end: no EOF yet.
    assert!(readers.iter().all(|r| read_byte(r) == -1));
    assert_eq!(keeper.ask(DropAll, T).unwrap(), n);
    wait_all_eof(&readers);
    let _ = system;
}

#[test]
fn fds_move_between_actors_in_order_and_close_exactly_once() {
    let system = System::new();
    let opener = system.spawn(Opener).unwrap();
    let _ = opener.ask(
        Open { first: 0, writers: Vec::new(), to: system.spawn(Keeper::default()).unwrap() },
        T,
    );
    let baseline = open_pipes();

    // Across shards: MSG_SEND_FD. The keeper holds them all, so at most
    // its table's allocation range (512 by default) fit.
    let remote = system.spawn(Keeper::default()).unwrap();
    handoff(&system, &opener, remote, 500);

    // Co-located: the fd never leaves the shard's table.
    let shard = system.shard().unwrap();
    let opener2 = system.spawn_on(&shard, Opener);
    let local = system.spawn_on(&shard, Keeper::default());
    handoff(&system, &opener2, local, 300);

    // A stopped receiver: every fd comes back to the sender, which closes it.
    let gone = system.spawn(Keeper::default()).unwrap();
    gone.stop();
    assert!(gone.wait_stopped(T).is_some());
    let (readers, writers) = pipes(100);
    assert_eq!(opener.ask(Open { first: 0, writers, to: gone }, T).unwrap(), 100);
    wait_all_eof(&readers);
    drop(readers);

    // A receiver that stops while fds are on their way: each one is either
    // kept (and closed at its stop) or refused (and closed by the sender).
    let stopping = system.spawn(Keeper::default()).unwrap();
    let (readers, writers) = pipes(250);
    let o = opener.clone();
    let s = stopping.clone();
    let sender = std::thread::spawn(move || o.ask(Open { first: 0, writers, to: s }, T).unwrap());
    std::thread::sleep(Duration::from_millis(1));
    stopping.stop();
    let refused = sender.join().unwrap();
    assert!(refused <= 250);
    wait_all_eof(&readers);

    drop(readers);
    assert_eq!(open_pipes(), baseline, "every pipe end is closed");
    system.shutdown();
}
