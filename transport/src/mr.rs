//! Memory regions: registration gives an L_Key and an R_Key, access flags
//! and bounds; every local and remote access is checked here before the
//! engine touches memory through [`Memory`].
//!
//! The bytes themselves live behind the [`Memory`] trait, addressed by
//! *device address*, so that the dataplane can back regions with shared
//! memory and tests with `Vec`s. A region maps its virtual addresses (the
//! ones in work requests and on the wire: the application's own, as
//! `ibv_reg_mr` gives them) to device addresses linearly; the checks below
//! return the device address of the range they allowed. A region
//! registered without a device base maps every address to itself.

/// What a region allows (local read is always allowed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    pub local_write: bool,
    pub remote_write: bool,
    pub remote_read: bool,
    pub remote_atomic: bool,
}

impl Access {
    /// Everything.
    pub const ALL: Access = Access {
        local_write: true,
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
}

/// Keys of a registered region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
}

/// Why an access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MrError {
    #[error("unknown key {0:#x}")]
    UnknownKey(u32),
    #[error("range [{va:#x}, +{len}) is outside the region [{base:#x}, +{size})")]
    OutOfBounds {
        va: u64,
        len: u64,
        base: u64,
        size: u64,
    },
    #[error("the region does not grant {0}")]
    AccessDenied(&'static str),
    #[error("region of {0} bytes at {1:#x} wraps the address space")]
    BadRange(u64, u64),
    #[error("too many regions (at most {0})")]
    TableFull(usize),
}

/// A protection domain: a QP reaches only the regions of its own PD, locally
/// and from the peer, so that applications sharing a NIC cannot reach each
/// other's memory.
pub type Pd = u32;

/// The PD of regions and QPs created without naming one.
pub const DEFAULT_PD: Pd = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    pd: Pd,
    base: u64,
    len: u64,
    access: Access,
    keys: MrKeys,
    /// The device address of `base`.
    dev: u64,
}

impl Region {
    /// The device address of `va` (inside the region).
    fn dev_addr(&self, va: u64) -> u64 {
        self.dev.wrapping_add(va - self.base)
    }
}

/// The regions of one engine (one NIC).
#[derive(Debug, Default)]
pub struct MrTable {
    regions: Vec<Option<Region>>,
    generation: u32,
}

/// Regions per engine; a key's low bits index the table.
pub const MAX_MRS: usize = 1 << 16;

impl MrTable {
    pub fn new() -> Self {
        MrTable::default()
    }

    /// Registers `[base, base + len)` with `access`. Keys differ for every
    /// registration (an index in the low 16 bits, a generation above), so a
    /// stale key of a deregistered region is refused.
    pub fn register(&mut self, base: u64, len: u64, access: Access) -> Result<MrKeys, MrError> {
        self.register_in(DEFAULT_PD, base, len, access)
    }

    /// Registers a region that only QPs of protection domain `pd` reach.
    pub fn register_in(
        &mut self,
        pd: Pd,
        base: u64,
        len: u64,
        access: Access,
    ) -> Result<MrKeys, MrError> {
        self.register_at(pd, base, len, access, base)
    }

    /// Registers `[base, base + len)` of protection domain `pd` whose
    /// bytes are at device addresses `[dev, dev + len)` (an application's
    /// own memory, mapped by the dataplane somewhere else).
    pub fn register_at(
        &mut self,
        pd: Pd,
        base: u64,
        len: u64,
        access: Access,
        dev: u64,
    ) -> Result<MrKeys, MrError> {
        if base.checked_add(len).is_none() {
            return Err(MrError::BadRange(len, base));
        }
        if dev.checked_add(len).is_none() {
            return Err(MrError::BadRange(len, dev));
        }
        let slot = match self.regions.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.regions.len() < MAX_MRS => {
                self.regions.push(None);
                self.regions.len() - 1
            }
            None => return Err(MrError::TableFull(MAX_MRS)),
        };
        self.generation = self.generation.wrapping_add(1) & 0x7fff;
        let lkey = (self.generation << 16) | slot as u32;
        let keys = MrKeys {
            lkey,
            rkey: lkey | 0x8000_0000,
        };
        self.regions[slot] = Some(Region {
            pd,
            base,
            len,
            access,
            keys,
            dev,
        });
        Ok(keys)
    }

    /// Deregisters the region with this L_Key.
    pub fn deregister(&mut self, lkey: u32) -> Result<(), MrError> {
        let slot = (lkey & 0xffff) as usize;
        match self.regions.get(slot).copied().flatten() {
            Some(r) if r.keys.lkey == lkey => {
                self.regions[slot] = None;
                Ok(())
            }
            _ => Err(MrError::UnknownKey(lkey)),
        }
    }

    /// The checks as seen by QPs of protection domain `pd`: a key of
    /// another PD is unknown to them.
    pub fn pd(&self, pd: Pd) -> MrView<'_> {
        MrView { table: self, pd }
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.regions.iter().filter(|r| r.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks a local access of the default PD (see [`MrView::check_local`]).
    pub fn check_local(&self, lkey: u32, va: u64, len: u64, write: bool) -> Result<u64, MrError> {
        self.pd(DEFAULT_PD).check_local(lkey, va, len, write)
    }

    /// Checks a remote access of the default PD (see [`MrView::check_remote`]).
    pub fn check_remote(&self, rkey: u32, va: u64, len: u64, write: bool) -> Result<u64, MrError> {
        self.pd(DEFAULT_PD).check_remote(rkey, va, len, write)
    }
}

/// The regions of one protection domain.
#[derive(Debug, Clone, Copy)]
pub struct MrView<'a> {
    table: &'a MrTable,
    pd: Pd,
}

impl MrView<'_> {
    fn find(&self, key: u32, remote: bool) -> Result<Region, MrError> {
        let slot = (key & 0xffff) as usize;
        match self.table.regions.get(slot).copied().flatten() {
            Some(r)
                if r.pd == self.pd && (if remote { r.keys.rkey } else { r.keys.lkey }) == key =>
            {
                Ok(r)
            }
            _ => Err(MrError::UnknownKey(key)),
        }
    }

    fn bounds(r: &Region, va: u64, len: u64) -> Result<(), MrError> {
        let end = va.checked_add(len);
        if va < r.base || end.is_none_or(|e| e > r.base + r.len) {
            return Err(MrError::OutOfBounds {
                va,
                len,
                base: r.base,
                size: r.len,
            });
        }
        Ok(())
    }

    /// Checks a local access by the requester (a WQE's scatter/gather
    /// entry); `write` for READ targets. Returns the device address of
    /// `va`.
    pub fn check_local(&self, lkey: u32, va: u64, len: u64, write: bool) -> Result<u64, MrError> {
        let r = self.find(lkey, false)?;
        Self::bounds(&r, va, len)?;
        if write && !r.access.local_write {
            return Err(MrError::AccessDenied("local write"));
        }
        Ok(r.dev_addr(va))
    }

    /// Checks a remote atomic on the 8 bytes at `va`: R_Key, bounds and
    /// the remote-atomic right (alignment is the responder's check).
    /// Returns the device address of `va`.
    pub fn check_remote_atomic(&self, rkey: u32, va: u64) -> Result<u64, MrError> {
        let r = self.find(rkey, true)?;
        Self::bounds(&r, va, 8)?;
        if !r.access.remote_atomic {
            return Err(MrError::AccessDenied("remote atomic"));
        }
        Ok(r.dev_addr(va))
    }

    /// Checks a remote access (R_Key, bounds, right) by the responder.
    /// Returns the device address of `va`.
    pub fn check_remote(&self, rkey: u32, va: u64, len: u64, write: bool) -> Result<u64, MrError> {
        let r = self.find(rkey, true)?;
        Self::bounds(&r, va, len)?;
        match (write, r.access) {
            (true, a) if !a.remote_write => Err(MrError::AccessDenied("remote write")),
            (false, a) if !a.remote_read => Err(MrError::AccessDenied("remote read")),
            _ => Ok(r.dev_addr(va)),
        }
    }
}

/// The bytes of registered regions, addressed by device address (what
/// the [`MrTable`] checks return). The engine checks every access first,
/// so an implementation only maps addresses to storage.
pub trait Memory {
    /// Copies `dst.len()` bytes at `va` into `dst` (an empty `dst` may come
    /// with any `va` and must be a no-op).
    fn read(&self, va: u64, dst: &mut [u8]);
    /// Copies `src` to `va` (empty `src`: no-op, any `va`).
    fn write(&mut self, va: u64, src: &[u8]);
    /// The `len` bytes at `va` where they lie, for a frame sent from them
    /// without a copy; `None` (the default) where memory cannot be lent
    /// out, and the frame is copied with [`Memory::read`].
    fn bytes(&self, va: u64, len: usize) -> Option<&[u8]> {
        let _ = (va, len);
        None
    }
    /// Runs `op` on the 8-byte value (host byte order) at `va`, 8-byte
    /// aligned, and returns the value it held before. The engine runs every
    /// atomic of its QPs one at a time; memory another agent may change at
    /// once (shared with applications) overrides this with a hardware
    /// atomic.
    fn atomic(&mut self, va: u64, op: AtomicOp) -> u64 {
        let mut b = [0u8; 8];
        self.read(va, &mut b);
        let old = u64::from_ne_bytes(b);
        self.write(va, &op.apply(old).to_ne_bytes());
        old
    }
}

/// An 8-byte atomic operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Write `swap` if the value equals `compare`.
    CmpSwap { compare: u64, swap: u64 },
    /// Add `add` (wrapping).
    FetchAdd { add: u64 },
}

impl AtomicOp {
    /// The new value of `old`.
    pub const fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::CmpSwap { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            AtomicOp::FetchAdd { add } => old.wrapping_add(add),
        }
    }
}

/// Memory made of `Vec`s, one per region, for tests and the simulator.
#[derive(Debug, Default, Clone)]
pub struct VecMemory {
    blocks: Vec<(u64, Vec<u8>)>,
}

impl VecMemory {
    pub fn new() -> Self {
        VecMemory::default()
    }

    /// Adds `len` zero bytes at `base` (regions must not overlap).
    pub fn add(&mut self, base: u64, len: usize) {
        self.blocks.push((base, vec![0; len]));
    }

    fn block(&self, va: u64, len: usize) -> Option<(usize, usize)> {
        self.blocks
            .iter()
            .position(|(b, v)| va >= *b && va - b + len as u64 <= v.len() as u64)
            .map(|i| (i, (va - self.blocks[i].0) as usize))
    }

    /// The bytes at `[va, va + len)`; panics outside any block (tests only).
    pub fn slice(&self, va: u64, len: usize) -> &[u8] {
        let (i, off) = self.block(va, len).expect("address inside a block");
        &self.blocks[i].1[off..off + len]
    }

    /// Mutable bytes at `[va, va + len)`; panics outside any block.
    pub fn slice_mut(&mut self, va: u64, len: usize) -> &mut [u8] {
        let (i, off) = self.block(va, len).expect("address inside a block");
        &mut self.blocks[i].1[off..off + len]
    }
}

impl Memory for VecMemory {
    fn read(&self, va: u64, dst: &mut [u8]) {
        if !dst.is_empty() {
            dst.copy_from_slice(self.slice(va, dst.len()));
        }
    }

    fn write(&mut self, va: u64, src: &[u8]) {
        if !src.is_empty() {
            self.slice_mut(va, src.len()).copy_from_slice(src);
        }
    }

    fn bytes(&self, va: u64, len: usize) -> Option<&[u8]> {
        let (i, off) = self.block(va, len)?;
        self.blocks[i].1.get(off..off + len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_bounds_and_rights_are_checked() {
        let mut t = MrTable::new();
        let ro = Access {
            remote_read: true,
            ..Access::default()
        };
        let k = t.register(0x1000, 0x100, ro).unwrap();
        assert!(t.check_remote(k.rkey, 0x1000, 0x100, false).is_ok());
        assert_eq!(
            t.check_remote(k.rkey, 0x1000, 1, true),
            Err(MrError::AccessDenied("remote write"))
        );
        assert!(matches!(
            t.check_remote(k.rkey, 0x10ff, 2, false),
            Err(MrError::OutOfBounds { .. })
        ));
        assert!(matches!(
            t.check_remote(k.rkey, 0xfff, 1, false),
            Err(MrError::OutOfBounds { .. })
        ));
        assert_eq!(
            t.check_remote(k.lkey, 0x1000, 1, false),
            Err(MrError::UnknownKey(k.lkey))
        );
        assert_eq!(
            t.check_local(k.rkey, 0x1000, 1, false),
            Err(MrError::UnknownKey(k.rkey))
        );
        assert_eq!(
            t.check_local(k.lkey, 0x1000, 1, true),
            Err(MrError::AccessDenied("local write"))
        );
        assert!(
            t.check_remote(k.rkey, u64::MAX, 2, false).is_err(),
            "no overflow"
        );
    }

    #[test]
    fn stale_keys_are_refused_after_deregistration() {
        let mut t = MrTable::new();
        let a = t.register(0, 10, Access::ALL).unwrap();
        t.deregister(a.lkey).unwrap();
        let b = t.register(0, 10, Access::ALL).unwrap();
        assert_ne!(a, b);
        assert!(t.check_remote(a.rkey, 0, 1, true).is_err());
        assert!(t.check_remote(b.rkey, 0, 1, true).is_ok());
        assert_eq!(t.deregister(a.lkey), Err(MrError::UnknownKey(a.lkey)));
    }

    #[test]
    fn a_region_is_reached_only_from_its_protection_domain() {
        let mut t = MrTable::new();
        let a = t.register_in(7, 0x1000, 0x100, Access::ALL).unwrap();
        assert!(t.pd(7).check_remote(a.rkey, 0x1000, 1, true).is_ok());
        assert!(t.pd(7).check_local(a.lkey, 0x1000, 1, true).is_ok());
        assert_eq!(
            t.pd(8).check_remote(a.rkey, 0x1000, 1, true),
            Err(MrError::UnknownKey(a.rkey))
        );
        assert_eq!(
            t.pd(8).check_local(a.lkey, 0x1000, 1, false),
            Err(MrError::UnknownKey(a.lkey))
        );
        assert!(
            t.check_local(a.lkey, 0x1000, 1, false).is_err(),
            "default PD"
        );
    }

    #[test]
    fn zero_length_access_at_the_end_is_in_bounds() {
        let mut t = MrTable::new();
        let k = t.register(100, 10, Access::ALL).unwrap();
        assert!(t.check_remote(k.rkey, 110, 0, true).is_ok());
        assert!(t.check_remote(k.rkey, 111, 0, true).is_err());
    }
}
