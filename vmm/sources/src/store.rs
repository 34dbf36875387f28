//! The hotness store: per-granule [`HeatRecord`]s built from [`RegionAccess`] reports.
//!
//! The store sees a VM's RAM the way a policy does: an array of equally sized granules
//! (4 KiB ..= 2 MiB, a power of two) indexed in guest-physical order over the layout's
//! ranges. Granule boundaries fall on **host virtual** multiples of the granule size, so that
//! a 2 MiB granule is exactly one transparent huge page of the VMM process (QEMU's RAM above
//! 1 MiB starts 1 MiB into a huge page; granules counted from the range start would straddle
//! two huge pages, and migrating one would drag half of each neighbour along). A range that
//! does not start or end on such a boundary has a partial first or last granule; a granule
//! never spans two ranges.
//!
//! # Heat
//!
//! The rule is [`HeatRecord::cooled`]/[`HeatRecord::observed`] with
//! [`HeatRecord::heat_gain`], the one the trace simulator evaluates policies with: each tick
//! ([`HotnessStore::tick`]) every granule's heat halves and its move age advances; then the
//! tick's reports are folded in ([`HotnessStore::observe`]): a report that found its range
//! accessed in `hits` of `samples` checks adds `heat_gain(hits, samples)` (0..=16, one
//! rounding step, logarithmic in the fraction). A granule seen hot tick after tick climbs
//! to 31; a one-off pass (a scan, a checksum sweep) fades in a few ticks. A granule that
//! several reports cover (a 2 MiB granule over DAMON regions of a few hundred KiB) gains
//! once, from their access fractions' mean weighted by the bytes each covers: its own access
//! density. Granules no report covers only cool.
//!
//! # Hybrid tracking
//!
//! With 2 MiB granules and [`StoreConfig::detail_percent`] above 0, a granule (a *region*)
//! whose heat is mixed in a tick ([`hybrid::RegionSeen::mixed`]: two reports of very different
//! heat cut it, or a report covers only part of it) is *split*: it gets one more record per
//! 4 KiB page, observed like a 4 KiB store's, while its own record goes on as before (the
//! policy plans over regions). A region's record gains its hottest report's gain — a split
//! region's promotion moves only its hot pages, and a resident region is not demoted for a
//! cooler part — except a whole region on the slow tier, which would move whole and gains the
//! byte-weighted mean, like a 2 MiB store's granule. At most `detail_percent` % of the regions
//! are split at a time; a mixed region beyond the cap stays whole (counted in
//! [`DetailStats::refused`]). A split
//! region whose pages are uniform again ([`hybrid::uniform`]) is merged at the next tick.
//! Moves of split regions take only some of their pages ([`hybrid::Step`],
//! [`HotnessStore::pages_of`]); a split region is in the fast tier if any of its pages is, and
//! charges only those pages ([`HotnessStore::tier_bytes`], [`HotnessStore::plan_budget`]).
//!
//! # Memory
//!
//! One [`HeatRecord`] byte per granule plus a few dozen bytes per RAM range: **1 byte per
//! 4 KiB page** with 4 KiB granules, **1/512 byte per 4 KiB page** with 2 MiB granules
//! ([`HotnessStore::memory_bytes`] reports the exact figure). No per-report state is kept.
//! Hybrid tracking adds 4 bytes per region (the detail index) and 512 bytes per split region:
//! with `detail_percent = 20` at most about 0.21 byte per 4 KiB page
//! ([`hybrid::bytes_per_page`]).

use vmtier_core::hybrid::{self, Census, Fitted, PromoteCost, RegionSeen, Step};
use vmtier_core::policy::{Enforced, Granule, HeatRecord, Tier};
use vmtier_core::{GranuleSize, GuestMemoryLayout, GuestPhysAddr, HostVirtAddr, RegionAccess};

/// Error building a store.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The layout has more granules than a [`Granule`] can index.
    #[error("Too many granules for one VM")]
    TooManyGranules,
    /// Hybrid tracking needs 2 MiB granules.
    #[error("Hybrid tracking needs 2 MiB granules")]
    HybridNeedsHugeGranules,
}

/// Number of buckets of [`Histogram`].
pub const HISTOGRAM_BUCKETS: usize = 8;

/// Granule counts per heat bucket (bucket `i` holds heat `4i ..= 4i+3`), per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Granules in the fast tier, coldest bucket first.
    pub fast: [u64; HISTOGRAM_BUCKETS],
    /// Granules in the slow tier, coldest bucket first.
    pub slow: [u64; HISTOGRAM_BUCKETS],
}

/// Bytes of guest RAM in each tier, as the store believes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierBytes {
    /// Bytes in the fast tier.
    pub fast: u64,
    /// Bytes in the slow tier.
    pub slow: u64,
}

/// The reports covering one granule so far in a tick ([`HotnessStore::observe`]).
#[derive(Debug, Default)]
struct Cover {
    granule: usize,
    /// Bytes covered.
    bytes: u64,
    /// Sum of each report's access fraction times the bytes it covers.
    weighted: f64,
    /// Hits of the covering reports.
    hits: u32,
}

impl Cover {
    fn new(granule: usize) -> Self {
        Self {
            granule,
            bytes: 0,
            weighted: 0.0,
            hits: 0,
        }
    }

    fn add(&mut self, bytes: u64, fraction: f64, hits: u32) {
        self.bytes = self.bytes.saturating_add(bytes);
        #[allow(clippy::cast_precision_loss)]
        let b = bytes as f64;
        self.weighted += fraction * b;
        self.hits = self.hits.saturating_add(hits);
    }

    /// Adds the gain of the covering reports' byte-weighted mean fraction.
    fn apply(self, records: &mut [HeatRecord]) {
        if self.bytes == 0 {
            return;
        }
        #[allow(clippy::cast_precision_loss)]
        let fraction = self.weighted / self.bytes as f64;
        if let Some(r) = records.get_mut(self.granule) {
            *r = r.observed(HeatRecord::heat_gain_of(fraction, self.hits));
        }
    }
}

/// The fraction of a report's samples that found its range accessed; `None` without samples
/// (such a report carries no evidence: it covers, it does not count).
fn access_fraction(a: &RegionAccess) -> Option<f64> {
    (a.samples > 0).then(|| f64::from(a.hits.min(a.samples)) / f64::from(a.samples))
}

/// One RAM range as the store indexes it.
#[derive(Clone, Copy, Debug)]
struct Span {
    gpa: u64,
    hva: u64,
    len: u64,
    /// `hva` modulo the granule size: how far into its first granule the range starts.
    lead: u64,
    first: u32,
    count: u32,
}

impl Span {
    /// The granule-aligned host address at or below `hva`.
    fn base(&self) -> u64 {
        self.hva - self.lead
    }

    /// Host bytes `[lo, hi)` of the span's `k`-th granule.
    fn granule(&self, k: u32, shift: u32) -> (u64, u64) {
        let start = self.base() + (u64::from(k) << shift);
        let lo = start.max(self.hva);
        let hi = (start + (1u64 << shift)).min(self.hva + self.len);
        (lo, hi)
    }
}

/// Calls `f` with the index of every granule of `spans` (granules of `1 << shift` bytes) that
/// `runs` (`(start, len)` in host virtual addresses) cover in part; a granule once per run
/// that covers it.
fn granules_of_runs(
    spans: &[Span],
    shift: u32,
    runs: &[(HostVirtAddr, u64)],
    mut f: impl FnMut(usize),
) {
    for &(start, len) in runs {
        let Some(end) = start.raw().checked_add(len) else {
            continue;
        };
        for s in spans {
            // Layout construction checked hva + len fits.
            let lo = start.raw().max(s.hva);
            let hi = end.min(s.hva + s.len);
            if lo >= hi {
                continue;
            }
            let g0 = (lo - s.base()) >> shift;
            let g1 = (hi - 1 - s.base()) >> shift;
            for k in g0..=g1 {
                f(usize::try_from(u64::from(s.first) + k).unwrap_or(usize::MAX));
            }
        }
    }
}

/// Where one granule lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GranuleSpan {
    /// First guest physical address.
    pub gpa: GuestPhysAddr,
    /// Host virtual address backing `gpa`.
    pub hva: HostVirtAddr,
    /// Bytes (the granule size, less for a range's last partial granule).
    pub len: u64,
}

/// A tick's budget for planning ([`HotnessStore::plan_budget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanBudget {
    /// How hot a page of a split region must be to move with it.
    pub hot_min: u8,
    /// The policy's fast-tier budget, in granules.
    pub granules: u64,
}

/// Store tuning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The placement granule. Default 4 KiB.
    pub granule: GranuleSize,
    /// Hybrid tracking (2 MiB granules only): the most regions, in percent of all, that keep
    /// 4 KiB detail; 0 = off. Default 0.
    pub detail_percent: u8,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            granule: GranuleSize::BASE,
            detail_percent: 0,
        }
    }
}

/// Hybrid tracking's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetailStats {
    /// Regions split now.
    pub split: u64,
    /// The most regions that may be split at a time.
    pub cap: u64,
    /// Splits so far.
    pub splits: u64,
    /// Merges so far.
    pub merges: u64,
    /// Mixed regions left whole because the cap was reached, counted once per tick each.
    pub refused: u64,
}

/// The 4 KiB detail of split regions.
#[derive(Debug, Default)]
struct Detail {
    /// Per region: its slot, or [`NO_SLOT`].
    slot_of: Vec<u32>,
    /// Per slot: its region, or [`NO_SLOT`] when free.
    owner: Vec<u32>,
    /// [`REGION_PAGES`] records per slot.
    pages: Vec<HeatRecord>,
    /// Per slot: its pages in the fast tier (kept with every tier change).
    fast: Vec<u16>,
    free: Vec<u32>,
    /// One bit per region: a PMD-mapped huge page maps (part of) it, as last told by
    /// [`HotnessStore::set_huge`]. `move_pages(2)` moves such a page whole whatever base page
    /// it is given, so these regions are never split.
    huge: Vec<u64>,
    stats: DetailStats,
}

const NO_SLOT: u32 = u32::MAX;
const REGION_PAGES: usize = 512;
const _: () = assert!(REGION_PAGES as u64 == hybrid::REGION_PAGES);

impl Detail {
    fn is_huge(&self, region: usize) -> bool {
        self.huge
            .get(region / 64)
            .is_some_and(|w| w & (1 << (region % 64)) != 0)
    }

    fn slot(&self, region: usize) -> Option<usize> {
        match self.slot_of.get(region) {
            Some(&s) if s != NO_SLOT => Some(s as usize),
            _ => None,
        }
    }

    fn pages(&self, slot: usize) -> &[HeatRecord] {
        &self.pages[slot * REGION_PAGES..(slot + 1) * REGION_PAGES]
    }

    fn pages_mut(&mut self, slot: usize) -> &mut [HeatRecord] {
        &mut self.pages[slot * REGION_PAGES..(slot + 1) * REGION_PAGES]
    }

    /// Splits `region` with every page a copy of `record`; `None` at the cap.
    fn split(&mut self, region: usize, record: HeatRecord) -> Option<usize> {
        if self.stats.split >= self.stats.cap {
            self.stats.refused += 1;
            return None;
        }
        let slot = match self.free.pop() {
            Some(s) => s as usize,
            None => {
                let s = self.owner.len();
                self.owner.reserve_exact(1);
                self.owner.push(NO_SLOT);
                self.fast.reserve_exact(1);
                self.fast.push(0);
                // Grow by one region at a time: the cap bounds the memory, not a doubling.
                self.pages.reserve_exact(REGION_PAGES);
                self.pages
                    .resize(self.pages.len() + REGION_PAGES, HeatRecord::default());
                s
            }
        };
        // Regions and slots are indexed by u32 (Granule); the store checked the count.
        self.owner[slot] = u32::try_from(region).unwrap_or(NO_SLOT);
        self.slot_of[region] = u32::try_from(slot).unwrap_or(NO_SLOT);
        self.pages_mut(slot).fill(record);
        self.recount(slot);
        self.stats.split += 1;
        self.stats.splits += 1;
        Some(slot)
    }

    /// Recounts a slot's fast pages after its tiers changed.
    fn recount(&mut self, slot: usize) {
        let n = self.pages(slot).iter().filter(|p| p.is_fast()).count();
        self.fast[slot] = u16::try_from(n).unwrap_or(u16::MAX);
    }

    fn merge(&mut self, slot: usize) {
        let region = self.owner[slot] as usize;
        self.slot_of[region] = NO_SLOT;
        self.owner[slot] = NO_SLOT;
        self.free.push(u32::try_from(slot).unwrap_or(NO_SLOT));
        self.stats.split -= 1;
        self.stats.merges += 1;
    }
}

/// What the reports of one tick did to one region so far (reports come in address order).
#[derive(Debug, Default)]
struct Seen {
    region: usize,
    /// The region's host bytes `[lo, hi)`.
    lo: u64,
    hi: u64,
    seen: RegionSeen,
    covered: u64,
    /// `(first page, end page, gain)` per report piece.
    pieces: Vec<(usize, usize, u8)>,
    /// The pieces' access fractions, for the record of a region that stays whole.
    cover: Cover,
}

impl Seen {
    /// Whether the region splits unless a huge page maps it: a whole region (not one cut
    /// short by the end of a RAM range) seen mixed.
    fn splits(&self, granule_bytes: u64) -> bool {
        self.hi - self.lo == granule_bytes && self.seen.mixed()
    }
}

/// Hybrid tracking's walk of a tick's `reports` (in address order) over the regions of
/// `spans`: `f` gets each region they touch, once, with what they saw of it (with
/// `pieces`, also each report's piece of it and access fraction, for the fold; without, only
/// the regions a report starts or ends in, as one report covering a region whole cannot make
/// it mixed: a few per report rather than every region). Returns the bytes of the reports
/// outside guest RAM.
fn walk_regions(
    spans: &[Span],
    shift: u32,
    reports: &[RegionAccess],
    pieces: bool,
    mut f: impl FnMut(Seen),
) -> u64 {
    let mut done = |mut c: Seen| {
        c.seen.covered = c.covered >= c.hi - c.lo;
        f(c);
    };
    let mut outside = 0u64;
    let mut cur: Option<Seen> = None;
    for a in reports {
        let Some(end) = a.end().map(HostVirtAddr::raw) else {
            outside = outside.saturating_add(a.len);
            continue;
        };
        let gain = HeatRecord::heat_gain(a.hits, a.samples);
        let full = HeatRecord::heat_gain(a.samples, a.samples);
        let mut covered = 0u64;
        for s in spans {
            let lo = a.start.raw().max(s.hva);
            let hi = end.min(s.hva + s.len);
            if lo >= hi {
                continue;
            }
            covered = covered.saturating_add(hi - lo);
            let g0 = u32::try_from((lo - s.base()) >> shift).unwrap_or(u32::MAX);
            let g1 = u32::try_from((hi - 1 - s.base()) >> shift).unwrap_or(0);
            let mut k = g0;
            loop {
                let region = s.first as usize + k as usize;
                let (rlo, rhi) = s.granule(k, shift);
                if cur.as_ref().is_some_and(|c| c.region != region) {
                    if let Some(c) = cur.take() {
                        done(c);
                    }
                }
                let c = cur.get_or_insert_with(|| Seen {
                    region,
                    lo: rlo,
                    hi: rhi,
                    seen: RegionSeen {
                        min_gain: u8::MAX,
                        ..RegionSeen::default()
                    },
                    cover: Cover::new(region),
                    ..Seen::default()
                });
                let (plo, phi) = (lo.max(rlo), hi.min(rhi));
                c.covered += phi - plo;
                c.seen.min_gain = c.seen.min_gain.min(gain);
                c.seen.max_gain = c.seen.max_gain.max(gain);
                c.seen.full_gain = c.seen.full_gain.max(full);
                if pieces {
                    if let Some(fraction) = access_fraction(a) {
                        c.cover.add(phi - plo, fraction, a.hits.min(a.samples));
                    }
                    // Pages are 4 KiB from the region's start (regions start on 2 MiB).
                    let first = usize::try_from((plo - rlo) / 4096).unwrap_or(0);
                    let last = usize::try_from((phi - rlo).div_ceil(4096)).unwrap_or(0);
                    c.pieces.push((first, last, gain));
                }
                if k >= g1 {
                    break;
                }
                k = if pieces { k + 1 } else { g1 };
            }
        }
        outside = outside.saturating_add(a.len.saturating_sub(covered));
    }
    if let Some(c) = cur.take() {
        done(c);
    }
    outside
}

/// Per-granule heat, tier and move age of one VM's RAM. See the module docs.
#[derive(Debug)]
pub struct HotnessStore {
    granule_bytes: u64,
    shift: u32,
    spans: Vec<Span>,
    records: Vec<HeatRecord>,
    detail: Option<Detail>,
}

/// `ceil(a / 2^s)` without overflow.
fn div_ceil_pow2(a: u64, s: u32) -> u64 {
    (a >> s) + u64::from(a & ((1u64 << s) - 1) != 0)
}

impl HotnessStore {
    /// Builds a store for `layout`: every granule cold, slow tier, never moved.
    pub fn new(layout: &GuestMemoryLayout, config: StoreConfig) -> Result<Self, Error> {
        let g = config.granule.bytes();
        let shift = config.granule.shift();
        let mut spans = Vec::with_capacity(layout.ranges.len());
        let mut next: u32 = 0;
        // GuestMemoryLayout keeps its ranges sorted by guest physical address.
        for r in &layout.ranges {
            let lead = r.hva.raw() & (g - 1);
            // The layout checked that hva + len fits in 64 bits; lead < g.
            let count = u32::try_from(div_ceil_pow2(lead + r.len, shift))
                .map_err(|_| Error::TooManyGranules)?;
            spans.push(Span {
                gpa: r.gpa.0,
                hva: r.hva.raw(),
                len: r.len,
                lead,
                first: next,
                count,
            });
            next = next.checked_add(count).ok_or(Error::TooManyGranules)?;
        }
        let n = usize::try_from(next).map_err(|_| Error::TooManyGranules)?;
        let detail = if config.detail_percent == 0 {
            None
        } else if config.granule != GranuleSize::HUGE {
            return Err(Error::HybridNeedsHugeGranules);
        } else {
            let cap = u64::from(next) * u64::from(config.detail_percent.min(100)) / 100;
            Some(Detail {
                slot_of: vec![NO_SLOT; n],
                huge: vec![0; n.div_ceil(64)],
                stats: DetailStats {
                    cap,
                    ..DetailStats::default()
                },
                ..Detail::default()
            })
        };
        Ok(Self {
            granule_bytes: g,
            shift,
            spans,
            records: vec![HeatRecord::default(); n],
            detail,
        })
    }

    /// Bytes per granule.
    pub fn granule_bytes(&self) -> u64 {
        self.granule_bytes
    }

    /// One record per granule, in guest-physical order: the policy input's `records`.
    pub fn records(&self) -> &[HeatRecord] {
        &self.records
    }

    /// Number of granules.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the store has no granules.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes the store occupies on the heap (records, range index, hybrid detail).
    pub fn memory_bytes(&self) -> u64 {
        let spans = self.spans.capacity() * std::mem::size_of::<Span>();
        let recs = self.records.capacity() * std::mem::size_of::<HeatRecord>();
        let detail = self.detail.as_ref().map_or(0, |d| {
            (d.slot_of.capacity() + d.owner.capacity() + d.free.capacity()) * 4
                + d.fast.capacity() * 2
                + d.huge.capacity() * 8
                + d.pages.capacity()
        });
        (spans + recs + detail) as u64
    }

    /// [`Self::memory_bytes`] divided by the number of 4 KiB pages of guest RAM.
    #[allow(clippy::cast_precision_loss)]
    pub fn bytes_per_4k_page(&self) -> f64 {
        let pages: u64 = self.spans.iter().map(|s| s.len / 4096).sum();
        if pages == 0 {
            return 0.0;
        }
        self.memory_bytes() as f64 / pages as f64
    }

    /// Advances one tick: heat halves, move ages advance; split regions that are uniform
    /// again merge. Call before [`Self::observe`].
    pub fn tick(&mut self) {
        for r in &mut self.records {
            *r = r.cooled().aged();
        }
        let Some(d) = self.detail.as_mut() else {
            return;
        };
        for slot in 0..d.owner.len() {
            if d.owner[slot] == NO_SLOT {
                continue;
            }
            let pages = d.pages_mut(slot);
            for p in pages.iter_mut() {
                *p = p.cooled().aged();
            }
            if hybrid::uniform(pages) {
                let tier = pages[0].tier();
                let region = d.owner[slot] as usize;
                self.records[region] = self.records[region].placed_on(tier);
                d.merge(slot);
            }
        }
    }

    /// Whether hybrid tracking is on.
    pub fn is_hybrid(&self) -> bool {
        self.detail.is_some()
    }

    /// Hybrid tracking's counters (zero without it).
    pub fn detail_stats(&self) -> DetailStats {
        self.detail
            .as_ref()
            .map_or_else(DetailStats::default, |d| d.stats)
    }

    /// Hybrid tracking: what a read of the ranges `read` found, `runs` the parts of them
    /// PMD-mapped huge pages map, both as `(start, len)` in host virtual addresses (whole
    /// regions; a region either touches in part counts). `move_pages(2)` moves such a page
    /// whole whatever base page it is given, so a region a run touches is not split from now
    /// on, and one split before (khugepaged collapsed it since) is merged; a region read
    /// without a run may split again. Regions outside `read` keep what an earlier read said.
    /// Returns the merged regions: each is recorded on the tier most of its pages were on,
    /// which the caller should confirm (a huge page is on one node). Nothing without hybrid
    /// tracking.
    pub fn set_huge(
        &mut self,
        read: &[(HostVirtAddr, u64)],
        runs: &[(HostVirtAddr, u64)],
    ) -> Vec<Granule> {
        let Some(d) = self.detail.as_mut() else {
            return Vec::new();
        };
        for (ranges, on) in [(read, false), (runs, true)] {
            granules_of_runs(&self.spans, self.shift, ranges, |r| {
                if let Some(w) = d.huge.get_mut(r / 64) {
                    if on {
                        *w |= 1 << (r % 64);
                    } else {
                        *w &= !(1 << (r % 64));
                    }
                }
            });
        }
        let mut merged = Vec::new();
        for slot in 0..d.owner.len() {
            let region = d.owner[slot];
            if region == NO_SLOT || !d.is_huge(region as usize) {
                continue;
            }
            let tier = if usize::from(d.fast[slot]) * 2 >= REGION_PAGES {
                Tier::Fast
            } else {
                Tier::Slow
            };
            let r = &mut self.records[region as usize];
            *r = r.placed_on(tier);
            d.merge(slot);
            merged.push(Granule(region));
        }
        merged
    }

    /// The granules any of `runs` (`(start, len)` in host virtual addresses: what PMD-mapped
    /// huge pages map) covers in part, sorted and without repeats, into `out` (cleared first):
    /// what [`PolicyInput::huge`] takes.
    ///
    /// [`PolicyInput::huge`]: vmtier_core::policy::PolicyInput::huge
    pub fn huge_granules(&self, runs: &[(HostVirtAddr, u64)], out: &mut Vec<u32>) {
        out.clear();
        granules_of_runs(&self.spans, self.shift, runs, |g| {
            out.extend(u32::try_from(g).ok());
        });
        out.sort_unstable();
        out.dedup();
    }

    /// The regions split to 4 KiB detail now, sorted, into `out` (cleared first; empty
    /// without hybrid tracking): what [`PolicyInput::split`] takes.
    ///
    /// [`PolicyInput::split`]: vmtier_core::policy::PolicyInput::split
    pub fn split_regions(&self, out: &mut Vec<u32>) {
        out.clear();
        if let Some(d) = self.detail.as_ref() {
            out.extend(d.owner.iter().copied().filter(|&r| r != NO_SLOT));
            out.sort_unstable();
        }
    }

    /// The 4 KiB records of a split region (hybrid tracking), `None` for a whole one.
    pub fn detail(&self, granule: Granule) -> Option<&[HeatRecord]> {
        let d = self.detail.as_ref()?;
        Some(d.pages(d.slot(granule.index())?))
    }

    /// Whether the `page`-th 4 KiB page of `granule` is in the fast tier (its detail record
    /// if the region is split, else the granule's).
    pub fn page_is_fast(&self, granule: Granule, page: usize) -> bool {
        match self.detail(granule) {
            Some(p) => p.get(page).is_some_and(|r| r.is_fast()),
            None => self
                .records
                .get(granule.index())
                .is_some_and(|r| r.is_fast()),
        }
    }

    /// The fast-tier budget the policy gets for `budget_bytes` of DRAM, and how hot a page of
    /// a split region must be to move with it, in one pass over the store.
    ///
    /// Without hybrid tracking: the whole granules that fit, and `hot_floor`. With it: `hot_min`
    /// is `hot_floor` or the heat the hottest `budget_bytes` of the VM reach if higher
    /// ([`hybrid::page_cutoff`]), and the budget is [`hybrid::policy_budget`]'s (a split region
    /// costs its pages in DRAM and those a promotion with `hot_min` would take).
    pub fn plan_budget(&self, budget_bytes: u64, hot_floor: u8) -> PlanBudget {
        if self.detail.is_none() {
            return PlanBudget {
                hot_min: hot_floor,
                granules: budget_bytes / self.granule_bytes,
            };
        }
        const HEATS: usize = HeatRecord::MAX_HEAT as usize + 1;
        // Pages by heat; whole regions by heat: (regions, pages); split regions by heat:
        // how many, and their cost for every `hot_min` (not known before the pass ends).
        let mut pages: hybrid::PagesByHeat = [0; HEATS];
        let mut whole = [(0u64, 0u64); HEATS];
        let mut split = [0u64; HEATS];
        let mut split_cost = [[0u64; HEATS]; HEATS];
        self.for_each_region(|r, bytes, detail| {
            let h = usize::from(r.heat());
            let Some(detail) = detail else {
                pages[h] += bytes / 4096;
                whole[h].0 += 1;
                whole[h].1 += bytes / 4096;
                return;
            };
            let c = Census::of(detail);
            c.add_to(&mut pages);
            split[h] += 1;
            let fast = c.fast();
            for (cost, promote) in split_cost[h].iter_mut().zip(c.promote_by_hot_min()) {
                *cost += fast + u64::from(promote);
            }
        });
        let budget_pages = budget_bytes / 4096;
        let hot_min = hot_floor.max(hybrid::page_cutoff(&pages, budget_pages));
        let hm = usize::from(hot_min.min(HeatRecord::MAX_HEAT));
        let mut by_heat: hybrid::CostByHeat = [(0, 0); 2 * HEATS];
        for h in 0..HEATS {
            let heat = u8::try_from(h).unwrap_or(HeatRecord::MAX_HEAT);
            by_heat[hybrid::cost_slot(heat, false)] = whole[h];
            by_heat[hybrid::cost_slot(heat, true)] = (split[h], split_cost[h][hm]);
        }
        PlanBudget {
            hot_min,
            granules: hybrid::policy_budget(budget_pages, &by_heat),
        }
    }

    /// Pages of `granule` in the fast tier (a split region's from its kept count).
    pub fn fast_pages(&self, g: Granule) -> u64 {
        let slot = self
            .detail
            .as_ref()
            .and_then(|d| Some((d, d.slot(g.index())?)));
        match slot {
            Some((d, s)) => u64::from(d.fast[s]),
            None if self.records.get(g.index()).is_some_and(|r| r.is_fast()) => {
                self.span(g).map_or(0, |s| s.len / 4096)
            }
            None => 0,
        }
    }

    /// Every region in index order, one pass over the spans (no per-region lookup): its
    /// record, its bytes, and a split region's 4 KiB records.
    fn for_each_region(&self, mut f: impl FnMut(HeatRecord, u64, Option<&[HeatRecord]>)) {
        for s in &self.spans {
            let first = s.first as usize;
            let records = &self.records[first..first + s.count as usize];
            for (k, &r) in (0..s.count).zip(records) {
                let (lo, hi) = s.granule(k, self.shift);
                let i = first + k as usize;
                let pages = self.detail.as_ref().and_then(|d| Some(d.pages(d.slot(i)?)));
                f(r, hi - lo, pages);
            }
        }
    }

    /// Hybrid tracking: trims an enforced plan to `budget_bytes` of DRAM and `move_pages`
    /// pages moved ([`hybrid::fit`]); returns the pages it moves and the split regions
    /// promoted in part. Granules for which `held` is true (pinned in DRAM) count as used but
    /// are never forced out. Nothing without hybrid tracking.
    pub fn fit(
        &self,
        e: &mut Enforced,
        budget_bytes: u64,
        move_pages: u64,
        hot_min: u8,
        held: impl Fn(Granule) -> bool,
    ) -> Fitted {
        if self.detail.is_none() {
            return Fitted::default();
        }
        let used = self.tier_bytes().fast / 4096;
        // Only when over the budget: fast regions not held, coldest first.
        let forcible = || {
            let mut fast: Vec<(u8, Granule)> = self
                .records
                .iter()
                .enumerate()
                .filter(|(_, r)| r.is_fast())
                .map(|(i, r)| (r.heat(), Granule(u32::try_from(i).unwrap_or(u32::MAX))))
                .filter(|&(_, g)| !held(g))
                .collect();
            fast.sort_unstable();
            fast.into_iter()
                .map(|(_, g)| (g, self.fast_pages(g)))
                .collect()
        };
        let promote_cost = |g: Granule| match self.detail(g) {
            Some(pages) => PromoteCost::Split(Census::of(pages).promote_by_hot_min()),
            None => PromoteCost::Whole(self.span(g).map_or(0, |s| s.len / 4096)),
        };
        hybrid::fit(
            e,
            used,
            (budget_bytes / 4096, move_pages),
            hot_min,
            |g| self.fast_pages(g),
            forcible,
            promote_cost,
        )
    }

    /// The touch-up moves of split regions in the fast tier, with the pages each moves
    /// ([`hybrid::touch_ups`]).
    pub fn touch_ups(&self, hot_min: u8) -> Vec<(Granule, Step, u64)> {
        let Some(d) = self.detail.as_ref() else {
            return Vec::new();
        };
        let split = d
            .owner
            .iter()
            .enumerate()
            .filter(|&(slot, &r)| r != NO_SLOT && d.fast[slot] > 0)
            .map(|(slot, &r)| (r, d.pages(slot)));
        hybrid::touch_ups(split, hot_min)
            .into_iter()
            .map(|(r, s, n)| (Granule(r), s, n))
            .collect()
    }

    /// What to run of [`Self::touch_ups`] this tick, each with the `hot_min` its pages are
    /// picked with: at most `move_pages` pages, trims first, then promotions whose pages fit
    /// in the DRAM left under `budget_bytes` (counted before the trims, which may fail); a
    /// promotion whose pages do not all fit takes its hottest that do
    /// ([`hybrid::hottest_that_fit`]), and a trim bigger than the moves left its coldest
    /// ([`Census::trim_that_fits`]). Trims run only while pages waiting for DRAM — every
    /// page of a hot whole region on the slow tier, the slow pages at `hot_min` or more of
    /// split regions — exceed that room (or the fast tier is over the budget), and only until
    /// they would free the difference: a trim makes room, and without a page waiting for it,
    /// it moves a cold page out of DRAM the budget does not need, which comes back at its
    /// next access (docs/policies.md, "Trims only for wanted room").
    pub fn touch_up_plan(
        &self,
        hot_min: u8,
        budget_bytes: u64,
        move_pages: u64,
    ) -> Vec<(Granule, Step, u8)> {
        self.touch_up_plan_held(hot_min, budget_bytes, move_pages, |_, _| false)
    }

    /// [`Self::touch_up_plan`] without the touch-ups `held(region, step)` refuses: pinned
    /// regions (vmtierd's DRAM pins are never trimmed, its CXL pins never promoted).
    pub fn touch_up_plan_held(
        &self,
        hot_min: u8,
        budget_bytes: u64,
        move_pages: u64,
        held: impl Fn(Granule, Step) -> bool,
    ) -> Vec<(Granule, Step, u8)> {
        let mut left = move_pages;
        let fast = self.tier_bytes().fast;
        let mut room = budget_bytes.saturating_sub(fast) / 4096;
        let over = fast.saturating_sub(budget_bytes).div_ceil(4096);
        let mut ups = self.touch_ups(hot_min);
        ups.retain(|u| !held(u.0, u.1));
        // Pages that would take DRAM if they could: every page of a hot whole region on the
        // slow tier, then the hot slow pages of split regions (heat at least `hot_min`);
        // counted only as far as it matters (past the room left plus every trim, all run).
        let trims: u64 = ups.iter().filter(|u| u.1 == Step::Trim).map(|u| u.2).sum();
        let enough = room.saturating_add(trims);
        // A region cut short by the end of a RAM range counts as whole: a little more demand.
        let region_pages = self.granule_bytes / 4096;
        let mut wanted = 0u64;
        if trims > over {
            for (i, r) in self.records.iter().enumerate() {
                if wanted >= enough {
                    break;
                }
                let split = self.detail.as_ref().is_some_and(|d| d.slot(i).is_some());
                if !r.is_fast() && r.heat() >= hot_min.max(1) && !split {
                    wanted += region_pages;
                }
            }
            // A page is never hotter than its region's record (both cool alike, and a tick
            // adds the region its hottest report's gain), so colder regions are skipped.
            let hot = hot_min.max(1);
            if let Some(d) = self.detail.as_ref() {
                for (slot, &region) in d.owner.iter().enumerate() {
                    if wanted >= enough {
                        break;
                    }
                    let cold = !self
                        .records
                        .get(region as usize)
                        .is_some_and(|r| r.heat() >= hot);
                    if region == NO_SLOT || cold {
                        continue;
                    }
                    wanted += Census::of(d.pages(slot)).slow_from(hot);
                }
            }
        }
        let mut to_free = wanted.saturating_sub(room).saturating_add(over);
        let mut out = Vec::new();
        for (g, step, n) in ups {
            let mut hm = hot_min;
            let mut n = n;
            if step == Step::Promote && (n > left || n > room) {
                // Its hottest pages that fit, as `hybrid::fit` takes for the plan.
                let (Some(pages), true) = (self.detail(g), left.min(room) > 0) else {
                    continue;
                };
                let by = Census::of(pages).promote_by_hot_min();
                let Some(p) = hybrid::hottest_that_fit(&by, hot_min, |c| c <= left.min(room))
                else {
                    continue;
                };
                (hm, n) = p;
            } else if step == Step::Trim && n > left {
                // Its coldest pages that fit: a trim bigger than a tick's moves would never
                // run at all.
                let Some(p) = self
                    .detail(g)
                    .and_then(|pages| Census::of(pages).trim_that_fits(hot_min, left))
                else {
                    continue;
                };
                (hm, n) = p;
            } else if n > left {
                continue;
            }
            if step == Step::Trim {
                if to_free == 0 {
                    continue;
                }
                to_free = to_free.saturating_sub(n);
            }
            left -= n;
            if step == Step::Promote {
                room -= n;
            }
            out.push((g, step, hm));
        }
        out
    }

    /// The base pages a move of `granule` to `step`'s tier takes, appended to `out`: all of
    /// them, or for a split region those [`hybrid::select`] picks.
    pub fn pages_of(&self, granule: Granule, step: Step, hot_min: u8, out: &mut Vec<HostVirtAddr>) {
        let Some(span) = self.span(granule) else {
            return;
        };
        match self.detail(granule) {
            Some(pages) => out.extend(
                hybrid::select(pages, step, hot_min)
                    .map(|i| HostVirtAddr::new(span.hva.raw() + 4096 * i as u64)),
            ),
            None => out.extend(span.hva.base_pages(span.len)),
        }
    }

    /// Records that the page at `hva` of split region `granule` is on `tier` (`moved`: vmtier
    /// migrated it this tick). The region is in the fast tier while any page is. Ignored for a
    /// whole region or an address outside it.
    pub fn set_page_tier(&mut self, granule: Granule, hva: HostVirtAddr, tier: Tier, moved: bool) {
        self.set_page_tiers(granule, &[(hva, tier)], moved);
    }

    /// [`Self::set_page_tier`] for many pages of one region.
    pub fn set_page_tiers(
        &mut self,
        granule: Granule,
        tiers: &[(HostVirtAddr, Tier)],
        moved: bool,
    ) {
        let Some(span) = self.span(granule) else {
            return;
        };
        let Some(d) = self.detail.as_mut() else {
            return;
        };
        let Some(slot) = d.slot(granule.index()) else {
            return;
        };
        let pages = d.pages_mut(slot);
        for &(hva, tier) in tiers {
            let Some(off) = hva.raw().checked_sub(span.hva.raw()) else {
                continue;
            };
            let Some(p) = pages.get_mut(usize::try_from(off / 4096).unwrap_or(usize::MAX)) else {
                continue;
            };
            *p = if moved {
                p.moved_to(tier)
            } else {
                p.placed_on(tier)
            };
        }
        d.recount(slot);
        let fast = if d.fast[slot] > 0 {
            Tier::Fast
        } else {
            Tier::Slow
        };
        let r = &mut self.records[granule.index()];
        *r = if moved {
            r.moved_to(fast)
        } else {
            r.placed_on(fast)
        };
    }

    /// Applies a move of `granule` that took every page [`Self::pages_of`] named (the
    /// simulator's moves always succeed); returns the pages moved.
    pub fn apply(&mut self, granule: Granule, step: Step, hot_min: u8) -> u64 {
        let mut addrs = Vec::new();
        self.pages_of(granule, step, hot_min, &mut addrs);
        if self.detail(granule).is_none() {
            self.mark_moved(granule, step.target());
            return addrs.len() as u64;
        }
        let tiers: Vec<(HostVirtAddr, Tier)> = addrs.iter().map(|&a| (a, step.target())).collect();
        self.set_page_tiers(granule, &tiers, true);
        addrs.len() as u64
    }

    /// Folds reports into the records. Returns the bytes of the reports that fell outside
    /// guest RAM (ignored).
    pub fn observe(&mut self, reports: &[RegionAccess]) -> u64 {
        if self.detail.is_some() {
            return self.observe_hybrid(reports);
        }
        let mut outside = 0u64;
        // Reports come in address order, so the reports that cover a granule come one after
        // the other: their access fractions are summed, weighted by the bytes each covers,
        // and the granule gains once, from their mean. A 2 MiB granule over several DAMON
        // regions is seen at its own access density, not at its hottest region's, which
        // made any granule with a small region on one hot page look hot (docs/sources.md).
        let mut cur: Option<Cover> = None;
        for a in reports {
            let Some(end) = a.end().map(HostVirtAddr::raw) else {
                outside = outside.saturating_add(a.len);
                continue;
            };
            let hits = a.hits.min(a.samples);
            let fraction = access_fraction(a);
            let mut covered = 0u64;
            for s in &self.spans {
                // Layout construction checked hva + len fits.
                let s_end = s.hva + s.len;
                let lo = a.start.raw().max(s.hva);
                let hi = end.min(s_end);
                if lo >= hi {
                    continue;
                }
                covered = covered.saturating_add(hi - lo);
                // g0 <= g1 < s.count, so both fit in u32.
                let g0 = u32::try_from((lo - s.base()) >> self.shift).unwrap_or(u32::MAX);
                let g1 = u32::try_from((hi - 1 - s.base()) >> self.shift).unwrap_or(0);
                let first = s.first as usize;
                let Some(fraction) = fraction else { continue };
                for g in g0..=g1 {
                    let (glo, ghi) = s.granule(g, self.shift);
                    let bytes = hi.min(ghi).saturating_sub(lo.max(glo));
                    let i = first + g as usize;
                    match cur.as_mut() {
                        Some(c) if c.granule == i => c.add(bytes, fraction, hits),
                        _ => {
                            if let Some(done) = cur.take() {
                                done.apply(&mut self.records);
                            }
                            let mut c = Cover::new(i);
                            c.add(bytes, fraction, hits);
                            cur = Some(c);
                        }
                    }
                }
            }
            outside = outside.saturating_add(a.len.saturating_sub(covered));
        }
        if let Some(done) = cur {
            done.apply(&mut self.records);
        }
        outside
    }

    /// [`Self::observe`] with hybrid tracking: regions as 2 MiB granules, plus the detail of
    /// split regions, splitting the mixed ones.
    fn observe_hybrid(&mut self, reports: &[RegionAccess]) -> u64 {
        // The walk reads the spans, the fold writes records and detail.
        let spans = std::mem::take(&mut self.spans);
        let outside = walk_regions(&spans, self.shift, reports, true, |c| {
            self.finish_region(c);
        });
        self.spans = spans;
        outside
    }

    /// Hybrid tracking: the regions `reports` would split if no huge page mapped them (whole
    /// regions seen mixed, not split yet), sorted, into `out` (cleared first; empty without
    /// hybrid tracking). What maps them is worth reading before [`Self::observe`]: the
    /// store does not split a region [`Self::set_huge`] says a huge page maps.
    pub fn split_candidates(&self, reports: &[RegionAccess], out: &mut Vec<u32>) {
        out.clear();
        let Some(d) = self.detail.as_ref() else {
            return;
        };
        walk_regions(&self.spans, self.shift, reports, false, |c| {
            if d.slot(c.region).is_none() && c.splits(self.granule_bytes) {
                out.extend(u32::try_from(c.region).ok());
            }
        });
        out.sort_unstable();
        out.dedup();
    }

    /// Folds one region's pieces of this tick into its record and detail; splits it if it
    /// looked mixed.
    fn finish_region(&mut self, mut c: Seen) {
        let before = self.records[c.region];
        self.records[c.region] = before.observed(c.seen.max_gain);
        let Some(d) = self.detail.as_mut() else {
            return;
        };
        let slot = match d.slot(c.region) {
            Some(s) => Some(s),
            None if c.splits(self.granule_bytes) && !d.is_huge(c.region) => {
                d.split(c.region, before)
            }
            None => None,
        };
        let Some(slot) = slot else {
            // A whole region on the slow tier would move whole: it gains what its reports
            // see on average, as a 2 MiB store's granule does. In DRAM, or split, it keeps
            // its hottest report's gain (a split region's promotion moves only its hot pages;
            // a resident region is not demoted for a cooler part). docs/policies.md, "Hybrid
            // tracking".
            if !before.is_fast() {
                self.records[c.region] = before;
                c.cover.apply(&mut self.records);
            }
            return;
        };
        let pages = d.pages_mut(slot);
        // A page two adjacent pieces share keeps the larger gain; a piece seen cold adds
        // nothing.
        c.pieces.retain(|p| p.2 > 0);
        let mut last: Option<(usize, u8)> = None;
        c.pieces.sort_unstable();
        for &(first, end, gain) in &c.pieces {
            for (i, p) in pages
                .iter_mut()
                .enumerate()
                .take(end.min(REGION_PAGES))
                .skip(first)
            {
                let add = match last {
                    Some((j, prev)) if j == i => gain.saturating_sub(prev),
                    _ => gain,
                };
                *p = p.observed(add);
            }
            last = Some((end.saturating_sub(1), gain));
        }
    }

    /// Records that `granule` is on `tier` without a migration by vmtier (first placement,
    /// or a move observed from outside); every page of a split region. Out-of-range granules
    /// are ignored.
    pub fn set_tier(&mut self, granule: Granule, tier: Tier) {
        if let Some(r) = self.records.get_mut(granule.index()) {
            *r = r.placed_on(tier);
        }
        if let Some(d) = self.detail.as_mut() {
            if let Some(slot) = d.slot(granule.index()) {
                for p in d.pages_mut(slot) {
                    *p = p.placed_on(tier);
                }
                d.recount(slot);
            }
        }
    }

    /// Records that vmtier migrated `granule` to `tier` this tick (move age 0); every page of
    /// a split region.
    pub fn mark_moved(&mut self, granule: Granule, tier: Tier) {
        if let Some(r) = self.records.get_mut(granule.index()) {
            *r = r.moved_to(tier);
        }
        if let Some(d) = self.detail.as_mut() {
            if let Some(slot) = d.slot(granule.index()) {
                for p in d.pages_mut(slot) {
                    *p = p.moved_to(tier);
                }
                d.recount(slot);
            }
        }
    }

    /// Keeps `granule` out of this tick's plan: its move age reads 0, as if it had just
    /// moved (policies leave recently moved granules alone unless the budget forces them
    /// out). For granules whose last move did not complete and that wait for a retry.
    pub fn hold(&mut self, granule: Granule) {
        if let Some(r) = self.records.get_mut(granule.index()) {
            *r = r.moved_to(r.tier());
        }
    }

    /// Where `granule` lives, if it exists.
    pub fn span(&self, granule: Granule) -> Option<GranuleSpan> {
        let i = self.spans.partition_point(|s| s.first <= granule.0);
        let s = self.spans.get(i.checked_sub(1)?)?;
        let k = granule.0.checked_sub(s.first)?;
        if k >= s.count {
            return None;
        }
        let (lo, hi) = s.granule(k, self.shift);
        Some(GranuleSpan {
            gpa: GuestPhysAddr(s.gpa.checked_add(lo - s.hva)?),
            hva: HostVirtAddr::new(lo),
            len: hi - lo,
        })
    }

    /// The granule holding guest physical address `gpa`, if it is guest RAM.
    pub fn granule_of_gpa(&self, gpa: GuestPhysAddr) -> Option<Granule> {
        let i = self.spans.partition_point(|s| s.gpa <= gpa.0);
        let s = self.spans.get(i.checked_sub(1)?)?;
        let off = gpa.0.checked_sub(s.gpa)?;
        if off >= s.len {
            return None;
        }
        let k = u32::try_from((s.lead + off) >> self.shift).ok()?;
        Some(Granule(s.first.checked_add(k)?))
    }

    /// Granule counts per heat bucket and tier, for `vmtierctl status`.
    pub fn histogram(&self) -> Histogram {
        let mut h = Histogram::default();
        for r in &self.records {
            let b = usize::from(r.heat() >> 2).min(HISTOGRAM_BUCKETS - 1);
            if r.is_fast() {
                h.fast[b] += 1;
            } else {
                h.slow[b] += 1;
            }
        }
        h
    }

    /// Bytes of guest RAM per tier (partial granules counted exactly, split regions by page).
    pub fn tier_bytes(&self) -> TierBytes {
        let mut t = TierBytes::default();
        self.for_each_region(|r, len, pages| {
            // A split region's fast pages come from its kept count, below.
            if pages.is_none() && r.is_fast() {
                t.fast += len;
            } else {
                t.slow += len;
            }
        });
        if let Some(d) = self.detail.as_ref() {
            for (slot, &region) in d.owner.iter().enumerate() {
                if region != NO_SLOT {
                    let fast = u64::from(d.fast[slot]) * 4096;
                    t.fast += fast;
                    t.slow -= fast;
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::{Backing, GuestRamRange, ProcessId};

    const A: u64 = 0x7f00_0000_0000;

    fn layout(ranges: &[(u64, u64, u64)]) -> GuestMemoryLayout {
        let r = ranges
            .iter()
            .enumerate()
            .map(|(i, &(gpa, hva, len))| GuestRamRange {
                name: format!("r{i}"),
                gpa: GuestPhysAddr(gpa),
                hva: HostVirtAddr::new(hva),
                len,
                backing: Backing::PrivateAnon,
            })
            .collect();
        GuestMemoryLayout::new(ProcessId::new(1), r).unwrap()
    }

    /// A report of `hits` in 20 samples (one DAMON window at its defaults).
    fn acc(start: u64, len: u64, hits: u32) -> RegionAccess {
        RegionAccess {
            start: HostVirtAddr::new(start),
            len,
            hits,
            samples: 20,
        }
    }

    fn store(ranges: &[(u64, u64, u64)], granule: u64) -> HotnessStore {
        HotnessStore::new(
            &layout(ranges),
            StoreConfig {
                granule: GranuleSize::new(granule).unwrap(),
                ..StoreConfig::default()
            },
        )
        .unwrap()
    }

    fn heats(s: &HotnessStore) -> Vec<u8> {
        s.records().iter().map(|r| r.heat()).collect()
    }

    #[test]
    fn granules_are_aligned_to_host_huge_pages() {
        // QEMU's RAM above 1 MiB: gpa 1M at hva A+1M, 5 MiB long, 2 MiB granules.
        // host:  |A      |A+2M     |A+4M     |A+6M
        // range:     [A+1M ............... A+6M)
        // granule:  g0 1M |  g1 2M  |  g2 2M  |
        let m = 1u64 << 20;
        let s = store(&[(m, A + m, 5 * m)], 2 * m);
        assert_eq!(s.len(), 3);
        let cases = [
            (0u32, Some((m, A + m, m))),
            (1, Some((2 * m, A + 2 * m, 2 * m))),
            (2, Some((4 * m, A + 4 * m, 2 * m))),
            (3, None),
        ];
        for (g, want) in cases {
            let got = s.span(Granule(g)).map(|x| (x.gpa.0, x.hva.raw(), x.len));
            assert_eq!(got, want, "granule {g}");
        }
        let gpas = [
            (m, Some(0u32)),
            (2 * m - 1, Some(0)),
            (2 * m, Some(1)),
            (6 * m - 1, Some(2)),
            (6 * m, None),
        ];
        for (gpa, want) in gpas {
            assert_eq!(
                s.granule_of_gpa(GuestPhysAddr(gpa)).map(|g| g.0),
                want,
                "gpa {gpa:#x}"
            );
        }
        let mut s = s;
        s.observe(&[acc(A + 2 * m, 2 * m, 20)]);
        assert_eq!(heats(&s), vec![0, 16, 0]);
        s.set_tier(Granule(0), Tier::Fast);
        assert_eq!(
            s.tier_bytes(),
            TierBytes {
                fast: m,
                slow: 4 * m
            }
        );
    }

    #[test]
    fn granules_follow_guest_physical_order() {
        // GPA: [0, 12K) -> hva B ; [1M, 1M+20K) -> hva A (lower host address)
        // granule 8K:  r0 = g0 [0,8K) g1 [8K,12K)
        //              r1 = g2 [1M,1M+8K) g3 [1M+8K,1M+16K) g4 [1M+16K,1M+20K)
        let b = A + (1 << 30);
        let s = store(&[(1 << 20, A, 20 << 10), (0, b, 12 << 10)], 8192);
        assert_eq!(s.len(), 5);
        let cases = [
            (0u32, Some((0u64, b, 8192u64))),
            (1, Some((8192, b + 8192, 4096))),
            (2, Some((1 << 20, A, 8192))),
            (4, Some(((1 << 20) + (16 << 10), A + (16 << 10), 4096))),
            (5, None),
        ];
        for (g, want) in cases {
            let got = s.span(Granule(g)).map(|x| (x.gpa.0, x.hva.raw(), x.len));
            assert_eq!(got, want, "granule {g}");
        }
        let gpas = [
            (0u64, Some(0u32)),
            (8191, Some(0)),
            (8192, Some(1)),
            (12 << 10, None),
            (1 << 20, Some(2)),
            ((1 << 20) + (20 << 10) - 1, Some(4)),
            ((1 << 20) + (20 << 10), None),
        ];
        for (gpa, want) in gpas {
            assert_eq!(
                s.granule_of_gpa(GuestPhysAddr(gpa)).map(|g| g.0),
                want,
                "gpa {gpa:#x}"
            );
        }
        assert_eq!(
            s.tier_bytes(),
            TierBytes {
                fast: 0,
                slow: 32 << 10
            }
        );
    }

    #[test]
    fn reports_map_to_granules() {
        // One 64K range at A, 16K granules: g0..g3. A second range at A+1M (GPA 64K), 16K.
        let s0 = || {
            store(
                &[(0, A, 64 << 10), (64 << 10, A + (1 << 20), 16 << 10)],
                16384,
            )
        };
        let k = 1024;
        type Case = (&'static str, Vec<RegionAccess>, Vec<u8>, u64);
        let cases: Vec<Case> = vec![
            (
                "exact granule",
                vec![acc(A + 16 * k, 16 * k, 20)],
                vec![0, 16, 0, 0, 0],
                0,
            ),
            (
                "one page touches g2",
                vec![acc(A + 40 * k, 4 * k, 5)],
                vec![0, 0, 12, 0, 0],
                0,
            ),
            (
                "straddles g0/g1",
                vec![acc(A + 12 * k, 8 * k, 1)],
                vec![3, 3, 0, 0, 0],
                0,
            ),
            (
                // g3: 4K at 1/20 and 4K at 20/20: mean 0.525, gain round(16 - 1.86).
                "a granule two reports share gains once, from their byte-weighted mean",
                vec![acc(A, 52 * k, 1), acc(A + 52 * k, 4 * k, 20)],
                vec![3, 3, 3, 14, 0],
                0,
            ),
            (
                // g3: 4K at 20/20, 12K at 1/20: mean 0.2875.
                "... in either order",
                vec![acc(A + 48 * k, 4 * k, 20), acc(A + 52 * k, 12 * k, 1)],
                vec![0, 0, 0, 12, 0],
                0,
            ),
            (
                // One hot page of four: a quarter of g1 accessed, not all of it (the
                // hottest region's gain, 16, made any granule with a small region on a
                // hot page look hot).
                "one hot page of four is a quarter",
                vec![
                    acc(A + 16 * k, 4 * k, 0),
                    acc(A + 20 * k, 4 * k, 20),
                    acc(A + 24 * k, 8 * k, 0),
                ],
                vec![0, 12, 0, 0, 0],
                0,
            ),
            (
                "regions of one fraction read as one region",
                vec![acc(A + 16 * k, 4 * k, 5), acc(A + 20 * k, 12 * k, 5)],
                vec![0, 12, 0, 0, 0],
                0,
            ),
            (
                "spills out of the range",
                vec![acc(A + 60 * k, 12 * k, 20)],
                vec![0, 0, 0, 16, 0],
                8 * k,
            ),
            (
                "second range",
                vec![acc(A + (1 << 20), 4 * k, 20)],
                vec![0, 0, 0, 0, 16],
                0,
            ),
            (
                "outside",
                vec![acc(A - 8 * k, 4 * k, 20)],
                vec![0; 5],
                4 * k,
            ),
            (
                "overflowing report",
                vec![acc(u64::MAX - 4095, 8192, 20)],
                vec![0; 5],
                8192,
            ),
            ("empty report", vec![acc(A, 0, 20)], vec![0; 5], 0),
        ];
        for (name, reports, want, want_out) in cases {
            let mut s = s0();
            let out = s.observe(&reports);
            assert_eq!(heats(&s), want, "{name}");
            assert_eq!(out, want_out, "{name}: bytes outside");
        }
    }

    #[test]
    fn heat_accumulates_while_seen_and_halves_when_not() {
        // Seen hot every tick: 16, 24, 28, 30, 31; then never again: halving to 0.
        let mut s = store(&[(0, A, 4096)], 4096);
        let mut seen = Vec::new();
        for t in 0..12 {
            s.tick();
            if t < 5 {
                s.observe(&[acc(A, 4096, 20)]);
            }
            seen.push(s.records()[0].heat());
        }
        assert_eq!(seen, vec![16, 24, 28, 30, 31, 15, 7, 3, 1, 0, 0, 0]);
        // A one-off hot window never looks like a working set: at most 16.
        let mut s = store(&[(0, A, 4096)], 4096);
        s.tick();
        s.observe(&[acc(A, 4096, 20)]);
        assert_eq!(s.records()[0].heat(), 16);
    }

    #[test]
    fn tiers_moves_and_histogram() {
        let mut s = store(&[(0, A, 8 * 4096)], 4096);
        s.observe(&[acc(A, 4096, 20), acc(A + 4096, 4096, 2)]);
        s.set_tier(Granule(0), Tier::Fast);
        s.mark_moved(Granule(1), Tier::Fast);
        s.set_tier(Granule(99), Tier::Fast);
        let r = s.records();
        assert_eq!((r[0].tier(), r[0].recently_moved()), (Tier::Fast, false));
        assert_eq!((r[1].tier(), r[1].move_age()), (Tier::Fast, 0));
        let h = s.histogram();
        // Heat 16 (bucket 4) and 7 (bucket 1).
        assert_eq!(h.fast, [0, 1, 0, 0, 1, 0, 0, 0]);
        assert_eq!(h.slow, [6, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            s.tier_bytes(),
            TierBytes {
                fast: 8192,
                slow: 6 * 4096
            }
        );
        s.tick();
        assert_eq!(s.records()[1].move_age(), 1);
        s.mark_moved(Granule(1), Tier::Slow);
        assert_eq!(s.tier_bytes().fast, 4096);
    }

    #[test]
    fn memory_stays_within_one_byte_per_page() {
        let gib = 1u64 << 30;
        let cases = [(4096, 1.0, 1.01), (2 << 20, 0.0019, 0.0021)];
        for (g, lo, hi) in cases {
            let s = store(&[(0, A, 2 * gib), (4 * gib, A + 2 * gib, gib)], g);
            let b = s.bytes_per_4k_page();
            assert!((lo..=hi).contains(&b), "granule {g}: {b} bytes/page");
        }
    }

    fn hybrid(regions: u64, percent: u8) -> HotnessStore {
        HotnessStore::new(
            &layout(&[(0, A, regions << 21)]),
            StoreConfig {
                granule: GranuleSize::HUGE,
                detail_percent: percent,
            },
        )
        .unwrap()
    }

    #[test]
    fn hybrid_needs_huge_granules() {
        let r = HotnessStore::new(
            &layout(&[(0, A, 4 << 20)]),
            StoreConfig {
                granule: GranuleSize::BASE,
                detail_percent: 10,
            },
        );
        assert_eq!(r.err(), Some(Error::HybridNeedsHugeGranules));
    }

    #[test]
    fn mixed_regions_split_uniform_ones_stay_whole_and_merge_back() {
        let m2 = 2u64 << 20;
        // Four regions. r0: hot whole; r1: hot first 64 KiB, rest seen cold; r2: a report
        // covers its second half only; r3: nothing. Split: r1 and r2.
        let reports = [
            acc(A, m2, 20),
            acc(A + m2, 64 << 10, 20),
            acc(A + m2 + (64 << 10), m2 - (64 << 10), 0),
            acc(A + 2 * m2 + m2 / 2, m2 / 2, 20),
        ];
        let mut s = hybrid(4, 50);
        s.tick();
        s.observe(&reports);
        assert_eq!(heats(&s), vec![16, 16, 16, 0]);
        let split: Vec<bool> = (0..4).map(|g| s.detail(Granule(g)).is_some()).collect();
        assert_eq!(split, vec![false, true, true, false]);
        let mut list = vec![7];
        s.split_regions(&mut list);
        assert_eq!(list, vec![1, 2], "what the policy is told is split");
        let d1 = s.detail(Granule(1)).unwrap();
        assert_eq!((d1[0].heat(), d1[15].heat(), d1[16].heat()), (16, 16, 0));
        let d2 = s.detail(Granule(2)).unwrap();
        assert_eq!((d2[255].heat(), d2[256].heat()), (0, 16));
        assert_eq!(s.detail_stats().split, 2);

        // Promoting r1 takes its 16 hot pages; r0 moves whole.
        let mut addrs = Vec::new();
        s.pages_of(Granule(1), Step::Promote, 4, &mut addrs);
        assert_eq!(addrs.len(), 16);
        assert_eq!(s.apply(Granule(1), Step::Promote, 4), 16);
        assert_eq!(s.apply(Granule(0), Step::Promote, 4), 512);
        assert!(s.records()[1].is_fast());
        assert!(s.page_is_fast(Granule(1), 15) && !s.page_is_fast(Granule(1), 16));
        assert_eq!(s.tier_bytes().fast, m2 + (64 << 10));
        // Budget of 3 regions' pages: r0 (512 pages), r1 (16) and r2 (256 hot pages) at
        // heat 16 fit, then r3 (cold, whole: 512): 4 regions for 1296 pages.
        let want = |hot_min, granules| PlanBudget { hot_min, granules };
        assert_eq!(s.plan_budget(3 * m2, 4), want(4, 4));
        // 1776 pages left over count whole regions.
        assert_eq!(s.plan_budget(6 * m2, 4), want(4, 4 + 3));
        // 512 pages: the split regions at heat 16 first (272 pages), r0 no longer fits; the
        // 784 pages at heat 16 do not all fit, so a page needs heat 17 (a split region's
        // promotion then takes its hottest, at 16).
        assert_eq!(s.plan_budget(m2, 4), want(17, 2));
        // A higher floor stands.
        assert_eq!(s.plan_budget(3 * m2, 20).hot_min, 20);

        // Nothing seen for a few ticks: r2's detail cools to uniform and merges; r1 stays
        // split (two tiers) until its fast pages are trimmed.
        for _ in 0..4 {
            s.tick();
            s.observe(&[]);
        }
        assert!(s.detail(Granule(2)).is_none());
        assert!(s.detail(Granule(1)).is_some());
        s.split_regions(&mut list);
        assert_eq!(list, vec![1]);
        let ups = s.touch_ups(4);
        assert_eq!(ups, vec![(Granule(1), Step::Trim, 16)]);
        assert_eq!(s.apply(Granule(1), Step::Trim, 4), 16);
        assert!(!s.records()[1].is_fast());
        s.tick();
        assert!(s.detail(Granule(1)).is_none());
        let st = s.detail_stats();
        assert_eq!((st.split, st.splits, st.merges), (0, 2, 2));
    }

    #[test]
    fn whole_slow_regions_gain_the_mean_the_others_the_hottest_report() {
        // (tier, hits of the two halves' reports of 20 samples) -> (record heat, split)
        let cases = [
            // Gains 16 and 13 (not mixed): mean fraction 0.675 gains 15 on the slow tier.
            (Tier::Slow, (20, 7), (15, false)),
            // In DRAM the hottest report's 16.
            (Tier::Fast, (20, 7), (16, false)),
            (Tier::Slow, (20, 20), (16, false)),
            // Mixed (16 and 0): split, and the hottest report's gain.
            (Tier::Slow, (20, 0), (16, true)),
            (Tier::Slow, (0, 0), (0, false)),
        ];
        let m2 = 2u64 << 20;
        for (tier, (a, b), want) in cases {
            let mut s = hybrid(1, 100);
            s.set_tier(Granule(0), tier);
            s.tick();
            s.observe(&[acc(A, m2 / 2, a), acc(A + m2 / 2, m2 / 2, b)]);
            let got = (s.records()[0].heat(), s.detail(Granule(0)).is_some());
            assert_eq!(got, want, "{tier:?} {a} {b}");
        }
    }

    #[test]
    fn plan_budget_is_the_cutoff_then_the_fill_walked_page_by_page() {
        // The one-pass budget against the two walks it replaces: the hottest pages' heat
        // over every page, then each region's cost at that `hot_min`.
        let reference = |s: &HotnessStore, budget: u64, floor: u8| {
            let mut by: hybrid::PagesByHeat = [0; 32];
            let mut cost: hybrid::CostByHeat = [(0, 0); 64];
            for g in (0..s.len()).map(|i| Granule(u32::try_from(i).unwrap())) {
                let h = s.records()[g.index()].heat();
                match s.detail(g) {
                    Some(p) => p.iter().for_each(|p| by[usize::from(p.heat())] += 1),
                    None => by[usize::from(h)] += s.span(g).unwrap().len / 4096,
                }
            }
            let hot_min = floor.max(hybrid::page_cutoff(&by, budget / 4096));
            for g in (0..s.len()).map(|i| Granule(u32::try_from(i).unwrap())) {
                let h = s.records()[g.index()].heat();
                let (pages, split) = match s.detail(g) {
                    Some(p) => {
                        let more = hybrid::select(p, Step::Promote, hot_min).count() as u64;
                        (s.fast_pages(g) + more, true)
                    }
                    None => (s.span(g).unwrap().len / 4096, false),
                };
                let c = &mut cost[hybrid::cost_slot(h, split)];
                *c = (c.0 + 1, c.1 + pages);
            }
            PlanBudget {
                hot_min,
                granules: hybrid::policy_budget(budget / 4096, &cost),
            }
        };
        let m2 = 2u64 << 20;
        let mut x = 0x2545_f491_u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..20 {
            let mut s = hybrid(16, 100);
            for _ in 0..4 {
                s.tick();
                // Reports in address order, pieces of random length and heat.
                let mut at = 0u64;
                let mut reports = Vec::new();
                while at < 16 * m2 {
                    let len = ((1 + next(300)) * 4096).min(16 * m2 - at);
                    reports.push(acc(A + at, len, u32::try_from(next(21)).unwrap()));
                    at += len;
                }
                s.observe(&reports);
                for g in 0..16 {
                    if next(4) == 0 {
                        s.apply(
                            Granule(g),
                            Step::Promote,
                            u8::try_from(1 + next(16)).unwrap(),
                        );
                    }
                }
            }
            assert!(s.detail_stats().split > 0);
            for budget in [m2, 3 * m2, 7 * m2, 15 * m2] {
                for floor in [0, 4, 12] {
                    let want = reference(&s, budget, floor);
                    assert_eq!(s.plan_budget(budget, floor), want, "{budget} {floor}");
                }
            }
        }
    }

    #[test]
    fn trims_only_make_room_that_is_wanted() {
        let m2 = 2u64 << 20;
        // r0 whole and r1's first 16 pages promoted, then four ticks in which only r3 may be
        // seen: r1's fast pages cool to heat 1, below half of `hot_min` (4).
        // (case, budget, r3 seen hot, whether r1 is trimmed)
        let cases = [
            ("room to spare, nothing waits", 4 * m2, false, false),
            ("room for the hot slow region", 4 * m2, true, false),
            (
                "a hot slow region waits, no room",
                m2 + (64 << 10),
                true,
                true,
            ),
            ("over the budget", m2, false, true),
        ];
        for (case, budget, hot3, want) in cases {
            let mut s = hybrid(4, 100);
            s.tick();
            s.observe(&[
                acc(A, m2, 20),
                acc(A + m2, 64 << 10, 20),
                acc(A + m2 + (64 << 10), m2 - (64 << 10), 0),
            ]);
            assert_eq!(s.apply(Granule(0), Step::Promote, 4), 512, "{case}");
            assert_eq!(s.apply(Granule(1), Step::Promote, 4), 16, "{case}");
            let r3 = [acc(A + 3 * m2, m2, 20)];
            for _ in 0..4 {
                s.tick();
                s.observe(if hot3 { &r3 } else { &[] });
            }
            let ups = s.touch_ups(4);
            assert_eq!(ups, vec![(Granule(1), Step::Trim, 16)], "{case}");
            let plan = s.touch_up_plan(4, budget, 1 << 20);
            let trimmed = plan.contains(&(Granule(1), Step::Trim, 4));
            assert_eq!(trimmed, want, "{case}: {plan:?}");
        }
    }

    #[test]
    fn touch_ups_without_room_for_every_hot_page_take_the_hottest() {
        let m2 = 2u64 << 20;
        let p = |n: u64| n * 4096;
        // r0 split and its first 16 pages in DRAM; then pages 16-31 are seen in every sample,
        // 32-47 in a third of them (heat 13): 32 hot slow pages, 16 of them hotter.
        // (room in pages, move pages) -> (hot_min of the touch-up, pages it moves)
        let cases = [
            (40, 1 << 20, Some((4, 32))),
            (20, 1 << 20, Some((14, 16))),
            (40, 20, Some((14, 16))),
            (10, 1 << 20, None),
        ];
        for (room, moves, want) in cases {
            let mut s = hybrid(4, 100);
            s.tick();
            s.observe(&[acc(A, p(16), 20), acc(A + p(16), m2 - p(16), 0)]);
            assert_eq!(s.apply(Granule(0), Step::Promote, 4), 16);
            s.tick();
            s.observe(&[
                acc(A, p(32), 20),
                acc(A + p(32), p(16), 7),
                acc(A + p(48), m2 - p(48), 0),
            ]);
            let plan = s.touch_up_plan(4, p(16 + room), moves);
            let got = plan.first().map(|&(g, step, hm)| {
                assert_eq!((g, step, plan.len()), (Granule(0), Step::Promote, 1));
                (hm, s.apply(g, step, hm))
            });
            assert_eq!(got, want, "room {room}, moves {moves}");
            // The pages that moved are the hottest: 16-31 always, 32-47 only with room.
            let d = s.detail(Granule(0)).unwrap();
            let fast: Vec<bool> = [15, 16, 31, 32, 47]
                .iter()
                .map(|&i| d[i].is_fast())
                .collect();
            let all = want.is_some_and(|w| w.1 == 32);
            assert_eq!(
                fast,
                [true, want.is_some(), want.is_some(), all, all],
                "room {room}"
            );
        }
    }

    #[test]
    fn a_trim_bigger_than_the_moves_left_takes_its_coldest_pages() {
        let m2 = 2u64 << 20;
        let p = |n: u64| n * 4096;
        // r0 split and wholly in DRAM; then its pages 0-63 are hot, 64-159 unseen (heat 0),
        // 160-511 seen in one sample of 20 (heat 3); r1, whole and slow, is hot: it wants
        // the room. With hot_min 8 the trim line is heat 4: 448 pages to trim.
        // (move pages) -> (hot_min of the trim, pages it moves)
        let cases = [
            (1000, Some((8, 448))),
            (448, Some((8, 448))),
            (447, Some((2, 96))),
            (96, Some((2, 96))),
            (95, None),
        ];
        for (moves, want) in cases {
            let mut s = hybrid(2, 100);
            s.tick();
            s.observe(&[acc(A, p(64), 20), acc(A + p(64), m2 - p(64), 0)]);
            assert_eq!(s.apply(Granule(0), Step::Promote, hybrid::EVERY_PAGE), 512);
            s.tick();
            s.observe(&[
                acc(A, p(64), 20),
                acc(A + p(64), p(96), 0),
                acc(A + p(160), m2 - p(160), 1),
                acc(A + m2, m2, 20),
            ]);
            let plan = s.touch_up_plan(8, p(512), moves);
            let got = plan.first().map(|&(g, step, hm)| {
                assert_eq!((g, step, plan.len()), (Granule(0), Step::Trim, 1));
                (hm, s.apply(g, step, hm))
            });
            assert_eq!(got, want, "moves {moves}");
        }
    }

    #[test]
    fn regions_a_huge_page_maps_stay_whole() {
        let m2 = 2u64 << 20;
        // Four regions, each seen mixed (64 KiB hot, the rest cold). Huge pages map r1 and,
        // by a run that ends 4 KiB into it, r2; r0 was split before its huge page came.
        let reports: Vec<RegionAccess> = (0..4u64)
            .flat_map(|r| {
                [
                    acc(A + r * m2, 64 << 10, 20),
                    acc(A + r * m2 + (64 << 10), m2 - (64 << 10), 0),
                ]
            })
            .collect();
        let mut s = hybrid(4, 100);
        s.tick();
        s.observe(&reports[..2]);
        assert!(s.detail(Granule(0)).is_some());
        // r0's 16 hot pages promoted: the majority of its pages stay slow.
        assert_eq!(s.apply(Granule(0), Step::Promote, 4), 16);
        let runs = [
            (HostVirtAddr::new(A), m2),
            (HostVirtAddr::new(A + m2), m2 + 4096),
            (HostVirtAddr::new(A - m2), m2), // outside guest RAM: ignored
        ];
        let all = [(HostVirtAddr::new(A), 4 * m2)];
        let split_now = |s: &HotnessStore| -> Vec<bool> {
            (0..4).map(|g| s.detail(Granule(g)).is_some()).collect()
        };
        let mut cands = Vec::new();
        s.split_candidates(&reports, &mut cands);
        assert_eq!(cands, vec![1, 2, 3], "r0 is split already");
        assert_eq!(s.set_huge(&all, &runs), vec![Granule(0)]);
        assert!(s.detail(Granule(0)).is_none());
        assert!(!s.records()[0].is_fast(), "merged on its majority tier");
        s.tick();
        s.observe(&reports);
        assert_eq!(split_now(&s), vec![false, false, false, true]);
        // A read of nothing changes nothing; a read of r1 and r2 that finds no huge page
        // (the kernel split them) lets them split again, r0 stays whole.
        assert!(s.set_huge(&[], &[]).is_empty());
        s.tick();
        s.observe(&reports);
        assert_eq!(split_now(&s), vec![false, false, false, true]);
        assert!(s
            .set_huge(&[(HostVirtAddr::new(A + m2), 2 * m2)], &[])
            .is_empty());
        s.tick();
        s.observe(&reports);
        assert_eq!(split_now(&s), vec![false, true, true, true]);
        s.split_candidates(&reports, &mut cands);
        assert_eq!(cands, vec![0], "the only whole one seen mixed");
        // Without hybrid tracking there is nothing to do.
        let mut plain = store(&[(0, A, 4 * m2)], m2);
        assert!(plain.set_huge(&all, &runs).is_empty());
        plain.split_candidates(&reports, &mut cands);
        assert!(cands.is_empty());
    }

    #[test]
    fn split_candidates_are_the_regions_observe_splits() {
        // Random DAMON-like ticks over 64 regions (reports of 1..=1536 pages in address
        // order, gains 0..=20, some leaving gaps): the regions `split_candidates` names,
        // which reads only the regions where a report starts or ends, are the ones the fold
        // then splits (cap 100 %, no huge page), tick after tick.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut s = hybrid(64, 100);
        let end = A + (64 << 21);
        let mut seen = 0;
        for tick in 0..40 {
            let mut reports = Vec::new();
            let mut at = A;
            while at < end {
                let len = ((1 + next(1536)) * 4096).min(end - at);
                if next(8) != 0 {
                    reports.push(acc(at, len, u32::try_from(next(21)).unwrap()));
                }
                at += len;
            }
            let mut cands = Vec::new();
            s.split_candidates(&reports, &mut cands);
            s.tick();
            s.observe(&reports);
            let split: Vec<u32> = (0..64u32)
                .filter(|&g| s.detail(Granule(g)).is_some())
                .collect();
            assert_eq!(cands, split, "tick {tick}");
            seen += cands.len();
            // Every region whole again for the next tick: a read that finds huge pages
            // everywhere merges them, one that finds none lets them split.
            let ram = [(HostVirtAddr::new(A), 64 << 21)];
            assert_eq!(s.set_huge(&ram, &ram).len(), split.len());
            assert!(s.set_huge(&ram, &[]).is_empty());
        }
        assert!((200..2000).contains(&seen), "{seen} splits in 40 ticks");
    }

    #[test]
    fn huge_granules_are_the_granules_huge_runs_touch() {
        let m2 = 2u64 << 20;
        // Two ranges of 4 granules each (the second at host address A + 8 MiB).
        let s = store(&[(0, A, 4 * m2), (1 << 32, A + 4 * m2, 4 * m2)], m2);
        let mut out = vec![99];
        // (runs as (offset from A, len)) -> granules
        for (runs, want) in [
            (vec![], vec![]),
            (vec![(0, m2)], vec![0]),
            (vec![(m2, m2 + 4096)], vec![1, 2]), // 4 KiB into granule 2
            (vec![(3 * m2, 2 * m2)], vec![3, 4]), // across the ranges
            (vec![(7 * m2, m2), (0, m2), (7 * m2, m2)], vec![0, 7]), // sorted, once
            (vec![(8 * m2, m2)], vec![]),        // outside guest RAM
        ] {
            let runs: Vec<(HostVirtAddr, u64)> = runs
                .into_iter()
                .map(|(o, l)| (HostVirtAddr::new(A + o), l))
                .collect();
            s.huge_granules(&runs, &mut out);
            assert_eq!(out, want, "{runs:?}");
        }
    }

    #[test]
    fn the_cap_bounds_detail_memory() {
        // 1 GiB, 10 %: at most 51 of 512 regions split, whatever the reports.
        let mut s = hybrid(512, 10);
        let reports: Vec<RegionAccess> =
            (0..512u64).map(|r| acc(A + (r << 21), 4096, 20)).collect();
        s.tick();
        s.observe(&reports);
        let st = s.detail_stats();
        assert_eq!((st.split, st.cap, st.refused), (51, 51, 512 - 51));
        let pages = 512 * 512;
        let bound = hybrid::bytes_per_page(pages, 51) + 0.0005;
        assert!(s.bytes_per_4k_page() <= bound, "{}", s.bytes_per_4k_page());
        assert!(s.bytes_per_4k_page() < 0.25);
    }
}
