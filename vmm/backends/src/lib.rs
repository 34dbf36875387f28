//! VM backends: find a guest's RAM in its VMM process.
//!
//! - [`qmp`]: a small synchronous QMP client.
//! - [`qemu`]: guest RAM of a QEMU process from `query-memdev`, `info mtree -f` and
//!   `gpa2hva`, cross-checked with `/proc/PID/maps`.
//! - [`procmaps`]: `/proc/PID/maps` parsing.

pub mod procmaps;
pub mod qemu;
pub mod qmp;
