//! Guest-physical page frames and ranges, and what a hint says about them.
//!
//! On x86 a page frame number times 4096 is the guest-physical address the host sees
//! (the guest's "physical" memory is the VM's GPA space).

use std::fmt;

use serde::Deserialize;

/// Bytes per page: x86's base page, the unit of every hint range.
pub const PAGE: u64 = 4096;

/// A guest page frame number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pfn(pub u64);

impl Pfn {
    /// Its guest-physical address, if it fits in 64 bits.
    pub fn gpa(self) -> Option<u64> {
        self.0.checked_mul(PAGE)
    }
}

/// What the guest says about a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Accessed often: worth fast memory.
    Hot,
    /// Rarely accessed: may go to slow memory.
    Cold,
    /// Free in the guest: its content does not matter.
    Free,
    /// Latency-critical: keep in fast memory.
    Pinned,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Hot => "HOT",
            Kind::Cold => "COLD",
            Kind::Free => "FREE",
            Kind::Pinned => "PINNED",
        })
    }
}

/// Where a hint comes from (the protocol's sources).
pub use vmtier_hint_proto::HintSource as Source;

/// Sources in the order snapshots send them.
pub const SOURCES: [Source; 5] = [
    Source::FreePages,
    Source::App,
    Source::Process,
    Source::GuestDamon,
    Source::Pmu,
];

/// A source's name in logs and `--check`.
pub fn source_name(s: Source) -> &'static str {
    match s {
        Source::App => "app",
        Source::Process => "process",
        Source::FreePages => "free-pages",
        Source::GuestDamon => "guest-damon",
        Source::Pmu => "pmu",
    }
}

impl Kind {
    /// The protocol's kind.
    pub fn wire(self) -> vmtier_hint_proto::HintKind {
        use vmtier_hint_proto::HintKind as K;
        match self {
            Kind::Hot => K::Hot,
            Kind::Cold => K::Cold,
            Kind::Free => K::Free,
            Kind::Pinned => K::Pinned,
        }
    }
}

/// A run of consecutive page frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PfnRange {
    /// First frame.
    pub start: Pfn,
    /// Number of frames (> 0).
    pub pages: u64,
}

impl PfnRange {
    /// One past the last frame (saturating).
    pub fn end(&self) -> u64 {
        self.start.0.saturating_add(self.pages)
    }

    /// Its bytes.
    pub fn bytes(&self) -> u64 {
        self.pages.saturating_mul(PAGE)
    }
}

/// One hint: a guest-physical range, what it is, how sure the guest is, and who said so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hint {
    /// Its frames.
    pub range: PfnRange,
    /// What it is.
    pub kind: Kind,
    /// 1 ..= 255.
    pub weight: u8,
    /// Who said so.
    pub source: Source,
}

/// Builds ranges from frames given in any order (duplicates allowed).
pub fn coalesce(mut pfns: Vec<u64>) -> Vec<PfnRange> {
    pfns.sort_unstable();
    pfns.dedup();
    let mut out: Vec<PfnRange> = Vec::new();
    for p in pfns {
        match out.last_mut() {
            Some(r) if r.end() == p => r.pages += 1,
            _ => out.push(PfnRange {
                start: Pfn(p),
                pages: 1,
            }),
        }
    }
    out
}

/// Appends frame `p` to sorted ranges built in ascending order.
pub fn push_sorted(out: &mut Vec<PfnRange>, p: u64) {
    match out.last_mut() {
        Some(r) if r.end() == p => r.pages += 1,
        _ => out.push(PfnRange {
            start: Pfn(p),
            pages: 1,
        }),
    }
}

/// Keeps the `max` largest ranges (ties: lower address first), returned sorted by address.
pub fn keep_largest(mut v: Vec<PfnRange>, max: usize) -> Vec<PfnRange> {
    if v.len() > max {
        v.sort_by(|a, b| b.pages.cmp(&a.pages).then(a.start.cmp(&b.start)));
        v.truncate(max);
        v.sort();
    }
    v
}

/// Total bytes of `v`.
pub fn total_bytes(v: &[PfnRange]) -> u64 {
    v.iter().fold(0u64, |s, r| s.saturating_add(r.bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, pages: u64) -> PfnRange {
        PfnRange {
            start: Pfn(start),
            pages,
        }
    }

    #[test]
    fn coalesces() {
        let cases: &[(&[u64], &[PfnRange])] = &[
            (&[], &[]),
            (&[5], &[r(5, 1)]),
            (&[7, 5, 6, 6], &[r(5, 3)]),
            (&[1, 3, 4, 10, 2], &[r(1, 4), r(10, 1)]),
            (&[9, 11], &[r(9, 1), r(11, 1)]),
        ];
        for (input, want) in cases {
            assert_eq!(coalesce(input.to_vec()), *want, "{input:?}");
        }
    }

    #[test]
    fn keeps_the_largest() {
        let v = vec![r(0, 1), r(10, 5), r(20, 2), r(30, 5)];
        assert_eq!(keep_largest(v.clone(), 2), vec![r(10, 5), r(30, 5)]);
        assert_eq!(
            keep_largest(v.clone(), 3),
            vec![r(10, 5), r(20, 2), r(30, 5)]
        );
        assert_eq!(keep_largest(v.clone(), 9), v);
        assert_eq!(total_bytes(&v), 13 * PAGE);
    }

    #[test]
    fn gpa_is_checked() {
        assert_eq!(Pfn(3).gpa(), Some(3 * 4096));
        assert_eq!(Pfn(u64::MAX / 2).gpa(), None);
    }
}
