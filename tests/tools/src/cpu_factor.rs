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

use std::time::Instant;

use serde_json::{json, Value};

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
