//! Two NICs (the one pipeline, `nic::Nic::poll`) joined by the in-memory
//! link and stepped in virtual time, each port wrapped in the fault
//! injector whose script is a hook that may drop, duplicate or rewrite each
//! frame (quinn-proto's `Pair`). Rule tests that hand-craft frames call
//! the engine directly.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use nic::{mem_link, Completions, Direction, Fault, FaultInjector, MemPort, Nic};
use transport::mr::{Access, MrKeys, VecMemory, DEFAULT_PD};
use transport::rc::{
    AhAttr, AhId, ConnectParams, Cqe, Endpoint, Engine, EngineConfig, PathMtu, QpAccess, QpInit,
    Qpn, RecvWr, SendWr, SgList, Sge, SrqId, UdDest, WrOp,
};
use transport::wire::{
    AethRepr, HopRecord, MacAddr, Opcode, Packet, PacketRepr, RethRepr, RoceFrame, Service,
};

pub const MAC_A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
pub const MAC_B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
pub const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// One-way delay of the wire.
pub const DELAY_NS: u64 = 1_000;
/// Each engine has one region of this size at this VA.
pub const MR_BASE: u64 = 0x10_0000;
pub const MR_LEN: usize = 16 << 20;

/// Where a frame goes: from A to B or from B to A.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    AtoB,
    BtoA,
}

/// What the wire does with a frame.
pub enum Fate {
    Deliver,
    Drop,
    Duplicate,
    /// Flip bit 0 of the byte at this offset.
    Corrupt(usize),
    /// Deliver after a switch pushed this hop record into the TLM block.
    PushHop(HopRecord),
    /// Deliver with ECN set to CE, as a congested switch marks it.
    MarkCe,
    /// Deliver with the TLM block replaced by this one (of the same
    /// length; the ICRC does not cover the block), as an on-path attacker.
    ReplaceTlm(Box<transport::wire::TlmRepr>),
}

/// Decides the fate of each frame: direction, parsed frame, frame number.
pub type Hook = Box<dyn FnMut(Dir, &Packet<'_>, usize) -> Fate + Send>;

/// A wire that loses every frame going `lost` and delivers the rest.
pub fn cut(lost: Dir) -> Hook {
    Box::new(move |dir, _, _| {
        if dir == lost {
            Fate::Drop
        } else {
            Fate::Deliver
        }
    })
}

type Port = FaultInjector<MemPort>;

pub struct Side {
    pub nic: Nic<Port, VecMemory>,
    pub qpn: Qpn,
    /// UD: an address handle of this side to the other.
    pub ah: Option<AhId>,
    pub mr: MrKeys,
    pub srq: Option<SrqId>,
    pub cqes: Completions,
}

impl Side {
    pub fn engine(&self) -> &Engine<VecMemory> {
        self.nic.engine()
    }

    pub fn engine_mut(&mut self) -> &mut Engine<VecMemory> {
        self.nic.engine_mut()
    }
}

/// What the wire saw: every frame sent, in order, and the hook.
struct Wire {
    hook: Hook,
    log: Vec<(Dir, Vec<u8>)>,
    /// When each logged frame went on the wire (virtual ns).
    times: Vec<u64>,
    now: u64,
}

pub struct Pair {
    pub a: Side,
    pub b: Side,
    pub now: u64,
    wire: Arc<Mutex<Wire>>,
}

pub struct Setup {
    pub mtu: PathMtu,
    pub psn_a: u32,
    pub psn_b: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// B's RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// READs and atomics outstanding each way.
    pub rd_atomic: u8,
    /// B's QP takes its receive WQEs from an SRQ of this many.
    pub srq_b: Option<usize>,
    pub access_b: QpAccess,
    pub cfg: fn(MacAddr, Ipv4Addr) -> EngineConfig,
    /// Both QPs' DSCP (None: the engines').
    pub dscp: Option<u8>,
    /// Both QPs' feedback key.
    pub feedback_key: Option<transport::rc::auth::FeedbackKey>,
    /// The QPs' transport service (UD QPs get [`Setup::qkey`] and an
    /// address handle each to the other side instead of a connection).
    pub service: Service,
    pub qkey: u32,
    /// UD: the address handles say the other end speaks our telemetry.
    pub ah_telemetry: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mtu: PathMtu::Mtu1024,
            psn_a: 100,
            psn_b: 5000,
            timeout: 8, // 1 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1, // 10 us
            rd_atomic: 16,
            srq_b: None,
            access_b: QpAccess {
                remote_write: true,
                remote_read: true,
                remote_atomic: true,
            },
            cfg: |mac, ip| EngineConfig::new(mac, ip, 100_000_000_000),
            dscp: None,
            feedback_key: None,
            service: Service::Rc,
            qkey: 0x1111_1111,
            ah_telemetry: false,
        }
    }
}

fn engine(
    mac: MacAddr,
    ip: Ipv4Addr,
    s: &Setup,
    srq: Option<usize>,
) -> (Engine<VecMemory>, MrKeys, Qpn, Option<SrqId>) {
    let mut mem = VecMemory::new();
    mem.add(MR_BASE, MR_LEN);
    let mut engine = Engine::new((s.cfg)(mac, ip), mem, 0);
    let mr = engine
        .register_mr(MR_BASE, MR_LEN as u64, Access::ALL)
        .unwrap();
    let srq = srq.map(|n| engine.create_srq(DEFAULT_PD, n).unwrap());
    let init = QpInit {
        srq,
        service: s.service,
        ..QpInit::new(1024)
    };
    let qpn = engine.create_qp_with(init, 0).unwrap();
    (engine, mr, qpn, srq)
}

/// The fault a hook's fate becomes in the injector.
fn fault(f: Fate) -> Fault {
    match f {
        Fate::Deliver => Fault::Deliver,
        Fate::Drop => Fault::Drop,
        Fate::Duplicate => Fault::Duplicate,
        Fate::Corrupt(at) => Fault::FlipBit { at, bit: 0 },
        Fate::PushHop(hop) => Fault::Rewrite(Box::new(move |f| {
            if let Some(mut t) = RoceFrame::new_checked(f)
                .ok()
                .as_mut()
                .and_then(|v| v.tlm_mut())
            {
                t.push_hop(&hop);
            }
        })),
        Fate::ReplaceTlm(r) => Fault::Rewrite(Box::new(move |f| {
            if let Some(mut t) = RoceFrame::new_checked(f)
                .ok()
                .as_mut()
                .and_then(|v| v.tlm_mut())
            {
                let b = t.bytes_mut();
                if b.len() == r.block_len() {
                    r.emit(b);
                }
            }
        })),
        Fate::MarkCe => Fault::Rewrite(Box::new(|f| {
            if let Ok(mut v) = RoceFrame::new_checked(f) {
                v.mark_ce();
            }
        })),
    }
}

impl Pair {
    pub fn new(s: Setup) -> Pair {
        let (mut ea, ka, qa, _) = engine(MAC_A, IP_A, &s, None);
        let (mut eb, kb, qb, srq) = engine(MAC_B, IP_B, &s, s.srq_b);
        let params = ConnectParams {
            timeout: s.timeout,
            retry_cnt: s.retry_cnt,
            rnr_retry: s.rnr_retry,
            rd_atomic: s.rd_atomic,
            dscp: s.dscp,
            feedback_key: s.feedback_key,
            ..ConnectParams::new(s.mtu)
        };
        let (mut ah_a, mut ah_b) = (None, None);
        if s.service == Service::Ud {
            let up = |e: &mut Engine<VecMemory>, qpn, psn, ip, mac| {
                e.set_qp_qkey(qpn, s.qkey).unwrap();
                e.modify_to_init(qpn, QpAccess::default()).unwrap();
                e.modify_ud_to_rtr(qpn, s.mtu).unwrap();
                e.modify_ud_to_rts(qpn, psn).unwrap();
                let attr = AhAttr {
                    pd: DEFAULT_PD,
                    dest_ip: ip,
                    dest_mac: mac,
                    dscp: None,
                    telemetry: s.ah_telemetry,
                };
                e.create_ah(attr).unwrap()
            };
            ah_a = Some(up(&mut ea, qa, s.psn_a, IP_B, MAC_B));
            ah_b = Some(up(&mut eb, qb, s.psn_b, IP_A, MAC_A));
        } else {
            let end = |qpn, mac, ip, psn| Endpoint { qpn, psn, mac, ip };
            ea.connect_to(qa, s.psn_a, &end(qb, MAC_B, IP_B, s.psn_b), &params)
                .unwrap();
            let pb = ConnectParams {
                access: s.access_b,
                min_rnr_timer: s.min_rnr_timer,
                ..params
            };
            eb.connect_to(qb, s.psn_b, &end(qa, MAC_A, IP_A, s.psn_a), &pb)
                .unwrap();
        }
        let wire = Arc::new(Mutex::new(Wire {
            hook: Box::new(|_, _, _| Fate::Deliver),
            log: Vec::new(),
            times: Vec::new(),
            now: 0,
        }));
        // Each port's injector sees what its NIC sends; frames are numbered
        // in the order they went on the wire, both directions together.
        let script = |dir: Dir| -> nic::faults::Script {
            let wire = wire.clone();
            Box::new(move |_, frame: &[u8], _| {
                let mut w = wire.lock().unwrap();
                let idx = w.log.len();
                w.log.push((dir, frame.to_vec()));
                let now = w.now;
                w.times.push(now);
                let p = Packet::parse(frame).expect("engines emit valid frames");
                fault((w.hook)(dir, &p, idx))
            })
        };
        let (pa, pb) = mem_link([MAC_A, MAC_B], 9000, DELAY_NS);
        let pa = FaultInjector::scripted(pa, Direction::Tx, script(Dir::AtoB));
        let pb = FaultInjector::scripted(pb, Direction::Tx, script(Dir::BtoA));
        let mtu = s.mtu.bytes().max(4096);
        Pair {
            a: Side {
                nic: Nic::new(ea, pa, mtu),
                qpn: qa,
                ah: ah_a,
                mr: ka,
                srq: None,
                cqes: Completions::default(),
            },
            b: Side {
                nic: Nic::new(eb, pb, mtu),
                qpn: qb,
                ah: ah_b,
                mr: kb,
                srq,
                cqes: Completions::default(),
            },
            now: 0,
            wire,
        }
    }

    /// Sets what the wire does with each frame from now on.
    pub fn set_hook(&mut self, hook: Hook) {
        self.wire.lock().unwrap().hook = hook;
    }

    /// Frames sent so far (both directions).
    pub fn frames_sent(&self) -> usize {
        self.wire.lock().unwrap().log.len()
    }

    /// A WRITE (or READ, SEND, atomic) from A's region at `local` to B's
    /// at `remote`.
    pub fn wr(&self, wr_id: u64, op: WrOp, local: u64, remote: u64, len: u32) -> SendWr {
        let buf = Sge {
            lkey: self.a.mr.lkey,
            va: MR_BASE + local,
            len,
        };
        SendWr::new(wr_id, op, buf, self.b.mr.rkey, MR_BASE + remote)
    }

    /// A UD SEND (or SEND with immediate) of `len` bytes from A's region
    /// at `local` to B's QP through A's address handle, with Q_Key `qkey`.
    pub fn ud_wr(&self, wr_id: u64, op: WrOp, local: u64, len: u32, qkey: u32) -> SendWr {
        let mut wr = self.wr(wr_id, op, local, 0, len);
        wr.ud = Some(UdDest {
            ah: self.a.ah.expect("a UD pair"),
            remote_qpn: self.b.qpn,
            remote_qkey: qkey,
        });
        wr
    }

    /// A receive WR of B over its region at `at`, `len` bytes.
    pub fn recv_wr(&self, wr_id: u64, at: u64, len: u32) -> RecvWr {
        RecvWr {
            wr_id,
            sg: SgList::one(Sge {
                lkey: self.b.mr.lkey,
                va: MR_BASE + at,
                len,
            }),
        }
    }

    /// Posts a receive WR to B's QP.
    pub fn post_recv_b(&mut self, wr: RecvWr) {
        let qpn = self.b.qpn;
        self.b.nic.engine_mut().post_recv(qpn, wr).unwrap();
    }

    pub fn post(&mut self, wr: SendWr) {
        let now = self.now;
        self.a
            .nic
            .engine_mut()
            .post_send(self.a.qpn, wr, now)
            .unwrap();
    }

    /// One pass of each NIC at `now` (A first), then on to the next event
    /// (arrival, timer or pacing); false when nothing is left to happen
    /// before `limit`.
    pub fn step(&mut self, limit: u64) -> bool {
        let now = self.now;
        self.wire.lock().unwrap().now = now;
        self.a.nic.poll(now, &mut self.a.cqes);
        self.b.nic.poll(now, &mut self.b.cqes);
        let next = [self.a.nic.next_wakeup(now), self.b.nic.next_wakeup(now)]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else {
            return false;
        };
        if t > limit {
            return false;
        }
        self.now = self.now.max(t);
        true
    }

    /// Runs until nothing is pending or `limit` ns of virtual time pass.
    pub fn run(&mut self, limit: u64) {
        let end = self.now + limit;
        while self.step(end) {}
    }

    /// When each frame going `dir` was sent, with its opcode.
    pub fn timed_ops(&self, dir: Dir) -> Vec<(u64, Opcode)> {
        let w = self.wire.lock().unwrap();
        w.log
            .iter()
            .zip(&w.times)
            .filter(|((d, _), _)| *d == dir)
            .map(|((_, f), &t)| (t, Packet::parse(f).expect("valid frames").repr.bth.opcode))
            .collect()
    }

    /// Every frame on the wire so far: direction and opcode.
    pub fn frame_log(&self) -> Vec<(Dir, Opcode)> {
        self.wire
            .lock()
            .unwrap()
            .log
            .iter()
            .map(|(d, f)| {
                (
                    *d,
                    Packet::parse(f)
                        .expect("engines emit valid frames")
                        .repr
                        .bth
                        .opcode,
                )
            })
            .collect()
    }

    pub fn completions_b(&mut self) -> Vec<Cqe> {
        let mut out = std::mem::take(&mut self.b.cqes.0);
        out.extend(std::iter::from_fn(|| {
            self.b.nic.engine_mut().poll_completion()
        }));
        out
    }

    pub fn completions_a(&mut self) -> Vec<Cqe> {
        let mut out = std::mem::take(&mut self.a.cqes.0);
        out.extend(std::iter::from_fn(|| {
            self.a.nic.engine_mut().poll_completion()
        }));
        out
    }

    pub fn fill_a(&mut self, off: u64, len: usize, seed: u8) {
        let s = self
            .a
            .nic
            .engine_mut()
            .mem_mut()
            .slice_mut(MR_BASE + off, len);
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(7) ^ seed;
        }
    }

    pub fn fill_b(&mut self, off: u64, len: usize, seed: u8) {
        let s = self
            .b
            .nic
            .engine_mut()
            .mem_mut()
            .slice_mut(MR_BASE + off, len);
        for (i, b) in s.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(13) ^ seed;
        }
    }

    pub fn a_bytes(&self, off: u64, len: usize) -> Vec<u8> {
        self.a.nic.engine().mem().slice(MR_BASE + off, len).to_vec()
    }

    pub fn b_bytes(&self, off: u64, len: usize) -> Vec<u8> {
        self.b.nic.engine().mem().slice(MR_BASE + off, len).to_vec()
    }

    /// A frame from A's QP to B's QP, as A would send it.
    pub fn frame_to_b(
        &self,
        op: Opcode,
        psn: u32,
        ack_req: bool,
        reth: Option<RethRepr>,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut r = self.repr_to_b(op, psn);
        r.bth.ack_req = ack_req;
        r.reth = reth;
        emit(&r, payload)
    }

    /// The headers of a frame from A to B (addresses filled in; the
    /// caller adds what the opcode carries).
    pub fn repr_to_b(&self, op: Opcode, psn: u32) -> PacketRepr {
        let mut r = PacketRepr::new(op, self.b.qpn, psn);
        r.eth.src = MAC_A;
        r.eth.dst = MAC_B;
        r.ip.src = IP_A;
        r.ip.dst = IP_B;
        r
    }

    /// A frame from B's QP to A's QP.
    pub fn frame_to_a(&self, op: Opcode, psn: u32, aeth: Option<AethRepr>) -> Vec<u8> {
        let mut r = PacketRepr::new(op, self.a.qpn, psn);
        r.eth.src = MAC_B;
        r.eth.dst = MAC_A;
        r.ip.src = IP_B;
        r.ip.dst = IP_A;
        r.aeth = aeth;
        let mut buf = vec![0u8; r.frame_len(0)];
        r.emit(&[], &mut buf).unwrap();
        buf
    }

    /// Every frame B wants to send now, parsed to (opcode, PSN, AETH).
    pub fn drain_b(&mut self) -> Vec<(Opcode, u32, Option<AethRepr>)> {
        let mut out = vec![];
        let mut buf = vec![0u8; 9000];
        while let Some(n) = self.b.nic.engine_mut().poll_transmit(self.now, &mut buf) {
            let p = Packet::parse(&buf[..n]).unwrap();
            out.push((p.repr.bth.opcode, p.repr.bth.psn, p.repr.aeth));
        }
        out
    }

    /// Every frame logged in one direction, raw.
    pub fn frames(&self, dir: Dir) -> Vec<Vec<u8>> {
        self.wire
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|(d, _)| *d == dir)
            .map(|(_, f)| f.clone())
            .collect()
    }

    /// Frames logged in one direction, parsed by `f`.
    pub fn logged<T>(&self, dir: Dir, f: impl Fn(&Packet<'_>) -> T) -> Vec<T> {
        self.wire
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|(d, _)| *d == dir)
            .map(|(_, fr)| f(&Packet::parse(fr).unwrap()))
            .collect()
    }

    /// Opcodes of the frames logged in one direction.
    pub fn ops(&self, dir: Dir) -> Vec<Opcode> {
        self.wire
            .lock()
            .unwrap()
            .log
            .iter()
            .filter(|(d, _)| *d == dir)
            .map(|(_, f)| Packet::parse(f).unwrap().repr.bth.opcode)
            .collect()
    }
}

/// The bytes of the frame `r` with `payload`.
pub fn emit(r: &PacketRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; r.frame_len(payload.len())];
    let n = r.emit(payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}
