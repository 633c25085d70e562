//! Fuzz the RC engine with sequences of QP operations (posts, NIC passes,
//! per-frame wire faults, time steps, QP errors, MR deregistration) and
//! arbitrary packets (raw bytes, and well-formed frames with fuzz-chosen
//! headers, so that they pass the ICRC and reach the QP logic). The two
//! engines run in the one NIC pipeline (`nic::Nic::poll`) over the
//! in-memory link, each port wrapped in the fault injector whose script
//! the input drives. The first byte chooses the engines: no congestion
//! control, or HPCC++ inband with sojourn times, path choice (probes on
//! other source ports, moves), INT response subscription and
//! authenticated feedback (forged MACs on ACKs, probe answers and
//! notifications, forged tokens on INT responses, from the crafted
//! frames). Its next bits choose the QPs' service: RC, UC or UD (with an
//! address handle each way); crafted frames may be of any service and go
//! to QP1 too, whose MADs pass through the management agents' dispatch,
//! or to a multicast group the QPs attach to and detach from.
//! Nothing may panic, and every work request completes at most once.
#![no_main]

use std::collections::{HashSet, VecDeque};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use nic::{mem_link, Completions, Direction, Fault, FaultInjector, MemPort, Nic};
use transport::mr::DEFAULT_PD;
use transport::mr::{Access, VecMemory};
use transport::rc::{
    AhAttr, CcMode, ConnectParams, Endpoint, Engine, EngineConfig, PathMtu, QpAccess, QpInit,
    RecvWr, SendWr, SgList, Sge, UdDest, WrOp, MULTICAST_QPN,
};
use transport::wire::{
    AethRepr, DethRepr, HopRecord, MacAddr, Opcode, PacketRepr, ProbeRepr, RethRepr, Service,
};

const BASE: u64 = 0x1_0000;
/// The multicast group UD QPs attach to (and crafted datagrams go to).
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 0, 0, 1);
const SIZE: usize = 1 << 16;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes([
            self.u8()?,
            self.u8()?,
            self.u8()?,
            self.u8()?,
        ]))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn engine(mac: MacAddr, ip: Ipv4Addr, hpcc: bool) -> Engine<VecMemory> {
    let mut mem = VecMemory::new();
    mem.add(BASE, SIZE);
    let mut cfg = EngineConfig::new(mac, ip, 10_000_000_000);
    if hpcc {
        cfg.cc = CcMode::HpccInband { maxhop: 3 };
        cfg.int_sojourn = true;
        cfg.int_subscribe = true;
        cfg.path_choice = Some(pacer::path::PathConfig {
            dwell_ns: 1_000,
            margin: 0.0,
            ..pacer::path::PathConfig::new(1_000)
        });
    }
    Engine::new(cfg, mem, 0)
}

/// Fates of frames, as the input chooses them (delivered once used up).
type Fates = Arc<Mutex<VecDeque<u8>>>;

fn fate(b: u8) -> Fault {
    match b % 6 {
        0 | 1 => Fault::Deliver,
        2 => Fault::Drop,
        3 => Fault::Duplicate,
        4 => Fault::Delay(u64::from(b) * 1000),
        _ => Fault::FlipBit {
            at: usize::from(b) % 80,
            bit: b % 8,
        },
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Bytes(data);
    let (ma, mb) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
    let (ia, ib) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    let first = input.u8().unwrap_or(0);
    let hpcc = first & 1 == 1;
    let service = [Service::Rc, Service::Rc, Service::Uc, Service::Ud][usize::from(first >> 1 & 3)];
    let mut e = [engine(ma, ia, hpcc), engine(mb, ib, hpcc)];
    let keys = [
        e[0].register_mr(BASE, SIZE as u64, Access::ALL).unwrap(),
        e[1].register_mr(BASE, SIZE as u64, Access::ALL).unwrap(),
    ];
    let init = QpInit {
        service,
        ..QpInit::new(8)
    };
    let q = [
        e[0].create_qp_with(init, 0).unwrap(),
        e[1].create_qp_with(init, 0).unwrap(),
    ];
    const QKEY: u32 = 0x1111;
    let mtu = [PathMtu::Mtu256, PathMtu::Mtu1024][usize::from(input.u8().unwrap_or(0) & 1)];
    let params = ConnectParams {
        timeout: 3,
        retry_cnt: 2,
        rnr_retry: 1,
        rd_atomic: 4,
        // HPCC++ engines authenticate their feedback.
        feedback_key: hpcc.then_some(transport::rc::auth::FeedbackKey([3; 16])),
        ..ConnectParams::new(mtu)
    };
    let mut ahs = [0u32; 2];
    for (i, (mac, ip)) in [(mb, ib), (ma, ia)].into_iter().enumerate() {
        if service == Service::Ud {
            e[i].set_qp_qkey(q[i], QKEY).unwrap();
            e[i].modify_to_init(q[i], QpAccess::default()).unwrap();
            e[i].modify_ud_to_rtr(q[i], mtu).unwrap();
            e[i].modify_ud_to_rts(q[i], 0xFF_FFF0).unwrap();
            let attr = AhAttr {
                pd: DEFAULT_PD,
                dest_ip: ip,
                dest_mac: mac,
                dscp: None,
                telemetry: true,
            };
            ahs[i] = e[i].create_ah(attr).unwrap();
            continue;
        }
        let peer = Endpoint {
            qpn: q[1 - i],
            psn: 0xFF_FFF0,
            mac,
            ip,
        };
        e[i].connect_to(q[i], 0xFF_FFF0, &peer, &params).unwrap();
    }
    // The UD address of the other side's QP.
    let ud = |side: usize, qkey: u32| {
        (service == Service::Ud).then_some(UdDest {
            ah: ahs[side],
            remote_qpn: q[1 - side],
            remote_qkey: qkey,
        })
    };
    let mut agents = transport::mad::MadAgents::default();
    let fates: Fates = Arc::new(Mutex::new(VecDeque::new()));
    let wrap = |p: MemPort| {
        let f = fates.clone();
        FaultInjector::scripted(
            p,
            Direction::Rx,
            Box::new(move |_, _, _| f.lock().unwrap().pop_front().map_or(Fault::Deliver, fate)),
        )
    };
    let (pa, pb) = mem_link([ma, mb], 1500, 0);
    let [ea, eb] = e;
    let mut nics = [Nic::new(ea, wrap(pa), 1024), Nic::new(eb, wrap(pb), 1024)];
    let mut now = 0u64;
    let mut posted = HashSet::new();
    let mut completed = HashSet::new();
    let mut next_id = 0u64;
    let mut cqes = [Completions::default(), Completions::default()];
    while let Some(op) = input.u8() {
        let side = usize::from(op >> 7);
        match op & 0x0f {
            0 | 1 => {
                let len = input.u32().unwrap_or(0) % 9000;
                let off = u64::from(input.u32().unwrap_or(0) % (SIZE as u32));
                let buf = Sge {
                    lkey: keys[side].lkey ^ u32::from(op & 0x40 != 0),
                    va: BASE + off,
                    len,
                };
                let rva = BASE + u64::from(input.u32().unwrap_or(0) % (SIZE as u32));
                let kind = if op & 1 == 0 { WrOp::Write } else { WrOp::Read };
                let wr = SendWr {
                    signaled: op & 0x20 == 0,
                    ud: ud(side, QKEY),
                    ..SendWr::new(next_id, kind, buf, keys[1 - side].rkey, rva)
                };
                if nics[side].engine_mut().post_send(q[side], wr, now).is_ok() {
                    posted.insert((side, next_id));
                }
                next_id += 1;
            }
            9 => {
                // SEND, SEND/WRITE with immediate or an atomic, over up to
                // three local buffers, maybe fenced.
                let k = input.u8().unwrap_or(0);
                let rva = BASE + u64::from(input.u32().unwrap_or(0) % (SIZE as u32));
                let kind = match k % 5 {
                    0 => WrOp::Send,
                    1 => WrOp::SendImm(u32::from(k)),
                    2 => WrOp::WriteImm(u32::from(k)),
                    3 => WrOp::CmpSwap {
                        compare: 0,
                        swap: u64::from(k),
                    },
                    _ => WrOp::FetchAdd { add: 1 },
                };
                let mut sges = Vec::new();
                for _ in 0..1 + (k >> 3) % 3 {
                    let off = u64::from(input.u32().unwrap_or(0) % (SIZE as u32));
                    let len = if kind.is_atomic() {
                        8
                    } else {
                        input.u32().unwrap_or(0) % 3000
                    };
                    sges.push(Sge {
                        lkey: keys[side].lkey,
                        va: BASE + off,
                        len,
                    });
                }
                let Ok(sg) = SgList::new(&sges) else { continue };
                let wr = SendWr {
                    sg,
                    fence: k & 0x40 != 0,
                    signaled: k & 0x80 == 0,
                    // A controlled Q_Key now and then.
                    ud: ud(side, if k & 0x20 != 0 { 0x8000_0000 } else { QKEY }),
                    ..SendWr::new(next_id, kind, sges[0], keys[1 - side].rkey, rva)
                };
                if nics[side].engine_mut().post_send(q[side], wr, now).is_ok() {
                    posted.insert((side, next_id));
                }
                next_id += 1;
            }
            10 => {
                let off = u64::from(input.u32().unwrap_or(0) % (SIZE as u32));
                let len = input.u32().unwrap_or(0) % 5000;
                let wr = RecvWr {
                    wr_id: next_id,
                    sg: SgList::one(Sge {
                        lkey: keys[side].lkey,
                        va: BASE + off,
                        len,
                    }),
                };
                if nics[side].engine_mut().post_recv(q[side], wr).is_ok() {
                    posted.insert((side, next_id));
                }
                next_id += 1;
            }
            2 | 3 => {
                // The fates of the next frames, then one pass of `side`.
                let n = usize::from(input.u8().unwrap_or(0) % 8);
                fates.lock().unwrap().extend(input.take(n));
                nics[side].poll(now, &mut cqes[side]);
            }
            4 => {
                let n = usize::from(input.u8().unwrap_or(0));
                let raw = input.take(n).to_vec();
                nics[side].port().inner().inject(now, raw);
            }
            5 => {
                // A well-formed frame with fuzz-chosen headers, of any
                // service, to the QP or (now and then) to QP1.
                let Some((svc, opcode)) = Opcode::decode(input.u8().unwrap_or(0)) else {
                    continue;
                };
                let psn = input.u32().unwrap_or(0);
                let dest = if psn & 4 != 0 {
                    1
                } else if psn & 0x200 != 0 {
                    MULTICAST_QPN
                } else {
                    q[side]
                };
                let mut r = PacketRepr::new(opcode, dest, psn);
                if dest == MULTICAST_QPN {
                    r.ip.dst = GROUP;
                }
                let (smac, sip) = if side == 0 { (mb, ib) } else { (ma, ia) };
                r.eth.src = smac;
                r.ip.src = sip;
                r.bth.ack_req = psn & 1 == 1;
                r.bth.service = svc;
                let l = opcode.layout_in(svc);
                if l.deth {
                    r.deth = Some(DethRepr {
                        q_key: [QKEY, transport::wire::mad::GSI_QKEY, psn]
                            [usize::from(psn as u8 % 3)],
                        src_qp: psn >> 8,
                    });
                }
                if l.reth {
                    r.reth = Some(RethRepr {
                        va: BASE + u64::from(input.u32().unwrap_or(0) % (2 * SIZE as u32)),
                        r_key: if psn & 2 == 0 {
                            keys[side].rkey
                        } else {
                            input.u32().unwrap_or(0)
                        },
                        dma_len: input.u32().unwrap_or(0) % 20_000,
                    });
                }
                if l.aeth {
                    r.aeth = Some(AethRepr {
                        syndrome: input.u8().unwrap_or(0),
                        msn: psn >> 8,
                    });
                }
                if l.immdt {
                    r.imm = Some(psn);
                }
                if l.ieth {
                    r.ieth = Some(keys[side].rkey);
                }
                if l.atomic_eth {
                    r.atomic = Some(transport::wire::AtomicEthRepr {
                        va: BASE + u64::from(input.u32().unwrap_or(0) % (SIZE as u32 / 8)) * 8,
                        r_key: if psn & 2 == 0 {
                            keys[side].rkey
                        } else {
                            input.u32().unwrap_or(0)
                        },
                        swap_add: u64::from(input.u32().unwrap_or(0)),
                        compare: 0,
                    });
                }
                if l.atomic_ack_eth {
                    r.atomic_ack = Some(u64::from(psn));
                }
                if l.probe {
                    // Any probe id: HPCC++ probe mode's, or a path probe's.
                    r.probe = Some(ProbeRepr {
                        probe_id: input.u32().unwrap_or(0),
                        snd_psn: psn,
                        sender_ts_ns: u64::from(psn),
                    });
                }
                if l.notify {
                    r.notify = Some(Default::default());
                }
                if l.tlm_required || psn & 8 != 0 {
                    // A stack with one fuzz-chosen hop, echoed or not,
                    // maybe of sojourn times.
                    let mut t = transport::wire::TlmRepr::empty(2);
                    t.echo = psn & 16 != 0;
                    t.sojourn = psn & 32 != 0;
                    t.nflows = psn & 64 != 0;
                    t.mac = (psn & 128 != 0).then_some(u64::from(psn));
                    t.path_id = (psn >> 16) as u16;
                    t.nhop = 1;
                    t.hops[0] = HopRecord {
                        ts_ns: input.u32().unwrap_or(0),
                        tx_bytes: input.u32().unwrap_or(0),
                        qlen: input.u32().unwrap_or(0),
                        rate: input.u8().map_or(0, |b| u16::from(b) * 8),
                        switch_id: 1,
                        port_id: 1,
                    };
                    r.tlm = Some(t);
                }
                let n = if l.payload {
                    usize::from(input.u8().unwrap_or(0)) * 8
                } else {
                    0
                };
                // A MAD's bytes from the input (its header matters).
                let mut payload = vec![0xA5u8; n];
                let head = input.take(n.min(32)).to_vec();
                payload[..head.len()].copy_from_slice(&head);
                let mut f = vec![0u8; r.frame_len(n)];
                if r.emit(&payload, &mut f).is_ok() {
                    nics[side].port().inner().inject(now, f);
                }
            }
            6 => {
                now += u64::from(input.u32().unwrap_or(0) % 1_000_000);
            }
            7 => {
                let e = nics[side].engine_mut();
                let _ = match input.u8().unwrap_or(0) % 3 {
                    0 => e.modify_to_err(q[side]),
                    1 => e.attach_mcast(q[side], GROUP),
                    _ => e.detach_mcast(q[side], GROUP),
                };
            }
            8 => {
                let _ = nics[side].engine_mut().deregister_mr(keys[side].lkey);
            }
            _ => {
                // Passes of both NICs until neither moves (bounded).
                for _ in 0..64 {
                    let a = nics[0].poll(now, &mut cqes[0]);
                    let b = nics[1].poll(now, &mut cqes[1]);
                    if !a && !b {
                        break;
                    }
                }
            }
        }
        for s in 0..2 {
            // QP1's MADs through the agents' dispatch, the answers queued.
            let mut out = Vec::new();
            while let Some(m) = nics[s].engine_mut().poll_mad() {
                agents.handle(now, &m, &mut out);
            }
            for o in out {
                let _ = nics[s].engine_mut().send_mad(o, now);
            }
            let _ = nics[s].next_wakeup(now);
            for c in cqes[s].0.drain(..) {
                assert!(
                    posted.contains(&(s, c.wr_id)),
                    "completion for a WR never posted"
                );
                assert!(
                    completed.insert((s, c.wr_id)),
                    "WR {} completed twice",
                    c.wr_id
                );
            }
        }
    }
});
