//! A VM as vmtierd manages it: the `[[vm]]` table of the configuration, which is also the
//! body of an `attach` request. Checked by [`VmConfig::validate`] wherever it comes from.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use vmtier_core::{ByteSize, HostVirtAddr, ProcessId, VmId};

/// Largest budget: 1 PiB.
pub const MAX_BUDGET: u64 = 1 << 50;
/// Longest unix socket path (`sun_path` holds 108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;
/// End of the highest range a process can have: no Linux user address space reaches past
/// 2^57 bytes (x86-64 with 5-level page tables stops at 2^56).
pub const MAX_ADDRESS: u64 = 1 << 57;

/// A `[[vm]]` table or an `attach` request that is out of bounds or inconsistent.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value is out of range or inconsistent.
    #[error("Invalid config: {0}")]
    Invalid(String),
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
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::no_null"
    )]
    pub qmp: Option<PathBuf>,
    /// With `qmp`: QEMU's pid, when the socket is served by a proxy (otherwise the pid is
    /// the socket peer's). Without `qmp`: a plain process whose `ranges` are managed as if
    /// they were guest RAM.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::no_null"
    )]
    pub pid: Option<ProcessId>,
    /// With `pid`: the ranges to manage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<RangeConfig>,
    /// The guest hint channel (`[vm.hints]`); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hints: Option<crate::hints::HintsConfig>,
    /// Guest-physical ranges pinned to a tier (`pins = [{ start = "0x0", size = "16M",
    /// tier = "dram" }]`); none by default. Rounded outward to whole granules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<crate::pin::Pin>,
}

impl VmConfig {
    /// Checks the backend choice, the pid, the budget and the ranges.
    pub fn validate(&self) -> Result<(), Error> {
        let name = &self.name;
        let invalid = |what: String| Err(Error::Invalid(format!("VM {name}: {what}")));
        if self.budget.0 > MAX_BUDGET {
            return invalid(format!(
                "budget {} is above the largest, {}",
                self.budget,
                ByteSize(MAX_BUDGET)
            ));
        }
        if let Some(pid) = self.pid.filter(|p| p.raw() <= 0) {
            // 0 would mean vmtierd itself to move_pages(2) and the module.
            return invalid(format!("pid {pid} is not a process id (pids are positive)"));
        }
        if let Some(h) = &self.hints {
            h.validate()
                .map_err(|why| Error::Invalid(format!("VM {name}: {why}")))?;
        }
        crate::pin::validate(&self.pins, self.budget)
            .map_err(|why| Error::Invalid(format!("VM {name}: {why}")))?;
        let mut spans = Vec::with_capacity(self.ranges.len());
        for r in &self.ranges {
            let (start, len) = (r.start.raw(), r.len.0);
            if len == 0 || start % 4096 != 0 || len % 4096 != 0 {
                return invalid(format!(
                    "range {} (+{}) is empty or not 4 KiB aligned",
                    r.start, r.len
                ));
            }
            let Some(end) = start.checked_add(len).filter(|&e| e <= MAX_ADDRESS) else {
                return invalid(format!(
                    "range {} (+{}) ends beyond any process's address space ({:#x})",
                    r.start, r.len, MAX_ADDRESS
                ));
            };
            spans.push((start, end));
        }
        spans.sort_unstable();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return invalid(format!(
                "ranges at {} and {} overlap",
                HostVirtAddr::new(w[0].0),
                HostVirtAddr::new(w[1].0)
            ));
        }
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
    fn pins_in_a_vm_table_are_checked() {
        let vm = |pins: &str| {
            format!("name = \"web1\"\nbudget = \"16M\"\nqmp = \"/run/q.sock\"\npins = [{pins}]\n")
        };
        let cases: Vec<(String, Result<usize, &str>)> = vec![
            (vm(""), Ok(0)),
            (
                vm("{ start = \"0x0\", size = \"16M\", tier = \"dram\" }"),
                Ok(1),
            ),
            (
                vm("{ start = 0, size = \"8M\", tier = \"dram\" }, \
                    { start = \"0x100000000\", size = \"1G\", tier = \"cxl\" }"),
                Ok(2),
            ),
            (
                vm("{ start = \"0x0\", size = \"32M\", tier = \"dram\" }"),
                Err("VM web1: Pinned DRAM 32 MiB exceeds the budget 16 MiB"),
            ),
            (
                vm("{ start = \"0x0\", size = \"8M\", tier = \"cxl\" }, \
                    { start = \"0x100000\", size = \"1M\", tier = \"cxl\" }"),
                Err("VM web1: Pins 0x0+8 MiB (cxl) and 0x100000+1 MiB (cxl) overlap"),
            ),
            (
                vm("{ start = \"0x0\", size = \"8M\", tier = \"fast\" }"),
                Err("unknown variant `fast`"),
            ),
            (
                vm("{ start = \"0x0\", size = \"8M\", tier = \"dram\", len = 1 }"),
                Err("unknown field `len`"),
            ),
        ];
        for (text, want) in cases {
            let got = toml::from_str::<VmConfig>(&text)
                .map_err(|e| e.to_string())
                .and_then(|v| {
                    v.validate()
                        .map(|()| v.pins.len())
                        .map_err(|e| e.to_string())
                });
            match (&got, want) {
                (Ok(n), Ok(w)) => assert_eq!(*n, w, "{text}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{text}: {e} (want {w})"),
                _ => panic!("{text}: {got:?} (want {want:?})"),
            }
        }
    }
}
