//! The agent's configuration file (TOML, `/etc/vmtier/agent.toml` by default). Every
//! section and every key is optional; unknown keys are errors. docs/guest-agent.md lists
//! each option with its default and an example.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ranges::Kind;

/// Where the agent looks for its configuration unless `--config` says otherwise.
pub const DEFAULT_PATH: &str = "/etc/vmtier/agent.toml";

/// Errors of loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("Failed to read {0}")]
    Read(PathBuf, #[source] std::io::Error),
    /// The file is not valid TOML for this schema.
    #[error("Invalid configuration in {0}")]
    Parse(PathBuf, #[source] Box<toml::de::Error>),
    /// A value is out of its range.
    #[error("Invalid configuration: {0}")]
    Invalid(String),
}

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[agent]`: the channel and the snapshot loop.
    pub agent: AgentConfig,
    /// `[free_pages]`: free guest memory from `/proc/kpageflags`.
    pub free_pages: FreePagesConfig,
    /// `[[process]]`: per-process rules.
    pub process: Vec<ProcessRule>,
    /// `[damon]`: the guest's own DAMON (`paddr`).
    pub damon: DamonConfig,
    /// `[pmu]`: perf samples with physical addresses.
    pub pmu: PmuConfig,
    /// `[app]`: the local socket applications mark their ranges through.
    pub app: AppConfig,
}

/// `[agent]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Name sent in HELLO (at most 32 bytes of UTF-8). Default `vmtier-agent`.
    pub name: String,
    /// Character device to the host: `auto` (the virtio-serial port named
    /// `org.vmtier.agent.0`) or a path such as `/dev/ttyS1`. Default `auto`.
    pub port: String,
    /// Time between snapshots, ms. Default 5000.
    pub interval_ms: u64,
    /// Time to wait for WELCOME before HELLO is sent again, ms. Default 2000.
    pub hello_retry_ms: u64,
    /// Upper bound on frames per second whatever the host allows. Default 20.
    pub max_frames_per_s: u32,
    /// Upper bound on bytes per second whatever the host allows. Default 262144.
    pub max_bytes_per_s: u32,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            name: "vmtier-agent".into(),
            port: "auto".into(),
            interval_ms: 5000,
            hello_retry_ms: 2000,
            max_frames_per_s: 20,
            max_bytes_per_s: 256 * 1024,
        }
    }
}

/// `[free_pages]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FreePagesConfig {
    /// Send FREE hints. Default true.
    pub enabled: bool,
    /// Smallest free range sent, bytes (a multiple of 4096). Default 4096.
    pub min_range_bytes: u64,
    /// Most ranges sent per snapshot; the largest are kept. Default 16384.
    pub max_ranges: usize,
    /// Weight of FREE hints (1..=255). Default 255.
    pub weight: u8,
}

impl Default for FreePagesConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_range_bytes: 4096,
            max_ranges: 16384,
            weight: 255,
        }
    }
}

/// One `[[process]]` rule: the resident pages of matching processes, as one kind.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProcessRule {
    /// Match processes whose `comm` (`/proc/PID/comm`) equals this.
    #[serde(default)]
    pub name: Option<String>,
    /// Match this pid.
    #[serde(default)]
    pub pid: Option<i32>,
    /// `hot`, `cold` or `pinned`.
    pub kind: Kind,
    /// Only mappings whose `/proc/PID/maps` path column equals one of these (`[heap]`,
    /// `[stack]`, `anon` for unnamed ones, or a file path). Empty: every mapping. Default empty.
    #[serde(default)]
    pub mappings: Vec<String>,
    /// Weight (1..=255). Default 128.
    #[serde(default = "default_weight")]
    pub weight: u8,
    /// Most resident bytes sent per matching process. Default 1 GiB.
    #[serde(default = "default_process_max_bytes")]
    pub max_bytes: u64,
}

fn default_weight() -> u8 {
    128
}

fn default_process_max_bytes() -> u64 {
    1 << 30
}

/// `[damon]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DamonConfig {
    /// Run a `paddr` kdamond when the kernel has one and send its hot regions. Default true.
    pub enabled: bool,
    /// DAMON sysfs admin directory. Default `/sys/kernel/mm/damon/admin`.
    pub sysfs: PathBuf,
    /// Sampling interval, µs. Default 5000.
    pub sample_us: u64,
    /// Aggregation interval, µs. Default 100000.
    pub aggr_us: u64,
    /// A region is hot when its `nr_accesses` is at least this share of the maximum,
    /// permille. Default 200.
    pub hot_permille: u32,
    /// Most hot regions sent per snapshot (hottest first). Default 256.
    pub max_ranges: usize,
}

impl Default for DamonConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sysfs: PathBuf::from(vmtier_sources::damon::DEFAULT_ROOT),
            sample_us: 5000,
            aggr_us: 100_000,
            hot_permille: 200,
            max_ranges: 256,
        }
    }
}

/// `[pmu]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PmuConfig {
    /// Sample memory accesses with their physical address where a (v)PMU exists. Default true.
    pub enabled: bool,
    /// One sample every this many events. Default 10007.
    pub sample_period: u64,
    /// A page is hot with at least this many samples in one snapshot. Default 2.
    pub min_samples: u32,
    /// Most hot pages sent per snapshot (most sampled first). Default 1024.
    pub max_ranges: usize,
}

impl Default for PmuConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            sample_period: 10007,
            min_samples: 2,
            max_ranges: 1024,
        }
    }
}

/// `[app]`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AppConfig {
    /// Listen on the socket. Default true.
    pub enabled: bool,
    /// Socket path. Default `/run/vmtier-agent.sock`.
    pub socket: PathBuf,
    /// Socket file mode (octal string). Default `"0660"`.
    pub mode: String,
    /// Group owning the socket (name or number); empty keeps root's. Default empty.
    pub group: String,
    /// Most clients connected at once. Default 16.
    pub max_clients: usize,
    /// Most marks per client. Default 64.
    pub max_marks_per_client: usize,
    /// Most bytes one mark may cover. Default 1 GiB.
    pub max_mark_bytes: u64,
    /// Weight of app hints (1..=255). Default 192.
    pub weight: u8,
}

impl Default for AppConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            socket: PathBuf::from("/run/vmtier-agent.sock"),
            mode: "0660".into(),
            group: String::new(),
            max_clients: 16,
            max_marks_per_client: 64,
            max_mark_bytes: 1 << 30,
            weight: 192,
        }
    }
}

impl AppConfig {
    /// The socket mode as a number.
    pub fn mode_bits(&self) -> Result<u32, Error> {
        u32::from_str_radix(self.mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| Error::Invalid(format!("app.mode {:?} is not an octal mode", self.mode)))
    }
}

impl Config {
    /// Parses `text` and checks every value.
    pub fn parse(text: &str, path: &Path) -> Result<Self, Error> {
        let c: Config =
            toml::from_str(text).map_err(|e| Error::Parse(path.to_owned(), Box::new(e)))?;
        c.validate()?;
        Ok(c)
    }

    /// Loads `path`; a missing file at the default path gives the defaults.
    pub fn load(path: &Path, explicit: bool) -> Result<Self, Error> {
        match std::fs::read_to_string(path) {
            Ok(t) => Self::parse(&t, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Self::default()),
            Err(e) => Err(Error::Read(path.to_owned(), e)),
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::Invalid(m));
        let a = &self.agent;
        if a.name.is_empty() || a.name.len() > 32 || a.name.contains('\0') {
            return bad(format!(
                "agent.name {:?}: need 1 to 32 bytes, no NUL",
                a.name
            ));
        }
        if !(100..=3_600_000).contains(&a.interval_ms) {
            return bad(format!(
                "agent.interval_ms {}: need 100 ..= 3600000",
                a.interval_ms
            ));
        }
        if !(100..=600_000).contains(&a.hello_retry_ms) {
            return bad(format!(
                "agent.hello_retry_ms {}: need 100 ..= 600000",
                a.hello_retry_ms
            ));
        }
        if a.max_frames_per_s == 0 || a.max_bytes_per_s < 4096 {
            return bad(
                "agent.max_frames_per_s must be > 0 and agent.max_bytes_per_s >= 4096".into(),
            );
        }
        let f = &self.free_pages;
        if f.min_range_bytes == 0 || f.min_range_bytes % 4096 != 0 {
            return bad(format!(
                "free_pages.min_range_bytes {}: need a positive multiple of 4096",
                f.min_range_bytes
            ));
        }
        for (what, w) in [
            ("free_pages.weight", f.weight),
            ("app.weight", self.app.weight),
        ] {
            if w == 0 {
                return bad(format!("{what}: need 1 ..= 255"));
            }
        }
        for (i, r) in self.process.iter().enumerate() {
            if r.name.is_none() == r.pid.is_none() {
                return bad(format!("process[{i}]: give exactly one of name and pid"));
            }
            if r.pid.is_some_and(|p| p <= 0) || r.weight == 0 || r.max_bytes == 0 {
                return bad(format!(
                    "process[{i}]: pid, weight and max_bytes must be positive"
                ));
            }
            if r.kind == Kind::Free {
                return bad(format!("process[{i}]: kind must be hot, cold or pinned"));
            }
        }
        let d = &self.damon;
        if d.sample_us == 0 || d.aggr_us < d.sample_us || d.hot_permille > 1000 {
            return bad("damon: need 0 < sample_us <= aggr_us and hot_permille <= 1000".into());
        }
        if self.pmu.sample_period == 0 {
            return bad("pmu.sample_period must be positive".into());
        }
        let p = &self.app;
        p.mode_bits()?;
        if p.max_clients == 0 || p.max_marks_per_client == 0 || p.max_mark_bytes < 4096 {
            return bad(
                "app: max_clients, max_marks_per_client > 0 and max_mark_bytes >= 4096".into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let p = Path::new("t.toml");
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("[agent]\ninterval_ms = 1000\nport = \"/dev/ttyS1\"", true),
            ("[agent]\nbogus = 1", false),
            ("[agent]\ninterval_ms = 10", false),
            ("[agent]\nname = \"\"", false),
            ("[free_pages]\nmin_range_bytes = 100", false),
            ("[[process]]\nname = \"memcached\"\nkind = \"hot\"", true),
            ("[[process]]\nname = \"x\"\npid = 3\nkind = \"hot\"", false),
            ("[[process]]\npid = 3\nkind = \"free\"", false),
            ("[[process]]\npid = 3\nkind = \"warm\"", false),
            ("[app]\nmode = \"0660\"", true),
            ("[app]\nmode = \"rw\"", false),
            ("[app]\nmax_clients = 0", false),
            ("[damon]\nhot_permille = 1001", false),
            ("[pmu]\nsample_period = 0", false),
        ];
        for (text, ok) in cases {
            assert_eq!(Config::parse(text, p).is_ok(), *ok, "{text}");
        }
        let c = Config::parse("", p).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.app.mode_bits().unwrap(), 0o660);
    }

    #[test]
    fn the_shipped_example_parses() {
        let text = include_str!("../../dist/agent.toml");
        let c = Config::parse(text, Path::new("agent.toml")).unwrap();
        assert_eq!(c.agent.port, "auto");
    }
}
