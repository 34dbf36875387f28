//! bench-e2e's charts, drawn from its JSON rows: per guest shape and page backing, the hot
//! memory's share in DRAM and the DRAM used over the window, one line per manager, with the
//! shape's events (hot-set shift, scan) as dashed markers. `bench-e2e` draws them beside its
//! JSON; `tbcheck bench-e2e-plot` draws them again from a JSON file (as PNG for docs/img).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vmtier_plot::{Arrange, Axis, Figure, Format, Labels, Panel, Rgb, Series};

use super::Shape;
use crate::check::Checks;

#[derive(clap::Args, Debug)]
pub struct PlotArgs {
    /// A JSON file written by `tbcheck bench-e2e --out`.
    #[arg(long, default_value = "target/bench/e2e.json")]
    pub json: PathBuf,
    /// Where the charts go, as `e2e-{shape}-{pages}.{svg|png}` (default: beside the JSON).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// `svg` or `png`.
    #[arg(long, default_value = "svg")]
    pub format: String,
}

/// Each manager's line colour: its model's in the simulator's report.
fn color(manager: &str) -> Rgb {
    let row = match manager {
        "numa-balancing" => "numab",
        m => m,
    };
    vmtier_sim::report::row_color(row, 0)
}

fn text<'a>(r: &'a Value, k: &str) -> &'a str {
    r[k].as_str().unwrap_or("")
}

/// The `(shape, pages)` pairs of `rows`, in their first appearance's order.
fn groups(rows: &[Value]) -> Vec<(String, String)> {
    let mut g: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (text(r, "shape").to_owned(), text(r, "pages").to_owned());
        if !k.0.is_empty() && !g.contains(&k) {
            g.push(k);
        }
    }
    g
}

/// A row's `(seconds, value)` points from its `t_s` and the series `key`, scaled by `scale`;
/// samples missing on either side are skipped.
fn points(r: &Value, key: &str, scale: f64) -> Vec<(f64, f64)> {
    let (Some(t), Some(v)) = (r["t_s"].as_array(), r[key].as_array()) else {
        return Vec::new();
    };
    t.iter()
        .zip(v)
        .filter_map(|(t, v)| Some((t.as_f64()?, v.as_f64()? * scale)))
        .collect()
}

/// The legend entry of a row: manager, time to 90 %, pages migrated, back and forth.
fn legend(r: &Value) -> String {
    let mut s = text(r, "manager").to_owned();
    let t90 = r["seconds_to_90pct_hot_in_dram"]
        .as_f64()
        .map_or("never".to_owned(), |t| format!("{t} s"));
    let _ = write!(
        s,
        " (90 %: {t90}; {} pages moved, {} back and forth)",
        r["pages_migrated"].as_u64().unwrap_or(0),
        r["pages_pingponged"].as_u64().unwrap_or(0)
    );
    if let Some(t) = r["seconds_to_90pct_after_shift"].as_f64() {
        let _ = write!(s, ", after the shift {t} s");
    }
    s
}

/// The chart of the rows of `shape`/`pages`: hot memory in DRAM (%) above, DRAM used below.
/// `None` when no row has that shape and backing.
pub fn figure(rows: &[Value], shape: &str, pages: &str) -> Option<Figure> {
    let mine: Vec<&Value> = rows
        .iter()
        .filter(|r| text(r, "shape") == shape && text(r, "pages") == pages)
        .collect();
    let first = mine.first()?;
    let window = mine
        .iter()
        .filter_map(|r| r["window_s"].as_f64())
        .fold(1.0, f64::max);
    let x = || Axis {
        label: "time since the manager started".into(),
        min: 0.0,
        max: window.ceil(),
        labels: Labels::Seconds,
    };
    let events: Vec<f64> = Shape::parse(shape).map_or(Vec::new(), |s| {
        #[allow(clippy::cast_precision_loss)]
        s.events().iter().map(|e| e.at_s as f64).collect()
    });
    let mut hot = Panel::new(
        "hot memory in DRAM (measured from outside with move_pages)",
        x(),
        Axis {
            label: "hot memory in DRAM, %".into(),
            min: 0.0,
            max: 100.0,
            labels: Labels::Number,
        },
    );
    hot.grid = true;
    hot.vlines.clone_from(&events);
    hot.hlines.push((90.0, "90 %".into()));
    let budget = first["budget_bytes"].as_u64().unwrap_or(0);
    #[allow(clippy::cast_precision_loss)]
    let top = mine
        .iter()
        .flat_map(|r| {
            [
                r["max_dram_bytes"].as_f64().unwrap_or(0.0),
                r["dram_reach_bytes"].as_f64().unwrap_or(0.0),
            ]
        })
        .fold(budget as f64, f64::max);
    let mut dram = Panel::new(
        "DRAM used by the guest",
        x(),
        Axis {
            label: "guest memory on node 0".into(),
            min: 0.0,
            max: top * 1.15,
            labels: Labels::Bytes,
        },
    );
    dram.grid = true;
    dram.vlines = events;
    #[allow(clippy::cast_precision_loss)]
    dram.hlines.push((
        budget as f64,
        format!("budget {}", vmtier_plot::bytes(budget as f64)),
    ));
    for r in &mine {
        let m = text(r, "manager");
        let width = if m == "vmtierd" { 3 } else { 2 };
        hot.series.push(Series {
            name: legend(r),
            color: color(m),
            width,
            points: points(r, "hot_fraction_in_dram", 100.0),
        });
        dram.series.push(Series {
            name: m.to_owned(),
            color: color(m),
            width,
            points: points(r, "dram_bytes", 1.0),
        });
    }
    let clock = if mine.iter().any(|r| r["emulated"].as_bool() == Some(true)) {
        "TCG-emulated clock"
    } else {
        "clock of the host it ran on"
    };
    Some(Figure {
        title: format!(
            "{shape} shape, {pages} pages: {}, budget {} ({clock})",
            first["guest_ram_bytes"]
                .as_f64()
                .map_or("guest".to_owned(), |b| format!(
                    "{} guest",
                    vmtier_plot::bytes(b)
                )),
            vmtier_plot::bytes(budget as f64)
        ),
        width: 1000,
        height: 760,
        panels: vec![hot, dram],
        arrange: Arrange::Rows,
    })
}

/// Draws every shape/backing of `rows` into `dir` as `e2e-{shape}-{pages}.{ext}`; the files
/// written.
pub fn draw_all(rows: &[Value], dir: &Path, format: Format) -> Result<Vec<PathBuf>, String> {
    let ext = match format {
        Format::Svg => "svg",
        Format::Png => "png",
    };
    let mut out = Vec::new();
    for (shape, pages) in groups(rows) {
        let Some(fig) = figure(rows, &shape, &pages) else {
            continue;
        };
        // The names come from the file: only letters, digits and '-' reach the path.
        let slug = vmtier_sim::report::slug;
        let path = dir.join(format!("e2e-{}-{}.{ext}", slug(&shape), slug(&pages)));
        vmtier_plot::write(&fig, &path).map_err(|e| vmtier_core::error_chain(&e))?;
        out.push(path);
    }
    Ok(out)
}

/// `tbcheck bench-e2e-plot`.
pub fn run(c: &mut Checks, a: &PlotArgs) {
    let format = match a.format.as_str() {
        "svg" => Format::Svg,
        "png" => Format::Png,
        f => return c.fatal("arguments", format!("--format: svg or png, not {f:?}")),
    };
    let rows: Vec<Value> = match std::fs::read_to_string(&a.json)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => return c.fatal("read the JSON", format!("{}: {e}", a.json.display())),
    };
    let dir = a
        .out_dir
        .clone()
        .or_else(|| a.json.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    check_drawn(c, &rows, &dir, format);
}

/// [`draw_all`] as a check that names the files written.
pub fn check_drawn(c: &mut Checks, rows: &[Value], dir: &Path, format: Format) {
    let drawn = draw_all(rows, dir, format);
    c.check(
        drawn.as_ref().is_ok_and(|v| !v.is_empty()),
        "draw the charts",
        match &drawn {
            Ok(v) => v
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Err(e) => e.clone(),
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn row(shape: &str, pages: &str, manager: &str, hot: &[f64]) -> Value {
        json!({
            "shape": shape, "pages": pages, "manager": manager, "emulated": true,
            "budget_bytes": 64u64 << 20, "dram_reach_bytes": 70u64 << 20,
            "max_dram_bytes": 40u64 << 20, "guest_ram_bytes": 256u64 << 20,
            "window_s": 35.1, "t_s": (1..=hot.len()).map(|i| i as f64).collect::<Vec<_>>(),
            "hot_fraction_in_dram": hot, "dram_bytes": hot.iter().map(|h| (h * 33.0 * 1048576.0) as u64).collect::<Vec<_>>(),
            "seconds_to_90pct_hot_in_dram": if hot.iter().any(|&h| h >= 0.9) { json!(3.0) } else { Value::Null },
            "pages_migrated": 9728, "pages_pingponged": 0,
        })
    }

    #[test]
    fn one_chart_per_shape_and_backing_with_a_line_per_manager() {
        let rows = vec![
            row("static", "thp", "vmtierd", &[0.0, 0.5, 1.0, 1.0]),
            row("static", "thp", "numa-balancing", &[0.0, 0.2, 0.4]),
            row("mixed", "4k", "vmtierd", &[0.0, 1.0]),
            json!({"shape": "static", "pages": "thp", "manager": "damos", "t_s": "broken"}),
        ];
        assert_eq!(
            groups(&rows),
            [
                ("static".into(), "thp".into()),
                ("mixed".into(), "4k".into())
            ]
        );
        let f = figure(&rows, "static", "thp").expect("a chart");
        assert_eq!(f.panels.len(), 2);
        // Three managers, the malformed row drawn as an empty line rather than dropped.
        assert_eq!(f.panels[0].series.len(), 3);
        assert_eq!(
            f.panels[0].series[0].points,
            [(1.0, 0.0), (2.0, 50.0), (3.0, 100.0), (4.0, 100.0)]
        );
        assert!(f.panels[0].series[2].points.is_empty());
        // Each manager in its model's colour from the simulator's charts.
        assert_eq!(
            f.panels[0].series[1].color,
            vmtier_sim::report::row_color("numab", 0)
        );
        assert_ne!(f.panels[0].series[0].color, f.panels[0].series[1].color);
        assert!(f.panels[0].series[0].name.contains("90 %: 3 s; 9728 pages"));
        assert!(f.panels[0].series[1].name.contains("90 %: never"));
        assert_eq!(f.panels[0].x.max, 36.0);
        assert!(f.panels[0].vlines.is_empty());
        assert_eq!(f.panels[1].hlines, [(67_108_864.0, "budget 64 MiB".into())]);
        assert!(f.panels[1].y.max >= 70.0 * 1048576.0);
        assert!(f.title.contains("TCG-emulated clock"));
        // The mixed shape marks its shift and scan.
        let m = figure(&rows, "mixed", "4k").expect("a chart");
        assert_eq!(m.panels[0].vlines, [25.0, 42.0]);
        assert!(figure(&rows, "mixed", "thp").is_none());
    }

    #[test]
    fn charts_are_written_per_group_and_bad_input_is_refused() {
        let dir = std::env::temp_dir().join(format!("vmtier-e2e-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let rows = vec![
            row("static", "thp", "vmtierd", &[0.0, 1.0]),
            row("static", "4k", "vmtierd", &[0.0, 1.0]),
        ];
        let wrote = draw_all(&rows, &dir, Format::Svg).expect("drawn");
        assert_eq!(
            wrote,
            [
                dir.join("e2e-static-thp.svg"),
                dir.join("e2e-static-4k.svg")
            ]
        );
        let odd = [row("../x", "thp", "vmtierd", &[0.0, 1.0])];
        assert_eq!(
            draw_all(&odd, &dir, Format::Svg).expect("drawn"),
            [dir.join("e2e-___x-thp.svg")]
        );
        let svg = std::fs::read_to_string(&wrote[0]).expect("read");
        assert!(svg.starts_with("<svg") && svg.contains("polyline"));
        // A missing file and an unknown format each fail, and draw nothing.
        for (json, format) in [("missing.json", "svg"), ("missing.json", "gif")] {
            let mut c = Checks::default();
            run(
                &mut c,
                &PlotArgs {
                    json: dir.join(json),
                    out_dir: None,
                    format: format.into(),
                },
            );
            assert!(c.failed() > 0, "{json} {format}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
