//! The NIC pipeline every driver of the RC engine runs, and the ports it
//! runs over. No DPDK here: the DPDK port lives in `dataplane`, the
//! simulator's link in `netsim`; both implement [`FramePort`].
//!
//! - [`pipeline`]: [`Nic::poll`], the one pipeline (RX, timers, doorbells,
//!   TX, completions) and its counters.
//! - [`neighbour`]: the neighbour table (ARP resolution, static entries,
//!   expiry).
//! - [`port`]: the [`FramePort`] trait and owned frame buffers.
//! - [`link`]: an in-memory link between two ports (tests, torture,
//!   fuzzing).
//! - [`faults`]: the fault injector, a wrapper for any port (seeded loss,
//!   duplication, reordering, delay, bit flips; or a per-frame script).
//! - [`tap`]: a wrapper that mirrors a port's frames into a pcap capture.
//! - [`pcap`]: classic pcap files in and out.
//! - [`pfc`]: the pause state of a transmitter held by PFC frames.
//! - [`stage`]: the trace points of the pipeline and the key of a frame.
//!
//! No `unsafe`, no clock: time is passed in as nanoseconds.
#![forbid(unsafe_code)]

pub mod faults;
pub mod link;
pub mod neighbour;
pub mod pcap;
pub mod pfc;
pub mod pipeline;
pub mod port;
pub mod stage;
pub mod tap;

pub use faults::{Direction, Fault, FaultConfig, FaultCounters, FaultInjector};
pub use link::{mem_link, MemPort};
pub use neighbour::{NeighbourConfig, NeighbourCounters, NeighbourTable, Resolution};
pub use pfc::PauseState;
pub use pipeline::{
    AttachPayload, Attached, Completions, Host, Nic, NicCounters, BURST, MAX_HEADERS,
};
pub use port::{copy_frame, Frame, FramePort, TooSmall};
pub use stage::{FrameKey, Stage};
pub use tap::{Capture, SharedCapture, Tap};
