//! Peers seen in handshakes or introduced, their parked marks, and the addresses to dial
//! them at (protocol-notes §Introductions, §Liveness).

use super::codec::{dec, enc, hex, peer_from_hex, pkey, utf8, AddrRec, PeerRec};
use super::imp::{page_after, Store, META_INTRO_PREFIX};
use super::tx::{db_err, Tx, T};
use super::{AddrSource, AddressRecord, Introduced, Park, PeerRecord, StoreError};
use crate::wire::{self, PeerKey};

impl Store {
    /// Record a peer seen in a handshake: upsert name, about and caps (replaced by these),
    /// last seen = `now_ms` (first seen kept), and clear parked.
    pub fn peer_seen(
        &self,
        key: &PeerKey,
        name: Option<&str>,
        about: Option<&str>,
        caps: &[String],
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = key.as_bytes().to_vec();
        let first = match tx.get(T::Peers, &k)? {
            Some(v) => dec::<PeerRec>("peers", &v)?.first,
            None => now_ms,
        };
        let rec = PeerRec {
            name: name.map(str::to_owned),
            about: about.map(str::to_owned),
            caps: caps.to_vec(),
            first,
            last: now_ms,
            parked: false,
            parked_by_us: false,
            introduced_by: None,
        };
        tx.put(T::Peers, k, enc(&rec)?);
        tx.commit()
    }

    /// One peer.
    pub fn peer(&self, key: &PeerKey) -> Result<Option<PeerRecord>, StoreError> {
        match self.trees.t(T::Peers).get(key.as_bytes()).map_err(db_err)? {
            Some(v) => Ok(Some(peer_record(*key, &v)?)),
            None => Ok(None),
        }
    }

    /// All known peers, in raw key order.
    pub fn peers(&self) -> Result<Vec<PeerRecord>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::Peers).iter() {
            let (k, v) = kv.map_err(db_err)?;
            let key = super::codec::peer_from_slice("peers", &k)?;
            out.push(peer_record(key, &v)?);
        }
        Ok(out)
    }

    /// Up to `limit` known peers with key > `after` (from the first when None), in raw key
    /// order: one page of the `peers` listing.
    pub fn peers_after(
        &self,
        after: Option<&PeerKey>,
        limit: usize,
    ) -> Result<Vec<PeerRecord>, StoreError> {
        page_after(
            self.trees.t(T::Peers),
            after.map(|a| a.as_bytes().as_slice()),
            limit,
            |k, v| peer_record(super::codec::peer_from_slice("peers", k)?, v),
        )
    }

    /// Change the parked mark (protocol-notes §bye) as `how` says: [`Park::PeerBye`] and
    /// [`Park::ByUs`] park (an unknown peer gets a record, seen now), [`Park::Clear`] clears
    /// (an unknown peer: nothing). A peer parked by us stays so on its `bye`.
    pub fn set_parked(&self, key: &PeerKey, how: Park) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = key.as_bytes().to_vec();
        let (parked, by_us) = match how {
            Park::Clear => (false, false),
            Park::PeerBye => (true, false),
            Park::ByUs => (true, true),
        };
        let rec = match tx.get(T::Peers, &k)? {
            Some(v) => {
                let mut p: PeerRec = dec("peers", &v)?;
                let by_us = by_us || (how == Park::PeerBye && p.parked && p.parked_by_us);
                if p.parked == parked && p.parked_by_us == by_us {
                    return Ok(());
                }
                p.parked = parked;
                p.parked_by_us = by_us;
                p
            }
            None if !parked => return Ok(()),
            None => {
                let now = wire::time::now_ms();
                PeerRec {
                    name: None,
                    about: None,
                    caps: Vec::new(),
                    first: now,
                    last: now,
                    parked,
                    parked_by_us: by_us,
                    introduced_by: None,
                }
            }
        };
        tx.put(T::Peers, k, enc(&rec)?);
        tx.commit()
    }

    /// Remember an address for `peer` now: [`Store::add_address_at`] at the current time.
    pub fn add_address(
        &self,
        peer: &PeerKey,
        address: &str,
        source: AddrSource,
    ) -> Result<(), StoreError> {
        self.add_address_at(peer, address, source, wire::time::now_ms())
    }

    /// Remember an address for `peer`, heard at `now_ms`. A new address keeps its source;
    /// a known one keeps its first source unless the new source is `Connect` (an address
    /// the user asked for beats hello/introduce). Never downgrades; dial history is kept.
    /// Sources `Hello` and `Connect` set its last-heard time (the peer itself, or the user,
    /// vouches for it now). At most [`super::MAX_PEER_ADDRESSES`] are kept per peer: the
    /// stalest others (last in [`Store::addresses`] order) are dropped.
    pub fn add_address_at(
        &self,
        peer: &PeerKey,
        address: &str,
        source: AddrSource,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = pkey(peer, address.as_bytes());
        let heard = (source != AddrSource::Introduce).then_some(now_ms);
        let rec = match tx.get(T::Addresses, &k)? {
            Some(v) => {
                let mut a: AddrRec = dec("addresses", &v)?;
                let upgrade = source == AddrSource::Connect && a.source != AddrSource::Connect;
                let fresher = heard.is_some() && heard > a.heard;
                if !upgrade && !fresher {
                    return Ok(());
                }
                if upgrade {
                    a.source = AddrSource::Connect;
                }
                a.heard = a.heard.max(heard);
                a
            }
            None => AddrRec {
                source,
                ok: None,
                err_at: None,
                err: None,
                by: None,
                heard,
            },
        };
        tx.put(T::Addresses, k, enc(&rec)?);
        tx.commit()?;
        self.trim_addresses(peer, Some(address))
    }

    /// Drop `peer`'s stalest addresses beyond [`super::MAX_PEER_ADDRESSES`], never `keep`.
    /// The caller holds the writer lock.
    fn trim_addresses(&self, peer: &PeerKey, keep: Option<&str>) -> Result<(), StoreError> {
        let all = self.addresses(peer)?;
        if all.len() <= super::MAX_PEER_ADDRESSES {
            return Ok(());
        }
        let mut tx = Tx::new(&self.trees);
        let mut left = all.len();
        for a in all.iter().rev() {
            if left <= super::MAX_PEER_ADDRESSES {
                break;
            }
            if Some(a.address.as_str()) == keep {
                continue;
            }
            tx.del(T::Addresses, pkey(peer, a.address.as_bytes()));
            left -= 1;
        }
        tx.commit()
    }

    /// Record a dial result for a known address: `Ok` sets last ok, `Err(detail)` sets last
    /// error time and text. An address never added with [`Store::add_address`] is ignored.
    pub fn address_result(
        &self,
        peer: &PeerKey,
        address: &str,
        result: Result<(), &str>,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let _w = self.writer();
        let mut tx = Tx::new(&self.trees);
        let k = pkey(peer, address.as_bytes());
        let Some(v) = tx.get(T::Addresses, &k)? else {
            return Ok(());
        };
        let mut a: AddrRec = dec("addresses", &v)?;
        match result {
            Ok(()) => a.ok = Some(now_ms),
            Err(e) => {
                a.err_at = Some(now_ms);
                a.err = Some(e.to_owned());
            }
        }
        tx.put(T::Addresses, k, enc(&a)?);
        tx.commit()
    }

    /// Known addresses of `peer`, freshest first (the order the dialer and `connect PEER`
    /// try them in): addresses last known good ([`AddressRecord::fresh_ms`]: a successful
    /// dial, or the peer announcing it in an authenticated hello) most recent first; then
    /// those whose last dial failed after that; then introduced hints that never worked.
    /// Ties: older last failure first, then address text. A peer that moved to a new port
    /// is dialed at the new address first, not at the one that worked last week.
    pub fn addresses(&self, peer: &PeerKey) -> Result<Vec<AddressRecord>, StoreError> {
        let mut out = Vec::new();
        for kv in self.trees.t(T::Addresses).scan_prefix(peer.as_bytes()) {
            let (k, v) = kv.map_err(db_err)?;
            let addr = super::codec::after_pkey("addresses", &k)?;
            let a: AddrRec = dec("addresses", &v)?;
            out.push(AddressRecord {
                peer: *peer,
                address: utf8("addresses", addr)?,
                source: a.source,
                last_ok_ms: a.ok,
                last_err_ms: a.err_at,
                last_err: a.err,
                introduced_by: a
                    .by
                    .as_deref()
                    .map(|h| peer_from_hex("addresses", h))
                    .transpose()?,
                last_heard_ms: a.heard,
            });
        }
        // 0: known good; 1: failed since; 2: never known good (an introduced hint, never
        // ahead of an address that worked).
        let rank = |a: &AddressRecord| match a.fresh_ms() {
            None => 2,
            Some(_) if a.failing() => 1,
            Some(_) => 0,
        };
        out.sort_by(|a, b| {
            rank(a)
                .cmp(&rank(b))
                .then(b.fresh_ms().cmp(&a.fresh_ms()))
                .then(a.last_err_ms.cmp(&b.last_err_ms))
                .then(a.address.cmp(&b.address))
        });
        Ok(out)
    }

    /// Record an introduction by `introducer` of `key` (protocol-notes §Grants, 10.4), in
    /// one transaction. Introductions are hints scoped to their introducer:
    /// - each introducer may introduce at most `max_keys` distinct keys (a repeat of a key
    ///   it introduced before counts once); over that, nothing is stored ([`Introduced::OverQuota`]);
    /// - an unknown `key` gets a peer record named `name`, marked introduced by
    ///   `introducer`; a known peer's record (name, about, caps) is never changed;
    /// - `address` (already checked by the caller) is added with source `introduce` and its
    ///   introducer, unless the peer already has it; it sorts after every address that
    ///   worked (see [`Store::addresses`]).
    pub fn introduce(
        &self,
        introducer: &PeerKey,
        key: &PeerKey,
        name: Option<&str>,
        address: Option<&str>,
        max_keys: usize,
        now_ms: u64,
    ) -> Result<Introduced, StoreError> {
        let _w = self.writer();
        let prefix = [META_INTRO_PREFIX, introducer.as_bytes()].concat();
        let idx = [prefix.as_slice(), key.as_bytes()].concat();
        let meta = self.trees.t(T::Meta);
        if meta.contains_key(&idx).map_err(db_err)? {
            return Ok(Introduced::Again);
        }
        // Counting stops at the quota: at most `max_keys` entries are read.
        if meta.scan_prefix(&prefix).keys().take(max_keys).count() >= max_keys {
            return Ok(Introduced::OverQuota);
        }
        let mut tx = Tx::new(&self.trees);
        tx.put(T::Meta, idx, Vec::new());
        let by = hex(introducer.as_bytes());
        let pk = key.as_bytes().to_vec();
        if tx.get(T::Peers, &pk)?.is_none() {
            let rec = PeerRec {
                name: name.map(str::to_owned),
                about: None,
                caps: Vec::new(),
                first: now_ms,
                last: now_ms,
                parked: false,
                parked_by_us: false,
                introduced_by: Some(by.clone()),
            };
            tx.put(T::Peers, pk, enc(&rec)?);
        }
        if let Some(address) = address {
            let ak = pkey(key, address.as_bytes());
            if tx.get(T::Addresses, &ak)?.is_none() {
                let rec = AddrRec {
                    source: AddrSource::Introduce,
                    ok: None,
                    err_at: None,
                    err: None,
                    by: Some(by),
                    heard: None,
                };
                tx.put(T::Addresses, ak, enc(&rec)?);
            }
        }
        tx.commit()?;
        self.trim_addresses(key, None)?;
        Ok(Introduced::Added)
    }
}

fn peer_record(key: PeerKey, v: &[u8]) -> Result<PeerRecord, StoreError> {
    let p: PeerRec = dec("peers", v)?;
    Ok(PeerRecord {
        key,
        name: p.name,
        about: p.about,
        caps: p.caps,
        first_seen_ms: p.first,
        last_seen_ms: p.last,
        parked: p.parked,
        parked_by_us: p.parked && p.parked_by_us,
        introduced_by: p
            .introduced_by
            .as_deref()
            .map(|h| peer_from_hex("peers", h))
            .transpose()?,
    })
}
