//! Hotness sources on the real kernel: DAMON fvaddr and soft-dirty rank a buffer's hot part
//! above its cold part, kdamonds are cleaned up and shared, selection falls back, a vanished
//! process is reported as gone, and (with `--elf`) DAMON sees a QEMU guest's hot set.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vmtier_backends::qemu::QemuBackend;
use vmtier_core::hotness::{self, HotnessSource};
use vmtier_core::{
    Backing, ByteSize, GuestMemoryLayout, GuestPhysAddr, GuestRamRange, HostVirtAddr, ProcessId,
    RegionAccess,
};
use vmtier_sources::probe::{select, Choice, SelectOptions, SourceKind};
use vmtier_sources::store::{HotnessStore, StoreConfig};
use vmtier_sources::{DamonConfig, DamonSource, SoftDirtySource};

use crate::check::Checks;
use crate::guest::{num, Guest};

const ADMIN: &str = "/sys/kernel/mm/damon/admin/kdamonds";
/// The default policy's `promote_min_heat`: heat a slow granule needs to be promoted.
const PROMOTE_MIN_HEAT: u8 = 4;
const PAGE: usize = 4096;

#[derive(clap::Args, Debug)]
pub struct SourcesArgs {
    /// Test buffer size.
    #[arg(long, default_value = "64M")]
    size: ByteSize,
    /// Hot part at the start of the buffer, written continuously by a thread.
    #[arg(long, default_value = "8M")]
    hot: ByteSize,
    /// Collections per source.
    #[arg(long, default_value_t = 4)]
    rounds: u32,
    /// Seconds between collections.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Also run DAMON on the workload guest's QEMU process (multiboot ELF).
    #[arg(long)]
    elf: Option<PathBuf>,
    /// QEMU binary for `--elf`.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: String,
}

/// An anonymous mapping with a thread writing one word per page of its first `hot` bytes.
struct HotBuf {
    addr: usize,
    len: usize,
    stop: Arc<AtomicBool>,
    toucher: Option<thread::JoinHandle<u64>>,
}

impl HotBuf {
    fn new(len: usize, hot: usize) -> std::io::Result<Self> {
        // Base pages keep the test per 4 KiB.
        let map = crate::mem::map_anon(len, Some(libc::MADV_NOHUGEPAGE))?;
        let addr = map as usize;
        // Fault every page in, so the cold part is resident but then left alone.
        for off in (0..len).step_by(PAGE) {
            // SAFETY: off < len, inside the mapping, which is writable.
            unsafe { std::ptr::write_volatile((addr + off) as *mut u64, off as u64) };
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let toucher = thread::spawn(move || {
            let mut sweeps = 0u64;
            while !flag.load(Ordering::Relaxed) {
                for off in (0..hot).step_by(PAGE) {
                    // SAFETY: off < hot <= len: inside the mapping, which outlives this
                    // thread (joined before munmap); only this thread writes it now.
                    unsafe { std::ptr::write_volatile((addr + off) as *mut u64, sweeps) };
                }
                sweeps += 1;
                // x86 Linux clears accessed bits without a TLB flush, counting on hardware
                // TLBs to evict entries soon; the testbed's TCG TLB is huge and would keep
                // the hot pages cached, so their accessed bits would never be set again.
                // A write-protect round trip flushes them, as eviction would on hardware.
                // SAFETY: our own mapping; protections restored before the next write.
                unsafe {
                    libc::mprotect(addr as *mut libc::c_void, hot, libc::PROT_READ);
                    libc::mprotect(
                        addr as *mut libc::c_void,
                        hot,
                        libc::PROT_READ | libc::PROT_WRITE,
                    );
                }
            }
            sweeps
        });
        Ok(Self {
            addr,
            len,
            stop,
            toucher: Some(toucher),
        })
    }

    fn layout(&self) -> GuestMemoryLayout {
        let pid = ProcessId::new(i32::try_from(std::process::id()).unwrap_or(i32::MAX));
        GuestMemoryLayout::new(
            pid,
            vec![GuestRamRange {
                name: "test-buffer".into(),
                gpa: GuestPhysAddr(0),
                hva: HostVirtAddr::new(self.addr as u64),
                len: self.len as u64,
                backing: Backing::PrivateAnon,
            }],
        )
        .expect("page-aligned mapping")
    }

    /// Stops the toucher; returns its sweep count.
    fn stop(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.toucher.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for HotBuf {
    fn drop(&mut self) {
        self.stop();
        // SAFETY: the toucher is joined; unmaps exactly our mapping.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// Byte-weighted mean access fraction (permille of samples) of `reports` over `[lo, hi)`,
/// and the bytes covered.
fn mean_permille(reports: &[RegionAccess], lo: u64, hi: u64) -> (f64, u64) {
    let (mut sum, mut bytes) = (0f64, 0u64);
    for a in reports {
        let s = a.start.raw().max(lo);
        let e = (a.start.raw() + a.len).min(hi);
        if s < e && a.samples > 0 {
            let f = 1000.0 * f64::from(a.hits) / f64::from(a.samples);
            sum += f * (e - s) as f64;
            bytes += e - s;
        }
    }
    if bytes == 0 {
        (0.0, 0)
    } else {
        (sum / bytes as f64, bytes)
    }
}

fn read(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("<{e}>"))
}

fn write(path: &str, v: &str) -> bool {
    fs::write(path, v).is_ok()
}

/// Number of kdamond kernel threads alive.
fn kdamond_threads() -> usize {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("kdamond"))
        })
        .count()
}

/// Runs `src` on a hot/cold buffer and checks the hot part ranks clearly higher and gets
/// promotable heat in the store. Returns the most samples one report carried.
fn hot_vs_cold(c: &mut Checks, a: &SourcesArgs, src: &mut dyn HotnessSource) -> u32 {
    let name = src.name();
    let (Ok(len), Ok(hot)) = (usize::try_from(a.size.0), usize::try_from(a.hot.0)) else {
        c.fatal(&format!("{name}: sizes"), "do not fit in memory");
        return 0;
    };
    let mut buf = match HotBuf::new(len, hot) {
        Ok(b) => b,
        Err(e) => {
            c.fatal(&format!("{name}: allocate"), e);
            return 0;
        }
    };
    let layout = buf.layout();
    if let Err(e) = src.attach(&layout) {
        c.fatal(&format!("{name}: attach"), e);
        return 0;
    }
    let mut store = match HotnessStore::new(&layout, StoreConfig::default()) {
        Ok(s) => s,
        Err(e) => {
            c.fatal(&format!("{name}: store"), e);
            return 0;
        }
    };
    let base = buf.addr as u64;
    let (hot_end, end) = (base + hot as u64, base + len as u64);
    let (mut hot_sum, mut cold_sum, mut n) = (0f64, 0f64, 0u32);
    let mut out = Vec::new();
    let mut samples = 0u32;
    let started = Instant::now();
    for round in 0..a.rounds {
        thread::sleep(Duration::from_secs_f64(a.interval));
        out.clear();
        let t = Instant::now();
        if let Err(e) = src.collect(&mut out) {
            c.fatal(&format!("{name}: collect {round}"), e);
            return samples;
        }
        samples = samples.max(out.iter().map(|r| r.samples).max().unwrap_or(0));
        let took = t.elapsed();
        let (h, hb) = mean_permille(&out, base, hot_end);
        let (k, kb) = mean_permille(&out, hot_end, end);
        println!(
            "  {name} round {round}: {} reports, hot {h:.0}‰ of samples ({} KiB seen), cold \
             {k:.0}‰ ({} KiB seen), collect {} ms",
            out.len(),
            hb >> 10,
            kb >> 10,
            took.as_millis()
        );
        store.tick();
        store.observe(&out);
        // The first window of DAMON starts with unsplit regions: score the later ones.
        if round > 0 || a.rounds == 1 {
            hot_sum += h;
            cold_sum += k;
            n += 1;
        }
    }
    let sweeps = buf.stop();
    let (h, k) = (
        hot_sum / f64::from(n.max(1)),
        cold_sum / f64::from(n.max(1)),
    );
    c.check(
        h >= 2.0 * k + 125.0,
        &format!("{name}: hot part ranks above cold part"),
        format!(
            "hot part found accessed in {h:.0}‰ of samples vs cold {k:.0}‰ over {n} ticks of up \
             to {samples} samples ({} MiB hot of {} MiB, {sweeps} sweeps in {:.1} s)",
            hot >> 20,
            len >> 20,
            started.elapsed().as_secs_f64()
        ),
    );
    let recs = store.records();
    let g_hot = hot / PAGE;
    let heat = |r: &[vmtier_core::policy::HeatRecord]| {
        r.iter().map(|x| f64::from(x.heat())).sum::<f64>() / r.len().max(1) as f64
    };
    let (hh, hc) = (heat(&recs[..g_hot]), heat(&recs[g_hot..]));
    let promotable = recs[..g_hot]
        .iter()
        .filter(|r| r.heat() >= PROMOTE_MIN_HEAT)
        .count();
    c.check(
        hh > 2.0 * hc + 4.0 && promotable * 10 >= g_hot * 9,
        &format!("{name}: store heat follows, the hot part promotable"),
        format!(
            "mean heat hot {hh:.1} vs cold {hc:.1}; {promotable} of {g_hot} hot pages at heat \
             ≥ {PROMOTE_MIN_HEAT}; histogram slow {:?}; {:.3} bytes per 4 KiB page",
            store.histogram().slow,
            store.bytes_per_4k_page()
        ),
    );
    src.detach();
    samples
}

/// DAMON sysfs cleanup and sharing with another kdamond user.
fn damon_sharing(c: &mut Checks, a: &SourcesArgs) {
    let nr0 = read(&format!("{ADMIN}/nr_kdamonds"));
    let threads0 = kdamond_threads();
    {
        let mut d = DamonSource::new(DamonConfig::default());
        let buf = HotBuf::new(4 << 20, 1 << 20).expect("map");
        if let Err(e) = d.attach(&buf.layout()) {
            return c.fatal("damon: attach for cleanup check", e);
        }
        let slot = d.kdamond().unwrap_or(usize::MAX);
        c.check(
            read(&format!("{ADMIN}/{slot}/state")) == "on" && kdamond_threads() == threads0 + 1,
            "damon: own kdamond runs",
            format!("slot {slot}, ops {:?}", d.operations()),
        );
        // Dropped here without an explicit detach: Drop must clean up.
    }
    let nr1 = read(&format!("{ADMIN}/nr_kdamonds"));
    c.check(
        nr1 == nr0 && kdamond_threads() == threads0,
        "damon: kdamond cleaned up on drop",
        format!(
            "nr_kdamonds {nr0} -> {nr1}, kdamond threads {}",
            kdamond_threads()
        ),
    );

    // Another user's kdamond (paddr) runs in slot 0 with one empty slot beside it.
    let other = write(&format!("{ADMIN}/nr_kdamonds"), "2")
        && write(&format!("{ADMIN}/0/contexts/nr_contexts"), "1")
        && write(&format!("{ADMIN}/0/contexts/0/operations"), "paddr")
        && write(&format!("{ADMIN}/0/contexts/0/targets/nr_targets"), "1")
        && write(&format!("{ADMIN}/0/state"), "on");
    if !c.check(
        other,
        "damon: other user's kdamond started",
        "paddr in slot 0",
    ) {
        return;
    }
    let mut d = DamonSource::new(few_regions());
    let buf = HotBuf::new(4 << 20, 1 << 20).expect("map");
    let r = d.attach(&buf.layout());
    c.check(
        r.is_ok() && d.kdamond() == Some(1),
        "damon: takes the free slot beside a running kdamond",
        format!("{r:?}, slot {:?}", d.kdamond()),
    );
    // A tick later: at least one aggregation window has ended.
    thread::sleep(Duration::from_secs(1));
    let mut out = Vec::new();
    let r = d.collect(&mut out);
    c.check(
        r.is_ok() && !out.is_empty(),
        "damon: collects while sharing",
        format!("{} reports", out.len()),
    );
    d.detach();
    c.check(
        read(&format!("{ADMIN}/0/state")) == "on"
            && read(&format!("{ADMIN}/nr_kdamonds")) == "2"
            && read(&format!("{ADMIN}/1/contexts/nr_contexts")) == "0",
        "damon: detach leaves the other kdamond alone",
        format!(
            "slot 0 {}, nr_kdamonds {}",
            read(&format!("{ADMIN}/0/state")),
            read(&format!("{ADMIN}/nr_kdamonds"))
        ),
    );
    // No free slot while another kdamond runs: DAMON is unavailable, selection falls back.
    let mut two = DamonSource::new(DamonConfig::default());
    let held = two.attach(&buf.layout()).is_ok();
    let r = d.attach(&buf.layout());
    c.check(
        held && matches!(r, Err(hotness::Error::Unavailable(_))),
        "damon: no free slot -> unavailable, nothing clobbered",
        format!("{r:?}"),
    );
    match select(&SelectOptions::default(), &buf.layout()) {
        Ok(s) => {
            c.check(
                s.kind == SourceKind::SoftDirty && s.reason.contains("No free kdamond slot"),
                "select: falls back when DAMON is busy",
                &s.reason,
            );
        }
        Err(e) => c.fatal("select: falls back when DAMON is busy", e),
    }
    two.detach();
    let _ = write(&format!("{ADMIN}/0/state"), "off");
    let _ = write(&format!("{ADMIN}/nr_kdamonds"), "0");
    let _ = a;
}

/// Selection: DAMON here, soft-dirty when DAMON sysfs is missing, forced names honoured.
fn selection(c: &mut Checks) {
    let buf = HotBuf::new(4 << 20, 1 << 20).expect("map");
    let layout = buf.layout();
    match select(&SelectOptions::default(), &layout) {
        Ok(s) => {
            println!("  {}", s.reason);
            c.check(
                s.kind == SourceKind::DamonVaddr
                    && s.reason
                        .starts_with("hotness source: damon-vaddr (DAMON fvaddr"),
                "select: auto picks damon-vaddr",
                &s.reason,
            );
        }
        Err(e) => c.fatal("select: auto picks damon-vaddr", e),
    }
    let no_damon = SelectOptions {
        damon: DamonConfig {
            root: "/nonexistent/damon".into(),
            ..DamonConfig::default()
        },
        ..SelectOptions::default()
    };
    match select(&no_damon, &layout) {
        Ok(s) => {
            println!("  {}", s.reason);
            c.check(
                s.kind == SourceKind::SoftDirty
                    && s.reason.starts_with("hotness source: soft-dirty (")
                    && s.reason
                        .contains("DAMON vaddr unavailable: No DAMON sysfs at /nonexistent/damon"),
                "select: soft-dirty when DAMON is unavailable",
                &s.reason,
            );
        }
        Err(e) => c.fatal("select: soft-dirty when DAMON is unavailable", e),
    }
    let forced = SelectOptions {
        choice: Choice::Force(SourceKind::DamonVaddr),
        ..no_damon
    };
    let r = select(&forced, &layout);
    c.check(
        r.is_err(),
        "select: forced damon-vaddr fails without DAMON",
        r.err().map_or_else(String::new, |e| {
            format!(
                "{e}: {}",
                std::error::Error::source(&e).map_or(String::new(), ToString::to_string)
            )
        }),
    );
    let forced_sd = SelectOptions {
        choice: Choice::Force(SourceKind::SoftDirty),
        ..SelectOptions::default()
    };
    match select(&forced_sd, &layout) {
        Ok(s) => c.check(
            s.kind == SourceKind::SoftDirty && s.reason.contains("forced"),
            "select: forced soft-dirty",
            &s.reason,
        ),
        Err(e) => c.check(false, "select: forced soft-dirty", e),
    };
    c.check(
        read(&format!("{ADMIN}/nr_kdamonds")) == "0",
        "select: dropped selections leave no kdamond",
        format!("nr_kdamonds {}", read(&format!("{ADMIN}/nr_kdamonds"))),
    );
}

/// A process that exits while monitored is reported as gone.
fn gone(c: &mut Checks, src: &mut dyn HotnessSource) {
    let name = src.name();
    let mut child = match Command::new("sleep")
        .arg("60")
        .stdout(Stdio::null())
        .spawn()
    {
        Ok(ch) => ch,
        Err(e) => return c.fatal(&format!("{name}: spawn"), e),
    };
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    thread::sleep(Duration::from_millis(100));
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let stack = maps.lines().find(|l| l.ends_with("[stack]")).and_then(|l| {
        let (s, e) = l.split_whitespace().next()?.split_once('-')?;
        Some((
            u64::from_str_radix(s, 16).ok()?,
            u64::from_str_radix(e, 16).ok()?,
        ))
    });
    let Some((s, e)) = stack else {
        let _ = child.kill();
        let _ = child.wait();
        return c.fatal(&format!("{name}: child stack"), "not found");
    };
    let layout = GuestMemoryLayout::new(
        ProcessId::new(pid),
        vec![GuestRamRange {
            name: "stack".into(),
            gpa: GuestPhysAddr(0),
            hva: HostVirtAddr::new(s),
            len: e - s,
            backing: Backing::PrivateAnon,
        }],
    )
    .expect("aligned");
    if let Err(err) = src.attach(&layout) {
        let _ = child.kill();
        let _ = child.wait();
        return c.fatal(&format!("{name}: attach to child"), err);
    }
    let _ = child.kill();
    let _ = child.wait();
    let mut out = Vec::new();
    let mut last = Ok(());
    for _ in 0..5 {
        last = src.collect(&mut out);
        if last.is_err() {
            break;
        }
        thread::sleep(Duration::from_millis(200));
    }
    c.check(
        matches!(last, Err(hotness::Error::Gone)),
        &format!("{name}: exited process -> Gone"),
        format!("{last:?}"),
    );
    src.detach();
}

/// THP's `enabled` setting.
const THP: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// DAMON on the workload guest's QEMU: the guest's hot set ranks above the rest of its RAM
/// and reaches promotable heat in a store with vmtierd's default 2 MiB granules — with the
/// guest's RAM on huge pages (`thp_off` false) and on 4 KiB pages.
fn guest_hot_set(c: &mut Checks, a: &SourcesArgs, elf: &std::path::Path, thp_off: bool) {
    let what = if thp_off {
        "guest (4 KiB pages)"
    } else {
        "guest"
    };
    let thp_before = read(THP);
    if thp_off && !write(THP, "never") {
        return c.fatal(&format!("{what}: THP off"), THP);
    }
    let restore = |c: &mut Checks| {
        if thp_off {
            let was = thp_before
                .split_whitespace()
                .find(|w| w.starts_with('['))
                .map(|w| w.trim_matches(|ch| ch == '[' || ch == ']').to_owned())
                .unwrap_or_else(|| "madvise".into());
            if !write(THP, &was) {
                c.fatal(&format!("{what}: THP restore"), THP);
            }
        }
    };
    guest_hot_set_run(c, a, elf, what);
    restore(c);
}

fn guest_hot_set_run(c: &mut Checks, a: &SourcesArgs, elf: &std::path::Path, what: &str) {
    let mut g = match Guest::start(
        &a.qemu,
        elf,
        ByteSize(64 << 20),
        0,
        "hot=8M report=5 sweep_every=1000000 duration=900",
    ) {
        Ok(g) => g,
        Err(e) => return c.fatal(&format!("{what}: start"), e),
    };
    let Some(start) = g.wait_for("WG start", Duration::from_secs(60)) else {
        return c.fatal(&format!("{what}: WG start"), "not seen");
    };
    if g.wait_for("WG filled", Duration::from_secs(120)).is_none() {
        return c.fatal(&format!("{what}: WG filled"), "not seen");
    }
    let (Some(hot_gpa), Some(hot_bytes)) = (num(&start, "hot_start"), num(&start, "hot_bytes"))
    else {
        return c.fatal(&format!("{what}: WG start fields"), &start);
    };
    let layout = match QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .and_then(|mut b| b.discover())
    {
        Ok(l) => l,
        Err(e) => return c.fatal(&format!("{what}: discover"), e),
    };
    let (Some(lo), Some(hi)) = (
        layout.translate(GuestPhysAddr(hot_gpa)),
        layout.translate(GuestPhysAddr(hot_gpa + hot_bytes - 1)),
    ) else {
        return c.fatal(
            &format!("{what}: translate hot set"),
            format!("{hot_gpa:#x}+{hot_bytes:#x}"),
        );
    };
    let (lo, hi) = (lo.raw(), hi.raw() + 1);
    let mut d = DamonSource::new(DamonConfig::default());
    if let Err(e) = d.attach(&layout) {
        return c.fatal(&format!("{what}: damon attach"), e);
    }
    let mut store = match HotnessStore::new(
        &layout,
        StoreConfig {
            granule: vmtier_core::GranuleSize::HUGE,
            ..StoreConfig::default()
        },
    ) {
        Ok(s) => s,
        Err(e) => return c.fatal(&format!("{what}: store"), e),
    };
    let mut out = Vec::new();
    let (mut hs, mut cs, mut n) = (0f64, 0f64, 0u32);
    for round in 0..a.rounds {
        thread::sleep(Duration::from_secs_f64(a.interval));
        g.poll();
        out.clear();
        if let Err(e) = d.collect(&mut out) {
            return c.fatal(&format!("{what}: damon collect"), e);
        }
        store.tick();
        store.observe(&out);
        let (h, _) = mean_permille(&out, lo, hi);
        let total: u64 = layout.ranges.iter().map(|r| r.len).sum();
        let all = mean_permille(&out, 0, u64::MAX);
        // Mean of everything outside the hot set, from the whole-RAM mean.
        let hot_len = (hi - lo) as f64;
        let k = (all.0 * all.1 as f64 - h * hot_len) / (total as f64 - hot_len).max(1.0);
        println!(
            "  {what} round {round}: {} regions, hot set {h:.0}‰ of samples, rest {k:.0}‰",
            out.len()
        );
        if round > 0 {
            hs += h;
            cs += k.max(0.0);
            n += 1;
        }
    }
    let (h, k) = (hs / f64::from(n.max(1)), cs / f64::from(n.max(1)));
    c.check(
        h >= 2.0 * k + 63.0,
        &format!("{what}: DAMON ranks the guest's hot set above the rest"),
        format!(
            "hot set found accessed in {h:.0}‰ of samples vs rest {k:.0}‰ ({} MiB hot of {} MiB)",
            hot_bytes >> 20,
            layout.total_bytes() >> 20
        ),
    );
    // The hot set's granules (whole 2 MiB ones inside it) are promotable by the default
    // policy after these ticks.
    let granules: Vec<_> = (0..u32::try_from(store.len()).unwrap_or(0))
        .map(vmtier_core::policy::Granule)
        .filter(|&gr| {
            store.span(gr).is_some_and(|sp| {
                sp.gpa.0 >= hot_gpa && sp.gpa.0 + sp.len <= hot_gpa + hot_bytes && sp.len == 2 << 20
            })
        })
        .collect();
    let promotable = granules
        .iter()
        .filter(|gr| store.records()[gr.index()].heat() >= PROMOTE_MIN_HEAT)
        .count();
    c.check(
        !granules.is_empty() && promotable * 10 >= granules.len() * 9,
        &format!("{what}: the hot set's granules reach promotable heat"),
        format!(
            "{promotable} of {} hot-set 2 MiB granules at heat ≥ {PROMOTE_MIN_HEAT}",
            granules.len()
        ),
    );
    d.detach();
}

/// vmtierd's DAMON settings with `min_nr_regions` 10, for the checks that read a buffer in
/// the first seconds after attaching. vmtierd hands DAMON its ranges cut to `min_nr_regions`
/// (520) from the start; under TCG a kdamond checking that many regions takes about a second
/// per 20-sample window (one window per collect, none within the first second: 2026-11-28,
/// fresh-clone run at 329aeee), where these checks need it to finish several. Only the
/// first seconds differ: DAMON splits up to that many regions within seconds anyway, and the
/// e2e static/thp kdamond CPU was 17.4 s with the cut against 17.5 s before.
fn few_regions() -> DamonConfig {
    let mut cfg = DamonConfig::default();
    cfg.attrs.min_nr_regions = 10;
    cfg
}

pub fn run(c: &mut Checks, a: &SourcesArgs) {
    if a.hot.0 == 0
        || a.hot.0 >= a.size.0
        || a.size.0 % PAGE as u64 != 0
        || a.hot.0 % PAGE as u64 != 0
    {
        return c.fatal("arguments", "need 0 < --hot < --size, both page multiples");
    }
    selection(c);
    let mut d = DamonSource::new(few_regions());
    let samples = hot_vs_cold(c, a, &mut d);
    // One collect per second with DAMON's 5 ms samples: up to 200 when every window is read
    // (fewer when the emulated kdamond runs late), never more than 20 with one window per
    // collect.
    let per_window = DamonConfig::default().attrs.max_nr_accesses();
    c.check(
        u64::from(samples) >= 2 * per_window,
        "damon: every aggregation window of a tick is read (tracepoint)",
        format!("up to {samples} samples per report, {per_window} per window"),
    );
    let mut s = SoftDirtySource::default();
    hot_vs_cold(c, a, &mut s);
    println!(
        "  soft-dirty scan: {:?}",
        vmtier_sources::softdirty::probe().map(|s| s.name())
    );
    damon_sharing(c, a);
    gone(c, &mut DamonSource::new(DamonConfig::default()));
    gone(c, &mut SoftDirtySource::default());
    c.check(
        read(&format!("{ADMIN}/nr_kdamonds")) == "0" && kdamond_threads() == 0,
        "damon: nothing left behind",
        format!(
            "nr_kdamonds {}, kdamond threads {}",
            read(&format!("{ADMIN}/nr_kdamonds")),
            kdamond_threads()
        ),
    );
    if let Some(elf) = &a.elf {
        guest_hot_set(c, a, elf, false);
        guest_hot_set(c, a, elf, true);
    }
}
