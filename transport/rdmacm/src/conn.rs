//! Connections: `rdma_connect`, `rdma_accept`, `rdma_reject` (and
//! `_ece`), `rdma_disconnect`, `rdma_establish`, `rdma_init_qp_attr`, and
//! ECE's `rdma_set_local_ece` / `rdma_get_remote_ece`.
//!
//! The READ/atomic depths follow rdma-core: an active side offers the
//! parameter's depths (RDMA_MAX_* or no parameter: the device's maximum;
//! more than the device has: EINVAL); a passive side accepts with the
//! parameter's, or the request's capped at the device's. After the REP
//! the active side answers as many READs as the REP's initiator depth
//! (`crate::event`). Retry counts are clamped to 7, as the kernel does.

use std::ffi::{c_int, c_void};

use shm::cma::{CmAcceptReq, CmConnParams, CmConnectReq};
use shm::proto::{QpType, Request};

use crate::event::{complete, qp_to_err};
use crate::id;
use crate::sys::*;
use crate::util::{self, fail, SockAddr};

/// Private data each message carries at most (rdma_cm's header taken off
/// the REQ's and SIDR_REQ's).
const REQ_PRIVATE: usize = 56;
const REP_PRIVATE: usize = 196;
const REJ_PRIVATE: usize = 148;
const SIDR_REQ_PRIVATE: usize = 180;
const SIDR_REP_PRIVATE: usize = 136;

/// The application's private data (EINVAL beyond `max`).
fn private(data: *const c_void, len: u8, max: usize) -> Result<Vec<u8>, i32> {
    if data.is_null() || len == 0 {
        return Ok(Vec::new());
    }
    if usize::from(len) > max {
        return fail(libc::EINVAL, || {
            format!("{len} bytes of private data, at most {max}")
        });
    }
    // SAFETY: the caller's `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec())
}

/// A depth of the parameter: RDMA_MAX (0xFF) or no parameter means
/// `dflt` capped at the device's `max` (active: the device's maximum;
/// passive: the request's); more than the device has is EINVAL.
pub fn depth(asked: Option<u8>, dflt: u8, max: u8) -> Result<u8, i32> {
    match asked {
        None | Some(0xFF) => Ok(dflt.min(max)),
        Some(d) if d > max => Err(libc::EINVAL),
        Some(d) => Ok(d),
    }
}

/// The parameter's retry count, RNR retry count (7 without one, at most
/// 7 as the kernel clamps them) and flow control.
fn retries(param: Option<&rdma_conn_param>) -> (u8, u8, bool) {
    param.map_or((7, 7, false), |p| {
        (
            p.retry_count.min(7),
            p.rnr_retry_count.min(7),
            p.flow_control != 0,
        )
    })
}

/// The QPN and whether it has an SRQ: the id's QP's, else the
/// parameter's (None: neither).
fn qpn_srq(id: &id::Id, param: Option<&rdma_conn_param>) -> Option<(u32, bool)> {
    let qp = id.qp();
    if qp.is_null() {
        return param.map(|p| (p.qp_num, p.srq != 0));
    }
    // SAFETY: the id's live QP.
    Some(unsafe { ((*qp).qp_num, !(*qp).srq.is_null()) })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's parameters or NULL.
        let param = unsafe { conn_param.as_ref() };
        connect(id, param)?;
        complete(id)
    })
}

fn connect(id: &id::Id, param: Option<&rdma_conn_param>) -> Result<(), i32> {
    let mut st = id.lock();
    let (Some(dev), Some(session)) = (st.dev, st.session.clone()) else {
        return fail(libc::EINVAL, || {
            "rdma_connect: resolve the address first".into()
        });
    };
    let o = dev.open()?;
    let qp = id.qp();
    let ud = id.is_ud();
    if !ud && qp.is_null() && param.is_none() {
        return fail(libc::EINVAL, || {
            "rdma_connect: no QP and no parameters".into()
        });
    }
    let (resp, init) = if ud {
        (0, 0)
    } else {
        (
            depth(param.map(|p| p.responder_resources), o.max_resp, o.max_resp)?,
            depth(param.map(|p| p.initiator_depth), o.max_init, o.max_init)?,
        )
    };
    let (qpn, srq) = qpn_srq(id, param).unwrap_or((0, false));
    let mut data = st.ep_connect.clone();
    if let Some(p) = param {
        data.extend(private(p.private_data, p.private_data_len, 255)?);
    }
    let max = if ud { SIDR_REQ_PRIVATE } else { REQ_PRIVATE };
    if data.len() > max {
        return fail(libc::EINVAL, || {
            format!("{} bytes of private data, at most {max}", data.len())
        });
    }
    let (retry, rnr, flow) = retries(param);
    let (src, dst) = id.route_addrs();
    let (Some(SockAddr::V4(src)), Some(SockAddr::V4(dst))) = (src, dst) else {
        return Err(libc::EINVAL);
    };
    st.resp_res = resp;
    st.init_depth = init;
    st.retry_count = retry;
    st.rnr_retry = rnr;
    st.starting_psn = crate::util::random_psn();
    st.connect_error = false;
    // SAFETY: the id's live QP, when it has one.
    let uc = !qp.is_null() && unsafe { (*qp).qp_type } == IBV_QPT_UC;
    let qp_type = match (ud, uc) {
        (true, _) => QpType::Ud,
        (false, true) => QpType::Uc,
        _ => QpType::Rc,
    };
    session.call_ok(Request::CmConnect(CmConnectReq {
        id: st.num,
        channel: st.req_channel,
        port_space: id.ps() as u16,
        src_port: src.port,
        dst: dst.ip,
        dst_port: dst.port,
        qp_type,
        qpn,
        starting_psn: st.starting_psn,
        conn: CmConnParams {
            responder_resources: resp,
            initiator_depth: init,
            flow_control: flow,
            retry_count: retry,
            rnr_retry_count: rnr,
            srq,
            qp_num: qpn,
        },
        private_data: data,
        traffic_class: st.tos.unwrap_or(0),
        ack_timeout: st.ack_timeout,
    }))?;
    st.ep_connect.clear();
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's parameters or NULL.
        let param = unsafe { conn_param.as_ref() };
        accept(id, param)?;
        if id.is_ud() {
            // No ESTABLISHED comes on the passive side of a SIDR exchange.
            id.ack_kept_event(&mut id.lock());
            return Ok(());
        }
        complete(id)
    })
}

fn accept(id: &id::Id, param: Option<&rdma_conn_param>) -> Result<(), i32> {
    let ud = id.is_ud();
    let mut st = id.lock();
    let (Some(dev), Some(session), true) = (st.dev, st.session.clone(), st.child) else {
        return fail(libc::EINVAL, || {
            "rdma_accept: the id has no connection request".into()
        });
    };
    let o = dev.open()?;
    let Some((qpn, srq)) = qpn_srq(id, param) else {
        return fail(libc::EINVAL, || {
            "rdma_accept: no QP and no parameters".into()
        });
    };
    if !ud {
        st.resp_res = depth(
            param.map(|p| p.responder_resources),
            st.resp_res,
            o.max_resp,
        )?;
        st.init_depth = depth(param.map(|p| p.initiator_depth), st.init_depth, o.max_init)?;
        crate::qp::move_to_rts(id, &st)?;
    }
    let max = if ud { SIDR_REP_PRIVATE } else { REP_PRIVATE };
    let data = match param {
        Some(p) => private(p.private_data, p.private_data_len, max)?,
        None => Vec::new(),
    };
    let (retry, rnr, flow) = retries(param);
    let sent = session.call_ok(Request::CmAccept(CmAcceptReq {
        id: st.num,
        qpn,
        starting_psn: st.starting_psn,
        conn: CmConnParams {
            responder_resources: st.resp_res,
            initiator_depth: st.init_depth,
            flow_control: flow,
            retry_count: retry,
            rnr_retry_count: rnr,
            srq,
            qp_num: qpn,
        },
        private_data: data,
        qkey: if ud { RDMA_UDP_QKEY } else { 0 },
    }));
    if let Err(e) = sent {
        let _ = qp_to_err(id);
        return Err(e);
    }
    Ok(())
}

/// The reject reason rdma_reject_ece gives: IBTA's "vendor option not
/// supported".
pub const REJ_VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;

fn reject(
    id: *mut rdma_cm_id,
    data: *const c_void,
    len: u8,
    reason: Option<u16>,
) -> Result<(), i32> {
    let id = id::arg(id)?;
    let st = id.lock();
    let Some(session) = st.session.clone() else {
        return fail(libc::EINVAL, || {
            "rdma_reject: the id has no connection request".into()
        });
    };
    let max = if id.is_ud() {
        SIDR_REP_PRIVATE
    } else {
        REJ_PRIVATE
    };
    session
        .call_ok(Request::CmReject {
            id: st.num,
            private_data: private(data, len, max)?,
            reason,
        })
        .map(|_| ())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    util::entry(|| reject(id, private_data, private_data_len, None))
}

/// Rejects with reason 35 (vendor option not supported), as rdma-core.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    util::entry(|| {
        reject(
            id,
            private_data,
            private_data_len,
            Some(REJ_VENDOR_OPTION_NOT_SUPPORTED),
        )
    })
}

/// As rdma-core's: the QP to ERR first (ucma_shutdown; its failure is
/// the call's), then the DREQ.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        {
            let st = id.lock();
            if st.dev.is_none() {
                return Err(libc::EINVAL);
            }
            qp_to_err(id)?;
            let Some(session) = st.session.clone() else {
                return Err(libc::EINVAL);
            };
            session.call_ok(Request::CmDisconnect { id: st.num })?;
        }
        complete(id)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        if !id.qp().is_null() {
            return fail(libc::EINVAL, || {
                "rdma_establish: the library moved this id's QP itself".into()
            });
        }
        let st = id.lock();
        let Some(session) = st.session.clone() else {
            return Err(libc::EINVAL);
        };
        session
            .call_ok(Request::CmEstablish { id: st.num })
            .map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes; only the state is read.
        let state = unsafe { (*qp_attr).qp_state };
        let st = id.lock();
        if st.dev.is_none() {
            return Err(libc::EINVAL);
        }
        let (a, mask) = crate::attrs::qp_attr(&crate::qp::view(id, &st), state)?;
        // SAFETY: the caller's structs, checked non-NULL.
        unsafe {
            qp_attr.write(a);
            qp_attr_mask.write(mask);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's struct or NULL.
        let e = unsafe { ece.as_ref() }.ok_or(libc::EINVAL)?;
        if !id.qp().is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        id.lock().local_ece = (e.vendor_id, e.options);
        Ok(())
    })
}

/// No peer of ours sends ECE: the remote's is all zero.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's struct or NULL.
        let e = unsafe { ece.as_mut() }.ok_or(libc::EINVAL)?;
        if !id.qp().is_null() {
            return Err(libc::EINVAL);
        }
        *e = ibv_ece::default();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_max_or_no_parameter_asks_for_the_device_maximum() {
        assert_eq!(depth(None, 16, 16), Ok(16));
        assert_eq!(depth(Some(0xFF), 16, 16), Ok(16));
        assert_eq!(depth(Some(1), 16, 16), Ok(1));
        assert_eq!(depth(Some(0), 16, 16), Ok(0));
        // Passive: the request's, capped at the device's.
        assert_eq!(depth(None, 4, 16), Ok(4));
        assert_eq!(depth(Some(0xFF), 20, 16), Ok(16));
    }

    #[test]
    fn retry_counts_are_clamped_to_7() {
        let p = rdma_conn_param {
            retry_count: 9,
            rnr_retry_count: 15,
            flow_control: 1,
            ..Default::default()
        };
        assert_eq!(retries(Some(&p)), (7, 7, true));
        assert_eq!(retries(None), (7, 7, false));
    }

    #[test]
    fn more_than_the_device_has_is_einval() {
        assert_eq!(depth(Some(17), 16, 16), Err(libc::EINVAL));
        assert_eq!(depth(Some(17), 4, 16), Err(libc::EINVAL));
    }

    #[test]
    fn private_data_beyond_the_message_s_room_is_einval() {
        let b = [7u8; 200];
        assert_eq!(
            private(b.as_ptr().cast(), 57, REQ_PRIVATE).unwrap_err(),
            libc::EINVAL
        );
        assert_eq!(
            private(b.as_ptr().cast(), 56, REQ_PRIVATE).unwrap().len(),
            56
        );
        assert!(private(std::ptr::null(), 10, REQ_PRIVATE)
            .unwrap()
            .is_empty());
    }
}
