//! Property tests over random inputs (a fixed table of seeds, so failures reproduce): every
//! policy keeps the fast tier within budget and the plan within the move limit, plans no
//! granule twice, promotes only slow and demotes only fast granules; on generated traces the
//! oracle's hit ratio is at least every policy's.

#![allow(clippy::cast_possible_truncation)] // random values drawn below small bounds

use std::collections::HashSet;

use vmtier_core::policy::{Granule, HeatRecord, HintFault, PolicyInput, Region, Tier};
use vmtier_policies::registry::REGISTRY;
use vmtier_sim::gen::{self, Kind, Spec};
use vmtier_sim::rng::Rng;
use vmtier_sim::sim::{self, Config, Planner};

struct Case {
    records: Vec<HeatRecord>,
    observed: Vec<u16>,
    faults: Vec<HintFault>,
    regions: Vec<Region>,
    budget: u64,
    max_moves: u64,
}

fn random_case(seed: u64) -> Case {
    let mut rng = Rng::new(seed);
    let n = 1 + rng.below(600) as usize;
    let fast_share = rng.below(101);
    let records: Vec<HeatRecord> = (0..n)
        .map(|_| {
            let tier = if rng.below(100) < fast_share {
                Tier::Fast
            } else {
                Tier::Slow
            };
            HeatRecord::new(rng.below(32) as u8, tier, rng.below(4) as u8)
        })
        .collect();
    let observed = (0..n).map(|_| rng.below(9) as u16).collect();
    let faults = (0..rng.below(2 * n as u64))
        .map(|_| HintFault {
            granule: Granule(rng.below(n as u64) as u32),
            latency_millitick: rng.below(3000) as u32,
        })
        .collect();
    let mut regions = Vec::new();
    let mut start = 0u32;
    while (start as usize) < n {
        let len = (1 + rng.below(50) as u32).min(n as u32 - start);
        regions.push(Region {
            start: Granule(start),
            len,
            nr_accesses: rng.below(9) as u16,
            age: rng.below(10) as u16,
        });
        start += len;
    }
    Case {
        records,
        observed,
        faults,
        regions,
        budget: rng.below(n as u64 + 10),
        max_moves: rng.below(n as u64 + 5),
    }
}

#[test]
fn plans_respect_budget_moves_and_tiers() {
    for seed in 0..300u64 {
        let c = random_case(seed);
        for e in REGISTRY {
            let mut p = (e.build)(None).expect("build");
            for tick in 0..3u64 {
                let input = PolicyInput {
                    tick,
                    granule_bytes: 4096,
                    records: &c.records,
                    fast_budget: c.budget,
                    max_moves: c.max_moves,
                    observed: &c.observed,
                    max_observed: 8,
                    hint_faults: &c.faults,
                    regions: &c.regions,
                    hints: &[],
                    max_gain: 16,
                    split: &[],
                    huge: None,
                };
                let plan = p.plan(&input);
                let ctx = format!("{} seed {seed} tick {tick}", e.name);
                assert!(plan.moves() as u64 <= c.max_moves, "{ctx}: too many moves");
                let mut seen = HashSet::new();
                for g in plan.promote.iter().chain(&plan.demote) {
                    assert!(seen.insert(*g), "{ctx}: {g:?} planned twice");
                }
                assert!(
                    plan.promote.iter().all(|g| !c.records[g.index()].is_fast()),
                    "{ctx}"
                );
                assert!(
                    plan.demote.iter().all(|g| c.records[g.index()].is_fast()),
                    "{ctx}"
                );
                let used = input.fast_used();
                let after = used + plan.promote.len() as u64 - plan.demote.len() as u64;
                assert!(
                    after <= c.budget.max(used),
                    "{ctx}: fast {after} > budget {}",
                    c.budget
                );
                if used > c.budget {
                    assert!(
                        after < used || plan.moves() as u64 == c.max_moves,
                        "{ctx}: over budget and not shrinking"
                    );
                }
            }
        }
    }
}

#[test]
fn oracle_beats_every_policy_on_generated_traces() {
    let cfg = Config {
        tick_accesses: 4_000,
        heatmap_rows: 0,
        ..Config::default()
    };
    for (i, kind) in Kind::ALL.into_iter().enumerate() {
        for seed in [1u64, 2] {
            let t = gen::generate(&Spec {
                kind,
                pages: 1024,
                accesses: 40_000,
                seed: seed + i as u64 * 10,
                ..Spec::default()
            })
            .expect("gen");
            let oracle = sim::run(&t, &mut Planner::Oracle, &cfg).expect("oracle");
            assert_eq!(oracle.plan_violations, 0);
            for e in REGISTRY {
                let r = sim::run(&t, &mut Planner::by_name(e.name, &cfg).expect("p"), &cfg)
                    .expect("run");
                assert!(
                    r.hit_ratio <= oracle.hit_ratio + 1e-12,
                    "{} {:.4} > oracle {:.4} on {kind:?} seed {seed}",
                    e.name,
                    r.hit_ratio,
                    oracle.hit_ratio
                );
                assert_eq!(r.plan_violations, 0, "{} on {kind:?}", e.name);
            }
        }
    }
}
