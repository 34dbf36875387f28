//! The trace-driven simulator behind `vmtier-sim`.
//!
//! A trace is cut into ticks of `tick_accesses` accesses (one vmtierd tick, `tick_ms` of
//! time) — or, when it carries epoch markers (a recording of a long program reduced to epochs,
//! `docs/trace-format.md`), into one tick per recorded epoch (`epoch_ticks`), so every policy,
//! and vmtierd's DAMON model in particular, sees one tick per epoch as the daemon sees one per
//! `interval_ms`. While replaying, the simulator records what each tracking source would have seen:
//!
//! - **DAMON, as vmtierd reads it** ([`crate::damon`]): DAMON's sampling (one random address
//!   per region per `damon_sample_us`, the accessed bit of its 4 KiB page — or of its whole
//!   2 MiB page with `thp`), aggregation windows of `damon_aggr_us` with the kernel's
//!   merge/split rules and region limits, every window of the tick summed by the same code
//!   vmtierd's source runs (`vmtier_sources::damon::trace::accumulate`). Policies that read
//!   regions (DAMOS) get the last window's regions.
//! - **Soft-dirty**, vmtierd's fallback: each 4 KiB page written during the tick, one sample.
//! - A-bit scans: per granule, one bit per sub-interval (`abit_scans_per_tick`) in which it
//!   was touched (EPT/NPT accessed bits cleared at every scan).
//! - IBS/PEBS-like sampling: one access in `sample_period` (jittered) is sampled.
//! - NUMA hint faults: a `task_numa_work`-like scanner walks the address space, 256 MB per
//!   call (`hint_scan_mb_per_tick`), one call per scan period (at first one per 256 MB
//!   populated per tick; doubling with promotions, `hint_scan_backoff`), unmapping populated
//!   slow granules not already unmapped; the next access faults with the time since then
//!   (`HintScanner`).
//!
//! Every source's observations go into vmtierd's own hotness store
//! (`vmtier_sources::store::HotnessStore`, the one heat rule `HeatRecord::heat_gain`), its
//! records are the policy input, and the plan is applied with the engine's enforcement
//! (`Plan::enforce`): demotions first, then promotions while the budget has room, at most
//! `max_moves` granules per tick. So a policy on the `damon` source with the default policy
//! is vmtierd as shipped (the report's `vmtierd` rows). Costs: every access costs
//! `compute_ns_per_access` plus `dram_ns` or `cxl_ns`; migration copies at the `move_pages`
//! bandwidth for the granule size; the estimated slowdown is against the same trace all in
//! DRAM.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use vmtier_core::hybrid::Step;
use vmtier_core::policy::{
    Granule, HeatRecord, HintFault, PlacementPolicy, Plan, PolicyInput, Region, Tier,
    TrackingSource,
};
use vmtier_core::{
    Backing, GranuleSize, GuestMemoryLayout, GuestPhysAddr, GuestRamRange, HostVirtAddr, PageSize,
    ProcessId, RegionAccess,
};
use vmtier_sources::damon::trace::{accumulate, WindowRegion};
use vmtier_sources::store::{HotnessStore, StoreConfig};

use crate::damon::{Attrs as DamonAttrs, DamonModel, Reported};
use crate::rng::Rng;
use crate::trace::{Trace, EPOCH_MARKER};

/// Errors configuring or running a simulation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config value is out of range.
    #[error("Invalid simulator config: {0}")]
    Config(&'static str),
    /// The policy could not be built.
    #[error("Failed to build policy")]
    Policy(#[from] vmtier_policies::registry::Error),
    /// The trace has no accesses.
    #[error("Trace has no accesses")]
    EmptyTrace,
}

/// Where pages are placed before any migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Initial {
    /// On first access: DRAM while the budget has room, then the slow tier.
    FirstTouch,
    /// Everything starts on the slow tier (a guest whose RAM was put on CXL).
    Slow,
}

/// A tracking source, as named in configs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceName {
    /// [`TrackingSource::AbitScan`].
    Abit,
    /// [`TrackingSource::DamonRegions`]: DAMON as vmtierd reads it.
    Damon,
    /// [`TrackingSource::Sampling`].
    Sampling,
    /// [`TrackingSource::HintFaults`].
    HintFaults,
    /// [`TrackingSource::SoftDirty`]: vmtierd's fallback.
    SoftDirty,
}

impl SourceName {
    /// The source it names.
    pub fn to_source(self) -> TrackingSource {
        match self {
            SourceName::Abit => TrackingSource::AbitScan,
            SourceName::Damon => TrackingSource::DamonRegions,
            SourceName::Sampling => TrackingSource::Sampling,
            SourceName::HintFaults => TrackingSource::HintFaults,
            SourceName::SoftDirty => TrackingSource::SoftDirty,
        }
    }
}

/// Name of a tracking source for reports.
pub fn source_name(s: TrackingSource) -> &'static str {
    match s {
        TrackingSource::AbitScan => "abit",
        TrackingSource::DamonRegions => "damon",
        TrackingSource::Sampling => "sampling",
        TrackingSource::HintFaults => "hint-faults",
        TrackingSource::SoftDirty => "soft-dirty",
        TrackingSource::None => "none",
    }
}

/// vmtierd's DAMON region limits (min, max): `damon_min_regions`, `damon_max_regions`.
#[allow(clippy::cast_possible_truncation)] // 520 and 1560
const DAMON_REGIONS: (u32, u32) = (
    vmtier_sources::damon::DEFAULT_MIN_NR_REGIONS as u32,
    vmtier_sources::damon::DEFAULT_MAX_NR_REGIONS as u32,
);

/// Simulator parameters (`docs/policies.md` lists each with its source).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Accesses per tick (policy interval) for traces without epoch markers.
    pub tick_accesses: u64,
    /// One tick per recorded epoch when the trace carries epoch markers (`tick_accesses` is
    /// then unused); false cuts every trace by `tick_accesses`.
    pub epoch_ticks: bool,
    /// Granule size as log2 of pages (0 = 4 KiB pages, 9 = 2 MiB huge pages).
    pub granule_pages_log2: u8,
    /// DRAM budget, permille of the trace's footprint (granules touched).
    pub fast_permille: u32,
    /// Migration limit per tick, permille of the budget (at least one granule).
    pub move_permille: u32,
    /// Initial placement.
    pub initial: Initial,
    /// DRAM load latency in ns (anchors: local DRAM ~80-100 ns).
    pub dram_ns: f64,
    /// CXL load latency in ns (anchors: DRAM + 70-90 ns, Pond).
    pub cxl_ns: f64,
    /// Work per access besides the load, in ns.
    pub compute_ns_per_access: f64,
    /// Migration bandwidth for 4 KiB pages, GB/s (upstream move_pages, anchors: 3.31).
    pub migrate_gb_s_4k: f64,
    /// Migration bandwidth for 2 MiB pages, GB/s (upstream move_pages, anchors: 11.02).
    pub migrate_gb_s_2m: f64,
    /// A-bit scans per tick (the `abit` source), 1..=16.
    pub abit_scans_per_tick: u8,
    /// Length of one tick in milliseconds: the time DAMON's intervals are measured against
    /// (vmtierd's default tick, 1000).
    pub tick_ms: u32,
    /// DAMON sampling interval, µs (DAMON's default, 5000).
    pub damon_sample_us: u32,
    /// DAMON aggregation interval, µs (DAMON's default, 100000).
    pub damon_aggr_us: u32,
    /// DAMON minimum number of regions (vmtierd's default, 520: a third of the maximum;
    /// DAMON's own is 10).
    pub damon_min_regions: u32,
    /// DAMON maximum number of regions (vmtierd's default, 1560; DAMON's own is 1000).
    pub damon_max_regions: u32,
    /// Guest RAM on 2 MiB huge pages: one accessed bit per 2 MiB for DAMON (as QEMU's
    /// THP-backed RAM); false: 4 KiB pages, one bit per page (THP off, fragmented, KSM).
    pub thp: bool,
    /// One access in this many is sampled (IBS/PEBS-like).
    pub sample_period: u32,
    /// NUMA-balancing scan size per call in MiB (kernel default 256 MB per scan period).
    pub hint_scan_mb_per_tick: u64,
    /// The NUMA-balancing scan period doubles, up to its maximum, once per scan pass in which
    /// a page was promoted, as Linux's does in tiering mode (`HintScanner`); false: it stays
    /// at its start (1 s per 256 MB).
    pub hint_scan_backoff: bool,
    /// A move within this many ticks of the granule's previous move is a ping-pong.
    pub pingpong_window: u64,
    /// Windows the oracle looks ahead (the next one decides, later ones break ties).
    pub oracle_lookahead: u32,
    /// Overrides the tracking source of the policy (for policies that read only records).
    pub source: Option<SourceName>,
    /// Address buckets of the placement heatmap (0 = none).
    pub heatmap_rows: u32,
    /// Seed for sampling and DAMON.
    pub seed: u64,
    /// Per-policy config tables, by policy name.
    pub policy: toml::Table,
    /// Hybrid tracking as vmtierd's `detail_percent` (needs `granule_pages_log2 = 9`): the
    /// most 2 MiB regions, in percent, that keep 4 KiB detail; 0 = off. The budget and the
    /// move limit are then counted in 4 KiB pages touched, as with 4 KiB granules.
    pub detail_percent: u8,
    /// Experiment, simulator only ("zoom", [`crate::zoom`]): a second DAMON context over
    /// at most this many bytes of 2 MiB chunks whose heat is mixed, re-chosen every
    /// `zoom_every` ticks; its reports replace the first context's over those chunks. 0 = off
    /// (vmtierd as shipped). Needs the `damon` source and 4 KiB granules, or hybrid tracking
    /// (`detail_percent`), where its finer reports split the regions they find mixed.
    pub zoom_bytes: u64,
    /// `min_nr_regions` of the zoom context.
    pub zoom_min_regions: u32,
    /// `max_nr_regions` of the zoom context.
    pub zoom_max_regions: u32,
    /// Ticks between choices of the zoom context's chunks (≥ 1).
    pub zoom_every: u32,
    /// Chunks the zoom watched that are still mixed keep their place ([`crate::zoom::select`]).
    pub zoom_sticky: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            tick_accesses: 50_000,
            epoch_ticks: true,
            granule_pages_log2: 0,
            fast_permille: 250,
            move_permille: 100,
            initial: Initial::FirstTouch,
            dram_ns: 90.0,
            cxl_ns: 170.0,
            compute_ns_per_access: 0.0,
            migrate_gb_s_4k: 3.31,
            migrate_gb_s_2m: 11.02,
            abit_scans_per_tick: 8,
            tick_ms: 1000,
            damon_sample_us: 5000,
            damon_aggr_us: 100_000,
            damon_min_regions: DAMON_REGIONS.0,
            damon_max_regions: DAMON_REGIONS.1,
            thp: false,
            sample_period: 64,
            hint_scan_mb_per_tick: 256,
            hint_scan_backoff: true,
            pingpong_window: 4,
            oracle_lookahead: 2,
            source: None,
            heatmap_rows: 48,
            seed: 1,
            policy: toml::Table::new(),
            detail_percent: 0,
            zoom_bytes: 0,
            zoom_min_regions: 333,
            zoom_max_regions: 1000,
            zoom_every: 1,
            zoom_sticky: false,
        }
    }
}

impl Config {
    fn check(&self) -> Result<(), Error> {
        if self.tick_accesses == 0 {
            return Err(Error::Config("tick_accesses must be positive"));
        }
        if self.granule_pages_log2 > 9 {
            return Err(Error::Config("granule_pages_log2 must be 0..=9"));
        }
        if self.detail_percent > 100 || (self.detail_percent > 0 && self.granule_pages_log2 != 9) {
            return Err(Error::Config(
                "detail_percent must be ≤ 100, and needs granule_pages_log2 = 9",
            ));
        }
        if self.zoom_bytes > 0
            && ((self.granule_pages_log2 != 0 && self.detail_percent == 0)
                || self.zoom_min_regions == 0
                || self.zoom_max_regions < self.zoom_min_regions
                || self.zoom_every == 0)
        {
            return Err(Error::Config(
                "zoom needs 4 KiB granules or hybrid tracking, 0 < zoom_min_regions ≤ zoom_max_regions, zoom_every ≥ 1",
            ));
        }
        if !(1..=16).contains(&self.abit_scans_per_tick) {
            return Err(Error::Config("abit_scans_per_tick must be 1..=16"));
        }
        if self.fast_permille > 1000 || self.sample_period == 0 {
            return Err(Error::Config(
                "fast_permille must be ≤ 1000, sample_period > 0",
            ));
        }
        if self.damon_min_regions == 0 || self.damon_max_regions < self.damon_min_regions {
            return Err(Error::Config(
                "need 0 < damon_min_regions ≤ damon_max_regions",
            ));
        }
        if self.damon_sample_us == 0
            || self.damon_aggr_us < self.damon_sample_us
            || u64::from(self.tick_ms) * 1000 < u64::from(self.damon_aggr_us)
        {
            return Err(Error::Config(
                "need 0 < damon_sample_us ≤ damon_aggr_us ≤ tick_ms × 1000",
            ));
        }
        if !(self.dram_ns > 0.0 && self.cxl_ns > 0.0 && self.migrate_gb_s_4k > 0.0) {
            return Err(Error::Config("latencies and bandwidths must be positive"));
        }
        Ok(())
    }
}

/// What drives placement in a run.
pub enum Planner {
    /// An online policy.
    Policy(Box<dyn PlacementPolicy>),
    /// The offline oracle.
    Oracle,
    /// A reference for reactive placement: the oracle's greedy rule on the exact per-granule
    /// accesses of the window just replayed (ties by the one before), not the next one:
    /// perfect observation of the past, no prediction. Not something a host can run.
    Hindsight,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Planner {
    /// Builds `oracle` or a registry policy with its table from `cfg.policy`.
    pub fn by_name(name: &str, cfg: &Config) -> Result<Self, Error> {
        if name == "oracle" {
            return Ok(Planner::Oracle);
        }
        if name == "hindsight" {
            return Ok(Planner::Hindsight);
        }
        let table = cfg.policy.get(name).and_then(|v| v.as_table());
        Ok(Planner::Policy(vmtier_policies::registry::build(
            name, table,
        )?))
    }

    /// Policy name.
    pub fn name(&self) -> &'static str {
        match self {
            Planner::Policy(p) => p.name(),
            Planner::Oracle => "oracle",
            Planner::Hindsight => "hindsight",
        }
    }
}

/// Measurements of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Policy name.
    pub policy: String,
    /// Tracking source used.
    pub source: String,
    /// Accesses replayed.
    pub accesses: u64,
    /// Accesses served by DRAM.
    pub hits: u64,
    /// `hits / accesses`.
    pub hit_ratio: f64,
    /// Ticks run.
    pub ticks: u64,
    /// Granules in the address space.
    pub granules: u64,
    /// Bytes per granule.
    pub granule_bytes: u64,
    /// DRAM budget in granules.
    pub budget_granules: u64,
    /// Move limit per tick in granules.
    pub max_moves: u64,
    /// Granules migrated (both directions).
    pub moves: u64,
    /// Bytes migrated.
    pub bytes_migrated: u64,
    /// 4 KiB pages that moved again within `pingpong_window` ticks of their previous move.
    pub pingpong_pages: u64,
    /// Estimated run time over the all-DRAM run time (≥ 1).
    pub est_slowdown: f64,
    /// Policy state bytes per 4 KiB page (its own, beyond the engine's records).
    pub metadata_bytes_per_page: f64,
    /// Engine hotness-store bytes per 4 KiB page (one record per granule).
    pub store_bytes_per_page: f64,
    /// Mean planning time per tick, ms.
    pub plan_ms_per_interval: f64,
    /// Largest planning time of a tick, ms.
    pub plan_ms_max: f64,
    /// Replay speed, accesses per second of wall time (planning included).
    pub replay_accesses_per_s: f64,
    /// Plan entries the engine dropped (over budget, over the move limit, wrong tier,
    /// duplicates); 0 for a well-behaved policy.
    pub plan_violations: u64,
    /// Hit ratio per tick.
    pub series: Vec<f32>,
    /// Ticks where the trace marks a shift of its hot set.
    pub marker_ticks: Vec<u64>,
    /// DAMON (first context): mean regions checked per sample interval.
    pub damon_regions_per_sample: f64,
    /// The zoom context ([`Config::zoom_bytes`]): mean regions checked per sample interval.
    pub zoom_regions_per_sample: f64,
    /// The zoom context: mean bytes watched per tick.
    pub zoom_bytes_mean: f64,
    /// Placement heatmap: per tick, per address bucket, (DRAM fraction, accesses share).
    pub heatmap: Vec<Vec<(f32, f32)>>,
}

/// The NUMA-balancing PTE scanner in tiering mode (Linux 6.12 `task_numa_work` and
/// `change_pte_range` with `numa_balancing=2`) over one VMA holding every granule, with the
/// hint faults it causes:
///
/// - each call walks the address space from where the previous one stopped, in chunks of
///   `hint_scan_mb_per_tick` (`numa_balancing_scan_size_mb`) of *address space*: fast-tier
///   granules, unpopulated ones and ones already inaccessible are walked over and counted, but
///   not made inaccessible. A chunk that made at least one granule inaccessible ends the
///   call; one that made none only counts against an eight-chunk limit, so such areas are
///   crossed faster. The end of the address space ends the call, and the next starts over
///   (a new scan sequence, `numa_scan_seq`);
/// - a granule already inaccessible keeps the time it was made so (no timer reset), so a
///   fault's latency is the time since the scan that really unmapped it;
/// - calls come one scan period apart. The first comes at the end of the first tick (the
///   kernel's 1 s scan delay), and the period starts at `task_scan_start`: 1 s divided by the
///   256 MB windows populated, at least 100 ms. With `backoff` the period doubles, up to
///   `task_scan_max` (60 s divided by the windows), once in every scan sequence in which a
///   page was promoted ([`Self::promoted`]): in tiering mode a promoted fault is the only
///   one the task's statistics count (`task_numa_fault` drops faults on slow-tier memory,
///   and a promoted page is on the fast node by then), and it is neither local (the page was
///   on a CPU-less node when it faulted) nor shared (slow-tier pages keep no last CPU), so
///   `update_task_scan_period` always takes its "scan slower" branch. Nothing in tiering
///   mode shortens the period again.
struct HintScanner {
    /// When each granule was made inaccessible (accesses replayed), `u64::MAX` if accessible.
    unmapped_at: Vec<u64>,
    /// Where the next call starts (`numa_scan_offset`).
    cursor: usize,
    /// Granules of address space per call (0 = the scanner is off).
    size: usize,
    /// Scan sequences completed (`mm->numa_scan_seq`).
    seq: u64,
    /// The sequence of the last placement (`p->numa_scan_seq`).
    placed_seq: u64,
    /// Length of a tick in ms (`Config::tick_ms`), to turn the kernel's periods into
    /// thousandths of a tick.
    tick_ms: u64,
    /// The shortest period, ms: a call's size at most 2560 MB/s (`MAX_SCAN_WINDOW`).
    floor_ms: u64,
    /// Whether the period doubles with promotions (`Config::hint_scan_backoff`).
    backoff: bool,
    /// The scan period, fixed at the first call.
    period: Option<ScanPeriod>,
}

/// [`HintScanner`]'s scan period, in thousandths of a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ScanPeriod {
    /// Between two calls now.
    now: u64,
    /// The longest it grows to (`task_scan_max`).
    max: u64,
    /// When the next call is due.
    next: u64,
}

impl HintScanner {
    fn new(n: usize, scan_mb: u64, granule_bytes: u64, tick_ms: u32, backoff: bool) -> Self {
        const MAX_SCAN_WINDOW_MB: u64 = 2560;
        Self {
            unmapped_at: vec![u64::MAX; n],
            cursor: 0,
            size: usize::try_from((scan_mb << 20) / granule_bytes.max(1)).unwrap_or(usize::MAX),
            seq: 0,
            placed_seq: 0,
            tick_ms: u64::from(tick_ms.max(1)),
            floor_ms: 1000 / (MAX_SCAN_WINDOW_MB / scan_mb.max(1)).max(1),
            backoff,
            period: None,
        }
    }

    /// `task_scan_start` and `task_scan_max` for `populated` granules, in thousandths of a
    /// tick, at `now`: 1 s and 60 s divided by the windows populated (one per call's size),
    /// at least [`Self::floor_ms`].
    fn first_period(&self, populated: usize, now: u64) -> ScanPeriod {
        let windows = (populated.div_ceil(self.size.max(1)).max(1)) as u64;
        let start_ms = (1000 / windows).max(self.floor_ms);
        let max_ms = (60_000 / windows).max(start_ms);
        let tick = |ms: u64| (ms * 1000 / self.tick_ms).max(1);
        ScanPeriod {
            now: tick(start_ms),
            max: tick(max_ms),
            next: now,
        }
    }

    /// An access to granule `g` at `now` (thousandths of a tick since the start): a hint
    /// fault if the scanner made it inaccessible. A granule that migrated to the fast tier
    /// meanwhile was remapped accessible by the migration.
    fn access(&mut self, g: usize, fast: bool, now: u64) -> Option<HintFault> {
        let at = std::mem::replace(&mut self.unmapped_at[g], u64::MAX);
        if at == u64::MAX || fast {
            return None;
        }
        let lat = now.saturating_sub(at);
        Some(HintFault {
            granule: Granule(g as u32),
            latency_millitick: u32::try_from(lat).unwrap_or(u32::MAX),
        })
    }

    /// The calls due by `now`, the end of sub-interval `k` of `scans` of a tick (before the
    /// first one: only at the end of a tick, the scan delay).
    fn scan(
        &mut self,
        (k, scans): (u16, u16),
        allocated: &[bool],
        records: &[HeatRecord],
        now: u64,
    ) {
        if self.size == 0 || self.unmapped_at.is_empty() {
            return;
        }
        if self.period.is_none() {
            if k + 1 < scans {
                return;
            }
            let populated = allocated.iter().filter(|&&a| a).count();
            self.period = Some(self.first_period(populated, now));
        }
        while let Some(p) = self.period.filter(|p| p.next <= now) {
            self.call(allocated, records, now);
            self.period = Some(ScanPeriod {
                next: p.next + p.now,
                ..p
            });
        }
    }

    /// A page was promoted at `now` after faulting: the first such fault of a scan sequence
    /// updates the task's placement, whose "scan slower" branch doubles the period (up to its
    /// maximum) and puts the next call one new period from now.
    fn promoted(&mut self, now: u64) {
        if !self.backoff || self.seq == self.placed_seq {
            return;
        }
        self.placed_seq = self.seq;
        if let Some(p) = self.period.as_mut() {
            p.now = (p.now * 2).min(p.max);
            p.next = now + p.now;
        }
    }

    /// One `task_numa_work` call.
    fn call(&mut self, allocated: &[bool], records: &[HeatRecord], now: u64) {
        let n = self.unmapped_at.len();
        let mut virt = self.size.saturating_mul(8);
        loop {
            let (start, end) = (self.cursor, self.cursor.saturating_add(self.size).min(n));
            let mut updated = false;
            for g in start..end {
                if allocated[g] && !records[g].is_fast() && self.unmapped_at[g] == u64::MAX {
                    self.unmapped_at[g] = now;
                    updated = true;
                }
            }
            self.cursor = if end == n { 0 } else { end };
            if end == n {
                self.seq += 1;
            }
            if updated || end == n || virt <= end - start {
                return;
            }
            virt -= end - start;
        }
    }
}

/// Where the ticks of `trace` start, and its end: one tick per recorded epoch when the trace
/// has epoch markers and `cfg.epoch_ticks`, else one per `cfg.tick_accesses` accesses.
/// Strictly increasing, starts at 0, ends at the number of accesses.
pub fn tick_bounds(trace: &Trace, cfg: &Config) -> Vec<u64> {
    let total = trace.accesses.len() as u64;
    let mut b = vec![0];
    if cfg.epoch_ticks && trace.has_epochs() {
        b.extend(trace.epoch_bounds());
    } else {
        let step = cfg.tick_accesses.max(1);
        b.extend((1..total.div_ceil(step)).map(|t| t * step));
    }
    b.push(total);
    b
}

/// Runs `planner` over `trace` with `cfg`.
pub fn run(trace: &Trace, planner: &mut Planner, cfg: &Config) -> Result<RunResult, Error> {
    run_logged(trace, planner, cfg, &mut |_, _| {})
}

/// Like [`run`], calling `on_plan(tick, plan)` with every plan the planner returns (before
/// the engine trims it).
pub fn run_logged(
    trace: &Trace,
    planner: &mut Planner,
    cfg: &Config,
    on_plan: &mut dyn FnMut(u64, &Plan),
) -> Result<RunResult, Error> {
    cfg.check()?;
    if trace.accesses.is_empty() {
        return Err(Error::EmptyTrace);
    }
    if trace.page_shift != 12 {
        return Err(Error::Config(
            "traces must count 4 KiB pages (page_shift 12)",
        ));
    }
    let started = Instant::now();
    let granule = GranuleSize::from_pages_log2(cfg.granule_pages_log2)
        .map_err(|_| Error::Config("granule_pages_log2 must be 0..=9"))?;
    let gshift = granule.pages_log2();
    let granule_pages = granule.base_pages();
    let granule_bytes = granule.bytes();
    let page_bytes = PageSize::Base.bytes();
    let mut store = HotnessStore::new(
        &sim_layout(trace.pages),
        StoreConfig {
            granule,
            detail_percent: cfg.detail_percent,
        },
    )
    .map_err(|_| Error::Config("too many granules"))?;
    let n = store.len();
    let mut touched = vec![false; n];
    for &p in &trace.accesses {
        touched[(p >> gshift) as usize] = true;
    }
    let footprint = touched.iter().filter(|&&t| t).count() as u64;
    drop(touched);
    let mut budget = (footprint * u64::from(cfg.fast_permille) / 1000).max(1);
    let mut max_moves = (budget * u64::from(cfg.move_permille) / 1000).max(1);
    // Hybrid tracking: the budget and move limit in 4 KiB pages touched, as a 4 KiB run has
    // them; the policy gets them in regions (`HotnessStore::policy_budget`).
    let hybrid = cfg.detail_percent > 0;
    let (budget_pages, moves_pages) = if hybrid {
        let mut seen = vec![false; trace.pages as usize];
        for &p in &trace.accesses {
            seen[p as usize] = true;
        }
        let pages = seen.iter().filter(|&&t| t).count() as u64;
        let b = (pages * u64::from(cfg.fast_permille) / 1000).max(1);
        let m = (b * u64::from(cfg.move_permille) / 1000).max(1);
        budget = store
            .plan_budget(b * page_bytes, vmtier_core::hybrid::HOT_MIN)
            .granules;
        // The policy's limit in regions is the limit in pages; `fit` holds the real one.
        max_moves = m;
        (b, m)
    } else {
        (0, 0)
    };
    let mut fast_pages: u64 = 0;
    let mut moved_pages: u64 = 0;
    let mut max_store_bytes = store.bytes_per_4k_page();
    let source = match (&*planner, cfg.source) {
        (Planner::Oracle | Planner::Hindsight, _) => TrackingSource::None,
        (Planner::Policy(p), Some(s)) if p.source() == TrackingSource::AbitScan => s.to_source(),
        (Planner::Policy(p), _) => p.source(),
    };
    let scans = u16::from(cfg.abit_scans_per_tick);
    let mut rng = Rng::new(cfg.seed);

    let mut allocated = vec![cfg.initial == Initial::Slow; n];
    let mut fast_used: u64 = 0;
    let mut mask = vec![0u16; n];
    let mut counts = vec![0u32; n];
    let sampling = source == TrackingSource::Sampling;
    let hinting = source == TrackingSource::HintFaults;
    let soft_dirty = source == TrackingSource::SoftDirty;
    let mut samples = vec![0u16; if sampling { n } else { 0 }];
    let mut written = vec![false; if soft_dirty { trace.pages as usize } else { 0 }];
    let mut hint = hinting.then(|| {
        let mb = cfg.hint_scan_mb_per_tick;
        HintScanner::new(n, mb, granule_bytes, cfg.tick_ms, cfg.hint_scan_backoff)
    });
    let mut faults: Vec<HintFault> = Vec::new();

    // DAMON: samples per tick and per window; the sample in which each accessed-bit unit was
    // last touched.
    let damon_samples = (u64::from(cfg.tick_ms) * 1000 / u64::from(cfg.damon_sample_us)).max(1);
    let per_window = (cfg.damon_aggr_us / cfg.damon_sample_us).max(1);
    let unit_log2 = if cfg.thp { 9 } else { 0 };
    let mut damon = (source == TrackingSource::DamonRegions).then(|| {
        // Cut to `min_nr_regions` from the start, as vmtierd hands them to `fvaddr`.
        let whole = [(0, u64::from(trace.pages))];
        let init: Vec<(u32, u32)> =
            vmtier_sources::damon::even_regions(&whole, u64::from(cfg.damon_min_regions), 1)
                .into_iter()
                .filter_map(|(s, e)| Some((u32::try_from(s).ok()?, u32::try_from(e).ok()?)))
                .collect();
        DamonModel::new(
            &init,
            DamonAttrs {
                samples_per_window: per_window,
                min_nr_regions: cfg.damon_min_regions,
                max_nr_regions: cfg.damon_max_regions,
            },
            unit_log2,
            cfg.seed ^ 0xda30,
        )
    });
    // The zoom context: the same model over the chunks `zoom::select` picks, its own limits.
    let mut zoom = (damon.is_some() && cfg.zoom_bytes > 0).then(|| {
        DamonModel::new(
            &[],
            DamonAttrs {
                samples_per_window: per_window,
                min_nr_regions: cfg.zoom_min_regions,
                max_nr_regions: cfg.zoom_max_regions,
            },
            unit_log2,
            cfg.seed ^ 0x2004,
        )
    });
    let zoom_cap =
        usize::try_from(cfg.zoom_bytes / (u64::from(crate::zoom::CHUNK_PAGES) * page_bytes))
            .unwrap_or(usize::MAX);
    let mut zoom_chunks: Vec<u32> = Vec::new();
    let mut zoom_last = vec![
        0u64;
        if zoom.is_some() {
            trace.pages.div_ceil(crate::zoom::CHUNK_PAGES) as usize
        } else {
            0
        }
    ];
    let mut zoom_ranges: Vec<(u32, u32)> = Vec::new();
    let mut zoom_windows: Vec<Reported> = Vec::new();
    let mut heats: Vec<u8> = Vec::new();
    let (mut main_checks, mut zoom_checks, mut zoom_pages_sum) = (0u64, 0u64, 0u64);
    let damon_max_gain = {
        let n = u32::try_from(damon_samples).unwrap_or(u32::MAX);
        HeatRecord::heat_gain(n, n)
    };
    let mut last_sample = vec![
        u64::MAX;
        if damon.is_some() {
            (trace.pages >> unit_log2) as usize + 1
        } else {
            0
        }
    ];
    let mut windows: Vec<Reported> = Vec::new();
    let mut regions: Vec<Region> = Vec::new();
    let mut split: Vec<u32> = Vec::new();
    // What maps the granules, as vmtierd hands it to the policy with its two sources (DAMON,
    // soft-dirty; both report per page, one bit per huge page with `thp`): with `thp` huge
    // pages map them all, else base pages. The other models report a granule accessed if any
    // page of it was: nothing to tell there.
    let huge_all: Vec<u32> = if cfg.thp {
        (0..u32::try_from(n).unwrap_or(u32::MAX)).collect()
    } else {
        Vec::new()
    };
    let huge = matches!(
        source,
        TrackingSource::DamonRegions | TrackingSource::SoftDirty
    )
    .then_some(huge_all.as_slice());
    let mut reports: Vec<RegionAccess> = Vec::new();

    let mut observed: Vec<u16> = Vec::new();
    let mut future: Vec<u64> = Vec::new();
    let mut last_move = vec![0u64; n];
    // Hybrid tracking moves pages, not regions: when each 4 KiB page last moved.
    let mut page_move = vec![0u64; if hybrid { trace.pages as usize } else { 0 }];
    let mut next_sample = u64::from(cfg.sample_period);

    let mut res = RunResult {
        policy: planner.name().to_owned(),
        source: source_name(source).to_owned(),
        granules: n as u64,
        granule_bytes,
        budget_granules: budget,
        max_moves,
        store_bytes_per_page: store.bytes_per_4k_page(),
        ..RunResult::default()
    };
    let total = trace.accesses.len() as u64;
    let bounds = tick_bounds(trace, cfg);
    let ticks = bounds.len() as u64 - 1;
    let tick_of = |at: u64| (bounds.partition_point(|&b| b <= at) as u64).saturating_sub(1);
    res.marker_ticks = trace
        .markers
        .iter()
        .filter(|m| m.id != EPOCH_MARKER)
        .map(|m| tick_of(m.at).min(ticks - 1))
        .collect();
    let mut plan_ns_total: u128 = 0;
    let mut plan_ns_max: u128 = 0;
    let rows = cfg.heatmap_rows as usize;
    let mut now: u64 = 0;
    let mut damon_sample: u64 = 0;

    for tick in 0..ticks {
        let (lo, hi) = (bounds[tick as usize], bounds[tick as usize + 1]);
        let window = &trace.accesses[lo as usize..hi as usize];
        // The tick's clock in thousandths of a tick (hint-fault latencies).
        let len = window.len().max(1) as u64;
        let clock = |pos: usize| tick * 1000 + pos as u64 * 1000 / len;
        if let Some(z) = zoom.as_mut() {
            if tick % u64::from(cfg.zoom_every) == 0 {
                // What the store found at the end of the last tick picks the zoom's chunks;
                // DAMON sysfs commits them between two aggregation windows.
                heats.clear();
                if hybrid {
                    // A split region's pages, else its own heat for each of its pages.
                    for (g, r) in store.records().iter().enumerate() {
                        match store.detail(Granule(g as u32)) {
                            Some(d) => heats.extend(d.iter().map(|p| p.heat())),
                            None => heats.extend(std::iter::repeat(r.heat()).take(512)),
                        }
                    }
                    heats.truncate(trace.pages as usize);
                } else {
                    heats.extend(store.records().iter().map(|r| r.heat()));
                }
                let hot_min = vmtier_core::hybrid::hot_min(damon_max_gain);
                zoom_chunks = crate::zoom::select(
                    &heats,
                    hot_min,
                    zoom_cap,
                    &zoom_chunks,
                    cfg.zoom_sticky,
                    &zoom_last,
                );
                for &c in &zoom_chunks {
                    zoom_last[c as usize] = tick + 1;
                }
                zoom_ranges = crate::zoom::ranges(&zoom_chunks, trace.pages);
                z.set_ranges(&zoom_ranges);
            }
            zoom_pages_sum += z.total_pages();
        }
        // The engine's tick starts: heat cools, move ages advance.
        store.tick();
        windows.clear();
        zoom_windows.clear();
        let mut last_window = 0usize;
        let mut hits = 0u64;
        let tick_sample0 = damon_sample;
        for k in 0..scans {
            let a = window.len() * usize::from(k) / usize::from(scans);
            let b = window.len() * usize::from(k + 1) / usize::from(scans);
            let bit = 1u16 << k;
            for (j, &page) in window[a..b].iter().enumerate() {
                let g = (page >> gshift) as usize;
                if !allocated[g] {
                    allocated[g] = true;
                    if hybrid {
                        if fast_pages + granule_pages <= budget_pages {
                            store.set_tier(Granule(g as u32), Tier::Fast);
                            fast_pages += granule_pages;
                        }
                    } else if fast_used < budget {
                        store.set_tier(Granule(g as u32), Tier::Fast);
                        fast_used += 1;
                    }
                }
                hits += u64::from(if hybrid {
                    store.page_is_fast(Granule(g as u32), (page & 511) as usize)
                } else {
                    store.records()[g].is_fast()
                });
                counts[g] += 1;
                mask[g] |= bit;
                if sampling {
                    next_sample -= 1;
                    if next_sample == 0 {
                        samples[g] = samples[g].saturating_add(1);
                        let p = u64::from(cfg.sample_period);
                        next_sample = (p / 2 + rng.below(p + 1)).max(1);
                    }
                }
                if soft_dirty && trace.is_write(now as usize) {
                    written[page as usize] = true;
                }
                if let Some(d) = damon.as_mut() {
                    // This access falls in DAMON sample `s` of the tick; samples that ended
                    // before it are checked first.
                    let at = (a + j) as u64;
                    let s = tick_sample0 + at * damon_samples / window.len().max(1) as u64;
                    while damon_sample < s {
                        let cur = damon_sample;
                        let before = windows.len();
                        main_checks += d.regions().len() as u64;
                        if d.sample(|u| last_sample[u as usize] == cur, &mut windows) {
                            last_window = before;
                        }
                        if let Some(z) = zoom.as_mut() {
                            zoom_checks += z.regions().len() as u64;
                            z.sample(|u| last_sample[u as usize] == cur, &mut zoom_windows);
                        }
                        damon_sample += 1;
                    }
                    last_sample[d.unit_of(page) as usize] = s;
                }
                if let Some(h) = hint.as_mut() {
                    let fast = store.records()[g].is_fast();
                    faults.extend(h.access(g, fast, clock(a + j)));
                }
                now += 1;
            }
            if let Some(h) = hint.as_mut() {
                h.scan((k, scans), &allocated, store.records(), clock(b));
            }
        }
        if let Some(d) = damon.as_mut() {
            // The tick's remaining samples (the last ones may see no access).
            while damon_sample < tick_sample0 + damon_samples {
                let cur = damon_sample;
                let before = windows.len();
                main_checks += d.regions().len() as u64;
                if d.sample(|u| last_sample[u as usize] == cur, &mut windows) {
                    last_window = before;
                }
                if let Some(z) = zoom.as_mut() {
                    zoom_checks += z.regions().len() as u64;
                    z.sample(|u| last_sample[u as usize] == cur, &mut zoom_windows);
                }
                damon_sample += 1;
            }
        }
        let acc = window.len() as u64;
        res.accesses += acc;
        res.hits += hits;
        res.series.push(if acc == 0 {
            0.0
        } else {
            hits as f32 / acc as f32
        });

        // What the source saw goes into the store, as vmtierd's source reports it.
        reports.clear();
        let hva = |page: u64| HostVirtAddr::new(SIM_BASE + page * page_bytes);
        match source {
            TrackingSource::DamonRegions => {
                let rec = |start: u32, end: u32, nr_accesses| WindowRegion {
                    start: SIM_BASE + u64::from(start) * page_bytes,
                    end: SIM_BASE + u64::from(end) * page_bytes,
                    nr_accesses,
                };
                let mut recs: Vec<WindowRegion> = Vec::with_capacity(windows.len());
                for w in &windows {
                    // Over the zoom's chunks its finer regions replace the first context's.
                    for (s, e) in outside(w.start, w.end, &zoom_ranges) {
                        recs.push(rec(s, e, w.nr_accesses));
                    }
                }
                recs.extend(
                    zoom_windows
                        .iter()
                        .map(|w| rec(w.start, w.end, w.nr_accesses)),
                );
                reports.extend(accumulate(&recs, per_window).iter().map(|sg| RegionAccess {
                    start: HostVirtAddr::new(sg.start),
                    len: sg.end - sg.start,
                    hits: sg.hits,
                    samples: sg.samples,
                }));
                // Region-based policies see the tick's last window, in granules.
                let last = &windows[last_window.min(windows.len())..];
                regions.clear();
                regions.extend(last.iter().map(|w| {
                    let g0 = w.start >> gshift;
                    let g1 = (w.end - 1) >> gshift;
                    Region {
                        start: Granule(g0),
                        len: g1 - g0 + 1,
                        nr_accesses: u16::try_from(w.nr_accesses).unwrap_or(u16::MAX),
                        age: u16::try_from(w.age).unwrap_or(u16::MAX),
                    }
                }));
            }
            TrackingSource::SoftDirty => {
                let mut p = 0usize;
                while p < written.len() {
                    if !written[p] {
                        p += 1;
                        continue;
                    }
                    let q = written[p..]
                        .iter()
                        .position(|w| !w)
                        .map_or(written.len(), |k| p + k);
                    reports.push(RegionAccess {
                        start: hva(p as u64),
                        len: (q - p) as u64 * page_bytes,
                        hits: 1,
                        samples: 1,
                    });
                    p = q;
                }
                written.fill(false);
            }
            TrackingSource::None => {}
            _ => {
                for g in 0..n {
                    let (h, of) = if sampling {
                        // A sampled access is certain; as many samples as hits.
                        (u32::from(samples[g]), u32::from(samples[g]))
                    } else {
                        (mask[g].count_ones(), u32::from(scans))
                    };
                    if h > 0 {
                        reports.push(RegionAccess {
                            start: hva(g as u64 * granule_pages),
                            len: granule_bytes,
                            hits: h,
                            samples: of,
                        });
                    }
                }
            }
        }
        store.observe(&reports);
        let obs: &[u16] = match source {
            TrackingSource::AbitScan => {
                observed.clear();
                observed.extend(mask.iter().map(|m| m.count_ones() as u16));
                &observed
            }
            TrackingSource::Sampling => &samples,
            _ => &[],
        };
        let max_observed = if source == TrackingSource::DamonRegions {
            u16::try_from(per_window).unwrap_or(u16::MAX)
        } else {
            scans
        };
        // The most one tick can give, as vmtierd tells its policy.
        let max_gain = match source {
            TrackingSource::DamonRegions => {
                let n = u32::try_from(damon_samples).unwrap_or(u32::MAX);
                HeatRecord::heat_gain(n, n)
            }
            TrackingSource::SoftDirty => HeatRecord::heat_gain(1, 1),
            TrackingSource::AbitScan | TrackingSource::HintFaults => {
                HeatRecord::heat_gain(u32::from(scans), u32::from(scans))
            }
            _ => HeatRecord::HEAT_GAIN,
        };

        // Plan.
        let b = store.plan_budget(
            budget_pages * page_bytes,
            vmtier_core::hybrid::hot_min(max_gain),
        );
        let hot_min = b.hot_min;
        if hybrid {
            budget = b.granules;
        }
        store.split_regions(&mut split);
        let records = store.records();
        let t0 = Instant::now();
        let plan = match planner {
            Planner::Policy(p) => {
                let input = PolicyInput {
                    tick,
                    granule_bytes,
                    records,
                    fast_budget: budget,
                    max_moves,
                    observed: obs,
                    max_observed,
                    hint_faults: &faults,
                    regions: &regions,
                    hints: &[],
                    max_gain,
                    split: &split,
                    huge,
                };
                p.plan(&input)
            }
            Planner::Oracle | Planner::Hindsight => {
                // Scores per granule: the window planned for (the next one; for hindsight the
                // one just replayed) weighs 2^32, the others break ties (the oracle's later
                // windows, hindsight's window before).
                let windows: Vec<u64> = if matches!(planner, Planner::Oracle) {
                    (1..=u64::from(cfg.oracle_lookahead.max(1)))
                        .map(|w| tick + w)
                        .collect()
                } else {
                    [Some(tick), tick.checked_sub(1)]
                        .into_iter()
                        .flatten()
                        .collect()
                };
                future.clear();
                future.resize(n, 0);
                let at = |t: u64| bounds.get(t as usize).copied().unwrap_or(total) as usize;
                for (k, &t) in windows.iter().enumerate() {
                    let inc = if k == 0 { 1u64 << 32 } else { 1 };
                    for &p in &trace.accesses[at(t)..at(t + 1)] {
                        future[(p >> gshift) as usize] += inc;
                    }
                }
                crate::oracle::plan(records, &future, budget, max_moves)
            }
        };
        let dt = t0.elapsed().as_nanos();
        on_plan(tick, &plan);
        plan_ns_total += dt;
        plan_ns_max = plan_ns_max.max(dt);

        // Apply as the engine does: the one enforcement rule, moves that always succeed.
        let mut moved = 0u64;
        let stamp_now = tick + 1;
        let mut e = plan.enforce(records, budget, max_moves);
        let fitted = store.fit(
            &mut e,
            budget_pages * page_bytes,
            moves_pages,
            hot_min,
            |_| false,
        );
        res.plan_violations += e.invalid + e.deferred;
        let moves = e
            .demote
            .iter()
            .map(|&g| (g, Tier::Slow))
            .chain(e.promote.iter().map(|&g| (g, Tier::Fast)));
        for (g, to) in moves {
            let i = g.index();
            let again = last_move[i] != 0 && stamp_now - last_move[i] <= cfg.pingpong_window;
            last_move[i] = stamp_now;
            allocated[i] = true;
            if hybrid {
                let (step, hm) = if to == Tier::Fast {
                    (Step::Promote, fitted.hot_min(g, hot_min))
                } else {
                    (Step::Demote, hot_min)
                };
                // A split region moves only some of its pages: each page counts on its own.
                res.pingpong_pages +=
                    stamp_pages(&store, &mut page_move, (g, step, hm), stamp_now, cfg);
                moved_pages += store.apply(g, step, hm);
                moved += 1;
                continue;
            }
            if again {
                res.pingpong_pages += granule_pages;
            }
            store.mark_moved(g, to);
            if to == Tier::Fast {
                fast_used += 1;
            } else {
                fast_used -= 1;
            }
            moved += 1;
        }
        if hybrid {
            // Split regions in DRAM follow their pages, as the engine's touch-ups.
            let left = moves_pages.saturating_sub(fitted.moved);
            for (g, step, hm) in store.touch_up_plan(hot_min, budget_pages * page_bytes, left) {
                res.pingpong_pages +=
                    stamp_pages(&store, &mut page_move, (g, step, hm), stamp_now, cfg);
                moved_pages += store.apply(g, step, hm);
                moved += 1;
            }
            fast_pages = store.tier_bytes().fast / page_bytes;
            max_store_bytes = max_store_bytes.max(store.bytes_per_4k_page());
        }
        res.moves += moved;
        if let Some(h) = hint.as_mut().filter(|_| !e.promote.is_empty()) {
            // The hint-fault policies promote what faulted: the task's placement sees it.
            h.promoted((tick + 1) * 1000);
        }

        if rows > 0 {
            let records = store.records();
            let mut col = vec![(0u64, 0u64, 0u64); rows];
            for g in 0..n {
                let row = g * rows / n.max(1);
                col[row].0 += u64::from(records[g].is_fast());
                col[row].1 += 1;
                col[row].2 += u64::from(counts[g]);
            }
            res.heatmap.push(
                col.iter()
                    .map(|&(f, c, a)| {
                        (
                            if c == 0 { 0.0 } else { f as f32 / c as f32 },
                            if acc == 0 { 0.0 } else { a as f32 / acc as f32 },
                        )
                    })
                    .collect(),
            );
        }
        mask.fill(0);
        counts.fill(0);
        samples.fill(0);
        faults.clear();
    }

    res.ticks = ticks;
    res.hit_ratio = res.hits as f64 / res.accesses.max(1) as f64;
    res.bytes_migrated = if hybrid {
        res.store_bytes_per_page = max_store_bytes;
        moved_pages * page_bytes
    } else {
        res.moves * granule_bytes
    };
    let pages = (n as u64 * granule_pages).max(1) as f64;
    res.metadata_bytes_per_page = match planner {
        Planner::Policy(p) => p.state_bytes() as f64 / pages,
        Planner::Oracle | Planner::Hindsight => 8.0 * n as f64 / pages,
    };
    res.plan_ms_per_interval = plan_ns_total as f64 / 1e6 / ticks.max(1) as f64;
    let samples_run = (damon_samples * ticks).max(1) as f64;
    res.damon_regions_per_sample = main_checks as f64 / samples_run;
    res.zoom_regions_per_sample = zoom_checks as f64 / samples_run;
    res.zoom_bytes_mean = (zoom_pages_sum * page_bytes) as f64 / ticks.max(1) as f64;
    res.plan_ms_max = plan_ns_max as f64 / 1e6;
    let misses = res.accesses - res.hits;
    let bw = if cfg.granule_pages_log2 >= 9 {
        cfg.migrate_gb_s_2m
    } else {
        cfg.migrate_gb_s_4k
    };
    let migrate_ns = res.bytes_migrated as f64 / bw;
    let base = res.accesses as f64 * (cfg.compute_ns_per_access + cfg.dram_ns);
    let cost = res.accesses as f64 * cfg.compute_ns_per_access
        + res.hits as f64 * cfg.dram_ns
        + misses as f64 * cfg.cxl_ns
        + migrate_ns;
    res.est_slowdown = cost / base.max(1.0);
    res.replay_accesses_per_s = res.accesses as f64 / started.elapsed().as_secs_f64().max(1e-9);
    Ok(res)
}

/// The parts of pages `start..end` outside `ranges` (sorted, non-overlapping).
fn outside(start: u32, end: u32, ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut at = start;
    for &(s, e) in ranges {
        if e <= at {
            continue;
        }
        if s >= end {
            break;
        }
        if s > at {
            out.push((at, s));
        }
        at = at.max(e);
        if at >= end {
            return out;
        }
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// Stamps the 4 KiB pages that `step` of region `g` moves (hybrid tracking) with `now`;
/// returns how many of them had moved within `cfg.pingpong_window` ticks before.
fn stamp_pages(
    store: &HotnessStore,
    stamps: &mut [u64],
    (g, step, hot_min): (Granule, Step, u8),
    now: u64,
    cfg: &Config,
) -> u64 {
    let mut addrs = Vec::new();
    store.pages_of(g, step, hot_min, &mut addrs);
    let mut again = 0u64;
    for a in addrs {
        let Some(stamp) = a
            .raw()
            .checked_sub(SIM_BASE)
            .and_then(|off| usize::try_from(off / PageSize::Base.bytes()).ok())
            .and_then(|p| stamps.get_mut(p))
        else {
            continue;
        };
        if *stamp != 0 && now.saturating_sub(*stamp) <= cfg.pingpong_window {
            again += 1;
        }
        *stamp = now;
    }
    again
}

/// Where the simulated guest RAM sits in the simulated VMM: one range, huge-page aligned.
const SIM_BASE: u64 = 0x7f00_0000_0000;

/// The layout of a simulated guest with `pages` 4 KiB pages.
fn sim_layout(pages: u32) -> GuestMemoryLayout {
    GuestMemoryLayout::new(
        ProcessId::new(1),
        vec![GuestRamRange {
            name: "ram".into(),
            gpa: GuestPhysAddr(0),
            hva: HostVirtAddr::new(SIM_BASE),
            len: u64::from(pages.max(1)) * PageSize::Base.bytes(),
            backing: Backing::PrivateAnon,
        }],
    )
    .expect("one page-aligned range")
}

/// Mean ticks from each hot-set shift until the policy's per-tick hit ratio reaches 90 % of
/// the oracle's; `None` without markers.
pub fn reaction_ticks(policy: &[f32], oracle: &[f32], markers: &[u64]) -> Option<f64> {
    if markers.is_empty() {
        return None;
    }
    let mut sum = 0u64;
    for &m in markers {
        let m = m as usize;
        let t = (m..policy.len())
            .find(|&t| policy[t] >= 0.9 * oracle.get(t).copied().unwrap_or(0.0))
            .unwrap_or(policy.len());
        sum += (t - m.min(t)) as u64;
    }
    Some(sum as f64 / markers.len() as f64)
}

#[cfg(test)]
#[allow(clippy::type_complexity)] // test tables
mod tests {
    use super::*;
    use crate::gen::{self, Kind, Spec};

    fn small(kind: Kind) -> Trace {
        gen::generate(&Spec {
            kind,
            pages: 2048,
            accesses: 120_000,
            ..Spec::default()
        })
        .expect("generate")
    }

    fn cfg() -> Config {
        Config {
            tick_accesses: 10_000,
            heatmap_rows: 8,
            ..Config::default()
        }
    }

    #[test]
    fn every_policy_respects_budget_and_oracle_wins() -> Result<(), Error> {
        for kind in [Kind::Zipf, Kind::MovingHot] {
            let t = small(kind);
            let oracle = run(&t, &mut Planner::Oracle, &cfg())?;
            for name in vmtier_policies::registry::REGISTRY.iter().map(|e| e.name) {
                let r = run(&t, &mut Planner::by_name(name, &cfg())?, &cfg())?;
                assert_eq!(r.plan_violations, 0, "{name} on {kind:?}");
                assert!(
                    r.hit_ratio <= oracle.hit_ratio + 1e-9,
                    "{name} beats oracle on {kind:?}"
                );
                assert!(r.est_slowdown >= 1.0 - 1e-9);
                assert_eq!(r.series.len() as u64, r.ticks);
                assert_eq!(r.heatmap.len() as u64, r.ticks);
            }
        }
        Ok(())
    }

    #[test]
    fn sources_and_configs() -> Result<(), Error> {
        let t = small(Kind::Zipf);
        for source in [SourceName::Abit, SourceName::Damon, SourceName::Sampling] {
            let c = Config {
                source: Some(source),
                ..cfg()
            };
            let r = run(&t, &mut Planner::by_name("default", &c)?, &c)?;
            assert_eq!(r.source, source_name(source.to_source()));
            assert!(r.hit_ratio > 0.3, "{source:?}: {}", r.hit_ratio);
        }
        let bad = [
            Config {
                tick_accesses: 0,
                ..cfg()
            },
            Config {
                abit_scans_per_tick: 17,
                ..cfg()
            },
            Config {
                granule_pages_log2: 10,
                ..cfg()
            },
            Config {
                damon_min_regions: 0,
                ..cfg()
            },
        ];
        for c in bad {
            assert!(matches!(
                run(&t, &mut Planner::Oracle, &c),
                Err(Error::Config(_))
            ));
        }
        let parsed: Result<Config, _> = toml::from_str("tick_accesses = 5\nbogus = 1\n");
        assert!(parsed.is_err());
        assert!(matches!(
            run(&Trace::new(12, 64), &mut Planner::Oracle, &cfg()),
            Err(Error::EmptyTrace)
        ));
        Ok(())
    }

    #[test]
    fn hybrid_ping_pong_counts_the_pages_that_moved() -> Result<(), Error> {
        // A split region moves only some of its pages, by the plan or by a touch-up; a page
        // that moves again within the window counts once, not all 512 of its region.
        for kind in [Kind::Zipf, Kind::MovingHot, Kind::Phases] {
            let c = Config {
                source: Some(SourceName::Damon),
                granule_pages_log2: 9,
                detail_percent: 100,
                fast_permille: 100,
                ..cfg()
            };
            let t = small(kind);
            let r = run(&t, &mut Planner::by_name("default", &c)?, &c)?;
            let moved_pages = r.bytes_migrated / 4096;
            assert!(moved_pages > 0, "{kind:?}: nothing moved");
            assert!(
                r.pingpong_pages <= moved_pages,
                "{kind:?}: {} ping-pong pages of {moved_pages} moved",
                r.pingpong_pages
            );
        }
        Ok(())
    }

    #[test]
    fn reaction_time_table() {
        let cases: Vec<(Vec<f32>, Vec<f32>, Vec<u64>, Option<f64>)> = vec![
            (vec![1.0, 0.1, 0.5, 0.9], vec![1.0; 4], vec![1], Some(2.0)),
            (vec![1.0, 1.0], vec![1.0; 2], vec![0], Some(0.0)),
            (vec![0.0, 0.0], vec![1.0; 2], vec![0], Some(2.0)),
            (vec![1.0], vec![1.0], vec![], None),
        ];
        for (p, o, m, want) in cases {
            assert_eq!(reaction_ticks(&p, &o, &m), want);
        }
    }

    #[test]
    fn hint_scanner_walks_address_space_and_keeps_stamps() {
        const A: u64 = u64::MAX;
        // (case, tiers ('f' fast, 's' slow, '.' unpopulated), stamps before (A = accessible),
        //  cursor before, now, stamps after, cursor after); one call of 4-granule chunks.
        let cases: Vec<(&str, &str, Vec<u64>, usize, u64, Vec<u64>, usize)> = vec![
            (
                "slow granules are unmapped, one chunk per call",
                "ssssssssss",
                vec![A; 10],
                0,
                7,
                [vec![7; 4], vec![A; 6]].concat(),
                4,
            ),
            (
                "fast and unpopulated granules are walked over, not unmapped",
                "ff..ff.sss",
                vec![A; 10],
                0,
                7,
                [vec![A; 7], vec![7], vec![A; 2]].concat(),
                8,
            ),
            (
                "already unmapped granules keep their time and do not end the call",
                "ssssssssss",
                [vec![3; 4], vec![A; 6]].concat(),
                0,
                7,
                [vec![3; 4], vec![7; 4], vec![A; 2]].concat(),
                8,
            ),
            (
                "the end of the address space ends the call, the next starts over",
                "ssssssssss",
                vec![A; 10],
                8,
                7,
                [vec![A; 8], vec![7; 2]].concat(),
                0,
            ),
        ];
        for (name, tiers, before, cursor, now, after, cursor_after) in cases {
            let allocated: Vec<bool> = tiers.chars().map(|c| c != '.').collect();
            let records: Vec<HeatRecord> = tiers
                .chars()
                .map(|c| {
                    let t = if c == 'f' { Tier::Fast } else { Tier::Slow };
                    HeatRecord::default().placed_on(t)
                })
                .collect();
            let mut h = HintScanner::new(10, 1, 1 << 18, 1000, true);
            (h.unmapped_at, h.cursor) = (before, cursor);
            h.call(&allocated, &records, now);
            assert_eq!((h.unmapped_at, h.cursor), (after, cursor_after), "{name}");
        }
        // Eight chunks without anything to unmap end a call.
        let mut h = HintScanner::new(100, 1, 1 << 18, 1000, true);
        assert_eq!(h.size, 4);
        h.call(&[false; 100], &[HeatRecord::default(); 100], 1);
        assert_eq!(h.cursor, 32);
        // A fault: latency in thousandths of a tick; none if accessible or now fast.
        h.unmapped_at[3] = 10;
        h.unmapped_at[4] = 10;
        let f = h.access(3, false, 2510).map(|f| f.latency_millitick);
        assert_eq!(f, Some(2500));
        assert_eq!(h.access(3, false, 3000), None);
        assert_eq!(h.access(4, true, 3000), None);
        assert_eq!(h.unmapped_at[4], u64::MAX);
    }

    #[test]
    fn the_hint_scan_period_doubles_once_a_sequence_with_promotions() {
        // 256 populated 4 KiB granules (1 MiB) in 1 MiB calls: one call a sequence, one window,
        // so the period starts at 1 s and grows to 60 s. Ticks of 1 s, 8 sub-intervals each.
        let (n, mb) = (256, 1);
        let allocated = vec![true; n];
        let records = vec![HeatRecord::default(); n];
        let every = |step: usize| (0..64u64).step_by(step).collect::<Vec<_>>();
        let all: Vec<u64> = (0..64).collect();
        // (case, backoff, ticks with a promotion at their end, ticks with a call, of 64)
        let cases: Vec<(&str, bool, Vec<u64>, Vec<u64>)> = vec![
            (
                "no promotions: a call a tick from the scan delay on",
                true,
                vec![],
                every(1),
            ),
            (
                "without backoff promotions change nothing",
                false,
                all.clone(),
                every(1),
            ),
            (
                "doubles with each sequence that promotes, a new period from the placement",
                true,
                all,
                vec![0, 2, 6, 14, 30, 62],
            ),
            (
                "a second promotion in one sequence does not double it again",
                true,
                vec![0, 1],
                every(2),
            ),
            (
                "it stays where promotions left it",
                true,
                vec![0, 2],
                [vec![0, 2], (6..64).step_by(4).collect()].concat(),
            ),
        ];
        for (name, backoff, promoted, want) in cases {
            let mut h = HintScanner::new(n, mb, 4096, 1000, backoff);
            let mut calls = Vec::new();
            for tick in 0..64u64 {
                let seq = h.seq;
                for k in 0..8u16 {
                    let now = tick * 1000 + u64::from(k + 1) * 125;
                    h.scan((k, 8), &allocated, &records, now);
                }
                if h.seq != seq {
                    calls.push(tick);
                }
                if promoted.contains(&tick) {
                    h.promoted((tick + 1) * 1000);
                }
            }
            assert_eq!(calls, want, "{name}");
        }
        // Up to 60 s: 1, 2, 4 ... 32 s, then 60 s.
        let mut h = HintScanner::new(n, mb, 4096, 1000, true);
        h.scan((7, 8), &allocated, &records, 1000);
        let mut periods = Vec::new();
        for i in 1..9 {
            h.seq = i;
            h.promoted(0);
            periods.push(h.period.map_or(0, |p| p.now / 1000));
        }
        assert_eq!(periods, vec![2, 4, 8, 16, 32, 60, 60, 60]);
        // The limits: 1 s / windows, at least 100 ms (2560 MB/s of 256 MB calls); 60 s /
        // windows.
        let h = HintScanner::new(1 << 20, 256, 4096, 1000, true);
        let p = |pop| h.first_period(pop, 0);
        assert_eq!((p(1).now, p(1).max), (1000, 60_000));
        assert_eq!((p(3 << 16).now, p(3 << 16).max), (333, 20_000));
        assert_eq!((p(1 << 20).now, p(1 << 20).max), (100, 3750));
        let h = HintScanner::new(1, 256, 4096, 500, true);
        assert_eq!(
            h.first_period(1, 7),
            ScanPeriod {
                now: 2000,
                max: 120_000,
                next: 7
            }
        );
    }

    /// Records the hint faults it is given (tick, granule, latency); never moves anything.
    struct FaultLog(std::sync::Arc<std::sync::Mutex<Vec<(u64, u32, u32)>>>);

    impl PlacementPolicy for FaultLog {
        fn name(&self) -> &'static str {
            "fault-log"
        }

        fn source(&self) -> TrackingSource {
            TrackingSource::HintFaults
        }

        fn plan(&mut self, input: &PolicyInput<'_>) -> Plan {
            let mut log = self.0.lock().expect("log");
            for f in input.hint_faults {
                log.push((input.tick, f.granule.0, f.latency_millitick));
            }
            Plan::default()
        }
    }

    #[test]
    fn a_hint_fault_latency_counts_from_the_scan_that_unmapped_the_page() -> Result<(), Error> {
        // Four slow pages, ticks of 80 accesses. Page 0 is touched all the time, page 1 only
        // in ticks 0 and 3, page 2 in ticks 0 and 1. The scanner first runs at the end of
        // tick 0, then at the end of every tick.
        let mut t = Trace::new(12, 4);
        for pages in [&[0, 1, 2, 3][..], &[0, 2], &[0], &[0, 1]] {
            for i in 0..80 {
                t.push(pages[i % pages.len()], false);
            }
        }
        let c = Config {
            tick_accesses: 80,
            initial: Initial::Slow,
            heatmap_rows: 0,
            ..Config::default()
        };
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        run(
            &t,
            &mut Planner::Policy(Box::new(FaultLog(log.clone()))),
            &c,
        )?;
        // (tick, granule, latency in thousandths of a tick): page 1, unmapped at the end of
        // tick 0 and left alone since, faults in tick 3 two ticks late (no timer reset).
        let want = vec![(1, 0, 0), (1, 2, 12), (2, 0, 0), (3, 0, 0), (3, 1, 2012)];
        assert_eq!(*log.lock().expect("log"), want);
        Ok(())
    }

    /// A trace over `pages` pages: per epoch, its length and the pages it cycles through;
    /// `phase` = (access index, id) of one ordinary marker.
    fn epoch_trace(pages: u32, epochs: &[(usize, &[u32])], phase: Option<(usize, u64)>) -> Trace {
        let mut t = Trace::new(12, pages);
        for &(len, cycle) in epochs {
            t.mark(crate::trace::EPOCH_MARKER);
            for i in 0..len {
                if phase.is_some_and(|(at, _)| at == t.accesses.len()) {
                    t.mark(phase.map_or(0, |p| p.1));
                }
                t.push(cycle[i % cycle.len()], false);
            }
        }
        t
    }

    #[test]
    fn hindsight_follows_the_past_window_and_the_oracle_the_next() -> Result<(), Error> {
        // Two pages hot for two epochs, then two others for two: room for two pages, moves
        // for a swap of both. The oracle has each epoch's pages in DRAM before it starts;
        // hindsight (the window just past, seen exactly) one epoch late, at the change.
        let t = epoch_trace(
            8,
            &[
                (100, &[0, 1]),
                (100, &[0, 1]),
                (100, &[2, 3]),
                (100, &[2, 3]),
            ],
            None,
        );
        let c = Config {
            fast_permille: 500,
            move_permille: 2000,
            initial: Initial::Slow,
            ..cfg()
        };
        // (planner, hit ratio per epoch)
        let cases = [
            ("oracle", [0.0, 1.0, 1.0, 1.0]),
            ("hindsight", [0.0, 1.0, 0.0, 1.0]),
        ];
        for (name, want) in cases {
            let r = run(&t, &mut Planner::by_name(name, &c)?, &c)?;
            assert_eq!(r.series, want, "{name}");
            assert_eq!(r.plan_violations, 0, "{name}");
        }
        Ok(())
    }

    #[test]
    fn tick_bounds_table() {
        let epochs = epoch_trace(8, &[(100, &[0]), (700, &[1]), (200, &[2])], Some((850, 5)));
        let plain = small(Kind::Zipf);
        let fixed = Config {
            epoch_ticks: false,
            tick_accesses: 300,
            ..cfg()
        };
        // (trace, config, bounds)
        let cases: Vec<(&Trace, Config, Vec<u64>)> = vec![
            (&epochs, cfg(), vec![0, 100, 800, 1000]),
            (&epochs, fixed.clone(), vec![0, 300, 600, 900, 1000]),
            (
                &plain,
                cfg(),
                (0..=12).map(|t| t * 10_000).collect::<Vec<u64>>(),
            ),
            (
                &plain,
                fixed,
                (0..400).map(|t| t * 300).chain([120_000]).collect(),
            ),
        ];
        for (t, c, want) in cases {
            assert_eq!(tick_bounds(t, &c), want);
        }
    }

    #[test]
    fn an_epoch_trace_runs_one_tick_per_epoch() -> Result<(), Error> {
        // Epochs of unequal length, each on its own pages; a phase marker inside the third.
        let t = epoch_trace(
            64,
            &[
                (100, &[0, 1, 2]),
                (700, &[10, 11, 12, 13]),
                (200, &[20, 21]),
            ],
            Some((850, 5)),
        );
        // (config, ticks, phase marker ticks)
        let cases = [
            (cfg(), 3, vec![2]),
            (
                Config {
                    epoch_ticks: false,
                    tick_accesses: 100,
                    ..cfg()
                },
                10,
                vec![8],
            ),
        ];
        for (c, ticks, markers) in cases {
            for name in ["oracle", "default", "numab", "damos"] {
                let shipped = Config {
                    source: Some(SourceName::Damon),
                    ..c.clone()
                };
                let r = run(&t, &mut Planner::by_name(name, &shipped)?, &shipped)?;
                assert_eq!((r.ticks, r.series.len() as u64), (ticks, ticks), "{name}");
                assert_eq!(r.marker_ticks, markers, "{name}");
                assert_eq!(r.accesses, 1000, "{name}");
            }
        }
        // The oracle plans for the next epoch whole: with room for 4 of the 9 pages and twice
        // as many moves (a swap is two), each epoch's pages are in DRAM before it starts (planned from the
        // trace's first 10 000 accesses, `tick_accesses`, it would see nothing ahead).
        let c = Config {
            fast_permille: 500,
            move_permille: 2000,
            ..cfg()
        };
        let o = run(&t, &mut Planner::Oracle, &c)?;
        assert!(o.series[1] > 0.99 && o.series[2] > 0.99, "{:?}", o.series);
        Ok(())
    }

    #[test]
    fn hint_fault_latencies_count_in_epochs() -> Result<(), Error> {
        // Epoch 0 (80 accesses) touches pages 0..4, epoch 1 (400) page 0, epoch 2 (40) pages
        // 0 and 1. The scanner unmaps every slow page at the end of epoch 0 and page 0 again
        // at the end of epoch 1; page 1 faults one access into epoch 2: one epoch and 1/40.
        let t = epoch_trace(4, &[(80, &[0, 1, 2, 3]), (400, &[0]), (40, &[0, 1])], None);
        let c = Config {
            initial: Initial::Slow,
            heatmap_rows: 0,
            ..Config::default()
        };
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        run(
            &t,
            &mut Planner::Policy(Box::new(FaultLog(log.clone()))),
            &c,
        )?;
        assert_eq!(
            *log.lock().expect("log"),
            vec![(1, 0, 0), (2, 0, 0), (2, 1, 1025)]
        );
        Ok(())
    }

    #[test]
    fn outside_table() {
        // (case, start, end, ranges, parts outside them)
        let cases: Vec<(&str, u32, u32, Vec<(u32, u32)>, Vec<(u32, u32)>)> = vec![
            ("no ranges", 0, 10, vec![], vec![(0, 10)]),
            ("disjoint", 0, 10, vec![(20, 30)], vec![(0, 10)]),
            ("covered", 4, 8, vec![(0, 10)], vec![]),
            (
                "cut in the middle",
                0,
                10,
                vec![(3, 5)],
                vec![(0, 3), (5, 10)],
            ),
            (
                "two cuts",
                0,
                10,
                vec![(0, 2), (4, 6)],
                vec![(2, 4), (6, 10)],
            ),
            ("range ends inside", 5, 10, vec![(0, 7)], vec![(7, 10)]),
        ];
        for (name, s, e, ranges, want) in cases {
            assert_eq!(outside(s, e, &ranges), want, "{name}");
        }
    }

    #[test]
    fn zoom_is_sim_only_and_leaves_the_shipped_row_alone() -> Result<(), Error> {
        let t = small(Kind::Zipf);
        let shipped = Config {
            source: Some(SourceName::Damon),
            ..cfg()
        };
        let zoomed = Config {
            zoom_bytes: 2 << 20,
            ..shipped.clone()
        };
        let a = run(&t, &mut Planner::by_name("default", &shipped)?, &shipped)?;
        let b = run(&t, &mut Planner::by_name("default", &zoomed)?, &zoomed)?;
        assert_eq!(a.zoom_regions_per_sample, 0.0);
        assert!(b.zoom_regions_per_sample > 0.0 && b.zoom_bytes_mean <= f64::from(2u32 << 20));
        assert!(a.damon_regions_per_sample > 0.0);
        assert_eq!(b.plan_violations, 0);
        let bad = Config {
            granule_pages_log2: 9,
            ..zoomed
        };
        assert!(matches!(
            run(&t, &mut Planner::Oracle, &bad),
            Err(Error::Config(_))
        ));
        Ok(())
    }
}
