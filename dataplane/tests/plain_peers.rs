//! A standard RoCEv2 peer never gets our telemetry: with the device on
//! HPCC++ (`cc = "hpcc"`), a QP moved to RTR towards a peer that is
//! neither one of the daemon's hosts nor in `telemetry_peers` runs the
//! standard controller (`standard_cc`, DCQCN by default) instead, and
//! sends no TLM block, probe or notify; a QP whose application chose its
//! mode (rnicdv) keeps it.

mod daemon_util;

/// A QP connected (RTS) to QPN 0x11 at `ip`.
fn qp_to(pd: &verbs::Pd, cq: &verbs::Cq, ip: &str) -> verbs::Qp {
    pd.qp_builder(cq)
        .build()
        .unwrap()
        .connect(&verbs::Endpoint {
            qpn: 0x11,
            psn: 0,
            ip: ip.parse().unwrap(),
            mr: None,
        })
        .unwrap()
}

#[test]
fn qps_towards_peers_without_our_telemetry_run_the_standard_controller() {
    let d = daemon_util::start_daemon_with(
        "plain-peers",
        "",
        "cc = \"hpcc\"\ntelemetry_peers = [\"10.8.0.0/16\"]",
    );
    let dev = verbs::Device::open(&d.socket, "rnic0").unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut modes = Vec::new();
    for ip in ["10.0.0.2", "10.9.9.9", "10.8.1.1"] {
        let qp = qp_to(&pd, &cq, ip);
        modes.push(qp.query().unwrap().cc);
    }
    assert_eq!(modes, ["hpcc", "dcqcn", "hpcc"]);
    let stats = dataplane::service::query_stats(&d.socket).unwrap();
    let service = stats.service.expect("the service counters");
    assert_eq!(service.plain_peer_qps, 1);
}

#[test]
fn a_configured_device_has_its_name_address_and_mac() {
    let d = daemon_util::start_daemon_with(
        "devices",
        ", \"--vdev=net_null0\"",
        "[[service.devices]]\nname = \"roce0\"\nport = 0\nip = \"10.77.0.3\"\nmac = \"02:77:00:00:00:03\"",
    );
    let list = verbs::list_devices(&d.socket).unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    let dev = &list[0];
    assert_eq!(dev.name, "roce0");
    assert_eq!(dev.ip, std::net::Ipv4Addr::new(10, 77, 0, 3));
    assert_eq!(dev.mac, [2, 0x77, 0, 0, 0, 3]);
}

/// What the device `dev` of a daemon started with `eal` and `service`
/// (plus a tap and the static neighbour 10.9.9.9 at 02:09:09:09:09:09)
/// sent when an application WRITEs to that neighbour: the port's counters
/// and the frames of the tap (closed on SIGTERM) addressed to it.
fn frames_to_static_neighbour(
    name: &str,
    eal: &str,
    service: &str,
    dev: &str,
) -> (dataplane::stats::PortEntry, Vec<Vec<u8>>) {
    frames_of_write_to_static_neighbour(name, eal, service, dev, 64)
}

/// [`frames_to_static_neighbour`] of a WRITE of `len` bytes (at most
/// 4096) of the pattern `pattern(len)`, waiting until the whole message
/// was sent.
fn frames_of_write_to_static_neighbour(
    name: &str,
    eal: &str,
    service: &str,
    dev: &str,
    len: u32,
) -> (dataplane::stats::PortEntry, Vec<Vec<u8>>) {
    let out = tempfile::tempdir().unwrap();
    let pcap = out.path().join("service.pcap");
    let mut d = daemon_util::start_daemon_with(
        name,
        eal,
        &format!(
            "tap = \"{}\"\n{service}\n[[service.neighbours]]\nip = \"10.9.9.9\"\nmac = \"02:09:09:09:09:09\"",
            pcap.display()
        ),
    );
    let dev = verbs::Device::open(&d.socket, dev).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mut mr = pd
        .alloc_mr(
            4096,
            shm::proto::MrAccess {
                local_write: true,
                ..Default::default()
            },
        )
        .unwrap();
    mr.as_mut_slice()[..len as usize].copy_from_slice(&pattern(len as usize));
    let qp = qp_to(&pd, &cq, "10.9.9.9");
    let remote = verbs::RemoteMr {
        va: 0x1000,
        rkey: 7,
        len: u64::from(len),
    };
    qp.post_write(verbs::LocalBuf::of(&mr, 0, len), &remote, 0, 1, true)
        .unwrap();
    let t0 = std::time::Instant::now();
    let port = loop {
        let s = dataplane::service::query_stats(&d.socket).unwrap();
        let p = s.ports[0].clone();
        // Every packet of the message sent (the loopback's MTU is 1 KiB).
        let sent = p.qp_totals.tx_packets >= u64::from(len.div_ceil(1024));
        if sent || t0.elapsed() > std::time::Duration::from_secs(30) {
            break p;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(qp);
    drop(mr);
    drop(pd);
    drop(cq);
    drop(dev);
    let (status, _) = d.stop(nix::sys::signal::Signal::SIGTERM);
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let mut r = nic::pcap::Reader::open(&pcap).unwrap();
    let mut to_peer = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.unwrap();
        if rec.data.starts_with(&[2, 9, 9, 9, 9, 9]) {
            to_peer.push(rec.data);
        }
    }
    (port, to_peer)
}

/// A static neighbour from the config is used without asking ARP, and the
/// service's pcap tap records what the device sends, closed on SIGTERM.
#[test]
fn a_static_neighbour_needs_no_arp_and_the_tap_records_the_frames() {
    let (port, to_peer) = frames_to_static_neighbour("static-neighbour", "", "", "rnic0");
    assert!(port.stats.opackets > 0, "nothing sent: {port:?}");
    assert_eq!((port.arp_tx, port.tx_unresolved), (0, 0), "{port:?}");
    assert!(
        !to_peer.is_empty(),
        "the WRITE to the static neighbour is in the tap"
    );
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ 0x5a)
        .collect()
}

/// Zero-copy TX: a WRITE's payloads of 1 KiB (the loopback's MTU, the
/// default threshold) leave from the application's memory where it lies,
/// in a chain of mbufs, and are on the wire (the tap joins the pieces)
/// exactly as a frame built whole: a valid ICRC over headers and payload,
/// the message's bytes in order. With the threshold at 0 the same frames
/// are copied.
#[test]
fn payloads_sent_from_the_apps_memory_are_the_frames_on_the_wire() {
    for (name, service, zero_copy) in [
        ("zero-copy-tx", "", true),
        ("copied-tx", "zero_copy_tx_min = 0", false),
    ] {
        let (port, to_peer) = frames_of_write_to_static_neighbour(name, "", service, "rnic0", 4096);
        let mut first = Vec::new();
        for f in &to_peer {
            let p = transport::wire::Packet::parse(f)
                .unwrap_or_else(|e| panic!("{name}: {e}: {} bytes", f.len()));
            // The first time each PSN went (RC sends again without an ACK).
            if first.len() < 4 && p.payload.len() == 1024 {
                first.push(p.payload.to_vec());
            }
        }
        assert_eq!(
            first.concat(),
            pattern(4096),
            "{name}: the message in order"
        );
        if zero_copy {
            assert!(port.tx_zero_copy >= 4, "{name}: {port:?}");
        } else {
            assert_eq!(port.tx_zero_copy, 0, "{name}: {port:?}");
        }
        assert_eq!(port.tx_zero_copy_fallback, 0, "{name}: {port:?}");
    }
}

/// A device with `vlan` and `priority` in the config tags every frame it
/// sends with them (802.1Q TCI = priority << 13 | vlan).
#[test]
fn a_device_on_a_vlan_tags_its_frames_with_the_vlan_and_priority() {
    let (port, to_peer) = frames_to_static_neighbour(
        "vlan-device",
        ", \"--vdev=net_null0,no-rx=1\"",
        "[[service.devices]]\nname = \"roce0\"\nport = 0\nip = \"10.9.0.3\"\nmac = \"02:77:00:00:00:03\"\nvlan = 100\npriority = 5",
        "roce0",
    );
    assert!(port.stats.opackets > 0, "nothing sent: {port:?}");
    assert!(!to_peer.is_empty(), "the WRITE is in the tap");
    for f in &to_peer {
        assert_eq!(
            &f[12..18],
            &[0x81, 0x00, 0xa0, 0x64, 0x08, 0x00],
            "{f:02x?}"
        );
        let p = transport::wire::Packet::parse(f)
            .unwrap_or_else(|e| panic!("{e}: {} {f:02x?}", f.len()));
        assert_eq!(p.repr.ip.src, std::net::Ipv4Addr::new(10, 9, 0, 3));
    }
}
