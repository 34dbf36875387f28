//! memtierd-like "heat" policy (intel/memtierd, described in shared/guide/anchors.md): a
//! tracker (idle-page A-bit scans) gives each page a heat; heat is quantized into classes;
//! a class-to-node map puts the hot classes on DRAM and the rest on the slow node — cold
//! pages are demoted even when DRAM has room; the mover is rate-limited (default 100 MB/s).

use serde::{Deserialize, Serialize};
use vmtier_core::policy::{HeatRecord, PlacementPolicy, Plan, PolicyInput, TrackingSource};

use crate::select::{self, Rules};

/// Parameters of the memtierd model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Number of heat classes (2..=32).
    pub classes: u8,
    /// Classes at or above this one map to DRAM.
    pub fast_from_class: u8,
    /// Mover bandwidth in MB/s.
    pub mover_mb_s: u64,
    /// Nominal tick length for the mover bandwidth.
    pub tick_ms: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            classes: 4,
            fast_from_class: 2,
            mover_mb_s: 100,
            tick_ms: 1000,
        }
    }
}

/// The memtierd model (no per-granule state).
#[derive(Clone, Debug)]
pub struct HeatClasses {
    cfg: Config,
}

impl HeatClasses {
    /// A model with `cfg`.
    pub fn new(cfg: Config) -> Self {
        Self { cfg }
    }
}

impl PlacementPolicy for HeatClasses {
    fn name(&self) -> &'static str {
        "memtierd"
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        let classes = self.cfg.classes.clamp(2, 32);
        let hot = self.cfg.fast_from_class.min(classes - 1);
        let class = |_: usize, r: HeatRecord| {
            (u16::from(r.heat()) * u16::from(classes) / (u16::from(HeatRecord::MAX_HEAT) + 1)) as u8
        };
        let mover = crate::numab::rate_limit_granules(input, self.cfg.mover_mb_s, self.cfg.tick_ms);
        let limited = PolicyInput {
            max_moves: input.max_moves.min(mover),
            ..*input
        };
        let rules = Rules {
            min_promote: hot,
            margin: 1,
            swap_min: 0,
            demote_below: hot,
            demote_cold_always: true,
            min_move_age: 0,
            headroom: 0,
            by_worth: false,
            room: 0,
            room_first: 0,
        };
        let _ = TrackingSource::AbitScan;
        select::plan_by_key(&limited, &rules, class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::{Granule, Tier};

    #[test]
    fn cold_classes_leave_dram_even_with_room() {
        let r = vec![
            HeatRecord::new(30, Tier::Slow, 3),
            HeatRecord::new(2, Tier::Fast, 3),
            HeatRecord::new(20, Tier::Fast, 3),
        ];
        let input = PolicyInput::from_records(0, 4096, &r, 10, 10);
        let plan = HeatClasses::new(Config::default()).plan(&input);
        assert_eq!(plan.promote, vec![Granule(0)]);
        assert_eq!(plan.demote, vec![Granule(1)]);
    }
}
