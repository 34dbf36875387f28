//! vmtier core: the vocabulary every other crate speaks.
//!
//! - [`addr`]: one newtype per address space and identifier (guest physical, host virtual,
//!   NUMA node, VM, process), sizes with units.
//! - [`layout`]: where a guest's RAM lives in the VMM process.
//! - [`backend`]: the [`backend::VmBackend`] trait that reports it.
//! - [`hotness`]: the [`hotness::HotnessSource`] trait and what it reports.
//! - [`hybrid`]: the rules of hybrid 2 MiB / 4 KiB tracking (split mixed regions, merge
//!   uniform ones, the policy's budget in regions).
//! - [`migrate`]: the [`migrate::Migrator`] trait and per-page outcomes.
//! - [`policy`]: the pure [`policy::PlacementPolicy`] trait and its input/plan types.
//! - [`process`]: [`process::Pidfd`], a managed process that cannot be confused with a
//!   later one reusing its pid.

pub mod addr;
pub mod backend;
pub mod hotness;
pub mod hybrid;
pub mod layout;
pub mod migrate;
pub mod pagemap;
pub mod policy;
pub mod process;

pub use addr::{
    ByteSize, GranuleSize, GuestPhysAddr, HostVirtAddr, NodeId, PageSize, ProcessId, VmId,
};
pub use backend::VmBackend;
pub use hotness::{HotnessSource, RegionAccess};
pub use layout::{Backing, GuestMemoryLayout, GuestRamRange};

/// An error and its sources on one line (`Cannot attach web1: QMP failed: Connection refused`),
/// for logs and API replies.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
