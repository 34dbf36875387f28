//! `vmtierctl dom-tier DOM [--budget SIZE] [--policy NAME] [--rate SIZE] [--enable|--disable]
//! [--pin START:SIZE:TIER ...|--unpin] [--live] [--config]`: a libvirt domain's vmtier metadata, shown or changed through
//! libvirt (so `virsh metadata` and vmtierctl always agree; vmtierd follows the change).

use vmtier_api::pin::Pin;
use vmtier_core::ByteSize;
use vmtier_libvirt::conn::{self, Libvirt};
use vmtier_libvirt::metadata::{self, Tiering};

use crate::client::Error;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Domain name or UUID.
    domain: String,
    /// DRAM budget (`4G`, `512M`).
    #[arg(long)]
    budget: Option<ByteSize>,
    /// Placement policy (vmtierd's registry names).
    #[arg(long)]
    policy: Option<String>,
    /// Migration rate limit of this domain, per second (`100M`).
    #[arg(long)]
    rate: Option<ByteSize>,
    /// Let vmtierd manage the domain (`enabled="yes"`).
    #[arg(long, conflicts_with = "disable")]
    enable: bool,
    /// Make vmtierd leave the domain alone (`enabled="no"`).
    #[arg(long)]
    disable: bool,
    /// Pin a guest-physical range to a tier, `START:SIZE:TIER` (`0x0:16M:dram`,
    /// `0x40000000:1G:cxl`); repeat for several. Replaces the domain's pins.
    #[arg(long, value_name = "START:SIZE:TIER")]
    pin: Vec<Pin>,
    /// Remove every pinned range.
    #[arg(long, conflicts_with = "pin")]
    unpin: bool,
    /// Change the running domain.
    #[arg(long)]
    live: bool,
    /// Change the persistent definition (next boot).
    #[arg(long)]
    config: bool,
}

/// The settings after applying `a` to `old` (`None`: the domain has none yet).
pub fn merge(old: Option<Tiering>, a: &Args) -> Result<Tiering, String> {
    let mut t = match (old, a.budget) {
        (Some(t), _) => t,
        (None, Some(b)) => Tiering::with_budget(b),
        (None, None) => return Err("The domain has no vmtier metadata yet: give --budget".into()),
    };
    if let Some(b) = a.budget {
        t.budget = b;
    }
    if let Some(p) = &a.policy {
        t.policy = Some(p.clone());
    }
    if let Some(r) = a.rate {
        t.rate = Some(r);
    }
    if a.enable {
        t.enabled = true;
    }
    if a.disable {
        t.enabled = false;
    }
    if !a.pin.is_empty() {
        t.pins.clone_from(&a.pin);
    }
    if a.unpin {
        t.pins.clear();
    }
    // Checked exactly as vmtierd will read it.
    Tiering::parse(&t.to_xml()).map_err(|e| e.to_string())
}

pub fn run(uri: &str, a: &Args) -> Result<(), Error> {
    let lv = Libvirt::open(uri).map_err(Error::libvirt)?;
    let dom = lv.lookup(&a.domain).map_err(Error::libvirt)?;
    let live = a.live || (!a.config && dom.is_active().unwrap_or(false));
    let text = conn::metadata(&dom, live).map_err(Error::libvirt)?;
    let old = match text.as_deref().map(Tiering::parse) {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(e)) if a.budget.is_some() => {
            eprintln!("vmtierctl: replacing invalid metadata ({e})");
            None
        }
        Some(Err(e)) => return Err(Error::Refused(format!("Invalid vmtier metadata: {e}"))),
    };
    let change = a.budget.is_some()
        || a.policy.is_some()
        || a.rate.is_some()
        || a.enable
        || a.disable
        || !a.pin.is_empty()
        || a.unpin;
    if !change {
        match old {
            Some(t) => println!("{}", t.to_xml()),
            None => println!("{}: no vmtier metadata ({})", a.domain, metadata::NAMESPACE),
        }
        return Ok(());
    }
    let new = merge(old, a).map_err(Error::Refused)?;
    conn::set_metadata(&dom, Some(&new), a.live, a.config).map_err(Error::libvirt)?;
    println!("{}", new.to_xml());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(budget: Option<u64>, policy: Option<&str>, disable: bool) -> Args {
        Args {
            domain: "d".into(),
            budget: budget.map(ByteSize),
            policy: policy.map(str::to_owned),
            rate: None,
            enable: false,
            disable,
            pin: vec![],
            unpin: false,
            live: false,
            config: false,
        }
    }

    #[test]
    fn changes_merge_into_the_metadata_and_are_checked() {
        let old = Tiering::with_budget(ByteSize(1 << 30));
        type Want = Result<(u64, Option<&'static str>, bool), &'static str>;
        let cases: Vec<(Option<Tiering>, Args, Want)> = vec![
            (
                Some(old.clone()),
                args(Some(2 << 30), None, false),
                Ok((2 << 30, None, true)),
            ),
            (
                Some(old.clone()),
                args(None, Some("memtierd"), false),
                Ok((1 << 30, Some("memtierd"), true)),
            ),
            (
                Some(old.clone()),
                args(None, None, true),
                Ok((1 << 30, None, false)),
            ),
            (
                None,
                args(Some(64 << 20), None, false),
                Ok((64 << 20, None, true)),
            ),
            (
                None,
                args(None, Some("default"), false),
                Err("The domain has no vmtier metadata yet"),
            ),
            (
                Some(old),
                args(None, Some("Bad"), false),
                Err("Attribute policy=\"Bad\""),
            ),
        ];
        for (o, a, want) in cases {
            match (merge(o, &a), want) {
                (Ok(t), Ok((b, p, e))) => {
                    assert_eq!(
                        (t.budget.0, t.policy.as_deref(), t.enabled),
                        (b, p, e),
                        "{a:?}"
                    );
                }
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{e} vs {w}"),
                (got, _) => panic!("{a:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn pins_parse_merge_and_are_checked_against_the_budget() {
        let old = Tiering::with_budget(ByteSize(48 << 20));
        let with = |pins: &[&str], unpin: bool| {
            let mut a = args(None, None, false);
            a.pin = pins.iter().map(|p| p.parse::<Pin>().unwrap()).collect();
            a.unpin = unpin;
            a
        };
        let mut pinned = old.clone();
        pinned.pins = vec!["0x1000000:16M:dram".parse::<Pin>().unwrap()];
        let cases: Vec<(Tiering, Args, Result<usize, &str>)> = vec![
            (old.clone(), with(&["0x1000000:16M:dram"], false), Ok(1)),
            (
                old.clone(),
                with(&["0:8M:dram", "8388608:1G:cxl"], false),
                Ok(2),
            ),
            (pinned.clone(), with(&[], true), Ok(0)),
            (pinned.clone(), args(Some(32 << 20), None, false), Ok(1)),
            (
                old.clone(),
                with(&["0x0:64M:dram"], false),
                Err("Element <pin>: Pinned DRAM 64 MiB exceeds the budget 48 MiB"),
            ),
            (
                pinned,
                args(Some(8 << 20), None, false),
                Err("Element <pin>: Pinned DRAM 16 MiB exceeds the budget 8 MiB"),
            ),
        ];
        for (o, a, want) in cases {
            match (merge(Some(o), &a), want) {
                (Ok(t), Ok(n)) => assert_eq!(t.pins.len(), n, "{a:?}"),
                (Err(e), Err(w)) => assert!(e.starts_with(w), "{e} vs {w}"),
                (got, _) => panic!("{a:?}: {got:?}"),
            }
        }
    }
}
