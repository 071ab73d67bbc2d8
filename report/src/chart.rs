//! Charts as SVG text, drawn by `plotters`: series of points over time (with vertical marks at
//! labelled instants) and latency percentile curves (the quantile axis stretched so the tail,
//! 99 % and 99.9 %, gets as much room as the median).
//!
//! Names of series and marks may come from a recording (a mod picks its channel names):
//! plotters' SVG backend escapes every text it writes (`<`, `>`, `&`, quotes; the tests here
//! hold it to that), and control characters are replaced here first (XML forbids most).

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

/// Width and height of every chart, in CSS pixels.
pub const SIZE: (u32, u32) = (900, 340);

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
    /// Its label (shortened to fit).
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

/// Draws each series as a coloured line (with a dot at each point when `dots`) and the legend.
fn draw_lines<'a, 'b: 'a>(
    chart: &mut Chart<'a, 'b>,
    series: &[Series],
    legend_at: SeriesLabelPosition,
    dots: bool,
) -> Result<(), ChartError> {
    for (i, s) in series.iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
            .map_err(err)?
            .label(label(&s.name, 32))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        if dots {
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 2, c.filled())))
                .map_err(err)?;
        }
    }
    if !series.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .position(legend_at)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// Lines over time: `series` against x (seconds, say), with `marks` as labelled vertical lines.
pub fn lines(
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    marks: &[TimeMark],
) -> Result<String, ChartError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (x0, x1, y1) = bounds(series, marks);
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, 0.0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(label(x_desc, 60))
            .y_desc(label(y_desc, 60))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for m in marks {
            let c = RGBColor(120, 120, 120);
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(m.x, 0.0), (m.x, y1)],
                    c.stroke_width(1),
                )))
                .map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    label(&m.label, 18),
                    (m.x, y1 * 0.97),
                    ("sans-serif", 11).into_font().color(&c),
                )))
                .map_err(err)?;
        }
        draw_lines(&mut chart, series, SeriesLabelPosition::UpperRight, false)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
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
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..quantile_x(0.9999), 0.0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc(label(y_desc, 60))
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
        draw_lines(&mut chart, &stretched, SeriesLabelPosition::UpperLeft, true)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
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
