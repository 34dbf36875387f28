//! A small synchronous QMP client: one command at a time, asynchronous events skipped.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use vmtier_core::ProcessId;

/// Error talking to QEMU.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Cannot connect to the socket.
    #[error("Cannot connect to QMP socket {0}")]
    Connect(PathBuf, #[source] io::Error),
    /// Reading or writing failed, or timed out.
    #[error("QMP I/O failed")]
    Io(#[source] io::Error),
    /// QEMU closed the connection (it exited, or another client took the monitor).
    #[error("QMP connection closed")]
    Closed,
    /// SO_PEERCRED gave pid 0: the peer is in another pid namespace, its pid is unknown here.
    #[error("The process serving {0} is in another pid namespace: give QEMU's pid with `pid =`")]
    ForeignPeer(PathBuf),
    /// QEMU sent something that is not QMP.
    #[error("Unexpected QMP message: {0}")]
    Protocol(String),
    /// QEMU refused the command.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command.
        command: String,
        /// QEMU's error class.
        class: String,
        /// QEMU's message.
        desc: String,
    },
}

/// A QMP connection, past capabilities negotiation.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    path: PathBuf,
    /// The peer's pid as SO_PEERCRED gives it; 0 for a peer in another pid namespace.
    peer_pid: i32,
    /// The peer's pidfd from SO_PEERPIDFD (Linux 6.5), until taken.
    peer_pidfd: Option<OwnedFd>,
    line: String,
}

impl Qmp {
    /// Connects, reads the greeting and leaves capabilities negotiation mode. Every reply
    /// must arrive within `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, Error> {
        let stream = UnixStream::connect(path).map_err(|e| Error::Connect(path.into(), e))?;
        stream.set_read_timeout(Some(timeout)).map_err(Error::Io)?;
        stream.set_write_timeout(Some(timeout)).map_err(Error::Io)?;
        // The pidfd first: it names the very process whose credentials the socket holds.
        let peer_pidfd = peer_pidfd(&stream);
        let peer_pid = peer_pid(&stream).map_err(|e| Error::Connect(path.into(), e))?;
        let writer = stream.try_clone().map_err(Error::Io)?;
        let mut qmp = Self {
            reader: BufReader::new(stream),
            writer,
            path: path.into(),
            peer_pid,
            peer_pidfd,
            line: String::new(),
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(Error::Protocol(greeting.to_string()));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// The process on the other end of the socket (QEMU, or a proxy). An error if it is in
    /// another pid namespace: SO_PEERCRED then reports pid 0, which the kernel's calls
    /// would take to mean vmtierd itself.
    pub fn pid(&self) -> Result<ProcessId, Error> {
        peer_pid_of(self.peer_pid, &self.path)
    }

    /// The peer's pidfd, where the kernel gives one with the socket (`SO_PEERPIDFD`,
    /// Linux 6.5); `None` on older kernels or once taken.
    pub fn take_pidfd(&mut self) -> Option<OwnedFd> {
        self.peer_pidfd.take()
    }

    fn read_message(&mut self) -> Result<Value, Error> {
        self.line.clear();
        match self.reader.read_line(&mut self.line) {
            Ok(0) => Err(Error::Closed),
            Ok(_) => serde_json::from_str(&self.line)
                .map_err(|_| Error::Protocol(self.line.trim_end().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Err(Error::Closed),
            Err(e) => Err(Error::Io(e)),
        }
    }

    /// Runs a command and returns its `return` value.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, Error> {
        let mut msg = json!({ "execute": command });
        if let Some(args) = arguments {
            msg["arguments"] = args;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.writer
            .write_all(text.as_bytes())
            .map_err(|e| match e.kind() {
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => Error::Closed,
                _ => Error::Io(e),
            })?;
        loop {
            let mut reply = self.read_message()?;
            if reply.get("event").is_some() {
                continue;
            }
            if let Some(ret) = reply.get_mut("return") {
                return Ok(ret.take());
            }
            if let Some(err) = reply.get("error") {
                let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("?").to_owned();
                return Err(Error::Command {
                    command: command.to_owned(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            return Err(Error::Protocol(reply.to_string()));
        }
    }

    /// Runs an HMP command through `human-monitor-command` and returns its text.
    pub fn hmp(&mut self, command_line: &str) -> Result<String, Error> {
        let ret = self.execute(
            "human-monitor-command",
            Some(json!({ "command-line": command_line })),
        )?;
        ret.as_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Protocol(ret.to_string()))
    }
}

/// A raw SO_PEERCRED pid as a process id: 0 (a peer in another pid namespace) and
/// negative values are refused.
fn peer_pid_of(raw: i32, path: &Path) -> Result<ProcessId, Error> {
    if raw > 0 {
        Ok(ProcessId::new(raw))
    } else {
        Err(Error::ForeignPeer(path.into()))
    }
}

/// `SO_PEERPIDFD` from `<asm-generic/socket.h>` (sparc numbers it differently).
#[cfg(not(target_arch = "sparc64"))]
const SO_PEERPIDFD: libc::c_int = 77;
#[cfg(target_arch = "sparc64")]
const SO_PEERPIDFD: libc::c_int = 0x56;

/// A pidfd of the process on the other end of a unix socket (Linux 6.5), or `None`.
fn peer_pidfd(stream: &UnixStream) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).ok()?;
    // SAFETY: SO_PEERPIDFD writes one int (a new descriptor) into `fd`, which lives across
    // the call; the socket is a valid descriptor owned by `stream`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            std::ptr::addr_of_mut!(fd).cast(),
            &mut len,
        )
    };
    if r != 0 || fd < 0 {
        return None;
    }
    // SAFETY: the kernel created `fd` for this call and nothing else owns it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The raw pid of the process on the other end of a unix socket (0: another namespace).
fn peer_pid(stream: &UnixStream) -> io::Result<i32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into `cred`, a properly sized and
    // aligned ucred that lives across the call; the fd is a valid socket owned by `stream`.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::thread;

    /// A scripted peer: checks each request line against the expected command and answers.
    /// This tests the client's framing only; the QEMU integration runs in the testbed.
    fn serve(script: Vec<(&'static str, &'static str)>) -> (PathBuf, thread::JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!(
            "vmtier-qmp-{}-{:?}",
            std::process::id(),
            thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let h = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            for (expect, reply) in script {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 {
                    return;
                }
                assert!(line.contains(expect), "expected {expect} in {line}");
                s.write_all(reply.as_bytes()).unwrap();
            }
        });
        (path, h)
    }

    #[test]
    fn commands_events_errors_and_close() {
        let (path, h) = serve(vec![
            ("qmp_capabilities", "{\"return\": {}}\n"),
            (
                "query-status",
                "{\"event\": \"STOP\"}\n{\"return\": {\"status\": \"running\"}}\n",
            ),
            ("human-monitor-command", "{\"return\": \"hello\\r\\n\"}\n"),
            (
                "bogus",
                "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"nope\"}}\n",
            ),
        ]);
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        assert_eq!(
            q.pid().unwrap().raw(),
            i32::try_from(std::process::id()).unwrap()
        );
        if let Some(fd) = q.take_pidfd() {
            // Linux 6.5+: the socket's own pidfd names this (live) process.
            let pidfd = vmtier_core::process::Pidfd::from_owned_fd(fd, q.pid().unwrap());
            assert!(pidfd.is_alive().unwrap());
        }
        let st = q.execute("query-status", None).unwrap();
        assert_eq!(st["status"], "running");
        assert_eq!(q.hmp("info version").unwrap(), "hello\r\n");
        let err = q.execute("bogus", None).unwrap_err();
        assert!(
            matches!(&err, Error::Command { class, .. } if class == "CommandNotFound"),
            "{err}"
        );
        h.join().unwrap();
        assert!(matches!(
            q.execute("query-status", None),
            Err(Error::Closed)
        ));
    }

    #[test]
    fn peer_pids_of_other_namespaces_are_refused() {
        let path = Path::new("/run/vm.qmp");
        let cases: [(i32, Option<i32>); 4] =
            [(4242, Some(4242)), (1, Some(1)), (0, None), (-1, None)];
        for (raw, want) in cases {
            let got = peer_pid_of(raw, path);
            assert_eq!(got.as_ref().ok().map(|p| p.raw()), want, "{raw}");
            if let Err(e) = got {
                let msg = e.to_string();
                assert!(
                    msg.contains("/run/vm.qmp") && msg.contains("`pid =`"),
                    "{msg}"
                );
            }
        }
    }

    #[test]
    fn connect_to_missing_socket_names_it() {
        let err =
            Qmp::connect(Path::new("/nonexistent/qmp.sock"), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/qmp.sock"), "{err}");
    }
}
