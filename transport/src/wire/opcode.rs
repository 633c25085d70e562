//! BTH opcodes of wire.md, the transport service in their top three bits
//! (RC, UC, UD), and which headers each one carries.

/// Every opcode the transport sends or accepts (wire.md, "RC opcodes used"
/// and the manufacturer-specific telemetry opcodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    SendFirst = 0x00,
    SendMiddle = 0x01,
    SendLast = 0x02,
    SendLastWithImmediate = 0x03,
    SendOnly = 0x04,
    SendOnlyWithImmediate = 0x05,
    RdmaWriteFirst = 0x06,
    RdmaWriteMiddle = 0x07,
    RdmaWriteLast = 0x08,
    RdmaWriteLastWithImmediate = 0x09,
    RdmaWriteOnly = 0x0A,
    RdmaWriteOnlyWithImmediate = 0x0B,
    RdmaReadRequest = 0x0C,
    RdmaReadResponseFirst = 0x0D,
    RdmaReadResponseMiddle = 0x0E,
    RdmaReadResponseLast = 0x0F,
    RdmaReadResponseOnly = 0x10,
    Acknowledge = 0x11,
    AtomicAcknowledge = 0x12,
    CompareSwap = 0x13,
    FetchAdd = 0x14,
    SendLastWithInvalidate = 0x16,
    SendOnlyWithInvalidate = 0x17,
    Cnp = 0x81,
    TlmRequest = 0xC0,
    TlmResponse = 0xC1,
    CcNotify = 0xC2,
    IntResponse = 0xC3,
}

/// The transport service of a packet (IBA 9.2, the opcode byte's top three
/// bits): the operation in the low five bits means the same in each
/// service that has it. CNP (0x81) and our telemetry opcodes (0xC0-0xC3)
/// are whole bytes and count as [`Service::Rc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Service {
    /// Reliable Connected (`000`).
    #[default]
    Rc,
    /// Unreliable Connected (`001`): SEND and RDMA WRITE, no ACKs.
    Uc,
    /// Unreliable Datagram (`011`): SEND_ONLY and SEND_ONLY_WITH_IMMEDIATE
    /// with a DETH.
    Ud,
}

impl Service {
    /// Every service.
    pub const ALL: [Service; 3] = [Service::Rc, Service::Uc, Service::Ud];

    /// The opcode byte's top three bits.
    pub const fn prefix(self) -> u8 {
        match self {
            Service::Rc => 0x00,
            Service::Uc => 0x20,
            Service::Ud => 0x60,
        }
    }

    /// Does this service have operation `op` (IBA table 35)? UC: the SEND
    /// and RDMA WRITE opcodes; UD: SEND_ONLY with and without immediate.
    pub const fn carries(self, op: Opcode) -> bool {
        match self {
            Service::Rc => true,
            Service::Uc => (op as u8) <= Opcode::RdmaWriteOnlyWithImmediate as u8,
            Service::Ud => matches!(op, Opcode::SendOnly | Opcode::SendOnlyWithImmediate),
        }
    }

    /// Its name in logs and `bench decode` (`RC`, `UC`, `UD`).
    pub const fn name(self) -> &'static str {
        match self {
            Service::Rc => "RC",
            Service::Uc => "UC",
            Service::Ud => "UD",
        }
    }
}

/// Which headers follow BTH (and TLM) for an opcode, in wire order:
/// DETH, RETH, AtomicETH, ImmDt or IETH, AETH, AtomicAckETH, PROBE, NOTIFY, CNP
/// reserved bytes, then payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Datagram extended header (UD).
    pub deth: bool,
    pub reth: bool,
    pub atomic_eth: bool,
    pub immdt: bool,
    pub ieth: bool,
    pub aeth: bool,
    pub atomic_ack_eth: bool,
    pub probe: bool,
    pub notify: bool,
    pub cnp: bool,
    /// The packet may carry payload (and pad).
    pub payload: bool,
    /// A TLM block is mandatory (the telemetry opcodes); otherwise it is
    /// present exactly when BTH's T bit is set.
    pub tlm_required: bool,
}

impl Layout {
    /// BTH, at most a RETH, then payload where the opcode allows it (SEND
    /// and WRITE packets without immediate, READ requests and responses
    /// without AETH): the frames a QP's template writes without the
    /// general emitter's walk of every header.
    pub fn is_plain(&self) -> bool {
        *self
            == Layout {
                reth: self.reth,
                payload: self.payload,
                ..NONE
            }
    }
}

const NONE: Layout = Layout {
    deth: false,
    reth: false,
    atomic_eth: false,
    immdt: false,
    ieth: false,
    aeth: false,
    atomic_ack_eth: false,
    probe: false,
    notify: false,
    cnp: false,
    payload: false,
    tlm_required: false,
};

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 28] = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastWithImmediate,
        Opcode::SendOnly,
        Opcode::SendOnlyWithImmediate,
        Opcode::RdmaWriteFirst,
        Opcode::RdmaWriteMiddle,
        Opcode::RdmaWriteLast,
        Opcode::RdmaWriteLastWithImmediate,
        Opcode::RdmaWriteOnly,
        Opcode::RdmaWriteOnlyWithImmediate,
        Opcode::RdmaReadRequest,
        Opcode::RdmaReadResponseFirst,
        Opcode::RdmaReadResponseMiddle,
        Opcode::RdmaReadResponseLast,
        Opcode::RdmaReadResponseOnly,
        Opcode::Acknowledge,
        Opcode::AtomicAcknowledge,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
        Opcode::SendLastWithInvalidate,
        Opcode::SendOnlyWithInvalidate,
        Opcode::Cnp,
        Opcode::TlmRequest,
        Opcode::TlmResponse,
        Opcode::CcNotify,
        Opcode::IntResponse,
    ];

    /// The opcode with this BTH value, if wire.md defines it.
    pub const fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0x00 => Opcode::SendFirst,
            0x01 => Opcode::SendMiddle,
            0x02 => Opcode::SendLast,
            0x03 => Opcode::SendLastWithImmediate,
            0x04 => Opcode::SendOnly,
            0x05 => Opcode::SendOnlyWithImmediate,
            0x06 => Opcode::RdmaWriteFirst,
            0x07 => Opcode::RdmaWriteMiddle,
            0x08 => Opcode::RdmaWriteLast,
            0x09 => Opcode::RdmaWriteLastWithImmediate,
            0x0A => Opcode::RdmaWriteOnly,
            0x0B => Opcode::RdmaWriteOnlyWithImmediate,
            0x0C => Opcode::RdmaReadRequest,
            0x0D => Opcode::RdmaReadResponseFirst,
            0x0E => Opcode::RdmaReadResponseMiddle,
            0x0F => Opcode::RdmaReadResponseLast,
            0x10 => Opcode::RdmaReadResponseOnly,
            0x11 => Opcode::Acknowledge,
            0x12 => Opcode::AtomicAcknowledge,
            0x13 => Opcode::CompareSwap,
            0x14 => Opcode::FetchAdd,
            0x16 => Opcode::SendLastWithInvalidate,
            0x17 => Opcode::SendOnlyWithInvalidate,
            0x81 => Opcode::Cnp,
            0xC0 => Opcode::TlmRequest,
            0xC1 => Opcode::TlmResponse,
            0xC2 => Opcode::CcNotify,
            0xC3 => Opcode::IntResponse,
            _ => return None,
        })
    }

    /// The BTH value in RC (and of CNP and the telemetry opcodes).
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The service and operation of a BTH opcode byte, if wire.md defines
    /// the pair (UC: 0x20-0x2B, UD: 0x64 and 0x65).
    pub const fn decode(v: u8) -> Option<(Service, Opcode)> {
        let service = match v >> 5 {
            1 => Service::Uc,
            3 => Service::Ud,
            _ => {
                return match Opcode::from_u8(v) {
                    Some(op) => Some((Service::Rc, op)),
                    None => None,
                }
            }
        };
        match Opcode::from_u8(v & 0x1f) {
            Some(op) if service.carries(op) => Some((service, op)),
            _ => None,
        }
    }

    /// The BTH opcode byte of this operation in `service` (which must
    /// carry it: [`Service::carries`]).
    #[inline(always)]
    pub const fn encode(self, service: Service) -> u8 {
        self as u8 | service.prefix()
    }

    /// The headers this operation carries in `service`: a UD packet has a
    /// DETH before the others.
    #[inline]
    pub const fn layout_in(self, service: Service) -> Layout {
        let mut l = self.layout();
        l.deth = matches!(service, Service::Ud);
        l
    }

    /// The name used by `bench decode` and in logs (wire.md's names in IBA
    /// spelling, e.g. `RDMA_WRITE_ONLY`, `ACKNOWLEDGE`, `TLM_REQUEST`).
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::SendFirst => "SEND_FIRST",
            Opcode::SendMiddle => "SEND_MIDDLE",
            Opcode::SendLast => "SEND_LAST",
            Opcode::SendLastWithImmediate => "SEND_LAST_WITH_IMMEDIATE",
            Opcode::SendOnly => "SEND_ONLY",
            Opcode::SendOnlyWithImmediate => "SEND_ONLY_WITH_IMMEDIATE",
            Opcode::RdmaWriteFirst => "RDMA_WRITE_FIRST",
            Opcode::RdmaWriteMiddle => "RDMA_WRITE_MIDDLE",
            Opcode::RdmaWriteLast => "RDMA_WRITE_LAST",
            Opcode::RdmaWriteLastWithImmediate => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            Opcode::RdmaWriteOnly => "RDMA_WRITE_ONLY",
            Opcode::RdmaWriteOnlyWithImmediate => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            Opcode::RdmaReadRequest => "RDMA_READ_REQUEST",
            Opcode::RdmaReadResponseFirst => "RDMA_READ_RESPONSE_FIRST",
            Opcode::RdmaReadResponseMiddle => "RDMA_READ_RESPONSE_MIDDLE",
            Opcode::RdmaReadResponseLast => "RDMA_READ_RESPONSE_LAST",
            Opcode::RdmaReadResponseOnly => "RDMA_READ_RESPONSE_ONLY",
            Opcode::Acknowledge => "ACKNOWLEDGE",
            Opcode::AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
            Opcode::CompareSwap => "COMPARE_SWAP",
            Opcode::FetchAdd => "FETCH_ADD",
            Opcode::SendLastWithInvalidate => "SEND_LAST_WITH_INVALIDATE",
            Opcode::SendOnlyWithInvalidate => "SEND_ONLY_WITH_INVALIDATE",
            Opcode::Cnp => "CNP",
            Opcode::TlmRequest => "TLM_REQUEST",
            Opcode::TlmResponse => "TLM_RESPONSE",
            Opcode::CcNotify => "CC_NOTIFY",
            Opcode::IntResponse => "INT_RESPONSE",
        }
    }

    /// The headers this opcode carries.
    #[inline]
    pub const fn layout(self) -> Layout {
        use Opcode::*;
        let payload = Layout {
            payload: true,
            ..NONE
        };
        match self {
            SendFirst
            | SendMiddle
            | SendLast
            | SendOnly
            | RdmaWriteMiddle
            | RdmaWriteLast
            | RdmaReadResponseMiddle => payload,
            SendLastWithImmediate | SendOnlyWithImmediate | RdmaWriteLastWithImmediate => Layout {
                immdt: true,
                ..payload
            },
            RdmaWriteFirst | RdmaWriteOnly => Layout {
                reth: true,
                ..payload
            },
            RdmaWriteOnlyWithImmediate => Layout {
                reth: true,
                immdt: true,
                ..payload
            },
            RdmaReadRequest => Layout { reth: true, ..NONE },
            RdmaReadResponseFirst | RdmaReadResponseLast | RdmaReadResponseOnly => Layout {
                aeth: true,
                ..payload
            },
            Acknowledge => Layout { aeth: true, ..NONE },
            AtomicAcknowledge => Layout {
                aeth: true,
                atomic_ack_eth: true,
                ..NONE
            },
            CompareSwap | FetchAdd => Layout {
                atomic_eth: true,
                ..NONE
            },
            SendLastWithInvalidate | SendOnlyWithInvalidate => Layout {
                ieth: true,
                ..payload
            },
            Cnp => Layout { cnp: true, ..NONE },
            TlmRequest | TlmResponse => Layout {
                probe: true,
                tlm_required: true,
                ..NONE
            },
            CcNotify => Layout {
                notify: true,
                tlm_required: true,
                ..NONE
            },
            IntResponse => Layout {
                tlm_required: true,
                ..NONE
            },
        }
    }

    /// A request the responder executes (SEND, WRITE, READ request,
    /// atomic), as opposed to a response or a control packet.
    pub const fn is_request(self) -> bool {
        (self as u8) <= 0x0C
            || matches!(self, Opcode::CompareSwap | Opcode::FetchAdd)
            || matches!(
                self,
                Opcode::SendLastWithInvalidate | Opcode::SendOnlyWithInvalidate
            )
    }

    /// Is this one of the standard IBA opcodes (everything but the telemetry
    /// opcodes 0xC0-0xC3)?
    pub const fn is_standard(self) -> bool {
        !self.layout().tlm_required
    }
}

impl core::fmt::Display for Opcode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_value_maps_back_to_itself_or_is_unknown() {
        let mut known = 0;
        for v in 0..=255u8 {
            if let Some(op) = Opcode::from_u8(v) {
                assert_eq!(op.as_u8(), v);
                known += 1;
            }
        }
        assert_eq!(known, Opcode::ALL.len());
    }

    #[test]
    fn uc_and_ud_opcodes_are_those_of_iba_table_35() {
        let mut uc = Vec::new();
        let mut ud = Vec::new();
        for v in 0..=255u8 {
            match Opcode::decode(v) {
                Some((Service::Uc, op)) => {
                    assert_eq!(op.encode(Service::Uc), v);
                    uc.push(v)
                }
                Some((Service::Ud, op)) => {
                    assert_eq!(op.encode(Service::Ud), v);
                    assert!(op.layout_in(Service::Ud).deth);
                    ud.push(v)
                }
                Some((Service::Rc, op)) => {
                    assert_eq!(op.as_u8(), v);
                    assert!(!op.layout_in(Service::Rc).deth);
                }
                None => assert!(Opcode::from_u8(v).is_none() || v >= 0x20),
            }
        }
        assert_eq!(uc, (0x20..=0x2B).collect::<Vec<u8>>());
        assert_eq!(ud, [0x64, 0x65]);
    }

    #[test]
    fn all_is_in_numeric_order() {
        assert!(Opcode::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn reth_opcodes_match_wire_md() {
        let with_reth: Vec<u8> = Opcode::ALL
            .iter()
            .filter(|o| o.layout().reth)
            .map(|o| o.as_u8())
            .collect();
        assert_eq!(with_reth, [0x06, 0x0A, 0x0B, 0x0C]);
        let with_aeth: Vec<u8> = Opcode::ALL
            .iter()
            .filter(|o| o.layout().aeth)
            .map(|o| o.as_u8())
            .collect();
        assert_eq!(with_aeth, [0x0D, 0x0F, 0x10, 0x11, 0x12]);
        let with_atomic: Vec<u8> = Opcode::ALL
            .iter()
            .filter(|o| o.layout().atomic_eth)
            .map(|o| o.as_u8())
            .collect();
        assert_eq!(with_atomic, [0x13, 0x14]);
        let with_ieth: Vec<u8> = Opcode::ALL
            .iter()
            .filter(|o| o.layout().ieth)
            .map(|o| o.as_u8())
            .collect();
        assert_eq!(with_ieth, [0x16, 0x17]);
        let with_imm: Vec<u8> = Opcode::ALL
            .iter()
            .filter(|o| o.layout().immdt)
            .map(|o| o.as_u8())
            .collect();
        assert_eq!(with_imm, [0x03, 0x05, 0x09, 0x0B]);
    }
}
