//! Multicast: `ibv_attach_mcast` and `ibv_detach_mcast` put a UD QP in (or
//! take it out of) a multicast group, named by its GID; on RoCEv2 over
//! IPv4 the GID is an IPv4-mapped multicast address (`::ffff:224.0.0.0/100`,
//! as rxe maps it) and the group lives in the daemon's NIC. The LID is
//! unused on RoCE.

use std::ffi::c_int;
use std::net::Ipv4Addr;

use shm::proto::Request;

use crate::ah::ipv4_of_gid;
use crate::qp::Qp;
use crate::sys::*;
use crate::util::{errno_of, guard, warn};

/// The group a GID names: an IPv4-mapped multicast address.
fn group_of(gid: *const ibv_gid) -> Result<Ipv4Addr, String> {
    // SAFETY: the caller's GID or NULL; every bit pattern is valid bytes.
    let Some(g) = (unsafe { gid.as_ref() }) else {
        return Err("NULL GID".into());
    };
    // SAFETY: as above.
    let raw = unsafe { g.raw };
    let ip = ipv4_of_gid(&raw).ok_or_else(|| {
        "the GID is not IPv4-mapped (::ffff:a.b.c.d): this device is RoCEv2 over IPv4".to_string()
    })?;
    if !ip.is_multicast() {
        return Err(format!("{ip} is not an IPv4 multicast address"));
    }
    Ok(ip)
}

/// Attaches or detaches `qp` to or from the group of `gid`: 0 or an errno.
fn call(what: &str, qp: *mut ibv_qp, gid: *const ibv_gid, attach: bool) -> c_int {
    // SAFETY: a live QP of ours or NULL.
    let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
        return libc::EINVAL;
    };
    let group = match group_of(gid) {
        Ok(g) => g,
        Err(why) => {
            if crate::util::debug() {
                warn(&format!("{what}: {why}"));
            }
            return libc::EINVAL;
        }
    };
    let qpn = q.ibv.qp_num;
    let req = if attach {
        Request::AttachMcast { qpn, group }
    } else {
        Request::DetachMcast { qpn, group }
    };
    match ctx.device.call(req) {
        Ok(_) => 0,
        Err(e) => {
            if crate::util::debug() {
                warn(&format!("{what}: {e}"));
            }
            errno_of(&e)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard(libc::EIO, || call("ibv_attach_mcast", qp, gid, true))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    guard(libc::EIO, || call("ibv_detach_mcast", qp, gid, false))
}
