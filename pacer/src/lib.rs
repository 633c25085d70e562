//! Congestion control and flow scheduling for the software RDMA NIC.
//!
//! This crate will own HPCC++ (sender-based, receiver-based and probe-driven),
//! the DCQCN and fixed-window baselines and the credit-based round-robin flow
//! scheduler of `../shared/spec/hpcc.md`. It is pure logic: it never reads a
//! clock and never does I/O; time is a `u64` of nanoseconds passed in.
//!
//! It depends on nothing else in the workspace. Nothing is implemented yet.
#![forbid(unsafe_code)]
