//! Safe wrappers over the DPDK binding: the EAL, mempools, mbufs (owned,
//! freed by Drop), ethdev ports with burst RX/TX, rings and net_ring ports
//! made from them, and the TSC clock.
//!
//! This is one of the three places in the workspace allowed `unsafe`;
//! every block says why it is sound.

mod eal;
mod extbuf;
mod mbuf;
pub mod port;

pub use eal::{rdtsc, request_thread_fifo, request_thread_slice, Eal, LcoreGuard, TscClock};
pub use extbuf::ExtMemory;
pub use mbuf::{Mbuf, Mempool, BULK};
pub use port::{ring_pair, ring_pair_queues, Port, PortStats, RxHalf, RxWakeup, TxHalf};

/// An error from DPDK, with what was being done and `rte_errno`'s text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct DpdkError {
    pub what: String,
    pub reason: String,
}

impl DpdkError {
    /// An error for `what`, with the current `rte_errno` (or `code`, a
    /// negative errno returned by the call, when non-zero).
    pub(crate) fn last(what: impl Into<String>, code: i32) -> Self {
        // SAFETY: rnic_errno reads the calling thread's rte_errno;
        // rte_strerror returns a pointer to a static or thread-local
        // NUL-terminated string that stays valid while we copy it.
        let reason = unsafe {
            let e = if code < 0 {
                -code
            } else {
                dpdk_sys::rnic_errno()
            };
            std::ffi::CStr::from_ptr(dpdk_sys::rte_strerror(e))
                .to_string_lossy()
                .into_owned()
        };
        DpdkError {
            what: what.into(),
            reason,
        }
    }
}
