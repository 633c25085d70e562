//! The protocol half of the software RDMA NIC.
//!
//! `transport` owns the RoCEv2 + telemetry wire codec ([`wire`]), the RC
//! engine ([`rc`]: QP contexts, requester, responder), and memory-region
//! keys, bounds and protection domains ([`mr`]), and the management
//! agents behind each port's QP1 ([`mad`]). What applications and the
//! daemon agree on (WQE and CQE layouts, rings, control messages, the
//! segment) is the `shm` crate beside it (`transport/shm`); the verbs API
//! applications link is `verbs` (`transport/verbs`), and the drop-in
//! libibverbs is `transport/ibverbs`.
//!
//! It is sans-IO: it never reads a clock, never does I/O and never uses
//! `unsafe`. Time, when it is needed, is a `u64` of nanoseconds passed in.
#![forbid(unsafe_code)]

pub mod cm;
pub mod mad;
pub mod mr;
pub mod rc;
pub mod wire;
