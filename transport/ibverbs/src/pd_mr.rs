//! Protection domains and memory regions. `ibv_reg_mr` registers the
//! application's own buffer at its own address: its pages move into
//! memfds the daemon maps ([`crate::remap`]), and the region's `addr`,
//! `lkey` and `rkey` are what verbs applications expect.

use std::ffi::{c_int, c_uint, c_void};
use std::os::fd::AsFd;

use shm::proto::{MapPiece, MrAccess, Reply, Request};

use crate::context::Ctx;
use crate::remap;
use crate::sys::*;
use crate::util::{errno_of, guard, set_errno, warn};

/// A protection domain: the C struct first.
#[repr(C)]
pub struct Pd {
    pub ibv: ibv_pd,
}

impl Pd {
    /// # Safety
    /// `p` is NULL or a live PD of ours.
    pub unsafe fn from_ptr<'a>(p: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: by the contract, the `ibv` field (offset 0) of a Pd.
        unsafe { p.cast::<Pd>().as_ref() }
    }

    /// The PD's context.
    pub fn ctx(&self) -> Option<&Ctx> {
        // SAFETY: a PD's context outlives it (verbs' ownership rules).
        unsafe { Ctx::from_ptr(self.ibv.context) }
    }
}

/// A memory region: the C struct first.
#[repr(C)]
pub struct Mr {
    pub ibv: ibv_mr,
    /// The moved pages this region holds.
    keys: Vec<usize>,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match ctx.device.call(Request::AllocPd) {
            Ok((Reply::Pd { pd }, _)) => Box::into_raw(Box::new(Pd {
                ibv: ibv_pd {
                    context,
                    handle: pd,
                },
            }))
            .cast(),
            Ok(_) => {
                set_errno(libc::EIO);
                std::ptr::null_mut()
            }
            Err(e) => {
                set_errno(errno_of(&e));
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live PD of ours or NULL.
        let Some(p) = (unsafe { Pd::from_ptr(pd) }) else {
            return libc::EINVAL;
        };
        let Some(ctx) = p.ctx() else {
            return libc::EINVAL;
        };
        match ctx.device.call(Request::DeallocPd { pd: p.ibv.handle }) {
            Ok(_) => {
                // SAFETY: boxed by ibv_alloc_pd, given up here.
                drop(unsafe { Box::from_raw(pd.cast::<Pd>()) });
                0
            }
            Err(e) => errno_of(&e),
        }
    })
}

/// Access flags verbs defines that we act on or accept; optional flags
/// (IBV_ACCESS_OPTIONAL_RANGE, e.g. RELAXED_ORDERING) are accepted and
/// ignored, as verbs allows.
fn access_of(flags: u32) -> Result<MrAccess, (i32, &'static str)> {
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    // verbs.h's IBV_ACCESS_OPTIONAL_RANGE: ten bits from OPTIONAL_FIRST.
    let optional = ((IBV_ACCESS_OPTIONAL_FIRST << 10) - 1) & !(IBV_ACCESS_OPTIONAL_FIRST - 1);
    let mandatory = flags & !optional;
    if mandatory & IBV_ACCESS_ON_DEMAND != 0 {
        return Err((libc::EOPNOTSUPP, "on-demand paging (IBV_ACCESS_ON_DEMAND)"));
    }
    if mandatory & IBV_ACCESS_ZERO_BASED != 0 {
        return Err((
            libc::EOPNOTSUPP,
            "zero-based regions (IBV_ACCESS_ZERO_BASED)",
        ));
    }
    if mandatory & IBV_ACCESS_MW_BIND != 0 {
        return Err((libc::EOPNOTSUPP, "memory windows (IBV_ACCESS_MW_BIND)"));
    }
    if mandatory & !(known | IBV_ACCESS_HUGETLB) != 0 {
        return Err((libc::EINVAL, "unknown access flags"));
    }
    let a = MrAccess {
        local_write: flags & IBV_ACCESS_LOCAL_WRITE != 0,
        remote_write: flags & IBV_ACCESS_REMOTE_WRITE != 0,
        remote_read: flags & IBV_ACCESS_REMOTE_READ != 0,
        remote_atomic: flags & IBV_ACCESS_REMOTE_ATOMIC != 0,
    };
    // IBA: remote write and remote atomic need local write.
    if (a.remote_write || a.remote_atomic) && !a.local_write {
        return Err((
            libc::EINVAL,
            "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
        ));
    }
    Ok(a)
}

fn reg(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, flags: u32) -> *mut ibv_mr {
    // SAFETY: a live PD of ours or NULL.
    let Some(p) = (unsafe { Pd::from_ptr(pd) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let Some(ctx) = p.ctx() else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let fail = |errno: i32, why: &str| {
        warn(&format!("ibv_reg_mr({addr:p}, {len}): {why}"));
        set_errno(errno);
        std::ptr::null_mut()
    };
    let access = match access_of(flags) {
        Ok(a) => a,
        Err((e, why)) => return fail(e, &format!("access {flags:#x}: {why}")),
    };
    let shared = match remap::share(addr as usize, len) {
        Ok(s) => s,
        Err((e, why)) => return fail(e, &why),
    };
    let fds: Vec<_> = shared.pieces.iter().map(|(fd, _, _)| fd.as_fd()).collect();
    let pieces = shared
        .pieces
        .iter()
        .enumerate()
        .map(|(i, (_, offset, len))| MapPiece {
            fd: i as u32,
            offset: *offset,
            len: *len,
        })
        .collect();
    let req = Request::RegUserMr {
        pd: p.ibv.handle,
        va: iova,
        len: len as u64,
        access,
        start: shared.start,
        pieces,
    };
    match ctx.device.call_with_fds(req, &fds) {
        Ok((Reply::Mr { lkey, rkey, .. }, _)) => Box::into_raw(Box::new(Mr {
            ibv: ibv_mr {
                context: p.ibv.context,
                pd,
                addr,
                length: len,
                handle: lkey,
                lkey,
                rkey,
            },
            keys: shared.keys,
        }))
        .cast(),
        Ok(_) => {
            remap::release(&shared.keys);
            fail(libc::EIO, "unexpected reply")
        }
        Err(e) => {
            remap::release(&shared.keys);
            fail(errno_of(&e), &e.to_string())
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg(pd, addr, length, addr as u64, access as u32)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || {
        reg(pd, addr, length, iova, access as u32)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    guard(std::ptr::null_mut(), || reg(pd, addr, length, iova, access))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live MR of ours (the `ibv` field at offset 0).
        let m = unsafe { &*mr.cast::<Mr>() };
        // SAFETY: an MR's context outlives it.
        let Some(ctx) = (unsafe { Ctx::from_ptr(m.ibv.context) }) else {
            return libc::EINVAL;
        };
        let r = ctx.device.call(Request::DeregMr { lkey: m.ibv.lkey });
        if let Err(e) = &r {
            // A daemon that is gone holds nothing; otherwise keep the MR.
            if !matches!(e, verbs::VerbsError::Io(_)) {
                return errno_of(e);
            }
        }
        // SAFETY: boxed by reg, given up here.
        let m = unsafe { Box::from_raw(mr.cast::<Mr>()) };
        remap::release(&m.keys);
        0
    })
}
