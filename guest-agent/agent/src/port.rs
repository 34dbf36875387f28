//! The character device to the host: the virtio-serial port named [`PORT_NAME`] (found
//! through `/sys/class/virtio-ports/*/name`) or a serial line given by path, opened
//! non-blocking; a tty is switched to raw mode so no byte is translated.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The virtio-serial port name the host gives the agent's channel.
pub const PORT_NAME: &str = "org.vmtier.agent.0";

/// Where the kernel lists virtio-serial ports.
pub const VIRTIO_PORTS: &str = "/sys/class/virtio-ports";

/// Errors of finding and opening the port.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No virtio-serial port has the name.
    #[error("No virtio-serial port named {PORT_NAME} under {0}")]
    NotFound(PathBuf),
    /// Opening the device failed.
    #[error("Cannot open {0}")]
    Open(PathBuf, #[source] io::Error),
    /// Switching a tty to raw mode failed.
    #[error("Cannot set raw mode on {0}")]
    Raw(PathBuf, #[source] io::Error),
}

/// The device node of the port named [`PORT_NAME`] under `sys` (`/dev/<entry>`).
pub fn find(sys: &Path) -> Result<PathBuf, Error> {
    let rd = fs::read_dir(sys).map_err(|_| Error::NotFound(sys.to_owned()))?;
    let mut names: Vec<_> = rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    names.sort();
    for n in names {
        let name = fs::read_to_string(sys.join(&n).join("name")).unwrap_or_default();
        if name.trim_end() == PORT_NAME {
            return Ok(Path::new("/dev").join(n));
        }
    }
    Err(Error::NotFound(sys.to_owned()))
}

/// Resolves the `port` setting: `auto` or a path.
pub fn resolve(setting: &str) -> Result<PathBuf, Error> {
    if setting == "auto" {
        find(Path::new(VIRTIO_PORTS))
    } else {
        Ok(PathBuf::from(setting))
    }
}

/// Opens the device read-write, non-blocking; a tty goes to raw mode.
pub fn open(path: &Path) -> Result<File, Error> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::Open(path.to_owned(), e))?;
    let fd = f.as_raw_fd();
    // SAFETY: fd is open for the duration of the call; isatty only queries it.
    if unsafe { libc::isatty(fd) } == 1 {
        // SAFETY: an all-zero termios is a valid value to be filled by tcgetattr.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is an open tty and t is a valid, writable termios.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return Err(Error::Raw(path.to_owned(), io::Error::last_os_error()));
        }
        // SAFETY: t is a valid termios obtained above.
        unsafe { libc::cfmakeraw(&mut t) };
        // SAFETY: fd is an open tty and t a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) } != 0 {
            return Err(Error::Raw(path.to_owned(), io::Error::last_os_error()));
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_named_port() {
        let d = std::env::temp_dir().join(format!("vmtier-agent-port-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        for (entry, name) in [
            ("vport1p1", "org.qemu.guest_agent.0\n"),
            ("vport2p3", "org.vmtier.agent.0\n"),
        ] {
            fs::create_dir_all(d.join(entry)).unwrap();
            fs::write(d.join(entry).join("name"), name).unwrap();
        }
        assert_eq!(find(&d).unwrap(), Path::new("/dev/vport2p3"));
        fs::remove_dir_all(d.join("vport2p3")).unwrap();
        assert!(matches!(find(&d), Err(Error::NotFound(_))));
        fs::remove_dir_all(&d).unwrap();
        assert!(matches!(
            find(Path::new("/nonexistent")),
            Err(Error::NotFound(_))
        ));
        assert_eq!(resolve("/dev/ttyS1").unwrap(), Path::new("/dev/ttyS1"));
    }
}
