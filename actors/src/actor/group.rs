//! Process groups, pub-sub and routers, on one node (Erlang's `pg`, local
//! scope).
//!
//! A [`Group`] is a named set of actors that handle one message type `M`
//! (the group is `(name, M)`: two groups of one name with different message
//! types are different groups). An actor joins and leaves; one that stops
//! leaves every group at once (its cell lists its groups, and its shard
//! takes it out of each when it stops). Membership is
//! strongly consistent on the node: a join or leave is seen by every
//! thread as soon as it returns. A restart in place keeps the actor in its
//! groups, since its reference stays valid.
//!
//! [`Group::publish`] sends a clone of a message to every member: each
//! member gets each publication once, in the order one publisher published
//! (per-sender order of `tell`). A member whose mailbox is full holds the
//! publisher back as any `tell` does: inside a handler the publishing
//! actor pauses (never its shard), from another thread the call waits.
//! Every copy a member did not take is counted as a dead letter (a member
//! that stopped meanwhile; one that was full where nothing may wait, a
//! timer or I/O closure on a shard's thread; a system stopping).
//!
//! A [`Router`] is one handle over a fixed set of recipients or a group,
//! that picks a member per message: round-robin, by a key's hash
//! (rendezvous hashing: the same key always reaches the same member while
//! the set does not change, and a member joining takes over only about
//! `1/n` of the keys, one leaving hands over only its own), the least
//! loaded (fewest queued messages), or all of them.
//!
//! A group spans one node unless a node spreads it
//! (`ringmail::remote::Node::group`): then its members are those of every
//! node that spreads it, and remote members are reached as any remote
//! actor is (see the `remote` module's "Groups across nodes").

use std::any::TypeId;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{ActorRef, Handler, Message, Recipient};
use crate::error::TellError;
use crate::runtime::lock;
use crate::runtime::registry::{Member, Reachable, Registry};

/// A named group of actors that handle `M` (see the module docs). Made by
/// [`crate::System::group`] or [`crate::Context::group`]; cheap to clone.
pub struct Group<M: Message> {
    key: (String, TypeId),
    registry: Arc<Registry>,
    /// The members as last read from the registry, and the registry's
    /// change count then: read again only after a join or leave anywhere.
    cache: Arc<Mutex<Cached<M>>>,
    _m: PhantomData<fn(M)>,
}

struct Cached<M: Message> {
    changes: u64,
    members: Option<Arc<Vec<Recipient<M>>>>,
}

impl<M: Message> Clone for Group<M> {
    fn clone(&self) -> Self {
        Group {
            key: self.key.clone(),
            registry: self.registry.clone(),
            cache: self.cache.clone(),
            _m: PhantomData,
        }
    }
}

impl<M: Message> std::fmt::Debug for Group<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("name", &self.key.0)
            .field("message", &std::any::type_name::<M>())
            .field("members", &self.len())
            .finish()
    }
}

impl<M: Message> Group<M> {
    pub(crate) fn new(registry: &Arc<Registry>, name: &str) -> Self {
        let key = (name.to_string(), TypeId::of::<M>());
        let cache = Arc::new(Mutex::new(Cached { changes: 0, members: None }));
        Group { key, registry: registry.clone(), cache, _m: PhantomData }
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.key.0
    }

    /// Adds `actor` (once: joining again changes nothing) until it leaves
    /// or stops. An actor that has stopped already is not added.
    pub fn join<A: Handler<M>>(&self, actor: &ActorRef<A>) {
        // Noted on the cell first: its stop leaves every group the cell
        // lists. A stop between the two steps is caught by the check after.
        if !actor.cell.add_group(&self.key) {
            return;
        }
        // A reference to a remote actor (a lookup's) is a member here, but
        // not one of this node's own: a node spreads only its own, so no
        // member is ever relayed (and reached twice).
        let local: Option<Arc<dyn Reachable>> =
            if actor.cell.is_stand_in() { None } else { Some(Arc::new(actor.clone())) };
        let member = Member { id: actor.id(), typed: Arc::new(actor.recipient::<M>()), local };
        self.registry.join(&self.key, member);
        if !actor.is_alive() {
            self.registry.leave(&self.key, actor.id());
        }
    }

    /// Removes `actor` from the group.
    pub fn leave<A: Handler<M>>(&self, actor: &ActorRef<A>) {
        actor.cell.remove_group(&self.key);
        self.registry.leave(&self.key, actor.id());
    }

    /// The members that run, in the order they joined.
    pub fn members(&self) -> Vec<Recipient<M>> {
        self.snapshot().iter().filter(|r| r.is_alive()).cloned().collect()
    }

    /// The registry's members (some may have stopped since), read again
    /// only when membership changed: a publish or a routed send does not
    /// walk the registry each time.
    fn snapshot(&self) -> Arc<Vec<Recipient<M>>> {
        // The count is read before the members: a change after it shows
        // as a newer count next time (and a read again).
        let changes = self.registry.group_changes();
        let mut c = lock(&self.cache);
        if let Some(m) = c.members.as_ref().filter(|_| c.changes == changes) {
            return m.clone();
        }
        let members: Vec<Recipient<M>> = self
            .registry
            .members(&self.key)
            .into_iter()
            .filter_map(|m| m.typed.downcast_ref::<Recipient<M>>().cloned())
            .collect();
        let members = Arc::new(members);
        *c = Cached { changes, members: Some(members.clone()) };
        members
    }

    /// How many members the group has.
    pub fn len(&self) -> usize {
        self.snapshot().iter().filter(|r| r.is_alive()).count()
    }

    /// True when the group has no member.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sends a clone of `msg` to every member (see the module docs for
    /// order and backpressure); returns how many took it. Every copy a
    /// member did not take is a dead letter: a member that stopped
    /// meanwhile, one that was full where nothing may wait (a shard's
    /// thread outside a handler: a timer or I/O closure), or a system that
    /// is stopping.
    ///
    /// The copies leave together. From a thread that is not a shard, each
    /// publication is one flush, which wakes each subscriber's shard: a
    /// loop that publishes many should run inside [`crate::batched`]
    /// (the `pubsub` benchmark measures about 10x more deliveries per
    /// second so, and as many from inside an actor, where sends are always
    /// batched).
    pub fn publish(&self, msg: M) -> usize
    where
        M: Clone,
    {
        send_each(&self.snapshot(), &msg)
    }
}

/// How a [`Router`] picks a member for a message.
#[non_exhaustive]
pub enum Routing<M> {
    /// Each member in turn.
    RoundRobin,
    /// The member with the fewest queued messages (ties: the first).
    LeastLoaded,
    /// By a key of the message: the member whose id, hashed with the key,
    /// weighs most (rendezvous hashing; see the module docs). A remote
    /// member's id is its stand-in's on this node, so two nodes may route
    /// one key to different members.
    Hashed(Box<dyn Fn(&M) -> u64 + Send + Sync>),
}

impl<M> std::fmt::Debug for Routing<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Routing::RoundRobin => "RoundRobin",
            Routing::LeastLoaded => "LeastLoaded",
            Routing::Hashed(_) => "Hashed",
        })
    }
}

/// Where a router's members come from.
enum Members<M: Message> {
    Fixed(Vec<Recipient<M>>),
    Group(Group<M>),
    /// Looked up at each send (a supervised pool's children, by name).
    Resolved(Box<dyn Fn() -> Vec<Recipient<M>> + Send + Sync>),
}

/// One handle over several actors that handle `M` (see the module docs).
pub struct Router<M: Message> {
    members: Members<M>,
    routing: Routing<M>,
    next: AtomicUsize,
}

impl<M: Message> std::fmt::Debug for Router<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("routing", &self.routing)
            .field("members", &self.members().len())
            .finish()
    }
}

impl<M: Message> Router<M> {
    /// A router over a fixed pool (e.g. a supervisor's children, whose
    /// references survive restarts in place).
    pub fn new(pool: Vec<Recipient<M>>, routing: Routing<M>) -> Self {
        Router { members: Members::Fixed(pool), routing, next: AtomicUsize::new(0) }
    }

    /// A router over a group's members at each send.
    pub fn over(group: Group<M>, routing: Routing<M>) -> Self {
        Router { members: Members::Group(group), routing, next: AtomicUsize::new(0) }
    }

    /// A router over the members `resolve` gives at each send (see
    /// `Supervisor::pool`).
    pub(crate) fn resolved(
        resolve: Box<dyn Fn() -> Vec<Recipient<M>> + Send + Sync>,
        routing: Routing<M>,
    ) -> Self {
        Router { members: Members::Resolved(resolve), routing, next: AtomicUsize::new(0) }
    }

    fn members(&self) -> Vec<Recipient<M>> {
        match &self.members {
            Members::Fixed(pool) => pool.iter().filter(|r| r.is_alive()).cloned().collect(),
            Members::Group(g) => g.members(),
            Members::Resolved(f) => f().into_iter().filter(Recipient::is_alive).collect(),
        }
    }

    /// How many members it routes among now (those that run).
    pub fn len(&self) -> usize {
        self.members().len()
    }

    /// True when it has no member that runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The member `msg` goes to, if any.
    pub fn pick(&self, msg: &M) -> Option<Recipient<M>> {
        let members = self.members();
        if members.is_empty() {
            return None;
        }
        let i = match &self.routing {
            Routing::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % members.len(),
            Routing::LeastLoaded => {
                (0..members.len()).min_by_key(|&i| members[i].queued()).unwrap_or(0)
            }
            Routing::Hashed(key) => {
                let k = key(msg);
                (0..members.len()).max_by_key(|&i| weight(k, members[i].id())).unwrap_or(0)
            }
        };
        members.into_iter().nth(i)
    }

    /// Sends `msg` to the member the routing picks (waiting like `tell`
    /// while its mailbox is full); `Stopped` when there is no member (then
    /// counted as a dead letter, as a send to a stopped actor is).
    pub fn tell(&self, msg: M) -> Result<(), TellError<M>> {
        match self.pick(&msg) {
            Some(m) => m.tell(msg),
            None => {
                crate::runtime::dead_letter();
                Err(TellError::Stopped(msg))
            }
        }
    }

    /// Sends a clone of `msg` to every member; returns how many took it
    /// (each copy not taken is a dead letter, as with [`Group::publish`]).
    pub fn broadcast(&self, msg: M) -> usize
    where
        M: Clone,
    {
        send_each(&self.members(), &msg)
    }
}

/// The weight of member `id` for key `key` (rendezvous hashing): a mix of
/// both (SplitMix64's finalizer) spread evenly over `u64`, so the heaviest
/// member is a uniform choice per key, and stays the choice while it is in
/// the set.
fn weight(key: u64, id: u64) -> u64 {
    let mut z = key ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Tells a clone of `msg` to each of `to`; a copy not taken is counted as a
/// dead letter (a `Stopped` one is counted by the send already).
///
/// The copies leave in one batch (`batched`): from a thread that is not a
/// shard, one `io_uring_enter` per publication instead of one per member.
fn send_each<M: Message + Clone>(to: &[Recipient<M>], msg: &M) -> usize {
    crate::runtime::route::batched(|| {
        let mut took = 0;
        for m in to.iter().filter(|m| m.is_alive()) {
            match m.tell(msg.clone()) {
                Ok(()) => took += 1,
                Err(TellError::Stopped(_)) => {}
                Err(_) => m.count_dead_letter(),
            }
        }
        took
    })
}

#[cfg(test)]
mod tests {
    use super::weight;

    /// The member a key goes to among `ids`.
    fn owner(key: u64, ids: &[u64]) -> u64 {
        *ids.iter().max_by_key(|&&id| weight(key, id)).unwrap()
    }

    #[test]
    fn rendezvous_hashing_spreads_keys_evenly_and_moves_only_the_newcomers_share() {
        let ids: Vec<u64> = (1..=8).map(|i| i * 1000 + 7).collect();
        let keys = 40_000u64;
        let mut per = std::collections::HashMap::new();
        for k in 0..keys {
            *per.entry(owner(k, &ids)).or_insert(0u64) += 1;
        }
        for (&id, &n) in &per {
            // 5 000 each on average.
            assert!((4_500..5_500).contains(&n), "member {id} got {n} of {keys}");
        }
        // A ninth member takes about 1/9 of the keys, all from the others;
        // no key moves between two old members.
        let mut more = ids.clone();
        more.push(99_999);
        let mut moved = 0;
        for k in 0..keys {
            let (before, after) = (owner(k, &ids), owner(k, &more));
            if before != after {
                assert_eq!(after, 99_999, "key {k} moved between old members");
                moved += 1;
            }
        }
        let share = moved as f64 / keys as f64;
        assert!((0.09..0.13).contains(&share), "moved {share} of the keys, not about 1/9");
        // And when it leaves, exactly its keys go back where they were.
        for k in 0..keys {
            assert_eq!(owner(k, &ids), owner(k, &more[..8]));
        }
    }
}
