//! Migrators over the vmtier kernel module (`/dev/vmtier`, see `docs/kmod.md`).
//!
//! - [`Kmod`]: the module alone. It moves private anonymous memory mapped by 4 KiB entries
//!   in batches (unmap, copy, remap; with the CPU engine several threads each run batches
//!   of their own), and leaves THPs, shared and
//!   file mappings alone.
//! - [`Combined`]: per range, the module where it can and `move_pages(2)` for the rest
//!   (THPs kept whole, shared and file-backed guest RAM), so a daemon gets the best of
//!   both. Without the module it is plain `move_pages(2)`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vmtier_core::migrate::{Error, MigrationReport, Migrator, PageOutcome, PageRef};
use vmtier_core::{Backing, GuestMemoryLayout, HostVirtAddr, NodeId, PageSize, ProcessId};

use crate::move_pages::{query_nodes, MovePages, NodeQuery};
use crate::uapi;

/// Where the module's device appears.
pub const DEVICE: &str = "/dev/vmtier";

/// The copy engine the module uses (`[daemon] kmod_engine`: `"auto"`, `"cpu"`, `"dma"`).
/// Not to be confused with vmtierd's `Engine`, the tick loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyEngine {
    /// The module picks per batch (DMA for large batches when channels exist).
    #[default]
    Auto,
    /// Worker kthreads spread across CPUs and nodes.
    Cpu,
    /// dmaengine `DMA_MEMCPY` channels.
    Dma,
}

impl CopyEngine {
    fn raw(self) -> u64 {
        match self {
            Self::Auto => uapi::ENGINE_AUTO,
            Self::Cpu => uapi::ENGINE_CPU,
            Self::Dma => uapi::ENGINE_DMA,
        }
    }

    fn from_raw(v: u64) -> Self {
        match v {
            uapi::ENGINE_CPU => Self::Cpu,
            uapi::ENGINE_DMA => Self::Dma,
            _ => Self::Auto,
        }
    }

    /// Short name: `auto`, `cpu`, `dma`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Dma => "dma",
        }
    }
}

impl std::str::FromStr for CopyEngine {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "dma" => Ok(Self::Dma),
            _ => Err(format!("unknown engine {s:?} (auto, cpu, dma)")),
        }
    }
}

/// How the module is asked to move pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KmodConfig {
    /// Copy engine.
    pub engine: CopyEngine,
    /// CPU threads or DMA channels; 0 for the module's default.
    pub workers: u32,
    /// Base pages per batch (mmap_lock is held per batch); 0 for the module's default.
    pub batch: u32,
}

impl Default for KmodConfig {
    fn default() -> Self {
        Self {
            engine: CopyEngine::Auto,
            workers: 0,
            batch: 0,
        }
    }
}

/// What the module can do (`VMTIER_IOC_QUERY`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// ABI version.
    pub abi_version: u64,
    /// Engines usable now.
    pub engines: Vec<CopyEngine>,
    /// Most ranges per call.
    pub max_ranges: u64,
    /// Most base pages per batch.
    pub max_batch: u64,
    /// Default base pages per batch.
    pub default_batch: u64,
    /// Most CPU copy threads a call may use.
    pub max_workers: u64,
    /// CPU copy threads of a call that asks for the default (ABI 2; 0 before).
    pub default_workers: u64,
    /// Online CPUs copy threads may run on (not isolated) (ABI 2; 0 before).
    pub housekeeping_cpus: u64,
    /// `VMTIER_MIGRATE_*` flags the module knows (ABI 2; 0 before).
    pub migrate_flags: u64,
    /// DMA channels held, by name.
    pub dma_channels: Vec<String>,
    /// The driver of each channel's device, as `dma_channels` (ABI 2).
    pub dma_drivers: Vec<String>,
}

/// Per-range result of one module call, in base pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeResult {
    /// First byte of the range.
    pub start: HostVirtAddr,
    /// Length in bytes.
    pub len: u64,
    /// Moved to the destination.
    pub moved: u64,
    /// Already on the destination.
    pub on_target: u64,
    /// Not populated.
    pub skipped_hole: u64,
    /// In PMD-mapped THPs, left whole.
    pub skipped_thp: u64,
    /// Busy (locked, under writeback, transient references), swapped out, in a
    /// PTE-mapped large folio, or whose DMA copy was given up.
    pub skipped_busy: u64,
    /// In VMAs the module cannot move (shared, file, hugetlb, I/O).
    pub skipped_shared: u64,
    /// Failed (no memory on the destination, copy error).
    pub failed: u64,
    /// Pinned for DMA (VFIO, io_uring fixed buffers...), or in a range backed off after
    /// being found pinned.
    pub skipped_pinned: u64,
    /// Also mapped by another process (copy-on-write after fork) or merged by KSM.
    pub skipped_sharers: u64,
}

impl RangeResult {
    /// Base pages of the range.
    pub fn pages(&self) -> u64 {
        self.len / PageSize::Base.bytes()
    }

    /// Every page is accounted as moved, already there, or not populated.
    pub fn complete(&self) -> bool {
        self.moved + self.on_target + self.skipped_hole == self.pages()
    }

    /// The pages in any of the counts (equals [`Self::pages`] for a processed range).
    pub fn accounted(&self) -> u64 {
        self.moved
            + self.on_target
            + self.skipped_hole
            + self.skipped_thp
            + self.skipped_busy
            + self.skipped_shared
            + self.failed
            + self.skipped_pinned
            + self.skipped_sharers
    }

    fn add(&mut self, o: &Self) {
        self.moved += o.moved;
        self.on_target += o.on_target;
        self.skipped_hole += o.skipped_hole;
        self.skipped_thp += o.skipped_thp;
        self.skipped_busy += o.skipped_busy;
        self.skipped_shared += o.skipped_shared;
        self.failed += o.failed;
        self.skipped_pinned += o.skipped_pinned;
        self.skipped_sharers += o.skipped_sharers;
    }

    fn from_raw(r: &uapi::VmtierRange) -> Self {
        Self {
            start: HostVirtAddr::new(r.start),
            len: r.len,
            moved: r.moved,
            on_target: r.on_target,
            skipped_hole: r.skipped_hole,
            skipped_thp: r.skipped_thp,
            skipped_busy: r.skipped_busy,
            skipped_shared: r.skipped_shared,
            failed: r.failed,
            skipped_pinned: r.skipped_pinned,
            skipped_sharers: r.skipped_sharers,
        }
    }
}

/// The result of one [`Kmod::migrate_ranges`] call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmodReport {
    /// One result per range, in request order.
    pub ranges: Vec<RangeResult>,
    /// Engine of the last batch that copied.
    pub engine_used: Option<CopyEngine>,
    /// CPU engine: threads (the calling one included) that copied; DMA: most channels that
    /// copied in one batch.
    pub workers_used: u64,
    /// Pages whose DMA copy failed and that the CPU copied.
    pub dma_fallbacks: u64,
    /// Pages left in place because their DMA copy could neither finish nor be stopped.
    pub dma_abandoned: u64,
    /// Pages unmapped for the copy (pages on the target, pinned, shared, holes and THPs
    /// are not).
    pub unmapped: u64,
    /// Batches that unmapped something.
    pub batches: u64,
    /// Pinned pages not sent to the module because their range is backed off after being
    /// found holding nothing else to move (counted in `skipped_pinned`; the range's other
    /// pages are reported as the last call found them).
    pub backed_off: u64,
    /// Calls that a signal interrupted and that were issued again.
    pub restarts: u32,
    /// Time spent allocating and copying, summed over the module's threads.
    pub copy_time: Duration,
    /// Time spent unmapping, summed over the module's threads.
    pub unmap_time: Duration,
    /// Time spent remapping, summed over the module's threads.
    pub remap_time: Duration,
    /// Time inside the module.
    pub total_time: Duration,
}

impl KmodReport {
    /// Sum of a per-range count.
    pub fn sum(&self, f: impl Fn(&RangeResult) -> u64) -> u64 {
        self.ranges.iter().map(f).sum()
    }
}

/// Why a module call failed, with the errno kept for tests.
#[derive(Debug, thiserror::Error)]
pub enum KmodError {
    /// `/dev/vmtier` could not be opened (module not loaded, no permission).
    #[error("Cannot open {DEVICE}")]
    Open(#[source] io::Error),
    /// The ioctl failed.
    #[error("vmtier ioctl failed")]
    Ioctl(#[source] io::Error),
    /// The kernel's own checks for moving another process's pages (ptrace access and
    /// the LSM hook, run through a zero-page `move_pages(2)`) refused.
    #[error("The kernel refuses moving this process's pages")]
    Access(#[source] io::Error),
}

impl KmodError {
    /// The errno of the failure.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Open(e) | Self::Ioctl(e) | Self::Access(e) => e.raw_os_error(),
        }
    }

    fn into_migrate_error(self, pid: ProcessId, node: NodeId) -> Error {
        match (&self, self.errno()) {
            (_, Some(libc::ESRCH)) => Error::ProcessGone(pid),
            (Self::Access(_), _) | (_, Some(libc::EPERM)) => Error::PermissionDenied(pid),
            (_, Some(libc::ENODEV | libc::EACCES)) => Error::NodeUnavailable(node),
            (_, Some(libc::EINVAL | libc::E2BIG)) => Error::InvalidRequest(self.to_string()),
            _ => Error::Io(match self {
                Self::Open(e) | Self::Ioctl(e) | Self::Access(e) => e,
            }),
        }
    }
}

/// `(struct vmtier_query, struct vmtier_migrate)` sizes of this ABI.
const CURRENT_SIZES: (usize, usize) = (
    std::mem::size_of::<uapi::VmtierQuery>(),
    std::mem::size_of::<uapi::VmtierMigrate>(),
);

/// Calls a range stays backed off after being found pinned: doubles on each retry that
/// still finds it pinned, up to this.
const MAX_BACKOFF_CALLS: u64 = 64;

/// Interrupted calls issued again before giving up with `EINTR`.
const MAX_RESTARTS: u32 = 8;

/// A range found pinned, skipped until call `until`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Backoff {
    pid: ProcessId,
    start: u64,
    end: u64,
    until: u64,
    calls: u64,
    /// What the last call found in the range.
    last: RangeResult,
}

/// One piece of a requested range: sent to the module, or backed off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    range: usize,
    start: u64,
    end: u64,
    backed_off: bool,
}

/// Splits `ranges` around the active back-off intervals (sorted, disjoint).
fn split_backed_off(ranges: &[(u64, u64)], active: &[(u64, u64)]) -> Vec<Piece> {
    let mut out = Vec::with_capacity(ranges.len());
    for (k, &(start, len)) in ranges.iter().enumerate() {
        let end = start.saturating_add(len);
        let mut at = start;
        for &(s, e) in active.iter().filter(|&&(s, e)| s < end && e > start) {
            let (s, e) = (s.max(start), e.min(end));
            if s > at {
                out.push(Piece {
                    range: k,
                    start: at,
                    end: s,
                    backed_off: false,
                });
            }
            out.push(Piece {
                range: k,
                start: s,
                end: e,
                backed_off: true,
            });
            at = e;
        }
        if at < end || start == end {
            out.push(Piece {
                range: k,
                start: at,
                end,
                backed_off: false,
            });
        }
    }
    out
}

/// Ranges found holding nothing but pinned pages, skipped for a while, per process.
#[derive(Debug, Default)]
struct PinBackoff {
    entries: Vec<Backoff>,
    /// `migrate_ranges` calls so far (the back-off clock).
    calls: u64,
}

impl PinBackoff {
    fn tick(&mut self) {
        self.calls += 1;
    }

    /// The active back-off intervals of `pid`, sorted.
    fn active(&self, pid: ProcessId) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self
            .entries
            .iter()
            .filter(|b| b.pid == pid && b.until > self.calls)
            .map(|b| (b.start, b.end))
            .collect();
        v.sort_unstable();
        v
    }

    /// Records what a module call found about pinned pages in `piece`.
    fn note(&mut self, pid: ProcessId, piece: &Piece, r: &RangeResult) {
        let prev = self
            .entries
            .iter()
            .position(|b| b.pid == pid && b.start < piece.end && b.end > piece.start);
        // Back off only when the pins are all that is left to do in the piece.
        let only_pins = r.skipped_pinned > 0
            && r.moved + r.on_target + r.skipped_hole + r.skipped_pinned == r.pages();
        match (prev, only_pins) {
            (Some(i), true) => {
                let b = &mut self.entries[i];
                b.calls = (b.calls * 2).min(MAX_BACKOFF_CALLS);
                b.until = self.calls + b.calls;
                if (b.start, b.end) == (piece.start, piece.end) {
                    b.last = *r;
                } else {
                    b.start = b.start.min(piece.start);
                    b.end = b.end.max(piece.end);
                    b.last = RangeResult::default();
                }
            }
            (None, true) => self.entries.push(Backoff {
                pid,
                start: piece.start,
                end: piece.end,
                until: self.calls + 1,
                calls: 1,
                last: *r,
            }),
            (Some(i), false) if r.skipped_pinned == 0 => {
                self.entries.swap_remove(i);
            }
            _ => {}
        }
    }

    /// What a backed-off piece is reported as: the last call's findings when the piece is
    /// the range that was found pinned (moved pages are now on the target), else all
    /// pinned.
    fn replay(&self, pid: ProcessId, piece: &Piece) -> RangeResult {
        let pages = (piece.end - piece.start) / PageSize::Base.bytes();
        let exact = self
            .entries
            .iter()
            .find(|b| b.pid == pid && (b.start, b.end) == (piece.start, piece.end));
        match exact {
            Some(b) if b.last.pages() == pages && b.last.skipped_pinned > 0 => RangeResult {
                on_target: b.last.moved + b.last.on_target,
                skipped_hole: b.last.skipped_hole,
                skipped_pinned: b.last.skipped_pinned,
                ..Default::default()
            },
            _ => RangeResult {
                skipped_pinned: pages,
                ..Default::default()
            },
        }
    }

    fn forget(&mut self, pid: ProcessId) {
        self.entries.retain(|b| b.pid != pid);
    }
}

/// The module migrator.
#[derive(Debug)]
pub struct Kmod {
    dev: File,
    config: KmodConfig,
    flags: u64,
    backoff: PinBackoff,
    /// Structure sizes the module takes: the current ones, or the first version's when
    /// an ABI 1 module refuses the current ones with `ENOTTY`.
    sizes: std::cell::Cell<(usize, usize)>,
}

impl Kmod {
    /// Opens [`DEVICE`].
    pub fn open(config: KmodConfig) -> Result<Self, KmodError> {
        Self::open_path(Path::new(DEVICE), config)
    }

    /// Opens the device at `path`.
    pub fn open_path(path: &Path, config: KmodConfig) -> Result<Self, KmodError> {
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(KmodError::Open)?;
        Ok(Self {
            dev,
            config,
            flags: 0,
            backoff: PinBackoff::default(),
            sizes: std::cell::Cell::new(CURRENT_SIZES),
        })
    }

    fn set_flag(mut self, flag: u64, yes: bool) -> Self {
        if yes {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
        self
    }

    /// Count pages of VMAs the module cannot move as skipped instead of failing the call
    /// with `EOPNOTSUPP`.
    pub fn skip_unsupported(self, yes: bool) -> Self {
        self.set_flag(uapi::MIGRATE_SKIP_UNSUPPORTED, yes)
    }

    /// Also move pages that other processes map too (copy-on-write after fork, KSM):
    /// they then move for every process that maps them. Off by default.
    pub fn move_shared(self, yes: bool) -> Self {
        self.set_flag(uapi::MIGRATE_SHARED, yes)
    }

    /// The configuration in use.
    pub fn config(&self) -> KmodConfig {
        self.config
    }

    /// Changes the engine, workers and batch of later calls.
    pub fn set_config(&mut self, config: KmodConfig) {
        self.config = config;
    }

    /// Issues one raw ioctl. `arg` must be the structure `cmd` names.
    ///
    /// # Safety
    /// `arg` must point to a live, writable structure at least as large as the size `cmd`
    /// encodes, and any user pointers inside it must be valid for what the module reads
    /// and writes.
    pub unsafe fn raw_ioctl<T>(&self, cmd: u64, arg: *mut T) -> io::Result<()> {
        // SAFETY: the caller guarantees that arg matches cmd; the fd is our open device.
        let r = unsafe { libc::ioctl(self.dev.as_raw_fd(), cmd as libc::c_ulong, arg) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Issues `VMTIER_IOC_{QUERY,MIGRATE}` (`nr`) on `arg` with the sizes the module
    /// takes, falling back for good to the first version's when it refuses the current
    /// ones with `ENOTTY` (an ABI 1 module).
    fn sized_ioctl<T>(&self, nr: u64, arg: &mut T) -> io::Result<()> {
        for _ in 0..2 {
            let (qs, ms) = self.sizes.get();
            let size = if nr == uapi::IOC_NR_QUERY { qs } else { ms };
            // SAFETY: the structure's first field; every vmtier structure starts with
            // its size as a u64.
            unsafe { std::ptr::from_mut(arg).cast::<u64>().write(size as u64) };
            // SAFETY: arg is a VmtierQuery or VmtierMigrate (checked by the callers), at
            // least `size` bytes long and live across the call.
            let r = unsafe {
                self.raw_ioctl(
                    uapi::iowr(uapi::IOC_MAGIC, nr, size),
                    std::ptr::from_mut(arg),
                )
            };
            match r {
                Err(e) if e.raw_os_error() == Some(libc::ENOTTY) && (qs, ms) == CURRENT_SIZES => {
                    self.sizes
                        .set((uapi::QUERY_SIZE_VER1, uapi::MIGRATE_SIZE_VER1));
                }
                r => return r,
            }
        }
        Err(io::Error::from_raw_os_error(libc::ENOTTY))
    }

    /// The ABI the module speaks, as far as this migrator has seen (1 after an ABI 1
    /// module refused the current structures).
    pub fn abi(&self) -> u64 {
        if self.sizes.get() == CURRENT_SIZES {
            uapi::ABI_VERSION
        } else {
            1
        }
    }

    /// Asks the module what it can do.
    pub fn query(&self) -> Result<Capabilities, KmodError> {
        let mut q = uapi::VmtierQuery::default();
        self.sized_ioctl(uapi::IOC_NR_QUERY, &mut q)
            .map_err(KmodError::Ioctl)?;
        let mut engines = Vec::new();
        for e in [CopyEngine::Auto, CopyEngine::Cpu, CopyEngine::Dma] {
            if q.engines & (1 << e.raw()) != 0 {
                engines.push(e);
            }
        }
        let n = usize::try_from(q.nr_dma_chans)
            .unwrap_or(0)
            .min(uapi::MAX_DMA_CHANS);
        let names = |raw: &[[u8; uapi::DMA_NAME_LEN]]| -> Vec<String> {
            raw[..n]
                .iter()
                .map(|raw| {
                    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                    String::from_utf8_lossy(&raw[..end]).into_owned()
                })
                .collect()
        };
        Ok(Capabilities {
            abi_version: q.abi_version,
            engines,
            max_ranges: q.max_ranges,
            max_batch: q.max_batch,
            default_batch: q.default_batch,
            max_workers: q.max_workers,
            default_workers: q.default_workers,
            housekeeping_cpus: q.housekeeping_cpus,
            migrate_flags: q.migrate_flags,
            dma_channels: names(&q.dma_names),
            dma_drivers: names(&q.dma_drivers),
        })
    }

    /// The kernel's own permission checks for moving `pid`'s pages, which the module
    /// cannot call (`ptrace_may_access()`, `security_task_movememory()` are not exported):
    /// `move_pages(2)` with zero pages runs exactly those and moves nothing.
    pub fn check_access(pid: ProcessId) -> Result<(), KmodError> {
        if pid.raw() == 0 || u32::try_from(pid.raw()).ok() == Some(std::process::id()) {
            return Ok(());
        }
        // SAFETY: move_pages with count 0 reads and writes no array (all null).
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_pages,
                pid.raw(),
                0usize,
                std::ptr::null::<*const libc::c_void>(),
                std::ptr::null::<libc::c_int>(),
                std::ptr::null_mut::<libc::c_int>(),
                0,
            )
        };
        if r < 0 {
            Err(KmodError::Access(io::Error::last_os_error()))
        } else {
            Ok(())
        }
    }

    /// Forgets what was learnt about `pid` (it exited, or its layout changed).
    pub fn forget(&mut self, pid: ProcessId) {
        self.backoff.forget(pid);
    }

    /// One `VMTIER_IOC_MIGRATE` for `raw`, issued again (up to [`MAX_RESTARTS`] times)
    /// when a signal interrupts it; the counts of every attempt are added up.
    fn ioctl_migrate(
        &self,
        pid: ProcessId,
        node: NodeId,
        raw: &mut [uapi::VmtierRange],
        report: &mut KmodReport,
    ) -> Result<Vec<RangeResult>, KmodError> {
        let mut sums: Vec<RangeResult> = raw.iter().map(RangeResult::from_raw).collect();
        let mut moved_before = vec![0u64; raw.len()];
        for attempt in 0..=MAX_RESTARTS {
            let mut m = uapi::VmtierMigrate {
                size: std::mem::size_of::<uapi::VmtierMigrate>() as u64,
                flags: self.flags,
                pid: u64::try_from(pid.raw()).unwrap_or(u64::MAX),
                node: u64::from(node.raw()),
                ranges: raw.as_mut_ptr() as u64,
                nr_ranges: raw.len() as u64,
                engine: self.config.engine.raw(),
                workers: u64::from(self.config.workers),
                batch: u64::from(self.config.batch),
                ..Default::default()
            };
            // `ranges` points to `nr_ranges` VmtierRange entries in `raw`, which outlives
            // the call and is writable.
            let r = self.sized_ioctl(uapi::IOC_NR_MIGRATE, &mut m);
            if m.engine_used != 0 {
                report.engine_used = Some(CopyEngine::from_raw(m.engine_used));
                report.workers_used = m.workers_used;
            }
            report.dma_fallbacks += m.dma_fallbacks;
            report.dma_abandoned += m.dma_abandoned;
            report.unmapped += m.unmapped;
            report.batches += m.batches;
            report.copy_time += Duration::from_nanos(m.copy_ns);
            report.unmap_time += Duration::from_nanos(m.unmap_ns);
            report.remap_time += Duration::from_nanos(m.remap_ns);
            report.total_time += Duration::from_nanos(m.total_ns);
            let interrupted = matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EINTR));
            if interrupted && attempt < MAX_RESTARTS {
                // Pages moved so far are on the target next time: keep their count.
                for (mb, x) in moved_before.iter_mut().zip(raw.iter()) {
                    *mb += x.moved;
                }
                report.restarts += 1;
                continue;
            }
            r.map_err(KmodError::Ioctl)?;
            for ((s, x), mb) in sums.iter_mut().zip(raw.iter()).zip(&moved_before) {
                let mut res = RangeResult::from_raw(x);
                res.moved += mb;
                res.on_target = res.on_target.saturating_sub(*mb);
                *s = res;
            }
            break;
        }
        Ok(sums)
    }

    /// Moves `ranges` (`(start, len)`, page aligned) of `pid` to `node`, up to
    /// [`uapi::MAX_RANGES`] ranges per ioctl. Another process is first checked with the
    /// kernel's own `move_pages(2)` permission checks ([`Self::check_access`]). Ranges
    /// found holding nothing but pinned pages are not sent again for a while (1, 2, 4 …
    /// 64 calls): their pages are reported in `skipped_pinned` and `backed_off`. On an
    /// error the counts of earlier calls are lost; the module's own partial counts are
    /// only in the raw ioctl.
    pub fn migrate_ranges(
        &mut self,
        pid: ProcessId,
        ranges: &[(HostVirtAddr, u64)],
        node: NodeId,
    ) -> Result<KmodReport, KmodError> {
        Self::check_access(pid)?;
        self.backoff.tick();
        let mut report = KmodReport {
            ranges: ranges
                .iter()
                .map(|&(start, len)| RangeResult {
                    start,
                    len,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let raw_ranges: Vec<(u64, u64)> = ranges.iter().map(|&(s, l)| (s.raw(), l)).collect();
        let pieces = split_backed_off(&raw_ranges, &self.backoff.active(pid));
        let (sent, held): (Vec<Piece>, Vec<Piece>) = pieces.iter().partition(|p| !p.backed_off);
        for p in &held {
            let r = self.backoff.replay(pid, p);
            report.backed_off += r.skipped_pinned;
            report.ranges[p.range].add(&r);
        }
        let max = usize::try_from(uapi::MAX_RANGES).unwrap_or(usize::MAX);
        for chunk in sent.chunks(max) {
            let mut raw: Vec<uapi::VmtierRange> = chunk
                .iter()
                .map(|p| uapi::VmtierRange {
                    start: p.start,
                    len: p.end - p.start,
                    ..Default::default()
                })
                .collect();
            let res = match self.ioctl_migrate(pid, node, &mut raw, &mut report) {
                Ok(res) => res,
                Err(e) => {
                    if e.errno() == Some(libc::ESRCH) {
                        self.backoff.forget(pid);
                    }
                    return Err(e);
                }
            };
            for (p, r) in chunk.iter().zip(&res) {
                report.ranges[p.range].add(r);
                self.backoff.note(pid, p, r);
            }
        }
        Ok(report)
    }
}

/// Contiguous runs of base pages: `(start, len, index of the first page)`.
fn coalesce(pages: &[PageRef]) -> Vec<(HostVirtAddr, u64, usize)> {
    let mut runs: Vec<(HostVirtAddr, u64, usize)> = Vec::new();
    for (i, p) in pages.iter().enumerate() {
        let len = p.size.bytes();
        match runs.last_mut() {
            Some((start, l, _)) if start.checked_add(*l) == Some(p.addr) => *l += len,
            _ => runs.push((p.addr, len, i)),
        }
    }
    runs
}

/// Per-page outcomes from a residency query of pages not fully accounted by the module.
fn requery(
    pid: ProcessId,
    pages: &[PageRef],
    target: NodeId,
    out: &mut [PageOutcome],
) -> Result<(), Error> {
    let addrs: Vec<HostVirtAddr> = pages.iter().map(|p| p.addr).collect();
    for (o, q) in out.iter_mut().zip(query_nodes(pid, &addrs)?) {
        *o = match q {
            NodeQuery::On(n) if n == target => PageOutcome::OnTarget,
            NodeQuery::On(_) => PageOutcome::Busy,
            NodeQuery::NotPresent => PageOutcome::NotPresent,
            NodeQuery::Errno(libc::EFAULT) => PageOutcome::Fault,
            NodeQuery::Errno(e) => PageOutcome::Other(e),
        };
    }
    Ok(())
}

impl Migrator for Kmod {
    fn name(&self) -> &'static str {
        "kmod"
    }

    fn migrate(
        &mut self,
        pid: ProcessId,
        pages: &[PageRef],
        target: NodeId,
    ) -> Result<MigrationReport, Error> {
        let start = Instant::now();
        let runs = coalesce(pages);
        let ranges: Vec<(HostVirtAddr, u64)> = runs.iter().map(|r| (r.0, r.1)).collect();
        let kr = self
            .migrate_ranges(pid, &ranges, target)
            .map_err(|e| e.into_migrate_error(pid, target))?;
        let mut outcomes = vec![PageOutcome::OnTarget; pages.len()];
        let mut bytes = 0;
        for (i, (run, res)) in runs.iter().zip(&kr.ranges).enumerate() {
            let end = runs.get(i + 1).map_or(pages.len(), |r| r.2);
            bytes += res.moved * PageSize::Base.bytes();
            let all_moved = res.moved + res.on_target == res.pages();
            if !all_moved {
                requery(pid, &pages[run.2..end], target, &mut outcomes[run.2..end])?;
            }
        }
        Ok(MigrationReport {
            outcomes,
            bytes_on_target: bytes,
            elapsed: start.elapsed(),
            ..MigrationReport::default()
        })
    }
}

/// The module for private anonymous memory mapped by 4 KiB entries, `move_pages(2)` for
/// THPs, shared and file-backed ranges and whatever the module skipped.
#[derive(Debug)]
pub struct Combined {
    kmod: Option<Kmod>,
    move_pages: MovePages,
    /// Per process, `(start, end)` of address ranges known not to be private anonymous.
    not_private_anon: Vec<(ProcessId, Vec<(u64, u64)>)>,
}

impl Combined {
    /// Uses the module when `/dev/vmtier` opens, and `move_pages` (with `batch` pages
    /// per call, `move_shared` as in [`MovePages::new`]) for the rest.
    pub fn new(config: KmodConfig, batch: usize, move_shared: bool) -> Self {
        let kmod = Kmod::open(config).ok().map(|k| k.skip_unsupported(true));
        Self::with_kmod(kmod, MovePages::new(batch, move_shared))
    }

    /// Explicit parts (tests).
    pub fn with_kmod(kmod: Option<Kmod>, move_pages: MovePages) -> Self {
        Self {
            kmod: kmod.map(|k| k.skip_unsupported(true)),
            move_pages,
            not_private_anon: Vec::new(),
        }
    }

    /// Routes the shared and file-backed ranges of `layout` straight to `move_pages`.
    pub fn set_layout(&mut self, layout: &GuestMemoryLayout) {
        let ranges = layout
            .ranges
            .iter()
            .filter(|r| r.backing != Backing::PrivateAnon)
            .map(|r| (r.hva.raw(), r.hva.raw().saturating_add(r.len)))
            .collect();
        self.remove_layout(layout.pid);
        self.not_private_anon.push((layout.pid, ranges));
    }

    /// Whether the module is in use.
    pub fn has_kmod(&self) -> bool {
        self.kmod.is_some()
    }

    #[cfg(test)]
    fn for_kmod(&self, pid: ProcessId, p: &PageRef) -> bool {
        for_kmod(ranges_of(&self.not_private_anon, pid), p)
    }
}

/// The ranges of `pid` known not to be private anonymous.
fn ranges_of(table: &[(ProcessId, Vec<(u64, u64)>)], pid: ProcessId) -> &[(u64, u64)] {
    table
        .iter()
        .find(|e| e.0 == pid)
        .map_or(&[], |e| e.1.as_slice())
}

/// A base page outside the ranges known not to be private anonymous.
fn for_kmod(not_private_anon: &[(u64, u64)], p: &PageRef) -> bool {
    p.size == PageSize::Base
        && !not_private_anon
            .iter()
            .any(|&(s, e)| (s..e).contains(&p.addr.raw()))
}

impl Migrator for Combined {
    fn name(&self) -> &'static str {
        if self.kmod.is_some() {
            "kmod+move_pages"
        } else {
            "move_pages"
        }
    }

    fn migrate(
        &mut self,
        pid: ProcessId,
        pages: &[PageRef],
        target: NodeId,
    ) -> Result<MigrationReport, Error> {
        let start = Instant::now();
        let mut outcomes = vec![PageOutcome::Busy; pages.len()];
        let mut bytes = 0;
        let mut fallback_pages = 0u64;
        let mut fallback_error = None;
        // Pages for move_pages, as indices into `pages`.
        let mut rest: Vec<usize>;
        if let Some(kmod) = self.kmod.as_mut() {
            let not_anon = ranges_of(&self.not_private_anon, pid);
            let (mine, other): (Vec<usize>, Vec<usize>) =
                (0..pages.len()).partition(|&i| for_kmod(not_anon, &pages[i]));
            rest = other;
            let sub: Vec<PageRef> = mine.iter().map(|&i| pages[i]).collect();
            let runs = coalesce(&sub);
            let ranges: Vec<(HostVirtAddr, u64)> = runs.iter().map(|r| (r.0, r.1)).collect();
            match kmod.migrate_ranges(pid, &ranges, target) {
                Ok(kr) => {
                    for (k, (run, res)) in runs.iter().zip(&kr.ranges).enumerate() {
                        let end = runs.get(k + 1).map_or(sub.len(), |r| r.2);
                        bytes += res.moved * PageSize::Base.bytes();
                        let idx = &mine[run.2..end];
                        if res.moved + res.on_target == res.pages() {
                            for &i in idx {
                                outcomes[i] = PageOutcome::OnTarget;
                            }
                            continue;
                        }
                        // Which pages are where now: holes are done, pinned and shared pages
                        // are final for this call (the caller retries later, with back-off);
                        // the rest (THP, other VMAs, busy, failed) goes to move_pages.
                        let mut here = vec![PageOutcome::Busy; idx.len()];
                        requery(pid, &sub[run.2..end], target, &mut here)?;
                        let move_pages_can =
                            res.skipped_thp + res.skipped_shared + res.skipped_busy + res.failed
                                > 0;
                        for (&i, o) in idx.iter().zip(here) {
                            if o == PageOutcome::Busy && move_pages_can {
                                rest.push(i);
                                fallback_pages += 1;
                            } else {
                                outcomes[i] = o;
                            }
                        }
                    }
                }
                Err(e) => match e.errno() {
                    Some(libc::ESRCH | libc::EPERM | libc::EACCES | libc::ENODEV) => {
                        return Err(e.into_migrate_error(pid, target))
                    }
                    // Anything else (an old module, a refused range): move_pages does it,
                    // and the caller hears why.
                    _ => {
                        rest.extend_from_slice(&mine);
                        fallback_pages += mine.len() as u64;
                        fallback_error = Some(vmtier_core::error_chain(&e));
                    }
                },
            }
        } else {
            rest = (0..pages.len()).collect();
        }
        if !rest.is_empty() {
            rest.sort_unstable();
            let sub: Vec<PageRef> = rest.iter().map(|&i| pages[i]).collect();
            let r = self.move_pages.migrate(pid, &sub, target)?;
            bytes += r.bytes_on_target;
            for (&i, o) in rest.iter().zip(r.outcomes) {
                outcomes[i] = o;
            }
        }
        Ok(MigrationReport {
            outcomes,
            bytes_on_target: bytes,
            elapsed: start.elapsed(),
            fallback_pages,
            fallback_error,
        })
    }

    fn add_layout(&mut self, layout: &GuestMemoryLayout) {
        self.set_layout(layout);
    }

    fn remove_layout(&mut self, pid: ProcessId) {
        self.not_private_anon.retain(|e| e.0 != pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(addr: u64) -> PageRef {
        PageRef {
            addr: HostVirtAddr::new(addr),
            size: PageSize::Base,
        }
    }

    #[test]
    fn coalesce_joins_contiguous_pages() {
        let pages = [base(0x1000), base(0x2000), base(0x5000), base(0x6000)];
        let runs = coalesce(&pages);
        assert_eq!(
            runs,
            vec![
                (HostVirtAddr::new(0x1000), 0x2000, 0),
                (HostVirtAddr::new(0x5000), 0x2000, 2)
            ]
        );
    }

    #[test]
    fn combined_without_module_routes_everything_to_move_pages() {
        let mut c = Combined::with_kmod(None, MovePages::default());
        assert!(!c.has_kmod());
        assert_eq!(c.name(), "move_pages");
        let huge = PageRef {
            addr: HostVirtAddr::new(0x20_0000),
            size: PageSize::Huge,
        };
        let (p, q) = (ProcessId::new(10), ProcessId::new(11));
        assert!(!c.for_kmod(p, &huge));
        assert!(c.for_kmod(p, &base(0x1000)));
        // A shared range of process p goes to move_pages; the same address in q does not.
        let shared = GuestMemoryLayout::new(
            p,
            vec![vmtier_core::GuestRamRange {
                name: "memfd".into(),
                gpa: vmtier_core::GuestPhysAddr(0),
                hva: HostVirtAddr::new(0x1000),
                len: 0x1000,
                backing: Backing::Shared,
            }],
        )
        .unwrap();
        c.add_layout(&shared);
        assert!(!c.for_kmod(p, &base(0x1000)));
        assert!(c.for_kmod(q, &base(0x1000)));
        c.remove_layout(p);
        assert!(c.for_kmod(p, &base(0x1000)));
    }

    #[test]
    fn backed_off_intervals_split_ranges() {
        let p = split_backed_off(&[(0x1000, 0x9000), (0x20000, 0x1000)], &[(0x3000, 0x5000)]);
        let got: Vec<(usize, u64, u64, bool)> = p
            .iter()
            .map(|p| (p.range, p.start, p.end, p.backed_off))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0x1000, 0x3000, false),
                (0, 0x3000, 0x5000, true),
                (0, 0x5000, 0xa000, false),
                (1, 0x20000, 0x21000, false),
            ]
        );
        // A zero-length range still reaches the module (which refuses it).
        assert_eq!(split_backed_off(&[(0x1000, 0)], &[]).len(), 1);
    }

    #[test]
    fn pinned_ranges_back_off_exponentially_and_reset() {
        let pid = ProcessId::new(7);
        let piece = Piece {
            range: 0,
            start: 0x10_0000,
            end: 0x20_0000,
            backed_off: false,
        };
        let pinned = RangeResult {
            len: 0x10_0000,
            on_target: 56,
            skipped_pinned: 200,
            ..Default::default()
        };
        let mut b = PinBackoff::default();
        let mut skipped = Vec::new();
        for _ in 0..12 {
            b.tick();
            let active = !b.active(pid).is_empty();
            skipped.push(active);
            if !active {
                b.note(pid, &piece, &pinned);
            }
        }
        // Tried at calls 1, 2, 4, 8: skipped for 1, 2, 4 calls in between.
        let tried: Vec<usize> = (0..12).filter(|&i| !skipped[i]).map(|i| i + 1).collect();
        assert_eq!(tried, vec![1, 2, 4, 8]);
        assert!(b.active(ProcessId::new(8)).is_empty());
        // Unpinned: the next try that finds no pins forgets the range.
        while !b.active(pid).is_empty() {
            b.tick();
        }
        let free = RangeResult {
            len: 0x10_0000,
            moved: 256,
            ..Default::default()
        };
        b.note(pid, &piece, &free);
        assert!(b.entries.is_empty());
        // A range with movable pages left besides the pins is not backed off.
        let mixed = RangeResult {
            len: 0x10_0000,
            skipped_busy: 10,
            skipped_pinned: 246,
            ..Default::default()
        };
        b.note(pid, &piece, &mixed);
        assert!(b.entries.is_empty());
    }

    #[test]
    fn engine_names_round_trip() {
        for e in [CopyEngine::Auto, CopyEngine::Cpu, CopyEngine::Dma] {
            assert_eq!(e.name().parse::<CopyEngine>(), Ok(e));
            assert_eq!(CopyEngine::from_raw(e.raw()), e);
            // The configuration's spelling is the same name.
            let json = format!("\"{}\"", e.name());
            assert_eq!(serde_json::to_string(&e).unwrap(), json);
            assert_eq!(serde_json::from_str::<CopyEngine>(&json).unwrap(), e);
        }
        assert!(serde_json::from_str::<CopyEngine>("\"gpu\"").is_err());
    }
}
