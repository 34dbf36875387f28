//! The default policy's cost/benefit rule: a granule is promoted (into free DRAM or in
//! exchange for a resident) only if the slow-tier accesses it is expected to save pay back
//! the move.
//!
//! **Cost.** A move copies the granule and unmaps it (a TLB shootdown on every CPU that ran the
//! guest). The simulator and docs price it by the measured `move_pages(2)` bandwidth, which
//! includes unmap and shootdown: 3.31 GB/s at 4 KiB, 11.02 GB/s at 2 MiB
//! (shared/guide/anchors.md), interpolated by the logarithm of the granule size in between.
//! A 4 KiB move costs 1.24 µs, a 2 MiB one 190 µs: 154 times as much.
//!
//! **What one tick can show.** The sources give heat, not an absolute access rate: DAMON and
//! accessed-bit scans say in which sample intervals a granule was touched, and the heat rule
//! ([`vmtier_core::policy::HeatRecord::heat_gain`]) is logarithmic in that fraction, 2 levels per factor of 2; one
//! tick gives at most [`PolicyInput::max_gain`] (16). The policy's `promote_min_heat` (4) is
//! the heat at which a 4 KiB move pays back; on the same scale a move `R` times as dear needs
//! `2·log2(R)` more ([`move_cost_heat`]): 11 at 64 KiB, 16 at 512 KiB, 19 at 2 MiB. Where that is more than
//! one tick can give (granules above 512 KiB), **no single tick of observation pays back a
//! move**: whatever it saw may be a one-off — a sweep, a scan or a checksum pass that touched
//! the granule once — and a one-off saves nothing after the tick that saw it. With THP this
//! matters twice: DAMON reads one accessed bit for the whole 2 MiB, so one touched 4 KiB page
//! makes the granule look as hot as 512.
//!
//! **Persistence.** Such a slow granule is ranked by its *sustained* heat over three ticks
//! ([`sustained`]); the two previous ticks' heat is the state the policy keeps ([`History`],
//! 2 bytes per granule), only where this rule applies: heat alone cannot tell a decaying
//! one-off (16, then 8) from a steady granule (8, 8), nor a touch on top of a lukewarm granule
//! from a hot one. Two ticks are not enough either: in the testbed a background sweep is seen
//! in two ticks running (it straddles a tick boundary, or DAMON's regions blur it), and a tick
//! whose gain fell [`FADE_LEVELS`] below the tick before's sustains nothing. Sustained
//! heat is expected to go on, and a granule that stays hot tick after tick is used densely, so
//! its benefit grows with its pages as its cost does — per page a 2 MiB move costs a third of
//! a 4 KiB one — and it pays back from the same `promote_min_heat` within a tick or two.
//!
//! **Base pages.** All of that is about what one accessed bit says. Where the engine knows
//! that base pages alone map a granule ([`PolicyInput::huge`]), each access check reads one
//! 4 KiB page's bit and a granule's heat tells how many of its pages are in use: a pass over
//! it touches each page once and few checks see that. Its move pays back on the same
//! `promote_min_heat` as its pages' own 4 KiB moves would, so only the one-off remains to
//! rule out, and two ticks running do that ([`sustained_base`]): such granules are promoted
//! a tick sooner.
//!
//! At 4 KiB and up to 512 KiB one tick's heat can pay back a move: nothing changes there and
//! no history is kept. The simulator backs that: on the suite's traces, ranking 4 KiB pages by
//! sustained heat loses hit ratio (docs/policies.md). Nor does anything change for a region
//! that hybrid tracking split to 4 KiB detail ([`PolicyInput::split`]): its promotion moves
//! only its hot pages.
//!
//! **Adaptive hot threshold.** As Memtis sizes its hot bin to the fast tier (SOSP'23), the hot
//! threshold `T` is the lowest heat such that all granules at or above it fit the budget
//! ([`hot_threshold`]). A resident at or above `T` belongs to the hot set and is never a swap
//! victim: if the hot bin fits, there is room or a colder resident for every hot slow granule.

use vmtier_core::policy::{HeatRecord, PolicyInput};

use crate::select::{Histogram, BUCKETS};

/// `move_pages(2)` bandwidth at 4 KiB, GB/s (anchors: upstream baseline).
pub const MIGRATE_GB_S_4K: f64 = 3.31;
/// `move_pages(2)` bandwidth at 2 MiB, GB/s (anchors: upstream baseline).
pub const MIGRATE_GB_S_2M: f64 = 11.02;

/// Nanoseconds to move one granule of `bytes` (bandwidth clamped to its 4 KiB and 2 MiB
/// figures outside that range).
pub fn move_ns(bytes: u64) -> f64 {
    let b = bytes.max(1) as f64;
    let t = ((b.log2() - 12.0) / 9.0).clamp(0.0, 1.0);
    let gb_s = MIGRATE_GB_S_4K * (MIGRATE_GB_S_2M / MIGRATE_GB_S_4K).powf(t);
    b / gb_s
}

/// The heat a move of a granule of `granule_bytes` would need to pay back on one tick's
/// evidence, given that a 4 KiB move pays back at `heat_4k`: `heat_4k + 2·log2(move_ns(granule)
/// / move_ns(4 KiB))`, rounded up, at most 32.
pub fn move_cost_heat(granule_bytes: u64, heat_4k: u8) -> u8 {
    let r = move_ns(granule_bytes) / move_ns(4096);
    let extra = (2.0 * r.max(1.0).log2()).ceil();
    // 0 ≤ extra ≤ 2·log2(2^40) for any u64 size: fits.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let extra = extra.min(64.0) as u8;
    heat_4k.saturating_add(extra).min(BUCKETS as u8)
}

/// Whether one tick of `input`'s source can pay back a move of its granules (`heat_4k` as in
/// [`move_cost_heat`]); if not, promotions need sustained heat. The size term is on the
/// full-range scale and scaled to a weaker source (soft-dirty) like every margin.
pub fn one_tick_pays(input: &PolicyInput<'_>, heat_4k: u8) -> bool {
    let cost = move_cost_heat(input.granule_bytes, heat_4k);
    let cost = heat_4k.saturating_add(input.scaled_heat(cost.saturating_sub(heat_4k)));
    cost <= input.max_gain
}

/// Every granule's heat as the policy saw it in the two ticks before (2 bytes per granule,
/// kept only where one tick cannot pay back a move). Cleared when the granule count changes
/// or a tick was skipped, so stale history never promotes anything.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// A tick ago.
    prev: Vec<u8>,
    /// Two ticks ago (empty until known).
    prev2: Vec<u8>,
    tick: Option<u64>,
}

impl History {
    /// Granule `i`'s heat a tick ago, if known, and two ticks ago, if known too.
    pub fn prev(&self, i: usize) -> Option<(u8, Option<u8>)> {
        Some((*self.prev.get(i)?, self.prev2.get(i).copied()))
    }

    /// Makes the history fit `input`: cleared unless it is of the tick right before, over the
    /// same number of granules.
    pub fn align(&mut self, input: &PolicyInput<'_>) {
        let follows = self.tick.and_then(|t| t.checked_add(1)) == Some(input.tick);
        if !follows || self.prev.len() != input.records.len() {
            self.prev.clear();
            self.prev2.clear();
        }
    }

    /// Records this tick's heats for the next tick.
    pub fn remember(&mut self, input: &PolicyInput<'_>) {
        std::mem::swap(&mut self.prev, &mut self.prev2);
        self.prev.clear();
        self.prev.extend(input.records.iter().map(|r| r.heat()));
        if self.prev2.len() != self.prev.len() {
            self.prev2.clear();
        }
        self.tick = Some(input.tick);
    }

    /// Forgets everything and frees the memory (granules cheap enough to need no history).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        (self.prev.capacity() + self.prev2.capacity()) as u64
    }
}

/// Levels of heat gain by which a tick's gain may fall short of the tick before's and still
/// count as use kept up: 6 levels are a factor of 8 in the fraction of samples that saw the
/// granule accessed ([`vmtier_core::policy::HeatRecord::heat_gain`], 2 levels per factor of 2).
pub const FADE_LEVELS: u8 = 6;

/// The heat a slow granule has *sustained* over three ticks: the least of its heat now, a tick
/// ago, twice its heat two ticks ago (it has halved once more since), and twice what this tick
/// added (the heat a steady rate of this tick's gain settles at); 0 if this tick added nothing,
/// if its gain fell [`FADE_LEVELS`] or more below the tick before's (the use is fading, not
/// kept up), or without history. A granule touched in one tick, or two running (a sweep that
/// straddles a tick boundary or that DAMON blurs over two ticks), counts for no more than its
/// own heat before the touch, and nothing while the touch fades out (a sweep's gains 5, 16, 6:
/// DAMON regions that straddle the granule's edges carry the sweep's accesses next door into
/// it); a steady rate counts for its heat from the third tick it is seen (16, 24, 28: 24), a
/// weak one as well (5% of 20 samples: 3, 4, 5: 4), a granule seen every other tick for its
/// quiet tick's heat.
///
/// One exception: a granule found accessed in nearly every check of two ticks running (a
/// gain of [`HeatRecord::HEAT_GAIN`] both times: at least 84 % of the checks, at least 5
/// hits) counts for the least of its two heats from the second. Whatever one accessed bit
/// covers, only use that kept up for the two ticks gives that: the testbed guest's
/// background sweep, which fills a THP for about 0.7 s, never reached it in two ticks
/// running (full gain in one tick at most, 2 to 14 in the ticks either side), while every
/// granule of its hot set did.
pub fn sustained(heat: u8, prev: Option<(u8, Option<u8>)>) -> u8 {
    let Some((p, p2)) = prev else { return 0 };
    let Some((gain, prev_gain)) = kept_up(heat, p, p2) else {
        return 0;
    };
    if gain >= HeatRecord::HEAT_GAIN && prev_gain >= HeatRecord::HEAT_GAIN {
        return heat.min(p);
    }
    let Some(p2) = p2 else { return 0 };
    heat.min(p)
        .min(p2.saturating_mul(2))
        .min(gain.saturating_mul(2))
}

/// The heat a slow granule that base pages alone map has sustained over two ticks
/// ([`PolicyInput::is_base_paged`]): the least of its heat now, a tick ago, and twice what this
/// tick added; 0 if this tick added nothing, if its gain fell [`FADE_LEVELS`] or more below
/// the tick before's (as far as that is known), or without the tick before.
///
/// Where each check reads one 4 KiB page's accessed bit, heat measures how many of the
/// granule's pages are in use, not only whether one was: a pass over the granule (a sweep,
/// a copy) touches each page once and is found by few checks. In the testbed's 4 KiB guest
/// the background sweep's granules reach a tick's gain of 5 at most (two hits), then fade,
/// while the hot set gains 8 to 14 every tick. One tick is still not enough (the sweep's 5
/// is above `promote_min_heat`); two running are, so such a granule is promoted from its
/// second tick, a tick sooner than [`sustained`] allows where one bit covers 2 MiB.
pub fn sustained_base(heat: u8, prev: Option<(u8, Option<u8>)>) -> u8 {
    let Some((p, p2)) = prev else { return 0 };
    let Some((gain, _)) = kept_up(heat, p, p2) else {
        return 0;
    };
    heat.min(p).min(gain.saturating_mul(2))
}

/// The gains of this tick and the tick before (`heat` now, `p` a tick ago and `p2` two ticks
/// ago if known; unknown counts as 0), if this tick's keeps use up: `None` if it added
/// nothing or fell [`FADE_LEVELS`] or more below the tick before's.
fn kept_up(heat: u8, p: u8, p2: Option<u8>) -> Option<(u8, u8)> {
    let gain = heat.saturating_sub(p / 2);
    let prev_gain = p.saturating_sub(p2.unwrap_or(0) / 2);
    (gain > 0 && gain.saturating_add(FADE_LEVELS) > prev_gain).then_some((gain, prev_gain))
}

/// The lowest heat bucket `T` such that every granule (either tier) at or above it fits in
/// `budget`; `BUCKETS` if not even the hottest bucket fits.
pub fn hot_threshold(h: &Histogram, budget: u64) -> u8 {
    let mut above = 0u64;
    let mut t = BUCKETS;
    for b in (0..BUCKETS).rev() {
        above = above
            .saturating_add(h.fast_all[b])
            .saturating_add(h.slow_all[b]);
        if above > budget {
            break;
        }
        t = b;
    }
    u8::try_from(t).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::{HeatRecord, Tier};

    #[test]
    fn move_cost_grows_with_the_granule() {
        // (granule bytes) -> (ns to move, heat one tick would need with a 4 KiB anchor of 4,
        // whether one tick of a full-range source can pay it)
        for (bytes, ns, heat, one_tick) in [
            (4096u64, 1237.0, 4, true),
            (65536, 11_600.0, 11, true),
            (131_072, 20_300.0, 13, true),
            (262_144, 35_500.0, 14, true),
            (524_288, 62_150.0, 16, true),
            (2 << 20, 190_300.0, 19, false),
            (1 << 30, 97_400_000.0, 32, false),
        ] {
            let got = move_ns(bytes);
            assert!((got - ns).abs() / ns < 0.01, "{bytes}: {got} ns");
            assert_eq!(move_cost_heat(bytes, 4), heat, "{bytes}");
            let r = [HeatRecord::default()];
            let input = PolicyInput::from_records(0, bytes, &r, 1, 1);
            assert_eq!(one_tick_pays(&input, 4), one_tick, "{bytes}");
        }
        // Soft-dirty (3 per tick): the 15 levels of the 2 MiB size term scale to 3; 4 + 3 > 3.
        let r = [HeatRecord::default()];
        let mut sd = PolicyInput::from_records(0, 2 << 20, &r, 1, 1);
        sd.max_gain = 3;
        assert!(!one_tick_pays(&sd, 4));
    }

    #[test]
    fn sustained_table() {
        // (heat now, a tick ago, two ticks ago) -> sustained heat
        for (heat, prev, want) in [
            (28, Some((24, Some(16))), 24), // steady, third tick
            (22, Some((14, Some(0))), 0),   // second tick at gain 15 after 14: not yet
            (24, Some((16, Some(0))), 16),  // second tick at full gain after full gain
            (24, Some((16, None)), 16),     // ... the policy's second tick
            (23, Some((16, None)), 0),      // ... gain 15 only: not yet
            (16, Some((0, Some(0))), 0),    // a one-off touch of a cold granule
            (18, Some((12, Some(0))), 0),   // a sweep seen in two ticks running
            (9, Some((18, Some(12))), 0),   // ... the tick after it: not seen
            (12, Some((18, Some(12))), 0),  // ... or seen at gain 3 only: fading (12 before)
            (15, Some((18, Some(5))), 0),   // a sweep's 5, 16, 6 (testbed): fading
            (20, Some((21, Some(10))), 0),  // 9.5, 16, 10: 6 levels down, fading
            (21, Some((21, Some(10))), 20), // 9.5, 16, 11: 5 levels down, still kept up
            (20, Some((17, Some(6))), 12),  // 6, 14, 12: kept up (a sweep too slow to tell)
            (21, Some((15, Some(3))), 6),   // 3, 14, 14: the same
            (18, Some((4, Some(4))), 4),    // a touch on top of a lukewarm granule: its own 4
            (15, Some((7, Some(15))), 7),   // seen every other tick: its quiet tick's heat
            (5, Some((4, Some(3))), 4),     // weak but steady
            (31, Some((31, Some(31))), 31), // hot
            (31, None, 0),                  // no history
        ] {
            assert_eq!(sustained(heat, prev), want, "{heat} after {prev:?}");
        }
        // Whatever one tick or two running add to a cold granule, nothing is sustained then or
        // the tick after, unless both ticks were at full gain.
        for g in 0..=HeatRecord::HEAT_GAIN {
            for g2 in 0..=HeatRecord::HEAT_GAIN {
                let a = HeatRecord::new(0, Tier::Slow, 3).observed(g);
                let b = a.cooled().observed(g2);
                let c = b.cooled();
                let full = g == HeatRecord::HEAT_GAIN && g2 == HeatRecord::HEAT_GAIN;
                assert_eq!(sustained(a.heat(), Some((0, Some(0)))), 0, "{g}");
                assert_eq!(
                    sustained(b.heat(), Some((a.heat(), Some(0)))),
                    if full { a.heat() } else { 0 },
                    "{g} {g2}"
                );
                assert_eq!(
                    sustained(c.heat(), Some((b.heat(), Some(a.heat())))),
                    0,
                    "{g} {g2}"
                );
            }
        }
    }

    #[test]
    fn sustained_base_table() {
        // (heat now, a tick ago and two ticks ago if known) -> sustained heat, base pages
        for (heat, prev, want) in [
            (14, Some((9, None)), 9),     // the testbed's 4 KiB hot set, second tick
            (24, Some((16, None)), 16),   // a hot granule's second tick
            (16, None, 0),                // first tick: never
            (2, Some((5, None)), 0),      // a sweep's two hits, then nothing (testbed)
            (3, Some((4, Some(0))), 2),   // ... or one more: its gain 1 sustains 2
            (4, Some((3, Some(3))), 3),   // lukewarm and steady: its heat, below 4
            (14, Some((20, Some(8))), 0), // gain 4 after 16: fading
            (6, Some((4, Some(0))), 4),   // 4, then 4: weak but kept up
        ] {
            assert_eq!(sustained_base(heat, prev), want, "{heat} after {prev:?}");
        }
        // Whatever one tick adds to a cold granule sustains nothing that tick or the next
        // one without an access; two ticks sustain no more than either's heat.
        for g in 0..=HeatRecord::HEAT_GAIN {
            let a = HeatRecord::new(0, Tier::Slow, 3).observed(g);
            assert_eq!(sustained_base(a.heat(), None), 0, "{g}");
            let b = a.cooled();
            assert_eq!(
                sustained_base(b.heat(), Some((a.heat(), Some(0)))),
                0,
                "{g}"
            );
            for g2 in 0..=HeatRecord::HEAT_GAIN {
                let c = a.cooled().observed(g2);
                let s = sustained_base(c.heat(), Some((a.heat(), Some(0))));
                assert!(s <= g.max(g2) && s <= a.heat(), "{g} {g2}: {s}");
            }
        }
    }

    #[test]
    fn history_resets_on_a_skipped_tick_or_a_new_layout() {
        let r = vec![
            HeatRecord::new(20, Tier::Slow, 3),
            HeatRecord::new(2, Tier::Slow, 3),
        ];
        let mut h = History::default();
        for t in [4, 5] {
            let input = PolicyInput::from_records(t, 4096, &r, 1, 1);
            h.align(&input);
            h.remember(&input);
        }
        // (next tick, granules) -> granule 0's heats still known
        for (tick, n, kept) in [
            (6, 2, Some((20, Some(20)))),
            (7, 2, None),
            (6, 3, None),
            (5, 2, None),
        ] {
            let mut g = h.clone();
            let r2 = vec![HeatRecord::default(); n];
            g.align(&PolicyInput::from_records(tick, 4096, &r2, 1, 1));
            assert_eq!(g.prev(0), kept, "tick {tick} granules {n}");
        }
        // One tick of history gives the tick before only.
        let mut one = History::default();
        let input = PolicyInput::from_records(1, 4096, &r, 1, 1);
        one.align(&input);
        one.remember(&input);
        one.align(&PolicyInput::from_records(2, 4096, &r, 1, 1));
        assert_eq!(one.prev(0), Some((20, None)));
    }

    #[test]
    fn hot_threshold_fits_the_budget() {
        let mut h = Histogram::default();
        h.fast_all[31] = 4;
        h.slow_all[20] = 4;
        h.slow_all[3] = 10;
        h.fast_all[0] = 100;
        // budget -> T
        for (budget, want) in [(3, 32), (4, 21), (8, 4), (17, 4), (18, 1), (1000, 0)] {
            assert_eq!(hot_threshold(&h, budget), want, "budget {budget}");
        }
    }
}
