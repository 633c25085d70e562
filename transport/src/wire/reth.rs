//! RDMA Extended Transport Header (16 bytes): VA u64, R_Key u32, DMA length u32.

use super::bytes::{check_len, get_u32, get_u64, set_u32, set_u64};
use super::{Layer, WireError};

/// RETH length.
pub const HEADER_LEN: usize = 16;

/// Zero-copy view of a RETH.
#[derive(Debug, Clone, Copy)]
pub struct Reth<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Reth<T> {
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), HEADER_LEN, Layer::Reth)?;
        Ok(Reth { buffer })
    }

    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }

    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }

    pub fn dma_len(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 12)
    }
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    pub r_key: u32,
    /// Length of the whole message (WRITE) or of the whole read (READ).
    pub dma_len: u32,
}

impl RethRepr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Reth<T>) -> Self {
        RethRepr {
            va: h.va(),
            r_key: h.r_key(),
            dma_len: h.dma_len(),
        }
    }

    /// Writes 16 bytes into `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        set_u64(buf, 0, self.va);
        set_u32(buf, 8, self.r_key);
        set_u32(buf, 12, self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = RethRepr {
            va: 0x0102_0304_0506_0708,
            r_key: 0xdead_beef,
            dma_len: 4096,
        };
        let mut b = [0u8; 16];
        r.emit(&mut b);
        assert_eq!(
            b,
            [1, 2, 3, 4, 5, 6, 7, 8, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0x10, 0]
        );
        assert_eq!(RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()), r);
        assert_eq!(
            Reth::new_checked(&b[..15]).unwrap_err(),
            WireError::Truncated(Layer::Reth)
        );
    }
}
