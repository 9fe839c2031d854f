//! SVG plots (plotters, SVG backend only; text is laid out with plotters' built-in metrics, so no
//! system fonts are needed). Each function writes one file and returns an error only on I/O.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

/// A fault drawn as a shaded span `[from, to]` (run time, s) with a label.
pub struct FaultSpan {
    pub from: f64,
    pub to: f64,
    pub label: String,
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// A stable color per series name (backends get fixed colors, anything else the palette).
pub fn color_for(name: &str, i: usize) -> RGBColor {
    let base = name.split('-').next().unwrap_or(name);
    match name {
        n if n.starts_with("redis-naive") => RGBColor(214, 39, 40),
        _ => match base {
            "etcd" => RGBColor(31, 119, 180),
            "raft" => RGBColor(44, 160, 44),
            "redis" => RGBColor(255, 127, 14),
            "zk" => RGBColor(148, 103, 189),
            "pg" => RGBColor(140, 86, 75),
            _ => {
                let c = Palette99::pick(i).to_rgba();
                RGBColor(c.0, c.1, c.2)
            }
        },
    }
}

fn fault_style(kind: &str) -> RGBColor {
    match kind {
        k if k.starts_with("kill") => RED,
        k if k.starts_with("pause") => RGBColor(255, 160, 0),
        k if k.starts_with("partition") => MAGENTA,
        _ => BLUE,
    }
}

/// Leaders acting by effect (from the ledger) over run time, with the faults shaded.
pub fn acting(
    path: &Path,
    title: &str,
    initial: i32,
    steps: &[(f64, i32)],
    faults: &[FaultSpan],
    x_max: f64,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 320)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let y_max = steps.iter().map(|s| s.1).max().unwrap_or(1).max(2) as f64 + 0.5;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0f64..x_max.max(1.0), 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc("run time (s), resource clock")
        .y_desc("leaders acting (by effect)")
        .y_labels(4)
        .draw()
        .map_err(err)?;
    for f in faults {
        let c = fault_style(&f.label);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(f.from, 0.0), (f.to.max(f.from + x_max / 400.0), y_max)],
                c.mix(0.25).filled(),
            )))
            .map_err(err)?;
        // Past a few dozen faults the labels only overprint each other (the nemesis timeline
        // has one lane per kind instead).
        if faults.len() <= 40 {
            chart
                .draw_series(std::iter::once(Text::new(
                    f.label.clone(),
                    (f.from, y_max - 0.15),
                    ("sans-serif", 11).into_font().color(&c),
                )))
                .map_err(err)?;
        }
    }
    chart
        .draw_series(LineSeries::new(
            step_points(initial, steps, x_max),
            BLACK.stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 1.0), (x_max, 1.0)],
            GREEN.mix(0.6),
        )))
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// `seq` against run time (resource clock), one color per leadership (token).
pub fn seq(
    path: &Path,
    title: &str,
    points: &[(f64, i64, i64)],
    faults: &[FaultSpan],
    x_max: f64,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 380)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let y_max = points.iter().map(|p| p.1).max().unwrap_or(1).max(1) as f64 * 1.05;
    let y_min = points.iter().map(|p| p.1).min().unwrap_or(0) as f64 * 0.95;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max.max(1.0), y_min..y_max.max(y_min + 1.0))
        .map_err(err)?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc("run time (s), fence_log.committed_at")
        .y_desc("seq (last of each committed batch)")
        .draw()
        .map_err(err)?;
    for f in faults {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(f.from, y_min), (f.to.max(f.from + x_max / 400.0), y_max)],
                fault_style(&f.label).mix(0.2).filled(),
            )))
            .map_err(err)?;
    }
    let mut tokens: Vec<i64> = points.iter().map(|p| p.2).collect();
    tokens.sort_unstable();
    tokens.dedup();
    // One polyline per run of consecutive rows under one token (compact SVG), a dot at each end.
    for (i, tok) in tokens.iter().enumerate() {
        let c = Palette99::pick(i).to_rgba();
        let color = RGBColor(c.0, c.1, c.2);
        let mut segments: Vec<Vec<(f64, f64)>> = Vec::new();
        let mut prev_tok = None;
        for p in points {
            if p.2 == *tok {
                if prev_tok != Some(p.2) {
                    segments.push(Vec::new());
                }
                segments.last_mut().expect("pushed").push((p.0, p.1 as f64));
            }
            prev_tok = Some(p.2);
        }
        for (k, seg) in segments.iter().enumerate() {
            let line = chart
                .draw_series(LineSeries::new(seg.clone(), color.stroke_width(2)))
                .map_err(err)?;
            if k == 0 {
                line.label(format!("token {tok}"))
                    .legend(move |(x, y)| Circle::new((x + 8, y), 3, color.filled()));
            }
            let ends = [seg[0], seg[seg.len() - 1]];
            chart
                .draw_series(ends.iter().map(|p| Circle::new(*p, 3, color.filled())))
                .map_err(err)?;
        }
    }
    if tokens.len() <= 12 {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Failover time against lease TTL, per backend (log-log): median line, max as crosses, and the
/// lease bound TTL + 200 ms dashed.
pub fn failover_vs_ttl(
    path: &Path,
    title: &str,
    series: &BTreeMap<String, Vec<(f64, f64, f64)>>,
) -> anyhow::Result<()> {
    let all: Vec<&(f64, f64, f64)> = series.values().flatten().collect();
    if all.is_empty() {
        return Ok(());
    }
    let x_min = all.iter().map(|p| p.0).fold(f64::MAX, f64::min).min(1.0) * 0.7;
    let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max) * 1.4;
    let y_max = all
        .iter()
        .map(|p| p.2.max(p.0 * 1000.0 + 200.0))
        .fold(0.0, f64::max)
        * 1.5;
    let y_min = all.iter().map(|p| p.1).fold(f64::MAX, f64::min).max(1.0) * 0.5;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min..x_max).log_scale(), (y_min..y_max).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc("lease TTL (s) — raft: its lease (≤ min election timeout)")
        .y_desc("failover ms, kill -9 → first new write (resource clock)")
        .draw()
        .map_err(err)?;
    let bound: Vec<(f64, f64)> = (0..=40)
        .map(|i| {
            let x = x_min * (x_max / x_min).powf(i as f64 / 40.0);
            (x, x * 1000.0 + 200.0)
        })
        .collect();
    chart
        .draw_series(DashedLineSeries::new(bound, 6, 4, BLACK.mix(0.5).into()))
        .map_err(err)?
        .label("bound: TTL + 200 ms")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.5)));
    for (i, (name, pts)) in series.iter().enumerate() {
        let pts: Vec<(f64, f64, Option<f64>)> = pts.iter().map(|p| (p.0, p.1, Some(p.2))).collect();
        draw_points(
            &mut chart,
            &format!("{name} (median; × = max)"),
            color_for(name, i),
            pts,
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Points joined per series on linear axes, with a dashed vertical line at x = 0.
pub fn xy(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &BTreeMap<String, Vec<(f64, f64)>>,
) -> anyhow::Result<()> {
    let all: Vec<&(f64, f64)> = series.values().flatten().collect();
    if all.is_empty() {
        return Ok(());
    }
    let x_min = all.iter().map(|p| p.0).fold(0.0, f64::min) - 0.02;
    let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max) + 0.02;
    let points: BTreeMap<String, Vec<(f64, f64, Option<f64>)>> = series
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().map(|p| (p.0, p.1, None)).collect()))
        .collect();
    lines(
        path,
        &Axes {
            title,
            x_desc,
            y_desc,
            x_range: (x_min, x_max),
            marker: Some((0.0, "drift = bound")),
        },
        &points,
    )
}

/// Titles, x range and an optional dashed vertical marker (`(x, legend)`) for [`lines`].
pub struct Axes<'a> {
    pub title: &'a str,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub x_range: (f64, f64),
    pub marker: Option<(f64, &'a str)>,
}

/// One series of `lines`: `(x, y, y2)` points.
pub type Series = Vec<(f64, f64, Option<f64>)>;

/// One line with dots per series of `(x, y, y2)` points; `y2` (e.g. a maximum beside a median)
/// is drawn as a cross at the same x. The y axis starts at 0.
pub fn lines(path: &Path, axes: &Axes, series: &BTreeMap<String, Series>) -> anyhow::Result<()> {
    let all: Vec<&(f64, f64, Option<f64>)> = series.values().flatten().collect();
    if all.is_empty() {
        return Ok(());
    }
    let y_max = all
        .iter()
        .map(|p| p.1.max(p.2.unwrap_or(0.0)))
        .fold(1.0, f64::max)
        * 1.2;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(axes.title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(axes.x_range.0..axes.x_range.1, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .draw()
        .map_err(err)?;
    if let Some((x, label)) = axes.marker {
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x, 0.0), (x, y_max)],
                6,
                4,
                BLACK.mix(0.5).into(),
            ))
            .map_err(err)?
            .label(label)
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.5)));
    }
    for (i, (name, pts)) in series.iter().enumerate() {
        draw_points(&mut chart, name, color_for(name, i), pts.clone())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One series on any x/y axes (linear or log): a line with dots through `(x, y)` sorted by x,
/// labelled `label` in the legend, and `y2` (e.g. a maximum beside a median) as a cross.
fn draw_points<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    label: &str,
    color: RGBColor,
    mut pts: Vec<(f64, f64, Option<f64>)>,
) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    chart
        .draw_series(LineSeries::new(
            pts.iter().map(|p| (p.0, p.1)),
            color.stroke_width(2),
        ))
        .map_err(err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    chart
        .draw_series(
            pts.iter()
                .map(|p| Circle::new((p.0, p.1), 4, color.filled())),
        )
        .map_err(err)?;
    chart
        .draw_series(
            pts.iter()
                .filter_map(|p| Some(Cross::new((p.0, p.2?), 5, color.stroke_width(2)))),
        )
        .map_err(err)?;
    Ok(())
}

/// Empirical CDFs, one per series (values in ms).
pub fn cdf(
    path: &Path,
    title: &str,
    x_desc: &str,
    series: &BTreeMap<String, Vec<f64>>,
) -> anyhow::Result<()> {
    let x_max = series
        .values()
        .flatten()
        .copied()
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.05;
    let root = SVGBackend::new(path, (800, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..x_max, 0f64..1.02)
        .map_err(err)?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc(x_desc)
        .y_desc("fraction ≤ x")
        .draw()
        .map_err(err)?;
    for (i, (name, vals)) in series.iter().enumerate() {
        if vals.is_empty() {
            continue;
        }
        let mut v = vals.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len() as f64;
        let mut pts = vec![(0.0, 0.0)];
        for (k, x) in v.iter().enumerate() {
            pts.push((*x, k as f64 / n));
            pts.push((*x, (k + 1) as f64 / n));
        }
        let color = color_for(name, i);
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(format!("{name} (n={})", v.len()))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// One fault in the nemesis timeline: its lane (kind), span, and whether it took effect.
pub struct LaneFault {
    pub lane: usize,
    pub span: FaultSpan,
    pub took_effect: bool,
}

/// The nemesis timeline, three panels over one run-time axis: the faults as bands, one lane per
/// kind (solid: took effect; hollow: did not), the leaders acting by effect (the ledger), and
/// the token of every accepted write.
#[allow(clippy::too_many_arguments)] // one panel's data each; a struct would only rename them
pub fn nemesis_timeline(
    path: &Path,
    title: &str,
    lanes: &[String],
    faults: &[LaneFault],
    acting_initial: i32,
    acting_steps: &[(f64, i32)],
    tokens: &[(f64, i64)],
    x_max: f64,
) -> anyhow::Result<()> {
    let x_max = x_max.max(1.0);
    let lane_px = 22 * lanes.len().max(1) as u32;
    let root = SVGBackend::new(path, (1400, 120 + lane_px + 180 + 260)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 16)).map_err(err)?;
    let (top, rest) = root.split_vertically(lane_px + 60);
    let (mid, bottom) = rest.split_vertically(180);

    let n = lanes.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&top)
        .margin(8)
        .x_label_area_size(20)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..x_max, 0f64..n)
        .map_err(err)?;
    let lane_names = lanes.to_vec();
    chart
        .configure_mesh()
        .max_light_lines(0)
        .y_labels(lanes.len().max(1))
        .y_label_formatter(&|y| {
            let i = y.floor() as usize;
            lane_names.get(i).cloned().unwrap_or_default()
        })
        .draw()
        .map_err(err)?;
    for f in faults {
        let c = fault_style(&f.span.label);
        let y0 = f.lane as f64 + 0.15;
        let rect = [
            (f.span.from, y0),
            (f.span.to.max(f.span.from + x_max / 1000.0), y0 + 0.7),
        ];
        let style = if f.took_effect {
            c.mix(0.7).filled()
        } else {
            c.stroke_width(1)
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(rect, style)))
            .map_err(err)?;
    }

    let y_max = acting_steps.iter().map(|s| s.1).max().unwrap_or(1).max(2) as f64 + 0.5;
    let mut chart = ChartBuilder::on(&mid)
        .margin(8)
        .x_label_area_size(20)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .y_desc("leaders acting")
        .y_labels(4)
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            step_points(acting_initial, acting_steps, x_max),
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.0, 1.0), (x_max, 1.0)],
            GREEN.mix(0.6),
        )))
        .map_err(err)?;

    let t_min = tokens.iter().map(|t| t.1).min().unwrap_or(0) as f64;
    let t_max = tokens.iter().map(|t| t.1).max().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(&bottom)
        .margin(8)
        .x_label_area_size(35)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..x_max, t_min..(t_max + 1.0).max(t_min + 1.0))
        .map_err(err)?;
    chart
        .configure_mesh()
        .max_light_lines(0)
        .x_desc("run time (s); writes on the resource clock (fence_log.committed_at)")
        .y_desc("accepted token")
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            tokens
                .iter()
                .map(|(t, k)| Circle::new((*t, *k as f64), 1, BLUE.filled())),
        )
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// A step function's corners: hold each count from its change until the next, then to `x_max`.
fn step_points(initial: i32, steps: &[(f64, i32)], x_max: f64) -> Vec<(f64, f64)> {
    let mut cur = f64::from(initial);
    let mut pts = vec![(0.0, cur)];
    for &(t, n) in steps {
        pts.push((t, cur));
        cur = f64::from(n);
        pts.push((t, cur));
    }
    pts.push((x_max, cur));
    pts
}
