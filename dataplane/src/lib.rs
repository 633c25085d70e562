//! The DPDK dataplane: DPDK ports as frame ports for the one NIC pipeline
//! (`nic::Nic::poll`, which every host here runs), the testbeds (with the
//! INT switch of `netsim` on real mbufs), the poll-mode lcore loops and the
//! shared-memory service for applications.
//!
//! Only the DPDK binding (`dpdk-sys`), the DPDK wrappers and the shared-memory
//! mapping may use `unsafe`.
//!
//! - [`config`]: the one typed configuration, checked before any port starts.
//! - [`dpdk`]: safe wrappers over DPDK (EAL, mempools, mbufs, ports, rings).
//! - [`incast`]: the incast testbed on DPDK ports with the INT switch.
//! - [`host_port`]: a host's DPDK port under its fault injector and tap.
//! - [`pipe`]: the pipelined layout's port (the engine side of the pipes).
//! - [`shard_port`]: a QP shard's port (its queue pair, frames steered to
//!   the shard owning their QP).
//! - [`stats`]: counter snapshots of a running testbed.
//! - [`service`]: the daemon's service for applications (control socket,
//!   shared-memory rings, the hosts' loop).

pub mod config;
pub mod dpdk;
pub mod host_port;
pub mod incast;
pub mod pipe;
pub mod service;
pub mod shard_port;
pub mod stats;
pub mod testbed;
