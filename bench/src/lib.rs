//! Benchmarks and user tools for the software RDMA NIC.
//!
//! Today: `bench decode` (one line per frame of a pcap, for looking at what
//! a pcap tap captured) and `bench demo` (the codec's demo: one frame of
//! every opcode written to a pcap and decoded). Later issues add the
//! perftest-style benchmarks, the simulator scenarios and trace replay.

pub mod decode;
pub mod pcap;
pub mod samples;
