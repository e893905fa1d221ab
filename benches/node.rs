//! `cargo bench --bench node` (or `scripts/bench.sh`): figures for one release build of the
//! node on this machine, printed in one run.
//!
//! 1. fsync latency of the file system that holds the node homes (4 KiB append +
//!    `sync_data`), and for comparison one `Store::flush` after a one-line enqueue;
//! 2. handshake time (TCP + TLS + hello/auth until the node's resume), raw client → node;
//! 3. durable msg → ack round trip, sequential, over TLS on loopback, then ping → pong on the
//!    same connection (the trip without storage);
//! 4. pipelined throughput: a writer task sends every msg at once, a reader counts acks;
//!    4b. the same with lines signed by the client (`signed-lines`), verified by the node;
//! 5. resume replay of a prefilled outbox (`Store::enqueue` before the node starts);
//! 6. peak RSS (`VmHWM`) of every node process;
//! 7. CLI command start: `awp --home H status` against a running node, spawn to exit,
//!    next to the spawn of `/bin/true` (the process-spawn floor);
//! 8. the pipelined run of phase 4 against a node reached directly and through a circuit
//!    of an `awp relay` (issue 14, spec/relay-circuits.md), in rounds alternating the two.
//!
//! Nodes run as separate processes (`awp daemon --home H --listen tls:127.0.0.1:0`); their
//! port comes from the control `status`. Everything stays on 127.0.0.1 in temporary homes;
//! every phase is bounded in count and time, and the nodes are killed when the run ends
//! (also on failure). Targets are printed next to the figures; a missed target does not
//! fail the run, a phase that could not run does (exit code 1).
//!
//! Environment (all optional): `AWP_BIN` (the `awp` binary, default the one cargo built
//! with this bench: `CARGO_BIN_EXE_awp`), `AWP_BENCH_DIR` (parent of the temporary homes, default the
//! system temp dir), `AWP_BENCH_PIDS` (a file to which node pids are appended, for a
//! cleanup trap), `BENCH_FSYNC_N`, `BENCH_HANDSHAKE_N`, `BENCH_RTT_N`, `BENCH_PIPE_N`,
//! `BENCH_REPLAY_N`, `BENCH_CLI_N`, `BENCH_CIRCUIT_N` (msgs per round of phase 8, default
//! 30,000; 0 skips it), `BENCH_CIRCUIT_ROUNDS` (default 3), `BENCH_ONLY=circuit` (phase 8
//! alone, for `scripts/bench-circuit.sh`), `BENCH_PHASE_LIMIT_S` (per-phase time limit, default
//! 120), `AWP_BENCH_SUMMARY` (a file to which `name value` lines of the headline figures
//! are appended for `scripts/bench.sh`'s table: `fsync_p50_ms`, `rtt_p50_ms`,
//! `pipe_msgs_s`, `pipe_signed_msgs_s`, `replay_s`, `replay_n`, `cli_p50_ms`, `spawn_p50_ms`, `circuit_ratio`).

use anyhow::{anyhow, bail, Context, Result};
use awp_node::control::{self, Request};
use awp_node::identity::{auth_transcript, Identity};
use awp_node::net::{self, Address, BoxWriter, DialOptions, LineReader, TlsConfig};
use awp_node::store::{LineBuilder, Store};
use awp_node::wire::{self, ids::IdGen, Line, Part, PeerKey, TextPart};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Target: durable round trip p50 within this factor of the fsync p50.
const RTT_FACTOR: f64 = 1.2;
/// Target: pipelined msgs per second (issue 10).
const PIPE_TARGET: f64 = 100_000.0;
/// Target: pipelined msgs per second when the client signs its lines and the node verifies
/// them (issue 13).
const SIGNED_PIPE_TARGET: f64 = 25_000.0;
/// Target: replay of a prefilled outbox of 100k lines, seconds (issue 10; scaled linearly
/// for other `BENCH_REPLAY_N`).
const REPLAY_TARGET_S: f64 = 0.25;
/// Lines the replay target is given for.
const REPLAY_TARGET_N: f64 = 100_000.0;
/// Target: CLI command start p50, ms (issue 10).
const CLI_TARGET_MS: f64 = 2.0;
/// Approximate size of every bench msg line, bytes (without `\n`).
const MSG_BYTES: usize = 200;
/// Wait for any single line from the node at most this long.
const READ_LIMIT: Duration = Duration::from_secs(10);
/// Wait for a node's control socket at most this long after spawning it.
const START_LIMIT: Duration = Duration::from_secs(30);
/// Lines per `Store::enqueue` call when prefilling.
const PREFILL_BATCH: usize = 1000;
/// Bytes per write call of the pipelined writer.
const PIPE_CHUNK: usize = 64 * 1024;
/// Target (issue 14): pipelined msgs/s through a relay circuit, as a share of direct.
const CIRCUIT_TARGET: f64 = 0.8;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("prefill") {
        // Child mode: fill an outbox, then exit (which releases the database lock).
        if let Err(e) = prefill_child(&args[2..]) {
            eprintln!("prefill failed: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let failed = rt.block_on(run());
    drop(rt);
    std::process::exit(if failed { 1 } else { 0 });
}

// ---------------------------------------------------------------------------------------
// Configuration

struct Config {
    bin: PathBuf,
    work: tempfile::TempDir,
    pids: Option<PathBuf>,
    fsync_n: usize,
    handshake_n: usize,
    rtt_n: usize,
    pipe_n: usize,
    replay_n: usize,
    cli_n: usize,
    circuit_n: usize,
    circuit_rounds: usize,
    only_circuit: bool,
    phase_limit: Duration,
    summary: Option<PathBuf>,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

impl Config {
    fn from_env() -> Result<Config> {
        // Default: the awp executable cargo built for this bench (same profile and features).
        let bin = std::env::var_os("AWP_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_awp")));
        if !bin.is_file() {
            bail!(
                "no awp binary at {} (run `cargo bench --bench node`, or set AWP_BIN)",
                bin.display()
            );
        }
        let parent = std::env::var_os("AWP_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let work = tempfile::Builder::new()
            .prefix("awp-bench-")
            .tempdir_in(&parent)
            .with_context(|| format!("temp dir in {}", parent.display()))?;
        Ok(Config {
            bin,
            work,
            pids: std::env::var_os("AWP_BENCH_PIDS").map(PathBuf::from),
            fsync_n: env_usize("BENCH_FSYNC_N", 200),
            handshake_n: env_usize("BENCH_HANDSHAKE_N", 20),
            rtt_n: env_usize("BENCH_RTT_N", 1000),
            pipe_n: env_usize("BENCH_PIPE_N", 100_000),
            replay_n: env_usize("BENCH_REPLAY_N", 100_000),
            cli_n: env_usize("BENCH_CLI_N", 50),
            // 0 is a value here (skip phase 8), not "unset" as for the other counts.
            circuit_n: std::env::var("BENCH_CIRCUIT_N")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(30_000),
            circuit_rounds: env_usize("BENCH_CIRCUIT_ROUNDS", 3).max(1),
            only_circuit: std::env::var("BENCH_ONLY").is_ok_and(|v| v == "circuit"),
            summary: std::env::var_os("AWP_BENCH_SUMMARY").map(PathBuf::from),
            phase_limit: Duration::from_secs(env_usize("BENCH_PHASE_LIMIT_S", 120) as u64),
        })
    }

    fn dir(&self) -> &Path {
        self.work.path()
    }
}

// ---------------------------------------------------------------------------------------
// Statistics and formatting

/// Sorted samples with nearest-rank percentiles.
struct Samples(Vec<Duration>);

impl Samples {
    fn new(mut v: Vec<Duration>) -> Samples {
        v.sort();
        Samples(v)
    }
    fn pct(&self, p: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }
    fn min(&self) -> Duration {
        self.0.first().copied().unwrap_or_default()
    }
    fn max(&self) -> Duration {
        self.0.last().copied().unwrap_or_default()
    }
    fn mean(&self) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        self.0.iter().sum::<Duration>() / self.0.len() as u32
    }
    fn summary(&self) -> String {
        format!(
            "p50 {}  p99 {}  (min {}  p90 {}  mean {}  max {}, n={})",
            ms(self.pct(50.0)),
            ms(self.pct(99.0)),
            ms(self.min()),
            ms(self.pct(90.0)),
            ms(self.mean()),
            ms(self.max()),
            self.0.len()
        )
    }
}

/// Append `name value` to the summary file (when one is set).
fn summary(cfg: &Config, name: &str, value: f64) {
    if let Some(p) = &cfg.summary {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{name} {value}");
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "MISSED"
    }
}

/// CPU seconds (user + system) of a process from `/proc/PID/stat` (`self` for this one).
fn cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields after the command: state is field 3, utime 14, stime 15 (1-based).
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // USER_HZ is 100 on Linux.
    Some((utime + stime) / 100.0)
}

/// A `kB` field of `/proc/PID/status` (`VmHWM`, `VmRSS`).
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

// ---------------------------------------------------------------------------------------
// Node processes

/// A child process killed (SIGKILL) and reaped when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A node running as `awp daemon` in its own home.
struct Daemon {
    label: &'static str,
    proc: Proc,
    home: PathBuf,
    addr: Address,
    key: PeerKey,
    /// Spawn until the control socket answered `status`.
    start_time: Duration,
}

impl Daemon {
    async fn start(cfg: &Config, label: &'static str, home: &Path) -> Result<Daemon> {
        let listen = ["daemon", "--listen", "tls:127.0.0.1:0"].map(String::from);
        Self::start_with(cfg, label, home, &listen).await
    }

    /// Start `awp ARGS… --home HOME` (ARGS: the command and its flags) and wait for its
    /// control socket; the node must listen on a `tls:127.0.0.1:` address.
    async fn start_with(
        cfg: &Config,
        label: &'static str,
        home: &Path,
        args: &[String],
    ) -> Result<Daemon> {
        std::fs::create_dir_all(home)?;
        let log_path = home.join("bench-node.log");
        let log = std::fs::File::create(&log_path)?;
        let t0 = Instant::now();
        let child = Command::new(&cfg.bin)
            .args(args)
            .arg("--home")
            .arg(home)
            .arg("--name")
            .arg(format!("{label}@bench"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", cfg.bin.display()))?;
        let mut proc = Proc(child);
        let pid = proc.0.id();
        if let Some(p) = &cfg.pids {
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
            {
                let _ = writeln!(f, "{pid}");
            }
        }
        let sock = awp_node::daemon::socket_path(home);
        let deadline = t0 + START_LIMIT;
        let status = loop {
            if let Some(st) = proc.0.try_wait()? {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!("node {label} exited at start ({st}): {}", log.trim());
            }
            if let Ok(r) =
                control::request_with_timeout(&sock, &Request::Status, Duration::from_secs(2)).await
            {
                if r.ok {
                    break r;
                }
            }
            if Instant::now() > deadline {
                bail!("node {label} did not answer on its control socket within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let start_time = t0.elapsed();
        if status.body["pid"].as_u64() != Some(pid as u64) {
            bail!(
                "control socket of {} answered with pid {}, not {pid}",
                home.display(),
                status.body["pid"]
            );
        }
        let addr_text = status.body["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .find(|a| a.starts_with("tls:127.0.0.1:"))
            .ok_or_else(|| {
                anyhow!(
                    "no tls:127.0.0.1 address in status: {}",
                    status.body["addresses"]
                )
            })?
            .to_string();
        let addr: Address = addr_text.parse().map_err(|e| anyhow!("{addr_text}: {e}"))?;
        let key = status.body["key"]
            .as_str()
            .and_then(|k| PeerKey::parse(k).ok())
            .ok_or_else(|| anyhow!("no key in status"))?;
        Ok(Daemon {
            label,
            proc,
            home: home.to_path_buf(),
            addr,
            key,
            start_time,
        })
    }

    fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    fn cpu(&self) -> f64 {
        cpu_secs(&self.pid().to_string()).unwrap_or(f64::NAN)
    }
}

// ---------------------------------------------------------------------------------------
// A raw AWP client

struct Client {
    reader: LineReader,
    writer: BoxWriter,
    ids: IdGen,
}

fn now_ts() -> String {
    wire::time::format_ms(wire::time::now_ms())
}

/// A text msg line in thread `th` with a text sized so the line is about `MSG_BYTES`.
fn msg_line(id: &str, ts: &str, th: &str, text: &str) -> Line {
    Line::Msg(wire::Msg {
        id: id.to_string(),
        ts: ts.to_string(),
        th: th.to_string(),
        re: None,
        subject: None,
        parts: vec![Part::Text(TextPart {
            text: text.to_string(),
        })],
    })
}

/// Filler text that makes a msg line in `th` about `MSG_BYTES` long.
fn filler(th: &str) -> String {
    let base = msg_line("01K00000000000000000000000", &now_ts(), th, "")
        .encode()
        .len();
    "x".repeat(MSG_BYTES.saturating_sub(base).max(1))
}

impl Client {
    async fn connect(addr: &Address, tls: &TlsConfig) -> Result<Client> {
        let c = net::dial(addr, tls, &DialOptions::default())
            .await
            .with_context(|| format!("dial {addr}"))?;
        Ok(Client {
            reader: c.reader,
            writer: c.writer,
            ids: IdGen::new(None),
        })
    }

    fn next_id(&mut self) -> String {
        self.ids.next_at(wire::time::now_ms()).to_string()
    }

    async fn write_line(&mut self, line: &[u8]) -> Result<()> {
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line);
        buf.push(b'\n');
        self.writer.write_all(&buf).await?;
        self.writer.flush().await?;
        Ok(())
    }

    async fn read_raw(&mut self) -> Result<Vec<u8>> {
        match tokio::time::timeout(READ_LIMIT, self.reader.read_line()).await {
            Ok(Ok(Some(l))) => Ok(l),
            Ok(Ok(None)) => bail!("the node closed the connection"),
            Ok(Err(e)) => bail!("read: {e}"),
            Err(_) => bail!("no line from the node within {} s", READ_LIMIT.as_secs()),
        }
    }

    async fn read(&mut self) -> Result<Line> {
        let raw = self.read_raw().await?;
        let line = wire::parse_line(&raw).map_err(|e| {
            anyhow!(
                "bad line from node ({e}): {}",
                String::from_utf8_lossy(&raw)
            )
        })?;
        if let Line::Err(e) = &line {
            bail!("node sent err {}: {:?}", e.code, e.detail);
        }
        Ok(line)
    }

    /// hello, the node's hello, auth, the node's auth and resume (our resume is separate).
    async fn handshake(&mut self, identity: &Identity) -> Result<()> {
        self.handshake_caps(identity, vec![]).await
    }

    /// [`Client::handshake`] announcing `caps` in our hello.
    async fn handshake_caps(&mut self, identity: &Identity, caps: Vec<String>) -> Result<()> {
        let mut nonce = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut nonce);
        let mine = Line::Hello(wire::Hello {
            id: self.next_id(),
            ts: now_ts(),
            v: 0,
            key: identity.key().to_string(),
            name: Some("bench@127.0.0.1".into()),
            nonce: wire::b64::encode_url(&nonce),
            caps,
            about: None,
            addr: None,
            shares: None,
        })
        .encode();
        self.write_line(&mine).await?;
        let theirs = self.read_raw().await?;
        match wire::parse_line(&theirs) {
            Ok(Line::Hello(_)) => {}
            _ => bail!(
                "first line from the node is not hello: {}",
                String::from_utf8_lossy(&theirs)
            ),
        }
        let sig = identity.sign(&auth_transcript(&mine, &theirs));
        let auth = Line::Auth(wire::Auth {
            id: self.next_id(),
            ts: now_ts(),
            sig: wire::b64::encode_url(&sig),
            grants: vec![],
        });
        self.write_line(&auth.encode()).await?;
        for want in ["auth", "resume"] {
            let l = self.read().await?;
            if l.kind() != want {
                bail!("expected {want} from the node, got {}", l.kind());
            }
        }
        Ok(())
    }

    async fn send_resume(&mut self) -> Result<()> {
        let r = Line::Resume(wire::Resume {
            id: self.next_id(),
            ts: now_ts(),
            seen: Default::default(),
        });
        self.write_line(&r.encode()).await
    }

    /// Close our half and wait (bounded) for the node to close its half.
    async fn close(mut self) {
        let _ = self.writer.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(_)) = self.reader.read_line().await {}
        })
        .await;
    }
}

// ---------------------------------------------------------------------------------------
// Phases

/// 1. 4 KiB append + `sync_data`, `n` times, in `dir`.
fn phase_fsync(dir: &Path, n: usize, limit: Duration) -> Result<Samples> {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path)?;
    let block = [0x5au8; 4096];
    let t_phase = Instant::now();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&block)?;
        f.sync_data()?;
        v.push(t.elapsed());
        if t_phase.elapsed() > limit {
            bail!(
                "aborted after {} s ({} of {n} syncs)",
                limit.as_secs(),
                v.len()
            );
        }
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(Samples::new(v))
}

/// 1b. What the node waits for before an ack: `Store::flush` after enqueueing one line.
fn phase_store_flush(dir: &Path, n: usize, limit: Duration) -> Result<Samples> {
    let store = Store::open(&dir.join("flush-probe-db"))?;
    let peer = Identity::generate().key();
    let th = "thr_bench_flush";
    let text = filler(th);
    let b = |id: &str, ts: &str| msg_line(id, ts, th, &text);
    let builders: [LineBuilder<'_>; 1] = [&b];
    let t_phase = Instant::now();
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        store.enqueue(&peer, &builders)?;
        let t = Instant::now();
        store.flush_blocking()?;
        v.push(t.elapsed());
        if t_phase.elapsed() > limit {
            bail!(
                "aborted after {} s ({} of {n} flushes)",
                limit.as_secs(),
                v.len()
            );
        }
    }
    Ok(Samples::new(v))
}

/// 2. Dial + TLS + hello/auth until the node's resume, `n` times with one client key.
async fn phase_handshake(node: &Daemon, n: usize) -> Result<Samples> {
    let identity = Identity::generate();
    let tls = TlsConfig::new(&identity)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut c = Client::connect(&node.addr, &tls).await?;
        c.handshake(&identity).await?;
        v.push(t.elapsed());
        c.send_resume().await?;
        c.close().await;
    }
    Ok(Samples::new(v))
}

/// Phase 3: one msg at a time, timed from write to its ack. Then as many pings, each timed
/// to its pong: the same trip without the store.
async fn phase_rtt(node: &Daemon, n: usize) -> Result<(Samples, Samples)> {
    let identity = Identity::generate();
    let tls = TlsConfig::new(&identity)?;
    let mut c = Client::connect(&node.addr, &tls).await?;
    c.handshake(&identity).await?;
    c.send_resume().await?;
    let th = "thr_bench_rtt";
    let text = filler(th);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let id = c.next_id();
        let line = msg_line(&id, &now_ts(), th, &text).encode();
        let t = Instant::now();
        c.write_line(&line).await?;
        loop {
            match c.read().await? {
                Line::Ack(a) if a.re == id => break,
                _ => continue,
            }
        }
        v.push(t.elapsed());
    }
    // The same trip without storage: ping → pong on the same connection (TLS, framing,
    // parsing and the node's tasks; no commit, no fsync). The floor under the round trip.
    let mut p = Vec::with_capacity(n);
    for _ in 0..n {
        let id = c.next_id();
        let line = Line::Ping(awp_node::wire::Ping {
            id: id.clone(),
            ts: now_ts(),
        })
        .encode();
        let t = Instant::now();
        c.write_line(&line).await?;
        loop {
            match c.read().await? {
                Line::Pong(pong) if pong.re == id => break,
                _ => continue,
            }
        }
        p.push(t.elapsed());
    }
    c.close().await;
    Ok((Samples::new(v), Samples::new(p)))
}

struct PipeResult {
    n: usize,
    elapsed: Duration,
    written_at: Duration,
    first_ack_at: Duration,
    half_at: Duration,
    node_cpu: f64,
    client_cpu: f64,
    line_bytes: usize,
}

/// Phase 4: a writer task sends `n` msgs as fast as it can; a reader task counts acks.
/// `signed` (phase 4b): the client announces `signed-lines` and signs every line (before
/// the clock starts), so the node verifies each.
async fn phase_pipe(node: &Daemon, n: usize, limit: Duration, signed: bool) -> Result<PipeResult> {
    phase_pipe_at(node, &node.addr, n, limit, signed).await
}

/// [`phase_pipe`] dialing `addr` (the node's own address, or a circuit to it).
async fn phase_pipe_at(
    node: &Daemon,
    addr: &Address,
    n: usize,
    limit: Duration,
    signed: bool,
) -> Result<PipeResult> {
    let identity = Identity::generate();
    let tls = TlsConfig::new(&identity)?;
    let mut c = Client::connect(addr, &tls).await?;
    let caps = if signed {
        vec![wire::sig::CAP.to_string()]
    } else {
        vec![]
    };
    c.handshake_caps(&identity, caps).await?;
    c.send_resume().await?;
    let th = "thr_bench_pipe";
    let text = filler(th);
    // Encode every line up front so the writer only writes.
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut cur = Vec::with_capacity(PIPE_CHUNK + 1024);
    let mut line_bytes = 0;
    for _ in 0..n {
        let id = c.next_id();
        let mut l = msg_line(&id, &now_ts(), th, &text).encode();
        if signed {
            l = wire::sig::sign_encoded(&identity, &l).map_err(|e| anyhow!("sign: {e}"))?;
        }
        line_bytes = l.len();
        cur.extend_from_slice(&l);
        cur.push(b'\n');
        if cur.len() >= PIPE_CHUNK {
            chunks.push(std::mem::replace(
                &mut cur,
                Vec::with_capacity(PIPE_CHUNK + 1024),
            ));
        }
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    let Client {
        mut reader,
        mut writer,
        ..
    } = c;
    let acks = Arc::new(AtomicU64::new(0));
    let cpu0 = (node.cpu(), cpu_secs("self").unwrap_or(f64::NAN));
    let t0 = Instant::now();
    let writer_task = tokio::spawn(async move {
        for chunk in &chunks {
            writer.write_all(chunk).await?;
        }
        writer.flush().await?;
        Ok::<_, std::io::Error>((t0.elapsed(), writer))
    });
    let acks2 = acks.clone();
    let reader_task = tokio::spawn(async move {
        let mut first = None;
        let mut half = None;
        let mut got = 0usize;
        while got < n {
            let line = match tokio::time::timeout(READ_LIMIT, reader.read_line()).await {
                Ok(Ok(Some(l))) => l,
                Ok(Ok(None)) => bail!("the node closed the connection after {got} acks"),
                Ok(Err(e)) => bail!("read after {got} acks: {e}"),
                Err(_) => bail!("no line within {} s after {got} acks", READ_LIMIT.as_secs()),
            };
            if line.starts_with(br#"{"t":"ack""#) {
                got += 1;
                acks2.store(got as u64, Ordering::Relaxed);
                if got == 1 {
                    first = Some(t0.elapsed());
                }
                if got == n / 2 {
                    half = Some(t0.elapsed());
                }
            } else if line.starts_with(br#"{"t":"err""#) {
                bail!(
                    "node sent err after {got} acks: {}",
                    String::from_utf8_lossy(&line)
                );
            }
        }
        Ok((
            t0.elapsed(),
            first.unwrap_or_default(),
            half.unwrap_or_default(),
        ))
    });
    let joined = tokio::time::timeout(limit, async {
        let r = reader_task.await;
        let w = writer_task.await;
        (r, w)
    })
    .await;
    let (r, w) = match joined {
        Ok(x) => x,
        Err(_) => bail!(
            "aborted after {} s with {} of {n} acks",
            limit.as_secs(),
            acks.load(Ordering::Relaxed)
        ),
    };
    let (elapsed, first_ack_at, half_at) = r.context("reader task")??;
    let (written_at, mut writer) = w.context("writer task")??;
    let cpu1 = (node.cpu(), cpu_secs("self").unwrap_or(f64::NAN));
    let _ = writer.shutdown().await;
    Ok(PipeResult {
        n,
        elapsed,
        written_at,
        first_ack_at,
        half_at,
        node_cpu: cpu1.0 - cpu0.0,
        client_cpu: cpu1.1 - cpu0.1,
        line_bytes,
    })
}

/// Phase 8's figures: msgs/s of each round on each path, the relay's CPU time over the
/// circuit rounds, the msgs those rounds carried.
struct CircuitResult {
    direct: Vec<f64>,
    circuit: Vec<f64>,
    relay_cpu: f64,
    carried: usize,
}

/// Median of a non-empty list (the mean of the two middle values of an even count).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() % 2 {
        1 => v[v.len() / 2],
        _ => (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0,
    }
}

/// Phase 8 (issue 14): an `awp relay` and a node that keeps a standing connection to it
/// (`--via`); the pipelined run of phase 4 ([`phase_pipe_at`]) against the node's own
/// address, then through a circuit (its `relay:` address: the relay splices the two TCP
/// streams, TLS is end to end), `rounds` times, so a busy neighbour slows both alike.
async fn phase_circuit(cfg: &Config, n: usize, rounds: usize) -> Result<CircuitResult> {
    let relay_args = ["relay", "--listen", "tls:127.0.0.1:0"].map(String::from);
    let relay = Daemon::start_with(cfg, "relay", &cfg.dir().join("relay"), &relay_args).await?;
    // The status address is pinned (`#ed25519:KEY`).
    let via = relay.addr.to_string();
    let node_args = ["daemon", "--listen", "tls:127.0.0.1:0", "--via", &via].map(String::from);
    let node = Daemon::start_with(cfg, "c", &cfg.dir().join("node-c"), &node_args).await?;
    // The circuit address appears once the standing connection is up.
    let sock = awp_node::daemon::socket_path(&node.home);
    let deadline = Instant::now() + START_LIMIT;
    let circuit_addr: Address = loop {
        let r = match control::request_with_timeout(&sock, &Request::Status, Duration::from_secs(2))
            .await
        {
            Ok(r) => r,
            Err(e) if Instant::now() > deadline => {
                return Err(anyhow!(e).context("status of node c"));
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let found = r.body["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str())
            .find(|a| a.starts_with("relay:"))
            .map(str::to_string);
        if let Some(a) = found {
            break a.parse().map_err(|e| anyhow!("{a}: {e}"))?;
        }
        if Instant::now() > deadline {
            bail!(
                "node c showed no relay: address within {} s (addresses {})",
                START_LIMIT.as_secs(),
                r.body["addresses"]
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "   relay                {} (pid {})",
        relay.addr,
        relay.pid()
    );
    println!("   circuit address      {circuit_addr}");
    let mut out = CircuitResult {
        direct: Vec::new(),
        circuit: Vec::new(),
        relay_cpu: 0.0,
        carried: 0,
    };
    for round in 1..=rounds {
        // Each run adds n msgs to the node's store: the path that runs first alternates.
        let direct = async {
            phase_pipe_at(&node, &node.addr, n, cfg.phase_limit, false)
                .await
                .with_context(|| format!("direct, round {round}"))
        };
        let circuit = async {
            let cpu0 = relay.cpu();
            let c = phase_pipe_at(&node, &circuit_addr, n, cfg.phase_limit, false)
                .await
                .with_context(|| format!("circuit, round {round}"))?;
            Ok::<_, anyhow::Error>((c, relay.cpu() - cpu0))
        };
        let (d, (c, cpu)) = if round % 2 == 1 {
            let d = direct.await?;
            (d, circuit.await?)
        } else {
            let c = circuit.await?;
            (direct.await?, c)
        };
        out.relay_cpu += cpu;
        out.carried += c.n;
        let (dr, cr) = (
            d.n as f64 / d.elapsed.as_secs_f64(),
            c.n as f64 / c.elapsed.as_secs_f64(),
        );
        println!(
            "   round {round}              direct {dr:.0} msgs/s, circuit {cr:.0} msgs/s ({:.0} %)",
            100.0 * cr / dr
        );
        out.direct.push(dr);
        out.circuit.push(cr);
    }
    Ok(out)
}

/// Spawn-to-exit times of `awp --home H status` against a running node and of `/bin/true`,
/// `cfg.cli_n` each, alternating (so load changes hit both alike).
fn phase_cli(cfg: &Config, node: &Daemon) -> Result<(Samples, Samples)> {
    let deadline = Instant::now() + cfg.phase_limit;
    let (mut cli, mut spawn) = (Vec::new(), Vec::new());
    for _ in 0..cfg.cli_n {
        let t0 = Instant::now();
        let st = Command::new(&cfg.bin)
            .arg("--home")
            .arg(&node.home)
            .arg("status")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        cli.push(t0.elapsed());
        if !st.success() {
            bail!("awp status exited with {st}");
        }
        let t0 = Instant::now();
        Command::new("/bin/true").status()?;
        spawn.push(t0.elapsed());
        if Instant::now() > deadline {
            bail!("aborted after {} s", cfg.phase_limit.as_secs());
        }
    }
    Ok((Samples::new(cli), Samples::new(spawn)))
}

/// Child mode: `prefill DB_DIR PEER_KEY N`.
fn prefill_child(args: &[String]) -> Result<()> {
    let [db, peer, n] = args else {
        bail!("usage: prefill DB_DIR PEER_KEY N");
    };
    let peer = PeerKey::parse(peer).map_err(|e| anyhow!("peer key: {e}"))?;
    let n: usize = n.parse()?;
    // The node refuses a home whose database exists without its identity (a lost key), so
    // the home gets its identity before the store is made.
    let home = Path::new(db)
        .parent()
        .ok_or_else(|| anyhow!("{db} has no parent"))?;
    std::fs::create_dir_all(home)?;
    let identity = Identity::load_or_create(home).map_err(|e| anyhow!("identity: {e}"))?;
    let store = Store::open(Path::new(db))?;
    // Queued as the node queues them: signed with the home's key (signing is on by
    // default), so the replay resends stored bytes instead of signing each line on the way.
    store.set_line_signer(Arc::new(identity));
    let th = "thr_bench_replay";
    let text = filler(th);
    let b = |id: &str, ts: &str| msg_line(id, ts, th, &text);
    let mut left = n;
    while left > 0 {
        let k = left.min(PREFILL_BATCH);
        let builders: Vec<LineBuilder<'_>> = vec![&b; k];
        store.enqueue(&peer, &builders)?;
        left -= k;
    }
    store.flush_blocking()?;
    let queued = store.outbox_len(&peer)?;
    if queued != n as u64 {
        bail!("outbox holds {queued} lines, expected {n}");
    }
    Ok(())
}

struct ReplayResult {
    n: usize,
    prefill: Duration,
    start: Duration,
    handshake: Duration,
    replay: Duration,
    dial_to_last: Duration,
    first_msg: Duration,
    node_cpu: f64,
    /// CPU seconds of this process (the client reading the replay) meanwhile.
    client_cpu: f64,
}

/// 5. Prefill a home's outbox for a client key, start the node, dial, resume, count.
async fn phase_replay(cfg: &Config, n: usize) -> Result<(ReplayResult, Daemon)> {
    let home = cfg.dir().join("node-b");
    let identity = Identity::generate();
    let exe = std::env::current_exe()?;
    let t = Instant::now();
    let mut child = tokio::process::Command::new(exe);
    child
        .arg("prefill")
        .arg(home.join("db"))
        .arg(identity.key().to_string())
        .arg(n.to_string())
        .kill_on_drop(true);
    let st = tokio::time::timeout(cfg.phase_limit, child.status())
        .await
        .map_err(|_| {
            anyhow!(
                "prefill did not finish within {} s",
                cfg.phase_limit.as_secs()
            )
        })??;
    if !st.success() {
        bail!("prefill failed ({st})");
    }
    let prefill = t.elapsed();

    let node = Daemon::start(cfg, "b", &home).await?;
    let tls = TlsConfig::new(&identity)?;
    let cpu0 = (node.cpu(), cpu_secs("self").unwrap_or(f64::NAN));
    let run = async {
        let t_dial = Instant::now();
        let mut c = Client::connect(&node.addr, &tls).await?;
        c.handshake(&identity).await?;
        let handshake = t_dial.elapsed();
        let t_resume = Instant::now();
        c.send_resume().await?;
        let mut got = 0usize;
        let mut first = Duration::ZERO;
        let mut last_id: Vec<u8> = Vec::new();
        // `{"t":"msg","id":"` then 26 id bytes.
        const ID_AT: usize = 17;
        while got < n {
            let l = c
                .read_raw()
                .await
                .with_context(|| format!("after {got} msgs"))?;
            if l.starts_with(br#"{"t":"msg","id":""#) && l.len() > ID_AT + 26 {
                let id = &l[ID_AT..ID_AT + 26];
                if id <= &last_id[..] {
                    bail!("replay out of order at msg {got}");
                }
                last_id = id.to_vec();
                got += 1;
                if got == 1 {
                    first = t_resume.elapsed();
                }
            } else if l.starts_with(br#"{"t":"err""#) {
                bail!(
                    "node sent err after {got} msgs: {}",
                    String::from_utf8_lossy(&l)
                );
            }
        }
        let replay = t_resume.elapsed();
        let dial_to_last = t_dial.elapsed();
        c.close().await;
        Ok::<_, anyhow::Error>((handshake, replay, dial_to_last, first))
    };
    let (handshake, replay, dial_to_last, first_msg) = tokio::time::timeout(cfg.phase_limit, run)
        .await
        .map_err(|_| anyhow!("replay aborted after {} s", cfg.phase_limit.as_secs()))??;
    let node_cpu = node.cpu() - cpu0.0;
    let client_cpu = cpu_secs("self").unwrap_or(f64::NAN) - cpu0.1;
    Ok((
        ReplayResult {
            n,
            prefill,
            start: node.start_time,
            handshake,
            replay,
            dial_to_last,
            first_msg,
            node_cpu,
            client_cpu,
        },
        node,
    ))
}

async fn timed<T>(
    limit: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| anyhow!("{what} aborted after {} s", limit.as_secs()))?
}

// ---------------------------------------------------------------------------------------
// The run

/// Runs every phase and prints the figures; returns true when a phase failed.
async fn run() -> bool {
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            println!("bench: {e:#}");
            return true;
        }
    };
    let mut failed = false;
    // Target lines for the summary: round trip, pipelined, replay.
    let mut targets: [Option<String>; 5] = [None, None, None, None, None];
    let mut fail = |phase: &str, e: anyhow::Error| {
        println!("   {phase}: FAILED: {e:#}");
        failed = true;
    };
    println!("awp-node benchmark");
    println!("   binary   {}", cfg.bin.display());
    println!(
        "   homes in {} (fsync probe in the same directory)",
        cfg.dir().display()
    );
    println!(
        "   cpus     {}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    if cfg.only_circuit {
        if cfg.circuit_n == 0 {
            println!("BENCH_ONLY=circuit with BENCH_CIRCUIT_N=0: nothing to run");
            return failed;
        }
        let line = print_circuit(&cfg, &mut fail).await;
        println!();
        println!("Targets");
        match line {
            Some(line) => println!("   {line}"),
            None => println!("   circuit: NOT MEASURED (phase failed)"),
        }
        return failed;
    }

    // 1. fsync
    println!(
        "1. fsync latency: 4 KiB append + sync_data, {}×",
        cfg.fsync_n
    );
    let fsync = match phase_fsync(cfg.dir(), cfg.fsync_n, cfg.phase_limit) {
        Ok(s) => {
            println!("   fsync                {}", s.summary());
            summary(&cfg, "fsync_p50_ms", s.pct(50.0).as_secs_f64() * 1000.0);
            Some(s)
        }
        Err(e) => {
            fail("fsync", e);
            None
        }
    };
    match phase_store_flush(cfg.dir(), cfg.fsync_n, cfg.phase_limit) {
        Ok(s) => {
            println!(
                "   Store::flush         {}   (1 line enqueued before each flush; what an ack waits for)",
                s.summary()
            );
            if let Some(f) = &fsync {
                println!(
                    "   Store::flush p50 / fsync p50 = {:.2}",
                    s.pct(50.0).as_secs_f64() / f.pct(50.0).as_secs_f64()
                );
            }
        }
        Err(e) => fail("Store::flush", e),
    }
    println!();

    // Node A: handshake, round trip, pipelined.
    let mut nodes: Vec<(Daemon, &'static str)> = Vec::new();
    let node_a = match Daemon::start(&cfg, "a", &cfg.dir().join("node-a")).await {
        Ok(d) => Some(d),
        Err(e) => {
            fail("node a", e);
            None
        }
    };

    println!(
        "2. handshake: dial + TLS + hello/auth until the node's resume, {} dials",
        cfg.handshake_n
    );
    if let Some(a) = &node_a {
        println!(
            "   node a started in {} (spawn → control status)",
            ms(a.start_time)
        );
        match timed(
            cfg.phase_limit,
            "handshake",
            phase_handshake(a, cfg.handshake_n),
        )
        .await
        {
            Ok(s) => println!("   handshake            {}", s.summary()),
            Err(e) => fail("handshake", e),
        }
    }
    println!();

    println!(
        "3. durable msg → ack round trip over TLS loopback, {} sequential msgs of ~{MSG_BYTES} B",
        cfg.rtt_n
    );
    if let Some(a) = &node_a {
        let cpu0 = a.cpu();
        match timed(cfg.phase_limit, "round trip", phase_rtt(a, cfg.rtt_n)).await {
            Ok((s, ping)) => {
                println!("   round trip           {}", s.summary());
                summary(&cfg, "rtt_p50_ms", s.pct(50.0).as_secs_f64() * 1000.0);
                println!("   ping → pong          {}", ping.summary());
                summary(&cfg, "ping_p50_ms", ping.pct(50.0).as_secs_f64() * 1000.0);
                if let Some(f) = &fsync {
                    // What storing adds to the trip, against what the disk itself takes.
                    let added = s.pct(50.0).saturating_sub(ping.pct(50.0));
                    println!(
                        "   round trip p50 − ping p50 = {} = {:.2} × fsync p50 (the rest of the round trip is the ping's: TLS, loopback, the node's tasks)",
                        ms(added),
                        added.as_secs_f64() / f.pct(50.0).as_secs_f64()
                    );
                }
                println!(
                    "   node CPU             {:.2} s for {} msgs",
                    a.cpu() - cpu0,
                    cfg.rtt_n
                );
                if let Some(f) = &fsync {
                    let limit = f.pct(50.0).mul_f64(RTT_FACTOR);
                    let p50 = s.pct(50.0);
                    let line = format!(
                        "round trip p50 ≤ {RTT_FACTOR} × fsync p50 = {}: {} → {} ({:.2} × fsync p50)",
                        ms(limit),
                        ms(p50),
                        verdict(p50 <= limit),
                        p50.as_secs_f64() / f.pct(50.0).as_secs_f64()
                    );
                    println!("   target: {line}");
                    targets[0] = Some(line);
                }
            }
            Err(e) => fail("round trip", e),
        }
    }
    println!();

    println!(
        "4. pipelined throughput: {} msgs of ~{MSG_BYTES} B, writer task + ack-counting reader task",
        cfg.pipe_n
    );
    if let Some(a) = &node_a {
        match phase_pipe(a, cfg.pipe_n, cfg.phase_limit, false).await {
            Ok(p) => {
                let rate = p.n as f64 / p.elapsed.as_secs_f64();
                println!(
                    "   throughput           {:.0} msgs/s  ({} msgs of {} B in {:.3} s until the last ack)",
                    rate,
                    p.n,
                    p.line_bytes,
                    p.elapsed.as_secs_f64()
                );
                println!(
                    "   timeline             first ack {}  half acked {:.3} s  all written {:.3} s  last ack {:.3} s",
                    ms(p.first_ack_at),
                    p.half_at.as_secs_f64(),
                    p.written_at.as_secs_f64(),
                    p.elapsed.as_secs_f64()
                );
                println!(
                    "   CPU                  node {:.2} s ({:.0}% of one core), bench client {:.2} s",
                    p.node_cpu,
                    100.0 * p.node_cpu / p.elapsed.as_secs_f64(),
                    p.client_cpu
                );
                summary(&cfg, "pipe_msgs_s", rate);
                let line = format!(
                    "pipelined ≥ {PIPE_TARGET:.0} msgs/s: {rate:.0} msgs/s → {}",
                    verdict(rate >= PIPE_TARGET)
                );
                println!("   target: {line}");
                targets[1] = Some(line);
            }
            Err(e) => fail("pipelined", e),
        }
    }
    println!();

    println!(
        "4b. pipelined throughput with signed lines: {} msgs, each signed by the client (before the clock starts) and verified by the node",
        cfg.pipe_n
    );
    if let Some(a) = &node_a {
        match phase_pipe(a, cfg.pipe_n, cfg.phase_limit, true).await {
            Ok(p) => {
                let rate = p.n as f64 / p.elapsed.as_secs_f64();
                println!(
                    "   throughput           {:.0} msgs/s  ({} msgs of {} B in {:.3} s until the last ack)",
                    rate,
                    p.n,
                    p.line_bytes,
                    p.elapsed.as_secs_f64()
                );
                println!(
                    "   CPU                  node {:.2} s ({:.0}% of one core, {:.1} µs per msg)",
                    p.node_cpu,
                    100.0 * p.node_cpu / p.elapsed.as_secs_f64(),
                    p.node_cpu * 1e6 / p.n as f64
                );
                summary(&cfg, "pipe_signed_msgs_s", rate);
                println!(
                    "   target: pipelined signed ≥ {SIGNED_PIPE_TARGET:.0} msgs/s: {rate:.0} msgs/s → {}",
                    verdict(rate >= SIGNED_PIPE_TARGET)
                );
            }
            Err(e) => fail("pipelined signed", e),
        }
    }
    println!();

    println!(
        "7. CLI command start: `awp --home H status` against node a, spawn to exit, {}×",
        cfg.cli_n
    );
    if let Some(a) = &node_a {
        match phase_cli(&cfg, a) {
            Ok((cli, spawn)) => {
                println!("   awp status           {}", cli.summary());
                println!("   /bin/true            {}", spawn.summary());
                let p50 = cli.pct(50.0).as_secs_f64() * 1000.0;
                summary(&cfg, "cli_p50_ms", p50);
                summary(&cfg, "spawn_p50_ms", spawn.pct(50.0).as_secs_f64() * 1000.0);
                let line = format!(
                    "CLI start p50 ≤ {CLI_TARGET_MS} ms: {p50:.3} ms → {}",
                    verdict(p50 <= CLI_TARGET_MS)
                );
                println!("   target: {line}");
                targets[3] = Some(line);
            }
            Err(e) => fail("CLI start", e),
        }
    }
    if let Some(a) = node_a {
        nodes.push((a, "handshake, round trip, pipelined, CLI"));
    }
    println!();

    println!(
        "5. resume replay: {} lines queued for a raw client key",
        cfg.replay_n
    );
    match phase_replay(&cfg, cfg.replay_n).await {
        Ok((r, node_b)) => {
            println!(
                "   prefill              {:.3} s (Store::enqueue in batches of {PREFILL_BATCH}, one flush, separate process)",
                r.prefill.as_secs_f64()
            );
            println!(
                "   node b start         {} (spawn → control status)",
                ms(r.start)
            );
            println!("   handshake            {}", ms(r.handshake));
            println!(
                "   replay               {:.3} s from our resume to msg {} (first msg after {}); dial → last {:.3} s",
                r.replay.as_secs_f64(),
                r.n,
                ms(r.first_msg),
                r.dial_to_last.as_secs_f64()
            );
            println!(
                "   rate                 {:.0} msgs/s; CPU: node {:.2} s, bench client (TLS, framing) {:.2} s",
                r.n as f64 / r.replay.as_secs_f64(),
                r.node_cpu,
                r.client_cpu
            );
            summary(&cfg, "replay_s", r.replay.as_secs_f64());
            summary(&cfg, "replay_n", r.n as f64);
            let goal = REPLAY_TARGET_S * r.n as f64 / REPLAY_TARGET_N;
            let line = format!(
                "replay of {} lines ≤ {goal:.3} s: {:.3} s → {}",
                r.n,
                r.replay.as_secs_f64(),
                verdict(r.replay.as_secs_f64() <= goal)
            );
            println!("   target: {line}");
            targets[2] = Some(line);
            nodes.push((node_b, "resume replay"));
        }
        Err(e) => fail("replay", e),
    }
    println!();

    println!("6. peak RSS (VmHWM) of each node process");
    for (d, what) in &nodes {
        let hwm = status_kb(d.pid(), "VmHWM");
        let rss = status_kb(d.pid(), "VmRSS");
        match hwm {
            Some(h) => println!(
                "   node {} (pid {}, {what}): VmHWM {:.1} MiB, VmRSS now {:.1} MiB, db {} on disk",
                d.label,
                d.pid(),
                h as f64 / 1024.0,
                rss.unwrap_or(0) as f64 / 1024.0,
                dir_size(&d.home.join("db"))
                    .map(|b| format!("{:.1} MiB", b as f64 / 1048576.0))
                    .unwrap_or_else(|| "?".into())
            ),
            None => fail(
                &format!("RSS of node {}", d.label),
                anyhow!("no /proc entry (node {} exited?)", d.key),
            ),
        }
    }
    drop(nodes);
    println!();
    if cfg.circuit_n > 0 {
        targets[4] = print_circuit(&cfg, &mut fail).await;
        println!();
    }
    println!("Targets");
    let names = ["round trip", "pipelined", "replay", "CLI start", "circuit"];
    let skipped = [false, false, false, false, cfg.circuit_n == 0];
    for ((t, name), skipped) in targets.iter().zip(names).zip(skipped) {
        if skipped {
            continue;
        }
        match t {
            Some(line) => println!("   {line}"),
            None => println!("   {name}: NOT MEASURED (phase failed)"),
        }
    }
    failed
}

/// Phase 8, printed; its target line.
async fn print_circuit(cfg: &Config, fail: &mut impl FnMut(&str, anyhow::Error)) -> Option<String> {
    println!(
        "8. pipelined through a relay circuit: {} msgs of ~{MSG_BYTES} B per round, {} rounds alternating direct and circuit (same node)",
        cfg.circuit_n, cfg.circuit_rounds
    );
    match phase_circuit(cfg, cfg.circuit_n, cfg.circuit_rounds).await {
        Ok(r) => {
            let ratios: Vec<f64> = r
                .direct
                .iter()
                .zip(&r.circuit)
                .map(|(d, c)| c / d)
                .collect();
            let ratio = median(&ratios);
            println!(
                "   medians              direct {:.0} msgs/s, circuit {:.0} msgs/s; median of the rounds' circuit / direct {:.0} % (rounds {})",
                median(&r.direct),
                median(&r.circuit),
                100.0 * ratio,
                ratios.iter().map(|x| format!("{:.0} %", 100.0 * x)).collect::<Vec<_>>().join(", ")
            );
            println!(
                "   relay CPU            {:.2} s for the {} msgs of the circuit rounds (clock ticks of /proc: 0.01 s)",
                r.relay_cpu, r.carried
            );
            summary(cfg, "circuit_ratio", ratio);
            let line = format!(
                "pipelined through a circuit ≥ {:.0} % of direct: {:.0} % → {}",
                100.0 * CIRCUIT_TARGET,
                100.0 * ratio,
                verdict(ratio >= CIRCUIT_TARGET)
            );
            println!("   target: {line}");
            Some(line)
        }
        Err(e) => {
            fail("circuit", e);
            None
        }
    }
}

/// Total size of the files in `dir` (recursively).
fn dir_size(dir: &Path) -> Option<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).ok()? {
        let e = e.ok()?;
        let m = e.metadata().ok()?;
        total += if m.is_dir() {
            dir_size(&e.path())?
        } else {
            m.len()
        };
    }
    Some(total)
}
