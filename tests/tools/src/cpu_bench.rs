//! `tbcheck cpu-bench`: vmtierd's own CPU time per tick, split into tracking (ticks in which
//! nothing moved) and moving (CPU per MiB moved), at several guest sizes so that a fixed cost
//! and a cost per GiB can be fitted and extrapolated to 64 GiB (`make bench-cpu`).
//!
//! For each size and tracking mode (2M, hybrid, 4K) a fresh child process maps and touches
//! anonymous memory (on node 1 when there is one, as a guest on CXL would be) and keeps
//! writing a hot set (dense: the first eighth; and one page in 97 all over, so that hybrid
//! tracking has mixed regions); vmtierd's engine manages it as a `pid` VM with its real parts
//! (the process backend, the probed hotness source, move_pages(2), the default policy) for
//! warm-up ticks then measured ticks of 1 s. Per tick: the engine's CPU time
//! (`CLOCK_PROCESS_CPUTIME_ID` around `Engine::tick`: move_pages copying is charged to it),
//! and pages migrated on the whole machine (`/proc/vmstat` pgmigrate_success, over the tick
//! and the sleep before it: judged from outside, not from the engine's counters). A tick
//! with no page migrated is *quiet*; the steady cost is the quiet ticks' median, with the
//! placement-refresh ticks (every `refresh_ticks`) averaged separately and amortised; the
//! moving cost is the CPU above that baseline in the other ticks per MiB moved. kdamond's
//! CPU (DAMON's kernel thread, not vmtierd's) is read from /proc over the measured ticks.
//!
//! In the TCG testbed the times are emulated: with `--native-micro` (the same
//! microbenchmarks run outside the testbed, `cpu_factor`), the emulation factors convert
//! the 64 GiB extrapolation into a native estimate, a range over the factors. On a one-node
//! host every migration fails and is counted: tracking and planning run, copying does not.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmtier_core::{ByteSize, VmId};
use vmtier_daemon::config::Config;
use vmtier_daemon::engine::{Engine, EngineConfig};
use vmtier_migrate::MovePages;

use crate::check::{self, Checks};
use crate::cpu_factor;

#[derive(clap::Args, Debug)]
pub struct CpuBenchArgs {
    /// Memory the child maps and touches; several sizes (comma-separated) fit a fixed cost
    /// and a cost per GiB.
    #[arg(long = "size", value_delimiter = ',', default_value = "1G,4G")]
    sizes: Vec<ByteSize>,
    /// Ticks measured per size and tracking mode (1 s each), after the warm-up ticks.
    #[arg(long, default_value_t = 30)]
    ticks: u64,
    /// Warm-up ticks per size and tracking mode, not measured.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Hotness source (auto, damon-vaddr, soft-dirty).
    #[arg(long, default_value = "auto")]
    source: String,
    /// Back the child's memory with transparent huge pages (default: 4 KiB pages).
    #[arg(long)]
    thp: bool,
    /// Tracking modes to measure (comma-separated: 2M, hybrid, 4K).
    #[arg(long = "mode", value_delimiter = ',', default_value = "2M,hybrid,4K")]
    modes: Vec<String>,
    /// Extra `[daemon.policy_params]` lines for the default policy, e.g.
    /// `sustained_heat = false` (empty: the policy's defaults).
    #[arg(long, default_value = "")]
    policy_params: String,
    /// Write the figures here as JSON.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only run the emulation-factor microbenchmarks and write them to --out.
    #[arg(long)]
    micro_only: bool,
    /// Only check that the engine can manage a process here: exit status 0 if it can.
    #[arg(long)]
    probe: bool,
    /// The microbenchmarks run natively (a `--micro-only` JSON): turns the times measured
    /// here (in the TCG testbed) into native estimates.
    #[arg(long)]
    native_micro: Option<PathBuf>,
    /// Internal: be the child (map, touch, print the range, write until killed).
    #[arg(long, hide = true)]
    child: bool,
    /// Internal: the child's preferred NUMA node.
    #[arg(long, hide = true)]
    child_node: Option<u32>,
}

/// The tracking modes measured: name, granule, detail_percent.
const MODES: [(&str, &str, u8); 3] = [("2M", "2M", 0), ("hybrid", "2M", 20), ("4K", "4K", 0)];

/// Quiet non-refresh ticks a size needs to be a point of the fit.
const MIN_QUIET: usize = 3;

/// The NUMA-balancing sysctl.
const NUMA_BALANCING: &str = "/proc/sys/kernel/numa_balancing";

/// The target: 1 % of one core at a 1 s tick, i.e. 10 ms of CPU per tick, per 64 GiB.
const TARGET_MS_PER_TICK_64G: f64 = 10.0;

/// The child: maps `size`, touches every page, prints `start len`, then writes forever.
fn child(a: &CpuBenchArgs) -> i32 {
    let Some(size) = a.sizes.first() else {
        return 1;
    };
    let len = usize::try_from(size.0).unwrap_or(usize::MAX);
    if let Some(node) = a.child_node.filter(|n| *n < 64) {
        let mask: libc::c_ulong = 1 << node;
        // SAFETY: set_mempolicy reads one word of node mask, of 64 bits.
        let r = unsafe {
            libc::syscall(
                libc::SYS_set_mempolicy,
                libc::MPOL_PREFERRED,
                &mask as *const libc::c_ulong,
                64 as libc::c_ulong,
            )
        };
        if r != 0 {
            eprintln!("set_mempolicy: {}", std::io::Error::last_os_error());
            return 1;
        }
    }
    let advice = if a.thp {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    let p = match crate::mem::map_anon(len, Some(advice)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("mmap {len} bytes failed: {e}");
            return 1;
        }
    };
    let base = p.cast::<u8>();
    let pages = len / 4096;
    let touch = |i: usize, v: u8| {
        // SAFETY: i < pages, so the byte is inside the mapping; only this thread uses it.
        unsafe { base.add(i * 4096).write_volatile(v) };
    };
    for i in 0..pages {
        touch(i, 1);
    }
    println!("{:#x} {len}", base as usize);
    let _ = std::io::stdout().flush();
    let hot = (pages / 8).max(1);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    loop {
        for k in 0..4096u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let r = usize::try_from(x % (pages as u64)).unwrap_or(0);
            let i = if k % 16 == 0 { r - r % 97 } else { r % hot };
            touch(i, u8::try_from(k & 0xff).unwrap_or(0));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// CPU time of this process, every thread (the engine runs on this one).
fn process_cpu() -> Duration {
    // SAFETY: a zeroed timespec for clock_gettime to fill.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// A counter of /proc/vmstat (0 when absent).
fn vmstat(name: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

/// CPU time of every kdamond thread, in clock ticks.
fn kdamond_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut sum = 0;
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.starts_with("kdamond") {
            continue;
        }
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        // Fields after the ")" closing the command name: state is field 3, utime 14, stime 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        sum += num(11) + num(12);
    }
    sum
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One measured tick.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    /// The engine's tick number.
    tick: u64,
    /// The engine's CPU time in the tick, ms.
    cpu_ms: f64,
    /// Pages migrated on the machine over the tick and the sleep before it.
    moved_pages: u64,
    /// A placement-refresh tick (`tick % refresh_ticks == 0`).
    refresh: bool,
    /// Bytes the engine says it moved in the tick (for attribution only: quiet is judged
    /// from /proc/vmstat).
    engine_moved_bytes: u64,
}

/// The figures of one size and mode's ticks.
#[derive(Clone, Debug, Default, PartialEq)]
struct Summary {
    /// Quiet ticks (nothing migrated) that are not refresh ticks.
    quiet: usize,
    /// Quiet refresh ticks.
    quiet_refresh: usize,
    /// Median CPU of the quiet non-refresh ticks, ms.
    steady_ms: Option<f64>,
    /// Median CPU of the quiet refresh ticks, ms.
    refresh_ms: Option<f64>,
    /// The steady CPU per tick with the refresh amortised over `refresh_ticks` ticks, ms;
    /// the non-refresh mean when no quiet refresh tick was measured (`refresh_covered`).
    amortised_ms: Option<f64>,
    /// Whether a quiet refresh tick is in `amortised_ms` (or refreshes are off).
    refresh_covered: bool,
    /// Ticks in which pages moved.
    moving_ticks: usize,
    /// MiB moved in them.
    moved_mib: f64,
    /// CPU above the quiet baseline in the moving ticks, per MiB moved, ms.
    ms_per_mib: Option<f64>,
}

#[allow(clippy::cast_precision_loss)]
fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, s) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| s / n as f64)
}

/// The median (the mean of the middle two of an even count); `None` when empty. Under TCG a
/// tick's CPU time includes the time the host did not run the vCPU, so ticks on a loaded host
/// have outliers: the median is the typical tick.
fn median(v: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Splits the ticks into quiet and moving and computes the steady and moving costs.
#[allow(clippy::cast_precision_loss)]
fn summarise(samples: &[Sample], refresh_ticks: u64) -> Summary {
    let quiet = |s: &&Sample| s.moved_pages == 0;
    let steady_ms = median(
        samples
            .iter()
            .filter(quiet)
            .filter(|s| !s.refresh)
            .map(|s| s.cpu_ms),
    );
    let refresh_ms = median(
        samples
            .iter()
            .filter(quiet)
            .filter(|s| s.refresh)
            .map(|s| s.cpu_ms),
    );
    let (amortised_ms, refresh_covered) = match (steady_ms, refresh_ms) {
        _ if refresh_ticks == 0 => (steady_ms, true),
        (Some(s), Some(r)) => {
            let n = refresh_ticks as f64;
            (Some((s * (n - 1.0) + r) / n), true)
        }
        (Some(s), None) => (Some(s), false),
        (None, r) => (r.map(|r| r / refresh_ticks as f64), false),
    };
    let moving: Vec<&Sample> = samples.iter().filter(|s| s.moved_pages > 0).collect();
    let moved_mib = moving.iter().map(|s| s.moved_pages as f64).sum::<f64>() / 256.0;
    let ms_per_mib = steady_ms.filter(|_| moved_mib > 0.0).map(|base| {
        let excess: f64 = moving
            .iter()
            .map(|s| {
                s.cpu_ms
                    - if s.refresh {
                        refresh_ms.unwrap_or(base)
                    } else {
                        base
                    }
            })
            .sum();
        excess / moved_mib
    });
    Summary {
        quiet: samples.iter().filter(quiet).filter(|s| !s.refresh).count(),
        quiet_refresh: samples.iter().filter(quiet).filter(|s| s.refresh).count(),
        steady_ms,
        refresh_ms,
        amortised_ms,
        refresh_covered,
        moving_ticks: moving.len(),
        moved_mib,
        ms_per_mib,
    }
}

/// Least-squares fit of `ms = fixed + slope * gib` over the points: (fixed, slope), or
/// `None` without two distinct sizes.
#[allow(clippy::cast_precision_loss)]
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let mx = mean(points.iter().map(|p| p.0))?;
    let my = mean(points.iter().map(|p| p.1))?;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    if n < 2.0 || sxx <= f64::EPSILON {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    Some((my - slope * mx, slope))
}

/// The verdict on a native estimate range (ms per tick at 64 GiB) against the target.
fn verdict(lo: f64, hi: f64) -> &'static str {
    if hi <= TARGET_MS_PER_TICK_64G {
        "meets"
    } else if lo > TARGET_MS_PER_TICK_64G {
        "misses"
    } else {
        "undecided"
    }
}

/// One size and mode's figures.
#[derive(Debug)]
struct Row {
    mode: &'static str,
    bytes: u64,
    source: String,
    samples: Vec<Sample>,
    summary: Summary,
    kdamond_ms_per_tick: f64,
}

/// The engine's configuration for one mode over the child's range.
fn config(a: &CpuBenchArgs, granule: &str, detail: u8, pid: i32, start: u64, len: u64) -> String {
    let params = if a.policy_params.is_empty() {
        String::new()
    } else {
        format!("[daemon.policy_params]\n{}\n\n", a.policy_params)
    };
    format!(
        "[daemon]\nsocket = \"/tmp/vmtier-cpu-bench.sock\"\nsource = \"{}\"\ngranule = \"{granule}\"\n\
         detail_percent = {detail}\nmigrator = \"move_pages\"\n\n{params}\
         [[vm]]\nname = \"proc\"\npid = {pid}\nranges = [{{ start = \"{start:#x}\", len = \"{}K\" }}]\nbudget = \"{}K\"\n",
        a.source,
        len >> 10,
        (len / 4) >> 10
    )
}

/// Starts a child of `size`: the child and its range (start, length).
fn spawn_child(c: &mut Checks, a: &CpuBenchArgs, size: ByteSize) -> Option<(Kill, u64, u64)> {
    let exe = std::env::current_exe().ok()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "cpu-bench",
        "--child",
        "--size",
        &format!("{}K", size.0 >> 10),
    ]);
    if a.thp {
        cmd.arg("--thp");
    }
    if Path::new("/sys/devices/system/node/node1").exists() {
        cmd.args(["--child-node", "1"]);
    }
    let mut ch = match cmd.stdout(Stdio::piped()).spawn() {
        Ok(ch) => Kill(ch),
        Err(e) => {
            c.fatal("start the child", e);
            return None;
        }
    };
    let mut line = String::new();
    let out = ch.0.stdout.take()?;
    if BufReader::new(out).read_line(&mut line).is_err() || line.is_empty() {
        c.fatal("child maps its memory", "no range printed");
        return None;
    }
    let mut it = line.split_whitespace();
    let start = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
    let len: u64 = it.next()?.parse().ok()?;
    Some((ch, start, len))
}

/// The engine with one `pid` VM on the child: the engine, the VM, its refresh_ticks.
fn attach(
    c: &mut Checks,
    a: &CpuBenchArgs,
    what: &str,
    (granule, detail): (&str, u8),
    pid: i32,
    start: u64,
    len: u64,
) -> Option<(Engine, VmId, u64)> {
    let cfg = match Config::parse(&config(a, granule, detail, pid, start, len)) {
        Ok(cfg) => cfg,
        Err(e) => {
            c.fatal(&format!("{what}: configuration"), e);
            return None;
        }
    };
    let d = &cfg.daemon;
    let ecfg = EngineConfig {
        interval: Duration::from_millis(d.interval_ms),
        fast_node: d.fast_node,
        slow_node: d.slow_node,
        rate_limit_bytes_per_s: d.rate_limit_mbps.saturating_mul(1_000_000),
        granule: d.granule,
        refresh_ticks: d.refresh_ticks,
        refresh: d.refresh,
        fast_node_bytes: None,
        detail_percent: d.detail_percent,
    };
    let parts = match vmtier_daemon::parts::build(&cfg, &cfg.vms[0]) {
        Ok(p) => p,
        Err(e) => {
            c.fatal(&format!("{what}: build the VM's parts"), e);
            return None;
        }
    };
    let mut engine = Engine::new(
        ecfg,
        Box::new(MovePages::default()),
        Box::new(MovePages::default()),
    );
    let vm: VmId = "proc".parse().ok()?;
    if let Err(e) = engine.attach(vm.clone(), ByteSize(len / 4), parts) {
        c.fatal(&format!("{what}: attach"), e);
        return None;
    }
    Some((engine, vm, d.refresh_ticks))
}

#[allow(clippy::cast_precision_loss)]
fn measure(
    c: &mut Checks,
    a: &CpuBenchArgs,
    size: ByteSize,
    (mode, granule, detail): (&'static str, &str, u8),
) -> Option<Row> {
    let what = format!("{} {mode}", ByteSize(size.0));
    let (_child, start, len) = spawn_child(c, a, size)?;
    let pid = i32::try_from(_child.0.id()).ok()?;
    let (mut engine, vm, refresh_ticks) = attach(c, a, &what, (granule, detail), pid, start, len)?;
    let source = engine.status(&vm).ok()?.source;
    let mut next = Instant::now();
    let mut samples = Vec::new();
    let mut moved0 = vmstat("pgmigrate_success");
    let mut k0 = kdamond_ticks();
    let mut engine_moved0 = 0;
    for i in 0..a.warmup + a.ticks {
        next += Duration::from_secs(1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        if i == a.warmup {
            k0 = kdamond_ticks();
        }
        let cpu0 = process_cpu();
        engine.tick();
        let cpu = process_cpu().saturating_sub(cpu0);
        let moved = vmstat("pgmigrate_success");
        let m = engine.status(&vm).ok()?.metrics;
        let by_engine = m.promoted_bytes + m.demoted_bytes;
        if i >= a.warmup {
            samples.push(Sample {
                tick: m.ticks,
                cpu_ms: cpu.as_secs_f64() * 1e3,
                moved_pages: moved.saturating_sub(moved0),
                refresh: refresh_ticks > 0 && m.ticks % refresh_ticks == 0,
                engine_moved_bytes: by_engine.saturating_sub(engine_moved0),
            });
        }
        engine_moved0 = by_engine;
        moved0 = moved;
    }
    let kd = kdamond_ticks().saturating_sub(k0);
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let st = engine.status(&vm).ok()?;
    c.check(
        st.metrics.ticks == a.warmup + a.ticks && !st.summary.state.starts_with("failed"),
        &format!("{what}: the engine ticked on the process"),
        format!(
            "{} ticks, source {source}, state {}, {} migration errors",
            st.metrics.ticks, st.summary.state, st.metrics.migration_errors
        ),
    );
    let _ = engine.detach(&vm);
    let summary = summarise(&samples, refresh_ticks);
    Some(Row {
        mode,
        bytes: len,
        source,
        samples,
        summary,
        kdamond_ms_per_tick: kd as f64 * 1e3 / hz.max(1) as f64 / a.ticks.max(1) as f64,
    })
}

/// Runs the benchmark (or, with `--child`, the child).
pub fn run(c: &mut Checks, a: &CpuBenchArgs) {
    if a.child {
        std::process::exit(child(a));
    }
    if a.probe {
        std::process::exit(i32::from(!probe(c, a)));
    }
    if a.micro_only {
        if micro_only(c, a).is_none() {
            c.fatal("cpu-bench --micro-only", "stopped early");
        }
        return;
    }
    if let Some(m) = a
        .modes
        .iter()
        .find(|m| !MODES.iter().any(|x| x.0 == m.as_str()))
    {
        return c.fatal(
            "cpu-bench --mode",
            format!("Unknown tracking mode {m:?} (2M, hybrid, 4K)"),
        );
    }
    if bench(c, a).is_none() {
        c.fatal("cpu-bench", "stopped early");
    }
}

/// Whether the engine can attach to a small child here.
fn probe(c: &mut Checks, a: &CpuBenchArgs) -> bool {
    let Some((ch, start, len)) = spawn_child(c, a, ByteSize(16 << 20)) else {
        return false;
    };
    let Ok(pid) = i32::try_from(ch.0.id()) else {
        return false;
    };
    attach(c, a, "probe", ("2M", 0), pid, start, len).is_some()
}

fn write_json(c: &mut Checks, path: &Path, doc: &Value) -> Option<()> {
    let text = serde_json::to_string_pretty(doc).ok()?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(path, text) {
        c.fatal("write the JSON", e);
        return None;
    }
    println!("json {}", path.display());
    Some(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn micro_only(c: &mut Checks, a: &CpuBenchArgs) -> Option<()> {
    let load = loadavg();
    let m = match cpu_factor::run() {
        Ok(m) => m,
        Err(e) => {
            c.fatal("microbenchmarks", e);
            return None;
        }
    };
    // Every factor's figure a time: a NaN or 0 is a benchmark that did not run.
    let timed = cpu_factor::NAMES.iter().all(|(name, _)| {
        m.get(name)
            .and_then(Value::as_f64)
            .is_some_and(|x| x.is_finite() && x > 0.0)
    });
    c.check(
        timed,
        "microbenchmarks",
        format!("{m} (load average {load})"),
    );
    for l in cpu_factor::huge_map_lines(&m, check::clock(), Config::default().daemon.refresh_ticks)
    {
        println!("{l}");
    }
    let doc = json!({ "clock": check::clock(), "load_average": load, "micro": m });
    match &a.out {
        Some(p) => write_json(c, p, &doc),
        None => Some(()),
    }
}

#[allow(clippy::cast_precision_loss, clippy::too_many_lines)]
fn bench(c: &mut Checks, a: &CpuBenchArgs) -> Option<()> {
    let clock = check::clock();
    let native: Option<Value> = match &a.native_micro {
        None => None,
        Some(p) => {
            match std::fs::read_to_string(p)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()))
            {
                Ok(v) => Some(v),
                Err(e) => {
                    c.fatal(&format!("read {}", p.display()), e);
                    return None;
                }
            }
        }
    };
    let here = match cpu_factor::run() {
        Ok(m) => m,
        Err(e) => {
            c.fatal("microbenchmarks", e);
            return None;
        }
    };
    let factors = match &native {
        Some(n) => match cpu_factor::factors(&here, n.get("micro")?) {
            Ok(f) => Some(f),
            Err(e) => {
                c.fatal("emulation factors", e);
                return None;
            }
        },
        None => None,
    };
    // NUMA balancing would move the child's pages too (towards its preferred node, against
    // vmtierd): off for the run inside the testbed; on a real host it is reported.
    let nb = std::fs::read_to_string(NUMA_BALANCING).unwrap_or_default();
    let nb = nb.trim();
    if nb != "0" && !nb.is_empty() {
        if clock == "host" {
            println!("cpu-bench: warning: kernel.numa_balancing is {nb}: its migrations make ticks count as moving");
        } else if let Err(e) = std::fs::write(NUMA_BALANCING, "0") {
            c.fatal("turn NUMA balancing off in the testbed", e);
            return None;
        } else {
            println!("cpu-bench: kernel.numa_balancing was {nb}, set to 0 for the run");
        }
    }
    let mut rows = Vec::new();
    for &size in &a.sizes {
        for mode in MODES
            .into_iter()
            .filter(|m| a.modes.iter().any(|x| x == m.0))
        {
            rows.push(measure(c, a, size, mode)?);
        }
    }

    println!(
        "cpu-bench: vmtierd's CPU per tick ({clock} clock), {} ticks of 1 s per row after {} warm-up, {} pages, placement refresh every {} ticks",
        a.ticks,
        a.warmup,
        if a.thp { "2 MiB" } else { "4 KiB" },
        rows.first().map_or(0, |r| r
            .samples
            .iter()
            .find(|s| s.refresh)
            .map_or(0, |s| s.tick))
    );
    let opt = |x: Option<f64>, w: usize| x.map_or(format!("{:>w$}", "-"), |x| format!("{x:>w$.2}"));
    println!("size      tracking  source          quiet  refresh  steady ms  refresh ms  amortised ms  moving  MiB moved  ms/MiB moved  kdamond ms");
    for r in &rows {
        let s = &r.summary;
        println!(
            "{:<9} {:<9} {:<15} {:>5} {:>8} {} {} {}{} {:>7} {:>10.1} {} {:>11.1}",
            ByteSize(r.bytes).to_string(),
            r.mode,
            r.source.chars().take(15).collect::<String>(),
            format!("{}/{}", s.quiet + s.quiet_refresh, r.samples.len()),
            s.quiet_refresh,
            opt(s.steady_ms, 10),
            opt(s.refresh_ms, 11),
            opt(s.amortised_ms, 13),
            if s.refresh_covered { " " } else { "*" },
            s.moving_ticks,
            s.moved_mib,
            opt(s.ms_per_mib, 13),
            r.kdamond_ms_per_tick
        );
    }
    if rows.iter().any(|r| !r.summary.refresh_covered) {
        println!("* no quiet refresh tick measured: the non-refresh median, refresh not included");
    }
    if let Some(f) = &factors {
        println!("emulation factors (testbed time / native time, same code):");
        for (name, kind, x) in f {
            println!(
                "  {name:<20} {:<9} native {:>10.3}  here {:>10.3}  factor {x:>6.1}",
                kind.name(),
                native
                    .as_ref()
                    .and_then(|n| n["micro"][name].as_f64())
                    .unwrap_or(f64::NAN),
                here[name].as_f64().unwrap_or(f64::NAN),
            );
        }
    }
    // The huge-page map as the target host reads it: the native figures where there are.
    let refresh_ticks = Config::default().daemon.refresh_ticks;
    match native.as_ref().and_then(|n| n.get("micro")) {
        Some(n) => cpu_factor::huge_map_lines(n, "host", refresh_ticks),
        None => cpu_factor::huge_map_lines(&here, clock, refresh_ticks),
    }
    .iter()
    .for_each(|l| println!("{l}"));
    // The steady tick is store, policy and syscalls: the range over those factors; moving
    // adds copying: the range over every factor.
    let range = |with_copy: bool| match (&factors, clock) {
        (Some(f), _) => {
            let it = || {
                f.iter()
                    .filter(move |x| with_copy || x.1 != cpu_factor::Kind::Copy)
                    .map(|x| x.2)
            };
            (it().fold(f64::INFINITY, f64::min), it().fold(0.0, f64::max))
        }
        (None, "host") => (1.0, 1.0),
        (None, _) => (f64::NAN, f64::NAN),
    };
    let (fmin, fmax) = range(false);
    let (mmin, mmax) = range(true);
    println!(
        "fit per tracking mode over the quiet ticks: ms per tick = fixed + slope x GiB (all: refresh amortised; no refresh: without it); at 64 GiB; native estimate = that / factor ({fmin:.1}..{fmax:.1}); target <= {TARGET_MS_PER_TICK_64G} ms per tick (1 % of a core at 1 s)"
    );
    println!("tracking  ticks        fixed ms  ms per GiB  64 GiB ms ({clock})  native estimate ms  % of a core   verdict");
    let mut fits = Vec::new();
    for (mode, _, _) in MODES {
        let points = |f: fn(&Summary) -> Option<f64>| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|r| r.mode == mode)
                .filter_map(|r| Some((r.bytes as f64 / f64::from(1u32 << 30), f(&r.summary)?)))
                .collect()
        };
        // A point needs MIN_QUIET quiet ticks; with the refresh, a quiet refresh tick too.
        let all = |s: &Summary| {
            s.amortised_ms
                .filter(|_| s.refresh_covered && s.quiet >= MIN_QUIET)
        };
        let no_refresh = |s: &Summary| s.steady_ms.filter(|_| s.quiet >= MIN_QUIET);
        let mut fj = serde_json::Map::new();
        fj.insert("tracking".into(), json!(mode));
        for (label, key, pts) in [
            ("all", "all_ticks", points(all)),
            ("no refresh", "without_refresh", points(no_refresh)),
        ] {
            let Some((fixed, slope)) = fit(&pts) else {
                println!("{mode:<9} {label:<12} (needs {MIN_QUIET} quiet ticks, and with the refresh a quiet refresh tick, at two sizes)");
                fj.insert(key.into(), json!({ "points": pts }));
                continue;
            };
            let at64 = fixed + 64.0 * slope;
            let (lo, hi) = (at64 / fmax, at64 / fmin);
            // A negative figure at 64 GiB is a fit through noise, not a cost.
            let v = if lo.is_finite() && lo >= 0.0 {
                verdict(lo, hi)
            } else {
                "-"
            };
            println!(
                "{mode:<9} {label:<12} {fixed:>8.2} {slope:>11.3} {at64:>24.1} {:>19} {:>12}   {v}",
                format!("{lo:.2}..{hi:.2}"),
                format!("{:.2}..{:.2}", lo / 10.0, hi / 10.0)
            );
            fj.insert(
                key.into(),
                json!({
                    "points": pts,
                    "fixed_ms_per_tick": fixed,
                    "slope_ms_per_tick_per_gib": slope,
                    "at_64g_ms_per_tick": at64,
                    "native_estimate_64g_ms_per_tick": [lo, hi],
                    "native_estimate_64g_percent_of_a_core_at_1s": [lo / 10.0, hi / 10.0],
                    "verdict": v,
                }),
            );
        }
        let (mib, excess) = rows
            .iter()
            .filter(|r| r.mode == mode)
            .filter_map(|r| {
                Some((
                    r.summary.moved_mib,
                    r.summary.ms_per_mib? * r.summary.moved_mib,
                ))
            })
            .fold((0.0, 0.0), |(m, e), (m1, e1)| (m + m1, e + e1));
        let per_mib = (mib > 0.0).then(|| excess / mib);
        fj.insert("moving_ms_per_mib".into(), json!(per_mib));
        fj.insert(
            "moving_native_estimate_ms_per_mib".into(),
            json!(per_mib.map(|x| [x / mmax, x / mmin])),
        );
        fits.push((mode, per_mib, Value::Object(fj)));
    }
    println!("moving: CPU above the quiet baseline per MiB moved, native estimate = that / factor ({mmin:.1}..{mmax:.1}, copying included)");
    for (mode, per_mib, _) in &fits {
        let moved: f64 = rows
            .iter()
            .filter(|r| r.mode == *mode)
            .map(|r| r.summary.moved_mib)
            .sum();
        match per_mib {
            Some(x) => println!(
                "{mode:<9} {x:>8.2} ms per MiB ({clock}), native estimate {:.3}..{:.3} ms per MiB",
                x / mmax,
                x / mmin
            ),
            None if moved > 0.0 => println!(
                "{mode:<9} {moved:.1} MiB moved, but no quiet tick to measure the moving cost against"
            ),
            None => println!("{mode:<9} nothing moved"),
        }
    }
    let fits: Vec<Value> = fits.into_iter().map(|f| f.2).collect();
    c.check(
        rows.iter().all(|r| r.summary.amortised_ms.is_some()),
        "every row had quiet ticks",
        rows.iter()
            .map(|r| {
                format!(
                    "{} {}: {}",
                    ByteSize(r.bytes),
                    r.mode,
                    r.summary.quiet + r.summary.quiet_refresh
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    );
    if let Some(path) = &a.out {
        let rows: Vec<Value> = rows
            .iter()
            .map(|r| {
                let s = &r.summary;
                json!({
                    "bytes": r.bytes,
                    "tracking": r.mode,
                    "source": r.source,
                    "ticks": r.samples.len(),
                    "quiet_ticks": s.quiet,
                    "quiet_refresh_ticks": s.quiet_refresh,
                    "steady_ms_per_tick": s.steady_ms,
                    "refresh_ms_per_tick": s.refresh_ms,
                    "amortised_ms_per_tick": s.amortised_ms,
                    "refresh_covered": s.refresh_covered,
                    "moving_ticks": s.moving_ticks,
                    "moved_mib": s.moved_mib,
                    "moving_ms_per_mib": s.ms_per_mib,
                    "kdamond_ms_per_tick": r.kdamond_ms_per_tick,
                    "per_tick": r.samples.iter().map(|t| json!({
                        "tick": t.tick, "cpu_ms": t.cpu_ms, "moved_pages": t.moved_pages, "refresh": t.refresh,
                        "engine_moved_bytes": t.engine_moved_bytes,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({
            "clock": clock,
            "thp": a.thp,
            "ticks": a.ticks,
            "warmup": a.warmup,
            "target_ms_per_tick_64g": TARGET_MS_PER_TICK_64G,
            "micro_here": here,
            "micro_native": native,
            "factors": factors.as_ref().map(|f| f.iter().map(|(n, k, x)| json!({"name": n, "kind": k.name(), "factor": x})).collect::<Vec<_>>()),
            "rows": rows,
            "fits": fits,
        });
        write_json(c, path, &doc)?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(tick: u64, cpu_ms: f64, moved_pages: u64) -> Sample {
        Sample {
            tick,
            cpu_ms,
            moved_pages,
            refresh: tick % 10 == 0,
            engine_moved_bytes: moved_pages * 4096,
        }
    }

    #[test]
    fn summarise_separates_quiet_refresh_and_moving_ticks() {
        // (samples, refresh_ticks, quiet, quiet_refresh, steady, refresh, amortised, covered,
        //  moving ticks, MiB moved, ms per MiB)
        type Case = (
            Vec<Sample>,
            u64,
            (usize, usize),
            (Option<f64>, Option<f64>, Option<f64>, bool),
            (usize, f64, Option<f64>),
        );
        let cases: Vec<Case> = vec![
            // Quiet ticks at 2 ms, a refresh at 12 ms: amortised (9 * 2 + 12) / 10 = 3.
            (
                vec![s(8, 2.0, 0), s(9, 2.0, 0), s(10, 12.0, 0), s(11, 2.0, 0)],
                10,
                (3, 1),
                (Some(2.0), Some(12.0), Some(3.0), true),
                (0, 0.0, None),
            ),
            // A tick moving 512 pages (2 MiB) at 22 ms over a 2 ms baseline: 10 ms per MiB.
            (
                vec![s(1, 22.0, 512), s(2, 2.0, 0), s(3, 2.0, 0)],
                10,
                (2, 0),
                (Some(2.0), None, Some(2.0), false),
                (1, 2.0, Some(10.0)),
            ),
            // A moving refresh tick is measured against the refresh baseline.
            (
                vec![s(10, 32.0, 256), s(20, 12.0, 0), s(21, 2.0, 0)],
                10,
                (1, 1),
                (Some(2.0), Some(12.0), Some(3.0), true),
                (1, 1.0, Some(20.0)),
            ),
            // A loaded tick (40 ms) does not move the median.
            (
                vec![s(1, 2.0, 0), s(2, 40.0, 0), s(3, 2.0, 0)],
                10,
                (3, 0),
                (Some(2.0), None, Some(2.0), false),
                (0, 0.0, None),
            ),
            // Refreshes off: the quiet median is the steady cost, covered.
            (
                vec![s(1, 4.0, 0), s(2, 6.0, 0)],
                0,
                (2, 0),
                (Some(5.0), None, Some(5.0), true),
                (0, 0.0, None),
            ),
            // Nothing quiet: no steady cost, no moving cost.
            (
                vec![s(1, 4.0, 1), s(2, 6.0, 1)],
                10,
                (0, 0),
                (None, None, None, false),
                (2, 2.0 / 256.0, None),
            ),
        ];
        for (samples, r, (q, qr), (st, rf, am, cov), (mt, mib, per)) in cases {
            let got = summarise(&samples, r);
            assert_eq!((got.quiet, got.quiet_refresh), (q, qr), "{samples:?}");
            assert_eq!(
                (got.steady_ms, got.refresh_ms, got.amortised_ms),
                (st, rf, am),
                "{samples:?}"
            );
            assert_eq!(got.refresh_covered, cov, "{samples:?}");
            assert_eq!(got.moving_ticks, mt, "{samples:?}");
            assert!((got.moved_mib - mib).abs() < 1e-9, "{samples:?}");
            assert_eq!(got.ms_per_mib, per, "{samples:?}");
        }
    }

    #[test]
    fn median_is_the_middle_or_the_mean_of_the_middle_two() {
        let cases: [(&[f64], Option<f64>); 4] = [
            (&[], None),
            (&[3.0], Some(3.0)),
            (&[9.0, 1.0, 2.0], Some(2.0)),
            (&[1.0, 100.0, 2.0, 4.0], Some(3.0)),
        ];
        for (v, want) in cases {
            assert_eq!(median(v.iter().copied()), want, "{v:?}");
        }
    }

    #[test]
    fn fit_finds_fixed_and_slope() {
        type Points = &'static [(f64, f64)];
        let cases: [(Points, Option<(f64, f64)>); 5] = [
            (&[(0.25, 12.0), (0.75, 14.0)], Some((11.0, 4.0))),
            (&[(1.0, 5.0), (2.0, 5.0), (3.0, 5.0)], Some((5.0, 0.0))),
            (&[(1.0, 1.0), (2.0, 3.0), (3.0, 2.0)], Some((1.0, 0.5))),
            (&[(0.5, 3.0)], None),
            (&[(0.5, 3.0), (0.5, 4.0)], None),
        ];
        for (pts, want) in cases {
            match (fit(pts), want) {
                (Some((f, s)), Some((wf, ws))) => {
                    assert!(
                        (f - wf).abs() < 1e-9 && (s - ws).abs() < 1e-9,
                        "{pts:?}: {f} {s}"
                    );
                }
                (None, None) => {}
                (got, want) => panic!("{pts:?}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn verdict_is_decided_only_when_the_whole_range_is_on_one_side() {
        let cases = [
            (1.0, 9.9, "meets"),
            (10.0, 10.0, "meets"),
            (9.0, 11.0, "undecided"),
            (10.1, 50.0, "misses"),
        ];
        for (lo, hi, want) in cases {
            assert_eq!(verdict(lo, hi), want, "{lo}..{hi}");
        }
    }
}
