//! Address spaces, identifiers and sizes.
//!
//! Guest physical addresses reuse rust-vmm's [`vm_memory::GuestAddress`]; host virtual
//! addresses, nodes, VMs and processes get their own newtypes so that they cannot be mixed up.
//! None of them implement `+`/`-`: arithmetic is checked and explicit.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A guest physical address (rust-vmm's type).
pub use vm_memory::GuestAddress as GuestPhysAddr;

/// Error parsing an identifier or a size.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// Not a size such as `64M`, `2GiB` or `4096`.
    #[error(
        "Invalid size {0:?}: expected a number with an optional K/M/G/T suffix (binary units)"
    )]
    Size(String),
    /// Size does not fit in 64 bits.
    #[error("Size {0:?} is too large")]
    SizeOverflow(String),
    /// Not a valid VM name.
    #[error("Invalid VM name {0:?}: use 1-64 characters from [A-Za-z0-9._-]")]
    VmName(String),
    /// Not a valid placement granule.
    #[error("Invalid granule {0}: expected a power of two from 4 KiB to 2 MiB")]
    Granule(ByteSize),
}

/// Serde support for [`GuestPhysAddr`] fields (`#[serde(with = "gpa_serde")]`): a plain u64.
pub mod gpa_serde {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::GuestPhysAddr;

    /// Serializes the raw address.
    pub fn serialize<S: Serializer>(gpa: &GuestPhysAddr, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(gpa.0)
    }

    /// Deserializes a raw address.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GuestPhysAddr, D::Error> {
        u64::deserialize(d).map(GuestPhysAddr)
    }
}

/// A virtual address in the VMM (host) process.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostVirtAddr(u64);

impl HostVirtAddr {
    /// Wraps a raw address.
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw address.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// `self + offset`, or `None` on overflow.
    pub fn checked_add(self, offset: u64) -> Option<Self> {
        self.0.checked_add(offset).map(Self)
    }

    /// `self - base`, or `None` if `base` is above `self`.
    pub fn checked_offset_from(self, base: Self) -> Option<u64> {
        self.0.checked_sub(base.0)
    }

    /// Rounds down to a multiple of `size`.
    pub fn align_down(self, size: PageSize) -> Self {
        Self(self.0 & !(size.bytes() - 1))
    }

    /// Whether the address is a multiple of `size`.
    pub fn is_aligned(self, size: PageSize) -> bool {
        self.0 & (size.bytes() - 1) == 0
    }

    /// The pages of `size` in `[self, self + len)`, in address order: one address per page
    /// (a partial last page is left out), ending early at the top of the address space.
    /// The one loop over pages that migrators, the engine and the tests share.
    pub fn pages(self, len: u64, size: PageSize) -> impl Iterator<Item = HostVirtAddr> + Clone {
        let page = size.bytes();
        (0..len / page).map_while(move |i| self.checked_add(i * page))
    }

    /// The base (4 KiB) pages of `[self, self + len)`: [`Self::pages`] with
    /// [`PageSize::Base`].
    pub fn base_pages(self, len: u64) -> impl Iterator<Item = HostVirtAddr> + Clone {
        self.pages(len, PageSize::Base)
    }
}

impl fmt::Debug for HostVirtAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostVirtAddr({:#x})", self.0)
    }
}

impl fmt::Display for HostVirtAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A host NUMA node, as numbered by the kernel (`/sys/devices/system/node/nodeN`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(u32);

impl NodeId {
    /// Wraps a kernel node number.
    pub const fn new(raw: u32) -> Self {
        Self(raw)
    }

    /// The kernel node number.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A process id on the host (the VMM process of a guest).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProcessId(i32);

impl ProcessId {
    /// Wraps a pid.
    pub const fn new(raw: i32) -> Self {
        Self(raw)
    }

    /// The raw pid, as the kernel's syscalls take it.
    pub const fn raw(self) -> i32 {
        self.0
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The operator-visible name of a managed VM (libvirt domain name, config key).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VmId(String);

impl VmId {
    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for VmId {
    type Error = ParseError;

    fn try_from(s: String) -> Result<Self, ParseError> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(Self(s))
        } else {
            Err(ParseError::VmName(s))
        }
    }
}

impl FromStr for VmId {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::try_from(s.to_owned())
    }
}

impl From<VmId> for String {
    fn from(id: VmId) -> String {
        id.0
    }
}

impl fmt::Display for VmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The size of a page as mapped in the VMM process.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum PageSize {
    /// A base page, 4 KiB.
    #[serde(rename = "4K")]
    Base,
    /// A PMD-mapped transparent huge page, 2 MiB.
    #[serde(rename = "2M")]
    Huge,
}

impl PageSize {
    /// Bytes in one page of this size.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Base => 4096,
            PageSize::Huge => 2 << 20,
        }
    }

    /// Base pages in one page of this size.
    pub const fn base_pages(self) -> u64 {
        self.bytes() / PageSize::Base.bytes()
    }
}

/// A number of bytes, parsed from and shown with binary units (`64M`, `1.5 GiB`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "SizeRepr", into = "u64")]
pub struct ByteSize(pub u64);

/// Sizes in config files may be integers (bytes) or strings with units.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeRepr> for ByteSize {
    type Error = ParseError;

    fn try_from(r: SizeRepr) -> Result<Self, ParseError> {
        match r {
            SizeRepr::Bytes(b) => Ok(ByteSize(b)),
            SizeRepr::Text(s) => s.parse(),
        }
    }
}

impl From<ByteSize> for u64 {
    fn from(b: ByteSize) -> u64 {
        b.0
    }
}

impl FromStr for ByteSize {
    type Err = ParseError;

    /// Accepts `N`, `N[KMGT]`, `N[KMGT]iB`, `N[KMGT]B` (all binary), case-insensitive,
    /// with optional blanks between number and unit. No fractions: sizes are exact.
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        if num.is_empty() {
            return Err(ParseError::Size(s.to_owned()));
        }
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(ParseError::Size(s.to_owned())),
        };
        let n: u64 = num
            .parse()
            .map_err(|_| ParseError::SizeOverflow(s.to_owned()))?;
        n.checked_mul(1u64 << shift)
            .map(ByteSize)
            .ok_or_else(|| ParseError::SizeOverflow(s.to_owned()))
    }
}

impl fmt::Display for ByteSize {
    /// Exact multiples print as `64 MiB`; others with one decimal (`1.5 GiB`) or in bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        for (shift, name) in UNITS {
            let unit = 1u64 << shift;
            if self.0 >= unit {
                if self.0 % unit == 0 {
                    return write!(f, "{} {name}", self.0 >> shift);
                }
                #[allow(clippy::cast_precision_loss)]
                return write!(f, "{:.1} {name}", self.0 as f64 / unit as f64);
            }
        }
        write!(f, "{} B", self.0)
    }
}

impl fmt::Debug for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ByteSize({self})")
    }
}

/// The placement granule: the unit of tracking and migration, a power of two from 4 KiB
/// (one base page) to 2 MiB (one PMD-mapped huge page). Validated once, where it is parsed
/// (config, simulator, API); everything after that can rely on it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "ByteSize", into = "ByteSize")]
pub struct GranuleSize(u64);

impl GranuleSize {
    /// One base page.
    pub const BASE: Self = Self(4096);
    /// One PMD-mapped huge page.
    pub const HUGE: Self = Self(2 << 20);

    /// A granule of `bytes`, if valid.
    pub fn new(bytes: u64) -> Result<Self, ParseError> {
        if bytes.is_power_of_two() && (Self::BASE.0..=Self::HUGE.0).contains(&bytes) {
            Ok(Self(bytes))
        } else {
            Err(ParseError::Granule(ByteSize(bytes)))
        }
    }

    /// A granule of `2^log2` base pages (0 ..= 9).
    pub fn from_pages_log2(log2: u8) -> Result<Self, ParseError> {
        Self::new(Self::BASE.0.checked_shl(u32::from(log2)).unwrap_or(0))
    }

    /// Bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// log2 of the bytes (12 ..= 21).
    pub const fn shift(self) -> u32 {
        self.0.trailing_zeros()
    }

    /// Base pages per granule (1 ..= 512).
    pub const fn base_pages(self) -> u64 {
        self.0 / PageSize::Base.bytes()
    }

    /// log2 of [`Self::base_pages`] (0 ..= 9).
    pub const fn pages_log2(self) -> u32 {
        self.shift() - PageSize::Base.bytes().trailing_zeros()
    }

    /// Whole granules in `bytes` (rounded down).
    pub const fn count(self, bytes: u64) -> u64 {
        bytes >> self.shift()
    }
}

impl TryFrom<ByteSize> for GranuleSize {
    type Error = ParseError;

    fn try_from(b: ByteSize) -> Result<Self, ParseError> {
        Self::new(b.0)
    }
}

impl From<GranuleSize> for ByteSize {
    fn from(g: GranuleSize) -> ByteSize {
        ByteSize(g.0)
    }
}

impl FromStr for GranuleSize {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        Self::new(s.parse::<ByteSize>()?.0)
    }
}

impl fmt::Display for GranuleSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        ByteSize(self.0).fmt(f)
    }
}

impl fmt::Debug for GranuleSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GranuleSize({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_size_parses_units() {
        let cases: &[(&str, Option<u64>)] = &[
            ("4096", Some(4096)),
            ("64M", Some(64 << 20)),
            ("64 MiB", Some(64 << 20)),
            ("2g", Some(2 << 30)),
            ("1T", Some(1 << 40)),
            ("8kb", Some(8 << 10)),
            ("", None),
            ("M", None),
            ("1.5G", None),
            ("12 parsecs", None),
            ("-1", None),
            ("99999999999999999999", None),
            ("17179869184G", None),
        ];
        for (text, want) in cases {
            let got = text.parse::<ByteSize>().ok().map(|b| b.0);
            assert_eq!(got, *want, "parsing {text:?}");
        }
    }

    #[test]
    fn byte_size_displays_with_units() {
        let cases: &[(u64, &str)] = &[
            (0, "0 B"),
            (1000, "1000 B"),
            (4096, "4 KiB"),
            (64 << 20, "64 MiB"),
            (3 << 29, "1.5 GiB"),
            (1 << 40, "1 TiB"),
        ];
        for (bytes, want) in cases {
            assert_eq!(ByteSize(*bytes).to_string(), *want);
        }
    }

    #[test]
    fn byte_size_deserializes_numbers_and_strings() {
        let v: Vec<ByteSize> = serde_json::from_str(r#"[1024, "2M"]"#).unwrap();
        assert_eq!(v, vec![ByteSize(1024), ByteSize(2 << 20)]);
        assert!(serde_json::from_str::<ByteSize>(r#""lots""#).is_err());
    }

    #[test]
    fn granule_sizes_are_validated() {
        let cases = [
            ("4K", Some((4096, 12, 1, 0))),
            ("2M", Some((2 << 20, 21, 512, 9))),
            ("64K", Some((65536, 16, 16, 4))),
            ("2K", None),
            ("4M", None),
            ("12K", None),
            ("0", None),
        ];
        for (text, want) in cases {
            let got = text
                .parse::<GranuleSize>()
                .ok()
                .map(|g| (g.bytes(), g.shift(), g.base_pages(), g.pages_log2()));
            assert_eq!(got, want, "{text}");
        }
        assert_eq!(GranuleSize::from_pages_log2(9), Ok(GranuleSize::HUGE));
        assert!(GranuleSize::from_pages_log2(10).is_err());
        assert!(GranuleSize::from_pages_log2(200).is_err());
        let g: GranuleSize = serde_json::from_str("\"2M\"").unwrap();
        assert_eq!(g, GranuleSize::HUGE);
        assert!(serde_json::from_str::<GranuleSize>("3000").is_err());
        assert_eq!(GranuleSize::HUGE.count(5 << 20), 2);
    }

    #[test]
    fn base_pages_of_a_range() {
        let a = HostVirtAddr::new(0x1000);
        let got: Vec<u64> = a.base_pages(0x3000).map(HostVirtAddr::raw).collect();
        assert_eq!(got, vec![0x1000, 0x2000, 0x3000]);
        assert_eq!(a.base_pages(0xfff).count(), 0);
        let top = HostVirtAddr::new(u64::MAX - 0x1fff);
        assert_eq!(top.base_pages(0x10_000).count(), 2);
        let huge = HostVirtAddr::new(0x20_0000).pages(5 << 20, PageSize::Huge);
        assert_eq!(
            huge.map(HostVirtAddr::raw).collect::<Vec<_>>(),
            vec![0x20_0000, 0x40_0000]
        );
    }

    #[test]
    fn vm_names_are_validated() {
        for ok in ["web1", "db.prod-2", "a_b"] {
            assert!(ok.parse::<VmId>().is_ok(), "{ok}");
        }
        let long = "x".repeat(65);
        for bad in ["", "has space", "slash/", long.as_str()] {
            assert!(bad.parse::<VmId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn host_addresses_use_checked_arithmetic() {
        let a = HostVirtAddr::new(0x7f00_0020_1000);
        assert_eq!(a.align_down(PageSize::Huge).raw(), 0x7f00_0020_0000);
        assert!(a.is_aligned(PageSize::Base));
        assert!(!a.is_aligned(PageSize::Huge));
        assert_eq!(HostVirtAddr::new(u64::MAX).checked_add(1), None);
        assert_eq!(
            a.checked_offset_from(HostVirtAddr::new(0x7f00_0020_0000)),
            Some(0x1000)
        );
        assert_eq!(HostVirtAddr::new(0).checked_offset_from(a), None);
    }
}
