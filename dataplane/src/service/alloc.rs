//! Space in an application's segment: first fit over a free list, every
//! block page aligned (memory regions and rings alike).

/// Alignment and granule of every block.
pub const PAGE: u64 = 4096;

#[derive(Debug)]
pub struct SegmentAlloc {
    /// Free blocks (offset, len), sorted by offset, never adjacent.
    free: Vec<(u64, u64)>,
}

impl SegmentAlloc {
    pub fn new(len: u64) -> Self {
        let len = len / PAGE * PAGE;
        SegmentAlloc {
            free: if len > 0 { vec![(0, len)] } else { vec![] },
        }
    }

    /// Bytes a request of `len` takes.
    pub fn rounded(len: u64) -> u64 {
        len.div_ceil(PAGE).max(1) * PAGE
    }

    /// An offset for `len` bytes (rounded up to pages), if there is room.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let need = Self::rounded(len);
        let i = self.free.iter().position(|&(_, l)| l >= need)?;
        let (off, l) = self.free[i];
        if l == need {
            self.free.remove(i);
        } else {
            self.free[i] = (off + need, l - need);
        }
        Some(off)
    }

    /// Returns a block `alloc` gave for `len`.
    pub fn release(&mut self, off: u64, len: u64) {
        let len = Self::rounded(len);
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// Bytes free.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_page_aligned_and_coalesce_when_released() {
        let mut a = SegmentAlloc::new(16 * PAGE);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(PAGE + 1).unwrap();
        let z = a.alloc(PAGE).unwrap();
        assert_eq!((x, y, z), (0, PAGE, 3 * PAGE));
        assert!(a.alloc(13 * PAGE).is_none());
        a.release(y, PAGE + 1);
        a.release(x, 1);
        a.release(z, PAGE);
        assert_eq!(a.free, vec![(0, 16 * PAGE)]);
        assert_eq!(a.alloc(16 * PAGE), Some(0));
        assert_eq!(a.free_bytes(), 0);
    }
}
