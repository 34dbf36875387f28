//! Which hotness source works on this host, chosen once with a log line saying why.
//!
//! [`select`] tries DAMON first (sysfs present, a vaddr operation set offered, a kdamond
//! slot free) and falls back to soft-dirty write tracking; each can be forced by name
//! (`damon-vaddr`, `soft-dirty`). The chosen source comes back attached to the layout,
//! with a one-line reason for the daemon's log:
//!
//! ```text
//! hotness source: damon-vaddr (DAMON fvaddr on kdamond 0, 5000 µs samples, 520-1560 regions, every 100 ms aggregation window via the damon_aggregated tracepoint, 2048 KiB ring)
//! hotness source: soft-dirty via PAGEMAP_SCAN (DAMON vaddr unavailable: No DAMON sysfs at /sys/kernel/mm/damon/admin)
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use vmtier_core::hotness::{self, HotnessSource};
use vmtier_core::GuestMemoryLayout;

use crate::damon::{self, DamonConfig, DamonSource};
use crate::softdirty::{self, SoftDirtySource};

/// Errors of source selection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a known source name.
    #[error("Unknown hotness source {0:?}: expected auto, damon-vaddr or soft-dirty")]
    UnknownName(String),
    /// No source works; the reasons of each.
    #[error("No hotness source works here: {0}")]
    NoneWorks(String),
    /// The forced source does not work.
    #[error("Hotness source {name} does not work here")]
    Forced {
        /// The forced source.
        name: &'static str,
        /// Why.
        #[source]
        source: hotness::Error,
    },
    /// The process went away while attaching.
    #[error("Monitored process is gone")]
    Gone,
}

/// The available hotness sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// [`DamonSource`].
    DamonVaddr,
    /// [`SoftDirtySource`].
    SoftDirty,
}

impl SourceKind {
    /// The registry name (`damon-vaddr`, `soft-dirty`), as [`HotnessSource::name`] reports.
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::DamonVaddr => "damon-vaddr",
            SourceKind::SoftDirty => "soft-dirty",
        }
    }
}

/// What the configuration asks for (`[daemon] source`). In a configuration it is one of the
/// strings `"auto"`, `"damon-vaddr"` (or `"damon"`) and `"soft-dirty"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(from = "ChoiceName", into = "ChoiceName")]
pub enum Choice {
    /// The best source that works (DAMON, then soft-dirty).
    #[default]
    Auto,
    /// Exactly this source, or an error.
    Force(SourceKind),
}

/// How a [`Choice`] is spelt in a configuration; an unknown name fails with the list of
/// known ones (serde's "unknown variant" message).
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum ChoiceName {
    Auto,
    #[serde(alias = "damon")]
    DamonVaddr,
    SoftDirty,
}

impl From<ChoiceName> for Choice {
    fn from(n: ChoiceName) -> Self {
        match n {
            ChoiceName::Auto => Choice::Auto,
            ChoiceName::DamonVaddr => Choice::Force(SourceKind::DamonVaddr),
            ChoiceName::SoftDirty => Choice::Force(SourceKind::SoftDirty),
        }
    }
}

impl From<Choice> for ChoiceName {
    fn from(c: Choice) -> Self {
        match c {
            Choice::Auto => ChoiceName::Auto,
            Choice::Force(SourceKind::DamonVaddr) => ChoiceName::DamonVaddr,
            Choice::Force(SourceKind::SoftDirty) => ChoiceName::SoftDirty,
        }
    }
}

impl FromStr for Choice {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "auto" => Ok(Choice::Auto),
            "damon-vaddr" | "damon" => Ok(Choice::Force(SourceKind::DamonVaddr)),
            "soft-dirty" => Ok(Choice::Force(SourceKind::SoftDirty)),
            _ => Err(Error::UnknownName(s.to_owned())),
        }
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Choice::Auto => f.write_str("auto"),
            Choice::Force(k) => f.write_str(k.name()),
        }
    }
}

/// Options for [`select`].
#[derive(Clone, Debug, Default)]
pub struct SelectOptions {
    /// Which source.
    pub choice: Choice,
    /// DAMON attributes (its `root` is where DAMON sysfs is looked for).
    pub damon: DamonConfig,
}

/// A chosen, attached source and why it was chosen.
pub struct Selection {
    /// The source, attached to the layout given to [`select`].
    pub source: Box<dyn HotnessSource>,
    /// Which one.
    pub kind: SourceKind,
    /// The log line: `hotness source: NAME (WHY)`.
    pub reason: String,
}

impl fmt::Debug for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Selection")
            .field("kind", &self.kind)
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

/// What works on this host, without attaching to anything.
#[derive(Debug)]
pub struct Probe {
    /// The DAMON operation set that would be used, or why DAMON cannot be used.
    pub damon: Result<&'static str, String>,
    /// The soft-dirty scan method, or why soft-dirty cannot be used.
    pub soft_dirty: Result<softdirty::Scan, String>,
}

/// Probes both sources (see [`damon::probe`], [`softdirty::probe`]).
pub fn probe(damon: &DamonConfig) -> Probe {
    Probe {
        damon: damon::probe(&damon.root).map_err(|e| e.to_string()),
        soft_dirty: softdirty::probe().map_err(|e| e.to_string()),
    }
}

fn attach_damon(
    opts: &SelectOptions,
    layout: &GuestMemoryLayout,
) -> Result<Selection, hotness::Error> {
    // Attaching checks everything probe() does (sysfs, operations, a free slot).
    let mut s = DamonSource::new(opts.damon.clone());
    s.attach(layout)?;
    let why = s.describe();
    Ok(Selection {
        source: Box::new(s),
        kind: SourceKind::DamonVaddr,
        reason: why,
    })
}

fn attach_soft_dirty(layout: &GuestMemoryLayout) -> Result<Selection, hotness::Error> {
    let scan = softdirty::probe().map_err(hotness::Error::from)?;
    let mut s = SoftDirtySource::new(Some(scan));
    s.attach(layout)?;
    Ok(Selection {
        source: Box::new(s),
        kind: SourceKind::SoftDirty,
        reason: scan.name().to_owned(),
    })
}

/// The message of `e` without the generic "Source unavailable" wrapping.
fn cause(e: &hotness::Error) -> String {
    match e {
        hotness::Error::Unavailable(why) => why.clone(),
        hotness::Error::Io(io) => io
            .get_ref()
            .map_or_else(|| io.to_string(), ToString::to_string),
        hotness::Error::Gone => e.to_string(),
    }
}

/// Picks, attaches and explains the hotness source for `layout`.
pub fn select(opts: &SelectOptions, layout: &GuestMemoryLayout) -> Result<Selection, Error> {
    let finish = |mut s: Selection, why: String| {
        s.reason = format!("hotness source: {} ({why})", s.kind.name());
        s
    };
    match opts.choice {
        Choice::Force(kind) => {
            let r = match kind {
                SourceKind::DamonVaddr => attach_damon(opts, layout),
                SourceKind::SoftDirty => attach_soft_dirty(layout),
            };
            match r {
                Ok(s) => {
                    let why = format!("forced by configuration; {}", s.reason);
                    Ok(finish(s, why))
                }
                Err(hotness::Error::Gone) => Err(Error::Gone),
                Err(source) => Err(Error::Forced {
                    name: kind.name(),
                    source,
                }),
            }
        }
        Choice::Auto => {
            let damon_err = match attach_damon(opts, layout) {
                Ok(s) => {
                    let why = s.reason.clone();
                    return Ok(finish(s, why));
                }
                Err(hotness::Error::Gone) => return Err(Error::Gone),
                Err(e) => cause(&e),
            };
            match attach_soft_dirty(layout) {
                Ok(s) => {
                    let why = format!("via {}; DAMON vaddr unavailable: {damon_err}", s.reason);
                    Ok(finish(s, why))
                }
                Err(hotness::Error::Gone) => Err(Error::Gone),
                Err(e) => Err(Error::NoneWorks(format!(
                    "damon-vaddr: {damon_err}; soft-dirty: {}",
                    cause(&e)
                ))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        let cases = [
            ("auto", Some(Choice::Auto)),
            ("damon-vaddr", Some(Choice::Force(SourceKind::DamonVaddr))),
            ("damon", Some(Choice::Force(SourceKind::DamonVaddr))),
            ("soft-dirty", Some(Choice::Force(SourceKind::SoftDirty))),
            ("perf", None),
            ("", None),
        ];
        for (s, want) in cases {
            assert_eq!(s.parse::<Choice>().ok(), want, "{s:?}");
            // A configuration spells it the same way.
            let de: Result<Choice, serde::de::value::Error> =
                Choice::deserialize(serde::de::IntoDeserializer::into_deserializer(s));
            assert_eq!(de.ok(), want, "serde {s:?}");
            if let Some(c) = want {
                let name: ChoiceName = c.into();
                assert_eq!(Choice::from(name), c);
            }
        }
        assert_eq!(
            Choice::Force(SourceKind::SoftDirty).to_string(),
            "soft-dirty"
        );
    }

    #[test]
    fn damon_missing_means_unavailable() {
        let cfg = DamonConfig {
            root: "/nonexistent/damon".into(),
            ..DamonConfig::default()
        };
        let p = probe(&cfg);
        assert_eq!(
            p.damon,
            Err("No DAMON sysfs at /nonexistent/damon".to_owned())
        );
    }
}
