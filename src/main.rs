//! The `awp` binary: parse the command line, set up logging, run the command.

use awp_node::cli::{self, Command};
use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of the system allocator: the node allocates many small, short-lived
/// values per line (parsed JSON, keys, events) from several threads, where glibc's malloc
/// spent a third of the host's CPU in an artifact-thread run, much of it waiting on its
/// arena locks.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// [`tune_allocator`] as an initializer of the executable (ELF `.init_array`, run by the
/// dynamic loader or the C runtime before `main` and before Rust's runtime allocates).
#[cfg(target_os = "linux")]
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
}
