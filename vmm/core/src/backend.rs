//! The [`VmBackend`] trait: how the engine learns where a guest's RAM is.

use crate::layout::GuestMemoryLayout;

/// Why a backend could not describe its VM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VM (or its VMM process) is gone: stop managing it.
    #[error("VM is gone")]
    Gone(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The VMM answered but the answer made no sense, or a transient failure: try later.
    #[error("VM layout unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// A VM whose memory vmtier manages, as its VMM exposes it.
pub trait VmBackend: Send {
    /// Human-readable description for logs (`qemu pid 1234 via /run/vm.qmp`).
    fn describe(&self) -> String;

    /// The current guest RAM layout. Called at attach and when the engine suspects a change
    /// (memory hotplug, a failed migration on unmapped addresses).
    fn layout(&mut self) -> Result<GuestMemoryLayout, Error>;

    /// Whether the process that holds this VM's memory is still the one attached:
    /// `Some(true)` while it runs; `Some(false)` once it has exited, even if its pid now
    /// names an unrelated process; `None` when the backend cannot tell (it holds no pidfd:
    /// a kernel before 5.3, a seccomp filter, or a fake).
    ///
    /// The contract: the engine calls this right before every operation that names the
    /// process by its pid — [`crate::migrate::Migrator::migrate`],
    /// [`crate::migrate::PageLocator::locate`], [`crate::HotnessSource::collect`] — and on
    /// `Some(false)` does not perform it: it treats the VM as gone, as for
    /// [`Error::Gone`]. `None` means unknown: the engine goes on as it would without
    /// pidfds. The call is cheap (one `poll(2)` with a zero timeout) and never blocks.
    ///
    /// A pidfd does not keep the number from being reused once the exited process is
    /// reaped; checking right before each call leaves a window of one system call, against
    /// a pid allocator that has to wrap around `pid_max` to hit the same number.
    fn process_alive(&self) -> Option<bool> {
        None
    }
}
