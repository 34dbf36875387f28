//! `bench-e2e`: the same workload guest (RAM starting on the CXL node, a hot set, a DRAM
//! budget) managed in turn by vmtierd, the kernel's NUMA balancing tiering mode and DAMOS
//! `migrate_hot`/`migrate_cold`, measured from outside once per second: where every 4 KiB
//! page of the guest is, how much of the hot set is in DRAM, how many pages moved and how many
//! moved back and forth. Figures are printed and written as JSON, never asserted: the run
//! fails only when something is broken (setup, guest corruption).
//!
//! The kernel managers have no per-VM budget, so the budget is made physical for all three
//! the same way: an mlock'ed balloon bound to node 0 (unevictable, so demotion cannot move
//! it) leaves node 0 with about budget + its promotion watermark free.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmtier_backends::qemu::QemuBackend;
use vmtier_core::migrate::Migrator;
use vmtier_core::{ByteSize, GuestMemoryLayout, NodeId};
use vmtier_migrate::{MovePages, NodeQuery};

use vmtier_sources::damon::sysfs as damon;

use crate::check::Checks;
use crate::daemon::Daemon;
use crate::guest::GuestPages;
use crate::guest::{num, residency, Guest};
use crate::mem::AnonBuf;

const PAGE: u64 = 4096;
const NUMAB: &str = "/proc/sys/kernel/numa_balancing";
const DEMOTION: &str = "/sys/kernel/mm/numa/demotion_enabled";
const CGROUP: &str = "/sys/fs/cgroup";
const CGROUP_NAME: &str = "vmtier-bench";
/// /proc/vmstat counters reported per manager (deltas over the window).
const COUNTERS: [&str; 10] = [
    "pgmigrate_success",
    "pgmigrate_fail",
    "pgpromote_success",
    "pgpromote_candidate",
    "pgdemote_kswapd",
    "pgdemote_direct",
    "numa_hint_faults",
    "numa_pages_migrated",
    "thp_migration_success",
    "thp_split_page",
];

#[derive(clap::Args, Debug)]
pub struct BenchE2eArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// Guest RAM.
    #[arg(long, default_value = "256M")]
    ram: ByteSize,
    /// Hot-set size.
    #[arg(long, default_value = "32M")]
    hot: ByteSize,
    /// DRAM budget (vmtierd's config; node 0's free memory for the kernel managers).
    #[arg(long, default_value = "64M")]
    budget: ByteSize,
    /// Seconds measured per manager, one sample (and one vmtierd tick) per second.
    #[arg(long, default_value_t = 35)]
    window: u64,
    /// The RAM backend's policy: `default` (no policy; the RAM is moved to node 1 after the
    /// fill), `preferred` or `bind` (host-nodes=1).
    #[arg(long, default_value = "default")]
    policy: String,
    /// Managers to run, comma-separated: vmtierd, numa-balancing, damos.
    #[arg(long, default_value = "vmtierd,numa-balancing,damos")]
    managers: String,
    /// DAMOS quota per scheme, per second.
    #[arg(long, default_value = "64M")]
    damos_quota: ByteSize,
    /// JSON output file.
    #[arg(long, default_value = "target/bench/e2e.json")]
    out: PathBuf,
}

fn write(path: &str, val: &str) -> Result<(), String> {
    fs::write(path, val).map_err(|e| format!("write {val:?} to {path}: {e}"))
}

fn read(path: &str) -> String {
    fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn vmstat_all() -> BTreeMap<String, u64> {
    fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// `MemFree` of a node, bytes.
fn node_free(node: u32) -> u64 {
    read(&format!("/sys/devices/system/node/node{node}/meminfo"))
        .lines()
        .find(|l| l.contains("MemFree:"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
        .unwrap_or(0)
        << 10
}

/// Sum of node 0's zone `promo` watermarks (kswapd's target in tiering mode), or `high`
/// where there is none, in bytes.
fn node_watermark(node: u32) -> u64 {
    let zi = fs::read_to_string("/proc/zoneinfo").unwrap_or_default();
    let (mut inside, mut promo, mut high) = (false, 0, 0);
    for l in zi.lines() {
        if let Some(rest) = l.strip_prefix("Node ") {
            inside = rest.split(',').next() == Some(&node.to_string());
            continue;
        }
        let mut w = l.split_whitespace();
        if let (true, Some(k), Some(v), None) = (inside, w.next(), w.next(), w.next()) {
            match (k, v.parse::<u64>()) {
                ("promo", Ok(v)) => promo += v,
                ("high", Ok(v)) => high += v,
                _ => {}
            }
        }
    }
    if promo > 0 {
        promo * PAGE
    } else {
        high * PAGE
    }
}

/// Physical range `[start, end)` of a node's memory blocks.
fn node_phys_range(node: u32) -> Option<(u64, u64)> {
    let block =
        u64::from_str_radix(&read("/sys/devices/system/memory/block_size_bytes"), 16).ok()?;
    let ids: Vec<u64> = fs::read_dir(format!("/sys/devices/system/node/node{node}"))
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("memory")?.parse().ok())
        .collect();
    Some((ids.iter().min()? * block, (ids.iter().max()? + 1) * block))
}

/// An mlock'ed anonymous buffer placed on a node: DRAM the guest cannot get (mlocked pages
/// are unevictable, so demotion cannot move it either).
struct Balloon {
    _buf: AnonBuf,
}

impl Balloon {
    fn inflate(len: usize, node: u32) -> std::io::Result<Self> {
        let buf = AnonBuf::new_on_node(len, false, node)?;
        // SAFETY: mlock on our own mapping, all of which is populated.
        if unsafe { libc::mlock(buf.addr().raw() as *const libc::c_void, buf.len()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { _buf: buf })
    }
}

/// Restores `numa_balancing` and `demotion_enabled` as found when dropped.
struct Sysctls {
    numab: String,
    demotion: String,
}

impl Sysctls {
    fn save() -> Self {
        Self {
            numab: read(NUMAB),
            demotion: read(DEMOTION),
        }
    }

    fn set(numab: &str, demotion: &str) -> Result<(), String> {
        write(NUMAB, numab)?;
        write(DEMOTION, demotion)
    }
}

impl Drop for Sysctls {
    fn drop(&mut self) {
        let _ = Self::set(&self.numab, &self.demotion);
    }
}

/// One DAMOS scheme.
struct Scheme {
    action: &'static str,
    target_nid: u32,
    nr_accesses: (u64, u64),
    age: (u64, u64),
    quota_bytes: u64,
    memcg: Option<String>,
    /// Physical range filtered out (`addr` filter, matching).
    exclude: Option<(u64, u64)>,
}

impl Scheme {
    fn to_sysfs(&self) -> damon::Scheme {
        let mut filters = Vec::new();
        if let Some(m) = &self.memcg {
            filters.push(damon::Filter::Memcg {
                path: m.clone(),
                matching: false,
            });
        }
        if let Some((start, end)) = self.exclude {
            filters.push(damon::Filter::Addr {
                start,
                end,
                matching: true,
            });
        }
        damon::Scheme {
            action: self.action,
            target_nid: Some(self.target_nid),
            pattern: damon::AccessPattern {
                nr_accesses: self.nr_accesses,
                age: self.age,
                ..damon::AccessPattern::ANY
            },
            quota: Some(damon::Quota {
                ms: 0,
                bytes: self.quota_bytes,
                reset_interval_ms: 1000,
                weights: (0, 1000, 1000),
            }),
            filters,
        }
    }
}

/// A kdamond set up through vmtier's DAMON sysfs driver (the one vmtierd's source uses);
/// turned off and its slot released when dropped.
struct Kdamond {
    sysfs: damon::Sysfs,
    slot: usize,
    schemes: Vec<(&'static str, u32)>,
}

impl Kdamond {
    /// ops `vaddr` with `pid`, or `paddr` over `region`.
    fn start(
        ops: &str,
        pid: Option<i32>,
        region: Option<(u64, u64)>,
        schemes: &[Scheme],
        goal_probe: &mut Option<bool>,
    ) -> Result<Self, String> {
        let sysfs = damon::Sysfs::new(damon::DEFAULT_ROOT);
        let slot = sysfs.claim(0).map_err(|e| vmtier_core::error_chain(&e))?;
        let k = Self {
            sysfs,
            slot,
            schemes: schemes.iter().map(|s| (s.action, s.target_nid)).collect(),
        };
        let ctx = damon::Context {
            ops: ops.into(),
            attrs: damon::Attrs::default(),
            targets: vec![damon::Target {
                pid: pid.map(vmtier_core::ProcessId::new),
                regions: region.into_iter().collect(),
            }],
            schemes: schemes.iter().map(Scheme::to_sysfs).collect(),
        };
        let err = |e: damon::Error| vmtier_core::error_chain(&e);
        k.sysfs.configure(slot, &ctx).map_err(err)?;
        if goal_probe.is_none() && !schemes.is_empty() {
            // A quota goal on node 0's use (what a tiering setup wants) — not in 6.12.
            *goal_probe = Some(k.sysfs.quota_goal_supported(slot, 0, "node_mem_used_bp"));
        }
        k.sysfs.command(slot, "on").map_err(err)?;
        Ok(k)
    }

    /// `(nr_tried, sz_tried, nr_applied, sz_applied, qt_exceeds)` per scheme.
    fn stats(&self) -> Vec<Value> {
        let _ = self.sysfs.command(self.slot, "update_schemes_stats");
        self.schemes
            .iter()
            .enumerate()
            .map(|(i, (action, nid))| {
                let st = self.sysfs.scheme_stats(self.slot, i).unwrap_or_default();
                json!({
                    "action": action,
                    "target_nid": nid,
                    "nr_tried": st.nr_tried,
                    "sz_tried": st.sz_tried,
                    "nr_applied": st.nr_applied,
                    "sz_applied": st.sz_applied,
                    "qt_exceeds": st.qt_exceeds,
                })
            })
            .collect()
    }
}

impl Drop for Kdamond {
    fn drop(&mut self) {
        let _ = self.sysfs.release(self.slot);
    }
}

fn kdamonds_on() -> usize {
    damon::Sysfs::new(damon::DEFAULT_ROOT).running()
}

/// Moves this process into (`Some`) or out of (`None`) the bench's memory cgroup: QEMU
/// started in between is charged there, so DAMOS (paddr) can be limited to its memory.
fn join_cgroup(inside: bool) -> Result<(), String> {
    let me = std::process::id().to_string();
    if inside {
        let _ = write(&format!("{CGROUP}/cgroup.subtree_control"), "+memory");
        let _ = fs::create_dir_all(format!("{CGROUP}/{CGROUP_NAME}"));
        write(&format!("{CGROUP}/{CGROUP_NAME}/cgroup.procs"), &me)
    } else {
        write(&format!("{CGROUP}/cgroup.procs"), &me)
    }
}

/// Per-page state over the window.
struct Tracker {
    pages: GuestPages,
    hot: (u64, u64),
    last: Vec<Option<u32>>,
    changes: Vec<u16>,
    hot_pages: u64,
}

impl Tracker {
    fn new(layout: &GuestMemoryLayout, hot: (u64, u64)) -> Self {
        let pages = GuestPages::new(layout);
        let n = pages.gpas().len();
        let hot_pages = pages
            .gpas()
            .iter()
            .filter(|&&g| g >= hot.0 && g < hot.0 + hot.1)
            .count() as u64;
        Self {
            pages,
            hot,
            last: vec![None; n],
            changes: vec![0; n],
            hot_pages,
        }
    }

    /// Queries every page once; returns (bytes on node 0, hot-set bytes on node 0).
    fn sample(&mut self) -> Result<(u64, u64), String> {
        let p = self.pages.sample().map_err(|e| e.to_string())?;
        let n0 = NodeId::new(0);
        let (dram, hot_dram) = (p.bytes_on(n0), p.gpa_bytes_on(n0, self.hot.0, self.hot.1));
        for (i, s) in p.nodes().iter().enumerate() {
            let NodeQuery::On(n) = s else { continue };
            let n = n.raw();
            if self.last[i].is_some_and(|l| l != n) {
                self.changes[i] = self.changes[i].saturating_add(1);
            }
            self.last[i] = Some(n);
        }
        Ok((dram, hot_dram))
    }

    fn moved(&self, min: u16) -> u64 {
        self.changes.iter().filter(|&&c| c >= min).count() as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Manager {
    Vmtierd,
    NumaBalancing,
    Damos,
}

impl Manager {
    fn name(self) -> &'static str {
        match self {
            Self::Vmtierd => "vmtierd",
            Self::NumaBalancing => "numa-balancing",
            Self::Damos => "damos",
        }
    }
}

/// What runs while the window is measured.
enum Running {
    Vmtierd(Daemon),
    Kernel,
    Damos(Kdamond),
}

fn pct(part: u64, whole: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let p = 100.0 * part as f64 / whole.max(1) as f64;
    p
}

fn mib(b: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let m = b as f64 / f64::from(1u32 << 20);
    m
}

/// Moves every page of the guest to node 1.
fn to_node1(layout: &GuestMemoryLayout) -> Result<(), String> {
    let pages = crate::guest::all_pages(layout);
    MovePages::default()
        .migrate(layout.pid, &pages, NodeId::new(1))
        .map(|_| ())
        .map_err(|e| e.to_string())
}

struct Ctx<'a> {
    a: &'a BenchE2eArgs,
    emulated: bool,
    node_ranges: Option<((u64, u64), (u64, u64))>,
    goal_probe: Option<bool>,
}

#[allow(clippy::too_many_lines)]
fn run_one(c: &mut Checks, cx: &mut Ctx<'_>, m: Manager) -> Option<Value> {
    let a = cx.a;
    let name = m.name();
    println!(
        "== {name}: {} guest, hot set {}, budget {}",
        a.ram, a.hot, a.budget
    );
    // NUMA balancing and kernel demotion are off except while NUMA balancing is measured.
    if let Err(e) = Sysctls::set("0", "false") {
        c.fatal(&format!("{name}: set numa_balancing/demotion"), e);
        return None;
    }
    if let Err(e) = join_cgroup(true) {
        c.fatal(&format!("{name}: enter the bench memory cgroup"), e);
        return None;
    }
    let append = format!("hot={}K report=5 duration=900", a.hot.0 >> 10);
    let node = (a.policy != "default").then_some(1);
    let started = Guest::start_with_policy(
        "qemu-system-x86_64",
        &a.elf,
        a.ram,
        node,
        &a.policy,
        &append,
    );
    let left = join_cgroup(false);
    let mut g = match started {
        Ok(g) => g,
        Err(e) => {
            c.fatal(&format!("{name}: start QEMU"), e);
            return None;
        }
    };
    if let Err(e) = left {
        c.fatal(&format!("{name}: leave the bench memory cgroup"), e);
        return None;
    }
    g.echo = false;
    let Some(start) = g.wait_for("WG start", Duration::from_secs(60)) else {
        c.fatal(&format!("{name}: guest starts"), "no 'WG start'");
        return None;
    };
    let hot = (
        num(&start, "hot_start").unwrap_or(0),
        num(&start, "hot_bytes").unwrap_or(0),
    );
    if g.wait_for("WG filled", Duration::from_secs(300)).is_none() {
        c.fatal(&format!("{name}: guest fills its RAM"), "no 'WG filled'");
        return None;
    }
    let layout = match QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .and_then(|mut b| b.discover())
    {
        Ok(l) => l,
        Err(e) => {
            c.fatal(&format!("{name}: locate guest RAM through QMP"), e);
            return None;
        }
    };
    let total = layout.total_bytes();
    if let Err(e) = to_node1(&layout) {
        c.fatal(&format!("{name}: move guest RAM to node 1"), e);
        return None;
    }
    let res = residency(&layout).unwrap_or_default();
    let on1 = res.on(NodeId::new(1));
    if !c.check(
        on1 + res.not_present >= total - total / 100 && on1 > total / 2,
        &format!("{name}: guest RAM starts on node 1 (policy {})", a.policy),
        format!(
            "{:?}, not present {}",
            res.per_node,
            ByteSize(res.not_present)
        ),
    ) {
        return None;
    }

    // The physical budget: node 0 keeps about budget + its watermark free.
    let reserve = node_watermark(0);
    let free = node_free(0);
    let want_free = a.budget.0 + reserve;
    let balloon_len = free.saturating_sub(want_free) & !((2 << 20) - 1);
    let balloon = match usize::try_from(balloon_len)
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|l| Balloon::inflate(l, 0))
    {
        Ok(b) => b,
        Err(e) => {
            c.fatal(&format!("{name}: inflate the node-0 balloon"), e);
            return None;
        }
    };
    let free_after = node_free(0);
    c.check(
        true,
        &format!("{name}: balloon inflated"),
        format!(
            "{} mlocked on node 0; node 0 free {} -> {} (budget {} + watermark {})",
            ByteSize(balloon_len),
            ByteSize(free),
            ByteSize(free_after),
            a.budget,
            ByteSize(reserve)
        ),
    );

    let mut detail = serde_json::Map::new();
    let mut tracker = Tracker::new(&layout, hot);
    // DAMOS: first, does vaddr do migrate_hot on this kernel? (5 s probe)
    let mut damos_ops = "paddr";
    if m == Manager::Damos {
        let probe = [Scheme {
            action: "migrate_hot",
            target_nid: 0,
            nr_accesses: (1, 20),
            age: (0, u64::from(u32::MAX)),
            quota_bytes: a.damos_quota.0,
            memcg: None,
            exclude: None,
        }];
        let pid = layout.pid.raw();
        match Kdamond::start("vaddr", Some(pid), None, &probe, &mut cx.goal_probe) {
            Ok(k) => {
                std::thread::sleep(Duration::from_secs(5));
                let st = k.stats();
                drop(k);
                let applied = st
                    .first()
                    .and_then(|s| s["sz_applied"].as_u64())
                    .unwrap_or(0);
                println!("  vaddr migrate_hot probe (5 s): {}", st[0]);
                detail.insert("vaddr_probe".into(), st[0].clone());
                if applied > 0 {
                    damos_ops = "vaddr";
                    if let Err(e) = to_node1(&layout) {
                        c.fatal(&format!("{name}: move guest RAM back to node 1"), e);
                        return None;
                    }
                }
            }
            Err(e) => {
                c.fatal(&format!("{name}: DAMON vaddr probe"), e);
                return None;
            }
        }
        detail.insert("ops".into(), json!(damos_ops));
        detail.insert(
            "quota_goal_node_mem_used_bp_supported".into(),
            json!(cx.goal_probe),
        );
    }
    // The per-page baseline, after the RAM is on node 1.
    if let Err(e) = tracker.sample() {
        c.fatal(&format!("{name}: query guest pages"), e);
        return None;
    }

    let before = vmstat_all();
    let t0 = Instant::now();
    let running = match m {
        Manager::Vmtierd => {
            let dir = std::env::var("VMTIER_RUN")
                .map_or_else(|_| std::env::temp_dir(), PathBuf::from)
                .join("bench-e2e");
            let _ = fs::create_dir_all(&dir);
            let socket = std::env::temp_dir().join(format!("vmtierd-{}.sock", std::process::id()));
            let config = format!(
                "[daemon]\nsocket = \"{}\"\ninterval_ms = 1000\n\n[[vm]]\nname = \"guest\"\nqmp = \"{}\"\nbudget = \"{}K\"\n",
                socket.display(),
                g.qmp.display(),
                a.budget.0 >> 10
            );
            match Daemon::start(&dir, &socket, &config) {
                Ok(d) => {
                    let log = d.log_text();
                    for key in ["hotness source:", "migrator:"] {
                        if let Some(l) = log.lines().find(|l| l.contains(key)) {
                            println!("  vmtierd| {}", l.trim());
                        }
                    }
                    Running::Vmtierd(d)
                }
                Err(e) => {
                    c.fatal(&format!("{name}: start vmtierd"), e);
                    return None;
                }
            }
        }
        Manager::NumaBalancing => match Sysctls::set("2", "true") {
            Ok(()) => Running::Kernel,
            Err(e) => {
                c.fatal(&format!("{name}: numa_balancing=2, demotion on"), e);
                return None;
            }
        },
        Manager::Damos => {
            let pid = layout.pid.raw();
            let memcg = Some(format!("/{CGROUP_NAME}"));
            let (ops_pid, region, ex0, ex1, memcg) = match (damos_ops, cx.node_ranges) {
                ("vaddr", _) => (Some(pid), None, None, None, None),
                (_, Some((r0, r1))) => (
                    None,
                    Some((r0.0.min(r1.0), r0.1.max(r1.1))),
                    Some(r0),
                    Some(r1),
                    memcg,
                ),
                _ => {
                    c.fatal(&format!("{name}: node physical ranges"), "not found");
                    return None;
                }
            };
            let schemes = [
                Scheme {
                    action: "migrate_hot",
                    target_nid: 0,
                    nr_accesses: (1, 20),
                    age: (0, u64::from(u32::MAX)),
                    quota_bytes: a.damos_quota.0,
                    memcg: memcg.clone(),
                    exclude: ex0,
                },
                Scheme {
                    action: "migrate_cold",
                    target_nid: 1,
                    nr_accesses: (0, 0),
                    age: (20, u64::from(u32::MAX)),
                    quota_bytes: a.damos_quota.0,
                    memcg,
                    exclude: ex1,
                },
            ];
            match Kdamond::start(damos_ops, ops_pid, region, &schemes, &mut cx.goal_probe) {
                Ok(k) => Running::Damos(k),
                Err(e) => {
                    c.fatal(&format!("{name}: DAMOS setup through sysfs"), e);
                    return None;
                }
            }
        }
    };

    // The window: one sample per second.
    let mut dram_series = Vec::new();
    let mut hot_series = Vec::new();
    let mut free_series = Vec::new();
    let mut reached: Option<(u64, f64)> = None;
    let mut broken = None;
    for k in 1..=a.window {
        let due = t0 + Duration::from_secs(k);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let (dram, hot_dram) = match tracker.sample() {
            Ok(s) => s,
            Err(e) => {
                broken = Some(e);
                break;
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let frac = pct(hot_dram, hot.1) / 100.0;
        if reached.is_none() && hot_dram * 10 >= hot.1 * 9 {
            reached = Some((k, secs));
        }
        dram_series.push(dram);
        hot_series.push((frac * 1000.0).round() / 1000.0);
        free_series.push(node_free(0));
        let migrated = vmstat_all()
            .get("pgmigrate_success")
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get("pgmigrate_success").copied().unwrap_or(0));
        println!(
            "  [{name:<14}] t={secs:>5.1} s  DRAM {:>7.1} MiB  hot set in DRAM {:>5.1}%  migrated {migrated:>6} pages  node0 free {:>6.1} MiB",
            mib(dram),
            frac * 100.0,
            mib(node_free(0))
        );
        g.poll();
    }
    let after = vmstat_all();

    match running {
        Running::Vmtierd(mut d) => {
            if let Some(st) = d.status("guest") {
                let mm = st.metrics;
                detail.insert("ticks".into(), json!(mm.ticks));
                detail.insert("promoted_bytes".into(), json!(mm.promoted_bytes));
                detail.insert("demoted_bytes".into(), json!(mm.demoted_bytes));
                detail.insert("failed_pages".into(), json!(mm.failed_pages));
                detail.insert("busy_pages".into(), json!(mm.busy_pages));
                detail.insert("deferred_granules".into(), json!(mm.deferred_granules));
            }
            let code = d.stop();
            c.check(
                code == Some(0),
                &format!("{name}: vmtierd stops cleanly"),
                format!("{code:?}"),
            );
        }
        Running::Kernel => {}
        Running::Damos(k) => {
            let st = k.stats();
            for s in &st {
                println!("  damos scheme: {s}");
            }
            detail.insert("schemes".into(), json!(st));
            drop(k);
        }
    }
    let _ = Sysctls::set("0", "false");
    drop(balloon);

    g.request_stop();
    let done = g
        .wait_for("WG done", Duration::from_secs(300))
        .unwrap_or_default();
    let _ = g.wait_exit(Duration::from_secs(30));
    drop(g);
    let _ = fs::remove_dir(format!("{CGROUP}/{CGROUP_NAME}"));
    let corrupted = num(&done, "corrupted");
    c.check(
        corrupted == Some(0),
        &format!("{name}: guest reports zero corrupted words"),
        if done.is_empty() {
            "no 'WG done'"
        } else {
            &done
        },
    );
    if let Some(e) = broken {
        c.fatal(&format!("{name}: sampling"), e);
    }

    let delta = |k: &str| {
        after
            .get(k)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get(k).copied().unwrap_or(0))
    };
    let vmstat: serde_json::Map<String, Value> = COUNTERS
        .iter()
        .map(|k| ((*k).to_owned(), json!(delta(k))))
        .collect();
    let max_dram = dram_series.iter().copied().max().unwrap_or(0);
    Some(json!({
        "manager": name,
        "ticks_to_90pct_hot_in_dram": reached.map(|r| r.0),
        "seconds_to_90pct_hot_in_dram": reached.map(|r| (r.1 * 10.0).round() / 10.0),
        "pages_migrated": delta("pgmigrate_success"),
        "pages_pingponged": tracker.moved(2),
        "pages_moved_observed": tracker.moved(1),
        "max_dram_bytes": max_dram,
        "final_dram_bytes": dram_series.last().copied().unwrap_or(0),
        "final_hot_fraction_in_dram": hot_series.last().copied().unwrap_or(0.0),
        "budget_bytes": a.budget.0,
        "guest_corrupted_words": corrupted,
        "emulated": cx.emulated,
        "guest_ram_bytes": total,
        "hot_set_bytes": hot.1,
        "hot_set_pages_tracked": tracker.hot_pages,
        "window_s": a.window,
        "sample_interval_ms": 1000,
        "ram_policy": a.policy,
        "balloon_bytes": balloon_len,
        "node0_watermark_reserve_bytes": reserve,
        "node0_free_after_balloon_bytes": free_after,
        "vmstat_delta": vmstat,
        "dram_bytes_per_second": dram_series,
        "hot_fraction_per_second": hot_series,
        "node0_free_bytes_per_second": free_series,
        "detail": detail,
    }))
}

pub fn run(c: &mut Checks, a: &BenchE2eArgs) {
    let emulated = std::env::var("VMTIER_ACCEL").is_ok_and(|v| v == "tcg");
    let managers: Vec<Manager> = a
        .managers
        .split(',')
        .filter_map(|s| match s.trim() {
            "vmtierd" => Some(Manager::Vmtierd),
            "numa-balancing" | "numab" => Some(Manager::NumaBalancing),
            "damos" => Some(Manager::Damos),
            _ => None,
        })
        .collect();
    if managers.is_empty() {
        return c.fatal("managers", &a.managers);
    }
    if !["default", "preferred", "bind"].contains(&a.policy.as_str()) {
        return c.fatal("policy", &a.policy);
    }
    let saved = Sysctls::save();
    let mut cx = Ctx {
        a,
        emulated,
        node_ranges: node_phys_range(0).zip(node_phys_range(1)),
        goal_probe: None,
    };
    println!(
        "bench-e2e: managers {}, window {} s, numa_balancing/demotion found {}/{}{}",
        a.managers,
        a.window,
        saved.numab,
        saved.demotion,
        if emulated {
            " (TCG-emulated: times are relative only)"
        } else {
            ""
        }
    );
    let rows: Vec<Value> = managers
        .iter()
        .filter_map(|&m| run_one(c, &mut cx, m))
        .collect();
    let want = format!("{}/{}", saved.numab, saved.demotion);
    drop(saved);
    let now = format!("{}/{}", read(NUMAB), read(DEMOTION));
    c.check(
        now == want,
        "numa_balancing and demotion_enabled restored",
        &now,
    );
    c.check(
        kdamonds_on() == 0,
        "no kdamond left running",
        format!("{} on", kdamonds_on()),
    );

    println!();
    println!(
        "{:<15} {:>9} {:>9} {:>10} {:>10} {:>8} {:>9} {:>11} {:>9}",
        "manager",
        "ticks→90%",
        "s→90%",
        "hot@end",
        "max DRAM",
        "budget",
        "migrated",
        "ping-pong",
        "corrupted"
    );
    for r in &rows {
        let opt = |k: &str| r[k].as_f64().map_or("never".to_owned(), |v| format!("{v}"));
        println!(
            "{:<15} {:>9} {:>9} {:>9.1}% {:>6.1} MiB {:>4} MiB {:>9} {:>11} {:>9}",
            r["manager"].as_str().unwrap_or(""),
            opt("ticks_to_90pct_hot_in_dram"),
            opt("seconds_to_90pct_hot_in_dram"),
            r["final_hot_fraction_in_dram"].as_f64().unwrap_or(0.0) * 100.0,
            mib(r["max_dram_bytes"].as_u64().unwrap_or(0)),
            r["budget_bytes"].as_u64().unwrap_or(0) >> 20,
            r["pages_migrated"].as_u64().unwrap_or(0),
            r["pages_pingponged"].as_u64().unwrap_or(0),
            r["guest_corrupted_words"]
        );
    }
    println!(
        "(window {} s, 1 sample/s; emulated={emulated}; pages are 4 KiB)",
        a.window
    );
    if let Some(dir) = a.out.parent() {
        let _ = fs::create_dir_all(dir);
    }
    let text = serde_json::to_string_pretty(&Value::Array(rows)).unwrap_or_default();
    c.check(
        fs::write(&a.out, text + "\n").is_ok(),
        "write the JSON",
        a.out.display(),
    );
}
