//! The scale benchmark: planning time and metadata of the default policy for a 1 TiB guest
//! (2^28 pages of 4 KiB), and the simulator's replay speed on such an address space.
//!
//! Hybrid tracking is measured on vmtierd's own store ([`HotnessStore`] with
//! `detail_percent`), fed one tick of reports for a realistic mix: most 2 MiB regions uniform
//! (hot or cold runs), [`MIXED_PERCENT`] % of them mixed (a hot run of 4 KiB pages inside a
//! cold region, as DAMON or soft-dirty report it). "Plan" is everything the engine does
//! between the store and the migrator: the policy budget in regions, the default policy over
//! the regions, the enforcement, the page-budget fit and the touch-ups of split regions.
//! "Track" is the store's tick and the folding of the reports.

use std::time::Instant;

use serde::Serialize;
use vmtier_core::hybrid;
use vmtier_core::policy::{Granule, HeatRecord, PlacementPolicy, PolicyInput, Tier};
use vmtier_core::{
    Backing, GranuleSize, GuestMemoryLayout, GuestPhysAddr, GuestRamRange, HostVirtAddr, ProcessId,
    RegionAccess,
};
use vmtier_sources::store::{HotnessStore, StoreConfig};

use crate::rng::Rng;
use crate::sim::{self, Config, Planner};
use crate::trace::Trace;
use vmtier_policies::default::DefaultPolicy;

/// Figures of one scale run.
#[derive(Clone, Debug, Serialize)]
pub struct Scale {
    /// log2 of the guest size in 4 KiB pages.
    pub pages_log2: u32,
    /// Guest size in bytes.
    pub guest_bytes: u64,
    /// Default-policy plan time with 4 KiB granules, ms (mean of 3).
    pub plan_ms_4k: f64,
    /// Default-policy plan time with 2 MiB granules, ms (mean of 3).
    pub plan_ms_2m: f64,
    /// Default-policy state bytes per page (it keeps none).
    pub policy_state_bytes_per_page: f64,
    /// Engine record bytes per page with 4 KiB granules.
    pub store_bytes_per_page_4k: f64,
    /// Engine record bytes per page with 2 MiB granules.
    pub store_bytes_per_page_2m: f64,
    /// Accesses replayed.
    pub replay_accesses: u64,
    /// Replay speed with 2 MiB granules (planning included), accesses/s.
    pub replay_accesses_per_s: f64,
    /// Hybrid tracking, [`HYBRID_DETAIL_PERCENT`] % cap: everything between the store and
    /// the migrator per tick, ms (mean of 3).
    pub plan_ms_hybrid: f64,
    /// Hybrid tracking: the store's tick and folding of one tick's reports, ms (mean of 3).
    pub track_ms_hybrid: f64,
    /// Hybrid tracking: the store's heap bytes per 4 KiB page.
    pub store_bytes_per_page_hybrid: f64,
    /// Hybrid tracking: regions mixed in the generated tick, percent of all.
    pub mixed_percent: u32,
    /// Hybrid tracking: regions split (4 KiB detail) after the ticks.
    pub split_regions: u64,
    /// Hybrid tracking: mixed regions left whole at the cap.
    pub refused_splits: u64,
    /// Reports per tick fed to the hybrid store.
    pub reports_per_tick: u64,
}

/// Percent of 2 MiB regions the scale run makes mixed.
pub const MIXED_PERCENT: u32 = 8;
/// The scale run's `detail_percent`.
pub const HYBRID_DETAIL_PERCENT: u8 = 20;

/// Hybrid-tracking figures of one scale run.
struct Hybrid {
    plan_ms: f64,
    track_ms: f64,
    bytes_per_page: f64,
    split: u64,
    refused: u64,
    reports: u64,
}

/// One tick of reports over `regions` 2 MiB regions at `base`: runs of uniform hot (5 %) and
/// cold regions, and [`MIXED_PERCENT`] % mixed regions with a hot run of 16..=144 pages.
fn mix_reports(base: u64, regions: u64, rng: &mut Rng) -> Vec<RegionAccess> {
    const M2: u64 = 2 << 20;
    let mut out: Vec<RegionAccess> = Vec::new();
    let mut push = |start: u64, len: u64, hits: u32| {
        if let Some(last) = out.last_mut() {
            if last.hits == hits && last.start.raw() + last.len == start {
                last.len += len;
                return;
            }
        }
        out.push(RegionAccess {
            start: HostVirtAddr::new(start),
            len,
            hits,
            samples: 20,
        });
    };
    for r in 0..regions {
        let at = base + r * M2;
        let roll = rng.below(100);
        if roll < u64::from(MIXED_PERCENT) {
            let pages = 16 + rng.below(129);
            let off = rng.below(512 - pages) * 4096;
            push(at, off, 0);
            push(at + off, pages * 4096, 20);
            push(at + off + pages * 4096, M2 - off - pages * 4096, 0);
        } else if roll < u64::from(MIXED_PERCENT) + 5 {
            push(at, M2, 20);
        } else {
            push(at, M2, 0);
        }
    }
    out.retain(|a| a.len > 0);
    out
}

fn time_hybrid(pages_log2: u32, rng: &mut Rng) -> Result<Hybrid, sim::Error> {
    const BASE: u64 = 0x7f00_0000_0000;
    let bytes = (1u64 << pages_log2) * 4096;
    let layout = GuestMemoryLayout::new(
        ProcessId::new(1),
        vec![GuestRamRange {
            name: "ram".into(),
            gpa: GuestPhysAddr(0),
            hva: HostVirtAddr::new(BASE),
            len: bytes,
            backing: Backing::PrivateAnon,
        }],
    )
    .map_err(|_| sim::Error::Config("bad scale layout"))?;
    let mut store = HotnessStore::new(
        &layout,
        StoreConfig {
            granule: GranuleSize::HUGE,
            detail_percent: HYBRID_DETAIL_PERCENT,
        },
    )
    .map_err(|_| sim::Error::Config("too many granules"))?;
    let regions = store.len() as u64;
    let reports = mix_reports(BASE, regions, rng);
    // A quarter of the guest's pages in DRAM: the first quarter of the regions, whole.
    for g in 0..regions / 4 {
        store.set_tier(Granule(u32::try_from(g).unwrap_or(u32::MAX)), Tier::Fast);
    }
    let budget = bytes / 4;
    // 1 GiB of moves per tick, in regions.
    let max_moves = (1u64 << 30) / (2 << 20);
    let mut p = DefaultPolicy::default();
    let (mut plan_ms, mut track_ms) = (0.0, 0.0);
    let mut cands = Vec::new();
    // Three ticks, each timed; the moves are applied as the simulator does.
    for tick in 1..=3 {
        let t = Instant::now();
        store.tick();
        // As vmtierd does: the regions the reports would split, whose huge page map it
        // reads first, then the fold.
        store.split_candidates(&reports, &mut cands);
        store.observe(&reports);
        track_ms += t.elapsed().as_secs_f64() * 1e3;

        let t = Instant::now();
        let b = store.plan_budget(budget, hybrid::hot_min(HeatRecord::HEAT_GAIN));
        let (hot_min, fast_budget) = (b.hot_min, b.granules);
        let input =
            PolicyInput::from_records(tick, 2 << 20, store.records(), fast_budget, max_moves);
        let plan = p.plan(&input);
        let mut e = plan.enforce(store.records(), fast_budget, max_moves);
        let move_pages = max_moves * 512;
        let fitted = store.fit(&mut e, budget, move_pages, hot_min, |_| false);
        let ups = store.touch_up_plan(hot_min, budget, move_pages - fitted.moved);
        plan_ms += t.elapsed().as_secs_f64() * 1e3;
        for &g in &e.demote {
            store.apply(g, hybrid::Step::Demote, hot_min);
        }
        for &g in &e.promote {
            store.apply(g, hybrid::Step::Promote, fitted.hot_min(g, hot_min));
        }
        for (g, step, hm) in ups {
            store.apply(g, step, hm);
        }
        if store.tier_bytes().fast > budget {
            return Err(sim::Error::Config("hybrid scale run went over its budget"));
        }
    }
    let st = store.detail_stats();
    Ok(Hybrid {
        plan_ms: plan_ms / 3.0,
        track_ms: track_ms / 3.0,
        bytes_per_page: store.bytes_per_4k_page(),
        split: st.split,
        refused: st.refused,
        reports: reports.len() as u64,
    })
}

fn records(n: usize, rng: &mut Rng) -> Vec<HeatRecord> {
    let fast = n / 4;
    (0..n)
        .map(|i| {
            let r = rng.next_u64();
            let heat = if r % 16 == 0 {
                (r >> 8) % 32
            } else {
                (r >> 8) % 3
            } as u8;
            let tier = if i < fast { Tier::Fast } else { Tier::Slow };
            HeatRecord::new(heat, tier, HeatRecord::SETTLED)
        })
        .collect()
}

fn time_plan(n: usize, granule_bytes: u64, rng: &mut Rng) -> f64 {
    let recs = records(n, rng);
    let max_moves = ((1u64 << 30) / granule_bytes).max(1);
    let input = PolicyInput::from_records(1, granule_bytes, &recs, (n / 4) as u64, max_moves);
    let mut p = DefaultPolicy::default();
    let mut total = 0.0;
    for _ in 0..3 {
        let t = Instant::now();
        let plan = p.plan(&input);
        total += t.elapsed().as_secs_f64() * 1e3;
        assert!(plan.moves() as u64 <= max_moves);
    }
    total / 3.0
}

/// Runs the scale benchmark over 2^`pages_log2` pages with `accesses` replayed accesses.
pub fn run(pages_log2: u32, accesses: u64) -> Result<Scale, sim::Error> {
    let pages_log2 = pages_log2.clamp(10, 31);
    let mut rng = Rng::new(7);
    let n4 = 1usize << pages_log2;
    let n2 = (n4 >> 9).max(1);
    let plan_ms_4k = time_plan(n4, 4096, &mut rng);
    let plan_ms_2m = time_plan(n2, 2 << 20, &mut rng);
    let hy = time_hybrid(pages_log2.max(12), &mut rng)?;

    let pages = (1u64 << pages_log2).min(u64::from(u32::MAX)) as u32;
    let mut t = Trace::new(12, pages);
    t.accesses.reserve(accesses as usize);
    let hot = u64::from(pages) / 20;
    let base = rng.below(u64::from(pages) - hot);
    for _ in 0..accesses {
        let p = if rng.below(10) < 9 {
            base + rng.below(hot)
        } else {
            rng.below(u64::from(pages))
        };
        t.push(p as u32, false);
    }
    let cfg = Config {
        granule_pages_log2: 9,
        tick_accesses: (accesses / 10).max(1),
        heatmap_rows: 0,
        ..Config::default()
    };
    let r = sim::run(&t, &mut Planner::by_name("default", &cfg)?, &cfg)?;
    Ok(Scale {
        pages_log2,
        guest_bytes: (1u64 << pages_log2) * 4096,
        plan_ms_4k,
        plan_ms_2m,
        policy_state_bytes_per_page: DefaultPolicy::default().state_bytes() as f64 / n4 as f64,
        store_bytes_per_page_4k: 1.0,
        store_bytes_per_page_2m: 1.0 / 512.0,
        replay_accesses: r.accesses,
        replay_accesses_per_s: r.replay_accesses_per_s,
        plan_ms_hybrid: hy.plan_ms,
        track_ms_hybrid: hy.track_ms,
        store_bytes_per_page_hybrid: hy.bytes_per_page,
        mixed_percent: MIXED_PERCENT,
        split_regions: hy.split,
        refused_splits: hy.refused,
        reports_per_tick: hy.reports,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_scale_run_reports_figures() -> Result<(), crate::sim::Error> {
        let s = super::run(14, 20_000)?;
        assert_eq!(s.guest_bytes, 64 << 20);
        assert_eq!(s.replay_accesses, 20_000);
        assert!(s.plan_ms_4k >= 0.0 && s.replay_accesses_per_s > 0.0);
        assert_eq!(s.policy_state_bytes_per_page, 0.0);
        // 32 regions, ~8 % mixed: every mixed one split (cap 20 %), within 0.25 B/page.
        assert!(s.split_regions >= 1 && s.refused_splits == 0, "{s:?}");
        assert!(s.store_bytes_per_page_hybrid < 0.25 + 0.05, "{s:?}");
        assert!(s.plan_ms_hybrid >= 0.0 && s.track_ms_hybrid > 0.0);
        Ok(())
    }
}
