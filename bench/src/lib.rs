//! Benchmarks and user tools for the software RDMA NIC.
//!
//! `bench write-lat | read-lat | write-bw | read-bw` ([`perf`]: perftest-style
//! runs through the verbs API, with raw DPDK and kernel UDP baselines in
//! the same run), `bench sim` (simulator scenarios), `bench decode` (one
//! line per frame of a pcap), `bench demo` (one frame of every opcode
//! written to a pcap and decoded), `bench hpcc-replay` (a telemetry trace
//! through the HPCC++ controller), `bench judge` (the interop run's verdict
//! on one test) and `bench torture` (two RC engines over
//! a faulty wire, every byte verified).

pub mod decode;
pub mod fct_plot;
pub mod judge;
pub mod perf;
/// Pcap files, shared with the dataplane's tap.
pub use nic::pcap;
pub mod plot;
pub mod replay;
pub mod samples;
pub mod sim;
pub mod torture;
