//! Memory the mbufs of a frame may point into without owning it: an
//! application's shared segment, from which a frame's payload is sent
//! where it lies (zero-copy TX) instead of being copied into the frame.
//!
//! An [`ExtMemory`] holds DPDK's shared-info block for one mapping and
//! the mapping itself. Each mbuf attached to it takes a reference in the
//! block's counter; the owner holds one more until it lets go
//! ([`ExtMemory`]'s Drop). The last reference to go, an mbuf freed by
//! whichever thread or driver frees it or the owner, frees the block and
//! with it the mapping: a segment stays mapped while any frame still
//! points into it, whatever the application does meanwhile.

use std::any::Any;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use dpdk_sys::rte_mbuf_ext_shared_info;

/// References to one mapping at most: DPDK's counter is 16 bits, and a
/// pool larger than this (or frames held by a fault's delay) must not
/// wrap it; past it, payloads are copied.
pub const MAX_REFS: u16 = 1 << 15;

/// DPDK's shared-info block and the mapping it keeps alive; on the heap,
/// at an address that does not move, freed by the last reference. The
/// shared info comes first: DPDK's pointer to it is the block's.
#[repr(C)]
struct Block {
    shinfo: rte_mbuf_ext_shared_info,
    /// `[base, base + len)`: the mapping's bytes.
    base: usize,
    len: usize,
    _keep: Arc<dyn Any + Send + Sync>,
}

/// A mapping frames may point into, kept mapped until its last frame is
/// freed.
pub struct ExtMemory {
    block: NonNull<Block>,
}

// SAFETY: the block's fields are immutable after creation and what it
// keeps alive is Send + Sync; it is freed once, by whoever drops the last
// reference (a reference per mbuf, which any thread may free, and one for
// this owner). Not Sync: DPDK updates the counter without an atomic while
// it reads 1 (only the owner's reference), so references are taken by one
// thread, the owner's, at a time.
unsafe impl Send for ExtMemory {}

/// Called by DPDK when the last mbuf attached to the block is freed after
/// the owner let go: frees the block, and with it the mapping.
unsafe extern "C" fn free_block(_addr: *mut c_void, opaque: *mut c_void) {
    // SAFETY: `opaque` is the block's own address, leaked from a Box by
    // `ExtMemory::new`; the counter reached zero, so nobody refers to it
    // any more and this is the one call that frees it.
    drop(unsafe { Box::from_raw(opaque as *mut Block) });
}

impl ExtMemory {
    /// The `len` bytes at `base`, mapped as long as `keep` lives.
    ///
    /// # Safety
    /// `[base, base + len)` must stay mapped and readable while `keep` is
    /// alive.
    pub unsafe fn new(base: *const u8, len: usize, keep: Arc<dyn Any + Send + Sync>) -> Self {
        let block = Box::into_raw(Box::new(Block {
            shinfo: rte_mbuf_ext_shared_info::default(),
            base: base as usize,
            len,
            _keep: keep,
        }));
        // SAFETY: `block` is a valid, exclusively owned heap block; its
        // shared info gets the callback, its own address as the callback's
        // argument, and the owner's reference (1).
        unsafe {
            dpdk_sys::rnic_ext_shinfo_init(
                &mut (*block).shinfo,
                Some(free_block),
                block as *mut c_void,
            );
        }
        ExtMemory {
            // SAFETY: Box::into_raw never returns null.
            block: unsafe { NonNull::new_unchecked(block) },
        }
    }

    /// Whether `bytes` lie inside this mapping.
    pub fn contains(&self, bytes: &[u8]) -> bool {
        // SAFETY: the block lives while this owner does.
        let b = unsafe { self.block.as_ref() };
        let at = bytes.as_ptr() as usize;
        at >= b.base && at - b.base + bytes.len() <= b.len
    }

    /// The shared info to attach an mbuf to, with a reference taken for
    /// it (given back by DPDK when the mbuf is freed); `None` when
    /// [`MAX_REFS`] are out (the 16-bit counter must not wrap).
    pub(crate) fn take_ref(&self) -> Option<*mut rte_mbuf_ext_shared_info> {
        let shinfo = self.block.as_ptr() as *mut rte_mbuf_ext_shared_info;
        // SAFETY: the block (whose first field is the shared info) lives
        // while this owner does. The counter is read and updated
        // atomically while other references exist; while it reads 1 only
        // this owner's exists, no mbuf can change it, and this owner is
        // not shared between threads (not Sync).
        unsafe {
            if dpdk_sys::rnic_ext_refcnt_read(shinfo) >= MAX_REFS {
                return None;
            }
            dpdk_sys::rnic_ext_refcnt_update(shinfo, 1);
        }
        Some(shinfo)
    }
}

impl ExtMemory {
    /// Gives back a reference [`ExtMemory::take_ref`] took and no mbuf
    /// holds.
    pub(crate) fn give_back(&self, shinfo: *mut rte_mbuf_ext_shared_info) {
        // SAFETY: `shinfo` is this block's, with the reference being given
        // back still counted, so the count stays at least 1 (the owner's).
        unsafe { dpdk_sys::rnic_ext_refcnt_update(shinfo, -1) };
    }
}

impl Drop for ExtMemory {
    fn drop(&mut self) {
        let shinfo = self.block.as_ptr() as *mut rte_mbuf_ext_shared_info;
        // SAFETY: gives back the owner's reference; when it was the last,
        // no mbuf refers to the block and it is freed here, once (DPDK
        // calls the callback only when an mbuf's release reaches zero).
        unsafe {
            if dpdk_sys::rnic_ext_refcnt_update(shinfo, -1) == 0 {
                drop(Box::from_raw(self.block.as_ptr()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_lives_until_the_owner_and_every_reference_let_go() {
        // 128 bytes, of which the mapping covers the first 64.
        let data = Arc::new(vec![7u8; 128]);
        let weak = Arc::downgrade(&data);
        let base = data.as_ptr();
        // SAFETY: the Vec's bytes live as long as the Arc kept.
        let ext = unsafe { ExtMemory::new(base, 64, data) };
        // SAFETY: 64 and 65 bytes of the Vec's 128, alive while `ext`
        // holds the Arc (until it is dropped below).
        let (whole, longer) = unsafe {
            (
                std::slice::from_raw_parts(base, 64),
                std::slice::from_raw_parts(base, 65),
            )
        };
        assert!(ext.contains(whole));
        assert!(!ext.contains(longer));
        let shinfo = ext.take_ref().expect("a reference");
        // As many references out as the cap allows: no more are taken,
        // the 16-bit counter never wraps.
        // SAFETY: `shinfo` is the live shared info `take_ref` returned.
        unsafe { dpdk_sys::rnic_ext_refcnt_update(shinfo, (MAX_REFS - 2) as i16) };
        assert!(ext.take_ref().is_none(), "past the cap");
        for _ in 0..MAX_REFS - 2 {
            ext.give_back(shinfo);
        }
        assert!(ext.take_ref().is_some(), "under it again");
        ext.give_back(shinfo);
        drop(ext);
        assert!(weak.upgrade().is_some(), "an mbuf's reference keeps it");
        // What DPDK does when that mbuf is freed.
        // SAFETY: `shinfo` is still alive (one reference is out); its free
        // callback is the one ExtMemory set, called once, at zero.
        unsafe {
            if dpdk_sys::rnic_ext_refcnt_update(shinfo, -1) == 0 {
                let s = &*shinfo;
                (s.free_cb.unwrap())(std::ptr::null_mut(), s.fcb_opaque);
            }
        }
        assert!(weak.upgrade().is_none(), "freed with the last reference");
    }
}
