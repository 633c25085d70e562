//! Asynchronous events. `context->async_fd` is an epoll descriptor over
//! three things: the eventfd the daemon signals when it queued events for
//! this connection, a duplicate of the control socket (its hang-up says
//! the daemon is gone) and the library's own eventfd (set when a call
//! finds the daemon gone). `ibv_get_async_event` takes the daemon's
//! events (`Request::AsyncEvents`), names the application's objects they
//! concern, and reports IBV_EVENT_DEVICE_FATAL once when the daemon is
//! gone; it blocks unless the application made `async_fd` non-blocking.

use std::collections::{HashMap, VecDeque};
use std::ffi::c_int;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use shm::proto::{AsyncEventMsg, Reply, Request};

use crate::context::Ctx;
use crate::sys::*;
use crate::util::{errno_of, guard, set_errno};

/// Objects events can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Qp,
    Srq,
    Cq,
}

/// A context's event state: the descriptors behind `async_fd`, events
/// taken from the daemon but not yet handed out, and the application's
/// objects by daemon handle.
pub struct Events {
    pub epoll: OwnedFd,
    /// Written once when a call finds the daemon gone.
    pub dead: OwnedFd,
    _daemon: Option<OwnedFd>,
    _socket: Option<OwnedFd>,
    queue: Mutex<VecDeque<AsyncEventMsg>>,
    fatal_told: AtomicBool,
    objects: Mutex<HashMap<(Kind, u32), usize>>,
}

fn watch(epoll: &OwnedFd, fd: &OwnedFd, events: i32) -> std::io::Result<()> {
    let mut e = libc::epoll_event {
        events: events as u32,
        u64: 0,
    };
    // SAFETY: valid descriptors and a valid event struct.
    if unsafe {
        libc::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd.as_raw_fd(),
            &mut e,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Events {
    /// The epoll set over the daemon's eventfd (when the daemon gave one),
    /// the socket's hang-up and the library's own eventfd.
    pub fn new(device: &verbs::Device) -> std::io::Result<Events> {
        use nix::sys::eventfd::{EfdFlags, EventFd};
        // SAFETY: a plain syscall; the result is checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        let epoll = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ep) };
        let dead = OwnedFd::from(EventFd::from_flags(EfdFlags::EFD_CLOEXEC)?);
        watch(&epoll, &dead, libc::EPOLLIN)?;
        let daemon = match device.call(Request::AsyncEventFd) {
            Ok((_, mut fds)) if !fds.is_empty() => Some(fds.swap_remove(0)),
            _ => None,
        };
        if let Some(d) = &daemon {
            watch(&epoll, d, libc::EPOLLIN)?;
        }
        let socket = device.watch_fd().ok();
        if let Some(s) = &socket {
            watch(&epoll, s, libc::EPOLLRDHUP)?;
        }
        Ok(Events {
            epoll,
            dead,
            _daemon: daemon,
            _socket: socket,
            queue: Mutex::new(VecDeque::new()),
            fatal_told: AtomicBool::new(false),
            objects: Mutex::new(HashMap::new()),
        })
    }

    /// Remembers an application object events may name.
    pub fn register(&self, kind: Kind, handle: u32, ptr: *mut std::ffi::c_void) {
        let mut o = self.objects.lock().unwrap_or_else(|p| p.into_inner());
        o.insert((kind, handle), ptr as usize);
    }

    /// Forgets a destroyed object: its events not yet handed out go.
    pub fn forget(&self, kind: Kind, handle: u32) {
        let mut o = self.objects.lock().unwrap_or_else(|p| p.into_inner());
        o.remove(&(kind, handle));
    }

    fn object(&self, kind: Kind, handle: u32) -> Option<*mut std::ffi::c_void> {
        let o = self.objects.lock().unwrap_or_else(|p| p.into_inner());
        o.get(&(kind, handle)).map(|&p| p as *mut std::ffi::c_void)
    }

    /// The verbs event for a daemon event, or None when its object is gone.
    fn to_ibv(&self, m: AsyncEventMsg) -> Option<ibv_async_event> {
        use AsyncEventMsg as M;
        let (kind, handle, ty) = match m {
            M::QpAccessErr { qpn } => (Kind::Qp, qpn, IBV_EVENT_QP_ACCESS_ERR),
            M::QpReqErr { qpn } => (Kind::Qp, qpn, IBV_EVENT_QP_REQ_ERR),
            M::QpFatal { qpn } => (Kind::Qp, qpn, IBV_EVENT_QP_FATAL),
            M::SqDrained { qpn } => (Kind::Qp, qpn, IBV_EVENT_SQ_DRAINED),
            M::QpLastWqeReached { qpn } => (Kind::Qp, qpn, IBV_EVENT_QP_LAST_WQE_REACHED),
            M::SrqLimitReached { srq } => (Kind::Srq, srq, IBV_EVENT_SRQ_LIMIT_REACHED),
            M::CqErr { cq } => (Kind::Cq, cq, IBV_EVENT_CQ_ERR),
        };
        let p = self.object(kind, handle)?;
        let element = match kind {
            Kind::Qp => ibv_async_event__bindgen_ty_1 { qp: p.cast() },
            Kind::Srq => ibv_async_event__bindgen_ty_1 { srq: p.cast() },
            Kind::Cq => ibv_async_event__bindgen_ty_1 { cq: p.cast() },
        };
        Some(ibv_async_event {
            element,
            event_type: ty,
        })
    }

    fn pop(&self) -> Option<AsyncEventMsg> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Whether the application made `async_fd` non-blocking.
    fn non_blocking(&self) -> bool {
        // SAFETY: F_GETFL on a descriptor we own.
        let fl = unsafe { libc::fcntl(self.epoll.as_raw_fd(), libc::F_GETFL) };
        fl >= 0 && fl & libc::O_NONBLOCK != 0
    }

    /// Waits until one of the watched descriptors is ready (or a signal).
    fn wait(&self) {
        let mut e = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: our epoll descriptor and room for one event.
        unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), &mut e, 1, -1) };
    }
}

/// The next event of `ctx`, blocking unless `async_fd` is non-blocking.
fn next_event(ctx: &Ctx) -> Result<ibv_async_event, c_int> {
    let ev = &ctx.events;
    loop {
        while let Some(m) = ev.pop() {
            if let Some(e) = ev.to_ibv(m) {
                return Ok(e);
            }
        }
        if ctx.check_daemon() {
            if ev.fatal_told.swap(true, Ordering::Relaxed) {
                // Told once; a dead device has nothing more to say.
                return Err(libc::EIO);
            }
            return Ok(ibv_async_event {
                element: ibv_async_event__bindgen_ty_1 { port_num: 0 },
                event_type: IBV_EVENT_DEVICE_FATAL,
            });
        }
        match ctx.device.call(Request::AsyncEvents) {
            Ok((Reply::AsyncEvents(list), _)) if !list.is_empty() => {
                ev.queue
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(list);
                continue;
            }
            Ok(_) => {}
            // The connection broke: the daemon is gone.
            Err(verbs::VerbsError::Io(_)) => {
                ctx.mark_dead();
                continue;
            }
            Err(e) => return Err(errno_of(&e)),
        }
        if ev.non_blocking() {
            return Err(libc::EAGAIN);
        }
        ev.wait();
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live context of ours or NULL.
        let Some(ctx) = (unsafe { Ctx::from_ptr(context) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if event.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        match next_event(ctx) {
            Ok(e) => {
                // SAFETY: checked non-NULL caller struct.
                unsafe { event.write(e) };
                0
            }
            Err(errno) => {
                set_errno(errno);
                -1
            }
        }
    })
}

/// Events need no acknowledgement here: the library keeps no state for
/// an event once handed out, so destroying an object never waits.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}
