//! Where the `files` of the MCP tools may come from (issue 11 §1, security): a model that
//! follows text a peer injected must not be able to send the node's private key or any
//! other file of the host. A path is accepted only when, after resolving every symlink
//! (`canonicalize`), it lies under one of the allowed roots (`awp mcp --files-root DIR`,
//! repeatable; default the server's current directory) and not inside the node home
//! (`$AWP_HOME`, which holds `identity.json`), whatever the roots say.

use crate::cli::Failure;
use std::path::{Path, PathBuf};

/// The roots `files` may be read from and the node home they may never touch, both
/// canonical (symlinks resolved at start).
#[derive(Debug, Clone)]
pub struct FileRoots {
    roots: Vec<PathBuf>,
    home: PathBuf,
}

/// `p` canonical when it exists, else absolute as given.
fn canonical_or_absolute(p: &Path) -> PathBuf {
    p.canonicalize()
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

impl FileRoots {
    /// The allowed `roots` (none: the current directory) and the node `home`.
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
        Ok(FileRoots {
            roots: out,
            home: canonical_or_absolute(home),
        })
    }

    /// The canonical path of `file` when the rules allow it.
    ///
    /// Errors (usage, naming the rule): the file cannot be resolved, it is inside the node
    /// home, or it is outside every root (a symlink counts where it points).
    pub fn check(&self, file: &str) -> Result<PathBuf, Failure> {
        let given = Path::new(file);
        let canon = given.canonicalize().map_err(|e| {
            Failure::usage(
                format!("cannot read {file}: {e}"),
                "check the path in `files`",
            )
        })?;
        if canon.starts_with(&self.home) {
            return Err(Failure::usage(
                format!(
                    "refused to send {file}: it is inside the node home {} (files from the node \
                     home, which holds its private key, are never sent)",
                    self.home.display()
                ),
                "send only files of your project",
            ));
        }
        #[cfg(unix)]
        self.same_file_check(file, &canon)?;
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
        Ok(canon)
    }
}

#[cfg(unix)]
impl FileRoots {
    /// Paths can hide a file of the home where `canonicalize` cannot see it: a hard link
    /// (another name of the same inode) or a bind mount of the home. Refused: the same
    /// inode as a file at the top of the home (`identity.json`, the config, the tokens),
    /// a file with other hard links on the home's file system, and a path with the home
    /// directory itself among its ancestors by inode.
    fn same_file_check(&self, file: &str, canon: &Path) -> Result<(), Failure> {
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
        let meta = std::fs::metadata(canon).map_err(|e| {
            Failure::usage(
                format!("cannot read {file}: {e}"),
                "check the path in `files`",
            )
        })?;
        let id = (meta.dev(), meta.ino());
        let Ok(home) = std::fs::metadata(&self.home) else {
            return Ok(());
        };
        if let Ok(entries) = std::fs::read_dir(&self.home) {
            // The top of the home holds a handful of files; the bound keeps a strange
            // home from making each send slow (beyond it, fail closed).
            for (n, e) in entries.flatten().enumerate() {
                if n >= 4096 {
                    return refuse("the node home is too large to check it against".into());
                }
                if let Ok(m) = e.metadata() {
                    if m.is_file() && (m.dev(), m.ino()) == id {
                        return refuse(format!(
                            "it is the node home's `{}` under another name (a hard link)",
                            e.file_name().to_string_lossy()
                        ));
                    }
                }
            }
        }
        if meta.is_file() && meta.nlink() > 1 && meta.dev() == home.dev() {
            return refuse("it has other hard links on the node home's file system".into());
        }
        let home_id = (home.dev(), home.ino());
        for a in canon.ancestors().skip(1) {
            if let Ok(m) = std::fs::metadata(a) {
                if (m.dev(), m.ino()) == home_id {
                    return refuse(
                        "it is inside the node home (mounted or linked elsewhere)".into(),
                    );
                }
            }
        }
        Ok(())
    }
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
}
