//! Hybrid 2 MiB / 4 KiB tracking: the rules, one implementation for vmtierd's hotness store,
//! its engine and the trace simulator.
//!
//! A policy plans over 2 MiB *regions* (equal granules, so every policy works unchanged).
//! Most regions are uniform — all hot or all cold — and move whole: one transparent huge page,
//! one migration. A region whose heat is **mixed** (two reports with very different heat cut
//! it, or only part of it was seen) is *split*: it gets a 4 KiB *detail* array of
//! [`HeatRecord`]s, and when the policy promotes it only its hot pages move ("split sparse,
//! promote dense whole"). A split region whose pages turn uniform again is merged (its detail
//! dropped). The number of split regions is capped, which bounds the tracking state.
//!
//! The policy counts a region in the fast tier as one granule, but a split region in DRAM holds
//! only its hot pages there. [`policy_budget`] turns the VM's budget in pages into the
//! policy's budget in regions: as many regions as a hottest-first fill of the budget *in
//! pages* takes, each region costing the pages it holds or would take to the fast tier. The
//! budget in pages stays the hard limit: [`fit`] trims the enforced plan to it (forcing the
//! coldest regions out when over it, dropping promotions that do not fit).

use crate::policy::{Enforced, Granule, HeatRecord, PolicyInput, Tier};

/// Base pages per region (one 2 MiB huge page).
pub const REGION_PAGES: u64 = 512;

/// A page of a split region is hot enough to move with its region at this heat (in units of a
/// full-range source, like the default policy's `promote_min_heat`; scale it with
/// `PolicyInput::scaled_heat`).
pub const HOT_MIN: u8 = 4;

/// [`HOT_MIN`] for a source whose largest gain per tick is `max_gain`
/// ([`PolicyInput::scaled_heat`]).
pub fn hot_min(max_gain: u8) -> u8 {
    let mut input = PolicyInput::from_records(0, 4096, &[], 0, 0);
    input.max_gain = max_gain;
    input.scaled_heat(HOT_MIN)
}

/// A split region merges back when its pages' heats are within this spread (and all on one
/// tier).
pub const MERGE_SPREAD: u8 = 2;

/// What one report (or the lack of one) did to a region during a tick.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionSeen {
    /// Smallest heat gain of a report covering part of the region.
    pub min_gain: u8,
    /// Largest heat gain of a report covering part of the region.
    pub max_gain: u8,
    /// Largest gain the reporting source can give (16 for DAMON, 3 for soft-dirty).
    pub full_gain: u8,
    /// Whether the reports covered every page of the region.
    pub covered: bool,
}

impl RegionSeen {
    /// Whether the region looked mixed this tick: the gains inside it differ by at least a
    /// quarter of what the source can give (an uncovered part counts as gain 0); with
    /// [`MERGE_SPREAD`] below it, a hysteresis.
    pub fn mixed(&self) -> bool {
        let low = if self.covered { self.min_gain } else { 0 };
        let spread = self.max_gain.saturating_sub(low);
        spread > 0 && spread >= (self.full_gain / 4).max(1)
    }
}

/// Whether a split region's pages are uniform again (merge): all on one tier, heats within
/// [`MERGE_SPREAD`].
pub fn uniform(pages: &[HeatRecord]) -> bool {
    Census::of(pages).uniform()
}

/// Which pages of a split region a move takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The policy promotes the region: its hot slow pages go to the fast tier. "Hot" is
    /// `hot_min`, or the region's hottest page's heat if none reaches it (a promoted region
    /// always moves something it saw).
    Promote,
    /// The policy demotes the region: every fast page goes.
    Demote,
    /// A region in the fast tier keeps up with its pages: cold fast pages (heat below half of
    /// `hot_min`) go to the slow tier. Not a policy decision; see [`touch_ups`].
    Trim,
}

impl Step {
    /// The tier the step's pages go to.
    pub fn target(self) -> Tier {
        match self {
            Step::Promote => Tier::Fast,
            Step::Demote | Step::Trim => Tier::Slow,
        }
    }
}

/// The `hot_min` with which a promotion moves every slow page of a split region, cold ones
/// too: a region pinned to DRAM moves whole. Every other `hot_min` is at least 1.
pub const EVERY_PAGE: u8 = 0;

/// The least heat of the slow pages a promotion with `hot_min` moves from a region whose
/// hottest page is at `hottest`.
fn promote_min(hot_min: u8, hottest: u8) -> u8 {
    if hot_min == EVERY_PAGE {
        0
    } else {
        hot_min.min(hottest).max(1)
    }
}

/// Indices of the pages of a split region that `step` moves.
pub fn select(pages: &[HeatRecord], step: Step, hot_min: u8) -> impl Iterator<Item = usize> + '_ {
    let hottest = pages.iter().map(|p| p.heat()).max().unwrap_or(0);
    let min = promote_min(hot_min, hottest);
    pages
        .iter()
        .enumerate()
        .filter(move |(_, p)| match step {
            Step::Promote => !p.is_fast() && p.heat() >= min,
            Step::Demote => p.is_fast(),
            Step::Trim => p.is_fast() && p.heat() < hot_min.div_ceil(2),
        })
        .map(|(i, _)| i)
}

/// Pages by heat, `pages[h]`, of a whole VM: whole regions count all their pages at the
/// region's heat, split ones each page at its own.
pub type PagesByHeat = [u64; HeatRecord::MAX_HEAT as usize + 1];

/// The lowest heat a page needs to be among the hottest `budget_pages` of the VM (0 when every
/// page with any heat fits). A split region's promotion uses it as its `hot_min` when higher:
/// the budget goes to the hottest pages of all regions, not to every warm page of the first
/// regions the plan names.
pub fn page_cutoff(pages: &PagesByHeat, budget_pages: u64) -> u8 {
    let mut taken = 0u64;
    for h in (1..=HeatRecord::MAX_HEAT).rev() {
        taken += pages[usize::from(h)];
        if taken > budget_pages {
            return h.saturating_add(1).min(HeatRecord::MAX_HEAT);
        }
    }
    0
}

/// A split region's pages counted by tier and heat, in one pass over them: everything the
/// planning rules ask of a region ([`page_cutoff`]'s heats, [`select`]'s counts, whether
/// [`touch_ups`] has work), without walking its pages again for each question. Planning a
/// 1 TiB guest asks these of tens of thousands of split regions each tick (docs/policies.md,
/// "Scale").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Census {
    /// `slow[h]`: pages on the slow tier at heat `h`.
    slow: [u16; HEATS],
    /// `fast[h]`: pages on the fast tier at heat `h`.
    fast: [u16; HEATS],
}

impl Census {
    /// Counts `pages` (at most `u16::MAX` of them; a region has [`REGION_PAGES`]).
    pub fn of(pages: &[HeatRecord]) -> Self {
        // Pages come in runs of one tier and heat (a report covers a range and gives each of
        // its pages the same gain): eight at a time, a run of eight is one count.
        const MASK: u64 = u64::from_le_bytes([HeatRecord::TIER_HEAT_BITS; 8]);
        const ONES: u64 = u64::from_le_bytes([1; 8]);
        let mut t = [0u16; HeatRecord::TIER_HEATS];
        let mut eights = pages.chunks_exact(8);
        for e in eights.by_ref() {
            let w = u64::from_le_bytes(std::array::from_fn(|i| e[i].to_byte())) & MASK;
            let first = w & 0xff;
            if w == first * ONES {
                let n = &mut t[first as usize];
                *n = n.wrapping_add(8);
            } else {
                for p in e {
                    let n = &mut t[p.tier_heat()];
                    *n = n.wrapping_add(1);
                }
            }
        }
        for p in eights.remainder() {
            let n = &mut t[p.tier_heat()];
            *n = n.wrapping_add(1);
        }
        let mut c = Self {
            slow: [0; HEATS],
            fast: [0; HEATS],
        };
        c.slow.copy_from_slice(&t[..HEATS]);
        c.fast.copy_from_slice(&t[HEATS..]);
        c
    }

    /// The hottest page's heat (0 for no page).
    pub fn hottest(&self) -> u8 {
        (0..=HeatRecord::MAX_HEAT)
            .rev()
            .find(|&h| self.slow[usize::from(h)] > 0 || self.fast[usize::from(h)] > 0)
            .unwrap_or(0)
    }

    /// Pages on the fast tier.
    pub fn fast(&self) -> u64 {
        self.fast.iter().map(|&n| u64::from(n)).sum()
    }

    /// Slow-tier pages at `heat` or more.
    pub fn slow_from(&self, heat: u8) -> u64 {
        let from = usize::from(heat).min(HEATS);
        self.slow[from..].iter().map(|&n| u64::from(n)).sum()
    }

    /// The pages [`select`] with [`Step::Promote`] picks.
    pub fn promote(&self, hot_min: u8) -> u64 {
        self.slow_from(promote_min(hot_min, self.hottest()))
    }

    /// [`Self::promote`] for every `hot_min` from 0 to [`HeatRecord::MAX_HEAT`], in one pass.
    pub fn promote_by_hot_min(&self) -> [u16; HEATS] {
        // from[h]: slow pages at heat h or more.
        let mut from = [0u16; HEATS + 1];
        for h in (0..HEATS).rev() {
            from[h] = from[h + 1].wrapping_add(self.slow[h]);
        }
        let hottest = self.hottest();
        std::array::from_fn(|hot_min| {
            let h = u8::try_from(hot_min).unwrap_or(HeatRecord::MAX_HEAT);
            from[usize::from(promote_min(h, hottest))]
        })
    }

    /// The pages [`select`] with [`Step::Trim`] picks.
    pub fn trim(&self, hot_min: u8) -> u64 {
        let below = usize::from(hot_min.div_ceil(2)).min(HEATS);
        self.fast[..below].iter().map(|&n| u64::from(n)).sum()
    }

    /// A [`Step::Trim`] too big for `max` pages moved: its coldest pages that fit, as the
    /// `hot_min` that picks them and their count — the highest trim line, at most `hot_min`'s
    /// own, below which at most `max` fast pages lie (pages of one heat go together). `None`
    /// if not even the coldest heat's pages fit.
    pub fn trim_that_fits(&self, hot_min: u8, max: u64) -> Option<(u8, u64)> {
        let line = usize::from(hot_min.div_ceil(2)).min(HEATS);
        let mut below = 0u64;
        let mut best = None;
        for h in 0..line {
            below += u64::from(self.fast[h]);
            if below > max {
                break;
            }
            if self.fast[h] > 0 {
                // A `hot_min` of 2(h + 1) trims the pages below heat h + 1.
                best = Some((u8::try_from(2 * (h + 1)).unwrap_or(u8::MAX), below));
            }
        }
        best
    }

    /// The moves that keep a split region in the fast tier up to date with its pages, beside
    /// the policy's plan ([`touch_ups`]): whether newly hot pages should join it
    /// ([`Step::Promote`]) and whether cold ones should leave ([`Step::Trim`]).
    pub fn touch_up(&self, hot_min: u8) -> (bool, bool) {
        (self.slow_from(hot_min.max(1)) > 0, self.trim(hot_min) > 0)
    }

    /// [`uniform`] of the counted pages (true for none).
    pub fn uniform(&self) -> bool {
        let one_tier = self.fast() == 0 || self.slow.iter().all(|&n| n == 0);
        let mut heats = (0..HEATS).filter(|&h| self.slow[h] > 0 || self.fast[h] > 0);
        let lo = heats.next().unwrap_or(0);
        let hi = heats.next_back().unwrap_or(lo);
        one_tier && hi - lo <= usize::from(MERGE_SPREAD)
    }

    /// Adds the pages to `by` at their heats.
    pub fn add_to(&self, by: &mut PagesByHeat) {
        for (h, b) in by.iter_mut().enumerate() {
            *b += u64::from(self.slow[h]) + u64::from(self.fast[h]);
        }
    }
}

/// Heat values, `0..=`[`HeatRecord::MAX_HEAT`].
const HEATS: usize = HeatRecord::MAX_HEAT as usize + 1;

/// Touch-up moves for every split region in the fast tier: `(region, step, pages it
/// moves)`, trims first. `regions` yields `(region index, pages)` of the split regions.
pub fn touch_ups<'a>(
    regions: impl Iterator<Item = (u32, &'a [HeatRecord])>,
    hot_min: u8,
) -> Vec<(u32, Step, u64)> {
    let mut trims = Vec::new();
    let mut promotes = Vec::new();
    for (r, pages) in regions {
        let c = Census::of(pages);
        if c.fast() == 0 {
            continue;
        }
        let (p, t) = c.touch_up(hot_min);
        if t {
            trims.push((r, Step::Trim, c.trim(hot_min)));
        }
        if p {
            promotes.push((r, Step::Promote, c.promote(hot_min)));
        }
    }
    trims.extend(promotes);
    trims
}

/// Regions and their cost in pages by heat: `by_heat[2h]` = `(regions, pages)` of the whole
/// regions of heat `h`, `by_heat[2h + 1]` of the split ones ([`cost_slot`]).
pub type CostByHeat = [(u64, u64); 2 * (HeatRecord::MAX_HEAT as usize + 1)];

/// The index of [`CostByHeat`] for a region of `heat`, split or not.
pub fn cost_slot(heat: u8, split: bool) -> usize {
    2 * usize::from(heat.min(HeatRecord::MAX_HEAT)) + usize::from(split)
}

/// The policy's fast-tier budget in regions for `budget_pages` 4 KiB pages: the regions a
/// hottest-first fill takes, where `by_heat` holds the regions and their cost by heat (a whole
/// region: its pages; a split one: its pages in DRAM plus those a promotion would take).
/// Within one heat split regions come first (a policy cannot tell equal heats apart, so the
/// count is the larger one; [`fit`] holds the real limit). Within the last class that fits
/// only partly, regions count at its mean cost. Never below what whole regions alone give
/// (`budget_pages / 512`).
pub fn policy_budget(budget_pages: u64, by_heat: &CostByHeat) -> u64 {
    let mut left = budget_pages;
    let mut n = 0u64;
    for &(regions, pages) in by_heat.iter().rev() {
        if regions == 0 {
            continue;
        }
        if pages <= left {
            left -= pages;
            n += regions;
            continue;
        }
        let mean = pages.div_ceil(regions).max(1);
        n += left / mean;
        left = 0;
        break;
    }
    // Budget left over after every region: as whole regions (nothing more to take anyway).
    n += left / REGION_PAGES;
    n.max(budget_pages / REGION_PAGES)
}

/// What promoting a region takes ([`fit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromoteCost {
    /// A whole region: all of its pages.
    Whole(u64),
    /// A split region: the pages [`select`] picks for each `hot_min`
    /// ([`Census::promote_by_hot_min`]).
    Split([u16; HEATS]),
}

/// A split region's hottest pages that fit when all its pages at `hot_min` or more do not:
/// the lowest higher `hot_min` whose promotion `fits`, and its pages. `by` holds the pages a
/// promotion takes for each `hot_min` ([`Census::promote_by_hot_min`]; they shrink as it
/// grows, down to the region's hottest slow pages). Pages of one heat go together or not at
/// all: the sources cannot tell them apart.
pub fn hottest_that_fit(
    by: &[u16; HEATS],
    hot_min: u8,
    fits: impl Fn(u64) -> bool,
) -> Option<(u8, u64)> {
    let from = usize::from(hot_min.min(HeatRecord::MAX_HEAT)) + 1;
    let h = (from..HEATS).find(|&h| by[h] > 0 && fits(u64::from(by[h])))?;
    Some((u8::try_from(h).ok()?, u64::from(by[h])))
}

/// What [`fit`] left of a plan's moves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fitted {
    /// Pages the trimmed plan moves.
    pub moved: u64,
    /// Split regions promoted only in part, and the `hot_min` that picks their hottest pages
    /// that fit; the other promotions use the tick's.
    pub partial: Vec<(Granule, u8)>,
}

impl Fitted {
    /// The `hot_min` a promotion of `g` uses (`hot_min`: the tick's).
    pub fn hot_min(&self, g: Granule, hot_min: u8) -> u8 {
        hot_min_of(&self.partial, g, hot_min)
    }
}

/// The `hot_min` a move of `g` uses: its own if `partial` names it, else `hot_min`.
pub fn hot_min_of(partial: &[(Granule, u8)], g: Granule, hot_min: u8) -> u8 {
    partial.iter().find(|p| p.0 == g).map_or(hot_min, |p| p.1)
}

/// Trims an enforced plan to `budget_pages`, the hard limit, and to `move_pages` pages moved:
/// after the plan's demotions (`demote_cost` pages each, in order), if the fast tier still
/// holds more than the budget, the coldest other fast regions (`forcible` gives them, only
/// then: `(region, pages held)`, coldest first) are forced out (a budget cut is not rate
/// limited); then promotions run in plan order while their pages (`promote_cost`, with
/// `hot_min`) fit in the budget and in the moves left (the first one always). A split region
/// whose hot pages do not all fit moves its hottest that do (a higher `hot_min` for it:
/// [`Fitted::partial`]); the other promotions are deferred. `used` is the pages in the fast
/// tier now.
///
/// The policy counts moves in regions; with split regions moving a few pages each, the caller
/// gives it a move limit in pages (as many regions as pages) and this holds the real one.
pub fn fit(
    e: &mut Enforced,
    used: u64,
    (budget_pages, move_pages): (u64, u64),
    hot_min: u8,
    demote_cost: impl Fn(Granule) -> u64,
    forcible: impl FnOnce() -> Vec<(Granule, u64)>,
    promote_cost: impl Fn(Granule) -> PromoteCost,
) -> Fitted {
    let demoted: u64 = e.demote.iter().map(|&g| demote_cost(g)).sum();
    let mut moved = demoted;
    let mut used = used.saturating_sub(demoted);
    if used > budget_pages {
        let planned: std::collections::HashSet<Granule> = e.demote.iter().copied().collect();
        for (g, pages) in forcible() {
            if used <= budget_pages {
                break;
            }
            if planned.contains(&g) || pages == 0 {
                continue;
            }
            e.demote.push(g);
            e.forced += 1;
            used = used.saturating_sub(pages);
            moved += pages;
        }
    }
    let before = e.promote.len();
    let hm = usize::from(hot_min.min(HeatRecord::MAX_HEAT));
    let costs: Vec<PromoteCost> = e.promote.iter().map(|&g| promote_cost(g)).collect();
    // At least one move per tick, as the policy's limit is at least one region.
    let fits = |c: u64, used: u64, moved: u64| {
        used + c <= budget_pages && (moved + c <= move_pages || moved == 0)
    };
    // First every promotion that fits whole, in plan order; then, with what is left, the
    // hottest pages of the split regions that did not (by[h] shrinks as `hot_min` grows,
    // down to the region's hottest page).
    let mut take: Vec<Option<u8>> = costs
        .iter()
        .map(|&cost| {
            let c = match cost {
                PromoteCost::Whole(c) => c,
                PromoteCost::Split(by) => u64::from(by[hm]),
            };
            fits(c, used, moved).then(|| {
                used += c;
                moved += c;
                hot_min
            })
        })
        .collect();
    let mut partial = Vec::new();
    for (k, &cost) in costs.iter().enumerate() {
        let PromoteCost::Split(by) = cost else {
            continue;
        };
        if take[k].is_some() {
            continue;
        }
        if let Some((h, c)) = hottest_that_fit(&by, hot_min, |c| fits(c, used, moved)) {
            used += c;
            moved += c;
            take[k] = Some(h);
            partial.push((e.promote[k], h));
        }
    }
    let mut k = 0;
    e.promote.retain(|_| {
        k += 1;
        take[k - 1].is_some()
    });
    e.deferred += (before - e.promote.len()) as u64;
    Fitted { moved, partial }
}

/// Bytes of tracking state per 4 KiB page of a hybrid store over `pages` pages with `split`
/// regions split: one summary byte, a 4-byte slot index and a huge-page bit per region, 512
/// bytes, a 4-byte owner and a 2-byte count per split region.
#[allow(clippy::cast_precision_loss)]
pub fn bytes_per_page(pages: u64, split: u64) -> f64 {
    let regions = pages.div_ceil(REGION_PAGES);
    let bytes = regions * 5 + regions.div_ceil(64) * 8 + split * (REGION_PAGES + 6);
    bytes as f64 / pages.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(spec: &[(u8, bool)]) -> Vec<HeatRecord> {
        spec.iter()
            .map(|&(h, fast)| {
                let t = if fast { Tier::Fast } else { Tier::Slow };
                HeatRecord::new(h, t, HeatRecord::SETTLED)
            })
            .collect()
    }

    #[test]
    fn mixed_regions_table() {
        // (min, max, full, covered) -> mixed
        let cases = [
            ((16, 16, 16, true), false),
            ((0, 16, 16, true), true),
            ((10, 16, 16, true), true),
            ((13, 16, 16, true), false),
            ((8, 16, 16, true), true),
            ((16, 16, 16, false), true),
            ((3, 3, 16, false), false),
            ((3, 3, 3, false), true),
            ((3, 3, 3, true), false),
            ((0, 0, 16, false), false),
        ];
        for ((min_gain, max_gain, full_gain, covered), want) in cases {
            let s = RegionSeen {
                min_gain,
                max_gain,
                full_gain,
                covered,
            };
            assert_eq!(s.mixed(), want, "{s:?}");
        }
    }

    #[test]
    fn uniform_needs_one_tier_and_close_heat() {
        let cases: [(&[(u8, bool)], bool); 5] = [
            (&[], true),
            (&[(5, false), (7, false), (6, false)], true),
            (&[(5, false), (8, false)], false),
            (&[(5, true), (5, false)], false),
            (&[(31, true), (30, true)], true),
        ];
        for (spec, want) in cases {
            assert_eq!(uniform(&pages(spec)), want, "{spec:?}");
        }
    }

    #[test]
    fn select_table() {
        let p = pages(&[(0, false), (9, false), (4, true), (1, true), (31, false)]);
        let cases = [
            (Step::Promote, 4, vec![1, 4]),
            (Step::Demote, 4, vec![2, 3]),
            (Step::Trim, 4, vec![3]),
            (Step::Trim, 16, vec![2, 3]),
        ];
        for (step, hot_min, want) in cases {
            assert_eq!(
                select(&p, step, hot_min).collect::<Vec<_>>(),
                want,
                "{step:?}"
            );
        }
        // Nothing reaches hot_min: the hottest slow pages still go.
        let weak = pages(&[(0, false), (2, false), (1, false)]);
        assert_eq!(select(&weak, Step::Promote, 4).collect::<Vec<_>>(), vec![1]);
        // A pinned region: every slow page, cold ones too.
        assert_eq!(
            select(&p, Step::Promote, EVERY_PAGE).collect::<Vec<_>>(),
            vec![0, 1, 4]
        );
        for (ps, hot_min) in [(&p, 4), (&p, 16), (&p, 0), (&weak, 4), (&weak, 1)] {
            assert_eq!(
                Census::of(ps).promote(hot_min),
                select(ps, Step::Promote, hot_min).count() as u64
            );
        }
        assert_eq!(Step::Trim.target(), Tier::Slow);
    }

    #[test]
    fn census_answers_as_a_walk_over_the_pages_does() {
        // Runs of eight alike, groups that break a run, a tail shorter than eight, move ages
        // that differ inside a run (not counted), both tiers, every heat.
        let mut x = 0x9e37_79b9_u32;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for len in [0usize, 1, 7, 8, 9, 64, 100, 512] {
            for run in [1usize, 3, 8, 40] {
                let mut pages = Vec::with_capacity(len);
                let mut cur = HeatRecord::default();
                for i in 0..len {
                    if i % run == 0 {
                        let r = next();
                        let tier = if r & 1 == 0 { Tier::Fast } else { Tier::Slow };
                        let heat = u8::try_from((r >> 1) % 32).unwrap();
                        cur = HeatRecord::new(heat, tier, 0);
                    }
                    let age = u8::try_from(next() % 4).unwrap();
                    pages.push(HeatRecord::new(cur.heat(), cur.tier(), age));
                }
                let c = Census::of(&pages);
                let mut by: PagesByHeat = [0; 32];
                c.add_to(&mut by);
                for h in 0..32u8 {
                    let n = pages.iter().filter(|p| p.heat() == h).count() as u64;
                    assert_eq!(by[usize::from(h)], n, "{len} {run} heat {h}");
                    let slow = pages.iter().filter(|p| !p.is_fast() && p.heat() >= h);
                    assert_eq!(c.slow_from(h), slow.count() as u64);
                    let want = select(&pages, Step::Promote, h).count() as u64;
                    assert_eq!(c.promote(h), want, "{len} {run} {h}");
                    assert_eq!(u64::from(c.promote_by_hot_min()[usize::from(h)]), want);
                    let trim = select(&pages, Step::Trim, h).count() as u64;
                    assert_eq!(c.trim(h), trim, "{len} {run} {h}");
                }
                let fast = pages.iter().filter(|p| p.is_fast()).count() as u64;
                assert_eq!(c.fast(), fast);
                let hottest = pages.iter().map(|p| p.heat()).max().unwrap_or(0);
                assert_eq!(c.hottest(), hottest);
                let one_tier = fast == 0 || fast == len as u64;
                let lo = pages.iter().map(|p| p.heat()).min().unwrap_or(0);
                assert_eq!(c.uniform(), one_tier && hottest - lo <= MERGE_SPREAD);
            }
        }
    }

    #[test]
    fn touch_ups_only_for_fast_regions_trims_first() {
        let slow = pages(&[(9, false), (0, false)]);
        let fast_mixed = pages(&[(9, false), (0, true), (9, true)]);
        let fast_done = pages(&[(9, true), (0, false)]);
        let regions: Vec<(u32, &[HeatRecord])> =
            vec![(0, &slow), (1, &fast_mixed), (2, &fast_done)];
        assert_eq!(
            touch_ups(regions.into_iter(), 4),
            vec![(1, Step::Trim, 1), (1, Step::Promote, 1)]
        );
    }

    #[test]
    fn policy_budget_fills_hottest_first_in_pages() {
        // (budget pages, [(heat, regions, pages)]) -> regions
        type Case = (u64, &'static [(u8, u64, u64)], u64);
        let cases: [Case; 6] = [
            // Whole regions only: budget / 512.
            (2048, &[(31, 10, 5120)], 4),
            // Four dense regions, then 32 split ones of 16 hot pages: all fit, and the 512
            // pages left count one whole region more.
            (3072, &[(31, 4, 2048), (16, 32, 512)], 37),
            // The split ones are colder than a whole cold mass: the mass takes the rest.
            (3072, &[(31, 4, 2048), (16, 2, 32), (1, 100, 51200)], 7),
            // Nothing hot: whole regions.
            (1024, &[], 2),
            // Part of a heat level at its mean cost (10 regions, 100 pages each).
            (550, &[(20, 10, 1000)], 5),
            (100, &[], 0),
        ];
        for (budget, spec, want) in cases {
            let mut by_heat: CostByHeat = [(0, 0); 64];
            for &(h, r, p) in spec {
                by_heat[cost_slot(h, h == 16)] = (r, p);
            }
            assert_eq!(policy_budget(budget, &by_heat), want, "{budget} {spec:?}");
        }
    }

    #[test]
    fn page_cutoff_table() {
        // (pages at heats [(heat, pages)], budget) -> cutoff
        type Case = (&'static [(u8, u64)], u64, u8);
        let cases: [Case; 5] = [
            (&[(31, 100), (10, 100)], 1000, 0),
            (&[(31, 100), (10, 100)], 200, 0),
            (&[(31, 100), (10, 100)], 150, 11),
            (&[(31, 100), (10, 100)], 50, 31),
            (&[(0, 5000), (4, 10)], 10, 0),
        ];
        for (spec, budget, want) in cases {
            let mut p: PagesByHeat = [0; 32];
            for &(h, n) in spec {
                p[usize::from(h)] = n;
            }
            assert_eq!(page_cutoff(&p, budget), want, "{spec:?} {budget}");
        }
    }

    #[test]
    fn a_trim_too_big_for_the_moves_takes_its_coldest_heats() {
        // Fast pages at heats [(heat, pages)], hot_min 8 (trim line 4) -> (max pages, result)
        let fast = [(0u8, 10u16), (1, 20), (3, 30), (4, 99), (9, 5)];
        let mut pages = Vec::new();
        for &(h, n) in &fast {
            pages.extend(std::iter::repeat(HeatRecord::new(h, Tier::Fast, 3)).take(n.into()));
        }
        let c = Census::of(&pages);
        assert_eq!(c.trim(8), 60);
        let cases = [
            (1000, Some((8, 60))),
            (60, Some((8, 60))),
            (59, Some((4, 30))),
            (30, Some((4, 30))),
            (29, Some((2, 10))),
            (9, None),
        ];
        for (max, want) in cases {
            let got = c.trim_that_fits(8, max);
            assert_eq!(got, want, "{max}");
            // What it names is what `select` trims with that `hot_min`.
            if let Some((hm, n)) = got {
                assert_eq!(select(&pages, Step::Trim, hm).count() as u64, n, "{max}");
            }
        }
    }

    #[test]
    fn fit_keeps_the_page_budget() {
        let g = |v: &[u32]| v.iter().copied().map(Granule).collect::<Vec<_>>();
        let cost = |x: Granule| u64::from(x.0) * 10;
        // (used, budget, move pages, demote, forcible, promote)
        //   -> (demote, promote, forced, deferred, pages moved)
        type Case = (
            u64,
            u64,
            u64,
            Vec<u32>,
            Vec<(u32, u64)>,
            Vec<u32>,
            (Vec<u32>, Vec<u32>, u64, u64, u64),
        );
        let cases: Vec<Case> = vec![
            (
                100,
                200,
                999,
                vec![],
                vec![],
                vec![5, 6, 1],
                (vec![], vec![5, 1], 0, 1, 60),
            ),
            (
                100,
                200,
                55,
                vec![],
                vec![],
                vec![5, 6, 1],
                (vec![], vec![5], 0, 2, 50),
            ),
            (
                100,
                100,
                999,
                vec![2],
                vec![],
                vec![3],
                (vec![2], vec![], 0, 1, 20),
            ),
            (
                300,
                100,
                0,
                vec![1],
                vec![(1, 10), (4, 0), (7, 150), (8, 50)],
                vec![1],
                (vec![1, 7, 8], vec![], 2, 1, 210),
            ),
        ];
        for (used, budget, moves, demote, forcible, promote, want) in cases {
            let mut e = Enforced {
                demote: g(&demote),
                promote: g(&promote),
                ..Enforced::default()
            };
            let f = fit(
                &mut e,
                used,
                (budget, moves),
                4,
                cost,
                || forcible.iter().map(|&(r, p)| (Granule(r), p)).collect(),
                |x| PromoteCost::Whole(cost(x)),
            );
            assert_eq!(
                (e.demote, e.promote, e.forced, e.deferred, f.moved),
                (g(&want.0), g(&want.1), want.2, want.3, want.4),
                "{used} {budget} {moves}"
            );
            assert!(f.partial.is_empty());
        }
    }

    #[test]
    fn split_regions_that_do_not_fit_move_their_hottest_pages_that_do() {
        // Split regions 1-3, each with slow pages at heats 4, 8 and 20 (`n` of each), whole
        // region 9 of 512 pages; hot_min 4. (budget left, move pages, plan order)
        //   -> (promoted with their hot_min, deferred, pages moved)
        let split = |g: u32, n: u16| -> PromoteCost {
            let mut c = Census {
                slow: [0; HEATS],
                fast: [0; HEATS],
            };
            for h in [4, 8, 20] {
                c.slow[h] = n * u16::try_from(g).unwrap();
            }
            PromoteCost::Split(c.promote_by_hot_min())
        };
        let cost = |g: Granule| match g.0 {
            9 => PromoteCost::Whole(512),
            r => split(r, 10),
        };
        type Case = (u64, u64, Vec<u32>, (Vec<(u32, u8)>, u64, u64));
        let cases: Vec<Case> = vec![
            // Everything fits: the tick's hot_min for all.
            (999, 999, vec![1, 2], (vec![(1, 4), (2, 4)], 0, 90)),
            // Region 3 (90 pages at 4+) does not fit in 50 left: its 30 at 20 do (hot_min 9
            // is the lowest that picks just them).
            (50, 999, vec![3], (vec![(3, 9)], 0, 30)),
            // The move limit, not the budget: after 1 (30 pages), 3's pages at 8 and more
            // (60) fit in the 70 moves left.
            (999, 100, vec![1, 3], (vec![(1, 4), (3, 5)], 0, 90)),
            // Whole promotions first: 1 (30) fits, 9 does not, 3 (90) does not; what is left
            // (40) takes 3's hottest 30. Plan order stays.
            (70, 999, vec![3, 9, 1], (vec![(3, 9), (1, 4)], 1, 60)),
            // Not even the hottest heat fits: deferred.
            (20, 999, vec![3], (vec![], 1, 0)),
            // The first move of a tick may pass the move limit, never the budget.
            (999, 10, vec![2], (vec![(2, 4)], 0, 60)),
        ];
        for (budget, moves, plan, want) in cases {
            let mut e = Enforced {
                promote: plan.iter().copied().map(Granule).collect(),
                ..Enforced::default()
            };
            let f = fit(&mut e, 0, (budget, moves), 4, |_| 0, Vec::new, cost);
            let got: Vec<(u32, u8)> = e.promote.iter().map(|&g| (g.0, f.hot_min(g, 4))).collect();
            assert_eq!(
                (got, e.deferred, f.moved),
                want,
                "{budget} {moves} {plan:?}"
            );
            // The partial hot_min picks the pages fit counted.
            for &(g, h) in &f.partial {
                let PromoteCost::Split(by) = cost(g) else {
                    unreachable!()
                };
                assert!(u64::from(by[usize::from(h)]) <= budget.min(moves));
            }
        }
    }

    #[test]
    fn bytes_per_page_of_a_tebibyte() {
        let pages = 1u64 << 28;
        let regions = pages / REGION_PAGES;
        let cases = [(0, 0.0098), (regions / 10, 0.1106), (regions / 5, 0.2114)];
        for (split, want) in cases {
            let got = bytes_per_page(pages, split);
            assert!((got - want).abs() < 0.001, "{split}: {got}");
        }
    }
}
