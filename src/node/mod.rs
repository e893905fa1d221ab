//! The running node: listeners, dialers, one connection per peer, reconnects, the control
//! socket server and the event stream.
//!
//! - `conn`: drives one [`crate::session::Session`] over a transport connection (reader
//!   task, writer task, timers, group-committed acks).
//! - `dialer`: per-peer redial with jittered exponential backoff (protocol-notes
//!   §Liveness and close).
//! - `server`: the control socket (see [`crate::control`]); `lists`: its listings.
//! - `presence`: receiving, relaying and publishing presence documents (the rules are in
//!   [`crate::presence`]).
//! - `blobs`: files for `send`, and the `blobs` listing (the rules are in [`crate::blob`]).
//! - `serve`: served requests (exec, fs:read, fs:write) for peers holding a grant, with
//!   `served_fs` (paths confined beneath the root's handle) and `workers` (the bounded
//!   threads served work runs on, and the `--sandbox` Landlock domain).

mod artifacts;
mod blobs;
mod circuits;
mod conn;
mod conn_events;
mod dialer;
mod disconnect;
mod ephemeral;
pub(crate) mod grants;
pub mod handshakes;
mod lists;
mod port;
mod presence;
mod refusals;
pub mod serve;
pub mod served_fs;
mod server;
mod thread_ref;
pub mod workers;

pub use artifacts::http::TOKEN_FILE as ARTIFACTR_TOKEN_FILE;
pub use circuits::ViaStatus;
pub use dialer::{DestLimiter, DialFacts, DialReason, DialTiming, Redial, MAX_DIAL_FAILURES};
pub use disconnect::MAX_BYE_REASON;
pub use grants::MAX_INTRODUCED_PER_INTRODUCER;
pub use presence::PresenceTiming;

use crate::control::Event;
use crate::daemon::{Lock, LockError};
use crate::identity::Identity;
use crate::net::{self, Address, DialOptions, TlsConfig};
use crate::store::Store;
use crate::wire::{self, PeerKey};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// Default TLS port.
pub const DEFAULT_PORT: u16 = 7700;
/// Handshake timeout, from accept (or dial) to auth verified (protocol-notes §Handshake).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// A second connection within this age of the first is a simultaneous open (§Threads).
pub const SIMULTANEOUS_OPEN: Duration = Duration::from_secs(5);
/// Most inbound connections still in their handshake at once (each may buffer up to one
/// line of 1 MiB); more are closed at accept.
pub const MAX_HANDSHAKES: usize = 256;
/// Capability families we announce in hello. Every node lists `presence`, publishing or
/// not, so that it receives and relays presence documents; `blob` (files as blob parts and
/// chunks, protocol-notes §Blobs) except in relay mode; `grant` and `introduce`.
pub const CAPS: &[&str] = &["grant", "introduce", presence::CAP, BLOB_CAP];
/// The capability family of blobs.
pub const BLOB_CAP: &str = "blob";
/// Where received blobs land, inside the home: `blobs/<peer>/<name>`.
pub const BLOBS_DIR: &str = "blobs";
/// Default limit of simultaneous inbound connections (`--max-connections`).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// How a node is started (`awp daemon`, `awp listen`, `awp up`).
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// `$AWP_HOME`.
    pub home: PathBuf,
    /// Addresses to listen on; empty = `tls:0.0.0.0:7700`, or a free port when taken.
    pub listen: Vec<Address>,
    /// Allow plaintext tcp to/from public addresses.
    pub allow_plaintext: bool,
    /// Name in hello (default [`default_name`]: `USER@HOST~KEYPREFIX`).
    pub name: Option<String>,
    /// About text in hello.
    pub about: Option<String>,
    /// Publish our signed presence document (`--presence`). Every node relays others'.
    pub presence: bool,
    /// When our presence document is published (tests shorten the delays).
    pub presence_timing: PresenceTiming,
    /// How the dialer paces redials (tests shorten the delays).
    pub dial_timing: DialTiming,
    /// Relay mode (`awp relay`): refuse to queue msgs and states for peers.
    pub relay: bool,
    /// Simultaneous inbound connections accepted at most; beyond, new sockets are closed
    /// at once. `None`: [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: Option<usize>,
    /// Admission policy from the command line (over `config.toml` and `AWP_ACCEPT`).
    pub accept: Option<crate::config::Accept>,
    /// Largest blob sent or received, in bytes, from the command line (over config.toml
    /// `blob_limit` and `AWP_BLOB_LIMIT`; default [`crate::blob::DEFAULT_LIMIT`], 50 MiB).
    pub blob_limit: Option<u64>,
    /// Requests served to peers holding the capability (`--serve exec,fs:read,fs:write`).
    pub serve: Vec<String>,
    /// The directory served requests are confined to (`--root`); required with `serve`.
    pub root: Option<PathBuf>,
    /// Serve regular files with more than one hard link (`--allow-hardlinks`).
    pub allow_hardlinks: bool,
    /// Confine served work with Landlock to the root plus read-only system paths
    /// (`--sandbox`); the node does not start when the kernel cannot enforce it.
    pub sandbox: bool,
    /// Per-peer outbox quota for served results, in lines, from the command line (over
    /// config.toml `outbox_quota_lines` and `AWP_OUTBOX_QUOTA_LINES`).
    pub outbox_quota_lines: Option<u64>,
    /// Per-peer outbox quota for served results, in bytes, from the command line (over
    /// config.toml `outbox_quota_bytes` and `AWP_OUTBOX_QUOTA_BYTES`).
    pub outbox_quota_bytes: Option<u64>,
    /// The local artifactr.v1 endpoint (`--artifactr IP:PORT`, over config.toml
    /// `artifactr` and `AWP_ARTIFACTR`); off by default.
    pub artifactr: Option<String>,
    /// Allow a non-loopback `artifactr` address (`--artifactr-public`).
    pub artifactr_public: bool,
    /// Threads one peer may open with this node (default
    /// [`crate::store::MAX_THREADS_PER_PEER`]); a line that would open one more is
    /// answered `err busy` and not stored.
    pub max_threads_per_peer: Option<u64>,
    /// Idle time before a connection pings its peer; the peer is dead after two more
    /// unanswered periods. `None`: [`crate::session::PING_IDLE`] (30 s, protocol-notes
    /// §Liveness). Tests shorten it.
    pub ping_idle: Option<Duration>,
    /// Relays to keep a standing connection to (`--via`, pinned `tls:` addresses; over
    /// config.toml `via` and `AWP_VIA`). See spec/relay-circuits.md.
    pub via: Vec<Address>,
    /// Circuit policy (over config.toml `[relay]`): used in relay mode, and by any node
    /// whose policy sets `serve_circuits`.
    pub circuit_policy: Option<net::circuit::Policy>,
    /// Keep sessions on their circuits: no direct upgrade (hole punching) attempts.
    pub no_direct_upgrade: bool,
    /// Do not sign content lines nor announce `signed-lines` (`--no-sign`, for bulk
    /// links; `spec/signed-lines.md`). Signing is on by default.
    pub no_sign: bool,
}

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another process runs a node on this home.
    #[error("a node already runs on {home} (pid {pid})")]
    AlreadyRunning { home: String, pid: u32 },
    /// The home's store was written by a newer build
    /// ([`crate::store::StoreError::NewerFormat`]).
    #[error("store: {0}")]
    NewerStore(String),
    #[error("{0}")]
    Other(String),
}

fn other<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> StartError + '_ {
    move |e| StartError::Other(format!("{what}: {e}"))
}

/// One live, authenticated connection.
pub(crate) struct ConnEntry {
    pub conn_id: u64,
    pub dialed: bool,
    pub since: Instant,
    pub up: bool,
    pub remote: String,
    pub handles: conn::Handles,
    /// The peer's hello caps list `presence`.
    pub presence: bool,
}

/// State shared by all tasks of a node.
pub(crate) struct Inner {
    pub home: PathBuf,
    pub identity: Arc<Identity>,
    pub store: Arc<Store>,
    pub tls: Arc<TlsConfig>,
    pub name: String,
    pub about: Option<String>,
    pub dial_opts: DialOptions,
    pub addresses: Mutex<Vec<Address>>,
    /// What the user should know about how the node started (e.g. it did not get port
    /// 7700): shown by `awp up` and `awp status`.
    pub notices: Mutex<Vec<String>>,
    pub events: broadcast::Sender<Event>,
    /// Subscribers of `events` that skip line and ack content (`conn_events.rs`).
    pub(crate) quiet_events: conn_events::QuietCount,
    pub conns: Mutex<HashMap<PeerKey, ConnEntry>>,
    pub dialers: Mutex<HashMap<PeerKey, Arc<dialer::Wake>>>,
    /// How the dialer paces redials.
    pub dial_timing: DialTiming,
    /// Dials per destination, across all peers' dialers.
    pub dial_limiter: Mutex<DestLimiter>,
    pub shutdown: CancellationToken,
    pub next_conn: AtomicU64,
    pub started: Instant,
    pub tasks: tokio_util::task::TaskTracker,
    /// Slots for inbound handshakes in progress ([`MAX_HANDSHAKES`], a share per source).
    pub handshake_slots: handshakes::HandshakeSlots,
    /// When the last "limit reached" warning was logged (one a minute at most).
    pub refused_warned: Mutex<Option<Instant>>,
    pub presence: presence::PresenceState,
    pub relay: bool,
    pub max_connections: usize,
    pub conn_limit: Arc<tokio::sync::Semaphore>,
    /// Inbound sockets closed because [`Inner::max_connections`] were open.
    pub refused_conns: AtomicU64,
    /// Effective settings (admission, trust, blob limit, …).
    pub settings: crate::config::Settings,
    /// What this node serves (off by default).
    pub serve: serve::ServeConfig,
    /// Largest blob sent or received, in bytes.
    pub blob_limit: u64,
    /// Grants whose signature was checked, by hash (each is verified once).
    pub grant_cache: Mutex<crate::grant::VerifyCache>,
    /// Artifact threads (hosted workspaces and replicas).
    pub artifacts: Arc<artifacts::Artifacts>,
    /// The bound address of the local artifactr.v1 endpoint, when it is on.
    pub artifactr: std::sync::OnceLock<std::net::SocketAddr>,
    /// Idle time before a ping ([`NodeConfig::ping_idle`]).
    pub ping_idle: Duration,
    /// Relay circuits: the relay side (relay mode) and our standing connections.
    pub circuits: circuits::Circuits,
}

/// A started node.
pub struct NodeHandle {
    inner: Arc<Inner>,
    listening: Event,
    _lock: Lock,
}

impl NodeHandle {
    /// Start: take the home lock, open identity and store, bind listeners and the control
    /// socket, start dialing peers with queued lines.
    pub async fn start(config: NodeConfig) -> Result<NodeHandle, StartError> {
        let home = config.home.clone();
        private_dir(&home).map_err(other("home"))?;
        // A lock held by this process (a node of it still letting go) or by a pid that is
        // gone (a killed node's lock not yet released) is waited for, up to 2 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let lock = loop {
            match Lock::acquire(&home) {
                Ok(l) => break l,
                Err(LockError::Held { pid, .. })
                    if std::time::Instant::now() < deadline
                        && pid.is_some_and(|p| {
                            p == std::process::id() || !crate::daemon::pid_alive(p)
                        }) =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(LockError::Held { pid, .. }) => {
                    return Err(StartError::AlreadyRunning {
                        home: home.display().to_string(),
                        pid: pid.unwrap_or(0),
                    })
                }
                Err(e) => return Err(StartError::Other(format!("lock: {e}"))),
            }
        };
        let identity = Arc::new(load_identity(&home)?);
        // The database directory is made 0700 before sled creates its files in it (their
        // own modes follow the umask; the directory keeps them private).
        private_dir(&home.join("db")).map_err(other("store"))?;
        let store = Arc::new(
            Store::open_in(
                &home.join("db"),
                &home.join(crate::store::files::QUARANTINE_DIR),
            )
            .map_err(|e| match e {
                crate::store::StoreError::NewerFormat { .. } => {
                    StartError::NewerStore(e.to_string())
                }
                e => StartError::Other(format!("store: {e}")),
            })?,
        );
        if let Some(n) = config.max_threads_per_peer {
            store.set_max_threads_per_peer(n);
        }
        if !config.no_sign {
            store.set_line_signer(identity.clone());
        }
        let tls = Arc::new(TlsConfig::new(&identity).map_err(other("tls"))?);
        let dial_opts = DialOptions {
            allow_plaintext: config.allow_plaintext,
        };
        // config.toml, then AWP_* variables, then flags.
        let flags = crate::config::Layer {
            accept: config.accept,
            listen: (!config.listen.is_empty())
                .then(|| config.listen.iter().map(|a| a.to_string()).collect()),
            blob_limit: config.blob_limit,
            name: config.name.clone(),
            about: config.about.clone(),
            presence: config.presence.then_some(true),
            outbox_quota_lines: config.outbox_quota_lines,
            outbox_quota_bytes: config.outbox_quota_bytes,
            artifactr: config.artifactr.clone(),
            artifactr_public: config.artifactr_public.then_some(true),
            via: (!config.via.is_empty())
                .then(|| config.via.iter().map(|a| a.to_string()).collect()),
            relay: config.circuit_policy.clone(),
            ..Default::default()
        };
        let settings = crate::config::Settings::load(&home, flags).map_err(other("config"))?;
        let serve = serve_config(&config, &settings)?;
        // A name or about given once is remembered in the home, so a node started later
        // without them (e.g. in the background by another command) keeps them.
        let name = remembered(&store, "name", settings.name.as_deref())?
            .unwrap_or_else(|| default_name(&identity.key()));
        let about = remembered(&store, "about", settings.about.as_deref())?;
        warn_if_open(&home);
        let (events, _) = broadcast::channel(4096);
        let max_connections = config
            .max_connections
            .unwrap_or(DEFAULT_MAX_CONNECTIONS)
            .max(1);
        let presence =
            presence::PresenceState::new(identity.key(), settings.presence, config.presence_timing);
        let circuits = circuits::Circuits::new(
            config.relay || settings.relay.serve_circuits,
            !config.no_direct_upgrade,
            &tls,
            settings.relay.clone(),
        )
        .map_err(other("relay policy"))?;
        let inner = Arc::new(Inner {
            home: home.clone(),
            identity,
            store,
            tls,
            name,
            about,
            dial_opts,
            addresses: Mutex::new(Vec::new()),
            notices: Mutex::new(Vec::new()),
            events,
            quiet_events: Default::default(),
            conns: Mutex::new(HashMap::new()),
            dialers: Mutex::new(HashMap::new()),
            dial_timing: config.dial_timing,
            dial_limiter: Mutex::new(DestLimiter::new(
                config.dial_timing.per_destination,
                config.dial_timing.destination_window,
            )),
            shutdown: CancellationToken::new(),
            next_conn: AtomicU64::new(1),
            started: Instant::now(),
            tasks: tokio_util::task::TaskTracker::new(),
            handshake_slots: handshakes::HandshakeSlots::new(
                MAX_HANDSHAKES,
                handshakes::PER_SOURCE_SHARE,
            ),
            refused_warned: Mutex::new(None),
            presence,
            relay: config.relay,
            max_connections,
            conn_limit: Arc::new(tokio::sync::Semaphore::new(max_connections)),
            refused_conns: AtomicU64::new(0),
            blob_limit: settings.blob_limit,
            settings: settings.clone(),
            serve,
            grant_cache: Mutex::new(crate::grant::VerifyCache::default()),
            artifacts: artifacts::Artifacts::new(),
            artifactr: std::sync::OnceLock::new(),
            ping_idle: config.ping_idle.unwrap_or(crate::session::PING_IDLE),
            circuits,
        });
        inner.artifacts.install(&inner);
        // Finish moving blobs that a crash left between "complete" and their final path.
        let recovery = crate::blob::BlobReceiver::new(
            inner.store.clone(),
            home.join(BLOBS_DIR),
            inner.blob_limit,
        );
        match recovery.recover() {
            Ok(0) => {}
            Ok(n) => tracing::info!("moved {n} received blob(s) to their final paths"),
            Err(e) => tracing::warn!("blob recovery: {e}"),
        }

        // Listeners (a port the node picks is kept across restarts: `port`).
        let mut listeners = Vec::new();
        let mut notices = Vec::new();
        let default = port::default_listen();
        let specs: Vec<Option<&Address>> = if settings.listen.is_empty() {
            vec![None]
        } else {
            settings.listen.iter().map(Some).collect()
        };
        for (i, spec) in specs.into_iter().enumerate() {
            let b = port::bind(
                &inner.store,
                i,
                spec,
                &default,
                &inner.tls,
                &inner.dial_opts,
            )
            .await?;
            if let Some(n) = b.notice {
                tracing::warn!("{n}");
                notices.push(n);
            }
            listeners.push(b.listener);
        }
        *inner.notices.lock().unwrap_or_else(|p| p.into_inner()) = notices.clone();
        let key = inner.identity.key();
        let mut addrs = Vec::new();
        for l in &listeners {
            addrs.extend(net::dialable_addresses(&l.local_address(), &key));
        }
        addrs.extend(circuits::addresses(&inner));
        *inner.addresses.lock().unwrap_or_else(|p| p.into_inner()) = addrs.clone();
        for l in listeners {
            let inner2 = inner.clone();
            inner.tasks.spawn(accept_loop(inner2, l));
        }

        // Control socket.
        let sock = crate::daemon::prepare_socket_path(&home)
            .map_err(|e| StartError::Other(format!("control socket: {e}")))?;
        let control = server::bind(&sock)
            .map_err(|e| StartError::Other(format!("control socket {}: {e}", sock.display())))?;
        inner
            .tasks
            .spawn(server::serve(inner.clone(), control, sock));

        // The local artifactr.v1 endpoint (off by default).
        let artifactr = match settings.artifactr {
            Some(addr) => Some(
                artifacts::http::start(inner.clone(), addr)
                    .await
                    .map_err(|e| StartError::Other(format!("artifactr endpoint {addr}: {e}")))?,
            ),
            None => None,
        };

        // Housekeeping: retention, and redial peers with queued lines or open threads.
        inner.tasks.spawn(housekeeping(inner.clone()));
        inner.tasks.spawn(presence::run(inner.clone()));
        circuits::start(&inner);
        for peer in dialer::wanted_peers(&inner) {
            dialer::ensure(&inner, peer);
        }

        let addr_strings: Vec<Value> = addrs.iter().map(|a| json!(a.to_string())).collect();
        let listening = json!({
            "event": "listening",
            "address": addr_strings.first().cloned().unwrap_or(Value::Null),
            "addresses": addr_strings,
            "key": key.to_string(),
            "name": inner.name,
            "fingerprint": key.fingerprint(),
            "pid": std::process::id(),
        });
        let mut listening = listening;
        if !notices.is_empty() {
            listening["notices"] = json!(notices);
        }
        if let Some(a) = artifactr {
            listening["artifactr"] = json!(a.to_string());
        }
        let listening = match listening {
            Value::Object(m) => m,
            _ => Event::new(),
        };
        tracing::info!(key = %key, name = %inner.name, "node started");
        Ok(NodeHandle {
            inner,
            listening,
            _lock: lock,
        })
    }

    /// The `{"event":"listening",…}` event (address, addresses, key, name).
    pub fn listening_event(&self) -> Event {
        self.listening.clone()
    }

    /// Live events (see [`crate::control::Event`]).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// Resolves when the node has stopped (shutdown request, `awp down`, or a signal) and its
    /// connections have closed (bounded: 3 s).
    pub async fn stopped(&self) {
        self.inner.shutdown.cancelled().await;
        self.inner.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(3), self.inner.tasks.wait()).await;
        let _ = self.inner.store.flush().await;
    }

    /// Ask the node to stop.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Our key.
    pub fn key(&self) -> PeerKey {
        self.inner.identity.key()
    }

    /// The node's store (tests inject faults into it with [`Store::set_faults`]).
    pub fn store(&self) -> &Arc<Store> {
        &self.inner.store
    }

    /// Answer one control request line (without its `\n`) in-process, as the control
    /// socket would: `Some` response (`bad_request` when it does not parse or is, with its
    /// `\n`, over [`crate::control::MAX_CONTROL_LINE`] bytes); `None` for `subscribe` and `shutdown`,
    /// which only the socket serves. For the fuzzing harness `control_lines`, which would
    /// otherwise pay a socket round trip per line; not an interface.
    #[doc(hidden)]
    pub async fn control_line(&self, line: &[u8]) -> Option<crate::control::Response> {
        server::answer_line(&self.inner, line).await
    }
}

/// Check `--serve` / `--root` / `--sandbox`, open the root.
fn serve_config(
    config: &NodeConfig,
    settings: &crate::config::Settings,
) -> Result<serve::ServeConfig, StartError> {
    let mut caps = Vec::new();
    for c in &config.serve {
        match serve::Served::from_cap(c) {
            Some(s) => caps.push(s),
            None => {
                return Err(StartError::Other(format!(
                    "--serve {c:?}: use exec, fs:read, fs:write"
                )))
            }
        }
    }
    let root = match (&config.root, caps.is_empty()) {
        (_, true) => None,
        (None, false) => return Err(StartError::Other("--serve needs --root DIR".into())),
        (Some(r), false) => Some(
            served_fs::Root::open(r, config.allow_hardlinks)
                .map_err(|e| StartError::Other(format!("--root {}: {e}", r.display())))?,
        ),
    };
    if let Some(r) = &root {
        let home = config.home.canonicalize().unwrap_or(config.home.clone());
        if home.starts_with(&r.path) {
            tracing::warn!(
                "--root {} contains the home {}: served requests can reach the node's key",
                r.path.display(),
                home.display()
            );
        }
    }
    let sandbox = match (&root, config.sandbox) {
        (Some(r), true) => {
            let s = workers::Sandbox::new(&r.path);
            s.probe()
                .map_err(|e| StartError::Other(format!("--sandbox: {e}")))?;
            Some(s)
        }
        _ => None,
    };
    let quota = serve::OutboxQuota {
        lines: settings.outbox_quota_lines,
        bytes: settings.outbox_quota_bytes,
    };
    Ok(serve::ServeConfig::new(caps, root, sandbox, quota))
}

/// Create `dir` (and missing parents) with mode 0700, whatever the umask; an existing
/// directory is left as it is.
pub(crate) fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// `given` (saved in the store's meta under `key`) or the value saved before.
fn remembered(store: &Store, key: &str, given: Option<&str>) -> Result<Option<String>, StartError> {
    let meta_key = format!("node/{key}");
    match given {
        Some(v) => {
            store
                .meta_put(&meta_key, v.as_bytes())
                .map_err(other("store"))?;
            store.flush_blocking().map_err(other("store"))?;
            Ok(Some(v.to_string()))
        }
        None => Ok(store
            .meta_get(&meta_key)
            .map_err(other("store"))?
            .and_then(|b| String::from_utf8(b).ok())),
    }
}

/// The node's identity: `identity.json`, created on the first start. Refuses (never makes
/// a new key silently) when the file is damaged, or missing from a home that already has a
/// database (the identity is written, fsynced and renamed into place before the database
/// is created, so no crash leaves that state). The message names the fix.
fn load_identity(home: &std::path::Path) -> Result<Identity, StartError> {
    use crate::identity::{IdentityError, IDENTITY_FILE};
    let path = home.join(IDENTITY_FILE);
    let db = home.join("db");
    if !path.exists() && db.exists() {
        return Err(StartError::Other(format!(
            "identity: {} is missing but the home has a database made with it; restore \
             identity.json from a backup, or start afresh with a new key (peers will not \
             know it) by moving the database away: mv {} {}.old",
            path.display(),
            db.display(),
            db.display()
        )));
    }
    Identity::load_or_create(home).map_err(|e| match e {
        IdentityError::Malformed { .. } | IdentityError::Mismatch { .. } => {
            StartError::Other(format!(
                "identity: {e}; the key cannot be rebuilt from a damaged file: restore \
                 identity.json from a backup, or move it away to start with a new key (peers \
                 will not know it): mv {} {}.damaged",
                path.display(),
                path.display()
            ))
        }
        e => StartError::Other(format!("identity: {e}")),
    })
}

/// Log a warning when the home or the identity file can be read by other users.
fn warn_if_open(home: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    for (path, what) in [
        (home.to_path_buf(), "home directory"),
        (home.join(crate::identity::IDENTITY_FILE), "identity file"),
    ] {
        if let Ok(meta) = std::fs::metadata(&path) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(
                    "{what} {} has mode {mode:o}: other users can read it (chmod go-rwx)",
                    path.display()
                );
            }
        }
    }
}

/// Characters of the key in a default name.
pub const DEFAULT_NAME_KEY_CHARS: usize = 6;

/// The name of a node given none (usability #12): `USER@HOST~KEYPREFIX`, e.g.
/// `alice@laptop~A6EHv_`. The key prefix ([`DEFAULT_NAME_KEY_CHARS`] characters of the
/// base64 key) keeps two homes on one host (same user, same host) apart; USER is `$USER`
/// (else `$LOGNAME`, else `awp`), HOST the kernel host name (else `$HOSTNAME`, else
/// `localhost`).
pub fn default_name(key: &PeerKey) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let user = ["USER", "LOGNAME"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|u| u.trim().to_string())
        .find(|u| !u.is_empty() && !u.contains(['@', '~']) && !u.chars().any(char::is_control))
        .unwrap_or_else(|| "awp".into());
    let k = key.to_string();
    let b64 = &k[wire::key::PREFIX.len()..];
    format!("{user}@{host}~{}", &b64[..DEFAULT_NAME_KEY_CHARS])
}

async fn accept_loop(inner: Arc<Inner>, listener: net::Listener) {
    loop {
        let incoming = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            r = listener.accept() => r,
        };
        match incoming {
            Ok(inc) => {
                let slot = inner.handshake_slots.try_acquire(inc.source());
                let (Ok(permit), Ok(hs_slot)) =
                    (inner.conn_limit.clone().try_acquire_owned(), slot)
                else {
                    let n = inner.refused_conns.fetch_add(1, Ordering::Relaxed) + 1;
                    // A flood would log a line per socket: one warning a minute.
                    let mut last = inner
                        .refused_warned
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        *last = Some(Instant::now());
                        tracing::warn!(
                            remote = %inc.remote(),
                            limit = inner.max_connections,
                            handshakes = MAX_HANDSHAKES,
                            per_source = handshakes::PER_SOURCE_SHARE,
                            refused = n,
                            "connection, handshake or per-source handshake limit reached: \
                             closing new sockets (logged once a minute)"
                        );
                    } else {
                        tracing::debug!(remote = %inc.remote(), refused = n, "limit reached: closing the new socket");
                    }
                    drop(inc);
                    continue;
                };
                let inner2 = inner.clone();
                // Each phase (transport handshake, circuit, session) is boxed: the task
                // then holds only the phase it is in, not the largest of the three for
                // its whole life (issue 10: an idle connection's memory).
                inner.tasks.spawn(async move {
                    let _permit = permit;
                    let hs_slot = Arc::new(hs_slot);
                    let remote = inc.remote();
                    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
                    // A socket that sends nothing frees its slot after a short while.
                    if let Err(e) = inc.first_byte().await {
                        tracing::debug!(%remote, "inbound socket: {e}");
                        return;
                    }
                    let routed =
                        tokio::time::timeout_at(deadline, Box::pin(circuits::accept(&inner2, inc)));
                    let conn = match routed.await {
                        Ok(Ok(net::circuit::Routed::Awp(c))) => c,
                        Ok(Ok(net::circuit::Routed::Circuit(io, key, remote))) => {
                            drop(hs_slot);
                            Box::pin(circuits::serve(&inner2, io, key, remote)).await;
                            return;
                        }
                        Ok(Err(e)) => {
                            tracing::info!(%remote, "inbound transport handshake failed: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::info!(%remote, "inbound handshake timed out");
                            return;
                        }
                    };
                    let dial = conn::Dial::Inbound(Some(hs_slot));
                    Box::pin(conn::run(inner2, conn, dial, deadline)).await;
                });
            }
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Retention sweep every hour, the first an hour after start (a sweep scans the outbox
/// and the log; it runs on the blocking pool so connections keep going), and the expiry of
/// unfinished inbound blobs ([`crate::blob::expire`]).
async fn housekeeping(inner: Arc<Inner>) {
    let period = Duration::from_secs(3600);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = tick.tick() => {
                let store = inner.store.clone();
                let r = tokio::task::spawn_blocking(move || store.prune(wire::time::now_ms())).await;
                match r {
                    Ok(Ok(n)) if n > 0 => tracing::info!("retention: dropped {n} entries older than 7 days"),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("retention: {e}"),
                    Err(e) => tracing::warn!("retention task: {e}"),
                }
                blobs::expire_unfinished(&inner).await;
            }
        }
    }
}

impl Inner {
    /// Emit an event to subscribers (dropped when nobody listens).
    pub fn emit(&self, ev: Value) {
        if let Value::Object(m) = ev {
            let _ = self.events.send(m);
        }
    }

    /// A peer's name as shown in listings, replies and events, if known: the name the
    /// peer chose, cut to [`crate::control::MAX_SHOWN_CHARS`] characters.
    pub fn peer_name(&self, key: &PeerKey) -> Option<String> {
        self.store
            .peer(key)
            .ok()
            .flatten()
            .and_then(|p| p.name)
            .map(|n| crate::control::shown(&n))
    }

    /// Whether `key` has a live authenticated connection.
    pub fn connected(&self, key: &PeerKey) -> bool {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }

    /// Tell the connection to `key` (if any) that its outbox changed, or wake its dialer.
    pub fn outbox_changed(self: &Arc<Self>, key: &PeerKey) {
        let notify = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .map(|c| c.handles.clone());
        match notify {
            Some(h) => h.outbox.notify_one(),
            None => dialer::ensure(self, *key),
        }
    }

    /// Send a line that is not queued in the outbox (presence, grant: lines that are not
    /// acked and are re-sent on every connection) to `peer` if it is connected now, after
    /// the lines already waiting. Returns false when not connected or its queue is full.
    pub fn send_ephemeral(&self, peer: &PeerKey, line: &wire::Line) -> bool {
        let tx = self
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(peer)
            .map(|c| c.handles.clone());
        tx.is_some_and(|h| h.ephemeral.try_send(line.encode()))
    }

    /// A fresh connection id.
    pub fn conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Our dialable addresses.
    pub fn addresses(&self) -> Vec<Address> {
        self.addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod default_name_tests {
    use super::*;

    /// Usability #12: two homes on one host no longer share `awp@HOST`.
    #[test]
    fn default_names_differ_per_key_and_end_with_a_key_prefix() {
        let a = Identity::generate().key();
        let b = Identity::generate().key();
        let (na, nb) = (default_name(&a), default_name(&b));
        assert_ne!(na, nb);
        assert!(
            !na.starts_with("awp@") || std::env::var("USER").is_err(),
            "{na}"
        );
        let (_, tail) = na.rsplit_once('~').unwrap();
        assert_eq!(
            tail,
            &a.to_string()["ed25519:".len()..][..DEFAULT_NAME_KEY_CHARS]
        );
        assert!(na.contains('@'), "{na}");
    }
}
