//! Host set-up for the end-to-end benchmark: the kernel knobs each manager needs (restored as
//! found), the node-0 balloon that makes the DRAM every manager can reach equal, the memory
//! cgroup DAMOS is limited to, THP on or off, and readings of vmstat, node memory and
//! watermarks.

use std::collections::BTreeMap;
use std::fs;
use std::time::Duration;

use crate::mem::AnonBuf;

pub const PAGE: u64 = 4096;
const NUMAB: &str = "/proc/sys/kernel/numa_balancing";
const DEMOTION: &str = "/sys/kernel/mm/numa/demotion_enabled";
const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
const PCP_FRACTION_SYSCTL: &str = "/proc/sys/vm/percpu_pagelist_high_fraction";
const CGROUP: &str = "/sys/fs/cgroup";
/// The memory cgroup QEMU is started in, so DAMOS (paddr) can be limited to its memory.
pub const CGROUP_NAME: &str = "vmtier-bench";

fn write(path: &str, val: &str) -> Result<(), String> {
    fs::write(path, val).map_err(|e| format!("write {val:?} to {path}: {e}"))
}

pub fn read(path: &str) -> String {
    fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Every counter of /proc/vmstat.
pub fn vmstat_all() -> BTreeMap<String, u64> {
    fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// `MemFree` of a node, bytes: the buddy allocator's free pages, which the kernel's
/// watermarks (and so demotion and promotion) are judged against.
pub fn node_free(node: u32) -> u64 {
    crate::mem::NodeFree::of(node).buddy
}

/// The fields of a node's meminfo that say where its used memory is, besides what a manager
/// moved there: a manager that pushes the node below its watermarks (DAMOS allocates down to
/// `min`) wakes kswapd, which reclaims file pages there, so it can hold more than the free
/// memory it was given.
pub const NODE_MEMINFO: [&str; 12] = [
    "MemUsed",
    "FilePages",
    "Active(file)",
    "Inactive(file)",
    "AnonPages",
    "AnonHugePages",
    "Shmem",
    "Mlocked",
    "SReclaimable",
    "SUnreclaim",
    "PageTables",
    "KernelStack",
];

/// Writes dirty pages back and drops the clean page cache (`vm.drop_caches = 1`), so every
/// window starts with only the file pages its processes fault back in on node 0.
pub fn drop_page_cache() -> Result<(), String> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    write("/proc/sys/vm/drop_caches", "1")
}

/// [`NODE_MEMINFO`] of node `node`, bytes (a field the kernel does not give is left out).
pub fn node_meminfo(node: u32) -> BTreeMap<String, u64> {
    let text = fs::read_to_string(format!("/sys/devices/system/node/node{node}/meminfo"))
        .unwrap_or_default();
    parse_node_meminfo(&text)
}

fn parse_node_meminfo(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            // "Node 0 FilePages:     123456 kB"
            let (key, val) = l.split_once(':')?;
            let key = key.split_whitespace().nth(2)?;
            NODE_MEMINFO.contains(&key).then_some(())?;
            let kb: u64 = val.trim().strip_suffix("kB")?.trim().parse().ok()?;
            Some((key.to_owned(), kb << 10))
        })
        .collect()
}

/// A node's zone watermarks, summed over its zones, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Watermarks {
    pub min: u64,
    pub low: u64,
    pub high: u64,
    /// kswapd's target in NUMA balancing's tiering mode (`high` where the kernel has none).
    pub promo: u64,
}

impl Watermarks {
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({"min": self.min, "low": self.low, "high": self.high, "promo": self.promo})
    }
}

/// Reads a node's watermarks from /proc/zoneinfo.
pub fn watermarks(node: u32) -> Watermarks {
    let zi = fs::read_to_string("/proc/zoneinfo").unwrap_or_default();
    let mut inside = false;
    let mut w = Watermarks::default();
    for l in zi.lines() {
        if let Some(rest) = l.strip_prefix("Node ") {
            inside = rest.split(',').next() == Some(&node.to_string());
            continue;
        }
        let mut f = l.split_whitespace();
        if let (true, Some(k), Some(Ok(v)), None) =
            (inside, f.next(), f.next().map(str::parse::<u64>), f.next())
        {
            match k {
                "min" => w.min += v * PAGE,
                "low" => w.low += v * PAGE,
                "high" => w.high += v * PAGE,
                "promo" => w.promo += v * PAGE,
                _ => {}
            }
        }
    }
    if w.promo == 0 {
        w.promo = w.high;
    }
    w
}

/// Physical range `[start, end)` of a node's memory blocks.
pub fn node_phys_range(node: u32) -> Option<(u64, u64)> {
    let block =
        u64::from_str_radix(&read("/sys/devices/system/memory/block_size_bytes"), 16).ok()?;
    let ids: Vec<u64> = fs::read_dir(format!("/sys/devices/system/node/node{node}"))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("memory")?.parse().ok())
        .collect();
    Some((ids.iter().min()? * block, (ids.iter().max()? + 1) * block))
}

/// An mlock'ed anonymous buffer placed on node 0: DRAM the guest cannot get (mlocked pages
/// are unevictable, so demotion cannot move it either).
pub struct Balloon {
    _bufs: Vec<AnonBuf>,
    /// Bytes held.
    pub bytes: u64,
    /// Node 0's free memory before and after inflating.
    pub free_before: u64,
    pub free_after: u64,
    /// Node 0's free memory it aimed at.
    pub target_free: u64,
}

impl Balloon {
    /// Chunk of the balloon: it inflates and deflates by whole chunks.
    const CHUNK: u64 = 2 << 20;

    /// Inflates or deflates until node 0 has `target_free` bytes free, within a chunk (2 MiB).
    /// Node 0's free memory moves meanwhile (reclaim, per-CPU lists, THP, the VMM's own
    /// allocations), so it reads it again after each step, up to 6 times: a balloon that
    /// overshot gives chunks back instead of leaving a manager less DRAM than the others.
    pub fn inflate_to(target_free: u64) -> Result<Self, String> {
        let free_before = node_free(0);
        let mut bufs: Vec<AnonBuf> = Vec::new();
        for _ in 0..6 {
            let free = node_free(0);
            if free >= target_free.saturating_add(Self::CHUNK) {
                let chunks = (free - target_free) / Self::CHUNK;
                for _ in 0..chunks {
                    bufs.push(Self::chunk()?);
                }
            } else if free.saturating_add(Self::CHUNK) <= target_free && !bufs.is_empty() {
                let chunks = (target_free - free) / Self::CHUNK;
                let keep = bufs
                    .len()
                    .saturating_sub(usize::try_from(chunks).unwrap_or(usize::MAX));
                bufs.truncate(keep);
            } else {
                break;
            }
            // Let the per-CPU page lists settle before reading again.
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(Self {
            bytes: bufs.len() as u64 * Self::CHUNK,
            _bufs: bufs,
            free_before,
            free_after: node_free(0),
            target_free,
        })
    }

    /// One mlocked chunk on node 0.
    fn chunk() -> Result<AnonBuf, String> {
        let len = usize::try_from(Self::CHUNK).map_err(|e| e.to_string())?;
        let buf = AnonBuf::new_on_node(len, false, 0).map_err(|e| e.to_string())?;
        // SAFETY: mlock on our own mapping, all of which is populated.
        if unsafe { libc::mlock(buf.addr().raw() as *const libc::c_void, buf.len()) } != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        Ok(buf)
    }
}

/// Saves `numa_balancing`, `demotion_enabled` and THP's `enabled` and restores them when
/// dropped.
pub struct Knobs {
    numab: String,
    demotion: String,
    thp: String,
    pcp_fraction: String,
}

impl Knobs {
    pub fn save() -> Self {
        Self {
            numab: read(NUMAB),
            demotion: read(DEMOTION),
            thp: thp_mode(),
            pcp_fraction: read(PCP_FRACTION_SYSCTL),
        }
    }

    /// `numa_balancing`, `demotion_enabled` and `percpu_pagelist_high_fraction` as found:
    /// `"1/true/0"`.
    pub fn found(&self) -> String {
        format!("{}/{}/{}", self.numab, self.demotion, self.pcp_fraction)
    }

    /// The same three knobs now.
    pub fn now() -> String {
        format!(
            "{}/{}/{}",
            read(NUMAB),
            read(DEMOTION),
            read(PCP_FRACTION_SYSCTL)
        )
    }

    /// The fraction [`Knobs::pin_pcp_lists`] sets: each CPU's list at its floor (4 batches,
    /// about 1 MiB per zone and CPU on the testbed's 1 GiB nodes).
    pub const PCP_FRACTION: u32 = 4096;

    /// Keeps the per-CPU free page lists small and fixed for the whole bench, and waits (at
    /// most 5 s) until node 0's have drained to that size. By default (fraction 0) the
    /// kernel auto-tunes each CPU's list up to an eighth of the zone: tens of MiB on node 0
    /// here. Those pages are free, but neither `MemFree`, which the balloon is sized by, nor
    /// the watermark checks that gate NUMA balancing's promotions count them, while
    /// promotions allocate from them first: a kernel manager could use that much DRAM past
    /// the budget, a different amount in every run. Returns node 0's per-CPU pages, bytes.
    pub fn pin_pcp_lists() -> Result<u64, String> {
        write(PCP_FRACTION_SYSCTL, &Self::PCP_FRACTION.to_string())?;
        let floor = 8 << 20;
        let mut pcp = crate::mem::NodeFree::of(0).pcp;
        for _ in 0..25 {
            if pcp <= floor {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
            pcp = crate::mem::NodeFree::of(0).pcp;
        }
        Ok(pcp)
    }

    /// Sets `numa_balancing` and `demotion_enabled`.
    pub fn set_kernel_tiering(numab: &str, demotion: &str) -> Result<(), String> {
        write(NUMAB, numab)?;
        write(DEMOTION, demotion)
    }

    /// THP `always`, `madvise` or `never` for memory mapped from now on.
    pub fn set_thp(mode: &str) -> Result<(), String> {
        write(THP, mode)
    }
}

impl Drop for Knobs {
    fn drop(&mut self) {
        let _ = Self::set_kernel_tiering(&self.numab, &self.demotion);
        if !self.pcp_fraction.is_empty() {
            let _ = write(PCP_FRACTION_SYSCTL, &self.pcp_fraction);
        }
        if !self.thp.is_empty() {
            let _ = Self::set_thp(&self.thp);
        }
    }
}

/// The selected THP mode (the word in brackets).
pub fn thp_mode() -> String {
    let s = read(THP);
    s.split('[')
        .nth(1)
        .and_then(|r| r.split(']').next())
        .unwrap_or_default()
        .to_owned()
}

/// Moves this process into (`true`) or out of (`false`) the bench's memory cgroup: QEMU
/// started in between is charged there.
pub fn join_cgroup(inside: bool) -> Result<(), String> {
    let me = std::process::id().to_string();
    if inside {
        let _ = write(&format!("{CGROUP}/cgroup.subtree_control"), "+memory");
        let _ = fs::create_dir_all(format!("{CGROUP}/{CGROUP_NAME}"));
        write(&format!("{CGROUP}/{CGROUP_NAME}/cgroup.procs"), &me)
    } else {
        write(&format!("{CGROUP}/cgroup.procs"), &me)
    }
}

/// Removes the bench's cgroup (once its processes are gone).
pub fn remove_cgroup() {
    let _ = fs::remove_dir(format!("{CGROUP}/{CGROUP_NAME}"));
}

/// User + system CPU time of a process (or thread) in seconds, from /proc/PID/stat.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces and ends at the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[allow(clippy::cast_precision_loss)]
    let s = (utime + stime) as f64 / hz.max(1) as f64;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_meminfo_keeps_the_listed_fields_in_bytes() {
        let text = "Node 0 MemTotal:        9136344 kB\n\
                    Node 0 MemFree:         6892212 kB\n\
                    Node 0 Active(file):     686240 kB\n\
                    Node 0 Inactive(file):   479204 kB\n\
                    Node 0 Mlocked:           10516 kB\n\
                    Node 0 FilePages:       1174232 kB\n\
                    Node 0 AnonPages:        112384 kB\n\
                    Node 0 Shmem:            garbage kB\n\
                    Node 0 HugePages_Total:     0\n";
        let m = parse_node_meminfo(text);
        // (field, bytes; None: not kept)
        for (k, want) in [
            ("FilePages", Some(1_174_232u64 << 10)),
            ("Active(file)", Some(686_240 << 10)),
            ("Inactive(file)", Some(479_204 << 10)),
            ("AnonPages", Some(112_384 << 10)),
            ("Mlocked", Some(10_516 << 10)),
            ("Shmem", None),
            ("MemFree", None),
            ("HugePages_Total", None),
        ] {
            assert_eq!(m.get(k).copied(), want, "{k}");
        }
    }

    #[test]
    fn cpu_seconds_of_self_grows_while_spinning() {
        let first = cpu_seconds(std::process::id()).expect("own /proc/PID/stat");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while cpu_seconds(std::process::id()).unwrap_or(0.0) <= first {
            assert!(t.elapsed() < Duration::from_secs(20), "CPU time never grew");
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
    }
}
