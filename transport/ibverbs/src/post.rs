//! The data path: `ops.post_send` and `ops.post_recv` turn verbs work
//! requests into WQEs in the QP's rings in shared memory and publish them
//! with one index store (the daemon polls the rings). No system call, no
//! allocation; a per-ring flag keeps two threads posting to one QP from
//! interleaving their WQEs (as providers' per-QP spinlocks do).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use shm::abi::{self, wqe_op, Producer, Wqe};
use transport::rc::Sge;

use crate::qp::Qp;
use crate::sys::*;

/// Holds a ring's busy flag for the life of a post.
pub struct Held<'a>(&'a AtomicBool);

impl<'a> Held<'a> {
    pub fn take(f: &'a AtomicBool) -> Held<'a> {
        while f.swap(true, Ordering::Acquire) {
            std::hint::spin_loop();
        }
        Held(f)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

fn opcode(op: ibv_wr_opcode) -> Option<u8> {
    Some(match op {
        IBV_WR_RDMA_WRITE => wqe_op::RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM => wqe_op::RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND => wqe_op::SEND,
        IBV_WR_SEND_WITH_IMM => wqe_op::SEND_WITH_IMM,
        IBV_WR_RDMA_READ => wqe_op::RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => wqe_op::ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => wqe_op::ATOMIC_FETCH_AND_ADD,
        _ => return None,
    })
}

/// Fills `w` from one send WR; the errno when it cannot be posted.
///
/// # Safety
/// `wr` and its scatter list are the caller's valid structs; with
/// IBV_SEND_INLINE the listed buffers are readable.
unsafe fn build(q: &Qp, wr: &ibv_send_wr, w: &mut Wqe, mtu: u32) -> Result<(), c_int> {
    let op = opcode(wr.opcode).ok_or(libc::EINVAL)?;
    let ud = q.ibv.qp_type == IBV_QPT_UD;
    let allowed = match q.ibv.qp_type {
        IBV_QPT_UD => matches!(op, wqe_op::SEND | wqe_op::SEND_WITH_IMM),
        IBV_QPT_UC => op <= wqe_op::SEND_WITH_IMM && op != wqe_op::RDMA_READ,
        _ => true,
    };
    if !allowed {
        return Err(libc::EINVAL);
    }
    let n = usize::try_from(wr.num_sge).map_err(|_| libc::EINVAL)?;
    let sges: &[ibv_sge] = if n == 0 {
        &[]
    } else if wr.sg_list.is_null() {
        return Err(libc::EINVAL);
    } else {
        // SAFETY: the caller's list of num_sge entries.
        unsafe { std::slice::from_raw_parts(wr.sg_list, n) }
    };
    w.wr_id = wr.wr_id;
    w.opcode = op;
    w.flags = 0;
    if q.sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0 {
        w.flags |= abi::WQE_SIGNALED;
    }
    if wr.send_flags & IBV_SEND_FENCE != 0 {
        w.flags |= abi::WQE_FENCE;
    }
    if wr.send_flags & IBV_SEND_SOLICITED != 0 {
        w.flags |= abi::WQE_SOLICITED;
    }
    // SAFETY: reading the union members the opcode selects.
    unsafe {
        match op {
            wqe_op::RDMA_WRITE | wqe_op::RDMA_WRITE_WITH_IMM | wqe_op::RDMA_READ => {
                w.remote_va = wr.wr.rdma.remote_addr;
                w.rkey = wr.wr.rdma.rkey;
            }
            wqe_op::ATOMIC_CMP_AND_SWP | wqe_op::ATOMIC_FETCH_AND_ADD => {
                w.remote_va = wr.wr.atomic.remote_addr;
                w.rkey = wr.wr.atomic.rkey;
                w.compare = wr.wr.atomic.compare_add;
                w.swap_add = if op == wqe_op::ATOMIC_CMP_AND_SWP {
                    wr.wr.atomic.swap
                } else {
                    wr.wr.atomic.compare_add
                };
            }
            _ => {}
        }
        if op == wqe_op::RDMA_WRITE_WITH_IMM || op == wqe_op::SEND_WITH_IMM {
            w.imm = u32::from_be(wr.__bindgen_anon_1.imm_data);
        }
        if ud {
            // SAFETY: an AH of ours (verbs' contract) or NULL.
            let ah = crate::ah::Ah::from_ptr(wr.wr.ud.ah).ok_or(libc::EINVAL)?;
            w.flags |= abi::WQE_UD;
            w.compare = u64::from(ah.id);
            w.swap_add =
                u64::from(wr.wr.ud.remote_qkey) << 32 | u64::from(wr.wr.ud.remote_qpn & 0xff_ffff);
        }
    }
    if ud && sges.iter().map(|s| u64::from(s.length)).sum::<u64>() > u64::from(mtu) {
        // A datagram is one packet: at most the path MTU.
        return Err(libc::EINVAL);
    }
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    if inline && (op == wqe_op::RDMA_READ || op >= wqe_op::ATOMIC_CMP_AND_SWP) {
        return Err(libc::EINVAL);
    }
    if inline {
        let total: usize = sges.iter().map(|s| s.length as usize).sum();
        if total > q.cap.max_inline_data as usize {
            return Err(libc::EINVAL);
        }
        let room = bytemuck::bytes_of_mut(&mut w.sges);
        let mut at = 0;
        for s in sges {
            let len = s.length as usize;
            if len > 0 {
                // SAFETY: with IBV_SEND_INLINE the application's buffer is
                // read at post time (it need not be registered); `total`
                // fits the WQE's inline room.
                let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, len) };
                room[at..at + len].copy_from_slice(src);
            }
            at += len;
        }
        w.flags |= abi::WQE_INLINE;
        w.inline_len = total as u32;
        w.num_sge = 0;
    } else {
        if n > abi::WQE_MAX_SGE || n > q.cap.max_send_sge as usize {
            return Err(libc::EINVAL);
        }
        for (d, s) in w.sges.iter_mut().zip(sges) {
            *d = Sge {
                va: s.addr,
                lkey: s.lkey,
                len: s.length,
            };
        }
        w.num_sge = n as u8;
        w.inline_len = 0;
    }
    Ok(())
}

/// Writes a chain of WRs into a ring behind one doorbell: `fill` turns
/// one WR into the WQE and names the next; the first WR that cannot be
/// posted (ring full: ENOMEM, or `fill`'s errno) stops the chain and is
/// returned in `bad_wr`, as verbs requires.
///
/// # Safety
/// `first` is the caller's valid chain and `bad_wr` NULL or writable.
unsafe fn post_chain<T: shm::abi::RingEntry, W>(
    ring: &mut Producer<T>,
    seg: &shm::segment::Segment,
    item: &mut T,
    first: *mut W,
    bad_wr: *mut *mut W,
    mut fill: impl FnMut(&W, &mut T) -> Result<*mut W, c_int>,
    used: impl Fn(&T) -> usize,
) -> c_int {
    let mut cur = first;
    let mut posted = 0u32;
    let mut err = 0;
    while !cur.is_null() {
        match ring.free(seg, posted + 1) {
            Ok(f) if f > posted => {}
            _ => {
                err = libc::ENOMEM;
                break;
            }
        }
        // SAFETY: the caller's WR chain.
        match fill(unsafe { &*cur }, item) {
            Ok(next) => {
                ring.write_prefix(seg, item, used(item));
                posted += 1;
                cur = next;
            }
            Err(e) => {
                err = e;
                break;
            }
        }
    }
    if err != 0 && !bad_wr.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *bad_wr = cur };
    }
    err
}

/// Refuses a whole chain: EINVAL, `bad_wr` its first WR.
fn refuse<W>(wr: *mut W, bad_wr: *mut *mut W) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *bad_wr = wr };
    }
    libc::EINVAL
}

/// `ops.post_send`.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: verbs' contract: a live QP of ours.
    let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: the live QP's state field, which ibv_modify_qp rewrites.
    let state = unsafe { std::ptr::read_volatile(&(*qp).state) };
    if matches!(state, IBV_QPS_RESET | IBV_QPS_INIT | IBV_QPS_RTR) {
        // Refused at once, as rxe does: the QP does not send yet.
        return refuse(wr, bad_wr);
    }
    let seg = ctx.device.segment();
    let _held = Held::take(&q.sq_busy);
    // SAFETY: the busy flag is ours: no other thread touches the ring.
    let ring: &mut Producer<Wqe> = unsafe { &mut *q.sq.get() };
    let mut w = Wqe::empty();
    let fill = |r: &ibv_send_wr, w: &mut Wqe| {
        if ctx.is_dead() {
            return Err(libc::EIO);
        }
        // SAFETY: as `build` requires, the caller's structs.
        unsafe { build(q, r, w, ctx.dev.info.max_mtu) }.map(|()| r.next)
    };
    // SAFETY: the caller's chain and out pointer.
    let r = unsafe { post_chain(ring, seg, &mut w, wr, bad_wr, fill, Wqe::used_len) };
    ctx.device.ring_bell(ring, q.ibv.qp_num);
    r
}

/// Writes a receive WR chain into a ring.
///
/// # Safety
/// `wr` is the caller's valid chain.
pub unsafe fn post_recv_chain(
    ring: &mut Producer<abi::RecvWqe>,
    seg: &shm::segment::Segment,
    max_sge: usize,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let mut w: abi::RecvWqe = bytemuck::Zeroable::zeroed();
    let fill = |r: &ibv_recv_wr, w: &mut abi::RecvWqe| {
        let n = usize::try_from(r.num_sge).unwrap_or(usize::MAX);
        if n > max_sge || n > abi::RECV_WQE_MAX_SGE || (n > 0 && r.sg_list.is_null()) {
            return Err(libc::EINVAL);
        }
        let sges: &[ibv_sge] = if n == 0 {
            &[]
        } else {
            // SAFETY: the caller's list of num_sge entries.
            unsafe { std::slice::from_raw_parts(r.sg_list, n) }
        };
        w.wr_id = r.wr_id;
        w.num_sge = n as u8;
        for (d, s) in w.sges.iter_mut().zip(sges) {
            *d = Sge {
                va: s.addr,
                lkey: s.lkey,
                len: s.length,
            };
        }
        Ok(r.next)
    };
    // SAFETY: the caller's chain and out pointer.
    unsafe { post_chain(ring, seg, &mut w, wr, bad_wr, fill, abi::RecvWqe::used_len) }
}

/// `ops.post_recv`.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: verbs' contract: a live QP of ours.
    let Some((q, ctx)) = (unsafe { Qp::with_ctx(qp) }) else {
        return libc::EINVAL;
    };
    if ctx.is_dead() {
        return libc::EIO;
    }
    // SAFETY: the live QP's state field, which ibv_modify_qp rewrites.
    if unsafe { std::ptr::read_volatile(&(*qp).state) } == IBV_QPS_RESET {
        return refuse(wr, bad_wr);
    }
    let Some(rq) = q.rq.as_ref() else {
        // Attached to an SRQ: post there.
        return refuse(wr, bad_wr);
    };
    let _held = Held::take(&q.rq_busy);
    // SAFETY: the busy flag is ours: no other thread touches the ring.
    let ring = unsafe { &mut *rq.get() };
    let seg = ctx.device.segment();
    // SAFETY: the caller's chain.
    let r = unsafe { post_recv_chain(ring, seg, q.cap.max_recv_sge as usize, wr, bad_wr) };
    ctx.device.ring_bell(ring, q.ibv.qp_num);
    r
}
