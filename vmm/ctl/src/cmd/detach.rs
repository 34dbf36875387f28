//! `vmtierctl detach VM`.

use vmtier_api::proto::Request;
use vmtier_core::VmId;

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The VM.
    vm: VmId,
}

pub fn run(client: &Client, a: &Args) -> Result<(), Error> {
    let reply = client.call(&Request::Detach { vm: a.vm.clone() })?;
    super::print_done(client, &reply);
    Ok(())
}
