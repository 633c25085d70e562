//! Events as the application gets them: `rdma_get_cm_event` (take one
//! from the channel's queue and turn it into a heap `struct
//! rdma_cm_event` with its private data copied, valid until acked),
//! `rdma_ack_cm_event`, `rdma_event_str`, and the waiting of synchronous
//! ids ([`complete`]).
//!
//! Taking an event is where rdma-core does its work, and so does this
//! library: a CONNECT_REQUEST makes the new id; an active RC
//! CONNECT_RESPONSE moves the id's QP to RTR and RTS, sends the RTU
//! (`CmEstablish`) and becomes ESTABLISHED (CONNECT_ERROR if that fails);
//! a REJECTED moves the QP to ERR; the answer to a multicast join
//! attaches the QP to the group (`mcast::answer`). Each delivered event is counted
//! against its id (a CONNECT_REQUEST against the listener) until acked.
//! A CONNECT_REQUEST nobody can take (its listener destroyed, its new id
//! not made) has its id destroyed at the daemon, which sends the REJ.

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use shm::cma::{CmEventMsg, CmEventType};
use shm::proto::Request;

use crate::channel::{Channel, Queued, Shared};
use crate::id::{self, Id, NewId, Peer};
use crate::registry::{self, Held};
use crate::sys::*;
use crate::util::{self, guard, ret, set_errno, Addr4};

/// The most private data an event carries.
pub const MAX_PRIVATE: usize = 256;

/// A delivered event: the C struct first, its id's counter and its
/// private data.
#[repr(C)]
pub struct EventBox {
    pub ev: rdma_cm_event,
    owner: *const Id,
    private: [u8; MAX_PRIVATE],
}

impl EventBox {
    fn new(id: *mut rdma_cm_id, event: CmEventType, status: i32, owner: &Id) -> Box<EventBox> {
        Box::new(EventBox {
            ev: rdma_cm_event {
                id,
                event: event as rdma_cm_event_type,
                status,
                ..Default::default()
            },
            owner,
            private: [0; MAX_PRIVATE],
        })
    }

    fn copy_private(&mut self, data: &[u8]) -> (*const std::ffi::c_void, u8) {
        let n = data.len().min(MAX_PRIVATE).min(255);
        self.private[..n].copy_from_slice(&data[..n]);
        if n == 0 {
            (std::ptr::null(), 0)
        } else {
            (self.private.as_ptr().cast(), n as u8)
        }
    }

    /// The connection parameters of an RC event.
    pub fn fill_conn(&mut self, m: &CmEventMsg) {
        let (p, n) = self.copy_private(&m.private_data);
        self.ev.param.conn = rdma_conn_param {
            private_data: p,
            private_data_len: n,
            responder_resources: m.conn.responder_resources,
            initiator_depth: m.conn.initiator_depth,
            flow_control: u8::from(m.conn.flow_control),
            retry_count: m.conn.retry_count,
            rnr_retry_count: m.conn.rnr_retry_count,
            srq: u8::from(m.conn.srq),
            qp_num: m.conn.qp_num,
        };
    }

    /// The datagram parameters of a UD event; `peer`: the address
    /// handle, QPN and Q_Key of the peer (a SIDR reply's ESTABLISHED).
    pub fn fill_ud(&mut self, m: &CmEventMsg, peer: bool) {
        let (p, n) = self.copy_private(&m.private_data);
        let mut ud = rdma_ud_param {
            private_data: p,
            private_data_len: n,
            ..Default::default()
        };
        if let (true, Some(path)) = (peer, m.path) {
            ud.ah_attr = crate::attrs::ah_attr(&path);
            ud.qp_num = m.conn.qp_num;
            ud.qkey = path.qkey;
        }
        self.ev.param.ud = ud;
    }

    fn deliver(self: Box<Self>, owner: &Id) -> *mut rdma_cm_event {
        owner.delivered();
        Box::into_raw(self).cast()
    }
}

/// Acks an event: frees it and counts it done for its id.
///
/// # Safety
/// `ev` is an event of ours, not acked yet, not used after.
pub unsafe fn ack(ev: *mut rdma_cm_event) {
    // SAFETY: the contract: boxed by deliver().
    let b = unsafe { Box::from_raw(ev.cast::<EventBox>()) };
    // SAFETY: the owner waits in rdma_destroy_id for this ack, so it is
    // alive.
    unsafe { &*b.owner }.acked();
}

/// Moves an id's QP to ERR (REJECTED, disconnect, failed accept); the
/// error of ibv_modify_qp.
pub fn qp_to_err(id: &Id) -> Result<(), i32> {
    let qp = id.qp();
    if qp.is_null() {
        return Ok(());
    }
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    // SAFETY: the id's live QP and our attributes.
    match unsafe { ibv_modify_qp(qp, &mut a, IBV_QP_STATE as c_int) } {
        0 => Ok(()),
        e => Err(e),
    }
}

/// A connection request nobody will take (its listener is gone, or the
/// library could not make its id): the daemon forgets the new id, which
/// sends the REJ.
pub fn orphan(m: &CmEventMsg) {
    if m.event != CmEventType::ConnectRequest || m.listener.is_none() {
        return;
    }
    registry::settled(registry::key(m.session, m.id));
    let session = crate::devices::get()
        .ok()
        .and_then(|d| d.by_session(m.session))
        .map(|(_, s)| s);
    if let Some(s) = session {
        let _ = s.call(Request::CmDestroyId { id: m.id });
    }
}

/// A CONNECT_REQUEST for `listener`: the new id, then the event.
fn connect_request(listener: &Held, m: &CmEventMsg) -> Option<*mut rdma_cm_event> {
    let child_key = registry::key(m.session, m.id);
    let found = crate::devices::get()
        .ok()
        .and_then(|d| d.by_session(m.session));
    let Some((dev, session)) = found else {
        // Not a session of ours any more (it broke): the listener's may
        // still name it.
        registry::settled(child_key);
        let st = listener.lock();
        let s = st
            .daemon_sessions()
            .into_iter()
            .find(|s| s.number == m.session);
        drop(st);
        if let Some(s) = s {
            let _ = s.call(Request::CmDestroyId { id: m.id });
        }
        return None;
    };
    let refuse = |why: &str| {
        if util::debug() {
            util::warn(&format!("refusing a connection request: {why}"));
        }
        registry::settled(child_key);
        let _ = session.call(Request::CmReject {
            id: m.id,
            private_data: Vec::new(),
            reason: None,
        });
        let _ = session.call(Request::CmDestroyId { id: m.id });
        None
    };
    let (sync, chan_ptr, req_channel, upstream) = {
        let st = listener.lock();
        // SAFETY: the listener's live channel.
        let reader = unsafe { &*st.chan_ptr }.reader.clone();
        (
            st.sync,
            st.chan_ptr,
            st.req_channel,
            reader.or_else(|| st.upstream.clone()),
        )
    };
    let made = id::create(
        NewId {
            channel: if sync { std::ptr::null_mut() } else { chan_ptr },
            context: listener.context(),
            ps: listener.ps(),
            qp_type: listener.qp_type(),
            daemon: Some((m.session, m.id)),
            source: registry::source_of(listener.key),
        },
        true,
    );
    let child_ptr = match made {
        Ok(p) => p,
        Err(_) => return refuse("no memory for the new id"),
    };
    // SAFETY: just made, not yet known to the application.
    let child = unsafe { &*child_ptr };
    // Its events that came before it was made wait beside the request:
    // they go to its own channel now.
    if let Some(was) = registry::settled(child_key) {
        let now = child.lock().channel.clone();
        if !Arc::ptr_eq(&was, &now) {
            was.move_events(child_key, &now);
        }
    }
    {
        let mut st = child.lock();
        if let Err(e) = child.attach(&mut st, dev) {
            drop(st);
            // SAFETY: ours, never handed out.
            unsafe { id::destroy(child_ptr) };
            return refuse(&format!("device {}: errno {e}", dev.name));
        }
        st.req_channel = req_channel;
        if sync {
            st.upstream = upstream;
        }
        st.session = Some(session.clone());
        st.resp_res = m.conn.responder_resources;
        st.init_depth = m.conn.initiator_depth;
        st.retry_count = m.conn.retry_count;
        st.rnr_retry = m.conn.rnr_retry_count;
        if let Some(path) = m.path {
            st.peer = Some(Peer { path, conn: m.conn });
            let local = Addr4 {
                ip: path.local_ip,
                port: path.local_port,
                v6: false,
            };
            let peer = Addr4 {
                ip: path.peer_ip,
                port: path.peer_port,
                v6: false,
            };
            child.set_route(&st, Some(local), Some(peer));
        }
    }
    let mut b = EventBox::new(child.cm(), m.event, m.status, listener);
    b.ev.listen_id = listener.cm();
    if child.is_ud() {
        b.fill_ud(m, false);
    } else {
        b.fill_conn(m);
    }
    Some(b.deliver(listener))
}

/// An active RC id's CONNECT_RESPONSE: with a QP, move it to RTS, send
/// the RTU and deliver ESTABLISHED (CONNECT_ERROR if any step fails);
/// without one, deliver CONNECT_RESPONSE for the application's
/// `rdma_establish`.
fn connect_response(id: &Held, m: &CmEventMsg) -> *mut rdma_cm_event {
    let mut st = id.lock();
    if let Some(path) = m.path {
        st.peer = Some(Peer { path, conn: m.conn });
    }
    st.rnr_retry = m.conn.rnr_retry_count;
    // Never more READs outstanding than the peer answers, and as many
    // answered as it may have outstanding (the kernel's CM: the REP's
    // initiator depth is our responder resources).
    st.init_depth = st.init_depth.min(m.conn.responder_resources);
    st.resp_res = m.conn.initiator_depth;
    let has_qp = !id.qp().is_null();
    let mut b = EventBox::new(id.cm(), m.event, m.status, id);
    b.fill_conn(m);
    if !has_qp {
        return b.deliver(id);
    }
    let session = st.session.clone();
    let moved = crate::qp::move_to_rts(id, &st).and_then(|()| match &session {
        Some(s) => s.call_ok(Request::CmEstablish { id: st.num }).map(|_| ()),
        None => Err(libc::EINVAL),
    });
    match moved {
        Ok(()) => b.ev.event = RDMA_CM_EVENT_ESTABLISHED,
        Err(e) => {
            // As rdma-core: the QP to ERR, no REJ, status -1.
            if util::debug() {
                util::warn(&format!("completing the connection failed: errno {e}"));
            }
            let _ = qp_to_err(id);
            st.connect_error = true;
            b.ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
            b.ev.status = -1;
        }
    }
    drop(st);
    b.deliver(id)
}

/// Turns a taken event into what the application gets (None: nothing
/// for it: the id is gone, the event moved to the id's channel, or
/// rdma-core would not deliver it).
fn process(own: &Arc<Shared>, item: Queued) -> Option<*mut rdma_cm_event> {
    let target = item.target();
    let Some(id) = registry::hold(target) else {
        if let Queued::Daemon(m) = item {
            if m.event == CmEventType::ConnectRequest {
                orphan(&m);
            } else if registry::is_pending(target) {
                // Its id is being made from its request: it moves there.
                own.push(Queued::Daemon(m));
            }
        }
        return None;
    };
    let on = id.lock().channel.clone();
    if !Arc::ptr_eq(&on, own) {
        on.push(item);
        return None;
    }
    let m = match item {
        Queued::Local { event, status, .. } => {
            return Some(EventBox::new(id.cm(), event, status, &id).deliver(&id));
        }
        Queued::Join { handle, .. } => {
            let (event, status, ud) = crate::mcast::answer(&id, handle)?;
            let mut b = EventBox::new(id.cm(), event, status, &id);
            b.ev.param.ud = ud;
            return Some(b.deliver(&id));
        }
        Queued::Daemon(m) => m,
    };
    let ud = id.is_ud();
    match m.event {
        CmEventType::ConnectRequest => connect_request(&id, &m),
        CmEventType::ConnectResponse => Some(connect_response(&id, &m)),
        CmEventType::Rejected | CmEventType::Disconnected if id.lock().connect_error => None,
        ev => {
            if ev == CmEventType::Rejected {
                let _ = qp_to_err(&id);
            }
            let mut b = EventBox::new(id.cm(), ev, m.status, &id);
            if ud {
                b.fill_ud(&m, ev == CmEventType::Established);
            } else {
                b.fill_conn(&m);
            }
            Some(b.deliver(&id))
        }
    }
}

/// Takes the next event of `channel` (for `want`: of that id) and
/// processes it; waits when `block`.
pub fn next(
    channel: &Arc<Shared>,
    want: Option<registry::Key>,
    block: bool,
) -> Result<*mut rdma_cm_event, i32> {
    loop {
        let item = channel.take(want, block)?;
        if let Some(ev) = process(channel, item) {
            return Ok(ev);
        }
    }
}

/// A synchronous id's wait for the event its call started (no-op for
/// others): acks the previous one, keeps the new one in `id->event`, and
/// fails as rdma-core does (REJECTED: ECONNREFUSED; a status: its errno;
/// DEVICE_REMOVAL: ENODEV).
pub fn complete(id: &Id) -> Result<(), i32> {
    let channel = {
        let mut st = id.lock();
        if !st.sync {
            return Ok(());
        }
        id.ack_kept_event(&mut st);
        st.channel.clone()
    };
    let ev = next(&channel, Some(id.key), true)?;
    id.keep_event(&mut id.lock(), ev);
    // SAFETY: the event we just made.
    let e = unsafe { *ev };
    match (e.event, e.status) {
        (RDMA_CM_EVENT_DEVICE_REMOVAL, _) => Err(libc::ENODEV),
        (_, 0) => Ok(()),
        (RDMA_CM_EVENT_REJECTED, _) => Err(libc::ECONNREFUSED),
        (_, s) if s < 0 => Err(-s),
        (_, s) => Err(s),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    guard(-1, || {
        // SAFETY: a live channel of ours or NULL.
        let Some(ch) = (unsafe { Channel::from_ptr(channel) }) else {
            return ret(Err(libc::EINVAL));
        };
        if event.is_null() {
            return ret(Err(libc::EINVAL));
        }
        let block = !ch.shared.nonblocking();
        match next(&ch.shared, None, block) {
            Ok(ev) => {
                // SAFETY: the caller's slot, checked non-NULL.
                unsafe { *event = ev };
                0
            }
            Err(e) => {
                set_errno(e);
                -1
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard(-1, || {
        if event.is_null() {
            return ret(Err(libc::EINVAL));
        }
        // SAFETY: an event of ours the application gives back.
        unsafe { ack(event) };
        0
    })
}

/// rdma-core's name of an event type.
pub fn event_name(event: rdma_cm_event_type) -> &'static CStrLit {
    match event {
        RDMA_CM_EVENT_ADDR_RESOLVED => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        RDMA_CM_EVENT_ADDR_ERROR => c"RDMA_CM_EVENT_ADDR_ERROR",
        RDMA_CM_EVENT_ROUTE_RESOLVED => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        RDMA_CM_EVENT_ROUTE_ERROR => c"RDMA_CM_EVENT_ROUTE_ERROR",
        RDMA_CM_EVENT_CONNECT_REQUEST => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        RDMA_CM_EVENT_CONNECT_RESPONSE => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        RDMA_CM_EVENT_CONNECT_ERROR => c"RDMA_CM_EVENT_CONNECT_ERROR",
        RDMA_CM_EVENT_UNREACHABLE => c"RDMA_CM_EVENT_UNREACHABLE",
        RDMA_CM_EVENT_REJECTED => c"RDMA_CM_EVENT_REJECTED",
        RDMA_CM_EVENT_ESTABLISHED => c"RDMA_CM_EVENT_ESTABLISHED",
        RDMA_CM_EVENT_DISCONNECTED => c"RDMA_CM_EVENT_DISCONNECTED",
        RDMA_CM_EVENT_DEVICE_REMOVAL => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        RDMA_CM_EVENT_MULTICAST_JOIN => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        RDMA_CM_EVENT_MULTICAST_ERROR => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        RDMA_CM_EVENT_ADDR_CHANGE => c"RDMA_CM_EVENT_ADDR_CHANGE",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    }
}

type CStrLit = std::ffi::CStr;

#[no_mangle]
pub extern "C" fn rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    event_name(event).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::mapped_gid;
    use shm::cma::{CmConnParams, CmPath};
    use std::net::Ipv4Addr;

    fn msg(event: CmEventType) -> CmEventMsg {
        CmEventMsg {
            session: 1,
            id: 2,
            listener: None,
            event,
            status: 0,
            private_data: (0..196u32).map(|i| i as u8).collect(),
            conn: CmConnParams {
                responder_resources: 4,
                initiator_depth: 3,
                flow_control: true,
                retry_count: 7,
                rnr_retry_count: 6,
                srq: false,
                qp_num: 0x1234,
            },
            path: Some(CmPath {
                local_ip: Ipv4Addr::new(10, 0, 0, 1),
                local_port: 1,
                peer_ip: Ipv4Addr::new(10, 0, 0, 2),
                peer_port: 2,
                peer_psn: 5,
                mtu: 1024,
                ack_timeout: 14,
                traffic_class: 0,
                qkey: RDMA_UDP_QKEY,
                telemetry: false,
            }),
        }
    }

    fn boxed() -> Box<EventBox> {
        Box::new(EventBox {
            ev: rdma_cm_event::default(),
            owner: std::ptr::null(),
            private: [0; MAX_PRIVATE],
        })
    }

    #[test]
    fn event_names_are_rdma_core_s() {
        let s = |e| event_name(e).to_str().unwrap();
        assert_eq!(
            s(RDMA_CM_EVENT_ADDR_RESOLVED),
            "RDMA_CM_EVENT_ADDR_RESOLVED"
        );
        assert_eq!(s(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED");
        assert_eq!(
            s(RDMA_CM_EVENT_TIMEWAIT_EXIT),
            "RDMA_CM_EVENT_TIMEWAIT_EXIT"
        );
        assert_eq!(s(16), "UNKNOWN EVENT");
        assert_eq!(s(99), "UNKNOWN EVENT");
    }

    #[test]
    fn event_types_are_numbered_as_rdma_cma_h() {
        assert_eq!(
            CmEventType::ConnectRequest as u32,
            RDMA_CM_EVENT_CONNECT_REQUEST
        );
        assert_eq!(CmEventType::Established as u32, RDMA_CM_EVENT_ESTABLISHED);
        assert_eq!(
            CmEventType::TimewaitExit as u32,
            RDMA_CM_EVENT_TIMEWAIT_EXIT
        );
    }

    #[test]
    fn conn_events_carry_a_copy_of_the_private_data_and_the_peer_s_params() {
        let mut b = boxed();
        let m = msg(CmEventType::Established);
        b.fill_conn(&m);
        // SAFETY: the conn member was just written.
        let c = unsafe { b.ev.param.conn };
        assert_eq!(c.private_data_len, 196);
        // SAFETY: points into the box's 256 bytes.
        let data = unsafe { std::slice::from_raw_parts(c.private_data.cast::<u8>(), 196) };
        assert_eq!(data, &m.private_data[..]);
        assert_eq!((c.responder_resources, c.initiator_depth), (4, 3));
        assert_eq!(
            (c.flow_control, c.retry_count, c.rnr_retry_count),
            (1, 7, 6)
        );
        assert_eq!(c.qp_num, 0x1234);
    }

    #[test]
    fn no_private_data_is_a_null_pointer() {
        let mut b = boxed();
        let m = CmEventMsg {
            private_data: vec![],
            ..msg(CmEventType::Established)
        };
        b.fill_conn(&m);
        // SAFETY: just written.
        let c = unsafe { b.ev.param.conn };
        assert!(c.private_data.is_null());
        assert_eq!(c.private_data_len, 0);
    }

    #[test]
    fn a_sidr_reply_gives_the_peer_s_address_handle_qpn_and_qkey() {
        let mut b = boxed();
        b.fill_ud(&msg(CmEventType::Established), true);
        // SAFETY: the ud member was just written.
        let u = unsafe { b.ev.param.ud };
        assert_eq!((u.qp_num, u.qkey), (0x1234, RDMA_UDP_QKEY));
        assert_eq!(u.ah_attr.is_global, 1);
        assert_eq!(u.ah_attr.port_num, 1);
        assert_eq!(u.ah_attr.grh.hop_limit, 64);
        // SAFETY: GID bytes.
        let g = unsafe { u.ah_attr.grh.dgid.raw };
        assert_eq!(g, mapped_gid(Ipv4Addr::new(10, 0, 0, 2)));
        let mut req = boxed();
        req.fill_ud(&msg(CmEventType::ConnectRequest), false);
        // SAFETY: as above.
        let u = unsafe { req.ev.param.ud };
        assert_eq!((u.qp_num, u.qkey, u.ah_attr.is_global), (0, 0, 0));
        assert_eq!(u.private_data_len, 196);
    }
}
