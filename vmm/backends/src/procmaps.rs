//! `/proc/PID/maps`: which mapping holds an address, and what backs it.

use std::fs;
use std::io;

use vmtier_core::{Backing, HostVirtAddr, ProcessId};

/// Error reading or parsing a maps file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read (process gone, no permission).
    #[error("Cannot read /proc/{0}/maps")]
    Read(ProcessId, #[source] io::Error),
    /// A line did not parse.
    #[error("Malformed maps line {line}: {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
}

/// One mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: HostVirtAddr,
    /// One past the last address.
    pub end: HostVirtAddr,
    /// `rwxp`-style permissions.
    pub perms: String,
    /// Path, `[heap]`-style tag, or empty for anonymous memory.
    pub path: String,
}

impl Mapping {
    /// Whether the mapping is shared (`s` in the permissions).
    pub fn shared(&self) -> bool {
        self.perms.ends_with('s')
    }

    /// What kind of memory backs this mapping, as the migrators need to know.
    pub fn backing(&self) -> Backing {
        let anon = self.path.is_empty() || self.path.starts_with('[');
        let memfd_or_shm = self.path.starts_with("/memfd:")
            || self.path.starts_with("/dev/zero")
            || self.path.starts_with("/SYSV");
        match (self.shared(), anon || memfd_or_shm) {
            (false, true) => Backing::PrivateAnon,
            (true, true) => Backing::Shared,
            (_, false) => Backing::File(self.path.clone()),
        }
    }
}

/// Parses the text of a maps file.
pub fn parse(text: &str) -> Result<Vec<Mapping>, Error> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            parse_line(l).ok_or_else(|| Error::Malformed {
                line: i + 1,
                text: l.to_owned(),
            })
        })
        .collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    // start-end perms offset dev inode [path, which may contain spaces]
    let mut it = line.splitn(6, ' ');
    let (range, perms) = (it.next()?, it.next()?);
    let (_offset, _dev, _inode) = (it.next()?, it.next()?, it.next()?);
    let path = it.next().unwrap_or("").trim_start().to_owned();
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    (start < end && perms.len() == 4).then(|| Mapping {
        start: HostVirtAddr::new(start),
        end: HostVirtAddr::new(end),
        perms: perms.to_owned(),
        path,
    })
}

/// Reads and parses `/proc/PID/maps`.
pub fn read(pid: ProcessId) -> Result<Vec<Mapping>, Error> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| Error::Read(pid, e))?;
    parse(&text)
}

/// The backing of `[start, start + len)` if consecutive mappings of one kind cover all of it
/// (a guest RAM block is often split into several VMAs by madvise or mprotect).
pub fn covering_backing(maps: &[Mapping], start: HostVirtAddr, len: u64) -> Option<Backing> {
    let end = start.checked_add(len)?;
    let first = maps
        .iter()
        .position(|m| m.start <= start && start < m.end)?;
    let backing = maps[first].backing();
    let mut covered = maps[first].end;
    for m in &maps[first + 1..] {
        if covered >= end {
            break;
        }
        if m.start != covered || m.backing() != backing {
            return None;
        }
        covered = m.end;
    }
    (covered >= end).then_some(backing)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0100000 r-xp 00000000 fe:01 1234   /usr/bin/qemu-system-x86_64
7f0000000000-7f0004000000 rw-p 00000000 00:00 0 
7f0004000000-7f0008000000 rw-p 00000000 00:00 0 
7f0010000000-7f0018000000 rw-s 00000000 00:01 77     /memfd:memory-backend-memfd (deleted)
7f0020000000-7f0020200000 rw-s 00000000 fe:01 99     /dev/hugepages/guest ram
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]
";

    #[test]
    fn parses_and_classifies_mappings() {
        let m = parse(MAPS).unwrap();
        assert_eq!(m.len(), 6);
        let cases = [
            (0, Backing::File("/usr/bin/qemu-system-x86_64".into())),
            (1, Backing::PrivateAnon),
            (3, Backing::Shared),
            (4, Backing::File("/dev/hugepages/guest ram".into())),
            (5, Backing::PrivateAnon),
        ];
        for (i, want) in cases {
            assert_eq!(m[i].backing(), want, "mapping {i}");
        }
    }

    #[test]
    fn coverage_spans_split_vmas_of_one_kind() {
        let m = parse(MAPS).unwrap();
        let a = |x: u64| HostVirtAddr::new(x);
        let cases = [
            (a(0x7f00_0000_0000), 0x800_0000, Some(Backing::PrivateAnon)),
            (a(0x7f00_0200_0000), 0x400_0000, Some(Backing::PrivateAnon)),
            (a(0x7f00_0000_0000), 0x800_1000, None),
            (a(0x7f00_1000_0000), 0x800_0000, Some(Backing::Shared)),
            (a(0x7f00_0c00_0000), 0x1000, None),
        ];
        for (start, len, want) in cases {
            assert_eq!(covering_backing(&m, start, len), want, "{start} + {len:#x}");
        }
    }

    #[test]
    fn malformed_lines_are_named() {
        let err = parse("7f00-7f10 rw-p 0 00:00 0\nnonsense\n").unwrap_err();
        assert!(matches!(err, Error::Malformed { line: 2, .. }), "{err}");
    }
}
