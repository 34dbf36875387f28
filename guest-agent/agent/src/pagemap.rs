//! Virtual → guest-physical translation through `/proc/PID/pagemap` (needs
//! `CAP_SYS_ADMIN` for frame numbers; without it the kernel reports frame 0), and process
//! identity that survives pid reuse.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use crate::ranges::PAGE;

/// Most pages translated per call (4 GiB of 4 KiB pages).
pub const MAX_PAGES: u64 = 1 << 20;

const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;

/// Errors of translation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The process is gone or its pagemap cannot be opened.
    #[error("Cannot open the pagemap of pid {0}")]
    Open(i32, #[source] io::Error),
    /// Reading the pagemap failed.
    #[error("Cannot read the pagemap of pid {0}")]
    Read(i32, #[source] io::Error),
    /// The range is not page-aligned, empty, too large or wraps.
    #[error("Bad range {start:#x}+{len:#x}: need page-aligned, 1 ..= {max} pages, no wrap")]
    BadRange {
        /// Start address.
        start: u64,
        /// Length, bytes.
        len: u64,
        /// Most pages allowed.
        max: u64,
    },
    /// Frame numbers read as 0: the agent lacks CAP_SYS_ADMIN.
    #[error("Pagemap hides frame numbers (the agent needs CAP_SYS_ADMIN)")]
    Hidden,
}

/// Frames of the present pages of `[start, start+len)` in process `pid`, in virtual order.
/// Pages not present (never touched, swapped) are skipped.
pub fn translate(pid: i32, start: u64, len: u64) -> Result<Vec<u64>, Error> {
    let bad = || Error::BadRange {
        start,
        len,
        max: MAX_PAGES,
    };
    if start % PAGE != 0 || len % PAGE != 0 || len == 0 || start.checked_add(len).is_none() {
        return Err(bad());
    }
    let pages = len / PAGE;
    if pages > MAX_PAGES {
        return Err(bad());
    }
    let f = File::open(format!("/proc/{pid}/pagemap")).map_err(|e| Error::Open(pid, e))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8 * 4096];
    let mut done = 0u64;
    while done < pages {
        let n = (pages - done).min(4096);
        let off = (start / PAGE + done) * 8;
        let want = usize::try_from(n * 8).unwrap_or(buf.len());
        let got = read_full_at(&f, &mut buf[..want], off).map_err(|e| Error::Read(pid, e))?;
        if got == 0 {
            break;
        }
        for e in buf[..got].chunks_exact(8) {
            let v = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
            if v & PRESENT != 0 {
                let pfn = v & PFN_MASK;
                if pfn == 0 {
                    return Err(Error::Hidden);
                }
                out.push(pfn);
            }
        }
        done += (got / 8) as u64;
    }
    Ok(out)
}

fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got - got % 8)
}

/// A process's start time (clock ticks since boot, field 22 of `/proc/PID/stat`): with
/// the pid it names one process even after the pid is reused.
pub fn start_time(pid: i32) -> Option<u64> {
    let mut s = String::new();
    File::open(format!("/proc/{pid}/stat"))
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    // The comm field may hold spaces and parentheses: fields restart after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// One line of `/proc/PID/maps`: `[start, end)` and its path column (`""` for anonymous).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// The path column (`[heap]`, `/usr/lib/...`, or empty).
    pub path: String,
}

/// The mappings of `pid`.
pub fn mappings(pid: i32) -> io::Result<Vec<Mapping>> {
    let mut f = File::open(format!("/proc/{pid}/maps"))?;
    f.seek(SeekFrom::Start(0))?;
    let mut s = String::new();
    f.read_to_string(&mut s)?;
    Ok(parse_maps(&s))
}

fn parse_maps(s: &str) -> Vec<Mapping> {
    s.lines()
        .filter_map(|l| {
            let mut it = l.splitn(6, ' ');
            let (a, b) = it.next()?.split_once('-')?;
            let start = u64::from_str_radix(a, 16).ok()?;
            let end = u64::from_str_radix(b, 16).ok()?;
            let path = it.nth(4).unwrap_or("").trim_start().to_owned();
            (end > start).then_some(Mapping { start, end, path })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_ranges() {
        let me = std::process::id() as i32;
        for (start, len) in [
            (1, 4096),
            (4096, 1),
            (4096, 0),
            (u64::MAX - 4095, 8192),
            (0, (MAX_PAGES + 1) * PAGE),
        ] {
            assert!(
                matches!(translate(me, start, len), Err(Error::BadRange { .. })),
                "{start:#x}+{len:#x}"
            );
        }
    }

    #[test]
    fn parses_maps() {
        let s = "00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon\n\
                 00e03000-00e24000 rw-p 00000000 00:00 0           [heap]\n\
                 7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n\
                 garbage\n";
        let m = parse_maps(s);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].path, "/usr/bin/dbus-daemon");
        assert_eq!(m[1].path, "[heap]");
        assert_eq!(
            (m[2].start, m[2].end, m[2].path.as_str()),
            (0x7f0000000000, 0x7f0000001000, "")
        );
    }

    #[test]
    fn start_time_names_this_process() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert_eq!(start_time(-5), None);
    }
}
