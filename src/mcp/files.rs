//! Where the `files` of the MCP tools may come from (issue 11 §1, security): a model that
//! follows text a peer injected must not be able to send the node's private key or any
//! other file of the host. A path is accepted only when, after resolving every symlink
//! (`canonicalize`), it lies under one of the allowed roots (`awp mcp --files-root DIR`,
//! repeatable; default the server's current directory) and not inside the node home
//! (`$AWP_HOME`, which holds `identity.json`), whatever the roots say.

use crate::cli::blobs::{local_file, FileArg};
use crate::cli::Failure;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// How `files` are named in the usage errors of [`local_file`].
const FILES_ARG: FileArg = FileArg {
    read_hint: "check the path in `files`",
    not_file_hint: "`files` takes files, not directories",
};

/// Most entries read at the top of the node home (at start); beyond it every send is
/// refused (fail closed), so a strange home cannot make the start slow.
pub const MAX_HOME_ENTRIES: usize = 4096;

/// The roots `files` may be read from and the node home they may never touch, both
/// canonical (symlinks resolved at start).
#[derive(Debug, Clone)]
pub struct FileRoots {
    roots: Vec<PathBuf>,
    /// The home, canonical when it existed at start, else absolute as given.
    home_path: PathBuf,
    /// What the checks need of the home, read once: at start, or at the first send that
    /// finds the home (it may be made after `awp mcp` starts).
    home: OnceLock<HomeFacts>,
}

/// The node home as read once ([`FileRoots::new`]).
#[derive(Debug, Clone)]
struct HomeFacts {
    /// Canonical path.
    canon: PathBuf,
    /// Device and inode of the home directory.
    #[cfg(unix)]
    id: (u64, u64),
    /// Device, inode and name of each regular file at the top of the home (`None`: over
    /// [`MAX_HOME_ENTRIES`] entries).
    #[cfg(unix)]
    top: Option<Vec<((u64, u64), String)>>,
}

impl HomeFacts {
    /// Read the home at `home`, if it is there.
    fn read(home: &Path) -> Option<HomeFacts> {
        let canon = home.canonicalize().ok()?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&canon).ok()?;
            let mut top = Some(Vec::new());
            if let Ok(entries) = std::fs::read_dir(&canon) {
                for (n, e) in entries.flatten().enumerate() {
                    if n >= MAX_HOME_ENTRIES {
                        top = None;
                        break;
                    }
                    if let (Ok(m), Some(top)) = (e.metadata(), top.as_mut()) {
                        if m.is_file() {
                            top.push((
                                (m.dev(), m.ino()),
                                e.file_name().to_string_lossy().into_owned(),
                            ));
                        }
                    }
                }
            }
            Some(HomeFacts {
                canon,
                id: (meta.dev(), meta.ino()),
                top,
            })
        }
        #[cfg(not(unix))]
        Some(HomeFacts { canon })
    }
}

/// `p` canonical when it exists, else absolute as given.
fn canonical_or_absolute(p: &Path) -> PathBuf {
    p.canonicalize()
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

impl FileRoots {
    /// The allowed `roots` (none: the current directory) and the node `home`, whose
    /// canonical path, device/inode and top files are read here once (or, when the home
    /// does not exist yet, at the first check that finds it).
    ///
    /// Errors: a root that does not exist or is no directory (usage).
    pub fn new(roots: &[PathBuf], home: &Path) -> Result<FileRoots, Failure> {
        let given: Vec<PathBuf> = if roots.is_empty() {
            vec![std::env::current_dir().map_err(|e| {
                Failure::usage(
                    format!("cannot read the current directory: {e}"),
                    "start `awp mcp` in an existing directory or give --files-root DIR",
                )
            })?]
        } else {
            roots.to_vec()
        };
        let mut out = Vec::with_capacity(given.len());
        for r in given {
            let c = r.canonicalize().map_err(|e| {
                Failure::usage(
                    format!("--files-root {}: {e}", r.display()),
                    "give an existing directory",
                )
            })?;
            if !c.is_dir() {
                return Err(Failure::usage(
                    format!("--files-root {} is not a directory", r.display()),
                    "give an existing directory",
                ));
            }
            out.push(c);
        }
        let fr = FileRoots {
            roots: out,
            home_path: canonical_or_absolute(home),
            home: OnceLock::new(),
        };
        fr.home_facts();
        Ok(fr)
    }

    /// The home as read once, reading it now if that did not succeed before.
    fn home_facts(&self) -> Option<&HomeFacts> {
        if let Some(f) = self.home.get() {
            return Some(f);
        }
        let f = HomeFacts::read(&self.home_path)?;
        Some(self.home.get_or_init(|| f))
    }

    /// The canonical path of `file` (UTF-8) when the rules allow it: the checks of every
    /// sent file ([`local_file`]: it resolves, is a regular file), then this front's.
    ///
    /// Errors (usage, naming the rule): the file cannot be resolved or is no regular file,
    /// it is inside the node home (or the same file as one there), or it is outside every
    /// root (a symlink counts where it points).
    pub fn check(&self, file: &str) -> Result<String, Failure> {
        let local = local_file(Path::new(file), true, &FILES_ARG)?;
        let canon = Path::new(&local.path);
        let facts = self.home_facts();
        let home = facts.map_or(&self.home_path, |f| &f.canon);
        if canon.starts_with(home) {
            return Err(Failure::usage(
                format!(
                    "refused to send {file}: it is inside the node home {} (files from the node \
                     home, which holds its private key, are never sent)",
                    home.display()
                ),
                "send only files of your project",
            ));
        }
        #[cfg(unix)]
        if let Some(facts) = facts {
            same_file_check(facts, file, canon, &local.meta)?;
        }
        if !self.roots.iter().any(|r| canon.starts_with(r)) {
            let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
            return Err(Failure::usage(
                format!(
                    "refused to send {file}: it resolves outside the allowed file roots ({}); \
                     `awp mcp` sends only files under its --files-root directories (default: \
                     its current directory)",
                    roots.join(", ")
                ),
                "copy the file under a root, or start `awp mcp` with --files-root DIR",
            ));
        }
        Ok(local.path)
    }
}

/// Paths can hide a file of the home where `canonicalize` cannot see it: a hard link
/// (another name of the same inode) or a bind mount of the home. Refused: the same inode
/// as a file at the top of the home when `awp mcp` started (`identity.json`, the config,
/// the tokens), a file with other hard links on the home's file system (this covers the
/// files made there later), and a path with the home directory itself among its
/// ancestors by inode. `meta` is `canon`'s metadata; the home's comes from `home`.
#[cfg(unix)]
fn same_file_check(
    home: &HomeFacts,
    file: &str,
    canon: &Path,
    meta: &std::fs::Metadata,
) -> Result<(), Failure> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| -> Result<(), Failure> {
        Err(Failure::usage(
            format!(
                "refused to send {file}: {why} (files from the node home, which holds its \
                 private key, are never sent)"
            ),
            "copy the file into your project and send the copy",
        ))
    };
    let id = (meta.dev(), meta.ino());
    let Some(top) = &home.top else {
        return refuse("the node home is too large to check it against".into());
    };
    if let Some((_, name)) = top.iter().find(|(t, _)| *t == id) {
        return refuse(format!(
            "it is the node home's `{name}` under another name (a hard link)"
        ));
    }
    if meta.is_file() && meta.nlink() > 1 && meta.dev() == home.id.0 {
        return refuse("it has other hard links on the node home's file system".into());
    }
    for a in canon.ancestors().skip(1) {
        if let Ok(m) = std::fs::metadata(a) {
            if (m.dev(), m.ino()) == home.id {
                return refuse("it is inside the node home (mounted or linked elsewhere)".into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_outside_root_and_symlink_escapes_are_refused() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let home = root.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join("identity.json"), "{}").unwrap();
        std::fs::write(root.path().join("ok.txt"), "ok").unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link"))
            .unwrap();
        let fr = FileRoots::new(&[root.path().to_path_buf()], &home).unwrap();

        let ok = fr
            .check(root.path().join("ok.txt").to_str().unwrap())
            .unwrap();
        assert!(ok.ends_with("ok.txt"));
        let e = fr
            .check(home.join("identity.json").to_str().unwrap())
            .unwrap_err();
        assert!(
            e.message().unwrap().contains("inside the node home"),
            "{e:?}"
        );
        let e = fr
            .check(outside.path().join("secret").to_str().unwrap())
            .unwrap_err();
        assert!(e
            .message()
            .unwrap()
            .contains("outside the allowed file roots"));
        #[cfg(unix)]
        {
            let e = fr
                .check(root.path().join("link").to_str().unwrap())
                .unwrap_err();
            assert!(e
                .message()
                .unwrap()
                .contains("outside the allowed file roots"));
        }
        let e = fr
            .check(root.path().join("../../etc/shadow").to_str().unwrap())
            .unwrap_err();
        assert!(
            e.message().unwrap().contains("refused")
                || e.message().unwrap().contains("cannot read")
        );
        assert!(FileRoots::new(&[root.path().join("nope")], &home).is_err());
    }

    /// A hard link in a root to the home's `identity.json` is the same file: refused,
    /// though its path is in the root and no symlink is involved.
    #[cfg(unix)]
    #[test]
    fn a_hard_link_to_a_home_file_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        std::fs::write(home.path().join("identity.json"), "{\"seed\":1}").unwrap();
        std::fs::write(home.path().join("other"), "x").unwrap();
        std::fs::hard_link(
            home.path().join("identity.json"),
            root.path().join("innocent.txt"),
        )
        .unwrap();
        std::fs::write(root.path().join("plain.txt"), "ok").unwrap();
        let fr = FileRoots::new(&[root.path().to_path_buf()], home.path()).unwrap();
        let e = fr
            .check(root.path().join("innocent.txt").to_str().unwrap())
            .unwrap_err();
        let m = e.message().unwrap();
        assert!(m.contains("`identity.json` under another name"), "{m}");
        assert!(fr
            .check(root.path().join("plain.txt").to_str().unwrap())
            .is_ok());
        // Other hard links on the home's file system: refused too (a link to a file
        // the check cannot see, e.g. deeper in the home).
        std::fs::hard_link(root.path().join("plain.txt"), root.path().join("twin.txt")).unwrap();
        let same_fs = std::fs::metadata(root.path())
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.dev()
            })
            .unwrap()
            == std::fs::metadata(home.path())
                .map(|m| {
                    use std::os::unix::fs::MetadataExt;
                    m.dev()
                })
                .unwrap();
        let r = fr.check(root.path().join("twin.txt").to_str().unwrap());
        assert_eq!(r.is_err(), same_fs, "{r:?}");
    }

    /// The home's top files are read once, at start: a file made there later and hard
    /// linked into a root is refused by the hard-link rule (not by name, which would need
    /// a read of the home at each send); a file there at start is refused by name.
    #[cfg(unix)]
    #[test]
    fn the_home_is_read_once_at_start() {
        // One parent: the root and the home are on one file system.
        let dir = tempfile::tempdir().unwrap();
        let (root, home) = (dir.path().join("root"), dir.path().join("home"));
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join("identity.json"), "{\"seed\":1}").unwrap();
        let fr = FileRoots::new(std::slice::from_ref(&root), &home).unwrap();
        std::fs::write(home.join("late.json"), "{}").unwrap();
        std::fs::hard_link(home.join("late.json"), root.join("late.txt")).unwrap();
        std::fs::hard_link(home.join("identity.json"), root.join("id.txt")).unwrap();
        let e = fr
            .check(root.join("late.txt").to_str().unwrap())
            .unwrap_err();
        let m = e.message().unwrap();
        assert!(m.contains("other hard links on the node home"), "{m}");
        let e = fr.check(root.join("id.txt").to_str().unwrap()).unwrap_err();
        let m = e.message().unwrap();
        assert!(m.contains("`identity.json` under another name"), "{m}");
    }

    /// A home that does not exist when `awp mcp` starts is read at the first send that
    /// finds it: its files are refused from then on.
    #[cfg(unix)]
    #[test]
    fn a_home_made_after_start_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (root, home) = (dir.path().join("root"), dir.path().join("home"));
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("plain.txt"), "ok").unwrap();
        let fr = FileRoots::new(std::slice::from_ref(&root), &home).unwrap();
        assert!(fr.check(root.join("plain.txt").to_str().unwrap()).is_ok());
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join("identity.json"), "{\"seed\":1}").unwrap();
        std::fs::hard_link(home.join("identity.json"), root.join("id.txt")).unwrap();
        let e = fr.check(root.join("id.txt").to_str().unwrap()).unwrap_err();
        let m = e.message().unwrap();
        assert!(m.contains("`identity.json` under another name"), "{m}");
        let e = fr
            .check(home.join("identity.json").to_str().unwrap())
            .unwrap_err();
        assert!(e.message().unwrap().contains("inside the node home"));
    }

    /// A directory, in a root or not, is no file to send.
    #[test]
    fn a_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("sub")).unwrap();
        let fr = FileRoots::new(&[root.path().to_path_buf()], &root.path().join("home")).unwrap();
        let e = fr
            .check(root.path().join("sub").to_str().unwrap())
            .unwrap_err();
        assert!(e.message().unwrap().contains("is not a regular file"));
    }
}
