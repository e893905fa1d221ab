//! Lines on the local control socket (`src/control.rs`, served by `node::server`): input from
//! local processes. The input is split at `\n` (at most 16 lines per input). Each line is
//! parsed as the node parses it (a `Request`, then the paging fields of a listing); what
//! parses must serialize and parse back to the same request. Then the line goes, as is, to
//! one live node in a temp home, which must answer it with exactly one JSON `Response`
//! (`bad_request` for what does not parse) and stay up. The node is replaced by a fresh
//! one (new home) every [`NODE_INPUTS`] inputs.
//!
//! Most inputs are answered in-process (`NodeHandle::control_line`, the socket's own
//! parsing and handler without the round trip); an input whose length is a multiple of
//! `SOCKET_EVERY` goes through the control socket, one connection per line, where the
//! answer must be exactly one `\n`-terminated line. The node's store runs without fsyncs
//! (`shared::NoDurability`).
//!
//! Requests that leave the node or its home, block or stop it are parsed but not sent:
//! `connect` (dials), `subscribe` (streams until closed), `shutdown`, `artifact` (may read
//! and write files), `send` with `files` (reads local paths), and anything with
//! `wait_ack_ms` (waits up to that long).
#![no_main]

#[path = "shared.rs"]
mod shared;

use awp_node::control::{Page, Request, Response};
use awp_node::node::{NodeConfig, NodeHandle};
use libfuzzer_sys::fuzz_target;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Inputs whose length is a multiple of this go through the socket.
const SOCKET_EVERY: usize = 64;

/// Inputs answered by one node before it is replaced (the store targets use
/// `shared::FRESH_EVERY`, 20,000).
/// Inputs issue grants, up to 16 per input, and listings show up to 500 of them a page;
/// with 20,000 inputs per node most of a run went into building pages of hundreds of
/// grants in instrumented code (under 500 inputs a second after 2 million), not into new
/// paths. 2,000 inputs still make listings of more than a page.
const NODE_INPUTS: u64 = 2_000;

/// The runtime, kept for the whole run, and the node now answering.
struct Fixture {
    rt: tokio::runtime::Runtime,
    live: Mutex<Live>,
}

/// One node in its own temp home. Replaced by a fresh one every [`NODE_INPUTS`]
/// inputs: what earlier inputs stored stays for a while, as in a long-lived node, but a
/// run of ten million inputs does not slow down on an ever larger store (one node for a
/// whole run fell from about 5,900 to under 200 inputs a second after 1.7 million).
struct Live {
    socket: PathBuf,
    node: Arc<NodeHandle>,
    inputs: u64,
    // Declared after `node`: the directory goes after the node is dropped.
    _home: tempfile::TempDir,
}

fn start(rt: &tokio::runtime::Runtime) -> Live {
    let home = tempfile::Builder::new()
        .prefix("awp-fuzz-control-")
        .tempdir()
        .unwrap();
    let node = rt
        .block_on(NodeHandle::start(NodeConfig {
            home: home.path().to_path_buf(),
            listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
            name: Some("fuzz@control".into()),
            ..Default::default()
        }))
        .expect("node starts");
    node.store()
        .set_faults(Some(Arc::new(shared::NoDurability)));
    Live {
        socket: awp_node::daemon::socket_path(home.path()),
        node: Arc::new(node),
        inputs: 0,
        _home: home,
    }
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let live = Mutex::new(start(&rt));
        Fixture { rt, live }
    })
}

/// The live node, replaced first when it has answered [`NODE_INPUTS`] inputs.
fn live(f: &'static Fixture) -> std::sync::MutexGuard<'static, Live> {
    let mut l = f.live.lock().unwrap_or_else(|p| p.into_inner());
    l.inputs += 1;
    if l.inputs > NODE_INPUTS {
        l.node.shutdown();
        f.rt.block_on(l.node.stopped());
        *l = start(&f.rt);
        l.inputs = 1;
    }
    l
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
    let f = fixture();
    let l = live(f);
    let by_socket = data.len() % SOCKET_EVERY == 0;
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
        let resp = if by_socket {
            let resp = ask(&l.socket, line);
            serde_json::from_slice::<Response>(&resp).unwrap_or_else(|e| {
                panic!(
                    "response is not a Response ({e}): {}",
                    String::from_utf8_lossy(&resp)
                )
            })
        } else {
            // In the runtime's context on this thread (what the request's handler spawns
            // runs on the worker): a task per request cost two cross-thread wake-ups, and
            // on an otherwise idle machine the fuzzer spent a third of its time waiting
            // for them.
            let resp =
                f.rt.block_on(l.node.control_line(line))
                    .expect("every request sent is answered in-process");
            // What the socket would write must parse back to the same response.
            let bytes = serde_json::to_vec(&resp).expect("a response serializes");
            let again: Response = serde_json::from_slice(&bytes).expect("a response parses");
            assert_eq!(again, resp, "round trip changed the response");
            resp
        };
        if parsed.is_err() {
            assert!(!resp.ok, "an unparsable request was answered ok");
            assert_eq!(resp.error.unwrap().code, "bad_request");
        }
    }
});
