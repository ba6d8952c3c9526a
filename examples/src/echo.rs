//! The echo service: an [`Acceptor`] hands connections to `workers` echo
//! workers, each on its own shard; a worker sends back every byte it
//! receives, in order, through [`Connections`].

// ANCHOR: uses
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use ringmail::net::{Acceptor, AcceptorStats, Connections, Input, NetEvent, NewConnection};
use ringmail::transport::FixedFd;
use ringmail::{Actor, ActorRef, Context, FdHandler, Handler, Message, SpawnError, System};
// ANCHOR_END: uses

// ANCHOR: worker
/// Serves connections on its shard's ring: echoes what it receives.
#[derive(Default)]
pub struct EchoWorker {
    conns: Connections,
}

impl Actor for EchoWorker {}

/// A new connection, handed over by the acceptor with its socket.
impl FdHandler<NewConnection> for EchoWorker {
    fn handle_fd(&mut self, _c: NewConnection, fd: FixedFd, ctx: &mut Context<Self>) {
        if let Err(e) = self.conns.add(fd, ctx) {
            eprintln!("echo: cannot serve a connection: {e}"); // it is closed
        }
    }
}

/// Receive and send completions of the worker's connections.
impl Handler<NetEvent> for EchoWorker {
    fn handle(&mut self, ev: NetEvent, ctx: &mut Context<Self>) {
        if let Some(Input::Data(conn, bytes)) = self.conns.handle(ev, ctx) {
            self.conns.write_bytes(conn, bytes); // the received buffer itself goes back out
        }
        self.conns.flush(ctx); // one send per connection with output
    }
}
// ANCHOR_END: worker

/// Asks a worker how many connections it serves.
#[derive(Debug)]
pub struct ConnCount;
impl Message for ConnCount {
    type Reply = usize;
}

impl Handler<ConnCount> for EchoWorker {
    fn handle(&mut self, _: ConnCount, _ctx: &mut Context<Self>) -> usize {
        self.conns.len()
    }
}

/// A running echo server.
pub struct EchoServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The acceptor's counters.
    pub stats: Arc<AcceptorStats>,
    /// Its acceptor.
    pub acceptor: ActorRef<Acceptor<EchoWorker>>,
    /// Its workers.
    pub workers: Vec<ActorRef<EchoWorker>>,
}

// ANCHOR: start
/// Starts the echo service on `listener` with `workers` worker shards.
pub fn start(
    system: &System,
    listener: TcpListener,
    workers: usize,
) -> Result<EchoServer, SpawnError> {
    let addr = listener.local_addr().expect("a bound listener");
    let workers: Vec<ActorRef<EchoWorker>> = (0..workers.max(1))
        .map(|_| system.spawn(EchoWorker::default()))
        .collect::<Result<_, _>>()?;
    let acceptor = Acceptor::new(listener, workers.clone());
    let stats = acceptor.stats();
    let acceptor = system.spawn(acceptor)?;
    Ok(EchoServer { addr, stats, acceptor, workers })
}
// ANCHOR_END: start
