//! vmtierd's TOML configuration. Every table refuses unknown keys; every option has a
//! documented default (docs/config.md lists them with examples).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vmtier_core::{ByteSize, HostVirtAddr, NodeId, ProcessId, VmId};

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
    pub source: String,
    /// Placement policy name from the registry. Default `default`.
    pub policy: String,
    /// The policy's own parameters (`[daemon.policy_params]`); unknown keys refused.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub policy_params: toml::Table,
    /// Placement granule: the unit of tracking and migration, a power of two from 4K to 2M.
    /// 2M moves transparent huge pages whole. Default 2M.
    pub granule: ByteSize,
    /// Re-read where every page really is every this many ticks (the kernel may move
    /// pages too). Default 10.
    pub refresh_ticks: u64,
    /// How pages move: `auto` (the vmtier kernel module for private anonymous 4 KiB pages
    /// when `/dev/vmtier` exists, move_pages(2) for the rest), `move_pages`, or `kmod`
    /// (the module required). Default `auto`.
    pub migrator: String,
    /// The module's copy engine: `auto`, `cpu` or `dma`. Default `auto`.
    pub kmod_engine: String,
    /// CPU threads or DMA channels per module call; 0 = the module's default. Default 0.
    pub kmod_workers: u32,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/run/vmtier/vmtierd.sock"),
            interval_ms: 1000,
            fast_node: NodeId::new(0),
            slow_node: NodeId::new(1),
            rate_limit_mbps: 256,
            source: "auto".into(),
            policy: "default".into(),
            policy_params: toml::Table::new(),
            granule: ByteSize(2 << 20),
            refresh_ticks: 10,
            migrator: "auto".into(),
            kmod_engine: "auto".into(),
            kmod_workers: 0,
        }
    }
}

/// A host virtual range of a plain process (`ranges = [{ start = "0x7f...", len = "64M" }]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeConfig {
    /// First address, as a `0x` hex string or an integer.
    #[serde(with = "hex_addr")]
    pub start: HostVirtAddr,
    /// Length.
    pub len: ByteSize,
}

/// One managed VM (`[[vm]]`). Exactly one of `qmp` or `pid` says how to reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Name used by vmtierctl and in metrics.
    pub name: VmId,
    /// DRAM the VM may use.
    pub budget: ByteSize,
    /// QEMU's QMP unix socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qmp: Option<PathBuf>,
    /// With `qmp`: QEMU's pid, when the socket is served by a proxy (otherwise the pid is
    /// the socket peer's). Without `qmp`: a plain process whose `ranges` are managed as if
    /// they were guest RAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<ProcessId>,
    /// With `pid`: the ranges to manage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<RangeConfig>,
}

impl VmConfig {
    /// Checks the backend choice.
    pub fn validate(&self) -> Result<(), Error> {
        let name = &self.name;
        match (&self.qmp, self.pid, self.ranges.is_empty()) {
            (Some(_), _, true) | (None, Some(_), false) => Ok(()),
            (Some(_), _, false) => Err(Error::Invalid(format!(
                "VM {name}: ranges go with pid alone, not with qmp"
            ))),
            (None, Some(_), true) => Err(Error::Invalid(format!(
                "VM {name}: pid needs ranges (or give qmp)"
            ))),
            (None, None, _) => Err(Error::Invalid(format!(
                "VM {name}: give qmp (a QEMU QMP socket) or pid + ranges"
            ))),
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
        let g = d.granule.0;
        if !(4096..=2 << 20).contains(&g) || !g.is_power_of_two() {
            return Err(Error::Invalid(format!(
                "granule {} is not a power of two from 4 KiB to 2 MiB",
                d.granule
            )));
        }
        if d.interval_ms == 0 {
            return Err(Error::Invalid("interval_ms must be positive".into()));
        }
        if d.fast_node == d.slow_node {
            return Err(Error::Invalid(format!(
                "fast_node and slow_node are both {}",
                d.fast_node
            )));
        }
        if !["auto", "move_pages", "kmod"].contains(&d.migrator.as_str()) {
            return Err(Error::Invalid(format!(
                "migrator {:?}: expected auto, move_pages or kmod",
                d.migrator
            )));
        }
        d.kmod_engine
            .parse::<vmtier_migrate::kmod::CopyEngine>()
            .map_err(|e| Error::Invalid(format!("kmod_engine: {e}")))?;
        if !["auto", "damon-vaddr", "soft-dirty"].contains(&d.source.as_str()) {
            return Err(Error::Invalid(format!(
                "source {:?}: expected auto, damon-vaddr or soft-dirty",
                d.source
            )));
        }
        self.build_policy().map_err(|e| {
            let detail = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            Error::Invalid(format!("{e}{detail}"))
        })?;
        let mut names: Vec<&VmId> = self.vms.iter().map(|v| &v.name).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::Invalid(format!("VM {} is configured twice", w[0])));
        }
        self.vms.iter().try_for_each(VmConfig::validate)
    }
}

/// A TOML error as one line: `line 2, column 1: unknown field ...`.
fn one_line(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim_end().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {msg}")
        }
        None => msg,
    }
}

/// Addresses as `"0x7f..."` strings (or plain integers) in TOML.
mod hex_addr {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use vmtier_core::HostVirtAddr;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Int(u64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(a: &HostVirtAddr, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&a.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<HostVirtAddr, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Int(v) => Ok(HostVirtAddr::new(v)),
            Repr::Text(t) => {
                let hex = t.strip_prefix("0x").ok_or_else(|| {
                    de::Error::custom(format!("address {t:?} must start with 0x"))
                })?;
                u64::from_str_radix(hex, 16)
                    .map(HostVirtAddr::new)
                    .map_err(|_| de::Error::custom(format!("address {t:?} is not hexadecimal")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(cfg.daemon.granule, ByteSize(4096));
        assert_eq!(cfg.daemon.policy, "default");
        assert_eq!(cfg.vms.len(), 2);
        assert_eq!(
            cfg.vms[1].ranges[0].start,
            HostVirtAddr::new(0x7f00_0000_0000)
        );
        assert_eq!(cfg.vms[1].budget, ByteSize(1 << 30));
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        let cases = [
            ("[daemon]\nintervall_ms = 5\n", "line 2, column 1: unknown field `intervall_ms`"),
            ("[daemon]\ngranule = \"3M\"\n", "granule"),
            ("[daemon]\ngranule = \"lots\"\n", "Invalid size"),
            ("[daemon]\nfast_node = 1\n", "both 1"),
            ("[daemon]\nsource = \"magic\"\n", "source"),
            ("[daemon]\nmigrator = \"teleport\"\n", "migrator"),
            ("[daemon]\nkmod_engine = \"gpu\"\n", "kmod_engine"),
            ("[daemon]\npolicy = \"nope\"\n", "Unknown policy nope"),
            ("[daemon.policy_params]\nswap_margn = 1\n", "unknown field"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\n", "give qmp"),
            ("[[vm]]\nname = \"a b\"\nbudget = \"1G\"\nqmp = \"/x\"\n", "Invalid VM name"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/x\"\npid = 3\nranges = [{ start = \"0x1000\", len = \"4K\" }]\n", "not with qmp"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\n", "needs ranges"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\npid = 3\nranges = [{ start = \"7f\", len = \"1M\" }]\n", "0x"),
            ("[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/x\"\n[[vm]]\nname = \"a\"\nbudget = \"1G\"\nqmp = \"/y\"\n", "twice"),
        ];
        for (text, want) in cases {
            let err = Config::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
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
                d.granule.0,
                d.refresh_ticks
            ),
            (1000, 0, 1, 256, 2 << 20, 10)
        );
    }
}
