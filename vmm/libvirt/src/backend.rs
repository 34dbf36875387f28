//! A libvirt domain's guest RAM. libvirt owns QEMU's QMP socket, so vmtier's monitor
//! commands go through `virDomainQemuMonitorCommand`; the layout is then found and checked
//! against `/proc/PID/maps` by the QMP backend's own code ([`qemu::locate_ram`]).
//!
//! QEMU's pid comes from libvirt's pid file (`/run/libvirt/qemu/NAME.pid` for
//! `qemu:///system`), is checked against the process's command line (`-name guest=NAME,`)
//! and held by a pidfd from then on, so a reused pid is never migrated.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use virt::connect::Connect;
use virt::domain::Domain;
use vmtier_backends::qemu::{self, alive, hold, Monitor};
use vmtier_backends::qmp;
use vmtier_core::backend::{Error as BackendError, VmBackend};
use vmtier_core::process::{self, Pidfd};
use vmtier_core::{ByteSize, GuestMemoryLayout, ProcessId};

/// Where libvirt's system QEMU driver writes pid files.
pub const SYSTEM_PID_DIR: &str = "/run/libvirt/qemu";
/// The virtio-serial port name of vmtier's guest agent (docs/guest-agent.md).
pub const AGENT_CHANNEL: &str = "org.vmtier.agent.0";
/// The user alias that marks another unix character device (a `<serial>`: the workload
/// guest's COM2) as the hint channel, for guests without virtio-serial.
pub const AGENT_ALIAS: &str = "ua-vmtier-agent";

/// The host socket of a domain's guest hint channel in its live XML: the `<channel
/// type='unix'>` whose `<target type='virtio' name='org.vmtier.agent.0'/>`, or any unix
/// `<channel>`, `<serial>` or `<console>` with `<alias name='ua-vmtier-agent'/>`; its
/// `<source mode='bind' path=.../>` (QEMU listens there; vmtierd connects). `None` without
/// one, or when QEMU is the client (`mode='connect'`).
pub fn agent_socket(xml: &str) -> Option<PathBuf> {
    fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
        n.children()
            .find(|c| c.is_element() && c.tag_name().name() == name)
    }
    let doc = roxmltree::Document::parse(xml).ok()?;
    let devices = doc
        .root_element()
        .children()
        .find(|c| c.is_element() && c.tag_name().name() == "devices")?;
    devices
        .children()
        .filter(|d| {
            d.is_element()
                && matches!(d.tag_name().name(), "channel" | "serial" | "console")
                && d.attribute("type") == Some("unix")
        })
        .find_map(|d| {
            let by_name = d.tag_name().name() == "channel"
                && child(d, "target").is_some_and(|t| {
                    t.attribute("type") == Some("virtio")
                        && t.attribute("name") == Some(AGENT_CHANNEL)
                });
            let by_alias = child(d, "alias").and_then(|a| a.attribute("name")) == Some(AGENT_ALIAS);
            if !by_name && !by_alias {
                return None;
            }
            let src = child(d, "source")?;
            if src.attribute("mode").unwrap_or("bind") != "bind" {
                return None;
            }
            src.attribute("path").map(PathBuf::from)
        })
}

/// Error finding a domain's RAM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The domain is gone or not running.
    #[error("Domain {0} is not running")]
    NotRunning(String),
    /// A libvirt call failed.
    #[error("Libvirt {0} failed")]
    Libvirt(&'static str, #[source] virt::error::Error),
    /// The pid file is missing or does not hold a pid.
    #[error("Cannot read QEMU's pid from {0}")]
    PidFile(PathBuf, #[source] std::io::Error),
    /// The pid names a process that is not this domain's QEMU.
    #[error("Process {pid} is not the QEMU of domain {name}")]
    NotQemu {
        /// The domain.
        name: String,
        /// The pid read.
        pid: ProcessId,
    },
    /// QEMU's process could not be held.
    #[error("Cannot hold QEMU's process")]
    Process(#[from] process::Error),
    /// QEMU has exited.
    #[error("QEMU process {0} has exited")]
    Exited(ProcessId),
    /// The guest RAM could not be located or did not check out.
    #[error("Cannot locate the guest RAM")]
    Locate(#[from] qemu::Error),
    /// A monitor reply did not parse.
    #[error("Unexpected QEMU monitor reply to {0}: {1}")]
    Reply(String, String),
}

/// A guest NUMA cell (`<cpu><numa><cell>`), with its `<numatune><memnode>` if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    /// Cell id.
    pub id: u32,
    /// Its memory.
    pub bytes: u64,
    /// `mode nodeset` of its memnode, e.g. `strict 1`.
    pub memnode: Option<String>,
}

/// A domain's NUMA settings from its XML.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Numa {
    /// Guest NUMA cells.
    pub cells: Vec<Cell>,
    /// `<numatune><memory mode= nodeset=>`, as `mode nodeset`.
    pub memory: Option<String>,
}

impl std::fmt::Display for Numa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.memory {
            Some(m) => write!(f, "numatune {m}")?,
            None => write!(f, "no numatune")?,
        }
        for c in &self.cells {
            write!(f, ", cell {} {}", c.id, ByteSize(c.bytes))?;
            if let Some(m) = &c.memnode {
                write!(f, " ({m})")?;
            }
        }
        Ok(())
    }
}

/// Bytes of a libvirt `<memory unit=>` value (units per libvirt's domain XML docs; KiB by
/// default); `None` on an unknown unit or overflow.
pub fn libvirt_bytes(value: &str, unit: Option<&str>) -> Option<u64> {
    let n: u64 = value.trim().parse().ok()?;
    let mult: u64 = match unit.unwrap_or("KiB") {
        "b" | "bytes" => 1,
        "KB" => 1000,
        "k" | "KiB" => 1 << 10,
        "MB" => 1_000_000,
        "M" | "MiB" => 1 << 20,
        "GB" => 1_000_000_000,
        "G" | "GiB" => 1 << 30,
        "TB" => 1_000_000_000_000,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// The NUMA settings of a domain XML; unknown shapes give what could be read.
pub fn parse_numa(xml: &str) -> Numa {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Numa::default();
    };
    let root = doc.root_element();
    fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
        n.children()
            .find(|c| c.is_element() && c.tag_name().name() == name)
    }
    let mode_nodeset = |n: roxmltree::Node<'_, '_>| {
        format!(
            "{} {}",
            n.attribute("mode").unwrap_or("strict"),
            n.attribute("nodeset").unwrap_or("-")
        )
    };
    let tune = child(root, "numatune");
    let memory = tune.and_then(|t| child(t, "memory")).map(mode_nodeset);
    let mut cells = Vec::new();
    if let Some(numa) = child(root, "cpu").and_then(|c| child(c, "numa")) {
        for c in numa
            .children()
            .filter(|c| c.is_element() && c.tag_name().name() == "cell")
        {
            let Some(id) = c.attribute("id").and_then(|i| i.parse().ok()) else {
                continue;
            };
            let bytes = c
                .attribute("memory")
                .and_then(|m| libvirt_bytes(m, c.attribute("unit")))
                .unwrap_or(0);
            let memnode = tune.and_then(|t| {
                t.children()
                    .filter(|m| m.is_element() && m.tag_name().name() == "memnode")
                    .find(|m| m.attribute("cellid") == Some(c.attribute("id").unwrap_or("")))
                    .map(mode_nodeset)
            });
            cells.push(Cell { id, bytes, memnode });
        }
    }
    Numa { cells, memory }
}

/// The pid in a libvirt pid file.
pub fn read_pid(path: &Path) -> Result<ProcessId, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::PidFile(path.into(), e))?;
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|&p| p > 0)
        .map(ProcessId::new)
        .ok_or_else(|| {
            Error::PidFile(
                path.into(),
                std::io::Error::new(std::io::ErrorKind::InvalidData, "not a pid"),
            )
        })
}

/// Whether a NUL-separated command line is that of the QEMU libvirt started for `name`
/// (`-name guest=NAME,...`; a `,` in the name is doubled by libvirt).
pub fn is_qemu_of(cmdline: &[u8], name: &str) -> bool {
    let want = format!("guest={},", name.replace(',', ",,"));
    let mut args = cmdline.split(|&b| b == 0);
    while let Some(a) = args.next() {
        if a == b"-name" {
            return args.next().is_some_and(|v| v.starts_with(want.as_bytes()));
        }
    }
    false
}

/// The QEMU monitor of a domain, through libvirt.
struct DomainMonitor<'a>(&'a Domain);

impl Monitor for DomainMonitor<'_> {
    fn qmp(&mut self, cmd: &str) -> Result<Value, qemu::Error> {
        let req = serde_json::json!({ "execute": cmd }).to_string();
        let reply = self
            .0
            .qemu_monitor_command(&req, 0)
            .map_err(|e| qemu::Error::Monitor(Box::new(e)))?;
        let v: Value = serde_json::from_str(&reply).map_err(|_| {
            qemu::Error::Monitor(Box::new(Error::Reply(cmd.to_owned(), reply.clone())))
        })?;
        if let Some(r) = v.get("return") {
            return Ok(r.clone());
        }
        let err = v.get("error");
        let field = |k: &str| {
            err.and_then(|e| e.get(k))
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_owned()
        };
        Err(qemu::Error::Qmp(qmp::Error::Command {
            command: cmd.to_owned(),
            class: field("class"),
            desc: field("desc"),
        }))
    }

    fn hmp(&mut self, cmd: &str) -> Result<String, qemu::Error> {
        self.0
            .qemu_monitor_command(cmd, virt_sys::VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP)
            .map_err(|e| qemu::Error::Monitor(Box::new(e)))
    }
}

/// A running libvirt domain's QEMU.
#[derive(Debug)]
pub struct LibvirtBackend {
    conn: Arc<Connect>,
    name: String,
    uuid: String,
    pid: ProcessId,
    pidfd: Option<Pidfd>,
    numa: Numa,
    agent: Option<PathBuf>,
}

impl LibvirtBackend {
    /// The running domain `uuid` (named `name`) on `conn`; QEMU's pid from `pid_dir`.
    pub fn new(conn: Arc<Connect>, name: &str, uuid: &str, pid_dir: &Path) -> Result<Self, Error> {
        let dom = Domain::lookup_by_uuid_string(&conn, uuid)
            .map_err(|_| Error::NotRunning(name.to_owned()))?;
        if !dom.is_active().unwrap_or(false) {
            return Err(Error::NotRunning(name.to_owned()));
        }
        let pid = read_pid(&pid_dir.join(format!("{name}.pid")))?;
        let pidfd = hold(pid)?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !is_qemu_of(&cmdline, name) {
            return Err(Error::NotQemu {
                name: name.to_owned(),
                pid,
            });
        }
        let xml = dom
            .get_xml_desc(0)
            .map_err(|e| Error::Libvirt("get domain XML", e))?;
        let numa = parse_numa(&xml);
        let agent = agent_socket(&xml);
        Ok(Self {
            conn,
            name: name.to_owned(),
            uuid: uuid.to_owned(),
            pid,
            pidfd,
            numa,
            agent,
        })
    }

    /// The host socket of the domain's guest hint channel, as its live XML had it at attach
    /// ([`agent_socket`]).
    pub fn agent_socket(&self) -> Option<&Path> {
        self.agent.as_deref()
    }

    /// QEMU's pid.
    pub fn pid(&self) -> ProcessId {
        self.pid
    }

    /// The domain's NUMA settings, as read at attach.
    pub fn numa(&self) -> &Numa {
        &self.numa
    }

    /// Finds the guest RAM through libvirt's monitor API.
    pub fn discover(&mut self) -> Result<GuestMemoryLayout, Error> {
        if alive(self.pidfd.as_ref()) == Some(false) {
            return Err(Error::Exited(self.pid));
        }
        let dom = Domain::lookup_by_uuid_string(&self.conn, &self.uuid)
            .map_err(|_| Error::NotRunning(self.name.clone()))?;
        if !dom.is_active().unwrap_or(false) {
            return Err(Error::NotRunning(self.name.clone()));
        }
        Ok(qemu::locate_ram(&mut DomainMonitor(&dom), self.pid)?)
    }
}

impl VmBackend for LibvirtBackend {
    fn describe(&self) -> String {
        format!(
            "libvirt domain {} (qemu pid {}, {})",
            self.name, self.pid, self.numa
        )
    }

    fn layout(&mut self) -> Result<GuestMemoryLayout, BackendError> {
        self.discover().map_err(|e| match e {
            Error::Exited(_) | Error::NotRunning(_) => BackendError::Gone(e.into()),
            _ if alive(self.pidfd.as_ref()) == Some(false) => BackendError::Gone(e.into()),
            _ => BackendError::Unavailable(e.into()),
        })
    }

    fn process_alive(&self) -> Option<bool> {
        alive(self.pidfd.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numa_settings_are_read_from_domain_xml() {
        let cases = [
            ("<domain/>", Numa::default()),
            ("not xml", Numa::default()),
            (
                "<domain><numatune><memory mode='strict' nodeset='1'/></numatune></domain>",
                Numa {
                    cells: vec![],
                    memory: Some("strict 1".into()),
                },
            ),
            (
                "<domain><cpu><numa><cell id='0' cpus='0' memory='65536'/>\
                 <cell id='1' memory='64' unit='MiB'/><cell memory='1'/></numa></cpu>\
                 <numatune><memnode cellid='1' mode='preferred' nodeset='1'/></numatune></domain>",
                Numa {
                    cells: vec![
                        Cell {
                            id: 0,
                            bytes: 64 << 20,
                            memnode: None,
                        },
                        Cell {
                            id: 1,
                            bytes: 64 << 20,
                            memnode: Some("preferred 1".into()),
                        },
                    ],
                    memory: None,
                },
            ),
        ];
        for (xml, want) in cases {
            assert_eq!(parse_numa(xml), want, "{xml}");
        }
    }

    #[test]
    fn the_agent_channel_is_found_in_live_xml() {
        let chan = |ty: &str, mode: &str, target: &str, alias: &str| {
            format!(
                "<domain><devices><serial type='pty'><target port='0'/></serial>\
                 <channel type='{ty}'><source mode='{mode}' path='/run/a.sock'/>{target}{alias}\
                 </channel></devices></domain>"
            )
        };
        let virtio = "<target type='virtio' name='org.vmtier.agent.0' state='connected'/>";
        let other = "<target type='virtio' name='org.qemu.guest_agent.0'/>";
        let ua = "<alias name='ua-vmtier-agent'/>";
        let cases: Vec<(String, Option<&str>)> = vec![
            (
                chan("unix", "bind", virtio, "<alias name='channel0'/>"),
                Some("/run/a.sock"),
            ),
            (chan("unix", "bind", other, ""), None),
            (chan("unix", "connect", virtio, ""), None),
            (chan("pty", "bind", virtio, ""), None),
            (chan("unix", "bind", other, ua), Some("/run/a.sock")),
            (
                "<domain><devices><serial type='unix'><source mode='bind' path='/t/h.sock'/>\
                 <target type='isa-serial' port='1'/><alias name='ua-vmtier-agent'/></serial>\
                 </devices></domain>"
                    .into(),
                Some("/t/h.sock"),
            ),
            (
                "<domain><devices><channel type='unix'><target type='virtio' \
                 name='org.vmtier.agent.0'/></channel></devices></domain>"
                    .into(),
                None,
            ),
            ("<domain/>".into(), None),
            ("not xml".into(), None),
        ];
        for (xml, want) in cases {
            assert_eq!(agent_socket(&xml).as_deref(), want.map(Path::new), "{xml}");
        }
    }

    #[test]
    fn units_and_overflow() {
        let cases = [
            ("1", None, Some(1024)),
            ("1", Some("b"), Some(1)),
            ("2", Some("GiB"), Some(2 << 30)),
            ("2", Some("GB"), Some(2_000_000_000)),
            ("1", Some("parsecs"), None),
            ("x", None, None),
            ("18446744073709551615", Some("KiB"), None),
        ];
        for (v, u, want) in cases {
            assert_eq!(libvirt_bytes(v, u), want, "{v} {u:?}");
        }
    }

    #[test]
    fn qemu_command_lines_are_matched_to_their_domain() {
        let cmd = |s: &str| s.replace(' ', "\0").into_bytes();
        let cases = [
            ("qemu -name guest=wl1,debug-threads=on -m 128", "wl1", true),
            ("qemu -name guest=wl10,debug-threads=on", "wl1", false),
            ("qemu -name guest=a,,b,debug-threads=on", "a,b", true),
            ("qemu -m 128", "wl1", false),
            ("qemu -name", "wl1", false),
            ("sleep guest=wl1,", "wl1", false),
        ];
        for (c, name, want) in cases {
            assert_eq!(is_qemu_of(&cmd(c), name), want, "{c}");
        }
    }

    #[test]
    fn pid_files_are_checked() {
        let dir = std::env::temp_dir().join(format!("vmtier-lv-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [("42\n", Some(42)), ("0", None), ("-3", None), ("x", None)];
        for (text, want) in cases {
            let p = dir.join("d.pid");
            std::fs::write(&p, text).unwrap();
            assert_eq!(read_pid(&p).ok().map(ProcessId::raw), want, "{text:?}");
        }
        let err = read_pid(&dir.join("missing.pid")).unwrap_err();
        assert!(err.to_string().contains("missing.pid"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
