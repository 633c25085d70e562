//! Completion queues and completion channels. A CQ is a ring in the
//! shared segment that the daemon fills; `ops.poll_cq` reads it in the
//! application's process. `ops.req_notify_cq` arms the ring, and the
//! daemon then signals the CQ's eventfd on its next completion; a
//! completion channel is an epoll descriptor over the eventfds of its
//! CQs, so `channel->fd` becomes readable and `ibv_get_cq_event` returns
//! the CQ whose eventfd fired.

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use shm::abi::{self, Consumer, RingLayout};
use shm::proto::{Reply, Request};

use crate::async_event::Kind;
use crate::context::Ctx;
use crate::sys::*;
use crate::util::{errno_of, guard, set_errno};

/// A completion channel: the C struct first.
#[repr(C)]
pub struct Chan {
    pub ibv: ibv_comp_channel,
    /// The epoll descriptor `ibv.fd` names.
    epoll: OwnedFd,
    cqs: AtomicU32,
}

/// A completion queue: the C struct first.
#[repr(C)]
pub struct Cq {
    pub ibv: ibv_cq,
    /// The ring's consumer side; only the poller holding `busy` touches it.
    ring: UnsafeCell<Consumer<abi::Cqe>>,
    busy: AtomicBool,
    /// Consecutive empty polls, to look for a dead daemon now and then.
    empty: AtomicU32,
    event: Option<OwnedFd>,
    chan: *mut Chan,
}

// SAFETY: the ring is touched only by the thread that holds `busy`; the
// rest is immutable after creation or atomic.
unsafe impl Sync for Cq {}

/// Empty polls after which `poll_cq` checks whether the daemon is gone.
const EMPTY_CHECK: u32 = 1 << 16;

impl Cq {
    /// # Safety
    /// `p` is NULL or a live CQ of ours.
    pub unsafe fn from_ptr<'a>(p: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: by the contract, the `ibv` field (offset 0) of a Cq.
        unsafe { p.cast::<Cq>().as_ref() }
    }

    pub fn ctx(&self) -> Option<&Ctx> {
        // SAFETY: a CQ's context outlives it.
        unsafe { Ctx::from_ptr(self.ibv.context) }
    }

    /// The daemon's CQ number.
    pub fn id(&self) -> u32 {
        self.ibv.handle
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a live context of ours or NULL.
        if unsafe { Ctx::from_ptr(context) }.is_none() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: epoll_create1 has no memory preconditions.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return std::ptr::null_mut();
        }
        // SAFETY: a descriptor we just created and own.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        Box::into_raw(Box::new(Chan {
            ibv: ibv_comp_channel {
                context,
                fd,
                refcnt: 0,
            },
            epoll,
            cqs: AtomicU32::new(0),
        }))
        .cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    guard(libc::EIO, || {
        if channel.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: a live channel of ours.
        let ch = unsafe { &*channel.cast::<Chan>() };
        if ch.cqs.load(Ordering::Relaxed) > 0 {
            return libc::EBUSY;
        }
        // SAFETY: boxed by ibv_create_comp_channel, given up here.
        drop(unsafe { Box::from_raw(channel.cast::<Chan>()) });
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let max = ctx.dev.info.caps.max_cqe;
        if cqe < 1 || cqe as u32 > max {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let depth = (cqe as u32).next_power_of_two();
        let (reply, mut fds) = match ctx.device.call(Request::CreateCq { depth }) {
            Ok(r) => r,
            Err(e) => {
                set_errno(errno_of(&e));
                return std::ptr::null_mut();
            }
        };
        let Reply::Cq { cq, offset, depth } = reply else {
            set_errno(libc::EIO);
            return std::ptr::null_mut();
        };
        let slot = std::mem::size_of::<abi::Cqe>();
        let Ok(layout) = RingLayout::new(offset as usize, depth, slot) else {
            set_errno(libc::EIO);
            return std::ptr::null_mut();
        };
        let event = fds.pop();
        let c = Box::into_raw(Box::new(Cq {
            ibv: ibv_cq {
                context,
                channel,
                cq_context,
                handle: cq,
                cqe: depth as c_int,
                ..Default::default()
            },
            ring: UnsafeCell::new(Consumer::new(layout)),
            busy: AtomicBool::new(false),
            empty: AtomicU32::new(0),
            event,
            chan: channel.cast(),
        }));
        if !channel.is_null() {
            // SAFETY: a live channel of ours; `c` was just boxed.
            let (ch, cqr) = unsafe { (&*channel.cast::<Chan>(), &*c) };
            let Some(ev) = cqr.event.as_ref() else {
                set_errno(libc::EIO);
                return std::ptr::null_mut();
            };
            let mut e = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: c as u64,
            };
            // SAFETY: valid descriptors and a valid event struct.
            if unsafe {
                libc::epoll_ctl(
                    ch.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_ADD,
                    ev.as_raw_fd(),
                    &mut e,
                )
            } != 0
            {
                let errno = std::io::Error::last_os_error().raw_os_error();
                // SAFETY: boxed above and not handed out.
                drop(unsafe { Box::from_raw(c) });
                let _ = ctx.device.call(Request::DestroyCq { cq });
                set_errno(errno.unwrap_or(libc::EIO));
                return std::ptr::null_mut();
            }
            ch.cqs.fetch_add(1, Ordering::Relaxed);
        }
        ctx.events.register(Kind::Cq, cq, c.cast());
        c.cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live CQ of ours or NULL.
        let Some(c) = (unsafe { Cq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        let Some(ctx) = c.ctx() else {
            return libc::EINVAL;
        };
        ctx.events.forget(Kind::Cq, c.id());
        if let Err(e) = ctx.device.call(Request::DestroyCq { cq: c.id() }) {
            if !matches!(e, verbs::VerbsError::Io(_)) {
                return errno_of(&e);
            }
        }
        if !c.chan.is_null() {
            // SAFETY: the channel outlives its CQs (destroy refuses while
            // it has any).
            let ch = unsafe { &*c.chan };
            if let Some(ev) = c.event.as_ref() {
                // SAFETY: valid descriptors; a NULL event is allowed for DEL.
                unsafe {
                    libc::epoll_ctl(
                        ch.epoll.as_raw_fd(),
                        libc::EPOLL_CTL_DEL,
                        ev.as_raw_fd(),
                        std::ptr::null_mut(),
                    )
                };
            }
            ch.cqs.fetch_sub(1, Ordering::Relaxed);
        }
        // SAFETY: boxed by ibv_create_cq, given up here.
        drop(unsafe { Box::from_raw(cq.cast::<Cq>()) });
        0
    })
}

/// `ops.poll_cq`: up to `num_entries` completions from the ring, no
/// system call. A poller that finds another thread polling the same CQ
/// returns 0 (nothing for it now) rather than wait.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: verbs' contract: a live CQ of ours.
    let Some(c) = (unsafe { Cq::from_ptr(cq) }) else {
        return -1;
    };
    let Some(ctx) = c.ctx() else {
        return -1;
    };
    if c.busy.swap(true, Ordering::Acquire) {
        return 0;
    }
    let seg = ctx.device.segment();
    // SAFETY: `busy` is ours, so no other thread touches the ring.
    let ring = unsafe { &mut *c.ring.get() };
    let avail = match ring.available(seg) {
        Ok(n) => n as usize,
        Err(_) => {
            c.busy.store(false, Ordering::Release);
            return -1;
        }
    };
    let n = avail.min(num_entries.max(0) as usize);
    for i in 0..n {
        let e = ring.peek(seg);
        ring.advance(seg);
        let with_imm = e.flags & abi::CQE_WITH_IMM != 0;
        let out = ibv_wc {
            wr_id: e.wr_id,
            status: u32::from(e.status),
            opcode: u32::from(e.opcode),
            byte_len: e.byte_len,
            __bindgen_anon_1: ibv_wc__bindgen_ty_1 {
                imm_data: if with_imm { e.imm.to_be() } else { 0 },
            },
            qp_num: e.qpn,
            wc_flags: if with_imm { IBV_WC_WITH_IMM } else { 0 }
                | if e.flags & abi::CQE_GRH != 0 {
                    IBV_WC_GRH
                } else {
                    0
                },
            src_qp: e.source().map_or(0, |s| s.qpn),
            ..Default::default()
        };
        // SAFETY: the caller's array holds num_entries >= n entries.
        unsafe { wc.add(i).write(out) };
    }
    c.busy.store(false, Ordering::Release);
    if n > 0 {
        c.empty.store(0, Ordering::Relaxed);
        return n as c_int;
    }
    if c.empty.fetch_add(1, Ordering::Relaxed) + 1 >= EMPTY_CHECK {
        c.empty.store(0, Ordering::Relaxed);
        if ctx.check_daemon() {
            return -1;
        }
    }
    0
}

/// `ops.req_notify_cq`: the next completion signals the CQ's eventfd (with
/// `solicited_only`, the next receive whose sender set IBV_SEND_SOLICITED,
/// or the next error).
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: verbs' contract: a live CQ of ours.
    let Some(c) = (unsafe { Cq::from_ptr(cq) }) else {
        return libc::EINVAL;
    };
    let Some(ctx) = c.ctx() else {
        return libc::EINVAL;
    };
    if ctx.is_dead() {
        return libc::EIO;
    }
    // SAFETY: arming writes only the ring's shared arm word, which the
    // consumer side may do from any thread.
    let ring = unsafe { &*c.ring.get() };
    if solicited_only != 0 {
        ring.arm_solicited(ctx.device.segment());
    } else {
        ring.arm(ctx.device.segment());
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        if channel.is_null() || cq_out.is_null() || cq_context.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: a live channel of ours.
        let ch = unsafe { &*channel.cast::<Chan>() };
        // A channel whose fd the application made non-blocking does not
        // block here either (as verbs' read() of the channel fd).
        // SAFETY: fcntl on our own descriptor.
        let flags = unsafe { libc::fcntl(ch.epoll.as_raw_fd(), libc::F_GETFL) };
        let timeout = if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            0
        } else {
            -1
        };
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        loop {
            // SAFETY: one event into a valid struct.
            let n = unsafe { libc::epoll_wait(ch.epoll.as_raw_fd(), &mut ev, 1, timeout) };
            if n == 1 {
                break;
            }
            if n == 0 {
                set_errno(libc::EAGAIN);
                return -1;
            }
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return -1;
            }
        }
        let cq = ev.u64 as *mut Cq;
        // SAFETY: the event's data is a CQ of this channel, alive while
        // registered (destroy_cq removes it first).
        let c = unsafe { &*cq };
        if let Some(e) = c.event.as_ref() {
            let mut b = [0u8; 8];
            let _ = nix::unistd::read(e.as_fd().as_raw_fd(), &mut b);
        }
        // SAFETY: checked non-NULL caller pointers.
        unsafe {
            *cq_out = cq.cast();
            *cq_context = c.ibv.cq_context;
        }
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    if cq.is_null() {
        return;
    }
    // Counted as verbs does (destroy does not wait for acks here).
    // SAFETY: a live CQ of ours; the application serializes acks with
    // destroy (verbs' rule); no Rust reference to it is held here.
    unsafe {
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents);
    }
}
