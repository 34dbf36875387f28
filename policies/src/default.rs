//! vmtier's default policy, the one `vmtierd` runs.
//!
//! Hottest granules in DRAM up to the budget; when over budget the coldest are demoted first;
//! when under, hot slow-tier granules are promoted; when full, a slow granule displaces a fast
//! one only if it is hotter by a margin. Two hysteresis rules keep granules from ping-ponging:
//! the heat margin, and a granule that moved in the last `min_move_age` ticks stays put unless
//! the budget forces it out ([`HeatRecord::move_age`]). A granule is the unit of migration, so
//! a 2 MiB huge page is moved whole.
//!
//! It keeps no per-granule state of its own: its input is the engine's one-byte
//! [`HeatRecord`] per granule, and planning is two linear passes plus O(32) arithmetic
//! ([`crate::select`]). Guest hints, when present, rank the hinted granules: a hot hint
//! raises the heat to `hot_hint_heat` (a pinned one to the maximum) scaled by the hint's
//! weight, a cold or free one clears it; and whatever the policy demotes, free-hinted granules
//! go first. The engine hands hints over already checked, trust-weighted and capped to a
//! share of the budget (docs/daemon.md), and the budget is enforced after the plan whatever
//! the hints say.
//!
//! Sources for the design: the heat-sorted placement of vTMM (EuroSys'23: temperature buckets,
//! fast pool up to a budget) and Memtis (SOSP'23: a hot threshold sized so the hot set fits the
//! fast tier), with migration cost kept down as the Cloud Hypervisor issue 7574 report asks
//! (see shared/guide/anchors.md).

use serde::{Deserialize, Serialize};
use vmtier_core::policy::{
    HeatRecord, HintKind, PlacementPolicy, Plan, PolicyInput, TrackingSource,
};

use crate::select::{self, Rules, BUCKETS};

/// Parameters of the default policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Slow granules colder than this heat (0..=31) are never promoted.
    pub promote_min_heat: u8,
    /// A slow granule displaces a fast one only if hotter by at least this much (for a
    /// source whose tick can give the full gain of 16; scaled to weaker ones, so soft-dirty's
    /// 3 per tick gets a margin of 2: [`PolicyInput::scaled_heat`]).
    pub swap_margin: u8,
    /// ... and only if at least this hot (0..=31; default 0, off). Above 16 — more than one
    /// hot observation window can give — only a granule seen hot in consecutive ticks
    /// displaces another, so a one-off pass over memory (a scan, a checksum sweep) fills free
    /// DRAM at most but never churns what is resident. It costs hit ratio where a steady
    /// lukewarm tail matters (docs/policies.md).
    pub swap_min_heat: u8,
    /// Ticks a granule stays put after a move (0..=3) unless the budget forces it out.
    pub min_move_age: u8,
    /// Heat (0..=31) given to granules in a guest's hot hint of full weight (scaled by the
    /// weight; a pinned hint gets 31 scaled); 0 ignores hints. Default 20: a hinted granule
    /// is promoted into free room at once and displaces resident granules up to heat 12
    /// (`swap_margin` below it). Hints exist only for VMs with `[vm.hints]`.
    pub hot_hint_heat: u8,
    /// Free DRAM kept for fast reaction, permille of the budget: cold (below
    /// `promote_min_heat`) settled granules are demoted with moves left over in a tick.
    pub headroom_permille: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            promote_min_heat: 4,
            swap_margin: 8,
            swap_min_heat: 0,
            min_move_age: 3,
            hot_hint_heat: 20,
            headroom_permille: 0,
        }
    }
}

/// The default policy.
#[derive(Clone, Debug, Default)]
pub struct DefaultPolicy {
    cfg: Config,
}

impl DefaultPolicy {
    /// A default policy with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self { cfg }
    }
}

/// Walks the hints (sorted by start) alongside the address-ordered granule scan.
struct HintCursor<'a> {
    hints: Vec<&'a vmtier_core::policy::GuestHint>,
    next: usize,
    hot_heat: u8,
}

impl<'a> HintCursor<'a> {
    fn new(input: &'a PolicyInput<'_>, hot_heat: u8) -> Self {
        let mut hints: Vec<_> = input.hints.iter().collect();
        hints.sort_by_key(|h| h.start);
        Self {
            hints,
            next: 0,
            hot_heat,
        }
    }

    /// The hint over granule `i`, if any (`i` must not decrease between calls).
    fn at(&mut self, i: usize) -> Option<&'a vmtier_core::policy::GuestHint> {
        while let Some(h) = self.hints.get(self.next) {
            let end = u64::from(h.start.0) + u64::from(h.len);
            if (i as u64) < end {
                break;
            }
            self.next += 1;
        }
        self.hints
            .get(self.next)
            .copied()
            .filter(|h| h.start.index() <= i)
    }

    fn key(&mut self, i: usize, r: HeatRecord) -> u8 {
        if self.hints.is_empty() {
            return r.heat();
        }
        let hot_heat = self.hot_heat;
        match self.at(i) {
            Some(h) => match h.kind {
                HintKind::Hot => r.heat().max(weighted(hot_heat, h.weight)),
                HintKind::Pinned => r.heat().max(weighted(HeatRecord::MAX_HEAT, h.weight)),
                HintKind::Cold | HintKind::Free => 0,
            },
            None => r.heat(),
        }
    }
}

/// `heat` scaled by `weight`/255, rounded up.
fn weighted(heat: u8, weight: u8) -> u8 {
    let v = (u16::from(heat) * u16::from(weight)).div_ceil(255);
    u8::try_from(v).unwrap_or(HeatRecord::MAX_HEAT)
}

/// Reorders the plan's demotions so that settled fast granules under a free hint go first:
/// as many demotions as the policy planned, free ones before any other.
fn free_first(input: &PolicyInput<'_>, min_move_age: u8, plan: &mut Plan) {
    let n = plan.demote.len();
    if n == 0 || !input.hints.iter().any(|h| h.kind == HintKind::Free) {
        return;
    }
    let mut out = Vec::with_capacity(n);
    'hints: for h in input.hints.iter().filter(|h| h.kind == HintKind::Free) {
        for i in h.start.0..h.start.0.saturating_add(h.len) {
            if out.len() == n {
                break 'hints;
            }
            let Some(r) = input.records.get(i as usize) else {
                break;
            };
            if r.is_fast() && r.move_age() >= min_move_age {
                out.push(vmtier_core::policy::Granule(i));
            }
        }
    }
    if out.is_empty() {
        return;
    }
    let mut chosen: Vec<u32> = out.iter().map(|g| g.0).collect();
    chosen.sort_unstable();
    for g in &plan.demote {
        if out.len() == n {
            break;
        }
        if chosen.binary_search(&g.0).is_err() {
            out.push(*g);
        }
    }
    plan.demote = out;
}

impl PlacementPolicy for DefaultPolicy {
    fn name(&self) -> &'static str {
        "default"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::AbitScan
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        // Margins are for a full-range source; a weaker one (soft-dirty: 3 per tick) gets
        // them scaled to its range, or its granules could never displace anything.
        let rules = Rules {
            min_promote: self.cfg.promote_min_heat,
            margin: input.scaled_heat(self.cfg.swap_margin),
            swap_min: input.scaled_heat(self.cfg.swap_min_heat),
            demote_below: BUCKETS as u8,
            demote_cold_always: false,
            min_move_age: self.cfg.min_move_age,
            headroom: input
                .fast_budget
                .saturating_mul(u64::from(self.cfg.headroom_permille.min(1000)))
                / 1000,
        };
        let use_hints = self.cfg.hot_hint_heat > 0 && !input.hints.is_empty();
        if !use_hints {
            return select::plan_by_key(input, &rules, |_, r| r.heat());
        }
        let mut a = HintCursor::new(input, self.cfg.hot_hint_heat);
        let h = select::histogram(input.records, rules.min_move_age, |i, r| a.key(i, r));
        let q = select::quotas(&h, input.fast_budget, input.max_moves, &rules);
        let mut b = HintCursor::new(input, self.cfg.hot_hint_heat);
        let mut plan = select::collect(input.records, rules.min_move_age, |i, r| b.key(i, r), q);
        free_first(input, rules.min_move_age, &mut plan);
        select::fit(input, &plan)
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use vmtier_core::policy::{Granule, GuestHint, Tier};

    #[test]
    fn default_policy_table() {
        use Tier::{Fast as F, Slow as S};
        let s = HeatRecord::SETTLED;
        // (records (heat, tier, age), budget, promote, demote)
        let cases: Vec<(Vec<(u8, Tier, u8)>, u64, Vec<u32>, Vec<u32>)> = vec![
            (
                vec![(30, S, s), (1, S, s), (10, S, s)],
                5,
                vec![0, 2],
                vec![],
            ),
            (vec![(30, S, s), (1, F, s)], 1, vec![0], vec![1]),
            (vec![(30, S, s), (1, F, 1)], 1, vec![], vec![]),
            (vec![(12, S, s), (10, F, s)], 1, vec![], vec![]),
            (vec![(12, F, 0), (10, F, s)], 1, vec![], vec![1]),
        ];
        for (spec, budget, promote, demote) in cases {
            let r: Vec<_> = spec
                .iter()
                .map(|&(h, t, a)| HeatRecord::new(h, t, a))
                .collect();
            let input = PolicyInput::from_records(0, 4096, &r, budget, 100);
            let plan = DefaultPolicy::default().plan(&input);
            let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
            assert_eq!(
                (ids(&plan.promote), ids(&plan.demote)),
                (promote, demote),
                "{spec:?}"
            );
        }
    }

    #[test]
    fn hints_raise_and_clear_heat() {
        let r = vec![
            HeatRecord::new(1, Tier::Slow, 3),
            HeatRecord::new(20, Tier::Slow, 3),
            HeatRecord::new(0, Tier::Fast, 3),
        ];
        let hints = [
            GuestHint {
                start: Granule(0),
                len: 1,
                kind: HintKind::Hot,
                weight: 255,
            },
            GuestHint {
                start: Granule(1),
                len: 1,
                kind: HintKind::Cold,
                weight: 255,
            },
        ];
        let mut input = PolicyInput::from_records(0, 4096, &r, 1, 10);
        input.hints = &hints;
        let mut p = DefaultPolicy::new(Config {
            hot_hint_heat: 25,
            ..Config::default()
        });
        let plan = p.plan(&input);
        assert_eq!(plan.promote, vec![Granule(0)]);
        assert_eq!(plan.demote, vec![Granule(2)]);
    }

    fn hint(start: u32, len: u32, kind: HintKind, weight: u8) -> GuestHint {
        GuestHint {
            start: Granule(start),
            len,
            kind,
            weight,
        }
    }

    #[test]
    fn hint_kinds_and_weights_rank_granules() {
        use HintKind::{Cold, Free, Hot, Pinned};
        use Tier::{Fast as F, Slow as S};
        let s = HeatRecord::SETTLED;
        // (records (heat, tier), budget, moves, hints, promote, demote)
        let cases: Vec<(
            &str,
            Vec<(u8, Tier)>,
            u64,
            Vec<GuestHint>,
            Vec<u32>,
            Vec<u32>,
        )> = vec![
            (
                "a cold slow granule with a hot hint is promoted into room",
                vec![(0, S), (0, S)],
                1,
                vec![hint(1, 1, Hot, 255)],
                vec![1],
                vec![],
            ),
            (
                "a weak hot hint stays below promote_min_heat",
                vec![(0, S)],
                1,
                vec![hint(0, 1, Hot, 20)],
                vec![],
                vec![],
            ),
            (
                "a full hot hint displaces a lukewarm resident (20 >= 10 + 8)",
                vec![(10, F), (0, S)],
                1,
                vec![hint(1, 1, Hot, 255)],
                vec![1],
                vec![0],
            ),
            (
                "but not a hot one (20 < 14 + 8)",
                vec![(14, F), (0, S)],
                1,
                vec![hint(1, 1, Hot, 255)],
                vec![],
                vec![],
            ),
            (
                "pinned outranks hot",
                vec![(0, S), (0, S)],
                1,
                vec![hint(0, 1, Hot, 255), hint(1, 1, Pinned, 255)],
                vec![1],
                vec![],
            ),
            (
                "pinned displaces a hot resident (31 >= 20 + 8)",
                vec![(20, F), (0, S)],
                1,
                vec![hint(1, 1, Pinned, 255)],
                vec![1],
                vec![0],
            ),
            (
                "free granules are demoted before colder unhinted ones",
                vec![(0, F), (3, F), (3, F), (30, S)],
                3,
                vec![hint(1, 2, Free, 255)],
                vec![3],
                vec![1],
            ),
            (
                "a cold hint makes a hot resident the victim",
                vec![(25, F), (20, S)],
                1,
                vec![hint(0, 1, Cold, 255)],
                vec![1],
                vec![0],
            ),
        ];
        for (name, spec, budget, hints, promote, demote) in cases {
            let r: Vec<_> = spec
                .iter()
                .map(|&(h, t)| HeatRecord::new(h, t, s))
                .collect();
            let mut input = PolicyInput::from_records(0, 4096, &r, budget, 100);
            input.hints = &hints;
            let plan = DefaultPolicy::default().plan(&input);
            let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
            assert_eq!(
                (ids(&plan.promote), ids(&plan.demote)),
                (promote, demote),
                "{name}"
            );
        }
    }

    #[test]
    fn hints_claiming_everything_never_exceed_the_budget() {
        // A flooding guest: every granule pinned at full weight, the VM already at its
        // budget, then the budget cut. The enforced plan never leaves DRAM over budget.
        let n = 512u32;
        for (fast, budget) in [(0u32, 64u64), (64, 64), (200, 64), (64, 0)] {
            let r: Vec<_> = (0..n)
                .map(|i| {
                    let t = if i < fast { Tier::Fast } else { Tier::Slow };
                    HeatRecord::new((i % 32) as u8, t, HeatRecord::SETTLED)
                })
                .collect();
            let hints = [hint(0, n, HintKind::Pinned, 255)];
            let mut input = PolicyInput::from_records(0, 4096, &r, budget, 1000);
            input.hints = &hints;
            let plan = DefaultPolicy::default().plan(&input);
            let e = plan.enforce(&r, budget, 1000);
            let after = u64::from(fast) - e.demote.len() as u64 + e.promote.len() as u64;
            assert!(
                after <= budget,
                "{fast} fast, budget {budget}: {after} after the plan"
            );
        }
    }
}
