//! Migrations racing swap-out writeback: a swap-cache page that a fault maps again while
//! its swap-out write still runs must not reach `migrate_vma_pages()` (which would hit
//! `BUG_ON(folio_test_writeback())`).
//!
//! Swap is a memory-backed null_blk device whose requests complete 100 ms late, so every
//! swapped-out page stays under writeback that long. One thread pushes the buffer out
//! 32 pages at a time with `MADV_PAGEOUT` and at once reads those pages back (the faults
//! find them in the swap cache and map them again while their write still runs); two
//! others move the buffer between the nodes with the module. The kernel must stay
//! healthy (the testbed fails the run on any oops or warning), the module must have met
//! pages under writeback, and the data must be intact. The race runs twice: with the
//! page-table pre-filter (which sees most such pages before unmapping) and without it, so
//! that the check on the locked, unmapped source is what stands between those pages and
//! `migrate_vma_pages()`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vmtier_core::{ByteSize, HostVirtAddr, NodeId, ProcessId};
use vmtier_migrate::{CopyEngine, Kmod, KmodConfig};

use crate::check::Checks;
use crate::kmod::{kstat, load_modules, sh};
use crate::mem::{pattern, AnonBuf};

#[derive(clap::Args, Debug)]
pub struct KmodWritebackArgs {
    /// Directory holding vmtier.ko and vmtier_test_dma.ko.
    #[arg(long, default_value = "target/kmod")]
    ko_dir: std::path::PathBuf,
    /// How long the race runs.
    #[arg(long, default_value_t = 20)]
    secs: u64,
}

pub fn main(c: &mut Checks, a: &KmodWritebackArgs) {
    if !load_modules(c, &a.ko_dir, 2) {
        return;
    }
    if setup(c) {
        for (prefilter, label) in [("Y", "pre-filter on"), ("N", "pre-filter off")] {
            crate::kmod_errors::set("vmtier", "prefilter", prefilter);
            race(c, a.secs.div_ceil(2), label);
        }
        crate::kmod_errors::set("vmtier", "prefilter", "Y");
    }
    teardown();
    let (ok2, o2) = sh("rmmod vmtier");
    let (ok1, o1) = sh("rmmod vmtier_test_dma");
    c.check(ok1 && ok2, "rmmod both modules", format!("{o2} {o1}"));
}

fn setup(c: &mut Checks) -> bool {
    let (ok, out) = sh(
        "modprobe null_blk nr_devices=1 memory_backed=1 irqmode=2 completion_nsec=100000000 \
         hw_queue_depth=1024 gb=1 bs=4096 && mkswap /dev/nullb0 >/dev/null && \
         swapon /dev/nullb0 && echo 0 > /proc/sys/vm/page-cluster",
    );
    c.check(
        ok,
        "swap on a slow null_blk device (writes complete 100 ms late)",
        &out,
    )
}

fn teardown() {
    let _ = sh("swapoff /dev/nullb0; rmmod null_blk; echo 3 > /proc/sys/vm/page-cluster");
}

fn race(c: &mut Checks, secs: u64, label: &str) {
    let len = 32usize << 20;
    let buf = match AnonBuf::new_on_node(len, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate buffer", e),
    };
    let (addr, base) = (buf.addr(), buf.words().as_ptr() as usize);
    let pages = len / 4096;
    let (wb0, wbu0) = (
        kstat("pages_skipped_writeback"),
        kstat("pages_writeback_after_unmap"),
    );
    let swapped0 = crate::mem::vmstat("pswpout");
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    {
        let (stop, reads, bad) = (stop.clone(), reads.clone(), bad.clone());
        handles.push(thread::spawn(move || {
            const CHUNK: usize = 32;
            let mut at = 0;
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: advice on CHUNK pages of the live buffer.
                unsafe {
                    libc::madvise(
                        (base + at * 4096) as *mut libc::c_void,
                        CHUNK * 4096,
                        libc::MADV_PAGEOUT,
                    );
                }
                // Read them back at once: their writes are still running, so the
                // faults find them in the swap cache and map them under writeback.
                for p in at..at + CHUNK {
                    let i = p * 512 + (p % 512);
                    // SAFETY: inside the live buffer (joined before it drops); the
                    // buffer is only read while the threads run.
                    let w = unsafe { ((base + i * 8) as *const u64).read_volatile() };
                    if w != pattern(i) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
                reads.fetch_add(CHUNK as u64, Ordering::Relaxed);
                at = (at + CHUNK) % pages;
            }
        }));
    }
    let calls = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    for t in 0..2u32 {
        let (stop, calls, errors) = (stop.clone(), calls.clone(), errors.clone());
        handles.push(thread::spawn(move || {
            let cfg = KmodConfig {
                engine: CopyEngine::Cpu,
                workers: 0,
                batch: 512,
            };
            let Ok(mut k) = Kmod::open(cfg) else {
                errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let half = (len / 2) as u64;
            let part: (HostVirtAddr, u64) =
                (addr.checked_add(u64::from(t) * half).unwrap_or(addr), half);
            let mut to = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if k.migrate_ranges(ProcessId::new(0), &[part], NodeId::new(to))
                    .is_err()
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                calls.fetch_add(1, Ordering::Relaxed);
                to ^= 1;
            }
        }));
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    let skipped_wb = kstat("pages_skipped_writeback") - wb0;
    let swapped = crate::mem::vmstat("pswpout") - swapped0;
    c.check(
        swapped > 0 && calls.load(Ordering::Relaxed) > 0 && errors.load(Ordering::Relaxed) == 0,
        &format!("{label}: migrations ran while the buffer was swapped out and read back"),
        format!(
            "{} calls, {} errors, {} pages swapped out, {} page reads in {:?} (TCG)",
            calls.load(Ordering::Relaxed),
            errors.load(Ordering::Relaxed),
            swapped,
            reads.load(Ordering::Relaxed),
            t0.elapsed()
        ),
    );
    let after_unmap = kstat("pages_writeback_after_unmap") - wbu0;
    // Without the pre-filter, the check on the unmapped source must have caught them.
    c.check(
        skipped_wb > 0 && (label.ends_with("on") || after_unmap > 0),
        &format!("{label}: the module met pages under writeback and left them in place"),
        format!("pages_skipped_writeback +{skipped_wb} ({after_unmap} found once unmapped)"),
    );
    let corrupted = buf.corrupted_words();
    c.check(
        corrupted == 0 && bad.load(Ordering::Relaxed) == 0,
        &format!("{label}: data intact through swap and migration"),
        format!(
            "{corrupted} corrupted words of {}, {} bad reads meanwhile",
            ByteSize(len as u64),
            bad.load(Ordering::Relaxed)
        ),
    );
}
