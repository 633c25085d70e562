//! The IB connection manager's messages (IBA vol. 1 ch. 12): REQ, MRA,
//! REJ, REP, RTU, DREQ, DREP, SIDR_REQ and SIDR_REP, each the data of a CM
//! MAD (management class 0x07, class version 2, method Send) after its
//! 24-byte common header. Fields sit where IBA's tables 106-120 put them,
//! as Linux's `include/rdma/ibta_vol1_c12.h` names them: a field is a
//! byte offset into the message, a bit offset from that byte's most
//! significant bit, and a width, big-endian. The private data area of
//! each message is its fixed tail (the length is not on the wire).
//!
//! What rdma_cm adds on top (Linux `cma.c`): the service ID of a port
//! space and port, and the 36-byte header at the start of a REQ's and
//! SIDR_REQ's private data ([`CmaHeader`]).

use std::net::Ipv4Addr;

use super::mad::{self, MadHeader, HEADER_LEN, MAD_LEN};

/// Why a MAD is not a CM message this codec reads (each a counter where
/// MADs are dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    #[error("a MAD is {MAD_LEN} bytes, not {0}")]
    Length(usize),
    #[error("management class {0:#04x} is not the CM's (0x07)")]
    NotCm(u8),
    #[error("CM class version {0}, not 2")]
    ClassVersion(u8),
    #[error("method {0:#04x} is not Send (0x03)")]
    NotSend(u8),
    #[error("attribute {0:#06x} is no CM message this CM takes (LAP and APR are not)")]
    Attribute(u16),
    #[error("the rdma_cm header of the private data is not CMA version 0 over IPv4")]
    CmaHeader,
}

/// The CM's class version.
pub const CLASS_VERSION: u8 = 2;

/// Attribute IDs of the CM's messages.
pub mod attr {
    pub const REQ: u16 = 0x0010;
    pub const MRA: u16 = 0x0011;
    pub const REJ: u16 = 0x0012;
    pub const REP: u16 = 0x0013;
    pub const RTU: u16 = 0x0014;
    pub const DREQ: u16 = 0x0015;
    pub const DREP: u16 = 0x0016;
    pub const SIDR_REQ: u16 = 0x0017;
    pub const SIDR_REP: u16 = 0x0018;
    pub const LAP: u16 = 0x0019;
    pub const APR: u16 = 0x001A;
}

/// Reject reasons (IBA table 112; Linux `enum ib_cm_rej_reason`).
pub mod rej {
    pub const NO_QP: u16 = 1;
    pub const NO_RESOURCES: u16 = 3;
    pub const TIMEOUT: u16 = 4;
    pub const UNSUPPORTED: u16 = 5;
    pub const INVALID_COMM_ID: u16 = 6;
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    pub const INVALID_SERVICE_ID: u16 = 8;
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    pub const STALE_CONN: u16 = 10;
    pub const INVALID_GID: u16 = 12;
    pub const INVALID_MTU: u16 = 26;
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    pub const CONSUMER_DEFINED: u16 = 28;
    pub const INVALID_RNR_RETRY: u16 = 29;
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// Which message a REJ or MRA is about (its 2-bit "message rejected" /
/// "message MRAed" field).
pub mod msg {
    pub const REQ: u8 = 0;
    pub const REP: u8 = 1;
    pub const OTHER: u8 = 2;
}

/// SIDR_REP statuses (IBA table 121).
pub mod sidr {
    pub const SUCCESS: u8 = 0;
    pub const UNSUPPORTED: u8 = 1;
    pub const REJECT: u8 = 2;
    pub const NO_QP: u8 = 3;
    pub const REDIRECT: u8 = 4;
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// Bytes of each message's private data.
pub const REQ_PRIVATE: usize = 92;
pub const MRA_PRIVATE: usize = 222;
pub const REJ_PRIVATE: usize = 148;
pub const REJ_ARI: usize = 72;
pub const REP_PRIVATE: usize = 196;
pub const RTU_PRIVATE: usize = 224;
pub const DREQ_PRIVATE: usize = 220;
pub const DREP_PRIVATE: usize = 224;
pub const SIDR_REQ_PRIVATE: usize = 216;
pub const SIDR_REP_PRIVATE: usize = 136;
pub const SIDR_REP_INFO: usize = 72;

/// The CM message of a MAD: its bytes after the common header.
const BODY: usize = MAD_LEN - HEADER_LEN;

/// A field: its byte, the bit offset from that byte's MSB, its width.
#[derive(Clone, Copy)]
struct F(usize, u32, u32);

impl F {
    /// Its value (big-endian, MSB first). The body is [`BODY`] bytes and
    /// every field lies in it.
    fn get(self, b: &[u8]) -> u64 {
        let F(byte, bit, width) = self;
        let mut v = 0u64;
        for k in 0..width {
            let at = byte * 8 + (bit + k) as usize;
            let set = b[at / 8] >> (7 - at % 8) & 1;
            v = v << 1 | u64::from(set);
        }
        v
    }

    /// Writes the low `width` bits of `v`.
    fn set(self, b: &mut [u8], v: u64) {
        let F(byte, bit, width) = self;
        for k in 0..width {
            let at = byte * 8 + (bit + k) as usize;
            let one = v >> (width - 1 - k) & 1 == 1;
            let mask = 1u8 << (7 - at % 8);
            if one {
                b[at / 8] |= mask;
            } else {
                b[at / 8] &= !mask;
            }
        }
    }
}

fn bytes<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// A path of a REQ (its primary or alternate one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    pub local_lid: u16,
    pub remote_lid: u16,
    /// The sender's and the receiver's GIDs (on RoCEv2 over IPv4,
    /// IPv4-mapped addresses).
    pub local_gid: [u8; 16],
    pub remote_gid: [u8; 16],
    pub flow_label: u32,
    pub packet_rate: u8,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub sl: u8,
    pub subnet_local: bool,
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Its fields at byte `at` of a REQ (52: primary, 96: alternate).
    fn get(b: &[u8], at: usize) -> CmPath {
        CmPath {
            local_lid: F(at, 0, 16).get(b) as u16,
            remote_lid: F(at + 2, 0, 16).get(b) as u16,
            local_gid: bytes(b, at + 4),
            remote_gid: bytes(b, at + 20),
            flow_label: F(at + 36, 0, 20).get(b) as u32,
            packet_rate: F(at + 39, 2, 6).get(b) as u8,
            traffic_class: F(at + 40, 0, 8).get(b) as u8,
            hop_limit: F(at + 41, 0, 8).get(b) as u8,
            sl: F(at + 42, 0, 4).get(b) as u8,
            subnet_local: F(at + 42, 4, 1).get(b) == 1,
            local_ack_timeout: F(at + 43, 0, 5).get(b) as u8,
        }
    }

    fn set(&self, b: &mut [u8], at: usize) {
        F(at, 0, 16).set(b, self.local_lid.into());
        F(at + 2, 0, 16).set(b, self.remote_lid.into());
        b[at + 4..at + 20].copy_from_slice(&self.local_gid);
        b[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        F(at + 36, 0, 20).set(b, self.flow_label.into());
        F(at + 39, 2, 6).set(b, self.packet_rate.into());
        F(at + 40, 0, 8).set(b, self.traffic_class.into());
        F(at + 41, 0, 8).set(b, self.hop_limit.into());
        F(at + 42, 0, 4).set(b, self.sl.into());
        F(at + 42, 4, 1).set(b, self.subnet_local.into());
        F(at + 43, 0, 5).set(b, self.local_ack_timeout.into());
    }
}

/// REQ (IBA table 106): a connection request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    pub local_comm_id: u32,
    pub vendor_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    pub remote_cm_response_timeout: u8,
    /// 0 RC, 1 UC, 2 RD, 3 extended (XRC).
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    pub starting_psn: u32,
    pub local_cm_response_timeout: u8,
    pub retry_count: u8,
    pub pkey: u16,
    /// The IBA MTU code (1: 256 .. 5: 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    pub rnr_retry_count: u8,
    pub max_cm_retries: u8,
    pub srq: bool,
    pub extended_transport_type: u8,
    pub primary: CmPath,
    pub alternate: CmPath,
    pub sap_supported: bool,
    pub private_data: [u8; REQ_PRIVATE],
}

/// MRA (table 107): the receiver needs more time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mra {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// [`msg`]: which message is MRAed.
    pub message_mraed: u8,
    pub service_timeout: u8,
    pub private_data: [u8; MRA_PRIVATE],
}

/// REJ (table 108).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// [`msg`]: which message is rejected.
    pub message_rejected: u8,
    pub ari_length: u8,
    /// [`rej`].
    pub reason: u16,
    pub ari: [u8; REJ_ARI],
    pub private_data: [u8; REJ_PRIVATE],
}

/// REP (table 109): the request is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    pub local_qpn: u32,
    pub vendor_id: u32,
    pub local_eecn: u32,
    pub starting_psn: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub target_ack_delay: u8,
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    pub rnr_retry_count: u8,
    pub srq: bool,
    /// Byte 27's reserved low four bits; our NICs set the first
    /// ([`REP_TELEMETRY`]) to say they speak our telemetry (a Linux peer
    /// reads none of them).
    pub reserved_flags: u8,
    pub local_ca_guid: u64,
    pub private_data: [u8; REP_PRIVATE],
}

/// The bit of [`Rep::reserved_flags`] that says the accepting NIC speaks
/// our telemetry.
pub const REP_TELEMETRY: u8 = 0x08;

/// RTU (table 110): ready to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rtu {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; RTU_PRIVATE],
}

/// DREQ (table 111): disconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dreq {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub remote_qpn: u32,
    pub private_data: [u8; DREQ_PRIVATE],
}

/// DREP (table 112): disconnected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drep {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; DREP_PRIVATE],
}

/// SIDR_REQ (table 119): which UD QP serves a service ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: [u8; SIDR_REQ_PRIVATE],
}

/// SIDR_REP (table 120).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    pub request_id: u32,
    /// [`sidr`].
    pub status: u8,
    pub info_length: u8,
    pub vendor_id: u32,
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub info: [u8; SIDR_REP_INFO],
    pub private_data: [u8; SIDR_REP_PRIVATE],
}

/// A CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMsg {
    Req(Box<Req>),
    Mra(Box<Mra>),
    Rej(Box<Rej>),
    Rep(Box<Rep>),
    Rtu(Box<Rtu>),
    Dreq(Box<Dreq>),
    Drep(Box<Drep>),
    SidrReq(Box<SidrReq>),
    SidrRep(Box<SidrRep>),
}

impl CmMsg {
    /// Its attribute ID.
    pub fn attr_id(&self) -> u16 {
        match self {
            CmMsg::Req(_) => attr::REQ,
            CmMsg::Mra(_) => attr::MRA,
            CmMsg::Rej(_) => attr::REJ,
            CmMsg::Rep(_) => attr::REP,
            CmMsg::Rtu(_) => attr::RTU,
            CmMsg::Dreq(_) => attr::DREQ,
            CmMsg::Drep(_) => attr::DREP,
            CmMsg::SidrReq(_) => attr::SIDR_REQ,
            CmMsg::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// Its name (`REQ`, `REP`, ...).
    pub fn name(&self) -> &'static str {
        name_of(self.attr_id())
    }

    /// The message of a CM MAD (256 bytes: a class 0x07 version 2 Send);
    /// anything else is refused by name.
    pub fn parse(mad: &[u8]) -> Result<(MadHeader, CmMsg), CmError> {
        if mad.len() != MAD_LEN {
            return Err(CmError::Length(mad.len()));
        }
        let h = MadHeader::parse(mad).map_err(|_| CmError::Length(mad.len()))?;
        if h.mgmt_class != mad::class::CM {
            return Err(CmError::NotCm(h.mgmt_class));
        }
        if h.class_version != CLASS_VERSION {
            return Err(CmError::ClassVersion(h.class_version));
        }
        if h.method != mad::method::SEND {
            return Err(CmError::NotSend(h.method));
        }
        let b = &mad[HEADER_LEN..];
        let m = match h.attr_id {
            attr::REQ => CmMsg::Req(Box::new(Req {
                local_comm_id: F(0, 0, 32).get(b) as u32,
                vendor_id: F(5, 0, 24).get(b) as u32,
                service_id: F(8, 0, 64).get(b),
                local_ca_guid: F(16, 0, 64).get(b),
                local_qkey: F(28, 0, 32).get(b) as u32,
                local_qpn: F(32, 0, 24).get(b) as u32,
                responder_resources: b[35],
                local_eecn: F(36, 0, 24).get(b) as u32,
                initiator_depth: b[39],
                remote_eecn: F(40, 0, 24).get(b) as u32,
                remote_cm_response_timeout: F(43, 0, 5).get(b) as u8,
                transport_service_type: F(43, 5, 2).get(b) as u8,
                end_to_end_flow_control: F(43, 7, 1).get(b) == 1,
                starting_psn: F(44, 0, 24).get(b) as u32,
                local_cm_response_timeout: F(47, 0, 5).get(b) as u8,
                retry_count: F(47, 5, 3).get(b) as u8,
                pkey: F(48, 0, 16).get(b) as u16,
                path_mtu: F(50, 0, 4).get(b) as u8,
                rdc_exists: F(50, 4, 1).get(b) == 1,
                rnr_retry_count: F(50, 5, 3).get(b) as u8,
                max_cm_retries: F(51, 0, 4).get(b) as u8,
                srq: F(51, 4, 1).get(b) == 1,
                extended_transport_type: F(51, 5, 3).get(b) as u8,
                primary: CmPath::get(b, 52),
                alternate: CmPath::get(b, 96),
                sap_supported: F(139, 5, 1).get(b) == 1,
                private_data: bytes(b, 140),
            })),
            attr::MRA => CmMsg::Mra(Box::new(Mra {
                local_comm_id: F(0, 0, 32).get(b) as u32,
                remote_comm_id: F(4, 0, 32).get(b) as u32,
                message_mraed: F(8, 0, 2).get(b) as u8,
                service_timeout: F(9, 0, 5).get(b) as u8,
                private_data: bytes(b, 10),
            })),
            attr::REJ => CmMsg::Rej(Box::new(Rej {
                local_comm_id: F(0, 0, 32).get(b) as u32,
                remote_comm_id: F(4, 0, 32).get(b) as u32,
                message_rejected: F(8, 0, 2).get(b) as u8,
                ari_length: F(9, 0, 7).get(b) as u8,
                reason: F(10, 0, 16).get(b) as u16,
                ari: bytes(b, 12),
                private_data: bytes(b, 84),
            })),
            attr::REP => CmMsg::Rep(Box::new(Rep {
                local_comm_id: F(0, 0, 32).get(b) as u32,
                remote_comm_id: F(4, 0, 32).get(b) as u32,
                local_qkey: F(8, 0, 32).get(b) as u32,
                local_qpn: F(12, 0, 24).get(b) as u32,
                vendor_id: (b[15] as u32) << 16 | (b[19] as u32) << 8 | b[23] as u32,
                local_eecn: F(16, 0, 24).get(b) as u32,
                starting_psn: F(20, 0, 24).get(b) as u32,
                responder_resources: b[24],
                initiator_depth: b[25],
                target_ack_delay: F(26, 0, 5).get(b) as u8,
                failover_accepted: F(26, 5, 2).get(b) as u8,
                end_to_end_flow_control: F(26, 7, 1).get(b) == 1,
                rnr_retry_count: F(27, 0, 3).get(b) as u8,
                srq: F(27, 3, 1).get(b) == 1,
                reserved_flags: F(27, 4, 4).get(b) as u8,
                local_ca_guid: F(28, 0, 64).get(b),
                private_data: bytes(b, 36),
            })),
            attr::RTU => CmMsg::Rtu(Box::new(Rtu {
                local_comm_id: F(0, 0, 32).get(b) as u32,
                remote_comm_id: F(4, 0, 32).get(b) as u32,
                private_data: bytes(b, 8),
            })),
            attr::DREQ => CmMsg::Dreq(Box::new(Dreq {
                local_comm_id: F(0, 0, 32).get(b) as u32,
                remote_comm_id: F(4, 0, 32).get(b) as u32,
                remote_qpn: F(8, 0, 24).get(b) as u32,
                private_data: bytes(b, 12),
            })),
            attr::DREP => CmMsg::Drep(Box::new(Drep {
                local_comm_id: F(0, 0, 32).get(b) as u32,
                remote_comm_id: F(4, 0, 32).get(b) as u32,
                private_data: bytes(b, 8),
            })),
            attr::SIDR_REQ => CmMsg::SidrReq(Box::new(SidrReq {
                request_id: F(0, 0, 32).get(b) as u32,
                pkey: F(4, 0, 16).get(b) as u16,
                service_id: F(8, 0, 64).get(b),
                private_data: bytes(b, 16),
            })),
            attr::SIDR_REP => CmMsg::SidrRep(Box::new(SidrRep {
                request_id: F(0, 0, 32).get(b) as u32,
                status: b[4],
                info_length: b[5],
                vendor_id: (F(6, 0, 16).get(b) as u32) << 8 | b[11] as u32,
                qpn: F(8, 0, 24).get(b) as u32,
                service_id: F(12, 0, 64).get(b),
                qkey: F(20, 0, 32).get(b) as u32,
                info: bytes(b, 24),
                private_data: bytes(b, 96),
            })),
            a => return Err(CmError::Attribute(a)),
        };
        Ok((h, m))
    }

    /// The MAD of this message with transaction ID `tid`.
    pub fn emit(&self, tid: u64) -> [u8; MAD_LEN] {
        let mut mad = [0u8; MAD_LEN];
        MadHeader {
            base_version: mad::BASE_VERSION,
            mgmt_class: mad::class::CM,
            class_version: CLASS_VERSION,
            method: mad::method::SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id: self.attr_id(),
            attr_mod: 0,
        }
        .emit(&mut mad);
        let b = &mut mad[HEADER_LEN..];
        debug_assert_eq!(b.len(), BODY);
        match self {
            CmMsg::Req(r) => {
                F(0, 0, 32).set(b, r.local_comm_id.into());
                F(5, 0, 24).set(b, r.vendor_id.into());
                F(8, 0, 64).set(b, r.service_id);
                F(16, 0, 64).set(b, r.local_ca_guid);
                F(28, 0, 32).set(b, r.local_qkey.into());
                F(32, 0, 24).set(b, r.local_qpn.into());
                b[35] = r.responder_resources;
                F(36, 0, 24).set(b, r.local_eecn.into());
                b[39] = r.initiator_depth;
                F(40, 0, 24).set(b, r.remote_eecn.into());
                F(43, 0, 5).set(b, r.remote_cm_response_timeout.into());
                F(43, 5, 2).set(b, r.transport_service_type.into());
                F(43, 7, 1).set(b, r.end_to_end_flow_control.into());
                F(44, 0, 24).set(b, r.starting_psn.into());
                F(47, 0, 5).set(b, r.local_cm_response_timeout.into());
                F(47, 5, 3).set(b, r.retry_count.into());
                F(48, 0, 16).set(b, r.pkey.into());
                F(50, 0, 4).set(b, r.path_mtu.into());
                F(50, 4, 1).set(b, r.rdc_exists.into());
                F(50, 5, 3).set(b, r.rnr_retry_count.into());
                F(51, 0, 4).set(b, r.max_cm_retries.into());
                F(51, 4, 1).set(b, r.srq.into());
                F(51, 5, 3).set(b, r.extended_transport_type.into());
                r.primary.set(b, 52);
                r.alternate.set(b, 96);
                F(139, 5, 1).set(b, r.sap_supported.into());
                b[140..].copy_from_slice(&r.private_data);
            }
            CmMsg::Mra(m) => {
                F(0, 0, 32).set(b, m.local_comm_id.into());
                F(4, 0, 32).set(b, m.remote_comm_id.into());
                F(8, 0, 2).set(b, m.message_mraed.into());
                F(9, 0, 5).set(b, m.service_timeout.into());
                b[10..].copy_from_slice(&m.private_data);
            }
            CmMsg::Rej(r) => {
                F(0, 0, 32).set(b, r.local_comm_id.into());
                F(4, 0, 32).set(b, r.remote_comm_id.into());
                F(8, 0, 2).set(b, r.message_rejected.into());
                F(9, 0, 7).set(b, r.ari_length.into());
                F(10, 0, 16).set(b, r.reason.into());
                b[12..84].copy_from_slice(&r.ari);
                b[84..].copy_from_slice(&r.private_data);
            }
            CmMsg::Rep(r) => {
                F(0, 0, 32).set(b, r.local_comm_id.into());
                F(4, 0, 32).set(b, r.remote_comm_id.into());
                F(8, 0, 32).set(b, r.local_qkey.into());
                F(12, 0, 24).set(b, r.local_qpn.into());
                b[15] = (r.vendor_id >> 16) as u8;
                F(16, 0, 24).set(b, r.local_eecn.into());
                b[19] = (r.vendor_id >> 8) as u8;
                F(20, 0, 24).set(b, r.starting_psn.into());
                b[23] = r.vendor_id as u8;
                b[24] = r.responder_resources;
                b[25] = r.initiator_depth;
                F(26, 0, 5).set(b, r.target_ack_delay.into());
                F(26, 5, 2).set(b, r.failover_accepted.into());
                F(26, 7, 1).set(b, r.end_to_end_flow_control.into());
                F(27, 0, 3).set(b, r.rnr_retry_count.into());
                F(27, 3, 1).set(b, r.srq.into());
                F(27, 4, 4).set(b, r.reserved_flags.into());
                F(28, 0, 64).set(b, r.local_ca_guid);
                b[36..].copy_from_slice(&r.private_data);
            }
            CmMsg::Rtu(r) => {
                F(0, 0, 32).set(b, r.local_comm_id.into());
                F(4, 0, 32).set(b, r.remote_comm_id.into());
                b[8..].copy_from_slice(&r.private_data);
            }
            CmMsg::Dreq(d) => {
                F(0, 0, 32).set(b, d.local_comm_id.into());
                F(4, 0, 32).set(b, d.remote_comm_id.into());
                F(8, 0, 24).set(b, d.remote_qpn.into());
                b[12..].copy_from_slice(&d.private_data);
            }
            CmMsg::Drep(d) => {
                F(0, 0, 32).set(b, d.local_comm_id.into());
                F(4, 0, 32).set(b, d.remote_comm_id.into());
                b[8..].copy_from_slice(&d.private_data);
            }
            CmMsg::SidrReq(s) => {
                F(0, 0, 32).set(b, s.request_id.into());
                F(4, 0, 16).set(b, s.pkey.into());
                F(8, 0, 64).set(b, s.service_id);
                b[16..].copy_from_slice(&s.private_data);
            }
            CmMsg::SidrRep(s) => {
                F(0, 0, 32).set(b, s.request_id.into());
                b[4] = s.status;
                b[5] = s.info_length;
                F(6, 0, 16).set(b, (s.vendor_id >> 8 & 0xFFFF).into());
                F(8, 0, 24).set(b, s.qpn.into());
                b[11] = s.vendor_id as u8;
                F(12, 0, 64).set(b, s.service_id);
                F(20, 0, 32).set(b, s.qkey.into());
                b[24..96].copy_from_slice(&s.info);
                b[96..].copy_from_slice(&s.private_data);
            }
        }
        mad
    }
}

/// The name of a CM attribute (`REQ`, ... or `unknown`).
pub fn name_of(attr_id: u16) -> &'static str {
    match attr_id {
        attr::REQ => "REQ",
        attr::MRA => "MRA",
        attr::REJ => "REJ",
        attr::REP => "REP",
        attr::RTU => "RTU",
        attr::DREQ => "DREQ",
        attr::DREP => "DREP",
        attr::SIDR_REQ => "SIDR_REQ",
        attr::SIDR_REP => "SIDR_REP",
        attr::LAP => "LAP",
        attr::APR => "APR",
        _ => "unknown",
    }
}

/// rdma_cm's port spaces (`enum rdma_ucm_port_space`): the high bits of a
/// service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// RDMA_PS_TCP: RC connections.
    Tcp,
    /// RDMA_PS_UDP: UD, resolved with SIDR.
    Udp,
    /// RDMA_PS_IB: either.
    Ib,
    /// RDMA_PS_IPOIB.
    Ipoib,
}

impl PortSpace {
    /// Its number (`RDMA_PS_*`).
    pub const fn number(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Ib => 0x013F,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
        }
    }

    pub fn from_number(n: u16) -> Option<PortSpace> {
        [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
            PortSpace::Ipoib,
        ]
        .into_iter()
        .find(|p| p.number() == n)
    }
}

/// The top 32 bits of rdma_cm's IP-based service IDs
/// (`RDMA_IB_IP_PS_MASK` is 0xFFFFFFFFFFFF0000: these and the port space).
const IP_SERVICE_PREFIX: u64 = 0x0000_0000;

/// The service ID rdma_cm listens on and connects to for `port` of `ps`
/// (`RDMA_IB_IP_PS_TCP | port`, ...).
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    IP_SERVICE_PREFIX << 32 | u64::from(ps.number()) << 16 | u64::from(port)
}

/// The port space and port of an rdma_cm service ID, if it is one.
pub fn port_of(service_id: u64) -> Option<(PortSpace, u16)> {
    if service_id >> 32 != IP_SERVICE_PREFIX {
        return None;
    }
    let ps = PortSpace::from_number((service_id >> 16) as u16)?;
    Some((ps, service_id as u16))
}

/// The header rdma_cm puts at the start of a REQ's or SIDR_REQ's private
/// data (`struct cma_hdr`, 36 bytes): CMA version 0, the IP version in the
/// top four bits of byte 1, the source port, and the source and
/// destination addresses in 16-byte fields (an IPv4 address in the last
/// four bytes, the rest zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    pub src_port: u16,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
}

impl CmaHeader {
    pub const LEN: usize = 36;
    /// `cma_version`.
    pub const VERSION: u8 = 0x00;

    /// Reads the header from the start of `private` (an IPv4 one: an IPv6
    /// address or another CMA version is refused).
    pub fn parse(private: &[u8]) -> Result<CmaHeader, CmError> {
        if private.len() < Self::LEN || private[0] != Self::VERSION || private[1] >> 4 != 4 {
            return Err(CmError::CmaHeader);
        }
        let ip = |at: usize| {
            Ipv4Addr::new(
                private[at],
                private[at + 1],
                private[at + 2],
                private[at + 3],
            )
        };
        Ok(CmaHeader {
            src_port: u16::from_be_bytes([private[2], private[3]]),
            src: ip(4 + 12),
            dst: ip(20 + 12),
        })
    }

    /// Writes the header at the start of `private` (at least
    /// [`CmaHeader::LEN`] bytes).
    pub fn emit(&self, private: &mut [u8]) {
        private[..Self::LEN].fill(0);
        private[0] = Self::VERSION;
        private[1] = 4 << 4;
        private[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        private[16..20].copy_from_slice(&self.src.octets());
        private[32..36].copy_from_slice(&self.dst.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Req {
        Req {
            local_comm_id: 0x1122_3344,
            vendor_id: 0,
            service_id: service_id(PortSpace::Tcp, 7471),
            local_ca_guid: 0x0102_0304_0506_0708,
            local_qkey: 0,
            local_qpn: 0x00AB_CDEF,
            responder_resources: 16,
            local_eecn: 0,
            initiator_depth: 16,
            remote_eecn: 0,
            remote_cm_response_timeout: 20,
            transport_service_type: 0,
            end_to_end_flow_control: true,
            starting_psn: 0x0012_3456,
            local_cm_response_timeout: 20,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 3,
            rdc_exists: false,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: false,
            extended_transport_type: 0,
            primary: CmPath {
                local_lid: 0xFFFF,
                remote_lid: 0xFFFF,
                local_gid: [1; 16],
                remote_gid: [2; 16],
                flow_label: 0,
                packet_rate: 0,
                traffic_class: 0,
                hop_limit: 64,
                sl: 0,
                subnet_local: false,
                local_ack_timeout: 18,
            },
            alternate: CmPath::default(),
            sap_supported: false,
            private_data: [0x5A; REQ_PRIVATE],
        }
    }

    #[test]
    fn req_fields_sit_where_ibta_table_106_puts_them() {
        let mad = CmMsg::Req(Box::new(req())).emit(0xDEAD_BEEF_0000_0001);
        let b = &mad[HEADER_LEN..];
        assert_eq!(&mad[..4], &[1, 0x07, 2, 0x03]);
        assert_eq!(&mad[16..18], &[0x00, 0x10]);
        assert_eq!(&b[0..4], &[0x11, 0x22, 0x33, 0x44]);
        assert_eq!(&b[8..16], &[0, 0, 0, 0, 0x01, 0x06, 0x1D, 0x2F]);
        assert_eq!(
            &b[32..36],
            &[0xAB, 0xCD, 0xEF, 16],
            "QPN, then responder resources"
        );
        assert_eq!(b[39], 16);
        // Byte 43: remote CM response timeout (5 bits), transport service
        // type (2), end-to-end flow control (1).
        assert_eq!(b[43], 20 << 3 | 1);
        assert_eq!(&b[44..47], &[0x12, 0x34, 0x56]);
        assert_eq!(b[47], 20 << 3 | 7);
        assert_eq!(&b[48..50], &[0xFF, 0xFF]);
        assert_eq!(b[50], 3 << 4 | 7, "MTU, RDC, RNR retry count");
        assert_eq!(b[51], 15 << 4);
        assert_eq!(&b[56..72], &[1; 16]);
        assert_eq!(&b[72..88], &[2; 16]);
        assert_eq!(b[93], 64);
        assert_eq!(b[95], 18 << 3);
        assert_eq!(&b[140..], &[0x5A; REQ_PRIVATE]);
    }

    #[test]
    fn every_message_reads_back_as_written() {
        let msgs = [
            CmMsg::Req(Box::new(req())),
            CmMsg::Mra(Box::new(Mra {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_mraed: msg::REP,
                service_timeout: 17,
                private_data: [3; MRA_PRIVATE],
            })),
            CmMsg::Rej(Box::new(Rej {
                local_comm_id: 1,
                remote_comm_id: 2,
                message_rejected: msg::REQ,
                ari_length: 5,
                reason: rej::CONSUMER_DEFINED,
                ari: [4; REJ_ARI],
                private_data: [5; REJ_PRIVATE],
            })),
            CmMsg::Rep(Box::new(Rep {
                local_comm_id: 1,
                remote_comm_id: 2,
                local_qkey: 0,
                local_qpn: 0x12_3456,
                vendor_id: 0xAB_CDEF,
                local_eecn: 0,
                starting_psn: 0xFF_FFFF,
                responder_resources: 8,
                initiator_depth: 4,
                target_ack_delay: 15,
                failover_accepted: 0,
                end_to_end_flow_control: true,
                rnr_retry_count: 7,
                srq: true,
                reserved_flags: REP_TELEMETRY,
                local_ca_guid: 9,
                private_data: [6; REP_PRIVATE],
            })),
            CmMsg::Rtu(Box::new(Rtu {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: [7; RTU_PRIVATE],
            })),
            CmMsg::Dreq(Box::new(Dreq {
                local_comm_id: 1,
                remote_comm_id: 2,
                remote_qpn: 0x11,
                private_data: [8; DREQ_PRIVATE],
            })),
            CmMsg::Drep(Box::new(Drep {
                local_comm_id: 1,
                remote_comm_id: 2,
                private_data: [9; DREP_PRIVATE],
            })),
            CmMsg::SidrReq(Box::new(SidrReq {
                request_id: 1,
                pkey: 0xFFFF,
                service_id: service_id(PortSpace::Udp, 7174),
                private_data: [10; SIDR_REQ_PRIVATE],
            })),
            CmMsg::SidrRep(Box::new(SidrRep {
                request_id: 1,
                status: sidr::SUCCESS,
                info_length: 0,
                vendor_id: 0x12_3456,
                qpn: 0x45,
                service_id: service_id(PortSpace::Udp, 7174),
                qkey: 0x0123_4567,
                info: [11; SIDR_REP_INFO],
                private_data: [12; SIDR_REP_PRIVATE],
            })),
        ];
        for m in msgs {
            let mad = m.emit(77);
            let (h, back) = CmMsg::parse(&mad).unwrap();
            assert_eq!((h.tid, h.attr_id), (77, m.attr_id()));
            assert_eq!(back, m, "{}", m.name());
        }
    }

    #[test]
    fn a_mad_of_another_class_version_or_method_is_no_cm_message() {
        let good = CmMsg::Rtu(Box::new(Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [0; RTU_PRIVATE],
        }))
        .emit(1);
        for (at, v) in [(1, 0x04u8), (2, 1), (3, 0x83), (17, 0x1B)] {
            let mut bad = good;
            bad[at] = v;
            assert!(CmMsg::parse(&bad).is_err(), "byte {at} = {v:#x}");
        }
        assert!(CmMsg::parse(&good[..255]).is_err());
    }

    #[test]
    fn rdma_cm_service_ids_and_header() {
        assert_eq!(service_id(PortSpace::Tcp, 0x1234), 0x0000_0000_0106_1234);
        assert_eq!(service_id(PortSpace::Udp, 1), 0x0000_0000_0111_0001);
        assert_eq!(port_of(0x0000_0000_013F_0050), Some((PortSpace::Ib, 80)));
        assert_eq!(port_of(0x1000_0000_0106_0050), None);
        let h = CmaHeader {
            src_port: 0xBEEF,
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
        };
        let mut p = [0xFFu8; REQ_PRIVATE];
        h.emit(&mut p);
        assert_eq!(&p[..4], &[0, 0x40, 0xBE, 0xEF]);
        assert_eq!(&p[4..16], &[0; 12]);
        assert_eq!(&p[16..20], &[10, 0, 0, 1]);
        assert_eq!(&p[32..36], &[10, 0, 0, 2]);
        assert_eq!(p[36], 0xFF, "the application's data follows, untouched");
        assert_eq!(CmaHeader::parse(&p), Ok(h));
        p[1] = 0x60;
        assert!(CmaHeader::parse(&p).is_err(), "IPv6 is refused");
    }
}
