//! Lines on the local control socket (`src/control.rs`, served by `node::server`): input from
//! local processes. The input is split at `\n` (at most 16 lines per input). Each line is
//! parsed as the node parses it (a `Request`, then the paging fields of a listing); what
//! parses must serialize and parse back to the same request. Then the line goes, as is, to
//! one live node in a temp home, which must answer it with exactly one JSON `Response`
//! line (`bad_request` for what does not parse) and stay up.
//!
//! Requests that leave the node or its home, block or stop it are parsed but not sent:
//! `connect` (dials), `subscribe` (streams until closed), `shutdown`, `artifact` (may read
//! and write files), `send` with `files` (reads local paths), and anything with
//! `wait_ack_ms` (waits up to that long).
#![no_main]

use awp_node::control::{Page, Request, Response};
use awp_node::node::{NodeConfig, NodeHandle};
use libfuzzer_sys::fuzz_target;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

struct Fixture {
    socket: PathBuf,
    // Kept alive for the whole run.
    _node: NodeHandle,
    _rt: tokio::runtime::Runtime,
    _home: tempfile::TempDir,
}

/// One node for the whole run (starting one per input would dominate); what earlier inputs
/// stored stays, as in a long-lived node.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let home = tempfile::Builder::new()
            .prefix("awp-fuzz-control-")
            .tempdir()
            .unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let node = rt
            .block_on(NodeHandle::start(NodeConfig {
                home: home.path().to_path_buf(),
                listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
                name: Some("fuzz@control".into()),
                ..Default::default()
            }))
            .expect("node starts");
        Fixture {
            socket: awp_node::daemon::socket_path(home.path()),
            _node: node,
            _rt: rt,
            _home: home,
        }
    })
}

/// Whether the node may be given this request (see the module doc).
fn harmless(req: &Request) -> bool {
    match req {
        Request::Connect { .. }
        | Request::Subscribe { .. }
        | Request::Shutdown
        | Request::Artifact { .. } => false,
        Request::Send {
            files, wait_ack_ms, ..
        } => files.is_empty() && wait_ack_ms.is_none(),
        Request::State { wait_ack_ms, .. } => wait_ack_ms.is_none(),
        _ => true,
    }
}

/// Send `line` to the node and read its one response line.
fn ask(socket: &PathBuf, line: &[u8]) -> Vec<u8> {
    let mut s = UnixStream::connect(socket).expect("control socket");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(line).unwrap();
    s.write_all(b"\n").unwrap();
    let mut r = BufReader::new(s);
    let mut resp = Vec::new();
    r.read_until(b'\n', &mut resp).expect("a response in time");
    assert_eq!(
        resp.last(),
        Some(&b'\n'),
        "the node closed without answering"
    );
    resp.pop();
    resp
}

fuzz_target!(|data: &[u8]| {
    for line in data.split(|b| *b == b'\n').take(16) {
        let parsed = serde_json::from_slice::<Request>(line);
        if let Ok(req) = &parsed {
            let again: Request = serde_json::from_slice(&serde_json::to_vec(req).unwrap())
                .expect("a serialized request parses");
            assert_eq!(&again, req, "round trip changed the request");
            if req.is_listing() {
                if let Ok(page) = serde_json::from_slice::<Page>(line) {
                    let _ = page.items();
                }
            }
            let _ = req.response_timeout();
            if !harmless(req) {
                continue;
            }
        }
        let resp = ask(&fixture().socket, line);
        let resp: Response = serde_json::from_slice(&resp).unwrap_or_else(|e| {
            panic!(
                "response is not a Response ({e}): {}",
                String::from_utf8_lossy(&resp)
            )
        });
        if parsed.is_err() {
            assert!(!resp.ok, "an unparsable request was answered ok");
            assert_eq!(resp.error.unwrap().code, "bad_request");
        }
    }
});
