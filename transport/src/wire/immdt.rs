//! The 4-byte extension headers: Immediate Data (ImmDt) and the
//! Invalidate ETH (IETH, the R_Key a SEND_WITH_INVALIDATE names). Both are
//! one big-endian `u32`.

use super::bytes::{check_len, get_u32, set_u32};
use super::{Layer, WireError};

/// ImmDt length.
pub const HEADER_LEN: usize = 4;

/// Zero-copy view of an ImmDt header.
#[derive(Debug, Clone, Copy)]
pub struct ImmDt<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ImmDt<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        Self::new_checked_as(buffer, Layer::ImmDt)
    }

    /// A view of the 4-byte header `layer` (ImmDt or IETH).
    pub fn new_checked_as(buffer: T, layer: Layer) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), HEADER_LEN, layer)?;
        Ok(ImmDt { buffer })
    }

    /// The immediate value (its representation is a plain `u32`).
    pub fn imm(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }
}

/// Writes the immediate value into `buf` (at least 4 bytes).
pub fn emit(imm: u32, buf: &mut [u8]) {
    set_u32(buf, 0, imm);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut b = [0u8; 4];
        emit(0x1234_5678, &mut b);
        assert_eq!(b, [0x12, 0x34, 0x56, 0x78]);
        assert_eq!(ImmDt::new_checked(&b[..]).unwrap().imm(), 0x1234_5678);
        assert_eq!(
            ImmDt::new_checked(&b[..3]).unwrap_err(),
            WireError::Truncated(Layer::ImmDt)
        );
    }
}
