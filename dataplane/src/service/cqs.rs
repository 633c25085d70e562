//! The CQs of one lcore's applications, in a slab that the data path
//! indexes directly: a QP's runtime holds the slots of its CQs, so a
//! completion reaches its CQ's ring with no map lookup, and goes straight
//! into the ring when nothing waits before it and the ring has room. An
//! application names its CQs by its own ids, which map to slots on the
//! control path only.

use std::collections::VecDeque;
use std::sync::Arc;

use nic::stage::NO_OPCODE;
use nic::{FrameKey, Stage};
use nix::sys::eventfd::EventFd;
use shm::abi::{self, Producer};
use shm::segment::Segment;

use super::control::ConnId;
use super::trace;
use super::ServiceCounters;

/// A CQ: its ring in its application's segment, the CQEs held back while
/// the ring is full, and the eventfd the application sleeps on.
pub(super) struct CqRt {
    /// The application that created it, and the id it knows it by.
    pub app: ConnId,
    pub id: u32,
    /// That application's segment (the ring lives in it).
    pub seg: Arc<Segment>,
    pub ring: Producer<abi::Cqe>,
    pub event: EventFd,
    pub backlog: VecDeque<abi::Cqe>,
    /// The ring's block in the segment.
    pub block: (u64, u64),
    /// QPs that complete into it (it cannot be destroyed while any do).
    pub qps: usize,
    /// CQEs were written since its flag was last looked at
    /// ([`Cqs::wake_owed`]), and whether one of them is a solicited event
    /// (for an application armed for those only).
    pub wake_owed: bool,
    pub owed_solicited: bool,
}

/// CQs by slot; a freed slot is taken by the next CQ created.
#[derive(Default)]
pub(super) struct Cqs {
    slots: Vec<Option<CqRt>>,
    free: Vec<usize>,
    /// Slots of the CQs that owe a look at their wake-up flag.
    owed: Vec<usize>,
}

impl Cqs {
    /// Files `cq` and returns its slot.
    pub fn insert(&mut self, cq: CqRt) -> usize {
        match self.free.pop() {
            Some(s) => {
                self.slots[s] = Some(cq);
                s
            }
            None => {
                self.slots.push(Some(cq));
                self.slots.len() - 1
            }
        }
    }

    pub fn get(&self, slot: usize) -> Option<&CqRt> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut CqRt> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Takes the CQ out of its slot, which is free again.
    pub fn remove(&mut self, slot: usize) -> Option<CqRt> {
        let cq = self.slots.get_mut(slot)?.take()?;
        self.free.push(slot);
        Some(cq)
    }

    /// CQs filed.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Writes `c` into the ring of the CQ in `slot` at once when nothing
    /// is held back and the ring has room, and owes the CQ a wake-up
    /// ([`Cqs::wake_owed`]); false (nothing written) otherwise.
    pub fn write_now(
        &mut self,
        slot: usize,
        c: &abi::Cqe,
        counters: &mut ServiceCounters,
        trace: Option<(&mut trace::Trace, usize)>,
    ) -> bool {
        self.owing_wake(slot, |q| {
            write_now(q, c, counters, trace).then(|| solicited_event(c))
        })
    }

    /// Moves the CQEs held back for the CQ in `slot` into its ring while
    /// it has room, and owes the CQ a wake-up when it wrote any; whether
    /// it did.
    pub fn drain_backlog(
        &mut self,
        slot: usize,
        counters: &mut ServiceCounters,
        trace: Option<(&mut trace::Trace, usize)>,
    ) -> bool {
        self.owing_wake(slot, |q| drain_backlog(q, counters, trace))
    }

    /// Runs `write` on the CQ in `slot`; when it wrote, owes the CQ a
    /// look at its wake-up flag at the next [`Cqs::wake_owed`]. Whether
    /// it wrote.
    fn owing_wake(&mut self, slot: usize, write: impl FnOnce(&mut CqRt) -> Option<bool>) -> bool {
        let Cqs { slots, owed, .. } = self;
        let Some(q) = slots.get_mut(slot).and_then(Option::as_mut) else {
            return false;
        };
        let Some(solicited) = write(q) else {
            return false;
        };
        q.owed_solicited |= solicited;
        if !std::mem::replace(&mut q.wake_owed, true) {
            owed.push(slot);
        }
        true
    }

    /// Signals the eventfd of every CQ written since the last call whose
    /// application armed it. Once per CQ and pass, not once per CQE: the
    /// look at the flag is an atomic swap, which on x86 also waits until
    /// every store before it has reached the cache (among them CQEs
    /// whose lines the application's core holds while it polls), so a
    /// pass that writes 16 CQEs into one ring now pays for one swap
    /// instead of 16. It stays after the CQEs it covers (the mirror of
    /// the application's arming, see `Producer::take_armed`), so no
    /// wake-up is lost; the pass ends with it, before the dataplane may
    /// rest. An application asleep on a CQ of one host of a lcore that
    /// serves several is woken after every host's pipeline of the pass
    /// ran, not right after its CQE.
    pub fn wake_owed(&mut self) {
        let Cqs { slots, owed, .. } = self;
        for slot in owed.drain(..) {
            if let Some(q) = slots.get_mut(slot).and_then(Option::as_mut) {
                if std::mem::take(&mut q.wake_owed) {
                    wake(q);
                }
            }
        }
    }
}

/// Moves held-back CQEs into the ring while it has room; when it wrote
/// any, whether one of them is a solicited event.
fn drain_backlog(
    q: &mut CqRt,
    counters: &mut ServiceCounters,
    trace: Option<(&mut trace::Trace, usize)>,
) -> Option<bool> {
    // Full, or the application scribbled the consumer index: hold the
    // CQEs until it reads (or overruns).
    let want = u32::try_from(q.backlog.len()).unwrap_or(u32::MAX);
    let Ok(free) = q.ring.free(&*q.seg, want) else {
        return None;
    };
    let n = (free as usize).min(q.backlog.len());
    if n == 0 {
        return None;
    }
    let solicited = q.backlog.range(..n).any(solicited_event);
    for c in q.backlog.range(..n) {
        q.ring.write(&*q.seg, c);
    }
    if let Some((t, host)) = trace {
        for c in q.backlog.range(..n) {
            record_published(t, host, c);
        }
    }
    q.backlog.drain(..n);
    counters.cqes_delivered += n as u64;
    Some(solicited)
}

/// Whether `c` signals a CQ armed for solicited events only: a receive
/// whose sender asked for it, or an error.
fn solicited_event(c: &abi::Cqe) -> bool {
    c.flags & abi::CQE_SOLICITED != 0
        || c.status != abi::status_code(transport::rc::WcStatus::Success)
}

/// Writes `c` into the ring at once when nothing is held back and the
/// ring has room; false (nothing written) otherwise.
fn write_now(
    q: &mut CqRt,
    c: &abi::Cqe,
    counters: &mut ServiceCounters,
    trace: Option<(&mut trace::Trace, usize)>,
) -> bool {
    if !q.backlog.is_empty() || !matches!(q.ring.free(&*q.seg, 1), Ok(n) if n > 0) {
        return false;
    }
    q.ring.write(&*q.seg, c);
    if let Some((t, host)) = trace {
        record_published(t, host, c);
    }
    counters.cqes_delivered += 1;
    true
}

/// Signals the application's eventfd if it armed the CQ (for every
/// completion, or for solicited events and one of those came).
fn wake(q: &mut CqRt) {
    let solicited = std::mem::take(&mut q.owed_solicited);
    if q.ring.take_armed_for(&*q.seg, solicited) {
        let _ = q.event.write(1);
    }
}

fn record_published(t: &mut trace::Trace, host: usize, c: &abi::Cqe) {
    let key = FrameKey {
        opcode: NO_OPCODE,
        dest_qp: c.qpn,
        psn: c.wr_id as u32 & 0xff_ffff,
    };
    t.record(host, Stage::CqePublished, key);
}
