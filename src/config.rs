//! Node settings from `$AWP_HOME/config.toml`, then `AWP_*` environment variables, then
//! command-line flags — each overriding the one before.
//!
//! ```toml
//! accept = "allowlist"          # or "any" (default)
//! allow = ["ed25519:…"]         # admitted under allowlist
//! trust = ["ed25519:…"]         # trusted grant issuers (and admitted)
//! listen = ["tls:0.0.0.0:7700"]
//! blob_limit = 52428800         # bytes
//! name = "alice@laptop"
//! about = "CI agent"
//! presence = true
//! outbox_quota_bytes = 134217728  # per peer, for served results (default 128 MiB)
//! outbox_quota_lines = 10000      # per peer, for served results (default 10,000)
//! artifactr = "127.0.0.1:8765"   # local artifactr.v1 HTTP/WebSocket endpoint (off by default)
//! artifactr_public = false       # allow a non-loopback artifactr address
//! ```
//!
//! Environment: `AWP_ACCEPT`, `AWP_ALLOW` and `AWP_TRUST` (comma-separated keys),
//! `AWP_LISTEN` (comma-separated addresses), `AWP_BLOB_LIMIT`, `AWP_NAME`, `AWP_ABOUT`,
//! `AWP_PRESENCE` (`true`/`false`), `AWP_OUTBOX_QUOTA_BYTES` (a size, like the blob
//! limit), `AWP_OUTBOX_QUOTA_LINES`,
//! `AWP_ARTIFACTR` (an address), `AWP_ARTIFACTR_PUBLIC`.

use crate::net::Address;
use crate::wire::PeerKey;
use serde::Deserialize;
use std::path::Path;

/// The config file's name in the home.
pub const CONFIG_FILE: &str = "config.toml";
/// Default blob limit (sending and receiving), bytes: 50 MiB.
pub const DEFAULT_BLOB_LIMIT: u64 = crate::blob::DEFAULT_LIMIT;
/// Default per-peer outbox quota for served results, bytes: 128 MiB (a dozen 8 MiB
/// fs-read results left unacked). A peer over it gets `err busy` for served requests.
pub const DEFAULT_OUTBOX_QUOTA_BYTES: u64 = 128 * 1024 * 1024;
/// Default per-peer outbox quota for served results, lines.
pub const DEFAULT_OUTBOX_QUOTA_LINES: u64 = 10_000;

/// Who may connect (protocol-notes §Handshake: admission runs after auth).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accept {
    /// Any key (logged).
    #[default]
    Any,
    /// Keys that are allowed, trusted, dialed by us before, or hold an honored grant.
    Allowlist,
}

impl std::str::FromStr for Accept {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "any" => Ok(Accept::Any),
            "allowlist" => Ok(Accept::Allowlist),
            other => Err(ConfigError::Value {
                key: "accept",
                detail: format!("{other:?} is not \"any\" or \"allowlist\""),
            }),
        }
    }
}

/// A bad config file or variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {detail}")]
    File { path: String, detail: String },
    #[error("{key}: {detail}")]
    Value { key: &'static str, detail: String },
}

/// Settings as written (every field optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub accept: Option<Accept>,
    pub allow: Option<Vec<String>>,
    pub trust: Option<Vec<String>>,
    pub listen: Option<Vec<String>>,
    pub blob_limit: Option<u64>,
    pub name: Option<String>,
    pub about: Option<String>,
    pub presence: Option<bool>,
    pub outbox_quota_bytes: Option<u64>,
    pub outbox_quota_lines: Option<u64>,
    /// The local artifactr.v1 endpoint's address (`IP:PORT`).
    pub artifactr: Option<String>,
    /// Allow a non-loopback `artifactr` address.
    pub artifactr_public: Option<bool>,
    /// Relays to keep a standing connection to, each a pinned `tls:` address
    /// (spec/relay-circuits.md; `--via`, `AWP_VIA`).
    pub via: Option<Vec<String>>,
    /// Circuit policy when this node runs as a relay (the `[relay]` table).
    pub relay: Option<crate::net::circuit::Policy>,
}

impl Layer {
    /// `$home/config.toml`, or an empty layer when there is none.
    pub fn from_file(home: &Path) -> Result<Layer, ConfigError> {
        let path = home.join(CONFIG_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Layer::default()),
            Err(e) => {
                return Err(ConfigError::File {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })
            }
        };
        toml::from_str(&text).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// The `AWP_*` variables, read through `get` (so tests need not touch the process
    /// environment).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Layer, ConfigError> {
        let list = |k: &str| {
            get(k).map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
        };
        Ok(Layer {
            accept: get("AWP_ACCEPT").map(|v| v.parse()).transpose()?,
            allow: list("AWP_ALLOW"),
            trust: list("AWP_TRUST"),
            listen: list("AWP_LISTEN"),
            blob_limit: get("AWP_BLOB_LIMIT")
                .map(|v| {
                    crate::blob::parse_limit(&v).ok_or_else(|| ConfigError::Value {
                        key: "AWP_BLOB_LIMIT",
                        detail: format!("{v:?} is not a size (e.g. 52428800, 50M, 1G)"),
                    })
                })
                .transpose()?,
            name: get("AWP_NAME"),
            about: get("AWP_ABOUT"),
            presence: get("AWP_PRESENCE")
                .map(|v| env_bool("AWP_PRESENCE", &v))
                .transpose()?,
            artifactr: get("AWP_ARTIFACTR").filter(|v| !v.trim().is_empty()),
            artifactr_public: get("AWP_ARTIFACTR_PUBLIC")
                .map(|v| env_bool("AWP_ARTIFACTR_PUBLIC", &v))
                .transpose()?,
            outbox_quota_bytes: get("AWP_OUTBOX_QUOTA_BYTES")
                .map(|v| {
                    crate::blob::parse_limit(&v).ok_or_else(|| ConfigError::Value {
                        key: "AWP_OUTBOX_QUOTA_BYTES",
                        detail: format!("{v:?} is not a size (e.g. 134217728, 128M, 1G)"),
                    })
                })
                .transpose()?,
            outbox_quota_lines: get("AWP_OUTBOX_QUOTA_LINES")
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| ConfigError::Value {
                        key: "AWP_OUTBOX_QUOTA_LINES",
                        detail: format!("{v:?} is not a number of lines"),
                    })
                })
                .transpose()?,
            via: list("AWP_VIA"),
            relay: None,
        })
    }

    /// `self` with every field `over` sets replaced by it.
    pub fn under(self, over: Layer) -> Layer {
        Layer {
            accept: over.accept.or(self.accept),
            allow: over.allow.or(self.allow),
            trust: over.trust.or(self.trust),
            listen: over.listen.or(self.listen),
            blob_limit: over.blob_limit.or(self.blob_limit),
            name: over.name.or(self.name),
            about: over.about.or(self.about),
            presence: over.presence.or(self.presence),
            outbox_quota_bytes: over.outbox_quota_bytes.or(self.outbox_quota_bytes),
            outbox_quota_lines: over.outbox_quota_lines.or(self.outbox_quota_lines),
            artifactr: over.artifactr.or(self.artifactr),
            artifactr_public: over.artifactr_public.or(self.artifactr_public),
            via: over.via.or(self.via),
            relay: over.relay.or(self.relay),
        }
    }
}

fn env_bool(key: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v.trim() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" | "" => Ok(false),
        other => Err(ConfigError::Value {
            key,
            detail: format!("{other:?} is not true or false"),
        }),
    }
}

/// The `artifactr` address: `IP:PORT`, loopback unless `public` (spec/artifact-threads.md
/// §Local endpoint).
pub fn artifactr_addr(v: &str, public: bool) -> Result<std::net::SocketAddr, ConfigError> {
    let a: std::net::SocketAddr = v.trim().parse().map_err(|_| ConfigError::Value {
        key: "artifactr",
        detail: format!("{v:?} is not IP:PORT (e.g. 127.0.0.1:8765)"),
    })?;
    if !a.ip().is_loopback() && !public {
        return Err(ConfigError::Value {
            key: "artifactr",
            detail: format!(
                "{a} is not a loopback address; add --artifactr-public (artifactr_public = true) to serve it"
            ),
        });
    }
    Ok(a)
}

/// A `via` relay: a `tls:` address pinned to the relay's key (spec/relay-circuits.md).
pub fn via_addr(v: &str) -> Result<Address, ConfigError> {
    match v.trim().parse::<Address>() {
        Ok(a @ Address::Tls { pin: Some(_), .. }) => Ok(a),
        Ok(_) => Err(ConfigError::Value {
            key: "via",
            detail: format!("{v:?}: a relay is a pinned tls: address (tls:HOST:PORT#ed25519:KEY)"),
        }),
        Err(e) => Err(ConfigError::Value {
            key: "via",
            detail: e.to_string(),
        }),
    }
}

/// Effective settings, parsed.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub accept: Accept,
    pub allow: Vec<PeerKey>,
    pub trust: Vec<PeerKey>,
    pub listen: Vec<Address>,
    pub blob_limit: u64,
    pub name: Option<String>,
    pub about: Option<String>,
    pub presence: bool,
    /// Per-peer outbox quota for served results, bytes.
    pub outbox_quota_bytes: u64,
    /// Per-peer outbox quota for served results, lines.
    pub outbox_quota_lines: u64,
    /// The local artifactr.v1 endpoint (off when `None`), checked by [`artifactr_addr`].
    pub artifactr: Option<std::net::SocketAddr>,
    /// Relays to keep a standing connection to (pinned `tls:` addresses).
    pub via: Vec<Address>,
    /// Circuit policy when running as a relay.
    pub relay: crate::net::circuit::Policy,
}

fn keys(key: &'static str, v: Option<Vec<String>>) -> Result<Vec<PeerKey>, ConfigError> {
    v.unwrap_or_default()
        .iter()
        .map(|k| {
            PeerKey::parse(k).map_err(|e| ConfigError::Value {
                key,
                detail: format!("{k:?}: {e}"),
            })
        })
        .collect()
}

impl Settings {
    /// Parse a merged layer.
    pub fn from_layer(l: Layer) -> Result<Settings, ConfigError> {
        Ok(Settings {
            accept: l.accept.unwrap_or_default(),
            allow: keys("allow", l.allow)?,
            trust: keys("trust", l.trust)?,
            listen: l
                .listen
                .unwrap_or_default()
                .iter()
                .map(|a| {
                    a.parse()
                        .map_err(|e: crate::net::AddressError| ConfigError::Value {
                            key: "listen",
                            detail: e.to_string(),
                        })
                })
                .collect::<Result<_, _>>()?,
            blob_limit: l.blob_limit.unwrap_or(DEFAULT_BLOB_LIMIT),
            name: l.name,
            about: l.about,
            presence: l.presence.unwrap_or(false),
            outbox_quota_bytes: l.outbox_quota_bytes.unwrap_or(DEFAULT_OUTBOX_QUOTA_BYTES),
            outbox_quota_lines: l.outbox_quota_lines.unwrap_or(DEFAULT_OUTBOX_QUOTA_LINES),
            artifactr: l
                .artifactr
                .as_deref()
                .map(|a| artifactr_addr(a, l.artifactr_public.unwrap_or(false)))
                .transpose()?,
            via: l
                .via
                .unwrap_or_default()
                .iter()
                .map(|a| via_addr(a))
                .collect::<Result<_, _>>()?,
            relay: {
                let p = l.relay.unwrap_or_default();
                p.allowed_keys().map_err(|detail| ConfigError::Value {
                    key: "relay.allow",
                    detail,
                })?;
                p
            },
        })
    }

    /// File, then environment, then `flags` (the command line's layer).
    pub fn load(home: &Path, flags: Layer) -> Result<Settings, ConfigError> {
        let file = Layer::from_file(home)?;
        let env = Layer::from_env(|k| std::env::var(k).ok())?;
        Settings::from_layer(file.under(env).under(flags))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "ed25519:A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg";
    const B: &str = "ed25519:Kay64UG8yvCyLhqU000LxzYeUm0L_hLIl5S8kyKWbdc";

    #[test]
    fn flags_beat_environment_beat_file() {
        let home = tempfile::TempDir::new().unwrap();
        std::fs::write(
            home.path().join(CONFIG_FILE),
            format!(
                "accept = \"allowlist\"\nallow = [\"{A}\"]\nname = \"file\"\nblob_limit = 10\n"
            ),
        )
        .unwrap();
        let file = Layer::from_file(home.path()).unwrap();
        let env = Layer::from_env(|k| match k {
            "AWP_NAME" => Some("env".into()),
            "AWP_TRUST" => Some(format!("{B}, ")),
            _ => None,
        })
        .unwrap();
        let flags = Layer {
            name: Some("flag".into()),
            ..Layer::default()
        };
        let s = Settings::from_layer(file.clone().under(env.clone()).under(flags)).unwrap();
        assert_eq!(s.name.as_deref(), Some("flag"));
        assert_eq!(s.accept, Accept::Allowlist);
        assert_eq!(s.allow, vec![PeerKey::parse(A).unwrap()]);
        assert_eq!(s.trust, vec![PeerKey::parse(B).unwrap()]);
        assert_eq!(s.blob_limit, 10);
        let s = Settings::from_layer(file.under(env)).unwrap();
        assert_eq!(s.name.as_deref(), Some("env"));
    }

    #[test]
    fn bad_values_are_errors_that_name_the_key() {
        let home = tempfile::TempDir::new().unwrap();
        std::fs::write(home.path().join(CONFIG_FILE), "acept = \"any\"\n").unwrap();
        assert!(Layer::from_file(home.path())
            .unwrap_err()
            .to_string()
            .contains("acept"));
        std::fs::write(home.path().join(CONFIG_FILE), "allow = [\"rsa:AAAA\"]\n").unwrap();
        let e = Settings::from_layer(Layer::from_file(home.path()).unwrap()).unwrap_err();
        assert!(e.to_string().starts_with("allow"), "{e}");
        assert!(Layer::from_env(|k| (k == "AWP_ACCEPT").then(|| "some".into())).is_err());
        assert!(Layer::from_env(|k| (k == "AWP_BLOB_LIMIT").then(|| "lots".into())).is_err());
        // The artifactr endpoint: loopback only unless public.
        let l = |a: &str, p: Option<bool>| Layer {
            artifactr: Some(a.into()),
            artifactr_public: p,
            ..Layer::default()
        };
        let e = Settings::from_layer(l("0.0.0.0:8765", None)).unwrap_err();
        assert!(e.to_string().starts_with("artifactr"), "{e}");
        assert!(Settings::from_layer(l("localhost:1", None)).is_err());
        let s = Settings::from_layer(l("0.0.0.0:8765", Some(true))).unwrap();
        assert_eq!(s.artifactr, Some("0.0.0.0:8765".parse().unwrap()));
        let s = Settings::from_layer(l("[::1]:0", None)).unwrap();
        assert!(s.artifactr.unwrap().ip().is_loopback());
        assert_eq!(
            Settings::from_layer(Layer::default()).unwrap().blob_limit,
            DEFAULT_BLOB_LIMIT
        );
        assert!(
            Layer::from_env(|k| (k == "AWP_OUTBOX_QUOTA_LINES").then(|| "many".into())).is_err()
        );
        assert!(
            Layer::from_env(|k| (k == "AWP_OUTBOX_QUOTA_BYTES").then(|| "big".into())).is_err()
        );
    }

    #[test]
    fn outbox_quota_from_file_env_and_flags() {
        let home = tempfile::TempDir::new().unwrap();
        let d = Settings::from_layer(Layer::default()).unwrap();
        assert_eq!(d.outbox_quota_bytes, DEFAULT_OUTBOX_QUOTA_BYTES);
        assert_eq!(d.outbox_quota_lines, DEFAULT_OUTBOX_QUOTA_LINES);
        std::fs::write(
            home.path().join(CONFIG_FILE),
            "outbox_quota_bytes = 1000\noutbox_quota_lines = 7\n",
        )
        .unwrap();
        let file = Layer::from_file(home.path()).unwrap();
        let env =
            Layer::from_env(|k| (k == "AWP_OUTBOX_QUOTA_BYTES").then(|| "2M".into())).unwrap();
        let s = Settings::from_layer(file.clone().under(env.clone())).unwrap();
        assert_eq!((s.outbox_quota_bytes, s.outbox_quota_lines), (2 << 20, 7));
        let flags = Layer {
            outbox_quota_lines: Some(3),
            ..Layer::default()
        };
        let s = Settings::from_layer(file.under(env).under(flags)).unwrap();
        assert_eq!((s.outbox_quota_bytes, s.outbox_quota_lines), (2 << 20, 3));
    }

    #[test]
    fn via_relays_and_the_relay_table() {
        let home = tempfile::TempDir::new().unwrap();
        std::fs::write(
            home.path().join(CONFIG_FILE),
            format!(
                "via = [\"tls:relay.example:7700#{A}\"]\n[relay]\nallow = [\"{B}\"]\nmax_circuits = 5\n"
            ),
        )
        .unwrap();
        let s = Settings::from_layer(Layer::from_file(home.path()).unwrap()).unwrap();
        assert_eq!(s.via.len(), 1);
        assert_eq!(s.via[0].pin().unwrap().to_string(), A);
        assert_eq!(s.relay.allow, vec![B.to_string()]);
        assert_eq!(s.relay.max_circuits, 5);
        // A relay must be a pinned tls: address; the allowlist holds keys; no unknown keys.
        for bad in [
            "via = [\"tls:relay.example:7700\"]",
            "via = [\"tcp:127.0.0.1:7700\"]",
            "[relay]\nallow = [\"nope\"]",
        ] {
            std::fs::write(home.path().join(CONFIG_FILE), bad).unwrap();
            let l = Layer::from_file(home.path()).unwrap();
            assert!(Settings::from_layer(l).is_err(), "{bad}");
        }
        std::fs::write(home.path().join(CONFIG_FILE), "[relay]\nmax = 1").unwrap();
        assert!(Layer::from_file(home.path()).is_err());
        let env = Layer::from_env(|k| (k == "AWP_VIA").then(|| format!("tls:10.0.0.1:7700#{A}")))
            .unwrap();
        assert_eq!(Settings::from_layer(env).unwrap().via.len(), 1);
    }
}
