//! Work split in two halves run at once: on the calling thread and on one scoped thread,
//! when there is enough of it and the process may use two cores. Used where one task
//! holds a batch whose items are independent (signature checks of a read, the line
//! lookups of a replay batch; issues 10 and 13), and the runtime check of the code that
//! moves work off or onto the connection's thread (`block_in_place`, a spawned write).

/// Cores this process may use, read once per process (`available_parallelism` reads the
/// cgroup files, about twenty system calls, on every call).
pub fn cores() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Whether the calling thread runs inside a multi-thread tokio runtime: the one kind where
/// `tokio::task::block_in_place` is allowed and a spawned task can run beside the caller.
/// `false` outside any runtime and on a current-thread runtime (the library's tests).
pub fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// What [`halves`] ran.
pub enum Split<R> {
    /// `f` over all the items, on the calling thread.
    Whole(R),
    /// `f` over `items[..mid]` (first) and over `items[mid..]` (second), at once.
    Halves { first: R, second: R, mid: usize },
}

/// `f` over `items`: split at `items.len() / 2` and run on two threads when there are at
/// least `min` items and [`cores`] is 2 or more (and a thread can be started), else over
/// all of them on the calling thread. Both halves always finish before this returns; a
/// panic in either is resumed here, as it would be on one thread.
pub fn halves<T, R, F>(items: &[T], min: usize, f: F) -> Split<R>
where
    T: Sync,
    R: Send,
    F: Fn(&[T]) -> R + Sync,
{
    if items.len() < min || items.len() < 2 || cores() < 2 {
        return Split::Whole(f(items));
    }
    let mid = items.len() / 2;
    let (a, b) = items.split_at(mid);
    match join("awp-half", || f(a), || f(b)) {
        Some((first, second)) => Split::Halves { first, second, mid },
        // No thread to be had: the same work on this one.
        None => Split::Whole(f(items)),
    }
}

/// `here` on the calling thread while `there` runs on a scoped thread named `name`; both
/// have finished when this returns, and a panic in `there` is resumed here. `None` when no
/// thread can be started: then neither ran, and the caller does that work some other way.
pub fn join<A, B>(
    name: &str,
    here: impl FnOnce() -> A,
    there: impl FnOnce() -> B + Send,
) -> Option<(A, B)>
where
    B: Send,
{
    std::thread::scope(|s| {
        let other = std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(s, there)
            .ok()?;
        let a = here();
        let b = other
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        Some((a, b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_multi_thread_runtime_counts() {
        assert!(!on_multi_thread_runtime(), "outside any runtime");
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(!current.block_on(async { on_multi_thread_runtime() }));
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        assert!(multi.block_on(async { on_multi_thread_runtime() }));
        // A task spawned on one of its workers sees the same runtime.
        let task = multi.spawn(async { on_multi_thread_runtime() });
        assert!(multi.block_on(task).unwrap());
    }

    #[test]
    fn halves_cover_every_item_once_in_order() {
        let items: Vec<u32> = (0..300).collect();
        let collect = |s: &[u32]| s.to_vec();
        let all = match halves(&items, 128, collect) {
            Split::Whole(v) => v,
            Split::Halves { first, second, mid } => {
                assert_eq!(first.len(), mid);
                [first, second].concat()
            }
        };
        assert_eq!(all, items);
        // Under the minimum: one call over everything.
        assert!(matches!(halves(&items[..10], 128, collect), Split::Whole(v) if v == items[..10]));
    }
}
