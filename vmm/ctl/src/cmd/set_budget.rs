//! `vmtierctl set-budget VM SIZE`.

use vmtier_api::proto::Request;
use vmtier_core::{ByteSize, VmId};

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The VM.
    vm: VmId,
    /// New DRAM budget (e.g. 64M, 2G).
    budget: ByteSize,
}

pub fn run(client: &Client, a: &Args) -> Result<(), Error> {
    let reply = client.call(&Request::SetBudget {
        vm: a.vm.clone(),
        budget: a.budget,
    })?;
    super::print_done(client, &reply);
    Ok(())
}
