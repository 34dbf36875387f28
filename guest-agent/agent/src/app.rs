//! The local socket through which applications mark their own virtual ranges hot, cold or
//! pinned. One JSON object per line each way (docs/guest-agent.md, "App socket"):
//!
//! ```text
//! → {"op":"mark","addr":140737352630272,"len":8388608,"kind":"hot"}
//! ← {"ok":true,"id":1,"pages":2048}
//! → {"op":"sync"}
//! ← {"ok":true,"epoch":12,"frames":3}
//! ```
//!
//! The caller is who the kernel says it is (`SO_PEERCRED`): its marks are translated through
//! *its* pagemap at every snapshot, so a process can only describe pages it maps. Marks
//! live as long as the connection (and the process: a pid reused by another process, seen
//! by a different start time, drops them). Everything is bounded: clients, marks per
//! client, bytes per mark, line length, unsent replies.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use serde::Deserialize;

use crate::config::AppConfig;
use crate::pagemap;
use crate::ranges::{self, Hint, Kind, Source, PAGE};

/// Longest request line, bytes.
pub const MAX_LINE_BYTES: usize = 4096;
/// Most reply bytes queued for one client before it is dropped.
const MAX_REPLY_BYTES: usize = 64 * 1024;
/// Highest user-space address accepted (x86-64, 5-level paging).
const USER_TOP: u64 = 1 << 56;

/// Errors of setting up the socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Binding failed.
    #[error("Cannot listen on {0}")]
    Bind(String, #[source] io::Error),
    /// Another agent answers on the socket.
    #[error("Another agent listens on {0}")]
    InUse(String),
    /// chmod/chown failed.
    #[error("Cannot set mode or group of {0}")]
    Perm(String, #[source] io::Error),
    /// The configured group does not exist.
    #[error("Unknown group {0:?}")]
    Group(String),
}

/// One request line.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Mark `[addr, addr+len)` of the caller's address space.
    Mark {
        /// Start, bytes, page-aligned.
        addr: u64,
        /// Length, bytes, page-aligned.
        len: u64,
        /// `hot`, `cold` or `pinned`.
        kind: Kind,
        /// 1..=255; default the configured app weight.
        #[serde(default)]
        weight: Option<u8>,
    },
    /// Drop one mark.
    Unmark {
        /// Its id.
        id: u64,
    },
    /// Drop every mark of this connection.
    Clear,
    /// List this connection's marks.
    List,
    /// Take a snapshot and queue it now; the reply names its epoch.
    Sync,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mark {
    id: u64,
    addr: u64,
    len: u64,
    kind: Kind,
    weight: u8,
}

#[derive(Debug)]
struct Client {
    stream: UnixStream,
    pid: i32,
    start: Option<u64>,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    marks: Vec<Mark>,
    wants_sync: bool,
    closed: bool,
}

/// Counters of the app socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections refused (too many clients, no credentials).
    pub refused: u64,
    /// Requests rejected (bad JSON, bad values, limits).
    pub bad_requests: u64,
}

/// The listening socket and its clients.
#[derive(Debug)]
pub struct AppServer {
    listener: UnixListener,
    path: String,
    cfg: AppConfig,
    clients: Vec<Client>,
    next_id: u64,
    /// Counters.
    pub stats: Stats,
}

fn gid_of(group: &str) -> Result<u32, Error> {
    if let Ok(n) = group.parse::<u32>() {
        return Ok(n);
    }
    let text = fs::read_to_string("/etc/group").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid = f.nth(1)?.parse::<u32>().ok()?;
            (name == group).then_some(gid)
        })
        .next()
        .ok_or_else(|| Error::Group(group.to_owned()))
}

fn peer(stream: &UnixStream) -> Option<(i32, u32)> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::ucred>()).ok()?;
    // SAFETY: the fd is an open socket; c and len are valid for writes of their sizes.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0 && c.pid > 0).then_some((c.pid, c.uid))
}

impl AppServer {
    /// Listens on the configured path with the configured mode and group. A stale socket
    /// file (nobody answers) is replaced.
    pub fn bind(cfg: &AppConfig) -> Result<Self, Error> {
        let p = &cfg.socket;
        let name = p.display().to_string();
        if let Ok(m) = fs::symlink_metadata(p) {
            if m.file_type().is_socket() {
                if UnixStream::connect(p).is_ok() {
                    return Err(Error::InUse(name));
                }
                let _ = fs::remove_file(p);
            }
        }
        if let Some(dir) = p.parent() {
            let _ = fs::create_dir_all(dir);
        }
        // Bound under a temporary name, given its mode and group, then renamed into place:
        // the socket never appears at its path with other permissions.
        let mut tmp = p.as_os_str().to_owned();
        tmp.push(format!(".new-{}", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        let _ = fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp).map_err(|e| Error::Bind(name.clone(), e))?;
        let setup = || -> Result<(), Error> {
            listener
                .set_nonblocking(true)
                .map_err(|e| Error::Bind(name.clone(), e))?;
            let mode = cfg
                .mode_bits()
                .map_err(|e| Error::Perm(name.clone(), io::Error::other(e.to_string())))?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(mode))
                .map_err(|e| Error::Perm(name.clone(), e))?;
            if !cfg.group.is_empty() {
                let gid = gid_of(&cfg.group)?;
                std::os::unix::fs::chown(&tmp, None, Some(gid))
                    .map_err(|e| Error::Perm(name.clone(), e))?;
            }
            fs::rename(&tmp, p).map_err(|e| Error::Bind(name.clone(), e))
        };
        if let Err(e) = setup() {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(Self {
            listener,
            path: name,
            cfg: cfg.clone(),
            clients: Vec::new(),
            next_id: 1,
            stats: Stats::default(),
        })
    }

    /// File descriptors to poll and whether each wants POLLOUT.
    pub fn poll_fds(&self) -> Vec<(RawFd, bool)> {
        let mut v = vec![(self.listener.as_raw_fd(), false)];
        v.extend(
            self.clients
                .iter()
                .map(|c| (c.stream.as_raw_fd(), !c.out.is_empty())),
        );
        v
    }

    /// Accepts new clients, reads and answers requests, flushes replies, drops closed
    /// clients. Returns whether some client asked for a snapshot (`sync`).
    pub fn service(&mut self) -> bool {
        loop {
            match self.listener.accept() {
                Ok((s, _)) => self.admit(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::warn!("app socket {}: accept failed: {e}", self.path);
                    break;
                }
            }
        }
        let mut sync = false;
        for i in 0..self.clients.len() {
            self.read_client(i);
            sync |= self.clients[i].wants_sync;
            flush(&mut self.clients[i]);
        }
        self.clients.retain(|c| !c.closed);
        sync
    }

    fn admit(&mut self, s: UnixStream) {
        let Some((pid, uid)) = peer(&s) else {
            self.stats.refused += 1;
            return;
        };
        if self.clients.len() >= self.cfg.max_clients || s.set_nonblocking(true).is_err() {
            self.stats.refused += 1;
            let _ = (&s).write_all(b"{\"ok\":false,\"error\":\"Too many clients\"}\n");
            return;
        }
        self.stats.accepted += 1;
        log::info!("app socket: client pid {pid} uid {uid} connected");
        self.clients.push(Client {
            stream: s,
            pid,
            start: pagemap::start_time(pid),
            inbuf: Vec::new(),
            out: Vec::new(),
            marks: Vec::new(),
            wants_sync: false,
            closed: false,
        });
    }

    fn read_client(&mut self, i: usize) {
        let mut buf = [0u8; 4096];
        loop {
            let c = &mut self.clients[i];
            if c.closed {
                return;
            }
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    c.closed = true;
                    return;
                }
                Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.closed = true;
                    return;
                }
            }
            while let Some(nl) = self.clients[i].inbuf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.clients[i].inbuf.drain(..=nl).collect();
                let reply = self.handle(i, &line[..nl]);
                self.reply(i, &reply);
            }
            if self.clients[i].inbuf.len() > MAX_LINE_BYTES {
                self.stats.bad_requests += 1;
                self.reply(i, &err("Line too long"));
                let c = &mut self.clients[i];
                flush(c);
                c.closed = true;
                return;
            }
        }
    }

    fn reply(&mut self, i: usize, v: &serde_json::Value) {
        let Some(v) = Some(v).filter(|v| !v.is_null()) else {
            return;
        };
        let c = &mut self.clients[i];
        let mut line = v.to_string();
        line.push('\n');
        if c.out.len() + line.len() > MAX_REPLY_BYTES {
            // The client does not read its replies.
            c.closed = true;
            return;
        }
        c.out.extend_from_slice(line.as_bytes());
    }

    fn handle(&mut self, i: usize, line: &[u8]) -> serde_json::Value {
        let req: Request = match serde_json::from_slice(line) {
            Ok(r) => r,
            Err(e) => {
                self.stats.bad_requests += 1;
                return err(&format!("Bad request: {e}"));
            }
        };
        let cfg = &self.cfg;
        let c = &mut self.clients[i];
        match req {
            Request::Mark {
                addr,
                len,
                kind,
                weight,
            } => {
                let weight = weight.unwrap_or(cfg.weight);
                let problem = if kind == Kind::Free {
                    Some("Kind must be hot, cold or pinned".to_owned())
                } else if addr % PAGE != 0 || len % PAGE != 0 || len == 0 {
                    Some("Address and length must be page-aligned, length > 0".to_owned())
                } else if len > cfg.max_mark_bytes {
                    Some(format!(
                        "Length over the limit of {} bytes",
                        cfg.max_mark_bytes
                    ))
                } else if addr.checked_add(len).map_or(true, |e| e > USER_TOP) {
                    Some("Range outside user space".to_owned())
                } else if weight == 0 {
                    Some("Weight must be 1..=255".to_owned())
                } else if c.marks.len() >= cfg.max_marks_per_client {
                    Some(format!(
                        "Over the limit of {} marks",
                        cfg.max_marks_per_client
                    ))
                } else {
                    None
                };
                if let Some(p) = problem {
                    self.stats.bad_requests += 1;
                    return err(&p);
                }
                let pages = match pagemap::translate(c.pid, addr, len) {
                    Ok(f) => f.len(),
                    Err(e) => {
                        self.stats.bad_requests += 1;
                        return err(&e.to_string());
                    }
                };
                let id = self.next_id;
                self.next_id += 1;
                c.marks.push(Mark {
                    id,
                    addr,
                    len,
                    kind,
                    weight,
                });
                serde_json::json!({"ok": true, "id": id, "pages": pages})
            }
            Request::Unmark { id } => {
                let before = c.marks.len();
                c.marks.retain(|m| m.id != id);
                if c.marks.len() == before {
                    self.stats.bad_requests += 1;
                    return err("No such mark");
                }
                serde_json::json!({"ok": true})
            }
            Request::Clear => {
                c.marks.clear();
                serde_json::json!({"ok": true})
            }
            Request::List => {
                let marks: Vec<_> = c
                    .marks
                    .iter()
                    .map(|m| {
                        serde_json::json!({"id": m.id, "addr": m.addr, "len": m.len,
                        "kind": format!("{}", m.kind).to_lowercase(), "weight": m.weight})
                    })
                    .collect();
                serde_json::json!({"ok": true, "marks": marks})
            }
            Request::Sync => {
                // Answered by `synced` once the snapshot is queued.
                c.wants_sync = true;
                serde_json::Value::Null
            }
        }
    }

    /// Answers every pending `sync` with the epoch of the snapshot just queued.
    pub fn synced(&mut self, epoch: u64, frames: usize, up: bool) {
        for i in 0..self.clients.len() {
            if std::mem::take(&mut self.clients[i].wants_sync) {
                let v = serde_json::json!({"ok": true, "epoch": epoch, "frames": frames, "connected": up});
                self.reply(i, &v);
                flush(&mut self.clients[i]);
            }
        }
    }

    /// The hints of every live client's marks, translated now.
    pub fn hints(&mut self) -> Vec<Hint> {
        let mut out = Vec::new();
        for c in &mut self.clients {
            if c.marks.is_empty() {
                continue;
            }
            if pagemap::start_time(c.pid) != c.start {
                log::info!("app socket: pid {} is gone; its marks are dropped", c.pid);
                c.marks.clear();
                continue;
            }
            // Merge per kind and weight so overlapping marks do not repeat frames.
            let mut by: HashMap<(Kind, u8), Vec<u64>> = HashMap::new();
            for m in &c.marks {
                match pagemap::translate(c.pid, m.addr, m.len) {
                    Ok(f) => by.entry((m.kind, m.weight)).or_default().extend(f),
                    Err(e) => log::debug!("app socket: pid {}: {e}", c.pid),
                }
            }
            let mut keys: Vec<_> = by.keys().copied().collect();
            keys.sort();
            for k in keys {
                let frames = by.remove(&k).unwrap_or_default();
                out.extend(ranges::coalesce(frames).into_iter().map(|range| Hint {
                    range,
                    kind: k.0,
                    weight: k.1,
                    source: Source::App,
                }));
            }
        }
        out
    }

    /// Clients connected.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Removes the socket file.
    pub fn remove(&self) {
        let _ = fs::remove_file(Path::new(&self.path));
    }
}

fn flush(c: &mut Client) {
    while !c.out.is_empty() && !c.closed {
        match c.stream.write(&c.out) {
            Ok(0) => c.closed = true,
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => c.closed = true,
        }
    }
}

fn err(msg: &str) -> serde_json::Value {
    serde_json::json!({"ok": false, "error": msg})
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};

    #[test]
    fn parses_requests() {
        let cases: &[(&str, Option<Request>)] = &[
            (
                r#"{"op":"mark","addr":4096,"len":8192,"kind":"hot"}"#,
                Some(Request::Mark {
                    addr: 4096,
                    len: 8192,
                    kind: Kind::Hot,
                    weight: None,
                }),
            ),
            (r#"{"op":"unmark","id":3}"#, Some(Request::Unmark { id: 3 })),
            (r#"{"op":"sync"}"#, Some(Request::Sync)),
            (r#"{"op":"mark","addr":-1,"len":8192,"kind":"hot"}"#, None),
            (
                r#"{"op":"mark","addr":0,"len":8192,"kind":"hot","x":1}"#,
                None,
            ),
            (r#"{"op":"mark","addr":0,"len":8192,"kind":"warm"}"#, None),
            (r#"{"op":"reboot"}"#, None),
            ("not json", None),
        ];
        for (line, want) in cases {
            assert_eq!(serde_json::from_str::<Request>(line).ok(), *want, "{line}");
        }
    }

    /// The socket end to end with this process as the client (needs root for frame
    /// numbers in pagemap; without, marks of present pages report the hidden-frames error).
    #[test]
    fn marks_through_the_socket() {
        let dir = std::env::temp_dir().join(format!("vmtier-agent-app-{}", std::process::id()));
        let _ = fs::create_dir_all(&dir);
        let cfg = AppConfig {
            socket: dir.join("s.sock"),
            max_marks_per_client: 2,
            ..AppConfig::default()
        };
        let mut srv = AppServer::bind(&cfg).unwrap();
        let mode = fs::metadata(&cfg.socket).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660);
        assert!(matches!(AppServer::bind(&cfg), Err(Error::InUse(_))));
        let buf = vec![1u8; 3 * 4096 + 4095];
        let a = (buf.as_ptr() as u64 + 4095) & !4095;
        let s = UnixStream::connect(&cfg.socket).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut ask = |line: &str, srv: &mut AppServer| -> serde_json::Value {
            (&s).write_all(format!("{line}\n").as_bytes()).unwrap();
            let mut resp = String::new();
            for _ in 0..100 {
                srv.service();
                srv.synced(5, 1, false);
                s.set_nonblocking(true).unwrap();
                let got = r.read_line(&mut resp);
                s.set_nonblocking(false).unwrap();
                if got.is_ok_and(|n| n > 0) {
                    return serde_json::from_str(&resp).unwrap();
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            panic!("no reply to {line}");
        };
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let v = ask(
            &format!(r#"{{"op":"mark","addr":{a},"len":12288,"kind":"pinned"}}"#),
            &mut srv,
        );
        assert_eq!(v["ok"], root, "{v}");
        for (line, ok) in [
            (
                format!(
                    r#"{{"op":"mark","addr":{},"len":4096,"kind":"hot"}}"#,
                    a + 1
                ),
                false,
            ),
            (
                format!(r#"{{"op":"mark","addr":{a},"len":0,"kind":"hot"}}"#),
                false,
            ),
            (
                format!(r#"{{"op":"mark","addr":{a},"len":4096,"kind":"free"}}"#),
                false,
            ),
            (
                r#"{"op":"mark","addr":72057594037927936,"len":4096,"kind":"hot"}"#.to_owned(),
                false,
            ),
            (r#"{"op":"unmark","id":99}"#.to_owned(), false),
            (r#"{"op":"bogus"}"#.to_owned(), false),
            (r#"{"op":"sync"}"#.to_owned(), true),
        ] {
            let v = ask(&line, &mut srv);
            assert_eq!(v["ok"], ok, "{line}: {v}");
        }
        if root {
            let h = srv.hints();
            assert_eq!(
                ranges::total_bytes(&h.iter().map(|h| h.range).collect::<Vec<_>>()),
                12288
            );
            assert!(h
                .iter()
                .all(|h| h.kind == Kind::Pinned && h.source == Source::App));
        }
        assert_eq!(srv.clients(), 1);
        drop(s);
        drop(r);
        srv.service();
        assert_eq!(srv.clients(), 0);
        assert!(srv.hints().is_empty());
        srv.remove();
        let _ = fs::remove_dir_all(&dir);
    }
}
