//! The demo: the workload guest starts with all its RAM on the CXL node; its per-node
//! residency is shown live; then its hot set is moved to DRAM with move_pages(2) and the
//! residency shown again. (vmtierd takes over the moving in the daemon's issue.)

use std::time::{Duration, Instant};

use vmtier_backends::qemu::QemuBackend;
use vmtier_core::migrate::{Migrator, PageRef};
use vmtier_core::{ByteSize, GuestMemoryLayout, GuestPhysAddr, NodeId, PageSize};
use vmtier_migrate::MovePages;

use crate::check::Checks;
use crate::guest::{gpa_residency, num, residency, Guest};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: std::path::PathBuf,
    /// Guest RAM.
    #[arg(long, default_value = "256M")]
    ram: ByteSize,
    /// Hot-set size.
    #[arg(long, default_value = "32M")]
    hot: ByteSize,
    /// Seconds to show residency before and after the move.
    #[arg(long, default_value_t = 4)]
    seconds: u64,
}

fn show(
    t0: Instant,
    layout: &GuestMemoryLayout,
    hot: (u64, u64),
    guest: &mut Guest,
) -> (u64, u64, u64) {
    let all = residency(layout).map_or((0, 0), |r| (r.on(NodeId::new(0)), r.on(NodeId::new(1))));
    let hot_dram = gpa_residency(layout, hot.0, hot.1).map_or(0, |r| r.on(NodeId::new(0)));
    guest.poll();
    let touches = guest
        .seen
        .iter()
        .rev()
        .find_map(|l| {
            l.starts_with("WG progress")
                .then(|| num(l, "touches"))
                .flatten()
        })
        .unwrap_or(0);
    println!(
        "t={:>5.1} s  DRAM (node 0) {:>10}  CXL (node 1) {:>10}  hot set in DRAM {:>5.1}%  guest touches {touches}",
        t0.elapsed().as_secs_f64(),
        ByteSize(all.0).to_string(),
        ByteSize(all.1).to_string(),
        100.0 * hot_dram as f64 / hot.1.max(1) as f64,
    );
    (all.0, all.1, hot_dram)
}

pub fn run(c: &mut Checks, a: &DemoArgs) {
    println!(
        "vmtier demo: workload guest with {} RAM on the CXL node, {} hot set",
        a.ram, a.hot
    );
    println!("(times are TCG-emulated inside the tiered host: compare them only with each other)");
    let append = format!("hot={}K report=1 duration=900", a.hot.0 >> 10);
    let mut g = match Guest::start("qemu-system-x86_64", &a.elf, a.ram, 1, &append) {
        Ok(g) => g,
        Err(e) => return c.fatal("start QEMU", e),
    };
    let Some(start) = g.wait_for("WG start", Duration::from_secs(60)) else {
        return c.fatal("guest starts", "no 'WG start' line");
    };
    let hot = (
        num(&start, "hot_start").unwrap_or(0),
        num(&start, "hot_bytes").unwrap_or(0),
    );
    println!("filling guest RAM with a verifiable pattern...");
    if g.wait_for("WG filled", Duration::from_secs(600)).is_none() {
        return c.fatal("guest fills its RAM", "no 'WG filled'");
    }
    let layout = match QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .and_then(|mut b| b.discover())
    {
        Ok(l) => l,
        Err(e) => return c.fatal("locate guest RAM through QMP", e),
    };
    let t0 = Instant::now();
    let before = show(t0, &layout, hot, &mut g);
    for _ in 0..a.seconds {
        std::thread::sleep(Duration::from_secs(1));
        show(t0, &layout, hot, &mut g);
    }
    println!(
        "moving the hot set ({} at gpa {:#x}) to DRAM with move_pages(2)...",
        ByteSize(hot.1),
        hot.0
    );
    let pages: Vec<PageRef> = (0..hot.1 / PageSize::Base.bytes())
        .filter_map(|i| layout.translate(GuestPhysAddr(hot.0 + i * PageSize::Base.bytes())))
        .map(|addr| PageRef {
            addr,
            size: PageSize::Base,
        })
        .collect();
    let moved = MovePages::default().migrate(layout.pid, &pages, NodeId::new(0));
    if let Ok(r) = &moved {
        println!(
            "moved {} in {:.0} ms (emulated)",
            ByteSize(r.bytes_on_target),
            r.elapsed.as_secs_f64() * 1e3
        );
    }
    let mut after = before;
    for _ in 0..a.seconds {
        after = show(t0, &layout, hot, &mut g);
        std::thread::sleep(Duration::from_secs(1));
    }
    g.request_stop();
    let done = g
        .wait_for("WG done", Duration::from_secs(600))
        .unwrap_or_default();
    println!();
    println!("                     before        after");
    println!(
        "DRAM (node 0)  {:>12} {:>12}",
        ByteSize(before.0).to_string(),
        ByteSize(after.0).to_string()
    );
    println!(
        "CXL (node 1)   {:>12} {:>12}",
        ByteSize(before.1).to_string(),
        ByteSize(after.1).to_string()
    );
    println!(
        "hot set in DRAM{:>12} {:>12}",
        ByteSize(before.2).to_string(),
        ByteSize(after.2).to_string()
    );
    println!("guest: {done}");
    c.check(
        moved.is_ok() && after.2 * 10 >= hot.1 * 9,
        "hot set moved to DRAM",
        ByteSize(after.2),
    );
    c.check(
        num(&done, "corrupted") == Some(0),
        "guest saw no corruption",
        &done,
    );
}
