//! `vmtierctl attach NAME --budget SIZE (--qmp SOCKET [--pid PID] | --pid PID --range START:LEN...)
//! [--hints SOCKET] [--pin START:SIZE:TIER ...]`.

use std::path::PathBuf;

use vmtier_api::proto::Request;
use vmtier_api::vm::{RangeConfig, VmConfig};
use vmtier_core::{ByteSize, HostVirtAddr, ProcessId, VmId};

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Name for the VM.
    name: VmId,
    /// DRAM budget (e.g. 64M, 2G).
    #[arg(long)]
    budget: ByteSize,
    /// QEMU's QMP unix socket.
    #[arg(long, conflicts_with = "range")]
    qmp: Option<PathBuf>,
    /// With --qmp: QEMU's pid when a proxy serves the socket. Alone (with --range): a plain
    /// process to manage instead of a QEMU guest.
    #[arg(long)]
    pid: Option<i32>,
    /// With --pid alone: a range START:LEN (START in hex with 0x, LEN with units), repeatable.
    #[arg(long, value_parser = parse_range, requires = "pid")]
    range: Vec<RangeConfig>,
    /// The guest hint channel: QEMU's chardev socket (`[vm.hints]` with its defaults).
    #[arg(long)]
    hints: Option<PathBuf>,
    /// Pin a guest-physical range to a tier, `START:SIZE:TIER` (`0x0:16M:dram`); repeatable.
    #[arg(long, value_name = "START:SIZE:TIER")]
    pin: Vec<vmtier_api::pin::Pin>,
}

fn parse_range(s: &str) -> Result<RangeConfig, String> {
    let (start, len) = s
        .split_once(':')
        .ok_or("expected START:LEN, e.g. 0x7f0000000000:64M")?;
    let hex = start
        .strip_prefix("0x")
        .ok_or("START must be hexadecimal with 0x")?;
    let start =
        u64::from_str_radix(hex, 16).map_err(|_| format!("START {start:?} is not hexadecimal"))?;
    let len: ByteSize = len.parse().map_err(|e| format!("{e}"))?;
    Ok(RangeConfig {
        start: HostVirtAddr::new(start),
        len,
    })
}

pub fn run(client: &Client, a: Args) -> Result<(), Error> {
    let vm = VmConfig {
        name: a.name,
        budget: a.budget,
        qmp: a.qmp,
        pid: a.pid.map(ProcessId::new),
        ranges: a.range,
        hints: a.hints.map(vmtier_api::hints::HintsConfig::new),
        pins: a.pin,
    };
    vm.validate().map_err(|e| Error::Refused(e.to_string()))?;
    let reply = client.call(&Request::Attach { vm })?;
    super::print_done(client, &reply);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse() {
        let cases = [
            ("0x7f0000000000:64M", Some((0x7f00_0000_0000, 64 << 20))),
            ("0x1000:4096", Some((0x1000, 4096))),
            ("7f00:64M", None),
            ("0x7f00", None),
            ("0xzz:1M", None),
            ("0x1000:much", None),
        ];
        for (text, want) in cases {
            let got = parse_range(text).ok().map(|r| (r.start.raw(), r.len.0));
            assert_eq!(got, want, "{text}");
        }
    }
}
