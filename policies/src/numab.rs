//! Linux NUMA balancing in memory-tiering mode (`numa_balancing=2`, Linux 5.18+), rebuilt
//! from its published description (shared/guide/anchors.md, "Linux NUMA balancing mode 2")
//! and the semantics of Linux 6.12 (`kernel/sched/fair.c` `should_numa_migrate_memory`,
//! `mm/migrate.c` `migrate_misplaced_folio_prepare`, `mm/vmscan.c` kswapd):
//!
//! - The scanner (the simulator's hint-fault source) makes slow-tier pages inaccessible and
//!   stamps them with the scan time; the next access takes a hint fault whose *latency* is the
//!   time since that stamp. Pages already inaccessible keep their stamp.
//! - A fault is a promotion candidate when its latency is below the hot threshold
//!   (`hot_threshold_ms`, 1000). Candidates are counted against
//!   `numa_balancing_promote_rate_limit_MBps` per second: once a second's candidates reach the
//!   limit, the rest of that second's faults are not promoted.
//! - Every `threshold_period_ms` (the scan period maximum, 60 s) the threshold moves one step
//!   (an eighth of the default) down when the period's candidates exceeded the rate limit by
//!   10 %, up when they fell 10 % short, within [default / 8, 2 × default].
//! - When the fast node has plenty of free memory (more than max(1 GiB, 1/16 of the node)
//!   above the watermark) every faulting slow page is promoted, threshold and rate limit
//!   ignored, and the threshold goes back to the default.
//! - A promotion needs free memory on the fast node; when there is none it fails and wakes
//!   kswapd, which demotes the coldest pages (LRU tail) until a free headroom (the promotion
//!   watermark, `free_headroom_permille`) is back. In ticks: [`make_room`].
//!
//! Faults are taken in the order they happened. No hysteresis: a page may go back and forth.
//!
//! The simulator's per-tick move limit is not the kernel's: the kernel promotes a candidate
//! at its fault, limited only by the rate limit. A candidate that [`make_room`] leaves out
//! for want of moves is therefore kept ([`Deferred`]) and promoted in a later tick while it
//! is still slow, without a new fault. The scanner's period, which grows as pages are
//! promoted, is the simulator's (`vmtier_sim::sim::Config::hint_scan_backoff`).

use serde::{Deserialize, Serialize};
use vmtier_core::policy::{Granule, PlacementPolicy, Plan, PolicyInput, TrackingSource};

use crate::select;

/// Parameters of the NUMA-balancing model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Promote when the hint-fault latency is below this (kernel default 1000 ms).
    pub hot_threshold_ms: u32,
    /// Nominal length of one tick, to convert milliseconds and MB/s.
    pub tick_ms: u32,
    /// Promotion rate limit in MB/s (kernel default 65536).
    pub promote_rate_limit_mb_s: u64,
    /// Adjust the threshold so candidates match the rate limit (as the kernel does).
    pub adjust_threshold: bool,
    /// How often the threshold is adjusted (kernel: `numa_balancing_scan_period_max_ms`,
    /// 60000).
    pub threshold_period_ms: u32,
    /// Free fast memory reclaim keeps, in permille of the budget (the promotion watermark).
    pub free_headroom_permille: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            hot_threshold_ms: 1000,
            tick_ms: 1000,
            promote_rate_limit_mb_s: 65536,
            adjust_threshold: true,
            threshold_period_ms: 60_000,
            free_headroom_permille: 10,
        }
    }
}

/// Granules a rate of `mb_s` MB/s moves in one tick of `tick_ms` (at least one).
pub(crate) fn rate_limit_granules(input: &PolicyInput<'_>, mb_s: u64, tick_ms: u32) -> u64 {
    let bytes = mb_s
        .saturating_mul(1 << 20)
        .saturating_mul(u64::from(tick_ms))
        / 1000;
    (bytes / input.granule_bytes.max(1)).max(1)
}

/// Reclaim for the hint-fault policies (NUMA balancing, TPP): of the `promote` candidates (in
/// priority order), as many as this tick's moves allow, and the coldest fast granules demoted
/// to make room for exactly those — promotions and demotions share `max_moves`, so a
/// promotion into a full fast tier costs two moves. Moves still left then demote towards a
/// `headroom` of free granules (the watermark reclaim keeps); a fast tier over its budget is
/// brought back first. Fast-tier use never drops below what the budget, the promotions and the
/// headroom call for, however many candidates there are.
pub(crate) fn make_room(input: &PolicyInput<'_>, mut promote: Vec<Granule>, headroom: u64) -> Plan {
    let used = input.fast_used();
    let budget = input.fast_budget;
    let over = used.saturating_sub(budget);
    let free = budget.saturating_sub(used);
    let moves = input.max_moves.saturating_sub(over);
    // p promotions need p − free demotions: p + (p − free) ≤ moves.
    let most = if moves <= free {
        moves
    } else {
        (moves + free) / 2
    };
    let p = (promote.len() as u64).min(most);
    promote.truncate(usize::try_from(p).unwrap_or(usize::MAX));
    let for_promotions = p.saturating_sub(free);
    let left = moves - p - for_promotions;
    let free_after = free + for_promotions - p;
    let for_headroom = headroom.saturating_sub(free_after).min(left);
    let demote = select::coldest_fast(input.records, over + for_promotions + for_headroom);
    select::fit(input, &Plan { promote, demote })
}

/// Candidates the simulator's move limit left out (the kernel would have promoted them at
/// their fault, [`crate::numab`]), newest last.
#[derive(Clone, Debug, Default)]
pub(crate) struct Deferred(Vec<Granule>);

impl Deferred {
    /// Tops `plan` (made by [`make_room`] from this tick's `candidates`) up with earlier
    /// candidates that are still slow, newest first, as far as the moves and the free room
    /// above `headroom` that the plan leaves allow: this tick's candidates come first, and an
    /// earlier one never displaces a resident (had the kernel promoted it, reclaim would
    /// take it back as the coldest). Then keeps every candidate the plan leaves out.
    pub(crate) fn top_up(
        &mut self,
        input: &PolicyInput<'_>,
        mut plan: Plan,
        candidates: &[Granule],
        headroom: u64,
    ) -> Plan {
        let is_slow = |g: &Granule| input.records.get(g.index()).is_some_and(|r| !r.is_fast());
        let moves = (plan.promote.len() + plan.demote.len()) as u64;
        let used = (input.fast_used() + plan.promote.len() as u64)
            .saturating_sub(plan.demote.len() as u64);
        let room = input
            .fast_budget
            .saturating_sub(used)
            .saturating_sub(headroom)
            .min(input.max_moves.saturating_sub(moves));
        let mut seen: std::collections::HashSet<Granule> = plan.promote.iter().copied().collect();
        let earlier = std::mem::take(&mut self.0);
        let take: Vec<Granule> = earlier
            .iter()
            .rev()
            .filter(|g| is_slow(g) && !seen.contains(g))
            .take(usize::try_from(room).unwrap_or(usize::MAX))
            .copied()
            .collect();
        seen.extend(take.iter().copied());
        plan.promote.extend(take);
        self.0 = earlier
            .into_iter()
            .chain(candidates.iter().copied())
            .filter(|g| is_slow(g) && seen.insert(*g))
            .collect();
        plan
    }

    /// Bytes kept.
    pub(crate) fn bytes(&self) -> u64 {
        (self.0.len() * std::mem::size_of::<Granule>()) as u64
    }
}

/// The NUMA-balancing tiering-mode model.
#[derive(Clone, Debug)]
pub struct NumaBalancing {
    cfg: Config,
    /// Current threshold in ms (0 = the default, as the kernel's `nbp_threshold`).
    threshold_ms: u32,
    /// Tick the current adjustment period started (`None` before the first one).
    period_start: Option<u64>,
    /// Candidates counted in the current adjustment period.
    period_candidates: u64,
    /// Candidates the move limit left out.
    deferred: Deferred,
}

impl NumaBalancing {
    /// A model with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            threshold_ms: 0,
            period_start: None,
            period_candidates: 0,
            deferred: Deferred::default(),
        }
    }

    /// The hot threshold now, in ms.
    pub fn threshold_ms(&self) -> u32 {
        if self.threshold_ms == 0 {
            self.cfg.hot_threshold_ms
        } else {
            self.threshold_ms
        }
    }

    /// One step of `numa_promotion_adjust_threshold` when a period has passed: the kernel
    /// starts its first period at boot, so the first candidate fault adjusts at once.
    fn adjust(&mut self, tick: u64, rate_limit: u64) {
        if !self.cfg.adjust_threshold {
            return;
        }
        let tick_ms = u64::from(self.cfg.tick_ms.max(1));
        let period = u64::from(self.cfg.threshold_period_ms);
        if let Some(start) = self.period_start {
            if tick.saturating_sub(start).saturating_mul(tick_ms) <= period {
                return;
            }
        }
        let reference = self.cfg.hot_threshold_ms;
        let unit = (reference / 8).max(1);
        // Candidates the rate limit allows in one period.
        let ref_cand = rate_limit.saturating_mul(period) / tick_ms;
        let mut th = self.threshold_ms();
        if self.period_candidates > ref_cand.saturating_mul(11) / 10 {
            th = th.saturating_sub(unit).max(unit);
        } else if self.period_candidates < ref_cand.saturating_mul(9) / 10 {
            th = th.saturating_add(unit).min(reference.saturating_mul(2));
        }
        self.threshold_ms = th;
        self.period_start = Some(tick);
        self.period_candidates = 0;
    }
}

impl PlacementPolicy for NumaBalancing {
    fn name(&self) -> &'static str {
        "numab"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::HintFaults
    }

    fn state_bytes(&self) -> u64 {
        // A few counters per node; the per-page scan time lives in the page (the source's).
        // The deferred candidates stand in for promotions the kernel makes at the fault.
        self.deferred.bytes()
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        let limit = rate_limit_granules(input, self.cfg.promote_rate_limit_mb_s, self.cfg.tick_ms);
        let budget = input.fast_budget;
        let headroom =
            budget.saturating_mul(u64::from(self.cfg.free_headroom_permille.min(1000))) / 1000;
        let gib = (1u64 << 30) / input.granule_bytes.max(1);
        let plenty = gib.max(budget / 16).saturating_add(headroom);
        let mut free = budget.saturating_sub(input.fast_used());
        let tick_ms = u64::from(self.cfg.tick_ms.max(1));
        let mut taken = std::collections::HashSet::new();
        let mut candidates = 0u64;
        let mut promote = Vec::new();
        for f in input.hint_faults {
            let slow = input
                .records
                .get(f.granule.index())
                .is_some_and(|r| !r.is_fast());
            if !slow || taken.contains(&f.granule) {
                continue;
            }
            if free > plenty {
                // pgdat_free_space_enough: promote whatever faults; back to the default.
                self.threshold_ms = 0;
                taken.insert(f.granule);
                promote.push(f.granule);
                free -= 1;
                continue;
            }
            self.adjust(input.tick, limit);
            let latency_ms = u64::from(f.latency_millitick) * tick_ms / 1000;
            if latency_ms >= u64::from(self.threshold_ms()) {
                continue;
            }
            candidates += 1;
            self.period_candidates += 1;
            if candidates >= limit {
                continue;
            }
            taken.insert(f.granule);
            promote.push(f.granule);
        }
        let plan = make_room(input, promote.clone(), headroom);
        self.deferred.top_up(input, plan, &promote, headroom)
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use vmtier_core::policy::{HeatRecord, HintFault, Tier};

    fn ids(v: &[Granule]) -> Vec<u32> {
        v.iter().map(|g| g.0).collect()
    }

    fn faults(spec: &[(u32, u32)]) -> Vec<HintFault> {
        spec.iter()
            .map(|&(g, latency_millitick)| HintFault {
                granule: Granule(g),
                latency_millitick,
            })
            .collect()
    }

    fn fixed(hot_threshold_ms: u32) -> Config {
        Config {
            hot_threshold_ms,
            adjust_threshold: false,
            ..Config::default()
        }
    }

    #[test]
    fn a_fault_later_than_the_hot_threshold_is_not_promoted() {
        // Granules 0..4 slow, 4 and 5 fast (4 colder); the budget is full, moves plenty.
        let r: Vec<_> = (0..6u8)
            .map(|i| {
                let t = if i < 4 { Tier::Slow } else { Tier::Fast };
                HeatRecord::new(if i == 5 { 9 } else { 0 }, t, 3)
            })
            .collect();
        // (case, threshold ms, faults (granule, latency in thousandths of a 1 s tick),
        //  promoted, demoted)
        let cases: Vec<(&str, u32, Vec<(u32, u32)>, Vec<u32>, Vec<u32>)> = vec![
            (
                "sooner promoted, at or past the threshold not; fault order kept",
                1000,
                vec![(3, 999), (1, 1000), (2, 3500), (0, 10)],
                vec![3, 0],
                vec![4, 5],
            ),
            (
                "a shorter threshold filters more",
                100,
                vec![(3, 999), (0, 10)],
                vec![0],
                vec![4],
            ),
            (
                "fast granules and repeated faults are not candidates",
                1000,
                vec![(5, 1), (0, 1), (0, 2)],
                vec![0],
                vec![4],
            ),
        ];
        for (name, th, spec, promote, demote) in cases {
            let f = faults(&spec);
            let mut input = PolicyInput::from_records(0, 4096, &r, 2, 20);
            input.hint_faults = &f;
            let plan = NumaBalancing::new(fixed(th)).plan(&input);
            assert_eq!(
                (ids(&plan.promote), ids(&plan.demote)),
                (promote, demote),
                "{name}"
            );
        }
    }

    #[test]
    fn a_candidate_the_move_limit_leaves_out_is_deferred_not_dropped() {
        // Granules 0..8 slow, budget 8 (all free); 256 KiB granules, 1 MB/s: the candidate
        // that reaches 4 in a second is refused by the rate limit.
        let mut r = vec![HeatRecord::default(); 8];
        let mut p = NumaBalancing::new(Config {
            promote_rate_limit_mb_s: 1,
            ..fixed(1000)
        });
        // (step, faulting granules, moves, promoted)
        let steps: Vec<(&str, Vec<u32>, u64, Vec<u32>)> = vec![
            (
                "two moves for three candidates",
                vec![0, 1, 2],
                2,
                vec![0, 1],
            ),
            (
                "the third follows, without a new fault",
                vec![3],
                2,
                vec![3, 2],
            ),
            (
                "rate limit: the fourth candidate is refused",
                vec![4, 5, 6, 7],
                4,
                vec![4, 5, 6],
            ),
            ("a refused candidate is not deferred", vec![], 4, vec![]),
        ];
        for (tick, (step, faulting, moves, want)) in steps.into_iter().enumerate() {
            let f = faults(&faulting.iter().map(|&g| (g, 1)).collect::<Vec<_>>());
            let mut input = PolicyInput::from_records(tick as u64, 1 << 18, &r, 8, moves);
            input.hint_faults = &f;
            let e = p.plan(&input).enforce(&r, 8, moves);
            assert_eq!(ids(&e.promote), want, "{step}");
            for g in &e.promote {
                r[g.index()] = r[g.index()].moved_to(Tier::Fast);
            }
        }
        // Deferred: 1..5 (one move for five candidates, 0 promoted). A tick later, with no
        // faults: newest first, only into free room, never past the moves.
        // (case, granules made fast meanwhile, budget, moves, promoted)
        let cases: Vec<(&str, Vec<usize>, u64, u64, Vec<u32>)> = vec![
            (
                "newest first, into the room left",
                vec![],
                3,
                10,
                vec![4, 3],
            ),
            (
                "one made fast meanwhile is dropped",
                vec![4],
                3,
                10,
                vec![3],
            ),
            ("the move limit holds", vec![], 6, 1, vec![4]),
            ("a full fast tier takes none", vec![], 1, 10, vec![]),
        ];
        for (name, fast, budget, moves, want) in cases {
            let mut p = NumaBalancing::new(fixed(1000));
            let mut r = vec![HeatRecord::default(); 6];
            let f = faults(&[(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)]);
            let mut input = PolicyInput::from_records(0, 4096, &r, 6, 1);
            input.hint_faults = &f;
            assert_eq!(ids(&p.plan(&input).promote), vec![0], "{name}");
            assert_eq!(p.state_bytes(), 16, "{name}");
            for g in [0].iter().chain(&fast) {
                r[*g] = r[*g].moved_to(Tier::Fast);
            }
            let input = PolicyInput::from_records(1, 4096, &r, budget, moves);
            assert_eq!(ids(&p.plan(&input).promote), want, "{name}");
        }
    }

    #[test]
    fn the_rate_limit_caps_promotions_per_second() {
        // 64 slow granules of 256 KiB faulting at once, all of the budget free.
        let r = vec![HeatRecord::default(); 64];
        let f = faults(&(0..64).map(|g| (g, 1)).collect::<Vec<_>>());
        // (MB/s, tick ms, promoted per tick): 1 MB/s is 4 granules a second, and the
        // candidate that reaches the limit is refused (the kernel counts, then compares).
        let cases = [
            (1u64, 1000u32, 3usize),
            (1, 500, 1),
            (2, 1000, 7),
            (65536, 1000, 64),
        ];
        for (mb_s, tick_ms, want) in cases {
            let mut p = NumaBalancing::new(Config {
                promote_rate_limit_mb_s: mb_s,
                tick_ms,
                ..fixed(1000)
            });
            for tick in 0..3 {
                let mut input = PolicyInput::from_records(tick, 1 << 18, &r, 64, 64);
                input.hint_faults = &f;
                assert_eq!(
                    p.plan(&input).promote.len(),
                    want,
                    "{mb_s} MB/s, {tick_ms} ms"
                );
            }
        }
    }

    #[test]
    fn the_threshold_moves_once_a_period_and_plenty_of_free_memory_bypasses_it() {
        let r = vec![HeatRecord::default(); 300];
        // (tick, granule bytes, faults (count, latency millitick), promoted, threshold after)
        // Rate limit 1 MB/s = 4 granules of 256 KiB per second, 240 per 60 s period.
        let steps: Vec<(u64, u64, (u32, u32), usize, u32)> = vec![
            // The kernel's first period started at boot: the first candidate adjusts at once,
            // up an eighth (no candidates yet), so 1100 ms now passes.
            (0, 1 << 18, (1, 1100), 1, 1125),
            // Within the period: no change, 1130 ms is too late.
            (30, 1 << 18, (1, 1130), 0, 1125),
            // 300 candidates counted (3 promoted under the rate limit)...
            (31, 1 << 18, (300, 10), 3, 1125),
            // ... and the next period's first candidate lowers it: 300 > 1.1 × 240.
            (92, 1 << 18, (1, 10), 1, 1000),
            // A node with plenty of free memory (1 GiB granules: 300 of 300 free) promotes a
            // late fault regardless, past the rate limit, and resets the threshold.
            (93, 1 << 30, (5, 5000), 5, 1000),
        ];
        let mut p = NumaBalancing::new(Config {
            promote_rate_limit_mb_s: 1,
            ..Config::default()
        });
        for (tick, granule_bytes, (count, latency), promoted, th) in steps {
            let f = faults(&(0..count).map(|g| (g, latency)).collect::<Vec<_>>());
            let mut input = PolicyInput::from_records(tick, granule_bytes, &r, 300, 300);
            input.hint_faults = &f;
            let plan = p.plan(&input);
            assert_eq!(
                (plan.promote.len(), p.threshold_ms()),
                (promoted, th),
                "tick {tick}"
            );
        }
        // Bounds: [default / 8, 2 × default].
        let mut up = NumaBalancing::new(Config::default());
        let one = faults(&[(0, 1)]);
        for period in 0..20 {
            let mut input = PolicyInput::from_records(period * 61, 4096, &r, 300, 300);
            input.hint_faults = &one;
            up.plan(&input);
        }
        assert_eq!(up.threshold_ms(), 2000);
    }

    #[test]
    fn make_room_keeps_the_fast_tier_full_with_many_candidates() {
        // (budget, moves, headroom, slow candidates) -> (lowest fast use over 20 ticks,
        //  promotions in the 20 ticks)
        let cases: [((u64, u64, u64, u32), (u64, u64)); 5] = [
            // A full fast tier: every promotion is a swap, moves / 2 per tick.
            ((100, 10, 0, 1000), (100, 100)),
            // An odd move left over goes to the headroom, the next tick's free slot is used.
            ((100, 11, 1, 1000), (99, 110)),
            ((25, 2, 0, 1500), (25, 20)),
            // Fewer candidates than moves: as many swaps as candidates, no more demotions.
            ((100, 10, 0, 3), (100, 3)),
            // One move: a swap never fits, nothing drains.
            ((25, 1, 0, 1500), (25, 0)),
        ];
        for ((budget, moves, headroom, cands), want) in cases {
            let n = budget as usize + cands as usize;
            let mut r: Vec<_> = (0..n)
                .map(|i| {
                    let t = if i < budget as usize {
                        Tier::Fast
                    } else {
                        Tier::Slow
                    };
                    HeatRecord::new((i % 7) as u8, t, 3)
                })
                .collect();
            let mut lowest = u64::MAX;
            let mut promoted = 0u64;
            for tick in 0..20 {
                let input = PolicyInput::from_records(tick, 4096, &r, budget, moves);
                let slow: Vec<_> = (budget as u32..n as u32)
                    .filter(|&g| !r[g as usize].is_fast())
                    .take(cands as usize)
                    .map(Granule)
                    .collect();
                let plan = make_room(&input, slow, headroom);
                let e = plan.enforce(&r, budget, moves);
                assert_eq!(
                    (e.deferred, e.invalid, e.forced),
                    (0, 0, 0),
                    "{budget}/{moves}"
                );
                for g in &e.demote {
                    r[g.index()] = r[g.index()].moved_to(Tier::Slow);
                }
                for g in &e.promote {
                    r[g.index()] = r[g.index()].moved_to(Tier::Fast);
                }
                promoted += e.promote.len() as u64;
                lowest = lowest.min(r.iter().filter(|x| x.is_fast()).count() as u64);
            }
            assert_eq!(
                (lowest, promoted),
                want,
                "{budget}/{moves}/{headroom}/{cands}"
            );
        }
    }
}
