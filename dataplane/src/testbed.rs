//! The embedded loopback testbed: two hosts in one process, each an RC
//! engine on its own DPDK port, the ports joined back to back by net_ring
//! rings (or any two ports that reach each other). Each host is the one
//! NIC pipeline (`nic::Nic::poll`) over its [`HostPort`], optionally
//! lossy (the fault injector) and tapped (a pcap capture of what both
//! hosts send). Two layouts: run-to-completion on the calling lcore
//! ([`Loopback::poll`]), or pipelined over three threads joined by bounded
//! crossbeam queues ([`Loopback::run_pipelined`]: RX pipe -> the NIC
//! pipelines with congestion control and the flow scheduler -> TX pipe),
//! as in the HPCC++ drafts' NIC figure.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;

use nic::pcap::PcapFileError;
use nic::{
    Capture, Completions, Direction, FaultConfig, FaultCounters, FaultInjector, FramePort, Nic,
    SharedCapture, Tap,
};
use transport::mr::{Access, MrError, MrKeys, VecMemory};
use transport::rc::{
    ConnectParams, Endpoint, Engine, EngineConfig, PathMtu, Qpn, RcError, SendWr, Sge, WcStatus,
    WrOp,
};
use transport::wire::MacAddr;

use crate::dpdk::{ring_pair, DpdkError, Eal, LcoreGuard, Mbuf, Mempool, Port, TscClock};
use crate::host_port::{link, link_mut, DpdkLink, HostPort};
use crate::pipe::PipePort;

/// Settings of the loopback testbed.
#[derive(Debug, Clone)]
pub struct LoopbackConfig {
    /// Bytes of registered memory per host, at VA `MEM_BASE`.
    pub mem_bytes: usize,
    pub mtu: PathMtu,
    /// Mbufs in the pool shared by both ports.
    pub mbufs: u32,
    /// Line rate the engines pace at, b/s.
    pub line_rate_bps: u64,
    /// Mirror every frame either host sends into this pcap file.
    pub tap: Option<PathBuf>,
    /// RX/TX queues per port (up to what the device offers; RSS when it
    /// hashes UDP).
    pub queues: u16,
    /// Seeded faults on one host's port.
    pub faults: Option<HostFaults>,
}

/// Seeded faults on one host's port.
#[derive(Debug, Clone)]
pub struct HostFaults {
    /// The host whose port misbehaves.
    pub host: usize,
    pub faults: FaultConfig,
    /// A pcap of every frame the faults lose (both directions).
    pub lost_pcap: Option<PathBuf>,
}

impl HostFaults {
    /// Host `i`'s faults, when it is the one.
    pub fn of(faults: &Option<HostFaults>, i: usize) -> Option<FaultConfig> {
        faults.as_ref().filter(|f| f.host == i).map(|f| f.faults)
    }

    /// The capture of lost frames, when one is asked for: each is in the
    /// file as soon as it is lost (the interop judge reads it while the
    /// daemon runs).
    pub fn lost_capture(
        faults: &Option<HostFaults>,
    ) -> Result<Option<SharedCapture>, PcapFileError> {
        match faults.as_ref().and_then(|f| f.lost_pcap.as_ref()) {
            Some(path) => Capture::create_direct(path, u64::MAX).map(Some),
            None => Ok(None),
        }
    }
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            mem_bytes: 4 << 20,
            mtu: PathMtu::Mtu1024,
            mbufs: 4095,
            line_rate_bps: 10_000_000_000,
            tap: None,
            queues: 1,
            faults: None,
        }
    }
}

/// Why the testbed could not be built or an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error(transparent)]
    Dpdk(#[from] DpdkError),
    #[error("QP bring-up: {0}")]
    Qp(#[from] RcError),
    #[error("registering host memory: {0}")]
    Memory(#[from] MrError),
    #[error("tap: {0}")]
    Tap(#[from] PcapFileError),
    #[error("faults of host {host}: {source}")]
    Faults {
        host: usize,
        source: nic::faults::BadProbability,
    },
    #[error("faults on host {0}: the testbed has hosts 0 and 1")]
    FaultHost(usize),
    #[error("{len} bytes exceed half of the memory ({half})")]
    TooLong { len: u32, half: u64 },
    #[error("{op:?} of {len} bytes completed with {status:?}")]
    Completion {
        op: WrOp,
        len: u32,
        status: WcStatus,
    },
    #[error("{op:?} of {len} bytes: the two ends differ")]
    Mismatch { op: WrOp, len: u32 },
}

/// A number for this testbed's DPDK object names (pools and rings are
/// named per EAL, and a process may build several testbeds).
fn instance() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// VA of each host's registered memory.
pub const MEM_BASE: u64 = 0x1000_0000;

/// One host of the testbed.
pub struct Host {
    pub nic: Nic<HostPort, VecMemory>,
    pub qpn: Qpn,
    pub mr: MrKeys,
    /// Completions of the host's QP, oldest first.
    pub cqes: Completions,
}

impl Host {
    pub fn engine(&self) -> &Engine<VecMemory> {
        self.nic.engine()
    }

    pub fn engine_mut(&mut self) -> &mut Engine<VecMemory> {
        self.nic.engine_mut()
    }

    /// The DPDK port (`None` while the pipelined layout runs).
    pub fn port(&self) -> Option<&Port> {
        link(self.nic.port()).port()
    }

    /// What the host's fault injector did.
    pub fn faults(&self) -> &FaultCounters {
        self.nic.port().inner().counters()
    }
}

/// Where a testbed WRITE or READ moves bytes: a WRITE copies host 0's
/// first half of memory into host 1's second half, a READ host 1's first
/// half into host 0's second half (offsets from `MEM_BASE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpPlan {
    /// Host 0's buffer (the WR's local VA).
    pub local: u64,
    /// Host 1's buffer (the WR's remote VA).
    pub remote: u64,
    /// The host whose buffer (at offset 0) holds the data to move.
    pub src: usize,
}

impl OpPlan {
    pub fn new(op: WrOp, mem_bytes: usize) -> Self {
        let half = (mem_bytes / 2) as u64;
        if op == WrOp::Read {
            OpPlan {
                local: half,
                remote: 0,
                src: 1,
            }
        } else {
            OpPlan {
                local: 0,
                remote: half,
                src: 0,
            }
        }
    }
}

/// Two hosts joined by their ports.
pub struct Loopback {
    // Field order is drop order: the hosts (their mbufs and ports) before
    // the pool.
    pub hosts: [Host; 2],
    pool: Arc<Mempool>,
    clock: TscClock,
    capture: Option<SharedCapture>,
    /// The frames the faults lost, when recorded.
    lost: Option<SharedCapture>,
    /// The lcore ids the RX and TX pipe threads of the last pipelined run
    /// registered as (they are DPDK lcores, with mempool caches).
    pub pipeline_lcores: Vec<u32>,
    /// Frames the pipes freed when a pipelined run stopped (queued towards
    /// the engines, or towards ports that no longer took them).
    pub pipe_dropped: u64,
    mem_bytes: usize,
}

/// MAC of testbed host `i` (the static neighbour table: no ARP).
pub fn host_mac(i: u8) -> MacAddr {
    MacAddr([0x02, 0, 0, 0, 0, i + 1])
}

/// IPv4 address of testbed host `i`.
pub fn host_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, i + 1)
}

/// A host's port: the DPDK port inside its faults (if any, recording what
/// they lose into `lost`) and its tap.
pub fn host_port(
    link: DpdkLink,
    faults: Option<FaultConfig>,
    lost: Option<SharedCapture>,
    capture: Option<SharedCapture>,
    direction: Direction,
) -> Result<HostPort, nic::faults::BadProbability> {
    let f = FaultInjector::maybe(link, faults)?.record_losses(lost);
    Ok(Tap::new(f, capture, direction))
}

impl Loopback {
    /// Creates the rings, ports, pool and both engines, with one QP on each
    /// host connected to the other (PSNs start at 0).
    pub fn new(eal: &Eal, cfg: &LoopbackConfig) -> Result<Loopback, TestbedError> {
        let n = instance();
        let pool = Self::pool(eal, cfg, n)?;
        let (pa, pb) = ring_pair(eal, &format!("loopback{n}"), 1024)?;
        Self::with_ports(eal, cfg, pool, pa, pb)
    }

    /// The pool, its mbufs sized for the path MTU's frames.
    fn pool(eal: &Eal, cfg: &LoopbackConfig, n: u32) -> Result<Arc<Mempool>, DpdkError> {
        let frame = cfg.mtu.bytes() as usize + nic::MAX_HEADERS;
        Mempool::with_frames(eal, &format!("loopback_pool{n}"), cfg.mbufs, 0, frame).map(Arc::new)
    }

    /// The testbed on two existing ports that reach each other (a memif
    /// server/client pair, two ends of a veth under af_packet, ...).
    pub fn on_ports(
        eal: &Eal,
        cfg: &LoopbackConfig,
        pa: u16,
        pb: u16,
    ) -> Result<Loopback, TestbedError> {
        let pool = Self::pool(eal, cfg, instance())?;
        Self::with_ports(eal, cfg, pool, pa, pb)
    }

    fn with_ports(
        eal: &Eal,
        cfg: &LoopbackConfig,
        pool: Arc<Mempool>,
        pa: u16,
        pb: u16,
    ) -> Result<Loopback, TestbedError> {
        if let Some(f) = cfg.faults.as_ref().filter(|f| f.host > 1) {
            return Err(TestbedError::FaultHost(f.host));
        }
        let capture = match &cfg.tap {
            Some(path) => Some(Capture::create(path, u64::MAX)?),
            None => None,
        };
        let lost = HostFaults::lost_capture(&cfg.faults)?;
        let mk = |i: u8, port_id: u16| -> Result<Host, TestbedError> {
            let mut mem = VecMemory::new();
            mem.add(MEM_BASE, cfg.mem_bytes);
            let mut engine = Engine::new(
                EngineConfig::new(host_mac(i), host_ip(i), cfg.line_rate_bps),
                mem,
                0,
            );
            let mr = engine.register_mr(MEM_BASE, cfg.mem_bytes as u64, Access::ALL)?;
            let qpn = engine.create_qp(256, 0)?;
            let port = Port::start_queues(eal, port_id, &pool, 1024, cfg.queues)?;
            let faults = HostFaults::of(&cfg.faults, usize::from(i));
            let port = host_port(
                DpdkLink::Port(port),
                faults,
                lost.clone(),
                capture.clone(),
                Direction::Tx,
            )
            .map_err(|source| TestbedError::Faults {
                host: usize::from(i),
                source,
            })?;
            Ok(Host {
                nic: Nic::new(engine, port, cfg.mtu.bytes()),
                qpn,
                mr,
                cqes: Completions::default(),
            })
        };
        let mut hosts = [mk(0, pa)?, mk(1, pb)?];
        let qpns = [hosts[0].qpn, hosts[1].qpn];
        let params = ConnectParams::new(cfg.mtu);
        for (i, h) in hosts.iter_mut().enumerate() {
            let peer = 1 - i;
            let end = Endpoint {
                qpn: qpns[peer],
                psn: 0,
                mac: host_mac(peer as u8),
                ip: host_ip(peer as u8),
            };
            let q = h.qpn;
            h.engine_mut().connect_to(q, 0, &end, &params)?;
        }
        Ok(Loopback {
            hosts,
            pool,
            clock: TscClock::new(eal),
            capture,
            lost,
            pipeline_lcores: Vec::new(),
            pipe_dropped: 0,
            mem_bytes: cfg.mem_bytes,
        })
    }

    /// Nanoseconds since the testbed started (the engines' clock).
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// One run-to-completion pass of both hosts' pipelines; returns
    /// whether anything moved.
    pub fn poll(&mut self) -> bool {
        let now = self.clock.now_ns();
        let mut moved = false;
        for h in self.hosts.iter_mut() {
            moved |= h.nic.poll(now, &mut h.cqes);
        }
        moved
    }

    /// Runs the pipelined layout until `app` returns false: an RX thread
    /// bursts frames off both ports, the calling thread runs both hosts'
    /// pipelines over the engine side of the pipes and then `app` (post
    /// work, read completions), a TX thread bursts frames out. Queues are
    /// bounded (backpressure, never dropping); frames still queued at the
    /// end are freed, and the ports go back to run-to-completion.
    pub fn run_pipelined(&mut self, mut app: impl FnMut(&mut [Host; 2], u64) -> bool) {
        use crossbeam_channel::bounded;
        use std::sync::atomic::{AtomicBool, Ordering};

        const DEPTH: usize = 4096;
        let mut rx_halves = Vec::new();
        let mut tx_halves = Vec::new();
        let mut rx_sends = Vec::new();
        let mut tx_recvs = Vec::new();
        for h in self.hosts.iter_mut() {
            let (rx_send, rx_recv) = bounded::<Mbuf>(DEPTH);
            let (tx_send, tx_recv) = bounded::<Mbuf>(DEPTH);
            let l = link_mut(h.nic.port_mut());
            let DpdkLink::Port(p) = l else {
                unreachable!("run-to-completion between pipelined runs")
            };
            let pipe = PipePort::new(
                rx_recv,
                tx_send,
                self.pool.clone(),
                FramePort::mac(p),
                FramePort::mtu(p),
            );
            let DpdkLink::Port(port) = std::mem::replace(l, DpdkLink::Pipe(pipe)) else {
                unreachable!("matched above")
            };
            let (rx, tx) = port.split();
            rx_halves.push(rx);
            tx_halves.push(tx);
            rx_sends.push(rx_send);
            tx_recvs.push(tx_recv);
        }
        let stop = AtomicBool::new(false);
        let pool = &*self.pool;
        let clock = self.clock;
        let hosts = &mut self.hosts;
        let lcores = std::sync::Mutex::new(Vec::new());
        let lcores = &lcores;
        // Passes of the TX pipe without progress, after the stop, before it
        // frees what the ports will not take (a link gone down).
        const DRAIN_PASSES: u32 = 100_000;
        let ((rx_halves, rx_dropped), (tx_halves, tx_dropped)) = std::thread::scope(|s| {
            let stop_rx = &stop;
            let rx = s.spawn(move || {
                let lcore = LcoreGuard::register(pool);
                if let Ok(g) = &lcore {
                    lcores.lock().expect("lcores").push(g.lcore_id);
                }
                let mut got = Vec::with_capacity(crate::dpdk::port::BURST);
                let mut dropped = 0u64;
                while !stop_rx.load(Ordering::Relaxed) {
                    for (half, send) in rx_halves.iter_mut().zip(&rx_sends) {
                        half.rx_burst(&mut got);
                        for mut m in got.drain(..) {
                            // Waits for room (backpressure) until the stop.
                            loop {
                                match send.try_send(m) {
                                    Ok(()) => break,
                                    Err(e) if !stop_rx.load(Ordering::Relaxed) && e.is_full() => {
                                        m = e.into_inner();
                                        std::hint::spin_loop();
                                    }
                                    Err(_) => {
                                        dropped += 1;
                                        break;
                                    }
                                }
                            }
                        }
                    }
                }
                (rx_halves, dropped)
            });
            let stop_tx = &stop;
            let tx = s.spawn(move || {
                let lcore = LcoreGuard::register(pool);
                if let Ok(g) = &lcore {
                    lcores.lock().expect("lcores").push(g.lcore_id);
                }
                let mut out: Vec<Vec<Mbuf>> = tx_halves.iter().map(|_| Vec::new()).collect();
                let mut stalled = 0u32;
                loop {
                    let mut progress = false;
                    for (i, recv) in tx_recvs.iter().enumerate() {
                        while out[i].len() < crate::dpdk::port::BURST {
                            let Ok(m) = recv.try_recv() else {
                                break;
                            };
                            out[i].push(m);
                        }
                        if !out[i].is_empty() {
                            progress |= tx_halves[i].tx_burst(&mut out[i]) > 0;
                        }
                    }
                    if stop_tx.load(Ordering::Relaxed) {
                        let empty = tx_recvs.iter().all(|r| r.is_empty())
                            && out.iter().all(|o| o.is_empty());
                        stalled = if progress { 0 } else { stalled + 1 };
                        if empty || stalled > DRAIN_PASSES {
                            break;
                        }
                    }
                }
                // Frames the ports never took are freed here (Drop).
                let left = out.iter().map(|o| o.len() as u64).sum::<u64>()
                    + tx_recvs.iter().map(|r| r.len() as u64).sum::<u64>();
                (tx_halves, left)
            });
            {
                // Stops the pipes however this loop ends (a panicking app
                // included), so that the scope can join them.
                struct StopGuard<'a>(&'a AtomicBool);
                impl Drop for StopGuard<'_> {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::Relaxed);
                    }
                }
                let _stop = StopGuard(&stop);
                loop {
                    let now = clock.now_ns();
                    for h in hosts.iter_mut() {
                        h.nic.poll(now, &mut h.cqes);
                    }
                    if !app(hosts, now) {
                        break;
                    }
                }
            }
            (
                rx.join().expect("RX pipe thread"),
                tx.join().expect("TX pipe thread"),
            )
        });
        // Back to run-to-completion; frames still queued towards the
        // engines are freed with the pipes, and counted.
        let queued: u64 = self
            .hosts
            .iter()
            .map(|h| match link(h.nic.port()) {
                DpdkLink::Pipe(p) => p.queued() as u64,
                DpdkLink::Port(_) | DpdkLink::Shard(_) => 0,
            })
            .sum();
        self.pipe_dropped += rx_dropped + tx_dropped + queued;
        for ((h, rx), tx) in self.hosts.iter_mut().zip(rx_halves).zip(tx_halves) {
            let port = rx.join(tx).expect("the halves of one port, split above");
            *link_mut(h.nic.port_mut()) = DpdkLink::Port(port);
        }
        self.pipeline_lcores = lcores.lock().expect("lcores").clone();
    }

    /// Counters of both ports, pipelines, engines and QPs now.
    pub fn snapshot(&self) -> crate::stats::Snapshot {
        let mut s = crate::stats::Snapshot {
            at_ns: self.clock.now_ns(),
            ..Default::default()
        };
        for (i, h) in self.hosts.iter().enumerate() {
            s.add_nic(i, &h.nic, &[h.qpn]);
        }
        s
    }

    /// One WRITE (host 0's first half of memory into host 1's second half)
    /// or READ (host 1's first half into host 0's second half) of `len`
    /// bytes, run-to-completion: the source is filled with a pattern from
    /// `seed`, the operation posted and polled to completion, and both ends
    /// compared.
    pub fn verified_op(&mut self, op: WrOp, len: u32, seed: u8) -> Result<(), TestbedError> {
        let half = (self.mem_bytes / 2) as u64;
        if u64::from(len) > half {
            return Err(TestbedError::TooLong { len, half });
        }
        let OpPlan { local, remote, src } = OpPlan::new(op, self.mem_bytes);
        let mem = self.hosts[src]
            .engine_mut()
            .mem_mut()
            .slice_mut(MEM_BASE, len as usize);
        for (k, b) in mem.iter_mut().enumerate() {
            *b = (k as u8).wrapping_mul(7) ^ seed;
        }
        let buf = Sge {
            lkey: self.hosts[0].mr.lkey,
            va: MEM_BASE + local,
            len,
        };
        let wr = SendWr::new(
            u64::from(seed),
            op,
            buf,
            self.hosts[1].mr.rkey,
            MEM_BASE + remote,
        );
        let (qpn, now) = (self.hosts[0].qpn, self.now());
        self.hosts[0].engine_mut().post_send(qpn, wr, now)?;
        let c = loop {
            self.poll();
            if !self.hosts[0].cqes.0.is_empty() {
                break self.hosts[0].cqes.0.remove(0);
            }
        };
        if c.status != WcStatus::Success {
            return Err(TestbedError::Completion {
                op,
                len,
                status: c.status,
            });
        }
        let a = self.hosts[0]
            .engine()
            .mem()
            .slice(MEM_BASE + local, len as usize);
        let b = self.hosts[1]
            .engine()
            .mem()
            .slice(MEM_BASE + remote, len as usize);
        if a != b {
            return Err(TestbedError::Mismatch { op, len });
        }
        Ok(())
    }

    /// Host `i`'s port (`None` while pipelined).
    pub fn port(&self, i: usize) -> Option<&Port> {
        self.hosts[i].port()
    }

    /// Whether both hosts' links are up.
    pub fn links_up(&self) -> bool {
        self.hosts.iter().all(|h| h.nic.port().link_up())
    }

    /// Frames the pipelines could not send for want of a buffer.
    pub fn tx_alloc_failures(&self) -> u64 {
        self.hosts
            .iter()
            .map(|h| h.nic.counters().tx_no_buffer + h.nic.counters().tx_buffer_too_small)
            .sum()
    }

    /// Mbufs of the pool in use (frames in rings and queues), not counting
    /// those the pipelines hold for their next frames.
    pub fn mbufs_in_use(&self) -> u32 {
        let held: usize = self.hosts.iter().map(|h| h.nic.buffers_held()).sum();
        self.pool.in_use().saturating_sub(held as u32)
    }

    /// Closes the tap's pcap file; the frames it recorded.
    pub fn finish_tap(&mut self) -> Result<Option<u64>, TestbedError> {
        Ok(nic::tap::close(self.capture.take())?.map(|(written, _)| written))
    }

    /// Closes the pcap of the frames the faults lost; the frames in it.
    pub fn finish_lost(&mut self) -> Result<Option<u64>, TestbedError> {
        Ok(nic::tap::close(self.lost.take())?.map(|(written, _)| written))
    }
}
