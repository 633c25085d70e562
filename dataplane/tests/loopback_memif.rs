//! The loopback testbed over a memif pair (server and client in one process), without hugepages: WRITE and READ of
//! sizes 0 B .. 1 MiB between the two hosts, every byte verified, every
//! tapped frame a valid RoCEv2 frame with a good ICRC, no mbuf leaked.
//! One EAL per process, so this test has its own main (harness = false).

mod loopback_util;

use dataplane::testbed::{Loopback, LoopbackConfig};

fn main() {
    let sock = format!("/tmp/rnic-memif-{}.sock", std::process::id());
    let eal = loopback_util::eal(
        "loopback-memif",
        &[
            format!("--vdev=net_memif0,role=server,id=0,socket={sock}"),
            format!("--vdev=net_memif1,role=client,id=0,socket={sock}"),
        ],
    );
    let (cfg, dir) = loopback_util::tapped(LoopbackConfig {
        queues: 2,
        ..LoopbackConfig::default()
    });
    assert_eq!(eal.port_count(), 2, "two memif ports");
    let mut tb = Loopback::on_ports(&eal, &cfg, 0, 1).expect("testbed");
    let t0 = std::time::Instant::now();
    while !tb.links_up() {
        // A guard against hanging, not a speed bound: memif connects in ms.
        assert!(t0.elapsed().as_secs() < 120, "memif peers never connected");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // memif offers several queues (no RSS): both are set up and polled.
    let port = |i| tb.port(i).expect("run-to-completion");
    assert_eq!(port(0).driver, "net_memif");
    assert_eq!((port(0).queues, port(1).queues), (2, 2));
    let (sizes, frames) = loopback_util::exchange(&mut tb, &dir.path().join("tap.pcap"));
    drop(tb);
    drop(eal);
    println!(
        "loopback_memif: WRITE and READ of {sizes} sizes (0 B .. 1 MiB) verified over 2 queues per port, {frames} tapped frames all icrc=ok, no mbuf leaked"
    );
}
