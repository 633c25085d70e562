//! Contexts: `ibv_open_device` opens the device on the daemon (a
//! connection and a shared segment, `verbs::Device`) and hands out the
//! `struct ibv_context` embedded at the end of a `struct verbs_context`,
//! as verbs.h's inline calls expect (`abi_compat` = `UINTPTR_MAX`, `sz`
//! covering every op we fill in). Closing the context closes the
//! connection, and the daemon frees everything the application held.

use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::async_event::Events;
use crate::device::Dev;
use crate::sys::*;
use crate::util::{guard, set_errno, warn};

/// Segment an application gets for its rings unless `RNIC_SHM_BYTES`
/// says otherwise (its memory regions are its own memory, not in it).
pub const DEFAULT_SHM_BYTES: u64 = 64 << 20;

/// An open device. `vctx` first, so that the `ibv_context` inside it
/// leads back here by a fixed offset.
#[repr(C)]
pub struct Ctx {
    pub vctx: verbs_context,
    pub dev: &'static Dev,
    pub device: verbs::Device,
    /// Asynchronous events (`context->async_fd` is their epoll set) and
    /// the objects they may name.
    pub events: Events,
    /// Set once the daemon is found gone: every later call fails.
    pub dead: AtomicBool,
}

impl Ctx {
    /// The context behind an application's `ibv_context` pointer.
    ///
    /// # Safety
    /// `p` is NULL or a context pointer from `ibv_open_device` not yet
    /// closed.
    pub unsafe fn from_ptr<'a>(p: *mut ibv_context) -> Option<&'a Ctx> {
        if p.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(Ctx, vctx) + std::mem::offset_of!(verbs_context, context);
        // SAFETY: by the contract, `p` is the `context` field of the
        // `vctx` field of a live boxed Ctx, `off` bytes into it.
        unsafe { p.cast::<u8>().sub(off).cast::<Ctx>().as_ref() }
    }

    /// Whether the daemon is known to be gone.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// Looks whether the daemon is gone (one non-blocking peek at the
    /// socket); once it is, every later call fails and the async
    /// descriptor reports IBV_EVENT_DEVICE_FATAL.
    pub fn check_daemon(&self) -> bool {
        if self.is_dead() {
            return true;
        }
        if self.device.daemon_gone() {
            self.mark_dead();
            return true;
        }
        false
    }

    /// The daemon is gone: says so once, and wakes `ibv_get_async_event`
    /// for IBV_EVENT_DEVICE_FATAL.
    pub fn mark_dead(&self) {
        if !self.dead.swap(true, Ordering::Relaxed) {
            crate::util::warn(&format!(
                "the daemon serving {} is gone; the device is dead",
                self.dev.info.name
            ));
            let _ = nix::unistd::write(&self.events.dead, &1u64.to_ne_bytes());
        }
    }

    /// The application's pointer to this context.
    pub fn ibv(&self) -> *mut ibv_context {
        &self.vctx.context as *const ibv_context as *mut ibv_context
    }
}

fn shm_bytes() -> u64 {
    std::env::var("RNIC_SHM_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SHM_BYTES)
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    guard(std::ptr::null_mut(), || {
        // SAFETY: a device pointer of ours or NULL.
        let Some(dev) = (unsafe { Dev::from_ptr(device) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let opened = match verbs::Device::open_with(&dev.socket, &dev.info.name, shm_bytes()) {
            Ok(d) => d,
            Err(e) => {
                warn(&format!("ibv_open_device({}): {e}", dev.info.name));
                set_errno(libc::ENODEV);
                return std::ptr::null_mut();
            }
        };
        let events = match Events::new(&opened) {
            Ok(e) => e,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                return std::ptr::null_mut();
            }
        };
        let mut vctx = verbs_context {
            sz: std::mem::size_of::<verbs_context>(),
            query_port: Some(crate::query::query_port_ex),
            query_device_ex: Some(crate::query::query_device_ex),
            ..Default::default()
        };
        let c = &mut vctx.context;
        c.ops.post_send = Some(crate::post::post_send);
        c.ops.post_recv = Some(crate::post::post_recv);
        c.ops.post_srq_recv = Some(crate::srq::post_srq_recv);
        c.ops.poll_cq = Some(crate::cq::poll_cq);
        c.ops.req_notify_cq = Some(crate::cq::req_notify_cq);
        c.device = device;
        c.cmd_fd = -1;
        c.async_fd = events.epoll.as_raw_fd();
        c.num_comp_vectors = 1;
        c.abi_compat = usize::MAX as *mut c_void;
        let ctx = Box::new(Ctx {
            vctx,
            dev,
            device: opened,
            events,
            dead: AtomicBool::new(false),
        });
        Box::leak(ctx).ibv()
    })
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the context was leaked from a Box in ibv_open_device and
        // the application gives it up here.
        drop(unsafe { Box::from_raw(ctx as *const Ctx as *mut Ctx) });
        0
    })
}
