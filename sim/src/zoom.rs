//! "Zoom" (an experiment, simulator only): a second DAMON context whose targets are only the
//! 2 MiB chunks of guest RAM whose heat the hotness store finds *mixed*, capped at a byte
//! total, so that its own `max_nr_regions` budget gives near-page resolution where the first
//! context's regions blur hot pages with cold neighbours. Its reports replace the first
//! context's over the chunks it watches (`sim::run`, `Config::zoom_bytes`).
//!
//! Which chunks ([`select`]), from the heat of their 4 KiB pages at the end of a tick:
//!
//! - a page is *partial* when its heat is between 1 and [`FULL_HEAT`] − 1: it was seen, but
//!   not in (nearly) every sample. Under a DAMON region that mixes hot and cold pages every
//!   page reads the region's mean, i.e. partial; a page alone in its region reads what it
//!   really is. A partial page is one whose heat may be blur;
//! - a chunk is *mixed* when it has a partial page, or when it has pages on both sides of
//!   `hot_min` (the heat where a 4 KiB move pays back): the policy wants part of it;
//! - the mixed chunks are ranked by their partial pages (most first; ties: the one watched
//!   longest ago first, then lower address), and taken up to the cap. Ties are the rule where
//!   the first context's regions span several chunks (a large guest: 1000 regions over
//!   64 GiB are 64 MiB each), and every chunk under one region reads the same: the zoom then
//!   sweeps them in turn instead of watching the lowest addresses for ever. With `sticky`, chunks watched in the previous tick that are
//!   still mixed come first (a chunk whose pages the zoom has already told apart reads
//!   0 and hot, no longer partial, and would otherwise leave and be blurred again).
//!
//! The chosen chunks, adjacent ones merged, are the zoom context's ranges for the next tick
//! (`DamonModel::set_ranges`, DAMON sysfs `commit` between aggregation windows).

/// 4 KiB pages per chunk (one 2 MiB huge page).
pub const CHUNK_PAGES: u32 = 512;

/// Heat from which a page counts as seen in (nearly) every sample: what a page seen in a
/// quarter of the samples tick after tick settles at (gain 12, heat 12 + 12/2 + … → 24).
pub const FULL_HEAT: u8 = 24;

/// How one chunk's pages read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkHeat {
    /// Pages with heat in `1..FULL_HEAT`.
    pub partial: u32,
    /// Pages with heat ≥ `hot_min`.
    pub hot: u32,
    /// Pages with heat < `hot_min`.
    pub cold: u32,
}

impl ChunkHeat {
    /// Counts `heats` (one chunk's pages).
    pub fn of(heats: impl IntoIterator<Item = u8>, hot_min: u8) -> Self {
        let mut c = Self::default();
        for h in heats {
            c.partial += u32::from((1..FULL_HEAT).contains(&h));
            if h >= hot_min {
                c.hot += 1;
            } else {
                c.cold += 1;
            }
        }
        c
    }

    /// Whether the zoom should look closer: a page that may be blur, or pages on both sides
    /// of `hot_min`.
    pub fn mixed(&self) -> bool {
        self.partial > 0 || (self.hot > 0 && self.cold > 0)
    }
}

/// The chunks (indices, ascending) the zoom context watches next: see the module docs.
/// `heats` holds one heat per 4 KiB page; `cap` is the most chunks; `prev` the chunks watched
/// so far (ascending); `last[chunk]` when each was last watched (larger is later; missing or
/// 0: never).
pub fn select(
    heats: &[u8],
    hot_min: u8,
    cap: usize,
    prev: &[u32],
    sticky: bool,
    last: &[u64],
) -> Vec<u32> {
    if cap == 0 {
        return Vec::new();
    }
    let mut cand: Vec<(bool, u32, u64, u32)> = heats
        .chunks(CHUNK_PAGES as usize)
        .enumerate()
        .filter_map(|(i, pages)| {
            let c = ChunkHeat::of(pages.iter().copied(), hot_min);
            let i = i as u32;
            let keep = sticky && prev.binary_search(&i).is_ok();
            let seen = last.get(i as usize).copied().unwrap_or(0);
            c.mixed().then_some((keep, c.partial, seen, i))
        })
        .collect();
    // Kept chunks first, then by partial pages, most first, then watched longest ago, then
    // by address.
    cand.sort_unstable_by(|a, b| {
        b.0.cmp(&a.0)
            .then(b.1.cmp(&a.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    let mut out: Vec<u32> = cand.iter().take(cap).map(|c| c.3).collect();
    out.sort_unstable();
    out
}

/// Page ranges of `chunks` (ascending), adjacent ones merged, clipped to `pages`.
pub fn ranges(chunks: &[u32], pages: u32) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &c in chunks {
        let s = c.saturating_mul(CHUNK_PAGES).min(pages);
        let e = s.saturating_add(CHUNK_PAGES).min(pages);
        if s >= e {
            continue;
        }
        match out.last_mut() {
            Some(l) if l.1 == s => l.1 = e,
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heats of `chunks` chunks: all 0 except `(chunk, first page, pages, heat)` runs.
    fn heats(chunks: u32, runs: &[(u32, u32, u32, u8)]) -> Vec<u8> {
        let mut h = vec![0u8; (chunks * CHUNK_PAGES) as usize];
        for &(c, p, n, v) in runs {
            let s = (c * CHUNK_PAGES + p) as usize;
            h[s..s + n as usize].fill(v);
        }
        h
    }

    #[test]
    fn chunk_heat_table() {
        // (case, pages' heats, hot_min, (partial, hot, cold), mixed)
        type Case = (&'static str, Vec<u8>, u8, (u32, u32, u32), bool);
        let cases: Vec<Case> = vec![
            ("never seen", vec![0; 8], 4, (0, 0, 8), false),
            ("seen in every sample", vec![31; 8], 4, (0, 8, 0), false),
            (
                "uniformly lukewarm: may be blur",
                vec![10; 8],
                4,
                (8, 8, 0),
                true,
            ),
            ("weak everywhere", vec![2; 8], 4, (8, 0, 8), true),
            (
                "told apart: hot and cold",
                vec![31, 31, 0, 0],
                4,
                (0, 2, 2),
                true,
            ),
            ("one partial page", vec![0, 0, 0, 23], 4, (1, 1, 3), true),
            (
                "at FULL_HEAT is not partial",
                vec![24, 24],
                4,
                (0, 2, 0),
                false,
            ),
        ];
        for (name, h, hot_min, (partial, hot, cold), mixed) in cases {
            let c = ChunkHeat::of(h, hot_min);
            assert_eq!((c.partial, c.hot, c.cold), (partial, hot, cold), "{name}");
            assert_eq!(c.mixed(), mixed, "{name}");
        }
    }

    #[test]
    fn select_table() {
        // Chunk 0: cold. 1: 100 partial pages. 2: 10 partial pages. 3: 50 pages at 31 among
        // cold (told apart, not partial). 4: all at 31. 5: 300 partial pages.
        let h = heats(
            6,
            &[
                (1, 0, 100, 8),
                (2, 7, 10, 3),
                (3, 0, 50, 31),
                (4, 0, 512, 31),
                (5, 12, 300, 12),
            ],
        );
        // (case, cap, prev, sticky, chosen)
        type Case = (&'static str, usize, Vec<u32>, bool, Vec<u32>);
        let cases: Vec<Case> = vec![
            ("off", 0, vec![], false, vec![]),
            ("most partial pages first", 1, vec![], false, vec![5]),
            ("then fewer", 2, vec![], false, vec![1, 5]),
            (
                "told-apart chunks rank last",
                4,
                vec![],
                false,
                vec![1, 2, 3, 5],
            ),
            ("uniform chunks never", 6, vec![], false, vec![1, 2, 3, 5]),
            (
                "sticky: a watched chunk still mixed stays",
                2,
                vec![3],
                true,
                vec![3, 5],
            ),
            (
                "sticky: a watched uniform chunk leaves",
                2,
                vec![4],
                true,
                vec![1, 5],
            ),
            ("not sticky: ranked afresh", 2, vec![3], false, vec![1, 5]),
        ];
        for (name, cap, prev, sticky, want) in cases {
            assert_eq!(select(&h, 4, cap, &prev, sticky, &[]), want, "{name}");
        }
        // Four chunks that read the same (one coarse region over them): the ones watched
        // longest ago go first, so the zoom sweeps them.
        let same = vec![9u8; 4 * CHUNK_PAGES as usize];
        // (last watched per chunk, chosen with a cap of 2)
        let sweep: Vec<(Vec<u64>, Vec<u32>)> = vec![
            (vec![], vec![0, 1]),
            (vec![1, 1, 0, 0], vec![2, 3]),
            (vec![1, 1, 2, 2], vec![0, 1]),
            (vec![3, 1, 2, 4], vec![1, 2]),
        ];
        for (last, want) in sweep {
            assert_eq!(select(&same, 4, 2, &[], false, &last), want, "{last:?}");
        }
    }

    #[test]
    fn ranges_table() {
        // (case, chunks, pages, ranges)
        type Case = (&'static str, Vec<u32>, u32, Vec<(u32, u32)>);
        let cases: Vec<Case> = vec![
            ("none", vec![], 2048, vec![]),
            ("one", vec![1], 2048, vec![(512, 1024)]),
            (
                "adjacent merge",
                vec![0, 1, 3],
                2048,
                vec![(0, 1024), (1536, 2048)],
            ),
            ("last chunk partial", vec![3], 1600, vec![(1536, 1600)]),
            ("beyond the end", vec![4], 1600, vec![]),
        ];
        for (name, chunks, pages, want) in cases {
            assert_eq!(ranges(&chunks, pages), want, "{name}");
        }
    }
}
