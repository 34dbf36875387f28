//! vmtierctl: talks to vmtierd over its control socket. Human output by default, `--json`
//! for scripts (the daemon's reply, verbatim).

mod client;
mod cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "vmtierctl",
    about = "Control vmtierd, the tiered memory manager for VMs"
)]
struct Cli {
    /// vmtierd's control socket.
    #[arg(
        long,
        env = "VMTIER_SOCKET",
        default_value = "/run/vmtier/vmtierd.sock"
    )]
    socket: PathBuf,
    /// Print the daemon's JSON reply instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// libvirt connection URI, as virsh's `-c` (for dom-tier, dom-stats).
    #[arg(
        short = 'c',
        long = "connect",
        global = true,
        env = "LIBVIRT_DEFAULT_URI",
        default_value = vmtier_libvirt::conn::DEFAULT_URI
    )]
    uri: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List managed VMs.
    List,
    /// Show one VM: bytes per node, heat histogram, migration counters.
    Status(cmd::status::Args),
    /// Change a VM's DRAM budget (effective at the next tick).
    SetBudget(cmd::set_budget::Args),
    /// Start managing a VM.
    Attach(cmd::attach::Args),
    /// Stop managing a VM; its pages stay where they are.
    Detach(cmd::detach::Args),
    /// Show or change a libvirt domain's vmtier metadata (budget, policy, rate), through
    /// libvirt: vmtierd follows it within a tick.
    DomTier(cmd::dom_tier::Args),
    /// A libvirt domain's vmtier metadata and vmtierd's status of it.
    DomStats(cmd::dom_stats::Args),
    /// The host's NUMA nodes: memory, CPUs, memory tier.
    Nodes,
    /// Tell vmtierd about a libvirt hook call (run by /etc/libvirt/hooks/qemu.d/vmtier).
    #[command(hide = true)]
    LibvirtHook(cmd::libvirt_hook::Args),
    /// Shell completion script on stdout.
    Completions(cmd::completions::Args),
    /// The man page (roff) on stdout.
    Man,
    /// Show or change a VM's tiering: budget, policy and its parameters, enabled.
    Tiering(cmd::tiering::Args),
    /// Live view of every VM: DRAM/CXL, hot share, moves per second, budget drains.
    Top(cmd::top::Args),
    /// Draw a VM's recent ticks (guest-physical address × time, heat and tier) as SVG or PNG.
    Heatmap(cmd::heatmap::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let client = client::Client::new(cli.socket, cli.json);
    let r = match cli.cmd {
        Cmd::List => cmd::list::run(&client),
        Cmd::Status(a) => cmd::status::run(&client, &a),
        Cmd::SetBudget(a) => cmd::set_budget::run(&client, &a),
        Cmd::Attach(a) => cmd::attach::run(&client, a),
        Cmd::Detach(a) => cmd::detach::run(&client, &a),
        Cmd::DomTier(a) => cmd::dom_tier::run(&cli.uri, &a),
        Cmd::DomStats(a) => cmd::dom_stats::run(&client, &cli.uri, &a),
        Cmd::Nodes => cmd::nodes::run(cli.json),
        Cmd::LibvirtHook(a) => cmd::libvirt_hook::run(&client, &a),
        Cmd::Completions(a) => {
            cmd::completions::run(Cli::command(), &a);
            Ok(())
        }
        Cmd::Man => cmd::completions::man(Cli::command()),
        Cmd::Tiering(a) => cmd::tiering::run(&client, &a),
        Cmd::Top(a) => cmd::top::run(&client, &a),
        Cmd::Heatmap(a) => cmd::heatmap::run(&client, &a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vmtierctl: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            ExitCode::FAILURE
        }
    }
}
