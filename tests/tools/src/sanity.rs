//! The tiered host looks like a CXL-equipped host: two memory tiers, node 1 CPU-less and in
//! the lower tier, DAMON sysfs with both operation sets, demotion available.

use std::fs;
use std::path::Path;

use crate::check::Checks;

fn read(path: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn write(path: &str, value: &str) -> bool {
    fs::write(path, value).is_ok()
}

/// `memory_tierN` → nodelist, sorted by N (a lower N is a faster tier).
fn memory_tiers() -> Vec<(u32, String)> {
    let mut tiers: Vec<(u32, String)> = fs::read_dir("/sys/devices/virtual/memory_tiering")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_prefix("memory_tier")?.parse().ok()?;
            Some((id, read(e.path().join("nodelist"))?))
        })
        .collect();
    tiers.sort();
    tiers
}

pub fn tiers(c: &mut Checks) {
    let tiers = memory_tiers();
    c.check(
        tiers.len() == 2 && tiers[0].1 == "0" && tiers[1].1 == "1",
        "two memory tiers, node 0 above node 1",
        format!("{tiers:?}"),
    );
    let cpus1 = read("/sys/devices/system/node/node1/cpulist").unwrap_or_else(|| "?".into());
    c.check(
        cpus1.is_empty(),
        "node 1 has no CPUs",
        format!("cpulist {cpus1:?}"),
    );
    for node in 0..2 {
        let meminfo =
            read(format!("/sys/devices/system/node/node{node}/meminfo")).unwrap_or_default();
        let total_kb: u64 = meminfo
            .lines()
            .find(|l| l.contains("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        c.check(
            total_kb > 32 << 10,
            &format!("node {node} has memory"),
            format!("{} MiB", total_kb >> 10),
        );
    }
    c.check(
        Path::new("/sys/kernel/mm/numa/demotion_enabled").exists(),
        "demotion knob present",
        "/sys/kernel/mm/numa/demotion_enabled",
    );

    // DAMON sysfs: create one kdamond with one context and list its operation sets.
    let admin = "/sys/kernel/mm/damon/admin/kdamonds";
    let ok = write(&format!("{admin}/nr_kdamonds"), "1")
        && write(&format!("{admin}/0/contexts/nr_contexts"), "1");
    let ops = read(format!("{admin}/0/contexts/0/avail_operations")).unwrap_or_default();
    c.check(
        ok && ops.split_whitespace().any(|o| o == "vaddr")
            && ops.split_whitespace().any(|o| o == "paddr"),
        "DAMON sysfs with vaddr and paddr",
        format!("avail_operations {ops:?}"),
    );
    c.check(
        write(&format!("{admin}/nr_kdamonds"), "0"),
        "DAMON sysfs reset",
        "nr_kdamonds=0",
    );
}
