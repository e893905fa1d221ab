//! Address syntax (spec/tls-binding.md §Addresses): `tls:HOST:PORT[#ed25519:KEY]`,
//! `tcp:HOST:PORT`, `unix:/path`, and the relay circuit form
//! `relay:tls:HOST:PORT#ed25519:RELAYKEY/ed25519:PEERKEY` (spec/relay-circuits.md
//! §Addresses: the relay's pinned TLS address, `/`, the key of the node reached through it).
//!
//! - Schemes are lower case. `HOST` is an IPv4 address, a bracketed IPv6 address
//!   (`tls:[::1]:7700`, no zone id) or a host name (ASCII letters, digits, `-`, `.`, `_`;
//!   at most 253 bytes; not starting with `-` or `.`).
//! - `PORT` is decimal, 0–65535 (0 only makes sense for binding).
//! - The pin `#ed25519:KEY` is allowed on `tls:` only: the dial then fails inside the TLS
//!   handshake unless the server's certificate is for `KEY`.
//! - `unix:` takes an absolute path, verbatim (it may contain `#` or `:`). Relative paths
//!   are refused: addresses are stored and passed between processes whose working
//!   directories differ, so a relative path would name a different socket for each.
//!
//! [`Address`]'s `Display` is canonical and parses back to an equal value.

use crate::wire::PeerKey;
use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;

/// A parsed address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// TLS 1.3 over TCP; `host` without brackets; `pin`: the key the server must present.
    Tls {
        host: String,
        port: u16,
        pin: Option<PeerKey>,
    },
    /// Plaintext TCP (loopback and private addresses only unless allowed).
    Tcp { host: String, port: u16 },
    /// Unix domain stream socket at an absolute path.
    Unix { path: PathBuf },
    /// A circuit through the relay at `host:port` (TLS, certificate key `relay`) to the
    /// node `peer`, which keeps a standing connection to that relay
    /// (spec/relay-circuits.md). The end-to-end TLS inside the circuit is pinned to `peer`.
    Relay {
        host: String,
        port: u16,
        relay: PeerKey,
        peer: PeerKey,
    },
}

/// Why an address did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AddressError {
    /// No known `scheme:` prefix.
    #[error("unknown scheme in {0:?}: use {SCHEMES}")]
    Scheme(String),
    /// The scheme is known but the rest is not valid: the input and the reason.
    #[error("bad address {0:?}: {1}")]
    Malformed(String, String),
}

/// Every address form, as the errors that ask for one name them.
pub const SCHEMES: &str = "tls:HOST:PORT[#ed25519:KEY], tcp:HOST:PORT, unix:/path or relay:tls:HOST:PORT#ed25519:RELAYKEY/ed25519:PEERKEY";

const MAX_HOST_NAME: usize = 253;

fn malformed(input: &str, why: impl Into<String>) -> AddressError {
    AddressError::Malformed(input.to_string(), why.into())
}

/// Split `HOST:PORT` (IPv6 in brackets) and validate both parts.
fn parse_host_port(input: &str, rest: &str) -> Result<(String, u16), AddressError> {
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let close = inner
            .find(']')
            .ok_or_else(|| malformed(input, "missing `]` after an IPv6 address"))?;
        let host = &inner[..close];
        let after = &inner[close + 1..];
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| malformed(input, "expected `:PORT` after `]`"))?;
        if host.parse::<Ipv6Addr>().is_err() {
            return Err(malformed(
                input,
                format!("{host:?} is not an IPv6 address (zone ids are not supported)"),
            ));
        }
        (host, port)
    } else {
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| malformed(input, "expected HOST:PORT"))?;
        if host.contains(':') {
            return Err(malformed(
                input,
                "IPv6 addresses must be in brackets, e.g. tls:[::1]:7700",
            ));
        }
        validate_host_name(input, host)?;
        (host, port)
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(input, format!("bad port {port:?}")));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| malformed(input, format!("port {port} out of range 0-65535")))?;
    Ok((host.to_string(), port))
}

fn validate_host_name(input: &str, host: &str) -> Result<(), AddressError> {
    if host.is_empty() {
        return Err(malformed(input, "empty host"));
    }
    if host.len() > MAX_HOST_NAME {
        return Err(malformed(input, "host name longer than 253 bytes"));
    }
    if host.starts_with(['-', '.']) {
        return Err(malformed(input, "host name starts with `-` or `.`"));
    }
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')))
    {
        return Err(malformed(
            input,
            format!("character {c:?} not allowed in a host"),
        ));
    }
    Ok(())
}

impl std::str::FromStr for Address {
    type Err = AddressError;

    /// Parse the syntax described in the module doc. Errors: [`AddressError::Scheme`] when
    /// no known scheme prefixes the input, [`AddressError::Malformed`] for everything else.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("relay:") {
            // Keys are base64url (no `/`), so the last `/` splits relay and peer.
            let (relay, peer) = rest
                .rsplit_once('/')
                .ok_or_else(|| malformed(s, "expected relay:tls:HOST:PORT#RELAYKEY/PEERKEY"))?;
            let peer = PeerKey::parse(peer)
                .map_err(|e| malformed(s, format!("bad peer key {peer:?}: {e}")))?;
            if !relay.starts_with("tls:") {
                return Err(malformed(s, "the relay must be a tls: address"));
            }
            match relay.parse::<Address>() {
                Ok(Address::Tls {
                    host,
                    port,
                    pin: Some(relay),
                }) => {
                    if port == 0 {
                        return Err(malformed(s, "relay port 0"));
                    }
                    Ok(Address::Relay {
                        host,
                        port,
                        relay,
                        peer,
                    })
                }
                Ok(_) => Err(malformed(
                    s,
                    "the relay address needs its key (#ed25519:KEY)",
                )),
                Err(AddressError::Malformed(_, why)) => Err(malformed(s, why)),
                Err(e) => Err(malformed(s, e.to_string())),
            }
        } else if let Some(rest) = s.strip_prefix("tls:") {
            let (hp, pin) = match rest.split_once('#') {
                Some((hp, pin)) => {
                    let key = PeerKey::parse(pin)
                        .map_err(|e| malformed(s, format!("bad pin {pin:?}: {e}")))?;
                    (hp, Some(key))
                }
                None => (rest, None),
            };
            let (host, port) = parse_host_port(s, hp)?;
            Ok(Address::Tls { host, port, pin })
        } else if let Some(rest) = s.strip_prefix("tcp:") {
            if rest.contains('#') {
                return Err(malformed(
                    s,
                    "a key pin (#ed25519:…) is only meaningful on tls: addresses",
                ));
            }
            let (host, port) = parse_host_port(s, rest)?;
            Ok(Address::Tcp { host, port })
        } else if let Some(rest) = s.strip_prefix("unix:") {
            if rest.is_empty() {
                return Err(malformed(s, "empty path"));
            }
            if !rest.starts_with('/') {
                return Err(malformed(s, "unix socket path must be absolute"));
            }
            if rest.contains('\0') {
                return Err(malformed(s, "NUL byte in path"));
            }
            Ok(Address::Unix {
                path: PathBuf::from(rest),
            })
        } else {
            Err(AddressError::Scheme(s.to_string()))
        }
    }
}

/// `host` as it appears before `:PORT`: IPv6 literals in brackets.
fn fmt_host(f: &mut std::fmt::Formatter<'_>, host: &str) -> std::fmt::Result {
    if host.contains(':') {
        write!(f, "[{host}]")
    } else {
        f.write_str(host)
    }
}

impl std::fmt::Display for Address {
    /// Canonical form, parsed back by `FromStr` to an equal value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tls { host, port, pin } => {
                f.write_str("tls:")?;
                fmt_host(f, host)?;
                write!(f, ":{port}")?;
                if let Some(pin) = pin {
                    write!(f, "#{pin}")?;
                }
                Ok(())
            }
            Address::Tcp { host, port } => {
                f.write_str("tcp:")?;
                fmt_host(f, host)?;
                write!(f, ":{port}")
            }
            Address::Unix { path } => write!(f, "unix:{}", path.display()),
            Address::Relay {
                host,
                port,
                relay,
                peer,
            } => {
                f.write_str("relay:tls:")?;
                fmt_host(f, host)?;
                write!(f, ":{port}#{relay}/{peer}")
            }
        }
    }
}

impl Address {
    /// The pinned key of a TLS address; for a relay circuit, the far end's key.
    pub fn pin(&self) -> Option<PeerKey> {
        match self {
            Address::Tls { pin, .. } => *pin,
            Address::Relay { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// The same address pinned to `key` (TLS only; a relay circuit then leads to `key`;
    /// others unchanged).
    pub fn with_pin(&self, key: PeerKey) -> Address {
        match self {
            Address::Tls { host, port, .. } => Address::Tls {
                host: host.clone(),
                port: *port,
                pin: Some(key),
            },
            Address::Relay {
                host, port, relay, ..
            } => Address::Relay {
                host: host.clone(),
                port: *port,
                relay: *relay,
                peer: key,
            },
            other => other.clone(),
        }
    }

    /// The host as an IP address when it is a literal (not a name). A relay circuit has
    /// none of its own (the relay's host is not the peer's).
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Address::Tls { host, .. } | Address::Tcp { host, .. } => host.parse().ok(),
            Address::Unix { .. } | Address::Relay { .. } => None,
        }
    }

    /// Whether this is a relay circuit address.
    pub fn is_relay(&self) -> bool {
        matches!(self, Address::Relay { .. })
    }

    /// The circuit address through the relay at `relay_addr` (a pinned `tls:` address) to
    /// `peer`; `None` when `relay_addr` is not a pinned TLS address.
    pub fn circuit(relay_addr: &Address, peer: PeerKey) -> Option<Address> {
        match relay_addr {
            Address::Tls {
                host,
                port,
                pin: Some(relay),
            } => Some(Address::Relay {
                host: host.clone(),
                port: *port,
                relay: *relay,
                peer,
            }),
            _ => None,
        }
    }

    /// The relay's own pinned TLS address of a circuit address.
    pub fn relay_address(&self) -> Option<Address> {
        match self {
            Address::Relay {
                host, port, relay, ..
            } => Some(Address::Tls {
                host: host.clone(),
                port: *port,
                pin: Some(*relay),
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Identity;

    fn key(seed: u8) -> PeerKey {
        Identity::from_seed(&[seed; 32]).key()
    }

    fn parse(s: &str) -> Result<Address, AddressError> {
        s.parse()
    }

    fn assert_malformed(s: &str, needle: &str) {
        match parse(s) {
            Err(AddressError::Malformed(input, why)) => {
                assert_eq!(input, s);
                assert!(why.contains(needle), "{s}: {why:?} lacks {needle:?}");
            }
            other => panic!("{s}: expected Malformed, got {other:?}"),
        }
    }

    #[test]
    fn parses_each_form() {
        assert_eq!(
            parse("tls:127.0.0.1:7700").unwrap(),
            Address::Tls {
                host: "127.0.0.1".into(),
                port: 7700,
                pin: None
            }
        );
        assert_eq!(
            parse("tls:[::1]:0").unwrap(),
            Address::Tls {
                host: "::1".into(),
                port: 0,
                pin: None
            }
        );
        assert_eq!(
            parse("tcp:node-1.example.org:65535").unwrap(),
            Address::Tcp {
                host: "node-1.example.org".into(),
                port: 65535
            }
        );
        assert_eq!(
            parse("unix:/run/awp/node.sock").unwrap(),
            Address::Unix {
                path: "/run/awp/node.sock".into()
            }
        );
        let k = key(1);
        let a = parse(&format!("tls:host:1#{k}")).unwrap();
        assert_eq!(a.pin(), Some(k));
    }

    #[test]
    fn display_round_trips() {
        let k = key(2);
        let cases = [
            Address::Tls {
                host: "10.0.0.1".into(),
                port: 7700,
                pin: Some(k),
            },
            Address::Tls {
                host: "fe80::1".into(),
                port: 1,
                pin: None,
            },
            Address::Tls {
                host: "::".into(),
                port: 7700,
                pin: Some(k),
            },
            Address::Tcp {
                host: "localhost".into(),
                port: 80,
            },
            Address::Unix {
                path: "/tmp/a#b:c".into(),
            },
        ];
        for a in cases {
            let s = a.to_string();
            assert_eq!(parse(&s).unwrap(), a, "{s}");
        }
        assert_eq!(
            parse("tls:[::1]:7700").unwrap().to_string(),
            "tls:[::1]:7700"
        );
        assert_eq!(
            parse(&format!("tls:[::1]:7700#{k}")).unwrap().to_string(),
            format!("tls:[::1]:7700#{k}")
        );
    }

    #[test]
    fn rejects_missing_or_unknown_scheme() {
        for s in [
            "127.0.0.1:7700",
            "",
            "TLS:1.2.3.4:1",
            "http://x:1",
            "udp:1.2.3.4:5",
        ] {
            assert_eq!(parse(s), Err(AddressError::Scheme(s.to_string())), "{s}");
        }
    }

    #[test]
    fn rejects_bad_ports() {
        assert_malformed("tls:1.2.3.4:65536", "out of range");
        assert_malformed("tls:1.2.3.4:", "bad port");
        assert_malformed("tls:1.2.3.4:-1", "bad port");
        assert_malformed("tls:1.2.3.4:+1", "bad port");
        assert_malformed("tls:1.2.3.4:12a", "bad port");
        assert_malformed("tcp:1.2.3.4:1000000", "bad port");
        assert_malformed("tls:1.2.3.4", "HOST:PORT");
        assert_malformed("tls:[::1]", "`:PORT`");
        assert_malformed("tls:[::1]7700", "`:PORT`");
    }

    #[test]
    fn rejects_bad_hosts() {
        assert_malformed("tls::7700", "empty host");
        assert_malformed("tcp::7700", "empty host");
        assert_malformed("tls:::1:7700", "brackets");
        assert_malformed("tls:[::1:7700", "`]`");
        assert_malformed("tls:[1.2.3.4]:7700", "not an IPv6");
        assert_malformed("tls:[fe80::1%eth0]:7700", "not an IPv6");
        assert_malformed("tls:a b:1", "not allowed");
        assert_malformed("tls:-a:1", "starts with");
        assert_malformed("tls:a/b:1", "not allowed");
        assert_malformed(&format!("tls:{}:1", "a".repeat(254)), "253");
    }

    #[test]
    fn rejects_bad_pins() {
        assert_malformed("tls:1.2.3.4:1#", "bad pin");
        assert_malformed("tls:1.2.3.4:1#ed25519:AAAA", "bad pin");
        assert_malformed("tls:1.2.3.4:1#x25519:abc", "bad pin");
        // The identity point (small order) is a weak key.
        let mut weak = [0u8; 32];
        weak[0] = 1;
        let weak = format!(
            "ed25519:{}",
            base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, weak)
        );
        assert_malformed(&format!("tls:1.2.3.4:1#{weak}"), "bad pin");
        let k = key(1);
        assert_malformed(&format!("tcp:1.2.3.4:1#{k}"), "only meaningful on tls");
    }

    #[test]
    fn rejects_bad_unix_paths() {
        assert_malformed("unix:", "empty path");
        assert_malformed("unix:relative/sock", "absolute");
        assert_malformed("unix:./sock", "absolute");
        assert_malformed("unix:/a\0b", "NUL");
    }

    #[test]
    fn relay_circuit_addresses_parse_and_round_trip() {
        let (r, p) = (key(4), key(5));
        let s = format!("relay:tls:relay.example:7700#{r}/{p}");
        let a = parse(&s).unwrap();
        assert_eq!(
            a,
            Address::Relay {
                host: "relay.example".into(),
                port: 7700,
                relay: r,
                peer: p
            }
        );
        assert_eq!(a.to_string(), s);
        assert_eq!(a.pin(), Some(p));
        assert_eq!(a.with_pin(r).pin(), Some(r));
        assert!(a.is_relay() && a.ip().is_none());
        let v6 = format!("relay:tls:[::1]:9#{r}/{p}");
        assert_eq!(parse(&v6).unwrap().to_string(), v6);
        let relay: Address = format!("tls:relay.example:7700#{r}").parse().unwrap();
        assert_eq!(Address::circuit(&relay, p), Some(a.clone()));
        assert_eq!(a.relay_address(), Some(relay));
    }

    #[test]
    fn rejects_bad_relay_circuit_addresses() {
        let (r, p) = (key(4), key(5));
        assert_malformed(&format!("relay:tls:h:1#{r}"), "expected relay:");
        assert_malformed(&format!("relay:tls:h:1/{p}"), "needs its key");
        assert_malformed(&format!("relay:tcp:h:1/{p}"), "must be a tls:");
        assert_malformed(&format!("relay:tls:h:0#{r}/{p}"), "port 0");
        assert_malformed(&format!("relay:tls:h:1#{r}/ed25519:AAAA"), "bad peer key");
        assert_malformed(&format!("relay:tls:h:x#{r}/{p}"), "bad port");
        assert_malformed("relay:", "expected relay:");
        assert_malformed(&format!("relay:tls:h:1#{r}/{p}/{p}"), "bad pin");
    }

    #[test]
    fn with_pin_only_changes_tls() {
        let k = key(3);
        let tls = parse("tls:[::1]:9").unwrap();
        assert_eq!(tls.with_pin(k).pin(), Some(k));
        let tcp = parse("tcp:127.0.0.1:9").unwrap();
        assert_eq!(tcp.with_pin(k), tcp);
        assert_eq!(tcp.pin(), None);
        let unix = parse("unix:/x").unwrap();
        assert_eq!(unix.with_pin(k), unix);
    }
}
