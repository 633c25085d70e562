//! Shared receive queues: a ring of receive WQEs in the segment that any
//! QP attached to the SRQ consumes; `ops.post_srq_recv` writes it like a
//! QP's receive ring. The limit (`ibv_modify_srq` with IBV_SRQ_LIMIT) is
//! the daemon's.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::AtomicBool;

use shm::abi::{self, Producer, RingLayout};
use shm::proto::{Reply, Request};

use crate::async_event::Kind;
use crate::context::Ctx;
use crate::pd_mr::Pd;
use crate::sys::*;
use crate::util::{errno_of, guard, set_errno};

/// An SRQ: the C struct first.
#[repr(C)]
pub struct Srq {
    pub ibv: ibv_srq,
    ring: UnsafeCell<Producer<abi::RecvWqe>>,
    busy: AtomicBool,
    depth: u32,
    max_sge: u32,
}

// SAFETY: the ring is touched only by the thread holding `busy`.
unsafe impl Sync for Srq {}

impl Srq {
    /// # Safety
    /// `p` is NULL or a live SRQ of ours.
    unsafe fn from_ptr<'a>(p: *mut ibv_srq) -> Option<&'a Srq> {
        // SAFETY: by the contract, the `ibv` field (offset 0) of an Srq.
        unsafe { p.cast::<Srq>().as_ref() }
    }

    fn ctx(&self) -> Option<&Ctx> {
        // SAFETY: an SRQ's context outlives it.
        unsafe { Ctx::from_ptr(self.ibv.context) }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard(std::ptr::null_mut(), || {
        let null = std::ptr::null_mut();
        // SAFETY: a live PD of ours or NULL; the caller's attributes.
        let (Some(p), Some(ia)) = (unsafe { Pd::from_ptr(pd) }, unsafe { init.as_mut() }) else {
            set_errno(libc::EINVAL);
            return null;
        };
        let Some(ctx) = p.ctx() else {
            set_errno(libc::EINVAL);
            return null;
        };
        let caps = &ctx.dev.info.caps;
        let a = ia.attr;
        if a.max_wr == 0 || a.max_wr > caps.max_srq_wr || a.max_sge > caps.max_recv_sge {
            set_errno(libc::EINVAL);
            return null;
        }
        let depth = a.max_wr.next_power_of_two();
        let req = Request::CreateSrq {
            pd: p.ibv.handle,
            depth,
        };
        let (srq, offset, depth) = match ctx.device.call(req) {
            Ok((Reply::Srq { srq, offset, depth }, _)) => (srq, offset, depth),
            Ok(_) => {
                set_errno(libc::EIO);
                return null;
            }
            Err(e) => {
                set_errno(errno_of(&e));
                return null;
            }
        };
        let slot = std::mem::size_of::<abi::RecvWqe>();
        let Ok(layout) = RingLayout::new(offset as usize, depth, slot) else {
            set_errno(libc::EIO);
            return null;
        };
        if a.srq_limit > 0 {
            let limit = Request::ModifySrq {
                srq,
                limit: a.srq_limit,
            };
            if let Err(e) = ctx.device.call(limit) {
                let _ = ctx.device.call(Request::DestroySrq { srq });
                set_errno(errno_of(&e));
                return null;
            }
        }
        ia.attr.max_wr = depth;
        ia.attr.max_sge = caps.max_recv_sge;
        let s = Box::into_raw(Box::new(Srq {
            ibv: ibv_srq {
                context: p.ibv.context,
                srq_context: ia.srq_context,
                pd,
                handle: srq,
                ..Default::default()
            },
            ring: UnsafeCell::new(Producer::new(layout)),
            busy: AtomicBool::new(false),
            depth,
            max_sge: caps.max_recv_sge,
        }));
        ctx.events.register(Kind::Srq, srq, s.cast());
        s.cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours or NULL; the caller's attributes.
        let (Some(s), Some(a)) = (unsafe { Srq::from_ptr(srq) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let Some(ctx) = s.ctx() else {
            return libc::EINVAL;
        };
        let mask = mask as u32;
        if mask & IBV_SRQ_MAX_WR != 0 {
            // Resizing an SRQ is not supported (no IBV_DEVICE_SRQ_RESIZE).
            return libc::EOPNOTSUPP;
        }
        if mask & !IBV_SRQ_LIMIT != 0 {
            return libc::EINVAL;
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            if a.srq_limit > s.depth {
                return libc::EINVAL;
            }
            let req = Request::ModifySrq {
                srq: s.ibv.handle,
                limit: a.srq_limit,
            };
            if let Err(e) = ctx.device.call(req) {
                return errno_of(&e);
            }
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours or NULL.
        let Some(s) = (unsafe { Srq::from_ptr(srq) }) else {
            return libc::EINVAL;
        };
        let Some(ctx) = s.ctx() else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match ctx.device.call(Request::QuerySrq { srq: s.ibv.handle }) {
            Ok((Reply::SrqInfo(i), _)) => {
                // SAFETY: checked non-NULL caller struct.
                unsafe {
                    attr.write(ibv_srq_attr {
                        max_wr: s.depth,
                        max_sge: s.max_sge,
                        srq_limit: i.limit,
                    })
                };
                0
            }
            Ok(_) => libc::EIO,
            Err(e) => errno_of(&e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live SRQ of ours or NULL.
        let Some(s) = (unsafe { Srq::from_ptr(srq) }) else {
            return libc::EINVAL;
        };
        let Some(ctx) = s.ctx() else {
            return libc::EINVAL;
        };
        ctx.events.forget(Kind::Srq, s.ibv.handle);
        if let Err(e) = ctx.device.call(Request::DestroySrq { srq: s.ibv.handle }) {
            if !matches!(e, verbs::VerbsError::Io(_)) {
                return errno_of(&e);
            }
        }
        // SAFETY: boxed by ibv_create_srq, given up here.
        drop(unsafe { Box::from_raw(srq.cast::<Srq>()) });
        0
    })
}

/// `ops.post_srq_recv`.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: verbs' contract: a live SRQ of ours.
    let Some(s) = (unsafe { Srq::from_ptr(srq) }) else {
        return libc::EINVAL;
    };
    let Some(ctx) = s.ctx() else {
        return libc::EINVAL;
    };
    if ctx.is_dead() {
        return libc::EIO;
    }
    let _held = crate::post::Held::take(&s.busy);
    // SAFETY: the busy flag is ours: no other thread touches the ring.
    let ring = unsafe { &mut *s.ring.get() };
    // SAFETY: the caller's chain.
    let r = unsafe {
        crate::post::post_recv_chain(ring, ctx.device.segment(), s.max_sge as usize, wr, bad_wr)
    };
    ctx.device.wake_if_armed(ring);
    r
}
