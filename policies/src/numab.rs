//! Linux NUMA balancing in memory-tiering mode (`numa_balancing=2`, Linux 5.18+), rebuilt
//! from its published description (shared/guide/anchors.md, "Linux NUMA balancing mode 2"):
//! the scanner makes slow-tier pages inaccessible (PROT_NONE), the next access takes a hint
//! fault, and the page is promoted when the fault came soon after the scan (latency below
//! `hot_threshold_ms`), limited by `numa_balancing_promote_rate_limit_MBps`; the threshold is
//! adjusted so the candidates match the rate limit. Demotion happens through reclaim when the
//! fast node runs out of free memory: kswapd demotes the coldest (LRU tail) pages to keep a
//! free headroom and make room for promotions. No hysteresis: a page may go back and forth.

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
    /// Free fast memory reclaim keeps, in permille of the budget (the high watermark).
    pub free_headroom_permille: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            hot_threshold_ms: 1000,
            tick_ms: 1000,
            promote_rate_limit_mb_s: 65536,
            adjust_threshold: true,
            free_headroom_permille: 10,
        }
    }
}

/// Candidates and demotions shared by the hint-fault policies (NUMA balancing, TPP).
pub(crate) fn rate_limit_granules(input: &PolicyInput<'_>, mb_s: u64, tick_ms: u32) -> u64 {
    let bytes = mb_s
        .saturating_mul(1 << 20)
        .saturating_mul(u64::from(tick_ms))
        / 1000;
    (bytes / input.granule_bytes.max(1)).max(1)
}

/// Demotes enough of the coldest fast granules to fit `incoming` promotions plus `headroom`
/// free granules, then trims the plan.
pub(crate) fn make_room(input: &PolicyInput<'_>, promote: Vec<Granule>, headroom: u64) -> Plan {
    let fast_used = input.fast_used();
    let free = input.fast_budget.saturating_sub(fast_used);
    let need = (promote.len() as u64)
        .saturating_add(headroom)
        .saturating_add(fast_used.saturating_sub(input.fast_budget))
        .saturating_sub(free);
    let demote = select::coldest_fast(input.records, need.min(input.max_moves));
    select::fit(input, &Plan { promote, demote })
}

/// The NUMA-balancing tiering-mode model.
#[derive(Clone, Debug)]
pub struct NumaBalancing {
    cfg: Config,
    threshold_millitick: u32,
}

impl NumaBalancing {
    /// A model with `cfg`.
    pub fn new(cfg: Config) -> Self {
        let threshold_millitick = threshold_millitick(&cfg);
        Self {
            cfg,
            threshold_millitick,
        }
    }
}

fn threshold_millitick(cfg: &Config) -> u32 {
    let t = u64::from(cfg.hot_threshold_ms) * 1000 / u64::from(cfg.tick_ms.max(1));
    u32::try_from(t).unwrap_or(u32::MAX).max(1)
}

impl PlacementPolicy for NumaBalancing {
    fn name(&self) -> &'static str {
        "numab"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::HintFaults
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        let limit = rate_limit_granules(input, self.cfg.promote_rate_limit_mb_s, self.cfg.tick_ms);
        let mut cands: Vec<_> = input
            .hint_faults
            .iter()
            .filter(|f| f.latency_millitick < self.threshold_millitick)
            .filter(|f| {
                input
                    .records
                    .get(f.granule.index())
                    .is_some_and(|r| !r.is_fast())
            })
            .copied()
            .collect();
        cands.sort_by_key(|f| (f.granule, f.latency_millitick));
        cands.dedup_by_key(|f| f.granule);
        cands.sort_by_key(|f| f.latency_millitick);
        if self.cfg.adjust_threshold {
            let max = threshold_millitick(&self.cfg);
            let n = cands.len() as u64;
            if n > limit {
                self.threshold_millitick = (self.threshold_millitick / 8 * 7).max(1);
            } else if n < limit / 2 {
                let up = self
                    .threshold_millitick
                    .saturating_add(self.threshold_millitick / 8 + 1);
                self.threshold_millitick = up.min(max);
            }
        }
        cands.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let promote = cands.into_iter().map(|f| f.granule).collect();
        let headroom = input.fast_budget * u64::from(self.cfg.free_headroom_permille) / 1000;
        make_room(input, promote, headroom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::{HeatRecord, HintFault, Tier};

    #[test]
    fn promotes_fast_faults_and_demotes_coldest() {
        let r = vec![
            HeatRecord::new(0, Tier::Slow, 3),
            HeatRecord::new(0, Tier::Slow, 3),
            HeatRecord::new(9, Tier::Fast, 3),
            HeatRecord::new(1, Tier::Fast, 3),
        ];
        let faults = [
            HintFault {
                granule: Granule(0),
                latency_millitick: 10,
            },
            HintFault {
                granule: Granule(1),
                latency_millitick: 5000,
            },
            HintFault {
                granule: Granule(2),
                latency_millitick: 1,
            },
        ];
        // (budget, promote, demote)
        let cases = [
            (2, vec![0], vec![3]),
            (3, vec![0], vec![]),
            (4, vec![0], vec![]),
        ];
        for (budget, promote, demote) in cases {
            let mut input = PolicyInput::from_records(0, 4096, &r, budget, 10);
            input.hint_faults = &faults;
            let plan = NumaBalancing::new(Config::default()).plan(&input);
            let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
            assert_eq!(
                (ids(&plan.promote), ids(&plan.demote)),
                (promote, demote),
                "{budget}"
            );
        }
    }
}
