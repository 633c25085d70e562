//! The QPs and SRQs rdma_cm makes for an id (`rdma_create_qp` / `_ex`,
//! `rdma_destroy_qp`, `rdma_create_srq` / `_ex`, `rdma_destroy_srq`):
//! CQs with a completion channel each when the attributes name none
//! (their `cq_context` is the id), the QP moved to INIT (RC/UC) or on to
//! RTS (UD) at once; and the moves of a connection ([`move_to_rts`]), as
//! `rdma_init_qp_attr` describes them ([`crate::attrs`]).
//!
//! `ibv_create_qp_ex` and `ibv_create_srq_ex` are static inline in
//! verbs.h: their logic is redone here over the exported calls and the
//! context's `verbs_context` ops.

use std::ffi::c_int;

use crate::attrs::{self, QpView};
use crate::id::{self, Id, State};
use crate::sys::*;
use crate::util::{self, errno_or, fail, guard};

/// What the QP attributes of `id` derive from now.
pub fn view(id: &Id, st: &State) -> QpView {
    let (max_resp, max_init) = st
        .dev
        .and_then(|d| d.open().ok())
        .map_or((u8::MAX, u8::MAX), |o| (o.max_resp, o.max_init));
    let qp = id.qp();
    QpView {
        // The QP's type (an RC port space's id may carry a UC QP).
        qp_type: if qp.is_null() {
            id.qp_type()
        } else {
            // SAFETY: the id's live QP.
            unsafe { (*qp).qp_type }
        },
        qkey: RDMA_UDP_QKEY,
        resp_res: st.resp_res.min(max_resp),
        init_depth: st.init_depth.min(max_init),
        retry_count: st.retry_count,
        rnr_retry: st.rnr_retry,
        starting_psn: st.starting_psn,
        ack_timeout: st.ack_timeout,
        peer: st.peer.map(|p| (p.path, p.conn.qp_num)),
    }
}

/// `ibv_modify_qp` to `state` with the id's attributes for it.
fn modify(qp: *mut ibv_qp, v: &QpView, state: ibv_qp_state) -> Result<(), i32> {
    let (mut a, mask) = attrs::qp_attr(v, state)?;
    // SAFETY: a live QP and our attributes.
    match unsafe { ibv_modify_qp(qp, &mut a, mask) } {
        0 => Ok(()),
        e => fail(e, || format!("ibv_modify_qp to state {state}: errno {e}")),
    }
}

/// INIT (again, for a QP in INIT: the connection's access flags), RTR,
/// RTS.
fn init_to_rts(qp: *mut ibv_qp, v: &QpView) -> Result<(), i32> {
    modify(qp, v, IBV_QPS_INIT)?;
    modify(qp, v, IBV_QPS_RTR)?;
    modify(qp, v, IBV_QPS_RTS)
}

/// Moves the id's QP (RC/UC, in INIT) to RTS for its connection.
pub fn move_to_rts(id: &Id, st: &State) -> Result<(), i32> {
    let qp = id.qp();
    if qp.is_null() {
        return Ok(());
    }
    init_to_rts(qp, &view(id, st))
}

/// The context's extended op table, when it has one with `op` set
/// (verbs.h's `verbs_get_ctx_op`).
///
/// # Safety
/// `ctx` is a live verbs context.
unsafe fn vctx(ctx: *mut ibv_context, op_offset: usize) -> Option<*mut verbs_context> {
    // SAFETY: the contract; abi_compat is a plain field.
    if unsafe { (*ctx).abi_compat } != usize::MAX as *mut std::ffi::c_void {
        return None;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: an extended context sits `off` bytes into its verbs_context.
    let v = unsafe { ctx.cast::<u8>().sub(off).cast::<verbs_context>() };
    // SAFETY: `sz` is the first thing past the ops the provider filled;
    // ops before the end of its struct are readable.
    let sz = unsafe { (*v).sz };
    (sz >= std::mem::size_of::<verbs_context>() - op_offset).then_some(v)
}

/// verbs.h's `ibv_create_qp_ex`.
///
/// # Safety
/// `ctx` is a live context; `attr` the caller's attributes.
unsafe fn create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.comp_mask == IBV_QP_INIT_ATTR_PD {
        // SAFETY: ibv_qp_init_attr is the head of ibv_qp_init_attr_ex.
        return unsafe { ibv_create_qp(a.pd, attr.cast()) };
    }
    // SAFETY: the contract.
    let op = unsafe { vctx(ctx, std::mem::offset_of!(verbs_context, create_qp_ex)) }
        // SAFETY: a verbs_context of the provider.
        .and_then(|v| unsafe { (*v).create_qp_ex });
    match op {
        // SAFETY: the provider's op with its own context.
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            crate::util::set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// verbs.h's `ibv_create_srq_ex`.
///
/// # Safety
/// As [`create_qp_ex`].
unsafe fn create_srq_ex(ctx: *mut ibv_context, attr: *mut ibv_srq_init_attr_ex) -> *mut ibv_srq {
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *attr };
    let m = a.comp_mask;
    let basic = m & !(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE) == 0
        && m & IBV_SRQ_INIT_ATTR_PD != 0
        && (m & IBV_SRQ_INIT_ATTR_TYPE == 0 || a.srq_type == IBV_SRQT_BASIC);
    if basic {
        // SAFETY: ibv_srq_init_attr is the head of ibv_srq_init_attr_ex.
        return unsafe { ibv_create_srq(a.pd, attr.cast()) };
    }
    // SAFETY: the contract.
    let op = unsafe { vctx(ctx, std::mem::offset_of!(verbs_context, create_srq_ex)) }
        // SAFETY: a verbs_context of the provider.
        .and_then(|v| unsafe { (*v).create_srq_ex });
    match op {
        // SAFETY: the provider's op with its own context.
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            crate::util::set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// Destroys the CQs and completion channels the library made for the id.
fn destroy_cqs(id: &Id) {
    let cm = id.cm();
    // SAFETY: our struct (the caller holds the id's state); the CQs and
    // channels in it are the ones we created.
    unsafe {
        let c = &mut *cm;
        if !c.recv_cq.is_null() {
            ibv_destroy_cq(c.recv_cq);
            if !c.send_cq.is_null() && c.send_cq != c.recv_cq {
                ibv_destroy_cq(c.send_cq);
            }
        } else if !c.send_cq.is_null() {
            ibv_destroy_cq(c.send_cq);
        }
        c.recv_cq = std::ptr::null_mut();
        c.send_cq = std::ptr::null_mut();
        if !c.recv_cq_channel.is_null() {
            ibv_destroy_comp_channel(c.recv_cq_channel);
            if !c.send_cq_channel.is_null() && c.send_cq_channel != c.recv_cq_channel {
                ibv_destroy_comp_channel(c.send_cq_channel);
            }
        } else if !c.send_cq_channel.is_null() {
            ibv_destroy_comp_channel(c.send_cq_channel);
        }
        c.recv_cq_channel = std::ptr::null_mut();
        c.send_cq_channel = std::ptr::null_mut();
    }
}

/// A CQ of `size` entries with its own completion channel, for the id.
fn make_cq(id: &Id, size: u32) -> Result<(*mut ibv_comp_channel, *mut ibv_cq), i32> {
    // SAFETY: one field of the id's struct (the caller holds its state).
    let ctx = unsafe { std::ptr::addr_of!((*id.cm()).verbs).read() };
    // SAFETY: the id's live context.
    let ch = unsafe { ibv_create_comp_channel(ctx) };
    if ch.is_null() {
        return Err(errno_or(libc::ENOMEM));
    }
    let size = c_int::try_from(size).unwrap_or(c_int::MAX);
    // SAFETY: the context, our channel; the id is the CQ's context
    // (rdma_get_send_comp / _recv_comp check it).
    let cq = unsafe { ibv_create_cq(ctx, size, id.cm().cast(), ch, 0) };
    if cq.is_null() {
        let e = errno_or(libc::ENOMEM);
        // SAFETY: the channel we just made, unused.
        unsafe { ibv_destroy_comp_channel(ch) };
        return Err(e);
    }
    Ok((ch, cq))
}

/// rdma_create_qp_ex's body.
fn create_qp(id: &Id, attr: &mut ibv_qp_init_attr_ex) -> Result<(), i32> {
    let st = id.lock();
    let c = id.c(&st);
    if !c.qp.is_null() || c.verbs.is_null() {
        return fail(libc::EINVAL, || {
            "rdma_create_qp: the id has a QP already, or no device".into()
        });
    }
    if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr.pd = c.pd;
    } else {
        // SAFETY: the application's live PD.
        if unsafe { (*attr.pd).context } != c.verbs {
            return fail(libc::EINVAL, || {
                "rdma_create_qp: the PD is another device's".into()
            });
        }
    }
    if attr.pd.is_null() {
        return Err(libc::EINVAL);
    }
    if (!c.recv_cq.is_null() && !attr.recv_cq.is_null() && c.recv_cq != attr.recv_cq)
        || (!c.send_cq.is_null() && !attr.send_cq.is_null() && c.send_cq != attr.send_cq)
    {
        return Err(libc::EINVAL);
    }
    let cm = id.cm();
    if attr.recv_cq.is_null() && c.recv_cq.is_null() && attr.cap.max_recv_wr > 0 {
        let (ch, cq) = make_cq(id, attr.cap.max_recv_wr)?;
        // SAFETY: our struct, with the state locked.
        unsafe {
            (*cm).recv_cq_channel = ch;
            (*cm).recv_cq = cq;
        }
    }
    if attr.send_cq.is_null() && c.send_cq.is_null() && attr.cap.max_send_wr > 0 {
        match make_cq(id, attr.cap.max_send_wr) {
            Ok((ch, cq)) => {
                // SAFETY: our struct, with the state locked.
                unsafe {
                    (*cm).send_cq_channel = ch;
                    (*cm).send_cq = cq;
                }
            }
            Err(e) => {
                destroy_cqs(id);
                return Err(e);
            }
        }
    }
    let c = id.c(&st);
    if attr.send_cq.is_null() {
        attr.send_cq = c.send_cq;
    }
    if attr.recv_cq.is_null() {
        attr.recv_cq = c.recv_cq;
    }
    if !c.srq.is_null() && attr.srq.is_null() {
        attr.srq = c.srq;
    }
    // SAFETY: the id's live context and the caller's attributes.
    let qp = unsafe { create_qp_ex(c.verbs, attr) };
    if qp.is_null() {
        let e = errno_or(libc::EINVAL);
        destroy_cqs(id);
        return fail(e, || format!("ibv_create_qp: errno {e}"));
    }
    let mut v = view(id, &st);
    // SAFETY: the QP just made.
    v.qp_type = unsafe { (*qp).qp_type };
    let moved = if v.qp_type == IBV_QPT_UD {
        init_to_rts(qp, &v)
    } else {
        // The access the connection allows: none before it is known (an
        // active id before the REP), the kernel's once the REQ is (a
        // passive id's).
        modify(qp, &v, IBV_QPS_INIT)
    };
    if let Err(e) = moved {
        // SAFETY: the QP we just made.
        unsafe { ibv_destroy_qp(qp) };
        destroy_cqs(id);
        return Err(e);
    }
    // SAFETY: our struct, with the state locked; the QP's PD.
    unsafe {
        (*cm).pd = (*qp).pd;
        (*cm).qp = qp;
    }
    drop(st);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's attributes or NULL.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        create_qp(id, a)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's attributes or NULL.
        let init = unsafe { qp_init_attr.as_mut() }.ok_or(libc::EINVAL)?;
        let mut ex = ibv_qp_init_attr_ex {
            qp_context: init.qp_context,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            cap: init.cap,
            qp_type: init.qp_type,
            sq_sig_all: init.sq_sig_all,
            comp_mask: IBV_QP_INIT_ATTR_PD,
            pd: if pd.is_null() { id.pd() } else { pd },
            ..Default::default()
        };
        let r = create_qp(id, &mut ex);
        init.send_cq = ex.send_cq;
        init.recv_cq = ex.recv_cq;
        init.srq = ex.srq;
        init.cap = ex.cap;
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok(id) = id::arg(id) else { return };
        let mut st = id.lock();
        // The daemon takes a destroyed QP out of its groups.
        crate::mcast::qp_destroyed(&mut st);
        let cm = id.cm();
        // SAFETY: our struct, with the state locked; its QP (or NULL).
        unsafe {
            if !(*cm).qp.is_null() {
                ibv_destroy_qp((*cm).qp);
            }
            (*cm).qp = std::ptr::null_mut();
        }
        destroy_cqs(id);
    })
}

fn create_srq(id: &Id, attr: &mut ibv_srq_init_attr_ex) -> Result<(), i32> {
    let st = id.lock();
    let c = id.c(&st);
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || c.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = c.pd;
        attr.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if attr.srq_type == IBV_SRQT_XRC {
        return fail(libc::EOPNOTSUPP, || "XRC SRQs are not supported".into());
    }
    // SAFETY: the id's live context and the caller's attributes.
    let srq = unsafe { create_srq_ex(c.verbs, attr) };
    if srq.is_null() {
        return Err(errno_or(libc::EINVAL));
    }
    let cm = id.cm();
    // SAFETY: our struct, with the state locked.
    unsafe {
        if (*cm).pd.is_null() {
            (*cm).pd = attr.pd;
        }
        (*cm).srq = srq;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's attributes or NULL.
        let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        create_srq(id, a)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's attributes or NULL.
        let init = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
        let mut ex = ibv_srq_init_attr_ex {
            srq_context: init.srq_context,
            attr: init.attr,
            comp_mask: IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD,
            srq_type: IBV_SRQT_BASIC,
            pd,
            ..Default::default()
        };
        let r = create_srq(id, &mut ex);
        init.attr = ex.attr;
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    guard((), || {
        let Ok(id) = id::arg(id) else { return };
        let mut st = id.lock();
        // The daemon takes a destroyed QP out of its groups.
        crate::mcast::qp_destroyed(&mut st);
        let cm = id.cm();
        // SAFETY: our struct, with the state locked; its SRQ (or NULL).
        unsafe {
            if !(*cm).srq.is_null() {
                ibv_destroy_srq((*cm).srq);
            }
            (*cm).srq = std::ptr::null_mut();
        }
        destroy_cqs(id);
    })
}
