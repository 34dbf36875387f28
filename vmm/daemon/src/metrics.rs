//! `/metrics`: the engine's snapshot ([`DaemonMetrics`]) in the Prometheus text format,
//! encoded by the `prometheus` crate. Every family is listed in [`FAMILIES`] with its type
//! and help (docs/metrics.md documents each); a family with no samples (no VMs) is left out.
//!
//! To export a new counter (the hint counters, say): add it to `VmMetrics`, add a row to
//! [`FAMILIES`] and a line to [`vm_samples`]; the tests check names, types and docs.

use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType,
};
use prometheus::{Encoder, TextEncoder};
use vmtier_api::proto::{DaemonMetrics, VmStatus, TICK_BUCKETS_S};

/// Content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Error encoding the metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The encoder refused a family.
    #[error("Cannot encode metrics: {0}")]
    Encode(String),
}

/// Kind of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (since the VM was attached or the daemon started).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
}

/// Every family: name, kind, help.
pub const FAMILIES: &[(&str, Kind, &str)] = &[
    ("vmtier_vm_info", Kind::Gauge, "Always 1; labels name the VM's backend, hotness source and policy in use."),
    ("vmtier_vm_up", Kind::Gauge, "1 while the VM is managed, 0 once it failed (see vmtierctl status)."),
    ("vmtier_vm_tiering_enabled", Kind::Gauge, "1 if ticks place the VM's memory, 0 if paused through the API."),
    ("vmtier_vm_budget_bytes", Kind::Gauge, "DRAM budget of the VM."),
    ("vmtier_vm_memory_bytes", Kind::Gauge, "Guest RAM of the VM per tier (dram, cxl), as the engine tracks it."),
    ("vmtier_vm_guest_memory_bytes", Kind::Gauge, "Guest RAM of the VM."),
    ("vmtier_vm_node_memory_bytes", Kind::Gauge, "Guest RAM of the VM per NUMA node, as last queried from the kernel."),
    ("vmtier_vm_max_dram_bytes", Kind::Gauge, "Largest DRAM use of the VM seen at the end of a tick."),
    ("vmtier_vm_heat_bytes", Kind::Gauge, "Guest RAM of the VM per heat bucket (0 coldest)."),
    ("vmtier_vm_promoted_bytes_total", Kind::Counter, "Bytes moved to DRAM."),
    ("vmtier_vm_demoted_bytes_total", Kind::Counter, "Bytes moved to CXL."),
    ("vmtier_vm_promoted_granules_total", Kind::Counter, "Granules moved to DRAM completely."),
    ("vmtier_vm_demoted_granules_total", Kind::Counter, "Granules moved to CXL completely."),
    ("vmtier_vm_page_failures_total", Kind::Counter, "Pages that did not move, by reason: failed (no memory, fault, other errors) or busy (left for a retry)."),
    ("vmtier_vm_errors_total", Kind::Counter, "Failed operations by kind: migration (a call moved nothing), module_fallback (a kernel module call failed, move_pages moved its pages), source (a hotness observation failed)."),
    ("vmtier_vm_module_fallback_pages_total", Kind::Counter, "Pages the kernel module was meant to move that move_pages moved instead."),
    ("vmtier_vm_deferred_granules_total", Kind::Counter, "Moves the migration rate limit deferred to a later tick."),
    ("vmtier_vm_retried_granules_total", Kind::Counter, "Retries of granules whose previous move did not complete."),
    ("vmtier_vm_pending_granules", Kind::Gauge, "Granules waiting for a retry now."),
    ("vmtier_vm_ticks_total", Kind::Counter, "Ticks run for the VM."),
    ("vmtier_vm_last_tick_seconds", Kind::Gauge, "Duration of the VM's last tick."),
    ("vmtier_vm_hybrid_split_regions", Kind::Gauge, "Hybrid tracking: regions split into 4 KiB detail now."),
    ("vmtier_vm_hybrid_max_split_regions", Kind::Gauge, "Hybrid tracking: the most regions that may be split at a time."),
    ("vmtier_vm_hybrid_events_total", Kind::Counter, "Hybrid tracking events by kind: split, merge, refused (a mixed region left whole at the cap, once per tick)."),
    ("vmtier_tick_duration_seconds", Kind::Histogram, "Duration of whole engine ticks (all VMs)."),
];

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.into());
    l.set_value(value.into());
    l
}

/// One sample: family, extra labels (after `vm`), value.
type Sample = (&'static str, Vec<(&'static str, String)>, f64);

#[allow(clippy::cast_precision_loss)]
fn vm_samples(s: &VmStatus, enabled: bool) -> Vec<Sample> {
    let m = &s.metrics;
    let sm = &s.summary;
    let f = |x: u64| x as f64;
    let up = !sm.state.starts_with("failed");
    let mut out: Vec<Sample> = vec![
        (
            "vmtier_vm_info",
            vec![
                ("backend", s.backend.clone()),
                ("source", s.source.clone()),
                ("policy", s.policy.clone()),
            ],
            1.0,
        ),
        ("vmtier_vm_up", vec![], f(up.into())),
        ("vmtier_vm_tiering_enabled", vec![], f(enabled.into())),
        ("vmtier_vm_budget_bytes", vec![], f(sm.budget_bytes)),
        (
            "vmtier_vm_memory_bytes",
            vec![("tier", "dram".into())],
            f(sm.fast_bytes),
        ),
        (
            "vmtier_vm_memory_bytes",
            vec![("tier", "cxl".into())],
            f(sm.slow_bytes),
        ),
        ("vmtier_vm_guest_memory_bytes", vec![], f(sm.total_bytes)),
        ("vmtier_vm_max_dram_bytes", vec![], f(m.max_fast_bytes)),
        (
            "vmtier_vm_promoted_bytes_total",
            vec![],
            f(m.promoted_bytes),
        ),
        ("vmtier_vm_demoted_bytes_total", vec![], f(m.demoted_bytes)),
        (
            "vmtier_vm_promoted_granules_total",
            vec![],
            f(m.promoted_granules),
        ),
        (
            "vmtier_vm_demoted_granules_total",
            vec![],
            f(m.demoted_granules),
        ),
        (
            "vmtier_vm_page_failures_total",
            vec![("reason", "failed".into())],
            f(m.failed_pages),
        ),
        (
            "vmtier_vm_page_failures_total",
            vec![("reason", "busy".into())],
            f(m.busy_pages),
        ),
        (
            "vmtier_vm_errors_total",
            vec![("kind", "migration".into())],
            f(m.migration_errors),
        ),
        (
            "vmtier_vm_errors_total",
            vec![("kind", "module_fallback".into())],
            f(m.fallback_errors),
        ),
        (
            "vmtier_vm_errors_total",
            vec![("kind", "source".into())],
            f(m.source_errors),
        ),
        (
            "vmtier_vm_module_fallback_pages_total",
            vec![],
            f(m.fallback_pages),
        ),
        (
            "vmtier_vm_deferred_granules_total",
            vec![],
            f(m.deferred_granules),
        ),
        (
            "vmtier_vm_retried_granules_total",
            vec![],
            f(m.retried_granules),
        ),
        ("vmtier_vm_pending_granules", vec![], f(m.pending_granules)),
        ("vmtier_vm_ticks_total", vec![], f(m.ticks)),
        (
            "vmtier_vm_last_tick_seconds",
            vec![],
            f(m.last_tick_us) / 1e6,
        ),
    ];
    if let Some(h) = &s.hybrid {
        out.push(("vmtier_vm_hybrid_split_regions", vec![], f(h.split_regions)));
        out.push((
            "vmtier_vm_hybrid_max_split_regions",
            vec![],
            f(h.max_split_regions),
        ));
        for (kind, n) in [
            ("split", h.splits),
            ("merge", h.merges),
            ("refused", h.refused),
        ] {
            out.push((
                "vmtier_vm_hybrid_events_total",
                vec![("kind", kind.into())],
                f(n),
            ));
        }
    }
    for n in &s.per_node {
        out.push((
            "vmtier_vm_node_memory_bytes",
            vec![("node", n.node.to_string())],
            f(n.bytes),
        ));
    }
    for (i, b) in s.heat_histogram.iter().enumerate() {
        out.push((
            "vmtier_vm_heat_bytes",
            vec![("bucket", i.to_string())],
            f(*b),
        ));
    }
    out
}

/// The exposition of `m`.
pub fn encode(m: &DaemonMetrics) -> Result<String, Error> {
    let mut families: Vec<MetricFamily> = FAMILIES
        .iter()
        .map(|(name, kind, help)| {
            let mut fam = MetricFamily::default();
            fam.set_name((*name).into());
            fam.set_help((*help).into());
            fam.set_field_type(match kind {
                Kind::Counter => MetricType::COUNTER,
                Kind::Gauge => MetricType::GAUGE,
                Kind::Histogram => MetricType::HISTOGRAM,
            });
            fam
        })
        .collect();
    let index = |name: &str| FAMILIES.iter().position(|(n, _, _)| *n == name);
    for s in &m.vms {
        let enabled = !m.disabled.contains(&s.summary.name);
        for (name, labels, value) in vm_samples(s, enabled) {
            let i = index(name).ok_or_else(|| Error::Encode(format!("{name} is not listed")))?;
            let mut pairs = vec![label("vm", s.summary.name.as_str())];
            pairs.extend(labels.iter().map(|(k, v)| label(k, v)));
            let mut metric = Metric::from_label(pairs);
            if FAMILIES[i].1 == Kind::Counter {
                let mut c = Counter::default();
                c.set_value(value);
                metric.set_counter(c);
            } else {
                let mut g = Gauge::default();
                g.set_value(value);
                metric.set_gauge(g);
            }
            families[i].mut_metric().push(metric);
        }
    }
    let i = index("vmtier_tick_duration_seconds")
        .ok_or_else(|| Error::Encode("tick histogram is not listed".into()))?;
    let mut h = Histogram::default();
    let mut cumulative = 0u64;
    let buckets = TICK_BUCKETS_S
        .iter()
        .enumerate()
        .map(|(j, &bound)| {
            cumulative = cumulative.saturating_add(m.ticks.counts.get(j).copied().unwrap_or(0));
            let mut b = Bucket::default();
            b.set_upper_bound(bound);
            b.set_cumulative_count(cumulative);
            b
        })
        .collect();
    h.set_bucket(buckets);
    h.set_sample_count(m.ticks.count);
    h.set_sample_sum(m.ticks.sum_seconds);
    let mut metric = Metric::default();
    metric.set_histogram(h);
    families[i].mut_metric().push(metric);
    families.retain(|f| !f.get_metric().is_empty());
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut out)
        .map_err(|e| Error::Encode(e.to_string()))?;
    String::from_utf8(out).map_err(|e| Error::Encode(e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};
    use vmtier_api::proto::TickHistogram;

    /// A snapshot of two VMs (one paused, one failed) after three ticks.
    pub(crate) fn example() -> DaemonMetrics {
        let web = crate::http::tests::example_status();
        let mut db = web.clone();
        db.summary.name = "db".parse().unwrap();
        db.summary.state = "failed: The VMM process exited".into();
        db.metrics.failed_pages = 3;
        let mut ticks = TickHistogram::default();
        for s in [0.0004, 0.02, 7.0] {
            ticks.observe(s);
        }
        DaemonMetrics {
            vms: vec![web, db.clone()],
            disabled: vec![db.summary.name],
            ticks,
        }
    }

    fn sample<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
    }

    #[test]
    fn the_snapshot_is_exposed_with_its_values() {
        let text = encode(&example()).unwrap();
        let cases = [
            (r#"vmtier_vm_budget_bytes{vm="web1"}"#, "67108864"),
            (
                r#"vmtier_vm_memory_bytes{vm="web1",tier="dram"}"#,
                "62914560",
            ),
            (
                r#"vmtier_vm_node_memory_bytes{vm="web1",node="1"}"#,
                "205520896",
            ),
            (r#"vmtier_vm_promoted_bytes_total{vm="web1"}"#, "4194304"),
            (
                r#"vmtier_vm_page_failures_total{vm="db",reason="failed"}"#,
                "3",
            ),
            (r#"vmtier_vm_up{vm="db"}"#, "0"),
            (r#"vmtier_vm_up{vm="web1"}"#, "1"),
            (r#"vmtier_vm_tiering_enabled{vm="db"}"#, "0"),
            (
                r#"vmtier_vm_info{vm="web1",backend="QEMU pid 42",source="damon-vaddr",policy="default"}"#,
                "1",
            ),
            (r#"vmtier_tick_duration_seconds_bucket{le="0.001"}"#, "1"),
            (r#"vmtier_tick_duration_seconds_bucket{le="0.025"}"#, "2"),
            (r#"vmtier_tick_duration_seconds_bucket{le="5"}"#, "2"),
            (r#"vmtier_tick_duration_seconds_bucket{le="+Inf"}"#, "3"),
            ("vmtier_tick_duration_seconds_count", "3"),
        ];
        for (prefix, want) in cases {
            assert_eq!(sample(&text, prefix), Some(want), "{prefix} in\n{text}");
        }
        // No VMs: only the histogram.
        let empty = encode(&DaemonMetrics::default()).unwrap();
        assert!(!empty.contains("vmtier_vm_"), "{empty}");
        assert!(empty.contains("vmtier_tick_duration_seconds_count 0"));
    }

    #[test]
    fn names_follow_the_conventions_and_are_documented() {
        let doc = include_str!("../../../docs/metrics.md");
        for (name, kind, help) in FAMILIES {
            assert!(name.starts_with("vmtier_"), "{name}");
            assert!(!help.is_empty() && help.ends_with('.'), "{name}");
            assert_eq!(name.ends_with("_total"), *kind == Kind::Counter, "{name}");
            let unit = [
                "_bytes",
                "_seconds",
                "_total",
                "_info",
                "_up",
                "_enabled",
                "_granules",
                "_regions",
            ];
            assert!(unit.iter().any(|u| name.contains(u)), "{name} has a unit");
            assert!(
                doc.contains(&format!("`{name}`")),
                "{name} in docs/metrics.md"
            );
        }
        // Every family the snapshot fills is listed.
        let listed: Vec<&str> = FAMILIES.iter().map(|f| f.0).collect();
        for (name, _, _) in vm_samples(&crate::http::tests::example_status(), true) {
            assert!(listed.contains(&name), "{name}");
        }
    }

    /// promtool (Debian package `prometheus`) checks the exposition: format and lint.
    #[test]
    fn promtool_accepts_the_exposition() {
        let text = encode(&example()).unwrap();
        let Ok(mut child) = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        else {
            panic!("promtool not found: run tools/install-deps (Debian package prometheus)");
        };
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn the_grafana_dashboard_queries_only_exported_families() {
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../../docs/grafana-dashboard.json")).unwrap();
        let mut exprs: Vec<String> = Vec::new();
        for p in dash["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                exprs.push(t["expr"].as_str().unwrap().to_owned());
            }
        }
        exprs.push(
            dash["templating"]["list"][1]["query"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        let mut used = 0;
        for e in &exprs {
            let mut rest = e.as_str();
            while let Some(i) = rest.find("vmtier_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(&name);
                assert!(
                    FAMILIES.iter().any(|(n, _, _)| *n == name || *n == base),
                    "{name} in {e}"
                );
                used += 1;
                rest = &rest[i + name.len()..];
            }
        }
        assert!(used >= 15, "{used} family references");
    }
}
