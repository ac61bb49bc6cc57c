//! Training: optimizers as IR ([`optim`]), so optimizer state is sharded like its parameter;
//! the many-to-English corpus built from registry packages ([`data`]); the tokenizer
//! ([`tokenizer`]); corpus BLEU exactly as sacrebleu's 13a scorer ([`bleu`]).

pub mod bleu;
pub mod checkpoint;
pub mod chrf;
pub mod config;
pub mod data;
pub mod memory;
pub mod metrics;
pub mod optim;
pub mod pictures;
pub mod plots;
pub mod scores;
pub mod tokenizer;
pub mod trainer;
