//! What verbs applications ask of a device and its one port: the device
//! limits (`ibv_query_device`, `_ex`), the port (`ibv_query_port`, both
//! the exported compat call and `verbs_context.query_port`), the GID table
//! and P_Keys.
//!
//! The port is RoCE v2 on Ethernet; its GID table is rxe's: index 0 the
//! link-local IPv6 GID from the MAC, index 1 the IPv4-mapped GID of the
//! device's address. Both are RoCE v2 GIDs (the NIC sends nothing else).

use std::ffi::c_int;

use crate::context::Ctx;
use crate::device::eui64;
use crate::sys::*;
use crate::util::{copy_cstr, guard, set_errno};

/// Neither Mellanox (0x02c9) nor Amazon EFA (0x1d0f): perftest then uses
/// the plain verbs calls. rxe reports the same "no vendor" id.
pub const VENDOR_ID: u32 = 0xff_ffff;
/// Our part number ("RN").
pub const VENDOR_PART_ID: u32 = 0x524e;

/// Entries of the GID table.
pub const GID_TABLE_LEN: u32 = 2;

/// The GID at `index`, if the table has one there.
pub fn gid(ctx: &Ctx, index: u32) -> Option<[u8; 16]> {
    let mut g = [0u8; 16];
    match index {
        0 => {
            g[0] = 0xfe;
            g[1] = 0x80;
            g[8..].copy_from_slice(&eui64(ctx.dev.info.mac));
        }
        1 => {
            g[10] = 0xff;
            g[11] = 0xff;
            g[12..].copy_from_slice(&ctx.dev.info.ip.octets());
        }
        _ => return None,
    }
    Some(g)
}

/// The verbs MTU enum of a byte count (256 .. 4096; larger is 4096).
pub fn mtu_enum(bytes: u32) -> ibv_mtu {
    match bytes {
        0..=511 => IBV_MTU_256,
        512..=1023 => IBV_MTU_512,
        1024..=2047 => IBV_MTU_1024,
        2048..=4095 => IBV_MTU_2048,
        _ => IBV_MTU_4096,
    }
}

fn device_attr(ctx: &Ctx) -> ibv_device_attr {
    let info = &ctx.dev.info;
    let c = &info.caps;
    let guid = u64::from_ne_bytes(ctx.dev.guid_bytes());
    let sat = |v: u32| v.min(c_int::MAX as u32) as c_int;
    let mut a = ibv_device_attr {
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: c.max_mr_size,
        page_size_cap: 4096 | (2 << 20),
        vendor_id: VENDOR_ID,
        vendor_part_id: VENDOR_PART_ID,
        hw_ver: 1,
        max_qp: sat(c.max_qp),
        max_qp_wr: sat(c.max_qp_wr),
        device_cap_flags: IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID,
        max_sge: sat(c.max_send_sge),
        max_sge_rd: sat(c.max_send_sge),
        max_cq: sat(c.max_qp),
        max_cqe: sat(c.max_cqe),
        max_mr: sat(c.max_mr),
        max_pd: sat(c.max_qp),
        max_qp_rd_atom: sat(c.max_qp_rd_atom),
        max_res_rd_atom: sat(c.max_qp_rd_atom.saturating_mul(c.max_qp)),
        max_qp_init_rd_atom: sat(c.max_qp_rd_atom),
        atomic_cap: if c.atomic_hca {
            IBV_ATOMIC_HCA
        } else {
            IBV_ATOMIC_NONE
        },
        max_srq: sat(c.max_srq),
        max_srq_wr: sat(c.max_srq_wr),
        max_srq_sge: sat(c.max_recv_sge),
        max_pkeys: 1,
        max_ah: transport::rc::MAX_AHS as c_int,
        max_mcast_grp: transport::rc::MAX_MCAST_GROUPS as c_int,
        max_mcast_qp_attach: transport::rc::MAX_MCAST_QP_ATTACH as c_int,
        max_total_mcast_qp_attach: (transport::rc::MAX_MCAST_GROUPS
            * transport::rc::MAX_MCAST_QP_ATTACH) as c_int,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
        ..Default::default()
    };
    copy_cstr(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    context: *mut ibv_context,
    device_attr_out: *mut ibv_device_attr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        if device_attr_out.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's struct, checked non-NULL.
        unsafe { device_attr_out.write(device_attr(ctx)) };
        0
    })
}

/// `verbs_context.query_device_ex`: the plain attributes and zero for
/// every extended capability (no ODP, TSO, RSS, tag matching, DM...).
pub unsafe extern "C" fn query_device_ex(
    context: *mut ibv_context,
    _input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        let base = std::mem::size_of::<ibv_device_attr>();
        if attr.is_null() || attr_size < base {
            return libc::EINVAL;
        }
        let full = ibv_device_attr_ex {
            orig_attr: device_attr(ctx),
            phys_port_cnt_ex: 1,
            ..Default::default()
        };
        let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's struct holds attr_size bytes; we write the
        // first min(attr_size, ours) of a struct of the same layout, and
        // zero the rest of the caller's (fields newer than our header).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&full as *const ibv_device_attr_ex).cast::<u8>(),
                attr.cast::<u8>(),
                n,
            );
            std::ptr::write_bytes(attr.cast::<u8>().add(n), 0, attr_size - n);
        }
        0
    })
}

/// Width and speed codes (IBTA) that multiply to about `gbps`.
fn width_speed(gbps: u32) -> (u8, u8) {
    // (width code, speed code): 4X = 2, 1X = 1; speed 128 NDR 100, 64 HDR
    // 50, 32 EDR 25, 16 FDR 14, 4 QDR 10.
    match gbps {
        400.. => (2, 128),
        200..=399 => (2, 64),
        100..=199 => (2, 32),
        56..=99 => (2, 16),
        40..=55 => (2, 4),
        25..=39 => (1, 32),
        _ => (1, 4),
    }
}

fn port_attr(ctx: &Ctx) -> ibv_port_attr {
    let info = &ctx.dev.info;
    let up = ctx.device.query_port().map(|p| p.link_up).unwrap_or(false);
    let mtu = mtu_enum(info.max_mtu);
    let (active_width, active_speed) = width_speed(info.line_gbps);
    ibv_port_attr {
        state: if up { IBV_PORT_ACTIVE } else { IBV_PORT_DOWN },
        max_mtu: mtu,
        active_mtu: mtu,
        gid_tbl_len: GID_TABLE_LEN as c_int,
        max_msg_sz: transport::rc::MAX_DMA_LEN as u32,
        pkey_tbl_len: 1,
        active_width,
        active_speed,
        // IBTA phys state: 5 LinkUp, 3 Disabled.
        phys_state: if up { 5 } else { 3 },
        // One virtual lane (IBTA code 1).
        max_vl_num: 1,
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

fn fill_port(context: *mut ibv_context, port: u8, out: *mut u8, len: usize) -> c_int {
    // SAFETY: a live context of ours or NULL.
    let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
        return libc::EINVAL;
    };
    if port != 1 || out.is_null() {
        return libc::EINVAL;
    }
    if ctx.check_daemon() {
        // The device died with its daemon.
        return libc::EIO;
    }
    let a = port_attr(ctx);
    let n = len.min(std::mem::size_of::<ibv_port_attr>());
    // SAFETY: the caller's struct holds `len` bytes (the compat struct or
    // a full one); the layouts share their prefix.
    unsafe {
        std::ptr::copy_nonoverlapping((&a as *const ibv_port_attr).cast::<u8>(), out, n);
        std::ptr::write_bytes(out.add(n), 0, len - n);
    }
    0
}

/// `verbs_context.query_port` (what verbs.h's `ibv_query_port` macro
/// calls).
pub unsafe extern "C" fn query_port_ex(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    guard(libc::EIO, || {
        fill_port(context, port_num, port_attr_out.cast(), port_attr_len)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr_out: *mut _compat_ibv_port_attr,
) -> c_int {
    guard(libc::EIO, || {
        fill_port(
            context,
            port_num,
            port_attr_out.cast(),
            std::mem::size_of::<_compat_ibv_port_attr>(),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid_out: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live context of ours or NULL.
        let ctx = unsafe { Ctx::from_ptr(context) };
        let g = ctx
            .filter(|_| port_num == 1 && !gid_out.is_null())
            .and_then(|c| u32::try_from(index).ok().and_then(|i| gid(c, i)));
        match g {
            Some(g) => {
                // SAFETY: non-NULL caller struct of 16 bytes.
                unsafe { (*gid_out).raw = g };
                0
            }
            None => {
                set_errno(libc::EINVAL);
                -1
            }
        }
    })
}

fn gid_entry(ctx: &Ctx, port: u32, index: u32) -> Option<ibv_gid_entry> {
    if port != 1 {
        return None;
    }
    let g = gid(ctx, index)?;
    Some(ibv_gid_entry {
        gid: ibv_gid { raw: g },
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    context: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        if entry.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        match gid_entry(ctx, port_num, gid_index) {
            Some(e) => {
                // SAFETY: the caller's entry, at least our size.
                unsafe { entry.write(e) };
                0
            }
            None => libc::ENODATA,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    context: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EIO as isize), || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            return -(libc::EINVAL as isize);
        };
        if entries.is_null() || flags != 0 || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        if max_entries < GID_TABLE_LEN as usize {
            return -(libc::EINVAL as isize);
        }
        for i in 0..GID_TABLE_LEN {
            let e = gid_entry(ctx, 1, i).expect("inside the table");
            // SAFETY: max_entries >= the table, each entry_size bytes.
            unsafe {
                entries
                    .cast::<u8>()
                    .add(i as usize * entry_size)
                    .cast::<ibv_gid_entry>()
                    .write_unaligned(e)
            };
        }
        GID_TABLE_LEN as isize
    })
}

/// `enum ibv_gid_type_sysfs` of rdma-core's driver.h: 0 IB/RoCE v1,
/// 1 RoCE v2.
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    context: *mut ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        if gid_type.is_null() || gid_entry(ctx, u32::from(port_num), index).is_none() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL caller enum.
        unsafe { *gid_type = GID_TYPE_SYSFS_ROCE_V2 };
        0
    })
}

/// The one P_Key: the default full-membership key.
const DEFAULT_PKEY: u16 = 0xffff;

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live context of ours or NULL.
        if unsafe { Ctx::from_ptr(context) }.is_none()
            || port_num != 1
            || index != 0
            || pkey.is_null()
        {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: non-NULL caller value; P_Keys are big-endian (__be16).
        unsafe { *pkey = DEFAULT_PKEY.to_be() };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(
    context: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    guard(-libc::EIO, || {
        // SAFETY: a live context of ours or NULL.
        if unsafe { Ctx::from_ptr(context) }.is_none() || port_num != 1 {
            return -libc::EINVAL;
        }
        if u16::from_be(pkey) == DEFAULT_PKEY {
            0
        } else {
            -libc::ENOENT
        }
    })
}
