//! Scatter/gather lists: the local buffers of a work request (send, RDMA
//! READ target, atomic result, receive), and how a message offset maps onto
//! them. Every piece is checked against the regions before memory is
//! touched.

use crate::mr::{Memory, MrError, MrView};

/// Scatter/gather entries a work request may carry (max_send_sge and
/// max_recv_sge).
pub const MAX_SGE: usize = 16;

/// One scatter/gather entry: VA, L_Key and length of a local buffer (16
/// bytes, the layout of an entry in a shared-memory WQE).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Sge {
    pub va: u64,
    pub lkey: u32,
    pub len: u32,
}

/// Up to [`MAX_SGE`] entries, stored in place (no allocation per WR).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SgList {
    n: u8,
    sges: [Sge; MAX_SGE],
}

impl core::fmt::Debug for SgList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Default for SgList {
    fn default() -> Self {
        SgList::EMPTY
    }
}

/// More entries than [`MAX_SGE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0} scatter/gather entries (at most {MAX_SGE})")]
pub struct TooManySges(pub usize);

impl SgList {
    /// No entries: a zero-length buffer.
    pub const EMPTY: SgList = SgList {
        n: 0,
        sges: [Sge {
            lkey: 0,
            va: 0,
            len: 0,
        }; MAX_SGE],
    };

    /// One entry.
    pub const fn one(sge: Sge) -> SgList {
        let mut l = SgList::EMPTY;
        l.n = 1;
        l.sges[0] = sge;
        l
    }

    /// The list of `sges`, if there are at most [`MAX_SGE`].
    pub fn new(sges: &[Sge]) -> Result<SgList, TooManySges> {
        if sges.len() > MAX_SGE {
            return Err(TooManySges(sges.len()));
        }
        let mut l = SgList::EMPTY;
        l.n = sges.len() as u8;
        l.sges[..sges.len()].copy_from_slice(sges);
        Ok(l)
    }

    /// Appends an entry, if there is room.
    pub fn push(&mut self, sge: Sge) -> Result<(), TooManySges> {
        let n = usize::from(self.n);
        let slot = self.sges.get_mut(n).ok_or(TooManySges(n + 1))?;
        *slot = sge;
        self.n += 1;
        Ok(())
    }

    pub fn as_slice(&self) -> &[Sge] {
        &self.sges[..usize::from(self.n).min(MAX_SGE)]
    }

    /// Total bytes of every entry.
    pub fn total(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.len)).sum()
    }

    /// The pieces `(entry, va, len)` holding message bytes `[off, off +
    /// len)`, in order; stops at the end of the list.
    pub fn pieces(&self, off: u64, len: u64) -> impl Iterator<Item = (Sge, u64, u64)> + '_ {
        pieces(self.as_slice().iter().copied(), off, len)
    }

    /// Checks every entry: its L_Key names a region of the view, it lies
    /// inside, and the region allows local write when `write`.
    pub fn check(&self, mrs: MrView<'_>, write: bool) -> Result<(), MrError> {
        self.as_slice()
            .iter()
            .filter(|s| s.len > 0)
            .try_for_each(|s| {
                mrs.check_local(s.lkey, s.va, u64::from(s.len), write)
                    .map(drop)
            })
    }

    /// Checks that message bytes `[off, off + len)` lie inside the list
    /// and that every piece is a local access the view allows (`write`
    /// for data landing in it). A region may have gone since the post.
    pub fn check_range(
        &self,
        mrs: MrView<'_>,
        off: u64,
        len: u64,
        write: bool,
    ) -> Result<(), MrError> {
        check_range(self.as_slice().iter().copied(), mrs, off, len, write)
    }

    /// Copies message bytes `[off, off + dst.len())` into `dst`; call
    /// [`SgList::check_range`] first.
    pub fn read_range(&self, mrs: MrView<'_>, mem: &impl Memory, off: u64, dst: &mut [u8]) {
        read_range(self.as_slice().iter().copied(), mrs, mem, off, dst)
    }

    /// Copies `src` to message bytes `[off, off + src.len())`; call
    /// [`SgList::check_range`] first.
    pub fn write_range(&self, mrs: MrView<'_>, mem: &mut impl Memory, off: u64, src: &[u8]) {
        write_range(self.as_slice().iter().copied(), mrs, mem, off, src)
    }

    /// Checks, then copies message bytes `[off, off + dst.len())` out.
    pub fn gather(
        &self,
        mrs: MrView<'_>,
        mem: &impl Memory,
        off: u64,
        dst: &mut [u8],
    ) -> Result<(), MrError> {
        self.check_range(mrs, off, dst.len() as u64, false)?;
        self.read_range(mrs, mem, off, dst);
        Ok(())
    }

    /// Checks for local write, then copies `src` to message bytes `[off,
    /// off + src.len())`; nothing is written when a piece is refused or the
    /// list is too short.
    pub fn scatter(
        &self,
        mrs: MrView<'_>,
        mem: &mut impl Memory,
        off: u64,
        src: &[u8],
    ) -> Result<(), MrError> {
        self.check_range(mrs, off, src.len() as u64, true)?;
        self.write_range(mrs, mem, off, src);
        Ok(())
    }
}

/// The pieces `(entry, va, len)` of the entries `sges` that hold message
/// bytes `[off, off + len)`, in order; stops at the end of the entries.
pub fn pieces(
    sges: impl Iterator<Item = Sge>,
    off: u64,
    len: u64,
) -> impl Iterator<Item = (Sge, u64, u64)> {
    let mut start = 0u64;
    let end = off.saturating_add(len);
    sges.filter_map(move |s| {
        let (a, b) = (start, start + u64::from(s.len));
        start = b;
        let (lo, hi) = (a.max(off), b.min(end));
        (lo < hi).then(|| (s, s.va.wrapping_add(lo - a), hi - lo))
    })
}

/// The device address of message bytes `[off, off + len)` of a single
/// local buffer, checked as [`check_range`] does (the fast path of the
/// one-buffer WRs most applications post).
#[inline]
pub fn one_range(s: Sge, mrs: MrView<'_>, off: u64, len: u64, write: bool) -> Result<u64, MrError> {
    if off.saturating_add(len) > u64::from(s.len) {
        return Err(MrError::OutOfBounds {
            va: off,
            len,
            base: 0,
            size: u64::from(s.len),
        });
    }
    let va = s.va.wrapping_add(off);
    if len > 0 {
        return mrs.check_local(s.lkey, va, len, write);
    }
    Ok(va)
}

/// [`SgList::check_range`] over any entries.
pub fn check_range(
    sges: impl Iterator<Item = Sge>,
    mrs: MrView<'_>,
    off: u64,
    len: u64,
    write: bool,
) -> Result<(), MrError> {
    let mut covered = 0;
    let mut total = 0;
    for (s, va, n) in pieces(sges.inspect(|s| total += u64::from(s.len)), off, len) {
        mrs.check_local(s.lkey, va, n, write)?;
        covered += n;
    }
    if covered != len {
        return Err(MrError::OutOfBounds {
            va: off,
            len,
            base: 0,
            size: total,
        });
    }
    Ok(())
}

/// [`SgList::read_range`] over any entries: each piece at the device
/// address its region maps it to (a piece no region allows, which
/// [`check_range`] has ruled out, reads as zeros).
pub fn read_range(
    sges: impl Iterator<Item = Sge>,
    mrs: MrView<'_>,
    mem: &impl Memory,
    off: u64,
    dst: &mut [u8],
) {
    let mut at = 0usize;
    for (s, va, n) in pieces(sges, off, dst.len() as u64) {
        let out = &mut dst[at..at + n as usize];
        match mrs.check_local(s.lkey, va, n, false) {
            Ok(dev) => mem.read(dev, out),
            Err(_) => out.fill(0),
        }
        at += n as usize;
    }
}

/// [`SgList::write_range`] over any entries (a piece no region allows,
/// which [`check_range`] has ruled out, is not written).
pub fn write_range(
    sges: impl Iterator<Item = Sge>,
    mrs: MrView<'_>,
    mem: &mut impl Memory,
    off: u64,
    src: &[u8],
) {
    let mut at = 0usize;
    for (s, va, n) in pieces(sges, off, src.len() as u64) {
        if let Ok(dev) = mrs.check_local(s.lkey, va, n, true) {
            mem.write(dev, &src[at..at + n as usize]);
        }
        at += n as usize;
    }
}

/// [`SgList::scatter`] over any entries.
pub fn scatter(
    sges: impl Iterator<Item = Sge> + Clone,
    mrs: MrView<'_>,
    mem: &mut impl Memory,
    off: u64,
    src: &[u8],
) -> Result<(), MrError> {
    check_range(sges.clone(), mrs, off, src.len() as u64, true)?;
    write_range(sges, mrs, mem, off, src);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mr::{Access, MrTable, VecMemory, DEFAULT_PD};
    use proptest::prelude::*;

    fn sge(va: u64, len: u32) -> Sge {
        Sge { lkey: 0, va, len }
    }

    #[test]
    fn pieces_cover_a_message_offset_across_entries() {
        let l = SgList::new(&[sge(100, 10), sge(0, 0), sge(500, 5), sge(900, 20)]).unwrap();
        assert_eq!(l.total(), 35);
        let p: Vec<(u64, u64)> = l.pieces(8, 10).map(|(_, va, n)| (va, n)).collect();
        assert_eq!(p, [(108, 2), (500, 5), (900, 3)]);
        assert_eq!(l.pieces(35, 4).count(), 0);
        assert_eq!(SgList::new(&[sge(0, 1); MAX_SGE + 1]), Err(TooManySges(17)));
    }

    #[test]
    fn scatter_refuses_a_list_too_short_before_writing() {
        let mut t = MrTable::new();
        let k = t.register(0, 64, Access::ALL).unwrap();
        let mut mem = VecMemory::new();
        mem.add(0, 64);
        let l = SgList::new(&[Sge {
            lkey: k.lkey,
            va: 0,
            len: 4,
        }])
        .unwrap();
        assert!(l
            .scatter(t.pd(DEFAULT_PD), &mut mem, 2, &[1, 2, 3])
            .is_err());
        assert_eq!(mem.slice(0, 4), &[0, 0, 0, 0]);
        l.scatter(t.pd(DEFAULT_PD), &mut mem, 1, &[1, 2, 3])
            .unwrap();
        assert_eq!(mem.slice(0, 4), &[0, 1, 2, 3]);
    }

    #[test]
    fn a_buffer_at_the_top_of_the_address_space_is_refused_not_overflowed() {
        let t = MrTable::new();
        let l = SgList::one(Sge {
            lkey: 1,
            va: u64::MAX - 100,
            len: 4096,
        });
        assert!(l.check_range(t.pd(DEFAULT_PD), 1024, 1024, true).is_err());
        assert!(one_range(l.as_slice()[0], t.pd(DEFAULT_PD), 1024, 1024, true).is_err());
    }

    proptest! {
        /// Scattering a message piece by piece and gathering it back gives
        /// the same bytes, whatever the entry sizes and the cut points.
        #[test]
        fn scatter_then_gather_is_identity(
            lens in prop::collection::vec(0u32..40, 1..=MAX_SGE),
            cuts in prop::collection::vec(0u64..200, 0..6),
        ) {
            let mut t = MrTable::new();
            let k = t.register(0x1000, 1 << 12, Access::ALL).unwrap();
            let mut mem = VecMemory::new();
            mem.add(0x1000, 1 << 12);
            let mut va = 0x1000;
            let sges: Vec<Sge> = lens.iter().map(|&len| {
                let s = Sge { lkey: k.lkey, va, len };
                va += u64::from(len) + 3;
                s
            }).collect();
            let l = SgList::new(&sges).unwrap();
            let total = l.total();
            let msg: Vec<u8> = (0..total).map(|i| (i * 7 + 1) as u8).collect();
            let mut points: Vec<u64> = cuts.into_iter().map(|c| c.min(total)).collect();
            points.push(0);
            points.push(total);
            points.sort_unstable();
            for w in points.windows(2) {
                let (a, b) = (w[0] as usize, w[1] as usize);
                l.scatter(t.pd(DEFAULT_PD), &mut mem, w[0], &msg[a..b]).unwrap();
            }
            let mut back = vec![0u8; total as usize];
            l.gather(t.pd(DEFAULT_PD), &mem, 0, &mut back).unwrap();
            prop_assert_eq!(back, msg);
        }
    }
}
