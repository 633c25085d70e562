//! The structs, enums and constants of the system's `<rdma/rdma_cma.h>`
//! and `<rdma/rdma_verbs.h>` (with the `<infiniband/verbs.h>` they
//! include), and the exported libibverbs functions the library calls
//! (bindgen; layout tests check them against the headers).
#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all,
    // bindgen's output: its unsafe blocks are the FFI layouts' own.
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]
include!(concat!(env!("OUT_DIR"), "/rdmacm.rs"));
