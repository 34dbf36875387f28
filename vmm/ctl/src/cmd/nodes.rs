//! `vmtierctl nodes`: the host's NUMA nodes, their memory and memory tiers (from sysfs).

use std::path::Path;

use vmtier_core::ByteSize;

use crate::client::Error;

/// One node.
#[derive(Debug, PartialEq, Eq)]
pub struct Node {
    /// Node id.
    pub id: u32,
    /// MemTotal, bytes.
    pub total: u64,
    /// MemFree, bytes.
    pub free: u64,
    /// Whether it has CPUs.
    pub cpus: bool,
    /// The memory tier it is in, if the kernel reports tiers.
    pub tier: Option<u32>,
}

/// A `Node N MemTotal:  123 kB` value in bytes.
pub fn meminfo_bytes(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.split_whitespace().nth(2) == Some(key))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|kb| kb.parse::<u64>().ok())
        .and_then(|kb| kb.checked_mul(1024))
}

/// Whether `list` (`0-2,5`) contains `n`.
pub fn in_list(list: &str, n: u32) -> bool {
    list.trim()
        .split(',')
        .filter(|p| !p.is_empty())
        .any(|p| match p.split_once('-') {
            Some((a, b)) => {
                matches!((a.parse::<u32>(), b.parse::<u32>()), (Ok(a), Ok(b)) if a <= n && n <= b)
            }
            None => p.parse() == Ok(n),
        })
}

/// The nodes under `sys` (`/sys`).
pub fn read(sys: &Path) -> Vec<Node> {
    let base = sys.join("devices/system/node");
    let mut ids: Vec<u32> = std::fs::read_dir(&base)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    ids.sort_unstable();
    let tiers: Vec<(u32, String)> = std::fs::read_dir(sys.join("devices/virtual/memory_tiering"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    let t = e
                        .file_name()
                        .to_str()?
                        .strip_prefix("memory_tier")?
                        .parse()
                        .ok()?;
                    Some((t, std::fs::read_to_string(e.path().join("nodelist")).ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    ids.into_iter()
        .map(|id| {
            let dir = base.join(format!("node{id}"));
            let mem = std::fs::read_to_string(dir.join("meminfo")).unwrap_or_default();
            let cpus = std::fs::read_to_string(dir.join("cpulist")).unwrap_or_default();
            Node {
                id,
                total: meminfo_bytes(&mem, "MemTotal:").unwrap_or(0),
                free: meminfo_bytes(&mem, "MemFree:").unwrap_or(0),
                cpus: !cpus.trim().is_empty(),
                tier: tiers.iter().find(|(_, l)| in_list(l, id)).map(|(t, _)| *t),
            }
        })
        .collect()
}

pub fn run(json: bool) -> Result<(), Error> {
    let nodes = read(Path::new("/sys"));
    if nodes.is_empty() {
        return Err(Error::Refused(
            "No NUMA nodes in /sys/devices/system/node".into(),
        ));
    }
    for n in nodes {
        if json {
            println!(
                "{{\"node\":{},\"total_bytes\":{},\"free_bytes\":{},\"cpus\":{},\"tier\":{}}}",
                n.id,
                n.total,
                n.free,
                n.cpus,
                n.tier.map_or("null".into(), |t| t.to_string())
            );
        } else {
            println!(
                "node {}  {:>10} total  {:>10} free  {}  {}",
                n.id,
                ByteSize(n.total).to_string(),
                ByteSize(n.free).to_string(),
                if n.cpus { "CPUs   " } else { "no CPUs" },
                n.tier.map_or("no memory tier reported".into(), |t| format!(
                    "memory_tier{t}"
                ))
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_lists_and_meminfo_parse() {
        let cases = [
            ("0-1", 1, true),
            ("0-1", 2, false),
            ("0,3-4", 4, true),
            ("", 0, false),
            ("x", 0, false),
        ];
        for (l, n, want) in cases {
            assert_eq!(in_list(l, n), want, "{l} {n}");
        }
        let mem = "Node 1 MemTotal:        1048576 kB\nNode 1 MemFree:          524288 kB\n";
        assert_eq!(meminfo_bytes(mem, "MemTotal:"), Some(1 << 30));
        assert_eq!(meminfo_bytes(mem, "MemFree:"), Some(512 << 20));
        assert_eq!(meminfo_bytes(mem, "Nope:"), None);
    }
}
