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
//! to 31; a one-off pass (a scan, a checksum sweep) fades in a few ticks. A granule that two
//! adjacent reports share gains the larger of the two. Granules no report covers only cool.
//!
//! # Memory
//!
//! One [`HeatRecord`] byte per granule plus a few dozen bytes per RAM range: **1 byte per
//! 4 KiB page** with 4 KiB granules, **1/512 byte per 4 KiB page** with 2 MiB granules
//! ([`HotnessStore::memory_bytes`] reports the exact figure). No per-report state is kept.

use vmtier_core::policy::{Granule, HeatRecord, Tier};
use vmtier_core::{GranuleSize, GuestMemoryLayout, GuestPhysAddr, HostVirtAddr, RegionAccess};

/// Error building a store.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The layout has more granules than a [`Granule`] can index.
    #[error("Too many granules for one VM")]
    TooManyGranules,
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

/// Store tuning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// The placement granule. Default 4 KiB.
    pub granule: GranuleSize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            granule: GranuleSize::BASE,
        }
    }
}

/// Per-granule heat, tier and move age of one VM's RAM. See the module docs.
#[derive(Debug)]
pub struct HotnessStore {
    granule_bytes: u64,
    shift: u32,
    spans: Vec<Span>,
    records: Vec<HeatRecord>,
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
        Ok(Self {
            granule_bytes: g,
            shift,
            spans,
            records: vec![HeatRecord::default(); n],
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

    /// Bytes the store occupies on the heap (records and range index).
    pub fn memory_bytes(&self) -> u64 {
        let spans = self.spans.capacity() * std::mem::size_of::<Span>();
        let recs = self.records.capacity() * std::mem::size_of::<HeatRecord>();
        (spans + recs) as u64
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

    /// Advances one tick: heat halves, move ages advance. Call before [`Self::observe`].
    pub fn tick(&mut self) {
        for r in &mut self.records {
            *r = r.cooled().aged();
        }
    }

    /// Folds reports into the records. Returns the bytes of the reports that fell outside
    /// guest RAM (ignored).
    pub fn observe(&mut self, reports: &[RegionAccess]) -> u64 {
        let mut outside = 0u64;
        // The granule the previous report ended in and the gain it added there: sources
        // report in address order, so a granule cut by a report boundary is seen twice in a
        // row and keeps the larger gain.
        let mut last: Option<(usize, u8)> = None;
        for a in reports {
            let Some(end) = a.end().map(HostVirtAddr::raw) else {
                outside = outside.saturating_add(a.len);
                continue;
            };
            let gain = HeatRecord::heat_gain(a.hits, a.samples);
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
                for g in g0..=g1 {
                    let i = first + g as usize;
                    let add = match last {
                        Some((j, prev)) if j == i => gain.saturating_sub(prev),
                        _ => gain,
                    };
                    self.records[i] = self.records[i].observed(add);
                }
                let i_end = first + g1 as usize;
                let prev = match last {
                    Some((j, p)) if j == i_end && g0 == g1 => p.max(gain),
                    _ => gain,
                };
                last = Some((i_end, prev));
            }
            outside = outside.saturating_add(a.len.saturating_sub(covered));
        }
        outside
    }

    /// Records that `granule` is on `tier` without a migration by vmtier (first placement,
    /// or a move observed from outside). Out-of-range granules are ignored.
    pub fn set_tier(&mut self, granule: Granule, tier: Tier) {
        if let Some(r) = self.records.get_mut(granule.index()) {
            *r = r.placed_on(tier);
        }
    }

    /// Records that vmtier migrated `granule` to `tier` this tick (move age 0).
    pub fn mark_moved(&mut self, granule: Granule, tier: Tier) {
        if let Some(r) = self.records.get_mut(granule.index()) {
            *r = r.moved_to(tier);
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

    /// Bytes of guest RAM per tier (partial granules counted exactly).
    pub fn tier_bytes(&self) -> TierBytes {
        let mut t = TierBytes::default();
        for s in &self.spans {
            let first = s.first as usize;
            for k in 0..s.count {
                let (lo, hi) = s.granule(k, self.shift);
                let len = hi - lo;
                if self.records[first + k as usize].is_fast() {
                    t.fast += len;
                } else {
                    t.slow += len;
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
                "a granule two reports share keeps the larger gain",
                vec![acc(A, 52 * k, 1), acc(A + 52 * k, 4 * k, 20)],
                vec![3, 3, 3, 16, 0],
                0,
            ),
            (
                "... also when the larger comes first",
                vec![acc(A + 48 * k, 4 * k, 20), acc(A + 52 * k, 12 * k, 1)],
                vec![0, 0, 0, 16, 0],
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
}
