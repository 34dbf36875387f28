//! One module per subcommand.

pub mod attach;
pub mod completions;
pub mod detach;
pub mod dom_stats;
pub mod dom_tier;
pub mod heatmap;
pub mod libvirt_hook;
pub mod list;
pub mod nodes;
pub mod set_budget;
pub mod status;
pub mod tiering;
pub mod top;

/// Prints a `done` reply's message unless `--json` already printed the reply.
fn print_done(client: &crate::client::Client, reply: &vmtier_api::proto::Reply) {
    if let (false, vmtier_api::proto::Reply::Done { message }) = (client.json, reply) {
        println!("{message}");
    }
}
