//! `vmtierctl top [--interval-ms N] [--count N]`: a live view of every VM — DRAM and CXL
//! bytes against the budget, the share of RAM in the hottest heat buckets, bytes moved per
//! second each way, and a progress bar while DRAM use drains to a lowered budget.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use vmtier_api::proto::{Reply, Request, VmStatus};
use vmtier_core::{ByteSize, VmId};

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Refresh period.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Frames to show, then exit (0: until interrupted). Frames after the first are drawn
    /// over the previous one on a terminal.
    #[arg(long, default_value_t = 0)]
    count: u64,
}

/// What one VM looked like at one refresh.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    status: VmStatus,
    /// DRAM use when it was last at or under its budget, or the highest since it went over:
    /// where a drain started.
    drain_from: u64,
}

/// Share of guest RAM in the upper half of the heat buckets, percent.
fn hot_pct(s: &VmStatus) -> f64 {
    let h = &s.heat_histogram;
    let hot: u64 = h.iter().skip(h.len() / 2).sum();
    let all: u64 = h.iter().sum();
    #[allow(clippy::cast_precision_loss)]
    let p = 100.0 * hot as f64 / all.max(1) as f64;
    p
}

/// A bar of `width` cells, `done` of `total` filled.
fn bar(done: u64, total: u64, width: usize) -> String {
    let filled = usize::try_from(done.min(total).saturating_mul(width as u64) / total.max(1))
        .unwrap_or(width);
    format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
}

/// One line per VM.
fn line(now: &Seen, before: Option<&Seen>) -> String {
    let s = &now.status;
    let m = &s.metrics;
    let b = |x: u64| ByteSize(x).to_string();
    let (up, down) = before.map_or((0.0, 0.0), |p| {
        let dt = now.at.duration_since(p.at).as_secs_f64().max(1e-3);
        let pm = &p.status.metrics;
        #[allow(clippy::cast_precision_loss)]
        let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
        (
            rate(m.promoted_bytes, pm.promoted_bytes),
            rate(m.demoted_bytes, pm.demoted_bytes),
        )
    });
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let per_s = |x: f64| format!("{}/s", ByteSize(x as u64));
    let sm = &s.summary;
    let drain = if sm.fast_bytes > sm.budget_bytes && now.drain_from > sm.budget_bytes {
        let total = now.drain_from - sm.budget_bytes;
        let done = now.drain_from.saturating_sub(sm.fast_bytes);
        format!(
            "  draining {} {}%",
            bar(done, total, 20),
            done * 100 / total
        )
    } else {
        String::new()
    };
    format!(
        "{:<16} {:<8} {:>10} {:>10} {:>10} {:>5.1}% {:>12} {:>12}{drain}",
        sm.name.as_str(),
        sm.state.split(':').next().unwrap_or(""),
        b(sm.budget_bytes),
        b(sm.fast_bytes),
        b(sm.slow_bytes),
        hot_pct(s),
        per_s(up),
        per_s(down)
    )
}

/// The frame for `seen`, in name order, with rates against `before`.
fn frame(seen: &BTreeMap<VmId, Seen>, before: &BTreeMap<VmId, Seen>) -> String {
    let mut out = format!(
        "{:<16} {:<8} {:>10} {:>10} {:>10} {:>6} {:>12} {:>12}\n",
        "VM", "STATE", "BUDGET", "DRAM", "CXL", "HOT", "TO DRAM", "TO CXL"
    );
    for (name, now) in seen {
        out += &line(now, before.get(name));
        out.push('\n');
    }
    out
}

pub fn run(client: &Client, a: &Args) -> Result<(), Error> {
    let mut before: BTreeMap<VmId, Seen> = BTreeMap::new();
    let mut shown = 0u64;
    loop {
        let Reply::List { vms } = client.call(&Request::List {})? else {
            return Err(Error::Reply("list".into()));
        };
        let mut seen = BTreeMap::new();
        for v in vms {
            let Ok(Reply::Status(s)) = client.call(&Request::Status { vm: v.name.clone() }) else {
                continue; // detached in between
            };
            let fast = s.summary.fast_bytes;
            let drain_from = match before.get(&v.name) {
                Some(p) if fast > s.summary.budget_bytes => p.drain_from.max(fast),
                _ => fast,
            };
            seen.insert(
                v.name,
                Seen {
                    at: Instant::now(),
                    status: *s,
                    drain_from,
                },
            );
        }
        if !client.json {
            let text = frame(&seen, &before);
            if shown > 0 {
                if std::io::stdout().is_terminal() {
                    // Back over the previous frame.
                    print!("\x1b[H\x1b[2J");
                } else {
                    println!();
                }
            }
            print!("{text}");
            let _ = std::io::stdout().flush();
        }
        before = seen;
        shown += 1;
        if a.count > 0 && shown >= a.count {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(a.interval_ms.max(100)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_api::proto::{VmMetrics, VmSummary};

    fn status(fast: u64, budget: u64, promoted: u64, demoted: u64) -> VmStatus {
        VmStatus {
            summary: VmSummary {
                name: "web1".parse().unwrap(),
                state: "active".into(),
                budget_bytes: budget,
                fast_bytes: fast,
                slow_bytes: (256 << 20) - fast,
                total_bytes: 256 << 20,
            },
            backend: "qemu".into(),
            source: "damon-vaddr".into(),
            policy: "default".into(),
            granule_bytes: 2 << 20,
            per_node: vec![],
            heat_histogram: vec![192 << 20, 0, 0, 64 << 20],
            metrics: VmMetrics {
                promoted_bytes: promoted,
                demoted_bytes: demoted,
                ..VmMetrics::default()
            },
            hints: None,
            hybrid: None,
        }
    }

    #[test]
    fn lines_show_rates_hot_share_and_the_drain() {
        let t = Instant::now();
        let before = Seen {
            at: t,
            status: status(64 << 20, 64 << 20, 0, 0),
            drain_from: 64 << 20,
        };
        // (now, drain_from, wanted substrings)
        let cases: [(VmStatus, u64, &[&str]); 2] = [
            (
                status(64 << 20, 64 << 20, 8 << 20, 0),
                64 << 20,
                &["8 MiB/s", "25.0%", "64 MiB"],
            ),
            (
                status(40 << 20, 16 << 20, 0, 24 << 20),
                64 << 20,
                &["24 MiB/s", "draining [##########..........] 50%"],
            ),
        ];
        for (st, from, want) in cases {
            let now = Seen {
                at: t + Duration::from_secs(1),
                status: st,
                drain_from: from,
            };
            let l = line(&now, Some(&before));
            for w in want {
                assert!(l.contains(w), "{w} in {l}");
            }
        }
        assert!(!line(&before, None).contains("draining"));
    }

    #[test]
    fn bars_are_bounded() {
        let cases = [
            (0, 10, "[....]"),
            (5, 10, "[##..]"),
            (10, 10, "[####]"),
            (99, 10, "[####]"),
            (1, 0, "[....]"),
        ];
        for (done, total, want) in cases {
            assert_eq!(bar(done, total, 4), want, "{done}/{total}");
        }
    }
}
