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
    out
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
        };
        let text = render(&s);
        for want in [
            "degraded: migrator: Migration failed: EIO",
            "busy 7 pages",
            "retries 3 granules (1 pending)",
            "migration errors 2",
            "module fallbacks 4 (512 pages)",
            "source errors 5",
        ] {
            assert!(text.contains(want), "{want:?} not in {text}");
        }
    }
}
