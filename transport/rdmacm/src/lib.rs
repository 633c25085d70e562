//! A drop-in `librdmacm.so.1`. An unmodified rdma_cm application (rping,
//! ucmatose, udaddy, mckey, rdma_server / rdma_client, perftest's `-R`,
//! qperf, libfabric's verbs provider) started with this library and rnic's
//! `libibverbs.so.1` first on `LD_LIBRARY_PATH` resolves addresses and
//! connects through the rnic daemon's connection manager instead of the
//! kernel's `rdma_ucm` (the contract: `shm::cma`), with QPs of the
//! drop-in libibverbs that this library moves itself, as rdma-core's
//! does.
//!
//! The structs are the system's (bindgen over `<rdma/rdma_cma.h>`,
//! [`sys`]); the 68 functions of Debian's librdmacm are exported in their
//! version nodes (`librdmacm.map`). The modules, by what they own:
//!
//! - `daemon`: the framing and sessions on the daemon's socket;
//! - `devices`: the devices, their contexts, shared PDs and sessions;
//! - `channel`: event channels and their queues;
//! - `registry`: the live ids by the names events give them;
//! - `id`: ids, binding, address and route resolution, listening;
//! - `conn`: connecting, accepting, rejecting, disconnecting;
//! - `event`: getting and acking events, and what taking one does;
//! - `attrs` and `qp`: the QP attributes of a connection, the QPs and
//!   SRQs of an id;
//! - `ep`, `addrinfo`: the endpoint API over synchronous ids;
//! - `mcast`: multicast joins, made by the library alone (RoCE exchanges
//!   no MAD for them) over libibverbs' `ibv_attach_mcast`;
//! - `rsocket`: what is not offered (ENOSYS).
//!
//! Every entry point takes raw pointers from C: their contract is the one
//! rdma_cma.h documents; each checks what it can (NULL pointers, ids of
//! our own making) and never panics across the C boundary
//! (`util::guard`). Errors are -1 with errno, as rdma-core's.

pub mod sys;

mod attrs;
mod channel;
mod daemon;
mod devices;
mod event;
mod id;

mod addrinfo;
mod conn;
mod ep;
mod mcast;
mod qp;
mod registry;
mod rsocket;
mod util;

#[cfg(test)]
mod scripted;

// Each exported symbol in its version node (generated from
// librdmacm.map by build.rs).
include!(concat!(env!("OUT_DIR"), "/symver.rs"));
