//! The name store: names to actors, read from every thread.
//!
//! A concurrent map (`dashmap`) from name to an entry holding the actor's
//! id, its type and its reference as `dyn Any` (the typed side,
//! `actor/registry.rs`, puts `ActorRef<A>`s in and downcasts them out). A
//! registration is removed when its actor stops (normally, by panic or at
//! shutdown: the shard loop removes every name the cell lists), so a lookup
//! never returns a dead actor for long: between the stop and the removal,
//! the cell already says it is not alive.

use std::any::{Any, TypeId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::cell::{ActorCell, GroupKey, Watcher};
use super::envelope::Erased;
use crate::error::StopReason;

struct Registered {
    id: u64,
    type_id: TypeId,
    actor: Box<dyn Any + Send + Sync>,
}

/// A group member.
#[derive(Clone)]
pub(crate) struct Member {
    /// Its id (a remote member's: its stand-in's).
    pub(crate) id: u64,
    /// Its reference as `dyn Any` (the typed side puts a `Recipient<M>` in).
    pub(crate) typed: Arc<dyn Any + Send + Sync>,
    /// The actor itself when it runs on this node (`None`: a stand-in for a
    /// member of another node). The node spreads only these.
    pub(crate) local: Option<Arc<dyn Reachable>>,
}

/// A local actor as another node reaches it: what the distributed layer
/// needs to deliver a peer's message to it without waiting, to hear of its
/// stop, and to hand its typed reference back. Implemented by the typed
/// `ActorRef`, so the layers above the runtime can export an actor without
/// knowing its type.
pub(crate) trait Reachable: Send + Sync {
    /// The actor's id.
    fn id(&self) -> u64;
    /// The actor's type (decoders are registered per actor type).
    fn actor_type(&self) -> TypeId;
    /// The actor type's name.
    fn type_name(&self) -> &'static str;
    /// Delivers without waiting, within the actor's mailbox bound: a full
    /// mailbox or a full transport queue hands it back.
    fn try_deliver(&self, m: Box<dyn Erased>) -> Result<(), Box<dyn Erased>>;
    /// When its mailbox is full: registers `w` to run once it has drained
    /// to half its capacity (or the actor stops) and returns false. When it
    /// has room (what was full was the transport queue to its shard, or it
    /// drained meanwhile): returns true and registers nothing, so a retry
    /// that fails on the transport queue never wakes itself.
    fn wake_on_room(&self, w: crate::runtime::cell::Waker) -> bool;
    /// Runs `w` once when the actor stops (at once if it has).
    fn watch(&self, w: Watcher);
    /// Whether it still runs.
    fn is_alive(&self) -> bool;
    /// Its typed reference (`ActorRef<A>`).
    fn typed(&self) -> &(dyn Any + Send + Sync);
    /// Stops it (a stop sent from another node).
    fn stop_with(&self, reason: StopReason);
    /// Actor `from` of node `node`, linked to it, failed with `reason`:
    /// trapped, or a stop.
    fn exit(&self, from: u64, node: String, reason: StopReason);
}

/// The registry shared by a system and its shards: names, and groups.
#[derive(Default)]
pub(crate) struct Registry {
    names: DashMap<String, Registered>,
    /// Group (name, message type) -> its members, in join order.
    groups: DashMap<GroupKey, Vec<Member>>,
    /// Counts changes of group membership (joins and leaves that changed
    /// something), so a reader can tell cheaply that nothing changed.
    group_changes: AtomicU64,
}

impl Registry {
    /// Registers `actor` (whose cell is `cell`, whose type is `type_id`)
    /// under `name`. False when the name is taken or the actor has stopped.
    pub(crate) fn register(
        &self,
        name: &str,
        cell: &ActorCell,
        type_id: TypeId,
        actor: Box<dyn Any + Send + Sync>,
    ) -> bool {
        if !cell.is_alive() {
            return false;
        }
        match self.names.entry(name.to_string()) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                cell.add_name(name.to_string());
                let id = cell.id;
                v.insert(Registered { id, type_id, actor });
                // The actor may have stopped between the check and the insert:
                // its stop already ran the name removal, so undo ours.
                if !cell.is_alive() {
                    self.remove(name, id);
                }
                true
            }
        }
    }

    /// Runs `f` on the reference registered under `name` if its type is
    /// `type_id`.
    pub(crate) fn lookup<R>(
        &self,
        name: &str,
        type_id: TypeId,
        f: impl FnOnce(&(dyn Any + Send + Sync)) -> Option<R>,
    ) -> Option<R> {
        let e = self.names.get(name)?;
        if e.type_id != type_id {
            return None;
        }
        f(&*e.actor)
    }

    /// Registers `actor` under `name`, replacing whoever had it (supervisors
    /// re-registering a restarted child while the old instance still stops).
    pub(crate) fn replace(
        &self,
        name: &str,
        cell: &ActorCell,
        type_id: TypeId,
        actor: Box<dyn Any + Send + Sync>,
    ) {
        cell.add_name(name.to_string());
        let id = cell.id;
        let alive = cell.is_alive();
        self.names.insert(name.to_string(), Registered { id, type_id, actor });
        if !alive {
            self.remove(name, id);
        }
    }

    /// Removes `name` if it still names actor `id`.
    pub(crate) fn remove(&self, name: &str, id: u64) {
        self.names.remove_if(name, |_, r| r.id == id);
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// Adds `member` to `group` unless it is in already; true if added.
    pub(crate) fn join(&self, group: &GroupKey, member: Member) -> bool {
        let mut members = self.groups.entry(group.clone()).or_default();
        if members.iter().any(|m| m.id == member.id) {
            return false;
        }
        members.push(member);
        drop(members);
        self.group_changes.fetch_add(1, Ordering::Release);
        true
    }

    /// Removes member `id` from `group` (an empty group goes).
    pub(crate) fn leave(&self, group: &GroupKey, id: u64) {
        let mut left = false;
        if let Some(mut members) = self.groups.get_mut(group) {
            let before = members.len();
            members.retain(|m| m.id != id);
            left = members.len() != before;
        }
        self.groups.remove_if(group, |_, m| m.is_empty());
        if left {
            self.group_changes.fetch_add(1, Ordering::Release);
        }
    }

    /// How many times group membership has changed so far (compare two
    /// readings to learn whether anything changed between them).
    pub(crate) fn group_changes(&self) -> u64 {
        self.group_changes.load(Ordering::Acquire)
    }

    /// The members of `group`, in join order.
    pub(crate) fn members(&self, group: &GroupKey) -> Vec<Member> {
        self.groups.get(group).map(|m| m.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StopReason;

    fn lookup_u32(r: &Registry, name: &str) -> Option<u32> {
        r.lookup(name, TypeId::of::<u32>(), |a| a.downcast_ref::<u32>().copied())
    }

    #[test]
    fn a_name_is_taken_once_and_typed() {
        let r = Registry::default();
        let a = ActorCell::new(1, 1);
        let b = ActorCell::new(2, 1);
        assert!(r.register("x", &a, TypeId::of::<u32>(), Box::new(10u32)));
        assert!(!r.register("x", &b, TypeId::of::<u32>(), Box::new(20u32)), "taken");
        assert_eq!(lookup_u32(&r, "x"), Some(10));
        let as_string = r.lookup("x", TypeId::of::<String>(), |_| Some(()));
        assert!(as_string.is_none(), "a lookup for another type finds nothing");
        assert_eq!(a.take_names(), vec!["x".to_string()], "the cell lists its name");
        assert!(b.take_names().is_empty());
    }

    #[test]
    fn a_stopped_actor_is_not_registered() {
        let r = Registry::default();
        let a = ActorCell::new(1, 1);
        a.set_stopped(StopReason::Normal);
        assert!(!r.register("x", &a, TypeId::of::<u32>(), Box::new(1u32)));
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn removal_is_by_id_so_a_replacement_survives_the_old_instance_stopping() {
        let r = Registry::default();
        let old = ActorCell::new(1, 1);
        let new = ActorCell::new(2, 1);
        assert!(r.register("svc", &old, TypeId::of::<u32>(), Box::new(1u32)));
        r.replace("svc", &new, TypeId::of::<u32>(), Box::new(2u32));
        r.remove("svc", old.id); // the old instance's stop removes only its own entry
        assert_eq!(lookup_u32(&r, "svc"), Some(2));
        r.remove("svc", new.id);
        assert_eq!(lookup_u32(&r, "svc"), None);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn replacing_with_a_stopped_actor_leaves_no_entry() {
        let r = Registry::default();
        let dead = ActorCell::new(3, 1);
        dead.set_stopped(StopReason::Normal);
        r.replace("svc", &dead, TypeId::of::<u32>(), Box::new(3u32));
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn group_changes_count_only_what_changed() {
        let r = Registry::default();
        let key: GroupKey = ("g".into(), TypeId::of::<u32>());
        let member = |id| Member { id, typed: Arc::new(id), local: None };
        let c0 = r.group_changes();
        assert!(r.join(&key, member(1)));
        assert!(!r.join(&key, member(1)), "in already");
        assert_eq!(r.group_changes(), c0 + 1);
        r.leave(&key, 2); // not a member
        assert_eq!(r.group_changes(), c0 + 1);
        r.leave(&key, 1);
        assert_eq!(r.group_changes(), c0 + 2);
        assert!(r.members(&key).is_empty());
    }
}
