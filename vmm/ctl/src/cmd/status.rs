//! `vmtierctl status VM`.

use vmtier_core::{ByteSize, VmId};
use vmtier_daemon::proto::{Reply, Request, VmStatus};

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
    #[allow(clippy::cast_precision_loss)]
    let tick_ms = m.last_tick_us as f64 / 1000.0;
    out += &format!(
        "  ticks {}   last tick {tick_ms:.1} ms   max DRAM {}\n",
        m.ticks,
        b(m.max_fast_bytes)
    );
    out
}
