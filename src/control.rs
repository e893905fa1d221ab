//! The local control protocol between the `awp` CLI and its node: NDJSON over the unix
//! socket `$AWP_HOME/awp.sock` (mode 0600 from its creation, see
//! [`crate::daemon::bind_control_socket`]; a short private runtime path recorded in the
//! home when that path is too long for a unix socket). Only processes of the node's own
//! user are served ([`check_peer_uid`]).
//!
//! One request per line; one response line per request, except `subscribe`, which answers
//! `{"ok":true}` and then streams [`Event`] lines until the client closes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Largest control line accepted by the node, in bytes (a msg line plus framing).
pub const MAX_CONTROL_LINE: usize = 8 * 1024 * 1024;

/// A CLI → node request. `peer` arguments are a full key, a name, or a unique key prefix of
/// at least 4 characters (with or without `ed25519:`); the node resolves them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Node status: key, name, addresses, pid, uptime, peers up, outbox size; `via`: each
    /// configured relay's standing connection ([`crate::node::ViaStatus`]). `addresses`
    /// holds a circuit address only while its relay's standing connection is up.
    Status,
    /// Key, name, fingerprint.
    Whoami,
    /// Addresses another host can dial: `{address, addresses, via}` (a circuit address
    /// only while its relay's standing connection is up; `via` as in [`Request::Status`]).
    Address,
    /// Dial an address now and wait for the handshake (or failure) up to `timeout_ms`.
    Connect {
        address: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Queue a msg. New thread when `th` is None (the node allocates `thr_<ulid>`).
    /// `peer` may be omitted when `th` names an existing thread.
    Send {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        th: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        re: Option<String>,
        /// Wire parts (`{"k":"text",…}` etc.).
        parts: Vec<Value>,
        /// Absolute paths of files to send as blobs (protocol-notes §Blobs): each is read
        /// by the node (at most the node's blob limit; over it the request fails with
        /// `bad_request`), its chunks queued before the msg in one transaction, and a
        /// `blob` part {ref, size, name, mime} appended to `parts`. The response then has
        /// `blobs: [{ref, name, size, mime, sha256, chunks}]`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files: Vec<String>,
        /// Wait up to this long for the peer's ack; the response says `delivered` or
        /// `queued`, or `refused` with `refusal: {code, detail}` when the peer answered the
        /// msg with an `err` (for a served request, up to 0.5 s after the ack).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ack_ms: Option<u64>,
    },
    /// Queue a state line for a thread.
    State {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        th: String,
        state: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ack_ms: Option<u64>,
    },
    /// Threads, a [`Page`] at a time, in (thread id, peer) order — a thread is (peer, th),
    /// and two peers may use one id; the cursor is `PEER/th`: `{"threads":[{th, peer,
    /// peer_name, subject, mine, my_note, theirs, their_note, since, updated, updated_ms,
    /// unread}…], "next"?}`. Text fields are cut to [`MAX_SHOWN_CHARS`].
    Threads,
    /// Known peers with connection state, a [`Page`] at a time, in key order:
    /// `{"peers":[{key, name, about, caps, caps_total, fingerprint, first_seen, last_seen,
    /// last_seen_ms, parked, parked_by, connected, remote, address, outbox, addresses,
    /// addresses_total}…], "next"?}` (`parked_by`: `"peer"` after its bye, `"us"` after
    /// `awp disconnect`, null when not parked). At most [`MAX_SHOWN_ITEMS`] caps and addresses per
    /// peer (freshest first, as dialed, see [`crate::store::Store::addresses`]; `address`
    /// is the first; each `{address, source, last_ok, last_heard, last_err}`; the `_total`
    /// fields count all), text cut to [`MAX_SHOWN_CHARS`].
    Peers,
    /// Unread inbound entries (of one thread when `th`: `TH`, or `PEER/TH` when several
    /// peers use the id; refused as `ambiguous_thread` otherwise), marking them read unless `mark`
    /// is false: `{"entries":[event…], "more":bool, "next"?}`, at most 1 MiB of lines (at
    /// least one) or 1000 entries. The [`Page`] cursor is a log seq: the next page starts
    /// after it (needed with `mark: false`, where nothing leaves the unread set).
    Read {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        th: Option<String>,
        #[serde(default = "yes")]
        mark: bool,
    },
    /// Mark inbound log entries read by their `seq` (as in `line` events), at most
    /// [`MAX_MARK_SEQS`]; unknown, outbound and already read entries are skipped. Answers
    /// `{"marked": N}` once the marks are on disk. `awp wait` marks the line it reports.
    MarkRead { seqs: Vec<u64> },
    /// A thread's stored lines verbatim, in log order (`awp export`, spec/signed-lines.md):
    /// `{"peer":KEY, "th":TH, "lines":[{"seq":N, "dir":"in"|"out", "line":TEXT}…],
    /// "next"?:SEQ}`. TEXT is the line exactly as stored (for inbound lines the bytes
    /// received, without `\n`), as a JSON string, so signatures check over it. Entries with
    /// seq > `after` (0: from the start); at most [`PAGE_ITEMS`] lines and [`PAGE_BYTES`] of
    /// them (at least one, unless the page held only stubs) per response. The out log's
    /// chunk stubs of streamed blobs (no data, `x_off`) are left out: they are not the lines
    /// sent. `next`, when more remain, is the `after` of the
    /// following request. `th` is `TH` or `PEER/TH` as for `read`; `no_such_thread` when
    /// no thread matches.
    ThreadLines {
        th: String,
        #[serde(default)]
        after: u64,
    },
    /// Stream events. `from_seq`: first replay log entries with seq > from_seq (tail's
    /// history), then live events. Filters: thread (`TH` or `PEER/TH`; with `peer`, that
    /// peer's thread), peer.
    Subscribe {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        th: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_seq: Option<u64>,
    },
    /// Known agents from presence documents (`awp presence`): `{"agents":[{origin, name,
    /// host, harness, model, version, active, waiting, peers_up, peers, threads, outbox,
    /// unread, seq, ts, hops, via, via_name, own}…]}`, our own document first. With
    /// `peer` (an origin key, a key prefix of at least 4 characters, or a name): that one
    /// document with `doc` (as received) and `verified` (its signature checks now);
    /// `no_such_peer` when none matches. The list comes a [`Page`] at a time (`next`): our
    /// own document, then the others in origin order.
    Presence {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
    },
    /// Presence and relay counters (`awp relay status`): `relay`, `publishing`,
    /// `connections` (sessions up), `presence_peers`, `max_connections`,
    /// `refused_connections`, `documents` (held), `accepted`, `forwarded` (accepted
    /// documents passed on, at most one per origin and seq), `forward_lines` (lines
    /// written by forwarding), `greeting_lines` (lines written to new connections:
    /// anti-entropy), `forward_dropped` (peer queue full),
    /// `dropped` (refused documents) and `refused` (by reason), `expired`, `published`,
    /// `own_seq`.
    PresenceStatus,
    /// Mint a grant from us to `peer` for `caps`, valid `ttl_s` seconds (optionally only
    /// for audience `aud`), store it and send it when connected. Answers the grant and its
    /// hash.
    Grant {
        peer: String,
        caps: Vec<String>,
        ttl_s: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        aud: Option<String>,
    },
    /// Grants issued by us, held by us, and presented to us, with validity, a [`Page`] at
    /// a time in hash order: `{"grants":[…], "next"?}`.
    Grants,
    /// `awp artifact …`: an action on artifact threads (`new`, `list`, `show`, `edit`,
    /// `archive`, `propose`, `proposals`, `accept`, `reject`, `mode`, `focus`, `log`,
    /// `command`) with its arguments; see `node::artifacts::control` for each.
    Artifact {
        action: String,
        #[serde(default)]
        args: Value,
    },
    /// Revoke a grant by hash, or by a unique hash prefix of at least 4 characters: never
    /// honored here again (and dropped when it was ours). `no_such_grant` when none
    /// matches, `ambiguous_grant` when several do.
    Revoke { hash: String },
    /// Introduce `peer` to `to`: send `to` an `introduce` line with `peer`'s key, name and
    /// address and a grant (sub = `to`, aud = `peer`) for `caps`, in thread `th` (a new
    /// thread when None).
    Introduce {
        to: String,
        peer: String,
        #[serde(default)]
        caps: Vec<String>,
        ttl_s: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        th: Option<String>,
    },
    /// Blobs sent and received (`awp blobs`): `{"blobs":[{dir: "out"|"in", peer,
    /// peer_name, ref, th, msg, name, mime, size, sha256, status, path, at, chunks,
    /// chunks_sent, chunks_acked, bytes, reason}…]}`, newest first. Outbound status:
    /// `queued` (the naming msg is not acked yet), `sent` (acked), `refused` (the peer
    /// answered `blob_refused`); `chunks_sent` counts chunks written to the live
    /// connection or retired, `chunks_acked` chunks retired by the peer's ack or resume;
    /// `sha256` is null while the file is still being hashed after queueing.
    /// Inbound status: `pending`, `complete` (then `path` and `sha256`), `refused` (with
    /// `reason`); `bytes` = bytes stored so far. `peer`/`blob_ref` filter. A [`Page`] at a
    /// time (`next`); names, mimes and reasons cut to [`MAX_SHOWN_CHARS`].
    Blobs {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<String>,
        #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
        blob_ref: Option<String>,
    },
    /// Stop the node (answers, then exits).
    Shutdown,
    /// Forget a peer (`awp peers forget`): remove its peer record, addresses, threads,
    /// log entries, queued lines and `seen` entries (see [`crate::store::Store::forget_peer`]).
    /// Answers `{key, removed: {peer, addresses, threads, log, outbox, seen}, kept: {blobs,
    /// artifact_threads, grants}}` (counts; `kept` is what stays about it);
    /// `no_such_peer` when nothing is known about it, `bad_request` while it is connected.
    ForgetPeer { peer: String },
    /// Say bye to one peer (`awp disconnect`): park it (no redial until the next `connect`
    /// to it or a line queued for it), then close its connection, if any, with a `bye`
    /// carrying `reason` (cut to [`crate::node::MAX_BYE_REASON`] bytes). Answers
    /// `{key, peer_name, was_connected, parked: true}`; `no_such_peer` / `ambiguous_peer`
    /// when `peer` names no single peer.
    Disconnect {
        peer: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

fn yes() -> bool {
    true
}

/// Most items in one page of a listing (also the default).
pub const PAGE_ITEMS: usize = 500;
/// Most bytes of items in one page of a listing (a page holds at least one item). With
/// items bounded by [`MAX_SHOWN_CHARS`] and [`MAX_SHOWN_ITEMS`], a page stays far below
/// [`MAX_CONTROL_LINE`], however many or large the things listed are.
pub const PAGE_BYTES: usize = 1024 * 1024;
/// Longest text a listing shows of a field a peer chose (names, subjects, states, notes,
/// file names…), in characters; longer text is cut and ends with `…`.
pub const MAX_SHOWN_CHARS: usize = 256;
/// Most entries a listing shows of a list inside one item (a peer's caps or addresses).
pub const MAX_SHOWN_ITEMS: usize = 32;

/// `s` as a listing shows it: at most [`MAX_SHOWN_CHARS`] characters, the last one `…`
/// when it was cut.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(MAX_SHOWN_CHARS) {
        None => s.to_string(),
        Some(_) => {
            let cut = s
                .char_indices()
                .nth(MAX_SHOWN_CHARS - 1)
                .map_or(s.len(), |(i, _)| i);
            format!("{}…", &s[..cut])
        }
    }
}

/// Paging of the listing requests (`threads`, `peers`, `grants`, `blobs`, `presence`
/// without a peer, `read`): the fields `cursor` and `limit` sent next to `op` in the
/// request line. A listing answers at most `limit` items (default and maximum
/// [`PAGE_ITEMS`]) and at most [`PAGE_BYTES`]; when more remain, its response has
/// `"next": CURSOR`, to send as `cursor` for the following page. Cursors are opaque.
/// Items added or changed while paging may be missed or seen twice; nothing else is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

impl Page {
    /// The first page.
    pub fn first() -> Page {
        Page::default()
    }
    /// The page after `cursor`.
    pub fn after(cursor: impl Into<String>) -> Page {
        Page {
            cursor: Some(cursor.into()),
            limit: None,
        }
    }
    /// The item limit in force: `limit` within 1..=[`PAGE_ITEMS`].
    pub fn items(&self) -> usize {
        self.limit.unwrap_or(PAGE_ITEMS).clamp(1, PAGE_ITEMS)
    }
}

impl Request {
    /// Whether this request is a listing answered in pages ([`Page`]).
    pub fn is_listing(&self) -> bool {
        matches!(
            self,
            Request::Threads
                | Request::Peers
                | Request::Grants
                | Request::Blobs { .. }
                | Request::Read { .. }
                | Request::Presence { peer: None }
        )
    }
}

/// A node → CLI response: `{"ok":true, …result fields}` or
/// `{"ok":false,"error":{"code":…,"message":…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ControlError>,
    /// Result fields (an object) when ok.
    #[serde(flatten)]
    pub body: serde_json::Map<String, Value>,
}

/// A failed request. `code` is one of: `bad_request`, `no_such_peer`, `ambiguous_peer`,
/// `no_such_thread`, `no_such_grant`, `ambiguous_grant`, `connect_failed`, `forbidden` (the
/// connecting process runs as another user than the node, see [`check_peer_uid`]),
/// `disk_full` (a `send` or `state` refused while the home's file system is short of space,
/// see [`crate::store::DISK_RESERVE`]), `internal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlError {
    pub code: String,
    /// What went wrong, without advice (`no known peer matches "bob"`).
    pub message: String,
    /// One thing to do about it, when the node knows better than the code's usual advice
    /// (the CLI prints it instead of its own hint for the code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// A streamed event (subscribe, and `awp listen` output).
///
/// Shapes:
/// - `{"event":"line","seq":N,"dir":"in"|"out","peer":KEY,"peer_name":NAME?,"th":TH?,
///   "id":ID,"t":"msg"|"state"|…,"line":<the wire line as JSON>,"at":RFC3339}` — a content
///   line stored in the log (inbound: received; outbound: queued).
/// - `{"event":"ack","peer":KEY,"th":TH,"re":ID}` — our line was acked by the peer.
/// - `{"event":"blob","dir":"in","peer":KEY,"ref":REF,"th":TH?,"msg":ID?,"name":NAME?,
///   "mime":MIME?,"size":N,"sha256":HEX,"path":PATH}` — a received blob is complete and
///   at `path`.
/// - `{"event":"peer_up"|"peer_down","peer":KEY,"peer_name":NAME?,"remote":ADDR?,"reason":…?}`
/// - `{"event":"listening","address":ADDR,"addresses":[ADDR…],"key":KEY,"name":NAME}`
///   (first line of `awp listen`).
pub type Event = serde_json::Map<String, Value>;

/// Most seqs one [`Request::MarkRead`] may name.
pub const MAX_MARK_SEQS: usize = 1000;

impl Response {
    /// A success with `body` fields (must be a JSON object; other values go under `result`).
    pub fn ok(body: Value) -> Response {
        let body = match body {
            Value::Object(m) => m,
            Value::Null => serde_json::Map::new(),
            other => {
                let mut m = serde_json::Map::new();
                m.insert("result".into(), other);
                m
            }
        };
        Response {
            ok: true,
            error: None,
            body,
        }
    }
    /// A failure.
    pub fn err(code: &str, message: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(ControlError {
                code: code.into(),
                message: message.into(),
                hint: None,
            }),
            body: serde_json::Map::new(),
        }
    }
}

/// Whether a process connected to the control socket may use it: only a process of the
/// node's own user. `peer_uid` is the connecting process's uid from the kernel
/// (`SO_PEERCRED`; `None` when it could not be read), `own_uid` the node's effective uid.
/// Anyone else who reaches the socket (a lost race at creation, a shared home) is refused
/// with the message returned here (code `forbidden`), as the socket mints grants and
/// queues lines under the node's key (security-local §Control socket).
pub fn check_peer_uid(peer_uid: Option<u32>, own_uid: u32) -> Result<(), String> {
    match peer_uid {
        Some(uid) if uid == own_uid => Ok(()),
        Some(uid) => Err(format!(
            "uid {uid} may not use this node's control socket (the node runs as uid {own_uid})"
        )),
        None => Err("the control socket could not tell which user connected".into()),
    }
}

// ---------------------------------------------------------------------------------------
// Client side: one request per connection, and event subscriptions.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

/// How long a client waits to connect to the control socket.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client waits for a response beyond any wait the request itself asks for.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a control request got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (missing, refused, or connect timed out).
    #[error("no node answers on {}: {source}", path.display())]
    NotRunning {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The node accepted but did not answer in time.
    #[error("the node did not answer within {}s", .0.as_secs())]
    Timeout(Duration),
    /// The node closed the connection without a complete line.
    #[error("the node closed the control connection")]
    Closed,
    /// A line longer than [`MAX_CONTROL_LINE`].
    #[error("control line longer than {MAX_CONTROL_LINE} bytes")]
    TooLarge,
    /// A line that is not the expected JSON.
    #[error("malformed control line from the node: {0}")]
    Malformed(String),
    /// The node refused a subscription.
    #[error("{}: {}", .0.code, .0.message)]
    Refused(ControlError),
    /// Reading or writing the socket failed.
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
}

impl Request {
    /// The longest the node may legitimately take to answer this request.
    pub fn response_timeout(&self) -> Duration {
        let wait_ms = match self {
            Request::Connect { timeout_ms, .. } => timeout_ms.unwrap_or(10_000),
            Request::Send { wait_ack_ms, .. } | Request::State { wait_ack_ms, .. } => {
                wait_ack_ms.unwrap_or(0)
            }
            _ => 0,
        };
        RESPONSE_TIMEOUT + Duration::from_millis(wait_ms)
    }
}

async fn connect(socket: &Path) -> Result<UnixStream, ClientError> {
    let not_running = |source| ClientError::NotRunning {
        path: socket.to_path_buf(),
        source,
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(socket)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(not_running(e)),
        Err(_) => Err(not_running(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "connect timed out",
        ))),
    }
}

/// A request line with paging fields next to `op`.
#[derive(Serialize)]
struct Paged<'a> {
    #[serde(flatten)]
    req: &'a Request,
    #[serde(flatten)]
    page: &'a Page,
}

async fn write_request(w: &mut OwnedWriteHalf, req: &impl Serialize) -> Result<(), ClientError> {
    let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Malformed(e.to_string()))?;
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await?;
    Ok(())
}

/// Read one `\n`-terminated line of at most [`MAX_CONTROL_LINE`] bytes (without the
/// newline). `None` at a clean end of stream.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Vec<u8>>, ClientError> {
    let mut buf = Vec::new();
    let n = (&mut *r)
        .take(MAX_CONTROL_LINE as u64 + 1)
        .read_until(b'\n', &mut buf)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() != Some(&b'\n') {
        return Err(if buf.len() > MAX_CONTROL_LINE {
            ClientError::TooLarge
        } else {
            ClientError::Closed
        });
    }
    buf.pop();
    Ok(Some(buf))
}

fn parse_response(line: &[u8]) -> Result<Response, ClientError> {
    serde_json::from_slice(line).map_err(|e| ClientError::Malformed(e.to_string()))
}

/// Send one request to the node on `socket` and read its response, waiting at most
/// [`Request::response_timeout`]. A response with `ok: false` is returned as is.
pub async fn request(socket: &Path, req: &Request) -> Result<Response, ClientError> {
    request_with_timeout(socket, req, req.response_timeout()).await
}

/// [`request`] with an explicit response timeout.
pub async fn request_with_timeout(
    socket: &Path,
    req: &Request,
    timeout: Duration,
) -> Result<Response, ClientError> {
    exchange(socket, req, None, timeout).await
}

/// One page of a listing ([`Request::is_listing`]): `req` with `page`'s fields. The
/// response's `next` (when present) is the cursor of the following page.
pub async fn request_page(
    socket: &Path,
    req: &Request,
    page: &Page,
) -> Result<Response, ClientError> {
    exchange(socket, req, Some(page), req.response_timeout()).await
}

async fn exchange(
    socket: &Path,
    req: &Request,
    page: Option<&Page>,
    timeout: Duration,
) -> Result<Response, ClientError> {
    let stream = connect(socket).await?;
    let (r, mut w) = stream.into_split();
    let exchange = async {
        match page {
            None => write_request(&mut w, req).await?,
            Some(page) => write_request(&mut w, &Paged { req, page }).await?,
        }
        let mut r = BufReader::new(r);
        match read_line(&mut r).await? {
            Some(line) => parse_response(&line),
            None => Err(ClientError::Closed),
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ClientError::Timeout(timeout))?
}

/// A live subscription: [`Event`] lines until either side closes.
pub struct Subscription {
    reader: BufReader<OwnedReadHalf>,
    // Kept open: closing our half ends the subscription at the node.
    _writer: OwnedWriteHalf,
}

/// Send a [`Request::Subscribe`] (or any streaming request) and wait for the node's
/// `{"ok":true}`; a refusal is [`ClientError::Refused`].
pub async fn subscribe(socket: &Path, req: &Request) -> Result<Subscription, ClientError> {
    let stream = connect(socket).await?;
    let (r, mut w) = stream.into_split();
    let mut reader = BufReader::new(r);
    let first = tokio::time::timeout(RESPONSE_TIMEOUT, async {
        write_request(&mut w, req).await?;
        read_line(&mut reader).await
    })
    .await
    .map_err(|_| ClientError::Timeout(RESPONSE_TIMEOUT))??;
    let resp = parse_response(&first.ok_or(ClientError::Closed)?)?;
    if !resp.ok {
        return Err(ClientError::Refused(resp.error.unwrap_or(ControlError {
            code: "internal".into(),
            message: "subscription refused without a reason".into(),
            hint: None,
        })));
    }
    Ok(Subscription { reader, _writer: w })
}

impl Subscription {
    /// The next event; `None` when the node closed the stream.
    pub async fn next_event(&mut self) -> Result<Option<Event>, ClientError> {
        match read_line(&mut self.reader).await? {
            None => Ok(None),
            Some(line) => serde_json::from_slice(&line)
                .map(Some)
                .map_err(|e| ClientError::Malformed(e.to_string())),
        }
    }
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn shown_cuts_long_text_with_an_ellipsis() {
        assert_eq!(shown("short"), "short");
        let exact = "é".repeat(MAX_SHOWN_CHARS);
        assert_eq!(shown(&exact), exact);
        let long = "é".repeat(MAX_SHOWN_CHARS + 1);
        let s = shown(&long);
        assert_eq!(s.chars().count(), MAX_SHOWN_CHARS);
        assert!(s.ends_with("é…"));
        assert_eq!(
            shown(&"x".repeat(1 << 20)).len(),
            MAX_SHOWN_CHARS - 1 + '…'.len_utf8()
        );
    }

    #[test]
    fn paging_fields_sit_next_to_op() {
        let page = Page {
            cursor: Some("thr_1".into()),
            limit: Some(7),
        };
        let line = serde_json::to_string(&Paged {
            req: &Request::Threads,
            page: &page,
        })
        .unwrap();
        assert_eq!(line, r#"{"op":"threads","cursor":"thr_1","limit":7}"#);
        // The node reads both from the same line; old clients send neither.
        assert_eq!(
            serde_json::from_str::<Request>(&line).unwrap(),
            Request::Threads
        );
        assert_eq!(serde_json::from_str::<Page>(&line).unwrap(), page);
        let plain = serde_json::to_string(&Paged {
            req: &Request::Grants,
            page: &Page::first(),
        })
        .unwrap();
        assert_eq!(plain, r#"{"op":"grants"}"#);
        assert_eq!(page.items(), 7);
        assert_eq!(Page::first().items(), PAGE_ITEMS);
        assert_eq!(
            Page {
                cursor: None,
                limit: Some(1 << 40)
            }
            .items(),
            PAGE_ITEMS
        );
    }
}

#[cfg(test)]
mod peer_tests {
    use super::check_peer_uid;

    #[test]
    fn only_the_nodes_own_uid_is_served() {
        let table: &[(Option<u32>, u32, bool)] = &[
            (Some(1000), 1000, true),
            (Some(0), 0, true),
            (Some(1001), 1000, false),
            // Root is another user too: the rule is equality.
            (Some(0), 1000, false),
            (Some(1000), 0, false),
            (None, 1000, false),
            (None, 0, false),
        ];
        for &(peer, own, ok) in table {
            let r = check_peer_uid(peer, own);
            assert_eq!(r.is_ok(), ok, "peer {peer:?} own {own}: {r:?}");
            if let (Err(m), Some(p)) = (r, peer) {
                assert!(m.contains(&format!("uid {p}")), "{m}");
            }
        }
    }
}

#[cfg(test)]
mod client_tests {
    use super::*;
    use tokio::net::UnixListener;

    /// A one-connection fake node: reads one request line, answers with `lines`.
    async fn fake_node(
        dir: &Path,
        lines: Vec<String>,
    ) -> (PathBuf, tokio::task::JoinHandle<String>) {
        let path = dir.join("awp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let task = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let (r, mut w) = s.into_split();
            let mut r = BufReader::new(r);
            let mut req = String::new();
            r.read_line(&mut req).await.unwrap();
            for l in lines {
                w.write_all(l.as_bytes()).await.unwrap();
            }
            w.flush().await.unwrap();
            // Keep the connection until the client is done.
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest).await;
            req
        });
        (path, task)
    }

    #[tokio::test]
    async fn request_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let (path, task) = fake_node(dir.path(), vec!["{\"ok\":true,\"pid\":42}\n".into()]).await;
        let resp = request(&path, &Request::Status).await.unwrap();
        assert!(resp.ok);
        assert_eq!(resp.body["pid"], 42);
        assert_eq!(task.await.unwrap(), "{\"op\":\"status\"}\n");
    }

    #[tokio::test]
    async fn missing_socket_is_not_running() {
        let dir = tempfile::tempdir().unwrap();
        let err = request(&dir.path().join("awp.sock"), &Request::Status)
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::NotRunning { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn subscription_streams_events_then_ends() {
        let dir = tempfile::tempdir().unwrap();
        let lines = vec![
            "{\"ok\":true}\n".to_string(),
            "{\"event\":\"line\",\"seq\":1}\n".into(),
            "{\"event\":\"caught_up\"}\n".into(),
        ];
        let (path, task) = fake_node(dir.path(), lines).await;
        let req = Request::Subscribe {
            th: None,
            peer: None,
            from_seq: Some(0),
        };
        let mut sub = subscribe(&path, &req).await.unwrap();
        assert_eq!(sub.next_event().await.unwrap().unwrap()["seq"], 1);
        assert_eq!(
            sub.next_event().await.unwrap().unwrap()["event"],
            "caught_up"
        );
        drop(sub);
        assert_eq!(
            task.await.unwrap(),
            "{\"op\":\"subscribe\",\"from_seq\":0}\n"
        );
    }

    #[tokio::test]
    async fn refused_subscription_carries_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let lines = vec![
            "{\"ok\":false,\"error\":{\"code\":\"no_such_thread\",\"message\":\"thr_x\"}}\n"
                .to_string(),
        ];
        let (path, _task) = fake_node(dir.path(), lines).await;
        let req = Request::Subscribe {
            th: Some("thr_x".into()),
            peer: None,
            from_seq: None,
        };
        match subscribe(&path, &req).await {
            Err(ClientError::Refused(e)) => assert_eq!(e.code, "no_such_thread"),
            Err(e) => panic!("unexpected {e:?}"),
            Ok(_) => panic!("expected a refusal"),
        }
    }

    #[tokio::test]
    async fn oversized_line_is_refused() {
        let mut big = vec![b'x'; MAX_CONTROL_LINE + 10];
        big.push(b'\n');
        let mut r = BufReader::new(&big[..]);
        assert!(matches!(
            read_line(&mut r).await,
            Err(ClientError::TooLarge)
        ));
        let mut ok = BufReader::new(&b"abc\n"[..]);
        assert_eq!(read_line(&mut ok).await.unwrap().unwrap(), b"abc");
        let mut cut = BufReader::new(&b"abc"[..]);
        assert!(matches!(
            read_line(&mut cut).await,
            Err(ClientError::Closed)
        ));
    }
}
