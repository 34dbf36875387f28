//! The control socket: one thread accepts, one short thread per connection reads JSON lines
//! and passes each request to the engine thread, which answers between ticks.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::Duration;

use log::{debug, warn};

use crate::proto::{Request, Response};

/// Error starting the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another daemon answers on the socket.
    #[error("Another vmtierd is running at {0}")]
    InUse(PathBuf),
    /// The socket could not be created.
    #[error("Cannot listen on {0}")]
    Bind(PathBuf, #[source] std::io::Error),
}

/// A request and where to send its response.
pub type Call = (Request, Sender<Response>);

/// Longest time a connection waits for the engine (a tick plus a migration batch).
const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Listens on `path` (mode 0600: the API changes memory placement) and forwards requests.
/// A stale socket file is replaced; a live one is an error.
pub fn spawn(path: &Path, engine: Sender<Call>) -> Result<thread::JoinHandle<()>, Error> {
    if UnixStream::connect(path).is_ok() {
        return Err(Error::InUse(path.into()));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::Bind(path.into(), e))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|e| Error::Bind(path.into(), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Bind(path.into(), e))?;
    Ok(thread::spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(s) => {
                    let engine = engine.clone();
                    thread::spawn(move || serve(s, &engine));
                }
                Err(e) => warn!("control socket: accept failed: {e}"),
            }
        }
    }))
}

fn serve(stream: UnixStream, engine: &Sender<Call>) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(300)));
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        debug!("control request: {line}");
        let resp = match serde_json::from_str::<Request>(&line) {
            Err(e) => Response::Error(format!("Invalid request: {e}")),
            Ok(req) => {
                let (tx, rx) = mpsc::channel();
                if engine.send((req, tx)).is_err() {
                    Response::Error("vmtierd is shutting down".into())
                } else {
                    rx.recv_timeout(ENGINE_TIMEOUT).unwrap_or_else(|_| {
                        Response::Error("vmtierd did not answer in time".into())
                    })
                }
            }
        };
        let mut text =
            serde_json::to_string(&resp).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"));
        text.push('\n');
        if out.write_all(text.as_bytes()).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Reply;

    #[test]
    fn requests_reach_the_engine_and_bad_json_does_not() {
        let dir = std::env::temp_dir().join(format!("vmtierd-srv-{}", std::process::id()));
        let path = dir.join("ctl.sock");
        let (tx, rx) = mpsc::channel::<Call>();
        spawn(&path, tx.clone()).unwrap();
        assert!(matches!(spawn(&path, tx), Err(Error::InUse(_))));
        thread::spawn(move || {
            for (req, reply) in rx {
                let _ = reply.send(Response::Ok(Reply::Done {
                    message: format!("{req:?}"),
                }));
            }
        });
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"cmd\":\"list\"}\nnot json\n{\"cmd\":\"list\",\"x\":1}\n")
            .unwrap();
        let mut lines = BufReader::new(s).lines();
        let first = lines.next().unwrap().unwrap();
        assert_eq!(first, r#"{"ok":{"kind":"done","message":"List"}}"#);
        for _ in 0..2 {
            let l = lines.next().unwrap().unwrap();
            assert!(l.starts_with(r#"{"error":"Invalid request"#), "{l}");
        }
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let _ = std::fs::remove_dir_all(dir);
    }
}
