//! Named parameters with their initialisers and annotations, collected while a model is
//! built, so that training can create (and shard) their values without re-deriving shapes.
//! [`Params::scope`] names them by the builder's scope path; [`Params::checkpoint_scope`]
//! opens that scope as a checkpoint region (recomputed by the `marked` remat policy).
//!
//! Weight-update sharding (GSPMD's cross-replica weight sharding, ZeRO-3 / FSDP): with
//! [`Params::shard_weights`] over axes that replicate a weight, the weight is *stored* split
//! over them too (so are its gradient and its optimizer state, which follow its
//! annotation), and model code reads a copy annotated with the layout it asked for: the
//! partitioner all-gathers the weight just before its use and, by the transpose of that
//! copy, reduce-scatters its gradient. The gathered copy is kept for the backward pass (one
//! gather per weight and step; rematerialisation would recompute it instead).

use ir::{Builder, DType, Mesh, Sharding, Type, Value};
use sharding::ShardingError;

/// How a parameter starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Normal with this standard deviation.
    Normal(f64),
    /// Uniform on `[-limit, limit)`.
    Uniform(f64),
    Zeros,
    Ones,
}

/// One parameter of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub ty: Type,
    pub init: Init,
}

/// Creates parameters under a name prefix (`layer3/attn/wq`) and records their specs; also
/// the model's non-trainable state (buffers) and the new values the program computes for it.
pub struct Params {
    pub b: Builder,
    pub dtype: DType,
    prefix: Vec<String>,
    pub specs: Vec<ParamSpec>,
    /// Non-trainable state read by the program (no gradient, no optimizer state).
    pub buffers: Vec<ParamSpec>,
    /// `(buffer name, its value after this step)`.
    pub updates: Vec<(String, Value)>,
    /// Axes over which weights are stored split (weight-update sharding); empty: off.
    weight_axes: Vec<String>,
}

impl Params {
    pub fn new(b: &Builder, dtype: DType) -> Params {
        Params {
            b: b.clone(),
            dtype,
            prefix: Vec::new(),
            specs: Vec::new(),
            buffers: Vec::new(),
            updates: Vec::new(),
            weight_axes: Vec::new(),
        }
    }

    /// Store every annotated weight split over `axes` as well (where one of its dims
    /// divides), gathered before each use: see the module doc.
    pub fn shard_weights(mut self, axes: &[String]) -> Params {
        self.weight_axes = axes.to_vec();
        self
    }

    /// The stored layout of a weight used as `used`: the weight axes `used` leaves free,
    /// added to the first dim of `shape` they divide evenly. `None`: nothing to add.
    fn stored(&self, used: &Sharding, shape: &[usize], mesh: &Mesh) -> Option<Sharding> {
        let taken: Vec<&String> = used.dims.iter().flatten().collect();
        let free: Vec<String> = self
            .weight_axes
            .iter()
            .filter(|a| !taken.contains(a) && mesh.axis_size(a).is_some_and(|n| n > 1))
            .cloned()
            .collect();
        let k: usize = free.iter().filter_map(|a| mesh.axis_size(a)).product();
        if free.is_empty() {
            return None;
        }
        let tiles = |d: usize| -> usize {
            used.dims[d]
                .iter()
                .filter_map(|a| mesh.axis_size(a))
                .product()
        };
        let d = (0..shape.len()).find(|&d| shape[d].is_multiple_of(tiles(d) * k))?;
        let mut s = used.clone();
        s.dims[d].extend(free);
        Some(s)
    }

    /// Run `f` with `name` pushed onto the prefix, and inside the builder's scope `name`:
    /// parameters are named by the same path as the instructions that use them.
    pub fn scope<T>(&mut self, name: &str, f: impl FnOnce(&mut Params) -> T) -> T {
        self.prefix.push(name.to_string());
        let _scope = self.b.scope(name);
        let r = f(self);
        self.prefix.pop();
        r
    }

    /// [`Params::scope`] with the builder's scope `name` marked as a checkpoint region
    /// ([`ir::Builder::checkpoint_scope`]): `autodiff`'s `marked` remat policy recomputes
    /// what `f` builds in the backward pass instead of keeping its activations. Parameters
    /// are named as in [`Params::scope`].
    pub fn checkpoint_scope<T>(&mut self, name: &str, f: impl FnOnce(&mut Params) -> T) -> T {
        self.prefix.push(name.to_string());
        let _scope = self.b.checkpoint_scope(name);
        let r = f(self);
        self.prefix.pop();
        r
    }

    /// [`Params::checkpoint_scope`] when `checkpoint`, else [`Params::scope`].
    pub fn scope_marked<T>(
        &mut self,
        name: &str,
        checkpoint: bool,
        f: impl FnOnce(&mut Params) -> T,
    ) -> T {
        if checkpoint {
            self.checkpoint_scope(name, f)
        } else {
            self.scope(name, f)
        }
    }

    pub fn full_name(&self, name: &str) -> String {
        let mut parts = self.prefix.clone();
        parts.push(name.to_string());
        parts.join("/")
    }

    /// A new parameter; `dims` annotates it with mesh axes per dim when the builder has a
    /// mesh (an empty list everywhere means replicated).
    pub fn param(
        &mut self,
        name: &str,
        shape: &[usize],
        init: Init,
        dims: Option<&[&[&str]]>,
    ) -> Result<Value, ShardingError> {
        let full = self.full_name(name);
        let ty = Type::new(self.dtype, shape.to_vec());
        let v = self.b.param(&full, ty.clone());
        self.specs.push(ParamSpec {
            name: full,
            ty,
            init,
        });
        let (Some(d), Some(mesh)) = (dims, self.b.mesh()) else {
            return Ok(v);
        };
        let used = Sharding::from_dims(d);
        match self.stored(&used, shape, &mesh) {
            None => sharding::annotate::annotate(&v, used),
            Some(stored) => {
                sharding::annotate::annotate(&v, stored)?;
                sharding::annotate::annotate(&v.copy(), used)
            }
        }
    }

    /// A new buffer: non-trainable state, replicated when the builder has a mesh. The
    /// training loop keeps it between steps like a parameter (and in checkpoints) but never
    /// differentiates it; [`Params::update`] gives its next value.
    pub fn buffer(
        &mut self,
        name: &str,
        shape: &[usize],
        init: Init,
    ) -> Result<Value, ShardingError> {
        let full = self.full_name(name);
        let ty = Type::new(self.dtype, shape.to_vec());
        let v = self.b.param(&full, ty.clone());
        self.buffers.push(ParamSpec {
            name: full,
            ty,
            init,
        });
        match self.b.mesh() {
            Some(_) => sharding::replicate(&v),
            None => Ok(v),
        }
    }

    /// The value of the buffer `name` (under the current prefix) after this step.
    pub fn update(&mut self, name: &str, v: &Value) -> Result<(), ShardingError> {
        let v = match self.b.mesh() {
            Some(_) => sharding::replicate(v)?,
            None => v.clone(),
        };
        self.updates.push((self.full_name(name), v));
        Ok(())
    }
}
