//! The workload guest under a real QEMU inside the tiered host, its RAM found through QMP
//! and moved node 1 → node 0 → node 1 while it runs and verifies itself: with move_pages(2),
//! or (`--kmod-dir`) through the vmtier kernel module and the combined migrator.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use vmtier_backends::qemu::QemuBackend;
use vmtier_core::migrate::{Migrator, PageOutcome, PageRef};
use vmtier_core::{
    Backing, ByteSize, GuestMemoryLayout, HostVirtAddr, NodeId, PageSize, ProcessId,
};
use vmtier_migrate::{
    query_nodes, Combined, CopyEngine, Kmod, KmodConfig, MovePages, NodeQuery, Residency,
};

use crate::check::Checks;

#[derive(clap::Args, Debug)]
pub struct GuestArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// Guest RAM.
    #[arg(long, default_value = "128M")]
    ram: ByteSize,
    /// Hot-set size (default: the guest's own default).
    #[arg(long)]
    hot: Option<ByteSize>,
    /// node1 → node0 → node1 rounds to run while the guest runs.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Test only: ask the guest to corrupt one word, and expect exactly that one reported.
    #[arg(long)]
    inject: bool,
    /// Seconds to wait for the guest to fill its RAM.
    #[arg(long, default_value_t = 600)]
    fill_timeout: u64,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: String,
    /// Move through the vmtier kernel module (loaded from this directory if `/dev/vmtier`
    /// is missing) and check that the module did the moving.
    #[arg(long)]
    kmod_dir: Option<PathBuf>,
    /// With --kmod-dir: the module's copy engine.
    #[arg(long, default_value = "cpu")]
    engine: CopyEngine,
    /// With --kmod-dir: keep THP on (THP-backed guest RAM then moves by move_pages(2)
    /// instead of the module, which leaves PMD-mapped THPs alone).
    #[arg(long)]
    thp: bool,
}

/// The migrator `a` asks for: move_pages(2), or the module combined with it.
fn migrator(c: &mut Checks, a: &GuestArgs) -> Option<Box<dyn Migrator>> {
    let Some(dir) = &a.kmod_dir else {
        return Some(Box::new(MovePages::default()));
    };
    if !std::path::Path::new(vmtier_migrate::kmod::DEVICE).exists() {
        let (ok, out) = crate::kmod::sh(&format!("insmod {}/vmtier.ko", dir.display()));
        if !c.check(ok, "insmod vmtier.ko", &out) {
            return None;
        }
    }
    if !a.thp {
        let _ = std::fs::write("/sys/kernel/mm/transparent_hugepage/enabled", "never");
    }
    let cfg = KmodConfig {
        engine: a.engine,
        workers: 2,
        batch: 0,
    };
    match Kmod::open(cfg) {
        Ok(k) => Some(Box::new(Combined::with_kmod(Some(k), MovePages::default()))),
        Err(e) => {
            c.fatal("open /dev/vmtier", e);
            None
        }
    }
}

/// A running workload guest: its QEMU process and its serial lines.
pub struct Guest {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Every `WG` line seen so far.
    pub seen: Vec<String>,
    /// Keeps accessed bits honest under TCG while the guest runs.
    _churn: TlbChurn,
    /// Print the guest's lines as they arrive (default on).
    pub echo: bool,
    /// QMP socket path.
    pub qmp: PathBuf,
    dir: PathBuf,
}

/// Value of `key=` in a `WG` line.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

/// A numeric field, decimal or 0x-hex.
pub fn num(line: &str, key: &str) -> Option<u64> {
    let v = field(line, key)?;
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

impl Guest {
    /// Starts QEMU with guest RAM bound to `node` (private anonymous memory-backend-ram).
    pub fn start(
        qemu: &str,
        elf: &std::path::Path,
        ram: ByteSize,
        node: u32,
        append: &str,
    ) -> std::io::Result<Self> {
        Self::start_with_policy(qemu, elf, ram, Some(node), "bind", append)
    }

    /// Starts QEMU with the RAM backend's `policy` (`bind`, `preferred`, `interleave`) on
    /// `node`; `None` gives the backend no host-nodes and no policy (the kernel's default).
    pub fn start_with_policy(
        qemu: &str,
        elf: &std::path::Path,
        ram: ByteSize,
        node: Option<u32>,
        policy: &str,
        append: &str,
    ) -> std::io::Result<Self> {
        Self::start_with_args(qemu, elf, ram, node, policy, append, &[])
    }

    /// As [`Self::start_with_policy`], with `extra` QEMU arguments (devices, chardevs); each
    /// such guest gets a directory of its own, so that several can run at once.
    pub fn start_with_args(
        qemu: &str,
        elf: &std::path::Path,
        ram: ByteSize,
        node: Option<u32>,
        policy: &str,
        append: &str,
        extra: &[String],
    ) -> std::io::Result<Self> {
        static GUESTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let placement =
            node.map_or_else(String::new, |n| format!(",host-nodes={n},policy={policy}"));
        let dir = if extra.is_empty() {
            std::env::temp_dir().join(format!("vmtier-guest-{}", std::process::id()))
        } else {
            let n = GUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::env::temp_dir().join(format!("vmtier-guest-{}-{n}", std::process::id()))
        };
        std::fs::create_dir_all(&dir)?;
        let qmp = dir.join("qmp.sock");
        let _ = std::fs::remove_file(&qmp);
        let mib = ram.0 >> 20;
        let mut child = Command::new(qemu)
            .args(["-accel", "tcg", "-m", &format!("{mib}M")])
            .args([
                "-object",
                &format!("memory-backend-ram,id=ram0,size={mib}M{placement}"),
            ])
            .args(["-machine", "pc,memory-backend=ram0"])
            .arg("-kernel")
            .arg(elf)
            .args(["-append", append])
            .args([
                "-display",
                "none",
                "-nodefaults",
                "-no-reboot",
                "-serial",
                "stdio",
            ])
            .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let line = line.trim_end().to_owned();
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            _churn: TlbChurn::start(),
            echo: true,
            qmp,
            dir,
        })
    }

    /// Waits for a line starting with `prefix`, echoing guest lines; `None` on timeout or exit.
    pub fn wait_for(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if self.echo {
                        println!("  guest| {line}");
                    }
                    if line.starts_with("WG ") {
                        self.seen.push(line.clone());
                    }
                    if line.starts_with(prefix) {
                        return Some(line);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// The first `WG` line seen so far starting with `prefix`, or the next one to arrive.
    pub fn seen_or_wait(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        self.poll();
        match self.seen.iter().find(|l| l.starts_with(prefix)) {
            Some(l) => Some(l.clone()),
            None => self.wait_for(prefix, timeout),
        }
    }

    /// The touch counter of the latest `WG progress` line (0 before the first).
    pub fn touches(&self) -> u64 {
        self.seen
            .iter()
            .rev()
            .find_map(|l| {
                l.starts_with("WG progress")
                    .then(|| num(l, "touches"))
                    .flatten()
            })
            .unwrap_or(0)
    }

    /// Drains lines already received.
    pub fn poll(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            if self.echo {
                println!("  guest| {line}");
            }
            if line.starts_with("WG ") {
                self.seen.push(line);
            }
        }
    }

    /// Sends one command byte on the guest's serial input (`s`: move the hot set now, `c`:
    /// start a scan phase now; docs/workload-guest.md).
    pub fn send(&mut self, cmd: u8) -> std::io::Result<()> {
        match self.stdin.as_mut() {
            Some(s) => s.write_all(&[cmd]).and_then(|()| s.flush()),
            None => Err(std::io::Error::other("the guest's input is closed")),
        }
    }

    /// Asks the guest to finish (final sweep, `WG done`) through its serial input.
    pub fn request_stop(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"q\n");
        }
    }

    /// Waits for QEMU to exit and returns its status code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Testbed artifact mitigation. x86 does not flush the TLB when DAMON clears an accessed
/// bit, and under TCG a translation stays in the emulator's software TLB until that vCPU
/// switches address space (a CR3 load flushes it) — which the workload guest's QEMU vCPU
/// thread, busy on its own CPU, may not do for seconds. Its steadily hot pages then stop
/// being seen as accessed while freshly touched ones are. On a real host, TLB reach is far
/// below a working set of 4 KiB pages, so entries turn over constantly. This keeps one
/// sleeping process per CPU that wakes every millisecond, so that every CPU switches address
/// space often and the emulated accessed bits behave as on hardware.
pub struct TlbChurn {
    pids: Vec<libc::pid_t>,
}

impl TlbChurn {
    /// Starts one sleeper per online CPU.
    pub fn start() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let mut pids = Vec::new();
        for cpu in 0..cpus {
            // SAFETY: the child only calls async-signal-safe functions (sched_setaffinity,
            // nanosleep) and never returns into Rust code; the parent records its pid.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it;
                // the pointers passed to the kernel are to locals that outlive the calls.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    let ms = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 1_000_000,
                    };
                    loop {
                        libc::nanosleep(&ms, std::ptr::null_mut());
                    }
                }
            }
            if pid > 0 {
                pids.push(pid);
            }
        }
        Self { pids }
    }
}

impl Drop for TlbChurn {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: kill and waitpid on our own children; no memory is involved.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// One page reference per 4 KiB of every guest RAM range. THP-backed ranges are moved whole
/// by the kernel on their first subpage; the migrator re-queries the rest.
pub fn all_pages(layout: &GuestMemoryLayout) -> Vec<PageRef> {
    layout
        .base_pages()
        .map(|(_, addr)| PageRef {
            addr,
            size: PageSize::Base,
        })
        .collect()
}

fn add(total: &mut Residency, part: Residency) {
    for (n, b) in part.per_node {
        match total.per_node.iter_mut().find(|e| e.0 == n) {
            Some(e) => e.1 += b,
            None => total.per_node.push((n, b)),
        }
    }
    total.per_node.sort();
    total.not_present += part.not_present;
    total.errors += part.errors;
}

/// Where all of the guest's RAM is.
pub fn residency(layout: &GuestMemoryLayout) -> Result<Residency, vmtier_core::migrate::Error> {
    let mut total = Residency::default();
    for r in &layout.ranges {
        add(&mut total, Residency::of_range(layout.pid, r.hva, r.len)?);
    }
    Ok(total)
}

/// Every base page of a guest's RAM in guest-physical order, for whole-guest placement
/// samples: [`GuestPages::sample`] is one pass of move_pages(2) queries, so every figure of
/// a sample (DRAM use, hot-set share) comes from the same pass and a page in flight is
/// counted once, not on neither node.
pub struct GuestPages {
    pid: ProcessId,
    addrs: Vec<HostVirtAddr>,
    gpas: Vec<u64>,
}

/// Where each page of a [`GuestPages`] was in one sample.
pub struct PageNodes<'a> {
    pages: &'a GuestPages,
    nodes: Vec<NodeQuery>,
}

impl GuestPages {
    /// The pages of `layout` (its ranges are in guest-physical order).
    pub fn new(layout: &GuestMemoryLayout) -> Self {
        let (gpas, addrs) = layout.base_pages().map(|(g, a)| (g.0, a)).unzip();
        Self {
            pid: layout.pid,
            addrs,
            gpas,
        }
    }

    /// The guest physical address of each page, in order.
    pub fn gpas(&self) -> &[u64] {
        &self.gpas
    }

    /// The pages of guest physical `[gpa, gpa + len)` alone, for a sample cheap enough to
    /// take many times a tick.
    pub fn within(&self, gpa: u64, len: u64) -> Self {
        let g = &self.gpas;
        let lo = g.partition_point(|&x| x < gpa);
        let hi = g.partition_point(|&x| x < gpa.saturating_add(len));
        Self {
            pid: self.pid,
            addrs: self.addrs[lo..hi].to_vec(),
            gpas: g[lo..hi].to_vec(),
        }
    }

    /// Where every page is now.
    pub fn sample(&self) -> Result<PageNodes<'_>, vmtier_core::migrate::Error> {
        Ok(PageNodes {
            pages: self,
            nodes: query_nodes(self.pid, &self.addrs)?,
        })
    }
}

impl PageNodes<'_> {
    /// Where each page is, in the order of [`GuestPages::gpas`].
    pub fn nodes(&self) -> &[NodeQuery] {
        &self.nodes
    }

    /// Bytes of the guest on `node`.
    pub fn bytes_on(&self, node: NodeId) -> u64 {
        let n = self
            .nodes
            .iter()
            .filter(|q| **q == NodeQuery::On(node))
            .count();
        n as u64 * PageSize::Base.bytes()
    }

    /// Bytes of guest physical `[gpa, gpa + len)` on `node`.
    pub fn gpa_bytes_on(&self, node: NodeId, gpa: u64, len: u64) -> u64 {
        let g = &self.pages.gpas;
        let lo = g.partition_point(|&x| x < gpa);
        let hi = g.partition_point(|&x| x < gpa.saturating_add(len));
        let n = self.nodes[lo..hi]
            .iter()
            .filter(|q| **q == NodeQuery::On(node))
            .count();
        n as u64 * PageSize::Base.bytes()
    }
}

/// Where the guest physical range `[gpa, gpa + len)` is (its parts that are guest RAM).
pub fn gpa_residency(
    layout: &GuestMemoryLayout,
    gpa: u64,
    len: u64,
) -> Result<Residency, vmtier_core::migrate::Error> {
    let end = gpa.saturating_add(len);
    let mut total = Residency::default();
    for r in &layout.ranges {
        let (lo, hi) = (gpa.max(r.gpa.0), end.min(r.gpa.0 + r.len));
        if lo < hi {
            let hva = r.hva.checked_add(lo - r.gpa.0).unwrap_or(r.hva);
            add(&mut total, Residency::of_range(layout.pid, hva, hi - lo)?);
        }
    }
    Ok(total)
}

pub fn run(c: &mut Checks, a: &GuestArgs) {
    let Some(mut mover) = migrator(c, a) else {
        return;
    };
    let mut append = String::from("report=2 duration=900");
    if let Some(h) = a.hot {
        append.push_str(&format!(" hot={}K", h.0 >> 10));
    }
    if a.inject {
        append.push_str(" inject=1");
    }
    let mut g = match Guest::start(&a.qemu, &a.elf, a.ram, 1, &append) {
        Ok(g) => g,
        Err(e) => return c.fatal("start QEMU", e),
    };
    let t0 = Instant::now();
    let Some(start) = g.wait_for("WG start", Duration::from_secs(60)) else {
        return c.fatal("guest starts", "no 'WG start' line within 60 s");
    };
    c.check(num(&start, "ram_bytes").is_some(), "guest starts", &start);
    let Some(filled) = g.wait_for("WG filled", Duration::from_secs(a.fill_timeout)) else {
        return c.fatal(
            "guest fills its RAM",
            format!("no 'WG filled' within {} s", a.fill_timeout),
        );
    };
    c.check(
        num(&filled, "ms").is_some(),
        "guest fills its RAM",
        format!(
            "{filled} (nested TCG inside the testbed; {:.1} s wall, {})",
            t0.elapsed().as_secs_f64(),
            crate::check::clock()
        ),
    );
    let inject_gpa = if a.inject {
        match g
            .wait_for("WG inject", Duration::from_secs(30))
            .and_then(|l| num(&l, "gpa"))
        {
            Some(gpa) => Some(gpa),
            None => {
                return c.fatal(
                    "guest announces the injected word",
                    "no 'WG inject gpa=' line",
                )
            }
        }
    } else {
        None
    };

    let mut backend = match QemuBackend::connect(&g.qmp, Duration::from_secs(10)) {
        Ok(b) => b,
        Err(e) => return c.fatal("connect to QMP", e),
    };
    let layout = match backend.discover() {
        Ok(l) => l,
        Err(e) => return c.fatal("locate guest RAM through QMP", e),
    };
    let total = layout.total_bytes();
    let anon = layout
        .ranges
        .iter()
        .all(|r| r.backing == Backing::PrivateAnon);
    c.check(
        anon && total <= a.ram.0 && total + (1 << 20) >= a.ram.0,
        "guest RAM located in the QEMU process",
        format!(
            "{} in {} ranges, {}",
            ByteSize(total),
            layout.ranges.len(),
            layout
                .ranges
                .iter()
                .map(|r| format!("gpa {:#x} -> hva {} +{}", r.gpa.0, r.hva, ByteSize(r.len)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    match residency(&layout) {
        Ok(r) => c.check(
            r.on(NodeId::new(1)) + r.not_present == total && r.on(NodeId::new(1)) > total / 2,
            "guest RAM starts on node 1",
            format!("{:?}, not present {}", r.per_node, ByteSize(r.not_present)),
        ),
        Err(e) => c.check(false, "guest RAM residency", e),
    };

    let pages = all_pages(&layout);
    mover.add_layout(&layout);
    let mut last_touches = 0;
    for round in 1..=a.rounds {
        for to in [0u32, 1] {
            let target = NodeId::new(to);
            let t = Instant::now();
            let moved_by_module0 = crate::kmod::kstat("pages_moved");
            let report = match mover.migrate(layout.pid, &pages, target) {
                Ok(r) => r,
                Err(e) => {
                    return c.fatal(&format!("round {round}: move guest RAM to node {to}"), e)
                }
            };
            let bad = report
                .outcomes
                .iter()
                .filter(|o| {
                    !matches!(
                        o,
                        PageOutcome::OnTarget | PageOutcome::NotPresent | PageOutcome::Busy
                    )
                })
                .count();
            let res = residency(&layout);
            let (on, elsewhere) = match &res {
                Ok(r) => (
                    r.on(target),
                    r.per_node
                        .iter()
                        .filter(|e| e.0 != target)
                        .map(|e| e.1)
                        .sum::<u64>(),
                ),
                Err(_) => (0, u64::MAX),
            };
            // Pages the guest touches while we move may be busy for an instant: allow a
            // sliver (1%) elsewhere, but every other page must be on the target.
            c.check(
                bad == 0 && elsewhere <= total / 100 && on > 0,
                &format!("round {round}: guest RAM moved to node {to} while running"),
                format!(
                    "{} on node {to}, {} elsewhere, {} busy, {bad} failed, {:.0} ms ({})",
                    ByteSize(on),
                    ByteSize(elsewhere),
                    report.count(PageOutcome::Busy),
                    t.elapsed().as_secs_f64() * 1e3,
                    crate::check::clock()
                ),
            );
            if a.kmod_dir.is_some() && !a.thp {
                let by_module = u64::try_from(crate::kmod::kstat("pages_moved") - moved_by_module0)
                    .unwrap_or(0)
                    * PageSize::Base.bytes();
                c.check(
                    by_module >= on.saturating_sub(total / 10),
                    &format!("round {round}: the module moved the guest RAM to node {to}"),
                    format!("{} by the module", ByteSize(by_module)),
                );
            }
            g.poll();
        }
        // The guest keeps running between rounds: its touch counter advances.
        let _ = g.wait_for("WG progress", Duration::from_secs(60));
        let touches = g.touches();
        c.check(
            touches > last_touches,
            &format!("round {round}: guest runs during migration"),
            format!("touches {touches}"),
        );
        last_touches = touches;
    }

    g.request_stop();
    let Some(done) = g.wait_for("WG done", Duration::from_secs(900)) else {
        return c.fatal("guest finishes", "no 'WG done' line");
    };
    let exit = g.wait_exit(Duration::from_secs(30));
    let corrupt: Vec<u64> = g
        .seen
        .iter()
        .filter(|l| l.starts_with("WG corrupt"))
        .filter_map(|l| num(l, "gpa"))
        .collect();
    let sweeps = num(&done, "sweeps").unwrap_or(0);
    c.check(
        sweeps >= 1,
        "guest re-verified all its RAM",
        format!("{sweeps} sweeps"),
    );
    match inject_gpa {
        None => {
            c.check(
                corrupt.is_empty() && num(&done, "corrupted") == Some(0),
                "guest reports zero corrupted words",
                &done,
            );
            c.check(
                exit == Some(1),
                "QEMU exit status says pass",
                format!("{exit:?} (isa-debug-exit 0 -> 1)"),
            );
        }
        Some(gpa) => {
            c.check(
                corrupt == [gpa] && num(&done, "corrupted") == Some(1),
                "guest reports exactly the injected word",
                format!("injected {gpa:#x}, reported {corrupt:x?}; {done}"),
            );
            c.check(
                exit == Some(3),
                "QEMU exit status says fail",
                format!("{exit:?} (isa-debug-exit 1 -> 3)"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_parse() {
        let l = "WG corrupt gpa=0x00a01000 expected=0x12 found=0x13";
        let cases = [
            ("gpa", Some(0xa01000)),
            ("expected", Some(0x12)),
            ("nope", None),
        ];
        for (k, want) in cases {
            assert_eq!(num(l, k), want, "{k}");
        }
        assert_eq!(num("WG done corrupted=0 sweeps=3", "sweeps"), Some(3));
    }
}
