//! The credit-based round-robin flow scheduler of draft-00 section 7.2 /
//! hpcc.md: each flow earns credit at its pacing rate R (capped by a burst
//! limit) and may send a packet when its credit covers the packet and its
//! window W has room; eligible flows take turns.
//!
//! Only flows with a packet to send are tracked, so idle flows cost nothing:
//! - ready: a FIFO of flows that may send now (round-robin order);
//! - waiting: flows short of credit, filed under the time they will have
//!   enough, in a timing wheel (`tick_ns` slots, a bitmap of occupied
//!   slots) with a heap for times beyond the wheel's horizon;
//! - untracked: idle flows (no packet), flows whose window is full (they
//!   come back on an ACK) and flows with rate 0.
//!
//! A PktSend decision pops the ready FIFO after moving due waiting flows
//! into it; each flow moves a bounded number of times per packet, so the
//! cost per decision does not depend on the number of flows.

mod list;

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use list::{Links, List};

/// Scheduler settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Credit cap: the most bytes a flow can send back to back after being
    /// idle (a packet larger than this may still go when credit covers it).
    pub burst_bytes: u32,
    /// Timing-wheel granularity; a flow becomes eligible at most one tick
    /// after it has the credit (its long-run rate is exact).
    pub tick_ns: u64,
    /// Timing-wheel slots (a power of two); horizon = slots x tick.
    pub wheel_slots: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            burst_bytes: 16 * 1024,
            tick_ns: 128,
            wheel_slots: 8192,
        }
    }
}

/// A flow (one QP's send side) known to the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId(pub u32);

/// The decision: `flow` may put a packet of `bytes` on the wire now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PktSend {
    pub flow: FlowId,
    pub bytes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    Untracked,
    Ready,
    Wheel(u32),
    Heap,
}

#[derive(Debug, Clone, Copy)]
struct Flow {
    in_use: bool,
    rate_bps: u64,
    credit: f64,
    credit_at: u64,
    window: u64,
    inflight: u64,
    pending: Option<u32>,
    at: Where,
    /// Bumped whenever the flow leaves the heap, so stale heap entries are
    /// recognised.
    heap_gen: u32,
}

/// Per-flow view for tests and counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowInfo {
    pub rate_bps: u64,
    pub credit_bytes: f64,
    pub window_bytes: u64,
    pub inflight_bytes: u64,
    pub pending_bytes: Option<u32>,
}

/// The flow scheduler.
#[derive(Debug)]
pub struct FlowScheduler {
    cfg: SchedulerConfig,
    flows: Vec<Flow>,
    free: Vec<u32>,
    links: Links,
    ready: List,
    slots: Vec<List>,
    occupied: Vec<u64>,
    /// (tick, flow, heap_gen) of flows due beyond the wheel.
    heap: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// Last tick processed: slots up to here are empty.
    cursor: u64,
    /// Occupied wheel slots (so an empty wheel is never scanned).
    occupied_slots: usize,
    live: usize,
    /// log2 of `tick_ns` when it is a power of two (the default): the
    /// tick of a time is then a shift, not a 64-bit division, twice per
    /// packet.
    tick_shift: Option<u32>,
}

impl FlowScheduler {
    /// A scheduler whose clock starts at `now`. `wheel_slots` is rounded up
    /// to a power of two; `tick_ns` and `burst_bytes` are at least 1.
    pub fn new(cfg: SchedulerConfig, now: u64) -> Self {
        let cfg = SchedulerConfig {
            burst_bytes: cfg.burst_bytes.max(1),
            tick_ns: cfg.tick_ns.max(1),
            wheel_slots: cfg.wheel_slots.max(64).next_power_of_two(),
        };
        FlowScheduler {
            cfg,
            flows: Vec::new(),
            free: Vec::new(),
            links: Links::default(),
            ready: List::default(),
            slots: vec![List::default(); cfg.wheel_slots as usize],
            occupied: vec![0; cfg.wheel_slots as usize / 64],
            heap: BinaryHeap::new(),
            cursor: now / cfg.tick_ns,
            occupied_slots: 0,
            live: 0,
            tick_shift: cfg
                .tick_ns
                .is_power_of_two()
                .then(|| cfg.tick_ns.trailing_zeros()),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Flows added and not removed.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Adds an idle flow with rate R and window W; it starts with a full
    /// burst of credit (flows start at line rate). Allocates only when the
    /// flow table grows.
    pub fn add_flow(&mut self, rate_bps: u64, window_bytes: u64, now: u64) -> FlowId {
        let flow = Flow {
            in_use: true,
            rate_bps,
            credit: f64::from(self.cfg.burst_bytes),
            credit_at: now,
            window: window_bytes,
            inflight: 0,
            pending: None,
            at: Where::Untracked,
            heap_gen: 0,
        };
        let i = match self.free.pop() {
            Some(i) => {
                let g = self.flows[i as usize].heap_gen;
                self.flows[i as usize] = Flow {
                    heap_gen: g,
                    ..flow
                };
                i
            }
            None => {
                self.flows.push(flow);
                self.heap.reserve(1);
                (self.flows.len() - 1) as u32
            }
        };
        self.links.ensure(i);
        self.live += 1;
        FlowId(i)
    }

    /// Forgets a flow; its id may be reused. Unknown ids are ignored.
    pub fn remove_flow(&mut self, id: FlowId) {
        if self.flow(id).is_none() {
            return;
        }
        self.detach(id.0);
        self.flows[id.0 as usize].in_use = false;
        self.free.push(id.0);
        self.live -= 1;
    }

    /// The flow's state, if it exists.
    pub fn info(&self, id: FlowId, now: u64) -> Option<FlowInfo> {
        let f = self.flow(id)?;
        Some(FlowInfo {
            rate_bps: f.rate_bps,
            credit_bytes: self.credit_at(f, now),
            window_bytes: f.window,
            inflight_bytes: f.inflight,
            pending_bytes: f.pending,
        })
    }

    /// Applies `change` to an existing flow (credit earned so far is booked
    /// first, at the old rate) and re-files it. Unknown ids are ignored.
    fn update(&mut self, id: FlowId, now: u64, change: impl FnOnce(&mut Flow)) {
        if self.flow(id).is_none() {
            return;
        }
        self.accrue(id.0, now);
        change(&mut self.flows[id.0 as usize]);
        self.refile(id.0, now);
    }

    /// New pacing rate, effective for the next decision (credit earned so
    /// far at the old rate is kept).
    pub fn set_rate(&mut self, id: FlowId, rate_bps: u64, now: u64) {
        self.set_rate_and_next(id, rate_bps, self.flow(id).and_then(|f| f.pending), now);
    }

    /// [`FlowScheduler::set_rate`] and [`FlowScheduler::set_next_packet`]
    /// in one step. When neither changes, nothing moves: the flow keeps its
    /// place in the round robin and no work is done (callers may say the
    /// same thing after every event).
    pub fn set_rate_and_next(&mut self, id: FlowId, rate_bps: u64, bytes: Option<u32>, now: u64) {
        match self.flow(id) {
            Some(f) if f.rate_bps == rate_bps && f.pending == bytes => {}
            Some(_) => self.update(id, now, |f| {
                f.rate_bps = rate_bps;
                f.pending = bytes;
            }),
            None => {}
        }
    }

    /// New window (bytes in flight allowed).
    pub fn set_window(&mut self, id: FlowId, window_bytes: u64, now: u64) {
        self.update(id, now, |f| f.window = window_bytes);
    }

    /// The size of the flow's next packet, or `None` when it has nothing to
    /// send. Call after each [`PktSend`] of the flow that has more.
    pub fn set_next_packet(&mut self, id: FlowId, bytes: Option<u32>, now: u64) {
        if let Some(rate) = self.flow(id).map(|f| f.rate_bps) {
            self.set_rate_and_next(id, rate, bytes, now);
        }
    }

    /// `bytes` of the flow were acknowledged (leave the network).
    pub fn on_acked(&mut self, id: FlowId, bytes: u64, now: u64) {
        self.update(id, now, |f| f.inflight = f.inflight.saturating_sub(bytes));
    }

    /// Sets the bytes in flight outright (after go-back-N, say).
    pub fn set_inflight(&mut self, id: FlowId, bytes: u64, now: u64) {
        self.update(id, now, |f| f.inflight = bytes);
    }

    /// The PktSend decision at `now`: the next flow, in round-robin order,
    /// whose credit covers its packet and whose window has room. The packet
    /// is charged (credit, in flight) and the flow's next packet is cleared.
    pub fn next_send(&mut self, now: u64) -> Option<PktSend> {
        self.advance(now);
        while let Some(i) = self.links.pop_front(&mut self.ready) {
            self.flows[i as usize].at = Where::Untracked;
            self.accrue(i, now);
            let f = &mut self.flows[i as usize];
            let Some(bytes) = f.pending else { continue };
            if f.credit >= f64::from(bytes) {
                f.credit -= f64::from(bytes);
                f.inflight += u64::from(bytes);
                f.pending = None;
                return Some(PktSend {
                    flow: FlowId(i),
                    bytes,
                });
            }
            self.refile(i, now);
        }
        None
    }

    /// The PktSend decision for one idle flow that has a packet of `bytes`
    /// at `now`, taken without filing it, when filing it would make it the
    /// head of the ready FIFO: no flow is ready, the flow has no packet
    /// filed, its window has room and its credit covers the packet. Then
    /// the packet is charged (credit, in flight) as [`FlowScheduler::next_send`]
    /// charges it and `true` is returned: the same decision, in the same
    /// order, as [`FlowScheduler::set_rate_and_next`] followed by
    /// `next_send` at `now`, without the flow entering and leaving the
    /// FIFO. Otherwise `false` is returned and the caller files the packet
    /// as usual; nothing changes but, when only window or credit refused
    /// it, the rate (credit earned so far booked at the old one), as the
    /// filing would change it.
    pub fn send_now(&mut self, id: FlowId, rate_bps: u64, bytes: u32, now: u64) -> bool {
        self.may_send_now(id) && self.send_now_unasked(id, rate_bps, bytes, now)
    }

    /// [`FlowScheduler::send_now`] after [`FlowScheduler::may_send_now`]
    /// said true, with nothing done to the scheduler since: the rest of
    /// the test (window, credit), not the first part again.
    pub fn send_now_unasked(&mut self, id: FlowId, rate_bps: u64, bytes: u32, now: u64) -> bool {
        debug_assert!(self.may_send_now(id));
        self.accrue(id.0, now);
        let f = &mut self.flows[id.0 as usize];
        f.rate_bps = rate_bps;
        let room = f.inflight == 0 || f.inflight.saturating_add(u64::from(bytes)) <= f.window;
        if !room || f.credit < f64::from(bytes) {
            return false;
        }
        f.credit -= f64::from(bytes);
        f.inflight += u64::from(bytes);
        // As `next_send` would: flows due by now join the FIFO now, ahead
        // of any filed later.
        self.advance(now);
        true
    }

    /// The part of [`FlowScheduler::send_now`]'s test that needs neither
    /// the packet nor the time: no flow is ready and the flow has no
    /// packet filed. When false, `send_now` refuses whatever the packet,
    /// so a caller need not size it first.
    pub fn may_send_now(&self, id: FlowId) -> bool {
        let idle = self
            .flow(id)
            .is_some_and(|f| f.pending.is_none() && f.at == Where::Untracked);
        idle && self.ready.is_empty()
    }

    /// Whether a flow may be eligible at `now` (flows due by then join
    /// the ready FIFO first): when not, [`FlowScheduler::next_send`]
    /// returns `None`; when so, it may still (a ready flow found short of
    /// credit or window is filed again).
    pub fn has_ready(&mut self, now: u64) -> bool {
        self.advance(now);
        !self.ready.is_empty()
    }

    /// The earliest time a flow may become eligible: `now`-like (the
    /// current tick) when one is ready, `None` when no flow waits.
    pub fn next_wakeup(&self) -> Option<u64> {
        if !self.ready.is_empty() {
            return Some(self.cursor * self.cfg.tick_ns);
        }
        let n = self.slots.len() as u64;
        let start = self.wrap(self.cursor + 1);
        let wheel = if self.occupied_slots == 0 {
            None
        } else {
            self.first_occupied_from(start as usize).map(|s| {
                let ahead = self.wrap(s as u64 + n - start);
                (self.cursor + 1 + ahead) * self.cfg.tick_ns
            })
        };
        let heap = self
            .heap
            .iter()
            .filter(|Reverse((_, i, g))| self.is_heap_entry_live(*i, *g))
            .map(|Reverse((t, _, _))| t * self.cfg.tick_ns)
            .min();
        match (wheel, heap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn flow(&self, id: FlowId) -> Option<&Flow> {
        self.flows.get(id.0 as usize).filter(|f| f.in_use)
    }

    fn cap(&self, f: &Flow) -> f64 {
        f64::from(self.cfg.burst_bytes.max(f.pending.unwrap_or(0)))
    }

    fn credit_at(&self, f: &Flow, now: u64) -> f64 {
        let dt = now.saturating_sub(f.credit_at) as f64;
        (f.credit + dt * f.rate_bps as f64 / 8e9).min(self.cap(f).max(f.credit))
    }

    fn accrue(&mut self, i: u32, now: u64) {
        let f = self.flows[i as usize];
        if now > f.credit_at {
            let c = self.credit_at(&f, now);
            let f = &mut self.flows[i as usize];
            f.credit = c;
            f.credit_at = now;
        }
    }

    /// Takes the flow out of whatever list holds it.
    fn detach(&mut self, i: u32) {
        match self.flows[i as usize].at {
            Where::Untracked => {}
            Where::Ready => self.links.unlink(&mut self.ready, i),
            Where::Wheel(s) => {
                let s = s as usize;
                self.links.unlink(&mut self.slots[s], i);
                if self.slots[s].is_empty() {
                    self.occupied[s / 64] &= !(1u64 << (s % 64));
                    self.occupied_slots -= 1;
                }
            }
            Where::Heap => {
                let f = &mut self.flows[i as usize];
                f.heap_gen = f.heap_gen.wrapping_add(1);
            }
        }
        self.flows[i as usize].at = Where::Untracked;
    }

    /// Re-files the flow after any change: untracked when idle, window-full
    /// or at rate 0; ready when its credit covers its packet; otherwise
    /// waiting until it will.
    fn refile(&mut self, i: u32, now: u64) {
        self.detach(i);
        let f = self.flows[i as usize];
        let Some(bytes) = f.pending else { return };
        if f.inflight > 0 && f.inflight.saturating_add(u64::from(bytes)) > f.window {
            return; // window full: an ACK or a new window brings it back
        }
        self.accrue(i, now);
        let credit = self.flows[i as usize].credit;
        let need = f64::from(bytes) - credit;
        if need <= 0.0 {
            self.file_ready(i);
        } else if f.rate_bps > 0 {
            let wait = (need * 8e9 / f.rate_bps as f64).ceil();
            let at = now.saturating_add(if wait >= u64::MAX as f64 {
                u64::MAX / 2
            } else {
                wait as u64
            });
            self.file_at(i, at);
        }
    }

    fn file_ready(&mut self, i: u32) {
        self.links.push_back(&mut self.ready, i);
        self.flows[i as usize].at = Where::Ready;
    }

    fn file_at(&mut self, i: u32, at_ns: u64) {
        let tick = self.tick_of(at_ns, true);
        let n = self.slots.len() as u64;
        if tick <= self.cursor {
            self.file_ready(i);
        } else if tick - self.cursor < n {
            let s = self.wrap(tick) as usize;
            if self.slots[s].is_empty() {
                self.occupied_slots += 1;
            }
            self.links.push_back(&mut self.slots[s], i);
            self.occupied[s / 64] |= 1u64 << (s % 64);
            self.flows[i as usize].at = Where::Wheel(s as u32);
        } else {
            if self.heap.len() > 2 * self.flows.len() + 64 {
                self.compact_heap();
            }
            let f = &mut self.flows[i as usize];
            f.at = Where::Heap;
            self.heap.push(Reverse((tick, i, f.heap_gen)));
        }
    }

    fn is_heap_entry_live(&self, i: u32, gen: u32) -> bool {
        let f = &self.flows[i as usize];
        f.in_use && f.at == Where::Heap && f.heap_gen == gen
    }

    fn compact_heap(&mut self) {
        let mut v = std::mem::take(&mut self.heap).into_vec();
        v.retain(|Reverse((_, i, g))| self.is_heap_entry_live(*i, *g));
        self.heap = BinaryHeap::from(v);
    }

    /// Moves the clock to `now`: every flow due by now joins the ready FIFO
    /// (in order of due time), heap flows within the horizon join the wheel.
    #[inline(always)]
    fn advance(&mut self, now: u64) {
        let now_tick = self.tick_of(now, false);
        if now_tick <= self.cursor {
            return;
        }
        if self.occupied_slots == 0 && self.heap.is_empty() {
            // No flow waits for credit: only the clock moves.
            self.cursor = now_tick;
        } else {
            self.advance_to(now_tick);
        }
    }

    /// The tick `ns` falls in, or with `ceil` the first tick at or after
    /// it.
    #[inline(always)]
    fn tick_of(&self, ns: u64, ceil: bool) -> u64 {
        match self.tick_shift {
            Some(k) => (ns >> k) + u64::from(ceil && ns & ((1u64 << k) - 1) != 0),
            None if ceil => ns.div_ceil(self.cfg.tick_ns),
            None => ns / self.cfg.tick_ns,
        }
    }

    /// `x` modulo the wheel's slots, a power of two: a mask, not a
    /// division.
    #[inline(always)]
    fn wrap(&self, x: u64) -> u64 {
        x & (self.slots.len() as u64 - 1)
    }

    /// [`FlowScheduler::advance`] to a later tick.
    fn advance_to(&mut self, now_tick: u64) {
        let n = self.slots.len() as u64;
        let span = (now_tick - self.cursor).min(n);
        let mut s = self.wrap(self.cursor + 1);
        // An empty wheel (no flow waiting for credit, as when every flow
        // sends at once) is not scanned.
        let mut left = if self.occupied_slots == 0 { 0 } else { span };
        while let Some(ahead) = self.first_occupied_within(s as usize, left) {
            let found = self.wrap(s + ahead) as usize;
            self.drain_slot(found);
            s = self.wrap(found as u64 + 1);
            left -= ahead + 1;
        }
        self.cursor = now_tick;
        while let Some(&Reverse((tick, i, g))) = self.heap.peek() {
            if tick - self.cursor.min(tick) >= n {
                break;
            }
            self.heap.pop();
            if self.is_heap_entry_live(i, g) {
                self.flows[i as usize].at = Where::Untracked;
                self.file_at(i, tick * self.cfg.tick_ns);
            }
        }
    }

    fn drain_slot(&mut self, s: usize) {
        let flows = &mut self.flows;
        self.links.append(&mut self.ready, &mut self.slots[s], |i| {
            flows[i as usize].at = Where::Ready;
        });
        self.occupied[s / 64] &= !(1u64 << (s % 64));
        self.occupied_slots -= 1;
    }

    /// The first occupied slot at or after `start`, wrapping around.
    fn first_occupied_from(&self, start: usize) -> Option<usize> {
        self.first_occupied_within(start, self.slots.len() as u64)
            .map(|ahead| self.wrap((start + ahead as usize) as u64) as usize)
    }

    /// How far past `start` the first occupied slot lies, looking at `len`
    /// slots at most (wrapping); reads only the bitmap words that cover them.
    fn first_occupied_within(&self, start: usize, len: u64) -> Option<u64> {
        let mut pos = start;
        let mut seen = 0u64;
        while seen < len {
            let (w, b) = (pos / 64, pos % 64);
            let bits = self.occupied[w] >> b;
            let in_word = (64 - b) as u64;
            if bits != 0 {
                let ahead = seen + u64::from(bits.trailing_zeros());
                return (ahead < len).then_some(ahead);
            }
            seen += in_word;
            pos = self.wrap((pos + in_word as usize) as u64) as usize;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A tick of a power-of-two length is found by a shift, any other
        /// by a division: the same tick either way.
        #[test]
        fn the_tick_of_a_time_is_its_quotient(
            tick in prop::sample::select(vec![1u64, 2, 3, 64, 100, 128, 1 << 20, 999_999]),
            ns in any::<u64>(),
        ) {
            let cfg = SchedulerConfig { tick_ns: tick, ..SchedulerConfig::default() };
            let s = FlowScheduler::new(cfg, 0);
            prop_assert_eq!(s.tick_shift.is_some(), tick.is_power_of_two());
            prop_assert_eq!(s.tick_of(ns, false), ns / tick);
            prop_assert_eq!(s.tick_of(ns, true), ns.div_ceil(tick));
        }
    }
}
