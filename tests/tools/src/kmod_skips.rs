//! What the module leaves mapped and what it uses: pages already on the target, pinned
//! pages (with the migrator's back-off), pages shared with another process (fork, KSM),
//! the default copy threads, and a signal during a call.
//!
//! "Not unmapped" is observed from outside the module too: the kernel's
//! `migrate:remove_migration_pte` trace event fires once per page whose mapping a call
//! replaced, moved or put back.

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vmtier_core::{HostVirtAddr, NodeId, ProcessId};
use vmtier_migrate::kmod::KmodReport;
use vmtier_migrate::{CopyEngine, Kmod, KmodConfig, Residency};

use crate::check::Checks;
use crate::kmod::{describe, kstat};
use crate::kmod_errors::{base_req, call, errno_name, range, Victim};
use crate::mem::AnonBuf;
use crate::tracing::Instance;

const MIB: usize = 1 << 20;

/// Counts `migrate:remove_migration_pte` events for pages of `buf` around `f`. The event
/// fires in whichever thread remaps: the caller or one of the module's work items, so it
/// is selected by address (a kernel-side filter), not by pid.
fn remaps<T>(buf: &AnonBuf, f: impl FnOnce() -> T) -> (T, Option<usize>) {
    let start = buf.addr().raw();
    let end = start + buf.len() as u64;
    let inst =
        Instance::new("remaps", &["migrate/remove_migration_pte"], 8192, None).and_then(|i| {
            i.filter(
                "migrate/remove_migration_pte",
                &format!("addr >= {start:#x} && addr < {end:#x}"),
            )?;
            i.on().map(|()| i)
        });
    let out = f();
    let n = inst.ok().and_then(|i| {
        i.off().ok()?;
        let t = i.text().ok()?;
        Some(
            t.lines()
                .filter(|l| l.contains("remove_migration_pte"))
                .count(),
        )
    });
    (out, n)
}

fn me() -> ProcessId {
    ProcessId::new(0)
}

fn cpu(workers: u32) -> KmodConfig {
    KmodConfig {
        engine: CopyEngine::Cpu,
        workers,
        batch: 0,
    }
}

fn open(c: &mut Checks, cfg: KmodConfig) -> Option<Kmod> {
    match Kmod::open(cfg) {
        Ok(k) => Some(k),
        Err(e) => {
            c.fatal("open /dev/vmtier", e);
            None
        }
    }
}

fn buf_on(c: &mut Checks, len: usize, node: u32) -> Option<AnonBuf> {
    match AnonBuf::new_on_node(len, false, node) {
        Ok(b) => Some(b),
        Err(e) => {
            c.fatal(&format!("allocate buffer on node {node}"), e);
            None
        }
    }
}

fn whole(buf: &AnonBuf) -> [(HostVirtAddr, u64); 1] {
    [(buf.addr(), buf.len() as u64)]
}

fn detail(
    r: &Result<KmodReport, vmtier_migrate::kmod::KmodError>,
    remaps: Option<usize>,
) -> String {
    let r = match r {
        Ok(r) => format!(
            "{}; pinned {} sharers {} unmapped {} batches {} backed off {}",
            describe(r),
            r.sum(|x| x.skipped_pinned),
            r.sum(|x| x.skipped_sharers),
            r.unmapped,
            r.batches,
            r.backed_off
        ),
        Err(e) => e.to_string(),
    };
    format!("{r}; remove_migration_pte events {remaps:?}")
}

pub fn run(c: &mut Checks) {
    on_target(c);
    pinned(c);
    sharers(c);
    ksm(c);
    threads(c);
    interrupted(c);
}

/// Pages on the target are neither unmapped nor remapped; a mixed range unmaps only
/// the pages that move.
fn on_target(c: &mut Checks) {
    let Some(mut k) = open(c, cpu(0)) else { return };
    let Some(b1) = buf_on(c, 4 * MIB, 1) else {
        return;
    };
    let pages = (4 * MIB / 4096) as u64;
    let (r, n) = remaps(&b1, || k.migrate_ranges(me(), &whole(&b1), NodeId::new(0)));
    c.check(
        r.as_ref()
            .is_ok_and(|r| r.sum(|x| x.moved) == pages && r.unmapped == pages)
            && n.is_some_and(|n| n as u64 >= pages),
        "control: moving 4 MiB from node 1 remaps every page",
        detail(&r, n),
    );
    let (r, n) = remaps(&b1, || k.migrate_ranges(me(), &whole(&b1), NodeId::new(0)));
    c.check(
        r.as_ref()
            .is_ok_and(|r| r.sum(|x| x.on_target) == pages && r.unmapped == 0 && r.batches == 0)
            && n == Some(0),
        "pages already on the target are not unmapped (no invalidation, no remap)",
        detail(&r, n),
    );
    // Every other 64-page group already on node 0.
    let Some(b2) = buf_on(c, 4 * MIB, 1) else {
        return;
    };
    let groups: Vec<(HostVirtAddr, u64)> = (0..8u64)
        .filter_map(|g| Some((b2.addr().checked_add(g * 2 * 64 * 4096)?, 64 * 4096)))
        .collect();
    let _ = k.migrate_ranges(me(), &groups, NodeId::new(0));
    let (r, n) = remaps(&b2, || k.migrate_ranges(me(), &whole(&b2), NodeId::new(0)));
    c.check(
        r.as_ref().is_ok_and(|r| {
            r.sum(|x| x.moved) == pages / 2
                && r.sum(|x| x.on_target) == pages / 2
                && r.unmapped == pages / 2
        }) && n == Some(pages as usize / 2),
        "half on the target, interleaved: only the other half is unmapped",
        detail(&r, n),
    );
    c.check(
        b1.corrupted_words() == 0 && b2.corrupted_words() == 0,
        "data intact after the skipping moves",
        "",
    );
}

/// io_uring fixed buffers pin pages (FOLL_PIN | FOLL_LONGTERM).
struct Pin(libc::c_int);

impl Pin {
    fn new(addr: u64, len: usize) -> Result<Self, std::io::Error> {
        // struct io_uring_params is 120 bytes; all zero asks for the defaults.
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup reads and writes the 120-byte params struct.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = libc::c_int::try_from(fd).map_err(|_| std::io::Error::other("fd"))?;
        let iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        const IORING_REGISTER_BUFFERS: u32 = 0;
        // SAFETY: registers one iovec describing our own live buffer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                fd,
                IORING_REGISTER_BUFFERS,
                std::ptr::from_ref(&iov),
                1u32,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(Self(fd))
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        const IORING_UNREGISTER_BUFFERS: u32 = 1;
        // SAFETY: unregistering unpins at once (closing the ring would do it later, from
        // a work item); then the ring is closed.
        unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.0,
                IORING_UNREGISTER_BUFFERS,
                std::ptr::null::<libc::c_void>(),
                0u32,
            );
            libc::close(self.0);
        }
    }
}

fn pinned(c: &mut Checks) {
    let Some(mut k) = open(c, cpu(0)) else { return };
    let Some(buf) = buf_on(c, 4 * MIB, 1) else {
        return;
    };
    let pages = (4 * MIB / 4096) as u64;
    let pin = match Pin::new(buf.addr().raw() + MIB as u64, MIB) {
        Ok(p) => p,
        Err(e) => return c.fatal("pin 1 MiB with io_uring fixed buffers", e),
    };
    let pinned = (MIB / 4096) as u64;
    let (r, n) = remaps(&buf, || {
        k.migrate_ranges(me(), &whole(&buf), NodeId::new(0))
    });
    c.check(
        r.as_ref().is_ok_and(|r| {
            r.sum(|x| x.skipped_pinned) == pinned
                && r.sum(|x| x.moved) == pages - pinned
                && r.unmapped == pages - pinned
        }) && n.map(|n| n as u64) == Some(pages - pinned),
        "pinned pages are skipped without being unmapped",
        detail(&r, n),
    );
    // Second call: the range holds nothing but pins; tried once more, then backed off.
    let calls0 = kstat("calls");
    let r2 = k.migrate_ranges(me(), &whole(&buf), NodeId::new(0));
    let r3 = k.migrate_ranges(me(), &whole(&buf), NodeId::new(0));
    let sent = kstat("calls") - calls0;
    c.check(
        sent == 1
            && r3.as_ref().is_ok_and(|r| {
                r.backed_off == pinned
                    && r.sum(|x| x.skipped_pinned) == pinned
                    && r.sum(|x| x.on_target) == pages - pinned
            }),
        "a range with only pinned pages left is backed off (not sent to the module)",
        format!(
            "{sent} module calls for 2 migrations; second {}; third {}",
            detail(&r2, None),
            detail(&r3, None)
        ),
    );
    drop(pin);
    // The back-off (retry at call 4, then 8) expires: the pages move once unpinned.
    let mut moved = 0;
    for _ in 0..6 {
        if let Ok(r) = k.migrate_ranges(me(), &whole(&buf), NodeId::new(0)) {
            moved += r.sum(|x| x.moved);
        }
    }
    c.check(
        moved == pinned && buf.corrupted_words() == 0,
        "unpinned pages move once the back-off expires",
        format!("{moved} moved"),
    );
}

/// Pages copy-on-write shared with a forked child, moved only with MIGRATE_SHARED.
fn sharers(c: &mut Checks) {
    let Some(v) = Victim::start(4 * MIB, 1) else {
        return c.fatal("fork a child sharing the buffer", "fork failed");
    };
    let pages = v.len / 4096;
    let r = Kmod::open(cpu(0))
        .map_err(|e| e.to_string())
        .and_then(|mut k| {
            k.migrate_ranges(me(), &[(HostVirtAddr::new(v.addr), v.len)], NodeId::new(0))
                .map_err(|e| e.to_string())
        });
    let child_on1 = Residency::of_range(ProcessId::new(v.pid), HostVirtAddr::new(v.addr), v.len)
        .map(|r| r.on(NodeId::new(1)))
        .unwrap_or(0);
    c.check(
        r.as_ref().is_ok_and(|r| {
            r.sum(|x| x.skipped_sharers) == pages && r.sum(|x| x.moved) == 0 && r.unmapped == 0
        }) && child_on1 == v.len,
        "pages shared with a forked child are left alone (and not unmapped)",
        format!(
            "{}; child has {child_on1} bytes on node 1",
            r.as_ref()
                .map_or_else(|e| e.clone(), |r| detail(&Ok(r.clone()), None))
        ),
    );
    let r = Kmod::open(cpu(0)).map_err(|e| e.to_string()).and_then(|k| {
        k.move_shared(true)
            .migrate_ranges(me(), &[(HostVirtAddr::new(v.addr), v.len)], NodeId::new(0))
            .map_err(|e| e.to_string())
    });
    let child_on0 = Residency::of_range(ProcessId::new(v.pid), HostVirtAddr::new(v.addr), v.len)
        .map(|r| r.on(NodeId::new(0)))
        .unwrap_or(0);
    c.check(
        r.as_ref().is_ok_and(|r| r.sum(|x| x.moved) == pages) && child_on0 == v.len,
        "with MIGRATE_SHARED they move, for the child too",
        format!(
            "{}; child has {child_on0} bytes on node 0",
            r.as_ref().map_or_else(|e| e.clone(), describe)
        ),
    );
    v.kill();
}

fn ksm(c: &mut Checks) {
    let Some(mut buf) = buf_on(c, 2 * MIB, 1) else {
        return;
    };
    let pages = (2 * MIB / 4096) as u64;
    buf.words_mut()
        .iter_mut()
        .for_each(|w| *w = 0x4242_4242_4242_4242);
    // SAFETY: advice on our own mapping.
    let adv = unsafe {
        libc::madvise(
            buf.addr().raw() as *mut libc::c_void,
            buf.len(),
            libc::MADV_MERGEABLE,
        )
    };
    let ksm = |f: &str, v: &str| fs::write(format!("/sys/kernel/mm/ksm/{f}"), v).is_ok();
    let started =
        adv == 0 && ksm("pages_to_scan", "4096") && ksm("sleep_millisecs", "10") && ksm("run", "1");
    let merging = || -> u64 {
        fs::read_to_string("/proc/self/ksm_merging_pages")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let t = Instant::now();
    while started && merging() < pages / 2 && t.elapsed() < Duration::from_secs(40) {
        thread::sleep(Duration::from_millis(200));
    }
    let merged = merging();
    if c.check(
        started && merged >= pages / 2,
        "KSM merged the buffer's identical pages",
        format!("{merged} of {pages} merging after {:?}", t.elapsed()),
    ) {
        let r = Kmod::open(cpu(0))
            .map_err(|e| e.to_string())
            .and_then(|mut k| {
                k.migrate_ranges(me(), &whole(&buf), NodeId::new(0))
                    .map_err(|e| e.to_string())
            });
        c.check(
            r.as_ref().is_ok_and(|r| {
                r.sum(|x| x.skipped_sharers) >= merged && r.sum(|x| x.moved) <= pages - merged
            }),
            "KSM pages are left alone",
            r.as_ref()
                .map_or_else(|e| e.clone(), |r| detail(&Ok(r.clone()), None)),
        );
    }
    // Unmerge everything and stop ksmd.
    ksm("run", "2");
    c.check(
        buf.words().iter().all(|&w| w == 0x4242_4242_4242_4242),
        "KSM buffer intact",
        "",
    );
}

/// Threads by default: min(4, housekeeping CPUs), and workers_used says how many copied.
fn threads(c: &mut Checks) {
    let Some(k) = open(c, cpu(0)) else { return };
    let q = match k.query() {
        Ok(q) => q,
        Err(e) => return c.fatal("QUERY", e),
    };
    let want = q.housekeeping_cpus.clamp(1, 4);
    c.check(
        q.default_workers == want && q.default_workers > 1,
        "default copy threads: min(4, housekeeping CPUs), more than one here",
        format!(
            "default {} of {} housekeeping CPUs (max {})",
            q.default_workers, q.housekeeping_cpus, q.max_workers
        ),
    );
    let Some(buf) = buf_on(c, 16 * MIB, 1) else {
        return;
    };
    for (workers, to) in [(0u32, 0u32), (1, 1)] {
        let r = Kmod::open(cpu(workers))
            .map_err(|e| e.to_string())
            .and_then(|mut k| {
                k.migrate_ranges(me(), &whole(&buf), NodeId::new(to))
                    .map_err(|e| e.to_string())
            });
        let expect = if workers == 0 { q.default_workers } else { 1 };
        c.check(
            r.as_ref()
                .is_ok_and(|r| r.workers_used == expect && r.engine_used == Some(CopyEngine::Cpu)),
            &format!("workers {workers}: {expect} threads copied"),
            r.as_ref().map_or_else(|e| e.clone(), describe),
        );
    }
    c.check(buf.corrupted_words() == 0, "threaded copy: data intact", "");
}

extern "C" fn on_usr1(_: libc::c_int) {}

/// A signal (not fatal) interrupts a call: EINTR, counts valid, the batch in progress
/// put back; the migrator issues the call again and finishes.
fn interrupted(c: &mut Checks) {
    // SAFETY: installs a handler that does nothing, without SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let Some(buf) = buf_on(c, 64 * MIB, 1) else {
        return;
    };
    let pages = buf.len() as u64 / 4096;
    let Some(k) = open(c, KmodConfig::default()) else {
        return;
    };
    // SAFETY: pthread_self of this thread, signalled below while it is in the ioctl.
    let me_thread = unsafe { libc::pthread_self() };
    // Sends up to `count` signals, `every` ms apart, until `stop`.
    let kicker = |every: u64, count: u32, stop: Arc<AtomicBool>| {
        let t = me_thread;
        thread::spawn(move || {
            for _ in 0..count {
                thread::sleep(Duration::from_millis(every));
                if stop.load(Ordering::Acquire) {
                    break;
                }
                // SAFETY: signals a live thread of this process; the handler does nothing.
                unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
            }
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let h = kicker(150, 1000, stop.clone());
    let mut rr = [range(buf.addr().raw(), buf.len() as u64)];
    let mut m = base_req(&mut rr);
    m.batch = 256;
    let e = call(&k, &mut m);
    stop.store(true, Ordering::Release);
    let _ = h.join();
    let on0 = Residency::of_range(me(), buf.addr(), buf.len() as u64)
        .map(|r| r.on(NodeId::new(0)) / 4096)
        .unwrap_or(0);
    c.check(
        e == libc::EINTR && rr[0].moved > 0 && rr[0].moved < pages && on0 == rr[0].moved,
        "a signal interrupts a call: EINTR, the pages moved so far counted",
        format!(
            "{}; moved {} of {pages}, {on0} on node 0, calls_interrupted {}",
            errno_name(e),
            rr[0].moved,
            kstat("calls_interrupted")
        ),
    );
    c.check(
        buf.corrupted_words() == 0 && crate::mem::vmstat("nr_isolated_anon") == 0,
        "after the interruption: data intact, nothing left isolated",
        "",
    );
    // Four signals 20 ms apart: the rest of the buffer can move in under 100 ms on a quiet
    // machine, so a first signal at 100 ms missed the call; four stay below the migrator's
    // limit of 8 restarts however slow the call is.
    let stop = Arc::new(AtomicBool::new(false));
    let h = kicker(20, 4, stop.clone());
    let cfg = KmodConfig {
        engine: CopyEngine::Cpu,
        workers: 0,
        batch: 256,
    };
    let r = Kmod::open(cfg)
        .map_err(|e| e.to_string())
        .and_then(|mut k| {
            k.migrate_ranges(me(), &whole(&buf), NodeId::new(0))
                .map_err(|e| e.to_string())
        });
    stop.store(true, Ordering::Release);
    let _ = h.join();
    c.check(
        r.as_ref()
            .is_ok_and(|r| r.restarts > 0 && r.sum(|x| x.moved) + r.sum(|x| x.on_target) == pages)
            && buf.corrupted_words() == 0,
        "the migrator issues an interrupted call again and finishes",
        r.as_ref().map_or_else(
            |e| e.clone(),
            |r| format!("{} restarts; {}", r.restarts, describe(r)),
        ),
    );
}
