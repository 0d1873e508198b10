//! The interrupt check this bridge installs for every call into the core
//! (see `twopc_core::interrupt`): Flink cancels a task by interrupting its
//! thread, and a native call that waits on a destination that went away
//! must hear it before Flink's `task.cancellation.timeout` kills the
//! TaskManager.

use jni::{jni_sig, jni_str, JavaVM};

/// Runs `f` with the calling Java thread's interrupt flag as the core's
/// interrupt check.
pub(crate) fn checked<R>(f: impl FnOnce() -> R) -> R {
    twopc_core::interrupt::with_check(thread_interrupted, f)
}

/// `Thread.currentThread().isInterrupted()`, which leaves the flag set for
/// Flink to see. False when the JVM cannot be asked: a call that goes on
/// waiting is what happened before this check existed.
fn thread_interrupted() -> bool {
    let Ok(vm) = JavaVM::singleton() else {
        return false;
    };
    // The check runs only on the thread of a Java call (it is installed
    // there, and thread-local), so this only pushes a local frame; the
    // default attachment policy catches anything the Java side throws.
    vm.attach_current_thread(|env| -> jni::errors::Result<bool> {
        let class = env.find_class(jni_str!("java/lang/Thread"))?;
        let thread = env
            .call_static_method(
                &class,
                jni_str!("currentThread"),
                jni_sig!("()Ljava/lang/Thread;"),
                &[],
            )?
            .l()?;
        env.call_method(&thread, jni_str!("isInterrupted"), jni_sig!("()Z"), &[])?
            .z()
    })
    .unwrap_or(false)
}
