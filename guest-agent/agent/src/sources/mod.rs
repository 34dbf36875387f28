//! Hint sources inside the guest, each optional and probed.

pub mod damon;
pub mod free;
pub mod pmu;
pub mod process;
