//! Builds the real parts of a VM from its `[[vm]]` configuration: the backend (QEMU over
//! QMP, or a plain process), the hotness source (probed), the policy (from the registry);
//! and the daemon's migrator.

use std::time::Duration;

use vmtier_backends::pid::PidBackend;
use vmtier_backends::qemu::QemuBackend;
use vmtier_core::backend::VmBackend;
use vmtier_core::migrate::Migrator;
use vmtier_core::GuestMemoryLayout;
use vmtier_migrate::kmod::{Combined, Kmod, KmodConfig};
use vmtier_migrate::MovePages;
use vmtier_sources::SelectOptions;

use crate::config::{Config, MigratorChoice, VmConfig};
use crate::engine::{SourceFactory, VmParts};

/// How long QMP may take to answer.
const QMP_TIMEOUT: Duration = Duration::from_secs(10);

/// The hotness source of a VM, probed when the VM is attached: `[daemon] source` and
/// `[daemon.damon]` of `cfg`.
pub fn source_factory(cfg: &Config) -> SourceFactory {
    let choice = cfg.daemon.source;
    let damon = cfg.daemon.damon_config();
    Box::new(move |layout: &GuestMemoryLayout| {
        let opts = SelectOptions {
            choice,
            damon: damon.clone(),
        };
        let sel =
            vmtier_sources::select(&opts, layout).map_err(|e| vmtier_core::error_chain(&e))?;
        Ok((sel.source, sel.reason))
    })
}

/// Builds the parts of `vm` with the daemon-wide settings of `cfg`.
pub fn build(cfg: &Config, vm: &VmConfig) -> Result<VmParts, String> {
    let err = |e: &dyn std::error::Error| vmtier_core::error_chain(e);
    let backend: Box<dyn VmBackend> = match (&vm.qmp, vm.pid) {
        (Some(sock), pid) => {
            Box::new(QemuBackend::connect_to(sock, QMP_TIMEOUT, pid).map_err(|e| err(&e))?)
        }
        (None, Some(pid)) => Box::new(
            PidBackend::new(pid, vm.ranges.iter().map(|r| (r.start, r.len.0)).collect())
                .map_err(|e| err(&e))?,
        ),
        (None, None) => return Err("no backend (qmp or pid)".into()),
    };
    let source = source_factory(cfg);
    let policy = cfg.build_policy().map_err(|e| err(&e))?;
    let hints = vm
        .hints
        .as_ref()
        .and_then(|h| crate::hints::HintParts::from_config(vm.name.as_str(), h));
    Ok(VmParts {
        backend,
        source,
        policy,
        hints,
    })
}

/// The migrator `[daemon] migrator` asks for, and a log line saying what it is.
pub fn migrator(cfg: &Config) -> Result<(Box<dyn Migrator>, String), String> {
    let d = &cfg.daemon;
    let engine = d.kmod_engine;
    let kcfg = KmodConfig {
        engine,
        workers: d.kmod_workers,
        batch: 0,
    };
    match d.migrator {
        MigratorChoice::MovePages => Ok((
            Box::new(MovePages::default()),
            "migrator: move_pages(2)".into(),
        )),
        MigratorChoice::Kmod => {
            let k = Kmod::open(kcfg)
                .map_err(|e| format!("migrator kmod: {}", vmtier_core::error_chain(&e)))?;
            let m = Combined::with_kmod(Some(k), MovePages::default());
            Ok((
                Box::new(m),
                format!(
                    "migrator: kernel module ({} engine) + move_pages(2) for THP and shared memory",
                    engine.name()
                ),
            ))
        }
        MigratorChoice::Auto => {
            let m = Combined::new(kcfg, vmtier_migrate::move_pages::DEFAULT_BATCH, false);
            let line = if m.has_kmod() {
                format!(
                    "migrator: kernel module ({} engine) + move_pages(2) for THP and shared memory",
                    engine.name()
                )
            } else {
                format!(
                    "migrator: move_pages(2) ({} not available)",
                    vmtier_migrate::kmod::DEVICE
                )
            };
            Ok((Box::new(m), line))
        }
    }
}
