//! Where a guest's RAM lives: guest physical ranges, the host virtual ranges that back them
//! in the VMM process, and what kind of mapping backs them (which decides how pages can move).

use serde::{Deserialize, Serialize};
use vm_memory::Address;

use crate::addr::{GuestPhysAddr, HostVirtAddr, ProcessId};

/// Error validating a layout reported by a backend.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A range has zero length.
    #[error("Guest RAM range {0:?} is empty")]
    Empty(String),
    /// A range's end does not fit in 64 bits.
    #[error("Guest RAM range {0:?} overflows the address space")]
    Overflow(String),
    /// Two ranges overlap in guest physical space.
    #[error("Guest RAM ranges {0:?} and {1:?} overlap in guest physical memory")]
    GpaOverlap(String, String),
    /// A range is not page aligned.
    #[error("Guest RAM range {0:?} is not 4 KiB aligned")]
    Unaligned(String),
}

/// What backs a guest RAM range in the VMM process. Decides which migrators may move it:
/// device-migration in the kernel module handles only private anonymous memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backing {
    /// Private anonymous memory (QEMU `memory-backend-ram`, Cloud Hypervisor default).
    PrivateAnon,
    /// Shared memory: memfd, shmem or `MAP_SHARED` anonymous (`memory-backend-memfd`, vhost-user).
    Shared,
    /// A file mapping (`memory-backend-file`), hugetlbfs included.
    File(String),
}

/// One contiguous piece of guest RAM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestRamRange {
    /// Name of the VMM's memory object (QEMU memory-backend id, CH memory zone id).
    pub name: String,
    /// First guest physical address.
    #[serde(with = "crate::addr::gpa_serde")]
    pub gpa: GuestPhysAddr,
    /// Host virtual address that backs `gpa`.
    pub hva: HostVirtAddr,
    /// Length in bytes.
    pub len: u64,
    /// Kind of mapping.
    pub backing: Backing,
}

impl GuestRamRange {
    /// One past the last guest physical address, if it fits.
    pub fn gpa_end(&self) -> Option<GuestPhysAddr> {
        self.gpa.checked_add(self.len)
    }

    /// One past the last host virtual address, if it fits.
    pub fn hva_end(&self) -> Option<HostVirtAddr> {
        self.hva.checked_add(self.len)
    }

    /// The host address of `gpa` if this range holds it.
    pub fn translate(&self, gpa: GuestPhysAddr) -> Option<HostVirtAddr> {
        let off = gpa.checked_offset_from(self.gpa)?;
        if off < self.len {
            self.hva.checked_add(off)
        } else {
            None
        }
    }
}

/// A guest's RAM as seen from the host: the VMM process and its RAM ranges, sorted by GPA.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestMemoryLayout {
    /// The process whose address space holds the ranges.
    pub pid: ProcessId,
    /// RAM ranges, sorted by guest physical address, not overlapping.
    pub ranges: Vec<GuestRamRange>,
}

impl GuestMemoryLayout {
    /// Builds a layout, sorting the ranges and checking them.
    pub fn new(pid: ProcessId, mut ranges: Vec<GuestRamRange>) -> Result<Self, Error> {
        ranges.sort_by_key(|r| r.gpa);
        for r in &ranges {
            if r.len == 0 {
                return Err(Error::Empty(r.name.clone()));
            }
            if r.gpa_end().is_none() || r.hva_end().is_none() {
                return Err(Error::Overflow(r.name.clone()));
            }
            if r.gpa.raw_value() % 4096 != 0 || r.hva.raw() % 4096 != 0 || r.len % 4096 != 0 {
                return Err(Error::Unaligned(r.name.clone()));
            }
        }
        for pair in ranges.windows(2) {
            // Both ends were checked above.
            if pair[0].gpa_end().is_some_and(|end| end > pair[1].gpa) {
                return Err(Error::GpaOverlap(
                    pair[0].name.clone(),
                    pair[1].name.clone(),
                ));
            }
        }
        Ok(Self { pid, ranges })
    }

    /// Every base (4 KiB) page of guest RAM with its guest physical address, in
    /// guest-physical order.
    pub fn base_pages(&self) -> impl Iterator<Item = (GuestPhysAddr, HostVirtAddr)> + '_ {
        let page = crate::addr::PageSize::Base.bytes();
        self.ranges.iter().flat_map(move |r| {
            r.hva
                .base_pages(r.len)
                .enumerate()
                .map_while(move |(i, a)| {
                    let gpa = r
                        .gpa
                        .0
                        .checked_add(u64::try_from(i).ok()?.checked_mul(page)?)?;
                    Some((GuestPhysAddr(gpa), a))
                })
        })
    }

    /// Total guest RAM in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }

    /// The host address backing `gpa`, if it is guest RAM.
    pub fn translate(&self, gpa: GuestPhysAddr) -> Option<HostVirtAddr> {
        let i = self
            .ranges
            .partition_point(|r| r.gpa <= gpa)
            .checked_sub(1)?;
        self.ranges[i].translate(gpa)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(name: &str, gpa: u64, hva: u64, len: u64) -> GuestRamRange {
        GuestRamRange {
            name: name.into(),
            gpa: GuestPhysAddr(gpa),
            hva: HostVirtAddr::new(hva),
            len,
            backing: Backing::PrivateAnon,
        }
    }

    #[test]
    fn translate_finds_the_right_range() {
        // GPA:  [0 ......... 3G)   hole   [4G ...... 5G)
        // HVA:  [A ......... A+3G)        [A+3G .... A+4G)
        let a = 0x7f00_0000_0000;
        let l = GuestMemoryLayout::new(
            ProcessId::new(1),
            vec![
                range("hi", 4 << 30, a + (3 << 30), 1 << 30),
                range("lo", 0, a, 3 << 30),
            ],
        )
        .unwrap();
        let cases: &[(u64, Option<u64>)] = &[
            (0, Some(a)),
            (0x1234_5000, Some(a + 0x1234_5000)),
            ((3 << 30) - 1, Some(a + (3 << 30) - 1)),
            (3 << 30, None),
            (4 << 30, Some(a + (3 << 30))),
            ((5 << 30) - 1, Some(a + (4 << 30) - 1)),
            (5 << 30, None),
        ];
        for (gpa, want) in cases {
            let got = l.translate(GuestPhysAddr(*gpa)).map(HostVirtAddr::raw);
            assert_eq!(got, *want, "gpa {gpa:#x}");
        }
        assert_eq!(l.total_bytes(), 4 << 30);
        assert_eq!(l.ranges[0].name, "lo");
    }

    #[test]
    fn bad_layouts_are_refused() {
        let p = ProcessId::new(1);
        let cases: Vec<(Vec<GuestRamRange>, Error)> = vec![
            (vec![range("e", 0, 0x1000, 0)], Error::Empty("e".into())),
            (
                vec![range("o", u64::MAX - 0xfff, 0x1000, 0x2000)],
                Error::Overflow("o".into()),
            ),
            (
                vec![range("u", 0x800, 0x1000, 0x1000)],
                Error::Unaligned("u".into()),
            ),
            (
                vec![
                    range("a", 0, 0x10000, 0x2000),
                    range("b", 0x1000, 0x20000, 0x1000),
                ],
                Error::GpaOverlap("a".into(), "b".into()),
            ),
        ];
        for (ranges, want) in cases {
            assert_eq!(GuestMemoryLayout::new(p, ranges), Err(want));
        }
    }
}
