//! PNG charts of a scale run (`compare --scale … --plot DIR`, or
//! `retcd-bench plot --from results.json --out DIR` to redraw saved
//! results, which also prints their tables again): both servers on every chart, medians over runs, log-scale
//! axes (sizes grow tenfold per point, and costs span decades).
//!
//! Drawn with `plotters` into an RGB buffer and written with `png`, with
//! the DejaVu Sans font compiled in (the `dejavu` crate): no system font
//! or font library is needed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::compare::Flavor;
use crate::scale::{
    median_of, paginated, sizes_in, stream, unary, ListResult, ListStatus, Measure, ScaleKind,
    ScalePoint, ScaleResults, V,
};

const FONT: &str = "sans-serif";
const MIB: f64 = 1024.0 * 1024.0;

/// Registers the compiled-in font with plotters once.
fn font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the compiled-in DejaVu Sans font did not load"))
    }
}

#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
    Cross,
}

/// One line: a server and a measure, (size, median) per point.
struct Series {
    label: String,
    color: RGBColor,
    marker: Marker,
    points: Vec<(f64, f64)>,
}

/// Line colours per server: blues for etcd, reds for retcd.
fn color(f: Flavor, i: usize) -> RGBColor {
    let etcd = [
        RGBColor(31, 119, 180),
        RGBColor(23, 190, 207),
        RGBColor(40, 50, 130),
    ];
    let retcd = [
        RGBColor(214, 39, 40),
        RGBColor(255, 127, 14),
        RGBColor(140, 20, 90),
    ];
    match f {
        Flavor::Etcd => etcd[i % 3],
        Flavor::Retcd => retcd[i % 3],
    }
}

const MARKERS: [Marker; 3] = [Marker::Circle, Marker::Triangle, Marker::Cross];

/// For each server, one series per `(label, measure)`; sizes where the
/// measure is missing, unsupported or not positive (a log axis) are left
/// out, and so is a series with no point at all.
fn series(points: &[ScalePoint], kind: ScaleKind, measures: &[(&str, Measure)]) -> Vec<Series> {
    let mut out = Vec::new();
    for f in [Flavor::Etcd, Flavor::Retcd] {
        for (i, (label, m)) in measures.iter().enumerate() {
            let pts: Vec<(f64, f64)> = sizes_in(points, kind)
                .into_iter()
                .filter_map(|s| {
                    median_of(points, kind, s, f, *m)
                        .ok()
                        .filter(|v| *v > 0.0)
                        .map(|v| (s as f64, v))
                })
                .collect();
            if !pts.is_empty() {
                out.push(Series {
                    label: format!("{} {label}", f.name()),
                    color: color(f, i),
                    marker: MARKERS[i % 3],
                    points: pts,
                });
            }
        }
    }
    out
}

/// `1500` → `1.5k`, `2e6` → `2M`, `0.004` → `0.004`.
fn human(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let a = v.abs();
    if a >= 1e9 {
        trim(format!("{:.1}", v / 1e9)) + "G"
    } else if a >= 1e6 {
        trim(format!("{:.1}", v / 1e6)) + "M"
    } else if a >= 1e3 {
        trim(format!("{:.1}", v / 1e3)) + "k"
    } else if a >= 1.0 || a == 0.0 {
        trim(format!("{v:.1}"))
    } else {
        let digits = (-a.log10()).ceil() as usize + 1;
        trim(format!("{v:.digits$}"))
    }
}

/// `[lo, hi]` of `xs` widened by `pad` on a log scale (and made non-empty).
fn log_bounds(xs: impl Iterator<Item = f64>, pad: f64) -> (f64, f64) {
    let (lo, hi) = xs.fold((f64::INFINITY, 0.0f64), |(l, h), x| (l.min(x), h.max(x)));
    if !lo.is_finite() || hi <= 0.0 {
        return (1.0, 10.0);
    }
    (lo / pad, hi * pad)
}

/// The x values of `series`, ascending, once each.
fn sizes(series: &[Series]) -> Vec<f64> {
    let mut v: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// Ticks for a log axis over `[lo, hi]`: 1-2-5 steps, or every 1…9 step
/// when the range is too narrow for four of those.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let steps = |ms: &[f64]| -> Vec<f64> {
        let (k0, k1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (k0..=k1)
            .flat_map(|k| ms.iter().map(move |m| m * 10f64.powi(k)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect()
    };
    let v = steps(&[1.0, 2.0, 5.0]);
    if v.len() >= 4 {
        v
    } else {
        steps(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    }
}

/// One chart of `series` in `area`.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
) -> Result<()> {
    let all = || series.iter().flat_map(|s| s.points.iter().copied());
    let (x0, x1) = log_bounds(all().map(|p| p.0), 1.6);
    let (y0, y1) = log_bounds(all().map(|p| p.1), 2.0);
    let mut c = ChartBuilder::on(area)
        .caption(title, (FONT, 22))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            // a tick at every size measured
            (x0..x1).log_scale().with_key_points(sizes(series)),
            (y0..y1).log_scale().with_key_points(log_ticks(y0, y1)),
        )?;
    c.configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 16))
        .x_label_formatter(&|x| human(*x))
        .y_label_formatter(&|y| human(*y))
        .draw()?;
    if series.is_empty() {
        area.draw(&Text::new(
            "no data",
            (
                area.dim_in_pixel().0 as i32 / 2 - 30,
                area.dim_in_pixel().1 as i32 / 2,
            ),
            (FONT, 20),
        ))?;
        return Ok(());
    }
    for s in series {
        let color = s.color;
        c.draw_series(LineSeries::new(s.points.clone(), color.stroke_width(2)))?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(2))
            });
        let style = color.filled();
        let pts = s.points.iter().copied();
        match s.marker {
            Marker::Circle => {
                c.draw_series(pts.map(|p| Circle::new(p, 4, style)))?;
            }
            Marker::Triangle => {
                c.draw_series(pts.map(|p| TriangleMarker::new(p, 6, style)))?;
            }
            Marker::Cross => {
                c.draw_series(pts.map(|p| Cross::new(p, 5, color.stroke_width(2))))?;
            }
        }
    }
    c.configure_series_labels()
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}

/// (title, x description, y description, series) of one panel.
type Panel = (String, String, String, Vec<Series>);

/// Draws `panels` side by side into a PNG at `path`.
fn chart(path: &Path, panels: Vec<Panel>) -> Result<()> {
    font()?;
    let (w, h) = (900 * panels.len() as u32, 620u32);
    let mut buf = vec![0u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE)?;
        let areas = root.split_evenly((1, panels.len()));
        for (area, (title, x, y, s)) in areas.iter().zip(&panels) {
            panel(area, title, x, y, s)?;
        }
        root.present()?;
    }
    let file = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header()?;
    wr.write_image_data(&buf)?;
    wr.finish()?;
    Ok(())
}

fn list_time(r: Option<&ListResult>) -> V {
    match r {
        Some(r) if r.status == ListStatus::Unsupported => V::Unsupported,
        Some(r) => r.wall_secs.map(V::N).unwrap_or(V::Missing),
        None => V::Missing,
    }
}

fn opt(x: Option<f64>) -> V {
    x.map(V::N).unwrap_or(V::Missing)
}

/// Writes the charts of every kind present in `r` into `dir` (created if
/// missing); the files written.
pub fn write_charts(r: &ScaleResults, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let p = &r.points;
    let has = |k: ScaleKind| p.iter().any(|x| x.kind == k);
    let s = |t: &str| t.to_string();
    let mut out = Vec::new();
    let mut write = |name: &str, panels: Vec<Panel>| -> Result<()> {
        let path = dir.join(name);
        chart(&path, panels)?;
        out.push(path);
        Ok(())
    };
    if has(ScaleKind::Keys) {
        let k = ScaleKind::Keys;
        write(
            "keys-list-time.png",
            vec![(
                s("Listing every key (one client)"),
                s("keys"),
                s("seconds"),
                series(
                    p,
                    k,
                    &[
                        ("unary", |p| list_time(unary(p))),
                        ("paginated 500", |p| list_time(paginated(p))),
                        ("RangeStream", |p| list_time(stream(p))),
                    ],
                ),
            )],
        )?;
        write(
            "keys-rss.png",
            vec![(
                s("Server memory (VmRSS)"),
                s("keys"),
                s("MiB"),
                series(
                    p,
                    k,
                    &[
                        ("filled", |p| {
                            opt(p.keys.as_ref().map(|k| k.rss_filled_bytes as f64 / MIB))
                        }),
                        ("after restart", |p| {
                            opt(p
                                .keys
                                .as_ref()
                                .map(|k| k.restart.rss_after_bytes as f64 / MIB))
                        }),
                    ],
                ),
            )],
        )?;
        write(
            "keys-fill.png",
            vec![
                (
                    s("Fill throughput (100 clients)"),
                    s("keys"),
                    s("puts/s"),
                    series(
                        p,
                        k,
                        &[("fill", |p| {
                            opt(p.keys.as_ref().map(|k| k.fill_puts_per_sec))
                        })],
                    ),
                ),
                (
                    s("Fill put latency p99"),
                    s("keys"),
                    s("ms"),
                    series(
                        p,
                        k,
                        &[("fill p99", |p| opt(p.keys.as_ref().map(|k| k.fill_p99_ms)))],
                    ),
                ),
            ],
        )?;
    }
    if has(ScaleKind::Watchers) {
        let k = ScaleKind::Watchers;
        write(
            "watchers.png",
            vec![
                (
                    s("Put → event latency p99"),
                    s("watchers"),
                    s("ms"),
                    series(
                        p,
                        k,
                        &[("p99", |p| {
                            opt(p.watchers.as_ref().map(|w| w.latency_p99_ms))
                        })],
                    ),
                ),
                (
                    s("Server memory per watcher"),
                    s("watchers"),
                    s("bytes"),
                    series(
                        p,
                        k,
                        &[("RSS/watcher", |p| {
                            opt(p.watchers.as_ref().map(|w| w.rss_per_watcher_bytes))
                        })],
                    ),
                ),
            ],
        )?;
    }
    if has(ScaleKind::Leases) {
        write(
            "leases-cpu.png",
            vec![(
                s("Server CPU keeping leases alive"),
                s("leases"),
                s("% of one core"),
                series(
                    p,
                    ScaleKind::Leases,
                    &[("CPU", |p| {
                        opt(p.leases.as_ref().map(|l| l.server_cpu_cores * 100.0))
                    })],
                ),
            )],
        )?;
    }
    Ok(out)
}

/// The results saved by `compare --scale KIND -w json`, for `retcd-bench plot`.
pub fn load(from: &Path) -> Result<ScaleResults> {
    let text = std::fs::read_to_string(from).with_context(|| format!("read {}", from.display()))?;
    let r: ScaleResults = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not the JSON of a scale run (`compare --scale KIND -w json`)",
            from.display()
        )
    })?;
    if r.points.is_empty() {
        anyhow::bail!("{} holds no scale points", from.display());
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn log_ticks_fill_narrow_ranges() {
        assert_eq!(
            super::log_ticks(0.9, 120.0),
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(
            super::log_ticks(35.0, 180.0),
            vec![40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]
        );
    }

    #[test]
    fn human_numbers() {
        assert_eq!(human(1000.0), "1k");
        assert_eq!(human(1500.0), "1.5k");
        assert_eq!(human(2e6), "2M");
        assert_eq!(human(10.0), "10");
        assert_eq!(human(0.004), "0.004");
        assert_eq!(human(0.25), "0.25");
    }
}
