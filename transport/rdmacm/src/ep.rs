//! The endpoint calls over synchronous ids: `rdma_create_ep` (passive:
//! bind and keep the QP attributes for later requests; active: resolve
//! address and route within 2 s, create the QP, keep `ai_connect` for
//! `rdma_connect`), `rdma_destroy_ep`, and `rdma_get_request` (a
//! synchronous listener's next connection request, with its QP made from
//! the kept attributes).

use std::ffi::c_int;

use crate::event::complete;
use crate::id::{self, Id, NewId};
use crate::sys::*;
use crate::util::{guard, ret};

/// How long rdma_create_ep gives address and route resolution.
const RESOLVE_MS: c_int = 2000;

/// rdma_create_ep's body; the id made is returned even on failure (for
/// the caller to destroy).
fn create_ep(
    out: &mut *mut rdma_cm_id,
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> Result<(), i32> {
    crate::devices::get()?;
    let p = id::create(
        NewId {
            channel: std::ptr::null_mut(),
            context: std::ptr::null_mut(),
            ps: res.ai_port_space as rdma_port_space,
            qp_type: res.ai_qp_type as ibv_qp_type,
            daemon: None,
            source: None,
        },
        false,
    )?;
    let cm: *mut rdma_cm_id = p.cast();
    *out = cm;
    // SAFETY: just made.
    let idr = unsafe { &*p };
    if res.ai_flags & RAI_PASSIVE as c_int != 0 {
        // SAFETY: our new id; the caller's address or NULL.
        if unsafe { id::rdma_bind_addr(cm, res.ai_src_addr) } != 0 {
            return Err(crate::util::errno());
        }
        let mut st = idr.lock();
        if !pd.is_null() {
            // SAFETY: our struct, with the state locked.
            unsafe { std::ptr::addr_of_mut!((*idr.cm()).pd).write(pd) };
        }
        // SAFETY: the caller's attributes or NULL.
        if let Some(a) = unsafe { qp_init_attr.as_ref() } {
            st.ep_qp_attr = Some(ibv_qp_init_attr {
                qp_type: res.ai_qp_type as ibv_qp_type,
                ..*a
            });
        }
        return Ok(());
    }
    // SAFETY: our id; the caller's addresses.
    if unsafe { id::rdma_resolve_addr(cm, res.ai_src_addr, res.ai_dst_addr, RESOLVE_MS) } != 0 {
        return Err(crate::util::errno());
    }
    // SAFETY: our id.
    if unsafe { id::rdma_resolve_route(cm, RESOLVE_MS) } != 0 {
        return Err(crate::util::errno());
    }
    // SAFETY: the caller's attributes or NULL.
    if let Some(a) = unsafe { qp_init_attr.as_mut() } {
        a.qp_type = res.ai_qp_type as ibv_qp_type;
        // SAFETY: our id, the caller's PD and attributes.
        if unsafe { crate::qp::rdma_create_qp(cm, pd, a) } != 0 {
            return Err(crate::util::errno());
        }
    }
    if res.ai_connect_len > 0 && !res.ai_connect.is_null() {
        // SAFETY: the caller's ai_connect_len bytes.
        let data =
            unsafe { std::slice::from_raw_parts(res.ai_connect.cast::<u8>(), res.ai_connect_len) };
        idr.lock().ep_connect = data.to_vec();
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's addrinfo or NULL.
        let (false, Some(res)) = (id.is_null(), unsafe { res.as_ref() }) else {
            return ret(Err(libc::EINVAL));
        };
        let mut made = std::ptr::null_mut();
        match create_ep(&mut made, res, pd, qp_init_attr) {
            Ok(()) => {
                // SAFETY: the caller's slot, checked non-NULL.
                unsafe { *id = made };
                0
            }
            Err(e) => {
                if !made.is_null() {
                    // SAFETY: the id we made, never handed out.
                    unsafe { destroy_ep(made) };
                }
                ret(Err(e))
            }
        }
    })
}

/// Destroys an endpoint: its QP, SRQ and id.
///
/// # Safety
/// `cm` is a live id of ours, not used after.
unsafe fn destroy_ep(cm: *mut rdma_cm_id) {
    // SAFETY: the contract: a live id of ours.
    let Some(id) = (unsafe { Id::from_ptr(cm) }) else {
        return;
    };
    if !id.qp().is_null() {
        // SAFETY: our id.
        unsafe { crate::qp::rdma_destroy_qp(cm) };
    }
    if !id.srq().is_null() {
        // SAFETY: our id.
        unsafe { crate::qp::rdma_destroy_srq(cm) };
    }
    // SAFETY: our id, given up.
    unsafe { id::destroy(cm.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    guard((), || {
        if !id.is_null() {
            // SAFETY: a live id of ours, given up by the application.
            unsafe { destroy_ep(id) };
        }
    })
}

/// rdma_get_request's body.
fn get_request(listen: &Id, out: *mut *mut rdma_cm_id) -> Result<(), i32> {
    let (sync, attr) = {
        let st = listen.lock();
        (st.sync, st.ep_qp_attr)
    };
    if !sync {
        return Err(libc::EINVAL);
    }
    // complete() keeps the event in the listener's slot; it becomes the
    // new id's (acked when that id is destroyed or waits again).
    complete(listen)?;
    let ev = listen.kept_event(&listen.lock());
    // SAFETY: the event complete() just kept (acked only by the
    // listener's next wait or destruction, neither of which can run
    // before this call returns).
    let e = unsafe { *ev };
    if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
        return Err(libc::EINVAL);
    }
    if let Some(mut a) = attr {
        // SAFETY: the new id (live until the application destroys it),
        // the listener's PD (or NULL: the new id's).
        if unsafe { crate::qp::rdma_create_qp(e.id, listen.pd(), &mut a) } != 0 {
            return Err(crate::util::errno());
        }
    }
    // The event moves from the listener's slot to the new id's.
    listen.keep_event(&mut listen.lock(), std::ptr::null_mut());
    let child = id::arg(e.id)?;
    child.keep_event(&mut child.lock(), ev);
    // SAFETY: the caller's slot, checked non-NULL.
    unsafe { *out = e.id };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    crate::util::entry(|| {
        let l = id::arg(listen)?;
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        get_request(l, id)
    })
}
