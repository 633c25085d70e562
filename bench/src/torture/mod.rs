//! `bench torture`: two NICs (`nic::Nic::poll`, the pipeline every driver
//! runs) joined by the in-memory link in virtual time, each port wrapped in
//! the seeded fault injector, running a random mix of WRITEs, READs, SENDs,
//! immediates and atomics and verifying every byte, every immediate and
//! every atomic result; the FETCH_ADDs of all QPs share one counter, whose
//! final value must be the sum of the adds that completed.
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
use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    ConnectParams, Endpoint, Engine, EngineConfig, PathMtu, Qpn, RecvWr, WcStatus,
};
use transport::wire::MacAddr;

/// Flags of `bench torture`.
#[derive(Debug, Clone, clap::Args)]
pub struct TortureArgs {
    /// Seed of the workload and of the faults.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Operations to run, drawn evenly from `--mix`.
    #[arg(long, default_value_t = 1000)]
    pub ops: u64,
    /// Operation kinds to run (any subset, comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = OpKind::ALL)]
    pub mix: Vec<OpKind>,
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
        )
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
    let mut engine = Engine::new(cfg, mem, 0);
    let mr = engine
        .register_mr(BASE, bytes, Access::ALL)
        .map_err(|e| e.to_string())?;
    let qpns = (0..args.qps)
        .map(|_| {
            let init = transport::rc::QpInit {
                max_recv_wr: args.depth as usize * 2,
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
    })
}

/// Brings up `a`'s QPs towards `b`'s (both start at `--start-psn`).
fn connect(a: &mut Host, b: &Host, mac: MacAddr, ip: Ipv4Addr, args: &TortureArgs, mtu: PathMtu) {
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
    for (flag, v) in [
        ("--late-recv", args.late_recv),
        ("--unsignaled", args.unsignaled),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return Err(format!("{flag} {v} is not a fraction in [0, 1]"));
        }
    }
    let slot_bytes = (u64::from(args.max_msg) + 64).next_multiple_of(64);
    let slots_per_qp = args.depth as usize;
    // The slots, then the shared FETCH_ADD counter.
    let counter = BASE + slot_bytes * u64::from(args.qps) * slots_per_qp as u64;
    let bytes = counter - BASE + 64;
    let (pa, pb) = mem_link([MAC_A, MAC_B], args.mtu, DELAY_NS);
    let wrap = |p, seed| FaultInjector::new(p, faults(args, seed)).map_err(|e| format!("--{e}"));
    let seeds = (args.seed.wrapping_mul(2), args.seed.wrapping_mul(2) + 1);
    let mut a = host(MAC_A, IP_A, bytes, args, wrap(pa, seeds.0)?)?;
    let mut b = host(MAC_B, IP_B, bytes, args, wrap(pb, seeds.1)?)?;
    connect(&mut a, &b, MAC_B, IP_B, args, mtu);
    connect(&mut b, &a, MAC_A, IP_A, args, mtu);

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
    let recheck =
        |b: &Host, ops: &[Op], slot_last: &[Option<u64>], s: usize, report: &mut Report| {
            if let Some(id) = slot_last[s] {
                let op = ops[id as usize];
                if let (Some(want), OpState::Ok) = (op.plan.responder_slot(id), op.state) {
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
            let kind = args.mix[rng.gen_range(0..args.mix.len())];
            let m = args.mtu;
            let len = match rng.gen_range(0..10) {
                0 => [0, 1, m - 1, m, m + 1][rng.gen_range(0..5)].min(args.max_msg),
                1 => args.max_msg,
                _ => {
                    let bits = 32 - args.max_msg.leading_zeros();
                    (rng.gen_range(0..=u64::from(args.max_msg)) >> rng.gen_range(0..=bits)) as u32
                }
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
            });
            slot_busy[s] = true;
            slot_last[s] = Some(id);
            if let Some(r) = plan.recv_wr(id, b.mr.lkey, addr) {
                let late = args.late_recv > 0.0 && rng.gen_bool(args.late_recv);
                let at = now + if late { args.recv_delay_us * 1000 } else { 0 };
                let q = &mut recv_due[qp];
                let at = q.back().map_or(at, |&(t, _)| at.max(t));
                q.push_back((at, r));
            }
            let mut wr = plan.wr(id, a.mr.lkey, addr, b.mr.rkey, addr, counter);
            wr.signaled = !(args.unsignaled > 0.0 && rng.gen_bool(args.unsignaled));
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
                    settling.push(id);
                }
            }
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
            if waits_recv && op.recv.is_none() {
                waiting.push(id);
                continue;
            }
            let s = op.qp * slots_per_qp + op.slot;
            slot_busy[s] = false;
            done += 1;
            let good = status == WcStatus::Success
                && op.recv != Some(false)
                && verify(&a, &b, &op, id as u64, va(op.qp, op.slot), &mut fetch_adds);
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

        // Next event.
        let next = [
            a.nic.next_wakeup(now),
            if killed { None } else { b.nic.next_wakeup(now) },
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
        && r.counter != CounterCheck::Mismatch;
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
