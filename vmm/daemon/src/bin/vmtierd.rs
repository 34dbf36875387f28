//! vmtierd: the tiered-memory daemon. Loads the config, attaches the configured VMs, serves
//! the control socket and runs the engine's tick until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::Parser;
use log::{error, info};
use vmtier_core::{error_chain as chain, ByteSize, NodeId};
use vmtier_daemon::config::Config;
use vmtier_daemon::engine::{Engine, EngineConfig};
use vmtier_daemon::{parts, server};
use vmtier_migrate::MovePages;

#[derive(Parser, Debug)]
#[command(
    name = "vmtierd",
    about = "Tiered memory manager for VMs: keeps each VM's hot pages in DRAM under a budget"
)]
struct Args {
    /// Configuration file (docs/config.md).
    #[arg(long, short, default_value = "/etc/vmtier/vmtierd.toml")]
    config: PathBuf,
    /// Override the control socket path.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Override the HTTP API's unix socket path (`[api] socket`).
    #[arg(long)]
    api_socket: Option<PathBuf>,
    /// Check the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Follow the domains of this libvirt URI (as `[libvirt] uri`; turns libvirt on).
    #[cfg(feature = "libvirt")]
    #[arg(long, value_name = "URI")]
    connect: Option<String>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Bytes of memory on a node (sysfs MemTotal), or why not.
fn node_bytes(node: NodeId) -> Result<u64, String> {
    let path = format!("/sys/devices/system/node/node{node}/meminfo");
    let text = std::fs::read_to_string(&path)
        .map_err(|_| format!("Node {node} does not exist on this host ({path})"))?;
    text.lines()
        .find(|l| l.contains("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb << 10)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("Node {node} has no memory"))
}

/// `t + d`, or the latest representable instant instead of a panic. The config bounds
/// `interval_ms` to an hour, so this only matters if those bounds are ever lifted.
fn after(t: Instant, d: Duration) -> Instant {
    t.checked_add(d)
        .or_else(|| t.checked_add(Duration::from_secs(3600)))
        .unwrap_or(t)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    let mut cfg = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            error!("{}", chain(&e));
            return ExitCode::from(2);
        }
    };
    if let Some(s) = args.socket {
        cfg.daemon.socket = s;
    }
    #[cfg(feature = "libvirt")]
    if let Some(uri) = args.connect {
        cfg.libvirt.get_or_insert_with(Default::default).uri = uri;
    }
    if let Some(s) = args.api_socket {
        cfg.api.socket = s;
    }
    if args.check {
        println!("{}: ok ({} VMs)", args.config.display(), cfg.vms.len());
        return ExitCode::SUCCESS;
    }
    let d = &cfg.daemon;
    let fast_bytes = match (node_bytes(d.fast_node), node_bytes(d.slow_node)) {
        (Ok(f), Ok(s)) => {
            info!(
                "DRAM node {}: {}, CXL node {}: {}",
                d.fast_node,
                ByteSize(f),
                d.slow_node,
                ByteSize(s)
            );
            f
        }
        (Err(e), _) | (_, Err(e)) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    let engine_cfg = EngineConfig {
        interval: Duration::from_millis(d.interval_ms),
        fast_node: d.fast_node,
        slow_node: d.slow_node,
        rate_limit_bytes_per_s: d.rate_limit_mbps.saturating_mul(1_000_000),
        granule: d.granule,
        refresh_ticks: d.refresh_ticks,
        refresh: d.refresh,
        fast_node_bytes: Some(fast_bytes),
        detail_percent: d.detail_percent,
    };
    let migrator = match parts::migrator(&cfg) {
        Ok((m, line)) => {
            info!("{line}");
            m
        }
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut engine = Engine::new(engine_cfg, migrator, Box::new(MovePages::default()));
    engine.set_ring_size(vmtier_daemon::ring::RingSize {
        ticks: cfg.api.heatmap_ticks,
        buckets: cfg.api.heatmap_buckets,
    });
    for vm in &cfg.vms {
        let r =
            parts::build(&cfg, vm).and_then(|p| engine.attach_config(vm, p).map_err(|e| chain(&e)));
        if let Err(e) = r {
            // The other VMs are still managed; this one can be attached later.
            error!("{}: not managed: {e}", vm.name);
        }
    }

    let (tx, rx) = mpsc::channel::<server::Call>();
    let api = if cfg.api.enable {
        match vmtier_daemon::http::spawn(&cfg.api, tx.clone()) {
            Ok(s) => Some(s),
            Err(e) => {
                error!("{}", chain(&e));
                return ExitCode::from(2);
            }
        }
    } else {
        None
    };
    let server = match server::spawn(&cfg.daemon.socket, tx) {
        Ok(s) => s,
        Err(e) => {
            error!("{}", chain(&e));
            if let Some(a) = &api {
                a.remove();
            }
            return ExitCode::from(2);
        }
    };
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    info!(
        "vmtierd: {} VMs managed, control socket {}, tick {} ms",
        engine.vm_names().len(),
        cfg.daemon.socket.display(),
        cfg.daemon.interval_ms
    );

    #[cfg(feature = "libvirt")]
    let mut follower = cfg
        .libvirt
        .clone()
        .map(vmtier_daemon::libvirt::Follower::new);
    #[cfg(not(feature = "libvirt"))]
    if cfg.libvirt.is_some() {
        error!("[libvirt] is set, but this vmtierd was built without the libvirt feature");
        return ExitCode::from(2);
    }
    let interval = Duration::from_millis(cfg.daemon.interval_ms);
    let mut next = after(Instant::now(), interval);
    let mut build = |vm: &vmtier_daemon::config::VmConfig| parts::build(&cfg, vm);
    while !STOP.load(Ordering::Relaxed) {
        #[cfg(feature = "libvirt")]
        if let Some(f) = follower.as_mut() {
            f.poll(&mut engine, &cfg);
        }
        let now = Instant::now();
        if now >= next {
            engine.tick();
            #[cfg(feature = "libvirt")]
            if let Some(f) = follower.as_mut() {
                f.tick();
            }
            next = after(next, interval);
            if next < now {
                next = after(now, interval);
            }
            continue;
        }
        let wait = (next - now).min(Duration::from_millis(200));
        match rx.recv_timeout(wait) {
            Ok((req, reply)) => {
                // Changes libvirt reported while we waited are in force before any answer.
                #[cfg(feature = "libvirt")]
                if let Some(f) = follower.as_mut() {
                    f.poll(&mut engine, &cfg);
                }
                #[cfg(feature = "libvirt")]
                if let (Some(f), vmtier_daemon::proto::Request::LibvirtHook { domain, op }) =
                    (follower.as_mut(), &req)
                {
                    f.notify(&format!("hook: domain {domain:?} {op:?}"));
                    let _ = reply.send(vmtier_daemon::proto::Response::Ok(
                        vmtier_daemon::proto::Reply::Done {
                            message: format!("Noted: domain {domain} {op}"),
                        },
                    ));
                    continue;
                }
                let _ = reply.send(engine.handle(req, &mut build));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    info!("vmtierd: stopping");
    for name in engine.vm_names() {
        let _ = engine.detach(&name);
    }
    server.remove();
    if let Some(a) = &api {
        a.remove();
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_never_overflow() {
        let now = Instant::now();
        let cases = [
            (
                Duration::from_millis(1000),
                Some(Duration::from_millis(1000)),
            ),
            (Duration::from_millis(u64::MAX), None),
            (Duration::MAX, None),
        ];
        for (d, want) in cases {
            let t = after(now, d);
            assert!(t >= now, "{d:?}");
            if let Some(w) = want {
                assert_eq!(t - now, w);
            }
        }
    }
}
