//! The DAMON sysfs driver (`/sys/kernel/mm/damon/admin`): kdamond slots, one context per
//! slot with its targets and DAMOS schemes, state commands, tried regions and scheme stats.
//! vmtierd's DAMON source and the e2e benchmark's DAMOS baseline both go through it.
//!
//! Writing `nr_kdamonds` rebuilds *every* kdamond directory and fails with `EBUSY` while any
//! kdamond runs. So [`Sysfs::claim`] first looks for a slot that is off and has no context;
//! only if there is none, and no kdamond runs and none is configured (nothing to lose), it
//! grows `nr_kdamonds` by one plus spare empty slots that later claims (other VMs) can take
//! while this one runs. [`Sysfs::release`] turns a slot off, drops its context, and sets
//! `nr_kdamonds` back to 0 when every slot is off and empty. Claims and releases within one
//! process are serialized; two processes claiming at the same instant can still race.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use vmtier_core::{HostVirtAddr, ProcessId};

/// Where the DAMON sysfs admin directory lives.
pub const DEFAULT_ROOT: &str = "/sys/kernel/mm/damon/admin";

/// Serializes slot claims and releases within this process.
static SLOTS: Mutex<()> = Mutex::new(());

/// Errors of the DAMON sysfs driver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No DAMON sysfs interface.
    #[error("No DAMON sysfs at {0}")]
    NoSysfs(PathBuf),
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
}

/// Monitoring attributes of a context. Defaults are DAMON's own (5 ms / 100 ms / 1 s,
/// 10 ..= 1000 regions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attrs {
    /// Access-check sampling interval, µs.
    pub sample_us: u64,
    /// Aggregation interval, µs.
    pub aggr_us: u64,
    /// Operations update interval, µs.
    pub update_us: u64,
    /// Minimum number of regions.
    pub min_nr_regions: u64,
    /// Maximum number of regions.
    pub max_nr_regions: u64,
}

impl Default for Attrs {
    fn default() -> Self {
        Self {
            sample_us: 5_000,
            aggr_us: 100_000,
            update_us: 1_000_000,
            min_nr_regions: 10,
            max_nr_regions: 1000,
        }
    }
}

impl Attrs {
    /// The largest `nr_accesses` a region can reach in one aggregation window.
    pub fn max_nr_accesses(&self) -> u64 {
        (self.aggr_us / self.sample_us.max(1)).max(1)
    }
}

/// One monitoring target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// The process (`vaddr`/`fvaddr`); `None` for `paddr`.
    pub pid: Option<ProcessId>,
    /// Initial regions `[start, end)`; the monitored ranges with `fvaddr`/`paddr`.
    pub regions: Vec<(u64, u64)>,
}

/// A DAMOS access pattern: inclusive ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessPattern {
    /// Region size, bytes.
    pub sz: (u64, u64),
    /// Accesses per aggregation window.
    pub nr_accesses: (u64, u64),
    /// Age, aggregation windows.
    pub age: (u64, u64),
}

impl AccessPattern {
    /// Matches every region. (The sysfs defaults are 0 ..= 0, which match nothing.)
    pub const ANY: Self = Self {
        sz: (0, u64::MAX),
        nr_accesses: (0, u32::MAX as u64),
        age: (0, u32::MAX as u64),
    };
}

/// A DAMOS quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Time quota, ms (0 = none).
    pub ms: u64,
    /// Size quota, bytes per reset interval (0 = none).
    pub bytes: u64,
    /// Charge reset interval, ms.
    pub reset_interval_ms: u64,
    /// Prioritization weights (size, access frequency, age), permille.
    pub weights: (u32, u32, u32),
}

/// A DAMOS filter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Memory of a memory cgroup (path relative to the cgroup root).
    Memcg {
        /// The cgroup.
        path: String,
        /// Filter out what matches (true) or what does not (false).
        matching: bool,
    },
    /// A physical (or virtual) address range.
    Addr {
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// Filter out what matches (true) or what does not (false).
        matching: bool,
    },
}

/// One DAMOS scheme.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheme {
    /// `stat`, `migrate_hot`, `migrate_cold`, `pageout`, ...
    pub action: &'static str,
    /// Destination node of `migrate_*` actions.
    pub target_nid: Option<u32>,
    /// Which regions it applies to.
    pub pattern: AccessPattern,
    /// Its quota, if any.
    pub quota: Option<Quota>,
    /// Its filters.
    pub filters: Vec<Filter>,
}

impl Scheme {
    /// A `stat` scheme over every region: changes nothing, makes the kdamond record the
    /// regions it tried ([`Sysfs::tried_regions`]).
    pub fn stat_all() -> Self {
        Self {
            action: "stat",
            target_nid: None,
            pattern: AccessPattern::ANY,
            quota: None,
            filters: Vec::new(),
        }
    }
}

/// What one kdamond runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    /// Operation set: `vaddr`, `fvaddr` or `paddr`.
    pub ops: String,
    /// Monitoring attributes.
    pub attrs: Attrs,
    /// Targets.
    pub targets: Vec<Target>,
    /// Schemes.
    pub schemes: Vec<Scheme>,
}

/// One region a scheme tried in the last aggregation window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TriedRegion {
    /// First byte.
    pub start: HostVirtAddr,
    /// One past the last byte.
    pub end: HostVirtAddr,
    /// Samples that found the region accessed (0 ..= [`Attrs::max_nr_accesses`]).
    pub nr_accesses: u64,
    /// Aggregation windows the region's access level has stayed about the same.
    pub age: u64,
}

/// Counters of one scheme (`update_schemes_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchemeStats {
    /// Regions tried.
    pub nr_tried: u64,
    /// Bytes tried.
    pub sz_tried: u64,
    /// Regions the action was applied to.
    pub nr_applied: u64,
    /// Bytes the action was applied to.
    pub sz_applied: u64,
    /// Times the quota was exceeded.
    pub qt_exceeds: u64,
}

/// A DAMON sysfs tree (the real one, or a directory standing in for it in tests).
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// The tree at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Its root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn kdamonds(&self) -> PathBuf {
        self.root.join("kdamonds")
    }

    /// The directory of kdamond `i`.
    pub fn kdamond(&self, i: usize) -> PathBuf {
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
    /// with trylock, and in 6.12 one `update_schemes_*` request holds it for up to an
    /// aggregation interval, so another VM's request makes a write fail transiently).
    pub fn write(&self, path: &Path, value: &str) -> Result<(), Error> {
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

    /// Whether the tree has a `kdamonds/nr_kdamonds` file.
    pub fn exists(&self) -> bool {
        self.kdamonds().join("nr_kdamonds").exists()
    }

    /// Number of kdamond slots.
    pub fn nr_kdamonds(&self) -> Result<usize, Error> {
        let p = self.kdamonds().join("nr_kdamonds");
        let n = self.read_num(&p)?;
        usize::try_from(n).map_err(|_| Error::Parse {
            path: p,
            value: n.to_string(),
        })
    }

    /// Whether kdamond `i` runs.
    pub fn is_on(&self, i: usize) -> Result<bool, Error> {
        Ok(self.read(&self.kdamond(i).join("state"))? == "on")
    }

    /// Sends kdamond `i` a state command (`on`, `off`, `commit`, `update_schemes_stats`,
    /// `update_schemes_tried_regions`, ...). Update commands return once the kdamond has
    /// handled them, at the end of its next aggregation window.
    pub fn command(&self, i: usize, cmd: &str) -> Result<(), Error> {
        self.write(&self.kdamond(i).join("state"), cmd)
    }

    /// The pid of kdamond `i`'s thread while it runs.
    pub fn kdamond_pid(&self, i: usize) -> Result<Option<i32>, Error> {
        let p = self.kdamond(i).join("pid");
        let v = self.read(&p)?;
        match v.parse::<i32>() {
            Ok(pid) if pid > 0 => Ok(Some(pid)),
            Ok(_) => Ok(None),
            Err(_) => Err(Error::Parse { path: p, value: v }),
        }
    }

    fn nr_contexts(&self, i: usize) -> Result<u64, Error> {
        self.read_num(&self.kdamond(i).join("contexts/nr_contexts"))
    }

    /// Claims a kdamond slot: an existing free one, or a new one with `spare` more empty
    /// slots. The slot gets one (empty) context.
    pub fn claim(&self, spare: usize) -> Result<usize, Error> {
        let _guard = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        if !self.exists() {
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
    pub fn release(&self, i: usize) -> Result<(), Error> {
        let _guard = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        let mut first = None;
        if self.is_on(i).unwrap_or(false) {
            if let Err(e) = self.command(i, "off") {
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
    pub fn avail_operations(&self, i: usize) -> Result<Vec<String>, Error> {
        let s = self.read(&self.ctx(i).join("avail_operations"))?;
        Ok(s.split_whitespace().map(str::to_owned).collect())
    }

    /// Writes the whole context of slot `i` (which must be off).
    pub fn configure(&self, i: usize, c: &Context) -> Result<(), Error> {
        let d = self.ctx(i);
        let w = |rel: &str, v: &str| self.write(&d.join(rel), v);
        w("operations", &c.ops)?;
        let a = &c.attrs;
        w(
            "monitoring_attrs/intervals/sample_us",
            &a.sample_us.to_string(),
        )?;
        w("monitoring_attrs/intervals/aggr_us", &a.aggr_us.to_string())?;
        w(
            "monitoring_attrs/intervals/update_us",
            &a.update_us.to_string(),
        )?;
        w(
            "monitoring_attrs/nr_regions/min",
            &a.min_nr_regions.to_string(),
        )?;
        w(
            "monitoring_attrs/nr_regions/max",
            &a.max_nr_regions.to_string(),
        )?;
        w("targets/nr_targets", &c.targets.len().to_string())?;
        for (k, t) in c.targets.iter().enumerate() {
            let p = format!("targets/{k}");
            if let Some(pid) = t.pid {
                w(&format!("{p}/pid_target"), &pid.raw().to_string())?;
            }
            w(
                &format!("{p}/regions/nr_regions"),
                &t.regions.len().to_string(),
            )?;
            for (r, (start, end)) in t.regions.iter().enumerate() {
                w(&format!("{p}/regions/{r}/start"), &start.to_string())?;
                w(&format!("{p}/regions/{r}/end"), &end.to_string())?;
            }
        }
        w("schemes/nr_schemes", &c.schemes.len().to_string())?;
        for (k, s) in c.schemes.iter().enumerate() {
            self.configure_scheme(&d.join(format!("schemes/{k}")), s)?;
        }
        Ok(())
    }

    fn configure_scheme(&self, d: &Path, s: &Scheme) -> Result<(), Error> {
        let w = |rel: &str, v: &str| self.write(&d.join(rel), v);
        w("action", s.action)?;
        if let Some(nid) = s.target_nid {
            w("target_nid", &nid.to_string())?;
        }
        let p = &s.pattern;
        for (what, (lo, hi)) in [("sz", p.sz), ("nr_accesses", p.nr_accesses), ("age", p.age)] {
            // Max first: a min above the current max is refused by some kernels.
            w(&format!("access_pattern/{what}/max"), &hi.to_string())?;
            w(&format!("access_pattern/{what}/min"), &lo.to_string())?;
        }
        if let Some(q) = &s.quota {
            w("quotas/ms", &q.ms.to_string())?;
            w("quotas/bytes", &q.bytes.to_string())?;
            w("quotas/reset_interval_ms", &q.reset_interval_ms.to_string())?;
            w("quotas/weights/sz_permil", &q.weights.0.to_string())?;
            w(
                "quotas/weights/nr_accesses_permil",
                &q.weights.1.to_string(),
            )?;
            w("quotas/weights/age_permil", &q.weights.2.to_string())?;
        }
        if !s.filters.is_empty() || d.join("filters/nr_filters").exists() {
            w("filters/nr_filters", &s.filters.len().to_string())?;
        }
        let yn = |b: bool| if b { "Y" } else { "N" };
        for (j, f) in s.filters.iter().enumerate() {
            let p = format!("filters/{j}");
            match f {
                Filter::Memcg { path, matching } => {
                    w(&format!("{p}/type"), "memcg")?;
                    w(&format!("{p}/memcg_path"), path)?;
                    w(&format!("{p}/matching"), yn(*matching))?;
                }
                Filter::Addr {
                    start,
                    end,
                    matching,
                } => {
                    w(&format!("{p}/type"), "addr")?;
                    w(&format!("{p}/addr_start"), &start.to_string())?;
                    w(&format!("{p}/addr_end"), &end.to_string())?;
                    w(&format!("{p}/matching"), yn(*matching))?;
                }
            }
        }
        Ok(())
    }

    /// Whether scheme `k` of slot `i` has quota goals whose metric can be `metric`
    /// (`node_mem_used_bp` needs Linux 6.16): probed by writing it, then removed again.
    pub fn quota_goal_supported(&self, i: usize, k: usize, metric: &str) -> bool {
        let q = self.ctx(i).join(format!("schemes/{k}/quotas/goals"));
        if !q.join("nr_goals").exists() || self.write(&q.join("nr_goals"), "1").is_err() {
            return false;
        }
        let ok = self.write(&q.join("0/target_metric"), metric).is_ok();
        let _ = self.write(&q.join("nr_goals"), "0");
        ok
    }

    /// The regions scheme `k` of slot `i` tried, as of the last
    /// `update_schemes_tried_regions` command, sorted by address.
    pub fn tried_regions(&self, i: usize, k: usize) -> Result<Vec<TriedRegion>, Error> {
        let dir = self.ctx(i).join(format!("schemes/{k}/tried_regions"));
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
            out.push(TriedRegion {
                start: HostVirtAddr::new(self.read_num(&p.join("start"))?),
                end: HostVirtAddr::new(self.read_num(&p.join("end"))?),
                nr_accesses: self.read_num(&p.join("nr_accesses"))?,
                age: self.read_num(&p.join("age"))?,
            });
        }
        out.sort_by_key(|r| r.start);
        Ok(out)
    }

    /// The stats of scheme `k` of slot `i`, as of the last `update_schemes_stats`.
    pub fn scheme_stats(&self, i: usize, k: usize) -> Result<SchemeStats, Error> {
        let d = self.ctx(i).join(format!("schemes/{k}/stats"));
        let n = |f: &str| self.read_num(&d.join(f));
        Ok(SchemeStats {
            nr_tried: n("nr_tried")?,
            sz_tried: n("sz_tried")?,
            nr_applied: n("nr_applied")?,
            sz_applied: n("sz_applied")?,
            qt_exceeds: n("qt_exceeds")?,
        })
    }

    /// Number of kdamonds that run.
    pub fn running(&self) -> usize {
        let n = self.nr_kdamonds().unwrap_or(0);
        (0..n).filter(|&i| self.is_on(i).unwrap_or(false)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

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
            Sysfs::new(self.0.clone())
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
        let missing = Sysfs::new("/nonexistent/damon");
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
        let mut files: Vec<String> = [
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
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        for k in 0..2 {
            for p in ["action", "target_nid", "filters/nr_filters"] {
                files.push(format!("schemes/{k}/{p}"));
            }
            for w in ["sz", "nr_accesses", "age"] {
                for m in ["min", "max"] {
                    files.push(format!("schemes/{k}/access_pattern/{w}/{m}"));
                }
            }
        }
        for q in [
            "ms",
            "bytes",
            "reset_interval_ms",
            "weights/sz_permil",
            "weights/nr_accesses_permil",
            "weights/age_permil",
        ] {
            files.push(format!("schemes/1/quotas/{q}"));
        }
        for p in ["type", "addr_start", "addr_end", "matching"] {
            files.push(format!("schemes/1/filters/0/{p}"));
        }
        for p in files {
            f.put(&format!("{c}/{p}"), "");
        }
        let ctx = Context {
            ops: "fvaddr".into(),
            attrs: Attrs::default(),
            targets: vec![Target {
                pid: Some(ProcessId::new(42)),
                regions: vec![(0x1000, 0x3000), (0x9000, 0xa000)],
            }],
            schemes: vec![
                Scheme::stat_all(),
                Scheme {
                    action: "migrate_hot",
                    target_nid: Some(0),
                    pattern: AccessPattern {
                        nr_accesses: (5, 20),
                        ..AccessPattern::ANY
                    },
                    quota: Some(Quota {
                        ms: 0,
                        bytes: 64 << 20,
                        reset_interval_ms: 1000,
                        weights: (0, 1000, 1000),
                    }),
                    filters: vec![Filter::Addr {
                        start: 0,
                        end: 4096,
                        matching: true,
                    }],
                },
            ],
        };
        f.sysfs().configure(0, &ctx).unwrap();
        let want = [
            ("operations", "fvaddr"),
            ("monitoring_attrs/intervals/sample_us", "5000"),
            ("monitoring_attrs/intervals/aggr_us", "100000"),
            ("monitoring_attrs/nr_regions/max", "1000"),
            ("targets/0/pid_target", "42"),
            ("targets/0/regions/nr_regions", "2"),
            ("targets/0/regions/0/start", "4096"),
            ("targets/0/regions/1/end", "40960"),
            ("schemes/nr_schemes", "2"),
            ("schemes/0/action", "stat"),
            ("schemes/0/access_pattern/sz/max", "18446744073709551615"),
            ("schemes/0/access_pattern/nr_accesses/max", "4294967295"),
            ("schemes/0/filters/nr_filters", "0"),
            ("schemes/1/action", "migrate_hot"),
            ("schemes/1/target_nid", "0"),
            ("schemes/1/access_pattern/nr_accesses/min", "5"),
            ("schemes/1/quotas/bytes", "67108864"),
            ("schemes/1/filters/nr_filters", "1"),
            ("schemes/1/filters/0/type", "addr"),
            ("schemes/1/filters/0/matching", "Y"),
        ];
        for (p, v) in want {
            assert_eq!(f.get(&format!("{c}/{p}")), v, "{p}");
        }
    }

    #[test]
    fn tried_regions_and_stats_are_parsed() {
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
        let got = f.sysfs().tried_regions(0, 0).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].start.raw(), got[0].nr_accesses, got[0].age),
            (0, 5, 1)
        );
        assert_eq!((got[1].end.raw(), got[1].nr_accesses), (0x8000, 20));
        f.put(&format!("{t}/2/start"), "bogus");
        assert!(matches!(
            f.sysfs().tried_regions(0, 0),
            Err(Error::Parse { .. })
        ));

        let s = "kdamonds/0/contexts/0/schemes/0/stats";
        for (k, v) in [
            ("nr_tried", 3),
            ("sz_tried", 4096),
            ("nr_applied", 2),
            ("sz_applied", 8192),
            ("qt_exceeds", 1),
        ] {
            f.put(&format!("{s}/{k}"), &v.to_string());
        }
        let st = f.sysfs().scheme_stats(0, 0).unwrap();
        assert_eq!((st.nr_tried, st.sz_applied, st.qt_exceeds), (3, 8192, 1));
        f.put("kdamonds/0/pid", "4321");
        assert_eq!(f.sysfs().kdamond_pid(0).unwrap(), Some(4321));
        f.put("kdamonds/0/pid", "-1");
        assert_eq!(f.sysfs().kdamond_pid(0).unwrap(), None);
    }
}
