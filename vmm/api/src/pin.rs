//! Pinned ranges: guest-physical ranges a VM's tiering keeps on one tier whatever the policy
//! says (`pins = [{ start = "0x0", size = "16M", tier = "dram" }]` in `[[vm]]`, `pins` in a
//! tiering change, `<vmtier:pin>` in libvirt metadata).
//!
//! The checks here need nothing but the pins and the budget; vmtierd checks the rest against
//! the VM's layout (each range inside guest RAM) and granule (ranges are rounded outward to
//! whole granules, and the rounded DRAM pins must fit the budget).

use std::fmt;

use serde::{Deserialize, Serialize};
use vmtier_core::{ByteSize, GuestPhysAddr};

/// Most pinned ranges per VM.
pub const MAX_PINS: usize = 64;

/// A pinned range that is out of bounds or inconsistent with the others or the budget.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Empty, or ends beyond 2^64.
    #[error("Pin {0}: empty or ends beyond the 64-bit address space")]
    Span(Pin),
    /// Two ranges share bytes.
    #[error("Pins {0} and {1} overlap")]
    Overlap(Pin, Pin),
    /// More than [`MAX_PINS`].
    #[error("More than {MAX_PINS} pinned ranges")]
    TooMany,
    /// The DRAM pins do not fit the budget.
    #[error("Pinned DRAM {pinned} exceeds the budget {budget}")]
    OverBudget {
        /// Sum of the DRAM pins.
        pinned: ByteSize,
        /// The budget.
        budget: ByteSize,
    },
}

/// The tier a range is pinned to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PinTier {
    /// The fast node: moved there before anything else, never demoted; counts against the
    /// budget.
    Dram,
    /// The slow node: moved there, never promoted.
    Cxl,
}

impl fmt::Display for PinTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PinTier::Dram => "dram",
            PinTier::Cxl => "cxl",
        })
    }
}

impl std::str::FromStr for PinTier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "dram" => Ok(PinTier::Dram),
            "cxl" => Ok(PinTier::Cxl),
            _ => Err("expected dram or cxl".into()),
        }
    }
}

/// One pinned guest-physical range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pin {
    /// First guest physical address, as a `0x` hex string or an integer.
    #[serde(with = "hex_gpa")]
    pub start: GuestPhysAddr,
    /// Length (sizes with units: `16M`).
    pub size: ByteSize,
    /// The tier it stays on.
    pub tier: PinTier,
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}+{} ({})", self.start.0, self.size, self.tier)
    }
}

impl Pin {
    /// One past the last byte, if it fits in 64 bits.
    pub fn end(&self) -> Option<u64> {
        self.start.0.checked_add(self.size.0)
    }
}

impl std::str::FromStr for Pin {
    type Err = String;

    /// `START:SIZE:TIER`, as the command line takes it: `0x0:16M:dram`, `0x40000000:1G:cxl`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut it = s.splitn(3, ':');
        let (Some(start), Some(size), Some(tier)) = (it.next(), it.next(), it.next()) else {
            return Err(format!("{s:?} is not START:SIZE:TIER (0x0:16M:dram)"));
        };
        Ok(Pin {
            start: parse_gpa(start)?,
            size: size.parse().map_err(|e| format!("{e}"))?,
            tier: tier.parse()?,
        })
    }
}

/// Bytes pinned to `tier` (saturating).
pub fn pinned_bytes(pins: &[Pin], tier: PinTier) -> u64 {
    pins.iter()
        .filter(|p| p.tier == tier)
        .fold(0u64, |a, p| a.saturating_add(p.size.0))
}

/// Checks a VM's pins: at most [`MAX_PINS`], none empty or wrapping, none overlapping,
/// the DRAM ones within `budget`.
pub fn validate(pins: &[Pin], budget: ByteSize) -> Result<(), Error> {
    if pins.len() > MAX_PINS {
        return Err(Error::TooMany);
    }
    let mut spans = Vec::with_capacity(pins.len());
    for p in pins {
        match p.end() {
            Some(end) if p.size.0 > 0 => spans.push((p.start.0, end, *p)),
            _ => return Err(Error::Span(*p)),
        }
    }
    spans.sort_unstable_by_key(|s| s.0);
    if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(Error::Overlap(w[0].2, w[1].2));
    }
    let pinned = pinned_bytes(pins, PinTier::Dram);
    if pinned > budget.0 {
        return Err(Error::OverBudget {
            pinned: ByteSize(pinned),
            budget,
        });
    }
    Ok(())
}

/// Guest physical addresses as `"0x..."` strings (or plain integers).
mod hex_gpa {
    use serde::{de, Deserialize, Deserializer, Serializer};
    use vmtier_core::GuestPhysAddr;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Int(u64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(a: &GuestPhysAddr, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{:#x}", a.0))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GuestPhysAddr, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Int(v) => Ok(GuestPhysAddr(v)),
            Repr::Text(t) => super::parse_gpa(&t).map_err(de::Error::custom),
        }
    }
}

/// A guest physical address written `0x...` (hex) or in decimal.
pub fn parse_gpa(t: &str) -> Result<GuestPhysAddr, String> {
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse::<u64>(),
    };
    parsed
        .map(GuestPhysAddr)
        .map_err(|_| format!("address {t:?} is not 0x-hex or decimal (64 bits)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(start: u64, size: u64, tier: PinTier) -> Pin {
        Pin {
            start: GuestPhysAddr(start),
            size: ByteSize(size),
            tier,
        }
    }

    const M: u64 = 1 << 20;

    #[test]
    fn pins_are_checked() {
        use PinTier::{Cxl, Dram};
        let too_many: Vec<Pin> = (0..=MAX_PINS as u64).map(|i| pin(i * M, M, Cxl)).collect();
        let cases: Vec<(Vec<Pin>, u64, Result<(), &str>)> = vec![
            (vec![], 0, Ok(())),
            (vec![pin(0, 16 * M, Dram)], 16 * M, Ok(())),
            (
                vec![pin(0, 16 * M, Dram), pin(16 * M, 64 * M, Cxl)],
                16 * M,
                Ok(()),
            ),
            (
                vec![pin(0, 16 * M, Dram)],
                8 * M,
                Err("Pinned DRAM 16 MiB exceeds the budget 8 MiB"),
            ),
            (
                vec![pin(0, 8 * M, Dram), pin(32 * M, 8 * M, Dram)],
                12 * M,
                Err("Pinned DRAM 16 MiB exceeds the budget 12 MiB"),
            ),
            (
                vec![pin(0, 16 * M, Dram), pin(8 * M, M, Cxl)],
                64 * M,
                Err("Pins 0x0+16 MiB (dram) and 0x800000+1 MiB (cxl) overlap"),
            ),
            (
                vec![pin(4096, 0, Cxl)],
                0,
                Err("Pin 0x1000+0 B (cxl): empty"),
            ),
            (
                vec![pin(u64::MAX - 10, M, Cxl)],
                0,
                Err("Pin 0xfffffffffffffff5+1 MiB (cxl): empty or ends beyond"),
            ),
            (too_many, 0, Err("More than 64 pinned ranges")),
        ];
        for (pins, budget, want) in cases {
            let got = validate(&pins, ByteSize(budget)).map_err(|e| e.to_string());
            match (&got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{pins:?}: {e} (want {w})"),
                _ => panic!("{pins:?}: {got:?} (want {want:?})"),
            }
        }
    }

    #[test]
    fn pins_parse_from_the_command_line() {
        let cases: Vec<(&str, Option<Pin>)> = vec![
            ("0x0:16M:dram", Some(pin(0, 16 * M, PinTier::Dram))),
            ("4096:8K:cxl", Some(pin(4096, 8192, PinTier::Cxl))),
            ("0x0:16M", None),
            ("0xg:16M:dram", None),
            ("0:16Q:dram", None),
            ("0:16M:hbm", None),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Pin>().ok(), want, "{text}");
        }
    }

    #[test]
    fn pins_parse_from_toml_and_json() {
        let cases: Vec<(&str, Result<Pin, &str>)> = vec![
            (
                r#"{"start":"0x1000000","size":"16M","tier":"dram"}"#,
                Ok(pin(16 * M, 16 * M, PinTier::Dram)),
            ),
            (
                r#"{"start":4096,"size":8192,"tier":"cxl"}"#,
                Ok(pin(4096, 8192, PinTier::Cxl)),
            ),
            (
                r#"{"start":"0x0","size":"1M","tier":"hbm"}"#,
                Err("unknown variant"),
            ),
            (
                r#"{"start":"zz","size":"1M","tier":"dram"}"#,
                Err("address \"zz\""),
            ),
            (
                r#"{"start":"0x0","size":"1M","tier":"dram","x":1}"#,
                Err("unknown field"),
            ),
        ];
        for (json, want) in cases {
            let got = serde_json::from_str::<Pin>(json).map_err(|e| e.to_string());
            match (&got, want) {
                (Ok(p), Ok(w)) => {
                    assert_eq!(*p, w, "{json}");
                    let back = serde_json::to_string(p).unwrap();
                    assert_eq!(serde_json::from_str::<Pin>(&back).unwrap(), w, "{back}");
                }
                (Err(e), Err(w)) => assert!(e.contains(w), "{json}: {e} (want {w})"),
                _ => panic!("{json}: {got:?} (want {want:?})"),
            }
        }
        let t: toml::Table =
            toml::from_str("p = { start = \"0x0\", size = \"16M\", tier = \"dram\" }").unwrap();
        let p: Pin = t["p"].clone().try_into().unwrap();
        assert_eq!(p, pin(0, 16 * M, PinTier::Dram));
    }
}
