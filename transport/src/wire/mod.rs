//! The RoCEv2 + telemetry wire codec of `docs/spec/wire.md`.
//!
//! Each header has a zero-copy view (`Foo<T: AsRef<[u8]>>`, whose
//! `new_checked` validates lengths once so that no accessor can panic) and
//! a representation (`FooRepr`) with `parse` (checks meaning) and `emit`.
//! [`Packet`] and [`PacketRepr`] put them together into whole Ethernet
//! frames with the ICRC.
//!
//! This module never panics on any input, never allocates and returns
//! [`WireError`], a `Copy` value that names why a frame was refused.

mod bytes;

pub mod aeth;
pub mod arp;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
mod error;
pub mod ethernet;
pub mod icrc;
pub mod immdt;
pub mod inflight;
pub mod int_response;
pub mod ipv4;
pub mod mad;
mod opcode;
pub mod packet;
pub mod pfc;
pub mod probe;
pub mod reth;
pub mod tlm;
pub mod udp;

pub use aeth::{Aeth, AethRepr, NakCode, Syndrome};
pub use arp::{ArpOp, ArpRepr};
pub use atomic::{AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use cnp::Cnp;
pub use deth::{Deth, DethRepr};
pub use error::{ErrorKind, Layer, WireError};
pub use ethernet::{check_vlan, BadMac, EthernetFrame, EthernetRepr, MacAddr, VlanTag};
pub use immdt::ImmDt;
pub use inflight::{steering_dest_qp, RoceFrame};
pub use int_response::{emit_int_response, NoResponse};
pub use ipv4::{Ipv4Packet, Ipv4Repr};
pub use mad::MadHeader;
pub use opcode::{Layout, Opcode, Service};
pub use packet::{FrameTail, FrameTemplate, Packet, PacketRepr, TransportRepr};
pub use pfc::PfcRepr;
pub use probe::{Notify, NotifyRepr, Probe, ProbeRepr};
pub use reth::{Reth, RethRepr};
pub use tlm::{HopRecord, Tlm, TlmRepr};
pub use udp::{UdpPacket, UdpRepr};
