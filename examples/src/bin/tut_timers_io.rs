//! Tutorial, chapter "Timers and I/O as messages".

// ANCHOR: uses
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use ringmail::io::{IoDone, IoOp};
use ringmail::{Actor, Context, Handler, Message, System};
// ANCHOR_END: uses

// ANCHOR: actor
/// Writes a line to a file every 10 ms (three times), then reads it back.
struct Journal {
    file: File,
    lines: u32,
    done: mpsc::Sender<String>,
}

struct Tick;
impl Message for Tick {
    type Reply = ();
}
struct Written(IoDone);
impl Message for Written {
    type Reply = ();
}
struct ReadBack(IoDone);
impl Message for ReadBack {
    type Reply = ();
}

impl Actor for Journal {
    fn started(&mut self, ctx: &mut Context<Self>) {
        // A timeout on this actor's own ring, delivered as `Tick` messages.
        ctx.send_interval(Duration::from_millis(10), || Tick).expect("timer armed");
    }
}
// ANCHOR_END: actor

// ANCHOR: handlers
impl Handler<Tick> for Journal {
    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        if self.lines == 3 {
            return;
        }
        let line = format!("line {}\n", self.lines);
        let offset = (self.lines as usize * line.len()) as u64;
        self.lines += 1;
        // The buffer belongs to the framework until the kernel is done;
        // the completion comes back as a `Written` message.
        ctx.io(IoOp::Write { fd: self.file.as_raw_fd(), buf: line.into_bytes(), offset }, Written);
    }
}

impl Handler<Written> for Journal {
    fn handle(&mut self, Written(done): Written, ctx: &mut Context<Self>) {
        assert!(done.result.as_ref().is_ok_and(|n| *n > 0), "write failed: {:?}", done.result);
        if self.lines == 3 {
            let buf = vec![0; 64];
            ctx.io(IoOp::Read { fd: self.file.as_raw_fd(), buf, offset: 0 }, ReadBack);
        }
    }
}

impl Handler<ReadBack> for Journal {
    fn handle(&mut self, ReadBack(done): ReadBack, ctx: &mut Context<Self>) {
        let text = String::from_utf8(done.buf.unwrap_or_default()).expect("utf-8");
        self.done.send(text).expect("main waits");
        ctx.stop();
    }
}
// ANCHOR_END: handlers

// ANCHOR: main
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("ringmail-journal-{}", std::process::id()));
    let file = File::options().read(true).write(true).create(true).truncate(true).open(&path)?;
    let system = System::new();
    let (done, text) = mpsc::channel();
    system.spawn(Journal { file, lines: 0, done })?;
    print!("{}", text.recv_timeout(Duration::from_secs(10))?);
    std::fs::remove_file(&path)?;
    system.shutdown();
    Ok(())
}
// ANCHOR_END: main
