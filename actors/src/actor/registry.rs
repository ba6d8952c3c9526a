//! Typed registration and lookup over the runtime's name store
//! (`runtime/registry.rs`): an `ActorRef<A>` goes in as `dyn Any` with
//! `A`'s type id, and comes out only to a lookup for the same `A`.

use std::any::TypeId;

use super::{Actor, ActorRef};
use crate::runtime::registry::Registry;

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

/// Registers `actor` under `name`, until it stops or is unregistered.
pub(crate) fn register<A: Actor>(
    registry: &Registry,
    name: &str,
    actor: &ActorRef<A>,
) -> Result<(), NameTaken<A>> {
    let boxed = Box::new(actor.clone());
    if registry.register(name, &actor.cell, TypeId::of::<A>(), boxed) {
        Ok(())
    } else {
        Err(NameTaken(actor.clone()))
    }
}

/// The live actor of type `A` registered under `name`.
pub(crate) fn lookup<A: Actor>(registry: &Registry, name: &str) -> Option<ActorRef<A>> {
    registry.lookup(name, TypeId::of::<A>(), |a| {
        a.downcast_ref::<ActorRef<A>>().filter(|a| a.is_alive()).cloned()
    })
}

/// Registers `actor` under `name`, replacing whoever had it.
pub(crate) fn replace<A: Actor>(registry: &Registry, name: &str, actor: &ActorRef<A>) {
    registry.replace(name, &actor.cell, TypeId::of::<A>(), Box::new(actor.clone()));
}
