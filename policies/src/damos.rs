//! DAMOS-like policy: DAMON-based operation schemes (Linux `mm/damon`, described in
//! shared/guide/anchors.md; semantics of Linux 6.12 `mm/damon/core.c` and `paddr.c`, quota
//! goals as in 6.16). Two schemes on DAMON's adaptive regions, each with **its own quota**
//! (the kernel's per-scheme `quota_space`; here a share of the tick's moves,
//! `hot_quota_permille` for `migrate_hot`, the rest for `migrate_cold`), both applied in
//! every interval, so neither starves the other:
//!
//! - `migrate_hot`: regions accessed in at least `hot_min_permille` of the samples for at
//!   least `hot_min_age` ticks move to the fast node, most accessed first (the quota goes to
//!   the highest-priority regions). The kernel allocates on the target node without reclaim,
//!   so a promotion only lands in free memory — memory the cold scheme frees in the same
//!   interval included — and a `node_mem_used_bp`-style goal stops it at `goal_permille` of
//!   the budget.
//! - `migrate_cold`: regions with at most `cold_max_nr` accesses for at least `cold_min_age`
//!   ticks move to the slow node, oldest first, as much as the goal needs: fast-node use after
//!   this interval's promotions held to `goal_permille` of the budget (the steady state of
//!   the kernel's goal-tuned effective quota).

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
    /// `migrate_hot`'s quota, permille of the tick's moves; `migrate_cold` has the rest.
    pub hot_quota_permille: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            hot_min_permille: 200,
            hot_min_age: 1,
            cold_max_nr: 0,
            cold_min_age: 3,
            goal_permille: 1000,
            hot_quota_permille: 500,
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
        let hot_min = (samples * self.cfg.hot_min_permille.min(1000))
            .div_ceil(1000)
            .max(1);
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
        let goal = input
            .fast_budget
            .saturating_mul(u64::from(self.cfg.goal_permille.min(1000)))
            / 1000;
        // The hot scheme's share of the moves, its fraction carried from tick to tick so an
        // odd move alternates between the schemes.
        let share = |t: u64| {
            let q = u128::from(input.max_moves)
                * u128::from(self.cfg.hot_quota_permille.min(1000))
                * u128::from(t);
            q / 1000
        };
        let quota_at = |t: u64| {
            u64::try_from(share(t + 1) - share(t))
                .unwrap_or(u64::MAX)
                .min(input.max_moves)
        };
        let hot_quota = quota_at(input.tick);
        let cold_quota = input.max_moves - hot_quota;
        let is_fast = |g: &Granule| input.records.get(g.index()).is_some_and(|r| r.is_fast());
        let take = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let next_hot = quota_at(input.tick + 1);
        let mut promote: Vec<Granule> = hot
            .iter()
            .flat_map(|r| granules(r))
            .filter(|g| !is_fast(g))
            .take(take(hot_quota.saturating_add(next_hot)))
            .collect();
        let wanted_next = (promote.len() as u64).saturating_sub(hot_quota);
        promote.truncate(take(hot_quota));
        // The cold scheme frees room for this interval's promotions, and ahead for what the
        // next interval's hot quota wants beyond its cold quota (an odd move alternates).
        let ahead = wanted_next.saturating_sub(input.max_moves - next_hot);
        let need = (fast_used + promote.len() as u64 + ahead).saturating_sub(goal);
        let mut demote: Vec<Granule> = cold
            .iter()
            .flat_map(|r| granules(r))
            .filter(is_fast)
            .take(take(need.min(cold_quota)))
            .collect();
        // A budget cut below use is a hard limit: the engine forces the coldest out anyway.
        let over = fast_used.saturating_sub(input.fast_budget);
        if (demote.len() as u64) < over {
            demote = select::coldest_fast(input.records, over);
        }
        // What lands: free memory below the goal, after this interval's demotions.
        let room = (goal + demote.len() as u64).saturating_sub(fast_used);
        promote.truncate(take(room));
        select::fit(input, &Plan { promote, demote })
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use vmtier_core::policy::{HeatRecord, Tier};

    /// Granules 0..10 slow in a hot region, 10..15 fast in a cold one, 15..20 fast and warm.
    fn setup() -> (Vec<HeatRecord>, [Region; 3]) {
        let r = (0..20)
            .map(|i| HeatRecord::new(0, if i < 10 { Tier::Slow } else { Tier::Fast }, 3))
            .collect();
        let region = |start, len, nr_accesses, age| Region {
            start: Granule(start),
            len,
            nr_accesses,
            age,
        };
        (
            r,
            [
                region(0, 10, 8, 2),
                region(10, 5, 0, 5),
                region(15, 5, 5, 5),
            ],
        )
    }

    fn ids(v: &[Granule]) -> Vec<u32> {
        v.iter().map(|g| g.0).collect()
    }

    #[test]
    fn hot_and_cold_schemes_both_act_in_one_interval_under_their_quotas() {
        let (r, regions) = setup();
        // (case, goal permille, budget, moves, promoted, demoted)
        let cases: Vec<(&str, u32, u64, u64, Vec<u32>, Vec<u32>)> = vec![
            (
                "full: half the moves each, a swap per pair",
                1000,
                10,
                10,
                vec![0, 1, 2, 3, 4],
                vec![10, 11, 12, 13, 14],
            ),
            (
                "room: the hot scheme stops at its own quota, the cold one has nothing to do",
                1000,
                20,
                10,
                vec![0, 1, 2, 3, 4],
                vec![],
            ),
            (
                "a goal below the budget: the cold scheme keeps memory free",
                800,
                10,
                10,
                vec![0, 1, 2],
                vec![10, 11, 12, 13, 14],
            ),
            (
                "nothing cold enough: promotions fail on a full node",
                1000,
                10,
                2,
                vec![],
                vec![],
            ),
        ];
        for (name, goal_permille, budget, moves, promote, demote) in cases {
            let regions = if name.starts_with("nothing") {
                vec![
                    regions[0],
                    Region {
                        nr_accesses: 1,
                        ..regions[1]
                    },
                    regions[2],
                ]
            } else {
                regions.to_vec()
            };
            let mut input = PolicyInput::from_records(0, 4096, &r, budget, moves);
            input.regions = &regions;
            input.max_observed = 8;
            let plan = Damos::new(Config {
                goal_permille,
                ..Config::default()
            })
            .plan(&input);
            assert_eq!(
                (ids(&plan.promote), ids(&plan.demote)),
                (promote, demote),
                "{name}"
            );
            let e = plan.enforce(&r, budget, moves);
            assert_eq!((e.promote, e.demote), (plan.promote, plan.demote), "{name}");
        }
    }

    #[test]
    fn one_move_a_tick_alternates_between_the_schemes() {
        let (mut r, regions) = setup();
        let mut p = Damos::new(Config::default());
        // (promotions, demotions) per tick with a full fast tier and one move per tick.
        let want = [(0, 1), (1, 0), (0, 1), (1, 0)];
        for (tick, want) in want.into_iter().enumerate() {
            let mut input = PolicyInput::from_records(tick as u64, 4096, &r, 10, 1);
            input.regions = &regions;
            input.max_observed = 8;
            let plan = p.plan(&input);
            let e = plan.enforce(&r, 10, 1);
            assert_eq!((e.promote.len(), e.demote.len()), want, "tick {tick}");
            for g in &e.demote {
                r[g.index()] = r[g.index()].moved_to(Tier::Slow);
            }
            for g in &e.promote {
                r[g.index()] = r[g.index()].moved_to(Tier::Fast);
            }
        }
        assert_eq!(r.iter().filter(|x| x.is_fast()).count(), 10);
    }
}
