//! The scale benchmark: planning time and metadata of the default policy for a 1 TiB guest
//! (2^28 pages of 4 KiB), and the simulator's replay speed on such an address space.

use std::time::Instant;

use serde::Serialize;
use vmtier_core::policy::{HeatRecord, PlacementPolicy, PolicyInput, Tier};

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
        Ok(())
    }
}
