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

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use super::cell::ActorCell;

struct Registered {
    id: u64,
    type_id: TypeId,
    actor: Box<dyn Any + Send + Sync>,
}

/// The registry shared by a system and its shards.
#[derive(Default)]
pub(crate) struct Registry {
    names: DashMap<String, Registered>,
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
}
