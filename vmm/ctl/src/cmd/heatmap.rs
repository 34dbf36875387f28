//! `vmtierctl heatmap VM --out FILE.svg|FILE.png [--ticks N]`: draws vmtierd's tick ring of
//! a VM (or, with `--input FILE`, a heatmap saved from `GET /v1/vms/{vm}/heatmap`): x is time (seconds before the newest tick), y the guest-physical address; the upper
//! panel is heat (the hottest granule of each address bucket), the lower one the share of
//! the bucket in DRAM. Holes between RAM ranges stay blank; each range's start is labelled.

use std::path::PathBuf;
use std::time::Instant;

use vmtier_api::heatmap::{Heatmap, DRAM_SCALE, MAX_HEAT};
use vmtier_api::proto::{Reply, Request};
use vmtier_core::{ByteSize, VmId};
use vmtier_plot::{Arrange, Axis, Cell, Colormap, Figure, Format, Labels, Panel, Rgb, Scale};

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The VM.
    #[arg(required_unless_present = "input")]
    vm: Option<VmId>,
    /// Draw this heatmap JSON (the body of `GET /v1/vms/{vm}/heatmap`) instead of asking
    /// vmtierd.
    #[arg(long, conflicts_with = "vm")]
    input: Option<PathBuf>,
    /// The image to write; its extension chooses the format: .svg or .png.
    #[arg(long, short)]
    out: PathBuf,
    /// Draw at most this many of the newest ticks (default: all the daemon keeps, or all
    /// of `--input`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(vmtier_api::heatmap::MAX_TICKS)))]
    ticks: Option<u32>,
    /// Image width, pixels.
    #[arg(long, default_value_t = 960, value_parser = clap::value_parser!(u32).range(200..=i64::from(vmtier_plot::MAX_SIDE)))]
    width: u32,
    /// Image height, pixels.
    #[arg(long, default_value_t = 720, value_parser = clap::value_parser!(u32).range(200..=i64::from(vmtier_plot::MAX_SIDE)))]
    height: u32,
}

pub fn run(client: &Client, a: &Args) -> Result<(), Error> {
    // The file name is checked before asking the daemon anything.
    Format::from_path(&a.out).map_err(Error::Plot)?;
    let h = match (&a.input, &a.vm) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::Input(path.clone(), e))?;
            let mut h = serde_json::from_str::<Heatmap>(&text)
                .map_err(|e| Error::NotHeatmap(path.clone(), e.to_string()))?;
            if let Some(n) = a.ticks {
                let keep = (n as usize).min(h.ticks.len());
                h.ticks.drain(..h.ticks.len() - keep);
            }
            Box::new(h)
        }
        (None, Some(vm)) => match client.call(&Request::Heatmap {
            vm: vm.clone(),
            ticks: a.ticks,
        })? {
            Reply::Heatmap(h) => h,
            r => return Err(Error::Reply(format!("{r:?}"))),
        },
        (None, None) => return Err(Error::Refused("Give a VM or --input FILE".into())),
    };
    if h.ticks.is_empty() {
        return Err(Error::Refused(format!(
            "vmtierd has no ticks of {} yet (its ring keeps {}; [api] heatmap_ticks)",
            h.vm, h.capacity_ticks
        )));
    }
    let started = Instant::now();
    let fig = figure(&h, a.width, a.height);
    let format = vmtier_plot::write(&fig, &a.out).map_err(Error::Plot)?;
    if !client.json {
        println!(
            "Wrote {} ({format:?}, {}x{} px): {} ticks × {} address buckets of {} in {} ms",
            a.out.display(),
            a.width,
            a.height,
            h.ticks.len(),
            h.buckets.len(),
            h.vm,
            started.elapsed().as_millis()
        );
    }
    Ok(())
}

/// Seconds of each tick's column: `(start, end)` relative to the newest tick's end. A
/// column starts where the previous one ended; the first is one interval wide.
#[allow(clippy::cast_precision_loss)]
fn columns(h: &Heatmap) -> Vec<(f64, f64)> {
    let last = h.ticks.last().map_or(0, |r| r.unix_ms);
    let rel = |ms: u64| -((last.saturating_sub(ms)) as f64) / 1000.0;
    let interval = h.interval_ms as f64 / 1000.0;
    let mut prev: Option<f64> = None;
    h.ticks
        .iter()
        .map(|r| {
            let end = rel(r.unix_ms);
            let start = prev.filter(|p| *p < end).unwrap_or(end - interval);
            prev = Some(end);
            (start, end)
        })
        .collect()
}

/// One panel's cells: per bucket, runs of ticks of the same colour become one cell.
#[allow(clippy::cast_precision_loss)]
fn cells(h: &Heatmap, cols: &[(f64, f64)], color: impl Fn(usize, usize) -> Rgb) -> Vec<Cell> {
    let mut out = Vec::new();
    for (b, bucket) in h.buckets.iter().enumerate() {
        let (y0, y1) = (
            bucket.gpa as f64,
            bucket.gpa.saturating_add(bucket.bytes) as f64,
        );
        let mut run: Option<(usize, Rgb)> = None;
        for t in 0..=cols.len() {
            let c = (t < cols.len()).then(|| color(t, b));
            match (run, c) {
                (Some((_, rc)), Some(c)) if rc == c => {}
                (r, c) => {
                    if let Some((t0, rc)) = r {
                        out.push(Cell {
                            x0: cols[t0].0,
                            x1: cols[t - 1].1,
                            y0,
                            y1,
                            color: rc,
                        });
                    }
                    run = c.map(|c| (t, c));
                }
            }
        }
    }
    out
}

/// The figure of a heatmap: heat above, share in DRAM below.
#[allow(clippy::cast_precision_loss)]
pub fn figure(h: &Heatmap, width: u32, height: u32) -> Figure {
    let cols = columns(h);
    let x = Axis {
        label: "time before the newest tick (s)".into(),
        min: cols.first().map_or(-1.0, |c| c.0),
        max: 0.0,
        labels: Labels::Seconds,
    };
    let lo = h.ranges.first().map_or(0, |r| r.gpa);
    let hi = h.ranges.last().map_or(1, |r| r.gpa.saturating_add(r.bytes));
    let y = Axis {
        label: "guest-physical address".into(),
        min: lo as f64,
        max: hi as f64,
        labels: Labels::Bytes,
    };
    // A range after a hole of at least 2% of the axis starts at a labelled line (the hole
    // below it is blank); smaller holes (QEMU's 640 KiB to 1 MiB) would only clutter it.
    let hlines: Vec<(f64, String)> = h
        .ranges
        .windows(2)
        .filter(|w| {
            let gap = w[1].gpa.saturating_sub(w[0].gpa.saturating_add(w[0].bytes));
            gap.saturating_mul(50) >= hi.saturating_sub(lo)
        })
        .map(|w| {
            (
                w[1].gpa as f64,
                format!("{} at {}", w[1].name, ByteSize(w[1].gpa)),
            )
        })
        .collect();
    let mut heat = Panel::new(
        "heat: hottest granule of each address bucket",
        x.clone(),
        y.clone(),
    );
    heat.cells = cells(h, &cols, |t, b| {
        Colormap::Heat.color(f64::from(h.ticks[t].heat_max[b]) / f64::from(MAX_HEAT))
    });
    heat.hlines.clone_from(&hlines);
    heat.scale = Some(Scale {
        label: "heat (0-31)".into(),
        min: 0.0,
        max: f64::from(MAX_HEAT),
        map: Colormap::Heat,
    });
    let mut dram = Panel::new("tier: share of each bucket in DRAM", x, y);
    dram.cells = cells(h, &cols, |t, b| {
        Colormap::Dram.color(f64::from(h.ticks[t].dram[b]) / f64::from(DRAM_SCALE))
    });
    dram.hlines = hlines;
    dram.scale = Some(Scale {
        label: "in DRAM (%)".into(),
        min: 0.0,
        max: 100.0,
        map: Colormap::Dram,
    });
    let last = h.ticks.last();
    Figure {
        title: format!(
            "{}: budget {}, policy {}, {} in DRAM, {} RAM, granule {}",
            h.vm,
            ByteSize(h.budget_bytes),
            h.policy,
            ByteSize(last.map_or(0, |r| r.fast_bytes)),
            ByteSize(h.total_bytes),
            ByteSize(h.granule_bytes)
        ),
        width,
        height,
        panels: vec![heat, dram],
        arrange: Arrange::Rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_api::heatmap::{HeatmapBucket, HeatmapRange, TickRow};

    /// Two ranges with a hole, 3 buckets, `n` ticks 1 s apart; bucket 1 is hot and in DRAM
    /// from tick 2 on.
    fn map(n: u64) -> Heatmap {
        Heatmap {
            vm: "web1".parse().unwrap(),
            policy: "default".into(),
            budget_bytes: 64 << 20,
            total_bytes: 12 << 20,
            granule_bytes: 2 << 20,
            interval_ms: 1000,
            capacity_ticks: 120,
            ranges: vec![
                HeatmapRange {
                    name: "lo".into(),
                    gpa: 0,
                    bytes: 4 << 20,
                    first_bucket: 0,
                    buckets: 1,
                },
                HeatmapRange {
                    name: "hi".into(),
                    gpa: 8 << 20,
                    bytes: 8 << 20,
                    first_bucket: 1,
                    buckets: 2,
                },
            ],
            buckets: vec![
                HeatmapBucket {
                    gpa: 0,
                    bytes: 4 << 20,
                },
                HeatmapBucket {
                    gpa: 8 << 20,
                    bytes: 4 << 20,
                },
                HeatmapBucket {
                    gpa: 12 << 20,
                    bytes: 4 << 20,
                },
            ],
            ticks: (1..=n)
                .map(|t| TickRow {
                    tick: t,
                    unix_ms: 1_000_000 + 1000 * t,
                    budget_bytes: 64 << 20,
                    fast_bytes: 4 << 20,
                    heat_max: vec![0, if t >= 2 { 31 } else { 0 }, 0],
                    heat_mean: vec![0, 0, 0],
                    dram: vec![0, if t >= 2 { 255 } else { 0 }, 0],
                })
                .collect(),
        }
    }

    #[test]
    fn runs_of_equal_colour_merge_and_columns_follow_wall_time() {
        let h = map(5);
        assert_eq!(
            columns(&h),
            vec![
                (-5.0, -4.0),
                (-4.0, -3.0),
                (-3.0, -2.0),
                (-2.0, -1.0),
                (-1.0, 0.0)
            ]
        );
        let fig = figure(&h, 800, 600);
        // Buckets 0 and 2: one cell each; bucket 1: tick 1 cold, ticks 2-5 hot.
        for p in &fig.panels {
            assert_eq!(p.cells.len(), 4, "{}", p.caption);
            let hot: Vec<&Cell> = p.cells.iter().filter(|c| c.y0 == 8.0 * 1048576.0).collect();
            assert_eq!(hot.len(), 2);
            assert_eq!((hot[1].x0, hot[1].x1), (-4.0, 0.0));
            assert_eq!(p.hlines, vec![(8.0 * 1048576.0, "hi at 8 MiB".to_owned())]);
        }
        assert_eq!(fig.panels[1].cells[2].color, Colormap::Dram.color(1.0));
        assert!(
            fig.title.contains("budget 64 MiB, policy default"),
            "{}",
            fig.title
        );
        let svg = String::from_utf8(vmtier_plot::render(&fig, Format::Svg).unwrap()).unwrap();
        assert!(svg.contains(&format!("fill=\"{}\"", Colormap::Heat.color(1.0).hex())));
        assert!(svg.contains("hi at 8 MiB"));
    }
}
