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
}
