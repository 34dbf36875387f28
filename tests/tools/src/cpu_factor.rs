//! Microbenchmarks for converting CPU time measured in the TCG testbed to native time
//! (`tbcheck cpu-bench --micro-only`, and inside every `cpu-bench` run).
//!
//! The same code is timed natively and inside the testbed, in one `make bench-cpu`; the
//! ratio is the emulation factor of that kind of work. vmtierd's tick is both:
//! - **CPU-bound**: the hotness store, the default policy and the enforcement, through the
//!   simulator's scale benchmark (`vmtier_sim::scale`, which calls vmtier's real store and
//!   policy code on a synthetic guest): four parts, each its own factor;
//! - **syscalls**: a `move_pages(2)` query of a touched buffer (what the placement refresh
//!   does) and small sysfs reads (open, read, close: what the DAMON source does per region
//!   file);
//! - **copying**: a 64 MiB memory copy, what `move_pages` does per page moved (used only to
//!   convert the moving cost, not the steady one).
//!
//! Each figure is the fastest of [`REPS`] repetitions: the one least disturbed by other load
//! on the machine, natively and in the testbed alike.
//!
//! Beside the factors, [`huge_map`] times the huge-page map read vmtierd does for the granules
//! it may promote or split, each at most once per placement refresh: a figure of its own, per
//! GiB of guest RAM, not a factor.

use std::time::Instant;

use serde_json::{json, Value};
use vmtier_core::migrate::PageLocator;

/// Repetitions of each figure; the fastest is kept.
pub const REPS: usize = 5;
/// log2 of the scale run's guest size in 4 KiB pages (2^21 pages: 8 GiB).
const SCALE_PAGES_LOG2: u32 = 21;
/// Pages in the `move_pages` query buffer (64 MiB).
const QUERY_PAGES: usize = 16384;
/// Queries per repetition.
const QUERIES: usize = 4;
/// Small sysfs reads per repetition.
const SYSFS_READS: usize = 2000;
/// The sysfs file read: small, present on every kernel the project runs on, not DAMON's (a
/// host's DAMON may belong to someone else).
const SYSFS_FILE: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// Error of a microbenchmark.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Scale benchmark failed: {0}")]
    Scale(String),
    #[error("Cannot map the query buffer: {0}")]
    Map(std::io::Error),
    #[error("move_pages query failed: {0}")]
    Query(std::io::Error),
    #[error("Cannot read {SYSFS_FILE}: {0}")]
    Sysfs(std::io::Error),
    #[error("Missing figure {0}")]
    Missing(String),
    #[error("Huge-page map read failed: {0}")]
    HugeMap(vmtier_core::migrate::Error),
}

/// Bytes copied by the copy microbenchmark (64 MiB).
const COPY_BYTES: usize = 64 << 20;

/// What a microbenchmark stands for in vmtierd's tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The store, the policy, the enforcement.
    Cpu,
    /// System calls: page queries, sysfs reads.
    Syscalls,
    /// Copying memory (moving pages).
    Copy,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cpu => "CPU",
            Kind::Syscalls => "syscalls",
            Kind::Copy => "copy",
        }
    }
}

/// The microbenchmark names, in report order, and their kinds.
pub const NAMES: [(&str, Kind); 7] = [
    ("plan_4k_ms", Kind::Cpu),
    ("plan_2m_ms", Kind::Cpu),
    ("plan_hybrid_ms", Kind::Cpu),
    ("track_hybrid_ms", Kind::Cpu),
    ("move_pages_query_ms", Kind::Syscalls),
    ("sysfs_read_us", Kind::Syscalls),
    ("copy_64m_ms", Kind::Copy),
];

fn fastest(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::min)
}

/// Runs every microbenchmark: a JSON object of the [`NAMES`] (milliseconds, or microseconds
/// for one sysfs read).
pub fn run() -> Result<Value, Error> {
    let mut parts: [Vec<f64>; 7] = Default::default();
    for _ in 0..REPS {
        let s = vmtier_sim::scale::run(SCALE_PAGES_LOG2, 1000)
            .map_err(|e| Error::Scale(e.to_string()))?;
        parts[0].push(s.plan_ms_4k);
        parts[1].push(s.plan_ms_2m);
        parts[2].push(s.plan_ms_hybrid);
        parts[3].push(s.track_ms_hybrid);
    }
    parts[4] = query_ms()?;
    parts[5] = sysfs_us()?;
    parts[6] = copy_ms();
    let mut out = serde_json::Map::new();
    for ((name, _), v) in NAMES.iter().zip(parts) {
        out.insert((*name).to_owned(), json!(fastest(&v)));
    }
    if let Some(Value::Object(h)) = huge_map()? {
        out.extend(h);
    }
    Ok(Value::Object(out))
}

/// One `move_pages` query of [`QUERY_PAGES`] touched pages, ms, per repetition.
fn query_ms() -> Result<Vec<f64>, Error> {
    let len = QUERY_PAGES * 4096;
    let p = crate::mem::map_anon(len, Some(libc::MADV_NOHUGEPAGE)).map_err(Error::Map)?;
    let base = p.cast::<u8>();
    let mut pages: Vec<*mut libc::c_void> = Vec::with_capacity(QUERY_PAGES);
    for i in 0..QUERY_PAGES {
        // SAFETY: i < QUERY_PAGES, so the byte is inside the mapping, used by this thread only.
        let at = unsafe { base.add(i * 4096) };
        // SAFETY: as above.
        unsafe { at.write_volatile(1) };
        pages.push(at.cast());
    }
    let mut status = vec![0i32; QUERY_PAGES];
    let mut out = Vec::with_capacity(REPS);
    let mut result = Ok(());
    'reps: for _ in 0..REPS {
        let t = Instant::now();
        for _ in 0..QUERIES {
            // SAFETY: move_pages on this process with no target nodes only fills `status`,
            // which has one entry per page.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_move_pages,
                    0,
                    QUERY_PAGES as libc::c_ulong,
                    pages.as_ptr(),
                    std::ptr::null::<i32>(),
                    status.as_mut_ptr(),
                    0,
                )
            };
            if r < 0 {
                result = Err(Error::Query(std::io::Error::last_os_error()));
                break 'reps;
            }
        }
        #[allow(clippy::cast_precision_loss)]
        out.push(t.elapsed().as_secs_f64() * 1e3 / QUERIES as f64);
    }
    // SAFETY: unmaps exactly the mapping made above; `pages` is not used after this.
    unsafe { libc::munmap(p, len) };
    result.map(|()| out)
}

/// One open + read + close of a small sysfs file, µs, per repetition.
fn sysfs_us() -> Result<Vec<f64>, Error> {
    let mut out = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let t = Instant::now();
        for _ in 0..SYSFS_READS {
            std::fs::read(SYSFS_FILE).map_err(Error::Sysfs)?;
        }
        #[allow(clippy::cast_precision_loss)]
        out.push(t.elapsed().as_secs_f64() * 1e6 / SYSFS_READS as f64);
    }
    Ok(out)
}

/// One copy of [`COPY_BYTES`] between two touched buffers, ms, per repetition.
fn copy_ms() -> Vec<f64> {
    let src = vec![0x5au8; COPY_BYTES];
    let mut dst = vec![0u8; COPY_BYTES];
    let mut out = Vec::with_capacity(REPS);
    for i in 0..REPS {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst)[i] ^= 1;
        out.push(t.elapsed().as_secs_f64() * 1e3);
    }
    out
}

/// Bytes of each buffer of [`huge_map`] (256 MiB: room for it in the testbed too).
const HUGE_MAP_BYTES: usize = 256 << 20;

/// The huge-page map read as vmtierd does it (`MovePages::huge_runs`: `PAGEMAP_SCAN` for
/// `PAGE_IS_HUGE` on `/proc/PID/pagemap`), over a touched buffer of base pages and one
/// advised for THP: `huge_map_base_ms_per_gib`, `huge_map_thp_ms_per_gib` (the fastest of
/// [`REPS`], ms per GiB of the buffer) and `huge_map_thp_share` (the share of the THP
/// buffer huge pages mapped). `None` when the kernel cannot tell (before Linux 6.7).
///
/// The kernel walks the page tables down to where the answer is: a PMD entry for a huge
/// page, 512 PTEs for a 2 MiB span of base pages. So the cost follows what maps the RAM.
pub fn huge_map() -> Result<Option<Value>, Error> {
    let mut locator = vmtier_migrate::MovePages::default();
    let pid =
        vmtier_core::ProcessId::new(i32::try_from(std::process::id()).expect("a pid fits pid_t"));
    let mut out = serde_json::Map::new();
    for (key, advice) in [
        ("huge_map_base_ms_per_gib", libc::MADV_NOHUGEPAGE),
        ("huge_map_thp_ms_per_gib", libc::MADV_HUGEPAGE),
    ] {
        let p = crate::mem::map_anon(HUGE_MAP_BYTES, Some(advice)).map_err(Error::Map)?;
        let base = p.cast::<u8>();
        for i in (0..HUGE_MAP_BYTES).step_by(4096) {
            // SAFETY: i < HUGE_MAP_BYTES, inside the mapping, used by this thread only.
            unsafe { base.add(i).write_volatile(1) };
        }
        let start = vmtier_core::HostVirtAddr::new(p as u64);
        let mut runs = Vec::new();
        let mut times = Vec::with_capacity(REPS);
        let mut known = Ok(true);
        for _ in 0..REPS {
            runs.clear();
            let t = Instant::now();
            known = locator.huge_runs(pid, &[(start, HUGE_MAP_BYTES as u64)], &mut runs);
            times.push(t.elapsed().as_secs_f64() * 1e3);
            if !matches!(known, Ok(true)) {
                break;
            }
        }
        // SAFETY: unmaps exactly the mapping made above, not used after this.
        unsafe { libc::munmap(p, HUGE_MAP_BYTES) };
        if !known.map_err(Error::HugeMap)? {
            return Ok(None);
        }
        #[allow(clippy::cast_precision_loss)]
        let gib = HUGE_MAP_BYTES as f64 / f64::from(1u32 << 30);
        out.insert(key.to_owned(), json!(fastest(&times) / gib));
        if advice == libc::MADV_HUGEPAGE {
            let huge: u64 = runs.iter().map(|r| r.1).sum();
            #[allow(clippy::cast_precision_loss)]
            out.insert(
                "huge_map_thp_share".to_owned(),
                json!(huge as f64 / HUGE_MAP_BYTES as f64),
            );
        }
    }
    Ok(Some(Value::Object(out)))
}

/// What [`huge_map`]'s figures in `m` (a [`run`] result measured on `clock`) make of a read
/// of all guest RAM at 64 GiB and 1 TiB, on base pages and on THP, and of a tick where every
/// granule is read once every `refresh_ticks` (the most vmtierd reads: the slow granules with
/// heat, and with hybrid tracking the regions it may split and the split ones; a split
/// region is read again before its pages move): the lines to print.
pub fn huge_map_lines(m: &Value, clock: &str, refresh_ticks: u64) -> Vec<String> {
    let fig = |k: &str| m.get(k).and_then(Value::as_f64);
    let (Some(base), Some(thp)) = (
        fig("huge_map_base_ms_per_gib"),
        fig("huge_map_thp_ms_per_gib"),
    ) else {
        return vec!["huge-page map read: not measured (PAGEMAP_SCAN needs Linux 6.7)".to_owned()];
    };
    let share = fig("huge_map_thp_share").unwrap_or(0.0) * 100.0;
    #[allow(clippy::cast_precision_loss)]
    let every = refresh_ticks.max(1) as f64;
    let mut lines = vec![format!(
        "huge-page map read (PAGEMAP_SCAN, {clock} clock; vmtierd reads it for the slow granules with heat and, with hybrid tracking, the regions it may split and the split ones, each at most once every {refresh_ticks} ticks): {base:.3} ms per GiB on base pages, {thp:.3} ms per GiB on THP ({share:.0} % of that buffer huge-mapped)"
    )];
    for (what, gib) in [("64 GiB", 64.0), ("1 TiB", 1024.0)] {
        lines.push(format!(
            "  {what}, all of it: {:.1} ms per read on base pages (at most {:.2} ms per tick, each granule once per refresh), {:.2} ms on THP (at most {:.3} ms per tick)",
            base * gib,
            base * gib / every,
            thp * gib,
            thp * gib / every
        ));
    }
    lines
}

/// The emulation factor of each microbenchmark: testbed time / native time, in [`NAMES`]
/// order with their kinds.
pub fn factors(testbed: &Value, native: &Value) -> Result<Vec<(&'static str, Kind, f64)>, Error> {
    NAMES
        .iter()
        .map(|&(name, kind)| {
            let get = |v: &Value| {
                v.get(name)
                    .and_then(Value::as_f64)
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| Error::Missing(name.to_owned()))
            };
            Ok((name, kind, get(testbed)? / get(native)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_are_testbed_over_native_and_need_every_figure() {
        let full = |x: f64| {
            Value::Object(
                NAMES
                    .iter()
                    .map(|(n, _)| ((*n).to_owned(), json!(x)))
                    .collect(),
            )
        };
        let cases: [(Value, Value, Option<f64>); 4] = [
            (full(30.0), full(2.0), Some(15.0)),
            (full(1.0), full(1.0), Some(1.0)),
            (full(30.0), full(0.0), None),
            (json!({"plan_4k_ms": 1.0}), full(1.0), None),
        ];
        for (tb, nat, want) in cases {
            match (factors(&tb, &nat), want) {
                (Ok(f), Some(w)) => {
                    assert_eq!(f.len(), NAMES.len());
                    assert!(f.iter().all(|(_, _, x)| (x - w).abs() < 1e-9), "{f:?}");
                }
                (Err(_), None) => {}
                (got, want) => panic!("{got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn huge_map_lines_scale_per_gib_and_amortise_over_the_refresh() {
        let m = json!({
            "huge_map_base_ms_per_gib": 0.9,
            "huge_map_thp_ms_per_gib": 0.04,
            "huge_map_thp_share": 0.98,
        });
        let l = huge_map_lines(&m, "host", 10);
        assert_eq!(l.len(), 3, "{l:?}");
        assert!(l[0].contains("0.900 ms per GiB on base pages"), "{}", l[0]);
        assert!(l[0].contains("(98 % of that buffer"), "{}", l[0]);
        assert!(
            l[1].contains("64 GiB, all of it: 57.6 ms per read on base pages (at most 5.76 ms"),
            "{}",
            l[1]
        );
        assert!(
            l[2].contains("1 TiB, all of it: 921.6 ms per read"),
            "{}",
            l[2]
        );
        assert!(
            l[2].contains("40.96 ms on THP (at most 4.096 ms"),
            "{}",
            l[2]
        );
        let none = huge_map_lines(&json!({}), "host", 10);
        assert!(none[0].contains("not measured"), "{none:?}");
    }

    #[test]
    fn fastest_takes_the_minimum() {
        let cases: [(Vec<f64>, f64); 3] = [
            (vec![3.0, 1.0, 2.0], 1.0),
            (vec![5.0], 5.0),
            (vec![9.0, 4.0, 4.0, 100.0, 2.5], 2.5),
        ];
        for (v, want) in cases {
            assert_eq!(fastest(&v), want);
        }
    }
}
