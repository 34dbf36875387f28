//! Shared planning machinery: bucketed histograms, budget-respecting quotas and a single
//! collection pass. Every heat-ranked policy (default, memtierd-like, Memtis-like) is a choice
//! of *key* (a bucket 0..32 per granule) plus [`Rules`]; the work is two linear passes over the
//! records and O(32) arithmetic in between, with no per-granule state.

use vmtier_core::policy::{Granule, HeatRecord, Plan, PolicyInput};

/// Number of key buckets.
pub const BUCKETS: usize = 32;

/// Granule counts per key bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// All fast granules.
    pub fast_all: [u64; BUCKETS],
    /// Fast granules that may move (settled).
    pub fast_movable: [u64; BUCKETS],
    /// Slow granules that may move (settled).
    pub slow_movable: [u64; BUCKETS],
    /// All slow granules.
    pub slow_all: [u64; BUCKETS],
    /// Granules in the fast tier.
    pub fast_used: u64,
}

/// How quotas are derived from a histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Slow granules below this bucket are never promoted.
    pub min_promote: u8,
    /// A swap needs the promoted bucket ≥ the demoted bucket + `margin` (≥ 1); with
    /// `by_worth`, + [`worth_margin`] of the demoted bucket.
    pub margin: u8,
    /// A swap needs the promoted bucket ≥ `swap_min` too: displacing a resident granule takes
    /// a granule that is clearly hot, while free room is filled from `min_promote` up.
    pub swap_min: u8,
    /// Only fast granules below this bucket are demoted by swaps (`BUCKETS` = any).
    pub demote_below: u8,
    /// Demote every settled fast granule below `demote_below`, even with room to spare.
    pub demote_cold_always: bool,
    /// Granules moved fewer than this many ticks ago stay put (unless over budget).
    pub min_move_age: u8,
    /// Free granules to keep by demoting settled fast granules below `min_promote` with the
    /// moves left over (TPP-style decoupled watermark), so a hot-set shift costs one move per
    /// granule instead of a swap.
    pub headroom: u64,
    /// Displacement by worth: the margin a swap needs grows with what the resident is worth
    /// now ([`worth_margin`]), so a resident that went cold is displaced by any slow granule
    /// at or above `min_promote`, while a steadily hot one keeps the full `margin`.
    pub by_worth: bool,
    /// Free granules to keep for memory the guest starts using, made by demoting settled
    /// fast granules of bucket 0 (seen in no recent tick) with the moves left over after
    /// swaps; 0 = none (the default policy's room for arrivals, [`crate::default`]).
    pub room: u64,
    /// How much of [`Self::room`] is made before swaps, with moves a swap would use: a
    /// granule that lands in free DRAM costs one move (the demotion that made the room), a
    /// swap two.
    pub room_first: u64,
}

/// The margin a slow granule needs over a resident granule whose key is `resident`, when
/// displacement goes by worth: the resident's own key, between 1 and `margin`.
///
/// The key is heat, which halves every tick the granule is not seen, so it already says
/// how long ago the resident was last hot: heat 16 seen once is 8 a tick later, 4, 2, 1.
/// A resident at heat `h` < `margin` is displaced by a slow granule at `2h` or more (twice
/// its worth); from `margin` up the fixed margin applies. A steadily hot resident (seen in
/// every tick: heat ≥ 16) needs a challenger at ≥ 24, more than one observation window can
/// give (16), so a one-window blip never displaces it.
pub fn worth_margin(resident: u8, margin: u8) -> u8 {
    resident.clamp(1, margin.max(1))
}

/// How many granules to take from each bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quotas {
    /// Demotions forced by an exceeded budget (any fast granule, coldest first).
    pub forced: [u64; BUCKETS],
    /// Demotions of settled fast granules.
    pub demote: [u64; BUCKETS],
    /// Promotions of settled slow granules.
    pub promote: [u64; BUCKETS],
}

impl Quotas {
    fn total(&self) -> u64 {
        self.forced
            .iter()
            .chain(&self.demote)
            .chain(&self.promote)
            .sum()
    }
}

fn bucket(k: u8) -> usize {
    usize::from(k).min(BUCKETS - 1)
}

/// Counts granules per bucket of `key(index, record)`.
pub fn histogram(
    records: &[HeatRecord],
    min_move_age: u8,
    mut key: impl FnMut(usize, HeatRecord) -> u8,
) -> Histogram {
    let mut h = Histogram::default();
    for (i, &r) in records.iter().enumerate() {
        let b = bucket(key(i, r));
        let movable = r.move_age() >= min_move_age;
        if r.is_fast() {
            h.fast_all[b] += 1;
            h.fast_movable[b] += u64::from(movable);
        } else {
            h.slow_all[b] += 1;
            h.slow_movable[b] += u64::from(movable);
        }
    }
    h.fast_used = h.fast_all.iter().sum();
    h
}

#[allow(clippy::needless_range_loop)] // parallel per-bucket arrays
/// Derives quotas that keep the fast tier within `budget` and the plan within `max_moves`.
pub fn quotas(h: &Histogram, budget: u64, max_moves: u64, rules: &Rules) -> Quotas {
    let mut q = Quotas::default();
    let mut moves = max_moves;
    let mut fast = h.fast_used;
    let mut excess = fast.saturating_sub(budget).min(moves);
    let mut fast_rem = h.fast_movable;
    for b in 0..BUCKETS {
        let t = excess.min(h.fast_all[b]);
        q.forced[b] = t;
        excess -= t;
        fast -= t;
        moves -= t;
        fast_rem[b] = fast_rem[b].saturating_sub(t);
    }
    let mut slow_rem = h.slow_movable;
    let below = usize::from(rules.demote_below).min(BUCKETS);
    if rules.demote_cold_always {
        for b in 0..below {
            let t = fast_rem[b].min(moves);
            q.demote[b] += t;
            fast_rem[b] -= t;
            fast -= t;
            moves -= t;
        }
    }
    let min_promote = bucket(rules.min_promote);
    let mut free = budget.saturating_sub(fast);
    for b in (min_promote..BUCKETS).rev() {
        let t = slow_rem[b].min(free).min(moves);
        q.promote[b] += t;
        slow_rem[b] -= t;
        free -= t;
        moves -= t;
    }
    // Room for arrivals, the part made before swaps.
    let room_below = below.min(1);
    let after = fast.saturating_add(q.promote.iter().sum());
    let need = rules
        .room
        .saturating_sub(budget.saturating_sub(after))
        .min(rules.room_first);
    make_room(&mut q, &mut fast_rem, room_below, need, &mut moves);
    let margin = |bf: usize| -> usize {
        let m = rules.margin.max(1);
        if rules.by_worth {
            usize::from(worth_margin(u8::try_from(bf).unwrap_or(u8::MAX), m))
        } else {
            usize::from(m)
        }
    };
    let mut bs = BUCKETS - 1;
    let mut bf = 0usize;
    // Swaps, a demotion and a promotion each. With one move left (a move limit of one
    // granule a tick: a low rate limit shared by many VMs, 2 MiB granules) the demotion
    // alone goes now and the promotion takes the room it left next tick; waiting for two
    // moves would never swap at all.
    while moves >= 1 {
        while bs > min_promote && slow_rem[bs] == 0 {
            bs -= 1;
        }
        while bf < BUCKETS && fast_rem[bf] == 0 {
            bf += 1;
        }
        if bf >= BUCKETS
            || bf >= below
            || slow_rem[bs] == 0
            || bs < bf + margin(bf)
            || bs < usize::from(rules.swap_min)
        {
            break;
        }
        if moves == 1 {
            q.demote[bf] += 1;
            fast_rem[bf] -= 1;
            moves = 0;
            break;
        }
        let k = slow_rem[bs].min(fast_rem[bf]).min(moves / 2);
        q.promote[bs] += k;
        q.demote[bf] += k;
        slow_rem[bs] -= k;
        fast_rem[bf] -= k;
        moves -= 2 * k;
    }
    let promoted: u64 = q.promote.iter().sum();
    let demoted: u64 = q.demote.iter().sum();
    let after = fast.saturating_add(promoted).saturating_sub(demoted);
    let mut need = rules.headroom.saturating_sub(budget.saturating_sub(after));
    for b in 0..min_promote.min(below) {
        let t = fast_rem[b].min(need).min(moves);
        q.demote[b] += t;
        fast_rem[b] -= t;
        need -= t;
        moves -= t;
    }
    // The rest of the room for arrivals, with the moves left.
    let promoted: u64 = q.promote.iter().sum();
    let demoted: u64 = q.demote.iter().sum();
    let after = fast.saturating_add(promoted).saturating_sub(demoted);
    let need = rules.room.saturating_sub(budget.saturating_sub(after));
    make_room(&mut q, &mut fast_rem, room_below, need, &mut moves);
    q
}

/// Demotes up to `need` movable fast granules of the buckets below `below`, coldest first,
/// within `moves`.
fn make_room(
    q: &mut Quotas,
    fast_rem: &mut [u64; BUCKETS],
    below: usize,
    mut need: u64,
    moves: &mut u64,
) {
    let below = below.min(BUCKETS);
    for (d, f) in q.demote[..below].iter_mut().zip(&mut fast_rem[..below]) {
        let t = (*f).min(need).min(*moves);
        *d += t;
        *f -= t;
        need -= t;
        *moves -= t;
    }
}

/// One pass over the records that takes granules bucket by bucket, in address order within a
/// bucket; promotions come out hottest bucket first, demotions coldest first.
pub fn collect(
    records: &[HeatRecord],
    min_move_age: u8,
    mut key: impl FnMut(usize, HeatRecord) -> u8,
    mut q: Quotas,
) -> Plan {
    let mut left = q.total();
    if left == 0 {
        return Plan::default();
    }
    let mut promote: Vec<Vec<Granule>> = vec![Vec::new(); BUCKETS];
    let mut demote: Vec<Vec<Granule>> = vec![Vec::new(); BUCKETS];
    for (i, &r) in records.iter().enumerate() {
        let b = bucket(key(i, r));
        let movable = r.move_age() >= min_move_age;
        let g = Granule(i as u32);
        if r.is_fast() {
            if q.forced[b] > 0 {
                q.forced[b] -= 1;
                demote[b].push(g);
                left -= 1;
            } else if movable && q.demote[b] > 0 {
                q.demote[b] -= 1;
                demote[b].push(g);
                left -= 1;
            }
        } else if movable && q.promote[b] > 0 {
            q.promote[b] -= 1;
            promote[b].push(g);
            left -= 1;
        }
        if left == 0 {
            break;
        }
    }
    Plan {
        promote: promote.into_iter().rev().flatten().collect(),
        demote: demote.into_iter().flatten().collect(),
    }
}

/// Histogram, quotas and collection in one call.
pub fn plan_by_key(
    input: &PolicyInput<'_>,
    rules: &Rules,
    mut key: impl FnMut(usize, HeatRecord) -> u8,
) -> Plan {
    let h = histogram(input.records, rules.min_move_age, &mut key);
    let q = quotas(&h, input.fast_budget, input.max_moves, rules);
    let plan = collect(input.records, rules.min_move_age, key, q);
    fit(input, &plan)
}

/// Trims a plan to what the engine will apply ([`Plan::enforce`], the one rule), within the
/// move limit: demotions the budget forces beyond the plan are left to the engine.
pub fn fit(input: &PolicyInput<'_>, plan: &Plan) -> Plan {
    let mut e = plan.enforce(input.records, input.fast_budget, input.max_moves);
    let own = e.demote.len() - usize::try_from(e.forced).unwrap_or(0);
    let max = usize::try_from(input.max_moves).unwrap_or(usize::MAX);
    e.demote.truncate(own.min(max));
    e.promote.truncate(max - e.demote.len());
    Plan {
        promote: e.promote,
        demote: e.demote,
    }
}

/// The `k` coldest fast granules by heat (ties in address order), whatever their move age.
pub fn coldest_fast(records: &[HeatRecord], k: u64) -> Vec<Granule> {
    let h = histogram(records, 0, |_, r| r.heat());
    let mut q = Quotas::default();
    let mut left = k.min(h.fast_used);
    for b in 0..BUCKETS {
        let t = left.min(h.fast_all[b]);
        q.forced[b] = t;
        left -= t;
    }
    collect(records, 0, |_, r| r.heat(), q).demote
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use vmtier_core::policy::Tier;

    fn recs(spec: &[(u8, Tier)]) -> Vec<HeatRecord> {
        spec.iter()
            .map(|&(h, t)| HeatRecord::new(h, t, HeatRecord::SETTLED))
            .collect()
    }

    const RULES: Rules = Rules {
        min_promote: 2,
        margin: 2,
        swap_min: 0,
        demote_below: BUCKETS as u8,
        demote_cold_always: false,
        min_move_age: 3,
        headroom: 0,
        by_worth: false,
        room: 0,
        room_first: 0,
    };

    #[test]
    fn quotas_table() {
        use Tier::{Fast as F, Slow as S};
        // (records, budget, max_moves, promote, demote)
        let cases: Vec<(Vec<(u8, Tier)>, u64, u64, Vec<u32>, Vec<u32>)> = vec![
            // Room: promote hottest first, skip too cold.
            (vec![(5, S), (9, S), (1, S)], 2, 10, vec![1, 0], vec![]),
            // Full: swap only with enough margin.
            (vec![(9, S), (8, F), (3, F)], 2, 10, vec![0], vec![2]),
            (vec![(4, S), (3, F)], 1, 10, vec![], vec![]),
            // Over budget: coldest demoted, whatever else.
            (vec![(9, F), (1, F), (5, F)], 1, 10, vec![], vec![1, 2]),
            // Move limit: a swap needs two moves; with one, the demotion goes first.
            (vec![(9, S), (0, F)], 1, 1, vec![], vec![1]),
            (vec![(9, S), (8, S), (0, F), (1, F)], 2, 2, vec![0], vec![2]),
            (
                vec![(9, S), (8, S), (0, F), (1, F)],
                2,
                3,
                vec![0],
                vec![2, 3],
            ),
            // ... and only where a swap would be made.
            (vec![(3, S), (2, F)], 1, 1, vec![], vec![]),
        ];
        for (spec, budget, max_moves, promote, demote) in cases {
            let r = recs(&spec);
            let input = PolicyInput::from_records(0, 4096, &r, budget, max_moves);
            let plan = plan_by_key(&input, &RULES, |_, r| r.heat());
            let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
            assert_eq!(ids(&plan.promote), promote, "{spec:?}");
            assert_eq!(ids(&plan.demote), demote, "{spec:?}");
        }
    }

    #[test]
    fn swap_min_keeps_lukewarm_granules_from_displacing_residents() {
        use Tier::{Fast as F, Slow as S};
        // (slow heat, swap_min) -> swapped?
        for (heat, swap_min, swapped) in [(9, 0, true), (9, 10, false), (17, 10, true)] {
            let r = recs(&[(heat, S), (0, F)]);
            let input = PolicyInput::from_records(0, 4096, &r, 1, 10);
            let rules = Rules { swap_min, ..RULES };
            let plan = plan_by_key(&input, &rules, |_, r| r.heat());
            assert_eq!(
                !plan.promote.is_empty(),
                swapped,
                "heat {heat} swap_min {swap_min}"
            );
            // Free room is still filled regardless of swap_min.
            let r = recs(&[(heat, S)]);
            let input = PolicyInput::from_records(0, 4096, &r, 1, 10);
            assert_eq!(
                plan_by_key(&input, &rules, |_, r| r.heat()).promote.len(),
                1
            );
        }
    }

    #[test]
    fn displacement_by_worth_table() {
        use Tier::{Fast as F, Slow as S};
        // (resident heat, slow heat, by worth) -> swapped; margin 8, min_promote 2
        let cases = [
            // An untouched resident: any slow granule from min_promote up displaces it by
            // worth; the fixed margin needs 8.
            (0u8, 2u8, true, true),
            (0, 7, false, false),
            (0, 8, false, true),
            // A resident cooling off (heat halves each tick unseen) is worth its heat: a
            // challenger needs twice that.
            (3, 6, true, true),
            (3, 5, true, false),
            (6, 12, true, true),
            (6, 11, true, false),
            // A steadily hot resident keeps the full margin: a one-window blip (≤ 16) never
            // displaces it, by worth or not.
            (16, 16, true, false),
            (16, 23, true, false),
            (16, 24, true, true),
            (12, 16, true, false),
            (12, 20, true, true),
        ];
        for (res, slow, by_worth, want) in cases {
            let r = recs(&[(slow, S), (res, F)]);
            let input = PolicyInput::from_records(0, 4096, &r, 1, 10);
            let rules = Rules {
                margin: 8,
                by_worth,
                ..RULES
            };
            let plan = plan_by_key(&input, &rules, |_, r| r.heat());
            assert_eq!(
                !plan.promote.is_empty(),
                want,
                "resident {res}, slow {slow}, by worth {by_worth}"
            );
        }
        // worth_margin itself: the resident's key between 1 and the margin.
        for (res, margin, want) in [(0u8, 8u8, 1u8), (5, 8, 5), (20, 8, 8), (3, 0, 1)] {
            assert_eq!(worth_margin(res, margin), want, "{res} {margin}");
        }
    }

    #[test]
    fn displacement_by_worth_pairs_hottest_with_coldest() {
        use Tier::{Fast as F, Slow as S};
        // Several candidates and victims with noisy heats: the hottest slow granules replace
        // the residents worth least, and only pairs that clear the worth margin swap.
        let r = recs(&[
            (9, S),
            (3, S),
            (14, S),
            (5, S),
            (2, F),
            (20, F),
            (7, F),
            (0, F),
        ]);
        let input = PolicyInput::from_records(0, 4096, &r, 4, 100);
        let rules = Rules {
            margin: 8,
            by_worth: true,
            ..RULES
        };
        let plan = plan_by_key(&input, &rules, |_, r| r.heat());
        // 14 over 0 and 9 over 2 (≥ 4) swap; 5 over 7 does not (needs 14).
        let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
        assert_eq!(ids(&plan.promote), vec![2, 0]);
        assert_eq!(ids(&plan.demote), vec![7, 4]);
    }

    #[test]
    fn recently_moved_granules_stay_unless_forced() {
        let r = vec![
            HeatRecord::new(20, Tier::Slow, 1),
            HeatRecord::new(0, Tier::Fast, 0),
        ];
        let input = PolicyInput::from_records(0, 4096, &r, 1, 10);
        assert!(plan_by_key(&input, &RULES, |_, r| r.heat()).is_empty());
        let over = PolicyInput::from_records(0, 4096, &r, 0, 10);
        assert_eq!(
            plan_by_key(&over, &RULES, |_, r| r.heat()).demote,
            vec![Granule(1)]
        );
    }

    #[test]
    fn coldest_fast_orders_by_heat() {
        let r = recs(&[
            (5, Tier::Fast),
            (1, Tier::Fast),
            (0, Tier::Slow),
            (3, Tier::Fast),
        ]);
        assert_eq!(coldest_fast(&r, 2), vec![Granule(1), Granule(3)]);
        assert_eq!(coldest_fast(&r, 9).len(), 3);
    }
}
