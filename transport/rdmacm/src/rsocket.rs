//! The rsocket family (sockets over RDMA): not offered. Every call fails
//! with -1 (riowrite: `(size_t)-1`) and errno ENOSYS, whatever its
//! arguments, and touches none of them; the symbols exist so that
//! binaries linked against rdma-core's librdmacm load.

use std::ffi::{c_int, c_void};

use crate::util::set_errno;

fn enosys() -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

fn enosys_len() -> isize {
    set_errno(libc::ENOSYS);
    -1
}

type Sa = *const libc::sockaddr;
type SaMut = *mut libc::sockaddr;
type Len = libc::socklen_t;

#[no_mangle]
pub extern "C" fn rsocket(_domain: c_int, _type: c_int, _protocol: c_int) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rbind(_s: c_int, _addr: Sa, _len: Len) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rlisten(_s: c_int, _backlog: c_int) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn raccept(_s: c_int, _addr: SaMut, _len: *mut Len) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rconnect(_s: c_int, _addr: Sa, _len: Len) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rshutdown(_s: c_int, _how: c_int) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rclose(_s: c_int) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rrecv(_s: c_int, _buf: *mut c_void, _len: usize, _flags: c_int) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rrecvfrom(
    _s: c_int,
    _buf: *mut c_void,
    _len: usize,
    _flags: c_int,
    _src: SaMut,
    _addrlen: *mut Len,
) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rrecvmsg(_s: c_int, _msg: *mut libc::msghdr, _flags: c_int) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rsend(_s: c_int, _buf: *const c_void, _len: usize, _flags: c_int) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rsendto(
    _s: c_int,
    _buf: *const c_void,
    _len: usize,
    _flags: c_int,
    _dst: Sa,
    _addrlen: Len,
) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rsendmsg(_s: c_int, _msg: *const libc::msghdr, _flags: c_int) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rread(_s: c_int, _buf: *mut c_void, _count: usize) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rreadv(_s: c_int, _iov: *const libc::iovec, _iovcnt: c_int) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rwrite(_s: c_int, _buf: *const c_void, _count: usize) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rwritev(_s: c_int, _iov: *const libc::iovec, _iovcnt: c_int) -> isize {
    enosys_len()
}

#[no_mangle]
pub extern "C" fn rpoll(_fds: *mut libc::pollfd, _nfds: libc::nfds_t, _timeout: c_int) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rselect(
    _nfds: c_int,
    _r: *mut libc::fd_set,
    _w: *mut libc::fd_set,
    _e: *mut libc::fd_set,
    _timeout: *mut libc::timeval,
) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rgetpeername(_s: c_int, _addr: SaMut, _len: *mut Len) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rgetsockname(_s: c_int, _addr: SaMut, _len: *mut Len) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rsetsockopt(
    _s: c_int,
    _level: c_int,
    _name: c_int,
    _val: *const c_void,
    _len: Len,
) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn rgetsockopt(
    _s: c_int,
    _level: c_int,
    _name: c_int,
    _val: *mut c_void,
    _len: *mut Len,
) -> c_int {
    enosys()
}

/// Variadic in C (`int rfcntl(int, int, ...)`); on x86_64 and aarch64 a
/// caller's variadic integer argument sits where this third parameter is
/// read from, and it is not read anyway.
#[no_mangle]
pub extern "C" fn rfcntl(_s: c_int, _cmd: c_int, _arg: usize) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn riomap(
    _s: c_int,
    _buf: *mut c_void,
    _len: usize,
    _prot: c_int,
    _flags: c_int,
    _offset: libc::off_t,
) -> libc::off_t {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub extern "C" fn riounmap(_s: c_int, _buf: *mut c_void, _len: usize) -> c_int {
    enosys()
}

#[no_mangle]
pub extern "C" fn riowrite(
    _s: c_int,
    _buf: *const c_void,
    _count: usize,
    _offset: libc::off_t,
    _flags: c_int,
) -> usize {
    set_errno(libc::ENOSYS);
    usize::MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rsocket_call_fails_with_enosys() {
        assert_eq!(rsocket(libc::AF_INET, libc::SOCK_STREAM, 0), -1);
        assert_eq!(crate::util::errno(), libc::ENOSYS);
        assert_eq!(rsend(3, std::ptr::null(), 0, 0), -1);
        assert_eq!(rfcntl(3, libc::F_GETFL, 0), -1);
        assert_eq!(riowrite(3, std::ptr::null(), 1, 0, 0), usize::MAX);
        assert_eq!(crate::util::errno(), libc::ENOSYS);
    }
}
