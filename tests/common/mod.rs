//! Helpers for integration tests: nodes in temp homes on 127.0.0.1, a control-socket client,
//! raw protocol connections.
#![allow(dead_code)]

use awp_node::control::{Request, Response};
use awp_node::identity::Identity;
use awp_node::net::{self, Address, DialOptions, TlsConfig};
use awp_node::node::{NodeConfig, NodeHandle};
use awp_node::wire::{self, Line};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// A node in its own temp home, listening on TLS 127.0.0.1 (ephemeral port).
pub struct TestNode {
    pub home: TempDir,
    pub handle: NodeHandle,
}

impl TestNode {
    pub async fn start(name: &str) -> TestNode {
        let home = TempDir::new().unwrap();
        Self::start_in(home, name).await
    }

    pub async fn start_in(home: TempDir, name: &str) -> TestNode {
        let handle = NodeHandle::start(NodeConfig {
            home: home.path().to_path_buf(),
            listen: vec!["tls:127.0.0.1:0".parse().unwrap()],
            allow_plaintext: false,
            name: Some(name.to_string()),
            about: None,
            ..Default::default()
        })
        .await
        .expect("node starts");
        TestNode { home, handle }
    }

    pub fn path(&self) -> PathBuf {
        self.home.path().to_path_buf()
    }

    /// The node's first dialable address (pinned to its key).
    pub fn address(&self) -> String {
        self.handle.listening_event()["address"]
            .as_str()
            .unwrap()
            .to_string()
    }

    pub fn key(&self) -> String {
        self.handle.key().to_string()
    }

    /// Dial `to` through the control socket and wait for the handshake; the response body.
    pub async fn connect(&self, to: &TestNode) -> Value {
        let r = self
            .ctl(Request::Connect {
                address: to.address(),
                timeout_ms: Some(10_000),
            })
            .await;
        assert!(r.ok, "connect failed: {:?}", r.error);
        Value::Object(r.body)
    }

    pub async fn ctl(&self, req: Request) -> Response {
        ctl(self.home.path(), req).await
    }

    /// Send a text msg; returns the response body.
    pub async fn send(&self, peer: Option<&str>, th: Option<&str>, text: &str) -> Value {
        let r = self
            .ctl(Request::Send {
                peer: peer.map(str::to_string),
                th: th.map(str::to_string),
                subject: Some("test".into()),
                re: None,
                parts: vec![serde_json::json!({"k":"text","text":text})],
                files: vec![],
                wait_ack_ms: None,
            })
            .await;
        assert!(r.ok, "send failed: {:?}", r.error);
        Value::Object(r.body)
    }

    /// Inbound log entries (all, read or not).
    pub async fn inbound(&self) -> Vec<Value> {
        let r = self
            .ctl(Request::Read {
                th: None,
                mark: false,
            })
            .await;
        assert!(r.ok, "{:?}", r.error);
        r.body["entries"].as_array().cloned().unwrap_or_default()
    }

    pub async fn stop(self) -> TempDir {
        self.handle.shutdown();
        self.handle.stopped().await;
        self.home
    }
}

/// One request over the control socket of the node in `home`.
pub async fn ctl(home: &Path, req: Request) -> Response {
    let sock = awp_node::daemon::socket_path(home);
    let stream = UnixStream::connect(&sock).await.expect("control socket");
    let (r, mut w) = stream.into_split();
    let mut line = serde_json::to_vec(&req).unwrap();
    line.push(b'\n');
    w.write_all(&line).await.unwrap();
    let mut r = BufReader::new(r);
    let mut resp = String::new();
    tokio::time::timeout(Duration::from_secs(20), r.read_line(&mut resp))
        .await
        .expect("control response in time")
        .unwrap();
    serde_json::from_str(&resp).expect("response is JSON")
}

/// Poll `f` every 20 ms until it returns Some, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A raw AWP client over TLS with its own identity, for speaking lines by hand.
pub struct Raw {
    pub identity: Identity,
    pub reader: net::LineReader,
    pub writer: net::BoxWriter,
}

impl Raw {
    pub async fn dial(addr: &str, seed: u8) -> Raw {
        let identity = Identity::from_seed(&[seed; 32]);
        let tls = TlsConfig::new(&identity).unwrap();
        let addr: Address = addr.parse().unwrap();
        let c = net::dial(&addr, &tls, &DialOptions::default())
            .await
            .expect("dial");
        Raw {
            identity,
            reader: c.reader,
            writer: c.writer,
        }
    }

    pub async fn write(&mut self, line: &[u8]) {
        self.writer.write_all(line).await.unwrap();
        self.writer.write_all(b"\n").await.unwrap();
        self.writer.flush().await.unwrap();
    }

    /// Next line, or None at EOF / after 10 s.
    pub async fn read(&mut self) -> Option<Vec<u8>> {
        match tokio::time::timeout(Duration::from_secs(10), self.reader.read_line()).await {
            Ok(Ok(l)) => l,
            _ => None,
        }
    }

    pub async fn read_line(&mut self) -> Option<Line> {
        self.read()
            .await
            .map(|l| wire::parse_line(&l).expect("node sends valid lines"))
    }

    /// Our hello line (v may be overridden).
    pub fn hello(&self, v: u64) -> Vec<u8> {
        self.hello_full(v, "raw@test", None)
    }

    /// A hello with a chosen version, name and `addr`.
    pub fn hello_full(&self, v: u64, name: &str, addr: Option<&str>) -> Vec<u8> {
        Line::Hello(wire::Hello {
            id: "01K00000000000000000000000".into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            v,
            key: self.identity.key().to_string(),
            name: Some(name.into()),
            nonce: wire::b64::encode_url(&[7u8; 32]),
            caps: vec![],
            about: None,
            addr: addr.map(str::to_string),
            shares: None,
        })
        .encode()
    }

    /// Full handshake: hello, read node hello, auth, read node auth + resume.
    pub async fn handshake(&mut self) -> wire::Hello {
        let mine = self.hello(0);
        self.handshake_with(mine).await
    }

    /// Full handshake with a given hello line.
    pub async fn handshake_with(&mut self, mine: Vec<u8>) -> wire::Hello {
        self.write(&mine).await;
        let their_raw = self.read().await.expect("node hello");
        let Ok(Line::Hello(h)) = wire::parse_line(&their_raw) else {
            panic!("first line must be hello")
        };
        let sig = self
            .identity
            .sign(&awp_node::identity::auth_transcript(&mine, &their_raw));
        let auth = Line::Auth(wire::Auth {
            id: "01K00000000000000000000001".into(),
            ts: "2026-01-01T00:00:00.000Z".into(),
            sig: wire::b64::encode_url(&sig),
            grants: vec![],
        });
        self.write(&auth.encode()).await;
        let a = self.read_line().await.expect("node auth");
        assert_eq!(a.kind(), "auth");
        let r = self.read_line().await.expect("node resume");
        assert_eq!(r.kind(), "resume");
        h
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for a daemon that must keep its port
/// across restarts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `awp daemon` as a child process (so that a test can SIGKILL it) in `home`, listening on
/// `tls:127.0.0.1:PORT`, with its output discarded.
pub fn start_daemon(home: &Path, port: u16) -> std::process::Child {
    use std::process::{Command, Stdio};
    Command::new(env!("CARGO_BIN_EXE_awp"))
        .args(["daemon", "--home"])
        .arg(home)
        .args(["--listen", &format!("tls:127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn awp daemon")
}

/// Wait (up to 20 s) until the node in `home` answers `status` on its control socket, and
/// return that status.
pub async fn wait_ready(home: &Path) -> Value {
    eventually(20, || async {
        let sock = awp_node::daemon::socket_path(home);
        if UnixStream::connect(&sock).await.is_err() {
            return None;
        }
        let r = ctl(home, Request::Status).await;
        r.ok.then_some(Value::Object(r.body))
    })
    .await
}

/// A `msg` line in thread `th` with id `id` and one data part per `(mime, data)`.
pub fn data_msg_line(id: &str, th: &str, parts: &[(&str, Value)]) -> String {
    let parts: Vec<Value> = parts
        .iter()
        .map(|(m, d)| serde_json::json!({"k": "data", "mime": m, "data": d}))
        .collect();
    serde_json::json!({"t": "msg", "id": id, "ts": "2026-01-01T00:00:00.000Z", "th": th, "parts": parts})
        .to_string()
}

/// Lines from `raw` until a msg with a data part of `mime` (at most 50 lines); that
/// part's `data`. Panics when none comes.
pub async fn read_data_part(raw: &mut Raw, mime: &str) -> Value {
    for _ in 0..50 {
        let Some(l) = raw.read().await else {
            break;
        };
        let v: Value = serde_json::from_slice(&l).unwrap();
        if v["t"] == "msg" {
            if let Some(p) = v["parts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["mime"] == mime)
            {
                return p["data"].clone();
            }
        }
    }
    panic!("no {mime} part from the node");
}

/// Run `awp --home HOME ARGS…` (the test build's binary, off the async runtime) with
/// `RUST_LOG` and `AWP_HOME` removed from its environment.
pub async fn awp_cli(home: &Path, args: &[&str]) -> std::process::Output {
    let home = home.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_awp"))
            .arg("--home")
            .arg(&home)
            .args(&args)
            .env_remove("RUST_LOG")
            .env_remove("AWP_HOME")
            .output()
            .expect("awp runs")
    })
    .await
    .unwrap()
}

/// A command's stdout as text.
pub fn stdout_text(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's stderr as text.
pub fn stderr_text(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
