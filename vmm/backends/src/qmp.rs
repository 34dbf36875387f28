//! A small synchronous QMP client: one command at a time, asynchronous events skipped.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
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
    pid: ProcessId,
    line: String,
}

impl Qmp {
    /// Connects, reads the greeting and leaves capabilities negotiation mode. Every reply
    /// must arrive within `timeout`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, Error> {
        let stream = UnixStream::connect(path).map_err(|e| Error::Connect(path.into(), e))?;
        stream.set_read_timeout(Some(timeout)).map_err(Error::Io)?;
        stream.set_write_timeout(Some(timeout)).map_err(Error::Io)?;
        let pid = peer_pid(&stream).map_err(|e| Error::Connect(path.into(), e))?;
        let writer = stream.try_clone().map_err(Error::Io)?;
        let mut qmp = Self {
            reader: BufReader::new(stream),
            writer,
            pid,
            line: String::new(),
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(Error::Protocol(greeting.to_string()));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    /// The QEMU process on the other end of the socket.
    pub fn pid(&self) -> ProcessId {
        self.pid
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

/// The pid of the process on the other end of a unix socket.
fn peer_pid(stream: &UnixStream) -> io::Result<ProcessId> {
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
    Ok(ProcessId::new(cred.pid))
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
        assert_eq!(q.pid().raw(), i32::try_from(std::process::id()).unwrap());
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
    fn connect_to_missing_socket_names_it() {
        let err =
            Qmp::connect(Path::new("/nonexistent/qmp.sock"), Duration::from_secs(1)).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/qmp.sock"), "{err}");
    }
}
