//! The name registry: actors registered by name, looked up from any thread.
//!
//! A concurrent map (`dashmap`) from name to a type-checked `ActorRef`. A
//! registration is removed when its actor stops (normally, by panic or at
//! shutdown), so a lookup never returns a dead actor for long: between the
//! stop and the removal, [`ActorRef::is_alive`] already says false.

use std::any::{Any, TypeId};
use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;

use crate::actor::Actor;
use crate::actor_ref::ActorRef;

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

/// A name is already taken (or the actor already stopped); the reference
/// is handed back.
pub struct NameTaken<A: Actor>(pub ActorRef<A>);

impl<A: Actor> std::fmt::Debug for NameTaken<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("NameTaken").field(&self.0).finish()
    }
}

impl<A: Actor> std::fmt::Display for NameTaken<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the name is already registered")
    }
}
impl<A: Actor> std::error::Error for NameTaken<A> {}

impl Registry {
    pub(crate) fn register<A: Actor>(
        self: &Arc<Self>,
        name: &str,
        actor: ActorRef<A>,
    ) -> Result<(), NameTaken<A>> {
        if !actor.is_alive() {
            return Err(NameTaken(actor));
        }
        match self.names.entry(name.to_string()) {
            Entry::Occupied(_) => Err(NameTaken(actor)),
            Entry::Vacant(v) => {
                actor.shared.add_name(name.to_string());
                let id = actor.id();
                v.insert(Registered {
                    id,
                    type_id: TypeId::of::<A>(),
                    actor: Box::new(actor.clone()),
                });
                // The actor may have stopped between the check and the insert:
                // its stop already ran the name removal, so undo ours.
                if !actor.is_alive() {
                    self.remove(name, id);
                }
                Ok(())
            }
        }
    }

    pub(crate) fn lookup<A: Actor>(&self, name: &str) -> Option<ActorRef<A>> {
        let e = self.names.get(name)?;
        if e.type_id != TypeId::of::<A>() {
            return None;
        }
        e.actor.downcast_ref::<ActorRef<A>>().filter(|a| a.is_alive()).cloned()
    }

    /// Registers `actor` under `name`, replacing whoever had it (supervisors
    /// re-registering a restarted child while the old instance still stops).
    pub(crate) fn replace<A: Actor>(&self, name: &str, actor: ActorRef<A>) {
        actor.shared.add_name(name.to_string());
        let id = actor.id();
        let alive = actor.is_alive();
        self.names.insert(
            name.to_string(),
            Registered { id, type_id: TypeId::of::<A>(), actor: Box::new(actor) },
        );
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
