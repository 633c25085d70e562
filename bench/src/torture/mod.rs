//! `bench torture`: two NICs (`nic::Nic::poll`, the pipeline every driver
//! runs) joined by the in-memory link in virtual time, each port wrapped in
//! the seeded fault injector, running a random mix of WRITEs, READs, SENDs,
//! immediates and atomics and verifying every byte, every immediate and
//! every atomic result; the FETCH_ADDs of all QPs share one counter, whose
//! final value must be the sum of the adds that completed.
//!
//! With `--service uc` or `ud` the QPs are Unreliable Connected or
//! Unreliable Datagram and the mix is their operations (UC: SEND, SEND
//! with immediate, WRITE with immediate; UD: the two SENDs, up to the
//! MTU). A lost message is no error there, but every message that arrives
//! must be intact, reach the right QP, and (UC) arrive once: the receiver
//! keeps `depth` receive WQEs per QP posted from a pool of buffers, and
//! each receive completion is matched to its operation by the immediate
//! or by the operation number stamped in the data (SENDs without
//! immediate are at least 8 bytes for that), then checked in full; an
//! operation whose requester completed and whose message did not arrive
//! within a millisecond of virtual time counts as lost. UD runs HPCC++ per
//! destination: samples and their echoes cross the faults too.
//!
//! Faults hit every packet kind in both directions: loss, duplication,
//! reordering (extra delay) and corruption (one random bit flipped inside
//! the bytes the ICRC protects: masked fields such as TTL, ECN, the UDP
//! checksum, BTH byte 4 and the TLM block are rewritten in flight by design
//! and are not corruption targets). Every WRITE's data starts with its
//! operation number, so a stale duplicate applied after a newer WRITE to
//! the same slot is seen when the slot is checked again.

mod ops;

use std::collections::VecDeque;
use std::net::Ipv4Addr;

pub use ops::OpKind;
use ops::Plan;

use nic::{mem_link, Completions, Direction, FaultConfig, FaultInjector, MemPort, Nic};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use transport::mr::DEFAULT_PD;
use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    AhAttr, ConnectParams, Cqe, Endpoint, Engine, EngineConfig, PathMtu, QpAccess, Qpn, RecvWr,
    SgList, Sge, UdDest, WcOpcode, WcStatus,
};
use transport::wire::{MacAddr, Service};

/// The QPs' transport service (`--service`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServiceArg {
    Rc,
    Uc,
    Ud,
}

impl ServiceArg {
    fn service(self) -> Service {
        match self {
            ServiceArg::Rc => Service::Rc,
            ServiceArg::Uc => Service::Uc,
            ServiceArg::Ud => Service::Ud,
        }
    }

    /// The operations of the service that the torture can check.
    fn kinds(self) -> &'static [OpKind] {
        match self {
            ServiceArg::Rc => &OpKind::ALL,
            ServiceArg::Uc => &[OpKind::Send, OpKind::SendImm, OpKind::WriteImm],
            ServiceArg::Ud => &[OpKind::Send, OpKind::SendImm],
        }
    }
}

/// Virtual time after its requester completed that an unreliable
/// operation's message may take to arrive before it counts as lost (the
/// link's delay and the injector's reordering are microseconds).
const LOSS_WAIT_NS: u64 = 1_000_000;
/// The Q_Key of the UD QPs.
const QKEY: u32 = 0x7070_0001;

/// Flags of `bench torture`.
#[derive(Debug, Clone, clap::Args)]
pub struct TortureArgs {
    /// Seed of the workload and of the faults.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Operations to run, drawn evenly from `--mix`.
    #[arg(long, default_value_t = 1000)]
    pub ops: u64,
    /// Operation kinds to run (any subset, comma-separated; with --service
    /// uc or ud, of the service's operations, all of them by default).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = OpKind::ALL)]
    pub mix: Vec<OpKind>,
    /// The QPs' transport service: rc, uc (send, send_imm, write_imm) or
    /// ud (send, send_imm up to the MTU; the engines run HPCC++ inband, so
    /// that every datagram's path is sampled and the samples echoed under
    /// the faults too).
    #[arg(long, value_enum, default_value_t = ServiceArg::Rc)]
    pub service: ServiceArg,
    /// Fraction of the responder's receive WQEs posted late (after
    /// `--recv-delay-us`), so that SENDs meet RNR NAKs.
    #[arg(long, default_value_t = 0.0)]
    pub late_recv: f64,
    /// Fraction of the requester's WRs posted unsignaled (no completion
    /// when they succeed, so their ACKs are coalesced: only every 16th
    /// message end asks for one). An unsignaled operation is checked once
    /// its WR has left the send queue.
    #[arg(long, default_value_t = 0.0)]
    pub unsignaled: f64,
    /// How late a late receive WQE is posted, microseconds of virtual time.
    #[arg(long, default_value_t = 300)]
    pub recv_delay_us: u64,
    /// Probability that a frame is lost.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Probability that a frame is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    pub dup: f64,
    /// Probability that a frame is delayed past later ones.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Probability that one bit of a frame is flipped.
    #[arg(long, default_value_t = 0.0)]
    pub corrupt: f64,
    /// Largest message in bytes (sizes are drawn log-uniformly from 0, with
    /// the MTU edges 1, MTU-1, MTU, MTU+1 favoured).
    #[arg(long, default_value_t = 65536)]
    pub max_msg: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 1024)]
    pub mtu: u32,
    /// QP pairs, each with its own operations.
    #[arg(long, default_value_t = 1)]
    pub qps: u32,
    /// First PSN of every QP in both directions (near 16777215 to cross the
    /// 24-bit wrap).
    #[arg(long, default_value_t = 0)]
    pub start_psn: u32,
    /// Stop the peer after this many operations have completed; the rest
    /// must end with RETRY_EXC_ERR / WR_FLUSH_ERR.
    #[arg(long)]
    pub kill_peer_after: Option<u64>,
    /// Operations outstanding per QP.
    #[arg(long, default_value_t = 4)]
    pub depth: u32,
    /// Unacknowledged PSNs per QP (the requester's window).
    #[arg(long, default_value_t = 128)]
    pub window: u32,
    /// Local ACK timeout exponent: 4.096 us x 2^timeout.
    #[arg(long, default_value_t = 4)]
    pub timeout: u8,
    /// Retries after a timeout (0-7).
    #[arg(long, default_value_t = 7)]
    pub retry_cnt: u8,
    /// Virtual-time limit in milliseconds; operations still pending then
    /// count as hung.
    #[arg(long, default_value_t = 600_000)]
    pub time_limit_ms: u64,
}

/// What a run found. The last line of the output is `Display` of this.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    pub ops: u64,
    pub ok: u64,
    pub failed: u64,
    pub dup_applied: u64,
    pub corrupted_accepted: u64,
    pub hung: u64,
    /// CMP_SWAPs and FETCH_ADDs verified.
    pub atomics_ok: u64,
    /// RNR NAKs the requesters received.
    pub rnr_naks: u64,
    pub counter: CounterCheck,
    /// UC/UD: operations whose message never arrived (no error there).
    pub lost: u64,
    /// UD: messages that arrived twice (UD may; each took a WQE).
    pub dup_received: u64,
    /// UC/UD: receive completions that matched no operation of their QP,
    /// or whose data, length, immediate or sender was wrong, or that came
    /// after their operation counted as lost.
    pub misdelivered: u64,
}

/// The final check of the shared FETCH_ADD counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CounterCheck {
    /// The completed adds form one chain (each saw the value the previous
    /// one left) and the counter holds their sum.
    #[default]
    Ok,
    Mismatch,
    /// A FETCH_ADD failed (dead peer): whether it executed is unknown.
    NotChecked,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let counter = match self.counter {
            CounterCheck::Ok => "ok",
            CounterCheck::Mismatch => "MISMATCH",
            CounterCheck::NotChecked => "not_checked",
        };
        write!(
            f,
            "ops={} ok={} failed={} dup_applied={} corrupted_accepted={} hung={} atomics_ok={} rnr_naks={} counter={counter}",
            self.ops,
            self.ok,
            self.failed,
            self.dup_applied,
            self.corrupted_accepted,
            self.hung,
            self.atomics_ok,
            self.rnr_naks
        )?;
        if self.lost + self.dup_received + self.misdelivered > 0 {
            write!(
                f,
                " lost={} dup_received={} misdelivered={}",
                self.lost, self.dup_received, self.misdelivered
            )?;
        }
        Ok(())
    }
}

/// Wire and engine statistics of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    pub frames: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub icrc_drops: u64,
    pub retransmitted: u64,
    pub timeouts: u64,
    pub virtual_ns: u64,
    /// After a peer kill: operations that ended with RETRY_EXC_ERR,
    /// WR_FLUSH_ERR, or were refused at post (QP already in ERR).
    pub retry_exc: u64,
    pub flushed: u64,
    pub refused: u64,
    pub other_failures: u64,
}

const MAC_A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const MAC_B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const BASE: u64 = 0x1000_0000;
const DELAY_NS: u64 = 2_000;
const LINE_BPS: u64 = 100_000_000_000;

type Port = FaultInjector<MemPort>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpState {
    Pending,
    Ok,
    Failed,
    /// UC/UD: its message never arrived.
    Lost,
}

#[derive(Debug, Clone, Copy)]
struct Op {
    qp: usize,
    slot: usize,
    plan: Plan,
    state: OpState,
    /// The requester's completion status, once it came.
    sent: Option<WcStatus>,
    /// Whether the responder's receive completion was the right one.
    recv: Option<bool>,
    /// When the requester's completion came (UC/UD: the message may take
    /// [`LOSS_WAIT_NS`] more).
    sent_at: u64,
}

/// The data of operation `id`: a seeded stream stamped with the id.
pub(crate) fn pattern(id: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    ChaCha8Rng::seed_from_u64(id ^ 0x5eed).fill_bytes(&mut v);
    let stamp = id.to_le_bytes();
    let n = len.min(8);
    v[..n].copy_from_slice(&stamp[..n]);
    v
}

struct Host {
    nic: Nic<Port, VecMemory>,
    mr: MrKeys,
    qpns: Vec<Qpn>,
    /// UD: the address handle to the other host.
    ah: Option<u32>,
}

fn host(
    mac: MacAddr,
    ip: Ipv4Addr,
    bytes: u64,
    args: &TortureArgs,
    port: Port,
) -> Result<Host, String> {
    let mut mem = VecMemory::new();
    mem.add(BASE, bytes as usize);
    let mut cfg = EngineConfig::new(mac, ip, LINE_BPS);
    cfg.max_outstanding_psns = args.window.max(1);
    if args.service == ServiceArg::Ud {
        cfg.cc = transport::rc::CcMode::HpccInband { maxhop: 3 };
    }
    let mut engine = Engine::new(cfg, mem, 0);
    let mr = engine
        .register_mr(BASE, bytes, Access::ALL)
        .map_err(|e| e.to_string())?;
    let qpns = (0..args.qps)
        .map(|_| {
            let init = transport::rc::QpInit {
                max_recv_wr: args.depth as usize * 2,
                service: args.service.service(),
                ..transport::rc::QpInit::new(args.depth as usize * 2)
            };
            engine.create_qp_with(init, 0)
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    Ok(Host {
        nic: Nic::new(engine, port, args.mtu),
        mr,
        qpns,
        ah: None,
    })
}

/// Brings up `a`'s QPs towards `b`'s (both start at `--start-psn`).
fn connect(a: &mut Host, b: &Host, mac: MacAddr, ip: Ipv4Addr, args: &TortureArgs, mtu: PathMtu) {
    if args.service == ServiceArg::Ud {
        let e = a.nic.engine_mut();
        for q in &a.qpns {
            e.set_qp_qkey(*q, QKEY).expect("a UD QP");
            e.modify_to_init(*q, QpAccess::default())
                .expect("RESET -> INIT");
            e.modify_ud_to_rtr(*q, mtu).expect("INIT -> RTR");
            e.modify_ud_to_rts(*q, args.start_psn).expect("RTR -> RTS");
        }
        let attr = AhAttr {
            pd: DEFAULT_PD,
            dest_ip: ip,
            dest_mac: mac,
            dscp: None,
            telemetry: true,
        };
        a.ah = Some(e.create_ah(attr).expect("an address handle"));
        return;
    }
    let params = ConnectParams {
        timeout: args.timeout,
        retry_cnt: args.retry_cnt,
        ..ConnectParams::new(mtu)
    };
    for (qa, qb) in a.qpns.iter().zip(&b.qpns) {
        let peer = Endpoint {
            qpn: *qb,
            psn: args.start_psn,
            mac,
            ip,
        };
        a.nic
            .engine_mut()
            .connect_to(*qa, args.start_psn, &peer, &params)
            .expect("fresh QPs with checked attributes come up");
    }
}

/// The seeded faults of one direction: frames are hit as the receiving
/// port takes them off the link.
fn faults(args: &TortureArgs, seed: u64) -> FaultConfig {
    FaultConfig {
        seed,
        loss: args.loss,
        duplicate: args.dup,
        reorder: args.reorder,
        corrupt: args.corrupt,
        reorder_ns: 4 * DELAY_NS,
        direction: Direction::Rx,
        ..FaultConfig::default()
    }
}

/// Runs the torture test; `progress` gets a line now and then.
pub fn run(
    args: &TortureArgs,
    mut progress: impl FnMut(&str),
) -> Result<(Report, WireStats), String> {
    let mtu = PathMtu::from_bytes(args.mtu)
        .ok_or_else(|| format!("--mtu {} is not 256, 512, 1024, 2048 or 4096", args.mtu))?;
    for (name, p) in [
        ("loss", args.loss),
        ("dup", args.dup),
        ("reorder", args.reorder),
        ("corrupt", args.corrupt),
    ] {
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("--{name} {p} is not a probability in [0, 1]"));
        }
    }
    if args.start_psn > 0xFF_FFFF {
        return Err(format!(
            "--start-psn {} exceeds 24 bits (16777215)",
            args.start_psn
        ));
    }
    if args.qps == 0 || args.depth == 0 {
        return Err("--qps and --depth must be at least 1".into());
    }
    if args.retry_cnt > 7 {
        return Err(format!("--retry-cnt {} exceeds 7", args.retry_cnt));
    }
    if args.mix.is_empty() {
        return Err("--mix names no operation kind".into());
    }
    let unreliable = args.service != ServiceArg::Rc;
    let kinds = args.service.kinds();
    let mix: Vec<OpKind> = if unreliable && args.mix == OpKind::ALL {
        kinds.to_vec()
    } else {
        args.mix.clone()
    };
    if let Some(k) = mix.iter().find(|k| !kinds.contains(k)) {
        return Err(format!(
            "--mix {k} is not an operation the torture can check on {} QPs ({})",
            args.service.service().name(),
            kinds
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // UD: one packet a datagram. UC/UD SENDs without immediate carry
    // their operation's number in their first 8 bytes.
    let max_msg = match args.service {
        ServiceArg::Ud => args.max_msg.min(args.mtu),
        _ => args.max_msg,
    };
    if unreliable {
        if args.kill_peer_after.is_some() || args.late_recv > 0.0 {
            return Err(format!(
                "--kill-peer-after and --late-recv are for RC QPs, not {}",
                args.service.service().name()
            ));
        }
        if max_msg < 8 {
            return Err(format!(
                "--max-msg {max_msg}: UC and UD SENDs need 8 bytes for their stamp"
            ));
        }
    }
    for (flag, v) in [
        ("--late-recv", args.late_recv),
        ("--unsignaled", args.unsignaled),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(format!("{flag} {v} is not a fraction in [0, 1]"));
        }
    }
    let slot_bytes = (u64::from(max_msg) + 64).next_multiple_of(64);
    let slots_per_qp = args.depth as usize;
    // The slots, the shared FETCH_ADD counter, then (UC/UD) the receive
    // buffers, `depth` per QP, each with room for a GRH.
    let counter = BASE + slot_bytes * u64::from(args.qps) * slots_per_qp as u64;
    let pool = counter + 64;
    let buf_bytes = slot_bytes + 64;
    let bufs = if unreliable {
        args.qps as usize * slots_per_qp
    } else {
        0
    };
    let bytes = pool - BASE + bufs as u64 * buf_bytes;
    let buf_va = |i: usize| pool + i as u64 * buf_bytes;
    let (pa, pb) = mem_link([MAC_A, MAC_B], args.mtu, DELAY_NS);
    let wrap = |p, seed| FaultInjector::new(p, faults(args, seed)).map_err(|e| format!("--{e}"));
    let seeds = (args.seed.wrapping_mul(2), args.seed.wrapping_mul(2) + 1);
    let mut a = host(MAC_A, IP_A, bytes, args, wrap(pa, seeds.0)?)?;
    let mut b = host(MAC_B, IP_B, bytes, args, wrap(pb, seeds.1)?)?;
    connect(&mut a, &b, MAC_B, IP_B, args, mtu);
    connect(&mut b, &a, MAC_A, IP_A, args, mtu);
    // UC/UD: every receive buffer posted once, to its QP.
    let recv_buf = |lkey: u32, i: usize| RecvWr {
        wr_id: i as u64,
        sg: SgList::one(Sge {
            lkey,
            va: buf_va(i),
            len: buf_bytes as u32,
        }),
    };
    for i in 0..bufs {
        let qpn = b.qpns[i / slots_per_qp];
        b.nic
            .engine_mut()
            .post_recv(qpn, recv_buf(b.mr.lkey, i))
            .map_err(|e| format!("posting receive buffer {i}: {e}"))?;
    }

    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut ops: Vec<Op> = Vec::with_capacity(args.ops as usize);
    // Last operation of each (qp, slot), and whether the slot is busy.
    let mut slot_last: Vec<Option<u64>> = vec![None; args.qps as usize * slots_per_qp];
    let mut slot_busy = vec![false; slot_last.len()];
    let mut report = Report {
        ops: args.ops,
        ..Report::default()
    };
    let mut stats = WireStats::default();
    let mut now = 0u64;
    let mut cqes = Completions::default();
    let mut b_cqes = Completions::default();
    // Receive WQEs waiting to be posted at the responder, per QP, in post
    // order (they are consumed in the order the SENDs arrive).
    let mut recv_due: Vec<VecDeque<(u64, RecvWr)>> = vec![VecDeque::new(); args.qps as usize];
    let limit = args.time_limit_ms.saturating_mul(1_000_000);
    let mut killed = false;
    let mut done = 0u64;
    let va = |qp: usize, slot: usize| BASE + (qp * slots_per_qp + slot) as u64 * slot_bytes;
    let mut last_progress = 0u64;
    // (original value, addend) of every verified FETCH_ADD.
    let mut fetch_adds: Vec<(u64, u64)> = Vec::new();
    let mut fetch_add_failed = false;
    // Operations whose requester completed and that are not settled yet.
    let mut settling: Vec<usize> = Vec::new();
    // Per QP: WRs posted, and the unsignaled ones (post number, operation)
    // not known to be complete: a WR has completed once it left the send
    // queue, and a failed one always reports.
    let mut posted = vec![0u64; args.qps as usize];
    let mut unsignaled: Vec<VecDeque<(u64, usize)>> = vec![VecDeque::new(); args.qps as usize];

    // Checks a slot against the last operation that wrote it at the
    // responder: a stale duplicate applied later shows an older stamp.
    // (A UC/UD SEND's data is in a receive buffer, checked on arrival.)
    let recheck =
        |b: &Host, ops: &[Op], slot_last: &[Option<u64>], s: usize, report: &mut Report| {
            if let Some(id) = slot_last[s] {
                let op = ops[id as usize];
                let in_slot = !unreliable || op.plan.kind == OpKind::WriteImm;
                if let (Some(want), OpState::Ok, true) =
                    (op.plan.responder_slot(id), op.state, in_slot)
                {
                    let got = b.nic.engine().mem().slice(va(op.qp, op.slot), want.len());
                    if got != &want[..] {
                        report.dup_applied += 1;
                    }
                }
            }
        };

    loop {
        // Post what the depth allows (all ops before a kill must finish first).
        let gate = args.kill_peer_after.filter(|_| !killed);
        while (ops.len() as u64) < args.ops && gate.is_none_or(|k| (ops.len() as u64) < k) {
            let qp = rng.gen_range(0..args.qps as usize);
            let Some(slot) = (0..slots_per_qp).find(|&s| !slot_busy[qp * slots_per_qp + s]) else {
                break;
            };
            let s = qp * slots_per_qp + slot;
            recheck(&b, &ops, &slot_last, s, &mut report);
            let id = ops.len() as u64;
            let kind = mix[rng.gen_range(0..mix.len())];
            let m = args.mtu;
            let len = match rng.gen_range(0..10) {
                0 => [0, 1, m - 1, m, m + 1][rng.gen_range(0..5)].min(max_msg),
                1 => max_msg,
                _ => {
                    let bits = 32 - max_msg.leading_zeros();
                    (rng.gen_range(0..=u64::from(max_msg)) >> rng.gen_range(0..=bits)) as u32
                }
            };
            let len = if unreliable && kind == OpKind::Send {
                len.max(8)
            } else {
                len
            };
            let plan = Plan::new(kind, id, len, &mut rng);
            let addr = va(qp, slot);
            let len = plan.len as usize;
            let (mem_a, mem_b) = (a.nic.engine_mut().mem_mut(), b.nic.engine_mut().mem_mut());
            match kind {
                OpKind::Read => mem_b
                    .slice_mut(addr, len)
                    .copy_from_slice(&pattern(id, len)),
                OpKind::FetchAdd => mem_a.slice_mut(addr, 8).fill(0),
                OpKind::CmpSwap => {
                    mem_a.slice_mut(addr, 8).fill(0);
                    mem_b
                        .slice_mut(addr, 8)
                        .copy_from_slice(&plan.before.to_ne_bytes());
                }
                _ => mem_a
                    .slice_mut(addr, len)
                    .copy_from_slice(&pattern(id, len)),
            }
            ops.push(Op {
                qp,
                slot,
                plan,
                state: OpState::Pending,
                sent: None,
                recv: None,
                sent_at: 0,
            });
            slot_busy[s] = true;
            slot_last[s] = Some(id);
            let rc_recv = (!unreliable)
                .then(|| plan.recv_wr(id, b.mr.lkey, addr))
                .flatten();
            if let Some(r) = rc_recv {
                let late = args.late_recv > 0.0 && rng.gen_bool(args.late_recv);
                let at = now + if late { args.recv_delay_us * 1000 } else { 0 };
                let q = &mut recv_due[qp];
                let at = q.back().map_or(at, |&(t, _)| at.max(t));
                q.push_back((at, r));
            }
            let mut wr = plan.wr(id, a.mr.lkey, addr, b.mr.rkey, addr, counter);
            wr.signaled = !(args.unsignaled > 0.0 && rng.gen_bool(args.unsignaled));
            wr.ud = a.ah.map(|ah| UdDest {
                ah,
                remote_qpn: b.qpns[qp],
                remote_qkey: QKEY,
            });
            if a.nic.engine_mut().post_send(a.qpns[qp], wr, now).is_err() {
                ops[id as usize].state = OpState::Failed;
                slot_busy[s] = false;
                report.failed += 1;
                stats.refused += 1;
                done += 1;
            } else {
                if !wr.signaled {
                    unsignaled[qp].push_back((posted[qp], id as usize));
                }
                posted[qp] += 1;
            }
        }

        // Receive WQEs whose time has come; then one pass of each NIC: RX,
        // timers, TX onto the faulty link. A dead peer is no longer polled.
        if !killed {
            for (qp, q) in recv_due.iter_mut().enumerate() {
                while q.front().is_some_and(|&(t, _)| t <= now) {
                    let (_, r) = q.pop_front().expect("front checked");
                    b.nic
                        .engine_mut()
                        .post_recv(b.qpns[qp], r)
                        .map_err(|e| format!("posting receive WQE {}: {e}", r.wr_id))?;
                }
            }
        }
        a.nic.poll(now, &mut cqes);
        if !killed {
            b.nic.poll(now, &mut b_cqes);
        }

        // Completions: the requester's, then the responder's receive ones.
        for c in cqes.0.drain(..) {
            let id = c.wr_id;
            let Some(op) = ops.get_mut(id as usize) else {
                return Err(format!("completion for unknown operation {id}"));
            };
            if op.state != OpState::Pending || op.sent.is_some() {
                return Err(format!("operation {id} completed twice"));
            }
            op.sent = Some(c.status);
            op.sent_at = now;
            settling.push(id as usize);
        }
        // Unsignaled WRs that left the send queue without a completion
        // succeeded.
        for (qp, q) in unsignaled.iter_mut().enumerate() {
            if q.is_empty() {
                continue;
            }
            let queued = a
                .nic
                .engine()
                .qp_send_queued(a.qpns[qp])
                .map_err(|e| format!("QP {qp}: {e}"))?;
            let left = posted[qp] - queued as u64;
            while q.front().is_some_and(|&(n, _)| n < left) {
                let (_, id) = q.pop_front().expect("front checked");
                if ops[id].sent.is_none() {
                    ops[id].sent = Some(WcStatus::Success);
                    ops[id].sent_at = now;
                    settling.push(id);
                }
            }
        }
        let taken = if unreliable {
            std::mem::take(&mut b_cqes.0)
        } else {
            Vec::new()
        };
        for c in taken {
            let i = c.wr_id as usize;
            if i >= bufs {
                return Err(format!("receive completion for unknown buffer {i}"));
            }
            let at = buf_va(i);
            match arrived(args.service, &ops, &a, &b, &c, at, va) {
                Some(id) if ops[id].recv.is_some() => match args.service {
                    // UD may deliver a duplicated datagram twice.
                    ServiceArg::Ud => report.dup_received += 1,
                    _ => report.dup_applied += 1,
                },
                Some(id) if ops[id].state == OpState::Lost => report.misdelivered += 1,
                Some(id) => ops[id].recv = Some(true),
                None => report.misdelivered += 1,
            }
            let qpn = b.qpns[i / slots_per_qp];
            b.nic
                .engine_mut()
                .post_recv(qpn, recv_buf(b.mr.lkey, i))
                .map_err(|e| format!("posting receive buffer {i} again: {e}"))?;
        }
        for c in b_cqes.0.drain(..) {
            let id = c.wr_id;
            let Some(op) = ops.get_mut(id as usize) else {
                return Err(format!("receive completion for unknown operation {id}"));
            };
            if op.recv.is_some() {
                return Err(format!("operation {id} received twice"));
            }
            op.recv = Some(op.plan.recv_ok(&c));
        }
        // Operations whose requester completed settle once the receive
        // completion they need (if any) is in.
        let mut waiting = Vec::new();
        for id in settling.drain(..) {
            let op = ops[id];
            let Some(status) = op.sent else { continue };
            let waits_recv = status == WcStatus::Success && op.plan.kind.needs_recv();
            let s = op.qp * slots_per_qp + op.slot;
            if waits_recv && op.recv.is_none() {
                if unreliable && now >= op.sent_at + LOSS_WAIT_NS {
                    // Its message never came: no error on UC and UD.
                    ops[id].state = OpState::Lost;
                    report.lost += 1;
                    slot_busy[s] = false;
                    done += 1;
                    continue;
                }
                waiting.push(id);
                continue;
            }
            slot_busy[s] = false;
            done += 1;
            // UC/UD: checked in full when it arrived.
            let good = status == WcStatus::Success
                && op.recv != Some(false)
                && (unreliable
                    || verify(&a, &b, &op, id as u64, va(op.qp, op.slot), &mut fetch_adds));
            if good {
                ops[id].state = OpState::Ok;
                report.ok += 1;
                report.atomics_ok += u64::from(op.plan.kind.is_atomic());
            } else {
                ops[id].state = OpState::Failed;
                report.failed += 1;
                fetch_add_failed |= op.plan.kind == OpKind::FetchAdd;
                match status {
                    WcStatus::RetryExcErr => stats.retry_exc += 1,
                    WcStatus::WrFlushErr => stats.flushed += 1,
                    _ => stats.other_failures += 1,
                }
            }
        }
        settling = waiting;
        if done >= args.ops {
            break;
        }
        if let Some(k) = args.kill_peer_after {
            if !killed && done >= k.min(args.ops) {
                killed = true;
                progress(&format!(
                    "peer killed after {done} operations at {} us",
                    now / 1000
                ));
            }
        }
        if now >= last_progress + 1_000_000_000 {
            last_progress = now;
            progress(&format!(
                "{done}/{} operations done at {} ms virtual",
                args.ops,
                now / 1_000_000
            ));
        }

        // Next event (UC/UD: also when a message still awaited counts
        // as lost).
        let lost_at = settling
            .iter()
            .filter(|_| unreliable)
            .map(|&id| ops[id].sent_at + LOSS_WAIT_NS)
            .min();
        let next = [
            a.nic.next_wakeup(now),
            if killed { None } else { b.nic.next_wakeup(now) },
            lost_at,
        ]
        .into_iter()
        .flatten()
        .min();
        let can_post = (ops.len() as u64) < args.ops
            && args
                .kill_peer_after
                .filter(|_| !killed)
                .is_none_or(|k| (ops.len() as u64) < k)
            && slot_busy.iter().any(|b| !b);
        // A free slot is used at once: time moves on only when nothing
        // can be posted.
        if can_post {
            continue;
        }
        let Some(t) = next else {
            break;
        };
        if t > limit {
            break;
        }
        now = now.max(t);
    }

    for s in 0..slot_last.len() {
        recheck(&b, &ops, &slot_last, s, &mut report);
    }
    let final_counter = u64::from_ne_bytes(
        b.nic
            .engine()
            .mem()
            .slice(counter, 8)
            .try_into()
            .expect("8 bytes"),
    );
    report.counter = if fetch_add_failed {
        CounterCheck::NotChecked
    } else if chain_sum(&mut fetch_adds) == Some(final_counter) {
        CounterCheck::Ok
    } else {
        CounterCheck::Mismatch
    };
    report.hung = ops.iter().filter(|o| o.state == OpState::Pending).count() as u64
        + (args.ops - ops.len() as u64);
    let (fa, fb) = (a.nic.port().counters(), b.nic.port().counters());
    stats.frames = fa.frames + fb.frames;
    stats.lost = fa.lost + fb.lost;
    stats.duplicated = fa.duplicated + fb.duplicated;
    stats.reordered = fa.reordered + fb.reordered;
    stats.corrupted = fa.corrupted + fb.corrupted;
    // Every corrupted frame an engine received must have been refused.
    let refused: u64 = [&a, &b]
        .iter()
        .map(|h| h.nic.engine().counters().wire_drops.iter().sum::<u64>())
        .sum();
    report.corrupted_accepted =
        (fa.corrupted_delivered + fb.corrupted_delivered).saturating_sub(refused);
    for h in [&a, &b] {
        stats.icrc_drops += h.nic.engine().counters().icrc_drops();
        for q in &h.qpns {
            if let Ok(c) = h.nic.engine().qp_counters(*q) {
                stats.retransmitted += c.retransmitted;
                stats.timeouts += c.timeouts;
                report.rnr_naks += c.rnr_naks_received;
            }
        }
    }
    stats.virtual_ns = now;
    Ok((report, stats))
}

/// Whether a run passed: every operation verified and nothing duplicated,
/// accepted corrupted or hung; with a killed peer, the operations before
/// the kill verified and every later one failed as RC promises.
pub fn passed(args: &TortureArgs, r: &Report, s: &WireStats) -> bool {
    let clean = r.dup_applied == 0
        && r.corrupted_accepted == 0
        && r.hung == 0
        && r.misdelivered == 0
        && r.counter != CounterCheck::Mismatch;
    if args.service != ServiceArg::Rc {
        // A lost message is no error, but a fault-free wire loses none.
        let faults = args.loss + args.dup + args.reorder + args.corrupt > 0.0;
        return clean && r.failed == 0 && r.ok + r.lost == r.ops && (faults || r.lost == 0);
    }
    match args.kill_peer_after {
        None => clean && r.ok == r.ops && r.failed == 0,
        Some(k) => {
            let k = k.min(r.ops);
            clean
                && r.ok >= k
                && s.other_failures == 0
                && r.ok + s.retry_exc + s.flushed + s.refused == r.ops
        }
    }
}

/// Checks what a successful operation left: the responder's slot (WRITE,
/// SEND, CMP_SWAP), the requester's slot (READ data, an atomic's original
/// value). A FETCH_ADD's original value is kept for the counter check.
fn verify(
    a: &Host,
    b: &Host,
    op: &Op,
    id: u64,
    addr: u64,
    fetch_adds: &mut Vec<(u64, u64)>,
) -> bool {
    let (mem_a, mem_b) = (a.nic.engine().mem(), b.nic.engine().mem());
    let len = op.plan.len as usize;
    let orig = || u64::from_ne_bytes(mem_a.slice(addr, 8).try_into().expect("8 bytes"));
    match op.plan.kind {
        OpKind::Read => mem_a.slice(addr, len) == &pattern(id, len)[..],
        OpKind::FetchAdd => {
            fetch_adds.push((orig(), op.plan.add));
            true
        }
        OpKind::CmpSwap => {
            orig() == op.plan.before
                && op
                    .plan
                    .responder_slot(id)
                    .is_some_and(|w| mem_b.slice(addr, 8) == &w[..])
        }
        _ => op
            .plan
            .responder_slot(id)
            .is_some_and(|w| mem_b.slice(addr, len) == &w[..]),
    }
}

/// The operation a UC or UD receive completion `c` (into the receive
/// buffer at `buf`) delivered, if it is intact: found by its immediate or
/// by the number stamped in its data, of the QP that received it, with
/// the right opcode, length, immediate, data (in the buffer after the GRH
/// for UD, in the slot for a WRITE with immediate) and UD sender.
fn arrived(
    service: ServiceArg,
    ops: &[Op],
    a: &Host,
    b: &Host,
    c: &Cqe,
    buf: u64,
    slot_va: impl Fn(usize, usize) -> u64,
) -> Option<usize> {
    if c.status != WcStatus::Success {
        return None;
    }
    let qp = b.qpns.iter().position(|&q| q == c.qpn)?;
    let ud = service == ServiceArg::Ud;
    let grh = if ud { transport::rc::GRH_LEN as u64 } else { 0 };
    let mem = b.nic.engine().mem();
    let id = match (c.imm, c.opcode) {
        (Some(imm), _) => u64::from(imm ^ 0x5a5a_0000),
        (None, WcOpcode::Recv) => {
            u64::from_le_bytes(mem.slice(buf + grh, 8).try_into().expect("8 bytes"))
        }
        _ => return None,
    } as usize;
    let op = ops.get(id)?;
    let len = op.plan.len as usize;
    let sender_ok = match c.src {
        Some(s) => ud && s.qpn == a.qpns[qp] && s.ip == IP_A,
        None => !ud,
    };
    let (opcode, imm, byte_len, data_at) = match op.plan.kind {
        OpKind::WriteImm => (
            WcOpcode::RecvRdmaWithImm,
            Some(op.plan.imm),
            len as u64,
            slot_va(op.qp, op.slot),
        ),
        OpKind::Send => (WcOpcode::Recv, None, grh + len as u64, buf + grh),
        OpKind::SendImm => (
            WcOpcode::Recv,
            Some(op.plan.imm),
            grh + len as u64,
            buf + grh,
        ),
        _ => return None,
    };
    let intact = op.qp == qp
        && sender_ok
        && c.opcode == opcode
        && c.imm == imm
        && u64::from(c.byte_len) == byte_len
        && mem.slice(data_at, len) == &pattern(id as u64, len)[..];
    intact.then_some(id)
}

/// The counter's value after the FETCH_ADDs if they form one chain from 0
/// (sorted by the value each saw, each saw the previous one's result).
fn chain_sum(adds: &mut [(u64, u64)]) -> Option<u64> {
    adds.sort_unstable();
    let mut cur = 0u64;
    for &(orig, add) in adds.iter() {
        if orig != cur {
            return None;
        }
        cur = cur.wrapping_add(add);
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_check_needs_one_chain_from_zero() {
        assert_eq!(chain_sum(&mut [(5, 2), (0, 5), (7, 1)]), Some(8));
        assert_eq!(chain_sum(&mut []), Some(0));
        // An add applied twice: two adds saw the same value, or one is missing.
        assert_eq!(chain_sum(&mut [(0, 5), (5, 2), (5, 2)]), None);
        assert_eq!(chain_sum(&mut [(0, 5), (6, 2)]), None);
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        t: TortureArgs,
    }

    #[test]
    fn mix_takes_any_subset_by_name() {
        use clap::Parser;
        let c = Cli::try_parse_from(["t", "--mix", "send_imm,cmp_swap"]).unwrap();
        assert_eq!(c.t.mix, [OpKind::SendImm, OpKind::CmpSwap]);
        assert_eq!(Cli::try_parse_from(["t"]).unwrap().t.mix, OpKind::ALL);
        let e = Cli::try_parse_from(["t", "--mix", "write,swap"])
            .err()
            .unwrap();
        assert!(e.to_string().contains("swap"), "{e}");
    }

    #[test]
    fn unreliable_runs_lose_only_on_a_faulty_wire_and_never_misdeliver() {
        for service in [ServiceArg::Uc, ServiceArg::Ud] {
            let args = TortureArgs {
                ops: 150,
                qps: 2,
                service,
                ..<Cli as clap::Parser>::parse_from(["t"]).t
            };
            let (r, s) = run(&args, |_| {}).unwrap();
            assert!(passed(&args, &r, &s), "{service:?} {r}");
            assert_eq!((r.ok, r.lost), (150, 0), "{service:?} {r}");
            let lossy = TortureArgs {
                loss: 0.1,
                dup: 0.05,
                ..args.clone()
            };
            let (r, s) = run(&lossy, |_| {}).unwrap();
            assert!(passed(&lossy, &r, &s), "{service:?} {r}");
            assert!(r.lost > 0 && r.ok > 0, "{service:?} {r}");
            // One misdelivered message fails the run.
            let bad = Report {
                misdelivered: 1,
                ..r
            };
            assert!(!passed(&lossy, &bad, &s));
        }
        // RC-only operations are refused on UD by name.
        let args = TortureArgs {
            service: ServiceArg::Ud,
            mix: vec![OpKind::Read],
            ..<Cli as clap::Parser>::parse_from(["t"]).t
        };
        let e = run(&args, |_| {}).unwrap_err();
        assert!(e.contains("--mix read"), "{e}");
    }

    #[test]
    fn a_clean_run_of_every_kind_with_late_receives_passes() {
        let args = TortureArgs {
            ops: 120,
            loss: 0.05,
            late_recv: 0.5,
            qps: 2,
            ..<Cli as clap::Parser>::parse_from(["t"]).t
        };
        let (r, s) = run(&args, |_| {}).unwrap();
        assert!(passed(&args, &r, &s), "{r}");
        assert!(r.atomics_ok > 0 && r.rnr_naks > 0, "{r}");
        assert_eq!(r.counter, CounterCheck::Ok);
    }
}
