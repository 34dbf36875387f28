//! TPP (Maruf et al., ASPLOS'23), rebuilt from its published description
//! (shared/guide/anchors.md): hint faults on slow-tier pages, but a page is promoted only if it
//! is *active*. A hint fault on an inactive page only marks it accessed (activates it), so a
//! page needs two faults — two accesses a scan apart — before it moves, and one stray touch
//! does not promote it. A page stays active until it is promoted: a promotion refused by the
//! rate limit is retried at the next fault, without a new activation; one left out for want
//! of the simulator's moves (the kernel promotes at the fault) is deferred to the next ticks,
//! as in [`crate::numab`]. The top tier's demotion watermark is decoupled from the allocation
//! watermark, so reclaim keeps a free headroom proactively (with moves promotions leave
//! over), and demotes exactly what this tick's promotions need beyond it
//! ([`crate::numab::make_room`]).

use serde::{Deserialize, Serialize};
use vmtier_core::policy::{PlacementPolicy, Plan, PolicyInput, TrackingSource};

use crate::numab::{make_room, rate_limit_granules, Deferred};

/// Parameters of the TPP model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Free headroom the demotion watermark keeps, permille of the budget.
    pub demote_watermark_permille: u32,
    /// Promotion rate limit in MB/s.
    pub promote_rate_limit_mb_s: u64,
    /// Nominal tick length for the rate limit.
    pub tick_ms: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            demote_watermark_permille: 20,
            promote_rate_limit_mb_s: 65536,
            tick_ms: 1000,
        }
    }
}

/// The TPP model. State: one "faulted before" bit per granule (1/8 byte), and the deferred
/// promotions.
#[derive(Clone, Debug)]
pub struct Tpp {
    cfg: Config,
    active: Vec<u64>,
    deferred: Deferred,
}

impl Tpp {
    /// A model with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            active: Vec::new(),
            deferred: Deferred::default(),
        }
    }
}

impl PlacementPolicy for Tpp {
    fn name(&self) -> &'static str {
        "tpp"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::HintFaults
    }

    fn state_bytes(&self) -> u64 {
        (self.active.len() * 8) as u64 + self.deferred.bytes()
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        let words = input.records.len().div_ceil(64);
        if self.active.len() != words {
            self.active.resize(words, 0);
        }
        let limit = rate_limit_granules(input, self.cfg.promote_rate_limit_mb_s, self.cfg.tick_ms);
        let mut promote = Vec::new();
        let mut taken = std::collections::HashSet::new();
        for f in input.hint_faults {
            let i = f.granule.index();
            if !input.records.get(i).is_some_and(|r| !r.is_fast()) {
                continue;
            }
            let (w, bit) = (i / 64, 1u64 << (i % 64));
            if self.active[w] & bit == 0 {
                self.active[w] |= bit;
            } else if (promote.len() as u64) < limit && taken.insert(f.granule) {
                promote.push(f.granule);
            }
        }
        let headroom = input
            .fast_budget
            .saturating_mul(u64::from(self.cfg.demote_watermark_permille.min(1000)))
            / 1000;
        let plan = make_room(input, promote.clone(), headroom);
        let plan = self.deferred.top_up(input, plan, &promote, headroom);
        // Only a page that really moves leaves the slow tier's active list.
        for g in &plan.promote {
            let i = g.index();
            self.active[i / 64] &= !(1u64 << (i % 64));
        }
        plan
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use vmtier_core::policy::{Granule, HeatRecord, HintFault, Tier};

    #[test]
    fn promotes_on_the_second_fault_and_a_dropped_promotion_stays_active() {
        // Granules 0..3 slow, 3 fast; 1 MiB granules at 1 MB/s: one promotion per tick.
        let mut r = vec![HeatRecord::default(); 4];
        r[3] = HeatRecord::new(0, Tier::Fast, 3);
        let mut p = Tpp::new(Config {
            promote_rate_limit_mb_s: 1,
            demote_watermark_permille: 0,
            ..Config::default()
        });
        // (step, faulting granules, budget, moves, promoted)
        let steps: Vec<(&str, Vec<u32>, u64, u64, Vec<u32>)> = vec![
            ("first fault activates only", vec![0], 1, 10, vec![]),
            ("active, but a swap needs two moves", vec![0], 1, 1, vec![]),
            (
                "deferred, but a deferred page never displaces a resident",
                vec![],
                1,
                10,
                vec![],
            ),
            (
                "still active: promoted at the next fault",
                vec![0],
                1,
                10,
                vec![0],
            ),
            ("two first faults", vec![1, 2], 3, 10, vec![]),
            ("rate limit: one of two", vec![1, 2], 3, 10, vec![1]),
            ("a refused one is not deferred", vec![], 3, 10, vec![]),
            ("but still active", vec![2], 3, 10, vec![2]),
        ];
        for (tick, (step, faulting, budget, moves, want)) in steps.into_iter().enumerate() {
            let faults: Vec<_> = faulting
                .iter()
                .map(|&g| HintFault {
                    granule: Granule(g),
                    latency_millitick: 1,
                })
                .collect();
            let mut input = PolicyInput::from_records(tick as u64, 1 << 20, &r, budget, moves);
            input.hint_faults = &faults;
            let plan = p.plan(&input);
            let e = plan.enforce(&r, budget, moves);
            assert_eq!(e.deferred + e.invalid, 0, "{step}");
            assert_eq!(
                e.promote.iter().map(|g| g.0).collect::<Vec<_>>(),
                want,
                "{step}"
            );
            for g in &e.demote {
                r[g.index()] = r[g.index()].moved_to(Tier::Slow);
            }
            for g in &e.promote {
                r[g.index()] = r[g.index()].moved_to(Tier::Fast);
            }
        }
        // Granule 3 was demoted for granule 0; its bit was never set.
        assert_eq!(p.active[0], 0);
        assert_eq!(p.state_bytes(), 8);
    }
}
