//! The baselines `--compare` measures in the same run as ours.
//!
//! - [`Dpdk`]: the floor. Two ports of the daemon's backend (a net_ring
//!   pair, or a memif server/client pair) in this process's own EAL, one
//!   lcore driving both — the layout of the loopback testbed. The echo
//!   sends the frames one message of our size takes, the other port
//!   bounces them back; forwarding streams the frames of our messages
//!   (MTU-sized, or one frame of a small message) one way.
//! - [`ByteFloor`]: the per-byte work a copying NIC cannot avoid (a copy
//!   and an ICRC on each side of every frame), in a loop on this core.
//! - [`IcrcFloor`]: the ICRC work one round trip of a latency test
//!   cannot avoid (each frame's ICRC computed by its sender and checked
//!   by its receiver), in a loop on this core.
//! - [`Udp`]: what users have without RDMA: two kernel UDP sockets on
//!   127.0.0.1, busy-polled (non-blocking) from one thread; ping-pong for
//!   latency, a stream for bandwidth.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use std::sync::Arc;

use dataplane::dpdk::port::BURST;
use dataplane::dpdk::{ring_pair, Eal, Mbuf, Mempool, Port};
use nic::FramePort;

/// Bytes of headers around a WRITE's payload on the wire (Ethernet, IPv4,
/// UDP, BTH, RETH, ICRC).
pub const HEADERS: usize = 14 + 20 + 8 + 12 + 16 + 4;

/// Frame lengths one message of `size` bytes takes at `mtu`.
pub fn frames_of(size: u32, mtu: u32) -> Vec<usize> {
    let mut v = Vec::new();
    let mut left = size;
    loop {
        let p = left.min(mtu);
        v.push(HEADERS + p as usize);
        left -= p;
        if left == 0 {
            return v;
        }
    }
}

/// The frames of one message's echo.
pub struct Echo {
    lens: Vec<usize>,
    there: Vec<Mbuf>,
    back: Vec<Mbuf>,
}

impl Echo {
    /// The frames one message of `size` bytes takes at `mtu`.
    pub fn new(size: u32, mtu: u32) -> Echo {
        let lens = frames_of(size, mtu);
        Echo {
            there: Vec::with_capacity(lens.len()),
            back: Vec::with_capacity(lens.len()),
            lens,
        }
    }
}

/// Raw DPDK over the daemon's backend.
pub struct Dpdk {
    // Drop order: ports, then the pool, then the EAL.
    a: Port,
    b: Port,
    pool: Arc<Mempool>,
    _eal: Eal,
}

use super::patience::{Patience, Samples, GIVE_UP};

impl Dpdk {
    pub fn start(backend: &str) -> Result<Dpdk, String> {
        let pid = std::process::id();
        let mut args: Vec<String> = [
            "--no-huge",
            "--no-pci",
            "--no-telemetry",
            "-m",
            "256",
            "--log-level=lib.eal:warning",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // The EAL moves this thread (its main lcore) to the CPUs it is
        // given: keep the set the thread has (one CPU when --pin placed
        // it, all of them otherwise), not CPU 0 where a daemon may run.
        let cpus: Vec<String> = core_affinity::get_core_ids()
            .unwrap_or_default()
            .iter()
            .map(|c| c.id.to_string())
            .collect();
        if !cpus.is_empty() {
            args.push(format!("--lcores=0@({})", cpus.join(",")));
        }
        args.push(format!("--file-prefix=bench-{pid}"));
        let memif = match backend {
            "net_ring" => false,
            "net_memif" => true,
            other => {
                return Err(format!(
                    "--compare runs the raw baseline on net_ring or net_memif, not {other:?}"
                ))
            }
        };
        if memif {
            let sock = format!("/tmp/bench-memif-{pid}.sock");
            args.push(format!("--vdev=net_memif0,role=server,id=0,socket={sock}"));
            args.push(format!("--vdev=net_memif1,role=client,id=0,socket={sock}"));
        }
        let eal = Eal::init(&args).map_err(|e| e.to_string())?;
        // Mbufs that hold a frame of the largest path MTU in one segment.
        let pool = Arc::new(
            Mempool::with_frames(&eal, "bench_pool", 8191, 0, HEADERS + 4096)
                .map_err(|e| e.to_string())?,
        );
        let (pa, pb) = if memif {
            (0, 1)
        } else {
            ring_pair(&eal, "bench", 1024).map_err(|e| e.to_string())?
        };
        let a = Port::start(&eal, pa, &pool, 1024).map_err(|e| e.to_string())?;
        let b = Port::start(&eal, pb, &pool, 1024).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        while !(a.link_up() && b.link_up()) {
            if t0.elapsed() > GIVE_UP {
                return Err("the baseline's ports did not come up".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Dpdk {
            a,
            b,
            pool,
            _eal: eal,
        })
    }

    fn fill(&self, lens: &[usize], out: &mut Vec<Mbuf>) -> Result<(), String> {
        for &len in lens {
            let mut m = self.pool.alloc().ok_or("the baseline's pool is empty")?;
            let d = m.append(len).ok_or("frame longer than an mbuf")?;
            d.fill(0);
            d[12] = 0x08; // EtherType IPv4
            out.push(m);
        }
        Ok(())
    }

    /// Sends everything in `frames` on `tx` and receives as many on `rx`.
    fn hop(
        tx: &mut Port,
        rx: &mut Port,
        frames: &mut Vec<Mbuf>,
        got: &mut Vec<Mbuf>,
    ) -> Result<(), String> {
        let want = frames.len();
        got.clear();
        let mut p = Patience::new();
        while got.len() < want {
            if !frames.is_empty() {
                tx.tx_burst(0, frames);
            }
            rx.rx_burst(0, got, BURST);
            if !p.go_on() {
                return Err("the baseline lost frames".into());
            }
        }
        Ok(())
    }

    /// The frames of one echo of a `size`-byte message, allocated (outside
    /// any timed interval).
    pub fn echo_prepare(&self, e: &mut Echo) -> Result<(), String> {
        e.there.clear(); // frees the last echo's mbufs
        self.fill(&e.lens, &mut e.there)
    }

    /// One echo of the prepared frames: there, and back.
    pub fn echo_once(&mut self, e: &mut Echo) -> Result<(), String> {
        Self::hop(&mut self.a, &mut self.b, &mut e.there, &mut e.back)?;
        Self::hop(&mut self.b, &mut self.a, &mut e.back, &mut e.there)
    }

    /// Median round trip (ns) of echoing the frames of one `size`-byte
    /// message, `iters` times.
    pub fn echo_rtt_ns(&mut self, size: u32, mtu: u32, iters: u64) -> Result<f64, String> {
        let mut e = Echo::new(size, mtu);
        let mut rtts = Samples::with_capacity(iters);
        for _ in 0..iters {
            self.echo_prepare(&mut e)?;
            rtts.time(|| self.echo_once(&mut e))?;
        }
        e.there.clear();
        Ok(rtts.median())
    }

    /// One-way forwarding of `frames` frames of `payload` bytes each (a
    /// message's packets, headers around them); returns (b/s of payload,
    /// frames/s).
    pub fn forward(&mut self, payload: u32, frames: u64) -> Result<(f64, f64), String> {
        let len = HEADERS + payload as usize;
        let frames = frames.max(1);
        let (mut sent, mut recvd) = (0u64, 0u64);
        let mut out = Vec::with_capacity(32);
        let mut got = Vec::with_capacity(32);
        let t0 = Instant::now();
        let mut p = Patience::new();
        while recvd < frames {
            if out.is_empty() && sent < frames {
                let k = (frames - sent).min(32) as usize;
                self.fill(&vec![len; k], &mut out)?;
                sent += k as u64;
            }
            if !out.is_empty() {
                self.a.tx_burst(0, &mut out);
            }
            got.clear();
            recvd += self.b.rx_burst(0, &mut got, BURST) as u64;
            if !p.go_on() {
                return Err("the baseline lost frames".into());
            }
        }
        got.clear();
        let secs = t0.elapsed().as_secs_f64();
        Ok((
            (frames * u64::from(payload) * 8) as f64 / secs,
            frames as f64 / secs,
        ))
    }
}

/// The per-byte floor of a software NIC with both ends on one core: per
/// MTU-sized frame, what it cannot avoid on send and on receive, with
/// transport's own ICRC. A packet whose payload the device copies into
/// its frame (below its zero-copy size, or on a device that copies every
/// payload) costs a copy from the application's buffer into the frame and
/// an ICRC over the frame to send, an ICRC check and a copy into the
/// destination to receive. A packet sent from where its payload lies
/// (the device's `zero_copy_tx_min` and up, as ours does) costs no send
/// copy: the ICRC over its headers and the payload in the application's
/// buffer, the check over the same pieces, and the one copy into the
/// destination. No headers are built or parsed, no ring is crossed: the
/// loop is the bytes' cost alone.
pub struct ByteFloor {
    /// The source message, then (at `dst_at`) the destination: one
    /// allocation, the two 2 KiB off each other's page offsets. A copy
    /// between buffers whose distance is a few bytes past a multiple of
    /// 4 KiB runs ten times slower on this machine (4K aliasing: 2.15 us
    /// against 0.18 us for 4 KiB with 16 bytes of distance), which would
    /// make the floor a measure of its own placement.
    mem: Vec<u8>,
    size: usize,
    dst_at: usize,
    frame: Vec<u8>,
    /// The least payload sent without a copy (none: every one is copied).
    zero_copy_min: Option<usize>,
}

/// Where the payload starts in the floor's frame (the WRITE's headers).
const FLOOR_PAYLOAD_AT: usize = HEADERS - transport::wire::icrc::ICRC_LEN;

impl ByteFloor {
    /// Buffers for messages of `size` bytes in frames of `mtu` payload,
    /// packets of `zero_copy_min` bytes and more sent without a copy.
    pub fn new(size: u32, mtu: u32, zero_copy_min: Option<u32>) -> ByteFloor {
        let mut frame = vec![0u8; HEADERS + mtu as usize];
        frame[12] = 0x08; // EtherType IPv4
        frame[14] = 0x45; // IPv4, 20-byte header
        let size = size as usize;
        let dst_at = size.next_multiple_of(4096) + 2048;
        let mut mem = vec![0u8; dst_at + size];
        for (i, b) in mem[..size].iter_mut().enumerate() {
            *b = i as u8;
        }
        ByteFloor {
            mem,
            size,
            dst_at,
            frame,
            zero_copy_min: zero_copy_min.map(|m| m as usize),
        }
    }

    /// Sends and receives messages of the buffers' size in frames of
    /// `mtu` payload until `bytes` of payload went through; b/s of
    /// payload.
    pub fn bps(&mut self, mtu: u32, bytes: u64) -> Result<f64, String> {
        use transport::wire::icrc;
        let size = self.size;
        let mtu = (mtu as usize).min(self.frame.len() - HEADERS);
        let (mut done, mut bad) = (0u64, 0u64);
        let (src, dst) = self.mem.split_at_mut(self.dst_at);
        let (src, dst) = (&src[..size], &mut dst[..size]);
        let t0 = Instant::now();
        while done < bytes.max(1) {
            let mut off = 0;
            loop {
                let p = (size - off).min(mtu);
                let end = FLOOR_PAYLOAD_AT + p;
                if self.zero_copy_min.is_some_and(|m| p >= m) {
                    // Sent from where it lies: the ICRC over the headers
                    // and the payload in place, checked over the same
                    // pieces; one copy, into the destination.
                    let payload = &src[off..off + p];
                    let pad = &[0u8; 3][..(4 - p % 4) % 4];
                    let head = &self.frame[14..FLOOR_PAYLOAD_AT];
                    let crc =
                        icrc::compute_split(head, 0, payload, pad).map_err(|e| e.to_string())?;
                    let got = icrc::compute_split(head, 0, std::hint::black_box(payload), pad)
                        .map_err(|e| e.to_string())?;
                    bad += u64::from(got != crc);
                    dst[off..off + p].copy_from_slice(payload);
                } else {
                    // Send: the payload into the frame, the ICRC after it.
                    self.frame[FLOOR_PAYLOAD_AT..end].copy_from_slice(&src[off..off + p]);
                    let crc = icrc::compute_in_frame(&self.frame, 14, end, 0)
                        .map_err(|e| e.to_string())?;
                    self.frame[end..end + 4].copy_from_slice(&crc.to_le_bytes());
                    // Receive: the ICRC checked, the payload out of the frame.
                    let got = icrc::compute_in_frame(std::hint::black_box(&self.frame), 14, end, 0)
                        .map_err(|e| e.to_string())?;
                    bad += u64::from(got.to_le_bytes() != self.frame[end..end + 4]);
                    dst[off..off + p].copy_from_slice(&self.frame[FLOOR_PAYLOAD_AT..end]);
                }
                off += p;
                if off >= size {
                    break;
                }
            }
            std::hint::black_box(&dst);
            done += size.max(1) as u64;
        }
        if bad > 0 || dst != src {
            return Err("the byte floor corrupted its own frames".into());
        }
        Ok(done as f64 * 8.0 / t0.elapsed().as_secs_f64())
    }

    #[cfg(test)]
    fn src(&self) -> &[u8] {
        &self.mem[..self.size]
    }

    #[cfg(test)]
    fn dst(&self) -> &[u8] {
        &self.mem[self.dst_at..self.dst_at + self.size]
    }
}

/// The ICRC work on the path of one latency round trip: every frame of
/// the round trip's messages has its ICRC computed by its sender and
/// checked by its receiver, which no RoCE NIC may skip (rxe drops a frame
/// whose ICRC is wrong). ACKs are left out (off a round trip's path), as
/// is everything else a frame needs: with the cross-core floor and the
/// DPDK echo it bounds from below what any dataplane on another core
/// than the application can reach here.
pub struct IcrcFloor {
    /// An Ethernet frame whose IPv4 packet is hashed where it lies, as
    /// our NIC does ([`transport::wire::icrc::compute_in_frame`]).
    frame: Vec<u8>,
    /// Bytes each ICRC of one round trip covers (the IPv4 packet up to
    /// the ICRC), each computed once by the sender and once by the
    /// receiver.
    covered: Vec<usize>,
}

/// IPv4 + UDP + BTH: the bytes every RoCEv2 packet's ICRC covers.
const IP_TO_BTH_END: usize = {
    use transport::wire::{bth, ipv4, udp};
    ipv4::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN
};
const RETH: usize = transport::wire::reth::HEADER_LEN;
/// An untagged Ethernet header, before the IPv4 packet.
const ETH: usize = transport::wire::ethernet::HEADER_LEN;
const AETH: usize = transport::wire::aeth::HEADER_LEN;

impl IcrcFloor {
    /// The round trip of `test` with messages of `size` bytes at `mtu`:
    /// two WRITEs (one each way; the first packet carries a RETH) for a
    /// WRITE ping-pong, a READ request and its response packets (AETH on
    /// the first and last) for a READ.
    pub fn new(read: bool, size: u32, mtu: u32) -> IcrcFloor {
        let mtu = mtu.max(1) as usize;
        let size = size as usize;
        let packets = size.div_ceil(mtu).max(1);
        let mut covered = Vec::new();
        for k in 0..packets {
            // The payload with its pad.
            let p = (size - k * mtu).min(mtu).next_multiple_of(4);
            let (first, last) = (k == 0, k + 1 == packets);
            if read {
                let aeth = if first || last { AETH } else { 0 };
                covered.push(IP_TO_BTH_END + aeth + p);
            } else {
                let reth = if first { RETH } else { 0 };
                // One message each way.
                covered.extend([IP_TO_BTH_END + reth + p; 2]);
            }
        }
        if read {
            covered.push(IP_TO_BTH_END + RETH);
        }
        let mut frame = vec![0u8; ETH + covered.iter().copied().max().unwrap_or(0)];
        frame[12] = 0x08; // EtherType IPv4
        frame[ETH] = 0x45; // IPv4, 20-byte header
        IcrcFloor { frame, covered }
    }

    /// The ICRC work of one round trip.
    pub fn round(&self) -> Result<(), String> {
        use transport::wire::icrc;
        let mut acc = 0u32;
        for &n in &self.covered {
            // Computed by the sender, checked by the receiver.
            for _ in 0..2 {
                let f = std::hint::black_box(&self.frame);
                acc ^= icrc::compute_in_frame(f, ETH, ETH + n, 0).map_err(|e| e.to_string())?;
            }
        }
        std::hint::black_box(acc);
        Ok(())
    }

    /// Median ns of the ICRC work of one round trip, over `iters` round
    /// trips each timed as ours is (two clock reads).
    pub fn round_trip_ns(&mut self, iters: u64) -> Result<f64, String> {
        let mut v = Samples::with_capacity(iters);
        for _ in 0..iters.max(1) {
            v.time(|| self.round())?;
        }
        Ok(v.median())
    }
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Kernel UDP over loopback, busy-polled.
pub struct Udp {
    a: UdpSocket,
    b: UdpSocket,
    buf: Vec<u8>,
}

/// Largest datagram the baseline sends (bigger messages are split).
const DATAGRAM: usize = 65_000;

impl Udp {
    pub fn new() -> Result<Udp, String> {
        let e = |e: std::io::Error| format!("UDP baseline: {e}");
        let a = UdpSocket::bind("127.0.0.1:0").map_err(e)?;
        let b = UdpSocket::bind("127.0.0.1:0").map_err(e)?;
        a.connect(b.local_addr().map_err(e)?).map_err(e)?;
        b.connect(a.local_addr().map_err(e)?).map_err(e)?;
        a.set_nonblocking(true).map_err(e)?;
        b.set_nonblocking(true).map_err(e)?;
        Ok(Udp {
            a,
            b,
            buf: vec![0u8; DATAGRAM],
        })
    }

    fn chunks(size: u32) -> Vec<usize> {
        let mut v = Vec::new();
        let mut left = size as usize;
        loop {
            let c = left.min(DATAGRAM);
            v.push(c);
            left -= c;
            if left == 0 {
                return v;
            }
        }
    }

    /// Sends `chunks` from `tx` and spins until `rx` got them all.
    fn hop(tx: &UdpSocket, rx: &UdpSocket, chunks: &[usize], buf: &mut [u8]) -> Result<(), String> {
        let mut p = Patience::new();
        for &c in chunks {
            loop {
                match tx.send(&buf[..c]) {
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(format!("UDP send: {e}")),
                }
            }
        }
        let mut got = 0;
        while got < chunks.len() {
            match rx.recv(buf) {
                Ok(_) => got += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if !p.go_on() {
                        return Err("UDP datagrams lost on loopback".into());
                    }
                }
                Err(e) => return Err(format!("UDP recv: {e}")),
            }
        }
        Ok(())
    }

    /// Median round trip (ns) of a `size`-byte ping-pong.
    pub fn ping_pong_rtt_ns(&mut self, size: u32, iters: u64) -> Result<f64, String> {
        let chunks = Self::chunks(size);
        let mut rtts = Samples::with_capacity(iters);
        for _ in 0..iters {
            rtts.time(|| {
                Self::hop(&self.a, &self.b, &chunks, &mut self.buf)?;
                Self::hop(&self.b, &self.a, &chunks, &mut self.buf)
            })?;
        }
        Ok(rtts.median())
    }

    /// A one-way stream of `size`-byte messages until `bytes` arrived;
    /// b/s of payload received (the kernel may drop datagrams when the
    /// receiver falls behind; those do not count).
    pub fn stream_bps(&mut self, size: u32, bytes: u64) -> Result<f64, String> {
        let chunk = (size as usize).clamp(1, DATAGRAM);
        let mut recvd = 0u64;
        let t0 = Instant::now();
        while recvd < bytes {
            for _ in 0..8 {
                // A full socket buffer (WouldBlock) just skips a send.
                let _ = self.a.send(&self.buf[..chunk]);
            }
            while let Ok(n) = self.b.recv(&mut self.buf) {
                recvd += n as u64;
            }
            if t0.elapsed() > GIVE_UP * 4 {
                return Err("the UDP stream stalled".into());
            }
        }
        Ok(recvd as f64 * 8.0 / t0.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_takes_mtu_frames_plus_headers() {
        assert_eq!(frames_of(0, 1024), vec![HEADERS]);
        assert_eq!(frames_of(64, 1024), vec![HEADERS + 64]);
        assert_eq!(
            frames_of(2049, 1024),
            vec![HEADERS + 1024, HEADERS + 1024, HEADERS + 1]
        );
    }

    #[test]
    fn the_byte_floor_moves_every_byte() {
        for (size, mtu) in [(1, 1024), (64, 1024), (4097, 4096), (65536, 1024)] {
            for zero_copy in [None, Some(1024)] {
                let mut f = ByteFloor::new(size, mtu, zero_copy);
                assert!(f.bps(mtu, 1 << 16).unwrap() > 0.0);
                assert_eq!(f.dst(), f.src(), "size {size} mtu {mtu}");
            }
        }
    }

    #[test]
    fn the_byte_floor_copies_into_the_frame_only_what_the_device_copies() {
        // 1024 B from where they lie, the last 476 B copied into the frame.
        let mut f = ByteFloor::new(1500, 1024, Some(1024));
        f.bps(1024, 1500).unwrap();
        let copied = &f.frame[FLOOR_PAYLOAD_AT..FLOOR_PAYLOAD_AT + 476];
        assert_eq!(copied, &f.src()[1024..]);
        // Every packet from where it lies: the frame's payload untouched.
        let mut f = ByteFloor::new(65536, 1024, Some(1024));
        f.bps(1024, 65536).unwrap();
        assert!(f.frame[FLOOR_PAYLOAD_AT..].iter().all(|&b| b == 0));
        assert_eq!(f.dst(), f.src());
        // A device that copies every payload: the frame holds the last.
        let mut f = ByteFloor::new(65536, 1024, None);
        f.bps(1024, 65536).unwrap();
        assert_eq!(
            &f.frame[FLOOR_PAYLOAD_AT..FLOOR_PAYLOAD_AT + 1024],
            &f.src()[64512..]
        );
        // The two buffers 2 KiB off each other's page offsets.
        let apart = f.dst().as_ptr() as usize - f.src().as_ptr() as usize;
        assert_eq!(apart % 4096, 2048);
    }

    #[test]
    fn the_icrc_floor_covers_each_packet_of_the_round_trip() {
        // A WRITE ping-pong: one 64 B WRITE each way, IPv4 + UDP + BTH +
        // RETH + payload.
        assert_eq!(IcrcFloor::new(false, 64, 1024).covered, vec![120, 120]);
        // Padded to four bytes; only the first packet has a RETH.
        assert_eq!(
            IcrcFloor::new(false, 1025, 1024).covered,
            vec![1080, 1080, 44, 44]
        );
        // A READ: the response packets (AETH on the first and last),
        // then the request (RETH, no payload).
        assert_eq!(IcrcFloor::new(true, 64, 1024).covered, vec![108, 56]);
        assert_eq!(
            IcrcFloor::new(true, 2049, 1024).covered,
            vec![1068, 1064, 48, 56]
        );
        let mut f = IcrcFloor::new(true, 2049, 1024);
        assert_eq!(f.frame.len(), ETH + 1068);
        assert!(f.round_trip_ns(10).unwrap() > 0.0);
    }

    #[test]
    fn udp_baseline_moves_bytes() {
        let mut u = Udp::new().unwrap();
        assert!(u.ping_pong_rtt_ns(64, 10).unwrap() > 0.0);
        assert!(u.ping_pong_rtt_ns(100_000, 2).unwrap() > 0.0);
        assert!(u.stream_bps(4096, 1 << 20).unwrap() > 0.0);
    }
}
