//! The embedded loopback testbed: two hosts in one process, each an RC
//! engine on its own DPDK port, the ports joined back to back by net_ring
//! rings, with an optional tap that keeps a copy of every frame. Two
//! layouts: run-to-completion on the calling lcore ([`Loopback::poll`]: RX
//! burst -> engine -> timers -> TX burst), or pipelined over three threads
//! joined by bounded crossbeam queues ([`Loopback::run_pipelined`]: RX pipe
//! -> engines with congestion control and the flow scheduler -> TX pipe),
//! as in the HPCC++ drafts' NIC figure.

use std::net::Ipv4Addr;

use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    Engine, EngineConfig, PathMtu, QpAccess, Qpn, RtrAttr, RtsAttr, SendWr, WcStatus, WrOp,
};
use transport::wire::MacAddr;

use crate::dpdk::{ring_pair, DpdkError, Eal, LcoreGuard, Mbuf, Mempool, Port, TscClock};
use crate::nic::{rx_pass, tx_pass, TxScratch};

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
    /// Keep a copy of every frame sent (the tap).
    pub tap: bool,
    /// RX/TX queues per port (up to what the device offers; RSS when it
    /// hashes UDP).
    pub queues: u16,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            mem_bytes: 4 << 20,
            mtu: PathMtu::Mtu1024,
            mbufs: 4095,
            line_rate_bps: 10_000_000_000,
            tap: false,
            queues: 1,
        }
    }
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
    pub engine: Engine<VecMemory>,
    pub qpn: Qpn,
    pub mr: MrKeys,
    port: Port,
    tx: Vec<Mbuf>,
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

/// A host as the pipelined layout's application step sees it.
pub struct HostView<'a> {
    pub engine: &'a mut Engine<VecMemory>,
    pub qpn: Qpn,
    pub mr: MrKeys,
}

/// Two hosts joined by net_ring ports.
pub struct Loopback {
    // Field order is drop order: ports and mbufs before their pool.
    pub hosts: [Host; 2],
    spare: Option<Mbuf>,
    pool: Mempool,
    clock: TscClock,
    scratch: Vec<u8>,
    rx: Vec<Mbuf>,
    /// Frames sent by either host, when the tap is on.
    pub tap: Option<Vec<Vec<u8>>>,
    /// Frames that could not get an mbuf (pool empty) and were dropped.
    pub tx_alloc_failures: u64,
    max_frame: usize,
    /// The lcore ids the RX and TX pipe threads of the last pipelined run
    /// registered as (they are DPDK lcores, with mempool caches).
    pub pipeline_lcores: Vec<u32>,
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

impl Loopback {
    /// Creates the rings, ports, pool and both engines, with one QP on each
    /// host connected to the other (PSNs start at 0).
    pub fn new(eal: &Eal, cfg: &LoopbackConfig) -> Result<Loopback, DpdkError> {
        let n = instance();
        let pool = Self::pool(eal, cfg, n)?;
        let (pa, pb) = ring_pair(eal, &format!("loopback{n}"), 1024)?;
        Self::with_ports(eal, cfg, pool, pa, pb)
    }

    /// The pool, its mbufs sized for the path MTU's frames.
    fn pool(eal: &Eal, cfg: &LoopbackConfig, n: u32) -> Result<Mempool, DpdkError> {
        let frame = cfg.mtu.bytes() as usize + crate::nic::MAX_HEADERS;
        Mempool::with_frames(eal, &format!("loopback_pool{n}"), cfg.mbufs, 0, frame)
    }

    /// The testbed on two existing ports that reach each other (a memif
    /// server/client pair, two ends of a veth under af_packet, ...).
    pub fn on_ports(
        eal: &Eal,
        cfg: &LoopbackConfig,
        pa: u16,
        pb: u16,
    ) -> Result<Loopback, DpdkError> {
        let pool = Self::pool(eal, cfg, instance())?;
        Self::with_ports(eal, cfg, pool, pa, pb)
    }

    fn with_ports(
        eal: &Eal,
        cfg: &LoopbackConfig,
        pool: Mempool,
        pa: u16,
        pb: u16,
    ) -> Result<Loopback, DpdkError> {
        let rc_err = |e: transport::rc::RcError| DpdkError {
            what: "QP bring-up".into(),
            reason: e.to_string(),
        };
        let mk = |i: u8, port_id: u16| -> Result<Host, DpdkError> {
            let mut mem = VecMemory::new();
            mem.add(MEM_BASE, cfg.mem_bytes);
            let mut engine = Engine::new(
                EngineConfig::new(host_mac(i), host_ip(i), cfg.line_rate_bps),
                mem,
                0,
            );
            let mr = engine
                .register_mr(MEM_BASE, cfg.mem_bytes as u64, Access::ALL)
                .map_err(|e| DpdkError {
                    what: "register memory".into(),
                    reason: e.to_string(),
                })?;
            let qpn = engine.create_qp(256, 0).map_err(rc_err)?;
            let port = Port::start_queues(eal, port_id, &pool, 1024, cfg.queues)?;
            Ok(Host {
                engine,
                qpn,
                mr,
                port,
                tx: Vec::with_capacity(64),
            })
        };
        let mut hosts = [mk(0, pa)?, mk(1, pb)?];
        let qpns = [hosts[0].qpn, hosts[1].qpn];
        for (i, h) in hosts.iter_mut().enumerate() {
            let peer = 1 - i;
            let e = &mut h.engine;
            e.connect(
                h.qpn,
                QpAccess {
                    remote_write: true,
                    remote_read: true,
                },
                RtrAttr {
                    path_mtu: cfg.mtu,
                    dest_qpn: qpns[peer],
                    dest_mac: host_mac(peer as u8),
                    dest_ip: host_ip(peer as u8),
                    rq_psn: 0,
                    max_dest_rd_atomic: 16,
                },
                RtsAttr {
                    sq_psn: 0,
                    timeout: 14,
                    retry_cnt: 7,
                    rnr_retry: 7,
                    max_rd_atomic: 16,
                },
            )
            .map_err(rc_err)?;
        }
        Ok(Loopback {
            hosts,
            spare: None,
            pool,
            clock: TscClock::new(eal),
            scratch: vec![0u8; 16 * 1024],
            rx: Vec::with_capacity(crate::dpdk::port::BURST),
            tap: cfg.tap.then(Vec::new),
            tx_alloc_failures: 0,
            max_frame: cfg.mtu.bytes() as usize + crate::nic::MAX_HEADERS,
            pipeline_lcores: Vec::new(),
            mem_bytes: cfg.mem_bytes,
        })
    }

    /// Nanoseconds since the testbed started (the engines' clock).
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// One run-to-completion pass over both hosts; returns whether any
    /// frame moved.
    pub fn poll(&mut self) -> bool {
        let now = self.clock.now_ns();
        let mut moved = false;
        for h in self.hosts.iter_mut() {
            moved |= rx_pass(&h.port, &mut self.rx, &mut h.engine, now);
            let mut s = TxScratch {
                pool: &self.pool,
                buf: &mut self.scratch,
                max_frame: self.max_frame,
                spare: &mut self.spare,
                tap: self.tap.as_mut(),
                alloc_failures: &mut self.tx_alloc_failures,
            };
            moved |= tx_pass(&mut h.engine, &h.port, &mut h.tx, &mut s, now);
        }
        moved
    }

    /// Runs the pipelined layout until `app` returns false: an RX thread
    /// bursts frames off both ports, the calling thread runs both engines
    /// (handle_packet, timers, poll_transmit) and then `app` (post work,
    /// poll completions), a TX thread bursts frames out. Queues are bounded
    /// (backpressure, never dropping); leftover frames are freed at the end.
    pub fn run_pipelined(&mut self, mut app: impl FnMut(&mut [HostView<'_>; 2], u64) -> bool) {
        use crossbeam_channel::bounded;
        use std::sync::atomic::{AtomicBool, Ordering};

        const DEPTH: usize = 4096;
        let (rx_send, rx_recv) = bounded::<(usize, Mbuf)>(DEPTH);
        let (tx_send, tx_recv) = bounded::<(usize, Mbuf)>(DEPTH);
        let stop = AtomicBool::new(false);
        // The engine thread needs the engines mutably, the pipes only the
        // ports: borrow the fields apart.
        let [h0, h1] = &mut self.hosts;
        let ports: [&Port; 2] = [&h0.port, &h1.port];
        let mut hosts = [
            HostView {
                engine: &mut h0.engine,
                qpn: h0.qpn,
                mr: h0.mr,
            },
            HostView {
                engine: &mut h1.engine,
                qpn: h1.qpn,
                mr: h1.mr,
            },
        ];
        let hosts = &mut hosts;
        let pool = &self.pool;
        let clock = self.clock;
        let tap = &mut self.tap;
        let failures = &mut self.tx_alloc_failures;
        let scratch = &mut self.scratch;
        let lcores = std::sync::Mutex::new(Vec::new());
        let lcores = &lcores;
        std::thread::scope(|s| {
            let stop_rx = &stop;
            s.spawn(move || {
                let lcore = LcoreGuard::register(pool);
                if let Ok(g) = &lcore {
                    lcores.lock().expect("lcores").push(g.lcore_id);
                }
                let mut rx = Vec::with_capacity(crate::dpdk::port::BURST);
                while !stop_rx.load(Ordering::Relaxed) {
                    for (i, p) in ports.iter().enumerate() {
                        p.rx_burst(&mut rx);
                        for m in rx.drain(..) {
                            if rx_send.send((i, m)).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            let stop_tx = &stop;
            s.spawn(move || {
                let lcore = LcoreGuard::register(pool);
                if let Ok(g) = &lcore {
                    lcores.lock().expect("lcores").push(g.lcore_id);
                }
                let mut out: [Vec<Mbuf>; 2] = [Vec::new(), Vec::new()];
                loop {
                    while let Ok((i, m)) = tx_recv.try_recv() {
                        out[i].push(m);
                        if out[i].len() >= crate::dpdk::port::BURST {
                            break;
                        }
                    }
                    for (i, o) in out.iter_mut().enumerate() {
                        if !o.is_empty() {
                            ports[i].tx_burst(o);
                        }
                    }
                    if stop_tx.load(Ordering::Relaxed) && tx_recv.is_empty() {
                        break;
                    }
                }
                // Frames the ports never took are freed here (Drop).
            });
            loop {
                let now = clock.now_ns();
                while let Ok((i, m)) = rx_recv.try_recv() {
                    hosts[i].engine.handle_packet(now, m.data());
                }
                for (i, h) in hosts.iter_mut().enumerate() {
                    if h.engine.poll_timeout().is_some_and(|t| t <= now) {
                        h.engine.handle_timeout(now);
                    }
                    while tx_send.len() < DEPTH - crate::dpdk::port::BURST {
                        let Some(n) = h.engine.poll_transmit(now, scratch) else {
                            break;
                        };
                        if let Some(t) = tap.as_mut() {
                            t.push(scratch[..n].to_vec());
                        }
                        match pool.alloc() {
                            Some(mut m) => match m.append(n) {
                                Some(dst) => {
                                    dst.copy_from_slice(&scratch[..n]);
                                    let _ = tx_send.send((i, m));
                                }
                                None => *failures += 1,
                            },
                            None => *failures += 1,
                        }
                    }
                }
                if !app(hosts, now) {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            drop(tx_send);
            // Frames still queued towards the engines are freed with rx_recv.
            drop(rx_recv);
        });
        self.pipeline_lcores = lcores.lock().expect("lcores").clone();
    }

    /// Counters of both ports, engines and QPs now.
    pub fn snapshot(&self) -> crate::stats::Snapshot {
        let mut s = crate::stats::Snapshot {
            at_ns: self.clock.now_ns(),
            ..Default::default()
        };
        for (i, h) in self.hosts.iter().enumerate() {
            s.add_host(i, h.port.id, h.port.stats(), &h.engine, &[h.qpn]);
        }
        s
    }

    /// One WRITE (host 0's first half of memory into host 1's second half)
    /// or READ (host 1's first half into host 0's second half) of `len`
    /// bytes, run-to-completion: the source is filled with a pattern from
    /// `seed`, the operation posted and polled to completion, and both ends
    /// compared. Errors name what went wrong.
    pub fn verified_op(&mut self, op: WrOp, len: u32, seed: u8) -> Result<(), String> {
        let half = (self.mem_bytes / 2) as u64;
        if u64::from(len) > half {
            return Err(format!("{len} bytes exceed half of the memory ({half})"));
        }
        let OpPlan { local, remote, src } = OpPlan::new(op, self.mem_bytes);
        let mem = self.hosts[src]
            .engine
            .mem_mut()
            .slice_mut(MEM_BASE, len as usize);
        for (k, b) in mem.iter_mut().enumerate() {
            *b = (k as u8).wrapping_mul(7) ^ seed;
        }
        let wr = SendWr {
            wr_id: u64::from(seed),
            op,
            lkey: self.hosts[0].mr.lkey,
            local_va: MEM_BASE + local,
            len,
            rkey: self.hosts[1].mr.rkey,
            remote_va: MEM_BASE + remote,
            signaled: true,
        };
        let (qpn, now) = (self.hosts[0].qpn, self.now());
        self.hosts[0]
            .engine
            .post_send(qpn, wr, now)
            .map_err(|e| e.to_string())?;
        let c = loop {
            self.poll();
            if let Some(c) = self.hosts[0].engine.poll_completion() {
                break c;
            }
        };
        if c.status != WcStatus::Success {
            return Err(format!(
                "{op:?} of {len} bytes completed with {:?}",
                c.status
            ));
        }
        let a = self.hosts[0]
            .engine
            .mem()
            .slice(MEM_BASE + local, len as usize);
        let b = self.hosts[1]
            .engine
            .mem()
            .slice(MEM_BASE + remote, len as usize);
        if a != b {
            return Err(format!("{op:?} of {len} bytes: the two ends differ"));
        }
        Ok(())
    }

    /// Host `i`'s port.
    pub fn port(&self, i: usize) -> &Port {
        &self.hosts[i].port
    }

    /// Whether both hosts' links are up.
    pub fn links_up(&self) -> bool {
        self.hosts.iter().all(|h| h.port.link_up())
    }

    /// Mbufs of the pool in use (frames in rings and queues).
    /// (The spare mbuf kept for the next frame does not count.)
    pub fn mbufs_in_use(&self) -> u32 {
        self.pool.in_use() - u32::from(self.spare.is_some())
    }
}
