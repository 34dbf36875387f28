//! Migrators over the vmtier kernel module (`/dev/vmtier`, see `docs/kmod.md`).
//!
//! - [`Kmod`]: the module alone. It moves private anonymous memory mapped by 4 KiB entries
//!   in batches (unmap batch, parallel copy, remap batch), and leaves THPs, shared and
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
    /// CPU copy threads available.
    pub max_workers: u64,
    /// DMA channels found, by name.
    pub dma_channels: Vec<String>,
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
    /// Busy, pinned, swapped out or in a PTE-mapped large folio.
    pub skipped_busy: u64,
    /// In VMAs the module cannot move (shared, file, hugetlb, I/O).
    pub skipped_shared: u64,
    /// Failed (no memory on the destination, copy error).
    pub failed: u64,
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
}

/// The result of one [`Kmod::migrate_ranges`] call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmodReport {
    /// One result per range, in request order.
    pub ranges: Vec<RangeResult>,
    /// Copy engine of the last batch that copied.
    pub engine_used: Option<CopyEngine>,
    /// Threads or channels of that batch.
    pub workers_used: u64,
    /// Pages whose DMA copy failed and that the CPU copied.
    pub dma_fallbacks: u64,
    /// Time spent allocating and copying.
    pub copy_time: Duration,
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
}

impl KmodError {
    /// The errno of the failure.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Open(e) | Self::Ioctl(e) => e.raw_os_error(),
        }
    }

    fn into_migrate_error(self, pid: ProcessId, node: NodeId) -> Error {
        match self.errno() {
            Some(libc::ESRCH) => Error::ProcessGone(pid),
            Some(libc::EPERM) => Error::PermissionDenied(pid),
            Some(libc::ENODEV | libc::EACCES) => Error::NodeUnavailable(node),
            Some(libc::EINVAL | libc::E2BIG) => Error::InvalidRequest(self.to_string()),
            _ => Error::Io(match self {
                Self::Open(e) | Self::Ioctl(e) => e,
            }),
        }
    }
}

/// The module migrator.
#[derive(Debug)]
pub struct Kmod {
    dev: File,
    config: KmodConfig,
    flags: u64,
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
        })
    }

    /// Count pages of VMAs the module cannot move as skipped instead of failing the call
    /// with `EOPNOTSUPP`.
    pub fn skip_unsupported(mut self, yes: bool) -> Self {
        if yes {
            self.flags |= uapi::MIGRATE_SKIP_UNSUPPORTED;
        } else {
            self.flags &= !uapi::MIGRATE_SKIP_UNSUPPORTED;
        }
        self
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
    /// `arg` must point to a live, writable structure of the type `cmd` encodes, and any
    /// user pointers inside it must be valid for what the module reads and writes.
    pub unsafe fn raw_ioctl<T>(&self, cmd: u64, arg: *mut T) -> io::Result<()> {
        // SAFETY: the caller guarantees that arg matches cmd; the fd is our open device.
        let r = unsafe { libc::ioctl(self.dev.as_raw_fd(), cmd as libc::c_ulong, arg) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Asks the module what it can do.
    pub fn query(&self) -> Result<Capabilities, KmodError> {
        let mut q = uapi::VmtierQuery::default();
        // SAFETY: IOC_QUERY takes a VmtierQuery, which lives across the call.
        unsafe { self.raw_ioctl(uapi::IOC_QUERY, &mut q) }.map_err(KmodError::Ioctl)?;
        let mut engines = Vec::new();
        for e in [CopyEngine::Auto, CopyEngine::Cpu, CopyEngine::Dma] {
            if q.engines & (1 << e.raw()) != 0 {
                engines.push(e);
            }
        }
        let n = usize::try_from(q.nr_dma_chans)
            .unwrap_or(0)
            .min(uapi::MAX_DMA_CHANS);
        let dma_channels = q.dma_names[..n]
            .iter()
            .map(|raw| {
                let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
                String::from_utf8_lossy(&raw[..end]).into_owned()
            })
            .collect();
        Ok(Capabilities {
            abi_version: q.abi_version,
            engines,
            max_ranges: q.max_ranges,
            max_batch: q.max_batch,
            default_batch: q.default_batch,
            max_workers: q.max_workers,
            dma_channels,
        })
    }

    /// Moves `ranges` (`(start, len)`, page aligned) of `pid` to `node`, up to
    /// [`uapi::MAX_RANGES`] ranges per ioctl. On an error the counts of earlier calls
    /// are lost; the module's own partial counts are only in the raw ioctl.
    pub fn migrate_ranges(
        &mut self,
        pid: ProcessId,
        ranges: &[(HostVirtAddr, u64)],
        node: NodeId,
    ) -> Result<KmodReport, KmodError> {
        let mut report = KmodReport {
            ranges: Vec::with_capacity(ranges.len()),
            ..Default::default()
        };
        let max = usize::try_from(uapi::MAX_RANGES).unwrap_or(usize::MAX);
        for chunk in ranges.chunks(max) {
            let mut raw: Vec<uapi::VmtierRange> = chunk
                .iter()
                .map(|&(start, len)| uapi::VmtierRange {
                    start: start.raw(),
                    len,
                    ..Default::default()
                })
                .collect();
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
            // SAFETY: IOC_MIGRATE takes a VmtierMigrate; `ranges` points to `nr_ranges`
            // VmtierRange entries in `raw`, which outlives the call and is writable.
            unsafe { self.raw_ioctl(uapi::IOC_MIGRATE, &mut m) }.map_err(KmodError::Ioctl)?;
            report.ranges.extend(raw.iter().map(|r| RangeResult {
                start: HostVirtAddr::new(r.start),
                len: r.len,
                moved: r.moved,
                on_target: r.on_target,
                skipped_hole: r.skipped_hole,
                skipped_thp: r.skipped_thp,
                skipped_busy: r.skipped_busy,
                skipped_shared: r.skipped_shared,
                failed: r.failed,
            }));
            if m.engine_used != 0 {
                report.engine_used = Some(CopyEngine::from_raw(m.engine_used));
                report.workers_used = m.workers_used;
            }
            report.dma_fallbacks += m.dma_fallbacks;
            report.copy_time += Duration::from_nanos(m.copy_ns);
            report.total_time += Duration::from_nanos(m.total_ns);
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
                        if res.moved + res.on_target == res.pages() {
                            for &i in &mine[run.2..end] {
                                outcomes[i] = PageOutcome::OnTarget;
                            }
                        } else {
                            // THP, shared or busy parts: move_pages decides page by page.
                            rest.extend_from_slice(&mine[run.2..end]);
                            fallback_pages += (end - run.2) as u64;
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
