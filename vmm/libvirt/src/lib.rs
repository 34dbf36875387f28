//! vmtier and libvirt.
//!
//! - [`metadata`]: the `<vmtier:tiering>` element of a domain's `<metadata>`.
//! - [`conn`]: a connection to libvirtd: running domains, their metadata, lifecycle and
//!   metadata-change events.
//! - [`backend`]: a domain's guest RAM, found through libvirt's QEMU monitor API and checked
//!   against its QEMU's `/proc/PID/maps` (the QMP backend's code).

pub mod backend;
pub mod conn;
pub mod metadata;

/// The libvirt binding in use (its `Connect` is shared with backends).
pub use virt;
