//! The control socket: one thread accepts, one short thread per connection (at most
//! [`MAX_CONNECTIONS`]) reads JSON lines of at most [`MAX_REQUEST_LINE`] bytes and passes
//! each request to the engine thread, which answers between ticks.
//!
//! The socket lives in a directory where no other user can replace it: the daemon creates it
//! (mode 0700) or checks it (a real directory, not a symbolic link, owned by the daemon's
//! user, and writable by group or others only if sticky, as `/tmp` is), then works through a
//! descriptor of it, so that nothing can be swapped in between the checks and the `bind`.
//! The socket is 0600 from its creation (its mode is set before `bind`, no `chmod`
//! afterwards). An old socket at the path is removed only if it is the daemon's user's and
//! nothing answers on it; anything else there is an error and stays.

use std::ffi::{CString, OsStr};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use log::{debug, warn};

pub use crate::proto::MAX_REQUEST_LINE;
use crate::proto::{decode_request, DecodeError, Request, Response};

/// Error starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another daemon answers on the socket.
    #[error("Another vmtierd is running at {0}")]
    InUse(PathBuf),
    /// The path has no file name, or is too long for a unix socket.
    #[error("Invalid socket path {0}")]
    Path(PathBuf),
    /// The socket's directory could not be created or opened.
    #[error("Cannot open the socket's directory {0}")]
    Dir(PathBuf, #[source] io::Error),
    /// The socket's directory is not one only the daemon's user controls.
    #[error("Refusing socket directory {0}: {1}")]
    UnsafeDir(PathBuf, String),
    /// Something that is not a socket is at the path; it is left alone.
    #[error("{0} exists and is not a socket; remove it or choose another path")]
    NotASocket(PathBuf),
    /// A socket of another user is at the path; it is left alone.
    #[error("{0} is another user's socket (uid {1}); remove it or choose another path")]
    NotOurs(PathBuf, u32),
    /// The socket could not be created.
    #[error("Cannot listen on {0}")]
    Bind(PathBuf, #[source] io::Error),
}

/// A request and where to send its response.
pub type Call = (Request, Sender<Response>);

/// Most connections served at once; more are answered with an error line and closed.
pub const MAX_CONNECTIONS: usize = 16;

/// Longest time a connection waits for the engine (a tick plus a migration batch).
const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest time a connection may stay silent.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest time a reply may take to be written (a client that does not read).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The listening control socket.
#[derive(Debug)]
pub struct Server {
    file: SocketFile,
    thread: thread::JoinHandle<()>,
}

impl Server {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Whether the accept thread still runs.
    pub fn is_running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Removes the socket file, if the file at the path is still the socket we created.
    pub fn remove(&self) {
        self.file.remove();
    }
}

/// A socket file made by [`bind`] (the control socket's, or the HTTP API's).
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    dir: File,
    name: CString,
    /// Device and inode of the socket file we bound, so that only it is ever removed.
    id: (u64, u64),
}

impl SocketFile {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file, if the file at the path is still the socket we created.
    pub fn remove(&self) {
        if let Ok(Some(st)) = stat_at(&self.dir, &self.name) {
            if st.is_socket() && (st.dev, st.ino) == self.id {
                // SAFETY: `dir` is an open directory and `name` a NUL-terminated string;
                // unlinkat reads nothing else.
                unsafe { libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0) };
            }
        }
    }
}

/// Listens on `path` (mode 0600: the API changes memory placement) and forwards requests.
/// A stale socket file is replaced; a live one, or anything that is not a socket, is an
/// error.
pub fn spawn(path: &Path, engine: Sender<Call>) -> Result<Server, Error> {
    let (listener, file) = bind(path)?;
    let active = Arc::new(AtomicUsize::new(0));
    let thread = thread::spawn(move || accept_loop(&listener, &engine, &active));
    Ok(Server { file, thread })
}

/// Binds a unix socket at `path` (mode 0600) in a directory only our user controls, as
/// [`spawn`] does for the control socket; the HTTP API's socket is made the same way.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile), Error> {
    let name = path
        .file_name()
        .filter(|n| !n.is_empty() && *n != OsStr::new(".") && *n != OsStr::new(".."))
        .ok_or_else(|| Error::Path(path.into()))?;
    let name = CString::new(name.as_bytes()).map_err(|_| Error::Path(path.into()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = open_own_dir(parent)?;
    // The kernel resolves this through our descriptor of the checked directory.
    let via = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
        .join(OsStr::from_bytes(name.as_bytes()));
    if via.as_os_str().len() >= std::mem::size_of::<[libc::c_char; 108]>() {
        return Err(Error::Path(path.into()));
    }

    match stat_at(&dir, &name).map_err(|e| Error::Bind(path.into(), e))? {
        None => {}
        Some(st) if !st.is_socket() => return Err(Error::NotASocket(path.into())),
        Some(st) if st.uid != euid() => return Err(Error::NotOurs(path.into(), st.uid)),
        Some(_) => match UnixStream::connect(&via) {
            Ok(_) => return Err(Error::InUse(path.into())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                debug!("control socket: removing stale {}", path.display());
                // SAFETY: `dir` is an open directory and `name` a NUL-terminated string.
                if unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } != 0 {
                    return Err(Error::Bind(path.into(), io::Error::last_os_error()));
                }
            }
            Err(e) => return Err(Error::Bind(path.into(), e)),
        },
    }

    let listener = bind_0600(&via).map_err(|e| Error::Bind(path.into(), e))?;
    let st = stat_at(&dir, &name)
        .map_err(|e| Error::Bind(path.into(), e))?
        .ok_or_else(|| Error::Bind(path.into(), io::ErrorKind::NotFound.into()))?;
    Ok((
        listener,
        SocketFile {
            path: path.into(),
            dir,
            name,
            id: (st.dev, st.ino),
        },
    ))
}

/// Creates `dir` (mode 0700) if it is missing, then opens it without following a symbolic
/// link and checks that only our user controls it.
fn open_own_dir(dir: &Path) -> Result<File, Error> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::Dir(dir.into(), e))?,
        Err(e) => return Err(Error::Dir(dir.into(), e)),
        Ok(m) if m.file_type().is_symlink() => {
            return Err(Error::UnsafeDir(dir.into(), "it is a symbolic link".into()))
        }
        Ok(_) => {}
    }
    // O_NOFOLLOW: a symbolic link put there since the check fails here (ELOOP).
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Error::UnsafeDir(dir.into(), "it is a symbolic link".into()),
            Some(libc::ENOTDIR) => Error::UnsafeDir(dir.into(), "it is not a directory".into()),
            _ => Error::Dir(dir.into(), e),
        })?;
    let m = f.metadata().map_err(|e| Error::Dir(dir.into(), e))?;
    let me = euid();
    if m.uid() != me {
        return Err(Error::UnsafeDir(
            dir.into(),
            format!("it is owned by uid {}, not by vmtierd's uid {me}", m.uid()),
        ));
    }
    // Without the sticky bit, anyone who may write to the directory may also remove or
    // rename the daemon's socket and put their own in its place.
    if m.mode() & 0o022 != 0 && m.mode() & libc::S_ISVTX == 0 {
        return Err(Error::UnsafeDir(
            dir.into(),
            format!(
                "group or others may write to it and it is not sticky (mode {:04o})",
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(f)
}

/// The daemon's effective uid.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// What `fstatat(AT_SYMLINK_NOFOLLOW)` says of one directory entry.
struct EntryStat {
    mode: libc::mode_t,
    uid: u32,
    dev: u64,
    ino: u64,
}

impl EntryStat {
    fn is_socket(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFSOCK
    }
}

/// The entry `name` of `dir`, not following a symbolic link; `None` if there is none.
fn stat_at(dir: &File, name: &CString) -> io::Result<Option<EntryStat>> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open directory, `name` NUL-terminated, `st` a writable stat that
    // lives across the call.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::NotFound {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(Some(EntryStat {
        mode: st.st_mode,
        uid: st.st_uid,
        dev: st.st_dev,
        ino: st.st_ino,
    }))
}

/// A listening unix socket at `path` whose file is created with mode 0600: the socket's
/// own mode is set before `bind`, which creates the file with it (less the umask).
fn bind_0600(path: &Path) -> io::Result<UnixListener> {
    // SAFETY: socket(2) takes no pointers; the result is checked below.
    let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a new socket that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: fchmod on our own descriptor; no pointers.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_un is a valid value of this plain C struct.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_un>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `addr` is an initialised sockaddr_un of `len` bytes living across the call.
    let r = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen(2) on our bound socket; no pointers.
    if unsafe { libc::listen(fd.as_raw_fd(), 64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UnixListener::from(fd))
}

/// Decrements the number of live connections when a connection thread ends.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(listener: &UnixListener, engine: &Sender<Call>, active: &Arc<AtomicUsize>) {
    for conn in listener.incoming() {
        let mut s = match conn {
            Ok(s) => s,
            Err(e) => {
                warn!("control socket: accept failed: {e}");
                // Out of descriptors, for instance: do not spin.
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        // Only this thread adds, so the count cannot pass the bound between load and add.
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            debug!("control socket: refusing a connection ({MAX_CONNECTIONS} open)");
            let _ = s.set_nonblocking(true);
            let _ = s.write_all(&reply_line(&Response::Error(format!(
                "Too many connections ({MAX_CONNECTIONS}); try again later"
            ))));
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(Arc::clone(active));
        let engine = engine.clone();
        thread::spawn(move || {
            let _slot = slot;
            serve(s, &engine);
        });
    }
}

/// One line read by [`read_line`].
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A line (without its newline) is in the buffer. The last line may lack a newline.
    Line,
    /// The line is longer than the bound; the buffer holds its first bytes, the rest is unread.
    TooLong,
    /// End of input.
    Eof,
}

/// Reads one newline-terminated line into `buf` (cleared first), never holding more than
/// `max` bytes of it. The server reads every request with it; so does the `control` fuzz
/// target.
pub fn read_line<R: BufRead>(r: &mut R, max: usize, buf: &mut Vec<u8>) -> io::Result<Frame> {
    buf.clear();
    loop {
        let avail = match r.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if avail.is_empty() {
            return Ok(if buf.is_empty() {
                Frame::Eof
            } else {
                Frame::Line
            });
        }
        let newline = avail.iter().position(|&b| b == b'\n');
        let chunk = &avail[..newline.unwrap_or(avail.len())];
        if buf.len() + chunk.len() > max {
            return Ok(Frame::TooLong);
        }
        buf.extend_from_slice(chunk);
        let used = newline.map_or(avail.len(), |i| i + 1);
        r.consume(used);
        if newline.is_some() {
            return Ok(Frame::Line);
        }
    }
}

fn reply_line(resp: &Response) -> Vec<u8> {
    let mut text =
        serde_json::to_string(resp).unwrap_or_else(|_| r#"{"error":"Internal error"}"#.into());
    text.push('\n');
    text.into_bytes()
}

fn serve(stream: UnixStream, engine: &Sender<Call>) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = out.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    while let Ok(frame) = read_line(&mut reader, MAX_REQUEST_LINE, &mut line) {
        let resp = match frame {
            Frame::Eof => break,
            Frame::TooLong => Response::Error(vmtier_core::error_chain(&DecodeError::TooLong)),
            Frame::Line => match decode_request(&line) {
                Ok(None) => continue,
                Err(e) => Response::Error(vmtier_core::error_chain(&e)),
                Ok(Some(req)) => {
                    debug!("control request: {req:?}");
                    let (tx, rx) = mpsc::channel();
                    if engine.send((req, tx)).is_err() {
                        Response::Error("vmtierd is shutting down".into())
                    } else {
                        rx.recv_timeout(ENGINE_TIMEOUT).unwrap_or_else(|_| {
                            Response::Error("vmtierd did not answer in time".into())
                        })
                    }
                }
            },
        };
        if out.write_all(&reply_line(&resp)).is_err() || frame == Frame::TooLong {
            // After an over-long line the stream is out of step: close it.
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Reply;
    use std::io::Read;
    use std::os::unix::fs::{symlink, FileTypeExt, PermissionsExt};

    /// A fresh directory for one test.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vmtierd-srv-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    /// A server whose engine answers every request with `done: <request>`.
    fn echo_server(path: &Path) -> Server {
        let (tx, rx) = mpsc::channel::<Call>();
        thread::spawn(move || {
            for (req, reply) in rx {
                let _ = reply.send(Response::Ok(Reply::Done {
                    message: format!("{req:?}"),
                }));
            }
        });
        spawn(path, tx).unwrap()
    }

    fn one_line(s: &mut BufReader<UnixStream>) -> String {
        let mut l = String::new();
        s.read_line(&mut l).unwrap();
        l.trim_end().to_owned()
    }

    #[test]
    fn requests_reach_the_engine_and_bad_json_does_not() {
        let dir = scratch("echo");
        let path = dir.join("ctl.sock");
        let server = echo_server(&path);
        let (tx, _rx) = mpsc::channel::<Call>();
        assert!(matches!(spawn(&path, tx), Err(Error::InUse(_))));
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"cmd\":\"list\"}\nnot json\n\n{\"cmd\":\"list\",\"x\":1}\n")
            .unwrap();
        let mut r = BufReader::new(s);
        assert_eq!(
            one_line(&mut r),
            r#"{"ok":{"kind":"done","message":"List"}}"#
        );
        for _ in 0..2 {
            let l = one_line(&mut r);
            assert!(l.starts_with(r#"{"error":"Invalid request"#), "{l}");
        }
        let mode = std::fs::symlink_metadata(&path).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600, "socket created 0600");
        assert!(server.is_running());
        server.remove();
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_missing_directory_is_created_0700_and_the_socket_is_0600_whatever_the_umask() {
        let dir = scratch("mkdir");
        let path = dir.join("a/b/ctl.sock");
        // SAFETY: umask only swaps the process's mask; restored below.
        let old = unsafe { libc::umask(0) };
        let r = spawn(&path, mpsc::channel().0);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let server = r.unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir.join("a/b")), 0o700);
        assert_eq!(mode(&path), 0o600);
        server.remove();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn what_is_at_the_path_decides() {
        type Setup = fn(&Path);
        let cases: [(&str, Setup, Option<&str>, bool); 7] = [
            ("nothing", |_| {}, None, false),
            (
                "file",
                |p| std::fs::write(p, "keep me").unwrap(),
                Some("is not a socket"),
                true,
            ),
            (
                "dir",
                |p| std::fs::create_dir(p).unwrap(),
                Some("is not a socket"),
                true,
            ),
            (
                "symlink to a socket",
                |p| {
                    let target = p.with_extension("target");
                    drop(UnixListener::bind(&target).unwrap());
                    symlink(&target, p).unwrap();
                },
                Some("is not a socket"),
                true,
            ),
            (
                "dangling symlink",
                |p| symlink("/nonexistent/x", p).unwrap(),
                Some("is not a socket"),
                true,
            ),
            (
                "stale socket",
                |p| drop(UnixListener::bind(p).unwrap()),
                None,
                false,
            ),
            (
                "another user's stale socket",
                |p| {
                    drop(UnixListener::bind(p).unwrap());
                    std::os::unix::fs::lchown(p, Some(65534), None).unwrap();
                },
                Some("is another user's socket (uid 65534)"),
                true,
            ),
        ];
        for (i, (what, setup, err, kept)) in cases.into_iter().enumerate() {
            if what == "another user's stale socket" && euid() != 0 {
                continue; // cannot give a file away without root
            }
            let dir = scratch(&format!("at{i}"));
            let path = dir.join("ctl.sock");
            setup(&path);
            let before = std::fs::symlink_metadata(&path).ok().map(|m| m.ino());
            match (spawn(&path, mpsc::channel().0), err) {
                (Ok(s), None) => {
                    assert!(std::fs::symlink_metadata(&path)
                        .unwrap()
                        .file_type()
                        .is_socket());
                    UnixStream::connect(&path).unwrap();
                    s.remove();
                }
                (Err(e), Some(want)) => {
                    assert!(e.to_string().contains(want), "{what}: {e}")
                }
                (r, _) => panic!("{what}: {r:?}"),
            }
            let after = std::fs::symlink_metadata(&path).ok().map(|m| m.ino());
            assert_eq!(kept, after.is_some() && after == before, "{what}: kept");
            if what == "file" {
                assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
            }
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn directories_that_others_control_are_refused() {
        type Setup = fn(&Path) -> PathBuf;
        let cases: [(&str, Setup, &str); 4] = [
            (
                "symlink",
                |d| {
                    std::fs::create_dir(d.join("real")).unwrap();
                    symlink(d.join("real"), d.join("link")).unwrap();
                    d.join("link")
                },
                "it is a symbolic link",
            ),
            (
                "world-writable",
                |d| {
                    let p = d.join("open");
                    std::fs::create_dir(&p).unwrap();
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
                    p
                },
                "group or others may write to it and it is not sticky (mode 0777)",
            ),
            (
                "a file",
                |d| {
                    std::fs::write(d.join("f"), "").unwrap();
                    d.join("f")
                },
                "it is not a directory",
            ),
            (
                "someone else's",
                |d| {
                    let p = d.join("theirs");
                    std::fs::create_dir(&p).unwrap();
                    if euid() == 0 {
                        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
                    }
                    p
                },
                "owned by uid",
            ),
        ];
        for (i, (what, setup, want)) in cases.into_iter().enumerate() {
            let dir = scratch(&format!("dir{i}"));
            let sockdir = setup(&dir);
            if what == "someone else's" && euid() != 0 {
                continue; // cannot give a directory away without root
            }
            let err = spawn(&sockdir.join("ctl.sock"), mpsc::channel().0).unwrap_err();
            assert!(err.to_string().contains(want), "{what}: {err}");
            assert!(
                !sockdir.join("ctl.sock").exists(),
                "{what}: nothing created"
            );
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    #[test]
    fn a_sticky_shared_directory_like_tmp_is_accepted() {
        let dir = scratch("sticky");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let path = dir.join("ctl.sock");
        let server = spawn(&path, mpsc::channel().0).unwrap();
        assert_eq!(
            std::fs::symlink_metadata(&path).unwrap().mode() & 0o777,
            0o600
        );
        server.remove();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_over_long_line_is_refused_and_closes_the_connection() {
        let dir = scratch("long");
        let path = dir.join("ctl.sock");
        let server = echo_server(&path);
        // A line of exactly the bound is read (and is bad JSON); one byte more is refused.
        let mut s = UnixStream::connect(&path).unwrap();
        let mut line = vec![b' '; MAX_REQUEST_LINE - 14];
        line.extend_from_slice(b"{\"cmd\":\"list\"}\n");
        assert_eq!(line.len(), MAX_REQUEST_LINE + 1);
        s.write_all(&line).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(
            one_line(&mut r),
            r#"{"ok":{"kind":"done","message":"List"}}"#
        );
        let mut long = vec![b'x'; MAX_REQUEST_LINE + 1];
        long.push(b'\n');
        // The server may close as soon as it has seen too much: later writes may fail.
        let _ = s.write_all(&long);
        let _ = s.write_all(b"{\"cmd\":\"list\"}\n");
        assert_eq!(
            one_line(&mut r),
            r#"{"error":"Request longer than 65536 bytes"}"#
        );
        let mut rest = Vec::new();
        let _ = r.read_to_end(&mut rest);
        assert!(rest.is_empty(), "closed after the error");
        server.remove();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn lines_are_read_within_the_bound() {
        type Frames = &'static [(Frame, &'static [u8])];
        let cases: [(&[u8], usize, Frames); 6] = [
            (b"", 4, &[(Frame::Eof, b"")]),
            (
                b"ab\ncd",
                4,
                &[
                    (Frame::Line, b"ab"),
                    (Frame::Line, b"cd"),
                    (Frame::Eof, b""),
                ],
            ),
            (b"abcd\n", 4, &[(Frame::Line, b"abcd"), (Frame::Eof, b"")]),
            (b"abcde\n", 4, &[(Frame::TooLong, b"")]),
            (
                b"\n\n",
                0,
                &[(Frame::Line, b""), (Frame::Line, b""), (Frame::Eof, b"")],
            ),
            (b"abcdefgh", 4, &[(Frame::TooLong, b"")]),
        ];
        for (input, max, want) in cases {
            // A 2-byte buffer: lines span several fills.
            let mut r = BufReader::with_capacity(2, input);
            let mut buf = Vec::new();
            for (frame, bytes) in want {
                assert_eq!(
                    &read_line(&mut r, max, &mut buf).unwrap(),
                    frame,
                    "{input:?}"
                );
                if *frame == Frame::Line {
                    assert_eq!(buf, *bytes, "{input:?}");
                }
                assert!(buf.len() <= max, "{input:?}: bounded");
            }
        }
    }

    #[test]
    fn the_seventeenth_connection_is_refused() {
        let dir = scratch("conns");
        let path = dir.join("ctl.sock");
        let server = echo_server(&path);
        let mut open = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(b"{\"cmd\":\"list\"}\n").unwrap();
            let mut r = BufReader::new(s);
            assert!(one_line(&mut r).starts_with(r#"{"ok""#));
            open.push(r);
        }
        let mut extra = BufReader::new(UnixStream::connect(&path).unwrap());
        assert_eq!(
            one_line(&mut extra),
            r#"{"error":"Too many connections (16); try again later"}"#
        );
        let mut rest = Vec::new();
        let _ = extra.read_to_end(&mut rest);
        assert!(rest.is_empty(), "closed");
        // A closed connection frees its slot.
        drop(open.pop());
        let mut served = false;
        for _ in 0..100 {
            let mut s = UnixStream::connect(&path).unwrap();
            // Still refused: the server may close before the request is written.
            let _ = s.write_all(b"{\"cmd\":\"list\"}\n");
            let mut l = String::new();
            let _ = BufReader::new(s).read_line(&mut l);
            if l.starts_with(r#"{"ok""#) {
                served = true;
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        assert!(served, "a slot came free");
        server.remove();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn only_our_own_socket_is_removed() {
        let dir = scratch("rm");
        let path = dir.join("ctl.sock");
        let server = echo_server(&path);
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "someone else's").unwrap();
        server.remove();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "someone else's");
        let _ = std::fs::remove_dir_all(dir);
    }
}
