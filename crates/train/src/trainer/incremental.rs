//! Incremental decoding on the devices: the encoder program runs once per batch and leaves
//! every decoder layer's cross-attention keys and values; the step program then runs the
//! decoder on one position of every row, reading the self-attention caches that the host
//! keeps (`[B,L,N,D]` per layer, rows reordered by parent beam between steps) and writing
//! the position's keys and values back into them.
//!
//! Decoding routes MoE tokens dropless (capacity `max(C, S)`, [`nn::incremental::dropless`]),
//! so a token's routing and output depend on the token alone, as a cache needs: the step
//! then gives the tokens of the whole-model re-decode ([`DecodeMode::Full`]). When the run's
//! own capacity already holds every token (`C >= S`), the re-decode is the evaluation
//! program itself; otherwise decoding builds a dropless copy of it.
//!
//! [`DecodeMode::Full`]: super::decode::DecodeMode::Full

use super::batches::{batch_tensors, Example};
use super::decode::{Row, Scorer};
use super::programs::eval_program;
use super::step::{prepared, DeviceInputs, Trainer};
use super::TrainError;
use crate::config::TrainConfig;
use crate::tokenizer::Tokenizer;
use ir::{Builder, Type};
use nn::incremental::{
    build_encoder, build_step, dropless, is_dropless, step_groups, Attn, CacheName, LOGITS, POS,
    SRC, SRC_PAD, TOKEN,
};
use nn::transformer::{BatchShape, Packing, Precision, TransformerConfig};
use runtime::HostTensor;
use spmd::Partitioned;
use std::collections::HashMap;
use std::sync::OnceLock;

/// A partitioned program and its executable, prepared on first use.
pub(super) struct Prepared {
    pub(super) part: Partitioned,
    exe: OnceLock<runtime::Executable>,
}

impl Prepared {
    fn compile(p: &ir::Program) -> Result<Prepared, TrainError> {
        Ok(Prepared {
            part: spmd::compile(p)?,
            exe: OnceLock::new(),
        })
    }

    pub(super) fn exe(&self) -> Result<&runtime::Executable, TrainError> {
        prepared(
            &self.exe,
            &self.part.program,
            runtime::ExecOptions::native(),
        )
    }
}

/// The decoding programs of a run, partitioned for its mesh.
pub(super) struct Decoder {
    /// The run's model with dropless MoE layers.
    model: TransformerConfig,
    cfg: TrainConfig,
    /// The encoder and cross-attention keys and values (`None` for a decoder-only model).
    encoder: Option<Prepared>,
    step: Prepared,
    /// The whole model re-run per position when the evaluation program may drop tokens:
    /// its dropless copy, built on first use.
    full: OnceLock<Prepared>,
    /// Whether the evaluation program is dropless, and so serves the re-decode as it is.
    eval_is_dropless: bool,
}

impl Decoder {
    fn build(cfg: &TrainConfig, vocab: usize) -> Result<Decoder, TrainError> {
        let run_model = cfg.transformer(vocab)?;
        // Decoding runs in the master dtype (`nn::incremental`), the re-decode too.
        let model = dropless(&run_model.full_precision());
        let mesh = cfg.mesh()?;
        let layout = cfg.layout();
        let shape = BatchShape {
            batch: cfg.data.batch_size,
            src_len: cfg.data.max_len,
            tgt_len: cfg.data.max_len,
            packing: Packing::Padded,
        };
        let b = Builder::with_mesh(mesh.clone());
        let groups = step_groups(&b, &layout);
        if !shape.batch.is_multiple_of(groups) {
            return Err(TrainError::Model(format!(
                "decoding: data.batch_size = {} does not divide over the {groups} devices of the mesh",
                shape.batch
            )));
        }
        let step = build_step(&b, &model, &shape, &layout)?;
        b.output(LOGITS, &step.logits);
        for (name, v) in &step.new_kv {
            b.output(&name.new_name(), v);
        }
        let step = Prepared::compile(&b.finish())?;
        let encoder = if model.enc_layers > 0 {
            let b = Builder::with_mesh(mesh);
            let enc = build_encoder(&b, &model, &shape, &layout)?;
            for (name, v) in &enc.outputs {
                b.output(&name.to_string(), v);
            }
            Some(Prepared::compile(&b.finish())?)
        } else {
            None
        };
        Ok(Decoder {
            eval_is_dropless: is_dropless(&run_model) && run_model.precision == Precision::Full,
            model,
            cfg: cfg.clone(),
            encoder,
            step,
            full: OnceLock::new(),
        })
    }

    /// The dropless whole-model program of the re-decode, or `None` when the evaluation
    /// program is dropless itself (and then serves as it is).
    pub(super) fn full(&self) -> Result<Option<&Prepared>, TrainError> {
        if self.eval_is_dropless {
            return Ok(None);
        }
        if let Some(p) = self.full.get() {
            return Ok(Some(p));
        }
        let p = Prepared::compile(&eval_program(&self.cfg, &self.model)?)?;
        Ok(Some(self.full.get_or_init(|| p)))
    }
}

/// `tr`'s decoding programs, built on first use.
pub(super) fn decoder(tr: &Trainer, vocab: usize) -> Result<&Decoder, TrainError> {
    if let Some(d) = tr.decoder.get() {
        return Ok(d);
    }
    let d = Decoder::build(&tr.cfg, vocab)?;
    Ok(tr.decoder.get_or_init(|| d))
}

/// The parameters of the decoding programs on this process's devices, for one
/// [`super::decode::translate`] call.
pub(super) struct DecodeParams {
    encoder: Option<DeviceInputs>,
    step: DeviceInputs,
}

impl DecodeParams {
    pub(super) fn new(tr: &Trainer, dec: &Decoder) -> Result<DecodeParams, TrainError> {
        Ok(DecodeParams {
            encoder: match &dec.encoder {
                Some(e) => Some(tr.params_for(&e.part)?),
                None => None,
            },
            step: tr.params_for(&dec.step.part)?,
        })
    }
}

/// The incremental decoding of one batch of rows: the step's inputs fixed for the batch
/// (parameters, cross-attention keys and values, source padding) and the self-attention
/// caches.
pub(super) struct Incremental<'a> {
    tr: &'a Trainer,
    dec: &'a Decoder,
    fixed: DeviceInputs,
    /// Per decoder layer, keys then values `[B,L,N,D]`; row `r` holds the prefix of the
    /// hypothesis in row `r`.
    caches: Vec<(CacheName, HostTensor)>,
    bos: u32,
    pad: u32,
}

impl<'a> Incremental<'a> {
    /// Encode the sources of the batch's rows (`None`: an unused row) and start with empty
    /// caches.
    pub(super) fn start(
        tr: &'a Trainer,
        dec: &'a Decoder,
        params: &DecodeParams,
        tok: &Tokenizer,
        srcs: &[Option<&[u32]>],
    ) -> Result<Incremental<'a>, TrainError> {
        let examples: Vec<Option<Example>> = srcs
            .iter()
            .map(|s| {
                s.map(|src| Example {
                    lang: String::new(),
                    src: src.to_vec(),
                    tgt: Vec::new(),
                    english: String::new(),
                })
            })
            .collect();
        let rows: Vec<Option<&Example>> = examples.iter().map(Option::as_ref).collect();
        let batch = batch_tensors(&tr.cfg, tok, &rows);
        let mut fixed = HashMap::new();
        if let (Some(enc), Some(p)) = (&dec.encoder, &params.encoder) {
            let inputs: HashMap<String, HostTensor> = [SRC, SRC_PAD]
                .iter()
                .map(|&n| (n.to_string(), batch[n].clone()))
                .collect();
            let mut outs = tr.run_global(&enc.part, enc.exe()?, p, &inputs)?;
            for name in CacheName::all(&dec.model, Attn::Cross) {
                let key = name.to_string();
                let t = outs
                    .remove(&key)
                    .ok_or_else(|| TrainError::Run(format!("the encoder has no output `{key}`")))?;
                fixed.insert(key, t);
            }
            fixed.insert(SRC_PAD.to_string(), batch[SRC_PAD].clone());
        }
        let fixed = tr.with_inputs(&dec.step.part, &params.step, &fixed);
        let m = &dec.model;
        let ty = Type::new(
            m.dtype,
            vec![
                tr.cfg.data.batch_size,
                tr.cfg.data.max_len,
                m.heads,
                m.head_dim,
            ],
        );
        let caches = CacheName::all(m, Attn::SelfAttn)
            .into_iter()
            .map(|n| (n, HostTensor::zeros(ty.clone())))
            .collect();
        Ok(Incremental {
            tr,
            dec,
            fixed,
            caches,
            bos: tok.bos_id(),
            pad: tok.pad_id(),
        })
    }
}

impl Scorer for Incremental<'_> {
    fn logits(
        &mut self,
        t: usize,
        rows: &[Option<Row>],
    ) -> Result<Vec<Option<Vec<f64>>>, TrainError> {
        let b = self.tr.cfg.data.batch_size;
        let parents: Vec<usize> = (0..b)
            .map(|r| rows.get(r).and_then(|x| x.as_ref()).map_or(r, |x| x.parent))
            .collect();
        if parents.iter().enumerate().any(|(r, &p)| p != r) {
            for (_, cache) in &mut self.caches {
                *cache = gather_rows(cache, &parents);
            }
        }
        let token: Vec<i32> = (0..b)
            .map(|r| match rows.get(r).and_then(|x| x.as_ref()) {
                Some(x) => *x.tokens.last().unwrap_or(&self.bos) as i32,
                None => self.pad as i32,
            })
            .collect();
        let mut inputs = HashMap::from([
            (TOKEN.to_string(), HostTensor::from_i32([b], token)),
            (
                POS.to_string(),
                HostTensor::from_i32([b], vec![t as i32; b]),
            ),
        ]);
        for (name, cache) in &self.caches {
            inputs.insert(name.to_string(), cache.clone());
        }
        let step = &self.dec.step;
        let mut outs = self
            .tr
            .run_global(&step.part, step.exe()?, &self.fixed, &inputs)?;
        let missing = |n: &str| TrainError::Run(format!("the decoder step has no output `{n}`"));
        for (name, cache) in &mut self.caches {
            let key = name.new_name();
            let new = outs.remove(&key).ok_or_else(|| missing(&key))?;
            write_position(cache, &new, t);
        }
        let logits = outs.remove(LOGITS).ok_or_else(|| missing(LOGITS))?;
        let v = logits.shape()[1];
        Ok((0..b)
            .map(|r| {
                rows.get(r)
                    .and_then(|x| x.as_ref())
                    .map(|_| logits.data.range_f64(r * v, v))
            })
            .collect())
    }
}

/// The bytes of one element of `t`.
fn elem_bytes(t: &HostTensor) -> usize {
    t.size_bytes() / t.num_elements().max(1)
}

/// `cache` with row `r` taken from row `parents[r]`.
fn gather_rows(cache: &HostTensor, parents: &[usize]) -> HostTensor {
    let row = cache.num_elements() / cache.shape()[0] * elem_bytes(cache);
    let src = cache.data.as_bytes();
    let mut out = cache.clone();
    let dst = out
        .data
        .as_bytes_mut()
        .expect("caches have a numeric dtype");
    for (r, &p) in parents.iter().enumerate() {
        if p != r {
            dst[r * row..(r + 1) * row].copy_from_slice(&src[p * row..(p + 1) * row]);
        }
    }
    out
}

/// Store `new [B,N,D]` at position `t` of every row of `cache [B,L,N,D]`.
fn write_position(cache: &mut HostTensor, new: &HostTensor, t: usize) {
    let (bsz, l) = (cache.shape()[0], cache.shape()[1]);
    let item = new.num_elements() / bsz * elem_bytes(new);
    let src = new.data.as_bytes();
    let dst = cache
        .data
        .as_bytes_mut()
        .expect("caches have a numeric dtype");
    for r in 0..bsz {
        let at = (r * l + t) * item;
        dst[at..at + item].copy_from_slice(&src[r * item..(r + 1) * item]);
    }
}
