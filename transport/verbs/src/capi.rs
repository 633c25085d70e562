//! The C ABI (`include/rnic_verbs.h`): ibverbs-like names over the Rust
//! API, for C applications linking `libverbs.so`.
//!
//! Objects are opaque pointers to boxed Rust handles. Functions returning a
//! pointer return NULL on error, functions returning `int` return 0 or -1;
//! `rnic_last_error()` gives the reason (per thread). Every pointer
//! argument may be NULL (an error, never a crash); non-NULL pointers must be
//! ones this library returned and not yet destroyed, as with ibverbs.
//!
//! The functions are meant for C callers, for whom Rust's `unsafe fn`
//! means nothing; the pointer contract is the header's, and each
//! dereference below says why it holds.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::net::Ipv4Addr;

use crate::device::Payload;
use crate::device::{
    Cq, Device, Endpoint, LocalBuf, Mr, Pd, PreparedQp, Qp, RecvRequest, WorkRequest,
};
use crate::proto::MrAccess;
use transport::abi::{opcode_code, status_code, status_from_code, wqe_op};
use transport::rc::{InlineData, SgList, Sge, WcStatus, WrOp};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: impl std::fmt::Display) {
    let c = CString::new(msg.to_string().replace('\0', " ")).expect("NULs replaced");
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Access flags of `rnic_reg_mr`.
pub const RNIC_ACCESS_LOCAL_WRITE: c_int = 1;
pub const RNIC_ACCESS_REMOTE_WRITE: c_int = 2;
pub const RNIC_ACCESS_REMOTE_READ: c_int = 4;
pub const RNIC_ACCESS_REMOTE_ATOMIC: c_int = 8;
/// `RnicWc::wc_flags`: `imm_data` holds immediate data.
pub const RNIC_WC_WITH_IMM: c_int = 1;

/// What a peer needs (C layout of [`Endpoint`] with its region).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RnicEndpoint {
    pub qpn: u32,
    pub psn: u32,
    /// IPv4 address, most significant byte first (10.0.0.1 = 0x0a000001).
    pub ip: u32,
    pub rkey: u32,
    pub va: u64,
    pub len: u64,
}

/// One work request of `rnic_post_send`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RnicSendWr {
    pub wr_id: u64,
    /// RNIC_WR_RDMA_WRITE (1), RNIC_WR_RDMA_WRITE_WITH_IMM (2),
    /// RNIC_WR_RDMA_READ (3), RNIC_WR_SEND (4), RNIC_WR_SEND_WITH_IMM (5),
    /// RNIC_WR_ATOMIC_CMP_AND_SWP (6), RNIC_WR_ATOMIC_FETCH_AND_ADD (7).
    pub opcode: c_int,
    /// Non-zero: report success too.
    pub signaled: c_int,
    pub lkey: u32,
    pub length: u32,
    pub local_addr: u64,
    pub remote_addr: u64,
    pub rkey: u32,
    /// The immediate value in network order (as ibverbs' `imm_data`: the
    /// bytes in memory go on the wire as they are).
    pub imm_data: u32,
    /// FETCH_ADD: the addend; CMP_SWAP: the value compared with.
    pub compare_add: u64,
    /// CMP_SWAP: the value written when the compare matches.
    pub swap: u64,
    /// Non-zero: wait for earlier READs and atomics (IBV_SEND_FENCE).
    pub fence: c_int,
    /// With `sg_list`: how many local buffers it holds (they replace
    /// `lkey`, `local_addr` and `length`).
    pub num_sge: c_int,
    pub sg_list: *const RnicSge,
    /// Non-NULL: SEND or WRITE these `length` bytes of this process's
    /// memory inline (copied at post; at most RNIC_MAX_INLINE).
    pub inline_data: *const u8,
}

/// One local buffer of a scatter/gather list.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RnicSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// One receive work request of `rnic_post_recv`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RnicRecvWr {
    pub wr_id: u64,
    pub lkey: u32,
    pub length: u32,
    pub addr: u64,
    /// With `sg_list`: how many local buffers it holds (they replace
    /// `lkey`, `addr` and `length`).
    pub num_sge: c_int,
    pub sg_list: *const RnicSge,
}

/// A work completion.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RnicWc {
    pub wr_id: u64,
    pub qp_num: u32,
    pub byte_len: u32,
    /// RNIC_WC_SUCCESS (0) or an error: the `ibv_wc_status` values.
    pub status: c_int,
    /// `ibv_wc_opcode` values: 0 SEND, 1 RDMA WRITE, 2 RDMA READ,
    /// 3 COMP_SWAP, 4 FETCH_ADD, 128 RECV, 129 RECV_RDMA_WITH_IMM.
    pub opcode: c_int,
    /// RNIC_WC_WITH_IMM when `imm_data` holds immediate data.
    pub wc_flags: c_int,
    /// The immediate value the sender posted, in network order.
    pub imm_data: u32,
}

/// An opened device.
pub struct RnicContext(Device);
pub struct RnicPd(Pd);
pub struct RnicMr(Mr);
pub struct RnicCq(Cq);
/// A QP: prepared (INIT) until `rnic_connect_qp`, then connected.
pub enum RnicQp {
    Prepared(PreparedQp),
    Connected(Qp),
    /// A failed connect left nothing usable.
    Gone,
}

/// Borrows a C handle, or records an error.
macro_rules! handle {
    ($p:expr, $what:literal, $fail:expr) => {{
        // SAFETY: the caller passes NULL or a pointer this library
        // returned (a live Box), as the header's contract says; NULL is
        // refused here.
        match unsafe { $p.as_ref() } {
            Some(h) => h,
            None => {
                set_error(concat!($what, " is NULL"));
                return $fail;
            }
        }
    }};
}

fn cstr<'a>(p: *const c_char, what: &str) -> Option<&'a str> {
    if p.is_null() {
        set_error(format!("{what} is NULL"));
        return None;
    }
    // SAFETY: non-NULL, and the caller passes a NUL-terminated string.
    match unsafe { CStr::from_ptr(p) }.to_str() {
        Ok(s) => Some(s),
        Err(_) => {
            set_error(format!("{what} is not UTF-8"));
            None
        }
    }
}

fn boxed<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Frees a handle made by `boxed`.
fn destroy<T>(p: *mut T) -> c_int {
    if p.is_null() {
        set_error("handle is NULL");
        return -1;
    }
    // SAFETY: non-NULL and, by the contract, a live Box from `boxed`
    // that the caller gives up.
    drop(unsafe { Box::from_raw(p) });
    0
}

/// The reason the last call on this thread failed ("" if none).
#[no_mangle]
pub extern "C" fn rnic_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The ibverbs-style name of a completion status.
#[no_mangle]
pub extern "C" fn rnic_wc_status_str(status: c_int) -> *const c_char {
    let s: &'static CStr = match u8::try_from(status).map(status_from_code) {
        Ok(Some(WcStatus::Success)) => c"success",
        Ok(Some(WcStatus::LocLenErr)) => c"local length error",
        Ok(Some(WcStatus::LocQpOpErr)) => c"local QP operation error",
        Ok(Some(WcStatus::LocProtErr)) => c"local protection error",
        Ok(Some(WcStatus::WrFlushErr)) => c"Work Request Flushed Error",
        Ok(Some(WcStatus::RemInvReqErr)) => c"remote invalid request error",
        Ok(Some(WcStatus::RemAccessErr)) => c"remote access error",
        Ok(Some(WcStatus::RemOpErr)) => c"remote operation error",
        Ok(Some(WcStatus::RetryExcErr)) => c"transport retry counter exceeded",
        Ok(Some(WcStatus::RnrRetryExcErr)) => c"RNR retry counter exceeded",
        _ => c"unknown",
    };
    s.as_ptr()
}

/// Opens device `name` of the daemon at `socket` with a shared segment
/// of `shm_bytes` (0: the default, 64 MiB).
#[no_mangle]
pub extern "C" fn rnic_open_device(
    socket: *const c_char,
    name: *const c_char,
    shm_bytes: u64,
) -> *mut RnicContext {
    let (Some(socket), Some(name)) = (cstr(socket, "socket"), cstr(name, "name")) else {
        return std::ptr::null_mut();
    };
    let bytes = if shm_bytes == 0 {
        crate::device::DEFAULT_SHM_BYTES
    } else {
        shm_bytes
    };
    match Device::open_with(socket, name, bytes) {
        Ok(d) => boxed(RnicContext(d)),
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    }
}

/// Closes a device (after its objects are destroyed; whatever is left is
/// freed by the daemon).
#[no_mangle]
pub extern "C" fn rnic_close_device(ctx: *mut RnicContext) -> c_int {
    destroy(ctx)
}

#[no_mangle]
pub extern "C" fn rnic_alloc_pd(ctx: *mut RnicContext) -> *mut RnicPd {
    let ctx = handle!(ctx, "context", std::ptr::null_mut());
    match ctx.0.alloc_pd() {
        Ok(p) => boxed(RnicPd(p)),
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn rnic_dealloc_pd(pd: *mut RnicPd) -> c_int {
    destroy(pd)
}

/// Allocates `len` bytes of shared memory and registers them with
/// `access` (RNIC_ACCESS_* flags).
#[no_mangle]
pub extern "C" fn rnic_reg_mr(pd: *mut RnicPd, len: u64, access: c_int) -> *mut RnicMr {
    let pd = handle!(pd, "pd", std::ptr::null_mut());
    let a = MrAccess {
        local_write: access & RNIC_ACCESS_LOCAL_WRITE != 0,
        remote_write: access & RNIC_ACCESS_REMOTE_WRITE != 0,
        remote_read: access & RNIC_ACCESS_REMOTE_READ != 0,
        remote_atomic: access & RNIC_ACCESS_REMOTE_ATOMIC != 0,
    };
    match pd.0.alloc_mr(len, a) {
        Ok(m) => boxed(RnicMr(m)),
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn rnic_dereg_mr(mr: *mut RnicMr) -> c_int {
    destroy(mr)
}

/// The region's bytes in this process (NULL on a NULL handle).
#[no_mangle]
pub extern "C" fn rnic_mr_addr(mr: *mut RnicMr) -> *mut c_void {
    // SAFETY: NULL or a live handle (contract); the region's bytes stay
    // mapped while the handle lives.
    match unsafe { mr.as_mut() } {
        Some(m) => m.0.as_mut_slice().as_mut_ptr().cast(),
        None => {
            set_error("mr is NULL");
            std::ptr::null_mut()
        }
    }
}

/// The region's device address (what work requests and peers use).
#[no_mangle]
pub extern "C" fn rnic_mr_va(mr: *const RnicMr) -> u64 {
    handle!(mr, "mr", 0).0.va
}

#[no_mangle]
pub extern "C" fn rnic_mr_lkey(mr: *const RnicMr) -> u32 {
    handle!(mr, "mr", 0).0.lkey
}

#[no_mangle]
pub extern "C" fn rnic_mr_rkey(mr: *const RnicMr) -> u32 {
    handle!(mr, "mr", 0).0.rkey
}

/// A completion queue of `depth` entries (a power of two).
#[no_mangle]
pub extern "C" fn rnic_create_cq(ctx: *mut RnicContext, depth: u32) -> *mut RnicCq {
    let ctx = handle!(ctx, "context", std::ptr::null_mut());
    match ctx.0.create_cq(depth) {
        Ok(c) => boxed(RnicCq(c)),
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn rnic_destroy_cq(cq: *mut RnicCq) -> c_int {
    destroy(cq)
}

/// Creates an RC QP (in INIT) whose completions go to `cq`, with a send
/// queue of `depth` entries (a power of two).
#[no_mangle]
pub extern "C" fn rnic_create_qp(pd: *mut RnicPd, cq: *mut RnicCq, depth: u32) -> *mut RnicQp {
    let pd = handle!(pd, "pd", std::ptr::null_mut());
    let cq = handle!(cq, "cq", std::ptr::null_mut());
    match pd
        .0
        .qp_builder(&cq.0)
        .depth(depth)
        .recv_depth(depth)
        .build()
    {
        Ok(q) => boxed(RnicQp::Prepared(q)),
        Err(e) => {
            set_error(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn rnic_destroy_qp(qp: *mut RnicQp) -> c_int {
    destroy(qp)
}

/// This QP's endpoint (QPN, PSN, address) into `out`; with `mr` non-NULL,
/// that region's va, rkey and len too.
#[no_mangle]
pub extern "C" fn rnic_qp_endpoint(
    qp: *const RnicQp,
    mr: *const RnicMr,
    out: *mut RnicEndpoint,
) -> c_int {
    let qp = handle!(qp, "qp", -1);
    let RnicQp::Prepared(p) = qp else {
        set_error("the QP is already connected");
        return -1;
    };
    let e = p.endpoint();
    // SAFETY: NULL or a live handle (contract).
    let r = unsafe { mr.as_ref() }.map(|m| m.0.remote());
    // SAFETY: NULL is refused; otherwise the caller's writable struct.
    let Some(out) = (unsafe { out.as_mut() }) else {
        set_error("out is NULL");
        return -1;
    };
    *out = RnicEndpoint {
        qpn: e.qpn,
        psn: e.psn,
        ip: u32::from(e.ip),
        rkey: r.map_or(0, |r| r.rkey),
        va: r.map_or(0, |r| r.va),
        len: r.map_or(0, |r| r.len),
    };
    0
}

/// INIT -> RTR -> RTS towards the peer's endpoint.
#[no_mangle]
pub extern "C" fn rnic_connect_qp(qp: *mut RnicQp, remote: *const RnicEndpoint) -> c_int {
    // SAFETY: NULL or a live handle (contract).
    let Some(qp) = (unsafe { qp.as_mut() }) else {
        set_error("qp is NULL");
        return -1;
    };
    let remote = *handle!(remote, "remote", -1);
    let RnicQp::Prepared(p) = std::mem::replace(qp, RnicQp::Gone) else {
        set_error("the QP is not waiting to be connected");
        return -1;
    };
    let ep = Endpoint {
        qpn: remote.qpn,
        psn: remote.psn,
        ip: Ipv4Addr::from(remote.ip),
        mr: None,
    };
    match p.connect(&ep) {
        Ok(q) => {
            *qp = RnicQp::Connected(q);
            0
        }
        Err(e) => {
            set_error(e);
            -1
        }
    }
}

/// Posts `n` work requests behind one doorbell (all or none). Returns 0,
/// or -1 when the send queue lacks room or an opcode is unknown.
#[no_mangle]
pub extern "C" fn rnic_post_send(qp: *const RnicQp, wrs: *const RnicSendWr, n: c_int) -> c_int {
    let qp = handle!(qp, "qp", -1);
    let RnicQp::Connected(q) = qp else {
        set_error("the QP is not connected");
        return -1;
    };
    if n < 0 || (n > 0 && wrs.is_null()) {
        set_error(format!("{n} work requests at {wrs:?}"));
        return -1;
    }
    let wrs: &[RnicSendWr] = if n == 0 {
        &[]
    } else {
        // SAFETY: non-NULL, and the caller passes `n` initialised
        // structs (contract of the header).
        unsafe { std::slice::from_raw_parts(wrs, n as usize) }
    };
    let mut batch = Vec::with_capacity(wrs.len());
    for w in wrs {
        let payload = match payload_of(w) {
            Ok(p) => p,
            Err(e) => {
                set_error(e);
                return -1;
            }
        };
        let op = match u8::try_from(w.opcode) {
            Ok(wqe_op::RDMA_WRITE) => WrOp::Write,
            Ok(wqe_op::RDMA_WRITE_WITH_IMM) => WrOp::WriteImm(u32::from_be(w.imm_data)),
            Ok(wqe_op::RDMA_READ) => WrOp::Read,
            Ok(wqe_op::SEND) => WrOp::Send,
            Ok(wqe_op::SEND_WITH_IMM) => WrOp::SendImm(u32::from_be(w.imm_data)),
            Ok(wqe_op::ATOMIC_CMP_AND_SWP) => WrOp::CmpSwap {
                compare: w.compare_add,
                swap: w.swap,
            },
            Ok(wqe_op::ATOMIC_FETCH_AND_ADD) => WrOp::FetchAdd { add: w.compare_add },
            _ => {
                set_error(format!("unknown opcode {}", w.opcode));
                return -1;
            }
        };
        batch.push(WorkRequest {
            wr_id: w.wr_id,
            op,
            local: LocalBuf {
                lkey: w.lkey,
                va: w.local_addr,
                len: w.length,
            },
            remote_va: w.remote_addr,
            rkey: w.rkey,
            signaled: w.signaled != 0,
            fence: w.fence != 0,
            payload,
        });
    }
    match q.post(&batch) {
        Ok(()) => 0,
        Err(e) => {
            set_error(e);
            -1
        }
    }
}

/// The scatter/gather list or inline bytes of a C work request.
fn payload_of(w: &RnicSendWr) -> Result<Payload, String> {
    if !w.inline_data.is_null() {
        let n = w.length as usize;
        if n > transport::rc::MAX_INLINE_DATA {
            return Err(format!(
                "work request {}: {n} bytes inline (at most {})",
                w.wr_id,
                transport::rc::MAX_INLINE_DATA
            ));
        }
        // SAFETY: non-NULL, and the caller passes `length` readable bytes
        // (contract of the header); they are copied at once.
        let data = unsafe { std::slice::from_raw_parts(w.inline_data, n) };
        let d = InlineData::new(data).map_err(|e| e.to_string())?;
        return Ok(Payload::Inline(d));
    }
    Ok(match sg_list(w.wr_id, w.sg_list, w.num_sge)? {
        Some(sg) => Payload::Sges(sg),
        None => Payload::Local,
    })
}

/// The scatter/gather list a C work request names (`None` for
/// `num_sge` 0: its single buffer).
fn sg_list(wr_id: u64, list: *const RnicSge, num_sge: c_int) -> Result<Option<SgList>, String> {
    if num_sge <= 0 {
        return Ok(None);
    }
    if list.is_null() {
        return Err(format!(
            "work request {wr_id}: num_sge {num_sge} with a NULL sg_list"
        ));
    }
    let n = num_sge as usize;
    if n > transport::rc::MAX_SGE {
        return Err(format!(
            "work request {wr_id}: {n} scatter/gather entries (at most {})",
            transport::rc::MAX_SGE
        ));
    }
    // SAFETY: non-NULL, and the caller passes `num_sge` initialised
    // entries (contract of the header).
    let sges = unsafe { std::slice::from_raw_parts(list, n) };
    let mut out = [Sge::default(); transport::rc::MAX_SGE];
    for (o, s) in out.iter_mut().zip(sges) {
        *o = Sge {
            lkey: s.lkey,
            va: s.addr,
            len: s.length,
        };
    }
    SgList::new(&out[..n])
        .map(Some)
        .map_err(|e| format!("work request {wr_id}: {e}"))
}

/// Posts `n` receive work requests behind one doorbell (all or none), to a
/// QP prepared or connected. Returns 0, or -1 when the receive queue lacks
/// room or the QP takes its receive WQEs from an SRQ.
#[no_mangle]
pub extern "C" fn rnic_post_recv(qp: *const RnicQp, wrs: *const RnicRecvWr, n: c_int) -> c_int {
    let qp = handle!(qp, "qp", -1);
    let q = match qp {
        RnicQp::Prepared(p) => p.qp(),
        RnicQp::Connected(q) => q,
        RnicQp::Gone => {
            set_error("the QP is gone (a connect failed)");
            return -1;
        }
    };
    if n < 0 || (n > 0 && wrs.is_null()) {
        set_error(format!("{n} receive work requests at {wrs:?}"));
        return -1;
    }
    let wrs: &[RnicRecvWr] = if n == 0 {
        &[]
    } else {
        // SAFETY: non-NULL, and the caller passes `n` initialised
        // structs (contract of the header).
        unsafe { std::slice::from_raw_parts(wrs, n as usize) }
    };
    let mut batch = Vec::with_capacity(wrs.len());
    for w in wrs {
        let sges = match sg_list(w.wr_id, w.sg_list, w.num_sge) {
            Ok(s) => s,
            Err(e) => {
                set_error(e);
                return -1;
            }
        };
        let local = LocalBuf {
            lkey: w.lkey,
            va: w.addr,
            len: w.length,
        };
        batch.push(RecvRequest {
            sges,
            ..RecvRequest::new(w.wr_id, local)
        });
    }
    match q.post_recv(&batch) {
        Ok(()) => 0,
        Err(e) => {
            set_error(e);
            -1
        }
    }
}

/// Fills up to `n` completions into `wc`; returns how many, or -1.
#[no_mangle]
pub extern "C" fn rnic_poll_cq(cq: *const RnicCq, n: c_int, wc: *mut RnicWc) -> c_int {
    let cq = handle!(cq, "cq", -1);
    if n <= 0 || wc.is_null() {
        set_error(format!("{n} completions into {wc:?}"));
        return -1;
    }
    // SAFETY: non-NULL, room for `n` structs (contract of the header).
    let out = unsafe { std::slice::from_raw_parts_mut(wc, n as usize) };
    // Completions pass through a small stack buffer: no allocation on the
    // polling path.
    let mut tmp = [crate::device::empty_completion(); 32];
    let mut filled = 0;
    while filled < out.len() {
        let want = (out.len() - filled).min(tmp.len());
        let k = match cq.0.poll(&mut tmp[..want]) {
            Ok(k) => k,
            Err(e) => {
                set_error(e);
                return -1;
            }
        };
        for (o, c) in out[filled..].iter_mut().zip(&tmp[..k]) {
            *o = RnicWc {
                wr_id: c.wr_id,
                qp_num: c.qpn,
                byte_len: c.byte_len,
                status: c_int::from(status_code(c.status)),
                opcode: c_int::from(opcode_code(c.opcode)),
                wc_flags: if c.imm.is_some() { RNIC_WC_WITH_IMM } else { 0 },
                imm_data: c.imm.unwrap_or(0).to_be(),
            };
        }
        filled += k;
        if k < want {
            break;
        }
    }
    filled as c_int
}

/// Blocks until `cq` has a completion or `timeout_ms` passes; returns 1,
/// 0 on timeout, -1 on error.
#[no_mangle]
pub extern "C" fn rnic_wait_cq(cq: *const RnicCq, timeout_ms: u32) -> c_int {
    let cq = handle!(cq, "cq", -1);
    match cq
        .0
        .wait(std::time::Duration::from_millis(u64::from(timeout_ms)))
    {
        Ok(b) => c_int::from(b),
        Err(e) => {
            set_error(e);
            -1
        }
    }
}

#[cfg(test)]
mod tests {
    /// The header's limits are the library's.
    #[test]
    fn status_names_are_ibverbs_names() {
        use super::*;
        // SAFETY: the function returns a static NUL-terminated string.
        let name = |c| {
            unsafe { CStr::from_ptr(rnic_wc_status_str(c)) }
                .to_str()
                .unwrap()
        };
        assert_eq!(name(5), "Work Request Flushed Error");
        assert_eq!(name(12), "transport retry counter exceeded");
        for c in 0..=255u8 {
            assert_eq!(name(c_int::from(c)), transport::abi::status_name(c), "{c}");
        }
    }

    #[test]
    fn header_limits_match_the_abi() {
        let h = include_str!("../include/rnic_verbs.h");
        let max_sge = format!("RNIC_MAX_SGE = {},", transport::abi::WQE_MAX_SGE);
        let max_inline = format!("RNIC_MAX_INLINE = {},", transport::rc::MAX_INLINE_DATA);
        assert!(h.contains(&max_sge), "{max_sge}");
        let recv = format!("RNIC_MAX_RECV_SGE = {},", transport::abi::RECV_WQE_MAX_SGE);
        assert!(h.contains(&recv), "{recv}");
        use transport::rc::WcStatus::*;
        for (name, st) in [
            ("SUCCESS", Success),
            ("LOC_LEN_ERR", LocLenErr),
            ("LOC_QP_OP_ERR", LocQpOpErr),
            ("LOC_PROT_ERR", LocProtErr),
            ("WR_FLUSH_ERR", WrFlushErr),
            ("REM_INV_REQ_ERR", RemInvReqErr),
            ("REM_ACCESS_ERR", RemAccessErr),
            ("REM_OP_ERR", RemOpErr),
            ("RETRY_EXC_ERR", RetryExcErr),
            ("RNR_RETRY_EXC_ERR", RnrRetryExcErr),
        ] {
            let line = format!("RNIC_WC_{name} = {},", transport::abi::status_code(st));
            assert!(h.contains(&line), "{line}");
        }
        assert!(h.contains(&max_inline), "{max_inline}");
    }
}
