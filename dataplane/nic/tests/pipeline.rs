//! Two NICs joined by the in-memory link, stepped in virtual time through
//! `Nic::poll`: WRITEs and READs arrive intact over a clean wire and over
//! a faulty one, and every frame the pipeline could not send is counted.

use std::net::Ipv4Addr;

use nic::{mem_link, Completions, Direction, FaultConfig, FaultInjector, FramePort, MemPort, Nic};
use transport::mr::{Access, MrKeys, VecMemory};
use transport::rc::{
    ConnectParams, Endpoint, Engine, EngineConfig, PathMtu, SendWr, Sge, WcStatus, WrOp,
};
use transport::wire::{ErrorKind, EthernetFrame, MacAddr, VlanTag};

const BASE: u64 = 0x1000;
const LEN: usize = 1 << 20;

fn engine(i: u8) -> (Engine<VecMemory>, MrKeys, u32) {
    engine_on(i, None)
}

/// Engine `i` on 802.1Q VLAN `vlan` (None: untagged).
fn engine_on(i: u8, vlan: Option<VlanTag>) -> (Engine<VecMemory>, MrKeys, u32) {
    let mut mem = VecMemory::new();
    mem.add(BASE, LEN);
    let cfg = EngineConfig {
        vlan,
        ..EngineConfig::new(mac(i), ip(i), 100_000_000_000)
    };
    let mut e = Engine::new(cfg, mem, 0);
    let mr = e.register_mr(BASE, LEN as u64, Access::ALL).unwrap();
    let q = e.create_qp(64, 0).unwrap();
    (e, mr, q)
}

fn mac(i: u8) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, i + 1])
}

fn ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, i + 1)
}

/// Connects QP `a.1` of engine 0 and QP `b.1` of engine 1 to each other.
fn connect_pair(
    a: (&mut Engine<VecMemory>, u32),
    b: (&mut Engine<VecMemory>, u32),
    p: &ConnectParams,
) {
    let end = |i: u8, qpn| Endpoint {
        qpn,
        psn: 0,
        mac: mac(i),
        ip: ip(i),
    };
    a.0.connect_to(a.1, 0, &end(1, b.1), p).unwrap();
    b.0.connect_to(b.1, 0, &end(0, a.1), p).unwrap();
}

/// The two NICs of a run.
type Nics<P, Q> = (Nic<P, VecMemory>, Nic<Q, VecMemory>);

/// Runs `ops` over two NICs whose ports are `pa` and `pb`; returns the
/// completions of A.
fn run<P: FramePort, Q: FramePort>(
    pa: P,
    pb: Q,
    ops: &[(WrOp, u32)],
) -> (Vec<WcStatus>, Nics<P, Q>) {
    let (mut ea, ka, qa) = engine(0);
    let (mut eb, kb, qb) = engine(1);
    let p = ConnectParams {
        timeout: 4,
        ..ConnectParams::new(PathMtu::Mtu1024)
    };
    connect_pair((&mut ea, qa), (&mut eb, qb), &p);
    let half = (LEN / 2) as u64;
    for (k, b) in ea.mem_mut().slice_mut(BASE, LEN / 2).iter_mut().enumerate() {
        *b = (k % 251) as u8;
    }
    for (k, b) in eb.mem_mut().slice_mut(BASE, LEN / 2).iter_mut().enumerate() {
        *b = (k % 241) as u8;
    }
    let (mut na, mut nb) = (Nic::new(ea, pa, 1024), Nic::new(eb, pb, 1024));
    let mut done = Completions::default();
    let mut now = 0;
    for (i, &(op, len)) in ops.iter().enumerate() {
        let (local, remote) = if op == WrOp::Read {
            (BASE + half, BASE)
        } else {
            (BASE, BASE + half)
        };
        let buf = Sge {
            lkey: ka.lkey,
            va: local,
            len,
        };
        let wr = SendWr::new(i as u64, op, buf, kb.rkey, remote);
        na.engine_mut().post_send(qa, wr, now).unwrap();
        loop {
            na.poll(now, &mut done);
            nb.poll(now, &mut Completions::default());
            if done.0.len() > i {
                break;
            }
            let next = [na.next_wakeup(now), nb.next_wakeup(now)]
                .into_iter()
                .flatten()
                .min();
            now = next
                .expect("a pending operation always has a next event")
                .max(now);
        }
        let (a, b) = (na.engine().mem(), nb.engine().mem());
        let n = len as usize;
        if op == WrOp::Read {
            assert_eq!(a.slice(BASE + half, n), b.slice(BASE, n), "READ {len}");
        } else {
            assert_eq!(a.slice(BASE, n), b.slice(BASE + half, n), "WRITE {len}");
        }
    }
    (done.0.iter().map(|c| c.status).collect(), (na, nb))
}

const OPS: [(WrOp, u32); 8] = [
    (WrOp::Write, 0),
    (WrOp::Write, 1),
    (WrOp::Read, 1023),
    (WrOp::Write, 1025),
    (WrOp::Read, 4096),
    (WrOp::Write, 65536),
    (WrOp::Read, 65537),
    (WrOp::Write, 300_000),
];

#[test]
fn writes_and_reads_cross_a_clean_link() {
    let (a, b) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let (st, nics) = run(a, b, &OPS);
    assert!(st.iter().all(|s| *s == WcStatus::Success), "{st:?}");
    let c = nics.0.counters();
    assert_eq!(c.tx_no_buffer + c.tx_buffer_too_small, 0);
    assert_eq!(nics.0.engine().counters().tx_frames, c.tx_frames);
    assert_eq!(c.completions, OPS.len() as u64);
    assert_eq!(nics.1.counters().rx_frames, c.tx_frames);
}

#[test]
fn writes_and_reads_cross_a_faulty_link_intact() {
    let (a, b) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let faults = |seed| FaultConfig {
        seed,
        loss: 0.05,
        duplicate: 0.02,
        reorder: 0.05,
        corrupt: 0.01,
        direction: Direction::Rx,
        ..FaultConfig::default()
    };
    let a = FaultInjector::new(a, faults(1)).unwrap();
    let b = FaultInjector::new(b, faults(2)).unwrap();
    let (st, nics) = run(a, b, &OPS);
    assert!(st.iter().all(|s| *s == WcStatus::Success), "{st:?}");
    let fa = nics.0.port().counters();
    let fb = nics.1.port().counters();
    assert!(fa.lost + fb.lost > 0 && fa.corrupted + fb.corrupted > 0);
    // Every corrupted frame that reached an engine was refused by it.
    let refused: u64 = [nics.0.engine(), nics.1.engine()]
        .iter()
        .map(|e| e.counters().wire_drops.iter().sum::<u64>())
        .sum();
    assert_eq!(refused, fa.corrupted_delivered + fb.corrupted_delivered);
}

/// A port that has no buffers for its first `starve` frames.
struct Starved<P> {
    inner: P,
    starve: u32,
}

impl<P: FramePort> FramePort for Starved<P> {
    type Frame = P::Frame;
    fn rx_burst(&mut self, now: u64, out: &mut Vec<P::Frame>, max: usize) -> usize {
        self.inner.rx_burst(now, out, max)
    }
    fn tx_burst(&mut self, now: u64, frames: &mut Vec<P::Frame>) -> usize {
        self.inner.tx_burst(now, frames)
    }
    fn alloc(&mut self) -> Option<P::Frame> {
        if self.starve > 0 {
            self.starve -= 1;
            return None;
        }
        self.inner.alloc()
    }
    fn next_event(&self) -> Option<u64> {
        self.inner.next_event()
    }
    fn mac(&self) -> MacAddr {
        self.inner.mac()
    }
    fn mtu(&self) -> u32 {
        self.inner.mtu()
    }
    fn link_up(&self) -> bool {
        true
    }
}

#[test]
fn a_frame_without_a_buffer_is_counted_and_recovered() {
    let (a, b) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let a = Starved {
        inner: a,
        starve: 3,
    };
    let b = Starved {
        inner: b,
        starve: 0,
    };
    let (st, nics) = run(a, b, &OPS[..4]);
    assert!(st.iter().all(|s| *s == WcStatus::Success), "{st:?}");
    // Every frame the engine built either left or is counted.
    let c = nics.0.counters();
    assert!(c.tx_no_buffer > 0);
    assert_eq!(
        nics.0.engine().counters().tx_frames,
        c.tx_frames + c.tx_no_buffer
    );
    assert!(nics.0.engine().qp_counters(0x11).unwrap().retransmitted > 0);
}

#[test]
fn the_tap_records_what_a_port_sends_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/tap.pcap");
    let cap = nic::Capture::create(&path, u64::MAX).unwrap();
    let (a, b) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let a = nic::Tap::new(a, Some(cap.clone()), Direction::Tx);
    let (st, nics) = run(a, b, &OPS[..3]);
    assert!(st.iter().all(|s| *s == WcStatus::Success));
    let written = cap.lock().unwrap().finish().unwrap();
    assert_eq!(written, nics.0.counters().tx_frames);
    let mut r = nic::pcap::Reader::open(&path).unwrap();
    let mut n = 0;
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let p = transport::wire::Packet::parse(&rec.data).unwrap();
        assert_eq!(p.repr.eth.src, mac(0));
        n += 1;
    }
    assert_eq!(n, written);
}

#[test]
fn a_qp_connected_to_a_qp_of_the_same_nic_is_served_by_local_loopback() {
    let (a, _b) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let (mut e, k, qa) = engine(0);
    let qb = e.create_qp(64, 0).unwrap();
    let p = ConnectParams {
        timeout: 4,
        ..ConnectParams::new(PathMtu::Mtu1024)
    };
    let end = |qpn| Endpoint {
        qpn,
        psn: 0,
        mac: mac(0),
        ip: ip(0),
    };
    e.connect_to(qa, 0, &end(qb), &p).unwrap();
    e.connect_to(qb, 0, &end(qa), &p).unwrap();
    let quarter = (LEN / 4) as u64;
    for (i, b) in e.mem_mut().slice_mut(BASE, LEN / 4).iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    let mut nic = Nic::new(e, a, 1024);
    let mut done = Completions::default();
    // A WRITE from the first quarter to the second, then a READ of the
    // second into the third: both ends are QPs of this one NIC.
    let ops = [
        (WrOp::Write, BASE, BASE + quarter),
        (WrOp::Read, BASE + 2 * quarter, BASE + quarter),
    ];
    let mut now = 0;
    for (i, &(op, local, remote)) in ops.iter().enumerate() {
        let sge = Sge {
            lkey: k.lkey,
            va: local,
            len: 100_000,
        };
        let wr = SendWr::new(i as u64, op, sge, k.rkey, remote);
        nic.engine_mut().post_send(qa, wr, now).unwrap();
        while done.0.len() <= i {
            nic.poll(now, &mut done);
            now = nic.next_wakeup(now).unwrap_or(now + 1_000).max(now);
        }
    }
    assert!(done.0.iter().all(|c| c.status == WcStatus::Success));
    let m = nic.engine().mem();
    assert_eq!(m.slice(BASE, 100_000), m.slice(BASE + quarter, 100_000));
    assert_eq!(m.slice(BASE, 100_000), m.slice(BASE + 2 * quarter, 100_000));
    let c = nic.counters();
    assert_eq!(c.tx_frames, 0, "nothing left through the port");
    assert!(c.looped_frames > 100);
    assert_eq!(c.rx_frames, c.looped_frames);
}

/// A's port, recording what it sends and receives when given a capture.
type TappedPort = nic::Tap<MemPort>;

/// Two NICs whose QPs were connected without their peer's MAC: the
/// pipeline resolves it with ARP. Returns A's completions and the NICs.
fn unresolved_pair(
    peer_ip_of_a: Ipv4Addr,
    retry_cnt: u8,
) -> (Vec<WcStatus>, Nics<TappedPort, MemPort>) {
    unresolved_pair_on(peer_ip_of_a, retry_cnt, [None, None], None)
}

/// [`unresolved_pair`] with A and B on the given VLANs, A's port tapped
/// into `capture`.
fn unresolved_pair_on(
    peer_ip_of_a: Ipv4Addr,
    retry_cnt: u8,
    vlans: [Option<VlanTag>; 2],
    capture: Option<nic::SharedCapture>,
) -> (Vec<WcStatus>, Nics<TappedPort, MemPort>) {
    let (pa, pb) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let pa = nic::Tap::new(pa, capture, Direction::Both);
    let (mut ea, ka, qa) = engine_on(0, vlans[0]);
    let (mut eb, kb, qb) = engine_on(1, vlans[1]);
    let p = ConnectParams {
        timeout: 4,
        retry_cnt,
        ..ConnectParams::new(PathMtu::Mtu1024)
    };
    let unknown = MacAddr::default();
    let to_b = Endpoint {
        qpn: qb,
        psn: 0,
        mac: unknown,
        ip: peer_ip_of_a,
    };
    let to_a = Endpoint {
        qpn: qa,
        psn: 0,
        mac: unknown,
        ip: ip(0),
    };
    ea.connect_to(qa, 0, &to_b, &p).unwrap();
    eb.connect_to(qb, 0, &to_a, &p).unwrap();
    let (mut na, mut nb) = (Nic::new(ea, pa, 1024), Nic::new(eb, pb, 1024));
    let sge = Sge {
        lkey: ka.lkey,
        va: BASE,
        len: 10_000,
    };
    let wr = SendWr::new(1, WrOp::Write, sge, kb.rkey, BASE + 4096 * 4);
    na.engine_mut().post_send(qa, wr, 0).unwrap();
    let mut done = Completions::default();
    let mut now = 0;
    while done.0.is_empty() && now < 10_000_000_000 {
        na.poll(now, &mut done);
        nb.poll(now, &mut Completions::default());
        let next = [na.next_wakeup(now), nb.next_wakeup(now)]
            .into_iter()
            .flatten()
            .min();
        now = next.unwrap_or(now + 1_000_000).max(now);
    }
    (done.0.iter().map(|c| c.status).collect(), (na, nb))
}

#[test]
fn a_peer_mac_unknown_at_rtr_is_resolved_by_arp_and_the_write_arrives() {
    let (st, (na, nb)) = unresolved_pair(ip(1), 7);
    assert_eq!(st, [WcStatus::Success]);
    let (a, b) = (na.counters(), nb.counters());
    assert!(a.arp_tx >= 1 && b.arp_rx >= 1, "A asked");
    assert!(b.arp_tx >= 1 && a.arp_rx >= 1, "B answered");
    assert!(
        a.tx_held >= 1 && a.tx_unresolved == 0,
        "the first frames were held for the answer, none lost: {a:?}"
    );
    assert_eq!(na.neighbours().lookup(ip(1), 0), Some(mac(1)));
    // B learned A from the request it answered.
    assert_eq!(nb.neighbours().lookup(ip(0), 0), Some(mac(0)));
    let (ma, mb) = (na.engine().mem(), nb.engine().mem());
    assert_eq!(ma.slice(BASE, 10_000), mb.slice(BASE + 4096 * 4, 10_000));
}

#[test]
fn a_peer_that_never_answers_arp_fails_the_qp_with_retry_exceeded() {
    let (st, (na, _)) = unresolved_pair(Ipv4Addr::new(10, 0, 0, 99), 2);
    assert_eq!(st, [WcStatus::RetryExcErr]);
    let c = na.counters();
    assert!(c.arp_tx >= 1 && c.tx_held == 0, "{c:?}");
    assert!(c.tx_unresolved + na.held_for_arp() as u64 >= 1, "{c:?}");
    assert_eq!(c.tx_frames, c.arp_tx, "nothing but ARP left the port");
    assert!(na.neighbours().counters().requests >= 1);
}

#[test]
fn an_arp_request_queued_in_a_pass_is_sent_in_the_next_without_waiting_for_a_timer() {
    let (pa, _pb) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let (mut e, k, q) = engine(0);
    let p = ConnectParams {
        timeout: 20, // a timer far away: nothing else is due soon
        ..ConnectParams::new(PathMtu::Mtu1024)
    };
    let peer = Endpoint {
        qpn: 0x11,
        psn: 0,
        mac: MacAddr::default(),
        ip: ip(1),
    };
    e.connect_to(q, 0, &peer, &p).unwrap();
    let sge = Sge {
        lkey: k.lkey,
        va: BASE,
        len: 64,
    };
    e.post_send(q, SendWr::new(1, WrOp::Write, sge, k.rkey, BASE), 0)
        .unwrap();
    let mut nic = Nic::new(e, pa, 1024);
    nic.poll(0, &mut Completions::default());
    assert_eq!(nic.held_for_arp(), 1, "the WRITE waits for a MAC");
    assert_eq!(nic.counters().tx_unresolved, 0, "held, not lost");
    assert_eq!(nic.next_wakeup(0), Some(0), "the ARP request is due now");
    nic.poll(0, &mut Completions::default());
    assert_eq!(nic.counters().arp_tx, 1);
}

const VLAN_100: VlanTag = VlanTag {
    pcp: 5,
    dei: false,
    vid: 100,
};

#[test]
fn on_a_vlan_arp_and_roce_frames_carry_the_tag_and_the_write_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vlan.pcap");
    let cap = nic::Capture::create(&path, u64::MAX).unwrap();
    let vlans = [Some(VLAN_100), Some(VLAN_100)];
    let (st, (na, nb)) = unresolved_pair_on(ip(1), 7, vlans, Some(cap.clone()));
    assert_eq!(st, [WcStatus::Success]);
    let (a, b) = (na.counters(), nb.counters());
    assert!(a.arp_tx >= 1 && b.arp_rx >= 1 && b.arp_tx >= 1 && a.arp_rx >= 1);
    let (ma, mb) = (na.engine().mem(), nb.engine().mem());
    assert_eq!(ma.slice(BASE, 10_000), mb.slice(BASE + 4096 * 4, 10_000));
    let written = cap.lock().unwrap().finish().unwrap();
    let mut r = nic::pcap::Reader::open(&path).unwrap();
    let (mut arp, mut roce) = (0, 0);
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        let e = EthernetFrame::new_checked(&rec.data[..]).unwrap();
        assert_eq!(e.vlan(), Some(VLAN_100), "{:02x?}", &rec.data[..18]);
        if transport::wire::arp::is_arp(&rec.data) {
            assert_eq!(rec.data.len(), 64, "ARP padded to the tagged minimum");
            arp += 1;
        } else {
            transport::wire::Packet::parse(&rec.data).unwrap();
            roce += 1;
        }
    }
    assert_eq!(arp + roce, written);
    assert!(arp >= 2 && roce >= 10, "arp {arp} roce {roce}");
}

#[test]
fn frames_of_another_vlan_are_counted_as_wrong_vlan_and_never_answered() {
    for vlans in [
        [Some(VLAN_100), None],
        [
            Some(VLAN_100),
            Some(VlanTag {
                vid: 200,
                ..VLAN_100
            }),
        ],
    ] {
        let (st, (na, nb)) = unresolved_pair_on(ip(1), 2, vlans, None);
        assert_eq!(st, [WcStatus::RetryExcErr], "{vlans:?}");
        let wrong = nb.engine().counters().wire_drops[ErrorKind::WrongVlan.index()];
        // A's frames never got past ARP: B saw only A's requests.
        assert_eq!(wrong, na.counters().arp_tx, "{vlans:?}");
        assert_eq!(nb.counters().arp_rx, 0, "{vlans:?}");
        assert_eq!(nb.counters().arp_tx, 0, "{vlans:?}");
    }
}

/// A host that keeps every stamp the pipeline gives it, in order.
#[derive(Default)]
struct Traced {
    stamps: Vec<(nic::Stage, nic::FrameKey)>,
    done: Completions,
}

impl nic::Host<VecMemory> for Traced {
    fn completion(&mut self, e: &mut Engine<VecMemory>, c: transport::rc::Cqe) {
        nic::Host::completion(&mut self.done, e, c);
    }

    fn tracing(&self) -> bool {
        true
    }

    fn stamp(&mut self, stage: nic::Stage, key: nic::FrameKey) {
        self.stamps.push((stage, key));
    }
}

#[test]
fn a_traced_write_is_stamped_at_every_stage_on_both_nics_in_order() {
    use nic::{FrameKey, Stage};
    use transport::wire::Opcode;
    let (mut ea, ka, qa) = engine(0);
    let (mut eb, kb, qb) = engine(1);
    let p = ConnectParams::new(PathMtu::Mtu1024);
    let end = |i: u8, qpn, psn| Endpoint {
        qpn,
        psn,
        mac: mac(i),
        ip: ip(i),
    };
    ea.connect_to(qa, 7, &end(1, qb, 0), &p).unwrap();
    eb.connect_to(qb, 0, &end(0, qa, 7), &p).unwrap();
    let (pa, pb) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let (mut na, mut nb) = (Nic::new(ea, pa, 1024), Nic::new(eb, pb, 1024));
    let buf = Sge {
        lkey: ka.lkey,
        va: BASE,
        len: 64,
    };
    let wr = SendWr::new(1, WrOp::Write, buf, kb.rkey, BASE);
    na.engine_mut().post_send(qa, wr, 0).unwrap();
    let (mut ha, mut hb) = (Traced::default(), Traced::default());
    let mut now = 0;
    loop {
        na.poll(now, &mut ha);
        nb.poll(now, &mut hb);
        if !ha.done.0.is_empty() {
            break;
        }
        now = [na.next_wakeup(now), nb.next_wakeup(now)]
            .into_iter()
            .flatten()
            .min()
            .expect("a WRITE in flight has a next event")
            .max(now);
    }
    let key = |op: Opcode, dest_qp| FrameKey {
        opcode: op as u8,
        dest_qp,
        psn: 7,
    };
    let (write, ack) = (key(Opcode::RdmaWriteOnly, qb), key(Opcode::Acknowledge, qa));
    assert_eq!(
        ha.stamps,
        [
            (Stage::Built, write),
            (Stage::Sent, write),
            (Stage::Received, ack),
            (Stage::Handled, ack),
        ]
    );
    assert_eq!(
        hb.stamps,
        [
            (Stage::Received, write),
            (Stage::Handled, write),
            (Stage::Built, ack),
            (Stage::Sent, ack),
        ]
    );
    assert_eq!(ha.done.0[0].status, WcStatus::Success);
}

#[test]
fn a_pfc_pause_of_the_engines_priority_holds_tx_until_it_ends_or_resumes() {
    use transport::wire::PfcRepr;
    let (pa, pb) = mem_link([mac(0), mac(1)], 1500, 1_000);
    let (mut ea, ka, qa) = engine(0);
    let (mut eb, kb, qb) = engine(1);
    connect_pair(
        (&mut ea, qa),
        (&mut eb, qb),
        &ConnectParams::new(PathMtu::Mtu1024),
    );
    let sender = MacAddr([2, 0xFC, 0, 0, 0, 1]);
    // A PAUSE of priority 3 (the engine's DSCP 26) for 100 quanta (512 ns
    // at 100 Gb/s), and one of priority 5 that must not hold anything.
    pa.inject(0, PfcRepr::one(5, 0xFFFF).to_frame(sender));
    pa.inject(0, PfcRepr::one(3, 100).to_frame(sender));
    let (mut na, mut nb) = (Nic::new(ea, pa, 1024), Nic::new(eb, pb, 1024));
    let sge = Sge {
        lkey: ka.lkey,
        va: BASE,
        len: 100,
    };
    let wr = SendWr::new(1, WrOp::Write, sge, kb.rkey, BASE);
    na.engine_mut().post_send(qa, wr, 0).unwrap();
    na.poll(0, &mut Completions::default());
    let c = *na.counters();
    assert_eq!((c.pfc_pause_rx, c.pfc_other_rx), (1, 1));
    assert_eq!(c.tx_frames, 0, "held");
    assert!(na.pause().is_paused(511));
    // Nothing to do before the pause ends (no busy polling while held).
    assert_eq!(na.next_wakeup(0), Some(512));
    na.poll(300, &mut Completions::default());
    assert_eq!(na.counters().tx_frames, 0, "still held");
    na.poll(512, &mut Completions::default());
    assert_eq!(na.counters().tx_frames, 1, "free at the end of the pause");
    assert_eq!(na.pause().paused_ns(10_000), 512);
    // A long PAUSE, then a RESUME long before it runs out.
    na.port_mut()
        .inject(600, PfcRepr::one(3, 0xFFFF).to_frame(sender));
    na.port_mut()
        .inject(2_000, PfcRepr::one(3, 0).to_frame(sender));
    na.poll(600, &mut Completions::default());
    let wr = SendWr::new(2, WrOp::Write, sge, kb.rkey, BASE);
    na.engine_mut().post_send(qa, wr, 600).unwrap();
    na.poll(700, &mut Completions::default());
    assert_eq!(na.counters().tx_frames, 1, "held by the long pause");
    na.poll(2_000, &mut Completions::default());
    assert_eq!(na.counters().pfc_resume_rx, 1);
    assert_eq!(na.counters().tx_frames, 2, "the RESUME frees it at once");
    assert_eq!(na.pause().longest_ns(5_000), 1_400);
    // Both WRITEs arrive and complete.
    let mut done = Completions::default();
    let mut now = 2_000;
    while done.0.len() < 2 && now < 1_000_000_000 {
        na.poll(now, &mut done);
        nb.poll(now, &mut Completions::default());
        now = [na.next_wakeup(now), nb.next_wakeup(now)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(now + 1_000)
            .max(now + 1);
    }
    assert_eq!(done.0.len(), 2);
    assert!(done.0.iter().all(|c| c.status == WcStatus::Success));
    // A MAC control frame that is not PFC is counted, not obeyed.
    let mut bad = PfcRepr::one(3, 0xFFFF).to_frame(sender);
    bad[14] = 0; // 802.3x PAUSE
    na.port_mut().inject(now, bad);
    na.poll(now, &mut Completions::default());
    assert_eq!(na.counters().pfc_bad, 1);
    assert!(!na.pause().is_paused(now));
}
