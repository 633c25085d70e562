//! A dataplane lcore that sleeps (`[service] poll = "event"`) is woken by
//! whatever gives it work: an application's post racing its decision to
//! sleep (the handshake in the segment's wake line), and its own timers.
//! A lost wake-up shows as a completion that never comes.

mod daemon_util;

use std::path::Path;
use std::time::Duration;

use dataplane::service::sleep::LcoreCounters;
use testkit::OutputWithin;
use verbs::{poll_one, Cq, Device, LocalBuf, MrAccess, Pd, PreparedQp, WcStatus};

const ALL: MrAccess = MrAccess {
    local_write: true,
    remote_write: true,
    remote_read: true,
    remote_atomic: false,
};

/// The hang guard of one completion (not a speed bound: a lost wake-up
/// never completes).
const HANG: Duration = Duration::from_secs(60);

fn lcores(dev: &Device) -> Vec<LcoreCounters> {
    let json = dev.stats().unwrap();
    serde_json::from_str::<dataplane::stats::Snapshot>(&json)
        .unwrap()
        .lcores
}

struct Side {
    dev: Device,
    pd: Pd,
    cq: Cq,
}

fn side(socket: &Path, name: &str) -> Side {
    let dev = Device::open(socket, name).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    Side { dev, pd, cq }
}

fn qp(s: &Side, timeout: (u8, u8)) -> PreparedQp {
    s.pd.qp_builder(&s.cq)
        .timeout(timeout.0, timeout.1)
        .build()
        .unwrap()
}

/// A QP of rnic0 connected to one of rnic1, with rnic0's buffer and
/// rnic1's region to WRITE into.
struct Pair {
    a: Side,
    _b: Side,
    mra: verbs::Mr,
    _mrb: verbs::Mr,
    qa: verbs::Qp,
    qb: verbs::Qp,
    remote: verbs::RemoteMr,
}

/// [`Pair`] with the local ACK timeout and retry count `timeout`.
fn pair(socket: &Path, timeout: (u8, u8)) -> Pair {
    let (a, b) = (side(socket, "rnic0"), side(socket, "rnic1"));
    let (mra, mrb) = (
        a.pd.alloc_mr(4096, ALL).unwrap(),
        b.pd.alloc_mr(4096, ALL).unwrap(),
    );
    let (pa, pb) = (qp(&a, timeout), qp(&b, timeout));
    let (ea, eb) = (pa.endpoint(), pb.endpoint());
    let qa = pa.connect(&eb).unwrap();
    let qb = pb.connect(&ea).unwrap();
    let remote = mrb.remote();
    Pair {
        a,
        _b: b,
        mra,
        _mrb: mrb,
        qa,
        qb,
        remote,
    }
}

/// Spins `n` rounds: a gap of a varying length between two posts, so
/// that they land everywhere in the lcore's path from its last pass to
/// its sleep.
fn gap(n: u32) {
    for i in 0..n {
        std::hint::black_box(i);
    }
}

#[test]
fn a_post_racing_the_lcores_sleep_always_wakes_it() {
    let d = daemon_util::start_daemon_with("sleep-race", "", "poll = \"event\"");
    let Pair {
        a,
        _b,
        mra,
        _mrb,
        qa,
        qb: _qb,
        remote,
    } = pair(&d.socket, (14, 7));
    const ROUNDS: u32 = 20_000;
    for i in 0..ROUNDS {
        qa.post_write(LocalBuf::of(&mra, 0, 64), &remote, 0, u64::from(i), true)
            .unwrap();
        let c = poll_one(&a.cq, HANG)
            .unwrap()
            .unwrap_or_else(|| panic!("WRITE {i}: no completion (a lost wake-up)"));
        assert_eq!(c.status, WcStatus::Success, "WRITE {i}");
        gap((i * 7919) % 20_000);
    }
    let l = &lcores(&a.dev)[0];
    println!("{l:?}");
    assert_eq!(l.poll, "event");
    assert!(l.sleeps > 0, "the lcore slept");
    assert!(l.woken_bell > 0, "posts woke it");
    assert!(
        l.sleeps_aborted > 0,
        "some posts came between its decision to sleep and its sleep"
    );
}

#[test]
fn a_sleeping_lcore_wakes_for_its_retransmission_timer() {
    let d = daemon_util::start_daemon_with("sleep-timer", "", "poll = \"event\"");
    // Local ACK timeout 4.096 us x 2^8 (about 1 ms), one retry.
    let Pair {
        a,
        _b,
        mra,
        _mrb,
        qa,
        qb,
        remote,
    } = pair(&d.socket, (8, 1));
    // The responder is gone: only the requester's timer can end the WR.
    drop(qb);
    let before = lcores(&a.dev)[0].woken_timer;
    qa.post_write(LocalBuf::of(&mra, 0, 64), &remote, 0, 7, true)
        .unwrap();
    let c = poll_one(&a.cq, HANG)
        .unwrap()
        .expect("the retry-exceeded completion");
    assert_eq!(c.status, WcStatus::RetryExcErr);
    let l = &lcores(&a.dev)[0];
    println!("{l:?}");
    assert!(
        l.woken_timer > before,
        "the retransmission timer woke the lcore: {l:?}"
    );
}

#[test]
fn a_sleeping_lcore_wakes_for_a_frame_on_a_tap_port_without_napping() {
    if !nix::unistd::geteuid().is_root() || !Path::new("/dev/net/tun").exists() {
        println!("skipped: a tap device needs root and /dev/net/tun");
        return;
    }
    let iface = format!("rnictap{}", std::process::id() % 100_000);
    let d = daemon_util::start_daemon_with(
        "sleep-tap",
        &format!(", \"--vdev=net_tap0,iface={iface}\""),
        "poll = \"event\"\n[[service.devices]]\nname = \"tap0\"\nport = 0\nip = \"10.99.0.2\"",
    );
    let ip = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output_within(testkit::LIMIT);
        assert!(out.status.success(), "ip {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ip(&["addr", "add", "10.99.0.1/24", "dev", &iface]);
    ip(&["link", "set", &iface, "up"]);
    let dev = Device::open(&d.socket, "tap0").unwrap();
    let before = lcores(&dev)[0].clone();
    // A datagram to the device's address over the tap: the kernel first
    // asks ARP for it, and the sleeping lcore must wake for the request
    // and answer it. (The datagrams, not RoCE, are dropped and counted.)
    let udp = std::net::UdpSocket::bind("10.99.0.1:0").unwrap();
    for _ in 0..5 {
        let _ = udp.send_to(b"wake up", "10.99.0.2:4791");
        std::thread::sleep(Duration::from_millis(200));
    }
    let neigh = ip(&["neigh", "show", "10.99.0.2", "dev", &iface]);
    let l = &lcores(&dev)[0];
    println!("{neigh}\n{l:?}");
    assert!(neigh.contains("lladdr"), "the device answered ARP: {neigh}");
    assert!(
        l.woken_rx > before.woken_rx,
        "an RX interrupt woke it: {l:?}"
    );
    assert_eq!(l.woken_nap, 0, "a port with RX interrupts needs no nap");
}

#[test]
fn an_lcore_asleep_is_nudged_by_the_lcore_that_sends_it_frames() {
    // rnic0 on lcore 0, rnic1 on lcore 1, the ring pair between them:
    // lcore 1 receives only what lcore 0 sends, and sleeps between.
    let d = daemon_util::start_daemon_with("sleep-nudge", "", "poll = \"event\"\nlcores = 2");
    let Pair {
        a,
        _b,
        mra,
        _mrb,
        qa,
        qb: _qb,
        remote,
    } = pair(&d.socket, (14, 7));
    let before = lcores(&a.dev);
    const ROUNDS: u64 = 2_000;
    for i in 0..ROUNDS {
        qa.post_write(LocalBuf::of(&mra, 0, 64), &remote, 0, i, true)
            .unwrap();
        let c = poll_one(&a.cq, HANG)
            .unwrap()
            .unwrap_or_else(|| panic!("WRITE {i}: no completion"));
        assert_eq!(c.status, WcStatus::Success, "WRITE {i}");
    }
    let after = lcores(&a.dev);
    println!("{after:?}");
    assert_eq!(after.len(), 2, "two lcores");
    let l1 = &after[1];
    assert!(
        l1.woken_nudge > before[1].woken_nudge,
        "lcore 0 nudged lcore 1 for its frames: {l1:?}"
    );
    // A lost nudge leaves the WRITE's frames until the sleep's limit
    // (100 ms): one such wake-up per WRITE, not a few in the whole run.
    assert!(
        l1.woken_limit - before[1].woken_limit < ROUNDS / 20,
        "lcore 1 found frames only at its sleep's limit: {l1:?}"
    );
}
