//! DAMOS-like policy: DAMON-based operation schemes (Linux `mm/damon`, described in
//! shared/guide/anchors.md). Two schemes on DAMON's adaptive regions: `migrate_hot` (regions
//! accessed in at least `hot_min_permille` of the samples, for at least `hot_min_age` ticks,
//! move to the fast node, most accessed first) and `migrate_cold` (regions with at most
//! `cold_max_nr` accesses for at least `cold_min_age` ticks, oldest first), each under a quota,
//! with a `node_mem_used_bp`-style goal that keeps the fast node's use at `goal_permille` of
//! the budget: the cold scheme demotes only as much as the hot scheme and the goal need.

use serde::{Deserialize, Serialize};
use vmtier_core::policy::{Granule, PlacementPolicy, Plan, PolicyInput, Region, TrackingSource};

use crate::select;

/// Parameters of the DAMOS model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `migrate_hot` access pattern: minimum accesses, permille of samples per tick.
    pub hot_min_permille: u32,
    /// `migrate_hot` access pattern: minimum age in ticks.
    pub hot_min_age: u16,
    /// `migrate_cold` access pattern: maximum accesses per tick.
    pub cold_max_nr: u16,
    /// `migrate_cold` access pattern: minimum age in ticks.
    pub cold_min_age: u16,
    /// Quota goal: fast-node use, permille of the budget.
    pub goal_permille: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            hot_min_permille: 200,
            hot_min_age: 1,
            cold_max_nr: 0,
            cold_min_age: 3,
            goal_permille: 1000,
        }
    }
}

/// The DAMOS model (no per-granule state; regions come from the source).
#[derive(Clone, Debug)]
pub struct Damos {
    cfg: Config,
}

impl Damos {
    /// A model with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self { cfg }
    }
}

fn granules(r: &Region) -> impl Iterator<Item = Granule> {
    (r.start.0..r.start.0.saturating_add(r.len)).map(Granule)
}

impl PlacementPolicy for Damos {
    fn name(&self) -> &'static str {
        "damos"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::DamonRegions
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        let samples = u32::from(input.max_observed.max(1));
        let hot_min = (samples * self.cfg.hot_min_permille).div_ceil(1000).max(1);
        let mut hot: Vec<&Region> = input
            .regions
            .iter()
            .filter(|r| u32::from(r.nr_accesses) >= hot_min && r.age >= self.cfg.hot_min_age)
            .collect();
        hot.sort_by_key(|r| (std::cmp::Reverse(r.nr_accesses), std::cmp::Reverse(r.age)));
        let mut cold: Vec<&Region> = input
            .regions
            .iter()
            .filter(|r| r.nr_accesses <= self.cfg.cold_max_nr && r.age >= self.cfg.cold_min_age)
            .collect();
        cold.sort_by_key(|r| (r.nr_accesses, std::cmp::Reverse(r.age)));

        let fast_used = input.fast_used();
        let goal = input.fast_budget * u64::from(self.cfg.goal_permille.min(1000)) / 1000;
        let quota = usize::try_from(input.max_moves).unwrap_or(usize::MAX);
        let is_fast = |g: &Granule| input.records.get(g.index()).is_some_and(|r| r.is_fast());
        let promote: Vec<Granule> = hot
            .iter()
            .flat_map(|r| granules(r))
            .filter(|g| !is_fast(g))
            .take(quota)
            .collect();
        let room = goal.saturating_sub(fast_used) as usize;
        let need = promote.len().saturating_sub(room) + fast_used.saturating_sub(goal) as usize;
        let mut demote: Vec<Granule> = cold
            .iter()
            .flat_map(|r| granules(r))
            .filter(is_fast)
            .take(need.min(quota))
            .collect();
        let over = fast_used.saturating_sub(input.fast_budget) as usize;
        if demote.len() < over {
            demote = select::coldest_fast(input.records, over as u64);
        }
        select::fit(input, &Plan { promote, demote })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::{HeatRecord, Tier};

    #[test]
    fn hot_regions_promoted_cold_regions_make_room() {
        let r = vec![
            HeatRecord::new(0, Tier::Slow, 3),
            HeatRecord::new(0, Tier::Slow, 3),
            HeatRecord::new(0, Tier::Fast, 3),
            HeatRecord::new(0, Tier::Fast, 3),
        ];
        let regions = [
            Region {
                start: Granule(0),
                len: 2,
                nr_accesses: 8,
                age: 2,
            },
            Region {
                start: Granule(2),
                len: 1,
                nr_accesses: 0,
                age: 5,
            },
            Region {
                start: Granule(3),
                len: 1,
                nr_accesses: 5,
                age: 5,
            },
        ];
        let mut input = PolicyInput::from_records(0, 4096, &r, 3, 10);
        input.regions = &regions;
        input.max_observed = 8;
        let plan = Damos::new(Config::default()).plan(&input);
        assert_eq!(plan.promote, vec![Granule(0), Granule(1)]);
        assert_eq!(plan.demote, vec![Granule(2)]);
    }
}
