//! Named parameters with their initialisers and annotations, collected while a model is
//! built, so that training can create (and shard) their values without re-deriving shapes.

use ir::{Builder, DType, Sharding, Type, Value};
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
        }
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
        match (dims, self.b.mesh()) {
            (Some(d), Some(_)) => sharding::annotate::annotate(&v, Sharding::from_dims(d)),
            _ => Ok(v),
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
