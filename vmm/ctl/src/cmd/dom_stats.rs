//! `vmtierctl dom-stats DOM`: a libvirt domain's vmtier metadata and vmtierd's view of it.

use vmtier_api::proto::{Reply, Request};
use vmtier_core::VmId;
use vmtier_libvirt::conn::{self, Libvirt};
use vmtier_libvirt::metadata::Tiering;

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Domain name or UUID.
    domain: String,
}

pub fn run(client: &Client, uri: &str, a: &Args) -> Result<(), Error> {
    let lv = Libvirt::open(uri).map_err(Error::libvirt)?;
    let dom = lv.lookup(&a.domain).map_err(Error::libvirt)?;
    let name = dom
        .get_name()
        .map_err(|e| Error::Refused(format!("Cannot read the domain's name: {e}")))?;
    let active = dom.is_active().unwrap_or(false);
    if !client.json {
        println!(
            "{name}  {}  uuid {}",
            if active { "running" } else { "shut off" },
            dom.get_uuid_string().unwrap_or_default()
        );
        let meta = conn::metadata(&dom, active).map_err(Error::libvirt)?;
        match meta.as_deref().map(|m| (m, Tiering::parse(m))) {
            None => println!("  metadata: none (vmtierd leaves it alone unless manage_all)"),
            Some((_, Ok(t))) => println!("  metadata: {}", t.to_xml()),
            Some((m, Err(e))) => println!("  metadata: INVALID ({e}): {m}"),
        }
    }
    let vm: VmId = name
        .parse()
        .map_err(|e| Error::Refused(format!("{name}: {e}")))?;
    match client.call(&Request::Status { vm }) {
        Ok(Reply::Status(s)) if !client.json => print!("{}", super::status::render(&s)),
        Ok(_) => {}
        Err(Error::Refused(m)) if !client.json => println!("  vmtierd: {m}"),
        Err(e) => return Err(e),
    }
    Ok(())
}
