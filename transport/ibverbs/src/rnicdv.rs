//! The extension calls of `include/rnicdv.h` (version nodes RNICDV_1.0
//! and RNICDV_1.1): what verbs lacks on this NIC, as vendors add
//! mlx5dv-style calls. A QP gets its own congestion control and its
//! feedback key before it connects, and reports its controller's window,
//! rate and packet counters.

use std::ffi::{c_char, c_int, CStr};

use shm::proto::{Reply, Request};

use crate::qp::Qp;
use crate::sys::ibv_qp;
use crate::util::{copy_cstr, errno_of, guard, warn};

/// `struct rnicdv_qp_cc` of rnicdv.h.
#[repr(C)]
pub struct RnicdvQpCc {
    pub cc: [c_char; 16],
    pub window_bytes: u64,
    pub rate_bps: u64,
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub retransmits: u64,
    pub timeouts: u64,
}

/// An errno, saying why when RNIC_VERBS_DEBUG asks.
fn refuse(errno: c_int, why: &str) -> c_int {
    if crate::util::debug() {
        warn(why);
    }
    errno
}

#[no_mangle]
pub unsafe extern "C" fn rnicdv_set_qp_cc(qp: *mut ibv_qp, cc: *const c_char) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours or NULL.
        let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
            return libc::EINVAL;
        };
        if cc.is_null() {
            return refuse(libc::EINVAL, "rnicdv_set_qp_cc: NULL name");
        }
        // SAFETY: the caller's NUL-terminated string.
        let Ok(name) = unsafe { CStr::from_ptr(cc) }.to_str() else {
            return refuse(libc::EINVAL, "rnicdv_set_qp_cc: name is not UTF-8");
        };
        let req = Request::SetQpCc {
            qpn: q.ibv.qp_num,
            cc: name.to_string(),
        };
        match ctx.device.call(req) {
            Ok(_) => 0,
            Err(e) => refuse(errno_of(&e), &format!("rnicdv_set_qp_cc({name:?}): {e}")),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rnicdv_set_qp_feedback_key(qp: *mut ibv_qp, key: *const u8) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours or NULL.
        let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
            return libc::EINVAL;
        };
        let key = if key.is_null() {
            None
        } else {
            let mut k = [0u8; 16];
            // SAFETY: the caller's 16-byte key (rnicdv.h).
            unsafe { std::ptr::copy_nonoverlapping(key, k.as_mut_ptr(), 16) };
            Some(k)
        };
        let req = Request::SetQpFeedbackKey {
            qpn: q.ibv.qp_num,
            key,
        };
        match ctx.device.call(req) {
            Ok(_) => 0,
            Err(e) => refuse(errno_of(&e), &format!("rnicdv_set_qp_feedback_key: {e}")),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rnicdv_query_qp_cc(qp: *mut ibv_qp, out: *mut RnicdvQpCc) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours or NULL.
        let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
            return libc::EINVAL;
        };
        if out.is_null() {
            return libc::EINVAL;
        }
        let info = match ctx.device.call(Request::QueryQp { qpn: q.ibv.qp_num }) {
            Ok((Reply::QpInfo(i), _)) => i,
            Ok(_) => return libc::EIO,
            Err(e) => return refuse(errno_of(&e), &format!("rnicdv_query_qp_cc: {e}")),
        };
        let mut r = RnicdvQpCc {
            cc: [0; 16],
            window_bytes: info.window_bytes,
            rate_bps: info.rate_bps,
            tx_packets: info.tx_packets,
            rx_packets: info.rx_packets,
            retransmits: info.retransmits,
            timeouts: info.timeouts,
        };
        copy_cstr(&mut r.cc, &info.cc);
        // SAFETY: checked non-NULL caller struct.
        unsafe { out.write(r) };
        0
    })
}
