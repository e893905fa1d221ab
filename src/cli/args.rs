//! The `awp` command line grammar (clap derive).

use crate::daemon::StartArgs;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

const AFTER_HELP: &str = "\
Exit codes:
  0  success
  1  the operation failed (peer refused, connect failed, node error)
  2  usage error, bad input, or `awp wait` timed out
  3  no node running (start one with `awp up`)
With --json, a failure is also one JSON object on stdout: {\"error\":{\"code\",
\"message\", \"hint\"}} (see the README).

Peers are named by full key, by name, or by a unique key prefix of at least 4 characters.
A peer argument that starts with `-` is accepted as is; when it consists only of option
letters (e.g. `-ts`), put it after `--`.

Only `awp up` starts a node; other commands that need one exit 3 when none runs.
Environment: AWP_HOME (default ~/.awp), RUST_LOG (log filter, default info for the node and the relay).";

/// `awp`: a peer-to-peer node for the Agent Wire Protocol.
#[derive(Debug, Parser)]
#[command(name = "awp", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    /// The node's home directory (identity, store, control socket).
    #[arg(long, global = true, env = "AWP_HOME", value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Machine output: one JSON object per result line.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Options of a node started by `up`, `listen` or `daemon`.
#[derive(Debug, Clone, Default, Args, PartialEq, Eq)]
pub struct NodeArgs {
    /// Address to listen on (repeatable): tls:HOST:PORT, tcp:HOST:PORT, unix:/path.
    /// Default tls:0.0.0.0:7700 (or a free port when taken).
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Name announced to peers (default USER@HOST~KEYPREFIX, e.g. alice@laptop~A6EHv_).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// About text announced to peers.
    #[arg(long, value_name = "TEXT")]
    pub about: Option<String>,
    /// Allow plaintext tcp to and from public addresses.
    #[arg(long)]
    pub allow_plaintext: bool,
    /// Publish this node's signed presence document to its peers (every node relays
    /// others' documents either way).
    #[arg(long)]
    pub presence: bool,
    /// Who may connect: `any` (default) or `allowlist` (allowed, trusted, dialed by us, or
    /// holding an honored grant). Overrides config.toml and AWP_ACCEPT.
    #[arg(long, value_name = "POLICY", value_parser = ["any", "allowlist"])]
    pub accept: Option<String>,
    /// Serve requests to peers holding the capability (comma separated: exec, fs:read,
    /// fs:write). Off by default; needs --root.
    #[arg(long, value_name = "CAPS", value_delimiter = ',')]
    pub serve: Vec<String>,
    /// The directory served requests are confined to.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Serve regular files with more than one hard link (refused by default: a hard link
    /// inside the root may name a file outside it).
    #[arg(long)]
    pub allow_hardlinks: bool,
    /// Confine served requests (exec and fs) with Landlock to --root plus read-only system
    /// paths; the node does not start when the kernel cannot enforce it.
    #[arg(long)]
    pub sandbox: bool,
    /// Per-peer outbox quota for served results, bytes (e.g. 128M; default 128 MiB).
    /// Overrides config.toml and AWP_OUTBOX_QUOTA_BYTES.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub outbox_quota_bytes: Option<u64>,
    /// Per-peer outbox quota for served results, lines (default 10000). Overrides
    /// config.toml and AWP_OUTBOX_QUOTA_LINES.
    #[arg(long, value_name = "N")]
    pub outbox_quota_lines: Option<u64>,
    /// Serve the local artifactr.v1 HTTP/WebSocket endpoint on IP:PORT (off by default;
    /// loopback only unless --artifactr-public; bearer token in $AWP_HOME/artifactr.token).
    #[arg(long, value_name = "ADDR")]
    pub artifactr: Option<String>,
    /// Allow a non-loopback --artifactr address.
    #[arg(long)]
    pub artifactr_public: bool,
    /// Keep a standing connection to this relay (repeatable; tls:HOST:PORT#ed25519:KEY) so
    /// that peers reach this node through a circuit even behind NAT (spec/relay-circuits.md).
    /// Overrides config.toml `via` and AWP_VIA.
    #[arg(long = "via", value_name = "RELAY")]
    pub via: Vec<String>,
    /// Do not sign content lines (msg, state, grant, introduce) nor announce signed-lines
    /// (for bulk links; signing is on by default, spec/signed-lines.md).
    #[arg(long)]
    pub no_sign: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    crate::blob::parse_limit(s).ok_or_else(|| format!("{s:?} is not a size (e.g. 134217728, 128M)"))
}

impl From<&NodeArgs> for StartArgs {
    fn from(a: &NodeArgs) -> StartArgs {
        StartArgs {
            listen: a.listen.clone(),
            name: a.name.clone(),
            about: a.about.clone(),
            allow_plaintext: a.allow_plaintext,
            presence: a.presence,
            accept: a.accept.clone(),
            serve: a.serve.clone(),
            root: a
                .root
                .as_ref()
                .map(|r| std::path::absolute(r).unwrap_or_else(|_| r.clone())),
            allow_hardlinks: a.allow_hardlinks,
            sandbox: a.sandbox,
            outbox_quota_bytes: a.outbox_quota_bytes,
            outbox_quota_lines: a.outbox_quota_lines,
            artifactr: a.artifactr.clone(),
            artifactr_public: a.artifactr_public,
            via: a.via.clone(),
            no_sign: a.no_sign,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Make sure the node runs in the background; print its key and addresses.
    Up(NodeArgs),
    /// Run a node in the foreground and print its events as NDJSON.
    Listen {
        #[command(flatten)]
        node: NodeArgs,
        /// Human-readable lines instead of JSON.
        #[arg(long)]
        text: bool,
    },
    /// Run a node in the foreground without event output (logs to stderr).
    Daemon(NodeArgs),
    /// Stop the node.
    Down,
    /// Dial a peer now and wait for the handshake.
    Connect {
        /// tls:HOST:PORT[#ed25519:KEY], tcp:HOST:PORT, unix:/path, or a known peer (its
        /// key, a key prefix of 4+ characters, or its name).
        #[arg(value_name = "ADDRESS|PEER", allow_hyphen_values = true)]
        address: String,
        /// How long to wait for the handshake (e.g. 10s).
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Say bye to one peer: close its connection with a `bye` and park it (not redialed
    /// until the next `awp connect` to it or a line sent to it).
    Disconnect {
        /// Its key, a key prefix (4+ characters) or its name.
        #[arg(allow_hyphen_values = true)]
        peer: String,
        /// The reason sent in the bye.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Print the addresses other hosts can dial.
    Address,
    /// Send a message: `awp send PEER TEXT`, or `awp send -t THREAD TEXT`. TEXT `-` reads stdin.
    Send(SendArgs),
    /// Set our state of a thread: `awp state [PEER] THREAD STATE`.
    State(StateArgs),
    /// Show the message log, then follow new lines.
    Tail {
        /// Print what is there and exit.
        #[arg(long)]
        once: bool,
        /// Only this thread.
        #[arg(short = 't', long = "thread", value_name = "THREAD")]
        thread: Option<String>,
        /// Only this peer.
        #[arg(
            short = 'p',
            long = "peer",
            value_name = "PEER",
            allow_hyphen_values = true
        )]
        peer: Option<String>,
    },
    /// Print unread inbound lines, oldest first, and mark them read. At most --limit
    /// lines; when more are unread, the last output line says so (`--json`:
    /// `{"more":true,"next":CURSOR}`), and `--after CURSOR` continues.
    Read {
        /// Only this thread.
        #[arg(allow_hyphen_values = true)]
        thread: Option<String>,
        /// Leave them unread.
        #[arg(long)]
        no_mark: bool,
        /// At most this many lines (default 1000).
        #[arg(long, value_name = "N", default_value_t = READ_LIMIT, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "all")]
        limit: u64,
        /// Every unread line, however many.
        #[arg(long)]
        all: bool,
        /// Only lines after this cursor (the `next` of an earlier `read`, or a line's
        /// `seq`).
        #[arg(long, value_name = "CURSOR")]
        after: Option<u64>,
    },
    /// Wait for an inbound line (exit 0), or time out (exit 2). An unread matching line
    /// that already arrived counts. The line that ends the wait is printed and marked
    /// read (unless --no-mark), so a following `awp read` does not print it again. A
    /// peer's refusal (an `err` about one of our lines) ends it too, with exit 1.
    Wait {
        /// Leave the line that ends the wait unread.
        #[arg(long)]
        no_mark: bool,
        /// Only this thread.
        #[arg(short = 't', long = "thread", value_name = "THREAD")]
        thread: Option<String>,
        /// Only state lines with one of these states (comma separated).
        #[arg(long, value_name = "STATES", value_delimiter = ',')]
        state: Vec<String>,
        /// Give up after this long (e.g. 30s, 5m).
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// List threads.
    Threads,
    /// List known peers; `awp peers forget PEER` removes one and what is stored about it.
    Peers {
        #[command(subcommand)]
        action: Option<PeersAction>,
    },
    /// Node status (exit 3 when no node runs; does not start one).
    Status,
    /// List blobs sent and received: direction, status, size, SHA-256, path.
    Blobs {
        /// Only blobs exchanged with this peer.
        #[arg(
            short = 'p',
            long = "peer",
            value_name = "PEER",
            allow_hyphen_values = true
        )]
        peer: Option<String>,
    },
    /// Print this node's key, name and fingerprint (no running node needed).
    Whoami,
    /// Write a thread's lines as a signed transcript (header naming both keys, then one
    /// line per record) to stdout: `awp export THREAD > transcript`.
    Export {
        /// The thread.
        thread: String,
        /// `ndjson` (default) or `json`.
        #[arg(long, value_name = "FORMAT", default_value = "ndjson", value_parser = ["ndjson", "json"])]
        format: String,
        /// Also write the thread's blobs into DIR, each as a file named by its SHA-256
        /// (lowercase hex), and list them in the header.
        #[arg(long, value_name = "DIR")]
        with_blobs: Option<PathBuf>,
    },
    /// Check a transcript offline (no node needed): every signature, the thread, ids
    /// increasing per author, re links. One line per problem; exit 1 when any.
    Verify {
        /// The transcript file.
        file: PathBuf,
        /// Check the blob files listed in the header too: DIR as given to
        /// `awp export --with-blobs`.
        #[arg(long, value_name = "DIR")]
        blobs: Option<PathBuf>,
    },
    /// List agents known from presence documents, or show one document in full.
    Presence {
        /// An agent: its key, a key prefix (4+ characters) or its name.
        #[arg(allow_hyphen_values = true)]
        peer: Option<String>,
    },
    /// Run a relay in the foreground (many inbound connections, forwards presence, queues
    /// nothing for peers); `awp relay status` shows its counters.
    Relay(RelayArgs),
    /// Grant PEER capabilities (e.g. exec fs:read): signed by this node, sent when connected.
    Grant {
        /// The subject: a key, a key prefix (4+ characters) or a name.
        #[arg(allow_hyphen_values = true)]
        peer: String,
        /// Capabilities: exec, fs:read, fs:write, introduce, artifact:write,
        /// artifact:resolve, artifact:admin (artifact caps also as CAP@thr_… for one
        /// thread). Any other name needs --custom or the `custom:` prefix.
        #[arg(required = true, num_args = 1..)]
        caps: Vec<String>,
        /// Allow capability names this version does not know (signed as given).
        #[arg(long)]
        custom: bool,
        /// Validity (e.g. 1h, 7d).
        #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "1h")]
        ttl: Duration,
        /// Only honored by this node (its key, prefix or name).
        #[arg(long, value_name = "PEER", allow_hyphen_values = true)]
        aud: Option<String>,
    },
    /// List grants: issued by us, held by us, presented to us, with validity.
    Grants,
    /// Artifact threads: shared documents with versions, edits and proposals (artifactr.v1
    /// over AWP threads; the node that opens the thread hosts it).
    #[command(subcommand)]
    Artifact(super::artifacts::ArtifactCmd),
    /// Serve the node's verbs as MCP tools on stdin/stdout (for agent harnesses; needs a
    /// running node, see the README's MCP section).
    Mcp(crate::mcp::McpArgs),
    /// Revoke a grant by its hash (never honored here again).
    Revoke {
        /// The grant's hash (32 hex characters, from `awp grants`) or a unique prefix of
        /// at least 4.
        hash: String,
    },
    /// Introduce PEER to TO: TO learns PEER's key, name and address, and gets a grant for
    /// CAPs that PEER honors if it trusts us to introduce.
    Introduce {
        /// Who receives the introduction.
        #[arg(allow_hyphen_values = true)]
        to: String,
        /// Who is introduced.
        #[arg(allow_hyphen_values = true)]
        peer: String,
        /// Capabilities for TO at PEER (optional; checked as for `awp grant`).
        caps: Vec<String>,
        /// Allow capability names this version does not know.
        #[arg(long)]
        custom: bool,
        /// Validity of the grant (e.g. 1h).
        #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "1h")]
        ttl: Duration,
        /// In this thread (default: a new one).
        #[arg(short = 't', long = "thread", value_name = "THREAD")]
        thread: Option<String>,
    },
    /// Be a Roll Runtime Protocol v1 runtime on stdio (JSON-RPC 2.0, NDJSON) whose agent
    /// is PEER: Roll threads are AWP threads with PEER (spec/roll-front.md).
    Roll {
        /// The peer whose agent the Roll client drives.
        #[arg(long, value_name = "PEER", allow_hyphen_values = true)]
        peer: String,
    },
    /// Print the JSON Schema of AWP v0 lines.
    Schema,
    /// Check an AWP peer against the v0 conformance scenarios.
    Conform(crate::conform::ConformArgs),
    /// Print the version.
    Version,
    /// Check the home without opening the database (works while the node is stopped or
    /// running): store files, identity, config, file modes. Says what is wrong and the
    /// command that fixes it.
    #[command(after_help = crate::cli::doctor::AFTER_HELP)]
    Doctor {
        /// Apply the safe fixes: move store files the database would misread to
        /// $AWP_HOME/quarantine/ (only while no node runs), chmod to 0700/0600, remove
        /// leftover temporary files. Never touches identity.json or config.toml.
        #[arg(long)]
        fix: bool,
    },
    /// Print a shell completion script, e.g. `awp completions bash >
    /// ~/.local/share/bash-completion/completions/awp`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout, e.g. `awp man | man -l -`.
    Man,
    /// Serve a local ACP agent to peers: `awp serve-agent --acp -- CMD ARGS…` (each thread
    /// from a peer is one ACP session of the agent).
    ServeAgent(crate::acp::cli::ServeAgentArgs),
    /// Be an ACP agent on stdio for an editor: prompts go to PEER's served agent.
    Acp(crate::acp::cli::AcpArgs),
}

/// Default `awp read --limit`.
pub const READ_LIMIT: u64 = 1000;

/// `awp relay`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RelayArgs {
    /// `status`: the running relay's counters instead of running one.
    #[command(subcommand)]
    pub action: Option<RelayAction>,
    #[command(flatten)]
    pub node: NodeArgs,
    /// Simultaneous inbound connections at most; beyond, new sockets are closed.
    #[arg(long, value_name = "N", default_value_t = crate::node::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
}

/// `awp peers` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum PeersAction {
    /// Forget a peer: its record, addresses, threads, log entries, queued lines and seen
    /// entries (not while it is connected). The dedup index, blobs, artifact threads and
    /// grants stay (the output says which, and why).
    Forget {
        /// Its key, a key prefix (4+ characters) or its name.
        #[arg(allow_hyphen_values = true)]
        peer: String,
    },
}

/// `awp relay` subcommands.
#[derive(Debug, Subcommand)]
pub enum RelayAction {
    /// Connected nodes (sessions, and nodes standing by for circuits), documents held,
    /// forwarded and dropped counts.
    Status,
}

/// `awp send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// PEER then TEXT; with one value and -t, the TEXT; with one value and no -t, the
    /// PEER (the content then comes from --code, --data or -f).
    #[arg(
        value_name = "PEER|TEXT",
        allow_hyphen_values = true,
        required_unless_present = "files"
    )]
    pub first: Option<String>,
    /// TEXT, when PEER was given first.
    #[arg(value_name = "TEXT", allow_hyphen_values = true)]
    pub second: Option<String>,
    /// Thread to send in (default: a new thread).
    #[arg(short = 't', long = "thread", value_name = "THREAD")]
    pub thread: Option<String>,
    /// Subject of a new thread.
    #[arg(short = 's', long, value_name = "SUBJECT")]
    pub subject: Option<String>,
    /// Id of the line this one answers.
    #[arg(long = "re", value_name = "ID")]
    pub re: Option<String>,
    /// Add a code part with this file's contents.
    #[arg(long, value_name = "FILE")]
    pub code: Option<PathBuf>,
    /// Language of the code part (default: from the file extension).
    #[arg(long, value_name = "LANG", requires = "code")]
    pub lang: Option<String>,
    /// Add a data part with this JSON value.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    pub data: Option<serde_json::Value>,
    /// Media type of the data part.
    #[arg(long, value_name = "MIME", requires = "data")]
    pub mime: Option<String>,
    /// Wait this long for the peer's ack (e.g. 5s).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub wait_ack: Option<Duration>,
    /// Send this file as a blob (repeatable). Its chunks go out before the msg; a progress
    /// bar shows files over 1 MiB on a terminal. Limit: the node's blob limit (50 MiB by
    /// default, `AWP_BLOB_LIMIT` when the node starts).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

impl SendArgs {
    /// (peer, text) from the positionals: two values are PEER TEXT; one is TEXT with `-t`
    /// (the thread names the peer), else PEER with an empty text (`awp send bob -f x`,
    /// `awp send bob` then says the text is missing); none is an empty text.
    pub fn peer_and_text(&self) -> (Option<&str>, &str) {
        match (&self.first, &self.second) {
            (Some(peer), Some(text)) => (Some(peer.as_str()), text.as_str()),
            (Some(one), None) if self.thread.is_none() => (Some(one.as_str()), ""),
            (Some(text), None) => (None, text.as_str()),
            (None, _) => (None, ""),
        }
    }
}

/// `awp state`.
#[derive(Debug, Args)]
pub struct StateArgs {
    /// PEER then THREAD, or THREAD.
    #[arg(value_name = "PEER|THREAD", allow_hyphen_values = true)]
    pub first: String,
    /// THREAD after PEER, or STATE.
    #[arg(value_name = "THREAD|STATE")]
    pub second: String,
    /// STATE, when PEER was given first.
    #[arg(value_name = "STATE")]
    pub third: Option<String>,
    /// A note on the state.
    #[arg(short = 'n', long, value_name = "NOTE")]
    pub note: Option<String>,
    /// Wait this long for the peer's ack (e.g. 5s).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub wait_ack: Option<Duration>,
}

impl StateArgs {
    /// (peer, thread, state) from the positionals: three values are PEER THREAD STATE,
    /// two are THREAD STATE.
    pub fn split(&self) -> (Option<&str>, &str, &str) {
        match &self.third {
            Some(state) => (
                Some(self.first.as_str()),
                self.second.as_str(),
                state.as_str(),
            ),
            None => (None, self.first.as_str(), self.second.as_str()),
        }
    }
}

/// A duration like `5s`, `500ms`, `2m`, `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{e} (use e.g. 500ms, 5s, 2m)"))
}

/// A JSON value (for `--data`), by the wire's rules: no duplicate keys, integers within
/// ±(2^53−1), bounded nesting ([`crate::wire::parse::parse_json_value`]).
pub fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    crate::wire::parse::parse_json_value(s).map_err(|e| format!("not valid JSON for the wire: {e}"))
}
