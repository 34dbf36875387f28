//! `tbcheck`: checks run inside the tiered testbed host. Each subcommand prints
//! `ok - NAME: detail` or `not ok - NAME: detail` per assertion and exits non-zero if any
//! failed.

// bench-e2e's per-row `json!` has more keys than serde_json's macro recursion allows by default.
#![recursion_limit = "256"]

mod agent;
mod api;
mod bench_e2e;
mod check;
mod cpu_bench;
mod cpu_factor;
mod daemon;
mod faults;
mod guest;
mod heatmap;
mod hints;
mod kmod;
mod kmod_abi;
mod kmod_bench;
mod kmod_dma;
mod kmod_errors;
mod kmod_fuzz;
mod kmod_isolation;
mod kmod_skips;
mod kmod_writeback;
mod libvirt;
mod mem;
mod sanity;
mod soak;
mod sources;
mod tracing;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(about = "Checks run inside the vmtier tiered testbed host")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two memory tiers, a CPU-less node 1, DAMON sysfs with vaddr and paddr, demotion knobs.
    Tiers,
    /// move_pages(2) of an anonymous buffer node1 -> node0 -> node1, statuses and data checked.
    MovePages(mem::MovePagesArgs),
    /// Runs the workload guest under QEMU and moves its RAM between nodes while it runs.
    Guest(guest::GuestArgs),
    /// vmtierd end to end on the workload guest: promotion, budget cut, moving hot set
    /// (`--demo`: the demo's live view and summary table).
    Daemon(daemon::DaemonArgs),
    /// vmtierd under faults and bad input.
    DaemonFaults(faults::FaultsArgs),
    /// Hotness sources (DAMON fvaddr, soft-dirty) rank a hot buffer part above a cold one.
    Sources(sources::SourcesArgs),
    /// The vmtier kernel module: load, QUERY, integrity per engine, bad input, DMA faults.
    Kmod(kmod::KmodArgs),
    /// move_pages(2) vs the vmtier module's engines: GB/s table and JSON (emulated here).
    KmodBench(kmod_bench::KmodBenchArgs),
    /// Random and mutated ioctls against a target that maps, unmaps, forks and exits.
    KmodFuzz(kmod_fuzz::KmodFuzzArgs),
    /// The module racing swap-out writeback (swap on a slow null_blk device).
    KmodWriteback(kmod_writeback::KmodWritebackArgs),
    /// vmtierd vs NUMA balancing vs DAMOS on the same guest: table and JSON (figures only).
    BenchE2e(bench_e2e::BenchE2eArgs),
    /// bench-e2e's charts (hot memory in DRAM and DRAM used over time, per shape and page
    /// backing) drawn again from its JSON, as SVG or PNG.
    BenchE2ePlot(bench_e2e::plot::PlotArgs),
    /// Soak: ≥ N page migrations by vmtierd (move_pages and the module, 4 KiB and THP)
    /// under changing budgets while the guest writes; table and JSON, zero corruption.
    Soak(soak::SoakArgs),
    /// vmtierd following a real libvirtd: domains found from their metadata, budget changes
    /// with virsh, domains attached and detached as they start and stop.
    Libvirt(libvirt::LibvirtArgs),
    /// vmtierd following a libvirt domain's lifecycle: a DIMM hotplugged live, virsh save
    /// (the migration stream) and restore (an incoming migration), destroy.
    LibvirtLifecycle(libvirt::LibvirtArgs),
    /// vmtierd with guest hints: a hinted VM against an unhinted twin (ticks to place the
    /// hot set), or (`--evil`) a malicious hint sender beside a normal VM.
    Hints(hints::HintsArgs),
    /// Inside the tiered host: the guest agent marks known buffers and snapshots on request.
    AgentGuest(agent::GuestArgs),
    /// On the machine: runs the testbed with the agent port and checks the agent's frames.
    AgentHost(agent::HostArgs),
    /// vmtierd's HTTP API on the workload guest: budget through the API (DRAM follows),
    /// refusals change nothing, /metrics checked by promtool, schemathesis contract test.
    Api(api::ApiArgs),
    /// vmtierd's CPU time per tick on a local process, per tracking mode: quiet ticks apart
    /// from moving ones, fixed + per GiB over sizes, emulation factors; table and JSON
    /// (`make bench-cpu`: natively, or in the testbed when this host has no usable source).
    CpuBench(cpu_bench::CpuBenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Checks that run vmtierd's engine in this process (cpu-bench) log as vmtierd would,
    // when asked: RUST_LOG=vmtier_daemon::engine=debug.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = env_logger::try_init();
    }
    let mut c = check::Checks::default();
    match cli.cmd {
        Cmd::Tiers => sanity::tiers(&mut c),
        Cmd::MovePages(a) => mem::move_pages(&mut c, &a),
        Cmd::Guest(a) => guest::run(&mut c, &a),
        Cmd::Daemon(a) => daemon::run(&mut c, &a),
        Cmd::DaemonFaults(a) => faults::run(&mut c, &a),
        Cmd::Kmod(a) => kmod::run(&mut c, &a),
        Cmd::KmodBench(a) => kmod_bench::run(&mut c, &a),
        Cmd::KmodFuzz(a) => kmod_fuzz::run(&mut c, &a),
        Cmd::KmodWriteback(a) => kmod_writeback::main(&mut c, &a),
        Cmd::BenchE2e(a) => bench_e2e::run(&mut c, &a),
        Cmd::BenchE2ePlot(a) => bench_e2e::plot::run(&mut c, &a),
        Cmd::Sources(a) => sources::run(&mut c, &a),
        Cmd::Soak(a) => soak::run(&mut c, &a),
        Cmd::Libvirt(a) => libvirt::run(&mut c, &a),
        Cmd::LibvirtLifecycle(a) => libvirt::run_lifecycle(&mut c, &a),
        Cmd::Hints(a) => hints::run(&mut c, &a),
        Cmd::AgentGuest(a) => agent::guest(&mut c, &a),
        Cmd::AgentHost(a) => agent::host(&mut c, &a),
        Cmd::Api(a) => api::run(&mut c, &a),
        Cmd::CpuBench(a) => cpu_bench::run(&mut c, &a),
    }
    c.finish()
}
