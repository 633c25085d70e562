//! A standard RoCEv2 peer never gets our telemetry: with the device on
//! HPCC++ (`cc = "hpcc"`), a QP moved to RTR towards a peer that is
//! neither one of the daemon's hosts nor in `telemetry_peers` runs the
//! standard controller (`standard_cc`, DCQCN by default) instead, and
//! sends no TLM block, probe or notify; a QP whose application chose its
//! mode (rnicdv) keeps it.

mod daemon_util;

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
        let qp = pd
            .qp_builder(&cq)
            .build()
            .unwrap()
            .connect(&verbs::Endpoint {
                qpn: 0x11,
                psn: 0,
                ip: ip.parse().unwrap(),
                mr: None,
            })
            .unwrap();
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
