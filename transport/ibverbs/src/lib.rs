//! A drop-in `libibverbs.so.1`. An unmodified verbs application (perftest,
//! `ibv_rc_pingpong`, `ibv_devinfo`, anything written against
//! `<infiniband/verbs.h>`) started with this library first on
//! `LD_LIBRARY_PATH` opens the devices of the rnic daemon instead of the
//! kernel's: the control verbs become requests on the daemon's socket
//! (`shm::proto`, through `verbs::Device`) and the data path
//! (`ops.post_send`, `ops.post_recv`, `ops.poll_cq`) reads and writes the
//! shared-memory rings of `shm::abi` in the application's own
//! process, with no system call.
//!
//! Why a whole library and not a provider plugin, and the ABI facts it
//! rests on: `docs/spec/ibverbs.md`. The structs are the system's
//! (bindgen over `<infiniband/verbs.h>`, [`sys`]); every symbol of
//! Debian's `libibverbs.so.1` is exported in its version node
//! (`libibverbs.map`); what the NIC does not do fails with `EOPNOTSUPP`
//! (the `stubs` module).
//!
//! Every entry point takes raw pointers from C: their contract is the one
//! verbs.h documents, and each function checks what it can (NULL
//! pointers, sizes, handles of our own making) and never panics across
//! the C boundary (`util::guard`).

pub mod sys;

mod ah;
mod async_event;
mod context;
mod cq;
mod device;
mod mcast;
mod pd_mr;
mod post;
mod qp;
mod query;
mod remap;
mod rnicdv;
mod srq;
mod strings;
mod stubs;
mod util;

pub use device::Dev;

// Each exported symbol in its version node (generated from
// libibverbs.map by build.rs).
include!(concat!(env!("OUT_DIR"), "/symver.rs"));
