//! The actor system: creates shards (ring-owning threads), places actors on
//! them, and shuts everything down in order.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use ringmail_transport::RingConfig;

use crate::actor::{bridge, registry, Actor, ActorRef, NameTaken};
use crate::error::SpawnError;
use crate::runtime::envelope::{Body, Envelope};
use crate::runtime::registry::Registry;
use crate::runtime::route::{flush_if_present, send_control};
use crate::runtime::shard::{ShardHandle, ShardLoop};
use crate::runtime::SystemStats;
use crate::runtime::{lock, thread};

static NEXT_SHARD: AtomicU64 = AtomicU64::new(1);

/// Settings of an actor system.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SystemConfig {
    /// Messages an actor's mailbox holds at most (default 1024).
    pub mailbox_capacity: usize,
    /// The configuration of every shard's ring.
    pub ring: RingConfig,
}

impl Default for SystemConfig {
    fn default() -> Self {
        SystemConfig { mailbox_capacity: 1024, ring: RingConfig::default() }
    }
}

impl SystemConfig {
    /// Sets the per-actor mailbox capacity (`usize::MAX`: unbounded, opt-in).
    pub fn mailbox_capacity(mut self, n: usize) -> Self {
        self.mailbox_capacity = n;
        self
    }
    /// Sets the shards' ring configuration.
    pub fn ring(mut self, ring: RingConfig) -> Self {
        self.ring = ring;
        self
    }

    /// Settings for shards that serve many connections (the KV and echo
    /// servers use them): a CQ with room for one receive, one send and one
    /// shutdown completion per connection (`io_reserve` 16 384, 32 768 CQ
    /// entries), 8 192 fixed-file slots for incoming sockets, 2 048 receive
    /// buffers of 8 KiB, and mailboxes of 65 536 (a worker takes a burst
    /// of connections and messages without refusing). Memory per shard:
    /// 16 MiB of receive buffers (touched as they are used) plus the rings.
    ///
    /// Receive buffers are counted in completions, not bytes: each receive
    /// takes a whole buffer, however few bytes it brought. With more
    /// connections sending at once than buffers, receives end for want of
    /// one and are armed again, which doubled the echo bench's CPU per
    /// request (1 000 connections: 256 buffers of 16 KiB served 143-153 K
    /// requests/s at 6.5-7.0 µs each, 1 024 or 2 048 buffers 237-251 K at
    /// 3.9-4.1 µs). So there are many, of a size that still takes a
    /// pipelined burst in a few receives.
    pub fn server() -> Self {
        let ring = RingConfig::default()
            .cq_entries(32768)
            .io_reserve(16384)
            .sq_entries(4096)
            .fixed_files(8192)
            .recv_buffers(2048, 8 * 1024);
        SystemConfig::default().ring(ring).mailbox_capacity(1 << 16)
    }
}

/// A shard that hosts co-located actors (see [`System::shard`]).
#[derive(Clone)]
pub struct Shard(Arc<ShardHandle>);

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Shard").field(&self.0.id).finish()
    }
}

impl Shard {
    pub(crate) fn handle(&self) -> &Arc<ShardHandle> {
        &self.0
    }

    /// The shard's id.
    pub fn id(&self) -> u64 {
        self.0.id
    }
}

/// An actor system. Dropping it shuts it down (see [`System::shutdown`]).
pub struct System {
    cfg: SystemConfig,
    shards: crate::metrics::ShardList,
    stats: Arc<SystemStats>,
    registry: Arc<Registry>,
    stop: StopHandle,
}

/// Asks a [`System`] to stop, from anywhere: another thread, an actor, a
/// supervisor that gave up ([`crate::Supervisor::on_give_up`]). The request
/// ends [`System::run_until_signal`] as a signal would; the system itself
/// is stopped by the thread that runs that (a shard cannot stop its own
/// system: stopping joins its thread).
#[derive(Clone)]
pub struct StopHandle(Arc<StopRequest>);

struct StopRequest {
    why: Mutex<Option<String>>,
    /// Written (one byte, never blocking) to wake the thread waiting in
    /// `run_until_signal`; the signal handlers write to it too.
    wake: std::os::unix::net::UnixStream,
    woken: Mutex<std::os::unix::net::UnixStream>,
}

impl std::fmt::Debug for StopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopHandle").field("requested", &*lock(&self.0.why)).finish()
    }
}

impl StopHandle {
    fn new() -> StopHandle {
        let (woken, wake) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        wake.set_nonblocking(true).expect("a non-blocking socket");
        let why = Mutex::new(None);
        StopHandle(Arc::new(StopRequest { why, wake, woken: Mutex::new(woken) }))
    }

    /// Asks the system to stop, saying why (the first request's reason is
    /// kept). Never blocks.
    pub fn stop(&self, why: impl Into<String>) {
        lock(&self.0.why).get_or_insert_with(|| why.into());
        let _ = (&self.0.wake).write(&[1]); // full: a wake-up is pending anyway
    }

    /// The reason given by the first [`StopHandle::stop`], if any.
    pub fn requested(&self) -> Option<String> {
        lock(&self.0.why).clone()
    }
}

/// What ended [`System::run_until_signal`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopCause {
    /// A signal: `SIGINT` or `SIGTERM` (its number).
    Signal(i32),
    /// A [`StopHandle::stop`], with its reason.
    Requested(String),
}

impl std::fmt::Debug for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shards: Vec<u64> = lock(&self.shards).iter().map(|(h, _)| h.id).collect();
        f.debug_struct("System")
            .field("config", &self.cfg)
            .field("shards", &shards)
            .field("registered", &self.registry.len())
            .field("panics", &self.panics())
            .finish()
    }
}

impl Default for System {
    fn default() -> Self {
        Self::new()
    }
}

impl System {
    /// A system with the default configuration.
    pub fn new() -> System {
        Self::with_config(SystemConfig::default())
    }

    /// A system with `cfg`.
    pub fn with_config(cfg: SystemConfig) -> System {
        System {
            cfg,
            shards: Arc::default(),
            stats: Arc::default(),
            registry: Arc::default(),
            stop: StopHandle::new(),
        }
    }

    fn start_shard(&self, dedicated: bool) -> Result<Arc<ShardHandle>, SpawnError> {
        let id = NEXT_SHARD.fetch_add(1, Ordering::Relaxed);
        let ring_cfg = self.cfg.ring.clone();
        let cap = self.cfg.mailbox_capacity;
        let stats = self.stats.clone();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (handle_tx, handle_rx) = mpsc::channel::<Arc<ShardHandle>>();
        let thread = std::thread::Builder::new()
            .name(format!("ringmail-shard-{id}"))
            .spawn(move || {
                match thread::init_shard(id, ring_cfg, stats.clone()) {
                    Ok(addr) => {
                        let _ = ready_tx.send(Ok(addr));
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                }
                let Ok(handle) = handle_rx.recv() else { return };
                ShardLoop::new(handle, dedicated).run();
            })
            .map_err(SpawnError::Thread)?;
        let addr = match ready_rx.recv() {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(SpawnError::Ring(e));
            }
            Err(_) => {
                let _ = thread.join();
                return Err(SpawnError::ShuttingDown);
            }
        };
        let handle = ShardHandle::new(id, addr, cap, self.registry.clone(), self.stats.clone());
        let handle = Arc::new(handle);
        let _ = handle_tx.send(handle.clone());
        lock(&self.shards).push((handle.clone(), thread));
        Ok(handle)
    }

    /// Spawns `actor` on a shard of its own: its own thread and its own
    /// `DEFER_TASKRUN` ring (the default placement). The shard ends when the
    /// actor stops.
    pub fn spawn<A: Actor>(&self, actor: A) -> Result<ActorRef<A>, SpawnError> {
        let shard = self.start_shard(true)?;
        Ok(bridge::spawn_on(&shard, actor))
    }

    /// Starts a shard for co-located actors: one thread and one ring hosting
    /// many actors; messages between them never enter the kernel.
    pub fn shard(&self) -> Result<Shard, SpawnError> {
        Ok(Shard(self.start_shard(false)?))
    }

    /// Spawns `actor` on `shard`.
    pub fn spawn_on<A: Actor>(&self, shard: &Shard, actor: A) -> ActorRef<A> {
        bridge::spawn_on(&shard.0, actor)
    }

    /// Registers `actor` under `name`, until it stops or is unregistered.
    /// A taken name (or a stopped actor) hands the reference back.
    ///
    /// ```
    /// use ringmail::{Actor, System};
    ///
    /// struct Db;
    /// impl Actor for Db {}
    ///
    /// let system = System::new();
    /// let db = system.spawn(Db)?;
    /// system.register("db", &db).unwrap();
    /// assert!(system.register("db", &db).is_err(), "one actor per name");
    /// let found = system.lookup::<Db>("db").expect("registered");
    /// assert_eq!(found, db);
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    pub fn register<A: Actor>(&self, name: &str, actor: &ActorRef<A>) -> Result<(), NameTaken<A>> {
        registry::register(&self.registry, name, actor)
    }

    /// The live actor of type `A` registered under `name`, from any thread.
    pub fn lookup<A: Actor>(&self, name: &str) -> Option<ActorRef<A>> {
        registry::lookup(&self.registry, name)
    }

    /// Removes `name` if it names `actor`.
    pub fn unregister<A: Actor>(&self, name: &str, actor: &ActorRef<A>) {
        self.registry.remove(name, actor.id());
    }

    /// The group `name` of actors that handle `M` (see
    /// [`Group`](crate::Group)): join, leave, members, publish.
    ///
    /// ```
    /// use ringmail::{Actor, Context, Handler, Message, System};
    ///
    /// #[derive(Clone)]
    /// struct Invalidate(String);
    /// impl Message for Invalidate {
    ///     type Reply = ();
    /// }
    /// struct Cache;
    /// impl Actor for Cache {}
    /// impl Handler<Invalidate> for Cache {
    ///     fn handle(&mut self, _: Invalidate, _: &mut Context<Self>) {}
    /// }
    ///
    /// let system = System::new();
    /// let caches = system.group::<Invalidate>("caches");
    /// let (a, b) = (system.spawn(Cache)?, system.spawn(Cache)?);
    /// caches.join(&a);
    /// caches.join(&b);
    /// assert_eq!(caches.publish(Invalidate("user:1".into())), 2);
    /// b.stop();
    /// # while caches.len() != 1 { std::thread::yield_now(); }
    /// assert_eq!(caches.members().len(), 1); // a stopped member leaves
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    pub fn group<M: crate::Message>(&self, name: &str) -> crate::Group<M> {
        crate::Group::new(&self.registry, name)
    }

    /// The registry of names and groups (the distributed layer spreads
    /// groups from it).
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Names currently registered.
    pub fn registered(&self) -> usize {
        self.registry.len()
    }

    /// Handler panics so far (each stopped its actor).
    pub fn panics(&self) -> u64 {
        self.stats.panics.load(Ordering::Relaxed)
    }

    /// Dead letters of this system so far: messages for its actors that
    /// reached no handler (sent to a stopped actor, still queued when their
    /// actor stopped or its shard shut down, timer and I/O messages of a
    /// stopped actor), replies of its actors that arrived after their ask
    /// gave up, and whatever its shards' threads could not deliver. Unlike
    /// the process-wide [`crate::dead_letters`], it is not moved by other
    /// systems in the same process. Not counted here (only process-wide): a
    /// message a ring hands back to a thread that runs no shard once the
    /// target's ring closed, and the transport's own count.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringmail::{Actor, System, TellError};
    /// # use ringmail::{Context, Handler, Message};
    /// # struct Ping; impl Message for Ping { type Reply = (); }
    /// struct Quiet;
    /// impl Actor for Quiet {}
    /// # impl Handler<Ping> for Quiet { fn handle(&mut self, _: Ping, _: &mut Context<Self>) {} }
    ///
    /// let system = System::new();
    /// let other = System::new();
    /// let a = system.spawn(Quiet)?;
    /// a.stop();
    /// a.wait_stopped(Duration::from_secs(5));
    /// assert!(matches!(a.tell(Ping), Err(TellError::Stopped(_))));
    /// assert_eq!(system.dead_letters(), 1);
    /// assert_eq!(other.dead_letters(), 0, "another system's count does not move");
    /// # Ok::<(), ringmail::SpawnError>(())
    /// ```
    pub fn dead_letters(&self) -> u64 {
        self.stats.dead_letters.load(Ordering::Relaxed)
    }

    /// Its counters now: panics, restarts, dead letters, and each shard's
    /// ring (see [`crate::metrics`]).
    pub fn metrics(&self) -> crate::metrics::Metrics {
        self.metrics_source().snapshot()
    }

    /// A handle that reads [`System::metrics`], for an actor to keep.
    pub fn metrics_source(&self) -> crate::metrics::MetricsSource {
        crate::metrics::MetricsSource { stats: self.stats.clone(), shards: self.shards.clone() }
    }

    /// Restarts in place so far: supervised actors replaced by a fresh
    /// instance that kept their reference, name and mailbox.
    pub fn restarts(&self) -> u64 {
        self.stats.restarts.load(Ordering::Relaxed)
    }

    /// A handle that asks this system to stop (see [`StopHandle`]).
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Waits for `SIGINT` or `SIGTERM` (or a [`StopHandle::stop`]), then
    /// stops the system gracefully within `deadline`
    /// ([`System::shutdown_graceful`]) and says what ended the wait. For a
    /// service that has its own steps between the two (stop accepting,
    /// flush logs), [`System::wait_for_signal`] only waits.
    pub fn run_until_signal(&self, deadline: Duration) -> std::io::Result<StopCause> {
        let cause = self.wait_for_signal()?;
        self.shutdown_graceful(deadline);
        Ok(cause)
    }

    /// Waits for `SIGINT` or `SIGTERM` (or a [`StopHandle::stop`]) and says
    /// which came; the system runs on. It blocks the calling thread: call
    /// it from `main` or another plain thread, never from inside an actor
    /// (that would stop its whole shard; an actor asks for a stop with a
    /// [`StopHandle`]). The same holds for [`System::run_until_signal`],
    /// [`System::shutdown_graceful`] and [`System::shutdown`].
    ///
    /// The handlers it installs (once per process) for the two signals
    /// only set flags and wake this thread, so a signal may land on any
    /// thread, the shards' included (their ring waits go on after the
    /// interruption); no thread needs its signal mask changed. Once the
    /// wait has ended, by a signal or a request, the process is stopping:
    /// a signal then (a second Ctrl-C during a slow stop, a supervisor's
    /// SIGTERM) ends it at once with exit code 1, until the next wait
    /// begins.
    pub fn wait_for_signal(&self) -> std::io::Result<StopCause> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let (seen, last) = signals()?;
        // A signal from now on is this wait's (it was not before: between
        // two waits, a signal ends the process).
        last.store(0, Ordering::SeqCst);
        seen.store(false, Ordering::SeqCst);
        let req = &self.stop.0;
        let mut pipes = Vec::new();
        let waited = (|| {
            for sig in [SIGINT, SIGTERM] {
                pipes.push(signal_hook::low_level::pipe::register(sig, req.wake.try_clone()?)?);
            }
            let mut woken = lock(&req.woken);
            loop {
                match last.load(Ordering::SeqCst) {
                    0 => {}
                    sig => return Ok(StopCause::Signal(sig as i32)),
                }
                if let Some(why) = self.stop.requested() {
                    return Ok(StopCause::Requested(why));
                }
                let mut buf = [0u8; 64];
                match woken.read(&mut buf) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        })();
        for id in pipes {
            signal_hook::low_level::unregister(id);
        }
        // The system is stopping: a signal now ends the process at once.
        seen.store(true, Ordering::SeqCst);
        if let Ok(cause) = &waited {
            tracing::info!(?cause, "stop requested");
        }
        waited
    }

    /// Stops the system gracefully: no new work from outside, the work it
    /// has runs to its end, then [`System::shutdown`]. True when the work
    /// ran out within `deadline`; false when the deadline ended it (what
    /// was still queued then became dead letters, as with `shutdown`).
    ///
    /// From the call on, sends from threads that are not this system's
    /// shards (clients, `main`) are refused with
    /// [`TellError::ShuttingDown`](crate::TellError::ShuttingDown) (asks
    /// likewise); actors keep sending to each other, replies and timers
    /// keep flowing. The work has run out when every shard waits on its
    /// ring with nothing queued, no actor paused, no timer armed and
    /// nothing of its own unsent, no send from outside is under way (a
    /// `batched` scope's until its flush), and no shard has dispatched
    /// anything across three looks 2 ms apart. I/O in flight (a receive
    /// armed on an idle connection) does not count as work. An actor with a
    /// periodic timer never runs out of work: its system stops at the
    /// deadline.
    pub fn shutdown_graceful(&self, deadline: Duration) -> bool {
        tracing::info!(?deadline, "stopping gracefully");
        self.stats.draining.store(true, Ordering::SeqCst);
        let end = Instant::now() + deadline;
        let (mut last, mut stable) = (None, 0);
        let drained = loop {
            let (idle, activity) = {
                let shards = lock(&self.shards);
                let idle =
                    shards.iter().all(|(h, t)| t.is_finished() || h.idle.load(Ordering::Acquire));
                (idle, shards.iter().map(|(h, _)| h.activity.load(Ordering::Relaxed)).sum::<u64>())
            };
            let sending = self.stats.client_sends.load(Ordering::SeqCst) > 0;
            stable = if idle && !sending && last == Some(activity) { stable + 1 } else { 0 };
            last = Some(activity);
            if stable >= 3 {
                break true;
            }
            if Instant::now() >= end {
                break false;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        if !drained {
            tracing::warn!(?deadline, "the work did not run out within the deadline: stopping now");
        }
        self.shutdown();
        drained
    }

    /// Stops every actor (running `stopped` hooks), closes every ring and
    /// joins every shard thread, in the order the shards were started.
    /// Messages still queued are not handled: they become dead letters
    /// ([`System::dead_letters`]; an ask among them gets `NoReply`), so the
    /// call returns in bounded time however much is queued (a handler
    /// running at that moment finishes first).
    pub fn shutdown(&self) {
        self.stats.stopping.store(true, Ordering::Release);
        let shards = std::mem::take(&mut *lock(&self.shards));
        for (handle, _) in &shards {
            let env = Envelope { to: 0, body: Body::Shutdown };
            // Waits out a full mailbox; a shard that already ended (dedicated,
            // actor stopped) refuses, which is fine.
            send_control(handle.id, &handle.addr, env, true, None);
        }
        for (_, thread) in shards {
            let _ = thread.join();
        }
        // Let the calling thread's ring forget its lanes to the closed shards.
        flush_if_present();
    }
}

/// The process's SIGINT/SIGTERM handlers, installed once (the first
/// [`System::wait_for_signal`]) and shared by every wait: `seen` is set by
/// either signal, and a signal that finds it set already ends the process
/// (exit code 1); `last` holds the number of the last signal.
/// `seen` and `last` (see [`signals`]).
type SignalFlags = (Arc<AtomicBool>, Arc<AtomicUsize>);

fn signals() -> std::io::Result<&'static SignalFlags> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::flag;
    static SIGNALS: std::sync::OnceLock<Result<SignalFlags, String>> = std::sync::OnceLock::new();
    let installed = SIGNALS.get_or_init(|| {
        let seen = Arc::new(AtomicBool::new(false));
        let last = Arc::new(AtomicUsize::new(0));
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees `seen` as the previous signal
            // left it.
            flag::register_conditional_shutdown(sig, 1, seen.clone()).map_err(|e| e.to_string())?;
            flag::register(sig, seen.clone()).map_err(|e| e.to_string())?;
            flag::register_usize(sig, last.clone(), sig as usize).map_err(|e| e.to_string())?;
        }
        Ok((seen, last))
    });
    installed
        .as_ref()
        .map_err(|e| std::io::Error::other(format!("installing signal handlers: {e}")))
}

impl Drop for System {
    fn drop(&mut self) {
        self.shutdown();
    }
}
