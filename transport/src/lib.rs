//! The protocol half of the software RDMA NIC.
//!
//! `transport` owns the RoCEv2 + telemetry wire codec ([`wire`]). Later it
//! will also own the RC engine (QP contexts, requester, responder), memory
//! region keys and bounds, the shared-memory ABI and the verbs API.
//!
//! It is sans-IO: it never reads a clock, never does I/O and never uses
//! `unsafe`. Time, when it is needed, is a `u64` of nanoseconds passed in.
#![forbid(unsafe_code)]

pub mod mr;
pub mod rc;
pub mod wire;
