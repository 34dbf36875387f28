//! vmtierd's control socket, from the bytes a client sends to the requests the engine gets:
//! the server's own line reader ([`server::read_line`], bounded) cuts the input into lines
//! and the server's own decoder ([`proto::decode_request`]) decodes each.
//!
//! Besides "no panic": the reader never holds more than its bound, and every accepted
//! request re-encodes to a line that decodes to the same request.

#![no_main]

use std::io::BufReader;

use libfuzzer_sys::fuzz_target;
use vmtier_daemon::proto::{self, MAX_REQUEST_LINE};
use vmtier_daemon::server::{self, Frame};

fuzz_target!(|data: &[u8]| {
    // A small buffer, so that lines span several reads as they do on a socket.
    let mut reader = BufReader::with_capacity(64, data);
    let mut line = Vec::new();
    while let Ok(Frame::Line) = server::read_line(&mut reader, MAX_REQUEST_LINE, &mut line) {
        assert!(line.len() <= MAX_REQUEST_LINE);
        if let Ok(Some(req)) = proto::decode_request(&line) {
            let again = serde_json::to_vec(&req).expect("a request encodes");
            let back = proto::decode_request(&again).expect("a re-encoded request decodes");
            assert_eq!(back, Some(req));
        }
    }
    // The same reader with a bound the inputs can reach: it stops at the bound.
    let bound = usize::from(data.first().copied().unwrap_or(0));
    let mut reader = BufReader::with_capacity(7, data);
    while let Ok(frame) = server::read_line(&mut reader, bound, &mut line) {
        assert!(line.len() <= bound);
        if frame != Frame::Line {
            break;
        }
    }
});
