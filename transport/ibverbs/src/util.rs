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
