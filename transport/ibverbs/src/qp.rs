//! Queue pairs (RC, UC, UD): creation with the caps verbs asks for
//! (written back as granted), the `ibv_modify_qp` state machine with the
//! attribute masks IBA requires of each QP type for each transition,
//! `ibv_query_qp`, destruction.
//! The send and receive rings are posted to by [`crate::post`].

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use shm::abi::{self, Producer, RingLayout};
use shm::proto::{Modify, QpAccessFlags, QpType, Reply, Request, UpdateTo};

use crate::async_event::Kind;
use crate::context::Ctx;
use crate::cq::Cq;
use crate::pd_mr::Pd;
use crate::sys::*;
use crate::util::{errno_of, guard, set_errno, warn};

/// A QP: the C struct first.
#[repr(C)]
pub struct Qp {
    pub ibv: ibv_qp,
    pub sq: UnsafeCell<Producer<abi::Wqe>>,
    pub sq_busy: AtomicBool,
    pub rq: Option<UnsafeCell<Producer<abi::RecvWqe>>>,
    pub rq_busy: AtomicBool,
    /// Every send WR completes with a CQE (`sq_sig_all`).
    pub sig_all: bool,
    pub cap: ibv_qp_cap,
    /// The attributes set so far, for `ibv_query_qp`.
    attr: Mutex<ibv_qp_attr>,
}

// SAFETY: the rings are touched only by the thread holding their busy
// flag; the attributes sit behind a mutex; the rest is immutable.
unsafe impl Sync for Qp {}

impl Qp {
    /// # Safety
    /// `p` is NULL or a live QP of ours.
    pub unsafe fn from_ptr<'a>(p: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: by the contract, the `ibv` field (offset 0) of a Qp.
        unsafe { p.cast::<Qp>().as_ref() }
    }

    pub fn ctx(&self) -> Option<&Ctx> {
        // SAFETY: a QP's context outlives it.
        unsafe { Ctx::from_ptr(self.ibv.context) }
    }

    /// The QP behind `p` and its context (None for NULL or a QP without
    /// one).
    ///
    /// # Safety
    /// As [`Qp::from_ptr`].
    pub unsafe fn with_ctx<'a>(p: *mut ibv_qp) -> Option<(&'a Qp, &'a Ctx)> {
        // SAFETY: the caller's contract.
        let q = unsafe { Qp::from_ptr(p) }?;
        Some((q, q.ctx()?))
    }
}

fn fail<T>(errno: i32, why: &str, v: T) -> T {
    if crate::util::debug() {
        warn(why);
    }
    set_errno(errno);
    v
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        let null = std::ptr::null_mut();
        // SAFETY: a live PD of ours or NULL; `init` the caller's struct.
        let (Some(p), Some(ia)) = (unsafe { Pd::from_ptr(pd) }, unsafe { init.as_mut() }) else {
            return fail(libc::EINVAL, "ibv_create_qp: NULL argument", null);
        };
        let Some(ctx) = p.ctx() else {
            return fail(libc::EINVAL, "ibv_create_qp: PD without context", null);
        };
        let qp_type = match ia.qp_type {
            IBV_QPT_RC => QpType::Rc,
            IBV_QPT_UC => QpType::Uc,
            IBV_QPT_UD => QpType::Ud,
            t => {
                return fail(
                    libc::EOPNOTSUPP,
                    &format!("ibv_create_qp: QP type {t} (RC, UC and UD are supported)"),
                    null,
                )
            }
        };
        // SAFETY: CQs of ours or NULL.
        let (Some(scq), Some(rcq)) = (unsafe { Cq::from_ptr(ia.send_cq) }, unsafe {
            Cq::from_ptr(ia.recv_cq)
        }) else {
            return fail(libc::EINVAL, "ibv_create_qp: a CQ is NULL", null);
        };
        let caps = &ctx.dev.info.caps;
        let c = ia.cap;
        if c.max_send_wr > caps.max_qp_wr
            || c.max_recv_wr > caps.max_qp_wr
            || c.max_send_sge > caps.max_send_sge
            || c.max_recv_sge > caps.max_recv_sge
            || c.max_inline_data > caps.max_inline_data
        {
            return fail(
                libc::EINVAL,
                &format!("ibv_create_qp: caps {c:?} beyond the device's"),
                null,
            );
        }
        let srq = if ia.srq.is_null() {
            None
        } else {
            // SAFETY: an SRQ of ours.
            Some(unsafe { (*ia.srq).handle })
        };
        let depth = c.max_send_wr.max(1).next_power_of_two();
        let rq_depth = if srq.is_some() {
            0
        } else {
            c.max_recv_wr.max(1).next_power_of_two()
        };
        let req = Request::CreateQp {
            pd: p.ibv.handle,
            cq: scq.id(),
            recv_cq: Some(rcq.id()),
            depth,
            rq_depth,
            srq,
            qp_type,
        };
        let (sq_offset, depth, qpn, rq_offset, rq_depth) = match ctx.device.call(req) {
            Ok((
                Reply::Qp {
                    qpn,
                    sq_offset,
                    depth,
                    rq_offset,
                    rq_depth,
                },
                _,
            )) => (sq_offset, depth, qpn, rq_offset, rq_depth),
            Ok(_) => return fail(libc::EIO, "ibv_create_qp: unexpected reply", null),
            Err(e) => return fail(errno_of(&e), &format!("ibv_create_qp: {e}"), null),
        };
        let sq = RingLayout::new(sq_offset as usize, depth, std::mem::size_of::<abi::Wqe>());
        let rq = (rq_depth > 0).then(|| {
            RingLayout::new(
                rq_offset as usize,
                rq_depth,
                std::mem::size_of::<abi::RecvWqe>(),
            )
        });
        let (Ok(sq), Ok(rq)) = (sq, rq.transpose()) else {
            return fail(libc::EIO, "ibv_create_qp: bad ring layout", null);
        };
        let granted = ibv_qp_cap {
            max_send_wr: depth,
            max_recv_wr: if srq.is_some() { 0 } else { rq_depth },
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
        };
        ia.cap = granted;
        let q = Box::new(Qp {
            ibv: ibv_qp {
                context: p.ibv.context,
                qp_context: ia.qp_context,
                pd,
                send_cq: ia.send_cq,
                recv_cq: ia.recv_cq,
                srq: ia.srq,
                handle: qpn,
                qp_num: qpn,
                state: IBV_QPS_RESET,
                qp_type: ia.qp_type,
                ..Default::default()
            },
            sq: UnsafeCell::new(Producer::new(sq)),
            sq_busy: AtomicBool::new(false),
            rq: rq.map(|l| UnsafeCell::new(Producer::new(l))),
            rq_busy: AtomicBool::new(false),
            sig_all: ia.sq_sig_all != 0,
            cap: granted,
            attr: Mutex::new(ibv_qp_attr {
                cap: granted,
                port_num: 1,
                ..Default::default()
            }),
        });
        let p: *mut ibv_qp = Box::into_raw(q).cast();
        ctx.events.register(Kind::Qp, qpn, p.cast());
        p
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours or NULL.
        let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = ctx.device.call(Request::DestroyQp { qpn: q.ibv.qp_num }) {
            if !matches!(e, verbs::VerbsError::Io(_)) {
                return errno_of(&e);
            }
        }
        ctx.events.forget(Kind::Qp, q.ibv.qp_num);
        // SAFETY: boxed by ibv_create_qp, given up here.
        drop(unsafe { Box::from_raw(qp.cast::<Qp>()) });
        0
    })
}

/// The attributes IBA requires and allows for a transition of a QP of
/// `qp_type` (`ibv_qp_attr_mask` bits besides IBV_QP_STATE), or None when
/// the transition does not exist (Linux's `ib_modify_qp_is_ok` table).
pub fn transition_masks_of(
    qp_type: ibv_qp_type,
    from: ibv_qp_state,
    to: ibv_qp_state,
) -> Option<(u32, u32)> {
    use crate::sys as s;
    let alt = s::IBV_QP_ALT_PATH | s::IBV_QP_PATH_MIG_STATE;
    match qp_type {
        s::IBV_QPT_UD => Some(match (from, to) {
            (_, s::IBV_QPS_RESET) | (_, s::IBV_QPS_ERR) => (0, 0),
            (s::IBV_QPS_RESET, s::IBV_QPS_INIT) => {
                (s::IBV_QP_PKEY_INDEX | s::IBV_QP_PORT | s::IBV_QP_QKEY, 0)
            }
            (s::IBV_QPS_INIT, s::IBV_QPS_INIT) => {
                (0, s::IBV_QP_PKEY_INDEX | s::IBV_QP_PORT | s::IBV_QP_QKEY)
            }
            (s::IBV_QPS_INIT, s::IBV_QPS_RTR) => (0, s::IBV_QP_PKEY_INDEX | s::IBV_QP_QKEY),
            (s::IBV_QPS_RTR, s::IBV_QPS_RTS) => {
                (s::IBV_QP_SQ_PSN, s::IBV_QP_CUR_STATE | s::IBV_QP_QKEY)
            }
            (s::IBV_QPS_RTS | s::IBV_QPS_SQD | s::IBV_QPS_SQE, s::IBV_QPS_RTS) => {
                (0, s::IBV_QP_CUR_STATE | s::IBV_QP_QKEY)
            }
            (s::IBV_QPS_RTS, s::IBV_QPS_SQD) => (0, s::IBV_QP_EN_SQD_ASYNC_NOTIFY),
            (s::IBV_QPS_SQD, s::IBV_QPS_SQD) => (0, s::IBV_QP_PKEY_INDEX | s::IBV_QP_QKEY),
            _ => return None,
        }),
        s::IBV_QPT_UC => Some(match (from, to) {
            (_, s::IBV_QPS_RESET) | (_, s::IBV_QPS_ERR) => (0, 0),
            (s::IBV_QPS_RESET, s::IBV_QPS_INIT) => (
                s::IBV_QP_PKEY_INDEX | s::IBV_QP_PORT | s::IBV_QP_ACCESS_FLAGS,
                0,
            ),
            (s::IBV_QPS_INIT, s::IBV_QPS_INIT) => (
                0,
                s::IBV_QP_PKEY_INDEX | s::IBV_QP_PORT | s::IBV_QP_ACCESS_FLAGS,
            ),
            (s::IBV_QPS_INIT, s::IBV_QPS_RTR) => (
                s::IBV_QP_AV | s::IBV_QP_PATH_MTU | s::IBV_QP_DEST_QPN | s::IBV_QP_RQ_PSN,
                s::IBV_QP_ALT_PATH | s::IBV_QP_ACCESS_FLAGS | s::IBV_QP_PKEY_INDEX,
            ),
            (s::IBV_QPS_RTR, s::IBV_QPS_RTS) => (
                s::IBV_QP_SQ_PSN,
                s::IBV_QP_CUR_STATE | alt | s::IBV_QP_ACCESS_FLAGS,
            ),
            (s::IBV_QPS_RTS | s::IBV_QPS_SQD | s::IBV_QPS_SQE, s::IBV_QPS_RTS) => {
                (0, s::IBV_QP_CUR_STATE | alt | s::IBV_QP_ACCESS_FLAGS)
            }
            (s::IBV_QPS_RTS, s::IBV_QPS_SQD) => (0, s::IBV_QP_EN_SQD_ASYNC_NOTIFY),
            (s::IBV_QPS_SQD, s::IBV_QPS_SQD) => (
                0,
                s::IBV_QP_AV | alt | s::IBV_QP_ACCESS_FLAGS | s::IBV_QP_PKEY_INDEX,
            ),
            _ => return None,
        }),
        _ => transition_masks(from, to),
    }
}

/// The attributes IBA requires and allows for an RC QP's transition
/// (`ibv_qp_attr_mask` bits besides IBV_QP_STATE), or None when the
/// transition does not exist.
pub fn transition_masks(from: ibv_qp_state, to: ibv_qp_state) -> Option<(u32, u32)> {
    use crate::sys as s;
    let alt = s::IBV_QP_ALT_PATH | s::IBV_QP_PATH_MIG_STATE;
    Some(match (from, to) {
        (_, s::IBV_QPS_RESET) | (_, s::IBV_QPS_ERR) => (0, 0),
        (s::IBV_QPS_RESET, s::IBV_QPS_INIT) => (
            s::IBV_QP_PKEY_INDEX | s::IBV_QP_PORT | s::IBV_QP_ACCESS_FLAGS,
            0,
        ),
        (s::IBV_QPS_INIT, s::IBV_QPS_INIT) => (
            0,
            s::IBV_QP_PKEY_INDEX | s::IBV_QP_PORT | s::IBV_QP_ACCESS_FLAGS,
        ),
        (s::IBV_QPS_INIT, s::IBV_QPS_RTR) => (
            s::IBV_QP_AV
                | s::IBV_QP_PATH_MTU
                | s::IBV_QP_DEST_QPN
                | s::IBV_QP_RQ_PSN
                | s::IBV_QP_MAX_DEST_RD_ATOMIC
                | s::IBV_QP_MIN_RNR_TIMER,
            s::IBV_QP_ALT_PATH | s::IBV_QP_ACCESS_FLAGS | s::IBV_QP_PKEY_INDEX,
        ),
        (s::IBV_QPS_RTR, s::IBV_QPS_RTS) => (
            s::IBV_QP_SQ_PSN
                | s::IBV_QP_TIMEOUT
                | s::IBV_QP_RETRY_CNT
                | s::IBV_QP_RNR_RETRY
                | s::IBV_QP_MAX_QP_RD_ATOMIC,
            s::IBV_QP_CUR_STATE | alt | s::IBV_QP_ACCESS_FLAGS | s::IBV_QP_MIN_RNR_TIMER,
        ),
        (s::IBV_QPS_RTS, s::IBV_QPS_RTS) | (s::IBV_QPS_SQD, s::IBV_QPS_RTS) => (
            0,
            s::IBV_QP_CUR_STATE | alt | s::IBV_QP_ACCESS_FLAGS | s::IBV_QP_MIN_RNR_TIMER,
        ),
        (s::IBV_QPS_RTS, s::IBV_QPS_SQD) => (0, s::IBV_QP_EN_SQD_ASYNC_NOTIFY),
        (s::IBV_QPS_SQD, s::IBV_QPS_SQD) => (
            0,
            s::IBV_QP_AV
                | alt
                | s::IBV_QP_ACCESS_FLAGS
                | s::IBV_QP_PKEY_INDEX
                | s::IBV_QP_MIN_RNR_TIMER
                | s::IBV_QP_TIMEOUT
                | s::IBV_QP_RETRY_CNT
                | s::IBV_QP_RNR_RETRY
                | s::IBV_QP_MAX_QP_RD_ATOMIC
                | s::IBV_QP_MAX_DEST_RD_ATOMIC,
        ),
        (s::IBV_QPS_SQE, s::IBV_QPS_RTS) => (0, s::IBV_QP_CUR_STATE | s::IBV_QP_ACCESS_FLAGS),
        _ => return None,
    })
}

/// The QP's state as the daemon knows it (it moves QPs to ERR itself).
fn current_state(ctx: &Ctx, q: &Qp) -> ibv_qp_state {
    match ctx.device.call(Request::QueryQp { qpn: q.ibv.qp_num }) {
        Ok((Reply::QpInfo(i), _)) => match i.state.as_str() {
            "RESET" => IBV_QPS_RESET,
            "INIT" => IBV_QPS_INIT,
            "RTR" => IBV_QPS_RTR,
            "RTS" => IBV_QPS_RTS,
            "SQD" => IBV_QPS_SQD,
            _ => IBV_QPS_ERR,
        },
        _ => q.ibv.state,
    }
}

fn mtu_bytes(m: ibv_mtu) -> Option<u32> {
    match m {
        IBV_MTU_256 => Some(256),
        IBV_MTU_512 => Some(512),
        IBV_MTU_1024 => Some(1024),
        IBV_MTU_2048 => Some(2048),
        IBV_MTU_4096 => Some(4096),
        _ => None,
    }
}

/// The attributes an in-place modify changes, from the mask.
fn update(to: UpdateTo, a: &ibv_qp_attr, mask: u32, sqd_notify: bool) -> Modify {
    let set = |bit: u32| mask & bit != 0;
    let f = a.qp_access_flags;
    Modify::Update {
        to,
        access: set(IBV_QP_ACCESS_FLAGS).then_some(QpAccessFlags {
            remote_write: f & IBV_ACCESS_REMOTE_WRITE != 0,
            remote_read: f & IBV_ACCESS_REMOTE_READ != 0,
            remote_atomic: f & IBV_ACCESS_REMOTE_ATOMIC != 0,
        }),
        min_rnr_timer: set(IBV_QP_MIN_RNR_TIMER).then_some(a.min_rnr_timer),
        timeout: set(IBV_QP_TIMEOUT).then_some(a.timeout),
        retry_cnt: set(IBV_QP_RETRY_CNT).then_some(a.retry_cnt),
        rnr_retry: set(IBV_QP_RNR_RETRY).then_some(a.rnr_retry),
        sqd_notify,
        qkey: set(IBV_QP_QKEY).then_some(a.qkey),
    }
}

/// Attributes IBA allows in a transition that this NIC does not have:
/// alternate paths (no automatic path migration) and, once connected, a
/// new address vector or new READ/atomic depths.
const UNSUPPORTED: u32 = IBV_QP_ALT_PATH
    | IBV_QP_PATH_MIG_STATE
    | IBV_QP_AV
    | IBV_QP_MAX_QP_RD_ATOMIC
    | IBV_QP_MAX_DEST_RD_ATOMIC;

/// The daemon requests, in order, for a checked transition of a UD QP:
/// its Q_Key on the way to INIT (and in any later modify), no
/// destination at RTR, its first PSN at RTS.
fn ud_request(from: ibv_qp_state, a: &ibv_qp_attr, mask: u32) -> Vec<Modify> {
    let to = a.qp_state;
    let qkey = mask & IBV_QP_QKEY != 0;
    let keyed = |to: UpdateTo| update(to, a, mask & IBV_QP_QKEY, false);
    match (from, to) {
        (_, IBV_QPS_ERR) => vec![Modify::Err],
        (_, IBV_QPS_RESET) => vec![Modify::Reset],
        (IBV_QPS_RESET, IBV_QPS_INIT) => vec![Modify::Init {
            remote_write: false,
            remote_read: false,
            remote_atomic: false,
            qkey: Some(a.qkey),
        }],
        (IBV_QPS_INIT, IBV_QPS_INIT) => vec![keyed(UpdateTo::Init)],
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            let mut v = Vec::new();
            if qkey {
                v.push(keyed(UpdateTo::Init));
            }
            v.push(Modify::UdRtr);
            v
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => {
            let mut v = vec![Modify::UdRts { sq_psn: a.sq_psn }];
            if qkey {
                v.push(keyed(UpdateTo::Rts));
            }
            v
        }
        (IBV_QPS_RTS, IBV_QPS_SQD) => {
            let notify = mask & IBV_QP_EN_SQD_ASYNC_NOTIFY != 0 && a.en_sqd_async_notify != 0;
            vec![update(UpdateTo::Sqd, a, 0, notify)]
        }
        (IBV_QPS_SQD, IBV_QPS_SQD) => vec![keyed(UpdateTo::Sqd)],
        _ => vec![keyed(UpdateTo::Rts)],
    }
}

/// The daemon requests, in order, for a checked transition.
fn request(from: ibv_qp_state, a: &ibv_qp_attr, mask: u32) -> Result<Vec<Modify>, (i32, String)> {
    let to = a.qp_state;
    let set = |bit: u32| mask & bit != 0;
    if set(IBV_QP_PKEY_INDEX) && a.pkey_index != 0 {
        return Err((
            libc::EINVAL,
            format!(
                "pkey_index {} (the port has one P_Key, index 0)",
                a.pkey_index
            ),
        ));
    }
    if set(IBV_QP_PORT) && a.port_num != 1 {
        return Err((
            libc::EINVAL,
            format!("port {} (the device has port 1)", a.port_num),
        ));
    }
    let connecting = matches!(
        (from, to),
        (IBV_QPS_INIT, IBV_QPS_RTR) | (IBV_QPS_RTR, IBV_QPS_RTS)
    );
    let unsupported = if connecting {
        mask & (IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE)
    } else {
        mask & UNSUPPORTED
    };
    if unsupported != 0 {
        return Err((
            libc::EOPNOTSUPP,
            format!("attributes {unsupported:#x} in {from} -> {to} (no alternate path; address and READ depths are set on the way to RTS)"),
        ));
    }
    Ok(match (from, to) {
        (_, IBV_QPS_ERR) => vec![Modify::Err],
        (_, IBV_QPS_RESET) => vec![Modify::Reset],
        (IBV_QPS_RESET, IBV_QPS_INIT) => {
            let f = a.qp_access_flags;
            vec![Modify::Init {
                remote_write: f & IBV_ACCESS_REMOTE_WRITE != 0,
                remote_read: f & IBV_ACCESS_REMOTE_READ != 0,
                remote_atomic: f & IBV_ACCESS_REMOTE_ATOMIC != 0,
                qkey: None,
            }]
        }
        (IBV_QPS_INIT, IBV_QPS_INIT) => vec![update(UpdateTo::Init, a, mask, false)],
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            let mtu =
                mtu_bytes(a.path_mtu).ok_or((libc::EINVAL, format!("path_mtu {}", a.path_mtu)))?;
            let ah = &a.ah_attr;
            if ah.is_global == 0 {
                return Err((
                    libc::EINVAL,
                    "ah_attr.is_global is 0: RoCE needs a GRH with the peer's GID".into(),
                ));
            }
            // SAFETY: every bit pattern of the GID union is valid bytes.
            let g = unsafe { ah.grh.dgid.raw };
            if g[..10] != [0; 10] || g[10..12] != [0xff, 0xff] {
                return Err((
                    libc::EINVAL,
                    "the destination GID is not IPv4-mapped (use GID index 1, ::ffff:a.b.c.d)"
                        .into(),
                ));
            }
            let dest_ip = std::net::Ipv4Addr::new(g[12], g[13], g[14], g[15]);
            let mut v = Vec::new();
            if set(IBV_QP_ACCESS_FLAGS) {
                // New access flags first, while still in INIT.
                v.push(update(UpdateTo::Init, a, IBV_QP_ACCESS_FLAGS, false));
            }
            v.push(Modify::Rtr {
                mtu,
                dest_qpn: a.dest_qp_num,
                dest_ip,
                rq_psn: a.rq_psn,
                max_dest_rd_atomic: a.max_dest_rd_atomic,
                min_rnr_timer: a.min_rnr_timer,
                // 0, what a zeroed attribute holds, leaves the daemon's
                // DSCP (perftest's --tclass sets it).
                traffic_class: (ah.grh.traffic_class != 0).then_some(ah.grh.traffic_class),
            });
            v
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => {
            let mut v = vec![Modify::Rts {
                sq_psn: a.sq_psn,
                timeout: a.timeout,
                retry_cnt: a.retry_cnt,
                rnr_retry: a.rnr_retry,
                max_rd_atomic: a.max_rd_atomic,
            }];
            let extra = mask & (IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER);
            if extra != 0 {
                // The optional attributes, once in RTS.
                v.push(update(UpdateTo::Rts, a, extra, false));
            }
            v
        }
        (IBV_QPS_RTS | IBV_QPS_SQD | IBV_QPS_SQE, IBV_QPS_RTS) => {
            vec![update(UpdateTo::Rts, a, mask, false)]
        }
        (IBV_QPS_RTS, IBV_QPS_SQD) => {
            let notify = set(IBV_QP_EN_SQD_ASYNC_NOTIFY) && a.en_sqd_async_notify != 0;
            vec![update(UpdateTo::Sqd, a, 0, notify)]
        }
        (IBV_QPS_SQD, IBV_QPS_SQD) => vec![update(UpdateTo::Sqd, a, mask, false)],
        _ => {
            return Err((
                libc::EINVAL,
                format!("no transition {from} -> {to} (mask {mask:#x})"),
            ))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours or NULL; the caller's attributes.
        let (Some(q), Some(a)) = (unsafe { Qp::from_ptr(qp) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let Some(ctx) = q.ctx() else {
            return libc::EINVAL;
        };
        let mask = attr_mask as u32;
        let from = current_state(ctx, q);
        if mask & IBV_QP_CUR_STATE != 0 && a.cur_qp_state != from {
            return fail(
                libc::EINVAL,
                &format!("cur_qp_state {} but the QP is in {from}", a.cur_qp_state),
                libc::EINVAL,
            );
        }
        let to = if mask & IBV_QP_STATE != 0 {
            a.qp_state
        } else {
            from
        };
        let Some((required, optional)) = transition_masks_of(q.ibv.qp_type, from, to) else {
            return fail(
                libc::EINVAL,
                &format!("no transition {from} -> {to}"),
                libc::EINVAL,
            );
        };
        let given = mask & !IBV_QP_STATE;
        if given & required != required || given & !(required | optional) != 0 {
            return fail(
                libc::EINVAL,
                &format!(
                    "mask {mask:#x} for {from} -> {to}: requires {required:#x}, allows {optional:#x}"
                ),
                libc::EINVAL,
            );
        }
        let mut eff = *a;
        eff.qp_state = to;
        if q.ibv.qp_type == IBV_QPT_UC {
            // UC's masks carry no retry, RNR or READ attributes: whatever
            // the caller left in them is not read.
            eff.max_dest_rd_atomic = 0;
            eff.max_rd_atomic = 0;
            eff.min_rnr_timer = 0;
            eff.timeout = 0;
            eff.retry_cnt = 0;
            eff.rnr_retry = 0;
        }
        let steps = if q.ibv.qp_type == IBV_QPT_UD {
            Ok(ud_request(from, &eff, mask))
        } else {
            request(from, &eff, mask)
        };
        let steps = match steps {
            Ok(m) => m,
            Err((e, why)) => return fail(e, &format!("ibv_modify_qp: {why}"), e),
        };
        for modify in steps {
            let req = Request::ModifyQp {
                qpn: q.ibv.qp_num,
                modify,
            };
            if let Err(e) = ctx.device.call(req) {
                return fail(errno_of(&e), &format!("ibv_modify_qp: {e}"), errno_of(&e));
            }
        }
        {
            let mut saved = q.attr.lock().unwrap_or_else(|p| p.into_inner());
            merge(&mut saved, a, mask);
            saved.qp_state = to;
        }
        // SAFETY: our own live struct, no Rust reference to it held past
        // this point; verbs applications read `state` between calls.
        unsafe { (*qp).state = to };
        0
    })
}

/// Copies the attributes `mask` names into the saved set.
fn merge(saved: &mut ibv_qp_attr, a: &ibv_qp_attr, mask: u32) {
    let set = |bit: u32| mask & bit != 0;
    if set(IBV_QP_ACCESS_FLAGS) {
        saved.qp_access_flags = a.qp_access_flags;
    }
    if set(IBV_QP_PKEY_INDEX) {
        saved.pkey_index = a.pkey_index;
    }
    if set(IBV_QP_PORT) {
        saved.port_num = a.port_num;
    }
    if set(IBV_QP_AV) {
        saved.ah_attr = a.ah_attr;
    }
    if set(IBV_QP_PATH_MTU) {
        saved.path_mtu = a.path_mtu;
    }
    if set(IBV_QP_DEST_QPN) {
        saved.dest_qp_num = a.dest_qp_num;
    }
    if set(IBV_QP_RQ_PSN) {
        saved.rq_psn = a.rq_psn;
    }
    if set(IBV_QP_MAX_DEST_RD_ATOMIC) {
        saved.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if set(IBV_QP_MIN_RNR_TIMER) {
        saved.min_rnr_timer = a.min_rnr_timer;
    }
    if set(IBV_QP_SQ_PSN) {
        saved.sq_psn = a.sq_psn;
    }
    if set(IBV_QP_TIMEOUT) {
        saved.timeout = a.timeout;
    }
    if set(IBV_QP_RETRY_CNT) {
        saved.retry_cnt = a.retry_cnt;
    }
    if set(IBV_QP_RNR_RETRY) {
        saved.rnr_retry = a.rnr_retry;
    }
    if set(IBV_QP_MAX_QP_RD_ATOMIC) {
        saved.max_rd_atomic = a.max_rd_atomic;
    }
    if set(IBV_QP_QKEY) {
        saved.qkey = a.qkey;
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live QP of ours or NULL.
        let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let mut a = *q.attr.lock().unwrap_or_else(|p| p.into_inner());
        a.qp_state = current_state(ctx, q);
        a.cur_qp_state = a.qp_state;
        a.cap = q.cap;
        // SAFETY: checked non-NULL caller structs.
        unsafe {
            attr.write(a);
            init_attr.write(ibv_qp_init_attr {
                qp_context: q.ibv.qp_context,
                send_cq: q.ibv.send_cq,
                recv_cq: q.ibv.recv_cq,
                srq: q.ibv.srq,
                cap: q.cap,
                qp_type: q.ibv.qp_type,
                sq_sig_all: c_int::from(q.sig_all),
            });
        }
        0
    })
}
