//! `bench torture`: two NICs (`nic::Nic::poll`, the pipeline every driver
//! runs) joined by the in-memory link in virtual time, each port wrapped in
//! the seeded fault injector, running random WRITEs and READs and verifying
//! every byte.
//!
//! Faults hit every packet kind in both directions: loss, duplication,
//! reordering (extra delay) and corruption (one random bit flipped inside
//! the bytes the ICRC protects: masked fields such as TTL, ECN, the UDP
//! checksum, BTH byte 4 and the TLM block are rewritten in flight by design
//! and are not corruption targets). Every WRITE's data starts with its
//! operation number, so a stale duplicate applied after a newer WRITE to
//! the same slot is seen when the slot is checked again.

use std::net::Ipv4Addr;

use nic::{mem_link, Completions, Direction, FaultConfig, FaultInjector, MemPort, Nic};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    ConnectParams, Endpoint, Engine, EngineConfig, PathMtu, Qpn, SendWr, Sge, WcStatus, WrOp,
};
use transport::wire::MacAddr;

/// Flags of `bench torture`.
#[derive(Debug, Clone, clap::Args)]
pub struct TortureArgs {
    /// Seed of the workload and of the faults.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Operations to run (WRITEs and READs, half each).
    #[arg(long, default_value_t = 1000)]
    pub ops: u64,
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
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ops={} ok={} failed={} dup_applied={} corrupted_accepted={} hung={}",
            self.ops, self.ok, self.failed, self.dup_applied, self.corrupted_accepted, self.hung
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
    read: bool,
    len: u32,
    state: OpState,
}

/// The data of operation `id`: a seeded stream stamped with the id.
fn pattern(id: u64, len: usize) -> Vec<u8> {
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
        .map(|_| engine.create_qp(args.depth as usize * 2, 0))
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
    let slot_bytes = (u64::from(args.max_msg) + 64).next_multiple_of(64);
    let slots_per_qp = args.depth as usize;
    let bytes = slot_bytes * u64::from(args.qps) * slots_per_qp as u64;
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
    let limit = args.time_limit_ms.saturating_mul(1_000_000);
    let mut killed = false;
    let mut done = 0u64;
    let va = |qp: usize, slot: usize| BASE + (qp * slots_per_qp + slot) as u64 * slot_bytes;
    let mut last_progress = 0u64;

    // Checks a slot against its last WRITE: a stale duplicate applied later
    // shows an older stamp.
    let recheck =
        |b: &Host, ops: &[Op], slot_last: &[Option<u64>], s: usize, report: &mut Report| {
            if let Some(id) = slot_last[s] {
                let op = ops[id as usize];
                if !op.read && op.state == OpState::Ok {
                    let got = b
                        .nic
                        .engine()
                        .mem()
                        .slice(va(op.qp, op.slot), op.len as usize);
                    if got != &pattern(id, op.len as usize)[..] {
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
            let read = rng.gen_bool(0.5);
            let m = args.mtu;
            let len = match rng.gen_range(0..10) {
                0 => [0, 1, m - 1, m, m + 1][rng.gen_range(0..5)].min(args.max_msg),
                1 => args.max_msg,
                _ => {
                    let bits = 32 - args.max_msg.leading_zeros();
                    (rng.gen_range(0..=u64::from(args.max_msg)) >> rng.gen_range(0..=bits)) as u32
                }
            };
            let data = pattern(id, len as usize);
            let addr = va(qp, slot);
            let src = if read { &mut b } else { &mut a };
            src.nic
                .engine_mut()
                .mem_mut()
                .slice_mut(addr, len as usize)
                .copy_from_slice(&data);
            ops.push(Op {
                qp,
                slot,
                read,
                len,
                state: OpState::Pending,
            });
            slot_busy[s] = true;
            slot_last[s] = Some(id);
            let local = Sge {
                lkey: a.mr.lkey,
                va: addr,
                len,
            };
            let op = if read { WrOp::Read } else { WrOp::Write };
            let wr = SendWr::new(id, op, local, b.mr.rkey, addr);
            if a.nic.engine_mut().post_send(a.qpns[qp], wr, now).is_err() {
                ops[id as usize].state = OpState::Failed;
                slot_busy[s] = false;
                report.failed += 1;
                stats.refused += 1;
                done += 1;
            }
        }

        // One pass of each NIC: RX, timers, TX onto the faulty link; a
        // dead peer is no longer polled.
        a.nic.poll(now, &mut cqes);
        if !killed {
            b.nic.poll(now, &mut Completions::default());
        }

        // Completions.
        for c in cqes.0.drain(..) {
            let id = c.wr_id;
            let Some(op) = ops.get(id as usize).copied() else {
                return Err(format!("completion for unknown operation {id}"));
            };
            if op.state != OpState::Pending {
                return Err(format!("operation {id} completed twice"));
            }
            let s = op.qp * slots_per_qp + op.slot;
            slot_busy[s] = false;
            done += 1;
            let good = c.status == WcStatus::Success && {
                let addr = va(op.qp, op.slot);
                let dst = if op.read { &a } else { &b };
                let got = dst.nic.engine().mem().slice(addr, op.len as usize);
                got == &pattern(id, op.len as usize)[..]
            };
            if good {
                ops[id as usize].state = OpState::Ok;
                report.ok += 1;
            } else {
                ops[id as usize].state = OpState::Failed;
                report.failed += 1;
                match c.status {
                    WcStatus::RetryExcErr => stats.retry_exc += 1,
                    WcStatus::WrFlushErr => stats.flushed += 1,
                    _ => stats.other_failures += 1,
                }
            }
        }
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
        let Some(t) = next else {
            if can_post {
                continue;
            }
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
    let clean = r.dup_applied == 0 && r.corrupted_accepted == 0 && r.hung == 0;
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
