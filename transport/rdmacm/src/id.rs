//! rdma_cm ids and the calls that give them a place: `rdma_create_id`,
//! `rdma_destroy_id`, `rdma_bind_addr`, `rdma_resolve_addr`,
//! `rdma_resolve_route`, `rdma_listen`, `rdma_set_option`,
//! `rdma_get_src_port` / `_dst_port`, `rdma_migrate_id`, `rdma_notify`.
//! A multicast group's address resolves in the library, at once (no ARP,
//! as the kernel maps a group to its MAC; for `rdma_join_multicast`).
//!
//! An id is `struct rdma_cm_id` (first, so the application's pointer is
//! ours) with the library's state behind a mutex. The application reads
//! the C struct between calls; the library writes it only inside calls
//! and event processing, with the state locked, and reads it whole only
//! so ([`Id::c`]); unlocked, it reads single fields ([`Id::qp`] ...).

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use shm::cma::{CmConnParams, CmEventType, CmId, CmListenAddr, CmPath, DAEMON_ID};
use shm::proto::{Reply, Request};

use crate::channel::{self, Channel, Queued, Shared};
use crate::daemon::Session;
use crate::devices::{self, Device};
use crate::registry::{self, Key};
use crate::sys::*;
use crate::util::{self, fail, guard, mapped_gid, read_sockaddr, Addr4, SockAddr};

/// The peer of a connection as its CONNECT_REQUEST or CONNECT_RESPONSE
/// described it.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub path: CmPath,
    pub conn: CmConnParams,
}

/// What the library keeps about an id.
pub struct State {
    pub num: CmId,
    /// The channel the id's events go to, and the C struct of it.
    pub channel: Arc<Shared>,
    pub chan_ptr: *mut Channel,
    /// A synchronous id: each call waits for its event on `channel`,
    /// which it owns when `owns_channel`.
    pub sync: bool,
    pub owns_channel: bool,
    /// The daemon channel named in requests (the channel's, or for a
    /// local channel the one the events physically arrive on).
    pub req_channel: u64,
    /// The reader of the channel this id's events arrive on, when that
    /// is not its own (a synchronous listener's request's id).
    pub upstream: Option<Arc<channel::Reader>>,
    pub dev: Option<&'static Device>,
    /// Holds a reference on `dev`'s shared PD.
    pub holds_pd: bool,
    pub session: Option<Arc<Session>>,
    /// The session rdma_bind_addr's `CmBind` went to.
    pub bind_session: Option<Arc<Session>>,
    /// A wildcard listener's sessions (one per device).
    pub listen_sessions: Vec<Arc<Session>>,
    /// The address given to rdma_bind_addr.
    pub bound: Option<Addr4>,
    pub tos: Option<u8>,
    pub ack_timeout: Option<u8>,
    /// The READ/atomic depths: max_dest_rd_atomic and max_rd_atomic.
    pub resp_res: u8,
    pub init_depth: u8,
    /// RTS's retry_cnt and rnr_retry (active: ours and the REP's;
    /// passive: the REQ's).
    pub retry_count: u8,
    pub rnr_retry: u8,
    /// The PSN our send queue starts at.
    pub starting_psn: u32,
    pub peer: Option<Peer>,
    /// A CONNECT_RESPONSE could not be completed (CONNECT_ERROR given):
    /// the REJECTED or DISCONNECTED that follows is not delivered.
    pub connect_error: bool,
    /// Created by the daemon for a connection request.
    pub child: bool,
    /// rdma_create_ep's QP attributes for rdma_get_request, and private
    /// data for rdma_connect.
    pub ep_qp_attr: Option<ibv_qp_init_attr>,
    pub ep_connect: Vec<u8>,
    pub local_ece: (u32, u32),
    pub path_rec: Option<Box<ibv_sa_path_rec>>,
    /// rdma_listen made it a listener.
    pub listening: bool,
    /// Its multicast joins, the latest first (as rdma-core keeps them).
    pub mcast: Vec<crate::mcast::Join>,
}

impl State {
    /// The daemon sessions that know the id (each once).
    pub fn daemon_sessions(&self) -> Vec<Arc<Session>> {
        let mut s: Vec<Arc<Session>> = Vec::new();
        let all = self
            .listen_sessions
            .iter()
            .chain(self.session.iter())
            .chain(self.bind_session.iter());
        for x in all {
            if !s.iter().any(|y| Arc::ptr_eq(x, y)) {
                s.push(x.clone());
            }
        }
        s
    }
}

/// How many borrows and events an id has out.
#[derive(Default)]
struct Track {
    delivered: u64,
    acked: u64,
    borrows: u32,
}

/// An id: the C struct first.
#[repr(C)]
pub struct Id {
    cm: UnsafeCell<rdma_cm_id>,
    pub key: Key,
    st: Mutex<State>,
    track: Mutex<Track>,
    changed: Condvar,
}

// SAFETY: the library writes the C struct only with `st` locked, copies
// it whole only with `st` locked (`c`), and otherwise reads single fields
// through raw pointers (`qp`, `pd`, ...), never through references. A
// call that reads a field unlocked while another thread's call on the
// same id changes it (rdma_create_qp against rdma_connect, say) is the
// application's race, as with rdma-core, which locks none of this; the
// application itself reads and writes the struct (`context`, `event`)
// between calls. Everything else is behind mutexes or immutable. The raw
// pointers are libibverbs objects any thread may use.
unsafe impl Sync for Id {}
// SAFETY: as above.
unsafe impl Send for Id {}

impl Id {
    /// The id behind an application's pointer.
    ///
    /// # Safety
    /// `p` is NULL or an id of ours not yet destroyed.
    pub unsafe fn from_ptr<'a>(p: *mut rdma_cm_id) -> Option<&'a Id> {
        // SAFETY: by the contract, the `cm` field (offset 0) of an Id.
        unsafe { p.cast::<Id>().as_ref() }
    }

    /// The C struct (write it only with the state locked).
    pub fn cm(&self) -> *mut rdma_cm_id {
        self.cm.get()
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of the C struct's current values (with the state locked,
    /// so that no call of the library writes it meanwhile).
    pub fn c(&self, _st: &State) -> rdma_cm_id {
        // SAFETY: our struct; a plain copy of POD fields, with the state
        // locked (the `_st` borrow proves it).
        unsafe { std::ptr::read(self.cm()) }
    }

    pub fn qp(&self) -> *mut ibv_qp {
        // SAFETY: one field of our live struct, read through a raw pointer.
        unsafe { std::ptr::addr_of!((*self.cm()).qp).read() }
    }

    pub fn pd(&self) -> *mut ibv_pd {
        // SAFETY: as in qp().
        unsafe { std::ptr::addr_of!((*self.cm()).pd).read() }
    }

    pub fn srq(&self) -> *mut ibv_srq {
        // SAFETY: as in qp().
        unsafe { std::ptr::addr_of!((*self.cm()).srq).read() }
    }

    pub fn context(&self) -> *mut c_void {
        // SAFETY: as in qp().
        unsafe { std::ptr::addr_of!((*self.cm()).context).read() }
    }

    /// The port space (set at creation, never changed).
    pub fn ps(&self) -> rdma_port_space {
        // SAFETY: as in qp().
        unsafe { std::ptr::addr_of!((*self.cm()).ps).read() }
    }

    /// The QP type of the port space (set at creation, never changed).
    pub fn qp_type(&self) -> ibv_qp_type {
        // SAFETY: as in qp().
        unsafe { std::ptr::addr_of!((*self.cm()).qp_type).read() }
    }

    pub fn is_ud(&self) -> bool {
        self.qp_type() == IBV_QPT_UD
    }

    /// Acks the event a synchronous id keeps in `id->event` (none: no-op).
    pub fn ack_kept_event(&self, _st: &mut State) {
        // SAFETY: our struct's event slot, written with the state locked.
        let last =
            unsafe { std::ptr::addr_of_mut!((*self.cm()).event).replace(std::ptr::null_mut()) };
        if !last.is_null() {
            // SAFETY: an event of ours not acked yet, taken out of the slot.
            unsafe { crate::event::ack(last) };
        }
    }

    /// Keeps `ev` in `id->event` (a synchronous id's last event).
    pub fn keep_event(&self, _st: &mut State, ev: *mut rdma_cm_event) {
        // SAFETY: our struct's event slot, written with the state locked.
        unsafe { std::ptr::addr_of_mut!((*self.cm()).event).write(ev) };
    }

    /// The event `id->event` holds.
    pub fn kept_event(&self, _st: &State) -> *mut rdma_cm_event {
        // SAFETY: our struct's event slot, read with the state locked.
        unsafe { std::ptr::addr_of!((*self.cm()).event).read() }
    }

    pub fn begin_borrow(&self) {
        self.track.lock().unwrap_or_else(|p| p.into_inner()).borrows += 1;
    }

    pub fn end_borrow(&self) {
        let mut t = self.track.lock().unwrap_or_else(|p| p.into_inner());
        t.borrows -= 1;
        self.changed.notify_all();
    }

    /// An event of this id went to the application.
    pub fn delivered(&self) {
        self.track
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .delivered += 1;
    }

    /// The application acked one of its events.
    pub fn acked(&self) {
        let mut t = self.track.lock().unwrap_or_else(|p| p.into_inner());
        t.acked += 1;
        self.changed.notify_all();
    }

    /// Waits until no borrow is left and every delivered event is acked.
    fn quiesce(&self) {
        let mut t = self.track.lock().unwrap_or_else(|p| p.into_inner());
        while t.borrows > 0 || t.acked < t.delivered {
            t = self.changed.wait(t).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Makes the C struct's route say where the id is: local address,
    /// peer address and their GIDs.
    pub fn set_route(&self, _st: &State, src: Option<Addr4>, dst: Option<Addr4>) {
        let cm = self.cm();
        // SAFETY: our struct, written with the state locked (the `_st`
        // borrow proves it); the address unions are 128 bytes each.
        unsafe {
            let addr = std::ptr::addr_of_mut!((*cm).route.addr);
            if let Some(s) = src {
                util::write_sockaddr(addr.cast::<u8>(), s);
                (*addr).addr.ibaddr.sgid.raw = mapped_gid(s.ip);
            }
            if let Some(d) = dst {
                util::write_sockaddr(addr.cast::<u8>().add(128), d);
                (*addr).addr.ibaddr.dgid.raw = mapped_gid(d.ip);
            }
            (*addr).addr.ibaddr.pkey = 0xffff;
        }
    }

    /// The route's local and peer addresses.
    pub fn route_addrs(&self) -> (Option<SockAddr>, Option<SockAddr>) {
        let cm = self.cm();
        // SAFETY: our struct; the unions hold socket addresses we wrote
        // (or zeroes: family 0, read as None).
        unsafe {
            let addr = std::ptr::addr_of!((*cm).route.addr).cast::<u8>();
            (
                read_sockaddr(addr.cast()),
                read_sockaddr(addr.add(128).cast()),
            )
        }
    }

    /// Puts the id on `dev`: its verbs context, the shared PD and port 1
    /// (no-op when already there).
    pub fn attach(&self, st: &mut State, dev: &'static Device) -> Result<(), i32> {
        if st.dev.is_some() {
            return Ok(());
        }
        let ctx = dev.open()?.ctx;
        let pd = dev.hold_pd()?;
        let cm = self.cm();
        // SAFETY: our struct, with the state locked.
        unsafe {
            (*cm).verbs = ctx;
            if (*cm).pd.is_null() {
                (*cm).pd = pd;
            }
            (*cm).port_num = 1;
        }
        st.dev = Some(dev);
        st.holds_pd = true;
        Ok(())
    }
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// A new number for a library id (bit 31 clear).
fn next_num() -> CmId {
    loop {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed) & !DAEMON_ID;
        if n != 0 {
            return n;
        }
    }
}

/// What a new id starts from.
pub struct NewId {
    pub channel: *mut Channel,
    pub context: *mut c_void,
    pub ps: rdma_port_space,
    pub qp_type: ibv_qp_type,
    /// `Some(session)` with `num` for an id the daemon numbered.
    pub daemon: Option<(u64, CmId)>,
    /// The channel the id's events arrive on, when its own is local
    /// (None: its own).
    pub source: Option<Arc<Shared>>,
}

/// Makes an id (on a private channel of its own when `channel` is NULL:
/// a synchronous id) and enters it in the table.
pub fn create(n: NewId, local_channel: bool) -> Result<*mut Id, i32> {
    let (chan_ptr, sync) = if n.channel.is_null() {
        let c = if local_channel {
            Channel::local()?
        } else {
            Channel::open()?
        };
        (Box::into_raw(c), true)
    } else {
        (n.channel, false)
    };
    // SAFETY: a channel of ours (the application's, or just made).
    let ch = unsafe { &*chan_ptr };
    let (num, key) = match n.daemon {
        Some((session, num)) => (num, registry::key(session, num)),
        None => {
            let num = next_num();
            (num, registry::key(0, num))
        }
    };
    let cm = rdma_cm_id {
        channel: ch.ptr(),
        context: n.context,
        ps: n.ps,
        qp_type: n.qp_type,
        ..Default::default()
    };
    let id = Box::new(Id {
        cm: UnsafeCell::new(cm),
        key,
        st: Mutex::new(State {
            num,
            channel: ch.shared.clone(),
            chan_ptr,
            sync,
            owns_channel: sync,
            req_channel: ch.shared.number.unwrap_or(0),
            upstream: None,
            dev: None,
            holds_pd: false,
            session: None,
            bind_session: None,
            listen_sessions: Vec::new(),
            bound: None,
            tos: None,
            ack_timeout: None,
            resp_res: 0,
            init_depth: 0,
            retry_count: 7,
            rnr_retry: 7,
            starting_psn: util::random_psn(),
            peer: None,
            connect_error: false,
            child: n.daemon.is_some(),
            ep_qp_attr: None,
            ep_connect: Vec::new(),
            local_ece: (0, 0),
            path_rec: None,
            listening: false,
            mcast: Vec::new(),
        }),
        track: Mutex::new(Track::default()),
        changed: Condvar::new(),
    });
    let p = Box::into_raw(id);
    let source = n.source.unwrap_or_else(|| ch.shared.clone());
    registry::insert(key, p, ch.shared.clone(), source);
    Ok(p)
}

/// The QP type rdma_cm gives a port space (EINVAL for one it lacks).
pub fn qp_type_of(ps: rdma_port_space) -> Result<ibv_qp_type, i32> {
    match ps {
        RDMA_PS_TCP | RDMA_PS_IB => Ok(IBV_QPT_RC),
        RDMA_PS_UDP | RDMA_PS_IPOIB => Ok(IBV_QPT_UD),
        _ => Err(libc::EINVAL),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    util::entry(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let qp_type = qp_type_of(ps)?;
        devices::get()?;
        let p = create(
            NewId {
                channel: channel.cast(),
                context,
                ps,
                qp_type,
                daemon: None,
                source: None,
            },
            false,
        )?;
        // SAFETY: the caller's pointer slot, checked non-NULL.
        unsafe { *id = p.cast() };
        Ok(())
    })
}

/// Destroys an id: forgets it (no more events reach it), tells the
/// daemon, waits until its delivered events are acked, frees it.
///
/// # Safety
/// `p` is a live id of ours, not used after.
pub unsafe fn destroy(p: *mut Id) {
    // SAFETY: the contract.
    let id = unsafe { &*p };
    registry::remove(id.key);
    let (sessions, num, channel) = {
        let mut st = id.lock();
        // A sync id's last event is ours to ack.
        id.ack_kept_event(&mut st);
        // Its groups are left (its QP, if still there, detached).
        crate::mcast::leave_all(id, &mut st);
        (st.daemon_sessions(), st.num, st.channel.clone())
    };
    // Its queued events go (the fd is readable only while something is
    // left to take); the requests of a listener with them, the daemon
    // forgetting their ids, and their ids' early events.
    for item in channel.purge(id.key) {
        if let Queued::Daemon(m) = item {
            if m.event == CmEventType::ConnectRequest {
                let child = registry::key(m.session, m.id);
                if let Some(ch) = registry::settled(child) {
                    ch.purge(child);
                }
                crate::event::orphan(&m);
            }
        }
    }
    for s in sessions {
        let _ = s.call(Request::CmDestroyId { id: num });
    }
    id.quiesce();
    // SAFETY: the table no longer names it and nothing borrows it.
    let b = unsafe { Box::from_raw(p) };
    let st = b.st.into_inner().unwrap_or_else(|p| p.into_inner());
    if st.holds_pd {
        if let Some(d) = st.dev {
            d.release_pd();
        }
    }
    if st.owns_channel {
        // SAFETY: the id's private channel, made with it.
        unsafe { channel::destroy(st.chan_ptr) };
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        // SAFETY: a live id of ours, given up by the application.
        unsafe { destroy(id.cm().cast()) };
        Ok(())
    })
}

/// The IPv4 address of an address argument (EINVAL: NULL or a family
/// rdma_cm does not take; EADDRNOTAVAIL: IPv6 no device has).
fn addr_arg(a: *mut sockaddr) -> Result<Addr4, i32> {
    // SAFETY: the application's socket address or NULL.
    match unsafe { read_sockaddr(a.cast()) } {
        Some(SockAddr::V4(a)) => Ok(a),
        Some(SockAddr::OtherV6) => Err(libc::EADDRNOTAVAIL),
        None => Err(libc::EINVAL),
    }
}

/// The address a bind or listen names to the daemon: the device's own
/// when the id is on one (`on_dev`), none (any) for a wildcard; a
/// loopback address takes its device's requests whatever their address.
fn listen_addr(dev: &Device, on_dev: bool, ip: Ipv4Addr, port: u16) -> CmListenAddr {
    CmListenAddr {
        ip: (on_dev && !ip.is_loopback()).then_some(dev.ip),
        port,
    }
}

/// Binds the id to `a` (a device's address or the wildcard).
fn bind(id: &Id, st: &mut State, mut a: Addr4) -> Result<(), i32> {
    if st.bound.is_some() || st.dev.is_some() {
        return fail(libc::EINVAL, || {
            "rdma_bind_addr: the id is bound already".into()
        });
    }
    let devs = devices::get()?;
    if a.ip.is_loopback() {
        // As Linux binds a loopback address (cma_bind_loopback): to the
        // first device (libfabric's verbs provider binds "localhost" to
        // find a device for a passive endpoint).
        let dev = devs.list.first().ok_or(libc::ENODEV)?;
        id.attach(st, dev)?;
    } else if !a.ip.is_unspecified() {
        let Some(dev) = devs.by_ip(a.ip) else {
            return fail(libc::EADDRNOTAVAIL, || format!("no device has {}", a.ip));
        };
        id.attach(st, dev)?;
    }
    // The port is taken at bind, as the kernel does (qperf reads it with
    // rdma_get_src_port before it listens; a second bind to it fails):
    // the device's daemon session reserves it (picks one for port 0),
    // the first device's for a wildcard.
    let dev = st.dev.or_else(|| devs.list.first()).ok_or(libc::ENODEV)?;
    let session = dev.session()?;
    let reply = session.call_ok(Request::CmBind {
        id: st.num,
        channel: st.req_channel,
        port_space: id.ps() as u16,
        addr: listen_addr(dev, st.dev.is_some(), a.ip, a.port),
    })?;
    st.bind_session = Some(session);
    if let Reply::CmPort { port } = reply {
        a.port = port;
    }
    st.bound = Some(a);
    id.set_route(st, Some(a), None);
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        let a = addr_arg(addr)?;
        let mut st = id.lock();
        bind(id, &mut st, a)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        (|| {
            let mut dst = addr_arg(dst_addr)?;
            if dst.ip.is_unspecified() {
                return Err(libc::EINVAL);
            }
            let devs = devices::get()?;
            let mut st = id.lock();
            if !src_addr.is_null() && st.bound.is_none() && st.dev.is_none() {
                let src = addr_arg(src_addr)?;
                bind(id, &mut st, src)?;
            }
            if dst.ip.is_multicast() {
                return resolve_group(id, &mut st, devs, dst);
            }
            if st.dev.is_none() {
                // A loopback destination is the first device itself, as
                // Linux resolves one (cma_resolve_loopback).
                let dev = if dst.ip.is_loopback() {
                    devs.list.first().ok_or(libc::ENODEV)?
                } else {
                    devs.for_dst(dst.ip)
                };
                id.attach(&mut st, dev)?;
            }
            let dev = st.dev.expect("attached above");
            if dst.ip.is_loopback() {
                dst.ip = dev.ip;
            }
            let session = dev.session()?;
            let src_port = st.bound.map_or(0, |b| b.port);
            let reply = session.call_ok(Request::CmResolveAddr {
                id: st.num,
                channel: st.req_channel,
                port_space: id.ps() as u16,
                src_port,
                dst: dst.ip,
                timeout_ms: u32::try_from(timeout_ms).unwrap_or(0),
            })?;
            let port = match reply {
                Reply::CmPort { port } => port,
                _ => src_port,
            };
            st.session = Some(session);
            let v6 = st.bound.is_some_and(|b| b.v6);
            id.set_route(
                &st,
                Some(Addr4 {
                    ip: dev.ip,
                    port,
                    v6,
                }),
                Some(dst),
            );
            Ok(())
        })()?;
        crate::event::complete(id)
    })
}

/// Resolves a multicast group's address (for rdma_join_multicast, as
/// mckey does): at once and without the daemon, as the kernel maps a
/// group to its MAC without ARP. The id is bound as the kernel's resolve
/// binds it (to its device's address, a port picked), then the library
/// queues ADDR_RESOLVED itself.
fn resolve_group(
    id: &Id,
    st: &mut State,
    devs: &'static devices::Devices,
    dst: Addr4,
) -> Result<(), i32> {
    if st.bound.is_none() && st.dev.is_none() {
        let dev = devs.for_dst(dst.ip);
        bind(
            id,
            st,
            Addr4 {
                ip: dev.ip,
                port: 0,
                v6: dst.v6,
            },
        )?;
    }
    if st.dev.is_none() {
        // Bound to the wildcard.
        id.attach(st, devs.for_dst(dst.ip))?;
    }
    let dev = st.dev.expect("attached above");
    let (src, _) = id.route_addrs();
    let port = match (st.bound, src) {
        (Some(b), _) => b.port,
        (None, Some(SockAddr::V4(s))) => s.port,
        _ => 0,
    };
    let v6 = st.bound.is_some_and(|b| b.v6);
    id.set_route(
        st,
        Some(Addr4 {
            ip: dev.ip,
            port,
            v6,
        }),
        Some(dst),
    );
    st.channel.push(Queued::Local {
        key: id.key,
        event: CmEventType::AddrResolved,
        status: 0,
    });
    Ok(())
}

/// The route record rdma-core fills for a RoCE route (one path).
fn path_record(id: &Id, st: &State) -> ibv_sa_path_rec {
    let c = id.c(st);
    // SAFETY: plain copies out of our struct's unions.
    let (sgid, dgid) = unsafe { (c.route.addr.addr.ibaddr.sgid, c.route.addr.addr.ibaddr.dgid) };
    let mtu = st.dev.map_or(1024, |d| d.max_mtu);
    ibv_sa_path_rec {
        dgid,
        sgid,
        hop_limit: 64,
        traffic_class: st.tos.unwrap_or(0),
        reversible: 1,
        numb_path: 1,
        pkey: 0xffff,
        mtu_selector: 2,
        mtu: crate::attrs::mtu_enum(mtu) as u8,
        rate_selector: 2,
        rate: IBV_RATE_10_GBPS as u8,
        packet_life_time_selector: 2,
        packet_life_time: 18,
        ..Default::default()
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        {
            let mut st = id.lock();
            if st.dev.is_none() {
                return fail(libc::EINVAL, || {
                    "rdma_resolve_route: the address is not resolved".into()
                });
            }
            // RoCE needs no path query: the route is the address's.
            let rec = Box::new(path_record(id, &st));
            let cm = id.cm();
            // SAFETY: our struct, with the state locked; the record lives
            // in the state until the id is freed.
            unsafe {
                (*cm).route.path_rec = &*rec as *const ibv_sa_path_rec as *mut ibv_sa_path_rec;
                (*cm).route.num_paths = 1;
            }
            st.path_rec = Some(rec);
            st.channel.push(Queued::Local {
                key: id.key,
                event: CmEventType::RouteResolved,
                status: 0,
            });
        }
        crate::event::complete(id)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        let devs = devices::get()?;
        let mut st = id.lock();
        if st.session.is_some() || !st.listen_sessions.is_empty() {
            return fail(libc::EINVAL, || "rdma_listen: the id is in use".into());
        }
        let b = st.bound.unwrap_or(Addr4 {
            ip: Ipv4Addr::UNSPECIFIED,
            port: 0,
            v6: false,
        });
        let targets: Vec<&'static Device> = match st.dev {
            Some(d) => vec![d],
            None => devs.list.iter().collect(),
        };
        let wildcard = st.dev.is_none();
        let mut port = b.port;
        let mut opened = Vec::new();
        for dev in targets {
            let r = dev.session().and_then(|s| {
                let reply = s.call_ok(Request::CmListen {
                    id: st.num,
                    channel: st.req_channel,
                    port_space: id.ps() as u16,
                    addr: listen_addr(dev, !wildcard, b.ip, port),
                })?;
                Ok((s, reply))
            });
            match r {
                Ok((s, Reply::CmPort { port: p })) => {
                    port = p;
                    opened.push(s);
                }
                Ok((s, _)) => opened.push(s),
                Err(e) => {
                    for s in &opened {
                        let _ = s.call(Request::CmDestroyId { id: st.num });
                    }
                    return Err(e);
                }
            }
        }
        if wildcard {
            st.listen_sessions = opened;
        } else {
            st.session = opened.pop();
        }
        st.listening = true;
        let local = Addr4 { port, ..b };
        st.bound = Some(local);
        id.set_route(&st, Some(local), None);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        let byte = || -> Result<u8, i32> {
            if optlen != 1 {
                return Err(libc::EINVAL);
            }
            // SAFETY: the caller's option value, one byte.
            Ok(unsafe { *optval.cast::<u8>() })
        };
        let int = || -> Result<c_int, i32> {
            if optlen != std::mem::size_of::<c_int>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: the caller's option value, an int.
            Ok(unsafe { std::ptr::read_unaligned(optval.cast::<c_int>()) })
        };
        match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => byte().map(|v| id.lock().tos = Some(v)),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => {
                byte().map(|v| id.lock().ack_timeout = Some(v))
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR)
            | (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => int().map(|_| ()),
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => fail(libc::EINVAL, || {
                "RDMA_OPTION_IB_PATH: RoCE routes are resolved, not set".into()
            }),
            _ => Err(libc::ENOSYS),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        if id.is_null() {
            return 0;
        }
        // SAFETY: a live id; the source address union.
        unsafe { util::port_of(std::ptr::addr_of!((*id).route.addr).cast()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    guard(0, || {
        if id.is_null() {
            return 0;
        }
        // SAFETY: a live id; the destination address union (128 bytes on).
        unsafe { util::port_of(std::ptr::addr_of!((*id).route.addr).cast::<u8>().add(128)) }
    })
}

/// Moves the id's events to `channel` (NULL: a new local channel, the id
/// becoming synchronous). A channel on its own daemon connection gets
/// them from the daemon from now on (`CmMigrate`); a local one has them
/// forwarded from the channel they arrive on, whose reader the id keeps.
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        let mut st = id.lock();
        let (new_ptr, sync) = if channel.is_null() {
            if st.sync {
                return Err(libc::EINVAL);
            }
            (Box::into_raw(Channel::local()?), true)
        } else {
            (channel.cast::<Channel>(), false)
        };
        // SAFETY: a channel of ours (the application's or just made).
        let new = unsafe { &*new_ptr };
        let old_source = registry::source_of(id.key).unwrap_or_else(|| st.channel.clone());
        let source = match new.shared.number {
            Some(n) => {
                for s in st.daemon_sessions() {
                    s.call_ok(Request::CmMigrate {
                        id: st.num,
                        channel: n,
                    })?;
                }
                st.req_channel = n;
                st.upstream = None;
                new.shared.clone()
            }
            None => {
                // Events keep arriving where the daemon sends them: keep
                // that channel's reader running while this id lives.
                // SAFETY: the id's current channel, live.
                let old_reader = unsafe { &*st.chan_ptr }.reader.clone();
                st.upstream = old_reader.or(st.upstream.take());
                old_source
            }
        };
        if st.sync {
            id.ack_kept_event(&mut st);
        }
        let old = st.channel.clone();
        registry::set_channel(id.key, new.shared.clone(), source);
        if !Arc::ptr_eq(&old, &new.shared) {
            old.move_events(id.key, &new.shared);
        }
        let (old_ptr, old_owned) = (st.chan_ptr, st.owns_channel);
        st.channel = new.shared.clone();
        st.chan_ptr = new_ptr;
        st.sync = sync;
        st.owns_channel = sync;
        // SAFETY: our struct, with the state locked.
        unsafe { std::ptr::addr_of_mut!((*id.cm()).channel).write(new.ptr()) };
        if old_owned && old_ptr != new_ptr {
            // SAFETY: the id's own previous channel, now unused.
            unsafe { channel::destroy(old_ptr) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: ibv_event_type) -> c_int {
    util::entry(|| {
        let id = arg(id)?;
        // The daemon's CM moves to ESTABLISHED on the first packet of the
        // connection by itself; nothing to tell it.
        if id.lock().session.is_none() {
            return Err(libc::EINVAL);
        }
        Ok(())
    })
}

/// The id of a C pointer, or EINVAL.
pub fn arg<'a>(p: *mut rdma_cm_id) -> Result<&'a Id, i32> {
    // SAFETY: the C API's contract: NULL or a live id of ours.
    unsafe { Id::from_ptr(p) }.ok_or(libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_spaces_give_rdma_cm_s_qp_types() {
        assert_eq!(qp_type_of(RDMA_PS_TCP), Ok(IBV_QPT_RC));
        assert_eq!(qp_type_of(RDMA_PS_IB), Ok(IBV_QPT_RC));
        assert_eq!(qp_type_of(RDMA_PS_UDP), Ok(IBV_QPT_UD));
        assert_eq!(qp_type_of(RDMA_PS_IPOIB), Ok(IBV_QPT_UD));
        assert_eq!(qp_type_of(0x999), Err(libc::EINVAL));
    }

    #[test]
    fn library_ids_never_have_the_daemon_bit() {
        NEXT_ID.store(DAEMON_ID - 1, Ordering::Relaxed);
        let a = next_num();
        let b = next_num();
        assert_eq!(a, DAEMON_ID - 1);
        assert_eq!(b & DAEMON_ID, 0);
        assert_ne!(b, 0);
    }

    #[test]
    fn a_local_id_has_its_c_struct_first_and_routes_its_addresses() {
        let p = create(
            NewId {
                channel: std::ptr::null_mut(),
                context: 7 as *mut c_void,
                ps: RDMA_PS_TCP,
                qp_type: IBV_QPT_RC,
                daemon: None,
                source: None,
            },
            true,
        )
        .unwrap();
        // SAFETY: just made.
        let id = unsafe { &*p };
        assert_eq!(p as usize, id.cm() as usize);
        assert_eq!(id.context() as usize, 7);
        assert!(!id.c(&id.lock()).channel.is_null());
        let src = Addr4 {
            ip: Ipv4Addr::new(10, 0, 0, 1),
            port: 7174,
            v6: false,
        };
        id.set_route(&id.lock(), Some(src), None);
        assert_eq!(id.route_addrs().0, Some(SockAddr::V4(src)));
        // SAFETY: a live id.
        assert_eq!(unsafe { rdma_get_src_port(p.cast()) }, 7174u16.to_be());
        // SAFETY: a union copy.
        let sgid = unsafe { id.c(&id.lock()).route.addr.addr.ibaddr.sgid.raw };
        assert_eq!(sgid, mapped_gid(src.ip));
        assert!(registry::channel_of(id.key).is_some());
        // SAFETY: ours, not used after.
        unsafe { destroy(p) };
        assert!(registry::channel_of((0, 1 << 30)).is_none());
    }
}
