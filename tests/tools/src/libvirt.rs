//! vmtierd following a real libvirtd inside the tiered host: libvirt is started without
//! systemd (tests/testbed/libvirt-up: state on tmpfs), TCG domains boot the workload guest
//! with their RAM bound to the CXL node (`numatune strict nodeset=1`), and vmtierd finds them
//! through `[libvirt]` alone. Judged from outside: where every guest page is comes from
//! move_pages(2) queries of the QEMU process, as in the `daemon` check.
//!
//! 1. a domain with vmtier metadata, running before vmtierd starts, is found and managed:
//!    its hot set reaches DRAM, DRAM use stays under the metadata's budget;
//! 2. `virsh metadata --live` lowers the budget; DRAM follows within a few ticks;
//! 3. bad metadata is refused: status names the attribute, the old budget stays in force;
//! 4. `virsh metadata --live` pins a cold guest-physical range to DRAM: its pages (found at
//!    the HVAs that range maps to) go to DRAM and stay; a DRAM pin larger than the budget is
//!    refused, naming `<pin>`, and the pin in force is kept;
//! 5. a domain started later is attached automatically, one destroyed is detached (the
//!    rest of a domain's lifecycle — hotplug, save, restore — is [`run_lifecycle`]'s);
//! 6. wl1's hint channel (COM2, aliased `ua-vmtier-agent`) is found in its live XML and the
//!    guest's hints arrive;
//! 7. the guest verifies all of its memory: 0 corrupted words.

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use vmtier_core::{ByteSize, NodeId};
use vmtier_daemon::proto::{Reply, Response};
use vmtier_libvirt::backend::{LibvirtBackend, AGENT_ALIAS, SYSTEM_PID_DIR};
use vmtier_libvirt::conn::Libvirt;
use vmtier_libvirt::metadata::NAMESPACE;

use crate::check::Checks;
use crate::daemon::Daemon;
use crate::guest::{num, GuestPages, TlbChurn};

const URI: &str = "qemu:///system";
/// Slack on DRAM use against the budget: one 2 MiB granule in flight.
const SLACK: u64 = 2 << 20;

#[derive(clap::Args, Debug)]
pub struct LibvirtArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// RAM of the first domain.
    #[arg(long, default_value = "128M")]
    ram: ByteSize,
    /// Its hot set.
    #[arg(long, default_value = "16M")]
    hot: ByteSize,
    /// Budget in its metadata at start.
    #[arg(long, default_value = "48M")]
    budget: ByteSize,
    /// Budget set with `virsh metadata --live` after promotion.
    #[arg(long, default_value = "8M")]
    lower_budget: ByteSize,
    /// Ticks allowed for 90% of the hot set to reach DRAM.
    #[arg(long, default_value_t = 30)]
    ticks: u64,
    /// Ticks allowed for DRAM to follow a budget change.
    #[arg(long, default_value_t = 10)]
    budget_ticks: u64,
    /// Tick length.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// The script that starts libvirt inside the testbed (default: the repo's).
    #[arg(long)]
    libvirt_up: Option<PathBuf>,
}

/// `virsh -c URI ARGS`: (success, stdout + stderr).
fn virsh(args: &[&str]) -> (bool, String) {
    crate::check::output(Command::new("virsh").arg("-c").arg(URI).args(args))
}

/// A domain's XML: direct kernel boot of the workload guest, RAM strictly on node 1, the
/// serial console on a unix socket (read and written by the check), the guest hint channel
/// (COM2, aliased `ua-vmtier-agent`: the workload guest has no virtio-serial driver) on
/// another, isa-debug-exit.
fn domain_xml(name: &str, dir: &Path, ram: ByteSize, append: &str, budget: ByteSize) -> String {
    domain_xml_with(name, dir, ram, append, budget, "")
}

/// [`domain_xml`] with room for `slots` DIMMs of up to [`DIMM`] each (memory hotplug needs
/// `<maxMemory>` and a guest NUMA cell).
fn hotplug_domain_xml(
    name: &str,
    dir: &Path,
    ram: ByteSize,
    append: &str,
    budget: ByteSize,
    slots: u64,
) -> String {
    let extra = format!(
        "<maxMemory slots='{slots}' unit='KiB'>{max}</maxMemory>
  <cpu><numa><cell id='0' cpus='0' memory='{kib}' unit='KiB'/></numa></cpu>",
        max = (ram.0 + slots * DIMM) >> 10,
        kib = ram.0 >> 10
    );
    domain_xml_with(name, dir, ram, append, budget, &extra)
}

/// Size of a hotplugged DIMM.
const DIMM: u64 = 32 << 20;

fn domain_xml_with(
    name: &str,
    dir: &Path,
    ram: ByteSize,
    append: &str,
    budget: ByteSize,
    extra: &str,
) -> String {
    format!(
        "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  {extra}
  <memory unit='KiB'>{kib}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{elf}</kernel><cmdline>{append}</cmdline></os>
  <features><acpi/></features>
  <numatune><memory mode='strict' nodeset='1'/></numatune>
  <devices>
    <serial type='unix'><source mode='bind' path='{sock}'/><target port='0'/></serial>
    <serial type='unix'><source mode='bind' path='{hints}'/><target port='1'/><alias name='{AGENT_ALIAS}'/></serial>
    <memballoon model='none'/>
  </devices>
  <metadata><vmtier:tiering xmlns:vmtier='{NAMESPACE}' budget='{budget}'/></metadata>
  <qemu:commandline><qemu:arg value='-device'/><qemu:arg value='isa-debug-exit,iobase=0xf4,iosize=4'/></qemu:commandline>
</domain>
",
        kib = ram.0 >> 10,
        elf = dir.join("workload.elf").display(),
        sock = dir.join(format!("{name}.sock")).display(),
        hints = dir.join(format!("{name}-hints.sock")).display(),
        budget = vmtier_libvirt::metadata::size_text(budget.0),
    )
}

/// A domain's serial console: lines in, `q` out.
struct Console {
    stream: UnixStream,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Console {
    fn open(path: &Path) -> std::io::Result<Self> {
        let t = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if t.elapsed() > Duration::from_secs(20) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let r = stream.try_clone()?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send(l.trim_end().to_owned()).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            stream,
            lines,
            seen: Vec::new(),
        })
    }

    fn poll(&mut self) {
        while let Ok(l) = self.lines.try_recv() {
            if l.starts_with("WG ") {
                self.seen.push(l);
            }
        }
    }

    fn wait_for(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        let t = Instant::now();
        loop {
            self.poll();
            if let Some(l) = self.seen.iter().find(|l| l.starts_with(prefix)) {
                return Some(l.clone());
            }
            if t.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn request_stop(&mut self) {
        let _ = self.stream.write_all(b"q\n");
    }
}

/// Names in `vmtierctl --json list`.
fn listed(d: &Daemon) -> Vec<String> {
    let (_, out) = d.ctl(&["--json", "list"]);
    match out
        .lines()
        .next()
        .and_then(|l| serde_json::from_str::<Response>(l).ok())
    {
        Some(Response::Ok(Reply::List { vms })) => {
            vms.into_iter().map(|v| v.name.to_string()).collect()
        }
        _ => Vec::new(),
    }
}

/// Polls until `f` holds or `timeout` passes; the time it took.
fn until(timeout: Duration, f: &mut dyn FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    loop {
        if f() {
            return Some(t.elapsed());
        }
        if t.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Calls `f` about once per daemon tick of `tick`, at most `n` times, until it returns true.
fn per_tick(tick: Duration, n: u64, mut f: impl FnMut() -> bool) {
    for _ in 0..n {
        let t = Instant::now();
        if f() {
            return;
        }
        std::thread::sleep(tick.saturating_sub(t.elapsed()));
    }
}

struct Placement {
    dram: u64,
    hot_dram: u64,
}

fn place(pages: &GuestPages, hot: (u64, u64)) -> Placement {
    match pages.sample() {
        Ok(p) => Placement {
            dram: p.bytes_on(NodeId::new(0)),
            hot_dram: p.gpa_bytes_on(NodeId::new(0), hot.0, hot.1),
        },
        Err(_) => Placement {
            dram: u64::MAX,
            hot_dram: 0,
        },
    }
}

#[allow(clippy::cast_precision_loss)]
fn pct(a: u64, b: u64) -> f64 {
    100.0 * a as f64 / b.max(1) as f64
}

/// Starts libvirt inside the testbed, the way an operator without systemd would, with the
/// hook installed for vmtierd's `socket`; then copies the guest image where QEMU can read it.
/// The directory of the guest image, or `None` (a fatal check failed).
fn start_libvirt(c: &mut Checks, a: &LibvirtArgs, socket: &Path) -> Option<PathBuf> {
    let up = a.libvirt_up.clone().unwrap_or_else(|| {
        PathBuf::from(std::env::var("VMTIER_REPO").unwrap_or_else(|_| ".".into()))
            .join("tests/testbed/libvirt-up")
    });
    let ctl = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("vmtierctl")))
        .unwrap_or_default();
    let t = Instant::now();
    let (ok, text) = crate::check::output(
        Command::new(&up)
            .env("VMTIER_HOOK_VMTIERCTL", &ctl)
            .env("VMTIER_HOOK_SOCKET", socket),
    );
    if !c.check(
        ok,
        "libvirtd runs in the tiered host without systemd",
        format!("{} ({:.1} s)", text.trim(), t.elapsed().as_secs_f64()),
    ) {
        return None;
    }
    // The guest image where QEMU (user libvirt-qemu) can read it and libvirt can label it.
    let dir = PathBuf::from("/tmp/vmtier-libvirt");
    let setup = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::copy(&a.elf, dir.join("workload.elf")).map(|_| ()))
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
            std::fs::set_permissions(
                dir.join("workload.elf"),
                std::fs::Permissions::from_mode(0o644),
            )
        });
    if let Err(e) = setup {
        c.fatal("copy the guest image", e);
        return None;
    }
    Some(dir)
}

/// vmtierd's socket for these checks, known before libvirt starts so that the hook can be
/// installed with it.
fn daemon_socket() -> PathBuf {
    std::env::temp_dir().join(format!("vmtierd-lv-{}.sock", std::process::id()))
}

/// vmtierd with `[libvirt]` only (no `[[vm]]`).
fn start_daemon(c: &mut Checks, a: &LibvirtArgs, socket: &Path) -> Option<Daemon> {
    let run_dir = std::env::var("VMTIER_RUN")
        .map_or_else(|_| std::env::temp_dir(), PathBuf::from)
        .join("libvirt");
    let _ = std::fs::create_dir_all(&run_dir);
    let config = format!(
        "[daemon]\nsocket = \"{}\"\ninterval_ms = {}\nrate_limit_mbps = 2000\n\n[libvirt]\nuri = \"{URI}\"\nrescan_ticks = 5\n",
        socket.display(),
        a.interval_ms
    );
    match Daemon::start(&run_dir, socket, &config) {
        Ok(d) => Some(d),
        Err(e) => {
            c.fatal("start vmtierd", e);
            None
        }
    }
}

pub fn run(c: &mut Checks, a: &LibvirtArgs) {
    // 1. libvirt, started the way an operator without systemd would.
    let socket = daemon_socket();
    let Some(dir) = start_libvirt(c, a, &socket) else {
        return;
    };
    let _churn = TlbChurn::start();

    // 2. The first domain runs before vmtierd starts.
    let append1 = format!("hot={}K report=2 hints=1", a.hot.0 >> 10);
    let xml1 = dir.join("wl1.xml");
    let _ = std::fs::write(&xml1, domain_xml("wl1", &dir, a.ram, &append1, a.budget));
    let t = Instant::now();
    let (ok, out) = virsh(&["create", &xml1.to_string_lossy()]);
    if !c.check(
        ok,
        "domain wl1 starts (TCG, RAM strict on node 1, vmtier metadata)",
        format!(
            "{out} ({:.1} s, first start includes libvirt's capability probe)",
            t.elapsed().as_secs_f64()
        ),
    ) {
        return;
    }
    // libvirt's capability probe, kept for the next run (tests/testbed/libvirt-up).
    if let Ok(t) = std::env::var("VMTIER_TARGET") {
        let keep = PathBuf::from(t).join("testbed/libvirt-caps");
        let _ = std::fs::create_dir_all(&keep);
        if let Ok(rd) = std::fs::read_dir("/var/cache/libvirt/qemu/capabilities") {
            for e in rd.filter_map(Result::ok) {
                let _ = std::fs::copy(e.path(), keep.join(e.file_name()));
            }
        }
    }
    let mut con1 = match Console::open(&dir.join("wl1.sock")) {
        Ok(c1) => c1,
        Err(e) => return c.fatal("open wl1's console", e),
    };
    let Some(start) = con1.wait_for("WG progress", Duration::from_secs(120)) else {
        return c.fatal("wl1's guest runs", "no 'WG progress' line within 120 s");
    };
    let hot = (num(&start, "hot_start").unwrap_or(0x40_0000), a.hot.0);

    // Our own look at the layout, to judge from outside.
    let lv = match Libvirt::open(URI) {
        Ok(l) => l,
        Err(e) => return c.fatal("connect to libvirt", e),
    };
    let layout = lv
        .running()
        .ok()
        .and_then(|ds| ds.into_iter().find(|d| d.name == "wl1"))
        .ok_or_else(|| "wl1 is not running".to_owned())
        .and_then(|d| {
            LibvirtBackend::new(lv.connect(), &d.name, &d.uuid, Path::new(SYSTEM_PID_DIR))
                .and_then(|mut b| b.discover())
                .map_err(|e| vmtier_core::error_chain(&e))
        });
    let layout = match layout {
        Ok(l) => l,
        Err(e) => return c.fatal("locate wl1's RAM through libvirt's monitor API", e),
    };
    let pages = GuestPages::new(&layout);
    let p0 = place(&pages, hot);
    let total = layout.total_bytes();
    c.check(
        p0.dram <= total / 20,
        "wl1's RAM starts on the CXL node",
        format!(
            "{} of {} in DRAM ({} ranges, qemu pid {}, its {})",
            ByteSize(p0.dram),
            ByteSize(total),
            layout.ranges.len(),
            layout.pid,
            std::fs::read_to_string(format!("/proc/{}/status", layout.pid))
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("Mems_allowed_list"))
                .unwrap_or("Mems_allowed_list: ?")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );

    // 3. vmtierd with [libvirt] only: no [[vm]].
    let Some(d) = start_daemon(c, a, &socket) else {
        return;
    };
    // The states on the way say why a wait was long (a transient problem at attach counts
    // against the promotion's ticks below).
    let (state, before, waited) = d.wait_state_traced("wl1", "active", Duration::from_secs(60));
    let st = d.status("wl1");
    if !c.check(
        state == "active"
            && st
                .as_ref()
                .is_some_and(|s| s.backend.contains("libvirt domain wl1")),
        "vmtierd finds wl1 through libvirt and manages it",
        format!(
            "state {state:?} after {:.1} s{}, backend {:?}, budget {}",
            waited.as_secs_f64(),
            if before.is_empty() {
                String::new()
            } else {
                format!(" (before: {})", before.join("; "))
            },
            st.as_ref().map(|s| s.backend.clone()).unwrap_or_default(),
            ByteSize(st.as_ref().map_or(0, |s| s.summary.budget_bytes))
        ),
    ) {
        println!("{}", d.log_text());
        return;
    }
    c.check(
        st.as_ref()
            .is_some_and(|s| s.summary.budget_bytes == a.budget.0),
        "the budget comes from the domain's metadata",
        ByteSize(st.as_ref().map_or(0, |s| s.summary.budget_bytes)),
    );

    // 4. Promotion under the budget.
    let tick = Duration::from_millis(a.interval_ms);
    let ticks = |d: &Daemon| d.status("wl1").map_or(0, |s| s.metrics.ticks);
    let mut max_dram = 0;
    let mut reached = None;
    let mut first = None;
    per_tick(tick, a.ticks + 5, || {
        let p = place(&pages, hot);
        let tk = ticks(&d);
        first.get_or_insert(tk);
        max_dram = max_dram.max(p.dram);
        println!(
            "  [promote ] tick {tk:>3}  DRAM {:>10}  hot set in DRAM {:>5.1}%",
            ByteSize(p.dram).to_string(),
            pct(p.hot_dram, hot.1)
        );
        let done = p.hot_dram * 10 >= hot.1 * 9;
        if done {
            reached = Some(tk);
        }
        done
    });
    c.check(
        reached.is_some_and(|t| t <= a.ticks),
        "wl1's hot set reaches DRAM (90%)",
        format!(
            "after {reached:?} ticks (limit {}; first sample at tick {})",
            a.ticks,
            first.unwrap_or(0)
        ),
    );
    c.check(
        max_dram <= a.budget.0 + SLACK,
        "wl1's DRAM use stays under its metadata budget",
        format!("max {} for a budget of {}", ByteSize(max_dram), a.budget),
    );

    // The guest hint channel, found in the live domain XML (checked after the promotion so
    // that its wait does not count in the ticks to 90%).
    let mut hs = None;
    let connected = until(Duration::from_secs(30), &mut || {
        hs = d.status("wl1").and_then(|s| s.hints);
        hs.as_ref()
            .is_some_and(|h| h.connected && h.version > 0 && h.counters.frames_ok > 0)
    });
    c.check(
        connected.is_some()
            && hs
                .as_ref()
                .is_some_and(|h| h.socket == dir.join("wl1-hints.sock")),
        "vmtierd finds wl1's hint channel in its live XML and reads the guest's hints",
        hs.as_ref().map_or_else(
            || "no hint channel in status".to_owned(),
            |h| {
                format!(
                    "socket {}, connected {}, agent {:?}, v{}, {} frames, {} ranges accepted, {} live",
                    h.socket.display(),
                    h.connected,
                    h.agent,
                    h.version,
                    h.counters.frames_ok,
                    h.counters.ranges_accepted,
                    h.live_ranges
                )
            },
        ),
    );

    // 5. virsh metadata --live lowers the budget.
    let set = |budget: &str| {
        virsh(&[
            "metadata",
            "wl1",
            "--live",
            "--uri",
            NAMESPACE,
            "--key",
            "vmtier",
            "--set",
            &format!("<tiering budget=\"{budget}\"/>"),
        ])
    };
    let low = vmtier_libvirt::metadata::size_text(a.lower_budget.0);
    let w0 = Instant::now();
    let (ok, out) = set(&low);
    let virsh_s = w0.elapsed().as_secs_f64();
    c.check(ok, "virsh metadata --live sets a lower budget", &out);
    // Ticks are counted from the first status read after virsh returned (libvirt has sent
    // its event by then); the budget must be in force by the next tick.
    let first = d.status("wl1");
    let t0 = first.as_ref().map_or(0, |s| s.metrics.ticks);
    let mut seen_budget_at = first
        .as_ref()
        .filter(|s| s.summary.budget_bytes == a.lower_budget.0)
        .map(|_| (0, w0.elapsed()));
    if seen_budget_at.is_none() {
        let _ = until(Duration::from_secs(30), &mut || {
            let st = d.status("wl1");
            if st
                .as_ref()
                .is_some_and(|s| s.summary.budget_bytes == a.lower_budget.0)
            {
                seen_budget_at = st.map(|s| (s.metrics.ticks.saturating_sub(t0), w0.elapsed()));
                true
            } else {
                false
            }
        });
    }
    c.check(
        seen_budget_at.is_some_and(|(t, _)| t <= 1),
        "the new budget is in force within one tick",
        format!(
            "{} ticks after virsh metadata returned ({:.1} s after it started; virsh took \
             {virsh_s:.1} s; ticks are {} ms)",
            seen_budget_at.map_or(-1, |(t, _)| i64::try_from(t).unwrap_or(-1)),
            seen_budget_at.map_or(-1.0, |(_, w)| w.as_secs_f64()),
            a.interval_ms
        ),
    );
    let mut followed_at = None;
    per_tick(tick, a.budget_ticks * 2, || {
        let p = place(&pages, hot);
        let tk = ticks(&d);
        println!(
            "  [budget  ] tick {tk:>3}  DRAM {:>10}",
            ByteSize(p.dram).to_string()
        );
        let done = p.dram <= a.lower_budget.0 + SLACK;
        if done {
            followed_at = Some(tk.saturating_sub(t0));
        }
        done
    });
    c.check(
        followed_at.is_some_and(|t| t <= a.budget_ticks),
        "DRAM follows the lowered budget",
        format!(
            "{followed_at:?} ticks after the change (limit {})",
            a.budget_ticks
        ),
    );

    // 6. Bad metadata is refused and the budget in force is kept.
    let (ok, out) = set("4X");
    c.check(
        ok,
        "virsh accepts the element (libvirt does not check vmtier's values)",
        &out,
    );
    let mut state = String::new();
    let refused = until(Duration::from_secs(10), &mut || {
        state = d.status("wl1").map(|s| s.summary.state).unwrap_or_default();
        state.contains("metadata")
    });
    let st = d.status("wl1");
    c.check(
        refused.is_some() && state.contains("budget=\"4X\""),
        "bad metadata is refused and the error names the attribute",
        &state,
    );
    c.check(
        st.is_some_and(|s| s.summary.budget_bytes == a.lower_budget.0),
        "the budget in force is kept",
        format!("budget still {}", a.lower_budget),
    );
    std::thread::sleep(tick * 2);
    let p = place(&pages, hot);
    c.check(
        p.dram <= a.lower_budget.0 + SLACK,
        "DRAM stays under the kept budget",
        ByteSize(p.dram),
    );
    // vmtierctl writes valid metadata through libvirt: virsh sees what vmtierctl wrote.
    let (ok, out) = d.ctl(&["-c", URI, "dom-tier", "wl1", "--budget", &low, "--live"]);
    c.check(ok, "vmtierctl dom-tier replaces the bad metadata", &out);
    let (_, shown) = virsh(&["metadata", "wl1", "--live", "--uri", NAMESPACE]);
    c.check(
        vmtier_libvirt::metadata::Tiering::parse(&shown)
            .is_ok_and(|t| t.budget == a.lower_budget && t.enabled),
        "virsh and vmtierctl agree on the metadata",
        format!("virsh metadata: {shown}"),
    );
    let back = until(Duration::from_secs(30), &mut || {
        d.status("wl1").is_some_and(|s| s.summary.state == "active")
    });
    c.check(
        back.is_some(),
        "valid metadata clears the problem",
        format!("{:.1} s", back.map_or(-1.0, |t| t.as_secs_f64())),
    );
    let (ok, out) = d.ctl(&["-c", URI, "dom-stats", "wl1"]);
    c.check(
        ok && out.contains("metadata: <tiering") && out.contains("libvirt domain wl1"),
        "vmtierctl dom-stats shows the metadata and vmtierd's status",
        out.lines().take(3).collect::<Vec<_>>().join(" | "),
    );
    let (ok, out) = d.ctl(&["nodes"]);
    c.check(
        ok && out.lines().count() == 2 && out.contains("node 1") && out.contains("no CPUs"),
        "vmtierctl nodes shows DRAM and the CPU-less CXL node",
        out.trim().replace('\n', " | "),
    );

    // 7. Pinned ranges: a cold range pinned to DRAM through the metadata.
    pins(c, &d, &pages, hot, a, tick);

    // 8. A domain started later is attached; destroyed, it is detached.
    let xml2 = dir.join("wl2.xml");
    let _ = std::fs::write(
        &xml2,
        domain_xml(
            "wl2",
            &dir,
            ByteSize(32 << 20),
            "hot=4M report=5",
            ByteSize(8 << 20),
        ),
    );
    let (ok, out) = virsh(&["create", &xml2.to_string_lossy()]);
    c.check(ok, "domain wl2 starts while vmtierd runs", &out);
    let attached = until(Duration::from_secs(60), &mut || {
        d.status("wl2").is_some_and(|s| s.summary.state == "active")
    });
    c.check(
        attached.is_some(),
        "wl2 is attached automatically",
        format!(
            "{:.1} s after virsh create returned",
            attached.map_or(-1.0, |t| t.as_secs_f64())
        ),
    );
    let hooked = until(Duration::from_secs(30), &mut || {
        d.log_text().contains("hook: domain \"wl2\"")
    });
    c.check(
        hooked.is_some(),
        "the libvirt hook told vmtierd about wl2",
        format!(
            "{}; the hook's log: {}",
            d.log_text()
                .lines()
                .filter(|l| l.contains("hook: domain \"wl2\""))
                .map(|l| l.split_once("] ").map_or(l, |x| x.1).to_owned())
                .collect::<Vec<_>>()
                .join("; "),
            std::fs::read_to_string("/run/vmtier-libvirt-hook.log")
                .unwrap_or_default()
                .trim()
                .replace('\n', " | ")
        ),
    );
    let (ok, out) = virsh(&["destroy", "wl2"]);
    c.check(ok, "virsh destroy wl2", &out);
    let detached = until(Duration::from_secs(30), &mut || {
        !listed(&d).contains(&"wl2".to_owned())
    });
    let names = listed(&d);
    c.check(
        detached.is_some() && names == ["wl1"],
        "wl2 is detached cleanly, wl1 still managed",
        format!(
            "{:.1} s; vmtierctl list: {names:?}",
            detached.map_or(-1.0, |t| t.as_secs_f64())
        ),
    );

    // 9. The guest checks all of its memory.
    con1.request_stop();
    let done = con1.wait_for("WG done", Duration::from_secs(300));
    con1.poll();
    let corrupt = con1
        .seen
        .iter()
        .filter(|l| l.starts_with("WG corrupt"))
        .count();
    c.check(
        done.as_ref()
            .is_some_and(|l| num(l, "corrupted") == Some(0))
            && corrupt == 0,
        "wl1's guest reports 0 corrupted words",
        done.unwrap_or_else(|| "no 'WG done'".into()),
    );
    // isa-debug-exit ends QEMU; libvirt reports the domain stopped and vmtierd detaches it.
    let gone = until(Duration::from_secs(60), &mut || listed(&d).is_empty());
    c.check(
        gone.is_some(),
        "wl1 is detached when its QEMU exits",
        format!("{gone:?}"),
    );
    let log = d.log_text();
    c.check(
        log.contains("wl1: libvirt domain detached") && !log.contains("panicked"),
        "vmtierd's log tells the story",
        log.lines()
            .filter(|l| l.contains("libvirt"))
            .take(12)
            .collect::<Vec<_>>()
            .join("\n    "),
    );
    let mut d = d;
    let code = d.stop();
    c.check(
        code == Some(0),
        "vmtierd exits cleanly",
        format!("{code:?}"),
    );
    let _ = virsh(&["destroy", "wl1"]);
}

/// `vmtierctl --json tiering VM`: its pins, if vmtierd answers.
fn pins_in_force(d: &Daemon, vm: &str) -> Option<Vec<vmtier_api::pin::Pin>> {
    let (_, out) = d.ctl(&["--json", "tiering", vm]);
    match out
        .lines()
        .next()
        .and_then(|l| serde_json::from_str::<Response>(l).ok())
    {
        Some(Response::Ok(Reply::Tiering(t))) => Some(t.pins),
        _ => None,
    }
}

/// A cold range of wl1 pinned to DRAM with `virsh metadata --live`; then a pin larger than
/// the budget, refused.
fn pins(
    c: &mut Checks,
    d: &Daemon,
    pages: &GuestPages,
    hot: (u64, u64),
    a: &LibvirtArgs,
    tick: Duration,
) {
    const PIN: u64 = 4 << 20;
    let budget = vmtier_libvirt::metadata::size_text(a.lower_budget.0);
    // Cold: 32 MiB past the hot set, 2 MiB aligned, inside the guest's RAM.
    let start = (hot.0 + hot.1 + (32 << 20)).next_multiple_of(2 << 20);
    let start = if start + PIN <= a.ram.0 {
        start
    } else {
        a.ram.0 / 2
    };
    let set = |xml: &str| {
        virsh(&[
            "metadata", "wl1", "--live", "--uri", NAMESPACE, "--key", "vmtier", "--set", xml,
        ])
    };
    let in_dram = || {
        pages
            .sample()
            .map_or(0, |p| p.gpa_bytes_on(NodeId::new(0), start, PIN))
    };
    let before = in_dram();
    let xml = format!(
        "<tiering budget=\"{budget}\"><pin start=\"{start:#x}\" size=\"4M\" tier=\"dram\"/></tiering>"
    );
    let (ok, out) = set(&xml);
    c.check(
        ok,
        "virsh metadata --live adds a DRAM pin of a cold range",
        format!("{xml} {out}"),
    );
    let t0 = d.status("wl1").map_or(0, |s| s.metrics.ticks);
    let mut reached = None;
    per_tick(tick, a.budget_ticks * 2, || {
        let b = in_dram();
        let tk = d.status("wl1").map_or(0, |s| s.metrics.ticks);
        println!(
            "  [pin     ] tick {tk:>3}  pinned range in DRAM {:>10}",
            ByteSize(b).to_string()
        );
        let done = b == PIN;
        if done {
            reached = Some(tk.saturating_sub(t0));
        }
        done
    });
    c.check(
        reached.is_some_and(|t| t <= a.budget_ticks),
        "the pinned range's pages go to DRAM (move_pages at the HVAs of its GPAs)",
        format!(
            "{} of {:#x}+4 MiB in DRAM before, all of it {reached:?} ticks after virsh returned (limit {})",
            ByteSize(before),
            start,
            a.budget_ticks
        ),
    );
    // And stay there while the hot set (larger than the rest of the budget) wants DRAM.
    let mut low = u64::MAX;
    let mut max_dram = 0;
    for _ in 0..5 {
        std::thread::sleep(tick);
        low = low.min(in_dram());
        max_dram = max_dram.max(
            pages
                .sample()
                .map_or(u64::MAX, |p| p.bytes_on(NodeId::new(0))),
        );
    }
    c.check(
        low == PIN,
        "the pinned range stays in DRAM",
        format!("at least {} of 4 MiB over 5 ticks", ByteSize(low)),
    );
    c.check(
        max_dram <= a.lower_budget.0 + SLACK,
        "the pin counts against the budget: DRAM use stays under it",
        format!(
            "max {} for a budget of {}",
            ByteSize(max_dram),
            a.lower_budget
        ),
    );
    let kept = pins_in_force(d, "wl1");
    c.check(
        kept.as_ref()
            .is_some_and(|p| p.len() == 1 && p[0].start.0 == start),
        "vmtierctl tiering shows the pin in force",
        format!("{kept:?}"),
    );

    // A DRAM pin larger than the budget: refused, the pin in force kept.
    let big = format!(
        "<tiering budget=\"{budget}\"><pin start=\"{start:#x}\" size=\"16M\" tier=\"dram\"/></tiering>"
    );
    let (ok, out) = set(&big);
    c.check(
        ok,
        "virsh stores a pin larger than the budget (libvirt does not check)",
        &out,
    );
    let mut state = String::new();
    let refused = until(Duration::from_secs(10), &mut || {
        state = d.status("wl1").map(|s| s.summary.state).unwrap_or_default();
        state.contains("<pin>")
    });
    c.check(
        refused.is_some() && state.contains("exceeds the budget"),
        "the pin larger than the budget is refused, naming <pin>",
        &state,
    );
    std::thread::sleep(tick * 2);
    let still = pins_in_force(d, "wl1");
    let b = in_dram();
    c.check(
        still == kept && b == PIN,
        "the pin in force is kept (and its range stays in DRAM)",
        format!("pins {still:?}, {} in DRAM", ByteSize(b)),
    );
    // Back to valid metadata without pins.
    let (ok, out) = d.ctl(&[
        "-c", URI, "dom-tier", "wl1", "--budget", &budget, "--unpin", "--live",
    ]);
    let back = until(Duration::from_secs(30), &mut || {
        d.status("wl1").is_some_and(|s| s.summary.state == "active")
    });
    c.check(
        ok && back.is_some() && pins_in_force(d, "wl1").is_some_and(|p| p.is_empty()),
        "vmtierctl dom-tier --unpin clears the pins and the problem",
        out.trim(),
    );
}

/// `tbcheck libvirt-lifecycle`: a domain's lifecycle while vmtierd follows it (libvirt
/// started as for `libvirt`; the domain wl2, 32 MiB with room for two DIMMs): a DIMM
/// hotplugged live is tracked; unplug is tried; `virsh save` (libvirt's migration stream, to
/// a file) detaches it and `virsh restore` (an incoming migration from that file) attaches
/// the new QEMU; destroyed, it is detached. Judged against QEMU's own view of its RAM, read
/// by the check through libvirt's monitor API.
pub fn run_lifecycle(c: &mut Checks, a: &LibvirtArgs) {
    let socket = daemon_socket();
    let Some(dir) = start_libvirt(c, a, &socket) else {
        return;
    };
    let Some(d) = start_daemon(c, a, &socket) else {
        return;
    };
    let xml2 = dir.join("wl2.xml");
    let _ = std::fs::write(
        &xml2,
        hotplug_domain_xml(
            "wl2",
            &dir,
            ByteSize(32 << 20),
            "hot=4M report=5",
            ByteSize(8 << 20),
            2,
        ),
    );
    let t = Instant::now();
    let (ok, out) = virsh(&["create", &xml2.to_string_lossy()]);
    if !c.check(
        ok,
        "domain wl2 starts (maxMemory with 2 slots, one guest NUMA cell)",
        format!("{} ({:.1} s)", out.trim(), t.elapsed().as_secs_f64()),
    ) {
        return;
    }
    let attached = until(Duration::from_secs(90), &mut || {
        d.status("wl2").is_some_and(|s| s.summary.state == "active")
    });
    if !c.check(
        attached.is_some(),
        "wl2 is attached",
        format!("{attached:?} after virsh create returned"),
    ) {
        println!("{}", d.log_text());
        return;
    }
    hint_settings(c, &d);
    lifecycle(c, &d, &dir);
    let (ok, out) = virsh(&["destroy", "wl2"]);
    c.check(ok, "virsh destroy wl2", out.trim());
    let gone = until(Duration::from_secs(30), &mut || listed(&d).is_empty());
    c.check(
        gone.is_some(),
        "wl2 is detached after destroy",
        format!("{gone:?}"),
    );
    let log = d.log_text();
    c.check(
        !log.contains("panicked"),
        "vmtierd's log tells the story",
        log.lines()
            .filter(|l| l.contains("wl2"))
            .map(|l| l.split_once("] ").map_or(l, |x| x.1))
            .collect::<Vec<_>>()
            .join("\n    "),
    );
    let mut d = d;
    let code = d.stop();
    c.check(
        code == Some(0),
        "vmtierd exits cleanly",
        format!("{code:?}"),
    );
}

/// `<hints enabled="no"/>` in wl2's metadata re-attaches it without its hint channel; other
/// `<hints>` settings bring the channel back.
fn hint_settings(c: &mut Checks, d: &Daemon) {
    let set = |xml: &str| {
        virsh(&[
            "metadata", "wl2", "--live", "--uri", NAMESPACE, "--key", "vmtier", "--set", xml,
        ])
    };
    let channel = |d: &Daemon| {
        d.status("wl2")
            .filter(|s| s.summary.state == "active")
            .map(|s| s.hints.is_some_and(|h| h.connected))
    };
    let had = until(Duration::from_secs(15), &mut || channel(d) == Some(true))
        .map(|_| true)
        .or(Some(false));
    let (ok, out) = set("<tiering budget=\"8M\"><hints enabled=\"no\"/></tiering>");
    let off = until(Duration::from_secs(30), &mut || {
        d.status("wl2")
            .is_some_and(|s| s.summary.state == "active" && s.hints.is_none())
    });
    c.check(
        ok && had == Some(true) && off.is_some(),
        "<hints enabled=\"no\"/> re-attaches wl2 without its hint channel",
        format!(
            "{}; connected before: {had:?}; without it after {:?}",
            out.trim(),
            off
        ),
    );
    let (ok, out) = set(
        "<tiering budget=\"8M\"><hints max_budget_percent=\"25\" distrust_ticks=\"10\"/></tiering>",
    );
    let on = until(Duration::from_secs(30), &mut || channel(d) == Some(true));
    c.check(
        ok && on.is_some()
            && d.log_text()
                .contains("wl2: policy or hint settings changed"),
        "other <hints> settings bring the channel back (re-attached, connected)",
        format!("{}; connected after {on:?}", out.trim()),
    );
}

fn lifecycle(c: &mut Checks, d: &Daemon, dir: &Path) {
    let total = |d: &Daemon| d.status("wl2").map_or(0, |s| s.summary.total_bytes);
    // QEMU's own view, read by the check through libvirt's monitor API: (total, DIMM bytes).
    let qemu = || -> Option<(u64, u64)> {
        let lv = Libvirt::open(URI).ok()?;
        let dom = lv.running().ok()?.into_iter().find(|x| x.name == "wl2")?;
        let l = LibvirtBackend::new(
            lv.connect(),
            &dom.name,
            &dom.uuid,
            Path::new(SYSTEM_PID_DIR),
        )
        .and_then(|mut b| b.discover())
        .ok()?;
        let dimm = l
            .ranges
            .iter()
            .filter(|r| r.name.starts_with("memdimm"))
            .map(|r| r.len)
            .sum();
        Some((l.total_bytes(), dimm))
    };
    let before = total(d);
    let dimm = dir.join("dimm.xml");
    let _ = std::fs::write(
        &dimm,
        format!(
            "<memory model='dimm'><target><size unit='KiB'>{}</size><node>0</node></target></memory>",
            DIMM >> 10
        ),
    );
    let (ok, out) = virsh(&["attach-device", "wl2", &dimm.to_string_lossy(), "--live"]);
    c.check(
        ok,
        "virsh attach-device hotplugs a 32 MiB DIMM into wl2",
        out.trim(),
    );
    // Tracked when vmtierd's total is QEMU's, DIMM included (the base RAM's ranges may also
    // change a little meanwhile: the guest's chipset settings remap the legacy holes).
    let mut seen = None;
    let grown = until(Duration::from_secs(30), &mut || {
        seen = qemu();
        seen.is_some_and(|(t, dimm)| dimm == DIMM && total(d) == t)
    });
    let st = d.status("wl2");
    c.check(
        grown.is_some() && st.as_ref().is_some_and(|s| s.summary.state == "active"),
        "vmtierd tracks the hotplugged range (device-added event, layout re-read)",
        format!(
            "guest RAM {} -> {} after {:.1} s (QEMU: {:?} with the DIMM); state {:?}",
            ByteSize(before),
            ByteSize(total(d)),
            grown.map_or(-1.0, |t| t.as_secs_f64()),
            seen.map(|(t, dimm)| (ByteSize(t), ByteSize(dimm))),
            st.map(|s| s.summary.state).unwrap_or_default()
        ),
    );
    // Unplug needs the guest to eject the DIMM (ACPI); the workload guest has no ACPI
    // driver, so QEMU keeps it. Whatever happens, vmtierd must follow it.
    // libvirt returns once the request is sent (or after 5 s): poll QEMU itself.
    let (ok, out) = virsh(&["detach-device", "wl2", &dimm.to_string_lossy(), "--live"]);
    std::thread::sleep(Duration::from_secs(3));
    let mut seen = None;
    let agree = until(Duration::from_secs(15), &mut || {
        seen = qemu();
        seen.is_some_and(|(t, _)| total(d) == t)
    });
    c.check(
        agree.is_some(),
        "after virsh detach-device vmtierd tracks what QEMU has",
        format!(
            "detach-device {} ({}); QEMU has {:?} (total, DIMM: {}); vmtierd tracks {}",
            if ok { "returned" } else { "failed" },
            out.trim(),
            seen.map(|(t, dimm)| (ByteSize(t), ByteSize(dimm))),
            if seen.is_some_and(|s| s.1 > 0) {
                "still plugged: the guest has not ejected it"
            } else {
                "unplugged"
            },
            ByteSize(total(d))
        ),
    );
    let pid_of = |d: &Daemon| {
        d.status("wl2")
            .and_then(|s| s.backend.split("qemu pid ").nth(1).map(str::to_owned))
            .and_then(|t| t.split([',', ')']).next().map(str::to_owned))
            .unwrap_or_default()
    };
    let pid0 = pid_of(d);
    let file = dir.join("wl2.save");
    let t = Instant::now();
    let (ok, out) = virsh(&["save", "wl2", &file.to_string_lossy()]);
    let save_s = t.elapsed().as_secs_f64();
    c.check(
        ok,
        "virsh save wl2 (the migration stream, to a file)",
        out.trim(),
    );
    let gone = until(Duration::from_secs(30), &mut || {
        !listed(d).contains(&"wl2".to_owned())
    });
    c.check(
        gone.is_some() && d.log_text().contains("wl2: libvirt domain detached"),
        "wl2, stopped by save, is detached cleanly",
        format!(
            "{:.1} s after save returned (save took {save_s:.1} s)",
            gone.map_or(-1.0, |t| t.as_secs_f64())
        ),
    );
    let (ok, out) = virsh(&["restore", &file.to_string_lossy()]);
    c.check(
        ok,
        "virsh restore wl2 (an incoming migration from the file)",
        out.trim(),
    );
    let back = until(Duration::from_secs(60), &mut || {
        d.status("wl2").is_some_and(|s| s.summary.state == "active")
    });
    let pid1 = pid_of(d);
    let seen = qemu();
    c.check(
        back.is_some()
            && !pid1.is_empty()
            && pid1 != pid0
            && seen.is_some_and(|(t, _)| t == total(d)),
        "the restored wl2 is attached afresh (a new QEMU, its RAM as QEMU has it)",
        format!(
            "{:.1} s after restore returned; qemu pid {pid0} -> {pid1}; guest RAM {} (QEMU: {:?})",
            back.map_or(-1.0, |t| t.as_secs_f64()),
            ByteSize(total(d)),
            seen.map(|(t, dimm)| (ByteSize(t), ByteSize(dimm)))
        ),
    );
    let _ = std::fs::remove_file(&file);
}
