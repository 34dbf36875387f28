//! `tbcheck cpu-bench`: vmtierd's own CPU time per tick, natively on this host (not in the
//! testbed: TCG inflates CPU time). A child process maps and touches anonymous memory and
//! keeps writing a hot set (dense at the start, and one page in 97 all over, so that hybrid
//! tracking has mixed regions); vmtierd's engine manages it as a `pid` VM with its real parts
//! (the process backend, the probed hotness source, move_pages(2), the default policy) for
//! a number of 1 s ticks per configuration, and `getrusage(RUSAGE_SELF)` gives the engine's
//! CPU time; kdamond's (DAMON's kernel thread) is read from /proc as well. On a one-node host
//! every migration fails (node 1 does not exist) and is counted: tracking and planning run,
//! copying does not. Prints a table and writes JSON (`make bench-cpu`).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmtier_core::{ByteSize, VmId};
use vmtier_daemon::config::Config;
use vmtier_daemon::engine::{Engine, EngineConfig};
use vmtier_migrate::MovePages;

use crate::check::Checks;

#[derive(clap::Args, Debug)]
pub struct CpuBenchArgs {
    /// Memory the child maps and touches.
    #[arg(long, default_value = "4G")]
    size: ByteSize,
    /// Ticks measured per configuration (1 s each), after two warm-up ticks.
    #[arg(long, default_value_t = 20)]
    ticks: u64,
    /// Hotness source (auto, damon-vaddr, soft-dirty).
    #[arg(long, default_value = "auto")]
    source: String,
    /// Back the child's memory with transparent huge pages (default: 4 KiB pages).
    #[arg(long)]
    thp: bool,
    /// Write the figures here as JSON.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Internal: be the child (map, touch, print the range, write until killed).
    #[arg(long, hide = true)]
    child: bool,
}

/// The configurations measured: name, granule, detail_percent.
const CONFIGS: [(&str, &str, u8); 3] = [("2M", "2M", 0), ("hybrid", "2M", 20), ("4K", "4K", 0)];

/// The child: maps `size`, touches every page, prints `start len`, then writes forever.
fn child(a: &CpuBenchArgs) -> i32 {
    let len = usize::try_from(a.size.0).unwrap_or(usize::MAX);
    // SAFETY: an anonymous private mapping at an address of the kernel's choice; the result
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
        eprintln!("mmap {len} bytes failed");
        return 1;
    }
    let advice = if a.thp {
        libc::MADV_HUGEPAGE
    } else {
        libc::MADV_NOHUGEPAGE
    };
    // SAFETY: advice on the mapping just made, of its own length.
    unsafe { libc::madvise(p, len, advice) };
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

/// CPU time of this process (user + system).
fn self_cpu() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
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

/// One configuration's figures.
#[derive(Debug)]
struct Row {
    name: &'static str,
    ticks: u64,
    cpu_ms_per_tick: f64,
    kdamond_ms_per_tick: f64,
    source: String,
}

#[allow(clippy::cast_precision_loss)]
fn measure(
    c: &mut Checks,
    a: &CpuBenchArgs,
    (name, granule, detail): (&'static str, &str, u8),
    pid: i32,
    start: u64,
    len: u64,
) -> Option<Row> {
    let text = format!(
        "[daemon]\nsocket = \"/tmp/vmtier-cpu-bench.sock\"\nsource = \"{}\"\ngranule = \"{granule}\"\n\
         detail_percent = {detail}\nmigrator = \"move_pages\"\n\n\
         [[vm]]\nname = \"proc\"\npid = {pid}\nranges = [{{ start = \"{start:#x}\", len = \"{}K\" }}]\nbudget = \"{}K\"\n",
        a.source,
        len >> 10,
        (len / 4) >> 10
    );
    let cfg = match Config::parse(&text) {
        Ok(cfg) => cfg,
        Err(e) => {
            c.fatal(&format!("{name}: configuration"), e);
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
        fast_node_bytes: None,
        detail_percent: d.detail_percent,
    };
    let parts = match vmtier_daemon::parts::build(&cfg, &cfg.vms[0]) {
        Ok(p) => p,
        Err(e) => {
            c.fatal(&format!("{name}: build the VM's parts"), e);
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
        {
            c.fatal(&format!("{name}: attach"), e);
            return None;
        }
    }
    let status = engine.status(&vm).ok()?;
    let source = status.source.clone();
    let mut next = Instant::now();
    let mut tick = |engine: &mut Engine| {
        next += Duration::from_secs(1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        engine.tick();
    };
    for _ in 0..2 {
        tick(&mut engine);
    }
    let (cpu0, k0) = (self_cpu(), kdamond_ticks());
    for _ in 0..a.ticks {
        tick(&mut engine);
    }
    let cpu = self_cpu().saturating_sub(cpu0);
    let kd = kdamond_ticks().saturating_sub(k0);
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let st = engine.status(&vm).ok()?;
    c.check(
        st.metrics.ticks >= a.ticks,
        &format!("{name}: the engine ticked on the process"),
        format!(
            "{} ticks, source {source}, {} migration errors (one NUMA node)",
            st.metrics.ticks, st.metrics.migration_errors
        ),
    );
    let _ = engine.detach(&vm);
    let ticks = a.ticks.max(1);
    Some(Row {
        name,
        ticks,
        cpu_ms_per_tick: cpu.as_secs_f64() * 1e3 / ticks as f64,
        kdamond_ms_per_tick: kd as f64 * 1e3 / hz.max(1) as f64 / ticks as f64,
        source,
    })
}

/// Runs the benchmark (or, with `--child`, the child).
pub fn run(c: &mut Checks, a: &CpuBenchArgs) {
    if bench(c, a).is_none() {
        c.fatal("cpu-bench", "stopped early");
    }
}

#[allow(clippy::cast_precision_loss)]
fn bench(c: &mut Checks, a: &CpuBenchArgs) -> Option<()> {
    if a.child {
        std::process::exit(child(a));
    }
    let exe = std::env::current_exe().ok()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "cpu-bench",
        "--child",
        "--size",
        &format!("{}K", a.size.0 >> 10),
    ]);
    if a.thp {
        cmd.arg("--thp");
    }
    let mut ch = match cmd.stdout(Stdio::piped()).spawn() {
        Ok(ch) => Kill(ch),
        Err(e) => {
            c.fatal("start the child", e);
            return None;
        }
    };
    let pid = i32::try_from(ch.0.id()).ok()?;
    let mut line = String::new();
    let out = ch.0.stdout.take()?;
    if BufReader::new(out).read_line(&mut line).is_err() || line.is_empty() {
        {
            c.fatal("child maps its memory", "no range printed");
            return None;
        }
    }
    let mut it = line.split_whitespace();
    let start = u64::from_str_radix(it.next()?.trim_start_matches("0x"), 16).ok()?;
    let len: u64 = it.next()?.parse().ok()?;
    let gib = len as f64 / f64::from(1u32 << 30);
    let mut rows = Vec::new();
    for conf in CONFIGS {
        if let Some(r) = measure(c, a, conf, pid, start, len) {
            rows.push(r);
        }
    }
    println!(
        "cpu-bench: {} of {} pages, {} ticks of 1 s per row",
        ByteSize(len),
        if a.thp { "2 MiB" } else { "4 KiB" },
        a.ticks
    );
    println!("tracking  source                     vmtierd ms/tick  per GiB  kdamond ms/tick  64 GiB: % of a core");
    let mut json = Vec::new();
    for r in &rows {
        let per_gib = r.cpu_ms_per_tick / gib;
        let pct64 = per_gib * 64.0 / 1000.0 * 100.0;
        println!(
            "{:<9} {:<26} {:>15.2} {:>8.3} {:>16.2} {:>20.2}",
            r.name,
            r.source.chars().take(26).collect::<String>(),
            r.cpu_ms_per_tick,
            per_gib,
            r.kdamond_ms_per_tick,
            pct64
        );
        json.push(serde_json::json!({
            "tracking": r.name,
            "source": r.source,
            "ticks": r.ticks,
            "vmtierd_cpu_ms_per_tick": r.cpu_ms_per_tick,
            "vmtierd_cpu_ms_per_tick_per_gib": per_gib,
            "kdamond_cpu_ms_per_tick": r.kdamond_ms_per_tick,
            "extrapolated_64g_percent_of_a_core": pct64,
        }));
    }
    if let Some(path) = &a.out {
        let doc = serde_json::json!({
            "bytes": len,
            "thp": a.thp,
            "rows": json,
        });
        let text = serde_json::to_string_pretty(&doc).ok()?;
        if let Some(dir) = path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        if let Err(e) = std::fs::write(path, text) {
            {
                c.fatal("write the JSON", e);
                return None;
            }
        }
        println!("json {}", path.display());
    }
    Some(())
}
