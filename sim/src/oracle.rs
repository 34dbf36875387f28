//! The offline oracle: knowing the future, it places for the next window the granules that
//! window will access most, under the same budget and the same per-tick move limit as every
//! other policy. Ties are broken by accesses in the windows after (the simulator passes a
//! score `next_window_count << 32 | later_count`, `oracle_lookahead` windows in all).
//!
//! It is **greedy, with one interval of lookahead**: each tick it fills free room with the
//! slow granules the next window accesses most, then swaps while the incoming granule will be
//! accessed more in the next window than the outgoing one (with one move left, it demotes
//! the outgoing one and fills the room next tick, as the policies do). That is the best placement for the
//! next window alone under the move limit, but not over a trace: it never spends a tick's
//! spare moves on a window further ahead, nor keeps a granule that the next window skips and
//! the one after needs, so an online policy can beat it on some traces. It is a reference
//! point ("greedy oracle"), not an upper bound. It is not a
//! [`vmtier_core::policy::PlacementPolicy`] because no online policy can see the future.

use vmtier_core::policy::{Granule, HeatRecord, Plan};

/// Plans one tick from future access scores.
pub fn plan(records: &[HeatRecord], future: &[u64], budget: u64, max_moves: u64) -> Plan {
    let mut slow: Vec<(u64, u32)> = Vec::new();
    let mut fast: Vec<(u64, u32)> = Vec::new();
    for (i, (r, &s)) in records.iter().zip(future).enumerate() {
        if r.is_fast() {
            fast.push((s, i as u32));
        } else if s > 0 {
            slow.push((s, i as u32));
        }
    }
    slow.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    fast.sort_unstable();
    let mut moves = max_moves;
    let mut plan = Plan::default();
    let mut used = fast.len() as u64;
    let mut fi = 0usize;
    while used > budget && moves > 0 && fi < fast.len() {
        plan.demote.push(Granule(fast[fi].1));
        fi += 1;
        used -= 1;
        moves -= 1;
    }
    let mut si = 0usize;
    while used < budget && moves > 0 && si < slow.len() {
        plan.promote.push(Granule(slow[si].1));
        si += 1;
        used += 1;
        moves -= 1;
    }
    while moves >= 2 && si < slow.len() && fi < fast.len() && slow[si].0 > fast[fi].0 {
        plan.promote.push(Granule(slow[si].1));
        plan.demote.push(Granule(fast[fi].1));
        si += 1;
        fi += 1;
        moves -= 2;
    }
    // One move left: the demotion of a swap now, its promotion into the room next tick
    // (as the policies do, `vmtier_policies::select::quotas`).
    if moves == 1 && si < slow.len() && fi < fast.len() && slow[si].0 > fast[fi].0 {
        plan.demote.push(Granule(fast[fi].1));
    }
    plan
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use vmtier_core::policy::Tier;

    #[test]
    fn oracle_table() {
        let r = |t| HeatRecord::new(0, t, 3);
        use Tier::{Fast as F, Slow as S};
        // (tiers, future, budget, max_moves, promote, demote)
        let cases: Vec<(Vec<Tier>, Vec<u64>, u64, u64, Vec<u32>, Vec<u32>)> = vec![
            (vec![S, S, F], vec![5, 9, 1], 2, 9, vec![1, 0], vec![2]),
            (vec![S, F], vec![5, 5], 1, 9, vec![], vec![]),
            (vec![S, F], vec![5, 4], 1, 1, vec![], vec![1]),
            (vec![S, F], vec![4, 5], 1, 1, vec![], vec![]),
            (
                vec![S, S, F, F],
                vec![9, 8, 1, 2],
                2,
                3,
                vec![0],
                vec![2, 3],
            ),
            (vec![F, F], vec![5, 4], 1, 9, vec![], vec![1]),
            (vec![S, S], vec![0, 3], 2, 9, vec![1], vec![]),
        ];
        for (tiers, fut, budget, moves, promote, demote) in cases {
            let recs: Vec<_> = tiers.into_iter().map(r).collect();
            let p = plan(&recs, &fut, budget, moves);
            let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
            assert_eq!((ids(&p.promote), ids(&p.demote)), (promote, demote));
        }
    }
}
