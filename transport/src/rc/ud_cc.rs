//! Congestion control of a UD QP, per destination. A UD QP has no peer and
//! no ACKs, so towards a destination that speaks our telemetry (its address
//! handle says so) it samples the path itself: one datagram per round trip
//! carries an empty TLM block that the switches fill, and our receiving NIC
//! answers it with a TLM_RESPONSE to the datagram's source QP (the stack
//! echoed, the datagram's PSN as the probe's `snd_psn`). Each (QP,
//! destination address) pair is one HPCC++ flow: the echo is taken as
//! probe mode takes a probe's response (NewAck with ack.seq past the
//! sample's PSN), and the datagrams to that destination are paced at the
//! flow's rate R = W / T. HPCC++'s window is not used: nothing
//! acknowledges a datagram, so there is no inflight to bound. A sample
//! whose echo does not come (lost, or the receiver has no QP) is given up
//! after a few T and the next datagram samples again.
//!
//! Towards any other destination datagrams carry no TLM block and go at
//! the line rate, as a standard RoCEv2 NIC sends them.
//!
//! The receiving half lives here too: the echoes a UD QP owes, each with
//! the outer headers of the datagram it answers reversed.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use pacer::hpcc::HpccParams;
use pacer::telemetry::HopStack;
use pacer::{CongestionControl, Hpcc};

use super::types::Qpn;
use crate::wire::{
    bth::PSN_MASK, EthernetRepr, FrameTemplate, Ipv4Repr, Packet, ProbeRepr, TlmRepr, UdpRepr,
};

/// Destinations a UD QP keeps a flow for; the one used longest ago makes
/// room for a new one (which starts again at the line rate).
pub const MAX_DEST_FLOWS: usize = 256;

/// Echoes a UD QP holds before it sends them; more are dropped and
/// counted (the sender gives the sample up and takes another).
pub const MAX_ECHOES: usize = 64;

/// A sample is given up after this many T without its echo.
pub const SAMPLE_TIMEOUT_T: u64 = 4;

/// A datagram sent with a TLM block, waiting for its echo.
#[derive(Debug, Clone, Copy)]
struct Sample {
    psn: u32,
    deadline: u64,
}

/// One destination's HPCC++ flow.
#[derive(Debug, Clone)]
struct DestFlow {
    ip: Ipv4Addr,
    hpcc: Hpcc,
    sample: Option<Sample>,
    /// When a datagram last went to it (which flow to forget first).
    used_ns: u64,
}

/// What one destination's flow looks like (`Engine::ud_flows`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UdFlowInfo {
    pub dest_ip: Ipv4Addr,
    /// The pacing rate of datagrams to it.
    pub rate_bps: u64,
    /// HPCC++'s normalized inflight U of the last echo.
    pub u: f64,
    /// A sample is out, waiting for its echo.
    pub sampling: bool,
}

/// What an echo did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EchoTaken {
    /// The flow reacted to it.
    Taken,
    /// No sample of that PSN is out to that address (late, given up,
    /// duplicated or forged).
    Stale,
}

/// The sender's half: a flow per destination.
#[derive(Debug, Clone)]
pub(crate) struct UdCc {
    params: HpccParams,
    line_rate_bps: u64,
    /// The empty block a sample carries.
    tlm: TlmRepr,
    flows: Vec<DestFlow>,
}

impl UdCc {
    /// Flows with HPCC++ `params`; samples carry `tlm` (an empty block).
    pub fn new(params: HpccParams, line_rate_bps: u64, tlm: TlmRepr) -> Self {
        UdCc {
            params,
            line_rate_bps,
            tlm,
            flows: Vec::new(),
        }
    }

    fn flow(&self, ip: Ipv4Addr) -> Option<&DestFlow> {
        self.flows.iter().find(|f| f.ip == ip)
    }

    /// The rate datagrams to `ip` are paced at.
    pub fn rate_bps(&self, ip: Ipv4Addr) -> u64 {
        self.flow(ip)
            .map_or(self.line_rate_bps, |f| f.hpcc.rate_bps())
    }

    /// Whether the next datagram to `ip` carries a sample: none is out.
    pub fn wants_sample(&self, ip: Ipv4Addr) -> bool {
        self.flow(ip).is_none_or(|f| f.sample.is_none())
    }

    /// The block a sample carries.
    pub fn sample_tlm(&self) -> &TlmRepr {
        &self.tlm
    }

    /// A datagram of PSN `psn` went to `ip` at `now`, a sample when
    /// `sampled`.
    pub fn sent(&mut self, ip: Ipv4Addr, psn: u32, sampled: bool, now: u64) {
        let i = match self.flows.iter().position(|f| f.ip == ip) {
            Some(i) => i,
            None => {
                if self.flows.len() >= MAX_DEST_FLOWS {
                    let oldest = (0..self.flows.len())
                        .min_by_key(|&i| self.flows[i].used_ns)
                        .unwrap_or(0);
                    self.flows.swap_remove(oldest);
                }
                self.flows.push(DestFlow {
                    ip,
                    hpcc: Hpcc::new(self.params),
                    sample: None,
                    used_ns: now,
                });
                self.flows.len() - 1
            }
        };
        let f = &mut self.flows[i];
        f.used_ns = now;
        if sampled {
            let timeout = self.params.t_ns.saturating_mul(SAMPLE_TIMEOUT_T);
            f.sample = Some(Sample {
                psn: psn & PSN_MASK,
                deadline: now.saturating_add(timeout),
            });
        }
    }

    /// The echo from `ip` of the sample of PSN `psn`: HPCC++ reacts to its
    /// `hops` (`snd_nxt`: the QP's next PSN now).
    pub fn on_echo(&mut self, ip: Ipv4Addr, psn: u32, snd_nxt: u32, hops: &HopStack) -> EchoTaken {
        let Some(f) = self.flows.iter_mut().find(|f| f.ip == ip) else {
            return EchoTaken::Stale;
        };
        match f.sample {
            Some(s) if s.psn == psn & PSN_MASK => {
                f.sample = None;
                // ack.seq: the PSN after the sample's, as a probe's
                // response carries snd_nxt when the probe left.
                f.hpcc
                    .new_ack(s.psn.wrapping_add(1) & PSN_MASK, snd_nxt, hops);
                EchoTaken::Taken
            }
            _ => EchoTaken::Stale,
        }
    }

    /// The earliest deadline of a sample out.
    pub fn deadline(&self) -> Option<u64> {
        self.flows
            .iter()
            .filter_map(|f| f.sample.map(|s| s.deadline))
            .min()
    }

    /// Gives up the samples whose echo did not come by `now`: how many.
    pub fn expire(&mut self, now: u64) -> u64 {
        let mut n = 0;
        for f in &mut self.flows {
            if f.sample.is_some_and(|s| s.deadline <= now) {
                f.sample = None;
                n += 1;
            }
        }
        n
    }

    /// Every destination's flow.
    pub fn flows(&self) -> Vec<UdFlowInfo> {
        self.flows
            .iter()
            .map(|f| UdFlowInfo {
                dest_ip: f.ip,
                rate_bps: f.hpcc.rate_bps(),
                u: f.hpcc.core().u(),
                sampling: f.sample.is_some(),
            })
            .collect()
    }
}

/// An echo owed: where it goes and what it says.
#[derive(Debug, Clone)]
pub(crate) struct Echo {
    /// The answered datagram's outer headers, reversed.
    pub template: FrameTemplate,
    /// The datagram's source QP.
    pub dest_qp: Qpn,
    pub probe: ProbeRepr,
    /// The datagram's stack, ECHO set.
    pub tlm: TlmRepr,
}

/// The receiver's half: echoes waiting to go.
#[derive(Debug, Default)]
pub(crate) struct Echoes {
    queue: VecDeque<Echo>,
}

impl Echoes {
    /// Queues the echo of datagram `p` (which carries a stack and a
    /// DETH); `false` when the queue is full and it was dropped.
    pub fn answer(&mut self, p: &Packet<'_>) -> bool {
        let (Some(t), Some(d)) = (p.repr.tlm, p.repr.deth) else {
            return true;
        };
        if self.queue.len() >= MAX_ECHOES {
            return false;
        }
        let r = &p.repr;
        let eth = EthernetRepr {
            src: r.eth.dst,
            dst: r.eth.src,
            vlan: r.eth.vlan,
        };
        let ip = Ipv4Repr {
            src: r.ip.dst,
            dst: r.ip.src,
            dscp: r.ip.dscp,
            ecn: 0,
            ..Ipv4Repr::default()
        };
        let udp = UdpRepr {
            src_port: r.udp.src_port,
        };
        self.queue.push_back(Echo {
            template: FrameTemplate::new(&eth, &ip, &udp),
            dest_qp: d.src_qp,
            probe: ProbeRepr {
                probe_id: 0,
                snd_psn: r.bth.psn,
                sender_ts_ns: 0,
            },
            tlm: TlmRepr { echo: true, ..t },
        });
        true
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn pop(&mut self) -> Option<Echo> {
        self.queue.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pacer::telemetry::Hop;

    fn cc() -> UdCc {
        let p = HpccParams::new(100_000_000_000, 10_000, 16, 1024).unwrap();
        UdCc::new(p, 100_000_000_000, TlmRepr::empty(3))
    }

    fn hops(ts_ns: u32, tx_bytes: u32, qlen: u32) -> HopStack {
        let mut s = HopStack::new();
        s.push(Hop {
            ts_ns,
            tx_bytes,
            qlen,
            rate_100mbps: 1000,
            switch_id: 1,
            port_id: 1,
        });
        s
    }

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);

    #[test]
    fn one_sample_is_out_per_destination_until_its_echo() {
        let mut c = cc();
        assert!(c.wants_sample(A));
        c.sent(A, 10, true, 0);
        assert!(!c.wants_sample(A));
        assert!(c.wants_sample(B), "another destination samples on its own");
        c.sent(A, 11, false, 100);
        assert_eq!(c.on_echo(A, 11, 12, &hops(0, 0, 0)), EchoTaken::Stale);
        assert_eq!(c.on_echo(B, 10, 12, &hops(0, 0, 0)), EchoTaken::Stale);
        assert_eq!(c.on_echo(A, 10, 12, &hops(0, 0, 0)), EchoTaken::Taken);
        assert!(c.wants_sample(A));
    }

    #[test]
    fn a_sample_without_echo_is_given_up_after_its_timeout() {
        let mut c = cc();
        c.sent(A, 10, true, 1_000);
        let d = c.deadline().expect("a deadline");
        assert_eq!(d, 1_000 + SAMPLE_TIMEOUT_T * 10_000);
        assert_eq!(c.expire(d - 1), 0);
        assert_eq!(c.expire(d), 1);
        assert!(c.wants_sample(A));
        assert_eq!(c.on_echo(A, 10, 12, &hops(0, 0, 0)), EchoTaken::Stale);
    }

    #[test]
    fn a_congested_destination_slows_alone() {
        let mut c = cc();
        let mut psn = 0;
        // A link at 100 Gb/s, fully used, with a queue of 10 BDPs.
        for k in 0..20u32 {
            for ip in [A, B] {
                c.sent(ip, psn, true, u64::from(k) * 10_000);
                let q = if ip == A { 1_250_000 } else { 0 };
                let tx = if ip == A { k * 125_000 } else { k * 1_000 };
                c.on_echo(ip, psn, psn + 1, &hops(k * 10_000, tx, q));
                psn += 1;
            }
        }
        assert!(c.rate_bps(A) < 50_000_000_000, "{}", c.rate_bps(A));
        assert_eq!(c.rate_bps(B), 100_000_000_000);
    }

    #[test]
    fn the_flow_used_longest_ago_makes_room() {
        let mut c = cc();
        for i in 0..MAX_DEST_FLOWS as u32 + 1 {
            c.sent(Ipv4Addr::from(0x0a00_0000 + i), i, false, u64::from(i));
        }
        assert_eq!(c.flows().len(), MAX_DEST_FLOWS);
        assert!(c.flow(Ipv4Addr::from(0x0a00_0000)).is_none());
        assert!(c.flow(Ipv4Addr::from(0x0a00_0001)).is_some());
    }
}
