//! CPU per small message in the engine alone (no DPDK, no pipeline, one
//! thread): a 64 B RDMA WRITE posted, built, received and placed, its ACK
//! built and handled and its completion taken (and the same posted
//! inline, as a latency test posts it; and the same with ACKs
//! coalesced: 15 unsignaled WRITEs, then a signaled one whose ACK covers
//! the 16; and 16 WRITEs posted at once, as a bandwidth test's
//! application posts them, then sent and received as a burst; and 16 to
//! each of 8 QPs, round robin, as `bench write-bw -q 8` posts); and the
//! codec pieces each
//! packet pays (ICRC, parse). `hpcc_inband_64b_write` is the first with
//! HPCC++ inband telemetry: a TLM block on the WRITE, echoed by its ACK
//! and fed to the controller. The floor under `bench write-lat`'s
//! per-stage table.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    CcMode, ConnectParams, Endpoint, Engine, EngineConfig, PathMtu, SendWr, Sge, WrOp, WrParts,
    WrPayload,
};
use transport::wire::{icrc, MacAddr, Packet};

const BASE: u64 = 0x10_0000;
const LEN: usize = 1 << 16;

fn engine(i: u8, cc: CcMode) -> (Engine<VecMemory>, MrKeys, u32) {
    let mut mem = VecMemory::new();
    mem.add(BASE, LEN);
    let mut cfg = EngineConfig::new(
        MacAddr([2, 0, 0, 0, 0, i + 1]),
        Ipv4Addr::new(10, 0, 0, i + 1),
        100_000_000_000,
    );
    cfg.cc = cc;
    let mut e = Engine::new(cfg, mem, 0);
    let mr = e.register_mr(BASE, LEN as u64, Access::ALL).unwrap();
    let q = e.create_qp(256, 0).unwrap();
    (e, mr, q)
}

/// Connects QP `qa` of `a` with QP `qb` of `b` (PSNs from 0, MTU 1024).
fn connect(a: &mut Engine<VecMemory>, qa: u32, b: &mut Engine<VecMemory>, qb: u32) {
    let end = |e: &Engine<VecMemory>, qpn| Endpoint {
        qpn,
        psn: 0,
        mac: e.config().mac,
        ip: e.config().ip,
    };
    let p = ConnectParams::new(PathMtu::Mtu1024);
    let (ea, eb) = (end(a, qa), end(b, qb));
    a.connect_to(qa, 0, &eb, &p).unwrap();
    b.connect_to(qb, 0, &ea, &p).unwrap();
}

/// The completions `e` has, taken; how many.
fn completions(e: &mut Engine<VecMemory>) -> usize {
    let mut done = 0;
    while e.poll_completion().is_some() {
        done += 1;
    }
    done
}

/// The WRITEs `a` has posted, one per frame of `frames`, sent at `now`
/// into them (their lengths into `lens`) and received by `b` as one
/// burst; then `b`'s ACKs back to `a`. Returns `a`'s completion count.
fn send_burst(
    a: &mut Engine<VecMemory>,
    b: &mut Engine<VecMemory>,
    frames: &mut [[u8; 256]],
    lens: &mut [usize],
    buf: &mut [u8],
    now: u64,
) -> usize {
    for (f, l) in frames.iter_mut().zip(lens.iter_mut()) {
        *l = a.poll_transmit(now, f).expect("a WRITE");
    }
    for (f, &l) in frames.iter().zip(lens.iter()) {
        b.handle_packet(now, &f[..l]);
    }
    while let Some(n) = b.poll_transmit(now, buf) {
        a.handle_packet(now, &buf[..n]);
    }
    completions(a)
}

/// Two connected engines: A writes to B.
struct Pair {
    a: Engine<VecMemory>,
    b: Engine<VecMemory>,
    qa: u32,
    wr: SendWr,
    buf: Vec<u8>,
    /// A burst's frames, made once.
    frames: Vec<[u8; 256]>,
    now: u64,
}

impl Pair {
    fn new() -> Pair {
        Pair::with_cc(CcMode::None)
    }

    fn with_cc(cc: CcMode) -> Pair {
        let (mut a, ka, qa) = engine(0, cc);
        let (mut b, kb, qb) = engine(1, cc);
        connect(&mut a, qa, &mut b, qb);
        let local = Sge {
            lkey: ka.lkey,
            va: BASE,
            len: 64,
        };
        Pair {
            a,
            b,
            qa,
            wr: SendWr::new(1, WrOp::Write, local, kb.rkey, BASE + 4096),
            buf: vec![0; 2048],
            frames: vec![[0; 256]; 16],
            now: 0,
        }
    }

    /// One WRITE there and its ACK back; returns the completion count.
    fn write(&mut self) -> usize {
        self.now += 1_000;
        let now = self.now;
        self.a.post_send(self.qa, self.wr, now).unwrap();
        self.there_and_back(now)
    }

    /// The WRITE posted sent there at `now` and its ACK back; returns
    /// the completion count.
    fn there_and_back(&mut self, now: u64) -> usize {
        let n = self.a.poll_transmit(now, &mut self.buf).expect("the WRITE");
        self.b.handle_packet(now, &self.buf[..n]);
        let n = self.b.poll_transmit(now, &mut self.buf).expect("its ACK");
        self.a.handle_packet(now, &self.buf[..n]);
        completions(&mut self.a)
    }

    /// [`Pair::write`] of a WRITE whose 64 bytes are posted inline, as
    /// `bench write-lat` and perftest's ib_write_lat post them.
    fn write_inline(&mut self) -> usize {
        self.now += 1_000;
        let now = self.now;
        let head = WrParts::of(&self.wr).head;
        let bytes = [7u8; 64];
        let wr = WrParts {
            head,
            payload: WrPayload::Inline(&bytes),
        };
        self.a.post_send_parts(self.qa, &wr, now).unwrap();
        self.there_and_back(now)
    }

    /// One WRITE there, signaled every 16th (ACKs coalesced: B answers
    /// the 16th's AckReq); returns the completion count.
    fn write_coalesced(&mut self, k: u64) -> usize {
        self.now += 1_000;
        let now = self.now;
        let mut wr = self.wr;
        wr.signaled = k % 16 == 15;
        self.a.post_send(self.qa, wr, now).unwrap();
        let n = self.a.poll_transmit(now, &mut self.buf).expect("the WRITE");
        self.b.handle_packet(now, &self.buf[..n]);
        if let Some(n) = self.b.poll_transmit(now, &mut self.buf) {
            self.a.handle_packet(now, &self.buf[..n]);
        }
        completions(&mut self.a)
    }

    /// 16 WRITEs posted at once (the last signaled), sent, received as
    /// one burst, and the one ACK back; returns the completion count.
    fn write_burst(&mut self) -> usize {
        self.now += 1_000;
        let now = self.now;
        for k in 0..16 {
            let mut wr = self.wr;
            wr.signaled = k == 15;
            self.a.post_send(self.qa, wr, now).unwrap();
        }
        let mut lens = [0usize; 16];
        let (a, b) = (&mut self.a, &mut self.b);
        send_burst(a, b, &mut self.frames, &mut lens, &mut self.buf, now)
    }

    /// The WRITE frame of one post (without sending it on).
    fn frame(&mut self) -> Vec<u8> {
        self.now += 1_000;
        self.a.post_send(self.qa, self.wr, self.now).unwrap();
        let n = self.a.poll_transmit(self.now, &mut self.buf).unwrap();
        self.buf[..n].to_vec()
    }
}

/// Two engines with [`QPS`] connected QP pairs: A writes to B on all of
/// them, as `bench write-bw -q 8` does.
struct Many {
    a: Engine<VecMemory>,
    b: Engine<VecMemory>,
    qps: Vec<u32>,
    wr: SendWr,
    buf: Vec<u8>,
    /// A round's frames, made once.
    frames: Vec<[u8; 256]>,
    now: u64,
}

/// QPs of [`Many`], and WRITEs posted to each per round.
const QPS: usize = 8;
const PER_QP: usize = 16;

impl Many {
    fn new() -> Many {
        let (mut a, ka, _) = engine(0, CcMode::None);
        let (mut b, kb, _) = engine(1, CcMode::None);
        let mut qps = Vec::new();
        for _ in 0..QPS {
            let qa = a.create_qp(256, 0).unwrap();
            let qb = b.create_qp(256, 0).unwrap();
            connect(&mut a, qa, &mut b, qb);
            qps.push(qa);
        }
        let local = Sge {
            lkey: ka.lkey,
            va: BASE,
            len: 64,
        };
        Many {
            a,
            b,
            qps,
            wr: SendWr::new(1, WrOp::Write, local, kb.rkey, BASE + 4096),
            buf: vec![0; 2048],
            frames: vec![[0; 256]; QPS * PER_QP],
            now: 0,
        }
    }

    /// [`PER_QP`] WRITEs posted to each QP, round robin (each QP's last
    /// signaled), all sent, received as one burst, and the ACKs back;
    /// returns the completion count.
    fn round(&mut self) -> usize {
        self.now += 10_000;
        let now = self.now;
        for k in 0..PER_QP {
            for &q in &self.qps {
                let mut wr = self.wr;
                wr.signaled = k == PER_QP - 1;
                self.a.post_send(q, wr, now).unwrap();
            }
        }
        let mut lens = [0usize; QPS * PER_QP];
        let (a, b) = (&mut self.a, &mut self.b);
        send_burst(a, b, &mut self.frames, &mut lens, &mut self.buf, now)
    }
}

fn engine_write(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    g.throughput(Throughput::Elements(1));
    let mut p = Pair::new();
    g.bench_function("write_64b_with_ack", |b| {
        b.iter(|| assert_eq!(p.write(), 1))
    });
    let mut p = Pair::new();
    g.bench_function("write_64b_inline_with_ack", |b| {
        b.iter(|| assert_eq!(p.write_inline(), 1))
    });
    let mut p = Pair::with_cc(CcMode::HpccInband { maxhop: 5 });
    g.bench_function("hpcc_inband_64b_write", |b| {
        b.iter(|| assert_eq!(p.write(), 1))
    });
    let mut p = Pair::new();
    let mut k = 0u64;
    g.bench_function("write_64b_ack_every_16th", |b| {
        b.iter(|| {
            let done = p.write_coalesced(k);
            assert_eq!(done, usize::from(k % 16 == 15));
            k += 1;
        })
    });
    let mut p = Pair::new();
    g.throughput(Throughput::Elements(16));
    g.bench_function("write_64b_burst_of_16", |b| {
        b.iter(|| assert_eq!(p.write_burst(), 1))
    });
    let mut m = Many::new();
    g.throughput(Throughput::Elements((QPS * PER_QP) as u64));
    g.bench_function("write_64b_8_qps_bursts_of_16", |b| {
        b.iter(|| assert_eq!(m.round(), QPS))
    });
    g.finish();
}

fn codec(c: &mut Criterion) {
    let frame = Pair::new().frame();
    let mut g = c.benchmark_group("codec_64b_write");
    g.throughput(Throughput::Elements(1));
    let ip = &frame[14..frame.len() - icrc::ICRC_LEN];
    g.bench_function("icrc", |b| b.iter(|| icrc::compute(black_box(ip), 0)));
    let end = frame.len() - icrc::ICRC_LEN;
    g.bench_function("icrc_in_frame", |b| {
        b.iter(|| icrc::compute_in_frame(black_box(&frame), 14, end, 0))
    });
    g.bench_function("parse", |b| {
        b.iter(|| Packet::parse(black_box(&frame)).map(|p| p.payload.len()))
    });
    g.finish();
}

criterion_group!(benches, engine_write, codec);
criterion_main!(benches);
