//! `vmtierctl status VM`.

use vmtier_api::proto::{Reply, Request, VmStatus};
use vmtier_core::{ByteSize, VmId};

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The VM.
    vm: VmId,
}

pub fn run(client: &Client, a: &Args) -> Result<(), Error> {
    let reply = client.call(&Request::Status { vm: a.vm.clone() })?;
    if client.json {
        return Ok(());
    }
    let Reply::Status(s) = reply else {
        return Err(Error::Reply(format!("{reply:?}")));
    };
    print!("{}", render(&s));
    Ok(())
}

/// The human view of a status.
pub fn render(s: &VmStatus) -> String {
    let b = |x: u64| ByteSize(x).to_string();
    let m = &s.metrics;
    let mut out = format!("{}  {}  ({})\n", s.summary.name, s.summary.state, s.backend);
    out += &format!(
        "  source {}, policy {}, granule {}\n",
        s.source,
        s.policy,
        b(s.granule_bytes)
    );
    out += &format!(
        "  budget {}   DRAM {}   CXL {}   total {}\n",
        b(s.summary.budget_bytes),
        b(s.summary.fast_bytes),
        b(s.summary.slow_bytes),
        b(s.summary.total_bytes)
    );
    let nodes: Vec<String> = s
        .per_node
        .iter()
        .map(|n| format!("node {}: {}", n.node, b(n.bytes)))
        .collect();
    out += &format!("  {}\n", nodes.join("   "));
    out += "  heat (cold → hot):";
    for bytes in &s.heat_histogram {
        out += &format!(" {}", b(*bytes));
    }
    out += "\n";
    out += &format!(
        "  promoted {} ({} granules)   demoted {} ({} granules)   failed {} pages   busy {} pages   deferred {} granules\n",
        b(m.promoted_bytes),
        m.promoted_granules,
        b(m.demoted_bytes),
        m.demoted_granules,
        m.failed_pages,
        m.busy_pages,
        m.deferred_granules
    );
    out += &format!(
        "  retries {} granules ({} pending)   migration errors {}   module fallbacks {} ({} pages)   source errors {}\n",
        m.retried_granules,
        m.pending_granules,
        m.migration_errors,
        m.fallback_errors,
        m.fallback_pages,
        m.source_errors
    );
    #[allow(clippy::cast_precision_loss)]
    let tick_ms = m.last_tick_us as f64 / 1000.0;
    out += &format!(
        "  ticks {}   last tick {tick_ms:.1} ms   max DRAM {}\n",
        m.ticks,
        b(m.max_fast_bytes)
    );
    if let Some(h) = &s.hybrid {
        out += &format!(
            "  hybrid tracking: {} of at most {} regions split to 4 KiB   splits {}   merges {}   refused at the cap {}\n",
            h.split_regions, h.max_split_regions, h.splits, h.merges, h.refused
        );
    }
    if let Some(h) = &s.hints {
        out += &render_hints(h);
    }
    out
}

/// The hint channel's lines of a status.
fn render_hints(h: &vmtier_api::hints::HintStatus) -> String {
    let c = &h.counters;
    let conn = match (&h.connected, &h.last_error) {
        (true, _) => "connected".to_string(),
        (false, Some(e)) => format!("not connected ({e})"),
        (false, None) => "not connected".to_string(),
    };
    // Version 0: no session now (before a HELLO, after a BYE or a reconnect).
    let agent = match (h.agent.is_empty(), h.version) {
        (true, _) => "no HELLO yet".to_string(),
        (false, 0) => format!("agent {:?}, no session (said BYE or reconnecting)", h.agent),
        (false, v) => format!("agent {:?} v{v}", h.agent),
    };
    let trust: Vec<String> = h
        .trust
        .iter()
        .map(|t| format!("{} {}%", t.source, t.percent))
        .collect();
    let mut out = format!(
        "  hints {}: {conn}, {agent}
",
        h.socket.display()
    );
    if let Some(why) = &h.misbehaving {
        out += &format!(
            "    MISBEHAVING: {why}
"
        );
    }
    out += &format!(
        "    frames ok {}   ranges accepted {}   rejected {} invalid, {} outside RAM   live {}   hinted {} granules   trust [{}]\n",
        c.frames_ok,
        c.ranges_accepted,
        c.ranges_rejected_invalid,
        c.ranges_rejected_outside_ram,
        h.live_ranges,
        h.hinted_granules,
        trust.join(", ")
    );
    out += &format!(
        "    dropped: rate {}   garbage {} bytes ({} at connect)   replay {}   before hello {} ({} at connect)   bad version {}   oversize {}   bad type {}   bad length {}\n",
        c.dropped_rate,
        c.garbage_bytes,
        c.resync_bytes,
        c.dropped_replay,
        c.dropped_before_hello,
        c.resync_before_hello,
        c.dropped_bad_version,
        c.dropped_oversize,
        c.dropped_bad_type,
        c.dropped_bad_length
    );
    out += &format!(
        "    slow-downs {}   replies dropped {}   evicted {}   contradicted {} granule-ticks   trust halvings {}   capped {} granule-ticks   read {}   connects {} ({} failed)\n",
        c.slow_downs_sent,
        c.replies_dropped,
        c.evicted_ranges,
        c.contradicted_granules,
        c.trust_halvings,
        c.capped_granules,
        b(c.bytes_read),
        c.connects,
        c.connect_errors
    );
    out
}

fn b(x: u64) -> String {
    ByteSize(x).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_api::proto::{VmMetrics, VmSummary};

    #[test]
    fn failures_are_shown() {
        let s = VmStatus {
            summary: VmSummary {
                name: "web1".parse().unwrap(),
                state: "degraded: migrator: Migration failed: EIO".into(),
                budget_bytes: 64 << 20,
                fast_bytes: 32 << 20,
                slow_bytes: 224 << 20,
                total_bytes: 256 << 20,
            },
            backend: "qemu".into(),
            source: "damon-vaddr".into(),
            policy: "default".into(),
            granule_bytes: 2 << 20,
            per_node: Vec::new(),
            heat_histogram: vec![0; 8],
            metrics: VmMetrics {
                busy_pages: 7,
                retried_granules: 3,
                pending_granules: 1,
                migration_errors: 2,
                fallback_errors: 4,
                fallback_pages: 512,
                source_errors: 5,
                ..VmMetrics::default()
            },
            hints: Some(vmtier_api::hints::HintStatus {
                socket: "/run/web1.hints".into(),
                misbehaving: Some("the guest broke the hint protocol: 3 oversize".into()),
                counters: vmtier_api::hints::HintCounters {
                    dropped_oversize: 3,
                    garbage_bytes: 99,
                    ..Default::default()
                },
                ..Default::default()
            }),
            hybrid: Some(vmtier_api::proto::HybridStatus {
                split_regions: 12,
                max_split_regions: 40,
                splits: 30,
                merges: 18,
                refused: 6,
            }),
        };
        let text = render(&s);
        for want in [
            "degraded: migrator: Migration failed: EIO",
            "busy 7 pages",
            "retries 3 granules (1 pending)",
            "migration errors 2",
            "module fallbacks 4 (512 pages)",
            "source errors 5",
            "hints /run/web1.hints: not connected, no HELLO yet",
            "MISBEHAVING: the guest broke the hint protocol: 3 oversize",
            "garbage 99 bytes",
            "oversize 3",
            "hybrid tracking: 12 of at most 40 regions split to 4 KiB   splits 30   merges 18   refused at the cap 6",
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
    }
}
