//! A managed process held by a pidfd, so that a pid is never used after its process is gone.
//!
//! A pid is only a number: once its process exits and is reaped the kernel may hand it to
//! an unrelated process, and `move_pages(2)` or the module's ioctl would then move that
//! process's memory. A pidfd (`pidfd_open(2)`, Linux 5.3) refers to the process it was
//! opened for and becomes readable when that process exits, whatever happens to the number
//! afterwards. Backends open one when they attach ([`Pidfd::open`], or from the QMP
//! socket's peer) and the engine asks it before every use of the pid
//! ([`crate::VmBackend::process_alive`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::ProcessId;

/// Error opening or polling a pidfd.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Pids are positive; 0 and negative values mean "the caller" or a process group.
    #[error("Invalid pid {0}: a process id is positive")]
    InvalidPid(ProcessId),
    /// No such process (it exited, or it is in another pid namespace).
    #[error("No process {0}")]
    NoProcess(ProcessId),
    /// The kernel has no `pidfd_open(2)` (before 5.3) or a seccomp filter forbids it.
    #[error("pidfd_open is not available")]
    Unsupported(#[source] io::Error),
    /// `pidfd_open(2)` failed otherwise (for example: the pid is a thread, not a process).
    #[error("Cannot open a pidfd for process {0}")]
    Open(ProcessId, #[source] io::Error),
    /// `poll(2)` on the pidfd failed.
    #[error("Cannot poll the pidfd of process {0}")]
    Poll(ProcessId, #[source] io::Error),
}

/// An open pidfd and the pid it was opened for. Dropping it closes the descriptor.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: ProcessId,
}

impl Pidfd {
    /// Opens a pidfd for `pid` (which must be positive: 0 would name the caller).
    pub fn open(pid: ProcessId) -> Result<Self, Error> {
        if pid.raw() <= 0 {
            return Err(Error::InvalidPid(pid));
        }
        // SAFETY: pidfd_open takes a pid and flags (0) and returns a new descriptor or -1;
        // it reads and writes no memory of ours.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.raw(), 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) => Error::NoProcess(pid),
                Some(libc::ENOSYS | libc::EPERM) => Error::Unsupported(e),
                _ => Error::Open(pid, e),
            });
        }
        let raw = libc::c_int::try_from(r)
            .map_err(|_| Error::Open(pid, io::Error::from(io::ErrorKind::InvalidData)))?;
        // SAFETY: `raw` is a descriptor the kernel just created for us (close-on-exec, as
        // pidfd_open always makes them) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(Self { fd, pid })
    }

    /// Wraps a pidfd obtained otherwise (`SO_PEERPIDFD` on a unix socket) for `pid`. The
    /// caller vouches that `fd` is a pidfd of that process.
    pub fn from_owned_fd(fd: OwnedFd, pid: ProcessId) -> Self {
        Self { fd, pid }
    }

    /// The pid the descriptor was opened for (meaningful while [`Self::is_alive`]).
    pub fn pid(&self) -> ProcessId {
        self.pid
    }

    /// Whether the process still runs: `false` once it has exited (a zombie included),
    /// even if its pid now names another process. One `poll(2)` that never blocks.
    pub fn is_alive(&self) -> Result<bool, Error> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: `pfd` is one valid pollfd that lives across the call; timeout 0 makes
            // the call return at once.
            let r = unsafe { libc::poll(&mut pfd, 1, 0) };
            if r >= 0 {
                // Readable (or hung up, once reaped) means the process has exited.
                return Ok(r == 0 || pfd.revents == 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(Error::Poll(self.pid, e));
            }
        }
    }
}

impl AsFd for Pidfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn pid_of(child: &std::process::Child) -> ProcessId {
        ProcessId::new(i32::try_from(child.id()).unwrap())
    }

    #[test]
    fn a_child_is_alive_until_it_exits_and_stays_dead_after_reaping() {
        let mut child = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let pidfd = Pidfd::open(pid_of(&child)).unwrap();
        assert_eq!(pidfd.pid(), pid_of(&child));
        assert!(pidfd.is_alive().unwrap());
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: the number may now be reused, the pidfd still says "exited".
        assert!(!pidfd.is_alive().unwrap());
        assert!(!pidfd.is_alive().unwrap(), "stable answer");
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = Command::new("true").stdin(Stdio::null()).spawn().unwrap();
        let pidfd = Pidfd::open(pid_of(&child)).unwrap();
        // Not reaped yet: wait until it has exited, through the pidfd itself.
        let mut pfd = libc::pollfd {
            fd: pidfd.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack; 10 s timeout.
        let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert_eq!(r, 1);
        assert!(!pidfd.is_alive().unwrap());
        child.wait().unwrap();
    }

    #[test]
    fn bad_pids_are_refused() {
        let cases: [(i32, &str); 4] = [
            (0, "Invalid pid 0"),
            (-1, "Invalid pid -1"),
            (i32::MIN, "Invalid pid"),
            (i32::MAX, "No process"),
        ];
        for (raw, want) in cases {
            let err = Pidfd::open(ProcessId::new(raw)).unwrap_err().to_string();
            assert!(err.contains(want), "{raw}: {err}");
        }
    }

    #[test]
    fn our_own_process_is_alive() {
        let me = ProcessId::new(i32::try_from(std::process::id()).unwrap());
        assert!(Pidfd::open(me).unwrap().is_alive().unwrap());
    }
}
