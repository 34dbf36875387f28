//! vmtier placement policies and the trace-driven simulator `vmtier-sim`.
//!
//! - Policies, all pure ([`vmtier_core::policy::PlacementPolicy`]): [`default`] (what
//!   `vmtierd` runs), and baselines rebuilt from their published descriptions: [`numab`],
//!   [`tpp`], [`memtis`], [`damos`], [`heat_classes`] (memtierd), [`first_touch`]; plus the
//!   offline [`oracle`]. [`registry::REGISTRY`] maps names to constructors.
//! - Traces: [`trace`] (the format, `docs/trace-format.md`), [`gen`] (synthetic generators),
//!   [`lackey`] (reducing valgrind lackey output of real programs).
//! - [`sim`]: replays a trace, models the tracking sources and the cost of each tier and of
//!   migration, runs a policy every tick and measures it. [`report`] runs the suite and writes
//!   JSON and SVG.

// Granule indices, heats and counters are converted between integer widths in many hot loops;
// every such value is bounded by construction (a trace's page numbers are checked to fit u32
// when it is read, heats fit 5 bits, bucket numbers 0..32), so narrowing casts are allowed here
// instead of a `try_from` per access.
#![allow(clippy::cast_possible_truncation)]

pub mod damos;
pub mod default;
pub mod first_touch;
pub mod gen;
pub mod heat_classes;
pub mod lackey;
pub mod memtis;
pub mod numab;
pub mod oracle;
pub mod registry;
pub mod report;
pub mod rng;
pub mod scale;
pub mod select;
pub mod sim;
pub mod tpp;
pub mod trace;
