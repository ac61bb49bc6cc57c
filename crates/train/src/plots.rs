//! PNG plots of a run (plotters, bitmap backend, with a vendored DejaVu Sans so no system
//! font is needed): the loss curve, and the expert load per MoE layer over training.

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

/// Fraction of tokens routed (first choice) to each expert over training, one panel per MoE
/// layer.
pub fn expert_load(path: &Path, series: &[LoadSeries]) -> Result<(), PlotError> {
    draw_expert_load(path, series).map_err(at(path))
}

fn draw_expert_load(path: &Path, series: &[LoadSeries]) -> Result<(), String> {
    register_font();
    let n = series.len().max(1);
    let root = BitMapBackend::new(path, (900, 300 * n as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((n, 1));
    for (panel, (name, points)) in panels.iter().zip(series) {
        let x1 = points.last().map(|p| p.0).unwrap_or(1.0).max(1.0);
        let e = points.first().map(|p| p.1.len()).unwrap_or(1);
        let y1 = points
            .iter()
            .flat_map(|p| p.1.iter().copied())
            .fold(1.0 / e as f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("expert load: {name}"), ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..x1, 0f64..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("step")
            .y_desc("fraction of tokens")
            .draw()
            .map_err(err)?;
        for k in 0..e {
            let color = Palette99::pick(k);
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|p| (p.0, p.1[k])),
                    color.stroke_width(1),
                ))
                .map_err(err)?;
        }
        let uniform = 1.0 / e as f64;
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, uniform), (x1, uniform)],
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)
}
