//! `heatmap VM` (`GET /v1/vms/{vm}/heatmap`): a VM's last ticks, each a row of address
//! buckets over its guest-physical RAM with the buckets' heat and share in DRAM, as vmtierd
//! keeps them in its tick ring (docs/daemon.md).

use serde::{Deserialize, Serialize};
use vmtier_core::VmId;

/// Most ticks one request may ask for (the ring holds at most `[api] heatmap_ticks`).
pub const MAX_TICKS: u32 = 100_000;

/// Heat of a granule is 0 to this (vmtier-core's `HeatRecord::MAX_HEAT`).
pub const MAX_HEAT: u8 = 31;

/// Scale of [`TickRow::heat_mean`]: mean heat × this, rounded.
pub const MEAN_SCALE: u8 = 8;

/// Scale of [`TickRow::dram`]: share of the bucket's bytes in DRAM × this, rounded.
pub const DRAM_SCALE: u8 = 255;

/// A VM's recent placement over its guest-physical address space.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heatmap {
    /// The VM.
    pub vm: VmId,
    /// Placement policy in use now.
    pub policy: String,
    /// DRAM budget now, bytes.
    pub budget_bytes: u64,
    /// Guest RAM, bytes.
    pub total_bytes: u64,
    /// Placement granule, bytes.
    pub granule_bytes: u64,
    /// Tick length, milliseconds.
    pub interval_ms: u64,
    /// Ticks the ring holds at most.
    pub capacity_ticks: u32,
    /// The guest's RAM ranges, in guest-physical order (holes between them are not RAM).
    pub ranges: Vec<HeatmapRange>,
    /// The address buckets, in guest-physical order; every row has one entry per bucket.
    pub buckets: Vec<HeatmapBucket>,
    /// The ticks, oldest first.
    pub ticks: Vec<TickRow>,
}

/// One RAM range of the guest and the buckets that cover it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatmapRange {
    /// The range's name (QEMU's memory backend, or `range N`).
    pub name: String,
    /// First guest-physical address.
    pub gpa: u64,
    /// Bytes.
    pub bytes: u64,
    /// Index of its first bucket.
    pub first_bucket: u32,
    /// Its buckets.
    pub buckets: u32,
}

/// One address bucket: whole granules of one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatmapBucket {
    /// First guest-physical address.
    pub gpa: u64,
    /// Bytes of guest RAM.
    pub bytes: u64,
}

/// One tick: per bucket, the hottest granule's heat, the mean heat and the share in DRAM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TickRow {
    /// The VM's tick number (1 = the first after attach).
    pub tick: u64,
    /// Wall-clock time at the end of the tick, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// DRAM budget during the tick, bytes.
    pub budget_bytes: u64,
    /// Guest RAM in DRAM at the end of the tick, bytes (as the store believes).
    pub fast_bytes: u64,
    /// Per bucket: the largest heat of its granules, 0 to [`MAX_HEAT`].
    pub heat_max: Vec<u8>,
    /// Per bucket: the mean heat of its granules × [`MEAN_SCALE`], 0 to 248.
    pub heat_mean: Vec<u8>,
    /// Per bucket: the share of its bytes in DRAM × [`DRAM_SCALE`], 0 to 255.
    pub dram: Vec<u8>,
}

impl Heatmap {
    /// Index of the bucket holding guest-physical address `gpa`, if any.
    pub fn bucket_of(&self, gpa: u64) -> Option<usize> {
        let i = self.buckets.partition_point(|b| b.gpa <= gpa);
        let b = self.buckets.get(i.checked_sub(1)?)?;
        (gpa - b.gpa < b.bytes).then_some(i - 1)
    }

    /// Buckets lying wholly inside `[start, end)`.
    pub fn buckets_within(&self, start: u64, end: u64) -> Vec<usize> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| b.gpa >= start && b.gpa.saturating_add(b.bytes) <= end)
            .map(|(i, _)| i)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(buckets: &[(u64, u64)]) -> Heatmap {
        Heatmap {
            vm: "a".parse().unwrap(),
            policy: "default".into(),
            budget_bytes: 0,
            total_bytes: buckets.iter().map(|b| b.1).sum(),
            granule_bytes: 4096,
            interval_ms: 1000,
            capacity_ticks: 1,
            ranges: vec![],
            buckets: buckets
                .iter()
                .map(|&(gpa, bytes)| HeatmapBucket { gpa, bytes })
                .collect(),
            ticks: vec![],
        }
    }

    #[test]
    fn buckets_are_found_by_address_and_holes_hold_none() {
        // Two ranges with a hole: [0, 8K) in two buckets, [16K, 20K) in one.
        let m = map(&[(0, 4096), (4096, 4096), (16384, 4096)]);
        let cases = [
            (0, Some(0)),
            (4095, Some(0)),
            (4096, Some(1)),
            (8191, Some(1)),
            (8192, None),
            (16383, None),
            (16384, Some(2)),
            (20479, Some(2)),
            (20480, None),
        ];
        for (gpa, want) in cases {
            assert_eq!(m.bucket_of(gpa), want, "{gpa}");
        }
        assert_eq!(m.buckets_within(0, 8192), vec![0, 1]);
        assert_eq!(m.buckets_within(2048, 20480), vec![1, 2]);
        assert_eq!(m.buckets_within(8192, 16384), Vec::<usize>::new());
        let back: Heatmap = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back, m);
    }
}
