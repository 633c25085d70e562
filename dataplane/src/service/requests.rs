//! The control path: one function per request of the protocol
//! (`shm::proto::Request`), each answering a reply or a typed error that
//! names the bad value. Requests only touch the requesting application's
//! own objects; handles of other applications are unknown to it.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::sys::eventfd::{EfdFlags, EventFd};
use shm::abi::{self, Consumer, Producer, RingLayout};
use shm::proto::{
    DeviceInfo, ErrorKind, ErrorReply, Modify, MrAccess, PortInfo, QpInfo, Reply, Request,
};
use shm::segment::Segment;
use transport::mr::Access;
use transport::rc::{
    CcMode, PathMtu, QpAccess, QpState, QpUpdate, Qpn, RtrAttr, RtsAttr, SendLimits,
};

use super::alloc::SegmentAlloc;
use super::control::ConnId;
use super::memory::AppMemory;
use super::{App, CqRt, QpRt, RqRt, Service, SrqRt};

type Answer = Result<(Reply, Vec<OwnedFd>), ErrorReply>;

fn err(kind: ErrorKind, msg: impl Into<String>) -> ErrorReply {
    ErrorReply::new(kind, msg)
}

fn done(r: Reply) -> Answer {
    Ok((r, Vec::new()))
}

/// Why an eventfd pair could not be made: the system call and its error.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
struct NoEventFd {
    call: &'static str,
    source: std::io::Error,
}

/// A non-blocking eventfd the daemon keeps, and a descriptor of it for
/// the application.
fn eventfd_pair() -> Result<(EventFd, OwnedFd), NoEventFd> {
    let ev = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).map_err(|e| {
        NoEventFd {
            call: "eventfd",
            source: e.into(),
        }
    })?;
    let theirs = ev
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| NoEventFd {
            call: "dup",
            source,
        })?;
    Ok((ev, theirs))
}

/// READs and atomics a QP has outstanding, each way, as devices report it.
const MAX_RD_ATOM: u32 = 128;

/// Smallest segment an application may ask for.
const MIN_SHM: u64 = 1 << 20;
/// Deepest SQ or CQ ring.
const MAX_DEPTH: u32 = 1 << 14;

fn engine_access(a: MrAccess) -> Access {
    Access {
        local_write: a.local_write,
        remote_write: a.remote_write,
        remote_read: a.remote_read,
        remote_atomic: a.remote_atomic,
    }
}

fn depth_ok(what: &str, d: u32) -> Result<(), ErrorReply> {
    if !d.is_power_of_two() || d > MAX_DEPTH {
        return Err(err(
            ErrorKind::InvalidArgument,
            format!("{what} depth {d} is not a power of two in 1..={MAX_DEPTH}"),
        ));
    }
    Ok(())
}

/// Zeroes `[off, off + len)` of a segment (a reused block may hold an
/// earlier object's bytes) without a buffer of that size.
fn zero(seg: &Segment, off: u64, len: u64) {
    const CHUNK: usize = 64 << 10;
    static ZEROS: [u8; CHUNK] = [0; CHUNK];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHUNK as u64) as usize;
        seg.write((off + done) as usize, &ZEROS[..n]);
        done += n as u64;
    }
}

impl App {
    /// A zeroed ring of `depth` slots of `T` in the segment: its block
    /// (offset, bytes) and layout.
    fn alloc_ring<T>(
        &mut self,
        what: &str,
        depth: u32,
    ) -> Result<((u64, u64), RingLayout), ErrorReply> {
        depth_ok(what, depth)?;
        let slot = std::mem::size_of::<T>();
        let bytes = RingLayout::bytes(depth, slot) as u64;
        let off = self.alloc.alloc(bytes).ok_or_else(|| {
            err(
                ErrorKind::NoSpace,
                format!("no {bytes} bytes left for a {what} of {depth}"),
            )
        })?;
        zero(&self.seg, off, bytes);
        let layout = RingLayout::new(off as usize, depth, slot)
            .map_err(|e| err(ErrorKind::InvalidArgument, e.to_string()))?;
        Ok(((off, bytes), layout))
    }
}

/// Where a memory region's bytes are.
#[derive(Debug, Clone, Copy)]
pub(super) enum MrBacking {
    /// In the application's segment, allocated by the daemon.
    Segment { off: u64, len: u64 },
    /// The application's own buffer, its memfds mapped at their own slot
    /// of the host's memory.
    Mapped { slot: usize },
}

/// A registered region of an application.
#[derive(Debug, Clone, Copy)]
pub(super) struct MrRt {
    pub pd: u32,
    pub backing: MrBacking,
}

impl Service {
    /// `Trace`: a fresh trace of up to `capacity` stamps (0 stops it;
    /// what it took stays readable).
    fn start_trace(&mut self, capacity: u32) -> Answer {
        if capacity > super::trace::MAX_STAMPS {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "trace capacity {capacity}: at most {} stamps",
                    super::trace::MAX_STAMPS
                ),
            ));
        }
        if capacity == 0 {
            self.tracing = false;
        } else {
            self.trace = super::trace::Trace::new(capacity);
            self.tracing = true;
        }
        done(Reply::Done)
    }

    /// `TraceStamps`: a page of the trace from stamp `from` on.
    fn trace_stamps(&mut self, from: u64) -> Answer {
        let t = &self.trace;
        let stamps = t.page(usize::try_from(from).unwrap_or(usize::MAX));
        done(Reply::TraceStamps {
            tsc_hz: self.clock.hz(),
            total: t.len() as u64,
            dropped: t.dropped,
            next: from + (stamps.len() / 2) as u64,
            stamps,
        })
    }

    pub(super) fn handle(&mut self, conn: ConnId, req: Request, fds: Vec<OwnedFd>) -> Answer {
        if let Request::OpenDevice { device, shm_bytes } = req {
            return self.open_device(conn, &device, shm_bytes);
        }
        if let Request::ListDevices = req {
            // A device sharded over engines is listed once, by shard 0.
            let list = (0..self.hosts.len())
                .filter(|&h| self.hosts[h].qp_shard == 0)
                .map(|h| self.device_info(h))
                .collect();
            return done(Reply::Devices(list));
        }
        if let Request::Stats = req {
            let json = self
                .snapshot()
                .listed_json()
                .map_err(|e| err(ErrorKind::Malformed, e.to_string()))?;
            return done(Reply::Stats { json });
        }
        if let Request::Trace { capacity } = req {
            return self.start_trace(capacity);
        }
        if let Request::TraceStamps { from } = req {
            return self.trace_stamps(from);
        }
        if Self::is_cm_request(&req) {
            return self.cm_request(conn, req);
        }
        if !self.apps.contains_key(&conn) {
            return Err(err(
                ErrorKind::NotOpen,
                "open a device (OpenDevice) before any other request",
            ));
        }
        match req {
            Request::OpenDevice { .. }
            | Request::ListDevices
            | Request::Stats
            | Request::Trace { .. }
            | Request::TraceStamps { .. }
            | Request::CmChannel
            | Request::CmOpen { .. }
            | Request::CmBind { .. }
            | Request::CmListen { .. }
            | Request::CmResolveAddr { .. }
            | Request::CmConnect(_)
            | Request::CmAccept(_)
            | Request::CmEstablish { .. }
            | Request::CmReject { .. }
            | Request::CmMigrate { .. }
            | Request::CmDisconnect { .. }
            | Request::CmDestroyId { .. } => {
                unreachable!("handled above")
            }
            Request::AllocPd => {
                let pd = self.next_pd;
                self.next_pd = self.next_pd.wrapping_add(1).max(1);
                self.app(conn).pds.push(pd);
                done(Reply::Pd { pd })
            }
            Request::DeallocPd { pd } => self.dealloc_pd(conn, pd),
            Request::RegMr { pd, len, access } => self.reg_mr(conn, pd, len, access),
            Request::RegUserMr {
                pd,
                va,
                len,
                access,
                start,
                pieces,
            } => self.reg_user_mr(conn, pd, (va, len, access), start, &pieces, &fds),
            Request::DeregMr { lkey } => self.dereg_mr(conn, lkey),
            Request::CreateCq { depth } => self.create_cq(conn, depth),
            Request::DestroyCq { cq } => self.destroy_cq(conn, cq),
            Request::CreateQp {
                pd,
                cq,
                recv_cq,
                depth,
                rq_depth,
                srq,
                qp_type,
            } => {
                let cqs = (cq, recv_cq.unwrap_or(cq));
                self.create_qp(conn, pd, cqs, (depth, rq_depth), srq, qp_type)
            }
            Request::CreateAh {
                pd,
                dest_ip,
                traffic_class,
            } => self.create_ah(conn, pd, dest_ip, traffic_class),
            Request::AttachMcast { qpn, group } => {
                let host = self.own_qp(conn, qpn)?;
                if self.cfg.qp_shards > 1 {
                    // A group's datagrams reach one shard's engine only.
                    return Err(err(
                        ErrorKind::InvalidArgument,
                        format!(
                            "multicast on a device whose QPs are sharded over {} engines is not supported (qp_shards = 1 for multicast)",
                            self.cfg.qp_shards
                        ),
                    ));
                }
                let e = self.hosts[host].nic.engine_mut();
                e.attach_mcast(qpn, group).map_err(|e| {
                    let kind = match e {
                        transport::rc::RcError::TooManyGroups(_)
                        | transport::rc::RcError::GroupFull { .. } => ErrorKind::NoSpace,
                        _ => ErrorKind::InvalidArgument,
                    };
                    err(kind, e.to_string())
                })?;
                done(Reply::Done)
            }
            Request::DetachMcast { qpn, group } => {
                let host = self.own_qp(conn, qpn)?;
                let e = self.hosts[host].nic.engine_mut();
                e.detach_mcast(qpn, group)
                    .map_err(|e| err(ErrorKind::InvalidArgument, e.to_string()))?;
                done(Reply::Done)
            }
            Request::DestroyAh { ah } => {
                let a = self.app(conn);
                let Some(i) = a.ahs.iter().position(|x| x.0 == ah) else {
                    return Err(err(
                        ErrorKind::InvalidArgument,
                        format!("no address handle {ah} on this device"),
                    ));
                };
                let (ah, pd) = a.ahs.swap_remove(i);
                let host = a.host;
                let _ = self.hosts[host].nic.engine_mut().destroy_ah(ah, pd);
                done(Reply::Done)
            }
            Request::CreateSrq { pd, depth } => self.create_srq(conn, pd, depth),
            Request::ModifySrq { srq, limit } => {
                let host = self.own_srq(conn, srq)?;
                self.hosts[host]
                    .nic
                    .engine_mut()
                    .modify_srq_limit(srq, limit)
                    .map_err(|e| err(ErrorKind::InvalidArgument, e.to_string()))?;
                done(Reply::Done)
            }
            Request::DestroySrq { srq } => self.destroy_srq(conn, srq),
            Request::QuerySrq { srq } => {
                let host = self.own_srq(conn, srq)?;
                let h = &mut self.hosts[host];
                let e = h.nic.engine_mut();
                let bad = |e: transport::rc::RcError| err(ErrorKind::NoSuchSrq, e.to_string());
                let wqes = e.srq_len(srq).map_err(bad)? as u32;
                let limit = e.srq_limit(srq).map_err(bad)?;
                let limit_events = h.srqs.get(&srq).map_or(0, |r| r.limit_events);
                done(Reply::SrqInfo(shm::proto::SrqInfo {
                    wqes,
                    limit,
                    limit_events,
                }))
            }
            Request::AsyncEventFd => {
                let (ev, theirs) =
                    eventfd_pair().map_err(|e| err(ErrorKind::NoSpace, e.to_string()))?;
                let a = self.app(conn);
                if !a.events.is_empty() {
                    let _ = ev.write(1);
                }
                a.event_fd = Some(ev);
                Ok((Reply::Done, vec![theirs]))
            }
            Request::AsyncEvents => {
                let a = self.app(conn);
                if let Some(ev) = &a.event_fd {
                    let _ = ev.read();
                }
                done(Reply::AsyncEvents(a.events.drain(..).collect()))
            }
            Request::ModifyQp { qpn, modify } => self.modify_qp(conn, qpn, modify),
            Request::DestroyQp { qpn } => self.destroy_qp(conn, qpn),
            Request::QueryQp { qpn } => self.query_qp(conn, qpn),
            Request::SetQpCc { qpn, cc } => self.set_qp_cc(conn, qpn, &cc),
            Request::SetQpFeedbackKey { qpn, key } => self.set_qp_feedback_key(conn, qpn, key),
            Request::QueryPort => {
                let host = self.app(conn).host;
                let h = &self.hosts[host];
                let st = crate::host_port::link(h.nic.port())
                    .port_stats()
                    .unwrap_or_default();
                done(Reply::PortInfo(PortInfo {
                    link_up: nic::FramePort::link_up(h.nic.port()),
                    rx_packets: st.ipackets,
                    tx_packets: st.opackets,
                    rx_bytes: st.ibytes,
                    tx_bytes: st.obytes,
                }))
            }
        }
    }

    fn app(&mut self, conn: ConnId) -> &mut App {
        self.apps.get_mut(&conn).expect("checked by handle")
    }

    fn open_device(&mut self, conn: ConnId, name: &str, bytes: u64) -> Answer {
        if self.apps.contains_key(&conn) {
            return Err(err(
                ErrorKind::AlreadyOpen,
                "this connection has a device open",
            ));
        }
        // Of the device's QP shards this lcore runs, the one serving the
        // fewest applications.
        let serving = |h: usize| self.apps.values().filter(|a| a.host == h).count();
        let host = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].spec.name == name)
            .min_by_key(|&h| serving(h));
        let Some(host) = host else {
            let names: Vec<&str> = self.peers.iter().map(|h| h.name.as_str()).collect();
            return Err(err(
                ErrorKind::NoSuchDevice,
                format!("no device {name:?} (this daemon has {names:?})"),
            ));
        };
        if bytes < MIN_SHM || bytes > self.cfg.max_shm_bytes {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "shm_bytes {bytes} outside {MIN_SHM}..={} (max_shm_bytes in the config)",
                    self.cfg.max_shm_bytes
                ),
            ));
        }
        let bell = self.wake.bell_for_app().map_err(|e| {
            err(
                ErrorKind::NoSpace,
                format!("the lcore's wake-up eventfd: {e}"),
            )
        })?;
        let (seg, fd) = Segment::create(&format!("rnic-app-{conn}"), bytes, self.cfg.hugepages)
            .map_err(|e| err(ErrorKind::NoSpace, e.to_string()))?;
        let seg = Arc::new(seg);
        let slot = self.hosts[host]
            .nic
            .engine_mut()
            .mem_mut()
            .attach(seg.clone());
        let mut alloc = SegmentAlloc::new(seg.len() as u64);
        let bells = alloc
            .alloc(abi::Doorbells::BYTES as u64)
            .expect("a fresh segment of MIN_SHM bytes holds the doorbells");
        zero(&seg, bells, abi::Doorbells::BYTES as u64);
        let info = DeviceInfo {
            shm_bytes: seg.len() as u64,
            hugepages: seg.hugepages(),
            doorbells: Some(bells),
            ..self.device_info(host)
        };
        self.apps.insert(
            conn,
            App {
                host,
                slot,
                alloc,
                bells: abi::Doorbells {
                    offset: bells as usize,
                },
                seg,
                pds: Vec::new(),
                mrs: Default::default(),
                cqs: Default::default(),
                qps: Vec::new(),
                srqs: Vec::new(),
                ahs: Vec::new(),
                next_cq: 1,
                events: VecDeque::new(),
                event_fd: None,
                last_rung: 0,
            },
        );
        self.counters.apps_opened += 1;
        Ok((Reply::DeviceOpened(info), vec![fd, bell]))
    }

    /// What an application sees of host `host` (no segment yet).
    fn device_info(&self, host: usize) -> DeviceInfo {
        let h = &self.hosts[host];
        DeviceInfo {
            name: h.spec.name.clone(),
            ip: h.spec.ip,
            mac: h.spec.mac.0,
            max_mtu: self.cfg.max_mtu.bytes(),
            shm_bytes: 0,
            hugepages: false,
            backend: h.driver.clone(),
            zero_copy_tx_min: super::zero_copy_min(&self.cfg, &h.driver).map(|m| m as u32),
            cc: self.cfg.cc.name().to_string(),
            line_gbps: (self.cfg.line_rate_bps / 1_000_000_000) as u32,
            caps: shm::proto::DeviceCaps {
                max_send_sge: shm::abi::WQE_MAX_SGE as u32,
                max_recv_sge: shm::abi::RECV_WQE_MAX_SGE as u32,
                max_inline_data: transport::rc::MAX_INLINE_DATA as u32,
                // The engine takes up to 255, but applications such as
                // perftest hand this value to the peer's max_rd_atomic,
                // and rxe accepts at most 128 there.
                max_qp_rd_atom: MAX_RD_ATOM,
                max_qp_wr: MAX_DEPTH.min(transport::rc::MAX_SEND_WR as u32),
                max_srq_wr: MAX_DEPTH.min(transport::rc::MAX_RECV_WR as u32),
                atomic_hca: true,
                // A QP shard holds its share of the device's QPNs.
                max_qp: h.nic.engine().config().qpns.max_qps() as u32,
                max_cqe: MAX_DEPTH,
                max_mr: transport::mr::MAX_MRS as u32,
                max_srq: transport::rc::MAX_SRQS as u32,
                max_mr_size: self.cfg.max_shm_bytes,
            },
            doorbells: None,
        }
    }

    fn own_pd(&mut self, conn: ConnId, pd: u32) -> Result<(), ErrorReply> {
        if self.app(conn).pds.contains(&pd) {
            Ok(())
        } else {
            Err(err(
                ErrorKind::NoSuchPd,
                format!("no PD {pd} on this device"),
            ))
        }
    }

    fn dealloc_pd(&mut self, conn: ConnId, pd: u32) -> Answer {
        self.own_pd(conn, pd)?;
        let host = self.app(conn).host;
        let used_by_qp = self.hosts[host]
            .qps
            .values()
            .any(|q| q.app == conn && q.pd == pd);
        let a = self.app(conn);
        if used_by_qp || a.mrs.values().any(|m| m.pd == pd) || a.ahs.iter().any(|a| a.1 == pd) {
            return Err(err(
                ErrorKind::Busy,
                format!("PD {pd} still has memory regions, QPs or address handles"),
            ));
        }
        a.pds.retain(|&p| p != pd);
        done(Reply::Done)
    }

    fn reg_mr(&mut self, conn: ConnId, pd: u32, len: u64, access: MrAccess) -> Answer {
        self.own_pd(conn, pd)?;
        let a = self.app(conn);
        if len == 0 || len > a.seg.len() as u64 {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "region of {len} bytes (1..={} fits the segment)",
                    a.seg.len()
                ),
            ));
        }
        let Some(off) = a.alloc.alloc(len) else {
            return Err(err(
                ErrorKind::NoSpace,
                format!(
                    "no {len} bytes left in the segment ({} free)",
                    a.alloc.free_bytes()
                ),
            ));
        };
        zero(&a.seg, off, len);
        let (host, slot) = (a.host, a.slot);
        let va = AppMemory::va(slot, off);
        let keys =
            self.hosts[host]
                .nic
                .engine_mut()
                .register_mr_in(pd, va, len, engine_access(access));
        let a = self.app(conn);
        match keys {
            Ok(k) => {
                let backing = MrBacking::Segment { off, len };
                a.mrs.insert(k.lkey, MrRt { pd, backing });
                done(Reply::Mr {
                    lkey: k.lkey,
                    rkey: k.rkey,
                    va,
                    offset: off,
                    len,
                })
            }
            Err(e) => {
                a.alloc.release(off, len);
                Err(err(ErrorKind::NoSpace, e.to_string()))
            }
        }
    }

    /// Maps the memfds that now hold an application's buffer and
    /// registers the buffer at its own address.
    fn reg_user_mr(
        &mut self,
        conn: ConnId,
        pd: u32,
        (va, len, access): (u64, u64, MrAccess),
        start: u64,
        pieces: &[shm::proto::MapPiece],
        fds: &[OwnedFd],
    ) -> Answer {
        self.own_pd(conn, pd)?;
        let bad = |m: String| Err(err(ErrorKind::InvalidArgument, m));
        if pieces.is_empty() || pieces.len() > shm::proto::MAX_FDS {
            return bad(format!(
                "{} pieces (1..={} per region)",
                pieces.len(),
                shm::proto::MAX_FDS
            ));
        }
        let mut list = Vec::with_capacity(pieces.len());
        let mut total = 0u64;
        for p in pieces {
            let Some(fd) = fds.get(p.fd as usize) else {
                return bad(format!(
                    "piece names descriptor {} but {} came with the request",
                    p.fd,
                    fds.len()
                ));
            };
            if p.len == 0 || p.len % 4096 != 0 || p.offset % 4096 != 0 {
                return bad(format!(
                    "piece of {} bytes at offset {} is not page-aligned",
                    p.len, p.offset
                ));
            }
            total = total.saturating_add(p.len);
            list.push((fd.as_fd(), p.offset, p.len as usize));
        }
        if len == 0 || start.checked_add(len).is_none_or(|end| end > total) {
            return bad(format!(
                "region of {len} bytes at {start} does not fit the {total} bytes mapped"
            ));
        }
        if total > self.cfg.max_shm_bytes {
            return bad(format!(
                "region of {total} bytes (at most {}, max_shm_bytes in the config)",
                self.cfg.max_shm_bytes
            ));
        }
        let seg = Segment::map_pieces(&list).map_err(|e| err(ErrorKind::NoSpace, e.to_string()))?;
        let host = self.app(conn).host;
        let e = self.hosts[host].nic.engine_mut();
        let slot = e.mem_mut().attach(Arc::new(seg));
        let dev = AppMemory::va(slot, start);
        match e.register_mr_at(pd, va, len, engine_access(access), dev) {
            Ok(k) => {
                let backing = MrBacking::Mapped { slot };
                self.app(conn).mrs.insert(k.lkey, MrRt { pd, backing });
                done(Reply::Mr {
                    lkey: k.lkey,
                    rkey: k.rkey,
                    va,
                    offset: 0,
                    len,
                })
            }
            Err(e) => {
                self.hosts[host].nic.engine_mut().mem_mut().detach(slot);
                Err(err(ErrorKind::NoSpace, e.to_string()))
            }
        }
    }

    fn dereg_mr(&mut self, conn: ConnId, lkey: u32) -> Answer {
        let a = self.app(conn);
        let Some(mr) = a.mrs.remove(&lkey) else {
            return Err(err(
                ErrorKind::NoSuchMr,
                format!("no region with L_Key {lkey:#x}"),
            ));
        };
        let host = a.host;
        if let MrBacking::Segment { off, len } = mr.backing {
            a.alloc.release(off, len);
        }
        let e = self.hosts[host].nic.engine_mut();
        let _ = e.deregister_mr(lkey);
        if let MrBacking::Mapped { slot } = mr.backing {
            e.mem_mut().detach(slot);
        }
        done(Reply::Done)
    }

    fn create_cq(&mut self, conn: ConnId, depth: u32) -> Answer {
        let a = self.app(conn);
        let ((off, bytes), layout) = a.alloc_ring::<abi::Cqe>("CQ", depth)?;
        let (event, theirs) = match eventfd_pair() {
            Ok(f) => f,
            Err(e) => {
                a.alloc.release(off, bytes);
                return Err(err(ErrorKind::NoSpace, e.to_string()));
            }
        };
        let cq = a.next_cq;
        a.next_cq += 1;
        let seg = a.seg.clone();
        let slot = self.cqs.insert(CqRt {
            app: conn,
            id: cq,
            seg,
            ring: Producer::new(layout),
            event,
            backlog: VecDeque::new(),
            block: (off, bytes),
            qps: 0,
            wake_owed: false,
            owed_solicited: false,
        });
        self.app(conn).cqs.insert(cq, slot);
        Ok((
            Reply::Cq {
                cq,
                offset: off,
                depth,
            },
            vec![theirs],
        ))
    }

    fn destroy_cq(&mut self, conn: ConnId, cq: u32) -> Answer {
        let found = self.app(conn).cqs.get(&cq).copied();
        let Some((slot, c)) = found.and_then(|s| Some((s, self.cqs.get(s)?))) else {
            return Err(err(
                ErrorKind::NoSuchCq,
                format!("no CQ {cq} on this device"),
            ));
        };
        if c.qps > 0 {
            return Err(err(
                ErrorKind::Busy,
                format!("CQ {cq} still serves {} QPs", c.qps),
            ));
        }
        let c = self.cqs.remove(slot).expect("found");
        self.pending.retain(|&s| s != slot);
        let a = self.app(conn);
        a.cqs.remove(&cq);
        a.alloc.release(c.block.0, c.block.1);
        done(Reply::Done)
    }

    /// An address handle to `dest_ip`: its MAC from the neighbour table
    /// (or the zero MAC, which the pipeline resolves by ARP when a
    /// datagram goes).
    fn create_ah(
        &mut self,
        conn: ConnId,
        pd: u32,
        dest_ip: std::net::Ipv4Addr,
        traffic_class: Option<u8>,
    ) -> Answer {
        self.own_pd(conn, pd)?;
        if dest_ip.is_unspecified() || dest_ip.is_broadcast() {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("an address handle to {dest_ip} reaches no one"),
            ));
        }
        let host = self.app(conn).host;
        let attr = transport::rc::AhAttr {
            pd,
            dest_ip,
            dest_mac: self.neighbour(host, dest_ip),
            dscp: traffic_class.map(|tc| tc >> 2),
            // (Samples to a group would be echoed by every member.)
            telemetry: !dest_ip.is_multicast() && self.speaks_telemetry(dest_ip),
        };
        let ah = self.hosts[host]
            .nic
            .engine_mut()
            .create_ah(attr)
            .map_err(|e| err(ErrorKind::NoSpace, e.to_string()))?;
        self.app(conn).ahs.push((ah, pd));
        done(Reply::Ah { ah })
    }

    fn create_qp(
        &mut self,
        conn: ConnId,
        pd: u32,
        (cq, recv_cq): (u32, u32),
        (depth, rq_depth): (u32, u32),
        srq: Option<u32>,
        qp_type: shm::proto::QpType,
    ) -> Answer {
        self.own_pd(conn, pd)?;
        if let Some(srq) = srq {
            self.own_srq(conn, srq)?;
        }
        let a = self.app(conn);
        let slot_of = |c: u32| {
            a.cqs
                .get(&c)
                .copied()
                .ok_or_else(|| err(ErrorKind::NoSuchCq, format!("no CQ {c} on this device")))
        };
        let (cq, recv_cq) = (slot_of(cq)?, slot_of(recv_cq)?);
        let rq_depth = if srq.is_some() { 0 } else { rq_depth };
        let ((off, bytes), layout) = a.alloc_ring::<abi::Wqe>("send queue", depth)?;
        let rq = if rq_depth > 0 {
            match a.alloc_ring::<abi::RecvWqe>("receive queue", rq_depth) {
                Ok((block, layout)) => Some(RqRt {
                    ring: Consumer::new(layout),
                    block,
                }),
                Err(e) => {
                    a.alloc.release(off, bytes);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let host = a.host;
        let now = self.clock.now_ns();
        let init = transport::rc::QpInit {
            pd,
            max_send_wr: depth as usize,
            max_recv_wr: rq_depth.max(1) as usize,
            srq,
            service: match qp_type {
                shm::proto::QpType::Rc => transport::wire::Service::Rc,
                shm::proto::QpType::Uc => transport::wire::Service::Uc,
                shm::proto::QpType::Ud => transport::wire::Service::Ud,
            },
        };
        let qpn = match self.hosts[host].nic.engine_mut().create_qp_with(init, now) {
            Ok(q) => q,
            Err(e) => {
                let a = self.app(conn);
                a.alloc.release(off, bytes);
                if let Some(r) = rq {
                    a.alloc.release(r.block.0, r.block.1);
                }
                return Err(err(ErrorKind::NoSpace, e.to_string()));
            }
        };
        let a = self.app(conn);
        a.qps.push(qpn);
        for slot in [cq, recv_cq] {
            self.cqs.get_mut(slot).expect("checked").qps += 1;
        }
        let rq_offset = rq.as_ref().map_or(0, |r| r.block.0);
        // Watched from the start; parked once idle.
        self.hosts[host].active.push(qpn);
        self.hosts[host].qps.insert(
            qpn,
            QpRt {
                app: conn,
                seg: self.apps[&conn].seg.clone(),
                cq,
                recv_cq,
                pd,
                sq: Consumer::new(layout),
                wqe: abi::Wqe::empty(),
                ring: (off, bytes),
                rq,
                broken: false,
                sq_paused: false,
                cc_explicit: false,
                feedback_key: None,
                parked: false,
                busy: false,
                idle: 0,
            },
        );
        done(Reply::Qp {
            qpn,
            sq_offset: off,
            depth,
            rq_offset,
            rq_depth,
        })
    }

    fn own_srq(&mut self, conn: ConnId, srq: u32) -> Result<usize, ErrorReply> {
        let a = self.app(conn);
        if a.srqs.contains(&srq) {
            Ok(a.host)
        } else {
            Err(err(
                ErrorKind::NoSuchSrq,
                format!("no shared receive queue {srq} on this device"),
            ))
        }
    }

    fn create_srq(&mut self, conn: ConnId, pd: u32, depth: u32) -> Answer {
        self.own_pd(conn, pd)?;
        let a = self.app(conn);
        let ((off, bytes), layout) = a.alloc_ring::<abi::RecvWqe>("shared receive queue", depth)?;
        let host = a.host;
        let srq = match self.hosts[host]
            .nic
            .engine_mut()
            .create_srq(pd, depth as usize)
        {
            Ok(s) => s,
            Err(e) => {
                self.app(conn).alloc.release(off, bytes);
                return Err(err(ErrorKind::NoSpace, e.to_string()));
            }
        };
        self.app(conn).srqs.push(srq);
        let seg = self.apps[&conn].seg.clone();
        self.hosts[host].srqs.insert(
            srq,
            SrqRt {
                app: conn,
                seg,
                ring: RqRt {
                    ring: Consumer::new(layout),
                    block: (off, bytes),
                },
                broken: false,
                limit_events: 0,
            },
        );
        done(Reply::Srq {
            srq,
            offset: off,
            depth,
        })
    }

    fn destroy_srq(&mut self, conn: ConnId, srq: u32) -> Answer {
        let host = self.own_srq(conn, srq)?;
        self.hosts[host]
            .nic
            .engine_mut()
            .destroy_srq(srq)
            .map_err(|e| err(ErrorKind::Busy, e.to_string()))?;
        let rt = self.hosts[host].srqs.remove(&srq);
        let a = self.app(conn);
        a.srqs.retain(|&s| s != srq);
        if let Some(rt) = rt {
            a.alloc.release(rt.ring.block.0, rt.ring.block.1);
        }
        done(Reply::Done)
    }

    fn own_qp(&mut self, conn: ConnId, qpn: Qpn) -> Result<usize, ErrorReply> {
        let a = self.app(conn);
        if a.qps.contains(&qpn) {
            Ok(a.host)
        } else {
            Err(err(
                ErrorKind::NoSuchQp,
                format!("no QP {qpn:#x} on this device"),
            ))
        }
    }

    fn modify_qp(&mut self, conn: ConnId, qpn: Qpn, m: Modify) -> Answer {
        let host = self.own_qp(conn, qpn)?;
        let bad = |e: transport::rc::RcError| err(ErrorKind::InvalidArgument, e.to_string());
        let r = match m {
            Modify::Init {
                remote_write,
                remote_read,
                remote_atomic,
                qkey,
            } => {
                let e = self.hosts[host].nic.engine_mut();
                if let Some(q) = qkey {
                    e.set_qp_qkey(qpn, q).map_err(bad)?;
                }
                let access = QpAccess {
                    remote_write,
                    remote_read,
                    remote_atomic,
                };
                e.modify_to_init(qpn, access)
            }
            Modify::UdRtr => {
                let mtu = self.cfg.max_mtu;
                self.hosts[host].nic.engine_mut().modify_ud_to_rtr(qpn, mtu)
            }
            Modify::UdRts { sq_psn } => self.hosts[host]
                .nic
                .engine_mut()
                .modify_ud_to_rts(qpn, sq_psn),
            Modify::Rtr {
                mtu,
                dest_qpn,
                dest_ip,
                rq_psn,
                max_dest_rd_atomic,
                min_rnr_timer,
                traffic_class,
            } => {
                let path_mtu = PathMtu::from_bytes(mtu)
                    .filter(|m| m.bytes() <= self.cfg.max_mtu.bytes())
                    .ok_or_else(|| {
                        err(
                            ErrorKind::InvalidArgument,
                            format!(
                                "mtu {mtu} is not 256, 512, 1024, 2048 or 4096 up to the port's {}",
                                self.cfg.max_mtu.bytes()
                            ),
                        )
                    })?;
                let dest_mac = self.neighbour(host, dest_ip);
                self.plain_roce_for(host, qpn, (dest_ip, dest_qpn))
                    .map_err(bad)?;
                let feedback_key = self.feedback_key_for(host, qpn, (dest_ip, dest_qpn));
                self.hosts[host].nic.engine_mut().modify_to_rtr(
                    qpn,
                    RtrAttr {
                        path_mtu,
                        dest_qpn,
                        dest_mac,
                        dest_ip,
                        rq_psn,
                        max_dest_rd_atomic,
                        min_rnr_timer,
                        dscp: traffic_class.map(|tc| tc >> 2),
                        feedback_key,
                    },
                )
            }
            Modify::Rts {
                sq_psn,
                timeout,
                retry_cnt,
                rnr_retry,
                max_rd_atomic,
            } => self.hosts[host].nic.engine_mut().modify_to_rts(
                qpn,
                RtsAttr {
                    sq_psn,
                    timeout,
                    retry_cnt,
                    rnr_retry,
                    max_rd_atomic,
                },
            ),
            Modify::Err => {
                let r = self.hosts[host].nic.engine_mut().modify_to_err(qpn);
                self.pause_sq(host, qpn, false);
                r
            }
            Modify::Reset => {
                let h = &mut self.hosts[host];
                let r = h.nic.engine_mut().reset_qp(qpn);
                if let (Ok(()), Some(rt)) = (&r, h.qps.get_mut(&qpn)) {
                    // The WRs still in the rings go with the connection.
                    let seg = &*rt.seg;
                    let _ = rt.sq.discard_all(seg);
                    if let Some(rq) = rt.rq.as_mut() {
                        let _ = rq.ring.discard_all(seg);
                    }
                    rt.sq_paused = false;
                    // RESET forgets every attribute: the engine's new QP
                    // runs the device's congestion control, and an
                    // application's key does not carry over to the next
                    // connection.
                    rt.cc_explicit = false;
                    rt.feedback_key = None;
                }
                r
            }
            Modify::Update {
                to,
                access,
                min_rnr_timer,
                timeout,
                retry_cnt,
                rnr_retry,
                sqd_notify,
                qkey,
            } => {
                use shm::proto::UpdateTo;
                if let Some(q) = qkey {
                    self.hosts[host]
                        .nic
                        .engine_mut()
                        .set_qp_qkey(qpn, q)
                        .map_err(bad)?;
                }
                let state = match to {
                    UpdateTo::Init => QpState::Init,
                    UpdateTo::Rts => QpState::Rts,
                    UpdateTo::Sqd => QpState::Sqd,
                };
                let u = QpUpdate {
                    access: access.map(|a| QpAccess {
                        remote_write: a.remote_write,
                        remote_read: a.remote_read,
                        remote_atomic: a.remote_atomic,
                    }),
                    min_rnr_timer,
                    timeout,
                    retry_cnt,
                    rnr_retry,
                };
                let now = self.clock.now_ns();
                let r = self.hosts[host]
                    .nic
                    .engine_mut()
                    .modify_qp(qpn, state, &u, sqd_notify, now);
                if r.is_ok() {
                    self.pause_sq(host, qpn, state == QpState::Sqd);
                }
                r
            }
        };
        r.map_err(bad)?;
        done(Reply::Done)
    }

    /// Whether the peer at `ip` speaks our telemetry: one of the daemon's
    /// own hosts, or in a configured subnet.
    fn speaks_telemetry(&self, ip: std::net::Ipv4Addr) -> bool {
        let within = |&(net, n): &(std::net::Ipv4Addr, u8)| {
            let mask = u32::MAX.checked_shl(32 - u32::from(n)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        };
        self.peers.iter().any(|h| h.ip == ip) || self.cfg.telemetry_peers.iter().any(within)
    }

    /// A QP on its way to RTR towards a peer that does not speak our
    /// telemetry (neither configured to nor negotiated by rdma_cm for this
    /// connection) runs the standard controller instead of the device's
    /// HPCC++ mode (unless the application chose its mode itself): a
    /// standard RoCEv2 peer never gets a TLM block, probe or notify. It
    /// also keeps within rxe's bounds on unacknowledged PSNs
    /// ([`SendLimits::STANDARD_PEER`]): with no CNPs coming, that window
    /// is all that keeps a slow peer's input queue from overflowing.
    fn plain_roce_for(
        &mut self,
        host: usize,
        qpn: Qpn,
        (ip, dest_qpn): (std::net::Ipv4Addr, Qpn),
    ) -> Result<(), transport::rc::RcError> {
        let local = self.hosts[host].spec.ip;
        if self.speaks_telemetry(ip) || self.cma.take_negotiated(local, ip, dest_qpn) {
            return Ok(());
        }
        let h = &mut self.hosts[host];
        h.nic
            .engine_mut()
            .set_qp_send_limits(qpn, SendLimits::STANDARD_PEER)?;
        if h.qps.get(&qpn).is_some_and(|r| r.cc_explicit) {
            return Ok(());
        }
        let e = h.nic.engine_mut();
        if e.qp_cc_mode(qpn)?.uses_telemetry() {
            e.set_qp_cc(qpn, self.cfg.standard_cc)?;
            self.counters.plain_peer_qps += 1;
        }
        Ok(())
    }

    /// Holds (SQD) or releases the WQEs in a QP's SQ ring.
    fn pause_sq(&mut self, host: usize, qpn: Qpn, paused: bool) {
        if let Some(rt) = self.hosts[host].qps.get_mut(&qpn) {
            rt.sq_paused = paused;
        }
    }

    /// The MAC of `ip` for a QP of `host`: one of the daemon's own hosts,
    /// or what the host's neighbour table knows; else the zero MAC, which
    /// the pipeline resolves with ARP when the QP's frames go.
    pub(super) fn neighbour(
        &self,
        host: usize,
        ip: std::net::Ipv4Addr,
    ) -> transport::wire::MacAddr {
        if ip.is_multicast() {
            // IPv4 multicast's MAC (RFC 1112): 01:00:5e and the low 23
            // bits of the group.
            let o = ip.octets();
            return transport::wire::MacAddr([0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]);
        }
        let now = self.clock.now_ns();
        self.peers
            .iter()
            .find(|h| h.ip == ip)
            .map(|h| h.mac)
            .or_else(|| self.hosts[host].nic.neighbours().lookup(ip, now))
            .unwrap_or_default()
    }

    fn destroy_qp(&mut self, conn: ConnId, qpn: Qpn) -> Answer {
        let host = self.own_qp(conn, qpn)?;
        // What the application posted before it destroyed the QP goes out
        // first, as far as one pass of the host's pipeline sends it: a
        // datagram posted just before (mckey's sender posts and destroys)
        // must not vanish because the lcore had not read the ring yet.
        let now = self.clock.now_ns();
        let (nic, mut apps) = self.host_apps(host);
        nic.poll(now, &mut apps);
        apps.drain_pending();
        let _ = self.hosts[host].nic.engine_mut().destroy_qp(qpn);
        let rt = self.hosts[host].forget_qp(qpn);
        let a = self.app(conn);
        a.qps.retain(|&q| q != qpn);
        if let Some(rt) = rt {
            a.alloc.release(rt.ring.0, rt.ring.1);
            if let Some(r) = rt.rq {
                a.alloc.release(r.block.0, r.block.1);
            }
            for slot in [rt.cq, rt.recv_cq] {
                if let Some(c) = self.cqs.get_mut(slot) {
                    c.qps -= 1;
                }
            }
        }
        done(Reply::Done)
    }

    fn query_qp(&mut self, conn: ConnId, qpn: Qpn) -> Answer {
        let host = self.own_qp(conn, qpn)?;
        let e = self.hosts[host].nic.engine();
        let bad = |e: transport::rc::RcError| err(ErrorKind::NoSuchQp, e.to_string());
        let k = e.qp_counters(qpn).map_err(bad)?;
        let (w, r) = e.qp_cc(qpn).map_err(bad)?;
        let state = e.qp_state(qpn).map_err(bad)?;
        let cc = e.qp_cc_mode(qpn).map_err(bad)?.name().to_string();
        done(Reply::QpInfo(QpInfo {
            qpn,
            state: format!("{state:?}").to_uppercase(),
            tx_packets: k.tx_packets,
            rx_packets: k.rx_packets,
            retransmits: k.retransmitted,
            timeouts: k.timeouts,
            window_bytes: w,
            rate_bps: r,
            cc,
            feedback_auth: e.qp_feedback_keyed(qpn).map_err(bad)?,
            feedback_forged: k.feedback_forged,
            feedback_replayed: k.feedback_replayed,
            feedback_unkeyed: k.feedback_unkeyed,
        }))
    }

    /// The key that authenticates the feedback of `qpn` (on `host`)
    /// connecting to `peer`: the application's (rnicdv), else, towards a
    /// peer that speaks our telemetry, the one both ends derive from the
    /// daemon's `feedback_domain_key` (`rc::auth::connection_key`), else
    /// none.
    fn feedback_key_for(
        &self,
        host: usize,
        qpn: Qpn,
        peer: (std::net::Ipv4Addr, u32),
    ) -> Option<transport::rc::auth::FeedbackKey> {
        let h = &self.hosts[host];
        if let Some(k) = h.qps.get(&qpn).and_then(|r| r.feedback_key) {
            return Some(k);
        }
        let domain = self.cfg.feedback_domain_key.as_ref()?;
        self.speaks_telemetry(peer.0)
            .then(|| transport::rc::auth::connection_key(domain, (h.spec.ip, qpn), peer))
    }

    fn set_qp_feedback_key(&mut self, conn: ConnId, qpn: Qpn, key: Option<[u8; 16]>) -> Answer {
        let host = self.own_qp(conn, qpn)?;
        let h = &mut self.hosts[host];
        let state = h
            .nic
            .engine()
            .qp_state(qpn)
            .map_err(|e| err(ErrorKind::NoSuchQp, e.to_string()))?;
        if !matches!(state, QpState::Reset | QpState::Init) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "a feedback key is set before the QP connects (RESET or INIT); QP {qpn:#x} is in {}",
                    format!("{state:?}").to_uppercase()
                ),
            ));
        }
        if let Some(rt) = h.qps.get_mut(&qpn) {
            rt.feedback_key = key.map(transport::rc::auth::FeedbackKey);
        }
        done(Reply::Done)
    }

    fn set_qp_cc(&mut self, conn: ConnId, qpn: Qpn, name: &str) -> Answer {
        let host = self.own_qp(conn, qpn)?;
        // Telemetry for three hops and a probe timeout of three base RTTs,
        // as the [service] section's own `cc` gets them.
        let mode = CcMode::from_name(name, 3, crate::config::SERVICE_RTT_NS)
            .map_err(|e| err(ErrorKind::InvalidArgument, e.to_string()))?;
        let h = &mut self.hosts[host];
        h.nic
            .engine_mut()
            .set_qp_cc(qpn, mode)
            .map_err(|e| err(ErrorKind::InvalidArgument, e.to_string()))?;
        if let Some(rt) = h.qps.get_mut(&qpn) {
            rt.cc_explicit = true;
        }
        done(Reply::Done)
    }
}
