//! Supervision, built on monitors ([`crate::ActorRef::monitor`]: one
//! [`Down`] when the watched actor stops, with the reason).
//!
//! A [`Supervisor`] is an
//! actor that starts its children, monitors them, and restarts failed ones
//! (a child that stops abnormally: [`StopReason::is_abnormal`]; a normal
//! stop is not restarted) by its [`Strategy`], up to an OTP-style intensity
//! limit: more than `max_restarts` restarts within `within` and the
//! supervisor stops its children and itself with
//! [`StopReason::RestartIntensity`], which its own monitors (or its own
//! supervisor) see.
//!
//! Children are co-located on the supervisor's shard and, when given a name,
//! registered under it after every (re)start, so callers find the current
//! instance with [`crate::System::lookup`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::actor::{registry, Actor, Context, Down, Handler};
use crate::error::StopReason;

/// Which children a supervisor restarts when one fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// Only the failed child.
    OneForOne,
    /// Every child: the others are stopped, then all start again in order.
    OneForAll,
    /// The failed child and every child started after it.
    RestForOne,
}

struct Running {
    id: u64,
    stop: Box<dyn Fn() + Send>,
}

/// Starts one instance; `None` when the child's constructor panicked.
type Starter = Box<dyn FnMut(&Context<Supervisor>) -> Option<Running> + Send>;

struct Child {
    start: Starter,
    running: Option<Running>,
    /// Its last instance ended normally: not restarted with its siblings.
    ended: bool,
}

/// A supervisor: see the module docs.
///
/// ```
/// use std::time::Duration;
/// use ringmail::{Actor, Strategy, Supervisor, System};
///
/// struct Worker;
/// impl Actor for Worker {}
///
/// let system = System::new();
/// let sup = system.spawn(
///     Supervisor::new(Strategy::OneForOne)
///         .intensity(3, Duration::from_secs(5)) // more than 3 restarts in 5 s: give up
///         .child(Some("worker"), || Worker),
/// )?;
/// // The current instance is registered under its name after every start.
/// let deadline = std::time::Instant::now() + Duration::from_secs(5);
/// while system.lookup::<Worker>("worker").is_none() {
///     assert!(std::time::Instant::now() < deadline);
///     std::thread::sleep(Duration::from_millis(1));
/// }
/// assert!(sup.is_alive());
/// # Ok::<(), ringmail::SpawnError>(())
/// ```
pub struct Supervisor {
    strategy: Strategy,
    max_restarts: usize,
    within: Duration,
    children: Vec<Child>,
    restarts: VecDeque<Instant>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let running: Vec<Option<u64>> =
            self.children.iter().map(|c| c.running.as_ref().map(|r| r.id)).collect();
        f.debug_struct("Supervisor")
            .field("strategy", &self.strategy)
            .field("max_restarts", &self.max_restarts)
            .field("within", &self.within)
            .field("children", &running)
            .field("recent_restarts", &self.restarts.len())
            .finish()
    }
}

impl Supervisor {
    /// A supervisor with `strategy` and the default intensity (3 restarts in 5 s).
    pub fn new(strategy: Strategy) -> Self {
        Supervisor {
            strategy,
            max_restarts: 3,
            within: Duration::from_secs(5),
            children: Vec::new(),
            restarts: VecDeque::new(),
        }
    }

    /// At most `max_restarts` restarts within `within`; one more and the
    /// supervisor gives up.
    pub fn intensity(mut self, max_restarts: usize, within: Duration) -> Self {
        self.max_restarts = max_restarts;
        self.within = within;
        self
    }

    /// Adds a child made by `make` (called at every start), registered as
    /// `name` when one is given. Children start in the order they are added.
    pub fn child<A: Actor>(
        mut self,
        name: Option<&str>,
        mut make: impl FnMut() -> A + Send + 'static,
    ) -> Self {
        let name = name.map(str::to_string);
        let start: Starter = Box::new(move |ctx: &Context<Supervisor>| {
            let actor = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut make)).ok()?;
            let child = ctx.spawn(actor);
            child.monitor(ctx.myself());
            if let Some(n) = &name {
                registry::replace(&ctx.me.shard.registry, n, &child);
            }
            let id = child.id();
            Some(Running { id, stop: Box::new(move || child.stop()) })
        });
        self.children.push(Child { start, running: None, ended: false });
        self
    }

    /// Starts child `i`; a constructor that panics fails the supervisor
    /// (its `stopped` hook then stops the children already running).
    fn start(&mut self, i: usize, ctx: &mut Context<Self>) -> bool {
        match (self.children[i].start)(ctx) {
            Some(running) => {
                self.children[i].running = Some(running);
                self.children[i].ended = false;
                true
            }
            None => {
                ctx.stop_with(StopReason::Panicked("a child's constructor panicked".into()));
                false
            }
        }
    }

    fn stop(&mut self, i: usize) {
        if let Some(r) = self.children[i].running.take() {
            (r.stop)();
        }
    }
}

impl Actor for Supervisor {
    fn started(&mut self, ctx: &mut Context<Self>) {
        for i in 0..self.children.len() {
            if !self.start(i, ctx) {
                return;
            }
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for i in (0..self.children.len()).rev() {
            self.stop(i);
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
        let now = Instant::now();
        while self.restarts.front().is_some_and(|t| now.duration_since(*t) > self.within) {
            self.restarts.pop_front();
        }
        if self.restarts.len() >= self.max_restarts {
            ctx.stop_with(StopReason::RestartIntensity);
            return;
        }
        self.restarts.push_back(now);
        let range = match self.strategy {
            Strategy::OneForOne => i..i + 1,
            Strategy::OneForAll => 0..self.children.len(),
            Strategy::RestForOne => i..self.children.len(),
        };
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
