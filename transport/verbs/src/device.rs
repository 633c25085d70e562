//! The application's handles, in the style of rust-ibverbs: [`Device`] ->
//! [`Pd`] -> [`Mr`] (memory allocated in the shared segment, with L_Key
//! and R_Key), [`Cq`], [`QpBuilder`] -> [`PreparedQp`] (its [`Endpoint`]
//! goes to the peer out of band) -> [`Qp`] connected to the peer's
//! endpoint -> `post_write` / `post_read` / `post_send` / the atomics /
//! [`Qp::post`] (a batch behind one doorbell), [`Qp::post_recv`] or a
//! shared receive queue ([`Srq`]) for incoming SENDs -> [`Cq::poll`] or
//! [`Cq::wait`].
//!
//! Control calls are request/reply on the daemon's socket; posting and
//! polling touch only shared memory.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shm::abi::{self, Consumer, Producer, RingError, RingLayout};
use transport::rc::{
    Cqe as Completion, InlineData, RecvWr, SgList, Sge, WcStatus, WrHead, WrOp, WrParts, WrPayload,
};

use shm::proto::{
    self, DeviceInfo, ErrorKind, ErrorReply, Modify, MrAccess, PortInfo, QpInfo, Reply, ReplyMsg,
    Request, RequestMsg,
};
use shm::segment::Segment;

/// Segment size an application gets unless it asks otherwise.
pub const DEFAULT_SHM_BYTES: u64 = 64 << 20;

/// The socket of the embedded default configuration (the loopback
/// testbed's daemon).
pub const DEFAULT_SOCKET: &str = "/tmp/rnic/loopback.sock";

/// The environment variable that names another daemon socket.
pub const SOCKET_ENV: &str = "RNIC_SOCKET";

/// The daemon socket: `$RNIC_SOCKET` when set and not empty, else
/// [`DEFAULT_SOCKET`].
pub fn socket_path() -> std::path::PathBuf {
    match std::env::var_os(SOCKET_ENV) {
        Some(p) if !p.is_empty() => p.into(),
        _ => DEFAULT_SOCKET.into(),
    }
}

/// The devices the daemon listening on `socket` serves, in its order.
pub fn list_devices(socket: impl AsRef<Path>) -> Result<Vec<DeviceInfo>> {
    let mut conn = Conn::connect(socket.as_ref())?;
    match call(&mut conn, 0, Request::ListDevices)?.0 {
        Reply::Devices(list) => Ok(list),
        r => Err(unexpected(r)),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error("daemon socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon refused: {0}")]
    Daemon(#[from] ErrorReply),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("shared memory: {0}")]
    Shm(#[from] shm::segment::ShmError),
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    #[error("send queue of QP {qpn:#x} has {free} free slots, {wanted} wanted")]
    SendQueueFull { qpn: u32, free: u32, wanted: usize },
    #[error("receive queue {what} has {free} free slots, {wanted} wanted")]
    RecvQueueFull {
        what: String,
        free: u32,
        wanted: usize,
    },
    #[error("QP {0:#x} takes its receive WQEs from a shared receive queue; post to the SRQ")]
    QpUsesSrq(u32),
    #[error("{0}")]
    InvalidArgument(String),
}

impl VerbsError {
    /// The daemon's error kind, if the daemon refused.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            VerbsError::Daemon(e) => Some(e.kind),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, VerbsError>;

struct Conn {
    sock: UnixStream,
    buf: Vec<u8>,
}

impl Conn {
    fn connect(socket: &Path) -> Result<Conn> {
        let sock = UnixStream::connect(socket).map_err(|e| {
            std::io::Error::new(e.kind(), format!("connect {}: {e}", socket.display()))
        })?;
        Ok(Conn {
            sock,
            buf: Vec::new(),
        })
    }
}

struct Inner {
    conn: Mutex<Conn>,
    next_id: AtomicU64,
    seg: Segment,
    info: DeviceInfo,
    /// The eventfd that wakes the device's lcore when it sleeps.
    wake: Option<OwnedFd>,
}

impl Inner {
    /// After entries were written into a ring of QP `qpn` that asks for a
    /// doorbell (the daemon parked the QP): rings it.
    fn ring_bell<T: abi::RingEntry>(&self, ring: &Producer<T>, qpn: u32) {
        if let Some(off) = self.info.doorbells {
            if ring.take_armed(&self.seg) {
                let bells = abi::Doorbells {
                    offset: off as usize,
                };
                bells.ring(&self.seg, qpn);
                self.wake_lcore(bells);
            }
        }
    }

    /// After writing entries into a ring the daemon reads without bells
    /// (an SRQ's): wakes the lcore if it asked (it armed the ring before
    /// sleeping).
    fn wake_if_armed<T: abi::RingEntry>(&self, ring: &Producer<T>) {
        if let Some(off) = self.info.doorbells {
            if ring.take_armed(&self.seg) {
                self.wake_lcore(abi::Doorbells {
                    offset: off as usize,
                });
            }
        }
    }

    /// After a bell: wakes the device's lcore if it sleeps (the first
    /// poster since it fell asleep pays for the system call; while it
    /// polls, nobody does).
    fn wake_lcore(&self, bells: abi::Doorbells) {
        if let Some(fd) = &self.wake {
            if bells.take_asleep(&self.seg) {
                if let Ok(t) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
                    let ns = t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64;
                    bells.stamp_rung(&self.seg, ns);
                }
                let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
            }
        }
    }

    fn call(&self, req: Request) -> Result<(Reply, Vec<OwnedFd>)> {
        self.call_with(req, &[])
    }

    fn call_with(&self, req: Request, fds: &[BorrowedFd<'_>]) -> Result<(Reply, Vec<OwnedFd>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        call_with(&mut c, id, req, fds)
    }
}

fn call(c: &mut Conn, id: u64, req: Request) -> Result<(Reply, Vec<OwnedFd>)> {
    call_with(c, id, req, &[])
}

/// Sends a request with `fds` beside its first byte and reads the reply.
fn call_with(
    c: &mut Conn,
    id: u64,
    req: Request,
    fds: &[BorrowedFd<'_>],
) -> Result<(Reply, Vec<OwnedFd>)> {
    use std::io::Write;
    let bytes = proto::frame(&RequestMsg {
        v: shm::VERSION,
        id,
        req,
    });
    let sent = if fds.is_empty() {
        0
    } else {
        use std::os::fd::AsFd;
        proto::send_with_fds(c.sock.as_fd(), &bytes, fds)?
    };
    c.sock.write_all(&bytes[sent..])?;
    let mut fds = Vec::new();
    let r: ReplyMsg = proto::recv_message(&mut c.sock, &mut c.buf, &mut fds)?;
    if r.v != shm::VERSION || r.id != id {
        return Err(VerbsError::Protocol(format!(
            "reply v{} id {} to request v{} id {id}",
            r.v,
            r.id,
            shm::VERSION
        )));
    }
    Ok((r.result?, fds))
}

fn unexpected(r: Reply) -> VerbsError {
    VerbsError::Protocol(format!("unexpected reply {r:?}"))
}

/// An open device: a connection to the daemon and the shared segment.
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("info", &self.inner.info)
            .finish()
    }
}

impl Device {
    /// Opens device `name` of the daemon listening on `socket`, with a
    /// segment of [`DEFAULT_SHM_BYTES`].
    pub fn open(socket: impl AsRef<Path>, name: &str) -> Result<Device> {
        Self::open_with(socket, name, DEFAULT_SHM_BYTES)
    }

    /// Opens device `name` with a shared segment of `shm_bytes` (memory
    /// regions and rings are allocated in it).
    pub fn open_with(socket: impl AsRef<Path>, name: &str, shm_bytes: u64) -> Result<Device> {
        let mut conn = Conn::connect(socket.as_ref())?;
        let (reply, fds) = call(
            &mut conn,
            0,
            Request::OpenDevice {
                device: name.to_string(),
                shm_bytes,
            },
        )?;
        let Reply::DeviceOpened(info) = reply else {
            return Err(unexpected(reply));
        };
        let fd = fds
            .first()
            .ok_or_else(|| VerbsError::Protocol("no segment descriptor with the reply".into()))?;
        let seg = Segment::map(fd, info.shm_bytes as usize)?;
        if let Some(off) = info.doorbells {
            abi::Doorbells {
                offset: off as usize,
            }
            .set_owner_pid(&seg, std::process::id());
        }
        let mut fds = fds.into_iter();
        let _segment = fds.next();
        Ok(Device {
            inner: Arc::new(Inner {
                conn: Mutex::new(conn),
                next_id: AtomicU64::new(1),
                seg,
                info,
                wake: fds.next(),
            }),
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// One request and its reply, with the descriptors that came beside
    /// it (for layers that keep their own handles, as the libibverbs
    /// library does).
    pub fn call(&self, req: Request) -> Result<(Reply, Vec<OwnedFd>)> {
        self.inner.call(req)
    }

    /// [`Device::call`] with descriptors beside the request (the memfds
    /// of [`Request::RegUserMr`]).
    pub fn call_with_fds(
        &self,
        req: Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Reply, Vec<OwnedFd>)> {
        self.inner.call_with(req, fds)
    }

    /// After writing entries into a ring of QP `qpn`: rings the QP's
    /// doorbell when the daemon parked it (it stopped reading the QP's
    /// rings while they were idle). For callers that keep their own
    /// rings, such as the libibverbs provider.
    pub fn ring_bell<T: abi::RingEntry>(&self, ring: &Producer<T>, qpn: u32) {
        self.inner.ring_bell(ring, qpn);
    }

    /// After writing entries into an SRQ's ring: wakes the device's lcore
    /// if it sleeps and asked to be woken for them.
    pub fn wake_if_armed<T: abi::RingEntry>(&self, ring: &Producer<T>) {
        self.inner.wake_if_armed(ring);
    }

    /// The shared segment (rings and regions).
    pub fn segment(&self) -> &Segment {
        &self.inner.seg
    }

    /// Whether the daemon has closed this device's connection (it exited
    /// or was killed): a non-blocking peek at the socket, which carries
    /// nothing between a request's reply and the next request.
    pub fn daemon_gone(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        use std::os::fd::AsRawFd;
        let c = self.inner.conn.lock().unwrap_or_else(|p| p.into_inner());
        let mut b = [0u8; 1];
        matches!(
            recv(
                c.sock.as_raw_fd(),
                &mut b,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
            ),
            Ok(0) | Err(nix::errno::Errno::ECONNRESET | nix::errno::Errno::EPIPE)
        )
    }

    /// A duplicate of the control socket to watch (poll, epoll) for the
    /// daemon hanging up; never to be read or written.
    pub fn watch_fd(&self) -> std::io::Result<OwnedFd> {
        use std::os::fd::AsFd;
        let c = self.inner.conn.lock().unwrap_or_else(|p| p.into_inner());
        c.sock.as_fd().try_clone_to_owned()
    }

    pub fn alloc_pd(&self) -> Result<Pd> {
        match self.inner.call(Request::AllocPd)?.0 {
            Reply::Pd { pd } => Ok(Pd {
                dev: self.clone(),
                pd,
            }),
            r => Err(unexpected(r)),
        }
    }

    /// A completion queue of `depth` entries (a power of two).
    pub fn create_cq(&self, depth: u32) -> Result<Cq> {
        let (reply, mut fds) = self.inner.call(Request::CreateCq { depth })?;
        let Reply::Cq { cq, offset, depth } = reply else {
            return Err(unexpected(reply));
        };
        let event = fds.pop();
        let layout = RingLayout::new(offset as usize, depth, std::mem::size_of::<abi::Cqe>())?;
        Ok(Cq {
            dev: self.clone(),
            cq,
            ring: Mutex::new(Consumer::new(layout)),
            event,
        })
    }

    pub fn query_port(&self) -> Result<PortInfo> {
        match self.inner.call(Request::QueryPort)?.0 {
            Reply::PortInfo(p) => Ok(p),
            r => Err(unexpected(r)),
        }
    }

    /// Every counter of the daemon (ports, engines, QPs), as JSON: at
    /// most the first 512 QPs are listed one by one (`qps_omitted`
    /// counts the rest; the hosts' totals count them all).
    pub fn stats(&self) -> Result<String> {
        match self.inner.call(Request::Stats)?.0 {
            Reply::Stats { json } => Ok(json),
            r => Err(unexpected(r)),
        }
    }

    fn done(&self, req: Request) -> Result<()> {
        match self.inner.call(req)?.0 {
            Reply::Done => Ok(()),
            r => Err(unexpected(r)),
        }
    }
}

/// A protection domain: its QPs reach only its memory regions.
pub struct Pd {
    dev: Device,
    pd: u32,
}

impl Pd {
    pub fn handle(&self) -> u32 {
        self.pd
    }

    /// Allocates `len` bytes of shared memory and registers them.
    pub fn alloc_mr(&self, len: u64, access: MrAccess) -> Result<Mr> {
        let reply = self.dev.inner.call(Request::RegMr {
            pd: self.pd,
            len,
            access,
        })?;
        match reply.0 {
            Reply::Mr {
                lkey,
                rkey,
                va,
                offset,
                len,
            } => {
                if self
                    .dev
                    .inner
                    .seg
                    .slice(offset as usize, len as usize)
                    .is_none()
                {
                    return Err(VerbsError::Protocol(format!(
                        "region at {offset} + {len} is outside the segment"
                    )));
                }
                Ok(Mr {
                    dev: self.dev.clone(),
                    lkey,
                    rkey,
                    va,
                    offset: offset as usize,
                    len: len as usize,
                })
            }
            r => Err(unexpected(r)),
        }
    }

    /// Starts a QP whose completions go to `cq`.
    pub fn qp_builder<'a>(&'a self, cq: &'a Cq) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            cq,
            depth: 128,
            access: MrAccess {
                local_write: true,
                remote_write: true,
                remote_read: true,
                remote_atomic: true,
            },
            mtu: 1024,
            timeout: 14,
            retry_cnt: 7,
            max_rd_atomic: 16,
            psn: None,
            recv_depth: 128,
            recv_cq: None,
            srq: None,
            min_rnr_timer: shm::proto::DEFAULT_MIN_RNR_TIMER,
            rnr_retry: 7,
            feedback_key: None,
        }
    }

    /// A shared receive queue of `depth` receive WQEs (a power of two) for
    /// this PD's QPs.
    pub fn create_srq(&self, depth: u32) -> Result<Srq> {
        let (reply, _) = self
            .dev
            .inner
            .call(Request::CreateSrq { pd: self.pd, depth })?;
        let Reply::Srq { srq, offset, depth } = reply else {
            return Err(unexpected(reply));
        };
        let layout = RingLayout::new(offset as usize, depth, std::mem::size_of::<abi::RecvWqe>())?;
        Ok(Srq {
            dev: self.dev.clone(),
            srq,
            ring: Mutex::new(Producer::new(layout)),
        })
    }
}

/// A shared receive queue: QPs built with [`QpBuilder::srq`] take their
/// receive WQEs from it.
pub struct Srq {
    dev: Device,
    srq: u32,
    ring: Mutex<Producer<abi::RecvWqe>>,
}

impl Srq {
    pub fn handle(&self) -> u32 {
        self.srq
    }

    /// Posts receive WRs behind one doorbell, all or none.
    pub fn post_recv(&self, wrs: &[RecvRequest]) -> Result<()> {
        post_recvs(
            &self.dev,
            &self.ring,
            None,
            &format!("of SRQ {}", self.srq),
            wrs,
        )
    }

    /// The receive WQEs the daemon holds for it, its armed limit and the
    /// limit events so far.
    pub fn query(&self) -> Result<shm::proto::SrqInfo> {
        match self.dev.inner.call(Request::QuerySrq { srq: self.srq })?.0 {
            Reply::SrqInfo(i) => Ok(i),
            r => Err(unexpected(r)),
        }
    }

    /// Arms the limit: when a SEND leaves fewer than `limit` WQEs, an
    /// SRQ_LIMIT_REACHED event is counted (see [`Srq::query`]) and the
    /// limit disarms (0 disarms).
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        self.dev.done(Request::ModifySrq {
            srq: self.srq,
            limit,
        })
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        let _ = self.dev.done(Request::DestroySrq { srq: self.srq });
    }
}

/// One receive work request: where an incoming SEND lands (length 0 for a
/// WRITE with immediate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvRequest {
    pub wr_id: u64,
    pub local: LocalBuf,
    /// Several local buffers in place of `local` (at most
    /// [`abi::RECV_WQE_MAX_SGE`] reach the daemon).
    pub sges: Option<SgList>,
}

impl RecvRequest {
    /// A receive request over one local buffer.
    pub fn new(wr_id: u64, local: LocalBuf) -> Self {
        RecvRequest {
            wr_id,
            local,
            sges: None,
        }
    }

    fn wqe(&self) -> Result<abi::RecvWqe> {
        let sg = match self.sges {
            Some(sg) => sg,
            None if self.local.len == 0 => SgList::EMPTY,
            None => SgList::one(Sge {
                lkey: self.local.lkey,
                va: self.local.va,
                len: self.local.len,
            }),
        };
        abi::RecvWqe::from_wr(&RecvWr {
            wr_id: self.wr_id,
            sg,
        })
        .map_err(|e| VerbsError::InvalidArgument(format!("receive request {}: {e}", self.wr_id)))
    }
}

/// Writes receive WQEs into a ring (of QP `qpn`, whose doorbell it rings
/// when the daemon asks; an SRQ's ring is always read).
fn post_recvs(
    dev: &Device,
    ring: &Mutex<Producer<abi::RecvWqe>>,
    qpn: Option<u32>,
    what: &str,
    wrs: &[RecvRequest],
) -> Result<()> {
    let seg = &dev.inner.seg;
    let mut rq = ring.lock().unwrap_or_else(|p| p.into_inner());
    let free = rq.free(seg, wrs.len() as u32)?;
    if (free as usize) < wrs.len() {
        return Err(VerbsError::RecvQueueFull {
            what: what.to_string(),
            free,
            wanted: wrs.len(),
        });
    }
    for w in wrs {
        w.wqe()?;
    }
    for w in wrs {
        let wqe = w.wqe()?;
        rq.write_prefix(seg, &wqe, wqe.used_len());
    }
    match qpn {
        Some(qpn) => dev.inner.ring_bell(&rq, qpn),
        None => dev.inner.wake_if_armed(&rq),
    }
    Ok(())
}

impl Drop for Pd {
    fn drop(&mut self) {
        let _ = self.dev.done(Request::DeallocPd { pd: self.pd });
    }
}

/// A registered memory region in the shared segment.
pub struct Mr {
    dev: Device,
    pub lkey: u32,
    pub rkey: u32,
    /// The region's device address (what work requests and the peer use).
    pub va: u64,
    offset: usize,
    len: usize,
}

impl Mr {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's bytes. RDMA operations land in them while you look.
    pub fn as_slice(&self) -> &[u8] {
        self.dev
            .inner
            .seg
            .slice(self.offset, self.len)
            .expect("checked at registration")
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.dev
            .inner
            .seg
            .slice_mut(self.offset, self.len)
            .expect("checked at registration")
    }

    /// The byte at `offset`, freshly loaded from shared memory each call
    /// (for spinning until a peer's WRITE lands); 0 past the end.
    pub fn poll_byte(&self, offset: usize) -> u8 {
        if offset >= self.len {
            return 0;
        }
        self.dev.inner.seg.load_u8_volatile(self.offset + offset)
    }

    /// What a peer needs to address this region.
    pub fn remote(&self) -> RemoteMr {
        RemoteMr {
            va: self.va,
            rkey: self.rkey,
            len: self.len as u64,
        }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let _ = self.dev.done(Request::DeregMr { lkey: self.lkey });
    }
}

/// A peer's memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteMr {
    pub va: u64,
    pub rkey: u32,
    pub len: u64,
}

/// A completion queue.
pub struct Cq {
    dev: Device,
    cq: u32,
    ring: Mutex<Consumer<abi::Cqe>>,
    event: Option<OwnedFd>,
}

impl Cq {
    pub fn handle(&self) -> u32 {
        self.cq
    }

    /// Fills `out` with completions that are ready; returns how many.
    /// Errors only when the daemon's index in shared memory is corrupt.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let seg = &self.dev.inner.seg;
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let n = (ring.available(seg)? as usize).min(out.len());
        for slot in out.iter_mut().take(n) {
            *slot = ring.peek(seg).to_rc();
            ring.advance(seg);
        }
        Ok(n)
    }

    /// Blocks until a completion is ready or `timeout` passes (eventfd;
    /// for applications that do not want to spin). Returns whether one is
    /// ready.
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let seg = &self.dev.inner.seg;
        let Some(ev) = self.event.as_ref() else {
            return Err(VerbsError::Protocol(
                "the CQ came without an eventfd".into(),
            ));
        };
        let deadline = std::time::Instant::now() + timeout;
        loop {
            {
                let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
                ring.arm(seg);
                if ring.available(seg)? > 0 {
                    return Ok(true);
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let ms = PollTimeout::try_from(left.as_millis().clamp(1, 60_000) as i32)
                .unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(ev.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Ok(n) if n > 0 => {
                    let mut b = [0u8; 8];
                    let _ = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(ev), &mut b);
                }
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(VerbsError::Io(e.into())),
            }
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let _ = self.dev.done(Request::DestroyCq { cq: self.cq });
    }
}

/// Settings of a QP before it exists.
pub struct QpBuilder<'a> {
    pd: &'a Pd,
    cq: &'a Cq,
    depth: u32,
    access: MrAccess,
    mtu: u32,
    timeout: u8,
    retry_cnt: u8,
    max_rd_atomic: u8,
    psn: Option<u32>,
    recv_depth: u32,
    recv_cq: Option<&'a Cq>,
    srq: Option<&'a Srq>,
    min_rnr_timer: u8,
    rnr_retry: u8,
    feedback_key: Option<[u8; 16]>,
}

impl<'a> QpBuilder<'a> {
    /// The 128-bit key that authenticates this QP's congestion feedback
    /// (HPCC++ draft-00 s9): the peer's QP must be given the same one
    /// [default: the one the daemon derives from its
    /// `feedback_domain_key`, if it has one; else none].
    pub fn feedback_key(mut self, key: [u8; 16]) -> Self {
        self.feedback_key = Some(key);
        self
    }

    /// Receive queue entries (a power of two) [default 128].
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n;
        self
    }

    /// Deliver receive completions to `cq` (default: the send CQ).
    pub fn recv_cq(mut self, cq: &'a Cq) -> Self {
        self.recv_cq = Some(cq);
        self
    }

    /// Take receive WQEs from `srq` instead of an own receive queue.
    pub fn srq(mut self, srq: &'a Srq) -> Self {
        self.srq = Some(srq);
        self
    }

    /// The RNR NAK timer code this QP's responder sends (0-31, IBA table)
    /// [default 12: 0.64 ms] and how often its requester retries after an
    /// RNR NAK (0-7, 7: for ever) [default 7].
    pub fn rnr(mut self, min_rnr_timer: u8, rnr_retry: u8) -> Self {
        self.min_rnr_timer = min_rnr_timer;
        self.rnr_retry = rnr_retry;
        self
    }

    /// Send queue entries (a power of two) [default 128].
    pub fn depth(mut self, n: u32) -> Self {
        self.depth = n;
        self
    }

    /// What the peer may do to this QP's PD's regions [default: write and
    /// read].
    pub fn access(mut self, a: MrAccess) -> Self {
        self.access = a;
        self
    }

    /// Path MTU, 256..4096 [default 1024].
    pub fn mtu(mut self, bytes: u32) -> Self {
        self.mtu = bytes;
        self
    }

    /// Local ACK timeout exponent (4.096 us x 2^t) [default 14] and retry
    /// count [default 7].
    pub fn timeout(mut self, t: u8, retry_cnt: u8) -> Self {
        self.timeout = t;
        self.retry_cnt = retry_cnt;
        self
    }

    /// READs outstanding at once, both directions [default 16].
    pub fn max_rd_atomic(mut self, n: u8) -> Self {
        self.max_rd_atomic = n;
        self
    }

    /// First PSN this QP sends [default: from the clock and the QPN].
    pub fn psn(mut self, psn: u32) -> Self {
        self.psn = Some(psn & 0xff_ffff);
        self
    }

    /// Creates the QP (RESET -> INIT); connect it with
    /// [`PreparedQp::connect`] once the peer's endpoint is known.
    pub fn build(self) -> Result<PreparedQp> {
        let dev = &self.pd.dev;
        let (reply, _) = dev.inner.call(Request::CreateQp {
            pd: self.pd.pd,
            cq: self.cq.cq,
            recv_cq: self.recv_cq.map(|c| c.cq),
            depth: self.depth,
            rq_depth: if self.srq.is_some() {
                0
            } else {
                self.recv_depth
            },
            srq: self.srq.map(|s| s.srq),
            qp_type: shm::proto::QpType::Rc,
        })?;
        let Reply::Qp {
            qpn,
            sq_offset,
            depth,
            rq_offset,
            rq_depth,
        } = reply
        else {
            return Err(unexpected(reply));
        };
        let layout = RingLayout::new(sq_offset as usize, depth, std::mem::size_of::<abi::Wqe>())?;
        let rq = if rq_depth > 0 {
            let l = RingLayout::new(
                rq_offset as usize,
                rq_depth,
                std::mem::size_of::<abi::RecvWqe>(),
            )?;
            Some(Mutex::new(Producer::new(l)))
        } else {
            None
        };
        let qp = Qp {
            dev: dev.clone(),
            qpn,
            sq: Mutex::new(SendRing {
                ring: Producer::new(layout),
                wqe: abi::Wqe::empty(),
            }),
            rq,
        };
        qp.modify(Modify::Init {
            remote_write: self.access.remote_write,
            remote_read: self.access.remote_read,
            remote_atomic: self.access.remote_atomic,
            qkey: None,
        })?;
        if let Some(key) = self.feedback_key {
            dev.done(Request::SetQpFeedbackKey {
                qpn,
                key: Some(key),
            })?;
        }
        let psn = self.psn.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            (t ^ qpn.wrapping_mul(0x9e37_79b9)) & 0xff_ffff
        });
        Ok(PreparedQp {
            qp,
            psn,
            mtu: self.mtu,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            max_rd_atomic: self.max_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            rnr_retry: self.rnr_retry,
        })
    }
}

/// What a peer needs to connect to a QP (and, optionally, to address one
/// memory region): exchanged out of band, as perftest does over TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    pub qpn: u32,
    pub psn: u32,
    pub ip: Ipv4Addr,
    pub mr: Option<RemoteMr>,
}

/// A QP in INIT, waiting for the peer's endpoint.
pub struct PreparedQp {
    qp: Qp,
    psn: u32,
    mtu: u32,
    timeout: u8,
    retry_cnt: u8,
    max_rd_atomic: u8,
    min_rnr_timer: u8,
    rnr_retry: u8,
}

impl PreparedQp {
    /// This QP's endpoint, to send to the peer (add a region with
    /// [`Endpoint::mr`]).
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            qpn: self.qp.qpn,
            psn: self.psn,
            ip: self.qp.dev.inner.info.ip,
            mr: None,
        }
    }

    /// The QP before it is connected (in INIT): posting to it completes
    /// with LOC_QP_OP_ERR.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// INIT -> RTR -> RTS towards `remote`.
    pub fn connect(self, remote: &Endpoint) -> Result<Qp> {
        self.qp.modify(Modify::Rtr {
            mtu: self.mtu,
            dest_qpn: remote.qpn,
            dest_ip: remote.ip,
            rq_psn: remote.psn,
            max_dest_rd_atomic: self.max_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            traffic_class: None,
        })?;
        self.qp.modify(Modify::Rts {
            sq_psn: self.psn,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            max_rd_atomic: self.max_rd_atomic,
        })?;
        Ok(self.qp)
    }
}

/// One work request of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest {
    pub wr_id: u64,
    pub op: WrOp,
    /// Local buffer: region and byte range in it.
    pub local: LocalBuf,
    pub remote_va: u64,
    pub rkey: u32,
    pub signaled: bool,
    /// Wait for earlier READs and atomics (IBV_SEND_FENCE).
    pub fence: bool,
    /// The receiver's solicited-only waiters are signaled
    /// (IBV_SEND_SOLICITED; SEND and RDMA WRITE with immediate).
    pub solicited: bool,
    /// Local buffers in place of `local` (a scatter/gather list), or the
    /// message itself (inline).
    pub payload: Payload,
}

/// Where a work request's message comes from besides its one `local`
/// buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Payload {
    /// `local` alone.
    #[default]
    Local,
    /// A scatter/gather list (at most [`abi::WQE_MAX_SGE`] entries reach
    /// the daemon).
    Sges(SgList),
    /// The bytes themselves, copied into the WQE (IBV_SEND_INLINE; SEND and
    /// WRITE only, at most [`transport::rc::MAX_INLINE_DATA`] bytes).
    Inline(InlineData),
}

impl WorkRequest {
    /// A signaled, unfenced request.
    pub fn new(wr_id: u64, op: WrOp, local: LocalBuf, remote_va: u64, rkey: u32) -> Self {
        WorkRequest {
            wr_id,
            op,
            local,
            remote_va,
            rkey,
            signaled: true,
            fence: false,
            solicited: false,
            payload: Payload::Local,
        }
    }

    /// A request over several local buffers.
    pub fn with_sges(
        wr_id: u64,
        op: WrOp,
        sges: &[LocalBuf],
        remote_va: u64,
        rkey: u32,
    ) -> Result<Self> {
        let list: Vec<Sge> = sges
            .iter()
            .map(|b| Sge {
                lkey: b.lkey,
                va: b.va,
                len: b.len,
            })
            .collect();
        let sg = SgList::new(&list).map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        let first = sges.first().copied().unwrap_or(LocalBuf {
            lkey: 0,
            va: 0,
            len: 0,
        });
        Ok(WorkRequest {
            payload: Payload::Sges(sg),
            ..WorkRequest::new(wr_id, op, first, remote_va, rkey)
        })
    }

    /// An inline SEND or WRITE of `data`.
    pub fn inline(wr_id: u64, op: WrOp, data: &[u8], remote_va: u64, rkey: u32) -> Result<Self> {
        let d = InlineData::new(data).map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        let none = LocalBuf {
            lkey: 0,
            va: 0,
            len: 0,
        };
        Ok(WorkRequest {
            payload: Payload::Inline(d),
            ..WorkRequest::new(wr_id, op, none, remote_va, rkey)
        })
    }
}

/// A byte range of a local region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBuf {
    pub lkey: u32,
    pub va: u64,
    pub len: u32,
}

impl LocalBuf {
    /// `len` bytes at `offset` of `mr` (not checked here: a bad range
    /// completes with LOC_PROT_ERR, as a NIC reports it).
    pub fn of(mr: &Mr, offset: u64, len: u32) -> LocalBuf {
        LocalBuf {
            lkey: mr.lkey,
            va: mr.va.wrapping_add(offset),
            len,
        }
    }
}

/// A connected RC QP.
/// The send ring and the WQE being built for it.
struct SendRing {
    ring: Producer<abi::Wqe>,
    wqe: abi::Wqe,
}

pub struct Qp {
    dev: Device,
    qpn: u32,
    sq: Mutex<SendRing>,
    /// Its own receive queue (none with an SRQ).
    rq: Option<Mutex<Producer<abi::RecvWqe>>>,
}

impl Qp {
    /// Posts receive WRs behind one doorbell, all or none; refused for a
    /// QP attached to an SRQ.
    pub fn post_recv(&self, wrs: &[RecvRequest]) -> Result<()> {
        let rq = self.rq.as_ref().ok_or(VerbsError::QpUsesSrq(self.qpn))?;
        post_recvs(
            &self.dev,
            rq,
            Some(self.qpn),
            &format!("of QP {:#x}", self.qpn),
            wrs,
        )
    }

    /// SEND (with `imm`: SEND_WITH_IMM) of `local` into the peer's next
    /// receive WQE.
    pub fn post_send(
        &self,
        local: LocalBuf,
        imm: Option<u32>,
        wr_id: u64,
        signaled: bool,
    ) -> Result<()> {
        let op = imm.map_or(WrOp::Send, WrOp::SendImm);
        self.post(&[WorkRequest {
            signaled,
            ..WorkRequest::new(wr_id, op, local, 0, 0)
        }])
    }

    /// FETCH_ADD of `add` on the 8 bytes at the peer's `remote.va +
    /// remote_offset`; the original value lands in `local` (8 bytes).
    pub fn post_fetch_add(
        &self,
        local: LocalBuf,
        remote: &RemoteMr,
        remote_offset: u64,
        add: u64,
        wr_id: u64,
    ) -> Result<()> {
        let va = remote.va.wrapping_add(remote_offset);
        self.post(&[WorkRequest::new(
            wr_id,
            WrOp::FetchAdd { add },
            local,
            va,
            remote.rkey,
        )])
    }

    /// CMP_SWAP on the 8 bytes at the peer's `remote.va + remote_offset`:
    /// `swap` is written if they equal `compare`; the original value lands
    /// in `local` (8 bytes).
    pub fn post_cmp_swap(
        &self,
        local: LocalBuf,
        remote: &RemoteMr,
        remote_offset: u64,
        compare: u64,
        swap: u64,
        wr_id: u64,
    ) -> Result<()> {
        let va = remote.va.wrapping_add(remote_offset);
        let op = WrOp::CmpSwap { compare, swap };
        self.post(&[WorkRequest::new(wr_id, op, local, va, remote.rkey)])
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    fn modify(&self, m: Modify) -> Result<()> {
        self.dev.done(Request::ModifyQp {
            qpn: self.qpn,
            modify: m,
        })
    }

    /// Moves the QP to ERR: outstanding WRs complete with WR_FLUSH_ERR.
    pub fn to_error(&self) -> Result<()> {
        self.modify(Modify::Err)
    }

    pub fn query(&self) -> Result<QpInfo> {
        match self.dev.inner.call(Request::QueryQp { qpn: self.qpn })?.0 {
            Reply::QpInfo(q) => Ok(q),
            r => Err(unexpected(r)),
        }
    }

    /// Posts a batch of work requests behind one doorbell; all or none
    /// (refused when the send queue lacks room for all).
    pub fn post(&self, wrs: &[WorkRequest]) -> Result<()> {
        let seg = &self.dev.inner.seg;
        let mut guard = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        let SendRing { ring: sq, wqe } = &mut *guard;
        let free = sq.free(seg, wrs.len() as u32)?;
        if (free as usize) < wrs.len() {
            return Err(VerbsError::SendQueueFull {
                qpn: self.qpn,
                free,
                wanted: wrs.len(),
            });
        }
        // Checked first, written after: all or none, and no allocation.
        for w in wrs {
            with_parts(w, |p| abi::Wqe::fits(p.payload))?;
        }
        for w in wrs {
            with_parts(w, |p| wqe.build_into(p))?;
            sq.write_prefix(seg, wqe, wqe.used_len());
        }
        self.dev.inner.ring_bell(sq, self.qpn);
        Ok(())
    }
}

/// Runs `f` on the parts of a work request (inline data is for SEND and
/// RDMA WRITE only).
fn with_parts<R>(
    w: &WorkRequest,
    f: impl FnOnce(&WrParts<'_>) -> std::result::Result<R, abi::WqeError>,
) -> Result<R> {
    let one = [Sge {
        lkey: w.local.lkey,
        va: w.local.va,
        len: w.local.len,
    }];
    let payload = match &w.payload {
        Payload::Local => WrPayload::Sges(&one),
        Payload::Sges(sg) => WrPayload::Sges(sg.as_slice()),
        Payload::Inline(_) if w.op.is_read_or_atomic() => {
            return Err(VerbsError::InvalidArgument(format!(
                "work request {}: inline data is for SEND and RDMA WRITE, not {:?}",
                w.wr_id, w.op
            )));
        }
        Payload::Inline(d) => WrPayload::Inline(d.as_slice()),
    };
    let parts = WrParts {
        head: WrHead {
            wr_id: w.wr_id,
            op: w.op,
            rkey: w.rkey,
            remote_va: w.remote_va,
            signaled: w.signaled,
            fence: w.fence,
            solicited: w.solicited,
            ud: None,
        },
        payload,
    };
    f(&parts).map_err(|e| VerbsError::InvalidArgument(format!("work request {}: {e}", w.wr_id)))
}

impl Qp {
    /// Posts one raw WQE as is (no checks: for tests of the daemon's
    /// validation, and for C callers building their own).
    pub fn post_raw(&self, wqe: &abi::Wqe) -> Result<()> {
        let seg = &self.dev.inner.seg;
        let mut guard = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        let sq = &mut guard.ring;
        if sq.free(seg, 1)? == 0 {
            return Err(VerbsError::SendQueueFull {
                qpn: self.qpn,
                free: 0,
                wanted: 1,
            });
        }
        sq.write(seg, wqe);
        self.dev.inner.ring_bell(sq, self.qpn);
        Ok(())
    }

    /// Overwrites the send ring's producer index with `v`, as a broken or
    /// hostile application might (tests of the daemon's validation only:
    /// the daemon moves the QP to ERR).
    #[doc(hidden)]
    pub fn scribble_sq_index(&self, v: u32) {
        use shm::abi::SharedMem;
        let sq = self.sq.lock().unwrap_or_else(|p| p.into_inner());
        self.dev.inner.seg.store_release(sq.ring.layout().prod(), v);
        // As such an application's next post would: a parked QP's rings
        // are read again once its doorbell rings.
        self.dev.inner.ring_bell(&sq.ring, self.qpn);
    }

    /// RDMA WRITE of `local` to the peer's `remote.va + remote_offset`.
    pub fn post_write(
        &self,
        local: LocalBuf,
        remote: &RemoteMr,
        remote_offset: u64,
        wr_id: u64,
        signaled: bool,
    ) -> Result<()> {
        self.post(&[WorkRequest {
            signaled,
            ..WorkRequest::new(
                wr_id,
                WrOp::Write,
                local,
                remote.va.wrapping_add(remote_offset),
                remote.rkey,
            )
        }])
    }

    /// RDMA READ of the peer's `remote.va + remote_offset` into `local`.
    pub fn post_read(
        &self,
        local: LocalBuf,
        remote: &RemoteMr,
        remote_offset: u64,
        wr_id: u64,
        signaled: bool,
    ) -> Result<()> {
        self.post(&[WorkRequest {
            signaled,
            ..WorkRequest::new(
                wr_id,
                WrOp::Read,
                local,
                remote.va.wrapping_add(remote_offset),
                remote.rkey,
            )
        }])
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let _ = self.dev.done(Request::DestroyQp { qpn: self.qpn });
    }
}

/// A zeroed completion, to fill a slice for [`Cq::poll`].
pub fn empty_completion() -> Completion {
    Completion {
        wr_id: 0,
        qpn: 0,
        status: WcStatus::Success,
        opcode: transport::rc::WcOpcode::RdmaWrite,
        byte_len: 0,
        imm: None,
        solicited: false,
        src: None,
    }
}

/// Polls `cq` until one completion arrives (spinning, then yielding) or
/// `timeout` passes.
pub fn poll_one(cq: &Cq, timeout: Duration) -> Result<Option<Completion>> {
    let deadline = std::time::Instant::now() + timeout;
    let mut out = [empty_completion()];
    let mut spins = 0u32;
    loop {
        if cq.poll(&mut out)? == 1 {
            return Ok(Some(out[0]));
        }
        if std::time::Instant::now() >= deadline {
            return Ok(None);
        }
        spins += 1;
        if spins > 1000 {
            std::thread::yield_now();
        }
    }
}
