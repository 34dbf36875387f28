//! `soak`: vmtierd moves the workload guest's pages for a long time while the guest writes
//! and verifies them — four phases (move_pages(2) and the kernel module, each with THP on
//! and off), the DRAM budget changed every 2–3 ticks through a cycle of sizes, until each
//! phase has migrated its share of `--migrations` pages. Every figure is measured from
//! outside the daemon: `/proc/vmstat` and the module's own counter for the migrations, one
//! move_pages(2) query pass ([`GuestPages::sample`]) for the guest's DRAM use after every
//! tick vmtierd completes, and once per tick length inside a tick that runs longer (a tick
//! moving 100 MiB takes 20 s and more under TCG).
//!
//! The budget rule. A new budget is applied by vmtierd's next tick; until that tick and one
//! more have completed (counted from vmtierd's tick count in a status asked after the
//! `vmtierctl set-budget` reply), a sample may show the larger of the old and new budget,
//! afterwards only the new one. A sample may exceed that by the pages migrated during its
//! own pass (`pgmigrate_success` read around it), which it may count on both nodes.
//!
//! Counting. `pgmigrate_success` counts base pages: 6.12's `migrate_pages_batch()` adds
//! `nr_pages` of each folio (512 for a THP; `thp_migration_success` counts the THPs), and the
//! vmtier module adds its own moved pages to it (`vt_migrate_batch()` in
//! host-kmod/vmtier_migrate.c). So the count here is base pages throughout: the
//! `pgmigrate_success` delta, less what the kernel migrated on its own in the same time
//! (NUMA balancing, demotion, and `compact_isolated` as an upper bound for compaction). In
//! the module phases it splits into the module's `pages_moved` delta and the rest, which
//! move_pages(2) moved (THPs, which the module leaves alone, and fallbacks).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmtier_backends::qemu::QemuBackend;
use vmtier_core::{ByteSize, NodeId, PageSize, VmId};
use vmtier_daemon::proto::VmStatus;
use vmtier_migrate::NodeQuery;

use crate::check::{clock, Checks};
use crate::daemon::Daemon;
use crate::guest::{num, Guest, GuestPages};
use crate::kmod::{kstat, sh};
use crate::mem::{guest_thp_bytes, vmstat};

#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// Directory holding vmtier.ko (loaded for the module phases if /dev/vmtier is missing).
    #[arg(long)]
    ko_dir: PathBuf,
    /// Base pages to migrate over all phases; each phase runs until it has its share.
    #[arg(long, default_value_t = 100_000)]
    migrations: u64,
    /// Guest RAM.
    #[arg(long, default_value = "256M")]
    ram: ByteSize,
    /// The guest's hot set (it moves once, after `--shift-after` seconds).
    #[arg(long, default_value = "64M")]
    hot: ByteSize,
    /// Seconds of guest run time after which the hot set moves.
    #[arg(long, default_value_t = 10)]
    shift_after: u64,
    /// The guest's hot touches per page of background verification.
    #[arg(long, default_value_t = 16)]
    sweep_every: u32,
    /// DRAM budgets, cycled through; the first is the start budget.
    #[arg(long, value_delimiter = ',', default_value = "16M,128M,32M,96M")]
    budgets: Vec<ByteSize>,
    /// Phases (migrator/page size), comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "move_pages/thp,move_pages/4k,kmod/thp,kmod/4k"
    )]
    phases: Vec<String>,
    /// vmtierd's tick.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Longest wall time of one phase's migration loop, seconds.
    #[arg(long, default_value_t = 300)]
    phase_timeout: u64,
    /// JSON output file.
    #[arg(long, default_value = "target/bench/soak.json")]
    out: PathBuf,
}

const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
/// Taint flags the runner also treats as failure: M, B, D, W, L.
const BAD_TAINT: u64 = (1 << 4) | (1 << 5) | (1 << 7) | (1 << 9) | (1 << 14);
/// Kernel-initiated migrations that `pgmigrate_success` also counts.
const KERNEL_MIGRATIONS: [&str; 5] = [
    "numa_pages_migrated",
    "pgdemote_kswapd",
    "pgdemote_direct",
    "pgdemote_khugepaged",
    "compact_isolated",
];

/// One phase: who moves the pages and on which page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Phase {
    kmod: bool,
    thp: bool,
}

impl Phase {
    fn parse(s: &str) -> Option<Self> {
        let (m, p) = s.trim().split_once('/')?;
        let kmod = match m {
            "move_pages" => false,
            "kmod" => true,
            _ => return None,
        };
        let thp = match p.to_ascii_lowercase().as_str() {
            "thp" => true,
            "4k" => false,
            _ => return None,
        };
        Some(Self { kmod, thp })
    }

    fn migrator(self) -> &'static str {
        if self.kmod {
            "kmod"
        } else {
            "move_pages"
        }
    }

    fn page(self) -> &'static str {
        if self.thp {
            "THP"
        } else {
            "4 KiB"
        }
    }

    fn name(self) -> String {
        format!("{} {}", self.migrator(), self.page())
    }
}

/// The DRAM limit a sample is checked against. A new budget is applied by vmtierd's next
/// tick; samples are checked against the larger of the old and the new budget until that
/// tick and one more tick of slack have completed, then against the new budget alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Limit {
    budget: u64,
    previous: u64,
    /// Completed vmtierd ticks from which `budget` alone holds.
    strict_from: u64,
}

impl Limit {
    fn new(budget: u64) -> Self {
        Self {
            budget,
            previous: budget,
            strict_from: 0,
        }
    }

    /// `budget` is being set: until [`Limit::settle`], the larger of old and new holds.
    fn change(&mut self, budget: u64) {
        self.previous = self.budget;
        self.budget = budget;
        self.strict_from = u64::MAX;
    }

    /// vmtierd had completed `ticks` ticks after its reply to the change: tick `ticks + 1`
    /// applies it at the latest, and `ticks + 2` is the one tick of slack.
    fn settle(&mut self, ticks: u64) {
        self.strict_from = ticks + 2;
    }

    fn settled(&self) -> bool {
        self.strict_from != u64::MAX
    }

    /// The limit for a sample taken after vmtierd had completed `ticks` ticks.
    fn at(&self, ticks: u64) -> u64 {
        if ticks >= self.strict_from {
            self.budget
        } else {
            self.budget.max(self.previous)
        }
    }
}

/// The `/proc/vmstat` counters a phase is measured with.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    pgmigrate_success: u64,
    pgmigrate_fail: u64,
    thp_migration_success: u64,
    kernel: u64,
    module: i64,
    module_skipped_thp: i64,
    module_skipped_hole: i64,
    module_skipped_busy: i64,
}

impl Counters {
    fn read() -> Self {
        Self {
            pgmigrate_success: vmstat("pgmigrate_success"),
            pgmigrate_fail: vmstat("pgmigrate_fail"),
            thp_migration_success: vmstat("thp_migration_success"),
            kernel: KERNEL_MIGRATIONS.iter().map(|k| vmstat(k)).sum(),
            module: kstat("pages_moved"),
            module_skipped_thp: kstat("pages_skipped_thp"),
            module_skipped_hole: kstat("pages_skipped_hole"),
            module_skipped_busy: kstat("pages_skipped_busy"),
        }
    }

    /// Pages migrated since `base`, kernel-initiated migrations excluded.
    fn moved_since(&self, base: &Self) -> u64 {
        (self.pgmigrate_success - base.pgmigrate_success).saturating_sub(self.kernel - base.kernel)
    }

    /// Pages the module moved since `base` (0 without the module).
    fn module_since(&self, base: &Self) -> u64 {
        if base.module < 0 || self.module < 0 {
            return 0;
        }
        u64::try_from(self.module - base.module).unwrap_or(0)
    }
}

/// `status VM` over vmtierd's socket (the JSON request vmtierctl sends). Inside the testbed
/// every run of vmtierctl is read from the 9p share of target/ (mounted `cache=none`), which
/// costs 0.4–4 s under TCG: too slow to look once per tick.
fn status(socket: &Path, vm: &VmId) -> Option<VmStatus> {
    crate::daemon::status_over(socket, vm, Duration::from_secs(60))
}

fn taint() -> u64 {
    fs::read_to_string("/proc/sys/kernel/tainted")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The bracketed choice of a sysfs selector such as `always [madvise] never`.
fn selected(text: &str) -> Option<&str> {
    let s = text.split_once('[')?.1;
    Some(s.split_once(']')?.0)
}

fn mib(b: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let m = b as f64 / f64::from(1u32 << 20);
    format!("{m:.1} MiB")
}

/// Pages whose node differs between two samples of the same pages.
fn node_changes(a: &[NodeQuery], b: &[NodeQuery]) -> u64 {
    a.iter()
        .zip(b)
        .filter(|(x, y)| matches!((x, y), (NodeQuery::On(p), NodeQuery::On(q)) if p != q))
        .count() as u64
}

/// One phase: a fresh guest, a fresh vmtierd, budget changes until `target` pages moved.
#[allow(clippy::too_many_lines)]
fn run_phase(c: &mut Checks, a: &SoakArgs, ph: Phase, target: u64) -> Option<Value> {
    let name = ph.name();
    let t0 = Instant::now();
    let taint0 = taint();
    let thp_mode = if ph.thp { "always" } else { "never" };
    let now = fs::write(THP_ENABLED, thp_mode)
        .ok()
        .and_then(|()| fs::read_to_string(THP_ENABLED).ok())
        .unwrap_or_default();
    if !c.check(
        selected(&now) == Some(thp_mode),
        &format!("{name}: THP set to {thp_mode}"),
        now.trim(),
    ) {
        return None;
    }
    let dir = std::env::var("VMTIER_RUN")
        .map_or_else(|_| std::env::temp_dir(), PathBuf::from)
        .join("soak")
        .join(name.replace(' ', "-"));
    let _ = fs::create_dir_all(&dir);
    let append = format!(
        "hot={}K shift_after={} sweep_every={} report=5 duration={}",
        a.hot.0 >> 10,
        a.shift_after,
        a.sweep_every,
        a.phase_timeout + 600
    );
    let mut g = match Guest::start("qemu-system-x86_64", &a.elf, a.ram, 1, &append) {
        Ok(g) => g,
        Err(e) => {
            c.fatal(&format!("{name}: start QEMU"), e);
            return None;
        }
    };
    g.echo = false;
    if g.wait_for("WG start", Duration::from_secs(60)).is_none()
        || g.wait_for("WG filled", Duration::from_secs(600)).is_none()
    {
        c.fatal(
            &format!("{name}: guest starts and fills its RAM"),
            g.seen.join(" | "),
        );
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
    let thp_bytes = guest_thp_bytes(&layout);
    c.check(
        if ph.thp {
            thp_bytes >= layout.total_bytes() / 2
        } else {
            thp_bytes == 0
        },
        &format!("{name}: the guest's RAM is on {} pages", ph.page()),
        format!(
            "AnonHugePages {} of {}",
            ByteSize(thp_bytes),
            ByteSize(layout.total_bytes())
        ),
    );
    let pages = GuestPages::new(&layout);
    let mut prev_nodes = match pages.sample() {
        Ok(p) => {
            let dram = p.bytes_on(NodeId::new(0));
            c.check(
                dram == 0,
                &format!("{name}: the guest's RAM starts on node 1"),
                format!("{} in DRAM", ByteSize(dram)),
            );
            p.nodes().to_vec()
        }
        Err(e) => {
            c.fatal(&format!("{name}: sample the guest's pages"), e);
            return None;
        }
    };

    // Unix sockets cannot live on the 9p share that holds the run directory.
    let socket = std::env::temp_dir().join(format!("vmtierd-soak-{}.sock", std::process::id()));
    let _ = fs::remove_file(&socket);
    let mut limit = Limit::new(a.budgets[0].0);
    let config = format!(
        "[daemon]\nsocket = \"{}\"\ninterval_ms = {}\nrate_limit_mbps = 100000\nmigrator = \"{}\"\n\n\
         [[vm]]\nname = \"guest\"\nqmp = \"{}\"\nbudget = \"{}K\"\n",
        socket.display(),
        a.interval_ms,
        ph.migrator(),
        g.qmp.display(),
        limit.budget >> 10
    );
    let base = Counters::read();
    let mut d = match Daemon::start(&dir, &socket, &config) {
        Ok(d) => d,
        Err(e) => {
            c.fatal(&format!("{name}: start vmtierd"), e);
            return None;
        }
    };
    let log = d.log_text();
    let migrator_line = log
        .lines()
        .find(|l| l.contains("migrator:"))
        .unwrap_or("")
        .trim()
        .to_owned();
    c.check(
        migrator_line.contains(if ph.kmod {
            "kernel module"
        } else {
            "move_pages(2)"
        }),
        &format!("{name}: vmtierd moves pages with {}", ph.migrator()),
        &migrator_line,
    );

    // A watcher asks vmtierd for its status, one request at a time: the engine answers
    // between ticks only, and a tick that moves 100 MiB takes many seconds under TCG.
    let vm: VmId = "guest".parse().expect("a valid VM name");
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, statuses) = mpsc::channel::<(Instant, Duration, Option<VmStatus>)>();
    let watcher = {
        let (socket, vm, stop) = (socket.clone(), vm.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let st = status(&socket, &vm);
                if tx.send((asked, asked.elapsed(), st)).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    // The loop: a sample when vmtierd completed a tick, and at least once per tick length
    // of wall time inside a long tick; a budget change every 2–3 ticks.
    let t_loop = Instant::now();
    let tick_len = Duration::from_millis(a.interval_ms);
    let (mut idx, mut changes, mut next_change, mut ticks) = (0usize, 0u32, 3u64, 0u64);
    let (mut samples, mut mid_tick, mut max_dram, mut seen_changes) = (0u64, 0u64, 0u64, 0u64);
    let mut sampled_ticks: Vec<u64> = Vec::new();
    let mut over: Vec<String> = Vec::new();
    let mut states: Vec<String> = Vec::new();
    let (mut in_pass_max, mut status_failures, mut replies) = (0u64, 0u32, 0u64);
    let mut last_sample: Option<(Instant, u64)> = None;
    // When the last set-budget reply came, until a status asked after it settles the limit.
    let mut replied: Option<Instant> = None;
    let mut issued = 0u64;
    // The budget vmtierd's next status must show; vmtierctl replies lost to its timeout.
    let mut confirm: Option<u64> = None;
    let mut ctl_lost: Vec<String> = Vec::new();
    let mut not_taken: Option<String> = None;
    // Longest wait for a status reply: vmtierd answers between ticks, so this is a lower
    // bound of its longest tick (its own last_tick_us is overwritten by the catch-up tick
    // that follows a long one).
    let mut longest_wait = Duration::ZERO;
    let mut timed_out = false;
    std::thread::scope(|sc| {
        let mut pending: Option<(u64, std::thread::ScopedJoinHandle<'_, (bool, String)>)> = None;
        loop {
            if t_loop.elapsed() > Duration::from_secs(a.phase_timeout) {
                timed_out = true;
                break;
            }
            // A set-budget that has finished: its reply (or its loss) starts the wait for a
            // status asked after it.
            if pending.as_ref().is_some_and(|(_, h)| h.is_finished()) {
                if let Some((b, h)) = pending.take() {
                    let (ok, out) = h
                        .join()
                        .unwrap_or_else(|_| (false, "vmtierctl thread panicked".into()));
                    if !ok {
                        ctl_lost.push(out.trim().to_owned());
                    }
                    replied = Some(Instant::now());
                    confirm = Some(b);
                }
            }
            while let Ok((asked, waited, st)) = statuses.try_recv() {
                let Some(st) = st else {
                    status_failures += 1;
                    continue;
                };
                replies += 1;
                ticks = ticks.max(st.metrics.ticks);
                longest_wait = longest_wait.max(waited);
                if st.summary.state != "active" {
                    states.push(format!("tick {}: {}", st.metrics.ticks, st.summary.state));
                }
                if replied.is_some_and(|r| asked >= r) {
                    if let Some(b) = confirm.take().filter(|&b| b != st.summary.budget_bytes) {
                        not_taken = Some(format!(
                            "asked for {}, vmtierd shows {} ({})",
                            ByteSize(b),
                            ByteSize(st.summary.budget_bytes),
                            ctl_lost.last().map_or("", String::as_str)
                        ));
                    }
                    limit.settle(st.metrics.ticks);
                    replied = None;
                    next_change =
                        (issued + if changes % 2 == 0 { 2 } else { 3 }).max(limit.strict_from);
                }
            }
            if not_taken.is_some() {
                break;
            }
            if status_failures > 20 {
                c.fatal(
                    &format!("{name}: vmtierd answers status requests"),
                    status_failures,
                );
                break;
            }
            let new_tick = last_sample.map_or(ticks > 0, |(_, t)| ticks > t);
            let inside = last_sample.is_some_and(|(at, _)| at.elapsed() >= tick_len);
            if !new_tick && !inside {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            // `ticks` is a lower bound of the ticks completed now, so the limit is never too
            // strict; pages that move during the pass may be counted on both nodes.
            let m0 = vmstat("pgmigrate_success");
            let t_pass = Instant::now();
            let nodes = match pages.sample() {
                Ok(p) => p.nodes().to_vec(),
                Err(e) => {
                    c.fatal(&format!("{name}: sample the guest's pages"), e);
                    break;
                }
            };
            let pass_ms = t_pass.elapsed().as_millis();
            let in_pass = vmstat("pgmigrate_success") - m0;
            in_pass_max = in_pass_max.max(in_pass);
            last_sample = Some((Instant::now(), ticks));
            samples += 1;
            if new_tick {
                sampled_ticks.push(ticks);
            } else {
                mid_tick += 1;
            }
            let dram = nodes
                .iter()
                .filter(|q| **q == NodeQuery::On(NodeId::new(0)))
                .count() as u64
                * PageSize::Base.bytes();
            max_dram = max_dram.max(dram);
            seen_changes += node_changes(&prev_nodes, &nodes);
            prev_nodes = nodes;
            let allowed = limit.at(ticks);
            if dram > allowed + in_pass * PageSize::Base.bytes() {
                over.push(format!(
                    "tick {ticks}: {} > {} (+{in_pass} pages moved during the pass)",
                    mib(dram),
                    ByteSize(allowed)
                ));
            }
            let moved = Counters::read().moved_since(&base);
            println!(
                "  [{name}] tick {ticks:>3}{}  budget {:>8}  limit {:>8}  DRAM {:>10}  migrated {moved:>6}  {:.1} s  (pass {pass_ms} ms)",
                if new_tick { " " } else { "+" },
                ByteSize(limit.budget).to_string(),
                ByteSize(allowed).to_string(),
                mib(dram),
                t0.elapsed().as_secs_f64(),
            );
            // Done when the share is moved, the budget was raised and cut at least once,
            // and the last budget has been checked strictly.
            if moved >= target && changes >= 2 && ticks >= limit.strict_from {
                break;
            }
            // vmtierctl runs on its own thread: vmtierd answers it only between ticks, and the
            // samples go on meanwhile.
            if pending.is_none() && limit.settled() && ticks >= next_change {
                idx = (idx + 1) % a.budgets.len();
                let b = a.budgets[idx].0;
                issued = ticks;
                limit.change(b);
                let d = &d;
                pending = Some((
                    b,
                    sc.spawn(move || d.ctl(&["set-budget", "guest", &format!("{}K", b >> 10)])),
                ));
                changes += 1;
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    sampled_ticks.dedup();
    let loop_s = t_loop.elapsed().as_secs_f64();
    let end = Counters::read();
    let end_status = status(&socket, &vm);
    let (_, human) = d.ctl(&["status", "guest"]);
    let end_ticks = end_status.as_ref().map_or(ticks, |s| s.metrics.ticks);
    if let Some(st) = end_status.as_ref().filter(|s| s.summary.state != "active") {
        states.push(format!("end: {}", st.summary.state));
    }
    let migrated = end.moved_since(&base);
    let by_module = end.module_since(&base);
    let raw = end.pgmigrate_success - base.pgmigrate_success;

    c.check(
        migrated >= target && !timed_out,
        &format!("{name}: migrated its share of pages"),
        format!(
            "{migrated} ≥ {target} base pages (pgmigrate_success +{raw}, kernel's own {}, THPs {}){}",
            end.kernel - base.kernel,
            end.thp_migration_success - base.thp_migration_success,
            if timed_out {
                format!(", timed out after {} s", a.phase_timeout)
            } else {
                String::new()
            }
        ),
    );
    c.check(
        not_taken.is_none(),
        &format!("{name}: vmtierd took every new budget"),
        not_taken.clone().unwrap_or_else(|| {
            format!(
                "{changes} shown by its status after vmtierctl set-budget; {} vmtierctl replies lost (longest wait for a reply {:.1} s, {}){}",
                ctl_lost.len(),
                longest_wait.as_secs_f64(),
                clock(),
                ctl_lost.first().map_or_else(String::new, |m| format!(": {m}"))
            )
        }),
    );
    c.check(
        changes >= 2,
        &format!("{name}: the budget was raised and cut"),
        format!("{changes} budget changes"),
    );
    c.check(
        samples > 0 && over.is_empty(),
        &format!(
            "{name}: DRAM never above the budget (the old one until the cut's tick and one more)"
        ),
        if over.is_empty() {
            format!(
                "max {} over {samples} samples ({mid_tick} inside long ticks; {} of {} ticks sampled); at most {in_pass_max} pages moved during a pass",
                mib(max_dram),
                sampled_ticks.len(),
                end_ticks
            )
        } else {
            over.join("; ")
        },
    );
    c.check(
        states.is_empty() && status_failures == 0,
        &format!("{name}: vmtierd's VM state stays active"),
        if states.is_empty() {
            format!("active in all {replies} status replies")
        } else {
            format!("{} (status failures {status_failures})", states.join("; "))
        },
    );
    c.check(
        raw >= seen_changes,
        &format!("{name}: the counters cover every page move seen from outside"),
        format!("pgmigrate_success +{raw} ≥ {seen_changes} node changes between samples"),
    );
    if ph.kmod {
        let metrics = end_status.as_ref().map(|s| s.metrics).unwrap_or_default();
        let skipped_thp =
            u64::try_from(end.module_skipped_thp - base.module_skipped_thp).unwrap_or(0);
        // THP off: the module moves (nearly) every page. THP on: it skips PMD-mapped THPs
        // and vmtierd hands them to move_pages(2) (its fallback pages). Either way the
        // module adds its pages to pgmigrate_success.
        let share_ok = if ph.thp {
            skipped_thp > 0 && metrics.fallback_pages > 0
        } else {
            by_module * 10 >= migrated * 9
        };
        c.check(
            share_ok && raw >= by_module,
            &format!("{name}: the module's share"),
            format!(
                "pages_moved +{by_module}, by move_pages(2) {}; module skipped {skipped_thp} THP pages, vmtierd fallback {} pages{}",
                migrated.saturating_sub(by_module),
                metrics.fallback_pages,
                if ph.thp {
                    " (THPs go to move_pages)"
                } else {
                    " (want ≥ 90% by the module)"
                }
            ),
        );
    }
    let metrics = end_status.as_ref().map(|s| s.metrics).unwrap_or_default();
    for l in human.lines() {
        println!("  [{name}] vmtierctl status | {l}");
    }
    let code = d.stop();
    let _ = watcher.join();
    c.check(
        code == Some(0),
        &format!("{name}: vmtierd exits 0 on SIGTERM"),
        format!("{code:?}"),
    );
    let kdamonds = vmtier_sources::damon::Sysfs::new(vmtier_sources::damon::DEFAULT_ROOT).running();
    c.check(
        kdamonds == 0,
        &format!("{name}: no kdamond left running"),
        format!("{kdamonds} on"),
    );
    g.request_stop();
    let done = g
        .wait_for("WG done", Duration::from_secs(600))
        .unwrap_or_default();
    let exit = g.wait_exit(Duration::from_secs(30));
    let corrupted = num(&done, "corrupted");
    let shifted = g.seen.iter().any(|l| l.starts_with("WG hotshift"));
    c.check(
        corrupted == Some(0) && exit == Some(1),
        &format!("{name}: guest reports zero corrupted words"),
        format!("{done}; QEMU exit {exit:?}; hot set moved: {shifted}"),
    );
    let t = taint();
    c.check(
        t & BAD_TAINT == taint0 & BAD_TAINT,
        &format!("{name}: kernel not tainted (M, B, D, W, L)"),
        format!("tainted {taint0} -> {t}"),
    );
    drop(g);
    let wall = t0.elapsed().as_secs_f64();
    let sampling = json!({
        "samples": samples,
        "samples_inside_long_ticks": mid_tick,
        "ticks_sampled": sampled_ticks.len(),
        "max_dram_bytes": max_dram,
        "most_pages_moved_during_a_pass": in_pass_max,
        "over_budget": over,
        "non_active_states": states,
        "status_replies": replies,
        "vmtierctl_replies_lost": ctl_lost,
        "longest_status_wait_s": longest_wait.as_secs_f64(),
    });
    Some(json!({
        "phase": name,
        "migrator": ph.migrator(),
        "thp": ph.thp,
        "pages_migrated": migrated,
        "pages_by_module": by_module,
        "pages_by_move_pages": migrated.saturating_sub(by_module),
        "target_pages": target,
        "pgmigrate_success_delta": raw,
        "pgmigrate_fail_delta": end.pgmigrate_fail - base.pgmigrate_fail,
        "thp_migration_success_delta": end.thp_migration_success - base.thp_migration_success,
        "module_pages_skipped_thp": end.module_skipped_thp - base.module_skipped_thp,
        "module_pages_skipped_hole": end.module_skipped_hole - base.module_skipped_hole,
        "module_pages_skipped_busy": end.module_skipped_busy - base.module_skipped_busy,
        "kernel_migrations_excluded": end.kernel - base.kernel,
        "node_changes_seen": seen_changes,
        "budget_changes": changes,
        "budgets_bytes": a.budgets.iter().map(|b| b.0).collect::<Vec<_>>(),
        "ticks": metrics.ticks,
        "sampling": sampling,
        "guest_thp_bytes": thp_bytes,
        "guest_corrupted_words": corrupted,
        "guest_hot_set_moved": shifted,
        "vmtierd_exit": code,
        "vmtierd": {
            "promoted_bytes": metrics.promoted_bytes,
            "demoted_bytes": metrics.demoted_bytes,
            "failed_pages": metrics.failed_pages,
            "busy_pages": metrics.busy_pages,
            "deferred_granules": metrics.deferred_granules,
            "retried_granules": metrics.retried_granules,
            "pending_granules": metrics.pending_granules,
            "migration_errors": metrics.migration_errors,
            "fallback_pages": metrics.fallback_pages,
            "fallback_errors": metrics.fallback_errors,
            "source_errors": metrics.source_errors,
            "max_fast_bytes": metrics.max_fast_bytes,
        },
        "migration_loop_s": loop_s,
        "wall_s": wall,
        "clock": clock(),
    }))
}

fn load_module(c: &mut Checks, ko_dir: &Path) -> Option<bool> {
    if Path::new(vmtier_migrate::kmod::DEVICE).exists() {
        return Some(false);
    }
    let (ok, out) = sh(&format!("insmod {}/vmtier.ko", ko_dir.display()));
    c.check(
        ok && Path::new(vmtier_migrate::kmod::DEVICE).exists(),
        "insmod vmtier.ko",
        if out.is_empty() {
            "/dev/vmtier present"
        } else {
            &out
        },
    )
    .then_some(true)
}

pub fn run(c: &mut Checks, a: &SoakArgs) {
    let Some(phases) = a
        .phases
        .iter()
        .map(|p| Phase::parse(p))
        .collect::<Option<Vec<_>>>()
        .filter(|p| !p.is_empty())
    else {
        return c.fatal("phases", a.phases.join(","));
    };
    if a.budgets.is_empty() {
        return c.fatal("budgets", "none given");
    }
    let target = a.migrations.div_ceil(phases.len() as u64);
    let thp_saved = fs::read_to_string(THP_ENABLED).unwrap_or_default();
    let Some(thp_saved) = selected(&thp_saved).map(str::to_owned) else {
        return c.fatal("read THP setting", thp_saved.trim());
    };
    println!(
        "soak: {} phases, ≥ {} base pages each (≥ {} in all), guest {} with a {} hot set, budgets {}, tick {} ms (times {})",
        phases.len(),
        target,
        a.migrations,
        a.ram,
        a.hot,
        a.budgets
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" → "),
        a.interval_ms,
        clock()
    );
    let mut loaded = false;
    let mut rows = Vec::new();
    for &ph in &phases {
        if ph.kmod && !loaded && !Path::new(vmtier_migrate::kmod::DEVICE).exists() {
            match load_module(c, &a.ko_dir) {
                Some(l) => loaded = l,
                None => break,
            }
        }
        if let Some(r) = run_phase(c, a, ph, target) {
            rows.push(r);
        }
    }
    let _ = fs::write(THP_ENABLED, &thp_saved);
    let now = fs::read_to_string(THP_ENABLED).unwrap_or_default();
    c.check(
        selected(&now) == Some(thp_saved.as_str()),
        "THP setting restored",
        now.trim(),
    );
    if loaded {
        let (ok, out) = sh("rmmod vmtier");
        c.check(ok, "rmmod vmtier (nothing left busy)", out);
    }

    let sum = |k: &str| rows.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
    let total = sum("pages_migrated");
    let wall: f64 = rows.iter().filter_map(|r| r["wall_s"].as_f64()).sum();
    let corrupted = sum("guest_corrupted_words");
    println!();
    println!(
        "{:<17} {:>14} {:>10} {:>14} {:>6} {:>8} {:>10}",
        "phase", "pages migrated", "by module", "budget changes", "ticks", "wall s", "corrupted"
    );
    for r in &rows {
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        println!(
            "{:<17} {:>14} {:>10} {:>14} {:>6} {:>8.1} {:>10}",
            r["phase"].as_str().unwrap_or(""),
            n("pages_migrated"),
            if r["migrator"] == "kmod" {
                n("pages_by_module").to_string()
            } else {
                "-".into()
            },
            n("budget_changes"),
            n("ticks"),
            r["wall_s"].as_f64().unwrap_or(0.0),
            r["guest_corrupted_words"]
                .as_u64()
                .map_or_else(|| "?".into(), |v| v.to_string())
        );
    }
    println!(
        "{:<17} {:>14} {:>10} {:>14} {:>6} {:>8.1} {:>10}",
        "total",
        total,
        sum("pages_by_module"),
        sum("budget_changes"),
        sum("ticks"),
        wall,
        corrupted
    );
    println!(
        "(pages are 4 KiB base pages, a THP counts 512; counted from /proc/vmstat and the module's pages_moved; wall s is {}: ratios only)",
        clock()
    );
    c.check(
        total >= a.migrations && rows.len() == phases.len(),
        "the soak migrated at least the pages asked for",
        format!(
            "{total} ≥ {} in {} of {} phases, {corrupted} corrupted words",
            a.migrations,
            rows.len(),
            phases.len()
        ),
    );
    let doc = json!({
        "target_pages": a.migrations,
        "total_pages_migrated": total,
        "total_corrupted_words": corrupted,
        "total_wall_s": wall,
        "clock": clock(),
        "guest_ram_bytes": a.ram.0,
        "hot_bytes": a.hot.0,
        "interval_ms": a.interval_ms,
        "phases": rows,
    });
    if let Some(dir) = a.out.parent() {
        let _ = fs::create_dir_all(dir);
    }
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    c.check(
        fs::write(&a.out, text + "\n").is_ok(),
        "write the JSON",
        a.out.display(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_parse() {
        assert_eq!(
            Phase::parse("kmod/THP"),
            Some(Phase {
                kmod: true,
                thp: true
            })
        );
        assert_eq!(
            Phase::parse("move_pages/4k").map(Phase::name).as_deref(),
            Some("move_pages 4 KiB")
        );
        assert_eq!(Phase::parse("dma/4k"), None);
        assert_eq!(Phase::parse("kmod"), None);
    }

    #[test]
    fn limit_keeps_the_old_budget_for_the_cut_tick_and_one_more() {
        let mut l = Limit::new(128);
        assert_eq!(l.at(0), 128);
        // Cut to 16; until vmtierd's tick count after the reply is known, 128 holds.
        l.change(16);
        assert!(!l.settled());
        assert_eq!(l.at(1000), 128);
        // 7 ticks done after the reply: tick 8 applies the cut, tick 9 is slack.
        l.settle(7);
        assert_eq!((l.at(7), l.at(8), l.at(9), l.at(10)), (128, 128, 16, 16));
        // A raise allows the new budget at once.
        l.change(96);
        assert_eq!(l.at(10), 96);
        l.settle(10);
        assert_eq!(l.at(12), 96);
    }

    #[test]
    fn sysfs_selection_and_node_changes() {
        assert_eq!(selected("always [madvise] never\n"), Some("madvise"));
        assert_eq!(selected("always madvise"), None);
        let (n0, n1) = (NodeQuery::On(NodeId::new(0)), NodeQuery::On(NodeId::new(1)));
        let a = [n0, n1, n1, NodeQuery::NotPresent];
        let b = [n1, n1, n0, n0];
        assert_eq!(node_changes(&a, &b), 2);
    }
}
