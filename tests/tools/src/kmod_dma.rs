//! The module's DMA engine under every fault mode of the test-only provider, and its
//! channel lifetime.
//!
//! Each mode moves a node-1 buffer with `engine = dma` while a writer thread keeps
//! writing, then rewrites every word of the buffer and waits until the provider has run
//! every descriptor it still had, late ones included: a descriptor that completes into a
//! page the process can see shows up as changed words. The counts must add up, pages
//! left in place must still be on node 1, and what the module kept for a late descriptor
//! must be released once the engine finishes.

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use vmtier_core::{NodeId, ProcessId};
use vmtier_migrate::kmod::KmodReport;
use vmtier_migrate::{CopyEngine, Kmod, KmodConfig, Residency};

use crate::check::Checks;
use crate::kmod::{describe, kstat, sh, Writer};
use crate::kmod_errors::set;
use crate::mem::{pattern, AnonBuf};

/// A value of the test provider's parameters (its knobs and counters).
fn provider(name: &str) -> i64 {
    fs::read_to_string(format!("/sys/module/vmtier_test_dma/parameters/{name}"))
        .ok()
        .and_then(|s| match s.trim() {
            "Y" => Some(1),
            "N" => Some(0),
            v => v.parse().ok(),
        })
        .unwrap_or(-1)
}

/// The words of `buf` that differ from `f(i)`.
fn changed(buf: &AnonBuf, f: impl Fn(usize) -> u64) -> usize {
    buf.words()
        .iter()
        .enumerate()
        .filter(|&(i, &w)| w != f(i))
        .count()
}

/// The value every word holds after the rewrite.
fn second(i: usize) -> u64 {
    !pattern(i)
}

/// Waits until the provider has nothing left to run and the module holds nothing for a
/// late descriptor: the completion counter stays still and nothing is abandoned.
fn quiesce(max: Duration) -> bool {
    let t = Instant::now();
    let mut last = provider("completed");
    let mut still = 0;
    while t.elapsed() < max {
        thread::sleep(Duration::from_millis(100));
        let now = provider("completed");
        if now == last && kstat("dma_abandoned_live") == 0 {
            still += 1;
            if still >= 5 {
                return true;
            }
        } else {
            still = 0;
        }
        last = now;
    }
    false
}

struct Mode {
    name: &'static str,
    knobs: &'static [(&'static str, &'static str)],
    timeout_ms: &'static str,
    /// Pages may be given up (left on node 1) because DMA could not be stopped.
    may_abandon: bool,
    /// Some pages must have been copied by the CPU after a DMA error or timeout.
    fallbacks: bool,
    /// The provider must have refused a terminate.
    refused: bool,
    /// Clear `stuck` after the call (the hung engine comes back).
    unstick: bool,
}

const MODES: [Mode; 6] = [
    Mode {
        name: "error completion (every 7th descriptor scribbles and fails)",
        knobs: &[("fail_every", "7")],
        timeout_ms: "2000",
        may_abandon: false,
        fallbacks: true,
        refused: false,
        unstick: false,
    },
    Mode {
        name: "timeout, terminate stops the stalled descriptors",
        knobs: &[("stall_every", "700"), ("stall_ms", "3000")],
        timeout_ms: "300",
        may_abandon: false,
        fallbacks: true,
        refused: false,
        unstick: false,
    },
    Mode {
        name: "no terminate, late completion inside the grace period",
        // A stall starts at most a few hundred ms into a batch: it ends well inside
        // the timeout plus the grace period (2 x 1000 ms).
        knobs: &[
            ("terminate", "0"),
            ("stall_every", "1500"),
            ("stall_ms", "1100"),
        ],
        timeout_ms: "1000",
        may_abandon: false,
        fallbacks: false,
        refused: true,
        unstick: false,
    },
    Mode {
        name: "no terminate, late completion after the call",
        knobs: &[
            ("terminate", "0"),
            ("stall_every", "300"),
            ("stall_ms", "1500"),
        ],
        timeout_ms: "200",
        may_abandon: true,
        fallbacks: false,
        refused: true,
        unstick: false,
    },
    Mode {
        name: "stuck channel, terminate works",
        knobs: &[("stuck", "1")],
        timeout_ms: "200",
        may_abandon: false,
        fallbacks: true,
        refused: false,
        unstick: false,
    },
    Mode {
        name: "stuck channel, no terminate (a hung engine)",
        knobs: &[("terminate", "0"), ("stuck", "1")],
        timeout_ms: "200",
        may_abandon: true,
        fallbacks: false,
        refused: true,
        unstick: true,
    },
];

const RESET: [(&str, &str); 5] = [
    ("fail_every", "0"),
    ("stall_every", "0"),
    ("terminate", "1"),
    ("stuck", "0"),
    ("stall_ms", "5000"),
];

/// Runs every fault mode on a `len`-byte buffer.
pub fn fault_modes(c: &mut Checks, len: usize) {
    for m in &MODES {
        one_mode(c, len, m);
        for (k, v) in RESET {
            set("vmtier_test_dma", k, v);
        }
        set("vmtier", "dma_timeout_ms", "2000");
        // A retired channel comes back once its last descriptor is done.
        quiesce(Duration::from_secs(10));
    }
}

fn one_mode(c: &mut Checks, len: usize, m: &Mode) {
    let name = format!("DMA {}", m.name);
    let mut buf = match AnonBuf::new_on_node(len, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate buffer on node 1", e),
    };
    let cfg = KmodConfig {
        engine: CopyEngine::Dma,
        workers: 2,
        batch: 1024,
    };
    let mut k = match Kmod::open(cfg) {
        Ok(k) => k,
        Err(e) => return c.fatal("open /dev/vmtier", e),
    };
    let (refused0, failed0, stalled0) = (
        provider("refused_terminates"),
        provider("failed"),
        provider("stalled_completions"),
    );
    let abandoned0 = kstat("dma_abandoned_pages");
    set("vmtier", "dma_timeout_ms", m.timeout_ms);
    for (kname, v) in m.knobs {
        set("vmtier_test_dma", kname, v);
    }
    let pages = len / 4096;
    let writer_pages = pages / 4;
    let writer = Writer::start(&buf, writer_pages);
    thread::sleep(Duration::from_millis(20));
    let r = k.migrate_ranges(
        ProcessId::new(0),
        &[(buf.addr(), len as u64)],
        NodeId::new(0),
    );
    let (gens, lost) = writer.finish();
    // Rewrite every word: a descriptor still running afterwards cannot know it.
    buf.words_mut()
        .iter_mut()
        .enumerate()
        .for_each(|(i, w)| *w = second(i));
    let rmmod_while_live = m.unstick && kstat("dma_abandoned_live") > 0;
    let rmmod_refused = rmmod_while_live && !sh("rmmod vmtier").0;
    if m.unstick {
        set("vmtier_test_dma", "stuck", "0");
    }
    let drained = quiesce(Duration::from_secs(15));
    let after = changed(&buf, second);
    let r: KmodReport = match r {
        Ok(r) => r,
        Err(e) => return c.fatal(&name, vmtier_core::error_chain(&e)),
    };
    let (moved, busy) = (r.sum(|x| x.moved), r.sum(|x| x.skipped_busy));
    c.check(
        moved + busy == pages as u64
            && r.sum(|x| x.failed) == 0
            && moved > 0
            && (m.may_abandon || r.dma_abandoned == 0)
            && r.dma_abandoned <= busy
            && (!m.fallbacks || r.dma_fallbacks > 0)
            // Once every channel is retired the rest goes to the CPU.
            && (m.may_abandon || r.engine_used == Some(CopyEngine::Dma)),
        &format!("{name}: every page moved or left in place"),
        describe(&r),
    );
    c.check(
        lost == 0 && gens > 0 && after == 0,
        &format!("{name}: 0 changed words, late descriptors included"),
        format!(
            "{lost} lost writes of {gens} writer passes; {after} words changed after the \
             rewrite; provider: {} descriptors failed, {} stalled ones completed, {} \
             terminates refused",
            provider("failed") - failed0,
            provider("stalled_completions") - stalled0,
            provider("refused_terminates") - refused0
        ),
    );
    let fault_seen = if m.refused {
        provider("refused_terminates") > refused0
    } else if m.knobs.iter().any(|k| k.0 == "fail_every") {
        provider("failed") > failed0
    } else {
        kstat("dma_timeouts") > 0
    };
    c.check(
        fault_seen,
        &format!("{name}: the fault happened"),
        format!(
            "terminates refused +{}, failed +{}, dma_timeouts {}",
            provider("refused_terminates") - refused0,
            provider("failed") - failed0,
            kstat("dma_timeouts")
        ),
    );
    if m.may_abandon {
        let abandoned = kstat("dma_abandoned_pages") - abandoned0;
        c.check(
            abandoned > 0 && u64::try_from(abandoned).ok() == Some(r.dma_abandoned),
            &format!("{name}: pages whose DMA could not be stopped were given up"),
            format!("{abandoned} given up (report {})", r.dma_abandoned),
        );
        // The pages left in place are still on node 1.
        let on1 = Residency::of_range(ProcessId::new(0), buf.addr(), len as u64)
            .map(|res| res.on(NodeId::new(1)) / 4096)
            .unwrap_or(0);
        c.check(
            on1 >= r.dma_abandoned,
            &format!("{name}: given-up pages stayed on node 1"),
            format!("{on1} pages on node 1"),
        );
    }
    if m.unstick {
        c.check(
            rmmod_while_live && rmmod_refused,
            &format!("{name}: rmmod vmtier refused while a descriptor may still run"),
            format!("abandoned live at rmmod: {rmmod_while_live}, refused: {rmmod_refused}"),
        );
    }
    c.check(
        drained
            && kstat("dma_abandoned_live") == 0
            && kstat("dma_chans_retired") == 0
            && kstat("dst_allocated")
                == kstat("dst_freed_unplaced") + kstat("pages_moved") + kstat("dst_placed_failed"),
        &format!("{name}: everything kept for late descriptors released"),
        format!(
            "abandoned live {}, retired channels {}, dst allocated {} = freed {} + moved {} \
             + placed-failed {}",
            kstat("dma_abandoned_live"),
            kstat("dma_chans_retired"),
            kstat("dst_allocated"),
            kstat("dst_freed_unplaced"),
            kstat("pages_moved"),
            kstat("dst_placed_failed")
        ),
    );
    // Once the engine has finished, the pages left behind move too.
    set("vmtier", "dma_timeout_ms", "2000");
    for (k2, v) in RESET {
        set("vmtier_test_dma", k2, v);
    }
    if busy > 0 {
        let again = k.migrate_ranges(
            ProcessId::new(0),
            &[(buf.addr(), len as u64)],
            NodeId::new(0),
        );
        let on0 = Residency::of_range(ProcessId::new(0), buf.addr(), len as u64)
            .map(|res| res.on(NodeId::new(0)))
            .unwrap_or(0);
        c.check(
            again.is_ok() && on0 == len as u64 && changed(&buf, second) == 0,
            &format!("{name}: a second call moves the rest intact"),
            format!(
                "{} bytes on node 0; {}",
                on0,
                again.map_or_else(|e| e.to_string(), |r| describe(&r))
            ),
        );
    }
}

/// Channels are kept across calls, released after `dma_idle_ms` unused (so that the
/// provider can unload), and requested again on the next use.
pub fn channel_lifetime(c: &mut Checks, ko_dir: &std::path::Path) {
    let buf = match AnonBuf::new_on_node(4 << 20, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate buffer", e),
    };
    let cfg = KmodConfig {
        engine: CopyEngine::Dma,
        workers: 2,
        batch: 256,
    };
    let mut k = match Kmod::open(cfg) {
        Ok(k) => k,
        Err(e) => return c.fatal("open /dev/vmtier", e),
    };
    set("vmtier", "dma_idle_ms", "60000");
    let _ = k.query();
    let req0 = kstat("dma_chan_requests");
    let mut ok = true;
    for to in [0u32, 1, 0, 1] {
        ok &= k
            .migrate_ranges(
                ProcessId::new(0),
                &[(buf.addr(), buf.len() as u64)],
                NodeId::new(to),
            )
            .is_ok_and(|r| r.engine_used == Some(CopyEngine::Dma));
        ok &= k.query().is_ok();
    }
    let requests = kstat("dma_chan_requests") - req0;
    c.check(
        ok && requests == 0 && kstat("dma_chans_held") == 2,
        "DMA channels kept across calls and queries (no request per call)",
        format!(
            "{requests} channel requests over 4 migrations and 4 queries, {} held",
            kstat("dma_chans_held")
        ),
    );
    let (busy_ok, _) = sh("rmmod vmtier_test_dma");
    c.check(
        !busy_ok,
        "the provider cannot unload while vmtier holds its channels",
        "rmmod vmtier_test_dma refused",
    );
    set("vmtier", "dma_idle_ms", "200");
    // Re-arm the idle timer with the short delay.
    let _ = k.query();
    thread::sleep(Duration::from_millis(1200));
    let held = kstat("dma_chans_held");
    let (ok1, out1) = sh("rmmod vmtier_test_dma");
    c.check(
        held == 0 && ok1,
        "DMA channels released when idle: the provider unloads",
        format!("{held} held after 1.2 s idle; {out1}"),
    );
    // Without a provider the DMA engine is refused, auto falls back to the CPU.
    let r = k.migrate_ranges(
        ProcessId::new(0),
        &[(buf.addr(), buf.len() as u64)],
        NodeId::new(0),
    );
    c.check(
        matches!(&r, Err(e) if e.errno() == Some(libc::ENODEV)),
        "engine dma without a provider: ENODEV",
        format!("{:?}", r.map(|r| describe(&r))),
    );
    let (ok2, out2) = sh(&format!(
        "insmod {}/vmtier_test_dma.ko chans=2",
        ko_dir.display()
    ));
    let r = k.migrate_ranges(
        ProcessId::new(0),
        &[(buf.addr(), buf.len() as u64)],
        NodeId::new(0),
    );
    c.check(
        ok2 && r
            .as_ref()
            .is_ok_and(|r| r.engine_used == Some(CopyEngine::Dma)),
        "a provider loaded later is found on the next call",
        format!("{out2} {:?}", r.map(|r| describe(&r))),
    );
    set("vmtier", "dma_idle_ms", "5000");
}
