//! The protocol half of the software RDMA NIC.
//!
//! `transport` owns the RoCEv2 + telemetry wire codec ([`wire`]), the RC
//! engine ([`rc`]: QP contexts, requester, responder), memory-region keys,
//! bounds and protection domains ([`mr`]), and the shared-memory ABI that
//! applications and the daemon share ([`abi`]: WQE and CQE layouts, SPSC
//! rings). The verbs API applications link is the `verbs` crate beside it
//! (`transport/verbs`), which adds the socket, the mapping and the C ABI.
//!
//! It is sans-IO: it never reads a clock, never does I/O and never uses
//! `unsafe`. Time, when it is needed, is a `u64` of nanoseconds passed in.
#![forbid(unsafe_code)]

pub mod abi;
pub mod mr;
pub mod rc;
pub mod wire;
