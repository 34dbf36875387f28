//! One request, one reply over vmtierd's socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use vmtier_api::proto::{Reply, Request, Response};

/// Error talking to vmtierd.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The daemon is not reachable.
    #[error("Cannot reach vmtierd at {0} (is it running? see --socket)")]
    Connect(PathBuf, #[source] std::io::Error),
    /// The conversation broke off.
    #[error("Lost the connection to vmtierd")]
    Io(#[source] std::io::Error),
    /// The daemon's reply did not parse.
    #[error("Unexpected reply from vmtierd: {0}")]
    Reply(String),
    /// The daemon refused the request.
    #[error("{0}")]
    Refused(String),
    /// Talking to libvirt failed.
    #[error(transparent)]
    Libvirt(Box<dyn std::error::Error + Send + Sync>),
    /// Drawing or writing an image failed.
    #[error(transparent)]
    Plot(vmtier_plot::Error),
    /// An input file could not be read.
    #[error("Cannot read {0}")]
    Input(PathBuf, #[source] std::io::Error),
    /// An input file is not what the command draws.
    #[error("{0} is not a heatmap: {1}")]
    NotHeatmap(PathBuf, String),
}

impl Error {
    /// A libvirt error.
    pub fn libvirt(e: vmtier_libvirt::conn::Error) -> Self {
        Self::Libvirt(Box::new(e))
    }
}

/// A vmtierd client.
#[derive(Debug)]
pub struct Client {
    socket: PathBuf,
    /// Print raw JSON replies.
    pub json: bool,
}

impl Client {
    /// A client of the daemon at `socket`.
    pub fn new(socket: PathBuf, json: bool) -> Self {
        Self { socket, json }
    }

    /// Sends `req`; with `--json` prints the reply line verbatim, and returns the parsed reply.
    pub fn call(&self, req: &Request) -> Result<Reply, Error> {
        let mut s = UnixStream::connect(&self.socket)
            .map_err(|e| Error::Connect(self.socket.clone(), e))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(Error::Io)?;
        let mut line = serde_json::to_string(req).map_err(|e| Error::Reply(e.to_string()))?;
        line.push('\n');
        s.write_all(line.as_bytes()).map_err(Error::Io)?;
        let mut reply = String::new();
        BufReader::new(&s)
            .read_line(&mut reply)
            .map_err(Error::Io)?;
        if self.json {
            print!("{reply}");
        }
        match serde_json::from_str::<Response>(&reply) {
            Ok(Response::Ok(r)) => Ok(r),
            Ok(Response::Error(msg)) => Err(Error::Refused(msg)),
            Err(_) => Err(Error::Reply(reply.trim_end().to_owned())),
        }
    }
}
