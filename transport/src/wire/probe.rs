//! The PROBE block of TLM_REQUEST / TLM_RESPONSE and the NOTIFY block of
//! CC_NOTIFY (16 bytes each, this project's own).

use super::bytes::{check_len, get_u32, get_u64, set_u32, set_u64};
use super::{Layer, WireError};

/// PROBE and NOTIFY length.
pub const BLOCK_LEN: usize = 16;

/// Zero-copy view of a PROBE block.
#[derive(Debug, Clone, Copy)]
pub struct Probe<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Probe<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), BLOCK_LEN, Layer::Probe)?;
        Ok(Probe { buffer })
    }

    pub fn probe_id(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }

    pub fn snd_psn(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 4)
    }

    pub fn sender_ts_ns(&self) -> u64 {
        get_u64(self.buffer.as_ref(), 8)
    }
}

/// Zero-copy view of a NOTIFY block.
#[derive(Debug, Clone, Copy)]
pub struct Notify<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Notify<T> {
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), BLOCK_LEN, Layer::Notify)?;
        Ok(Notify { buffer })
    }

    pub fn window_bytes(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 0)
    }

    pub fn rate_mbps(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 4)
    }

    pub fn seq(&self) -> u32 {
        get_u32(self.buffer.as_ref(), 8)
    }
}

/// PROBE: `probe_id u32 | snd_psn u32 | sender_ts_ns u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProbeRepr {
    pub probe_id: u32,
    /// Low 24 bits: the sender's snd_nxt when the probe left.
    pub snd_psn: u32,
    /// Sender timestamp, echoed unchanged by the responder.
    pub sender_ts_ns: u64,
}

impl ProbeRepr {
    pub fn parse<T: AsRef<[u8]>>(h: &Probe<T>) -> Self {
        ProbeRepr {
            probe_id: h.probe_id(),
            snd_psn: h.snd_psn(),
            sender_ts_ns: h.sender_ts_ns(),
        }
    }

    /// Writes 16 bytes into `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        set_u32(buf, 0, self.probe_id);
        set_u32(buf, 4, self.snd_psn);
        set_u64(buf, 8, self.sender_ts_ns);
    }
}

/// NOTIFY: `window_bytes u32 | rate_mbps u32 | seq u32 | reserved u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NotifyRepr {
    pub window_bytes: u32,
    pub rate_mbps: u32,
    pub seq: u32,
}

impl NotifyRepr {
    pub fn parse<T: AsRef<[u8]>>(h: &Notify<T>) -> Self {
        NotifyRepr {
            window_bytes: h.window_bytes(),
            rate_mbps: h.rate_mbps(),
            seq: h.seq(),
        }
    }

    /// Writes 16 bytes into `buf` (reserved word zero).
    pub fn emit(&self, buf: &mut [u8]) {
        set_u32(buf, 0, self.window_bytes);
        set_u32(buf, 4, self.rate_mbps);
        set_u32(buf, 8, self.seq);
        set_u32(buf, 12, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_round_trip() {
        let r = ProbeRepr {
            probe_id: 7,
            snd_psn: 0x00ff_fffe,
            sender_ts_ns: 0x0102_0304_0506_0708,
        };
        let mut b = [0u8; 16];
        r.emit(&mut b);
        assert_eq!(&b[..8], &[0, 0, 0, 7, 0, 0xff, 0xff, 0xfe]);
        assert_eq!(ProbeRepr::parse(&Probe::new_checked(&b[..]).unwrap()), r);
        assert_eq!(
            Probe::new_checked(&b[..15]).unwrap_err(),
            WireError::Truncated(Layer::Probe)
        );
    }

    #[test]
    fn notify_round_trip() {
        let r = NotifyRepr {
            window_bytes: 65536,
            rate_mbps: 25000,
            seq: 9,
        };
        let mut b = [0xffu8; 16];
        r.emit(&mut b);
        assert_eq!(&b[12..], &[0, 0, 0, 0]);
        assert_eq!(NotifyRepr::parse(&Notify::new_checked(&b[..]).unwrap()), r);
        assert_eq!(
            Notify::new_checked(&b[..1]).unwrap_err(),
            WireError::Truncated(Layer::Notify)
        );
    }
}
