//! `vmtier-sim`: replays page-access traces against vmtier's placement policies.
//!
//! ```text
//! vmtier-sim run --trace FILE --policy NAME [--config FILE] [--json]
//! vmtier-sim gen KIND --out FILE [--pages N] [--accesses N] [--seed N] [--phases N]
//!     [--hot-fraction F] [--hot-share F]
//! vmtier-sim record-lackey --out FILE [--max-records N] [--skip-records N]
//!     [--epoch-instructions N] [--sample-every N] [--max-epochs N] [--seed N] < lackey.log
//! vmtier-sim report [--traces DIR] [--out DIR] [--config FILE] [--quick] [--no-scale] [--no-generated] [--zoom]
//!     [--plots svg|png|none] [--plot-budgets all|PCT,...] [--plot-policies NAME,...]
//! vmtier-sim scale [--pages-log2 N] [--accesses N]
//! vmtier-sim stat --trace FILE
//! vmtier-sim thin --trace FILE --every N --out FILE [--seed N]
//! vmtier-sim policies
//! ```

#![allow(clippy::cast_possible_truncation)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use vmtier_policies::registry;
use vmtier_sim::gen::{self, Kind, Spec};
use vmtier_sim::report::{self, TraceReport};
use vmtier_sim::sim::{self, Config, Planner};
use vmtier_sim::trace::Trace;
use vmtier_sim::{lackey, scale};

const USAGE: &str = "usage:
  vmtier-sim run --trace FILE --policy NAME [--config FILE] [--json]
  vmtier-sim gen KIND --out FILE [--pages N] [--accesses N] [--seed N] [--phases N]
      [--hot-fraction F] [--hot-share F]
      KIND: zipf | moving-hot | phases | scan-hot | gups
  vmtier-sim record-lackey --out FILE [--max-records N] [--skip-records N]
      [--epoch-instructions N] [--sample-every N] [--max-epochs N] [--seed N] < lackey.log
  vmtier-sim report [--traces DIR] [--out DIR] [--config FILE] [--quick] [--no-scale] [--no-generated] [--zoom]
      [--plots svg|png|none] [--plot-budgets all|PCT,...] [--plot-policies NAME,...]
  vmtier-sim scale [--pages-log2 N] [--accesses N]
  vmtier-sim stat --trace FILE
  vmtier-sim thin --trace FILE --every N --out FILE [--seed N]
  vmtier-sim policies";

/// Command-line errors (each printed with its cause chain).
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("{0}\n{USAGE}")]
    Usage(String),
    #[error("Failed to read config {0}")]
    ConfigRead(PathBuf, #[source] std::io::Error),
    #[error("Invalid config {0}")]
    ConfigParse(PathBuf, #[source] toml::de::Error),
    #[error("Failed to load trace {0}")]
    Trace(PathBuf, #[source] vmtier_sim::trace::Error),
    #[error(transparent)]
    Sim(#[from] sim::Error),
    #[error(transparent)]
    Gen(#[from] gen::Error),
    #[error(transparent)]
    Lackey(#[from] lackey::Error),
    #[error(transparent)]
    Report(#[from] report::Error),
    #[error("Failed to list traces in {0}")]
    List(PathBuf, #[source] std::io::Error),
}

struct Args {
    positional: Vec<String>,
    opts: HashMap<String, String>,
    flags: Vec<String>,
}

fn parse_args(args: &[String], with_value: &[&str]) -> Result<Args, Error> {
    let mut a = Args {
        positional: Vec::new(),
        opts: HashMap::new(),
        flags: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(s) = it.next() {
        if let Some(name) = s.strip_prefix("--") {
            if with_value.contains(&name) {
                let v = it
                    .next()
                    .ok_or_else(|| Error::Usage(format!("--{name} needs a value")))?;
                a.opts.insert(name.to_owned(), v.clone());
            } else {
                a.flags.push(name.to_owned());
            }
        } else {
            a.positional.push(s.clone());
        }
    }
    Ok(a)
}

impl Args {
    fn num(&self, name: &str, default: u64) -> Result<u64, Error> {
        match self.opts.get(name) {
            None => Ok(default),
            Some(v) => v
                .replace('_', "")
                .parse()
                .map_err(|_| Error::Usage(format!("--{name}: not a number: {v}"))),
        }
    }

    fn fraction(&self, name: &str, default: f64) -> Result<f64, Error> {
        match self.opts.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or_else(|| Error::Usage(format!("--{name}: not a fraction in 0..=1: {v}"))),
        }
    }

    fn need(&self, name: &str) -> Result<&str, Error> {
        self.opts
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Error::Usage(format!("missing --{name}")))
    }

    fn flag(&self, name: &str) -> bool {
        self.flags.iter().any(|f| f == name)
    }

    fn check_flags(&self, known: &[&str]) -> Result<(), Error> {
        match self.flags.iter().find(|f| !known.contains(&f.as_str())) {
            Some(f) => Err(Error::Usage(format!("unknown option --{f}"))),
            None => Ok(()),
        }
    }
}

fn load_config(path: Option<&String>) -> Result<Config, Error> {
    let Some(p) = path else {
        return Ok(Config::default());
    };
    let p = PathBuf::from(p);
    let text = std::fs::read_to_string(&p).map_err(|e| Error::ConfigRead(p.clone(), e))?;
    toml::from_str(&text).map_err(|e| Error::ConfigParse(p, e))
}

fn load_trace(p: &Path) -> Result<Trace, Error> {
    Trace::read_path(p).map_err(|e| Error::Trace(p.to_owned(), e))
}

fn cmd_run(args: &[String]) -> Result<(), Error> {
    let a = parse_args(args, &["trace", "policy", "config"])?;
    a.check_flags(&["json", "no-oracle"])?;
    let cfg = load_config(a.opts.get("config"))?;
    let t = load_trace(Path::new(a.need("trace")?))?;
    let name = a.need("policy")?;
    let mut planner = Planner::by_name(name, &cfg)?;
    let r = sim::run(&t, &mut planner, &cfg)?;
    let oracle = if a.flag("no-oracle") || name == "oracle" {
        None
    } else {
        Some(sim::run(&t, &mut Planner::Oracle, &cfg)?)
    };
    let oracle_ratio = oracle
        .as_ref()
        .map(|o| r.hit_ratio / o.hit_ratio.max(1e-12));
    let reaction = oracle
        .as_ref()
        .and_then(|o| sim::reaction_ticks(&r.series, &o.series, &r.marker_ticks));
    if a.flag("json") {
        let mut v = serde_json::to_value(&r).map_err(report::Error::Json)?;
        if let Some(m) = v.as_object_mut() {
            m.remove("heatmap");
            m.insert("oracle_ratio".into(), serde_json::json!(oracle_ratio));
            m.insert("reaction_ticks".into(), serde_json::json!(reaction));
        }
        println!("{v}");
        return Ok(());
    }
    println!("policy               {} (source {})", r.policy, r.source);
    println!("accesses / ticks     {} / {}", r.accesses, r.ticks);
    println!(
        "granules / budget    {} × {} B / {} (≤{} moves/tick)",
        r.granules, r.granule_bytes, r.budget_granules, r.max_moves
    );
    println!("hit ratio            {:.4}", r.hit_ratio);
    if let Some(x) = oracle_ratio {
        println!("ratio to oracle      {x:.4}");
    }
    println!("est. slowdown        {:.3}× vs all-DRAM", r.est_slowdown);
    println!(
        "migrated             {} ({} moves)",
        report::human_bytes(r.bytes_migrated),
        r.moves
    );
    println!("ping-pong pages      {}", r.pingpong_pages);
    println!(
        "reaction             {}",
        reaction.map_or("n/a (no markers)".into(), |t| format!("{t:.1} ticks"))
    );
    println!(
        "metadata             {:.4} B/page policy, {:.4} B/page records",
        r.metadata_bytes_per_page, r.store_bytes_per_page
    );
    println!(
        "plan time            {:.3} ms/tick (max {:.3})",
        r.plan_ms_per_interval, r.plan_ms_max
    );
    println!(
        "replay               {:.2e} accesses/s",
        r.replay_accesses_per_s
    );
    if r.plan_violations > 0 {
        println!("plan violations      {}", r.plan_violations);
    }
    Ok(())
}

fn cmd_gen(args: &[String]) -> Result<(), Error> {
    let a = parse_args(
        args,
        &[
            "out",
            "pages",
            "accesses",
            "seed",
            "phases",
            "hot-fraction",
            "hot-share",
        ],
    )?;
    a.check_flags(&[])?;
    let kind = Kind::parse(
        a.positional
            .first()
            .ok_or_else(|| Error::Usage("missing KIND".into()))?,
    )?;
    let d = Spec::default();
    let spec = Spec {
        kind,
        pages: u32::try_from(a.num("pages", u64::from(d.pages))?)
            .map_err(|_| Error::Usage("--pages too large".into()))?,
        accesses: a.num("accesses", d.accesses)?,
        seed: a.num("seed", d.seed)?,
        phases: u32::try_from(a.num("phases", u64::from(d.phases))?).unwrap_or(u32::MAX),
        hot_fraction: a.fraction("hot-fraction", d.hot_fraction)?,
        hot_share: a.fraction("hot-share", d.hot_share)?,
        ..d
    };
    let out = PathBuf::from(a.need("out")?);
    let t = gen::generate(&spec)?;
    write_trace(&t, &out)
}

/// Writes a trace and says so on stderr.
fn write_trace(t: &Trace, out: &std::path::Path) -> Result<(), Error> {
    t.write_path(out)
        .map_err(|e| Error::Trace(out.to_owned(), e))?;
    let epochs = t
        .markers
        .iter()
        .filter(|m| m.id == vmtier_sim::trace::EPOCH_MARKER)
        .count();
    eprintln!(
        "wrote {} ({} accesses, {} pages, {} epochs)",
        out.display(),
        t.accesses.len(),
        t.pages,
        epochs
    );
    Ok(())
}

fn cmd_record(args: &[String]) -> Result<(), Error> {
    let a = parse_args(
        args,
        &[
            "out",
            "max-records",
            "skip-records",
            "epoch-instructions",
            "sample-every",
            "max-epochs",
            "seed",
        ],
    )?;
    a.check_flags(&["with-instructions"])?;
    let d = lackey::Options::default();
    let opts = lackey::Options {
        max_records: a.num("max-records", d.max_records)?,
        skip_records: a.num("skip-records", 0)?,
        with_instructions: a.flag("with-instructions"),
        epoch_instructions: a.num("epoch-instructions", 0)?,
        sample_every: a.num("sample-every", 1)?,
        max_epochs: a.num("max-epochs", 0)?,
        seed: a.num("seed", d.seed)?,
    };
    if opts.sample_every == 0 {
        return Err(Error::Usage("--sample-every must be at least 1".into()));
    }
    let out = PathBuf::from(a.need("out")?);
    let t = lackey::reduce(std::io::stdin().lock(), opts)?;
    write_trace(&t, &out)
}

fn suite(quick: bool) -> Result<Vec<(String, Trace)>, Error> {
    let accesses = if quick { 400_000 } else { 2_000_000 };
    let mut v = Vec::new();
    for kind in Kind::ALL {
        let spec = Spec {
            kind,
            pages: 16_384,
            accesses,
            ..Spec::default()
        };
        v.push((format!("gen-{}", kind.name()), gen::generate(&spec)?));
    }
    Ok(v)
}

/// DRAM budgets of the report, permille of each trace's footprint.
const BUDGETS: [u32; 3] = [100, 250, 500];

/// The report's plots from `--plots svg|png|none` (default svg), `--plot-budgets` (percents of
/// the footprint, `all`; default the config's budget, or 25 % if that is not one of the
/// report's) and `--plot-policies` (the hit-ratio chart's lines; default all).
fn plot_spec(a: &Args, config_permille: u32) -> Result<report::PlotSpec, Error> {
    let format = match a.opts.get("plots").map_or("svg", String::as_str) {
        "svg" => Some(vmtier_plot::Format::Svg),
        "png" => Some(vmtier_plot::Format::Png),
        "none" => None,
        v => return Err(Error::Usage(format!("--plots: svg, png or none, not {v}"))),
    };
    let budgets = match a.opts.get("plot-budgets").map(String::as_str) {
        None if BUDGETS.contains(&config_permille) => vec![config_permille],
        None => vec![250],
        Some("all") => BUDGETS.to_vec(),
        Some(list) => list
            .split(',')
            .map(|w| {
                let w = w.trim().trim_end_matches('%');
                w.parse::<u32>()
                    .ok()
                    .and_then(|p| p.checked_mul(10))
                    .filter(|p| BUDGETS.contains(p))
                    .ok_or_else(|| {
                        Error::Usage(format!(
                            "--plot-budgets: {w} is not one of the report's budgets (10, 25, 50) or all"
                        ))
                    })
            })
            .collect::<Result<_, _>>()?,
    };
    let known = report::row_names(a.flag("zoom"));
    let hit_policies = match a.opts.get("plot-policies") {
        None => Vec::new(),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                if known.contains(&p) {
                    Ok(p.to_owned())
                } else {
                    Err(Error::Usage(format!(
                        "--plot-policies: no row {p} in the report (rows: {})",
                        known.join(", ")
                    )))
                }
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(report::PlotSpec {
        format,
        budgets,
        hit_policies,
    })
}

fn cmd_report(args: &[String]) -> Result<(), Error> {
    let a = parse_args(
        args,
        &[
            "traces",
            "out",
            "config",
            "plots",
            "plot-budgets",
            "plot-policies",
        ],
    )?;
    a.check_flags(&["quick", "no-scale", "no-generated", "zoom"])?;
    let quick = a.flag("quick");
    let zoom = a.flag("zoom");
    let cfg = load_config(a.opts.get("config"))?;
    let plots = plot_spec(&a, cfg.fast_permille)?;
    let out = PathBuf::from(a.opts.get("out").map_or("target/bench", String::as_str));
    std::fs::create_dir_all(&out).map_err(|e| report::Error::Write(out.clone(), e))?;
    let mut traces = if a.flag("no-generated") {
        Vec::new()
    } else {
        suite(quick)?
    };
    let dir = PathBuf::from(a.opts.get("traces").map_or("tests/traces", String::as_str));
    if dir.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| Error::List(dir.clone(), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.to_string_lossy().ends_with(".vmt.gz") || p.to_string_lossy().ends_with(".vmt")
            })
            .collect();
        files.sort();
        for f in files {
            let name = f
                .file_name()
                .map(|n| {
                    n.to_string_lossy()
                        .trim_end_matches(".gz")
                        .trim_end_matches(".vmt")
                        .to_owned()
                })
                .unwrap_or_default();
            let mut t = load_trace(&f)?;
            if quick {
                t.accesses.truncate(400_000);
                t.markers.retain(|m| m.at < 400_000);
            }
            traces.push((name, t));
        }
    }
    let started = Instant::now();
    let mut reports: Vec<TraceReport> = Vec::new();
    for (name, t) in &traces {
        for permille in BUDGETS {
            let c = Config {
                fast_permille: permille,
                ..cfg.clone()
            };
            let (rep, runs) = report::run_trace(name, t, &c, zoom)?;
            print!("{}", report::table(&rep));
            for (file, bytes) in report::plots(name, permille, &runs, &plots)? {
                report::write_file(&out.join(file), &bytes)?;
            }
            reports.push(rep);
        }
    }
    let scale = if a.flag("no-scale") {
        None
    } else {
        let (log2, acc) = if quick {
            (24, 2_000_000)
        } else {
            (28, 10_000_000)
        };
        let s = scale::run(log2, acc)?;
        println!(
            "scale: {} guest: plan {:.1} ms (4 KiB granules), {:.2} ms (2 MiB); policy state {:.3} B/page, records {:.3} B/page (4 KiB) / {:.4} (2 MiB); replay {:.2e} accesses/s",
            report::human_bytes(s.guest_bytes),
            s.plan_ms_4k,
            s.plan_ms_2m,
            s.policy_state_bytes_per_page,
            s.store_bytes_per_page_4k,
            s.store_bytes_per_page_2m,
            s.replay_accesses_per_s
        );
        println!(
            "scale: hybrid tracking ({}% of regions mixed, detail cap {}%): plan {:.1} ms, track {:.1} ms per tick; store {:.3} B/page; {} regions split, {} refused; {} reports per tick",
            s.mixed_percent,
            scale::HYBRID_DETAIL_PERCENT,
            s.plan_ms_hybrid,
            s.track_ms_hybrid,
            s.store_bytes_per_page_hybrid,
            s.split_regions,
            s.refused_splits,
            s.reports_per_tick
        );
        Some(s)
    };
    let met = reports
        .iter()
        .filter(|r| r.targets.meets_oracle_target)
        .count();
    let met_b = reports
        .iter()
        .filter(|r| r.targets.meets_bytes_target)
        .count();
    println!(
        "vmtierd as shipped (4 KiB granules): ≥95% of the greedy oracle on {met}/{} trace×budget cases; at or above the best baseline with ≤ its bytes on {met_b}/{}",
        reports.len(),
        reports.len()
    );
    // What reacting alone can reach: hindsight sees the past window exactly, predicts nothing.
    let ratio_of = |r: &report::TraceReport, p: &str| {
        r.results
            .iter()
            .find(|x| x.policy == p)
            .map_or(0.0, |x| x.oracle_ratio)
    };
    let hind = reports
        .iter()
        .filter(|r| ratio_of(r, "hindsight") >= 0.95)
        .count();
    let need_prediction = reports
        .iter()
        .filter(|r| !r.targets.meets_oracle_target && ratio_of(r, "hindsight") < 0.95)
        .count();
    println!(
        "hindsight (the past window seen exactly, no prediction): ≥95% of the greedy oracle on {hind}/{}; \
         of vmtierd's {} misses, {need_prediction} are below 95% for hindsight too",
        reports.len(),
        reports.len() - met
    );
    // vmtierd's DAMON rows side by side, the sim-only zoom experiment among them.
    let names = ["vmtierd", "vmtierd-hybrid", report::ZOOM_HYBRID.0];
    let zoomed = report::ZOOM.iter().map(|z| z.0);
    for name in names
        .into_iter()
        .chain(zoomed)
        .filter(|n| zoom || !n.ends_with("-simonly"))
    {
        let rows: Vec<&report::Row> = reports
            .iter()
            .filter_map(|r| r.results.iter().find(|x| x.policy == name))
            .collect();
        let n = rows.len().max(1) as f64;
        println!(
            "{name}: ≥95% of the oracle on {}/{}, mean ratio {:.4}, migrated {}, regions per sample {:.0} + zoom {:.0}",
            rows.iter().filter(|x| x.oracle_ratio >= 0.95).count(),
            rows.len(),
            rows.iter().map(|x| x.oracle_ratio).sum::<f64>() / n,
            report::human_bytes(rows.iter().map(|x| x.bytes_migrated).sum()),
            rows.iter().map(|x| x.damon_regions_per_sample).sum::<f64>() / n,
            rows.iter().map(|x| x.zoom_regions_per_sample).sum::<f64>() / n,
        );
    }
    let json = serde_json::json!({
        "config": cfg,
        "quick": quick,
        "traces": reports,
        "scale": scale,
        "seconds": started.elapsed().as_secs_f64(),
    });
    let text = serde_json::to_string_pretty(&json).map_err(report::Error::Json)?;
    let path = out.join("policies.json");
    report::write_file(&path, text.as_bytes())?;
    match plots.format {
        Some(f) => eprintln!(
            "wrote {} and {} plots in {}",
            path.display(),
            if f == vmtier_plot::Format::Svg {
                "SVG"
            } else {
                "PNG"
            },
            out.display()
        ),
        None => eprintln!("wrote {}", path.display()),
    }
    Ok(())
}

fn cmd_scale(args: &[String]) -> Result<(), Error> {
    let a = parse_args(args, &["pages-log2", "accesses"])?;
    a.check_flags(&[])?;
    let log2 = u32::try_from(a.num("pages-log2", 28)?).unwrap_or(28);
    let s = scale::run(log2, a.num("accesses", 10_000_000)?)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&s).map_err(report::Error::Json)?
    );
    Ok(())
}

/// Writes a sparser copy of a trace (one access per block of N, `Trace::thin`).
fn cmd_thin(args: &[String]) -> Result<(), Error> {
    let a = parse_args(args, &["trace", "every", "out", "seed"])?;
    a.check_flags(&[])?;
    let every = a.num("every", 0)?;
    if every == 0 {
        return Err(Error::Usage("--every must be at least 1".into()));
    }
    let t = load_trace(Path::new(a.need("trace")?))?;
    let thin = t.thin(every, a.num("seed", 1)?);
    write_trace(&thin, Path::new(a.need("out")?))
}

/// Prints a trace's size figures: accesses, address space, footprint, epochs, markers.
fn cmd_stat(args: &[String]) -> Result<(), Error> {
    let a = parse_args(args, &["trace"])?;
    a.check_flags(&[])?;
    let p = PathBuf::from(a.need("trace")?);
    let t = load_trace(&p)?;
    let mut touched = vec![false; t.pages as usize];
    for &pg in &t.accesses {
        touched[pg as usize] = true;
    }
    let footprint = touched.iter().filter(|&&x| x).count() as u64;
    let writes = (0..t.accesses.len()).filter(|&i| t.is_write(i)).count();
    let epochs = t
        .markers
        .iter()
        .filter(|m| m.id == vmtier_sim::trace::EPOCH_MARKER)
        .count();
    let per_epoch = t
        .accesses
        .len()
        .checked_div(epochs)
        .map(|n| {
            let mut b = vec![0];
            b.extend(t.epoch_bounds());
            b.push(t.accesses.len() as u64);
            let lens = b.windows(2).map(|w| w[1] - w[0]);
            let (lo, hi) = (lens.clone().min(), lens.max());
            format!(
                ", {n} accesses per epoch on average ({}..{})",
                lo.unwrap_or(0),
                hi.unwrap_or(0)
            )
        })
        .unwrap_or_default();
    println!(
        "{}: {} accesses ({:.1}% writes), address space {} pages, footprint {} pages ({}), {} epochs{}, {} other markers",
        p.display(),
        t.accesses.len(),
        100.0 * writes as f64 / t.accesses.len().max(1) as f64,
        t.pages,
        footprint,
        report::human_bytes(footprint << t.page_shift),
        epochs,
        per_epoch,
        t.markers.len() - epochs
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("", &[][..]),
    };
    let res = match cmd {
        "run" => cmd_run(rest),
        "gen" => cmd_gen(rest),
        "record-lackey" => cmd_record(rest),
        "report" => cmd_report(rest),
        "scale" => cmd_scale(rest),
        "stat" => cmd_stat(rest),
        "thin" => cmd_thin(rest),
        "policies" => {
            println!(
                "{:<12} offline, greedy with one interval of lookahead (same budget and move limit; not an upper bound)",
                "oracle"
            );
            for e in registry::REGISTRY {
                println!("{:<12} {}", e.name, e.about);
            }
            Ok(())
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(Error::Usage(format!("unknown command {other:?}"))),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("vmtier-sim: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}
