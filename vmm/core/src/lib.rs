//! vmtier core: the vocabulary every other crate speaks.
//!
//! - [`addr`]: one newtype per address space and identifier (guest physical, host virtual,
//!   NUMA node, VM, process), sizes with units.
//! - [`layout`]: where a guest's RAM lives in the VMM process.
//! - [`migrate`]: the [`migrate::Migrator`] trait and per-page outcomes.
//! - [`policy`]: the pure [`policy::PlacementPolicy`] trait and its input/plan types.

pub mod addr;
pub mod layout;
pub mod migrate;
pub mod policy;

pub use addr::{ByteSize, GuestPhysAddr, HostVirtAddr, NodeId, PageSize, ProcessId, VmId};
pub use layout::{Backing, GuestMemoryLayout, GuestRamRange};
