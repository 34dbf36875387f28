//! vmtierd end to end: the workload guest under QEMU with its RAM on the CXL node, the real
//! vmtierd managing it through QMP, vmtierctl changing its budget — measured from outside by
//! querying where every page of the guest is, every tick.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vmtier_backends::qemu::QemuBackend;
use vmtier_core::{ByteSize, NodeId, PageSize};
use vmtier_daemon::proto::{Reply, Response, VmStatus};

use crate::check::Checks;
use crate::guest::{num, Guest, GuestPages};

#[derive(clap::Args, Debug)]
pub struct DaemonArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// Guest RAM.
    #[arg(long, default_value = "256M")]
    ram: ByteSize,
    /// Hot-set size.
    #[arg(long, default_value = "32M")]
    hot: ByteSize,
    /// DRAM budget.
    #[arg(long, default_value = "64M")]
    budget: ByteSize,
    /// Budget set at runtime after promotion (0 = skip the demotion phase).
    #[arg(long, default_value = "16M")]
    lower_budget: ByteSize,
    /// Ticks allowed to get 90% of the hot set into DRAM.
    #[arg(long, default_value_t = 20)]
    ticks: u64,
    /// Move the hot set after this many seconds of guest run time and check it is followed.
    #[arg(long)]
    shift_after: Option<u64>,
    /// vmtierd's hotness source (auto, damon-vaddr, soft-dirty).
    #[arg(long, default_value = "auto")]
    source: String,
    /// Tick length.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// vmtierd's migrator (auto, move_pages, kmod). With `kmod`, the module must be
    /// loaded and is checked to have moved pages.
    #[arg(long, default_value = "auto")]
    migrator: String,
    /// Demo output: a live progress line and a summary table.
    #[arg(long)]
    demo: bool,
    /// Check that the guest's RAM is on 4 KiB pages (run with THP off): the weak-signal
    /// case, where one accessed bit covers one page instead of 512.
    #[arg(long)]
    expect_4k: bool,
    /// vmtierd's `detail_percent` (hybrid 2 MiB / 4 KiB tracking); 0 leaves it out.
    #[arg(long, default_value_t = 0)]
    detail_percent: u8,
}

/// A running vmtierd and the way to talk to it.
pub struct Daemon {
    child: Child,
    /// Control socket.
    pub socket: PathBuf,
    /// Its log (stderr).
    pub log: PathBuf,
    bin: PathBuf,
}

/// Runs vmtierctl against a daemon's socket; `Send`, for pollers on their own thread.
#[derive(Clone, Debug)]
pub struct Probe {
    bin: PathBuf,
    socket: PathBuf,
}

impl Probe {
    /// Runs vmtierctl with `args`; returns (success, stdout + stderr).
    pub fn ctl(&self, args: &[&str]) -> (bool, String) {
        crate::check::output(
            Command::new(self.bin.join("vmtierctl"))
                .arg("--socket")
                .arg(&self.socket)
                .args(args),
        )
    }

    /// VM's status asked over the control socket from this process: the same request and
    /// reply as `vmtierctl status`, without starting a process (which takes over a second in
    /// the testbed, longer than a tick).
    pub fn status_direct(&self, vm: &str) -> Option<VmStatus> {
        status_over(&self.socket, &vm.parse().ok()?, Duration::from_secs(30))
    }

    /// `vmtierctl --json status VM`, parsed.
    pub fn status(&self, vm: &str) -> Option<VmStatus> {
        let (ok, out) = self.ctl(&["--json", "status", vm]);
        match serde_json::from_str::<Response>(out.lines().next()?).ok()? {
            Response::Ok(Reply::Status(s)) if ok => Some(*s),
            _ => None,
        }
    }
}

/// Directory of our own binary: vmtierd and vmtierctl are built next to tbcheck.
pub fn bin_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default()
}

/// A VM's status asked over vmtierd's control socket at `socket` (one request, one reply
/// line), waiting at most `timeout` for the reply.
pub fn status_over(
    socket: &std::path::Path,
    vm: &vmtier_core::VmId,
    timeout: Duration,
) -> Option<VmStatus> {
    use std::io::{BufRead as _, BufReader};
    let req = vmtier_daemon::proto::Request::Status { vm: vm.clone() };
    let mut s = std::os::unix::net::UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    let mut line = serde_json::to_string(&req).ok()?;
    line.push('\n');
    s.write_all(line.as_bytes()).ok()?;
    let mut reply = String::new();
    BufReader::new(&s).read_line(&mut reply).ok()?;
    match serde_json::from_str::<Response>(&reply).ok()? {
        Response::Ok(Reply::Status(st)) => Some(*st),
        _ => None,
    }
}

impl Daemon {
    /// Writes `config` to `dir/vmtierd.toml` and starts vmtierd; waits for its socket
    /// (`socket`, which the config must name too).
    pub fn start(dir: &Path, socket: &Path, config: &str) -> std::io::Result<Self> {
        let cfg = dir.join("vmtierd.toml");
        std::fs::write(&cfg, config)?;
        let log = dir.join("vmtierd.log");
        let bin = bin_dir();
        let child = Command::new(bin.join("vmtierd"))
            .arg("--config")
            .arg(&cfg)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let mut d = Self {
            child,
            socket: socket.to_owned(),
            log,
            bin,
        };
        let t = Instant::now();
        while !d.socket.exists() && t.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(st)) = d.child.try_wait() {
                return Err(std::io::Error::other(format!(
                    "vmtierd exited ({st}): {}",
                    d.log_text()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(d)
    }

    /// vmtierd's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Runs vmtierctl with `args`; returns (success, stdout + stderr).
    pub fn ctl(&self, args: &[&str]) -> (bool, String) {
        self.probe().ctl(args)
    }

    /// `vmtierctl --json status VM`, parsed.
    pub fn status(&self, vm: &str) -> Option<VmStatus> {
        self.probe().status(vm)
    }

    /// [`Probe::status_direct`].
    pub fn status_direct(&self, vm: &str) -> Option<VmStatus> {
        self.probe().status_direct(vm)
    }

    /// A handle that runs vmtierctl against this daemon from another thread.
    pub fn probe(&self) -> Probe {
        Probe {
            bin: self.bin.clone(),
            socket: self.socket.clone(),
        }
    }

    /// Polls `vm`'s state until it starts with `prefix` or `timeout` passes; the last state.
    pub fn wait_state(&self, vm: &str, prefix: &str, timeout: Duration) -> String {
        self.wait_state_traced(vm, prefix, timeout).0
    }

    /// As [`Self::wait_state`], with the other states the VM was seen in on the way (in
    /// order, without repeats) and how long the wait took.
    pub fn wait_state_traced(
        &self,
        vm: &str,
        prefix: &str,
        timeout: Duration,
    ) -> (String, Vec<String>, Duration) {
        let t = Instant::now();
        let mut seen: Vec<String> = Vec::new();
        loop {
            let state = self.status(vm).map(|s| s.summary.state).unwrap_or_default();
            if state.starts_with(prefix) || t.elapsed() >= timeout {
                return (state, seen, t.elapsed());
            }
            if !state.is_empty() && seen.last() != Some(&state) {
                seen.push(state);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// SIGTERM, then the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(i32::try_from(self.child.id()).unwrap_or(0), libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sample of where the guest's memory is.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    dram: u64,
    cxl: u64,
    hot_dram: u64,
    old_hot_dram: u64,
    /// The guest's own code, stack and tables (below its fill area) in DRAM.
    own_dram: u64,
    /// vmtierd's tick count (ticks since attach) when the sample was taken.
    tick: u64,
}

/// One pass over every page of the guest: all of a sample's figures come from it.
fn sample(pages: &GuestPages, hot: (u64, u64), old_hot: Option<(u64, u64)>, own: u64) -> Sample {
    let (n0, n1) = (NodeId::new(0), NodeId::new(1));
    let Ok(p) = pages.sample() else {
        return Sample::default();
    };
    Sample {
        dram: p.bytes_on(n0),
        cxl: p.bytes_on(n1),
        hot_dram: p.gpa_bytes_on(n0, hot.0, hot.1),
        old_hot_dram: old_hot.map_or(0, |h| p.gpa_bytes_on(n0, h.0, h.1)),
        own_dram: p.gpa_bytes_on(n0, 0, own),
        tick: 0,
    }
}

fn pct(part: u64, whole: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let p = 100.0 * part as f64 / whole.max(1) as f64;
    p
}

struct Run<'a> {
    a: &'a DaemonArgs,
    t0: Instant,
    pages: GuestPages,
    /// End of the guest's own memory (code, stack, tables), guest physical.
    own: u64,
    d: Daemon,
    g: Guest,
}

impl Run<'_> {
    fn show(&mut self, phase: &str, s: &Sample, hot_bytes: u64) {
        self.g.poll();
        let line = format!(
            "[{phase:<9}] t={:>5.1} s tick {:>3}  DRAM {:>10}  CXL {:>10}  hot set in DRAM {:>5.1}%",
            self.t0.elapsed().as_secs_f64(),
            s.tick,
            ByteSize(s.dram).to_string(),
            ByteSize(s.cxl).to_string(),
            pct(s.hot_dram, hot_bytes)
        );
        if self.a.demo {
            print!("\r{line}   ");
            let _ = std::io::stdout().flush();
        } else {
            println!("  {line}");
        }
    }

    /// Samples once per tick until `done` holds or `max` samples were taken; returns the
    /// samples, each with vmtierd's tick count.
    fn watch(
        &mut self,
        phase: &str,
        hot: (u64, u64),
        old: Option<(u64, u64)>,
        max: u64,
        done: &dyn Fn(&Sample) -> bool,
    ) -> Vec<Sample> {
        let mut out = Vec::new();
        let tick = Duration::from_millis(self.a.interval_ms);
        for _ in 0..max {
            std::thread::sleep(tick);
            let mut s = sample(&self.pages, hot, old, self.own);
            s.tick = self.d.status("guest").map_or(0, |st| st.metrics.ticks);
            self.show(phase, &s, hot.1);
            out.push(s);
            if done(&s) {
                break;
            }
        }
        if self.a.demo {
            println!();
        }
        out
    }
}

/// `[daemon.damon]` region limits the daemon checks give vmtierd: not its defaults (520 /
/// 1560), so a kdamond found with them shows the setting reached DAMON. The demo runs the
/// defaults.
const DAMON_REGIONS: (u64, u64) = (500, 1500);

pub fn run(c: &mut Checks, a: &DaemonArgs) {
    let dir = std::env::var("VMTIER_RUN")
        .map_or_else(|_| std::env::temp_dir(), PathBuf::from)
        .join("daemon");
    let _ = std::fs::create_dir_all(&dir);
    let mut append = format!("hot={}K report=1", a.hot.0 >> 10);
    if let Some(s) = a.shift_after {
        append += &format!(" shift_after={s}");
    }
    if a.demo {
        println!(
            "vmtier demo: a {} guest on the CXL node (node 1), hot set {}, DRAM budget {}",
            a.ram, a.hot, a.budget
        );
        println!(
            "(times are {}: compare them only with each other)",
            crate::check::clock()
        );
    }
    let mut g = match Guest::start("qemu-system-x86_64", &a.elf, a.ram, 1, &append) {
        Ok(g) => g,
        Err(e) => return c.fatal("start QEMU", e),
    };
    g.echo = !a.demo;
    let Some(start) = g.wait_for("WG start", Duration::from_secs(60)) else {
        return c.fatal("guest starts", "no 'WG start'");
    };
    let hot = (
        num(&start, "hot_start").unwrap_or(0),
        num(&start, "hot_bytes").unwrap_or(0),
    );
    let fill_start = num(&start, "fill_start").unwrap_or(0);
    if g.wait_for("WG filled", Duration::from_secs(600)).is_none() {
        return c.fatal("guest fills its RAM", "no 'WG filled'");
    }
    // Our own look at the layout, to measure from outside; the QMP connection is closed
    // again before vmtierd connects (QEMU serves one QMP client at a time).
    let layout = match QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .and_then(|mut b| b.discover())
    {
        Ok(l) => l,
        Err(e) => return c.fatal("locate guest RAM through QMP", e),
    };
    // Where the guest is before vmtierd starts: the baseline for checking its counters.
    let pages = GuestPages::new(&layout);
    let initial = sample(&pages, hot, None, fill_start);
    // Unix sockets cannot live on the 9p share that holds the run directory.
    let socket = std::env::temp_dir().join(format!("vmtierd-{}.sock", std::process::id()));
    let regions = if a.demo {
        let d = vmtier_sources::damon::DamonConfig::default().attrs;
        (d.min_nr_regions, d.max_nr_regions)
    } else {
        DAMON_REGIONS
    };
    let config = format!(
        "[daemon]\nsocket = \"{}\"\ninterval_ms = {}\nrate_limit_mbps = 2000\nsource = \"{}\"\nmigrator = \"{}\"\n\n\
         [daemon.damon]\nmin_nr_regions = {}\nmax_nr_regions = {}\n\n\
         [[vm]]\nname = \"guest\"\nqmp = \"{}\"\nbudget = \"{}K\"\n",
        socket.display(),
        a.interval_ms,
        a.source,
        a.migrator,
        regions.0,
        regions.1,
        g.qmp.display(),
        a.budget.0 >> 10
    );
    let config = if a.detail_percent > 0 {
        config.replacen(
            "[daemon]\n",
            &format!("[daemon]\ndetail_percent = {}\n", a.detail_percent),
            1,
        )
    } else {
        config
    };
    // Before vmtierd starts: it moves pages from its first tick on.
    let kmod_moved0 = crate::kmod::kstat("pages_moved");
    let d = match Daemon::start(&dir, &socket, &config) {
        Ok(d) => d,
        Err(e) => return c.fatal("start vmtierd", e),
    };
    let log = d.log_text();
    let source_line = log
        .lines()
        .find(|l| l.contains("hotness source:"))
        .unwrap_or("")
        .to_owned();
    c.check(
        source_line.contains("hotness source:"),
        "vmtierd logs its hotness source",
        source_line.trim(),
    );
    if source_line.contains("damon-vaddr") {
        let slot = source_line
            .split("on kdamond ")
            .nth(1)
            .and_then(|t| t.split(',').next())
            .unwrap_or("?");
        let attrs =
            format!("/sys/kernel/mm/damon/admin/kdamonds/{slot}/contexts/0/monitoring_attrs");
        let read = |f: &str| {
            std::fs::read_to_string(format!("{attrs}/{f}"))
                .map_or_else(|e| e.to_string(), |v| v.trim().to_owned())
        };
        let got = (read("nr_regions/min"), read("nr_regions/max"));
        c.check(
            got == (regions.0.to_string(), regions.1.to_string()),
            "the kdamond runs with [daemon.damon]'s region limits",
            format!(
                "kdamond {slot}: min {} max {} (configured {} {})",
                got.0, got.1, regions.0, regions.1
            ),
        );
        // fvaddr starts from the regions it is given: vmtierd cuts guest RAM to about
        // min_nr_regions (a few more where ranges round), not the few ranges it has.
        let ctx = format!("/sys/kernel/mm/damon/admin/kdamonds/{slot}/contexts/0");
        let ops = std::fs::read_to_string(format!("{ctx}/operations")).unwrap_or_default();
        let given = std::fs::read_to_string(format!("{ctx}/targets/0/regions/nr_regions"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        let want = regions.0..=regions.0.saturating_add(16);
        c.check(
            ops.trim() != "fvaddr" || given.is_some_and(|n| want.contains(&n)),
            "vmtierd hands fvaddr guest RAM cut to min_nr_regions",
            format!(
                "{}: {given:?} initial regions (min_nr_regions {})",
                ops.trim(),
                regions.0
            ),
        );
    }
    let (ok, list) = d.ctl(&["list"]);
    c.check(
        ok && list.contains("guest") && list.contains("active"),
        "vmtierctl list shows the guest active",
        list.lines().nth(1).unwrap_or(""),
    );
    let migrator_line = log
        .lines()
        .find(|l| l.contains("migrator:"))
        .unwrap_or("")
        .to_owned();
    if a.migrator == "kmod" {
        c.check(
            migrator_line.contains("kernel module"),
            "vmtierd moves pages with the kernel module",
            migrator_line.trim(),
        );
    }

    if a.expect_4k {
        let thp = crate::mem::guest_thp_bytes(&layout);
        c.check(
            thp == 0,
            "the guest's RAM is on 4 KiB pages",
            format!("AnonHugePages {}", ByteSize(thp)),
        );
    }
    let mut r = Run {
        a,
        t0: Instant::now(),
        pages,
        own: fill_start,
        d,
        g,
    };
    let before = sample(&r.pages, hot, None, fill_start);

    // Promotion: the hot set into DRAM, never above the budget.
    let budget = a.budget.0;
    let samples = r.watch("promote", hot, None, a.ticks + 5, &|s| {
        s.hot_dram * 10 >= hot.1 * 9 || s.tick > a.ticks
    });
    // vmtierd's tick count (since attach) at the first sample with 90% in DRAM.
    let reached = samples
        .iter()
        .find(|s| s.hot_dram * 10 >= hot.1 * 9)
        .map(|s| s.tick);
    let max_dram = samples.iter().map(|s| s.dram).max().unwrap_or(0);
    c.check(
        reached.is_some_and(|t| t <= a.ticks),
        "≥ 90% of the hot set reaches DRAM within the tick limit",
        format!(
            "at vmtierd tick {} (limit {}), {:.1} s ({})",
            reached.map_or_else(|| "-".into(), |t| t.to_string()),
            a.ticks,
            r.t0.elapsed().as_secs_f64(),
            crate::check::clock()
        ),
    );
    c.check(
        max_dram <= budget,
        "DRAM use never exceeds the budget",
        format!("max {} ≤ {}", ByteSize(max_dram), a.budget),
    );
    let promoted = sample(&r.pages, hot, None, fill_start);

    if let Some(_s) = a.shift_after {
        let Some(shift) = r.g.seen_or_wait("WG hotshift", Duration::from_secs(300)) else {
            return c.fatal("guest moves its hot set", "no 'WG hotshift'");
        };
        let new_hot = (num(&shift, "hot_start").unwrap_or(0), hot.1);
        let samples = r.watch("follow", new_hot, Some(hot), a.ticks + 5, &|s| {
            s.hot_dram * 10 >= new_hot.1 * 9
        });
        let last = samples.last().copied().unwrap_or_default();
        c.check(
            last.hot_dram * 10 >= new_hot.1 * 9,
            "the new hot set reaches DRAM",
            format!(
                "{:.1}% after {} ticks",
                pct(last.hot_dram, new_hot.1),
                samples.len()
            ),
        );
        c.check(
            last.old_hot_dram <= budget.saturating_sub(last.hot_dram)
                && last.old_hot_dram * 2 < hot.1,
            "the old hot set leaves DRAM",
            format!(
                "{} of the old hot set still in DRAM",
                ByteSize(last.old_hot_dram)
            ),
        );
        c.check(
            samples.iter().all(|s| s.dram <= budget),
            "DRAM use stays within budget while following",
            "",
        );
    }

    let mut lowered = None;
    if a.lower_budget.0 > 0 {
        let (ok, out) = r.d.ctl(&[
            "set-budget",
            "guest",
            &format!("{}K", a.lower_budget.0 >> 10),
        ]);
        c.check(ok, "vmtierctl set-budget", out.trim());
        let low = a.lower_budget.0;
        let samples = r.watch("demote", hot, None, 5, &|s| s.dram <= low);
        let last = samples.last().copied().unwrap_or_default();
        c.check(
            last.dram <= low,
            "DRAM use falls under the lowered budget within a few ticks",
            format!(
                "{} ≤ {} after {} ticks",
                ByteSize(last.dram),
                a.lower_budget,
                samples.len()
            ),
        );
        // Coldest first: nothing cold stays in DRAM. Hot memory is the hot set plus the
        // guest's own code, stack and page-version table below the fill area, which every
        // touch uses. One granule (2 MiB) of slack for a granule a DAMON region boundary
        // shares between hot and cold memory. Judged two ticks after DRAM met the budget:
        // the guest's verifier sweeps all its memory all the time, and a granule it has just
        // passed can look as hot as part of the 32 MiB hot set in the tick of the cut (once in
        // a fresh-clone run: 4 MiB of swept granules kept, 2 hot-set ones demoted); a tick
        // later it has cooled and is swapped out.
        let last = r
            .watch("settle", hot, None, 2, &|_| false)
            .last()
            .copied()
            .unwrap_or(last);
        c.check(
            last.dram <= low,
            "DRAM use stays under the lowered budget",
            format!("{} ≤ {}", ByteSize(last.dram), a.lower_budget),
        );
        let own = last.own_dram;
        let cold = last.dram.saturating_sub(last.hot_dram + own);
        c.check(
            cold <= 2 << 20,
            "the coldest pages were demoted first",
            format!(
                "{} left in DRAM: {} hot set, {} guest code and tables, {} other",
                ByteSize(last.dram),
                ByteSize(last.hot_dram),
                ByteSize(own),
                ByteSize(cold)
            ),
        );
        lowered = Some(last);
    }

    if a.migrator == "kmod" {
        // The module, not move_pages, moved the hot set (THP off: every page is a base page).
        let moved = crate::kmod::kstat("pages_moved") - kmod_moved0;
        let want =
            i64::try_from(promoted.hot_dram / PageSize::Base.bytes() * 9 / 10).unwrap_or(i64::MAX);
        c.check(
            moved >= want,
            "the module moved guest pages for vmtierd",
            format!("pages_moved +{moved}, ≥ {want} (90% of the hot set's pages in DRAM)"),
        );
    }
    let end = sample(&r.pages, hot, None, fill_start);
    let status = r.d.status("guest");
    let (ok, human) = r.d.ctl(&["status", "guest"]);
    if let Some(line) = human.lines().find(|l| l.contains("hybrid tracking:")) {
        // Regions a huge page maps are never split (move_pages would move all 512 pages).
        println!(
            "  {} (guest RAM on huge pages: {})",
            line.trim(),
            ByteSize(crate::mem::guest_thp_bytes(&layout))
        );
    }
    // The daemon's counters agree with what moved, seen from outside: its net bytes moved
    // to DRAM against the guest's DRAM growth (4 MiB of slack for pages in flight).
    let net = status.as_ref().map_or(i128::MIN, |s| {
        i128::from(s.metrics.promoted_bytes) - i128::from(s.metrics.demoted_bytes)
    });
    let outside = i128::from(end.dram) - i128::from(initial.dram);
    c.check(
        ok && status.as_ref().is_some_and(|s| s.summary.state == "active")
            && (net - outside).abs() <= 4 << 20,
        "vmtierctl status reports the migrations seen from outside",
        format!(
            "net {} MiB promoted by its counters, DRAM grew {} MiB; {}",
            net >> 20,
            outside >> 20,
            human
                .lines()
                .find(|l| l.contains("promoted"))
                .unwrap_or("")
                .trim()
        ),
    );

    r.g.request_stop();
    let done =
        r.g.wait_for("WG done", Duration::from_secs(600))
            .unwrap_or_default();
    c.check(
        num(&done, "corrupted") == Some(0),
        "guest reports zero corrupted words",
        &done,
    );
    let code = r.d.stop();
    c.check(
        code == Some(0),
        "vmtierd stops cleanly on SIGTERM",
        format!("{code:?}"),
    );
    let kdamonds_on =
        vmtier_sources::damon::Sysfs::new(vmtier_sources::damon::DEFAULT_ROOT).running();
    c.check(
        kdamonds_on == 0,
        "no kdamond left running",
        format!("{kdamonds_on} on"),
    );

    if a.demo {
        let m = status.map(|s| s.metrics).unwrap_or_default();
        let b = |x: u64| ByteSize(x).to_string();
        println!();
        println!(
            "                         {:>12} {:>12} {:>12}",
            "start", "promoted", "budget cut"
        );
        let low = lowered.unwrap_or(promoted);
        println!(
            "DRAM (node 0)            {:>12} {:>12} {:>12}",
            b(before.dram),
            b(promoted.dram),
            b(low.dram)
        );
        println!(
            "CXL (node 1)             {:>12} {:>12} {:>12}",
            b(before.cxl),
            b(promoted.cxl),
            b(low.cxl)
        );
        println!(
            "hot set in DRAM          {:>11.1}% {:>11.1}% {:>11.1}%",
            pct(before.hot_dram, hot.1),
            pct(promoted.hot_dram, hot.1),
            pct(low.hot_dram, hot.1)
        );
        println!(
            "budget                   {:>12} {:>12} {:>12}",
            b(budget),
            b(budget),
            b(a.lower_budget.0)
        );
        println!();
        println!(
            "migrated: {} to DRAM, {} to CXL; guest: {}",
            b(m.promoted_bytes),
            b(m.demoted_bytes),
            done
        );
    }
}
