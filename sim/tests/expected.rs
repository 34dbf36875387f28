//! Expected-output tests: small committed traces in `tests/traces/`, every policy, the plans
//! it makes per tick, diffed against `tests/traces/expected/<trace>.<policy>.txt`.
//! Regenerate with `VMTIER_BLESS=1 cargo test -p vmtier-sim --test expected`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use vmtier_sim::gen::{self, Kind, Spec};
use vmtier_sim::sim::{self, Config, Planner};
use vmtier_sim::trace::Trace;

fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces")
}

fn config() -> Config {
    Config {
        tick_accesses: 2_000,
        heatmap_rows: 0,
        ..Config::default()
    }
}

/// The small traces: (name, file, accesses kept).
const SMALL: &[(&str, &str, usize)] = &[
    ("small-moving-hot", "small/small-moving-hot.vmt.gz", 20_000),
    ("small-zipf", "small/small-zipf.vmt.gz", 20_000),
    ("redis-head", "redis.vmt.gz", 20_000),
    ("sqlite-head", "sqlite.vmt.gz", 20_000),
    // An epoch trace: one tick per recorded epoch (about 4000 accesses each), not 2000.
    ("xz-head", "xz.vmt.gz", 20_000),
];

fn small_specs(name: &str) -> Option<Spec> {
    let kind = match name {
        "small-moving-hot" => Kind::MovingHot,
        "small-zipf" => Kind::Zipf,
        _ => return None,
    };
    Some(Spec {
        kind,
        pages: 512,
        accesses: 20_000,
        seed: 5,
        ..Spec::default()
    })
}

fn render(t: &Trace, policy: &str) -> String {
    let cfg = config();
    let mut planner = Planner::by_name(policy, &cfg).expect("policy");
    let mut out = String::new();
    let r = sim::run_logged(t, &mut planner, &cfg, &mut |tick, plan| {
        if plan.is_empty() {
            return;
        }
        let _ = write!(out, "tick {tick}:");
        for g in &plan.promote {
            let _ = write!(out, " +{}", g.0);
        }
        for g in &plan.demote {
            let _ = write!(out, " -{}", g.0);
        }
        out.push('\n');
    })
    .expect("run");
    let _ = writeln!(
        out,
        "hits {} of {}; moves {}; pingpong pages {}; violations {}",
        r.hits, r.accesses, r.moves, r.pingpong_pages, r.plan_violations
    );
    out
}

#[test]
fn plans_match_expected_outputs() {
    let bless = std::env::var_os("VMTIER_BLESS").is_some();
    let dir = traces_dir();
    let mut failures = Vec::new();
    let mut checked = 0;
    for &(name, file, keep) in SMALL {
        let path = dir.join(file);
        if bless {
            if let Some(spec) = small_specs(name) {
                gen::generate(&spec)
                    .expect("gen")
                    .write_path(&path)
                    .expect("write");
            }
        }
        let mut t = match Trace::read_path(&path) {
            Ok(t) => t,
            Err(e) if small_specs(name).is_none() && !path.exists() => {
                eprintln!("skipping {name}: {e} (record it with tests/traces/record.sh)");
                continue;
            }
            Err(e) => panic!("{}: {e}", path.display()),
        };
        t.accesses.truncate(keep);
        t.markers.retain(|m| m.at < keep as u64);
        let mut names: Vec<&str> = vec!["oracle"];
        names.extend(vmtier_policies::registry::REGISTRY.iter().map(|e| e.name));
        for policy in names {
            let got = render(&t, policy);
            let want_path = dir.join("expected").join(format!("{name}.{policy}.txt"));
            if bless {
                std::fs::create_dir_all(want_path.parent().expect("parent")).expect("mkdir");
                std::fs::write(&want_path, &got).expect("bless");
                continue;
            }
            checked += 1;
            match std::fs::read_to_string(&want_path) {
                Ok(want) if want == got => {}
                Ok(want) => {
                    let line = want
                        .lines()
                        .zip(got.lines())
                        .position(|(a, b)| a != b)
                        .unwrap_or(want.lines().count().min(got.lines().count()));
                    failures.push(format!(
                        "{}: first difference at line {}",
                        want_path.display(),
                        line + 1
                    ));
                }
                Err(e) => failures.push(format!("{}: {e}", want_path.display())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "plans changed (VMTIER_BLESS=1 to accept):\n{}",
        failures.join("\n")
    );
    assert!(bless || checked > 0);
}
