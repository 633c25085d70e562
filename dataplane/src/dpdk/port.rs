//! Ethdev ports as frame ports (`nic::FramePort`): configuration, burst RX
//! and TX, statistics; and net_ring ports joined back to back through two
//! rings (the testbeds).
//!
//! A [`Port`] owns its queues (all of them, or one queue pair of a port
//! split among the lcores of a device's QP shards: [`Port::into_queues`]):
//! it is `Send` (an lcore may take it) but not `Sync`, so one lcore at a
//! time drives them. The pipelined layout splits
//! a port into an [`RxHalf`] and a [`TxHalf`] for its RX and TX pipe
//! threads: DPDK's RX and TX queues are independent, so each half may run
//! on its own thread, and neither is `Sync`.

use std::cell::Cell;
use std::ffi::CString;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use dpdk_sys::{rte_eth_conf, rte_eth_stats, rte_mbuf, rte_ring};
use nic::{Frame, FramePort, TooSmall};
use transport::wire::MacAddr;

use super::mbuf::BULK;
use super::{DpdkError, Eal, Mbuf, Mempool};

/// Most mbufs per burst.
pub const BURST: usize = 32;

/// Not `Sync`: the queues behind it are driven by one thread at a time.
type NotSync = PhantomData<Cell<()>>;

/// The started device; stopped and closed when its last owner (the port
/// or both its halves) is dropped. It keeps the pool its RX queues fill
/// from alive until then.
#[derive(Debug)]
struct Device {
    id: u16,
    pool: Arc<Mempool>,
    /// Each RX queue's interrupt descriptor (readable while frames wait),
    /// by queue; empty when the driver offers none ([`RX_WAKEUP_DRIVERS`]).
    rx_fds: Vec<RawFd>,
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the port was started by us; stopping and closing it
        // releases the mbufs its queues hold, into `pool`, which is still
        // alive (dropped after this).
        unsafe {
            dpdk_sys::rte_eth_dev_stop(self.id);
            dpdk_sys::rte_eth_dev_close(self.id);
        }
    }
}

/// A started port with one or more RX and TX queues, all owned by the
/// lcore that holds it.
#[derive(Debug)]
pub struct Port {
    /// Fresh mbufs fetched in bulk for the frames to build (dropped
    /// before `dev`, which keeps their pool alive).
    stash: Vec<Mbuf>,
    dev: Arc<Device>,
    mac: MacAddr,
    mtu: u32,
    /// Frames the NIC flagged with a bad IPv4 checksum, dropped.
    rx_bad_checksum: u64,
    /// Chained frames dropped: neither headers, payload and tail nor
    /// joinable into their first segment.
    rx_unjoinable: u64,
    _not_sync: NotSync,
    /// The RX queues it polls and the TX queue it sends on: every RX queue
    /// and TX queue 0, or one queue pair of the device
    /// ([`Port::into_queues`]).
    rx: std::ops::Range<u16>,
    tx: u16,
    pub id: u16,
    /// RX offloads enabled (those of `ETH_RX_OFFLOAD_IPV4_CKSUM` the device
    /// offers); the port works without any.
    pub rx_offloads: u64,
    /// RX (and TX) queues configured: as many as asked for, up to what the
    /// device offers.
    pub queues: u16,
    /// Whether RSS spreads received flows over the queues (when the device
    /// offers UDP hashing and more than one queue is configured).
    pub rss: bool,
    /// The PMD's name (net_ring, net_memif, net_af_packet, ...).
    pub driver: String,
}

/// Drivers whose RX queues the daemon asks for interrupt descriptors
/// (`intr_conf.rxq`) in DPDK 22.11: net_tap's is the queue's own file
/// descriptor, readable while frames wait, with nothing to arm. net_ring,
/// net_af_packet, net_pcap, net_memif and net_af_xdp offer none there; the
/// hardware and virtio drivers that do want each queue's interrupt armed
/// (`rte_eth_dev_rx_intr_enable`) and are not tried on this machine. A
/// sleeping lcore naps instead on every other port.
pub const RX_WAKEUP_DRIVERS: [&str; 1] = ["net_tap"];

/// An RX queue's interrupt descriptor, to sleep on (`poll`): readable
/// while frames wait in the queue.
#[derive(Clone)]
pub struct RxWakeup {
    fd: RawFd,
    /// The port stays open (and the driver keeps the descriptor) while
    /// this lives.
    _dev: Arc<Device>,
}

impl std::os::fd::AsFd for RxWakeup {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the driver opened `fd` for the queue and closes it when
        // the port closes, which `_dev` holds off while `self` lives.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) }
    }
}

/// Port counters from the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PortStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    /// Frames the NIC flagged with a bad IPv4 checksum, dropped by us.
    #[serde(default)]
    pub rx_bad_checksum: u64,
    /// Chained frames dropped by us: neither headers, payload and tail
    /// nor joinable into their first segment.
    #[serde(default)]
    pub rx_unjoinable: u64,
}

impl Port {
    /// Configures port `id` with one queue each way (`desc` descriptors),
    /// RX buffers (and the frames it builds) from `pool`, and starts it. No
    /// offloads are needed.
    pub fn start(eal: &Eal, id: u16, pool: &Arc<Mempool>, desc: u16) -> Result<Port, DpdkError> {
        Self::start_queues(eal, id, pool, desc, 1)
    }

    /// Like [`Port::start`] with up to `queues` queues each way (fewer when
    /// the device offers fewer), RSS over UDP when the device offers it.
    /// `rx_burst` polls every RX queue; `tx_burst` sends on queue 0 (one
    /// TX lcore).
    pub fn start_queues(
        _eal: &Eal,
        id: u16,
        pool: &Arc<Mempool>,
        desc: u16,
        queues: u16,
    ) -> Result<Port, DpdkError> {
        let mut conf = rte_eth_conf::default();
        let mut info = dpdk_sys::rte_eth_dev_info::default();
        // SAFETY: `info` is a valid out-parameter for port `id`.
        let r = unsafe { dpdk_sys::rte_eth_dev_info_get(id, &mut info) };
        if r != 0 {
            return Err(DpdkError::last(format!("device info of port {id}"), r));
        }
        // IPv4 checksum checking on receive when the device offers it: a
        // frame the NIC flags bad is dropped before the engine parses it.
        conf.rxmode.offloads = info.rx_offload_capa & dpdk_sys::consts::ETH_RX_OFFLOAD_IPV4_CKSUM;
        let nq = queues
            .min(info.max_rx_queues)
            .min(info.max_tx_queues)
            .max(1);
        let rss_hf = info.flow_type_rss_offloads & dpdk_sys::consts::ETH_RSS_UDP;
        let rss = nq > 1 && rss_hf != 0;
        if rss {
            conf.rxmode.mq_mode = dpdk_sys::consts::ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
        }
        let driver = if info.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: the driver name is a static NUL-terminated string of
            // the PMD, valid while the EAL lives; we copy it.
            unsafe { std::ffi::CStr::from_ptr(info.driver_name) }
                .to_string_lossy()
                .into_owned()
        };
        let rx_wakeups = RX_WAKEUP_DRIVERS.contains(&driver.as_str());
        if rx_wakeups {
            conf.intr_conf.set_rxq(1);
        }
        // SAFETY: the EAL is initialised; `conf` and `pool` are valid for
        // the calls; the driver copies the configuration.
        unsafe {
            let socket = dpdk_sys::rte_eth_dev_socket_id(id).max(0) as u32;
            let r = dpdk_sys::rte_eth_dev_configure(id, nq, nq, &conf);
            if r != 0 {
                return Err(DpdkError::last(format!("configure port {id}"), r));
            }
            for q in 0..nq {
                let r = dpdk_sys::rte_eth_rx_queue_setup(
                    id,
                    q,
                    desc,
                    socket,
                    ptr::null(),
                    pool.as_ptr(),
                );
                if r != 0 {
                    return Err(DpdkError::last(format!("RX queue {q} of port {id}"), r));
                }
                let r = dpdk_sys::rte_eth_tx_queue_setup(id, q, desc, socket, ptr::null());
                if r != 0 {
                    return Err(DpdkError::last(format!("TX queue {q} of port {id}"), r));
                }
            }
            let r = dpdk_sys::rte_eth_dev_start(id);
            if r != 0 {
                return Err(DpdkError::last(format!("start port {id}"), r));
            }
        }
        let rx_fds: Vec<RawFd> = if rx_wakeups {
            // SAFETY: a started port and its configured queues.
            (0..nq)
                .map(|q| unsafe { dpdk_sys::rte_eth_dev_rx_intr_ctl_q_get_fd(id, q) })
                .collect()
        } else {
            Vec::new()
        };
        let dev = Arc::new(Device {
            id,
            pool: pool.clone(),
            rx_fds,
        });
        let mut mac = dpdk_sys::rte_ether_addr::default();
        let mut mtu = 0u16;
        // SAFETY: both are valid out-parameters for a started port.
        unsafe {
            dpdk_sys::rte_eth_macaddr_get(id, &mut mac);
            dpdk_sys::rte_eth_dev_get_mtu(id, &mut mtu);
        }
        Ok(Port {
            stash: Vec::with_capacity(BULK),
            dev,
            mac: MacAddr(mac.addr_bytes),
            mtu: u32::from(mtu),
            rx_bad_checksum: 0,
            rx_unjoinable: 0,
            _not_sync: PhantomData,
            rx: 0..nq,
            tx: 0,
            id,
            rx_offloads: conf.rxmode.offloads,
            queues: nq,
            rss,
            driver,
        })
    }

    /// The interrupt descriptors of the RX queues this port polls, when
    /// every one has one (a sleeping lcore then needs no nap for it).
    pub fn rx_wakeups(&self) -> Option<Vec<RxWakeup>> {
        self.rx
            .clone()
            .map(|q| {
                let fd = *self.dev.rx_fds.get(usize::from(q))?;
                (fd >= 0).then(|| RxWakeup {
                    fd,
                    _dev: self.dev.clone(),
                })
            })
            .collect()
    }

    /// The port as one port per queue pair `q` (RX queue `q`, TX queue
    /// `q`), for the lcores that share it (one engine each of a device's
    /// QP shards): each drives its own queues, so they may run on
    /// different threads at once. Only the one of queue pair 0 reports
    /// the driver's counters in [`Port::stats`], so that their sum is the
    /// port's.
    pub fn into_queues(self) -> Vec<Port> {
        (0..self.queues)
            .map(|q| Port {
                stash: Vec::with_capacity(BULK),
                dev: self.dev.clone(),
                mac: self.mac,
                mtu: self.mtu,
                rx_bad_checksum: 0,
                rx_unjoinable: 0,
                _not_sync: PhantomData,
                rx: q..q + 1,
                tx: q,
                id: self.id,
                rx_offloads: self.rx_offloads,
                queues: self.queues,
                rss: self.rss,
                driver: self.driver.clone(),
            })
            .collect()
    }

    /// The RX and TX halves, for an RX pipe thread and a TX pipe thread;
    /// [`RxHalf::join`] makes the port whole again.
    pub fn split(self) -> (RxHalf, TxHalf) {
        let tx = TxHalf {
            _dev: self.dev.clone(),
            id: self.id,
            queue: self.tx,
            _not_sync: PhantomData,
        };
        (RxHalf { port: self }, tx)
    }

    /// Frames dropped because the NIC flagged a bad IPv4 checksum.
    pub fn rx_bad_checksum(&self) -> u64 {
        self.rx_bad_checksum
    }

    fn checks_ip(&self) -> bool {
        self.rx_offloads & dpdk_sys::consts::ETH_RX_OFFLOAD_IPV4_CKSUM != 0
    }

    /// The pool the port builds frames from.
    pub fn pool(&self) -> &Arc<Mempool> {
        &self.dev.pool
    }

    /// Whether the link is up (virtual devices such as memif come up once
    /// their peer connects).
    pub fn link_up(&self) -> bool {
        let mut l = dpdk_sys::rte_eth_link::default();
        // SAFETY: `l` is a valid out-parameter.
        let r = unsafe { dpdk_sys::rte_eth_link_get_nowait(self.id, &mut l) };
        r == 0 && l.link_status() != 0
    }

    /// Its counters: the driver's (whole-port ones, given by the port of
    /// queue pair 0 alone when the port is split into queue pairs) and
    /// its own drops.
    pub fn stats(&self) -> PortStats {
        let driver = match self.tx {
            0 => driver_stats(self.id),
            _ => PortStats::default(),
        };
        with_drops(driver, self.rx_bad_checksum, self.rx_unjoinable)
    }

    /// The whole port's counters (the driver's) and its own drops, from
    /// any of its queue pairs. The PMDs we run (net_ring, af_packet,
    /// memif, tap) keep them per queue and sum them on read, so another
    /// lcore may read them while the queues run.
    pub fn port_stats(&self) -> PortStats {
        with_drops(
            driver_stats(self.id),
            self.rx_bad_checksum,
            self.rx_unjoinable,
        )
    }
}

/// `driver`'s counters with our own RX drops.
fn with_drops(driver: PortStats, rx_bad_checksum: u64, rx_unjoinable: u64) -> PortStats {
    PortStats {
        rx_bad_checksum,
        rx_unjoinable,
        ..driver
    }
}

/// The driver's counters of port `id`.
fn driver_stats(id: u16) -> PortStats {
    let mut s = rte_eth_stats::default();
    // SAFETY: `s` is a valid out-parameter.
    unsafe { dpdk_sys::rte_eth_stats_get(id, &mut s) };
    PortStats {
        ipackets: s.ipackets,
        opackets: s.opackets,
        ibytes: s.ibytes,
        obytes: s.obytes,
        imissed: s.imissed,
        ierrors: s.ierrors,
        oerrors: s.oerrors,
        rx_bad_checksum: 0,
        rx_unjoinable: 0,
    }
}

/// Receives up to `max` (at most `BURST` per queue) frames from RX
/// `queues` of port `id`; frames the NIC flagged with a bad IPv4
/// checksum (when `check`) are freed and counted in `bad`.
fn rx_queues(
    id: u16,
    queues: std::ops::Range<u16>,
    check: bool,
    out: &mut Vec<Mbuf>,
    max: usize,
    bad: &mut u64,
    unjoinable: &mut u64,
) -> usize {
    let mut total = 0;
    for q in queues {
        if total >= max {
            break;
        }
        // Not zeroed: an idle poll would pay for 32 pointers it never reads.
        let mut raw = [MaybeUninit::<*mut rte_mbuf>::uninit(); BURST];
        let want = (max - total).min(BURST) as u16;
        // SAFETY: `raw` has room for BURST >= want pointers; the driver
        // fills the first n with mbufs it hands over to us.
        let n = unsafe { dpdk_sys::rnic_rx_burst(id, q, raw.as_mut_ptr().cast(), want) };
        for m in &raw[..usize::from(n.min(want))] {
            // SAFETY: the driver wrote raw[..n]; the slice is capped at
            // want <= BURST.
            let m = unsafe { m.assume_init() };
            if let Some(p) = NonNull::new(m) {
                // SAFETY: the driver gave us this mbuf; we are its only owner.
                let mut m = unsafe { Mbuf::from_raw(p) };
                if check && m.ip_checksum_bad() {
                    *bad += 1; // freed by Drop
                    continue;
                }
                // A chain is read as headers, payload and tail (three
                // segments), or made one buffer; one that does not fit
                // its first segment is dropped and counted.
                if !matches!(m.segments(), 1 | 3) && !m.linearize() {
                    *unjoinable += 1;
                    continue;
                }
                out.push(m);
                total += 1;
            }
        }
    }
    total
}

/// Sends the frames of `frames` (front first) on TX queue `q` of port
/// `id`; those the queue did not take stay in `frames`, still owned, so
/// nothing leaks when the ring is full.
fn tx_queue(id: u16, q: u16, frames: &mut Vec<Mbuf>) -> usize {
    let n = frames.len().min(BURST);
    let mut raw: [*mut rte_mbuf; BURST] = [ptr::null_mut(); BURST];
    for (slot, m) in raw.iter_mut().zip(frames.drain(..n)) {
        *slot = m.into_raw();
    }
    // SAFETY: raw[..n] are valid mbufs we own; the driver takes the first
    // `sent` and frees them after transmission.
    let sent = usize::from(unsafe { dpdk_sys::rnic_tx_burst(id, q, raw.as_mut_ptr(), n as u16) });
    // Unsent mbufs return to the front of `frames`, in order.
    let unsent: Vec<Mbuf> = raw[sent..n]
        .iter()
        .filter_map(|&p| NonNull::new(p))
        // SAFETY: the driver did not take these; ownership is ours again.
        .map(|p| unsafe { Mbuf::from_raw(p) })
        .collect();
    frames.splice(0..0, unsent);
    sent
}

impl FramePort for Port {
    type Frame = Mbuf;

    /// Polls its RX queues.
    fn rx_burst(&mut self, _now: u64, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let check = self.checks_ip();
        rx_queues(
            self.id,
            self.rx.clone(),
            check,
            out,
            max,
            &mut self.rx_bad_checksum,
            &mut self.rx_unjoinable,
        )
    }

    fn tx_burst(&mut self, _now: u64, frames: &mut Vec<Mbuf>) -> usize {
        tx_queue(self.id, self.tx, frames)
    }

    /// From the stash, refilled [`BULK`] at a time; one by one when the
    /// pool has fewer left.
    fn alloc(&mut self) -> Option<Mbuf> {
        if let Some(m) = self.stash.pop() {
            return Some(m);
        }
        if self.dev.pool.alloc_bulk(&mut self.stash, BULK) {
            return self.stash.pop();
        }
        self.dev.pool.alloc()
    }

    /// To their pool in one call per [`BULK`].
    fn recycle(&mut self, frames: &mut Vec<Mbuf>) {
        Mbuf::free_bulk(frames);
    }

    fn buffers_held(&self) -> usize {
        self.stash.len()
    }

    fn tx_ready(&self, _now: u64) -> usize {
        BURST
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    fn link_up(&self) -> bool {
        Port::link_up(self)
    }
}

/// The RX queues of a port, for an RX pipe thread (it keeps the port's
/// settings and counters; only its RX side is reachable).
#[derive(Debug)]
pub struct RxHalf {
    port: Port,
}

impl RxHalf {
    /// Receives up to a burst into `out`.
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>) -> usize {
        let p = &mut self.port;
        let check = p.checks_ip();
        rx_queues(
            p.id,
            p.rx.clone(),
            check,
            out,
            BURST,
            &mut p.rx_bad_checksum,
            &mut p.rx_unjoinable,
        )
    }

    /// The whole port again, once the TX pipe thread has returned its
    /// half; the halves of two different ports are handed back apart.
    pub fn join(self, tx: TxHalf) -> Result<Port, (RxHalf, TxHalf)> {
        if Arc::ptr_eq(&self.port.dev, &tx._dev) {
            Ok(self.port)
        } else {
            Err((self, tx))
        }
    }
}

/// The TX queue of a port, for a TX pipe thread.
#[derive(Debug)]
pub struct TxHalf {
    _dev: Arc<Device>,
    id: u16,
    queue: u16,
    _not_sync: NotSync,
}

impl TxHalf {
    /// Sends from the front of `frames`; what the queue refuses stays.
    pub fn tx_burst(&mut self, frames: &mut Vec<Mbuf>) -> usize {
        tx_queue(self.id, self.queue, frames)
    }
}

impl Frame for Mbuf {
    fn rest(&self) -> Option<(&[u8], &[u8])> {
        Mbuf::rest(self)
    }

    fn linearize(&mut self) -> bool {
        Mbuf::linearize(self)
    }

    fn capacity(&self) -> usize {
        self.tailroom() + self.data().len()
    }

    fn set(&mut self, bytes: &[u8]) -> bool {
        let len = self.data().len();
        if bytes.len() > self.capacity() || !self.trim(len) {
            return false;
        }
        match self.append(bytes.len()) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    fn build(
        &mut self,
        max: usize,
        build: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, TooSmall> {
        let room = self.tailroom();
        if room < max {
            return Err(TooSmall { room, need: max });
        }
        let dst = self.append(room).ok_or(TooSmall { room: 0, need: max })?;
        match build(dst) {
            Some(n) => {
                self.trim(room - n.min(room));
                Ok(Some(n))
            }
            None => {
                self.trim(room);
                Ok(None)
            }
        }
    }
}

fn ring(name: &str, size: u32) -> Result<*mut rte_ring, DpdkError> {
    let c = CString::new(name).expect("ring names have no NUL");
    let flags = dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ;
    // SAFETY: the EAL is initialised (callers hold `Eal`); the name is
    // copied by DPDK.
    let r = unsafe {
        dpdk_sys::rte_ring_create(c.as_ptr(), size, dpdk_sys::consts::SOCKET_ID_ANY, flags)
    };
    if r.is_null() {
        return Err(DpdkError::last(format!("rte_ring_create {name}"), 0));
    }
    Ok(r)
}

/// Two net_ring ports wired back to back (A's TX ring is B's RX ring and
/// the other way round): a link between two hosts of one process. Returns
/// their port ids. The rings live as long as the process's EAL.
pub fn ring_pair(eal: &Eal, name: &str, size: u32) -> Result<(u16, u16), DpdkError> {
    ring_pair_queues(eal, name, size, 1)
}

/// Like [`ring_pair`] with `queues` queues each way (at most 16, net_ring's
/// limit): what A sends on its TX queue `q` arrives on B's RX queue `q`.
pub fn ring_pair_queues(
    _eal: &Eal,
    name: &str,
    size: u32,
    queues: u16,
) -> Result<(u16, u16), DpdkError> {
    if !(1..=16).contains(&queues) {
        return Err(DpdkError {
            what: format!("ring pair {name}"),
            reason: format!("{queues} queues: net_ring ports take 1 to 16"),
        });
    }
    let mut ab = Vec::new();
    let mut ba = Vec::new();
    for q in 0..queues {
        // Queue 0 keeps the one-queue pair's names.
        let sfx = if q == 0 {
            String::new()
        } else {
            format!("{q}")
        };
        ab.push(ring(&format!("{name}_ab{sfx}"), size)?);
        ba.push(ring(&format!("{name}_ba{sfx}"), size)?);
    }
    let n = u32::from(queues);
    let mk = |port: &str, rxs: &[*mut rte_ring], txs: &[*mut rte_ring]| {
        let c = CString::new(port).expect("no NUL");
        // SAFETY: the ring arrays hold `n` valid rings each, which outlive
        // the port.
        let id = unsafe {
            dpdk_sys::rte_eth_from_rings(c.as_ptr(), rxs.as_ptr(), n, txs.as_ptr(), n, 0)
        };
        if id < 0 {
            Err(DpdkError::last(format!("rte_eth_from_rings {port}"), 0))
        } else {
            Ok(id as u16)
        }
    };
    let a = mk(&format!("{name}_a"), &ba, &ab)?;
    let b = mk(&format!("{name}_b"), &ab, &ba)?;
    Ok((a, b))
}
