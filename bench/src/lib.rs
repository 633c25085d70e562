//! Benchmarks and user tools for the software RDMA NIC.
//!
//! Today: `bench decode` (one line per frame of a pcap, for looking at what
//! a pcap tap captured) and `bench demo` (the codec's demo: one frame of
//! every opcode written to a pcap and decoded), and `bench hpcc-replay`
//! (a telemetry trace through the HPCC++ controller) and `bench torture`
//! (two RC engines over a faulty wire, every byte verified). Later issues add the
//! perftest-style benchmarks and the simulator scenarios.

pub mod decode;
/// Pcap files, shared with the dataplane's tap.
pub use dataplane::pcap;
pub mod plot;
pub mod replay;
pub mod samples;
pub mod sim;
pub mod torture;
