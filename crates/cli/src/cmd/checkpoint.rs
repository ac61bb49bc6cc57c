//! `gshard checkpoint`: look at and convert checkpoints. `info` describes one, `verify`
//! checks every byte against its hashes, `consolidate` writes one safetensors file with
//! plain tensor names (any safetensors reader loads it; `gshard train --resume` accepts it
//! as a run's `checkpoint.safetensors`), `reshard --mesh` lays it out on another mesh.
//! Each takes a sharded checkpoint directory, a run directory (its checkpoint), or a single
//! safetensors checkpoint file, and none writes over an existing path.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use train::checkpoint::{tools, Source};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Format, step, mesh, files, and every tensor with its type and sharding.
    Info {
        /// A checkpoint directory, a run directory, or a single checkpoint file.
        path: PathBuf,
    },
    /// Check every file and shard against the manifest's SHA-256 hashes.
    Verify {
        /// A checkpoint directory, a run directory, or a single checkpoint file.
        path: PathBuf,
    },
    /// Write one safetensors file with plain tensor names (gshard-checkpoint-2).
    Consolidate {
        /// A checkpoint directory, a run directory, or a single checkpoint file.
        path: PathBuf,
        /// The file to write (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// Write the checkpoint laid out on another mesh (one file per device).
    Reshard {
        /// A checkpoint directory, a run directory, or a single checkpoint file.
        path: PathBuf,
        /// The new mesh, e.g. `data=4,expert=2` (any axis names; a tensor split over an
        /// axis the new mesh lacks is replicated over it).
        #[arg(long)]
        mesh: String,
        /// The checkpoint directory to write (must not exist or be empty).
        #[arg(long)]
        out: PathBuf,
    },
}

/// The checkpoint at `path`: a run directory means its `checkpoint/` (or its single
/// `checkpoint.safetensors`).
fn open(path: &Path) -> Result<Source> {
    let run = train::trainer::RunDir::new(path);
    let target = if path.join(train::checkpoint::MANIFEST).exists() || !path.is_dir() {
        path.to_path_buf()
    } else if run
        .checkpoint_dir()
        .join(train::checkpoint::MANIFEST)
        .exists()
    {
        run.checkpoint_dir()
    } else if run.checkpoint().exists() {
        run.checkpoint()
    } else {
        anyhow::bail!(
            "{} holds no checkpoint (manifest.json, checkpoint/manifest.json or checkpoint.safetensors); give a checkpoint directory, a run directory or a checkpoint file",
            path.display()
        );
    };
    Ok(Source::open(&target)?)
}

pub fn main(a: Args) -> Result<()> {
    match a.command {
        Command::Info { path } => {
            print!("{}", tools::info(&open(&path)?));
        }
        Command::Verify { path } => {
            let src = open(&path)?;
            let v = tools::verify(&src)?;
            println!(
                "{}: ok ({} files, {} tensors, {} checked against their SHA-256)",
                src.path().display(),
                v.files,
                v.tensors,
                train::memory::human(v.bytes)
            );
        }
        Command::Consolidate { path, out } => {
            let src = open(&path)?;
            tools::consolidate(&src, &out)
                .with_context(|| format!("consolidating {}", src.path().display()))?;
            println!(
                "wrote {} ({} tensors, step {})",
                out.display(),
                src.types().len(),
                src.step()
            );
        }
        Command::Reshard { path, mesh, out } => {
            let src = open(&path)?;
            let mesh = ir::Mesh::parse_spec(&mesh).context("--mesh")?;
            let m = tools::reshard(&src, &mesh, &out)?;
            println!(
                "wrote {} on mesh {mesh}: {} files, step {}",
                out.display(),
                m.files.len(),
                m.step
            );
        }
    }
    Ok(())
}
