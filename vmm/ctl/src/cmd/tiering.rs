//! `vmtierctl tiering VM [--budget SIZE] [--policy NAME] [--params JSON] [--enable|--disable]
//! [--pin START:SIZE:TIER ...|--unpin]`:
//! shows a VM's tiering settings, or changes them (all or nothing).

use vmtier_api::proto::{Reply, Request, Tiering, TieringChange};
use vmtier_core::{ByteSize, VmId};

use crate::client::{Client, Error};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The VM.
    vm: VmId,
    /// New DRAM budget (e.g. 64M, 2G).
    #[arg(long)]
    budget: Option<ByteSize>,
    /// New placement policy (default, memtierd, first-touch); starts without history.
    #[arg(long)]
    policy: Option<String>,
    /// The policy's parameters as a JSON object, e.g. '{"swap_margin":4}'.
    #[arg(long, value_parser = parse_params)]
    params: Option<serde_json::Map<String, serde_json::Value>>,
    /// Resume placing the VM's memory.
    #[arg(long, conflicts_with = "disable")]
    enable: bool,
    /// Pause: ticks leave the VM's pages where they are.
    #[arg(long)]
    disable: bool,
    /// Pin a guest-physical range to a tier, `START:SIZE:TIER` (`0x0:16M:dram`,
    /// `0x40000000:1G:cxl`); repeatable; replaces the VM's pins.
    #[arg(long, value_name = "START:SIZE:TIER")]
    pin: Vec<vmtier_api::pin::Pin>,
    /// Remove every pinned range.
    #[arg(long, conflicts_with = "pin")]
    unpin: bool,
}

fn parse_params(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err("give a JSON object, e.g. '{\"swap_margin\":4}'".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

/// The request `a` asks for: a read without options, else a change.
fn request(a: &Args) -> Request {
    let change = TieringChange {
        budget: a.budget,
        policy: a.policy.clone(),
        params: a.params.clone(),
        enabled: match (a.enable, a.disable) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        pins: match (a.pin.is_empty(), a.unpin) {
            (false, _) => Some(a.pin.clone()),
            (true, true) => Some(Vec::new()),
            (true, false) => None,
        },
    };
    if change.is_empty() {
        Request::Tiering { vm: a.vm.clone() }
    } else {
        Request::SetTiering {
            vm: a.vm.clone(),
            change,
        }
    }
}

/// The human view.
fn render(vm: &VmId, t: &Tiering) -> String {
    let params = t.params.as_ref().map_or_else(
        || "daemon's".to_owned(),
        |p| serde_json::Value::Object(p.clone()).to_string(),
    );
    let pins: String = t.pins.iter().map(|p| format!(", pinned {p}")).collect();
    format!(
        "{vm}: budget {}, policy {} (params {params}), {}{pins}\n",
        ByteSize(t.budget_bytes),
        t.policy,
        if t.enabled { "enabled" } else { "paused" }
    )
}

pub fn run(client: &Client, a: &Args) -> Result<(), Error> {
    let reply = client.call(&request(a))?;
    if client.json {
        return Ok(());
    }
    let Reply::Tiering(t) = reply else {
        return Err(Error::Reply(format!("{reply:?}")));
    };
    print!("{}", render(&a.vm, &t));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        a: Args,
    }

    #[test]
    fn options_become_a_read_or_a_change() {
        let cases: [(&[&str], Option<&str>); 6] = [
            (&["web1"], Some(r#"{"cmd":"tiering","vm":"web1"}"#)),
            (
                &["web1", "--budget", "64M"],
                Some(r#"{"cmd":"set-tiering","vm":"web1","change":{"budget":67108864}}"#),
            ),
            (
                &["web1", "--disable"],
                Some(r#"{"cmd":"set-tiering","vm":"web1","change":{"enabled":false}}"#),
            ),
            (
                &["web1", "--policy", "memtierd", "--params", r#"{"a":1}"#],
                Some(
                    r#"{"cmd":"set-tiering","vm":"web1","change":{"policy":"memtierd","params":{"a":1}}}"#,
                ),
            ),
            (&["web1", "--enable", "--disable"], None),
            (&["web1", "--params", "[1]"], None),
        ];
        for (args, want) in cases {
            let argv = std::iter::once("t").chain(args.iter().copied());
            let got = Cli::try_parse_from(argv)
                .ok()
                .map(|c| serde_json::to_string(&request(&c.a)).unwrap());
            assert_eq!(got.as_deref(), want, "{args:?}");
        }
    }

    #[test]
    fn settings_render_on_one_line() {
        let t = Tiering {
            budget_bytes: 64 << 20,
            policy: "default".into(),
            params: None,
            enabled: false,
            pins: vec![],
        };
        assert_eq!(
            render(&"web1".parse().unwrap(), &t),
            "web1: budget 64 MiB, policy default (params daemon's), paused\n"
        );
    }
}
