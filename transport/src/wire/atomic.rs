//! The atomic extension headers: AtomicETH (28 bytes: VA u64, R_Key u32,
//! swap-or-add u64, compare u64) on CMP_SWAP and FETCH_ADD requests, and
//! AtomicAckETH (8 bytes: the original value) on ATOMIC_ACKNOWLEDGE.

use super::bytes::{check_len, get_u32, get_u64, set_u32, set_u64};
use super::{Layer, WireError};

/// AtomicETH length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AtomicAckETH length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

/// Zero-copy view of an AtomicETH.
#[derive(Debug, Clone, Copy)]
pub struct AtomicEth<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicEth<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), ATOMIC_ETH_LEN, Layer::AtomicEth)?;
        Ok(AtomicEth { buffer })
    }

    pub fn va(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 0)
    }

    pub fn r_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }

    pub fn swap_add(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 12)
    }

    pub fn compare(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 20)
    }
}

/// AtomicETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address of the 8-byte operand.
    pub va: u64,
    pub r_key: u32,
    /// CMP_SWAP: the value written when the compare matches; FETCH_ADD: the
    /// addend.
    pub swap_add: u64,
    /// CMP_SWAP: the value compared with; ignored by FETCH_ADD.
    pub compare: u64,
}

impl AtomicEthRepr {
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> Self {
        AtomicEthRepr {
            va: h.va(),
            r_key: h.r_key(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        }
    }

    /// Writes 28 bytes into `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        set_u64(buf, 0, self.va);
        set_u32(buf, 8, self.r_key);
        set_u64(buf, 12, self.swap_add);
        set_u64(buf, 20, self.compare);
    }
}

/// The original value an AtomicAckETH carries.
pub fn parse_ack(buf: &[u8]) -> Result<u64, WireError> {
    check_len(buf, ATOMIC_ACK_ETH_LEN, Layer::AtomicAckEth)?;
    Ok(get_u64(buf, 0))
}

/// Writes an AtomicAckETH (8 bytes) into `buf`.
pub fn emit_ack(orig: u64, buf: &mut [u8]) {
    set_u64(buf, 0, orig);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_fields_sit_where_iba_puts_them() {
        let r = AtomicEthRepr {
            va: 0x0102_0304_0506_0708,
            r_key: 0x1122_3344,
            swap_add: 0xa1a2_a3a4_a5a6_a7a8,
            compare: 0xb1b2_b3b4_b5b6_b7b8,
        };
        let mut b = [0u8; ATOMIC_ETH_LEN];
        r.emit(&mut b);
        assert_eq!(&b[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[8..12], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(b[12], 0xa1);
        assert_eq!(b[20], 0xb1);
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap()),
            r
        );
        assert_eq!(
            AtomicEth::new_checked(&b[..27]).unwrap_err(),
            WireError::Truncated(Layer::AtomicEth)
        );
    }

    #[test]
    fn atomic_ack_eth_round_trips() {
        let mut b = [0u8; 8];
        emit_ack(0xdead_beef_0000_0001, &mut b);
        assert_eq!(parse_ack(&b), Ok(0xdead_beef_0000_0001));
        assert_eq!(
            parse_ack(&b[..7]),
            Err(WireError::Truncated(Layer::AtomicAckEth))
        );
    }
}
