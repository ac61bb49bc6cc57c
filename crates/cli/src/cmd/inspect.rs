//! `gshard inspect`: show what the partitioner did to a program: the per-device program,
//! the sharding of every parameter and output, bytes per device, every collective with its
//! shape and the bytes it moves, the peak memory per device with what it holds (the
//! executor's buffer planning on shapes), and a summary by scope (FLOPs, bytes per
//! collective kind, saved activations). `--why` says why each collective is there, grouped by layer;
//! `--json` prints everything as one JSON object (each collective with its `scope` and
//! `cause`); `--draw NAME` draws how a value is laid out over the mesh.

use crate::files;
use crate::mesh_args::MeshArgs;
use anyhow::{Context, Result};
use serde_json::json;
use spmd::report;
use spmd::report::summary::{self, Grouping};
use spmd::report::why::{self, WhyOptions};
use std::path::PathBuf;

mod explain;

#[derive(clap::Args)]
pub struct Args {
    /// Program in text form (.gsir).
    program: PathBuf,
    #[command(flatten)]
    mesh: MeshArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Leave out the per-device program text.
    #[arg(long)]
    no_program: bool,
    /// Say why each collective is there: the instruction it serves, the shardings that met
    /// and where they came from, grouped by layer.
    #[arg(long)]
    why: bool,
    /// Flag involuntary full gathers of tensors of at least this many bytes.
    #[arg(long, default_value_t = WhyOptions::default().min_gather_bytes)]
    min_gather_bytes: usize,
    /// Group the summary by the first N segments of the scope path instead of by layer.
    #[arg(long)]
    depth: Option<usize>,
    /// Draw how a value is laid out over the mesh: a parameter or output name, or `%N`.
    #[arg(long, value_name = "NAME")]
    draw: Option<String>,
    /// Where --draw writes its PNG (default: NAME with `/` as `_`, plus `.png`).
    #[arg(long, requires = "draw")]
    out: Option<PathBuf>,
}

pub use spmd::report::human_bytes;

pub fn main(a: Args) -> Result<()> {
    let p = files::read_program(&a.program)?;
    let p = a.mesh.apply(&p)?;
    let part =
        spmd::compile(&p).with_context(|| format!("partitioning {}", a.program.display()))?;
    if let Some(name) = &a.draw {
        return explain::draw(&p, &part, name, a.out.as_deref());
    }
    let why_opts = WhyOptions {
        min_gather_bytes: a.min_gather_bytes,
    };
    let grouping = a.depth.map_or(Grouping::Layer, Grouping::Depth);
    let rows = summary::by_scope(&part.program, grouping);
    let mesh = part.program.mesh.clone().expect("partitioned");
    let colls = report::collectives(&part.program);
    // The executor's own buffer planning, on shapes: the peak `gshard run` measures.
    let memory = train::memory::plan_memory(&part.program, runtime::MemoryOptions::in_process())
        .context("preparing the per-device program for the executor")?;
    let peak = memory.plan.peak_bytes;
    let (param_bytes, out_bytes) = report::io_bytes_per_device(&part);
    let layouts = |ls: &[spmd::IoLayout]| -> Vec<serde_json::Value> {
        ls.iter()
            .map(|l| {
                json!({
                    "name": l.name,
                    "global": l.global.to_string(),
                    "local": l.global.with_shape(l.sharding.shard_shape(&mesh, &l.global.shape)).to_string(),
                    "sharding": l.sharding.to_string(),
                })
            })
            .collect()
    };
    if a.json {
        let obj = json!({
            "mesh": mesh.to_string(),
            "devices": mesh.num_devices(),
            "bytes_per_device": peak,
            "memory": memory.breakdown,
            "param_bytes_per_device": param_bytes,
            "output_bytes_per_device": out_bytes,
            "collective_bytes": colls.iter().map(|c| c.bytes).sum::<usize>(),
            "collectives": why::entries(&part, why_opts).iter().map(|e| explain::collective_json(&part.program, e)).collect::<Vec<_>>(),
            "summary": rows.iter().map(explain::row_json).collect::<Vec<_>>(),
            "params": layouts(&part.params),
            "outputs": layouts(&part.outputs),
            "instructions": part.program.len(),
            "program": if a.no_program { serde_json::Value::Null } else { ir::text::print(&part.program).into() },
        });
        println!("{obj}");
        return Ok(());
    }
    if !a.no_program {
        println!("# per-device program\n{}", ir::text::print(&part.program));
    }
    println!("# mesh {mesh}: {} devices", mesh.num_devices());
    let show = |title: &str, ls: &[spmd::IoLayout]| {
        println!("# {title}");
        for l in ls {
            let local = l
                .global
                .with_shape(l.sharding.shard_shape(&mesh, &l.global.shape));
            println!(
                "  {:<16} {:<20} -> {:<20} {}",
                l.name,
                l.global.to_string(),
                local.to_string(),
                l.sharding
            );
        }
    };
    show("parameters: global -> per device, sharding", &part.params);
    show("outputs: global -> per device, sharding", &part.outputs);
    println!("# memory per device");
    println!(
        "  parameters {}   outputs {}   peak live {}",
        human_bytes(param_bytes),
        human_bytes(out_bytes),
        human_bytes(peak)
    );
    println!("  at the peak: {}", memory.breakdown.line());
    println!("# by scope, per device: FLOPs, bytes sent per collective kind, saved activations");
    print!("{}", summary::text(&rows));
    if a.why {
        print!("{}", why::text(&part, why_opts));
        return Ok(());
    }
    println!("# collectives ({}), bytes sent per device", colls.len());
    for c in &colls {
        println!(
            "  %{:<5} {:<18} axes [{}]  {}  {}  at {}",
            c.index,
            c.kind,
            c.axes.join(","),
            ir::Type::new(c.dtype, c.shape.clone()),
            human_bytes(c.bytes),
            part.program.scope(ir::ValueId(c.index as u32))
        );
    }
    println!(
        "  total {}",
        human_bytes(colls.iter().map(|c| c.bytes).sum())
    );
    Ok(())
}
