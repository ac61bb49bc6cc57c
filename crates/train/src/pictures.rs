//! Pictures of placement (PNG, plotters): a tensor's sharding over the mesh, for any rank
//! and any mesh (which device holds which tile, replicated and partial axes named), and the
//! expert placement of MoE layers (experts x devices, optionally coloured by the last
//! measured load).
//!
//! The layouts are computed first as plain data ([`tiles`], [`placement`]), so tests check
//! what a picture shows without reading pixels.

use crate::plots::PlotError;
use ir::{Mesh, Sharding, Type};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

/// One tile of a sharded tensor: its index along every dim and the devices holding it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tile {
    pub index: Vec<usize>,
    /// Device ids (the mesh's `devices`), in mesh position order.
    pub devices: Vec<u32>,
}

/// Every tile of a value of rank `rank` under `s` on `mesh`, in row-major tile order.
pub fn tiles(mesh: &Mesh, s: &Sharding, rank: usize) -> Vec<Tile> {
    let counts: Vec<usize> = (0..rank).map(|d| s.tiles(mesh, d)).collect();
    let total: usize = counts.iter().product();
    let mut out: Vec<Tile> = (0..total)
        .map(|t| {
            let mut index = vec![0; rank];
            let mut rest = t;
            for d in (0..rank).rev() {
                index[d] = rest % counts[d];
                rest /= counts[d];
            }
            Tile {
                index,
                devices: Vec::new(),
            }
        })
        .collect();
    for pos in 0..mesh.num_devices() {
        let mut t = 0;
        for (d, &count) in counts.iter().enumerate() {
            t = t * count + s.tile_index(mesh, pos, d);
        }
        out[t].devices.push(mesh.devices[pos]);
    }
    out
}

/// What the sharding picture of one value shows.
#[derive(Clone, Debug)]
pub struct ShardingPicture<'a> {
    /// The value's name (a parameter, an output or `%N`).
    pub name: &'a str,
    pub ty: &'a Type,
    pub sharding: &'a Sharding,
    pub mesh: &'a Mesh,
}

/// A colour per device id, distinct for neighbours.
fn device_colour(id: u32) -> RGBColor {
    const PALETTE: [(u8, u8, u8); 12] = [
        (141, 211, 199),
        (255, 255, 179),
        (190, 186, 218),
        (251, 128, 114),
        (128, 177, 211),
        (253, 180, 98),
        (179, 222, 105),
        (252, 205, 229),
        (217, 217, 217),
        (188, 128, 189),
        (204, 235, 197),
        (255, 237, 111),
    ];
    let (r, g, b) = PALETTE[id as usize % PALETTE.len()];
    RGBColor(r, g, b)
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn at(path: &Path) -> impl Fn(String) -> PlotError + '_ {
    move |msg| PlotError {
        path: path.to_path_buf(),
        msg,
    }
}

/// Devices as `d0 d4` (at most `max`, then `+n`).
fn device_list(ids: &[u32], max: usize) -> String {
    let mut s: Vec<String> = ids.iter().take(max).map(|d| format!("d{d}")).collect();
    if ids.len() > max {
        s.push(format!("+{}", ids.len() - max));
    }
    s.join(" ")
}

/// How one dim is cut, in words: `dim 0 (8): data -> 2 tiles of 4`.
fn dim_line(pic: &ShardingPicture, d: usize) -> String {
    let size = pic.ty.shape[d];
    let axes = &pic.sharding.dims[d];
    if axes.is_empty() {
        return format!("dim {d} ({size}): whole");
    }
    let k = pic.mesh.size_of(axes);
    format!(
        "dim {d} ({size}): split over {} -> {k} tiles of {}",
        axes.join(", "),
        size.div_ceil(k)
    )
}

/// Draw `pic` to a PNG at `path`: the tiles of the tensor laid out as panels over its
/// leading dims, each a grid over its last two dims; every tile lists (and is coloured by)
/// the devices holding it; the caption names the replicated and partial axes.
pub fn draw_sharding(path: &Path, pic: &ShardingPicture) -> Result<(), PlotError> {
    draw_sharding_inner(path, pic).map_err(at(path))
}

fn draw_sharding_inner(path: &Path, pic: &ShardingPicture) -> Result<(), String> {
    crate::plots::register_font();
    let rank = pic.ty.rank();
    let ts = tiles(pic.mesh, pic.sharding, rank);
    let counts: Vec<usize> = (0..rank).map(|d| pic.sharding.tiles(pic.mesh, d)).collect();
    // Grid over the last two dims; panels over the leading ones.
    let (rows, cols) = match rank {
        0 => (1, 1),
        1 => (1, counts[0]),
        _ => (counts[rank - 2], counts[rank - 1]),
    };
    let panels: usize = counts[..rank.saturating_sub(2)].iter().product();
    let panel_cols = (panels as f64).sqrt().ceil().max(1.0) as usize;
    let panel_rows = panels.div_ceil(panel_cols);
    let cell = (110u32, 56u32);
    let gap = 24u32;
    let pw = cols as u32 * cell.0;
    let ph = rows as u32 * cell.1 + 22;
    let header = 90 + 18 * rank as u32;
    let w = (panel_cols as u32 * (pw + gap) + gap).max(520);
    let h = header + panel_rows as u32 * (ph + gap) + gap;
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let text = |s: &str, x: i32, y: i32, size: u32| {
        root.draw(&Text::new(s.to_string(), (x, y), ("sans-serif", size)))
    };
    text(
        &format!(
            "{} {} {} on mesh {}",
            pic.name, pic.ty, pic.sharding, pic.mesh
        ),
        gap as i32,
        10,
        18,
    )
    .map_err(err)?;
    let split = pic.sharding.split_axes();
    let replicated: Vec<&str> = pic
        .mesh
        .axes
        .iter()
        .map(|a| a.name.as_str())
        .filter(|a| !split.iter().any(|s| s == a) && !pic.sharding.partial.iter().any(|p| p == a))
        .collect();
    let mut lines = vec![format!(
        "{} tiles on {} devices; replicated over [{}]; partial sums over [{}]",
        ts.len(),
        pic.mesh.num_devices(),
        replicated.join(", "),
        pic.sharding.partial.join(", ")
    )];
    lines.extend((0..rank).map(|d| dim_line(pic, d)));
    for (k, l) in lines.iter().enumerate() {
        text(l, gap as i32, 38 + 18 * k as i32, 14).map_err(err)?;
    }
    let centre = Pos::new(HPos::Center, VPos::Center);
    for p in 0..panels {
        let (pr, pc) = (p / panel_cols, p % panel_cols);
        let x0 = (gap + pc as u32 * (pw + gap)) as i32;
        let y0 = (header + pr as u32 * (ph + gap)) as i32;
        if rank > 2 {
            // The panel's index along the leading dims.
            let mut idx = vec![0; rank - 2];
            let mut rest = p;
            for d in (0..rank - 2).rev() {
                idx[d] = rest % counts[d];
                rest /= counts[d];
            }
            let label: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
            text(&format!("tile [{}, ., .]", label.join(", ")), x0, y0, 14).map_err(err)?;
        }
        for r in 0..rows {
            for c in 0..cols {
                let t = &ts[p * rows * cols + r * cols + c];
                let x = x0 + (c as u32 * cell.0) as i32;
                let y = y0 + 20 + (r as u32 * cell.1) as i32;
                let fill = t.devices.first().map_or(WHITE, |&d| device_colour(d));
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell.0 as i32, y + cell.1 as i32)],
                    fill.filled(),
                ))
                .map_err(err)?;
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell.0 as i32, y + cell.1 as i32)],
                    BLACK.stroke_width(1),
                ))
                .map_err(err)?;
                let style = TextStyle::from(("sans-serif", 13)).pos(centre);
                let idx: Vec<String> = t.index.iter().map(|i| i.to_string()).collect();
                let (cx, cy) = (x + cell.0 as i32 / 2, y + cell.1 as i32 / 2);
                root.draw(&Text::new(
                    format!("[{}]", idx.join(",")),
                    (cx, cy - 9),
                    style.clone(),
                ))
                .map_err(err)?;
                root.draw(&Text::new(device_list(&t.devices, 4), (cx, cy + 9), style))
                    .map_err(err)?;
            }
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Which devices hold each expert of one MoE layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The layer's name (`decoder/layer1/moe`).
    pub layer: String,
    /// Device ids holding each expert, in mesh position order.
    pub experts: Vec<Vec<u32>>,
    /// Every device id of the mesh, in position order (the picture's columns).
    pub devices: Vec<u32>,
}

/// The placement of `experts` experts whose weights are laid out by `s` (experts on dim 0)
/// on `mesh`.
pub fn placement(layer: &str, mesh: &Mesh, s: &Sharding, experts: usize) -> Placement {
    let k = s.tiles(mesh, 0).max(1);
    let per = experts.div_ceil(k);
    let mut out = vec![Vec::new(); experts];
    for pos in 0..mesh.num_devices() {
        let t = s.tile_index(mesh, pos, 0);
        for holders in out
            .iter_mut()
            .take(((t + 1) * per).min(experts))
            .skip(t * per)
        {
            holders.push(mesh.devices[pos]);
        }
    }
    Placement {
        layer: layer.to_string(),
        experts: out,
        devices: mesh.devices.clone(),
    }
}

/// Draw the expert placement of `layers` to a PNG at `path`: per layer, a grid of experts
/// (rows) by devices (columns), a cell filled where the device holds the expert; with
/// `load` (per layer, each expert's share of the tokens), the filled cells are shaded by it.
pub fn draw_placement(
    path: &Path,
    layers: &[Placement],
    load: Option<&[Vec<f64>]>,
) -> Result<(), PlotError> {
    draw_placement_inner(path, layers, load).map_err(at(path))
}

fn draw_placement_inner(
    path: &Path,
    layers: &[Placement],
    load: Option<&[Vec<f64>]>,
) -> Result<(), String> {
    crate::plots::register_font();
    let cell = 34i32;
    let left = 90i32;
    let gap = 30i32;
    let top = 50i32;
    let widest = layers.iter().map(|l| l.devices.len()).max().unwrap_or(1) as i32;
    let panel_h = |l: &Placement| 40 + cell * l.experts.len() as i32;
    let w = (left + cell * widest + gap).max(480);
    let h = top + layers.iter().map(|l| panel_h(l) + gap).sum::<i32>() + gap;
    let root = BitMapBackend::new(path, (w as u32, h as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let title = match load {
        Some(_) => "expert placement (shade: share of tokens routed, last measured step)",
        None => "expert placement",
    };
    root.draw(&Text::new(title, (10, 12), ("sans-serif", 16)))
        .map_err(err)?;
    let centre = Pos::new(HPos::Center, VPos::Center);
    let mut y0 = top;
    for (li, l) in layers.iter().enumerate() {
        root.draw(&Text::new(l.layer.clone(), (10, y0), ("sans-serif", 15)))
            .map_err(err)?;
        for (c, d) in l.devices.iter().enumerate() {
            let x = left + c as i32 * cell + cell / 2;
            let style = TextStyle::from(("sans-serif", 12)).pos(centre);
            root.draw(&Text::new(format!("d{d}"), (x, y0 + 28), style))
                .map_err(err)?;
        }
        let shares = load.and_then(|ls| ls.get(li));
        let max_share = shares
            .map(|s| s.iter().cloned().fold(0.0f64, f64::max))
            .unwrap_or(0.0);
        for (e, holders) in l.experts.iter().enumerate() {
            let y = y0 + 40 + e as i32 * cell;
            let label = match shares.and_then(|s| s.get(e)) {
                Some(v) => format!("e{e} {:.0}%", v * 100.0),
                None => format!("e{e}"),
            };
            root.draw(&Text::new(
                label,
                (10, y + cell / 2 - 7),
                ("sans-serif", 13),
            ))
            .map_err(err)?;
            for (c, d) in l.devices.iter().enumerate() {
                let x = left + c as i32 * cell;
                let held = holders.contains(d);
                let fill = match (held, shares.and_then(|s| s.get(e))) {
                    (false, _) => WHITE,
                    (true, None) => device_colour(*d),
                    (true, Some(v)) => {
                        let t = if max_share > 0.0 { v / max_share } else { 0.0 };
                        let shade = (230.0 - 190.0 * t.clamp(0.0, 1.0)) as u8;
                        RGBColor(shade, shade, 255)
                    }
                };
                let rect = [(x, y), (x + cell, y + cell)];
                root.draw(&Rectangle::new(rect, fill.filled()))
                    .map_err(err)?;
                root.draw(&Rectangle::new(rect, BLACK.stroke_width(1)))
                    .map_err(err)?;
            }
        }
        y0 += panel_h(l) + gap;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_list_their_holders_on_a_3d_mesh() {
        let mesh = Mesh::new(&[("a", 2), ("b", 2), ("c", 2)]).unwrap();
        // dim 0 over a, dim 2 over c; b replicates.
        let s = Sharding::from_dims(&[&["a"], &[], &["c"]]);
        let ts = tiles(&mesh, &s, 3);
        assert_eq!(ts.len(), 4);
        // Positions are row-major over (a, b, c): a = pos / 4, c = pos % 2.
        assert_eq!(ts[0].index, [0, 0, 0]);
        assert_eq!(ts[0].devices, [0, 2]);
        assert_eq!(ts[1].index, [0, 0, 1]);
        assert_eq!(ts[1].devices, [1, 3]);
        assert_eq!(ts[3].devices, [5, 7]);
        assert!(ts.iter().all(|t| t.devices.len() == 2));
    }

    #[test]
    fn experts_sit_where_their_weights_are_split() {
        let mesh = Mesh::new(&[("data", 2), ("expert", 4)]).unwrap();
        let s = Sharding::from_dims(&[&["expert"], &[], &[]]);
        let p = placement("moe", &mesh, &s, 8);
        assert_eq!(p.experts.len(), 8);
        // Experts 0,1 on expert-rank 0: devices 0 and 4 (both data ranks).
        assert_eq!(p.experts[0], [0, 4]);
        assert_eq!(p.experts[1], [0, 4]);
        assert_eq!(p.experts[7], [3, 7]);
    }
}
