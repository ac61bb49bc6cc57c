//! Layers that build IR (they never run it): dense layers and attention ([`layers`]), the
//! Mixture-of-Experts layer in GShard's einsum form with GShard top-2 gating ([`moe`]), the
//! other routers it accepts (Switch top-1, noisy top-k, expert choice: [`gating`];
//! Shazeer's hierarchical MoE: [`hierarchical`]), expert capacity formulas ([`capacity`]),
//! named parameters and buffers ([`params`]), the GShard Transformer models
//! ([`transformer`], its MoE sub-layer with the router and load balancing a config chooses:
//! [`moe_ffn`]) and their incremental decoding programs
//! ([`incremental`]: an encoder run once per batch, a decoder step with cached keys and
//! values).
//! MoE is ordinary IR: dispatch and combine are einsums over one-hot tensors, so sharding
//! propagation and the partitioner produce the all-to-alls from a few annotations.

pub mod capacity;
pub mod gating;
pub mod hierarchical;
pub mod incremental;
pub mod layers;
pub mod lstm;
pub mod moe;
pub mod moe_ffn;
pub mod params;
pub mod transformer;
