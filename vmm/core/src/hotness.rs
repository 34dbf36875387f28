//! The [`HotnessSource`] trait: something that observes which parts of a VMM process's
//! memory the guest accesses (DAMON, soft-dirty write tracking, CPU samples, guest hints).

use crate::addr::HostVirtAddr;
use crate::layout::GuestMemoryLayout;

/// Why a source cannot (or can no longer) observe.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The mechanism is missing on this host (kernel config, permissions, hardware): the
    /// engine falls back to another source and says so.
    #[error("Source unavailable: {0}")]
    Unavailable(String),
    /// The monitored process is gone.
    #[error("Monitored process is gone")]
    Gone,
    /// Any other failure; the engine retries on a later tick.
    #[error("Source failed")]
    Io(#[source] std::io::Error),
}

/// How often a host virtual range was accessed during one observation window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionAccess {
    /// First byte of the range (page aligned).
    pub start: HostVirtAddr,
    /// Length in bytes (page multiple).
    pub len: u64,
    /// Access frequency in the window: 0 = never seen accessed, 255 = accessed in every
    /// sample. Sources scale their native unit (DAMON `nr_accesses / max_nr_accesses`,
    /// soft-dirty's written-or-not) to this range.
    pub freq: u8,
}

/// Observes a VM's memory accesses from the host.
pub trait HotnessSource: Send {
    /// Short name for logs and metrics (`damon-vaddr`, `soft-dirty`).
    fn name(&self) -> &'static str;

    /// Starts observing the RAM ranges of `layout`. Called again with a new layout after a
    /// change; a source then restarts its monitoring.
    fn attach(&mut self, layout: &GuestMemoryLayout) -> Result<(), Error>;

    /// Appends what was observed since the previous call (or since attach) to `out`.
    /// Ranges not reported carry no information for this window.
    fn collect(&mut self, out: &mut Vec<RegionAccess>) -> Result<(), Error>;

    /// Stops observing and releases kernel resources (kdamonds, fds).
    fn detach(&mut self);
}
