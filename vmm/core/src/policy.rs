//! The pure placement-policy interface.
//!
//! A policy sees a VM's memory as an array of equally sized *granules* (4 KiB up to 2 MiB),
//! indexed in guest-physical order over the VM's RAM ranges. The engine (or the trace
//! simulator in `vmtier-policies`) fills a [`PolicyInput`] every tick; the policy returns a
//! [`Plan`]. Policies are pure: no syscalls, no clock — time arrives as the tick number — so
//! the daemon and the simulator run the very same code.
//!
//! What the engine maintains for every granule is one [`HeatRecord`] byte (heat, tier, ticks
//! since the last move). On top of it a tick may carry the raw observations of the tracking
//! source the policy asked for ([`PlacementPolicy::source`]): per-granule observation counts,
//! NUMA hint faults with their latency, DAMON-style regions, and guest hints.

/// Index of a granule within one VM's RAM.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Granule(pub u32);

impl Granule {
    /// The index as a `usize`, for slicing the per-granule arrays of a [`PolicyInput`].
    pub fn index(self) -> usize {
        // u32 always fits in usize on the 64-bit hosts vmtier supports.
        self.0 as usize
    }
}

/// The memory tier a granule is on.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Tier {
    /// Local DRAM.
    Fast,
    /// CXL or other slower memory.
    Slow,
}

/// One byte of state per granule: a 5-bit heat (decayed access frequency, 0..=31), whether it
/// is in the fast tier, and a 2-bit *move age*: ticks since the granule last migrated,
/// saturating at [`HeatRecord::SETTLED`] ("3 or more ticks ago, or never").
///
/// Layout: bits 0..=4 heat, bit 5 fast tier, bits 6..=7 move age. The engine ages the move
/// age by one every tick ([`HeatRecord::aged`]) and resets it to 0 when it moves the granule
/// ([`HeatRecord::moved_to`]); policies use it for hysteresis without keeping state of their
/// own.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HeatRecord(u8);

impl Default for HeatRecord {
    /// Cold, slow tier, never moved.
    fn default() -> Self {
        Self::new(0, Tier::Slow, Self::SETTLED)
    }
}

impl HeatRecord {
    /// Largest heat value.
    pub const MAX_HEAT: u8 = 31;
    /// The move age meaning "not moved in the last 3 ticks".
    pub const SETTLED: u8 = 3;
    const FAST: u8 = 1 << 5;
    const AGE_SHIFT: u8 = 6;

    /// Builds a record; heat saturates at [`Self::MAX_HEAT`], move age at [`Self::SETTLED`].
    #[inline]
    pub fn new(heat: u8, tier: Tier, move_age: u8) -> Self {
        let mut b = heat.min(Self::MAX_HEAT);
        if tier == Tier::Fast {
            b |= Self::FAST;
        }
        b |= move_age.min(Self::SETTLED) << Self::AGE_SHIFT;
        Self(b)
    }

    /// The raw byte.
    #[inline]
    pub fn to_byte(self) -> u8 {
        self.0
    }

    /// Heat, 0..=31.
    #[inline]
    pub fn heat(self) -> u8 {
        self.0 & Self::MAX_HEAT
    }

    /// Tier and heat as one index, `0..`[`Self::TIER_HEATS`]: the heat for a slow-tier record,
    /// the heat plus `MAX_HEAT + 1` for a fast-tier one. One mask of the byte, for counting
    /// many records at once ([`crate::hybrid::Census`]).
    #[inline]
    pub fn tier_heat(self) -> usize {
        usize::from(self.to_byte() & Self::TIER_HEAT_BITS)
    }

    /// The bits of [`Self::to_byte`] that [`Self::tier_heat`] keeps.
    pub const TIER_HEAT_BITS: u8 = Self::FAST | Self::MAX_HEAT;

    /// The number of [`Self::tier_heat`] values.
    pub const TIER_HEATS: usize = Self::TIER_HEAT_BITS as usize + 1;

    /// Current tier.
    #[inline]
    pub fn tier(self) -> Tier {
        if self.0 & Self::FAST != 0 {
            Tier::Fast
        } else {
            Tier::Slow
        }
    }

    /// Whether the granule is in the fast tier.
    #[inline]
    pub fn is_fast(self) -> bool {
        self.0 & Self::FAST != 0
    }

    /// Ticks since the last migration, saturating at [`Self::SETTLED`].
    #[inline]
    pub fn move_age(self) -> u8 {
        self.0 >> Self::AGE_SHIFT
    }

    /// Whether the granule migrated within the last [`Self::SETTLED`] ticks.
    #[inline]
    pub fn recently_moved(self) -> bool {
        self.move_age() < Self::SETTLED
    }

    /// The same record with another heat (saturating).
    #[inline]
    pub fn with_heat(self, heat: u8) -> Self {
        Self((self.0 & !Self::MAX_HEAT) | heat.min(Self::MAX_HEAT))
    }

    /// Heat a granule seen accessed in every sample of a tick gains ([`Self::heat_gain`]).
    pub const HEAT_GAIN: u8 = 16;

    /// The heat rule shared by vmtierd's hotness store and the simulator: each tick, heat
    /// halves, then gains [`Self::heat_gain`] of what the tick's observation saw. A granule
    /// seen in every sample climbs 16, 24, 28, 30, 31; a granule seen hot once fades by half
    /// each tick, so a one-off pass over memory (a scan, a checksum sweep) cannot look like a
    /// working set.
    #[inline]
    pub fn cooled(self) -> Self {
        self.with_heat(self.heat() / 2)
    }

    /// Adds an observation's heat (saturating at [`Self::MAX_HEAT`]); see [`Self::cooled`].
    #[inline]
    pub fn observed(self, gain: u8) -> Self {
        self.with_heat(self.heat().saturating_add(gain))
    }

    /// The heat gain (0..=16) of a tick in which the granule was found accessed in `hits`
    /// of `samples` access checks. One function for every source and for the simulator;
    /// one rounding step:
    ///
    /// `gain = clamp(round(16 + 2·log2(hits / samples)), 1, min(16, 4·hits − 1))`, and 0
    /// without a hit.
    ///
    /// - **Logarithmic in the access fraction**, as Memtis bins access counts by powers of
    ///   two (SOSP'23): every halving of the fraction costs 2. A 4 KiB guest page that DAMON
    ///   finds accessed in 11% of its 5 ms samples gains 10; the same memory behind a 2 MiB
    ///   huge page (one accessed bit for 512 pages) reads ~100% and gains 16. Rank is kept
    ///   across page sizes without flooring the 4 KiB signal to nothing.
    /// - **Bounded by the evidence**: one hit gains at most 3, two at most 7. With the
    ///   default `promote_min_heat` of 4, one touch in one window (1 of 20 samples, or of
    ///   200) never makes a granule promotable, while the same 5% seen tick after tick does
    ///   (3, 4, …), and 10 of 200 samples in one tick does at once (7).
    ///
    /// | hits / samples | 1/200 | 1/20 | 2/20 | 10/200 | 22/200 | 5/20 | 1/1 | 20/20 |
    /// |---|---|---|---|---|---|---|---|---|
    /// | gain | 1 | 3 | 7 | 7 | 10 | 12 | 3 | 16 |
    pub fn heat_gain(hits: u32, samples: u32) -> u8 {
        if hits == 0 || samples == 0 {
            return 0;
        }
        let hits = hits.min(samples);
        Self::heat_gain_of(f64::from(hits) / f64::from(samples), hits)
    }

    /// [`Self::heat_gain`] of an access `fraction` (0..=1) found with `hits` hits in all: the
    /// same curve and evidence bound, for a granule that several reports cover in part,
    /// whose fraction is their byte-weighted mean.
    pub fn heat_gain_of(fraction: f64, hits: u32) -> u8 {
        if hits == 0 || fraction.is_nan() || fraction <= 0.0 {
            return 0;
        }
        let fraction = fraction.min(1.0);
        let curve = (f64::from(Self::HEAT_GAIN) + 2.0 * fraction.log2()).round();
        let cap = u64::from(hits)
            .saturating_mul(4)
            .saturating_sub(1)
            .min(u64::from(Self::HEAT_GAIN));
        // curve ≤ 16 since fraction ≤ 1; below 1 it is clamped to 1 (a hit is a hit).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let g = curve.clamp(1.0, f64::from(Self::HEAT_GAIN)) as u64;
        u8::try_from(g.min(cap)).unwrap_or(Self::HEAT_GAIN)
    }

    /// The record one tick later: move age advanced by one (saturating).
    #[inline]
    pub fn aged(self) -> Self {
        Self::new(self.heat(), self.tier(), self.move_age().saturating_add(1))
    }

    /// The record after a migration to `tier` this tick (move age 0).
    #[inline]
    pub fn moved_to(self, tier: Tier) -> Self {
        Self::new(self.heat(), tier, 0)
    }

    /// The record after the granule was first placed on `tier` (no migration: age kept).
    #[inline]
    pub fn placed_on(self, tier: Tier) -> Self {
        Self::new(self.heat(), tier, self.move_age())
    }
}

/// The tracking source a policy wants the engine to feed it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum TrackingSource {
    /// Per-granule accessed-bit scans (idle page tracking, PAGEMAP_SCAN, EPT A-bits);
    /// [`PolicyInput::observed`] counts the scans that found the granule accessed.
    AbitScan,
    /// DAMON-style adaptive regions ([`PolicyInput::regions`]); heat is per region.
    DamonRegions,
    /// IBS/PEBS-like sampling of memory accesses; [`PolicyInput::observed`] counts samples.
    Sampling,
    /// NUMA-balancing hint faults on slow-tier granules ([`PolicyInput::hint_faults`]).
    HintFaults,
    /// Write tracking (soft-dirty): written or not, once per tick; heat only.
    SoftDirty,
    /// Nothing: the policy never migrates.
    None,
}

/// A NUMA hint fault: the first access to a granule after the scanner made it inaccessible.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HintFault {
    /// The faulting granule.
    pub granule: Granule,
    /// Time from the scanner unmapping the granule to the fault, in thousandths of a tick.
    pub latency_millitick: u32,
}

/// A DAMON-style monitoring region: a run of granules with one access estimate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Region {
    /// First granule.
    pub start: Granule,
    /// Number of granules (≥ 1).
    pub len: u32,
    /// Samples in the last tick that found the region's sampled page accessed.
    pub nr_accesses: u16,
    /// Ticks the region's access estimate has stayed about the same.
    pub age: u16,
}

/// What a guest agent says about a run of its memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum HintKind {
    /// The guest expects to use the range heavily.
    Hot,
    /// The guest expects not to use the range (freed, page cache it dropped, ...).
    Cold,
    /// The guest has the range free: its content does not matter, so it is the first to
    /// leave the fast tier.
    Free,
    /// Latency-critical: the guest wants it in the fast tier above anything merely hot.
    Pinned,
}

/// A hint from a guest agent (untrusted: a policy may ignore it). The engine hands a policy
/// hints that do not overlap, sorted by `start`, whose `weight` already reflects how far the
/// host trusts their source.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct GuestHint {
    /// First granule.
    pub start: Granule,
    /// Number of granules.
    pub len: u32,
    /// What the guest claims.
    pub kind: HintKind,
    /// Strength, 1..=255: the guest's weight scaled by the host's trust in its source.
    pub weight: u8,
}

/// Everything a policy may look at for one VM and one tick.
#[derive(Debug)]
pub struct PolicyInput<'a> {
    /// Tick number, monotonically increasing.
    pub tick: u64,
    /// Bytes per granule (power of two, 4 KiB ..= 2 MiB).
    pub granule_bytes: u64,
    /// One record per granule.
    pub records: &'a [HeatRecord],
    /// Granules the VM may keep in the fast tier.
    pub fast_budget: u64,
    /// Granules the engine will move this tick at most (rate limit; a promotion and a
    /// demotion count one each).
    pub max_moves: u64,
    /// Per-granule observations of this tick from an [`TrackingSource::AbitScan`] or
    /// [`TrackingSource::Sampling`] source; empty for other sources.
    pub observed: &'a [u16],
    /// Largest value an A-bit scan observation can take (scans per tick).
    pub max_observed: u16,
    /// Hint faults of this tick, in time order.
    pub hint_faults: &'a [HintFault],
    /// DAMON-style regions covering all granules, in address order.
    pub regions: &'a [Region],
    /// The guest's current hints that the engine admits (validated, trust-weighted, at most
    /// a share of the budget hot), not overlapping, sorted by start; empty without hints.
    pub hints: &'a [GuestHint],
    /// The largest heat gain the source can give in one tick
    /// ([`HeatRecord::heat_gain`] of all samples hit): 16 for DAMON and A-bit scans, 3 for
    /// soft-dirty's one sample per tick. Heat margins are in units of it.
    pub max_gain: u8,
    /// Granules tracked with 4 KiB detail (hybrid tracking), sorted: promoting one moves
    /// only its hot pages and demoting it only its fast ones, so a move of it costs what
    /// moving those base pages costs, not the granule's size. Empty without hybrid tracking.
    pub split: &'a [u32],
    /// Which granules huge pages map, as far as the engine knows (`PAGEMAP_SCAN`'s
    /// `PAGE_IS_HUGE`: a transparent huge page or hugetlb page under one page-table entry):
    /// `Some`, the granules any huge page maps, sorted, every other granule mapped by base
    /// pages only; `None`, not known, and any granule may be. It tells what a granule's heat
    /// measures: where a 4 KiB page's accessed bit is checked, the fraction of checks that
    /// find it set is the fraction of the granule's pages in use; one bit for a whole 2 MiB
    /// page is set by a single touch.
    pub huge: Option<&'a [u32]>,
}

impl<'a> PolicyInput<'a> {
    /// An input with only the records filled in (no raw observations).
    pub fn from_records(
        tick: u64,
        granule_bytes: u64,
        records: &'a [HeatRecord],
        fast_budget: u64,
        max_moves: u64,
    ) -> Self {
        Self {
            tick,
            granule_bytes,
            records,
            fast_budget,
            max_moves,
            observed: &[],
            max_observed: 0,
            hint_faults: &[],
            regions: &[],
            hints: &[],
            max_gain: HeatRecord::HEAT_GAIN,
            split: &[],
            huge: None,
        }
    }

    /// Whether granule `i` is tracked with 4 KiB detail ([`Self::split`]).
    pub fn is_split(&self, i: usize) -> bool {
        u32::try_from(i).is_ok_and(|i| self.split.binary_search(&i).is_ok())
    }

    /// Whether granule `i` is known to be mapped by base pages only ([`Self::huge`]).
    pub fn is_base_paged(&self, i: usize) -> bool {
        self.huge
            .is_some_and(|h| u32::try_from(i).is_ok_and(|i| h.binary_search(&i).is_err()))
    }

    /// `heat`, a heat difference meant for a source of full range (gain 16 per tick), in
    /// units of this input's source ([`Self::max_gain`]), rounded up; at least 1 if `heat`
    /// is.
    pub fn scaled_heat(&self, heat: u8) -> u8 {
        let g = u16::from(self.max_gain.clamp(1, HeatRecord::HEAT_GAIN));
        let s = (u16::from(heat) * g).div_ceil(u16::from(HeatRecord::HEAT_GAIN));
        u8::try_from(s).unwrap_or(u8::MAX).max(u8::from(heat > 0))
    }

    /// Granules currently in the fast tier.
    pub fn fast_used(&self) -> u64 {
        self.records.iter().filter(|r| r.is_fast()).count() as u64
    }
}

/// A policy's decision for one tick, each list in priority order (most important first).
///
/// The engine applies demotions first, then promotions while the fast tier has room, and
/// stops at [`PolicyInput::max_moves`] moves in all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Granules to move to the fast tier, hottest first.
    pub promote: Vec<Granule>,
    /// Granules to move to the slow tier, coldest first.
    pub demote: Vec<Granule>,
}

impl Plan {
    /// Total number of moves in the plan.
    pub fn moves(&self) -> usize {
        self.promote.len().saturating_add(self.demote.len())
    }

    /// Whether the plan moves nothing.
    pub fn is_empty(&self) -> bool {
        self.promote.is_empty() && self.demote.is_empty()
    }
}

/// What the engine runs of a [`Plan`] in one tick: the one enforcement rule, used by vmtierd's
/// engine and by the simulator ([`Plan::enforce`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// Granules to move to the slow tier: the plan's, then any the budget forces.
    pub demote: Vec<Granule>,
    /// Granules to move to the fast tier, in the plan's order.
    pub promote: Vec<Granule>,
    /// How many of `demote` the budget forced beyond the plan (coldest fast granules first).
    pub forced: u64,
    /// Plan entries left for a later tick by the move limit or the budget.
    pub deferred: u64,
    /// Plan entries that cannot run: out of range, on the wrong tier, or planned twice.
    pub invalid: u64,
}

impl Plan {
    /// Trims the plan to what may run this tick, given the records, the budget and the move
    /// limit (granules):
    ///
    /// 1. entries out of range, on the wrong tier (a promotion of a fast granule, a demotion
    ///    of a slow one) or planned twice are dropped (`invalid`);
    /// 2. **demotions first**; if the fast tier would still be over `budget` after them, the
    ///    coldest other fast granules are added (`forced`) — a budget cut is a hard limit, so
    ///    demotions may exceed `max_moves` by as much as the fast tier is over budget;
    /// 3. **promotions** while the budget has room after the demotions and moves are left
    ///    (`max_moves` counts both directions).
    ///
    /// Everything the limits cut is `deferred`. A caller whose demotions may fail (the
    /// engine) must recheck the room before promoting.
    pub fn enforce(&self, records: &[HeatRecord], budget: u64, max_moves: u64) -> Enforced {
        let mut e = Enforced::default();
        let mut seen = std::collections::HashSet::with_capacity(self.moves());
        let mut valid = |g: &Granule, fast: bool| {
            records.get(g.index()).is_some_and(|r| r.is_fast() == fast) && seen.insert(g.0)
        };
        e.demote = self
            .demote
            .iter()
            .copied()
            .filter(|g| valid(g, true))
            .collect();
        e.promote = self
            .promote
            .iter()
            .copied()
            .filter(|g| valid(g, false))
            .collect();
        e.invalid = (self.moves() - e.demote.len() - e.promote.len()) as u64;

        let fast_used = records.iter().filter(|r| r.is_fast()).count() as u64;
        let over = fast_used.saturating_sub(budget);
        let planned = e.demote.len() as u64;
        if planned < over {
            let mut need = over - planned;
            let mut planned_set: Vec<u32> = e.demote.iter().map(|g| g.0).collect();
            planned_set.sort_unstable();
            // Coldest first: one pass per heat level that still has candidates.
            let mut by_heat = [0u64; HeatRecord::MAX_HEAT as usize + 1];
            for r in records.iter().filter(|r| r.is_fast()) {
                by_heat[usize::from(r.heat())] += 1;
            }
            for heat in 0..=HeatRecord::MAX_HEAT {
                if need == 0 {
                    break;
                }
                if by_heat[usize::from(heat)] == 0 {
                    continue;
                }
                for (i, r) in records.iter().enumerate() {
                    if need == 0 {
                        break;
                    }
                    let Ok(i) = u32::try_from(i) else { break };
                    if r.is_fast() && r.heat() == heat && planned_set.binary_search(&i).is_err() {
                        e.demote.push(Granule(i));
                        e.forced += 1;
                        need -= 1;
                    }
                }
            }
        }
        let cap = usize::try_from(max_moves.max(over)).unwrap_or(usize::MAX);
        if e.demote.len() > cap {
            e.deferred += (e.demote.len() - cap) as u64;
            e.demote.truncate(cap);
        }
        let demoted = e.demote.len() as u64;
        let room = budget.saturating_sub(fast_used.saturating_sub(demoted));
        let left = max_moves.saturating_sub(demoted);
        let n = usize::try_from(room.min(left))
            .unwrap_or(usize::MAX)
            .min(e.promote.len());
        e.deferred += (e.promote.len() - n) as u64;
        e.promote.truncate(n);
        e
    }
}

/// Decides which granules belong in the fast tier. Must be pure.
pub trait PlacementPolicy: Send {
    /// Registry name (`default`, `tpp`, ...).
    fn name(&self) -> &'static str;

    /// The tracking source whose observations this policy reads.
    fn source(&self) -> TrackingSource {
        TrackingSource::AbitScan
    }

    /// Bytes of state the policy keeps between ticks (beyond the engine's records).
    fn state_bytes(&self) -> u64 {
        0
    }

    /// Whether [`Self::plan`] reads [`PolicyInput::huge`] for granules of `granule_bytes`
    /// from a source whose tick gives at most `max_gain`. The engine reads what maps guest
    /// RAM (a page-table walk) for the policy only then; otherwise `huge` is `None`.
    fn uses_huge_map(&self, granule_bytes: u64, max_gain: u8) -> bool {
        let _ = (granule_bytes, max_gain);
        false
    }

    /// Plans one tick.
    fn plan(&mut self, input: &PolicyInput<'_>) -> Plan;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heat_record_packs_into_one_byte() {
        let cases = [
            (0, Tier::Slow, 0),
            (31, Tier::Fast, 3),
            (200, Tier::Fast, 9),
            (17, Tier::Slow, 1),
        ];
        for (heat, tier, age) in cases {
            let r = HeatRecord::new(heat, tier, age);
            assert_eq!(r.heat(), heat.min(31));
            assert_eq!(r.tier(), tier);
            assert_eq!(r.move_age(), age.min(3));
            assert_eq!(r.recently_moved(), age < 3);
        }
        assert_eq!(std::mem::size_of::<HeatRecord>(), 1);
    }

    #[test]
    fn heat_accumulates_only_when_seen_tick_after_tick() {
        let step = |r: HeatRecord, g: u8| r.cooled().observed(g);
        let mut r = HeatRecord::default();
        let mut seen = Vec::new();
        for _ in 0..5 {
            r = step(r, HeatRecord::HEAT_GAIN);
            seen.push(r.heat());
        }
        assert_eq!(seen, vec![16, 24, 28, 30, 31]);
        // A one-off hot window, then nothing: it never passes 16 and fades.
        let mut once = step(HeatRecord::default(), HeatRecord::HEAT_GAIN);
        let mut fade = vec![once.heat()];
        for _ in 0..3 {
            once = step(once, 0);
            fade.push(once.heat());
        }
        assert_eq!(fade, vec![16, 8, 4, 2]);
        let gains = [
            ((0, 20), 0),
            ((1, 0), 0),
            ((1, 200), 1),
            ((1, 20), 3),
            ((1, 1), 3),
            ((2, 20), 7),
            ((10, 200), 7),
            ((22, 200), 10),
            ((5, 20), 12),
            ((3, 8), 11),
            ((20, 20), 16),
            ((30, 20), 16),
            ((u32::MAX, u32::MAX), 16),
        ];
        for ((hits, samples), want) in gains {
            assert_eq!(
                HeatRecord::heat_gain(hits, samples),
                want,
                "{hits}/{samples}"
            );
        }
    }

    #[test]
    fn weak_but_steady_signals_build_heat_and_one_touch_does_not() {
        // (per-tick observations (hits, samples), heat after each tick)
        type Case = (&'static [(u32, u32)], &'static [u8]);
        let cases: [Case; 5] = [
            // 5% of 20 samples every tick: 3, 4, 5, 5 (promotable from tick 2 at heat 4).
            (&[(1, 20); 4], &[3, 4, 5, 5]),
            // One touch in one window, then nothing: never above 3.
            (&[(1, 20), (0, 20), (0, 20)], &[3, 1, 0]),
            // A 4 KiB page over a 1 s tick (200 samples at 11%): promotable at once.
            (&[(22, 200); 3], &[10, 15, 17]),
            // Soft-dirty: written every tick (one sample per tick).
            (&[(1, 1); 3], &[3, 4, 5]),
            // One touch in a 200-sample tick.
            (&[(1, 200), (0, 200)], &[1, 0]),
        ];
        for (obs, want) in cases {
            let mut r = HeatRecord::default();
            let got: Vec<u8> = obs
                .iter()
                .map(|&(h, n)| {
                    r = r.cooled().observed(HeatRecord::heat_gain(h, n));
                    r.heat()
                })
                .collect();
            assert_eq!(got, want, "{obs:?}");
        }
    }

    #[test]
    fn heat_gain_is_monotone_in_hits() {
        // (samples, gain when every sample hit: a single sample is weak evidence)
        for (samples, full) in [(1u32, 3), (2, 7), (8, 16), (20, 16), (200, 16), (2000, 16)] {
            let mut last = 0;
            for hits in 0..=samples {
                let g = HeatRecord::heat_gain(hits, samples);
                assert!(g >= last, "{hits}/{samples}: {g} < {last}");
                last = g;
            }
            assert_eq!(last, full, "{samples}/{samples}");
        }
    }

    #[test]
    fn heat_record_transitions() {
        let cases = [
            (HeatRecord::default().moved_to(Tier::Fast), Tier::Fast, 0, 1),
            (HeatRecord::new(5, Tier::Fast, 2), Tier::Fast, 2, 3),
            (HeatRecord::new(5, Tier::Slow, 3), Tier::Slow, 3, 3),
        ];
        for (r, tier, age, next_age) in cases {
            assert_eq!(r.tier(), tier);
            assert_eq!(r.move_age(), age);
            assert_eq!(r.aged().move_age(), next_age);
            assert_eq!(r.aged().tier(), tier);
        }
        let r = HeatRecord::new(3, Tier::Fast, 1).with_heat(40);
        assert_eq!((r.heat(), r.tier(), r.move_age()), (31, Tier::Fast, 1));
        assert_eq!(HeatRecord::default().placed_on(Tier::Fast).move_age(), 3);
    }

    #[test]
    fn enforcement_table() {
        use Tier::{Fast as F, Slow as S};
        let s = HeatRecord::SETTLED;
        // (records (heat, tier), promote, demote, budget, max_moves)
        //   -> (promote, demote, forced, deferred, invalid)
        type Case = (
            &'static str,
            Vec<(u8, Tier)>,
            Vec<u32>,
            Vec<u32>,
            u64,
            u64,
            (Vec<u32>, Vec<u32>, u64, u64, u64),
        );
        let cases: Vec<Case> = vec![
            (
                "room: promotions in plan order",
                vec![(9, S), (5, S), (1, S)],
                vec![1, 0],
                vec![],
                2,
                10,
                (vec![1, 0], vec![], 0, 0, 0),
            ),
            (
                "budget full: promotions wait for the demotions",
                vec![(9, S), (0, F), (1, F)],
                vec![0],
                vec![1],
                2,
                10,
                (vec![0], vec![1], 0, 0, 0),
            ),
            (
                "no room left: deferred",
                vec![(9, S), (0, F)],
                vec![0],
                vec![],
                1,
                10,
                (vec![], vec![], 0, 1, 0),
            ),
            (
                "moves shared, demotions first",
                vec![(9, S), (8, S), (0, F), (1, F)],
                vec![0, 1],
                vec![2, 3],
                2,
                3,
                (vec![0], vec![2, 3], 0, 1, 0),
            ),
            (
                "over budget: the coldest others are forced out, past the move limit",
                vec![(9, F), (1, F), (5, F), (0, F)],
                vec![],
                vec![],
                1,
                1,
                (vec![], vec![3, 1, 2], 3, 0, 0),
            ),
            (
                "over budget with a planned demotion",
                vec![(9, F), (1, F), (5, F)],
                vec![],
                vec![2],
                1,
                10,
                (vec![], vec![2, 1], 1, 0, 0),
            ),
            (
                "wrong tier, out of range and twice are invalid",
                vec![(9, S), (1, F)],
                vec![1, 0, 0, 7],
                vec![0, 1, 1],
                2,
                10,
                (vec![0], vec![1], 0, 0, 5),
            ),
        ];
        for (name, spec, promote, demote, budget, moves, want) in cases {
            let r: Vec<_> = spec
                .iter()
                .map(|&(h, t)| HeatRecord::new(h, t, s))
                .collect();
            let plan = Plan {
                promote: promote.into_iter().map(Granule).collect(),
                demote: demote.into_iter().map(Granule).collect(),
            };
            let e = plan.enforce(&r, budget, moves);
            let ids = |v: &[Granule]| v.iter().map(|g| g.0).collect::<Vec<_>>();
            assert_eq!(
                (
                    ids(&e.promote),
                    ids(&e.demote),
                    e.forced,
                    e.deferred,
                    e.invalid
                ),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn heat_margins_scale_with_the_source() {
        let r = [HeatRecord::default()];
        let mut input = PolicyInput::from_records(0, 4096, &r, 1, 1);
        // (max gain, heat) -> scaled
        for (g, h, want) in [
            (16, 8, 8),
            (3, 8, 2),
            (3, 0, 0),
            (3, 1, 1),
            (0, 8, 1),
            (8, 17, 9),
        ] {
            input.max_gain = g;
            assert_eq!(input.scaled_heat(h), want, "gain {g} heat {h}");
        }
    }

    #[test]
    fn plan_counts_moves() {
        let p = Plan {
            promote: vec![Granule(1), Granule(2)],
            demote: vec![Granule(3)],
        };
        assert_eq!(p.moves(), 3);
        assert!(!p.is_empty());
        assert!(Plan::default().is_empty());
    }
}
