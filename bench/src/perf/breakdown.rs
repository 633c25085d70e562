//! `--breakdown`: where the time of a small WRITE (or READ) goes. The
//! daemon's latency trace (`Request::Trace`) stamps every stage of every
//! frame in the one pipeline (doorbell taken, frame built, TX burst, RX
//! burst, handled, CQE published) with the TSC; this process stamps its
//! posts and the moments it sees the data. Both read the same TSC, so the
//! stamps of one message line up across the processes: the table is the
//! median and p99 of each stage over every one-way trip of the run.

use std::collections::HashMap;
use std::time::Instant;

use nic::stage::NO_OPCODE;
use nic::{FrameKey, Stage};
use shm::proto::{Reply, Request};
use transport::wire::Opcode;
use verbs::Device;

use super::args::{PerfArgs, Test};
use super::conn::Conn;
use super::lat::{self, AppStamps};

/// Stamps the daemon takes per round trip, about (both directions, data
/// and ACK, doorbells and CQEs), with room to spare.
const STAMPS_PER_ROUND_TRIP: u64 = 32;

/// One stage's figures.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: &'static str,
    pub median_ns: f64,
    pub p99_ns: f64,
    pub samples: usize,
}

/// The points of one one-way trip (and its ACK or response), ticks.
type Points = HashMap<&'static str, u64>;

/// The stages of a WRITE one way and its ACK back.
const WRITE_STAGES: &[(&str, &str, &str)] = &[
    ("app post -> doorbell taken", "post", "doorbell"),
    ("doorbell -> WRITE built", "doorbell", "built"),
    ("built -> TX burst done", "built", "sent"),
    ("TX burst -> RX burst at peer", "sent", "received"),
    ("RX burst -> data placed", "received", "handled"),
    ("placed -> peer app sees it", "handled", "seen"),
    ("one way: post -> peer app sees it", "post", "seen"),
    ("ACK: placed -> ACK built", "handled", "ack built"),
    ("ACK: built -> TX burst done", "ack built", "ack sent"),
    ("ACK: TX burst -> RX burst", "ack sent", "ack received"),
    ("ACK: RX burst -> handled", "ack received", "ack handled"),
    ("ACK: handled -> CQE in the ring", "ack handled", "cqe"),
    ("post -> CQE in the ring", "post", "cqe"),
];

/// The stages of a READ: request there, response back.
const READ_STAGES: &[(&str, &str, &str)] = &[
    ("app post -> doorbell taken", "post", "doorbell"),
    ("doorbell -> READ request built", "doorbell", "built"),
    ("built -> TX burst done", "built", "sent"),
    ("TX burst -> RX burst at peer", "sent", "received"),
    ("RX burst -> request handled", "received", "handled"),
    ("handled -> response built", "handled", "resp built"),
    ("response built -> TX burst done", "resp built", "resp sent"),
    ("TX burst -> RX burst", "resp sent", "resp received"),
    ("RX burst -> data placed", "resp received", "resp handled"),
    ("placed -> CQE in the ring", "resp handled", "cqe"),
    ("CQE in the ring -> app polls it", "cqe", "seen"),
    ("round trip: post -> app polls the CQE", "post", "seen"),
];

/// The daemon's trace as lookups.
struct DaemonTrace {
    hz: u64,
    /// First stamp of each (host, stage, frame key).
    frames: HashMap<(usize, Stage, FrameKey), u64>,
    /// Doorbells per (host, QPN), in order: the PSN each WR got.
    doorbells: HashMap<(usize, u32), Vec<(u64, u32)>>,
    dropped: u64,
    total: u64,
}

fn call(dev: &Device, req: Request) -> Result<Reply, String> {
    dev.call(req)
        .map(|r| r.0)
        .map_err(|e| format!("the daemon's trace: {e}"))
}

impl DaemonTrace {
    fn fetch(dev: &Device) -> Result<DaemonTrace, String> {
        let mut t = DaemonTrace {
            hz: 0,
            frames: HashMap::new(),
            doorbells: HashMap::new(),
            dropped: 0,
            total: 0,
        };
        let mut from = 0u64;
        loop {
            let Reply::TraceStamps {
                tsc_hz,
                total,
                dropped,
                stamps,
                next,
            } = call(dev, Request::TraceStamps { from })?
            else {
                return Err("the daemon answered TraceStamps with something else".into());
            };
            (t.hz, t.total, t.dropped) = (tsc_hz, total, dropped);
            for pair in stamps.chunks_exact(2) {
                let Some((host, stage, key)) = FrameKey::unpack(pair[1]) else {
                    continue;
                };
                if stage == Stage::Doorbell {
                    t.doorbells
                        .entry((host, key.dest_qp))
                        .or_default()
                        .push((pair[0], key.psn));
                } else {
                    t.frames.entry((host, stage, key)).or_insert(pair[0]);
                }
            }
            // Each of the daemon's lcores pages its own trace from `from`.
            from = if next > from {
                next
            } else {
                from + (stamps.len() / 2) as u64
            };
            if stamps.is_empty() || from >= total {
                break;
            }
        }
        if t.hz == 0 {
            return Err("the daemon reported a TSC rate of 0".into());
        }
        Ok(t)
    }

    fn frame(&self, host: usize, stage: Stage, op: Opcode, dest_qp: u32, psn: u32) -> Option<u64> {
        let key = FrameKey {
            opcode: op as u8,
            dest_qp: dest_qp & 0xff_ffff,
            psn: psn & 0xff_ffff,
        };
        self.frames.get(&(host, stage, key)).copied()
    }

    fn cqe(&self, host: usize, qpn: u32, wr_id: u64) -> Option<u64> {
        let key = FrameKey {
            opcode: NO_OPCODE,
            dest_qp: qpn & 0xff_ffff,
            psn: wr_id as u32 & 0xff_ffff,
        };
        self.frames.get(&(host, Stage::CqePublished, key)).copied()
    }
}

/// One direction of one round trip: who posts, to whom, and the
/// application's own stamps of it.
struct Trip {
    /// The daemon's host index of the posting end and of its peer.
    host: usize,
    peer: usize,
    own: u32,
    dest: u32,
    /// Which of `own`'s doorbells (its WRs in order).
    nth: usize,
    wr_id: u64,
    post: u64,
    seen: u64,
}

fn points(t: &DaemonTrace, test: Test, trip: &Trip) -> Points {
    let mut p = Points::new();
    p.insert("post", trip.post);
    p.insert("seen", trip.seen);
    let Some(&(db, psn)) = t
        .doorbells
        .get(&(trip.host, trip.own))
        .and_then(|v| v.get(trip.nth))
    else {
        return p;
    };
    p.insert("doorbell", db);
    let mut put = |name, v: Option<u64>| {
        if let Some(v) = v {
            p.insert(name, v);
        }
    };
    let (req_op, back_op, back) = if test.is_read() {
        (
            Opcode::RdmaReadRequest,
            Opcode::RdmaReadResponseOnly,
            ["resp built", "resp sent", "resp received", "resp handled"],
        )
    } else {
        (
            Opcode::RdmaWriteOnly,
            Opcode::Acknowledge,
            ["ack built", "ack sent", "ack received", "ack handled"],
        )
    };
    // Built and sent by the poster's host, received and handled by the
    // peer's; the ACK or response the other way.
    let stages = [
        (Stage::Built, trip.host, trip.peer),
        (Stage::Sent, trip.host, trip.peer),
        (Stage::Received, trip.peer, trip.host),
        (Stage::Handled, trip.peer, trip.host),
    ];
    let there = ["built", "sent", "received", "handled"];
    for ((name, back_name), (s, h, back_h)) in there.into_iter().zip(back).zip(stages) {
        put(name, t.frame(h, s, req_op, trip.dest, psn));
        put(back_name, t.frame(back_h, s, back_op, trip.own, psn));
    }
    put("cqe", t.cqe(trip.host, trip.own, trip.wr_id));
    p
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `iters` traced round trips of `size` bytes and returns the
/// per-stage table and the traced run's median latency (as perftest
/// reports it: half the round trip for WRITE), ns.
pub fn run(
    test: Test,
    a: &PerfArgs,
    conn: &mut Conn,
    size: u32,
    iters: u64,
) -> Result<(Vec<Row>, f64), String> {
    let (client, server) = match (&conn.client, &conn.server) {
        (Some(c), Some(s)) => (c, s),
        _ => return Err("--breakdown needs --loopback (both ends in this process)".into()),
    };
    if size > conn.mtu {
        return Err(format!(
            "--breakdown follows one-packet messages: -s {size} is more than the MTU {}",
            conn.mtu
        ));
    }
    // Host indexes are the daemon's device order.
    let devices = verbs::list_devices(&a.socket).map_err(|e| e.to_string())?;
    let host_of = |d: &Device| {
        let name = &d.info().name;
        devices
            .iter()
            .position(|x| &x.name == name)
            .ok_or_else(|| format!("device {name} is not in the daemon's list"))
    };
    let (hc, hs) = (host_of(&client.dev)?, host_of(&server.dev)?);
    let cq: Vec<u32> = client.qps.iter().map(|q| q.qpn()).collect();
    let sq: Vec<u32> = server.qps.iter().map(|q| q.qpn()).collect();
    let cap = u32::try_from(iters.saturating_mul(STAMPS_PER_ROUND_TRIP) + 1024)
        .unwrap_or(u32::MAX)
        .min(dataplane::service::trace::MAX_STAMPS);
    call(&client.dev, Request::Trace { capacity: cap })?;
    let mut app: Vec<AppStamps> = Vec::with_capacity(iters as usize);
    let r = lat::run(test, a, conn, size, iters, Instant::now(), Some(&mut app));
    let dev = &conn.client.as_ref().expect("checked above").dev;
    call(dev, Request::Trace { capacity: 0 })?;
    let traced = r?.hist.value_at_quantile(0.5) as f64;
    let t = DaemonTrace::fetch(dev)?;
    if t.dropped > 0 {
        return Err(format!(
            "the daemon's trace was full ({} stamps, {} dropped): fewer iterations",
            t.total, t.dropped
        ));
    }
    let q = cq.len();
    let mut trips = Vec::new();
    for (i, st) in app.iter().enumerate() {
        let k = i % q;
        trips.push(Trip {
            host: hc,
            peer: hs,
            own: cq[k],
            dest: sq[k],
            nth: i / q,
            wr_id: i as u64,
            post: st[0],
            seen: st[1],
        });
        if test == Test::WriteLat {
            trips.push(Trip {
                host: hs,
                peer: hc,
                own: sq[k],
                dest: cq[k],
                nth: i / q,
                wr_id: i as u64,
                post: st[2],
                seen: st[3],
            });
        }
    }
    let stages = if test.is_read() {
        READ_STAGES
    } else {
        WRITE_STAGES
    };
    let ns = |ticks: i128| ticks as f64 * 1e9 / t.hz as f64;
    let all: Vec<Points> = trips.iter().map(|tr| points(&t, test, tr)).collect();
    let rows = stages
        .iter()
        .map(|&(name, from, to)| {
            let mut v: Vec<f64> = all
                .iter()
                .filter_map(|p| Some(ns(i128::from(*p.get(to)?) - i128::from(*p.get(from)?))))
                .collect();
            v.sort_by(f64::total_cmp);
            Row {
                name,
                median_ns: percentile(&v, 0.5),
                p99_ns: percentile(&v, 0.99),
                samples: v.len(),
            }
        })
        .collect();
    Ok((rows, traced))
}

/// Prints the table.
pub fn print(test: Test, size: u32, rows: &[Row]) {
    let what = if test.is_read() {
        "READ round trips"
    } else {
        "WRITE one-way trips (both directions)"
    };
    println!(
        " breakdown of {size} B {what}: TSC stamps of the daemon's pipeline and of this process"
    );
    println!(
        " {:<40} {:>10} {:>10} {:>8}",
        "stage", "median ns", "p99 ns", "samples"
    );
    for r in rows {
        println!(
            " {:<40} {:>10.0} {:>10.0} {:>8}",
            r.name, r.median_ns, r.p99_ns, r.samples
        );
    }
}
