//! vmtier's trace-driven simulator `vmtier-sim`, beside the pure policies it evaluates
//! (`vmtier-policies`).
//!
//! - Traces: [`trace`] (the format, `docs/trace-format.md`), [`gen`] (synthetic generators),
//!   [`lackey`] (reducing valgrind lackey output of real programs).
//! - [`sim`]: replays a trace, models the tracking sources and the cost of each tier and of
//!   migration, runs a policy every tick and measures it; [`oracle`] plans with the future.
//! - [`report`] runs the suite and writes JSON and SVG; [`scale`] measures planning at 1 TiB.

// Granule indices, heats and counters are converted between integer widths in many hot loops;
// every such value is bounded by construction (a trace's page numbers are checked to fit u32
// when it is read, heats fit 5 bits, bucket numbers 0..32), so narrowing casts are allowed here
// instead of a `try_from` per access.
#![allow(clippy::cast_possible_truncation)]

pub mod damon;
pub mod gen;
pub mod lackey;
pub mod oracle;
pub mod report;
pub mod rng;
pub mod scale;
pub mod sim;
pub mod trace;
pub mod zoom;
