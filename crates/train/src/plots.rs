//! PNG plots of a run (plotters, bitmap backend, with a vendored DejaVu Sans so no system
//! font is needed): the loss curve, the expert load per MoE layer over training as heatmaps
//! (experts by steps), and the share of dropped assignments per layer over training.

use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

static FONT: Once = Once::new();

pub(crate) fn register_font() {
    FONT.call_once(|| {
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSans.ttf"),
        );
    });
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A plot that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("drawing {}: {msg}", path.display())]
pub struct PlotError {
    pub path: std::path::PathBuf,
    pub msg: String,
}

fn at(path: &Path) -> impl Fn(String) -> PlotError + '_ {
    move |msg| PlotError {
        path: path.to_path_buf(),
        msg,
    }
}

/// Training loss (and dev loss points, if any) against steps.
pub fn loss_curve(path: &Path, train: &[(f64, f64)], dev: &[(f64, f64)]) -> Result<(), PlotError> {
    draw_loss_curve(path, train, dev).map_err(at(path))
}

fn draw_loss_curve(path: &Path, train: &[(f64, f64)], dev: &[(f64, f64)]) -> Result<(), String> {
    register_font();
    let root = BitMapBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let all = train.iter().chain(dev.iter());
    let (mut x1, mut y0, mut y1) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in all {
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !y0.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(1e-3);
    let mut chart = ChartBuilder::on(&root)
        .caption("loss", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x1, (y0 - pad)..(y1 + pad))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(train.iter().copied(), &BLUE))
        .map_err(err)?
        .label("train")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if !dev.is_empty() {
        chart
            .draw_series(LineSeries::new(dev.iter().copied(), RED.stroke_width(2)))
            .map_err(err)?
            .label("dev")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// One MoE layer's load over training: its name and `(step, fraction per expert)` points.
pub type LoadSeries = (String, Vec<(f64, Vec<f64>)>);

/// One MoE layer's dropped shares over training: its name and `(step, first, second)`.
pub type DroppedSeries = (String, Vec<(f64, f64, f64)>);

/// A sequential colour scale (viridis's anchor colours, linearly interpolated) at `t` in
/// `[0, 1]`.
fn ramp(t: f64) -> RGBColor {
    const ANCHORS: [(u8, u8, u8); 5] = [
        (0x44, 0x01, 0x54),
        (0x3b, 0x52, 0x8b),
        (0x21, 0x91, 0x8c),
        (0x5e, 0xc9, 0x62),
        (0xfd, 0xe7, 0x25),
    ];
    let x = t.clamp(0.0, 1.0) * (ANCHORS.len() - 1) as f64;
    let i = (x.floor() as usize).min(ANCHORS.len() - 2);
    let f = x - i as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    let (a, b) = (ANCHORS[i], ANCHORS[i + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// The expert load as heatmaps, one panel per MoE layer: experts (rows) by logged steps
/// (columns), colour = the expert's share of the layer's first choices (one scale for every
/// panel, drawn on the right with the uniform share `1/E` marked).
pub fn expert_load(path: &Path, series: &[LoadSeries]) -> Result<(), PlotError> {
    draw_expert_load(path, series).map_err(at(path))
}

fn draw_expert_load(path: &Path, series: &[LoadSeries]) -> Result<(), String> {
    register_font();
    let n = series.len().max(1);
    let e = series
        .iter()
        .flat_map(|(_, pts)| pts.first())
        .map(|p| p.1.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let panel_h = (70 + 16 * e as u32).max(200);
    let root = BitMapBackend::new(path, (1000, panel_h * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(890);
    let uniform = 1.0 / e as f64;
    let vmax = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().flat_map(|p| p.1.iter().copied()))
        .fold(2.0 * uniform, f64::max);
    for (panel, (name, points)) in left.split_evenly((n, 1)).iter().zip(series) {
        let x1 = points.last().map(|p| p.0).unwrap_or(1.0).max(1.0);
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("expert load: {name} (share of first choices)"),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x1, 0f64..e as f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("step")
            .y_desc("expert")
            .y_labels(e.min(16))
            .y_label_formatter(&|y| format!("{}", y.floor() as usize))
            .draw()
            .map_err(err)?;
        let mut prev = 0.0;
        let mut cells = Vec::new();
        for (step, shares) in points {
            for (k, &v) in shares.iter().enumerate() {
                cells.push(Rectangle::new(
                    [(prev, k as f64), (*step, k as f64 + 1.0)],
                    ramp(v / vmax).filled(),
                ));
            }
            prev = *step;
        }
        chart.draw_series(cells).map_err(err)?;
    }
    // The colour scale.
    let mut bar = ChartBuilder::on(&right)
        .margin_top(30)
        .margin_bottom(40)
        .margin_right(10)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..1.0, 0f64..vmax)
        .map_err(err)?;
    bar.configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(6)
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()
        .map_err(err)?;
    let steps = 100;
    bar.draw_series((0..steps).map(|i| {
        let (a, b) = (i as f64 / steps as f64, (i + 1) as f64 / steps as f64);
        Rectangle::new([(0.0, a * vmax), (1.0, b * vmax)], ramp(a).filled())
    }))
    .map_err(err)?;
    bar.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, uniform), (1.0, uniform)],
        WHITE.stroke_width(2),
    )))
    .map_err(err)?;
    root.present().map_err(err)
}

/// The share of assignments dropped for capacity per MoE layer over training: one panel for
/// first choices, one for second choices, a line per layer.
pub fn dropped(path: &Path, series: &[DroppedSeries]) -> Result<(), PlotError> {
    draw_dropped(path, series).map_err(at(path))
}

fn draw_dropped(path: &Path, series: &[DroppedSeries]) -> Result<(), String> {
    register_font();
    let root = BitMapBackend::new(path, (900, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let x1 = series
        .iter()
        .flat_map(|(_, pts)| pts.last())
        .map(|p| p.0)
        .fold(1.0, f64::max);
    let panels = root.split_evenly((2, 1));
    for (which, panel) in panels.iter().enumerate() {
        let pick = |p: &(f64, f64, f64)| if which == 0 { p.1 } else { p.2 };
        let y1 = series
            .iter()
            .flat_map(|(_, pts)| pts.iter().map(pick))
            .fold(0.01, f64::max)
            * 1.1;
        let title = if which == 0 {
            "dropped share of first choices"
        } else {
            "dropped share of second choices"
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..x1, 0f64..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("share dropped")
            .draw()
            .map_err(err)?;
        for (k, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    pts.iter().map(|p| (p.0, pick(p))),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)
}

/// One panel of [`bars`]: a title, the unit its values are in, and `(label, value)` bars.
pub type BarPanel = (String, String, Vec<(String, f64)>);

/// Horizontal bar charts side by side, one per panel (`gshard plan --png`: the memory and
/// the step-time breakdowns), each bar labelled with its value.
pub fn bars(path: &Path, title: &str, panels: &[BarPanel]) -> Result<(), PlotError> {
    draw_bars(path, title, panels).map_err(at(path))
}

fn draw_bars(path: &Path, title: &str, panels: &[BarPanel]) -> Result<(), String> {
    register_font();
    let n = panels.len().max(1);
    let root = BitMapBackend::new(path, (560 * n as u32, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 18)).map_err(err)?;
    for (area, (name, unit, bars)) in root.split_evenly((1, n)).iter().zip(panels) {
        let top = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-300) * 1.3;
        let rows = bars.len().max(1);
        let mut chart = ChartBuilder::on(area)
            .caption(name, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(170)
            // Segments 0..=rows-1: one band per bar.
            .build_cartesian_2d(0f64..top, (0..rows - 1).into_segmented())
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(unit.as_str())
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => bars.get(*i).map(|b| b.0.clone()).unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(err)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                let color = ramp(i as f64 / rows as f64 * 0.8);
                Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (*v, SegmentValue::Exact(i + 1)),
                    ],
                    color.filled(),
                )
            }))
            .map_err(err)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                Text::new(
                    format!("{v:.3}"),
                    (*v + top * 0.01, SegmentValue::CenterOf(i)),
                    ("sans-serif", 13),
                )
            }))
            .map_err(err)?;
    }
    root.present().map_err(err)
}
