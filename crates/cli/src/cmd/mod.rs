//! One module per `gshard` subcommand.

pub mod bench;
pub mod bench_comm;
pub mod bleu;
pub mod checkpoint;
pub mod compare;
pub mod data;
pub mod eval;
pub mod export;
pub mod fmt;
pub mod init;
pub mod inspect;
pub mod plan;
pub mod run;
pub mod train;
