//! Named scopes: where in the model code an instruction comes from (`encoder/layer1/attn`),
//! whether it is part of the backward pass (the `grad` marker), and which checkpoint region
//! the model code placed it in (the `checkpoint` mark).
//!
//! A program keeps one [`Scopes`] table; every instruction holds a [`ScopeId`] into it (4
//! bytes, copied with the instruction, never a string per instruction). Scopes are metadata:
//! no pass reads them to decide what to compute, except rematerialisation, which chooses
//! what to recompute by them (the backward pass, layers, checkpoint regions) and never
//! changes a value; two programs are equal when their instructions have equal scope paths,
//! markers and marks, whatever the ids.
//!
//! Checkpoint regions: model code opens a scope with [`Scopes::checkpoint_child`] (the
//! builder's [`checkpoint_scope`](crate::Builder::checkpoint_scope)) to say "recompute this
//! in the backward pass instead of keeping its activations" (`autodiff`'s `marked` remat
//! policy). The mark is the region's path, carried by the scope and by every scope opened
//! inside it ([`Scopes::child`]) and by their backward scopes ([`Scopes::grad_of`]); a
//! region opened inside another is its own region (the innermost mark wins). Everything that
//! copies a program copies its table, so the marks survive gradients, rematerialisation and
//! partitioning, and the text format prints them (`"encoder/layer0/ffn/norm"
//! checkpoint="encoder/layer0/ffn"`).

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

/// One scope: a `/`-separated path, whether it is the backward pass of that path, and the
/// checkpoint region the model code placed it in.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Scope {
    pub path: String,
    pub grad: bool,
    /// The path of the checkpoint region this scope lies in (`None`: none): `path` itself
    /// or a prefix of it ending where a segment ends ([`Scope::check`]).
    pub checkpoint: Option<String>,
}

impl Scope {
    /// The forward scope `path`, unmarked.
    pub fn new(path: &str) -> Scope {
        Scope {
            path: path.to_string(),
            ..Scope::default()
        }
    }

    /// The path segments (none for the root).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.path.split('/').filter(|s| !s.is_empty())
    }

    /// The path of the checkpoint region this scope lies in, if the model code placed it in
    /// one.
    pub fn checkpoint_region(&self) -> Option<&str> {
        self.checkpoint.as_deref()
    }

    /// Whether the mark is well formed: a region is a non-empty path that is this scope's
    /// path or contains it (`encoder/layer0/ffn` contains `encoder/layer0/ffn/norm`, not
    /// `encoder/layer0/ffn2`). The error says what is wrong, in one line.
    pub fn check(&self) -> Result<(), String> {
        match &self.checkpoint {
            None => Ok(()),
            Some(r) if r.is_empty() => Err(format!(
                "scope {:?} is marked with an empty checkpoint region; a region is a scope path such as \"encoder/layer0/ffn\"",
                self.path
            )),
            Some(r) if !within(&self.path, r) => Err(format!(
                "checkpoint region {r:?} does not contain scope {:?}; use the scope's path or a prefix of it that ends at a `/`",
                self.path
            )),
            Some(_) => Ok(()),
        }
    }
}

/// Whether scope path `path` is `scope` or lies under it (`a/b` is under `a`, `ab` is not).
pub fn within(path: &str, scope: &str) -> bool {
    path.strip_prefix(scope)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "(top level)"
        } else {
            &self.path
        };
        f.write_str(path)?;
        if self.grad {
            f.write_str(" [grad]")?;
        }
        if let Some(r) = &self.checkpoint {
            write!(f, " [checkpoint {r}]")?;
        }
        Ok(())
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

    /// The scope `name` inside `parent` (same marker, same checkpoint region).
    pub fn child(&mut self, parent: ScopeId, name: &str) -> ScopeId {
        let p = self.get(parent);
        let path = if p.path.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", p.path)
        };
        let scope = Scope {
            path,
            grad: p.grad,
            checkpoint: p.checkpoint.clone(),
        };
        self.intern(scope)
    }

    /// The scope `name` inside `parent` (same marker), marked as a checkpoint region of its
    /// own: its path is the region of it and of every scope opened inside it. An empty path
    /// (an empty `name` at the root) is no region: that scope stays unmarked.
    pub fn checkpoint_child(&mut self, parent: ScopeId, name: &str) -> ScopeId {
        let id = self.child(parent, name);
        let s = self.get(id);
        if s.path.is_empty() || s.checkpoint.as_ref() == Some(&s.path) {
            return id;
        }
        let scope = Scope {
            checkpoint: Some(s.path.clone()),
            ..s.clone()
        };
        self.intern(scope)
    }

    /// The backward-pass scope of `id`: the same path and checkpoint region with the `grad`
    /// marker.
    pub fn grad_of(&mut self, id: ScopeId) -> ScopeId {
        let s = self.get(id);
        if s.grad {
            return id;
        }
        let scope = Scope {
            grad: true,
            ..s.clone()
        };
        self.intern(scope)
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

    /// The checkpoint region of `id`, if the model code placed it in one.
    pub fn checkpoint_region(&self, id: ScopeId) -> Option<&str> {
        self.get(id).checkpoint_region()
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
    fn checkpoint_marks_pass_to_children_and_backward_scopes() {
        let mut t = Scopes::default();
        let l0 = t.child(ScopeId::ROOT, "encoder/layer0");
        let ffn = t.checkpoint_child(l0, "ffn");
        assert_eq!(t.path(ffn), "encoder/layer0/ffn");
        assert_eq!(t.checkpoint_region(ffn), Some("encoder/layer0/ffn"));
        assert_eq!(t.checkpoint_region(l0), None);
        // The unmarked scope of the same path is another entry.
        assert_ne!(t.child(l0, "ffn"), ffn);
        let norm = t.child(ffn, "norm");
        assert_eq!(t.checkpoint_region(norm), Some("encoder/layer0/ffn"));
        let g = t.grad_of(norm);
        assert!(t.is_grad(g));
        assert_eq!(t.checkpoint_region(g), Some("encoder/layer0/ffn"));
        assert_eq!(
            t.get(g).to_string(),
            "encoder/layer0/ffn/norm [grad] [checkpoint encoder/layer0/ffn]"
        );
        // A region inside a region is its own; marking twice changes nothing.
        let inner = t.checkpoint_child(ffn, "inner");
        assert_eq!(t.checkpoint_region(inner), Some("encoder/layer0/ffn/inner"));
        assert_eq!(t.checkpoint_child(ffn, "inner"), inner);
        // The root is no region.
        let root = t.checkpoint_child(ScopeId::ROOT, "");
        assert_eq!(t.checkpoint_region(root), None);
        for (_, s) in t.iter() {
            s.check().unwrap();
        }
    }

    #[test]
    fn malformed_marks_are_one_line_errors() {
        let mark = |path: &str, region: &str| Scope {
            checkpoint: Some(region.into()),
            ..Scope::new(path)
        };
        assert!(mark("a/b", "a").check().is_ok());
        assert!(mark("a/b", "a/b").check().is_ok());
        let e = mark("ab/c", "a").check().unwrap_err();
        assert!(
            e.contains("\"a\" does not contain scope \"ab/c\"") && !e.contains('\n'),
            "{e}"
        );
        let e = mark("a", "").check().unwrap_err();
        assert!(e.contains("empty checkpoint region"), "{e}");
        assert!(within("a/b", "a") && within("a", "a") && !within("ab", "a"));
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
