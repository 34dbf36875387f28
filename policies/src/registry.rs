//! The static registry of policies: a name, a one-line description, and a constructor that
//! takes the policy's own config table (unknown keys refused).

use vmtier_core::policy::PlacementPolicy;

/// Errors building a policy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No policy has this name.
    #[error("Unknown policy {0}")]
    Unknown(String),
    /// The policy's config does not parse.
    #[error("Invalid config for policy {0}")]
    Config(&'static str, #[source] toml::de::Error),
}

/// Builds a boxed policy from an optional config table.
pub type Constructor = fn(Option<&toml::Table>) -> Result<Box<dyn PlacementPolicy>, Error>;

/// One registry row.
#[derive(Debug)]
pub struct Entry {
    /// Name used in configs and on the command line.
    pub name: &'static str,
    /// What it models.
    pub about: &'static str,
    /// Constructor.
    pub build: Constructor,
}

fn parse<T: serde::de::DeserializeOwned + Default>(
    name: &'static str,
    cfg: Option<&toml::Table>,
) -> Result<T, Error> {
    match cfg {
        None => Ok(T::default()),
        Some(t) => toml::Value::Table(t.clone())
            .try_into()
            .map_err(|e| Error::Config(name, e)),
    }
}

/// Every policy, in report order.
pub static REGISTRY: &[Entry] = &[
    Entry {
        name: "default",
        about: "vmtier: heat-ranked, budget-sized, hysteresis",
        build: |c| {
            Ok(Box::new(crate::default::DefaultPolicy::new(parse(
                "default", c,
            )?)))
        },
    },
    Entry {
        name: "numab",
        about: "Linux NUMA balancing tiering mode (numa_balancing=2)",
        build: |c| {
            Ok(Box::new(crate::numab::NumaBalancing::new(parse(
                "numab", c,
            )?)))
        },
    },
    Entry {
        name: "tpp",
        about: "TPP (ASPLOS'23): active-page promotion, decoupled watermarks",
        build: |c| Ok(Box::new(crate::tpp::Tpp::new(parse("tpp", c)?))),
    },
    Entry {
        name: "memtis",
        about: "Memtis-like (SOSP'23): sampled histogram, sized hot threshold, cooling",
        build: |c| Ok(Box::new(crate::memtis::Memtis::new(parse("memtis", c)?))),
    },
    Entry {
        name: "damos",
        about: "DAMOS migrate_hot/migrate_cold with quota goal",
        build: |c| Ok(Box::new(crate::damos::Damos::new(parse("damos", c)?))),
    },
    Entry {
        name: "memtierd",
        about: "memtierd-like heat classes mapped to nodes, 100 MB/s mover",
        build: |c| {
            Ok(Box::new(crate::heat_classes::HeatClasses::new(parse(
                "memtierd", c,
            )?)))
        },
    },
    Entry {
        name: "first-touch",
        about: "first-touch placement, never migrates",
        build: |_| Ok(Box::new(crate::first_touch::FirstTouch)),
    },
];

/// Builds the policy `name` with its config table.
pub fn build(name: &str, cfg: Option<&toml::Table>) -> Result<Box<dyn PlacementPolicy>, Error> {
    let e = REGISTRY
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| Error::Unknown(name.to_owned()))?;
    (e.build)(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_builds_under_its_name_and_refuses_unknown_keys() -> Result<(), Error> {
        for e in REGISTRY {
            let p = build(e.name, None)?;
            assert_eq!(p.name(), e.name);
            let mut bad = toml::Table::new();
            bad.insert("no_such_key".into(), toml::Value::Integer(1));
            if e.name != "first-touch" {
                assert!(
                    matches!(build(e.name, Some(&bad)), Err(Error::Config(..))),
                    "{}",
                    e.name
                );
            }
        }
        assert!(matches!(build("nope", None), Err(Error::Unknown(_))));
        let mut ok = toml::Table::new();
        ok.insert("swap_margin".into(), toml::Value::Integer(2));
        build("default", Some(&ok))?;
        Ok(())
    }
}
