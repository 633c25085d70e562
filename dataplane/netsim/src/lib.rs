//! The network around the NICs, without DPDK: the software INT switch and
//! the deterministic virtual-time simulator.
//!
//! - [`switch`]: the INT switch (per-port FIFO queues drained at capacity
//!   B, drop-tail or ECN marking, telemetry stamping at dequeue, ECMP),
//!   pure logic with time passed in. The simulator runs it in virtual time
//!   on `Vec<u8>` frames; the DPDK incast testbed runs it on mbufs.
//! - [`int_response`]: when a congested switch answers a subscribed data
//!   packet's sender directly (HPCC++ draft-00 s6.3), and how often.
//! - [`mmu`]: the shared buffer of a lossless switch and the PFC rules
//!   (when to pause an ingress port's upstream, when to resume it).
//! - [`link`]: the simulator's link as a frame port, so the simulator's
//!   hosts run the one NIC pipeline (`nic::Nic::poll`).
//! - [`sim`]: the simulator, its topologies, scenarios and metrics.
//!
//! Switches and the simulator read and stamp frames through the wire
//! codec's in-flight view (`transport::wire::RoceFrame`), never by byte
//! offsets of their own.
#![forbid(unsafe_code)]

pub mod int_response;
pub mod link;
pub mod mmu;
pub mod qos;
pub mod sim;
pub mod switch;
