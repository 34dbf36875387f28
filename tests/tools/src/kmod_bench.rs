//! `kmod-bench`: move_pages(2) vs the vmtier module's CPU and DMA engines, GB/s over a
//! 64 MiB buffer per row, with memcpy bandwidth of the same run as the ceiling. Figures
//! are printed, never asserted; under TCG they are emulated (relative only).

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use vmtier_core::migrate::{Migrator, PageRef};
use vmtier_core::{ByteSize, NodeId, PageSize, ProcessId};
use vmtier_migrate::{CopyEngine, Kmod, KmodConfig, MovePages};

use crate::check::Checks;
use crate::kmod::{load_modules, sh};
use crate::mem::AnonBuf;

#[derive(clap::Args, Debug)]
pub struct KmodBenchArgs {
    /// Directory holding vmtier.ko and vmtier_test_dma.ko.
    #[arg(long, default_value = "target/kmod")]
    ko_dir: PathBuf,
    /// Bytes moved per row.
    #[arg(long, default_value = "64M")]
    size: ByteSize,
    /// JSON output file.
    #[arg(long)]
    out: Option<PathBuf>,
}

struct Row {
    engine: &'static str,
    page_size: &'static str,
    workers: u32,
    bytes: u64,
    gbps: f64,
}

fn memcpy_gbps(len: usize) -> f64 {
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src); // fault in
    let t = Instant::now();
    for _ in 0..3 {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
    }
    3.0 * len as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn emulated() -> bool {
    fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"))
}

fn one(c: &mut Checks, len: usize, huge: bool, m: &mut dyn Migrator) -> Option<f64> {
    let buf = match AnonBuf::new_on_node(len, huge, 1) {
        Ok(b) => b,
        Err(e) => {
            c.fatal("allocate buffer on node 1", e);
            return None;
        }
    };
    let size = if huge { PageSize::Huge } else { PageSize::Base };
    let pages: Vec<PageRef> = (0..len as u64 / size.bytes())
        .filter_map(|i| buf.addr().checked_add(i * size.bytes()))
        .map(|addr| PageRef { addr, size })
        .collect();
    let pid = ProcessId::new(i32::try_from(std::process::id()).unwrap_or(0));
    let t = Instant::now();
    let r = m.migrate(pid, &pages, NodeId::new(0));
    let secs = t.elapsed().as_secs_f64();
    match r {
        Ok(_) => {
            let ok = buf.corrupted_words() == 0;
            c.check(ok, &format!("{} data intact", m.name()), "");
            Some(len as f64 / secs / 1e9)
        }
        Err(e) => {
            c.check(false, m.name(), e);
            None
        }
    }
}

pub fn run(c: &mut Checks, a: &KmodBenchArgs) {
    let Ok(len) = usize::try_from(a.size.0) else {
        return c.fatal("size", "too large");
    };
    if !load_modules(c, &a.ko_dir, 2) {
        return;
    }
    let memcpy = memcpy_gbps(len);
    let mut rows = Vec::new();
    let mut push = |engine, page_size, workers, gbps: Option<f64>| {
        if let Some(gbps) = gbps {
            rows.push(Row {
                engine,
                page_size,
                workers,
                bytes: len as u64,
                gbps,
            });
        }
    };
    for huge in [false, true] {
        let ps = if huge { "2M" } else { "4K" };
        let mut mp = MovePages::new(512, false);
        push("move_pages", ps, 1, one(c, len, huge, &mut mp));
    }
    for (engine, name) in [(CopyEngine::Cpu, "kmod-cpu"), (CopyEngine::Dma, "kmod-dma")] {
        for workers in [1u32, 2] {
            let cfg = KmodConfig {
                engine,
                workers,
                batch: 4096,
            };
            match Kmod::open(cfg) {
                Ok(mut k) => push(name, "4K", workers, one(c, len, false, &mut k)),
                Err(e) => c.fatal("open /dev/vmtier", e),
            }
        }
    }
    let emu = emulated();
    println!("engine      page_size workers   bytes      GB/s  memcpy GB/s  emulated");
    for r in &rows {
        println!(
            "{:<11} {:<9} {:>7} {:>9} {:>8.3} {:>12.3}  {emu}",
            r.engine,
            r.page_size,
            r.workers,
            ByteSize(r.bytes).to_string(),
            r.gbps,
            memcpy
        );
    }
    let json = format!(
        "[\n{}\n]\n",
        rows.iter()
            .map(|r| format!(
                "  {{\"engine\": \"{}\", \"page_size\": \"{}\", \"workers\": {}, \"bytes\": {}, \
                 \"gbps\": {:.4}, \"memcpy_gbps\": {:.4}, \"emulated\": {emu}}}",
                r.engine, r.page_size, r.workers, r.bytes, r.gbps, memcpy
            ))
            .collect::<Vec<_>>()
            .join(",\n")
    );
    println!("json {} rows", rows.len());
    if let Some(out) = &a.out {
        if let Some(dir) = out.parent() {
            let _ = fs::create_dir_all(dir);
        }
        c.check(
            fs::write(out, &json).is_ok(),
            "write the JSON",
            out.display(),
        );
    }
    let _ = sh("rmmod vmtier_test_dma; rmmod vmtier");
}
