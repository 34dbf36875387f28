//! The vmtier API types: what vmtierctl, the HTTP API and vmtierd exchange, with serde and
//! no daemon internals (no sources, migrators or policies), so that clients link only this
//! crate and vmtier-core's newtypes.
//!
//! - [`proto`]: the control socket's requests, replies and status types.
//! - [`vm`]: a VM's description (`[[vm]]` in the configuration, the body of `attach`).

pub mod proto;
pub mod vm;

pub use proto::{
    ApiError, DaemonMetrics, Health, Message, NodeBytes, Reply, Request, Response, TickHistogram,
    Tiering, TieringChange, VmList, VmMetrics, VmStatus, VmSummary,
};
pub use vm::{RangeConfig, VmConfig};
