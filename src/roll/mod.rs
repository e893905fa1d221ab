//! `awp roll --peer PEER`: a Roll Runtime Protocol v1 front. Any Roll client (an agent UI)
//! drives the agent behind PEER, on another host, through this node, without knowing AWP.
//!
//! Transport: JSON-RPC 2.0 over stdio, one JSON object per `\n`-terminated line (NDJSON),
//! at most [`rpc::MAX_FRAME_BYTES`] per request. The seed names no other transport.
//!
//! The front is a client of the local node, like every CLI verb: it queues `msg` and
//! `state` lines with control `send` / `state` requests and follows the peer's lines with a
//! control `subscribe` from the last log seq it applied, so it never misses a line across
//! restarts of itself or of the node. Its own state (thread mapping, turns, approvals,
//! cursor) is one file per peer in `$AWP_HOME/roll/` ([`store`]).
//!
//! Layout: [`rpc`] (frames, params, errors), [`front`] (the runtime core: requests and
//! lines in, responses and events out), [`node`] (the control-socket client), [`store`]
//! (the state file). The mapping and the error codes: `spec/roll-front.md`.

pub mod front;
pub mod node;
pub mod rpc;
pub mod store;

#[cfg(test)]
mod tests;

use crate::control::{self, ClientError, Event, Request};
use front::Front;
use node::ControlNode;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Responses and notifications waiting for the client, at most; a client that lets more
/// pile up is stuck, and the front ends (the node is never held up by it).
pub const OUT_QUEUE: usize = 4096;
/// Node events read ahead of the runtime, at most (the subscription pauses beyond it; the
/// node then drops it as lagged and the front resubscribes from its cursor).
pub const EVENT_QUEUE: usize = 1024;
/// How long the front keeps answering RUNTIME_CLOSING after SIGTERM/SIGINT before it exits.
pub const CLOSING_GRACE: Duration = Duration::from_secs(2);

/// One frame read from the client.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// A line without its `\n` (a trailing `\r` is kept: JSON allows it as whitespace).
    Line(Vec<u8>),
    /// A line longer than [`rpc::MAX_FRAME_BYTES`], skipped up to its `\n`.
    TooLarge,
}

/// Read one frame, never buffering more than the cap plus one byte; `None` at the end.
pub async fn read_frame<R: AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<Option<Input>> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    let n = (&mut *r)
        .take(rpc::MAX_FRAME_BYTES as u64 + 1)
        .read_until(b'\n', &mut buf)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        return Ok(Some(Input::Line(buf)));
    }
    if buf.len() <= rpc::MAX_FRAME_BYTES {
        // The last line, without a newline.
        return Ok(Some(Input::Line(buf)));
    }
    // Too long: skip to the end of the line, a bounded piece at a time.
    loop {
        let mut skip = Vec::new();
        let n = (&mut *r)
            .take(64 * 1024)
            .read_until(b'\n', &mut skip)
            .await?;
        if n == 0 || skip.last() == Some(&b'\n') {
            return Ok(Some(Input::TooLarge));
        }
    }
}

/// What the node side tells the runtime.
enum NodeMsg {
    Event(Event),
    CaughtUp,
    /// The subscription ended (node stopped or dropped us); resubscribing.
    Lost(String),
}

/// Follow the peer's lines from `cursor` on, forever: resubscribe (backoff 100 ms to
/// 2 s) whenever the node goes away or drops us as lagged.
async fn follow(
    socket: std::path::PathBuf,
    peer: String,
    cursor: std::sync::Arc<std::sync::atomic::AtomicU64>,
    tx: mpsc::Sender<NodeMsg>,
) {
    use std::sync::atomic::Ordering;
    let mut backoff = Duration::from_millis(100);
    loop {
        let req = Request::Subscribe {
            th: None,
            peer: Some(peer.clone()),
            from_seq: Some(cursor.load(Ordering::Acquire)),
        };
        let why = match control::subscribe(&socket, &req).await {
            Err(e) => e.to_string(),
            Ok(mut sub) => {
                backoff = Duration::from_millis(100);
                loop {
                    match sub.next_event().await {
                        Ok(Some(ev)) => {
                            let kind = ev.get("event").and_then(Value::as_str).unwrap_or("");
                            let msg = match kind {
                                "line" => NodeMsg::Event(ev),
                                "caught_up" => NodeMsg::CaughtUp,
                                // Dropped by the node: resubscribe from the cursor.
                                "lagged" => break,
                                _ => continue,
                            };
                            if tx.send(msg).await.is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!("roll: subscription ended: {e}");
                            break;
                        }
                    }
                }
                "the node ended the subscription".to_string()
            }
        };
        if tx.send(NodeMsg::Lost(why)).await.is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Why the front stopped.
#[derive(Debug, thiserror::Error)]
pub enum RollExit {
    /// `--peer` names no single known peer.
    #[error(transparent)]
    Peer(#[from] node::ResolveError),
    /// The state file could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The client stopped reading (its queue is full) or its pipe broke.
    #[error("the Roll client stopped reading: {0}")]
    Client(String),
    /// The node could not be followed.
    #[error("{0}")]
    Node(String),
}

/// Run the front for `peer` on the node of `home`, speaking on `input` / `output` until
/// `input` ends (or SIGTERM/SIGINT plus [`CLOSING_GRACE`]).
pub async fn run<R, W>(home: &Path, peer: &str, input: R, output: W) -> Result<(), RollExit>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let node = ControlNode {
        socket: crate::daemon::socket_path(home),
    };
    let info = node::resolve_peer(&node, peer).await?;
    let (file, saved) = store::StateFile::open(home, &info.key)?;
    let mut front = Front::new(node.clone(), file, saved, &info.name);
    let cursor = Arc::new(AtomicU64::new(front.cursor()));

    let (ev_tx, mut ev_rx) = mpsc::channel(EVENT_QUEUE);
    let follower = tokio::spawn(follow(
        node.socket.clone(),
        info.key.clone(),
        cursor.clone(),
        ev_tx,
    ));
    let _abort = AbortOnDrop(follower);

    // Catch up with what happened while no front ran, before the first request.
    loop {
        match ev_rx.recv().await {
            Some(NodeMsg::Event(ev)) => apply(&mut front, &ev, &cursor)?,
            Some(NodeMsg::CaughtUp) => break,
            Some(NodeMsg::Lost(why)) => {
                return Err(RollExit::Node(format!("cannot follow the node: {why}")))
            }
            None => return Err(RollExit::Node("the node follower stopped".into())),
        }
    }
    cursor.store(front.cursor(), Ordering::Release);

    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let writer = tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = out_rx.recv().await {
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                return;
            }
        }
    });
    let (in_tx, mut in_rx) = mpsc::channel::<Input>(16);
    let reader = tokio::spawn(async move {
        let mut input = BufReader::new(input);
        while let Ok(Some(frame)) = read_frame(&mut input).await {
            if in_tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let _abort_reader = AbortOnDrop(reader);

    let mut closing_until: Option<tokio::time::Instant> = None;
    let stop = shutdown_signal();
    tokio::pin!(stop);
    let result = loop {
        let grace = async {
            match closing_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            frame = in_rx.recv() => match frame {
                None => break Ok(()),
                Some(Input::Line(l)) => front.handle_frame(&l).await,
                Some(Input::TooLarge) => front.frame_too_large(),
            },
            msg = ev_rx.recv() => match msg {
                Some(NodeMsg::Event(ev)) => {
                    if let Err(e) = apply(&mut front, &ev, &cursor) {
                        break Err(e);
                    }
                }
                Some(NodeMsg::CaughtUp) => {}
                Some(NodeMsg::Lost(why)) => tracing::info!("roll: following the node again ({why})"),
                None => break Err(RollExit::Node("the node follower stopped".into())),
            },
            _ = &mut stop, if closing_until.is_none() => {
                front.begin_closing();
                closing_until = Some(tokio::time::Instant::now() + CLOSING_GRACE);
            }
            _ = grace => break Ok(()),
        }
        if let Err(e) = flush(&mut front, &out_tx) {
            break Err(e);
        }
    };
    let _ = flush(&mut front, &out_tx);
    drop(out_tx);
    let _ = writer.await;
    result
}

fn apply<N: node::NodeApi>(
    front: &mut Front<N>,
    ev: &Event,
    cursor: &std::sync::atomic::AtomicU64,
) -> Result<(), RollExit> {
    front
        .apply(ev)
        .map_err(|e| RollExit::Node(e.message.clone()))?;
    cursor.store(front.cursor(), std::sync::atomic::Ordering::Release);
    Ok(())
}

fn flush<N: node::NodeApi>(
    front: &mut Front<N>,
    out: &mpsc::Sender<Vec<u8>>,
) -> Result<(), RollExit> {
    for v in front.take_output() {
        let mut line = crate::wire::separators::escape_separators_str(v.to_string()).into_bytes();
        line.push(b'\n');
        out.try_send(line).map_err(|e| {
            RollExit::Client(match e {
                mpsc::error::TrySendError::Full(_) => {
                    format!("more than {OUT_QUEUE} lines unread")
                }
                mpsc::error::TrySendError::Closed(_) => "output closed".into(),
            })
        })?;
    }
    Ok(())
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// `awp roll --peer PEER` on stdio: the exit code's failure, if any.
pub async fn cli(ctx: &crate::cli::Ctx, peer: &str) -> Result<(), crate::cli::Failure> {
    use crate::cli::{Exit, Failure};
    match run(&ctx.home, peer, tokio::io::stdin(), tokio::io::stdout()).await {
        Ok(()) => Ok(()),
        Err(RollExit::Peer(node::ResolveError::Client(ClientError::NotRunning { .. }))) => {
            Err(Failure::new(
                Exit::NoNode,
                "no node running",
                crate::cli::start_hint(&ctx.home),
            )
            .with_code("no_node"))
        }
        Err(RollExit::Peer(e @ node::ResolveError::NoSuchPeer(_))) => Err(Failure::usage(
            e.to_string(),
            "list known peers with `awp peers`, or dial one with `awp connect ADDRESS`",
        )
        .with_code("no_such_peer")),
        Err(RollExit::Peer(e @ node::ResolveError::Ambiguous(_))) => Err(Failure::usage(
            e.to_string(),
            "give more characters of the key, or the full key",
        )
        .with_code("ambiguous_peer")),
        Err(RollExit::Store(e @ store::StoreError::Locked(_))) => Err(Failure::usage(
            e.to_string(),
            "stop the other `awp roll` first",
        )),
        Err(e) => Err(Failure::new(
            Exit::Failed,
            e.to_string(),
            format!("see {}", ctx.home.join(crate::daemon::LOG_FILE).display()),
        )),
    }
}
