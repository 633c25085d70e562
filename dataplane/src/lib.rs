//! The dataplane: moves RoCEv2 frames between the transport engine and a
//! network (DPDK ports or the virtual-time simulator), runs the poll-mode
//! lcore loops, the software INT switch and the shared-memory service for
//! applications.
//!
//! Only the DPDK binding (`dpdk-sys`), the DPDK wrappers and the shared-memory
//! mapping may use `unsafe`.
//!
//! - [`dpdk`]: safe wrappers over DPDK (EAL, mempools, mbufs, ports, rings).
//! - [`incast`]: the incast testbed on DPDK ports with the INT switch.
//! - [`nic`]: one engine <-> port pass (RX burst, timers, TX burst).
//! - [`stats`]: counter snapshots of a running testbed.
//! - [`service`]: the daemon's service for applications (control socket,
//!   shared-memory rings, the hosts' loop).

pub mod dpdk;
pub mod incast;
pub mod nic;
pub mod service;
pub mod stats;
pub mod testbed;
