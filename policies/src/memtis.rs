//! Memtis-like policy (Lee et al., SOSP'23), rebuilt from its published description
//! (shared/guide/anchors.md): PEBS samples feed a per-page access count; pages fall into
//! log2 bins of that count; the hot threshold is the lowest bin whose pages (and all hotter
//! ones) fit the fast tier, the bin below it is *warm* and stays where it is; counts are halved
//! every `cooling_period` ticks. Huge-page splitting is not modelled (a granule moves whole).

use serde::{Deserialize, Serialize};
use vmtier_core::policy::{PlacementPolicy, Plan, PolicyInput, TrackingSource};

use crate::select::{self, Rules};

/// Parameters of the Memtis model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Ticks between coolings (all counts halved).
    pub cooling_period: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self { cooling_period: 4 }
    }
}

/// The Memtis model. State: a 16-bit access count per granule (2 bytes).
#[derive(Clone, Debug)]
pub struct Memtis {
    cfg: Config,
    counts: Vec<u16>,
}

impl Memtis {
    /// A model with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            counts: Vec::new(),
        }
    }
}

fn bin(c: u16) -> u8 {
    (16 - c.leading_zeros()) as u8
}

impl PlacementPolicy for Memtis {
    fn name(&self) -> &'static str {
        "memtis"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::Sampling
    }

    fn state_bytes(&self) -> u64 {
        (self.counts.len() * 2) as u64
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        if self.counts.len() != input.records.len() {
            self.counts.resize(input.records.len(), 0);
        }
        for (c, &o) in self.counts.iter_mut().zip(input.observed) {
            *c = c.saturating_add(o);
        }
        if self.cfg.cooling_period > 0 && input.tick % self.cfg.cooling_period == 0 {
            for c in &mut self.counts {
                *c /= 2;
            }
        }
        let mut per_bin = [0u64; 17];
        for &c in &self.counts {
            per_bin[usize::from(bin(c))] += 1;
        }
        let mut hot = 17usize;
        let mut sum = 0u64;
        while hot > 1 && sum + per_bin[hot - 1] <= input.fast_budget {
            sum += per_bin[hot - 1];
            hot -= 1;
        }
        let hot = hot.max(1) as u8;
        let rules = Rules {
            min_promote: hot,
            margin: 1,
            swap_min: 0,
            demote_below: hot.saturating_sub(1).max(1),
            demote_cold_always: false,
            min_move_age: 0,
            headroom: 0,
            by_worth: false,
            room: 0,
            room_first: 0,
        };
        let counts = &self.counts;
        select::plan_by_key(input, &rules, |i, _| bin(counts[i]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::{Granule, HeatRecord, Tier};

    #[test]
    fn hot_threshold_fits_budget_and_cooling_halves() {
        let r = vec![
            HeatRecord::new(0, Tier::Slow, 3),
            HeatRecord::new(0, Tier::Slow, 3),
            HeatRecord::new(0, Tier::Fast, 3),
        ];
        let obs = [40u16, 3, 0];
        let mut input = PolicyInput::from_records(1, 4096, &r, 1, 10);
        input.observed = &obs;
        let mut p = Memtis::new(Config::default());
        let plan = p.plan(&input);
        assert_eq!(plan.promote, vec![Granule(0)]);
        assert_eq!(plan.demote, vec![Granule(2)]);
        assert_eq!(p.state_bytes(), 6);
        let cases = [(0u16, 0u8), (1, 1), (3, 2), (4, 3), (u16::MAX, 16)];
        for (c, b) in cases {
            assert_eq!(bin(c), b);
        }
    }
}
