//! First touch: pages stay where they were first allocated (DRAM until the budget is used,
//! then the slow tier) and never migrate — Linux's default placement without tiering, and
//! Pond's (ASPLOS'23) static zNUMA split (shared/guide/anchors.md).

use vmtier_core::policy::{PlacementPolicy, Plan, PolicyInput, TrackingSource};

/// The never-migrate policy.
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstTouch;

impl PlacementPolicy for FirstTouch {
    fn name(&self) -> &'static str {
        "first-touch"
    }

    fn source(&self) -> TrackingSource {
        TrackingSource::None
    }

    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
        // Even first touch must respect a budget that shrank below use.
        let over = input.fast_used().saturating_sub(input.fast_budget);
        Plan {
            promote: Vec::new(),
            demote: crate::select::coldest_fast(input.records, over.min(input.max_moves)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::{HeatRecord, Tier};

    #[test]
    fn never_moves_within_budget() {
        let cases = [(1u64, 0usize), (0, 1)];
        for (budget, demotes) in cases {
            let r = vec![
                HeatRecord::new(0, Tier::Fast, 3),
                HeatRecord::new(31, Tier::Slow, 3),
            ];
            let input = PolicyInput::from_records(0, 4096, &r, budget, 10);
            let plan = FirstTouch.plan(&input);
            assert!(plan.promote.is_empty());
            assert_eq!(plan.demote.len(), demotes);
        }
    }
}
