//! The compact page-access trace format (`docs/trace-format.md`): reading, validating and
//! writing `.vmt` files, optionally gzip-compressed (`.vmt.gz`, detected by magic).
//!
//! A trace is a header followed by LEB128 varint records. Each record's low two bits are its
//! kind: 0 read and 1 write (the rest is the zigzag delta from the previous page number), 2 a
//! marker (the rest is the marker id, e.g. a phase change), 3 the end record (the rest is the
//! number of access records). Errors name the record index and the byte offset in the
//! uncompressed stream.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;

/// The 8 bytes every trace starts with.
pub const MAGIC: &[u8; 8] = b"VMTTRACE";
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: u64 = 24;

/// Errors reading or writing a trace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or created.
    #[error("Failed to open trace {0}")]
    Open(PathBuf, #[source] io::Error),
    /// The header is shorter than 24 bytes.
    #[error("Trace header truncated at byte {0}")]
    ShortHeader(u64),
    /// The magic bytes are wrong.
    #[error("Not a vmtier trace (bad magic)")]
    BadMagic,
    /// The version is not [`VERSION`].
    #[error("Unsupported trace version {0}")]
    Version(u16),
    /// A header field is out of range.
    #[error("Invalid trace header: {0}")]
    Header(&'static str),
    /// The stream ended inside a record or before the end record.
    #[error("Trace truncated at byte {byte} (record {record})")]
    Truncated {
        /// Index of the record being read.
        record: u64,
        /// Offset in the uncompressed stream.
        byte: u64,
    },
    /// A varint is longer than 10 bytes or a kind is unknown.
    #[error("Malformed record {record} at byte {byte}: {what}")]
    Malformed {
        /// Index of the record.
        record: u64,
        /// Offset in the uncompressed stream.
        byte: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// A page number falls outside the header's address space.
    #[error("Page {page} out of range in record {record} at byte {byte}")]
    PageOutOfRange {
        /// Index of the record.
        record: u64,
        /// Offset in the uncompressed stream.
        byte: u64,
        /// The decoded page number.
        page: i64,
    },
    /// The end record's count disagrees with the records read.
    #[error("End record at byte {byte} counts {expected} accesses, found {found}")]
    Count {
        /// Offset of the end record.
        byte: u64,
        /// Count in the end record.
        expected: u64,
        /// Access records actually read.
        found: u64,
    },
    /// Bytes follow the end record.
    #[error("Data after the end record at byte {0}")]
    Trailing(u64),
    /// The stream could not be read (I/O or corrupt compression).
    #[error("Trace unreadable at byte {byte} (record {record})")]
    Read {
        /// Index of the record being read.
        record: u64,
        /// Offset in the uncompressed stream.
        byte: u64,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Writing the trace failed (the partial file was removed).
    #[error("Failed to write trace {0}")]
    Write(PathBuf, #[source] io::Error),
    /// The trace has more pages than a u32 index can address.
    #[error("Trace too large: {0} pages")]
    TooLarge(u64),
}

/// The marker id reserved for the start of a recorded epoch (`docs/trace-format.md`): a trace
/// that carries it is replayed one simulator tick per epoch. Other ids are free (generators use
/// small phase numbers).
pub const EPOCH_MARKER: u64 = 0xffff_ffff;

/// A marker in the access stream (a phase change of a generator, a workload event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker {
    /// Index of the first access after the marker.
    pub at: u64,
    /// Marker id.
    pub id: u64,
}

/// A decoded trace, held in memory (4 bytes per access plus a write bit).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// log2 of the page size the page numbers refer to (12 for 4 KiB).
    pub page_shift: u8,
    /// Size of the address space in pages; every page number is below it.
    pub pages: u32,
    /// Page number of every access, in order.
    pub accesses: Vec<u32>,
    /// One bit per access: set for writes.
    pub writes: Vec<u64>,
    /// Markers, in order.
    pub markers: Vec<Marker>,
}

impl Trace {
    /// An empty trace over `pages` pages of `1 << page_shift` bytes.
    pub fn new(page_shift: u8, pages: u32) -> Self {
        Self {
            page_shift,
            pages,
            ..Self::default()
        }
    }

    /// Appends one access.
    pub fn push(&mut self, page: u32, write: bool) {
        debug_assert!(page < self.pages);
        let i = self.accesses.len();
        if i % 64 == 0 {
            self.writes.push(0);
        }
        if write {
            if let Some(w) = self.writes.last_mut() {
                *w |= 1 << (i % 64);
            }
        }
        self.accesses.push(page);
    }

    /// Appends a marker before the next access.
    pub fn mark(&mut self, id: u64) {
        self.markers.push(Marker {
            at: self.accesses.len() as u64,
            id,
        });
    }

    /// Access indices where epochs start (markers with [`EPOCH_MARKER`]), strictly
    /// increasing, without 0 and without the end: the tick boundaries of an epoch trace.
    /// Empty when the trace has no epochs.
    pub fn epoch_bounds(&self) -> Vec<u64> {
        let total = self.accesses.len() as u64;
        let mut v: Vec<u64> = Vec::new();
        for m in self.markers.iter().filter(|m| m.id == EPOCH_MARKER) {
            if m.at > 0 && m.at < total && v.last().map_or(true, |&l| m.at > l) {
                v.push(m.at);
            }
        }
        v
    }

    /// Whether the trace carries epoch markers.
    pub fn has_epochs(&self) -> bool {
        self.markers.iter().any(|m| m.id == EPOCH_MARKER)
    }

    /// A sparser copy: one access kept in each block of `every` consecutive ones, at a
    /// random position in the block (`seed`), the way `record-lackey --sample-every` keeps
    /// records; consecutive kept accesses to one page (no marker between them) merge into one
    /// (a write if either was). Markers stay before the access they preceded; the address
    /// space is unchanged. `every` ≤ 1 copies the trace.
    pub fn thin(&self, every: u64, seed: u64) -> Trace {
        let every = every.max(1);
        let mut rng = crate::rng::Rng::new(seed);
        let mut out = Trace::new(self.page_shift, self.pages);
        let mut markers = self.markers.iter().peekable();
        let mut pick = rng.below(every);
        let mut marked = false;
        for (i, &page) in self.accesses.iter().enumerate() {
            while let Some(m) = markers.next_if(|m| m.at <= i as u64) {
                out.mark(m.id);
                marked = true;
            }
            let in_block = i as u64 % every;
            let keep = in_block == pick;
            if in_block + 1 == every {
                pick = rng.below(every);
            }
            if !keep {
                continue;
            }
            let write = self.is_write(i);
            let n = out.accesses.len();
            if !marked && n > 0 && out.accesses[n - 1] == page {
                if write {
                    out.writes[(n - 1) / 64] |= 1 << ((n - 1) % 64);
                }
                continue;
            }
            out.push(page, write);
            marked = false;
        }
        for m in markers {
            out.mark(m.id);
        }
        out
    }

    /// Whether access `i` is a write.
    pub fn is_write(&self, i: usize) -> bool {
        self.writes
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Reads a trace file (plain or gzip), validating all of it.
    pub fn read_path(path: &Path) -> Result<Self, Error> {
        let file = File::open(path).map_err(|e| Error::Open(path.to_owned(), e))?;
        let mut r = BufReader::with_capacity(1 << 16, file);
        let mut peek = [0u8; 2];
        let n = read_full(&mut r, &mut peek).map_err(|e| Error::Read {
            record: 0,
            byte: 0,
            source: e,
        })?;
        let head = io::Cursor::new(peek[..n].to_vec());
        if n == 2 && peek == [0x1f, 0x8b] {
            Self::read_from(BufReader::with_capacity(
                1 << 16,
                GzDecoder::new(head.chain(r)),
            ))
        } else {
            Self::read_from(head.chain(r))
        }
    }

    /// Reads a trace from an uncompressed stream.
    pub fn read_from<R: Read>(r: R) -> Result<Self, Error> {
        let mut d = Decoder {
            r: BufReader::with_capacity(1 << 16, r).bytes(),
            byte: 0,
        };
        let mut h = [0u8; HEADER_LEN as usize];
        for slot in h.iter_mut() {
            *slot = match d.next_byte(0)? {
                Some(b) => b,
                None => return Err(Error::ShortHeader(d.byte)),
            };
        }
        if &h[0..8] != MAGIC {
            return Err(Error::BadMagic);
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if version != VERSION {
            return Err(Error::Version(version));
        }
        let page_shift = h[10];
        if !(9..=30).contains(&page_shift) {
            return Err(Error::Header("page shift outside 9..=30"));
        }
        if h[11] != 0 || h[12..16] != [0; 4] {
            return Err(Error::Header("reserved bytes not zero"));
        }
        let mut pages_le = [0u8; 8];
        pages_le.copy_from_slice(&h[16..24]);
        let pages64 = u64::from_le_bytes(pages_le);
        let pages = u32::try_from(pages64).map_err(|_| Error::TooLarge(pages64))?;
        let mut t = Trace::new(page_shift, pages);
        let mut prev: i64 = 0;
        let mut record: u64 = 0;
        loop {
            let start = d.byte;
            let Some(v) = d.varint(record)? else {
                return Err(Error::Truncated {
                    record,
                    byte: d.byte,
                });
            };
            let payload = v >> 2;
            match v & 3 {
                kind @ (0 | 1) => {
                    let delta = ((payload >> 1) as i64) ^ -((payload & 1) as i64);
                    let page = prev.checked_add(delta).unwrap_or(-1);
                    if page < 0 || page >= i64::from(pages) {
                        return Err(Error::PageOutOfRange {
                            record,
                            byte: start,
                            page,
                        });
                    }
                    prev = page;
                    t.push(page as u32, kind == 1);
                }
                2 => t.mark(payload),
                _ => {
                    let found = t.accesses.len() as u64;
                    if payload != found {
                        return Err(Error::Count {
                            byte: start,
                            expected: payload,
                            found,
                        });
                    }
                    if d.next_byte(record)?.is_some() {
                        return Err(Error::Trailing(d.byte.saturating_sub(1)));
                    }
                    return Ok(t);
                }
            }
            record = record.saturating_add(1);
        }
    }

    /// Encodes the trace (uncompressed).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.accesses.len().saturating_mul(2).saturating_add(64));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(self.page_shift);
        out.extend_from_slice(&[0; 5]);
        out.extend_from_slice(&u64::from(self.pages).to_le_bytes());
        let mut prev: i64 = 0;
        let mut markers = self.markers.iter().peekable();
        for (i, &page) in self.accesses.iter().enumerate() {
            while let Some(m) = markers.next_if(|m| m.at <= i as u64) {
                put_varint(&mut out, (m.id << 2) | 2);
            }
            let delta = i64::from(page) - prev;
            prev = i64::from(page);
            let zz = ((delta << 1) ^ (delta >> 63)) as u64;
            put_varint(&mut out, (zz << 2) | u64::from(self.is_write(i)));
        }
        for m in markers {
            put_varint(&mut out, (m.id << 2) | 2);
        }
        put_varint(&mut out, ((self.accesses.len() as u64) << 2) | 3);
        out
    }

    /// Writes the trace to `path` (gzip when it ends in `.gz`) through a temporary file that
    /// is renamed into place, so a failed write leaves nothing behind.
    pub fn write_path(&self, path: &Path) -> Result<(), Error> {
        let bytes = self.encode();
        let gz = path.extension().is_some_and(|e| e == "gz");
        write_atomically(path, |w| {
            if gz {
                let mut e = GzEncoder::new(w, flate2::Compression::best());
                e.write_all(&bytes)?;
                e.finish()?.flush()
            } else {
                w.write_all(&bytes)?;
                w.flush()
            }
        })
        .map_err(|e| Error::Write(path.to_owned(), e))
    }
}

/// Writes a file through `PATH.tmp` + rename; removes the temporary on failure.
pub fn write_atomically(
    path: &Path,
    f: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let res = File::create(&tmp).and_then(|file| {
        let mut w = BufWriter::new(file);
        f(&mut w)?;
        w.flush()?;
        w.get_ref().sync_all()?;
        drop(w);
        std::fs::rename(&tmp, path)
    });
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Decoder<R> {
    r: io::Bytes<BufReader<R>>,
    byte: u64,
}

impl<R: Read> Decoder<R> {
    fn next_byte(&mut self, record: u64) -> Result<Option<u8>, Error> {
        match self.r.next() {
            None => Ok(None),
            Some(Ok(b)) => {
                self.byte += 1;
                Ok(Some(b))
            }
            Some(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Err(Error::Truncated {
                record,
                byte: self.byte,
            }),
            Some(Err(e)) => Err(Error::Read {
                record,
                byte: self.byte,
                source: e,
            }),
        }
    }

    /// A LEB128 varint; `None` at a clean end of stream before its first byte.
    fn varint(&mut self, record: u64) -> Result<Option<u64>, Error> {
        let start = self.byte;
        let mut v: u64 = 0;
        for i in 0..10u32 {
            let Some(b) = self.next_byte(record)? else {
                return if i == 0 {
                    Ok(None)
                } else {
                    Err(Error::Truncated {
                        record,
                        byte: self.byte,
                    })
                };
            };
            if i == 9 && b > 1 {
                break;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(Some(v));
            }
        }
        Err(Error::Malformed {
            record,
            byte: start,
            what: "varint longer than 64 bits",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Trace {
        let mut t = Trace::new(12, 1000);
        for (i, p) in [5u32, 6, 999, 0, 0, 512].into_iter().enumerate() {
            if i == 3 {
                t.mark(7);
            }
            t.push(p, i % 2 == 1);
        }
        t.mark(9);
        t
    }

    #[test]
    #[allow(clippy::type_complexity)] // test table
    fn epoch_bounds_table() {
        // (markers as (at, id), accesses, bounds): other ids, 0, the end and repeats are not
        // boundaries.
        let cases: Vec<(Vec<(u64, u64)>, usize, Vec<u64>, bool)> = vec![
            (vec![], 10, vec![], false),
            (vec![(3, 1), (6, 2)], 10, vec![], false),
            (
                vec![(0, EPOCH_MARKER), (4, EPOCH_MARKER), (7, EPOCH_MARKER)],
                10,
                vec![4, 7],
                true,
            ),
            (
                vec![(4, EPOCH_MARKER), (4, EPOCH_MARKER), (10, EPOCH_MARKER)],
                10,
                vec![4],
                true,
            ),
            (vec![(2, 5), (5, EPOCH_MARKER), (5, 6)], 10, vec![5], true),
        ];
        for (markers, n, want, has) in cases {
            let mut t = Trace::new(12, 16);
            for i in 0..n {
                for &(at, id) in &markers {
                    if at == i as u64 {
                        t.mark(id);
                    }
                }
                t.push(i as u32, false);
            }
            for &(at, id) in &markers {
                if at >= n as u64 {
                    t.mark(id);
                }
            }
            assert_eq!(t.epoch_bounds(), want, "{markers:?}");
            assert_eq!(t.has_epochs(), has, "{markers:?}");
            assert_eq!(Trace::read_from(&t.encode()[..]).ok(), Some(t));
        }
    }

    #[test]
    fn thinning_keeps_one_per_block_markers_and_order() {
        // 0..40 pages in order, a marker before 20, an epoch marker at the end.
        let mut t = Trace::new(12, 64);
        for p in 0..40u32 {
            if p == 20 {
                t.mark(3);
            }
            t.push(p, p % 3 == 0);
        }
        t.mark(EPOCH_MARKER);
        // (every, accesses kept)
        for (every, n) in [(1u64, 40usize), (4, 10), (8, 5), (40, 1)] {
            let th = t.thin(every, 7);
            assert_eq!(th.accesses.len(), n, "every {every}");
            assert!(th.accesses.windows(2).all(|w| w[0] < w[1]));
            for (k, &p) in th.accesses.iter().enumerate() {
                assert_eq!(th.is_write(k), p % 3 == 0, "every {every}");
                if n > 0 {
                    // The k-th kept access comes from the k-th block.
                    assert_eq!(u64::from(p) / every, k as u64, "every {every}");
                }
            }
            let at: Vec<(u64, u64)> = th.markers.iter().map(|m| (m.at, m.id)).collect();
            let before20 = th.accesses.iter().filter(|&&p| p < 20).count() as u64;
            assert_eq!(at, vec![(before20, 3), (n as u64, EPOCH_MARKER)]);
            assert_eq!(Trace::read_from(&th.encode()[..]).ok(), Some(th));
        }
        // Kept accesses to one page merge, a write wins; a marker between them keeps both.
        let mut t = Trace::new(12, 4);
        for (p, w) in [(1, false), (1, true), (2, false)] {
            t.push(p, w);
        }
        t.mark(9);
        t.push(2, false);
        let th = t.thin(1, 1);
        assert_eq!(th.accesses, vec![1, 2, 2]);
        assert!(th.is_write(0) && !th.is_write(1));
    }

    #[test]
    fn round_trips_plain_and_gzip() -> Result<(), Error> {
        let t = sample();
        assert_eq!(Trace::read_from(&t.encode()[..])?, t);
        let dir = std::env::temp_dir().join(format!("vmt-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::Write(dir.clone(), e))?;
        for name in ["a.vmt", "a.vmt.gz"] {
            let p = dir.join(name);
            t.write_path(&p)?;
            assert_eq!(Trace::read_path(&p)?, t);
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn every_truncation_is_an_error_with_a_position() {
        let bytes = sample().encode();
        for len in 0..bytes.len() {
            let err = Trace::read_from(&bytes[..len]).expect_err("truncated trace accepted");
            match err {
                Error::ShortHeader(b) => assert!(b < HEADER_LEN),
                Error::Truncated { byte, .. } => assert_eq!(byte, len as u64),
                other => panic!("unexpected error at {len}: {other}"),
            }
        }
    }

    #[test]
    fn malformed_traces_are_rejected() {
        let good = sample().encode();
        let end = good.len();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                b"XMTTRACE".iter().chain(&good[8..]).copied().collect(),
                "bad magic",
            ),
            ([&good[..8], &[2, 0], &good[10..]].concat(), "version 2"),
            ([&good[..10], &[40], &good[11..]].concat(), "page shift"),
            ([&good[..11], &[1], &good[12..]].concat(), "reserved"),
            (
                [&good[..], &[0]].concat(),
                "Data after the end record at byte",
            ),
            (
                [&good[..end - 1], &[0x0b]].concat(),
                "counts 2 accesses, found 6",
            ),
            ([&good[..24], &[0xff; 11]].concat(), "varint longer"),
            (
                [&good[..24], &[0x04]].concat(),
                "Page -1 out of range in record 0 at byte 24",
            ),
        ];
        for (bytes, want) in cases {
            let err = Trace::read_from(&bytes[..]).expect_err(want).to_string();
            assert!(
                err.to_lowercase().contains(&want.to_lowercase()),
                "{err} !~ {want}"
            );
        }
    }

    #[test]
    fn corrupt_gzip_names_a_position_and_failed_write_leaves_nothing() -> Result<(), Error> {
        let dir = std::env::temp_dir().join(format!("vmt-gz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| Error::Write(dir.clone(), e))?;
        let p = dir.join("t.vmt.gz");
        sample().write_path(&p)?;
        let full = std::fs::read(&p).map_err(|e| Error::Write(p.clone(), e))?;
        std::fs::write(&p, &full[..full.len() / 2]).map_err(|e| Error::Write(p.clone(), e))?;
        let err = Trace::read_path(&p).expect_err("truncated gzip accepted");
        assert!(
            matches!(
                err,
                Error::Truncated { .. } | Error::Read { .. } | Error::ShortHeader(_)
            ),
            "{err}"
        );
        let bad = dir.join("missing-dir").join("x.vmt");
        assert!(sample().write_path(&bad).is_err());
        assert!(!dir.join("missing-dir").exists());
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
