//! `kmod-bench`: page-migration throughput, node 1 -> node 0, of `move_pages(2)` and the
//! vmtier module's engines, with a memcpy of the same size between the same nodes as the
//! ceiling.
//!
//! Every row is the median of `--runs` runs, each on a fresh buffer filled on node 1
//! (so every run is equally cold); the rows take turns run by run, so that the host's
//! load changes touch all rows alike. After each run the buffer's residency is queried: a
//! run whose pages are not all on node 0 fails the row, and the data is verified. Rows
//! report what the module says it did (engine, threads or channels, DMA fallbacks,
//! moved/skipped). Figures are printed and written as JSON, never asserted; they are
//! labelled emulated when the testbed runs under TCG (`VMTIER_ACCEL`).

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::{json, Value};
use vmtier_core::migrate::{Migrator, PageRef};
use vmtier_core::{ByteSize, NodeId, PageSize, ProcessId};
use vmtier_migrate::kmod::KmodReport;
use vmtier_migrate::{CopyEngine, Kmod, KmodConfig, MovePages, Residency};

use crate::check::Checks;
use crate::kmod::{load_modules, sh};
use crate::mem::AnonBuf;

#[derive(clap::Args, Debug)]
pub struct KmodBenchArgs {
    /// Directory holding vmtier.ko and vmtier_test_dma.ko.
    #[arg(long, default_value = "target/kmod")]
    ko_dir: PathBuf,
    /// Bytes moved per run.
    #[arg(long, default_value = "64M")]
    size: ByteSize,
    /// Runs per row (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// JSON output file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One timed run.
#[derive(Clone, Debug, Default)]
struct Run {
    secs: f64,
    /// Every page on node 0 afterwards, data intact.
    resident: bool,
    moved: u64,
    skipped: u64,
    module: Option<KmodReport>,
}

struct Row {
    path: String,
    page_size: &'static str,
    workers: u32,
    batch: u32,
    runs: Vec<Run>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn median_u64(v: impl Iterator<Item = u64>) -> u64 {
    let mut v: Vec<u64> = v.collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

impl Row {
    fn ok(&self) -> bool {
        !self.runs.is_empty() && self.runs.iter().all(|r| r.resident)
    }

    fn gbps(&self, len: usize) -> f64 {
        median(
            self.runs
                .iter()
                .map(|r| len as f64 / r.secs / 1e9)
                .collect(),
        )
    }

    fn module<T>(&self, f: impl Fn(&KmodReport) -> T) -> Option<T> {
        self.runs.last()?.module.as_ref().map(f)
    }

    fn engine(&self) -> String {
        self.module(|m| m.engine_used.map_or("-", CopyEngine::name).to_owned())
            .unwrap_or_else(|| "-".into())
    }

    fn workers_used(&self) -> u64 {
        median_u64(
            self.runs
                .iter()
                .map(|r| r.module.as_ref().map_or(1, |m| m.workers_used)),
        )
    }

    fn dma_fallbacks(&self) -> u64 {
        self.runs
            .iter()
            .filter_map(|r| r.module.as_ref())
            .map(|m| m.dma_fallbacks)
            .sum()
    }

    fn median_ms(&self, f: impl Fn(&KmodReport) -> std::time::Duration) -> Option<f64> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| r.module.as_ref())
            .map(|m| f(m).as_secs_f64() * 1e3)
            .collect();
        (!v.is_empty()).then(|| median(v))
    }
}

fn me() -> ProcessId {
    ProcessId::new(0)
}

/// One run of `m` over a fresh node-1 buffer.
fn one(c: &mut Checks, len: usize, huge: bool, m: &mut dyn Migrator) -> Option<Run> {
    let buf = match AnonBuf::new_on_node(len, huge, 1) {
        Ok(b) => b,
        Err(e) => {
            c.fatal("allocate buffer on node 1", e);
            return None;
        }
    };
    let thp0 = buf.anon_huge_bytes();
    let size = if huge { PageSize::Huge } else { PageSize::Base };
    let pages: Vec<PageRef> = (0..len as u64 / size.bytes())
        .filter_map(|i| buf.addr().checked_add(i * size.bytes()))
        .map(|addr| PageRef { addr, size })
        .collect();
    let t = Instant::now();
    let r = m.migrate(me(), &pages, NodeId::new(0));
    let secs = t.elapsed().as_secs_f64();
    if let Err(e) = r {
        c.check(false, m.name(), e);
        return None;
    }
    Some(finish(&buf, len, secs, huge, thp0))
}

/// Residency and data after a run; for THP rows also that the THPs stayed whole.
fn finish(buf: &AnonBuf, len: usize, secs: f64, huge: bool, thp0: u64) -> Run {
    let on0 = Residency::of_range(me(), buf.addr(), len as u64)
        .map(|r| r.on(NodeId::new(0)))
        .unwrap_or(0);
    let whole = !huge || buf.anon_huge_bytes() == thp0;
    Run {
        secs,
        resident: on0 == len as u64 && whole && buf.corrupted_words() == 0,
        moved: on0 / 4096,
        skipped: (len as u64 - on0) / 4096,
        module: None,
    }
}

/// One run of the module over a fresh node-1 buffer, with its own report kept.
fn one_kmod(c: &mut Checks, len: usize, k: &mut Kmod) -> Option<Run> {
    let buf = match AnonBuf::new_on_node(len, false, 1) {
        Ok(b) => b,
        Err(e) => {
            c.fatal("allocate buffer on node 1", e);
            return None;
        }
    };
    let t = Instant::now();
    let r = k.migrate_ranges(me(), &[(buf.addr(), len as u64)], NodeId::new(0));
    let secs = t.elapsed().as_secs_f64();
    match r {
        Ok(rep) => {
            let mut run = finish(&buf, len, secs, false, 0);
            run.moved = rep.sum(|x| x.moved);
            run.skipped = rep.sum(|x| x.accounted()) - run.moved;
            run.module = Some(rep);
            Some(run)
        }
        Err(e) => {
            c.check(false, "kmod", vmtier_core::error_chain(&e));
            None
        }
    }
}

/// memcpy from a filled node-1 buffer into a node-0 buffer of the same size whose pages
/// exist already (as the module's destination pages do), each run on fresh buffers.
fn memcpy_run(c: &mut Checks, len: usize) -> Option<Run> {
    let (src, mut dst) = match (
        AnonBuf::new_on_node(len, false, 1),
        AnonBuf::new_on_node(len, false, 0),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            c.fatal("allocate memcpy buffers", e);
            return None;
        }
    };
    let t = Instant::now();
    dst.words_mut().copy_from_slice(src.words());
    std::hint::black_box(dst.words());
    let secs = t.elapsed().as_secs_f64();
    Some(Run {
        secs,
        resident: dst.corrupted_words() == 0,
        moved: len as u64 / 4096,
        ..Default::default()
    })
}

fn accel() -> (String, Value) {
    match std::env::var("VMTIER_ACCEL") {
        Ok(a) if a == "tcg" => (a, json!(true)),
        Ok(a) => (a, json!(false)),
        Err(_) => ("host".into(), Value::Null),
    }
}

/// The CPU model the testbed gave the guest (`tests/testbed/run --cpu`), "host" outside it.
fn cpu_model() -> String {
    std::env::var("VMTIER_CPU_MODEL").unwrap_or_else(|_| "host".into())
}

pub fn run(c: &mut Checks, a: &KmodBenchArgs) {
    let Ok(len) = usize::try_from(a.size.0) else {
        return c.fatal("size", "too large");
    };
    if !load_modules(c, &a.ko_dir, 2) {
        return;
    }
    let caps = match Kmod::open(KmodConfig::default()).and_then(|k| k.query()) {
        Ok(q) => q,
        Err(e) => return c.fatal("QUERY", vmtier_core::error_chain(&e)),
    };
    let dma_label = match caps.dma_drivers.first().map(String::as_str) {
        Some("vmtier_test_dma") => "kmod-dma (software test provider)".to_owned(),
        Some(d) => format!("kmod-dma ({d})"),
        None => "kmod-dma".to_owned(),
    };
    let runs = a.runs.max(1);
    type RunFn = Box<dyn FnMut(&mut Checks) -> Option<Run>>;
    let mut rows: Vec<Row> = Vec::new();
    let mut fns: Vec<RunFn> = Vec::new();
    let mut add = |path: String, page_size: &'static str, workers: u32, batch: u32, f: RunFn| {
        rows.push(Row {
            path,
            page_size,
            workers,
            batch,
            runs: Vec::new(),
        });
        fns.push(f);
    };
    add(
        "memcpy node1->node0".into(),
        "-",
        1,
        0,
        Box::new(move |c| memcpy_run(c, len)),
    );
    add(
        "move_pages(2)".into(),
        "4K",
        1,
        512,
        Box::new(move |c| one(c, len, false, &mut MovePages::new(512, false))),
    );
    // 6.12's migrate_vma splits PMD-mapped THPs (no MIGRATE_VMA_SELECT_COMPOUND):
    // move_pages(2) is the path that keeps them whole.
    add(
        "move_pages(2) THP".into(),
        "2M",
        1,
        512,
        Box::new(move |c| one(c, len, true, &mut MovePages::new(512, false))),
    );
    let kmod_row = |engine, workers, batch| -> Option<RunFn> {
        let mut k = Kmod::open(KmodConfig {
            engine,
            workers,
            batch,
        })
        .ok()?;
        Some(Box::new(move |c| one_kmod(c, len, &mut k)))
    };
    let mut specs: Vec<(String, CopyEngine, u32, u32)> = Vec::new();
    for workers in [1u32, 2, 4] {
        specs.push(("kmod-cpu".into(), CopyEngine::Cpu, workers, 4096));
    }
    for batch in [512u32, 4096, 65536] {
        specs.push(("kmod-cpu".into(), CopyEngine::Cpu, 0, batch));
    }
    if caps.engines.contains(&CopyEngine::Dma) {
        specs.push((dma_label, CopyEngine::Dma, 2, 4096));
    }
    for (path, engine, workers, batch) in specs {
        let Some(f) = kmod_row(engine, workers, batch) else {
            return c.fatal("open /dev/vmtier", "failed");
        };
        add(path, "4K", workers, batch, f);
    }
    // One untimed run per row warms the code paths, the slab and the per-CPU lists;
    // then the rows take turns, so that a change in the host's load touches all alike.
    for f in &mut fns {
        let _ = f(c);
    }
    for _ in 0..runs {
        for (r, f) in rows.iter_mut().zip(fns.iter_mut()) {
            if let Some(run) = f(c) {
                r.runs.push(run);
            }
        }
    }
    let (accel, emulated) = accel();
    let cpu = cpu_model();
    let memcpy = rows.first().map_or(0.0, |r| r.gbps(len));
    let mp4k = rows.get(1).map_or(0.0, |r| r.gbps(len));
    println!(
        "kmod-bench: {} per run, median of {runs} runs, node 1 -> node 0, accel {accel}, cpu {cpu}{}",
        ByteSize(len as u64),
        if accel == "tcg" {
            " (emulated: ratios only)"
        } else {
            ""
        }
    );
    println!(
        "{:<34} {:<4} {:>7} {:>6} {:>7} {:>13} {:>8} {:>6} {:>8} {:>8} {:>9} {:>8}  residency",
        "path",
        "page",
        "workers",
        "batch",
        "GB/s",
        "min-max",
        "vs mp4K",
        "engine",
        "used",
        "dma fb",
        "moved",
        "skipped"
    );
    let mut json_rows = Vec::new();
    for r in &rows {
        let g = r.gbps(len);
        let ok = r.ok();
        let moved = median_u64(r.runs.iter().map(|x| x.moved));
        let skipped = median_u64(r.runs.iter().map(|x| x.skipped));
        let each: Vec<f64> = r.runs.iter().map(|x| len as f64 / x.secs / 1e9).collect();
        let (lo, hi) = each
            .iter()
            .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        println!(
            "{:<34} {:<4} {:>7} {:>6} {:>7.3} {:>13} {:>7.2}x {:>6} {:>8} {:>8} {:>9} {:>8}  {}",
            r.path,
            r.page_size,
            if r.path.starts_with("kmod") && r.workers == 0 {
                "default".to_owned()
            } else {
                r.workers.to_string()
            },
            r.batch,
            g,
            format!("{lo:.3}-{hi:.3}"),
            if mp4k > 0.0 { g / mp4k } else { 0.0 },
            r.engine(),
            r.workers_used(),
            r.dma_fallbacks(),
            moved,
            skipped,
            if ok { "all on node 0" } else { "FAILED" }
        );
        json_rows.push(json!({
            "path": r.path,
            "page_size": r.page_size,
            "workers": r.workers,
            "batch": r.batch,
            "runs": r.runs.len(),
            "gbps_median": g,
            "gbps_runs": r.runs.iter().map(|x| len as f64 / x.secs / 1e9).collect::<Vec<_>>(),
            "vs_move_pages_4k": if mp4k > 0.0 { g / mp4k } else { 0.0 },
            "memcpy_gbps": memcpy,
            "engine_used": r.engine(),
            "workers_used": r.workers_used(),
            "dma_fallbacks": r.dma_fallbacks(),
            "moved_median": moved,
            "skipped_median": skipped,
            "unmap_ms_median": r.median_ms(|m| m.unmap_time),
            "copy_ms_median": r.median_ms(|m| m.copy_time),
            "remap_ms_median": r.median_ms(|m| m.remap_time),
            "resident": ok,
            "bytes": len,
            "accel": accel,
            "emulated": emulated,
            "cpu_model": cpu,
        }));
    }
    let best = rows
        .iter()
        .filter(|r| r.path == "kmod-cpu" && r.ok())
        .map(|r| (r.gbps(len), r.workers, r.batch))
        .fold((0.0, 0, 0), |a, b| if b.0 > a.0 { b } else { a });
    // What vmtierd asks for: the module's default threads (workers 0) and batch, as the
    // module reports it.
    let shipped = rows
        .iter()
        .find(|r| {
            r.path == "kmod-cpu"
                && r.workers == 0
                && u64::from(r.batch) == caps.default_batch
                && r.ok()
        })
        .map_or(0.0, |r| r.gbps(len));
    let vs = |g: f64| if mp4k > 0.0 { g / mp4k } else { 0.0 };
    println!(
        "kmod-bench: cpu {cpu}: module 4K best {:.3} GB/s (workers {}, batch {}) = {:.2}x move_pages(2) \
         4K {:.3} GB/s; as vmtierd runs it (default workers, batch {}) {:.3} GB/s = {:.2}x; \
         memcpy {:.3} GB/s; 2M goes through move_pages(2): migrate_vma on \
         6.12 has no MIGRATE_VMA_SELECT_COMPOUND and splits THPs",
        best.0,
        best.1,
        best.2,
        vs(best.0),
        mp4k,
        caps.default_batch,
        shipped,
        vs(shipped),
        memcpy
    );
    let doc = json!({
        "bytes": len,
        "runs": runs,
        "accel": accel,
        "emulated": emulated,
        "cpu_model": cpu,
        "host_cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "module": {
            "abi": caps.abi_version,
            "default_workers": caps.default_workers,
            "housekeeping_cpus": caps.housekeeping_cpus,
            "dma_channels": caps.dma_channels,
            "dma_drivers": caps.dma_drivers,
        },
        "rows": json_rows,
        "module_4k_best_vs_move_pages_4k": vs(best.0),
        "module_4k_default_vs_move_pages_4k": vs(shipped),
    });
    println!("json {} rows", rows.len());
    for r in &rows {
        c.check(
            r.ok(),
            &format!(
                "{} {} x{} batch {}: every run's pages on node 0, data intact",
                r.path, r.page_size, r.workers, r.batch
            ),
            format!("{} runs", r.runs.len()),
        );
    }
    if let Some(out) = &a.out {
        if let Some(dir) = out.parent() {
            let _ = fs::create_dir_all(dir);
        }
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        c.check(
            fs::write(out, text + "\n").is_ok(),
            "write the JSON",
            out.display(),
        );
    }
    let _ = sh("rmmod vmtier; rmmod vmtier_test_dma");
}
