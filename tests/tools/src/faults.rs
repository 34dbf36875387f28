//! vmtierd under faults and bad input, in the tiered host: every failure gives a clear error
//! and costs nothing else — the daemon keeps managing the other VMs.
//!
//! VMs: `guest` (the workload guest via QMP), `proc` (a buffer of this very process via the
//! pid backend, its first part kept hot by a writer thread), `ghost` (a QMP socket that does
//! not exist). DAMON sysfs is hidden under an empty tmpfs, so the daemon must fall back to
//! soft-dirty tracking and say so.

use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmtier_backends::qemu::QemuBackend;
use vmtier_core::{ByteSize, NodeId, ProcessId};
use vmtier_migrate::Residency;

use crate::check::Checks;
use crate::daemon::Daemon;
use crate::guest::{gpa_residency, num, Guest};
use crate::mem::AnonBuf;

#[derive(clap::Args, Debug)]
pub struct FaultsArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
}

const DAMON_SYSFS: &str = "/sys/kernel/mm/damon";

/// A unix-socket proxy in front of QEMU's QMP socket, so that the test can close the
/// daemon's QMP connection while QEMU keeps running (as a restarted management proxy would).
struct QmpProxy {
    path: PathBuf,
    conns: Arc<Mutex<Vec<UnixStream>>>,
    stop: Arc<AtomicBool>,
}

impl QmpProxy {
    fn start(target: &Path) -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!("qmp-proxy-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        let conns = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, target) = (conns.clone(), stop.clone(), target.to_owned());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = client.set_nonblocking(false);
                let Ok(server) = UnixStream::connect(&target) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ]
                .into_iter()
                .filter_map(|(a, b)| Some((a.ok()?, b.ok()?)))
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
                if let Ok(mut v) = c.lock() {
                    v.extend([client, server]);
                }
            }
        });
        Ok(Self { path, conns, stop })
    }

    /// Closes every proxied connection and stops accepting.
    fn kill(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Ok(v) = self.conns.lock() {
            for s in v.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn run_cmd(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

pub fn run(c: &mut Checks, a: &FaultsArgs) {
    let dir = std::env::var("VMTIER_RUN")
        .map_or_else(|_| std::env::temp_dir(), PathBuf::from)
        .join("faults");
    let _ = std::fs::create_dir_all(&dir);
    let socket = std::env::temp_dir().join(format!("vmtierd-faults-{}.sock", std::process::id()));

    // Invalid configurations are refused before anything starts.
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(std::path::Path::to_path_buf))
        .unwrap_or_default();
    for (name, text, want) in [
        ("unknown key", "[daemon]\ninterval = 5\n", "unknown field"),
        ("bad granule", "[daemon]\ngranule = \"3M\"\n", "granule"),
        (
            "bad size",
            "[[vm]]\nname = \"a\"\nqmp = \"/x\"\nbudget = \"lots\"\n",
            "Invalid size",
        ),
    ] {
        let path = dir.join("bad.toml");
        let _ = std::fs::write(&path, text);
        let out = std::process::Command::new(bin.join("vmtierd"))
            .arg("--check")
            .arg("--config")
            .arg(&path)
            .output();
        let (code, err) = out.map_or((None, String::new()), |o| {
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        });
        c.check(
            code == Some(2) && err.contains(want),
            &format!("invalid config refused: {name}"),
            err.lines().next().unwrap_or("").trim(),
        );
    }

    // The guest, on node 1.
    let mut g = match Guest::start(
        "qemu-system-x86_64",
        &a.elf,
        ByteSize(64 << 20),
        1,
        "hot=8M report=1 write_pct=100",
    ) {
        Ok(g) => g,
        Err(e) => return c.fatal("start QEMU", e),
    };
    let Some(start) = g.wait_for("WG start", Duration::from_secs(60)) else {
        return c.fatal("guest starts", "no 'WG start'");
    };
    let hot = (
        num(&start, "hot_start").unwrap_or(0),
        num(&start, "hot_bytes").unwrap_or(0),
    );
    if g.wait_for("WG filled", Duration::from_secs(300)).is_none() {
        return c.fatal("guest fills its RAM", "no 'WG filled'");
    }
    let layout = match QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .and_then(|mut b| b.discover())
    {
        Ok(l) => l,
        Err(e) => return c.fatal("locate guest RAM", e),
    };

    // A plain process "VM": 32 MiB of ours on node 1, the first 8 MiB written continuously.
    let buf = match AnonBuf::new_on_node(32 << 20, false, 1) {
        Ok(b) => b,
        Err(e) => return c.fatal("allocate the process VM's buffer", e),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let base = usize::try_from(buf.addr().raw()).unwrap_or(0);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for page in 0..(8 << 20) / 4096 {
                    // SAFETY: the first 8 MiB of `buf` stay mapped until the thread is joined
                    // below; volatile writes of one word per page race with nothing but the
                    // kernel's migration, which preserves the contents.
                    unsafe {
                        std::ptr::write_volatile((base + page * 4096) as *mut u64, page as u64)
                    };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let me = ProcessId::new(i32::try_from(std::process::id()).unwrap_or(0));

    // DAMON unavailable: hide its sysfs directory.
    let hidden = run_cmd("mount", &["-t", "tmpfs", "none", DAMON_SYSFS]);
    c.check(
        hidden,
        "DAMON sysfs hidden for the fallback test",
        DAMON_SYSFS,
    );

    let proxy = match QmpProxy::start(&g.qmp) {
        Ok(p) => p,
        Err(e) => return c.fatal("start the QMP proxy", e),
    };
    let config = format!(
        "[daemon]\nsocket = \"{}\"\ninterval_ms = 1000\nrate_limit_mbps = 8\nrefresh_ticks = 2\n\n\
         [[vm]]\nname = \"ghost\"\nqmp = \"/nonexistent/qmp.sock\"\nbudget = \"8M\"\n\n\
         [[vm]]\nname = \"guest\"\nqmp = \"{}\"\npid = {}\nbudget = \"48M\"\n\n\
         [[vm]]\nname = \"proc\"\npid = {}\nbudget = \"8M\"\nranges = [{{ start = \"{}\", len = \"32M\" }}]\n",
        socket.display(),
        proxy.path.display(),
        layout.pid,
        me,
        buf.addr()
    );
    let d = match Daemon::start(&dir, &socket, &config) {
        Ok(d) => d,
        Err(e) => {
            let _ = run_cmd("umount", &[DAMON_SYSFS]);
            return c.fatal("start vmtierd", e);
        }
    };
    let log = d.log_text();
    let ghost = log
        .lines()
        .find(|l| l.contains("ghost: not managed"))
        .unwrap_or("");
    c.check(
        ghost.contains("/nonexistent/qmp.sock"),
        "a VM that cannot be found is reported, not managed",
        ghost.trim(),
    );
    let fallback = log
        .lines()
        .find(|l| l.contains("guest: attached"))
        .unwrap_or("");
    c.check(
        fallback.contains("hotness source: soft-dirty")
            && fallback.contains("DAMON vaddr unavailable"),
        "DAMON missing: soft-dirty fallback used and logged",
        fallback
            .split("hotness source:")
            .nth(1)
            .unwrap_or(fallback)
            .trim(),
    );
    let (ok, list) = d.ctl(&["list"]);
    c.check(
        ok && list.matches("active").count() == 2 && !list.contains("ghost"),
        "the other VMs are managed",
        list.trim().replace('\n', " | "),
    );

    // Bad requests: clear errors, nothing changed.
    for (args, want) in [
        (vec!["status", "nope"], "No VM named nope"),
        (vec!["set-budget", "guest", "100G"], "exceeds the DRAM node"),
        (vec!["set-budget", "guest", "12 parsecs"], "Invalid size"),
        (
            vec![
                "attach",
                "ghost2",
                "--budget",
                "8M",
                "--qmp",
                "/nonexistent/q.sock",
            ],
            "Cannot connect to QMP socket",
        ),
        (vec!["detach", "nope"], "No VM named nope"),
    ] {
        let (ok, out) = d.ctl(&args);
        c.check(
            !ok && out.contains(want),
            &format!("vmtierctl {} refused", args.join(" ")),
            out.lines().next().unwrap_or("").trim(),
        );
    }
    let budget = d.status("guest").map(|s| s.summary.budget_bytes);
    c.check(
        budget == Some(48 << 20),
        "the refused budget left the old one",
        format!("{budget:?}"),
    );

    // Soft-dirty tracking promotes the guest's (written) hot set and the process's hot part.
    let t = Instant::now();
    let mut hot_dram = 0;
    let mut proc_dram = 0;
    while t.elapsed() < Duration::from_secs(40) {
        std::thread::sleep(Duration::from_secs(1));
        g.poll();
        hot_dram = gpa_residency(&layout, hot.0, hot.1).map_or(0, |r| r.on(NodeId::new(0)));
        proc_dram =
            Residency::of_range(me, buf.addr(), 8 << 20).map_or(0, |r| r.on(NodeId::new(0)));
        if hot_dram * 10 >= hot.1 * 9 && proc_dram * 10 >= (8 << 20) * 9 {
            break;
        }
    }
    c.check(
        hot_dram * 10 >= hot.1 * 9,
        "soft-dirty tracking brings the guest's hot set to DRAM",
        format!("{} of {}", ByteSize(hot_dram), ByteSize(hot.1)),
    );
    c.check(
        proc_dram * 10 >= (8 << 20) * 9,
        "the pid backend's hot part reaches DRAM",
        format!("{} of 8 MiB", ByteSize(proc_dram)),
    );

    // The QMP connection closes while QEMU runs: the VM stays managed, marked degraded.
    proxy.kill();
    let state = d.wait_state("guest", "degraded", Duration::from_secs(10));
    c.check(
        state.contains("cannot re-read the memory layout"),
        "QMP closing mid-run degrades the VM, with a reason",
        &state,
    );
    let ticks0 = d.status("guest").map_or(0, |s| s.metrics.ticks);
    std::thread::sleep(Duration::from_secs(2));
    g.poll();
    let ticks1 = d.status("guest").map_or(0, |s| s.metrics.ticks);
    let still = gpa_residency(&layout, hot.0, hot.1).map_or(0, |r| r.on(NodeId::new(0)));
    c.check(
        ticks1 > ticks0 && still * 10 >= hot.1 * 9,
        "the VM stays managed without QMP",
        format!(
            "ticks {ticks0} -> {ticks1}, hot set in DRAM {}",
            ByteSize(still)
        ),
    );

    // QEMU exits in the middle of migrations: raise its budget so that promotions are under
    // way at the rate limit (one granule a tick), then kill it.
    let _ = d.ctl(&["set-budget", "guest", "60M"]);
    let _ = d.ctl(&["set-budget", "proc", "32M"]);
    std::thread::sleep(Duration::from_millis(1500));
    drop(g);
    let state = d.wait_state("guest", "failed", Duration::from_secs(10));
    c.check(
        state.contains("VMM process exited"),
        "QEMU exiting mid-run fails that VM with a reason",
        &state,
    );
    let ticks0 = d.status("proc").map_or(0, |s| s.metrics.ticks);
    std::thread::sleep(Duration::from_secs(3));
    let st = d.status("proc");
    c.check(
        st.as_ref()
            .is_some_and(|s| s.summary.state == "active" && s.metrics.ticks > ticks0),
        "the daemon keeps managing the other VM",
        format!("proc ticks {ticks0} -> {:?}", st.map(|s| s.metrics.ticks)),
    );
    let corrupted = buf
        .words()
        .iter()
        .skip((8 << 20) / 8)
        .enumerate()
        .filter(|&(i, &w)| w != crate::mem::pattern(i + (8 << 20) / 8))
        .count();
    c.check(
        corrupted == 0,
        "the process VM's cold data survived the migrations",
        format!("{corrupted} corrupted words"),
    );

    stop.store(true, Ordering::Relaxed);
    let _ = writer.join();
    let mut d = d;
    c.check(d.stop() == Some(0), "vmtierd stops cleanly", "");
    c.check(
        run_cmd("umount", &[DAMON_SYSFS]),
        "DAMON sysfs restored",
        "",
    );
}
