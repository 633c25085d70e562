//! Event channels: `rdma_create_event_channel`, `rdma_destroy_event_channel`,
//! and the queue `rdma_get_cm_event` takes events from.
//!
//! A channel is its own connection to the daemon (`Request::CmChannel`),
//! on which the daemon then only pushes events. The library also makes
//! events itself (ROUTE_RESOLVED: the daemon has no route step;
//! ADDR_RESOLVED of a multicast group and MULTICAST_JOIN: they never
//! reach the daemon; DEVICE_REMOVAL when the daemon dies), so the fd an
//! application polls
//! (`rdma_event_channel.fd`) cannot be the daemon's socket. The design:
//!
//! - a **queue** per channel (mutex + condvar) of events not yet taken,
//!   whether the daemon's or the library's own;
//! - an **eventfd** as `channel->fd`: readable exactly while the queue is
//!   not empty (every push writes it, so edge-triggered pollers wake for
//!   each event too; the take that empties the queue resets it). An
//!   application may set O_NONBLOCK on it with fcntl; a take then fails
//!   with EAGAIN instead of waiting;
//! - a **reader thread** per channel blocking on the daemon socket: each
//!   framed event goes to the queue of the channel its id is on now (an
//!   id migrated to another channel takes its later events along; an
//!   unknown id's are dropped); at end of file (the daemon died) each id
//!   whose events it carried gets one DEVICE_REMOVAL, after which an
//!   empty queue fails with ENODEV (the fd stays readable).
//!
//! Channels the library makes for synchronous ids it created from a
//! connection request, or for `rdma_migrate_id(id, NULL)`, are local: no
//! connection and no thread; their events arrive forwarded from the
//! channel the daemon pushes them on.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};

use shm::cma::{CmEventMsg, CmEventType};
use shm::proto::{self, Reply, ReplyMsg, Request};

use crate::daemon::Conn;
use crate::registry::{self, Key};
use crate::sys::*;
use crate::util::{fail, guard, set_errno};

/// An event waiting in a channel.
#[derive(Debug)]
pub enum Queued {
    /// From the daemon.
    Daemon(Box<CmEventMsg>),
    /// Made by the library (ROUTE_RESOLVED, DEVICE_REMOVAL).
    Local {
        key: Key,
        event: CmEventType,
        status: i32,
    },
    /// The answer to a multicast join of the id (`handle`: which join),
    /// made by the library (MULTICAST_JOIN or MULTICAST_ERROR).
    Join { key: Key, handle: u32 },
}

impl Queued {
    /// The id the event is counted against and delivered with: a
    /// CONNECT_REQUEST's listener, else the event's id.
    pub fn target(&self) -> Key {
        match self {
            Queued::Daemon(m) => match (m.event, m.listener) {
                (CmEventType::ConnectRequest, Some(l)) => registry::key(m.session, l),
                _ => registry::key(m.session, m.id),
            },
            Queued::Local { key, .. } | Queued::Join { key, .. } => *key,
        }
    }
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Queued>,
    /// The daemon connection ended: nothing more will come.
    dead: bool,
}

/// The part of a channel its ids and its reader thread share.
pub struct Shared {
    /// The daemon's number of the channel (None: a local channel).
    pub number: Option<u64>,
    q: Mutex<Queue>,
    cond: Condvar,
    /// The eventfd the application polls.
    wake: OwnedFd,
}

impl Shared {
    fn new(number: Option<u64>) -> Result<Arc<Shared>, i32> {
        // SAFETY: eventfd with valid flags; we own the new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(crate::util::errno());
        }
        Ok(Arc::new(Shared {
            number,
            q: Mutex::new(Queue::default()),
            cond: Condvar::new(),
            // SAFETY: a descriptor just created and owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        }))
    }

    /// A local channel's queue (tests of the modules that route events).
    #[cfg(test)]
    pub fn new_local_for_tests() -> Arc<Shared> {
        Shared::new(None).expect("an eventfd")
    }

    /// Queues an event and wakes whoever waits or polls.
    pub fn push(&self, item: Queued) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        q.items.push_back(item);
        self.wake();
        self.cond.notify_all();
    }

    /// Whether the application set O_NONBLOCK on the channel's fd.
    pub fn nonblocking(&self) -> bool {
        // SAFETY: F_GETFL on our own descriptor.
        let fl = unsafe { libc::fcntl(self.wake.as_raw_fd(), libc::F_GETFL) };
        fl >= 0 && fl & libc::O_NONBLOCK != 0
    }

    /// Takes the first event (for `want`: the first for that id),
    /// waiting for one when `block`. ENODEV once the daemon is gone and
    /// nothing is left, EAGAIN when nothing is there and not `block`.
    pub fn take(&self, want: Option<Key>, block: bool) -> Result<Queued, i32> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let at = match want {
                None => (!q.items.is_empty()).then_some(0),
                Some(k) => q.items.iter().position(|i| i.target() == k),
            };
            if let Some(at) = at {
                let item = q.items.remove(at).expect("position is in range");
                if q.items.is_empty() && !q.dead {
                    self.reset_wake();
                }
                return Ok(item);
            }
            if q.dead {
                return Err(libc::ENODEV);
            }
            if !block {
                return Err(libc::EAGAIN);
            }
            q = self.cond.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Moves the events of `key` to `to` (the id migrated there).
    pub fn move_events(&self, key: Key, to: &Shared) {
        let moved: Vec<Queued> = {
            let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
            let (mine, rest): (VecDeque<Queued>, VecDeque<Queued>) =
                q.items.drain(..).partition(|i| i.target() == key);
            q.items = rest;
            if q.items.is_empty() && !q.dead {
                self.reset_wake();
            }
            mine.into()
        };
        for m in moved {
            to.push(m);
        }
    }

    /// Takes the events of `key` out of the queue (its id is destroyed),
    /// resetting the fd when nothing is left.
    pub fn purge(&self, key: Key) -> Vec<Queued> {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        let (gone, rest): (VecDeque<Queued>, VecDeque<Queued>) =
            q.items.drain(..).partition(|i| i.target() == key);
        q.items = rest;
        if q.items.is_empty() && !q.dead {
            self.reset_wake();
        }
        gone.into()
    }

    /// Takes the answer to a join out of the queue (the group was left
    /// before the application took it), resetting the fd when nothing is
    /// left.
    pub fn remove_join(&self, key: Key, handle: u32) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        q.items.retain(
            |i| !matches!(i, Queued::Join { key: k, handle: h } if *k == key && *h == handle),
        );
        if q.items.is_empty() && !q.dead {
            self.reset_wake();
        }
    }

    /// Empties the eventfd's counter (with the queue lock held, the queue
    /// just became empty).
    fn reset_wake(&self) {
        let mut pfd = libc::pollfd {
            fd: self.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of ours, no waiting.
        if unsafe { libc::poll(&mut pfd, 1, 0) } == 1 {
            let mut b = [0u8; 8];
            // SAFETY: 8 bytes into our buffer; the counter is non-zero so
            // the read does not block.
            unsafe { libc::read(self.wake.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        }
    }

    /// Nothing more will come: takes fail with ENODEV once the queue is
    /// empty, and the fd stays readable so that a poller wakes to see it.
    fn kill(&self) {
        let mut q = self.q.lock().unwrap_or_else(|p| p.into_inner());
        q.dead = true;
        if q.items.is_empty() {
            self.wake();
        }
        self.cond.notify_all();
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes to our eventfd (cannot block: the counter is
        // far from its limit).
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    /// The daemon connection ended: each id whose events arrive on it
    /// gets a DEVICE_REMOVAL on the channel it is on (this one, or a
    /// local channel this one fed, which dies too), then takes fail with
    /// ENODEV.
    fn died(self: &Arc<Self>) {
        for (key, ch) in registry::fed_by(self) {
            ch.push(Queued::Local {
                key,
                event: CmEventType::DeviceRemoval,
                status: 0,
            });
            if !Arc::ptr_eq(&ch, self) && ch.number.is_none() {
                ch.kill();
            }
        }
        self.kill();
    }
}

/// Sends a daemon event to the channel its id is on now; an event of an
/// id that is gone is dropped (a connection request's new id destroyed
/// at the daemon), so that the fd never says readable for it.
fn route(m: Box<CmEventMsg>) {
    if let Err(m) = registry::deliver(m) {
        crate::event::orphan(&m);
    }
}

/// The reader thread: events from the daemon socket until it ends.
fn read_events(own: Arc<Shared>, mut sock: UnixStream, mut buf: Vec<u8>, stop: Arc<Mutex<bool>>) {
    let mut fds = Vec::new();
    loop {
        match proto::recv_message::<ReplyMsg>(&mut sock, &mut buf, &mut fds) {
            Ok(ReplyMsg {
                result: Ok(Reply::CmEvent(m)),
                ..
            }) => route(m),
            Ok(_) => {}
            Err(_) => break,
        }
        fds.clear();
    }
    if !*stop.lock().unwrap_or_else(|p| p.into_inner()) {
        own.died();
    }
}

/// An event channel: the C struct first (`channel->fd` is the eventfd).
#[repr(C)]
pub struct Channel {
    pub ch: rdma_event_channel,
    pub shared: Arc<Shared>,
    /// The reader thread of a channel on its own daemon connection
    /// (shared with the synchronous ids whose events it forwards, so it
    /// outlives its channel while they live).
    pub reader: Option<Arc<Reader>>,
}

/// A channel's daemon connection and reader thread, stopped when the
/// last holder lets go.
pub struct Reader {
    sock: UnixStream,
    stop: Arc<Mutex<bool>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Channel {
    /// A channel on its own daemon connection.
    pub fn open() -> Result<Box<Channel>, i32> {
        crate::devices::get()?;
        let mut conn = Conn::connect().or_else(|e| fail(e.errno, || e.why))?;
        let number = match conn.call(Request::CmChannel) {
            Ok(Reply::CmChannel { channel }) => channel,
            Ok(r) => return fail(libc::EPROTO, || format!("CmChannel answered {r:?}")),
            Err(e) => return fail(e.errno, || format!("CmChannel: {}", e.why)),
        };
        let shared = Shared::new(Some(number))?;
        let sock = conn
            .sock
            .try_clone()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let stop = Arc::new(Mutex::new(false));
        let (own, buffered, s2) = (shared.clone(), conn.take_buffered(), stop.clone());
        let reader_sock = conn.sock;
        let thread = std::thread::Builder::new()
            .name("rdmacm-events".into())
            .spawn(move || read_events(own, reader_sock, buffered, s2))
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
        Ok(Box::new(Channel {
            ch: rdma_event_channel {
                fd: shared.wake.as_raw_fd(),
            },
            shared,
            reader: Some(Arc::new(Reader {
                sock,
                stop,
                thread: Mutex::new(Some(thread)),
            })),
        }))
    }

    /// A channel fed only by forwarding (see the module doc).
    pub fn local() -> Result<Box<Channel>, i32> {
        let shared = Shared::new(None)?;
        Ok(Box::new(Channel {
            ch: rdma_event_channel {
                fd: shared.wake.as_raw_fd(),
            },
            shared,
            reader: None,
        }))
    }

    /// The channel behind an application's pointer.
    ///
    /// # Safety
    /// `p` is NULL or a channel of ours not yet destroyed.
    pub unsafe fn from_ptr<'a>(p: *mut rdma_event_channel) -> Option<&'a Channel> {
        // SAFETY: by the contract, the `ch` field (offset 0) of a Channel.
        unsafe { p.cast::<Channel>().as_ref() }
    }

    pub fn ptr(&self) -> *mut rdma_event_channel {
        &self.ch as *const rdma_event_channel as *mut rdma_event_channel
    }
}

/// Frees a channel made by [`Channel::open`] or [`Channel::local`].
///
/// # Safety
/// `p` came from `Box::into_raw` of one of them and is not used after.
pub unsafe fn destroy(p: *mut Channel) {
    // SAFETY: the contract.
    drop(unsafe { Box::from_raw(p) });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    guard(std::ptr::null_mut(), || match Channel::open() {
        Ok(c) => Box::into_raw(c).cast(),
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        if !channel.is_null() {
            // SAFETY: a channel of ours, given up by the application.
            unsafe { destroy(channel.cast()) };
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(key: Key, event: CmEventType) -> Queued {
        Queued::Local {
            key,
            event,
            status: 0,
        }
    }

    fn readable(s: &Shared) -> bool {
        let mut pfd = libc::pollfd {
            fd: s.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, no waiting.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }

    #[test]
    fn the_fd_is_readable_exactly_while_events_wait() {
        let s = Shared::new(None).unwrap();
        assert!(!readable(&s));
        s.push(local((0, 1), CmEventType::RouteResolved));
        s.push(local((0, 2), CmEventType::RouteResolved));
        assert!(readable(&s));
        s.take(None, false).unwrap();
        assert!(readable(&s));
        s.take(None, false).unwrap();
        assert!(!readable(&s));
        assert_eq!(s.take(None, false).unwrap_err(), libc::EAGAIN);
    }

    #[test]
    fn a_waiter_for_one_id_leaves_the_others_events_in_order() {
        let s = Shared::new(None).unwrap();
        s.push(local((0, 1), CmEventType::AddrResolved));
        s.push(local((0, 2), CmEventType::RouteResolved));
        s.push(local((0, 1), CmEventType::RouteResolved));
        let got = s.take(Some((0, 2)), false).unwrap();
        assert_eq!(got.target(), (0, 2));
        match s.take(None, false).unwrap() {
            Queued::Local { event, .. } => assert_eq!(event, CmEventType::AddrResolved),
            q => panic!("{q:?}"),
        }
        assert_eq!(s.take(Some((0, 2)), false).unwrap_err(), libc::EAGAIN);
    }

    #[test]
    fn o_nonblock_set_by_the_application_is_seen() {
        let s = Shared::new(None).unwrap();
        assert!(!s.nonblocking());
        let fd = s.wake.as_raw_fd();
        // SAFETY: fcntl on our own descriptor.
        unsafe {
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            )
        };
        assert!(s.nonblocking());
    }

    #[test]
    fn a_dead_channel_fails_with_enodev_once_empty() {
        let s = Shared::new(Some(3)).unwrap();
        s.died();
        assert_eq!(s.take(None, true).unwrap_err(), libc::ENODEV);
    }

    #[test]
    fn a_dead_channel_with_no_id_still_wakes_its_poller() {
        let s = Shared::new(Some(3)).unwrap();
        assert!(!readable(&s));
        s.died();
        assert!(readable(&s));
        assert_eq!(s.take(None, false).unwrap_err(), libc::ENODEV);
        assert!(readable(&s), "stays readable: each take says ENODEV");
    }

    #[test]
    fn the_daemon_s_death_reaches_ids_on_local_channels_it_fed() {
        let (src, local) = (Shared::new(Some(4)).unwrap(), Shared::new(None).unwrap());
        let key = (0, 0x7000_0001);
        registry::insert(key, std::ptr::null(), local.clone(), src.clone());
        let l2 = local.clone();
        // A synchronous call waiting for its event.
        let t = std::thread::spawn(move || l2.take(Some(key), true).map(|q| q.target()));
        std::thread::sleep(std::time::Duration::from_millis(20));
        src.died();
        registry::remove(key);
        assert_eq!(t.join().unwrap(), Ok(key));
        // The local channel is dead too: no more waiting.
        assert_eq!(local.take(Some(key), true).unwrap_err(), libc::ENODEV);
        assert!(readable(&local));
        assert!(readable(&src));
    }

    #[test]
    fn purging_a_destroyed_id_s_events_resets_the_fd() {
        let s = Shared::new(None).unwrap();
        s.push(local((0, 1), CmEventType::RouteResolved));
        s.push(local((0, 2), CmEventType::RouteResolved));
        s.push(local((0, 1), CmEventType::AddrResolved));
        assert_eq!(s.purge((0, 1)).len(), 2);
        assert!(readable(&s));
        assert_eq!(s.purge((0, 2)).len(), 1);
        assert!(!readable(&s), "nothing left to read");
        assert_eq!(s.take(None, false).unwrap_err(), libc::EAGAIN);
    }

    #[test]
    fn a_blocked_take_wakes_for_a_push_from_another_thread() {
        let s = Shared::new(None).unwrap();
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.take(Some((0, 9)), true).map(|q| q.target()));
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.push(local((0, 8), CmEventType::RouteResolved));
        s.push(local((0, 9), CmEventType::RouteResolved));
        assert_eq!(t.join().unwrap(), Ok((0, 9)));
    }

    #[test]
    fn events_move_with_a_migrated_id() {
        let (a, b) = (Shared::new(None).unwrap(), Shared::new(None).unwrap());
        a.push(local((0, 1), CmEventType::RouteResolved));
        a.push(local((0, 2), CmEventType::RouteResolved));
        a.move_events((0, 1), &b);
        assert_eq!(b.take(None, false).unwrap().target(), (0, 1));
        assert_eq!(a.take(None, false).unwrap().target(), (0, 2));
        assert!(!readable(&a));
    }

    #[test]
    fn a_connect_request_is_counted_against_its_listener() {
        let m = CmEventMsg {
            session: 7,
            id: shm::cma::DAEMON_ID | 3,
            listener: Some(4),
            event: CmEventType::ConnectRequest,
            status: 0,
            private_data: vec![],
            conn: Default::default(),
            path: None,
        };
        assert_eq!(Queued::Daemon(Box::new(m.clone())).target(), (0, 4));
        let est = CmEventMsg {
            event: CmEventType::Established,
            listener: None,
            ..m
        };
        assert_eq!(
            Queued::Daemon(Box::new(est)).target(),
            (7, shm::cma::DAEMON_ID | 3)
        );
    }
}
