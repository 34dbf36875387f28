//! vmtier hotness sources and the hotness store.
//!
//! - [`damon`]: DAMON `fvaddr` through sysfs on the VMM process, restricted to guest RAM.
//! - [`softdirty`]: soft-dirty write tracking (`PAGEMAP_SCAN` or pagemap reads) where DAMON
//!   vaddr is missing.
//! - [`probe`]: which source works here; [`probe::select`] attaches the best one and says
//!   why in one log line.
//! - [`store`]: per-granule [`vmtier_core::policy::HeatRecord`]s built from the sources'
//!   reports, one byte per granule (≤ 1 byte per 4 KiB page).

pub mod damon;
pub mod probe;
pub mod softdirty;
pub mod store;

pub use damon::{DamonConfig, DamonSource};
pub use probe::{select, Choice, SelectOptions, Selection, SourceKind};
pub use softdirty::SoftDirtySource;
pub use store::{HotnessStore, PlanBudget, StoreConfig};
