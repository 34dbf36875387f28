//! The policy report: every trace × every policy (plus the oracle), a table on stdout,
//! `policies.json`, and plots as SVG or PNG (hit ratio over time per policy; placement
//! heatmaps: [`plots`]).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use vmtier_plot::{Arrange, Axis, Cell, Figure, Format, Labels, Panel, Rgb, Series};

use crate::sim::{self, Config, Planner, RunResult};
use crate::trace::{self, Trace};

/// Errors producing the report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A simulation failed.
    #[error("Simulation of {0} failed")]
    Sim(String, #[source] Box<sim::Error>),
    /// Writing an output failed (nothing half-written is left).
    #[error("Failed to write {0}")]
    Write(PathBuf, #[source] std::io::Error),
    /// Serializing the JSON failed.
    #[error("Failed to encode the report")]
    Json(#[source] serde_json::Error),
    /// Drawing a plot failed.
    #[error("Failed to draw a plot")]
    Plot(#[source] vmtier_plot::Error),
}

/// One policy on one trace.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Policy name.
    pub policy: String,
    /// Tracking source.
    pub source: String,
    /// DRAM hit ratio.
    pub hit_ratio: f64,
    /// Hit ratio over the oracle's.
    pub oracle_ratio: f64,
    /// Estimated run time over all-DRAM.
    pub est_slowdown: f64,
    /// Bytes migrated.
    pub bytes_migrated: u64,
    /// 4 KiB pages that ping-ponged.
    pub pingpong_pages: u64,
    /// Mean ticks to recover after a hot-set shift (none without markers).
    pub reaction_ticks: Option<f64>,
    /// Policy state per 4 KiB page.
    pub metadata_bytes_per_page: f64,
    /// Engine record bytes per 4 KiB page.
    pub store_bytes_per_page: f64,
    /// Mean planning time per tick.
    pub plan_ms_per_interval: f64,
    /// Engine-dropped plan entries.
    pub plan_violations: u64,
    /// DAMON's first context: mean regions checked per 5 ms sample.
    pub damon_regions_per_sample: f64,
    /// The zoom context (sim-only rows [`ZOOM`]): mean regions checked per sample.
    pub zoom_regions_per_sample: f64,
    /// The zoom context: mean bytes watched.
    pub zoom_bytes_mean: f64,
}

/// How vmtierd as shipped compares on one trace and budget.
#[derive(Clone, Debug, Serialize)]
pub struct Targets {
    /// vmtierd's hit ratio over the oracle's (target ≥ 0.95).
    pub default_oracle_ratio: f64,
    /// Whether that meets 0.95.
    pub meets_oracle_target: bool,
    /// The baseline with the best hit ratio.
    pub best_baseline: String,
    /// Its hit ratio.
    pub best_baseline_hit_ratio: f64,
    /// vmtierd's bytes migrated over the best baseline's (target ≤ 1 at equal hit ratio).
    pub bytes_vs_best_baseline: Option<f64>,
    /// Whether vmtierd's hit ratio is within 1 point of the best baseline's or above.
    pub equal_or_better_hit_ratio: bool,
    /// Both parts of the quality target met.
    pub meets_bytes_target: bool,
}

/// All results for one trace.
#[derive(Clone, Debug, Serialize)]
pub struct TraceReport {
    /// Trace name.
    pub trace: String,
    /// DRAM budget, permille of the footprint.
    pub budget_permille: u32,
    /// Accesses.
    pub accesses: u64,
    /// Address space in 4 KiB pages.
    pub pages: u64,
    /// DRAM budget in granules.
    pub budget_granules: u64,
    /// Move limit per tick.
    pub max_moves: u64,
    /// Ticks simulated.
    pub ticks: u64,
    /// Whether the ticks are the trace's recorded epochs (else `tick_accesses` each).
    pub epoch_ticks: bool,
    /// One row per policy, oracle first, then vmtierd as shipped, then each registry policy
    /// on its own observation.
    pub results: Vec<Row>,
    /// vmtierd's targets.
    pub targets: Targets,
}

/// The rows that model vmtierd as shipped: its default policy on what its sources really
/// see (DAMON with every aggregation window, or soft-dirty), through its store and
/// enforcement. Names and sources.
pub const SHIPPED: [(&str, sim::SourceName); 2] = [
    ("vmtierd", sim::SourceName::Damon),
    ("vmtierd-softdirty", sim::SourceName::SoftDirty),
];

/// Rows of vmtierd with other tracking granularity, on DAMON as the `vmtierd` row (whose
/// granule is the config's, 4 KiB by default): name, `granule_pages_log2`, `detail_percent`.
/// `vmtierd-hybrid` is hybrid 2 MiB / 4 KiB tracking ([`HYBRID_DETAIL_PERCENT`]), measured
/// against the `vmtierd` row's hit ratio (same budget and move limit in 4 KiB pages);
/// `vmtierd-2m` counts its budget in 2 MiB regions touched.
pub const GRANULARITY: [(&str, u8, u8); 2] = [
    ("vmtierd-2m", 9, 0),
    ("vmtierd-hybrid", 9, HYBRID_DETAIL_PERCENT),
];

/// `detail_percent` of the `vmtierd-hybrid` row: no cap. The traces are 0.4–64 MiB (1–32
/// regions), where a 20 % cap would allow a handful of split regions or none; the cap bounds
/// memory at scale (`vmtier-sim scale`: 8 % of a 1 TiB guest's regions mixed, all split under
/// a 20 % cap), so the row measures the granularity, not the cap.
pub const HYBRID_DETAIL_PERCENT: u8 = 100;

/// Experiment rows, **simulator only** (vmtierd has no zoom context): the `vmtierd` row plus
/// a second DAMON context over at most this many bytes of mixed 2 MiB chunks
/// ([`crate::zoom`], `Config::zoom_bytes`; the rest of the zoom settings from the config).
/// Name and bytes. They are not "vmtierd as shipped" and never count for its targets.
pub const ZOOM: [(&str, u64); 3] = [
    ("zoom4m-simonly", 4 << 20),
    ("zoom8m-simonly", 8 << 20),
    ("zoom16m-simonly", 16 << 20),
];

/// The `vmtierd-hybrid` row (2 MiB regions with 4 KiB detail, vmtierd's default granule) with
/// an 8 MiB zoom context, simulator only: name, bytes, `detail_percent`.
pub const ZOOM_HYBRID: (&str, u64, u8) = ("hyb-zoom8m-simonly", 8 << 20, HYBRID_DETAIL_PERCENT);

/// The report's rows in [`run_trace`]'s order (with `zoom`, the experiment rows too): the
/// names `--plot-policies` takes.
pub fn row_names(zoom: bool) -> Vec<&'static str> {
    let mut v = vec!["oracle", "hindsight"];
    v.extend(SHIPPED.iter().map(|s| s.0));
    v.extend(GRANULARITY.iter().map(|g| g.0));
    if zoom {
        v.extend(ZOOM.iter().map(|z| z.0));
        v.push(ZOOM_HYBRID.0);
    }
    v.extend(vmtier_policies::registry::REGISTRY.iter().map(|e| e.name));
    v
}

/// Runs every policy and the oracle on one trace; with `zoom`, the sim-only experiment rows
/// [`ZOOM`] and [`ZOOM_HYBRID`] too (`vmtier-sim report --zoom`).
pub fn run_trace(
    name: &str,
    t: &Trace,
    cfg: &Config,
    zoom: bool,
) -> Result<(TraceReport, Vec<RunResult>), Error> {
    let sim_err = |p: &str| {
        let label = format!("{p} on {name}");
        move |e| Error::Sim(label, Box::new(e))
    };
    let oracle = sim::run(t, &mut Planner::Oracle, cfg).map_err(sim_err("oracle"))?;
    let hindsight = sim::run(t, &mut Planner::Hindsight, cfg).map_err(sim_err("hindsight"))?;
    let mut runs = vec![oracle.clone(), hindsight];
    // The default policy under `c`, reported as `label`.
    let mut default_as = |label: &str, c: Config| -> Result<(), Error> {
        let mut p = Planner::by_name("default", &c).map_err(sim_err(label))?;
        let mut r = sim::run(t, &mut p, &c).map_err(sim_err(label))?;
        label.clone_into(&mut r.policy);
        runs.push(r);
        Ok(())
    };
    for (label, source) in SHIPPED {
        let c = Config {
            source: Some(source),
            ..cfg.clone()
        };
        default_as(label, c)?;
    }
    for (label, log2, detail) in GRANULARITY {
        let c = Config {
            source: Some(sim::SourceName::Damon),
            granule_pages_log2: log2,
            detail_percent: detail,
            ..cfg.clone()
        };
        default_as(label, c)?;
    }
    let experiments = ZOOM.iter().map(|&(l, b)| (l, b, 0)).chain([ZOOM_HYBRID]);
    for (label, bytes, detail) in experiments.filter(|_| zoom) {
        let c = Config {
            source: Some(sim::SourceName::Damon),
            zoom_bytes: bytes,
            granule_pages_log2: if detail > 0 {
                9
            } else {
                cfg.granule_pages_log2
            },
            detail_percent: detail,
            ..cfg.clone()
        };
        default_as(label, c)?;
    }
    for e in vmtier_policies::registry::REGISTRY {
        let mut p = Planner::by_name(e.name, cfg).map_err(sim_err(e.name))?;
        runs.push(sim::run(t, &mut p, cfg).map_err(sim_err(e.name))?);
    }
    let rows: Vec<Row> = runs
        .iter()
        .map(|r| Row {
            policy: r.policy.clone(),
            source: r.source.clone(),
            hit_ratio: r.hit_ratio,
            oracle_ratio: r.hit_ratio / oracle.hit_ratio.max(1e-12),
            est_slowdown: r.est_slowdown,
            bytes_migrated: r.bytes_migrated,
            pingpong_pages: r.pingpong_pages,
            reaction_ticks: sim::reaction_ticks(&r.series, &oracle.series, &r.marker_ticks),
            metadata_bytes_per_page: r.metadata_bytes_per_page,
            store_bytes_per_page: r.store_bytes_per_page,
            plan_ms_per_interval: r.plan_ms_per_interval,
            plan_violations: r.plan_violations,
            damon_regions_per_sample: r.damon_regions_per_sample,
            zoom_regions_per_sample: r.zoom_regions_per_sample,
            zoom_bytes_mean: r.zoom_bytes_mean,
        })
        .collect();
    let def = rows.iter().find(|r| r.policy == SHIPPED[0].0);
    let ours = |p: &str| {
        p == "default"
            || p == "oracle"
            || p == "hindsight"
            || SHIPPED.iter().any(|s| s.0 == p)
            || GRANULARITY.iter().any(|s| s.0 == p)
            || ZOOM.iter().any(|s| s.0 == p)
            || ZOOM_HYBRID.0 == p
    };
    let best = rows
        .iter()
        .filter(|r| !ours(&r.policy))
        .max_by(|a, b| a.hit_ratio.total_cmp(&b.hit_ratio));
    let targets = match (def, best) {
        (Some(d), Some(b)) => {
            let ratio =
                (b.bytes_migrated > 0).then(|| d.bytes_migrated as f64 / b.bytes_migrated as f64);
            let equal = d.hit_ratio + 0.01 >= b.hit_ratio;
            Targets {
                default_oracle_ratio: d.oracle_ratio,
                meets_oracle_target: d.oracle_ratio >= 0.95,
                best_baseline: b.policy.clone(),
                best_baseline_hit_ratio: b.hit_ratio,
                bytes_vs_best_baseline: ratio,
                equal_or_better_hit_ratio: equal,
                meets_bytes_target: equal && ratio.map_or(true, |x| x <= 1.0),
            }
        }
        _ => unreachable!("the registry always has default and baselines"),
    };
    Ok((
        TraceReport {
            trace: name.to_owned(),
            budget_permille: cfg.fast_permille,
            accesses: oracle.accesses,
            pages: u64::from(t.pages),
            budget_granules: oracle.budget_granules,
            max_moves: oracle.max_moves,
            ticks: oracle.ticks,
            epoch_ticks: cfg.epoch_ticks && t.has_epochs(),
            results: rows,
            targets,
        },
        runs,
    ))
}

/// Formats the human table for one trace.
pub fn table(r: &TraceReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "trace {} at {}% DRAM: {} accesses, {} pages, budget {} granules, ≤{} moves/tick, {} ticks{}",
        r.trace,
        r.budget_permille / 10,
        r.accesses,
        r.pages,
        r.budget_granules,
        r.max_moves,
        r.ticks,
        if r.epoch_ticks {
            " (one per recorded epoch)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "  {:<17} {:<11} {:>6} {:>7} {:>8} {:>11} {:>9} {:>8} {:>8} {:>9}",
        "policy",
        "source",
        "hit",
        "/oracle",
        "slowdown",
        "migrated",
        "pingpong",
        "react",
        "meta B/p",
        "plan ms"
    );
    for x in &r.results {
        let _ = writeln!(
            s,
            "  {:<17} {:<11} {:>6.3} {:>7.3} {:>8.3} {:>11} {:>9} {:>8} {:>8.3} {:>9.3}",
            x.policy,
            x.source,
            x.hit_ratio,
            x.oracle_ratio,
            x.est_slowdown,
            human_bytes(x.bytes_migrated),
            x.pingpong_pages,
            x.reaction_ticks.map_or("-".into(), |t| format!("{t:.1}")),
            x.metadata_bytes_per_page,
            x.plan_ms_per_interval
        );
    }
    let _ = writeln!(
        s,
        "  (oracle: offline and greedy — the next window's accesses, one interval of lookahead, \
         same budget and move limit; a reference, not an upper bound; hindsight: the same rule \
         on the window just past, seen exactly — what reacting alone can reach)"
    );
    let t = &r.targets;
    let _ = writeln!(
        s,
        "  vmtierd: {:.1}% of the greedy oracle ({}); bytes vs best baseline {} ({:.3}): {} ({})",
        t.default_oracle_ratio * 100.0,
        if t.meets_oracle_target {
            "meets ≥95%"
        } else {
            "MISSES ≥95%"
        },
        t.best_baseline,
        t.best_baseline_hit_ratio,
        t.bytes_vs_best_baseline
            .map_or("n/a (baseline moved nothing)".into(), |x| format!(
                "{x:.2}×"
            )),
        if t.meets_bytes_target {
            "meets ≤1× at equal or better hit ratio"
        } else {
            "MISSES"
        },
    );
    s
}

/// Human-readable bytes.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// Each row's line colour on the hit-ratio chart, the same on every chart: the references in
/// black and grey, vmtierd's rows in blues, the baselines in distinct hues.
const ROW_COLORS: [(&str, Rgb); 13] = [
    ("oracle", Rgb(0x00, 0x00, 0x00)),
    ("hindsight", Rgb(0x7f, 0x7f, 0x7f)),
    ("vmtierd", Rgb(0x1f, 0x77, 0xb4)),
    ("vmtierd-softdirty", Rgb(0x6b, 0xae, 0xd6)),
    ("vmtierd-2m", Rgb(0x17, 0xbe, 0xcf)),
    ("vmtierd-hybrid", Rgb(0x39, 0x3b, 0x79)),
    ("default", Rgb(0x2c, 0xa0, 0x2c)),
    ("numab", Rgb(0xff, 0x7f, 0x0e)),
    ("tpp", Rgb(0xd6, 0x27, 0x28)),
    ("memtis", Rgb(0x94, 0x67, 0xbd)),
    ("damos", Rgb(0x8c, 0x56, 0x4b)),
    ("memtierd", Rgb(0xe3, 0x77, 0xc2)),
    ("first-touch", Rgb(0xbc, 0xbd, 0x22)),
];

/// Colours of rows [`ROW_COLORS`] does not name (the experiment rows), by position.
const OTHER_COLORS: [Rgb; 4] = [
    Rgb(0x9e, 0xda, 0xe5),
    Rgb(0xff, 0xbb, 0x78),
    Rgb(0x98, 0xdf, 0x8a),
    Rgb(0xc5, 0xb0, 0xd5),
];

/// Row `policy`'s line colour: [`ROW_COLORS`], or by position `i` for a row it does not name.
pub fn row_color(policy: &str, i: usize) -> Rgb {
    ROW_COLORS
        .iter()
        .find(|(n, _)| *n == policy)
        .map_or(OTHER_COLORS[i % OTHER_COLORS.len()], |c| c.1)
}

/// Which plots [`plots`] draws for a trace at a budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlotSpec {
    /// SVG or PNG; `None` draws nothing.
    pub format: Option<Format>,
    /// The budgets (permille of the footprint) that get plots.
    pub budgets: Vec<u32>,
    /// The policies on the hit-ratio chart, in the report's order; every run when empty.
    pub hit_policies: Vec<String>,
}

/// The policies whose placement [`plots`] draws as heatmaps.
pub const HEATMAP_POLICIES: [&str; 4] = ["oracle", "vmtierd", "numab", "memtis"];

/// The plots of `trace` at `permille` of its footprint, as `(file name, bytes)`: the hit-ratio
/// chart (`policies-hit-{slug}-{pct}pct.{ext}`) and the heatmaps of [`HEATMAP_POLICIES`]
/// (`policies-heatmap-…`); none when `spec` leaves out this budget or every format.
pub fn plots(
    trace: &str,
    permille: u32,
    runs: &[RunResult],
    spec: &PlotSpec,
) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let Some(format) = spec.format else {
        return Ok(Vec::new());
    };
    if !spec.budgets.contains(&permille) {
        return Ok(Vec::new());
    }
    let ext = match format {
        Format::Svg => "svg",
        Format::Png => "png",
    };
    let pct = trim_permille(permille);
    let name = format!("{trace}, DRAM {pct} % of the footprint");
    let file = |kind: &str| format!("policies-{kind}-{}-{pct}pct.{ext}", slug(trace));
    let hit = hit_figure(&name, runs, &spec.hit_policies);
    let pick: Vec<&RunResult> = runs
        .iter()
        .filter(|r| HEATMAP_POLICIES.contains(&r.policy.as_str()))
        .collect();
    let heat = heatmap_figure(&name, &pick);
    let draw = |fig: &Figure| vmtier_plot::render(fig, format).map_err(Error::Plot);
    Ok(vec![
        (file("hit"), draw(&hit)?),
        (file("heatmap"), draw(&heat)?),
    ])
}

/// `250` → `25`, `125` → `12.5`.
fn trim_permille(permille: u32) -> String {
    if permille % 10 == 0 {
        (permille / 10).to_string()
    } else {
        format!("{}.{}", permille / 10, permille % 10)
    }
}

/// The hit-ratio chart: per tick, one line per run named in `only` (every run when empty);
/// dashed verticals at hot-set shifts. A policy keeps its colour whichever others are shown.
pub fn hit_figure(trace: &str, runs: &[RunResult], only: &[String]) -> Figure {
    let ticks = runs.first().map_or(1, |r| r.series.len().max(2));
    #[allow(clippy::cast_precision_loss)]
    let mut p = Panel::new(
        "",
        Axis {
            label: "tick".into(),
            min: 0.0,
            max: (ticks - 1) as f64,
            labels: Labels::Number,
        },
        Axis {
            label: "DRAM hit ratio".into(),
            min: 0.0,
            max: 1.0,
            labels: Labels::Number,
        },
    );
    p.grid = true;
    if let Some(r) = runs.first() {
        #[allow(clippy::cast_precision_loss)]
        p.vlines.extend(r.marker_ticks.iter().map(|&m| m as f64));
    }
    for (i, r) in runs.iter().enumerate() {
        if !only.is_empty() && !only.contains(&r.policy) {
            continue;
        }
        #[allow(clippy::cast_precision_loss)]
        p.series.push(Series {
            name: format!("{} ({:.3})", r.policy, r.hit_ratio),
            color: row_color(&r.policy, i),
            width: if r.policy == "vmtierd" { 3 } else { 1 },
            points: r
                .series
                .iter()
                .enumerate()
                .map(|(t, &v)| (t as f64, f64::from(v)))
                .collect(),
        });
    }
    Figure {
        title: format!("DRAM hit ratio per tick — {trace}"),
        width: 900,
        height: 480,
        panels: vec![p],
        arrange: Arrange::Columns,
    }
}

/// Placement heatmaps (x tick, y address bucket) for the given runs side by side. Red
/// means in DRAM, blue on the slow tier; brightness is the bucket's share of the accesses.
pub fn heatmap_figure(trace: &str, runs: &[&RunResult]) -> Figure {
    let panels = runs
        .iter()
        .map(|r| {
            let cols = r.heatmap.len().max(1);
            let rows = r.heatmap.first().map_or(1, |c| c.len().max(1));
            let max_share = r
                .heatmap
                .iter()
                .flatten()
                .map(|c| c.1)
                .fold(1e-9f32, f32::max);
            #[allow(clippy::cast_precision_loss)]
            let mut p = Panel::new(
                r.policy.clone(),
                Axis {
                    label: "tick".into(),
                    min: 0.0,
                    max: cols as f64,
                    labels: Labels::Number,
                },
                Axis {
                    label: "address bucket".into(),
                    min: 0.0,
                    max: rows as f64,
                    labels: Labels::Number,
                },
            );
            for (t, col) in r.heatmap.iter().enumerate() {
                for (row, &(fast, share)) in col.iter().enumerate() {
                    let bright = 0.25 + 0.75 * (share / max_share).sqrt();
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let color = Rgb(
                        (255.0 * fast * bright) as u8,
                        40,
                        (255.0 * (1.0 - fast) * bright) as u8,
                    );
                    #[allow(clippy::cast_precision_loss)]
                    p.cells.push(Cell {
                        x0: t as f64,
                        x1: (t + 1) as f64,
                        y0: row as f64,
                        y1: (row + 1) as f64,
                        color,
                    });
                }
            }
            p
        })
        .collect::<Vec<_>>();
    Figure {
        title: format!("Placement over time — {trace} (red: DRAM, blue: CXL; bright: accessed)"),
        width: u32::try_from(40 + 420 * panels.len().max(1)).unwrap_or(vmtier_plot::MAX_SIDE),
        height: 400,
        panels,
        arrange: Arrange::Columns,
    }
}

/// Writes `bytes` to `path` atomically.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    trace::write_atomically(path, |w| w.write_all(bytes))
        .map_err(|e| Error::Write(path.to_owned(), e))
}

/// File-name-safe version of a trace name.
pub fn slug(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{generate, Kind, Spec};

    /// A small moving-hot trace and a config of 5 000-access ticks with a 4-row heatmap.
    fn moving_hot(pages: u32, accesses: u64) -> (Trace, Config) {
        let t = generate(&Spec {
            kind: Kind::MovingHot,
            pages,
            accesses,
            ..Spec::default()
        })
        .expect("generate");
        let cfg = Config {
            tick_accesses: 5_000,
            heatmap_rows: 4,
            ..Config::default()
        };
        (t, cfg)
    }

    #[test]
    fn plots_follow_the_spec() -> Result<(), Error> {
        let (t, cfg) = moving_hot(512, 20_000);
        let (_, runs) = run_trace("mh/x", &t, &cfg, false)?;
        let spec = |format, budgets: &[u32], only: &[&str]| PlotSpec {
            format,
            budgets: budgets.to_vec(),
            hit_policies: only.iter().map(|p| (*p).to_owned()).collect(),
        };
        // (spec, budget drawn at) -> files
        let cases: [(PlotSpec, u32, &[&str]); 4] = [
            (spec(None, &[250], &[]), 250, &[]),
            (spec(Some(Format::Svg), &[250], &[]), 100, &[]),
            (
                spec(Some(Format::Svg), &[100, 250], &[]),
                250,
                &[
                    "policies-hit-mh_x-25pct.svg",
                    "policies-heatmap-mh_x-25pct.svg",
                ],
            ),
            (
                spec(Some(Format::Png), &[125], &["vmtierd", "numab"]),
                125,
                &[
                    "policies-hit-mh_x-12.5pct.png",
                    "policies-heatmap-mh_x-12.5pct.png",
                ],
            ),
        ];
        for (sp, permille, want) in cases {
            let got = plots("mh/x", permille, &runs, &sp)?;
            let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, want, "{sp:?} at {permille}");
            for (name, bytes) in &got {
                if name.ends_with(".png") {
                    assert!(bytes.starts_with(b"\x89PNG"), "{name}");
                } else {
                    assert!(bytes.starts_with(b"<svg"), "{name}");
                }
            }
        }
        // Only the named rows are drawn, each in its own colour whatever else is shown.
        let only = ["vmtierd".to_owned(), "numab".to_owned()];
        let fig = hit_figure("mh", &runs, &only);
        let drawn: Vec<&str> = fig.panels[0]
            .series
            .iter()
            .map(|s| s.name.split(' ').next().unwrap_or(""))
            .collect();
        assert_eq!(drawn, ["vmtierd", "numab"]);
        let all = hit_figure("mh", &runs, &[]);
        assert_eq!(all.panels[0].series.len(), runs.len());
        let color = |f: &Figure, p: &str| {
            f.panels[0]
                .series
                .iter()
                .find(|s| s.name.starts_with(&format!("{p} (")))
                .map(|s| s.color)
        };
        assert_eq!(color(&fig, "numab"), color(&all, "numab"));
        let colors: std::collections::HashSet<_> =
            all.panels[0].series.iter().map(|s| s.color).collect();
        assert_eq!(colors.len(), runs.len(), "every row its own colour");
        Ok(())
    }

    #[test]
    fn report_rows_targets_and_plots() -> Result<(), Error> {
        let (t, cfg) = moving_hot(1024, 60_000);
        let (rep, runs) = run_trace("mh", &t, &cfg, true)?;
        assert_eq!(
            rep.results.len(),
            vmtier_policies::registry::REGISTRY.len()
                + 2
                + SHIPPED.len()
                + GRANULARITY.len()
                + ZOOM.len()
                + 1
        );
        assert_eq!(
            rep.results
                .iter()
                .map(|r| r.policy.as_str())
                .collect::<Vec<_>>(),
            row_names(true)
        );
        assert_eq!(rep.results[0].policy, "oracle");
        assert_eq!(rep.results[1].policy, "hindsight");
        assert_eq!(
            (
                rep.results[2].policy.as_str(),
                rep.results[2].source.as_str()
            ),
            ("vmtierd", "damon")
        );
        assert_eq!(rep.results[3].source, "soft-dirty");
        assert!((rep.results[0].oracle_ratio - 1.0).abs() < 1e-9);
        // vmtierd-2m's budget counts whole regions touched: more bytes than the oracle's.
        assert!(rep.results.iter().any(|r| r.policy == ZOOM_HYBRID.0));
        assert!(rep
            .results
            .iter()
            .filter(|r| r.policy != "vmtierd-2m")
            .all(|r| r.oracle_ratio <= 1.0 + 1e-9));
        assert!(rep.results.iter().all(|r| r.reaction_ticks.is_some()));
        let tab = table(&rep);
        assert!(tab.contains("vmtierd") && tab.contains("of the greedy oracle"));
        let svg_of = |fig: &Figure| {
            String::from_utf8(vmtier_plot::render(fig, Format::Svg).expect("drawn")).expect("UTF-8")
        };
        let svg = svg_of(&hit_figure("mh", &runs, &[]));
        assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.ends_with("</svg>\n"));
        // One line per run, named in the legend.
        assert!(svg.matches("<polyline").count() >= runs.len());
        assert!(svg.contains(&format!("\n{} (", runs[0].policy)));
        let fig = heatmap_figure("mh", &[&runs[0], &runs[1]]);
        let cells: usize = runs[..2]
            .iter()
            .map(|r| r.heatmap.iter().map(Vec::len).sum::<usize>())
            .sum();
        assert_eq!(
            fig.panels.iter().map(|p| p.cells.len()).sum::<usize>(),
            cells
        );
        let hm = svg_of(&fig);
        assert!(hm.matches("<rect").count() >= cells);
        let cases = [(0u64, "0 B"), (1536, "1.5 KiB"), (3 << 30, "3.0 GiB")];
        for (b, want) in cases {
            assert_eq!(human_bytes(b), want);
        }
        assert_eq!(slug("redis/get set"), "redis_get_set");
        // (ticks, epoch ticks): 60 000 accesses in ticks of 5 000, then the same trace cut into
        // three recorded epochs (the markers at 0, 10 000 and 40 000).
        assert_eq!((rep.ticks, rep.epoch_ticks), (12, false));
        let mut e = crate::trace::Trace::new(12, t.pages);
        for (i, (&p, w)) in t.accesses.iter().zip(0..).enumerate() {
            if [0, 10_000, 40_000].contains(&i) {
                e.mark(crate::trace::EPOCH_MARKER);
            }
            e.push(p, t.is_write(w));
        }
        let (rep, _) = run_trace("mh-epochs", &e, &cfg, false)?;
        assert_eq!((rep.ticks, rep.epoch_ticks), (3, true));
        assert!(table(&rep).contains("3 ticks (one per recorded epoch)"));
        Ok(())
    }
}
