//! Write tracking with soft-dirty bits, for hosts without DAMON vaddr.
//!
//! Each window starts by writing `4` to `/proc/PID/clear_refs`, which clears the soft-dirty
//! bit of every page of the process (the *whole* process, not just guest RAM) and
//! write-protects them; the next write to a page faults once and sets its bit again. A
//! `collect` then finds the soft-dirty pages of the guest ranges and starts a new window:
//!
//! - with the `PAGEMAP_SCAN` ioctl (Linux 6.7+) on the `/proc/PID/pagemap` fd: the kernel
//!   walks the page tables and returns runs of soft-dirty pages (`PAGE_IS_SOFT_DIRTY`), a
//!   few hundred runs per call;
//! - else by `pread` of the 64-bit pagemap entries (bit 55 = soft-dirty), 64 Ki pages
//!   (256 MiB of address space) per call.
//!
//! Each tick is one sample: written runs are reported as 1 hit of 1 sample, the rest of the
//! guest ranges as 0 of 1 (so a page written once gains heat 3, one written every tick
//! climbs 3, 4, 5: [`vmtier_core::policy::HeatRecord::heat_gain`]). Reads are
//! invisible to this source: read-mostly hot memory looks cold. On a KVM host the guest's
//! writes reach the bits because clearing them write-protects the host PTEs, whose MMU
//! notifiers make KVM drop its writable EPT entries; the guest's next write faults through
//! the host page tables. Cost: `clear_refs` walks the whole process's page tables each
//! window, and every first write to a page per window takes a fault.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;

use vmtier_core::hotness::{self, HotnessSource};
use vmtier_core::pagemap::{self, PageRegion, PAGE_IS_SOFT_DIRTY, SCAN_BATCH};
use vmtier_core::{GuestMemoryLayout, HostVirtAddr, ProcessId, RegionAccess};

use crate::damon::process_alive;

const PAGE: u64 = 4096;
const PAGE_BYTES: usize = 4096;
/// Pagemap entries read per `pread`.
const PAGEMAP_BATCH: usize = 64 * 1024;
/// Pagemap entry bit: the page is soft-dirty.
const PM_SOFT_DIRTY: u64 = 1 << 55;

/// Errors of the soft-dirty source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Opening a /proc file failed.
    #[error("Failed to open {0}")]
    Open(String, #[source] std::io::Error),
    /// Clearing the soft-dirty bits failed.
    #[error("Failed to clear soft-dirty bits of process {0}")]
    ClearRefs(ProcessId, #[source] std::io::Error),
    /// Reading pagemap failed.
    #[error("Failed to read the pagemap of process {0}")]
    Pagemap(ProcessId, #[source] std::io::Error),
    /// The kernel does not track soft-dirty bits (CONFIG_MEM_SOFT_DIRTY off).
    #[error("Kernel does not set soft-dirty bits")]
    NoSoftDirty,
    /// The layout has no ranges.
    #[error("Guest memory layout has no RAM ranges")]
    NoRanges,
    /// The monitored process is gone.
    #[error("Monitored process {0} is gone")]
    Gone(ProcessId),
    /// `collect` before `attach`.
    #[error("Soft-dirty source is not attached")]
    NotAttached,
}

impl From<Error> for hotness::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Gone(_) => hotness::Error::Gone,
            Error::NoSoftDirty => hotness::Error::Unavailable(e.to_string()),
            other => hotness::Error::Io(std::io::Error::other(other)),
        }
    }
}

/// This process's id.
fn self_pid() -> ProcessId {
    ProcessId::new(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
}

/// How soft-dirty pages are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    /// The `PAGEMAP_SCAN` ioctl.
    Ioctl,
    /// `pread` of pagemap entries.
    Pagemap,
}

impl Scan {
    /// Short name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Scan::Ioctl => "PAGEMAP_SCAN",
            Scan::Pagemap => "pagemap",
        }
    }
}

#[derive(Debug)]
struct Attached {
    pid: ProcessId,
    pagemap: File,
    clear_refs: File,
    scan: Scan,
    ranges: Vec<(u64, u64)>,
}

/// Soft-dirty write tracking of a VMM process's guest RAM. See the module docs.
#[derive(Debug)]
pub struct SoftDirtySource {
    force: Option<Scan>,
    attached: Option<Attached>,
    entries: Vec<u64>,
    runs: Vec<PageRegion>,
}

impl Default for SoftDirtySource {
    fn default() -> Self {
        Self::new(None)
    }
}

fn open_proc(pid: ProcessId, name: &str, write: bool) -> Result<File, Error> {
    let path = format!("/proc/{}/{name}", pid.raw());
    OpenOptions::new()
        .read(!write)
        .write(write)
        .open(&path)
        .map_err(|e| {
            if e.kind() == ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) {
                Error::Gone(pid)
            } else {
                Error::Open(path, e)
            }
        })
}

/// Whether `PAGEMAP_SCAN` works on `pagemap` (tried on one page at `addr`).
fn scan_supported(pagemap: &File, addr: u64) -> bool {
    pagemap::supported(pagemap, addr, PAGE_IS_SOFT_DIRTY)
}

/// Appends `[start, end)`, written (`dirty`) or not, to `out` as one sample, merging with
/// the previous report when contiguous and alike.
fn push_run(out: &mut Vec<RegionAccess>, start: u64, end: u64, dirty: bool) {
    if start >= end {
        return;
    }
    let hits = u32::from(dirty);
    if let Some(last) = out.last_mut() {
        if last.hits == hits && last.end() == Some(HostVirtAddr::new(start)) {
            last.len += end - start;
            return;
        }
    }
    out.push(RegionAccess {
        start: HostVirtAddr::new(start),
        len: end - start,
        hits,
        samples: 1,
    });
}

/// Turns sorted dirty runs inside `[start, end)` into a full cover of the range.
fn cover(start: u64, end: u64, dirty: &[(u64, u64)], out: &mut Vec<RegionAccess>) {
    let mut at = start;
    for &(s, e) in dirty {
        let (s, e) = (s.max(start), e.min(end));
        if s >= e {
            continue;
        }
        push_run(out, at, s, false);
        push_run(out, s, e, true);
        at = e;
    }
    push_run(out, at, end, false);
}

impl SoftDirtySource {
    /// A detached source; `force` picks the scan method instead of probing.
    pub fn new(force: Option<Scan>) -> Self {
        Self {
            force,
            attached: None,
            entries: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// The scan method in use, if attached.
    pub fn scan(&self) -> Option<Scan> {
        self.attached.as_ref().map(|a| a.scan)
    }

    fn try_attach(&mut self, layout: &GuestMemoryLayout) -> Result<(), Error> {
        let mut ranges: Vec<(u64, u64)> = layout
            .ranges
            .iter()
            .filter_map(|r| Some((r.hva.raw(), r.hva_end()?.raw())))
            .collect();
        if ranges.is_empty() {
            return Err(Error::NoRanges);
        }
        ranges.sort_unstable();
        let pid = layout.pid;
        let pagemap = open_proc(pid, "pagemap", false)?;
        let mut clear_refs = open_proc(pid, "clear_refs", true)?;
        let scan = self.force.unwrap_or_else(|| {
            if scan_supported(&pagemap, ranges[0].0) {
                Scan::Ioctl
            } else {
                Scan::Pagemap
            }
        });
        clear(&mut clear_refs, pid)?;
        log::debug!("soft-dirty: pid {pid} with {}", scan.name());
        self.attached = Some(Attached {
            pid,
            pagemap,
            clear_refs,
            scan,
            ranges,
        });
        Ok(())
    }

    fn try_collect(&mut self, out: &mut Vec<RegionAccess>) -> Result<(), Error> {
        let a = self.attached.as_mut().ok_or(Error::NotAttached)?;
        let pid = a.pid;
        let mut dirty: Vec<(u64, u64)> = Vec::new();
        for &(start, end) in &a.ranges {
            dirty.clear();
            let r = match a.scan {
                Scan::Ioctl => {
                    self.runs.resize(SCAN_BATCH, PageRegion::default());
                    scan_dirty_ioctl(&a.pagemap, start, end, &mut self.runs, &mut dirty)
                }
                Scan::Pagemap => {
                    self.entries.resize(PAGEMAP_BATCH, 0);
                    scan_dirty_pagemap(&a.pagemap, start, end, &mut self.entries, &mut dirty)
                }
            };
            match r {
                Ok(true) => {}
                Ok(false) => return Err(Error::Gone(pid)),
                Err(e) if !process_alive(pid) => {
                    log::debug!("soft-dirty: pid {pid} gone ({e})");
                    return Err(Error::Gone(pid));
                }
                Err(e) => return Err(Error::Pagemap(pid, e)),
            }
            cover(start, end, &dirty, out);
        }
        clear(&mut a.clear_refs, pid)
    }
}

/// Starts a new window.
fn clear(f: &mut File, pid: ProcessId) -> Result<(), Error> {
    f.write_all(b"4").map_err(|e| {
        if e.raw_os_error() == Some(libc::ESRCH) || !process_alive(pid) {
            Error::Gone(pid)
        } else {
            Error::ClearRefs(pid, e)
        }
    })
}

/// Soft-dirty runs of `[start, end)` by `PAGEMAP_SCAN`. `Ok(false)` if the process has no
/// memory any more.
fn scan_dirty_ioctl(
    fd: &File,
    start: u64,
    end: u64,
    vec: &mut [PageRegion],
    dirty: &mut Vec<(u64, u64)>,
) -> std::io::Result<bool> {
    pagemap::runs(fd, start, end, PAGE_IS_SOFT_DIRTY, vec, dirty)?;
    Ok(true)
}

/// Soft-dirty runs of `[start, end)` by reading pagemap entries in batches. `Ok(false)` if
/// the process has no memory any more (pagemap reads return nothing).
fn scan_dirty_pagemap(
    fd: &File,
    start: u64,
    end: u64,
    buf: &mut [u64],
    dirty: &mut Vec<(u64, u64)>,
) -> std::io::Result<bool> {
    let mut at = start;
    while at < end {
        let pages = usize::try_from((end - at) / PAGE)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        // SAFETY: viewing initialized u64s as bytes; u8 has no alignment or validity needs.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), pages * 8) };
        let got = fd.read_at(bytes, (at / PAGE) * 8)?;
        if got == 0 {
            return Ok(false);
        }
        let n = got / 8;
        for (k, e) in buf[..n].iter().enumerate() {
            if e & PM_SOFT_DIRTY != 0 {
                let s = at + (k as u64) * PAGE;
                match dirty.last_mut() {
                    Some(last) if last.1 == s => last.1 = s + PAGE,
                    _ => dirty.push((s, s + PAGE)),
                }
            }
        }
        at += (n as u64) * PAGE;
    }
    Ok(true)
}

impl HotnessSource for SoftDirtySource {
    fn name(&self) -> &'static str {
        "soft-dirty"
    }

    fn attach(&mut self, layout: &GuestMemoryLayout) -> Result<(), hotness::Error> {
        self.detach();
        self.try_attach(layout).map_err(Into::into)
    }

    fn collect(&mut self, out: &mut Vec<RegionAccess>) -> Result<(), hotness::Error> {
        self.try_collect(out).map_err(Into::into)
    }

    fn detach(&mut self) {
        self.attached = None;
        self.entries = Vec::new();
        self.runs = Vec::new();
    }
}

/// Checks soft-dirty tracking works here, on this process: a fresh page is soft-dirty,
/// `clear_refs` clears it, a write sets it again. Returns the scan method that works.
/// Clears the soft-dirty bits of the calling process (harmless to it).
pub fn probe() -> Result<Scan, Error> {
    let me = self_pid();
    let pagemap = open_proc(me, "pagemap", false)?;
    let mut clear_refs = open_proc(me, "clear_refs", true)?;
    let mut page = Box::new([0u8; 2 * PAGE_BYTES]);
    // Touch both halves so that the aligned page inside is mapped.
    page.iter_mut().step_by(512).for_each(|b| *b = 1);
    let addr = (page.as_ptr() as u64).div_ceil(PAGE) * PAGE;
    let off = usize::try_from(addr - page.as_ptr() as u64).unwrap_or(0);
    let dirty = |pm: &File| -> Result<bool, Error> {
        let mut e = [0u8; 8];
        pm.read_exact_at(&mut e, (addr / PAGE) * 8)
            .map_err(|e| Error::Pagemap(me, e))?;
        Ok(u64::from_ne_bytes(e) & PM_SOFT_DIRTY != 0)
    };
    clear(&mut clear_refs, me)?;
    let after_clear = dirty(&pagemap)?;
    // SAFETY: `off < PAGE`, so `off` is inside the boxed buffer; a volatile write so the
    // store is not optimized away before the pagemap read.
    unsafe { std::ptr::write_volatile(page.as_mut_ptr().add(off), 2) };
    let after_write = dirty(&pagemap)?;
    if after_clear || !after_write {
        return Err(Error::NoSoftDirty);
    }
    Ok(if scan_supported(&pagemap, addr) {
        Scan::Ioctl
    } else {
        Scan::Pagemap
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_runs_cover_the_range() {
        let p = PAGE;
        type Case = (&'static str, Vec<(u64, u64)>, Vec<(u64, u64, u32)>);
        let cases: Vec<Case> = vec![
            ("clean", vec![], vec![(0, 8 * p, 0)]),
            ("all dirty", vec![(0, 8 * p)], vec![(0, 8 * p, 1)]),
            (
                "middle",
                vec![(2 * p, 3 * p), (5 * p, 6 * p)],
                vec![
                    (0, 2 * p, 0),
                    (2 * p, p, 1),
                    (3 * p, 2 * p, 0),
                    (5 * p, p, 1),
                    (6 * p, 2 * p, 0),
                ],
            ),
            (
                "clipped",
                vec![(7 * p, 20 * p)],
                vec![(0, 7 * p, 0), (7 * p, p, 1)],
            ),
            (
                "adjacent runs merge",
                vec![(0, p), (p, 2 * p)],
                vec![(0, 2 * p, 1), (2 * p, 6 * p, 0)],
            ),
        ];
        for (name, dirty, want) in cases {
            let mut out = Vec::new();
            cover(0, 8 * p, &dirty, &mut out);
            let got: Vec<_> = out.iter().map(|a| (a.start.raw(), a.len, a.hits)).collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn probe_and_track_own_writes() {
        // Soft-dirty may be missing where unit tests run; then there is nothing to check.
        let Ok(scan) = probe() else { return };
        for s in [Scan::Pagemap, scan] {
            let mut buf = vec![0u8; 64 * PAGE_BYTES];
            let base = (buf.as_ptr() as u64).div_ceil(PAGE) * PAGE;
            let layout = GuestMemoryLayout::new(
                self_pid(),
                vec![vmtier_core::GuestRamRange {
                    name: "buf".into(),
                    gpa: vmtier_core::GuestPhysAddr(0),
                    hva: HostVirtAddr::new(base),
                    len: 32 * PAGE,
                    backing: vmtier_core::Backing::PrivateAnon,
                }],
            )
            .unwrap();
            let mut src = SoftDirtySource::new(Some(s));
            src.attach(&layout).unwrap();
            let off = usize::try_from(base - buf.as_ptr() as u64).unwrap();
            let i = off + 5 * PAGE_BYTES;
            // SAFETY: i is inside buf; volatile so the write happens before collect.
            unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 7) };
            let mut out = Vec::new();
            src.collect(&mut out).unwrap();
            let hot: Vec<_> = out
                .iter()
                .filter(|a| a.hits == 1)
                .map(|a| (a.start.raw() - base) / PAGE)
                .collect();
            assert_eq!(hot, vec![5], "{s:?}: {out:?}");
            assert_eq!(out.iter().map(|a| a.len).sum::<u64>(), 32 * PAGE);
        }
    }
}
