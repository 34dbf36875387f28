//! Free guest memory: every page frame `/proc/kpageflags` marks `KPF_BUDDY` (the kernel
//! sets it on the head and on every tail page of a free buddy block), coalesced into
//! ranges. Pages on per-CPU free lists are not buddy pages and are not reported, so the
//! total is close to `MemFree`, which does not count them either.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::ranges::{self, PfnRange};

/// Where the kernel exposes page flags.
pub const KPAGEFLAGS: &str = "/proc/kpageflags";

/// Bit of a free (buddy allocator) page in kpageflags.
const KPF_BUDDY: u64 = 1 << 10;

/// Errors of the free-page source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file cannot be opened (no CONFIG_PROC_PAGE_MONITOR, or not root).
    #[error("Cannot open {0}")]
    Open(PathBuf, #[source] io::Error),
    /// Reading failed.
    #[error("Cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
}

/// Scans page flags and returns the free ranges of at least `min_pages` pages.
pub fn scan(path: &Path, min_pages: u64) -> Result<Vec<PfnRange>, Error> {
    let f = File::open(path).map_err(|e| Error::Open(path.to_owned(), e))?;
    scan_reader(f, min_pages).map_err(|e| Error::Read(path.to_owned(), e))
}

/// Whether the file can be opened and read (`--check`).
pub fn probe(path: &Path) -> Result<(), Error> {
    let mut f = File::open(path).map_err(|e| Error::Open(path.to_owned(), e))?;
    let mut b = [0u8; 8];
    f.read_exact(&mut b)
        .map_err(|e| Error::Read(path.to_owned(), e))
}

fn scan_reader(mut r: impl Read, min_pages: u64) -> io::Result<Vec<PfnRange>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8 * 8192];
    let mut pfn = 0u64;
    let mut carry = 0usize;
    loop {
        let n = match r.read(&mut buf[carry..]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let have = carry + n;
        let whole = have - have % 8;
        for e in buf[..whole].chunks_exact(8) {
            let v = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
            if v & KPF_BUDDY != 0 {
                ranges::push_sorted(&mut out, pfn);
            }
            pfn += 1;
        }
        buf.copy_within(whole..have, 0);
        carry = have - whole;
    }
    out.retain(|r| r.pages >= min_pages);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranges::Pfn;

    fn flags(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A reader that returns at most 5 bytes per call, to split entries.
    struct Dribble(Vec<u8>, usize);
    impl Read for Dribble {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            let n = b.len().min(5).min(self.0.len() - self.1);
            b[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    #[test]
    fn finds_buddy_runs() {
        let b = KPF_BUDDY;
        let lru = 1 << 5;
        // pfn:        0  1  2  3    4  5  6  7
        let page = [0, b, b, lru, b, b | lru, b, 0];
        let r = |s, p| PfnRange {
            start: Pfn(s),
            pages: p,
        };
        let cases: &[(u64, Vec<PfnRange>)] =
            &[(1, vec![r(1, 2), r(4, 3)]), (3, vec![r(4, 3)]), (4, vec![])];
        for (min, want) in cases {
            assert_eq!(scan_reader(&flags(&page)[..], *min).unwrap(), *want);
            assert_eq!(scan_reader(Dribble(flags(&page), 0), *min).unwrap(), *want);
        }
    }
}
