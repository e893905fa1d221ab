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
}
