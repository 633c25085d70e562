//! The verbs API Rust applications link (C applications use the drop-in
//! libibverbs, `transport/ibverbs`, which is built on this crate).
//!
//! An application opens a device of the dataplane daemon ([`Device::open`]
//! on the daemon's Unix socket), gets its own shared-memory segment, and
//! allocates protection domains, memory regions (in the segment, with
//! L_Key and R_Key), completion queues and QPs through the control socket.
//! It connects a QP with the peer's [`Endpoint`] (swapped out of band, see
//! [`oob`]), posts RDMA WRITE and READ work requests into the QP's send
//! ring in shared memory and polls completions from the CQ's ring: the
//! data path makes no system call. The daemon polls the send rings.
//!
//! This crate sits beside `transport` (under `transport/verbs`) because it
//! does what `transport` must not: socket I/O. What it and the daemon
//! agree on (the layouts, rings, messages and the segment mapping) is the
//! `shm` crate, the application/daemon contract.

pub mod device;
pub mod oob;

pub use device::{
    empty_completion, list_devices, poll_one, socket_path, Cq, Device, Endpoint, LocalBuf, Mr,
    Payload, Pd, PreparedQp, Qp, QpBuilder, RecvRequest, RemoteMr, Srq, VerbsError, WorkRequest,
    DEFAULT_SOCKET, SOCKET_ENV,
};
pub use shm::proto::{DeviceInfo, ErrorKind, MrAccess};
pub use transport::rc::{Cqe as Completion, WcOpcode, WcStatus, WrOp};
