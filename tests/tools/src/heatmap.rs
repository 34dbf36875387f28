//! The heatmap checks of the `api` case: vmtierd's tick ring fetched over HTTP
//! (`GET /v1/vms/{vm}/heatmap`) and drawn by `vmtierctl heatmap` as SVG and PNG. Judged from
//! the data: over the last ticks the buckets inside the guest's hot set (whose guest-physical
//! range the guest itself reports) must be hotter and more in DRAM than the buckets outside
//! it, and the hot set's share in DRAM must agree with what move_pages says from outside.

use std::path::Path;
use std::time::Instant;

use vmtier_api::heatmap::{Heatmap, DRAM_SCALE};
use vmtier_api::proto::{Reply, Response};

use crate::check::Checks;
use crate::daemon::Daemon;

/// Ticks of the ring that [`check`] judges: the last ones.
pub const JUDGED_TICKS: usize = 5;

/// Mean heat and DRAM share of the hot and the cold buckets over the last ticks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judged {
    /// Mean of `heat_max` over the hot set's buckets (0-31).
    pub hot_heat: f64,
    /// The same over the buckets wholly outside it.
    pub cold_heat: f64,
    /// Mean share in DRAM of the hot set's buckets (0-1).
    pub hot_dram: f64,
    /// The same outside it.
    pub cold_dram: f64,
    /// Hot and cold buckets.
    pub buckets: (usize, usize),
    /// Ticks judged.
    pub ticks: usize,
}

impl Judged {
    /// Whether the hot set shows up where it is.
    pub fn shows_hot_set(&self) -> bool {
        self.buckets.0 > 0
            && self.buckets.1 > 0
            && self.hot_heat > self.cold_heat + 4.0
            && self.hot_dram > self.cold_dram
            && self.hot_dram >= 0.8
    }
}

/// Judges the last `last` ticks of `h` against the hot set `[start, start + len)`.
#[allow(clippy::cast_precision_loss)]
pub fn judge(h: &Heatmap, hot: (u64, u64), last: usize) -> Option<Judged> {
    let hot_b = h.buckets_within(hot.0, hot.0.saturating_add(hot.1));
    let cold_b: Vec<usize> = (0..h.buckets.len())
        .filter(|&i| {
            let b = h.buckets[i];
            b.gpa.saturating_add(b.bytes) <= hot.0 || b.gpa >= hot.0.saturating_add(hot.1)
        })
        .collect();
    let rows = &h.ticks[h.ticks.len().saturating_sub(last)..];
    if rows.is_empty() || hot_b.is_empty() || cold_b.is_empty() {
        return None;
    }
    let mean = |idx: &[usize], f: &dyn Fn(&vmtier_api::heatmap::TickRow, usize) -> f64| {
        let sum: f64 = rows
            .iter()
            .flat_map(|r| idx.iter().map(move |&i| f(r, i)))
            .sum();
        sum / (rows.len() * idx.len()) as f64
    };
    let heat = |r: &vmtier_api::heatmap::TickRow, i: usize| f64::from(r.heat_max[i]);
    let dram =
        |r: &vmtier_api::heatmap::TickRow, i: usize| f64::from(r.dram[i]) / f64::from(DRAM_SCALE);
    Some(Judged {
        hot_heat: mean(&hot_b, &heat),
        cold_heat: mean(&cold_b, &heat),
        hot_dram: mean(&hot_b, &dram),
        cold_dram: mean(&cold_b, &dram),
        buckets: (hot_b.len(), cold_b.len()),
        ticks: rows.len(),
    })
}

/// The checks: `http` is the body of `GET /v1/vms/guest/heatmap`, `outside` the hot set's
/// share in DRAM seen from outside; the images go to `dir` as `heatmap-{tag}.svg|png`.
pub fn check(
    c: &mut Checks,
    d: &Daemon,
    http: &str,
    hot: (u64, u64),
    outside: f64,
    dir: &Path,
    tag: &str,
) {
    let h: Option<Heatmap> = serde_json::from_str(http).ok();
    let j = h.as_ref().and_then(|h| judge(h, hot, JUDGED_TICKS));
    c.check(
        j.is_some_and(|j| j.shows_hot_set() && outside >= 0.8),
        &format!("{tag}: the heatmap shows the hot set hotter and more in DRAM than the rest"),
        match (&h, j) {
            (Some(h), Some(j)) => format!(
                "{} ticks × {} buckets; last {} ticks: hot set ({} buckets) heat {:.1}, {:.0}% in DRAM \
                 (outside: {:.0}%); rest ({} buckets) heat {:.1}, {:.0}% in DRAM",
                h.ticks.len(),
                h.buckets.len(),
                j.ticks,
                j.buckets.0,
                j.hot_heat,
                100.0 * j.hot_dram,
                100.0 * outside,
                j.buckets.1,
                j.cold_heat,
                100.0 * j.cold_dram
            ),
            _ => format!("cannot judge: {}", http.chars().take(300).collect::<String>()),
        },
    );

    // vmtierctl draws the same ring: SVG and PNG, and its JSON has the same buckets.
    let svg = dir.join(format!("heatmap-{tag}.svg"));
    let png = dir.join(format!("heatmap-{tag}.png"));
    let t = Instant::now();
    let (ok_svg, out_svg) = d.ctl(&["heatmap", "guest", "--out", &svg.to_string_lossy()]);
    let svg_ms = t.elapsed().as_millis();
    let t = Instant::now();
    let (ok_png, out_png) = d.ctl(&[
        "heatmap",
        "guest",
        "--out",
        &png.to_string_lossy(),
        "--ticks",
        "20",
    ]);
    let png_ms = t.elapsed().as_millis();
    let text = std::fs::read_to_string(&svg).unwrap_or_default();
    let rects = text.matches("<rect").count();
    let buckets = h.as_ref().map_or(0, |h| h.buckets.len());
    c.check(
        ok_svg
            && text.starts_with("<svg")
            && text.trim_end().ends_with("</svg>")
            && text.contains("guest: budget")
            && rects >= 2 * buckets
            && buckets > 0,
        &format!("{tag}: vmtierctl heatmap writes an SVG with a cell per bucket and tick run"),
        format!(
            "{} bytes, {rects} rects for {buckets} buckets, vmtierctl took {svg_ms} ms: {}",
            text.len(),
            out_svg.trim()
        ),
    );
    let decoded = std::fs::File::open(&png)
        .ok()
        .and_then(|f| {
            png::Decoder::new(std::io::BufReader::new(f))
                .read_info()
                .ok()
        })
        .map(|r| (r.info().width, r.info().height));
    c.check(
        ok_png && decoded == Some((960, 720)),
        &format!("{tag}: vmtierctl heatmap writes a PNG that decodes at 960x720"),
        format!(
            "{decoded:?}, vmtierctl took {png_ms} ms: {}",
            out_png.trim()
        ),
    );
    let (ok_json, json) = d.ctl(&[
        "--json",
        "heatmap",
        "guest",
        "--out",
        &dir.join(format!("heatmap-{tag}-json.svg"))
            .to_string_lossy(),
    ]);
    let via_ctl = serde_json::from_str::<Response>(json.lines().next().unwrap_or_default())
        .ok()
        .and_then(|r| match r {
            Response::Ok(Reply::Heatmap(h)) => Some(*h),
            _ => None,
        });
    c.check(
        ok_json
            && via_ctl
                .as_ref()
                .zip(h.as_ref())
                .is_some_and(|(a, b)| a.buckets == b.buckets && a.ranges == b.ranges),
        &format!("{tag}: the control socket and HTTP give the same buckets and ranges"),
        format!(
            "{} buckets via vmtierctl, {buckets} via HTTP",
            via_ctl.map_or(0, |h| h.buckets.len())
        ),
    );
    let (bad_ok, bad) = d.ctl(&["heatmap", "guest", "--out", "/tmp/x.jpg"]);
    c.check(
        !bad_ok && bad.contains(".svg or .png"),
        &format!("{tag}: vmtierctl heatmap refuses an unknown image format"),
        bad.trim(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_api::heatmap::{HeatmapBucket, TickRow};

    /// 8 buckets of 1 MiB; per bucket (heat, dram) for every tick.
    fn map(cells: &[(u8, u8)]) -> Heatmap {
        Heatmap {
            vm: "guest".parse().unwrap(),
            policy: "default".into(),
            budget_bytes: 0,
            total_bytes: 8 << 20,
            granule_bytes: 1 << 20,
            interval_ms: 500,
            capacity_ticks: 10,
            ranges: vec![],
            buckets: (0..8)
                .map(|i| HeatmapBucket {
                    gpa: i << 20,
                    bytes: 1 << 20,
                })
                .collect(),
            ticks: (0..6)
                .map(|t| TickRow {
                    tick: t,
                    unix_ms: 0,
                    budget_bytes: 0,
                    fast_bytes: 0,
                    heat_max: cells.iter().map(|c| c.0).collect(),
                    heat_mean: vec![0; 8],
                    dram: cells.iter().map(|c| c.1).collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_hot_set_must_be_hotter_and_in_dram() {
        const HOT: (u64, u64) = (2 << 20, 2 << 20);
        let cold = (0, 0);
        // (cells, hot set shown?)
        let cases: [([(u8, u8); 8], bool); 4] = [
            (
                [cold, (31, 0), (31, 255), (31, 255), cold, cold, cold, cold],
                true,
            ),
            // Hot but not in DRAM.
            (
                [cold, cold, (31, 0), (31, 0), cold, cold, cold, cold],
                false,
            ),
            // In DRAM but no hotter than the rest.
            ([(20, 0); 8].map(|_| (20, 255)), false),
            // The hot set elsewhere: buckets 5 and 6.
            (
                [cold, cold, cold, cold, cold, (31, 255), (31, 255), cold],
                false,
            ),
        ];
        for (cells, want) in cases {
            let j = judge(&map(&cells), HOT, 5).unwrap();
            assert_eq!(j.shows_hot_set(), want, "{cells:?}: {j:?}");
            assert_eq!((j.buckets, j.ticks), ((2, 6), 5));
        }
        // A hot set the buckets do not cover cannot be judged.
        assert!(judge(&map(&[cold; 8]), (100 << 20, 1 << 20), 5).is_none());
    }
}
