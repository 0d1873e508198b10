//! Keeps this copy of the library mapped when one of its threads outlives
//! the release of the job's class loader.
//!
//! The JVM unloads a native library (`dlclose`) once the class loader that
//! loaded it is collected. A thread of the library still running then (the
//! write-back thread stuck in an `fsync` on a hung disk, which `release0`
//! stops waiting for after a bound) would go on in unmapped code: a
//! SIGSEGV that takes the TaskManager down. Marking the library
//! `RTLD_NODELETE` keeps it mapped for the life of the process instead: the
//! cost is one copy of the library's pages per job that met a stuck thread,
//! never a crash.

use std::ffi::c_void;

/// Marks the library holding this code no-delete; false when the loader
/// does not know it (then nothing changed).
pub(crate) fn keep_this_library_loaded() -> bool {
    keep_loaded_containing(keep_this_library_loaded as *const c_void)
}

/// Marks the shared object that contains `addr` no-delete.
fn keep_loaded_containing(addr: *const c_void) -> bool {
    // SAFETY: an all-zero `Dl_info` is valid (null pointers, zero fields).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only compares `addr` (any value) with the loaded
    // objects and writes into `info`, a valid, exclusively borrowed out
    // parameter.
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: `dli_fname` is the loader's NUL-terminated name of an object
    // that is loaded (it contains `addr`, and this code runs while the
    // object is mapped). With RTLD_NOLOAD, `dlopen` loads nothing and runs
    // no initialiser: it returns the loaded object with RTLD_NODELETE added
    // (glibc promotes the flag), or null. The reference it returns is kept
    // on purpose: the object is to stay loaded.
    let handle = unsafe {
        libc::dlopen(
            info.dli_fname,
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE,
        )
    };
    !handle.is_null()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mechanism on an object that is certainly a loaded shared library
    /// (the C library, which holds `malloc`).
    #[test]
    fn a_loaded_shared_object_is_marked_no_delete() {
        assert!(keep_loaded_containing(libc::malloc as *const c_void));
    }

    /// An address no object contains changes nothing and says so.
    #[test]
    fn an_address_outside_every_object_is_refused() {
        assert!(!keep_loaded_containing(std::ptr::null()));
    }
}
