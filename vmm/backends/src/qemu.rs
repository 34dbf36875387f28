//! A QEMU guest's RAM, found through QMP.
//!
//! 1. `query-memdev` names the memory backends (guest RAM objects).
//! 2. HMP `info mtree -f` gives the flat view of the `memory` address space: the guest
//!    physical ranges where each backend is mapped, with the offset into the backend.
//! 3. HMP `gpa2hva` gives the host virtual address of each range's first byte; ranges of one
//!    backend must agree with each other (same hva − offset).
//! 4. `/proc/PID/maps` must cover each range with one kind of mapping, which tells how the
//!    range can be migrated.

use std::path::{Path, PathBuf};
use std::time::Duration;

use log::warn;
use serde_json::Value;
use vmtier_core::backend::{Error as BackendError, VmBackend};
use vmtier_core::process::{self, Pidfd};
use vmtier_core::{GuestMemoryLayout, GuestPhysAddr, GuestRamRange, HostVirtAddr, ProcessId};

use crate::procmaps;
use crate::qmp::{self, Qmp};

/// Error finding a QEMU guest's RAM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Talking to QEMU failed.
    #[error("QMP failed")]
    Qmp(#[from] qmp::Error),
    /// A monitor reached another way (libvirt's monitor-command API) failed.
    #[error("QEMU monitor command failed")]
    Monitor(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// `info mtree -f` output did not parse.
    #[error("Cannot parse 'info mtree -f' line {0:?}")]
    Mtree(String),
    /// No flat view for the `memory` address space.
    #[error("No flat view of address space \"memory\" in 'info mtree -f'")]
    NoSystemFlatView,
    /// `gpa2hva` gave no address.
    #[error("Cannot parse gpa2hva reply for {gpa:#x}: {reply:?}")]
    Gpa2hva {
        /// The guest address asked about.
        gpa: u64,
        /// QEMU's reply.
        reply: String,
    },
    /// The VM has no RAM backed by a memory backend.
    #[error("No guest RAM found (memory backends: {0:?})")]
    NoRam(Vec<String>),
    /// Two ranges of one backend disagree on where it is mapped.
    #[error("Ranges of memory backend {0:?} disagree on its host address")]
    Inconsistent(String),
    /// The host range is not covered by mappings of one kind.
    #[error("Guest RAM {name:?} at {hva} (+{len:#x}) is not mapped in process {pid}")]
    NotMapped {
        /// Backend name.
        name: String,
        /// Start of the host range.
        hva: HostVirtAddr,
        /// Length.
        len: u64,
        /// The QEMU process.
        pid: vmtier_core::ProcessId,
    },
    /// QEMU's process could not be held (it exited, or the configured pid is wrong).
    #[error("Cannot hold QEMU's process")]
    Process(#[from] process::Error),
    /// QEMU has exited (its pidfd says so), whatever now answers on its socket or pid.
    #[error("QEMU process {0} has exited")]
    Exited(ProcessId),
    /// After a reconnect, another process answers on the QMP socket.
    #[error("QMP socket {socket} is now served by process {now}, not QEMU {pid}")]
    OtherPeer {
        /// The socket.
        socket: PathBuf,
        /// The QEMU that was attached.
        pid: ProcessId,
        /// The process serving the socket now.
        now: ProcessId,
    },
    /// Reading the process's mappings failed.
    #[error("Cannot read QEMU's mappings")]
    Maps(#[from] procmaps::Error),
    /// The ranges do not form a valid layout.
    #[error("Invalid guest RAM layout")]
    Layout(#[from] vmtier_core::layout::Error),
}

/// One line of a flat view: `start-end (prio P, kind): name [@offset]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatRange {
    /// First guest physical address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// `ram`, `rom`, `romd`, `i/o`.
    pub kind: String,
    /// Memory region name.
    pub name: String,
    /// Offset into the memory region.
    pub offset: u64,
}

/// Parses the flat view of the `memory` address space from `info mtree -f`.
pub fn parse_flat_mtree(text: &str) -> Result<Vec<FlatRange>, Error> {
    let mut out = Vec::new();
    let mut in_memory_view = false;
    let mut found = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("FlatView #") {
            in_memory_view = false;
        } else if t.starts_with("AS \"memory\",") {
            in_memory_view = true;
            found = true;
        } else if in_memory_view && t.contains("(prio ") {
            out.push(parse_flat_line(t).ok_or_else(|| Error::Mtree(t.to_owned()))?);
        }
    }
    if found {
        Ok(out)
    } else {
        Err(Error::NoSystemFlatView)
    }
}

fn parse_flat_line(t: &str) -> Option<FlatRange> {
    let (range, rest) = t.split_once(' ')?;
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let last = u64::from_str_radix(e, 16).ok()?;
    let (attrs, rest) = rest.trim_start().strip_prefix('(')?.split_once("):")?;
    let kind = attrs.split_once(", ")?.1.to_owned();
    let mut words = rest.split_whitespace();
    let name = words.next()?.to_owned();
    let offset = match words.next() {
        Some(w) if w.starts_with('@') => u64::from_str_radix(&w[1..], 16).ok()?,
        _ => 0,
    };
    Some(FlatRange {
        start,
        len: last.checked_sub(start)?.checked_add(1)?,
        kind,
        name,
        offset,
    })
}

/// Parses `Host virtual address for 0x100000 (ram0) is 0x7ff47bf00000`.
pub fn parse_gpa2hva(reply: &str) -> Option<HostVirtAddr> {
    let hex = reply.trim().rsplit_once(" is 0x")?.1;
    u64::from_str_radix(hex, 16).ok().map(HostVirtAddr::new)
}

/// A QEMU VM reached through its QMP socket.
#[derive(Debug)]
pub struct QemuBackend {
    /// `None` after the connection broke; the next [`Self::discover`] reconnects.
    qmp: Option<Qmp>,
    socket: PathBuf,
    pid: ProcessId,
    /// Whether `pid` was given (a proxy serves the socket) rather than the socket's peer.
    pid_given: bool,
    /// QEMU's process, held from connect on; `None` where the kernel has no pidfds.
    pidfd: Option<Pidfd>,
    timeout: Duration,
}

/// A pidfd for `pid`; `None` (logged) where the kernel cannot give one.
pub fn hold(pid: ProcessId) -> Result<Option<Pidfd>, process::Error> {
    match Pidfd::open(pid) {
        Ok(p) => Ok(Some(p)),
        Err(e @ process::Error::Unsupported(_)) => {
            warn!(
                "process {pid}: {}; a reused pid cannot be detected",
                vmtier_core::error_chain(&e)
            );
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// What a pidfd says, with a poll failure taken as "exited": a pid is used only while its
/// process is known to be the one attached.
pub fn alive(pidfd: Option<&Pidfd>) -> Option<bool> {
    pidfd.map(|p| {
        p.is_alive().unwrap_or_else(|e| {
            warn!("{}", vmtier_core::error_chain(&e));
            false
        })
    })
}

impl QemuBackend {
    /// Connects to QEMU's QMP socket; QEMU is the process on the other end.
    pub fn connect(socket: &Path, timeout: Duration) -> Result<Self, Error> {
        Self::connect_to(socket, timeout, None)
    }

    /// Connects to QEMU's QMP socket; `pid` names QEMU when a proxy serves the socket.
    /// QEMU's process is held by a pidfd from here on: the socket's own (`SO_PEERPIDFD`)
    /// when QEMU is the peer, else one opened for the pid.
    pub fn connect_to(
        socket: &Path,
        timeout: Duration,
        pid: Option<ProcessId>,
    ) -> Result<Self, Error> {
        let mut qmp = Qmp::connect(socket, timeout)?;
        let pid_given = pid.is_some();
        let (pid, pidfd) = match pid {
            Some(pid) => (pid, hold(pid)?),
            None => {
                let pid = qmp.pid()?;
                let pidfd = match qmp.take_pidfd() {
                    Some(fd) => Some(Pidfd::from_owned_fd(fd, pid)),
                    None => hold(pid)?,
                };
                (pid, pidfd)
            }
        };
        if alive(pidfd.as_ref()) == Some(false) {
            return Err(Error::Exited(pid));
        }
        Ok(Self {
            pid,
            pid_given,
            pidfd,
            qmp: Some(qmp),
            socket: socket.to_owned(),
            timeout,
        })
    }

    /// The QEMU process.
    pub fn pid(&self) -> ProcessId {
        self.pid
    }

    /// Finds every guest RAM range and its host address. A broken QMP connection is
    /// dropped and re-opened on the next call, as long as the same QEMU answers.
    pub fn discover(&mut self) -> Result<GuestMemoryLayout, Error> {
        if alive(self.pidfd.as_ref()) == Some(false) {
            self.qmp = None;
            return Err(Error::Exited(self.pid));
        }
        if self.qmp.is_none() {
            let q = Qmp::connect(&self.socket, self.timeout)?;
            if !self.pid_given {
                let now = q.pid()?;
                if now != self.pid {
                    return Err(Error::OtherPeer {
                        socket: self.socket.clone(),
                        pid: self.pid,
                        now,
                    });
                }
            }
            self.qmp = Some(q);
        }
        let r = self.discover_with_qmp();
        if matches!(r, Err(Error::Qmp(qmp::Error::Closed | qmp::Error::Io(_)))) {
            self.qmp = None;
        }
        r
    }

    fn discover_with_qmp(&mut self) -> Result<GuestMemoryLayout, Error> {
        let Some(qmp) = self.qmp.as_mut() else {
            return Err(Error::Qmp(qmp::Error::Closed));
        };
        locate_ram(qmp, self.pid)
    }
}

/// A QEMU monitor: QMP commands without arguments and HMP commands. QMP over a socket
/// ([`Qmp`]) is one; libvirt's monitor-command API is another (vmtier-libvirt).
pub trait Monitor {
    /// Runs a QMP command without arguments; its `return` value.
    fn qmp(&mut self, cmd: &str) -> Result<Value, Error>;
    /// Runs an HMP command; its text output.
    fn hmp(&mut self, cmd: &str) -> Result<String, Error>;
}

impl Monitor for Qmp {
    fn qmp(&mut self, cmd: &str) -> Result<Value, Error> {
        Ok(self.execute(cmd, None)?)
    }

    fn hmp(&mut self, cmd: &str) -> Result<String, Error> {
        Ok(Qmp::hmp(self, cmd)?)
    }
}

/// Finds every guest RAM range of the QEMU process `pid` through its monitor and checks
/// each against `/proc/PID/maps` (steps 1–4 of this module's description).
pub fn locate_ram(qmp: &mut dyn Monitor, pid: ProcessId) -> Result<GuestMemoryLayout, Error> {
    let memdevs = qmp.qmp("query-memdev")?;
    let ids: Vec<String> = memdevs
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let mtree = qmp.hmp("info mtree -f")?;
    let flat: Vec<FlatRange> = parse_flat_mtree(&mtree)?
        .into_iter()
        .filter(|r| r.kind == "ram" && ids.contains(&r.name))
        .collect();
    if flat.is_empty() {
        return Err(Error::NoRam(ids));
    }
    let maps = procmaps::read(pid)?;
    let mut ranges = Vec::with_capacity(flat.len());
    // Host address of offset 0 of each backend, to check that its ranges agree.
    let mut bases: Vec<(String, u64)> = Vec::new();
    for r in flat {
        let reply = qmp.hmp(&format!("gpa2hva {:#x}", r.start))?;
        let hva = parse_gpa2hva(&reply).ok_or_else(|| Error::Gpa2hva {
            gpa: r.start,
            reply: reply.trim().to_owned(),
        })?;
        let base = hva
            .raw()
            .checked_sub(r.offset)
            .ok_or_else(|| Error::Inconsistent(r.name.clone()))?;
        match bases.iter().find(|b| b.0 == r.name) {
            Some(b) if b.1 != base => return Err(Error::Inconsistent(r.name)),
            Some(_) => {}
            None => bases.push((r.name.clone(), base)),
        }
        let backing =
            procmaps::covering_backing(&maps, hva, r.len).ok_or_else(|| Error::NotMapped {
                name: r.name.clone(),
                hva,
                len: r.len,
                pid,
            })?;
        ranges.push(GuestRamRange {
            name: r.name,
            gpa: GuestPhysAddr(r.start),
            hva,
            len: r.len,
            backing,
        });
    }
    Ok(GuestMemoryLayout::new(pid, ranges)?)
}

impl VmBackend for QemuBackend {
    fn describe(&self) -> String {
        format!("qemu pid {} via {}", self.pid, self.socket.display())
    }

    fn layout(&mut self) -> Result<GuestMemoryLayout, BackendError> {
        let r = self.discover();
        let alive = self
            .process_alive()
            .unwrap_or_else(|| Path::new(&format!("/proc/{}", self.pid)).exists());
        r.map_err(|e| match e {
            Error::Exited(_) | Error::OtherPeer { .. } => BackendError::Gone(e.into()),
            // QMP closed while QEMU lives (a restarted management proxy): try again later.
            _ if alive => BackendError::Unavailable(e.into()),
            _ => BackendError::Gone(e.into()),
        })
    }

    fn process_alive(&self) -> Option<bool> {
        alive(self.pidfd.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded from QEMU 7.2 (`-machine pc,memory-backend=ram0 -m 128M`), trimmed.
    const MTREE: &str = "\
FlatView #0
 AS \"cpu-smm-0\", root: memory
 Root memory region: memory
  0000000000000000-00000000000bffff (prio 0, ram): ram0
  0000000000100000-0000000007ffffff (prio 0, ram): ram0 @0000000000100000

FlatView #2
 AS \"memory\", root: system
 AS \"cpu-memory-0\", root: system
 Root memory region: system
  0000000000000000-00000000000bffff (prio 0, ram): ram0
  00000000000c0000-00000000000dffff (prio 1, rom): pc.rom
  00000000000e0000-00000000000fffff (prio 0, rom): pc.bios @0000000000020000
  0000000000100000-0000000007ffffff (prio 0, ram): ram0 @0000000000100000
  00000000fec00000-00000000fec00fff (prio 0, i/o): ioapic

FlatView #3
 AS \"I/O\", root: io
 Root memory region: io
  0000000000000000-0000000000000007 (prio 0, i/o): dma-chan
";

    #[test]
    fn flat_view_of_system_memory_is_parsed() {
        let v = parse_flat_mtree(MTREE).unwrap();
        let got: Vec<(u64, u64, &str, &str, u64)> = v
            .iter()
            .map(|r| (r.start, r.len, r.kind.as_str(), r.name.as_str(), r.offset))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 0xc0000, "ram", "ram0", 0),
                (0xc0000, 0x20000, "rom", "pc.rom", 0),
                (0xe0000, 0x20000, "rom", "pc.bios", 0x20000),
                (0x100000, 0x7f00000, "ram", "ram0", 0x100000),
                (0xfec00000, 0x1000, "i/o", "ioapic", 0),
            ]
        );
    }

    #[test]
    fn bad_mtree_is_reported() {
        let cases = [
            ("FlatView #0\n AS \"I/O\", root: io\n", "No flat view"),
            (
                "FlatView #0\n AS \"memory\", root: system\n  zz-00 (prio 0, ram): x\n",
                "Cannot parse",
            ),
        ];
        for (text, want) in cases {
            let err = parse_flat_mtree(text).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn gpa2hva_replies() {
        let cases = [
            (
                "Host virtual address for 0x100000 (ram0) is 0x7ff47bf00000\r\n",
                Some(0x7ff4_7bf0_0000),
            ),
            ("No memory is mapped at address 0xfffff000\r\n", None),
        ];
        for (reply, want) in cases {
            assert_eq!(parse_gpa2hva(reply).map(HostVirtAddr::raw), want);
        }
    }
}
