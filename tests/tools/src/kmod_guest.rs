//! The workload guest under QEMU, its RAM moved node 1 -> node 0 -> node 1 by the vmtier
//! module (through the combined migrator) while it runs and verifies itself.

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use vmtier_backends::qemu::QemuBackend;
use vmtier_core::migrate::{Migrator, PageOutcome, PageRef};
use vmtier_core::{ByteSize, GuestMemoryLayout, NodeId, PageSize};
use vmtier_migrate::{Combined, Engine, Kmod, KmodConfig, MovePages, Residency};

use crate::check::Checks;
use crate::guest::{num, Guest};
use crate::kmod::{kstat, sh};

#[derive(clap::Args, Debug)]
pub struct KmodGuestArgs {
    /// The workload guest kernel (multiboot ELF).
    #[arg(long)]
    elf: PathBuf,
    /// Directory holding vmtier.ko.
    #[arg(long, default_value = "target/kmod")]
    ko_dir: PathBuf,
    /// Guest RAM.
    #[arg(long, default_value = "128M")]
    ram: ByteSize,
    /// node1 -> node0 -> node1 rounds.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Copy engine.
    #[arg(long, default_value = "cpu")]
    engine: Engine,
    /// Keep THP enabled (guest RAM then moves by move_pages where it is THP-backed).
    #[arg(long)]
    thp: bool,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: String,
}

fn residency(layout: &GuestMemoryLayout, node: NodeId) -> (u64, u64) {
    let mut on = 0;
    let mut elsewhere = 0;
    for r in &layout.ranges {
        if let Ok(res) = Residency::of_range(layout.pid, r.hva, r.len) {
            for (n, b) in res.per_node {
                if n == node {
                    on += b;
                } else {
                    elsewhere += b;
                }
            }
        }
    }
    (on, elsewhere)
}

pub fn run(c: &mut Checks, a: &KmodGuestArgs) {
    if !std::path::Path::new(vmtier_migrate::kmod::DEVICE).exists() {
        let (ok, out) = sh(&format!("insmod {}/vmtier.ko", a.ko_dir.display()));
        if !c.check(ok, "insmod vmtier.ko", &out) {
            return;
        }
    }
    if !a.thp {
        let _ = fs::write("/sys/kernel/mm/transparent_hugepage/enabled", "never");
    }
    let mut g = match Guest::start(&a.qemu, &a.elf, a.ram, 1, "report=2 duration=900") {
        Ok(g) => g,
        Err(e) => return c.fatal("start QEMU", e),
    };
    let Some(_) = g.wait_for("WG start", Duration::from_secs(60)) else {
        return c.fatal("guest starts", "no 'WG start' line within 60 s");
    };
    let Some(filled) = g.wait_for("WG filled", Duration::from_secs(600)) else {
        return c.fatal("guest fills its RAM", "no 'WG filled'");
    };
    c.check(true, "guest fills its RAM", &filled);
    let layout = match QemuBackend::connect(&g.qmp, Duration::from_secs(10))
        .map_err(|e| e.to_string())
        .and_then(|mut b| b.discover().map_err(|e| e.to_string()))
    {
        Ok(l) => l,
        Err(e) => return c.fatal("locate guest RAM through QMP", e),
    };
    let total = layout.total_bytes();
    let page = PageSize::Base.bytes();
    let pages: Vec<PageRef> = layout
        .ranges
        .iter()
        .flat_map(|r| (0..r.len / page).filter_map(move |i| r.hva.checked_add(i * page)))
        .map(|addr| PageRef {
            addr,
            size: PageSize::Base,
        })
        .collect();
    let cfg = KmodConfig {
        engine: a.engine,
        workers: 2,
        batch: 0,
    };
    let kmod = match Kmod::open(cfg) {
        Ok(k) => k,
        Err(e) => return c.fatal("open /dev/vmtier", e),
    };
    let mut mover = Combined::with_kmod(Some(kmod), MovePages::default());
    mover.set_layout(&layout);
    let mut last_touches = 0;
    for round in 1..=a.rounds {
        for to in [0u32, 1] {
            let target = NodeId::new(to);
            let moved0 = kstat("pages_moved");
            let t = Instant::now();
            let report = match mover.migrate(layout.pid, &pages, target) {
                Ok(r) => r,
                Err(e) => return c.fatal(&format!("round {round}: move to node {to}"), e),
            };
            let by_module = (kstat("pages_moved") - moved0).max(0) as u64 * page;
            let bad = report
                .outcomes
                .iter()
                .filter(|o| {
                    !matches!(
                        o,
                        PageOutcome::OnTarget | PageOutcome::NotPresent | PageOutcome::Busy
                    )
                })
                .count();
            let (on, elsewhere) = residency(&layout, target);
            c.check(
                bad == 0 && elsewhere <= total / 100 && on > 0,
                &format!("round {round}: guest RAM moved to node {to} while running"),
                format!(
                    "{} on node {to}, {} elsewhere, {} by the module, {} busy, {:.0} ms \
                     (emulated)",
                    ByteSize(on),
                    ByteSize(elsewhere),
                    ByteSize(by_module),
                    report.count(PageOutcome::Busy),
                    t.elapsed().as_secs_f64() * 1e3
                ),
            );
            if !a.thp {
                c.check(
                    by_module >= on.saturating_sub(total / 10),
                    &format!("round {round}: the module moved the guest RAM to node {to}"),
                    format!("{} by the module", ByteSize(by_module)),
                );
            }
            g.poll();
        }
        let _ = g.wait_for("WG progress", Duration::from_secs(60));
        let touches = g.touches();
        c.check(
            touches > last_touches,
            &format!("round {round}: guest runs during migration"),
            format!("touches {touches}"),
        );
        last_touches = touches;
    }
    g.request_stop();
    let Some(done) = g.wait_for("WG done", Duration::from_secs(600)) else {
        return c.fatal("guest finishes", "no 'WG done' line");
    };
    let corrupt = g
        .seen
        .iter()
        .filter(|l| l.starts_with("WG corrupt"))
        .count();
    c.check(
        corrupt == 0 && num(&done, "corrupted") == Some(0) && num(&done, "sweeps") >= Some(1),
        "guest reports zero corrupted words after module migration",
        &done,
    );
    let exit = g.wait_exit(Duration::from_secs(30));
    c.check(
        exit == Some(1),
        "QEMU exit status says pass",
        format!("{exit:?}"),
    );
}
