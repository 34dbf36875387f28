//! Reduces valgrind lackey `--trace-mem=yes` output of a real program to a page trace.
//!
//! Lackey prints one line per memory access: `I  ADDR,SIZE` (instruction fetch),
//! ` L ADDR,SIZE` (load), ` S ADDR,SIZE` (store), ` M ADDR,SIZE` (modify). Data accesses are
//! kept (instruction fetches only with `with_instructions`), reduced to 4 KiB page numbers, and
//! runs of consecutive accesses to the same page merged into one record. The sparse virtual
//! address space is then packed into a dense one the way a guest's RAM would be: pages keep
//! their order, gaps up to 2 MiB are kept, larger gaps shrink to the next 2 MiB boundary.
//!
//! Long programs: with `epoch_instructions` every N executed instructions (lackey's `I` lines,
//! the recording's clock) start an epoch, marked by an [`EPOCH_MARKER`] record, and with
//! `sample_every` only one merged record in each block of S is kept (one random position per
//! block), so a run of billions of accesses reduces to a small file that keeps its phases and
//! each epoch's access mix (`docs/trace-format.md`).

use std::io::{self, BufRead};

use crate::rng::Rng;
use crate::trace::{Trace, EPOCH_MARKER};

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
    /// Stop after this many (merged, kept) records.
    pub max_records: u64,
    /// Skip this many (merged) records first (program start-up).
    pub skip_records: u64,
    /// Keep instruction fetches too.
    pub with_instructions: bool,
    /// Epoch length in executed instructions (lackey `I` lines), 0 = no epochs. Each epoch
    /// starts with an [`EPOCH_MARKER`] record; the simulator runs one tick per epoch.
    pub epoch_instructions: u64,
    /// Keep one merged record in each block of this many, at a random position in the block
    /// (stratified sampling; 1 keeps all).
    pub sample_every: u64,
    /// Seed of the sampling positions.
    pub seed: u64,
    /// Stop after this many epochs (0 = no limit; only with `epoch_instructions`).
    pub max_epochs: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_records: 5_000_000,
            skip_records: 0,
            with_instructions: false,
            epoch_instructions: 0,
            sample_every: 1,
            seed: 1,
            max_epochs: 0,
        }
    }
}

/// What a lackey line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// An instruction fetch (counted for epochs).
    Instr(u64),
    /// A data access (address, write).
    Data(u64, bool),
}

fn parse_line(line: &[u8]) -> Option<Line> {
    if line.len() < 4 {
        return None;
    }
    let (kind, rest) = match (line[0], line[1]) {
        (b'I', b' ') => (0u8, &line[2..]),
        (b' ', b'L') => (1, &line[2..]),
        (b' ', b'S') | (b' ', b'M') => (2, &line[2..]),
        _ => return None,
    };
    let mut addr: u64 = 0;
    let mut digits = 0;
    for &c in rest.iter().skip_while(|c| **c == b' ') {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            b',' => break,
            _ => return None,
        };
        if digits == 16 {
            return None;
        }
        addr = (addr << 4) | u64::from(d);
        digits += 1;
    }
    if digits == 0 {
        return None;
    }
    Some(match kind {
        0 => Line::Instr(addr),
        k => Line::Data(addr, k == 2),
    })
}

/// Reads lackey output and returns the packed page trace.
pub fn reduce(mut input: impl BufRead, opts: Options) -> Result<Trace, Error> {
    let mut raw: Vec<(u64, bool)> = Vec::new();
    // Where each epoch starts in `raw`.
    let mut epochs: Vec<usize> = Vec::new();
    let mut last = u64::MAX;
    let mut seen = 0u64;
    let mut instructions = 0u64;
    let every = opts.sample_every.max(1);
    let mut rng = Rng::new(opts.seed);
    // Position in the current sampling block, and the one kept there.
    let mut in_block = 0u64;
    let mut pick = rng.below(every);
    // Whether the merged record being extended was kept.
    let mut kept_last = false;
    let mut line = Vec::with_capacity(64);
    if opts.epoch_instructions > 0 {
        epochs.push(0);
    }
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line).map_err(Error::Read)? == 0 {
            break;
        }
        let (addr, write) = match parse_line(&line) {
            None => continue,
            Some(Line::Instr(a)) => {
                instructions += 1;
                if opts.epoch_instructions > 0 && instructions % opts.epoch_instructions == 0 {
                    if opts.max_epochs > 0 && epochs.len() as u64 >= opts.max_epochs {
                        break;
                    }
                    epochs.push(raw.len());
                }
                if !opts.with_instructions {
                    continue;
                }
                (a, false)
            }
            Some(Line::Data(a, w)) => (a, w),
        };
        let page = addr >> 12;
        if page == last {
            if write && kept_last {
                if let Some(r) = raw.last_mut() {
                    r.1 = true;
                }
            }
            continue;
        }
        last = page;
        kept_last = false;
        seen += 1;
        if seen <= opts.skip_records {
            continue;
        }
        let keep = in_block == pick;
        in_block += 1;
        if in_block == every {
            in_block = 0;
            pick = rng.below(every);
        }
        if !keep {
            continue;
        }
        kept_last = true;
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
    // Empty epochs (nothing kept) vanish: one marker per distinct start.
    epochs.dedup();
    let mut starts = epochs.iter().peekable();
    for (i, (page, write)) in raw.into_iter().enumerate() {
        while starts.next_if(|&&s| s <= i).is_some() {
            if t.markers.last().map_or(true, |m| m.at < i as u64) {
                t.mark(EPOCH_MARKER);
            }
        }
        let k = uniq.partition_point(|&u| u < page);
        t.push(dense[k] as u32, write);
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
            ("I  00401000,3", Some(Line::Instr(0x401000))),
            (" L 7ff000000,8", Some(Line::Data(0x7ff000000, false))),
            (" M 10,8", Some(Line::Data(0x10, true))),
            (" X 1,1", None),
            (" L ,8", None),
            (" L 12345678901234567,8", None),
            (" L 12g4,8", None),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line.as_bytes()), want, "{line}");
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

    /// A lackey log: `n` rounds of 10 instructions and one load of each of 4 pages.
    fn epoch_log(n: usize) -> String {
        let mut log = String::new();
        for r in 0..n {
            for _ in 0..10 {
                log.push_str("I  00401000,3\n");
            }
            for p in 0..4 {
                // Round r touches pages r*4+p (a phase per round).
                log.push_str(&format!(" L {:x},8\n", 0x1000_0000 + (r * 4 + p) * 4096));
            }
        }
        log
    }

    #[test]
    fn epochs_mark_instruction_counts_and_sampling_keeps_one_per_block() -> Result<(), Error> {
        // (epoch instructions, sample every, max epochs, accesses kept, epoch starts).
        let cases: Vec<(u64, u64, u64, usize, Vec<u64>)> = vec![
            (0, 1, 0, 24, vec![]),
            // An epoch per 20 instructions: the 20th is the last fetch of round 1, the 40th
            // of round 3.
            (20, 1, 0, 24, vec![0, 4, 12, 20]),
            // One record in 4: one per round.
            (20, 4, 0, 6, vec![0, 1, 3, 5]),
            (10, 2, 0, 12, vec![0, 2, 4, 6, 8, 10]),
            // Two epochs at most: reading stops at the third epoch's start.
            (20, 1, 2, 12, vec![0, 4]),
        ];
        for (epoch, every, max_epochs, n, starts) in cases {
            let opts = Options {
                epoch_instructions: epoch,
                sample_every: every,
                max_epochs,
                ..Options::default()
            };
            let t = reduce(epoch_log(6).as_bytes(), opts)?;
            assert_eq!(t.accesses.len(), n, "{opts:?}");
            let at: Vec<u64> = t.markers.iter().map(|m| m.at).collect();
            assert_eq!(at, starts, "{opts:?}");
            assert!(t.markers.iter().all(|m| m.id == EPOCH_MARKER));
            // Sampling keeps the order: pages never go backwards in this log.
            assert!(t.accesses.windows(2).all(|w| w[0] < w[1]), "{opts:?}");
        }
        Ok(())
    }
}
