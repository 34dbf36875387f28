//! Synthetic trace generators: zipf, moving hot set, phase changes, scan + hot set, and
//! GUPS-like uniform random updates. Each is deterministic for a given seed and marks every
//! shift of its hot set with a [`crate::trace::Marker`] (the simulator measures reaction
//! time from them).

use serde::{Deserialize, Serialize};

use crate::rng::Rng;
use crate::trace::Trace;

/// Errors building a generator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A parameter is out of range.
    #[error("Invalid generator parameter: {0}")]
    Param(&'static str),
    /// The generator name is unknown.
    #[error("Unknown generator {0} (try zipf, moving-hot, phases, scan-hot, gups)")]
    Unknown(String),
}

/// Which access pattern to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Zipf-distributed page popularity, hot pages scattered in 64 KiB blocks.
    Zipf,
    /// A contiguous hot set that jumps to a new place `phases` times.
    MovingHot,
    /// Zipf whose popularity order is reshuffled `phases` times.
    Phases,
    /// A hot set plus a sequential scan over all memory (touch-once traffic).
    ScanHot,
    /// GUPS-like: random read-modify-write over a table, a small part of it hot.
    Gups,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 5] = [
        Kind::Zipf,
        Kind::MovingHot,
        Kind::Phases,
        Kind::ScanHot,
        Kind::Gups,
    ];

    /// The kebab-case name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Zipf => "zipf",
            Kind::MovingHot => "moving-hot",
            Kind::Phases => "phases",
            Kind::ScanHot => "scan-hot",
            Kind::Gups => "gups",
        }
    }

    /// Parses a kebab-case name.
    pub fn parse(s: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| Error::Unknown(s.to_owned()))
    }
}

/// Generator parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Spec {
    /// Pattern.
    pub kind: Kind,
    /// Address space in 4 KiB pages.
    pub pages: u32,
    /// Number of accesses.
    pub accesses: u64,
    /// Seed.
    pub seed: u64,
    /// Zipf exponent.
    pub alpha: f64,
    /// Hot-set size as a fraction of the address space (moving-hot, scan-hot, gups).
    pub hot_fraction: f64,
    /// Share of accesses that go to the hot set.
    pub hot_share: f64,
    /// Number of hot-set shifts (moving-hot, phases).
    pub phases: u32,
}

impl Default for Spec {
    fn default() -> Self {
        Self {
            kind: Kind::Zipf,
            pages: 1 << 14,
            accesses: 2_000_000,
            seed: 1,
            alpha: 0.99,
            hot_fraction: 0.1,
            hot_share: 0.9,
            phases: 4,
        }
    }
}

/// Draws ranks from a zipf distribution over `n` items.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u32, alpha: f64) -> Self {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0;
        for r in 0..n {
            sum += 1.0 / f64::from(r + 1).powf(alpha);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Self { cdf }
    }

    fn draw(&self, rng: &mut Rng) -> u32 {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u32
    }
}

/// Maps popularity ranks to pages: 16-page blocks in random order, pages in order inside.
fn block_permutation(pages: u32, rng: &mut Rng) -> Vec<u32> {
    let blocks = pages.div_ceil(16);
    let mut order: Vec<u32> = (0..blocks).collect();
    rng.shuffle(&mut order);
    let mut map = Vec::with_capacity(pages as usize);
    for b in order {
        for p in b * 16..(b * 16 + 16).min(pages) {
            map.push(p);
        }
    }
    map
}

/// Generates a trace of 4 KiB pages.
pub fn generate(spec: &Spec) -> Result<Trace, Error> {
    if spec.pages < 64 {
        return Err(Error::Param("pages must be at least 64"));
    }
    if !(0.0..=1.0).contains(&spec.hot_fraction) || !(0.0..=1.0).contains(&spec.hot_share) {
        return Err(Error::Param(
            "hot_fraction and hot_share must be within 0..=1",
        ));
    }
    if !(0.0..=4.0).contains(&spec.alpha) {
        return Err(Error::Param("alpha must be within 0..=4"));
    }
    let mut rng = Rng::new(spec.seed);
    let mut t = Trace::new(12, spec.pages);
    t.accesses.reserve(spec.accesses as usize);
    let pages = u64::from(spec.pages);
    let hot = ((spec.hot_fraction * pages as f64) as u64).clamp(1, pages);
    let phase_len = spec.accesses / u64::from(spec.phases.max(1)).saturating_add(1);
    match spec.kind {
        Kind::Zipf | Kind::Phases => {
            let z = Zipf::new(spec.pages, spec.alpha);
            let mut map = block_permutation(spec.pages, &mut rng);
            for i in 0..spec.accesses {
                if spec.kind == Kind::Phases && i > 0 && phase_len > 0 && i % phase_len == 0 {
                    map = block_permutation(spec.pages, &mut rng);
                    t.mark(i / phase_len);
                }
                let page = map[z.draw(&mut rng) as usize];
                t.push(page, rng.below(4) == 0);
            }
        }
        Kind::MovingHot => {
            let mut base = 0u64;
            for i in 0..spec.accesses {
                if i > 0 && phase_len > 0 && i % phase_len == 0 {
                    base = (base + hot + rng.below(pages)) % pages;
                    t.mark(i / phase_len);
                }
                let page = if rng.unit() < spec.hot_share {
                    (base + rng.below(hot)) % pages
                } else {
                    rng.below(pages)
                };
                t.push(page as u32, rng.below(4) == 0);
            }
        }
        Kind::ScanHot => {
            let base = rng.below(pages - hot + 1);
            let mut cursor = 0u64;
            for _ in 0..spec.accesses {
                if rng.unit() < spec.hot_share {
                    t.push((base + rng.below(hot)) as u32, rng.below(4) == 0);
                } else {
                    t.push(cursor as u32, false);
                    cursor = (cursor + 1) % pages;
                }
            }
        }
        Kind::Gups => {
            let base = rng.below(pages - hot + 1);
            let mut i = 0;
            while i < spec.accesses {
                let page = if rng.unit() < spec.hot_share {
                    base + rng.below(hot)
                } else {
                    rng.below(pages)
                };
                t.push(page as u32, false);
                t.push(page as u32, true);
                i += 2;
            }
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_generates_in_range_and_deterministically() -> Result<(), Error> {
        for kind in Kind::ALL {
            let spec = Spec {
                kind,
                pages: 4096,
                accesses: 20_000,
                ..Spec::default()
            };
            let a = generate(&spec)?;
            assert_eq!(a, generate(&spec)?, "{kind:?} not deterministic");
            assert!(a.accesses.len() >= 20_000);
            assert!(a.accesses.iter().all(|&p| p < 4096));
            let want_markers = matches!(kind, Kind::MovingHot | Kind::Phases);
            assert_eq!(!a.markers.is_empty(), want_markers, "{kind:?}");
            assert_eq!(Kind::parse(kind.name())?, kind);
        }
        Ok(())
    }

    #[test]
    fn zipf_is_skewed_and_bad_params_fail() {
        let t = generate(&Spec {
            pages: 4096,
            accesses: 50_000,
            ..Spec::default()
        })
        .expect("zipf");
        let mut counts = vec![0u32; 4096];
        for &p in &t.accesses {
            counts[p as usize] += 1;
        }
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top: u32 = counts[..410].iter().sum();
        assert!(top > 25_000, "top 10% got {top}");
        let bad = [
            Spec {
                pages: 10,
                ..Spec::default()
            },
            Spec {
                hot_share: 2.0,
                ..Spec::default()
            },
            Spec {
                alpha: -1.0,
                ..Spec::default()
            },
        ];
        for s in bad {
            assert!(generate(&s).is_err());
        }
        assert!(Kind::parse("nope").is_err());
    }
}
