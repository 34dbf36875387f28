//! `kmod-fuzz`: random and mutated `VMTIER_IOC_MIGRATE`/`QUERY` calls against a target
//! that keeps mapping, unmapping, forking and exiting, with the test DMA provider's faults
//! switched on and off. The kernel must stay healthy (the testbed fails the run on any
//! oops, warning or bad page), every successful call's counts must add up, and at the end
//! nothing may be left isolated, active or abandoned, and both modules must unload.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use vmtier_migrate::uapi::{self, VmtierMigrate, VmtierRange};
use vmtier_migrate::{Kmod, KmodConfig};

use crate::check::Checks;
use crate::kmod::{kstat, load_modules, sh};
use crate::kmod_errors::{errno_name, set};
use crate::mem::vmstat;

#[derive(clap::Args, Debug)]
pub struct KmodFuzzArgs {
    /// Directory holding vmtier.ko and vmtier_test_dma.ko.
    #[arg(long, default_value = "target/kmod")]
    ko_dir: PathBuf,
    /// Stop after this many ioctl calls (all threads together).
    #[arg(long, default_value_t = 100_000)]
    calls: u64,
    /// Stop after this many seconds at the latest.
    #[arg(long, default_value_t = 1200)]
    secs: u64,
    /// Random seed (0: from the clock).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Calling threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
}

/// xorshift64*: small, fast, good enough to pick cases.
#[derive(Clone, Copy)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// True with probability `pct` percent.
    fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    /// A number below `n`, as an index.
    fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).unwrap_or(0)
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.index(v.len())]
    }
}

/// Slots the target publishes its mappings in: (start, len) pairs in a shared page.
const SLOTS: usize = 64;

struct Table(*mut u64);

// SAFETY: the table is a MAP_SHARED page that lives for the whole run; it is only
// accessed with volatile word reads and writes, and stale values are expected.
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    fn new() -> Option<Self> {
        // SAFETY: a fresh shared anonymous page, kept until the process exits.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| Self(p.cast()))
    }

    fn get(&self, slot: usize) -> (u64, u64) {
        // SAFETY: slot < SLOTS, so both words are inside the page.
        unsafe {
            (
                self.0.add(2 * slot).read_volatile(),
                self.0.add(2 * slot + 1).read_volatile(),
            )
        }
    }

    fn set(&self, slot: usize, start: u64, len: u64) {
        // SAFETY: as in get.
        unsafe {
            self.0.add(2 * slot).write_volatile(start);
            self.0.add(2 * slot + 1).write_volatile(len);
        }
    }
}

/// The target's life in a forked child: only raw system calls (the parent is
/// multi-threaded, so no allocation after fork). Maps private anonymous regions (some
/// THP, some shared, some KSM-mergeable), touches them, changes protection, drops
/// pages, forks short-lived children (copy-on-write sharing) and unmaps, then exits.
fn target_life(table: &Table, seed: u64) -> ! {
    let mut rng = Rng(seed | 1);
    let mut maps = [(0u64, 0usize); SLOTS];
    let deadline = 500 + rng.below(2500);
    let mut elapsed = 0;
    while elapsed < deadline {
        let slot = rng.index(SLOTS);
        let (old, old_len) = maps[slot];
        if old != 0 {
            table.set(slot, 0, 0);
            // SAFETY: a region this child mapped itself.
            unsafe { libc::munmap(old as *mut libc::c_void, old_len) };
            maps[slot] = (0, 0);
        }
        let len = (1 + rng.index(1024)) * 4096;
        let shared = rng.pct(10);
        let flags = libc::MAP_ANONYMOUS
            | if shared {
                libc::MAP_SHARED
            } else {
                libc::MAP_PRIVATE
            };
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            let advice = rng.pick(&[
                libc::MADV_NORMAL,
                libc::MADV_HUGEPAGE,
                libc::MADV_NOHUGEPAGE,
                libc::MADV_MERGEABLE,
            ]);
            // SAFETY: advice and writes on the mapping just made.
            unsafe {
                libc::madvise(p, len, advice);
                let touch = rng.index(len / 4096 + 1);
                for i in 0..touch {
                    (p.cast::<u8>().add(i * 4096)).write_volatile(i.to_le_bytes()[0]);
                }
                if rng.pct(15) {
                    libc::mprotect(p, 4096.min(len), libc::PROT_READ);
                }
                if rng.pct(15) {
                    libc::madvise(p, len / 2, libc::MADV_DONTNEED);
                }
            }
            maps[slot] = (p as u64, len);
            table.set(slot, p as u64, len as u64);
        }
        if rng.pct(5) {
            // SAFETY: fork; the grandchild sleeps briefly and exits.
            if unsafe { libc::fork() } == 0 {
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                };
                // SAFETY: plain system calls, then exit without unwinding.
                unsafe {
                    libc::nanosleep(&ts, std::ptr::null_mut());
                    libc::_exit(0);
                }
            }
        }
        // Reap grandchildren that have exited.
        // SAFETY: non-blocking wait for any child.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        let ms = 1 + rng.below(20);
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: (ms * 1_000_000) as libc::c_long,
        };
        // SAFETY: sleeps.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        elapsed += ms;
    }
    // SAFETY: exit without running the parent's destructors.
    unsafe { libc::_exit(0) }
}

/// What the fuzzing threads see.
struct Shared {
    table: Table,
    target: AtomicI32,
    dead: AtomicI32,
    stop: AtomicBool,
    calls: AtomicU64,
    bad: AtomicU64,
    moved: AtomicU64,
    errnos: Mutex<BTreeMap<String, u64>>,
    first_bad: Mutex<Option<String>>,
}

/// One random range: inside the target's (or the caller's) mappings, mutated when
/// `hostile`.
fn random_range(
    rng: &mut Rng,
    st: &Shared,
    own: &[(u64, u64)],
    mine: bool,
    hostile: bool,
) -> VmtierRange {
    let (mut start, mut len) = (0, 0);
    if mine {
        (start, len) = own[rng.index(own.len())];
    } else {
        for _ in 0..8 {
            (start, len) = st.table.get(rng.index(SLOTS));
            if start != 0 && len != 0 {
                break;
            }
        }
    }
    if start == 0 || len == 0 {
        start = rng.pick(&[0x1000, 0x7fff_0000_0000, 0x5555_5555_0000]);
        len = 0x4000;
    }
    // A sub-range, mostly short (calls stay quick), sometimes mutated.
    let pages = (len / 4096).max(1);
    let off = rng.below(pages) * 4096;
    start += off;
    let most = if rng.pct(90) { 32 } else { u64::MAX };
    len = (1 + rng.below((pages - off / 4096).min(most))) * 4096;
    match if hostile { rng.below(12) } else { 99 } {
        0 => start += 1 + rng.below(4095),
        1 => len = rng.below(4096),
        2 => len = 0,
        3 => len = 1 << (40 + rng.below(24)),
        4 => start = u64::MAX - rng.below(4) * 4096,
        5 => start = 0xffff_8880_0000_0000 + rng.below(1 << 30) * 4096,
        6 => len += rng.below(512) * 4096,
        7 => start = start.saturating_sub(rng.below(64) * 4096),
        _ => {}
    }
    let mut r = VmtierRange {
        start,
        len,
        ..Default::default()
    };
    if hostile && rng.pct(5) {
        r.reserved = rng.next();
    }
    if rng.pct(2) {
        r.moved = rng.next(); // an (out) field with garbage in: must be ignored
    }
    r
}

fn tally(st: &Shared, key: String) {
    if let Ok(mut m) = st.errnos.lock() {
        *m.entry(key).or_default() += 1;
    }
}

fn bad(st: &Shared, what: String) {
    st.bad.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut f) = st.first_bad.lock() {
        f.get_or_insert(what);
    }
}

/// Every page of a processed range is in exactly one count; the totals match.
fn check_counts(st: &Shared, m: &VmtierMigrate, rs: &[VmtierRange], whole: bool) {
    let mut moved = 0u64;
    let mut skipped = 0u64;
    let mut failed = 0u64;
    for r in rs {
        let s = r.on_target
            + r.skipped_hole
            + r.skipped_thp
            + r.skipped_busy
            + r.skipped_shared
            + r.skipped_pinned
            + r.skipped_sharers;
        if whole && r.moved + s + r.failed != r.len / 4096 {
            bad(
                st,
                format!("range counts do not add up to its pages: {r:?}"),
            );
        }
        moved += r.moved;
        skipped += s;
        failed += r.failed;
    }
    if (moved, skipped, failed) != (m.moved, m.skipped, m.failed) {
        bad(
            st,
            format!(
                "totals {}/{}/{} vs ranges {moved}/{skipped}/{failed}",
                m.moved, m.skipped, m.failed
            ),
        );
    }
    if m.unmapped > moved + skipped + failed {
        bad(st, format!("unmapped {} above the pages", m.unmapped));
    }
    st.moved.fetch_add(moved, Ordering::Relaxed);
}

fn one_call(k: &Kmod, rng: &mut Rng, st: &Shared, own: &[(u64, u64)]) {
    let cur = std::mem::size_of::<VmtierMigrate>();
    if rng.pct(3) {
        // QUERY with a random size, sometimes a nonzero tail.
        let (extra, small) = (8 * rng.index(32), 8 * rng.index(48));
        let size = rng.pick(&[
            uapi::QUERY_SIZE_VER1,
            std::mem::size_of::<uapi::VmtierQuery>(),
            std::mem::size_of::<uapi::VmtierQuery>() + extra,
            small,
        ]);
        let mut w = vec![0u64; size / 8 + 1];
        w[0] = size as u64;
        if rng.pct(20) {
            if let Some(x) = w.last_mut() {
                *x = rng.next();
            }
        }
        // SAFETY: the buffer holds more than the size the command encodes.
        let r = unsafe { k.raw_ioctl(uapi::ioc_query(size), w.as_mut_ptr()) };
        tally(
            st,
            format!(
                "query {}",
                errno_name(r.err().and_then(|e| e.raw_os_error()).unwrap_or(0))
            ),
        );
        return;
    }
    // Well-formed calls reach the migration paths; hostile ones the checks.
    let hostile = rng.pct(50);
    let nr = match if hostile { rng.below(6) } else { 99 } {
        0 => 0,
        1 => uapi::MAX_RANGES + 1 + rng.below(10),
        2 => 16 + rng.below(64),
        _ => 1 + rng.below(6),
    };
    // Room for every range the module may read and write back, and one more for the
    // misaligned pointer below; above MAX_RANGES the module refuses before reading.
    let alloc = if nr <= uapi::MAX_RANGES {
        usize::try_from(nr).unwrap_or(1).max(1)
    } else {
        1
    };
    let target = st.target.load(Ordering::Relaxed);
    let (r1, r2, r3) = (rng.below(70000), rng.below(100), rng.below(70000));
    let pid = match rng.below(20) {
        0 | 1 => 0,
        2 if hostile => u64::try_from(st.dead.load(Ordering::Relaxed)).unwrap_or(0),
        3 if hostile => rng.pick(&[1, 2, 4_194_304, 4_194_305, u64::MAX, r1]),
        _ => u64::try_from(target).unwrap_or(0),
    };
    let mut rs: Vec<VmtierRange> = (0..=alloc)
        .map(|_| {
            let mutate = hostile && rng.pct(50);
            random_range(rng, st, own, pid == 0, mutate)
        })
        .collect();
    let mut m = VmtierMigrate {
        size: cur as u64,
        flags: if !hostile || rng.pct(70) {
            rng.below(4)
        } else {
            rng.next()
        },
        pid,
        node: if !hostile || rng.pct(70) {
            rng.below(2)
        } else {
            rng.pick(&[2, 63, 1024, u64::MAX])
        },
        ranges: rs.as_mut_ptr() as u64,
        nr_ranges: nr,
        engine: if !hostile || rng.pct(70) {
            rng.below(3)
        } else {
            rng.next()
        },
        workers: if hostile {
            rng.pick(&[0, 1, 2, 64, 65, r2])
        } else {
            rng.below(5)
        },
        batch: if hostile {
            rng.pick(&[0, 1, 7, 65536, 65537, r3])
        } else {
            rng.pick(&[0, 1, 64, 512, 4096])
        },
        ..Default::default()
    };
    if hostile && rng.pct(10) {
        m.ranges = rng.pick(&[0, 16, 0xffff_8880_0000_0000, m.ranges + 3]);
    }
    if hostile && rng.pct(10) {
        m.reserved[rng.index(4)] = 1;
    }
    if rng.pct(2) {
        m.moved = rng.next(); // (out) garbage in
    }
    let (size, tail) = match rng.below(if hostile { 8 } else { 4 }) {
        0 => (uapi::MIGRATE_SIZE_VER1, 0),
        1 => (cur + 8 * (1 + rng.index(16)), 0),
        4 => (cur + 8 * (1 + rng.index(16)), 1 + rng.below(u64::MAX - 1)),
        5 => (8 * rng.index(30), 0),
        _ => (cur, 0),
    };
    let words = size.max(cur) / 8 + 1;
    let mut w = vec![0u64; words];
    // SAFETY: VmtierMigrate is `cur / 8` plain u64s.
    let src = unsafe { std::slice::from_raw_parts(std::ptr::from_ref(&m).cast::<u64>(), cur / 8) };
    w[..cur / 8].copy_from_slice(src);
    for x in w.iter_mut().skip(cur / 8) {
        *x = 0;
    }
    if size > cur && tail != 0 {
        w[size / 8 - 1] = tail;
    }
    if !hostile || rng.pct(90) {
        w[0] = size as u64;
    } else {
        w[0] = rng.next();
    }
    let mut cmd = uapi::ioc_migrate(size);
    if hostile && rng.pct(3) {
        cmd = uapi::iowr(uapi::IOC_MAGIC, rng.below(256), size);
    }
    st.calls.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `w` holds at least the size the command encodes; the ranges pointer is a
    // live array of `alloc` entries or deliberately bad, which the module must refuse.
    let r = unsafe { k.raw_ioctl(cmd, w.as_mut_ptr()) };
    let errno = r.err().and_then(|e| e.raw_os_error()).unwrap_or(0);
    tally(st, format!("migrate {}", errno_name(errno)));
    let ok_shape = cmd == uapi::ioc_migrate(size) && size >= uapi::MIGRATE_SIZE_VER1;
    if ok_shape && (errno == 0 || errno == libc::EINTR || errno == libc::ESRCH) {
        let mut out = VmtierMigrate::default();
        let n = size.min(cur) / 8;
        // SAFETY: out is `cur / 8` words; n <= that.
        unsafe {
            std::ptr::copy_nonoverlapping(w.as_ptr(), std::ptr::from_mut(&mut out).cast(), n)
        };
        if size >= cur && m.ranges == rs.as_ptr() as u64 {
            let k = usize::try_from(out.nr_ranges).unwrap_or(0).min(alloc);
            check_counts(st, &out, &rs[..k], errno == 0);
        }
    }
}

/// Switches the test provider's faults now and then (short stalls and timeouts).
fn dma_chaos(rng: &mut Rng) {
    match rng.below(6) {
        0 => set("vmtier_test_dma", "fail_every", &rng.below(20).to_string()),
        1 => set(
            "vmtier_test_dma",
            "terminate",
            if rng.pct(50) { "1" } else { "0" },
        ),
        2 => {
            set(
                "vmtier_test_dma",
                "stall_ms",
                &(10 + rng.below(60)).to_string(),
            );
            set(
                "vmtier_test_dma",
                "stall_every",
                &rng.pick(&[0, 0, 50, 300, 1000]).to_string(),
            );
        }
        3 => set("vmtier", "dma_timeout_ms", &(5 + rng.below(50)).to_string()),
        4 => set("vmtier", "dma_idle_ms", &(1 + rng.below(100)).to_string()),
        _ => set("vmtier", "auto_dma_min_pages", &rng.below(2048).to_string()),
    }
}

pub fn run(c: &mut Checks, a: &KmodFuzzArgs) {
    let seed = if a.seed != 0 {
        a.seed
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::from(d.subsec_nanos()) ^ d.as_secs())
    };
    println!("kmod-fuzz: seed {seed}");
    let base_iso = vmstat("nr_isolated_anon");
    if !load_modules(c, &a.ko_dir, 2) {
        return;
    }
    let Some(table) = Table::new() else {
        return c.fatal("map the target's table", "mmap failed");
    };
    let st = Arc::new(Shared {
        table,
        target: AtomicI32::new(0),
        dead: AtomicI32::new(0),
        stop: AtomicBool::new(false),
        calls: AtomicU64::new(0),
        bad: AtomicU64::new(0),
        moved: AtomicU64::new(0),
        errnos: Mutex::new(BTreeMap::new()),
        first_bad: Mutex::new(None),
    });
    // The caller's own buffers, for pid 0.
    let own_bufs: Vec<crate::mem::AnonBuf> = [(0u32, false), (1, false), (1, true)]
        .iter()
        .filter_map(|&(n, thp)| crate::mem::AnonBuf::new_on_node(4 << 20, thp, n).ok())
        .collect();
    let own: Vec<(u64, u64)> = own_bufs
        .iter()
        .map(|b| (b.addr().raw(), b.len() as u64))
        .collect();
    let t0 = Instant::now();
    let spawner = {
        let st = st.clone();
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        thread::spawn(move || {
            let mut lives = 0u64;
            while !st.stop.load(Ordering::Relaxed) {
                let child_seed = rng.next();
                // SAFETY: fork; the child only makes raw system calls (target_life).
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    target_life(&st.table, child_seed);
                }
                if pid < 0 {
                    thread::sleep(Duration::from_millis(100));
                    continue;
                }
                lives += 1;
                st.target.store(pid, Ordering::Relaxed);
                let mut status = 0;
                // SAFETY: waits for our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                st.dead.store(pid, Ordering::Relaxed);
                for s in 0..SLOTS {
                    st.table.set(s, 0, 0);
                }
            }
            lives
        })
    };
    let mut workers = Vec::new();
    for t in 0..a.threads.max(1) {
        let st = st.clone();
        let own = own.clone();
        let (limit, secs) = (a.calls, a.secs);
        let mut rng = Rng(seed.wrapping_add(u64::from(t) * 0x1234_5678_9abc_def1) | 1);
        workers.push(thread::spawn(move || {
            let Ok(k) = Kmod::open(KmodConfig::default()) else {
                return;
            };
            let start = Instant::now();
            while st.calls.load(Ordering::Relaxed) < limit
                && start.elapsed() < Duration::from_secs(secs)
            {
                if t == 0 && rng.pct(1) {
                    dma_chaos(&mut rng);
                }
                one_call(&k, &mut rng, &st, &own);
            }
        }));
    }
    let mut next_report = Duration::from_secs(30);
    while workers.iter().any(|w| !w.is_finished()) {
        thread::sleep(Duration::from_millis(200));
        if t0.elapsed() >= next_report {
            println!(
                "kmod-fuzz: {} calls after {:.0} s",
                st.calls.load(Ordering::Relaxed),
                t0.elapsed().as_secs_f64()
            );
            next_report += Duration::from_secs(30);
        }
    }
    for w in workers {
        let _ = w.join();
    }
    st.stop.store(true, Ordering::Relaxed);
    let target = st.target.load(Ordering::Relaxed);
    if target > 0 {
        // SAFETY: signals our own child so that the spawner's wait returns.
        unsafe { libc::kill(target, libc::SIGKILL) };
    }
    let lives = spawner.join().unwrap_or(0);
    let elapsed = t0.elapsed();
    for (kname, v) in [
        ("fail_every", "0"),
        ("stall_every", "0"),
        ("terminate", "1"),
        ("stuck", "0"),
    ] {
        set("vmtier_test_dma", kname, v);
    }
    set("vmtier", "dma_timeout_ms", "2000");
    set("vmtier", "dma_idle_ms", "5000");
    set("vmtier", "auto_dma_min_pages", "4096");
    // Late descriptors of abandoned DMA batches finish within their short stalls.
    let t = Instant::now();
    while kstat("dma_abandoned_live") != 0 && t.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_millis(100));
    }
    let calls = st.calls.load(Ordering::Relaxed);
    let errnos = st.errnos.lock().map(|m| m.clone()).unwrap_or_default();
    println!(
        "kmod-fuzz: {calls} MIGRATE calls + {} QUERY calls in {:.1} s (TCG), {} target \
         lives, {} pages moved",
        errnos
            .iter()
            .filter(|(k, _)| k.starts_with("query"))
            .map(|(_, v)| v)
            .sum::<u64>(),
        elapsed.as_secs_f64(),
        lives,
        st.moved.load(Ordering::Relaxed)
    );
    for (k, v) in &errnos {
        println!("kmod-fuzz:   {k:<22} {v}");
    }
    for k in [
        "pages_unmapped",
        "batches",
        "batches_by_workers",
        "pages_skipped_pinned",
        "pages_skipped_sharers",
        "pages_aborted",
        "pages_copied_dma",
        "dma_errors",
        "dma_timeouts",
        "dma_terminate_failed",
        "dma_abandoned_pages",
        "dma_chan_requests",
        "calls_target_exited",
    ] {
        println!("kmod-fuzz:   module {k:<24} {}", kstat(k));
    }
    let first_bad = st.first_bad.lock().ok().and_then(|f| f.clone());
    c.check(
        calls >= a.calls.min(1) && st.bad.load(Ordering::Relaxed) == 0,
        &format!("fuzz: {calls} calls, every successful call's counts add up"),
        format!(
            "{} bad{}",
            st.bad.load(Ordering::Relaxed),
            first_bad.map_or(String::new(), |b| format!(", first: {b}"))
        ),
    );
    c.check(
        errnos.get("migrate ok").copied().unwrap_or(0) > calls / 10,
        "fuzz: a fair share of calls did migrate",
        format!(
            "{} succeeded",
            errnos.get("migrate ok").copied().unwrap_or(0)
        ),
    );
    c.check(
        kstat("active") == 0
            && kstat("dma_abandoned_live") == 0
            && kstat("dst_allocated")
                == kstat("dst_freed_unplaced") + kstat("pages_moved") + kstat("dst_placed_failed"),
        "fuzz: nothing active or abandoned, every destination page placed or freed",
        format!(
            "active {}, abandoned live {}, dst allocated {} = freed {} + moved {} + \
             placed-failed {}",
            kstat("active"),
            kstat("dma_abandoned_live"),
            kstat("dst_allocated"),
            kstat("dst_freed_unplaced"),
            kstat("pages_moved"),
            kstat("dst_placed_failed")
        ),
    );
    drop(own_bufs);
    let (ok2, o2) = sh("rmmod vmtier");
    let (ok1, o1) = sh("rmmod vmtier_test_dma");
    thread::sleep(Duration::from_millis(300));
    let iso = vmstat("nr_isolated_anon");
    c.check(
        ok1 && ok2 && iso == base_iso,
        "fuzz: both modules unload, nothing left isolated",
        format!("{o2} {o1}; nr_isolated_anon {iso} (baseline {base_iso})"),
    );
}
