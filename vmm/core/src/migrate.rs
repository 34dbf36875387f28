//! The [`Migrator`] trait: moves pages of a process to a NUMA node and says what happened to
//! each one.

use std::time::Duration;

use crate::addr::{HostVirtAddr, NodeId, PageSize, ProcessId};
use crate::layout::GuestMemoryLayout;

/// Why a whole migration request failed (per-page problems are [`PageOutcome`]s instead).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The target process no longer exists.
    #[error("Process {0} is gone")]
    ProcessGone(ProcessId),
    /// The caller may not move the target's pages.
    #[error("Not permitted to move pages of process {0}")]
    PermissionDenied(ProcessId),
    /// The destination node does not exist, has no memory or is not allowed.
    #[error("Node {0} cannot take pages")]
    NodeUnavailable(NodeId),
    /// The request itself is malformed.
    #[error("Invalid migration request: {0}")]
    InvalidRequest(String),
    /// Any other system error.
    #[error("Migration failed")]
    Io(#[source] std::io::Error),
}

/// A page to move: its address in the target process and how it is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRef {
    /// Address of the page (aligned to `size`).
    pub addr: HostVirtAddr,
    /// Mapping size; a huge page is moved whole.
    pub size: PageSize,
}

/// What happened to one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageOutcome {
    /// Now on the destination node (moved, or already there).
    OnTarget,
    /// Not populated (never touched, or the zero page): nothing to move.
    NotPresent,
    /// Busy or pinned (elevated refcount, locked): try again on a later tick.
    Busy,
    /// The destination node had no free memory.
    NoMemory,
    /// The address is not mapped, or the mapping cannot migrate.
    Fault,
    /// Any other errno.
    Other(i32),
}

/// The result of one [`Migrator::migrate`] call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// One outcome per requested page, in request order.
    pub outcomes: Vec<PageOutcome>,
    /// Bytes now on the target node that were elsewhere before the call, when known;
    /// otherwise bytes of pages reported [`PageOutcome::OnTarget`].
    pub bytes_on_target: u64,
    /// Wall time spent.
    pub elapsed: Duration,
    /// Pages the preferred path (the kernel module) was meant to move but handed to the
    /// fallback (move_pages(2)): parts it skips (huge pages, busy runs) and everything after
    /// a module error.
    pub fallback_pages: u64,
    /// Why the preferred path failed as a whole in this call, if it did (its pages then
    /// all went through the fallback); `None` when it worked or was not used.
    pub fallback_error: Option<String>,
}

impl MigrationReport {
    /// Number of pages with the given outcome.
    pub fn count(&self, outcome: PageOutcome) -> usize {
        self.outcomes.iter().filter(|&&o| o == outcome).count()
    }
}

/// Where a page is, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageLocation {
    /// Resident on this node.
    On(NodeId),
    /// Not populated.
    NotPresent,
    /// Unknown (unmapped, or an error for this page).
    Unknown,
}

/// Finds which node pages are on (move_pages(2) without target nodes on Linux).
pub trait PageLocator: Send {
    /// Locates `addrs` of `pid`, one result per address, appended to `out`.
    fn locate(
        &mut self,
        pid: ProcessId,
        addrs: &[HostVirtAddr],
        out: &mut Vec<PageLocation>,
    ) -> Result<(), Error>;

    /// Appends the runs of `ranges` (`(start, len)`, in ascending order) of `pid` that
    /// PMD-mapped huge pages map (a transparent huge page or hugetlb page under one
    /// page-table entry: a move of any of its base pages moves all of them) to `out`, as
    /// `(start, len)`, in the order of `ranges`. One call for all of a tick's ranges, so a
    /// locator opens what it reads once. `Ok(false)`: this locator cannot tell (then
    /// nothing is appended).
    fn huge_runs(
        &mut self,
        pid: ProcessId,
        ranges: &[(HostVirtAddr, u64)],
        out: &mut Vec<(HostVirtAddr, u64)>,
    ) -> Result<bool, Error> {
        let _ = (pid, ranges, out);
        Ok(false)
    }
}

/// Moves pages of a process between NUMA nodes.
pub trait Migrator: Send {
    /// Short name for logs and metrics (`move_pages`, `kmod`).
    fn name(&self) -> &'static str;

    /// Moves `pages` of `pid` to `target`. Per-page failures are reported in the outcomes;
    /// `Err` means nothing more can be done for this process or node right now, and the
    /// caller must not retry in a tight loop.
    fn migrate(
        &mut self,
        pid: ProcessId,
        pages: &[PageRef],
        target: NodeId,
    ) -> Result<MigrationReport, Error>;

    /// Learns the layout of a process it will move pages of (which ranges are private
    /// anonymous, shared or file-backed), for migrators that choose a path per range.
    fn add_layout(&mut self, _layout: &GuestMemoryLayout) {}

    /// Forgets a process's layout.
    fn remove_layout(&mut self, _pid: ProcessId) {}
}
