//! `vmtierctl list`.

use vmtier_api::proto::{Reply, Request};
use vmtier_core::ByteSize;

use crate::client::{Client, Error};

pub fn run(client: &Client) -> Result<(), Error> {
    let reply = client.call(&Request::List {})?;
    if client.json {
        return Ok(());
    }
    let Reply::List { vms } = reply else {
        return Err(Error::Reply(format!("{reply:?}")));
    };
    println!(
        "{:<16} {:<10} {:>12} {:>12} {:>12} {:>12}",
        "VM", "STATE", "BUDGET", "DRAM", "CXL", "TOTAL"
    );
    for v in vms {
        println!(
            "{:<16} {:<10} {:>12} {:>12} {:>12} {:>12}",
            v.name.as_str(),
            v.state,
            ByteSize(v.budget_bytes).to_string(),
            ByteSize(v.fast_bytes).to_string(),
            ByteSize(v.slow_bytes).to_string(),
            ByteSize(v.total_bytes).to_string()
        );
    }
    Ok(())
}
