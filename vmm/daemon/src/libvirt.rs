//! vmtierd follows libvirt's domains (`[libvirt]`, docs/libvirt.md).
//!
//! A [`Follower`] keeps the engine in step with the running domains of one libvirt
//! connection: a domain with vmtier metadata (or any domain, with `manage_all`) is attached
//! when it runs, its budget, rate limit and policy follow its metadata, and it is detached
//! when it stops, crashes, migrates away or its metadata says `enabled="no"`. It looks
//! again at once on a libvirt event (lifecycle, metadata change, device added or removed)
//! or a hook notification, and every `rescan_ticks` ticks in any case; the main loop calls
//! [`Follower::poll`] at least every 200 ms, so a metadata change takes effect before the
//! next tick.
//!
//! Metadata that does not parse, or names a policy or parameters that do not build, is
//! refused: the domain keeps the settings in force, and the engine shows it as `degraded:
//! metadata: <what, naming the attribute>` until valid metadata arrives.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use vmtier_core::policy::{PlacementPolicy, TrackingSource};
use vmtier_core::{error_chain, ByteSize, VmId};
use vmtier_libvirt::backend::LibvirtBackend;
use vmtier_libvirt::conn::{DomainState, EventKind, Libvirt};
use vmtier_libvirt::metadata::{ParamValue, Tiering};

use crate::config::{Config, LibvirtConfig};
use crate::engine::{Engine, Error as EngineError, VmParts};
use crate::hints::HintParts;
use vmtier_api::proto::TieringChange;

/// The reason of a refused pin, without the engine's "Cannot pin ranges of VM:" prefix.
fn pin_reason(e: &EngineError) -> String {
    match e {
        EngineError::Pin(_, why) => why.clone(),
        other => error_chain(other),
    }
}

/// Shortest time between two log lines about one domain's refused settings (unless the
/// reason changes) and between two connection attempts.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// Shortest time between two connection attempts.
const RECONNECT_EVERY: Duration = Duration::from_secs(5);

/// What a domain's metadata asks for.
#[derive(Debug, PartialEq)]
enum Desired {
    /// Manage it with these settings.
    Manage(Tiering),
    /// Leave it alone (no metadata without `manage_all`, or `enabled="no"`).
    Leave,
    /// The metadata is invalid: the reason, naming the attribute.
    Invalid(String),
}

/// What is in force for a domain vmtierd attached.
#[derive(Debug)]
struct Managed {
    uuid: String,
    tiering: Tiering,
}

/// Follows one libvirt connection's domains.
#[derive(Debug)]
pub struct Follower {
    cfg: LibvirtConfig,
    lv: Option<Libvirt>,
    managed: BTreeMap<VmId, Managed>,
    /// Per domain: the last problem logged and when.
    logged: BTreeMap<String, (String, Instant)>,
    /// Look again at the next poll.
    dirty: bool,
    /// Look again after the next tick (an attach that may work later).
    retry: bool,
    ticks: u64,
    last_connect: Option<Instant>,
}

/// The policy for a domain's settings: its `policy` (or the daemon's), with its `<param>`s
/// (or, for the daemon's own policy without `<param>`s, `[daemon.policy_params]`).
fn build_policy(cfg: &Config, t: &Tiering) -> Result<Box<dyn PlacementPolicy>, String> {
    let name = t.policy.as_deref().unwrap_or(&cfg.daemon.policy);
    let table: Option<toml::Table> = if !t.params.is_empty() {
        Some(
            t.params
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        ParamValue::Int(i) => toml::Value::Integer(*i),
                        ParamValue::Float(f) => toml::Value::Float(*f),
                        ParamValue::Bool(b) => toml::Value::Boolean(*b),
                        ParamValue::Str(s) => toml::Value::String(s.clone()),
                    };
                    (k.clone(), v)
                })
                .collect(),
        )
    } else if name == cfg.daemon.policy && !cfg.daemon.policy_params.is_empty() {
        Some(cfg.daemon.policy_params.clone())
    } else {
        None
    };
    let p = vmtier_policies::registry::build(name, table.as_ref()).map_err(|e| {
        let what = match &e {
            vmtier_policies::registry::Error::Unknown(_) => format!("Attribute policy=\"{name}\""),
            vmtier_policies::registry::Error::Config(..) => "Element <param>".to_owned(),
        };
        format!("{what}: {}", error_chain(&e).replace('\n', " "))
    })?;
    match p.source() {
        TrackingSource::AbitScan | TrackingSource::None | TrackingSource::SoftDirty => Ok(p),
        _ => Err(format!(
            "Attribute policy=\"{name}\": the policy plans from observations vmtierd does not feed"
        )),
    }
}

/// `Mems_allowed_list` of a `/proc/PID/status` text.
fn mems_allowed(status: &str) -> Option<&str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Mems_allowed_list:"))
        .map(str::trim)
}

/// Whether a kernel node list (`0-1,3`) contains `n`.
fn node_in_list(list: &str, n: u32) -> bool {
    list.split(',').any(|p| match p.trim().split_once('-') {
        Some((a, b)) => matches!(
            (a.parse::<u32>(), b.parse::<u32>()),
            (Ok(a), Ok(b)) if a <= n && n <= b
        ),
        None => p.trim().parse() == Ok(n),
    })
}

impl Follower {
    /// Follows `cfg.uri`; connects now, or later if libvirtd is not there yet.
    pub fn new(cfg: LibvirtConfig) -> Self {
        let mut f = Self {
            cfg,
            lv: None,
            managed: BTreeMap::new(),
            logged: BTreeMap::new(),
            dirty: true,
            retry: false,
            ticks: 0,
            last_connect: None,
        };
        f.connect();
        f
    }

    fn connect(&mut self) {
        if self
            .last_connect
            .is_some_and(|t| t.elapsed() < RECONNECT_EVERY)
        {
            return;
        }
        self.last_connect = Some(Instant::now());
        match Libvirt::open(&self.cfg.uri) {
            Ok(lv) => {
                info!(
                    "libvirt: following domains of {}{}",
                    self.cfg.uri,
                    if self.cfg.manage_all {
                        format!(
                            " (all of them; {} budget without metadata)",
                            self.cfg.default_budget
                        )
                    } else {
                        " that have vmtier metadata".into()
                    }
                );
                self.lv = Some(lv);
                self.dirty = true;
            }
            Err(e) => self.log_problem("libvirt", error_chain(&e)),
        }
    }

    /// Logs `why` about `what`, at most once a minute unless the reason changes.
    fn log_problem(&mut self, what: &str, why: String) {
        let now = Instant::now();
        match self.logged.get(what) {
            Some((w, at)) if *w == why && now.duration_since(*at) < LOG_EVERY => {}
            _ => {
                warn!("{what}: {why}");
                self.logged.insert(what.to_owned(), (why, now));
            }
        }
    }

    /// Something outside libvirt's events (a hook) says to look again.
    pub fn notify(&mut self, why: &str) {
        info!("libvirt: {why}");
        self.dirty = true;
    }

    /// A tick passed: rescans when due, retries attaches that failed.
    pub fn tick(&mut self) {
        self.ticks += 1;
        if self.retry || (self.cfg.rescan_ticks > 0 && self.ticks % self.cfg.rescan_ticks == 0) {
            self.retry = false;
            self.dirty = true;
        }
    }

    /// Drains libvirt's events and, if anything may have changed, brings the engine in step.
    pub fn poll(&mut self, engine: &mut Engine, cfg: &Config) {
        if self.lv.is_none() {
            self.connect();
        }
        let Some(lv) = &self.lv else {
            return;
        };
        for ev in lv.events() {
            info!("libvirt: domain {} {}", ev.domain, ev.describe());
            self.dirty = true;
            // Memory hotplug: a dimm added or removed changes the guest RAM layout.
            if matches!(
                ev.kind,
                EventKind::DeviceAdded(_) | EventKind::DeviceRemoved(_)
            ) {
                if let Ok(id) = ev.domain.parse::<VmId>() {
                    if self.managed.contains_key(&id) {
                        let _ = engine.recheck_layout_soon(&id);
                    }
                }
            }
        }
        if self.dirty {
            self.reconcile(engine, cfg);
        }
    }

    fn desired(&self, d: &DomainState) -> Desired {
        match &d.metadata {
            None if self.cfg.manage_all => {
                Desired::Manage(Tiering::with_budget(self.cfg.default_budget))
            }
            None => Desired::Leave,
            Some(xml) => match Tiering::parse(xml) {
                Ok(t) if t.enabled => Desired::Manage(t),
                Ok(_) => Desired::Leave,
                Err(e) => Desired::Invalid(e.to_string()),
            },
        }
    }

    fn reconcile(&mut self, engine: &mut Engine, cfg: &Config) {
        let Some(lv) = &self.lv else {
            return;
        };
        let doms = match lv.running() {
            Ok(d) => d,
            Err(e) => {
                let dead = !lv.is_alive();
                self.log_problem("libvirt", error_chain(&e));
                if dead {
                    // Reconnect (libvirtd restarted); domains stay managed meanwhile.
                    self.lv = None;
                }
                return;
            }
        };
        self.dirty = false;
        let conn = lv.connect();
        let mut seen = BTreeSet::new();
        for d in doms {
            let Ok(id) = d.name.parse::<VmId>() else {
                if !matches!(self.desired(&d), Desired::Leave) {
                    self.log_problem(
                        &d.name,
                        "not managed: the name is not a vmtier VM name (A-Z, a-z, 0-9, . _ -, \
                         at most 64 bytes)"
                            .into(),
                    );
                }
                continue;
            };
            seen.insert(id.clone());
            let desired = self.desired(&d);
            // A managed domain that restarted (new UUID), or whose VM failed (QEMU exited):
            // detach, and attach afresh below if it is still wanted.
            let stale = self
                .managed
                .get(&id)
                .is_some_and(|m| m.uuid != d.uuid || engine.is_active(&id) != Some(true));
            if stale {
                self.detach(engine, &id, "its QEMU is gone");
            }
            match (self.managed.contains_key(&id), desired) {
                (true, Desired::Leave) => {
                    self.detach(engine, &id, "metadata says enabled=\"no\" or is gone")
                }
                (true, Desired::Invalid(why)) => {
                    let _ = engine.set_metadata_problem(
                        &id,
                        Some(format!("{why}; the settings in force are kept")),
                    );
                }
                (true, Desired::Manage(t)) => self.update(engine, cfg, &id, t),
                (false, Desired::Manage(_)) if !d.running => {
                    // Starting up or migrating in: libvirt holds the monitor until it
                    // resumes, which is an event.
                    debug!("{id}: not attached yet: the domain is not running (paused)");
                }
                (false, Desired::Manage(t)) => {
                    let r = self.attach(engine, cfg, &id, &d, &t, conn.clone());
                    match r {
                        Ok(()) => {
                            self.logged.remove(&d.name);
                        }
                        Err(why) => {
                            self.log_problem(&d.name, format!("not managed: {why}"));
                            self.retry = true;
                        }
                    }
                }
                (false, Desired::Invalid(why)) => {
                    self.log_problem(
                        &d.name,
                        format!("not managed: invalid vmtier metadata: {why}"),
                    );
                }
                (false, Desired::Leave) => {}
            }
        }
        let gone: Vec<VmId> = self
            .managed
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for id in gone {
            self.detach(engine, &id, "the domain is no longer running");
        }
    }

    fn attach(
        &mut self,
        engine: &mut Engine,
        cfg: &Config,
        id: &VmId,
        d: &DomainState,
        t: &Tiering,
        conn: std::sync::Arc<vmtier_libvirt::virt::connect::Connect>,
    ) -> Result<(), String> {
        let policy = build_policy(cfg, t)?;
        let backend = LibvirtBackend::new(conn, &d.name, &d.uuid, Path::new(&self.cfg.pid_dir))
            .map_err(|e| error_chain(&e))?;
        // libvirt's strict numatune with the cpuset cgroup controller confines QEMU to the
        // nodeset: no page of it can move to DRAM (move_pages gets EACCES). Say why.
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", backend.pid())).unwrap_or_default();
        if let Some(mems) = mems_allowed(&status) {
            if !node_in_list(mems, cfg.daemon.fast_node.raw()) {
                warn!(
                    "{id}: QEMU's cpuset allows nodes {mems} only, not DRAM node {}: its pages \
                     cannot be promoted (libvirt's <numatune mode='strict'> with the cpuset \
                     cgroup controller; see docs/libvirt.md, numatune)",
                    cfg.daemon.fast_node
                );
            }
        }
        // The guest hint channel: the domain's org.vmtier.agent.0 channel (or a unix device
        // aliased ua-vmtier-agent), with the metadata's <hints> over [vm.hints]' defaults.
        let hints = backend.agent_socket().and_then(|sock| {
            let Some(hc) = t
                .hints
                .clone()
                .unwrap_or_default()
                .config(sock.to_path_buf())
            else {
                info!(
                    "{id}: guest hint channel {} not used (<hints enabled=\"no\"/>)",
                    sock.display()
                );
                return None;
            };
            info!("{id}: guest hint channel {}", sock.display());
            HintParts::from_config(id.as_str(), &hc)
        });
        let parts = VmParts {
            backend: Box::new(backend),
            source: crate::parts::source_factory(cfg),
            policy,
            hints,
        };
        engine
            .attach(id.clone(), t.budget, parts)
            .map_err(|e| error_chain(&e))?;
        if let Some(r) = t.rate {
            let _ = engine.set_rate_limit(id, Some(r.0));
        }
        // Pins are checked against the guest RAM now known; refused ones leave the domain
        // managed without pins, degraded, and are tried again when the metadata changes.
        let mut in_force = t.clone();
        if !t.pins.is_empty() {
            if let Err(e) = engine.set_pins(id, t.pins.clone()) {
                in_force.pins.clear();
                let _ = engine.set_metadata_problem(
                    id,
                    Some(format!(
                        "Element <pin>: {}; the settings in force are kept",
                        pin_reason(&e)
                    )),
                );
            }
        }
        info!(
            "{id}: libvirt domain {} attached from its metadata (budget {}, policy {}, rate {})",
            d.uuid,
            t.budget,
            t.policy.as_deref().unwrap_or(&cfg.daemon.policy),
            t.rate
                .map_or_else(|| "the daemon's share".into(), |r| format!("{r}/s"))
        );
        self.managed.insert(
            id.clone(),
            Managed {
                uuid: d.uuid.clone(),
                tiering: in_force,
            },
        );
        Ok(())
    }

    /// Applies changed settings to a managed domain; on a refused change the old settings
    /// stay and the VM shows the problem.
    fn update(&mut self, engine: &mut Engine, cfg: &Config, id: &VmId, t: Tiering) {
        let Some(m) = self.managed.get(id) else {
            return;
        };
        if m.tiering == t {
            let _ = engine.set_metadata_problem(id, None);
            return;
        }
        let old = m.tiering.clone();
        let uuid = m.uuid.clone();
        // The hint channel's settings are fixed at attach too.
        let policy_changed =
            old.policy != t.policy || old.params != t.params || old.hints != t.hints;
        if policy_changed {
            // Policies keep state; a new one starts on a fresh attach of the same domain.
            if let Err(why) = build_policy(cfg, &t) {
                let _ = engine.set_metadata_problem(
                    id,
                    Some(format!("{why}; the settings in force are kept")),
                );
                return;
            }
            let d = DomainState {
                name: id.to_string(),
                uuid,
                id: 0,
                running: true,
                metadata: None,
            };
            let Some(conn) = self.lv.as_ref().map(Libvirt::connect) else {
                return;
            };
            let _ = engine.detach(id);
            self.managed.remove(id);
            info!("{id}: policy or hint settings changed in its metadata, re-attaching");
            if let Err(why) = self.attach(engine, cfg, id, &d, &t, conn) {
                self.log_problem(id.as_str(), format!("not managed: {why}"));
                self.retry = true;
            }
            return;
        }
        if old.budget != t.budget || old.pins != t.pins {
            // Budget and pins together, all or nothing (DRAM pins count against the budget).
            let change = TieringChange {
                budget: (old.budget != t.budget).then_some(t.budget),
                pins: (old.pins != t.pins).then(|| t.pins.clone()),
                ..TieringChange::default()
            };
            if let Err(e) = engine.set_tiering(id, change) {
                let what = match e {
                    EngineError::Pin(..) => format!("Element <pin>: {}", pin_reason(&e)),
                    _ => format!(
                        "Attribute budget=\"{}\": {}",
                        vmtier_libvirt::metadata::size_text(t.budget.0),
                        error_chain(&e)
                    ),
                };
                let _ = engine.set_metadata_problem(
                    id,
                    Some(format!("{what}; the settings in force are kept")),
                );
                return;
            }
        }
        if old.rate != t.rate {
            let _ = engine.set_rate_limit(id, t.rate.map(|r| r.0));
        }
        info!(
            "{id}: metadata applied (budget {} -> {}, rate {:?} -> {:?}, {} -> {} pinned ranges)",
            old.budget,
            t.budget,
            old.rate.map(|r| ByteSize(r.0)),
            t.rate.map(|r| ByteSize(r.0)),
            old.pins.len(),
            t.pins.len()
        );
        let _ = engine.set_metadata_problem(id, None);
        if let Some(m) = self.managed.get_mut(id) {
            m.tiering = t;
        }
    }

    fn detach(&mut self, engine: &mut Engine, id: &VmId, why: &str) {
        if self.managed.remove(id).is_some() {
            let _ = engine.detach(id);
            info!("{id}: libvirt domain detached: {why}");
        }
    }

    /// Names of the domains attached through libvirt.
    pub fn managed(&self) -> Vec<VmId> {
        self.managed.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpusets_that_exclude_dram_are_seen() {
        let cases = [
            ("Name:\tqemu\nMems_allowed_list:\t1\n", 0, Some(false)),
            ("Mems_allowed_list:\t0-1\n", 0, Some(true)),
            ("Mems_allowed_list:\t1,3-4\n", 4, Some(true)),
            ("Mems_allowed_list:\t1,3-4\n", 2, Some(false)),
            ("Name:\tqemu\n", 0, None),
        ];
        for (status, node, want) in cases {
            let got = mems_allowed(status).map(|m| node_in_list(m, node));
            assert_eq!(got, want, "{status:?} {node}");
        }
    }

    #[test]
    fn policies_from_metadata_are_built_or_refused_by_name() {
        let cfg = Config::default();
        let with = |policy: Option<&str>, params: &[(&str, ParamValue)]| {
            let mut t = Tiering::with_budget(ByteSize(1 << 30));
            t.policy = policy.map(str::to_owned);
            t.params = params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect();
            t
        };
        let cases: Vec<(Tiering, Result<&str, &str>)> = vec![
            (with(None, &[]), Ok("default")),
            (with(Some("default"), &[]), Ok("default")),
            (
                with(Some("nosuch"), &[]),
                Err("Attribute policy=\"nosuch\": Unknown policy nosuch"),
            ),
            (
                with(Some("default"), &[("no_such_param", ParamValue::Int(1))]),
                Err("Element <param>: Invalid config for policy"),
            ),
        ];
        for (t, want) in cases {
            match (build_policy(&cfg, &t), want) {
                (Ok(p), Ok(name)) => assert_eq!(p.name(), name, "{t:?}"),
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{e} vs {w}"),
                (Ok(p), Err(w)) => panic!("{t:?}: built {} (want {w})", p.name()),
                (Err(e), Ok(_)) => panic!("{t:?}: {e}"),
            }
        }
    }
}
