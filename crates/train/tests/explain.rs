//! Golden tests of the compiler's explanations on the main job's training step (its MoE Transformer
//! on mesh data=2 x expert=4, both axes split; the placement picture on the main job's own mesh):
//! every collective has a scope and a cause, the all-to-alls are the MoE layers' dispatch and
//! combine (forward and backward), the summary by layer adds up, and the pictures of a 3-D tensor
//! on a 3-D mesh and of the expert placement are written.

use ir::Mesh;
use spmd::report::summary::{self, Grouping};
use spmd::report::why::{self, WhyOptions};
use train::config::TrainConfig;
use train::pictures::{self, ShardingPicture};
use train::trainer::{build_programs, Programs};

fn step() -> Programs {
    // The main job's model on 8 devices (both axes split); a small vocabulary keeps the
    // build fast and changes no layout.
    let mut cfg = TrainConfig::default();
    cfg.mesh.data = 2;
    cfg.mesh.expert = 4;
    build_programs(&cfg, 256).unwrap()
}

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gshard-explain-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn every_collective_of_the_moe_training_step_has_a_scope_and_a_cause() {
    let progs = step();
    let part = &progs.step;
    assert_eq!(
        part.program.mesh.as_ref().unwrap().to_string(),
        "[data=2, expert=4]"
    );
    let entries = why::entries(part, WhyOptions::default());
    assert!(entries.len() > 8, "{} collectives", entries.len());
    for e in &entries {
        assert!(
            e.cause.is_some(),
            "collective %{} has no cause",
            e.info.index
        );
        assert!(
            !e.scope.is_empty(),
            "collective %{} {} is at the top level",
            e.info.index,
            e.info.kind
        );
    }
    // The all-to-alls: per MoE layer, dispatch and combine, forward and backward.
    let mut a2a: Vec<(String, bool)> = entries
        .iter()
        .filter(|e| e.info.kind == "all_to_all")
        .map(|e| (e.scope.to_string(), e.grad))
        .collect();
    a2a.sort();
    let mut want = Vec::new();
    assert_eq!(progs.moe_layers.len(), 2, "{:?}", progs.moe_layers);
    for layer in &progs.moe_layers {
        for part in ["combine", "dispatch"] {
            for grad in [false, true] {
                want.push((format!("{layer}/{part}"), grad));
            }
        }
    }
    want.sort();
    assert_eq!(a2a, want);
    // The printed report names every one and no cause is unknown.
    let text = why::text(part, WhyOptions::default());
    assert!(!text.contains("cause unknown"), "{text}");
    for layer in &progs.moe_layers {
        let group = why::by_layer(&entries)
            .into_iter()
            .find(|(l, _)| layer.starts_with(l))
            .map(|(l, _)| l)
            .unwrap_or_else(|| panic!("no group for {layer}:\n{text}"));
        assert!(text.contains(&format!("## {group}: ")), "{text}");
    }
    assert!(text.contains("/moe/dispatch [grad]"), "{text}");
}

#[test]
fn the_partitioned_step_prints_and_parses_back_with_its_scopes() {
    let progs = step();
    let p = &progs.step.program;
    let text = ir::text::print(p);
    assert!(
        text.contains("\"optimizer/"),
        "the optimizer has its own scopes"
    );
    assert!(text.contains(" grad\n"), "backward instructions are marked");
    let q = ir::text::parse(&text).unwrap();
    assert_eq!(&q, p);
}

#[test]
fn the_summary_by_layer_adds_up_to_the_program() {
    let progs = step();
    let p = &progs.step.program;
    let rows = summary::by_scope(p, Grouping::Layer);
    let total: u64 = (0..p.len()).map(|i| summary::flops(p, i)).sum();
    assert_eq!(rows.iter().map(|r| r.flops).sum::<u64>(), total);
    assert_eq!(rows.iter().map(|r| r.instructions).sum::<usize>(), p.len());
    let bytes: usize = spmd::report::collectives(p).iter().map(|c| c.bytes).sum();
    let by_rows: usize = rows
        .iter()
        .flat_map(|r| r.collective_bytes.iter().map(|(_, b)| *b))
        .sum();
    assert_eq!(by_rows, bytes);
    // The MoE layers send the all-to-all bytes and keep activations for the backward pass.
    for layer in &progs.moe_layers {
        let row = rows
            .iter()
            .filter(|r| !r.scope.is_empty() && layer.starts_with(&format!("{}/", r.scope)))
            .max_by_key(|r| r.scope.len())
            .unwrap_or_else(|| panic!("no row for {layer}"));
        assert!(row
            .collective_bytes
            .iter()
            .any(|(k, b)| *k == "all_to_all" && *b > 0));
        assert!(row.saved_bytes > 0);
        assert!(row.flops > 0);
    }
    // Rows by the first segment merge the layers.
    let top = summary::by_scope(p, Grouping::Depth(1));
    assert!(top.iter().any(|r| r.scope == "encoder"));
    assert!(top.len() < rows.len());
    let table = summary::text(&rows);
    assert!(table.contains("all_to_all"), "{table}");
}

/// The pictures are written to `GSHARD_PICTURES_DIR` if set (and kept: the README's come
/// from here), else to a temporary directory removed after the test.
#[test]
fn pictures_of_a_3d_tensor_on_a_3d_mesh_and_of_the_expert_placement() {
    let keep = std::env::var_os("GSHARD_PICTURES_DIR").map(std::path::PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| tmp("pictures"));
    let mesh = Mesh::new(&[("x", 2), ("y", 2), ("z", 2)]).unwrap();
    let ty = ir::Type::new(ir::DType::F32, [4, 6, 8]);
    let s = ir::Sharding::from_dims(&[&["x"], &[], &["z", "y"]]);
    let path = dir.join("sharding_3d.png");
    let pic = ShardingPicture {
        name: "w",
        ty: &ty,
        sharding: &s,
        mesh: &mesh,
    };
    pictures::draw_sharding(&path, &pic).unwrap();
    let png = std::fs::read(&path).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    // 2 x 1 x 4 tiles, each on one device: the 8 devices hold 8 distinct tiles.
    let tiles = pictures::tiles(&mesh, &s, 3);
    assert_eq!(tiles.len(), 8);
    let mut held: Vec<u32> = tiles.iter().flat_map(|t| t.devices.clone()).collect();
    held.sort();
    assert_eq!(held, (0..8).collect::<Vec<u32>>());

    // The main job's own mesh: the picture is the default run's.
    let cfg = TrainConfig::default();
    let progs = build_programs(&cfg, 256).unwrap();
    let placement = progs.expert_placement();
    assert_eq!(placement.len(), 2);
    let mesh = cfg.mesh;
    for p in &placement {
        assert_eq!(p.experts.len(), 8);
        // Each expert lives on one expert rank: one device per data (and model) rank.
        let copies = mesh.data * mesh.model;
        assert!(p.experts.iter().all(|d| d.len() == copies), "{p:?}");
        // And every device holds experts / expert-axis of them.
        for dev in &p.devices {
            let held = p.experts.iter().filter(|d| d.contains(dev)).count();
            assert_eq!(held, 8 / mesh.expert, "device {dev}: {p:?}");
        }
    }
    let path = dir.join("expert_placement.png");
    pictures::draw_placement(&path, &placement, None).unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[1..4], b"PNG");
    // Coloured by a load (synthetic here; a run uses its last measured one).
    let path = dir.join("expert_placement_load.png");
    let load = vec![vec![0.125; 8], (0..8).map(|e| e as f64 / 28.0).collect()];
    pictures::draw_placement(&path, &placement, Some(&load)).unwrap();
    assert_eq!(&std::fs::read(&path).unwrap()[1..4], b"PNG");
    if keep.is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
