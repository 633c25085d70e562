//! Base Transport Header (12 bytes): view and representation.
//!
//! ```text
//!  byte 0     OpCode
//!  byte 1     SE:1 M:1 PadCnt:2 TVer:4
//!  bytes 2-3  P_Key
//!  byte 4     FECN:1 BECN:1 T:1 reserved:5   (masked for the ICRC)
//!  bytes 5-7  DestQP
//!  byte 8     AckReq:1 reserved:7
//!  bytes 9-11 PSN
//! ```

use super::bytes::{check_len, get_u16, get_u24};
use super::{Layer, Layout, Opcode, Service, WireError};

/// BTH length.
pub const HEADER_LEN: usize = 12;
/// The default partition key.
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// PSNs and QPNs are 24-bit.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// Zero-copy view of a BTH.
#[derive(Debug, Clone, Copy)]
pub struct Bth<T> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), HEADER_LEN, Layer::Bth)?;
        Ok(Bth { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The raw opcode byte.
    pub fn opcode_raw(&self) -> u8 {
        self.b()[0]
    }

    pub fn solicited(&self) -> bool {
        self.b()[1] & 0x80 != 0
    }

    pub fn migreq(&self) -> bool {
        self.b()[1] & 0x40 != 0
    }

    pub fn pad_count(&self) -> usize {
        usize::from((self.b()[1] >> 4) & 3)
    }

    pub fn tver(&self) -> u8 {
        self.b()[1] & 0x0f
    }

    pub fn pkey(&self) -> u16 {
        get_u16(self.b(), 2)
    }

    pub fn fecn(&self) -> bool {
        self.b()[4] & 0x80 != 0
    }

    pub fn becn(&self) -> bool {
        self.b()[4] & 0x40 != 0
    }

    /// T: a TLM block follows.
    pub fn tlm_flag(&self) -> bool {
        self.b()[4] & 0x20 != 0
    }

    pub fn dest_qp(&self) -> u32 {
        get_u24(self.b(), 5)
    }

    pub fn ack_req(&self) -> bool {
        self.b()[8] & 0x80 != 0
    }

    pub fn psn(&self) -> u32 {
        get_u24(self.b(), 9)
    }

    /// Does a TLM block follow (T set, or a telemetry opcode)?
    #[inline]
    pub fn has_tlm(&self) -> bool {
        self.tlm_flag() || (0xC0..=0xC3).contains(&self.opcode_raw())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Sets FECN, as a switch does on congestion (the byte is ICRC-masked).
    pub fn set_fecn(&mut self, v: bool) {
        let b = &mut self.buffer.as_mut()[4];
        *b = (*b & !0x80) | if v { 0x80 } else { 0 };
    }
}

/// BTH fields a sender chooses. PadCnt and T are derived when emitting
/// (from the payload length and the presence of a TLM block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// The operation (SEND_ONLY, RDMA_WRITE_FIRST, ...).
    pub opcode: Opcode,
    /// The transport service, the opcode byte's top three bits.
    pub service: Service,
    pub solicited: bool,
    pub migreq: bool,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl BthRepr {
    /// A BTH with default P_Key and every flag clear.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        BthRepr {
            opcode,
            service: Service::Rc,
            solicited: false,
            migreq: false,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: dest_qp & PSN_MASK,
            ack_req: false,
            psn: psn & PSN_MASK,
        }
    }

    /// Reads a checked BTH: refuses TVer != 0 and unknown opcodes.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(h: &Bth<T>) -> Result<Self, WireError> {
        // The 12 bytes as one array (`new_checked` saw them), so that no
        // field pays a bounds check.
        let Some(b) = h.b().first_chunk::<HEADER_LEN>() else {
            return Err(WireError::Truncated(Layer::Bth));
        };
        Self::from_fixed(b)
    }

    /// The fields of 12 BTH bytes: refuses TVer != 0 and unknown opcodes.
    #[inline(always)]
    pub fn from_fixed(b: &[u8; HEADER_LEN]) -> Result<Self, WireError> {
        let tver = b[1] & 0x0f;
        if tver != 0 {
            return Err(WireError::BadTransportVersion(tver));
        }
        let (service, opcode) = Opcode::decode(b[0]).ok_or(WireError::UnknownOpcode(b[0]))?;
        Ok(BthRepr {
            opcode,
            service,
            solicited: b[1] & 0x80 != 0,
            migreq: b[1] & 0x40 != 0,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[8] & 0x80 != 0,
            psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
        })
    }

    /// The headers after this BTH (its operation in its service).
    #[inline(always)]
    pub const fn layout(&self) -> Layout {
        self.opcode.layout_in(self.service)
    }

    /// Writes the 12 bytes into `buf` (at least `HEADER_LEN` long).
    /// The bytes are assembled whole and stored at once (one bounds
    /// check, no partial stores).
    #[inline]
    pub fn emit(&self, buf: &mut [u8], pad_count: usize, tlm: bool) {
        let k = self.pkey.to_be_bytes();
        let q = (self.dest_qp & PSN_MASK).to_be_bytes();
        let p = (self.psn & PSN_MASK).to_be_bytes();
        let b: [u8; HEADER_LEN] = [
            self.opcode.encode(self.service),
            (u8::from(self.solicited) << 7)
                | (u8::from(self.migreq) << 6)
                | (((pad_count & 3) as u8) << 4),
            k[0],
            k[1],
            (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6) | (u8::from(tlm) << 5),
            q[1],
            q[2],
            q[3],
            u8::from(self.ack_req) << 7,
            p[1],
            p[2],
            p[3],
        ];
        buf[..HEADER_LEN].copy_from_slice(&b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_positions_match_the_table() {
        let r = BthRepr {
            opcode: Opcode::RdmaWriteOnly,
            service: Service::Rc,
            solicited: true,
            migreq: true,
            pkey: 0x1234,
            fecn: true,
            becn: false,
            dest_qp: 0xABCDEF,
            ack_req: true,
            psn: 0x123456,
        };
        let mut b = [0u8; 12];
        r.emit(&mut b, 3, true);
        assert_eq!(
            b,
            [0x0A, 0xF0, 0x12, 0x34, 0xA0, 0xAB, 0xCD, 0xEF, 0x80, 0x12, 0x34, 0x56]
        );
        let h = Bth::new_checked(&b[..]).unwrap();
        assert_eq!(h.pad_count(), 3);
        assert!(h.has_tlm());
        assert_eq!(BthRepr::parse(&h).unwrap(), r);
    }

    #[test]
    fn refuses_version_and_unknown_opcode() {
        let mut b = [0u8; 12];
        b[1] = 1;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(WireError::BadTransportVersion(1))
        );
        b[1] = 0;
        // UD has SEND_ONLY (0x64) but no RDMA WRITE (0x6A).
        b[0] = 0x6A;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(WireError::UnknownOpcode(0x6A))
        );
        b[0] = 0x64;
        let r = BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.service, r.opcode), (Service::Ud, Opcode::SendOnly));
        assert_eq!(
            Bth::new_checked(&b[..11]).unwrap_err(),
            WireError::Truncated(Layer::Bth)
        );
    }

    #[test]
    fn telemetry_opcodes_imply_tlm() {
        let mut b = [0u8; 12];
        b[0] = 0xC1;
        assert!(Bth::new_checked(&b[..]).unwrap().has_tlm());
        b[0] = 0x11;
        assert!(!Bth::new_checked(&b[..]).unwrap().has_tlm());
    }
}
