//! The guest hint channel's configuration (`[vm.hints]`) and status types; the channel itself
//! is vmtierd's (docs/hint-protocol.md, docs/daemon.md "Guest hints").

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use vmtier_core::ByteSize;
use vmtier_hint_proto as proto;

/// `frames_per_s` bounds.
pub const FRAMES_PER_S: std::ops::RangeInclusive<u32> = 1..=1000;
/// `bytes_per_s` bounds: one maximal frame (64 KiB) to 16 MiB.
pub const BYTES_PER_S: std::ops::RangeInclusive<u64> = 65_536..=(16 << 20);
/// `distrust_ticks` bounds.
pub const DISTRUST_TICKS: std::ops::RangeInclusive<u32> = 1..=1000;
/// `max_budget_percent` bounds.
pub const MAX_BUDGET_PERCENT: std::ops::RangeInclusive<u8> = 0..=100;
/// `[vm.hints]`: the VM's guest hint channel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HintsConfig {
    /// QEMU's chardev unix socket (`-chardev socket,path=...,server=on,wait=off`);
    /// vmtierd connects to it as a client. Required.
    pub socket: PathBuf,
    /// Whether the channel is used. Default true.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Frames per second the VM may send (token bucket, 1 s burst). 1 to 1000, default 20.
    #[serde(default = "default_frames_per_s")]
    pub frames_per_s: u32,
    /// Bytes per second the VM may send (token bucket, 1 s burst). 64 KiB to 16 MiB,
    /// default 256 KiB.
    #[serde(default = "default_bytes_per_s")]
    pub bytes_per_s: ByteSize,
    /// Ticks a hot or pinned claim may contradict the host's telemetry (granule cold) before
    /// its source's trust halves. 1 to 1000, default 5.
    #[serde(default = "default_distrust_ticks")]
    pub distrust_ticks: u32,
    /// Most of the VM's budget that hot and pinned hints may claim, percent. 0 to 100,
    /// default 50.
    #[serde(default = "default_max_budget_percent")]
    pub max_budget_percent: u8,
}

fn yes() -> bool {
    true
}
fn default_frames_per_s() -> u32 {
    proto::DEFAULT_FRAMES_PER_S
}
fn default_bytes_per_s() -> ByteSize {
    ByteSize(u64::from(proto::DEFAULT_BYTES_PER_S))
}
fn default_distrust_ticks() -> u32 {
    5
}
fn default_max_budget_percent() -> u8 {
    50
}

impl HintsConfig {
    /// The defaults with `socket`.
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            enabled: true,
            frames_per_s: default_frames_per_s(),
            bytes_per_s: default_bytes_per_s(),
            distrust_ticks: default_distrust_ticks(),
            max_budget_percent: default_max_budget_percent(),
        }
    }

    /// Checks bounds and the socket path; the message names the offending key.
    pub fn validate(&self) -> Result<(), String> {
        let sock = self.socket.as_os_str().len();
        if self.socket.file_name().is_none() || sock > crate::vm::MAX_SOCKET_PATH {
            return Err(format!(
                "hints socket {:?}: give a file path of at most {} bytes",
                self.socket,
                crate::vm::MAX_SOCKET_PATH
            ));
        }
        let checks: [(&str, u64, u64, u64, &str); 4] = [
            (
                "frames_per_s",
                self.frames_per_s.into(),
                (*FRAMES_PER_S.start()).into(),
                (*FRAMES_PER_S.end()).into(),
                "",
            ),
            (
                "bytes_per_s",
                self.bytes_per_s.0,
                *BYTES_PER_S.start(),
                *BYTES_PER_S.end(),
                " bytes",
            ),
            (
                "distrust_ticks",
                self.distrust_ticks.into(),
                (*DISTRUST_TICKS.start()).into(),
                (*DISTRUST_TICKS.end()).into(),
                "",
            ),
            (
                "max_budget_percent",
                self.max_budget_percent.into(),
                (*MAX_BUDGET_PERCENT.start()).into(),
                (*MAX_BUDGET_PERCENT.end()).into(),
                " %",
            ),
        ];
        for (key, v, lo, hi, unit) in checks {
            if !(lo..=hi).contains(&v) {
                return Err(format!(
                    "hints {key} {v} is out of range: {lo}{unit} to {hi}{unit}"
                ));
            }
        }
        Ok(())
    }
}

/// Counters of one VM's hint channel since it was attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HintCounters {
    /// Frames decoded and acted on (HELLO, HINTS, BYE).
    pub frames_ok: u64,
    /// Hint ranges kept.
    pub ranges_accepted: u64,
    /// Ranges rejected by the per-range rules (alignment, kind, weight, source, reserved).
    pub ranges_rejected_invalid: u64,
    /// Ranges rejected for lying outside the VM's guest RAM.
    pub ranges_rejected_outside_ram: u64,
    /// Frames dropped by the token buckets (unread beyond the header).
    pub dropped_rate: u64,
    /// Bytes discarded while looking for a frame's magic.
    pub garbage_bytes: u64,
    /// Of those, bytes before the first frame of a connection (vmtierd connected in the
    /// middle of a frame): counted, but not a protocol violation.
    pub resync_bytes: u64,
    /// HINTS frames whose seq (or epoch) did not advance.
    pub dropped_replay: u64,
    /// HINTS frames before a completed HELLO.
    pub dropped_before_hello: u64,
    /// Of those, frames before the first HELLO or BYE of a connection (vmtierd connected
    /// after the guest's HELLO, which a guest cannot know): counted, but not a protocol
    /// violation.
    pub resync_before_hello: u64,
    /// Frames of a version other than the negotiated one, and HELLOs with no common version.
    pub dropped_bad_version: u64,
    /// Headers announcing more than 65520 payload bytes.
    pub dropped_oversize: u64,
    /// Frames of an unknown type, or of a type only the host sends.
    pub dropped_bad_type: u64,
    /// Frames whose length does not fit their type, or with an invalid field.
    pub dropped_bad_length: u64,
    /// SLOW_DOWN notices sent.
    pub slow_downs_sent: u64,
    /// Replies not sent because the guest does not read its port.
    pub replies_dropped: u64,
    /// Oldest live ranges dropped to stay within the live-range limit.
    pub evicted_ranges: u64,
    /// Connections made to the socket.
    pub connects: u64,
    /// Connection attempts that failed.
    pub connect_errors: u64,
    /// Bytes read from the socket.
    pub bytes_read: u64,
    /// Hinted granules the host's telemetry contradicted, summed over ticks.
    pub contradicted_granules: u64,
    /// Times a source's trust was halved.
    pub trust_halvings: u64,
    /// Hot or pinned granules left out by the budget share, summed over ticks.
    pub capped_granules: u64,
}

/// Trust in one source, for status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceTrust {
    /// Source name (`app`, `process`, `free-pages`, `guest-damon`, `pmu`).
    pub source: String,
    /// Trust, percent.
    pub percent: u32,
}

/// `status VM` → `hints`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HintStatus {
    /// The chardev socket.
    pub socket: PathBuf,
    /// Whether vmtierd is connected to it.
    pub connected: bool,
    /// Agent name from the last HELLO (printable ASCII only).
    pub agent: String,
    /// Negotiated version, 0 before a HELLO.
    pub version: u16,
    /// Live hint ranges kept.
    pub live_ranges: u64,
    /// Granules handed to the policy last tick.
    pub hinted_granules: u64,
    /// Trust per source that sent hints.
    pub trust: Vec<SourceTrust>,
    /// Why the VM is flagged misbehaving (protocol violations in the last minute), if it is.
    pub misbehaving: Option<String>,
    /// Last connection error, if not connected.
    pub last_error: Option<String>,
    /// Counters.
    pub counters: HintCounters,
}
