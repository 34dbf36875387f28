//! Every DAMON aggregation window of one kdamond, read from its `damon:damon_aggregated`
//! tracepoint through a perf ring buffer.
//!
//! DAMON emits `damon_aggregated` for every region of every target at the end of each
//! aggregation window (`kdamond_reset_aggregated()` in `mm/damon/core.c`), with the region's
//! range and its `nr_accesses` for the window. A perf event of type
//! `PERF_TYPE_TRACEPOINT` opened on the kdamond's thread (not on a CPU) collects exactly that
//! kdamond's windows into a ring buffer of our chosen size, whatever the number of CPUs;
//! nothing blocks and no DAMON sysfs lock is taken, so any number of VMs can be observed at
//! once (a sysfs `update_schemes_tried_regions` request holds the one global DAMON sysfs
//! lock for up to a whole aggregation window in 6.12). [`AggregatedTrace::drain`] hands out
//! every record since the previous drain; [`accumulate`] sums them into non-overlapping
//! segments with the hits and samples of all windows that covered each byte.
//!
//! Field offsets come from the event's `format` file in tracefs; the event id from its `id`.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

/// Errors opening or reading the trace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No tracefs with the DAMON events.
    #[error("No damon:damon_aggregated tracepoint under {0}")]
    NoEvent(PathBuf),
    /// The event's format lacks a field or has an unexpected size.
    #[error("Unexpected damon_aggregated format: {0}")]
    Format(String),
    /// `perf_event_open` failed.
    #[error("Cannot open a perf event on kdamond {pid}")]
    Open {
        /// The kdamond's pid.
        pid: i32,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Mapping the ring buffer failed.
    #[error("Cannot map a {0}-byte perf ring buffer")]
    Map(usize, #[source] std::io::Error),
}

/// Tracefs mount points, in the order they are tried.
pub const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The first tracefs mount that has the DAMON events.
pub fn find_tracefs() -> Option<PathBuf> {
    TRACEFS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events/damon/damon_aggregated/id").exists())
}

/// One region of one aggregation window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRegion {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Samples of the window that found it accessed.
    pub nr_accesses: u32,
}

/// Where the fields we read sit in the event's raw record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    start: usize,
    end: usize,
    nr_accesses: usize,
    /// Bytes a record must have.
    min_len: usize,
}

/// Parses the event's `format` file: `field:unsigned long start; offset:16; size:8; ...`.
fn parse_format(text: &str) -> Result<Layout, Error> {
    let mut start = None;
    let mut end = None;
    let mut nr = None;
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';').map(str::trim);
        let decl = parts.next().unwrap_or("");
        let name = decl.rsplit(' ').next().unwrap_or("");
        let num = |key: &str| -> Option<usize> {
            rest.split(';')
                .map(str::trim)
                .find_map(|p| p.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
        };
        let (Some(offset), Some(size)) = (num("offset:"), num("size:")) else {
            continue;
        };
        match (name, size) {
            ("start", 8) => start = Some(offset),
            ("end", 8) => end = Some(offset),
            ("nr_accesses", 4) => nr = Some(offset),
            ("start" | "end" | "nr_accesses", _) => {
                return Err(Error::Format(format!("{name} has size {size}")))
            }
            _ => {}
        }
    }
    let (Some(start), Some(end), Some(nr_accesses)) = (start, end, nr) else {
        return Err(Error::Format("missing start, end or nr_accesses".into()));
    };
    let min_len = (start + 8).max(end + 8).max(nr_accesses + 4);
    Ok(Layout {
        start,
        end,
        nr_accesses,
        min_len,
    })
}

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`, 64 bytes), which is
/// all a tracepoint event needs.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_TRACEPOINT: u32 = 2;
const PERF_SAMPLE_RAW: u64 = 1 << 10;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_SAMPLE: u32 = 9;
/// Offsets of `data_head`, `data_tail`, `data_offset`, `data_size` in
/// `struct perf_event_mmap_page` (uapi, fixed since Linux 4.1).
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;

/// The perf ring buffer mapping.
struct Ring {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by one `AggregatedTrace` and only touched through `&mut`.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what mmap returned; nothing refers to the mapping
        // once the owner is dropped.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

impl Ring {
    fn load_u64(&self, off: usize) -> u64 {
        debug_assert!(off + 8 <= self.len);
        // SAFETY: off + 8 lies within the first (control) page of the mapping, which is
        // 8-byte aligned at these offsets; volatile because the kernel writes it.
        unsafe { self.base.as_ptr().add(off).cast::<u64>().read_volatile() }
    }

    fn store_u64(&self, off: usize, v: u64) {
        debug_assert!(off + 8 <= self.len);
        // SAFETY: as in load_u64; data_tail is the one field user space may write.
        unsafe { self.base.as_ptr().add(off).cast::<u64>().write_volatile(v) }
    }

    /// Copies `out.len()` bytes of the data area starting at ring position `pos`
    /// (wrapping around the end).
    fn copy(&self, data_off: usize, data_len: usize, pos: u64, out: &mut [u8]) {
        let mut at = usize::try_from(pos % data_len as u64).unwrap_or(0);
        let mut done = 0;
        while done < out.len() {
            let n = (out.len() - done).min(data_len - at);
            // SAFETY: data_off + at + n ≤ data_off + data_len ≤ self.len: within the
            // mapping; `out` is a distinct, writable buffer of at least done + n bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr().add(data_off + at),
                    out.as_mut_ptr().add(done),
                    n,
                );
            }
            done += n;
            at = 0;
        }
    }
}

/// The `damon_aggregated` records of one kdamond.
pub struct AggregatedTrace {
    _fd: OwnedFd,
    ring: Ring,
    data_off: usize,
    data_len: usize,
    tail: u64,
    layout: Layout,
    lost: u64,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for AggregatedTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregatedTrace")
            .field("ring_bytes", &self.data_len)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl AggregatedTrace {
    /// Opens the tracepoint of `tracefs` on kdamond thread `pid` with a ring buffer of at
    /// least `ring_bytes` (rounded up to a power-of-two number of pages).
    pub fn open(tracefs: &Path, pid: i32, ring_bytes: usize) -> Result<Self, Error> {
        let ev = tracefs.join("events/damon/damon_aggregated");
        let id: u64 = fs::read_to_string(ev.join("id"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| Error::NoEvent(tracefs.to_owned()))?;
        let format =
            fs::read_to_string(ev.join("format")).map_err(|_| Error::NoEvent(tracefs.into()))?;
        let layout = parse_format(&format)?;

        let attr = PerfEventAttr {
            kind: PERF_TYPE_TRACEPOINT,
            size: u32::try_from(std::mem::size_of::<PerfEventAttr>()).unwrap_or(64),
            config: id,
            sample_period: 1,
            sample_type: PERF_SAMPLE_RAW,
            ..PerfEventAttr::default()
        };
        // SAFETY: perf_event_open reads `attr.size` bytes of a valid, initialized attr that
        // lives across the call; the other arguments are plain integers.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                std::ptr::addr_of!(attr),
                pid,
                -1i32,
                -1i32,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(Error::Open {
                pid,
                source: std::io::Error::last_os_error(),
            });
        }
        let raw = i32::try_from(fd).map_err(|_| Error::Open {
            pid,
            source: std::io::Error::other("fd out of range"),
        })?;
        // SAFETY: perf_event_open returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let pages = ring_bytes.div_ceil(page).max(2).next_power_of_two();
        let len = (pages + 1) * page;
        // SAFETY: a fresh shared mapping of the perf fd, as perf_event_open(2) documents:
        // one control page plus a power-of-two number of data pages.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Map(len, std::io::Error::last_os_error()));
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::Map(len, std::io::Error::other("null mapping")))?;
        let ring = Ring { base, len };
        let (mut data_off, mut data_len) = (
            usize::try_from(ring.load_u64(DATA_OFFSET)).unwrap_or(0),
            usize::try_from(ring.load_u64(DATA_SIZE)).unwrap_or(0),
        );
        if data_len == 0 || data_off.checked_add(data_len).map_or(true, |e| e > len) {
            (data_off, data_len) = (page, pages * page);
        }
        let tail = ring.load_u64(DATA_TAIL);
        Ok(Self {
            _fd: fd,
            ring,
            data_off,
            data_len,
            tail,
            layout,
            lost: 0,
            scratch: Vec::new(),
        })
    }

    /// Records the kernel dropped because the ring was full, since opening.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Bytes of the ring's data area.
    pub fn ring_bytes(&self) -> usize {
        self.data_len
    }

    /// Appends every record since the previous drain to `out`; returns how many.
    pub fn drain(&mut self, out: &mut Vec<WindowRegion>) -> usize {
        let head = self.ring.load_u64(DATA_HEAD);
        // Pairs with the kernel's write barrier before it publishes data_head.
        fence(Ordering::Acquire);
        let before = out.len();
        let mut hdr = [0u8; 8];
        while self.tail < head {
            self.ring
                .copy(self.data_off, self.data_len, self.tail, &mut hdr);
            let kind = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
            let size = usize::from(u16::from_ne_bytes([hdr[6], hdr[7]]));
            if size < 8 || size as u64 > head - self.tail {
                // A torn or corrupt record: skip what the kernel has published.
                self.tail = head;
                break;
            }
            self.scratch.resize(size, 0);
            self.ring
                .copy(self.data_off, self.data_len, self.tail, &mut self.scratch);
            match kind {
                PERF_RECORD_SAMPLE => {
                    if let Some(r) = self.parse_sample(&self.scratch[8..]) {
                        out.push(r);
                    }
                }
                PERF_RECORD_LOST => {
                    // struct { header; u64 id; u64 lost; }
                    if let Some(b) = self.scratch.get(16..24) {
                        let mut v = [0u8; 8];
                        v.copy_from_slice(b);
                        self.lost = self.lost.saturating_add(u64::from_ne_bytes(v));
                    }
                }
                _ => {}
            }
            self.tail += size as u64;
        }
        // The data reads above must complete before the kernel may overwrite them.
        fence(Ordering::SeqCst);
        self.ring.store_u64(DATA_TAIL, self.tail);
        out.len() - before
    }

    /// A `PERF_SAMPLE_RAW` body: `u32 size; u8 data[size]`.
    fn parse_sample(&self, body: &[u8]) -> Option<WindowRegion> {
        let n = usize::try_from(u32::from_ne_bytes(body.get(..4)?.try_into().ok()?)).ok()?;
        let raw = body.get(4..4 + n)?;
        if raw.len() < self.layout.min_len {
            return None;
        }
        let u64_at = |o: usize| Some(u64::from_ne_bytes(raw.get(o..o + 8)?.try_into().ok()?));
        let u32_at = |o: usize| Some(u32::from_ne_bytes(raw.get(o..o + 4)?.try_into().ok()?));
        Some(WindowRegion {
            start: u64_at(self.layout.start)?,
            end: u64_at(self.layout.end)?,
            nr_accesses: u32_at(self.layout.nr_accesses)?,
        })
    }
}

/// One segment of accumulated windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Sum of `nr_accesses` over the windows that covered it.
    pub hits: u32,
    /// Samples those windows took (`max_nr_accesses` each).
    pub samples: u32,
}

/// Sums window regions into non-overlapping segments, in address order: every byte gets
/// the `nr_accesses` of every record that covered it as hits, and `max_nr_accesses` per
/// such record as samples. Adjacent segments with equal counts are merged; bytes no record
/// covered are left out.
pub fn accumulate(records: &[WindowRegion], max_nr_accesses: u32) -> Vec<Segment> {
    let mut points: Vec<u64> = records
        .iter()
        .filter(|r| r.start < r.end)
        .flat_map(|r| [r.start, r.end])
        .collect();
    points.sort_unstable();
    points.dedup();
    if points.len() < 2 {
        return Vec::new();
    }
    let mut dh = vec![0i64; points.len()];
    let mut ds = vec![0i64; points.len()];
    for r in records.iter().filter(|r| r.start < r.end) {
        // Both are in `points` by construction.
        let a = points.partition_point(|&p| p < r.start);
        let b = points.partition_point(|&p| p < r.end);
        let n = i64::from(r.nr_accesses.min(max_nr_accesses));
        dh[a] += n;
        dh[b] -= n;
        ds[a] += i64::from(max_nr_accesses);
        ds[b] -= i64::from(max_nr_accesses);
    }
    let mut out: Vec<Segment> = Vec::new();
    let (mut h, mut s) = (0i64, 0i64);
    for i in 0..points.len() - 1 {
        h += dh[i];
        s += ds[i];
        if s <= 0 {
            continue;
        }
        let hits = u32::try_from(h.max(0)).unwrap_or(u32::MAX);
        let samples = u32::try_from(s).unwrap_or(u32::MAX);
        let (lo, hi) = (points[i], points[i + 1]);
        match out.last_mut() {
            Some(l) if l.end == lo && l.hits == hits && l.samples == samples => l.end = hi,
            _ => out.push(Segment {
                start: lo,
                end: hi,
                hits,
                samples,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = "name: damon_aggregated
ID: 1234
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:unsigned long target_id;\toffset:8;\tsize:8;\tsigned:0;
\tfield:unsigned int nr_regions;\toffset:16;\tsize:4;\tsigned:0;
\tfield:unsigned long start;\toffset:24;\tsize:8;\tsigned:0;
\tfield:unsigned long end;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned int nr_accesses;\toffset:40;\tsize:4;\tsigned:0;
\tfield:unsigned int age;\toffset:44;\tsize:4;\tsigned:0;

print fmt: \"target_id=%lu nr_regions=%u %lu-%lu: %u %u\", REC->target_id
";

    #[test]
    fn the_format_file_gives_the_offsets() {
        let l = parse_format(FORMAT).unwrap();
        assert_eq!(
            l,
            Layout {
                start: 24,
                end: 32,
                nr_accesses: 40,
                min_len: 44
            }
        );
        let bad = FORMAT.replace("end;\toffset:32;\tsize:8", "end;\toffset:32;\tsize:4");
        assert!(matches!(parse_format(&bad), Err(Error::Format(_))));
        let missing = FORMAT.replace("nr_accesses", "nr_accessez");
        assert!(matches!(parse_format(&missing), Err(Error::Format(_))));
    }

    fn w(start: u64, end: u64, nr: u32) -> WindowRegion {
        WindowRegion {
            start,
            end,
            nr_accesses: nr,
        }
    }

    fn seg(start: u64, end: u64, hits: u32, samples: u32) -> Segment {
        Segment {
            start,
            end,
            hits,
            samples,
        }
    }

    #[test]
    fn windows_accumulate_into_segments() {
        // Two windows over [0, 100): the regions split differently.
        //   window 1: [0 ......... 60)[60 .... 100)   nr 4, 0
        //   window 2: [0 .. 30)[30 ............ 100)   nr 2, 20
        // segments:  [0..30) 6/40  [30..60) 24/40  [60..100) 20/40
        type Case = (&'static str, Vec<WindowRegion>, Vec<Segment>);
        let cases: Vec<Case> = vec![
            (
                "two windows",
                vec![w(0, 60, 4), w(60, 100, 0), w(0, 30, 2), w(30, 100, 20)],
                vec![seg(0, 30, 6, 40), seg(30, 60, 24, 40), seg(60, 100, 20, 40)],
            ),
            (
                "equal neighbours merge",
                vec![w(0, 10, 3), w(10, 20, 3)],
                vec![seg(0, 20, 3, 20)],
            ),
            (
                "a partly read window leaves fewer samples where it is missing",
                vec![w(0, 50, 5), w(50, 100, 5), w(0, 50, 5)],
                vec![seg(0, 50, 10, 40), seg(50, 100, 5, 20)],
            ),
            (
                "gaps stay gaps; counts above the maximum are capped",
                vec![w(0, 10, 99), w(20, 30, 1), w(40, 40, 7)],
                vec![seg(0, 10, 20, 20), seg(20, 30, 1, 20)],
            ),
            ("nothing", vec![], vec![]),
        ];
        for (name, recs, want) in cases {
            assert_eq!(accumulate(&recs, 20), want, "{name}");
        }
    }
}
