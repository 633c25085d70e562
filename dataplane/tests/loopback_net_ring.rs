//! The loopback testbed over net_ring, without hugepages: WRITE and READ of
//! sizes 0 B .. 1 MiB between the two hosts, every byte verified, every
//! tapped frame a valid RoCEv2 frame with a good ICRC, no mbuf leaked.
//! One EAL per process, so this test has its own main (harness = false).

mod loopback_util;

use dataplane::dpdk::Eal;
use dataplane::testbed::{Loopback, LoopbackConfig};

fn main() {
    let args: Vec<String> = [
        "--no-huge",
        "--no-pci",
        "--no-telemetry",
        "-m",
        "256",
        &format!("--file-prefix=loopback-ring-{}", std::process::id()),
        "--log-level=lib.eal:warning",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let eal = Eal::init(&args).expect("EAL");
    let cfg = LoopbackConfig {
        tap: true,
        ..LoopbackConfig::default()
    };
    let mut tb = Loopback::new(&eal, &cfg).expect("testbed");
    let (sizes, frames) = loopback_util::exchange(&mut tb, cfg.mem_bytes);
    drop(tb);
    drop(eal);
    println!(
        "loopback_net_ring: WRITE and READ of {sizes} sizes (0 B .. 1 MiB) verified, {frames} tapped frames all icrc=ok, no mbuf leaked"
    );
}
