//! Charts as SVG text, drawn by `plotters`: series of points over time (with vertical marks at
//! labelled instants), latency percentile curves (the quantile axis stretched so the tail,
//! 99 % and 99.9 %, gets as much room as the median), and values per index (one dot per
//! episode, say).
//!
//! Every chart is drawn at [`SIZE`] with a `viewBox`, so the page scales it to its full width.
//! Above the plot a band holds the legend and the marks' labels, laid out here rather than by
//! plotters so that no two texts overlap and no legend hides a line: legend entries wrap onto
//! rows, each mark's label takes the first of [`MARK_ROWS`] rows where it fits beside the
//! labels already placed (widths estimated on the generous side of a sans-serif font), and a
//! label that fits nowhere is left off the band; each mark keeps its full label as a hover
//! title. Marks are dashed and coloured, unlike the grid.
//!
//! Names of series and marks may come from a recording (a mod picks its channel names):
//! plotters' SVG backend escapes every text it writes (`<`, `>`, `&`, quotes; the tests here
//! hold it to that), the band's markup is escaped here with [`crate::page::escape`], and control
//! characters are replaced first (XML forbids most).

use std::fmt::Write;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::page::escape;

/// Width and height of every chart's drawing, in CSS pixels at 1:1 (the page scales it to its
/// width).
pub const SIZE: (u32, u32) = (1400, 420);

/// Rows of mark labels above a time chart.
pub const MARK_ROWS: usize = 3;

/// Space around the drawing.
const MARGIN: i32 = 12;
/// Right of the plot: room for the last x label, centred on the plot's edge.
const RIGHT: i32 = 32;
/// Left of the plot: the y axis' numbers and its description.
const Y_LABELS: i32 = 72;
/// Below the plot: the x axis' numbers and its description.
const X_LABELS: i32 = 42;
/// A legend row's height and its font size.
const LEGEND_ROW: i32 = 20;
const LEGEND_FONT: f64 = 13.0;
/// A mark label row's height and its font size.
const MARK_ROW: i32 = 16;
const MARK_FONT: f64 = 11.0;
/// Longest mark label drawn (the full one is its title).
const MARK_LABEL_CHARS: usize = 24;
/// Least room between two texts in a row.
const GAP: f64 = 8.0;
/// The marks' colour: not the grid's grey nor, being dashed, any series' line.
const MARK_COLOUR: &str = "#b0246a";

/// One named line.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Shown in the legend.
    pub name: String,
    /// (x, y) points in x order.
    pub points: Vec<(f64, f64)>,
}

/// A labelled instant drawn as a vertical line across a time chart.
#[derive(Debug, Clone)]
pub struct TimeMark {
    /// Where, in the chart's x units.
    pub x: f64,
    /// Its label (shortened to fit; the whole of it is the line's hover title).
    pub label: String,
}

/// Drawing a chart failed (plotters reported an error).
#[derive(Debug)]
pub struct ChartError(pub String);

impl std::fmt::Display for ChartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "drawing a chart: {}", self.0)
    }
}

impl std::error::Error for ChartError {}

fn err<E: std::fmt::Debug>(e: E) -> ChartError {
    ChartError(format!("{e:?}"))
}

/// Colours cycled through by series.
fn colour(i: usize) -> RGBColor {
    const C: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    C[i % C.len()]
}

/// A label short enough for a legend, without control, text-direction or invisible characters
/// (plotters escapes markup).
fn label(s: &str, max: usize) -> String {
    let clean = s.chars().map(|c| {
        if c.is_control() || gabp_rt::display::invisible(c) {
            '\u{fffd}'
        } else {
            c
        }
    });
    if s.chars().count() > max {
        clean.take(max - 1).chain(std::iter::once('…')).collect()
    } else {
        clean.collect()
    }
}

/// How wide `s` is drawn at `px` in a sans-serif font, estimated on the generous side (DejaVu
/// Sans, the widest common default, is narrower for every character): what the band's layout
/// keeps apart.
pub fn text_width(s: &str, px: f64) -> f64 {
    s.chars()
        .map(|c| match c {
            'i' | 'j' | 'l' | '.' | ',' | ':' | ';' | '\'' | '|' | '!' | ' ' => 0.4,
            'f' | 'r' | 't' | '(' | ')' | '[' | ']' | '-' | '/' | '\\' => 0.5,
            'm' | 'w' | 'M' | 'W' | '@' | '%' => 1.05,
            c if c.is_ascii_uppercase() => 0.85,
            c if c.is_ascii() => 0.68,
            // Wide scripts (CJK, emoji) take about a square each.
            _ => 1.1,
        })
        .sum::<f64>()
        * px
}

fn bounds(series: &[Series], marks: &[TimeMark]) -> (f64, f64, f64) {
    let xs = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(marks.iter().map(|m| m.x));
    let x_max = xs.fold(0.0f64, f64::max);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    (0.0, if x_max > 0.0 { x_max } else { 1.0 }, nice_top(y_max))
}

/// A little headroom above the largest value (and 1 for an empty chart).
fn nice_top(max: f64) -> f64 {
    if max.is_finite() && max > 0.0 {
        max * 1.08
    } else {
        1.0
    }
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Draws each series as a coloured line (with a dot at each point when `dots`).
fn draw_lines<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    series: &[Series],
    dots: bool,
) -> Result<(), ChartError> {
    for (i, s) in series.iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
            .map_err(err)?;
        if dots {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
                .map_err(err)?;
        }
    }
    Ok(())
}

/// The legend's entries placed in rows across the drawing: (row, x, name) per series.
fn legend_layout(series: &[Series]) -> Vec<(i32, f64, String)> {
    let left = f64::from(MARGIN + Y_LABELS);
    let right = f64::from(SIZE.0 as i32 - MARGIN);
    let (mut row, mut x) = (0, left);
    series
        .iter()
        .map(|s| {
            let name = label(&s.name, 32);
            let w = 22.0 + text_width(&name, LEGEND_FONT);
            if x > left && x + w > right {
                row += 1;
                x = left;
            }
            let at = (row, x, name);
            x += w + 2.0 * GAP;
            at
        })
        .collect()
}

fn legend_rows(series: &[Series]) -> i32 {
    legend_layout(series).last().map_or(0, |l| l.0 + 1)
}

/// The band above the plot: the legend's rows, then the marks' rows.
fn band_height(series: &[Series], marks: &[TimeMark]) -> i32 {
    let marks = if marks.is_empty() {
        0
    } else {
        MARK_ROWS as i32 * MARK_ROW + 4
    };
    legend_rows(series) * LEGEND_ROW + marks
}

/// The legend's markup (a swatch and the name of each series).
fn legend_svg(series: &[Series], out: &mut String) {
    let _ = writeln!(out, "<g class=\"legend\">");
    for (i, (row, x, name)) in legend_layout(series).into_iter().enumerate() {
        let base = MARGIN + row * LEGEND_ROW + 14;
        let RGBColor(r, g, b) = colour(i);
        let _ = writeln!(
            out,
            "<line x1=\"{x:.0}\" y1=\"{y}\" x2=\"{x2:.0}\" y2=\"{y}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"3\"/>\
             <text x=\"{tx:.0}\" y=\"{base}\" font-family=\"sans-serif\" font-size=\"{LEGEND_FONT}\" fill=\"#333\">{}</text>",
            escape(&name),
            y = base - 4,
            x2 = x + 16.0,
            tx = x + 22.0,
        );
    }
    let _ = writeln!(out, "</g>");
}

/// Where each mark's label goes: `Some((row, x, anchored at its end, text))`, or `None` where
/// no row has room (the mark keeps its line and its title). `xs` are the marks' pixel
/// positions in x order.
fn mark_layout(xs: &[f64], labels: &[String]) -> Vec<Option<(usize, f64, bool, String)>> {
    let left_edge = f64::from(MARGIN);
    let right_edge = f64::from(SIZE.0 as i32 - MARGIN);
    let mut row_end = [f64::NEG_INFINITY; MARK_ROWS];
    xs.iter()
        .zip(labels)
        .map(|(&x, text)| {
            let text = label(text, MARK_LABEL_CHARS);
            let w = text_width(&text, MARK_FONT);
            // Right of the line, or left of it near the drawing's right edge.
            let (start, end_anchored) = if x + 3.0 + w <= right_edge {
                (x + 3.0, false)
            } else {
                (x - 3.0 - w, true)
            };
            if start < left_edge {
                return None;
            }
            let row = (0..MARK_ROWS).find(|&r| start >= row_end[r] + GAP)?;
            row_end[row] = start + w;
            Some((
                row,
                if end_anchored { x - 3.0 } else { start },
                end_anchored,
                text,
            ))
        })
        .collect()
}

/// The marks' markup: a dashed line down the plot, its label in the band, its title.
fn marks_svg(marks: &[(f64, &TimeMark)], band_top: i32, plot_y: (i32, i32), out: &mut String) {
    let xs: Vec<f64> = marks.iter().map(|m| m.0).collect();
    let labels: Vec<String> = marks.iter().map(|m| m.1.label.clone()).collect();
    let placed = mark_layout(&xs, &labels);
    let _ = writeln!(out, "<g class=\"marks\">");
    for ((x, m), at) in marks.iter().zip(placed) {
        let title = escape(&label(&m.label, 300));
        let _ = write!(
            out,
            "<g class=\"mark\"><title>{title}</title>\
             <line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"{MARK_COLOUR}\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\
             <line x1=\"{x:.1}\" y1=\"{}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"transparent\" stroke-width=\"8\"/>",
            plot_y.0, plot_y.1, band_top, plot_y.1
        );
        if let Some((row, tx, end, text)) = at {
            let base = band_top + row as i32 * MARK_ROW + 12;
            let _ = write!(
                out,
                "<text x=\"{tx:.1}\" y=\"{base}\" text-anchor=\"{}\" font-family=\"sans-serif\" font-size=\"{MARK_FONT}\" fill=\"{MARK_COLOUR}\">{}</text>",
                if end { "end" } else { "start" },
                escape(&text)
            );
        }
        let _ = writeln!(out, "</g>");
    }
    let _ = writeln!(out, "</g>");
}

/// `extra` set into `svg` just before its end (drawn over plotters' drawing).
fn splice(mut svg: String, extra: &str) -> String {
    if let Some(at) = svg.rfind("</svg>") {
        svg.insert_str(at, extra);
    }
    svg
}

/// How a chart's x axis reads.
#[derive(Clone, Copy)]
enum XAxis {
    /// Plain numbers from 0.
    Linear,
    /// Whole numbers from 1 (episodes, runs): ticks only at integers.
    Index,
}

/// A chart of `series` over x, with `marks` as labelled dashed lines and `dots` at points.
fn xy(
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    marks: &[TimeMark],
    dots: bool,
    axis: XAxis,
) -> Result<String, ChartError> {
    let mut svg = String::new();
    let band = band_height(series, marks);
    let mut extra = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (mut x0, mut x1, y1) = bounds(series, marks);
        if let XAxis::Index = axis {
            x0 = 0.5;
            x1 = x1.max(1.0) + 0.5;
        }
        let mut chart = ChartBuilder::on(&root)
            .margin(MARGIN as u32)
            .margin_top((MARGIN + band + 6) as u32)
            .margin_right(RIGHT as u32)
            .x_label_area_size(X_LABELS as u32)
            .y_label_area_size(Y_LABELS as u32)
            .build_cartesian_2d(x0..x1, 0.0..y1)
            .map_err(err)?;
        let index_label = |x: &f64| {
            if (x - x.round()).abs() < 1e-9 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        };
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(label(x_desc, 60))
            .y_desc(label(y_desc, 60))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .light_line_style(RGBColor(235, 235, 235));
        if let XAxis::Index = axis {
            let n = (x1 - x0).round() as usize;
            mesh.x_labels(n.clamp(1, 20))
                .x_label_formatter(&index_label);
        }
        mesh.draw().map_err(err)?;
        draw_lines(&mut chart, series, dots)?;
        let (_, ys) = chart.plotting_area().get_pixel_range();
        let mut placed: Vec<(f64, &TimeMark)> = marks
            .iter()
            .map(|m| (f64::from(chart.backend_coord(&(m.x, 0.0)).0), m))
            .collect();
        placed.sort_by(|a, b| a.0.total_cmp(&b.0));
        legend_svg(series, &mut extra);
        if !placed.is_empty() {
            let band_top = MARGIN + legend_rows(series) * LEGEND_ROW + 2;
            marks_svg(&placed, band_top, (ys.start, ys.end), &mut extra);
        }
        root.present().map_err(err)?;
    }
    Ok(splice(svg, &extra))
}

/// Lines over time: `series` against x (seconds, say), with `marks` as labelled vertical lines.
pub fn lines(
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    marks: &[TimeMark],
) -> Result<String, ChartError> {
    xy(x_desc, y_desc, series, marks, false, XAxis::Linear)
}

/// Values per index (episode 1, 2, 3…): each series' points are (index, value), drawn as dots
/// joined by lines, the x axis labelled at whole numbers only.
pub fn per_index(x_desc: &str, y_desc: &str, series: &[Series]) -> Result<String, ChartError> {
    xy(x_desc, y_desc, series, &[], true, XAxis::Index)
}

/// The x position of quantile `q` on a percentile chart: 0 at the median's left edge (q = 0),
/// 1 at 90 %, 2 at 99 %, 3 at 99.9 %.
pub fn quantile_x(q: f64) -> f64 {
    -(1.0 - q.clamp(0.0, 0.9999)).log10()
}

/// The quantiles a percentile curve is drawn through.
pub const CURVE_QUANTILES: [f64; 12] = [
    0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9995, 0.9999,
];

/// Latency percentile curves: each series' points are (quantile 0..1, value); the x axis is
/// labelled in percent and stretched toward the tail ([`quantile_x`]).
pub fn percentiles(y_desc: &str, series: &[Series]) -> Result<String, ChartError> {
    let mut svg = String::new();
    let band = band_height(series, &[]);
    let mut extra = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let y1 = nice_top(
            series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1))
                .fold(0.0f64, f64::max),
        );
        let mut chart = ChartBuilder::on(&root)
            .margin(MARGIN as u32)
            .margin_top((MARGIN + band + 6) as u32)
            .margin_right(RIGHT as u32)
            .x_label_area_size(X_LABELS as u32)
            .y_label_area_size(Y_LABELS as u32)
            .build_cartesian_2d(0.0..quantile_x(0.9999), 0.0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc(label(y_desc, 60))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 16))
            .x_labels(5)
            .x_label_formatter(&|x| {
                let q = 1.0 - 10f64.powf(-x);
                format!("{}%", (q * 10000.0).round() / 100.0)
            })
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        let stretched: Vec<Series> = series
            .iter()
            .map(|s| Series {
                name: s.name.clone(),
                points: s.points.iter().map(|&(q, v)| (quantile_x(q), v)).collect(),
            })
            .collect();
        draw_lines(&mut chart, &stretched, true)?;
        legend_svg(series, &mut extra);
        root.present().map_err(err)?;
    }
    Ok(splice(svg, &extra))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_chart_is_one_svg_with_its_series_and_marks() {
        let s = Series {
            name: "a<b>".into(),
            points: (0..10).map(|i| (i as f64, (i * i) as f64)).collect(),
        };
        let m = TimeMark {
            x: 4.5,
            label: "episode & <start>".into(),
        };
        let svg = lines("time (s)", "events/s", &[s], &[m]).expect("drawn");
        assert!(!svg.contains("&amp;lt;"), "escaped once, not twice");
        assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a&lt;b&gt;"), "series name escaped");
        assert!(
            svg.contains("episode &amp; &lt;start&gt;"),
            "mark label escaped"
        );
        assert!(!svg.contains("<b>") && !svg.contains("<start>"));
        assert!(svg.matches("<polyline").count() >= 1);
    }

    #[test]
    fn mark_labels_close_together_take_rows_and_never_share_one_span() {
        // 40 marks 0.2 s apart over 8 s: far closer than a label is wide.
        let marks: Vec<TimeMark> = (0..40)
            .map(|i| TimeMark {
                x: i as f64 * 0.2,
                label: if i % 2 == 0 {
                    "episode-start"
                } else {
                    "episode-end"
                }
                .into(),
            })
            .collect();
        let xs: Vec<f64> = marks.iter().map(|m| 100.0 + m.x * 150.0).collect();
        let labels: Vec<String> = marks.iter().map(|m| m.label.clone()).collect();
        let placed = mark_layout(&xs, &labels);
        let mut spans: Vec<Vec<(f64, f64)>> = vec![Vec::new(); MARK_ROWS];
        for (row, x, end, text) in placed.iter().flatten() {
            let w = text_width(text, MARK_FONT);
            let start = if *end { x - w } else { *x };
            for &(a, b) in &spans[*row] {
                assert!(start >= b + GAP || start + w + GAP <= a, "{text} overlaps");
            }
            spans[*row].push((start, start + w));
        }
        let shown = placed.iter().flatten().count();
        assert!(
            shown >= MARK_ROWS && shown < marks.len(),
            "{shown} labels shown"
        );
        // Every mark keeps its line and its whole label as a title.
        let svg = lines("time (s)", "events/s", &[], &marks).expect("drawn");
        assert_eq!(svg.matches("<g class=\"mark\"><title>").count(), 40);
        assert_eq!(svg.matches("stroke-dasharray").count(), 40);
        assert!(svg.contains(MARK_COLOUR));
        // A long label is cut in the band, whole in its title.
        let long = "a-label-much-longer-than-the-band-shows";
        let svg = lines(
            "t",
            "y",
            &[],
            &[TimeMark {
                x: 1.0,
                label: long.into(),
            }],
        )
        .expect("drawn");
        assert!(svg.contains(&format!("<title>{long}</title>")));
        assert!(svg.contains("a-label-much-longer-tha…</text>"));
    }

    #[test]
    fn a_long_legend_wraps_onto_rows_within_the_drawing() {
        let series: Vec<Series> = (0..12)
            .map(|i| Series {
                name: format!("a-channel-with-a-long-name-{i}"),
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            })
            .collect();
        let rows = legend_rows(&series);
        assert!(rows >= 2, "{rows} rows");
        for (_, x, name) in legend_layout(&series) {
            assert!(x + 22.0 + text_width(&name, LEGEND_FONT) <= f64::from(SIZE.0));
        }
        let svg = per_index("episode", "events", &series).expect("drawn");
        assert_eq!(
            svg.matches("<line x1=").count(),
            12,
            "one swatch per series"
        );
    }

    #[test]
    fn quantiles_map_to_decades_of_the_tail() {
        assert!(quantile_x(0.0).abs() < 1e-12);
        assert!((quantile_x(0.9) - 1.0).abs() < 1e-9);
        assert!((quantile_x(0.99) - 2.0).abs() < 1e-9);
        assert!((quantile_x(0.999) - 3.0).abs() < 1e-9);
        let svg = percentiles(
            "ms",
            &[Series {
                name: "m".into(),
                points: CURVE_QUANTILES.iter().map(|&q| (q, q * 10.0)).collect(),
            }],
        )
        .expect("drawn");
        assert!(svg.contains("99.9%"), "tail labelled");
    }
}
