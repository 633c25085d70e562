//! The memory an engine of the daemon reaches: the shared segments of the
//! applications attached to its host. Each application gets a slot, and
//! its segment appears at device address `(slot + 1) << 40`, so a memory
//! region's `va` names both the application and the offset. The engine
//! checks every access against the region table (keys, PD, bounds) before
//! it gets here; this only maps addresses to segments.

use std::sync::Arc;

use transport::mr::Memory;
use verbs::shm::Segment;

/// Bits of a device address that are the offset in a segment.
pub const SLOT_SHIFT: u32 = 40;

/// The segments of one host's applications.
#[derive(Default)]
pub struct AppMemory {
    slots: Vec<Option<Arc<Segment>>>,
}

impl AppMemory {
    /// Attaches a segment; returns its slot.
    pub fn attach(&mut self, seg: Arc<Segment>) -> usize {
        match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(seg);
                i
            }
            None => {
                self.slots.push(Some(seg));
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

    fn locate(&self, va: u64) -> Option<(&Segment, usize)> {
        let slot = (va >> SLOT_SHIFT).checked_sub(1)? as usize;
        let seg = self.slots.get(slot)?.as_deref()?;
        Some((seg, (va & ((1 << SLOT_SHIFT) - 1)) as usize))
    }
}

impl Memory for AppMemory {
    fn read(&self, va: u64, dst: &mut [u8]) {
        match self.locate(va) {
            Some((seg, off)) => seg.read(off, dst),
            None => dst.fill(0),
        }
    }

    fn write(&mut self, va: u64, src: &[u8]) {
        if let Some((seg, off)) = self.locate(va) {
            seg.write(off, src);
        }
    }

    fn bytes(&self, va: u64, len: usize) -> Option<&[u8]> {
        let (seg, off) = self.locate(va)?;
        seg.slice(off, len)
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
