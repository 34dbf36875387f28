//! vmtier's default policy, the one `vmtierd` runs.
//!
//! Hottest granules in DRAM up to the budget; when over budget the coldest are demoted first;
//! when under, hot slow-tier granules are promoted; when full, a slow granule displaces a fast
//! one only if it is hotter by a margin. Two hysteresis rules keep granules from ping-ponging:
//! the heat margin, and a granule that moved in the last `min_move_age` ticks stays put unless
//! the budget forces it out ([`HeatRecord::move_age`]). A granule is the unit of migration, so
//! a 2 MiB huge page is moved whole.
//!
//! A move must pay back ([`crate::payback`]): where one tick of heat cannot pay back a move
//! (granules above 512 KiB by the `move_pages` cost), slow granules are ranked by the heat
//! they sustained over three ticks, so a touch in one or two ticks (a sweep, a scan) never
//! moves them (two ticks suffice where base pages alone map a granule, or at full gain); and
//! residents in the budget-sized hot bin (Memtis) are never swap victims.
//!
//! Where one tick does pay back a move, it can keep free DRAM for the memory the guest starts
//! using, as much as the new granules of the last two ticks proved worth by the swap rule
//! (room for arrivals, [`Config::room_for_arrivals`], off by default; TPP's free headroom
//! for new allocations, sized by what they turned out to be worth).
//!
//! Its input is the engine's one-byte [`HeatRecord`] per granule; of its own it keeps the
//! two previous ticks' heat where the payback rule applies (2 bytes per granule, none at
//! 4 KiB), and, with the room for arrivals, a bit per granule (seen yet or not) and last
//! tick's first sightings where one tick pays back a move.
//! Planning is two linear passes plus O(32) arithmetic ([`crate::select`]). Guest hints, when present, rank the hinted granules: a hot hint
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

use crate::payback::{self, History};
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
    /// Where one tick of observation cannot pay back a move (granules above 512 KiB: a
    /// 2 MiB move costs 154 times a 4 KiB one), rank slow granules by their *sustained*
    /// heat over three ticks — 0 if not seen this tick — so a touch in one tick or two
    /// running (a sweep, a scan) never moves a granule ([`crate::payback`]; two ticks where
    /// base pages alone map the granule, [`PolicyInput::huge`], or at full gain); not for a region
    /// split to 4 KiB detail ([`PolicyInput::split`]), which moves only its hot pages. Costs
    /// 2 bytes per granule of history there. Default `true` since 2026-11-27: with the store's
    /// byte-weighted heat fold it took the e2e static/thp shape from 114-131 thousand pages
    /// migrated, 46-51 thousand of them back and forth, to 11-12 thousand and none, at the
    /// cost of a 2 MiB granule's first promotion waiting for its third tick (about 2 s later
    /// to 90% of the hot set); `false` ranks by heat alone, without the budget-sized hot bin
    /// (docs/policies.md, "On by default since 2026-11-27").
    pub sustained_heat: bool,
    /// Displacement by worth: the heat margin a slow granule needs over a resident one is
    /// the resident's own heat, between 1 and `swap_margin` ([`select::worth_margin`]), so a
    /// resident that went cold (heat halves every tick it is not seen) is displaced by any
    /// slow granule at twice its heat and at least `promote_min_heat`, while a resident hot
    /// in the last tick keeps the full margin. Only where one tick of heat pays back a move
    /// (granules up to 512 KiB, [`crate::payback`]); larger granules keep the fixed margin.
    /// Default `false` (the fixed margin everywhere): over the suite it trades zipf-like
    /// loads for phased ones (docs/policies.md, "Displacement by worth").
    pub displace_by_worth: bool,
    /// Room for arrivals: keep free DRAM for memory the guest starts using, as much as last
    /// tick's or the tick before's new granules proved worth. A granule seen
    /// for the first time is an *arrival*; one that the next tick reads again at a heat that
    /// would displace a resident seen in no recent tick (`swap_margin` above heat 0, and at
    /// least `promote_min_heat`) is *worthy*. The policy keeps that many granules free, at
    /// most a tick's moves, by demoting settled residents at heat 0 with the moves swaps
    /// leave; of that, up to twice what arrivals took of the room last tick, plus one, goes
    /// before swaps (landing in free DRAM costs an arrival no move, a swap costs two). Only
    /// where one tick of heat pays back a move and can reach the worthy heat (not 2 MiB
    /// granules, not soft-dirty's 3 a tick). Costs 1 bit per granule. Default `false`: over
    /// the suite it lifts GC-like loads (py-gc) a point and costs the traffic target two
    /// cases (docs/policies.md, "Room for arrivals").
    pub room_for_arrivals: bool,
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
            sustained_heat: true,
            displace_by_worth: false,
            room_for_arrivals: false,
        }
    }
}

impl Config {
    /// Whether a slow granule of `granule_bytes` needs sustained heat to be promoted, for a
    /// source whose tick gives at most `max_gain` (16 for DAMON and accessed-bit scans).
    pub fn needs_sustained(&self, granule_bytes: u64, max_gain: u8) -> bool {
        let r = [HeatRecord::default()];
        let mut input = PolicyInput::from_records(0, granule_bytes, &r, 1, 1);
        input.max_gain = max_gain;
        self.sustained_heat && !payback::one_tick_pays(&input, self.promote_min_heat)
    }
}

/// The default policy.
#[derive(Clone, Debug, Default)]
pub struct DefaultPolicy {
    cfg: Config,
    history: History,
    arrivals: Arrivals,
}

/// What the room-for-arrivals rule ([`Config::room_for_arrivals`]) keeps: which granules were
/// ever seen (1 bit each), the granules first seen last tick with their heat then, last
/// tick's count of worthy arrivals, and the fast granules the last plan left.
///
/// TPP (ASPLOS'23) keeps free room in the fast tier because new allocations tend to be hot;
/// a fixed room costs where they are not (zipf tails, scans: `headroom_permille`), so here
/// the room is what the guest's new granules of the last two ticks proved worth by the swap
/// rule, and 0 while it starts using none or only cold ones.
#[derive(Clone, Debug, Default)]
struct Arrivals {
    /// Bit per granule: seen (heat above 0) or in DRAM since the policy started.
    seen: Vec<u64>,
    /// Granules (index, heat) first seen last tick.
    last: Vec<(u32, u8)>,
    /// Worthy arrivals counted last tick.
    worthy_prev: u64,
    /// Fast granules after the last plan, if it was the tick before.
    expect_fast: Option<u64>,
    /// Fast granules now (set by [`Self::update`]).
    fast_now: u64,
    /// Granules tracked, and the tick of the last update.
    len: usize,
    tick: Option<u64>,
}

impl Arrivals {
    fn is_seen(&self, i: usize) -> bool {
        self.seen
            .get(i / 64)
            .is_some_and(|w| (w >> (i % 64)) & 1 == 1)
    }

    fn set_seen(&mut self, i: usize) {
        if let Some(w) = self.seen.get_mut(i / 64) {
            *w |= 1 << (i % 64);
        }
    }

    /// This tick's room and the part of it to make before swaps, `(room, room_first)`, for
    /// arrivals worthy at `worthy_heat`; records this tick's arrivals.
    fn update(&mut self, input: &PolicyInput<'_>, worthy_heat: u8) -> (u64, u64) {
        let r = input.records;
        self.fast_now = r.iter().filter(|x| x.is_fast()).count() as u64;
        let follows = self.tick.and_then(|t| t.checked_add(1)) == Some(input.tick);
        self.tick = Some(input.tick);
        if !follows || self.len != r.len() {
            // Start (or a gap): what is seen or resident now is not new.
            self.len = r.len();
            self.seen = vec![0; r.len().div_ceil(64)];
            for (i, x) in r.iter().enumerate() {
                if x.heat() > 0 || x.is_fast() {
                    self.set_seen(i);
                }
            }
            self.last.clear();
            self.worthy_prev = 0;
            self.expect_fast = None;
            return (0, 0);
        }
        // Last tick's arrivals read again this tick (heat above its halving) and as hot as a
        // granule must be to displace a resident at heat 0.
        let worthy = self
            .last
            .iter()
            .filter(|&&(i, then)| {
                let now = r.get(i as usize).map_or(0, |x| x.heat());
                now > then / 2 && now >= worthy_heat
            })
            .count() as u64;
        self.last.clear();
        for (i, x) in r.iter().enumerate() {
            if x.heat() > 0 && !self.is_seen(i) {
                self.set_seen(i);
                // i < records.len(), which granule numbers (u32) index.
                self.last
                    .push((u32::try_from(i).unwrap_or(u32::MAX), x.heat()));
            }
        }
        if self.last.capacity() > self.last.len().saturating_mul(4).saturating_add(64) {
            // A burst of first sightings (the guest's start) need not stay allocated.
            self.last.shrink_to(self.last.len().saturating_mul(2));
        }
        let room = worthy.max(self.worthy_prev).min(input.max_moves);
        self.worthy_prev = worthy;
        // What the guest's first touches took of the room since the last plan.
        let landed = self
            .expect_fast
            .map_or(0, |e| self.fast_now.saturating_sub(e));
        (room, room.min(landed.saturating_mul(2).saturating_add(1)))
    }

    /// Notes the fast granules `plan` leaves.
    fn planned(&mut self, plan: &Plan) {
        let after = self.fast_now.saturating_add(plan.promote.len() as u64);
        self.expect_fast = Some(after.saturating_sub(plan.demote.len() as u64));
    }

    fn clear(&mut self) {
        *self = Self::default();
    }

    fn bytes(&self) -> u64 {
        let pairs = self.last.capacity() * std::mem::size_of::<(u32, u8)>();
        (self.seen.capacity() * 8 + pairs) as u64
    }
}

impl DefaultPolicy {
    /// A default policy with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            history: History::default(),
            arrivals: Arrivals::default(),
        }
    }
}

/// Walks the hints (sorted by start) alongside the address-ordered granule scan.
struct HintCursor<'a> {
    hints: Vec<&'a vmtier_core::policy::GuestHint>,
    next: usize,
    hot_heat: u8,
}

impl<'a> HintCursor<'a> {
    fn new(input: &'a PolicyInput<'_>, hot_heat: u8, use_hints: bool) -> Self {
        let mut hints: Vec<_> = if use_hints {
            input.hints.iter().collect()
        } else {
            Vec::new()
        };
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

    /// Granule `i`'s rank: `base` (its heat, or less if it cannot pay back a move) raised by
    /// a hot or pinned hint, cleared by a cold or free one.
    fn key(&mut self, i: usize, base: u8) -> u8 {
        if self.hints.is_empty() {
            return base;
        }
        let hot_heat = self.hot_heat;
        match self.at(i) {
            Some(h) => match h.kind {
                HintKind::Hot => base.max(weighted(hot_heat, h.weight)),
                HintKind::Pinned => base.max(weighted(HeatRecord::MAX_HEAT, h.weight)),
                HintKind::Cold | HintKind::Free => 0,
            },
            None => base,
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
        let mut rules = Rules {
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
            // Only where one tick of heat pays back a move: a 2 MiB move costs 154 times a
            // 4 KiB one, and there the fixed margin keeps lukewarm noise from churning.
            by_worth: self.cfg.displace_by_worth
                && payback::one_tick_pays(input, self.cfg.promote_min_heat),
            room: 0,
            room_first: 0,
        };
        // Room for arrivals: where one tick pays back a move and can show a new granule
        // worth a place (soft-dirty's 3 a tick cannot reach the margin over heat 0).
        let worthy_heat = rules.margin.max(rules.min_promote);
        let arrivals = self.cfg.room_for_arrivals
            && payback::one_tick_pays(input, self.cfg.promote_min_heat)
            && input.max_gain >= worthy_heat;
        if arrivals {
            (rules.room, rules.room_first) = self.arrivals.update(input, worthy_heat);
        } else {
            self.arrivals.clear();
        }
        // Where one tick cannot pay back a move, slow granules rank by the heat they
        // sustained over three ticks, or two (crate::payback); the two previous ticks' heats
        // are kept.
        let on = self.cfg.sustained_heat;
        let needs = on && !payback::one_tick_pays(input, self.cfg.promote_min_heat);
        if needs {
            self.history.align(input);
        } else {
            self.history.clear();
        }
        let hist = &self.history;
        // A split region (hybrid tracking) moves only its hot pages: one tick pays that back.
        // Base pages alone: two ticks running are enough (payback::sustained_base).
        let base = |i: usize, r: HeatRecord| -> u8 {
            if !needs || r.is_fast() || input.is_split(i) {
                r.heat()
            } else if input.is_base_paged(i) {
                payback::sustained_base(r.heat(), hist.prev(i))
            } else {
                payback::sustained(r.heat(), hist.prev(i))
            }
        };
        let use_hints = self.cfg.hot_hint_heat > 0 && !input.hints.is_empty();
        let hot_heat = if use_hints { self.cfg.hot_hint_heat } else { 0 };
        let mut a = HintCursor::new(input, hot_heat, use_hints);
        let h = select::histogram(input.records, rules.min_move_age, |i, r| {
            a.key(i, base(i, r))
        });
        if on {
            // Residents in the budget-sized hot bin are never swap victims.
            rules.demote_below = payback::hot_threshold(&h, input.fast_budget);
        }
        let q = select::quotas(&h, input.fast_budget, input.max_moves, &rules);
        let mut b = HintCursor::new(input, hot_heat, use_hints);
        let mut plan = select::collect(
            input.records,
            rules.min_move_age,
            |i, r| b.key(i, base(i, r)),
            q,
        );
        if use_hints {
            free_first(input, rules.min_move_age, &mut plan);
        }
        let plan = select::fit(input, &plan);
        if needs {
            self.history.remember(input);
        }
        if arrivals {
            self.arrivals.planned(&plan);
        }
        plan
    }

    fn state_bytes(&self) -> u64 {
        self.history.bytes() + self.arrivals.bytes()
    }

    /// Where a promotion waits for sustained heat: there base pages alone mapping a granule
    /// make two ticks enough.
    fn uses_huge_map(&self, granule_bytes: u64, max_gain: u8) -> bool {
        self.cfg.needs_sustained(granule_bytes, max_gain)
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

    /// Runs the policy for `ticks` ticks as the engine does: heat cools, move ages advance,
    /// `gain(tick, granule)` is observed, the plan is enforced and applied. Returns the
    /// records after every tick and every granule's moves as (tick, to fast).
    fn replay(
        cfg: Config,
        granule_bytes: u64,
        start: Vec<HeatRecord>,
        budget: impl Fn(u64) -> u64,
        max_moves: u64,
        ticks: u64,
        gain: impl Fn(u64, usize) -> u8,
    ) -> (Vec<Vec<HeatRecord>>, Vec<Vec<(u64, bool)>>) {
        replay_mapped(
            cfg,
            granule_bytes,
            None,
            start,
            budget,
            max_moves,
            ticks,
            gain,
        )
    }

    /// [`replay`] with what maps the granules ([`PolicyInput::huge`]).
    #[allow(clippy::too_many_arguments)]
    fn replay_mapped(
        cfg: Config,
        granule_bytes: u64,
        huge: Option<&[u32]>,
        start: Vec<HeatRecord>,
        budget: impl Fn(u64) -> u64,
        max_moves: u64,
        ticks: u64,
        gain: impl Fn(u64, usize) -> u8,
    ) -> (Vec<Vec<HeatRecord>>, Vec<Vec<(u64, bool)>>) {
        let mut p = DefaultPolicy::new(cfg);
        let mut r = start;
        let mut moves = vec![Vec::new(); r.len()];
        let mut seen = Vec::new();
        for t in 0..ticks {
            for (i, rec) in r.iter_mut().enumerate() {
                *rec = rec.aged().cooled().observed(gain(t, i));
            }
            let mut input = PolicyInput::from_records(t, granule_bytes, &r, budget(t), max_moves);
            input.huge = huge;
            let e = p.plan(&input).enforce(&r, budget(t), max_moves);
            for g in &e.demote {
                r[g.index()] = r[g.index()].moved_to(Tier::Slow);
                moves[g.index()].push((t, false));
            }
            for g in &e.promote {
                r[g.index()] = r[g.index()].moved_to(Tier::Fast);
                moves[g.index()].push((t, true));
            }
            seen.push(r.clone());
        }
        (seen, moves)
    }

    /// A small deterministic generator for noisy heats.
    fn noise(t: u64, i: usize, span: u8) -> u8 {
        let mut x = t
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add((i as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9));
        x ^= x >> 29;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 32;
        (x % (u64::from(span) + 1)) as u8
    }

    const MIB2: u64 = 2 << 20;

    /// The default configuration with the payback rule on (it is off by default).
    fn payback_on() -> Config {
        Config {
            sustained_heat: true,
            ..Config::default()
        }
    }

    #[test]
    fn a_hot_hint_needs_no_second_tick_at_2_mib() {
        // A cold slow 2 MiB granule under a full hot hint is promoted into free room at the
        // first tick (a hint claims use that goes on); without the hint, heat 16 seen once is
        // not. (hint, heat) -> promoted
        for (hinted, heat, want) in [(true, 0u8, true), (false, 16, false), (false, 0, false)] {
            let r = vec![HeatRecord::new(heat, Tier::Slow, HeatRecord::SETTLED)];
            let hints = [hint(0, 1, HintKind::Hot, 255)];
            let mut input = PolicyInput::from_records(0, MIB2, &r, 1, 10);
            if hinted {
                input.hints = &hints;
            }
            let plan = DefaultPolicy::new(payback_on()).plan(&input);
            assert_eq!(!plan.promote.is_empty(), want, "hint {hinted} heat {heat}");
        }
    }

    #[test]
    fn needs_sustained_table() {
        // (granule bytes, max gain, sustained_heat) -> sustained heat needed, and with it the
        // huge page map (the engine reads it only then). Soft-dirty's 3 a tick pays back no
        // move on one tick's evidence, not even a 4 KiB one.
        for (bytes, gain, sustained_heat, want) in [
            (4096u64, 16u8, true, false),
            (65536, 16, true, false),
            (MIB2, 16, true, true),
            (MIB2, 3, true, true),
            (MIB2, 16, false, false),
            (4096, 3, true, true),
            (65536, 3, true, true),
            (65536, 3, false, false),
        ] {
            let cfg = Config {
                sustained_heat,
                ..Config::default()
            };
            assert_eq!(
                cfg.needs_sustained(bytes, gain),
                want,
                "{bytes} B gain {gain}"
            );
            assert_eq!(
                DefaultPolicy::new(cfg).uses_huge_map(bytes, gain),
                want,
                "{bytes} B gain {gain}"
            );
        }
    }

    #[test]
    fn a_split_region_is_promoted_on_one_ticks_heat() {
        // Four slow 2 MiB regions at heat 16, first tick (no history). A split region (hybrid
        // tracking) moves only its hot pages, which one tick of heat pays back; a whole one
        // needs sustained heat. (split regions, rule on, promoted)
        let cases: [(&[u32], bool, &[u32]); 4] = [
            (&[], true, &[]),
            (&[1, 3], true, &[1, 3]),
            (&[0, 1, 2, 3], true, &[0, 1, 2, 3]),
            (&[1], false, &[0, 1, 2, 3]),
        ];
        for (split, sustained_heat, want) in cases {
            let r = vec![HeatRecord::new(16, Tier::Slow, HeatRecord::SETTLED); 4];
            let mut input = PolicyInput::from_records(0, MIB2, &r, 4, 8);
            input.split = split;
            let cfg = Config {
                sustained_heat,
                ..Config::default()
            };
            let plan = DefaultPolicy::new(cfg).plan(&input);
            let got: Vec<u32> = plan.promote.iter().map(|g| g.0).collect();
            assert_eq!(got, want, "split {split:?}, rule {sustained_heat}");
        }
        // is_split over a sorted list, including indices past it.
        let r = [HeatRecord::default(); 3];
        let mut input = PolicyInput::from_records(0, MIB2, &r, 1, 1);
        input.split = &[2];
        let got: Vec<bool> = (0..4).map(|i| input.is_split(i)).collect();
        assert_eq!(got, [false, false, true, false]);
    }

    #[test]
    fn a_sweep_touched_granule_never_fills_spare_budget() {
        // 64 granules of 2 MiB: a hot set of 8 seen in every sample of every tick, a budget of
        // 16 (8 spare), and a background sweep that passes over one other granule per tick,
        // seen in `sweep` of the samples of that tick (or, straddling a tick boundary, in two
        // ticks). (name, sustained_heat, sweep gains over its ticks, sweep granules promoted)
        let cases: [(&str, bool, &[u8], bool); 8] = [
            ("whole tick", true, &[16], false),
            ("a third of a tick", true, &[13], false),
            ("one sample hit", true, &[3], false),
            ("straddling two ticks", true, &[8, 8], false),
            ("whole, then nearly whole", true, &[16, 15], false),
            ("seen hot in two ticks running", true, &[14, 14], false),
            // Filling two ticks at full gain is what use looks like.
            ("slow enough to fill two whole ticks", true, &[16, 16], true),
            ("the rule off: it fills spare DRAM", false, &[13], true),
        ];
        for (name, sustained_heat, sweep, want) in cases {
            let cfg = Config {
                sustained_heat,
                ..Config::default()
            };
            let n = 64usize;
            let gain = |t: u64, i: usize| -> u8 {
                if i < 8 {
                    return 16;
                }
                // The sweep reaches granule 8 + t and stays sweep.len() ticks.
                let k = (i - 8) as u64;
                if t >= k && t < k + sweep.len() as u64 {
                    sweep[(t - k) as usize]
                } else {
                    0
                }
            };
            let (recs, moves) = replay(
                cfg,
                MIB2,
                vec![HeatRecord::default(); n],
                |_| 16,
                4,
                56,
                gain,
            );
            let last = recs.last().map(|r| r[..8].iter().all(|r| r.is_fast()));
            assert_eq!(last, Some(true), "{name}: hot set in DRAM");
            let promoted = moves[8..].iter().any(|m| !m.is_empty());
            assert_eq!(promoted, want, "{name}: sweep granules promoted");
        }
    }

    #[test]
    fn base_paged_granules_are_promoted_from_their_second_tick() {
        // 16 granules of 2 MiB, budget 8: granule 0 gains `gains` tick after tick, the others
        // nothing. Where base pages alone map it, two ticks of sustained heat promote it;
        // where huge pages may (or are not known not to), three. (what maps the granules,
        // gains, tick of the promotion)
        let all: Vec<u32> = (0..16).collect();
        let base: &[u32] = &[];
        let cases: [(&str, Option<&[u32]>, &[u8], Option<u64>); 13] = [
            ("not known, steady", None, &[14; 5], Some(2)),
            ("huge pages, steady", Some(&all), &[14; 5], Some(2)),
            ("base pages, steady", Some(base), &[14; 5], Some(1)),
            ("not known, at full gain", None, &[16; 5], Some(1)),
            ("huge pages, at full gain", Some(&all), &[16; 5], Some(1)),
            (
                "base pages, the testbed's 4 KiB hot set",
                Some(base),
                &[9, 9, 10, 9],
                Some(1),
            ),
            ("base pages, weak and steady", Some(base), &[3; 5], Some(2)),
            (
                "base pages, a sweep's two hits",
                Some(base),
                &[5, 0, 0, 0],
                None,
            ),
            (
                "base pages, a sweep's hits over two ticks",
                Some(base),
                &[3, 3, 0],
                None,
            ),
            ("base pages, a one-off", Some(base), &[16, 0, 0, 0], None),
            ("base pages, fading", Some(base), &[16, 9, 0, 0], None),
            (
                "huge pages, two ticks running",
                Some(&all),
                &[16, 15, 0, 0],
                None,
            ),
            (
                "base pages, two ticks running",
                Some(base),
                &[16, 15, 0, 0],
                Some(1),
            ),
        ];
        for (name, huge, gains, want) in cases {
            let (_, moves) = replay_mapped(
                payback_on(),
                MIB2,
                huge,
                vec![HeatRecord::default(); 16],
                |_| 8,
                8,
                gains.len() as u64,
                |t, i| if i == 0 { gains[t as usize] } else { 0 },
            );
            let want: Vec<_> = want.map(|t| (t, true)).into_iter().collect();
            assert_eq!(moves[0], want, "{name}");
            assert!(moves[1..].iter().all(Vec::is_empty), "{name}");
        }
        // is_base_paged over a sorted list of huge-mapped granules, or none known.
        let r = [HeatRecord::default(); 3];
        let mut input = PolicyInput::from_records(0, MIB2, &r, 1, 1);
        let got: Vec<bool> = (0..4).map(|i| input.is_base_paged(i)).collect();
        assert_eq!(got, [false; 4]);
        input.huge = Some(&[1]);
        let got: Vec<bool> = (0..4).map(|i| input.is_base_paged(i)).collect();
        assert_eq!(got, [true, false, true, true]);
    }

    #[test]
    fn a_steadily_hot_granule_is_promoted_within_its_payback() {
        // (granule bytes, gain every tick, tick of the promotion): at 2 MiB heat must be
        // sustained, seen in three ticks (15, 22, 26: the third; at full gain two ticks are
        // enough: 16, 24); gain 2 settles at heat 3,
        // below `promote_min_heat`. At 4 KiB heat 4 pays back at once.
        for (bytes, g, want) in [
            (MIB2, 16u8, Some(1u64)), // two ticks at full gain
            (MIB2, 15, Some(2)),
            (MIB2, 8, Some(2)),
            (MIB2, 4, Some(2)),
            (MIB2, 3, Some(2)),
            (MIB2, 2, None),
            (4096, 16, Some(0)),
            (4096, 4, Some(0)),
            (4096, 3, Some(1)),
        ] {
            let (_, moves) = replay(
                payback_on(),
                bytes,
                vec![HeatRecord::default(); 4],
                |_| 2,
                4,
                8,
                |_, i| if i == 0 { g } else { 0 },
            );
            let want: Vec<_> = want.map(|t| (t, true)).into_iter().collect();
            assert_eq!(moves[0], want, "{bytes} B, gain {g}");
            assert!(moves[1..].iter().all(Vec::is_empty), "{bytes} B, gain {g}");
        }
    }

    #[test]
    fn a_static_hot_set_with_noisy_heat_never_ping_pongs() {
        // 50 ticks: a hot set of 24 granules seen in 35–100% of the samples each tick
        // (gain 13..=16); 232 others with noise up to gain `cold`, and a background sweep
        // that touches granule 24 + (tick % `sweep`) in a third of the tick's samples
        // (gain 13), so it comes back to each every `sweep` ticks (0: no sweep); budget 32
        // (8 spare), 8 moves a tick. (granule bytes, cold, sweep, granules promoted after a
        // demotion: None = some, only the hot set moves)
        let cases = [
            // 2 MiB: neither cold noise (gain ≤ 1) nor the sweep's one-off is sustained, so
            // nothing but the hot set moves, and the hot set is never displaced.
            (MIB2, 1u8, 8u64, Some(0usize), true),
            (MIB2, 1, 20, Some(0), true),
            // Lukewarm noise (gain up to 4, heat up to 8) is steady use: such granules may
            // fill spare DRAM, but none comes back after a demotion and the hot set stays.
            (MIB2, 4, 20, Some(0), false),
            (MIB2, 4, 0, Some(0), false),
            // 4 KiB, cold noise (gain ≤ 1, heat < 4) and no sweep: nothing but the hot set moves.
            (4096, 1, 0, Some(0), true),
            // 4 KiB with the sweep: a 4 KiB move is cheap enough that heat 13 pays back, so
            // swept granules cycle through the spare DRAM (docs/policies.md); the hot set
            // still stays.
            (4096, 1, 20, None, false),
        ];
        for (bytes, cold, sweep, want, only_hot) in cases {
            let gain = |t: u64, i: usize| -> u8 {
                if i < 24 {
                    13 + noise(t, i, 3)
                } else if sweep > 0 && i as u64 == 24 + t % sweep {
                    13
                } else {
                    noise(t, i, cold)
                }
            };
            let (recs, moves) = replay(
                payback_on(),
                bytes,
                vec![HeatRecord::default(); 256],
                |_| 32,
                8,
                50,
                gain,
            );
            let name = format!("{bytes} B, cold {cold}, sweep every {sweep}");
            // The hot set: promoted once, never demoted, all in DRAM at the end.
            for (i, m) in moves[..24].iter().enumerate() {
                assert_eq!(m.len(), 1, "{name}: hot granule {i}: {m:?}");
            }
            let hot_fast = recs
                .last()
                .map_or(0, |r| r[..24].iter().filter(|r| r.is_fast()).count());
            assert_eq!(hot_fast, 24, "{name}");
            let back = (0..256)
                .filter(|&i| moves[i].windows(2).any(|w| !w[0].1 && w[1].1))
                .count();
            match want {
                Some(n) => assert_eq!(back, n, "{name}: promoted after a demotion"),
                None => assert!(back > 0, "{name}: expected spikes to cycle"),
            }
            if only_hot {
                let others = moves[24..].iter().filter(|m| !m.is_empty()).count();
                assert_eq!(others, 0, "{name}: granules outside the hot set moved");
            }
        }
    }

    #[test]
    fn a_lukewarm_new_hot_set_displaces_a_resident_one_gone_cold() {
        // 4 KiB granules, budget 32, 8 moves a tick. Ticks 0..10: granules 0..32 hot (gain
        // 13..=16), the rest noise (gain ≤ 1). From tick 10 the old set goes untouched and
        // granules 32..64 are used, seen as DAMON sees a hot page among cold neighbours:
        // lukewarm, gain 3..=5 (heat 6..=10). By worth, the old residents are displaced as
        // soon as their heat falls below half the new set's; with the fixed margin only once
        // they reach 0 and the new set reads 8 or more, so it lags.
        // (displace by worth, ticks after the shift until 28 of the new set are in DRAM)
        let mut took = Vec::new();
        for by_worth in [true, false] {
            let cfg = Config {
                displace_by_worth: by_worth,
                ..Config::default()
            };
            let gain = |t: u64, i: usize| -> u8 {
                match (t < 10, i) {
                    (true, 0..=31) => 13 + noise(t, i, 3),
                    (false, 32..=63) => 3 + noise(t, i, 2),
                    _ => noise(t, i, 1),
                }
            };
            let (recs, _) = replay(
                cfg,
                4096,
                vec![HeatRecord::default(); 128],
                |_| 32,
                8,
                40,
                gain,
            );
            let when = recs
                .iter()
                .enumerate()
                .skip(10)
                .find(|(_, r)| r[32..64].iter().filter(|r| r.is_fast()).count() >= 28)
                .map(|(t, _)| t as u64 - 10);
            took.push(when);
        }
        let (worth, fixed) = (took[0], took[1]);
        assert!(worth.is_some_and(|w| w <= 12), "by worth: {worth:?}");
        assert!(
            fixed.map_or(true, |f| Some(f) > worth),
            "fixed margin {fixed:?} not slower than by worth {worth:?}"
        );
    }

    #[test]
    fn by_worth_a_steady_hot_set_survives_blips_and_2_mib_keeps_the_margin() {
        // Budget 24 held by a hot set seen in 80–100% of every tick's samples (gain 13..=16,
        // heat ≥ 19); every tick 8 other granules get a one-window blip at full gain (16).
        // By worth, no blip ever displaces a resident of the hot set.
        let worth = Config {
            displace_by_worth: true,
            ..Config::default()
        };
        let start: Vec<_> = (0..256)
            .map(|i| {
                let t = if i < 24 { Tier::Fast } else { Tier::Slow };
                HeatRecord::new(if i < 24 { 28 } else { 0 }, t, HeatRecord::SETTLED)
            })
            .collect();
        let (recs, moves) = replay(
            worth.clone(),
            4096,
            start,
            |_| 24,
            8,
            40,
            |t, i| {
                if i < 24 {
                    13 + noise(t, i, 3)
                } else if (i as u64 + t * 8) % 232 < 8 {
                    16
                } else {
                    0
                }
            },
        );
        assert!(moves[..24].iter().all(Vec::is_empty), "hot set moved");
        assert!(recs.iter().all(|r| r[..24].iter().all(|r| r.is_fast())));
        // (granule bytes, displace by worth) -> an untouched resident displaced by a slow
        // granule at heat 5: by worth at 4 KiB only; 2 MiB keeps the fixed margin (8).
        for (bytes, by_worth, want) in [
            (4096u64, true, true),
            (4096, false, false),
            (MIB2, true, false),
            (MIB2, false, false),
        ] {
            let r = vec![
                HeatRecord::new(5, Tier::Slow, HeatRecord::SETTLED),
                HeatRecord::new(0, Tier::Fast, HeatRecord::SETTLED),
            ];
            let input = PolicyInput::from_records(0, bytes, &r, 1, 10);
            let cfg = Config {
                displace_by_worth: by_worth,
                ..Config::default()
            };
            let plan = DefaultPolicy::new(cfg).plan(&input);
            assert_eq!(
                !plan.promote.is_empty(),
                want,
                "{bytes} B, by worth {by_worth}"
            );
        }
    }

    #[test]
    fn a_budget_cut_still_drains() {
        // 32 hot granules in DRAM, then the budget drops to 8 (and 0) at tick 3: one tick later
        // DRAM holds no more than the budget, whatever the heat and the move limit.
        for (cut, bytes) in [(8u64, MIB2), (0, MIB2), (8, 4096)] {
            let start: Vec<_> = (0..64)
                .map(|i| {
                    let t = if i < 32 { Tier::Fast } else { Tier::Slow };
                    HeatRecord::new(31, t, HeatRecord::SETTLED)
                })
                .collect();
            let (recs, _) = replay(
                Config::default(),
                bytes,
                start,
                |t| if t < 3 { 32 } else { cut },
                2,
                6,
                |_, i| if i < 32 { 16 } else { 0 },
            );
            for (t, r) in recs.iter().enumerate().skip(3) {
                let fast = r.iter().filter(|r| r.is_fast()).count() as u64;
                assert!(fast <= cut, "cut to {cut}: {fast} fast at tick {t}");
            }
        }
    }

    #[test]
    fn room_for_arrivals_table() {
        use Tier::{Fast as F, Slow as S};
        let s = HeatRecord::SETTLED;
        // Four residents seen in no recent tick (0..=3) fill a budget of 4; granules 4 and 5
        // are first seen at tick 1 (heat 5: below the swap margin over heat 0, so no swap),
        // and at tick 2 read at `again`. Granules 6 and 7 are never seen. Tick 2's plan:
        // (name, room for arrivals, granule bytes, max gain, heat of 4 and 5 at tick 2,
        // promoted, demoted).
        let cases: Vec<(&str, bool, u64, u8, u8, Vec<u32>, Vec<u32>)> = vec![
            (
                "read again at the worthy heat: two swaps and room for two more arrivals",
                true,
                4096,
                16,
                10,
                vec![4, 5],
                vec![0, 1, 2, 3],
            ),
            (
                "without the rule the swaps alone",
                false,
                4096,
                16,
                10,
                vec![4, 5],
                vec![0, 1],
            ),
            (
                "read again exactly at the worthy heat (8 = 0 + swap_margin)",
                true,
                4096,
                16,
                8,
                vec![4, 5],
                vec![0, 1, 2, 3],
            ),
            (
                "read again below it: no swap, no room",
                true,
                4096,
                16,
                7,
                vec![],
                vec![],
            ),
            (
                "not read again (heat only halved): no room",
                true,
                4096,
                16,
                2,
                vec![],
                vec![],
            ),
            (
                "2 MiB granules (one tick does not pay back a move): no room",
                true,
                MIB2,
                16,
                10,
                vec![],
                vec![],
            ),
            (
                "soft-dirty's range (3 a tick): no room (nor a swap on one tick's heat)",
                true,
                4096,
                3,
                10,
                vec![],
                vec![],
            ),
        ];
        for (name, on, bytes, max_gain, again, promote, demote) in cases {
            let mut p = DefaultPolicy::new(Config {
                room_for_arrivals: on,
                ..Config::default()
            });
            let mut plan = Plan::default();
            for (t, heat) in (0u64..).zip([0, 5, again]) {
                let r: Vec<_> = (0..8usize)
                    .map(|i| match i {
                        0..=3 => HeatRecord::new(0, F, s),
                        4 | 5 => HeatRecord::new(heat, S, s),
                        _ => HeatRecord::new(0, S, s),
                    })
                    .collect();
                let mut input = PolicyInput::from_records(t, bytes, &r, 4, 10);
                input.max_gain = max_gain;
                plan = p.plan(&input);
            }
            let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
            assert_eq!(
                (ids(&plan.promote), ids(&plan.demote)),
                (promote, demote),
                "{name}"
            );
        }
    }

    #[test]
    fn room_is_made_before_swaps_as_arrivals_take_it() {
        // A guest that starts using four new granules a tick while DRAM (16 granules) is full
        // of residents seen in no recent tick; first touches land in free DRAM, as the engine
        // places them, and the move limit (4) is spent on swaps. Where the new granules stay
        // in use, the rule serves more of them from DRAM with fewer moves (room made before
        // swaps grows with what arrivals took of it); where each is used only on the tick it
        // arrives, it makes no room: the same moves as without it.
        // (room for arrivals, new granules stay in use) -> (in-use new granules found in
        // DRAM summed over the 8 ticks, moves)
        for (on, hot, want) in [
            (false, true, (56usize, 32usize)),
            (true, true, (71, 28)),
            (false, false, (0, 32)),
            (true, false, (0, 32)),
        ] {
            let mut p = DefaultPolicy::new(Config {
                room_for_arrivals: on,
                ..Config::default()
            });
            let budget = 16u64;
            let mut r: Vec<_> = (0..64u64)
                .map(|i| {
                    let t = if i < budget { Tier::Fast } else { Tier::Slow };
                    HeatRecord::new(0, t, HeatRecord::SETTLED)
                })
                .collect();
            let mut touched = vec![false; r.len()];
            touched[..16].fill(true);
            let (mut served, mut moves) = (0usize, 0usize);
            for t in 0..8usize {
                let end = 20 + 4 * t;
                for i in end - 4..end {
                    let fast = r.iter().filter(|x| x.is_fast()).count() as u64;
                    if !touched[i] && fast < budget {
                        r[i] = HeatRecord::new(0, Tier::Fast, HeatRecord::SETTLED);
                    }
                    touched[i] = true;
                }
                let from = if hot { 16 } else { end - 4 };
                served += r[from..end].iter().filter(|x| x.is_fast()).count();
                for (i, rec) in r.iter_mut().enumerate() {
                    *rec = rec.aged().cooled();
                    if (from..end).contains(&i) {
                        *rec = rec.observed(16);
                    }
                }
                let input = PolicyInput::from_records(t as u64, 4096, &r, budget, 4);
                let e = p.plan(&input).enforce(&r, budget, 4);
                moves += e.promote.len() + e.demote.len();
                for g in &e.demote {
                    r[g.index()] = r[g.index()].moved_to(Tier::Slow);
                }
                for g in &e.promote {
                    r[g.index()] = r[g.index()].moved_to(Tier::Fast);
                }
            }
            assert_eq!((served, moves), want, "room for arrivals {on}, hot {hot}");
        }
    }
}
