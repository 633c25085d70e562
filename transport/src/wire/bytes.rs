//! Big-endian field access on byte slices.
//!
//! Callers check the slice length once (a view's `new_checked`); after that
//! these helpers index within bounds. They never allocate.

#[inline]
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn get_u24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

#[inline]
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    (u64::from(get_u32(b, at)) << 32) | u64::from(get_u32(b, at + 4))
}

#[inline]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

#[inline]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Checks that `buf` holds at least `len` bytes of `layer`.
#[inline]
pub(crate) fn check_len(
    buf: &[u8],
    len: usize,
    layer: super::Layer,
) -> Result<(), super::WireError> {
    if buf.len() < len {
        Err(super::WireError::Truncated(layer))
    } else {
        Ok(())
    }
}
