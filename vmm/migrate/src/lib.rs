//! Migrators that move a process's pages between NUMA nodes.
//!
//! - [`move_pages`]: batched `move_pages(2)`, works on any kernel and any mapping that can
//!   migrate (anonymous, shared, file, THP kept whole).
//! - [`kmod`]: the vmtier kernel module (`/dev/vmtier`): batched unmap, parallel CPU or DMA
//!   copy, batched remap, for private anonymous 4 KiB-mapped memory; and [`Combined`],
//!   which picks the module or `move_pages(2)` per range. [`uapi`] mirrors its ABI.

pub mod kmod;
pub mod move_pages;
pub mod uapi;

pub use kmod::{Combined, CopyEngine, Kmod, KmodConfig};
pub use move_pages::{query_nodes, MovePages, NodeQuery, Residency};
