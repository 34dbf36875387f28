//! The tick ring: per VM, the last N ticks as rows of K address buckets over the guest's
//! physical RAM, for `vmtierctl heatmap` and `GET /v1/vms/{vm}/heatmap` (docs/daemon.md).
//!
//! Buckets are whole granules of one RAM range, in guest-physical order: each range gets a
//! share of the K buckets in proportion to its granules (at least one), so no bucket spans a
//! hole between ranges. With fewer granules than K, each bucket is one granule. At the end
//! of every tick the engine pushes one row, made in one pass over the store's records: per
//! bucket the largest heat, the mean heat (× 8) and the share of its bytes in DRAM (× 255),
//! 3 bytes; the oldest row is reused once the ring is full. Memory when full: N × (3 K + 56)
//! bytes plus 40 bytes per bucket: 120 × (768 + 56) + 256 × 40 B ≈ 107 KiB per VM with the
//! defaults ([`TickRing::memory_bytes`]).

use std::collections::VecDeque;

use vmtier_api::heatmap::{HeatmapBucket, HeatmapRange, TickRow, DRAM_SCALE, MAX_HEAT, MEAN_SCALE};
use vmtier_core::policy::{Granule, HeatRecord};
use vmtier_core::{GuestMemoryLayout, GuestPhysAddr};
use vmtier_sources::store::HotnessStore;

/// `[api] heatmap_ticks` default.
pub const DEFAULT_TICKS: u32 = 120;
/// `[api] heatmap_buckets` default.
pub const DEFAULT_BUCKETS: u32 = 256;

/// How many ticks and buckets a ring keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSize {
    /// Rows (ticks); 0 keeps none.
    pub ticks: u32,
    /// Address buckets per row (fewer when the VM has fewer granules).
    pub buckets: u32,
}

impl Default for RingSize {
    fn default() -> Self {
        Self {
            ticks: DEFAULT_TICKS,
            buckets: DEFAULT_BUCKETS,
        }
    }
}

/// One bucket: granules `g0..g1` of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    g0: u32,
    g1: u32,
    /// Bytes of its first and last granule (a range's edge granules may be partial).
    first_len: u64,
    last_len: u64,
    gpa: u64,
    bytes: u64,
}

/// One tick's row: 3 bytes per bucket.
#[derive(Clone, Debug)]
struct Row {
    tick: u64,
    unix_ms: u64,
    budget_bytes: u64,
    fast_bytes: u64,
    /// `[max, mean × 8, dram × 255]` per bucket.
    cells: Vec<[u8; 3]>,
}

/// What the engine knows at the end of a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TickInfo {
    /// The VM's tick number.
    pub tick: u64,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// DRAM budget, bytes.
    pub budget_bytes: u64,
}

/// A VM's tick ring.
#[derive(Debug)]
pub struct TickRing {
    size: RingSize,
    granule_bytes: u64,
    granules: usize,
    ranges: Vec<HeatmapRange>,
    buckets: Vec<Bucket>,
    rows: VecDeque<Row>,
}

impl TickRing {
    /// An empty ring over `store`'s granules, bucketed by `layout`'s ranges.
    pub fn new(size: RingSize, layout: &GuestMemoryLayout, store: &HotnessStore) -> Self {
        let n = store.len();
        let want = (size.buckets as usize).clamp(1, n.max(1));
        let mut ranges = Vec::with_capacity(layout.ranges.len());
        let mut buckets = Vec::with_capacity(want + layout.ranges.len());
        for r in &layout.ranges {
            let last_gpa = r.gpa.0.saturating_add(r.len.saturating_sub(1));
            let (Some(first), Some(last)) = (
                store.granule_of_gpa(r.gpa),
                store.granule_of_gpa(GuestPhysAddr(last_gpa)),
            ) else {
                continue;
            };
            let count = u64::from(last.0 - first.0) + 1;
            // This range's share of the buckets: at least one, at most one per granule.
            let k = (want as u64 * count / n.max(1) as u64).clamp(1, count);
            let first_bucket = u32::try_from(buckets.len()).unwrap_or(u32::MAX);
            for j in 0..k {
                // j < k <= count <= 2^32, so these fit.
                let g0 = first.0 + u32::try_from(j * count / k).unwrap_or(0);
                let g1 = first.0 + u32::try_from((j + 1) * count / k).unwrap_or(0);
                let (Some(a), Some(b)) = (store.span(Granule(g0)), store.span(Granule(g1 - 1)))
                else {
                    continue;
                };
                buckets.push(Bucket {
                    g0,
                    g1,
                    first_len: a.len,
                    last_len: b.len,
                    gpa: a.gpa.0,
                    bytes: b.gpa.0 + b.len - a.gpa.0,
                });
            }
            ranges.push(HeatmapRange {
                name: r.name.clone(),
                gpa: r.gpa.0,
                bytes: r.len,
                first_bucket,
                buckets: u32::try_from(buckets.len()).unwrap_or(u32::MAX) - first_bucket,
            });
        }
        Self {
            size,
            granule_bytes: store.granule_bytes(),
            granules: n,
            ranges,
            buckets,
            rows: VecDeque::with_capacity(size.ticks as usize),
        }
    }

    /// Bytes the ring holds when full.
    pub fn memory_bytes(&self) -> u64 {
        let row = std::mem::size_of::<Row>() + 3 * self.buckets.len();
        (self.size.ticks as usize * row + self.buckets.len() * std::mem::size_of::<Bucket>()) as u64
    }

    /// Whether the ring was built for a store of this many granules.
    pub fn fits(&self, store: &HotnessStore) -> bool {
        self.granules == store.len() && self.granule_bytes == store.granule_bytes()
    }

    /// Appends the row of this tick from `records` (the store's, one per granule); the
    /// oldest row goes once the ring is full. `split_fast(g)` gives the bytes of granule `g`
    /// in DRAM when only part of it is (a split region of hybrid tracking), `None` when its
    /// record's tier holds for all of it.
    pub fn push(
        &mut self,
        at: TickInfo,
        records: &[HeatRecord],
        split_fast: impl Fn(usize) -> Option<u64>,
    ) {
        if self.size.ticks == 0 || records.len() != self.granules {
            return;
        }
        let mut row = if self.rows.len() >= self.size.ticks as usize {
            self.rows.pop_front().unwrap_or_else(|| self.blank())
        } else {
            self.blank()
        };
        row.tick = at.tick;
        row.unix_ms = at.unix_ms;
        row.budget_bytes = at.budget_bytes;
        row.cells.clear();
        let mut fast_total = 0u64;
        for b in &self.buckets {
            let (mut max, mut sum, mut fast) = (0u8, 0u64, 0u64);
            for g in b.g0..b.g1 {
                let r = records[g as usize];
                max = max.max(r.heat());
                sum += u64::from(r.heat());
                let len = if g == b.g0 {
                    b.first_len
                } else if g + 1 == b.g1 {
                    b.last_len
                } else {
                    self.granule_bytes
                };
                match split_fast(g as usize) {
                    Some(bytes) => fast += bytes.min(len),
                    None if r.is_fast() => fast += len,
                    None => {}
                }
            }
            let count = u64::from(b.g1 - b.g0).max(1);
            let mean = (sum * u64::from(MEAN_SCALE) + count / 2) / count;
            let dram = (fast * u64::from(DRAM_SCALE) + b.bytes / 2) / b.bytes.max(1);
            fast_total += fast;
            row.cells.push([
                max.min(MAX_HEAT),
                u8::try_from(mean).unwrap_or(u8::MAX),
                u8::try_from(dram).unwrap_or(u8::MAX),
            ]);
        }
        row.fast_bytes = fast_total;
        self.rows.push_back(row);
    }

    fn blank(&self) -> Row {
        Row {
            tick: 0,
            unix_ms: 0,
            budget_bytes: 0,
            fast_bytes: 0,
            cells: Vec::with_capacity(self.buckets.len()),
        }
    }

    /// The RAM ranges and their buckets.
    pub fn ranges(&self) -> &[HeatmapRange] {
        &self.ranges
    }

    /// The buckets' addresses.
    pub fn buckets(&self) -> Vec<HeatmapBucket> {
        self.buckets
            .iter()
            .map(|b| HeatmapBucket {
                gpa: b.gpa,
                bytes: b.bytes,
            })
            .collect()
    }

    /// Its size.
    pub fn size(&self) -> RingSize {
        self.size
    }

    /// Ticks the ring keeps at most.
    pub fn capacity(&self) -> u32 {
        self.size.ticks
    }

    /// The newest `last` rows (all with `None`), oldest first.
    pub fn rows(&self, last: Option<u32>) -> Vec<TickRow> {
        let n = last.map_or(self.rows.len(), |l| (l as usize).min(self.rows.len()));
        self.rows
            .iter()
            .skip(self.rows.len() - n)
            .map(|r| TickRow {
                tick: r.tick,
                unix_ms: r.unix_ms,
                budget_bytes: r.budget_bytes,
                fast_bytes: r.fast_bytes,
                heat_max: r.cells.iter().map(|c| c[0]).collect(),
                heat_mean: r.cells.iter().map(|c| c[1]).collect(),
                dram: r.cells.iter().map(|c| c[2]).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::policy::Tier;
    use vmtier_core::{Backing, GranuleSize, GuestRamRange, HostVirtAddr, ProcessId};
    use vmtier_sources::store::StoreConfig;

    const MIB: u64 = 1 << 20;

    /// A layout of `(gpa, len)` ranges backed at 1 GiB-aligned host addresses.
    fn layout(ranges: &[(u64, u64)]) -> GuestMemoryLayout {
        GuestMemoryLayout::new(
            ProcessId::new(1),
            ranges
                .iter()
                .enumerate()
                .map(|(i, &(gpa, len))| GuestRamRange {
                    name: format!("r{i}"),
                    gpa: GuestPhysAddr(gpa),
                    hva: HostVirtAddr::new((i as u64 + 1) << 30),
                    len,
                    backing: Backing::PrivateAnon,
                })
                .collect(),
        )
        .unwrap()
    }

    fn store(l: &GuestMemoryLayout, granule: GranuleSize) -> HotnessStore {
        HotnessStore::new(
            l,
            StoreConfig {
                granule,
                ..StoreConfig::default()
            },
        )
        .unwrap()
    }

    fn at(tick: u64) -> TickInfo {
        TickInfo {
            tick,
            unix_ms: 1000 * tick,
            budget_bytes: 64 * MIB,
        }
    }

    #[test]
    fn buckets_follow_the_ranges_and_never_span_a_hole() {
        // (ranges, granule, buckets wanted) → (gpa, bytes) of every bucket
        type Case = (&'static [(u64, u64)], GranuleSize, u32, Vec<(u64, u64)>);
        let cases: [Case; 4] = [
            // One 16 MiB range of 2 MiB granules in 4 buckets of 4 MiB.
            (
                &[(0, 16 * MIB)],
                GranuleSize::HUGE,
                4,
                (0..4).map(|i| (i * 4 * MIB, 4 * MIB)).collect(),
            ),
            // More buckets than granules: one per granule.
            (
                &[(0, 8 * MIB)],
                GranuleSize::HUGE,
                256,
                (0..4).map(|i| (i * 2 * MIB, 2 * MIB)).collect(),
            ),
            // A hole: [0, 12M) and [16M, 20M) share 4 buckets 3:1.
            (
                &[(0, 12 * MIB), (16 * MIB, 4 * MIB)],
                GranuleSize::HUGE,
                4,
                vec![
                    (0, 4 * MIB),
                    (4 * MIB, 4 * MIB),
                    (8 * MIB, 4 * MIB),
                    (16 * MIB, 4 * MIB),
                ],
            ),
            // A tiny range still gets its own bucket.
            (
                &[(0, 640 << 10), (MIB, 15 * MIB)],
                GranuleSize::HUGE,
                2,
                vec![(0, 640 << 10), (MIB, 15 * MIB)],
            ),
        ];
        for (ranges, g, k, want) in cases {
            let l = layout(ranges);
            let s = store(&l, g);
            let r = TickRing::new(
                RingSize {
                    ticks: 4,
                    buckets: k,
                },
                &l,
                &s,
            );
            let got: Vec<(u64, u64)> = r.buckets().iter().map(|b| (b.gpa, b.bytes)).collect();
            assert_eq!(got, want, "{ranges:?} in {k}");
            assert_eq!(r.ranges().len(), ranges.len());
            let total: u64 = r.ranges().iter().map(|x| u64::from(x.buckets)).sum();
            assert_eq!(total, want.len() as u64);
        }
    }

    #[test]
    fn a_known_record_pattern_is_downsampled() {
        // 16 MiB in 4 KiB granules (4096), 4 buckets of 1024 granules.
        let l = layout(&[(0, 16 * MIB)]);
        let s = store(&l, GranuleSize::BASE);
        let mut ring = TickRing::new(
            RingSize {
                ticks: 3,
                buckets: 4,
            },
            &l,
            &s,
        );
        let mut recs = vec![HeatRecord::default(); 4096];
        // Bucket 1: every granule heat 31, all in DRAM. Bucket 2: one granule heat 20, a
        // quarter in DRAM. Buckets 0 and 3: cold, in CXL.
        for r in &mut recs[1024..2048] {
            *r = r.observed(31).placed_on(Tier::Fast);
        }
        recs[2048] = recs[2048].observed(20);
        for r in &mut recs[2048..2048 + 256] {
            *r = r.placed_on(Tier::Fast);
        }
        ring.push(at(1), &recs, |_| None);
        let rows = ring.rows(None);
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.heat_max, vec![0, 31, 20, 0]);
        // Mean × 8: 31 × 8 = 248; 20 × 8 / 1024 rounds to 0.
        assert_eq!(row.heat_mean, vec![0, 248, 0, 0]);
        assert_eq!(row.dram, vec![0, 255, 64, 0]);
        assert_eq!(row.fast_bytes, (1024 + 256) * 4096);
        assert_eq!(
            (row.tick, row.unix_ms, row.budget_bytes),
            (1, 1000, 64 * MIB)
        );
        // A store of another size is not pushed into this ring.
        ring.push(at(2), &recs[..100], |_| None);
        assert_eq!(ring.rows(None).len(), 1);
    }

    #[test]
    fn partial_granules_count_their_own_bytes() {
        // A 5 MiB range of 2 MiB granules: the last is 1 MiB. One bucket; only it in DRAM.
        let l = layout(&[(0, 5 * MIB)]);
        let s = store(&l, GranuleSize::HUGE);
        let mut ring = TickRing::new(
            RingSize {
                ticks: 1,
                buckets: 1,
            },
            &l,
            &s,
        );
        let mut recs = vec![HeatRecord::default(); 3];
        recs[2] = recs[2].placed_on(Tier::Fast);
        ring.push(at(1), &recs, |_| None);
        let row = &ring.rows(None)[0];
        assert_eq!(row.fast_bytes, MIB);
        assert_eq!(row.dram, vec![51]); // 255 / 5
    }

    #[test]
    fn the_ring_wraps_and_keeps_the_newest_ticks() {
        let l = layout(&[(0, 8 * MIB)]);
        let s = store(&l, GranuleSize::HUGE);
        // (capacity, pushed, asked) → ticks returned
        let cases: [(u32, u64, Option<u32>, Vec<u64>); 5] = [
            (3, 2, None, vec![1, 2]),
            (3, 3, None, vec![1, 2, 3]),
            (3, 7, None, vec![5, 6, 7]),
            (3, 7, Some(2), vec![6, 7]),
            (0, 5, None, vec![]),
        ];
        for (cap, pushed, ask, want) in cases {
            let mut ring = TickRing::new(
                RingSize {
                    ticks: cap,
                    buckets: 4,
                },
                &l,
                &s,
            );
            for t in 1..=pushed {
                let mut recs = vec![HeatRecord::default(); 4];
                // Tick t: granule t % 4 is hot, so each row is told apart.
                let i = (t % 4) as usize;
                recs[i] = recs[i].observed(u8::try_from(t).unwrap());
                ring.push(at(t), &recs, |_| None);
            }
            let rows = ring.rows(ask);
            let ticks: Vec<u64> = rows.iter().map(|r| r.tick).collect();
            assert_eq!(ticks, want, "cap {cap} pushed {pushed} ask {ask:?}");
            for r in &rows {
                let i = (r.tick % 4) as usize;
                assert_eq!(r.heat_max[i], u8::try_from(r.tick).unwrap(), "{r:?}");
                assert_eq!(r.heat_max.iter().filter(|&&h| h > 0).count(), 1);
            }
            assert!(ring.rows.len() <= cap as usize);
        }
    }

    #[test]
    fn memory_is_bounded_by_the_size() {
        let l = layout(&[(0, 1 << 30)]);
        let s = store(&l, GranuleSize::BASE);
        let ring = TickRing::new(RingSize::default(), &l, &s);
        assert_eq!(ring.buckets().len(), 256);
        let b = ring.memory_bytes();
        // 120 rows of 256 × 3 bytes and a 56-byte header, and the 40-byte buckets.
        assert_eq!(b, 120 * (768 + 56) + 256 * 40);
    }
}
