//! Any process as a "VM": configured host virtual ranges stand for guest RAM, laid out one
//! after another from guest physical address 0 in the order given.

use vmtier_core::backend::{Error as BackendError, VmBackend};
use vmtier_core::process::{self, Pidfd};
use vmtier_core::{GuestMemoryLayout, GuestPhysAddr, GuestRamRange, HostVirtAddr, ProcessId};

use crate::procmaps;
use crate::qemu::{alive, hold};

/// Error describing a process's ranges.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the maps failed (usually: the process is gone).
    #[error("Cannot read the process's mappings")]
    Maps(#[from] procmaps::Error),
    /// A configured range is not mapped by one kind of mapping.
    #[error("Range {hva} (+{len:#x}) is not mapped in process {pid}")]
    NotMapped {
        /// Start.
        hva: HostVirtAddr,
        /// Length.
        len: u64,
        /// The process.
        pid: ProcessId,
    },
    /// The ranges do not form a valid layout.
    #[error("Invalid ranges")]
    Layout(#[from] vmtier_core::layout::Error),
    /// The process could not be held (no such process, or not a valid pid).
    #[error("Cannot hold the process")]
    Process(#[from] process::Error),
    /// The process has exited (its pidfd says so), whatever its pid names now.
    #[error("Process {0} has exited")]
    Exited(ProcessId),
}

/// A process and the ranges of it to manage.
#[derive(Debug)]
pub struct PidBackend {
    pid: ProcessId,
    /// The process, held from [`Self::new`] on; `None` where the kernel has no pidfds.
    pidfd: Option<Pidfd>,
    ranges: Vec<(HostVirtAddr, u64)>,
}

impl PidBackend {
    /// Manages `ranges` (start, length) of `pid`, which is held by a pidfd from here on.
    pub fn new(pid: ProcessId, ranges: Vec<(HostVirtAddr, u64)>) -> Result<Self, Error> {
        let pidfd = hold(pid)?;
        Ok(Self { pid, pidfd, ranges })
    }

    /// The layout, after checking every range is mapped.
    pub fn discover(&self) -> Result<GuestMemoryLayout, Error> {
        if alive(self.pidfd.as_ref()) == Some(false) {
            return Err(Error::Exited(self.pid));
        }
        let maps = procmaps::read(self.pid)?;
        let mut gpa = 0u64;
        let mut out = Vec::with_capacity(self.ranges.len());
        for (i, &(hva, len)) in self.ranges.iter().enumerate() {
            let backing = procmaps::covering_backing(&maps, hva, len).ok_or(Error::NotMapped {
                hva,
                len,
                pid: self.pid,
            })?;
            out.push(GuestRamRange {
                name: format!("range{i}"),
                gpa: GuestPhysAddr(gpa),
                hva,
                len,
                backing,
            });
            gpa = gpa
                .checked_add(len)
                .ok_or(vmtier_core::layout::Error::Overflow(format!("range{i}")))?;
        }
        Ok(GuestMemoryLayout::new(self.pid, out)?)
    }
}

impl VmBackend for PidBackend {
    fn describe(&self) -> String {
        format!("process {} ({} ranges)", self.pid, self.ranges.len())
    }

    fn layout(&mut self) -> Result<GuestMemoryLayout, BackendError> {
        self.discover().map_err(|e| match e {
            Error::Maps(_) | Error::Exited(_) | Error::Process(_) => BackendError::Gone(e.into()),
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
    fn own_heap_buffer_is_a_layout_and_bad_ranges_are_refused() {
        let me = ProcessId::new(i32::try_from(std::process::id()).unwrap());
        let buf = vec![1u8; 64 << 10];
        let start = (buf.as_ptr() as u64 + 4095) & !4095;
        let ok = PidBackend::new(me, vec![(HostVirtAddr::new(start), 32 << 10)]).unwrap();
        assert_eq!(ok.process_alive(), Some(true));
        let l = ok.discover().unwrap();
        assert_eq!(l.total_bytes(), 32 << 10);
        assert_eq!(
            l.translate(GuestPhysAddr(4096)),
            Some(HostVirtAddr::new(start + 4096))
        );
        let unmapped = PidBackend::new(me, vec![(HostVirtAddr::new(0x1000), 4096)]).unwrap();
        assert!(matches!(unmapped.discover(), Err(Error::NotMapped { .. })));
        for raw in [i32::MAX, 0, -1] {
            let gone = PidBackend::new(ProcessId::new(raw), vec![(HostVirtAddr::new(start), 4096)]);
            assert!(matches!(gone, Err(Error::Process(_))), "{raw}");
        }
    }

    #[test]
    fn an_exited_process_is_gone_even_if_its_pid_is_reused() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = ProcessId::new(i32::try_from(child.id()).unwrap());
        let range = vec![(HostVirtAddr::new(0x1000), 4096)];
        let mut b = PidBackend::new(pid, range).unwrap();
        assert_eq!(b.process_alive(), Some(true));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(b.process_alive(), Some(false));
        let err = b.layout().unwrap_err();
        assert!(matches!(err, BackendError::Gone(_)), "{err}");
        assert!(
            vmtier_core::error_chain(&err).contains("has exited"),
            "{}",
            vmtier_core::error_chain(&err)
        );
    }
}
