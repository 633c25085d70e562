//! Small helpers every entry point uses: errno, C strings, and the guard
//! that keeps a Rust panic from unwinding into C.

use std::ffi::c_char;

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// Runs a control-path body; a panic (a bug) becomes `on_panic` with
/// errno EIO instead of unwinding into the application.
pub fn guard<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Copies `s` into a fixed C char array, truncated, NUL-terminated.
pub fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    if let Some(d) = dst.get_mut(n) {
        *d = 0;
    }
}

/// Prints a line on stderr prefixed with the library's name.
pub fn warn(msg: &str) {
    eprintln!("libibverbs (rnic): {msg}");
}

/// The errno a failed daemon request means to a verbs caller.
pub fn errno_of(e: &verbs::VerbsError) -> i32 {
    use verbs::{ErrorKind as K, VerbsError as V};
    match e {
        V::Daemon(r) => match r.kind {
            K::NoSpace => libc::ENOMEM,
            K::Busy => libc::EBUSY,
            K::Version => libc::EPROTO,
            K::NoSuchDevice => libc::ENODEV,
            K::NotOpen | K::AlreadyOpen | K::Malformed => libc::EIO,
            _ => libc::EINVAL,
        },
        V::Io(_) => libc::EIO,
        V::InvalidArgument(_) => libc::EINVAL,
        _ => libc::EIO,
    }
}

/// Whether the library was told to say why each failing call failed
/// (`RNIC_VERBS_DEBUG=1`); errors that need a sentence beyond errno are
/// printed always.
pub fn debug() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RNIC_VERBS_DEBUG").is_some_and(|v| v != "0"))
}
