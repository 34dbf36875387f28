//! The engine: owns the tick, as DAMON's kdamond owns its loop.
//!
//! Each tick, for every managed VM: the hotness source's reports go into the hotness store →
//! the policy plans from the store's records → the plan is trimmed to the VM's DRAM budget
//! and the daemon's migration rate limit → the migrator moves the pages (demotions first, so
//! DRAM use never exceeds the budget) → the store and the metrics learn what happened. Every
//! `refresh_ticks` the real placement of every page is re-read, since the kernel (reclaim,
//! demotion, NUMA balancing) may move pages too.
//!
//! Requests from the control API reach the engine between ticks ([`Engine::handle`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use vmtier_core::backend::{Error as BackendError, VmBackend};
use vmtier_core::hotness::{Error as SourceError, HotnessSource};
use vmtier_core::migrate::{
    Error as MigrateError, Migrator, PageLocation, PageLocator, PageOutcome, PageRef,
};
use vmtier_core::policy::{Granule, PlacementPolicy, PolicyInput, Tier};
use vmtier_core::{
    error_chain as err_chain, ByteSize, GuestMemoryLayout, HostVirtAddr, NodeId, PageSize,
    RegionAccess, VmId,
};
use vmtier_sources::store::{HotnessStore, StoreConfig, HISTOGRAM_BUCKETS};

use crate::proto::{NodeBytes, Reply, Request, Response, VmMetrics, VmStatus, VmSummary};

/// Error of an engine operation (an API request or an attach).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No such VM.
    #[error("No VM named {0}")]
    NoSuchVm(VmId),
    /// Already managed.
    #[error("VM {0} is already managed")]
    Exists(VmId),
    /// The budget cannot be honoured.
    #[error("Budget {budget} for {vm} exceeds the DRAM node's {node_bytes}")]
    BudgetTooLarge {
        /// The VM.
        vm: VmId,
        /// Requested.
        budget: ByteSize,
        /// Capacity of the fast node.
        node_bytes: ByteSize,
    },
    /// The VM's layout could not be read.
    #[error("Cannot read the memory layout of {0}")]
    Backend(VmId, #[source] BackendError),
    /// No hotness source could start.
    #[error("Cannot observe {0}: {1}")]
    Source(VmId, String),
    /// The store could not be built.
    #[error("Cannot track {0}")]
    Store(VmId, #[source] vmtier_sources::store::Error),
    /// Building the VM's parts failed.
    #[error("Cannot attach {0}: {1}")]
    Attach(VmId, String),
}

/// Settings the engine needs from `[daemon]`.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tick length.
    pub interval: Duration,
    /// DRAM node.
    pub fast_node: NodeId,
    /// CXL node.
    pub slow_node: NodeId,
    /// Migration rate limit over all VMs, bytes per second.
    pub rate_limit_bytes_per_s: u64,
    /// Placement granule.
    pub granule_bytes: u64,
    /// Re-read the real placement every this many ticks.
    pub refresh_ticks: u64,
    /// Capacity of the fast node, bytes (budgets above it are refused); `None` = unknown.
    pub fast_node_bytes: Option<u64>,
}

/// Chooses and attaches a hotness source once the layout is known; returns it with the
/// log line saying which source and why.
pub type SourceFactory =
    Box<dyn FnOnce(&GuestMemoryLayout) -> Result<(Box<dyn HotnessSource>, String), String> + Send>;

/// The parts of one VM, built by the daemon (real) or by tests (fakes).
pub struct VmParts {
    /// Where its memory is.
    pub backend: Box<dyn VmBackend>,
    /// Who observes it.
    pub source: SourceFactory,
    /// Who decides.
    pub policy: Box<dyn PlacementPolicy>,
}

impl std::fmt::Debug for VmParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmParts")
            .field("backend", &self.backend.describe())
            .field("policy", &self.policy.name())
            .finish_non_exhaustive()
    }
}

/// A VM's parts once attached.
struct Attached {
    backend: Box<dyn VmBackend>,
    source: Box<dyn HotnessSource>,
    policy: Box<dyn PlacementPolicy>,
}

/// Whether a VM is being managed.
#[derive(Clone, Debug, PartialEq, Eq)]
enum VmState {
    Active,
    /// Still managed, with a problem worth showing.
    Degraded(String),
    /// No longer managed (process gone); kept so that `status` says why.
    Failed(String),
}

impl VmState {
    fn describe(&self) -> String {
        match self {
            VmState::Active => "active".into(),
            VmState::Degraded(r) => format!("degraded: {r}"),
            VmState::Failed(r) => format!("failed: {r}"),
        }
    }
}

struct Vm {
    parts: Attached,
    layout: GuestMemoryLayout,
    store: HotnessStore,
    budget_bytes: u64,
    state: VmState,
    metrics: VmMetrics,
    per_node: Vec<NodeBytes>,
    tick: u64,
    reports: Vec<RegionAccess>,
    /// Why the layout could not be re-read at the last refresh (the last known one is used).
    layout_error: Option<String>,
}

impl Vm {
    fn describe_state(&self) -> String {
        match (&self.state, &self.layout_error) {
            (VmState::Failed(_), _) | (_, None) => self.state.describe(),
            (VmState::Active, Some(l)) => format!("degraded: {l}"),
            (VmState::Degraded(r), Some(l)) => format!("degraded: {r}; {l}"),
        }
    }
}

/// The engine.
pub struct Engine {
    cfg: EngineConfig,
    vms: BTreeMap<VmId, Vm>,
    migrator: Box<dyn Migrator>,
    locator: Box<dyn PageLocator>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("cfg", &self.cfg)
            .field("vms", &self.vms.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Engine {
    /// An engine with no VMs.
    pub fn new(
        cfg: EngineConfig,
        migrator: Box<dyn Migrator>,
        locator: Box<dyn PageLocator>,
    ) -> Self {
        Self {
            cfg,
            vms: BTreeMap::new(),
            migrator,
            locator,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    fn check_budget(&self, vm: &VmId, budget: ByteSize) -> Result<(), Error> {
        match self.cfg.fast_node_bytes {
            Some(cap) if budget.0 > cap => Err(Error::BudgetTooLarge {
                vm: vm.clone(),
                budget,
                node_bytes: ByteSize(cap),
            }),
            _ => Ok(()),
        }
    }

    /// Starts managing a VM: reads its layout, starts its source, learns where its pages are.
    pub fn attach(
        &mut self,
        name: VmId,
        budget: ByteSize,
        parts: VmParts,
    ) -> Result<String, Error> {
        if self.vms.contains_key(&name) {
            return Err(Error::Exists(name));
        }
        self.check_budget(&name, budget)?;
        let VmParts {
            mut backend,
            source,
            policy,
        } = parts;
        let layout = backend
            .layout()
            .map_err(|e| Error::Backend(name.clone(), e))?;
        let store = HotnessStore::new(
            &layout,
            StoreConfig {
                granule_bytes: self.cfg.granule_bytes,
            },
        )
        .map_err(|e| Error::Store(name.clone(), e))?;
        let (source, reason) = source(&layout).map_err(|e| Error::Source(name.clone(), e))?;
        info!(
            "{name}: attached {} ({} guest RAM in {} ranges), budget {budget}, {reason}, policy {}",
            backend.describe(),
            ByteSize(layout.total_bytes()),
            layout.ranges.len(),
            policy.name()
        );
        let parts = Attached {
            backend,
            source,
            policy,
        };
        let mut vm = Vm {
            parts,
            layout,
            store,
            budget_bytes: budget.0,
            state: VmState::Active,
            metrics: VmMetrics::default(),
            per_node: Vec::new(),
            tick: 0,
            reports: Vec::new(),
            layout_error: None,
        };
        self.migrator.add_layout(&vm.layout);
        if let Err(e) = refresh_placement(&self.cfg, self.locator.as_mut(), &mut vm) {
            vm.parts.source.detach();
            self.migrator.remove_layout(vm.layout.pid);
            return Err(Error::Attach(name, err_chain(&e)));
        }
        let msg = format!(
            "Attached {name}: {} guest RAM, budget {budget}",
            ByteSize(vm.layout.total_bytes())
        );
        self.vms.insert(name, vm);
        Ok(msg)
    }

    /// Stops managing a VM.
    pub fn detach(&mut self, name: &VmId) -> Result<String, Error> {
        let mut vm = self
            .vms
            .remove(name)
            .ok_or_else(|| Error::NoSuchVm(name.clone()))?;
        vm.parts.source.detach();
        self.migrator.remove_layout(vm.layout.pid);
        info!("{name}: detached");
        Ok(format!("Detached {name}"))
    }

    /// Changes a VM's budget; the next tick enforces it.
    pub fn set_budget(&mut self, name: &VmId, budget: ByteSize) -> Result<String, Error> {
        self.check_budget(name, budget)?;
        let vm = self
            .vms
            .get_mut(name)
            .ok_or_else(|| Error::NoSuchVm(name.clone()))?;
        info!("{name}: budget {} -> {budget}", ByteSize(vm.budget_bytes));
        vm.budget_bytes = budget.0;
        Ok(format!("Budget of {name} set to {budget}"))
    }

    /// Names of the managed VMs.
    pub fn vm_names(&self) -> Vec<VmId> {
        self.vms.keys().cloned().collect()
    }

    /// Runs one tick over every active VM.
    pub fn tick(&mut self) {
        let active = self
            .vms
            .values()
            .filter(|v| !matches!(v.state, VmState::Failed(_)))
            .count()
            .max(1) as u64;
        let tick_s = self.cfg.interval.as_secs_f64();
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let bytes_per_vm = (self.cfg.rate_limit_bytes_per_s as f64 * tick_s) as u64 / active;
        let max_moves = (bytes_per_vm / self.cfg.granule_bytes).max(1);
        for (name, vm) in &mut self.vms {
            if matches!(vm.state, VmState::Failed(_)) {
                continue;
            }
            let t = Instant::now();
            if let Err(reason) = tick_vm(
                &self.cfg,
                self.migrator.as_mut(),
                self.locator.as_mut(),
                vm,
                max_moves,
            ) {
                warn!("{name}: no longer managed: {reason}");
                vm.parts.source.detach();
                self.migrator.remove_layout(vm.layout.pid);
                vm.state = VmState::Failed(reason);
            }
            vm.metrics.last_tick_us = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
        }
    }

    /// Status of one VM.
    pub fn status(&self, name: &VmId) -> Result<VmStatus, Error> {
        let vm = self
            .vms
            .get(name)
            .ok_or_else(|| Error::NoSuchVm(name.clone()))?;
        let h = vm.store.histogram();
        let g = self.cfg.granule_bytes;
        Ok(VmStatus {
            summary: summary(name, vm),
            backend: vm.parts.backend.describe(),
            source: vm.parts.source.name().into(),
            policy: vm.parts.policy.name().into(),
            granule_bytes: g,
            per_node: vm.per_node.clone(),
            heat_histogram: (0..HISTOGRAM_BUCKETS)
                .map(|b| (h.fast[b] + h.slow[b]) * g)
                .collect(),
            metrics: vm.metrics,
        })
    }

    /// Handles one control request between ticks.
    pub fn handle(
        &mut self,
        req: Request,
        build: &mut dyn FnMut(&crate::config::VmConfig) -> Result<VmParts, String>,
    ) -> Response {
        let r = match req {
            Request::List {} => Ok(Reply::List {
                vms: self.vms.iter().map(|(n, v)| summary(n, v)).collect(),
            }),
            Request::Status { vm } => self.status(&vm).map(|s| Reply::Status(Box::new(s))),
            Request::SetBudget { vm, budget } => self
                .set_budget(&vm, budget)
                .map(|message| Reply::Done { message }),
            Request::Detach { vm } => self.detach(&vm).map(|message| Reply::Done { message }),
            Request::Attach { vm } => match vm
                .validate()
                .map_err(|e| e.to_string())
                .and_then(|()| build(&vm))
            {
                Ok(parts) => self
                    .attach(vm.name.clone(), vm.budget, parts)
                    .map(|message| Reply::Done { message }),
                Err(reason) => Err(Error::Attach(vm.name.clone(), reason)),
            },
        };
        match r {
            Ok(reply) => Response::Ok(reply),
            Err(e) => Response::Error(err_chain(&e)),
        }
    }
}

fn summary(name: &VmId, vm: &Vm) -> VmSummary {
    let t = vm.store.tier_bytes();
    VmSummary {
        name: name.clone(),
        state: vm.describe_state(),
        budget_bytes: vm.budget_bytes,
        fast_bytes: t.fast,
        slow_bytes: t.slow,
        total_bytes: vm.layout.total_bytes(),
    }
}

/// Base pages of a granule.
fn granule_pages(store: &HotnessStore, g: Granule, out: &mut Vec<PageRef>) -> usize {
    let Some(span) = store.span(g) else { return 0 };
    let page = PageSize::Base.bytes();
    let n = span.len / page;
    out.extend(
        (0..n)
            .filter_map(|i| span.hva.checked_add(i * page))
            .map(|addr| PageRef {
                addr,
                size: PageSize::Base,
            }),
    );
    usize::try_from(n).unwrap_or(0)
}

/// Re-reads where every page is; updates the store's tiers and the per-node bytes.
/// A granule counts as fast if any of its pages is on the fast node (conservative for the
/// budget). Pages are located in chunks of about [`REFRESH_CHUNK`] addresses.
fn refresh_placement(
    cfg: &EngineConfig,
    locator: &mut dyn PageLocator,
    vm: &mut Vm,
) -> Result<(), MigrateError> {
    let page = PageSize::Base.bytes();
    let mut addrs: Vec<HostVirtAddr> = Vec::with_capacity(REFRESH_CHUNK);
    let mut ends: Vec<(Granule, usize)> = Vec::new();
    let mut locs = Vec::with_capacity(REFRESH_CHUNK);
    let mut per_node: BTreeMap<NodeId, u64> = BTreeMap::new();
    let n = u32::try_from(vm.store.len()).unwrap_or(u32::MAX);
    let mut gi = 0;
    while gi < n {
        addrs.clear();
        ends.clear();
        while gi < n && addrs.len() < REFRESH_CHUNK {
            let g = Granule(gi);
            if let Some(span) = vm.store.span(g) {
                addrs.extend((0..span.len / page).filter_map(|i| span.hva.checked_add(i * page)));
                ends.push((g, addrs.len()));
            }
            gi += 1;
        }
        locs.clear();
        locator.locate(vm.layout.pid, &addrs, &mut locs)?;
        let mut at = 0;
        for &(g, end) in &ends {
            let mut fast = false;
            for l in locs.get(at..end).unwrap_or_default() {
                if let PageLocation::On(node) = l {
                    *per_node.entry(*node).or_default() += page;
                    fast |= *node == cfg.fast_node;
                }
            }
            at = end;
            vm.store
                .set_tier(g, if fast { Tier::Fast } else { Tier::Slow });
        }
    }
    vm.per_node = per_node
        .into_iter()
        .map(|(node, bytes)| NodeBytes { node, bytes })
        .collect();
    Ok(())
}

/// Addresses per locate call during a placement refresh.
const REFRESH_CHUNK: usize = 1 << 16;

/// One tick of one VM. `Err` = the VM cannot be managed any more.
fn tick_vm(
    cfg: &EngineConfig,
    migrator: &mut dyn Migrator,
    locator: &mut dyn PageLocator,
    vm: &mut Vm,
    max_moves: u64,
) -> Result<(), String> {
    vm.tick += 1;
    vm.metrics.ticks += 1;
    vm.store.tick();
    vm.reports.clear();
    match vm.parts.source.collect(&mut vm.reports) {
        Ok(()) => {
            vm.store.observe(&vm.reports);
            if matches!(vm.state, VmState::Degraded(_)) {
                vm.state = VmState::Active;
            }
        }
        Err(SourceError::Gone) => return Err("the VMM process exited".into()),
        Err(e) => vm.state = VmState::Degraded(err_chain(&e)),
    }

    let g = cfg.granule_bytes;
    let budget = vm.budget_bytes / g;
    let input = PolicyInput::from_records(vm.tick, g, vm.store.records(), budget, max_moves);
    let mut fast_used = input.fast_used();
    let plan = vm.parts.policy.plan(&input);
    if log::log_enabled!(log::Level::Debug) && !(plan.promote.is_empty() && plan.demote.is_empty())
    {
        let show = |gs: &[Granule]| -> String {
            gs.iter()
                .map(|&g| {
                    let gpa = vm.store.span(g).map_or(0, |s| s.gpa.0);
                    format!("{:#x}:{}", gpa, vm.store.records()[g.index()].heat())
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        debug!(
            "{}: tick {}: fast {fast_used}/{budget} granules; promote [{}]; demote [{}] (gpa:heat)",
            vm.parts.backend.describe(),
            vm.tick,
            show(&plan.promote),
            show(&plan.demote)
        );
    }

    // Demotions first: what the policy asks, and more if DRAM is over budget (a budget
    // lowered at runtime), coldest first.
    let mut demote: Vec<Granule> = plan.demote.clone();
    if fast_used.saturating_sub(demote.len() as u64) > budget {
        let mut planned: Vec<usize> = demote.iter().map(|g| g.index()).collect();
        planned.sort_unstable();
        let mut extra: Vec<(u8, Granule)> = vm
            .store
            .records()
            .iter()
            .enumerate()
            .filter(|(i, r)| r.is_fast() && planned.binary_search(i).is_err())
            .filter_map(|(i, r)| Some((r.heat(), Granule(u32::try_from(i).ok()?))))
            .collect();
        extra.sort_by_key(|e| e.0);
        let need = fast_used - demote.len() as u64 - budget;
        demote.extend(
            extra
                .into_iter()
                .take(usize::try_from(need).unwrap_or(usize::MAX))
                .map(|e| e.1),
        );
    }
    let over = fast_used.saturating_sub(budget);
    // Over budget, demotions ignore the rate limit: the budget is a hard limit.
    let demote_cap = max_moves.max(over);
    let demote_n = demote
        .len()
        .min(usize::try_from(demote_cap).unwrap_or(usize::MAX));
    vm.metrics.deferred_granules += (demote.len() - demote_n) as u64;
    demote.truncate(demote_n);
    let demoted = move_granules(migrator, vm, &demote, cfg.slow_node, Tier::Slow)?;
    fast_used = fast_used.saturating_sub(demoted);

    // Promotions while there is room and rate left.
    let room = budget.saturating_sub(fast_used);
    let moves_left = max_moves.saturating_sub(demote.len() as u64);
    let n = usize::try_from(room.min(moves_left))
        .unwrap_or(usize::MAX)
        .min(plan.promote.len());
    vm.metrics.deferred_granules += (plan.promote.len() - n) as u64;
    let promote: Vec<Granule> = plan.promote[..n].to_vec();
    move_granules(migrator, vm, &promote, cfg.fast_node, Tier::Fast)?;

    if cfg.refresh_ticks > 0 && vm.tick % cfg.refresh_ticks == 0 {
        recheck_layout(cfg, migrator, vm)?;
        refresh_placement(cfg, locator, vm).map_err(|e| match e {
            MigrateError::ProcessGone(_) => "the VMM process exited".to_owned(),
            e => err_chain(&e),
        })?;
    }
    let fast_bytes = vm.store.tier_bytes().fast;
    vm.metrics.max_fast_bytes = vm.metrics.max_fast_bytes.max(fast_bytes);
    Ok(())
}

/// Re-reads the VM's layout. A changed layout (memory hotplug) restarts tracking on the new
/// one; a layout that cannot be read while the VM lives (QMP closed) keeps the last one and
/// marks the VM degraded; a VM that is gone ends its management.
fn recheck_layout(
    cfg: &EngineConfig,
    migrator: &mut dyn Migrator,
    vm: &mut Vm,
) -> Result<(), String> {
    match vm.parts.backend.layout() {
        Ok(l) if l == vm.layout => {
            if vm.layout_error.take().is_some() {
                info!(
                    "{}: memory layout readable again",
                    vm.parts.backend.describe()
                );
            }
            Ok(())
        }
        Ok(l) => {
            info!(
                "{}: memory layout changed ({} -> {}); tracking restarts",
                vm.parts.backend.describe(),
                ByteSize(vm.layout.total_bytes()),
                ByteSize(l.total_bytes())
            );
            let store = HotnessStore::new(
                &l,
                StoreConfig {
                    granule_bytes: cfg.granule_bytes,
                },
            )
            .map_err(|e| err_chain(&e))?;
            vm.parts.source.attach(&l).map_err(|e| err_chain(&e))?;
            migrator.remove_layout(vm.layout.pid);
            migrator.add_layout(&l);
            vm.store = store;
            vm.layout = l;
            vm.layout_error = None;
            Ok(())
        }
        Err(BackendError::Gone(e)) => Err(format!("the VM is gone: {}", err_chain(e.as_ref()))),
        Err(BackendError::Unavailable(e)) => {
            let why = format!(
                "cannot re-read the memory layout, keeping the last one: {}",
                err_chain(e.as_ref())
            );
            if vm.layout_error.as_deref() != Some(why.as_str()) {
                warn!("{}: {why}", vm.parts.backend.describe());
            }
            vm.layout_error = Some(why);
            Ok(())
        }
    }
}

/// Moves granules to `node`; returns how many now count as on `tier`.
fn move_granules(
    migrator: &mut dyn Migrator,
    vm: &mut Vm,
    granules: &[Granule],
    node: NodeId,
    tier: Tier,
) -> Result<u64, String> {
    if granules.is_empty() {
        return Ok(0);
    }
    let mut pages = Vec::new();
    let mut counts = Vec::with_capacity(granules.len());
    for &g in granules {
        counts.push(granule_pages(&vm.store, g, &mut pages));
    }
    let report = match migrator.migrate(vm.layout.pid, &pages, node) {
        Ok(r) => r,
        Err(MigrateError::ProcessGone(_)) => return Err("the VMM process exited".into()),
        Err(e @ (MigrateError::NodeUnavailable(_) | MigrateError::PermissionDenied(_))) => {
            vm.state = VmState::Degraded(err_chain(&e));
            return Ok(0);
        }
        Err(e) => {
            vm.state = VmState::Degraded(err_chain(&e));
            return Ok(0);
        }
    };
    let mut done = 0;
    let mut at = 0;
    for (&g, &n) in granules.iter().zip(&counts) {
        let outcomes = &report.outcomes[at..at + n];
        at += n;
        let on = outcomes
            .iter()
            .filter(|o| **o == PageOutcome::OnTarget)
            .count();
        let absent = outcomes
            .iter()
            .filter(|o| **o == PageOutcome::NotPresent)
            .count();
        let busy = outcomes.iter().filter(|o| **o == PageOutcome::Busy).count();
        vm.metrics.busy_pages += busy as u64;
        vm.metrics.failed_pages += (n - on - absent - busy) as u64;
        // Promotion: any page in DRAM makes the granule count against the budget.
        // Demotion: the granule leaves DRAM only when all of its pages did.
        let moved = match tier {
            Tier::Fast => on > 0,
            Tier::Slow => on + absent == n,
        };
        if moved {
            vm.store.mark_moved(g, tier);
            done += 1;
            let bytes = vm.store.span(g).map_or(0, |s| s.len);
            match tier {
                Tier::Fast => {
                    vm.metrics.promoted_granules += 1;
                    vm.metrics.promoted_bytes += bytes;
                }
                Tier::Slow => {
                    vm.metrics.demoted_granules += 1;
                    vm.metrics.demoted_bytes += bytes;
                }
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use vmtier_core::migrate::{MigrationReport, PageOutcome};
    use vmtier_core::{Backing, GuestPhysAddr, GuestRamRange, ProcessId};

    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;
    const MIB: u64 = 1 << 20;

    /// Which node each page of the fake processes is on, by (pid, address); dead pids.
    #[derive(Default)]
    struct Pages {
        node: HashMap<(i32, u64), NodeId>,
        dead: Vec<i32>,
    }
    type World = Arc<Mutex<Pages>>;

    /// The layout it reports; `None`: "cannot read it now" (QMP closed).
    type SharedLayout = Arc<Mutex<Option<GuestMemoryLayout>>>;

    struct FakeBackend(SharedLayout);
    impl VmBackend for FakeBackend {
        fn describe(&self) -> String {
            "fake".into()
        }
        fn layout(&mut self) -> Result<GuestMemoryLayout, BackendError> {
            self.0
                .lock()
                .unwrap()
                .clone()
                .ok_or_else(|| BackendError::Unavailable("QMP connection closed".into()))
        }
    }

    /// Reports `hot` (offset, len) as accessed in every sample, the rest as idle.
    struct FakeSource {
        world: World,
        pid: i32,
        hot: Arc<Mutex<(u64, u64)>>,
        len: u64,
    }
    impl HotnessSource for FakeSource {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn attach(&mut self, _: &GuestMemoryLayout) -> Result<(), SourceError> {
            Ok(())
        }
        fn collect(&mut self, out: &mut Vec<RegionAccess>) -> Result<(), SourceError> {
            if self.world.lock().unwrap().dead.contains(&self.pid) {
                return Err(SourceError::Gone);
            }
            let (off, len) = *self.hot.lock().unwrap();
            out.push(RegionAccess {
                start: HostVirtAddr::new(BASE),
                len: self.len,
                freq: 0,
            });
            out.push(RegionAccess {
                start: HostVirtAddr::new(BASE + off),
                len,
                freq: 255,
            });
            Ok(())
        }
        fn detach(&mut self) {}
    }

    struct FakeMm(World);
    impl Migrator for FakeMm {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn migrate(
            &mut self,
            pid: ProcessId,
            pages: &[PageRef],
            target: NodeId,
        ) -> Result<MigrationReport, MigrateError> {
            let mut w = self.0.lock().unwrap();
            if w.dead.contains(&pid.raw()) {
                return Err(MigrateError::ProcessGone(pid));
            }
            let outcomes = pages
                .iter()
                .map(|p| match w.node.get_mut(&(pid.raw(), p.addr.raw())) {
                    Some(n) => {
                        *n = target;
                        PageOutcome::OnTarget
                    }
                    None => PageOutcome::Fault,
                })
                .collect();
            Ok(MigrationReport {
                outcomes,
                ..Default::default()
            })
        }
    }
    impl PageLocator for FakeMm {
        fn locate(
            &mut self,
            pid: ProcessId,
            addrs: &[HostVirtAddr],
            out: &mut Vec<PageLocation>,
        ) -> Result<(), MigrateError> {
            let w = self.0.lock().unwrap();
            if w.dead.contains(&pid.raw()) {
                return Err(MigrateError::ProcessGone(pid));
            }
            out.extend(addrs.iter().map(|a| {
                w.node
                    .get(&(pid.raw(), a.raw()))
                    .map_or(PageLocation::Unknown, |n| PageLocation::On(*n))
            }));
            Ok(())
        }
    }

    /// A world with process `pid` holding `len` bytes at BASE, all on node 1.
    fn world(len: u64) -> World {
        let w = World::default();
        add_process(&w, 7, len);
        w
    }

    fn add_process(w: &World, pid: i32, len: u64) {
        let mut g = w.lock().unwrap();
        g.node
            .extend((0..len / 4096).map(|i| ((pid, BASE + i * 4096), NodeId::new(1))));
    }

    fn dram_bytes(w: &World) -> u64 {
        w.lock()
            .unwrap()
            .node
            .iter()
            .filter(|(k, n)| k.0 == 7 && n.raw() == 0)
            .count() as u64
            * 4096
    }

    fn engine(w: &World, rate_mbps: u64) -> Engine {
        let cfg = EngineConfig {
            interval: Duration::from_secs(1),
            fast_node: NodeId::new(0),
            slow_node: NodeId::new(1),
            rate_limit_bytes_per_s: rate_mbps * 1_000_000,
            granule_bytes: 2 * MIB,
            refresh_ticks: 5,
            fast_node_bytes: Some(1 << 30),
        };
        Engine::new(
            cfg,
            Box::new(FakeMm(w.clone())),
            Box::new(FakeMm(w.clone())),
        )
    }

    fn parts(w: &World, len: u64, hot: &Arc<Mutex<(u64, u64)>>) -> VmParts {
        parts_of(w, 7, len, hot)
    }

    fn parts_of(w: &World, pid: i32, len: u64, hot: &Arc<Mutex<(u64, u64)>>) -> VmParts {
        parts_with(
            w,
            pid,
            len,
            hot,
            Arc::new(Mutex::new(Some(one_range(pid, len)))),
        )
    }

    fn one_range(pid: i32, len: u64) -> GuestMemoryLayout {
        GuestMemoryLayout::new(
            ProcessId::new(pid),
            vec![GuestRamRange {
                name: "ram".into(),
                gpa: GuestPhysAddr(0),
                hva: HostVirtAddr::new(BASE),
                len,
                backing: Backing::PrivateAnon,
            }],
        )
        .unwrap()
    }

    fn parts_with(
        w: &World,
        pid: i32,
        len: u64,
        hot: &Arc<Mutex<(u64, u64)>>,
        layout: SharedLayout,
    ) -> VmParts {
        let src = FakeSource {
            world: w.clone(),
            pid,
            hot: hot.clone(),
            len,
        };
        VmParts {
            backend: Box::new(FakeBackend(layout)),
            source: Box::new(move |_| {
                Ok((
                    Box::new(src) as Box<dyn HotnessSource>,
                    "fake source".into(),
                ))
            }),
            policy: vmtier_policies::registry::build("default", None).unwrap(),
        }
    }

    fn hot_in_dram(w: &World, off: u64, len: u64) -> u64 {
        let g = w.lock().unwrap();
        (0..len / 4096)
            .filter(|i| g.node[&(7, BASE + off + i * 4096)].raw() == 0)
            .count() as u64
            * 4096
    }

    #[test]
    fn promotes_hot_set_within_budget_then_obeys_a_lower_budget() {
        let len = 256 * MIB;
        let w = world(len);
        let hot = Arc::new(Mutex::new((64 * MIB, 32 * MIB)));
        let mut e = engine(&w, 1000);
        let vm: VmId = "g".parse().unwrap();
        e.attach(vm.clone(), ByteSize(64 * MIB), parts(&w, len, &hot))
            .unwrap();
        let mut ticks_to_90 = None;
        for t in 1..=10 {
            e.tick();
            assert!(
                dram_bytes(&w) <= 64 * MIB,
                "tick {t}: {} in DRAM",
                dram_bytes(&w)
            );
            if ticks_to_90.is_none() && hot_in_dram(&w, 64 * MIB, 32 * MIB) * 10 >= 32 * MIB * 9 {
                ticks_to_90 = Some(t);
            }
        }
        assert!(ticks_to_90.is_some_and(|t| t <= 5), "{ticks_to_90:?}");
        // Lower the budget below the hot set: DRAM use follows within a tick.
        e.set_budget(&vm, ByteSize(16 * MIB)).unwrap();
        e.tick();
        assert!(dram_bytes(&w) <= 16 * MIB, "{}", dram_bytes(&w));
        let st = e.status(&vm).unwrap();
        assert!(
            st.metrics.promoted_bytes >= 32 * MIB && st.metrics.demoted_bytes > 0,
            "{:?}",
            st.metrics
        );
        assert!(st.summary.fast_bytes <= 16 * MIB);
    }

    #[test]
    fn moving_hot_set_follows_and_the_old_one_leaves() {
        let len = 128 * MIB;
        let w = world(len);
        let hot = Arc::new(Mutex::new((0, 16 * MIB)));
        let mut e = engine(&w, 1000);
        e.attach(
            "g".parse().unwrap(),
            ByteSize(24 * MIB),
            parts(&w, len, &hot),
        )
        .unwrap();
        for _ in 0..6 {
            e.tick();
        }
        assert_eq!(hot_in_dram(&w, 0, 16 * MIB), 16 * MIB);
        *hot.lock().unwrap() = (64 * MIB, 16 * MIB);
        for _ in 0..15 {
            e.tick();
            assert!(dram_bytes(&w) <= 24 * MIB);
        }
        assert_eq!(hot_in_dram(&w, 64 * MIB, 16 * MIB), 16 * MIB);
        assert!(hot_in_dram(&w, 0, 16 * MIB) <= 8 * MIB);
    }

    #[test]
    fn lost_layout_degrades_and_a_new_one_restarts_tracking() {
        let len = 64 * MIB;
        let w = world(len);
        let hot = Arc::new(Mutex::new((0, 8 * MIB)));
        let layout: SharedLayout = Arc::new(Mutex::new(Some(one_range(7, len))));
        let mut e = engine(&w, 1000);
        let vm: VmId = "g".parse().unwrap();
        e.attach(
            vm.clone(),
            ByteSize(16 * MIB),
            parts_with(&w, 7, len, &hot, layout.clone()),
        )
        .unwrap();
        let state = |e: &Engine| e.status(&vm).unwrap().summary.state;
        // refresh_ticks is 5 in these tests.
        *layout.lock().unwrap() = None;
        for _ in 0..5 {
            e.tick();
        }
        assert!(
            state(&e).starts_with("degraded: cannot re-read the memory layout"),
            "{}",
            state(&e)
        );
        assert_eq!(
            hot_in_dram(&w, 0, 8 * MIB),
            8 * MIB,
            "still managed while degraded"
        );
        *layout.lock().unwrap() = Some(one_range(7, len));
        for _ in 0..5 {
            e.tick();
        }
        assert_eq!(state(&e), "active");
        // Memory hotplug: the layout grows; tracking restarts on the new one.
        add_process(&w, 7, 2 * len);
        *layout.lock().unwrap() = Some(one_range(7, 2 * len));
        for _ in 0..5 {
            e.tick();
        }
        assert_eq!(e.status(&vm).unwrap().summary.total_bytes, 2 * len);
        assert_eq!(state(&e), "active");
    }

    #[test]
    fn rate_limit_caps_moves_per_tick() {
        let len = 128 * MIB;
        let w = world(len);
        let hot = Arc::new(Mutex::new((0, 64 * MIB)));
        // 4 MB/s with 1 s ticks: one 2 MiB granule per tick.
        let mut e = engine(&w, 4);
        let vm: VmId = "g".parse().unwrap();
        e.attach(vm.clone(), ByteSize(64 * MIB), parts(&w, len, &hot))
            .unwrap();
        for t in 1..=3 {
            e.tick();
            assert_eq!(dram_bytes(&w), t * 2 * MIB, "tick {t}");
        }
        assert_eq!(e.status(&vm).unwrap().metrics.promoted_granules, 3);
    }

    #[test]
    fn a_vanished_process_fails_its_vm_only_and_bad_requests_change_nothing() {
        let len = 64 * MIB;
        let w = world(len);
        add_process(&w, 8, len);
        let hot = Arc::new(Mutex::new((0, 8 * MIB)));
        let mut e = engine(&w, 1000);
        e.attach(
            "a".parse().unwrap(),
            ByteSize(16 * MIB),
            parts_of(&w, 7, len, &hot),
        )
        .unwrap();
        e.attach(
            "b".parse().unwrap(),
            ByteSize(16 * MIB),
            parts_of(&w, 8, len, &hot),
        )
        .unwrap();
        w.lock().unwrap().dead.push(7);
        e.tick();
        let a = e.status(&"a".parse().unwrap()).unwrap();
        assert!(a.summary.state.starts_with("failed"), "{}", a.summary.state);
        assert_eq!(
            e.status(&"b".parse().unwrap()).unwrap().summary.state,
            "active"
        );

        let mut no_build =
            |_: &crate::config::VmConfig| -> Result<VmParts, String> { Err("unused".into()) };
        let cases = [
            (
                Request::Status {
                    vm: "zz".parse().unwrap(),
                },
                "No VM named zz",
            ),
            (
                Request::SetBudget {
                    vm: "b".parse().unwrap(),
                    budget: ByteSize(4 << 30),
                },
                "exceeds the DRAM node",
            ),
            (
                Request::Detach {
                    vm: "zz".parse().unwrap(),
                },
                "No VM named zz",
            ),
        ];
        for (req, want) in cases {
            match e.handle(req, &mut no_build) {
                Response::Error(m) => assert!(m.contains(want), "{m}"),
                r => panic!("{r:?}"),
            }
        }
        assert_eq!(
            e.status(&"b".parse().unwrap())
                .unwrap()
                .summary
                .budget_bytes,
            16 * MIB
        );
        let dup = e.attach(
            "b".parse().unwrap(),
            ByteSize(MIB),
            parts_of(&w, 8, len, &hot),
        );
        assert!(matches!(dup, Err(Error::Exists(_))));
    }
}
