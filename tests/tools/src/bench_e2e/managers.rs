//! The three managers the benchmark compares, behind one trait: vmtierd (its own process,
//! a per-VM budget), the kernel's NUMA balancing in tiering mode, and DAMOS
//! `migrate_hot`/`migrate_cold` set up through vmtier's DAMON sysfs driver.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use vmtier_core::{ByteSize, GuestMemoryLayout};
use vmtier_sources::damon::sysfs as damon;

use super::host::{self, Knobs, CGROUP_NAME};
use crate::daemon::Daemon;

/// What a manager is given to manage.
pub struct Env<'a> {
    pub layout: &'a GuestMemoryLayout,
    pub qmp: &'a Path,
    pub budget: ByteSize,
    pub damos_quota: ByteSize,
    /// Physical ranges of node 0 and node 1.
    pub node_ranges: Option<((u64, u64), (u64, u64))>,
    /// Where per-run files go.
    pub dir: PathBuf,
    /// Extra `[daemon.policy_params]` lines for vmtierd.
    pub vmtierd_params: &'a str,
    /// Extra `[daemon.damon]` lines.
    pub vmtierd_damon: &'a str,
}

/// One manager of the guest's placement.
pub trait Manager {
    fn name(&self) -> &'static str;
    /// Work before the baseline is taken (may move pages, which the caller then resets).
    fn prepare(&mut self, _env: &Env<'_>) -> Result<Map<String, Value>, String> {
        Ok(Map::new())
    }
    /// Starts managing. Returns when the manager runs.
    fn start(&mut self, env: &Env<'_>) -> Result<(), String>;
    /// vmtierd's completed ticks so far (the kernel managers have none).
    fn ticks(&mut self) -> Option<u64> {
        None
    }
    /// CPU seconds the manager has used so far (its process, or its kernel thread).
    fn cpu_seconds(&self) -> Option<f64> {
        None
    }
    /// Stops managing; the manager's own counters.
    fn stop(&mut self) -> Result<Map<String, Value>, String>;
}

/// Builds the managers named in a comma-separated list.
pub fn parse(list: &str) -> Result<Vec<Box<dyn Manager>>, String> {
    list.split(',')
        .map(|s| -> Result<Box<dyn Manager>, String> {
            match s.trim() {
                "vmtierd" => Ok(Box::new(Vmtierd::default())),
                "numa-balancing" | "numab" => Ok(Box::new(NumaBalancing)),
                "damos" => Ok(Box::new(Damos::default())),
                other => Err(format!(
                    "Unknown manager {other:?} (vmtierd, numa-balancing, damos)"
                )),
            }
        })
        .collect()
}

/// vmtierd with its defaults (DAMON, policy `default`, 2 MiB granules, move_pages(2)), a
/// 1 s tick and the budget. vmtierd answers requests between ticks, and a tick can take
/// seconds on a loaded host, so its tick count is polled on a thread of its own: sampling
/// never waits for vmtierd.
#[derive(Default)]
pub struct Vmtierd {
    daemon: Option<Daemon>,
    poller: Option<Poller>,
}

/// Polls vmtierd's tick count twice a second, over its socket from this process (a vmtierctl
/// run takes over a second in the testbed: the count lagged by a tick or more).
struct Poller {
    ticks: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Poller {
    const UNKNOWN: u64 = u64::MAX;

    fn start(probe: crate::daemon::Probe) -> Self {
        let ticks = Arc::new(AtomicU64::new(Self::UNKNOWN));
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (Arc::clone(&ticks), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(st) = probe.status_direct("guest") {
                    t.store(st.metrics.ticks, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        Self {
            ticks,
            stop,
            thread,
        }
    }

    fn ticks(&self) -> Option<u64> {
        Some(self.ticks.load(Ordering::Relaxed)).filter(|&t| t != Self::UNKNOWN)
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

impl Manager for Vmtierd {
    fn name(&self) -> &'static str {
        "vmtierd"
    }

    fn start(&mut self, env: &Env<'_>) -> Result<(), String> {
        let _ = fs::create_dir_all(&env.dir);
        let socket = std::env::temp_dir().join(format!("vmtierd-{}.sock", std::process::id()));
        let config = format!(
            "[daemon]\nsocket = \"{}\"\ninterval_ms = 1000\n\n[[vm]]\nname = \"guest\"\nqmp = \"{}\"\nbudget = \"{}K\"\n",
            socket.display(),
            env.qmp.display(),
            env.budget.0 >> 10
        );
        let mut extra = String::new();
        for (table, lines) in [
            ("daemon.policy_params", env.vmtierd_params),
            ("daemon.damon", env.vmtierd_damon),
        ] {
            if !lines.is_empty() {
                extra.push_str(&format!("\n[{table}]\n{lines}\n"));
            }
        }
        let config = config.replacen("\n\n[[vm]]", &format!("{extra}\n\n[[vm]]"), 1);
        let d = Daemon::start(&env.dir, &socket, &config).map_err(|e| e.to_string())?;
        let log = d.log_text();
        for key in ["hotness source:", "migrator:"] {
            if let Some(l) = log.lines().find(|l| l.contains(key)) {
                println!("  vmtierd| {}", l.trim());
            }
        }
        self.poller = Some(Poller::start(d.probe()));
        self.daemon = Some(d);
        Ok(())
    }

    fn ticks(&mut self) -> Option<u64> {
        self.poller.as_ref()?.ticks()
    }

    fn cpu_seconds(&self) -> Option<f64> {
        host::cpu_seconds(self.daemon.as_ref()?.pid())
    }

    fn stop(&mut self) -> Result<Map<String, Value>, String> {
        if let Some(p) = self.poller.take() {
            p.stop();
        }
        let mut d = self.daemon.take().ok_or("vmtierd was not started")?;
        let mut out = Map::new();
        if let Some(st) = d.status("guest") {
            let m = st.metrics;
            out.insert("ticks".into(), json!(m.ticks));
            out.insert("promoted_bytes".into(), json!(m.promoted_bytes));
            out.insert("demoted_bytes".into(), json!(m.demoted_bytes));
            out.insert("failed_pages".into(), json!(m.failed_pages));
            out.insert("busy_pages".into(), json!(m.busy_pages));
            out.insert("deferred_granules".into(), json!(m.deferred_granules));
            out.insert("migration_errors".into(), json!(m.migration_errors));
        }
        match d.stop() {
            Some(0) => Ok(out),
            code => Err(format!("vmtierd did not stop cleanly: {code:?}")),
        }
    }
}

/// `numa_balancing = 2` (tiering mode) with `demotion_enabled`.
pub struct NumaBalancing;

impl Manager for NumaBalancing {
    fn name(&self) -> &'static str {
        "numa-balancing"
    }

    fn start(&mut self, _env: &Env<'_>) -> Result<(), String> {
        Knobs::set_kernel_tiering("2", "true")
    }

    fn stop(&mut self) -> Result<Map<String, Value>, String> {
        Knobs::set_kernel_tiering("0", "false").map(|()| Map::new())
    }
}

/// One DAMOS scheme.
struct Scheme {
    action: &'static str,
    target_nid: u32,
    nr_accesses: (u64, u64),
    age: (u64, u64),
    quota_bytes: u64,
    memcg: Option<String>,
    /// Physical range filtered out (`addr` filter, matching).
    exclude: Option<(u64, u64)>,
}

impl Scheme {
    fn to_sysfs(&self) -> damon::Scheme {
        let mut filters = Vec::new();
        if let Some(m) = &self.memcg {
            filters.push(damon::Filter::Memcg {
                path: m.clone(),
                matching: false,
            });
        }
        if let Some((start, end)) = self.exclude {
            filters.push(damon::Filter::Addr {
                start,
                end,
                matching: true,
            });
        }
        damon::Scheme {
            action: self.action,
            target_nid: Some(self.target_nid),
            pattern: damon::AccessPattern {
                nr_accesses: self.nr_accesses,
                age: self.age,
                ..damon::AccessPattern::ANY
            },
            quota: Some(damon::Quota {
                ms: 0,
                bytes: self.quota_bytes,
                reset_interval_ms: 1000,
                weights: (0, 1000, 1000),
            }),
            filters,
        }
    }
}

/// A kdamond set up through vmtier's DAMON sysfs driver (the one vmtierd's source uses),
/// with the same monitoring attributes vmtierd uses; turned off and its slot released when
/// dropped.
struct Kdamond {
    sysfs: damon::Sysfs,
    slot: usize,
    schemes: Vec<(&'static str, u32)>,
}

impl Kdamond {
    /// ops `vaddr` with `pid`, or `paddr` over `region`.
    fn start(
        ops: &str,
        pid: Option<i32>,
        region: Option<(u64, u64)>,
        schemes: &[Scheme],
    ) -> Result<Self, String> {
        let err = |e: damon::Error| vmtier_core::error_chain(&e);
        let sysfs = damon::Sysfs::new(damon::DEFAULT_ROOT);
        let slot = sysfs.claim(0).map_err(err)?;
        let k = Self {
            sysfs,
            slot,
            schemes: schemes.iter().map(|s| (s.action, s.target_nid)).collect(),
        };
        let ctx = damon::Context {
            ops: ops.into(),
            // The attributes vmtierd's source uses (520-1560 regions): finer regions
            // than DAMON's default of 10, which helps DAMOS as much as vmtierd.
            attrs: vmtier_sources::damon::DamonConfig::default().attrs,
            targets: vec![damon::Target {
                pid: pid.map(vmtier_core::ProcessId::new),
                regions: region.into_iter().collect(),
            }],
            schemes: schemes.iter().map(Scheme::to_sysfs).collect(),
        };
        k.sysfs.configure(slot, &ctx).map_err(err)?;
        k.sysfs.command(slot, "on").map_err(err)?;
        Ok(k)
    }

    /// `(nr_tried, sz_tried, nr_applied, sz_applied, qt_exceeds)` per scheme.
    fn stats(&self) -> Vec<Value> {
        let _ = self.sysfs.command(self.slot, "update_schemes_stats");
        self.schemes
            .iter()
            .enumerate()
            .map(|(i, (action, nid))| {
                let st = self.sysfs.scheme_stats(self.slot, i).unwrap_or_default();
                json!({
                    "action": action,
                    "target_nid": nid,
                    "nr_tried": st.nr_tried,
                    "sz_tried": st.sz_tried,
                    "nr_applied": st.nr_applied,
                    "sz_applied": st.sz_applied,
                    "qt_exceeds": st.qt_exceeds,
                })
            })
            .collect()
    }

    /// The kdamond thread's pid.
    fn pid(&self) -> Option<u32> {
        host::read(&format!(
            "{}/kdamonds/{}/pid",
            damon::DEFAULT_ROOT,
            self.slot
        ))
        .parse()
        .ok()
        .filter(|&p| p > 0)
    }
}

impl Drop for Kdamond {
    fn drop(&mut self) {
        let _ = self.sysfs.release(self.slot);
    }
}

/// Kdamonds running now.
pub fn kdamonds_on() -> usize {
    damon::Sysfs::new(damon::DEFAULT_ROOT).running()
}

/// DAMOS: `migrate_hot` to node 0 for regions accessed in at least one sample per
/// aggregation window, `migrate_cold` to node 1 for regions idle for 2 s, each limited to
/// the quota per second. `vaddr` on QEMU where this kernel's vaddr ops do `migrate_hot`
/// (probed for 5 s), else `paddr` over both nodes limited to QEMU's memory cgroup.
#[derive(Default)]
pub struct Damos {
    ops: Option<&'static str>,
    kdamond: Option<Kdamond>,
}

fn hot_scheme(quota: u64, memcg: Option<String>, exclude: Option<(u64, u64)>) -> Scheme {
    Scheme {
        action: "migrate_hot",
        target_nid: 0,
        nr_accesses: (1, u64::from(u32::MAX)),
        age: (0, u64::from(u32::MAX)),
        quota_bytes: quota,
        memcg,
        exclude,
    }
}

impl Manager for Damos {
    fn name(&self) -> &'static str {
        "damos"
    }

    fn prepare(&mut self, env: &Env<'_>) -> Result<Map<String, Value>, String> {
        let mut out = Map::new();
        let probe = [hot_scheme(env.damos_quota.0, None, None)];
        let k = Kdamond::start("vaddr", Some(env.layout.pid.raw()), None, &probe)
            .map_err(|e| format!("DAMON vaddr probe: {e}"))?;
        // A quota goal on node 0's use (what a tiering setup wants) — not in 6.12.
        out.insert(
            "quota_goal_node_mem_used_bp_supported".into(),
            json!(k.sysfs.quota_goal_supported(k.slot, 0, "node_mem_used_bp")),
        );
        let t = Instant::now();
        std::thread::sleep(Duration::from_secs(5));
        let st = k.stats();
        drop(k);
        let applied = st
            .first()
            .and_then(|s| s["sz_applied"].as_u64())
            .unwrap_or(0);
        println!(
            "  vaddr migrate_hot probe ({:.1} s): {}",
            t.elapsed().as_secs_f64(),
            st[0]
        );
        out.insert("vaddr_probe".into(), st[0].clone());
        let ops = if applied > 0 { "vaddr" } else { "paddr" };
        out.insert("ops".into(), json!(ops));
        self.ops = Some(ops);
        Ok(out)
    }

    fn start(&mut self, env: &Env<'_>) -> Result<(), String> {
        let quota = env.damos_quota.0;
        let cold = |memcg, exclude| Scheme {
            action: "migrate_cold",
            target_nid: 1,
            nr_accesses: (0, 0),
            age: (20, u64::from(u32::MAX)),
            quota_bytes: quota,
            memcg,
            exclude,
        };
        let k = match (self.ops.unwrap_or("paddr"), env.node_ranges) {
            ("vaddr", _) => Kdamond::start(
                "vaddr",
                Some(env.layout.pid.raw()),
                None,
                &[hot_scheme(quota, None, None), cold(None, None)],
            ),
            (_, Some((r0, r1))) => {
                let memcg = Some(format!("/{CGROUP_NAME}"));
                Kdamond::start(
                    "paddr",
                    None,
                    Some((r0.0.min(r1.0), r0.1.max(r1.1))),
                    &[
                        hot_scheme(quota, memcg.clone(), Some(r0)),
                        cold(memcg, Some(r1)),
                    ],
                )
            }
            _ => Err("Node physical ranges not found".into()),
        }?;
        self.kdamond = Some(k);
        Ok(())
    }

    fn cpu_seconds(&self) -> Option<f64> {
        host::cpu_seconds(self.kdamond.as_ref()?.pid()?)
    }

    fn stop(&mut self) -> Result<Map<String, Value>, String> {
        let k = self.kdamond.take().ok_or("DAMOS was not started")?;
        let st = k.stats();
        for s in &st {
            println!("  damos scheme: {s}");
        }
        drop(k);
        let mut out = Map::new();
        out.insert("schemes".into(), json!(st));
        out.insert("ops".into(), json!(self.ops));
        Ok(out)
    }
}
