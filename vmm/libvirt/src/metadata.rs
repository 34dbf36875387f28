//! vmtier's element in a libvirt domain's `<metadata>`: how vmtierd tiers the domain.
//!
//! ```xml
//! <metadata>
//!   <vmtier:tiering xmlns:vmtier="https://vmtier.org/xmlns/libvirt/1"
//!                   budget="4G" policy="default" rate="100M" enabled="yes">
//!     <vmtier:param name="hot_threshold" value="2"/>
//!     <vmtier:pin start="0x0" size="16M" tier="dram"/>
//!   </vmtier:tiering>
//! </metadata>
//! ```
//!
//! `virsh metadata DOM --uri https://vmtier.org/xmlns/libvirt/1 --key vmtier --set XML`
//! stores it (libvirt puts the element into the namespace, whatever prefix it had); docs/libvirt.md
//! has the schema. Parsing is strict: an unknown attribute or element, or a value out of
//! bounds, is an error that names it, so that a typo never silently becomes a default.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use vmtier_api::hints::{BYTES_PER_S, DISTRUST_TICKS, FRAMES_PER_S, MAX_BUDGET_PERCENT};
use vmtier_api::pin::{self, Pin, PinTier, MAX_PINS};
use vmtier_core::ByteSize;

/// The namespace URI of vmtier's metadata element.
pub const NAMESPACE: &str = "https://vmtier.org/xmlns/libvirt/1";
/// The prefix libvirt stores the element with (`virsh metadata --key`).
pub const KEY: &str = "vmtier";
/// The element's local name.
pub const ELEMENT: &str = "tiering";
/// Largest budget: 1 PiB (vmtierd's own bound for budgets).
pub const MAX_BUDGET: u64 = 1 << 50;
/// Smallest per-domain rate limit: 1 MiB/s.
pub const MIN_RATE: u64 = 1 << 20;
/// Largest per-domain rate limit: 1 TiB/s.
pub const MAX_RATE: u64 = 1 << 40;
/// Most `<param>` children.
pub const MAX_PARAMS: usize = 32;
/// Longest policy or parameter name, bytes.
pub const MAX_NAME: usize = 64;
/// Longest metadata text accepted, bytes (libvirt's own limit on a domain XML is far larger).
pub const MAX_XML: usize = 16 << 10;

/// Error in a domain's vmtier metadata. Each names what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not well-formed XML.
    #[error("Not well-formed XML: {0}")]
    Xml(String),
    /// Longer than [`MAX_XML`].
    #[error("Metadata longer than {MAX_XML} bytes")]
    TooLong,
    /// The root is not `<tiering>` in vmtier's namespace.
    #[error("Root element <{0}> is not <{ELEMENT}> in namespace {NAMESPACE}")]
    Root(String),
    /// An attribute's value is invalid.
    #[error("Attribute {attr}=\"{value}\": {reason}")]
    Value {
        /// Attribute (or `param NAME`).
        attr: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A required attribute is missing.
    #[error("Attribute {0} is missing")]
    Missing(String),
    /// An attribute vmtier does not know.
    #[error("Unknown attribute {0} on <{1}>")]
    UnknownAttribute(String, String),
    /// A child element vmtier does not know.
    #[error("Unknown element <{0}> in <{ELEMENT}>")]
    UnknownElement(String),
    /// Text where only elements belong.
    #[error("Unexpected text {0:?} in <{ELEMENT}>")]
    Text(String),
    /// A `<param>` name given twice.
    #[error("Parameter {0} is given twice")]
    DuplicateParam(String),
    /// More than [`MAX_PARAMS`] parameters.
    #[error("More than {MAX_PARAMS} <param> elements")]
    TooManyParams,
    /// More than [`MAX_PINS`] pinned ranges.
    #[error("More than {MAX_PINS} <pin> elements")]
    TooManyPins,
    /// Pinned ranges that overlap or do not fit the budget.
    #[error("Element <pin>: {0}")]
    Pins(String),
    /// A child that may appear once appears again.
    #[error("Element <{0}> is given twice")]
    Duplicate(String),
}

/// `<hints .../>`: the domain's guest hint channel settings (`[vm.hints]` without the socket,
/// which comes from the domain's devices). Attributes left out keep `[vm.hints]`' defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HintSettings {
    /// `enabled="no"`: the channel is not used (tiering goes on without hints).
    pub disabled: bool,
    /// `frames_per_s`, 1 to 1000.
    pub frames_per_s: Option<u32>,
    /// `bytes_per_s`, a size, 64 KiB to 16 MiB.
    pub bytes_per_s: Option<ByteSize>,
    /// `distrust_ticks`, 1 to 1000.
    pub distrust_ticks: Option<u32>,
    /// `max_budget_percent`, 0 to 100.
    pub max_budget_percent: Option<u8>,
}

impl HintSettings {
    /// `[vm.hints]` for `socket` with these settings; `None` when disabled.
    pub fn config(&self, socket: std::path::PathBuf) -> Option<vmtier_api::hints::HintsConfig> {
        if self.disabled {
            return None;
        }
        let mut c = vmtier_api::hints::HintsConfig::new(socket);
        if let Some(v) = self.frames_per_s {
            c.frames_per_s = v;
        }
        if let Some(v) = self.bytes_per_s {
            c.bytes_per_s = v;
        }
        if let Some(v) = self.distrust_ticks {
            c.distrust_ticks = v;
        }
        if let Some(v) = self.max_budget_percent {
            c.max_budget_percent = v;
        }
        Some(c)
    }
}

/// An integer attribute of `<hints>` within `range`.
fn hint_num<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    attr: &str,
    v: &str,
    range: &std::ops::RangeInclusive<T>,
) -> Result<T, Error> {
    match v.parse::<T>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(bad(
            &format!("hints {attr}"),
            v,
            format!("not an integer from {} to {}", range.start(), range.end()),
        )),
    }
}

/// One `<hints enabled= frames_per_s= bytes_per_s= distrust_ticks= max_budget_percent=/>`.
fn parse_hints(node: roxmltree::Node<'_, '_>) -> Result<HintSettings, Error> {
    let mut h = HintSettings::default();
    for a in node.attributes() {
        let v = a.value();
        if !ours(a.namespace()) {
            return Err(Error::UnknownAttribute(a.name().into(), "hints".into()));
        }
        match a.name() {
            "enabled" => {
                h.disabled = match v {
                    "yes" => false,
                    "no" => true,
                    _ => return Err(bad("hints enabled", v, "expected yes or no")),
                };
            }
            "frames_per_s" => h.frames_per_s = Some(hint_num("frames_per_s", v, &FRAMES_PER_S)?),
            "distrust_ticks" => {
                h.distrust_ticks = Some(hint_num("distrust_ticks", v, &DISTRUST_TICKS)?);
            }
            "max_budget_percent" => {
                h.max_budget_percent =
                    Some(hint_num("max_budget_percent", v, &MAX_BUDGET_PERCENT)?);
            }
            "bytes_per_s" => {
                let t = v.strip_suffix("/s").unwrap_or(v);
                match t.parse::<ByteSize>() {
                    Ok(b) if BYTES_PER_S.contains(&b.0) => h.bytes_per_s = Some(b),
                    _ => {
                        return Err(bad(
                            "hints bytes_per_s",
                            v,
                            format!(
                                "not a size per second from {} to {}",
                                ByteSize(*BYTES_PER_S.start()),
                                ByteSize(*BYTES_PER_S.end())
                            ),
                        ))
                    }
                }
            }
            other => return Err(Error::UnknownAttribute(other.into(), "hints".into())),
        }
    }
    if node.children().any(|c| c.is_element()) {
        return Err(Error::UnknownElement("hints child".into()));
    }
    Ok(h)
}

/// A policy parameter's value, typed as TOML would type it (the policies take TOML tables).
#[derive(Clone, Debug, PartialEq)]
pub enum ParamValue {
    /// An integer (`2`, `-1`).
    Int(i64),
    /// A number with a fraction (`0.5`).
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// Anything else.
    Str(String),
}

impl ParamValue {
    fn parse(s: &str) -> Self {
        if let Ok(i) = s.parse::<i64>() {
            Self::Int(i)
        } else if let Some(f) = s.parse::<f64>().ok().filter(|f| f.is_finite()) {
            Self::Float(f)
        } else {
            match s {
                "true" => Self::Bool(true),
                "false" => Self::Bool(false),
                _ => Self::Str(s.to_owned()),
            }
        }
    }

    fn text(&self) -> String {
        match self {
            Self::Int(i) => i.to_string(),
            Self::Float(f) => f.to_string(),
            Self::Bool(b) => b.to_string(),
            Self::Str(s) => s.clone(),
        }
    }
}

/// How vmtierd tiers one domain.
#[derive(Clone, Debug, PartialEq)]
pub struct Tiering {
    /// `enabled`: `yes` (default) or `no` (vmtierd leaves the domain alone).
    pub enabled: bool,
    /// `budget` (required): DRAM the domain may use, `4G`-style (binary units).
    pub budget: ByteSize,
    /// `policy`: a policy name; `None` = vmtierd's `[daemon] policy`.
    pub policy: Option<String>,
    /// `rate`: this domain's migration rate limit in bytes per second (`100M` or
    /// `100M/s`); `None` = its share of vmtierd's `rate_limit_mbps`.
    pub rate: Option<ByteSize>,
    /// `<param name= value=>` children: the policy's parameters.
    pub params: BTreeMap<String, ParamValue>,
    /// `<pin start= size= tier=>` children: guest-physical ranges kept on one tier, in
    /// document order.
    pub pins: Vec<Pin>,
    /// `<hints .../>`: the hint channel's settings (`None`: `[vm.hints]`' defaults).
    pub hints: Option<HintSettings>,
}

/// One `<pin start="0x0" size="16M" tier="dram"/>`.
fn parse_pin(node: roxmltree::Node<'_, '_>) -> Result<Pin, Error> {
    let (mut start, mut size, mut tier) = (None, None, None);
    for a in node.attributes() {
        let v = a.value();
        match a.name() {
            "start" if ours(a.namespace()) => {
                start = Some(pin::parse_gpa(v).map_err(|why| bad("pin start", v, why))?);
            }
            "size" if ours(a.namespace()) => {
                let b: ByteSize = v
                    .parse()
                    .map_err(|_| bad("pin size", v, "not a size (16M, 2G, 4096)"))?;
                size = Some(b);
            }
            "tier" if ours(a.namespace()) => {
                tier = Some(
                    v.parse::<PinTier>()
                        .map_err(|why| bad("pin tier", v, why))?,
                );
            }
            other => return Err(Error::UnknownAttribute(other.into(), "pin".into())),
        }
    }
    Ok(Pin {
        start: start.ok_or_else(|| Error::Missing("pin start".into()))?,
        size: size.ok_or_else(|| Error::Missing("pin size".into()))?,
        tier: tier.ok_or_else(|| Error::Missing("pin tier".into()))?,
    })
}

fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

fn bad(attr: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::Value {
        attr: attr.to_owned(),
        value: value.to_owned(),
        reason: reason.into(),
    }
}

fn ours(ns: Option<&str>) -> bool {
    ns.map_or(true, |n| n == NAMESPACE)
}

/// `4G` for exact multiples, bytes otherwise: what [`ByteSize`] parses back.
pub fn size_text(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

impl Tiering {
    /// A domain with `budget` and every other setting at its default.
    pub fn with_budget(budget: ByteSize) -> Self {
        Self {
            enabled: true,
            budget,
            policy: None,
            rate: None,
            params: BTreeMap::new(),
            pins: Vec::new(),
            hints: None,
        }
    }

    /// Parses the element as libvirt returns it (`virDomainGetMetadata`).
    pub fn parse(xml: &str) -> Result<Self, Error> {
        if xml.len() > MAX_XML {
            return Err(Error::TooLong);
        }
        let doc = roxmltree::Document::parse(xml).map_err(|e| Error::Xml(e.to_string()))?;
        let root = doc.root_element();
        let tag = root.tag_name();
        if tag.name() != ELEMENT || !ours(tag.namespace()) {
            return Err(Error::Root(tag.name().to_owned()));
        }
        let (mut enabled, mut budget, mut policy, mut rate) = (true, None, None, None);
        for a in root.attributes() {
            let v = a.value();
            if !ours(a.namespace()) {
                return Err(Error::UnknownAttribute(a.name().into(), ELEMENT.into()));
            }
            match a.name() {
                "enabled" => {
                    enabled = match v {
                        "yes" => true,
                        "no" => false,
                        _ => return Err(bad("enabled", v, "expected yes or no")),
                    };
                }
                "budget" => {
                    let b: ByteSize = v
                        .parse()
                        .map_err(|_| bad("budget", v, "not a size (4G, 512M, 1048576)"))?;
                    if b.0 > MAX_BUDGET {
                        return Err(bad(
                            "budget",
                            v,
                            format!("above the largest, {}", ByteSize(MAX_BUDGET)),
                        ));
                    }
                    budget = Some(b);
                }
                "policy" => {
                    if !name_ok(v) {
                        return Err(bad(
                            "policy",
                            v,
                            "not a policy name (a-z, 0-9, _ and -, at most 64 bytes)",
                        ));
                    }
                    policy = Some(v.to_owned());
                }
                "rate" => {
                    let t = v.strip_suffix("/s").unwrap_or(v);
                    let r: ByteSize = t
                        .parse()
                        .map_err(|_| bad("rate", v, "not a size per second (100M, 1G/s)"))?;
                    if !(MIN_RATE..=MAX_RATE).contains(&r.0) {
                        return Err(bad(
                            "rate",
                            v,
                            format!(
                                "out of range: {}/s to {}/s",
                                ByteSize(MIN_RATE),
                                ByteSize(MAX_RATE)
                            ),
                        ));
                    }
                    rate = Some(r);
                }
                other => return Err(Error::UnknownAttribute(other.into(), ELEMENT.into())),
            }
        }
        let mut params = BTreeMap::new();
        let mut pins = Vec::new();
        let mut hints = None;
        for child in root.children() {
            if child.is_text() {
                let t = child.text().unwrap_or("").trim();
                if !t.is_empty() {
                    return Err(Error::Text(t.chars().take(32).collect()));
                }
                continue;
            }
            if !child.is_element() {
                continue;
            }
            let ct = child.tag_name();
            if ct.name() == "hints" && ours(ct.namespace()) {
                if hints.is_some() {
                    return Err(Error::Duplicate("hints".into()));
                }
                hints = Some(parse_hints(child)?);
                continue;
            }
            if ct.name() == "pin" && ours(ct.namespace()) {
                if pins.len() == MAX_PINS {
                    return Err(Error::TooManyPins);
                }
                pins.push(parse_pin(child)?);
                continue;
            }
            if ct.name() != "param" || !ours(ct.namespace()) {
                return Err(Error::UnknownElement(ct.name().to_owned()));
            }
            let (mut name, mut value) = (None, None);
            for a in child.attributes() {
                match a.name() {
                    "name" if ours(a.namespace()) => name = Some(a.value()),
                    "value" if ours(a.namespace()) => value = Some(a.value()),
                    other => return Err(Error::UnknownAttribute(other.into(), "param".into())),
                }
            }
            let name = name.ok_or_else(|| Error::Missing("param name".into()))?;
            if !name_ok(name) {
                return Err(bad(
                    "param name",
                    name,
                    "not a parameter name (a-z, 0-9, _ and -, at most 64 bytes)",
                ));
            }
            let value = value.ok_or_else(|| Error::Missing(format!("value of param {name}")))?;
            if params.len() == MAX_PARAMS {
                return Err(Error::TooManyParams);
            }
            if params
                .insert(name.to_owned(), ParamValue::parse(value))
                .is_some()
            {
                return Err(Error::DuplicateParam(name.to_owned()));
            }
        }
        let budget = budget.ok_or_else(|| Error::Missing("budget".into()))?;
        pin::validate(&pins, budget).map_err(|e| {
            let mut why = e.to_string();
            if let pin::Error::OverBudget { .. } = e {
                let _ = write!(why, " (attribute budget=\"{}\")", size_text(budget.0));
            }
            Error::Pins(why)
        })?;
        Ok(Self {
            enabled,
            budget,
            policy,
            rate,
            params,
            pins,
            hints,
        })
    }

    /// The element for `virDomainSetMetadata` (key [`KEY`], URI [`NAMESPACE`]); libvirt
    /// puts it into the namespace.
    pub fn to_xml(&self) -> String {
        let mut s = format!(
            "<{ELEMENT} budget=\"{}\" enabled=\"{}\"",
            size_text(self.budget.0),
            if self.enabled { "yes" } else { "no" }
        );
        if let Some(p) = &self.policy {
            let _ = write!(s, " policy=\"{}\"", escape(p));
        }
        if let Some(r) = self.rate {
            let _ = write!(s, " rate=\"{}\"", size_text(r.0));
        }
        if self.params.is_empty() && self.pins.is_empty() && self.hints.is_none() {
            s.push_str("/>");
            return s;
        }
        s.push('>');
        for (k, v) in &self.params {
            let _ = write!(
                s,
                "<param name=\"{}\" value=\"{}\"/>",
                escape(k),
                escape(&v.text())
            );
        }
        for p in &self.pins {
            let _ = write!(
                s,
                "<pin start=\"{:#x}\" size=\"{}\" tier=\"{}\"/>",
                p.start.0,
                size_text(p.size.0),
                p.tier
            );
        }
        if let Some(h) = &self.hints {
            s.push_str("<hints");
            if h.disabled {
                s.push_str(" enabled=\"no\"");
            }
            if let Some(v) = h.frames_per_s {
                let _ = write!(s, " frames_per_s=\"{v}\"");
            }
            if let Some(v) = h.bytes_per_s {
                let _ = write!(s, " bytes_per_s=\"{}\"", size_text(v.0));
            }
            if let Some(v) = h.distrust_ticks {
                let _ = write!(s, " distrust_ticks=\"{v}\"");
            }
            if let Some(v) = h.max_budget_percent {
                let _ = write!(s, " max_budget_percent=\"{v}\"");
            }
            s.push_str("/>");
        }
        let _ = write!(s, "</{ELEMENT}>");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "xmlns:vmtier=\"https://vmtier.org/xmlns/libvirt/1\"";

    fn t(budget: u64) -> Tiering {
        Tiering::with_budget(ByteSize(budget))
    }

    #[test]
    fn valid_elements_parse() {
        let mut full = t(4 << 30);
        full.policy = Some("memtierd".into());
        full.rate = Some(ByteSize(100 << 20));
        full.params
            .insert("hot_threshold".into(), ParamValue::Int(2));
        full.params.insert("ratio".into(), ParamValue::Float(0.5));
        full.params.insert("flag".into(), ParamValue::Bool(true));
        full.params
            .insert("mode".into(), ParamValue::Str("x y".into()));
        let mut pinned = t(48 << 20);
        pinned.pins = vec![
            Pin {
                start: vmtier_core::GuestPhysAddr(16 << 20),
                size: ByteSize(16 << 20),
                tier: PinTier::Dram,
            },
            Pin {
                start: vmtier_core::GuestPhysAddr(4096),
                size: ByteSize(8192),
                tier: PinTier::Cxl,
            },
        ];
        let mut hinted = t(1 << 30);
        hinted.hints = Some(HintSettings {
            frames_per_s: Some(50),
            bytes_per_s: Some(ByteSize(1 << 20)),
            distrust_ticks: Some(10),
            max_budget_percent: Some(25),
            ..HintSettings::default()
        });
        let mut no_hints = t(1 << 30);
        no_hints.hints = Some(HintSettings {
            disabled: true,
            ..HintSettings::default()
        });
        let mut off = t(64 << 20);
        off.enabled = false;
        let cases: Vec<(String, Tiering)> = vec![
            (format!("<vmtier:tiering {NS} budget=\"4G\"/>"), t(4 << 30)),
            ("<tiering budget=\"64M\" enabled=\"no\"/>".into(), off),
            ("<tiering budget=\"1048576\"/>".into(), t(1 << 20)),
            (
                "<tiering budget=\"1G\"><hints frames_per_s=\"50\" bytes_per_s=\"1M/s\" \
                 distrust_ticks=\"10\" max_budget_percent=\"25\"/></tiering>"
                    .into(),
                hinted,
            ),
            (
                "<tiering budget=\"1G\"><hints enabled=\"no\"/></tiering>".into(),
                no_hints,
            ),
            ("<tiering budget=\"0\"/>".into(), t(0)),
            ("<tiering budget=\"1024T\"/>".into(), t(1 << 50)),
            (
                format!(
                    "<vmtier:tiering {NS} budget=\"48M\"><vmtier:pin start=\"0x1000000\" \
                     size=\"16M\" tier=\"dram\"/><vmtier:pin start=\"4096\" size=\"8192\" \
                     tier=\"cxl\"/></vmtier:tiering>"
                ),
                pinned,
            ),
            (
                format!(
                    "<vmtier:tiering {NS} budget=\"4G\" policy=\"memtierd\" rate=\"100M/s\" \
                     enabled=\"yes\">\n  <vmtier:param name=\"hot_threshold\" value=\"2\"/>\n  \
                     <vmtier:param name=\"ratio\" value=\"0.5\"/><!-- c -->\
                     <vmtier:param name=\"flag\" value=\"true\"/>\
                     <vmtier:param name=\"mode\" value=\"x y\"/></vmtier:tiering>"
                ),
                full,
            ),
        ];
        for (xml, want) in cases {
            let got = Tiering::parse(&xml).unwrap_or_else(|e| panic!("{xml}: {e}"));
            assert_eq!(got, want, "{xml}");
            // What vmtierctl writes parses back to the same settings.
            assert_eq!(
                Tiering::parse(&got.to_xml()).unwrap(),
                got,
                "{}",
                got.to_xml()
            );
        }
    }

    #[test]
    fn malformed_elements_name_the_problem() {
        let long = format!("<tiering budget=\"1G\"/>{}", " ".repeat(MAX_XML));
        let many: String = (0..=MAX_PARAMS)
            .map(|i| format!("<param name=\"p{i}\" value=\"1\"/>"))
            .collect();
        let many = format!("<tiering budget=\"1G\">{many}</tiering>");
        let cases: Vec<(&str, &str)> = vec![
            ("", "Not well-formed XML"),
            ("<tiering budget=\"1G\">", "Not well-formed XML"),
            ("<tiering budget=\"1G\"/><x/>", "Not well-formed XML"),
            ("<tiering budget='1G' budget='2G'/>", "Not well-formed XML"),
            ("<tiering/>", "Attribute budget is missing"),
            ("<tier budget=\"1G\"/>", "Root element <tier> is not"),
            (
                "<v:tiering xmlns:v=\"urn:other\" budget=\"1G\"/>",
                "Root element <tiering> is not",
            ),
            ("<tiering budget=\"4X\"/>", "Attribute budget=\"4X\": not a size"),
            ("<tiering budget=\"-1G\"/>", "Attribute budget=\"-1G\": not a size"),
            ("<tiering budget=\"1.5G\"/>", "Attribute budget=\"1.5G\": not a size"),
            ("<tiering budget=\"\"/>", "Attribute budget=\"\": not a size"),
            (
                "<tiering budget=\"99999999999999999999\"/>",
                "Attribute budget=\"99999999999999999999\": not a size",
            ),
            (
                "<tiering budget=\"1025T\"/>",
                "Attribute budget=\"1025T\": above the largest, 1024 TiB",
            ),
            (
                "<tiering budget=\"1G\" enabled=\"true\"/>",
                "Attribute enabled=\"true\": expected yes or no",
            ),
            (
                "<tiering budget=\"1G\" policy=\"Bad Name\"/>",
                "Attribute policy=\"Bad Name\": not a policy name",
            ),
            (
                "<tiering budget=\"1G\" rate=\"fast\"/>",
                "Attribute rate=\"fast\": not a size per second",
            ),
            (
                "<tiering budget=\"1G\" rate=\"512K\"/>",
                "Attribute rate=\"512K\": out of range: 1 MiB/s to 1 TiB/s",
            ),
            (
                "<tiering budget=\"1G\" rate=\"2T\"/>",
                "Attribute rate=\"2T\": out of range",
            ),
            (
                "<tiering budget=\"1G\" bugdet=\"2G\"/>",
                "Unknown attribute bugdet on <tiering>",
            ),
            (
                "<tiering xmlns:o=\"urn:o\" budget=\"1G\" o:budget=\"2G\"/>",
                "Unknown attribute budget on <tiering>",
            ),
            (
                "<tiering budget=\"1G\"><pin start=\"0\"/></tiering>",
                "Attribute pin size is missing",
            ),
            (
                "<tiering budget=\"1G\"><pin size=\"1M\" tier=\"dram\"/></tiering>",
                "Attribute pin start is missing",
            ),
            (
                "<tiering budget=\"1G\"><pin start=\"0\" size=\"1M\"/></tiering>",
                "Attribute pin tier is missing",
            ),
            (
                "<tiering budget=\"1G\"><pin start=\"0x\" size=\"1M\" tier=\"dram\"/></tiering>",
                "Attribute pin start=\"0x\": address \"0x\" is not 0x-hex or decimal",
            ),
            (
                "<tiering budget=\"1G\"><pin start=\"0\" size=\"1Q\" tier=\"dram\"/></tiering>",
                "Attribute pin size=\"1Q\": not a size",
            ),
            (
                "<tiering budget=\"1G\"><pin start=\"0\" size=\"1M\" tier=\"hbm\"/></tiering>",
                "Attribute pin tier=\"hbm\": expected dram or cxl",
            ),
            (
                "<tiering budget=\"1G\"><pin start=\"0\" size=\"1M\" tier=\"dram\" x=\"1\"/></tiering>",
                "Unknown attribute x on <pin>",
            ),
            (
                "<tiering budget=\"48M\"><pin start=\"0x0\" size=\"64M\" tier=\"dram\"/></tiering>",
                "Element <pin>: Pinned DRAM 64 MiB exceeds the budget 48 MiB (attribute budget=\"48M\")",
            ),
            (
                "<tiering budget=\"48M\"><pin start=\"0x0\" size=\"8M\" tier=\"dram\"/><pin start=\"0x400000\" size=\"8M\" tier=\"cxl\"/></tiering>",
                "Element <pin>: Pins 0x0+8 MiB (dram) and 0x400000+8 MiB (cxl) overlap",
            ),
            (
                "<tiering budget=\"1G\"><pin start=\"0x1000\" size=\"0\" tier=\"cxl\"/></tiering>",
                "Element <pin>: Pin 0x1000+0 B (cxl): empty",
            ),
            (
                "<tiering budget=\"1G\"><pinned start=\"0\"/></tiering>",
                "Unknown element <pinned> in <tiering>",
            ),
            (
                "<tiering budget=\"1G\"><hints/><hints/></tiering>",
                "Element <hints> is given twice",
            ),
            (
                "<tiering budget=\"1G\"><hints enabled=\"off\"/></tiering>",
                "Attribute hints enabled=\"off\": expected yes or no",
            ),
            (
                "<tiering budget=\"1G\"><hints frames_per_s=\"0\"/></tiering>",
                "Attribute hints frames_per_s=\"0\": not an integer from 1 to 1000",
            ),
            (
                "<tiering budget=\"1G\"><hints max_budget_percent=\"101\"/></tiering>",
                "Attribute hints max_budget_percent=\"101\": not an integer from 0 to 100",
            ),
            (
                "<tiering budget=\"1G\"><hints bytes_per_s=\"1K\"/></tiering>",
                "Attribute hints bytes_per_s=\"1K\": not a size per second from 64 KiB to 16 MiB",
            ),
            (
                "<tiering budget=\"1G\"><hints socket=\"/x\"/></tiering>",
                "Unknown attribute socket on <hints>",
            ),
            ("<tiering budget=\"1G\">fast</tiering>", "Unexpected text \"fast\""),
            (
                "<tiering budget=\"1G\"><param value=\"1\"/></tiering>",
                "Attribute param name is missing",
            ),
            (
                "<tiering budget=\"1G\"><param name=\"a\"/></tiering>",
                "Attribute value of param a is missing",
            ),
            (
                "<tiering budget=\"1G\"><param name=\"A b\" value=\"1\"/></tiering>",
                "Attribute param name=\"A b\": not a parameter name",
            ),
            (
                "<tiering budget=\"1G\"><param name=\"a\" value=\"1\" unit=\"x\"/></tiering>",
                "Unknown attribute unit on <param>",
            ),
            (
                "<tiering budget=\"1G\"><param name=\"a\" value=\"1\"/><param name=\"a\" value=\"2\"/></tiering>",
                "Parameter a is given twice",
            ),
            (&many, "More than 32 <param> elements"),
            (&long, "Metadata longer than 16384 bytes"),
        ];
        for (xml, want) in cases {
            match Tiering::parse(xml) {
                Ok(t) => panic!("{xml}: accepted as {t:?}"),
                Err(e) => assert!(e.to_string().starts_with(want), "{xml}: {e} (want {want})"),
            }
        }
    }

    #[test]
    fn sizes_print_exactly() {
        let cases = [
            (0, "0"),
            (4096, "4K"),
            (4095, "4095"),
            (64 << 20, "64M"),
            (3 << 30, "3G"),
            ((1 << 30) + 4096, "1048580K"),
            (1 << 50, "1024T"),
        ];
        for (b, want) in cases {
            assert_eq!(size_text(b), want);
            assert_eq!(want.parse::<ByteSize>().unwrap().0, b);
        }
    }

    #[test]
    fn values_are_escaped() {
        let mut x = t(1 << 30);
        x.params
            .insert("s".into(), ParamValue::Str("<a & \"b\">".into()));
        let xml = x.to_xml();
        assert!(!xml.contains("<a &"), "{xml}");
        assert_eq!(Tiering::parse(&xml).unwrap(), x);
    }
}
