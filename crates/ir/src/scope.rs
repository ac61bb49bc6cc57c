//! Named scopes: where in the model code an instruction comes from (`encoder/layer1/attn`),
//! and whether it is part of the backward pass (the `grad` marker).
//!
//! A program keeps one [`Scopes`] table; every instruction holds a [`ScopeId`] into it (4
//! bytes, copied with the instruction, never a string per instruction). Scopes are metadata:
//! no pass reads them to decide what to compute, except rematerialisation, which chooses
//! what to recompute by them (the backward pass, layers, checkpoint regions) and never
//! changes a value; two programs are equal when their instructions have equal scope paths
//! and markers, whatever the ids.

use std::collections::HashMap;
use std::fmt;

/// An entry of a program's [`Scopes`] table. `ScopeId::ROOT` is the empty path (code outside
/// any scope).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ScopeId(pub u32);

impl ScopeId {
    /// The root scope: no path, no marker.
    pub const ROOT: ScopeId = ScopeId(0);

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One scope: a `/`-separated path and whether it is the backward pass of that path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Scope {
    pub path: String,
    pub grad: bool,
}

impl Scope {
    /// The path segments (none for the root).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.path.split('/').filter(|s| !s.is_empty())
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "(top level)"
        } else {
            &self.path
        };
        if self.grad {
            write!(f, "{path} [grad]")
        } else {
            f.write_str(path)
        }
    }
}

/// The scope table of a program: interned scopes, entry 0 the root.
#[derive(Clone, Debug)]
pub struct Scopes {
    entries: Vec<Scope>,
    index: HashMap<Scope, ScopeId>,
}

impl Default for Scopes {
    fn default() -> Scopes {
        let root = Scope::default();
        Scopes {
            entries: vec![root.clone()],
            index: HashMap::from([(root, ScopeId::ROOT)]),
        }
    }
}

impl Scopes {
    /// The id of `scope`, added to the table if new.
    pub fn intern(&mut self, scope: Scope) -> ScopeId {
        if let Some(&id) = self.index.get(&scope) {
            return id;
        }
        let id = ScopeId(self.entries.len() as u32);
        self.entries.push(scope.clone());
        self.index.insert(scope, id);
        id
    }

    /// The scope `name` inside `parent` (same marker).
    pub fn child(&mut self, parent: ScopeId, name: &str) -> ScopeId {
        let p = self.get(parent);
        let path = if p.path.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", p.path)
        };
        let grad = p.grad;
        self.intern(Scope { path, grad })
    }

    /// The backward-pass scope of `id`: the same path with the `grad` marker.
    pub fn grad_of(&mut self, id: ScopeId) -> ScopeId {
        let s = self.get(id);
        if s.grad {
            return id;
        }
        let path = s.path.clone();
        self.intern(Scope { path, grad: true })
    }

    /// The scope of `id` (the root for an id not in the table).
    pub fn get(&self, id: ScopeId) -> &Scope {
        self.entries.get(id.index()).unwrap_or(&self.entries[0])
    }

    /// The path of `id` (empty for the root).
    pub fn path(&self, id: ScopeId) -> &str {
        &self.get(id).path
    }

    pub fn is_grad(&self, id: ScopeId) -> bool {
        self.get(id).grad
    }

    /// The id of `scope` if the table has it.
    pub fn find(&self, scope: &Scope) -> Option<ScopeId> {
        self.index.get(scope).copied()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry with its id, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (ScopeId, &Scope)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, s)| (ScopeId(i as u32), s))
    }
}

/// The first `depth` segments of `path` joined by `/` (the whole path when shorter).
pub fn prefix(path: &str, depth: usize) -> &str {
    let mut end = 0;
    for (k, seg) in path.split('/').enumerate() {
        if k == depth {
            break;
        }
        end += seg.len() + usize::from(k > 0);
    }
    &path[..end.min(path.len())]
}

/// The layer a path belongs to: the path through its first segment named `layer<N>`
/// (`decoder/layer1/moe/dispatch` -> `decoder/layer1`), else its first segment.
pub fn layer_of(path: &str) -> &str {
    let mut end = 0;
    for (k, seg) in path.split('/').enumerate() {
        end += seg.len() + usize::from(k > 0);
        let is_layer = seg
            .strip_prefix("layer")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if is_layer {
            return &path[..end];
        }
    }
    prefix(path, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_gives_one_id_per_scope() {
        let mut t = Scopes::default();
        let enc = t.child(ScopeId::ROOT, "encoder");
        let l1 = t.child(enc, "layer1");
        assert_eq!(t.path(l1), "encoder/layer1");
        assert_eq!(t.child(enc, "layer1"), l1);
        let g = t.grad_of(l1);
        assert_ne!(g, l1);
        assert!(t.is_grad(g) && !t.is_grad(l1));
        assert_eq!(t.path(g), "encoder/layer1");
        let ga = t.child(g, "attn");
        assert_eq!(t.path(ga), "encoder/layer1/attn");
        assert!(t.is_grad(ga));
    }

    #[test]
    fn prefixes_and_layers() {
        assert_eq!(prefix("a/b/c", 2), "a/b");
        assert_eq!(prefix("a/b/c", 5), "a/b/c");
        assert_eq!(prefix("a", 0), "");
        assert_eq!(layer_of("decoder/layer1/moe/dispatch"), "decoder/layer1");
        assert_eq!(
            layer_of("optimizer/encoder/layer0/attn/wq"),
            "optimizer/encoder/layer0"
        );
        assert_eq!(layer_of("loss"), "loss");
        assert_eq!(layer_of("layers/x"), "layers");
        assert_eq!(layer_of(""), "");
    }
}
