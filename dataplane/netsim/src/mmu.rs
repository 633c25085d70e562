//! The shared buffer of a lossless switch and the decisions of priority
//! flow control (IEEE 802.1Qbb): how many bytes each ingress port holds,
//! when a port's upstream must be paused and when it may resume.
//!
//! The rules are those of the HPCC authors' ns-3 switch (`SwitchMmu`), so
//! that the paper's scenarios run on the same buffer:
//!
//! - each ingress port has a small reserve (4 KB) of its own;
//! - above it, bytes come out of the buffer shared by all ports, up to a
//!   dynamic threshold, (B - all headroom - all reserves - shared bytes in
//!   use) >> shift: the emptier the buffer, the more one port may take;
//! - past the threshold, bytes go to the port's headroom, which absorbs
//!   what is already on the wire when the PAUSE goes out (3 x the link's
//!   bandwidth-delay product);
//! - a port is paused when it has bytes in headroom or its shared bytes
//!   reach the threshold, and resumed when its headroom is empty and its
//!   shared bytes are 3 KB (the resume offset) under the threshold;
//! - a frame is dropped only when its headroom is full too (never, when
//!   the headroom covers the link's round trip).

/// The shared buffer and the PFC rules of a switch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PfcConfig {
    /// The switch's whole packet buffer, bytes.
    pub buffer_bytes: u64,
    /// Bytes each ingress port may hold before it uses the shared pool.
    pub reserve_bytes: u64,
    /// A paused port resumes when its shared bytes are this far under
    /// the threshold.
    pub resume_offset_bytes: u64,
    /// The lossless priority (its frames are admitted by these rules and
    /// paused by PFC); frames of other priorities are held to the port's
    /// drop-tail limit.
    pub priority: u8,
    /// Pause time each PAUSE asks for, in quanta of 512 bit times; the
    /// switch sends PAUSE again before it runs out while the port still
    /// has to be held.
    pub pause_quanta: u16,
}

impl PfcConfig {
    /// ns-3's constants (4 KB reserve, 3 KB resume offset), priority 3,
    /// the longest pause per frame.
    pub fn new(buffer_bytes: u64) -> Self {
        PfcConfig {
            buffer_bytes,
            reserve_bytes: 4 * 1024,
            resume_offset_bytes: 3 * 1024,
            priority: 3,
            pause_quanta: transport::wire::pfc::MAX_QUANTA,
        }
    }
}

/// What one ingress port may hold beyond its reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngressLimits {
    /// Bytes that may still arrive after a PAUSE has gone out.
    pub headroom_bytes: u64,
    /// The port's share of the free buffer is 1 / 2^shift of it.
    pub shift: u32,
}

impl IngressLimits {
    /// As the HPCC authors configure a port: headroom of 3 x the link's
    /// bandwidth-delay product (its one-way delay), and a share of 1/8 of
    /// the free buffer for a port at the hosts' rate, doubled for each
    /// doubling of speed above it (1/2 at 4x).
    pub fn for_link(rate_bps: u64, delay_ns: u64, host_rate_bps: u64) -> Self {
        let headroom_bytes =
            (u128::from(rate_bps) * u128::from(delay_ns) / 8 / 1_000_000_000 * 3) as u64;
        let (mut shift, mut rate) = (3u32, rate_bps);
        while rate > host_rate_bps && shift > 0 {
            shift -= 1;
            rate /= 2;
        }
        IngressLimits {
            headroom_bytes,
            shift,
        }
    }
}

/// The buffer's accounting, per ingress port.
#[derive(Debug, Clone)]
pub struct Mmu {
    cfg: PfcConfig,
    limits: Vec<IngressLimits>,
    /// Bytes held in the reserve and the shared pool, per ingress port.
    ingress: Vec<u64>,
    /// Bytes held in headroom, per ingress port.
    headroom: Vec<u64>,
    shared_used: u64,
    /// Headroom and reserves of all ports: what the shared pool is not.
    set_aside: u64,
    paused: Vec<bool>,
}

impl Mmu {
    pub fn new(cfg: PfcConfig, limits: &[IngressLimits]) -> Self {
        let n = limits.len();
        let set_aside =
            limits.iter().map(|l| l.headroom_bytes).sum::<u64>() + cfg.reserve_bytes * n as u64;
        Mmu {
            cfg,
            limits: limits.to_vec(),
            ingress: vec![0; n],
            headroom: vec![0; n],
            shared_used: 0,
            set_aside,
            paused: vec![false; n],
        }
    }

    pub fn config(&self) -> &PfcConfig {
        &self.cfg
    }

    /// Headroom and reserves of all ports: the buffer outside the pool.
    pub fn set_aside(&self) -> u64 {
        self.set_aside
    }

    /// How many shared bytes ingress `port` may use now.
    pub fn threshold(&self, port: usize) -> u64 {
        let free = self
            .cfg
            .buffer_bytes
            .saturating_sub(self.set_aside)
            .saturating_sub(self.shared_used);
        free >> self.limits[port].shift.min(63)
    }

    /// Shared bytes ingress `port` holds (what is over its reserve).
    pub fn shared_of(&self, port: usize) -> u64 {
        self.ingress[port].saturating_sub(self.cfg.reserve_bytes)
    }

    /// Bytes ingress `port` holds in all (reserve, shared, headroom).
    pub fn held(&self, port: usize) -> u64 {
        self.ingress[port] + self.headroom[port]
    }

    /// Bytes of the shared pool in use.
    pub fn shared_used(&self) -> u64 {
        self.shared_used
    }

    /// Takes `len` bytes arriving on ingress `port` into the buffer:
    /// reserve first, then the shared pool up to the threshold, then
    /// headroom. False (nothing taken) when the headroom is full too.
    pub fn admit(&mut self, port: usize, len: u64) -> bool {
        let thresh = self.threshold(port);
        if len + self.headroom[port] > self.limits[port].headroom_bytes
            && len + self.shared_of(port) > thresh
        {
            return false;
        }
        let new = self.ingress[port] + len;
        if new <= self.cfg.reserve_bytes {
            self.ingress[port] = new;
        } else if new - self.cfg.reserve_bytes > thresh {
            self.headroom[port] += len;
        } else {
            self.ingress[port] = new;
            self.shared_used += len.min(new - self.cfg.reserve_bytes);
        }
        true
    }

    /// Gives back `len` bytes that came in on `port` (the frame left):
    /// headroom first, then the shared pool, then the reserve.
    pub fn release(&mut self, port: usize, len: u64) {
        let from_headroom = self.headroom[port].min(len);
        let rest = len - from_headroom;
        let from_shared = rest.min(self.shared_of(port));
        self.headroom[port] -= from_headroom;
        self.ingress[port] = self.ingress[port].saturating_sub(rest);
        self.shared_used = self.shared_used.saturating_sub(from_shared);
    }

    /// Whether ingress `port`'s upstream should be paused now (and is not).
    pub fn should_pause(&self, port: usize) -> bool {
        !self.paused[port]
            && (self.headroom[port] > 0 || self.shared_of(port) >= self.threshold(port))
    }

    /// Whether paused ingress `port` may resume now.
    pub fn should_resume(&self, port: usize) -> bool {
        if !self.paused[port] || self.headroom[port] > 0 {
            return false;
        }
        let shared = self.shared_of(port);
        shared == 0 || shared + self.cfg.resume_offset_bytes <= self.threshold(port)
    }

    pub fn set_paused(&mut self, port: usize, paused: bool) {
        self.paused[port] = paused;
    }

    pub fn is_paused(&self, port: usize) -> bool {
        self.paused[port]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KB: u64 = 1024;

    fn mmu(ports: usize, buffer: u64, headroom: u64, shift: u32) -> Mmu {
        let l = IngressLimits {
            headroom_bytes: headroom,
            shift,
        };
        Mmu::new(PfcConfig::new(buffer), &vec![l; ports])
    }

    #[test]
    fn limits_are_three_bdps_of_headroom_and_a_share_by_speed() {
        let l = IngressLimits::for_link(100_000_000_000, 1_000, 100_000_000_000);
        assert_eq!(l.headroom_bytes, 37_500, "3 x 12.5 KB");
        assert_eq!(l.shift, 3, "1/8 at the hosts' rate");
        let l = IngressLimits::for_link(400_000_000_000, 1_000, 100_000_000_000);
        assert_eq!((l.headroom_bytes, l.shift), (150_000, 1), "1/2 at 4x");
    }

    #[test]
    fn the_reserve_fills_first_and_does_not_pause() {
        let mut m = mmu(4, 1 << 20, 10 * KB, 3);
        assert!(m.admit(0, 4 * KB));
        assert_eq!((m.shared_of(0), m.shared_used()), (0, 0));
        assert!(!m.should_pause(0));
    }

    #[test]
    fn the_threshold_is_the_free_shared_pool_shifted() {
        // 1 MiB buffer, 4 ports of 10 KiB headroom and 4 KiB reserve:
        // 968 KiB shared; a port may use 1/8 of what is free.
        let mut m = mmu(4, 1 << 20, 10 * KB, 3);
        assert_eq!(m.threshold(0), (1024 - 56) * KB / 8);
        assert!(m.admit(0, 4 * KB + 8 * KB));
        assert_eq!(m.shared_used(), 8 * KB);
        assert_eq!(
            m.threshold(1),
            (1024 - 56 - 8) * KB / 8,
            "less for everyone"
        );
    }

    #[test]
    fn a_port_is_paused_at_its_threshold_and_spills_into_headroom() {
        let mut m = mmu(2, 200 * KB, 20 * KB, 1);
        // Shared pool 200 - 40 - 8 = 152 KiB; a port may take half the free.
        let mut taken = 0;
        while !m.should_pause(0) {
            assert!(m.admit(0, KB));
            taken += 1;
        }
        // Shared s pauses at s >= (152 - s) / 2: s = 51 KiB (+4 reserve).
        assert_eq!(taken, 4 + 51);
        m.set_paused(0, true);
        assert!(!m.should_pause(0), "already paused");
        // What is still on the wire lands in headroom, then nothing more.
        let mut landed = 0;
        while m.admit(0, KB) {
            landed += 1;
        }
        assert_eq!(landed, 20, "headroom of 20 KiB");
        assert_eq!(m.held(0), (4 + 51 + 20) * KB);
    }

    #[test]
    fn resume_needs_empty_headroom_and_the_offset_under_the_threshold() {
        let mut m = mmu(2, 200 * KB, 20 * KB, 1);
        while !m.should_pause(0) {
            m.admit(0, KB);
        }
        m.set_paused(0, true);
        m.admit(0, 2 * KB); // into headroom
        m.release(0, KB);
        assert!(!m.should_resume(0), "headroom still holds 1 KiB");
        m.release(0, KB);
        assert!(!m.should_resume(0), "at the threshold, not 3 KiB under it");
        let mut released = 0;
        while !m.should_resume(0) {
            m.release(0, KB);
            released += 1;
        }
        // s + 3 <= (152 - s) / 2  =>  s <= 48 2/3: three 1 KiB frames out.
        assert_eq!(released, 3);
        assert_eq!(m.shared_of(0), 48 * KB);
    }

    #[test]
    fn releasing_everything_returns_the_buffer_to_empty() {
        let mut m = mmu(3, 300 * KB, 30 * KB, 2);
        let mut held = [0u64; 3];
        for i in 0..500u64 {
            let p = (i % 3) as usize;
            let len = 64 + (i * 37) % 1500;
            if m.admit(p, len) {
                held[p] += len;
            }
        }
        for (p, h) in held.iter().enumerate() {
            assert_eq!(m.held(p), *h);
            m.release(p, *h);
            assert_eq!(m.held(p), 0);
        }
        assert_eq!(m.shared_used(), 0);
    }
}
