//! The shared-memory segment of one application: a memfd (hugepage-backed
//! when the machine has hugepages to give) mapped read-write and shared by
//! the daemon and the application. All of the unsafe code that touches
//! the mapping is here; everything else goes through bounds-checked
//! copies and atomic index words ([`crate::abi::SharedMem`]).
//!
//! Both processes may write the same bytes at once (an RDMA WRITE landing
//! while the application reads its buffer): bytes are copied with plain
//! memory copies, as a NIC's DMA would, and only ring indices are atomics.

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

/// Hugepage size the segment is rounded to when hugepage-backed.
pub const HUGEPAGE: usize = 2 << 20;

/// A mapped segment.
#[derive(Debug)]
pub struct Segment {
    ptr: NonNull<u8>,
    len: usize,
    hugepages: bool,
}

// SAFETY: the mapping is plain shared memory owned by this value; all
// accesses through `&self` are either atomics or raw copies that tolerate
// concurrent writers (see the module doc), so sharing across threads is
// no different from sharing across processes.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

/// Why a segment could not be created or mapped.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("segment of {0} bytes: the size must be 1 byte .. 1 TiB")]
    BadSize(u64),
    #[error("{what}: {errno}")]
    Sys {
        what: &'static str,
        errno: nix::errno::Errno,
    },
}

fn sys(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> ShmError {
    move |errno| ShmError::Sys { what, errno }
}

/// Largest segment (the daemon gives each application 2^40 bytes of
/// device address space).
pub const MAX_SEGMENT: u64 = 1 << 40;

impl Segment {
    /// Creates a memfd of `len` bytes named `name` and maps it. Tries a
    /// hugepage-backed memfd first when `try_hugepages`, and falls back to
    /// normal pages when the kernel has none to reserve.
    pub fn create(
        name: &str,
        len: u64,
        try_hugepages: bool,
    ) -> Result<(Segment, OwnedFd), ShmError> {
        if len == 0 || len > MAX_SEGMENT {
            return Err(ShmError::BadSize(len));
        }
        let cname = CString::new(name.replace('\0', "_")).expect("NULs replaced");
        if try_hugepages {
            let rounded = (len as usize).div_ceil(HUGEPAGE) * HUGEPAGE;
            let huge = memfd_create(
                &cname,
                MemFdCreateFlag::MFD_HUGETLB | MemFdCreateFlag::MFD_CLOEXEC,
            )
            .and_then(|fd| nix::unistd::ftruncate(&fd, rounded as i64).map(|_| fd));
            if let Ok(fd) = huge {
                // The shared mapping reserves the pages now; without enough
                // free hugepages it fails here rather than faulting later.
                if let Ok(mut seg) = Segment::map(&fd, rounded) {
                    seg.hugepages = true;
                    return Ok((seg, fd));
                }
            }
        }
        let fd = memfd_create(&cname, MemFdCreateFlag::MFD_CLOEXEC).map_err(sys("memfd_create"))?;
        nix::unistd::ftruncate(&fd, len as i64).map_err(sys("ftruncate"))?;
        let seg = Segment::map(&fd, len as usize)?;
        Ok((seg, fd))
    }

    /// Maps `len` bytes of a segment's memfd (received from the daemon).
    pub fn map(fd: &impl AsFd, len: usize) -> Result<Segment, ShmError> {
        let n = NonZeroUsize::new(len).ok_or(ShmError::BadSize(0))?;
        // SAFETY: a fresh shared mapping of a file descriptor at an address
        // the kernel chooses; it aliases no Rust object, and it is unmapped
        // only by Drop, after which no reference into it remains (all
        // accessors borrow `self`).
        let p = unsafe {
            mmap(
                None,
                n,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }
        .map_err(sys("mmap"))?;
        Ok(Segment {
            ptr: p.cast(),
            len,
            hugepages: false,
        })
    }

    /// Maps pieces of several memfds back to back into one contiguous
    /// mapping, in order: an application's buffer whose pages live in
    /// those memfds (each piece: descriptor, offset in it, length; offsets
    /// and lengths page-aligned, hugepage-aligned for hugetlb memfds).
    pub fn map_pieces(pieces: &[(BorrowedFd<'_>, u64, usize)]) -> Result<Segment, ShmError> {
        let total = pieces
            .iter()
            .try_fold(0usize, |t, p| t.checked_add(p.2))
            .filter(|&t| t > 0 && t as u64 <= MAX_SEGMENT)
            .ok_or(ShmError::BadSize(0))?;
        let n = NonZeroUsize::new(total).ok_or(ShmError::BadSize(0))?;
        // SAFETY: a fresh anonymous reservation at an address the kernel
        // chooses (no access until the pieces are mapped over it); it
        // aliases nothing.
        let base = unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                n,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(sys("mmap reserve"))?;
        let seg = Segment {
            ptr: base.cast(),
            len: total,
            hugepages: false,
        };
        let mut at = 0usize;
        for (fd, off, len) in pieces {
            let Some(l) = NonZeroUsize::new(*len) else {
                continue;
            };
            let off = i64::try_from(*off).map_err(|_| ShmError::BadSize(*off))?;
            // SAFETY: the target range [at, at + len) lies inside the
            // reservation this Segment owns (the lengths sum to its size),
            // so MAP_FIXED replaces only our own PROT_NONE pages; `seg`
            // unmaps the whole range on drop, also on the error path.
            unsafe {
                mmap(
                    Some(NonZeroUsize::new(seg.ptr.as_ptr() as usize + at).expect("non-null")),
                    l,
                    ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                    MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                    fd,
                    off,
                )
            }
            .map_err(sys("mmap piece"))?;
            at += *len;
        }
        Ok(seg)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the segment is backed by hugepages.
    pub fn hugepages(&self) -> bool {
        self.hugepages
    }

    fn in_bounds(&self, off: usize, n: usize) -> bool {
        off.checked_add(n).is_some_and(|end| end <= self.len)
    }

    fn word(&self, off: usize) -> Option<&AtomicU32> {
        if !self.in_bounds(off, 4) || off % 4 != 0 {
            return None;
        }
        // SAFETY: in bounds and 4-byte aligned (the mapping is page
        // aligned); AtomicU32 has the layout of u32 and every bit pattern
        // is valid; the reference lives no longer than `&self`, during
        // which the mapping stays.
        Some(unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU32) })
    }

    /// Copies `dst.len()` bytes at `off` into `dst`; zeros when out of
    /// bounds.
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        if !self.in_bounds(off, dst.len()) {
            dst.fill(0);
            return;
        }
        // SAFETY: the source range is inside the mapping (checked above)
        // and cannot overlap `dst`, a Rust-owned buffer outside it (the
        // accessors never hand out references into the mapping that
        // could be passed back here).
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        }
    }

    /// Copies `src` to `off`; nothing when out of bounds.
    pub fn write(&self, off: usize, src: &[u8]) {
        if !self.in_bounds(off, src.len()) {
            return;
        }
        // SAFETY: the destination range is inside the mapping (checked
        // above). `src` may lie in a mapping: through `slice` in an
        // application, or, in the daemon, as the payload of a frame sent
        // from a segment where it lies (zero-copy TX) to another of the
        // daemon's devices, which may be this mapping, the same bytes
        // even when a WRITE's source and destination overlap. `copy`
        // tolerates overlap, and the bytes are plain shared memory that
        // other processes write under any reference anyway (see the
        // module doc).
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr.as_ptr().add(off), src.len()) }
    }

    /// One byte read with a volatile load (for polling a byte another
    /// process writes, as perftest's latency test polls the last byte of
    /// its buffer); 0 when out of bounds.
    pub fn load_u8_volatile(&self, off: usize) -> u8 {
        if !self.in_bounds(off, 1) {
            return 0;
        }
        // SAFETY: in bounds of the live mapping; a volatile byte load of
        // shared memory cannot be torn and is never elided.
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(off)) }
    }

    /// The bytes `[off, off + len)` as a slice, for an application's own
    /// memory region; `None` when out of bounds. The daemon may write them
    /// concurrently (an RDMA WRITE or READ response landing), as a NIC's
    /// DMA writes a registered buffer under a running program.
    pub fn slice(&self, off: usize, len: usize) -> Option<&[u8]> {
        if !self.in_bounds(off, len) {
            return None;
        }
        // SAFETY: in bounds of the live mapping; the slice borrows `self`.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) })
    }

    /// Mutable bytes `[off, off + len)`. The caller (a memory region
    /// handle borrowed mutably) guarantees no other slice of this range
    /// exists in this process.
    #[allow(clippy::mut_from_ref)]
    pub fn slice_mut(&self, off: usize, len: usize) -> Option<&mut [u8]> {
        if !self.in_bounds(off, len) {
            return None;
        }
        // SAFETY: in bounds of the live mapping; exclusive within this
        // process by the caller's contract (regions do not overlap and a
        // region hands out its slice only through `&mut self`).
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) })
    }
}

impl crate::abi::SharedMem for Segment {
    fn load_acquire(&self, off: usize) -> u32 {
        self.word(off).map_or(0, |w| w.load(Ordering::Acquire))
    }

    fn store_release(&self, off: usize, v: u32) {
        if let Some(w) = self.word(off) {
            w.store(v, Ordering::Release);
        }
    }

    fn swap(&self, off: usize, v: u32) -> u32 {
        self.word(off).map_or(0, |w| w.swap(v, Ordering::SeqCst))
    }

    fn fetch_or(&self, off: usize, v: u32) -> u32 {
        self.word(off)
            .map_or(0, |w| w.fetch_or(v, Ordering::SeqCst))
    }

    fn read_bytes(&self, off: usize, dst: &mut [u8]) {
        self.read(off, dst)
    }

    fn write_bytes(&self, off: usize, src: &[u8]) {
        self.write(off, src)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map` with this length and no
        // reference into it outlives `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::SharedMem;

    #[test]
    fn two_mappings_of_one_memfd_see_each_others_writes() {
        let (a, fd) = Segment::create("test", 8192, false).unwrap();
        let b = Segment::map(&fd, 8192).unwrap();
        a.write(100, b"hello");
        let mut got = [0u8; 5];
        b.read(100, &mut got);
        assert_eq!(&got, b"hello");
        b.store_release(64, 7);
        assert_eq!(a.load_acquire(64), 7);
    }

    #[test]
    fn out_of_bounds_access_is_harmless() {
        let (a, _fd) = Segment::create("test", 4096, false).unwrap();
        let mut got = [1u8; 8];
        a.read(4092, &mut got);
        assert_eq!(got, [0; 8]);
        a.write(usize::MAX - 2, b"abc");
        assert_eq!(a.load_acquire(4096), 0);
        assert_eq!(a.load_acquire(3), 0, "unaligned");
        assert!(a.slice(4000, 97).is_none());
        assert!(Segment::create("x", 0, false).is_err());
    }
}
