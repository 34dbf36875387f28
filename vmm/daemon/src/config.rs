//! vmtierd's TOML configuration. Every table refuses unknown keys; every option has a
//! documented default (docs/config.md lists them with examples). Names (`source`,
//! `migrator`, `kmod_engine`) are enums checked while parsing, so a bad one is reported with
//! its line and column; every number has bounds ([`Config::parse`] refuses values outside
//! them), so that no later arithmetic can overflow.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vmtier_core::policy::TrackingSource;
use vmtier_core::{ByteSize, GranuleSize, NodeId, VmId};
use vmtier_migrate::kmod::CopyEngine;
use vmtier_sources::Choice;

/// `[[vm]]` tables are the API's VM descriptions (an `attach` request carries one).
pub use vmtier_api::vm::{RangeConfig, VmConfig, MAX_ADDRESS, MAX_BUDGET};

/// `interval_ms`: 10 ms to 1 hour.
pub const INTERVAL_MS: RangeInclusive<u64> = 10..=3_600_000;
/// `rate_limit_mbps`: 1 MB/s to 1 TB/s (so bytes per second, and bytes per tick of the
/// longest tick, stay far below 2^64).
pub const RATE_LIMIT_MBPS: RangeInclusive<u64> = 1..=1_000_000;
/// `refresh_ticks`: 0 (never) to 10^6.
pub const REFRESH_TICKS: RangeInclusive<u64> = 0..=1_000_000;
/// `kmod_workers`: 0 (the module's default) to the module's `VMTIER_MAX_WORKERS`.
pub const KMOD_WORKERS: RangeInclusive<u64> = 0..=vmtier_migrate::uapi::MAX_WORKERS;
/// Node ids: the kernel's largest `MAX_NUMNODES` (`CONFIG_NODES_SHIFT` = 10).
pub const MAX_NODES: u32 = 1024;
pub use vmtier_api::vm::MAX_SOCKET_PATH;

/// Error loading or validating a configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("Cannot read config file {0}")]
    Read(PathBuf, #[source] std::io::Error),
    /// The TOML is malformed or has unknown keys.
    #[error("Invalid config: {0}")]
    Parse(String),
    /// A value is out of range or inconsistent.
    #[error("Invalid config: {0}")]
    Invalid(String),
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Daemon-wide settings (`[daemon]`).
    pub daemon: DaemonConfig,
    /// VMs managed from the start (`[[vm]]`); more can be attached at runtime.
    #[serde(rename = "vm")]
    pub vms: Vec<VmConfig>,
    /// Follow libvirt's domains (`[libvirt]`, docs/libvirt.md). Absent: off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtConfig>,
    /// The HTTP API and `/metrics` (`[api]`).
    pub api: ApiConfig,
}

/// `libvirt.rescan_ticks`: 0 (on events only) to 10^6.
pub const RESCAN_TICKS: RangeInclusive<u64> = 0..=1_000_000;

/// `[libvirt]`: domains of a libvirt connection are found and followed (attached when they
/// start with vmtier metadata, changed when it changes, detached when they stop).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LibvirtConfig {
    /// Connection URI. Default `qemu:///system` (vmtierd's `--connect` overrides it).
    pub uri: String,
    /// Also manage running domains that have no vmtier metadata, with `default_budget`
    /// (a domain whose metadata says `enabled="no"` is still left alone). Default false.
    pub manage_all: bool,
    /// DRAM budget of domains managed because of `manage_all`. Default 1G.
    pub default_budget: ByteSize,
    /// Re-list every running domain every this many ticks even without an event (events
    /// make it happen at once). 0 = on events only. Default 10.
    pub rescan_ticks: u64,
    /// Where libvirt writes QEMU's pid files (`NAME.pid`). Default `/run/libvirt/qemu`.
    pub pid_dir: PathBuf,
}

impl Default for LibvirtConfig {
    fn default() -> Self {
        Self {
            uri: "qemu:///system".into(),
            manage_all: false,
            default_budget: ByteSize(1 << 30),
            rescan_ticks: 10,
            pid_dir: PathBuf::from("/run/libvirt/qemu"),
        }
    }
}

impl LibvirtConfig {
    /// Checks the bounds.
    pub fn validate(&self) -> Result<(), Error> {
        if self.uri.is_empty() || self.uri.chars().any(char::is_control) {
            return Err(Error::Invalid(format!(
                "libvirt.uri {:?} is not a URI",
                self.uri
            )));
        }
        if self.default_budget.0 > MAX_BUDGET {
            return Err(Error::Invalid(format!(
                "libvirt.default_budget {} is above the largest, {}",
                self.default_budget,
                ByteSize(MAX_BUDGET)
            )));
        }
        if !RESCAN_TICKS.contains(&self.rescan_ticks) {
            return Err(Error::Invalid(format!(
                "libvirt.rescan_ticks {} is out of range: {} to {}",
                self.rescan_ticks,
                RESCAN_TICKS.start(),
                RESCAN_TICKS.end()
            )));
        }
        Ok(())
    }
}

/// `[api]`: the HTTP API (docs/api.md). Served on a unix socket (mode 0600, like the control
/// socket) unless disabled; on TCP only when `listen` is set, and then only to requests that
/// carry the bearer token of `token_file`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Serve the HTTP API at all. Default true.
    pub enable: bool,
    /// Unix socket of the HTTP API. Default `/run/vmtier/api.sock`.
    pub socket: PathBuf,
    /// Also listen on this TCP address (`"127.0.0.1:9464"`); requires `token_file`.
    /// Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<std::net::SocketAddr>,
    /// File holding the bearer token TCP clients must send (`Authorization: Bearer ...`):
    /// one line of 16 to 4096 printable characters, readable by vmtierd's user only.
    /// Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Largest request body, bytes (larger: 413). 1 KiB to 1 MiB. Default 64 KiB.
    pub max_body_bytes: u64,
    /// Requests per second over all clients, with bursts of as many (more: 429). 1 to
    /// 10000. Default 50.
    pub rate_limit_per_s: u32,
    /// Ticks each VM's tick ring keeps for `heatmap` (docs/daemon.md); 0 keeps none.
    /// 0 to 3600. Default 120.
    pub heatmap_ticks: u32,
    /// Address buckets per tick in the ring (fewer when the VM has fewer granules).
    /// 1 to 4096. Default 256.
    pub heatmap_buckets: u32,
}

/// `[api] heatmap_ticks`: 0 to 3600.
pub const API_HEATMAP_TICKS: RangeInclusive<u64> = 0..=3600;
/// `[api] heatmap_buckets`: 1 to 4096.
pub const API_HEATMAP_BUCKETS: RangeInclusive<u64> = 1..=4096;
/// `[api] heatmap_ticks × heatmap_buckets`: at most 2^20 cells (a 3 MiB ring per VM, a
/// heatmap answer of a few MiB of JSON).
pub const API_HEATMAP_CELLS: u64 = 1 << 20;

/// `[api] max_body_bytes`: 1 KiB to 1 MiB.
pub const API_MAX_BODY: RangeInclusive<u64> = 1024..=(1 << 20);
/// `[api] rate_limit_per_s`: 1 to 10000.
pub const API_RATE: RangeInclusive<u64> = 1..=10_000;

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            enable: true,
            socket: PathBuf::from("/run/vmtier/api.sock"),
            listen: None,
            token_file: None,
            max_body_bytes: 64 << 10,
            rate_limit_per_s: 50,
            heatmap_ticks: crate::ring::DEFAULT_TICKS,
            heatmap_buckets: crate::ring::DEFAULT_BUCKETS,
        }
    }
}

/// `[daemon]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Control socket. Default `/run/vmtier/vmtierd.sock`.
    pub socket: PathBuf,
    /// Tick length in milliseconds. Default 1000.
    pub interval_ms: u64,
    /// The DRAM node. Default 0.
    pub fast_node: NodeId,
    /// The CXL node. Default 1.
    pub slow_node: NodeId,
    /// Migration rate limit over all VMs, in MB/s (10^6 bytes). Default 256.
    pub rate_limit_mbps: u64,
    /// Hotness source: `auto` (DAMON vaddr if the kernel has it, else soft-dirty),
    /// `damon-vaddr` or `soft-dirty`. Default `auto`.
    pub source: Choice,
    /// Placement policy name from the registry. Default `default`.
    pub policy: String,
    /// The policy's own parameters (`[daemon.policy_params]`); unknown keys refused.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub policy_params: toml::Table,
    /// Placement granule: the unit of tracking and migration, a power of two from 4K to 2M.
    /// 2M moves transparent huge pages whole. Default 2M.
    pub granule: GranuleSize,
    /// Re-read where pages really are every this many ticks (the kernel may move pages
    /// too). Default 10.
    pub refresh_ticks: u64,
    /// How the periodic refresh reads placement: `sampled` (a few probe pages per granule,
    /// the whole granule only where a probe disagrees with what vmtierd believes) or `full`
    /// (every page). The first read at attach and the one after a layout change are always
    /// full. Default `sampled`.
    pub refresh: RefreshMode,
    /// How pages move: `auto` (the vmtier kernel module for private anonymous 4 KiB pages
    /// when `/dev/vmtier` exists, move_pages(2) for the rest), `move_pages`, or `kmod`
    /// (the module required). Default `auto`.
    pub migrator: MigratorChoice,
    /// The module's copy engine: `auto`, `cpu` or `dma`. Default `auto`.
    pub kmod_engine: CopyEngine,
    /// CPU threads or DMA channels per module call; 0 = the module's default, at most 64.
    /// Default 0.
    pub kmod_workers: u32,
    /// Hybrid 2 MiB / 4 KiB tracking (needs `granule = "2M"`): the most 2 MiB regions, in
    /// percent of the VM's, that keep 4 KiB detail where their heat is mixed; 0 = off,
    /// at most 100. Default 0.
    pub detail_percent: u8,
    /// DAMON's monitoring attributes (`[daemon.damon]`), for every VM DAMON watches.
    pub damon: DamonAttrs,
}

/// `sample_us`: 100 µs to 1 s.
pub const DAMON_SAMPLE_US: RangeInclusive<u64> = 100..=1_000_000;
/// `aggr_us`: at most 60 s (DAMON itself sets no upper bound).
pub const DAMON_MAX_AGGR_US: u64 = 60_000_000;
/// `max_nr_regions`: at most 10,000 (a tick's trace records at 10 windows a tick, twice,
/// fit the largest ring the source maps, 16 MiB).
pub const DAMON_MAX_REGIONS: RangeInclusive<u64> = 3..=10_000;

/// `[daemon.damon]`: DAMON's monitoring attributes (docs/sources.md). DAMON checks one
/// random page per region every `sample_us` and reports each region's count at the end of
/// every `aggr_us` window; regions split and merge between `min_nr_regions` and
/// `max_nr_regions`, which bounds both what DAMON can resolve and what it costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DamonAttrs {
    /// Access-check sampling interval, µs. Default 5000.
    pub sample_us: u64,
    /// Aggregation window, µs, from `sample_us` to 60 s. Default 100000. A window longer
    /// than the tick (`interval_ms`) leaves some ticks without a report from DAMON.
    pub aggr_us: u64,
    /// DAMON never merges a region beyond guest RAM / this; 3 to `max_nr_regions`.
    /// Default 520.
    pub min_nr_regions: u64,
    /// The most regions, 3 to 10000. Default 1560.
    pub max_nr_regions: u64,
}

impl Default for DamonAttrs {
    fn default() -> Self {
        let a = vmtier_sources::DamonConfig::default().attrs;
        Self {
            sample_us: a.sample_us,
            aggr_us: a.aggr_us,
            min_nr_regions: a.min_nr_regions,
            max_nr_regions: a.max_nr_regions,
        }
    }
}

impl DaemonConfig {
    /// The DAMON source's configuration: `[daemon.damon]`, its trace ring sized for the
    /// daemon's tick.
    pub fn damon_config(&self) -> vmtier_sources::DamonConfig {
        let mut c = vmtier_sources::DamonConfig {
            tick_ms: self.interval_ms,
            ..vmtier_sources::DamonConfig::default()
        };
        let d = self.damon;
        c.attrs.sample_us = d.sample_us;
        c.attrs.aggr_us = d.aggr_us;
        c.attrs.min_nr_regions = d.min_nr_regions;
        c.attrs.max_nr_regions = d.max_nr_regions;
        c
    }
}

/// `[daemon] refresh`: how the periodic placement refresh reads where pages are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefreshMode {
    /// [`REFRESH_PROBES`](crate::engine::REFRESH_PROBES) pages per granule, the whole
    /// granule where they disagree with the store.
    #[default]
    Sampled,
    /// Every page.
    Full,
}

/// `[daemon] migrator`: how pages move.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigratorChoice {
    /// The kernel module where it exists (and can move the range), else move_pages(2).
    #[default]
    Auto,
    /// move_pages(2) only.
    MovePages,
    /// The kernel module is required (move_pages(2) still moves what it cannot).
    Kmod,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/run/vmtier/vmtierd.sock"),
            interval_ms: 1000,
            fast_node: NodeId::new(0),
            slow_node: NodeId::new(1),
            rate_limit_mbps: 256,
            source: Choice::Auto,
            policy: "default".into(),
            policy_params: toml::Table::new(),
            granule: GranuleSize::HUGE,
            refresh_ticks: 10,
            refresh: RefreshMode::Sampled,
            migrator: MigratorChoice::Auto,
            kmod_engine: CopyEngine::Auto,
            kmod_workers: 0,
            detail_percent: 0,
            damon: DamonAttrs::default(),
        }
    }
}

impl Config {
    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let cfg: Config = toml::from_str(text).map_err(|e| Error::Parse(one_line(text, &e)))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Read(path.into(), e))?;
        Self::parse(&text)
    }

    /// A fresh instance of the configured policy (one per VM: policies keep state).
    pub fn build_policy(
        &self,
    ) -> Result<Box<dyn vmtier_core::policy::PlacementPolicy>, vmtier_policies::registry::Error>
    {
        let params = &self.daemon.policy_params;
        vmtier_policies::registry::build(
            &self.daemon.policy,
            (!params.is_empty()).then_some(params),
        )
    }

    fn validate(&self) -> Result<(), Error> {
        let d = &self.daemon;
        let bounds: [(&str, u64, RangeInclusive<u64>, &str); 6] = [
            ("interval_ms", d.interval_ms, INTERVAL_MS, " ms"),
            (
                "rate_limit_mbps",
                d.rate_limit_mbps,
                RATE_LIMIT_MBPS,
                " MB/s",
            ),
            ("refresh_ticks", d.refresh_ticks, REFRESH_TICKS, ""),
            ("kmod_workers", d.kmod_workers.into(), KMOD_WORKERS, ""),
            (
                "api.max_body_bytes",
                self.api.max_body_bytes,
                API_MAX_BODY,
                " bytes",
            ),
            (
                "api.rate_limit_per_s",
                self.api.rate_limit_per_s.into(),
                API_RATE,
                "/s",
            ),
        ];
        let heatmap = [
            (
                "api.heatmap_ticks",
                self.api.heatmap_ticks.into(),
                API_HEATMAP_TICKS,
                " ticks",
            ),
            (
                "api.heatmap_buckets",
                self.api.heatmap_buckets.into(),
                API_HEATMAP_BUCKETS,
                " buckets",
            ),
        ];
        for (key, value, range, unit) in bounds.into_iter().chain(heatmap) {
            if !range.contains(&value) {
                return Err(Error::Invalid(format!(
                    "{key} {value} is out of range: {}{unit} to {}{unit}",
                    range.start(),
                    range.end()
                )));
            }
        }
        let cells = u64::from(self.api.heatmap_ticks) * u64::from(self.api.heatmap_buckets);
        if cells > API_HEATMAP_CELLS {
            return Err(Error::Invalid(format!(
                "api.heatmap_ticks × api.heatmap_buckets is {cells} cells, above the largest, \
                 {API_HEATMAP_CELLS} (3 bytes each per VM)"
            )));
        }
        for (key, node) in [("fast_node", d.fast_node), ("slow_node", d.slow_node)] {
            if node.raw() >= MAX_NODES {
                return Err(Error::Invalid(format!(
                    "{key} {node} is not a node id (0 to {})",
                    MAX_NODES - 1
                )));
            }
        }
        let a = d.damon;
        let damon: [(&str, u64, RangeInclusive<u64>, &str); 4] = [
            ("damon.sample_us", a.sample_us, DAMON_SAMPLE_US, " µs"),
            (
                "damon.aggr_us",
                a.aggr_us,
                a.sample_us..=DAMON_MAX_AGGR_US,
                " µs (sample_us to 60 s)",
            ),
            (
                "damon.max_nr_regions",
                a.max_nr_regions,
                DAMON_MAX_REGIONS,
                "",
            ),
            (
                "damon.min_nr_regions",
                a.min_nr_regions,
                3..=a.max_nr_regions,
                " (3 to max_nr_regions)",
            ),
        ];
        for (key, value, range, what) in damon {
            if !range.contains(&value) {
                return Err(Error::Invalid(format!(
                    "{key} {value} is out of range: {} to {}{what}",
                    range.start(),
                    range.end()
                )));
            }
        }
        if d.detail_percent > 100 {
            return Err(Error::Invalid(format!(
                "detail_percent {} is out of range: 0 to 100",
                d.detail_percent
            )));
        }
        if d.detail_percent > 0 && d.granule != GranuleSize::HUGE {
            return Err(Error::Invalid(format!(
                "detail_percent needs granule = \"2M\" (granule is {})",
                d.granule
            )));
        }
        let sock = d.socket.as_os_str().len();
        if d.socket.file_name().is_none() || sock > MAX_SOCKET_PATH {
            return Err(Error::Invalid(format!(
                "socket {:?}: give a file path of at most {MAX_SOCKET_PATH} bytes",
                d.socket
            )));
        }
        let api = &self.api;
        if api.socket.file_name().is_none() || api.socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(Error::Invalid(format!(
                "api.socket {:?}: give a file path of at most {MAX_SOCKET_PATH} bytes",
                api.socket
            )));
        }
        if api.enable && api.socket == d.socket {
            return Err(Error::Invalid(format!(
                "api.socket and daemon.socket are both {:?}",
                api.socket
            )));
        }
        if api.enable && api.listen.is_some() && api.token_file.is_none() {
            return Err(Error::Invalid(
                "api.listen needs api.token_file: TCP clients must send a bearer token".into(),
            ));
        }
        if d.fast_node == d.slow_node {
            return Err(Error::Invalid(format!(
                "fast_node and slow_node are both {}",
                d.fast_node
            )));
        }
        let policy = self.build_policy().map_err(|e| {
            let detail = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            Error::Invalid(flat(&format!("{e}{detail}")))
        })?;
        check_policy(policy.as_ref()).map_err(Error::Invalid)?;
        let mut names: Vec<&VmId> = self.vms.iter().map(|v| &v.name).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::Invalid(format!("VM {} is configured twice", w[0])));
        }
        if let Some(l) = &self.libvirt {
            l.validate()?;
        }
        self.vms.iter().try_for_each(|v| {
            v.validate()
                .map_err(|vmtier_api::vm::Error::Invalid(reason)| Error::Invalid(reason))
        })
    }
}

/// Whether vmtierd can run `policy`: it feeds policies the store's records (heat from DAMON
/// or soft-dirty); policies that plan from other observations would get none.
pub fn check_policy(policy: &dyn vmtier_core::policy::PlacementPolicy) -> Result<(), String> {
    let needs = match policy.source() {
        TrackingSource::AbitScan | TrackingSource::None => None,
        TrackingSource::HintFaults => Some("NUMA hint faults"),
        TrackingSource::Sampling => Some("IBS/PEBS samples"),
        TrackingSource::DamonRegions => Some("DAMON regions"),
        TrackingSource::SoftDirty => None,
    };
    match needs {
        None => Ok(()),
        Some(what) => Err(format!(
            "policy {} plans from {what}, which vmtierd does not feed it; it is a baseline \
             for vmtier-sim (vmtierd runs policies that read heat records: default, memtierd, \
             first-touch)",
            policy.name()
        )),
    }
}

/// Builds the policy `name` with parameters given as JSON (the API's `params`), checked as
/// `[daemon] policy` and `[daemon.policy_params]` are.
pub fn build_policy_json(
    name: &str,
    params: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Box<dyn vmtier_core::policy::PlacementPolicy>, String> {
    let table = match params {
        None => None,
        Some(p) => match toml::Value::try_from(p) {
            Ok(toml::Value::Table(t)) => Some(t),
            Ok(_) => return Err("params must be an object".into()),
            Err(e) => return Err(flat(&format!("params: {e}"))),
        },
    };
    let policy = vmtier_policies::registry::build(name, table.as_ref()).map_err(|e| {
        let detail = std::error::Error::source(&e)
            .map(|s| format!(": {s}"))
            .unwrap_or_default();
        flat(&format!("{e}{detail}"))
    })?;
    check_policy(policy.as_ref())?;
    Ok(policy)
}

/// A TOML error as one line: `line 2, column 1: unknown field ...`.
fn one_line(text: &str, e: &toml::de::Error) -> String {
    let msg = flat(e.message());
    match e.span() {
        Some(span) => {
            let mut at = span.start.min(text.len());
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            let before = &text[..at];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {msg}")
        }
        None => msg,
    }
}

/// A message on one line, for the log: line breaks become spaces, other control characters
/// (from the file's own text, such as a policy name) are escaped.
fn flat(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.trim_end().chars() {
        match c {
            '\n' => out.push(' '),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmtier_core::{ByteSize, HostVirtAddr};

    #[test]
    fn full_example_parses() {
        let cfg = Config::parse(
            r#"
            [daemon]
            socket = "/tmp/v.sock"
            interval_ms = 500
            rate_limit_mbps = 100
            granule = "4K"

            [[vm]]
            name = "web1"
            qmp = "/run/web1.qmp"
            budget = "64M"

            [[vm]]
            name = "batch"
            pid = 4242
            budget = 1073741824
            ranges = [{ start = "0x7f0000000000", len = "256M" }]
            "#,
        )
        .unwrap();
        assert_eq!(cfg.daemon.interval_ms, 500);
        assert_eq!(cfg.daemon.granule, GranuleSize::BASE);
        assert_eq!(cfg.daemon.policy, "default");
        assert_eq!(cfg.vms.len(), 2);
        assert_eq!(
            cfg.vms[1].ranges[0].start,
            HostVirtAddr::new(0x7f00_0000_0000)
        );
        assert_eq!(cfg.vms[1].budget, ByteSize(1 << 30));
        // DAMON's defaults, its ring sized for the 500 ms tick.
        let d = cfg.daemon.damon_config();
        assert_eq!(
            (d.tick_ms, d.attrs.sample_us, d.attrs.aggr_us),
            (500, 5000, 100_000)
        );
        assert_eq!(
            (d.attrs.min_nr_regions, d.attrs.max_nr_regions),
            (520, 1560)
        );
    }

    #[test]
    fn damon_attributes_reach_the_source() {
        let cfg = Config::parse(
            "[daemon]\ninterval_ms = 2000\n[daemon.damon]\nsample_us = 2000\naggr_us = 200000\nmin_nr_regions = 600\nmax_nr_regions = 1800\n",
        )
        .unwrap();
        let d = cfg.daemon.damon_config();
        assert_eq!(d.tick_ms, 2000);
        let a = d.attrs;
        assert_eq!(
            (a.sample_us, a.aggr_us, a.min_nr_regions, a.max_nr_regions),
            (2000, 200_000, 600, 1800)
        );
        assert_eq!(
            a.update_us, 1_000_000,
            "not configurable: no effect with fvaddr"
        );
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let cases = [
            ("[daemon]\nintervall_ms = 5\n", "line 2, column 1: unknown field `intervall_ms`"),
            ("[daemon]\ngranule = \"3M\"\n", "granule"),
            ("[daemon]\ngranule = \"lots\"\n", "Invalid size"),
            ("[daemon]\nfast_node = 1\n", "both 1"),
            ("[daemon]\nsource = \"magic\"\n", "line 2, column 10: unknown variant `magic`, expected one of `auto`, `damon`, `damon-vaddr`, `soft-dirty`"),
            ("[daemon]\nrefresh = \"some\"\n", "line 2, column 11: unknown variant `some`, expected `sampled` or `full`"),
            ("[daemon]\nmigrator = \"teleport\"\n", "line 2, column 12: unknown variant `teleport`, expected one of `auto`, `move_pages`, `kmod`"),
            ("[daemon]\nkmod_engine = \"gpu\"\n", "line 2, column 15: unknown variant `gpu`, expected one of `auto`, `cpu`, `dma`"),
            ("[daemon]\nkmod_engine = 1\n", "line 2, column 15"),
            ("[daemon]\ninterval_ms = 0\n", "interval_ms 0 is out of range: 10 ms to 3600000 ms"),
            ("[daemon]\ninterval_ms = 9\n", "interval_ms 9 is out of range"),
            ("[daemon]\ninterval_ms = 3600001\n", "interval_ms 3600001 is out of range"),
            ("[daemon]\ninterval_ms = 9223372036854775807\n", "interval_ms 9223372036854775807 is out of range"),
            ("[daemon]\ninterval_ms = -1\n", "line 2, column 15"),
            ("[daemon]\nrate_limit_mbps = 0\n", "rate_limit_mbps 0 is out of range: 1 MB/s to 1000000 MB/s"),
            ("[daemon]\nrate_limit_mbps = 18446744073709\n", "rate_limit_mbps 18446744073709 is out of range"),
            ("[daemon]\nrefresh_ticks = 1000001\n", "refresh_ticks 1000001 is out of range: 0 to 1000000"),
            ("[daemon]\nkmod_workers = 65\n", "kmod_workers 65 is out of range: 0 to 64"),
            ("[daemon]\ndetail_percent = 101\n", "detail_percent 101 is out of range: 0 to 100"),
            ("[daemon.damon]\nsample_us = 99\n", "damon.sample_us 99 is out of range: 100 to 1000000 µs"),
            ("[daemon.damon]\naggr_us = 4999\n", "damon.aggr_us 4999 is out of range: 5000 to 60000000 µs (sample_us to 60 s)"),
            ("[daemon.damon]\naggr_us = 60000001\n", "damon.aggr_us 60000001 is out of range"),
            ("[daemon.damon]\nmax_nr_regions = 10001\n", "damon.max_nr_regions 10001 is out of range: 3 to 10000"),
            ("[daemon.damon]\nmin_nr_regions = 2\n", "damon.min_nr_regions 2 is out of range: 3 to 1560 (3 to max_nr_regions)"),
            ("[daemon.damon]\nmax_nr_regions = 300\n", "damon.min_nr_regions 520 is out of range: 3 to 300"),
            ("[daemon.damon]\nmax_regions = 300\n", "unknown field `max_regions`"),
            ("[daemon.damon]\nsample_us = -1\n", "line 2, column 13"),
            ("[daemon]\ndetail_percent = 256\n", "line 2, column 18"),
            ("[daemon]\ngranule = \"4K\"\ndetail_percent = 20\n", "detail_percent needs granule = \"2M\" (granule is 4 KiB)"),
            ("[daemon]\nkmod_workers = 4294967296\n", "line 2, column 16"),
            ("[daemon]\nfast_node = 1024\nslow_node = 0\n", "fast_node 1024 is not a node id (0 to 1023)"),
            ("[daemon]\nslow_node = 4294967295\n", "slow_node 4294967295 is not a node id"),
            ("[daemon]\nsocket = \"/\"\n", "socket \"/\": give a file path"),
            (&format!("[daemon]\nsocket = \"/{}\"\n", "s".repeat(107)), "at most 107 bytes"),
            ("[daemon]\npolicy = \"nope\"\n", "Unknown policy nope"),
            ("[api]\nlisten = \"127.0.0.1:9464\"\n", "api.listen needs api.token_file"),
            ("[api]\nlisten = \"localhost:9464\"\n", "line 2, column 10"),
            ("[api]\nmax_body_bytes = 100\n", "api.max_body_bytes 100 is out of range: 1024 bytes to 1048576 bytes"),
            ("[api]\nrate_limit_per_s = 0\n", "api.rate_limit_per_s 0 is out of range: 1/s to 10000/s"),
            ("[api]\nheatmap_ticks = 3601\n", "api.heatmap_ticks 3601 is out of range: 0 ticks to 3600 ticks"),
            ("[api]\nheatmap_buckets = 0\n", "api.heatmap_buckets 0 is out of range: 1 buckets to 4096 buckets"),
            ("[api]\nheatmap_bucket = 8\n", "unknown field `heatmap_bucket`"),
            ("[api]\nheatmap_ticks = 3600\nheatmap_buckets = 4096\n", "api.heatmap_ticks × api.heatmap_buckets is 14745600 cells, above the largest, 1048576"),
            ("[api]\nsocket = \"/\"\n", "api.socket \"/\": give a file path"),
            ("[api]\ntoken = \"x\"\n", "unknown field `token`"),
            ("[api]\nsocket = \"/run/vmtier/vmtierd.sock\"\n", "api.socket and daemon.socket are both"),
            ("[daemon]\npolicy = \"numab\"\n", "plans from NUMA hint faults"),
            ("[daemon]\npolicy = \"memtis\"\n", "plans from IBS/PEBS samples"),
            // Found by the config fuzz target: the name's line break reached the log.
            ("[daemon]\npolicy = \"a\\nb\\u001b[2J\"\n", "Unknown policy a b\\u{1b}[2J"),
            ("[daemon.policy_params]\nswap_margn = 1\n", "unknown field"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\n", "give qmp"),
            ("[[vm]]\nname = \"a b\"\nbudget = \"1G\"\nqmp = \"/x\"\n", "Invalid VM name"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/x\"\npid = 3\nranges = [{ start = \"0x1000\", len = \"4K\" }]\n", "not with qmp"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\n", "needs ranges"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 0\nranges = [{ start = \"0x1000\", len = \"4K\" }]\n", "VM a: pid 0 is not a process id"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = -7\nranges = [{ start = \"0x1000\", len = \"4K\" }]\n", "VM a: pid -7 is not a process id"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/x\"\npid = 0\n", "VM a: pid 0"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 2147483648\nranges = []\n", "line 4, column 7"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1025T\"\nqmp = \"/x\"\n", "VM a: budget 1025 TiB is above the largest, 1024 TiB"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\nranges = [{ start = \"0xfffffffffffff000\", len = \"8K\" }]\n", "ends beyond any process's address space (0x200000000000000)"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\nranges = [{ start = \"0x1000\", len = \"16000000T\" }]\n", "ends beyond"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\nranges = [{ start = \"0x1000\", len = 0 }]\n", "empty or not 4 KiB aligned"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\nranges = [{ start = \"0x1001\", len = \"4K\" }]\n", "not 4 KiB aligned"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\nranges = [{ start = \"0x10000\", len = \"8K\" }, { start = \"0x11000\", len = \"4K\" }]\n", "ranges at 0x10000 and 0x11000 overlap"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\nranges = [{ start = \"7f\", len = \"1M\" }]\n", "0x"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/x\"\n[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/y\"\n", "twice"),
        ];
        for (text, want) in cases {
            let err = Config::parse(text).unwrap_err().to_string();
            assert!(!err.chars().any(char::is_control), "one line: {err:?}");
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn bounds_and_names_that_users_write_are_accepted() {
        type Check = fn(&Config) -> bool;
        let cases: [(&str, Check); 13] = [
            ("interval_ms = 10", |c| c.daemon.interval_ms == 10),
            ("interval_ms = 3600000", |c| {
                c.daemon.interval_ms == 3_600_000
            }),
            ("rate_limit_mbps = 1", |c| c.daemon.rate_limit_mbps == 1),
            ("rate_limit_mbps = 1000000", |c| {
                c.daemon.rate_limit_mbps == 1_000_000
            }),
            ("refresh_ticks = 0", |c| c.daemon.refresh_ticks == 0),
            ("refresh = \"full\"", |c| {
                c.daemon.refresh == RefreshMode::Full
            }),
            ("kmod_workers = 64", |c| c.daemon.kmod_workers == 64),
            ("fast_node = 1023", |c| c.daemon.fast_node.raw() == 1023),
            ("source = \"damon\"", |c| {
                c.daemon.source == Choice::Force(vmtier_sources::SourceKind::DamonVaddr)
            }),
            ("source = \"soft-dirty\"", |c| {
                c.daemon.source == Choice::Force(vmtier_sources::SourceKind::SoftDirty)
            }),
            ("migrator = \"move_pages\"", |c| {
                c.daemon.migrator == MigratorChoice::MovePages
            }),
            ("migrator = \"kmod\"", |c| {
                c.daemon.migrator == MigratorChoice::Kmod
            }),
            ("kmod_engine = \"dma\"", |c| {
                c.daemon.kmod_engine == CopyEngine::Dma
            }),
        ];
        for (line, check) in cases {
            let cfg = Config::parse(&format!("[daemon]\n{line}\n")).unwrap();
            assert!(check(&cfg), "{line}");
        }
        let vm = "[[vm]]\nname = \"big\"\nbudget = \"1024T\"\npid = 1\n\
                  ranges = [{ start = \"0x1000\", len = \"4K\" }, { start = \"0x2000\", len = \"4K\" }]\n";
        assert_eq!(
            Config::parse(vm).unwrap().vms[0].budget,
            ByteSize(MAX_BUDGET)
        );
    }

    #[test]
    fn names_serialize_as_written() {
        let d = DaemonConfig {
            source: Choice::Force(vmtier_sources::SourceKind::SoftDirty),
            migrator: MigratorChoice::MovePages,
            kmod_engine: CopyEngine::Cpu,
            ..DaemonConfig::default()
        };
        let text = toml::to_string(&d).unwrap();
        for want in [
            "source = \"soft-dirty\"",
            "migrator = \"move_pages\"",
            "kmod_engine = \"cpu\"",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
    }

    #[test]
    fn the_commented_example_parses_and_states_the_defaults() {
        let text = include_str!("../vmtierd.example.toml");
        let cfg = Config::parse(text).unwrap();
        let mut d = cfg.daemon.clone();
        d.policy_params = toml::Table::new();
        assert_eq!(
            d,
            DaemonConfig::default(),
            "the example's [daemon] values are the defaults"
        );
        assert_eq!(cfg.api, ApiConfig::default(), "and its [api] values");
        assert_eq!(cfg.vms.len(), 2);
    }

    #[test]
    fn defaults_are_documented_values() {
        let d = DaemonConfig::default();
        assert_eq!(
            (
                d.interval_ms,
                d.fast_node.raw(),
                d.slow_node.raw(),
                d.rate_limit_mbps,
                d.granule.bytes(),
                d.refresh_ticks
            ),
            (1000, 0, 1, 256, 2 << 20, 10)
        );
    }

    #[test]
    fn libvirt_table_has_defaults_and_bounds() {
        let cases: [(&str, Result<Option<LibvirtConfig>, &str>); 6] = [
            ("", Ok(None)),
            ("[libvirt]", Ok(Some(LibvirtConfig::default()))),
            (
                "[libvirt]\nuri = \"qemu:///session\"\nmanage_all = true\ndefault_budget = \"64M\"\nrescan_ticks = 0",
                Ok(Some(LibvirtConfig {
                    uri: "qemu:///session".into(),
                    manage_all: true,
                    default_budget: ByteSize(64 << 20),
                    rescan_ticks: 0,
                    ..LibvirtConfig::default()
                })),
            ),
            ("[libvirt]\nuri = \"\"", Err("Invalid config: libvirt.uri \"\" is not a URI")),
            (
                "[libvirt]\nrescan_ticks = 1000001",
                Err("Invalid config: libvirt.rescan_ticks 1000001 is out of range"),
            ),
            ("[libvirt]\nmanage = true", Err("Invalid config: line 2, column 1: unknown field")),
        ];
        for (text, want) in cases {
            match (Config::parse(text), want) {
                (Ok(c), Ok(w)) => assert_eq!(c.libvirt, w, "{text}"),
                (Err(e), Err(w)) => assert!(e.to_string().starts_with(w), "{text}: {e}"),
                (got, _) => panic!("{text}: {got:?}"),
            }
        }
    }
}
