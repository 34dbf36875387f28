//! Anonymous test buffers placed on a node, and the move_pages(2) round trip.

use std::fs;
use std::time::Instant;

use vmtier_core::migrate::{Migrator, PageOutcome, PageRef};
use vmtier_core::{ByteSize, GuestMemoryLayout, HostVirtAddr, NodeId, PageSize, ProcessId};
use vmtier_migrate::{MovePages, Residency};

use crate::check::Checks;

const HUGE: usize = 2 << 20;

/// A private anonymous mapping aligned to 2 MiB, unmapped on drop.
pub struct AnonBuf {
    map: *mut libc::c_void,
    map_len: usize,
    start: *mut u64,
    len: usize,
}

/// A fresh private anonymous read-write mapping of `len` bytes where the kernel chooses,
/// with `advice` (`MADV_HUGEPAGE`, `MADV_NOHUGEPAGE`) if given. The caller unmaps it.
pub fn map_anon(len: usize, advice: Option<libc::c_int>) -> std::io::Result<*mut libc::c_void> {
    // SAFETY: a fresh anonymous private mapping; no existing memory is affected; the result
    // is checked before use.
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
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    if let Some(a) = advice {
        // SAFETY: advice on the mapping just made, of its own length.
        unsafe { libc::madvise(p, len, a) };
    }
    Ok(p)
}

impl AnonBuf {
    /// Maps `len` bytes (a multiple of 2 MiB), with or without THP, bound to `node` while
    /// it is filled with [`pattern`], then left with the default policy.
    pub fn new_on_node(len: usize, thp: bool, node: u32) -> std::io::Result<Self> {
        let map_len = len + HUGE;
        let map = map_anon(map_len, None)?;
        let offset = (HUGE - (map as usize % HUGE)) % HUGE;
        // SAFETY: offset < HUGE, so start..start+len lies inside the mapping of len + HUGE.
        let start = unsafe { map.cast::<u8>().add(offset) }.cast::<u64>();
        let buf = Self {
            map,
            map_len,
            start,
            len,
        };
        let advice = if thp {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: the range is inside our own mapping.
        if unsafe { libc::madvise(start.cast(), len, advice) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut buf = buf;
        buf.mbind(Some(node))?;
        buf.words_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, w)| *w = pattern(i));
        buf.mbind(None)?;
        Ok(buf)
    }

    fn mbind(&self, node: Option<u32>) -> std::io::Result<()> {
        const MPOL_DEFAULT: libc::c_long = 0;
        const MPOL_BIND: libc::c_long = 2;
        let mask: libc::c_ulong = node.map_or(0, |n| 1 << n);
        let (mode, mask_ptr, maxnode) = match node {
            Some(_) => (MPOL_BIND, std::ptr::addr_of!(mask), 64),
            None => (MPOL_DEFAULT, std::ptr::null(), 0),
        };
        // SAFETY: the range is our own mapping; the kernel reads `maxnode` bits (one word)
        // from `mask`, which lives across the call, or nothing when the pointer is null.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.start,
                self.len,
                mode,
                mask_ptr,
                maxnode as libc::c_ulong,
                0,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// The buffer as 64-bit words.
    pub fn words(&self) -> &[u64] {
        // SAFETY: start is 2 MiB aligned and the len bytes stay mapped for the life of self.
        // Other threads may write through raw pointers (volatile, word-sized); readers only
        // compare values.
        unsafe { std::slice::from_raw_parts(self.start, self.len / 8) }
    }

    /// The buffer as mutable 64-bit words.
    pub fn words_mut(&mut self) -> &mut [u64] {
        // SAFETY: as in `words`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len / 8) }
    }

    /// Address of the first byte.
    pub fn addr(&self) -> HostVirtAddr {
        HostVirtAddr::new(self.start as u64)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Words that differ from [`pattern`].
    pub fn corrupted_words(&self) -> usize {
        self.words()
            .iter()
            .enumerate()
            .filter(|&(i, &w)| w != pattern(i))
            .count()
    }

    /// Bytes of THP (`AnonHugePages`) in the mapping that holds the buffer.
    pub fn anon_huge_bytes(&self) -> u64 {
        anon_huge_bytes_at("self", self.start as u64)
    }
}

/// Bytes of THP (`AnonHugePages`) in the mapping of process `pid` (`self` or a number) that
/// holds `addr`; 0 if none does.
pub fn anon_huge_bytes_at(pid: &str, addr: u64) -> u64 {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ') {
            if let Some((s, e)) = range.split_once('-') {
                if let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16)) {
                    inside = s <= addr && addr < e;
                    continue;
                }
            }
        }
        if inside {
            if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                return kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap_or(0)
                    << 10;
            }
        }
    }
    0
}

/// THP bytes of the mappings that hold the guest's RAM, each mapping counted once (the
/// RAM block's ranges below and above the PCI hole share one mapping).
pub fn guest_thp_bytes(layout: &GuestMemoryLayout) -> u64 {
    let pid = layout.pid.to_string();
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut starts: Vec<u64> = maps
        .lines()
        .filter_map(|l| {
            let (s, e) = l.split_whitespace().next()?.split_once('-')?;
            let (s, e) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            layout
                .ranges
                .iter()
                .any(|r| r.hva.raw() < e && s < r.hva.raw() + r.len)
                .then_some(s)
        })
        .collect();
    starts.dedup();
    starts.iter().map(|&s| anon_huge_bytes_at(&pid, s)).sum()
}

impl Drop for AnonBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in new_on_node; no references remain.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

/// The value of word `i`: address-dependent, so swapped or shifted pages are caught.
pub fn pattern(i: usize) -> u64 {
    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995_0000_0001
}

/// One counter from /proc/vmstat.
pub fn vmstat(name: &str) -> u64 {
    fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// A node's free memory, bytes: what its buddy allocator holds (`MemFree`) and what its
/// zones' per-CPU page lists hold. Pages on those lists are free too, but `MemFree` does not
/// count them, and with the kernel's per-CPU high auto-tuning (6.7+) they reach tens of MiB
/// per CPU: up to 106 MiB on the testbed's node 1 after a run of migrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFree {
    pub buddy: u64,
    pub pcp: u64,
}

impl NodeFree {
    /// Reads node `node`'s `MemFree` and its per-CPU list counts from /proc/zoneinfo.
    pub fn of(node: u32) -> Self {
        let meminfo = fs::read_to_string(format!("/sys/devices/system/node/node{node}/meminfo"))
            .unwrap_or_default();
        let buddy = meminfo
            .lines()
            .find_map(|l| {
                let kb = l.split_once("MemFree:")?.1.trim().strip_suffix("kB")?;
                kb.trim().parse::<u64>().ok()
            })
            .unwrap_or(0)
            << 10;
        let zoneinfo = fs::read_to_string("/proc/zoneinfo").unwrap_or_default();
        // SAFETY: sysconf has no preconditions.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        Self {
            buddy,
            pcp: pcp_pages(&zoneinfo, node) * page,
        }
    }

    pub fn total(self) -> u64 {
        self.buddy + self.pcp
    }
}

/// Pages on the per-CPU lists of node `node`'s zones, from /proc/zoneinfo's text: each
/// zone block starts with `Node N, zone NAME`, and each CPU's pageset gives a `count:` line.
fn pcp_pages(zoneinfo: &str, node: u32) -> u64 {
    let mut ours = false;
    let mut pages = 0;
    for line in zoneinfo.lines() {
        if let Some(rest) = line.strip_prefix("Node ") {
            ours = rest.split(',').next().and_then(|n| n.trim().parse().ok()) == Some(node);
        } else if ours {
            if let Some(n) = line.trim_start().strip_prefix("count:") {
                pages += n.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    pages
}

#[derive(clap::Args, Debug)]
pub struct MovePagesArgs {
    /// Buffer size (multiple of 2 MiB).
    #[arg(long, default_value = "64M")]
    size: ByteSize,
    /// Back the buffer with transparent huge pages and move one address per THP.
    #[arg(long)]
    thp: bool,
    /// Pages per move_pages(2) call.
    #[arg(long, default_value_t = vmtier_migrate::move_pages::DEFAULT_BATCH)]
    batch: usize,
}

pub fn move_pages(c: &mut Checks, a: &MovePagesArgs) {
    let kind = if a.thp { "THP" } else { "4K" };
    let Ok(len) = usize::try_from(a.size.0) else {
        return c.fatal("size", "does not fit in memory");
    };
    if len == 0 || len % HUGE != 0 {
        return c.fatal(
            "size",
            format!("{} is not a positive multiple of 2 MiB", a.size),
        );
    }
    let buf = match AnonBuf::new_on_node(len, a.thp, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate on node 1", e),
    };
    let pid = ProcessId::new(i32::try_from(std::process::id()).unwrap_or(0));
    let thp_bytes = buf.anon_huge_bytes();
    if a.thp {
        c.check(
            thp_bytes == len as u64,
            "buffer is THP-backed",
            format!("AnonHugePages {}", ByteSize(thp_bytes)),
        );
    } else {
        c.check(
            thp_bytes == 0,
            "buffer has no THP",
            format!("AnonHugePages {}", ByteSize(thp_bytes)),
        );
    }
    check_residency(c, pid, &buf, NodeId::new(1), "initial");

    let size = if a.thp {
        PageSize::Huge
    } else {
        PageSize::Base
    };
    let pages: Vec<PageRef> = buf
        .addr()
        .pages(len as u64, size)
        .map(|addr| PageRef { addr, size })
        .collect();
    let mut mover = MovePages::new(a.batch, false);
    for to in [0, 1] {
        let target = NodeId::new(to);
        let (mig0, thp0) = (vmstat("pgmigrate_success"), vmstat("thp_migration_success"));
        let t = Instant::now();
        let report = match mover.migrate(pid, &pages, target) {
            Ok(r) => r,
            Err(e) => return c.fatal(&format!("move {kind} to node {to}"), e),
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let on = report.count(PageOutcome::OnTarget);
        c.check(
            on == pages.len(),
            &format!("move {} of {kind} pages to node {to}", ByteSize(len as u64)),
            format!(
                "{on}/{} statuses on target, {ms:.0} ms ({})",
                pages.len(),
                crate::check::clock()
            ),
        );
        let moved = vmstat("pgmigrate_success") - mig0;
        c.check(
            moved >= len as u64 / 4096,
            &format!("kernel counted the {kind} migration to node {to}"),
            format!(
                "pgmigrate_success +{moved}, thp_migration_success +{}",
                vmstat("thp_migration_success") - thp0
            ),
        );
        check_residency(c, pid, &buf, target, &format!("after move to node {to}"));
        let bad = buf.corrupted_words();
        c.check(
            bad == 0,
            &format!("data intact after move to node {to}"),
            format!("{bad} corrupted words"),
        );
        if a.thp {
            let now = buf.anon_huge_bytes();
            c.check(
                now == thp_bytes,
                &format!("THPs moved whole to node {to}"),
                format!("AnonHugePages {}", ByteSize(now)),
            );
        }
    }
}

fn check_residency(c: &mut Checks, pid: ProcessId, buf: &AnonBuf, node: NodeId, when: &str) {
    match Residency::of_range(pid, buf.addr(), buf.len() as u64) {
        Ok(r) => c.check(
            r.on(node) == buf.len() as u64,
            &format!("{when}: every page on node {node}"),
            format!(
                "{:?}, not present {}, errors {}",
                r.per_node, r.not_present, r.errors
            ),
        ),
        Err(e) => c.check(false, &format!("{when}: residency query"), e),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZONEINFO: &str = "\
Node 0, zone      DMA
  pages free     3840
  pagesets
    cpu: 0
              count: 7
              high:  13
Node 0, zone   Normal
  pages free     220000
        nr_free_pages 220000
  pagesets
    cpu: 0
              count: 100
              high:  2000
    cpu: 1
              count: 20
              high:  2000
Node 1, zone  Movable
  pages free     244822
  pagesets
    cpu: 0
              count: 10748
              high:  15927
              high_min: 63
              high_max: 15927
    cpu: 1
              count: 0
              high:  0
";

    #[test]
    fn per_cpu_pages_are_counted_per_node() {
        for (node, want) in [(0, 127), (1, 10748), (2, 0)] {
            assert_eq!(pcp_pages(ZONEINFO, node), want, "node {node}");
        }
    }
}
