//! `tbcheck`: checks run inside the tiered testbed host. Each subcommand prints
//! `ok - NAME: detail` or `not ok - NAME: detail` per assertion and exits non-zero if any
//! failed.

mod check;
mod demo;
mod guest;
mod mem;
mod sanity;
mod sources;

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
    /// The demo: guest RAM on CXL, live residency, hot set moved to DRAM.
    Demo(demo::DemoArgs),
    /// Hotness sources (DAMON fvaddr, soft-dirty) rank a hot buffer part above a cold one.
    Sources(sources::SourcesArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut c = check::Checks::default();
    match cli.cmd {
        Cmd::Tiers => sanity::tiers(&mut c),
        Cmd::MovePages(a) => mem::move_pages(&mut c, &a),
        Cmd::Guest(a) => guest::run(&mut c, &a),
        Cmd::Demo(a) => demo::run(&mut c, &a),
        Cmd::Sources(a) => sources::run(&mut c, &a),
    }
    c.finish()
}
