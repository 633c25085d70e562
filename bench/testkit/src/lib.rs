//! What the tests, the interop judge and the benchmarks share.
//!
//! - [`child`]: runs a child process with a time limit (a hung program
//!   fails its test, it never hangs the suite).
//! - [`verbs_output`]: reads what an unmodified verbs tool (rdma-core's
//!   examples, perftest) printed for its own failure words: those tools
//!   may print a failure and still exit 0 (`ibv_rc_pingpong -c` prints
//!   `invalid data in page N` and returns 0), so an exit status alone is
//!   not a check.
#![forbid(unsafe_code)]

pub mod child;
pub mod verbs_output;

pub use child::{output_within, wait_within, Finished, OutputWithin, Running, LIMIT};
pub use verbs_output::{failures, require_clean};
