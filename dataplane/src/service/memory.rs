//! The memory an engine of the daemon reaches: the shared segments of the
//! applications attached to its host. Each application gets a slot, and
//! its segment appears at device address `(slot + 1) << 40`, so a memory
//! region's `va` names both the application and the offset. The engine
//! checks every access against the region table (keys, PD, bounds) before
//! it gets here; this only maps addresses to segments.
//!
//! Each segment is also external memory for mbufs ([`ExtMemory`]): a
//! frame's payload may be sent from where it lies ([`attach_payload`]),
//! and the segment then stays mapped until the last such frame is freed,
//! even after its application detached.

use std::sync::Arc;

use nic::Attached;
use shm::segment::Segment;
use transport::mr::Memory;

use crate::dpdk::{ExtMemory, Mbuf};

/// Bits of a device address that are the offset in a segment.
pub const SLOT_SHIFT: u32 = 40;

/// An attached segment, and the same mapping as mbufs' external memory.
struct Slot {
    seg: Arc<Segment>,
    ext: ExtMemory,
}

/// The segments of one host's applications.
#[derive(Default)]
pub struct AppMemory {
    slots: Vec<Option<Slot>>,
}

impl AppMemory {
    /// Attaches a segment; returns its slot.
    pub fn attach(&mut self, seg: Arc<Segment>) -> usize {
        let base = seg.slice(0, 0).map_or(std::ptr::null(), <[u8]>::as_ptr);
        // SAFETY: the segment's `len` bytes from its base stay mapped as
        // long as the segment, which the external memory keeps alive.
        let ext = unsafe { ExtMemory::new(base, seg.len(), seg.clone()) };
        let slot = Some(Slot { seg, ext });
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        }
    }

    pub fn detach(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = None;
        }
    }

    /// The device address of `offset` in slot `slot`.
    pub fn va(slot: usize, offset: u64) -> u64 {
        ((slot as u64 + 1) << SLOT_SHIFT) | offset
    }

    fn locate(&self, va: u64) -> Option<(&Slot, usize)> {
        let slot = (va >> SLOT_SHIFT).checked_sub(1)? as usize;
        let s = self.slots.get(slot)?.as_ref()?;
        Some((s, (va & ((1 << SLOT_SHIFT) - 1)) as usize))
    }
}

/// Appends to `frame` (the headers of a frame sent in pieces) the `len`
/// bytes at device address `va` and then `tail`: as a segment pointing at
/// the application's memory, or copied when the pool has no mbuf for it.
/// `None` when the bytes are not mapped or the frame has no room for a
/// copy (`nic::AttachPayload`).
pub fn attach_payload(
    mem: &AppMemory,
    frame: &mut Mbuf,
    va: u64,
    len: usize,
    tail: &[u8],
) -> Option<Attached> {
    let (slot, off) = mem.locate(va)?;
    let bytes = slot.seg.slice(off, len)?;
    if frame.chain_external(&slot.ext, bytes, tail) {
        return Some(Attached::InPlace);
    }
    let dst = frame.append(len + tail.len())?;
    dst[..len].copy_from_slice(bytes);
    dst[len..].copy_from_slice(tail);
    Some(Attached::Copied)
}

impl Memory for AppMemory {
    fn read(&self, va: u64, dst: &mut [u8]) {
        match self.locate(va) {
            Some((s, off)) => s.seg.read(off, dst),
            None => dst.fill(0),
        }
    }

    fn write(&mut self, va: u64, src: &[u8]) {
        if let Some((s, off)) = self.locate(va) {
            s.seg.write(off, src);
        }
    }

    fn bytes(&self, va: u64, len: usize) -> Option<&[u8]> {
        let (s, off) = self.locate(va)?;
        s.seg.slice(off, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_reach_their_own_segment_only() {
        let mut m = AppMemory::default();
        let (a, _fa) = Segment::create("a", 4096, false).unwrap();
        let (b, _fb) = Segment::create("b", 4096, false).unwrap();
        let sa = m.attach(Arc::new(a));
        let sb = m.attach(Arc::new(b));
        m.write(AppMemory::va(sa, 10), b"aaaa");
        m.write(AppMemory::va(sb, 10), b"bbbb");
        let mut got = [0u8; 4];
        m.read(AppMemory::va(sa, 10), &mut got);
        assert_eq!(&got, b"aaaa");
        m.detach(sa);
        m.read(AppMemory::va(sa, 10), &mut got);
        assert_eq!(got, [0; 4], "a detached slot reads as zeros");
        m.read(5, &mut got);
        assert_eq!(got, [0; 4], "slot -1");
    }
}
