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
    /// The memory this process may use (e.g. `16GiB`); default: what the host has
    /// available. Inputs that need more are refused before any is made.
    #[arg(long, value_name = "SIZE", value_parser = files::parse_size)]
    max_memory: Option<u64>,
}

pub fn main(a: Args) -> Result<()> {
    let p = files::read_program(&a.program)?;
    // Every input is held, then encoded into one buffer; the largest is first made in f64.
    let params = p.params();
    let bytes: u64 = params
        .iter()
        .map(|(_, v)| p.ty(*v).size_bytes() as u64)
        .sum();
    let widest = params
        .iter()
        .map(|(_, v)| 8 * p.ty(*v).num_elements() as u64)
        .max()
        .unwrap_or(0);
    train::memory::check(
        &format!("the inputs of {}", a.program.display()),
        bytes.saturating_mul(2).saturating_add(widest),
        format!(
            "{} of parameters, held and encoded",
            train::memory::human(bytes)
        ),
        a.max_memory,
        || train::memory::biggest(params.iter().map(|(n, v)| (*n, p.ty(*v))), 3),
    )?;
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
