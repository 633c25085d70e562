//! ACK Extended Transport Header (4 bytes): syndrome u8, MSN u24, and the
//! meaning of the syndrome.

use super::bytes::{check_len, get_u24, set_u24};
use super::{Layer, WireError};

/// AETH length.
pub const HEADER_LEN: usize = 4;
/// Syndrome of an ACK with unlimited credits.
pub const ACK_UNLIMITED: u8 = 0x1F;

/// Zero-copy view of an AETH.
#[derive(Debug, Clone, Copy)]
pub struct Aeth<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Aeth<T> {
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), HEADER_LEN, Layer::Aeth)?;
        Ok(Aeth { buffer })
    }

    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    pub fn msn(&self) -> u32 {
        get_u24(self.buffer.as_ref(), 1)
    }
}

/// NAK codes (syndrome `011xxxxx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0x60: the responder expected another PSN.
    PsnSequenceError,
    /// 0x61
    InvalidRequest,
    /// 0x62: R_Key, bounds or access check failed.
    RemoteAccessError,
    /// 0x63
    RemoteOperationalError,
    /// Any other NAK value (low 5 bits).
    Other(u8),
}

/// What an AETH syndrome says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// `000xxxxx`: ACK with a credit count (0x1F = unlimited).
    Ack { credits: u8 },
    /// `001ttttt`: receiver not ready, with the timer code.
    RnrNak { timer: u8 },
    /// `011xxxxx`
    Nak(NakCode),
    /// `010xxxxx` and `1xxxxxxx` are reserved.
    Reserved(u8),
}

impl Syndrome {
    /// Decodes a syndrome byte.
    pub const fn from_u8(v: u8) -> Syndrome {
        match v >> 5 {
            0b000 => Syndrome::Ack { credits: v & 0x1f },
            0b001 => Syndrome::RnrNak { timer: v & 0x1f },
            0b011 => Syndrome::Nak(match v {
                0x60 => NakCode::PsnSequenceError,
                0x61 => NakCode::InvalidRequest,
                0x62 => NakCode::RemoteAccessError,
                0x63 => NakCode::RemoteOperationalError,
                _ => NakCode::Other(v & 0x1f),
            }),
            _ => Syndrome::Reserved(v),
        }
    }

    /// Encodes a syndrome byte.
    pub const fn as_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => match code {
                NakCode::PsnSequenceError => 0x60,
                NakCode::InvalidRequest => 0x61,
                NakCode::RemoteAccessError => 0x62,
                NakCode::RemoteOperationalError => 0x63,
                NakCode::Other(x) => 0x60 | (x & 0x1f),
            },
            Syndrome::Reserved(v) => v,
        }
    }
}

/// AETH fields. The syndrome is kept as the wire byte so that any value
/// round-trips; [`AethRepr::decoded`] gives its meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AethRepr {
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Self {
        AethRepr {
            syndrome: h.syndrome(),
            msn: h.msn(),
        }
    }

    /// Writes 4 bytes into `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.syndrome;
        set_u24(buf, 1, self.msn & 0x00FF_FFFF);
    }

    pub const fn decoded(&self) -> Syndrome {
        Syndrome::from_u8(self.syndrome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_of_wire_md() {
        assert_eq!(
            Syndrome::from_u8(0x1f),
            Syndrome::Ack {
                credits: ACK_UNLIMITED
            }
        );
        assert_eq!(Syndrome::from_u8(0x2e), Syndrome::RnrNak { timer: 0x0e });
        assert_eq!(
            Syndrome::from_u8(0x60),
            Syndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            Syndrome::from_u8(0x61),
            Syndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            Syndrome::from_u8(0x62),
            Syndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            Syndrome::from_u8(0x63),
            Syndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(Syndrome::from_u8(0x40), Syndrome::Reserved(0x40));
    }

    #[test]
    fn every_syndrome_byte_round_trips() {
        for v in 0..=255u8 {
            assert_eq!(Syndrome::from_u8(v).as_u8(), v);
        }
    }

    #[test]
    fn round_trip() {
        let r = AethRepr {
            syndrome: 0x60,
            msn: 0x00ab_cdef,
        };
        let mut b = [0u8; 4];
        r.emit(&mut b);
        assert_eq!(b, [0x60, 0xab, 0xcd, 0xef]);
        assert_eq!(AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()), r);
        assert!(Aeth::new_checked(&b[..3]).is_err());
    }
}
