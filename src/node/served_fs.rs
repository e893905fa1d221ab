//! fs-read and fs-write confined to the served root.
//!
//! The root is opened once, at start ([`Root`]); every request path is resolved beneath
//! that handle, component by component, by `cap-std` (`openat2(RESOLVE_BENEATH)` where the
//! kernel has it, else its own walk with `O_NOFOLLOW` per component): a symlink or `..`
//! that leads out fails even when the tree changes during the walk, and the last
//! component is never followed when it is a symlink. A path is never re-walked as a
//! string after it was checked.
//!
//! - Only regular files are read or appended to, checked with `fstat` on the descriptor
//!   opened with `O_NONBLOCK` (a FIFO, socket or device inside the root is refused and
//!   never blocks a worker).
//! - A regular file with more than one link is refused (read and append) unless
//!   `--allow-hardlinks`: a hard link inside the root may name a file outside it.
//! - A write replaces the file by a temporary file in the same directory and a rename,
//!   so it replaces the name (a symlink, a hard link), never an inode shared with a file
//!   elsewhere.
//! - A read over [`MAX_INLINE`] bytes is returned as a blob read from the open file as
//!   its chunks are queued, never held in memory whole.

use crate::blob::{FileSlice, Outgoing};
use crate::wire;
use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, MetadataExt as _, OpenOptions, OpenOptionsExt};
use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Output kept inline per stream (stdout, stderr, file content), in bytes.
pub const MAX_INLINE: usize = 64 * 1024;
/// Largest fs-read `length` and fs-write `content`, bytes.
pub const MAX_FS_BYTES: u64 = 8 * 1024 * 1024;

/// The served root, opened once.
#[derive(Debug, Clone)]
pub struct Root {
    /// Its canonical path (for messages, exec and the sandbox).
    pub path: PathBuf,
    /// The open directory every request path is resolved beneath.
    pub dir: Arc<Dir>,
    /// Serve regular files with more than one link (`--allow-hardlinks`).
    pub allow_hardlinks: bool,
}

impl Root {
    /// Open `path` (canonicalized first).
    pub fn open(path: &Path, allow_hardlinks: bool) -> std::io::Result<Root> {
        let path = path.canonicalize()?;
        let dir = Dir::open_ambient_dir(&path, cap_std::ambient_authority())?;
        Ok(Root {
            path,
            dir: Arc::new(dir),
            allow_hardlinks,
        })
    }
}

/// `rel` as a path relative to the root, checked lexically: no `..`, and an absolute path
/// only when it lies under the root (it is made relative). `""` and `"."` name the root.
pub fn relative(root: &Path, rel: &str) -> Result<PathBuf, String> {
    let p = Path::new(rel);
    let rel_part: &Path = if p.is_absolute() {
        p.strip_prefix(root)
            .map_err(|_| "path is outside the root".to_string())?
    } else {
        p
    };
    let mut out = PathBuf::new();
    for c in rel_part.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return Err("path may not contain `..` or a root".into()),
        }
    }
    Ok(out)
}

/// A message for an error of a confined open.
fn open_error(e: std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::EMLINK) => "path is a symlink".into(),
        Some(libc::EXDEV) | Some(libc::EPERM) if e.to_string().contains("outside") => {
            "path leads outside the root".into()
        }
        _ if e.to_string().contains("outside") => "path leads outside the root".into(),
        _ => e.to_string(),
    }
}

/// Check an open file: a regular file, and one link unless hard links are allowed.
fn check_regular(f: &std::fs::File, root: &Root) -> Result<std::fs::Metadata, String> {
    let m = f.metadata().map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a regular file".into());
    }
    if m.nlink() > 1 && !root.allow_hardlinks {
        return Err(format!(
            "the file has {} hard links; refused (the node serves them with --allow-hardlinks)",
            m.nlink()
        ));
    }
    Ok(m)
}

/// Open `rel` beneath the root: never following a symlink in the last component, with
/// `O_NONBLOCK` (a FIFO does not wait for a writer), then [`check_regular`].
fn open_regular(
    root: &Root,
    rel: &Path,
    opts: &mut OpenOptions,
) -> Result<(std::fs::File, std::fs::Metadata), String> {
    if rel.as_os_str().is_empty() {
        return Err("not a regular file".into());
    }
    opts.follow(FollowSymlinks::No)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let f = root
        .dir
        .open_with(rel, opts)
        .map_err(open_error)?
        .into_std();
    let m = check_regular(&f, root)?;
    Ok((f, m))
}

fn str_arg<'a>(req: &'a Value, k: &str) -> Option<&'a str> {
    req.get(k).and_then(Value::as_str)
}

/// Serve an fs-read request `{path, offset, length}`: the result, and the blob holding
/// the content when it is over [`MAX_INLINE`] bytes.
pub fn fs_read(root: &Root, req: &Value) -> (Value, Vec<Outgoing>) {
    let Some(path) = str_arg(req, "path") else {
        return (json!({"error": "path is required"}), vec![]);
    };
    match read(root, req, path) {
        Ok(r) => r,
        Err(e) => (json!({"path": path, "error": e}), vec![]),
    }
}

fn read(root: &Root, req: &Value, path: &str) -> Result<(Value, Vec<Outgoing>), String> {
    let rel = relative(&root.path, path)?;
    let offset = req.get("offset").and_then(Value::as_u64).unwrap_or(0);
    let length = req
        .get("length")
        .and_then(Value::as_u64)
        .unwrap_or(MAX_INLINE as u64)
        .min(MAX_FS_BYTES);
    let (mut f, meta) = open_regular(root, &rel, OpenOptions::new().read(true))?;
    let size = meta.len();
    let start = offset.min(size);
    let n = length.min(size - start);
    let eof = start + n >= size;
    let mut out = json!({"path": path, "offset": offset, "length": n, "size": size, "eof": eof});
    if n as usize <= MAX_INLINE {
        let mut buf = Vec::with_capacity(n as usize);
        f.seek(SeekFrom::Start(start)).map_err(|e| e.to_string())?;
        (&mut f)
            .take(n)
            .read_to_end(&mut buf)
            .map_err(|e| e.to_string())?;
        out["length"] = json!(buf.len());
        match String::from_utf8(buf) {
            Ok(text) => out["content"] = json!(text),
            Err(e) => out["content_b64"] = json!(wire::b64::encode_std(e.as_bytes())),
        }
        return Ok((out, vec![]));
    }
    // Over MAX_INLINE: a blob read from the open file; hash it by streaming.
    let (sha256, head) = hash_range(&f, start, n).map_err(|e| e.to_string())?;
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "content".into());
    let mime = crate::blob::guess_mime(&name, &head);
    let blob = Outgoing {
        blob_ref: ulid::Ulid::generate().to_string(),
        name,
        mime,
        data: Vec::new(),
        file: Some(FileSlice {
            file: Arc::new(f),
            offset: start,
            len: n,
        }),
        sha256,
        source: root.path.join(&rel),
        stream: None,
    };
    out["content_blob"] = json!(blob.blob_ref);
    Ok((out, vec![blob]))
}

/// SHA-256 (hex) of `len` bytes of `f` from `start`, read 64 KiB at a time, and the first
/// 512 of them (for the media type).
fn hash_range(f: &std::fs::File, start: u64, len: u64) -> std::io::Result<(String, Vec<u8>)> {
    use sha2::Digest;
    use std::os::unix::fs::FileExt;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut head = Vec::new();
    let mut done = 0u64;
    while done < len {
        let want = ((len - done) as usize).min(buf.len());
        let got = f.read_at(&mut buf[..want], start + done)?;
        if got == 0 {
            break;
        }
        if head.len() < 512 {
            head.extend_from_slice(&buf[..got.min(512 - head.len())]);
        }
        h.update(&buf[..got]);
        done += got as u64;
    }
    Ok((crate::blob::hex(&h.finalize()), head))
}

/// Where fs-write takes its data from.
pub enum WriteSource {
    /// `content` (text) of the request.
    Text(String),
    /// A completed request blob, opened by the caller.
    File(std::fs::File),
}

/// Serve an fs-write request `{path, content | blob, append}`.
pub fn fs_write(root: &Root, req: &Value, src: Option<WriteSource>) -> Value {
    let Some(path) = str_arg(req, "path") else {
        return json!({"error": "path is required"});
    };
    let src = match (str_arg(req, "content"), src) {
        (Some(c), _) => WriteSource::Text(c.to_string()),
        (None, Some(s)) => s,
        (None, None) => {
            return json!({"path": path, "error": "content (text) or blob (the ref of a blob part of this msg) is required"})
        }
    };
    let append = req.get("append").and_then(Value::as_bool).unwrap_or(false);
    match write(root, path, src, append) {
        Ok((written, size)) => {
            json!({"path": path, "written": written, "size": size, "append": append})
        }
        Err(e) => json!({"path": path, "error": e}),
    }
}

fn write(root: &Root, path: &str, src: WriteSource, append: bool) -> Result<(u64, u64), String> {
    let rel = relative(&root.path, path)?;
    let (Some(name), parent) = (rel.file_name(), rel.parent()) else {
        return Err("path names no file".into());
    };
    let name = PathBuf::from(name);
    let dir = match parent.filter(|p| !p.as_os_str().is_empty()) {
        Some(p) => root.dir.open_dir(p).map_err(open_error)?,
        None => root.dir.try_clone().map_err(|e| e.to_string())?,
    };
    let mut reader: Box<dyn Read> = match src {
        WriteSource::Text(t) => Box::new(std::io::Cursor::new(t.into_bytes())),
        WriteSource::File(f) => Box::new(f),
    };
    // At most MAX_FS_BYTES + 1 are read: one more means the content is too large.
    let mut reader = (&mut reader).take(MAX_FS_BYTES + 1);
    let too_large = || format!("content over {MAX_FS_BYTES} bytes");
    let child = Root {
        path: root.path.join(parent.unwrap_or(Path::new(""))),
        dir: Arc::new(dir),
        allow_hardlinks: root.allow_hardlinks,
    };
    if append {
        let mut o = OpenOptions::new();
        o.append(true);
        match open_regular(&child, &name, &mut o) {
            Ok((mut f, _)) => {
                let n = copy(&mut reader, &mut f).map_err(|e| e.to_string())?;
                if n > MAX_FS_BYTES {
                    return Err(too_large());
                }
                f.sync_data().map_err(|e| e.to_string())?;
                let size = f.metadata().map_err(|e| e.to_string())?.len();
                return Ok((n, size));
            }
            Err(e) if child.dir.symlink_metadata(&name).is_ok() => return Err(e),
            Err(_) => {} // not there: create it below
        }
    }
    // Replace: a temporary file in the same directory, then a rename over the name.
    let mode = match child.dir.symlink_metadata(&name) {
        Ok(m) if m.is_dir() => return Err("path is a directory".into()),
        Ok(m) if m.is_file() => Some(m.mode() & 0o7777),
        _ => None,
    };
    let tmp = PathBuf::from(format!(
        ".{}.{}.awp-tmp",
        name.to_string_lossy(),
        ulid::Ulid::generate()
    ));
    let mut o = OpenOptions::new();
    o.write(true).create_new(true).follow(FollowSymlinks::No);
    if let Some(m) = mode {
        o.mode(m);
    }
    let mut f = child
        .dir
        .open_with(&tmp, &o)
        .map_err(open_error)?
        .into_std();
    let res = (|| -> Result<u64, String> {
        let n = copy(&mut reader, &mut f).map_err(|e| e.to_string())?;
        if n > MAX_FS_BYTES {
            return Err(too_large());
        }
        if let Some(m) = mode {
            // create_new applied the umask; keep the replaced file's mode exactly.
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(m))
                .map_err(|e| e.to_string())?;
        }
        f.sync_data().map_err(|e| e.to_string())?;
        child
            .dir
            .rename(&tmp, &child.dir, &name)
            .map_err(|e| e.to_string())?;
        Ok(n)
    })();
    match res {
        Ok(n) => Ok((n, n)),
        Err(e) => {
            let _ = child.dir.remove_file(&tmp);
            Err(e)
        }
    }
}

/// Copy everything from `r` to `w` through a 64 KiB buffer; returns the bytes copied.
fn copy(r: &mut impl Read, w: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let got = match r.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        n += got as u64;
        if n > MAX_FS_BYTES {
            return Ok(n);
        }
        w.write_all(&buf[..got])?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_in(dir: &Path) -> Root {
        Root::open(dir, false).unwrap()
    }

    #[test]
    fn paths_stay_inside_the_root() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = root_in(dir.path());
        let r = &root.path;
        std::fs::create_dir(r.join("sub")).unwrap();
        std::fs::write(r.join("sub/a.txt"), "x").unwrap();
        assert_eq!(relative(r, "sub/a.txt").unwrap(), Path::new("sub/a.txt"));
        assert_eq!(relative(r, "./new/f").unwrap(), Path::new("new/f"));
        assert!(relative(r, "../etc/passwd").is_err());
        assert!(relative(r, "sub/../../x").is_err());
        assert!(relative(r, "/etc/passwd").is_err());
        let abs = r.join("sub/a.txt").display().to_string();
        assert_eq!(relative(r, &abs).unwrap(), Path::new("sub/a.txt"));
        // A symlink that leads out of the root, as a directory and as the file.
        let outside = tempfile::TempDir::new().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("escape")).unwrap();
        let (v, _) = fs_read(&root, &json!({"path": "escape/secret"}));
        assert!(v["error"].is_string(), "{v}");
        let (v, _) = fs_read(&root, &json!({"path": "escape"}));
        assert!(v["error"].is_string(), "{v}");
        let w = fs_write(&root, &json!({"path": "escape/new", "content": "x"}), None);
        assert!(w["error"].is_string(), "{w}");
        assert!(!outside.path().join("new").exists());
        // A dangling symlink whose target would be outside: replaced by the write, the
        // outside target never created.
        std::os::unix::fs::symlink(outside.path().join("new"), r.join("dangling")).unwrap();
        let (v, _) = fs_read(&root, &json!({"path": "dangling"}));
        assert_eq!(v["error"], "path is a symlink", "{v}");
        let w = fs_write(&root, &json!({"path": "dangling", "content": "x"}), None);
        assert_eq!(w["written"], 1, "{w}");
        assert!(!outside.path().join("new").exists());
        assert!(!r.join("dangling").symlink_metadata().unwrap().is_symlink());
    }

    #[test]
    fn fs_read_and_write_round_trip_and_cap_output() {
        let dir = tempfile::TempDir::new().unwrap();
        let root = root_in(dir.path());
        let r = root.path.clone();
        let w = fs_write(
            &root,
            &json!({"path": "notes.txt", "content": "hello"}),
            None,
        );
        assert_eq!(w["written"], 5, "{w}");
        let w = fs_write(
            &root,
            &json!({"path": "notes.txt", "content": " world", "append": true}),
            None,
        );
        assert_eq!(w["size"], 11, "{w}");
        let (v, blobs) = fs_read(&root, &json!({"path": "notes.txt", "offset": 6}));
        assert_eq!(v["content"], "world");
        assert_eq!(v["eof"], true);
        assert!(blobs.is_empty());
        let (v, _) = fs_read(&root, &json!({"path": "../x"}));
        assert!(v["error"].is_string());
        // Over 64 KiB: the content goes as a blob read from the file.
        let big: Vec<u8> = (0..MAX_INLINE + 1).map(|i| (i % 7) as u8).collect();
        std::fs::write(r.join("big.bin"), &big).unwrap();
        let (v, blobs) = fs_read(&root, &json!({"path": "big.bin", "length": 1_000_000}));
        assert_eq!(v["content_blob"], blobs[0].blob_ref.as_str());
        assert_eq!(blobs[0].size(), (MAX_INLINE + 1) as u64);
        assert!(blobs[0].data.is_empty(), "not held in memory");
        assert!(v.get("content").is_none());
        use sha2::Digest;
        assert_eq!(
            blobs[0].sha256,
            crate::blob::hex(&sha2::Sha256::digest(&big))
        );
        // From a blob file.
        let src = r.join("src.bin");
        std::fs::write(&src, b"from a blob").unwrap();
        let f = std::fs::File::open(&src).unwrap();
        let w = fs_write(
            &root,
            &json!({"path": "copy.bin", "blob": "R"}),
            Some(WriteSource::File(f)),
        );
        assert_eq!(w["written"], 11, "{w}");
        assert_eq!(std::fs::read(r.join("copy.bin")).unwrap(), b"from a blob");
        let w = fs_write(&root, &json!({"path": "none.bin"}), None);
        assert!(w["error"].is_string());
        // A directory is neither read nor replaced.
        std::fs::create_dir(r.join("d")).unwrap();
        let (v, _) = fs_read(&root, &json!({"path": "d"}));
        assert_eq!(v["error"], "not a regular file", "{v}");
        let w = fs_write(&root, &json!({"path": "d", "content": "x"}), None);
        assert!(w["error"].is_string(), "{w}");
        // A replaced file keeps its mode; no temporary file is left.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(r.join("notes.txt"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        let w = fs_write(&root, &json!({"path": "notes.txt", "content": "new"}), None);
        assert_eq!(w["size"], 3, "{w}");
        let mode = std::fs::metadata(r.join("notes.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640);
        let left: Vec<_> = std::fs::read_dir(&r)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains("awp-tmp"))
            .collect();
        assert!(left.is_empty());
    }

    /// Issue §2: a directory inside the root swapped with a symlink to outside
    /// (renameat2 RENAME_EXCHANGE in a loop) while reads and writes run. Bounded: four
    /// readers of 10,000 reads, four writers of 1,000 writes (the old check-then-open
    /// code let about 1 read in 300 through here, and some writes).
    #[test]
    fn a_directory_swapped_with_a_symlink_never_leads_out() {
        use rustix::fs::{renameat_with, RenameFlags, CWD};
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let dir = tempfile::TempDir::new().unwrap();
        let outside = tempfile::TempDir::new().unwrap();
        let root = root_in(dir.path());
        let r = root.path.clone();
        std::fs::create_dir(r.join("d")).unwrap();
        std::fs::write(r.join("d/f"), "inside").unwrap();
        std::fs::write(outside.path().join("f"), "OUTSIDE").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("s")).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let swapper = {
            let (stop, swaps, r) = (stop.clone(), swaps.clone(), r.clone());
            std::thread::spawn(move || {
                for _ in 0..10_000_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    renameat_with(CWD, r.join("d"), CWD, r.join("s"), RenameFlags::EXCHANGE)
                        .unwrap();
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let root = root.clone();
                std::thread::spawn(move || {
                    let (mut inside, mut refused, mut escaped) = (0, 0, 0);
                    for _ in 0..10_000 {
                        let (v, _) = fs_read(&root, &json!({"path": "d/f"}));
                        match v["content"].as_str() {
                            Some("inside") => inside += 1,
                            Some(_) => escaped += 1,
                            None => refused += 1,
                        }
                    }
                    (inside, refused, escaped)
                })
            })
            .collect();
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let root = root.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        let path = format!("d/w{t}-{i}");
                        let _ = fs_write(&root, &json!({"path": path, "content": "x"}), None);
                    }
                })
            })
            .collect();
        let (mut inside, mut refused, mut escaped) = (0, 0, 0);
        for t in readers {
            let (a, b, c) = t.join().unwrap();
            (inside, refused, escaped) = (inside + a, refused + b, escaped + c);
        }
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let leaked: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .filter(|n| n != "f")
            .collect();
        assert_eq!(escaped, 0, "reads returned the outside file");
        assert!(
            leaked.is_empty(),
            "writes created {leaked:?} outside the root"
        );
        assert!(swaps.load(Ordering::Relaxed) > 100, "the race ran");
        assert!(
            inside > 0 && refused > 0,
            "both states seen: {inside} {refused}"
        );
    }
}
