//! vmtierd: manages the placement of VMs' memory between a DRAM node and a CXL node.
//!
//! - [`config`]: the TOML configuration.
//! - [`engine`]: the tick loop — sources → hotness store → policy → migrator.
//! - [`proto`]: the control API's requests and replies, from the vmtier-api crate (shared
//!   with vmtierctl and the HTTP API).
//! - [`server`]: the unix-socket server that hands requests to the engine between ticks.
//! - `libvirt` (feature `libvirt`): follows a libvirt connection's domains.
//! - [`hints`]: the guest hint channel and the trust placed in it.
//! - [`http`]: the HTTP API (axum), which hands requests to the engine the same way.
//! - [`metrics`]: `/metrics`, the engine's counters in the Prometheus text format.
//! - [`parts`]: builds a VM's backend, hotness source and policy from its configuration.
//! - [`ring`]: the tick ring behind `heatmap`: recent ticks downsampled over guest RAM.

pub mod config;
pub mod engine;
pub mod hints;
pub mod http;
#[cfg(feature = "libvirt")]
pub mod libvirt;
pub mod metrics;
pub mod parts;
pub mod ring;
pub mod server;

pub use vmtier_api::proto;
