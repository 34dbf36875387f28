//! The guest's own DAMON with the `paddr` operations: one kdamond over the guest's System
//! RAM (from `/proc/iomem`) with a `stat` scheme over every region; at each snapshot the
//! agent asks for the regions the scheme tried and sends the hot ones as HOT, hottest
//! first, weight scaled from `nr_accesses`.

use std::fs;

use vmtier_sources::damon::sysfs::{self, Context, Scheme, Target};
use vmtier_sources::damon::{Attrs, Sysfs};

use crate::config::DamonConfig;
use crate::ranges::{Hint, Kind, Pfn, PfnRange, Source, PAGE};

/// Errors of the DAMON source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// DAMON sysfs refused something.
    #[error("DAMON sysfs")]
    Sysfs(#[from] sysfs::Error),
    /// This kernel's DAMON has no `paddr` operations.
    #[error("No paddr operations (offered: {0})")]
    NoPaddr(String),
    /// No System RAM in /proc/iomem (not root?).
    #[error("No System RAM ranges readable in /proc/iomem")]
    NoRam,
}

/// A running `paddr` kdamond.
#[derive(Debug)]
pub struct Damon {
    sysfs: Sysfs,
    slot: usize,
    attrs: Attrs,
    cfg: DamonConfig,
}

/// Top-level `System RAM` ranges of `/proc/iomem`, `[start, end)`.
pub fn system_ram(iomem: &str) -> Vec<(u64, u64)> {
    iomem
        .lines()
        .filter(|l| !l.starts_with(' ') && l.trim_end().ends_with(": System RAM"))
        .filter_map(|l| {
            let (a, b) = l.split(':').next()?.trim().split_once('-')?;
            let s = u64::from_str_radix(a, 16).ok()?;
            let e = u64::from_str_radix(b, 16).ok()?.checked_add(1)?;
            (e > s && e > 0).then_some((s, e))
        })
        .collect()
}

impl Damon {
    /// Claims a kdamond slot, configures `paddr` over System RAM and turns it on.
    pub fn start(cfg: &DamonConfig) -> Result<Self, Error> {
        let sysfs = Sysfs::new(&cfg.sysfs);
        let ram = system_ram(&fs::read_to_string("/proc/iomem").unwrap_or_default());
        if ram.iter().all(|r| r.0 == 0 && r.1 <= 1) {
            return Err(Error::NoRam);
        }
        let slot = sysfs.claim(0)?;
        let ops = sysfs.avail_operations(slot).unwrap_or_default();
        if !ops.iter().any(|o| o == "paddr") {
            let _ = sysfs.release(slot);
            return Err(Error::NoPaddr(ops.join(" ")));
        }
        let attrs = Attrs {
            sample_us: cfg.sample_us,
            aggr_us: cfg.aggr_us,
            ..Attrs::default()
        };
        let ctx = Context {
            ops: "paddr".into(),
            attrs,
            targets: vec![Target {
                pid: None,
                regions: ram,
            }],
            schemes: vec![Scheme::stat_all()],
        };
        let r = sysfs
            .configure(slot, &ctx)
            .and_then(|()| sysfs.command(slot, "on"));
        if let Err(e) = r {
            let _ = sysfs.release(slot);
            return Err(e.into());
        }
        Ok(Self {
            sysfs,
            slot,
            attrs,
            cfg: cfg.clone(),
        })
    }

    /// The kdamond slot in use.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The hot regions now (blocks up to one aggregation interval).
    pub fn snapshot(&self) -> Result<Vec<Hint>, Error> {
        self.sysfs
            .command(self.slot, "update_schemes_tried_regions")?;
        let regions = self.sysfs.tried_regions(self.slot, 0)?;
        let max = self.attrs.max_nr_accesses();
        Ok(hot_hints(
            regions
                .iter()
                .map(|r| (r.start.raw(), r.end.raw(), r.nr_accesses)),
            max,
            &self.cfg,
        ))
    }

    /// Turns the kdamond off and gives the slot back.
    pub fn stop(&self) {
        if let Err(e) = self.sysfs.release(self.slot) {
            log::warn!("guest DAMON: releasing kdamond {} failed: {e}", self.slot);
        }
    }
}

/// Hot regions (`nr_accesses` ≥ hot_permille of `max`) as page-aligned HOT hints, hottest
/// first, at most `max_ranges`, then sorted by address.
pub fn hot_hints(
    regions: impl Iterator<Item = (u64, u64, u64)>,
    max: u64,
    cfg: &DamonConfig,
) -> Vec<Hint> {
    let max = max.max(1);
    let mut hot: Vec<(u64, PfnRange)> = regions
        .filter(|&(_, _, n)| n.saturating_mul(1000) >= u64::from(cfg.hot_permille) * max && n > 0)
        .filter_map(|(s, e, n)| {
            // Whole pages inside the region only.
            let first = s.checked_add(PAGE - 1)? / PAGE;
            let last = e / PAGE;
            (last > first).then_some((
                n,
                PfnRange {
                    start: Pfn(first),
                    pages: last - first,
                },
            ))
        })
        .collect();
    hot.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.start.cmp(&b.1.start)));
    hot.truncate(cfg.max_ranges);
    let mut out: Vec<Hint> = hot
        .into_iter()
        .map(|(n, range)| Hint {
            range,
            kind: Kind::Hot,
            weight: u8::try_from((n.min(max) * 254 / max) + 1).unwrap_or(255),
            source: Source::GuestDamon,
        })
        .collect();
    out.sort_by_key(|h| h.range.start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_system_ram() {
        let iomem = "00000000-00000fff : Reserved\n\
                     00001000-0009fbff : System RAM\n\
                     00100000-7ffdffff : System RAM\n\
                       01000000-01ffffff : Kernel code\n\
                     100000000-17fffffff : System RAM\n";
        assert_eq!(
            system_ram(iomem),
            vec![
                (0x1000, 0x9fc00),
                (0x100000, 0x7ffe0000),
                (0x100000000, 0x180000000)
            ]
        );
        // Without root, addresses read as zeros.
        assert_eq!(system_ram("00000000-00000000 : System RAM\n"), vec![(0, 1)]);
    }

    #[test]
    fn picks_hot_regions() {
        let cfg = DamonConfig {
            hot_permille: 500,
            max_ranges: 2,
            ..DamonConfig::default()
        };
        // (start, end, nr_accesses) with max 20: hot means >= 10.
        let regions = [
            (0x1000, 0x5000, 20),
            (0x5000, 0x9000, 9),
            (0x9800, 0xc000, 10),
            (0x10000, 0x10800, 20),
            (0x20000, 0x30000, 15),
        ];
        let h = hot_hints(regions.into_iter(), 20, &cfg);
        let got: Vec<_> = h
            .iter()
            .map(|h| (h.range.start.0, h.range.pages, h.weight))
            .collect();
        // The sub-page region is dropped; of the rest the two hottest are kept.
        assert_eq!(got, vec![(1, 4, 255), (0x20, 16, 191)]);
    }
}
