//! `gshard init`: write random inputs for every parameter of a program, so any program can
//! be run at once (`gshard run P --inputs` on the file this writes).

use crate::files;
use anyhow::{Context, Result};
use ir::{DType, RngDist, Type};
use runtime::HostTensor;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Program in text form (.gsir).
    program: PathBuf,
    /// Where to write the inputs (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// Seed of the counter-based RNG.
    #[arg(long, default_value_t = 0)]
    seed: i32,
    /// Standard deviation of float inputs (normal); integer inputs are 0, bools false.
    #[arg(long, default_value_t = 0.5)]
    scale: f64,
}

pub fn main(a: Args) -> Result<()> {
    let p = files::read_program(&a.program)?;
    let mut tensors = Vec::new();
    for (stream, (name, v)) in p.params().into_iter().enumerate() {
        let ty: &Type = p.ty(v);
        // Built in place, failing with an error (not an abort) when it does not fit.
        let t = if ty.dtype.is_float() {
            HostTensor::try_from_f64_fn(ty.clone(), |i| {
                a.scale
                    * runtime::rng::sample(
                        RngDist::Normal,
                        DType::F64,
                        a.seed,
                        stream as u64,
                        i as u64,
                    )
            })
        } else {
            HostTensor::try_zeros(ty.clone())
        }
        .with_context(|| format!("making input `{name}`"))?;
        tensors.push((name.to_string(), t));
    }
    let refs: Vec<(String, &HostTensor)> = tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
    files::write_tensors(&a.out, &refs)?;
    println!("wrote {} inputs to {}", refs.len(), a.out.display());
    Ok(())
}
