//! `vmtierctl libvirt-hook DOMAIN OP`: what the libvirt hook (tools/libvirt-hook) runs to
//! tell vmtierd that a domain is being prepared, started or released.

use vmtier_api::proto::Request;

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The domain's name, as libvirt passes it to the hook.
    domain: String,
    /// The operation (`prepare`, `start`, `started`, `stopped`, `release`...).
    op: String,
}

pub fn run(client: &Client, a: &Args) -> Result<(), Error> {
    let reply = client.call(&Request::LibvirtHook {
        domain: a.domain.clone(),
        op: a.op.clone(),
    })?;
    super::print_done(client, &reply);
    Ok(())
}
