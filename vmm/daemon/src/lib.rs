//! vmtierd: manages the placement of VMs' memory between a DRAM node and a CXL node.
//!
//! - [`config`]: the TOML configuration.
//! - [`engine`]: the tick loop — sources → hotness store → policy → migrator.
//! - [`proto`]: the control API's requests and replies (shared with vmtierctl).
//! - [`server`]: the unix-socket server that hands requests to the engine between ticks.
//! - `libvirt` (feature `libvirt`): follows a libvirt connection's domains.
//! - [`hints`]: the guest hint channel and the trust placed in it.
//! - [`parts`]: builds a VM's backend, hotness source and policy from its configuration.

pub mod config;
pub mod engine;
pub mod hints;
#[cfg(feature = "libvirt")]
pub mod libvirt;
pub mod parts;
pub mod proto;
pub mod server;
