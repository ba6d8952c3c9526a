//! The actor system: creates shards (ring-owning threads), places actors on
//! them, and shuts everything down in order.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

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
    /// The shard's id.
    pub fn id(&self) -> u64 {
        self.0.id
    }
}

/// An actor system. Dropping it shuts it down (see [`System::shutdown`]).
pub struct System {
    cfg: SystemConfig,
    shards: Mutex<Vec<(Arc<ShardHandle>, JoinHandle<()>)>>,
    stats: Arc<SystemStats>,
    registry: Arc<Registry>,
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
            shards: Mutex::new(Vec::new()),
            stats: Arc::default(),
            registry: Arc::default(),
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

impl Drop for System {
    fn drop(&mut self) {
        self.shutdown();
    }
}
