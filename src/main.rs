//! The `awp` binary: parse the command line, set up logging, run the command.

use awp_node::cli::{self, Command};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU8, Ordering};
use tracing_subscriber::EnvFilter;

/// The allocator of this process, chosen per command before Rust's first allocation
/// ([`choose_allocator`]): mimalloc for the commands that run a node or a relay, the
/// system's for the rest. The node allocates many small, short-lived values per line
/// (parsed JSON, keys, events) from several threads, where glibc's malloc spent a third of
/// the host's CPU in an artifact-thread run, much of it waiting on its arena locks; a client
/// command makes a few hundred allocations on one thread and exits, and mimalloc's set-up
/// (its arena reservation and first page faults) cost it about 0.2 ms of a 3.5 ms start
/// (benches/README).
#[global_allocator]
static GLOBAL: PerCommand = PerCommand;

/// [`CHOICE`] before anything chose.
const UNDECIDED: u8 = 0;
/// mimalloc serves every allocation.
const MIMALLOC: u8 = 1;
/// The system allocator (glibc's malloc) serves every allocation.
const SYSTEM: u8 = 2;

/// The allocator chosen for this process: [`UNDECIDED`] until the executable's initializer
/// chooses from the command line, or until the first allocation, which settles on
/// [`MIMALLOC`] if nothing chose before it. It never changes once decided, so every
/// block is freed by the allocator that gave it out.
static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The decided allocator, deciding [`MIMALLOC`] when nothing has yet. (Relaxed is
/// enough: the choice is made on the only thread, before any other thread exists, and
/// thread creation orders it before everything those threads do.)
#[inline]
fn allocator() -> u8 {
    match CHOICE.load(Ordering::Relaxed) {
        UNDECIDED => {
            match CHOICE.compare_exchange(UNDECIDED, MIMALLOC, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => MIMALLOC,
                Err(decided) => decided,
            }
        }
        decided => decided,
    }
}

/// The global allocator: [`System`] or [`mimalloc::MiMalloc`] as [`CHOICE`] says.
struct PerCommand;

// SAFETY: every call goes to one allocator, the same for the life of the process
// (`allocator` never returns another value once it returned one), and each of the two
// upholds `GlobalAlloc`'s contract itself.
unsafe impl GlobalAlloc for PerCommand {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match allocator() {
                SYSTEM => System.alloc(layout),
                _ => mimalloc::MiMalloc.alloc(layout),
            }
        }
    }
    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match allocator() {
                SYSTEM => System.alloc_zeroed(layout),
                _ => mimalloc::MiMalloc.alloc_zeroed(layout),
            }
        }
    }
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the same allocator (the choice never changes).
        unsafe {
            match allocator() {
                SYSTEM => System.dealloc(ptr, layout),
                _ => mimalloc::MiMalloc.dealloc(ptr, layout),
            }
        }
    }
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from the same allocator (the choice never changes).
        unsafe {
            match allocator() {
                SYSTEM => System.realloc(ptr, layout, new_size),
                _ => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
            }
        }
    }
}

/// The allocator for a command line (`args` without the program name): [`MIMALLOC`] for
/// the commands that run a node or a relay (`daemon`, `listen`, `relay`), [`SYSTEM`] for
/// every other, for `relay status` (a client of the running relay) and for any line that
/// asks for help (`-h`, `--help`). The command is the first argument that is not an
/// option, skipping the value of `--home` (the only global option that takes one,
/// `src/cli/args.rs`); after `relay`, its first such argument is its subcommand. A wrong
/// guess costs speed only, never correctness.
#[cfg(any(test, all(target_os = "linux", target_env = "gnu")))]
fn allocator_for<'a>(args: impl IntoIterator<Item = &'a [u8]>) -> u8 {
    // The first two words that are not options; no allocation here (it would settle
    // the choice before it is made).
    let (mut command, mut sub): (Option<&[u8]>, Option<&[u8]>) = (None, None);
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == b"--home" {
            args.next();
        } else if arg == b"-h" || arg == b"--help" {
            return SYSTEM;
        } else if arg.first() != Some(&b'-') {
            if command.is_none() {
                command = Some(arg);
            } else if sub.is_none() {
                sub = Some(arg);
            }
        }
    }
    match (command, sub) {
        (Some(b"relay"), Some(b"status")) => SYSTEM,
        (Some(b"daemon" | b"listen" | b"relay"), _) => MIMALLOC,
        _ => SYSTEM,
    }
}

/// Choose the allocator from the command line (glibc calls `.init_array` functions with
/// `argc`, `argv` and `envp`, as Rust's standard library relies on for its own arguments
/// on this target), then tune the allocator.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn choose_allocator(
    argc: std::os::raw::c_int,
    argv: *const *const std::os::raw::c_char,
    _envp: *const *const std::os::raw::c_char,
) {
    if !argv.is_null() {
        let n = usize::try_from(argc).unwrap_or(0);
        let args = (1..n).filter_map(|i| {
            // SAFETY: glibc passes the process's argv: `argc` pointers, each to a
            // NUL-terminated string that lives as long as the process; none is freed or
            // changed before this returns (nothing else runs yet).
            let p = unsafe { *argv.add(i) };
            // SAFETY: as above; a null entry is skipped.
            (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
        });
        let choice = allocator_for(args);
        // Fails only if something allocated already: that settled on mimalloc.
        let _ = CHOICE.compare_exchange(UNDECIDED, choice, Ordering::Relaxed, Ordering::Relaxed);
    }
    tune_allocator();
}

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (`mimalloc.h`; the crate names
/// the option after it, 16, and the one before it, 14, only with its `v2` feature).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long (ms) mimalloc keeps freed memory before giving it back to the OS. mimalloc 2's
/// default, 10 ms, returned pages between two batches of a busy connection, and faulting
/// them in again (zeroing transparent huge pages) took a quarter of the node's CPU in an
/// artifact-thread run. A second keeps memory a burst used for a second after it. The
/// vendored mimalloc 3 (`libmimalloc-sys` without its `v2` feature) already defaults to
/// 1000 (`src/options.c`, arena multiplier 1): the setting pins it should that change.
const PURGE_DELAY_MS: std::os::raw::c_long = 1000;

/// Keep freed memory [`PURGE_DELAY_MS`], and (Linux) no transparent huge pages for this
/// process: mimalloc asks for them on its arenas, and each fault on a fresh 2 MiB page
/// zeroed all of it (356 such faults, about a fifth of both nodes' CPU, in a 10,000-edit
/// artifact run); with 4 KiB pages the same run used a quarter less CPU.
///
/// It runs from the executable's `.init_array` ([`EARLY`]), before Rust's runtime starts:
/// the runtime's first allocation reserves mimalloc's arena (with `MADV_HUGEPAGE`), and a
/// huge page faulted in then cost every command start about half a millisecond of zeroing
/// (`awp --version`, `perf stat -r 300`: 3.9–4.5 ms with it, see benches/README).
extern "C" fn tune_allocator() {
    // SAFETY: runs before `main`, from the loader's initializers, before any thread of ours
    // exists (the option setter is not thread safe); the option id and value are plain
    // integers.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes a flag of this
    // process (prctl(2)); a failure (an old kernel) leaves THP as it was. The flag is
    // inherited by children and kept across execve, as it was when `main` set it.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// [`choose_allocator`] as an initializer of the executable (ELF `.init_array`, run by
/// the dynamic loader or the C runtime before `main` and before Rust's runtime allocates).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[used]
#[link_section = ".init_array"]
static EARLY: extern "C" fn(
    std::os::raw::c_int,
    *const *const std::os::raw::c_char,
    *const *const std::os::raw::c_char,
) = choose_allocator;

/// [`tune_allocator`] alone where the initializer gets no arguments (mimalloc serves).
#[cfg(all(target_os = "linux", not(target_env = "gnu")))]
#[used]
#[link_section = ".init_array"]
static EARLY: extern "C" fn() = tune_allocator;

fn main() {
    #[cfg(not(target_os = "linux"))]
    tune_allocator();
    let cli = match cli::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(code) => std::process::exit(code),
    };
    // The node and the relay log at info by default; client commands only report problems.
    let default = match cli.command {
        Command::Daemon(_) | Command::Listen { .. } => "info",
        Command::Relay(ref r) if r.action.is_none() => "info",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    std::process::exit(cli::run(cli));
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // The initializer ran before this test binary's `main` (this test is the only
        // caller of `tune_allocator` below, after this check).
        #[cfg(target_os = "linux")]
        {
            // SAFETY: PR_GET_THP_DISABLE reads a flag of this process (prctl(2)).
            let thp_off = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(thp_off, 1, "the .init_array initializer did not run");
        }
        // mimalloc.h: `mi_option_purge_delay` comes just before `mi_option_use_numa_nodes`
        // (mimalloc 3's default is already the value set, so reading it back alone could
        // not tell a wrong id).
        assert_eq!(
            super::MI_OPTION_PURGE_DELAY + 1,
            libmimalloc_sys::mi_option_use_numa_nodes
        );
        super::tune_allocator();
        // SAFETY: reads an option; no other thread sets options in this test binary.
        let got = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(got, super::PURGE_DELAY_MS);
        // Its neighbours keep their own values (a wrong id would land on one of them).
        let numa =
            unsafe { libmimalloc_sys::mi_option_get(libmimalloc_sys::mi_option_use_numa_nodes) };
        assert_ne!(numa, super::PURGE_DELAY_MS);
    }

    #[test]
    fn node_and_relay_commands_get_mimalloc_and_the_rest_the_system_allocator() {
        use super::{allocator_for, MIMALLOC, SYSTEM};
        let of = |line: &str| allocator_for(line.split_whitespace().map(str::as_bytes));
        for node in [
            "daemon",
            "listen --text",
            "relay --listen tls:0.0.0.0:7701",
            "--home /h daemon --listen tcp:127.0.0.1:0",
            "--json --home=/h listen",
            "--home daemon relay",
            "relay --listen tls:0.0.0.0:7701 --max-connections 10000",
            "--home /h relay --home=/h",
        ] {
            assert_eq!(of(node), MIMALLOC, "{node}");
        }
        for client in [
            "",
            "status",
            "--home /h status",
            "--home relay status",
            "--json send peer daemon",
            "up --listen tcp:127.0.0.1:0",
            "--help",
            "--version",
            "--home",
            "relay status",
            "--json relay --home /h status",
            "relay status --json",
            "daemon --help",
            "relay -h",
        ] {
            assert_eq!(of(client), SYSTEM, "{client}");
        }
    }

    /// The allocator this process decided on, and whether a fresh block lies in one of
    /// mimalloc's regions: the two must agree.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn decided_allocator() -> (u8, bool) {
        let block = Box::new([7u8; 64]);
        // SAFETY: asks whether an address lies in one of mimalloc's regions; the pointer
        // is only compared, never read.
        let in_mimalloc = unsafe {
            libmimalloc_sys::mi_is_in_heap_region(block.as_ptr().cast::<std::ffi::c_void>())
        };
        (
            super::CHOICE.load(std::sync::atomic::Ordering::Relaxed),
            in_mimalloc,
        )
    }

    /// Run by [`the_initializer_chose_from_the_command_line`] in a child process with the
    /// arguments under test: prints what that process decided. Run directly, it checks
    /// that the decision and the blocks agree.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn allocator_probe() {
        let (choice, in_mimalloc) = decided_allocator();
        println!("allocator {choice} mimalloc-heap {in_mimalloc}");
        assert_ne!(choice, super::UNDECIDED);
        assert_eq!(choice == super::MIMALLOC, in_mimalloc, "choice {choice}");
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn the_initializer_chose_from_the_command_line() {
        // Without the initializer, the first allocation would settle on mimalloc whatever
        // the arguments; with it, a child of this test binary whose first word is `relay`
        // uses mimalloc and one whose first word is a test name the system allocator.
        let exe = std::env::current_exe().expect("test binary path");
        let probe = |args: &[&str]| {
            let out = std::process::Command::new(&exe)
                .args(args)
                .args(["--exact", "--nocapture", "--test-threads=1"])
                .output()
                .expect("run the test binary");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "{args:?}: {stdout}");
            stdout
        };
        let system = probe(&["tests::allocator_probe"]);
        assert!(
            system.contains("allocator 2 mimalloc-heap false"),
            "{system}"
        );
        let node = probe(&["relay", "tests::allocator_probe"]);
        assert!(node.contains("allocator 1 mimalloc-heap true"), "{node}");
    }
}
