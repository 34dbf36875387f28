//! TPP (Maruf et al., ASPLOS'23), rebuilt from its published description
//! (shared/guide/anchors.md): hint faults on slow-tier pages, but a page is promoted only if it
//! is *active* — here, faulted in an earlier tick too, so one stray touch does not promote it;
//! and the top tier's demotion watermark is decoupled from the allocation watermark, so
//! reclaim keeps a free headroom proactively and promotions never wait for it.

use serde::{Deserialize, Serialize};
use vmtier_core::policy::{PlacementPolicy, Plan, PolicyInput, TrackingSource};

use crate::numab::{make_room, rate_limit_granules};

/// Parameters of the TPP model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Free headroom the demotion watermark keeps, permille of the budget.
    pub demote_watermark_permille: u32,
    /// Promotion rate limit in MB/s.
    pub promote_rate_limit_mb_s: u64,
    /// Nominal tick length for the rate limit.
    pub tick_ms: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            demote_watermark_permille: 20,
            promote_rate_limit_mb_s: 65536,
            tick_ms: 1000,
        }
    }
}

/// The TPP model. State: one "faulted before" bit per granule (1/8 byte).
#[derive(Clone, Debug)]
pub struct Tpp {
    cfg: Config,
    active: Vec<u64>,
}

impl Tpp {
    /// A model with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            active: Vec::new(),
        }
    }
}

impl PlacementPolicy for Tpp {
    fn name(&self) -> &'static str {
        "tpp"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::HintFaults
    }

    fn state_bytes(&self) -> u64 {
        (self.active.len() * 8) as u64
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        let words = input.records.len().div_ceil(64);
        if self.active.len() != words {
            self.active.resize(words, 0);
        }
        let limit = rate_limit_granules(input, self.cfg.promote_rate_limit_mb_s, self.cfg.tick_ms);
        let mut promote = Vec::new();
        let mut faults = input.hint_faults.to_vec();
        faults.sort_by_key(|f| f.granule);
        faults.dedup_by_key(|f| f.granule);
        for f in &faults {
            let i = f.granule.index();
            let Some(r) = input.records.get(i) else {
                continue;
            };
            if r.is_fast() {
                continue;
            }
            let (w, bit) = (i / 64, 1u64 << (i % 64));
            if self.active[w] & bit != 0 {
                self.active[w] &= !bit;
                if (promote.len() as u64) < limit {
                    promote.push(f.granule);
                }
            } else {
                self.active[w] |= bit;
            }
        }
        let headroom = input.fast_budget * u64::from(self.cfg.demote_watermark_permille) / 1000;
        make_room(input, promote, headroom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::{Granule, HeatRecord, HintFault, Tier};

    #[test]
    fn promotes_on_second_fault_only() {
        let r = vec![
            HeatRecord::new(0, Tier::Slow, 3),
            HeatRecord::new(0, Tier::Fast, 3),
        ];
        let faults = [HintFault {
            granule: Granule(0),
            latency_millitick: 1,
        }];
        let mut p = Tpp::new(Config::default());
        let mut input = PolicyInput::from_records(0, 4096, &r, 10, 10);
        input.hint_faults = &faults;
        let cases = [vec![], vec![0], vec![]];
        for want in cases {
            let plan = p.plan(&input);
            assert_eq!(plan.promote.iter().map(|g| g.0).collect::<Vec<_>>(), want);
        }
        assert_eq!(p.state_bytes(), 8);
    }
}
