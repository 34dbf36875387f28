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
//! `2·log2(R)` more ([`move_cost_heat`]): 11 at 64 KiB, 19 at 2 MiB. Where that is more than
//! one tick can give (granules above 64 KiB), **no single tick of observation pays back a
//! move**: whatever it saw may be a one-off — a sweep, a scan or a checksum pass that touched
//! the granule once — and a one-off saves nothing after the tick that saw it. With THP this
//! matters twice: DAMON reads one accessed bit for the whole 2 MiB, so one touched 4 KiB page
//! makes the granule look as hot as 512.
//!
//! **Persistence.** Such a granule is promoted only once its heat is *sustained*: at or above
//! `sustain_heat` (9) in two consecutive ticks, or above what one tick can give (> 16). 9 is
//! chosen so that a one-off never qualifies: one tick's 16 at most has halved to 8 the tick
//! after. The previous tick's `heat ≥ sustain_heat` is the one bit per granule the policy
//! keeps ([`History`]); heat alone cannot tell a decaying one-off (16, 8) from a steady
//! lukewarm granule (8, 8). Sustained heat is expected to go on, and a granule that stays hot
//! tick after tick is dense (a working set, not one page of it: sparse use of a 2 MiB page
//! does not stay hot once DAMON's regions split around it), so its benefit grows with its pages
//! like its cost, and a 2 MiB move costs a third of 512 4 KiB ones per page: it pays back from
//! the same `promote_min_heat` within a tick or two of being promoted. A steadily hot granule is
//! thus promoted at the second tick it is seen (heat 16, then 24 with THP; ≥ 9 twice on 4 KiB
//! pages, where a hot 2 MiB granule reads 10–20% of samples).
//!
//! At 4 KiB and up to 64 KiB one tick's heat can pay back a move, so nothing changes there,
//! and no history is kept. The simulator backs that: on every trace in the suite, requiring
//! sustained heat at 4 KiB loses hit ratio (docs/policies.md).
//!
//! **Adaptive hot threshold.** As Memtis sizes its hot bin to the fast tier (SOSP'23), the hot
//! threshold `T` is the lowest heat such that all granules at or above it fit the budget
//! ([`hot_threshold`]). A resident at or above `T` belongs to the hot set and is never a swap
//! victim: if the hot bin fits, there is room or a colder resident for every hot slow granule.

use vmtier_core::policy::PolicyInput;

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

/// One bit per granule: the granule's heat was at or above the sustain heat in the tick
/// before. Cleared (no granule sustained) when the granule count changes or a tick was
/// skipped, so stale history never promotes anything.
#[derive(Clone, Debug, Default)]
pub struct History {
    bits: Vec<u64>,
    granules: usize,
    tick: Option<u64>,
}

impl History {
    /// Whether granule `i` was at or above the sustain heat in the previous tick.
    pub fn was_hot(&self, i: usize) -> bool {
        self.bits
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }

    /// Makes the history fit `input`: cleared unless it is of the tick right before, over the
    /// same number of granules.
    pub fn align(&mut self, input: &PolicyInput<'_>) {
        let n = input.records.len();
        let follows = self.tick.and_then(|t| t.checked_add(1)) == Some(input.tick);
        if !follows || self.granules != n {
            self.bits.clear();
            self.bits.resize(n.div_ceil(64), 0);
            self.granules = n;
        }
    }

    /// Records this tick's `heat ≥ sustain` for the next tick.
    pub fn remember(&mut self, input: &PolicyInput<'_>, sustain: u8) {
        let n = input.records.len();
        self.bits.clear();
        self.bits.resize(n.div_ceil(64), 0);
        for (i, r) in input.records.iter().enumerate() {
            if r.heat() >= sustain {
                self.bits[i / 64] |= 1u64 << (i % 64);
            }
        }
        self.granules = n;
        self.tick = Some(input.tick);
    }

    /// Forgets everything and frees the bits (granules cheap enough to need no history).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        (self.bits.capacity() * 8) as u64
    }
}

/// Whether a granule's heat is sustained: at or above `sustain` now and in the previous tick
/// (`was_hot`), or above `max_gain` (more than one tick of observation gives).
pub fn sustained(heat: u8, was_hot: bool, sustain: u8, max_gain: u8) -> bool {
    (was_hot && heat >= sustain) || heat > max_gain
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
        // (heat, was hot last tick) -> sustained, with sustain 9 and max gain 16
        for (heat, was, want) in [
            (16, false, false),
            (17, false, true),
            (9, true, true),
            (8, true, false),
            (31, false, true),
            (12, false, false),
        ] {
            assert_eq!(sustained(heat, was, 9, 16), want, "{heat} {was}");
        }
        // One tick's heat, however high, has halved below 9 the tick after.
        for g in 0..=HeatRecord::HEAT_GAIN {
            let next = HeatRecord::new(g, Tier::Slow, 3).cooled().heat();
            assert!(!sustained(next, g >= 9, 9, 16), "gain {g}");
        }
    }

    #[test]
    fn history_resets_on_a_skipped_tick_or_a_new_layout() {
        let r = vec![
            HeatRecord::new(20, Tier::Slow, 3),
            HeatRecord::new(2, Tier::Slow, 3),
        ];
        let mut h = History::default();
        let t5 = PolicyInput::from_records(5, 4096, &r, 1, 1);
        h.align(&t5);
        assert!(!h.was_hot(0));
        h.remember(&t5, 9);
        // (next tick, granules) -> granule 0 still remembered
        for (tick, n, kept) in [(6, 2, true), (7, 2, false), (6, 3, false), (5, 2, false)] {
            let mut g = h.clone();
            let r2 = vec![HeatRecord::default(); n];
            g.align(&PolicyInput::from_records(tick, 4096, &r2, 1, 1));
            assert_eq!(g.was_hot(0), kept, "tick {tick} granules {n}");
            assert!(!g.was_hot(1));
        }
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
