//! Reduces valgrind lackey `--trace-mem=yes` output of a real program to a page trace.
//!
//! Lackey prints one line per memory access: `I  ADDR,SIZE` (instruction fetch),
//! ` L ADDR,SIZE` (load), ` S ADDR,SIZE` (store), ` M ADDR,SIZE` (modify). Data accesses are
//! kept (instruction fetches only with `with_instructions`), reduced to 4 KiB page numbers, and
//! runs of consecutive accesses to the same page merged into one record. The sparse virtual
//! address space is then packed into a dense one the way a guest's RAM would be: pages keep
//! their order, gaps up to 2 MiB are kept, larger gaps shrink to the next 2 MiB boundary.

use std::io::{self, BufRead};

use crate::trace::Trace;

/// Errors reducing a lackey log.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the log failed.
    #[error("Failed to read lackey output")]
    Read(#[source] io::Error),
    /// The log has no data accesses.
    #[error("No accesses found in lackey output")]
    Empty,
    /// The packed address space does not fit 32-bit page numbers.
    #[error("Address space too large after packing")]
    TooLarge,
}

/// Reduction options.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Stop after this many (merged) records.
    pub max_records: u64,
    /// Skip this many (merged) records first (program start-up).
    pub skip_records: u64,
    /// Keep instruction fetches too.
    pub with_instructions: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_records: 5_000_000,
            skip_records: 0,
            with_instructions: false,
        }
    }
}

fn parse_line(line: &str, with_instructions: bool) -> Option<(u64, bool)> {
    let b = line.as_bytes();
    if b.len() < 4 {
        return None;
    }
    let (write, rest) = match (b[0], b[1]) {
        (b'I', b' ') if with_instructions => (false, &line[2..]),
        (b' ', b'L') => (false, &line[2..]),
        (b' ', b'S') | (b' ', b'M') => (true, &line[2..]),
        _ => return None,
    };
    let hex = rest.trim_start().split(',').next()?;
    u64::from_str_radix(hex, 16).ok().map(|a| (a, write))
}

/// Reads lackey output and returns the packed page trace.
pub fn reduce(input: impl BufRead, opts: Options) -> Result<Trace, Error> {
    let mut raw: Vec<(u64, bool)> = Vec::new();
    let mut last = u64::MAX;
    let mut seen = 0u64;
    for line in input.lines() {
        let line = line.map_err(Error::Read)?;
        let Some((addr, write)) = parse_line(&line, opts.with_instructions) else {
            continue;
        };
        let page = addr >> 12;
        if page == last {
            if write {
                if let Some(r) = raw.last_mut() {
                    r.1 = true;
                }
            }
            continue;
        }
        last = page;
        seen += 1;
        if seen <= opts.skip_records {
            continue;
        }
        raw.push((page, write));
        if raw.len() as u64 >= opts.max_records {
            break;
        }
    }
    if raw.is_empty() {
        return Err(Error::Empty);
    }
    let mut uniq: Vec<u64> = raw.iter().map(|r| r.0).collect();
    uniq.sort_unstable();
    uniq.dedup();
    let mut dense = Vec::with_capacity(uniq.len());
    let mut next: u64 = 0;
    let mut prev: Option<u64> = None;
    for &p in &uniq {
        let idx = match prev {
            None => 0,
            Some(q) if p - q <= 512 => next + (p - q) - 1,
            Some(_) => next.div_ceil(512) * 512,
        };
        dense.push(idx);
        next = idx + 1;
        prev = Some(p);
    }
    let pages = u32::try_from(next).map_err(|_| Error::TooLarge)?;
    let mut t = Trace::new(12, pages);
    for (page, write) in raw {
        let i = uniq.partition_point(|&u| u < page);
        t.push(dense[i] as u32, write);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_and_packs() -> Result<(), Error> {
        let log = "==1== Lackey\nI  00401000,3\n L 00401010,8\n L 00401ff8,8\n S 00402000,4\n \
                   M 7ff000000,8\n L 00401000,4\ngarbage\n";
        let t = reduce(log.as_bytes(), Options::default())?;
        // Pages 0x401 (merged run), 0x402, far page, 0x401 again.
        assert_eq!(t.accesses, vec![0, 1, 512, 0]);
        assert_eq!(t.pages, 513);
        assert!(t.is_write(1) && t.is_write(2) && !t.is_write(0));
        let cases = [
            ("I  00401000,3", true, Some((0x401000, false))),
            (" X 1,1", true, None),
        ];
        for (line, instr, want) in cases {
            assert_eq!(parse_line(line, instr), want);
        }
        assert!(matches!(
            reduce(&b"nothing\n"[..], Options::default()),
            Err(Error::Empty)
        ));
        let opts = Options {
            skip_records: 1,
            max_records: 2,
            ..Options::default()
        };
        assert_eq!(reduce(log.as_bytes(), opts)?.accesses.len(), 2);
        Ok(())
    }
}
