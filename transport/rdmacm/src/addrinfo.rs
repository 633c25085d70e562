//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` over libc's getaddrinfo, as
//! rdma-core's does it for IP addresses: the hints become a socket
//! address query (passive, numeric host, family, stream for RC/UC and
//! datagram for UD, TCP or UDP for the port space); the first answer
//! becomes the result, its address the source when passive and the
//! destination otherwise, its QP type and port space from the socket
//! type and protocol unless the hints name them. A getaddrinfo failure
//! is returned as its EAI code. The results are libc-allocated, as the
//! application may hand them to `rdma_create_ep` and back to
//! `rdma_freeaddrinfo`. No SA or ACM path resolution (AF_IB).

use std::ffi::{c_char, c_int};

use crate::sys::*;
use crate::util::{guard, set_errno};

/// The libc query for an rdma_cm hint.
fn to_ai_hints(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: all-zero is a valid addrinfo.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    let f = h.ai_flags as u32;
    if f & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if f & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.ai_family != libc::AF_IB {
        ai.ai_family = h.ai_family;
    }
    ai.ai_socktype = match h.ai_qp_type as u32 {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
        IBV_QPT_UD => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match h.ai_port_space as u32 {
        RDMA_PS_TCP => libc::IPPROTO_TCP,
        RDMA_PS_UDP | RDMA_PS_IPOIB => libc::IPPROTO_UDP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
    ai
}

/// The QP type and port space of a libc answer (the hints' when given).
fn kinds(h: &rdma_addrinfo, socktype: c_int, protocol: c_int) -> (c_int, c_int) {
    let qp = if h.ai_qp_type != 0 {
        h.ai_qp_type
    } else {
        match socktype {
            libc::SOCK_STREAM => IBV_QPT_RC as c_int,
            libc::SOCK_DGRAM => IBV_QPT_UD as c_int,
            _ => 0,
        }
    };
    let ps = if h.ai_port_space != 0 {
        h.ai_port_space
    } else {
        match protocol {
            libc::IPPROTO_TCP => RDMA_PS_TCP as c_int,
            libc::IPPROTO_UDP => RDMA_PS_UDP as c_int,
            _ => 0,
        }
    };
    (qp, ps)
}

/// A libc copy of `len` bytes of a socket address (None: out of memory).
///
/// # Safety
/// `src` points at `len` readable bytes.
unsafe fn copy_addr(src: *const sockaddr, len: socklen_t) -> Option<*mut sockaddr> {
    // SAFETY: malloc of len bytes (at least 1).
    let p = unsafe { libc::malloc((len as usize).max(1)) }.cast::<sockaddr>();
    if p.is_null() {
        return None;
    }
    // SAFETY: the contract, and the new allocation of len bytes.
    unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), p.cast::<u8>(), len as usize) };
    Some(p)
}

/// Frees one result and what it points to.
///
/// # Safety
/// `r` is a live result of ours.
unsafe fn free_one(r: *mut rdma_addrinfo) {
    // SAFETY: the contract; every pointer in it is libc-allocated or NULL.
    unsafe {
        let a = &*r;
        libc::free(a.ai_connect);
        libc::free(a.ai_route);
        libc::free(a.ai_src_canonname.cast());
        libc::free(a.ai_dst_canonname.cast());
        libc::free(a.ai_src_addr.cast());
        libc::free(a.ai_dst_addr.cast());
        libc::free(r.cast());
    }
}

/// The body: 0, an EAI code, or -1 with errno.
fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: Option<&rdma_addrinfo>,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if (node.is_null() && service.is_null() && hints.is_none()) || res.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    if let Err(e) = crate::devices::get() {
        set_errno(e);
        return -1;
    }
    let none = rdma_addrinfo::default();
    let h = hints.unwrap_or(&none);
    // SAFETY: calloc of one zeroed result.
    let rai =
        unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
    if rai.is_null() {
        set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: the result we just allocated.
    let r = unsafe { &mut *rai };
    let nomem = |rai| {
        // SAFETY: our partly filled result.
        unsafe { free_one(rai) };
        set_errno(libc::ENOMEM);
        -1
    };
    if !node.is_null() || !service.is_null() {
        let ai_hints = hints.map(to_ai_hints);
        let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
        let hp = ai_hints
            .as_ref()
            .map_or(std::ptr::null(), |a| a as *const libc::addrinfo);
        // SAFETY: C strings or NULL from the caller, our hints and slot.
        let rc = unsafe { libc::getaddrinfo(node, service, hp, &mut ai) };
        if rc != 0 {
            // SAFETY: our empty result.
            unsafe { free_one(rai) };
            return rc;
        }
        // SAFETY: getaddrinfo's first answer (non-NULL on success).
        let a = unsafe { &*ai };
        let (qp, ps) = kinds(h, a.ai_socktype, a.ai_protocol);
        r.ai_qp_type = qp;
        r.ai_port_space = ps;
        r.ai_family = a.ai_family;
        let canon = if a.ai_canonname.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: libc's C string.
            unsafe { libc::strdup(a.ai_canonname) }
        };
        // SAFETY: the answer's address of ai_addrlen bytes.
        let copied = unsafe { copy_addr(a.ai_addr.cast(), a.ai_addrlen) };
        let passive = a.ai_flags & libc::AI_PASSIVE != 0 || h.ai_flags & RAI_PASSIVE as c_int != 0;
        // SAFETY: the list getaddrinfo gave, not used after.
        unsafe { libc::freeaddrinfo(ai) };
        let Some(addr) = copied else {
            // SAFETY: strdup's copy (or NULL), not stored anywhere.
            unsafe { libc::free(canon.cast()) };
            return nomem(rai);
        };
        if passive {
            r.ai_flags = RAI_PASSIVE as c_int;
            r.ai_src_canonname = canon;
            r.ai_src_addr = addr;
            r.ai_src_len = a_len(addr);
        } else {
            r.ai_dst_canonname = canon;
            r.ai_dst_addr = addr;
            r.ai_dst_len = a_len(addr);
        }
    } else {
        r.ai_flags = h.ai_flags;
        r.ai_family = h.ai_family;
        r.ai_qp_type = h.ai_qp_type;
        r.ai_port_space = h.ai_port_space;
        if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the hints' address of ai_dst_len bytes.
            match unsafe { copy_addr(h.ai_dst_addr, h.ai_dst_len) } {
                Some(p) => {
                    r.ai_dst_addr = p;
                    r.ai_dst_len = h.ai_dst_len;
                }
                None => return nomem(rai),
            }
        }
    }
    if r.ai_src_len == 0 && h.ai_src_len > 0 && !h.ai_src_addr.is_null() {
        // SAFETY: the hints' address of ai_src_len bytes.
        match unsafe { copy_addr(h.ai_src_addr, h.ai_src_len) } {
            Some(p) => {
                r.ai_src_addr = p;
                r.ai_src_len = h.ai_src_len;
            }
            None => return nomem(rai),
        }
    }
    // SAFETY: the caller's slot, checked non-NULL.
    unsafe { *res = rai };
    0
}

/// The length of a socket address we copied (by its family).
fn a_len(a: *mut sockaddr) -> socklen_t {
    // SAFETY: a socket address we just copied.
    let fam = i32::from(unsafe { (*a).sa_family });
    match fam {
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>() as socklen_t,
        _ => std::mem::size_of::<libc::sockaddr_in>() as socklen_t,
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's hints or NULL.
        let h = unsafe { hints.as_ref() };
        getaddrinfo(node, service, h, res)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    guard((), || {
        let mut r = res;
        while !r.is_null() {
            // SAFETY: a live result of ours.
            let next = unsafe { (*r).ai_next };
            // SAFETY: as above, not used after.
            unsafe { free_one(r) };
            r = next;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_become_a_socket_query() {
        let h = rdma_addrinfo {
            ai_flags: (RAI_PASSIVE | RAI_NUMERICHOST) as c_int,
            ai_family: libc::AF_INET,
            ai_qp_type: IBV_QPT_UD as c_int,
            ai_port_space: RDMA_PS_UDP as c_int,
            ..Default::default()
        };
        let ai = to_ai_hints(&h);
        assert_eq!(ai.ai_flags, libc::AI_PASSIVE | libc::AI_NUMERICHOST);
        assert_eq!(ai.ai_family, libc::AF_INET);
        assert_eq!(ai.ai_socktype, libc::SOCK_DGRAM);
        assert_eq!(ai.ai_protocol, libc::IPPROTO_UDP);
        let rc = rdma_addrinfo {
            ai_qp_type: IBV_QPT_RC as c_int,
            ai_port_space: RDMA_PS_TCP as c_int,
            ..Default::default()
        };
        let ai = to_ai_hints(&rc);
        assert_eq!(
            (ai.ai_socktype, ai.ai_protocol),
            (libc::SOCK_STREAM, libc::IPPROTO_TCP)
        );
    }

    #[test]
    fn answers_give_rc_for_stream_and_ud_for_datagram_unless_hinted() {
        let none = rdma_addrinfo::default();
        assert_eq!(
            kinds(&none, libc::SOCK_STREAM, libc::IPPROTO_TCP),
            (IBV_QPT_RC as c_int, RDMA_PS_TCP as c_int)
        );
        assert_eq!(
            kinds(&none, libc::SOCK_DGRAM, libc::IPPROTO_UDP),
            (IBV_QPT_UD as c_int, RDMA_PS_UDP as c_int)
        );
        let ib = rdma_addrinfo {
            ai_port_space: RDMA_PS_IB as c_int,
            ..Default::default()
        };
        assert_eq!(
            kinds(&ib, libc::SOCK_STREAM, libc::IPPROTO_TCP).1,
            RDMA_PS_IB as c_int
        );
    }

    #[test]
    fn no_node_service_or_hints_is_einval() {
        let mut res = std::ptr::null_mut();
        let r = getaddrinfo(std::ptr::null(), std::ptr::null(), None, &mut res);
        assert_eq!((r, crate::util::errno()), (-1, libc::EINVAL));
    }
}
