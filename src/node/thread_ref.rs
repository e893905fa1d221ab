//! Threads named on the control socket. A thread is (peer, th): two peers may use the same
//! thread id, each for its own thread with us (`store/threads.rs`). The CLI names one as
//!
//! - `TH` alone, when exactly one peer has a thread of that id;
//! - `TH` with a peer (the peer argument or flag: `awp send PEER -t TH`, `tail -p PEER -t TH`);
//! - `PEER/TH`, PEER being anything a peer argument accepts (key, key prefix, name).
//!
//! A `TH` that several peers use is refused as `ambiguous_thread`, naming them, never
//! resolved to one of them at random. An id that itself contains `/` and exists is taken
//! as an id first.

use super::server::{internal, resolve_peer, Fail};
use super::Inner;
use crate::store::ThreadInfo;
use crate::wire::PeerKey;

/// Most peers an `ambiguous_thread` message names.
const AMBIGUOUS_SHOWN: usize = 8;

/// A thread named by the user: its peer and id, and its record when it exists.
#[derive(Debug)]
pub(super) struct Named {
    pub(super) peer: PeerKey,
    pub(super) th: String,
    pub(super) info: Option<ThreadInfo>,
}

/// Resolve `text` (`TH` or `PEER/TH`), with `peer` when one was given. `Ok(None)`: no
/// thread matches and no peer is named (a thread that does not exist yet, of any peer).
pub(super) fn resolve(
    inner: &Inner,
    peer: Option<PeerKey>,
    text: &str,
) -> Result<Option<Named>, Fail> {
    if let Some(p) = peer {
        let info = inner.store.thread_with(&p, text).map_err(internal)?;
        return Ok(Some(Named {
            peer: p,
            th: text.to_string(),
            info,
        }));
    }
    let mut named = inner.store.threads_named(text).map_err(internal)?;
    match named.len() {
        0 => {}
        1 => {
            let t = named.remove(0);
            return Ok(Some(Named {
                peer: t.peer,
                th: t.th.clone(),
                info: Some(t),
            }));
        }
        n => return Err(ambiguous(inner, text, &named, n)),
    }
    let Some((p, th)) = text.split_once('/') else {
        return Ok(None);
    };
    let p = match resolve_peer(inner, p) {
        Ok(p) => p,
        Err(f) if f.code() == "no_such_peer" => return Ok(None),
        Err(f) => return Err(f),
    };
    let info = inner.store.thread_with(&p, th).map_err(internal)?;
    Ok(Some(Named {
        peer: p,
        th: th.to_string(),
        info,
    }))
}

fn ambiguous(inner: &Inner, th: &str, threads: &[ThreadInfo], n: usize) -> Fail {
    let mut list: Vec<String> = threads
        .iter()
        .take(AMBIGUOUS_SHOWN)
        .map(|t| {
            let name = inner
                .peer_name(&t.peer)
                .map_or("?".into(), |n| crate::control::shown(&n));
            format!("{name} ({})", &t.peer.to_string()[..16])
        })
        .collect();
    if n > AMBIGUOUS_SHOWN {
        list.push(format!("and {} more", n - AMBIGUOUS_SHOWN));
    }
    let th = crate::control::shown(th);
    Fail::new(
        "ambiguous_thread",
        format!("{n} peers have a thread {th:?}: {}", list.join(", ")),
    )
    .hint(format!(
        "name the peer too: PEER/{th} (PEER: a name or key prefix), or the peer argument or -p"
    ))
}
