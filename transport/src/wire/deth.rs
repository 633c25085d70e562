//! Datagram Extended Transport Header (8 bytes, IBA 9.3.3): the Q_Key the
//! receiving UD QP checks, a reserved byte, and the sending QP's number
//! (24 bits). Every UD packet carries one after the BTH.

use super::bytes::{check_len, get_u32, set_u32};
use super::{Layer, WireError};

/// DETH length.
pub const HEADER_LEN: usize = 8;

/// Q_Keys with this bit set are controlled: a work request may not send
/// one (the QP's own is used instead) unless the QP was given it.
pub const CONTROLLED_QKEY: u32 = 0x8000_0000;

/// Zero-copy view of a DETH.
#[derive(Debug, Clone, Copy)]
pub struct Deth<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Deth<T> {
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), HEADER_LEN, Layer::Deth)?;
        Ok(Deth { buffer })
    }

    pub fn q_key(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }

    /// The source QP (the reserved byte before it is ignored).
    pub fn src_qp(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 4) & 0x00ff_ffff
    }
}

/// DETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    pub q_key: u32,
    /// The sending QP's number, 24 bits.
    pub src_qp: u32,
}

impl DethRepr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> Self {
        DethRepr {
            q_key: h.q_key(),
            src_qp: h.src_qp(),
        }
    }

    /// Writes 8 bytes into `buf`: the reserved byte zero, the source QP's
    /// top byte dropped.
    pub fn emit(&self, buf: &mut [u8]) {
        set_u32(buf, 0, self.q_key);
        set_u32(buf, 4, self.src_qp & 0x00ff_ffff);
    }

    /// Whether the Q_Key is a controlled one.
    pub fn controlled(&self) -> bool {
        self.q_key & CONTROLLED_QKEY != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deth_is_the_q_key_then_a_reserved_byte_and_the_source_qp() {
        let d = DethRepr {
            q_key: 0x8001_0203,
            src_qp: 0x00ab_cdef,
        };
        let mut b = [0xffu8; 8];
        d.emit(&mut b);
        assert_eq!(b, [0x80, 1, 2, 3, 0, 0xab, 0xcd, 0xef]);
        assert_eq!(DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()), d);
        assert!(d.controlled());
        assert_eq!(
            Deth::new_checked(&b[..7]).unwrap_err(),
            WireError::Truncated(Layer::Deth)
        );
    }

    #[test]
    fn the_reserved_byte_is_ignored_on_receive() {
        let b = [0, 0, 0, 1, 0x5a, 0, 0, 2];
        let d = DethRepr::parse(&Deth::new_checked(&b[..]).unwrap());
        assert_eq!((d.q_key, d.src_qp, d.controlled()), (1, 2, false));
    }
}
