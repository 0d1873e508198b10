//! Whether the caller wants a call that is waiting given up.
//!
//! Why: Flink cancels a task by interrupting its thread, again every
//! `task.cancellation.interval`, and kills the whole TaskManager process
//! when the task has not stopped within `task.cancellation.timeout` (three
//! minutes by default). A native call cannot see a Java interrupt, and a
//! commit against an object store that went away can wait far longer than
//! that: each request is retried for minutes, and the commit itself is
//! retried by id with back-off. So the front end installs a check for the
//! duration of a call (the JNI bridge asks the JVM whether the calling
//! thread was interrupted), and the places that wait ask it: between the
//! attempts of a commit and while a request to a remote destination is in
//! flight.
//!
//! Giving up is always safe here: it only happens where an outcome may
//! still be unknown, which the protocol resolves anyway. A commit given up
//! stays in the completed checkpoint's state and is committed again by the
//! recovery after the restart; a write or a prepare given up fails its
//! transaction, which the restart aborts and replays. The error is never
//! fatal (it must not stop the job): it is the cancelled task's exit.
//!
//! Without an installed check (tests, the command-line tool) nothing is
//! ever interrupted.

use std::cell::Cell;

thread_local! {
    /// A plain function, not a boxed closure: a thread-local with a
    /// destructor makes glibc pin the shared library that holds it until
    /// the thread exits, so a released copy of the JNI library (its job's
    /// class loader gone) could never be unmapped from a TaskManager's
    /// long-lived threads (found by the loader test).
    static CHECK: Cell<Option<fn() -> bool>> = const { Cell::new(None) };
}

/// Runs `f` with `check` as this thread's interrupt check; the check in
/// place before (if any) is back afterwards, also when `f` panics.
pub fn with_check<R>(check: fn() -> bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<fn() -> bool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CHECK.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CHECK.with(|c| c.replace(Some(check))));
    f()
}

/// True when the caller asked for the current call to be given up. Cheap
/// enough for every wait, not meant for every record.
pub fn requested() -> bool {
    CHECK.with(Cell::get).is_some_and(|check| check())
}

/// What a destination error says when a wait was given up.
pub const INTERRUPTED: &str = "interrupted: the task is being cancelled (its thread was \
     interrupted), so the call was given up while waiting; the outcome of a request in flight \
     is unknown and is resolved after the restart";

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static FLAG: Cell<bool> = const { Cell::new(false) };
    }

    fn flag() -> bool {
        FLAG.with(Cell::get)
    }

    #[test]
    fn nothing_is_interrupted_without_a_check() {
        assert!(!requested());
    }

    #[test]
    fn a_check_holds_for_its_call_only_and_nests() {
        with_check(flag, || {
            assert!(!requested());
            FLAG.with(|f| f.set(true));
            assert!(requested());
            with_check(|| false, || assert!(!requested()));
            assert!(requested(), "the outer check is back");
        });
        assert!(!requested(), "gone after the call");
    }

    #[test]
    fn the_check_is_removed_when_the_call_panics() {
        let result = std::panic::catch_unwind(|| with_check(|| true, || panic!("boom")));
        assert!(result.is_err());
        assert!(!requested());
    }

    #[test]
    fn another_thread_has_no_check() {
        with_check(
            || true,
            || {
                assert!(requested());
                assert!(!std::thread::spawn(requested).join().unwrap());
            },
        );
    }
}
