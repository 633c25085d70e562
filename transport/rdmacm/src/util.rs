//! Small helpers every entry point uses: errno, the guard that keeps a
//! Rust panic from unwinding into C, the debug switch, random PSNs, and
//! IPv4 socket addresses and GIDs as rdma_cm stores them.

use std::net::Ipv4Addr;

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: as in set_errno.
    unsafe { *libc::__errno_location() }
}

/// The C convention of librdmacm: 0, or -1 with errno set.
pub fn ret(r: Result<(), i32>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Runs an entry point's body; a panic (a bug) becomes `on_panic` with
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

/// An entry point returning 0 or -1 with errno: `f`'s result, guarded.
pub fn entry(f: impl FnOnce() -> Result<(), i32>) -> std::ffi::c_int {
    guard(-1, || ret(f()))
}

/// The calling thread's errno, or `dflt` when a failed call left none.
pub fn errno_or(dflt: i32) -> i32 {
    match errno() {
        0 => dflt,
        e => e,
    }
}

/// Whether the library was told to say why each failing call failed
/// (`RNIC_RDMACM_DEBUG=1`).
pub fn debug() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RNIC_RDMACM_DEBUG").is_some_and(|v| v != "0"))
}

/// Prints a line on stderr prefixed with the library's name.
pub fn warn(msg: &str) {
    eprintln!("librdmacm (rnic): {msg}");
}

/// Fails with `e`, saying why when debugging.
pub fn fail<T>(e: i32, why: impl FnOnce() -> String) -> Result<T, i32> {
    if debug() {
        warn(&why());
    }
    Err(e)
}

/// A random 24-bit packet sequence number.
pub fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into our buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 4 {
        // No entropy source: the clock is random enough for a PSN.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ d.as_secs() as u32)
            .unwrap_or(0x5a5a5a);
        b = t.to_ne_bytes();
    }
    u32::from_ne_bytes(b) & 0xff_ffff
}

/// The IPv4-mapped GID `::ffff:a.b.c.d` of an address (RoCEv2).
pub fn mapped_gid(ip: Ipv4Addr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip.octets());
    g
}

/// An IPv4 address and port, as far as rdma_cm cares about a socket
/// address: AF_INET, or AF_INET6 holding `::` or a v4-mapped address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr4 {
    pub ip: Ipv4Addr,
    pub port: u16,
    /// The application gave an AF_INET6 address (answered in kind).
    pub v6: bool,
}

/// What a socket address the application passed is to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SockAddr {
    V4(Addr4),
    /// An IPv6 address that is neither `::` nor v4-mapped: no device
    /// has it.
    OtherV6,
}

/// Reads an application's socket address (None: NULL or a family rdma_cm
/// does not take).
///
/// # Safety
/// `sa` is NULL or points at a socket address as long as its family says.
pub unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Option<SockAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-NULL, a sockaddr by the contract.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: AF_INET: a sockaddr_in by the contract.
            let s = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
            Some(SockAddr::V4(Addr4 {
                ip: Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                port: u16::from_be(s.sin_port),
                v6: false,
            }))
        }
        libc::AF_INET6 => {
            // SAFETY: AF_INET6: a sockaddr_in6 by the contract.
            let s = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
            let b = s.sin6_addr.s6_addr;
            let port = u16::from_be(s.sin6_port);
            if b == [0; 16] {
                Some(SockAddr::V4(Addr4 {
                    ip: Ipv4Addr::UNSPECIFIED,
                    port,
                    v6: true,
                }))
            } else if b == std::net::Ipv6Addr::LOCALHOST.octets() {
                // `::1`: the loopback, as 127.0.0.1 (the kernel binds and
                // resolves either to the first device).
                Some(SockAddr::V4(Addr4 {
                    ip: Ipv4Addr::LOCALHOST,
                    port,
                    v6: true,
                }))
            } else if b[..10] == [0; 10] && b[10..12] == [0xff, 0xff] {
                Some(SockAddr::V4(Addr4 {
                    ip: Ipv4Addr::new(b[12], b[13], b[14], b[15]),
                    port,
                    v6: true,
                }))
            } else {
                Some(SockAddr::OtherV6)
            }
        }
        _ => None,
    }
}

/// Writes `a` as a socket address into `dst` (128 bytes of
/// `sockaddr_storage`), zeroing the rest.
///
/// # Safety
/// `dst` points at 128 writable bytes.
pub unsafe fn write_sockaddr(dst: *mut u8, a: Addr4) {
    // SAFETY: the contract: 128 writable bytes.
    unsafe { std::ptr::write_bytes(dst, 0, 128) };
    if a.v6 {
        let mut s: libc::sockaddr_in6 =
            // SAFETY: all-zero is a valid sockaddr_in6.
            unsafe { std::mem::zeroed() };
        s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        s.sin6_port = a.port.to_be();
        if !a.ip.is_unspecified() {
            s.sin6_addr.s6_addr = mapped_gid(a.ip);
        }
        // SAFETY: 28 of the 128 bytes.
        unsafe { std::ptr::write_unaligned(dst.cast::<libc::sockaddr_in6>(), s) };
    } else {
        let s = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(a.ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: 16 of the 128 bytes.
        unsafe { std::ptr::write_unaligned(dst.cast::<libc::sockaddr_in>(), s) };
    }
}

/// The port (network byte order, as rdma_get_src_port returns it) of a
/// stored socket address.
///
/// # Safety
/// `sa` points at a readable `sockaddr_storage`.
pub unsafe fn port_of(sa: *const u8) -> u16 {
    // SAFETY: by the contract, at least a sockaddr header.
    let family = i32::from(unsafe { std::ptr::read_unaligned(sa.cast::<libc::sa_family_t>()) });
    match family {
        // SAFETY: sin_port and sin6_port are both at offset 2.
        libc::AF_INET | libc::AF_INET6 => unsafe { std::ptr::read_unaligned(sa.add(2).cast()) },
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_in_both_families() {
        for v6 in [false, true] {
            let a = Addr4 {
                ip: Ipv4Addr::new(10, 0, 0, 2),
                port: 7174,
                v6,
            };
            let mut buf = [0u8; 128];
            // SAFETY: 128 bytes.
            unsafe { write_sockaddr(buf.as_mut_ptr(), a) };
            // SAFETY: a socket address we wrote.
            let back = unsafe { read_sockaddr(buf.as_ptr().cast()) };
            assert_eq!(back, Some(SockAddr::V4(a)));
            // SAFETY: as above.
            assert_eq!(unsafe { port_of(buf.as_ptr()) }, 7174u16.to_be());
        }
    }

    #[test]
    fn ipv6_wildcard_and_loopback_are_ipv4_s_and_other_ipv6_is_no_device() {
        let mut s: libc::sockaddr_in6 =
            // SAFETY: all-zero is a valid sockaddr_in6.
            unsafe { std::mem::zeroed() };
        s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        // SAFETY: a sockaddr_in6 on the stack.
        let any = unsafe { read_sockaddr((&s as *const libc::sockaddr_in6).cast()) };
        assert!(matches!(any, Some(SockAddr::V4(a)) if a.ip.is_unspecified() && a.v6));
        s.sin6_addr.s6_addr[15] = 1;
        // SAFETY: as above.
        let lo = unsafe { read_sockaddr((&s as *const libc::sockaddr_in6).cast()) };
        assert!(matches!(lo, Some(SockAddr::V4(a)) if a.ip.is_loopback() && a.v6));
        s.sin6_addr.s6_addr[0] = 0xfe;
        // SAFETY: as above.
        let other = unsafe { read_sockaddr((&s as *const libc::sockaddr_in6).cast()) };
        assert_eq!(other, Some(SockAddr::OtherV6));
    }

    #[test]
    fn psns_are_24_bits() {
        for _ in 0..64 {
            assert!(random_psn() < 1 << 24);
        }
    }
}
