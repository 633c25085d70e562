//! Connections: `rdma_connect`, `rdma_accept`, `rdma_reject` (and
//! `_ece`), `rdma_disconnect`, `rdma_establish`, `rdma_init_qp_attr`, and
//! ECE's `rdma_set_local_ece` / `rdma_get_remote_ece`.
//!
//! The READ/atomic depths follow rdma-core: an active side offers the
//! parameter's depths (RDMA_MAX_* or no parameter: the device's maximum;
//! more than the device has: EINVAL); a passive side accepts with the
//! parameter's, or the request's capped at the device's.

use std::ffi::{c_int, c_void};

use shm::cma::{CmAcceptReq, CmConnParams, CmConnectReq};
use shm::proto::{QpType, Request};

use crate::event::{complete, qp_to_err};
use crate::id;
use crate::sys::*;
use crate::util::{fail, guard, ret, SockAddr};

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

/// A depth of the parameter: RDMA_MAX (0xFF) means the device's; more
/// than the device has is EINVAL.
pub fn depth(asked: Option<u8>, dev_max: u8) -> Result<u8, i32> {
    match asked {
        None | Some(0xFF) => Ok(dev_max),
        Some(d) if d > dev_max => Err(libc::EINVAL),
        Some(d) => Ok(d),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        let id = match id::arg(id) {
            Ok(i) => i,
            Err(e) => return ret(Err(e)),
        };
        // SAFETY: the caller's parameters or NULL.
        let param = unsafe { conn_param.as_ref() };
        let r = (|| {
            let mut st = id.lock();
            let (Some(dev), Some(session)) = (st.dev, st.session.clone()) else {
                return fail(libc::EINVAL, || {
                    "rdma_connect: resolve the address first".into()
                });
            };
            let o = dev.open()?;
            let c = id.c();
            let ud = c.qp_type == IBV_QPT_UD;
            if !ud && c.qp.is_null() && param.is_none() {
                return fail(libc::EINVAL, || {
                    "rdma_connect: no QP and no parameters".into()
                });
            }
            let (resp, init) = if ud {
                (0, 0)
            } else {
                (
                    depth(param.map(|p| p.responder_resources), o.max_resp)?,
                    depth(param.map(|p| p.initiator_depth), o.max_init)?,
                )
            };
            let (qpn, srq) = if c.qp.is_null() {
                param.map_or((0, false), |p| (p.qp_num, p.srq != 0))
            } else {
                // SAFETY: the id's live QP.
                unsafe { ((*c.qp).qp_num, !(*c.qp).srq.is_null()) }
            };
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
            let (retry, rnr, flow) = param.map_or((7, 7, false), |p| {
                (p.retry_count, p.rnr_retry_count, p.flow_control != 0)
            });
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
            let qp_type = match (ud, c.qp.is_null()) {
                (true, _) => QpType::Ud,
                // SAFETY: the id's live QP.
                (false, false) if unsafe { (*c.qp).qp_type } == IBV_QPT_UC => QpType::Uc,
                _ => QpType::Rc,
            };
            session.call_ok(Request::CmConnect(CmConnectReq {
                id: st.num,
                channel: st.req_channel,
                port_space: c.ps as u16,
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
                    retry_count: retry.min(7),
                    rnr_retry_count: rnr.min(7),
                    srq,
                    qp_num: qpn,
                },
                private_data: data,
                traffic_class: st.tos.unwrap_or(0),
                ack_timeout: st.ack_timeout,
            }))?;
            st.ep_connect.clear();
            Ok(())
        })();
        if let Err(e) = r {
            return ret(Err(e));
        }
        ret(complete(id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    guard(-1, || {
        let id = match id::arg(id) {
            Ok(i) => i,
            Err(e) => return ret(Err(e)),
        };
        // SAFETY: the caller's parameters or NULL.
        let param = unsafe { conn_param.as_ref() };
        let ud = id.is_ud();
        let r = (|| {
            let mut st = id.lock();
            let (Some(dev), Some(session)) = (st.dev, st.session.clone()) else {
                return fail(libc::EINVAL, || {
                    "rdma_accept: the id has no connection request".into()
                });
            };
            if !st.child {
                return fail(libc::EINVAL, || {
                    "rdma_accept: the id has no connection request".into()
                });
            }
            let o = dev.open()?;
            let c = id.c();
            let (qpn, srq) = if !c.qp.is_null() {
                // SAFETY: the id's live QP.
                unsafe { ((*c.qp).qp_num, !(*c.qp).srq.is_null()) }
            } else if let Some(p) = param {
                (p.qp_num, p.srq != 0)
            } else {
                return fail(libc::EINVAL, || {
                    "rdma_accept: no QP and no parameters".into()
                });
            };
            if !ud {
                let pick = |asked: Option<u8>, cur: u8, max: u8| match asked {
                    None | Some(0xFF) => Ok(cur.min(max)),
                    Some(d) if d > max => Err(libc::EINVAL),
                    Some(d) => Ok(d),
                };
                st.resp_res = pick(
                    param.map(|p| p.responder_resources),
                    st.resp_res,
                    o.max_resp,
                )?;
                st.init_depth = pick(param.map(|p| p.initiator_depth), st.init_depth, o.max_init)?;
                crate::qp::move_to_rts(id, &st)?;
            }
            let max = if ud { SIDR_REP_PRIVATE } else { REP_PRIVATE };
            let data = match param {
                Some(p) => private(p.private_data, p.private_data_len, max)?,
                None => Vec::new(),
            };
            let (retry, rnr, flow) = param.map_or((7, 7, false), |p| {
                (p.retry_count, p.rnr_retry_count, p.flow_control != 0)
            });
            let sent = session.call_ok(Request::CmAccept(CmAcceptReq {
                id: st.num,
                qpn,
                starting_psn: st.starting_psn,
                conn: CmConnParams {
                    responder_resources: st.resp_res,
                    initiator_depth: st.init_depth,
                    flow_control: flow,
                    retry_count: retry.min(7),
                    rnr_retry_count: rnr.min(7),
                    srq,
                    qp_num: qpn,
                },
                private_data: data,
                qkey: if ud { RDMA_UDP_QKEY } else { 0 },
            }));
            if let Err(e) = sent {
                qp_to_err(id);
                return Err(e);
            }
            Ok(())
        })();
        if let Err(e) = r {
            return ret(Err(e));
        }
        if ud {
            // No ESTABLISHED comes on the passive side of a SIDR exchange.
            let cm = id.cm();
            // SAFETY: a sync id's event slot (NULL for others).
            let last = unsafe { std::mem::replace(&mut (*cm).event, std::ptr::null_mut()) };
            if !last.is_null() {
                // SAFETY: the id's own unacked event.
                unsafe { crate::event::ack(last) };
            }
            return 0;
        }
        ret(complete(id))
    })
}

fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> Result<(), i32> {
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
        })
        .map(|_| ())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard(-1, || ret(reject(id, private_data, private_data_len)))
}

/// Rejects as rdma_reject does: the contract has no reject reason, so
/// the REJ says "consumer defined" (28), not 35.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    guard(-1, || ret(reject(id, private_data, private_data_len)))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        let id = match id::arg(id) {
            Ok(i) => i,
            Err(e) => return ret(Err(e)),
        };
        let r = (|| {
            let st = id.lock();
            if st.dev.is_none() {
                return Err(libc::EINVAL);
            }
            qp_to_err(id);
            let Some(session) = st.session.clone() else {
                return Err(libc::EINVAL);
            };
            session
                .call_ok(Request::CmDisconnect { id: st.num })
                .map(|_| ())
        })();
        if let Err(e) = r {
            return ret(Err(e));
        }
        ret(complete(id))
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    guard(-1, || {
        ret((|| {
            let id = id::arg(id)?;
            if !id.c().qp.is_null() {
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
        })())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        ret((|| {
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
        })())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        ret((|| {
            let id = id::arg(id)?;
            // SAFETY: the caller's struct or NULL.
            let e = unsafe { ece.as_ref() }.ok_or(libc::EINVAL)?;
            if !id.c().qp.is_null() || e.vendor_id == 0 || e.comp_mask != 0 {
                return Err(libc::EINVAL);
            }
            id.lock().local_ece = (e.vendor_id, e.options);
            Ok(())
        })())
    })
}

/// No peer of ours sends ECE: the remote's is all zero.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    guard(-1, || {
        ret((|| {
            let id = id::arg(id)?;
            // SAFETY: the caller's struct or NULL.
            let e = unsafe { ece.as_mut() }.ok_or(libc::EINVAL)?;
            if !id.c().qp.is_null() {
                return Err(libc::EINVAL);
            }
            *e = ibv_ece::default();
            Ok(())
        })())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_max_or_no_parameter_asks_for_the_device_maximum() {
        assert_eq!(depth(None, 16), Ok(16));
        assert_eq!(depth(Some(0xFF), 16), Ok(16));
        assert_eq!(depth(Some(1), 16), Ok(1));
        assert_eq!(depth(Some(0), 16), Ok(0));
    }

    #[test]
    fn more_than_the_device_has_is_einval() {
        assert_eq!(depth(Some(17), 16), Err(libc::EINVAL));
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
