//! The client commands: each talks to the node over the control socket, or works on the
//! home alone (`whoami`, `schema`). Only `awp up` starts a node: every other command that
//! needs one fails with exit 3 when none runs (never a listening node as a side effect).

use super::args::PeersAction;
use super::args::{Command, SendArgs, StateArgs};
use super::format::{self, field, str_field};
use super::{client_failure, node_failure, out, out_json, Ctx, Exit, Failure};
use crate::control::{self, ClientError, Event, Request, Response};
use crate::daemon::{self, Running, StartArgs};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most pages a listing is read in (with [`control::PAGE_ITEMS`] items a page, far more
/// than any node holds).
pub const MAX_PAGES: usize = 1_000_000;

/// How long `awp down` waits for the node to release its lock.
const DOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Run one command.
pub async fn dispatch(ctx: &Ctx, command: Command) -> Result<(), Failure> {
    match command {
        Command::Up(args) => up(ctx, &StartArgs::from(&args)).await,
        Command::Listen { node, text } => {
            let output = if text {
                super::foreground::Output::Text
            } else {
                super::foreground::Output::Json
            };
            super::foreground::run(ctx, &node, output).await
        }
        Command::Daemon(node) => {
            super::foreground::run(ctx, &node, super::foreground::Output::None).await
        }
        Command::Down => down(ctx).await,
        Command::Connect { address, timeout } => connect(ctx, address, timeout).await,
        Command::Disconnect { peer, reason } => super::peers::disconnect(ctx, peer, reason).await,
        Command::Address => address(ctx).await,
        Command::Send(args) => send(ctx, &args).await,
        Command::State(args) => state(ctx, &args).await,
        Command::Tail { once, thread, peer } => tail(ctx, once, thread, peer).await,
        Command::Read {
            thread,
            no_mark,
            limit,
            all,
            after,
        } => {
            let opts = ReadOpts {
                mark: !no_mark,
                limit: (!all).then_some(limit),
                after,
            };
            read(ctx, thread, opts).await
        }
        Command::Wait {
            no_mark,
            thread,
            state,
            timeout,
        } => wait(ctx, thread, state, timeout, !no_mark).await,
        Command::Threads => list(ctx, Request::Threads, "threads").await,
        Command::Grant {
            peer,
            caps,
            custom,
            ttl,
            aud,
        } => {
            let caps = super::grants::checked_caps(&caps, custom)?;
            super::grants::grant(ctx, peer, caps, ttl, aud).await
        }
        Command::Grants => super::grants::grants(ctx).await,
        Command::Artifact(cmd) => super::artifacts::run(ctx, cmd).await,
        Command::Revoke { hash } => super::grants::revoke(ctx, hash).await,
        Command::Mcp(args) => crate::mcp::serve(ctx, &args).await,
        Command::Introduce {
            to,
            peer,
            caps,
            custom,
            ttl,
            thread,
        } => {
            let caps = super::grants::checked_caps(&caps, custom)?;
            super::grants::introduce(ctx, to, peer, caps, ttl, thread).await
        }
        Command::Peers { action: None } => list(ctx, Request::Peers, "peers").await,
        Command::Peers {
            action: Some(PeersAction::Forget { peer }),
        } => super::peers::forget(ctx, peer).await,
        Command::Blobs { peer } => super::blobs::list(ctx, peer).await,
        Command::Status => status(ctx).await,
        Command::Presence { peer } => super::presence::show(ctx, peer).await,
        Command::Relay(args) => super::presence::relay(ctx, &args).await,
        Command::Whoami => whoami(ctx).await,
        Command::Export {
            thread,
            format,
            with_blobs,
        } => super::transcript::export(ctx, thread, &format, with_blobs.as_deref()).await,
        Command::Verify { file, blobs } => super::transcript::verify(&file, blobs.as_deref()),
        Command::Roll { peer } => crate::roll::cli(ctx, &peer).await,
        Command::Schema => out(&format!("{:#}", crate::wire::schema::schema())),
        Command::Version => version(ctx),
        Command::Doctor { fix } => super::doctor::run(ctx, fix),
        Command::Conform(args) => crate::conform::cli::run(ctx, args).await,
        Command::Completions { shell } => super::docs::completions(shell),
        Command::Man => super::docs::man(),
        Command::ServeAgent(args) => crate::acp::cli::serve_agent(ctx, args).await,
        Command::Acp(args) => crate::acp::cli::acp(ctx, args).await,
    }
}

impl Ctx {
    pub(crate) fn socket(&self) -> PathBuf {
        daemon::socket_path(&self.home)
    }

    /// Start the node in the background unless it answers (`awp up` only).
    async fn ensure_node(&self, args: &StartArgs) -> Result<Running, Failure> {
        daemon::ensure_running(&self.home, args).await.map_err(|e| {
            let why = e.to_string();
            let log = self.home.join(daemon::LOG_FILE);
            // The node's own error may carry its hint already.
            let hint = if why.contains("awp doctor") {
                format!("the log is {}", log.display())
            } else {
                format!(
                    "run `awp doctor` to check the home; the log is {}",
                    log.display()
                )
            };
            Failure::new(Exit::Failed, why, hint)
        })
    }

    /// One request to the running node (never starts one: no node is exit 3, see
    /// [`super::client_failure`]); the body of an `ok` response.
    pub(crate) async fn call(&self, req: &Request) -> Result<Map<String, Value>, Failure> {
        self.call_running(req).await
    }

    /// One request to a node that should be running (no start).
    async fn call_running(&self, req: &Request) -> Result<Map<String, Value>, Failure> {
        let resp = control::request(&self.socket(), req)
            .await
            .map_err(|e| client_failure(&e, &self.home))?;
        self.body(resp)
    }

    pub(crate) fn body(&self, resp: Response) -> Result<Map<String, Value>, Failure> {
        if resp.ok {
            Ok(resp.body)
        } else {
            let err = resp.error.unwrap_or(control::ControlError {
                code: "internal".into(),
                message: "the node refused without a reason".into(),
                hint: None,
            });
            Err(node_failure(&err, &self.home))
        }
    }

    /// Every item of a listing answered as `{KEY: [items], "next"?}`: page after page
    /// ([`control::Page`]) until the node gives no `next` (at most [`MAX_PAGES`] pages).
    pub(crate) async fn call_all(&self, req: &Request, key: &str) -> Result<Vec<Value>, Failure> {
        let mut page = control::Page::first();
        let mut items = Vec::new();
        for _ in 0..MAX_PAGES {
            let resp = control::request_page(&self.socket(), req, &page)
                .await
                .map_err(|e| client_failure(&e, &self.home))?;
            let mut body = self.body(resp)?;
            if let Some(Value::Array(a)) = body.remove(key) {
                items.extend(a);
            }
            match body.get("next").and_then(Value::as_str) {
                None => return Ok(items),
                Some(n) if page.cursor.as_deref() == Some(n) => break,
                Some(n) => page = control::Page::after(n),
            }
        }
        Err(Failure::new(
            Exit::Failed,
            format!("the node's {key} listing did not end"),
            "check the node with `awp status`",
        ))
    }

    pub(crate) async fn subscribe(&self, req: &Request) -> Result<control::Subscription, Failure> {
        control::subscribe(&self.socket(), req)
            .await
            .map_err(|e| client_failure(&e, &self.home))
    }
}

fn millis(d: Option<Duration>) -> Option<u64> {
    d.map(|d| d.as_millis().min(u64::MAX as u128) as u64)
}

async fn up(ctx: &Ctx, args: &StartArgs) -> Result<(), Failure> {
    let running = ctx.ensure_node(args).await?;
    let status = ctx.call_running(&Request::Status).await?;
    // A relay's circuit address is listed only while it is up: give the standing
    // connections of a node just started a moment to come up.
    let status = super::presence::settle_vias(ctx, status).await?;
    let who = ctx.call_running(&Request::Whoami).await.unwrap_or_default();
    let addresses = format::listening_addresses(&status);
    let key = str_field(&who, &["key"])
        .or(str_field(&status, &["key"]))
        .unwrap_or("?");
    let name = str_field(&who, &["name"])
        .or(str_field(&status, &["name"]))
        .unwrap_or("?");
    // E.g. it did not get port 7700 (usability #1): said on stderr, and in the JSON.
    let notices: Vec<String> = status
        .get("notices")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for n in notices.iter().chain(&super::presence::via_notes(&status)) {
        eprintln!("awp: note: {}", format::printable(n));
    }
    // The local artifactr endpoint (`--artifactr`), when on.
    let artifactr = str_field(&status, &["artifactr"]);
    if ctx.json {
        // Whether this call started the node or found it running (then options given
        // here were not applied).
        let (already, pid) = match running {
            Running::Started { pid } => (false, Some(json!(pid))),
            Running::Already => (true, field(&status, &["pid"]).cloned()),
        };
        return out_json(&json!({
            "event": "listening",
            "address": addresses.first(),
            "addresses": addresses,
            "key": key,
            "name": name,
            "already_running": already,
            "pid": pid,
            "options_ignored": already && *args != StartArgs::default(),
            "notices": notices,
            "artifactr": artifactr,
            "via": status.get("via"),
        }));
    }
    match running {
        Running::Started { pid } => out(&format!("node started (pid {pid})"))?,
        Running::Already => {
            let pid = field(&status, &["pid"])
                .map(Value::to_string)
                .unwrap_or_else(|| "?".into());
            out(&format!("node already running (pid {pid})"))?;
            if *args != StartArgs::default() {
                out("options ignored: the node already runs (`awp down` first to change them)")?;
            }
        }
    }
    let mut info = Map::new();
    info.insert("name".into(), name.into());
    info.insert("key".into(), key.into());
    if let Some(fp) = str_field(&who, &["fingerprint"]) {
        info.insert("fingerprint".into(), fp.into());
    }
    info.insert("addresses".into(), addresses.into());
    if let Some(a) = artifactr {
        let token = ctx.home.join(crate::node::ARTIFACTR_TOKEN_FILE);
        info.insert(
            "artifactr".into(),
            format!("http://{a} (bearer token in {})", token.display()).into(),
        );
    }
    out(&format::key_values(&info))
}

async fn down(ctx: &Ctx) -> Result<(), Failure> {
    match control::request(&ctx.socket(), &Request::Shutdown).await {
        Err(ClientError::NotRunning { .. }) => {
            return if ctx.json {
                out_json(&json!({"running": false}))
            } else {
                out("no node running")
            };
        }
        Err(e) => return Err(client_failure(&e, &ctx.home)),
        Ok(resp) => {
            ctx.body(resp)?;
        }
    }
    // Wait until the node has let go of the home, so `awp up` right after works.
    let deadline = tokio::time::Instant::now() + DOWN_TIMEOUT;
    loop {
        match daemon::Lock::acquire(&ctx.home) {
            Ok(lock) => {
                drop(lock);
                break;
            }
            Err(daemon::LockError::Held { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(Failure::new(
                    Exit::Failed,
                    format!(
                        "the node did not stop within {}s ({e})",
                        DOWN_TIMEOUT.as_secs()
                    ),
                    format!("see {}", ctx.home.join(daemon::LOG_FILE).display()),
                ))
            }
        }
    }
    if ctx.json {
        out_json(&json!({"stopped": true}))
    } else {
        out("node stopped")
    }
}

async fn connect(ctx: &Ctx, address: String, timeout: Option<Duration>) -> Result<(), Failure> {
    let body = ctx
        .call(&Request::Connect {
            address,
            timeout_ms: millis(timeout),
        })
        .await?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    let key = str_field(&body, &["peer", "key"]).unwrap_or("?");
    match str_field(&body, &["peer_name", "name"]) {
        Some(name) => out(&format!("connected to {name} ({key})")),
        None => out(&format!("connected to {key}")),
    }
}

async fn address(ctx: &Ctx) -> Result<(), Failure> {
    let body = ctx.call(&Request::Address).await?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    for n in super::presence::via_notes(&body) {
        eprintln!("awp: note: {}", format::printable(&n));
    }
    for a in format::listening_addresses(&body) {
        out(&a)?;
    }
    Ok(())
}

/// Language of a code file from its extension.
pub fn lang_for_path(path: &Path) -> Option<String> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    let lang = match ext.as_str() {
        "rs" => "rust",
        "py" => "python",
        "js" | "mjs" | "cjs" => "javascript",
        "ts" => "typescript",
        "rb" => "ruby",
        "sh" | "bash" => "sh",
        "md" => "markdown",
        "yml" | "yaml" => "yaml",
        "h" => "c",
        "cc" | "cpp" | "cxx" | "hpp" => "cpp",
        "kt" => "kotlin",
        other => other,
    };
    Some(lang.to_string())
}

/// The wire parts of a msg: a text part (when `text` is not empty), a code part, a data
/// part, in that order.
pub fn build_parts(
    text: &str,
    code: Option<(String, Option<String>)>,
    data: Option<(Value, Option<String>)>,
) -> Vec<Value> {
    let mut parts = Vec::new();
    if !text.is_empty() {
        parts.push(json!({"k": "text", "text": text}));
    }
    if let Some((body, lang)) = code {
        let mut p = json!({"k": "code", "text": body});
        if let Some(l) = lang {
            p["lang"] = l.into();
        }
        parts.push(p);
    }
    if let Some((data, mime)) = data {
        let mut p = json!({"k": "data", "data": data});
        if let Some(m) = mime {
            p["mime"] = m.into();
        }
        parts.push(p);
    }
    parts
}

/// The text argument: `-` reads stdin (one trailing newline dropped).
fn text_arg(text: &str) -> Result<String, Failure> {
    if text != "-" {
        return Ok(text.to_string());
    }
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| {
        Failure::usage(
            format!("cannot read the text from stdin: {e}"),
            "pipe UTF-8 text into `awp send … -`",
        )
    })?;
    if s.ends_with('\n') {
        s.pop();
        if s.ends_with('\r') {
            s.pop();
        }
    }
    Ok(s)
}

/// The request of `awp send`, built before any node is contacted (all input errors are
/// exit 2 with nothing sent).
pub fn send_request(args: &SendArgs) -> Result<Request, Failure> {
    let (peer, text) = args.peer_and_text();
    if peer.is_none() && args.thread.is_none() {
        return Err(Failure::usage(
            "a new thread needs a peer",
            "use `awp send PEER TEXT`, or `awp send -t THREAD TEXT` to answer in a thread",
        ));
    }
    let text = text_arg(text)?;
    let code = match &args.code {
        Some(path) => {
            let body = std::fs::read_to_string(path).map_err(|e| {
                Failure::usage(
                    format!("cannot read {}: {e}", path.display()),
                    "check the --code file (UTF-8 text)",
                )
            })?;
            Some((body, args.lang.clone().or_else(|| lang_for_path(path))))
        }
        None => None,
    };
    let data = args.data.clone().map(|d| (d, args.mime.clone()));
    let parts = build_parts(&text, code, data);
    let files = super::blobs::resolve_files(&args.files)?;
    if parts.is_empty() && files.is_empty() {
        return Err(nothing_to_send(peer, args.thread.as_deref()));
    }
    Ok(Request::Send {
        peer: peer.map(str::to_string),
        th: args.thread.clone(),
        subject: args.subject.clone(),
        re: args.re.clone(),
        parts,
        files,
        wait_ack_ms: millis(args.wait_ack),
    })
}

/// The usage failure of a send without text, file or data (to `peer`, in `thread`).
pub fn nothing_to_send(peer: Option<&str>, thread: Option<&str>) -> Failure {
    let to = match (peer, thread) {
        (_, Some(th)) => format!(" in {th}"),
        // Text given alone: it was taken as the peer.
        (Some(p), None) if p.contains(char::is_whitespace) => {
            return Failure::usage(
                format!("nothing to send to {p:?}: a single argument is the peer, and the text comes after it"),
                "`awp send PEER TEXT`; or reply in a thread with `awp send -t TH TEXT`",
            );
        }
        (Some(p), None) => format!(" to {p}"),
        (None, None) => String::new(),
    };
    Failure::usage(
        format!("nothing to send{to}: the text, a file or data is missing"),
        "e.g. `awp send PEER TEXT`; or add --code FILE, --data JSON or -f FILE",
    )
}

/// `delivered <id> in <th>` / `queued <id> in <th>` (with `(peer offline)` when the
/// response says the peer is not connected).
pub fn delivery_line(body: &Map<String, Value>) -> String {
    let id = str_field(body, &["id"]).unwrap_or("?");
    let th = str_field(body, &["th"]).unwrap_or("?");
    let offline = body.get("connected").and_then(Value::as_bool) == Some(false);
    match str_field(body, &["status"]) {
        Some("delivered") => format!("delivered {id} in {th}"),
        Some("queued") if offline => format!("queued {id} in {th} (peer offline)"),
        Some("queued") => format!("queued {id} in {th}"),
        Some(other) => format!("{other} {id} in {th}"),
        None => format!("queued {id} in {th}"),
    }
}

/// The failure for a reply whose `status` is `refused` (the peer answered our line with an
/// `err` while `--wait-ack` waited): exit 1, the peer's err code as the code.
pub fn refused_failure(body: &Map<String, Value>) -> Option<Failure> {
    if str_field(body, &["status"]) != Some("refused") {
        return None;
    }
    let id = str_field(body, &["id"]).unwrap_or("?");
    let th = str_field(body, &["th"]).unwrap_or("?");
    let err = body.get("refusal").and_then(Value::as_object);
    let code = err
        .and_then(|e| str_field(e, &["code"]))
        .unwrap_or("refused");
    let who = str_field(body, &["peer_name", "peer"]).unwrap_or("the peer");
    let what = match err.and_then(|e| str_field(e, &["detail"])) {
        Some(d) => format!("{who} refused {id} in {th}: {code}: {d}"),
        None => format!("{who} refused {id} in {th}: {code}"),
    };
    Some(
        Failure::new(
            Exit::Failed,
            what,
            format!("the refusal is stored in the thread (`awp read {th}`)"),
        )
        .with_code(code),
    )
}

/// The failure for a reply whose `status` is still `queued` after `--wait-ack DUR`: exit
/// 2 (a wait that timed out, as for `awp wait`), code `timeout`. The line stays queued and
/// goes when the peer is reachable, so the message says not to send it again and names
/// `awp tail -t TH --once`, which shows outbound lines (`awp read` shows only unread inbound
/// ones).
pub fn unacked_failure(body: &Map<String, Value>, wait: Option<Duration>) -> Option<Failure> {
    let wait = wait?;
    if str_field(body, &["status"]) != Some("queued") {
        return None;
    }
    let id = str_field(body, &["id"]).unwrap_or("?");
    let th = str_field(body, &["th"]).unwrap_or("?");
    Some(
        Failure::usage(
            format!(
                "no ack for {id} in {th} within {}",
                humantime::format_duration(wait)
            ),
            format!(
                "it stays queued and goes when the peer is reachable: do not send it again \
                 (`awp tail -t {th} --once` shows it)"
            ),
        )
        .with_code("timeout"),
    )
}

async fn send(ctx: &Ctx, args: &SendArgs) -> Result<(), Failure> {
    let req = send_request(args)?;
    let body = ctx.call(&req).await?;
    if let Some(f) = refused_failure(&body).or_else(|| unacked_failure(&body, args.wait_ack)) {
        if !ctx.json {
            out(&delivery_line(&body))?;
        }
        return Err(f);
    }
    if ctx.json {
        out_json(&Value::Object(body.clone()))?;
    } else {
        out(&delivery_line(&body))?;
    }
    super::blobs::progress(ctx, &body).await
}

async fn state(ctx: &Ctx, args: &StateArgs) -> Result<(), Failure> {
    let (peer, th, st) = args.split();
    let req = Request::State {
        peer: peer.map(str::to_string),
        th: th.to_string(),
        state: st.to_string(),
        note: args.note.clone(),
        wait_ack_ms: millis(args.wait_ack),
    };
    let body = ctx.call(&req).await?;
    if let Some(f) = refused_failure(&body).or_else(|| unacked_failure(&body, args.wait_ack)) {
        if !ctx.json {
            out(&delivery_line(&body))?;
        }
        return Err(f);
    }
    if ctx.json {
        out_json(&Value::Object(body))
    } else {
        out(&delivery_line(&body))
    }
}

fn print_event(ctx: &Ctx, ev: &Event) -> Result<(), Failure> {
    if ctx.json {
        return out_json(&Value::Object(ev.clone()));
    }
    match format::event_line(ev, format::now_ms()) {
        Some(line) => out(&line),
        None => Ok(()),
    }
}

fn stream_ended(ctx: &Ctx, e: Option<ClientError>) -> Failure {
    match e {
        Some(e) => client_failure(&e, &ctx.home),
        None => Failure::new(
            Exit::Failed,
            "the node closed the event stream",
            "check it with `awp status`",
        ),
    }
}

async fn tail(
    ctx: &Ctx,
    once: bool,
    th: Option<String>,
    peer: Option<String>,
) -> Result<(), Failure> {
    let mut sub = ctx
        .subscribe(&Request::Subscribe {
            th,
            peer,
            from_seq: Some(0),
        })
        .await?;
    loop {
        let ev = match sub.next_event().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return Err(stream_ended(ctx, None)),
            Err(e) => return Err(stream_ended(ctx, Some(e))),
        };
        match str_field(&ev, &["event"]) {
            Some("caught_up") if once => return Ok(()),
            Some("line") => print_event(ctx, &ev)?,
            Some("artifact") if ctx.json => super::out_json(&Value::Object(ev))?,
            Some("artifact") => out(&format!(
                "artifact {} {}",
                str_field(&ev, &["th"]).unwrap_or("?"),
                super::artifacts::event_text(ev.get("frame").unwrap_or(&Value::Null))
            ))?,
            _ => {}
        }
    }
}

/// How `awp read` pages: mark what it prints read, print at most `limit` lines (None:
/// all), start after the log seq `after`.
#[derive(Debug, Clone, Copy)]
pub struct ReadOpts {
    pub mark: bool,
    pub limit: Option<u64>,
    pub after: Option<u64>,
}

async fn read(ctx: &Ctx, th: Option<String>, opts: ReadOpts) -> Result<(), Failure> {
    // The node answers in pages and marks read only what it returned; ask again after its
    // `next` cursor while it says `more` (bounded, in case a peer keeps sending), asking
    // for no more lines than are left to print.
    let req = Request::Read {
        th: th.clone(),
        mark: opts.mark,
    };
    let left = |shown: u64| -> Option<usize> {
        opts.limit
            .map(|l| l.saturating_sub(shown).min(control::PAGE_ITEMS as u64) as usize)
    };
    let mut page = control::Page {
        cursor: opts.after.map(|a| a.to_string()),
        limit: left(0),
    };
    let mut shown = 0u64;
    let mut more_after = None;
    for _ in 0..MAX_PAGES {
        let resp = control::request_page(&ctx.socket(), &req, &page)
            .await
            .map_err(|e| client_failure(&e, &ctx.home))?;
        let body = ctx.body(resp)?;
        let entries = field(&body, &["entries", "lines", "unread"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for entry in entries {
            let Value::Object(mut ev) = entry else {
                continue;
            };
            shown += 1;
            if ctx.json {
                out_json(&Value::Object(ev))?;
            } else {
                ev.entry("event").or_insert_with(|| "line".into());
                print_event(ctx, &ev)?;
            }
        }
        let more = body.get("more").and_then(Value::as_bool) == Some(true);
        match str_field(&body, &["next"]) {
            Some(n) if more && page.cursor.as_deref() != Some(n) => {
                if opts.limit.is_some_and(|l| shown >= l) {
                    more_after = Some(n.to_string());
                    break;
                }
                page = control::Page {
                    cursor: Some(n.to_string()),
                    limit: left(shown),
                };
            }
            _ => break,
        }
    }
    if let Some(next) = more_after {
        return if ctx.json {
            out_json(&json!({"more": true, "next": next}))
        } else {
            let th = th.map(|t| format!(" {t}")).unwrap_or_default();
            out(&format!(
                "… more unread lines: `awp read{th} --after {next}` (or --all)"
            ))
        };
    }
    if shown == 0 && !ctx.json {
        return out("no unread lines");
    }
    Ok(())
}

/// Whether an event ends `awp wait`: an inbound line (in `th` when given); with
/// `states`, an inbound state line whose state is listed. A peer's refusal stored in the
/// thread (`t` = `err`) always ends it (and `wait` then exits 1).
pub fn wait_matches(ev: &Event, th: Option<&str>, states: &[String]) -> bool {
    if str_field(ev, &["event"]) != Some("line") || str_field(ev, &["dir"]) != Some("in") {
        return false;
    }
    if th.is_some() && str_field(ev, &["th"]) != th {
        return false;
    }
    if states.is_empty() || str_field(ev, &["t"]) == Some("err") {
        return true;
    }
    let line = ev.get("line").and_then(Value::as_object);
    let is_state =
        str_field(ev, &["t"]).or(line.and_then(|l| str_field(l, &["t"]))) == Some("state");
    let state = line.and_then(|l| str_field(l, &["state"]));
    is_state && state.is_some_and(|s| states.iter().any(|w| w == s))
}

async fn wait(
    ctx: &Ctx,
    th: Option<String>,
    states: Vec<String>,
    timeout: Option<Duration>,
    mark: bool,
) -> Result<(), Failure> {
    let ev = wait_event(ctx, th, &states, timeout).await?;
    // The line is consumed: a following `awp read` (or `awp wait`) does not see it again.
    if let (true, Some(seq)) = (mark, ev.get("seq").and_then(Value::as_u64)) {
        ctx.call_running(&Request::MarkRead { seqs: vec![seq] })
            .await?;
    }
    print_event(ctx, &ev)?;
    if str_field(&ev, &["t"]) == Some("err") {
        return Err(peer_err_failure(&ev));
    }
    Ok(())
}

/// The `line` event that ends `awp wait` (see [`wait_matches`]; `th` is `TH` or
/// `PEER/TH`, resolved by the node): an unread one already stored, else the next one to
/// arrive. Nothing is marked read. After `timeout` (None: no limit), a usage failure
/// `timed out after DUR waiting for an inbound line`; without a node, exit 3.
pub(crate) async fn wait_event(
    ctx: &Ctx,
    th: Option<String>,
    states: &[String],
    timeout: Option<Duration>,
) -> Result<Event, Failure> {
    let mut sub = ctx
        .subscribe(&Request::Subscribe {
            th,
            peer: None,
            from_seq: Some(0),
        })
        .await?;
    // History first: an unread matching line that is already here counts (no race between
    // arrival and the start of `wait`); after `caught_up`, any new matching line.
    let mut live = false;
    let waiting = async {
        loop {
            match sub.next_event().await {
                Ok(Some(ev)) if str_field(&ev, &["event"]) == Some("caught_up") => live = true,
                Ok(Some(ev))
                    // The node filters by thread (it resolves `TH` and `PEER/TH`).
                    if wait_matches(&ev, None, states)
                        && (live || ev.get("read").and_then(Value::as_bool) == Some(false)) =>
                {
                    return Ok(ev)
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err(stream_ended(ctx, None)),
                Err(e) => return Err(stream_ended(ctx, Some(e))),
            }
        }
    };
    let ev = match timeout {
        None => waiting.await?,
        Some(d) => match tokio::time::timeout(d, waiting).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Failure::usage(
                    format!(
                        "timed out after {} waiting for an inbound line",
                        humantime::format_duration(d)
                    ),
                    "retry with a longer --timeout",
                )
                .with_code("timeout"))
            }
        },
    };
    Ok(ev)
}

/// The failure of `awp wait` ended by a peer's refusal (a `line` event with `t` = `err`):
/// exit 1, the peer's err code as the code.
fn peer_err_failure(ev: &Event) -> Failure {
    let line = ev.get("line").and_then(Value::as_object);
    let get = |k: &str| line.and_then(|l| str_field(l, &[k]));
    let code = get("code").unwrap_or("refused");
    let re = get("re").unwrap_or("?");
    let th = str_field(ev, &["th"]).unwrap_or("?");
    let who = str_field(ev, &["peer_name", "peer"]).unwrap_or("the peer");
    let what = match get("detail") {
        Some(d) => format!("{who} refused {re} in {th}: {code}: {d}"),
        None => format!("{who} refused {re} in {th}: {code}"),
    };
    let hint = format!("see the thread with `awp tail --once -t {th}`");
    Failure::new(Exit::Failed, what, hint).with_code(code)
}

async fn list(ctx: &Ctx, req: Request, key: &str) -> Result<(), Failure> {
    let now = format::now_ms();
    let items = ctx.call_all(&req, key).await?;
    let items = match key {
        "threads" => format::recent_first(items),
        _ => items,
    };
    show_list(ctx, items, key, |items| match key {
        "threads" => format::threads_table(items, now),
        _ => format::peers_table(items, now),
    })
}

/// A listing answered as `{KEY: [objects]}` in pages: every page, then one JSON object
/// per line with `--json`, else `render`'s table, or `no KEY yet`.
pub(super) async fn list_with(
    ctx: &Ctx,
    req: &Request,
    key: &str,
    render: impl FnOnce(&[Value]) -> String,
) -> Result<(), Failure> {
    let items = ctx.call_all(req, key).await?;
    show_list(ctx, items, key, render)
}

fn show_list(
    ctx: &Ctx,
    items: Vec<Value>,
    key: &str,
    render: impl FnOnce(&[Value]) -> String,
) -> Result<(), Failure> {
    if ctx.json {
        for item in &items {
            out_json(item)?;
        }
        return Ok(());
    }
    if items.is_empty() {
        return out(&format!("no {key} yet"));
    }
    out(&render(&items))
}

async fn status(ctx: &Ctx) -> Result<(), Failure> {
    let body = status_body(ctx).await?;
    if ctx.json {
        out_json(&Value::Object(body))
    } else {
        out(&format::key_values(&body))
    }
}

/// The node's status (`awp status`); without a node, exit 3 `no node running on HOME`.
pub(crate) async fn status_body(ctx: &Ctx) -> Result<Map<String, Value>, Failure> {
    match control::request(&ctx.socket(), &Request::Status).await {
        Err(ClientError::NotRunning { .. }) => Err(Failure::new(
            Exit::NoNode,
            format!("no node running on {}", ctx.home.display()),
            super::start_hint(&ctx.home),
        )),
        Err(e) => Err(client_failure(&e, &ctx.home)),
        Ok(resp) => ctx.body(resp),
    }
}

async fn whoami(ctx: &Ctx) -> Result<(), Failure> {
    // A running node knows its name too; without one, the identity file is enough.
    let from_node =
        control::request_with_timeout(&ctx.socket(), &Request::Whoami, Duration::from_secs(5))
            .await;
    let body = match from_node {
        Ok(resp) if resp.ok => resp.body,
        _ => {
            let id = crate::identity::Identity::load_or_create(&ctx.home).map_err(|e| {
                Failure::new(
                    Exit::Failed,
                    e.to_string(),
                    "check the home directory and identity.json",
                )
            })?;
            let key = id.key();
            let mut m = Map::new();
            m.insert("key".into(), key.to_string().into());
            m.insert("fingerprint".into(), key.fingerprint().into());
            m
        }
    };
    if ctx.json {
        out_json(&Value::Object(body))
    } else {
        out(&format::key_values(&body))
    }
}

fn version(ctx: &Ctx) -> Result<(), Failure> {
    let v = env!("CARGO_PKG_VERSION");
    if ctx.json {
        out_json(&json!({"version": v, "protocol": "awp/0"}))
    } else {
        out(&format!("awp {v} (protocol AWP v0)"))
    }
}
