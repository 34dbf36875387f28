//! The vmtier API types: what vmtierctl, the HTTP API and vmtierd exchange, with serde and
//! no daemon internals (no sources, migrators or policies), so that clients link only this
//! crate and vmtier-core's newtypes.
//!
//! - [`proto`]: the control socket's requests, replies and status types.
//! - [`hints`]: the guest hint channel's configuration and status.
//! - [`pin`]: pinned guest-physical ranges.
//! - [`vm`]: a VM's description (`[[vm]]` in the configuration, the body of `attach`).
//! - [`heatmap`]: a VM's recent ticks over its guest-physical address space.

pub mod heatmap;
pub mod hints;
pub mod pin;
pub mod proto;
pub mod vm;

pub use heatmap::Heatmap;
pub use pin::{Pin, PinTier};
pub use proto::{
    ApiError, DaemonMetrics, Health, Message, NodeBytes, Reply, Request, Response, TickHistogram,
    Tiering, TieringChange, VmList, VmMetrics, VmStatus, VmSummary,
};
pub use vm::{RangeConfig, VmConfig};

/// Optional fields that may be left out but not given as `null` (which would otherwise mean
/// the same as leaving them out, and so let a typo'd client believe it set something).
pub(crate) fn no_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}
