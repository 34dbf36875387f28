//! VM backends: find a guest's RAM in its VMM process.
//!
//! - [`qmp`]: a small synchronous QMP client.
//! - [`qemu`]: guest RAM of a QEMU process from `query-memdev`, `info mtree -f` and
//!   `gpa2hva`, cross-checked with `/proc/PID/maps`.
//! - [`pid`]: any process, with configured ranges standing for guest RAM.
//! - [`procmaps`]: `/proc/PID/maps` parsing.

pub mod pid;
pub mod procmaps;
pub mod qemu;
pub mod qmp;
