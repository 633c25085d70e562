//! The application/daemon contract: everything an application process and
//! the dataplane daemon must agree on, apart from both (as rxe keeps
//! `rxe-abi.h` and `rxe_queue.h` apart from `rxe.c`).
//!
//! - [`abi`]: the shared-memory layouts: the work and completion queue
//!   entries as plain old data, the single-producer single-consumer rings
//!   of them and the doorbell block.
//! - [`proto`]: the control messages over the daemon's Unix socket.
//! - [`cma`]: the rdma_cm sessions and event channels among them.
//! - [`fds`]: file descriptors beside those messages (`SCM_RIGHTS`).
//! - [`segment`]: an application's shared-memory segment, mapped.
//!
//! One [`VERSION`] covers all of it: every control message carries it, and
//! the daemon refuses a client that speaks another, by name, from the
//! first message of a connection on (and the client refuses a daemon's
//! reply of another).
//!
//! Unsafe code is only in [`segment`] (the mapping) and [`fds`] (adopting
//! received descriptors), each block with its `// SAFETY:` comment;
//! [`abi`] reaches the mapping through the safe [`abi::SharedMem`].

pub mod abi;
pub mod cma;
pub mod fds;
pub mod proto;
pub mod segment;

pub use segment::Segment;

/// The version of this contract (layouts, rings and messages together).
/// Raise it with any change either side could notice.
pub const VERSION: u32 = 9;
