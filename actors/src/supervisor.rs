//! Supervisors: see [`Supervisor`], whose docs are the design.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::actor::bridge::{self, Restart};
use crate::actor::{registry, Actor, ActorRef, Context, Down, Handler, Message, Router, Routing};
use crate::error::StopReason;
use crate::runtime::envelope::RestartPolicy;
use crate::runtime::lock;
use crate::runtime::shard::ShardHandle;
use crate::system::Shard;

/// Which children a supervisor restarts when one fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// Only the failed child.
    OneForOne,
    /// Every child: the others are restarted too, in order.
    OneForAll,
    /// The failed child and every child started after it.
    RestForOne,
}

/// What a restart keeps (see [`Supervisor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Restarts {
    /// The child restarts in its cell: references, name and queued
    /// messages survive; only the failing message is lost (Akka).
    #[default]
    InPlace,
    /// A restart is a new actor: new reference, empty mailbox, the name
    /// re-registered; what was queued becomes dead letters (Erlang).
    Fresh,
}

struct Running {
    id: u64,
    stop: Box<dyn Fn() + Send>,
    /// Sends the child a `Restart` (in place: a sibling failed).
    restart: Box<dyn Fn(StopReason) + Send>,
}

/// What runs once when a supervisor gives up.
type GiveUp = Box<dyn FnOnce(&StopReason) + Send>;

/// Starts one instance; `None` when the child's maker panicked.
type Starter = Box<dyn FnMut(&Context<Supervisor>, &Arc<Policy>) -> Option<Running> + Send>;

struct Child {
    start: Starter,
    running: Option<Running>,
    /// Its last instance ended normally: not restarted with its siblings.
    ended: bool,
}

/// The restart intensity and strategy, shared by the supervisor and its
/// children's slots (their shards ask it when a child fails).
struct Policy {
    strategy: Strategy,
    max_restarts: usize,
    within: Duration,
    state: Mutex<PolicyState>,
}

struct PolicyState {
    restarts: VecDeque<Instant>,
    gave_up: bool,
    /// The supervisor, told when a failed child's siblings must restart too.
    sup: Option<ActorRef<Supervisor>>,
}

impl Policy {
    /// Counts one restart; false once the intensity is exceeded (from then
    /// on, for good: the supervisor is giving up).
    fn count(&self) -> bool {
        let mut st = lock(&self.state);
        if st.gave_up {
            return false;
        }
        let now = Instant::now();
        while st.restarts.front().is_some_and(|t| now.duration_since(*t) > self.within) {
            st.restarts.pop_front();
        }
        if st.restarts.len() >= self.max_restarts {
            st.gave_up = true;
            st.sup = None;
            return false;
        }
        st.restarts.push_back(now);
        true
    }

    fn gave_up(&self) -> bool {
        lock(&self.state).gave_up
    }
}

impl RestartPolicy for Policy {
    fn failed(&self, id: u64, reason: &StopReason) -> bool {
        if !self.count() {
            return false;
        }
        if self.strategy != Strategy::OneForOne {
            let sup = lock(&self.state).sup.clone();
            if let Some(sup) = sup {
                sup.deliver_forced(SiblingFailed { actor: id, reason: reason.clone() });
            }
        }
        true
    }
}

/// A child restarted in place failed; its siblings follow (one-for-all,
/// rest-for-one).
struct SiblingFailed {
    actor: u64,
    reason: StopReason,
}

impl Message for SiblingFailed {
    type Reply = ();
}

/// Supervision: a [`Supervisor`] starts its children, and when one fails
/// (a panic, or a stop with an abnormal reason: [`StopReason::is_abnormal`];
/// a normal stop is not a failure) restarts it by its [`Strategy`], up to
/// an OTP-style intensity limit.
///
/// # What a restart keeps
///
/// By default ([`Restarts::InPlace`], Akka's semantics) a child restarts
/// *in place*: its shard replaces the failed instance by a fresh one from
/// the child's maker, in the same cell. The child's [`crate::ActorRef`]s,
/// its registered name and its mailbox survive: messages queued behind the
/// one that failed are handled by the new instance, in their order, and
/// senders never see `Stopped`. Only the message whose handler panicked is
/// lost; it is counted as a dead letter ([`crate::System::dead_letters`]),
/// and an ask it carried gets `NoReply`. The failed instance gets
/// [`crate::Actor::pre_restart`] (default: its `stopped` hook), the new one
/// [`crate::Actor::post_restart`] (default: `started`). Monitors and links
/// see only the child's final end: a restart is not a stop.
///
/// With [`Restarts::Fresh`] (Erlang's semantics) a restart is a new actor
/// with a new reference and an empty mailbox: holders of the old reference
/// get `Stopped`, what was queued for it becomes dead letters, monitors get
/// a [`Down`] per failure, and the name is re-registered for
/// [`crate::System::lookup`].
///
/// # Giving up, and escalation
///
/// More than `max_restarts` restarts within `within` and the supervisor
/// gives up: the failing child stops with its reason, the supervisor stops
/// its other children and then itself with [`StopReason::RestartIntensity`],
/// which its monitors see as a [`Down`]. A supervisor supervised by another
/// is a failing child of that one, so giving up travels up the tree (OTP's
/// escalation), each level restarting or giving up by its own intensity.
/// At the top, [`Supervisor::on_give_up`] runs a closure, for instance a
/// [`crate::StopHandle`] asking the system to stop.
///
/// # Placement
///
/// Children live on the supervisor's shard unless the child is added with
/// [`Supervisor::child_on`], which places it on a given [`crate::Shard`].
/// A restart in place happens on the child's own shard.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use ringmail::{Actor, Context, Handler, Message, Strategy, Supervisor, System};
///
/// struct Worker;
/// impl Actor for Worker {}
/// struct Work(u32);
/// impl Message for Work {
///     type Reply = u32;
/// }
/// impl Handler<Work> for Worker {
///     fn handle(&mut self, Work(n): Work, _: &mut Context<Self>) -> u32 {
///         assert!(n != 13, "unlucky");
///         n * 2
///     }
/// }
///
/// let system = System::new();
/// let sup = system.spawn(
///     Supervisor::new(Strategy::OneForOne)
///         .intensity(3, Duration::from_secs(5)) // more than 3 restarts in 5 s: give up
///         .child(Some("worker"), || Worker),
/// )?;
/// // The child is registered under its name once started; wait for it.
/// let deadline = std::time::Instant::now() + Duration::from_secs(5);
/// let worker = loop {
///     if let Some(w) = system.lookup::<Worker>("worker") {
///         break w;
///     }
///     assert!(std::time::Instant::now() < deadline);
///     std::thread::sleep(Duration::from_millis(1));
/// };
/// let t = Duration::from_secs(5);
/// assert!(worker.ask(Work(13), t).is_err()); // it panics: restarted in place
/// assert_eq!(worker.ask(Work(21), t)?, 42); // the same reference works
/// assert!(sup.is_alive());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Supervisor {
    strategy: Strategy,
    max_restarts: usize,
    within: Duration,
    restarts: Restarts,
    children: Vec<Child>,
    policy: Option<Arc<Policy>>,
    on_give_up: Option<GiveUp>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let running: Vec<Option<u64>> =
            self.children.iter().map(|c| c.running.as_ref().map(|r| r.id)).collect();
        let recent = self.policy.as_ref().map_or(0, |p| lock(&p.state).restarts.len());
        f.debug_struct("Supervisor")
            .field("strategy", &self.strategy)
            .field("max_restarts", &self.max_restarts)
            .field("within", &self.within)
            .field("restarts", &self.restarts)
            .field("children", &running)
            .field("recent_restarts", &recent)
            .finish()
    }
}

impl Supervisor {
    /// A supervisor with `strategy`, restarts in place, and the default
    /// intensity (3 restarts in 5 s).
    pub fn new(strategy: Strategy) -> Self {
        Supervisor {
            strategy,
            max_restarts: 3,
            within: Duration::from_secs(5),
            restarts: Restarts::InPlace,
            children: Vec::new(),
            policy: None,
            on_give_up: None,
        }
    }

    /// At most `max_restarts` restarts within `within`; one more and the
    /// supervisor gives up.
    pub fn intensity(mut self, max_restarts: usize, within: Duration) -> Self {
        self.max_restarts = max_restarts;
        self.within = within;
        self
    }

    /// What a restart keeps (default [`Restarts::InPlace`]).
    pub fn restarts(mut self, restarts: Restarts) -> Self {
        self.restarts = restarts;
        self
    }

    /// Runs `f` (on the supervisor's shard, once) when the supervisor gives
    /// up, with the reason of the failure that exceeded its intensity;
    /// for a top-level supervisor, e.g. `move |_| stop_handle.stop()`.
    pub fn on_give_up(mut self, f: impl FnOnce(&StopReason) + Send + 'static) -> Self {
        self.on_give_up = Some(Box::new(f));
        self
    }

    /// Adds a child made by `make` (called at its first start and at every
    /// restart), on the supervisor's shard, registered as `name` when one
    /// is given. Children start in the order they are added.
    pub fn child<A: Actor>(
        self,
        name: Option<&str>,
        make: impl FnMut() -> A + Send + 'static,
    ) -> Self {
        self.add(name, None, make)
    }

    /// Like [`Supervisor::child`], with the child placed on `shard`.
    pub fn child_on<A: Actor>(
        self,
        shard: &Shard,
        name: Option<&str>,
        make: impl FnMut() -> A + Send + 'static,
    ) -> Self {
        self.add(name, Some(shard.handle().clone()), make)
    }

    /// Spawns a *pool* on `system`: `size` actors made by `make(i)`, the
    /// children of this supervisor (its strategy, intensity and restart
    /// kind), each registered as `"{name}-{i}"`, behind a [`Router`] that
    /// finds them by those names at each send. So the pool is supervised as
    /// one unit (stop the supervisor to stop it) and sized at start, and
    /// the router never goes stale: a child restarted in place keeps its
    /// reference, one restarted fresh is found under its name again, and a
    /// child not started yet (or between a stop and its restart) is passed
    /// over. Returns the supervisor and the router.
    pub fn pool<A, M>(
        self,
        system: &crate::System,
        name: &str,
        size: usize,
        make: impl Fn(usize) -> A + Send + Sync + 'static,
        routing: Routing<M>,
    ) -> Result<(ActorRef<Supervisor>, Router<M>), crate::SpawnError>
    where
        A: Handler<M>,
        M: Message,
    {
        let make = Arc::new(make);
        let names: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
        let mut sup = self;
        for (i, child) in names.iter().enumerate() {
            let make = make.clone();
            sup = sup.child(Some(child), move || make(i));
        }
        let sup = system.spawn(sup)?;
        let names = names.clone();
        let reg = system.registry().clone();
        let resolve = move || {
            names
                .iter()
                .filter_map(|n| registry::lookup::<A>(&reg, n))
                .map(|r| r.recipient::<M>())
                .collect()
        };
        Ok((sup, Router::resolved(Box::new(resolve), routing)))
    }

    fn add<A: Actor>(
        mut self,
        name: Option<&str>,
        shard: Option<Arc<ShardHandle>>,
        make: impl FnMut() -> A + Send + 'static,
    ) -> Self {
        let name = name.map(str::to_string);
        let make = Arc::new(Mutex::new(make));
        let in_place = self.restarts == Restarts::InPlace;
        let start: Starter = Box::new(move |ctx: &Context<Supervisor>, policy: &Arc<Policy>| {
            let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (lock(&make))()));
            let actor = made.ok()?;
            let restart = in_place.then(|| {
                let make = make.clone();
                let policy: Arc<dyn RestartPolicy> = policy.clone();
                Restart { make: Box::new(move || (lock(&make))()), policy }
            });
            let shard = shard.as_ref().unwrap_or(&ctx.me.shard);
            let child = bridge::spawn_restartable(shard, actor, restart);
            child.monitor(ctx.myself());
            if let Some(n) = &name {
                registry::replace(&ctx.me.shard.registry, n, &child);
            }
            let id = child.id();
            let again = child.clone();
            Some(Running {
                id,
                stop: Box::new(move || child.stop()),
                restart: Box::new(move |reason| again.restart_in_place(reason)),
            })
        });
        self.children.push(Child { start, running: None, ended: false });
        self
    }

    /// Starts child `i`; a maker that panics fails the supervisor (its
    /// `stopped` hook then stops the children already running).
    fn start(&mut self, i: usize, ctx: &mut Context<Self>) -> bool {
        let policy = self.policy.clone().expect("set in started");
        match (self.children[i].start)(ctx, &policy) {
            Some(running) => {
                self.children[i].running = Some(running);
                self.children[i].ended = false;
                true
            }
            None => {
                ctx.stop_with(StopReason::Panicked("a child's maker panicked".into()));
                false
            }
        }
    }

    fn stop(&mut self, i: usize) {
        if let Some(r) = self.children[i].running.take() {
            (r.stop)();
        }
    }

    /// The children that follow child `i`'s failure by the strategy.
    fn affected(&self, i: usize) -> std::ops::Range<usize> {
        match self.strategy {
            Strategy::OneForOne => i..i + 1,
            Strategy::OneForAll => 0..self.children.len(),
            Strategy::RestForOne => i..self.children.len(),
        }
    }

    /// Past the intensity: stop the children and then itself.
    fn give_up(&mut self, reason: &StopReason, ctx: &mut Context<Self>) {
        tracing::error!(
            supervisor = ctx.myself().id(),
            %reason,
            max_restarts = self.max_restarts,
            within = ?self.within,
            "supervisor gave up: past its restart intensity"
        );
        if let Some(f) = self.on_give_up.take() {
            f(reason);
        }
        ctx.stop_with(StopReason::RestartIntensity);
    }
}

impl Actor for Supervisor {
    fn started(&mut self, ctx: &mut Context<Self>) {
        let state = PolicyState {
            restarts: VecDeque::new(),
            gave_up: false,
            sup: Some(ctx.myself().clone()),
        };
        self.policy = Some(Arc::new(Policy {
            strategy: self.strategy,
            max_restarts: self.max_restarts,
            within: self.within,
            state: Mutex::new(state),
        }));
        for i in 0..self.children.len() {
            if !self.start(i, ctx) {
                return;
            }
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if let Some(p) = &self.policy {
            lock(&p.state).sup = None; // no more notes to a stopped supervisor
        }
        for i in (0..self.children.len()).rev() {
            self.stop(i);
        }
    }
}

impl Handler<SiblingFailed> for Supervisor {
    fn handle(&mut self, f: SiblingFailed, _ctx: &mut Context<Self>) {
        let Some(i) =
            self.children.iter().position(|c| c.running.as_ref().is_some_and(|r| r.id == f.actor))
        else {
            return;
        };
        for j in self.affected(i).filter(|&j| j != i) {
            if let Some(r) = &self.children[j].running {
                (r.restart)(f.reason.clone());
            }
        }
    }
}

impl Handler<Down> for Supervisor {
    fn handle(&mut self, down: Down, ctx: &mut Context<Self>) {
        // A DOWN of an instance we already replaced or stopped ourselves: ignore.
        let Some(i) = self
            .children
            .iter()
            .position(|c| c.running.as_ref().is_some_and(|r| r.id == down.actor))
        else {
            return;
        };
        self.children[i].running = None;
        if !down.reason.is_abnormal() {
            self.children[i].ended = true; // ended normally: not restarted
            return;
        }
        let policy = self.policy.clone().expect("set in started");
        // In place, a child that ends abnormally is one the policy refused
        // to restart: the supervisor gives up. Fresh, every failure ends
        // the child and is counted here.
        if policy.gave_up() || !policy.count() {
            self.give_up(&down.reason, ctx);
            return;
        }
        let range = self.affected(i);
        for j in range.clone().rev() {
            self.stop(j);
        }
        for j in range {
            if (j == i || !self.children[j].ended) && !self.start(j, ctx) {
                return;
            }
        }
    }
}
