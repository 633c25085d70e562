//! C ABI (filled below).
