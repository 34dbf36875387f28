//! Batched `move_pages(2)`.
//!
//! One syscall moves up to `batch` pages; a THP is passed by one address and moves whole.
//! The kernel reports per page either the node the page is now on or a negative errno.
//! Quirk (6.12): when several addresses fall in one THP, later ones may report `-EBUSY`
//! although the THP moved; busy pages are therefore re-queried before being called busy.

use std::io;
use std::time::Instant;

use vmtier_core::migrate::{
    Error, MigrationReport, Migrator, PageLocation, PageLocator, PageOutcome, PageRef,
};
use vmtier_core::{pagemap, HostVirtAddr, NodeId, PageSize, ProcessId};

/// `MPOL_MF_MOVE`: move pages mapped only by the target process.
const MPOL_MF_MOVE: libc::c_int = 1 << 1;
/// `MPOL_MF_MOVE_ALL`: also pages shared with other processes (needs `CAP_SYS_NICE`).
const MPOL_MF_MOVE_ALL: libc::c_int = 1 << 2;

/// Default pages per `move_pages(2)` call: large enough to amortise the syscall and the
/// batched TLB flush, small enough to keep the target's mmap_lock hold times short.
pub const DEFAULT_BATCH: usize = 512;

/// Raw `move_pages(2)`. `nodes == None` only queries. Returns the number of pages not
/// migrated, or the errno of a whole-call failure.
fn sys_move_pages(
    pid: ProcessId,
    addrs: &[*mut libc::c_void],
    nodes: Option<&[libc::c_int]>,
    status: &mut [libc::c_int],
    flags: libc::c_int,
) -> Result<usize, io::Error> {
    assert_eq!(addrs.len(), status.len());
    if let Some(n) = nodes {
        assert_eq!(n.len(), addrs.len());
    }
    let nodes_ptr = nodes.map_or(std::ptr::null(), <[libc::c_int]>::as_ptr);
    // SAFETY: the kernel reads `count` pointers from `addrs` and `nodes` (when not null) and
    // writes `count` ints to `status`; all three slices hold exactly `count` elements, as
    // asserted above. The addresses are only interpreted in the target's address space.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            libc::c_long::from(pid.raw()),
            addrs.len() as libc::c_ulong,
            addrs.as_ptr(),
            nodes_ptr,
            status.as_mut_ptr(),
            libc::c_long::from(flags),
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(usize::try_from(r).unwrap_or(usize::MAX))
    }
}

fn whole_call_error(e: io::Error, pid: ProcessId, target: Option<NodeId>) -> Error {
    match (e.raw_os_error(), target) {
        (Some(libc::ESRCH), _) => Error::ProcessGone(pid),
        (Some(libc::EPERM | libc::EACCES), _) => Error::PermissionDenied(pid),
        (Some(libc::ENODEV | libc::EINVAL), Some(node)) => Error::NodeUnavailable(node),
        _ => Error::Io(e),
    }
}

fn outcome(status: libc::c_int, target: NodeId) -> PageOutcome {
    match status {
        s if s >= 0 && s.unsigned_abs() == target.raw() => PageOutcome::OnTarget,
        // A non-negative status naming another node: the kernel left it there without error.
        s if s >= 0 => PageOutcome::Other(0),
        s => match -s {
            libc::ENOENT => PageOutcome::NotPresent,
            libc::EBUSY | libc::EAGAIN => PageOutcome::Busy,
            libc::ENOMEM => PageOutcome::NoMemory,
            libc::EFAULT => PageOutcome::Fault,
            errno => PageOutcome::Other(errno),
        },
    }
}

/// The node a queried page is on, or why it has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeQuery {
    /// Resident on this node.
    On(NodeId),
    /// Not populated.
    NotPresent,
    /// Any other errno (unmapped: `EFAULT`).
    Errno(i32),
}

/// Asks the kernel which node each address of `pid` is on, `batch` addresses per call.
pub fn query_nodes(pid: ProcessId, addrs: &[HostVirtAddr]) -> Result<Vec<NodeQuery>, Error> {
    let mut out = Vec::with_capacity(addrs.len());
    let mut ptrs = Vec::with_capacity(DEFAULT_BATCH * 8);
    let mut status = Vec::with_capacity(DEFAULT_BATCH * 8);
    for chunk in addrs.chunks(DEFAULT_BATCH * 8) {
        ptrs.clear();
        ptrs.extend(chunk.iter().map(|a| a.raw() as *mut libc::c_void));
        status.clear();
        status.resize(chunk.len(), 0);
        sys_move_pages(pid, &ptrs, None, &mut status, 0)
            .map_err(|e| whole_call_error(e, pid, None))?;
        out.extend(status.iter().map(|&s| match s {
            s if s >= 0 => NodeQuery::On(NodeId::new(s.unsigned_abs())),
            s if -s == libc::ENOENT => NodeQuery::NotPresent,
            s => NodeQuery::Errno(-s),
        }));
    }
    Ok(out)
}

/// Bytes of a range per node, from a page-by-page query.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Residency {
    /// `(node, bytes)` for every node holding some of the range, sorted by node.
    pub per_node: Vec<(NodeId, u64)>,
    /// Bytes not populated.
    pub not_present: u64,
    /// Bytes that could not be queried (unmapped, errors).
    pub errors: u64,
}

impl Residency {
    /// Queries every base page of `[start, start + len)` in `pid`.
    pub fn of_range(pid: ProcessId, start: HostVirtAddr, len: u64) -> Result<Self, Error> {
        let page = PageSize::Base.bytes();
        let addrs: Vec<HostVirtAddr> = start.base_pages(len).collect();
        let mut r = Self::default();
        for q in query_nodes(pid, &addrs)? {
            match q {
                NodeQuery::On(n) => match r.per_node.binary_search_by_key(&n, |e| e.0) {
                    Ok(i) => r.per_node[i].1 += page,
                    Err(i) => r.per_node.insert(i, (n, page)),
                },
                NodeQuery::NotPresent => r.not_present += page,
                NodeQuery::Errno(_) => r.errors += page,
            }
        }
        Ok(r)
    }

    /// Bytes on `node`.
    pub fn on(&self, node: NodeId) -> u64 {
        self.per_node
            .iter()
            .find(|e| e.0 == node)
            .map_or(0, |e| e.1)
    }
}

/// The `move_pages(2)` migrator.
#[derive(Debug)]
pub struct MovePages {
    batch: usize,
    flags: libc::c_int,
    ptrs: Vec<*mut libc::c_void>,
    nodes: Vec<libc::c_int>,
    status: Vec<libc::c_int>,
}

// SAFETY: the raw pointers in `ptrs` are addresses in another process, never dereferenced
// here; the buffers are only reused scratch space.
unsafe impl Send for MovePages {}

impl MovePages {
    /// A migrator calling `move_pages(2)` with up to `batch` pages per call. With
    /// `move_shared`, pages also mapped by other processes move too (`MPOL_MF_MOVE_ALL`,
    /// needs `CAP_SYS_NICE`), as guest RAM shared with a vhost-user backend is.
    pub fn new(batch: usize, move_shared: bool) -> Self {
        Self {
            batch: batch.max(1),
            flags: if move_shared {
                MPOL_MF_MOVE_ALL
            } else {
                MPOL_MF_MOVE
            },
            ptrs: Vec::new(),
            nodes: Vec::new(),
            status: Vec::new(),
        }
    }
}

impl Default for MovePages {
    fn default() -> Self {
        Self::new(DEFAULT_BATCH, false)
    }
}

impl Migrator for MovePages {
    fn name(&self) -> &'static str {
        "move_pages"
    }

    fn migrate(
        &mut self,
        pid: ProcessId,
        pages: &[PageRef],
        target: NodeId,
    ) -> Result<MigrationReport, Error> {
        let start = Instant::now();
        let node =
            libc::c_int::try_from(target.raw()).map_err(|_| Error::NodeUnavailable(target))?;
        let mut report = MigrationReport {
            outcomes: Vec::with_capacity(pages.len()),
            ..Default::default()
        };
        for chunk in pages.chunks(self.batch) {
            self.ptrs.clear();
            self.ptrs
                .extend(chunk.iter().map(|p| p.addr.raw() as *mut libc::c_void));
            self.nodes.clear();
            self.nodes.resize(chunk.len(), node);
            self.status.clear();
            self.status.resize(chunk.len(), 0);
            sys_move_pages(
                pid,
                &self.ptrs,
                Some(&self.nodes),
                &mut self.status,
                self.flags,
            )
            .map_err(|e| whole_call_error(e, pid, Some(target)))?;
            let first = report.outcomes.len();
            report
                .outcomes
                .extend(self.status.iter().map(|&s| outcome(s, target)));
            // The THP-tail quirk: a busy page may in fact have moved with its huge page.
            let busy: Vec<usize> = (first..report.outcomes.len())
                .filter(|&i| report.outcomes[i] == PageOutcome::Busy)
                .collect();
            if !busy.is_empty() {
                let addrs: Vec<HostVirtAddr> = busy.iter().map(|&i| pages[i].addr).collect();
                for (&i, q) in busy.iter().zip(query_nodes(pid, &addrs)?) {
                    if q == NodeQuery::On(target) {
                        report.outcomes[i] = PageOutcome::OnTarget;
                    }
                }
            }
        }
        report.bytes_on_target = pages
            .iter()
            .zip(&report.outcomes)
            .filter(|(_, &o)| o == PageOutcome::OnTarget)
            .map(|(p, _)| p.size.bytes())
            .sum();
        report.elapsed = start.elapsed();
        Ok(report)
    }
}

impl PageLocator for MovePages {
    fn locate(
        &mut self,
        pid: ProcessId,
        addrs: &[HostVirtAddr],
        out: &mut Vec<PageLocation>,
    ) -> Result<(), Error> {
        out.extend(query_nodes(pid, addrs)?.into_iter().map(|q| match q {
            NodeQuery::On(n) => PageLocation::On(n),
            NodeQuery::NotPresent => PageLocation::NotPresent,
            NodeQuery::Errno(_) => PageLocation::Unknown,
        }));
        Ok(())
    }

    /// `PAGEMAP_SCAN` for [`pagemap::PAGE_IS_HUGE`] on `/proc/PID/pagemap`, opened once for
    /// all `ranges`; `Ok(false)` before Linux 6.7 (no such ioctl).
    fn huge_runs(
        &mut self,
        pid: ProcessId,
        ranges: &[(HostVirtAddr, u64)],
        out: &mut Vec<(HostVirtAddr, u64)>,
    ) -> Result<bool, Error> {
        if ranges.is_empty() {
            return Ok(true);
        }
        let path = format!("/proc/{pid}/pagemap");
        let f = std::fs::File::open(&path).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT | libc::ESRCH) => Error::ProcessGone(pid),
            Some(libc::EPERM | libc::EACCES) => Error::PermissionDenied(pid),
            _ => Error::Io(e),
        })?;
        let mut vec = vec![pagemap::PageRegion::default(); pagemap::SCAN_BATCH];
        let mut runs = Vec::new();
        let first = out.len();
        for &(start, len) in ranges {
            let end = start
                .raw()
                .checked_add(len)
                .ok_or_else(|| Error::InvalidRequest(format!("range {start} + {len} overflows")))?;
            runs.clear();
            let res = pagemap::runs(
                &f,
                start.raw(),
                end,
                pagemap::PAGE_IS_HUGE,
                &mut vec,
                &mut runs,
            );
            match res {
                Ok(()) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                    out.truncate(first);
                    return Ok(false);
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    return Err(Error::ProcessGone(pid))
                }
                Err(e) => return Err(Error::Io(e)),
            }
            out.extend(runs.iter().map(|&(s, e)| (HostVirtAddr::new(s), e - s)));
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_outcomes() {
        let t = NodeId::new(1);
        let cases = [
            (1, PageOutcome::OnTarget),
            (0, PageOutcome::Other(0)),
            (-libc::ENOENT, PageOutcome::NotPresent),
            (-libc::EBUSY, PageOutcome::Busy),
            (-libc::ENOMEM, PageOutcome::NoMemory),
            (-libc::EFAULT, PageOutcome::Fault),
            (-libc::EACCES, PageOutcome::Other(libc::EACCES)),
        ];
        for (status, want) in cases {
            assert_eq!(outcome(status, t), want, "status {status}");
        }
    }

    /// Runs on any host: querying our own pages works, and node 0 always exists.
    #[test]
    fn query_and_move_own_pages_on_node0() {
        let pid = ProcessId::new(i32::try_from(std::process::id()).unwrap());
        let buf = vec![7u8; 16 * 4096];
        let base = buf.as_ptr() as u64 & !4095;
        let addrs: Vec<HostVirtAddr> = (1..8).map(|i| HostVirtAddr::new(base + i * 4096)).collect();
        let q = query_nodes(pid, &addrs).unwrap();
        assert!(q.iter().all(|n| matches!(n, NodeQuery::On(_))), "{q:?}");
        let pages: Vec<PageRef> = addrs
            .iter()
            .map(|&addr| PageRef {
                addr,
                size: PageSize::Base,
            })
            .collect();
        let node = match q[0] {
            NodeQuery::On(n) => n,
            _ => unreachable!(),
        };
        let r = MovePages::default().migrate(pid, &pages, node).unwrap();
        assert_eq!(r.count(PageOutcome::OnTarget), pages.len());
        assert_eq!(r.bytes_on_target, 7 * 4096);
        assert_eq!(
            buf.iter().map(|&b| u64::from(b)).sum::<u64>(),
            7 * 16 * 4096
        );
    }

    /// `AnonHugePages` of the mapping at `start` in /proc/self/smaps, in bytes.
    fn smaps_thp_bytes(start: u64) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, _)) = range.split_once('-') {
                    if let Ok(lo) = u64::from_str_radix(lo, 16) {
                        inside = lo == start;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(v) = line.strip_prefix("AnonHugePages:") {
                    let kb: u64 = v.trim().trim_end_matches(" kB").trim().parse().unwrap();
                    return kb * 1024;
                }
            }
        }
        panic!("no mapping at {start:#x} in /proc/self/smaps");
    }

    /// Runs on any host: the huge runs of an 8 MiB mapping of our own are exactly what smaps
    /// counts as `AnonHugePages` (THP may be off or fail to allocate: then both are 0), and
    /// none in a mapping that may not use THP.
    #[test]
    fn huge_runs_match_smaps() {
        let me = ProcessId::new(i32::try_from(std::process::id()).unwrap());
        let len = 8usize << 20;
        for (advice, may_be_huge) in [(libc::MADV_HUGEPAGE, true), (libc::MADV_NOHUGEPAGE, false)] {
            // SAFETY: a fresh private anonymous mapping, unmapped below; no other reference.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: `p` is our mapping of `len` bytes; advice and writes stay inside it.
            unsafe {
                libc::madvise(p, len, advice);
                std::ptr::write_bytes(p.cast::<u8>(), 1, len);
            }
            let start = p as u64;
            // The two halves in one call: both are read (a huge page across the cut is
            // reported in two parts, joined below).
            let half = (len / 2) as u64;
            let ranges = [
                (HostVirtAddr::new(start), half),
                (HostVirtAddr::new(start + half), half),
            ];
            let mut runs = Vec::new();
            let known = MovePages::default()
                .huge_runs(me, &ranges, &mut runs)
                .unwrap();
            let thp = smaps_thp_bytes(start);
            // SAFETY: unmapping the mapping made above, no longer used.
            unsafe { libc::munmap(p, len) };
            if !known {
                // Before Linux 6.7: the locator says so and reports nothing.
                assert!(runs.is_empty());
                continue;
            }
            let total: u64 = runs.iter().map(|r| r.1).sum();
            assert_eq!(total, thp, "advice {advice}: runs {runs:x?}");
            let mut joined: Vec<(HostVirtAddr, u64)> = Vec::new();
            for &(s, l) in &runs {
                match joined.last_mut() {
                    Some(last) if last.0.raw() + last.1 == s.raw() => last.1 += l,
                    _ => joined.push((s, l)),
                }
            }
            assert!(joined
                .iter()
                .all(|r| r.0.raw() % (2 << 20) == 0 && r.1 % (2 << 20) == 0));
            if !may_be_huge {
                assert_eq!(total, 0);
            }
        }
    }

    #[test]
    fn whole_call_errors_are_classified() {
        let me = ProcessId::new(i32::try_from(std::process::id()).unwrap());
        let nowhere = NodeId::new(4000);
        let page = PageRef {
            addr: HostVirtAddr::new(0x1000),
            size: PageSize::Base,
        };
        let err = MovePages::default()
            .migrate(me, &[page], nowhere)
            .unwrap_err();
        assert!(
            matches!(err, Error::NodeUnavailable(n) if n == nowhere),
            "{err:?}"
        );
        let gone = ProcessId::new(i32::MAX);
        let err = query_nodes(gone, &[page.addr]).unwrap_err();
        assert!(matches!(err, Error::ProcessGone(p) if p == gone), "{err:?}");
    }
}
