//! AWP grant capabilities for artifact threads: `artifact:write`, `artifact:resolve`,
//! `artifact:admin`, each optionally scoped to one AWP thread as `CAP@<th>` (e.g.
//! `artifact:write@thr_01J…`). They stand in for artifactr's `authorize` hook and write
//! policy (spec/artifact-threads.md §Capabilities):
//! - `artifact:write`: create/edit/archive apply directly (still proposals in `suggest`
//!   mode); without it they become proposals.
//! - `artifact:resolve`: accept or reject proposals (never one's own); else forbidden.
//! - `artifact:admin`: create_thread, set_thread_mode, set_focus; else forbidden.

use serde::{Deserialize, Serialize};

/// Capability name: write directly.
pub const WRITE: &str = "artifact:write";
/// Capability name: resolve proposals.
pub const RESOLVE: &str = "artifact:resolve";
/// Capability name: thread mode, focus and threads.
pub const ADMIN: &str = "artifact:admin";

/// What an actor may do in one workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CapSet {
    /// `artifact:write`.
    pub write: bool,
    /// `artifact:resolve`.
    pub resolve: bool,
    /// `artifact:admin`.
    pub admin: bool,
}

impl CapSet {
    /// Everything (the host's own user).
    pub fn all() -> Self {
        CapSet {
            write: true,
            resolve: true,
            admin: true,
        }
    }

    /// Nothing beyond what anyone connected may do (post messages, propose).
    pub fn none() -> Self {
        CapSet::default()
    }

    /// The set given by honored grant caps (as `grant::honored_caps` returns them, from
    /// grants valid now) for the AWP thread `th`: `CAP` counts everywhere, `CAP@th` only
    /// in `th`. Other caps, other threads and malformed scopes are ignored.
    pub fn from_grant_caps<S: AsRef<str>>(caps: impl IntoIterator<Item = S>, th: &str) -> Self {
        let mut set = CapSet::none();
        for c in caps {
            let c = c.as_ref();
            let name = match c.split_once('@') {
                None => c,
                Some((name, scope)) if scope == th && !th.is_empty() => name,
                Some(_) => continue,
            };
            match name {
                WRITE => set.write = true,
                RESOLVE => set.resolve = true,
                ADMIN => set.admin = true,
                _ => {}
            }
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_caps_apply_to_every_thread() {
        let s = CapSet::from_grant_caps(["artifact:write", "exec", "artifact:admin"], "thr_a");
        assert_eq!(
            s,
            CapSet {
                write: true,
                resolve: false,
                admin: true
            }
        );
    }

    #[test]
    fn scoped_caps_apply_only_to_their_thread() {
        let caps = ["artifact:resolve@thr_a", "artifact:write@thr_b"];
        let a = CapSet::from_grant_caps(caps, "thr_a");
        assert!(a.resolve && !a.write && !a.admin);
        let b = CapSet::from_grant_caps(caps, "thr_b");
        assert!(b.write && !b.resolve);
        assert_eq!(CapSet::from_grant_caps(caps, "thr_c"), CapSet::none());
    }

    #[test]
    fn malformed_or_foreign_caps_are_ignored() {
        let caps = [
            "artifact:write@",
            "artifact:writer",
            "Artifact:admin",
            "artifact:resolve@thr_a@thr_a",
            "artifact:admin@thr_ab",
        ];
        assert_eq!(CapSet::from_grant_caps(caps, "thr_a"), CapSet::none());
        assert_eq!(
            CapSet::from_grant_caps(["artifact:write@"], ""),
            CapSet::none()
        );
    }
}
