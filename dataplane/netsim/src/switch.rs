//! The software INT switch: per-egress-port FIFO queues drained at the
//! port's capacity B, a drop-tail buffer, RED-style ECN marking for the
//! DCQCN baseline, telemetry stamping at dequeue per wire.md, and ECMP by
//! a seeded hash of the 5-tuple.
//!
//! Pure logic with time passed in: the simulator drives it in virtual time
//! with `Vec<u8>` frames, the DPDK dataplane on real ports with wall time
//! and mbufs (any `F: AsRef<[u8]> + AsMut<[u8]>`), so frames are queued
//! and stamped in place, never copied. It reads and writes frames through
//! the wire codec's in-flight view ([`RoceFrame`]) and no further.

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use transport::wire::{HopRecord, RoceFrame};

/// ECN marking (DCQCN): probability rises linearly from 0 at `kmin` bytes
/// of queue to `pmax` at `kmax`, and is 1 above `kmax`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EcnConfig {
    pub kmin: u64,
    pub kmax: u64,
    pub pmax: f64,
}

impl EcnConfig {
    /// Thresholds times `factor` (a port `factor` times as fast).
    pub fn scaled(self, factor: f64) -> Self {
        EcnConfig {
            kmin: (self.kmin as f64 * factor) as u64,
            kmax: (self.kmax as f64 * factor) as u64,
            ..self
        }
    }
}

/// One egress port.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PortConfig {
    /// Capacity B, bits per second (stamped in units of 100 Mb/s).
    pub rate_bps: u64,
    /// Queue limit in bytes (drop-tail).
    pub buffer_bytes: u64,
    pub ecn: Option<EcnConfig>,
}

/// Counters of one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortCounters {
    pub enqueued: u64,
    pub dropped: u64,
    pub ecn_marked: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Packets whose telemetry stack was full (nothing stamped).
    pub tlm_full: u64,
    pub tlm_stamped: u64,
    pub max_qlen: u64,
}

/// What happened to an offered frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueue {
    Queued,
    /// The buffer was full; the frame is gone.
    Dropped,
}

#[derive(Debug)]
struct Port<F> {
    cfg: PortConfig,
    queue: VecDeque<F>,
    qlen: u64,
    /// Bytes sent before the packet being sent now (wire.md: tx_bytes).
    tx_bytes: u64,
    busy_until: u64,
    counters: PortCounters,
}

/// A switch: its ports, forwarding by destination IPv4 address, ECMP.
#[derive(Debug)]
pub struct Switch<F = Vec<u8>> {
    pub id: u8,
    /// Seed of this switch's ECMP hash.
    ecmp_seed: u32,
    ports: Vec<Port<F>>,
    rng: ChaCha8Rng,
    catch_up_ns: u64,
}

/// Time to put `bytes` on a link of `rate_bps`, in nanoseconds (rounded up).
pub fn serialization_ns(bytes: usize, rate_bps: u64) -> u64 {
    (bytes as u64 * 8 * 1_000_000_000).div_ceil(rate_bps.max(1))
}

/// The ECMP key of a frame: its IPv4 addresses and UDP ports (every
/// RoCEv2 frame is UDP to port 4791, so the protocol adds nothing); all
/// zero for a frame that is not RoCEv2.
pub fn flow_tuple(frame: &[u8]) -> [u32; 3] {
    RoceFrame::new_checked(frame).map_or([0; 3], |f| tuple_of(&f))
}

/// The ECMP key of a frame already viewed.
pub fn tuple_of<T: AsRef<[u8]>>(f: &RoceFrame<T>) -> [u32; 3] {
    [
        u32::from(f.src_ip()),
        u32::from(f.dst_ip()),
        u32::from(f.entropy()) | u32::from(transport::wire::udp::ROCE_PORT) << 16,
    ]
}

/// A seeded hash of an ECMP key: each word mixed in with a multiply and a
/// rotation, then a full avalanche (the "lowbias32" finalizer), so that
/// every bit of the addresses and ports moves the result and switches with
/// other seeds split the same flows differently (no polarization across
/// tiers).
pub fn ecmp_hash(key: [u32; 3], seed: u32) -> u32 {
    let mut h = seed ^ 0x9E37_79B9;
    for w in key {
        h = (h ^ w.wrapping_mul(0xCC9E_2D51)).rotate_left(13);
        h = h.wrapping_mul(5).wrapping_add(0xE654_6B64);
    }
    h ^= h >> 16;
    h = h.wrapping_mul(0x7FEB_352D);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846C_A68B);
    h ^ (h >> 16)
}

impl<F: AsRef<[u8]> + AsMut<[u8]>> Switch<F> {
    /// A switch with `ports`; `seed` drives ECN marking.
    pub fn new(id: u8, ports: &[PortConfig], seed: u64) -> Self {
        Switch {
            id,
            ecmp_seed: u32::from(id),
            ports: ports
                .iter()
                .map(|&cfg| Port {
                    cfg,
                    queue: VecDeque::new(),
                    qlen: 0,
                    tx_bytes: 0,
                    busy_until: 0,
                    counters: PortCounters::default(),
                })
                .collect(),
            rng: ChaCha8Rng::seed_from_u64(
                seed ^ u64::from(id).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            ),
            catch_up_ns: 0,
        }
    }

    /// On wall time a poll loop visits a port late; a port that fell behind
    /// by at most `ns` sends its next frame as if on time (back to back with
    /// the previous one), so the port keeps its rate B. 0 (the default, for
    /// virtual time, where the port is visited exactly when it frees) sends
    /// every frame at `now`.
    pub fn set_catch_up(&mut self, ns: u64) {
        self.catch_up_ns = ns;
    }

    /// Seeds the ECMP hash (by default the switch id; the simulator gives
    /// each switch its node number, as ns-3 does).
    pub fn set_ecmp_seed(&mut self, seed: u32) {
        self.ecmp_seed = seed;
    }

    /// Chooses among equal-cost egress ports by the hash of the frame's
    /// 5-tuple with this switch's seed: a flow keeps its path, flows
    /// spread over the choices.
    pub fn ecmp(&self, frame: &[u8], choices: &[usize]) -> Option<usize> {
        self.ecmp_by_key(flow_tuple(frame), choices)
    }

    /// [`Switch::ecmp`] of a frame whose key ([`tuple_of`]) is known.
    pub fn ecmp_by_key(&self, key: [u32; 3], choices: &[usize]) -> Option<usize> {
        if choices.is_empty() {
            return None;
        }
        let h = ecmp_hash(key, self.ecmp_seed);
        Some(choices[h as usize % choices.len()])
    }

    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    pub fn counters(&self, port: usize) -> PortCounters {
        self.ports[port].counters
    }

    /// Bytes queued at `port` (not counting the packet on the wire).
    pub fn qlen(&self, port: usize) -> u64 {
        self.ports[port].qlen
    }

    pub fn port_config(&self, port: usize) -> &PortConfig {
        &self.ports[port].cfg
    }

    /// Offers a frame to `port`'s queue: drop-tail against the
    /// buffer, ECN CE marking for ECN-capable frames when configured.
    pub fn enqueue(&mut self, port: usize, mut frame: F) -> Enqueue {
        let p = &mut self.ports[port];
        let len = frame.as_ref().len() as u64;
        if p.qlen + len > p.cfg.buffer_bytes {
            p.counters.dropped += 1;
            return Enqueue::Dropped;
        }
        if let Some(ecn) = p.cfg.ecn {
            let q = p.qlen;
            let prob = if q <= ecn.kmin {
                0.0
            } else if q >= ecn.kmax {
                1.0
            } else {
                ecn.pmax * (q - ecn.kmin) as f64 / (ecn.kmax - ecn.kmin) as f64
            };
            if prob > 0.0 && self.rng.gen_bool(prob.min(1.0)) && mark_ce(frame.as_mut()) {
                p.counters.ecn_marked += 1;
            }
        }
        p.qlen += len;
        p.counters.max_qlen = p.counters.max_qlen.max(p.qlen);
        p.counters.enqueued += 1;
        p.queue.push_back(frame);
        Enqueue::Queued
    }

    /// Whether `port` can start sending at `now` (idle and non-empty).
    pub fn can_send(&self, now: u64, port: usize) -> bool {
        let p = &self.ports[port];
        !p.queue.is_empty() && p.busy_until <= now
    }

    /// When `port` finishes the frame it is sending.
    pub fn busy_until(&self, port: usize) -> u64 {
        self.ports[port].busy_until
    }

    /// Starts sending the head of `port`'s queue at `now`: stamps its
    /// telemetry (ts, tx_bytes before it, qlen after this dequeue, B,
    /// switch and port ids) and returns it with the time its last bit
    /// leaves. `None` when the queue is empty or the port is busy.
    pub fn dequeue(&mut self, now: u64, port: usize) -> Option<(F, u64)> {
        if !self.can_send(now, port) {
            return None;
        }
        let id = self.id;
        let catch_up = self.catch_up_ns;
        let p = &mut self.ports[port];
        let mut frame = p.queue.pop_front()?;
        let len = frame.as_ref().len() as u64;
        p.qlen -= len;
        let start = if now - p.busy_until <= catch_up {
            p.busy_until
        } else {
            now
        };
        let hop = HopRecord {
            ts_ns: start as u32,
            tx_bytes: p.tx_bytes as u32,
            qlen: p.qlen.min(u64::from(u32::MAX)) as u32,
            rate: (p.cfg.rate_bps / 100_000_000).min(u64::from(u16::MAX)) as u16,
            switch_id: id,
            port_id: port as u8,
        };
        match stamp(frame.as_mut(), &hop) {
            Stamp::Stamped => p.counters.tlm_stamped += 1,
            Stamp::Full => p.counters.tlm_full += 1,
            Stamp::NoTelemetry => {}
        }
        p.tx_bytes += len;
        p.counters.tx_packets += 1;
        p.counters.tx_bytes += len;
        p.busy_until = start + serialization_ns(len as usize, p.cfg.rate_bps);
        Some((frame, p.busy_until))
    }
}

/// What stamping did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    Stamped,
    /// nhop == maxhop: the stack was left alone.
    Full,
    NoTelemetry,
}

/// Pushes `hop` into the frame's TLM block, if it has one with room and it
/// is not an echoed stack (ACKs, probe responses, CC_NOTIFY carry the
/// forward path's telemetry back and are left alone).
pub fn stamp(frame: &mut [u8], hop: &HopRecord) -> Stamp {
    let Ok(mut f) = RoceFrame::new_checked(frame) else {
        return Stamp::NoTelemetry;
    };
    let Some(mut t) = f.tlm_mut() else {
        return Stamp::NoTelemetry;
    };
    if t.echo() {
        // A reflected stack describes the forward path; the way back must
        // not add its own hops to it.
        return Stamp::NoTelemetry;
    }
    if t.push_hop(hop) {
        Stamp::Stamped
    } else {
        Stamp::Full
    }
}

/// Sets ECN to CE on an ECN-capable RoCEv2 frame (and fixes the checksum).
pub fn mark_ce(frame: &mut [u8]) -> bool {
    RoceFrame::new_checked(frame).is_ok_and(|mut f| f.mark_ce())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use transport::wire::{Opcode, Packet, PacketRepr, RethRepr, TlmRepr};

    fn frame(maxhop: Option<u8>, payload: usize, sport: u16) -> Vec<u8> {
        frame_from(Ipv4Addr::new(10, 0, 0, 1), maxhop, payload, sport)
    }

    fn frame_from(src: Ipv4Addr, maxhop: Option<u8>, payload: usize, sport: u16) -> Vec<u8> {
        let mut r = PacketRepr::new(Opcode::RdmaWriteOnly, 0x12, 7);
        r.ip.src = src;
        r.ip.dst = Ipv4Addr::new(10, 0, 0, 2);
        r.ip.ecn = 2;
        r.udp.src_port = sport;
        r.reth = Some(RethRepr {
            va: 0,
            r_key: 1,
            dma_len: payload as u32,
        });
        r.tlm = maxhop.map(TlmRepr::empty);
        let mut b = vec![0u8; r.frame_len(payload)];
        r.emit(&vec![0u8; payload], &mut b).unwrap();
        b
    }

    fn port(rate_gbps: u64, buffer: u64) -> PortConfig {
        PortConfig {
            rate_bps: rate_gbps * 1_000_000_000,
            buffer_bytes: buffer,
            ecn: None,
        }
    }

    #[test]
    fn stamping_fields_match_hand_computed_values() {
        // 25 Gb/s port, three frames of 1,070 bytes queued at t = 0.
        let mut s = Switch::new(9, &[port(25, 1 << 20), port(25, 1 << 20)], 1);
        let f = frame(Some(2), 1000, 1);
        let len = f.len() as u64;
        assert_eq!(len, 14 + 20 + 8 + 12 + 4 + 2 * 16 + 16 + 1000 + 4);
        for _ in 0..3 {
            assert_eq!(s.enqueue(1, f.clone()), Enqueue::Queued);
        }
        // First dequeue at t = 1,000 ns: nothing sent before, two frames
        // left behind it.
        let (a, done) = s.dequeue(1_000, 1).unwrap();
        let ser = (len * 8 * 1_000_000_000).div_ceil(25_000_000_000);
        assert_eq!(done, 1_000 + ser);
        assert!(
            s.dequeue(done - 1, 1).is_none(),
            "busy until the last bit leaves"
        );
        let (b, _) = s.dequeue(done, 1).unwrap();
        let ha = Packet::parse(&a).unwrap().repr.tlm.unwrap();
        let hb = Packet::parse(&b).unwrap().repr.tlm.unwrap();
        assert_eq!(ha.nhop, 1);
        assert_eq!(ha.path_id, 9);
        assert_eq!(
            ha.hops[0],
            HopRecord {
                ts_ns: 1_000,
                tx_bytes: 0,
                qlen: 2 * len as u32,
                rate: 250,
                switch_id: 9,
                port_id: 1
            }
        );
        assert_eq!(
            hb.hops[0],
            HopRecord {
                ts_ns: done as u32,
                tx_bytes: len as u32,
                qlen: len as u32,
                rate: 250,
                switch_id: 9,
                port_id: 1
            }
        );
        // The ICRC still holds: TLM bytes are masked.
        assert!(Packet::parse(&a).is_ok());
    }

    #[test]
    fn a_late_poll_catches_up_within_the_window() {
        let f = frame(None, 1000, 1);
        let ser = serialization_ns(f.len(), 1_000_000_000);
        let mut s = Switch::new(1, &[port(1, 1 << 20)], 1);
        s.set_catch_up(10 * ser);
        for _ in 0..4 {
            s.enqueue(0, f.clone());
        }
        let (_, d1) = s.dequeue(0, 0).unwrap();
        assert_eq!(d1, ser);
        // Visited 2.5 frame times late: the backlog leaves back to back.
        let late = ser * 5 / 2;
        let (_, d2) = s.dequeue(late, 0).unwrap();
        assert_eq!(d2, 2 * ser);
        let (_, d3) = s.dequeue(late, 0).unwrap();
        assert_eq!(d3, 3 * ser);
        assert!(s.dequeue(late, 0).is_none(), "busy until 3 frame times");
        // Without catch-up (virtual time), the frame starts at the visit.
        let mut v = Switch::new(1, &[port(1, 1 << 20)], 1);
        v.enqueue(0, f.clone());
        v.enqueue(0, f.clone());
        v.dequeue(0, 0).unwrap();
        assert_eq!(v.dequeue(late, 0).unwrap().1, late + ser);
    }

    #[test]
    fn a_full_stack_is_left_alone_and_counted() {
        let mut s = Switch::new(3, &[port(100, 1 << 20)], 1);
        let mut f = frame(Some(1), 10, 1);
        stamp(
            &mut f,
            &HopRecord {
                switch_id: 1,
                ..HopRecord::default()
            },
        );
        s.enqueue(0, f.clone());
        let (out, _) = s.dequeue(0, 0).unwrap();
        assert_eq!(out, f, "unchanged");
        assert_eq!(s.counters(0).tlm_full, 1);
        // Frames without telemetry pass untouched, and so do echoed stacks.
        let g = frame(None, 10, 1);
        s.enqueue(0, g.clone());
        assert_eq!(s.dequeue(10_000, 0).unwrap().0, g);
        let mut e = frame(Some(3), 10, 1);
        let mut v = RoceFrame::new_checked(&mut e[..]).unwrap();
        v.tlm_mut().unwrap().set_echo(true);
        assert_eq!(stamp(&mut e, &HopRecord::default()), Stamp::NoTelemetry);
    }

    #[test]
    fn timestamps_and_tx_bytes_wrap_mod_2_pow_32() {
        let mut s = Switch::new(1, &[port(100, 1 << 20)], 1);
        let f = frame(Some(1), 10, 1);
        s.enqueue(0, f.clone());
        let t = (1u64 << 32) + 5;
        let (out, _) = s.dequeue(t, 0).unwrap();
        assert_eq!(
            Packet::parse(&out).unwrap().repr.tlm.unwrap().hops[0].ts_ns,
            5
        );
    }

    #[test]
    fn drop_tail_at_the_buffer_limit() {
        let f = frame(None, 1000, 1);
        let mut s = Switch::new(1, &[port(100, 2 * f.len() as u64 + 10)], 1);
        assert_eq!(s.enqueue(0, f.clone()), Enqueue::Queued);
        assert_eq!(s.enqueue(0, f.clone()), Enqueue::Queued);
        assert_eq!(s.enqueue(0, f.clone()), Enqueue::Dropped);
        assert_eq!(s.counters(0).dropped, 1);
        assert_eq!(s.qlen(0), 2 * f.len() as u64);
    }

    #[test]
    fn ecn_marks_above_kmax_and_never_below_kmin() {
        let f = frame(None, 1000, 1);
        let ecn = EcnConfig {
            kmin: 5 * f.len() as u64,
            kmax: 10 * f.len() as u64,
            pmax: 0.2,
        };
        let mut s = Switch::new(
            1,
            &[PortConfig {
                ecn: Some(ecn),
                ..port(100, 1 << 30)
            }],
            1,
        );
        for _ in 0..6 {
            s.enqueue(0, f.clone());
        }
        assert_eq!(
            s.counters(0).ecn_marked,
            0,
            "queue at most kmin when they arrived"
        );
        for _ in 0..100 {
            s.enqueue(0, f.clone());
        }
        assert!(
            s.counters(0).ecn_marked >= 90,
            "{}",
            s.counters(0).ecn_marked
        );
        // Marked frames leave with CE and a valid IP checksum.
        let (mut t, mut marked) = (0, 0);
        while let Some((out, done)) = s.dequeue(t, 0) {
            marked += u64::from(Packet::parse(&out).unwrap().repr.ip.ecn == 3);
            t = done;
        }
        assert_eq!(marked, s.counters(0).ecn_marked);
    }

    #[test]
    fn ecn_thresholds_scale_with_the_port_rate() {
        let e = EcnConfig {
            kmin: 400_000,
            kmax: 1_600_000,
            pmax: 0.2,
        };
        assert_eq!(
            e.scaled(4.0),
            EcnConfig {
                kmin: 1_600_000,
                kmax: 6_400_000,
                pmax: 0.2
            }
        );
    }

    #[test]
    fn ecmp_keeps_a_flow_on_one_port_and_spreads_flows() {
        let s: Switch = Switch::new(1, &[port(100, 1 << 20)], 1);
        let ports = [2, 3, 4, 5];
        let a = frame(None, 10, 0xC001);
        assert_eq!(s.ecmp(&a, &ports), s.ecmp(&a, &ports));
        let used: std::collections::HashSet<usize> = (0..64u16)
            .map(|i| s.ecmp(&frame(None, 10, 0xC000 | i), &ports).unwrap())
            .collect();
        assert_eq!(used.len(), 4);
        assert_eq!(s.ecmp(&a, &[]), None);
    }

    #[test]
    fn ecmp_hashes_addresses_too_and_each_switch_its_own_way() {
        // One source port from 64 senders (QPNs reused alike): the source
        // addresses alone spread them.
        let from = |host: u8| frame_from(Ipv4Addr::new(10, 0, 0, host), None, 10, 0xC001);
        let ports = [0, 1, 2, 3];
        let a: Switch = Switch::new(1, &[port(100, 1 << 20)], 1);
        let mut b: Switch = Switch::new(2, &[port(100, 1 << 20)], 1);
        b.set_ecmp_seed(77);
        let pa: Vec<usize> = (1..=64)
            .map(|h| a.ecmp(&from(h), &ports).unwrap())
            .collect();
        let pb: Vec<usize> = (1..=64)
            .map(|h| b.ecmp(&from(h), &ports).unwrap())
            .collect();
        for p in ports {
            let n = pa.iter().filter(|&&x| x == p).count();
            assert!((8..=24).contains(&n), "port {p}: {n} of 64 flows");
        }
        // A second tier with another seed does not repeat the first's split.
        assert!(pa.iter().zip(&pb).filter(|(x, y)| x == y).count() < 32);
    }
}
