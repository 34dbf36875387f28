//! DAMON through its sysfs interface, on the VMM process, restricted to guest RAM.
//!
//! # How
//!
//! One kdamond with one context and one target (the VMM's pid):
//!
//! - operations `fvaddr` (*fixed* virtual address ranges): the init regions — the guest RAM
//!   ranges, sorted by host address and merged where adjacent — stay the monitoring target.
//!   Plain `vaddr` replaces the init regions with the whole address space (its "three
//!   regions") at every update interval, which would spend the `max_nr_regions` budget on
//!   QEMU's heap and libraries. Where only `vaddr` exists it is used and reports are clipped
//!   to the guest ranges.
//! - one DAMOS scheme with action `stat` and an access pattern matching every region: it
//!   changes nothing, but makes the kdamond record the regions it "tried". Each
//!   [`HotnessSource::collect`] writes `update_schemes_tried_regions` to the kdamond's
//!   `state` file — the write returns once the kdamond has applied the schemes at the end of
//!   its next aggregation interval — and reads `schemes/0/tried_regions/N/{start,end,
//!   nr_accesses,age}`. This is what `damo` uses for snapshots; it needs nothing beyond
//!   sysfs (no tracefs) and gives one consistent aggregation window per read.
//! - `nr_accesses` (0 ..= aggr/sample) is scaled to [`RegionAccess::freq`] (0..=255); the
//!   raw regions with their ages are kept ([`DamonSource::last_regions`]).
//!
//! # Sharing DAMON sysfs with others
//!
//! Writing `nr_kdamonds` rebuilds *every* kdamond directory and fails with `EBUSY` while any
//! kdamond runs. So the source first looks for an existing slot that is off and has no
//! context; only if there is none, and no kdamond runs and none is configured (nothing to
//! lose), it grows `nr_kdamonds` by one plus [`DamonConfig::spare_kdamonds`] empty slots
//! that later attaches (other VMs) can claim while this one runs. Otherwise attach fails
//! with [`hotness::Error::Unavailable`] and the selector falls back to soft-dirty. On detach
//! (or drop) the kdamond is turned off, its context removed (the slot is free again), and
//! when every slot is off and empty `nr_kdamonds` is set back to 0. Slot claims within one
//! process are serialized; two processes claiming at the same instant can still race.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use vmtier_core::hotness::{self, HotnessSource};
use vmtier_core::{GuestMemoryLayout, HostVirtAddr, ProcessId, RegionAccess};

/// Where the DAMON sysfs admin directory lives.
pub const DEFAULT_ROOT: &str = "/sys/kernel/mm/damon/admin";

/// Serializes slot claims and releases within this process.
static SLOTS: Mutex<()> = Mutex::new(());

/// Errors of the DAMON sysfs source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No DAMON sysfs interface.
    #[error("No DAMON sysfs at {0}")]
    NoSysfs(PathBuf),
    /// Neither `fvaddr` nor `vaddr` in `avail_operations`.
    #[error("DAMON has no vaddr operations (available: {0})")]
    NoVaddr(String),
    /// No free kdamond slot, and DAMON sysfs cannot add one now.
    #[error("No free kdamond slot: {0}")]
    NoSlot(String),
    /// Writing a sysfs file failed.
    #[error("Failed to write {value:?} to {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading a sysfs file failed.
    #[error("Failed to read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file held something unexpected.
    #[error("Unexpected content {value:?} in {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Its content.
        value: String,
    },
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
    /// `collect` before `attach`.
    #[error("DAMON source is not attached")]
    NotAttached,
}

impl From<Error> for hotness::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Gone(_) => hotness::Error::Gone,
            Error::NoSysfs(_) | Error::NoVaddr(_) | Error::NoSlot(_) | Error::Config(_) => {
                hotness::Error::Unavailable(e.to_string())
            }
            other => hotness::Error::Io(std::io::Error::other(other)),
        }
    }
}

/// DAMON monitoring attributes. Defaults are DAMON's own (5 ms / 100 ms / 1 s, 10 ..= 1000
/// regions) except where noted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamonConfig {
    /// Sysfs admin directory. Default [`DEFAULT_ROOT`].
    pub root: PathBuf,
    /// Access-check sampling interval in µs. Default 5000.
    pub sample_us: u64,
    /// Aggregation interval in µs: the window one `collect` reports, and the longest a
    /// `collect` blocks. Default 100000. `freq` resolution is aggr/sample steps (20).
    pub aggr_us: u64,
    /// Operations update interval in µs (no effect with `fvaddr`). Default 1000000.
    pub update_us: u64,
    /// Minimum number of regions. Default 10.
    pub min_nr_regions: u64,
    /// Maximum number of regions; bounds the cost of one `collect` (5 sysfs reads per
    /// region). Default 1000.
    pub max_nr_regions: u64,
    /// Extra empty kdamond slots created when `nr_kdamonds` must grow. Default 3.
    pub spare_kdamonds: usize,
}

impl Default for DamonConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from(DEFAULT_ROOT),
            sample_us: 5_000,
            aggr_us: 100_000,
            update_us: 1_000_000,
            min_nr_regions: 10,
            max_nr_regions: 1000,
            spare_kdamonds: 3,
        }
    }
}

impl DamonConfig {
    fn validate(&self) -> Result<(), Error> {
        if self.sample_us == 0 || self.aggr_us < self.sample_us {
            return Err(Error::Config("need 0 < sample_us <= aggr_us"));
        }
        if self.min_nr_regions < 3 || self.max_nr_regions < self.min_nr_regions {
            return Err(Error::Config("need 3 <= min_nr_regions <= max_nr_regions"));
        }
        Ok(())
    }

    /// The largest `nr_accesses` a region can report in one aggregation window.
    pub fn max_nr_accesses(&self) -> u64 {
        (self.aggr_us / self.sample_us.max(1)).max(1)
    }
}

/// One DAMON region of the last aggregation window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DamonRegion {
    /// First byte.
    pub start: HostVirtAddr,
    /// One past the last byte.
    pub end: HostVirtAddr,
    /// Samples that found the region accessed (0 ..= [`DamonConfig::max_nr_accesses`]).
    pub nr_accesses: u64,
    /// Aggregation windows the region's access level has stayed about the same.
    pub age: u64,
}

/// Small file helpers over a DAMON sysfs tree (real or fake).
#[derive(Clone, Debug)]
struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    fn kdamonds(&self) -> PathBuf {
        self.root.join("kdamonds")
    }

    fn kdamond(&self, i: usize) -> PathBuf {
        self.kdamonds().join(i.to_string())
    }

    fn ctx(&self, i: usize) -> PathBuf {
        self.kdamond(i).join("contexts/0")
    }

    fn read(&self, path: &Path) -> Result<String, Error> {
        fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .map_err(|source| Error::Read {
                path: path.to_owned(),
                source,
            })
    }

    fn read_num(&self, path: &Path) -> Result<u64, Error> {
        let v = self.read(path)?;
        v.parse().map_err(|_| Error::Parse {
            path: path.to_owned(),
            value: v,
        })
    }

    /// Writes `value`; retries on EBUSY for up to a second (DAMON sysfs takes its lock
    /// with trylock, and handles one `update_schemes_*` request at a time, so a concurrent
    /// writer — another VM's `collect` — makes a write fail transiently).
    fn write(&self, path: &Path, value: &str) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            let r = fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|mut f| f.write_all(value.as_bytes()));
            match r {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && tries < 100 => {
                    tries += 1;
                    thread::sleep(Duration::from_millis(10));
                }
                Err(source) => {
                    return Err(Error::Write {
                        path: path.to_owned(),
                        value: value.to_owned(),
                        source,
                    })
                }
            }
        }
    }

    fn nr_kdamonds(&self) -> Result<usize, Error> {
        let p = self.kdamonds().join("nr_kdamonds");
        let n = self.read_num(&p)?;
        usize::try_from(n).map_err(|_| Error::Parse {
            path: p,
            value: n.to_string(),
        })
    }

    fn is_on(&self, i: usize) -> Result<bool, Error> {
        Ok(self.read(&self.kdamond(i).join("state"))? == "on")
    }

    fn nr_contexts(&self, i: usize) -> Result<u64, Error> {
        self.read_num(&self.kdamond(i).join("contexts/nr_contexts"))
    }

    /// Claims a kdamond slot: an existing free one, or a new one. The slot gets one context.
    fn claim(&self, spare: usize) -> Result<usize, Error> {
        if !self.kdamonds().join("nr_kdamonds").exists() {
            return Err(Error::NoSysfs(self.root.clone()));
        }
        let n = self.nr_kdamonds()?;
        let mut running = 0;
        let mut configured = 0;
        for i in 0..n {
            let on = self.is_on(i)?;
            let ctxs = self.nr_contexts(i)?;
            if !on && ctxs == 0 {
                self.write(&self.kdamond(i).join("contexts/nr_contexts"), "1")?;
                return Ok(i);
            }
            running += usize::from(on);
            configured += usize::from(!on && ctxs > 0);
        }
        if running > 0 {
            return Err(Error::NoSlot(format!(
                "all {n} kdamonds are taken and {running} running; DAMON sysfs cannot add one \
                 while a kdamond runs"
            )));
        }
        if configured > 0 {
            return Err(Error::NoSlot(format!(
                "{configured} of {n} kdamonds are configured (off); growing nr_kdamonds would \
                 erase their configuration"
            )));
        }
        let total = n.saturating_add(1).saturating_add(spare);
        self.write(&self.kdamonds().join("nr_kdamonds"), &total.to_string())?;
        self.write(&self.kdamond(n).join("contexts/nr_contexts"), "1")?;
        Ok(n)
    }

    /// Turns slot `i` off, drops its context, and shrinks `nr_kdamonds` to 0 when every
    /// slot is off and empty. Best effort: returns the first error.
    fn release(&self, i: usize) -> Result<(), Error> {
        let mut first = None;
        if self.is_on(i).unwrap_or(false) {
            if let Err(e) = self.write(&self.kdamond(i).join("state"), "off") {
                first.get_or_insert(e);
            }
        }
        if let Err(e) = self.write(&self.kdamond(i).join("contexts/nr_contexts"), "0") {
            first.get_or_insert(e);
        }
        let n = self.nr_kdamonds()?;
        let mut idle = true;
        for k in 0..n {
            if self.is_on(k)? || self.nr_contexts(k)? != 0 {
                idle = false;
                break;
            }
        }
        if idle && n > 0 {
            if let Err(e) = self.write(&self.kdamonds().join("nr_kdamonds"), "0") {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Operation sets the context of slot `i` offers.
    fn avail_operations(&self, i: usize) -> Result<Vec<String>, Error> {
        let s = self.read(&self.ctx(i).join("avail_operations"))?;
        Ok(s.split_whitespace().map(str::to_owned).collect())
    }

    /// Writes the whole context of slot `i`: operations, attributes, target, init regions,
    /// the `stat` scheme.
    fn configure(
        &self,
        i: usize,
        ops: &str,
        cfg: &DamonConfig,
        pid: ProcessId,
        regions: &[(u64, u64)],
    ) -> Result<(), Error> {
        let c = self.ctx(i);
        self.write(&c.join("operations"), ops)?;
        let iv = c.join("monitoring_attrs/intervals");
        self.write(&iv.join("sample_us"), &cfg.sample_us.to_string())?;
        self.write(&iv.join("aggr_us"), &cfg.aggr_us.to_string())?;
        self.write(&iv.join("update_us"), &cfg.update_us.to_string())?;
        let nr = c.join("monitoring_attrs/nr_regions");
        self.write(&nr.join("min"), &cfg.min_nr_regions.to_string())?;
        self.write(&nr.join("max"), &cfg.max_nr_regions.to_string())?;
        self.write(&c.join("targets/nr_targets"), "1")?;
        let t = c.join("targets/0");
        self.write(&t.join("pid_target"), &pid.raw().to_string())?;
        self.write(&t.join("regions/nr_regions"), &regions.len().to_string())?;
        for (k, (start, end)) in regions.iter().enumerate() {
            let r = t.join(format!("regions/{k}"));
            self.write(&r.join("start"), &start.to_string())?;
            self.write(&r.join("end"), &end.to_string())?;
        }
        self.write(&c.join("schemes/nr_schemes"), "1")?;
        let s = c.join("schemes/0");
        self.write(&s.join("action"), "stat")?;
        // The access pattern defaults to 0..=0 everywhere: open every range fully.
        let ap = s.join("access_pattern");
        for (what, max) in [
            ("sz", u64::MAX),
            ("nr_accesses", u64::from(u32::MAX)),
            ("age", u64::from(u32::MAX)),
        ] {
            self.write(&ap.join(what).join("min"), "0")?;
            self.write(&ap.join(what).join("max"), &max.to_string())?;
        }
        Ok(())
    }

    /// Reads the tried regions of scheme 0 of slot `i`, sorted by address.
    fn tried_regions(&self, i: usize) -> Result<Vec<DamonRegion>, Error> {
        let dir = self.ctx(i).join("schemes/0/tried_regions");
        let entries = fs::read_dir(&dir).map_err(|source| Error::Read {
            path: dir.clone(),
            source,
        })?;
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|source| Error::Read {
                path: dir.clone(),
                source,
            })?;
            let name = e.file_name();
            if !name
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            {
                continue;
            }
            let p = e.path();
            let start = self.read_num(&p.join("start"))?;
            let end = self.read_num(&p.join("end"))?;
            out.push(DamonRegion {
                start: HostVirtAddr::new(start),
                end: HostVirtAddr::new(end),
                nr_accesses: self.read_num(&p.join("nr_accesses"))?,
                age: self.read_num(&p.join("age"))?,
            });
        }
        out.sort_by_key(|r| r.start);
        Ok(out)
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

/// Scales `nr_accesses` of a window with `max` samples to 0..=255.
fn scale(nr_accesses: u64, max: u64) -> u8 {
    let max = max.max(1);
    let v = nr_accesses.min(max).saturating_mul(255) / max;
    u8::try_from(v).unwrap_or(u8::MAX)
}

/// Clips `regions` to `ranges` (both sorted) and scales them; appends to `out`.
fn clip_and_scale(
    regions: &[DamonRegion],
    ranges: &[(u64, u64)],
    max: u64,
    out: &mut Vec<RegionAccess>,
) {
    for r in regions {
        for &(s, e) in ranges {
            let lo = r.start.raw().max(s);
            let hi = r.end.raw().min(e);
            if lo < hi {
                out.push(RegionAccess {
                    start: HostVirtAddr::new(lo),
                    len: hi - lo,
                    freq: scale(r.nr_accesses, max),
                });
            }
        }
    }
}

/// Whether `pid` is a live (not zombie) process.
pub(crate) fn process_alive(pid: ProcessId) -> bool {
    match fs::read_to_string(format!("/proc/{}/stat", pid.raw())) {
        // The state follows the ")" that closes the command name.
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

/// The live part of an attached source.
#[derive(Debug)]
struct Attached {
    slot: usize,
    pid: ProcessId,
    ops: &'static str,
    ranges: Vec<(u64, u64)>,
}

/// DAMON `fvaddr` monitoring of a VMM process's guest RAM. See the module docs.
#[derive(Debug)]
pub struct DamonSource {
    config: DamonConfig,
    sysfs: Sysfs,
    attached: Option<Attached>,
    last: Vec<DamonRegion>,
}

impl DamonSource {
    /// A detached source; nothing touches sysfs until [`HotnessSource::attach`].
    pub fn new(config: DamonConfig) -> Self {
        let sysfs = Sysfs {
            root: config.root.clone(),
        };
        Self {
            config,
            sysfs,
            attached: None,
            last: Vec::new(),
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

    /// The raw regions of the last `collect` (unclipped, with `nr_accesses` and `age`).
    pub fn last_regions(&self) -> &[DamonRegion] {
        &self.last
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
        let _guard = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        let slot = self.sysfs.claim(self.config.spare_kdamonds)?;
        let started = self.start(slot, layout.pid, &ranges);
        match started {
            Ok(ops) => {
                log::debug!(
                    "damon: kdamond {slot} ({ops}) on pid {} over {} host ranges",
                    layout.pid,
                    ranges.len()
                );
                self.attached = Some(Attached {
                    slot,
                    pid: layout.pid,
                    ops,
                    ranges,
                });
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

    fn start(
        &self,
        slot: usize,
        pid: ProcessId,
        ranges: &[(u64, u64)],
    ) -> Result<&'static str, Error> {
        let avail = self.sysfs.avail_operations(slot)?;
        let ops = if avail.iter().any(|o| o == "fvaddr") {
            "fvaddr"
        } else if avail.iter().any(|o| o == "vaddr") {
            log::warn!("damon: no fvaddr, using vaddr (monitors the whole address space)");
            "vaddr"
        } else {
            return Err(Error::NoVaddr(avail.join(" ")));
        };
        self.sysfs.configure(slot, ops, &self.config, pid, ranges)?;
        self.sysfs
            .write(&self.sysfs.kdamond(slot).join("state"), "on")?;
        Ok(ops)
    }

    fn try_collect(&mut self, out: &mut Vec<RegionAccess>) -> Result<(), Error> {
        let a = self.attached.as_ref().ok_or(Error::NotAttached)?;
        let state = self.sysfs.kdamond(a.slot).join("state");
        if let Err(e) = self.sysfs.write(&state, "update_schemes_tried_regions") {
            if !process_alive(a.pid) {
                return Err(Error::Gone(a.pid));
            }
            if !self.sysfs.is_on(a.slot).unwrap_or(false) {
                return Err(Error::Stopped(a.slot));
            }
            return Err(e);
        }
        self.last = self.sysfs.tried_regions(a.slot)?;
        clip_and_scale(&self.last, &a.ranges, self.config.max_nr_accesses(), out);
        Ok(())
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
            let _guard = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
            match self.sysfs.release(a.slot) {
                Ok(()) => log::debug!("damon: kdamond {} released", a.slot),
                Err(e) => log::warn!("damon: releasing kdamond {}: {e}", a.slot),
            }
        }
        self.last.clear();
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
pub fn probe(root: &Path) -> Result<&'static str, Error> {
    let sysfs = Sysfs {
        root: root.to_owned(),
    };
    if !sysfs.kdamonds().join("nr_kdamonds").exists() {
        return Err(Error::NoSysfs(root.to_owned()));
    }
    let pick = |avail: &[String]| -> Result<&'static str, Error> {
        if avail.iter().any(|o| o == "fvaddr") {
            Ok("fvaddr")
        } else if avail.iter().any(|o| o == "vaddr") {
            Ok("vaddr")
        } else {
            Err(Error::NoVaddr(avail.join(" ")))
        }
    };
    let _guard = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
    for i in 0..sysfs.nr_kdamonds()? {
        if sysfs.nr_contexts(i)? > 0 {
            return pick(&sysfs.avail_operations(i)?);
        }
    }
    let slot = sysfs.claim(0)?;
    let r = sysfs.avail_operations(slot).and_then(|a| pick(&a));
    sysfs.release(slot)?;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use vmtier_core::{Backing, GuestPhysAddr, GuestRamRange};

    /// A throw-away directory standing in for /sys/kernel/mm/damon/admin.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new() -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let d = std::env::temp_dir().join(format!(
                "vmtier-damon-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&d);
            fs::create_dir_all(d.join("kdamonds")).unwrap();
            Self(d)
        }

        fn put(&self, rel: &str, v: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, v).unwrap();
        }

        fn get(&self, rel: &str) -> String {
            fs::read_to_string(self.0.join(rel))
                .unwrap()
                .trim()
                .to_owned()
        }

        /// `n` kdamonds, each (state, nr_contexts).
        fn with_kdamonds(self, k: &[(&str, u32)]) -> Self {
            self.put("kdamonds/nr_kdamonds", &k.len().to_string());
            for (i, (state, ctxs)) in k.iter().enumerate() {
                self.put(&format!("kdamonds/{i}/state"), state);
                self.put(
                    &format!("kdamonds/{i}/contexts/nr_contexts"),
                    &ctxs.to_string(),
                );
            }
            self
        }

        fn sysfs(&self) -> Sysfs {
            Sysfs {
                root: self.0.clone(),
            }
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn claim_finds_a_free_slot_or_refuses() {
        // (kdamonds, spare, expected slot or error fragment, nr_kdamonds written)
        type Case = (
            Vec<(&'static str, u32)>,
            usize,
            Result<usize, &'static str>,
            &'static str,
        );
        let cases: Vec<Case> = vec![
            (vec![("on", 1), ("off", 0)], 0, Ok(1), "2"),
            (vec![("off", 0)], 3, Ok(0), "1"),
            (vec![("on", 1)], 3, Err("running"), "1"),
            (vec![("off", 1), ("off", 1)], 0, Err("erase"), "2"),
            // Nothing running or configured: grow by one plus the spares.
            (vec![], 3, Ok(0), "4"),
        ];
        for (k, spare, want, nr_after) in cases {
            let f = FakeSysfs::new().with_kdamonds(&k);
            if k.is_empty() {
                // A fake tree does not create directories when nr_kdamonds grows.
                f.put("kdamonds/nr_kdamonds", "0");
                f.put("kdamonds/0/contexts/nr_contexts", "0");
            }
            let got = f.sysfs().claim(spare);
            match (got, want) {
                (Ok(slot), Ok(w)) => {
                    assert_eq!(slot, w, "{k:?}");
                    assert_eq!(f.get(&format!("kdamonds/{slot}/contexts/nr_contexts")), "1");
                }
                (Err(e), Err(frag)) => assert!(e.to_string().contains(frag), "{k:?}: {e}"),
                (got, want) => panic!("{k:?}: got {got:?}, want {want:?}"),
            }
            assert_eq!(f.get("kdamonds/nr_kdamonds"), nr_after, "{k:?}");
        }
        let missing = Sysfs {
            root: PathBuf::from("/nonexistent/damon"),
        };
        assert!(matches!(missing.claim(0), Err(Error::NoSysfs(_))));
    }

    #[test]
    fn release_shrinks_only_when_all_idle() {
        let cases = [
            (vec![("off", 1)], "0"),
            (vec![("off", 1), ("off", 0), ("off", 0)], "0"),
            (vec![("off", 1), ("on", 1)], "2"),
            (vec![("off", 1), ("off", 1)], "2"),
        ];
        for (k, nr_after) in cases {
            let f = FakeSysfs::new().with_kdamonds(&k);
            f.sysfs().release(0).unwrap();
            assert_eq!(f.get("kdamonds/0/contexts/nr_contexts"), "0", "{k:?}");
            assert_eq!(f.get("kdamonds/nr_kdamonds"), nr_after, "{k:?}");
        }
    }

    #[test]
    fn configure_writes_the_context() {
        let f = FakeSysfs::new().with_kdamonds(&[("off", 1)]);
        let c = "kdamonds/0/contexts/0";
        // DAMON creates these files; the fake needs them to exist for OpenOptions::write.
        let files = [
            "operations",
            "monitoring_attrs/intervals/sample_us",
            "monitoring_attrs/intervals/aggr_us",
            "monitoring_attrs/intervals/update_us",
            "monitoring_attrs/nr_regions/min",
            "monitoring_attrs/nr_regions/max",
            "targets/nr_targets",
            "targets/0/pid_target",
            "targets/0/regions/nr_regions",
            "targets/0/regions/0/start",
            "targets/0/regions/0/end",
            "targets/0/regions/1/start",
            "targets/0/regions/1/end",
            "schemes/nr_schemes",
            "schemes/0/action",
        ];
        for p in files {
            f.put(&format!("{c}/{p}"), "");
        }
        for w in ["sz", "nr_accesses", "age"] {
            f.put(&format!("{c}/schemes/0/access_pattern/{w}/min"), "");
            f.put(&format!("{c}/schemes/0/access_pattern/{w}/max"), "");
        }
        let cfg = DamonConfig::default();
        f.sysfs()
            .configure(
                0,
                "fvaddr",
                &cfg,
                ProcessId::new(42),
                &[(0x1000, 0x3000), (0x9000, 0xa000)],
            )
            .unwrap();
        let want = [
            ("operations", "fvaddr"),
            ("monitoring_attrs/intervals/sample_us", "5000"),
            ("monitoring_attrs/intervals/aggr_us", "100000"),
            ("monitoring_attrs/nr_regions/max", "1000"),
            ("targets/0/pid_target", "42"),
            ("targets/0/regions/nr_regions", "2"),
            ("targets/0/regions/0/start", "4096"),
            ("targets/0/regions/1/end", "40960"),
            ("schemes/0/action", "stat"),
            ("schemes/0/access_pattern/sz/max", "18446744073709551615"),
            ("schemes/0/access_pattern/nr_accesses/max", "4294967295"),
        ];
        for (p, v) in want {
            assert_eq!(f.get(&format!("{c}/{p}")), v, "{p}");
        }
    }

    #[test]
    fn tried_regions_are_parsed_sorted_and_clipped() {
        let f = FakeSysfs::new().with_kdamonds(&[("on", 1)]);
        let t = "kdamonds/0/contexts/0/schemes/0/tried_regions";
        // Directory order is arbitrary: write them out of order.
        let regions = [(1, 0x3000, 0x8000, 20, 7), (0, 0x0, 0x3000, 5, 1)];
        for (i, s, e, n, a) in regions {
            f.put(&format!("{t}/{i}/start"), &s.to_string());
            f.put(&format!("{t}/{i}/end"), &e.to_string());
            f.put(&format!("{t}/{i}/nr_accesses"), &n.to_string());
            f.put(&format!("{t}/{i}/age"), &a.to_string());
        }
        f.put(&format!("{t}/total_bytes"), "32768");
        let got = f.sysfs().tried_regions(0).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].start.raw(), got[0].nr_accesses, got[0].age),
            (0, 5, 1)
        );
        assert_eq!((got[1].end.raw(), got[1].nr_accesses), (0x8000, 20));

        let mut out = Vec::new();
        clip_and_scale(&got, &[(0x1000, 0x2000), (0x4000, 0x9000)], 20, &mut out);
        let want = [(0x1000, 0x1000, 63), (0x4000, 0x4000, 255)];
        let got: Vec<_> = out.iter().map(|a| (a.start.raw(), a.len, a.freq)).collect();
        assert_eq!(got, want);

        f.put(&format!("{t}/2/start"), "bogus");
        assert!(matches!(
            f.sysfs().tried_regions(0),
            Err(Error::Parse { .. })
        ));
    }

    #[test]
    fn scaling_and_host_ranges() {
        let cases = [
            (0, 20, 0),
            (1, 20, 12),
            (10, 20, 127),
            (20, 20, 255),
            (40, 20, 255),
            (3, 0, 255),
        ];
        for (n, max, want) in cases {
            assert_eq!(scale(n, max), want, "{n}/{max}");
        }
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
        let cases = [
            DamonConfig {
                sample_us: 0,
                ..base.clone()
            },
            DamonConfig {
                aggr_us: 1000,
                ..base.clone()
            },
            DamonConfig {
                min_nr_regions: 2,
                ..base.clone()
            },
            DamonConfig {
                max_nr_regions: 5,
                ..base.clone()
            },
        ];
        for c in cases {
            assert!(matches!(c.validate(), Err(Error::Config(_))), "{c:?}");
        }
        assert!(base.validate().is_ok());
        assert_eq!(base.max_nr_accesses(), 20);
    }

    #[test]
    fn unattached_source_says_so() {
        let mut s = DamonSource::new(DamonConfig::default());
        let mut out = Vec::new();
        assert!(matches!(s.try_collect(&mut out), Err(Error::NotAttached)));
    }
}
