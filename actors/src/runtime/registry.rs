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
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::cell::{ActorCell, GroupKey};

struct Registered {
    id: u64,
    type_id: TypeId,
    actor: Box<dyn Any + Send + Sync>,
}

/// A group member: its id and its reference as `dyn Any` (the typed side
/// puts a `Recipient<M>` in).
pub(crate) type Member = (u64, Arc<dyn Any + Send + Sync>);

/// The registry shared by a system and its shards: names, and groups.
#[derive(Default)]
pub(crate) struct Registry {
    names: DashMap<String, Registered>,
    /// Group (name, message type) -> its members, in join order.
    groups: DashMap<GroupKey, Vec<Member>>,
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

    /// Adds member `id` to `group` unless it is in already; true if added.
    pub(crate) fn join(&self, group: &GroupKey, id: u64, r: Arc<dyn Any + Send + Sync>) -> bool {
        let mut members = self.groups.entry(group.clone()).or_default();
        if members.iter().any(|(m, _)| *m == id) {
            return false;
        }
        members.push((id, r));
        true
    }

    /// Removes member `id` from `group` (an empty group goes).
    pub(crate) fn leave(&self, group: &GroupKey, id: u64) {
        if let Some(mut members) = self.groups.get_mut(group) {
            members.retain(|(m, _)| *m != id);
        }
        self.groups.remove_if(group, |_, m| m.is_empty());
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
}
