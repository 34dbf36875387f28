//! The default policy's cost/benefit rule: a granule is promoted (into free DRAM or in
//! exchange for a resident) only if the slow-tier accesses it is expected to save over a
//! horizon pay back the move.
//!
//! **Cost.** A move copies the granule and unmaps it (a TLB shootdown on every CPU that ran the
//! guest). The simulator and docs price it by the measured `move_pages(2)` bandwidth, which
//! includes unmap and shootdown: 3.31 GB/s at 4 KiB, 11.02 GB/s at 2 MiB
//! (shared/guide/anchors.md), interpolated by the logarithm of the granule size in between.
//! A 4 KiB move costs 1.24 µs, a 2 MiB one 190 µs: 154 times as much.
//!
//! **Benefit.** What the tracking sources give is heat, not an absolute access rate: DAMON and
//! accessed-bit scans say in which sample intervals a granule was touched, and the heat rule
//! ([`HeatRecord::heat_gain`]) is logarithmic in that fraction, 2 heat levels per factor of 2.
//! So costs are compared on that scale: the policy's `promote_min_heat` (4: a 4 KiB page seen
//! in a few percent of the samples, tick after tick) is the heat at which a **4 KiB** move pays
//! back, and a granule whose move costs `R` times as much needs `2·log2(R)` more heat:
//! [`move_cost_heat`], 4 at 4 KiB, 19 at 2 MiB. The 2 MiB figure is also why it must be so: with
//! THP, DAMON reads one accessed bit for the whole 2 MiB, so one touched 4 KiB page makes a
//! 2 MiB granule look as hot as 512.
//!
//! **Horizon and persistence.** Heat is a decayed sum (`heat = heat/2 + gain`), so a granule
//! touched at a steady rate keeps its heat, and one touched once halves every tick: over any
//! horizon, a one-off earns back no more than one tick of its rate. A granule whose heat is
//! above what one tick of observation can give ([`PolicyInput::max_gain`], 16) was seen in at
//! least two ticks: its heat is *sustained* and counts for every tick of the horizon
//! (`payback_ticks`, `H`): `2·log2(H)` more heat. So a promotion pays back if
//!
//! - `heat + 2·log2(H) ≥ cost` for sustained heat (heat > 16), or
//! - `heat ≥ cost` otherwise,
//!
//! and a swap (two moves) needs `cost + 2` in the same sense, besides the policy's
//! `swap_margin` over the resident it displaces. With `H` = 2 at 2 MiB (cost 19): a granule is
//! promoted from heat 17 — seen hot in at least two consecutive ticks, paid back within the
//! two ticks — while a sweep, a scan or a checksum pass that touches it in one tick (≤ 16) never
//! pays back. At 4 KiB (cost 4) a page is promoted from heat 4 as before: a sweep's touch of a
//! 4 KiB page is one sample hit or two (gain ≤ 7, and 1–3 in a 200-sample tick), and the move is
//! cheap.
//!
//! **Adaptive hot threshold.** As Memtis sizes its hot bin to the fast tier (SOSP'23), the hot
//! threshold `T` is the lowest heat such that all granules at or above it fit the budget
//! ([`hot_threshold`]). A resident at or above `T` belongs to the hot set and is never a swap
//! victim: if the hot bin fits, there is room or a colder resident for every hot slow granule.
//!
//! All of it is arithmetic on the tick's input: no state between ticks, no per-granule state.

use vmtier_core::policy::{HeatRecord, PolicyInput};

use crate::select::{Histogram, BUCKETS};

/// `move_pages(2)` bandwidth at 4 KiB, GB/s (anchors: upstream baseline).
pub const MIGRATE_GB_S_4K: f64 = 3.31;
/// `move_pages(2)` bandwidth at 2 MiB, GB/s (anchors: upstream baseline).
pub const MIGRATE_GB_S_2M: f64 = 11.02;

/// Nanoseconds to move one granule of `bytes` (clamped to 4 KiB ..= 2 MiB for the
/// bandwidth; the bytes themselves are not clamped).
pub fn move_ns(bytes: u64) -> f64 {
    let b = bytes.max(1) as f64;
    let t = ((b.log2() - 12.0) / 9.0).clamp(0.0, 1.0);
    let gb_s = MIGRATE_GB_S_4K * (MIGRATE_GB_S_2M / MIGRATE_GB_S_4K).powf(t);
    b / gb_s
}

/// The heat at which moving a granule of `granule_bytes` pays back, given that a 4 KiB move
/// pays back at `heat_4k`: `heat_4k + 2·log2(move_ns(granule) / move_ns(4 KiB))`, rounded up,
/// at most 32 (nothing pays back).
pub fn move_cost_heat(granule_bytes: u64, heat_4k: u8) -> u8 {
    let r = move_ns(granule_bytes) / move_ns(4096);
    let extra = (2.0 * r.max(1.0).log2()).ceil();
    // 0 ≤ extra ≤ 2·log2(2^40) for any u64 size: fits.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let extra = extra.min(64.0) as u8;
    heat_4k.saturating_add(extra).min(BUCKETS as u8)
}

/// The cost/benefit thresholds of one tick, in heat of the tick's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Payback {
    /// Heat a promotion into free room needs.
    pub fill_min: u8,
    /// Heat a swap's incoming granule needs (its margin over the resident is the policy's).
    pub swap_min: u8,
    /// Heat above which it is sustained (more than one tick of observation gives).
    pub sustained_above: u8,
}

impl Payback {
    /// The thresholds for `input` (its granule size and source range), with a 4 KiB move
    /// paying back at `heat_4k` and sustained heat counting over `horizon` ticks.
    pub fn new(input: &PolicyInput<'_>, heat_4k: u8, horizon: u8) -> Self {
        let cost = move_cost_heat(input.granule_bytes, heat_4k);
        // The size term is on the full-range scale; a weaker source (soft-dirty) gets it
        // scaled like every margin, the 4 KiB anchor as configured.
        let cost = heat_4k.saturating_add(input.scaled_heat(cost.saturating_sub(heat_4k)));
        let bonus = (2.0 * f64::from(horizon.max(1)).log2()).floor();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bonus = bonus.min(31.0) as u8;
        let sustained_above = input.max_gain.min(HeatRecord::MAX_HEAT);
        // The lowest heat h with h ≥ c, or h > sustained_above and h + bonus ≥ c.
        let lowest = |c: u8| -> u8 {
            (0..=HeatRecord::MAX_HEAT)
                .find(|&h| h >= c || (h > sustained_above && h.saturating_add(bonus) >= c))
                .unwrap_or(BUCKETS as u8)
        };
        Self {
            fill_min: lowest(cost),
            swap_min: lowest(cost.saturating_add(2)),
            sustained_above,
        }
    }
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

    #[test]
    fn move_cost_grows_with_the_granule() {
        // (granule bytes) -> (ns to move, heat at which it pays back with a 4 KiB anchor of 4)
        for (bytes, ns, heat) in [
            (4096u64, 1237.0, 4),
            (65536, 11_600.0, 11),
            (2 << 20, 190_300.0, 19),
            (1 << 30, 97_400_000.0, 32),
        ] {
            let got = move_ns(bytes);
            assert!((got - ns).abs() / ns < 0.01, "{bytes}: {got} ns");
            assert_eq!(move_cost_heat(bytes, 4), heat, "{bytes}");
        }
    }

    #[test]
    fn thresholds_table() {
        let r = [HeatRecord::default()];
        // (granule bytes, max gain, horizon) -> (fill_min, swap_min)
        for (bytes, gain, horizon, want) in [
            // 2 MiB, full-range source: only heat seen in two ticks (> 16) pays back.
            (2u64 << 20, 16u8, 2u8, (17, 19)),
            (2 << 20, 16, 1, (19, 21)),
            (2 << 20, 16, 8, (17, 17)),
            // 4 KiB: cheap, the configured 4 and 4 + 2.
            (4096, 16, 2, (4, 6)),
            // Soft-dirty (3 per tick) at 2 MiB: its 15 levels of size term scale to 3.
            (2 << 20, 3, 2, (5, 7)),
        ] {
            let mut input = PolicyInput::from_records(0, bytes, &r, 1, 1);
            input.max_gain = gain;
            let p = Payback::new(&input, 4, horizon);
            assert_eq!(
                (p.fill_min, p.swap_min),
                want,
                "{bytes} B, gain {gain}, H {horizon}"
            );
        }
        // Whatever the horizon, one tick of heat (≤ 16) never pays back a 2 MiB move.
        let input = PolicyInput::from_records(0, 2 << 20, &r, 1, 1);
        for horizon in 1..=255 {
            assert!(Payback::new(&input, 4, horizon).fill_min > HeatRecord::HEAT_GAIN);
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
