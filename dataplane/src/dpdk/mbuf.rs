//! Mempools and owned mbufs.

use std::ffi::CString;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use dpdk_sys::{rte_mbuf, rte_mempool};

use super::{DpdkError, Eal, ExtMemory};

/// A packet-mbuf pool; freed on Drop (every mbuf from it must be gone).
#[derive(Debug)]
pub struct Mempool {
    ptr: NonNull<rte_mempool>,
}

impl Mempool {
    /// `n` mbufs of the default data room (2 KiB + headroom).
    pub fn new(eal: &Eal, name: &str, n: u32, socket: i32) -> Result<Mempool, DpdkError> {
        Self::with_frames(eal, name, n, socket, 2048)
    }

    /// `n` mbufs whose data room holds a frame of `frame` bytes (at least
    /// the default 2 KiB) after the headroom: one segment per frame even
    /// at a 4096-byte path MTU.
    pub fn with_frames(
        _eal: &Eal,
        name: &str,
        n: u32,
        socket: i32,
        frame: usize,
    ) -> Result<Mempool, DpdkError> {
        let room = frame.max(2048) + dpdk_sys::consts::PKTMBUF_HEADROOM as usize;
        let room = u16::try_from(room).map_err(|_| DpdkError {
            what: "rte_pktmbuf_pool_create".into(),
            reason: format!("frames of {frame} bytes do not fit an mbuf (at most 65535)"),
        })?;
        let cname = CString::new(name).map_err(|_| DpdkError {
            what: "rte_pktmbuf_pool_create".into(),
            reason: format!("pool name {name:?} contains a NUL byte"),
        })?;
        // SAFETY: the EAL is initialised; the name is a valid C string that
        // DPDK copies.
        let p = unsafe {
            dpdk_sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, 64.min(n / 2), 0, room, socket)
        };
        NonNull::new(p)
            .map(|ptr| Mempool { ptr })
            .ok_or_else(|| DpdkError::last(format!("rte_pktmbuf_pool_create {name}"), 0))
    }

    pub(crate) fn as_ptr(&self) -> *mut rte_mempool {
        self.ptr.as_ptr()
    }

    /// A fresh, empty mbuf, or `None` when the pool is exhausted.
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is valid for our lifetime.
        let m = unsafe { dpdk_sys::rnic_pktmbuf_alloc(self.ptr.as_ptr()) };
        NonNull::new(m).map(|ptr| Mbuf { ptr })
    }

    /// Appends `n` (at most [`BULK`]) fresh, empty mbufs to `out`, all or
    /// none (one trip to the pool's cache for all of them); whether it did.
    pub fn alloc_bulk(&self, out: &mut Vec<Mbuf>, n: usize) -> bool {
        let n = n.min(BULK);
        let mut raw = [MaybeUninit::<*mut rte_mbuf>::uninit(); BULK];
        // SAFETY: the pool is valid for our lifetime; `raw` has room for
        // the n pointers DPDK writes (all of them, or none on failure).
        let r = unsafe {
            dpdk_sys::rnic_pktmbuf_alloc_bulk(self.ptr.as_ptr(), raw.as_mut_ptr().cast(), n as u32)
        };
        if r != 0 {
            return false;
        }
        for m in &raw[..n] {
            // SAFETY: on success DPDK wrote n mbufs, now ours alone.
            if let Some(ptr) = NonNull::new(unsafe { m.assume_init() }) {
                out.push(Mbuf { ptr });
            }
        }
        true
    }

    /// Mbufs taken from the pool and not yet returned.
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is valid.
        unsafe { dpdk_sys::rte_mempool_in_use_count(self.ptr.as_ptr()) }
    }
}

// SAFETY: rte_mempool get/put are multi-producer/multi-consumer safe by
// default (the pool is created without single-producer/consumer flags), so
// several threads may allocate from and free to one pool.
unsafe impl Sync for Mempool {}
// SAFETY: the pool is not tied to the creating thread.
unsafe impl Send for Mempool {}

impl Drop for Mempool {
    fn drop(&mut self) {
        // SAFETY: the pool is valid and, by contract, no mbuf of it lives on.
        unsafe { dpdk_sys::rte_mempool_free(self.ptr.as_ptr()) }
    }
}

/// One owned mbuf (a single segment, or the chain of a frame sent from
/// where its payload lies), returned to its pool on Drop.
#[derive(Debug)]
pub struct Mbuf {
    ptr: NonNull<rte_mbuf>,
}

// SAFETY: an Mbuf is uniquely owned; DPDK mbufs may be freed from any
// thread (the mempool's cache is per lcore, and rte_pktmbuf_free on a
// non-EAL thread goes to the shared ring).
unsafe impl Send for Mbuf {}

/// Most mbufs fetched or freed in one bulk call.
pub const BULK: usize = 32;

impl Mbuf {
    /// Frees every mbuf of `frames`, leaving it empty, up to [`BULK`] per
    /// call into DPDK (each returned to its own pool, chains and attached
    /// buffers too, as [`Drop`] does one by one).
    pub fn free_bulk(frames: &mut Vec<Mbuf>) {
        let mut raw = [MaybeUninit::<*mut rte_mbuf>::uninit(); BULK];
        while !frames.is_empty() {
            let n = frames.len().min(BULK);
            let at = frames.len() - n;
            for (slot, m) in raw.iter_mut().zip(frames.drain(at..)) {
                slot.write(m.into_raw());
            }
            // SAFETY: raw[..n] hold mbufs we owned and gave up above; DPDK
            // frees each exactly once.
            unsafe { dpdk_sys::rte_pktmbuf_free_bulk(raw.as_mut_ptr().cast(), n as u32) };
        }
    }

    /// Takes ownership of a raw mbuf from an RX burst.
    ///
    /// # Safety
    /// `ptr` must be a valid mbuf that nobody else will free.
    pub(crate) unsafe fn from_raw(ptr: NonNull<rte_mbuf>) -> Mbuf {
        Mbuf { ptr }
    }

    /// Gives up ownership (for a TX burst, which frees it).
    pub(crate) fn into_raw(self) -> *mut rte_mbuf {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The first segment's data pointer and length. The fields are read
    /// here rather than through DPDK's inline functions in the C shim (a
    /// call per access, on every frame several times): the pointer is
    /// `buf_addr + data_off`, as `rte_pktmbuf_mtod` computes it.
    #[inline]
    fn seg(&self) -> (*mut u8, usize) {
        // SAFETY: reads fields of our own valid mbuf.
        unsafe {
            let m = &*self.ptr.as_ptr();
            let p = (m.buf_addr as *mut u8).add(usize::from(m.data_off));
            (p, usize::from(m.data_len))
        }
    }

    /// The packet bytes (of the first segment: ours are single-segment).
    #[inline]
    pub fn data(&self) -> &[u8] {
        let (p, len) = self.seg();
        // SAFETY: `p` points at `data_len` initialised bytes inside the
        // mbuf's buffer, which we own for the borrow's duration.
        unsafe { std::slice::from_raw_parts(p, len) }
    }

    /// The packet bytes, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (p, len) = self.seg();
        // SAFETY: as `data`, and the mbuf is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// Appends `len` bytes and returns them for writing; `None` when the
    /// tailroom is too small.
    #[inline]
    pub fn append(&mut self, len: usize) -> Option<&mut [u8]> {
        let len16 = u16::try_from(len).ok()?;
        // SAFETY: we own the mbuf mutably. A single-segment mbuf grows in
        // place within its buffer (what rte_pktmbuf_append does to its last
        // segment): the tailroom is checked first, both lengths grow, and
        // the bytes returned lie inside the buffer past the old data.
        unsafe {
            let m = &mut *self.ptr.as_ptr();
            if m.nb_segs != 1 {
                let p = dpdk_sys::rnic_pktmbuf_append(m, len16);
                if p.is_null() {
                    return None;
                }
                return Some(std::slice::from_raw_parts_mut(p as *mut u8, len));
            }
            let used = usize::from(m.data_off) + usize::from(m.data_len);
            if used + len > usize::from(m.buf_len) {
                return None;
            }
            let p = (m.buf_addr as *mut u8).add(used);
            m.data_len += len16;
            m.pkt_len += u32::from(len16);
            Some(std::slice::from_raw_parts_mut(p, len))
        }
    }

    /// Removes `len` bytes from the end of the packet; false (nothing
    /// removed) when the packet is shorter.
    #[inline]
    pub fn trim(&mut self, len: usize) -> bool {
        let Ok(len16) = u16::try_from(len) else {
            return false;
        };
        // SAFETY: we own the mbuf mutably; a single segment shortens in
        // place (both lengths, checked first), others go to DPDK.
        unsafe {
            let m = &mut *self.ptr.as_ptr();
            if m.nb_segs != 1 {
                return dpdk_sys::rnic_pktmbuf_trim(m, len16) == 0;
            }
            if len16 > m.data_len {
                return false;
            }
            m.data_len -= len16;
            m.pkt_len -= u32::from(len16);
            true
        }
    }

    /// Segments in the chain.
    #[inline]
    pub fn segments(&self) -> u16 {
        // SAFETY: reads a field of our mbuf.
        unsafe { (*self.ptr.as_ptr()).nb_segs }
    }

    /// The payload and tail segments of a three-segment chain (the frame
    /// of a payload sent from where it lies: headers, payload, tail).
    pub fn rest(&self) -> Option<(&[u8], &[u8])> {
        if self.segments() != 3 {
            return None;
        }
        // SAFETY: a chain of three segments: `next` of the first two is a
        // valid mbuf of the chain, owned with it, whose `data_len` bytes
        // from `buf_addr + data_off` are initialised, for the borrow of
        // `self`.
        unsafe {
            let m = &*self.ptr.as_ptr();
            let p = &*m.next;
            let t = &*p.next;
            let seg = |s: &rte_mbuf| {
                std::slice::from_raw_parts(
                    (s.buf_addr as *const u8).add(usize::from(s.data_off)),
                    usize::from(s.data_len),
                )
            };
            Some((seg(p), seg(t)))
        }
    }

    /// Copies a chain's later segments into the first (freeing them);
    /// false, the chain unchanged, when the first has not the room.
    pub fn linearize(&mut self) -> bool {
        if self.segments() == 1 {
            return true;
        }
        // SAFETY: our own mbuf chain; DPDK checks the room first.
        unsafe { dpdk_sys::rnic_pktmbuf_linearize(self.ptr.as_ptr()) == 0 }
    }

    /// Appends `payload`, which lies in `ext`, as a segment that points at
    /// it, then `tail` in a segment of its own: a chain of three. False,
    /// the mbuf unchanged, when it is chained already, `payload` is not
    /// inside `ext` or longer than a segment, or the pool has no mbuf.
    pub fn chain_external(&mut self, ext: &ExtMemory, payload: &[u8], tail: &[u8]) -> bool {
        let Ok(len) = u16::try_from(payload.len()) else {
            return false;
        };
        if self.segments() != 1 || !ext.contains(payload) {
            return false;
        }
        let Some(shinfo) = ext.take_ref() else {
            return false;
        };
        let head = self.ptr.as_ptr();
        // SAFETY: `head` is our own single-segment mbuf; the two new mbufs
        // come from its pool and are ours until chained into it (or freed
        // by Drop on failure). The payload segment points at `payload`,
        // inside `ext`, with a reference taken on `ext` for it, which DPDK
        // gives back (through the shared info's counter) when the segment
        // is freed: the bytes stay mapped while it lives. Chaining moves
        // both into the chain, freed with the head.
        unsafe {
            let pay = NonNull::new(dpdk_sys::rnic_pktmbuf_alloc_like(head)).map(|ptr| Mbuf { ptr });
            let tl = NonNull::new(dpdk_sys::rnic_pktmbuf_alloc_like(head)).map(|ptr| Mbuf { ptr });
            let (Some(pay), Some(mut tl)) = (pay, tl) else {
                ext.give_back(shinfo);
                return false;
            };
            match tl.append(tail.len()) {
                Some(dst) => dst.copy_from_slice(tail),
                None => {
                    ext.give_back(shinfo);
                    return false;
                }
            }
            let p = pay.ptr.as_ptr();
            // From here the reference is the segment's.
            dpdk_sys::rnic_pktmbuf_attach_extbuf(
                p,
                payload.as_ptr() as *mut std::ffi::c_void,
                len,
                shinfo,
            );
            (*p).data_len = len;
            (*p).pkt_len = u32::from(len);
            // Chaining fails only past DPDK's segment limit, far above
            // three; then the segments go back (the reference with them).
            let (p, t) = (pay.into_raw(), tl.into_raw());
            if dpdk_sys::rnic_pktmbuf_chain(p, t) != 0 {
                dpdk_sys::rnic_pktmbuf_free(p);
                dpdk_sys::rnic_pktmbuf_free(t);
                return false;
            }
            if dpdk_sys::rnic_pktmbuf_chain(head, p) != 0 {
                dpdk_sys::rnic_pktmbuf_free(p);
                return false;
            }
        }
        true
    }

    /// Whether the NIC flagged the frame's IPv4 checksum bad (with the RX
    /// checksum offload enabled).
    pub fn ip_checksum_bad(&self) -> bool {
        // SAFETY: reads a field of our mbuf.
        let flags = unsafe { (*self.ptr.as_ptr()).ol_flags };
        flags & dpdk_sys::consts::MBUF_F_RX_IP_CKSUM_MASK
            == dpdk_sys::consts::MBUF_F_RX_IP_CKSUM_BAD
    }

    /// The data and packet lengths as DPDK's own accessors read them
    /// (for tests that check this wrapper's field arithmetic against them).
    #[doc(hidden)]
    pub fn dpdk_lengths(&self) -> (usize, usize, usize) {
        // SAFETY: reads fields of our mbuf through DPDK's inline functions.
        unsafe {
            let m = self.ptr.as_ptr();
            (
                usize::from(dpdk_sys::rnic_pktmbuf_data_len(m)),
                dpdk_sys::rnic_pktmbuf_pkt_len(m) as usize,
                usize::from(dpdk_sys::rnic_pktmbuf_tailroom(m)),
            )
        }
    }

    /// Bytes that can still be appended (to the last segment).
    #[inline]
    pub fn tailroom(&self) -> usize {
        // SAFETY: reads fields of our mbuf (a multi-segment one through
        // DPDK, which finds the last segment).
        unsafe {
            let m = &*self.ptr.as_ptr();
            if m.nb_segs != 1 {
                return usize::from(dpdk_sys::rnic_pktmbuf_tailroom(self.ptr.as_ptr()));
            }
            usize::from(m.buf_len).saturating_sub(usize::from(m.data_off) + usize::from(m.data_len))
        }
    }
}

impl AsRef<[u8]> for Mbuf {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

impl AsMut<[u8]> for Mbuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.data_mut()
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf; it goes back to its pool exactly once.
        unsafe { dpdk_sys::rnic_pktmbuf_free(self.ptr.as_ptr()) }
    }
}
