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

/// How often a host virtual range was found accessed during one tick.
///
/// Sources report their native counts, unscaled: DAMON the samples of all its aggregation
/// windows in the tick that found the range accessed (`nr_accesses` summed) out of the
/// samples taken; soft-dirty one sample per tick, written or not. The store turns them into
/// heat with [`crate::policy::HeatRecord::heat_gain`], the one rounding step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionAccess {
    /// First byte of the range (page aligned).
    pub start: HostVirtAddr,
    /// Length in bytes (page multiple).
    pub len: u64,
    /// Access checks that found the range accessed (≤ `samples`).
    pub hits: u32,
    /// Access checks made on the range during the tick (0: no information).
    pub samples: u32,
}

impl RegionAccess {
    /// One past the last byte, if it does not overflow.
    pub fn end(&self) -> Option<HostVirtAddr> {
        self.start.checked_add(self.len)
    }
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
