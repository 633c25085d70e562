//! The body of a RoCEv2 CNP (opcode 0x81): 16 reserved bytes, sent as zero.

use super::bytes::check_len;
use super::{Layer, WireError};

/// CNP body length.
pub const BODY_LEN: usize = 16;

/// Zero-copy view of a CNP body.
#[derive(Debug, Clone, Copy)]
pub struct Cnp<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Cnp<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), BODY_LEN, Layer::Cnp)?;
        Ok(Cnp { buffer })
    }

    /// The reserved bytes (receivers ignore their value).
    pub fn reserved(&self) -> &[u8] {
        &self.buffer.as_ref()[..BODY_LEN]
    }
}

/// Writes a CNP body (16 zero bytes) into `buf`.
pub fn emit(buf: &mut [u8]) {
    buf[..BODY_LEN].fill(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_sixteen_zero_bytes() {
        let mut b = [0xffu8; 16];
        emit(&mut b);
        assert_eq!(Cnp::new_checked(&b[..]).unwrap().reserved(), &[0u8; 16]);
        assert_eq!(
            Cnp::new_checked(&b[..15]).unwrap_err(),
            WireError::Truncated(Layer::Cnp)
        );
    }
}
