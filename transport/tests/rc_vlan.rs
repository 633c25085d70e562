//! A device on an 802.1Q VLAN: every frame it sends carries its tag (VLAN
//! id and priority), and it takes only frames of its own VLAN; the others
//! are counted as `wrong_vlan`.

mod rc_util;

use rc_util::{Dir, Pair, Setup, MAC_A};
use transport::rc::{EngineConfig, WcStatus, WrOp};
use transport::wire::{ErrorKind, EthernetFrame, VlanTag};

const VLAN_100: VlanTag = VlanTag {
    pcp: 3,
    dei: false,
    vid: 100,
};

fn on_vlan_100(mac: transport::wire::MacAddr, ip: std::net::Ipv4Addr) -> EngineConfig {
    EngineConfig {
        vlan: Some(VLAN_100),
        ..EngineConfig::new(mac, ip, 100_000_000_000)
    }
}

#[test]
fn both_ends_on_one_vlan_tag_every_frame_and_writes_and_reads_complete() {
    let mut p = Pair::new(Setup {
        cfg: on_vlan_100,
        ..Setup::default()
    });
    p.fill_a(0, 5000, 1);
    p.fill_b(1 << 20, 5000, 2);
    let w = p.wr(1, WrOp::Write, 0, 0, 5000);
    p.post(w);
    let r = p.wr(2, WrOp::Read, 1 << 20, 1 << 20, 5000);
    p.post(r);
    p.run(1_000_000_000);
    let c = p.completions_a();
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.a_bytes(0, 5000), p.b_bytes(0, 5000));
    assert_eq!(p.a_bytes(1 << 20, 5000), p.b_bytes(1 << 20, 5000));
    for dir in [Dir::AtoB, Dir::BtoA] {
        let frames = p.frames(dir);
        assert!(!frames.is_empty());
        for f in frames {
            let e = EthernetFrame::new_checked(&f[..]).unwrap();
            assert_eq!(e.vlan(), Some(VLAN_100), "{dir:?}");
        }
    }
    assert_eq!(p.a.engine().counters().wire_drops.iter().sum::<u64>(), 0);
}

#[test]
fn frames_of_another_vlan_are_dropped_as_wrong_vlan_and_the_wr_fails() {
    // A is on VLAN 100; B is untagged, so neither takes the other's frames.
    let mut p = Pair::new(Setup {
        cfg: |mac, ip| {
            if mac == MAC_A {
                on_vlan_100(mac, ip)
            } else {
                EngineConfig::new(mac, ip, 100_000_000_000)
            }
        },
        timeout: 4,
        retry_cnt: 2,
        ..Setup::default()
    });
    let w = p.wr(1, WrOp::Write, 0, 0, 100);
    p.post(w);
    p.run(1_000_000_000);
    let c = p.completions_a();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::RetryExcErr);
    let drops = &p.b.engine().counters().wire_drops;
    let sent = p.frames(Dir::AtoB).len() as u64;
    assert_eq!(sent, 5, "the first try, then each of 2 retries twice");
    assert_eq!(drops[ErrorKind::WrongVlan.index()], sent);
    assert_eq!(drops.iter().sum::<u64>(), sent, "counted as nothing else");
    assert!(p.b_bytes(0, 100).iter().all(|&b| b == 0), "nothing placed");
}
