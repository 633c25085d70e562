//! Congestion control and flow scheduling for the software RDMA NIC: the
//! "Congestion Control Module" and "Flow Scheduler" of the HPCC++ drafts'
//! NIC figure, as pure logic.
//!
//! - [`hpcc`]: sender-based HPCC++ (MeasureInflight, ComputeWind, NewAck).
//! - [`rx_hpcc`]: receiver-based HPCC++ (NewINT, the window notification).
//! - [`probe`]: when to send telemetry probes and how responses map to NewAck.
//! - [`dcqcn`], [`fixed`]: the baselines.
//! - [`controller`]: one trait over all of them, and an enum for static
//!   dispatch.
//! - [`scheduler`]: the credit-based round-robin flow scheduler.
//! - [`psn`], [`telemetry`]: 24-bit PSN arithmetic and hop records.
//! - [`trace`]: the telemetry trace format replayed by `bench hpcc-replay`.
//!
//! Nothing here reads a clock or does I/O: time is a `u64` of nanoseconds
//! passed in, so the same code runs under DPDK, in the simulator and in
//! tests. This crate depends on nothing else in the workspace.
#![forbid(unsafe_code)]

pub mod controller;
pub mod dcqcn;
pub mod fixed;
pub mod hpcc;
pub mod path;
pub mod probe;
pub mod psn;
pub mod rx_hpcc;
pub mod scheduler;
pub mod telemetry;
pub mod trace;

pub use controller::{CongestionControl, Controller};
pub use hpcc::{Hpcc, HpccCore, HpccParams, HpccSettings, ParamError, Update};
pub use telemetry::{Hop, HopStack, Wrap};
