//! DAMON on the VMM process, restricted to guest RAM.
//!
//! # How
//!
//! One kdamond (a slot claimed through [`sysfs`]) with one context and one target, the
//! VMM's pid:
//!
//! - operations `fvaddr` (*fixed* virtual address ranges): the init regions — the guest RAM
//!   ranges, sorted by host address and merged where adjacent — stay the monitoring target.
//!   Plain `vaddr` replaces the init regions with the whole address space (its "three
//!   regions") at every update interval, which would spend the `max_nr_regions` budget on
//!   QEMU's heap and libraries. Where only `vaddr` exists it is used and reports are clipped
//!   to the guest ranges.
//! - **Every aggregation window of the tick** ([`Observation::Trace`], the default where it
//!   works): the kdamond's `damon:damon_aggregated` tracepoint is read through a perf ring
//!   buffer on the kdamond thread ([`trace`]). [`HotnessSource::collect`] drains it without
//!   blocking and sums all windows since the previous call: with DAMON's default 5 ms
//!   samples and a 1 s tick a region is reported as `hits` of 200 samples, not 20. That is
//!   what makes a guest on 4 KiB pages visible: a hot 4 KiB page is accessed within a 5 ms
//!   sample only ~10% of the time, where the accessed bit of a 2 MiB huge page is set in
//!   nearly every sample.
//! - **One window per tick** ([`Observation::Snapshot`], the fallback without tracefs or
//!   perf events): a DAMOS `stat` scheme over every region makes the kdamond record the
//!   regions it tried; `collect` writes `update_schemes_tried_regions` (it returns at the
//!   end of the next aggregation window, holding DAMON sysfs's global lock that long) and
//!   reads them. This sees 20 samples per tick: a tenth of the signal.
//!
//! On detach (or drop) the kdamond is turned off and its slot released.

pub mod sysfs;
pub mod trace;

use std::path::PathBuf;

use vmtier_core::hotness::{self, HotnessSource};
use vmtier_core::{GranuleSize, GuestMemoryLayout, HostVirtAddr, ProcessId, RegionAccess};

pub use sysfs::{Attrs, Sysfs, TriedRegion, DEFAULT_ROOT};
use trace::{AggregatedTrace, WindowRegion};

/// Errors of the DAMON source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// DAMON sysfs failed.
    #[error(transparent)]
    Sysfs(#[from] sysfs::Error),
    /// Neither `fvaddr` nor `vaddr` in `avail_operations`.
    #[error("DAMON has no vaddr operations (available: {0})")]
    NoVaddr(String),
    /// Invalid monitoring attributes.
    #[error("Invalid DAMON attributes: {0}")]
    Config(&'static str),
    /// The layout has no ranges.
    #[error("Guest memory layout has no RAM ranges")]
    NoRanges,
    /// The monitored process is gone.
    #[error("Monitored process {0} is gone")]
    Gone(ProcessId),
    /// The kdamond stopped although the process lives.
    #[error("Kdamond {0} stopped")]
    Stopped(usize),
    /// Every window was asked for and the tracepoint cannot be read.
    #[error("Cannot read DAMON's aggregation windows")]
    Trace(#[source] trace::Error),
    /// `collect` before `attach`.
    #[error("DAMON source is not attached")]
    NotAttached,
}

impl From<Error> for hotness::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Gone(_) => hotness::Error::Gone,
            Error::Sysfs(sysfs::Error::NoSysfs(_) | sysfs::Error::NoSlot(_))
            | Error::NoVaddr(_)
            | Error::Config(_)
            | Error::Trace(_) => hotness::Error::Unavailable(vmtier_core::error_chain(&e)),
            other => hotness::Error::Io(std::io::Error::other(other)),
        }
    }
}

/// How the source reads DAMON's results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Observation {
    /// Every window through the tracepoint where it works, else one window per tick.
    #[default]
    Auto,
    /// Every window through the `damon_aggregated` tracepoint, or fail.
    Trace,
    /// One window per tick through `update_schemes_tried_regions`.
    Snapshot,
}

/// DAMON source settings. Attributes default to DAMON's own (5 ms / 100 ms / 1 s) except
/// the region limits: [`DEFAULT_MIN_NR_REGIONS`] and [`DEFAULT_MAX_NR_REGIONS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamonConfig {
    /// Sysfs admin directory. Default [`DEFAULT_ROOT`].
    pub root: PathBuf,
    /// Tracefs mount with the DAMON events; `None` looks in the usual places
    /// ([`trace::TRACEFS`]). Default `None`.
    pub tracefs: Option<PathBuf>,
    /// Monitoring attributes.
    pub attrs: Attrs,
    /// How windows are read. Default [`Observation::Auto`].
    pub observation: Observation,
    /// The tick length, ms, the trace ring buffer is sized for: it holds two ticks of
    /// windows at `max_nr_regions` regions each. Default 1000 (vmtierd's default tick).
    pub tick_ms: u64,
    /// Extra empty kdamond slots created when `nr_kdamonds` must grow. Default 3.
    pub spare_kdamonds: usize,
}

/// vmtierd's `min_nr_regions`: a third of `max_nr_regions`. DAMON never merges a region
/// beyond total size / `min_nr_regions`; with DAMON's default of 10, a few hot 4 KiB pages
/// merge into regions of a tenth of the guest and vanish in their average. A third of the
/// maximum caps a region at three times the finest DAMON could reach anyway, and leaves it
/// room to split (it splits while at most half the maximum exist, in three below a third).
/// The cost stays bounded by `max_nr_regions`. In the simulator this took vmtierd from
/// 0.85 to 0.92 of the greedy oracle on average over its traces and budgets (worst case
/// 0.40 → 0.74; docs/policies.md).
pub const DEFAULT_MIN_NR_REGIONS: u64 = 520;

/// vmtierd's `max_nr_regions`: 1560, half as many again as DAMON's default of 1000. Finer
/// regions see hot pages scattered among cold ones (redis, kv-zipf in the simulator: 14 → 17
/// of 33 cases at 0.95 of the greedy oracle) for 11–14 % more kdamond CPU in the testbed's
/// e2e runs (docs/policies.md, "DAMON's region limits").
pub const DEFAULT_MAX_NR_REGIONS: u64 = 1560;

impl Default for DamonConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from(DEFAULT_ROOT),
            tracefs: None,
            attrs: Attrs {
                min_nr_regions: DEFAULT_MIN_NR_REGIONS,
                max_nr_regions: DEFAULT_MAX_NR_REGIONS,
                ..Attrs::default()
            },
            observation: Observation::Auto,
            tick_ms: 1000,
            spare_kdamonds: 3,
        }
    }
}

impl DamonConfig {
    fn validate(&self) -> Result<(), Error> {
        let a = &self.attrs;
        if a.sample_us == 0 || a.aggr_us < a.sample_us {
            return Err(Error::Config("need 0 < sample_us <= aggr_us"));
        }
        if a.min_nr_regions < 3 || a.max_nr_regions < a.min_nr_regions {
            return Err(Error::Config("need 3 <= min_nr_regions <= max_nr_regions"));
        }
        Ok(())
    }

    /// Bytes of trace ring buffer that hold twice a tick's records at `max_nr_regions`.
    fn ring_bytes(&self) -> usize {
        /// Bytes of one `damon_aggregated` sample record in the ring (header, size word,
        /// raw tracepoint entry), rounded up.
        const RECORD: u64 = 64;
        let windows = (self.tick_ms.saturating_mul(1000) / self.attrs.aggr_us.max(1)).max(1);
        let b = windows
            .saturating_mul(self.attrs.max_nr_regions)
            .saturating_mul(RECORD)
            .saturating_mul(2)
            .clamp(64 << 10, 16 << 20);
        usize::try_from(b).unwrap_or(16 << 20)
    }
}

/// Host ranges of `layout` sorted by address, adjacent or overlapping ones merged.
fn host_ranges(layout: &GuestMemoryLayout) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = layout
        .ranges
        .iter()
        .filter_map(|r| Some((r.hva.raw(), r.hva_end()?.raw())))
        .collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// `ranges` (sorted, disjoint) cut into about `n` initial regions of equal size, at least
/// `unit` and on `unit` boundaries; a range smaller than that size stays whole.
///
/// Linux 6.12 starts an `fvaddr` context from the regions it is given and splits them only
/// at the end of each aggregation window, in two or three at a time: from the guest's few RAM
/// ranges that takes about ten windows (a whole 1 s tick) before a region is as small as
/// `min_nr_regions` allows. Meanwhile one region averages the hot set with the cold memory
/// around it, and every granule reads warm (the testbed, 2026-11-28: heat 5–10 on all guest
/// RAM in vmtierd's first tick). `vaddr`'s own init splits evenly like this
/// (`__damon_va_init_regions`); so vmtierd hands `fvaddr` its ranges already cut.
pub fn even_regions(ranges: &[(u64, u64)], n: u64, unit: u64) -> Vec<(u64, u64)> {
    let unit = unit.max(1);
    let total: u64 = ranges.iter().map(|&(s, e)| e.saturating_sub(s)).sum();
    let size = (total / n.max(1)) / unit * unit;
    let size = size.max(unit);
    let mut out = Vec::new();
    for &(s, e) in ranges.iter().filter(|(s, e)| s < e) {
        let len = e - s;
        let pieces = (len / size).max(1);
        // Cut k at k/pieces of the range, rounded down to a unit: the pieces differ by at
        // most a unit, and none is empty since each spans at least `size` >= `unit` before
        // rounding.
        let mut at = s;
        for k in 1..pieces {
            let off = u128::from(len) * u128::from(k) / u128::from(pieces);
            let off = u64::try_from(off).unwrap_or(len) / unit * unit;
            out.push((at, s + off));
            at = s + off;
        }
        out.push((at, e));
    }
    out
}

/// Clips `(start, end, hits, samples)` segments (sorted) to `ranges` (sorted); appends to
/// `out`.
fn clip(
    segments: impl IntoIterator<Item = (u64, u64, u32, u32)>,
    ranges: &[(u64, u64)],
    out: &mut Vec<RegionAccess>,
) {
    for (start, end, hits, samples) in segments {
        for &(s, e) in ranges {
            let lo = start.max(s);
            let hi = end.min(e);
            if lo < hi {
                out.push(RegionAccess {
                    start: HostVirtAddr::new(lo),
                    len: hi - lo,
                    hits,
                    samples,
                });
            }
        }
    }
}

/// Whether `pid` is a live (not zombie) process.
pub(crate) fn process_alive(pid: ProcessId) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.raw())) {
        // The state follows the ")" that closes the command name.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

/// How an attached source reads windows.
#[derive(Debug)]
enum Reader {
    Trace(Box<AggregatedTrace>),
    Snapshot,
}

/// The live part of an attached source.
#[derive(Debug)]
struct Attached {
    slot: usize,
    pid: ProcessId,
    ops: &'static str,
    ranges: Vec<(u64, u64)>,
    reader: Reader,
    /// Why the tracepoint is not used, in snapshot mode.
    no_trace: Option<String>,
}

/// DAMON monitoring of a VMM process's guest RAM. See the module docs.
#[derive(Debug)]
pub struct DamonSource {
    config: DamonConfig,
    sysfs: Sysfs,
    attached: Option<Attached>,
    records: Vec<WindowRegion>,
}

impl DamonSource {
    /// A detached source; nothing touches sysfs until [`HotnessSource::attach`].
    pub fn new(config: DamonConfig) -> Self {
        let sysfs = Sysfs::new(config.root.clone());
        Self {
            config,
            sysfs,
            attached: None,
            records: Vec::new(),
        }
    }

    /// The kdamond slot in use, if attached.
    pub fn kdamond(&self) -> Option<usize> {
        self.attached.as_ref().map(|a| a.slot)
    }

    /// The operation set in use (`fvaddr`, or `vaddr` where `fvaddr` is missing).
    pub fn operations(&self) -> Option<&'static str> {
        self.attached.as_ref().map(|a| a.ops)
    }

    /// Whether every aggregation window is read (the tracepoint), if attached.
    pub fn every_window(&self) -> Option<bool> {
        self.attached
            .as_ref()
            .map(|a| matches!(a.reader, Reader::Trace(_)))
    }

    /// Trace records the kernel dropped (ring buffer full) since attach.
    pub fn lost_records(&self) -> u64 {
        match self.attached.as_ref().map(|a| &a.reader) {
            Some(Reader::Trace(t)) => t.lost(),
            _ => 0,
        }
    }

    /// One line on how the source observes: for the daemon's log.
    pub fn describe(&self) -> String {
        let Some(a) = &self.attached else {
            return "not attached".into();
        };
        let at = &self.config.attrs;
        let how = match (&a.reader, &a.no_trace) {
            (Reader::Trace(t), _) => format!(
                "every {} ms aggregation window via the damon_aggregated tracepoint, {} KiB ring",
                at.aggr_us / 1000,
                t.ring_bytes() >> 10
            ),
            (Reader::Snapshot, why) => format!(
                "one {} ms window per tick via update_schemes_tried_regions{}",
                at.aggr_us / 1000,
                why.as_ref().map(|w| format!(" ({w})")).unwrap_or_default()
            ),
        };
        format!(
            "DAMON {} on kdamond {}, {} µs samples, {}-{} regions, {how}",
            a.ops, a.slot, at.sample_us, at.min_nr_regions, at.max_nr_regions
        )
    }

    /// The configuration.
    pub fn config(&self) -> &DamonConfig {
        &self.config
    }

    fn try_attach(&mut self, layout: &GuestMemoryLayout) -> Result<(), Error> {
        self.config.validate()?;
        let ranges = host_ranges(layout);
        if ranges.is_empty() {
            return Err(Error::NoRanges);
        }
        if !process_alive(layout.pid) {
            return Err(Error::Gone(layout.pid));
        }
        let slot = self.sysfs.claim(self.config.spare_kdamonds)?;
        match self.start(slot, layout.pid, &ranges) {
            Ok(a) => {
                log::debug!(
                    "damon: kdamond {slot} ({}) on pid {} over {} host ranges",
                    a.ops,
                    layout.pid,
                    ranges.len()
                );
                self.attached = Some(a);
                Ok(())
            }
            Err(e) => {
                if let Err(r) = self.sysfs.release(slot) {
                    log::warn!("damon: releasing kdamond {slot}: {r}");
                }
                if !process_alive(layout.pid) {
                    return Err(Error::Gone(layout.pid));
                }
                Err(e)
            }
        }
    }

    fn start(&self, slot: usize, pid: ProcessId, ranges: &[(u64, u64)]) -> Result<Attached, Error> {
        let avail = self.sysfs.avail_operations(slot)?;
        let ops = pick_ops(&avail)?;
        if ops == "vaddr" {
            log::warn!("damon: no fvaddr, using vaddr (monitors the whole address space)");
        }
        let ctx = sysfs::Context {
            ops: ops.into(),
            attrs: self.config.attrs,
            targets: vec![sysfs::Target {
                pid: Some(pid),
                // vaddr replaces them with its own, evenly split.
                regions: even_regions(
                    ranges,
                    self.config.attrs.min_nr_regions,
                    GranuleSize::BASE.bytes(),
                ),
            }],
            // The stat scheme serves the snapshot reader; it costs one pass over the
            // regions per window and changes nothing.
            schemes: vec![sysfs::Scheme::stat_all()],
        };
        self.sysfs.configure(slot, &ctx)?;
        self.sysfs.command(slot, "on")?;
        let (reader, no_trace) = match self.config.observation {
            Observation::Snapshot => (Reader::Snapshot, Some("configured".to_owned())),
            o => match self.open_trace(slot) {
                Ok(t) => (Reader::Trace(Box::new(t)), None),
                Err(e) if o == Observation::Auto => {
                    let why = vmtier_core::error_chain(&e);
                    log::warn!("damon: reading one window per tick: {why}");
                    (Reader::Snapshot, Some(why))
                }
                Err(e) => return Err(e),
            },
        };
        Ok(Attached {
            slot,
            pid,
            ops,
            ranges: ranges.to_vec(),
            reader,
            no_trace,
        })
    }

    fn open_trace(&self, slot: usize) -> Result<AggregatedTrace, Error> {
        let tracefs = match &self.config.tracefs {
            Some(p) => p.clone(),
            None => trace::find_tracefs()
                .ok_or_else(|| Error::Trace(trace::Error::NoEvent(trace::TRACEFS[0].into())))?,
        };
        let pid = self.sysfs.kdamond_pid(slot)?.ok_or(Error::Stopped(slot))?;
        AggregatedTrace::open(&tracefs, pid, self.config.ring_bytes()).map_err(Error::Trace)
    }

    fn try_collect(&mut self, out: &mut Vec<RegionAccess>) -> Result<(), Error> {
        let a = self.attached.as_mut().ok_or(Error::NotAttached)?;
        let max = u32::try_from(self.config.attrs.max_nr_accesses()).unwrap_or(u32::MAX);
        match &mut a.reader {
            Reader::Trace(t) => {
                self.records.clear();
                t.drain(&mut self.records);
                if self.records.is_empty() && !self.sysfs.is_on(a.slot).unwrap_or(false) {
                    return Err(if process_alive(a.pid) {
                        Error::Stopped(a.slot)
                    } else {
                        Error::Gone(a.pid)
                    });
                }
                let segs = trace::accumulate(&self.records, max);
                clip(
                    segs.iter().map(|s| (s.start, s.end, s.hits, s.samples)),
                    &a.ranges,
                    out,
                );
            }
            Reader::Snapshot => {
                if let Err(e) = self.sysfs.command(a.slot, "update_schemes_tried_regions") {
                    if !process_alive(a.pid) {
                        return Err(Error::Gone(a.pid));
                    }
                    if !self.sysfs.is_on(a.slot).unwrap_or(false) {
                        return Err(Error::Stopped(a.slot));
                    }
                    return Err(e.into());
                }
                let regions = self.sysfs.tried_regions(a.slot, 0)?;
                clip(
                    regions.iter().map(|r| {
                        let n = u32::try_from(r.nr_accesses).unwrap_or(u32::MAX).min(max);
                        (r.start.raw(), r.end.raw(), n, max)
                    }),
                    &a.ranges,
                    out,
                );
            }
        }
        Ok(())
    }
}

/// `fvaddr` if offered, else `vaddr`.
fn pick_ops(avail: &[String]) -> Result<&'static str, Error> {
    if avail.iter().any(|o| o == "fvaddr") {
        Ok("fvaddr")
    } else if avail.iter().any(|o| o == "vaddr") {
        Ok("vaddr")
    } else {
        Err(Error::NoVaddr(avail.join(" ")))
    }
}

impl HotnessSource for DamonSource {
    fn name(&self) -> &'static str {
        "damon-vaddr"
    }

    fn attach(&mut self, layout: &GuestMemoryLayout) -> Result<(), hotness::Error> {
        self.detach();
        self.try_attach(layout).map_err(Into::into)
    }

    fn collect(&mut self, out: &mut Vec<RegionAccess>) -> Result<(), hotness::Error> {
        self.try_collect(out).map_err(Into::into)
    }

    fn detach(&mut self) {
        if let Some(a) = self.attached.take() {
            // The perf event goes first: it refers to the kdamond thread.
            drop(a.reader);
            match self.sysfs.release(a.slot) {
                Ok(()) => log::debug!("damon: kdamond {} released", a.slot),
                Err(e) => log::warn!("damon: releasing kdamond {}: {e}", a.slot),
            }
        }
        self.records.clear();
    }
}

impl Drop for DamonSource {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Checks DAMON sysfs offers a vaddr operation set, without disturbing other users: reads
/// `avail_operations` of an existing context, or claims a slot briefly to read it. Returns
/// the operation set that would be used.
pub fn probe(root: &std::path::Path) -> Result<&'static str, Error> {
    let sysfs = Sysfs::new(root);
    if !sysfs.exists() {
        return Err(sysfs::Error::NoSysfs(root.to_owned()).into());
    }
    for i in 0..sysfs.nr_kdamonds()? {
        if let Ok(avail) = sysfs.avail_operations(i) {
            return pick_ops(&avail);
        }
    }
    let slot = sysfs.claim(0)?;
    let r = sysfs.avail_operations(slot).map_err(Error::from);
    sysfs.release(slot)?;
    pick_ops(&r?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::{Backing, GuestPhysAddr, GuestRamRange};

    #[test]
    fn initial_regions_are_cut_evenly_to_min_nr_regions() {
        const P: u64 = 4096;
        const M: u64 = 1 << 20;
        // (ranges, min_nr_regions) -> regions made (at least, at most): the size is rounded
        // down to whole pages, so a range can take a few more.
        for (ranges, n, want) in [
            (vec![(0, 1000 * P)], 10, (10, 10)),
            // The testbed guest: 640 KiB below the hole, the rest above 1 MiB (255.8 MiB).
            (vec![(0, 640 << 10), (M, 256 * M)], 520, (520, 524)),
            // A range smaller than one region stays whole.
            (vec![(0, P), (16 * M, 32 * M)], 16, (17, 17)),
            // More regions asked for than pages: one page each.
            (vec![(0, 3 * P)], 520, (3, 3)),
            (vec![(0, 8 * P)], 0, (1, 1)),
            (vec![], 10, (0, 0)),
        ] {
            let got = even_regions(&ranges, n, P);
            let len = got.len();
            assert!(
                (want.0..=want.1).contains(&len),
                "{ranges:x?} in {n}: {len}"
            );
            // The regions cover the ranges exactly, page-aligned, none empty.
            let mut covered: Vec<(u64, u64)> = Vec::new();
            for &(s, e) in &got {
                assert!(s < e && s % P == 0 && e % P == 0, "{s:#x}-{e:#x}");
                match covered.last_mut() {
                    Some(l) if l.1 == s => l.1 = e,
                    _ => covered.push((s, e)),
                }
            }
            assert_eq!(covered, ranges, "{n}");
            // Even: within each range the regions differ by at most a page.
            for &(rs, re) in &ranges {
                let sizes: Vec<u64> = got
                    .iter()
                    .filter(|r| rs <= r.0 && r.1 <= re)
                    .map(|(s, e)| e - s)
                    .collect();
                let lo = sizes.iter().min().copied().unwrap_or(0);
                let hi = sizes.iter().max().copied().unwrap_or(0);
                assert!(hi - lo <= P, "{rs:#x}-{re:#x}: {lo} .. {hi}");
            }
        }
    }

    #[test]
    fn segments_are_clipped_to_guest_ranges() {
        let mut out = Vec::new();
        clip(
            [(0x0, 0x3000, 5, 20), (0x3000, 0x8000, 20, 20)],
            &[(0x1000, 0x2000), (0x4000, 0x9000)],
            &mut out,
        );
        let got: Vec<_> = out
            .iter()
            .map(|a| (a.start.raw(), a.len, a.hits, a.samples))
            .collect();
        assert_eq!(got, [(0x1000, 0x1000, 5, 20), (0x4000, 0x4000, 20, 20)]);
    }

    #[test]
    fn host_ranges_merge() {
        let r = |gpa: u64, hva: u64, len: u64| GuestRamRange {
            name: format!("{gpa:#x}"),
            gpa: GuestPhysAddr(gpa),
            hva: HostVirtAddr::new(hva),
            len,
            backing: Backing::PrivateAnon,
        };
        // Two GPA ranges backed by adjacent host memory merge; a third stays apart.
        let l = GuestMemoryLayout::new(
            ProcessId::new(1),
            vec![
                r(0, 0x10_0000, 0x1000),
                r(0x1_0000_0000, 0x10_1000, 0x2000),
                r(0x2000, 0x1000, 0x1000),
            ],
        )
        .unwrap();
        assert_eq!(
            host_ranges(&l),
            vec![(0x1000, 0x2000), (0x10_0000, 0x10_3000)]
        );
    }

    #[test]
    fn bad_configs_are_refused() {
        let base = DamonConfig::default();
        let with = |f: fn(&mut Attrs)| {
            let mut c = base.clone();
            f(&mut c.attrs);
            c
        };
        let cases = [
            with(|a| a.sample_us = 0),
            with(|a| a.aggr_us = 1000),
            with(|a| a.min_nr_regions = 2),
            with(|a| a.max_nr_regions = 5),
        ];
        for c in cases {
            assert!(matches!(c.validate(), Err(Error::Config(_))), "{c:?}");
        }
        assert!(base.validate().is_ok());
        assert_eq!(base.attrs.max_nr_accesses(), 20);
        // 10 windows × 1560 regions × 64 B × 2 = 2.0 MB.
        assert_eq!(base.ring_bytes(), 1_996_800);
        // A 5 s tick: 50 windows; 10000 regions every 10 ms: capped at 16 MiB.
        let long = DamonConfig {
            tick_ms: 5000,
            ..base.clone()
        };
        assert_eq!(long.ring_bytes(), 9_984_000);
        let mut dense = base.clone();
        dense.attrs.aggr_us = 10_000;
        dense.attrs.max_nr_regions = 10_000;
        assert_eq!(dense.ring_bytes(), 16 << 20);
    }

    #[test]
    fn ops_choice() {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            pick_ops(&s(&["vaddr", "fvaddr", "paddr"])).unwrap(),
            "fvaddr"
        );
        assert_eq!(pick_ops(&s(&["vaddr", "paddr"])).unwrap(), "vaddr");
        assert!(matches!(pick_ops(&s(&["paddr"])), Err(Error::NoVaddr(_))));
    }

    #[test]
    fn unattached_source_says_so() {
        let mut s = DamonSource::new(DamonConfig::default());
        let mut out = Vec::new();
        assert!(matches!(s.try_collect(&mut out), Err(Error::NotAttached)));
    }
}
