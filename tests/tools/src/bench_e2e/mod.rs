//! `bench-e2e`: the same workload guest (RAM starting on the CXL node, hot sets, a DRAM
//! budget) managed in turn by vmtierd, the kernel's NUMA balancing tiering mode and DAMOS
//! `migrate_hot`/`migrate_cold`, measured from outside about once per second: where every
//! 4 KiB page of the guest is, how much of the hot memory is in DRAM, how many pages moved
//! and how many moved back and forth, and what each manager costs in CPU time. Every guest
//! shape runs with THP-backed and with 4 KiB-backed guest RAM. Figures are printed and
//! written as JSON, never asserted: the run fails only when something is broken (set-up,
//! sampling, guest corruption).
//!
//! The kernel managers have no per-VM budget, so the budget is made physical: an mlock'ed
//! balloon bound to node 0 (unevictable, so demotion cannot move it) leaves node 0 with
//! budget + its `high` watermarks free. NUMA balancing promotes only while node 0 stays above
//! `high`, so it can reach the budget, like vmtierd; DAMOS's migrate_hot allocates down to
//! `min`, a little more. Both wake kswapd when node 0 runs low, and kswapd reclaims node 0's
//! file pages for them: the page cache is dropped before each window, and the file pages the
//! running processes fault back in count in the kernel managers' reach. Each row reports the
//! DRAM its manager could reach and the most it used.
//! The per-CPU free page lists, which neither `MemFree` nor those watermark checks count, are
//! held small and fixed for the whole bench (`percpu_pagelist_high_fraction`).

mod host;
mod managers;
pub mod plot;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use vmtier_backends::qemu::QemuBackend;
use vmtier_core::migrate::Migrator;
use vmtier_core::{ByteSize, GuestMemoryLayout, NodeId};
use vmtier_migrate::{MovePages, NodeQuery};

use crate::check::Checks;
use crate::guest::{num, residency, Guest, GuestPages};
use host::{Balloon, Knobs};
use managers::{Env, Manager};

/// /proc/vmstat counters reported per run (deltas over the window).
const COUNTERS: [&str; 16] = [
    "pgmigrate_success",
    "pgmigrate_fail",
    "pgpromote_success",
    "pgpromote_candidate",
    "pgdemote_kswapd",
    "pgdemote_direct",
    "numa_pte_updates",
    "numa_huge_pte_updates",
    "numa_hint_faults",
    "numa_hint_faults_local",
    "numa_pages_migrated",
    "thp_migration_success",
    "thp_split_page",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "workingset_refault_file",
];

#[derive(clap::Args, Debug)]
pub struct BenchE2eArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// Guest RAM.
    #[arg(long, default_value = "256M")]
    ram: ByteSize,
    /// DRAM budget; default per shape (static 64M, mixed 48M).
    #[arg(long)]
    budget: Option<ByteSize>,
    /// Seconds measured per run; default per shape (static 35, mixed 60).
    #[arg(long)]
    window: Option<u64>,
    /// The RAM backend's policy: `default` (no policy; the RAM is moved to node 1 after the
    /// fill), `preferred` or `bind` (host-nodes=1).
    #[arg(long, default_value = "default")]
    policy: String,
    /// Managers to run, comma-separated: vmtierd, numa-balancing, damos.
    #[arg(long, default_value = "vmtierd,numa-balancing,damos")]
    managers: String,
    /// Guest shapes, comma-separated: `static` (one uniform 32 MiB hot set) and `mixed`
    /// (a 16 MiB hot set with 80% of the touches that moves after 25 s, a 16 MiB warm set
    /// with 20%, and a 5 s scan of all guest memory after 42 s).
    #[arg(long, default_value = "static,mixed")]
    shapes: String,
    /// Backing of guest RAM, comma-separated: `thp` (THP `always`) and `4k` (THP `never`).
    #[arg(long, default_value = "thp,4k")]
    pages: String,
    /// DAMOS quota per scheme, per second.
    #[arg(long, default_value = "64M")]
    damos_quota: ByteSize,
    /// JSON output file.
    #[arg(long, default_value = "target/bench/e2e.json")]
    out: PathBuf,
    /// Extra `[daemon.policy_params]` lines for vmtierd's policy, e.g. `sustained_heat =
    /// false` (empty: its defaults).
    #[arg(long, default_value = "")]
    vmtierd_params: String,
    /// Extra `[daemon.damon]` lines for vmtierd's DAMON, e.g. `max_nr_regions = 1560`
    /// (empty: its defaults).
    #[arg(long, default_value = "")]
    vmtierd_damon: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Static,
    Mixed,
}

/// Something the bench makes the guest do at a second of the window.
struct Event {
    at_s: u64,
    cmd: u8,
    name: &'static str,
}

impl Shape {
    fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "static" => Ok(Self::Static),
            "mixed" => Ok(Self::Mixed),
            o => Err(format!("Unknown shape {o:?} (static, mixed)")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Mixed => "mixed",
        }
    }

    fn guest_args(self) -> &'static str {
        match self {
            Self::Static => "hot=32M",
            Self::Mixed => "hot=16M warm=16M warm_pct=20 scan_for=5",
        }
    }

    fn budget(self) -> ByteSize {
        match self {
            Self::Static => ByteSize(64 << 20),
            Self::Mixed => ByteSize(48 << 20),
        }
    }

    fn window(self) -> u64 {
        match self {
            Self::Static => 35,
            Self::Mixed => 60,
        }
    }

    fn events(self) -> &'static [Event] {
        match self {
            Self::Static => &[],
            Self::Mixed => &[
                Event {
                    at_s: 25,
                    cmd: b's',
                    name: "shift",
                },
                Event {
                    at_s: 42,
                    cmd: b'c',
                    name: "scan",
                },
            ],
        }
    }
}

/// Guest RAM backing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pages {
    Thp,
    Small,
}

impl Pages {
    fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "thp" => Ok(Self::Thp),
            "4k" => Ok(Self::Small),
            o => Err(format!("Unknown page backing {o:?} (thp, 4k)")),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Thp => "thp",
            Self::Small => "4k",
        }
    }

    fn thp_mode(self) -> &'static str {
        match self {
            Self::Thp => "always",
            Self::Small => "never",
        }
    }
}

fn list<T>(s: &str, parse: fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    s.split(',').map(parse).collect()
}

/// Per-page state over the window: the node of every page at every sample.
struct Tracker {
    pages: GuestPages,
    last: Vec<Option<u32>>,
    changes: Vec<u16>,
}

/// One sample.
struct Sample {
    dram: u64,
    /// Bytes of each hot range in DRAM.
    hot_dram: Vec<u64>,
}

impl Tracker {
    fn new(layout: &GuestMemoryLayout) -> Self {
        let pages = GuestPages::new(layout);
        let n = pages.gpas().len();
        Self {
            pages,
            last: vec![None; n],
            changes: vec![0; n],
        }
    }

    /// Queries every page once (one move_pages(2) pass).
    fn sample(&mut self, hot: &[(u64, u64)]) -> Result<Sample, String> {
        let p = self.pages.sample().map_err(|e| e.to_string())?;
        let n0 = NodeId::new(0);
        let s = Sample {
            dram: p.bytes_on(n0),
            hot_dram: hot.iter().map(|&(g, l)| p.gpa_bytes_on(n0, g, l)).collect(),
        };
        for (i, q) in p.nodes().iter().enumerate() {
            let NodeQuery::On(n) = q else { continue };
            let n = n.raw();
            if self.last[i].is_some_and(|l| l != n) {
                self.changes[i] = self.changes[i].saturating_add(1);
            }
            self.last[i] = Some(n);
        }
        Ok(s)
    }

    /// Pages whose node changed at least `min` times.
    fn moved(&self, min: u16) -> u64 {
        self.changes.iter().filter(|&&c| c >= min).count() as u64
    }
}

fn mib(b: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let m = b as f64 / f64::from(1u32 << 20);
    m
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Moves every page of the guest to node 1.
fn to_node1(layout: &GuestMemoryLayout) -> Result<(), String> {
    let pages = crate::guest::all_pages(layout);
    MovePages::default()
        .migrate(layout.pid, &pages, NodeId::new(1))
        .map(|_| ())
        .map_err(|e| format!("Move guest RAM to node 1: {e}"))
}

/// CPU seconds of every running kdamond thread, by pid.
fn kdamond_cpu() -> BTreeMap<u32, f64> {
    let root = vmtier_sources::damon::sysfs::DEFAULT_ROOT;
    fs::read_dir(format!("{root}/kdamonds"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            host::read(&e.path().join("pid").to_string_lossy())
                .parse()
                .ok()
        })
        .filter(|&p: &u32| p > 0)
        .filter_map(|p| Some((p, host::cpu_seconds(p)?)))
        .collect()
}

/// What every run shares.
struct Ctx<'a> {
    a: &'a BenchE2eArgs,
    emulated: bool,
    node_ranges: Option<((u64, u64), (u64, u64))>,
}

/// A started guest with its RAM located and on node 1.
struct Prepared {
    guest: Guest,
    layout: GuestMemoryLayout,
    hot: (u64, u64),
    warm: (u64, u64),
    thp_bytes: u64,
}

fn start_guest(
    c: &mut Checks,
    cx: &Ctx<'_>,
    label: &str,
    shape: Shape,
    pages: Pages,
) -> Result<Prepared, String> {
    Knobs::set_kernel_tiering("0", "false")?;
    Knobs::set_thp(pages.thp_mode())?;
    host::join_cgroup(true).map_err(|e| format!("Enter the bench memory cgroup: {e}"))?;
    let append = format!("{} report=5 duration=900", shape.guest_args());
    let node = (cx.a.policy != "default").then_some(1);
    let started = Guest::start_with_policy(
        "qemu-system-x86_64",
        &cx.a.elf,
        cx.a.ram,
        node,
        &cx.a.policy,
        &append,
    );
    host::join_cgroup(false).map_err(|e| format!("Leave the bench memory cgroup: {e}"))?;
    let mut g = started.map_err(|e| format!("Start QEMU: {e}"))?;
    g.echo = false;
    let start = g
        .wait_for("WG start", Duration::from_secs(60))
        .ok_or("The guest did not start (no 'WG start')")?;
    let range = |s: &str, l: &str| (num(&start, s).unwrap_or(0), num(&start, l).unwrap_or(0));
    let (hot, warm) = (
        range("hot_start", "hot_bytes"),
        range("warm_start", "warm_bytes"),
    );
    g.wait_for("WG filled", Duration::from_secs(300))
        .ok_or("The guest did not fill its RAM (no 'WG filled')")?;
    let layout = QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .and_then(|mut b| b.discover())
        .map_err(|e| format!("Locate guest RAM through QMP: {e}"))?;
    let thp_bytes = crate::mem::guest_thp_bytes(&layout);
    match pages {
        Pages::Small => {
            if !c.check(
                thp_bytes == 0,
                &format!("{label}: guest RAM is on 4 KiB pages"),
                format!("AnonHugePages {}", ByteSize(thp_bytes)),
            ) {
                return Err("Guest RAM is not on 4 KiB pages".into());
            }
        }
        Pages::Thp => println!("  guest RAM on THP: {}", ByteSize(thp_bytes)),
    }
    to_node1(&layout)?;
    let total = layout.total_bytes();
    let res = residency(&layout).map_err(|e| e.to_string())?;
    let on1 = res.on(NodeId::new(1));
    if !c.check(
        on1 + res.not_present >= total - total / 100 && on1 > total / 2,
        &format!(
            "{label}: guest RAM starts on node 1 (policy {})",
            cx.a.policy
        ),
        format!(
            "{:?}, not present {}",
            res.per_node,
            ByteSize(res.not_present)
        ),
    ) {
        return Err("Guest RAM did not start on node 1".into());
    }
    Ok(Prepared {
        guest: g,
        layout,
        hot,
        warm,
        thp_bytes,
    })
}

/// The series and marks one window produces.
#[derive(Default)]
struct Window {
    t_s: Vec<f64>,
    dram: Vec<u64>,
    hot_frac: Vec<f64>,
    node0_free: Vec<u64>,
    ticks: Vec<Option<u64>>,
    /// The manager's CPU seconds at each sample.
    cpu: Vec<Option<f64>>,
    /// (second, sample index) when 90% of the hot memory was first in DRAM.
    reached: Option<(f64, usize)>,
    /// Seconds from the shift until 90% of the new hot memory was in DRAM.
    after_shift: Option<f64>,
    shift_at: Option<f64>,
    /// pgmigrate_success over [scan start, scan end + 5 s].
    scan_migrated: Option<u64>,
    broken: Option<String>,
}

fn pgmigrate() -> u64 {
    host::vmstat_all()
        .get("pgmigrate_success")
        .copied()
        .unwrap_or(0)
}

/// Samples on whole seconds of the clock (skipping those a slow sample overran) until `secs`
/// have passed, sending the shape's events when their second has come.
#[allow(clippy::too_many_arguments)]
fn measure(
    label: &str,
    shape: Shape,
    secs: u64,
    p: &mut Prepared,
    tracker: &mut Tracker,
    m: &mut dyn Manager,
    t0: Instant,
    ticks0: u64,
) -> Window {
    let mut w = Window::default();
    let mut hot = p.hot;
    let mut events = shape.events().iter().peekable();
    let mut scan: Option<(f64, u64)> = None;
    let scan_len = 5.0;
    let mut next = 1;
    loop {
        if let Some(d) = (t0 + Duration::from_secs(next)).checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let el = t0.elapsed();
        while let Some(e) = events.next_if(|e| e.at_s <= el.as_secs()) {
            let at = t0.elapsed().as_secs_f64();
            if let Err(err) = p.guest.send(e.cmd) {
                w.broken = Some(format!("send {}: {err}", e.name));
            }
            println!("  [{label}] t={at:>5.1} s  {} sent", e.name);
            match e.cmd {
                b's' => w.shift_at = Some(at),
                b'c' => scan = Some((at, pgmigrate())),
                _ => {}
            }
        }
        p.guest.poll();
        // The hot set moves when the guest says so.
        if let Some(h) = p
            .guest
            .seen
            .iter()
            .rev()
            .find(|l| l.starts_with("WG hotshift"))
            .and_then(|l| num(l, "hot_start"))
        {
            hot.0 = h;
        }
        let ranges: Vec<(u64, u64)> = [hot, p.warm].into_iter().filter(|r| r.1 > 0).collect();
        let s = match tracker.sample(&ranges) {
            Ok(s) => s,
            Err(e) => {
                w.broken = Some(e);
                break;
            }
        };
        let secs_now = t0.elapsed().as_secs_f64();
        let want: u64 = ranges.iter().map(|r| r.1).sum();
        let have: u64 = s.hot_dram.iter().sum();
        #[allow(clippy::cast_precision_loss)]
        let frac = have as f64 / want.max(1) as f64;
        let at90 = have * 10 >= want * 9;
        if w.reached.is_none() && at90 {
            w.reached = Some((secs_now, w.t_s.len()));
        }
        if let (Some(sh), None, true) = (w.shift_at, w.after_shift, hot.0 != p.hot.0) {
            if at90 {
                w.after_shift = Some(secs_now - sh);
            }
        }
        if let Some((at, base)) = scan {
            if secs_now >= at + scan_len + 5.0 && w.scan_migrated.is_none() {
                w.scan_migrated = Some(pgmigrate().saturating_sub(base));
            }
        }
        let ticks = m.ticks().map(|t| t.saturating_sub(ticks0));
        println!(
            "  [{label}] t={secs_now:>5.1} s{}  DRAM {:>6.1} MiB  hot memory in DRAM {:>5.1}%  node0 free {:>6.1} MiB",
            ticks.map_or(String::new(), |t| format!(" tick {t:>3}")),
            mib(s.dram),
            frac * 100.0,
            mib(host::node_free(0))
        );
        w.t_s.push(round1(secs_now));
        w.dram.push(s.dram);
        w.hot_frac.push((frac * 1000.0).round() / 1000.0);
        w.node0_free.push(host::node_free(0));
        w.ticks.push(ticks);
        w.cpu.push(m.cpu_seconds());
        if el.as_secs() >= secs {
            break;
        }
        next = (t0.elapsed().as_secs() + 1).max(next + 1);
    }
    w
}

/// One manager on one guest shape and backing: set-up, window, tear-down, one JSON row.
#[allow(clippy::too_many_lines)]
fn run_one(
    c: &mut Checks,
    cx: &Ctx<'_>,
    shape: Shape,
    pages: Pages,
    m: &mut dyn Manager,
) -> Result<Value, String> {
    let a = cx.a;
    let label = format!("{}/{}/{}", shape.name(), pages.name(), m.name());
    let budget = a.budget.unwrap_or_else(|| shape.budget());
    let secs = a.window.unwrap_or_else(|| shape.window());
    println!(
        "== {label}: {} guest ({}), budget {budget}, {secs} s",
        a.ram,
        shape.guest_args()
    );
    let mut p = start_guest(c, cx, &label, shape, pages)?;
    let total = p.layout.total_bytes();

    // The physical budget: node 0 keeps budget + its high watermarks free. The page cache is
    // dropped first: a manager that pushes node 0 below its watermarks wakes kswapd, which
    // reclaims node 0's file pages, so they are DRAM within its reach (below).
    host::drop_page_cache()?;
    let wm = host::watermarks(0);
    let balloon = Balloon::inflate_to(budget.0 + wm.high)
        .map_err(|e| format!("Inflate the node-0 balloon: {e}"))?;
    let off = balloon.free_after.abs_diff(balloon.target_free);
    // Free too, outside MemFree, and taken first by the kernel managers' allocations: small
    // and fixed since `Knobs::pin_pcp_lists`.
    let pcp = crate::mem::NodeFree::of(0).pcp;
    let file = host::node_meminfo(0).get("FilePages").copied().unwrap_or(0);
    c.check(
        off <= 8 << 20,
        &format!("{label}: the balloon leaves node 0 budget + high watermark free"),
        format!(
            "{} mlocked; node 0 free {} -> {} (target {} = budget {budget} + high {}; off by {}), \
             per-CPU lists {}, file pages {}",
            ByteSize(balloon.bytes),
            ByteSize(balloon.free_before),
            ByteSize(balloon.free_after),
            ByteSize(balloon.target_free),
            ByteSize(wm.high),
            ByteSize(off),
            ByteSize(pcp),
            ByteSize(file)
        ),
    );
    // The kernel managers wake kswapd when node 0 runs low (NUMA balancing's tiering mode when
    // a promotion finds it at `high`, to balance it up to `promo`; DAMOS's GFP_NOWAIT
    // allocations below `low`), and kswapd reclaims node 0's file pages: those are within
    // their reach too.
    let reach = match m.name() {
        "vmtierd" => budget.0,
        "numa-balancing" => balloon.free_after.saturating_sub(wm.high) + pcp + file,
        // 6.12's migrate_hot allocations may go down to min (and then fall back to node 1).
        _ => balloon.free_after.saturating_sub(wm.min) + pcp + file,
    };

    let env = Env {
        layout: &p.layout,
        qmp: &p.guest.qmp,
        budget,
        damos_quota: a.damos_quota,
        node_ranges: cx.node_ranges,
        vmtierd_params: &a.vmtierd_params,
        vmtierd_damon: &a.vmtierd_damon,
        // One directory per run, so that each keeps its own vmtierd.log.
        dir: std::env::var("VMTIER_RUN")
            .map_or_else(|_| std::env::temp_dir(), PathBuf::from)
            .join("bench-e2e")
            .join(format!("{}-{}-{}", shape.name(), pages.name(), m.name())),
    };
    let mut detail = m.prepare(&env)?;
    // prepare() may have moved pages: back to node 1 before the baseline.
    to_node1(&p.layout)?;
    let mut tracker = Tracker::new(&p.layout);
    tracker.sample(&[])?;

    let before = host::vmstat_all();
    let node0_before = host::node_meminfo(0);
    let kd_before = kdamond_cpu();
    let t_start = Instant::now();
    m.start(&env)?;
    // The window starts when the manager runs; its ticks and CPU count from here.
    let t0 = Instant::now();
    let startup = t0.duration_since(t_start).as_secs_f64();
    let cpu0 = m.cpu_seconds().unwrap_or(0.0);
    let ticks0 = m.ticks().unwrap_or(0);
    let w = measure(&label, shape, secs, &mut p, &mut tracker, m, t0, ticks0);
    let window_s = t0.elapsed().as_secs_f64();
    let cpu = m.cpu_seconds().map(|s| s - cpu0);
    let ticks = m.ticks().map(|t| t.saturating_sub(ticks0));
    let kd_after = kdamond_cpu();
    let after = host::vmstat_all();
    let node0_after = host::node_meminfo(0);
    let stopped = m.stop();
    let _ = Knobs::set_kernel_tiering("0", "false");
    drop(balloon);

    p.guest.request_stop();
    let done = p
        .guest
        .wait_for("WG done", Duration::from_secs(300))
        .unwrap_or_default();
    let _ = p.guest.wait_exit(Duration::from_secs(30));
    let corrupted = num(&done, "corrupted");
    drop(p.guest);
    host::remove_cgroup();
    c.check(
        corrupted == Some(0),
        &format!("{label}: guest reports zero corrupted words"),
        if done.is_empty() {
            "no 'WG done'"
        } else {
            &done
        },
    );
    match stopped {
        Ok(d) => detail.extend(d),
        Err(e) => {
            c.check(false, &format!("{label}: {} stops", m.name()), &e);
        }
    }
    if let Some(e) = w.broken {
        return Err(format!("Sampling: {e}"));
    }

    let delta = |k: &str| {
        after
            .get(k)
            .copied()
            .unwrap_or(0)
            .saturating_sub(before.get(k).copied().unwrap_or(0))
    };
    // Where DRAM beyond the reach can come from: file pages kswapd reclaimed on node 0.
    let field = |m: &BTreeMap<String, u64>, k: &str| mib(m.get(k).copied().unwrap_or(0));
    println!(
        "{label}: node 0 besides free memory, window start → end: file pages {:.1} → {:.1} \
         MiB, anon {:.1} → {:.1} MiB, shmem {:.1} → {:.1} MiB; reclaimed (all nodes) by kswapd {} pages, directly {}",
        field(&node0_before, "FilePages"),
        field(&node0_after, "FilePages"),
        field(&node0_before, "AnonPages"),
        field(&node0_after, "AnonPages"),
        field(&node0_before, "Shmem"),
        field(&node0_after, "Shmem"),
        delta("pgsteal_kswapd"),
        delta("pgsteal_direct")
    );
    let vmstat: Map<String, Value> = COUNTERS
        .iter()
        .map(|k| ((*k).to_owned(), json!(delta(k))))
        .collect();
    let kdamond_s: f64 = kd_after
        .iter()
        .map(|(pid, s)| s - kd_before.get(pid).copied().unwrap_or(0.0))
        .sum();
    #[allow(clippy::cast_precision_loss)]
    let gib = total as f64 / f64::from(1u32 << 30);
    // vmtierd's CPU per tick, extrapolated to 64 GiB of guest RAM at a 1 s tick (%).
    let (ms_per_tick, pct_64g) = match (cpu, ticks) {
        (Some(s), Some(t)) if t > 0 => {
            #[allow(clippy::cast_precision_loss)]
            let per_tick = s / t as f64;
            (Some(per_tick * 1e3), Some(per_tick / gib * 64.0 * 100.0))
        }
        _ => (None, None),
    };
    // CPU per tick over the last 15 s of the window, when the hot set has long settled
    // (migration copies are charged to vmtierd's system time, so the whole-window figure
    // is mostly the copying of the first ticks).
    let steady_ms_per_tick = {
        let from = w
            .t_s
            .iter()
            .position(|&t| t >= w.t_s.last().copied().unwrap_or(0.0) - 15.0);
        let pair = |i: usize| Some((w.cpu.get(i).copied()??, w.ticks.get(i).copied()??));
        match (
            from.and_then(pair),
            w.t_s.len().checked_sub(1).and_then(pair),
        ) {
            (Some((c0, t0)), Some((c1, t1))) if t1 > t0 => {
                #[allow(clippy::cast_precision_loss)]
                let ms = (c1 - c0) / (t1 - t0) as f64 * 1e3;
                Some(round1(ms))
            }
            _ => None,
        }
    };
    let ticks_at_90 = w
        .reached
        .and_then(|(_, i)| w.ticks.get(i).copied().flatten());
    Ok(json!({
        "shape": shape.name(),
        "pages": pages.name(),
        "manager": m.name(),
        "startup_s": round1(startup),
        "seconds_to_90pct_hot_in_dram": w.reached.map(|r| round1(r.0)),
        "vmtierd_ticks_at_90pct": ticks_at_90,
        "vmtierd_ticks_at_window_start": (m.name() == "vmtierd").then_some(ticks0),
        "seconds_to_90pct_after_shift": w.after_shift.map(round1),
        "pages_migrated_in_scan": w.scan_migrated,
        "pages_migrated": delta("pgmigrate_success"),
        "pages_pingponged": tracker.moved(2),
        "pages_moved_observed": tracker.moved(1),
        "max_dram_bytes": w.dram.iter().copied().max().unwrap_or(0),
        "dram_reach_bytes": reach,
        "final_dram_bytes": w.dram.last().copied().unwrap_or(0),
        "final_hot_fraction_in_dram": w.hot_frac.last().copied().unwrap_or(0.0),
        "budget_bytes": budget.0,
        "guest_corrupted_words": corrupted,
        "guest_ram_bytes": total,
        "guest_thp_bytes": p.thp_bytes,
        "hot_bytes": p.hot.1,
        "warm_bytes": p.warm.1,
        "window_s": round1(window_s),
        "manager_cpu_s": cpu.map(|s| (s * 1000.0).round() / 1000.0),
        "kdamond_cpu_s": (kdamond_s * 1000.0).round() / 1000.0,
        "ticks": ticks,
        "vmtierd_cpu_ms_per_tick": ms_per_tick.map(round1),
        "vmtierd_cpu_ms_per_tick_last_15s": steady_ms_per_tick,
        "vmtierd_cpu_pct_core_per_64gib_at_1s": pct_64g.map(|x| (x * 100.0).round() / 100.0),
        "emulated": cx.emulated,
        "ram_policy": a.policy,
        "vmtierd_params": a.vmtierd_params,
        "vmtierd_damon": a.vmtierd_damon,
        "node0_watermarks": wm.to_json(),
        "vmstat_delta": vmstat,
        "t_s": w.t_s,
        "dram_bytes": w.dram,
        "hot_fraction_in_dram": w.hot_frac,
        "node0_free_bytes": w.node0_free,
        "node0_meminfo_bytes_start": node0_before,
        "node0_meminfo_bytes_end": node0_after,
        "detail": detail,
    }))
}

fn print_table(rows: &[Value]) {
    println!();
    println!(
        "{:<22} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>9} {:>7} {:>5}",
        "run",
        "start s",
        "s→90%",
        "ticks",
        "shift s",
        "hot@end",
        "max DRAM",
        "reach",
        "migrated",
        "pingpong",
        "in scan",
        "ms/tick",
        "steady",
        "bad"
    );
    let opt = |r: &Value, k: &str| r[k].as_f64().map_or("-".to_owned(), |v| format!("{v}"));
    for r in rows {
        println!(
            "{:<22} {:>7} {:>7} {:>7} {:>7} {:>7.1}% {:>4.1} MiB {:>4.1} MiB {:>9} {:>9} {:>8} {:>9} {:>7} {:>5}",
            format!(
                "{}/{}/{}",
                r["shape"].as_str().unwrap_or(""),
                r["pages"].as_str().unwrap_or(""),
                r["manager"].as_str().unwrap_or("")
            ),
            opt(r, "startup_s"),
            opt(r, "seconds_to_90pct_hot_in_dram").replace('-', "never"),
            opt(r, "vmtierd_ticks_at_90pct"),
            opt(r, "seconds_to_90pct_after_shift"),
            r["final_hot_fraction_in_dram"].as_f64().unwrap_or(0.0) * 100.0,
            mib(r["max_dram_bytes"].as_u64().unwrap_or(0)),
            mib(r["dram_reach_bytes"].as_u64().unwrap_or(0)),
            r["pages_migrated"].as_u64().unwrap_or(0),
            r["pages_pingponged"].as_u64().unwrap_or(0),
            opt(r, "pages_migrated_in_scan"),
            opt(r, "vmtierd_cpu_ms_per_tick"),
            opt(r, "vmtierd_cpu_ms_per_tick_last_15s"),
            r["guest_corrupted_words"]
        );
    }
}

pub fn run(c: &mut Checks, a: &BenchE2eArgs) {
    let emulated = std::env::var("VMTIER_ACCEL").is_ok_and(|v| v == "tcg");
    let parsed = (|| {
        let shapes = list(&a.shapes, Shape::parse)?;
        let pages = list(&a.pages, Pages::parse)?;
        managers::parse(&a.managers)?;
        if !["default", "preferred", "bind"].contains(&a.policy.as_str()) {
            return Err(format!("Unknown policy {:?}", a.policy));
        }
        Ok::<_, String>((shapes, pages))
    })();
    let (shapes, pages) = match parsed {
        Ok(v) => v,
        Err(e) => return c.fatal("arguments", e),
    };
    let knobs = Knobs::save();
    let pcp = match Knobs::pin_pcp_lists() {
        Ok(b) => b,
        Err(e) => return c.fatal("pin the per-CPU page lists", e),
    };
    let cx = Ctx {
        a,
        emulated,
        node_ranges: host::node_phys_range(0).zip(host::node_phys_range(1)),
    };
    println!(
        "bench-e2e: shapes {}, pages {}, managers {}; numa_balancing/demotion/percpu_pagelist_high_fraction found {}, \
         the last set to {} (node 0's per-CPU lists now {}), THP {}; times are {}",
        a.shapes,
        a.pages,
        a.managers,
        knobs.found(),
        Knobs::PCP_FRACTION,
        ByteSize(pcp),
        host::thp_mode(),
        crate::check::clock()
    );
    let mut rows = Vec::new();
    for &shape in &shapes {
        for &pg in &pages {
            let Ok(ms) = managers::parse(&a.managers) else {
                continue;
            };
            for mut m in ms {
                let label = format!("{}/{}/{}", shape.name(), pg.name(), m.name());
                match run_one(c, &cx, shape, pg, m.as_mut()) {
                    Ok(r) => rows.push(r),
                    Err(e) => c.fatal(&label, e),
                }
            }
        }
    }
    let want = knobs.found();
    drop(knobs);
    let now = Knobs::now();
    c.check(
        now == want,
        "numa_balancing, demotion_enabled and percpu_pagelist_high_fraction restored",
        &now,
    );
    c.check(
        managers::kdamonds_on() == 0,
        "no kdamond left running",
        format!("{} on", managers::kdamonds_on()),
    );
    print_table(&rows);
    println!(
        "(about 1 sample/s by the clock; times {}; pages are 4 KiB; 'ticks' are vmtierd's own; \
         'reach' is the DRAM the manager could use; 'in scan' counts pages migrated from the scan's \
         start to 5 s after its end)",
        crate::check::clock()
    );
    if let Some(dir) = a.out.parent() {
        let _ = fs::create_dir_all(dir);
    }
    let text = serde_json::to_string_pretty(&rows).unwrap_or_default();
    c.check(
        fs::write(&a.out, text + "\n").is_ok(),
        "write the JSON",
        a.out.display(),
    );
    // The charts beside it (`tbcheck bench-e2e-plot` draws them again, as PNG too).
    let dir = a.out.parent().unwrap_or(std::path::Path::new("."));
    plot::check_drawn(c, &rows, dir, vmtier_plot::Format::Svg);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_refuse_unknown_words() {
        let cases: [(&str, Result<usize, &str>); 4] = [
            ("static,mixed", Ok(2)),
            ("mixed", Ok(1)),
            ("static,moving", Err("moving")),
            ("", Err("\"\"")),
        ];
        for (input, want) in cases {
            let got = list(input, Shape::parse);
            match (got, want) {
                (Ok(v), Ok(n)) => assert_eq!(v.len(), n, "{input}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{input}: {e}"),
                (g, w) => panic!("{input}: got {:?}, want {w:?}", g.map(|v| v.len())),
            }
        }
        assert_eq!(list("thp,4k", Pages::parse).map(|v| v.len()), Ok(2));
        assert!(managers::parse("vmtierd,tpp").is_err());
    }

    #[test]
    fn the_mixed_shape_shifts_before_it_scans_inside_its_window() {
        let ev = Shape::Mixed.events();
        assert!(ev.windows(2).all(|w| w[0].at_s < w[1].at_s));
        assert!(ev.iter().all(|e| e.at_s + 10 < Shape::Mixed.window()));
        assert!(Shape::Static.events().is_empty());
    }
}
