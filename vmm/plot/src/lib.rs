//! vmtier's plots: a [`Figure`] of [`Panel`]s (filled cells for heatmaps, lines for time
//! series, dashed markers, labelled boundaries, a colour scale) drawn with `plotters` as SVG
//! or PNG. vmtierctl draws the daemon's heatmaps with it and vmtier-sim its policy report;
//! neither knows plotters.
//!
//! Text needs a font: plotters' `ab_glyph` feature with the TrueType file of Debian's
//! `fonts-dejavu-core` ([`DEFAULT_FONT`], or the file named by `VMTIER_PLOT_FONT`), read once
//! at the first render. SVG output names the family `sans-serif` in its `<text>` elements
//! (the viewer draws them); the font is used there for laying out labels, and in PNG output
//! for the glyphs themselves.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

/// The font read when `VMTIER_PLOT_FONT` is not set (Debian: `fonts-dejavu-core`).
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Environment variable naming another TrueType/OpenType font file.
pub const FONT_ENV: &str = "VMTIER_PLOT_FONT";
/// The family every text of a figure is drawn in.
const FAMILY: &str = "sans-serif";
/// Largest figure side, pixels (a PNG buffer stays below 3 × 8192² bytes).
pub const MAX_SIDE: u32 = 8192;

/// Why a figure could not be drawn or written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file name does not say SVG or PNG.
    #[error("Cannot tell the image format of {0}: give a file name ending in .svg or .png")]
    Format(PathBuf),
    /// The font file could not be read.
    #[error("Cannot read the font {0} (install fonts-dejavu-core, or name a font file in VMTIER_PLOT_FONT)")]
    Font(PathBuf, #[source] std::io::Error),
    /// The font file is not a font.
    #[error("{0} is not a TrueType or OpenType font")]
    FontData(PathBuf),
    /// A side of the figure is 0 or larger than [`MAX_SIDE`].
    #[error("Figure size {0}x{1} pixels is out of range: 1 to {MAX_SIDE} per side")]
    Size(u32, u32),
    /// plotters refused to draw.
    #[error("Drawing failed: {0}")]
    Draw(String),
    /// The PNG encoder failed.
    #[error("Cannot encode the PNG")]
    Png(#[source] png::EncodingError),
    /// Writing the file failed.
    #[error("Cannot write {0}")]
    Write(PathBuf, #[source] std::io::Error),
}

fn draw_err<E: std::fmt::Display>(e: E) -> Error {
    Error::Draw(e.to_string())
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// SVG text.
    Svg,
    /// PNG, 8-bit RGB.
    Png,
}

impl Format {
    /// The format a file name asks for (`.svg` or `.png`, any case).
    pub fn from_path(path: &Path) -> Result<Self, Error> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("svg") => Ok(Self::Svg),
            Some("png") => Ok(Self::Png),
            _ => Err(Error::Format(path.to_owned())),
        }
    }
}

/// An RGB colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    fn plotters(self) -> RGBColor {
        RGBColor(self.0, self.1, self.2)
    }

    /// `#rrggbb`, as plotters writes it into SVG.
    pub fn hex(self) -> String {
        format!("#{:02X}{:02X}{:02X}", self.0, self.1, self.2)
    }
}

/// How an axis labels its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Labels {
    /// The number itself (at most two decimals).
    Number,
    /// A byte count or address in binary units: `512 MiB`, `1.5 GiB`.
    Bytes,
    /// Seconds: `30 s`, `-1.5 s`.
    Seconds,
}

impl Labels {
    /// The label of `v`.
    pub fn format(self, v: f64) -> String {
        match self {
            Labels::Number => trim(format!("{v:.2}")),
            Labels::Seconds => format!("{} s", trim(format!("{v:.1}"))),
            Labels::Bytes => bytes(v),
        }
    }
}

/// Drops a fraction of zeros: `1.50` → `1.5`, `2.0` → `2`.
fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Bytes with a binary unit and at most one decimal.
pub fn bytes(v: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut x = v;
    let mut u = 0;
    while x.abs() >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    format!("{} {}", trim(format!("{x:.1}")), UNITS[u])
}

/// An axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// What it shows, with its unit.
    pub label: String,
    /// Smallest value shown.
    pub min: f64,
    /// Largest value shown (larger than `min`; an empty range is widened by 1).
    pub max: f64,
    /// How values are labelled.
    pub labels: Labels,
}

/// A filled rectangle in data coordinates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    /// Left edge.
    pub x0: f64,
    /// Right edge.
    pub x1: f64,
    /// Lower edge.
    pub y0: f64,
    /// Upper edge.
    pub y1: f64,
    /// Fill.
    pub color: Rgb,
}

/// A line through points, with a legend entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Colour.
    pub color: Rgb,
    /// Stroke width, pixels.
    pub width: u32,
    /// Points in data coordinates.
    pub points: Vec<(f64, f64)>,
}

/// A colour scale: maps a value in `0.0..=1.0` to a colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colormap {
    /// Heat: dark blue (cold) through purple and orange to yellow (hot).
    Heat,
    /// Tier: pale blue-grey (all in CXL) to red (all in DRAM).
    Dram,
}

impl Colormap {
    /// The colour of `v` (clamped to `0.0..=1.0`; NaN is 0).
    pub fn color(self, v: f64) -> Rgb {
        const HEAT: [(f64, [f64; 3]); 4] = [
            (0.0, [24.0, 24.0, 56.0]),
            (0.35, [128.0, 40.0, 128.0]),
            (0.7, [232.0, 104.0, 32.0]),
            (1.0, [255.0, 236.0, 96.0]),
        ];
        const DRAM: [(f64, [f64; 3]); 2] =
            [(0.0, [214.0, 222.0, 236.0]), (1.0, [200.0, 24.0, 24.0])];
        let stops: &[(f64, [f64; 3])] = match self {
            Colormap::Heat => &HEAT,
            Colormap::Dram => &DRAM,
        };
        let v = if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) };
        let i = stops
            .windows(2)
            .position(|w| v <= w[1].0)
            .unwrap_or(stops.len() - 2);
        let ((a, ca), (b, cb)) = (stops[i], stops[i + 1]);
        let t = if b > a { (v - a) / (b - a) } else { 0.0 };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let mix = |k: usize| (ca[k] + (cb[k] - ca[k]) * t).round().clamp(0.0, 255.0) as u8;
        Rgb(mix(0), mix(1), mix(2))
    }
}

/// A colour scale shown beside a panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    /// What the colour means, with its unit.
    pub label: String,
    /// The value at the bottom of the scale (colour of 0.0).
    pub min: f64,
    /// The value at the top (colour of 1.0).
    pub max: f64,
    /// The colours.
    pub map: Colormap,
}

/// One chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// Caption above the chart.
    pub caption: String,
    /// Horizontal axis.
    pub x: Axis,
    /// Vertical axis (values grow upwards).
    pub y: Axis,
    /// Filled cells (a heatmap).
    pub cells: Vec<Cell>,
    /// Lines (a time series), with a legend when there are any.
    pub series: Vec<Series>,
    /// Dashed vertical markers at these x values.
    pub vlines: Vec<f64>,
    /// Labelled horizontal boundaries (such as the start of a RAM range).
    pub hlines: Vec<(f64, String)>,
    /// A colour scale beside the chart.
    pub scale: Option<Scale>,
    /// Light grid lines behind the data.
    pub grid: bool,
}

impl Panel {
    /// An empty panel with these axes.
    pub fn new(caption: impl Into<String>, x: Axis, y: Axis) -> Self {
        Self {
            caption: caption.into(),
            x,
            y,
            cells: Vec::new(),
            series: Vec::new(),
            vlines: Vec::new(),
            hlines: Vec::new(),
            scale: None,
            grid: false,
        }
    }
}

/// How a figure's panels are arranged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrange {
    /// One above the other.
    Rows,
    /// Side by side.
    Columns,
}

/// A titled figure of panels.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// Title above everything.
    pub title: String,
    /// Width, pixels.
    pub width: u32,
    /// Height, pixels.
    pub height: u32,
    /// The panels.
    pub panels: Vec<Panel>,
    /// How they are arranged.
    pub arrange: Arrange,
}

/// Registers the font once per process; later calls return the first call's outcome.
fn font() -> Result<(), Error> {
    static FONT: OnceLock<Result<(), (PathBuf, String, bool)>> = OnceLock::new();
    let r = FONT.get_or_init(|| {
        let path =
            std::env::var_os(FONT_ENV).map_or_else(|| PathBuf::from(DEFAULT_FONT), PathBuf::from);
        let data = std::fs::read(&path).map_err(|e| (path.clone(), e.to_string(), true))?;
        // plotters keeps fonts for the life of the process; this happens once.
        let data: &'static [u8] = Box::leak(data.into_boxed_slice());
        plotters::style::register_font(FAMILY, FontStyle::Normal, data)
            .map_err(|_| (path, String::new(), false))
    });
    match r {
        Ok(()) => Ok(()),
        Err((p, why, true)) => Err(Error::Font(p.clone(), std::io::Error::other(why.clone()))),
        Err((p, _, false)) => Err(Error::FontData(p.clone())),
    }
}

/// Draws `fig` as SVG text or PNG bytes.
pub fn render(fig: &Figure, format: Format) -> Result<Vec<u8>, Error> {
    if !(1..=MAX_SIDE).contains(&fig.width) || !(1..=MAX_SIDE).contains(&fig.height) {
        return Err(Error::Size(fig.width, fig.height));
    }
    font()?;
    let size = (fig.width, fig.height);
    match format {
        Format::Svg => {
            let mut s = String::new();
            {
                let root = SVGBackend::with_string(&mut s, size).into_drawing_area();
                draw(&root, fig)?;
                root.present().map_err(draw_err)?;
            }
            // plotters spells out two defaults on every element; a heatmap has thousands.
            Ok(s.replace(" opacity=\"1\"", "")
                .replace(" stroke=\"none\"", "")
                .into_bytes())
        }
        Format::Png => {
            // Both sides are at most MAX_SIDE, so this fits in usize.
            let n = fig.width as usize * fig.height as usize * 3;
            let mut buf = vec![0u8; n];
            {
                let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
                draw(&root, fig)?;
                root.present().map_err(draw_err)?;
            }
            let mut out = Vec::new();
            {
                let mut enc = png::Encoder::new(&mut out, fig.width, fig.height);
                enc.set_color(png::ColorType::Rgb);
                enc.set_depth(png::BitDepth::Eight);
                let mut w = enc.write_header().map_err(Error::Png)?;
                w.write_image_data(&buf).map_err(Error::Png)?;
                w.finish().map_err(Error::Png)?;
            }
            Ok(out)
        }
    }
}

/// Draws `fig` into `path` in the format its name asks for (see [`Format::from_path`]).
pub fn write(fig: &Figure, path: &Path) -> Result<Format, Error> {
    let format = Format::from_path(path)?;
    let bytes = render(fig, format)?;
    std::fs::write(path, bytes).map_err(|e| Error::Write(path.to_owned(), e))?;
    Ok(format)
}

/// The unit an axis is drawn in: for bytes the largest binary unit at most half its span
/// (so that plotters picks round numbers of MiB or GiB), else 1.
fn unit(a: &Axis) -> f64 {
    let mut u = 1.0;
    if a.labels == Labels::Bytes {
        let half = (a.max - a.min) / 2.0;
        while u * 1024.0 <= half && u < 1024f64.powi(5) {
            u *= 1024.0;
        }
    }
    u
}

/// The axis' range in its unit.
fn range(a: &Axis) -> std::ops::Range<f64> {
    let u = unit(a);
    if a.max > a.min {
        a.min / u..a.max / u
    } else {
        a.min / u..a.min / u + 1.0
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), Error> {
    root.fill(&WHITE).map_err(draw_err)?;
    let body = root
        .titled(&fig.title, (FAMILY, 18).into_font())
        .map_err(draw_err)?;
    let n = fig.panels.len().max(1);
    let areas = match fig.arrange {
        Arrange::Rows => body.split_evenly((n, 1)),
        Arrange::Columns => body.split_evenly((1, n)),
    };
    for (area, p) in areas.iter().zip(&fig.panels) {
        draw_panel(area, p)?;
    }
    Ok(())
}

/// Width of a colour scale beside a panel, pixels.
const SCALE_W: u32 = 90;

fn draw_panel<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, p: &Panel) -> Result<(), Error> {
    let (w, _) = area.dim_in_pixel();
    let (chart_area, scale_area) = match &p.scale {
        Some(_) if w > 2 * SCALE_W => {
            let (a, b) = area.split_horizontally(w - SCALE_W);
            (a, Some(b))
        }
        _ => (area.clone(), None),
    };
    let (xr, yr) = (range(&p.x), range(&p.y));
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(&p.caption, (FAMILY, 14).into_font())
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(72)
        .build_cartesian_2d(xr.clone(), yr.clone())
        .map_err(draw_err)?;
    let (ux, uy) = (unit(&p.x), unit(&p.y));
    let xf = |v: &f64| p.x.labels.format(*v * ux);
    let yf = |v: &f64| p.y.labels.format(*v * uy);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(&p.x.label)
        .y_desc(&p.y.label)
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .label_style((FAMILY, 12).into_font())
        .axis_desc_style((FAMILY, 12).into_font());
    if !p.grid {
        mesh.disable_mesh();
    }
    mesh.draw().map_err(draw_err)?;
    chart
        .draw_series(p.cells.iter().map(|c| {
            Rectangle::new(
                [(c.x0 / ux, c.y0 / uy), (c.x1 / ux, c.y1 / uy)],
                c.color.plotters().filled(),
            )
        }))
        .map_err(draw_err)?;
    for &x in &p.vlines {
        let x = x / ux;
        chart
            .draw_series(std::iter::once(DashedPathElement::new(
                vec![(x, yr.start), (x, yr.end)],
                4,
                3,
                RGBColor(150, 150, 150).stroke_width(1),
            )))
            .map_err(draw_err)?;
    }
    for (y, text) in &p.hlines {
        let y = &(*y / uy);
        let style = RGBColor(20, 20, 20).stroke_width(1);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(xr.start, *y), (xr.end, *y)],
                style,
            )))
            .map_err(draw_err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                text.clone(),
                (xr.start, *y),
                (FAMILY, 11)
                    .into_font()
                    .color(&RGBColor(20, 20, 20))
                    .pos(Pos::new(HPos::Left, VPos::Bottom)),
            )))
            .map_err(draw_err)?;
    }
    for s in &p.series {
        let color = s.color.plotters();
        let width = s.width;
        chart
            .draw_series(LineSeries::new(
                s.points.iter().map(|&(x, y)| (x / ux, y / uy)),
                color.stroke_width(width),
            ))
            .map_err(draw_err)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(width.max(2)))
            });
    }
    if !p.series.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(120, 120, 120))
            .label_font((FAMILY, 12).into_font())
            .draw()
            .map_err(draw_err)?;
    }
    if let (Some(s), Some(a)) = (&p.scale, scale_area) {
        draw_scale(&a, s)?;
    }
    Ok(())
}

/// Steps of a drawn colour scale.
const SCALE_STEPS: u32 = 32;

fn draw_scale<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, s: &Scale) -> Result<(), Error> {
    let mut chart = ChartBuilder::on(area)
        .margin_top(30)
        .margin_bottom(44)
        .margin_right(4)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..1.0, 0.0..1.0)
        .map_err(draw_err)?;
    let (lo, hi) = (s.min, s.max);
    let yf = |v: &f64| trim(format!("{:.2}", lo + (hi - lo) * *v));
    chart
        .configure_mesh()
        .disable_mesh()
        .disable_x_axis()
        .y_labels(5)
        .y_label_formatter(&yf)
        .y_desc(&s.label)
        .label_style((FAMILY, 11).into_font())
        .axis_desc_style((FAMILY, 11).into_font())
        .draw()
        .map_err(draw_err)?;
    let step = 1.0 / f64::from(SCALE_STEPS);
    chart
        .draw_series((0..SCALE_STEPS).map(|i| {
            let v = f64::from(i) * step;
            Rectangle::new(
                [(0.0, v), (1.0, v + step)],
                s.map.color(v + step / 2.0).plotters().filled(),
            )
        }))
        .map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(label: &str, max: f64, labels: Labels) -> Axis {
        Axis {
            label: label.into(),
            min: 0.0,
            max,
            labels,
        }
    }

    /// A `cols` × `rows` heatmap whose cell (c, r) has colour `colors[(c + r) % len]`.
    fn matrix(cols: usize, rows: usize, colors: &[Rgb]) -> Figure {
        let mut p = Panel::new(
            "cells",
            axis("time", cols as f64, Labels::Seconds),
            axis("address", rows as f64 * 1048576.0, Labels::Bytes),
        );
        for c in 0..cols {
            for r in 0..rows {
                p.cells.push(Cell {
                    x0: c as f64,
                    x1: c as f64 + 1.0,
                    y0: r as f64 * 1048576.0,
                    y1: (r + 1) as f64 * 1048576.0,
                    color: colors[(c + r) % colors.len()],
                });
            }
        }
        Figure {
            title: "test".into(),
            width: 640,
            height: 400,
            panels: vec![p],
            arrange: Arrange::Rows,
        }
    }

    fn has_font() -> bool {
        std::env::var_os(FONT_ENV).is_some() || Path::new(DEFAULT_FONT).exists()
    }

    #[test]
    fn an_svg_of_a_known_matrix_has_one_rect_per_cell_in_its_colours() {
        if !has_font() {
            eprintln!("skipped: no font at {DEFAULT_FONT} (fonts-dejavu-core)");
            return;
        }
        // (cols, rows, colours)
        let cases: [(usize, usize, &[Rgb]); 3] = [
            (1, 1, &[Rgb(1, 2, 3)]),
            (12, 8, &[Rgb(250, 0, 0), Rgb(0, 250, 0)]),
            (30, 16, &[Rgb(10, 20, 30), Rgb(40, 50, 60), Rgb(70, 80, 90)]),
        ];
        for (cols, rows, colors) in cases {
            let svg = String::from_utf8(render(&matrix(cols, rows, colors), Format::Svg).unwrap())
                .unwrap();
            assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
            let mut total = 0;
            for c in colors {
                let n = svg.matches(&format!("fill=\"{}\"", c.hex())).count();
                let want = (0..cols)
                    .flat_map(|x| (0..rows).map(move |y| x + y))
                    .filter(|i| colors[i % colors.len()] == *c)
                    .count();
                assert_eq!(n, want, "{cols}x{rows} {c:?}");
                total += n;
            }
            assert_eq!(total, cols * rows);
            assert!(svg.contains("\ntime\n</text>") && svg.contains("\naddress\n</text>"));
        }
    }

    #[test]
    fn a_png_decodes_with_the_figure_s_size_and_shows_the_cells() {
        if !has_font() {
            eprintln!("skipped: no font at {DEFAULT_FONT} (fonts-dejavu-core)");
            return;
        }
        for (w, h) in [(320u32, 200u32), (900, 500)] {
            let mut fig = matrix(4, 4, &[Rgb(250, 0, 0)]);
            fig.width = w;
            fig.height = h;
            let png = render(&fig, Format::Png).unwrap();
            let dec = png::Decoder::new(std::io::Cursor::new(png));
            let mut r = dec.read_info().unwrap();
            let mut buf = vec![0; r.output_buffer_size().unwrap()];
            let info = r.next_frame(&mut buf).unwrap();
            assert_eq!((info.width, info.height), (w, h));
            let red = buf[..info.buffer_size()]
                .chunks(3)
                .filter(|p| p == &[250, 0, 0])
                .count();
            // The cells fill most of the plotting area.
            assert!(
                red as u64 > u64::from(w * h / 5),
                "{w}x{h}: {red} red pixels"
            );
        }
    }

    #[test]
    fn lines_markers_boundaries_and_scale_are_drawn() {
        if !has_font() {
            return;
        }
        let mut p = Panel::new(
            "hit ratio",
            axis("tick", 10.0, Labels::Number),
            axis("ratio", 1.0, Labels::Number),
        );
        p.series.push(Series {
            name: "alpha".into(),
            color: Rgb(0, 0, 200),
            width: 2,
            points: (0..10)
                .map(|i| (f64::from(i), f64::from(i) / 10.0))
                .collect(),
        });
        p.vlines.push(5.0);
        p.hlines.push((0.5, "boundary".into()));
        p.scale = Some(Scale {
            label: "heat".into(),
            min: 0.0,
            max: 31.0,
            map: Colormap::Heat,
        });
        p.grid = true;
        let fig = Figure {
            title: "lines".into(),
            width: 700,
            height: 400,
            panels: vec![p.clone(), p],
            arrange: Arrange::Columns,
        };
        let svg = String::from_utf8(render(&fig, Format::Svg).unwrap()).unwrap();
        assert_eq!(svg.matches("\nalpha\n</text>").count(), 2);
        assert_eq!(svg.matches("\nboundary\n</text>").count(), 2);
        assert!(svg.contains("<polyline") && svg.contains("#0000C8"));
        // 32 scale steps per panel, first and last colour of the map.
        let top = Colormap::Heat.color((31.5) / 32.0).hex();
        assert_eq!(svg.matches(&format!("fill=\"{top}\"")).count(), 2);
    }

    #[test]
    fn formats_sizes_labels_and_colours() {
        let cases = [
            ("a.svg", Some(Format::Svg)),
            ("b.PNG", Some(Format::Png)),
            ("c.jpg", None),
            ("noext", None),
        ];
        for (p, want) in cases {
            assert_eq!(Format::from_path(Path::new(p)).ok(), want, "{p}");
        }
        let e = Format::from_path(Path::new("x.gif"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(".svg or .png"), "{e}");
        let labels = [
            (Labels::Bytes, 0.0, "0 B"),
            (Labels::Bytes, 1536.0, "1.5 KiB"),
            (Labels::Bytes, 268435456.0, "256 MiB"),
            (Labels::Bytes, 5.0 * 1073741824.0, "5 GiB"),
            (Labels::Seconds, 30.0, "30 s"),
            (Labels::Seconds, -1.25, "-1.2 s"),
            (Labels::Number, 0.25, "0.25"),
            (Labels::Number, 3.0, "3"),
        ];
        for (l, v, want) in labels {
            assert_eq!(l.format(v), want, "{l:?} {v}");
        }
        let colours = [
            (Colormap::Heat, 0.0, Rgb(24, 24, 56)),
            (Colormap::Heat, 1.0, Rgb(255, 236, 96)),
            (Colormap::Heat, 7.0, Rgb(255, 236, 96)),
            (Colormap::Heat, f64::NAN, Rgb(24, 24, 56)),
            (Colormap::Dram, 0.0, Rgb(214, 222, 236)),
            (Colormap::Dram, 1.0, Rgb(200, 24, 24)),
            (Colormap::Dram, 0.5, Rgb(207, 123, 130)),
        ];
        for (m, v, want) in colours {
            assert_eq!(m.color(v), want, "{m:?} {v}");
        }
        let mut fig = matrix(1, 1, &[Rgb(0, 0, 0)]);
        fig.width = 0;
        assert!(matches!(
            render(&fig, Format::Svg),
            Err(Error::Size(0, 400))
        ));
    }
}
