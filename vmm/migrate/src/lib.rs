//! Migrators that move a process's pages between NUMA nodes.
//!
//! - [`move_pages`]: batched `move_pages(2)`, works on any kernel and any mapping that can
//!   migrate (anonymous, shared, file, THP kept whole).

pub mod move_pages;

pub use move_pages::{query_nodes, MovePages, NodeQuery, Residency};
