//! Rust mirror of the module's ABI, `host-kmod/include/uapi/linux/vmtier.h`.
//!
//! Every field is a `u64` (user pointers included), so the layout has no padding; the
//! size and offset assertions below fail the build if the two drift apart.
//!
//! The module takes a structure's size from the ioctl command, so a program built against
//! an older or newer header keeps working: [`ioc_migrate`] and [`ioc_query`] build the
//! command for any size (the tests use them for the first version's sizes).

#![allow(missing_docs)]

use std::mem::{offset_of, size_of};

/// `VMTIER_ABI_VERSION`.
pub const ABI_VERSION: u64 = 2;

/// `VMTIER_ENGINE_AUTO`: the module picks per batch.
pub const ENGINE_AUTO: u64 = 0;
/// `VMTIER_ENGINE_CPU`: worker kthreads across CPUs and nodes.
pub const ENGINE_CPU: u64 = 1;
/// `VMTIER_ENGINE_DMA`: dmaengine `DMA_MEMCPY` channels.
pub const ENGINE_DMA: u64 = 2;

/// `VMTIER_MIGRATE_SKIP_UNSUPPORTED`: count pages of non-private-anonymous VMAs as
/// `skipped_shared` instead of failing with `EOPNOTSUPP`.
pub const MIGRATE_SKIP_UNSUPPORTED: u64 = 1 << 0;
/// `VMTIER_MIGRATE_SHARED` (ABI 2): also move pages other processes map (copy-on-write
/// after fork) and KSM pages, for every process that maps them.
pub const MIGRATE_SHARED: u64 = 1 << 1;
/// `VMTIER_MIGRATE_FLAGS_ALL`.
pub const MIGRATE_FLAGS_ALL: u64 = MIGRATE_SKIP_UNSUPPORTED | MIGRATE_SHARED;

pub const MAX_RANGES: u64 = 4096;
pub const MAX_BATCH: u64 = 65536;
pub const DEFAULT_BATCH: u64 = 4096;
pub const MAX_WORKERS: u64 = 64;
pub const MAX_DMA_CHANS: usize = 8;
pub const DMA_NAME_LEN: usize = 32;

/// `struct vmtier_range`: one range in, its per-page outcome counts out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmtierRange {
    pub start: u64,
    pub len: u64,
    pub moved: u64,
    pub on_target: u64,
    pub skipped_hole: u64,
    pub skipped_thp: u64,
    pub skipped_busy: u64,
    pub skipped_shared: u64,
    pub failed: u64,
    /// ABI 2.
    pub skipped_pinned: u64,
    /// ABI 2.
    pub skipped_sharers: u64,
    pub reserved: u64,
}

/// `struct vmtier_migrate`, the argument of [`IOC_MIGRATE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmtierMigrate {
    pub size: u64,
    pub flags: u64,
    pub pid: u64,
    pub node: u64,
    pub ranges: u64,
    pub nr_ranges: u64,
    pub engine: u64,
    pub workers: u64,
    pub batch: u64,
    pub engine_used: u64,
    pub workers_used: u64,
    pub moved: u64,
    pub skipped: u64,
    pub failed: u64,
    pub dma_fallbacks: u64,
    pub copy_ns: u64,
    pub total_ns: u64,
    pub reserved: [u64; 4],
    /// ABI 2 from here.
    pub unmapped: u64,
    pub dma_abandoned: u64,
    pub batches: u64,
    pub unmap_ns: u64,
    pub remap_ns: u64,
}

/// `VMTIER_MIGRATE_SIZE_VER1`: the first version's `struct vmtier_migrate`.
pub const MIGRATE_SIZE_VER1: usize = 168;
/// `VMTIER_QUERY_SIZE_VER1`: the first version's `struct vmtier_query`.
pub const QUERY_SIZE_VER1: usize = 352;

/// `struct vmtier_query`, the argument of [`IOC_QUERY`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmtierQuery {
    pub size: u64,
    pub abi_version: u64,
    pub engines: u64,
    pub max_ranges: u64,
    pub max_batch: u64,
    pub default_batch: u64,
    pub max_workers: u64,
    pub nr_dma_chans: u64,
    pub dma_names: [[u8; DMA_NAME_LEN]; MAX_DMA_CHANS],
    pub reserved: [u64; 4],
    /// ABI 2 from here.
    pub default_workers: u64,
    pub housekeeping_cpus: u64,
    pub migrate_flags: u64,
    pub dma_drivers: [[u8; DMA_NAME_LEN]; MAX_DMA_CHANS],
}

impl Default for VmtierQuery {
    fn default() -> Self {
        Self {
            size: size_of::<Self>() as u64,
            abi_version: 0,
            engines: 0,
            max_ranges: 0,
            max_batch: 0,
            default_batch: 0,
            max_workers: 0,
            nr_dma_chans: 0,
            dma_names: [[0; DMA_NAME_LEN]; MAX_DMA_CHANS],
            reserved: [0; 4],
            default_workers: 0,
            housekeeping_cpus: 0,
            migrate_flags: 0,
            dma_drivers: [[0; DMA_NAME_LEN]; MAX_DMA_CHANS],
        }
    }
}

/// `_IOWR(type, nr, size)` on x86/arm64/riscv: direction read|write (3), 14 size bits.
pub const fn iowr(ty: u64, nr: u64, size: usize) -> u64 {
    (3 << 30) | (((size as u64) & 0x3fff) << 16) | (ty << 8) | nr
}

/// `VMTIER_IOC_MAGIC`.
pub const IOC_MAGIC: u64 = 0xB7;
/// `VMTIER_IOC_NR_QUERY`.
pub const IOC_NR_QUERY: u64 = 0x00;
/// `VMTIER_IOC_NR_MIGRATE`.
pub const IOC_NR_MIGRATE: u64 = 0x01;

/// `VMTIER_IOC_QUERY` for a structure of `size` bytes.
pub const fn ioc_query(size: usize) -> u64 {
    iowr(IOC_MAGIC, IOC_NR_QUERY, size)
}

/// `VMTIER_IOC_MIGRATE` for a structure of `size` bytes.
pub const fn ioc_migrate(size: usize) -> u64 {
    iowr(IOC_MAGIC, IOC_NR_MIGRATE, size)
}

/// `VMTIER_IOC_QUERY`.
pub const IOC_QUERY: u64 = ioc_query(size_of::<VmtierQuery>());
/// `VMTIER_IOC_MIGRATE`.
pub const IOC_MIGRATE: u64 = ioc_migrate(size_of::<VmtierMigrate>());

const _: () = {
    assert!(size_of::<VmtierRange>() == 96);
    assert!(offset_of!(VmtierRange, start) == 0);
    assert!(offset_of!(VmtierRange, len) == 8);
    assert!(offset_of!(VmtierRange, moved) == 16);
    assert!(offset_of!(VmtierRange, on_target) == 24);
    assert!(offset_of!(VmtierRange, skipped_hole) == 32);
    assert!(offset_of!(VmtierRange, skipped_thp) == 40);
    assert!(offset_of!(VmtierRange, skipped_busy) == 48);
    assert!(offset_of!(VmtierRange, skipped_shared) == 56);
    assert!(offset_of!(VmtierRange, failed) == 64);
    assert!(offset_of!(VmtierRange, skipped_pinned) == 72);
    assert!(offset_of!(VmtierRange, skipped_sharers) == 80);
    assert!(offset_of!(VmtierRange, reserved) == 88);

    assert!(size_of::<VmtierMigrate>() == 208);
    assert!(offset_of!(VmtierMigrate, size) == 0);
    assert!(offset_of!(VmtierMigrate, flags) == 8);
    assert!(offset_of!(VmtierMigrate, pid) == 16);
    assert!(offset_of!(VmtierMigrate, node) == 24);
    assert!(offset_of!(VmtierMigrate, ranges) == 32);
    assert!(offset_of!(VmtierMigrate, nr_ranges) == 40);
    assert!(offset_of!(VmtierMigrate, engine) == 48);
    assert!(offset_of!(VmtierMigrate, workers) == 56);
    assert!(offset_of!(VmtierMigrate, batch) == 64);
    assert!(offset_of!(VmtierMigrate, engine_used) == 72);
    assert!(offset_of!(VmtierMigrate, workers_used) == 80);
    assert!(offset_of!(VmtierMigrate, moved) == 88);
    assert!(offset_of!(VmtierMigrate, skipped) == 96);
    assert!(offset_of!(VmtierMigrate, failed) == 104);
    assert!(offset_of!(VmtierMigrate, dma_fallbacks) == 112);
    assert!(offset_of!(VmtierMigrate, copy_ns) == 120);
    assert!(offset_of!(VmtierMigrate, total_ns) == 128);
    assert!(offset_of!(VmtierMigrate, reserved) == 136);
    assert!(offset_of!(VmtierMigrate, unmapped) == MIGRATE_SIZE_VER1);
    assert!(offset_of!(VmtierMigrate, dma_abandoned) == 176);
    assert!(offset_of!(VmtierMigrate, batches) == 184);
    assert!(offset_of!(VmtierMigrate, unmap_ns) == 192);
    assert!(offset_of!(VmtierMigrate, remap_ns) == 200);

    assert!(size_of::<VmtierQuery>() == 632);
    assert!(offset_of!(VmtierQuery, size) == 0);
    assert!(offset_of!(VmtierQuery, abi_version) == 8);
    assert!(offset_of!(VmtierQuery, engines) == 16);
    assert!(offset_of!(VmtierQuery, max_ranges) == 24);
    assert!(offset_of!(VmtierQuery, max_batch) == 32);
    assert!(offset_of!(VmtierQuery, default_batch) == 40);
    assert!(offset_of!(VmtierQuery, max_workers) == 48);
    assert!(offset_of!(VmtierQuery, nr_dma_chans) == 56);
    assert!(offset_of!(VmtierQuery, dma_names) == 64);
    assert!(offset_of!(VmtierQuery, reserved) == 320);
    assert!(offset_of!(VmtierQuery, default_workers) == QUERY_SIZE_VER1);
    assert!(offset_of!(VmtierQuery, housekeeping_cpus) == 360);
    assert!(offset_of!(VmtierQuery, migrate_flags) == 368);
    assert!(offset_of!(VmtierQuery, dma_drivers) == 376);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_c_header() {
        // From a C program printing VMTIER_IOC_* with the header (ABI 2).
        assert_eq!(IOC_QUERY, 0xc278_b700);
        assert_eq!(IOC_MIGRATE, 0xc0d0_b701);
        // The first version's commands, which the module still serves.
        assert_eq!(ioc_query(QUERY_SIZE_VER1), 0xc160_b700);
        assert_eq!(ioc_migrate(MIGRATE_SIZE_VER1), 0xc0a8_b701);
    }
}
