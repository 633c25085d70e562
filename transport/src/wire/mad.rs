//! Management datagrams (IBA 13.4): the 256-byte payload of a UD SEND to
//! or from a General Services Interface (QP1), its 24-byte common header
//! and the values of its fields that the GSI's dispatch reads.
//!
//! ```text
//!  byte 0      BaseVersion (1)
//!  byte 1      MgmtClass
//!  byte 2      ClassVersion
//!  byte 3      R:1 Method:7      (R: a response)
//!  bytes 4-5   Status
//!  bytes 6-7   ClassSpecific
//!  bytes 8-15  TransactionID
//!  bytes 16-17 AttributeID
//!  bytes 18-19 reserved
//!  bytes 20-23 AttributeModifier
//!  bytes 24-255 the class's data
//! ```

use super::bytes::{check_len, get_u16, get_u32, set_u16, set_u32};
use super::{Layer, WireError};

/// A MAD's length: the payload of every GSI datagram.
pub const MAD_LEN: usize = 256;
/// The common header's length.
pub const HEADER_LEN: usize = 24;
/// The only base version.
pub const BASE_VERSION: u8 = 1;
/// The Q_Key of every General Services Interface (IBA 13.5.4.3).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The GSI's QP number.
pub const GSI_QPN: u32 = 1;

/// Management classes.
pub mod class {
    /// Subnet management, LID-routed (QP0 only).
    pub const SUBN_LID_ROUTED: u8 = 0x01;
    /// Subnet management, directed route (QP0 only).
    pub const SUBN_DIRECTED_ROUTE: u8 = 0x81;
    pub const SUBN_ADM: u8 = 0x03;
    pub const PERF_MGMT: u8 = 0x04;
    pub const BM: u8 = 0x05;
    pub const DEVICE_MGMT: u8 = 0x06;
    /// Communication management (the connection manager).
    pub const CM: u8 = 0x07;
    pub const SNMP: u8 = 0x08;
}

/// Methods (the low seven bits of byte 3).
pub mod method {
    pub const GET: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const SEND: u8 = 0x03;
    pub const TRAP: u8 = 0x05;
    pub const REPORT: u8 = 0x06;
    pub const TRAP_REPRESS: u8 = 0x07;
    pub const GET_TABLE: u8 = 0x12;
    pub const DELETE: u8 = 0x15;
    /// The response bit.
    pub const RESP: u8 = 0x80;
}

/// Status codes of a response (IBA table 106).
pub mod status {
    pub const OK: u16 = 0x0000;
    /// Bad version: the class's version is not supported.
    pub const BAD_VERSION: u16 = 0x0004;
    /// The method is not supported.
    pub const UNSUPPORTED_METHOD: u16 = 0x0008;
    /// The method/attribute combination is not supported.
    pub const UNSUPPORTED_METHOD_ATTRIB: u16 = 0x000C;
    /// An attribute or attribute modifier has a bad value.
    pub const INVALID_ATTRIB_VALUE: u16 = 0x001C;
}

/// Attributes every class has.
pub mod attr {
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    pub const NOTICE: u16 = 0x0002;
    pub const INFORM_INFO: u16 = 0x0003;
    /// Subnet management's PortInfo.
    pub const PORT_INFO: u16 = 0x0015;
}

/// The common header of a MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadHeader {
    pub base_version: u8,
    pub mgmt_class: u8,
    pub class_version: u8,
    /// The whole byte 3: the method and the response bit.
    pub method: u8,
    pub status: u16,
    pub class_specific: u16,
    pub tid: u64,
    pub attr_id: u16,
    pub attr_mod: u32,
}

impl MadHeader {
    /// Reads the header of `mad` (at least [`HEADER_LEN`] bytes).
    pub fn parse(mad: &[u8]) -> Result<MadHeader, WireError> {
        check_len(mad, HEADER_LEN, Layer::Mad)?;
        let tid = u64::from(get_u32(mad, 8)) << 32 | u64::from(get_u32(mad, 12));
        Ok(MadHeader {
            base_version: mad[0],
            mgmt_class: mad[1],
            class_version: mad[2],
            method: mad[3],
            status: get_u16(mad, 4),
            class_specific: get_u16(mad, 6),
            tid,
            attr_id: get_u16(mad, 16),
            attr_mod: get_u32(mad, 20),
        })
    }

    /// Writes the header into `mad` (at least [`HEADER_LEN`] bytes); the
    /// reserved bytes become 0.
    pub fn emit(&self, mad: &mut [u8]) {
        mad[0] = self.base_version;
        mad[1] = self.mgmt_class;
        mad[2] = self.class_version;
        mad[3] = self.method;
        set_u16(mad, 4, self.status);
        set_u16(mad, 6, self.class_specific);
        set_u32(mad, 8, (self.tid >> 32) as u32);
        set_u32(mad, 12, self.tid as u32);
        set_u16(mad, 16, self.attr_id);
        set_u16(mad, 18, 0);
        set_u32(mad, 20, self.attr_mod);
    }

    /// A response (the R bit).
    pub fn is_response(&self) -> bool {
        self.method & method::RESP != 0
    }

    /// The method without the response bit.
    pub fn method(&self) -> u8 {
        self.method & !method::RESP
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_sit_where_iba_13_4_2_puts_them() {
        let h = MadHeader {
            base_version: 1,
            mgmt_class: class::CM,
            class_version: 2,
            method: method::SEND,
            status: 0x1234,
            class_specific: 0x5678,
            tid: 0x0102_0304_0506_0708,
            attr_id: 0x0010,
            attr_mod: 0xA0B0_C0D0,
        };
        let mut m = [0xFFu8; MAD_LEN];
        h.emit(&mut m);
        assert_eq!(
            m[..24],
            [
                1, 7, 2, 3, 0x12, 0x34, 0x56, 0x78, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0x10, 0, 0, 0xA0,
                0xB0, 0xC0, 0xD0
            ]
        );
        assert_eq!(MadHeader::parse(&m).unwrap(), h);
        assert_eq!(
            MadHeader::parse(&m[..23]).unwrap_err(),
            WireError::Truncated(Layer::Mad)
        );
        let r = MadHeader {
            method: method::GET | method::RESP,
            ..h
        };
        assert!(r.is_response() && r.method() == method::GET);
    }
}
