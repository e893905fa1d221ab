//! Redialing peers (protocol-notes §Liveness and close), limited so that a stranger cannot
//! turn this node into a dialing amplifier:
//!
//! - Only peers we have a reason to reach are dialed ([`DialReason`]): lines of ours are
//!   queued for it, it has an open thread that we opened, it is trusted or allowed, or the
//!   user dialed it. A thread a stranger opened does not make us dial it back.
//! - Jittered exponential backoff from 1 s, doubling to a 60 s cap. The protocol's "no
//!   give-up" holds for trusted, allowed and user-dialed peers; any other peer is given up
//!   after [`MAX_DIAL_FAILURES`] failed rounds in a row, until new outbound traffic for it
//!   is queued (that wakes the dialer and resets the count).
//! - Dials to one destination (address without its key pin) are rate limited across all
//!   peers ([`DestLimiter`]: at most [`DialTiming::per_destination`] per
//!   [`DialTiming::destination_window`]), so many keys naming one address cannot flood it;
//!   peers with a lasting reason (trusted, allowed, dialed by the user) are exempt.
//! - Addresses learned only from the peer's `hello.addr` are tried after a 15 s grace, so
//!   the original dialer goes first.
//!
//! The decisions ([`DialReason::from_facts`], [`Redial`], [`DestLimiter`]) are pure and take
//! the time as an argument; [`run`] does the I/O.

use super::conn::{self, Dial};
use super::Inner;
use crate::net::{self, Address};
use crate::store::AddrSource;
use crate::wire::PeerKey;
use rand::Rng;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// First backoff step.
pub const BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Backoff cap.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Grace before dialing an address known only from hello.addr.
pub const HELLO_ADDR_GRACE: Duration = Duration::from_secs(15);

/// The next backoff after `current`: doubled, capped at [`BACKOFF_MAX`].
pub fn next_backoff(current: Duration) -> Duration {
    (current * 2).min(BACKOFF_MAX)
}

/// `base` with ±20 % jitter.
pub fn jittered(base: Duration) -> Duration {
    let f: f64 = rand::thread_rng().gen_range(0.8..1.2);
    base.mul_f64(f)
}

/// How the dialer paces itself. Tests shorten these; the defaults are the protocol's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DialTiming {
    /// First backoff step (default `BACKOFF_MIN`, 1 s).
    pub backoff_min: Duration,
    /// Backoff cap (default `BACKOFF_MAX`, 60 s).
    pub backoff_max: Duration,
    /// Grace before dialing an address known only from hello.addr (default 15 s).
    pub hello_grace: Duration,
    /// Most dials to one destination per [`DialTiming::destination_window`] (default 6).
    pub per_destination: usize,
    /// The window of [`DialTiming::per_destination`] (default 60 s).
    pub destination_window: Duration,
}

impl Default for DialTiming {
    fn default() -> Self {
        DialTiming {
            backoff_min: BACKOFF_MIN,
            backoff_max: BACKOFF_MAX,
            hello_grace: HELLO_ADDR_GRACE,
            per_destination: DEST_DIALS,
            destination_window: DEST_WINDOW,
        }
    }
}

/// Failed dial rounds in a row after which a peer without a lasting reason
/// ([`DialReason::persistent`]) is given up until new outbound traffic for it.
pub const MAX_DIAL_FAILURES: u32 = 8;
/// Default of [`DialTiming::per_destination`].
pub const DEST_DIALS: usize = 6;
/// Default of [`DialTiming::destination_window`].
pub const DEST_WINDOW: Duration = Duration::from_secs(60);
/// Most destinations remembered by [`DestLimiter`]; the oldest are forgotten first.
pub const DEST_REMEMBERED: usize = 4096;

/// Why we dial a peer that has work pending, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DialReason {
    /// The operator lists it in `trust` or `allow`.
    Trusted,
    /// The user dialed it (`awp connect`, an address of source `connect`).
    UserDialed,
    /// Lines of ours wait in its outbox.
    Queued,
    /// An open thread with it that we opened.
    OpenedByUs,
}

/// What [`DialReason::from_facts`] looks at for one peer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DialFacts {
    /// Listed in `trust` or `allow`.
    pub trusted: bool,
    /// Has an address the user gave (`awp connect`).
    pub user_dialed: bool,
    /// Lines of ours wait in its outbox.
    pub queued: bool,
    /// Has an open thread (whoever opened it).
    pub open_thread: bool,
    /// Has an open thread that we opened.
    pub open_thread_ours: bool,
    /// We publish presence (`--presence`) and the peer's hello caps list `presence`: our
    /// document is work for it, as long as the operator chose the peer (trusted or
    /// user-dialed; a relay joined with `awp connect` stays joined).
    pub presence: bool,
}

impl DialReason {
    /// The rule. There must be work (queued lines, an open thread, or our presence
    /// document for a presence peer), and a reason to reach this peer for it: it is trusted
    /// or allowed, the user dialed it, the lines are ours, or we opened the thread (presence
    /// alone counts only for the first two). None: do not dial (e.g. a stranger whose only
    /// link is a thread it opened here).
    pub fn from_facts(f: DialFacts) -> Option<DialReason> {
        if !(f.queued || f.open_thread || f.presence) {
            None
        } else if f.trusted {
            Some(DialReason::Trusted)
        } else if f.user_dialed {
            Some(DialReason::UserDialed)
        } else if !(f.queued || f.open_thread) {
            None
        } else if f.queued {
            Some(DialReason::Queued)
        } else if f.open_thread_ours {
            Some(DialReason::OpenedByUs)
        } else {
            None
        }
    }

    /// Whether the protocol's "never give up" applies (trusted or user-dialed peers).
    pub fn persistent(self) -> bool {
        matches!(self, DialReason::Trusted | DialReason::UserDialed)
    }
}

/// One peer's redial state: backoff and failed rounds in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redial {
    timing: DialTiming,
    backoff: Duration,
    failures: u32,
}

impl Redial {
    /// Fresh: first step, no failures.
    pub fn new(timing: DialTiming) -> Redial {
        Redial {
            timing,
            backoff: timing.backoff_min,
            failures: 0,
        }
    }

    /// The pause after the current round (before jitter).
    pub fn backoff(&self) -> Duration {
        self.backoff
    }

    /// Failed rounds in a row.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A round dialed at least once and nothing came up: double the backoff (capped).
    pub fn failed(&mut self) {
        self.failures = self.failures.saturating_add(1);
        self.backoff = next_backoff(self.backoff).min(self.timing.backoff_max);
    }

    /// A connection came up: start over.
    pub fn up(&mut self) {
        self.failures = 0;
        self.backoff = self.timing.backoff_min;
    }

    /// New outbound traffic was queued: try again soon, from the first step.
    pub fn new_traffic(&mut self) {
        self.up();
    }

    /// Whether to stop dialing a peer with this reason (None: no reason at all).
    pub fn gave_up(&self, reason: Option<DialReason>) -> bool {
        match reason {
            None => true,
            Some(r) if r.persistent() => false,
            Some(_) => self.failures >= MAX_DIAL_FAILURES,
        }
    }
}

/// Dials per destination in a sliding window, across all peers (a destination is an
/// address without its key pin: many keys may name one address).
#[derive(Debug)]
pub struct DestLimiter {
    max: usize,
    window: Duration,
    recent: HashMap<String, VecDeque<Instant>>,
}

impl DestLimiter {
    /// At most `max` dials per `window` to one destination.
    pub fn new(max: usize, window: Duration) -> DestLimiter {
        DestLimiter {
            max,
            window,
            recent: HashMap::new(),
        }
    }

    /// Record a dial to `dest` at `now` and return true, or return false when `dest` had
    /// `max` dials within the window before `now`.
    pub fn try_dial(&mut self, dest: &str, now: Instant) -> bool {
        let window = self.window;
        if !self.recent.contains_key(dest) && self.recent.len() >= DEST_REMEMBERED {
            // Forget destinations whose window has passed; if none, the one dialed longest ago.
            self.recent
                .retain(|_, q| q.back().is_some_and(|t| now.duration_since(*t) < window));
            if self.recent.len() >= DEST_REMEMBERED {
                let oldest = self
                    .recent
                    .iter()
                    .min_by_key(|(_, q)| q.back().copied())
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.recent.remove(&k);
                }
            }
        }
        let q = self.recent.entry(dest.to_string()).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= window) {
            q.pop_front();
        }
        if q.len() >= self.max {
            return false;
        }
        q.push_back(now);
        true
    }
}

/// The destination of an address for [`DestLimiter`]: its text without the key pin.
pub fn destination(addr: &Address) -> String {
    let s = addr.to_string();
    // A circuit's destination is its far end: peers behind one relay do not share a limit
    // (the relay limits circuits itself).
    if addr.is_relay() {
        return s;
    }
    match s.split_once('#') {
        Some((d, _)) => d.to_string(),
        None => s,
    }
}

/// Thread states after which a thread no longer keeps a connection wanted.
const TERMINAL: &[&str] = &["done", "failed", "closed"];

/// Peers we have a reason to dial at start: queued lines, open threads, or (when we
/// publish presence) presence peers (each is then judged by [`reason`]).
pub(super) fn wanted_peers(inner: &Inner) -> Vec<PeerKey> {
    let mut out = inner.store.outbox_peers().unwrap_or_default();
    if let Ok(threads) = inner.store.threads() {
        for t in threads {
            if is_open(t.mine.as_deref(), t.theirs.as_deref()) && !out.contains(&t.peer) {
                out.push(t.peer);
            }
        }
    }
    if inner.presence.publish {
        for p in inner.store.peers().unwrap_or_default() {
            if p.caps.iter().any(|c| c == super::presence::CAP) && !out.contains(&p.key) {
                out.push(p.key);
            }
        }
    }
    out.retain(|p| reason(inner, p).is_some());
    out
}

fn is_open(mine: Option<&str>, theirs: Option<&str>) -> bool {
    let term = |s: Option<&str>| s.is_some_and(|s| TERMINAL.contains(&s));
    !(term(mine) || term(theirs))
}

/// Why we would dial `peer` now (None: no reason, or it said bye).
pub(super) fn reason(inner: &Inner, peer: &PeerKey) -> Option<DialReason> {
    let record = inner.store.peer(peer).ok().flatten();
    if record.as_ref().is_some_and(|p| p.parked) {
        return None;
    }
    let s = &inner.settings;
    let trusted = s.trust.contains(peer) || s.allow.contains(peer);
    let user_dialed = inner
        .store
        .addresses(peer)
        .unwrap_or_default()
        .iter()
        .any(|a| a.source == AddrSource::Connect);
    let queued = inner.store.outbox_len(peer).unwrap_or(0) > 0;
    let presence = inner.presence.publish
        && record.is_some_and(|p| p.caps.iter().any(|c| c == super::presence::CAP));
    let (mut open_thread, mut open_thread_ours) = (false, false);
    if !queued {
        for t in inner.store.threads().unwrap_or_default() {
            if t.peer == *peer && is_open(t.mine.as_deref(), t.theirs.as_deref()) {
                open_thread = true;
                open_thread_ours |= t.opened_by_us;
            }
        }
    }
    DialReason::from_facts(DialFacts {
        trusted,
        user_dialed,
        queued,
        open_thread,
        open_thread_ours,
        presence,
    })
}

/// A peer's dialer task: woken on disconnects and on new outbound traffic.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    notify: Notify,
    traffic: AtomicBool,
    /// We closed the connection ourselves (`awp disconnect`): the peer is not expected to
    /// redial us, so the next dial may use addresses learned from its hello at once,
    /// without the [`HELLO_ADDR_GRACE`]. Cleared when a session comes up.
    skip_grace: AtomicBool,
}

/// `awp disconnect` closed our connection to `peer` (and parked it): make sure its dialer
/// exists (idle while the peer is parked) and let its next dial, on new traffic or
/// `connect`, skip the hello-address grace.
pub(super) fn closed_by_us(inner: &Arc<Inner>, peer: PeerKey) {
    if inner.shutdown.is_cancelled() {
        return;
    }
    let (wake, fresh) = wake_for(inner, peer);
    wake.skip_grace.store(true, Ordering::Relaxed);
    if fresh {
        inner.tasks.spawn(run(inner.clone(), peer, wake));
    }
}

/// The dialer wake of `peer`, and whether it was just made (then no task runs for it yet).
fn wake_for(inner: &Inner, peer: PeerKey) -> (Arc<Wake>, bool) {
    let mut d = inner.dialers.lock().unwrap_or_else(|p| p.into_inner());
    match d.get(&peer) {
        Some(n) => (n.clone(), false),
        None => {
            let n = Arc::new(Wake::default());
            d.insert(peer, n.clone());
            (n, true)
        }
    }
}

/// Make sure a dialer task runs for `peer`, and wake it: new outbound traffic.
pub(super) fn ensure(inner: &Arc<Inner>, peer: PeerKey) {
    if inner.shutdown.is_cancelled() {
        return;
    }
    let (wake, fresh) = wake_for(inner, peer);
    if fresh {
        inner.tasks.spawn(run(inner.clone(), peer, wake));
    } else {
        wake.traffic.store(true, Ordering::Relaxed);
        wake.notify.notify_one();
    }
}

/// A connection to `peer` ended: wake its dialer (starting one if we have a reason to
/// dial it). Not new traffic: a peer given up stays given up.
pub(super) fn disconnected(inner: &Arc<Inner>, peer: PeerKey) {
    let n = inner
        .dialers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&peer)
        .cloned();
    match n {
        Some(n) => n.notify.notify_one(),
        None if reason(inner, &peer).is_some() => ensure(inner, peer),
        None => {}
    }
}

async fn run(inner: Arc<Inner>, peer: PeerKey, wake: Arc<Wake>) {
    let timing = inner.dial_timing;
    let mut redial = Redial::new(timing);
    let mut last_down = Instant::now();
    loop {
        if inner.shutdown.is_cancelled() {
            return;
        }
        if wake.traffic.swap(false, Ordering::Relaxed) {
            redial.new_traffic();
        }
        let why = reason(&inner, &peer);
        if inner.connected(&peer) {
            // Up by either side's dial: a later close is not ours.
            wake.skip_grace.store(false, Ordering::Relaxed);
        }
        if inner.connected(&peer) || redial.gave_up(why) {
            if why.is_some() && !inner.connected(&peer) {
                tracing::info!(%peer, failures = redial.failures(), "giving up dialing until new traffic is queued");
            }
            // Wait for a disconnect or new traffic (or re-check once a minute).
            tokio::select! {
                _ = inner.shutdown.cancelled() => return,
                _ = wake.notify.notified() => {}
                _ = tokio::time::sleep(timing.backoff_max) => {}
            }
            if !inner.connected(&peer) {
                last_down = Instant::now();
            }
            continue;
        }
        let mut candidates: Vec<_> = inner
            .store
            .addresses(&peer)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| {
                a.source != AddrSource::Hello
                    || last_down.elapsed() >= timing.hello_grace
                    || wake.skip_grace.load(Ordering::Relaxed)
            })
            .collect();
        super::circuits::add_presence_candidates(&inner, &peer, &mut candidates);
        super::circuits::order(&mut candidates);
        let mut got_up = false;
        let mut dialed_any = false;
        for rec in &candidates {
            if inner.connected(&peer) || inner.shutdown.is_cancelled() {
                break;
            }
            let addr: Address = match rec.address.parse() {
                Ok(a) => a,
                Err(_) => continue,
            };
            let addr = addr.with_pin(peer);
            let dest = destination(&addr);
            // Peers the operator named (trust/allow, or dialed with `connect`) are redialed
            // at their backoff only: a restart of such a peer must not wait out a window
            // filled by its own redials. The limit is for destinations strangers can steer.
            let allowed = why.is_some_and(DialReason::persistent)
                || inner
                    .dial_limiter
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .try_dial(&dest, Instant::now());
            if !allowed {
                tracing::debug!(%peer, destination = %dest, "dial rate limit for this destination: skipped");
                continue;
            }
            dialed_any = true;
            let deadline = tokio::time::Instant::now() + super::HANDSHAKE_TIMEOUT;
            let dialed =
                tokio::time::timeout_at(deadline, net::dial(&addr, &inner.tls, &inner.dial_opts))
                    .await;
            match dialed {
                Ok(Ok(c)) => {
                    let outcome = conn::run(
                        inner.clone(),
                        c,
                        Dial::Outbound {
                            address: rec.address.clone(),
                            expected: Some(peer),
                            source: rec.source,
                        },
                        deadline,
                    )
                    .await;
                    last_down = Instant::now();
                    if outcome.up {
                        got_up = true;
                        break;
                    }
                    let _ = inner.store.address_result(
                        &peer,
                        &rec.address,
                        Err(&outcome.reason),
                        crate::wire::time::now_ms(),
                    );
                }
                Ok(Err(e)) => {
                    tracing::debug!(%peer, address = %rec.address, "dial failed: {e}");
                    let _ = inner.store.address_result(
                        &peer,
                        &rec.address,
                        Err(&e.to_string()),
                        crate::wire::time::now_ms(),
                    );
                }
                Err(_) => {
                    let _ = inner.store.address_result(
                        &peer,
                        &rec.address,
                        Err("dial timed out"),
                        crate::wire::time::now_ms(),
                    );
                }
            }
        }
        let pause = if got_up {
            redial.up();
            wake.skip_grace.store(false, Ordering::Relaxed);
            jittered(redial.backoff())
        } else if candidates.is_empty() {
            // Nothing dialable yet (e.g. within the hello.addr grace).
            timing
                .hello_grace
                .saturating_sub(last_down.elapsed())
                .max(timing.backoff_min)
        } else {
            let pause = jittered(redial.backoff());
            if dialed_any {
                redial.failed();
            }
            pause
        };
        tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            _ = wake.notify.notified() => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_1s_to_a_60s_cap() {
        let mut b = BACKOFF_MIN;
        let mut seen = vec![b];
        for _ in 0..8 {
            b = next_backoff(b);
            seen.push(b);
        }
        let secs: Vec<u64> = seen.iter().map(|d| d.as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[test]
    fn jitter_stays_within_20_percent() {
        for _ in 0..1000 {
            let j = jittered(Duration::from_secs(10));
            assert!(
                j >= Duration::from_secs(8) && j <= Duration::from_secs(12),
                "{j:?}"
            );
        }
    }

    #[test]
    fn threads_done_on_either_side_do_not_keep_a_connection() {
        assert!(is_open(None, None));
        assert!(is_open(Some("working"), Some("waiting")));
        assert!(!is_open(Some("done"), None));
        assert!(!is_open(None, Some("failed")));
        assert!(!is_open(Some("closed"), Some("open")));
    }
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn a_peer_is_dialed_only_with_a_reason() {
        use DialReason::*;
        // (trusted, user dialed, queued, open thread, open thread we opened) → reason.
        let table = [
            // No work: nobody is dialed, however well known.
            ((true, true, false, false, false), None),
            // A thread the peer opened: only trusted or user-dialed peers.
            ((false, false, false, true, false), None),
            ((true, false, false, true, false), Some(Trusted)),
            ((false, true, false, true, false), Some(UserDialed)),
            // Our own work.
            ((false, false, true, false, false), Some(Queued)),
            ((false, false, false, true, true), Some(OpenedByUs)),
            ((true, true, true, true, true), Some(Trusted)),
            ((false, true, true, false, false), Some(UserDialed)),
        ];
        for ((trusted, user_dialed, queued, open_thread, open_thread_ours), want) in table {
            let f = DialFacts {
                trusted,
                user_dialed,
                queued,
                open_thread,
                open_thread_ours,
                presence: false,
            };
            assert_eq!(DialReason::from_facts(f), want, "{f:?}");
        }
        // Our presence document is work only for a peer the operator chose.
        let presence = |trusted, user_dialed| DialFacts {
            trusted,
            user_dialed,
            presence: true,
            ..DialFacts::default()
        };
        assert_eq!(DialReason::from_facts(presence(false, false)), None);
        assert_eq!(
            DialReason::from_facts(presence(false, true)),
            Some(UserDialed)
        );
        assert_eq!(DialReason::from_facts(presence(true, false)), Some(Trusted));
    }

    #[test]
    fn strangers_are_given_up_after_a_bounded_number_of_failures() {
        let mut r = Redial::new(DialTiming::default());
        let mut dials = 0;
        // A dialer loop without real time: dial while not given up, at most 1000 rounds.
        for _ in 0..1000 {
            if r.gave_up(Some(DialReason::Queued)) {
                break;
            }
            dials += 1;
            r.failed();
        }
        assert_eq!(dials, MAX_DIAL_FAILURES);
        assert!(r.gave_up(Some(DialReason::OpenedByUs)));
        // New traffic starts over, from the first step.
        r.new_traffic();
        assert!(!r.gave_up(Some(DialReason::Queued)));
        assert_eq!(r.backoff(), BACKOFF_MIN);
        // No reason: never dialed.
        assert!(Redial::new(DialTiming::default()).gave_up(None));
    }

    #[test]
    fn trusted_and_user_dialed_peers_are_never_given_up() {
        for reason in [DialReason::Trusted, DialReason::UserDialed] {
            let mut r = Redial::new(DialTiming::default());
            for _ in 0..100 {
                r.failed();
            }
            assert!(!r.gave_up(Some(reason)), "{reason:?}");
            assert_eq!(r.backoff(), BACKOFF_MAX, "capped at 60 s");
        }
    }

    #[test]
    fn dials_to_one_destination_are_rate_limited_across_peers() {
        let now = t0();
        let mut l = DestLimiter::new(DEST_DIALS, DEST_WINDOW);
        // 200 peers naming one address within a second: DEST_DIALS dials get through.
        let allowed = (0..200)
            .filter(|i| l.try_dial("tls:127.0.0.1:9", now + Duration::from_millis(*i * 5)))
            .count();
        assert_eq!(allowed, DEST_DIALS);
        // Another destination is not affected.
        assert!(l.try_dial("tls:127.0.0.1:10", now));
        // The window slides: one window later, the destination may be dialed again.
        assert!(!l.try_dial(
            "tls:127.0.0.1:9",
            now + DEST_WINDOW - Duration::from_millis(1)
        ));
        assert!(l.try_dial("tls:127.0.0.1:9", now + DEST_WINDOW));
    }

    #[test]
    fn the_limiter_remembers_a_bounded_number_of_destinations() {
        let now = t0();
        let mut l = DestLimiter::new(1, DEST_WINDOW);
        for i in 0..(DEST_REMEMBERED + 100) {
            assert!(l.try_dial(&format!("tls:10.0.{}.{}:1", i / 256, i % 256), now));
        }
        assert!(l.recent.len() <= DEST_REMEMBERED);
    }

    #[test]
    fn the_destination_drops_the_key_pin() {
        let k = crate::identity::Identity::from_seed(&[5; 32]).key();
        let a: Address = format!("tls:127.0.0.1:7700#{k}").parse().unwrap();
        assert_eq!(destination(&a), "tls:127.0.0.1:7700");
        let b: Address = "tls:127.0.0.1:7700".parse().unwrap();
        assert_eq!(destination(&a), destination(&b.with_pin(k)));
    }
}
