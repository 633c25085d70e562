//! Address handles: `ibv_create_ah` asks the daemon for one (it lives in
//! the NIC, a UD WQE names it by handle: no system call per post),
//! `ibv_destroy_ah`, and the two helpers that answer a datagram
//! (`ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`), which read the
//! sender from the GRH at the start of the receive buffer as RoCEv2 over
//! IPv4 lays it out (its last 20 bytes are the IPv4 header).

use std::ffi::c_int;
use std::net::Ipv4Addr;

use shm::proto::{Reply, Request};

use crate::context::Ctx;
use crate::pd_mr::Pd;
use crate::sys::*;
use crate::util::{errno_of, guard, set_errno, warn};

/// An address handle: the C struct first.
#[repr(C)]
pub struct Ah {
    pub ibv: ibv_ah,
    /// The daemon's handle (what a UD WQE carries).
    pub id: u32,
}

impl Ah {
    /// # Safety
    /// `p` is NULL or a live AH of ours.
    pub unsafe fn from_ptr<'a>(p: *mut ibv_ah) -> Option<&'a Ah> {
        // SAFETY: by the contract, the `ibv` field (offset 0) of an Ah.
        unsafe { p.cast::<Ah>().as_ref() }
    }
}

fn fail<T>(errno: i32, why: &str, v: T) -> T {
    if crate::util::debug() {
        warn(why);
    }
    set_errno(errno);
    v
}

/// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), the only
/// kind a RoCEv2-over-IPv4 port has besides its link-local one.
pub fn ipv4_of_gid(g: &[u8; 16]) -> Option<Ipv4Addr> {
    (g[..10] == [0; 10] && g[10..12] == [0xff, 0xff])
        .then(|| Ipv4Addr::new(g[12], g[13], g[14], g[15]))
}

/// The destination of `attr`, checked: port 1, a GRH (RoCE has no LIDs)
/// with an IPv4-mapped destination GID.
fn destination(attr: &ibv_ah_attr) -> Result<Ipv4Addr, (c_int, String)> {
    if attr.port_num != 1 {
        return Err((
            libc::EINVAL,
            format!("port {} (the device has port 1)", attr.port_num),
        ));
    }
    if attr.is_global == 0 {
        return Err((
            libc::EINVAL,
            "is_global is 0: RoCE needs a GRH with the destination's GID".into(),
        ));
    }
    // SAFETY: every bit pattern of the GID union is valid bytes.
    let g = unsafe { attr.grh.dgid.raw };
    ipv4_of_gid(&g).ok_or((
        libc::EINVAL,
        "the destination GID is not IPv4-mapped (::ffff:a.b.c.d)".into(),
    ))
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        let null = std::ptr::null_mut();
        // SAFETY: a live PD of ours or NULL; the caller's attributes.
        let (Some(p), Some(a)) = (unsafe { Pd::from_ptr(pd) }, unsafe { attr.as_ref() }) else {
            return fail(libc::EINVAL, "ibv_create_ah: NULL argument", null);
        };
        let Some(ctx) = p.ctx() else {
            return fail(libc::EINVAL, "ibv_create_ah: PD without context", null);
        };
        let dest_ip = match destination(a) {
            Ok(ip) => ip,
            Err((e, why)) => return fail(e, &format!("ibv_create_ah: {why}"), null),
        };
        let tc = a.grh.traffic_class;
        let req = Request::CreateAh {
            pd: p.ibv.handle,
            dest_ip,
            // 0, what a zeroed attribute holds, leaves the daemon's DSCP.
            traffic_class: (tc != 0).then_some(tc),
        };
        let id = match ctx.device.call(req) {
            Ok((Reply::Ah { ah }, _)) => ah,
            Ok(_) => return fail(libc::EIO, "ibv_create_ah: unexpected reply", null),
            Err(e) => return fail(errno_of(&e), &format!("ibv_create_ah: {e}"), null),
        };
        let ah = Box::new(Ah {
            ibv: ibv_ah {
                context: p.ibv.context,
                pd,
                handle: id,
            },
            id,
        });
        Box::into_raw(ah).cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live AH of ours or NULL.
        let Some(a) = (unsafe { Ah::from_ptr(ah) }) else {
            return libc::EINVAL;
        };
        // SAFETY: an AH's context outlives it.
        let Some(ctx) = (unsafe { Ctx::from_ptr(a.ibv.context) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = ctx.device.call(Request::DestroyAh { ah: a.id }) {
            if !matches!(e, verbs::VerbsError::Io(_)) {
                return errno_of(&e);
            }
        }
        // SAFETY: boxed by ibv_create_ah, given up here.
        drop(unsafe { Box::from_raw(ah.cast::<Ah>()) });
        0
    })
}

/// The attributes of an AH back to the sender of a UD receive `wc`, whose
/// buffer started with `grh` (its last 20 bytes the IPv4 header).
fn reply_attr(ctx: &Ctx, port_num: u8, wc: &ibv_wc, grh: &[u8; 40]) -> Result<ibv_ah_attr, String> {
    if port_num != 1 {
        return Err(format!("port {port_num} (the device has port 1)"));
    }
    if wc.wc_flags & IBV_WC_GRH == 0 {
        return Err("the completion has no GRH (not a UD receive)".into());
    }
    let ip = &grh[20..];
    if ip[0] >> 4 != 4 {
        return Err(format!(
            "the GRH holds no IPv4 header (version {})",
            ip[0] >> 4
        ));
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    if dst != ctx.dev.info.ip && !dst.is_multicast() {
        return Err(format!(
            "the datagram went to {dst}, not this device's {}",
            ctx.dev.info.ip
        ));
    }
    let mut dgid = [0u8; 16];
    dgid[10] = 0xff;
    dgid[11] = 0xff;
    dgid[12..].copy_from_slice(&src.octets());
    Ok(ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: dgid },
            flow_label: 0,
            // The IPv4-mapped GID's index (see `query::gid`).
            sgid_index: 1,
            hop_limit: 0xff,
            traffic_class: ip[1],
        },
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        static_rate: 0,
        is_global: 1,
        port_num,
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live context of ours or NULL; the caller's structs.
        let (Some(ctx), Some(w)) = (unsafe { Ctx::from_ptr(context) }, unsafe { wc.as_ref() })
        else {
            return fail(libc::EINVAL, "ibv_init_ah_from_wc: NULL argument", -1);
        };
        if grh.is_null() || ah_attr.is_null() {
            return fail(libc::EINVAL, "ibv_init_ah_from_wc: NULL argument", -1);
        }
        // SAFETY: a GRH is 40 bytes (the layout test holds bindgen's to it).
        let g = unsafe { &*grh.cast::<[u8; 40]>() };
        match reply_attr(ctx, port_num, w, g) {
            Ok(a) => {
                // SAFETY: the caller's non-NULL out struct.
                unsafe { ah_attr.write(a) };
                0
            }
            Err(why) => fail(libc::EINVAL, &format!("ibv_init_ah_from_wc: {why}"), -1),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a live PD of ours or NULL.
        let Some(p) = (unsafe { Pd::from_ptr(pd) }) else {
            return fail(
                libc::EINVAL,
                "ibv_create_ah_from_wc: NULL PD",
                std::ptr::null_mut(),
            );
        };
        let mut attr = ibv_ah_attr::default();
        // SAFETY: the caller's structs, passed on.
        let r = unsafe { ibv_init_ah_from_wc(p.ibv.context, port_num, wc, grh, &mut attr) };
        if r != 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: our PD and the attributes just built.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}
