//! The connection manager, one test per rule of issue 53 and of Linux's CM
//! on RoCE (docs/cm-linux.md): two CMs exchange their MADs in virtual
//! time, a hook deciding the fate of each.

use std::net::Ipv4Addr;

use transport::cm::{AcceptParams, Cm, CmConfig, CmEvent, CommId, ConnectParams, Peer, State};
use transport::rc::{OutMad, ReceivedMad, GRH_LEN};
use transport::wire::cm::{self, CmMsg, CmaHeader, PortSpace};
use transport::wire::MacAddr;

const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const MS: u64 = 1_000_000;

/// What the wire does with the `k`th MAD of a name: false drops it.
type Hook = Box<dyn FnMut(&str, usize) -> bool>;

/// Two CMs (A active, B passive by default) and the MADs in flight.
struct Pair {
    a: Cm,
    b: Cm,
    now: u64,
    hook: Hook,
    sent: Vec<(char, String)>,
}

fn peer(ip: Ipv4Addr) -> Peer {
    Peer {
        ip,
        mac: MacAddr([2, 0, 0, 0, 0, ip.octets()[3]]),
    }
}

fn service() -> u64 {
    cm::service_id(PortSpace::Tcp, 7471)
}

impl Pair {
    fn new() -> Pair {
        let mut ca = CmConfig::new(IP_A, 0xA);
        ca.id_seed = 0x1111;
        let mut cb = CmConfig::new(IP_B, 0xB);
        cb.id_seed = 0x2222;
        let mut b = Cm::new(cb);
        b.listen(service(), 77).unwrap();
        Pair {
            a: Cm::new(ca),
            b,
            now: 0,
            hook: Box::new(|_, _| true),
            sent: Vec::new(),
        }
    }

    /// Moves every MAD each side has to the other (delivered at once),
    /// until none is left.
    fn deliver(&mut self) {
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                loop {
                    let (src, dst, from_ip) = if from_a {
                        (&mut self.a, &mut self.b, IP_A)
                    } else {
                        (&mut self.b, &mut self.a, IP_B)
                    };
                    let Some(m) = src.poll_mad() else { break };
                    moved = true;
                    let name = CmMsg::parse(&m.mad)
                        .map(|(_, c)| c.name())
                        .unwrap_or("?")
                        .to_string();
                    let k = self.sent.iter().filter(|s| s.1 == name).count();
                    self.sent
                        .push((if from_a { 'A' } else { 'B' }, name.clone()));
                    if (self.hook)(&name, k) {
                        dst.on_mad(self.now, &received(from_ip, &m));
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Runs timers (and deliveries) until `end`.
    fn run_until(&mut self, end: u64) {
        self.deliver();
        loop {
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.a.on_timeout(self.now);
                    self.b.on_timeout(self.now);
                    self.deliver();
                }
                _ => break,
            }
        }
        self.now = end;
    }

    fn events(cm: &mut Cm) -> Vec<CmEvent> {
        std::iter::from_fn(|| cm.poll_event()).collect()
    }

    fn names(&self) -> Vec<String> {
        self.sent
            .iter()
            .map(|s| format!("{}:{}", s.0, s.1))
            .collect()
    }

    /// A connects to B's service; returns A's id.
    fn connect(&mut self) -> CommId {
        let now = self.now;
        self.a.connect(now, &connect_params(&[1, 2, 3])).unwrap()
    }

    /// B's ConnectRequest event (the only event it has).
    fn request_at_b(&mut self) -> (CommId, Box<cm::Req>) {
        let ev = Pair::events(&mut self.b);
        match &ev[..] {
            [CmEvent::ConnectRequest { id, req, .. }] => (*id, req.clone()),
            other => panic!("B's events: {other:?}"),
        }
    }

    /// A whole handshake: (A's id, B's id), both established.
    fn established(&mut self) -> (CommId, CommId) {
        let ida = self.connect();
        self.deliver();
        let (idb, _) = self.request_at_b();
        let now = self.now;
        self.b.accept(now, idb, &accept_params()).unwrap();
        self.deliver();
        assert!(matches!(
            &Pair::events(&mut self.a)[..],
            [CmEvent::RepReceived { .. }]
        ));
        self.a.establish(ida).unwrap();
        self.deliver();
        assert_eq!(
            Pair::events(&mut self.a),
            [CmEvent::Established { id: ida }]
        );
        assert_eq!(
            Pair::events(&mut self.b),
            [CmEvent::Established { id: idb }]
        );
        (ida, idb)
    }
}

fn received(from: Ipv4Addr, m: &OutMad) -> ReceivedMad {
    mad_from(from, m.mad)
}

/// A MAD as QP1 receives it from `from`'s QP1.
fn mad_from(from: Ipv4Addr, mad: [u8; 256]) -> ReceivedMad {
    ReceivedMad {
        src_ip: from,
        src_mac: peer(from).mac,
        src_qpn: 1,
        pkey: 0xFFFF,
        grh: [0; GRH_LEN],
        mad,
    }
}

fn connect_params(app: &[u8]) -> ConnectParams {
    let mut private = vec![0u8; CmaHeader::LEN];
    CmaHeader {
        src_port: 40000,
        src: IP_A,
        dst: IP_B,
    }
    .emit(&mut private);
    private.extend_from_slice(app);
    ConnectParams {
        peer: peer(IP_B),
        service_id: service(),
        qpn: 0x11,
        starting_psn: 0x00AB_CDEF,
        path_mtu: 3,
        responder_resources: 4,
        initiator_depth: 2,
        retry_count: 9,
        rnr_retry_count: 7,
        srq: false,
        flow_control: true,
        transport: 0,
        traffic_class: 0,
        flow_label: 0,
        private_data: private,
        telemetry: false,
    }
}

fn accept_params() -> AcceptParams {
    AcceptParams {
        qpn: 0x22,
        starting_psn: 0x12_3456,
        responder_resources: 2,
        initiator_depth: 4,
        rnr_retry_count: 7,
        srq: false,
        flow_control: true,
        private_data: vec![9, 9],
        telemetry: false,
    }
}

#[test]
fn a_req_carries_what_linux_puts_in_one_on_roce() {
    let mut p = Pair::new();
    p.connect();
    p.deliver();
    let (_, req) = p.request_at_b();
    assert_eq!(req.service_id, 0x0000_0000_0106_1D2F);
    assert_eq!((req.local_qpn, req.starting_psn), (0x11, 0xAB_CDEF));
    assert_eq!((req.responder_resources, req.initiator_depth), (4, 2));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7), "at most 7");
    assert_eq!(req.pkey, 0xFFFF);
    assert_eq!(
        (
            req.remote_cm_response_timeout,
            req.local_cm_response_timeout
        ),
        (20, 20)
    );
    assert_eq!(req.max_cm_retries, 15);
    assert_eq!(req.local_ca_guid, 0xA);
    assert_eq!(
        (req.primary.local_lid, req.primary.remote_lid),
        (0xFFFF, 0xFFFF)
    );
    assert_eq!(req.primary.local_gid[10..], [0xff, 0xff, 10, 0, 0, 1]);
    assert_eq!(req.primary.remote_gid[10..], [0xff, 0xff, 10, 0, 0, 2]);
    assert_eq!(
        req.primary.local_ack_timeout, 19,
        "rxe's ack delay 15, lifetime 18"
    );
    assert_eq!(req.alternate.local_lid, 0, "no alternate path");
    let h = CmaHeader::parse(&req.private_data).unwrap();
    assert_eq!((h.src, h.dst, h.src_port), (IP_A, IP_B, 40000));
    assert_eq!(req.private_data[36..39], [1, 2, 3]);
}

#[test]
fn req_rep_rtu_establish_both_sides_with_the_peers_qpn_and_psn() {
    let mut p = Pair::new();
    let ida = p.connect();
    p.deliver();
    let (idb, req) = p.request_at_b();
    assert_eq!(p.b.state(idb), Some(State::ReqRcvd));
    assert_eq!(req.local_comm_id, ida);
    let now = p.now;
    p.b.accept(now, idb, &accept_params()).unwrap();
    p.deliver();
    let rep = match &Pair::events(&mut p.a)[..] {
        [CmEvent::RepReceived { id, rep }] if *id == ida => rep.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!((rep.local_qpn, rep.starting_psn), (0x22, 0x12_3456));
    assert_eq!(rep.remote_comm_id, ida);
    assert_eq!(rep.target_ack_delay, 15);
    assert_eq!(rep.private_data[..3], [9, 9, 0]);
    assert_eq!(p.a.state(ida), Some(State::RepRcvd));
    p.a.establish(ida).unwrap();
    p.deliver();
    assert_eq!(p.a.state(ida), Some(State::Established));
    assert_eq!(p.b.state(idb), Some(State::Established));
    assert_eq!(Pair::events(&mut p.b), [CmEvent::Established { id: idb }]);
    assert_eq!(p.names(), ["A:REQ", "B:REP", "A:RTU"]);
}

#[test]
fn a_req_nobody_listens_for_is_rejected_invalid_service_id() {
    let mut p = Pair::new();
    p.b.unlisten(service());
    let ida = p.connect();
    p.deliver();
    match &Pair::events(&mut p.a)[..] {
        [CmEvent::Rejected { id, reason, rej }] => {
            assert_eq!((*id, *reason), (ida, cm::rej::INVALID_SERVICE_ID));
            assert_eq!(rej.message_rejected, cm::msg::REQ);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(p.a.state(ida), None);
    assert_eq!(p.b.counters.no_listener, 1);
    assert!(p.b.is_empty());
}

#[test]
fn a_consumer_reject_carries_its_reason_and_private_data() {
    let mut p = Pair::new();
    let ida = p.connect();
    p.deliver();
    let (idb, _) = p.request_at_b();
    p.b.reject(idb, cm::rej::CONSUMER_DEFINED, b"busy").unwrap();
    p.deliver();
    match &Pair::events(&mut p.a)[..] {
        [CmEvent::Rejected { id, reason, rej }] => {
            assert_eq!((*id, *reason), (ida, 28));
            assert_eq!(&rej.private_data[..4], b"busy");
        }
        other => panic!("{other:?}"),
    }
    assert!(p.a.is_empty() && p.b.is_empty());
}

#[test]
fn a_lost_req_is_sent_again_after_its_timeout() {
    let mut p = Pair::new();
    p.hook = Box::new(|name, k| !(name == "REQ" && k == 0));
    p.connect();
    p.deliver();
    assert!(Pair::events(&mut p.b).is_empty());
    // 2 * 2^(18-8) ms + 2^(20-8) ms.
    p.run_until(6_144 * MS - 1);
    assert_eq!(p.names(), ["A:REQ"]);
    p.run_until(6_144 * MS);
    assert_eq!(p.names(), ["A:REQ", "A:REQ"]);
    p.request_at_b();
    assert_eq!(p.a.counters.retransmitted, 1);
}

#[test]
fn a_req_never_answered_ends_unreachable_after_its_retries() {
    let mut p = Pair::new();
    p.hook = Box::new(|_, _| false);
    let ida = p.connect();
    p.run_until(16 * 6_144 * MS - 1);
    assert!(Pair::events(&mut p.a).is_empty());
    p.run_until(16 * 6_144 * MS);
    assert_eq!(Pair::events(&mut p.a), [CmEvent::Unreachable { id: ida }]);
    assert_eq!(p.names().len(), 16, "the REQ and its 15 retries");
    assert!(p.a.is_empty());
}

#[test]
fn a_duplicate_req_is_dropped() {
    let mut p = Pair::new();
    p.connect();
    p.deliver();
    p.request_at_b();
    // No answer yet: A's timer sends the REQ again.
    p.run_until(6_144 * MS);
    assert_eq!(p.names(), ["A:REQ", "A:REQ"]);
    assert!(Pair::events(&mut p.b).is_empty());
    assert_eq!(p.b.counters.duplicates, 1);
    assert_eq!(p.b.len(), 1);
}

#[test]
fn a_lost_rtu_is_recovered_by_the_rep_sent_again() {
    let mut p = Pair::new();
    p.hook = Box::new(|name, k| !(name == "RTU" && k == 0));
    let ida = p.connect();
    p.deliver();
    let (idb, _) = p.request_at_b();
    let now = p.now;
    p.b.accept(now, idb, &accept_params()).unwrap();
    p.deliver();
    Pair::events(&mut p.a);
    p.a.establish(ida).unwrap();
    p.deliver();
    assert_eq!(p.b.state(idb), Some(State::RepSent));
    // The REP's timeout: 2^(REQ's LocalCMResponseTimeout - 8) ms.
    p.run_until(4_096 * MS);
    assert_eq!(p.names(), ["A:REQ", "B:REP", "A:RTU", "B:REP", "A:RTU"]);
    assert_eq!(p.b.state(idb), Some(State::Established));
    assert_eq!(Pair::events(&mut p.b), [CmEvent::Established { id: idb }]);
}

#[test]
fn an_mra_gives_the_peer_its_service_timeout() {
    let mut p = Pair::new();
    p.hook = Box::new(|name, _| name != "REQ");
    let ida = p.connect();
    p.deliver();
    // B asks for 2^(24-8) ms more.
    let mra = cm::Mra {
        local_comm_id: 0,
        remote_comm_id: ida,
        message_mraed: cm::msg::REQ,
        service_timeout: 24,
        private_data: [0; cm::MRA_PRIVATE],
    };
    let m = CmMsg::Mra(Box::new(mra)).emit(1);
    p.a.on_mad(p.now, &mad_from(IP_B, m));
    let wait = (65_536 + 2_048) * MS;
    p.run_until(wait - 1);
    assert_eq!(p.names(), ["A:REQ"], "no retry before the MRA's time");
    p.run_until(wait);
    assert_eq!(p.names(), ["A:REQ", "A:REQ"]);
}

#[test]
fn dreq_drep_disconnect_both_sides_and_timewait_ends_after_the_ack_timeout() {
    let mut p = Pair::new();
    let (ida, idb) = p.established();
    let now = p.now;
    p.a.disconnect(now, ida).unwrap();
    p.deliver();
    assert_eq!(
        Pair::events(&mut p.b),
        [CmEvent::Disconnected {
            id: idb,
            timed_out: false
        }]
    );
    assert_eq!(p.b.state(idb), Some(State::DreqRcvd));
    p.b.disconnect(now, idb).unwrap();
    p.deliver();
    assert_eq!(
        Pair::events(&mut p.a),
        [CmEvent::Disconnected {
            id: ida,
            timed_out: false
        }]
    );
    assert_eq!(p.a.state(ida), Some(State::TimeWait));
    assert_eq!(p.b.state(idb), Some(State::TimeWait));
    // 2^(19-8) ms.
    p.run_until(now + 2_048 * MS - 1);
    assert!(Pair::events(&mut p.a).is_empty());
    p.run_until(now + 2_048 * MS);
    assert_eq!(Pair::events(&mut p.a), [CmEvent::TimewaitExit { id: ida }]);
    assert_eq!(Pair::events(&mut p.b), [CmEvent::TimewaitExit { id: idb }]);
    assert!(p.a.is_empty() && p.b.is_empty());
}

#[test]
fn a_lost_drep_is_answered_again_from_timewait() {
    let mut p = Pair::new();
    p.hook = Box::new(|name, k| !(name == "DREP" && k == 0));
    let (ida, idb) = p.established();
    let now = p.now;
    p.a.disconnect(now, ida).unwrap();
    p.deliver();
    p.b.disconnect(now, idb).unwrap();
    p.deliver();
    assert_eq!(p.a.state(ida), Some(State::DreqSent));
    p.run_until(now + 6_144 * MS);
    assert_eq!(p.a.state(ida), Some(State::TimeWait));
    assert_eq!(p.names()[3..], ["A:DREQ", "B:DREP", "A:DREQ", "B:DREP"]);
}

#[test]
fn a_dreq_for_no_connection_gets_its_drep() {
    let mut p = Pair::new();
    let dreq = cm::Dreq {
        local_comm_id: 5,
        remote_comm_id: 6,
        remote_qpn: 7,
        private_data: [0; cm::DREQ_PRIVATE],
    };
    let m = CmMsg::Dreq(Box::new(dreq)).emit(0x77);
    p.b.on_mad(0, &mad_from(IP_A, m));
    let out = p.b.poll_mad().expect("a DREP");
    let (h, back) = CmMsg::parse(&out.mad).unwrap();
    assert_eq!(h.tid, 0x77, "the DREQ's TID echoed");
    match back {
        CmMsg::Drep(d) => assert_eq!((d.local_comm_id, d.remote_comm_id), (6, 5)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_req_from_a_qp_still_connected_is_rejected_stale_and_the_old_connection_disconnected() {
    let mut p = Pair::new();
    let (ida, idb) = p.established();
    // A second REQ from the same QP (a restarted peer), new comm ID.
    let now = p.now;
    let ida2 = p.a.connect(now, &connect_params(&[])).unwrap();
    p.deliver();
    assert_eq!(p.b.counters.stale, 1);
    let a_events = Pair::events(&mut p.a);
    assert!(a_events.iter().any(|e| matches!(
        e,
        CmEvent::Rejected { id, reason: 10, .. } if *id == ida2
    )));
    // B asked the old connection to go (a DREQ); A's consumer hears of
    // it and answers, and B's hears of it with the DREP, not before.
    assert!(a_events.contains(&CmEvent::Disconnected {
        id: ida,
        timed_out: false
    }));
    assert_eq!(p.b.state(idb), Some(State::DreqSent));
    assert!(Pair::events(&mut p.b).is_empty());
    p.a.disconnect(now, ida).unwrap();
    p.deliver();
    assert_eq!(
        Pair::events(&mut p.b),
        [CmEvent::Disconnected {
            id: idb,
            timed_out: false
        }]
    );
}

#[test]
fn destroying_a_connection_that_waits_for_its_rep_rejects_it_with_timeout() {
    let mut p = Pair::new();
    let ida = p.connect();
    p.deliver();
    let (idb, _) = p.request_at_b();
    p.a.destroy(p.now, ida);
    p.deliver();
    assert!(p.a.is_empty());
    match &Pair::events(&mut p.b)[..] {
        [CmEvent::Rejected { id, reason, rej }] => {
            assert_eq!((*id, *reason), (idb, cm::rej::TIMEOUT));
            assert_eq!(rej.ari[..8], 0xAu64.to_be_bytes(), "our GUID in the ARI");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_malformed_or_unsupported_mad_is_counted_and_changes_nothing() {
    let mut p = Pair::new();
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    m[16..18].copy_from_slice(&cm::attr::LAP.to_be_bytes());
    p.b.on_mad(0, &mad_from(IP_A, m));
    m[2] = 1;
    p.b.on_mad(0, &mad_from(IP_A, m));
    assert_eq!((p.b.counters.unsupported, p.b.counters.malformed), (1, 1));
    assert!(p.b.poll_mad().is_none() && p.b.poll_event().is_none() && p.b.is_empty());
}

#[test]
fn calls_in_the_wrong_state_are_refused_by_name() {
    let mut p = Pair::new();
    let ida = p.connect();
    let e = p.a.accept(0, ida, &accept_params()).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("connection {ida:#x} is in REQ_SENT, not REQ_RCVD")
    );
    assert!(p.a.establish(12345).is_err());
    let mut big = connect_params(&[0; 57]);
    big.private_data.truncate(93);
    assert!(
        p.a.connect(0, &big).is_err(),
        "93 bytes of REQ private data"
    );
}

#[test]
fn sidr_resolves_a_service_to_a_ud_qp_and_its_qkey() {
    let mut p = Pair::new();
    let udp = cm::service_id(PortSpace::Udp, 7174);
    p.b.listen(udp, 5).unwrap();
    let now = p.now;
    let ida = p.a.resolve(now, peer(IP_B), udp, &[7; 40]).unwrap();
    p.deliver();
    let idb = match &Pair::events(&mut p.b)[..] {
        [CmEvent::SidrRequest {
            listener: 5,
            id,
            req,
            ..
        }] => {
            assert_eq!(
                (req.request_id, req.service_id, req.pkey),
                (ida, udp, 0xFFFF)
            );
            assert_eq!(req.private_data[..40], [7; 40]);
            *id
        }
        other => panic!("{other:?}"),
    };
    p.b.sidr_reply(idb, cm::sidr::SUCCESS, 0x33, 0x0123_4567, &[])
        .unwrap();
    p.deliver();
    match &Pair::events(&mut p.a)[..] {
        [CmEvent::SidrReply { id, rep }] => {
            assert_eq!(*id, ida);
            assert_eq!(
                (rep.status, rep.qpn, rep.qkey, rep.service_id),
                (0, 0x33, 0x0123_4567, udp)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(p.a.is_empty() && p.b.is_empty());
    assert_eq!(p.names(), ["A:SIDR_REQ", "B:SIDR_REP"]);
}

#[test]
fn a_sidr_req_nobody_listens_for_is_answered_unsupported() {
    let mut p = Pair::new();
    let now = p.now;
    let ida =
        p.a.resolve(now, peer(IP_B), cm::service_id(PortSpace::Udp, 1), &[])
            .unwrap();
    p.deliver();
    match &Pair::events(&mut p.a)[..] {
        [CmEvent::SidrReply { id, rep }] => {
            assert_eq!((*id, rep.status), (ida, cm::sidr::UNSUPPORTED));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_sidr_req_never_answered_ends_unreachable_after_its_retries() {
    let mut p = Pair::new();
    p.hook = Box::new(|_, _| false);
    let now = p.now;
    let ida = p.a.resolve(now, peer(IP_B), 1, &[]).unwrap();
    // 2^(20-8) ms, 1 + 15 times.
    p.run_until(16 * 4_096 * MS);
    assert_eq!(Pair::events(&mut p.a), [CmEvent::Unreachable { id: ida }]);
    assert_eq!(p.names().len(), 16);
}

#[test]
fn our_telemetry_is_offered_in_the_req_and_taken_in_the_rep_where_linux_reads_nothing() {
    use transport::cm::{rep_speaks_telemetry, req_offers_telemetry};
    let mut p = Pair::new();
    let now = p.now;
    let plain = p.a.connect(now, &connect_params(&[])).unwrap();
    p.deliver();
    let (idb, req) = p.request_at_b();
    assert!(!req_offers_telemetry(&req), "a plain REQ offers nothing");
    assert_eq!(req.alternate, cm::CmPath::default());
    p.b.reject(idb, cm::rej::CONSUMER_DEFINED, &[]).unwrap();
    p.deliver();
    let _ = (plain, Pair::events(&mut p.a));
    let ours = ConnectParams {
        telemetry: true,
        qpn: 0x12,
        ..connect_params(&[])
    };
    let ida = p.a.connect(now, &ours).unwrap();
    p.deliver();
    let (idb, req) = p.request_at_b();
    assert!(req_offers_telemetry(&req));
    // Linux takes an alternate path only with a LID or an OPA GID
    // (interface ID bytes 8-10 = 00:06:6a): neither.
    assert_eq!(req.alternate.local_lid, 0);
    assert_ne!(req.alternate.local_gid[8..11], [0x00, 0x06, 0x6a]);
    let acc = AcceptParams {
        telemetry: true,
        ..accept_params()
    };
    p.b.accept(now, idb, &acc).unwrap();
    p.deliver();
    match &Pair::events(&mut p.a)[..] {
        [CmEvent::RepReceived { id, rep }] => {
            assert_eq!(*id, ida);
            assert!(rep_speaks_telemetry(rep));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_second_mra_does_not_extend_the_wait_again() {
    let mut p = Pair::new();
    p.hook = Box::new(|name, _| name != "REQ");
    let ida = p.connect();
    p.deliver();
    let mra = |p: &mut Pair| {
        let m = cm::Mra {
            local_comm_id: 0,
            remote_comm_id: ida,
            message_mraed: cm::msg::REQ,
            service_timeout: 24,
            private_data: [0; cm::MRA_PRIVATE],
        };
        let out = CmMsg::Mra(Box::new(m)).emit(1);
        let now = p.now;
        p.a.on_mad(now, &mad_from(IP_B, out));
    };
    mra(&mut p);
    p.run_until(60_000 * MS);
    mra(&mut p);
    p.run_until((65_536 + 2_048) * MS);
    assert_eq!(
        p.names(),
        ["A:REQ", "A:REQ"],
        "the retry came at the first MRA's time"
    );
    assert_eq!(p.a.counters.duplicates, 1);
}

#[test]
fn a_req_for_another_host_is_not_answered() {
    let mut p = Pair::new();
    let mut params = connect_params(&[]);
    params.peer = peer(Ipv4Addr::new(10, 0, 0, 99));
    let now = p.now;
    p.a.connect(now, &params).unwrap();
    // The REQ reaches B all the same (flooded).
    let m = p.a.poll_mad().unwrap();
    p.b.on_mad(now, &received(IP_A, &m));
    assert!(p.b.poll_mad().is_none() && p.b.poll_event().is_none());
    assert_eq!(p.b.counters.unmatched, 1);
}
