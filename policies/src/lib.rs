//! vmtier placement policies, all pure ([`vmtier_core::policy::PlacementPolicy`]):
//! [`default`] (what `vmtierd` runs), and baselines rebuilt from their published
//! descriptions: [`numab`], [`tpp`], [`memtis`], [`damos`], [`heat_classes`] (memtierd),
//! [`first_touch`]. [`registry::REGISTRY`] maps names to constructors. [`select`] is the
//! shared bucketed planning machinery.
//!
//! The trace simulator that evaluates them, the oracle and the trace tools live in the
//! `vmtier-sim` crate (`sim/`), so the daemon links the policies and nothing else.

// Granule indices, heats and counters are converted between integer widths in many hot loops;
// every such value is bounded by construction (a trace's page numbers are checked to fit u32
// when it is read, heats fit 5 bits, bucket numbers 0..32), so narrowing casts are allowed here
// instead of a `try_from` per access.
#![allow(clippy::cast_possible_truncation)]

pub mod damos;
pub mod default;
pub mod first_touch;
pub mod heat_classes;
pub mod memtis;
pub mod numab;
pub mod payback;
pub mod registry;
pub mod select;
pub mod tpp;
