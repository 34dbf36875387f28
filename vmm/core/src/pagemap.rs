//! The `PAGEMAP_SCAN` ioctl (Linux 6.7+) on `/proc/PID/pagemap`: the kernel walks a range of
//! a process's page tables and returns runs of pages in the asked categories. The soft-dirty
//! source uses it for written pages ([`PAGE_IS_SOFT_DIRTY`]), the engine for the ranges
//! PMD-mapped huge pages map ([`PAGE_IS_HUGE`]: a transparent huge page or hugetlb page
//! mapped by one page-table entry, which `move_pages(2)` moves whole whatever subpage it is
//! given).

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

/// `PAGE_IS_HUGE` from `linux/fs.h`: mapped by a PMD (or larger) entry.
pub const PAGE_IS_HUGE: u64 = 1 << 6;
/// `PAGE_IS_SOFT_DIRTY` from `linux/fs.h`.
pub const PAGE_IS_SOFT_DIRTY: u64 = 1 << 7;

/// Runs asked for per call.
pub const SCAN_BATCH: usize = 512;

/// `struct page_region` from `linux/fs.h`: `[start, end)` and the categories its pages share.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct PageRegion {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// The categories of `return_mask` its pages have.
    pub categories: u64,
}

/// `struct pm_scan_arg` from `linux/fs.h`.
#[repr(C)]
#[derive(Default, Debug)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `PAGEMAP_SCAN = _IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | (0x66 << 8) | 16;

/// One `PAGEMAP_SCAN` call on `pagemap` over `[start, end)` for pages having every category of
/// `mask`. Returns the runs filled into `vec` and where the walk stopped.
pub fn scan_once(
    pagemap: &File,
    start: u64,
    end: u64,
    mask: u64,
    vec: &mut [PageRegion],
) -> io::Result<(usize, u64)> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        start,
        end,
        vec: vec.as_mut_ptr() as u64,
        vec_len: vec.len() as u64,
        category_mask: mask,
        return_mask: mask,
        ..PmScanArg::default()
    };
    // SAFETY: `arg` is a properly sized pm_scan_arg that lives across the call; `vec`
    // points to `vec_len` writable page_region structs owned by the caller.
    let n = unsafe {
        libc::ioctl(
            pagemap.as_raw_fd(),
            PAGEMAP_SCAN as _,
            std::ptr::addr_of_mut!(arg),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = usize::try_from(n).unwrap_or(0).min(vec.len());
    Ok((n, arg.walk_end))
}

/// Whether `PAGEMAP_SCAN` works on `pagemap` for `mask` (tried on one page at `addr`).
pub fn supported(pagemap: &File, addr: u64, mask: u64) -> bool {
    let mut v = [PageRegion::default(); 1];
    scan_once(pagemap, addr, addr.saturating_add(4096), mask, &mut v).is_ok()
}

/// Appends the runs of `[start, end)` whose pages have every category of `mask` to `out` as
/// `(start, end)`, contiguous runs merged (with the last one already in `out` too), in as
/// many calls as it takes; `vec` is the scratch buffer of each call.
pub fn runs(
    pagemap: &File,
    start: u64,
    end: u64,
    mask: u64,
    vec: &mut [PageRegion],
    out: &mut Vec<(u64, u64)>,
) -> io::Result<()> {
    let mut at = start;
    while at < end {
        let (n, walk_end) = scan_once(pagemap, at, end, mask, vec)?;
        for r in &vec[..n] {
            match out.last_mut() {
                Some(last) if last.1 == r.start => last.1 = r.end,
                _ => out.push((r.start, r.end)),
            }
        }
        if walk_end <= at {
            break;
        }
        at = walk_end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_number_matches_the_uapi() {
        assert_eq!(std::mem::size_of::<PmScanArg>(), 96);
        assert_eq!(std::mem::size_of::<PageRegion>(), 24);
        assert_eq!(PAGEMAP_SCAN, 0xc060_6610);
    }
}
