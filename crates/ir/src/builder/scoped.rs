//! Scopes while building: the builder's current scope, given to every instruction it emits,
//! and guards that open and close scopes (checkpoint regions among them) in model code.

use super::Builder;
use crate::scope::{Scope, ScopeId};

impl Builder {
    /// The scope new instructions get.
    pub fn current_scope(&self) -> ScopeId {
        self.st.borrow().scope
    }

    /// The scope of value `v`.
    pub fn scope_of(&self, v: crate::ValueId) -> ScopeId {
        self.st.borrow().prog.instrs[v.index()].scope
    }

    /// Make `scope` (an id of this builder's table) the scope of new instructions; returns
    /// the previous one. Passes use it to give what they emit the scope of what it serves.
    pub fn set_scope(&self, scope: ScopeId) -> ScopeId {
        std::mem::replace(&mut self.st.borrow_mut().scope, scope)
    }

    /// Open scope `name` inside the current one until the guard drops:
    /// `let _s = b.scope("dispatch");`.
    pub fn scope(&self, name: &str) -> ScopeGuard {
        let mut st = self.st.borrow_mut();
        let parent = st.scope;
        let id = st.prog.scopes.child(parent, name);
        st.scope = id;
        ScopeGuard {
            b: self.clone(),
            prev: parent,
        }
    }

    /// Open scope `name` inside the current one, marked as a checkpoint region, until the
    /// guard drops: `let _s = b.checkpoint_scope("ffn");`. What the model computes inside
    /// it (scopes opened inside included) is what `autodiff`'s `marked` remat policy
    /// recomputes in the backward pass instead of keeping ([`Scopes::checkpoint_child`]).
    ///
    /// [`Scopes::checkpoint_child`]: crate::Scopes::checkpoint_child
    pub fn checkpoint_scope(&self, name: &str) -> ScopeGuard {
        let mut st = self.st.borrow_mut();
        let parent = st.scope;
        let id = st.prog.scopes.checkpoint_child(parent, name);
        st.scope = id;
        ScopeGuard {
            b: self.clone(),
            prev: parent,
        }
    }

    /// Make `scope` current (interned in this builder's table) until the guard drops.
    pub fn enter(&self, scope: Scope) -> ScopeGuard {
        let mut st = self.st.borrow_mut();
        let id = st.prog.scopes.intern(scope);
        let prev = std::mem::replace(&mut st.scope, id);
        ScopeGuard {
            b: self.clone(),
            prev,
        }
    }

    /// The backward-pass scope (`grad` marker) of `scope`, interned in this builder's table.
    pub fn grad_scope(&self, scope: ScopeId) -> ScopeId {
        self.st.borrow_mut().prog.scopes.grad_of(scope)
    }
}

/// Restores the builder's previous scope when dropped (see [`Builder::scope`]).
#[must_use = "the scope closes when the guard drops"]
pub struct ScopeGuard {
    b: Builder,
    prev: ScopeId,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        self.b.st.borrow_mut().scope = self.prev;
    }
}
