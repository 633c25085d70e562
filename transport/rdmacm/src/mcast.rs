//! Multicast joins: `rdma_join_multicast`, `rdma_join_multicast_ex`,
//! `rdma_leave_multicast`, as rdma-core and Linux's kernel (6.1,
//! `cma_iboe_join_multicast`) do them on RoCEv2 with IPv4 groups.
//!
//! On RoCE no MAD is exchanged for a join: the kernel maps the group to a
//! GID and answers at once. So the whole join lives in the library; the
//! daemon only keeps the QPs' groups (`ibv_attach_mcast` of the drop-in
//! libibverbs). A join:
//!
//! - needs an id on a device, bound or with its address resolved (not
//!   listening, routed or connected), else EINVAL (ucma's and
//!   rdma_join_multicast's checks); an IPv4 multicast group (the
//!   wildcard: EINVAL; any IPv6 group: EOPNOTSUPP, the kernel's ENOTSUPP
//!   for RoCEv2; a unicast address, which Linux accepts, EINVAL: our
//!   NIC's groups are IPv4 multicast addresses);
//! - queues the answer on the id's channel (a synchronous id waits for
//!   it): MULTICAST_JOIN with `param.ud` = the group's address handle (a
//!   global route to the IPv4-mapped group GID `::ffff:a.b.c.d` from our
//!   RoCEv2 GID, hop limit 64 as the kernel's for an IPv4 group on
//!   RoCEv2, the id's TOS as traffic class, port 1), QPN 0xFFFFFF, the
//!   Q_Key of the port space (RDMA_UDP_QKEY for UDP, 0 for TCP and IB as
//!   the kernel's zeroed record), and `private_data` = the join's
//!   context with length 0 (rdma-core's `ucma_process_join`). An IPoIB id
//!   has no broadcast group on RoCE to take its Q_Key from: its answer is
//!   MULTICAST_ERROR, status -ENODEV, as the kernel's.
//! - Taking the answer attaches the id's QP to the group (not for a
//!   send-only join), as rdma-core does when it reads the event; a
//!   failed attach turns it into MULTICAST_ERROR with status -errno
//!   (rdma-core gives -1; a synchronous id then fails with the errno).
//!
//! Joining the same group again is allowed (as Linux does; each join has
//! its answer). `rdma_leave_multicast` forgets the latest join of that
//! address (EADDRNOTAVAIL: none), drops its answer if not yet taken, and
//! detaches the QP when no other join of the id keeps the group attached
//! (rdma-core detaches at each leave). Destroying the id leaves its
//! groups; destroying the QP takes it out of them at the daemon.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use shm::cma::CmEventType;

use crate::channel::Queued;
use crate::id::{self, Id, State};
use crate::sys::*;
use crate::util::{self, fail, mapped_gid, read_sockaddr, Addr4, SockAddr};

/// The QPN a multicast datagram is sent to.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// The hop limit of a RoCEv2 multicast address handle to an IPv4 group
/// (the kernel's `IPV6_DEFAULT_HOPLIMIT`).
pub const HOP_LIMIT: u8 = 64;

/// One join of an id.
pub struct Join {
    /// The group's address as the application gave it (leaving compares
    /// it, as rdma-core compares the socket addresses).
    pub addr: Addr4,
    /// Names the join in its queued answer.
    pub handle: u32,
    /// The application's context, given back as the event's private data.
    pub context: *mut c_void,
    pub send_only: bool,
    pub mgid: [u8; 16],
    /// The answer: MULTICAST_JOIN's parameters, or MULTICAST_ERROR's
    /// errno.
    pub answer: Result<rdma_ud_param, i32>,
    /// Its answer attached the id's QP to the group.
    pub attached: bool,
}

static NEXT_HANDLE: AtomicU32 = AtomicU32::new(1);

/// The Q_Key a join of a port space gives (None: the port space has no
/// group Q_Key on RoCE, the join fails with ENODEV).
pub fn qkey_of(ps: rdma_port_space) -> Option<u32> {
    match ps {
        RDMA_PS_UDP => Some(RDMA_UDP_QKEY),
        RDMA_PS_IPOIB => None,
        _ => Some(0),
    }
}

/// The parameters of a MULTICAST_JOIN to `group` (without the context).
pub fn join_param(group: std::net::Ipv4Addr, qkey: u32, tos: u8) -> rdma_ud_param {
    rdma_ud_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        ah_attr: ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid {
                    raw: mapped_gid(group),
                },
                flow_label: 0,
                sgid_index: crate::attrs::SGID_INDEX,
                hop_limit: HOP_LIMIT,
                traffic_class: tos,
            },
            is_global: 1,
            port_num: 1,
            ..Default::default()
        },
        qp_num: MULTICAST_QPN,
        qkey,
    }
}

/// The group of a join's address, or why it cannot be joined.
fn group_of(a: SockAddr) -> Result<Addr4, i32> {
    match a {
        SockAddr::V4(a) if a.ip.is_unspecified() => fail(libc::EINVAL, || {
            "rdma_join_multicast: the wildcard is no group".into()
        }),
        SockAddr::V4(Addr4 { v6: true, .. }) | SockAddr::OtherV6 => fail(libc::EOPNOTSUPP, || {
            "rdma_join_multicast: IPv6 groups are not supported on RoCEv2".into()
        }),
        SockAddr::V4(a) if !a.ip.is_multicast() => fail(libc::EINVAL, || {
            format!("rdma_join_multicast: {} is no IPv4 multicast group", a.ip)
        }),
        SockAddr::V4(a) => Ok(a),
    }
}

/// Records a join and queues its answer.
fn join(id: &Id, addr: *mut sockaddr, send_only: bool, context: *mut c_void) -> Result<(), i32> {
    // SAFETY: the application's socket address or NULL.
    let a = unsafe { read_sockaddr(addr.cast()) }.ok_or(libc::EINVAL)?;
    {
        let mut st = id.lock();
        if st.dev.is_none() {
            return fail(libc::EINVAL, || {
                "rdma_join_multicast: no device: bind or resolve the id first".into()
            });
        }
        if st.listening || st.child || st.path_rec.is_some() || st.peer.is_some() {
            return fail(libc::EINVAL, || {
                "rdma_join_multicast: the id is listening, routed or connected".into()
            });
        }
        let group = group_of(a)?;
        let answer = match qkey_of(id.ps()) {
            Some(qkey) => Ok(join_param(group.ip, qkey, st.tos.unwrap_or(0))),
            None => Err(libc::ENODEV),
        };
        let handle = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed);
        st.mcast.insert(
            0,
            Join {
                addr: group,
                handle,
                context,
                send_only,
                mgid: mapped_gid(group.ip),
                answer,
                attached: false,
            },
        );
        st.channel.push(Queued::Join {
            key: id.key,
            handle,
        });
    }
    crate::event::complete(id)
}

/// What the application gets for the answer to join `handle` (None: the
/// group was left meanwhile): the event, its status and its parameters.
/// A MULTICAST_JOIN attaches the id's QP first, as rdma-core's
/// `ucma_process_join` does.
pub fn answer(id: &Id, handle: u32) -> Option<(CmEventType, i32, rdma_ud_param)> {
    let mut st = id.lock();
    let j = st.mcast.iter_mut().find(|j| j.handle == handle)?;
    let mut ud = match j.answer {
        Ok(ud) => ud,
        Err(e) => {
            let ud = rdma_ud_param {
                private_data: j.context,
                ..Default::default()
            };
            return Some((CmEventType::MulticastError, -e, ud));
        }
    };
    ud.private_data = j.context;
    let qp = id.qp();
    if !qp.is_null() && !j.send_only {
        let gid = ibv_gid { raw: j.mgid };
        // SAFETY: the id's live QP and a GID on our stack.
        let r = unsafe { ibv_attach_mcast(qp, &gid, 0) };
        if r != 0 {
            let e = if r > 0 { r } else { util::errno_or(libc::EIO) };
            if util::debug() {
                util::warn(&format!("attaching the QP to a group: errno {e}"));
            }
            return Some((CmEventType::MulticastError, -e, ud));
        }
        j.attached = true;
    }
    Some((CmEventType::MulticastJoin, 0, ud))
}

/// Detaches the id's QP from `mgid` (errors ignored, as rdma-core's).
fn detach(id: &Id, mgid: [u8; 16]) {
    let qp = id.qp();
    if qp.is_null() {
        return;
    }
    let gid = ibv_gid { raw: mgid };
    // SAFETY: the id's live QP and a GID on our stack.
    let r = unsafe { ibv_detach_mcast(qp, &gid, 0) };
    if r != 0 && util::debug() {
        util::warn(&format!("detaching the QP from a group: {r}"));
    }
}

/// Forgets the latest join of `addr`.
fn leave(id: &Id, addr: *mut sockaddr) -> Result<(), i32> {
    // SAFETY: the application's socket address or NULL.
    let a = match unsafe { read_sockaddr(addr.cast()) } {
        None => return Err(libc::EINVAL),
        Some(SockAddr::OtherV6) => return Err(libc::EADDRNOTAVAIL),
        Some(SockAddr::V4(a)) => a,
    };
    let mut st = id.lock();
    let Some(at) = st.mcast.iter().position(|j| j.addr == a) else {
        return fail(libc::EADDRNOTAVAIL, || {
            format!("rdma_leave_multicast: {} was not joined", a.ip)
        });
    };
    let j = st.mcast.remove(at);
    st.channel.remove_join(id.key, j.handle);
    let kept = st.mcast.iter().any(|o| o.attached && o.mgid == j.mgid);
    if j.attached && !kept {
        detach(id, j.mgid);
    }
    Ok(())
}

/// The id is destroyed: its joins go, their groups detached.
pub fn leave_all(id: &Id, st: &mut State) {
    let mut done: Vec<[u8; 16]> = Vec::new();
    for j in std::mem::take(&mut st.mcast) {
        if j.attached && !done.contains(&j.mgid) {
            detach(id, j.mgid);
            done.push(j.mgid);
        }
    }
}

/// The QP of the id is destroyed: the daemon took it out of its groups.
pub fn qp_destroyed(st: &mut State) {
    for j in &mut st.mcast {
        j.attached = false;
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    util::entry(|| join(id::arg(id)?, addr, false, context))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    util::entry(|| {
        let id = id::arg(id)?;
        // SAFETY: the caller's attributes or NULL.
        let Some(attr) = (unsafe { mc_join_attr.as_ref() }) else {
            return Err(libc::EINVAL);
        };
        // rdma-core's checks, then the kernel's of the flags.
        if attr.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
            return Err(libc::EOPNOTSUPP);
        }
        if attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
            || attr.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
        {
            return Err(libc::EINVAL);
        }
        let send_only = match attr.join_flags {
            RDMA_MC_JOIN_FLAG_FULLMEMBER => false,
            RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER => true,
            _ => return Err(libc::EINVAL),
        };
        join(id, attr.addr, send_only, context)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    util::entry(|| leave(id::arg(id)?, addr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn v4(ip: Ipv4Addr, v6: bool) -> SockAddr {
        SockAddr::V4(Addr4 { ip, port: 0, v6 })
    }

    #[test]
    fn only_ipv4_multicast_groups_are_joined() {
        let g = Ipv4Addr::new(239, 1, 2, 3);
        assert_eq!(group_of(v4(g, false)).map(|a| a.ip), Ok(g));
        assert_eq!(
            group_of(v4(Ipv4Addr::UNSPECIFIED, false)),
            Err(libc::EINVAL)
        );
        assert_eq!(group_of(v4(Ipv4Addr::UNSPECIFIED, true)), Err(libc::EINVAL));
        assert_eq!(
            group_of(v4(Ipv4Addr::new(10, 0, 0, 2), false)),
            Err(libc::EINVAL)
        );
        assert_eq!(group_of(v4(g, true)), Err(libc::EOPNOTSUPP));
        assert_eq!(group_of(SockAddr::OtherV6), Err(libc::EOPNOTSUPP));
    }

    #[test]
    fn a_join_s_address_handle_is_the_group_s_ipv4_mapped_gid() {
        let p = join_param(Ipv4Addr::new(239, 1, 2, 3), RDMA_UDP_QKEY, 32);
        assert_eq!((p.qp_num, p.qkey), (0xFF_FFFF, 0x0123_4567));
        assert!(p.private_data.is_null());
        assert_eq!(p.private_data_len, 0);
        let a = p.ah_attr;
        assert_eq!((a.is_global, a.port_num, a.dlid, a.sl), (1, 1, 0, 0));
        assert_eq!((a.grh.sgid_index, a.grh.hop_limit), (1, 64));
        assert_eq!(a.grh.traffic_class, 32);
        // SAFETY: GID bytes.
        let g = unsafe { a.grh.dgid.raw };
        assert_eq!(g, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3]);
    }

    #[test]
    fn port_spaces_give_the_kernel_s_group_qkeys() {
        assert_eq!(qkey_of(RDMA_PS_UDP), Some(RDMA_UDP_QKEY));
        assert_eq!(qkey_of(RDMA_PS_TCP), Some(0));
        assert_eq!(qkey_of(RDMA_PS_IB), Some(0));
        assert_eq!(qkey_of(RDMA_PS_IPOIB), None);
    }
}
