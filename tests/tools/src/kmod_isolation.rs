//! Copy threads stay off isolated CPUs. Runs in a testbed booted with an isolated CPU
//! (`--cpus 3 --append 'isolcpus=2 nohz_full=2'`): the module reports two housekeeping
//! CPUs, no kernel thread of the module is bound to CPU 2, and every copy work item that
//! the kernel's `workqueue_execute_start` trace event shows ran on CPU 0 or 1, also when
//! the caller itself runs on the isolated CPU.

use std::fs;

use vmtier_core::NodeId;
use vmtier_migrate::{CopyEngine, Kmod, KmodConfig};

use crate::check::Checks;
use crate::kmod::describe;
use crate::mem::AnonBuf;
use crate::tracing::Instance;

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: a cpu_set_t on the stack, filled with the libc helpers, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Kernel threads whose name starts with `vmtier`.
fn module_kthreads() -> Vec<String> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(comm) = fs::read_to_string(e.path().join("comm")) {
            if comm.starts_with("vmtier") {
                v.push(comm.trim().to_owned());
            }
        }
    }
    v
}

pub fn run(c: &mut Checks) {
    let isolated: Vec<usize> = fs::read_to_string("/sys/devices/system/cpu/isolated")
        .unwrap_or_default()
        .trim()
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    if !c.check(
        isolated == [2],
        "the testbed isolates CPU 2",
        format!("isolated: {isolated:?}"),
    ) {
        return;
    }
    let k = match Kmod::open(KmodConfig::default()) {
        Ok(k) => k,
        Err(e) => return c.fatal("open /dev/vmtier", e),
    };
    match k.query() {
        Ok(q) => {
            c.check(
                q.housekeeping_cpus == 2 && q.max_workers == 2 && q.default_workers == 2,
                "QUERY: 2 housekeeping CPUs, at most and by default 2 threads",
                format!(
                    "housekeeping {} max {} default {}",
                    q.housekeeping_cpus, q.max_workers, q.default_workers
                ),
            );
        }
        Err(e) => c.fatal("QUERY", e),
    }
    let kt = module_kthreads();
    c.check(
        kt.is_empty(),
        "no kernel thread of the module exists (none bound to an isolated CPU)",
        format!("{kt:?}"),
    );
    let inst = Instance::new(
        "isolation",
        &["workqueue/workqueue_execute_start"],
        1024,
        None,
    )
    .and_then(|i| i.on().map(|()| i));
    let traced = inst.is_ok();
    let buf = match AnonBuf::new_on_node(16 << 20, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate buffer", e),
    };
    let mut ok = true;
    let mut details = Vec::new();
    for (caller_cpu, to) in [(2usize, 0u32), (0, 1), (2, 0)] {
        ok &= pin_to(caller_cpu);
        let cfg = KmodConfig {
            engine: CopyEngine::Cpu,
            workers: 3,
            batch: 4096,
        };
        let r = Kmod::open(cfg)
            .map_err(|e| e.to_string())
            .and_then(|mut k| {
                k.migrate_ranges(
                    vmtier_core::ProcessId::new(0),
                    &[(buf.addr(), buf.len() as u64)],
                    NodeId::new(to),
                )
                .map_err(|e| e.to_string())
            });
        ok &= r.as_ref().is_ok_and(|r| r.workers_used == 2);
        details.push(format!(
            "caller on CPU {caller_cpu}: {}",
            r.map_or_else(|e| e, |r| describe(&r))
        ));
    }
    if let Ok(i) = &inst {
        let _ = i.off();
    }
    pin_to(0);
    c.check(
        ok && buf.corrupted_words() == 0,
        "3 threads asked: 2 used (the housekeeping CPUs), data intact",
        details.join("; "),
    );
    let trace = inst
        .as_ref()
        .ok()
        .and_then(|i| i.text().ok())
        .unwrap_or_default();
    drop(inst);
    let cpus: Vec<usize> = trace
        .lines()
        // Lanes (whole batches, CPU engine) and copy shares (a DMA batch's CPU fallback).
        .filter(|l| l.contains("vt_lane_fn") || l.contains("vt_chunk_fn"))
        .filter_map(|l| {
            let s = l.split_once('[')?.1;
            s.split_once(']')?.0.trim().parse().ok()
        })
        .collect();
    c.check(
        traced && !cpus.is_empty() && cpus.iter().all(|&c| c != 2),
        "every copy work item ran on a housekeeping CPU",
        format!(
            "{} work items, on CPUs {:?}",
            cpus.len(),
            cpus.iter().collect::<std::collections::BTreeSet<_>>()
        ),
    );
}
