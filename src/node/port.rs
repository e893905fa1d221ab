//! The listening port a home keeps across restarts (usability #1).
//!
//! A node that picks its port (the default `tls:0.0.0.0:7700` when 7700 is taken, or a
//! `--listen` address with port 0) remembers the port it got in the store's meta
//! (`node/port/<i>/<spec>`), and binds the same port on later starts: peers keep a working
//! address. When the remembered port is taken, the node picks another one, remembers that,
//! and says so ([`Bound::notice`], shown by `awp up`, `awp status` and the `listening`
//! event). A `--listen` address with an explicit port is bound as given, or the start fails.

use super::{StartError, DEFAULT_PORT};
use crate::net::{self, Address, DialOptions, TlsConfig};
use crate::store::Store;

/// A listener bound for one listen spec.
pub(super) struct Bound {
    /// The listener.
    pub listener: net::Listener,
    /// Said to the user when the node did not get the port it wanted (the default 7700, or
    /// the one remembered from earlier starts).
    pub notice: Option<String>,
}

/// The port of a `tls:`/`tcp:` address (None for other schemes).
fn port_of(a: &Address) -> Option<u16> {
    match a {
        Address::Tls { port, .. } | Address::Tcp { port, .. } => Some(*port),
        _ => None,
    }
}

/// `a` with another port (other schemes unchanged).
fn with_port(a: &Address, p: u16) -> Address {
    match a.clone() {
        Address::Tls { host, pin, .. } => Address::Tls { host, port: p, pin },
        Address::Tcp { host, .. } => Address::Tcp { host, port: p },
        other => other,
    }
}

fn meta_key(index: usize, spec: &str) -> String {
    format!("node/port/{index}/{spec}")
}

fn remembered(store: &Store, key: &str) -> Option<u16> {
    let bytes = store.meta_get(key).ok().flatten()?;
    std::str::from_utf8(&bytes).ok()?.parse().ok()
}

fn remember(store: &Store, key: &str, port: u16) -> Result<(), StartError> {
    store
        .meta_put(key, port.to_string().as_bytes())
        .and_then(|()| store.flush_blocking())
        .map_err(|e| StartError::Other(format!("store: {e}")))
}

/// The listen address of a node given none: `tls:0.0.0.0:7700`.
pub(super) fn default_listen() -> Address {
    Address::Tls {
        host: "0.0.0.0".into(),
        port: DEFAULT_PORT,
        pin: None,
    }
}

/// Bind listen spec number `index`: `spec`, or (None) `default` ([`default_listen`];
/// tests pass a loopback one), whose port is preferred, not required.
///
/// - An explicit port is bound as given (errors: the bind error).
/// - Port 0, or the default: the port remembered for this spec, else the default's port
///   (else any free port); when that one is taken, any free port. The port got is
///   remembered for later starts.
pub(super) async fn bind(
    store: &Store,
    index: usize,
    spec: Option<&Address>,
    default: &Address,
    tls: &TlsConfig,
    opts: &DialOptions,
) -> Result<Bound, StartError> {
    let want = spec.unwrap_or(default);
    let preferred = port_of(default).unwrap_or(DEFAULT_PORT);
    let picks = spec.is_none() || port_of(want) == Some(0);
    let failed = |a: &Address, e: net::NetError| StartError::Other(format!("listen on {a}: {e}"));
    if !picks {
        let listener = net::Listener::bind(want, tls, opts)
            .await
            .map_err(|e| failed(want, e))?;
        return Ok(Bound {
            listener,
            notice: None,
        });
    }
    // The default is remembered under the spec `default`: a node started later with the
    // same (no) options finds it.
    let key = match spec {
        Some(a) => meta_key(index, &a.to_string()),
        None => meta_key(index, "default"),
    };
    let before = remembered(store, &key);
    let first = before.or(spec.is_none().then_some(preferred));
    if let Some(p) = first {
        if let Ok(listener) = net::Listener::bind(&with_port(want, p), tls, opts).await {
            if before.is_none() {
                remember(store, &key, p)?;
            }
            let notice = (spec.is_none() && p != preferred).then(|| {
                format!(
                    "listening on port {p}, not {preferred}: {preferred} was taken when this \
                     home first started, and the port it got is kept so peers can find it \
                     (pass --listen to choose)"
                )
            });
            return Ok(Bound { listener, notice });
        }
    }
    let any = with_port(want, 0);
    let listener = net::Listener::bind(&any, tls, opts)
        .await
        .map_err(|e| failed(&any, e))?;
    let got = port_of(&listener.local_address()).unwrap_or(0);
    remember(store, &key, got)?;
    let notice = match (before, first) {
        (Some(p), _) => Some(format!(
            "port {p} (used by this home before) is taken: listening on {got} instead, \
             remembered for later starts; peers learn it when this node connects to them"
        )),
        (None, Some(p)) => Some(format!(
            "port {p} is taken: listening on {got} instead, remembered for later starts \
             (pass --listen to choose)"
        )),
        (None, None) => None,
    };
    Ok(Bound { listener, notice })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    fn setup() -> (tempfile::TempDir, Store, TlsConfig) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(&dir.path().join("db"), &dir.path().join("q")).unwrap();
        let tls = TlsConfig::new(&Identity::generate()).unwrap();
        (dir, store, tls)
    }

    fn port(b: &Bound) -> u16 {
        port_of(&b.listener.local_address()).unwrap()
    }

    /// Usability #1: a `:0` listener gets the same port on the next start, and a new one
    /// (with a notice, remembered) when that port is taken.
    #[tokio::test]
    async fn a_picked_port_is_kept_across_starts_and_changes_only_with_a_notice() {
        let (_d, store, tls) = setup();
        let opts = DialOptions::default();
        let spec: Address = "tls:127.0.0.1:0".parse().unwrap();
        let dflt = default_listen();
        let first = bind(&store, 0, Some(&spec), &dflt, &tls, &opts)
            .await
            .unwrap();
        let p = port(&first);
        assert!(first.notice.is_none());
        drop(first);
        let again = bind(&store, 0, Some(&spec), &dflt, &tls, &opts)
            .await
            .unwrap();
        assert_eq!(port(&again), p, "the remembered port");
        assert!(again.notice.is_none());
        // Someone else holds it while the node is down.
        let taken = again;
        let moved = bind(&store, 0, Some(&spec), &dflt, &tls, &opts)
            .await
            .unwrap();
        let q = port(&moved);
        assert_ne!(q, p);
        let notice = moved.notice.clone().unwrap();
        assert!(
            notice.contains(&format!("port {p}")) && notice.contains(&q.to_string()),
            "{notice}"
        );
        drop((taken, moved));
        let later = bind(&store, 0, Some(&spec), &dflt, &tls, &opts)
            .await
            .unwrap();
        assert_eq!(port(&later), q, "the new port is the one remembered");
    }

    /// An explicit port is bound as given: taken is an error, not another port.
    #[tokio::test]
    async fn an_explicit_port_is_never_replaced() {
        let (_d, store, tls) = setup();
        let opts = DialOptions::default();
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = holder.local_addr().unwrap().port();
        let spec: Address = format!("tls:127.0.0.1:{p}").parse().unwrap();
        let dflt = default_listen();
        let err = match bind(&store, 0, Some(&spec), &dflt, &tls, &opts).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("bound a taken port"),
        };
        assert!(
            err.contains(&format!("listen on tls:127.0.0.1:{p}")),
            "{err}"
        );
    }

    /// Usability #1: with the default port taken, the node says so, and keeps the port it
    /// got on later starts (with a notice each time that it is not the default).
    #[tokio::test]
    async fn a_taken_default_port_is_said_and_the_port_got_is_kept() {
        let (_d, store, tls) = setup();
        let opts = DialOptions::default();
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let held = holder.local_addr().unwrap().port();
        let dflt: Address = format!("tls:127.0.0.1:{held}").parse().unwrap();
        let first = bind(&store, 0, None, &dflt, &tls, &opts).await.unwrap();
        let p = port(&first);
        assert_ne!(p, held);
        let notice = first.notice.clone().unwrap();
        assert!(
            notice.starts_with(&format!("port {held} is taken: listening on {p}")),
            "{notice}"
        );
        drop(first);
        drop(holder);
        // The default port is free again: the home keeps the port its peers know.
        let again = bind(&store, 0, None, &dflt, &tls, &opts).await.unwrap();
        assert_eq!(port(&again), p);
        assert!(again.notice.unwrap().contains(&format!("not {held}")));
    }
}
